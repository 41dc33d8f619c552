/* stz compress / decompress: policy -> quantize / SVD -> pack in one go,
 * and back. Intermediate files live next to the output under a hidden
 * temporary name, tracked so that errors and signals remove them. */
#include "cli.h"
#include "stz_feedback.h"
#include "stz_imatrix.h"
#include "stz_pack.h"
#include "stz_policy.h"
#include "stz_model.h"
#include "stz_pipeline.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
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
    "IN may be a directory of shards (model.safetensors.index.json).\n\n"
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

/* The name of the policy for default output names: a shipped name, or a
 * policy file's name without its directory and .json. */
static char *policy_tag(const cli_policy_opts *po)
{
    const char *p = po->policy ? po->policy : "custom", *slash = strrchr(p, '/');
    char *t = strdup(slash ? slash + 1 : p);
    size_t n = t ? strlen(t) : 0;
    if (n > 5 && !strcmp(t + n - 5, ".json"))
        t[n - 5] = 0;
    return t;
}

/* IN.stz (lossless), BASE.TAG.safetensors.stz or IN.TAG.stz (lossy). */
static char *default_output(const char *in, const popts *o)
{
    size_t n = strlen(in);
    while (n > 1 && in[n - 1] == '/')
        n--;
    char *tag = o->lossless ? NULL : policy_tag(&o->po), *out = malloc(n + (tag ? strlen(tag) : 0) + 32);
    if (!o->lossless && !tag) /* out of memory: not the lossless name */
        free(out), out = NULL;
    if (out && !tag)
        sprintf(out, "%.*s.stz", (int)n, in);
    else if (out && n > 12 && !strncmp(in + n - 12, ".safetensors", 12))
        sprintf(out, "%.*s.%s.safetensors.stz", (int)(n - 12), in, tag);
    else if (out)
        sprintf(out, "%.*s.%s.stz", (int)n, in, tag);
    free(tag);
    return out;
}

/* What compress does to one file, and the totals over all of them. */
typedef struct {
    const popts *o;
    stz_policy *pol;
    const stz_imatrix *im; /* --imatrix, or NULL */
    stz_feedback *fb;      /* error feedback's results, or NULL */
    uint64_t in_bytes, out_bytes;
    stz_quant_stats qs; /* summed over files: counts, min cosine */
    int64_t wfix;       /* sum of cosine x parameters in 1/65536: integers add up the same in any order */
    double wtot;
    int files;
    pthread_mutex_t lock; /* the sums, when shards run at once */
} compress_ctx;

/* One file: quantized straight into the container (one pass, no
 * intermediate file), or packed as it is with --lossless. */
static stz_status compress_one(void *user, const char *in, const char *out, int threads, int quiet, stz_err *err)
{
    compress_ctx *c = (compress_ctx *)user;
    const popts *o = c->o;
    const char *shard = strrchr(in, '/') ? strrchr(in, '/') + 1 : in;
    stz_status s = STZ_OK;
    cli_progress prog;
    char label[64];
    stz_pack_params pp = STZ_PACK_PARAMS_DEFAULT;
    pp.threads = threads;
    pp.level = o->best ? STZ_PACK_BEST : STZ_PACK_FAST;
    pp.write_flags = o->c.force ? STZ_WRITE_FORCE : 0;
    snprintf(label, sizeof label, "compress %.40s", shard);
    cli_progress_init(&prog, label, quiet);
    stz_pack_stats ps;
    stz_quant_stats qs = {0};
    if (o->lossless) {
        pp.progress = cli_progress_cb;
        pp.progress_user = &prog;
        s = strcmp(in, "-") ? stz_pack_file(&pp, in, out, &ps, err)
                            : stz_pack_stream(&pp, STDIN_FILENO, "standard input", out, &ps, err);
    } else {
        stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
        qp.threads = threads;
        qp.progress = cli_progress_cb;
        qp.progress_user = &prog;
        qp.imatrix = c->im;
        qp.feedback = c->fb;
        if (!(s = stz_compress_file(&qp, &pp, c->pol, in, out, &qs, &ps, err))) {
            pthread_mutex_lock(&c->lock); /* shards may run at once */
            c->qs.tensors += qs.tensors, c->qs.quantized += qs.quantized;
            c->qs.params += qs.params, c->qs.params_quantized += qs.params_quantized;
            c->wfix += llround(ldexp(qs.weighted_cosine * (double)qs.params, 16)), c->wtot += (double)qs.params;
            if (qs.quantized && qs.min_cosine < c->qs.min_cosine) {
                c->qs.min_cosine = qs.min_cosine;
                memcpy(c->qs.worst, qs.worst, sizeof qs.worst);
            }
            pthread_mutex_unlock(&c->lock);
        }
    }
    cli_progress_end(&prog);
    if (s)
        return s;
    pthread_mutex_lock(&c->lock);
    c->in_bytes += o->lossless ? ps.in_bytes : qs.in_bytes; /* the model's bytes, not the quantized file's */
    c->out_bytes += ps.out_bytes;
    c->files++;
    pthread_mutex_unlock(&c->lock);
    return STZ_OK;
}

/* Under MPI: every rank's sums, the lowest cosine and its tensor. */
static void mpi_gather(compress_ctx *c)
{
    double v[9] = {(double)c->in_bytes,
                   (double)c->out_bytes,
                   (double)c->files,
                   (double)c->qs.tensors,
                   (double)c->qs.quantized,
                   (double)c->qs.params,
                   (double)c->qs.params_quantized,
                   (double)(c->wfix >> 32),
                   (double)(c->wfix & 0xffffffff)}; /* exact in doubles */
    cli_mpi_sum(v, 9);
    cli_mpi_sum(&c->wtot, 1);
    c->in_bytes = (uint64_t)v[0], c->out_bytes = (uint64_t)v[1], c->files = (int)v[2];
    c->qs.tensors = (size_t)v[3], c->qs.quantized = (size_t)v[4], c->qs.params = (uint64_t)v[5];
    c->qs.params_quantized = (uint64_t)v[6], c->wfix = (int64_t)v[7] * ((int64_t)1 << 32) + (int64_t)v[8];
    int who = cli_mpi_min_rank(c->qs.min_cosine);
    cli_mpi_bcast(&c->qs.min_cosine, sizeof c->qs.min_cosine, who);
    cli_mpi_bcast(c->qs.worst, sizeof c->qs.worst, who);
}

stz_status cli_compress_policy(const char *in, const char *out, stz_policy *pol, const stz_imatrix *im,
                               const cli_seq_opts *so, const char *config, int threads, int quiet, uint64_t *bytes,
                               stz_err *err)
{
    popts o;
    memset(&o, 0, sizeof o);
    cli_common_init(&o.c);
    o.c.threads = threads, o.c.quiet = quiet, o.c.force = 1; /* a file OUT is replaced: the caller's temporary */
    compress_ctx c = {.o = &o, .pol = pol, .im = im};
    c.qs.min_cosine = 1;
    pthread_mutex_init(&c.lock, NULL);
    o.po.config = stz_policy_feedback(pol) ? config : NULL; /* (refused without feedback) */
    if (so)
        o.po.so = *so;
    stz_status st = cli_feedback_open(&o.po, pol, in, NULL, 1, threads, quiet, &c.fb, err);
    if (!st && stz_model_is_sharded(in)) {
        if (cli_shards_run(in, out, "", ".stz", 1, threads, quiet, compress_one, &c) != CLI_OK)
            st = stz_err_set(err, STZ_E_IO, "%s: compressing the shards failed (above)", in);
    } else if (!st) {
        st = compress_one(&c, in, out, threads, quiet, err);
    }
    pthread_mutex_destroy(&c.lock);
    stz_feedback_free(c.fb);
    *bytes = st ? 0 : cli_path_bytes(out, 0);
    return st;
}

/* stz compress. Longer than most: the options, the run (a file, standard
 * input, a sharded directory, over MPI ranks: each a call), then the
 * report as JSON or text, line by line. */
int cmd_compress(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--tune"))
            return cmd_tune(argc, argv); /* stz compress MODEL --tune BUDGET -o OUT.stz */
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
    const char *in = argv[optind];
    char *out = o.c.out ? strdup(o.c.out) : default_output(in, &o);
    stz_err err;
    if (!out)
        return stz_err_set(&err, STZ_E_NOMEM, "%s: out of memory for the output's name", in), cli_fail(&err);
    compress_ctx c = {.o = &o};
    c.qs.min_cosine = 1;
    pthread_mutex_init(&c.lock, NULL);
    double t0 = cli_now();
    int sharded = stz_model_is_sharded(in);
    stz_imatrix *im = NULL;
    if (!o.lossless && (cli_policy_load(&o.po, &c.pol, &err) || cli_imatrix_open(o.po.imatrix, in, &im, &err))) {
        stz_policy_free(c.pol);
        free(out);
        return cli_fail(&err);
    }
    c.im = im;
    if (!o.lossless &&
        cli_feedback_open(&o.po, c.pol, in, sharded ? NULL : out, o.c.force, o.c.threads ? o.c.threads : cli_ncores(),
                          o.c.quiet || o.c.json, &c.fb, &err)) {
        stz_policy_free(c.pol);
        stz_imatrix_free(im);
        free(out);
        return cli_fail(&err);
    }
    int mpi = cli_mpi_size() > 1;
    if (mpi && !sharded) {
        rc = cli_mpi_rank() ? CLI_USAGE
                            : cli_usage_error("compress", "under mpirun IN must be a sharded model directory");
    } else if (sharded) {
        rc = cli_shards_run(in, out, "", ".stz", !o.lossless, o.c.threads, o.c.quiet, compress_one, &c);
        if (mpi && rc == CLI_OK)
            mpi_gather(&c);
    } else if (strcmp(out, "-") && stz_output_check(out, o.c.force, &err)) { /* refuse before the long work */
        rc = cli_fail(&err);
    } else {
        rc = compress_one(&c, in, out, o.c.threads, o.c.quiet, &err) ? cli_fail(&err) : CLI_OK;
    }
    if (rc == CLI_OK && c.pol && !o.c.quiet && !mpi) { /* (under MPI each rank saw only its shards) */
        stz_reader *names = NULL;
        stz_err ignored;
        if (!sharded)
            stz_reader_open(&names, in, &ignored);
        cli_policy_warn_unused(c.pol, names);
        stz_reader_free(names);
    }
    stz_policy_free(c.pol);
    stz_imatrix_free(im);
    stz_feedback_free(c.fb);
    pthread_mutex_destroy(&c.lock);
    if (rc != CLI_OK || cli_mpi_rank()) { /* rank 0 reports for all */
        free(out);
        return rc;
    }
    double secs = cli_now() - t0, ratio = c.out_bytes ? (double)c.in_bytes / (double)c.out_bytes : 0;
    double wmean = c.wtot ? ldexp((double)c.wfix, -16) / c.wtot : 1;
    int show_eval = !o.lossless && !o.noeval;
    if (o.c.json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", in);
        cJSON_AddStringToObject(d, "output", out);
        cJSON_AddStringToObject(d, "mode", o.lossless ? "lossless" : o.po.policy ? o.po.policy : "custom");
        cJSON_AddNumberToObject(d, "files", c.files);
        cJSON_AddNumberToObject(d, "in_bytes", (double)c.in_bytes);
        cJSON_AddNumberToObject(d, "out_bytes", (double)c.out_bytes);
        cJSON_AddNumberToObject(d, "ratio", ratio);
        cJSON_AddNumberToObject(d, "seconds", secs);
        if (!o.lossless) {
            cJSON_AddNumberToObject(d, "tensors_quantized", (double)c.qs.quantized);
            cJSON_AddNumberToObject(d, "params_quantized_share",
                                    c.qs.params ? (double)c.qs.params_quantized / (double)c.qs.params : 0);
        }
        if (show_eval) {
            cJSON_AddNumberToObject(d, "weighted_cosine", wmean);
            cJSON_AddNumberToObject(d, "min_cosine", c.qs.min_cosine);
            cJSON_AddStringToObject(d, "worst_tensor", c.qs.worst);
        }
        rc = cli_print_json(d);
    } else if (!o.c.quiet) {
        char a[32], b[32];
        printf("%s -> %s: %s -> %s bytes (%.3fx) in %.2f s (%s%s)\n", strcmp(in, "-") ? in : "standard input", out,
               cli_commas(a, c.in_bytes), cli_commas(b, c.out_bytes), ratio, secs,
               o.lossless    ? "lossless, bit-exact"
               : o.po.policy ? o.po.policy
                             : "custom",
               sharded ? ", sharded" : "");
        if (!o.lossless)
            printf("%zu of %zu tensors quantized (%.1f%% of parameters)\n", c.qs.quantized, c.qs.tensors,
                   c.qs.params ? 100.0 * (double)c.qs.params_quantized / (double)c.qs.params : 0);
        if (show_eval && c.qs.quantized) /* the figures stz eval gives */
            printf("cosine vs original: weighted mean %.6f, minimum %.6f (%s)\n", wmean, c.qs.min_cosine, c.qs.worst);
    }
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
    cli_tmpfile tu = {0};
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
    if (cli_tmp_make(&tu, cli_tmp_base(out, base, sizeof base), "unpacked"))
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
    cli_tmp_drop(&tu);
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
