/* Elementary functions in double with the same bits everywhere (stz_math.h):
 * Cody and Waite's reductions, then series evaluated in one fixed order. */
#include "core/stz_math.h"

#include <math.h>

/* log x: x = 2^e m, sqrt(1/2) <= m < sqrt(2); with s = (m - 1) / (m + 1),
 * log m = 2 (s + s^3/3 + s^5/5 + ...), |s| < 0.172, to s^23. */
double stz_log(double x)
{
    if (!(x > 0))
        return x == 0 ? -INFINITY : NAN;
    if (isinf(x))
        return x;
    int e;
    double m = frexp(x, &e); /* exact: 0.5 <= m < 1 */
    if (m < 0.70710678118654752)
        m *= 2, e--;
    double s = (m - 1) / (m + 1), s2 = s * s, p = 1.0 / 23;
    for (int d = 21; d >= 1; d -= 2)
        p = p * s2 + 1.0 / d;
    return (double)e * STZ_LN2_HI + ((double)e * STZ_LN2_LO + 2 * s * p);
}

double stz_log2(double x) { return stz_log(x) * 1.4426950408889634; }

double stz_pow(double x, double y) { return stz_exp(y * stz_log(x)); }

/* x = k pi/2 + r (pi/2 in three parts: exact products for |k| < 2^20),
 * |r| <= pi/4, then sin r and cos r by their Taylor series to r^17 and r^18,
 * swapped and signed by the quadrant k mod 4. Arguments past 2^20 pi/2
 * (positions times frequencies never are) lose accuracy, not determinism. */
void stz_sincos(double x, double *s, double *c)
{
    const double P1 = 1.5707963109016418457, P2 = 1.5893254712295857e-08, P3 = 6.1232339957367660e-17;
    double k = rint(x * 0.63661977236758134), r = ((x - k * P1) - k * P2) - k * P3, r2 = r * r;
    double ps = 1.0 / 355687428096000.0, pc = 1.0 / 6402373705728000.0; /* 1/17!, 1/18! */
    for (int n = 15; n >= 1; n -= 2) {
        double f = 1; /* 1/n! */
        for (int i = 2; i <= n; i++)
            f *= i;
        ps = ps * -r2 + 1.0 / f;
        pc = pc * -r2 + 1.0 / (f * (n + 1));
    }
    double sr = r * ps, cr = pc * -r2 + 1.0;
    long q = (long)k & 3;
    double sv = q & 1 ? cr : sr, cv = q & 1 ? sr : cr;
    *s = q & 2 ? -sv : sv;
    *c = (q == 1 || q == 2) ? -cv : cv;
}
