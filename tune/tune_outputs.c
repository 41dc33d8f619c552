/* What a tune run reports and writes beside its choice: the --json
 * document (the per-tensor choices, the curve, the budget and what
 * verification measured, or the closest point when the budget is not met),
 * the policy file and the SVG plot of the curve. The program and Python
 * print and write the same through these. */
#include "core/stz_core.h"
#include "stz_export.h"
#include "stz_tune.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the --json document ------------------------------------------------------------ */

int stz_tune_like_nearest(const stz_tune_result *r, uint64_t bytes)
{
    int match = -1;
    for (int i = 0; i < STZ_GGUF_LIKE_COUNT; i++)
        if (r->gguf.like_bytes[i] >= bytes && (match < 0 || r->gguf.like_bytes[i] < r->gguf.like_bytes[match]))
            match = i;
    return match;
}

static void put_gguf(cJSON *d, const stz_tune_result *r, const stz_tune_check *m)
{
    double data_bpw, file_bpw;
    stz_tune_bpw(&r->T, m->bytes, &data_bpw, &file_bpw);
    int match = stz_tune_like_nearest(r, m->bytes);
    cJSON_AddNumberToObject(d, "bits_per_weight", data_bpw);
    cJSON_AddNumberToObject(d, "file_bits_per_weight", file_bpw);
    cJSON_AddNumberToObject(d, "header_bytes", (double)r->T.extra_bytes);
    stz_gguf_like_json(d, &r->gguf);
    if (match >= 0)
        cJSON_AddStringToObject(d, "like", stz_gguf_like_name(match));
}

/* One tensor's entry: its choice, bytes, error, sensitivity and share of
 * the predicted KL, or why it is kept. */
static cJSON *tensor_entry(const stz_tune *T, const stz_tune_tensor *t)
{
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
    return e;
}

/* The budget not met: the closest point. */
static cJSON *unmet_doc(const stz_tune_run_params *p, const char *model, const stz_tune_result *r)
{
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "model", model);
    cJSON_AddStringToObject(d, "budget", stz_tune_goal_option(p->goal));
    cJSON_AddNumberToObject(d, r->kind == STZ_BUDGET_KL ? "max_kl" : "max_bytes", r->budget);
    cJSON_AddBoolToObject(d, "met", 0);
    cJSON_AddNumberToObject(d, "closest_bytes", (double)r->sol.pred.bytes);
    cJSON_AddNumberToObject(d, "closest_kl", r->sol.pred.kl);
    return d;
}

/* Longer than most: one entry per figure, in the text report's order. */
static cJSON *met_doc(const stz_tune_run_params *p, const char *model, const char *out, int compress,
                      const stz_tune_result *r)
{
    const stz_tune *T = &r->T;
    const stz_tune_solution *s = &r->sol;
    const stz_tune_check *m1 = r->checks ? &r->check[0] : NULL, *m2 = r->checks > 1 ? &r->check[r->checks - 1] : NULL;
    const stz_tune_check *m = m2 ? m2 : m1;
    cJSON *d = cJSON_CreateObject(), *ts = cJSON_CreateArray(), *cv = cJSON_CreateArray();
    cJSON_AddStringToObject(d, "model", model);
    cJSON_AddStringToObject(d, compress ? (p->gguf ? "gguf" : "container") : "policy", out);
    cJSON_AddStringToObject(d, "budget", stz_tune_goal_option(p->goal));
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
        cJSON_AddNumberToObject(d, "corrections", m2 ? r->checks - 1 : 0);
    }
    if (m2) {
        cJSON_AddNumberToObject(d, "first_predicted_bytes", (double)r->first.bytes);
        cJSON_AddNumberToObject(d, "first_predicted_kl", r->first.kl);
        cJSON_AddNumberToObject(d, "first_measured_bytes", (double)m1->bytes);
        cJSON_AddNumberToObject(d, "first_measured_kl", m1->fwd.kl_mean);
    }
    for (size_t i = 0; i < T->nt; i++)
        stz_json_put(ts, NULL, tensor_entry(T, &T->t[i]));
    stz_json_put(d, "tensors", ts);
    for (size_t i = 0; i < s->ncurve; i++) {
        cJSON *pt = cJSON_CreateObject();
        cJSON_AddNumberToObject(pt, "bytes", (double)s->curve[i].bytes);
        cJSON_AddNumberToObject(pt, "kl", s->curve[i].kl);
        stz_json_put(cv, NULL, pt);
    }
    stz_json_put(d, "pareto", cv);
    if (compress && p->gguf && m)
        put_gguf(d, r, m);
    return d;
}

char *stz_tune_report_json(const stz_tune_run_params *p, const char *model, const char *out, int compress,
                           const stz_tune_result *r)
{
    stz_json_begin();
    cJSON *d = r->sol.met ? met_doc(p, model, out, compress, r) : unmet_doc(p, model, r);
    char *s = d ? cJSON_Print(d) : NULL;
    cJSON_Delete(d);
    if (s && stz_json_failed()) /* a document with items missing is not given */
        free(s), s = NULL;
    return s;
}

/* ---- files ---------------------------------------------------------------------------- */

stz_status stz_tune_write_policy(const char *path, const stz_tune_result *r, int force, stz_err *err)
{
    if (!r->policy)
        return stz_err_set(err, STZ_E_ARG, "%s: the budget was not met: no policy to write", path);
    stz_tmpfile t;
    if (stz_tmp_beside(&t, path, "policy"))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", path);
    FILE *f = fopen(t.path, "w");
    if (f) /* a failed write shows in ferror */
        fputs(r->policy, f), fputc('\n', f);
    return stz_tmp_finish(&t, f, path, force, err);
}

stz_status stz_tune_write_plot(const char *path, const stz_tune_result *r, int gguf, int force, stz_err *err)
{
    const stz_tune_solution *s = &r->sol;
    const stz_tune_point *choice = &s->pred;
    const stz_tune_check *m = r->checks ? &r->check[r->checks - 1] : NULL;
    const char *what = gguf ? "GGUF file" : "container";
    if (!s->ncurve)
        return stz_err_set(err, STZ_E_ARG, "%s: no curve to plot", path);
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
    return stz_tmp_finish(&t, f, path, force, err);
}
