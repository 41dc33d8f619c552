/*
 * stz_tune.h - the smallest model for a quality budget, or the best model
 * for a size budget (stz tune, docs/cli/tune.md).
 *
 * 1. Measure: every candidate action on every weight matrix, quantized in
 *    memory exactly as stz quantize would store it; its squared error and
 *    the bytes it takes in a container (the lossless stage's own chunk
 *    coder run on the stored bytes: exact, not a model).
 * 2. Sensitivity: the forward pass with each matrix alone perturbed by
 *    the probe format's error (stz_fwd_probe_run); KL per unit of
 *    squared error. A candidate's predicted KL is sensitivity x its
 *    squared error; a model's, the sum over its matrices.
 * 3. Solve: a multiple-choice knapsack over the per-matrix lower convex
 *    hulls of (bytes, predicted KL), greedy on KL saved per byte; the
 *    path of the greedy is the Pareto curve.
 */
#ifndef STZ_TUNE_H
#define STZ_TUNE_H

#include "stz.h"
#include "stz_kernels.h"
#include "stz_experimental.h"
#include "stz_export.h"
#include "stz_forward.h"
#include "stz_pack.h"
#include "stz_pipeline.h"
#include "stz_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    stz_decision d; /* keep, int2..int8 with method, block_size, scale_dtype, svd, or a ggml type;
                     * d.feedback: with error feedback (stz_tune_feedback) */
    char name[32];  /* "keep", BITS:METHOD:BLOCK:SCALES ("4:nl:32:U8"), "svd:64" or a type ("q4_k"),
                     * "+fb" after a block quantization's with feedback */
} stz_tune_cand;

/* A named list of candidates, NULL for another name:
 * - "default": keep, 8:absmax:32:F16, 6:nl:32:U8, 5:nl:32:U8, 4:nl:16:U8,
 *   4:nl:32:U8, 3:nl:32:U8, 2:nl:32:U8;
 * - "gguf" (stz tune --gguf): keep and the llama.cpp types whose rows say
 *   tune offers them, from the largest: f16, q8_0, q6_k, q5_k, q5_1, q5_0,
 *   q4_k, q4_1, q4_0, iq4_nl, iq4_xs, q3_k, q2_k;
 * - "trellis": 2-4 bits, about 2.5 us per weight each to measure:
 *   4:trellis:64:U8, 3:trellis:128:U8, 3:trellis:64:U8, 2:trellis:128:U8,
 *   2:trellis:64:U8. */
STZ_API const char *stz_tune_candidate_set(const char *name);

/* Parses a comma-separated list of candidates ("default", "gguf" and
 * "trellis" stand for the lists above; "keep",
 * BITS:METHOD:BLOCK:SCALES: bits 2-6 or 8, a method of stz_policy.h,
 * block 1..65536, scales F16, F32 or U8; svd:RANK[:randomized]; or a
 * llama.cpp type stz writes, "q4_k", "f16"...; a block quantization's
 * name followed by "+fb": with error feedback). STZ_E_ARG names the bad
 * one. */
STZ_API stz_status stz_tune_parse_candidates(const char *list, stz_tune_cand **out, size_t *n, stz_err *err);

/* Makes candidate c its version with error feedback (d.feedback, "+fb"
 * after its name): 1, or 0 when c is not a block quantization (unchanged).
 * A candidate already with feedback stays as it is. */
STZ_API int stz_tune_cand_feedback(stz_tune_cand *c);

/* stz_tune_cand_feedback on each of the n candidates (tune --feedback);
 * STZ_E_ARG when two become the same (NAME and NAME+fb both listed). */
STZ_API stz_status stz_tune_cands_feedback(stz_tune_cand *c, size_t n, stz_err *err);

typedef struct {
    char *name;
    stz_dtype dtype;
    uint64_t params, rows;
    size_t file;       /* which of the model's files holds it */
    int tunable;       /* a float matrix the forward pass uses: the candidates apply; else kept */
    const char *why;   /* not tunable: why (static text) */
    uint64_t *bytes;   /* per candidate: container bytes of the stored tensors (records + index entries),
                         * or with gguf its bytes in the GGUF file (padded to 32; UINT64_MAX: a type
                         * the row length does not allow); not tunable: bytes[0] is the kept tensor's */
    double *err2;      /* per candidate: squared error (the token embedding's block candidates, after
                         * stz_tune_probe: their probed KL over sens) */
    double norm2;      /* squared norm of the original (fed: of its output, tr(W H W^T)) */
    double kl_probe;   /* measured KL with the probe candidate's error */
    double sens;       /* KL per unit of squared error */
    int choice;        /* chosen candidate (tunable), set by stz_tune_solve */
    stz_qformat *fmt;  /* per block candidate: its format for this tensor as measured (base, levels) */
    int fed;           /* stz_tune_feedback reached it: err2 and norm2 are the layer's output's, and
                         * feedback candidates are measured with feedback */
    double *plain_out; /* a tied head that stz_tune_feedback reached: per feedback candidate, plain
                         * rounding's output error in its format (NULL otherwise) */
    int ffn;           /* STZ_TUNE_FFN_DOWN: a down projection whose rows are not whole 32-blocks, offered
                         * llama.cpp's 32-block types with each row's last block padded ("pad"), for which
                         * export widens the FFN; STZ_TUNE_FFN_IN: a gate or up projection it widens */
} stz_tune_tensor;

enum { STZ_TUNE_FFN_IN = 1, STZ_TUNE_FFN_DOWN = 2 };

typedef struct {
    stz_tune_cand *cand; /* the candidates offered, then the probe's format if it is not one of them */
    size_t ncand, noffered;
    size_t probe; /* the candidate whose error probes sensitivity (STZ_TUNE_PROBE) */
    stz_tune_tensor *t;
    size_t nt;
    uint64_t params;       /* all tensors' */
    stz_pack_params pack;  /* how the container is written */
    uint64_t extra_bytes;  /* bytes besides the containers (a sharded directory's index and other files),
                            * or with gguf besides the tensors' bytes[0] (the GGUF header): the caller sets it */
    int gguf;              /* bytes count a GGUF file (stz_tune_params.gguf) */
    uint64_t widen_header; /* with gguf: what the GGUF header grows by when export widens the FFN (its
                            * stz.feed_forward_length key): the caller sets it */
    char **meta;           /* per file, its __metadata__ as a JSON object (the quantized file keeps it) */
    size_t nfiles;
} stz_tune;

typedef struct {
    int threads;
    stz_progress_fn progress; /* measure: tensors' bytes done / total; probe: forward units */
    void *progress_user;
    /* importance of the matrices' columns (stz_imatrix.h; NULL: none): the
     * candidates are quantized with it and their errors weighted by it, as
     * stz quantize --imatrix stores them */
    const struct stz_imatrix *imatrix;
    /* 1: the sizes are a GGUF file's (stz export --gguf of the quantized
     * model): candidates keep and ggml types only, a type offered only
     * to tensors whose rows are whole blocks of it */
    int gguf;
    /* 1: no padded 32-blocks offered to down projections (stz_tune_tensor.ffn),
     * so that a GGUF keeps the model's FFN width */
    int no_pad;
} stz_tune_params;

/* The format whose error probes each matrix's sensitivity: the shipped
 * int4 policy's. */
#define STZ_TUNE_PROBE "4:nl:32:U8"

/* Measures every candidate on every tensor of the model's files (plain
 * SafeTensors, read through stz_qmodel), and the probe format. A tensor
 * no candidate applies to is kept. STZ_E_UNSUPPORTED for a file already
 * quantized by stz. */
STZ_API stz_status stz_tune_measure(stz_tune *T, stz_qmodel *const *files, size_t nfiles, const stz_tune_cand *cand,
                                    size_t ncand, const stz_tune_params *p, stz_err *err);
/* Candidates with error feedback (a name ending in "+fb", stz_tune_cand.d
 * .feedback): runs m over the calibration sequences (stz_forward_grams, the
 * model as it is) and, for every tunable matrix it reaches, measures each
 * candidate again by the layer's output error tr((W - Q) H (W - Q)^T)
 * with H the Gram matrix of the matrix's inputs (stz_quant_output_error;
 * feedback's own), feedback candidates quantized with feedback (their
 * bytes too). Sensitivity is then KL per unit of output error. Matrices it
 * does not reach (an untied embedding) keep the measure's figures, and
 * their feedback candidates stand for plain rounding. Call between
 * stz_tune_measure and stz_tune_probe. */
STZ_API stz_status stz_tune_feedback(stz_tune *T, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                                     const size_t *lens, const stz_tune_params *p, stz_err *err);
/* Sensitivity of each tunable tensor on the given sequences; then the
 * token embedding's offered block candidates probed each in its own
 * format (its err2 becomes their KL over its sensitivity; a tied head's
 * feedback candidates' scaled by feedback's gain, err2 / plain_out). */
STZ_API stz_status stz_tune_probe(stz_tune *T, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                                  const size_t *lens, const stz_tune_params *p, stz_err *err);
STZ_API void stz_tune_free(stz_tune *T);

typedef enum { STZ_BUDGET_BYTES = 0, STZ_BUDGET_KL = 1 } stz_budget;

typedef struct {
    uint64_t bytes; /* predicted container bytes */
    double kl;      /* predicted mean KL */
} stz_tune_point;

typedef struct {
    int met;               /* 0: the budget cannot be met; the choice is the closest feasible point */
    stz_tune_point pred;   /* of the choice */
    stz_tune_point *curve; /* the Pareto path, bytes increasing, KL decreasing */
    size_t ncurve;
} stz_tune_solution;

/* Chooses a candidate per tunable tensor: the lowest predicted KL within
 * `value` container bytes (STZ_BUDGET_BYTES), or the fewest bytes with a
 * predicted KL at most `value` (STZ_BUDGET_KL). kl_scale multiplies every
 * predicted KL (1, or measured / predicted to correct a missed budget).
 * Sets T->t[i].choice; deterministic. */
STZ_API stz_status stz_tune_solve(stz_tune *T, stz_budget kind, double value, double kl_scale, stz_tune_solution *out,
                                  stz_err *err);
STZ_API void stz_tune_solution_free(stz_tune_solution *s);

/* The predicted container bytes of the current choice (tensors and the
 * headers they need: one container per file), or with gguf the GGUF
 * file's (extra_bytes + the tensors'). */
STZ_API uint64_t stz_tune_bytes(const stz_tune *T);

/* The current choice as a policy (JSON text, malloc'ed): one explicit rule
 * per tunable tensor, default keep; `description` is stored with it. */
STZ_API char *stz_tune_policy(const stz_tune *T, const char *description);

/* ---- a whole tune (stz tune, compress --tune) ------------------------ */

/* The budget: container (with gguf: GGUF file) bytes, the model's bytes
 * over them, bits per parameter, the mean KL of the model's outputs, or
 * bits per parameter of the tensors' data (the file less its header and
 * index: llama.cpp's count), or (gguf) the size of llama.cpp's file of a
 * type. */
typedef enum {
    STZ_TUNE_SIZE,
    STZ_TUNE_RATIO,
    STZ_TUNE_BPW,
    STZ_TUNE_MAX_KL,
    STZ_TUNE_DATA_BPW,
    STZ_TUNE_LIKE /* gguf: the file llama-quantize `like` makes (stz_gguf_stats.like_bytes) */
} stz_tune_goal;

/* The option that states goal g on stz's command line ("--size", "--like"). */
STZ_API const char *stz_tune_goal_option(stz_tune_goal g);
/* Bits per weight of a file of `bytes` made of T's tensors: over the
 * tensors' data (the file less T's extra_bytes: llama.cpp's count) and
 * over the whole file; 0 when T has no parameters. */
STZ_API void stz_tune_bpw(const stz_tune *T, uint64_t bytes, double *data_bpw, double *file_bpw);

/* tune's sequences unless told otherwise: 4 of 64 tokens sampled, seed 1. */
#define STZ_TUNE_SEQS                                                                                                  \
    {                                                                                                                  \
        .nseq = 4, .default_len = 64, .seed = 1, .temperature = 1, .top_p = 0.9                                        \
    }

/* The verification's correction rounds: a missed budget is solved again
 * with the prediction corrected by what was measured, at most this often. */
#define STZ_TUNE_CORRECTIONS 2

typedef struct {
    stz_tune_goal goal;
    double amount;                /* in the goal's unit */
    const char *like;             /* STZ_TUNE_LIKE: llama-quantize's type (stz_gguf_like_name) */
    const char *candidates;       /* stz_tune_parse_candidates's list; NULL: stz_tune_candidate_set's
                             * "gguf" or "default" */
    const char *imatrix;          /* an importance matrix's path (stz_imatrix_load_for), NULL: none, */
    int calibrate;                /* or with calibrate, one collected from the model's own sequences
                                   * (stz_imatrix_sample: STZ_IMATRIX_SEQS, or seqs.path's) */
    stz_seq_spec seqs;            /* the sequences measured on; from a file (seqs.path), error feedback's too */
    const char *config;           /* the model's config.json, NULL: found (stz_fwd_config_find) */
    int feedback;                 /* every block candidate with error feedback (stz_tune_cands_feedback) */
    int gguf, no_pad;             /* as stz_tune_params */
    const char *tokenizer, *name; /* gguf: as stz_gguf_params takes them */
    int pad_vocab;
    int verify;                 /* compress (gguf: and export) the choice, run it, correct a miss */
    int threads;                /* >= 1 */
    int quiet;                  /* progress not shown */
    const stz_stages *progress; /* NULL: none */
    const stz_ranks *ranks;     /* NULL: this process alone */
    const char *out;            /* verify: the last container (gguf: GGUF file) placed here; NULL: not kept */
    const char *scratch;        /* verify: intermediate files beside it (NULL: beside out, else the model) */
    unsigned write_flags;       /* STZ_WRITE_FORCE: a file `out` is replaced (a directory never) */
} stz_tune_run_params;

/* A choice compressed (and exported) and run against the original. */
typedef struct {
    uint64_t bytes; /* the container's or GGUF file's */
    stz_fwd_report fwd;
} stz_tune_check;

typedef struct {
    stz_tune T;            /* the measurements and the last choice */
    stz_tune_solution sol; /* the last solve's: met (0: nothing written), the choice, the curve */
    stz_tune_point first;  /* the first solve's prediction */
    stz_budget kind;       /* the budget in bytes or KL, */
    double budget;         /* resolved */
    char *policy;          /* the choice as a policy (stz_tune_policy), NULL when not met */
    stz_tune_check check[1 + STZ_TUNE_CORRECTIONS]; /* the verification, then each correction's */
    int checks;
    char source[STZ_SEQS_SOURCE_MAX]; /* where the sequences came from */
    stz_gguf_stats gguf;              /* gguf: the model exported with every tensor kept (header_bytes,
                                       * like_bytes: llama.cpp's file of each type) */
} stz_tune_result;

/* 1 if what check measured misses r's budget. */
STZ_API int stz_tune_missed(const stz_tune_result *r, const stz_tune_check *check);

/*
 * stz tune: the model at `model` (a file, a directory holding
 * model.safetensors, or a sharded directory) opened with its forward pass
 * and sequences (sampled, or read from seqs.path); every candidate measured
 * (stz_tune_measure, with feedback stz_tune_feedback) and every matrix's
 * sensitivity probed (stz_tune_probe); the budget solved. Not met: STZ_OK
 * with r->sol.met 0. Met: r->policy; with verify, the model compressed with
 * it (stz_compress_model; gguf: exported, stz_gguf_export) and run against
 * the original, solved again up to STZ_TUNE_CORRECTIONS times while the
 * budget is missed, and the last one placed at `out`.
 * stz_tune_result_free frees r, whatever was returned.
 */
STZ_API stz_status stz_tune_run(const stz_tune_run_params *p, const char *model, stz_tune_result *r, stz_err *err);
STZ_API void stz_tune_result_free(stz_tune_result *r);

/* A tune run's report, as stz tune, stz compress --tune and stz gguf print
 * it with --json: for r of stz_tune_run(p, model, ...), the choice of every
 * tensor, the curve, the budget and what the verification measured
 * ("met": whether the last one met the budget), with p->gguf and compress
 * the GGUF's bits per weight and llama-quantize's sizes; `out` is what was
 * written (compress 0: the policy, 1: the container or GGUF file). A budget
 * no point meets: the closest point ("met": false). The text is the
 * caller's (stz_free); NULL when out of memory. */
STZ_API char *stz_tune_report_json(const stz_tune_run_params *p, const char *model, const char *out, int compress,
                                   const stz_tune_result *r);
/* The smallest of llama-quantize's files of r's model (r->gguf.like_bytes,
 * by stz_gguf_like_name's index) at least `bytes` large; -1: none. */
STZ_API int stz_tune_like_nearest(const stz_tune_result *r, uint64_t bytes);
/* r's policy (r->policy, the budget met) written to `path` as a policy file
 * (stz compress --policy), under a temporary name placed at the end. */
STZ_API stz_status stz_tune_write_policy(const char *path, const stz_tune_result *r, int force, stz_err *err);
/* The SVG plot of r's curve (size against predicted KL), its choice and
 * what the last verification measured; gguf: sizes are the GGUF file's. */
STZ_API stz_status stz_tune_write_plot(const char *path, const stz_tune_result *r, int gguf, int force, stz_err *err);

#ifdef __cplusplus
}
#endif
#endif
