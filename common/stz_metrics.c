/* Error figures between a reference and a candidate: the accumulators
 * (stz_eval.h), used by the quantizers as they write and by stz eval. */
#include "stz_eval.h"
#include "stz_internal.h"

#include <math.h>

/* Eight independent float lanes over pieces of 256 elements (each lane
 * sums 32 products: float is exact enough there, and the loop vectorises
 * without -ffast-math), folded into the double accumulators per piece. */
STZ_CLONES("avx2", "default") void stz_metrics_add(stz_metrics_acc *m, const float *a, const float *b,
                                                                        size_t n)
{
    enum { L = 8, PIECE = 256 };
    for (size_t i0 = 0; i0 < n; i0 += PIECE) {
        size_t len = n - i0 < PIECE ? n - i0 : PIECE, full = len / L * L;
        float dot[L] = {0}, aa[L] = {0}, bb[L] = {0}, dd[L] = {0}, mx[L] = {0};
        const float *x = a + i0, *y = b + i0;
        for (size_t i = 0; i < full; i += L)
            for (int k = 0; k < L; k++) {
                float p = x[i + k], q = y[i + k], d = p - q;
                float ad = fabsf(d);
                dot[k] += p * q, aa[k] += p * p, bb[k] += q * q, dd[k] += d * d;
                mx[k] = ad > mx[k] ? ad : mx[k]; /* not fmaxf: a libm call unless -ffast-math */
            }
        for (size_t i = full; i < len; i++) {
            float p = x[i], q = y[i], d = p - q;
            dot[0] += p * q, aa[0] += p * p, bb[0] += q * q, dd[0] += d * d;
            mx[0] = fabsf(d) > mx[0] ? fabsf(d) : mx[0];
        }
        for (int k = 0; k < L; k++) {
            m->dot += dot[k], m->aa += aa[k], m->bb += bb[k], m->dd += dd[k];
            m->max_abs = mx[k] > m->max_abs ? mx[k] : m->max_abs;
        }
    }
    m->n += n;
}

void stz_metrics_merge(stz_metrics_acc *into, const stz_metrics_acc *from)
{
    into->dot += from->dot, into->aa += from->aa, into->bb += from->bb, into->dd += from->dd;
    into->max_abs = from->max_abs > into->max_abs ? from->max_abs : into->max_abs;
    into->n += from->n;
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
