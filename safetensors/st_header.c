/* SafeTensors header: parsed with cJSON (allocation failures told apart
 * from syntax errors) and validated whole, every rule of docs/SAFETENSORS.md,
 * before the reader uses any of it. */
#include "st_reader.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JSON_INT 9007199254740992.0 /* 2^53: larger doubles are not exact */

/* cJSON reports a failed allocation as a syntax error; its allocator,
 * wrapped, tells the two apart. */
/* One pass over the header bytes before cJSON sees them: refuses what the
 * reference parser (serde_json) refuses and cJSON accepts, raw control
 * characters inside strings, and "\u0000", which cJSON turns into a NUL that
 * silently cuts a name short; counts the objects ('{' outside strings) so
 * that a header of millions of tiny entries is refused before it is
 * parsed. Returns 0 or the offset + 1 of the offending byte; *what says why. */
static size_t prescan(const uint8_t *s, size_t n, size_t *objects, const char **what)
{
    int in_str = 0;
    *objects = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (!in_str) {
            *objects += c == '{';
            in_str = c == '"';
        } else if (c == '"') {
            in_str = 0;
        } else if (c < 0x20) {
            return *what = "a raw control character inside a string", i + 1;
        } else if (c == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 5 < n && memcmp(s + i + 2, "0000", 4) == 0)
                return *what = "a \\u0000 escape", i + 1;
            i++; /* skip the escaped character */
        }
    }
    return 0;
}

const char *stz_file_kind(const uint8_t *b, size_t n)
{
    size_t i = 0;
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    if (n >= 8 && !memcmp(b, "\x89STZ\r\n\x1a\n", 8))
        return "an stz container, not a SafeTensors file: use 'stz unpack' or 'stz decompress' (inspect, eval and "
               "verify read containers as they are)";
    if (n >= 4 && !memcmp(b, "GGUF", 4))
        return "a GGUF file (llama.cpp), not a SafeTensors file";
    if (n >= 4 && !memcmp(b, "PK\x03\x04", 4))
        return "a zip archive (a PyTorch .pt/.bin checkpoint?), not a SafeTensors file: convert it with the "
               "safetensors package first";
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return "a Python pickle (a PyTorch checkpoint?), not a SafeTensors file: convert it with the safetensors "
               "package first";
    if (n >= 6 && !memcmp(b, "\x93NUMPY", 6))
        return "a NumPy .npy array, not a SafeTensors file";
    if (n >= 9 && b[8] == '{' && stz_le64(b) >= 2 && stz_le64(b) <= STZ_ST_MAX_HEADER)
        return "a SafeTensors file, not an stz container: 'stz pack' or 'stz compress' make one";
    if (i < n && (b[i] == '{' || b[i] == '['))
        return "a JSON text (a policy, config or index?), not a model: SafeTensors files start with an 8-byte length";
    /* text: UTF-8 (a character may be cut at the end) without control characters but white space */
    size_t text = stz_utf8_check(b, n), k = 0;
    while (k < text && (b[k] >= 0x20 || b[k] == '\t' || b[k] == '\n' || b[k] == '\r') && b[k] != 0x7f)
        k++;
    while (k == text && text < n && n - text < 4 && b[text] >= 0x80)
        k = ++text;
    if (n >= 8 && k == n)
        return "a text file (it starts with text, not an 8-byte length), not a model";
    return NULL;
}

stz_status stz_st_not_safetensors(const stz_reader *r, const uint8_t *first, size_t n, stz_status code,
                                  const char *detail, stz_err *err)
{
    const char *kind = stz_file_kind(first, n);
    if (kind)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %s", r->path, kind);
    return stz_err_set(err, code, "%s: %s", r->path, detail);
}

static int json_whole(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= MAX_JSON_INT) || floor(d) != d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

static int cmp_by_name_ctx(const void *a, const void *b, void *ctx)
{
    const stz_tensor *t = (const stz_tensor *)ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int cmp_by_offset(const void *a, const void *b)
{
    const stz_tensor *x = (const stz_tensor *)a, *y = (const stz_tensor *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    /* names sit in one block in header order: pointer order is header order */
    return x->name < y->name ? -1 : x->name > y->name;
}

/* Parses one tensor entry into *t (name already set). */
static stz_status parse_tensor(stz_reader *r, const cJSON *e, stz_tensor *t, uint64_t *dims, stz_err *err)
{
    const char *P = r->path, *N = t->name;
    if (!cJSON_IsObject(e))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': entry is not a JSON object", P, N);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt || !sh || !of)
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': missing field '%s'", P, N,
                           !dt   ? "dtype"
                           : !sh ? "shape"
                                 : "data_offsets");
    if (!cJSON_IsString(dt))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': 'dtype' is not a string", P, N);
    if (stz_dtype_parse(dt->valuestring, &t->dtype) != 0)
        return stz_err_set(err, STZ_E_DTYPE, "%s: tensor '%s': unknown dtype '%.40s'", P, N, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': 'shape' is not an array", P, N);
    int nd = cJSON_GetArraySize(sh);
    if (nd > STZ_ST_MAX_NDIM)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': %d dimensions (at most %d)", P, N, nd, STZ_ST_MAX_NDIM);
    uint64_t numel = 1;
    int overflow = 0, i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        if (!json_whole(d, &dims[i]))
            return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': shape[%d] is not a whole number in [0, 2^53]", P, N,
                               i);
        if (dims[i] && numel > UINT64_MAX / dims[i])
            overflow = 1;
        numel *= dims[i];
    }
    for (i = 0; i < nd; i++)
        if (dims[i] == 0)
            numel = 0, overflow = 0; /* a zero dimension makes the product 0 */
    if (overflow)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': shape product overflows 64 bits", P, N);
    t->ndim = nd;
    t->shape = dims;
    t->numel = numel;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': 'data_offsets' is not an array of 2 numbers", P, N);
    if (!json_whole(of->child, &t->begin) || !json_whole(of->child->next, &t->end))
        return stz_err_set(err, STZ_E_OFFSETS, "%s: tensor '%s': data_offsets are not whole numbers in [0, 2^53]", P,
                           N);
    if (t->end < t->begin)
        return stz_err_set(err, STZ_E_OFFSETS, "%s: tensor '%s': data_offsets end %llu < begin %llu", P, N,
                           (unsigned long long)t->end, (unsigned long long)t->begin);
    uint64_t nbytes;
    stz_err sub;
    if (stz_dtype_nbytes(t->dtype, numel, &nbytes, &sub) != STZ_OK)
        return stz_err_set(err, sub.code, "%s: tensor '%s': %s", P, N, sub.msg);
    if (t->end - t->begin != nbytes)
        return stz_err_set(
            err, STZ_E_OFFSETS, "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s%s needs %llu", P, N,
            (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
            stz_dtype_name(t->dtype), nd ? " of this shape" : " scalar", (unsigned long long)nbytes);
    return STZ_OK;
}

static stz_status parse_metadata(stz_reader *r, const cJSON *m, stz_err *err)
{
    if (cJSON_IsNull(m))
        return STZ_OK;
    if (!cJSON_IsObject(m))
        return stz_err_set(err, STZ_E_METADATA, "%s: __metadata__ is not a JSON object", r->path);
    size_t n = (size_t)cJSON_GetArraySize(m);
    r->meta = calloc(2 * n + 1, sizeof *r->meta);
    if (!r->meta)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for __metadata__", r->path);
    for (const cJSON *e = m->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return stz_err_set(err, STZ_E_METADATA, "%s: __metadata__ key '%s': value is not a string", r->path,
                               e->string);
        for (size_t i = 0; i < r->nmeta; i++)
            if (strcmp(r->meta[2 * i], e->string) == 0)
                return stz_err_set(err, STZ_E_METADATA, "%s: __metadata__ key '%s' appears twice", r->path, e->string);
        char *k = strdup(e->string), *v = strdup(e->valuestring);
        r->meta[2 * r->nmeta] = k;
        r->meta[2 * r->nmeta + 1] = v;
        r->nmeta++;
        if (!k || !v)
            return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for __metadata__", r->path);
    }
    return STZ_OK;
}

/* The header's bytes as a JSON object: strict UTF-8, none of what the
 * reference parser refuses, nothing after it, at most STZ_ST_MAX_TENSORS
 * entries. */
static stz_status parse_json(const stz_reader *r, cJSON **root, stz_err *err)
{
    const char *P = r->path;
    const uint8_t *h = r->header;
    size_t n = (size_t)r->header_len;
    if (n == 0 || h[0] != '{')
        return stz_err_set(err, STZ_E_JSON, "%s: header does not start with '{'", P);
    size_t bad = stz_utf8_check(h, n);
    if (bad != n)
        return stz_err_set(err, STZ_E_JSON, "%s: header is not valid UTF-8 (byte %zu)", P, bad);
    size_t objects;
    const char *what;
    size_t bad_at = prescan(h, n, &objects, &what);
    if (bad_at)
        return stz_err_set(err, STZ_E_JSON, "%s: header contains %s (byte %zu)", P, what, bad_at - 1);
    if (objects > STZ_ST_MAX_TENSORS + 2)
        return stz_err_set(err, STZ_E_FORMAT, "%s: header holds %zu objects; more than %u tensors per file are refused",
                           P, objects, STZ_ST_MAX_TENSORS);
    const char *end = NULL;
    stz_json_begin();
    *root = cJSON_ParseWithLengthOpts((const char *)h, n, &end, 0);
    if (!*root && stz_json_failed())
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory parsing a %zu-byte header", P, n);
    if (!*root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = at && at >= (const char *)h && at <= (const char *)h + n ? (size_t)(at - (const char *)h) : 0;
        return stz_err_set(err, STZ_E_JSON, "%s: header is not valid JSON (near byte %zu)", P, pos);
    }
    for (const char *c = end; c < (const char *)h + n; c++)
        if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r')
            return stz_err_set(err, STZ_E_JSON, "%s: header has data after the JSON object (byte %zu)", P,
                               (size_t)(c - (const char *)h));
    if (!cJSON_IsObject(*root))
        return stz_err_set(err, STZ_E_JSON, "%s: header is not a JSON object", P);
    return STZ_OK;
}

/* The tensors and __metadata__ of root into r, in header order (tensors,
 * dimensions and names in three blocks). */
static stz_status read_entries(stz_reader *r, const cJSON *root, stz_err *err)
{
    const char *P = r->path;
    size_t nt = 0, ndims = 0, name_bytes = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        nt++;
        name_bytes += strlen(e->string) + 1;
        const cJSON *sh = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "shape") : NULL;
        if (cJSON_IsArray(sh)) {
            int k = cJSON_GetArraySize(sh);
            ndims += (size_t)(k > STZ_ST_MAX_NDIM ? 0 : k);
        }
    }
    r->tensors = calloc(nt + 1, sizeof *r->tensors);
    r->by_name = calloc(nt + 1, sizeof *r->by_name);
    r->shapes = calloc(ndims + 1, sizeof *r->shapes);
    r->names = malloc(name_bytes + 1);
    if (!r->tensors || !r->by_name || !r->shapes || !r->names)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu tensors", P, nt);
    int seen_meta = 0;
    size_t ti = 0, di = 0;
    char *np = r->names;
    stz_status st;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta++)
                return stz_err_set(err, STZ_E_METADATA, "%s: __metadata__ appears twice", P);
            if ((st = parse_metadata(r, e, err)) != STZ_OK)
                return st;
            continue;
        }
        stz_tensor *t = &r->tensors[ti];
        size_t len = strlen(e->string) + 1;
        const char *cc = stz_control_char(e->string, len - 1);
        if (cc)
            return stz_err_set(err, STZ_E_FORMAT, "%s: a tensor name holds control character 0x%02x: '%.60s'", P,
                               (unsigned char)*cc, e->string);
        memcpy(np, e->string, len);
        t->name = np;
        np += len;
        if ((st = parse_tensor(r, e, t, r->shapes + di, err)) != STZ_OK)
            return st;
        di += (size_t)t->ndim;
        ti++;
    }
    r->ntensors = nt;
    return STZ_OK;
}

/* Tensors sorted into file order must cover the data section exactly: no
 * gap, no overlap, nothing past the end or left over. */
static stz_status check_offsets(stz_reader *r, stz_err *err)
{
    const char *P = r->path;
    size_t nt = r->ntensors;
    /* the name pointer breaks ties between zero-size tensors */
    qsort(r->tensors, nt, sizeof *r->tensors, cmp_by_offset);
    uint64_t expect = 0;
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = &r->tensors[i];
        if (t->begin != expect)
            return stz_err_set(err, STZ_E_OFFSETS, "%s: tensor '%s': data_offsets begin %llu, expected %llu (%s)", P,
                               t->name, (unsigned long long)t->begin, (unsigned long long)expect,
                               t->begin < expect ? "overlaps the previous tensor" : "gap after the previous tensor");
        expect = t->end;
    }
    if (r->size_from_header) {
        if (expect > UINT64_MAX - 8 - r->header_len)
            return stz_err_set(err, STZ_E_OFFSETS, "%s: tensors need more bytes than a file can hold", P);
        r->file_size = 8 + r->header_len + expect;
    }
    uint64_t data_len = r->file_size - 8 - r->header_len;
    if (expect > data_len)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: tensors need %llu data bytes but the file holds %llu", P,
                           (unsigned long long)expect, (unsigned long long)data_len);
    if (expect < data_len)
        return stz_err_set(err, STZ_E_OFFSETS,
                           "%s: tensors cover %llu data bytes but the file holds %llu (bytes not covered)", P,
                           (unsigned long long)expect, (unsigned long long)data_len);
    return STZ_OK;
}

stz_status stz_st_index_names(stz_reader *r, stz_err *err)
{
    size_t nt = r->ntensors;
    for (size_t i = 0; i < nt; i++)
        r->by_name[i] = i;
    qsort_r(r->by_name, nt, sizeof *r->by_name, cmp_by_name_ctx, r->tensors);
    for (size_t i = 1; i < nt; i++)
        if (strcmp(r->tensors[r->by_name[i]].name, r->tensors[r->by_name[i - 1]].name) == 0)
            return stz_err_set(err, STZ_E_DUPLICATE, "%s: tensor '%s' appears twice in the header", r->path,
                               r->tensors[r->by_name[i]].name);
    return STZ_OK;
}

stz_status stz_st_parse_header(stz_reader *r, stz_err *err)
{
    cJSON *root = NULL;
    stz_status st;
    STZ_TRY(st, parse_json(r, &root, err));
    STZ_TRY(st, read_entries(r, root, err));
    STZ_TRY(st, check_offsets(r, err));
    STZ_TRY(st, stz_st_index_names(r, err));
cleanup:
    cJSON_Delete(root);
    return st;
}
