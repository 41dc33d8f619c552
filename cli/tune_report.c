/* stz tune's report: the per-tensor table, the Pareto curve, the budget
 * and what verification measured, as text or --json, and the SVG plot. */
#include "cmd_tune.h"

#include <cjson/cJSON.h>
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

stz_status cli_tune_write_plot(const char *path, const stz_tune_solution *s, const stz_tune_point *choice,
                               const stz_tune_check *m, const char *what, int force, stz_err *err)
{
    stz_tmpfile t;
    if (stz_tmp_beside(&t, path, "plot"))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", path);
    FILE *f = fopen(t.path, "w");
    double x0 = (double)s->curve[0].bytes, x1 = (double)s->curve[s->ncurve - 1].bytes, y1 = 0;
    for (size_t i = 0; i < s->ncurve; i++)
        y1 = s->curve[i].kl > y1 ? s->curve[i].kl : y1;
    if (m && m->fwd.kl_mean > y1)
        y1 = m->fwd.kl_mean;
    x1 = x1 > x0 ? x1 : x0 + 1, y1 = y1 > 0 ? y1 * 1.05 : 1;
    const double W = 640, H = 400, L = 80, B = 50, R = 20, T = 30;
#define PX(b) (L + ((double)(b)-x0) / (x1 - x0) * (W - L - R))
#define PY(k) (H - B - (k) / y1 * (H - B - T))
    if (f) {
        fprintf(f,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                W, H);
        fprintf(f, "<text x=\"%.0f\" y=\"18\">stz tune: %s size against predicted mean KL</text>\n", L, what);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R,
                H - B);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
        for (int k = 0; k <= 4; k++) {
            double bx = x0 + (x1 - x0) * k / 4, ky = y1 * k / 4;
            fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.3g MB</text>\n", PX(bx), H - B + 18,
                    bx / 1e6);
            fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 6, PY(ky) + 4, ky);
        }
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s bytes</text>\n", (L + W - R) / 2, H - 12,
                what);
        fprintf(f,
                "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">mean KL "
                "(nats/token)</text>\n",
                (T + H - B) / 2, (T + H - B) / 2);
        fputs("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"", f);
        for (size_t i = 0; i < s->ncurve; i++)
            fprintf(f, "%.1f,%.1f ", PX(s->curve[i].bytes), PY(s->curve[i].kl));
        fputs("\"/>\n", f);
        fprintf(f,
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#d62728\"><title>chosen (predicted)</title></circle>\n",
                PX(choice->bytes), PY(choice->kl));
        if (m)
            fprintf(f,
                    "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\">"
                    "<title>chosen (measured)</title></circle>\n",
                    PX(m->bytes), PY(m->fwd.kl_mean));
        fputs("</svg>\n", f);
    }
#undef PX
#undef PY
    return cli_tmp_finish(&t, f, path, force, err);
}

/* A GGUF written: its bits per weight over the tensors' data (llama.cpp's
 * count: the file less its header) and over the file; the smallest of
 * llama-quantize's files of this model at least as large (-1: none). */
static int gguf_figures(const stz_tune_result *r, const stz_tune_check *m, double *data_bpw, double *file_bpw)
{
    stz_tune_bpw(&r->T, m->bytes, data_bpw, file_bpw);
    int match = -1;
    for (int i = 0; i < STZ_GGUF_LIKE_COUNT; i++)
        if (r->gguf.like_bytes[i] >= m->bytes && (match < 0 || r->gguf.like_bytes[i] < r->gguf.like_bytes[match]))
            match = i;
    return match;
}

static void gguf_json(cJSON *d, const stz_tune_result *r, const stz_tune_check *m)
{
    double data_bpw, file_bpw;
    int match = gguf_figures(r, m, &data_bpw, &file_bpw);
    cJSON_AddNumberToObject(d, "bits_per_weight", data_bpw);
    cJSON_AddNumberToObject(d, "file_bits_per_weight", file_bpw);
    cJSON_AddNumberToObject(d, "header_bytes", (double)r->T.extra_bytes);
    cli_like_json(d, &r->gguf);
    if (match >= 0)
        cJSON_AddStringToObject(d, "like", stz_gguf_like_name(match));
}

static void gguf_text(const stz_tune_result *r, const stz_tune_check *m)
{
    double data_bpw, file_bpw;
    int match = gguf_figures(r, m, &data_bpw, &file_bpw);
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
    if (o->c.json) {
        cJSON *d = cJSON_CreateObject(), *ts = cJSON_CreateArray(), *cv = cJSON_CreateArray();
        cJSON_AddStringToObject(d, "model", model);
        cJSON_AddStringToObject(d, o->compress ? (o->p.gguf ? "gguf" : "container") : "policy", out);
        cJSON_AddStringToObject(d, "budget", stz_tune_goal_option(o->p.goal));
        cJSON_AddNumberToObject(d, r->kind == STZ_BUDGET_KL ? "max_kl" : "max_bytes", r->budget);
        cJSON_AddStringToObject(d, "tokens", r->source);
        cJSON_AddBoolToObject(d, "met", !(m && stz_tune_missed(r, m)));
        cJSON_AddNumberToObject(d, "predicted_bytes", (double)s->pred.bytes);
        cJSON_AddNumberToObject(d, "predicted_kl", s->pred.kl);
        if (m) {
            cJSON_AddNumberToObject(d, "measured_bytes", (double)m->bytes);
            cJSON_AddNumberToObject(d, "measured_kl", m->fwd.kl_mean);
            cJSON_AddNumberToObject(d, "measured_top1", m->fwd.top1);
            cJSON_AddNumberToObject(d, "measured_ppl_change", m->fwd.ppl_change);
            cJSON_AddBoolToObject(d, "corrected", m2 != NULL);
            cJSON_AddNumberToObject(d, "corrections", m2 ? corrections : 0);
        }
        if (m2) {
            cJSON_AddNumberToObject(d, "first_predicted_bytes", (double)first->bytes);
            cJSON_AddNumberToObject(d, "first_predicted_kl", first->kl);
            cJSON_AddNumberToObject(d, "first_measured_bytes", (double)m1->bytes);
            cJSON_AddNumberToObject(d, "first_measured_kl", m1->fwd.kl_mean);
        }
        for (size_t i = 0; i < T->nt; i++) {
            const stz_tune_tensor *t = &T->t[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", t->name);
            cJSON_AddNumberToObject(e, "params", (double)t->params);
            cJSON_AddStringToObject(e, "choice", t->tunable ? T->cand[t->choice].name : "keep");
            cJSON_AddNumberToObject(e, "bytes", (double)t->bytes[t->tunable ? t->choice : 0]);
            if (t->tunable) {
                cJSON_AddNumberToObject(e, "rel_error", t->norm2 > 0 ? sqrt(t->err2[t->choice] / t->norm2) : 0);
                cJSON_AddNumberToObject(e, "sensitivity", t->sens);
                cJSON_AddNumberToObject(e, "predicted_kl", t->sens * t->err2[t->choice]);
            } else {
                cJSON_AddStringToObject(e, "kept_because", t->why);
            }
            cJSON_AddItemToArray(ts, e);
        }
        cJSON_AddItemToObject(d, "tensors", ts);
        for (size_t i = 0; i < s->ncurve; i++) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddNumberToObject(p, "bytes", (double)s->curve[i].bytes);
            cJSON_AddNumberToObject(p, "kl", s->curve[i].kl);
            cJSON_AddItemToArray(cv, p);
        }
        cJSON_AddItemToObject(d, "pareto", cv);
        if (o->compress && o->p.gguf && m)
            gguf_json(d, r, m);
        return cli_print_json(d);
    }
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
