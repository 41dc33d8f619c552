/*
 * stz_eval.h - how close a compressed model is to the original.
 *
 * Per tensor, accumulated in double over the elements: cosine similarity,
 * relative Frobenius error ||a - b|| / ||a||, SNR in dB (10 log10 of
 * ||a||^2 / ||a - b||^2) and the largest absolute difference.
 */
#ifndef STZ_EVAL_H
#define STZ_EVAL_H

#include "stz.h"
#include "stz_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double dot, aa, bb, dd, max_abs;
    uint64_t n;
} stz_metrics_acc;

typedef struct {
    double cosine;        /* 1 when both are all zero; 0 when only one is */
    double rel_frobenius; /* 0 when equal; infinity when a is zero and b is not */
    double snr_db;        /* infinity when equal */
    double max_abs;
    uint64_t n;
} stz_metrics;

/* Adds n element pairs (a = reference, b = candidate). */
STZ_API void stz_metrics_add(stz_metrics_acc *m, const float *a, const float *b, size_t n);
/* Adds the pairs counted in `from` to `into`. */
STZ_API void stz_metrics_merge(stz_metrics_acc *into, const stz_metrics_acc *from);
STZ_API stz_metrics stz_metrics_finish(const stz_metrics_acc *m);

/* Compares tensor ia of `ref` with tensor ib of `cand` (same shape and a
 * float dtype), reading both in row batches: memory does not grow with the
 * tensor. STZ_E_SHAPE if the shapes differ. */
STZ_API stz_status stz_eval_tensor(stz_qmodel *ref, size_t ia, stz_qmodel *cand, size_t ib, stz_metrics *out,
                                   stz_err *err);

#ifdef __cplusplus
}
#endif
#endif
