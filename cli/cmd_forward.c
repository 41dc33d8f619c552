/* stz eval --forward: compares what two models output (KL divergence,
 * top-1 agreement, perplexity change) over the same token sequences. */
#include "cli.h"
#include "stz_forward.h"
#include "stz_model.h"
#include "stz_pipeline.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char forward_help[] =
    "usage: stz eval ORIGINAL CANDIDATE --forward [options]\n\n"
    "Runs both models (Llama-family decoders: Llama 2/3, Mistral, TinyLlama,\n"
    "Qwen2, llama2.c checkpoints) over the same token sequences and compares\n"
    "their next-token distributions at every position: mean KL(original ||\n"
    "candidate) with its standard error, median, p95, p99 and max; top-1\n"
    "agreement; perplexity of each on the sequences and its change. Either\n"
    "model may be plain, quantized, an .stz container or a model directory.\n"
    "The sequences are sampled from ORIGINAL (temperature 1, top-p 0.9) unless\n"
    "--tokens gives them. The configuration comes from --config, else\n"
    "config.json in the model directory, else the file's\n"
    "__metadata__[\"config\"], else config.json beside the file.\n\n"
    "  --tokens FILE       sequences to score: one per line (token ids split by\n"
    "                      spaces) or a JSON array of arrays of ids\n"
    "  --sequences N       sequences to sample (default 4)\n"
    "  --seq-len L         tokens per sampled sequence (default 128)\n"
    "  --seed S            sampling seed (default 1)\n"
    "  --temperature T     sampling temperature, 0 for greedy (default 1)\n"
    "  --top-p P           nucleus sampling mass (default 0.9)\n"
    "  --save-tokens FILE  write the sequences used, one per line (-f replaces)\n"
    "  --max-kl X          exit status 3 if the mean KL exceeds X\n"
    "  --config FILE       config.json for both models\n"
    "  -T N                threads (default: all cores)\n"
    "  --json              print the report as JSON\n"
    "  -q, --quiet         no progress\n"
    "  -h, --help          this text\n\n"
    "Exit status: 0 ok, 1 error, 2 usage, 3 --max-kl exceeded.\n";

/* ---- the command ------------------------------------------------------------- */

static cJSON *num(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static int print_report(const char *pa, const char *pb, const char *cfg_from, const stz_seqs *q, const char *source,
                        const stz_fwd_report *r, double max_kl, int json)
{
    if (json) {
        cJSON *doc = cJSON_CreateObject(), *kl = cJSON_CreateObject(), *ppl = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "original", pa);
        cJSON_AddStringToObject(doc, "candidate", pb);
        cJSON_AddStringToObject(doc, "config", cfg_from);
        cJSON_AddStringToObject(doc, "tokens", source);
        cJSON_AddNumberToObject(doc, "sequences", (double)q->nseq);
        cJSON_AddNumberToObject(doc, "positions", (double)r->positions);
        cJSON_AddItemToObject(kl, "mean", num(r->kl_mean));
        cJSON_AddItemToObject(kl, "stderr", num(r->kl_stderr));
        cJSON_AddItemToObject(kl, "median", num(r->kl_median));
        cJSON_AddItemToObject(kl, "p95", num(r->kl_p95));
        cJSON_AddItemToObject(kl, "p99", num(r->kl_p99));
        cJSON_AddItemToObject(kl, "max", num(r->kl_max));
        cJSON_AddItemToObject(doc, "kl", kl);
        cJSON_AddNumberToObject(doc, "top1_agreement", r->top1);
        cJSON_AddItemToObject(ppl, "original", num(r->ppl_ref));
        cJSON_AddItemToObject(ppl, "candidate", num(r->ppl_cand));
        cJSON_AddItemToObject(ppl, "change", num(r->ppl_change));
        cJSON_AddItemToObject(doc, "perplexity", ppl);
        if (max_kl >= 0)
            cJSON_AddNumberToObject(doc, "max_kl", max_kl);
        cJSON_AddBoolToObject(doc, "passed", !(max_kl >= 0 && r->kl_mean > max_kl));
        return cli_print_json(doc);
    }
    printf("%s -> %s: %zu sequences (%s), %llu positions scored\n", pa, pb, q->nseq, source,
           (unsigned long long)r->positions);
    printf("KL divergence    mean %.4g +- %.2g, median %.3g, p95 %.3g, p99 %.3g, max %.3g (nats/token)\n", r->kl_mean,
           r->kl_stderr, r->kl_median, r->kl_p95, r->kl_p99, r->kl_max);
    printf("top-1 agreement  %.2f%%\n", 100 * r->top1);
    printf("perplexity       %.4f -> %.4f (%+.2f%%)\n", r->ppl_ref, r->ppl_cand, 100 * r->ppl_change);
    if (max_kl >= 0)
        printf("mean KL %s the limit %g\n", r->kl_mean > max_kl ? "EXCEEDS" : "is within", max_kl);
    return CLI_OK;
}

/* stz eval --forward's options. */
typedef struct {
    const char *tokens_path, *save, *config;
    double nseq, len, seed, temp, top_p, max_kl;
    int json, quiet, force, threads;
} fwd_opts;

/* Options into o: -1, or the exit status of a usage error or --help. */
static int fwd_options(int argc, char **argv, fwd_opts *o)
{
    enum { O_FWD = 256, O_TOKENS, O_SEQS, O_LEN, O_SEED, O_TEMP, O_TOPP, O_SAVE, O_MAXKL, O_CONFIG, O_JSON };
    static const struct option opts[] = {{"forward", no_argument, 0, O_FWD},
                                         {"tokens", required_argument, 0, O_TOKENS},
                                         {"sequences", required_argument, 0, O_SEQS},
                                         {"seq-len", required_argument, 0, O_LEN},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"temperature", required_argument, 0, O_TEMP},
                                         {"top-p", required_argument, 0, O_TOPP},
                                         {"save-tokens", required_argument, 0, O_SAVE},
                                         {"max-kl", required_argument, 0, O_MAXKL},
                                         {"config", required_argument, 0, O_CONFIG},
                                         {"json", no_argument, 0, O_JSON},
                                         {"threads", required_argument, 0, 'T'},
                                         {"force", no_argument, 0, 'f'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    *o = (fwd_opts){.nseq = 4, .seed = 1, .temp = 1, .top_p = 0.9, .max_kl = -1, .threads = cli_ncores()};
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "T:fqh", opts, NULL)) != -1) {
        switch (c) {
        case O_FWD: break;
        case O_TOKENS: o->tokens_path = optarg; break;
        case O_SEQS:
            if ((rc = cli_number("eval", "--sequences", optarg, 1, 65536, &o->nseq)) >= 0)
                return rc;
            break;
        case O_LEN:
            if ((rc = cli_number("eval", "--seq-len", optarg, 2, 1 << 20, &o->len)) >= 0)
                return rc;
            break;
        case O_SEED:
            if ((rc = cli_number("eval", "--seed", optarg, 0, 1e15, &o->seed)) >= 0)
                return rc;
            break;
        case O_TEMP:
            if ((rc = cli_number("eval", "--temperature", optarg, 0, 100, &o->temp)) >= 0)
                return rc;
            break;
        case O_TOPP:
            if ((rc = cli_number("eval", "--top-p", optarg, 0, 1, &o->top_p)) >= 0)
                return rc;
            break;
        case O_MAXKL:
            if ((rc = cli_number("eval", "--max-kl", optarg, 0, 1e9, &o->max_kl)) >= 0)
                return rc;
            break;
        case O_SAVE: o->save = optarg; break;
        case O_CONFIG: o->config = optarg; break;
        case O_JSON: o->json = 1; break;
        case 'T':
            if ((o->threads = cli_threads(optarg)) < 0)
                return cli_usage_error("eval", "-T takes 0..256, not '%s'", optarg);
            o->threads = o->threads ? o->threads : cli_ncores();
            break;
        case 'f': o->force = 1; break;
        case 'q': o->quiet = 1; break;
        case 'h': return fputs(forward_help, stdout), CLI_OK;
        default: return cli_bad_option("eval");
        }
    }
    if (optind != argc - 2)
        return cli_usage_error("eval", "expected ORIGINAL and CANDIDATE");
    if (o->tokens_path && (o->nseq != 4 || o->len || o->seed != 1))
        return cli_usage_error("eval", "--tokens gives the sequences: --sequences, --seq-len and --seed do not apply");
    if (o->nseq != floor(o->nseq) || o->len != floor(o->len) || o->seed != floor(o->seed))
        return cli_usage_error("eval", "--sequences, --seq-len and --seed take whole numbers");
    return -1;
}

/* Both models' configurations: --config for both, else each its own (a
 * candidate without one is taken to be the original's). */
static stz_status both_configs(const fwd_opts *o, const char *pa, const char *pb, const stz_model_set *A,
                               const stz_model_set *B, stz_fwd_config *ca, stz_fwd_config *cb, char *from_a,
                               stz_err *err)
{
    char from_b[STZ_FWD_FROM_MAX];
    if (o->config) {
        if (stz_fwd_config_find(pa, A, o->config, ca, from_a, NULL, err) < 0)
            return err->code;
        *cb = *ca;
        return STZ_OK;
    }
    int fa, fb;
    if ((fa = stz_fwd_config_find(pa, A, NULL, ca, from_a, NULL, err)) < 0 ||
        (fb = stz_fwd_config_find(pb, B, NULL, cb, from_b, NULL, err)) < 0)
        return err->code;
    if (!fa)
        return stz_fwd_no_config(pa, A, err);
    if (!fb)
        *cb = *ca;
    return STZ_OK;
}

int cmd_eval_forward(int argc, char **argv)
{
    fwd_opts o;
    int rc = fwd_options(argc, argv, &o);
    if (rc >= 0)
        return rc;
    const char *pa = argv[optind], *pb = argv[optind + 1];
    stz_err err;
    if (o.save && stz_output_check(o.save, o.force, &err))
        return cli_fail(&err);
    if (o.save && (stz_refuse_input_as_output(pa, o.save, &err) || stz_refuse_input_as_output(pb, o.save, &err)))
        return cli_fail(&err);
    stz_model_set A = {0}, B = {0};
    stz_fwd *ma = NULL, *mb = NULL;
    stz_seqs q = {0};
    stz_fwd_config ca, cb;
    char from_a[STZ_FWD_FROM_MAX], source[64];
    rc = CLI_ERROR;
    if (stz_model_set_open(&A, pa, &err) || stz_model_set_open_like(&B, pb, &A, &err) ||
        both_configs(&o, pa, pb, &A, &B, &ca, &cb, from_a, &err) ||
        stz_fwd_open(&ma, A.m, A.n, &ca, pa, o.threads, &err) || stz_fwd_open(&mb, B.m, B.n, &cb, pb, o.threads, &err))
        goto fail;
    cli_progress prog;
    stz_seq_spec so = {o.tokens_path, (size_t)o.nseq, (size_t)o.len, 128, (uint64_t)o.seed, o.temp, o.top_p};
    if (stz_seqs_get_staged(ma, &so, pa, &cli_stages, o.quiet || o.json, &q, source, &err) ||
        (o.save && stz_seqs_save(o.save, &q, o.force, &err)))
        goto fail;
    stz_fwd_report r;
    cli_progress_init(&prog, "forward", (o.quiet || o.json ? STZ_STAGE_QUIET : 0) | STZ_STAGE_ITEMS);
    stz_status st = stz_fwd_compare(ma, mb, q.tok, q.nseq, 0, q.lens, cli_progress_cb, &prog, &r, &err);
    cli_progress_end(&prog);
    if (st)
        goto fail;
    rc = print_report(pa, pb, from_a, &q, source, &r, o.max_kl, o.json);
    if (rc == CLI_OK && o.max_kl >= 0 && r.kl_mean > o.max_kl) {
        fprintf(stderr, "stz: check failed: mean KL %.4g exceeds --max-kl %g\n", r.kl_mean, o.max_kl);
        rc = 3;
    }
    goto done;
fail:
    rc = cli_fail(&err);
done:
    stz_seqs_free(&q);
    stz_fwd_free(ma);
    stz_fwd_free(mb);
    stz_model_set_free(&A);
    stz_model_set_free(&B);
    return rc;
}
