/* stz tune (and stz compress --tune): choose each tensor's action for a
 * size or quality budget, verify by compressing and running the model,
 * correct once. */
#include "cmd_tune.h"
#include "gguf/gguf_format.h"
#include "stz_imatrix.h"
#include "stz_pack.h"
#include "stz_policy.h"
#include "stz_tune.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char tune_help[] =
    "usage: stz tune MODEL BUDGET [options]\n"
    "       stz compress MODEL --tune BUDGET [options] -o OUT.stz\n"
    "       stz compress MODEL --tune BUDGET --gguf [options] -o OUT.gguf\n\n"
    "Chooses for every weight matrix the action (keep, or a bit width, method,\n"
    "block size and scale storage) that gives the lowest KL divergence of the\n"
    "model's outputs for a size budget, or the smallest container (--gguf:\n"
    "GGUF file) for a KL budget. Each candidate is measured on each matrix\n"
    "(its error, and its bytes after the lossless stage or in the GGUF); each\n"
    "matrix's sensitivity with the forward pass; the budget is solved, then\n"
    "checked by compressing (and exporting) the model and running it\n"
    "(corrected up to twice if missed). Writes an ordinary policy\n"
    "(stz compress --policy) and prints a report. Llama-family models only\n"
    "(those stz eval --forward runs), a file or a directory (sharded or not).\n\n"
    "BUDGET, one of:\n"
    "  --size BYTES        container at most BYTES (suffixes K, M, G: powers of 1024)\n"
    "  --ratio R           container at most MODEL's size / R\n"
    "  --bits-per-weight B container at most B bits per parameter\n"
    "  --max-kl K          mean KL(original || compressed) at most K nats/token\n\n"
    "  --imatrix FILE      importance matrix (stz imatrix): candidates quantized and\n"
    "                      their errors weighed with it (then quantize with it too)\n"
    "  --candidates LIST   comma-separated: keep, BITS:METHOD:BLOCK:SCALES,\n"
    "                      svd:RANK and llama.cpp's types (q4_k, iq4_nl, f16, ...);\n"
    "                      a block candidate's name + \"+fb\": with error feedback\n"
    "                      (default keep,8:absmax:32:F16,6:nl:32:U8,5:nl:32:U8,\n"
    "                      4:nl:16:U8,4:nl:32:U8,3:nl:32:U8,2:nl:32:U8)\n"
    "  --feedback          every block candidate with error feedback (+fb): its\n"
    "                      errors, and plain rounding's, measured on the layers'\n"
    "                      outputs over 16 x 256 sampled tokens (seed 1; --tokens\n"
    "                      FILE's when given); the policy says \"feedback\": true\n"
    "                      (compress then calibrates again)\n"
    "  --gguf              sizes are the GGUF file's (stz export --gguf of the\n"
    "                      result); candidates keep and llama.cpp's types (default\n"
    "                      keep,f16,q8_0,q6_k,q5_k,q5_1,q5_0,q4_k,q4_1,q4_0,iq4_nl,\n"
    "                      iq4_xs,q3_k,q2_k), a type offered to the matrices whose\n"
    "                      rows are whole blocks of it, and 32-block types in padded\n"
    "                      blocks to down projections whose rows are not (export\n"
    "                      widens the FFN); compress --tune writes the GGUF\n"
    "  --no-pad            no padded blocks: the model's own FFN width\n"
    "  --tokenizer FILE    --gguf: the tokenizer, as stz export --gguf takes it\n"
    "  --pad-vocab         --gguf: as stz export --gguf takes it\n"
    "  --name NAME         --gguf: the GGUF's general.name\n"
    "  --tokens FILE       sequences to measure on (as stz eval --forward); error\n"
    "                      feedback calibrates on them too (then quantize with it)\n"
    "  --sequences N       sequences to sample from the model (default 4)\n"
    "  --seq-len L         tokens per sampled sequence (default 64)\n"
    "  --seed S            sampling seed (default 1)\n"
    "  --config FILE       the model's config.json\n"
    "  --plot FILE.svg     the Pareto curve (size against predicted KL) as SVG\n"
    "  --no-verify         do not compress and measure the choice\n"
    "  -o FILE             tune: the policy (default MODEL's name + .tune.json);\n"
    "                      compress --tune: the container, or with --gguf the GGUF\n"
    "                      file (its policy with --save-policy FILE)\n"
    "  -T N                threads (default: all cores)\n"
    "  -f, --force         replace existing outputs\n"
    "  --json              the report as JSON on standard output\n"
    "  -q, --quiet         no progress, no report\n"
    "  -h, --help          this text\n\n"
    "Exit status: 0 ok, 1 error, 2 usage, 3 the budget cannot be met (the\n"
    "closest feasible point is reported; nothing is written).\n";

static int number(const char *opt, const char *arg, double lo, double hi, double *v)
{
    size_t n = strlen(arg);
    char c = n > 1 && !strcmp(opt, "--size") ? arg[n - 1] : 0, num[64];
    double mul = c == 'K' || c == 'k' ? 1024.0 : c == 'M' ? 1048576.0 : c == 'G' ? 1073741824.0 : 1;
    if (mul == 1 || n >= sizeof num)
        return cli_number("tune", opt, arg, lo, hi, v);
    snprintf(num, sizeof num, "%.*s", (int)n - 1, arg); /* the number before the suffix */
    int rc = cli_number("tune", opt, num, lo / mul, hi / mul, v);
    *v *= mul;
    return rc;
}

static int parse(int argc, char **argv, tune_opts *o)
{
    enum {
        O_SIZE = 256,
        O_RATIO,
        O_BPW,
        O_MAXKL,
        O_CAND,
        O_IMATRIX,
        O_CONFIG,
        O_PLOT,
        O_NOVERIFY,
        O_TUNE,
        O_SAVEPOL,
        O_GGUF,
        O_TOKENIZER,
        O_NAME,
        O_FEEDBACK,
        O_NOPAD,
        O_PADVOCAB
    };
    static const struct option opts[] = {{"size", required_argument, 0, O_SIZE},
                                         {"ratio", required_argument, 0, O_RATIO},
                                         {"bits-per-weight", required_argument, 0, O_BPW},
                                         {"max-kl", required_argument, 0, O_MAXKL},
                                         {"candidates", required_argument, 0, O_CAND},
                                         {"imatrix", required_argument, 0, O_IMATRIX},
                                         CLI_SEQ_LONG,
                                         {"config", required_argument, 0, O_CONFIG},
                                         {"plot", required_argument, 0, O_PLOT},
                                         {"no-verify", no_argument, 0, O_NOVERIFY},
                                         {"tune", no_argument, 0, O_TUNE},
                                         {"save-policy", required_argument, 0, O_SAVEPOL},
                                         {"gguf", no_argument, 0, O_GGUF},
                                         {"tokenizer", required_argument, 0, O_TOKENIZER},
                                         {"name", required_argument, 0, O_NAME},
                                         {"feedback", no_argument, 0, O_FEEDBACK},
                                         {"no-pad", no_argument, 0, O_NOPAD},
                                         {"pad-vocab", no_argument, 0, O_PADVOCAB},
                                         CLI_COMMON_LONG,
                                         {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->verify = 1;
    const stz_seq_spec defaults = {NULL, 4, 0, 64, 1, 1, 0.9};
    o->so = defaults;
    int c, rc, budgets = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, CLI_COMMON_SHORT, opts, NULL)) != -1) {
        switch (c) {
        case O_SIZE:
            budgets++, o->kind = STZ_BUDGET_BYTES, o->budget_opt = "--size";
            if ((rc = number("--size", optarg, 1, 1e18, &o->size)) >= 0)
                return rc;
            break;
        case O_RATIO:
            budgets++, o->kind = STZ_BUDGET_BYTES, o->budget_opt = "--ratio";
            if ((rc = number("--ratio", optarg, 0.01, 1e6, &o->ratio)) >= 0)
                return rc;
            break;
        case O_BPW:
            budgets++, o->kind = STZ_BUDGET_BYTES, o->budget_opt = "--bits-per-weight";
            if ((rc = number("--bits-per-weight", optarg, 0.01, 64, &o->bpw)) >= 0)
                return rc;
            break;
        case O_MAXKL:
            budgets++, o->kind = STZ_BUDGET_KL, o->budget_opt = "--max-kl";
            if ((rc = number("--max-kl", optarg, 0, 1e9, &o->max_kl)) >= 0)
                return rc;
            break;
        case O_CAND: o->candidates = optarg; break;
        case O_IMATRIX: o->imatrix = optarg; break;
        case O_CONFIG: o->config = optarg; break;
        case O_PLOT: o->plot = optarg; break;
        case O_NOVERIFY: o->verify = 0; break;
        case O_TUNE: o->compress = 1; break;
        case O_SAVEPOL: o->save_policy = optarg; break;
        case O_GGUF: o->gguf = 1; break;
        case O_PADVOCAB: o->pad_vocab = 1; break;
        case O_TOKENIZER: o->tokenizer = optarg; break;
        case O_NAME: o->name = optarg; break;
        case O_FEEDBACK: o->feedback = 1; break;
        case O_NOPAD: o->no_pad = 1; break;
        default:
            if ((rc = cli_seq_opt("tune", c, &o->so)) != -2) {
                if (rc == -1)
                    break;
                return rc;
            }
            if ((rc = cli_common_opt("tune", tune_help, c, &o->c)) != -2) {
                if (rc == -1)
                    break;
                return rc;
            }
            return cli_bad_option("tune");
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("tune", "expected one MODEL");
    if (budgets != 1)
        return cli_usage_error("tune", "give exactly one budget: --size, --ratio, --bits-per-weight or --max-kl");
    if ((rc = cli_seq_check("tune", &o->so, &defaults)) >= 0)
        return rc;
    if (o->compress && !o->verify)
        return cli_usage_error("compress", "--tune writes the verified container: --no-verify does not apply");
    if (!o->gguf && (o->tokenizer || o->name || o->pad_vocab))
        return cli_usage_error("tune", "--tokenizer, --name and --pad-vocab are for --gguf");
    if (!o->gguf && (rc = cli_not_gguf(o->compress ? "compress" : "tune", o->c.out,
                                       o->compress ? "an stz container" : "a policy")) >= 0)
        return rc;
    if (!o->candidates)
        o->candidates = stz_tune_candidate_set(o->gguf ? "gguf" : "default");
    if (!o->compress && o->save_policy)
        return cli_usage_error("tune", "--save-policy is for stz compress --tune (stz tune writes the policy with -o)");
    return -1;
}

/* ---- verifying -------------------------------------------------------------------- */

/* ---- the command ------------------------------------------------------------------ */

static stz_status write_text(const char *path, const char *text, int force, stz_err *err)
{
    cli_tmpfile t;
    if (cli_tmp_make(&t, path, "policy"))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", path);
    FILE *f = fopen(t.path, "w");
    if (f) /* a failed write shows in ferror */
        fputs(text, f), fputc('\n', f);
    return cli_tmp_finish(&t, f, path, force, err);
}

/* A verified KL more than twice or less than half the prediction (above
 * noise: 0.001). */
static int kl_far(double predicted, double got)
{
    return got > 1e-3 && (predicted <= 0 || got > 2 * predicted || got < predicted / 2);
}

/* One run of stz tune: the model, its forward pass and sequences, the
 * measurements, the solution and what was verified. */
typedef struct {
    tune_opts o;
    const char *model;
    char *out;
    int sharded;
    stz_model_set S;
    stz_imatrix *im; /* --imatrix, or NULL */
    stz_fwd *fwd;
    stz_fwd_config cfg;
    stz_seqs q;
    char source[64];
    stz_tune T;
    stz_tune_cand *cand;
    size_t ncand;
    stz_tune_solution sol;
    stz_tune_point first; /* the prediction before the corrections */
    char desc[512];
    char *policy;
    char *cfg_json;      /* config.json's text, for --gguf's export */
    uint64_t gguf_keep;  /* --gguf: the GGUF file's bytes with every tensor kept */
    uint64_t gguf_widen; /* --gguf: what its header grows by with a widened FFN */
    cli_tmpfile tc;
    cli_tmpfile tcc; /* --gguf: the container exported */
    measured m1, m2; /* the first verification's, the last correction's */
    int have1, have2, corrections;
} tune_run;

static stz_gguf_params gguf_params(const tune_opts *o)
{
    stz_gguf_params p = STZ_GGUF_PARAMS_DEFAULT;
    p.tokenizer = o->tokenizer, p.name = o->name, p.threads = o->c.threads, p.write_flags = STZ_WRITE_FORCE;
    p.pad_vocab = o->pad_vocab;
    return p;
}

/* The sequences error feedback calibrates on: --tokens FILE's when given
 * (tune measures on them too), else NULL, its default sampled ones. */
static const stz_seq_spec *feedback_seqs(const tune_opts *o) { return o->so.path ? &o->so : NULL; }

/* The model (a file or a sharded directory) compressed with the policy
 * into `out` (a file replaced, a directory made), as stz compress does;
 * *bytes: what out holds. */
static stz_status compress(const tune_run *t, stz_policy *pol, const char *out, uint64_t *bytes, stz_err *err)
{
    const tune_opts *o = &t->o;
    stz_compress_params p = {pol, t->im,           feedback_seqs(o),        o->config,   o->c.threads,
                             0,   STZ_WRITE_FORCE, o->c.quiet || o->c.json, &cli_stages, cli_ranks()};
    stz_compress_result r;
    stz_status st = stz_compress_model(&p, t->model, out, &r, err); /* a folder: its model.safetensors */
    *bytes = st ? 0 : cli_path_bytes(out, 0);
    return st;
}

/* Compresses the model (a file or a sharded directory) with the policy
 * into `out` (--gguf: into the container t->tcc, exported to `out` as
 * GGUF) and runs what `out` holds against the original on the same
 * sequences. */
static stz_status verify(tune_run *t, const char *out, measured *res, stz_err *err)
{
    const tune_opts *o = &t->o;
    const char *container = o->gguf ? t->tcc.path : out;
    stz_policy *pol = NULL;
    stz_model_set C = {0}, R = {0};
    stz_fwd *cand = NULL;
    stz_gguf_params gp = gguf_params(o);
    stz_gguf_stats gs;
    cli_progress prog;
    stz_status st = stz_policy_parse(&pol, t->policy, strlen(t->policy), "tuned policy", err);
    if (!st && t->sharded)
        stz_remove_tree(container); /* the first round's */
    if (!st)
        st = compress(t, pol, container, &res->bytes, err);
    if (!st)
        st = stz_model_set_open(&C, container, err);
    if (!st && o->gguf && !(st = cli_export_gguf(t->model, &C, &t->cfg, t->cfg_json, &gp, out, &gs, err))) {
        res->bytes = cli_path_bytes(out, 0);
        st = stz_model_set_open_like(&R, out, &t->S, err); /* what llama.cpp runs */
    }
    if (!st && !(st = stz_fwd_open(&cand, o->gguf ? R.m : C.m, o->gguf ? R.n : C.n, &t->cfg, out, o->c.threads, err))) {
        cli_progress_init(&prog, "tune: verify, forward", o->c.quiet || o->c.json);
        st = stz_fwd_compare(t->fwd, cand, t->q.tok, t->q.nseq, 0, t->q.lens, cli_progress_cb, &prog, &res->fwd, err);
        cli_progress_end(&prog);
    }
    stz_fwd_free(cand);
    stz_model_set_free(&R);
    stz_model_set_free(&C);
    stz_policy_free(pol);
    return st;
}

/* Outputs checked, candidates parsed, the model and its forward pass
 * opened, the sequences sampled or read. */
static stz_status tune_open(tune_run *t, stz_err *err)
{
    tune_opts *o = &t->o;
    const char *outs[2] = {t->out, o->compress ? o->save_policy : o->plot};
    stz_status st = STZ_OK;
    for (int k = 0; !st && k < 2; k++)
        if (outs[k])
            st = stz_output_check(outs[k], o->c.force, err);
    if (st || (st = stz_tune_parse_candidates(o->candidates, &t->cand, &t->ncand, err)) ||
        (st = stz_model_set_open(&t->S, t->model, err)) || (st = stz_refuse_input_as_output(t->model, t->out, err)) ||
        (st = cli_imatrix_open(o->imatrix, t->model, &t->im, err)) ||
        (o->feedback && (st = stz_tune_cands_feedback(t->cand, t->ncand, err)))) /* keep, svd and f16 stay */
        return st;
    t->sharded = stz_model_is_sharded(t->model);
    char from[STZ_FWD_FROM_MAX];
    int found = stz_fwd_config_find(t->model, &t->S, o->config, &t->cfg, from, &t->cfg_json, err);
    if (found < 0)
        return err->code;
    if ((!found && (st = stz_fwd_no_config(t->model, &t->S, err))))
        return st;
    if (o->gguf) { /* before the long work: a model export cannot write */
        stz_gguf_params gp = gguf_params(o);
        stz_gguf_stats gs;
        if ((st = cli_export_gguf(t->model, &t->S, &t->cfg, t->cfg_json, &gp, NULL, &gs, err)))
            return st;
        t->gguf_keep = gs.file_bytes;
        t->gguf_widen = gguf_padded(gs.header_bytes + STZ_GGUF_KEY_FFN_BYTES) - gguf_padded(gs.header_bytes);
    }
    o->c.threads = o->c.threads ? o->c.threads : cli_ncores();
    if ((st = stz_fwd_open(&t->fwd, t->S.m, t->S.n, &t->cfg, t->model, o->c.threads, err)))
        return st;
    stz_fwd_set_keep(t->fwd, 0); /* sampling rereads the weights: memory stays one layer's, whatever the depth */
    return cli_seqs_get(&o->so, t->fwd, t->model, o->c.quiet || o->c.json, &t->q, t->source, err);
}

/* 1 if a candidate is quantized with error feedback. */
static int any_feedback(const tune_run *t)
{
    for (size_t c = 0; c < t->ncand; c++)
        if (t->cand[c].d.feedback)
            return 1;
    return 0;
}

/* With feedback candidates: the output errors, on the sequences error
 * feedback calibrates on (so that they are compress's); tp's progress
 * line is prog. */
static stz_status tune_feedback(tune_run *t, const stz_tune_params *tp, cli_progress *prog, stz_err *err)
{
    if (!any_feedback(t))
        return STZ_OK;
    tune_opts *o = &t->o;
    stz_seqs q = {0};
    stz_status st =
        stz_feedback_seqs(t->fwd, feedback_seqs(o), t->model, &cli_stages, o->c.quiet || o->c.json, &q, err);
    if (!st) {
        cli_progress_init(prog, "tune: feedback", o->c.quiet || o->c.json);
        st = stz_tune_feedback(&t->T, t->fwd, q.tok, q.nseq, 0, q.lens, tp, err);
        cli_progress_end(prog);
    }
    stz_seqs_free(&q);
    return st;
}

/* Every candidate measured on every matrix, every matrix's sensitivity
 * probed; then the budget in bytes or KL. */
static stz_status tune_measure(tune_run *t, stz_err *err)
{
    tune_opts *o = &t->o;
    cli_progress prog;
    stz_tune_params tp = {o->c.threads, cli_progress_cb, &prog, t->im, o->gguf, o->no_pad};
    cli_progress_init(&prog, "tune: measure candidates", o->c.quiet || o->c.json);
    stz_status st = stz_tune_measure(&t->T, t->S.m, t->S.n, t->cand, t->ncand, &tp, err);
    cli_progress_end(&prog);
    if (!st)
        st = tune_feedback(t, &tp, &prog, err);
    if (st)
        return st;
    cli_progress_init(&prog, "tune: sensitivity", o->c.quiet || o->c.json);
    st = stz_tune_probe(&t->T, t->fwd, t->q.tok, t->q.nseq, 0, t->q.lens, &tp, err);
    cli_progress_end(&prog);
    if (st)
        return st;
    double model_bytes = (double)cli_path_bytes(t->model, 0);
    if (o->gguf) { /* the header and what export writes besides the tensors tuned */
        uint64_t kept = 0;
        for (size_t i = 0; i < t->T.nt; i++)
            kept += t->T.t[i].bytes[0];
        t->T.extra_bytes = t->gguf_keep > kept ? t->gguf_keep - kept : 0;
        t->T.widen_header = t->gguf_widen;
    } else if (t->sharded) { /* the index and the other files of the directory come along */
        t->T.extra_bytes = (uint64_t)model_bytes;
        for (size_t f = 0; f < t->S.n; f++)
            t->T.extra_bytes -= stz_reader_file_size(stz_qmodel_reader(t->S.m[f]));
    }
    o->value = o->kind == STZ_BUDGET_KL ? o->max_kl
               : o->size                ? o->size
               : o->ratio               ? model_bytes / o->ratio
                                        : o->bpw * (double)t->T.params / 8;
    return STZ_OK;
}

/* No point of the curve meets the budget: the closest one, exit 3. */
static int tune_unmet(const tune_run *t)
{
    const tune_opts *o = &t->o;
    char a[32];
    if (o->c.json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "model", t->model);
        cJSON_AddStringToObject(d, "budget", o->budget_opt);
        cJSON_AddNumberToObject(d, o->kind == STZ_BUDGET_KL ? "max_kl" : "max_bytes", o->value);
        cJSON_AddBoolToObject(d, "met", 0);
        cJSON_AddNumberToObject(d, "closest_bytes", (double)t->sol.pred.bytes);
        cJSON_AddNumberToObject(d, "closest_kl", t->sol.pred.kl);
        cli_print_json(d);
    }
    fprintf(stderr,
            "stz: budget cannot be met: %s with %s asks for %s %.6g; the closest feasible point with "
            "these candidates is %s bytes at predicted KL %.4g. Nothing written.\n",
            t->model, o->budget_opt, o->kind == STZ_BUDGET_KL ? "mean KL <=" : "bytes <=", o->value,
            cli_commas(a, t->sol.pred.bytes), t->sol.pred.kl);
    return 3;
}

static stz_status tune_write_policy(tune_run *t, stz_err *err)
{
    free(t->policy);
    if (!(t->policy = stz_tune_policy(&t->T, t->desc)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the policy");
    return STZ_OK;
}

/* --verify: compress with the policy and run the model; when the budget is
 * missed, solve and verify again with the prediction corrected by what was
 * measured (KL scaled by measured / predicted; bytes: the budget less the
 * last choice's measured - predicted), at most TUNE_CORRECTIONS times. */
#define TUNE_CORRECTIONS 2
static stz_status tune_verify(tune_run *t, stz_err *err)
{
    tune_opts *o = &t->o;
    if (cli_tmp_make(&t->tc, t->out, "tune") || (o->gguf && cli_tmp_make(&t->tcc, t->out, "tune")))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", t->out);
    if (t->sharded) /* a name for the directory */
        unlink(o->gguf ? t->tcc.path : t->tc.path);
    stz_status st = verify(t, t->tc.path, &t->m1, err);
    t->have1 = !st;
    double kl_scale = 1, value = o->value;
    t->first = t->sol.pred;
    for (const measured *m = &t->m1; !st && t->corrections < TUNE_CORRECTIONS && cli_tune_missed(o, m); m = &t->m2) {
        if (o->kind == STZ_BUDGET_KL)
            kl_scale *= t->sol.pred.kl > 0 ? m->fwd.kl_mean / t->sol.pred.kl : 1;
        else
            value = o->value - ((double)m->bytes - (double)t->sol.pred.bytes);
        stz_tune_solution_free(&t->sol);
        if (!(st = stz_tune_solve(&t->T, o->kind, value, kl_scale, &t->sol, err)) && !(st = tune_write_policy(t, err)))
            st = verify(t, t->tc.path, &t->m2, err);
        t->have2 = !st, t->corrections++;
    }
    return st;
}

/* The container (compress --tune) or the policy, and the plot. */
static stz_status tune_write(tune_run *t, const measured *fin, stz_err *err)
{
    tune_opts *o = &t->o;
    stz_status st;
    if (o->compress) {
        /* directories are never replaced */
        if (!(st = stz_output_place(t->tc.path, t->out, o->c.force && (o->gguf || !t->sharded), err)) && o->save_policy)
            st = write_text(o->save_policy, t->policy, o->c.force, err);
    } else {
        st = write_text(t->out, t->policy, o->c.force, err);
    }
    if (!st && o->plot)
        st = cli_tune_write_plot(o->plot, &t->sol, &t->sol.pred, fin, o->gguf ? "GGUF file" : "container", o->c.force,
                                 err);
    return st;
}

/* The report, and warnings about what the verification measured. */
static int tune_report(tune_run *t, const measured *fin)
{
    tune_opts *o = &t->o;
    int rc = cli_tune_report(o, t->model, t->out, &t->T, &t->sol, &t->first, t->have1 ? &t->m1 : NULL,
                             t->have2 ? &t->m2 : NULL, t->corrections, o->value, t->source);
    if (rc != CLI_ERROR && fin && o->kind == STZ_BUDGET_BYTES && !o->c.quiet &&
        kl_far(t->sol.pred.kl, fin->fwd.kl_mean))
        fprintf(stderr,
                "stz: warning: the measured mean KL %.4g is %.1fx the predicted %.4g: at this budget the "
                "tensors' errors do not add up as measured one by one; trust the measured figure\n",
                fin->fwd.kl_mean, fin->fwd.kl_mean / t->sol.pred.kl, t->sol.pred.kl);
    if (rc == CLI_OK && fin && cli_tune_missed(o, fin)) {
        fprintf(stderr,
                "stz: budget missed after %d corrections: measured %s %.6g against %g; the %s is written, "
                "tighten the budget or add candidates\n",
                t->corrections, o->kind == STZ_BUDGET_KL ? "mean KL" : "bytes",
                o->kind == STZ_BUDGET_KL ? fin->fwd.kl_mean : (double)fin->bytes, o->value,
                o->compress ? "container" : "policy");
        rc = 3;
    }
    return rc;
}

static void tune_free(tune_run *t)
{
    if (t->tc.path && t->sharded && !t->o.gguf)
        stz_remove_tree(t->tc.path);
    if (t->tcc.path && t->sharded)
        stz_remove_tree(t->tcc.path);
    cli_tmp_drop(&t->tc);
    cli_tmp_drop(&t->tcc);
    free(t->cfg_json);
    free(t->policy);
    stz_tune_solution_free(&t->sol);
    stz_tune_free(&t->T);
    free(t->cand);
    stz_seqs_free(&t->q);
    stz_fwd_free(t->fwd);
    stz_imatrix_free(t->im);
    stz_model_set_free(&t->S);
    free(t->out);
}

/* Solves the budget; the policy (or container) when it is met. */
static int tune_run_all(tune_run *t, stz_err *err)
{
    tune_opts *o = &t->o;
    if (tune_open(t, err) || tune_measure(t, err) || stz_tune_solve(&t->T, o->kind, o->value, 1, &t->sol, err))
        return cli_fail(err);
    if (!t->sol.met)
        return tune_unmet(t);
    snprintf(t->desc, sizeof t->desc, "stz tune of %.200s for %s %g (candidates %.200s)", t->model, o->budget_opt,
             o->kind == STZ_BUDGET_KL ? o->max_kl
             : o->size                ? o->size
             : o->ratio               ? o->ratio
                                      : o->bpw,
             o->candidates);
    int fb_tokens = feedback_seqs(o) && any_feedback(t);
    if (o->imatrix || fb_tokens) { /* the figures hold with the importance and calibration the candidates had */
        size_t n = strlen(t->desc);
        snprintf(t->desc + n, sizeof t->desc - n, "; quantize with%s%.200s%s%.200s", o->imatrix ? " --imatrix " : "",
                 o->imatrix ? o->imatrix : "", fb_tokens ? " --tokens " : "", fb_tokens ? o->so.path : "");
    }
    if (tune_write_policy(t, err) || (o->verify && tune_verify(t, err)))
        return cli_fail(err);
    const measured *fin = t->have2 ? &t->m2 : t->have1 ? &t->m1 : NULL;
    if (tune_write(t, fin, err))
        return cli_fail(err);
    return tune_report(t, fin);
}

int cmd_tune(int argc, char **argv)
{
    tune_run t = {0};
    int rc = parse(argc, argv, &t.o);
    if (rc >= 0)
        return rc;
    t.model = argv[optind];
    t.out = t.o.c.out ? strdup(t.o.c.out) : t.o.compress ? NULL : cli_model_output_name(t.model, ".tune.json");
    if (!t.out)
        return cli_usage_error("compress", t.o.gguf ? "--tune --gguf needs -o OUT.gguf" : "--tune needs -o OUT.stz");
    stz_err err;
    stz_err_clear(&err);
    rc = tune_run_all(&t, &err);
    tune_free(&t);
    return rc;
}
