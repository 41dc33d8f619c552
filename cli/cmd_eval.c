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

static cJSON *num(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

/* One comparison: the options, the two sides, and what was found. */
typedef struct {
    double threshold; /* -2: none */
    int json, csv, quiet, allow_missing;
    const char *pa, *pb;
    stz_model_set A, B;
    stz_eval_result r;
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

/* The tensors one side lacks or holds otherwise, on standard error. */
static void print_problems(const eval_run *e)
{
    for (size_t i = 0; i < e->r.nproblems; i++) {
        const stz_eval_problem *p = &e->r.problems[i];
        if (p->kind == STZ_EVAL_MISMATCHED)
            fprintf(stderr, "stz: check failed: %s\n", p->why);
        else
            fprintf(stderr, "stz: %s: tensor '%s' is %s %s\n", e->allow_missing ? "warning" : "check failed", p->name,
                    p->kind == STZ_EVAL_MISSING ? "missing from" : "only in", e->pb);
    }
}

/* The names of the problems of one kind, as a JSON array. */
static cJSON *problem_names(const stz_eval_result *r, stz_eval_problem_kind kind)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < r->nproblems; i++)
        if (r->problems[i].kind == kind)
            cJSON_AddItemToArray(a, cJSON_CreateString(r->problems[i].name));
    return a;
}

static double quantized_share(const stz_eval_result *r)
{
    return r->params ? (double)r->params_quantized / (double)r->params : 0;
}

static int eval_print_json(const eval_run *e, int failed)
{
    const stz_eval_result *r = &e->r;
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    for (size_t i = 0; i < r->nrows; i++) {
        const stz_eval_row *w = &r->rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", w->name);
        cJSON_AddStringToObject(o, "action", w->action);
        cJSON_AddNumberToObject(o, "params", (double)w->params);
        cJSON_AddItemToObject(o, "cosine", num(w->m.cosine));
        cJSON_AddItemToObject(o, "rel_frobenius", num(w->m.rel_frobenius));
        cJSON_AddItemToObject(o, "snr_db", num(w->m.snr_db));
        cJSON_AddItemToObject(o, "max_abs_error", num(w->m.max_abs));
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddStringToObject(doc, "original", e->pa);
    cJSON_AddStringToObject(doc, "candidate", e->pb);
    cJSON_AddItemToObject(doc, "tensors", arr);
    if (r->nrows) {
        cJSON_AddNumberToObject(doc, "weighted_cosine", r->weighted_cosine);
        cJSON_AddNumberToObject(doc, "min_cosine", r->min_cosine);
    } else { /* nothing compared: no figure to give */
        cJSON_AddNullToObject(doc, "weighted_cosine");
        cJSON_AddNullToObject(doc, "min_cosine");
    }
    cJSON_AddNumberToObject(doc, "params_quantized_share", quantized_share(r));
    cJSON_AddNumberToObject(doc, "tensors_compared", (double)r->compared);
    cJSON_AddItemToObject(doc, "missing_from_candidate", problem_names(r, STZ_EVAL_MISSING));
    cJSON_AddItemToObject(doc, "only_in_candidate", problem_names(r, STZ_EVAL_EXTRA));
    cJSON_AddItemToObject(doc, "mismatched", problem_names(r, STZ_EVAL_MISMATCHED));
    if (e->threshold > -2) {
        cJSON *bl = cJSON_CreateArray();
        for (size_t i = 0; i < r->nrows; i++)
            if (r->rows[i].m.cosine < e->threshold)
                cJSON_AddItemToArray(bl, cJSON_CreateString(r->rows[i].name));
        cJSON_AddNumberToObject(doc, "threshold", e->threshold);
        cJSON_AddItemToObject(doc, "below_threshold", bl);
    }
    cJSON_AddBoolToObject(doc, "passed", !failed);
    return cli_print_json(doc);
}

static void eval_print_csv(const eval_run *e)
{
    printf("name,action,params,cosine,rel_frobenius,snr_db,max_abs_error\n");
    for (size_t i = 0; i < e->r.nrows; i++) {
        const stz_eval_row *w = &e->r.rows[i];
        printf("\"%s\",%s,%llu,%.9f,%.9g,%.4f,%.9g\n", w->name, w->action, (unsigned long long)w->params, w->m.cosine,
               w->m.rel_frobenius, w->m.snr_db, w->m.max_abs);
    }
}

static void eval_print_table(const eval_run *e, size_t below)
{
    const stz_eval_result *r = &e->r;
    size_t w = 4;
    for (size_t i = 0; i < r->nrows; i++)
        w = strlen(r->rows[i].name) > w ? strlen(r->rows[i].name) : w;
    w = w > 60 ? 60 : w;
    if (!e->quiet)
        printf("%-*s  %-6s  %10s  %10s  %8s  %10s\n", (int)w, "name (worst first)", "action", "cosine", "rel.err",
               "SNR dB", "max |err|");
    for (size_t i = 0; i < r->nrows; i++) {
        const stz_eval_row *x = &r->rows[i];
        if (!e->quiet || x->m.cosine < e->threshold)
            printf("%-*s  %-6s  %10.6f  %10.3g  %8.2f  %10.3g%s\n", (int)w, x->name, x->action, x->m.cosine,
                   x->m.rel_frobenius, x->m.snr_db, x->m.max_abs,
                   x->m.cosine < e->threshold ? "  BELOW THRESHOLD" : "");
    }
    if (!e->quiet)
        printf("\n");
    if (r->nrows)
        printf("%zu tensors compared: weighted mean cosine %.6f, minimum %.6f; %.1f%% of parameters quantized\n",
               r->nrows, r->weighted_cosine, r->min_cosine, 100 * quantized_share(r));
    else
        printf("no tensor compared\n");
    if (e->threshold > -2)
        printf("%zu tensor(s) below the threshold %g\n", below, e->threshold);
    if (r->nproblems)
        printf("%zu tensor(s) missing from the candidate, %zu only in it, %zu with another shape or dtype%s\n",
               r->count[STZ_EVAL_MISSING], r->count[STZ_EVAL_EXTRA], r->count[STZ_EVAL_MISMATCHED],
               e->allow_missing ? " (allowed)" : "");
}

/* The figures in the form asked for; 3 when the check failed. */
static int eval_report(const eval_run *e)
{
    const stz_eval_result *r = &e->r;
    size_t below;
    int failed = !stz_eval_passed(r, e->threshold, e->allow_missing, &below), rc = CLI_OK;
    print_problems(e);
    if (e->json)
        rc = eval_print_json(e, failed);
    else if (e->csv)
        eval_print_csv(e);
    else
        eval_print_table(e, below);
    if (!r->compared)
        fprintf(stderr, "stz: check failed: no tensor of %s was compared with %s\n", e->pa, e->pb);
    return rc == CLI_OK && failed ? 3 : rc;
}

int cmd_eval(int argc, char **argv)
{
    eval_run e = {.threshold = -2};
    int rc;
    if (eval_options(&e, argc, argv, &rc))
        return rc;
    stz_err err;
    if (stz_model_set_open(&e.A, e.pa, &err) || stz_model_set_open_like(&e.B, e.pb, &e.A, &err)) {
        stz_model_set_free(&e.A);
        return cli_fail(&err);
    }
    cli_progress prog;
    cli_progress_init(&prog, "eval", e.quiet || e.json || e.csv);
    stz_status st = stz_eval_models(&e.A, &e.B, cli_progress_cb, &prog, &e.r, &err);
    cli_progress_end(&prog);
    rc = st ? cli_fail(&err) : eval_report(&e);
    stz_eval_result_free(&e.r);
    stz_model_set_free(&e.A);
    stz_model_set_free(&e.B);
    return rc;
}
