/* stz plan / quantize / dequantize. */
#include "cli.h"
#include "stz_feedback.h"
#include "stz_imatrix.h"
#include "stz_pack.h"
#include "stz_policy.h"
#include "stz_model.h"
#include "stz_pipeline.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char plan_help[] =
    "usage: stz plan (--policy P | --int8 | --int4) [--json] MODEL.safetensors\n\n"
    "Shows what a policy would do to each tensor, without writing anything:\n"
    "the rule that matched (first match wins), the action, and the bytes\n"
    "before and after; then totals and the predicted ratio (before packing).\n"
    "Warns about rules that match no tensor. P is a policy file or a shipped\n"
    "policy name: int8, int4, int4-nl, int8-b128, int4-small, lossless, ... (stz policy list).\n\n" CLI_POLICY_HELP
    "  --json              print the plan as JSON\n"
    "  -h, --help   this text\n";

static const char quantize_help[] =
    "usage: stz quantize (--policy P | --int8 | --int4) IN.safetensors -o OUT.safetensors [options]\n\n"
    "Quantizes the tensors the policy selects to 2-8 bits (block-wise, stz's\n"
    "methods or llama.cpp's types), tensor by tensor; kept tensors\n"
    "are copied byte for byte. OUT is a normal SafeTensors file whose\n"
    "__metadata__ records how each tensor was quantized (docs/FORMAT.md).\n\n"
    "  -o, --output FILE   where to write (required)\n" CLI_POLICY_HELP
    "  -T, --threads N     threads for INT8/INT4 and SVD rules, 0 = all cores (default);\n"
    "                      same output for any N\n"
    "  -f, --force         replace OUT if it exists\n"
    "  -q, --quiet         no progress, no summary\n"
    "  --json              print the summary as JSON\n"
    "  -h, --help          this text\n";

static const char dequantize_help[] =
    "usage: stz dequantize IN -o OUT.safetensors [--dtype bf16|f16|f32] [options]\n\n"
    "Turns a quantized file back into a plain model that any SafeTensors\n"
    "reader loads: original names and shapes; quantized tensors in their\n"
    "original dtype (or --dtype); kept tensors byte-identical. IN may also be\n"
    "a GGUF file (llama.cpp's; f32, f16, bf16, q4_0/1, q5_0/1, q8_0, q2_k to\n"
    "q6_k, iq4_nl, iq4_xs: what llama-quantize's usual mixes write): its\n"
    "tensors decoded (F32 unless --dtype; norms F32) under the model's own\n"
    "names, q/k rows back in Hugging Face's order where export permuted them.\n\n"
    "  -o, --output FILE   where to write (required)\n"
    "  --dtype D           dtype of the dequantized tensors\n"
    "  --names N           a GGUF file's names: hf (default), llama2c or gguf\n"
    "  -f, --force         replace OUT if it exists\n"
    "  -q, --quiet         no progress, no summary\n"
    "  --json              print the summary as JSON\n"
    "  -h, --help          this text\n";

enum { O_NAMES = 1200 };
static const struct option opts[] = {
    CLI_POLICY_LONG, CLI_COMMON_LONG, {"names", required_argument, 0, O_NAMES}, {0, 0, 0, 0}};

typedef struct {
    cli_common c;
    cli_policy_opts po;
    stz_names names; /* dequantize of a GGUF file */
} qopts;

/* --names: 0, or a usage error's exit status. */
static int names_opt(const char *arg, stz_names *names)
{
    if (!strcmp(arg, "hf"))
        *names = STZ_NAMES_HF;
    else if (!strcmp(arg, "llama2c"))
        *names = STZ_NAMES_LLAMA2C;
    else if (!strcmp(arg, "gguf"))
        *names = STZ_NAMES_GGUF;
    else
        return cli_usage_error("dequantize", "--names takes hf, llama2c or gguf, not '%s'", arg);
    return 0;
}

static int parse(const char *cmd, const char *help, int argc, char **argv, qopts *o)
{
    int c, r;
    memset(o, 0, sizeof *o);
    o->names = STZ_NAMES_HF;
    cli_common_init(&o->c);
    while ((c = getopt_long(argc, argv, CLI_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == O_NAMES && !strcmp(cmd, "dequantize")) {
            if ((r = names_opt(optarg, &o->names)))
                return r;
            continue;
        }
        if ((r = strcmp(cmd, "dequantize") ? cli_policy_opt(cmd, c, &o->po) : -2) == -2)
            r = cli_common_opt(cmd, help, c, &o->c);
        if (r != -1)
            return r == -2 ? cli_bad_option(cmd) : r;
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one input file");
    return -1;
}

static const char *action_label(const stz_decision *d, char *buf, size_t cap)
{
    if (d->action == STZ_ACTION_KEEP)
        return "keep";
    if (d->action == STZ_ACTION_SVD) {
        if (d->svd_rank)
            snprintf(buf, cap, "svd/r%u%s", d->svd_rank, d->svd_randomized ? "/rand" : "");
        else
            snprintf(buf, cap, "svd/%s%g%s", d->svd_energy > 0 ? "e" : "err",
                     d->svd_energy > 0 ? d->svd_energy : d->svd_max_error, d->svd_randomized ? "/rand" : "");
        return buf;
    }
    if (stz_decision_ggml_type(d) >= 0)
        return stz_action_name(d->action, d->ggml_type);
    snprintf(buf, cap, "%s/%u%s%s%s", stz_action_name(d->action, d->ggml_type), d->block_size,
             d->method == STZ_QMETHOD_ABSMAX ? "" : "/",
             d->method == STZ_QMETHOD_ABSMAX ? "" : stz_qmethod_name(d->method),
             d->scale_dtype == STZ_DTYPE_F32  ? "/f32"
             : d->scale_dtype == STZ_DTYPE_U8 ? "/u8"
                                              : "");
    return buf;
}

/* An svd decision's note: what the factors will be, or the fallback. */
static void svd_note(const stz_tensor *t, stz_decision *d, uint64_t nb, char *note, size_t cap)
{
    stz_decision fb = *d;
    fb.action = d->fallback;
    char fl[64]; /* the fallback with its parameters: the svd rule's block_size, method, scale_dtype */
    action_label(&fb, fl, sizeof fl);
    if (!d->svd_rank)
        snprintf(note, cap, "rank chosen from the spectrum when quantizing; %s if not smaller", fl);
    else if (nb == stz_quant_bytes(t, &fb))
        snprintf(note, cap, "rank-%u factors would not be smaller: %s instead", d->svd_rank, fl);
    else
        snprintf(note, cap, "INT8 factors U, S, Vh");
    d->reason = note;
}

static cJSON *decision_json(const stz_tensor *t, const stz_decision *d, uint64_t nb)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", t->name);
    cJSON_AddStringToObject(e, "dtype", stz_dtype_name(t->dtype));
    if (d->rule < 0)
        cJSON_AddNullToObject(e, "rule");
    else
        cJSON_AddNumberToObject(e, "rule", d->rule);
    cJSON_AddStringToObject(e, "action", stz_action_name(d->action, d->ggml_type));
    if (d->action == STZ_ACTION_SVD) {
        if (d->svd_rank)
            cJSON_AddNumberToObject(e, "rank", d->svd_rank);
        cJSON_AddStringToObject(e, "fallback", stz_action_name(d->fallback, -1));
    } else if (d->action != STZ_ACTION_KEEP && stz_decision_ggml_type(d) < 0) {
        cJSON_AddNumberToObject(e, "block_size", d->block_size);
        cJSON_AddStringToObject(e, "method", stz_qmethod_name(d->method));
        cJSON_AddStringToObject(e, "scale_dtype", stz_dtype_name(d->scale_dtype));
    }
    if (d->reason)
        cJSON_AddStringToObject(e, d->action == STZ_ACTION_KEEP ? "kept_because" : "note", d->reason);
    cJSON_AddNumberToObject(e, "bytes", (double)(t->end - t->begin));
    cJSON_AddNumberToObject(e, "bytes_after", (double)nb);
    return e;
}

/* A plan's totals. */
typedef struct {
    size_t nt, nq;
    uint64_t before, after, pq, params;
} plan_totals;

/* Every tensor's decision: a row of the table, or an entry of arr (--json). */
static void plan_tensors(stz_policy *pol, stz_reader *const *rs, size_t nfiles, size_t w, cJSON *arr, plan_totals *n)
{
    char a[32], b[32], lab[64], rule[16], note[128];
    for (size_t f = 0; f < nfiles; f++)
        for (size_t i = 0; i < stz_reader_count(rs[f]); i++) {
            const stz_tensor *t = stz_reader_tensor(rs[f], i);
            stz_decision d = stz_policy_decide(pol, t);
            uint64_t nb = stz_quant_bytes(t, &d);
            if (d.action == STZ_ACTION_SVD)
                svd_note(t, &d, nb, note, sizeof note);
            n->before += t->end - t->begin;
            n->after += nb;
            n->params += t->numel;
            if (d.action != STZ_ACTION_KEEP)
                n->nq++, n->pq += t->numel;
            snprintf(rule, sizeof rule, d.rule < 0 ? "default" : "%d", d.rule);
            if (arr)
                cJSON_AddItemToArray(arr, decision_json(t, &d, nb));
            else
                printf("%-*s  %-6s  %-7s  %-14s  %15s  %15s  %s\n", (int)w, t->name, stz_dtype_name(t->dtype), rule,
                       action_label(&d, lab, sizeof lab), cli_commas(a, t->end - t->begin), cli_commas(b, nb),
                       d.reason ? d.reason : "");
        }
}

static int plan_summary(const qopts *o, const char *model, stz_policy *pol, cJSON *arr, const plan_totals *n)
{
    double ratio = n->after ? (double)n->before / (double)n->after : 0;
    double share = n->params ? (double)n->pq / (double)n->params : 0;
    if (!arr) {
        char a[32], b[32];
        printf(
            "\n%zu tensors: %zu quantized (%.1f%% of parameters), %zu kept\n%s -> %s bytes, predicted ratio "
            "%.3fx before packing\n",
            n->nt, n->nq, 100.0 * share, n->nt - n->nq, cli_commas(a, n->before), cli_commas(b, n->after), ratio);
        return CLI_OK;
    }
    cJSON *doc = cJSON_CreateObject(), *unused = cJSON_CreateArray();
    cJSON_AddStringToObject(doc, "file", model);
    cJSON_AddStringToObject(doc, "policy", o->po.policy ? o->po.policy : "command line");
    cJSON_AddItemToObject(doc, "tensors", arr);
    cJSON_AddNumberToObject(doc, "tensor_count", (double)n->nt);
    cJSON_AddNumberToObject(doc, "tensors_quantized", (double)n->nq);
    cJSON_AddNumberToObject(doc, "bytes", (double)n->before);
    cJSON_AddNumberToObject(doc, "bytes_after", (double)n->after);
    cJSON_AddNumberToObject(doc, "predicted_ratio", ratio);
    cJSON_AddNumberToObject(doc, "params_quantized_share", share);
    for (size_t i = 0; i < stz_policy_rule_count(pol); i++)
        if (!stz_policy_rule_hits(pol, i))
            cJSON_AddItemToArray(unused, cJSON_CreateNumber((double)i));
    cJSON_AddItemToObject(doc, "rules_matching_nothing", unused);
    return cli_print_json(doc);
}

/* The model's files opened as readers (containers refused: plan their
 * source); the widest tensor name and the tensor count. */
static stz_status open_readers(char **files, size_t nfiles, stz_reader ***out, size_t *w, size_t *nt, stz_err *err)
{
    stz_reader **rs = calloc(nfiles + 1, sizeof *rs);
    if (!rs)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the readers");
    for (size_t f = 0; f < nfiles; f++) {
        stz_status st = stz_reader_open(&rs[f], files[f], err);
        if (st) {
            if (stz_is_container(files[f]))
                st = stz_err_set(err, STZ_E_ARG, "%s: an .stz container; plan the model it came from", files[f]);
            for (size_t k = 0; k < f; k++)
                stz_reader_free(rs[k]);
            free(rs);
            return st;
        }
        for (size_t i = 0; i < stz_reader_count(rs[f]); i++, (*nt)++)
            *w = strlen(stz_reader_tensor(rs[f], i)->name) > *w ? strlen(stz_reader_tensor(rs[f], i)->name) : *w;
    }
    *out = rs;
    return STZ_OK;
}

int cmd_plan(int argc, char **argv)
{
    qopts o;
    int rc = parse("plan", plan_help, argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (!cli_policy_given(&o.po))
        return cli_usage_error("plan", "give --policy P, --int8, --int4 or --set");
    if (o.po.feedback || o.po.fast || o.po.so.default_len || o.po.config)
        return cli_usage_error("plan",
                               "--feedback, --fast and calibration's options change how blocks are quantized, not "
                               "the plan: give them to quantize or compress");
    if (o.po.imatrix)
        return cli_usage_error("plan",
                               "--imatrix changes how blocks are quantized, not the plan: give it to quantize "
                               "or compress");
    stz_err err;
    stz_policy *pol;
    char **files;
    stz_reader **rs = NULL;
    size_t nfiles, w = 4;
    plan_totals n = {0};
    if (cli_policy_load(&o.po, &pol, &err))
        return cli_fail(&err);
    if (stz_model_files(argv[optind], &files, &nfiles, &err)) {
        stz_policy_free(pol);
        return cli_fail(&err);
    }
    if (open_readers(files, nfiles, &rs, &w, &n.nt, &err)) {
        stz_model_files_free(files, nfiles);
        stz_policy_free(pol);
        return cli_fail(&err);
    }
    w = w > 60 ? 60 : w;
    cJSON *arr = o.c.json ? cJSON_CreateArray() : NULL;
    if (!o.c.json)
        printf("%-*s  %-6s  %-7s  %-14s  %15s  %15s  %s\n", (int)w, "name", "dtype", "rule", "action", "bytes", "after",
               "note");
    plan_tensors(pol, rs, nfiles, w, arr, &n);
    rc = plan_summary(&o, argv[optind], pol, arr, &n);
    if (!o.c.quiet)
        cli_policy_warn_unused(pol, nfiles == 1 ? rs[0] : NULL);
    for (size_t f = 0; f < nfiles; f++)
        stz_reader_free(rs[f]);
    free(rs);
    stz_model_files_free(files, nfiles);
    stz_policy_free(pol);
    return rc;
}

/* stz quantize of the file `in`, options parsed. */
static int quantize(qopts *o, const char *in)
{
    stz_err err;
    stz_policy *pol;
    stz_imatrix *im = NULL;
    stz_feedback *fb = NULL;
    double t0 = cli_now();
    if (cli_policy_for(&o->po, in, o->c.quiet, &pol, &err))
        return cli_fail(&err);
    if (stz_imatrix_load_for(&im, o->po.imatrix, in, &err) ||
        cli_feedback_open(&o->po, pol, in, o->c.out, o->c.force, o->c.threads ? o->c.threads : cli_ncores(),
                          o->c.quiet || o->c.json, &fb, &err)) {
        stz_policy_free(pol);
        stz_imatrix_free(im);
        return cli_fail(&err);
    }
    stz_quant_params p = STZ_QUANT_PARAMS_DEFAULT;
    p.imatrix = im;
    p.feedback = fb;
    p.config = o->po.config;
    p.write_flags = o->c.force ? STZ_WRITE_FORCE : 0;
    p.threads = o->c.threads;
    cli_progress prog;
    cli_progress_init(&prog, "quantize", o->c.quiet);
    p.progress = cli_progress_cb;
    p.progress_user = &prog;
    stz_quant_stats st;
    stz_status s = stz_quantize_file(&p, pol, in, o->c.out, &st, &err);
    cli_progress_end(&prog);
    if (!s && !o->c.quiet) {
        stz_reader *names = NULL;
        stz_err ignored;
        stz_reader_open(&names, in, &ignored);
        cli_policy_warn_unused(pol, names);
        stz_reader_free(names);
    }
    size_t fed = fb ? stz_feedback_count(fb) : 0;
    const char *skip_name;
    size_t skipped = fb ? stz_feedback_skipped(fb, &skip_name) : 0;
    if (skipped && !o->c.quiet && !s)
        fprintf(stderr,
                "stz: note: %zu tensor(s) such as '%s' quantized without error feedback: no matrix product "
                "reads them (an untied token embedding)\n",
                skipped, skip_name);
    stz_policy_free(pol);
    stz_imatrix_free(im);
    stz_feedback_free(fb);
    if (s)
        return cli_fail(&err);
    double secs = cli_now() - t0, ratio = st.out_bytes ? (double)st.in_bytes / (double)st.out_bytes : 0;
    char a[32], b[32], r[32], fbs[64] = "";
    if (fed)
        snprintf(fbs, sizeof fbs, ", %zu with error feedback", fed);
    if (o->c.json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", in);
        cJSON_AddStringToObject(d, "output", o->c.out);
        cJSON_AddNumberToObject(d, "in_bytes", (double)st.in_bytes);
        cJSON_AddNumberToObject(d, "out_bytes", (double)st.out_bytes);
        cJSON_AddNumberToObject(d, "ratio", ratio);
        cJSON_AddNumberToObject(d, "tensor_count", (double)st.tensors);
        cJSON_AddNumberToObject(d, "tensors_quantized", (double)st.quantized);
        cJSON_AddNumberToObject(d, "params_quantized_share",
                                st.params ? (double)st.params_quantized / (double)st.params : 0);
        cJSON_AddNumberToObject(d, "weighted_cosine", st.weighted_cosine);
        cJSON_AddNumberToObject(d, "min_cosine", st.min_cosine);
        cJSON_AddStringToObject(d, "worst_tensor", st.worst);
        cJSON_AddNumberToObject(d, "feedback_matrices", (double)fed);
        cJSON_AddBoolToObject(d, "calibrated", fed > 0);
        cJSON_AddNumberToObject(d, "seconds", secs);
        return cli_print_json(d);
    }
    if (!o->c.quiet)
        printf(
            "%s -> %s: %s -> %s bytes (%.3fx), %zu of %zu tensors quantized (%.1f%% of parameters)%s in %.2f s, "
            "%s/s\n",
            in, o->c.out, cli_commas(a, st.in_bytes), cli_commas(b, st.out_bytes), ratio, st.quantized, st.tensors,
            st.params ? 100.0 * (double)st.params_quantized / (double)st.params : 0, fbs, secs,
            cli_bytes(r, (uint64_t)((double)st.in_bytes / secs)));
    return CLI_OK;
}

int cmd_quantize(int argc, char **argv)
{
    qopts o;
    int rc = parse("quantize", quantize_help, argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (!cli_policy_given(&o.po))
        return cli_usage_error("quantize", "give --policy P, --int8, --int4 or --set");
    if (!o.c.out)
        return cli_usage_error("quantize", "missing -o OUT");
    if ((rc = cli_stdout_ok("quantize", &o.c)) >= 0 || (rc = cli_not_gguf("quantize", o.c.out, "SafeTensors")) >= 0 ||
        (rc = cli_not_sharded("quantize", argv[optind])) >= 0)
        return rc;
    stz_err err;
    char *in;
    if (stz_model_file(argv[optind], &in, &err)) /* a directory holding model.safetensors: that file */
        return cli_fail(&err);
    rc = quantize(&o, in);
    free(in);
    return rc;
}

int cmd_dequantize(int argc, char **argv)
{
    qopts o;
    int rc = parse("dequantize", dequantize_help, argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (!o.c.out)
        return cli_usage_error("dequantize", "missing -o OUT");
    if ((rc = cli_stdout_ok("dequantize", &o.c)) >= 0)
        return rc;
    stz_quant_params p = STZ_QUANT_PARAMS_DEFAULT;
    p.write_flags = o.c.force ? STZ_WRITE_FORCE : 0;
    cli_progress prog;
    cli_progress_init(&prog, "dequantize", o.c.quiet);
    p.progress = cli_progress_cb;
    p.progress_user = &prog;
    stz_err err;
    stz_status s = stz_dequantize_gguf(&p, argv[optind], o.c.out, o.c.dtype, o.names, &err);
    cli_progress_end(&prog);
    return s ? cli_fail(&err)
             : cli_print_summary(&o.c, argv[optind], o.c.out, "dequantized", 0, cli_now() - prog.start);
}
