/* stz imatrix: the importance matrix of a model from its own forward
 * pass; and --imatrix FILE of quantize, compress and tune, checked against
 * the model before any work. */
#include "cli.h"
#include "stz_imatrix.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char imatrix_help[] =
    "usage: stz imatrix MODEL [-o FILE] [options]\n\n"
    "Runs the model over token sequences and writes, for every weight matrix,\n"
    "the mean square of each input column: how much an error in that column\n"
    "of the weights moves the layer's output. stz quantize, compress and tune\n"
    "--imatrix FILE then choose each block's scales for the least error\n"
    "weighted by it. The file is llama.cpp's imatrix GGUF (llama-quantize\n"
    "--imatrix reads it too). The sequences are sampled from the model\n"
    "itself (no dataset needed; their importance is collected while they are\n"
    "sampled, one pass), or read from --tokens. Models stz eval --forward\n"
    "runs (Llama, Mistral, Qwen2, Qwen3, Phi-3, GPT-Neo, GPT-2, Gemma 2, 3), a file or a\n"
    "directory.\n\n"
    "  --tokens FILE       sequences to run: one per line (token ids split by\n"
    "                      spaces) or a JSON array of arrays\n"
    "  --sequences N       sequences to sample (default 16)\n"
    "  --seq-len L         tokens per sampled sequence (default 128, or the\n"
    "                      model's positions if fewer)\n"
    "  --seed S            sampling seed (default 1)\n"
    "  --config FILE       the model's config.json\n"
    "  -o FILE             output (default MODEL's name + .imatrix.gguf)\n"
    "  -T N                threads (default: all cores)\n"
    "  -f, --force         replace an existing output\n"
    "  --json              the summary as JSON\n"
    "  -q, --quiet         no progress, no summary\n"
    "  -h, --help          this text\n";

typedef struct {
    cli_common c;
    stz_seq_spec so;
    const char *config;
} imatrix_opts;

static int parse(int argc, char **argv, imatrix_opts *o)
{
    enum { O_CONFIG = 256 };
    static const struct option opts[] = {
        CLI_SEQ_LONG, {"config", required_argument, 0, O_CONFIG}, CLI_COMMON_LONG, {0, 0, 0, 0}};
    const stz_seq_spec defaults = STZ_IMATRIX_SEQS;
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->so = defaults;
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, CLI_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == O_CONFIG) {
            o->config = optarg;
            continue;
        }
        if ((rc = cli_seq_opt("imatrix", c, &o->so)) == -2)
            rc = cli_common_opt("imatrix", imatrix_help, c, &o->c);
        if (rc == -2)
            return cli_bad_option("imatrix");
        if (rc != -1)
            return rc;
    }
    if (optind != argc - 1)
        return cli_usage_error("imatrix", "expected one MODEL");
    return cli_seq_check("imatrix", &o->so, &defaults);
}

/* The model opened, its sequences run (sampled while collecting, or read
 * then run), the importance collected. */
static stz_status collect(const imatrix_opts *o, const char *model, const char *out, stz_imatrix **im, stz_seqs *q,
                          char *source, stz_err *err)
{
    stz_model_set S = {0};
    stz_fwd *fwd = NULL;
    stz_status st = stz_output_check(out, o->c.force, err);
    if (!st && !(st = stz_fwd_open_model(&fwd, &S, model, o->config, o->c.threads, err)) &&
        !(st = stz_imatrix_new(im, err)))
        st = stz_imatrix_sample(*im, fwd, &o->so, NULL, model, &cli_stages, o->c.quiet || o->c.json, q, source, err);
    stz_fwd_free(fwd);
    stz_model_set_free(&S);
    return st;
}

/* The summary line, or --json's document. */
static int report(const imatrix_opts *o, const char *model, const char *out, const stz_imatrix *im, const stz_seqs *q,
                  double secs)
{
    double tokens;
    const char *dataset = stz_imatrix_dataset(im, &tokens);
    if (o->c.json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", model);
        cJSON_AddStringToObject(d, "output", out);
        cJSON_AddNumberToObject(d, "entries", (double)stz_imatrix_count(im));
        cJSON_AddNumberToObject(d, "sequences", (double)q->nseq);
        cJSON_AddNumberToObject(d, "tokens", tokens);
        cJSON_AddStringToObject(d, "dataset", dataset);
        cJSON_AddNumberToObject(d, "seconds", secs);
        return cli_print_json(d);
    }
    if (!o->c.quiet)
        printf("%s -> %s: %zu matrices, %.0f tokens (%s) in %.2f s\n", model, out, stz_imatrix_count(im), tokens,
               dataset, secs);
    return CLI_OK;
}

int cmd_imatrix(int argc, char **argv)
{
    imatrix_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    const char *model = argv[optind];
    char *out = o.c.out ? strdup(o.c.out) : cli_model_output_name(model, ".imatrix.gguf"),
         source[STZ_SEQS_SOURCE_MAX] = "";
    stz_err err;
    if (!out)
        return stz_err_set(&err, STZ_E_NOMEM, "out of memory"), cli_fail(&err);
    o.c.threads = o.c.threads ? o.c.threads : cli_ncores();
    stz_imatrix *im = NULL;
    stz_seqs q = {0};
    double t0 = cli_now();
    stz_status st = collect(&o, model, out, &im, &q, source, &err);
    if (!st)
        st = stz_imatrix_save(im, out, o.c.force, &err);
    rc = st ? cli_fail(&err) : report(&o, model, out, im, &q, cli_now() - t0);
    free(out);
    stz_imatrix_free(im);
    stz_seqs_free(&q);
    return rc;
}
