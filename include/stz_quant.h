/*
 * stz_quant.h - what to do with each tensor (the policy's actions and
 * methods), conversions between float dtypes, and llama.cpp's tensor types
 * by name and size. The kernels that quantize rows and tensors are in
 * stz_kernels.h (experimental).
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
    /* one of llama.cpp's tensor types, stz_decision.ggml_type (quant/ggml_quant.c
     * chooses their scales): the values stored as GGUF stores them, exported
     * byte for byte; a new type is a row of quant/ggml_types.c, not a value here */
    STZ_ACTION_GGML = 8,
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
    int ggml_type;           /* STZ_ACTION_GGML: the llama.cpp type (STZ_GGML_*), else unused */
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

/* An action is a kind and, for STZ_ACTION_GGML, a llama.cpp type (type; -1
 * or any for the other kinds). Its name as policies write it: "int4",
 * "svd", "q4_k"... ("?" for none); its code width (int2..int8; a ggml
 * type's: q4_k 4, q6_k 6, f16 16; 0 for keep and svd); 1 for the block
 * quantizations (int2..int8, q4_0..iq4_xs), 0 for keep, svd, f16 and bf16. */
STZ_API const char *stz_action_name(stz_action a, int type);
STZ_API int stz_action_bits(stz_action a, int type);
STZ_API int stz_action_is_block(stz_action a, int type);
/* The action named `name` (as stz_action_name writes it) into *a and *type
 * (-1 unless a ggml type); 0, or -1 when none is (or name is NULL). */
STZ_API int stz_action_parse(const char *name, stz_action *a, int *type);
/* The i-th action a policy may name, in the order stz's messages list them
 * (stz's own kinds, then llama.cpp's types stz writes): its name, with *a and
 * *type; NULL past the last. */
STZ_API const char *stz_action_nth(size_t i, stz_action *a, int *type);
/* A decision's llama.cpp type (STZ_ACTION_GGML), else -1. */
static inline int stz_decision_ggml_type(const stz_decision *d)
{
    return d->action == STZ_ACTION_GGML ? d->ggml_type : -1;
}
/* A method's name: "absmax", "nl"... ("?" out of range). */
STZ_API const char *stz_qmethod_name(stz_qmethod m);
/* 1 when a matrix of `rows` rows can be stored with the method "trellis"
 * at `bits` bits: 2 to 4 bits, at least 12 / bits rows (a policy gives a
 * tensor with fewer the method "nl" instead). */
STZ_API int stz_trellis_fits(int bits, uint64_t rows);

/* Converts n elements of a float dtype (BF16, F16, F32, F64) to F32 and
 * back (round to nearest even). STZ_E_DTYPE for other dtypes. */
STZ_API stz_status stz_to_f32(stz_dtype d, const uint8_t *src, size_t n, float *dst, stz_err *err);
STZ_API stz_status stz_from_f32(stz_dtype d, const float *src, size_t n, uint8_t *dst, stz_err *err);

/* Bytes a tensor takes in the output under decision d (values plus
 * scales; header space not counted). */
STZ_API uint64_t stz_quant_bytes(const stz_tensor *t, const stz_decision *d);

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

/* The type llama.cpp's quantize falls back to when a row of n elements is
 * not whole blocks of `type`: the 32-block type for a 256-block one (q2_k,
 * q3_k, iq4_xs: iq4_nl; q4_k: q5_0; q5_k: q5_1; q6_k: q8_0), F16 when
 * not whole 32-blocks either; `type` itself when it fits. */
STZ_API int stz_ggml_fallback(int type, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
