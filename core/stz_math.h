/* Elementary functions with the same bits everywhere. libm's differ: glibc
 * picks other code on CPUs with FMA, and other C libraries round otherwise,
 * so the forward pass, its figures and whatever is decided from them use
 * these. Each is a fixed sequence of IEEE additions and multiplications
 * (the library builds with -ffp-contract=off), within 2 ulp of the exact
 * result. Not installed. */
#ifndef STZ_MATH_H
#define STZ_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^k as a float, -126 <= k <= 127 */
static inline float stz_pow2f(int k)
{
    uint32_t b = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* e^x: x = k ln2 + r (ln2 in two parts, |r| <= ln2 / 2), e^r by its Taylor
 * series to r^8, times 2^k in two exact steps (a subnormal result rounds
 * once; past the float range: 0 or infinity). No branch, so loops over it
 * vectorise. */
static inline float stz_expf(float x)
{
    float y = x < 89.0f ? x : 89.0f;
    y = y > -104.0f ? y : -104.0f;
    float k = (y * 1.44269504f + 12582912.0f) - 12582912.0f; /* rounded to the nearest integer */
    float r = (y - k * 0.693145752f) - k * 1.42860677e-06f, p = 2.48015873e-05f;
    p = p * r + 1.98412698e-04f;
    p = p * r + 1.38888889e-03f;
    p = p * r + 8.33333333e-03f;
    p = p * r + 4.16666667e-02f;
    p = p * r + 1.66666667e-01f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int ki = (int)k, k1 = ki >> 1; /* both halves in [-75, 64] */
    float e = p * stz_pow2f(k1) * stz_pow2f(ki - k1);
    return x == x ? e : x;
}

/* x * sigmoid(x), the SiLU */
static inline float stz_silu(float x) { return x / (1.0f + stz_expf(-x)); }

/* GELU's tanh approximation (Hugging Face's gelu_new): 0.5 x (1 + tanh(u)),
 * u = sqrt(2 / pi) (x + 0.044715 x^3), as x * sigmoid(2u). */
static inline float stz_gelu_tanh(float x)
{
    float u = 0.7978845608f * (x + 0.044715f * x * x * x);
    return x / (1.0f + stz_expf(-2.0f * u));
}

/* tanh(x) as 2 sigmoid(2x) - 1, by its series near 0 where that would
 * cancel (soft-capping: cap tanh(x / cap)). */
static inline float stz_tanhf(float x)
{
    float x2 = x * x;
    if (x2 < 0.0025f) /* |x| < 0.05: x - x^3/3 + 2x^5/15 */
        return x * (1.0f + x2 * (-0.333333333f + x2 * 0.133333333f));
    return 2.0f / (1.0f + stz_expf(-2.0f * x)) - 1.0f;
}

#define STZ_LN2_HI 6.93147180369123816490e-01 /* ln 2, its top 32 bits: k * STZ_LN2_HI is exact */
#define STZ_LN2_LO 1.90821492927058770002e-10

/* 2^k as a double, -1022 <= k <= 1023 */
static inline double stz_pow2(int64_t k)
{
    uint64_t b = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* e^x in double: x = k ln2 + r, |r| <= ln2 / 2, e^r by its Taylor series to
 * r^13 (odd and even terms as polynomials in r^2, side by side), times 2^k
 * in two exact steps (a subnormal result rounds once); past the range 0 or
 * infinity. No branch, so loops over it vectorise. */
static inline double stz_exp(double x)
{
    double y = x < 709.782712893384 ? x : 709.782712893384;
    y = y > -745.2 ? y : -745.2;
    double k = (y * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0; /* rounded to the nearest */
    double r = (y - k * STZ_LN2_HI) - k * STZ_LN2_LO, r2 = r * r;
    double even = 1.0 / 479001600.0, odd = 1.0 / 6227020800.0;
    even = even * r2 + 1.0 / 3628800.0, odd = odd * r2 + 1.0 / 39916800.0;
    even = even * r2 + 1.0 / 40320.0, odd = odd * r2 + 1.0 / 362880.0;
    even = even * r2 + 1.0 / 720.0, odd = odd * r2 + 1.0 / 5040.0;
    even = even * r2 + 1.0 / 24.0, odd = odd * r2 + 1.0 / 120.0;
    even = even * r2 + 0.5, odd = odd * r2 + 1.0 / 6.0;
    even = even * r2 + 1.0, odd = odd * r2 + 1.0;
    int64_t ki = (int64_t)k, k1 = ki / 2;
    double e = (even + r * odd) * stz_pow2(k1) * stz_pow2(ki - k1);
    return x != x ? x : x >= 709.782712893384 ? (double)INFINITY : x < -745.2 ? 0.0 : e;
}

/* log x, sin and cos in double (stz_math.c) */
double stz_log(double x);
double stz_log2(double x);
double stz_pow(double x, double y); /* x > 0 */
void stz_sincos(double x, double *s, double *c);

#endif /* STZ_MATH_H */
