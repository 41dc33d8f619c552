/* Whole models compared tensor by tensor (stz eval): a row of figures for
 * each float tensor both have, the tensors one side lacks or holds in
 * another shape, and the parameter-weighted summary. */
#include "stz_eval.h"

#include <stdlib.h>
#include <string.h>

void stz_eval_result_free(stz_eval_result *r)
{
    for (size_t i = 0; r->problems && i < r->nproblems; i++)
        free(r->problems[i].why);
    free(r->problems);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

static stz_status add_problem(stz_eval_result *r, stz_eval_problem_kind kind, const char *name, const char *why,
                              stz_err *err)
{
    stz_eval_problem *p = realloc(r->problems, (r->nproblems + 1) * sizeof *p);
    if (!p)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the list of tensors");
    r->problems = p;
    p[r->nproblems] = (stz_eval_problem){kind, name, why ? strdup(why) : NULL};
    if (why && !p[r->nproblems].why)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the list of tensors");
    r->nproblems++, r->count[kind]++;
    return STZ_OK;
}

/* Tensor i of file fa of the original against its namesake in the
 * candidate: a row of figures, or a problem. */
static stz_status compare_one(const stz_model_set *a, const stz_model_set *b, size_t fa, size_t i, stz_eval_result *r,
                              stz_err *err)
{
    const stz_qtensor *ta = stz_qmodel_tensor(a->m[fa], i);
    size_t fb, j;
    r->params += ta->numel;
    if (!stz_model_set_find(b, ta->name, &fb, &j))
        return add_problem(r, STZ_EVAL_MISSING, ta->name, NULL, err);
    const stz_qtensor *tb = stz_qmodel_tensor(b->m[fb], j);
    if (stz_qtensor_quantized(tb))
        r->params_quantized += ta->numel;
    if (!stz_dtype_is_float(ta->dtype) || !stz_dtype_is_float(tb->dtype) || ta->dtype == STZ_DTYPE_C64) {
        r->compared++; /* integer tensors are compared by shape only */
        return STZ_OK;
    }
    stz_metrics m;
    stz_status st = stz_eval_tensor(a->m[fa], i, b->m[fb], j, &m, err);
    if (st == STZ_E_SHAPE || st == STZ_E_DTYPE)
        return add_problem(r, STZ_EVAL_MISMATCHED, ta->name, err->msg, err);
    if (st)
        return st;
    r->compared++;
    r->rows[r->nrows++] = (stz_eval_row){ta->name, stz_qtensor_action(tb, "kept"), ta->numel, m};
    return STZ_OK;
}

/* Row indices by cosine, lowest first; ties in the original's order. */
static int by_cosine(const void *x, const void *y, void *rows)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    double p = ((const stz_eval_row *)rows)[i].m.cosine, q = ((const stz_eval_row *)rows)[j].m.cosine;
    return p < q ? -1 : p > q ? 1 : (i > j) - (i < j);
}

/* The weighted mean and the minimum over the rows (in the original's
 * order), then the rows worst first (a stable order: the same table
 * from any sort). */
static stz_status summarize(stz_eval_result *r, stz_err *err)
{
    double wsum = 0, wtot = 0;
    r->min_cosine = 1;
    for (size_t i = 0; i < r->nrows; i++) {
        const stz_eval_row *w = &r->rows[i];
        wsum += w->m.cosine * (double)w->params, wtot += (double)w->params;
        r->min_cosine = w->m.cosine < r->min_cosine ? w->m.cosine : r->min_cosine;
    }
    r->weighted_cosine = wtot ? wsum / wtot : 1;
    size_t *ix = malloc((r->nrows + 1) * sizeof *ix);
    stz_eval_row *copy = malloc((r->nrows + 1) * sizeof *copy);
    int ok = ix && copy;
    if (ok) {
        for (size_t i = 0; i < r->nrows; i++)
            ix[i] = i;
        qsort_r(ix, r->nrows, sizeof *ix, by_cosine, r->rows);
        memcpy(copy, r->rows, r->nrows * sizeof *copy);
        for (size_t i = 0; i < r->nrows; i++)
            r->rows[i] = copy[ix[i]];
    }
    free(ix);
    free(copy);
    return ok ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for sorting %zu rows", r->nrows);
}

stz_status stz_eval_models(const stz_model_set *a, const stz_model_set *b, stz_progress_fn progress, void *user,
                           stz_eval_result *r, stz_err *err)
{
    memset(r, 0, sizeof *r);
    size_t na = 0;
    for (size_t f = 0; f < a->n; f++)
        na += stz_qmodel_count(a->m[f]);
    if (!(r->rows = calloc(na + 1, sizeof *r->rows)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu tensors' figures", na);
    for (size_t fa = 0; fa < a->n; fa++)
        for (size_t i = 0; i < stz_qmodel_count(a->m[fa]); i++) {
            size_t before = r->nrows;
            stz_status st = compare_one(a, b, fa, i, r, err);
            if (st)
                return st;
            if (r->nrows > before && progress && progress(user, r->nrows, na))
                return stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        }
    for (size_t fb = 0; fb < b->n; fb++)
        for (size_t j = 0; j < stz_qmodel_count(b->m[fb]); j++) {
            const char *name = stz_qmodel_tensor(b->m[fb], j)->name;
            size_t f, i;
            stz_status st =
                stz_model_set_find(a, name, &f, &i) ? STZ_OK : add_problem(r, STZ_EVAL_EXTRA, name, NULL, err);
            if (st)
                return st;
        }
    return summarize(r, err);
}

int stz_eval_passed(const stz_eval_result *r, double threshold, int allow_missing, size_t *below)
{
    size_t n = 0;
    for (size_t i = 0; i < r->nrows; i++)
        n += r->rows[i].m.cosine < threshold;
    if (below)
        *below = n;
    return !n && r->compared && !r->count[STZ_EVAL_MISMATCHED] &&
           (allow_missing || !(r->count[STZ_EVAL_MISSING] + r->count[STZ_EVAL_EXTRA]));
}
