/*
 * stz_forward.h - a reference forward pass of decoder models (the Llama
 * family and GPT-Neo), to judge a compressed model by what it outputs.
 *
 * Supported: Llama 2/3, Mistral (while sequences fit its sliding window),
 * TinyLlama, Qwen2 (q/k/v biases), Qwen3 (q/k head norms), Phi-3 (fused q/k/v
 * and gate/up matrices) in Hugging Face names, and llama2.c
 * checkpoints (tok_embeddings, layers.N.attention.wq, ...). Grouped-query
 * attention, RoPE (llama2.c's interleaved pairs for llama2.c names, Hugging
 * Face's rotate_half otherwise), RMSNorm, SwiGLU, tied or separate head.
 * GPT-Neo (transformer.h.N.attn.attention.q_proj, ...): learned positions,
 * LayerNorm with biases, an ungated tanh-GELU MLP with biases, unscaled
 * attention scores, local attention on the layers its attention_types
 * says. Gemma 2 and 3 (model.layers.N.pre_feedforward_layernorm, ...):
 * RMSNorm with 1 + w, norms after the attention and the MLP too, the
 * embedding scaled by sqrt(hidden), a tanh-GELU-gated MLP, scores scaled by
 * query_pre_attn_scalar, sliding-window layers in a repeating pattern
 * (Gemma 3's with their own RoPE base), Gemma 2's soft-capping of scores
 * and logits, Gemma 3's q/k head norms. Anything else is refused by name
 * (STZ_E_UNSUPPORTED).
 *
 * Memory: the model runs one layer at a time over all positions of all
 * sequences; one layer's weights (dequantized to F32) and the activations
 * are held, never the whole model. Matrix products and functions are
 * stz's own, with the same bits on every CPU and thread count
 * (docs/ARCHITECTURE.md, "Same bits everywhere").
 */
#ifndef STZ_FORWARD_H
#define STZ_FORWARD_H

#include "stz.h"
#include "stz_experimental.h"
#include "stz_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { STZ_ROPE_NONE = 0, STZ_ROPE_LINEAR, STZ_ROPE_LLAMA3 } stz_rope_scaling;

/* The families the forward pass runs (Hugging Face model_type; llama2.c
 * checkpoints are Llama). */
typedef enum {
    STZ_ARCH_LLAMA = 0,
    STZ_ARCH_MISTRAL,
    STZ_ARCH_QWEN2,
    STZ_ARCH_QWEN3,
    STZ_ARCH_PHI3,
    STZ_ARCH_GPT_NEO,
    STZ_ARCH_GEMMA2,
    STZ_ARCH_GEMMA3,
    STZ_ARCH_GPT2,
    STZ_ARCH_COUNT
} stz_arch_id;

typedef struct {
    uint32_t dim, hidden, n_layers, n_heads, n_kv_heads, head_dim, vocab;
    uint32_t max_pos;        /* longest sequence the model takes; 0: not stated */
    uint32_t sliding_window; /* 0: none */
    int32_t bos;             /* first token of sampled sequences */
    double rope_theta, norm_eps;
    int rope_interleaved;          /* 1: llama2.c pairs (2i, 2i+1); 0: rotate_half (i, i + head_dim/2) */
    int tied;                      /* output head is the token embedding */
    stz_rope_scaling rope_scaling; /* Hugging Face rope_scaling: linear or llama3 */
    double rope_factor, rope_low_freq, rope_high_freq;
    uint32_t rope_orig_pos; /* llama3: original_max_position_embeddings */
    stz_arch_id arch;       /* the family: what its layers do beyond Llama's (Qwen3: q/k head norms) */
    /* Local attention on some layers (GPT-Neo's "local" attention_types):
     * layer l sees the last local_window positions when bit l % local_period
     * of local_mask is set; local_window 0: every layer global. */
    uint32_t local_window, local_period, local_mask;
    double rope_local_theta;            /* Gemma 3: the local layers' RoPE base, unscaled (0: rope_theta's, scaled) */
    double attn_scale;                  /* the scores' scale (Gemma: query_pre_attn_scalar^-1/2); 0: 1/sqrt(head_dim) */
    double attn_softcap, final_softcap; /* Gemma 2: scores and logits x -> cap tanh(x / cap); 0: none */
} stz_fwd_config;

/* Parses a Hugging Face config.json or llama2.c-style config (dim,
 * hidden_dim, n_layers, ...) text; `label` names it in messages. */
STZ_API stz_status stz_fwd_config_parse(stz_fwd_config *c, const char *json, const char *label, stz_err *err);
/* The configuration of the model at `path` (its files open in s): from
 * `config` if given, else config.json in the model directory, else a file's
 * __metadata__["config"], else config.json beside the file. 1 found, 0
 * none, -1 error (err set). `from` (STZ_FWD_FROM_MAX bytes) names where it
 * came from; *text (if text) gets a copy of the JSON, for the caller to free
 * (of the language model's: a multimodal Gemma 3's text_config, with the
 * defaults it leaves out). */
#define STZ_FWD_FROM_MAX 4096
STZ_API int stz_fwd_config_find(const char *path, const stz_model_set *s, const char *config, stz_fwd_config *c,
                                char *from, char **text, stz_err *err);
/* The error for a model at path without a configuration: STZ_E_FORMAT
 * (give a configuration) for Llama-family tensor names, else
 * STZ_E_UNSUPPORTED naming the architectures stz runs. */
STZ_API stz_status stz_fwd_no_config(const char *path, const stz_model_set *s, stz_err *err);

/* The head_dim / 2 RoPE frequencies theta^(-2i/head_dim), scaled as the
 * configuration's rope_scaling says. */
STZ_API void stz_fwd_rope_frequencies(const stz_fwd_config *c, float *f);

typedef struct stz_fwd stz_fwd;

/* A model over the files of one checkpoint (shards), which the caller
 * keeps open. Checks that every tensor the config needs is there with the
 * right shape. `threads`: the threads its products run on (the results do
 * not depend on it). One call at a time on a stz_fwd and on the files
 * under it (their read buffers are shared): two threads open the files
 * twice. */
STZ_API stz_status stz_fwd_open(stz_fwd **out, stz_qmodel *const *files, size_t nfiles, const stz_fwd_config *c,
                                const char *label, int threads, stz_err *err);
/* The model at `path` (a file or a directory: its files opened into *s)
 * opened for the forward pass on `threads` threads, with its configuration
 * found as stz_fwd_config_find does (config: a config.json's path, or
 * NULL); the caller frees *out and *s, also on failure. */
STZ_API stz_status stz_fwd_open_model(stz_fwd **out, stz_model_set *s, const char *path, const char *config,
                                      int threads, stz_err *err);
/* Whether stz runs the model at `path` forward (stz_fwd_open_model
 * succeeds): 1 yes; 0 no, err saying why, when its files are not ones the
 * forward pass reads, it has no configuration, or one of an architecture
 * stz does not run (and config is NULL: a given one must work); -1 on any
 * other error (err set). */
STZ_API int stz_fwd_runs(const char *path, const char *config, stz_err *err);
STZ_API void stz_fwd_free(stz_fwd *m);
STZ_API const stz_fwd_config *stz_fwd_cfg(const stz_fwd *m);
/* The token embedding's name; *tied (when not NULL) is 1 when the output
 * head is that embedding. */
STZ_API const char *stz_fwd_embedding(const stz_fwd *m, int *tied);
/* The tensor-name layout of a checkpoint (stz_names), told by its token
 * embedding: STZ_NAMES_HF (model.embed_tokens.weight), STZ_NAMES_LLAMA2C
 * (tok_embeddings.weight), STZ_NAMES_GPT_NEO (transformer.wte.weight with
 * GPT-Neo's transformer.h.0.attn.attention.out_proj.weight: GPT-2 names its
 * embedding so too), STZ_NAMES_GEMMA (model.embed_tokens.weight with
 * model.layers.0.pre_feedforward_layernorm.weight), STZ_NAMES_GPT2
 * (transformer.wte.weight with transformer.h.0.attn.c_attn.weight, or the
 * same without "transformer."), -1 none (not a model stz_fwd_open runs). */
STZ_API int stz_fwd_layout(stz_qmodel *const *files, size_t nfiles);

/* Called after each layer of each pass; non-zero stops with STZ_E_INTERRUPTED. */
typedef int (*stz_fwd_progress)(void *user, uint64_t done, uint64_t total);

/* Logits of every position: tokens holds nseq sequences of len ids; logits
 * gets nseq * len * vocab floats (row t: the prediction of token t + 1). */
STZ_API stz_status stz_fwd_logits(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t len, float *logits,
                                  stz_err *err);

/* The bytes sampling holds (default STZ_FWD_KEEP_DEFAULT, 2 GiB): its
 * key/value cache first, the sequences drawn in as few groups as keep it
 * within them (one sequence at a time at least), then layers' weights kept
 * as F32 between steps while they fit in what is left (faster: a layer not
 * kept is read again at every step). The tokens drawn do not depend on it;
 * 0: the least memory. */
#define STZ_FWD_KEEP_DEFAULT ((uint64_t)2 << 30)
STZ_API void stz_fwd_set_keep(stz_fwd *m, uint64_t bytes);

/* Samples nseq sequences of len tokens (BOS first) at `temperature` with
 * nucleus `top_p`, deterministically from `seed`: each sequence's tokens
 * depend on the seed and its index, not on nseq or len. m keeps the largest
 * draw and answers a request it covers (the same seed, temperature and
 * top-p, no more sequences or tokens) from it without a pass, unless an
 * importance matrix is attached. */
STZ_API stz_status stz_fwd_sample(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                                  int32_t *tokens, stz_fwd_progress progress, void *user, stz_err *err);

/* ---- token sequences ---------------------------------------------------- */

/* nseq sequences of token ids back to back (the stride 0 of the functions
 * below), lens[s] ids each, the longest `longest`. */
typedef struct {
    int32_t *tok;
    size_t *lens, nseq, longest;
} stz_seqs;
/* Parses a tokens file's text[0..len) (NUL-terminated there; its newlines
 * are overwritten), `label` naming it in messages: one sequence per line,
 * ids apart by white space, or a JSON array of arrays of ids; ids are
 * decimal whole numbers below 2^31 (no sign, exponent, fraction, hex, NUL,
 * nothing after the JSON), at least 2 per sequence. On failure nothing is
 * left to free. */
STZ_API stz_status stz_seqs_parse(char *text, size_t len, const char *label, stz_seqs *q, stz_err *err);
/* Reads and parses such a file; ids of `vocab` or more are refused, naming
 * the model `label` (vocab 0: not checked). */
STZ_API stz_status stz_seqs_read(const char *path, uint32_t vocab, const char *label, stz_seqs *q, stz_err *err);
/* nseq sequences of len tokens sampled from m (stz_fwd_sample). */
STZ_API stz_status stz_seqs_sample(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                                   stz_fwd_progress progress, void *user, stz_seqs *q, stz_err *err);
/* Writes the sequences in the line form (a file that is replaced only with
 * force; nothing at path until it is whole). */
/* Which sequences to run: a tokens file's (stz_seqs_read), or nseq of len
 * tokens sampled from the model (stz_seqs_sample); len 0: default_len, or
 * the model's positions if fewer. */
typedef struct {
    const char *path; /* NULL: sample */
    size_t nseq, len, default_len;
    uint64_t seed;
    double temperature, top_p;
} stz_seq_spec;
/* Error feedback's sequences unless told otherwise: 16 of 256 tokens
 * sampled, seed 1. */
// clang-format off
#define STZ_FEEDBACK_SEQS {.nseq = 16, .default_len = 256, .seed = 1, .temperature = 1, .top_p = 0.9}
// clang-format on
/* The sequences s asks for from model m, `label` naming it in messages
 * (read: ids checked against its vocabulary); progress counts sampled
 * tokens. `source` (STZ_SEQS_SOURCE_MAX bytes) says where they came from. */
#define STZ_SEQS_SOURCE_MAX 64
/* The tokens per sequence a sampling s asks of m (len, else default_len or
 * the model's positions if fewer). */
STZ_API size_t stz_seq_spec_len(const stz_seq_spec *s, const stz_fwd *m);
STZ_API stz_status stz_seqs_get(const stz_seq_spec *s, stz_fwd *m, const char *label, stz_fwd_progress progress,
                                void *user, stz_seqs *q, char *source, stz_err *err);
STZ_API stz_status stz_seqs_save(const char *path, const stz_seqs *q, int force, stz_err *err);
STZ_API void stz_seqs_free(stz_seqs *q);

typedef struct {
    uint64_t positions;                                           /* scored: every position whose next token is given */
    double kl_mean, kl_stderr, kl_median, kl_p95, kl_p99, kl_max; /* KL(P_ref || P_cand), nats/token */
    double top1;                                                  /* share of positions where both argmaxes agree */
    double ppl_ref, ppl_cand, ppl_change; /* perplexity on the sequences; change = cand / ref - 1 */
} stz_fwd_report;

/* Runs both models over the same sequences (lens[s] tokens each, laid out
 * `stride` apart, or back to back when stride is 0, as every function
 * taking tokens, nseq, stride and lens reads them) and compares their
 * next-token distributions, in double precision. Memory is bounded: the
 * sequences run a batch at a time, which changes no figure. */
STZ_API stz_status stz_fwd_compare(stz_fwd *ref, stz_fwd *cand, const int32_t *tokens, size_t nseq, size_t stride,
                                   const size_t *lens, stz_fwd_progress progress, void *user, stz_fwd_report *out,
                                   stz_err *err);

/*
 * Sensitivity of the output to each weight matrix (stz tune): the model is
 * run once as it is, then once per selected matrix with that matrix alone
 * perturbed, and each run's next-token distributions are compared with
 * the first's (mean KL over the scored positions, as stz_fwd_compare).
 * Matrices: the token embedding, a learned position embedding (GPT-Neo),
 * each layer's projections, and the output head when it is not the
 * embedding. A run perturbing layer l
 * starts from the stored input of layer l, so the cost is about
 * (layers - l) layers plus the head per matrix; memory holds one layer's
 * weights, a few copies of the hidden states and the reference logits
 * (scored positions x vocabulary floats), not the model.
 */
typedef struct {
    /* 1: measure matrix `name` */
    int (*select)(void *user, const char *name);
    /* rewrites rows [r0, r0 + n) of matrix `name` (cols floats each), as read from the model, into their
     * perturbed values; non-zero: it could not (out of memory), and the run stops with STZ_E_NOMEM */
    int (*perturb)(void *user, const char *name, float *rows, uint64_t r0, size_t n, size_t cols);
    /* the result for `name`: mean KL(unperturbed || perturbed), nats per token */
    void (*result)(void *user, const char *name, double kl);
    void *user;
    /* optional: the token embedding, when selected, is measured `variants`
     * times (0 or 1: once), variant(user, k) called before run k, so that
     * several perturbations of it share one unperturbed run */
    size_t variants;
    void (*variant)(void *user, size_t k);
} stz_fwd_probe;

/* Runs the model on the sequences once unperturbed, then once per matrix
 * the probe selects with that matrix perturbed as it is read (the
 * embedding once per variant), and reports each KL to probe->result
 * (layers before the matrix are run once; none past the last one
 * selected). */
STZ_API stz_status stz_fwd_probe_run(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                                     const stz_fwd_probe *probe, stz_fwd_progress progress, void *user, stz_err *err);

#ifdef __cplusplus
}
#endif
#endif
