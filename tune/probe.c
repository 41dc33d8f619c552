/* stz tune: measure candidates, probe sensitivity (the budget is solved in
 * solve.c), write the policy (see stz_tune.h). */
#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_safetensors.h"
#include "stz_imatrix.h"
#include "stz_tune.h"
#include "gguf/gguf_format.h"
#include "quant/quant_tensor.h"
#include "quant/ggml_types.h"
#include "model/roles.h"
#include "tune_internal.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char default_candidates[] =
    "keep,8:absmax:32:F16,6:nl:32:U8,5:nl:32:U8,4:nl:16:U8,4:nl:32:U8,3:nl:32:U8,2:nl:32:U8";
static const char trellis_candidates[] =
    "4:trellis:64:U8,3:trellis:128:U8,3:trellis:64:U8,2:trellis:128:U8,2:trellis:64:U8";
static char gguf_candidates[1024];
static pthread_once_t gguf_once = PTHREAD_ONCE_INIT;

/* "keep", then the types rows offer to tune, in the order of their rank. */
static void list_gguf(void)
{
    size_t at = (size_t)snprintf(gguf_candidates, sizeof gguf_candidates, "keep");
    for (int rank = 1; rank < STZ_GGML_TYPE_LIMIT; rank++)
        for (int ty = 0; ty < STZ_GGML_TYPE_LIMIT && at < sizeof gguf_candidates; ty++) {
            const stz_ggml_traits *t = stz_ggml_traits_of(ty);
            if (t && t->tune == rank)
                at += (size_t)snprintf(gguf_candidates + at, sizeof gguf_candidates - at, ",%s", t->name);
        }
}

/* The lists a candidate list may name. */
static const struct {
    const char *name, *list;
} sets[] = {{"default", default_candidates}, {"gguf", gguf_candidates}, {"trellis", trellis_candidates}};

const char *stz_tune_candidate_set(const char *name)
{
    pthread_once(&gguf_once, list_gguf);
    for (size_t k = 0; name && k < sizeof sets / sizeof *sets; k++)
        if (!strcmp(name, sets[k].name))
            return sets[k].list;
    return NULL;
}

/* list with every set's name replaced by its candidates (malloc'd; NULL:
 * out of memory). */
static char *expand_sets(const char *list)
{
    pthread_once(&gguf_once, list_gguf);
    size_t most = 0, entries = 1, ns = sizeof sets / sizeof *sets;
    for (size_t k = 0; k < ns; k++)
        most = strlen(sets[k].list) > most ? strlen(sets[k].list) : most;
    for (const char *p = list; *p; p++)
        entries += *p == ',';
    char *out = malloc(strlen(list) + entries * most + 1), *o = out;
    for (const char *p = list; out && *p;) {
        size_t len = strcspn(p, ","), k = 0, skip = strspn(p, " ");
        while (k < ns && (len - skip != strlen(sets[k].name) || strncmp(p + skip, sets[k].name, len - skip)))
            k++;
        const char *put = k < ns ? sets[k].list : p;
        size_t n = k < ns ? strlen(put) : len;
        memcpy(o, put, n), o += n;
        p += len;
        if (*p == ',')
            *o++ = *p++;
    }
    if (out)
        *o = 0;
    return out;
}

/* ---- candidates ------------------------------------------------------------- */

/* STZ_E_ARG when candidate k's name is one of those before it. */
static stz_status refuse_twice(const stz_tune_cand *c, size_t k, const char *why, stz_err *err)
{
    for (size_t j = 0; j < k; j++)
        if (!strcmp(c[j].name, c[k].name))
            return stz_err_set(err, STZ_E_ARG, "candidate '%s' is listed twice%s", c[k].name, why);
    return STZ_OK;
}

stz_status stz_tune_cands_feedback(stz_tune_cand *c, size_t n, stz_err *err)
{
    stz_status st = STZ_OK;
    for (size_t k = 0; !st && k < n; k++) {
        stz_tune_cand_feedback(&c[k]);
        st = refuse_twice(c, k, " (with --feedback, NAME is NAME+fb)", err);
    }
    return st;
}

static stz_status parse_one(const char *s, stz_tune_cand *c, stz_err *err);

static stz_action action_of_bits(int bits)
{
    switch (bits) {
    case 2: return STZ_ACTION_INT2;
    case 3: return STZ_ACTION_INT3;
    case 4: return STZ_ACTION_INT4;
    case 5: return STZ_ACTION_INT5;
    case 6: return STZ_ACTION_INT6;
    case 8: return STZ_ACTION_INT8;
    default: return STZ_ACTION_COUNT;
    }
}

/* A candidate NAME+fb: NAME's block quantization with error feedback. */
static stz_status parse_fed(const char *s, stz_tune_cand *c, stz_err *err)
{
    char plain[32];
    size_t n = strlen(s) - 3;
    snprintf(plain, sizeof plain, "%.*s", (int)(n < sizeof plain ? n : sizeof plain - 1), s);
    stz_status st = parse_one(plain, c, err);
    if (!st && !stz_tune_cand_feedback(c))
        st = stz_err_set(err, STZ_E_ARG, "candidate '%s': error feedback (+fb) is for block quantizations, not '%s'", s,
                         plain);
    return st;
}

int stz_tune_cand_feedback(stz_tune_cand *c)
{
    if (!stz_action_is_block(c->d.action, c->d.ggml_type))
        return 0;
    if (!c->d.feedback)
        strcat(c->name, "+fb"); /* names are at most 28 characters before */
    c->d.feedback = 1;
    return 1;
}

static stz_status parse_one(const char *s, stz_tune_cand *c, stz_err *err)
{
    memset(c, 0, sizeof *c);
    if (strlen(s) > 3 && !strcmp(s + strlen(s) - 3, "+fb"))
        return parse_fed(s, c, err);
    c->d.rule = -1, c->d.scale_dtype = STZ_DTYPE_F16;
    if (!strcmp(s, "keep")) {
        c->d.action = STZ_ACTION_KEEP;
        snprintf(c->name, sizeof c->name, "keep");
        return STZ_OK;
    }
    stz_action a;
    int type;
    if (!stz_action_parse(s, &a, &type) && a == STZ_ACTION_GGML) { /* a llama.cpp type: its own blocks */
        c->d.action = a, c->d.ggml_type = type;
        snprintf(c->name, sizeof c->name, "%s", stz_ggml_type_name(type));
        return STZ_OK;
    }
    int bits, used = 0;
    unsigned block, rank;
    char how[16] = "";
    if (sscanf(s, "svd:%u%n", &rank, &used) == 1 && (!s[used] || sscanf(s + used, ":%15s", how) == 1)) {
        if (!rank || (*how && strcmp(how, "randomized")))
            return stz_err_set(err, STZ_E_ARG, "candidate '%s': expected svd:RANK or svd:RANK:randomized", s);
        c->d.action = STZ_ACTION_SVD, c->d.svd_rank = rank, c->d.fallback = STZ_ACTION_KEEP;
        c->d.svd_randomized = *how != 0, c->d.svd_power_iters = 1, c->d.svd_oversample = 10;
        snprintf(c->name, sizeof c->name, "svd:%u%s", rank, *how ? ":randomized" : "");
        return STZ_OK;
    }
    char method[16], scales[8];
    if (sscanf(s, "%d:%15[^:]:%u:%7s%n", &bits, method, &block, scales, &used) != 4 || s[used])
        return stz_err_set(
            err, STZ_E_ARG,
            "candidate '%s': expected keep, BITS:METHOD:BLOCK:SCALES (e.g. 4:nl:32:U8), "
            "svd:RANK, a llama.cpp type (q4_k, iq4_nl, f16, ...) or a list's name (default, gguf, trellis)",
            s);
    if ((c->d.action = action_of_bits(bits)) == STZ_ACTION_COUNT)
        return stz_err_set(err, STZ_E_ARG, "candidate '%s': bits must be 2, 3, 4, 5, 6 or 8", s);
    int m = 0;
    while (m < STZ_QMETHOD_COUNT && strcmp(method, stz_qmethod_name((stz_qmethod)m)))
        m++;
    if (m == STZ_QMETHOD_COUNT)
        return stz_err_set(err, STZ_E_ARG,
                           "candidate '%s': method must be absmax, mse, full, asym, nl, nl-fit or trellis", s);
    if (!block || block > 65536)
        return stz_err_set(err, STZ_E_ARG, "candidate '%s': block size must be 1..65536", s);
    if (!strcasecmp(scales, "F16") || !strcasecmp(scales, "F32") || !strcasecmp(scales, "U8"))
        c->d.scale_dtype = toupper((unsigned char)scales[0]) == 'U' ? STZ_DTYPE_U8
                           : scales[1] == '1'                       ? STZ_DTYPE_F16
                                                                    : STZ_DTYPE_F32;
    else
        return stz_err_set(err, STZ_E_ARG, "candidate '%s': scales must be F16, F32 or U8", s);
    if (m == STZ_QMETHOD_ASYM && c->d.scale_dtype == STZ_DTYPE_U8)
        return stz_err_set(err, STZ_E_ARG, "candidate '%s': asym takes F16 or F32 scales, not U8", s);
    c->d.method = (stz_qmethod)m, c->d.block_size = block;
    snprintf(c->name, sizeof c->name, "%d:%s:%u:%s", bits, method, block, stz_dtype_name(c->d.scale_dtype));
    return STZ_OK;
}

stz_status stz_tune_parse_candidates(const char *list, stz_tune_cand **out, size_t *n, stz_err *err)
{
    *out = NULL, *n = 0;
    char *copy = expand_sets(list), *save = NULL;
    stz_tune_cand *c =
        copy ? calloc(strlen(copy) / 2 + 2, sizeof *c) : NULL; /* every entry takes 2 characters or more */
    stz_status st = copy && c ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the candidate list");
    size_t k = 0;
    for (char *tok = st ? NULL : strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if ((st = parse_one(tok, &c[k], err)) || (st = refuse_twice(c, k, "", err)))
            break;
        k++;
    }
    if (!st && !k)
        st = stz_err_set(err, STZ_E_ARG, "no candidate in '%s'", list);
    free(copy);
    if (st) {
        free(c);
        return st;
    }
    *out = c, *n = k;
    return STZ_OK;
}

/* ---- measuring ------------------------------------------------------------------ */

typedef struct {
    stz_tune *T;
    stz_tune_tensor *t;
    const float *x;
    const float *w; /* the columns' importance, or NULL */
    uint64_t rows, cols;
    uint64_t keep_bytes;
    uint64_t *raw; /* per candidate: stored bytes before the lossless stage */
} measure_job;

static stz_status measure_work(void *ctx, int tid, size_t c, stz_err *err)
{
    (void)tid;
    measure_job *j = ctx;
    stz_tune *T = j->T;
    stz_tune_tensor *t = j->t;
    const stz_decision *d = &T->cand[c].d;
    if (d->action == STZ_ACTION_KEEP) {
        t->bytes[c] = j->keep_bytes, t->err2[c] = 0, j->raw[c] = t->params * (stz_dtype_bits(t->dtype) / 8);
        return STZ_OK;
    }
    int type = stz_decision_ggml_type(d);
    if (type >= 0 && j->cols % stz_ggml_block(type) &&
        !(t->ffn == STZ_TUNE_FFN_DOWN && stz_ggml_block(type) == STZ_GGML_QK)) { /* GGUF cannot hold it so */
        t->bytes[c] = UINT64_MAX, t->err2[c] = INFINITY;
        return STZ_OK;
    }
    stz_qmem q;
    stz_err sub;
    uint64_t small = j->rows < j->cols ? j->rows : j->cols;
    if (d->action == STZ_ACTION_SVD && (d->svd_rank >= small || stz_svd_bytes(j->rows, j->cols, d->svd_rank) >=
                                                                    t->params * (stz_dtype_bits(t->dtype) / 8))) {
        t->bytes[c] = UINT64_MAX, t->err2[c] = INFINITY; /* no smaller than the tensor: stz quantize would keep it */
        return STZ_OK;
    }
    stz_status st = stz_quantize_tensor(d, j->x, j->w, j->rows, j->cols, &q, &sub);
    if (st == STZ_E_NUMERIC) { /* scales beyond F16: not a choice for this tensor */
        t->bytes[c] = UINT64_MAX, t->err2[c] = INFINITY;
        return STZ_OK;
    }
    if (st)
        return stz_err_set(err, st, "tensor '%s', candidate %s: %s", t->name, T->cand[c].name, sub.msg);
    t->err2[c] = q.err2;
    st = stz_tune_cand_bytes(T, t, c, &q, &j->raw[c], err);
    t->fmt[c] = q.fmt;
    stz_qmem_free(&q);
    return st;
}

stz_status stz_tune_cand_bytes(const stz_tune *T, stz_tune_tensor *t, size_t c, const stz_qmem *q, uint64_t *raw,
                               stz_err *err)
{
    stz_status st = STZ_OK;
    t->bytes[c] = 0, *raw = 0;
    for (int k = 0; !st && k < STZ_PART_COUNT; k++) {
        uint64_t b = 0;
        stz_pack_hint h = {0, 0, 0}; /* the values: llama.cpp's blocks, or stz's codes in rows */
        if (k == STZ_PART_VALUES && q->fmt.ggml)
            h.block_type = q->fmt.ggml->type;
        else if (k == STZ_PART_VALUES && !q->rank && t->rows && q->len[k] / t->rows <= UINT32_MAX)
            h.code_bits = (unsigned)q->fmt.bits, h.row_bytes = (uint32_t)(q->len[k] / t->rows);
        if (q->part[k] && !T->gguf &&
            !(st = stz_pack_tensor_bytes(&T->pack, q->dtype[k], &h, q->part[k], q->len[k], &b, err)))
            t->bytes[c] += b;
        *raw += q->part[k] ? q->len[k] : 0;
    }
    if (T->gguf) /* the blocks, as the GGUF file holds them */
        t->bytes[c] = gguf_padded(*raw);
    return st;
}

/* Its part in a widened FFN (stz_tune_tensor.ffn), or 0. */
static int ffn_part(const stz_qtensor *q)
{
    unsigned layer;
    int r = stz_role_find(q->name, STZ_NAMES_LLAMA2C, NULL, &layer);
    r = r >= 0 ? r : stz_role_find(q->name, STZ_NAMES_HF, NULL, &layer);
    if (q->ndim != 2)
        return 0;
    return r == STZ_ROLE_DOWN && q->cols % STZ_GGML_QK ? STZ_TUNE_FFN_DOWN
           : r == STZ_ROLE_GATE || r == STZ_ROLE_UP    ? STZ_TUNE_FFN_IN
                                                       : 0;
}

/* Why a tensor takes no candidate, or NULL. */
static const char *untunable(const stz_qtensor *q)
{
    if (q->ndim < 2)
        return "fewer than 2 dimensions";
    if (q->dtype != STZ_DTYPE_BF16 && q->dtype != STZ_DTYPE_F16 && q->dtype != STZ_DTYPE_F32)
        return "not BF16, F16 or F32";
    if (!q->numel)
        return "empty";
    return NULL;
}

/* The candidates, and the probe's (the shipped int4 format) appended, not
 * offered, when it is not one of them. */
static stz_status set_candidates(stz_tune *T, const stz_tune_cand *cand, size_t ncand, stz_err *err)
{
    stz_tune_cand probe;
    stz_status st = parse_one(STZ_TUNE_PROBE, &probe, err);
    if (st)
        return st;
    if (!(T->cand = malloc((ncand + 1) * sizeof *T->cand)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the candidates");
    memcpy(T->cand, cand, ncand * sizeof *cand);
    T->ncand = T->noffered = ncand, T->probe = ncand;
    for (size_t c = 0; c < ncand; c++)
        if (!strcmp(cand[c].name, probe.name))
            T->probe = c;
    if (T->probe == ncand)
        T->cand[T->ncand++] = probe;
    return STZ_OK;
}

/* Each file's metadata kept (as JSON text) for the policy's verification
 * files. */
static stz_status keep_metadata(stz_tune *T, stz_qmodel *const *files, size_t nfiles, stz_err *err)
{
    for (size_t f = 0; f < nfiles; f++, T->nfiles++) {
        const stz_reader *r = stz_qmodel_reader(files[f]);
        cJSON *meta = cJSON_CreateObject();
        for (size_t i = 0; i < stz_reader_meta_count(r); i++)
            if (strcmp(stz_reader_meta_key(r, i), "format"))
                cJSON_AddStringToObject(meta, stz_reader_meta_key(r, i), stz_reader_meta_value(r, i));
        T->meta[f] = cJSON_PrintUnformatted(meta);
        cJSON_Delete(meta);
        if (!T->meta[f])
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for a file's metadata");
    }
    return STZ_OK;
}

/* The bytes tensor q (rt in r) takes kept as it is: in the container (its
 * stored bytes read and run through the chunk coder), or in the GGUF file
 * as export writes it (a matrix in its F16, BF16 or F32, the rest F32). */
static stz_status kept_bytes(const stz_tune *T, const stz_reader *r, const stz_tensor *rt, const stz_qtensor *q,
                             uint64_t *out, stz_err *err)
{
    if (T->gguf) {
        int half = q->ndim >= 2 && (q->dtype == STZ_DTYPE_F16 || q->dtype == STZ_DTYPE_BF16);
        *out = gguf_padded(q->numel * (half ? 2 : 4));
        return STZ_OK;
    }
    uint64_t size = rt->end - rt->begin;
    uint8_t *bytes = malloc(size + 1);
    if (!bytes)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for tensor '%s'", q->name);
    stz_status st = stz_reader_read(r, rt, 0, bytes, size, err);
    if (!st)
        st = stz_pack_tensor_bytes(&T->pack, q->dtype, NULL, bytes, size, out, err);
    free(bytes);
    return st;
}

/* Tensor i of file f: its bytes kept as it is, and every candidate's bytes
 * and error on p->threads threads (raw: a scratch of one count per
 * candidate). */
static stz_status measure_tensor(stz_tune *T, stz_qmodel *m, size_t f, size_t i, const stz_tune_params *p,
                                 uint64_t *raw, stz_err *err)
{
    const stz_reader *r = stz_qmodel_reader(m);
    const stz_qtensor *q = stz_qmodel_tensor(m, i);
    const stz_tensor *rt = stz_reader_tensor(r, (size_t)stz_reader_find(r, q->name));
    stz_tune_tensor *t = &T->t[T->nt++];
    t->dtype = q->dtype, t->params = q->numel, t->rows = q->rows, t->file = f, t->why = untunable(q);
    t->ffn = p->no_pad ? 0 : ffn_part(q);
    char gname[160];
    int left_out = p->gguf && !stz_role_gguf_name(q->name, gname, sizeof gname); /* a vision tower's, say */
    T->params += left_out ? 0 : q->numel;
    float *x = NULL;
    t->name = strdup(q->name);
    t->bytes = calloc(T->ncand, sizeof *t->bytes), t->err2 = calloc(T->ncand, sizeof *t->err2);
    t->fmt = calloc(T->ncand, sizeof *t->fmt);
    if (!t->name || !t->bytes || !t->err2 || !t->fmt)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for tensor '%s'", q->name);
    measure_job j = {T, t, NULL, NULL, q->rows, q->cols, 0, raw};
    stz_status st = p->imatrix && q->ndim >= 2 ? stz_imatrix_find(p->imatrix, q->name, q->cols, &j.w, err) : STZ_OK;
    if (!st)
        st = kept_bytes(T, r, rt, q, &j.keep_bytes, err);
    t->bytes[0] = left_out ? 0 : j.keep_bytes;
    if (left_out)
        t->why = "not in the GGUF file (export writes the language model's tensors)";
    if (!st && !t->why && !(x = malloc(q->numel * sizeof *x)))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for tensor '%s' as F32", q->name);
    if (!st && x && !(st = stz_qmodel_read_rows(m, i, 0, (size_t)q->rows, x, err))) {
        for (uint64_t e = 0; e < q->numel && !t->why; e++)
            t->why = isfinite(x[e]) ? NULL : "holds NaN or Inf";
        for (uint64_t e = 0; e < q->numel; e++)
            t->norm2 += (double)x[e] * x[e];
    }
    if (!st && !t->why) {
        j.x = x;
        stz_ordered pl = {.n = T->ncand, .threads = p->threads < 1 ? 1 : p->threads, .ctx = &j, .work = measure_work};
        st = stz_ordered_run(&pl, err);
        for (size_t c = 0; c < T->noffered && !t->tunable; c++)
            t->tunable = t->bytes[c] != UINT64_MAX;
        if (!t->tunable)
            t->bytes[0] = j.keep_bytes, t->why = "no candidate applies";
    }
    free(x);
    return st;
}

stz_status stz_tune_gguf_cands(const stz_tune_cand *cand, size_t ncand, stz_err *err)
{
    for (size_t c = 0; c < ncand; c++)
        if (cand[c].d.action != STZ_ACTION_KEEP && stz_decision_ggml_type(&cand[c].d) < 0)
            return stz_err_set(err, STZ_E_ARG,
                               "candidate '%s' is not a type GGUF holds: with --gguf the candidates "
                               "are keep and llama.cpp's types (%s)",
                               cand[c].name, stz_tune_candidate_set("gguf") + 5);
    return STZ_OK;
}

stz_status stz_tune_measure(stz_tune *T, stz_qmodel *const *files, size_t nfiles, const stz_tune_cand *cand,
                            size_t ncand, const stz_tune_params *p, stz_err *err)
{
    memset(T, 0, sizeof *T);
    T->pack = (stz_pack_params)STZ_PACK_PARAMS_DEFAULT;
    T->gguf = p->gguf;
    stz_status st = p->gguf ? stz_tune_gguf_cands(cand, ncand, err) : STZ_OK;
    if (!st)
        st = set_candidates(T, cand, ncand, err);
    if (st)
        return st;
    size_t nt = 0;
    uint64_t total = 0, done = 0;
    for (size_t f = 0; f < nfiles; f++) {
        nt += stz_qmodel_count(files[f]);
        for (size_t i = 0; i < stz_qmodel_count(files[f]); i++) {
            const stz_qtensor *q = stz_qmodel_tensor(files[f], i);
            if (q->bits || q->rank)
                return stz_err_set(err, STZ_E_UNSUPPORTED,
                                   "%s: tensor '%s' is already quantized by stz; tune the "
                                   "original model",
                                   stz_reader_path(stz_qmodel_reader(files[f])), q->name);
            total += q->stored_bytes;
        }
    }
    if (!(T->meta = calloc(nfiles + 1, sizeof *T->meta)) || !(T->t = calloc(nt + 1, sizeof *T->t)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensors' figures");
    if ((st = keep_metadata(T, files, nfiles, err)))
        return st;
    uint64_t *raw = malloc(T->ncand * sizeof *raw);
    st = raw ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the candidates' bytes");
    for (size_t f = 0; !st && f < nfiles; f++)
        for (size_t i = 0; !st && i < stz_qmodel_count(files[f]); i++) {
            st = measure_tensor(T, files[f], f, i, p, raw, err);
            done += stz_qmodel_tensor(files[f], i)->stored_bytes;
            if (!st && p->progress && p->progress(p->progress_user, done, total))
                st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        }
    free(raw);
    return st;
}

/* ---- sensitivity ----------------------------------------------------------------- */

stz_tune_tensor *stz_tune_find(const stz_tune *T, const char *name)
{
    for (size_t i = 0; i < T->nt; i++)
        if (!strcmp(T->t[i].name, name))
            return &T->t[i];
    return NULL;
}

static int probe_select(void *user, const char *name)
{
    const stz_tune *T = user;
    const stz_tune_tensor *t = stz_tune_find(T, name);
    return t && t->tunable && t->err2[T->probe] > 0 && isfinite(t->err2[T->probe]);
}

/* A trellis's n rows become their quantized and dequantized selves, as a
 * matrix of their own (its segments from the first of them; too few rows
 * for one: rounded by nl of the width instead); -1: out of memory. */
static int perturb_trellis(const stz_qformat *f, float *rows, size_t n, size_t cols)
{
    stz_decision d = {.action = action_of_bits(f->bits),
                      .block_size = f->block,
                      .scale_dtype = f->scale_dtype,
                      .method = stz_trellis_fits(f->bits, n) ? STZ_QMETHOD_TRELLIS : STZ_QMETHOD_NL};
    stz_qmem q;
    stz_err ignored;
    stz_status st = stz_quantize_tensor_y(&d, rows, f->weights, n, cols, &q, rows, &ignored);
    stz_qmem_free(&q);
    return st == STZ_E_NOMEM ? -1 : 0;
}

/* Each of n rows becomes its quantized and dequantized self in format f
 * (stz's or a llama.cpp type's); -1: out of memory. */
static int perturb_rows(const stz_qformat *f, float *rows, size_t n, size_t cols)
{
    if (f->method == STZ_QMETHOD_TRELLIS)
        return perturb_trellis(f, rows, n, cols);
    size_t nb = stz_q_blocks(cols, f->block);
    uint8_t *q = malloc((f->ggml ? stz_ggml_row_bytes(f->ggml->type, cols) : stz_qf_row_bytes(f->bits, cols)) + 8);
    float *s = malloc(2 * nb * sizeof *s);
    for (size_t r = 0; q && s && r < n; r++) {
        float *x = rows + r * cols;
        if (f->ggml) {
            stz_ggml_quantize_row(f->ggml->type, x, f->weights, cols, q);
            stz_ggml_dequantize_row(f->ggml->type, q, cols, x);
        } else {
            stz_qf_quantize_any(f, x, cols, q, s, s + nb);
            stz_qf_dequantize_row(f, q, s, s + nb, cols, x);
        }
    }
    int ok = q && s;
    free(q), free(s);
    return ok ? 0 : -1;
}

/* Each row becomes its quantized and dequantized self under the probe candidate. */
static int probe_perturb(void *user, const char *name, float *rows, uint64_t r0, size_t n, size_t cols)
{
    (void)r0;
    const stz_tune *T = user;
    return perturb_rows(&stz_tune_find(T, name)->fmt[T->probe], rows, n, cols);
}

static void probe_result(void *user, const char *name, double kl)
{
    const stz_tune *T = user;
    stz_tune_tensor *t = stz_tune_find(T, name);
    t->kl_probe = kl, t->sens = kl / t->err2[T->probe];
}

/* The token embedding probed once per block candidate. */
typedef struct {
    const stz_tune_tensor *t;
    size_t *cand; /* the candidates probed, in order */
    double *kl;   /* their results */
    size_t k;     /* the one being probed */
} emb_probe;

static int emb_select(void *user, const char *name) { return !strcmp(((emb_probe *)user)->t->name, name); }

static int emb_perturb(void *user, const char *name, float *rows, uint64_t r0, size_t n, size_t cols)
{
    (void)name, (void)r0;
    const emb_probe *e = user;
    return perturb_rows(&e->t->fmt[e->cand[e->k]], rows, n, cols);
}

static void emb_result(void *user, const char *name, double kl)
{
    emb_probe *e = user;
    (void)name, e->kl[e->k] = kl;
}

static void emb_variant(void *user, size_t k) { ((emb_probe *)user)->k = k; }

/* The token embedding's offered block candidates each probed with its own
 * format (the matrix that is read for the input, and for the output too
 * when the head is tied, is where the probe format predicts other formats
 * worst: on stories260K the 4-bit nl probe predicted 0.7x of the KL Q5_0
 * gives it); err2[c] becomes that KL over sens, a feedback candidate's
 * scaled by feedback's gain on a tied head's output error (plain_out; an
 * untied embedding's feedback candidates stand for plain rounding). */
static stz_status probe_embedding(stz_tune *T, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                                  const size_t *lens, const stz_tune_params *p, stz_err *err)
{
    stz_tune_tensor *t = stz_tune_find(T, stz_fwd_embedding(m, NULL));
    if (!t || !t->tunable || !(t->sens > 0))
        return STZ_OK;
    emb_probe e = {t, calloc(T->noffered + 1, sizeof *e.cand), calloc(T->noffered + 1, sizeof *e.kl), 0};
    stz_fwd_probe pr = {
        .select = emb_select, .perturb = emb_perturb, .result = emb_result, .user = &e, .variant = emb_variant};
    stz_status st = e.cand && e.kl ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the embedding's probes");
    for (size_t c = 0; !st && c < T->noffered; c++) {
        const stz_decision *d = &T->cand[c].d;
        if (d->method == STZ_QMETHOD_TRELLIS) /* lookups read single rows; a trellis value needs its segment's */
            t->bytes[c] = UINT64_MAX, t->err2[c] = INFINITY;
        else if (stz_action_is_block(d->action, d->ggml_type) && t->bytes[c] != UINT64_MAX && isfinite(t->err2[c]))
            e.cand[pr.variants++] = c;
    }
    if (!st && pr.variants) /* one unperturbed run for all of them */
        st = stz_fwd_probe_run(m, tokens, nseq, stride, lens, &pr, p->progress, p->progress_user, err);
    for (size_t k = 0; !st && k < pr.variants; k++) {
        size_t c = e.cand[k];
        double gain = T->cand[c].d.feedback && t->plain_out && t->plain_out[c] > 0 ? t->err2[c] / t->plain_out[c] : 1;
        t->err2[c] = e.kl[k] * gain / t->sens;
    }
    free(e.cand), free(e.kl);
    return st;
}

stz_status stz_tune_probe(stz_tune *T, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                          const size_t *lens, const stz_tune_params *p, stz_err *err)
{
    stz_fwd_probe pr = {.select = probe_select, .perturb = probe_perturb, .result = probe_result, .user = T};
    stz_status st = stz_fwd_probe_run(m, tokens, nseq, stride, lens, &pr, p->progress, p->progress_user, err);
    return st ? st : probe_embedding(T, m, tokens, nseq, stride, lens, p, err);
}

void stz_tune_free(stz_tune *T)
{
    for (size_t i = 0; T->t && i < T->nt; i++)
        free(T->t[i].name), free(T->t[i].bytes), free(T->t[i].err2), free(T->t[i].fmt), free(T->t[i].plain_out);
    free(T->t);
    free(T->cand);
    for (size_t f = 0; T->meta && f < T->nfiles; f++)
        free(T->meta[f]);
    free(T->meta);
    memset(T, 0, sizeof *T);
}

/* ---- the policy ------------------------------------------------------------------- */

/* fnmatch sees a name literally once * ? [ and \ are escaped. */
static void escape_pattern(const char *s, char *out, size_t cap)
{
    size_t k = 0;
    for (; *s && k + 3 < cap; s++) {
        if (strchr("*?[\\", *s))
            out[k++] = '\\';
        out[k++] = *s;
    }
    out[k] = 0;
}

char *stz_tune_policy(const stz_tune *T, const char *description)
{
    cJSON *p = cJSON_CreateObject(), *rules = cJSON_CreateArray();
    cJSON_AddStringToObject(p, "description", description);
    cJSON_AddStringToObject(p, "default", "keep");
    cJSON_AddItemToObject(p, "rules", rules);
    char pat[1200], comment[160];
    for (size_t i = 0; i < T->nt; i++) {
        const stz_tune_tensor *t = &T->t[i];
        if (!t->tunable)
            continue;
        const stz_tune_cand *c = &T->cand[t->choice];
        cJSON *r = cJSON_CreateObject();
        escape_pattern(t->name, pat, sizeof pat);
        cJSON_AddStringToObject(r, "match", pat);
        cJSON_AddStringToObject(r, "action", stz_action_name(c->d.action, c->d.ggml_type));
        if (c->d.action == STZ_ACTION_SVD) {
            cJSON_AddNumberToObject(r, "rank", c->d.svd_rank);
            if (c->d.svd_randomized)
                cJSON_AddStringToObject(r, "method", "randomized");
            cJSON_AddStringToObject(r, "fallback", "keep");
        } else if (c->d.action != STZ_ACTION_KEEP && stz_decision_ggml_type(&c->d) < 0) {
            cJSON_AddStringToObject(r, "method", stz_qmethod_name(c->d.method));
            cJSON_AddNumberToObject(r, "block_size", c->d.block_size);
            cJSON_AddStringToObject(r, "scale_dtype", stz_dtype_name(c->d.scale_dtype));
        }
        if (stz_action_is_block(c->d.action, c->d.ggml_type)) /* said either way: calibration by default keeps to it */
            cJSON_AddBoolToObject(r, "feedback", c->d.feedback && t->fed);
        if (t->ffn == STZ_TUNE_FFN_DOWN && stz_decision_ggml_type(&c->d) >= 0 &&
            stz_action_is_block(c->d.action, c->d.ggml_type))
            cJSON_AddBoolToObject(r, "pad", 1);
        snprintf(comment, sizeof comment, "%s: %llu bytes, relative error %.4f, predicted KL %.3g", c->name,
                 (unsigned long long)t->bytes[t->choice], t->norm2 > 0 ? sqrt(t->err2[t->choice] / t->norm2) : 0,
                 t->sens * t->err2[t->choice]);
        cJSON_AddStringToObject(r, "comment", comment);
        cJSON_AddItemToArray(rules, r);
    }
    char *s = cJSON_Print(p);
    cJSON_Delete(p);
    return s;
}
