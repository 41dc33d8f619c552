/* The GGUF exporter's state, shared by gguf_export.c (choosing each
 * tensor's type, the header) and gguf_data.c (writing the tensors' data).
 * Not installed. */
#ifndef STZ_GGUF_EXPORT_H
#define STZ_GGUF_EXPORT_H

#include "gguf/gguf_format.h"
#include "model/arch.h"
#include "stz_export.h"
#include "core/stz_core.h"

/* how a tensor is written: from float values (K_FLOAT), its bytes as
 * stored when GGUF takes its dtype (K_COPY), stz's codes
 * checked value by value (K_REPACK) or copied as stored (K_RAW), stz's
 * values requantized (K_REQUANT), or computed (K_ROPE: rope_freqs) */
enum { K_FLOAT, K_COPY, K_REPACK, K_RAW, K_REQUANT, K_ROPE };

typedef struct {
    char name[64];
    stz_qmodel *m;
    size_t i;
    const stz_qtensor *q;
    uint32_t ndim;
    uint64_t ne[2], rows, cols; /* ne: in the GGUF file; rows, cols: as stored (fewer with a widened FFN) */
    int type, kind, role;
    uint32_t heads; /* rows to reorder in this many heads (0: none) */
    float add;      /* added to every value: 1 for Gemma's norms, which GGUF holds as 1 + w */
    int held;       /* a matrix stored (in, out) (GPT-2's Conv1D), read transposed: values, not stored bytes */
    uint64_t offset, bytes;
} etensor;

typedef struct {
    const stz_gguf_params *p;
    const stz_fwd_config *c;
    const char *model;
    int mix;  /* p->mix's stz_gguf_like_parse, or -1 */
    int tied; /* no output.weight (the embedding is the head) */
    etensor *t;
    size_t n;
    stz_outfile of;
    uint64_t done, total;
    stz_gguf_stats *stats;
    /* row-batch buffers */
    float *f, *g, *sc, *sg;
    uint8_t *q, *out;
    size_t cap_rows, cap_cols;
} exporter;

static inline int block_type(int type) { return stz_ggml_is_block(type); }

/* Writes tensor e's data (then padding to the alignment) at the output's end. */
stz_status stz_gguf_write_tensor(exporter *x, etensor *e, stz_err *err);

/* The tokenizer's keys from `path`: a tokenizer.json (name ending in
 * .json) or a llama2.c tokenizer file, for a model of n_vocab tokens;
 * *padded: rows past its ids (more than 1% refused unless pad_vocab). */
stz_status gguf_vocab(gbuf *kv, const char *path, const stz_arch *arch, const char *config_json, uint32_t n_vocab,
                      int pad_vocab, uint32_t *padded, stz_err *err);

/* stats->like_bytes: the file llama-quantize makes of the n tensors t
 * (planned in the model's own types, their GGUF names and shapes; a Qwen2
 * model or not; tied: no output.weight) under each of its types, with this
 * header (gguf_like.c). */
void stz_gguf_like_sizes(const etensor *t, size_t n, const stz_fwd_config *c, int tied, uint64_t header, uint64_t *out);
/* The type llama-quantize's type `like` (stz_gguf_like_name) gives tensor
 * e by its GGUF name and shape, before the fallbacks for rows that are not
 * whole blocks (F32: a tensor it keeps). */
int stz_gguf_like_type(int like, const etensor *e, const stz_fwd_config *c, int tied);
/* Its LLAMA_FTYPE, general.file_type of the files it writes. */
int stz_gguf_like_ftype(int like);

#endif /* STZ_GGUF_EXPORT_H */
