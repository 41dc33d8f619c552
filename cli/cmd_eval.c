/* stz eval: how close a candidate model is to the original. */
#include "cli.h"
#include "stz_eval.h"
#include "stz_model.h"
#include "stz_pipeline.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char eval_help[] =
    "usage: stz eval ORIGINAL CANDIDATE [options]\n\n"
    "Compares every tensor of CANDIDATE (a quantized file, dequantized on the\n"
    "fly one tensor at a time, a plain one, or an .stz container of either,\n"
    "unpacked to a temporary file first) with ORIGINAL, matched by name:\n"
    "cosine similarity, relative Frobenius error, SNR (dB) and largest absolute\n"
    "error, worst first; then the parameter-weighted mean and minimum cosine\n"
    "and the share of parameters quantized. Either side may be a model\n"
    "directory (sharded with model.safetensors.index.json, or holding\n"
    "model.safetensors).\n\n"
    "A tensor found on one side only, or with a different shape, fails the\n"
    "check (exit 3, named) unless --allow-missing; comparing nothing always\n"
    "fails.\n\n"
    "  --forward         compare what the models output instead: KL divergence,\n"
    "                    top-1 agreement, perplexity (stz eval --forward --help)\n"
    "  --threshold X     list tensors with cosine below X; exit status 3 if any\n"
    "  --allow-missing   tensors on one side only do not fail the check\n"
    "  --json            print everything as JSON\n"
    "  --csv             print one CSV row per tensor\n"
    "  -q, --quiet       only the summary (and the tensors below --threshold)\n"
    "  -h, --help        this text\n\n"
    "Exit status: 0 ok, 1 error, 2 usage, 3 the check failed (a tensor below\n"
    "--threshold, a tensor missing or mismatched, or nothing compared).\n";

typedef struct {
    const char *name;
    const char *action;
    uint64_t numel;
    stz_metrics m;
} eval_row;

static int by_cosine(const void *a, const void *b)
{
    double x = ((const eval_row *)a)->m.cosine, y = ((const eval_row *)b)->m.cosine;
    return (x > y) - (x < y);
}

static cJSON *num(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

/* One comparison: the options, the two sides, and what was found. */
typedef struct {
    double threshold; /* -2: none */
    int json, csv, quiet, allow_missing;
    const char *pa, *pb;
    stz_model_set A, B;
    eval_row *rows;
    size_t na, nr;
    cJSON *missing, *extra, *mismatched; /* names */
    size_t nmissing, nextra, nmismatch, done_n;
    double wsum, wtot, minc;
    uint64_t params, pq;
} eval_run;

/* Options into e; CLI_OK, or the usage error's exit status in *rc. */
static int eval_options(eval_run *e, int argc, char **argv, int *rc)
{
    enum { O_THRESHOLD = 256, O_JSON, O_CSV, O_ALLOW };
    static const struct option opts[] = {{"threshold", required_argument, 0, O_THRESHOLD},
                                         {"allow-missing", no_argument, 0, O_ALLOW},
                                         {"json", no_argument, 0, O_JSON},
                                         {"csv", no_argument, 0, O_CSV},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case O_THRESHOLD:
            e->threshold = strtod(optarg, &end);
            if (*end || !*optarg || e->threshold < -1 || e->threshold > 1)
                return *rc = cli_usage_error("eval", "--threshold takes a cosine in [-1, 1], not '%s'", optarg), 1;
            break;
        case O_ALLOW: e->allow_missing = 1; break;
        case O_JSON: e->json = 1; break;
        case O_CSV: e->csv = 1; break;
        case 'q': e->quiet = 1; break;
        case 'h': return *rc = (fputs(eval_help, stdout), CLI_OK), 1;
        default: return *rc = cli_bad_option("eval"), 1;
        }
    }
    if (optind != argc - 2)
        return *rc = cli_usage_error("eval", "expected ORIGINAL and CANDIDATE"), 1;
    if (e->json && e->csv)
        return *rc = cli_usage_error("eval", "--json and --csv conflict"), 1;
    e->pa = argv[optind], e->pb = argv[optind + 1];
    return 0;
}

/* Tensor i of file fa of the original against its namesake in the
 * candidate: a row of figures, or one of the lists. */
static stz_status compare_one(eval_run *e, size_t fa, size_t i, stz_err *err)
{
    stz_qmodel *a = e->A.m[fa];
    const stz_qtensor *ta = stz_qmodel_tensor(a, i);
    size_t fb, j;
    e->params += ta->numel;
    if (!stz_model_set_find(&e->B, ta->name, &fb, &j)) {
        cJSON_AddItemToArray(e->missing, cJSON_CreateString(ta->name));
        fprintf(stderr, "stz: %s: tensor '%s' is missing from %s\n", e->allow_missing ? "warning" : "check failed",
                ta->name, e->pb);
        e->nmissing++;
        return STZ_OK;
    }
    stz_qmodel *b = e->B.m[fb];
    const stz_qtensor *tb = stz_qmodel_tensor(b, j);
    if (cli_quantized(tb))
        e->pq += ta->numel;
    if (!stz_dtype_is_float(ta->dtype) || !stz_dtype_is_float(tb->dtype) || ta->dtype == STZ_DTYPE_C64) {
        e->done_n++; /* integer tensors are compared by shape only */
        return STZ_OK;
    }
    stz_metrics m;
    stz_status s = stz_eval_tensor(a, i, b, j, &m, err);
    if (s == STZ_E_SHAPE || s == STZ_E_DTYPE) {
        cJSON_AddItemToArray(e->mismatched, cJSON_CreateString(ta->name));
        fprintf(stderr, "stz: check failed: %s\n", err->msg);
        e->nmismatch++;
        return STZ_OK;
    }
    if (s)
        return s;
    e->done_n++;
    e->rows[e->nr++] = (eval_row){ta->name, cli_action_of(tb, "kept"), ta->numel, m};
    e->wsum += m.cosine * (double)ta->numel, e->wtot += (double)ta->numel;
    e->minc = m.cosine < e->minc ? m.cosine : e->minc;
    return STZ_OK;
}

/* Every tensor of the original, then the candidate's that it lacks. */
static stz_status compare_all(eval_run *e, stz_err *err)
{
    cli_progress prog;
    cli_progress_init(&prog, "eval", e->quiet || e->json || e->csv);
    for (size_t fa = 0; fa < e->A.n; fa++)
        for (size_t i = 0; i < stz_qmodel_count(e->A.m[fa]); i++) {
            size_t before = e->nr;
            stz_status st = compare_one(e, fa, i, err);
            if (st)
                return st;
            if (e->nr > before && cli_progress_cb(&prog, e->nr, e->na))
                return stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        }
    for (size_t fb = 0; fb < e->B.n; fb++)
        for (size_t j = 0; j < stz_qmodel_count(e->B.m[fb]); j++) {
            const char *name = stz_qmodel_tensor(e->B.m[fb], j)->name;
            size_t f, i;
            if (!stz_model_set_find(&e->A, name, &f, &i)) {
                cJSON_AddItemToArray(e->extra, cJSON_CreateString(name));
                fprintf(stderr, "stz: %s: tensor '%s' is only in %s\n", e->allow_missing ? "warning" : "check failed",
                        name, e->pb);
                e->nextra++;
            }
        }
    cli_progress_end(&prog);
    return STZ_OK;
}

static int eval_print_json(eval_run *e, int failed)
{
    double wmean = e->wtot ? e->wsum / e->wtot : 1, share = e->params ? (double)e->pq / (double)e->params : 0;
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    for (size_t i = 0; i < e->nr; i++) {
        const eval_row *r = &e->rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", r->name);
        cJSON_AddStringToObject(o, "action", r->action);
        cJSON_AddNumberToObject(o, "params", (double)r->numel);
        cJSON_AddItemToObject(o, "cosine", num(r->m.cosine));
        cJSON_AddItemToObject(o, "rel_frobenius", num(r->m.rel_frobenius));
        cJSON_AddItemToObject(o, "snr_db", num(r->m.snr_db));
        cJSON_AddItemToObject(o, "max_abs_error", num(r->m.max_abs));
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddStringToObject(doc, "original", e->pa);
    cJSON_AddStringToObject(doc, "candidate", e->pb);
    cJSON_AddItemToObject(doc, "tensors", arr);
    if (e->nr) {
        cJSON_AddNumberToObject(doc, "weighted_cosine", wmean);
        cJSON_AddNumberToObject(doc, "min_cosine", e->minc);
    } else { /* nothing compared: no figure to give */
        cJSON_AddNullToObject(doc, "weighted_cosine");
        cJSON_AddNullToObject(doc, "min_cosine");
    }
    cJSON_AddNumberToObject(doc, "params_quantized_share", share);
    cJSON_AddNumberToObject(doc, "tensors_compared", (double)e->done_n);
    cJSON_AddItemToObject(doc, "missing_from_candidate", e->missing);
    cJSON_AddItemToObject(doc, "only_in_candidate", e->extra);
    cJSON_AddItemToObject(doc, "mismatched", e->mismatched);
    e->missing = e->extra = e->mismatched = NULL;
    if (e->threshold > -2) {
        cJSON *bl = cJSON_CreateArray();
        for (size_t i = 0; i < e->nr; i++)
            if (e->rows[i].m.cosine < e->threshold)
                cJSON_AddItemToArray(bl, cJSON_CreateString(e->rows[i].name));
        cJSON_AddNumberToObject(doc, "threshold", e->threshold);
        cJSON_AddItemToObject(doc, "below_threshold", bl);
    }
    cJSON_AddBoolToObject(doc, "passed", !failed);
    return cli_print_json(doc);
}

static void eval_print_csv(const eval_run *e)
{
    printf("name,action,params,cosine,rel_frobenius,snr_db,max_abs_error\n");
    for (size_t i = 0; i < e->nr; i++) {
        const eval_row *r = &e->rows[i];
        printf("\"%s\",%s,%llu,%.9f,%.9g,%.4f,%.9g\n", r->name, r->action, (unsigned long long)r->numel, r->m.cosine,
               r->m.rel_frobenius, r->m.snr_db, r->m.max_abs);
    }
}

static void eval_print_table(const eval_run *e, size_t below)
{
    double wmean = e->wtot ? e->wsum / e->wtot : 1, share = e->params ? (double)e->pq / (double)e->params : 0;
    size_t w = 4;
    for (size_t i = 0; i < e->nr; i++)
        w = strlen(e->rows[i].name) > w ? strlen(e->rows[i].name) : w;
    w = w > 60 ? 60 : w;
    if (!e->quiet)
        printf("%-*s  %-6s  %10s  %10s  %8s  %10s\n", (int)w, "name (worst first)", "action", "cosine", "rel.err",
               "SNR dB", "max |err|");
    for (size_t i = 0; i < e->nr; i++) {
        const eval_row *r = &e->rows[i];
        if (!e->quiet || r->m.cosine < e->threshold)
            printf("%-*s  %-6s  %10.6f  %10.3g  %8.2f  %10.3g%s\n", (int)w, r->name, r->action, r->m.cosine,
                   r->m.rel_frobenius, r->m.snr_db, r->m.max_abs,
                   r->m.cosine < e->threshold ? "  BELOW THRESHOLD" : "");
    }
    if (!e->quiet)
        printf("\n");
    if (e->nr)
        printf("%zu tensors compared: weighted mean cosine %.6f, minimum %.6f; %.1f%% of parameters quantized\n", e->nr,
               wmean, e->minc, 100 * share);
    else
        printf("no tensor compared\n");
    if (e->threshold > -2)
        printf("%zu tensor(s) below the threshold %g\n", below, e->threshold);
    if (e->nmissing + e->nextra + e->nmismatch)
        printf("%zu tensor(s) missing from the candidate, %zu only in it, %zu with another shape or dtype%s\n",
               e->nmissing, e->nextra, e->nmismatch, e->allow_missing ? " (allowed)" : "");
}

/* The figures in the form asked for; 3 when the check failed. */
static int eval_report(eval_run *e)
{
    qsort(e->rows, e->nr, sizeof *e->rows, by_cosine);
    size_t below = 0;
    for (size_t i = 0; i < e->nr; i++)
        below += e->rows[i].m.cosine < e->threshold;
    int failed = below || !e->done_n || e->nmismatch || (!e->allow_missing && e->nmissing + e->nextra), rc = CLI_OK;
    if (e->json)
        rc = eval_print_json(e, failed);
    else if (e->csv)
        eval_print_csv(e);
    else
        eval_print_table(e, below);
    if (!e->done_n)
        fprintf(stderr, "stz: check failed: no tensor of %s was compared with %s\n", e->pa, e->pb);
    return rc == CLI_OK && failed ? 3 : rc;
}

int cmd_eval(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--forward"))
            return cmd_eval_forward(argc, argv);
    eval_run e = {.threshold = -2, .minc = 1};
    int rc;
    if (eval_options(&e, argc, argv, &rc))
        return rc;
    stz_err err;
    if (stz_model_set_open(&e.A, e.pa, &err) || stz_model_set_open_like(&e.B, e.pb, &e.A, &err)) {
        stz_model_set_free(&e.A);
        return cli_fail(&err);
    }
    for (size_t f = 0; f < e.A.n; f++)
        e.na += stz_qmodel_count(e.A.m[f]);
    e.rows = calloc(e.na + 1, sizeof *e.rows);
    e.missing = cJSON_CreateArray(), e.extra = cJSON_CreateArray(), e.mismatched = cJSON_CreateArray();
    if (!e.rows || !e.missing || !e.extra || !e.mismatched) {
        stz_err_set(&err, STZ_E_NOMEM, "%s: out of memory for %zu tensors' figures", e.pa, e.na);
        rc = cli_fail(&err);
    } else {
        rc = compare_all(&e, &err) ? cli_fail(&err) : eval_report(&e);
    }
    cJSON_Delete(e.missing);
    cJSON_Delete(e.extra);
    cJSON_Delete(e.mismatched);
    free(e.rows);
    stz_model_set_free(&e.A);
    stz_model_set_free(&e.B);
    return rc;
}
