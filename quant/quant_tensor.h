/* Pieces of block quantization shared by the file writer (pipeline/quantize.c)
 * and the in-memory quantizer (quant_tensor.c). Not installed. */
#ifndef STZ_QUANT_TENSOR_H
#define STZ_QUANT_TENSOR_H

#include "stz_quant.h"
#include "stz_kernels.h"
#include "stz_safetensors.h"
#include "stz_svd.h"

/* The kernel format of a quantizing decision (int2..int8; svd: its INT8
 * factors): bits, method, block, scale storage, nl's fixed codebook, and
 * whether the first kernels (stz_q8_*, stz_q4_*) write it. */
void stz_qf_of_decision(const stz_decision *d, stz_qformat *f);

/* Index of the first NaN/Inf in x[0..n), or n. */
size_t stz_quant_first_nonfinite(const float *x, size_t n);

/* One row, with the first kernels when f->first_kernels, else
 * stz_qf_quantize_row. -1 if a scale does not fit F16. */
int stz_qf_quantize_any(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins);

/* stz_quantize_tensor, with the values as read back in y (rows x cols;
 * NULL: not wanted). */
stz_status stz_quantize_tensor_y(const stz_decision *d, const float *x, const float *weights, uint64_t rows,
                                 uint64_t cols, stz_qmem *out, float *y, stz_err *err);

/* ---- error feedback (quant/feedback.c) ---- */

/* Element k of a block x[len] stored as y: its error, divided by U[k][k],
 * fed to the elements after it (x[j] -= e * U[k][j]); returns e. U: the
 * block's rows of the upper Cholesky factor of the inverse Hessian, ldu
 * apart. */
static inline float stz_fb_step(float *x, size_t k, size_t len, float y, const float *U, size_t ldu)
{
    const float *u = U + k * ldu;
    float e = (x[k] - y) / u[k];
    for (size_t j = k + 1; j < len; j++)
        x[j] -= e * u[j];
    return e;
}

/* One block x[len] of a stz format (not ggml) with its errors fed forward:
 * the block's scale (and minimum) chosen for x as stz_qf_quantize_row
 * chooses it (importance w, NULL: 1), then the codes in order, each
 * element's error fed to those after it (x changes); codes one per byte,
 * E[k] the fed error of element k. -1: the scale cannot be stored. */
int stz_qf_block_feedback(const stz_qformat *f, float *x, const float *w, size_t len, const float *U, size_t ldu,
                          uint8_t *codes, float *scale, float *min, float *E);
/* The same for one block of a ggml type (32 or 256 elements), written to
 * out as the type stores it. */
int stz_ggml_block_feedback(int type, float *x, const float *w, const float *U, size_t ldu, uint8_t *out, float *E);
/* An SVD decision's factors in out (INT8, as svd_factors.c stores them)
 * and their product in y (m x n; NULL: not kept). */
stz_status stz_svd_tensor(const stz_decision *d, const float *x, const float *w, size_t m, size_t n, stz_qmem *out,
                          float *y, stz_err *err);
/* stz_quantize_tensor's start, shared with error feedback: out's format for
 * decision d over x (checked finite; the U8 scales' base, nl-fit's
 * codebook), its values allocated, and sc (and mn, asym) for the blocks'
 * scales (and minimums) of every row; the caller frees sc and mn, and out
 * on an error. */
stz_status stz_qtensor_begin(const stz_decision *d, const float *x, const float *weights, uint64_t rows, uint64_t cols,
                             stz_qmem *out, float **sc, float **mn, stz_err *err);
/* Its end: the error of the quantized rows against x, measured as read
 * back (all: the values read back, rows x cols; NULL: not kept), and the
 * scales (and minimums) stored. */
stz_status stz_qtensor_end(const float *x, uint64_t rows, uint64_t cols, stz_qmem *out, float *sc, float *mn,
                           float *all, stz_err *err);
/* stz_quantize_tensor_y of a trellis decision, on `threads` threads (the
 * same bytes for any). */
stz_status stz_trellis_tensor(const stz_decision *d, const float *x, const float *weights, uint64_t rows, uint64_t cols,
                              int threads, stz_qmem *out, float *y, stz_err *err);
/* A trellis's rows x cols values x (whole segments, as a tensor of `rows`
 * rows cuts them) in format f (its scale base and importance set), on
 * `threads` threads: the codes into q (rows x stz_qf_bytes), the blocks'
 * scales into sc (rows x blocks), as stored. Rows are numbered from
 * `first` in messages. */
stz_status stz_trellis_rows(const stz_qformat *f, const float *x, size_t rows, size_t cols, size_t first, int threads,
                            uint8_t *q, float *sc, stz_err *err);
/* What a row that cannot be stored (-1 from a quantizer) means for f. */
const char *stz_qtensor_overflow(const stz_qformat *f);

/* n codes (one per byte) as a row's bit string (stz_qf_row_bytes), and back. */
void stz_qf_pack_codes(int bits, const uint8_t *codes, size_t n, uint8_t *q);
void stz_qf_unpack_codes(int bits, const uint8_t *q, size_t n, uint8_t *codes);

/* The stored scale nearest s, same sign (NAN: F16 cannot hold it). */
float stz_qf_store_scale(const stz_qformat *f, float s);

/* ---- the method "trellis" (quant/trellis.c) ---- */
#define STZ_TRELLIS_L    12  /* bits of a state */
#define STZ_TRELLIS_ROWS 128 /* rows of a segment; the last one takes the rest */

/* code() of a state: an integer in [-510, 510]. */
int stz_trellis_code(uint32_t state);
/* Segments of a matrix of `rows` rows; the rows [*begin, *end) of the one
 * holding row r. */
size_t stz_trellis_segments(uint64_t rows);
void stz_trellis_segment(uint64_t rows, uint64_t r, uint64_t *begin, uint64_t *end);
/* The stored scale of a block x[len] of a column of rows, for f: its RMS
 * over the standard deviation of code() / 256 (NAN: F16 cannot hold it). */
float stz_trellis_scale(const stz_qformat *f, const float *x, size_t len);

/* One thread's Viterbi buffers, for segments of up to 2 STZ_TRELLIS_ROWS rows. */
typedef struct stz_trellis_work stz_trellis_work;
stz_trellis_work *stz_trellis_work_new(void);
void stz_trellis_work_free(stz_trellis_work *w);
/* The circular stream of n (>= L / bits) codes nearest a segment's column
 * x, row t's values sc[t] * code() / 256: the codes one per byte, the values in y
 * (exactly as read back). */
void stz_trellis_column(stz_trellis_work *w, int bits, const float *x, const float *sc, size_t n, uint8_t *codes,
                        float *y);
/* Rows [r0, r0 + nr) of a trellis matrix of `rows` x cols values into y:
 * q holds the codes of rows q0 on (stz_qf_row_bytes each) including every
 * row of those rows' segments; scales: the nr rows' block scales. -1: out
 * of memory. */
int stz_trellis_dequantize_rows(const stz_qformat *f, const uint8_t *q, uint64_t q0, uint64_t rows, uint64_t r0,
                                size_t nr, const float *scales, size_t cols, float *y);

/* n per-block floats as the scale dtype stores them (U8: log codes under
 * the format's base). */
void stz_qf_store_scales(const stz_qformat *f, const float *v, size_t n, uint8_t *dst);

/* Up to 256 rows spread over a rows x cols tensor (at most 2^20 columns of
 * each), the sample nl-fit fits its codebook to: row k of the sample is
 * row k * (rows / nr). */
static inline size_t stz_qf_fit_rows(uint64_t rows) { return rows < 256 ? (size_t)rows : 256; }
static inline size_t stz_qf_fit_cols(uint64_t cols) { return cols > (1u << 20) ? (size_t)1 << 20 : (size_t)cols; }

/* nl-fit: fits f's codebook to those rows of a whole rows x cols tensor in
 * memory, as stz_quantize_file does (f has the decision's format and scale
 * base). STZ_E_NOMEM. */
stz_status stz_qf_fit_tensor(stz_qformat *f, const float *x, uint64_t rows, uint64_t cols, stz_err *err);

/* The factorisation an svd decision asks for, on one OpenBLAS thread
 * (OpenBLAS's results depend on its thread count). */
stz_svd_params stz_svd_params_of(const stz_decision *d);

/* A factorisation's INT8 factors as stz_quantize_file stores them: one F32
 * scale per row of U (m x r) and of Vh (r x n), one for S. */
void stz_svd_q8(const stz_svd_result *f, int8_t *Uq, float *Us, int8_t *Sq, float *s_scale, int8_t *Vq, float *Vs);
/* W (m x n) rebuilt from INT8 factors of rank r, as readers see it. */
stz_status stz_svd_q8_rebuild(const int8_t *Uq, const float *Us, const int8_t *Sq, float s_scale, const int8_t *Vq,
                              const float *Vs, size_t m, size_t n, size_t r, float *W, stz_err *err);
/* Bytes of INT8 factors at rank r with F32 per-row scales (S: one scale). */
static inline uint64_t stz_svd_bytes(uint64_t m, uint64_t n, uint64_t r) { return m * r + r + r * n + 4 * (m + r); }

/* ---- the quantized SafeTensors layout (docs/FORMAT.md), shared by the
 * writer (pipeline/) and the readers (model/qmodel.c, pipeline/dequantize.c) ---- */
#define STZ_QUANT_META_PREFIX  "stz.quant."
#define STZ_QUANT_VERSION      "1"
#define STZ_QUANT_INT4_PACKING "int4-pairs-high-nibble-first"
#define STZ_QUANT_MSB_PACKING  "bits-high-first"
#define STZ_QUANT_GGML_PACKING "ggml"     /* values: a llama.cpp type's rows as GGUF stores them */
#define STZ_QUANT_BATCH_BYTES  (4u << 20) /* input bytes converted at a time */

/* The stored form of a quantized tensor's values: I8 for the symmetric
 * uniform 8-bit methods, else U8 bit strings. */
static inline stz_dtype stz_quant_values_dtype(int bits, stz_qmethod m)
{
    return bits == 8 && (m == STZ_QMETHOD_ABSMAX || m == STZ_QMETHOD_MSE || m == STZ_QMETHOD_FULL) ? STZ_DTYPE_I8
                                                                                                   : STZ_DTYPE_U8;
}

struct stz_writer;
/* Copies tensor t's bytes from r to w; buf: STZ_QUANT_BATCH_BYTES. */
stz_status stz_quant_copy_tensor(struct stz_writer *w, const stz_reader *r, const stz_tensor *t, uint8_t *buf,
                                 stz_err *err);
#endif
