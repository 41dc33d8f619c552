/* stz_dequantize_file: a quantized SafeTensors file (docs/FORMAT.md), or a
 * GGUF file, back to a plain model, tensor by tensor. */
#include "model/gguf_view.h"
#include "quant/quant_meta.h"
#include "stz_pipeline.h"

#include <stdlib.h>
#include <string.h>

/* A matrix stored transposed (GPT-2's Conv1D, FORMAT.md): the rows of the
 * transpose decoded in batches, the whole written in the original's order. */
static stz_status write_transposed(stz_writer *w, const stz_reader *r, qinfo *qi, stz_dtype odt, uint8_t *in, float *f,
                                   float *sc, uint8_t *out, stz_err *err)
{
    size_t R = (size_t)qi->rows, C = (size_t)qi->cols, osz = stz_dtype_bits(odt) / 8;
    size_t per = (STZ_QUANT_BATCH_BYTES / 8) / C ? (STZ_QUANT_BATCH_BYTES / 8) / C : 1;
    float *t = malloc(R * C * sizeof *t + 1);
    uint8_t *o = malloc(R * C * osz + 1);
    stz_status st = t && o ? STZ_OK
                           : stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for tensor '%s' (%zu x %zu)",
                                         stz_reader_path(r), qi->name, C, R);
    for (size_t row = 0; !st && row < R; row += per) {
        size_t nr = R - row < per ? R - row : per;
        if (!(st = stz_qi_rows(r, qi, row, nr, in, out, sc, f, err)))
            for (size_t k = 0; k < nr; k++)
                for (size_t c = 0; c < C; c++)
                    t[c * R + row + k] = f[k * C + c];
    }
    if (!st && !(st = stz_from_f32(odt, t, R * C, o, err)))
        st = stz_writer_write(w, o, R * C * osz, err);
    free(t), free(o);
    return st;
}

static stz_status write_dequantized(stz_writer *w, const stz_reader *r, qinfo *qi, stz_dtype odt, uint8_t *in, float *f,
                                    float *sc, uint8_t *out, stz_err *err)
{
    if (qi->transposed)
        return write_transposed(w, r, qi, odt, in, f, sc, out, err);
    size_t osz = stz_dtype_bits(odt) / 8;
    uint64_t per = (STZ_QUANT_BATCH_BYTES / 8) / qi->cols;
    if (per == 0)
        per = 1;
    for (uint64_t row = 0; row < qi->rows; row += per) {
        size_t nr = qi->rows - row < per ? (size_t)(qi->rows - row) : (size_t)per;
        stz_status st = stz_qi_rows(r, qi, row, nr, in, out, sc, f, err);
        if (st || (st = stz_from_f32(odt, f, nr * qi->cols, out, err)) ||
            (st = stz_writer_write(w, out, nr * qi->cols * osz, err)))
            return st;
    }
    return STZ_OK;
}

static stz_status dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                                  stz_names names, stz_err *err);

stz_status stz_dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                               stz_err *err)
{
    return stz_err_in(err, dequantize_file(p, in, out, dtype, STZ_NAMES_HF, err), in);
}

stz_status stz_dequantize_gguf(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                               stz_names names, stz_err *err)
{
    return stz_err_in(err, dequantize_file(p, in, out, dtype, names, err), in);
}

/* One run of stz_dequantize_file. */
typedef struct {
    stz_reader *r;
    size_t nt;
    qinfo *qi;  /* per tensor: its quantization entry (bits 0: stored as is) */
    char *skip; /* 1 for companion scales tensors */
    stz_dtype dtype;
    uint8_t *buf, *obuf;
    float *f, *sc;
} dqfile;

/* The dtype a tensor is written in. */
static stz_dtype out_dtype(const dqfile *j, size_t i)
{
    return j->dtype == STZ_DTYPE_COUNT ? j->qi[i].dtype : j->dtype;
}

/* The header: the original metadata (not stz's), every tensor under its
 * original name and shape. */
static stz_status declare_plain(const dqfile *j, stz_writer *w, stz_err *err)
{
    stz_status st = STZ_OK;
    for (size_t i = 0; !st && i < stz_reader_meta_count(j->r); i++) {
        const char *k = stz_reader_meta_key(j->r, i);
        if (strncmp(k, STZ_QUANT_META_PREFIX, strlen(STZ_QUANT_META_PREFIX)) && strcmp(k, "format"))
            st = stz_writer_set_meta(w, k, stz_reader_meta_value(j->r, i), err);
    }
    for (size_t i = 0; !st && i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        const qinfo *q = &j->qi[i];
        if (j->skip[i] && !q->bits)
            continue;
        st = q->bits ? stz_writer_add(w, q->name, out_dtype(j, i), q->ndim, q->shape, err)
                     : stz_writer_add(w, t->name, t->dtype, t->ndim, t->shape, err);
    }
    return st;
}

/* Every tensor in file order, dequantized or copied. */
static stz_status stream_plain(dqfile *j, stz_writer *w, const stz_quant_params *p, const char *out, stz_err *err)
{
    uint64_t done = 0, total = stz_reader_file_size(j->r);
    for (size_t i = 0; i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        if (j->skip[i] && !j->qi[i].bits)
            continue;
        stz_status st = j->qi[i].bits
                            ? write_dequantized(w, j->r, &j->qi[i], out_dtype(j, i), j->buf, j->f, j->sc, j->obuf, err)
                            : stz_quant_copy_tensor(w, j->r, t, j->buf, err);
        if (st)
            return st;
        done += t->end - t->begin;
        if (p->progress && p->progress(p->progress_user, done, total))
            return stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", out);
    }
    return stz_writer_finish(w, err);
}

/* A GGUF file's view, decoded to dtype (F32 when not given). */
static stz_status open_input(const char *in, stz_names names, stz_dtype dtype, stz_gguf_view **view, stz_reader **r,
                             stz_err *err)
{
    if (!stz_is_gguf(in))
        return stz_reader_open(r, in, err);
    stz_status st = stz_gguf_view_open(view, in, names, dtype == STZ_DTYPE_COUNT ? STZ_DTYPE_F32 : dtype, err);
    if (!st)
        *r = (stz_reader *)stz_gguf_view_reader(*view);
    return st;
}

static stz_status dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                                  stz_names names, stz_err *err)
{
    dqfile j = {.dtype = dtype};
    stz_gguf_view *view = NULL;
    stz_writer *w = NULL;
    size_t maxcols = 0;
    stz_status st;
    if (dtype != STZ_DTYPE_COUNT && dtype != STZ_DTYPE_BF16 && dtype != STZ_DTYPE_F16 && dtype != STZ_DTYPE_F32)
        return stz_err_set(err, STZ_E_ARG, "dequantize: output dtype must be BF16, F16 or F32");
    if ((st = open_input(in, names, dtype, &view, &j.r, err)))
        return st;
    j.nt = stz_reader_count(j.r);
    j.qi = calloc(j.nt + 1, sizeof *j.qi);
    j.skip = calloc(j.nt + 1, 1);
    if (!j.qi || !j.skip) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the quantization entries");
        goto cleanup;
    }
    STZ_TRY(st, stz_refuse_input_as_output(in, out, err));
    STZ_TRY(st, stz_qi_scan(j.r, j.qi, j.skip, &maxcols, err));
    size_t elems = STZ_QUANT_BATCH_BYTES / 8 > maxcols ? STZ_QUANT_BATCH_BYTES / 8 : maxcols;
    j.buf = malloc(elems * 8 > STZ_QUANT_BATCH_BYTES ? elems * 8 : STZ_QUANT_BATCH_BYTES);
    j.obuf = malloc(elems * 8 > STZ_QUANT_BATCH_BYTES ? elems * 8 : STZ_QUANT_BATCH_BYTES);
    j.f = malloc(elems * sizeof *j.f);
    j.sc = malloc(2 * elems * sizeof *j.sc); /* scales, then minimums (asym) */
    if (!j.buf || !j.obuf || !j.f || !j.sc) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the row buffers");
        goto cleanup;
    }
    STZ_TRY(st, stz_writer_open(&w, out, p->write_flags, err));
    STZ_TRY(st, declare_plain(&j, w, err));
    st = stream_plain(&j, w, p, out, err);
cleanup:
    stz_writer_free(w);
    for (size_t i = 0; j.qi && i < j.nt; i++)
        stz_qi_free(&j.qi[i]);
    free(j.qi), free(j.skip), free(j.buf), free(j.obuf), free(j.f), free(j.sc);
    if (view)
        stz_gguf_view_free(view);
    else
        stz_reader_free(j.r);
    return st;
}
