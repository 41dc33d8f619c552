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
#include "stz_pack.h"
#include "stz_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

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
int stz_q8_quantize_ref(const float *x, size_t n, size_t block, stz_qmethod m, stz_dtype scale_dtype, int8_t *q,
                        float *scales);
int stz_q4_quantize_ref(const float *x, size_t n, size_t block, stz_qmethod m, stz_dtype scale_dtype, uint8_t *q,
                        float *scales);
/* Inverse: y[n] = q * scale of its block. */
void stz_q8_dequantize_ref(const int8_t *q, const float *scales, size_t n, size_t block, float *y);
void stz_q4_dequantize_ref(const uint8_t *q, const float *scales, size_t n, size_t block, float *y);

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
    int bits;              /* 2..8 */
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
} stz_qformat;

/* Call after setting levels (nl), before quantizing. */
void stz_qf_prepare(stz_qformat *f);

size_t stz_qf_row_bytes(int bits, size_t n);
/* Quantizes one row: q gets stz_qf_row_bytes bytes, scales (and mins, asym)
 * one float per block, each exactly its stored value. Returns -1 if a
 * scale cannot be stored (F16 overflow). x must be finite. */
int stz_qf_quantize_row(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins);
void stz_qf_dequantize_row(const stz_qformat *f, const uint8_t *q, const float *scales, const float *mins, size_t n,
                           float *y);
/* U8 scales: the value of code c, and the code nearest s. */
float stz_qf_scale_value(float base, uint8_t c);
uint8_t stz_qf_scale_code(float base, float s);
/* nl: fits f->levels to rows x cols sample values (f->bits, block,
 * scale_dtype and scale_base set): Lloyd iterations between the levels and
 * each block's searched scale, starting from a fixed codebook. */
void stz_qf_fit_levels(stz_qformat *f, const float *x, size_t rows, size_t cols);
/* The fixed starting codebook of nl for `bits` (2^bits levels). */
void stz_qf_default_levels(int bits, float *levels);

/* Converts n elements of a float dtype (BF16, F16, F32, F64) to F32 and
 * back (round to nearest even). STZ_E_DTYPE for other dtypes. */
stz_status stz_to_f32(stz_dtype d, const uint8_t *src, size_t n, float *dst, stz_err *err);
stz_status stz_from_f32(stz_dtype d, const float *src, size_t n, uint8_t *dst, stz_err *err);

/* Bytes a tensor takes in the output under decision d (values plus
 * scales; header space not counted). */
uint64_t stz_quant_bytes(const stz_tensor *t, const stz_decision *d);

/* ---- a tensor in memory ------------------------------------------------ */

/* A tensor quantized in memory: the bytes stz_quantize_file stores for it. */
typedef struct {
    uint8_t *part[5];   /* values, scales, minimums (asym), as stored; NULL when absent (a tensor of one
                         * block keeps its scale in the metadata); svd: U, U.scales, S, Vh, Vh.scales */
    size_t len[5];
    stz_dtype dtype[5]; /* the stored tensors' dtypes */
    size_t rank;        /* svd: the factors' rank */
    double err2, norm2; /* squared error of the dequantized values; squared norm of the original */
    stz_qformat fmt;    /* as used: the U8 scales' base, nl-fit's fitted levels */
    int legacy;         /* written by the first kernels */
} stz_qmem;

/* Quantizes rows x cols floats x (finite) under decision d (int2..int8,
 * or svd: INT8 factors, whatever their size; no fallback), as
 * stz_quantize_file would. STZ_E_NUMERIC (NaN/Inf, F16 overflow), svd's
 * errors (STZ_E_ARG for a rank >= min(rows, cols)). */
stz_status stz_quantize_tensor(const stz_decision *d, const float *x, uint64_t rows, uint64_t cols, stz_qmem *out,
                               stz_err *err);
void stz_qmem_free(stz_qmem *q);

/* ---- files ----------------------------------------------------------- */

typedef struct {
    int threads;              /* INT8/INT4 row batches and OpenBLAS (SVD) threads, >= 1 */
    unsigned write_flags;     /* STZ_WRITE_FORCE */
    stz_progress_fn progress; /* input bytes */
    void *progress_user;
    /* SVD factors are computed before the header is written (their ranks
     * and scales are in it); up to this many bytes of them are held until
     * written, the others computed again then (and checked to be the same
     * bits), so memory does not grow with the number of SVD tensors.
     * 0: STZ_SVD_HOLD_DEFAULT. */
    uint64_t svd_hold_bytes;
} stz_quant_params;

#define STZ_SVD_HOLD_DEFAULT (256u << 20)
#define STZ_QUANT_PARAMS_DEFAULT {1, 0, NULL, NULL, 0}

typedef struct {
    uint64_t in_bytes, out_bytes;
    size_t tensors, quantized;
    uint64_t params, params_quantized;
    /* measured while quantizing: cosine of each dequantized tensor against
     * its original; minimum over the quantized tensors (1 if none), mean
     * weighted by parameters over all float tensors (kept ones count 1),
     * as stz eval reports them */
    double min_cosine, weighted_cosine;
    char worst[256]; /* name of the tensor with the lowest cosine */
} stz_quant_stats;

/*
 * Quantizes `in` into `out` following the policy, tensor by tensor (memory
 * does not grow with the model). Kept tensors are copied byte for byte.
 * The output is a normal SafeTensors file whose __metadata__ describes
 * each quantized tensor (docs/FORMAT.md, "Quantized SafeTensors").
 * SVD decisions are factored first (stz_svd.h): the whole matrix is held as
 * F32 while it is factored, and the INT8 factors until they are written.
 * Errors: the reader's, STZ_E_NUMERIC (NaN/Inf, naming tensor and
 * element), STZ_E_DUPLICATE (a companion name exists), STZ_E_LAPACK,
 * STZ_E_EXISTS, STZ_E_IO.
 */
stz_status stz_quantize_file(const stz_quant_params *p, stz_policy *policy, const char *in, const char *out,
                             stz_quant_stats *stats, stz_err *err);

/*
 * Quantizes `in` following the policy straight into the container `out`
 * ("-": standard output): one pass, no intermediate file, memory bounded
 * by a few chunks per thread. The container is byte for byte the one
 * stz_pack_file(pp) makes of the file stz_quantize_file(qp) writes, and
 * unpacks to that file. qp->write_flags are ignored (pp's apply);
 * qstats->out_bytes is the quantized file's size, pstats the container's.
 */
stz_status stz_compress_file(const stz_quant_params *qp, const stz_pack_params *pp, stz_policy *policy,
                             const char *in, const char *out, stz_quant_stats *qstats, stz_pack_stats *pstats,
                             stz_err *err);

/*
 * Writes a plain model: every tensor under its original name and shape,
 * quantized ones dequantized to their original dtype (or `dtype` if it is
 * not STZ_DTYPE_COUNT: BF16, F16 or F32), kept ones byte-identical. A file
 * without quantized tensors is copied.
 */
stz_status stz_dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                               stz_err *err);

/* ---- reading plain or quantized files as floats ----------------------- */

/* One tensor under its original name, shape and dtype, seen as rows x cols
 * (cols = last dimension; the whole tensor for fewer than 2 dimensions). */
typedef struct {
    const char *name;
    stz_dtype dtype;        /* original dtype */
    int ndim;
    const uint64_t *shape;  /* original shape */
    uint64_t numel, rows, cols;
    int bits;               /* 0: stored as is; 2..8: quantized */
    uint64_t rank;          /* SVD factors (INT8, bits 8): their rank; else 0 */
    uint64_t stored_bytes;  /* bytes in the file: values (+ scales) */
    const char *method;     /* "absmax", "full", "mse", "asym", "nl", "svd"; NULL when stored as is */
    uint32_t block_size;    /* quantized (not svd): elements per block */
    stz_dtype scale_dtype;  /* quantized (not svd): how scales are stored (F16, F32, U8) */
    const char *scales_name;/* quantized (not svd): the stored scales tensor, NULL for a single scale */
} stz_qtensor;

typedef struct stz_qmodel stz_qmodel;

/* Opens a plain or quantized SafeTensors file, or an .stz container of one
 * (its chunks decoded as rows are read, one chunk held: no temporary file).
 * Companion scales tensors are not listed; quantized tensors appear under
 * their original names. */
stz_status stz_qmodel_open(stz_qmodel **out, const char *path, stz_err *err);
/* The same over a reader the caller keeps (for example a container's
 * header, stz_container_header): lists tensors; reading rows needs the
 * reader's data. */
stz_status stz_qmodel_open_reader(stz_qmodel **out, const stz_reader *r, stz_err *err);
void stz_qmodel_free(stz_qmodel *m);
/* A container's chunks are decoded on `threads` threads where a read covers
 * several (stz_container_set_threads); no effect on other files. */
void stz_qmodel_set_threads(stz_qmodel *m, int threads);
struct stz_container;
/* The container m was opened from, or NULL for a SafeTensors file. */
struct stz_container *stz_qmodel_container(const stz_qmodel *m);
size_t stz_qmodel_count(const stz_qmodel *m);
const stz_qtensor *stz_qmodel_tensor(const stz_qmodel *m, size_t i);
long stz_qmodel_find(const stz_qmodel *m, const char *name);
const stz_reader *stz_qmodel_reader(const stz_qmodel *m);
/* Reads rows [row, row + nrows) of tensor i as floats (dequantized if
 * needed) into dst (nrows * cols floats). STZ_E_DTYPE for a non-float
 * tensor that is stored as is. Not thread-safe on one model. */
stz_status stz_qmodel_read_rows(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst, stz_err *err);
/* The stored bytes of rows [row, row + nrows) of a block-quantized tensor
 * with a scales tensor: codes (nrows * stz_qf_row_bytes) and scales (nrows
 * * blocks * the scale dtype's size), as docs/FORMAT.md lays them out.
 * STZ_E_UNSUPPORTED for other tensors. */
stz_status stz_qmodel_read_codes(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, uint8_t *codes,
                                 uint8_t *scales, stz_err *err);
/* The same as stz_qmodel_read_rows, and for a block-quantized tensor (bits set, rank 0) each
 * block's scale as stored, exactly (nrows * ceil(cols / block_size)
 * floats, row by row), when scales is not NULL. */
stz_status stz_qmodel_read_rows_scales(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst,
                                       float *scales, stz_err *err);

#ifdef __cplusplus
}
#endif
#endif
