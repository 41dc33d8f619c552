/* Eight float lanes for the quantizers' searches (qformat.c,
 * ggml_quant.c): GCC's vector extensions, compiled to AVX-512 or AVX2 by
 * the callers' target clones and to the same arithmetic in the same order
 * without them, so every build gives the same bits. */
#ifndef STZ_QUANT_VEC_H
#define STZ_QUANT_VEC_H

#include <stdint.h>
#include <string.h>

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint8_t v32b __attribute__((vector_size(32)));

#ifdef __clang__ /* no variable shuffles (the fuzzing build): lane by lane, the same values */
#define pick2(a, b, q)                                                                                                 \
    ({                                                                                                                 \
        v8f a_ = (a), b_ = (b), r_;                                                                                    \
        v8i q_ = (q);                                                                                                  \
        for (int j_ = 0; j_ < 8; j_++)                                                                                 \
            r_[j_] = q_[j_] & 8 ? b_[q_[j_] & 7] : a_[q_[j_] & 7];                                                     \
        r_;                                                                                                            \
    })
#define pick1(a, q) pick2(a, a, q)
#define low_bytes(q, out)                                                                                              \
    do {                                                                                                               \
        for (int j_ = 0; j_ < 8; j_++)                                                                                 \
            (out)[j_] = (uint8_t)(q)[j_];                                                                              \
    } while (0)
#else
#define pick2(a, b, q)    __builtin_shuffle(a, b, q)
#define pick1(a, q)       __builtin_shuffle(a, q)
#define low_bytes(q, out) /* the low byte of each lane */                                                              \
    do {                                                                                                               \
        v32b c_ = __builtin_shuffle((v32b)(q), (v32b){0, 4, 8, 12, 16, 20, 24, 28});                                   \
        memcpy(out, &c_, 8);                                                                                           \
    } while (0)
#endif

#endif
