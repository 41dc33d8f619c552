/* Pieces of block quantization shared by the file writer (quant_file.c)
 * and the in-memory quantizer (quant_tensor.c). Not installed. */
#ifndef STZ_QUANT_TENSOR_H
#define STZ_QUANT_TENSOR_H

#include "stz_quant.h"

/* The kernel format of a quantizing decision (int2..int8; svd: its INT8
 * factors): bits, method, block, scale storage, nl's fixed codebook.
 * Returns 1 when the first kernels (stz_q8_*, stz_q4_*) write it. */
int stz_qf_of_decision(const stz_decision *d, stz_qformat *f);

/* One row, with the first kernels when `legacy`, else stz_qf_quantize_row.
 * -1 if a scale does not fit F16. */
int stz_qf_quantize_any(const stz_qformat *f, int legacy, const float *x, size_t n, uint8_t *q, float *scales,
                        float *mins);

/* n per-block floats as the scale dtype stores them (U8: log codes under
 * the format's base). */
void stz_qf_store_scales(const stz_qformat *f, const float *v, size_t n, uint8_t *dst);

/* Up to 256 rows spread over a rows x cols tensor (at most 2^20 columns of
 * each), the sample nl-fit fits its codebook to: row k of the sample is
 * row k * (rows / nr). */
static inline size_t stz_qf_fit_rows(uint64_t rows) { return rows < 256 ? (size_t)rows : 256; }
static inline size_t stz_qf_fit_cols(uint64_t cols) { return cols > (1u << 20) ? (size_t)1 << 20 : (size_t)cols; }

#endif
