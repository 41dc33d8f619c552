/*
 * stz_quant.h - block-wise quantization, 2 to 8 bits.
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
#ifndef STZ_QUANT_H
#define STZ_QUANT_H

#include "stz.h"
#include "stz_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- what to do with one tensor ------------------------------------------ */

typedef enum {
    STZ_ACTION_KEEP = 0,
    STZ_ACTION_INT8 = 1,
    STZ_ACTION_INT4 = 2,
    STZ_ACTION_SVD = 3,
    STZ_ACTION_INT2 = 4,
    STZ_ACTION_INT3 = 5,
    STZ_ACTION_INT5 = 6,
    STZ_ACTION_INT6 = 7,
    /* llama.cpp's tensor types (quant/ggml_quant.c chooses their scales):
     * the values stored as GGUF stores them, exported byte for byte */
    STZ_ACTION_FIRST_GGML = 8,
    STZ_ACTION_Q4_0 = 8,
    STZ_ACTION_Q4_1 = 9,
    STZ_ACTION_Q5_0 = 10,
    STZ_ACTION_Q5_1 = 11,
    STZ_ACTION_Q8_0 = 12,
    STZ_ACTION_IQ4_NL = 13,
    STZ_ACTION_Q2_K = 14,
    STZ_ACTION_Q3_K = 15,
    STZ_ACTION_Q4_K = 16,
    STZ_ACTION_Q5_K = 17,
    STZ_ACTION_Q6_K = 18,
    STZ_ACTION_IQ4_XS = 19,
    STZ_ACTION_F16 = 20,
    STZ_ACTION_BF16 = 21,
    STZ_ACTION_COUNT
} stz_action;

/* absmax: symmetric, the largest magnitude maps to +-(2^(bits-1) - 1);
 * full: symmetric, the signed extreme maps to -2^(bits-1) (llama.cpp's Q4_0);
 * mse: symmetric, the scale searched for the lowest squared error;
 * asym: scale and minimum per block, codes 0..2^bits - 1;
 * nl: a non-uniform codebook of 2^bits levels (a fixed one), scale searched;
 * nl-fit: nl with the codebook fitted to each tensor;
 * trellis: 2 to 4 bits, each column of a segment of rows one circular
 *          stream of codes whose last 12 bits pick a value (QTIP's bitshift
 *          trellis, docs/FORMAT.md "Trellis codes"): same bytes as the
 *          width's codes, lower error. */
typedef enum {
    STZ_QMETHOD_ABSMAX = 0,
    STZ_QMETHOD_MSE = 1,
    STZ_QMETHOD_FULL = 2,
    STZ_QMETHOD_ASYM = 3,
    STZ_QMETHOD_NL = 4,
    STZ_QMETHOD_NL_FIT = 5, /* nl with the codebook fitted to each tensor (stored in the file) */
    STZ_QMETHOD_TRELLIS = 6,
    STZ_QMETHOD_COUNT
} stz_qmethod;
typedef enum { STZ_NONFINITE_ERROR = 0, STZ_NONFINITE_KEEP = 1 } stz_nonfinite;

typedef struct {
    stz_action action;
    uint32_t block_size;     /* elements per block along the last dimension */
    stz_dtype scale_dtype;   /* F16 (default), F32, or U8 (8-bit log codes under a per-tensor base) */
    stz_qmethod method;      /* absmax (default), mse, full, asym, nl */
    stz_nonfinite nonfinite; /* what NaN/Inf in the tensor does */
    /* svd only: exactly one of rank / energy / max_error is set (non-zero) */
    uint32_t svd_rank;
    double svd_energy, svd_max_error;
    int svd_randomized;       /* method "randomized" (default "exact") */
    uint32_t svd_power_iters; /* randomized: power iterations q (default 1) */
    uint32_t svd_oversample;  /* randomized: extra sketch columns (default 10) */
    stz_action fallback;      /* when factors would not be smaller: keep, int8 (default) or int4 */
    int feedback;             /* block quantizations: "feedback": true, error feedback (stz_feedback.h) */
    int pad;                  /* llama.cpp's types: "pad": true, rows that are not whole 32-blocks keep a
                                32-block type, the last block of each row zero-padded (docs/FORMAT.md) */
    int rule;                 /* index of the deciding rule, -1 for the default */
    const char *reason;       /* static text when the action was overridden, else NULL */
} stz_decision;

/* Names as policies write them: "int4", "svd", "q4_k"...; "absmax", "nl"... ("?" out of range). */
STZ_API const char *stz_action_name(stz_action a);
/* The action named `name` as stz_action_name writes it; STZ_ACTION_COUNT
 * when none is (or name is NULL). */
STZ_API stz_action stz_action_of_name(const char *name);
/* Bits per value of a quantizing action (int2..int8; a ggml type's code
 * width: q4_k 4, q6_k 6, f16 16), 0 for keep and svd. */
STZ_API int stz_action_bits(stz_action a);
/* 1 for the block quantizations (int2..int8, q4_0..iq4_xs), 0 for keep,
 * svd, f16 and bf16. */
STZ_API int stz_action_is_block(stz_action a);
/* The ggml type (STZ_GGML_*) of a ggml-type action, else -1; and the
 * action of a ggml type (STZ_ACTION_COUNT for a type stz does not write). */
STZ_API int stz_action_ggml_type(stz_action a);
STZ_API stz_action stz_action_of_ggml_type(int type);
STZ_API const char *stz_qmethod_name(stz_qmethod m);
/* 1 when a matrix of `rows` rows can be stored with the method "trellis"
 * at `bits` bits: 2 to 4 bits, at least 12 / bits rows (a policy gives a
 * tensor with fewer the method "nl" instead). */
STZ_API int stz_trellis_fits(int bits, uint64_t rows);

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

/* Converts n elements of a float dtype (BF16, F16, F32, F64) to F32 and
 * back (round to nearest even). STZ_E_DTYPE for other dtypes. */
STZ_API stz_status stz_to_f32(stz_dtype d, const uint8_t *src, size_t n, float *dst, stz_err *err);
STZ_API stz_status stz_from_f32(stz_dtype d, const float *src, size_t n, uint8_t *dst, stz_err *err);

/* Bytes a tensor takes in the output under decision d (values plus
 * scales; header space not counted). */
STZ_API uint64_t stz_quant_bytes(const stz_tensor *t, const stz_decision *d);

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

/* ---- llama.cpp's tensor types (quant/ggml_types.c) ---------------------- */

/* ggml tensor types stz writes (values are ggml's; the reader knows all of
 * llama.cpp's, by number). */
typedef enum {
    STZ_GGML_F32 = 0,
    STZ_GGML_F16 = 1,
    STZ_GGML_Q4_0 = 2,
    STZ_GGML_Q4_1 = 3,
    STZ_GGML_Q5_0 = 6,
    STZ_GGML_Q5_1 = 7,
    STZ_GGML_Q8_0 = 8,
    STZ_GGML_Q2_K = 10,
    STZ_GGML_Q3_K = 11,
    STZ_GGML_Q4_K = 12,
    STZ_GGML_Q5_K = 13,
    STZ_GGML_Q6_K = 14,
    STZ_GGML_IQ4_NL = 20,
    STZ_GGML_IQ4_XS = 23,
    STZ_GGML_BF16 = 30,
    STZ_GGML_AUTO = -1 /* export: keep each float tensor's own dtype */
} stz_ggml_type;

/* "f32", "q4_k", ... for every ggml type a GGUF file may hold (NULL for an
 * unknown number), and back for the types export writes (-2 for any other;
 * "auto" is STZ_GGML_AUTO). */
STZ_API const char *stz_ggml_type_name(int type);
STZ_API int stz_ggml_type_parse(const char *s);
/* The name of the i-th type stz_ggml_type_parse takes besides "auto"
 * (the types export writes), NULL past the last. */
STZ_API const char *stz_ggml_type_written(size_t i);
/* Bytes of a row of n elements of `type`: whole blocks, the last one
 * padded when n is not a multiple of the block (stz_qf_quantize_row). */
STZ_API uint64_t stz_ggml_row_bytes(int type, uint64_t n);
/* Elements per block of `type` (1 for floats, 0 for an unknown number). */
STZ_API uint32_t stz_ggml_block(int type);

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
/* The type llama.cpp's quantize falls back to when a row of n elements is
 * not whole blocks of `type`: the 32-block type for a 256-block one (q2_k,
 * q3_k, iq4_xs: iq4_nl; q4_k: q5_0; q5_k: q5_1; q6_k: q8_0), F16 when
 * not whole 32-blocks either; `type` itself when it fits. */
STZ_API int stz_ggml_fallback(int type, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
