/* Token sequences for the forward pass: read from a file, sampled from a
 * model, saved (stz eval --forward, stz tune). */
#include "cli.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
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

void cli_seqs_free(cli_seqs *q)
{
    free(q->tok);
    free(q->lens);
    memset(q, 0, sizeof *q);
}

/* Counts one more sequence of n ids (read into a flat list meanwhile). */
static stz_status seqs_count(cli_seqs *q, size_t n, stz_err *err)
{
    size_t *lens = realloc(q->lens, (q->nseq + 1) * sizeof *lens);
    if (!lens)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the sequences");
    q->lens = lens, lens[q->nseq++] = n;
    q->longest = n > q->longest ? n : q->longest;
    return STZ_OK;
}

static stz_status check_seq(const char *path, size_t where, const char *what, size_t n, stz_err *err)
{
    if (n < 2)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %s %zu: a sequence needs at least 2 tokens, it has %zu", path, what,
                           where, n);
    return STZ_OK;
}

/* A token id of the line form: decimal digits only (no sign, exponent,
 * fraction or hex), below 2^31, then white space or the line's end. *end:
 * where it stops. */
static stz_status id_of(const char *path, size_t line, const char *c, const char **end, int32_t *id, stz_err *err)
{
    uint64_t v = 0;
    const char *d = c;
    for (; *d >= '0' && *d <= '9' && v < ((uint64_t)1 << 31); d++)
        v = v * 10 + (uint64_t)(*d - '0');
    if (d == c || v >= ((uint64_t)1 << 31) || (*d && !isspace((unsigned char)*d))) {
        int w = (int)strcspn(c, " \t\r\n\v\f");
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: line %zu: '%.*s' is not a token id (a decimal whole number below "
                           "2^31)",
                           path, line, w > 20 ? 20 : w, c);
    }
    *end = d, *id = (int32_t)v;
    return STZ_OK;
}

/* The JSON form: an array of arrays of ids, nothing but brackets, commas,
 * digits and white space in it, nothing after it. */
static stz_status parse_json(const char *text, size_t len, const char *path, int32_t *v, cli_seqs *q, stz_err *err)
{
    size_t bad = strspn(text, "[],0123456789 \t\r\n");
    if (bad < len)
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: byte %zu ('%c'): token ids are decimal whole numbers in an array "
                           "of arrays",
                           path, bad, isprint((unsigned char)text[bad]) ? text[bad] : '?');
    const char *rest = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &rest, 0), *s;
    stz_status st = STZ_OK;
    if (!cJSON_IsArray(root) || !rest || rest[strspn(rest, " \t\r\n")])
        st = stz_err_set(err, STZ_E_JSON, "%s: not valid JSON (an array of arrays of token ids)", path);
    size_t i = 0, used = 0;
    cJSON *arr = st ? NULL : root;
    cJSON_ArrayForEach(s, arr)
    {
        size_t n = 0;
        cJSON *t;
        i++;
        if (!cJSON_IsArray(s)) {
            st = stz_err_set(err, STZ_E_FORMAT, "%s: sequence %zu is not an array of token ids", path, i);
            break;
        }
        cJSON_ArrayForEach(t, s) /* whole numbers below 2^31: the characters were checked above */
        {
            if (!cJSON_IsNumber(t) || !(t->valuedouble < 2147483648.0)) {
                st = stz_err_set(err, STZ_E_FORMAT, "%s: sequence %zu: a token id past 2^31 or not a number", path, i);
                break;
            }
            v[used + n++] = (int32_t)t->valuedouble;
        }
        if (st || (st = check_seq(path, i, "sequence", n, err)) || (st = seqs_count(q, n, err)))
            break;
        used += n;
    }
    cJSON_Delete(root);
    return st;
}

/* The line form: one sequence per line, ids apart by white space. */
static stz_status parse_lines(char *text, size_t len, const char *path, int32_t *v, cli_seqs *q, stz_err *err)
{
    stz_status st = STZ_OK;
    size_t line = 0, used = 0;
    for (char *s = text; !st && s < text + len; line++) {
        char *eol = memchr(s, '\n', (size_t)(text + len - s));
        eol = eol ? eol : text + len;
        *eol = 0;
        size_t n = 0;
        for (const char *c = s; !st;) {
            while (isspace((unsigned char)*c))
                c++;
            if (!*c)
                break;
            if (!(st = id_of(path, line + 1, c, &c, &v[used + n], err)))
                n++;
        }
        if (!st && n && !(st = check_seq(path, line + 1, "line", n, err)) && !(st = seqs_count(q, n, err)))
            used += n;
        s = eol + 1;
    }
    return st;
}

stz_status cli_tokens_parse(char *text, size_t len, const char *path, cli_seqs *q, stz_err *err)
{
    memset(q, 0, sizeof *q);
    const char *nul = memchr(text, 0, len);
    if (nul)
        return stz_err_set(err, STZ_E_FORMAT, "%s: byte %zu is a NUL: token ids are text", path, (size_t)(nul - text));
    int32_t *v = malloc((len / 2 + 2) * sizeof *v); /* every id takes 2 characters or more */
    if (!v)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tokens");
    stz_status st = text[strspn(text, " \t\r\n")] == '[' ? parse_json(text, len, path, v, q, err)
                                                         : parse_lines(text, len, path, v, q, err);
    if (!st && !q->nseq)
        st = stz_err_set(err, STZ_E_FORMAT, "%s: no token sequence in it", path);
    if (st) {
        free(v);
        cli_seqs_free(q);
        return st;
    }
    q->tok = v; /* already back to back, no padding: memory follows the file */
    return STZ_OK;
}

/* --tokens: one sequence per line, or a JSON array of arrays. */
static stz_status read_tokens(const char *path, cli_seqs *q, stz_err *err)
{
    char *text;
    size_t len;
    stz_status st = stz_read_text(path, 1u << 30, &text, &len, err);
    if (st)
        return st;
    st = cli_tokens_parse(text, len, path, q, err);
    free(text);
    return st;
}

stz_status cli_seqs_save(const char *path, const cli_seqs *q, int force, stz_err *err)
{
    cli_tmpfile t;
    if (cli_tmp_make(&t, path, "tokens"))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", path);
    FILE *f = fopen(t.path, "w");
    const int32_t *tok = q->tok;
    for (size_t s = 0; f && s < q->nseq; tok += q->lens[s++])
        for (size_t i = 0; i < q->lens[s]; i++)
            fprintf(f, "%d%c", tok[i], i + 1 < q->lens[s] ? ' ' : '\n');
    return cli_tmp_finish(&t, f, path, force, err);
}

stz_status cli_seqs_get(const cli_seq_opts *o, stz_fwd *m, const char *label, int quiet, cli_seqs *q, char *source,
                        stz_err *err)
{
    const stz_fwd_config *c = stz_fwd_cfg(m);
    memset(q, 0, sizeof *q);
    stz_status st;
    if (o->path) {
        if ((st = read_tokens(o->path, q, err)))
            return st;
        const int32_t *tok = q->tok;
        for (size_t s = 0; s < q->nseq; tok += q->lens[s++])
            for (size_t i = 0; i < q->lens[s]; i++)
                if ((uint32_t)tok[i] >= c->vocab)
                    return stz_err_set(err, STZ_E_FORMAT,
                                       "%s: sequence %zu, token %zu: id %d is outside the "
                                       "vocabulary of %s [0, %u)",
                                       o->path, s + 1, i + 1, tok[i], label, c->vocab);
        snprintf(source, 64, "from %.50s", strrchr(o->path, '/') ? strrchr(o->path, '/') + 1 : o->path);
        return STZ_OK;
    }
    size_t dl = (size_t)o->default_len,
           L = o->len                          ? (size_t)o->len
               : c->max_pos && c->max_pos < dl ? c->max_pos
                                               : dl,
           n = (size_t)o->nseq;
    if (L < 2)
        return stz_err_set(err, STZ_E_ARG, "%s: the model takes %u positions, too few to score", label, c->max_pos);
    q->tok = malloc(n * L * sizeof *q->tok), q->lens = malloc(n * sizeof *q->lens), q->nseq = n, q->longest = L;
    if (!q->tok || !q->lens)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tokens");
    for (size_t s = 0; s < n; s++)
        q->lens[s] = L;
    cli_progress prog;
    cli_progress_init(&prog, "sampling", quiet);
    st = stz_fwd_sample(m, n, L, (uint64_t)o->seed, o->temp, o->top_p, q->tok, cli_progress_cb, &prog, err);
    cli_progress_end(&prog);
    snprintf(source, 64, "%zu tokens sampled from the original, seed %.0f", L, o->seed);
    return st;
}
