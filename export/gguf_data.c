/* GGUF export, the data: each tensor's rows converted, reordered for
 * llama.cpp's RoPE, requantized or repacked, or copied as stored. */
#include "gguf_export.h"
#include "stz_kernels.h"
#include "pack/pack_sink.h"
#include "quant/quant_tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

static stz_status reserve(exporter *x, size_t rows, size_t cols, stz_err *err)
{
    if (rows <= x->cap_rows && cols <= x->cap_cols)
        return STZ_OK;
    rows = rows > x->cap_rows ? rows : x->cap_rows, cols = cols > x->cap_cols ? cols : x->cap_cols;
    size_t n = rows * cols, nb = rows * (cols / STZ_GGML_QK + 1);
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
                memcpy((char *)dst + (h * hd + 2 * j + t) * width,
                       (const char *)src + (h * hd + t * hd / 2 + j) * width, width);
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
    size_t cols = (size_t)e->cols, nb = cols / STZ_GGML_QK, srb = nb * 2;
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

/* Rows of `from` values widened in place to `to`, zeros after them (a
 * widened FFN's down projection). */
static void widen(float *v, size_t nr, size_t from, size_t to)
{
    for (size_t k = nr; from < to && k-- > 0;) {
        memmove(v + k * to, v + k * from, from * sizeof *v);
        memset(v + k * to + from, 0, (to - from) * sizeof *v);
    }
}

/* The other kinds: rows as floats (dequantized, and with the scales for
 * K_REPACK), quantized to a block type as ggml does if asked, packed;
 * err2 / ref2 sum the requantization error. */

static stz_status value_rows(exporter *x, etensor *e, uint64_t row, size_t nr, size_t hd, double *err2, double *ref2,
                             stz_err *err)
{
    size_t cols = (size_t)e->ne[0], nb = cols / STZ_GGML_QK, rb = (size_t)stz_ggml_row_bytes(e->type, cols);
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
    for (size_t i = 0; e->add && i < nr * (size_t)e->cols; i++)
        v[i] += e->add;
    if (e->ndim == 2)
        widen(v, nr, (size_t)e->cols, cols);
    if (e->heads) { /* 2-D: whole rows; 1-D: the elements */
        permute(v, x->g, e->ndim == 1 ? cols : nr, (e->ndim == 1 ? 1 : cols) * 4, hd), v = x->g;
        if (e->kind == K_REPACK)
            permute(s, x->sg, nr, nb * 4, hd), s = x->sg;
    }
    for (size_t k = 0; k < nr; k++) {
        float *w = v + k * cols;
        uint8_t *o = x->out + k * rb;
        if (e->kind != K_REPACK && block_type(e->type)) { /* quantized by stz's search for the type */
            size_t bad = stz_quant_first_nonfinite(w, cols);
            if (bad < cols || stz_ggml_quantize_row(e->type, w, NULL, cols, o) < 0)
                return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s': row %llu %s", x->model, e->q->name,
                                   (unsigned long long)(row + k),
                                   bad < cols ? "holds NaN or Inf" : "has a scale too large for F16");
            float *y = x->g == v ? x->f : x->g; /* the buffer v is not */
            stz_ggml_dequantize_row(e->type, o, cols, y);
            for (size_t j = 0; j < cols; j++)
                *err2 += ((double)y[j] - w[j]) * ((double)y[j] - w[j]), *ref2 += (double)w[j] * w[j];
            continue;
        }
        for (size_t j = 0; e->type == STZ_GGML_F16 && j < cols; j++)
            if (isfinite(w[j]) && isinf(stz_f16_to_f32(stz_f32_to_f16(w[j]))))
                return stz_err_set(err, STZ_E_NUMERIC,
                                   "%s: tensor '%s': row %llu, element %zu is %.9g, past F16's largest value 65504 "
                                   "(export with --type f32 or bf16)",
                                   x->model, e->q->name, (unsigned long long)(row + k), j, w[j]);
        long at = stz_ggml_traits_of(e->type)->pack(w, s + k * nb, cols, o);
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
    uint64_t at;     /* output offset of the tensor */
    uint8_t *scales; /* K_RAW: the tensor's F16 scale bytes, all of them */
    uint8_t **buf;   /* per thread: one chunk's converted blocks */
    size_t cb, bb;   /* K_RAW: code bytes and block bytes per block */
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
    stz_status st = mp.buf ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the threads' chunk buffers");
    if (!st && e->kind == K_RAW) {
        size_t ns = (size_t)(e->rows * (e->cols / STZ_GGML_QK) * 2);
        if (!(mp.scales = malloc(ns)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the scales of '%s'", e->q->name);
        else
            st = stz_container_tensor_map(ct, e->q->scales_name, nt, copy_chunk, mp.scales, err);
        for (int t = 0; !st && t < nt; t++)
            if (!(mp.buf[t] = malloc(stz_container_chunk_size(ct) / cb * bb)))
                st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a chunk buffer");
    }
    if (!st && !(st = stz_container_tensor_map(ct, e->q->name, nt, map_chunk, &mp, err)))
        x->of.pos += e->rows * stz_ggml_row_bytes(e->type, e->ne[0]), *done = 1;
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

stz_status stz_gguf_write_tensor(exporter *x, etensor *e, stz_err *err)
{
    int mapped = 0;
    size_t cols = (size_t)e->ne[0], rb = (size_t)stz_ggml_row_bytes(e->type, cols);
    uint64_t pad_rows = e->ndim == 2 ? e->ne[1] - e->rows : 0; /* a widened FFN's zero units */
    stz_status st = mapped_tensor(x, e, &mapped, err);
    if (!st && mapped)
        st = advance(x, e->rows * rb, err);
    size_t hd = e->heads ? (size_t)(e->rows * (e->ndim == 1 ? e->cols : 1) / e->heads) : 1;
    size_t batch = (16u << 20) / (cols * 4) + 1; /* 16 MB of floats */
    if (e->heads && e->ndim == 2)
        batch = (batch + hd - 1) / hd * hd;
    batch = batch < e->rows ? batch : (size_t)e->rows;
    if (!st && (!mapped || pad_rows))
        st = reserve(x, batch, cols, err);
    double err2 = 0, ref2 = 0;
    for (uint64_t row = 0; !st && !mapped && row < e->rows; row += batch) {
        size_t nr = e->rows - row < batch ? (size_t)(e->rows - row) : batch;
        st = e->kind == K_RAW || e->kind == K_COPY ? raw_rows(x, e, row, nr, hd, err)
                                                   : value_rows(x, e, row, nr, hd, &err2, &ref2, err);
        if (!st && !(st = stz_outfile_write(&x->of, x->out, nr * rb, err)))
            st = advance(x, nr * rb, err);
    }
    if (!st && pad_rows)
        memset(x->out, 0, rb); /* zero blocks decode to 0 in every type */
    for (uint64_t k = 0; !st && k < pad_rows; k++)
        if (!(st = stz_outfile_write(&x->of, x->out, rb, err)))
            st = advance(x, rb, err);
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
