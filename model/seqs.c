/* Token sequences for the forward pass: a --tokens file parsed (one
 * sequence per line, or a JSON array of arrays), read with its ids checked
 * against a vocabulary, sampled from a model, saved. */
#include "core/stz_core.h"
#include "stz_forward.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void stz_seqs_free(stz_seqs *q)
{
    free(q->tok);
    free(q->lens);
    memset(q, 0, sizeof *q);
}

/* Counts one more sequence of n ids (read into a flat list meanwhile). */
static stz_status seqs_count(stz_seqs *q, size_t n, stz_err *err)
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
static stz_status parse_json(const char *text, size_t len, const char *path, int32_t *v, stz_seqs *q, stz_err *err)
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
static stz_status parse_lines(char *text, size_t len, const char *path, int32_t *v, stz_seqs *q, stz_err *err)
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

stz_status stz_seqs_parse(char *text, size_t len, const char *path, stz_seqs *q, stz_err *err)
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
        stz_seqs_free(q);
        return st;
    }
    q->tok = v; /* already back to back, no padding: memory follows the file */
    return STZ_OK;
}

stz_status stz_seqs_read(const char *path, uint32_t vocab, const char *label, stz_seqs *q, stz_err *err)
{
    char *text;
    size_t len;
    memset(q, 0, sizeof *q);
    stz_status st = stz_read_text(path, 1u << 30, &text, &len, err);
    if (st)
        return st;
    st = stz_seqs_parse(text, len, path, q, err);
    free(text);
    const int32_t *tok = q->tok;
    for (size_t s = 0; !st && vocab && s < q->nseq; tok += q->lens[s++])
        for (size_t i = 0; !st && i < q->lens[s]; i++)
            if ((uint32_t)tok[i] >= vocab)
                st = stz_err_set(err, STZ_E_FORMAT,
                                 "%s: sequence %zu, token %zu: id %d is outside the vocabulary of %s [0, %u)", path,
                                 s + 1, i + 1, tok[i], label, vocab);
    if (st)
        stz_seqs_free(q);
    return st;
}

stz_status stz_seqs_save(const char *path, const stz_seqs *q, int force, stz_err *err)
{
    stz_outfile of;
    stz_status st = stz_outfile_open(&of, path, force, err);
    const int32_t *tok = q->tok;
    char *line = NULL;
    for (size_t s = 0; !st && s < q->nseq; tok += q->lens[s++]) { /* a line a sequence, ids apart by spaces */
        char *g = realloc(line, q->lens[s] * 12 + 1);
        if (!g) {
            st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a line of %zu tokens", path, q->lens[s]);
            break;
        }
        size_t k = 0;
        line = g;
        for (size_t i = 0; i < q->lens[s]; i++)
            k += (size_t)sprintf(line + k, "%d%c", tok[i], i + 1 < q->lens[s] ? ' ' : '\n');
        st = stz_outfile_write(&of, line, k, err);
    }
    free(line);
    if (!st)
        st = stz_outfile_commit(&of, err);
    stz_outfile_abort(&of);
    return st;
}

stz_status stz_seqs_sample(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                           stz_fwd_progress progress, void *user, stz_seqs *q, stz_err *err)
{
    memset(q, 0, sizeof *q);
    q->tok = malloc(nseq * len * sizeof *q->tok), q->lens = malloc(nseq * sizeof *q->lens);
    q->nseq = nseq, q->longest = len;
    if (!q->tok || !q->lens) {
        stz_seqs_free(q);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu sequences of %zu tokens", nseq, len);
    }
    for (size_t s = 0; s < nseq; s++)
        q->lens[s] = len;
    stz_status st = stz_fwd_sample(m, nseq, len, seed, temperature, top_p, q->tok, progress, user, err);
    if (st)
        stz_seqs_free(q);
    return st;
}

size_t stz_seq_spec_len(const stz_seq_spec *s, const stz_fwd *m)
{
    const stz_fwd_config *c = stz_fwd_cfg(m);
    return s->len ? s->len : c->max_pos && c->max_pos < s->default_len ? c->max_pos : s->default_len;
}

stz_status stz_seqs_get(const stz_seq_spec *s, stz_fwd *m, const char *label, stz_fwd_progress progress, void *user,
                        stz_seqs *q, char *source, stz_err *err)
{
    const stz_fwd_config *c = stz_fwd_cfg(m);
    memset(q, 0, sizeof *q);
    if (s->path) {
        const char *base = strrchr(s->path, '/') ? strrchr(s->path, '/') + 1 : s->path;
        snprintf(source, STZ_SEQS_SOURCE_MAX, "from %.50s", base);
        return stz_seqs_read(s->path, c->vocab, label, q, err);
    }
    size_t len = stz_seq_spec_len(s, m);
    if (len < 2)
        return stz_err_set(err, STZ_E_ARG, "%s: the model takes %u positions, too few to score", label, c->max_pos);
    snprintf(source, STZ_SEQS_SOURCE_MAX, "%zu tokens sampled from the original, seed %" PRIu64, len, s->seed);
    return stz_seqs_sample(m, s->nseq, len, s->seed, s->temperature, s->top_p, progress, user, q, err);
}
