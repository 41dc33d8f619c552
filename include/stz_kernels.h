/*
 * stz_kernels.h - the block kernels: rows and tensors quantized, 2 to 8 bits
 * and llama.cpp's types. Experimental: for tests, benchmarks and bindings;
 * a program quantizes whole files through stz_pipeline.h.
 *
 * The first kernels (stz_q8_*, stz_q4_*: INT8 / INT4, absmax and mse with
 * F16/F32 scales) keep writing the first version's bytes; the general form
 * (stz_qf_*, below) has every width, method and scale storage.
 *
 * Each row (the last dimension) is cut into blocks of `block` elements, the
 * last one shorter when the row length is not a multiple. Per block:
 *   absmax: scale = max|w| / qmax, q = round(w / scale) clipped to the type
 *           (INT8: qmax 127, range [-127, 127]; INT4: qmax 7, range [-8, 7]);
 *   mse:    the scale minimising the block's squared error among a grid of
 *           clipping factors and both signs of the largest value (which
 *           lets INT4 use -8, as llama.cpp's Q4_0 does); same storage.
 * An all-zero block gets scale 0 and zeros. Dequantized w' = q * scale.
 * Kernels take float rows and never allocate. INT4 values are packed two per
 * byte, the first of each pair in the high nibble, as 4-bit two's
 * complement; an odd row ends with a zero low nibble.
 */
#ifndef STZ_KERNELS_H
#define STZ_KERNELS_H

#include "stz.h"
#include "stz_experimental.h"
#include "stz_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the first kernels: INT8 and INT4 ----------------------------------- */

/* Blocks in a row of n elements. */
static inline size_t stz_q_blocks(size_t n, size_t block) { return (n + block - 1) / block; }
/* Bytes of one quantized row: n (INT8) or ceil(n/2) (INT4). */
static inline size_t stz_q_row_bytes(int bits, size_t n) { return bits == 4 ? (n + 1) / 2 : n; }

/* Quantizes one row x[n] into q (stz_q_row_bytes bytes) and scales
 * (stz_q_blocks floats, each exactly representable in scale_dtype, F16 or
 * F32). absmax rounds each scale up to that dtype and quantizes with the
 * stored value, so |x - q * scale| <= scale / 2 for every element. x must
 * be finite. Returns 0, or -1 if a scale does not fit the scale dtype
 * (F16 above 65504): use F32 scales. */
STZ_API int stz_q8_quantize_ref(const float *x, size_t n, size_t block, stz_qmethod m, stz_dtype scale_dtype, int8_t *q,
                                float *scales);
STZ_API int stz_q4_quantize_ref(const float *x, size_t n, size_t block, stz_qmethod m, stz_dtype scale_dtype,
                                uint8_t *q, float *scales);
/* Inverse: y[n] = q * scale of its block. */
STZ_API void stz_q8_dequantize_ref(const int8_t *q, const float *scales, size_t n, size_t block, float *y);
STZ_API void stz_q4_dequantize_ref(const uint8_t *q, const float *scales, size_t n, size_t block, float *y);

/* ---- any width and method ------------------------------------------- */

/*
 * The general form (stz_qf_*): `bits` 2..8, any stz_qmethod, scales as
 * F16, F32 or U8. A row's codes are a bit string, each code `bits` wide,
 * the first code in the highest bits of the first byte; a row starts on a
 * byte (stz_qf_row_bytes). Codes are two's complement for absmax, full and
 * mse (value q), unsigned for asym (value u * scale + min) and nl (value
 * levels[u] * scale). For 4 bits this is INT4's pair layout; for 8, bytes.
 * U8 scales are codes c: the sign in c & 128, m = c & 127; m = 0 is scale
 * 0, else |scale| = ldexp(base * 2^((m & 7) / 8), (m >> 3) - 15) in float,
 * 2^(k/8) from a table of floats (stz_qf_scale_value): code 120 is the base,
 * a step 1/8 octave; base is per tensor.
 */
typedef struct {
    int bits; /* 2..8 */
    stz_qmethod method;
    uint32_t block;        /* elements per block (any >= 1) */
    stz_dtype scale_dtype; /* F16, F32 or U8 (not U8 with asym) */
    float scale_base;      /* U8: the scale of code 120 (the tensor's largest |value|) */
    float levels[64];      /* nl: 2^bits levels, sorted, largest magnitude 1 */
    /* nl, from levels by stz_qf_prepare: the midpoints between levels (+inf
     * past the last), and past 16 levels a table of first codes */
    float mid[64];
    uint8_t lut[1024];
    int lut_exact;
    /* set by a decision's format: 8 or 4 bits, absmax or mse, F16/F32 scales,
     * quantized by the first kernels (stz_q8_*, stz_q4_*), whose bytes files
     * keep; stz_qf_quantize_row itself ignores it */
    int first_kernels;
    /* a ggml-type action (stz_qf_of_decision): its type's traits, the
     * row's bytes as GGUF stores them, scales inside; else NULL */
    const struct stz_ggml_traits *ggml;
    /* importance per column of the row (NULL: all 1): the searches weigh
     * each element's squared error by it */
    const float *weights;
} stz_qformat;

/* Call after setting levels (nl), before quantizing. */
STZ_API void stz_qf_prepare(stz_qformat *f);

/* Bytes of one row of n codes of `bits` bits: ceil(n * bits / 8). */
STZ_API size_t stz_qf_row_bytes(int bits, size_t n);
/* Bytes of one row of n values in format f: stz_qf_row_bytes, or the
 * ggml type's blocks. */
STZ_API size_t stz_qf_bytes(const stz_qformat *f, size_t n);
/* Quantizes one row: q gets stz_qf_row_bytes bytes, scales (and mins, asym)
 * one float per block, each exactly its stored value. Returns -1 if a
 * scale cannot be stored (F16 overflow). x must be finite. */
STZ_API int stz_qf_quantize_row(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins);
STZ_API void stz_qf_dequantize_row(const stz_qformat *f, const uint8_t *q, const float *scales, const float *mins,
                                   size_t n, float *y);
/* U8 scales: the value of code c, and the code nearest s. */
STZ_API float stz_qf_scale_value(float base, uint8_t c);
STZ_API uint8_t stz_qf_scale_code(float base, float s);
/* nl: fits f->levels to rows x cols sample values (f->bits, block,
 * scale_dtype and scale_base set): Lloyd iterations between the levels and
 * each block's searched scale, starting from a fixed codebook. */
STZ_API void stz_qf_fit_levels(stz_qformat *f, const float *x, size_t rows, size_t cols);
/* The fixed starting codebook of nl for `bits` (2^bits levels). */
STZ_API void stz_qf_default_levels(int bits, float *levels);

/* ---- a tensor in memory ------------------------------------------------ */

/* The stored tensors of a quantized tensor, as indices of stz_qmem's
 * arrays: a block format's values, scales and minimums (asym), or an svd
 * decision's factors. */
typedef enum {
    STZ_PART_VALUES = 0,
    STZ_PART_SCALES = 1,
    STZ_PART_MINS = 2,
    STZ_PART_U = 0,
    STZ_PART_U_SCALES = 1,
    STZ_PART_S = 2,
    STZ_PART_VH = 3,
    STZ_PART_VH_SCALES = 4,
    STZ_PART_COUNT = 5
} stz_qpart;

/* A tensor quantized in memory: the bytes stz_quantize_file stores for it. */
typedef struct {
    uint8_t *part[STZ_PART_COUNT]; /* as stored; NULL when absent (a tensor of one block keeps its
                                    * scale in the metadata) */
    size_t len[STZ_PART_COUNT];
    stz_dtype dtype[STZ_PART_COUNT]; /* the stored tensors' dtypes */
    size_t rank;                     /* svd: the factors' rank */
    double err2, norm2;              /* squared error of the dequantized values; squared norm of the original
                         * (both weighted by the columns' importance when given) */
    double cosine;                   /* of the dequantized values against the original, unweighted (1: both zero) */
    double err_out;                  /* error feedback: the layer's output error tr((W - Q) H (W - Q)^T), H dampened as
                         * stz_quant_output_error dampens it; else 0 */
    stz_qformat fmt;                 /* as used: the U8 scales' base, nl-fit's fitted levels */
} stz_qmem;

/* Quantizes rows x cols floats x (finite) under decision d (int2..int8,
 * or svd: INT8 factors, whatever their size; no fallback), as
 * stz_quantize_file would. weights: the importance of each of the cols
 * columns (stz_imatrix.h; NULL: all 1), which the block searches minimize
 * the weighted error by, and err2 and norm2 are weighted by (SVD's factors
 * are not searched: only its error is weighted). STZ_E_NUMERIC (NaN/Inf,
 * F16 overflow), svd's errors (STZ_E_ARG for a rank >= min(rows, cols)). */
STZ_API stz_status stz_quantize_tensor(const stz_decision *d, const float *x, const float *weights, uint64_t rows,
                                       uint64_t cols, stz_qmem *out, stz_err *err);
STZ_API void stz_qmem_free(stz_qmem *q);

/* stz_quantize_tensor of a block decision (int2..int8, a ggml block type)
 * with error feedback (GPTQ): the columns are quantized in order and each
 * rounding error is pushed onto the columns after it through the inverse
 * of H, so that the layer's output error (W - Q) H (W - Q)^T is what falls,
 * not each weight's. H: the cols x cols Gram matrix of the layer's inputs
 * (sum over calibration tokens of x x^T, row-major), dampened by 1% of its
 * mean diagonal; its diagonal also weighs the blocks' scale searches, and
 * err2 / norm2; the output error itself is out->err_out (exact: each error
 * fed is a step of it). Same format and bytes layout as stz_quantize_tensor
 * (the readers do not change), the same bytes for any `threads` and CPU
 * (stz's own products and factorisations). D (NULL: none): when H is of the inputs a quantized
 * model gives the layer (Xq, tokens x cols) and X are the original's,
 * D = (X - Xq)^T Xq (cols x cols, row-major); the rows are first moved 3/4
 * of the way to x + x D H^-1, their least-squares fit of the original
 * outputs X x^T through Xq (asymmetric calibration; the fit is measured,
 * the whole move over-corrects), and err_out is measured from there.
 * y: the values as read back, rows x cols (NULL: not wanted). STZ_E_ARG
 * (svd, keep, floats), STZ_E_NUMERIC, STZ_E_LAPACK. */
STZ_API stz_status stz_quantize_tensor_feedback(const stz_decision *d, const float *x, const float *H, const float *D,
                                                uint64_t rows, uint64_t cols, int threads, stz_qmem *out, float *y,
                                                stz_err *err);

/* The output error tr((x - y) H (x - y)^T) of rows x cols values x
 * stored as y, for inputs of Gram matrix H (cols x cols, row-major, its
 * upper triangle read) dampened as stz_quantize_tensor_feedback dampens it:
 * what error feedback minimizes, comparable between any quantizations of
 * x (feedback's own is its stz_qmem.err_out). The same for any `threads`
 * and CPU. STZ_E_NOMEM. */
STZ_API stz_status stz_quant_output_error(const float *x, const float *y, const float *H, uint64_t rows, uint64_t cols,
                                          int threads, double *out, stz_err *err);

/* ---- llama.cpp's types, a row at a time ---------------------------------- */

/* Quantizes a row x[n] (finite; n a multiple of the type's block) to a
 * block type stz writes (q4_0 .. iq4_xs), or converts it (f16, bf16, f32):
 * out gets stz_ggml_row_bytes(type, n) bytes, laid out as GGUF stores
 * them. The scales, minimums and sub-block scales minimise the squared
 * error weighted by w[i] (NULL: all 1). Returns 0, or -1 for a type stz
 * does not write, a row that is not whole blocks, or a scale past F16's
 * range. */
STZ_API int stz_ggml_quantize_row(int type, const float *x, const float *w, size_t n, uint8_t *out);
/* The values of n elements (whole blocks) of a row of `type`, exactly as
 * llama.cpp's to_float gives them (for the iq1-iq3 types, llama.cpp's own
 * to_float, from the libggml-base that STZ_GGML_LIB names or the library
 * path finds). Returns 0, or -1 for a type stz does not read. */
STZ_API int stz_ggml_dequantize_row(int type, const uint8_t *in, size_t n, float *y);
#ifdef __cplusplus
}
#endif
#endif /* STZ_KERNELS_H */
