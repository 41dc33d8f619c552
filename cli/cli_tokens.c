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

/* A sequence option's whole number in [lo, hi] into *v: -1, or the usage
 * error's status. */
static int whole(const char *cmd, const char *opt, double lo, double hi, uint64_t *v)
{
    double d;
    int rc = cli_number(cmd, opt, optarg, lo, hi, &d);
    if (rc == -1 && d != floor(d))
        return cli_usage_error(cmd, "--sequences, --seq-len and --seed take whole numbers");
    if (rc == -1)
        *v = (uint64_t)d;
    return rc;
}

int cli_seq_opt(const char *cmd, int c, stz_seq_spec *o)
{
    uint64_t v = 0;
    int rc;
    switch (c) {
    case CLI_OPT_TOKENS: o->path = optarg; return -1;
    case CLI_OPT_SEED: return whole(cmd, "--seed", 0, 1e15, &o->seed);
    case CLI_OPT_SEQS:
        if ((rc = whole(cmd, "--sequences", 1, 65536, &v)) == -1)
            o->nseq = (size_t)v;
        return rc;
    case CLI_OPT_LEN:
        if ((rc = whole(cmd, "--seq-len", 2, 1 << 20, &v)) == -1)
            o->len = (size_t)v;
        return rc;
    default: return -2;
    }
}

int cli_seq_check(const char *cmd, const stz_seq_spec *o, const stz_seq_spec *d)
{
    if (o->path && (o->nseq != d->nseq || o->len != d->len || o->seed != d->seed))
        return cli_usage_error(cmd, "--tokens gives the sequences: --sequences, --seq-len and --seed do not apply");
    return -1;
}
