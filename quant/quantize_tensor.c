/* stz_quantize_tensor: a decision's whole tensor quantized in memory, by
 * its kind: SVD factors, a trellis (feedback.c's sweep without feedback)
 * or blocks, each row on its own; quant_tensor.c holds the steps they
 * share, so that neither it nor feedback.c calls back into this file. */
#include "quant_tensor.h"
#include "stz_kernels.h"

#include <stdlib.h>
#include <string.h>

stz_status stz_quantize_tensor(const stz_decision *d, const float *x, const float *weights, uint64_t rows,
                               uint64_t cols, stz_qmem *out, stz_err *err)
{
    return stz_quantize_tensor_y(d, x, weights, rows, cols, out, NULL, err);
}

stz_status stz_quantize_tensor_y(const stz_decision *d, const float *x, const float *weights, uint64_t rows,
                                 uint64_t cols, stz_qmem *out, float *y, stz_err *err)
{
    if (d->action == STZ_ACTION_SVD) {
        memset(out, 0, sizeof *out);
        stz_status st = stz_svd_tensor(d, x, weights, (size_t)rows, (size_t)cols, out, y, err);
        if (st)
            stz_qmem_free(out);
        return st;
    }
    if (d->method == STZ_QMETHOD_TRELLIS)
        return stz_trellis_tensor(d, x, weights, rows, cols, 1, out, y, err);
    float *sc, *mn;
    stz_status st = stz_qtensor_begin(d, x, weights, rows, cols, out, &sc, &mn, err);
    const stz_qformat *f = &out->fmt;
    uint64_t nb = stz_q_blocks(cols, f->block);
    size_t rb = st ? 0 : stz_qf_bytes(f, (size_t)cols);
    for (uint64_t r = 0; !st && r < rows; r++)
        if (stz_qf_quantize_any(f, x + r * cols, (size_t)cols, out->part[STZ_PART_VALUES] + r * rb, sc + r * nb,
                                mn ? mn + r * nb : NULL))
            st = stz_err_set(err, STZ_E_NUMERIC, "%s", stz_qtensor_overflow(f));
        else if (r % 64 == 63 && stz_interrupt_pending()) /* a large tensor's search takes seconds */
            st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    if (!st)
        st = stz_qtensor_end(x, rows, cols, out, sc, mn, y, err);
    free(sc), free(mn);
    if (st)
        stz_qmem_free(out);
    return st;
}
