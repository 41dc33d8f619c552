/* stz tune (and stz compress --tune): choose each tensor's action for a
 * size or quality budget, verify by compressing and running the model,
 * correct once. */
#include "cmd_tune.h"
#include "stz_tune.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The options and exit status tune and gguf share. */
#define COMMON_HELP                                                                                                    \
    "  -T N                threads (default: all cores)\n"                                                             \
    "  -f, --force         replace existing outputs\n"                                                                 \
    "  --json              the report as JSON on standard output\n"                                                    \
    "  -q, --quiet         no progress, no report\n"                                                                   \
    "  -h, --help          this text\n\n"                                                                              \
    "Exit status: 0 ok, 1 error, 2 usage, 3 the budget cannot be met (the\n"

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
    "(stz compress --policy) and prints a report. Models stz eval --forward\n"
    "runs (Llama, Mistral, Qwen2, Qwen3, Phi-3, GPT-Neo, GPT-2, Gemma 2, 3), a file or a\n"
    "directory (sharded or not).\n\n"
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
    "                      (a list naming one: only those, unless --feedback)\n"
    "                      (default keep,8:absmax:32:F16,6:nl:32:U8,5:nl:32:U8,\n"
    "                      4:nl:16:U8,4:nl:32:U8,3:nl:32:U8,2:nl:32:U8)\n"
    "  --fast              no calibration. By default tune calibrates on the\n"
    "                      model's own sampled sequences (--tokens FILE's when\n"
    "                      given): an importance matrix (16 x 128 tokens, unless\n"
    "                      --imatrix) its candidates are quantized and weighed\n"
    "                      with, and every block candidate with error feedback\n"
    "                      (+fb; 16 x 256 tokens), the policy saying \"feedback\":\n"
    "                      true (compress then calibrates again). --fast: neither\n"
    "                      (faster; higher KL at the same size)\n"
    "  --feedback          calibrated (the default; not with --fast)\n"
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
    "                      file (its policy with --save-policy FILE)\n" COMMON_HELP
    "closest feasible point is reported; nothing is written).\n";

static const char gguf_help[] =
    "usage: stz gguf MODEL BUDGET -o OUT.gguf [options]\n\n"
    "The best GGUF file for llama.cpp that stz makes for a budget, in one\n"
    "command: MODEL (a file, a folder holding model.safetensors, or a sharded\n"
    "folder; config.json and tokenizer.json found beside it) calibrated on its\n"
    "own sampled sequences (an importance matrix, and error feedback for every\n"
    "block type), each matrix given the llama.cpp type that gives the lowest KL\n"
    "divergence of the model's outputs for the budget, exported, run against\n"
    "the original and corrected when the budget is missed (stz compress --tune\n"
    "--gguf). Models stz eval --forward runs that llama.cpp runs too (not\n"
    "GPT-Neo).\n\n"
    "BUDGET, one of:\n"
    "  --like TYPE         the size of the file llama.cpp's llama-quantize TYPE\n"
    "                      makes of this model (its own per-tensor rules and\n"
    "                      fallbacks, computed): q4_0, q4_1, q5_0, q5_1, q8_0,\n"
    "                      iq4_nl, iq4_xs, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s,\n"
    "                      q4_k_m, q5_k_s, q5_k_m, q6_k\n"
    "  --bits-per-weight B at most B bits per parameter of tensor data, as\n"
    "                      llama.cpp counts (the file less its header)\n"
    "  --size BYTES        a file of at most BYTES (suffixes K, M, G)\n"
    "  --max-kl K          the smallest file with mean KL at most K nats/token\n\n"
    "  --fast              no calibration: neither the importance matrix nor\n"
    "                      error feedback (faster; higher KL at the same size)\n"
    "  --imatrix FILE      this importance matrix instead of one collected\n"
    "  --tokens FILE       sequences to calibrate and measure on, instead of\n"
    "                      sampled ones (one per line, token ids split by spaces)\n"
    "  --candidates LIST   as stz tune --gguf takes it\n"
    "  --no-pad            the model's own FFN width (no padded blocks)\n"
    "  --tokenizer FILE    the tokenizer (default: tokenizer.json beside MODEL)\n"
    "  --pad-vocab         as stz export --gguf takes it\n"
    "  --name NAME         the GGUF's general.name\n"
    "  --config FILE       the model's config.json\n"
    "  --save-policy FILE  the chosen policy too (stz compress --policy)\n"
    "  --plot FILE.svg     the Pareto curve (size against predicted KL)\n"
    "  -o FILE             the GGUF file\n" COMMON_HELP "smallest file is reported; nothing is written).\n";

static int number(const char *cmd, const char *opt, const char *arg, double lo, double hi, double *v)
{
    size_t n = strlen(arg);
    char c = n > 1 && !strcmp(opt, "--size") ? arg[n - 1] : 0, num[64];
    double mul = c == 'K' || c == 'k' ? 1024.0 : c == 'M' ? 1048576.0 : c == 'G' ? 1073741824.0 : 1;
    if (mul == 1 || n >= sizeof num)
        return cli_number(cmd, opt, arg, lo, hi, v);
    snprintf(num, sizeof num, "%.*s", (int)n - 1, arg); /* the number before the suffix */
    int rc = cli_number(cmd, opt, num, lo / mul, hi / mul, v);
    *v *= mul;
    return rc;
}

/* stz tune's options, or with gguf stz gguf's (a calibrated compress --tune
 * --gguf: --like, --fast, bits per weight over tensor data). */
static int parse(int argc, char **argv, tune_opts *o, int gguf)
{
    const char *cmd = gguf ? "gguf" : !strcmp(argv[0], "compress") ? "compress" : "tune";
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
        O_PADVOCAB,
        O_LIKE,
        O_FAST
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
                                         {"like", required_argument, 0, O_LIKE},
                                         {"fast", no_argument, 0, O_FAST},
                                         CLI_COMMON_LONG,
                                         {0, 0, 0, 0}};
    static const double range[][2] = {{1, 1e18}, {0.01, 1e6}, {0.01, 64}, {0, 1e9}}; /* by goal */
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->p.verify = 1;
    const stz_seq_spec defaults = STZ_TUNE_SEQS;
    o->p.seqs = defaults;
    int c, rc, budgets = 0, fast = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, CLI_COMMON_SHORT, opts, NULL)) != -1) {
        switch (c) {
        case O_SIZE:
        case O_RATIO:
        case O_BPW:
        case O_MAXKL:
            budgets++, o->p.goal = (stz_tune_goal)(c - O_SIZE);
            if (gguf && c == O_RATIO)
                return cli_usage_error(cmd, "--ratio does not apply: give --like, --size or --bits-per-weight");
            if ((rc = number(cmd, stz_tune_goal_option(o->p.goal), optarg, range[c - O_SIZE][0], range[c - O_SIZE][1],
                             &o->p.amount)) >= 0)
                return rc;
            break;
        case O_CAND: o->p.candidates = optarg; break;
        case O_IMATRIX: o->p.imatrix = optarg; break;
        case O_CONFIG: o->p.config = optarg; break;
        case O_PLOT: o->plot = optarg; break;
        case O_NOVERIFY: o->p.verify = 0; break;
        case O_TUNE: o->compress = 1; break;
        case O_SAVEPOL: o->save_policy = optarg; break;
        case O_GGUF: o->p.gguf = 1; break;
        case O_PADVOCAB: o->p.pad_vocab = 1; break;
        case O_TOKENIZER: o->p.tokenizer = optarg; break;
        case O_NAME: o->p.name = optarg; break;
        case O_FEEDBACK: o->p.feedback = 1; break;
        case O_NOPAD: o->p.no_pad = 1; break;
        case O_LIKE: budgets++, o->p.goal = STZ_TUNE_LIKE, o->p.like = optarg; break;
        case O_FAST: fast = 1; break;
        default:
            if (c == '?' && !strcmp(cmd, "compress"))
                return cli_usage_error(cmd,
                                       "'%s' is not an option of --tune, which chooses the policy itself (its "
                                       "options: stz tune --help)",
                                       argv[optind - 1]);
            if ((rc = cli_seq_opt(cmd, c, &o->p.seqs)) != -2) {
                if (rc == -1)
                    break;
                return rc;
            }
            if ((rc = cli_common_opt(cmd, gguf ? gguf_help : tune_help, c, &o->c)) != -2) {
                if (rc == -1)
                    break;
                return rc;
            }
            return cli_bad_option(cmd);
        }
        if (gguf ? c == O_TUNE || c == O_GGUF || c == O_NOVERIFY || c == O_FEEDBACK : c == O_LIKE)
            return cli_usage_error(cmd, "%s does not apply%s", argv[optind - 1],
                                   gguf ? " (stz gguf calibrates, verifies and writes the GGUF)" : ": see stz gguf");
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one MODEL");
    if (budgets != 1)
        return cli_usage_error(cmd, gguf ? "give exactly one budget: --like, --size, --bits-per-weight or --max-kl"
                                         : "give exactly one budget: --size, --ratio, --bits-per-weight or --max-kl");
    if ((rc = cli_seq_check(cmd, &o->p.seqs, &defaults)) >= 0)
        return rc;
    if (fast && o->p.feedback)
        return cli_usage_error(cmd, CLI_FAST_NOT_FEEDBACK);
    /* calibrated unless --fast; a list naming +fb candidates says which take feedback */
    o->p.calibrate = !fast;
    o->p.feedback |= !fast && !(o->p.candidates && strstr(o->p.candidates, "+fb"));
    if (gguf) { /* compress --tune --gguf */
        o->compress = o->p.gguf = 1;
        o->p.goal = o->p.goal == STZ_TUNE_BPW ? STZ_TUNE_DATA_BPW : o->p.goal;
        return o->c.out ? -1 : cli_usage_error(cmd, "give -o OUT.gguf");
    }
    if (o->compress && !o->p.verify)
        return cli_usage_error("compress", "--tune writes the verified container: --no-verify does not apply");
    if (!o->p.gguf && (o->p.tokenizer || o->p.name || o->p.pad_vocab))
        return cli_usage_error("tune", "--tokenizer, --name and --pad-vocab are for --gguf");
    if (!o->p.gguf && (rc = cli_not_gguf(o->compress ? "compress" : "tune", o->c.out,
                                         o->compress ? "an stz container" : "a policy")) >= 0)
        return rc;
    if (!o->compress && o->save_policy)
        return cli_usage_error("tune", "--save-policy is for stz compress --tune (stz tune writes the policy with -o)");
    return -1;
}

/* ---- the command ------------------------------------------------------------------ */

/* A verified KL more than twice or less than half the prediction (above
 * noise: 0.001). */
static int kl_far(double predicted, double got)
{
    return got > 1e-3 && (predicted <= 0 || got > 2 * predicted || got < predicted / 2);
}

/* Why a byte budget cannot be met: the smallest container or file the
 * candidates make, and its fixed parts. */
static void smallest_parts(const tune_opts *o, const stz_tune_result *r)
{
    const stz_tune *T = &r->T;
    uint64_t kept = 0, whole = 0;
    size_t unblocked = 0;
    for (size_t i = 0; i < T->nt; i++) {
        const stz_tune_tensor *t = &T->t[i];
        if (!t->tunable) {
            kept += t->bytes[0];
            continue;
        }
        size_t best = 0;
        for (size_t c = 1; c < T->noffered; c++)
            best = t->bytes[c] < t->bytes[best] ? c : best;
        if (!strcmp(T->cand[best].name, "keep") || !strcmp(T->cand[best].name, "f16"))
            unblocked++, whole += t->bytes[best]; /* no block type takes its rows */
    }
    uint64_t least = r->sol.pred.bytes, matrices = least - T->extra_bytes - kept;
    double data_bpw, file_bpw;
    stz_tune_bpw(T, least, &data_bpw, &file_bpw);
    char a[32], b[32], c[32], d[32];
    fprintf(stderr,
            "stz: the smallest %s these candidates make is %s bytes (%.3f bits per weight over the tensors' data, "
            "%.3f over the file): %s of header%s, %s of tensors kept as they are (norms, vectors), %s of "
            "matrices in their smallest types",
            o->p.gguf ? "GGUF file" : "container", cli_commas(a, least), data_bpw, file_bpw,
            cli_commas(b, T->extra_bytes), o->p.gguf ? " and vocabulary" : "", cli_commas(c, kept),
            cli_commas(d, matrices));
    if (unblocked)
        fprintf(stderr, " (%zu of them, %s bytes, as floats: their rows are whole blocks of no type offered)",
                unblocked, cli_commas(a, whole));
    fprintf(stderr, "\n");
}

/* No point of the curve meets the budget: the closest one, exit 3. */
static int tune_unmet(const tune_opts *o, const char *model, const stz_tune_result *r)
{
    char a[32];
    if (o->c.json)
        cli_print_json_text(stz_tune_report_json(&o->p, model, NULL, o->compress, r));
    fprintf(stderr,
            "stz: budget cannot be met: %s with %s asks for %s %.6g; the closest feasible point with "
            "these candidates is %s bytes at predicted KL %.4g. Nothing written.\n",
            model, stz_tune_goal_option(o->p.goal), r->kind == STZ_BUDGET_KL ? "mean KL <=" : "bytes <=", r->budget,
            cli_commas(a, r->sol.pred.bytes), r->sol.pred.kl);
    if (r->kind == STZ_BUDGET_BYTES)
        smallest_parts(o, r);
    return 3;
}

/* The policy (stz tune) or, beside the container stz_tune_run placed,
 * --save-policy's; and the plot. */
static stz_status tune_write(const tune_opts *o, const char *out, const stz_tune_result *r, stz_err *err)
{
    const char *policy_out = o->compress ? o->save_policy : out;
    stz_status st = policy_out ? stz_tune_write_policy(policy_out, r, o->c.force, err) : STZ_OK;
    if (!st && o->plot)
        st = stz_tune_write_plot(o->plot, r, o->p.gguf, o->c.force, err);
    return st;
}

/* The report, and warnings about what the verification measured. */
static int tune_report(const tune_opts *o, const char *model, const char *out, const stz_tune_result *r,
                       const stz_tune_check *fin)
{
    int rc = cli_tune_report(o, model, out, r);
    if (rc != CLI_ERROR && fin && r->kind == STZ_BUDGET_BYTES && !o->c.quiet &&
        kl_far(r->sol.pred.kl, fin->fwd.kl_mean))
        fprintf(stderr,
                "stz: warning: the measured mean KL %.4g is %.1fx the predicted %.4g: at this budget the "
                "tensors' errors do not add up as measured one by one; trust the measured figure\n",
                fin->fwd.kl_mean, fin->fwd.kl_mean / r->sol.pred.kl, r->sol.pred.kl);
    if (rc == CLI_OK && fin && stz_tune_missed(r, fin)) {
        fprintf(stderr,
                "stz: budget missed after %d corrections: measured %s %.6g against %g; the %s is written, "
                "tighten the budget or add candidates\n",
                r->checks - 1, r->kind == STZ_BUDGET_KL ? "mean KL" : "bytes",
                r->kind == STZ_BUDGET_KL ? fin->fwd.kl_mean : (double)fin->bytes, r->budget,
                o->compress ? "container" : "policy");
        rc = 3;
    }
    return rc;
}

/* The outputs checked (the policy's or container's, then --save-policy's
 * or --plot's), the tune run, its files written and reported. */
static int tune_main(tune_opts *o, const char *model, const char *out)
{
    const char *outs[3] = {out, o->compress ? o->save_policy : o->plot, o->compress ? o->plot : NULL};
    stz_tune_result r;
    stz_err err;
    stz_err_clear(&err);
    memset(&r, 0, sizeof r);
    stz_status st = STZ_OK;
    for (int k = 0; !st && k < 3; k++)
        if (outs[k])
            st = stz_output_check(outs[k], o->c.force, &err);
    if (!st && !o->compress)
        st = stz_refuse_input_as_output(model, out, &err);
    if (!st) {
        o->p.out = o->compress ? out : NULL, o->p.scratch = out;
        o->p.write_flags = o->c.force ? STZ_WRITE_FORCE : 0;
        st = stz_tune_run(&o->p, model, &r, &err);
    }
    const stz_tune_check *fin = r.checks ? &r.check[r.checks - 1] : NULL;
    int rc = st                             ? cli_fail(&err)
             : !r.sol.met                   ? tune_unmet(o, model, &r)
             : tune_write(o, out, &r, &err) ? cli_fail(&err)
                                            : tune_report(o, model, out, &r, fin);
    stz_tune_result_free(&r);
    return rc;
}

static int tune_command(int argc, char **argv, int gguf)
{
    tune_opts o;
    int rc = parse(argc, argv, &o, gguf);
    if (rc >= 0)
        return rc;
    const char *model = argv[optind];
    char *out = o.c.out ? strdup(o.c.out) : o.compress ? NULL : cli_model_output_name(model, ".tune.json");
    if (!out)
        return cli_usage_error("compress", o.p.gguf ? "--tune --gguf needs -o OUT.gguf" : "--tune needs -o OUT.stz");
    o.p.threads = o.c.threads ? o.c.threads : cli_ncores();
    o.p.quiet = o.c.quiet || o.c.json;
    o.p.progress = &cli_stages, o.p.ranks = cli_ranks();
    rc = tune_main(&o, model, out);
    free(out);
    return rc;
}

int cmd_tune(int argc, char **argv) { return tune_command(argc, argv, 0); }
int cmd_gguf(int argc, char **argv) { return tune_command(argc, argv, 1); }
