/* stz_qmodel: any file, plain or quantized, or a container of one, read as
 * floats. docs/FORMAT.md, "Quantized SafeTensors", is the reference. */
#include "gguf_view.h"
#include "roles.h"
#include "stz_kernels.h"
#include "quant/quant_meta.h"
#include "stz_model.h"
#include "stz_pack.h"
#include "stz_svd.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- stz_qmodel --------------------------------------------------------- */

struct stz_qmodel {
    stz_reader *r;
    int owns_reader;
    stz_container *container; /* a container opened for r, owned */
    stz_gguf_view *view;      /* a GGUF file seen through r, owned */
    qinfo *qi;                /* per reader tensor */
    stz_qtensor *list;        /* listed tensors */
    size_t *idx;              /* reader index of each listed tensor */
    long *pos;                /* list index of each reader tensor, -1 if not listed */
    size_t n;
    uint8_t *scratch;
    size_t scratch_cap;
    float *held;   /* the transpose of one tensor stz_qmodel_transpose asked for */
    size_t held_i; /* its index, SIZE_MAX: none */
};

/* Lists the tensors of m->r. */
static stz_status qmodel_init(stz_qmodel *m, stz_err *err)
{
    char *skip = NULL;
    size_t maxcols;
    stz_status st;
    size_t nt = stz_reader_count(m->r);
    m->qi = calloc(nt + 1, sizeof *m->qi);
    m->list = calloc(nt + 1, sizeof *m->list);
    m->idx = calloc(nt + 1, sizeof *m->idx);
    m->pos = malloc((nt + 1) * sizeof *m->pos);
    skip = calloc(nt + 1, 1);
    if (!m->qi || !m->list || !m->idx || !m->pos || !skip) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor list");
        goto cleanup;
    }
    if ((st = stz_qi_scan(m->r, m->qi, skip, &maxcols, err)))
        goto cleanup;
    for (size_t i = 0; i < nt; i++)
        m->pos[i] = -1;
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(m->r, i);
        const qinfo *q = &m->qi[i];
        stz_qtensor *e = &m->list[m->n];
        if (skip[i] && !q->bits)
            continue;
        e->name = q->bits ? q->name : t->name;
        e->bits = q->bits, e->rank = q->svd ? q->rank : 0;
        e->method = q->bits ? q->method : NULL, e->block_size = q->svd ? 0 : q->block;
        e->scale_dtype = q->bits && !q->svd && !q->fmt.ggml ? q->scale_dtype : STZ_DTYPE_COUNT;
        e->scales_name = q->bits && !q->svd && q->sc ? q->sc->name : NULL;
        if (q->bits) {
            e->dtype = q->dtype, e->ndim = q->ndim, e->shape = q->shape, e->numel = q->numel;
            e->rows = q->rows, e->cols = q->cols, e->transposed = q->transposed ? STZ_TRANSPOSED_STORED : 0;
            const stz_tensor *own[7] = {t, q->sc, q->Us, q->S, q->Vh, q->Vs, q->mn};
            for (int j = 0; j < 7; j++)
                e->stored_bytes += own[j] ? own[j]->end - own[j]->begin : 0;
        } else {
            e->dtype = t->dtype, e->ndim = t->ndim, e->shape = t->shape, e->numel = t->numel;
            e->cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->numel;
            e->rows = e->cols ? t->numel / e->cols : 0;
            e->stored_bytes = t->end - t->begin;
        }
        if (m->view) /* a GGUF file: what is stored is its blocks */
            e->gguf_type = stz_gguf_view_type(m->view, i, &e->stored_bytes);
        m->pos[i] = (long)m->n;
        m->idx[m->n++] = i;
    }
cleanup:
    free(skip);
    return st;
}

/* gguf: open as a GGUF file (else as one when the file is). */
static stz_status qmodel_open(stz_qmodel **out, const char *path, int gguf, stz_names names, stz_err *err);

stz_status stz_qmodel_open(stz_qmodel **out, const char *path, stz_err *err)
{
    return stz_err_in(err, qmodel_open(out, path, 0, STZ_NAMES_HF, err), path);
}

stz_status stz_qmodel_open_gguf(stz_qmodel **out, const char *path, stz_names names, stz_err *err)
{
    return stz_err_in(err, qmodel_open(out, path, 1, names, err), path);
}

static stz_status qmodel_open(stz_qmodel **out, const char *path, int gguf, stz_names names, stz_err *err)
{
    *out = NULL;
    stz_qmodel *m = calloc(1, sizeof *m);
    if (!m)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the model");
    m->held_i = SIZE_MAX;
    stz_status st;
    if (stz_is_container(path)) { /* its data decoded where it is read */
        size_t len;
        int packed_gguf = 0;
        if (!(st = stz_container_open(&m->container, path, err)))
            stz_container_original_header(m->container, &len, &packed_gguf);
        if (packed_gguf) /* its tensors are the GGUF's bytes, not values */
            st = stz_err_set(err, STZ_E_UNSUPPORTED,
                             "%s: holds a GGUF file: 'stz unpack' it and give the .gguf, or "
                             "'stz decompress --dequantize' it to floats",
                             path);
        else if (!st)
            m->r = (stz_reader *)stz_container_data_reader(m->container);
    } else if (gguf || stz_is_gguf(path)) { /* the same */
        if (!(st = stz_gguf_view_open(&m->view, path, names, STZ_DTYPE_F32, err)))
            m->r = (stz_reader *)stz_gguf_view_reader(m->view);
    } else
        m->owns_reader = 1, st = stz_reader_open(&m->r, path, err);
    if (st || (st = qmodel_init(m, err))) {
        stz_qmodel_free(m);
        return st;
    }
    *out = m;
    return STZ_OK;
}

stz_status stz_qmodel_open_reader(stz_qmodel **out, const stz_reader *r, stz_err *err)
{
    *out = NULL;
    stz_qmodel *m = calloc(1, sizeof *m);
    if (!m)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the model");
    m->r = (stz_reader *)r; /* not freed: owns_reader is 0 */
    m->held_i = SIZE_MAX;
    stz_status st = qmodel_init(m, err);
    if (st) {
        stz_qmodel_free(m);
        return st;
    }
    *out = m;
    return STZ_OK;
}

void stz_qmodel_free(stz_qmodel *m)
{
    if (!m)
        return;
    for (size_t i = 0; m->qi && m->r && i < stz_reader_count(m->r); i++)
        stz_qi_free(&m->qi[i]);
    if (m->owns_reader)
        stz_reader_free(m->r);
    stz_container_free(m->container);
    stz_gguf_view_free(m->view);
    free(m->qi);
    free(m->list);
    free(m->idx);
    free(m->pos);
    free(m->scratch);
    free(m->held);
    free(m);
}

size_t stz_qmodel_count(const stz_qmodel *m) { return m->n; }
stz_container *stz_qmodel_container(const stz_qmodel *m) { return m->container; }

void stz_qmodel_set_threads(stz_qmodel *m, int threads)
{
    if (m->container)
        stz_container_set_threads(m->container, threads);
}
const stz_qtensor *stz_qmodel_tensor(const stz_qmodel *m, size_t i) { return i < m->n ? &m->list[i] : NULL; }
const stz_reader *stz_qmodel_reader(const stz_qmodel *m) { return m->r; }

static long find_exact(const stz_qmodel *m, const char *name);

long stz_qmodel_find(const stz_qmodel *m, const char *name)
{
    long i = find_exact(m, name);
    char other[512];
    for (size_t k = 0; i < 0; k++) { /* the other names checkpoints store it under (roles.c) */
        int r = stz_role_alias(name, k, other, sizeof other);
        if (r < 0)
            break;
        if (r)
            i = find_exact(m, other);
    }
    return i;
}

static long find_exact(const stz_qmodel *m, const char *name)
{
    /* a tensor of the file under that name (plain, or the values of an
     * INT8/INT4 entry): O(log n); SVD entries have no such tensor: scan */
    long ri = stz_reader_find(m->r, name);
    if (ri >= 0 && m->pos[ri] >= 0 && !strcmp(m->list[m->pos[ri]].name, name))
        return m->pos[ri];
    for (size_t i = 0; i < m->n; i++)
        if (m->list[i].bits && !strcmp(m->list[i].name, name))
            return (long)i;
    return -1;
}

stz_status stz_qmodel_read_rows(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst, stz_err *err)
{
    return stz_qmodel_read_rows_scales(m, i, row, nrows, dst, NULL, err);
}

/* Floats one read holds at most (8 MiB); a longer one is read in pieces,
 * stopping between them when interrupted (a whole embedding is seconds). */
#define READ_PIECE ((size_t)1 << 21)

static stz_status read_piece(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, size_t cols, float *dst,
                             float *scales, stz_err *err);

/* Whether tensor i is read from its transpose held in memory (asked for,
 * not stored so). */
static int held(const stz_qmodel *m, size_t i) { return m->list[i].transposed == STZ_TRANSPOSED_HELD; }

/* Rows [row, row + nrows) of tensor i as stored, rows of `cols` floats, in pieces. */
static stz_status read_stored(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, size_t cols, float *dst,
                              float *scales, stz_err *err)
{
    size_t per = cols && READ_PIECE / cols ? READ_PIECE / cols : 1,
           nb = m->list[i].bits ? (size_t)m->qi[m->idx[i]].nblocks : 0;
    stz_status st = STZ_OK;
    for (size_t r = 0; !st && r < nrows; r += per) {
        if (r && stz_interrupt_pending())
            return stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        st = read_piece(m, i, row + r, nrows - r < per ? nrows - r : per, cols, dst + r * cols,
                        scales ? scales + r * nb : NULL, err);
    }
    return st;
}

/* Tensor i read whole and held transposed (the last one asked for). */
static stz_status hold(stz_qmodel *m, size_t i, stz_err *err)
{
    const stz_qtensor *e = &m->list[i];
    size_t R = (size_t)e->cols, C = (size_t)e->rows; /* as stored */
    float *x = malloc(e->numel * sizeof *x + 1), *t = realloc(m->held, e->numel * sizeof *t + 1);
    if (t)
        m->held = t, m->held_i = SIZE_MAX;
    stz_status st = !x || !t ? stz_err_set(err, STZ_E_NOMEM, "%s: out of memory transposing tensor '%s'",
                                           stz_reader_path(m->r), e->name)
                             : read_stored(m, i, 0, R, C, x, NULL, err);
    if (!st)
        stz_transpose(t, x, R, C), m->held_i = i;
    free(x);
    return st;
}

stz_status stz_qmodel_transpose(stz_qmodel *m, size_t i, stz_err *err)
{
    stz_qtensor *e = &m->list[i];
    if (e->transposed)
        return STZ_OK;
    if (e->ndim != 2)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s' is not a matrix: it cannot be read transposed",
                           stz_reader_path(m->r), e->name);
    uint64_t r = e->rows;
    e->rows = e->cols, e->cols = r, e->transposed = STZ_TRANSPOSED_HELD;
    return STZ_OK;
}

stz_status stz_qmodel_read_rows_scales(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst, float *scales,
                                       stz_err *err)
{
    const stz_qtensor *e = &m->list[i];
    if (row > e->rows || nrows > e->rows - row)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: tensor '%s': rows %llu+%zu out of %llu", stz_reader_path(m->r),
                           e->name, (unsigned long long)row, nrows, (unsigned long long)e->rows);
    if (!held(m, i))
        return read_stored(m, i, row, nrows, (size_t)e->cols, dst, scales, err);
    if (scales)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s' is read transposed: its scales are not rows",
                           stz_reader_path(m->r), e->name);
    stz_status st = m->held_i == i ? STZ_OK : hold(m, i, err);
    if (!st)
        memcpy(dst, m->held + row * e->cols, nrows * (size_t)e->cols * sizeof *dst);
    return st;
}

static stz_status read_piece(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, size_t cols, float *dst,
                             float *scales, stz_err *err)
{
    const stz_qtensor *e = &m->list[i];
    const stz_tensor *t = stz_reader_tensor(m->r, m->idx[i]);
    size_t n = nrows * cols, need = n * 13 + 64; /* values, scale bytes, scale and minimum floats */
    if (need > m->scratch_cap) {
        uint8_t *b = realloc(m->scratch, need);
        if (!b)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the rows read");
        m->scratch = b, m->scratch_cap = need;
    }
    if (!e->bits) {
        size_t esz = stz_dtype_bits(t->dtype) / 8;
        stz_status st = stz_reader_read(m->r, t, row * cols * esz, m->scratch, n * esz, err);
        stz_err sub;
        if (!st && (st = stz_to_f32(t->dtype, m->scratch, n, dst, &sub)))
            stz_err_set(err, st, "%s: tensor '%s': %s", stz_reader_path(m->r), e->name, sub.msg);
        return st;
    }
    /* raw values, then scale bytes, then scale floats in the scratch */
    qinfo *q = &m->qi[m->idx[i]];
    size_t nsc = nrows * (size_t)q->nblocks;
    uint8_t *raw = m->scratch, *sb = raw + n + 8;
    float *sc = (float *)(void *)(m->scratch + ((n + 8 + nsc * 4 + 15) & ~(size_t)15));
    if (((n + 8 + nsc * 4 + 15) & ~(size_t)15) + nsc * 8 > m->scratch_cap)
        return stz_err_set(err, STZ_E_BOUNDS, "internal: scratch too small"); /* cannot happen: nsc <= n */
    stz_status st = stz_qi_rows(m->r, q, row, nrows, raw, sb, sc, dst, err);
    if (!st && scales && !q->svd)
        memcpy(scales, sc, nsc * sizeof *sc);
    return st;
}

stz_status stz_qmodel_read_codes(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, uint8_t *codes, uint8_t *scales,
                                 stz_err *err)
{
    const stz_qtensor *e = &m->list[i];
    const qinfo *q = &m->qi[m->idx[i]];
    if (!e->bits || q->svd || !q->sc || held(m, i))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s' has no stored codes and scales%s",
                           stz_reader_path(m->r), e->name, held(m, i) ? " in the order it is read (transposed)" : "");
    if (row > e->rows || nrows > e->rows - row)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: tensor '%s': rows %llu+%zu out of %llu", stz_reader_path(m->r),
                           e->name, (unsigned long long)row, nrows, (unsigned long long)e->rows);
    size_t rb = stz_qf_row_bytes(q->bits, q->cols), sb = (size_t)q->nblocks * (stz_dtype_bits(q->scale_dtype) / 8);
    stz_status st = stz_reader_read(m->r, q->t, row * rb, codes, nrows * rb, err);
    return st ? st : stz_reader_read(m->r, q->sc, row * sb, scales, nrows * sb, err);
}

int stz_qtensor_quantized(const stz_qtensor *t)
{
    return t->bits ||
           (t->gguf_type && strcmp(t->gguf_type, "f32") && strcmp(t->gguf_type, "f16") && strcmp(t->gguf_type, "bf16"));
}

const char *stz_qtensor_action(const stz_qtensor *t, const char *kept)
{
    static const char *const names[9] = {NULL, "int1", "int2", "int3", "int4", "int5", "int6", "int7", "int8"};
    if (t->gguf_type)
        return stz_qtensor_quantized(t) ? t->gguf_type : kept;
    return t->rank ? "svd" : t->bits > 0 && t->bits <= 8 ? names[t->bits] : kept;
}
