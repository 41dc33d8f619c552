/* Error figures between a reference tensor and a candidate, read from
 * their files (the accumulators are metrics_acc.c). */
#include "stz_eval.h"

#include <stdlib.h>
#include <string.h>

stz_status stz_eval_tensor(stz_qmodel *ref, size_t ia, stz_qmodel *cand, size_t ib, stz_metrics *out, stz_err *err)
{
    const stz_qtensor *a = stz_qmodel_tensor(ref, ia), *b = stz_qmodel_tensor(cand, ib);
    int same = a->ndim == b->ndim && a->numel == b->numel;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (!same)
        return stz_err_set(err, STZ_E_SHAPE, "tensor '%s': shapes differ between the files", a->name);
    stz_status st = STZ_OK; /* one stored transposed (GPT-2's Conv1D quantized): both read so */
    if (!a->transposed != !b->transposed &&
        (st = a->transposed ? stz_qmodel_transpose(cand, ib, err) : stz_qmodel_transpose(ref, ia, err)))
        return st;
    stz_metrics_acc acc;
    memset(&acc, 0, sizeof acc);
    if (!a->numel) { /* nothing to read; its other dimensions may be huge */
        *out = stz_metrics_finish(&acc);
        return STZ_OK;
    }
    uint64_t per = a->cols ? (1u << 20) / a->cols : 1;
    per = per ? per : 1;
    size_t cap = (size_t)(per * a->cols) + 1;
    float *x = malloc(cap * sizeof *x), *y = malloc(cap * sizeof *y);
    st = x && y ? STZ_OK
                : stz_err_set(err, STZ_E_NOMEM, "tensor '%s': out of memory for rows of %llu elements", a->name,
                              (unsigned long long)a->cols);
    for (uint64_t row = 0; !st && row < a->rows; row += per) {
        size_t nr = a->rows - row < per ? (size_t)(a->rows - row) : (size_t)per;
        if (!(st = stz_qmodel_read_rows(ref, ia, row, nr, x, err)) &&
            !(st = stz_qmodel_read_rows(cand, ib, row, nr, y, err)))
            stz_metrics_add(&acc, x, y, nr * (size_t)a->cols);
    }
    free(x);
    free(y);
    if (!st)
        *out = stz_metrics_finish(&acc);
    return st;
}
