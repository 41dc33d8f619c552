/* The options that choose token sequences for the forward pass (stz eval
 * --forward, stz imatrix, stz tune), and the sequences they choose. */
#include "cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_number(const char *cmd, const char *opt, const char *arg, double lo, double hi, double *v)
{
    char *end;
    *v = strtod(arg, &end);
    if (*end || !*arg || !(*v >= lo && *v <= hi))
        return cli_usage_error(cmd, "%s takes a number in [%g, %g], not '%s'", opt, lo, hi, arg);
    return -1;
}

int cli_seq_opt(const char *cmd, int c, cli_seq_opts *o)
{
    switch (c) {
    case CLI_OPT_TOKENS: o->path = optarg; return -1;
    case CLI_OPT_SEQS: return cli_number(cmd, "--sequences", optarg, 1, 65536, &o->nseq);
    case CLI_OPT_LEN: return cli_number(cmd, "--seq-len", optarg, 2, 1 << 20, &o->len);
    case CLI_OPT_SEED: return cli_number(cmd, "--seed", optarg, 0, 1e15, &o->seed);
    default: return -2;
    }
}

int cli_seq_check(const char *cmd, const cli_seq_opts *o, const cli_seq_opts *d)
{
    if (o->path && (o->nseq != d->nseq || o->len != d->len || o->seed != d->seed))
        return cli_usage_error(cmd, "--tokens gives the sequences: --sequences, --seq-len and --seed do not apply");
    if (o->nseq != floor(o->nseq) || o->len != floor(o->len) || o->seed != floor(o->seed))
        return cli_usage_error(cmd, "--sequences, --seq-len and --seed take whole numbers");
    return -1;
}

stz_status cli_seqs_get(const cli_seq_opts *o, stz_fwd *m, const char *label, int quiet, stz_seqs *q, char *source,
                        stz_err *err)
{
    const stz_fwd_config *c = stz_fwd_cfg(m);
    memset(q, 0, sizeof *q);
    if (o->path) {
        snprintf(source, 64, "from %.50s", strrchr(o->path, '/') ? strrchr(o->path, '/') + 1 : o->path);
        return stz_seqs_read(o->path, c->vocab, label, q, err);
    }
    size_t dl = (size_t)o->default_len, L = o->len ? (size_t)o->len : c->max_pos && c->max_pos < dl ? c->max_pos : dl;
    if (L < 2)
        return stz_err_set(err, STZ_E_ARG, "%s: the model takes %u positions, too few to score", label, c->max_pos);
    cli_progress prog;
    cli_progress_init(&prog, "sampling", quiet);
    stz_status st =
        stz_seqs_sample(m, (size_t)o->nseq, L, (uint64_t)o->seed, o->temp, o->top_p, cli_progress_cb, &prog, q, err);
    cli_progress_end(&prog);
    snprintf(source, 64, "%zu tokens sampled from the original, seed %.0f", L, o->seed);
    return st;
}
