/*
 * stz_pipeline.h - whole models through the pipeline: read, decide each
 * tensor by a policy, quantize it, write it to a SafeTensors file or
 * straight into a container (docs/ARCHITECTURE.md).
 */
#ifndef STZ_PIPELINE_H
#define STZ_PIPELINE_H

#include "stz.h"
#include "stz_feedback.h"
#include "stz_forward.h"
#include "stz_pack.h"
#include "stz_policy.h"
#include "stz_model.h"
#include "stz_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- files ----------------------------------------------------------- */

typedef struct {
    int threads;              /* INT8/INT4 row batches and OpenBLAS (SVD) threads, >= 1 */
    unsigned write_flags;     /* STZ_WRITE_FORCE */
    stz_progress_fn progress; /* input bytes */
    void *progress_user;
    /* SVD factors are computed before the header is written (their ranks
     * and scales are in it); up to this many bytes of them are held until
     * written, the others computed again then (and checked to be the same
     * bits), so memory does not grow with the number of SVD tensors.
     * 0: STZ_SVD_HOLD_DEFAULT. */
    uint64_t svd_hold_bytes;
    /* importance of the matrices' columns (stz_imatrix.h; NULL: none):
     * each block quantization of a matrix the importance matrix names is
     * searched for the least error weighted by it */
    const struct stz_imatrix *imatrix;
    /* tensors quantized with error feedback (stz_feedback.h; NULL: none):
     * written as it holds them; a "feedback" rule's tensor it does not
     * hold is quantized without */
    struct stz_feedback *feedback;
    /* the model's config.json when not beside the file nor in it (NULL:
     * found as stz_fwd_config_find finds it): a family whose matrices are
     * stored (in, out) (GPT-2's Conv1D) has them quantized along their
     * input, stored transposed (docs/FORMAT.md) */
    const char *config;
} stz_quant_params;

#define STZ_SVD_HOLD_DEFAULT (256u << 20)
// clang-format off
#define STZ_QUANT_PARAMS_DEFAULT {.threads = 1}
// clang-format on

typedef struct {
    uint64_t in_bytes, out_bytes;
    size_t tensors, quantized;
    uint64_t params, params_quantized;
    /* measured while quantizing: cosine of each dequantized tensor against
     * its original; minimum over the quantized tensors (1 if none), mean
     * weighted by parameters over all float tensors (kept ones count 1),
     * as stz eval reports them */
    double min_cosine, weighted_cosine;
    char worst[256]; /* name of the tensor with the lowest cosine */
} stz_quant_stats;

/*
 * Quantizes `in` into `out` following the policy, tensor by tensor (memory
 * does not grow with the model). Kept tensors are copied byte for byte.
 * The output is a normal SafeTensors file whose __metadata__ describes
 * each quantized tensor (docs/FORMAT.md, "Quantized SafeTensors").
 * SVD decisions are factored first (stz_svd.h): the whole matrix is held as
 * F32 while it is factored, and the INT8 factors until they are written.
 * Errors: the reader's, STZ_E_NUMERIC (NaN/Inf, naming tensor and
 * element), STZ_E_DUPLICATE (a companion name exists), STZ_E_LAPACK,
 * STZ_E_EXISTS, STZ_E_IO.
 */
STZ_API stz_status stz_quantize_file(const stz_quant_params *p, stz_policy *policy, const char *in, const char *out,
                                     stz_quant_stats *stats, stz_err *err);

/*
 * Quantizes `in` following the policy straight into the container `out`
 * ("-": standard output): one pass, no intermediate file, memory bounded
 * by a few chunks per thread. The container is byte for byte the one
 * stz_pack_file(pp) makes of the file stz_quantize_file(qp) writes, and
 * unpacks to that file. qp->write_flags are ignored (pp's apply);
 * qstats->out_bytes is the quantized file's size, pstats the container's.
 */
STZ_API stz_status stz_compress_file(const stz_quant_params *qp, const stz_pack_params *pp, stz_policy *policy,
                                     const char *in, const char *out, stz_quant_stats *qstats, stz_pack_stats *pstats,
                                     stz_err *err);

/*
 * Writes a plain model: every tensor under its original name and shape,
 * quantized ones dequantized to their original dtype (or `dtype` if it is
 * not STZ_DTYPE_COUNT: BF16, F16 or F32), kept ones byte-identical. A file
 * without quantized tensors is copied. A GGUF file (llama.cpp's) gives its
 * tensors decoded (F32 unless dtype says otherwise; 1-D ones F32) under
 * Hugging Face names, as stz_qmodel_open_gguf reads them.
 */
STZ_API stz_status stz_dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                                       stz_err *err);

/* The same for a GGUF file, its tensors under `names` (stz_model.h). */
STZ_API stz_status stz_dequantize_gguf(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                                       stz_names names, stz_err *err);

/* ---- sharded model directories ------------------------------------------ */

/* Several processes sharing a directory's shards (MPI ranks, say), through
 * the caller's collective operations; every rank calls stz_convert_shards
 * with the same arguments. */
typedef struct {
    int rank, size;
    /* n bytes of buf from rank `root` to every rank */
    void (*bcast)(void *user, void *buf, size_t n, int root);
    /* Collective: 1 if any rank passed failed != 0; then *err becomes the
     * lowest failing rank's error. */
    int (*any_failed)(void *user, int failed, stz_err *err);
    /* Collective: v[0..n) summed over every rank, in place */
    void (*sum)(void *user, double *v, int n);
    /* Collective: the rank that passed the smallest v (ties: the lowest) */
    int (*min_rank)(void *user, double v);
    void *user;
} stz_ranks;

/* Converts one file: in -> out, on `threads` threads, quiet: no progress. */
typedef stz_status (*stz_shard_fn)(void *user, const char *in, const char *out, int threads, int quiet, stz_err *err);

typedef struct {
    const char *in_suffix, *out_suffix; /* a shard SHARD is the file SHARD+suffix ("" or ".stz") */
    int rewrite_index;                  /* 1: the new index lists the outputs' own tensors and sizes */
    int threads, quiet;
    stz_shard_fn convert;
    void *user;             /* convert's first argument */
    const stz_ranks *ranks; /* NULL: this process alone */
} stz_shards_params;

/*
 * Converts every shard of the sharded directory `in` (checked against its
 * index, stz_model_files) into a new directory `out` (which must not exist):
 * convert(in/SHARD+in_suffix -> out/SHARD+out_suffix); then the index
 * (rewritten from the outputs' tensors if rewrite_index, else copied byte
 * for byte) and everything else in `in`, copied. Up to `threads` shards are
 * converted at once, largest first, each given threads / that many threads
 * (convert must then be safe to run concurrently) and quiet when more than
 * one runs. The directory is built under a temporary name beside `out` and
 * renamed into place only when everything succeeded.
 * With `ranks`, every rank claims whole shards as it becomes free and
 * converts them into the directory rank 0 made; rank 0 writes the index and
 * the rest; a failure on any rank fails every rank, with its error.
 */
STZ_API stz_status stz_convert_shards(const stz_shards_params *p, const char *in, const char *out, stz_err *err);

/* ---- whole models ---------------------------------------------------- */

/* Progress of work in stages ("sampling", "feedback", "compress SHARD"):
 * begin(user, label, flags) starts one and returns its state (flags:
 * STZ_STAGE_*), step(state, done, total) reports on it (non-zero: stop, as
 * every stz_progress_fn), end(state) closes it. A NULL stz_stages shows
 * nothing and stops on stz_interrupt_pending(). */
#define STZ_STAGE_QUIET 1 /* not shown */
#define STZ_STAGE_ITEMS 2 /* done and total count items (sequences, matrices), not bytes */
typedef struct {
    void *(*begin)(void *user, const char *label, int flags);
    stz_progress_fn step;
    void (*end)(void *state);
    void *user;
} stz_stages;

/* The bytes sampling may hold (stz_fwd_set_keep: its key/value cache and
 * the layers it keeps) to draw seqs's sequences (NULL: STZ_FEEDBACK_SEQS)
 * from the open model m: about what error feedback then holds for as many
 * positions (six floats per hidden and feed-forward width: its states, the
 * original model's, a layer's inputs and intermediates), so that sampling
 * does not set the peak, whatever the model's depth. */
STZ_API uint64_t stz_feedback_keep(const stz_fwd *m, const stz_seq_spec *seqs);

/* The sequences seqs asks for, sampled from the open model m or read
 * (stz_seqs_get), as a "sampling" stage (shown unless quiet or read). */
STZ_API stz_status stz_seqs_get_staged(stz_fwd *m, const stz_seq_spec *seqs, const char *label,
                                       const stz_stages *progress, int quiet, stz_seqs *q, char *source, stz_err *err);
/* Error feedback's calibration sequences from the open model m: seqs's
 * (NULL: STZ_FEEDBACK_SEQS), sampled within stz_feedback_keep's bytes, or
 * read; label names the model. */
STZ_API stz_status stz_feedback_seqs(stz_fwd *m, const stz_seq_spec *seqs, const char *label,
                                     const stz_stages *progress, int quiet, stz_seqs *q, stz_err *err);
/* Error feedback for the model at `model` (a file or a directory) under
 * `policy` when a rule asks for it (*fb NULL when none does): the model
 * opened for the forward pass (config: its config.json, NULL: found as
 * stz_fwd_open_model does), the sequences (`drawn` when given, else
 * stz_feedback_seqs), its layers quantized (stz_feedback_run) on `threads`
 * threads. A rule's tensor no matrix product reads (an untied token
 * embedding) is left to plain rounding (stz_feedback_skipped counts them). */
STZ_API stz_status stz_feedback_calibrate(stz_feedback **fb, const char *model, stz_policy *policy,
                                          const stz_seq_spec *seqs, const stz_seqs *drawn, const char *config,
                                          int threads, const stz_stages *progress, int quiet, stz_err *err);

/* An importance matrix's sequences unless told otherwise (stz imatrix's):
 * 16 of 128 tokens sampled, seed 1. */
// clang-format off
#define STZ_IMATRIX_SEQS {.nseq = 16, .default_len = 128, .seed = 1, .temperature = 1, .top_p = 0.9}
// clang-format on
/* Collects into im the importance of the open model m's matrices over the
 * sequences seqs asks for (NULL: STZ_IMATRIX_SEQS): sampled ones as they
 * are sampled (one pass), read ones run after (stz_imatrix_collect);
 * described as "stz imatrix: N sequences, SOURCE". *q: the sequences, for
 * the caller to free; source (STZ_SEQS_SOURCE_MAX bytes) where they came
 * from. label names the model. `ahead` (or NULL): longer sampled sequences
 * the caller will ask m for next (the same seed, temperature, top-p and
 * count): sampled first, the importance collected over their first tokens,
 * so that one pass serves both (the same importance, the same sequences). */
STZ_API stz_status stz_imatrix_sample(struct stz_imatrix *im, stz_fwd *m, const stz_seq_spec *seqs,
                                      const stz_seq_spec *ahead, const char *label, const stz_stages *progress,
                                      int quiet, stz_seqs *q, char *source, stz_err *err);

typedef struct {
    stz_policy *policy;                /* NULL: lossless, every file packed as it is */
    const struct stz_imatrix *imatrix; /* NULL: none (stz_quant_params) */
    const stz_seq_spec *feedback_seqs; /* error feedback's sequences, NULL: STZ_FEEDBACK_SEQS */
    const char *config;                /* the model's config.json for error feedback, NULL: found */
    int threads;                       /* >= 1: quantizing, packing, shards at once */
    int best;                          /* 1: STZ_PACK_BEST */
    unsigned write_flags;              /* STZ_WRITE_FORCE: a file `out` is replaced */
    int quiet;                         /* progress not shown */
    const stz_stages *progress;        /* NULL: none */
    const stz_ranks *ranks;            /* NULL: this process alone */
    const stz_seqs *feedback_drawn;    /* feedback_seqs's sequences already drawn (tune's), NULL: drawn here */
} stz_compress_params;

typedef struct {
    uint64_t in_bytes, out_bytes; /* the model's bytes (not a quantized file's), the containers' */
    size_t files;
    stz_quant_stats stats; /* over every file (and every rank); in/out_bytes unused */
} stz_compress_result;

/*
 * stz compress: the model `in` into containers. `in` is a file, a
 * directory holding model.safetensors (that file, stz_model_file), "-"
 * (standard input, lossless only), or a sharded directory (every shard into
 * the directory `out`, stz_convert_shards, the index rewritten when
 * quantizing); `out` a file, "-" or, for a sharded model, a directory that
 * must not exist. A file `out` is checked before any work. Error feedback
 * is calibrated first when the policy asks for it (stz_feedback_calibrate),
 * then every file quantized straight into its container
 * (stz_compress_file) or packed (stz_pack_file). On ranks: a sharded
 * model only; a failure on any rank fails every rank, with its error
 * (stz_convert_shards); every rank gets the totals of all.
 */
STZ_API stz_status stz_compress_model(const stz_compress_params *p, const char *in, const char *out,
                                      stz_compress_result *r, stz_err *err);

/*
 * The policy stz's commands quantize `model` with: spec's (stz_policy_build),
 * calibrated by default. Error feedback goes on the block rules that do not
 * say (STZ_POLICY_FEEDBACK_UNSAID) when calibration is asked for (`asked`:
 * its sequences were given; or a `config`) or, unless `fast`, when stz runs
 * the model forward (stz_fwd_runs); a model it does not run is quantized by
 * tensor names, and *note says why in one line (an empty message when
 * calibrated or fast). Calibration asked for with fast, or by a policy that
 * quantizes no blocks, is refused (STZ_E_ARG). *out is NULL on error.
 */
STZ_API stz_status stz_policy_for_model(const stz_policy_spec *spec, const char *model, const char *config, int fast,
                                        int asked, stz_policy **out, stz_err *note, stz_err *err);
/* The output stz compress names for `in` when none is given: IN.stz
 * lossless; else BASE.TAG.safetensors.stz or IN.TAG.stz, TAG the policy's
 * name (a shipped one, a file's without its directory and .json; NULL:
 * "custom"). Written into dst (cap bytes, NUL-terminated when cap > 0);
 * returns the name's length: a name as long as cap or longer was cut. */
STZ_API size_t stz_compress_output_name(char *dst, size_t cap, const char *in, int lossless, const char *policy);

#ifdef __cplusplus
}
#endif
#endif
