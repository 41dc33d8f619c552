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

int cmd_eval(int argc, char **argv)
{
    enum { O_THRESHOLD = 256, O_JSON, O_CSV, O_ALLOW };
    static const struct option opts[] = {{"threshold", required_argument, 0, O_THRESHOLD},
                                         {"allow-missing", no_argument, 0, O_ALLOW},
                                         {"json", no_argument, 0, O_JSON}, {"csv", no_argument, 0, O_CSV},
                                         {"quiet", no_argument, 0, 'q'},   {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--forward"))
            return cmd_eval_forward(argc, argv);
    double threshold = -2;
    int json = 0, csv = 0, quiet = 0, allow_missing = 0, c;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case O_THRESHOLD:
            threshold = strtod(optarg, &end);
            if (*end || !*optarg || threshold < -1 || threshold > 1)
                return cli_usage_error("eval", "--threshold takes a cosine in [-1, 1], not '%s'", optarg);
            break;
        case O_ALLOW: allow_missing = 1; break;
        case O_JSON: json = 1; break;
        case O_CSV: csv = 1; break;
        case 'q': quiet = 1; break;
        case 'h': return fputs(eval_help, stdout), CLI_OK;
        default: return cli_bad_option("eval");
        }
    }
    if (optind != argc - 2)
        return cli_usage_error("eval", "expected ORIGINAL and CANDIDATE");
    if (json && csv)
        return cli_usage_error("eval", "--json and --csv conflict");
    const char *pa = argv[optind], *pb = argv[optind + 1];
    stz_err err;
    cli_model_set A, B;
    if (cli_set_open(&A, pa, &err) || cli_set_open(&B, pb, &err)) {
        cli_set_free(&A);
        return cli_fail(&err);
    }
    size_t na = 0, nr = 0;
    for (size_t f = 0; f < A.n; f++)
        na += stz_qmodel_count(A.m[f]);
    eval_row *rows = calloc(na + 1, sizeof *rows);
    cJSON *doc = json ? cJSON_CreateObject() : NULL, *missing = cJSON_CreateArray(), *extra = cJSON_CreateArray(),
          *mismatched = cJSON_CreateArray();
    double wsum = 0, wtot = 0, minc = 1;
    uint64_t params = 0, pq = 0;
    size_t nmissing = 0, nextra = 0, nmismatch = 0, done_n = 0;
    int rc = CLI_OK;
    if (!rows || !missing || !extra || !mismatched || (json && !doc)) {
        stz_err_set(&err, STZ_E_NOMEM, "%s: out of memory for %zu tensors' figures", pa, na);
        rc = cli_fail(&err);
        goto done;
    }
    cli_progress prog;
    cli_progress_init(&prog, "eval", quiet || json || csv);
    for (size_t fa = 0; fa < A.n; fa++)
        for (size_t i = 0; i < stz_qmodel_count(A.m[fa]); i++) {
            stz_qmodel *a = A.m[fa];
            const stz_qtensor *ta = stz_qmodel_tensor(a, i);
            size_t fb, j;
            params += ta->numel;
            if (!cli_set_find(&B, ta->name, &fb, &j)) {
                cJSON_AddItemToArray(missing, cJSON_CreateString(ta->name));
                fprintf(stderr, "stz: %s: tensor '%s' is missing from %s\n", allow_missing ? "warning" : "check failed",
                        ta->name, pb);
                nmissing++;
                continue;
            }
            stz_qmodel *b = B.m[fb];
            const stz_qtensor *tb = stz_qmodel_tensor(b, j);
            if (tb->bits)
                pq += ta->numel;
            if (!stz_dtype_is_float(ta->dtype) || !stz_dtype_is_float(tb->dtype) || ta->dtype == STZ_DTYPE_C64) {
                done_n++; /* integer tensors are compared by shape only */
                continue;
            }
            stz_metrics m;
            stz_status s = stz_eval_tensor(a, i, b, j, &m, &err);
            if (s == STZ_E_SHAPE || s == STZ_E_DTYPE) {
                cJSON_AddItemToArray(mismatched, cJSON_CreateString(ta->name));
                fprintf(stderr, "stz: check failed: %s\n", err.msg);
                nmismatch++;
                continue;
            }
            if (s) {
                rc = cli_fail(&err);
                goto done;
            }
            done_n++;
            rows[nr++] = (eval_row){ta->name, cli_action_of(tb, "kept"), ta->numel, m};
            wsum += m.cosine * (double)ta->numel, wtot += (double)ta->numel;
            minc = m.cosine < minc ? m.cosine : minc;
            if (cli_progress_cb(&prog, nr, na)) {
                stz_err_set(&err, STZ_E_INTERRUPTED, "interrupted");
                rc = cli_fail(&err);
                goto done;
            }
        }
    for (size_t fb = 0; fb < B.n; fb++)
        for (size_t j = 0; j < stz_qmodel_count(B.m[fb]); j++) {
            const char *name = stz_qmodel_tensor(B.m[fb], j)->name;
            size_t f, i;
            if (!cli_set_find(&A, name, &f, &i)) {
                cJSON_AddItemToArray(extra, cJSON_CreateString(name));
                fprintf(stderr, "stz: %s: tensor '%s' is only in %s\n", allow_missing ? "warning" : "check failed", name,
                        pb);
                nextra++;
            }
        }
    cli_progress_end(&prog);
    qsort(rows, nr, sizeof *rows, by_cosine);
    double wmean = wtot ? wsum / wtot : 1, share = params ? (double)pq / (double)params : 0;
    size_t below = 0;
    for (size_t i = 0; i < nr; i++)
        below += rows[i].m.cosine < threshold;
    int failed = below || !done_n || nmismatch || (!allow_missing && nmissing + nextra);
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < nr; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", rows[i].name);
            cJSON_AddStringToObject(e, "action", rows[i].action);
            cJSON_AddNumberToObject(e, "params", (double)rows[i].numel);
            cJSON_AddItemToObject(e, "cosine", num(rows[i].m.cosine));
            cJSON_AddItemToObject(e, "rel_frobenius", num(rows[i].m.rel_frobenius));
            cJSON_AddItemToObject(e, "snr_db", num(rows[i].m.snr_db));
            cJSON_AddItemToObject(e, "max_abs_error", num(rows[i].m.max_abs));
            cJSON_AddItemToArray(arr, e);
        }
        cJSON_AddStringToObject(doc, "original", argv[optind]);
        cJSON_AddStringToObject(doc, "candidate", argv[optind + 1]);
        cJSON_AddItemToObject(doc, "tensors", arr);
        if (nr) {
            cJSON_AddNumberToObject(doc, "weighted_cosine", wmean);
            cJSON_AddNumberToObject(doc, "min_cosine", minc);
        } else { /* nothing compared: no figure to give */
            cJSON_AddNullToObject(doc, "weighted_cosine");
            cJSON_AddNullToObject(doc, "min_cosine");
        }
        cJSON_AddNumberToObject(doc, "params_quantized_share", share);
        cJSON_AddNumberToObject(doc, "tensors_compared", (double)done_n);
        cJSON_AddItemToObject(doc, "missing_from_candidate", missing);
        cJSON_AddItemToObject(doc, "only_in_candidate", extra);
        cJSON_AddItemToObject(doc, "mismatched", mismatched);
        missing = extra = mismatched = NULL;
        if (threshold > -2) {
            cJSON *bl = cJSON_CreateArray();
            for (size_t i = 0; i < nr; i++)
                if (rows[i].m.cosine < threshold)
                    cJSON_AddItemToArray(bl, cJSON_CreateString(rows[i].name));
            cJSON_AddNumberToObject(doc, "threshold", threshold);
            cJSON_AddItemToObject(doc, "below_threshold", bl);
        }
        cJSON_AddBoolToObject(doc, "passed", !failed);
        rc = cli_print_json(doc);
        doc = NULL;
    } else if (csv) {
        printf("name,action,params,cosine,rel_frobenius,snr_db,max_abs_error\n");
        for (size_t i = 0; i < nr; i++)
            printf("\"%s\",%s,%llu,%.9f,%.9g,%.4f,%.9g\n", rows[i].name, rows[i].action,
                   (unsigned long long)rows[i].numel, rows[i].m.cosine, rows[i].m.rel_frobenius, rows[i].m.snr_db,
                   rows[i].m.max_abs);
    } else {
        size_t w = 4;
        for (size_t i = 0; i < nr; i++)
            w = strlen(rows[i].name) > w ? strlen(rows[i].name) : w;
        w = w > 60 ? 60 : w;
        if (!quiet)
            printf("%-*s  %-6s  %10s  %10s  %8s  %10s\n", (int)w, "name (worst first)", "action", "cosine", "rel.err",
                   "SNR dB", "max |err|");
        for (size_t i = 0; i < nr; i++)
            if (!quiet || rows[i].m.cosine < threshold)
                printf("%-*s  %-6s  %10.6f  %10.3g  %8.2f  %10.3g%s\n", (int)w, rows[i].name, rows[i].action,
                       rows[i].m.cosine, rows[i].m.rel_frobenius, rows[i].m.snr_db, rows[i].m.max_abs,
                       rows[i].m.cosine < threshold ? "  BELOW THRESHOLD" : "");
        if (!quiet)
            printf("\n");
        if (nr)
            printf("%zu tensors compared: weighted mean cosine %.6f, minimum %.6f; %.1f%% of parameters quantized\n",
                   nr, wmean, minc, 100 * share);
        else
            printf("no tensor compared\n");
        if (threshold > -2)
            printf("%zu tensor(s) below the threshold %g\n", below, threshold);
        if (nmissing + nextra + nmismatch)
            printf("%zu tensor(s) missing from the candidate, %zu only in it, %zu with another shape or dtype%s\n",
                   nmissing, nextra, nmismatch, allow_missing ? " (allowed)" : "");
    }
    if (!done_n)
        fprintf(stderr, "stz: check failed: no tensor of %s was compared with %s\n", pa, pb);
    if (rc == CLI_OK && failed)
        rc = 3;
done:
    cJSON_Delete(doc);
    cJSON_Delete(missing);
    cJSON_Delete(extra);
    cJSON_Delete(mismatched);
    free(rows);
    cli_set_free(&A);
    cli_set_free(&B);
    return rc;
}
