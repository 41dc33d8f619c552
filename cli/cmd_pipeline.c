/* stz compress / decompress: policy -> quantize / SVD -> pack in one go,
 * and back. Intermediate files live next to the output under a hidden
 * temporary name, tracked so that errors and signals remove them. */
#include "cli.h"
#include "stz_imatrix.h"
#include "stz_pack.h"
#include "stz_policy.h"
#include "stz_model.h"
#include "stz_pipeline.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char compress_help[] =
    "usage: stz compress (--policy P | --int8 | --int4 | --lossless) IN.safetensors [-o OUT.stz] [options]\n\n"
    "Quantizes the tensors the policy selects (INT8, INT4, SVD factors) and packs\n"
    "the result losslessly, in one command; --lossless only packs (bit-exact).\n"
    "Quantized tensors stream into the container as they are made (no\n"
    "intermediate file), so memory stays bounded. OUT defaults to IN.stz with\n"
    "--lossless and to BASE.POLICY.safetensors.stz otherwise (m.safetensors ->\n"
    "m.int4.safetensors.stz), so that lossy and lossless outputs never collide.\n"
    "IN may be a directory of shards (model.safetensors.index.json) or one\n"
    "holding model.safetensors.\n\n"
    "  -o, --output FILE   where to write; - for standard output\n"
    "  -c, --stdout        write the container to standard output (as -o -; not to\n"
    "                      a terminal; a lossy one's quantized model waits in $TMPDIR)\n" CLI_POLICY_HELP
    "  --lossless          no quantization: stz pack\n"
    "  --tune BUDGET       choose the policy for a size or KL budget (see stz tune --help)\n"
    "  --best              pack harder (see stz pack --help)\n"
    "  --no-eval           do not report the cosine figures\n"
    "  -T, --threads N     threads for quantizing, SVD and packing, 0 = all cores (default)\n"
    "  -f, --force         replace OUT if it exists\n"
    "  -q, --quiet         no progress, no summary\n"
    "  --json              print the summary as JSON\n"
    "  -h, --help          this text\n";

static const char decompress_help[] =
    "usage: stz decompress IN.stz [-o OUT.safetensors] [--dequantize [--dtype bf16|f16|f32]] [options]\n\n"
    "Gives back exactly the file that was packed (for a lossless container, the\n"
    "original model byte for byte). With --dequantize, writes a plain float\n"
    "model any SafeTensors reader loads. OUT defaults to IN without .stz.\n"
    "IN - reads the container from standard input (give -o or -c).\n"
    "Prints a one-line summary (--json: as JSON).\n\n"
    "  -o, --output FILE   where to write; - for standard output\n"
    "  -c, --stdout        write to standard output (as -o -): in order, each chunk\n"
    "                      checked first (not to a terminal; with --dequantize the\n"
    "                      unpacked model waits in $TMPDIR)\n"
    "  --dequantize        dequantize quantized tensors (and rebuild SVD ones)\n"
    "  --dtype D           with --dequantize: dtype of those tensors\n"
    "  -T, --threads N     threads, 0 = all cores (default)\n"
    "  -f, --force         replace OUT if it exists\n"
    "  -q, --quiet         no progress, no summary\n"
    "  --json              print the summary as JSON\n"
    "  -h, --help          this text\n";

enum { O_LOSSLESS = 256, O_BEST, O_NOEVAL, O_DEQ };
static const struct option opts[] = {{"lossless", no_argument, 0, O_LOSSLESS},
                                     {"stdout", no_argument, 0, 'c'},
                                     {"best", no_argument, 0, O_BEST},
                                     {"no-eval", no_argument, 0, O_NOEVAL},
                                     {"dequantize", no_argument, 0, O_DEQ},
                                     CLI_POLICY_LONG,
                                     CLI_COMMON_LONG,
                                     {0, 0, 0, 0}};

typedef struct {
    cli_common c;
    cli_policy_opts po;
    int lossless, best, noeval, deq;
} popts;

static int parse(const char *cmd, const char *help, int argc, char **argv, popts *o)
{
    int c, r;
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    while ((c = getopt_long(argc, argv, CLI_COMMON_SHORT "c", opts, NULL)) != -1) {
        switch (c) {
        case 'c': o->c.out = "-"; break;
        case O_LOSSLESS: o->lossless = 1; break;
        case O_BEST: o->best = 1; break;
        case O_NOEVAL: o->noeval = 1; break;
        case O_DEQ: o->deq = 1; break;
        default:
            if ((r = strcmp(cmd, "compress") ? -2 : cli_policy_opt(cmd, c, &o->po)) == -2)
                r = cli_common_opt(cmd, help, c, &o->c);
            if (r != -1)
                return r == -2 ? cli_bad_option(cmd) : r;
        }
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one input file");
    if (o->c.out && !strcmp(o->c.out, "-") && stz_model_is_sharded(argv[optind]))
        return cli_usage_error(cmd, "a sharded model is a directory of files: give -o DIR, not standard output");
    return cli_stdout_ok(cmd, &o->c);
}

/* The container's name when -o is not given (malloc'd; NULL: no memory). */
static char *output_name(const char *in, const popts *o)
{
    size_t n = stz_compress_output_name(NULL, 0, in, o->lossless, o->po.policy) + 1;
    char *out = malloc(n);
    if (out)
        stz_compress_output_name(out, n, in, o->lossless, o->po.policy);
    return out;
}

/* The policy, the importance matrix and error feedback's options loaded
 * and checked (none with --lossless). */
static stz_status load_policy(popts *o, const char *in, stz_policy **pol, stz_imatrix **im, stz_err *err)
{
    *pol = NULL;
    *im = NULL;
    if (o->lossless)
        return STZ_OK;
    stz_status st = cli_policy_for(&o->po, in, o->c.quiet || cli_mpi_rank(), pol, err);
    if (!st)
        st = stz_imatrix_load_for(im, o->po.imatrix, in, err);
    return st;
}

/* Rules that matched no tensor, warned about (not under MPI, where each
 * rank saw only its shards). */
static void warn_unused(const popts *o, stz_policy *pol, const char *in)
{
    if (!pol || o->c.quiet || cli_mpi_size() > 1)
        return;
    stz_reader *names = NULL;
    stz_err ignored;
    if (!stz_model_is_sharded(in))
        stz_reader_open(&names, in, &ignored);
    cli_policy_warn_unused(pol, names);
    stz_reader_free(names);
}

/* The summary: --json's document, or lines of text. */
static int report(const popts *o, const char *in, const char *out, const stz_policy *pol, const stz_compress_result *r,
                  double secs)
{
    const stz_quant_stats *q = &r->stats;
    const char *mode = o->lossless ? "lossless" : o->po.policy ? o->po.policy : "custom";
    int calibrated = pol && stz_policy_feedback(pol);
    double ratio = r->out_bytes ? (double)r->in_bytes / (double)r->out_bytes : 0;
    double share = q->params ? (double)q->params_quantized / (double)q->params : 0;
    int show_eval = !o->lossless && !o->noeval;
    if (o->c.json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", in);
        cJSON_AddStringToObject(d, "output", out);
        cJSON_AddStringToObject(d, "mode", mode);
        cJSON_AddNumberToObject(d, "files", (double)r->files);
        cJSON_AddNumberToObject(d, "in_bytes", (double)r->in_bytes);
        cJSON_AddNumberToObject(d, "out_bytes", (double)r->out_bytes);
        cJSON_AddNumberToObject(d, "ratio", ratio);
        cJSON_AddNumberToObject(d, "seconds", secs);
        if (!o->lossless) {
            cJSON_AddNumberToObject(d, "tensors_quantized", (double)q->quantized);
            cJSON_AddNumberToObject(d, "params_quantized_share", share);
            cJSON_AddBoolToObject(d, "calibrated", calibrated);
        }
        if (show_eval) {
            cJSON_AddNumberToObject(d, "weighted_cosine", q->weighted_cosine);
            cJSON_AddNumberToObject(d, "min_cosine", q->min_cosine);
            cJSON_AddStringToObject(d, "worst_tensor", q->worst);
        }
        return cli_print_json(d);
    }
    if (o->c.quiet)
        return CLI_OK;
    char a[32], b[32];
    printf("%s -> %s: %s -> %s bytes (%.3fx) in %.2f s (%s%s%s)\n", strcmp(in, "-") ? in : "standard input", out,
           cli_commas(a, r->in_bytes), cli_commas(b, r->out_bytes), ratio, secs,
           o->lossless ? "lossless, bit-exact" : mode, calibrated ? ", calibrated" : "",
           stz_model_is_sharded(in) ? ", sharded" : "");
    if (!o->lossless)
        printf("%zu of %zu tensors quantized (%.1f%% of parameters)\n", q->quantized, q->tensors, 100.0 * share);
    if (show_eval && q->quantized) /* the figures stz eval gives */
        printf("cosine vs original: weighted mean %.6f, minimum %.6f (%s)\n", q->weighted_cosine, q->min_cosine,
               q->worst);
    return CLI_OK;
}

/* stz compress: the options, stz_compress_model (a file, standard input,
 * a sharded directory, over MPI ranks), the report. */
int cmd_compress(int argc, char **argv)
{
    popts o;
    int rc = parse("compress", compress_help, argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (!strcmp(argv[optind], "-") && (!o.lossless || !o.c.out || isatty(STDIN_FILENO)))
        return cli_usage_error("compress", !o.lossless ? "quantizing reads each tensor twice (its scales' range "
                                                         "first): give a file; --lossless packs standard input"
                                           : !o.c.out
                                               ? "give -o FILE or -c for what is read from standard input"
                                               : "standard input is a terminal: pipe a SafeTensors file into it");
    if (cli_policy_given(&o.po) == o.lossless)
        return cli_usage_error("compress", o.lossless ? "--lossless takes no policy options"
                                                      : "give one of --policy P, --int8, --int4, --set, --lossless");
    if ((rc = cli_not_gguf("compress", o.c.out, "an stz container")) >= 0)
        return rc;
    const char *in = argv[optind];
    if (cli_mpi_size() > 1 && !stz_model_is_sharded(in))
        return cli_mpi_rank() ? CLI_USAGE
                              : cli_usage_error("compress", "under mpirun IN must be a sharded model directory");
    char *out = o.c.out ? strdup(o.c.out) : output_name(in, &o);
    stz_err err;
    stz_policy *pol = NULL;
    stz_imatrix *im = NULL;
    stz_compress_result r;
    double t0 = cli_now();
    stz_status st = out ? load_policy(&o, in, &pol, &im, &err)
                        : stz_err_set(&err, STZ_E_NOMEM, "%s: out of memory for the output's name", in);
    if (!st) {
        stz_compress_params p = {.policy = pol,
                                 .imatrix = im,
                                 .feedback_seqs = o.po.so.default_len ? &o.po.so : NULL,
                                 .config = o.po.config,
                                 .threads = o.c.threads,
                                 .best = o.best,
                                 .write_flags = o.c.force ? STZ_WRITE_FORCE : 0,
                                 .quiet = o.c.quiet,
                                 .progress = &cli_stages,
                                 .ranks = cli_ranks()};
        st = stz_compress_model(&p, in, out, &r, &err);
    }
    if (st) {
        rc = cli_mpi_rank() ? CLI_ERROR : cli_fail(&err);
    } else {
        warn_unused(&o, pol, in);
        rc = cli_mpi_rank() ? CLI_OK : report(&o, in, out, pol, &r, cli_now() - t0); /* rank 0 reports for all */
    }
    stz_policy_free(pol);
    stz_imatrix_free(im);
    free(out);
    return rc;
}

/* A container file, or one piped into standard input ("-"). */
static stz_status unpack_any(const stz_unpack_params *p, const char *in, const char *out, stz_err *err)
{
    return strcmp(in, "-") ? stz_unpack_file(p, in, out, err)
                           : stz_unpack_stream(p, STDIN_FILENO, "standard input", out, err);
}

/* What decompress does to one file. */
static stz_status decompress_one(void *user, const char *in, const char *out, int threads, int quiet, stz_err *err)
{
    const popts *o = (const popts *)user;
    stz_status s;
    stz_tmpfile tu = {0};
    if (strcmp(out, "-") && (s = stz_refuse_input_as_output(in, out, err))) /* --dequantize: a temporary file */
        return s;
    stz_unpack_params up = STZ_UNPACK_PARAMS_DEFAULT;
    up.threads = threads;
    up.write_flags = o->c.force ? STZ_WRITE_FORCE : 0;
    cli_progress prog;
    cli_progress_init(&prog, o->deq ? "decompress: unpack" : "decompress", quiet);
    up.progress = cli_progress_cb;
    up.progress_user = &prog;
    if (!o->deq) {
        s = unpack_any(&up, in, out, err);
        cli_progress_end(&prog);
        return s;
    }
    char base[PATH_MAX];
    if (stz_tmp_beside(&tu, cli_tmp_base(out, base, sizeof base), "unpacked"))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", base);
    up.write_flags = STZ_WRITE_FORCE;
    s = unpack_any(&up, in, tu.path, err);
    cli_progress_end(&prog);
    if (!s) {
        stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
        qp.write_flags = o->c.force ? STZ_WRITE_FORCE : 0;
        cli_progress_init(&prog, "decompress: dequantize", quiet);
        qp.progress = cli_progress_cb;
        qp.progress_user = &prog;
        s = stz_dequantize_file(&qp, tu.path, out, o->c.dtype, err);
        cli_progress_end(&prog);
        if (s)
            cli_err_path(err, tu.path, in);
    }
    stz_tmp_remove(&tu);
    return s;
}

int cmd_decompress(int argc, char **argv)
{
    popts o;
    int rc = parse("decompress", decompress_help, argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.c.dtype != STZ_DTYPE_COUNT && !o.deq)
        return cli_usage_error("decompress", "--dtype needs --dequantize");
    const char *in = argv[optind];
    if (!strcmp(in, "-") && isatty(STDIN_FILENO))
        return cli_usage_error("decompress", "standard input is a terminal: pipe a container into it");
    char *out = cli_output_name("decompress", o.c.out, in, ".stz", "", &rc);
    if (!out)
        return rc;
    stz_err err;
    double t0 = cli_now();
    int sharded = stz_model_is_sharded(in);
    if (cli_mpi_size() > 1 && !sharded) {
        rc = cli_mpi_rank() ? CLI_USAGE
                            : cli_usage_error("decompress", "under mpirun IN must be a compressed sharded directory");
    } else if (sharded) {
        rc = cli_shards_run(in, out, ".stz", "", o.deq, o.c.threads, o.c.quiet, decompress_one, &o);
    } else if (strcmp(out, "-") && stz_output_check(out, o.c.force, &err)) {
        rc = cli_fail(&err);
    } else {
        rc = decompress_one(&o, in, out, o.c.threads, o.c.quiet, &err) ? cli_fail(&err) : CLI_OK;
    }
    if (rc == CLI_OK && strcmp(out, "-") && !cli_mpi_rank()) /* stdout carries the data, not a summary */
        cli_print_summary(&o.c, in, out, o.deq ? "dequantized" : "as packed", sharded, cli_now() - t0);
    free(out);
    return rc;
}
