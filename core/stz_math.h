/* Elementary functions with the same bits everywhere. libm's differ: glibc
 * picks other code on CPUs with FMA, and other C libraries round otherwise,
 * so the forward pass, its figures and whatever is decided from them use
 * these. Each is a fixed sequence of IEEE additions and multiplications
 * (the library builds with -ffp-contract=off), within 2 ulp of the exact
 * result. Not installed. */
#ifndef STZ_MATH_H
#define STZ_MATH_H

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

/* e^x, log x, sin and cos in double (stz_math.c) */
double stz_exp(double x);
double stz_log(double x);
double stz_log2(double x);
double stz_pow(double x, double y); /* x > 0 */
void stz_sincos(double x, double *s, double *c);

#endif /* STZ_MATH_H */
