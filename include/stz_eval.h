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

/* ---- whole models ------------------------------------------------------- */

typedef struct {
    const char *name;   /* the original's tensor name (valid while the sets are open) */
    const char *action; /* how the candidate stores it (stz_qtensor_action; "kept") */
    uint64_t params;
    stz_metrics m;
} stz_eval_row;

typedef enum {
    STZ_EVAL_MISSING,    /* in the original only */
    STZ_EVAL_EXTRA,      /* in the candidate only */
    STZ_EVAL_MISMATCHED, /* another shape or dtype */
} stz_eval_problem_kind;

typedef struct {
    stz_eval_problem_kind kind;
    const char *name; /* valid while the sets are open */
    char *why;        /* STZ_EVAL_MISMATCHED: the message saying how; else NULL */
} stz_eval_problem;

typedef struct {
    stz_eval_row *rows; /* float tensors compared, the lowest cosine first (ties: the original's order) */
    size_t nrows;
    stz_eval_problem *problems;        /* in the order found: the original's tensors, then the candidate's */
    size_t nproblems, count[3];        /* count[kind] */
    size_t compared;                   /* the rows and the integer tensors (compared by shape only) */
    double weighted_cosine;            /* the rows' cosines weighted by parameters (1 when no row) */
    double min_cosine;                 /* (1 when no row) */
    uint64_t params, params_quantized; /* the original's; of those, stored quantized by the candidate */
} stz_eval_result;

/* Compares every tensor of the original `a` with its namesake in the
 * candidate `b` (stz_eval_tensor), in the order of a's files and tensors;
 * tensors on one side only, or of another shape or dtype, are listed as
 * problems, not failures. progress (may be NULL) is told each row; non-zero
 * stops with STZ_E_INTERRUPTED. stz_eval_result_free after, on failure too. */
STZ_API stz_status stz_eval_models(const stz_model_set *a, const stz_model_set *b, stz_progress_fn progress, void *user,
                                   stz_eval_result *r, stz_err *err);
STZ_API void stz_eval_result_free(stz_eval_result *r);
/* stz eval's check: 1 when something was compared, no tensor has another
 * shape or dtype, none is on one side only (unless allow_missing) and no
 * cosine is below `threshold` (below -1: no threshold); *below (if not
 * NULL) gets how many are. */
STZ_API int stz_eval_passed(const stz_eval_result *r, double threshold, int allow_missing, size_t *below);

#ifdef __cplusplus
}
#endif
#endif
