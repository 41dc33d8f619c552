/* Policy options shared by plan, quantize and compress: --policy / --int8 /
 * --int4 and command-line overrides (--keep, --set, --method,
 * --block-size, --feedback), which stz_policy_build applies on top of the
 * policy's JSON; `stz policy`. */
#include "cli.h"
#include "stz_policy.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_policy_opt(const char *cmd, int c, cli_policy_opts *po)
{
    const char *given = NULL;
    switch (c) {
    case CLI_OPT_POLICY: given = optarg; break;
    case CLI_OPT_INT8: given = "int8"; break;
    case CLI_OPT_INT4: given = "int4"; break;
    case CLI_OPT_KEEP:
    case CLI_OPT_SET:
        if (po->nover == CLI_MAX_OVERRIDES)
            return cli_usage_error(cmd, "at most %d --keep / --set", CLI_MAX_OVERRIDES);
        po->over[po->nover].keep = c == CLI_OPT_KEEP;
        po->over[po->nover++].text = optarg;
        return -1;
    case CLI_OPT_METHOD: po->method = optarg; return -1;
    case CLI_OPT_IMATRIX: po->imatrix = optarg; return -1;
    case CLI_OPT_FEEDBACK:
    case CLI_OPT_FAST:
        *(c == CLI_OPT_FAST ? &po->fast : &po->feedback) = STZ_POLICY_FEEDBACK_ALL;
        if (po->fast && po->feedback)
            return cli_usage_error(cmd, CLI_FAST_NOT_FEEDBACK);
        return -1;
    case CLI_OPT_CONFIG: po->config = optarg; return -1;
    case CLI_OPT_TOKENS:
    case CLI_OPT_SEQS:
    case CLI_OPT_LEN:
    case CLI_OPT_SEED:
        if (!po->so.default_len) {
            const stz_seq_spec d = STZ_FEEDBACK_SEQS;
            po->so = d;
        }
        return cli_seq_opt(cmd, c, &po->so);
    case CLI_OPT_BLOCK: {
        char *end;
        long v = strtol(optarg, &end, 10);
        if (*end || !*optarg || v < 1 || v > (1 << 20))
            return cli_usage_error(cmd, "--block-size takes 1..1048576, not '%s'", optarg);
        po->block_size = (int)v;
        return -1;
    }
    default: return -2;
    }
    if (po->policy && strcmp(po->policy, given))
        return cli_usage_error(cmd, "give one policy: '%s' and '%s' conflict", po->policy, given);
    po->policy = given;
    return -1;
}

/* The policy the options name, with their rules on top. */
static stz_policy_spec spec_of(const cli_policy_opts *po)
{
    return (stz_policy_spec){.policy = po->policy,
                             .rules = po->over,
                             .nrules = (size_t)po->nover,
                             .method = po->method,
                             .block_size = po->block_size,
                             .feedback = po->feedback};
}

stz_status cli_policy_load(const cli_policy_opts *po, stz_policy **out, stz_err *err)
{
    stz_policy_spec spec = spec_of(po);
    return stz_policy_build(&spec, out, err);
}

/* Edit distance, for suggesting the tensor a misspelt pattern meant. */
static size_t edits(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[256];
    if (lb >= 255)
        return (size_t)-1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0]++;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j], best = prev + (a[i - 1] != b[j - 1]);
            best = row[j] + 1 < best ? row[j] + 1 : best;
            best = row[j - 1] + 1 < best ? row[j - 1] + 1 : best;
            prev = cur, row[j] = best;
        }
    }
    return row[lb];
}

void cli_policy_warn_unused(stz_policy *pol, const stz_reader *names)
{
    for (size_t i = 0; i < stz_policy_rule_count(pol); i++) {
        if (stz_policy_rule_hits(pol, i) || stz_policy_rule_optional(pol, i))
            continue;
        const char *pat = stz_policy_rule_pattern(pol, i), *best = NULL;
        size_t bd = 4, bt = 0; /* a suggestion at most 3 edits away, and its tensor */
        for (size_t t = 0; names && !strpbrk(pat, "*?[") && strncmp(pat, "re:", 3) && t < stz_reader_count(names);
             t++) {
            size_t d = edits(pat, stz_reader_tensor(names, t)->name);
            if (d < bd)
                bd = d, bt = t, best = stz_reader_tensor(names, t)->name;
        }
        int there = best && !bd; /* the tensor is there: an earlier rule or a condition */
        int took = there ? stz_policy_decide(pol, stz_reader_tensor(names, bt)).rule : -1;
        if (took >= 0)
            fprintf(stderr,
                    "stz: warning: rule %zu ('%s') matched no tensor: rule %d ('%s') comes first and takes it\n", i,
                    pat, took, stz_policy_rule_pattern(pol, (size_t)took));
        else if (there)
            fprintf(stderr,
                    "stz: warning: rule %zu ('%s') matched no tensor: its conditions (dtypes, min_ndim, max_ndim) "
                    "leave the tensor out\n",
                    i, pat);
        else if (best)
            fprintf(stderr, "stz: warning: rule %zu ('%s') matched no tensor; did you mean '%s'?\n", i, pat, best);
        else
            fprintf(stderr, "stz: warning: rule %zu ('%s') matched no tensor\n", i, pat);
    }
}

static const char policy_help[] =
    "usage: stz policy list [--json]\n"
    "       stz policy show NAME|FILE [--json]\n\n"
    "Lists the shipped policies, or prints one (or a policy file, checked)\n"
    "as JSON, ready to copy and edit. docs/POLICY.md describes the rules.\n";

int cmd_policy(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))
        return fputs(policy_help, stdout), CLI_OK;
    int json = argc == 3 && !strcmp(argv[2], "--json");
    if ((argc == 2 || json) && !strcmp(argv[1], "list")) { /* --json: [{"name", "description"}] */
        cJSON *arr = json ? cJSON_CreateArray() : NULL;
        for (size_t i = 0; stz_policy_builtin_name(i); i++) {
            const char *name = stz_policy_builtin_name(i);
            cJSON *j = cJSON_Parse(stz_policy_builtin_text(name)), *e = json ? cJSON_CreateObject() : NULL;
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "description");
            const char *desc = cJSON_IsString(d) ? d->valuestring : "";
            if (json) {
                cJSON_AddStringToObject(e, "name", name);
                cJSON_AddStringToObject(e, "description", desc);
                stz_json_put(arr, NULL, e);
            } else {
                printf("%-18s %s\n", name, desc);
            }
            cJSON_Delete(j);
        }
        return json ? cli_print_json(arr) : CLI_OK;
    }
    if (argc == 4 && !strcmp(argv[3], "--json")) /* a policy is JSON already: accepted, as documented */
        argc--;
    else if (argc == 4 && !strcmp(argv[2], "--json"))
        argv[2] = argv[3], argc--;
    if (argc != 3 || strcmp(argv[1], "show"))
        return cli_usage_error("policy", "expected 'list' or 'show NAME'");
    cli_policy_opts po = {.policy = argv[2]};
    stz_policy *pol;
    stz_err err;
    if (cli_policy_load(&po, &pol, &err))
        return cli_fail(&err);
    stz_policy_free(pol);
    const char *text = stz_policy_builtin_text(argv[2]);
    char *owned = NULL;
    struct stat sb;
    if (stat(argv[2], &sb) == 0) {
        if (stz_read_text(argv[2], 64u << 20, &owned, NULL, &err))
            return cli_fail(&err);
        text = owned;
    }
    fputs(text, stdout);
    if (*text && text[strlen(text) - 1] != '\n')
        putchar('\n');
    free(owned);
    return CLI_OK;
}

stz_status cli_policy_for(const cli_policy_opts *po, const char *model, int quiet, stz_policy **pol, stz_err *err)
{
    stz_policy_spec spec = spec_of(po);
    stz_err note;
    stz_status st = stz_policy_for_model(&spec, model, po->config, po->fast, po->so.default_len != 0, pol, &note, err);
    if (!st && note.msg[0] && !quiet)
        fprintf(stderr, "stz: note: quantized by tensor names alone, without calibration: %s\n", note.msg);
    return st;
}

stz_status cli_feedback_open(const cli_policy_opts *po, stz_policy *pol, const char *model, const char *out, int force,
                             int threads, int quiet, stz_feedback **fb, stz_err *err)
{
    *fb = NULL;
    stz_status st = STZ_OK;
    if (stz_policy_feedback(pol) && out && strcmp(out, "-"))
        st = stz_output_check(out, force, err); /* before the long work */
    if (!st)
        st = stz_feedback_calibrate(fb, model, pol, po->so.default_len ? &po->so : NULL, NULL, po->config, threads,
                                    &cli_stages, quiet, err);
    return st;
}
