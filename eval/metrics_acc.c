/* Error figures between a reference and a candidate: the accumulators
 * (stz_eval.h), used by the quantizers as they write and by stz eval. */
#include "stz_eval.h"
#include "core/stz_core.h"

#include <math.h>
#include <string.h>

/* Eight independent float lanes over pieces of 256 elements (each lane
 * sums 32 products: float is exact enough there), folded into the double
 * accumulators per piece. GCC vector types: the compiler left the lanes of
 * plain arrays mostly scalar; the same arithmetic in the same order. */
STZ_CLONES("avx2", "default") void stz_metrics_add(stz_metrics_acc *m, const float *a, const float *b, size_t n)
{
    typedef float v8f __attribute__((vector_size(32)));
    typedef int32_t v8i __attribute__((vector_size(32)));
    enum { L = 8, PIECE = 256 };
    for (size_t i0 = 0; i0 < n; i0 += PIECE) {
        size_t len = n - i0 < PIECE ? n - i0 : PIECE, full = len / L * L;
        v8f dot = {0}, aa = {0}, bb = {0}, dd = {0}, mx = {0};
        const float *x = a + i0, *y = b + i0;
        for (size_t i = 0; i < full; i += L) {
            v8f p, q, d, ad;
            memcpy(&p, x + i, sizeof p), memcpy(&q, y + i, sizeof q);
            d = p - q, ad = (v8f)((v8i)d & 0x7fffffff); /* fabsf */
            dot += p * q, aa += p * p, bb += q * q, dd += d * d;
            v8i gt = (v8i)(ad > mx); /* not fmaxf: a libm call unless -ffast-math */
            mx = (v8f)((gt & (v8i)ad) | (~gt & (v8i)mx));
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
