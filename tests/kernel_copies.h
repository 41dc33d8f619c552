/* The library's vectorised kernels compiled once more from their sources
 * (tests/CMakeLists.txt, stz_kernel_copy), renamed: plain_* for the
 * baseline instruction set only, avx2_* for AVX2 alone (x86-64 with GCC),
 * to check that the library's clones give the same bits. */
#ifndef STZ_KERNEL_COPIES_H
#define STZ_KERNEL_COPIES_H

#include "stz_pack.h"
#include "stz_kernels.h"
#include "stz_quant.h"

void plain_xform_split(stz_xform x, const uint8_t *src, size_t n, uint8_t *const *p);
void plain_xform_merge(stz_xform x, const uint8_t *const *p, size_t n, uint8_t *dst);

void plain_qf_prepare(stz_qformat *f);
void plain_qf_fit_levels(stz_qformat *f, const float *x, size_t rows, size_t cols);
int plain_qf_quantize_row(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins);
void plain_qf_dequantize_row(const stz_qformat *f, const uint8_t *q, const float *scales, const float *mins, size_t n,
                             float *y);
void avx2_qf_prepare(stz_qformat *f);
int avx2_qf_quantize_row(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins);
void avx2_qf_dequantize_row(const stz_qformat *f, const uint8_t *q, const float *scales, const float *mins, size_t n,
                            float *y);

/* quant/ggml_quant.c's searches */
int plain_ggml_quant32(int type, const float *x, const float *w, size_t n, uint8_t *out);
int plain_ggml_quant256(int type, const float *x, const float *w, size_t n, uint8_t *out);
int avx2_ggml_quant32(int type, const float *x, const float *w, size_t n, uint8_t *out);
int avx2_ggml_quant256(int type, const float *x, const float *w, size_t n, uint8_t *out);

#endif
