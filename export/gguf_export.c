/* stz_gguf_export: a Llama-family checkpoint to GGUF, streamed tensor by
 * tensor in row batches (see stz_gguf.h). */
#include "gguf_internal.h"
#include "stz_internal.h"
#include "stz_pack.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Source names (llama2.c, Hugging Face) and llama.cpp's; %u is the layer.
 * `perm`: Hugging Face q / k rows that llama.cpp's "llama" RoPE wants in
 * (2i, 2i+1) pairs (1: query heads, 2: key/value heads). */
static const struct {
    const char *src[2], *gguf;
    int perm;
} roles[] = {
    {{"tok_embeddings.weight", "model.embed_tokens.weight"}, "token_embd.weight", 0},
    {{"layers.%u.attention_norm.weight", "model.layers.%u.input_layernorm.weight"}, "blk.%u.attn_norm.weight", 0},
    {{"layers.%u.attention.wq.weight", "model.layers.%u.self_attn.q_proj.weight"}, "blk.%u.attn_q.weight", 1},
    {{"layers.%u.attention.wq.bias", "model.layers.%u.self_attn.q_proj.bias"}, "blk.%u.attn_q.bias", 1},
    {{"layers.%u.attention.wk.weight", "model.layers.%u.self_attn.k_proj.weight"}, "blk.%u.attn_k.weight", 2},
    {{"layers.%u.attention.wk.bias", "model.layers.%u.self_attn.k_proj.bias"}, "blk.%u.attn_k.bias", 2},
    {{"layers.%u.attention.wv.weight", "model.layers.%u.self_attn.v_proj.weight"}, "blk.%u.attn_v.weight", 0},
    {{"layers.%u.attention.wv.bias", "model.layers.%u.self_attn.v_proj.bias"}, "blk.%u.attn_v.bias", 0},
    {{"layers.%u.attention.wo.weight", "model.layers.%u.self_attn.o_proj.weight"}, "blk.%u.attn_output.weight", 0},
    {{"layers.%u.attention.wo.bias", "model.layers.%u.self_attn.o_proj.bias"}, "blk.%u.attn_output.bias", 0},
    {{"layers.%u.ffn_norm.weight", "model.layers.%u.post_attention_layernorm.weight"}, "blk.%u.ffn_norm.weight", 0},
    {{"layers.%u.feed_forward.w1.weight", "model.layers.%u.mlp.gate_proj.weight"}, "blk.%u.ffn_gate.weight", 0},
    {{"layers.%u.feed_forward.w3.weight", "model.layers.%u.mlp.up_proj.weight"}, "blk.%u.ffn_up.weight", 0},
    {{"layers.%u.feed_forward.w2.weight", "model.layers.%u.mlp.down_proj.weight"}, "blk.%u.ffn_down.weight", 0},
    {{"norm.weight", "model.norm.weight"}, "output_norm.weight", 0},
    {{"output.weight", "lm_head.weight"}, "output.weight", 0},
};
#define NROLES (sizeof roles / sizeof roles[0])
#define FIRST_LAYER_ROLE 1
#define LAST_LAYER_ROLE 13

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
    uint64_t ne[2], rows, cols;
    int type, kind;
    uint32_t heads; /* rows to reorder in this many heads (0: none) */
    uint64_t offset, bytes;
} etensor;

typedef struct {
    const stz_gguf_params *p;
    const stz_fwd_config *c;
    const char *model;
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

static int block_type(int type) { return type == STZ_GGML_Q8_0 || type == STZ_GGML_Q5_0 || type == STZ_GGML_Q4_0; }

static int float_type(stz_dtype d)
{
    return d == STZ_DTYPE_F16 ? STZ_GGML_F16 : d == STZ_DTYPE_BF16 ? STZ_GGML_BF16 : STZ_GGML_F32;
}

/* The GGUF type stz's quantized tensor q maps to exactly, or -1. */
static int exact_type(const stz_qtensor *q)
{
    if (!q->bits || q->rank || q->block_size != GGML_QK || q->cols % GGML_QK || q->scale_dtype != STZ_DTYPE_F16 ||
        (strcmp(q->method, "absmax") && strcmp(q->method, "full") && strcmp(q->method, "mse")))
        return -1;
    return q->bits == 8 ? STZ_GGML_Q8_0 : q->bits == 5 ? STZ_GGML_Q5_0 : q->bits == 4 ? STZ_GGML_Q4_0 : -1;
}

/* The nearest GGUF block type for stz's quantized tensor q (requantize). */
static int nearest_type(const stz_qtensor *q)
{
    return q->rank || q->bits >= 6 ? STZ_GGML_Q8_0 : q->bits == 5 ? STZ_GGML_Q5_0 : STZ_GGML_Q4_0;
}

/* Decides how tensor e (source q) is written. */
static stz_status choose(exporter *x, etensor *e, stz_err *err)
{
    const stz_qtensor *q = e->q;
    int want = x->p->type;
    e->kind = K_FLOAT;
    if (e->ndim == 1) {
        e->type = STZ_GGML_F32; /* norms and biases: llama.cpp keeps them F32 */
        e->kind = !q->bits && q->dtype == STZ_DTYPE_F32 && !e->heads ? K_COPY : K_FLOAT;
    }
    else if (q->bits && (e->type = exact_type(q)) >= 0)
        /* stored codes and scales when there is a scales tensor (more than one block) */
        e->kind = e->type != STZ_GGML_Q5_0 && e->rows * (e->cols / GGML_QK) > 1 ? K_RAW : K_REPACK;
    else if (q->bits && e->cols % GGML_QK)
        e->type = STZ_GGML_Q8_0; /* any block type: replaced below */
    else if (q->bits) {
        if (!x->p->requantize)
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: tensor '%s' is stored as %s %d-bit%s, block %u, %s scales, which GGUF cannot hold "
                               "exactly (exact: absmax/full/mse, 8/5/4 bits, block 32, F16 scales, rows of whole "
                               "blocks): use --requantize, or quantize with --policy gguf-q4_0 or gguf-q8_0",
                               x->model, q->name, q->method, q->bits, q->rank ? " factors" : "", q->block_size,
                               q->scale_dtype < STZ_DTYPE_COUNT ? stz_dtype_name(q->scale_dtype) : "F32");
        e->kind = K_REQUANT;
        e->type = block_type(want) ? want : nearest_type(q);
    } else {
        e->type = want == STZ_GGML_AUTO ? float_type(q->dtype) : want;
        if (!block_type(e->type) && e->type == float_type(q->dtype) && q->dtype != STZ_DTYPE_F64)
            e->kind = K_COPY;
    }
    if (block_type(e->type) && e->cols % GGML_QK) {
        /* no block type takes such rows: F16 as llama.cpp does, or F32 for
           stz's quantized values, which it holds exactly */
        if (!x->stats->fallback++)
            snprintf(x->stats->fallback_first, sizeof x->stats->fallback_first, "%s", q->name);
        e->type = q->bits ? STZ_GGML_F32 : STZ_GGML_F16;
        e->kind = K_FLOAT;
    }
    return STZ_OK;
}

static stz_status plan(exporter *x, stz_qmodel *const *files, size_t nfiles, int hf, int permute, stz_err *err)
{
    const stz_fwd_config *c = x->c;
    size_t cap = NROLES * (size_t)c->n_layers + 8;
    if (!(x->t = calloc(cap, sizeof *x->t)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    /* in file order: the embedding, layer by layer, then the norm and head */
    for (uint32_t l = 0; l <= c->n_layers + 1; l++)
        for (size_t r = 0; r < NROLES; r++) {
            int layered = r >= FIRST_LAYER_ROLE && r <= LAST_LAYER_ROLE;
            if (layered ? !l || l > c->n_layers : (l != 0) != (r > LAST_LAYER_ROLE) || (l && l <= c->n_layers))
                continue;
            char src[256];
            snprintf(src, sizeof src, roles[r].src[hf], l - 1);
            etensor *e = &x->t[x->n];
            long at = -1;
            for (size_t f = 0; f < nfiles && at < 0; f++)
                if ((at = stz_qmodel_find(files[f], src)) >= 0)
                    e->m = files[f], e->i = (size_t)at;
            if (at < 0)
                continue; /* biases, a tied head: stz_fwd_open checked what is required */
            e->q = stz_qmodel_tensor(e->m, e->i);
            snprintf(e->name, sizeof e->name, roles[r].gguf, l - 1);
            e->rows = e->q->rows, e->cols = e->q->cols;
            e->ndim = e->q->ndim >= 2 ? 2 : 1;
            e->ne[0] = e->cols, e->ne[1] = e->rows;
            if (e->ndim == 1)
                e->ne[0] = e->q->numel, e->rows = 1, e->cols = e->q->numel;
            if (permute && roles[r].perm)
                e->heads = roles[r].perm == 1 ? c->n_heads : c->n_kv_heads;
            stz_status st = choose(x, e, err);
            if (st)
                return st;
            x->n++;
        }
    if (c->rope_scaling == STZ_ROPE_LLAMA3) {
        etensor *e = &x->t[x->n++];
        snprintf(e->name, sizeof e->name, "rope_freqs.weight");
        e->kind = K_ROPE, e->type = STZ_GGML_F32, e->ndim = 1;
        e->ne[0] = e->cols = c->head_dim / 2, e->rows = 1;
    }
    return STZ_OK;
}

/* ---- metadata -------------------------------------------------------------- */

static const char *model_type(const cJSON *cfg)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(cfg, "architecture");
    return cJSON_IsString(mt) ? mt->valuestring : cJSON_IsString(ar) ? ar->valuestring : "";
}

static void put_hparams(gbuf *kv, const stz_fwd_config *c, const char *arch, const char *name, int quantized)
{
    char k[96];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, arch), k)
    kv_str(kv, "general.architecture", arch);
    kv_str(kv, "general.name", name);
    if (quantized)
        kv_u32(kv, "general.quantization_version", 2);
    kv_u32(kv, KEY("context_length"), c->max_pos ? c->max_pos : 2048);
    kv_u32(kv, KEY("embedding_length"), c->dim);
    kv_u32(kv, KEY("block_count"), c->n_layers);
    kv_u32(kv, KEY("feed_forward_length"), c->hidden);
    kv_u32(kv, KEY("attention.head_count"), c->n_heads);
    kv_u32(kv, KEY("attention.head_count_kv"), c->n_kv_heads);
    kv_f32(kv, KEY("attention.layer_norm_rms_epsilon"), (float)c->norm_eps);
    kv_f32(kv, KEY("rope.freq_base"), (float)c->rope_theta);
    kv_u32(kv, KEY("rope.dimension_count"), c->head_dim);
    kv_u32(kv, KEY("vocab_size"), c->vocab);
    if (c->head_dim * c->n_heads != c->dim) {
        kv_u32(kv, KEY("attention.key_length"), c->head_dim);
        kv_u32(kv, KEY("attention.value_length"), c->head_dim);
    }
    if (c->rope_scaling == STZ_ROPE_LINEAR) {
        kv_str(kv, KEY("rope.scaling.type"), "linear");
        kv_f32(kv, KEY("rope.scaling.factor"), (float)c->rope_factor);
    }
#undef KEY
}

/* ---- data ------------------------------------------------------------------ */

static stz_status reserve(exporter *x, size_t rows, size_t cols, stz_err *err)
{
    if (rows <= x->cap_rows && cols <= x->cap_cols)
        return STZ_OK;
    rows = rows > x->cap_rows ? rows : x->cap_rows, cols = cols > x->cap_cols ? cols : x->cap_cols;
    size_t n = rows * cols, nb = rows * (cols / GGML_QK + 1);
    free(x->f), free(x->g), free(x->sc), free(x->sg), free(x->q), free(x->out);
    x->f = malloc(n * 4), x->g = malloc(n * 4), x->sc = malloc(nb * 4), x->sg = malloc(nb * 4);
    x->q = malloc(cols + 8), x->out = malloc(n * 4 + 64);
    x->cap_rows = rows, x->cap_cols = cols;
    if (!x->f || !x->g || !x->sc || !x->sg || !x->q || !x->out)
        return x->cap_rows = 0, stz_err_set(err, STZ_E_NOMEM, "out of memory for rows of %zu values", cols);
    return STZ_OK;
}

/* Head-reordered copy of rows of `width` bytes: within each head of hd
 * rows, row 2j + t takes row t * hd / 2 + j (Hugging Face's rotate_half
 * halves into llama.cpp's pairs). */
static void permute(const void *src, void *dst, size_t rows, size_t width, size_t hd)
{
    for (size_t h = 0; h < rows / hd; h++)
        for (size_t j = 0; j < hd / 2; j++)
            for (size_t t = 0; t < 2; t++)
                memcpy((char *)dst + (h * hd + 2 * j + t) * width, (const char *)src + (h * hd + t * hd / 2 + j) * width,
                       width);
}

/* One Q8_0 / Q4_0 block from stz's codes c and F16 scale bytes (the same
 * numbers: a 4-bit two's complement code n is Q4_0's n + 8, that is n ^ 8;
 * stz's byte k holds codes 2k (high nibble) and 2k + 1, Q4_0's byte j codes
 * j and j + 16). */
static void raw_block(int type, const uint8_t *c, const uint8_t *scale, uint8_t *o)
{
    memcpy(o, scale, 2); /* both little-endian F16 */
    if (type == STZ_GGML_Q8_0) {
        memcpy(o + 2, c, 32);
        return;
    }
#ifdef __SSE2__
    const __m128i m = _mm_set1_epi8(0x0F), flip = _mm_set1_epi8((char)0x88);
    __m128i lo = _mm_xor_si128(_mm_loadl_epi64((const __m128i *)c), flip);
    __m128i hi = _mm_xor_si128(_mm_loadl_epi64((const __m128i *)(c + 8)), flip);
    __m128i even = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lo, 4), m), _mm_andnot_si128(m, hi));
    __m128i odd = _mm_or_si128(_mm_and_si128(lo, m), _mm_slli_epi16(_mm_and_si128(hi, m), 4));
    _mm_storeu_si128((__m128i *)(o + 2), _mm_unpacklo_epi8(even, odd));
#else
    for (size_t j = 0; j < 8; j++) {
        unsigned lo = c[j] ^ 0x88u, hi = c[j + 8] ^ 0x88u;
        o[2 + 2 * j] = (uint8_t)((lo >> 4) | (hi & 0xF0u));
        o[3 + 2 * j] = (uint8_t)((lo & 15u) | (hi & 15u) << 4);
    }
#endif
}

/* K_COPY: the stored bytes. K_RAW: stz's stored codes and F16 scale
 * bytes straight into Q8_0 / Q4_0 blocks (raw_block). */
static stz_status raw_rows(exporter *x, etensor *e, uint64_t row, size_t nr, size_t hd, stz_err *err)
{
    size_t cols = (size_t)e->cols, nb = cols / GGML_QK, srb = nb * 2;
    size_t crb = e->kind == K_COPY ? (size_t)stz_ggml_row_bytes(e->type, cols) : stz_qf_row_bytes(e->q->bits, cols);
    size_t bb = e->type == STZ_GGML_Q8_0 ? 34 : 18;
    uint8_t *codes = e->kind == K_COPY && !e->heads ? x->out : (uint8_t *)x->f, *sc = (uint8_t *)x->sc;
    stz_status st;
    if (e->kind == K_COPY) {
        const stz_reader *r = stz_qmodel_reader(e->m);
        const stz_tensor *t = stz_reader_tensor(r, (size_t)stz_reader_find(r, e->q->name));
        if ((st = stz_reader_read(r, t, row * crb, codes, nr * crb, err)))
            return st;
        if (e->heads)
            permute(codes, x->out, nr, crb, hd);
        return STZ_OK;
    }
    if ((st = stz_qmodel_read_codes(e->m, e->i, row, nr, codes, sc, err)))
        return st;
    if (e->heads) {
        permute(codes, x->g, nr, crb, hd), codes = (uint8_t *)x->g;
        permute(sc, x->sg, nr, srb, hd), sc = (uint8_t *)x->sg;
    }
    uint8_t *o = x->out;
    for (size_t k = 0; k < nr; k++)
        for (size_t b = 0; b < nb; b++, o += bb)
            raw_block(e->type, codes + k * crb + b * (bb - 2), sc + k * srb + 2 * b, o);
    return STZ_OK;
}

/* The other kinds: rows as floats (dequantized, and with the scales for
 * K_REPACK), quantized to a block type as ggml does if asked, packed;
 * err2 / ref2 sum the requantization error. */
static stz_status value_rows(exporter *x, etensor *e, uint64_t row, size_t nr, size_t hd, const stz_qformat *fmt,
                             double *err2, double *ref2, stz_err *err)
{
    size_t cols = (size_t)e->cols, nb = cols / GGML_QK, rb = (size_t)stz_ggml_row_bytes(e->type, cols);
    float *v = x->f, *s = x->sc;
    stz_status st = STZ_OK;
    if (e->kind == K_ROPE) { /* llama.cpp divides the unscaled frequencies by these factors */
        stz_fwd_config plain = *x->c;
        plain.rope_scaling = STZ_ROPE_NONE;
        stz_fwd_rope_frequencies(&plain, x->g);
        stz_fwd_rope_frequencies(x->c, v);
        for (size_t i = 0; i < cols; i++)
            v[i] = x->g[i] / v[i];
    } else if ((st = stz_qmodel_read_rows_scales(e->m, e->i, row, nr, v, e->kind == K_REPACK ? s : NULL, err)))
        return st;
    if (e->heads) { /* 2-D: whole rows; 1-D: the elements */
        permute(v, x->g, e->ndim == 1 ? cols : nr, (e->ndim == 1 ? 1 : cols) * 4, hd), v = x->g;
        if (e->kind == K_REPACK)
            permute(s, x->sg, nr, nb * 4, hd), s = x->sg;
    }
    for (size_t k = 0; k < nr; k++) {
        float *w = v + k * cols;
        if (e->kind != K_REPACK && block_type(e->type)) {
            /* quantize as ggml does; the values the codes stand for replace w */
            size_t bad = 0;
            while (bad < cols && isfinite(w[bad]))
                bad++;
            if (bad < cols || stz_qf_quantize_row(fmt, w, cols, x->q, s + k * nb, NULL) < 0)
                return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s': row %llu %s", x->model, e->q->name,
                                   (unsigned long long)(row + k),
                                   bad < cols ? "holds NaN or Inf" : "has a scale too large for F16");
            float *y = x->g == v ? x->f : x->g; /* the buffer v is not */
            stz_qf_dequantize_row(fmt, x->q, s + k * nb, NULL, cols, y);
            for (size_t j = 0; j < cols; j++)
                *err2 += ((double)y[j] - w[j]) * ((double)y[j] - w[j]), *ref2 += (double)w[j] * w[j];
            memcpy(w, y, cols * 4);
        }
        long at = gguf_pack_row(e->type, w, s + k * nb, cols, x->out + k * rb);
        if (at >= 0)
            return stz_err_set(err, STZ_E_FORMAT,
                               "%s: tensor '%s': row %llu, element %ld is not code x F16 scale (%.9g, scale %.9g)",
                               x->model, e->q->name, (unsigned long long)(row + k), at, w[at], s[k * nb + at / 32]);
    }
    return STZ_OK;
}

/* From a container, K_COPY and K_RAW tensors (rows in their order) go
 * chunk by chunk: decoded on the worker threads, converted there and
 * written at their place in the output (stz_container_tensor_map). */
typedef struct {
    exporter *x;
    etensor *e;
    uint64_t at;         /* output offset of the tensor */
    uint8_t *scales;     /* K_RAW: the tensor's F16 scale bytes, all of them */
    uint8_t **buf;       /* per thread: one chunk's converted blocks */
    size_t cb, bb;       /* K_RAW: code bytes and block bytes per block */
} mapper;

static stz_status copy_chunk(void *user, int tid, uint64_t off, const uint8_t *raw, size_t n, stz_err *err)
{
    (void)tid, (void)err;
    memcpy((uint8_t *)user + off, raw, n);
    return STZ_OK;
}

static stz_status map_chunk(void *user, int tid, uint64_t off, const uint8_t *raw, size_t n, stz_err *err)
{
    mapper *mp = user;
    if (mp->e->kind == K_COPY)
        return stz_outfile_pwrite(&mp->x->of, raw, n, mp->at + off, err);
    if (off % mp->cb || n % mp->cb) /* whole blocks in every chunk of a valid container */
        return stz_err_set(err, STZ_E_FORMAT, "tensor '%s': a chunk of %zu bytes at %llu splits its blocks",
                           mp->e->q->name, n, (unsigned long long)off);
    uint64_t b0 = off / mp->cb;
    size_t nb = n / mp->cb;
    for (size_t b = 0; b < nb; b++)
        raw_block(mp->e->type, raw + b * mp->cb, mp->scales + 2 * (b0 + b), mp->buf[tid] + b * mp->bb);
    return stz_outfile_pwrite(&mp->x->of, mp->buf[tid], nb * mp->bb, mp->at + b0 * mp->bb, err);
}

static stz_status mapped_tensor(exporter *x, etensor *e, int *done, stz_err *err)
{
    size_t cb = e->type == STZ_GGML_Q8_0 ? 32 : 16, bb = cb + 2;
    *done = 0;
    if (e->heads || (e->kind != K_COPY && e->kind != K_RAW))
        return STZ_OK;
    struct stz_container *ct = stz_qmodel_container(e->m);
    if (!ct || (e->kind == K_RAW && stz_container_chunk_size(ct) % cb))
        return STZ_OK;
    int nt = x->p->threads < 1 ? 1 : x->p->threads;
    mapper mp = {x, e, x->of.pos, NULL, calloc((size_t)nt, sizeof(uint8_t *)), cb, bb};
    stz_status st = mp.buf ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory");
    if (!st && e->kind == K_RAW) {
        size_t ns = (size_t)(e->rows * (e->cols / GGML_QK) * 2);
        if (!(mp.scales = malloc(ns)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the scales of '%s'", e->q->name);
        else
            st = stz_container_tensor_map(ct, e->q->scales_name, nt, copy_chunk, mp.scales, err);
        for (int t = 0; !st && t < nt; t++)
            if (!(mp.buf[t] = malloc(stz_container_chunk_size(ct) / cb * bb)))
                st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    if (!st && !(st = stz_container_tensor_map(ct, e->q->name, nt, map_chunk, &mp, err)))
        x->of.pos += e->bytes, *done = 1;
    for (int t = 0; mp.buf && t < nt; t++)
        free(mp.buf[t]);
    free(mp.buf), free(mp.scales);
    return st;
}

/* Counts n output bytes done; STZ_E_INTERRUPTED if the progress callback asks. */
static stz_status advance(exporter *x, uint64_t n, stz_err *err)
{
    x->done += n;
    return x->p->progress && x->p->progress(x->p->progress_user, x->done, x->total)
               ? stz_err_set(err, STZ_E_INTERRUPTED, "interrupted")
               : STZ_OK;
}

static stz_status write_tensor(exporter *x, etensor *e, stz_err *err)
{
    int mapped = 0;
    stz_status st = mapped_tensor(x, e, &mapped, err);
    if (!st && mapped)
        st = advance(x, e->bytes, err);
    size_t cols = (size_t)e->cols, rb = (size_t)stz_ggml_row_bytes(e->type, cols);
    size_t hd = e->heads ? (size_t)(e->rows * (e->ndim == 1 ? e->cols : 1) / e->heads) : 1;
    size_t batch = (16u << 20) / (cols * 4) + 1; /* 16 MB of floats */
    if (e->heads && e->ndim == 2)
        batch = (batch + hd - 1) / hd * hd;
    batch = batch < e->rows ? batch : (size_t)e->rows;
    if (!st && !mapped)
        st = reserve(x, batch, cols, err);
    double err2 = 0, ref2 = 0;
    stz_qformat fmt;
    if (block_type(e->type))
        gguf_block_format(e->type, &fmt);
    for (uint64_t row = 0; !st && !mapped && row < e->rows; row += batch) {
        size_t nr = e->rows - row < batch ? (size_t)(e->rows - row) : batch;
        st = e->kind == K_RAW || e->kind == K_COPY ? raw_rows(x, e, row, nr, hd, err)
                                                   : value_rows(x, e, row, nr, hd, &fmt, &err2, &ref2, err);
        if (!st && !(st = stz_outfile_write(&x->of, x->out, nr * rb, err)))
            st = advance(x, nr * rb, err);
    }
    if (!st && e->kind == K_REQUANT) {
        double rel = ref2 > 0 ? sqrt(err2 / ref2) : 0;
        if (!x->stats->requantized++ || rel > x->stats->requant_max_err) {
            x->stats->requant_max_err = rel;
            snprintf(x->stats->requant_worst, sizeof x->stats->requant_worst, "%s", e->q->name);
        }
    }
    static const uint8_t zero[GGUF_ALIGN];
    if (!st && e->bytes % GGUF_ALIGN)
        st = stz_outfile_write(&x->of, zero, GGUF_ALIGN - e->bytes % GGUF_ALIGN, err);
    return st;
}

stz_status stz_gguf_export(const stz_gguf_params *p, stz_qmodel *const *files, size_t nfiles,
                           const stz_fwd_config *c, const char *config_json, const char *model_path,
                           const char *dir, const char *out, stz_gguf_stats *stats, stz_err *err)
{
    exporter x = {.p = p, .c = c, .model = model_path, .of = STZ_OUTFILE_INIT, .stats = stats};
    memset(stats, 0, sizeof *stats);
    cJSON *cfg = cJSON_Parse(config_json ? config_json : "{}");
    gbuf kv = {0}, head = {0};
    char tok[4096], name[256];
    stz_status st = STZ_OK;
    const char *mt = model_type(cfg);
    const char *arch = !strncmp(mt, "qwen2", 5) ? "qwen2" : "llama";
    snprintf(stats->arch, sizeof stats->arch, "%s", arch);
    /* Hugging Face names: the embedding's; llama.cpp's "llama" RoPE takes pairs */
    int hf = 0;
    for (size_t f = 0; f < nfiles; f++)
        hf |= stz_qmodel_find(files[f], roles[0].src[1]) >= 0;
    if ((st = plan(&x, files, nfiles, hf, hf && !strcmp(arch, "llama"), err)))
        goto done;
    if (p->tokenizer)
        snprintf(tok, sizeof tok, "%s", p->tokenizer);
    else if (snprintf(tok, sizeof tok, "%s/tokenizer.json", dir), access(tok, F_OK)) {
        st = stz_err_set(err, STZ_E_ARG, "%s: no tokenizer (no %s): give one with --tokenizer FILE (a "
                                         "tokenizer.json, or a llama2.c tokenizer .bin)", model_path, tok);
        goto done;
    }
    char *copy = strdup(model_path);
    if (!copy) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto done;
    }
    snprintf(name, sizeof name, "%s", p->name ? p->name : basename(copy));
    free(copy);
    if (!p->name && strchr(name + 1, '.'))
        *strchr(name + 1, '.') = 0;
    /* general.file_type: llama.cpp's LLAMA_FTYPE of the type most matrix elements have */
    static const int ftype[31] = {[STZ_GGML_F32] = 0, [STZ_GGML_F16] = 1, [STZ_GGML_Q4_0] = 2, [STZ_GGML_Q8_0] = 7,
                                  [STZ_GGML_Q5_0] = 8, [STZ_GGML_BF16] = 32};
    uint64_t elems[31] = {0};
    int quantized = 0, most = STZ_GGML_F32;
    for (size_t i = 0; i < x.n; i++) {
        quantized |= block_type(x.t[i].type);
        if (x.t[i].ndim == 2 && (elems[x.t[i].type] += x.t[i].rows * x.t[i].cols) > elems[most])
            most = x.t[i].type;
    }
    put_hparams(&kv, c, arch, name, quantized);
    kv_u32(&kv, "general.file_type", (uint32_t)ftype[most]);
    if ((st = gguf_vocab(&kv, tok, arch, config_json, c->vocab, err)))
        goto done;
    /* header: magic, version, counts, pairs, tensor infos, padding */
    gb_u32(&head, 0x46554747u);
    gb_u32(&head, 3);
    gb_u64(&head, x.n);
    gb_u64(&head, kv.count);
    gb_bytes(&head, kv.p, kv.n);
    uint64_t off = 0;
    for (size_t i = 0; i < x.n; i++) {
        etensor *e = &x.t[i];
        e->bytes = stz_ggml_row_bytes(e->type, e->ne[0]) * (e->ndim == 2 ? e->ne[1] : 1);
        e->offset = off;
        off += (e->bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
        gb_str(&head, e->name, strlen(e->name));
        gb_u32(&head, e->ndim);
        for (uint32_t d = 0; d < e->ndim; d++)
            gb_u64(&head, e->ne[d]);
        gb_u32(&head, (uint32_t)e->type);
        gb_u64(&head, e->offset);
        stats->tensors[e->type]++, stats->bytes[e->type] += e->bytes;
        stats->repacked += e->kind == K_REPACK || e->kind == K_RAW;
    }
    static const uint8_t zero[GGUF_ALIGN];
    gb_bytes(&head, zero, (GGUF_ALIGN - head.n % GGUF_ALIGN) % GGUF_ALIGN);
    if (kv.oom || head.oom) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto done;
    }
    x.total = off;
    stats->file_bytes = head.n + off;
    if ((st = stz_outfile_open(&x.of, out, (p->write_flags & STZ_WRITE_FORCE) != 0, err)) ||
        (st = stz_check_space(&x.of, stats->file_bytes, "the GGUF file", err)) ||
        (st = stz_outfile_write(&x.of, head.p, head.n, err)))
        goto done;
    for (size_t i = 0; i < x.n && !st; i++)
        st = write_tensor(&x, &x.t[i], err);
    if (!st)
        st = stz_outfile_commit(&x.of, err);
done:
    stz_outfile_abort(&x.of);
    free(x.f), free(x.g), free(x.sc), free(x.sg), free(x.q), free(x.out), free(x.t);
    free(kv.p), free(head.p);
    cJSON_Delete(cfg);
    return st;
}
