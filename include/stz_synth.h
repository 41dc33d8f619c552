/*
 * stz_synth.h - deterministic generator of realistic stand-in models.
 *
 * Writes a SafeTensors file with the exact tensor names and shapes of a real
 * architecture, filled with values shaped like trained weights: zero-mean
 * Student-t values scaled by 1/sqrt(fan_in), log-normal per-row and
 * per-column magnitudes, a few (2-3x) outlier input channels, norm weights near 1
 * and small biases. Same params -> same bytes, whatever the thread count.
 * The file's __metadata__ says it is synthetic ("stz.synthetic": "true").
 */
#ifndef STZ_SYNTH_H
#define STZ_SYNTH_H

#include "stz.h"
#include "stz_experimental.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *arch; /* see stz_synth_arch_name(); e.g. "qwen2-0.5b" */
    stz_dtype dtype;  /* BF16, F16 or F32 */
    uint64_t seed;
    int threads;              /* >= 1 */
    unsigned write_flags;     /* STZ_WRITE_FORCE to replace an existing file */
    stz_progress_fn progress; /* optional, bytes of output */
    void *progress_user;
    /* Pruned variants, for the linear weights (not embeddings or the head):
     * sparsity in [0, 1) zeroes that fraction of each matrix's smallest
     * values (magnitude pruning, relative to its row and column scales);
     * two_four keeps the 2 largest of every 4 consecutive values (2:4
     * structured sparsity). At most one of the two. */
    double sparsity;
    int two_four;
    uint64_t layers; /* 0: the architecture's; else this many decoder layers (1..1024) */
    /* nshards > 0: write only shard `shard` (0-based) of nshards: a run of whole tensors, the model cut
     * by bytes; every tensor's values are the unsharded model's */
    uint32_t shard, nshards;
} stz_synth_params;

// clang-format off
#define STZ_SYNTH_PARAMS_DEFAULT {.arch = "tiny", .dtype = STZ_DTYPE_BF16, .seed = 1, .threads = 1}
// clang-format on

typedef struct {
    size_t tensors;
    uint64_t params;
    uint64_t bytes;          /* file size */
    double exp_entropy_bits; /* entropy of the BF16 exponent byte, bits/value */
    uint64_t exp_hist[256];  /* BF16 exponent histogram over all values */
} stz_synth_stats;

/* Architectures, i = 0, 1, ... until NULL. Description via _desc. */
STZ_API const char *stz_synth_arch_name(size_t i);
STZ_API const char *stz_synth_arch_desc(size_t i);
/* Tensor count and parameter count of an architecture (without writing). */
STZ_API stz_status stz_synth_arch_size(const char *arch, size_t *tensors, uint64_t *params, stz_err *err);

/* Generates the model into `path`. stats may be NULL. Errors: STZ_E_ARG
 * (unknown arch, bad dtype, threads < 1), STZ_E_EXISTS, STZ_E_IO, STZ_E_NOMEM,
 * STZ_E_INTERRUPTED (progress callback asked to stop; no file is left). */
STZ_API stz_status stz_synth_write(const stz_synth_params *p, const char *path, stz_synth_stats *stats, stz_err *err);

/* A generated model's Hugging Face files, from its file's "config"
 * metadata: config.json (model_type and the keys transformers and
 * llama.cpp's converter read) and a byte-level BPE tokenizer.json whose
 * ids cover its vocabulary, "<|endoftext|>" last (malloc'd texts). */
STZ_API stz_status stz_synth_hf_files(const char *meta_config, char **config, char **tokenizer, stz_err *err);

/* The model as a Hugging Face folder `dir` (which must not exist): nshards
 * files model-0000K-of-0000N.safetensors (whole tensors, cut by bytes),
 * model.safetensors.index.json, config.json and tokenizer.json
 * (stz_synth_hf_files), built under a temporary name beside it and renamed
 * into place at the end. stats (not NULL) sums the shards; its bytes are
 * the folder's. */
STZ_API stz_status stz_synth_write_dir(const stz_synth_params *p, const char *dir, uint32_t nshards,
                                       stz_synth_stats *stats, stz_err *err);

#ifdef __cplusplus
}
#endif
#endif /* STZ_SYNTH_H */
