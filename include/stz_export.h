/*
 * stz_export.h - export of Llama-family models from plain, quantized or
 * container files to GGUF (llama.cpp's model format, version 3).
 *
 * Export maps tensor names to llama.cpp's (token_embd, blk.N.attn_q, ...),
 * permutes Hugging Face Llama q/k rows to llama.cpp's RoPE pair layout,
 * writes the hyper-parameters and the tokenizer as GGUF keys, and streams
 * each tensor in row batches: memory does not grow with the model.
 * Tensors stz already quantized in a layout GGUF holds exactly (block 32,
 * F16 scales: INT8 absmax/full/mse -> Q8_0, INT4 -> Q4_0, INT5 -> Q5_0)
 * are repacked without requantizing, bit-exact in value; every code is
 * checked to reproduce its value. See docs/cli/export.md.
 */
#ifndef STZ_EXPORT_H
#define STZ_EXPORT_H

#include "stz.h"
#include "stz_experimental.h"
#include "stz_forward.h"
#include "stz_gguf.h"
#include "stz_model.h"
#include "stz_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The llama-quantize types stz_gguf_stats.like_bytes covers. */
#define STZ_GGUF_LIKE_COUNT 16

typedef struct {
    int type;              /* float 2-D tensors: STZ_GGML_AUTO (default) or a type */
    int requantize;        /* quantized tensors GGUF cannot hold exactly: write them
                        as the nearest GGUF type from their values (else refused) */
    const char *tokenizer; /* tokenizer.json or a llama2.c tokenizer file; NULL:
                              tokenizer.json beside the model */
    const char *name;      /* general.name; NULL: from the config or the path */
    int threads;
    unsigned write_flags;     /* STZ_WRITE_FORCE */
    stz_progress_fn progress; /* output bytes */
    void *progress_user;
    /* 1: a tokenizer whose ids cover less than 99% of the embedding's rows
     * is padded with [PADn] tokens (0: refused; a few rows past its ids,
     * as models pad their embedding, are padded either way and counted) */
    int pad_vocab;
    /* float 2-D tensors in the types llama-quantize's mix of this name gives
     * each (stz_gguf_like_parse: "q4_k_m", "q3_k_s", ...: its per-tensor
     * rules and fallbacks, as stz_gguf_stats.like_bytes counts them), with
     * stz's scales; instead of `type`. NULL: none */
    const char *mix;
} stz_gguf_params;

// clang-format off
#define STZ_GGUF_PARAMS_DEFAULT {.type = STZ_GGML_AUTO, .threads = 1}
// clang-format on

/* What an export wrote, per GGUF type. */
typedef struct {
    uint64_t tensors[31], bytes[31]; /* by ggml type (those export writes are < 31) */
    size_t repacked;                 /* quantized tensors copied exactly */
    size_t requantized;              /* quantized tensors requantized (requantize) */
    double requant_max_err;          /* largest relative error ||q - w|| / ||w|| of those */
    char requant_worst[256];
    size_t fallback; /* tensors written F16 because rows are not a multiple of 32 */
    char fallback_first[256];
    /* tensors of a 256-block type (--type or a K-quant the model holds as
     * floats) written in llama.cpp's 32-block fallback because their rows
     * are not whole 256-blocks; the first, and its types */
    size_t block_fallback;
    char block_fallback_first[256];
    int block_fallback_from, block_fallback_to;
    uint32_t vocab_padded;     /* embedding rows past the tokenizer's ids, written as [PADn] tokens */
    uint64_t ffn_from, ffn_to; /* the FFN widened with zero units from ffn_from to ffn_to (0: not), so that
                                  down projections stored in padded 32-blocks ("pad") are whole rows */
    uint64_t header_bytes;     /* the header before its padding to the data's alignment */
    uint64_t file_bytes;
    char arch[16]; /* "llama" or "qwen2" */
    /* per type of llama-quantize (stz_gguf_like_name): the bytes of the file
     * it would make of this model without an importance matrix, by its own
     * per-tensor rules and fallbacks, this header kept */
    uint64_t like_bytes[STZ_GGUF_LIKE_COUNT];
} stz_gguf_stats;

/* llama-quantize's types whose sizes stz computes: i-th's name ("q4_k_m"),
 * NULL past the last; the index of a name (any case), -1 if not one. */
STZ_API const char *stz_gguf_like_name(int i);
STZ_API int stz_gguf_like_parse(const char *name);
struct cJSON;
/* Adds "llama_quantize_bytes" to the JSON object d: the bytes of the file
 * llama-quantize makes of the model under each type it can make
 * (s->like_bytes), as export and tune's reports give them. */
STZ_API void stz_gguf_like_json(struct cJSON *d, const stz_gguf_stats *s);

/* Exports the model in `files` (one checkpoint's shards, opened by the
 * caller; `dir` is its directory, where tokenizer.json may be; NULL: the
 * model_path's, itself when a directory) with configuration c to `out`.
 * `model_path` names the model in messages. out NULL: nothing written, the
 * stats of what would be. */
STZ_API stz_status stz_gguf_export(const stz_gguf_params *p, stz_qmodel *const *files, size_t nfiles,
                                   const stz_fwd_config *c, const char *config_json, const char *model_path,
                                   const char *dir, const char *out, stz_gguf_stats *stats, stz_err *err);

/* ---- reading -------------------------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif
