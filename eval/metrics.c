/* Error figures between a reference tensor and a candidate. */
#include "stz_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void stz_metrics_add(stz_metrics_acc *m, const float *a, const float *b, size_t n)
{
    double dot = 0, aa = 0, bb = 0, dd = 0, mx = m->max_abs;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i], d = x - y;
        dot += x * y, aa += x * x, bb += y * y, dd += d * d;
        if (fabs(d) > mx)
            mx = fabs(d);
    }
    m->dot += dot, m->aa += aa, m->bb += bb, m->dd += dd, m->max_abs = mx;
    m->n += n;
}

stz_metrics stz_metrics_finish(const stz_metrics_acc *m)
{
    stz_metrics r = {.max_abs = m->max_abs, .n = m->n};
    if (m->aa == 0 && m->bb == 0)
        r.cosine = 1;
    else if (m->aa == 0 || m->bb == 0)
        r.cosine = 0;
    else
        r.cosine = m->dot / (sqrt(m->aa) * sqrt(m->bb));
    r.rel_frobenius = m->dd == 0 ? 0 : m->aa == 0 ? INFINITY : sqrt(m->dd / m->aa);
    r.snr_db = m->dd == 0 ? INFINITY : m->aa == 0 ? -INFINITY : 10 * log10(m->aa / m->dd);
    return r;
}

stz_status stz_eval_tensor(stz_qmodel *ref, size_t ia, stz_qmodel *cand, size_t ib, stz_metrics *out, stz_err *err)
{
    const stz_qtensor *a = stz_qmodel_tensor(ref, ia), *b = stz_qmodel_tensor(cand, ib);
    int same = a->ndim == b->ndim && a->numel == b->numel;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (!same)
        return stz_err_set(err, STZ_E_SHAPE, "tensor '%s': shapes differ between the files", a->name);
    stz_metrics_acc acc;
    memset(&acc, 0, sizeof acc);
    uint64_t per = a->cols ? (1u << 20) / a->cols : 1;
    per = per ? per : 1;
    size_t cap = (size_t)(per * a->cols) + 1;
    float *x = malloc(cap * sizeof *x), *y = malloc(cap * sizeof *y);
    stz_status st = x && y ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory");
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
