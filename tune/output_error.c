/* stz tune with error feedback (stz_tune_feedback, stz_tune.h): the
 * candidates of every matrix the forward pass reaches measured again by
 * the layer's output error, feedback candidates quantized with feedback.
 * Plain rounding and feedback then compare on what the layer computes,
 * which is what feedback lowers (its weights' own error grows). */
#include "core/stz_core.h"
#include "stz_kernels.h"
#include "quant/quant_tensor.h"
#include "stz_feedback.h"
#include "stz_imatrix.h"
#include "tune_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    stz_tune *T;
    const stz_tune_params *p;
    const char *tied; /* the tied head's name, or NULL */
} fed_run;

static int fed_wants(void *user, const stz_qtensor *q)
{
    const fed_run *R = user;
    const stz_tune_tensor *t = stz_tune_find(R->T, q->name);
    return t && t->tunable;
}

/* Candidate c of t measured on W (Y: scratch for its values): feedback's
 * output error and bytes, or plain rounding's output error (its bytes are
 * the measure's); `plain`: plain rounding's output error even for a
 * feedback candidate, into out. */
static stz_status measure_one(const fed_run *R, stz_tune_tensor *t, size_t c, int plain, const float *W, const float *w,
                              const float *H, float *Y, double *out, stz_err *err)
{
    stz_decision d = R->T->cand[c].d;
    uint64_t rows = t->rows, cols = t->params / t->rows, raw;
    d.feedback &= !plain;
    int fed = d.feedback && stz_action_is_block(d.action, d.ggml_type);
    stz_qmem q;
    stz_err sub;
    stz_status st = fed ? stz_quantize_tensor_feedback(&d, W, H, NULL, rows, cols, R->p->threads, &q, NULL, &sub)
                        : stz_quantize_tensor_y(&d, W, w, rows, cols, &q, Y, &sub);
    if (st == STZ_E_NUMERIC) { /* scales beyond F16: not a choice for this tensor */
        t->bytes[c] = UINT64_MAX, t->err2[c] = INFINITY;
        return STZ_OK;
    }
    if (st)
        return stz_err_set(err, st, "tensor '%s', candidate %s: %s", t->name, R->T->cand[c].name, sub.msg);
    if (fed) {
        *out = q.err_out;
        st = stz_tune_cand_bytes(R->T, t, c, &q, &raw, err);
    } else {
        st = stz_quant_output_error(W, Y, H, rows, cols, R->p->threads, out, err);
    }
    stz_qmem_free(&q);
    return st;
}

static stz_status fed_matrix(void *user, const stz_qtensor *q, const float *W, const float *H, const float *D, float *y,
                             stz_err *err)
{
    (void)D, (void)y; /* no rewrite: the inputs are the model's own */
    const fed_run *R = user;
    stz_tune_tensor *t = stz_tune_find(R->T, q->name);
    const float *w = NULL;
    float *Y = calloc(q->numel + 1, sizeof *Y);
    int tied = R->tied && !strcmp(R->tied, q->name);
    if (tied && !t->plain_out) /* feedback's gain, for the embedding's probes (stz_tune_probe) */
        t->plain_out = calloc(R->T->ncand, sizeof *t->plain_out);
    stz_status st =
        Y && (!tied || t->plain_out) ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for tensor '%s'", q->name);
    if (!st && R->p->imatrix) /* plain candidates quantize as the measure did */
        st = stz_imatrix_find(R->p->imatrix, q->name, q->cols, &w, err);
    if (!st) /* the output's own squared norm: Y is all zeros */
        st = stz_quant_output_error(W, Y, H, q->rows, q->cols, R->p->threads, &t->norm2, err);
    for (size_t c = 0; !st && c < R->T->ncand; c++) {
        if (R->T->cand[c].d.action == STZ_ACTION_KEEP || t->bytes[c] == UINT64_MAX)
            continue;
        if (stz_interrupt_pending()) /* a layer's candidates take minutes on large models */
            st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        else
            st = measure_one(R, t, c, 0, W, w, H, Y, &t->err2[c], err);
        if (!st && t->plain_out && R->T->cand[c].d.feedback)
            st = measure_one(R, t, c, 1, W, w, H, Y, &t->plain_out[c], err);
    }
    t->fed = !st;
    free(Y);
    return st;
}

stz_status stz_tune_feedback(stz_tune *T, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                             const size_t *lens, const stz_tune_params *p, stz_err *err)
{
    int tied;
    const char *emb = stz_fwd_embedding(m, &tied);
    fed_run R = {T, p, tied ? emb : NULL};
    stz_gram_visitor v = {fed_wants, fed_matrix, &R, 0};
    return stz_forward_grams(m, tokens, nseq, stride, lens, &v, p->progress, p->progress_user, err);
}
