/*
 * stz_model.h - any model file stz reads (plain or quantized SafeTensors,
 * or a container of one) seen as float tensors under their original names.
 */
#ifndef STZ_MODEL_H
#define STZ_MODEL_H

#include "stz.h"
#include "stz_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- reading plain or quantized files as floats ----------------------- */

/* One tensor under its original name, shape and dtype, seen as rows x cols
 * (cols = last dimension; the whole tensor for fewer than 2 dimensions). */
typedef struct {
    const char *name;
    stz_dtype dtype; /* original dtype */
    int ndim;
    const uint64_t *shape; /* original shape */
    uint64_t numel, rows, cols;
    int bits;                /* 0: stored as is; 2..8: quantized */
    uint64_t rank;           /* SVD factors (INT8, bits 8): their rank; else 0 */
    uint64_t stored_bytes;   /* bytes in the file: values (+ scales) */
    const char *method;      /* "absmax", "full", "mse", "asym", "nl", "svd", or a llama.cpp type ("q4_k",
                             * "f16": its blocks stored as GGUF stores them); NULL when stored as is */
    uint32_t block_size;     /* quantized (not svd): elements per block */
    stz_dtype scale_dtype;   /* stz's methods: how scales are stored (F16, F32, U8); else STZ_DTYPE_COUNT */
    const char *scales_name; /* quantized (not svd): the stored scales tensor, NULL for a single scale */
    const char *gguf_type;   /* a GGUF file's tensor (read as floats): its ggml type ("q4_0", "f16"), else NULL */
    int transposed;          /* rows and cols are shape's two dimensions swapped, rows of the transpose read (GPT-2's
                              * Conv1D weights, stored (in, out), as the forward pass and GGUF take them):
                              * STZ_TRANSPOSED_STORED (quantized so) or _HELD (stz_qmodel_transpose); else 0 */
} stz_qtensor;

enum { STZ_TRANSPOSED_HELD = 1, STZ_TRANSPOSED_STORED = 2 };

typedef struct stz_qmodel stz_qmodel;

/* The tensor names of a checkpoint: GGUF's own (blk.N.attn_q), llama2.c's
 * (layers.N.attention.wq), Hugging Face's for Llama-family models
 * (model.layers.N.self_attn.q_proj), for GPT-Neo
 * (transformer.h.N.attn.attention.q_proj), for Gemma 2 and 3 (Hugging
 * Face's, but post_attention_layernorm follows the attention and
 * pre_feedforward_layernorm comes before the MLP) or for GPT-2
 * (transformer.h.N.attn.c_attn, with or without "transformer."). */
typedef enum {
    STZ_NAMES_GGUF = -1,
    STZ_NAMES_LLAMA2C = 0,
    STZ_NAMES_HF = 1,
    STZ_NAMES_GPT_NEO = 2,
    STZ_NAMES_GEMMA = 3,
    STZ_NAMES_GPT2 = 4
} stz_names;

/* Opens a plain or quantized SafeTensors file, or an .stz container of one
 * (its chunks decoded as rows are read, one chunk held: no temporary file).
 * Companion scales tensors are not listed; quantized tensors appear under
 * their original names. */
STZ_API stz_status stz_qmodel_open(stz_qmodel **out, const char *path, stz_err *err);
/* A GGUF file (llama.cpp's) as a model of float tensors, decoded where they
 * are read, under `names`: the inverse of stz export's mapping, with its
 * q/k row permutation undone for Hugging Face names of a "llama" model
 * (stz_qmodel_open of a GGUF path gives Hugging Face names; Gemma's for a
 * Gemma file). Types stz
 * reads: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k to q6_k,
 * iq4_nl, iq4_xs (STZ_E_UNSUPPORTED names a tensor of another). */
STZ_API stz_status stz_qmodel_open_gguf(stz_qmodel **out, const char *path, stz_names names, stz_err *err);
/* The same over a reader the caller keeps (for example a container's
 * header, stz_container_header): lists tensors; reading rows needs the
 * reader's data. */
STZ_API stz_status stz_qmodel_open_reader(stz_qmodel **out, const stz_reader *r, stz_err *err);
STZ_API void stz_qmodel_free(stz_qmodel *m);
/* A container's chunks are decoded on `threads` threads where a read covers
 * several (stz_container_set_threads); no effect on other files. */
STZ_API void stz_qmodel_set_threads(stz_qmodel *m, int threads);
struct stz_container;
/* The container m was opened from, or NULL for a SafeTensors file. */
STZ_API struct stz_container *stz_qmodel_container(const stz_qmodel *m);
STZ_API size_t stz_qmodel_count(const stz_qmodel *m);
STZ_API const stz_qtensor *stz_qmodel_tensor(const stz_qmodel *m, size_t i);
/* The index of the tensor `name` (its original name), or -1; a name not
 * there is looked up under the other names checkpoints store it under
 * ("transformer.X" as "X": GPT2Model's; "model.X" as
 * "language_model.model.X" or "model.language_model.X": a multimodal
 * Gemma 3's language model). */
STZ_API long stz_qmodel_find(const stz_qmodel *m, const char *name);
/* The SafeTensors header the tensors are read from (a container's
 * original's). */
STZ_API const stz_reader *stz_qmodel_reader(const stz_qmodel *m);
/* Reads rows [row, row + nrows) of tensor i as floats (dequantized if
 * needed) into dst (nrows * cols floats). STZ_E_DTYPE for a non-float
 * tensor that is stored as is. Not thread-safe on one model. */
STZ_API stz_status stz_qmodel_read_rows(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst, stz_err *err);
/* The stored bytes of rows [row, row + nrows) of a block-quantized tensor
 * with a scales tensor: codes (nrows * stz_qf_row_bytes) and scales (nrows
 * * blocks * the scale dtype's size), as docs/FORMAT.md lays them out.
 * STZ_E_UNSUPPORTED for other tensors. */
STZ_API stz_status stz_qmodel_read_codes(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, uint8_t *codes,
                                         uint8_t *scales, stz_err *err);
/* The same as stz_qmodel_read_rows, and for a block-quantized tensor (bits set, rank 0) each
 * block's scale as stored, exactly (nrows * ceil(cols / block_size)
 * floats, row by row), when scales is not NULL. */
STZ_API stz_status stz_qmodel_read_rows_scales(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst,
                                               float *scales, stz_err *err);

/* From now on, rows of tensor i's transpose are read (a 2-D tensor; its
 * transposed, rows and cols change): the whole tensor is read once and
 * held transposed while its rows are read. A tensor already transposed
 * stays so. Read codes (stz_qmodel_read_codes) and scales are then refused. */
STZ_API stz_status stz_qmodel_transpose(stz_qmodel *m, size_t i, stz_err *err);
/* 1 for a tensor stored quantized: by stz, or in a GGUF block type. */
STZ_API int stz_qtensor_quantized(const stz_qtensor *t);
/* How a tensor is stored, as a policy action names it: "int4", "svd", a GGUF
 * block type ("q4_k"), or `kept` when it is stored as is. */
STZ_API const char *stz_qtensor_action(const stz_qtensor *t, const char *kept);

/* ---- model directories -------------------------------------------------- */

/* The index of a sharded model directory, as Hugging Face ships them. */
#define STZ_INDEX_NAME "model.safetensors.index.json"

/* 1 if `path` is a directory holding STZ_INDEX_NAME (a sharded model). */
STZ_API int stz_model_is_sharded(const char *path);
/* The files a model path stands for, as a malloc'd list (stz_model_files_free):
 * a file: itself; a sharded directory: its shards in the index's order of
 * first appearance (plain, or SHARD.stz in a compressed directory), checked
 * against the index (every tensor of every shard under that shard and in
 * one shard only, no link out of the directory); a directory holding
 * model.safetensors (or model.safetensors.stz): that file. */
STZ_API stz_status stz_model_files(const char *path, char ***files, size_t *n, stz_err *err);
STZ_API void stz_model_files_free(char **files, size_t n);
/* The file to work on for a model path (malloc'd into *file): a directory
 * holding model.safetensors (or model.safetensors.stz, stz_model_files),
 * that file; any other path (a file, "-", a sharded directory), itself. */
STZ_API stz_status stz_model_file(const char *path, char **file, stz_err *err);

/* Every file of a model path (stz_model_files) open as a stz_qmodel. */
typedef struct {
    stz_qmodel **m;
    size_t n;
} stz_model_set;
/* Opens a file or every shard of a model directory (a GGUF file's tensors
 * under Hugging Face names); on failure nothing is left open. */
STZ_API stz_status stz_model_set_open(stz_model_set *s, const char *path, stz_err *err);
/* The same for a candidate compared with `like`: a GGUF file's tensors
 * under like's names (llama2.c's or Hugging Face's). */
STZ_API stz_status stz_model_set_open_like(stz_model_set *s, const char *path, const stz_model_set *like, stz_err *err);
STZ_API void stz_model_set_free(stz_model_set *s);
/* The tensor `name` in any file of the set: file *f, index *i; 0 if none. */
STZ_API int stz_model_set_find(const stz_model_set *s, const char *name, size_t *f, size_t *i);

#ifdef __cplusplus
}
#endif
#endif
