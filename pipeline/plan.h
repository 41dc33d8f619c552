/* The quantizing writer's per-tensor plan (made in plan.c), shared by
 * quantize.c (block quantization, the file) and svd_factors.c (SVD
 * factors). Not installed. */
#ifndef STZ_QUANT_PLAN_H
#define STZ_QUANT_PLAN_H

#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_pipeline.h"
#include "stz_safetensors.h"
#include "quant/quant_tensor.h"
#include "stz_eval.h"

typedef struct {
    stz_decision d;
    int bits;                 /* 0 kept, 8, 4 */
    uint64_t rows, cols;      /* cols = last dimension (whole tensor for 1-D); transposed: the first */
    int transposed;           /* a matrix stored (in, out) (GPT-2's Conv1D) quantized as its transpose */
    float *held;              /* transposed: its transpose as F32 while it is read (stz_quant_plan_hold) */
    uint64_t nblocks;         /* per row */
    char *scales_name;        /* NULL: single scale, in metadata */
    char *mins_name;          /* asym: NAME.mins (NULL: single block) */
    float scalar, scalar_min; /* the single scale (and minimum) */
    stz_qformat fmt;          /* bits, method, block, scales (and base, levels) */
    /* svd: INT8 factors, made before the header is written */
    int svd;
    size_t rank;
    double rel_error;        /* of the factorisation, before quantization */
    int8_t *Uq, *Sq, *Vq;    /* m x r, r, r x n */
    float *Us, *Vs, s_scale; /* per-row scales of U and Vh; S's one scale (NULL when not held) */
    uint64_t factors_hash;   /* XXH3 of the INT8 factors and scales, to check a second factorisation */
    char *fname[5];          /* NAME.U, .U.scales, .S, .Vh, .Vh.scales */
    double cosine;           /* of the dequantized tensor, measured while quantizing */
} stz_quant_plan;

/* Buffers of one quantizing thread, and the row batch it holds. */
typedef struct {
    uint8_t *in, *q; /* raw input; quantized rows */
    float *f, *y;    /* input as F32; one row dequantized */
    size_t rows;     /* rows in the batch held */
    stz_metrics_acc acc;
} qslot;

/* The kernel format of x's decision: bits, method, block, scale storage. */
void stz_quant_plan_format(stz_quant_plan *x);
/* What the format needs from the whole tensor before any row is
 * quantized: U8 scales, its largest magnitude (the base); nl-fit, a
 * codebook fitted to up to 256 rows spread over it. With "nonfinite":
 * "keep", the same pass looks for NaN/Inf, and a tensor holding any
 * becomes kept (x->bits 0). Reads with the slots'
 * buffers on `threads` threads. */
stz_status stz_quant_plan_prepare(const stz_reader *r, const stz_tensor *t, stz_quant_plan *x, qslot *slot, int threads,
                                  stz_err *err);
/* A transposed plan's tensor read whole and held transposed (x->held),
 * until stz_quant_plan_release; nothing for others. */
stz_status stz_quant_plan_hold(const stz_reader *r, const stz_tensor *t, stz_quant_plan *x, stz_err *err);
void stz_quant_plan_release(stz_quant_plan *x);
/* Rows [row, row + nr) of the plan's matrix (x->cols floats each) into f:
 * read through buf (nr rows of the tensor's bytes), or from x->held. */
stz_status stz_quant_plan_rows(const stz_reader *r, const stz_tensor *t, const stz_quant_plan *x, uint64_t row,
                               size_t nr, uint8_t *buf, float *f, stz_err *err);
/* A tensor whose rule keeps it when it holds NaN/Inf, and which does. */
void stz_quant_plan_keep_nonfinite(stz_quant_plan *x);
void stz_quant_plan_free(stz_quant_plan *x);
struct cJSON;
/* Stores a tensor's entry o (then deleted) as __metadata__["stz.quant.NAME"];
 * STZ_E_NOMEM names "its <what> metadata". After stz_json_begin. */
stz_status stz_quant_put_meta(stz_writer *w, const stz_tensor *t, struct cJSON *o, const char *what, stz_err *err);
/* Factors every SVD decision of the file (pl[0..nt)) on up to p->threads
 * threads, one tensor each with one OpenBLAS thread (the same bits for any
 * -T), within STZ_SVD_WORK_BYTES; picks ranks or fallbacks, and holds the
 * INT8 factors up to p->svd_hold_bytes. */
#define STZ_SVD_WORK_BYTES (1ull << 30)
stz_status stz_quant_plan_svd(const stz_quant_params *p, const stz_reader *r, stz_quant_plan *pl, size_t nt,
                              stz_err *err);
stz_status stz_quant_declare_svd(stz_writer *w, const stz_tensor *t, const stz_quant_plan *x, stz_err *err);
/* Writes x's factors: held, or factored again (checked to be the same). */
stz_status stz_quant_write_svd(const stz_reader *r, const stz_tensor *t, stz_writer *w, stz_quant_plan *x, uint8_t *buf,
                               stz_err *err);

#endif /* STZ_QUANT_PLAN_H */
