/* stz tune's report: the per-tensor table, the Pareto curve, the budget
 * and what verification measured, as text (--json: the library's,
 * stz_tune_report_json). */
#include "cmd_tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reporting -------------------------------------------------------------------- */

/* Up to `want` points of the curve, spread evenly over its bytes. */
static size_t pick_points(const stz_tune_solution *s, size_t want, size_t *idx)
{
    size_t n = 0;
    if (!s->ncurve)
        return 0;
    uint64_t lo = s->curve[0].bytes, hi = s->curve[s->ncurve - 1].bytes;
    for (size_t i = 0; i < s->ncurve && n < want; i++) {
        double target = lo + (double)(hi - lo) * (double)n / (double)(want - 1);
        if ((double)s->curve[i].bytes >= target || i + 1 == s->ncurve)
            idx[n++] = i;
    }
    return n;
}

static void gguf_text(const stz_tune_result *r, const stz_tune_check *m)
{
    double data_bpw, file_bpw;
    stz_tune_bpw(&r->T, m->bytes, &data_bpw, &file_bpw);
    int match = stz_tune_like_nearest(r, m->bytes);
    char a[32], b[32];
    printf(
        "bits per weight: %.3f over the tensors' data (llama.cpp's count), %.3f over the file (header %s "
        "bytes)\n",
        data_bpw, file_bpw, cli_commas(a, r->T.extra_bytes));
    if (match >= 0)
        printf("llama.cpp's nearest file at least as large: llama-quantize %s, %s bytes\n", stz_gguf_like_name(match),
               cli_commas(b, r->gguf.like_bytes[match]));
}

/* Longer than most: the --json document or the text report, one entry or
 * line per figure, from the same figures and in the same order. */
int cli_tune_report(const tune_opts *o, const char *model, const char *out, const stz_tune_result *r)
{
    const stz_tune *T = &r->T;
    const stz_tune_solution *s = &r->sol;
    const stz_tune_point *first = &r->first;
    const stz_tune_check *m1 = r->checks ? &r->check[0] : NULL, *m2 = r->checks > 1 ? &r->check[r->checks - 1] : NULL;
    int corrections = r->checks - 1;
    size_t idx[16], np = pick_points(s, 12, idx);
    const stz_tune_check *m = m2 ? m2 : m1;
    char a[32], b[32];
    if (o->c.json)
        return cli_print_json_text(stz_tune_report_json(&o->p, model, out, o->compress, r));
    if (o->c.quiet)
        return CLI_OK;
    int w = 14; /* the choice column: as wide as the longest candidate's name */
    for (size_t c = 0; c < T->ncand; c++)
        w = strlen(T->cand[c].name) > (size_t)w ? (int)strlen(T->cand[c].name) : w;
    printf("%-48s %-*s %12s %9s %11s %11s\n", "tensor", w, "choice", "bytes", "rel.err", "KL/err^2", "pred. KL");
    for (size_t i = 0; i < T->nt; i++) {
        const stz_tune_tensor *t = &T->t[i];
        if (t->tunable)
            printf("%-48s %-*s %12s %9.4f %11.4g %11.3g\n", t->name, w, T->cand[t->choice].name,
                   cli_commas(a, t->bytes[t->choice]), t->norm2 > 0 ? sqrt(t->err2[t->choice] / t->norm2) : 0, t->sens,
                   t->sens * t->err2[t->choice]);
        else
            printf("%-48s %-*s %12s   (kept: %s)\n", t->name, w, "keep", cli_commas(a, t->bytes[0]), t->why);
    }
    printf("\nPareto curve (predicted; %zu points, %zu shown):\n%14s %12s\n", s->ncurve, np, "bytes", "mean KL");
    for (size_t i = 0; i < np; i++)
        printf("%14s %12.4g\n", cli_commas(a, s->curve[idx[i]].bytes), s->curve[idx[i]].kl);
    printf("\nbudget %s: %s\n", stz_tune_goal_option(o->p.goal),
           r->kind == STZ_BUDGET_KL ? (snprintf(b, sizeof b, "mean KL <= %g", r->budget), b)
                                    : (snprintf(b, sizeof b, "<= %.0f bytes", r->budget), b));
    if (m2)
        printf("first choice:  predicted %s bytes, KL %.4g; measured %s bytes, KL %.4g: missed, corrected %s\n",
               cli_commas(a, first->bytes), first->kl, cli_commas(b, m1->bytes), m1->fwd.kl_mean,
               corrections > 1 ? "twice" : "once");
    printf("choice:        predicted %s bytes, KL %.4g", cli_commas(a, s->pred.bytes), s->pred.kl);
    if (m)
        printf("; measured %s bytes (%+.2f%%), KL %.4g (%+.1f%%), top-1 %.2f%%, perplexity %+.2f%%",
               cli_commas(b, m->bytes), 100.0 * ((double)m->bytes / (double)s->pred.bytes - 1), m->fwd.kl_mean,
               s->pred.kl > 0 ? 100.0 * (m->fwd.kl_mean / s->pred.kl - 1) : 0.0, 100 * m->fwd.top1,
               100 * m->fwd.ppl_change);
    printf("\n%s: %s\n", o->compress ? (o->p.gguf ? "gguf" : "container") : "policy", out);
    if (o->compress && o->p.gguf && m)
        gguf_text(r, m);
    return CLI_OK;
}
