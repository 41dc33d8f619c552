/* stz_dequantize_file: a quantized SafeTensors file (docs/FORMAT.md) back to
 * a plain model, tensor by tensor. */
#include "quant/quant_meta.h"
#include "stz_pipeline.h"

#include <stdlib.h>
#include <string.h>

static stz_status write_dequantized(stz_writer *w, const stz_reader *r, qinfo *qi, stz_dtype odt, uint8_t *in,
                                    float *f, float *sc, uint8_t *out, stz_err *err)
{
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
                               stz_err *err);

stz_status stz_dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                               stz_err *err)
{
    return stz_err_in(err, dequantize_file(p, in, out, dtype, err), in);
}

static stz_status dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                               stz_err *err)
{
    stz_reader *r = NULL;
    stz_writer *w = NULL;
    qinfo *qi = NULL;
    char *skip = NULL; /* 1 for companion scales tensors */
    uint8_t *buf = NULL, *obuf = NULL;
    float *f = NULL, *sc = NULL;
    size_t maxcols = 0;
    stz_status st;
    if (dtype != STZ_DTYPE_COUNT && dtype != STZ_DTYPE_BF16 && dtype != STZ_DTYPE_F16 && dtype != STZ_DTYPE_F32)
        return stz_err_set(err, STZ_E_ARG, "dequantize: output dtype must be BF16, F16 or F32");
    if ((st = stz_reader_open(&r, in, err)))
        return st;
    size_t nt = stz_reader_count(r);
    qi = calloc(nt + 1, sizeof *qi);
    skip = calloc(nt + 1, 1);
    if (!qi || !skip) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the quantization entries");
        goto cleanup;
    }
    if ((st = stz_refuse_input_as_output(in, out, err)))
        goto cleanup;
    if ((st = stz_qi_scan(r, qi, skip, &maxcols, err)))
        goto cleanup;
    size_t elems = STZ_QUANT_BATCH_BYTES / 8 > maxcols ? STZ_QUANT_BATCH_BYTES / 8 : maxcols;
    buf = malloc(elems * 8 > STZ_QUANT_BATCH_BYTES ? elems * 8 : STZ_QUANT_BATCH_BYTES);
    obuf = malloc(elems * 8 > STZ_QUANT_BATCH_BYTES ? elems * 8 : STZ_QUANT_BATCH_BYTES);
    f = malloc(elems * sizeof *f);
    sc = malloc(2 * elems * sizeof *sc); /* scales, then minimums (asym) */
    if (!buf || !obuf || !f || !sc) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the row buffers");
        goto cleanup;
    }
    if ((st = stz_writer_open(&w, out, p->write_flags, err)))
        goto cleanup;
    for (size_t i = 0; i < stz_reader_meta_count(r); i++) {
        const char *k = stz_reader_meta_key(r, i);
        if (strncmp(k, STZ_QUANT_META_PREFIX, strlen(STZ_QUANT_META_PREFIX)) && strcmp(k, "format") &&
            (st = stz_writer_set_meta(w, k, stz_reader_meta_value(r, i), err)))
            goto cleanup;
    }
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        if (skip[i] && !qi[i].bits)
            continue;
        st = qi[i].bits ? stz_writer_add(w, qi[i].name, dtype == STZ_DTYPE_COUNT ? qi[i].dtype : dtype, qi[i].ndim,
                                         qi[i].shape, err)
                        : stz_writer_add(w, t->name, t->dtype, t->ndim, t->shape, err);
        if (st)
            goto cleanup;
    }
    uint64_t done = 0, total = stz_reader_file_size(r);
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        if (skip[i] && !qi[i].bits)
            continue;
        if (qi[i].bits) {
            if ((st = write_dequantized(w, r, &qi[i], dtype == STZ_DTYPE_COUNT ? qi[i].dtype : dtype, buf, f, sc,
                                        obuf, err)))
                goto cleanup;
        } else if ((st = stz_quant_copy_tensor(w, r, t, buf, err))) {
            goto cleanup;
        }
        done += t->end - t->begin;
        if (p->progress && p->progress(p->progress_user, done, total)) {
            st = stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", out);
            goto cleanup;
        }
    }
    st = stz_writer_finish(w, err);
cleanup:
    stz_writer_free(w);
    for (size_t i = 0; qi && i < nt; i++)
        stz_qi_free(&qi[i]);
    free(qi);
    free(skip);
    free(buf);
    free(obuf);
    free(f);
    free(sc);
    stz_reader_free(r);
    return st;
}

