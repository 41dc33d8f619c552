/* stz inspect: what a model file holds. */
#include "cli.h"
#include "stz_pack.h"
#include "stz_model.h"
#include "stz_pipeline.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char inspect_help[] =
    "usage: stz inspect [--json] FILE|DIR\n\n"
    "Lists every tensor of a SafeTensors file (name, dtype, shape, parameters,\n"
    "bytes) in file order, totals per dtype, and the __metadata__ entries.\n"
    "Only the header is read, so any file size takes the same memory.\n"
    "For an .stz container, also the stored size and ratio of each tensor,\n"
    "the codec of each plane, and totals per dtype and per plane. For a file\n"
    "quantized by stz (or a container of one), each tensor under its original\n"
    "name, dtype and shape with how it is stored (INT4 absmax b128, SVD rank\n"
    "64, kept) and the true parameter count. A model directory (sharded, or\n"
    "holding model.safetensors) lists each of its files. A GGUF file (stz\n"
    "export) lists its tensors (ggml type, shape, bytes) and its keys.\n\n"
    "  --json      print the same as one JSON object\n"
    "  -h, --help  this text\n";

typedef struct {
    uint64_t tensors, params, bytes;
} totals;

static void shape_str(const stz_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static void sum_dtypes(const stz_reader *r, totals *by)
{
    memset(by, 0, sizeof(totals) * STZ_DTYPE_COUNT);
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        by[t->dtype].tensors++;
        by[t->dtype].params += t->numel;
        by[t->dtype].bytes += t->end - t->begin;
    }
}

static int has_quant_meta(const stz_reader *r)
{
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        if (!strncmp(stz_reader_meta_key(r, i), "stz.quant.", 10))
            return 1;
    return 0;
}

/* "int4 absmax b128", "svd rank 64", "kept" */
static const char *stored_as(const stz_qtensor *t, char *buf, size_t cap)
{
    if (!t->bits)
        return "kept";
    if (t->rank)
        snprintf(buf, cap, "svd rank %llu (int8)", (unsigned long long)t->rank);
    else
        snprintf(buf, cap, "int%d %s b%u", t->bits, t->method, t->block_size);
    return buf;
}

/* The tensors of a file quantized by stz under their original names: a
 * table on stdout, or "model" entries added to o. */
static stz_status quant_view(const stz_reader *r, cJSON *o, stz_err *err)
{
    stz_qmodel *m;
    stz_status st = stz_qmodel_open_reader(&m, r, err);
    if (st)
        return st;
    size_t n = stz_qmodel_count(m), w = 4, nq = 0;
    uint64_t params = 0, pq = 0;
    char a[32], b[32], shape[256], how[64];
    for (size_t i = 0; i < n; i++) {
        const stz_qtensor *t = stz_qmodel_tensor(m, i);
        w = strlen(t->name) > w ? strlen(t->name) : w;
        params += t->numel;
        if (t->bits)
            nq++, pq += t->numel;
    }
    w = w > 64 ? 64 : w;
    cJSON *arr = o ? cJSON_CreateArray() : NULL;
    if (!o)
        printf(
            "\nquantized by stz: %zu tensors, %s parameters (%zu tensors, %.1f%% of parameters quantized)\n"
            "%-*s  %-7s  %-18s  %-22s  %15s\n",
            n, cli_commas(a, params), nq, params ? 100.0 * (double)pq / (double)params : 0, (int)w, "name", "dtype",
            "shape", "stored as", "bytes");
    for (size_t i = 0; i < n; i++) {
        const stz_qtensor *t = stz_qmodel_tensor(m, i);
        stz_tensor view = {.ndim = t->ndim, .shape = (uint64_t *)t->shape};
        shape_str(&view, shape, sizeof shape);
        if (!o) {
            printf("%-*s  %-7s  %-18s  %-22s  %15s\n", (int)w, t->name, stz_dtype_name(t->dtype), shape,
                   stored_as(t, how, sizeof how), cli_commas(b, t->stored_bytes));
            continue;
        }
        cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddStringToObject(e, "dtype", stz_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToObject(e, "shape", sh);
        cJSON_AddNumberToObject(e, "params", (double)t->numel);
        cJSON_AddStringToObject(e, "action", stz_qtensor_action(t, "keep"));
        if (t->method)
            cJSON_AddStringToObject(e, "method", t->method);
        if (t->block_size)
            cJSON_AddNumberToObject(e, "block_size", t->block_size);
        if (t->rank)
            cJSON_AddNumberToObject(e, "rank", (double)t->rank);
        cJSON_AddNumberToObject(e, "stored_bytes", (double)t->stored_bytes);
        cJSON_AddItemToArray(arr, e);
    }
    if (o) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddNumberToObject(q, "tensor_count", (double)n);
        cJSON_AddNumberToObject(q, "params", (double)params);
        cJSON_AddNumberToObject(q, "tensors_quantized", (double)nq);
        cJSON_AddNumberToObject(q, "params_quantized_share", params ? (double)pq / (double)params : 0);
        cJSON_AddItemToObject(q, "tensors", arr);
        cJSON_AddItemToObject(o, "model", q);
    }
    stz_qmodel_free(m);
    return STZ_OK;
}

static cJSON *build_json(const stz_reader *r)
{
    totals by[STZ_DTYPE_COUNT];
    sum_dtypes(r, by);
    cJSON *o = cJSON_CreateObject(), *ts = cJSON_CreateArray(), *dts = cJSON_CreateObject(), *md = cJSON_CreateObject();
    uint64_t params = 0;
    cJSON_AddStringToObject(o, "file", stz_reader_path(r));
    cJSON_AddStringToObject(o, "format", "safetensors");
    cJSON_AddNumberToObject(o, "file_size", (double)stz_reader_file_size(r));
    cJSON_AddNumberToObject(o, "header_size", (double)stz_reader_data_offset(r) - 8);
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddStringToObject(e, "dtype", stz_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToObject(e, "shape", sh);
        cJSON_AddNumberToObject(e, "params", (double)t->numel);
        cJSON_AddNumberToObject(e, "bytes", (double)(t->end - t->begin));
        cJSON_AddNumberToObject(e, "offset", (double)(stz_reader_data_offset(r) + t->begin));
        cJSON_AddItemToArray(ts, e);
        params += t->numel;
    }
    for (int d = 0; d < STZ_DTYPE_COUNT; d++) {
        if (!by[d].tensors)
            continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "tensors", (double)by[d].tensors);
        cJSON_AddNumberToObject(e, "params", (double)by[d].params);
        cJSON_AddNumberToObject(e, "bytes", (double)by[d].bytes);
        cJSON_AddItemToObject(dts, stz_dtype_name((stz_dtype)d), e);
    }
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        cJSON_AddStringToObject(md, stz_reader_meta_key(r, i), stz_reader_meta_value(r, i));
    cJSON_AddNumberToObject(o, "tensor_count", (double)stz_reader_count(r));
    cJSON_AddNumberToObject(o, "params", (double)params);
    cJSON_AddItemToObject(o, "tensors", ts);
    cJSON_AddItemToObject(o, "dtypes", dts);
    cJSON_AddItemToObject(o, "metadata", md);
    return o;
}

static void print_table(const stz_reader *r)
{
    char a[32], b[32], c[32], shape[256];
    size_t n = stz_reader_count(r), w = 4;
    uint64_t params = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(stz_reader_tensor(r, i)->name);
        w = l > w ? l : w;
        params += stz_reader_tensor(r, i)->numel;
    }
    w = w > 64 ? 64 : w;
    printf("%s: SafeTensors, %zu tensors, %s parameters, %s bytes (header %s)\n\n", stz_reader_path(r), n,
           cli_commas(a, params), cli_commas(b, stz_reader_file_size(r)), cli_commas(c, stz_reader_data_offset(r) - 8));
    printf("%-*s  %-11s  %-18s  %15s  %15s\n", (int)w, "name", "dtype", "shape", "params", "bytes");
    for (size_t i = 0; i < n; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        shape_str(t, shape, sizeof shape);
        printf("%-*s  %-11s  %-18s  %15s  %15s\n", (int)w, t->name, stz_dtype_name(t->dtype), shape,
               cli_commas(a, t->numel), cli_commas(b, t->end - t->begin));
    }
    totals by[STZ_DTYPE_COUNT];
    sum_dtypes(r, by);
    printf("\nby dtype:\n");
    for (int d = 0; d < STZ_DTYPE_COUNT; d++)
        if (by[d].tensors)
            printf("  %-11s %8llu tensors  %18s params  %18s bytes\n", stz_dtype_name((stz_dtype)d),
                   (unsigned long long)by[d].tensors, cli_commas(a, by[d].params), cli_commas(b, by[d].bytes));
    printf("\nmetadata:%s\n", stz_reader_meta_count(r) ? "" : " (none)");
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        cli_print_meta(stz_reader_meta_key(r, i), stz_reader_meta_value(r, i));
}

/* Per-tensor and per-kind (dtype, or llama.cpp type) sums over a
 * container's chunks: the planes of the transform of its first chunk, and
 * apart (`other`) the chunks coded another way (zstd on the unsplit bytes,
 * a GGUF tensor's padding). */
typedef struct {
    uint64_t bytes, stored, raw[STZ_MAX_PLANES], zipped[STZ_MAX_PLANES], other_raw, other_stored;
    unsigned codecs[STZ_MAX_PLANES]; /* bit mask of codecs used */
    int nplanes, set;
    stz_xform xform;
    int block_type;
} tsum;

#define KINDS (STZ_DTYPE_COUNT + 256) /* dtypes, then ggml types */

static const char *plane_name(const tsum *t, int k, char *buf, size_t cap)
{
    return stz_plane_name(t->xform, t->block_type, k, buf, cap);
}

static void codec_list(unsigned mask, char *buf, size_t cap)
{
    buf[0] = 0;
    for (int c = 0; c < STZ_CODEC_COUNT; c++)
        if (mask & (1u << c))
            snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? "+" : "", stz_codec_name((stz_codec)c));
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

/* A container's figures: per tensor and per kind, bytes and stored bytes
 * of the whole and of each plane, and the codecs used. gguf: the original
 * GGUF's header (its tensors' types and shapes, its keys), or NULL. */
typedef struct {
    stz_container *c;
    const stz_reader *h;
    stz_gguf *gguf;
    const stz_gguf_tensor **gt; /* per tensor of h: the GGUF tensor of that name, or NULL */
    size_t nt;
    tsum *ts, by_kind[KINDS];
} csum;

static void add_chunk(tsum *t, const stz_chunk_info *ch, const stz_chunk_planes *pl)
{
    t->stored += ch->record_size, t->bytes += ch->raw_size;
    if (!t->set)
        t->set = 1, t->xform = pl->xform, t->block_type = pl->block_type, t->nplanes = pl->nplanes;
    if (pl->xform != t->xform || pl->block_type != t->block_type) {
        t->other_raw += ch->raw_size, t->other_stored += ch->record_size;
        return;
    }
    for (int k = 0; k < pl->nplanes; k++) {
        t->raw[k] += pl->raw[k], t->zipped[k] += pl->stored[k];
        t->codecs[k] |= 1u << pl->codec[k];
    }
}

/* The kind a tensor's sums go under, and its name. */
static int kind_of(const csum *s, size_t i)
{
    const stz_gguf_tensor *g = s->gt ? s->gt[i] : NULL;
    return g && stz_ggml_type_name(g->type) && (unsigned)g->type < 256 ? STZ_DTYPE_COUNT + g->type
                                                                       : (int)stz_reader_tensor(s->h, i)->dtype;
}

static const char *kind_name(int k)
{
    return k < STZ_DTYPE_COUNT ? stz_dtype_name((stz_dtype)k) : stz_ggml_type_name(k - STZ_DTYPE_COUNT);
}

/* Chunk i's share of tensor t (bytes [a, b) of the chunk) into part and
 * pp: a member's own planes (format 3; `rest`, the record's bytes outside
 * its members, shared by bytes), or a share by bytes of small tensors'
 * bytes coded together (format 2). */
static void tensor_part(const stz_chunk_info *ch, const stz_chunk_planes *pl, const stz_chunk_planes *members,
                        const uint32_t *mbytes, uint64_t rest, uint32_t t, uint64_t a, uint64_t b, stz_chunk_info *part,
                        stz_chunk_planes *pp)
{
    *part = *ch, *pp = pl->xform == STZ_XFORM_MEMBERS ? members[t - ch->tensor] : *pl;
    if (ch->last == ch->tensor && pl->xform != STZ_XFORM_MEMBERS)
        return;
    part->raw_size = (uint32_t)(b - a);
    if (pl->xform == STZ_XFORM_MEMBERS) {
        part->record_size = (uint32_t)(mbytes[t - ch->tensor] + rest * b / ch->raw_size - rest * a / ch->raw_size);
        return;
    }
    pp->raw[0] = part->raw_size;
    part->record_size = (uint32_t)(ch->record_size * b / ch->raw_size - ch->record_size * a / ch->raw_size);
    pp->stored[0] = (uint32_t)(pl->stored[0] * b / ch->raw_size - pl->stored[0] * a / ch->raw_size);
}

static stz_status sum_chunks(csum *s, stz_err *err)
{
    stz_chunk_planes *members = NULL;
    uint32_t *mbytes = NULL;
    stz_status st = STZ_OK;
    for (size_t i = 0; !st && i < stz_container_chunk_count(s->c); i++) {
        const stz_chunk_info *ch = stz_container_chunk(s->c, i);
        size_t m = ch->last - ch->tensor + 1;
        stz_chunk_planes pl;
        if ((st = stz_container_planes(s->c, i, &pl, err)))
            break;
        if (pl.xform == STZ_XFORM_MEMBERS) {
            free(members), free(mbytes);
            members = malloc(m * sizeof *members), mbytes = malloc(m * sizeof *mbytes);
            st = !members || !mbytes ? stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu members", m)
                                     : stz_container_members(s->c, i, members, mbytes, m, err);
        }
        uint64_t rest = ch->record_size; /* the record's bytes outside its members: its head */
        for (size_t k = 0; !st && pl.xform == STZ_XFORM_MEMBERS && k < m; k++)
            rest -= mbytes[k];
        for (uint32_t t = ch->tensor; !st && t <= ch->last; t++) {
            const stz_tensor *x = stz_reader_tensor(s->h, t);
            if (x->end == x->begin && pl.xform == STZ_XFORM_MEMBERS)
                continue; /* no member */
            stz_chunk_info part;
            stz_chunk_planes pp;
            tensor_part(ch, &pl, members, mbytes, rest, t, x->begin - ch->data_offset, x->end - ch->data_offset, &part,
                        &pp);
            add_chunk(&s->ts[t], &part, &pp);
            add_chunk(&s->by_kind[kind_of(s, t)], &part, &pp);
        }
    }
    free(members), free(mbytes);
    return st;
}

/* A GGUF container: its header, and each tensor's GGUF entry. */
static stz_status open_gguf_view(csum *s, const char *path, stz_err *err)
{
    size_t len;
    int gguf;
    const uint8_t *img = stz_container_original_header(s->c, &len, &gguf);
    if (!gguf)
        return STZ_OK;
    stz_status st = stz_gguf_parse_layout(&s->gguf, img, len, stz_container_original_size(s->c), path, err);
    if (!st && !(s->gt = calloc(s->nt + 1, sizeof *s->gt)))
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu tensors", path, s->nt);
    for (size_t i = 0; !st && i < stz_gguf_tensor_count(s->gguf); i++) {
        const stz_gguf_tensor *t = stz_gguf_tensor_at(s->gguf, i);
        long k = stz_reader_find(s->h, t->name);
        if (k >= 0)
            s->gt[k] = t;
    }
    return st;
}

/* Type and shape columns: the GGUF's (ne0 first) for a GGUF container. */
static void type_and_shape(const csum *s, size_t i, const char **type, char *shape, size_t cap)
{
    const stz_tensor *t = stz_reader_tensor(s->h, i);
    const stz_gguf_tensor *g = s->gt ? s->gt[i] : NULL;
    *type = stz_dtype_name(t->dtype);
    if (!g) {
        shape_str(t, shape, cap);
        return;
    }
    *type = stz_ggml_type_name(g->type) ? stz_ggml_type_name(g->type) : "?";
    size_t o = (size_t)snprintf(shape, cap, "[");
    for (uint32_t d = 0; d < g->ndim && o < cap; d++)
        o += (size_t)snprintf(shape + o, cap - o, "%s%llu", d ? ", " : "", (unsigned long long)g->ne[d]);
    if (o < cap)
        snprintf(shape + o, cap - o, "]");
}

static cJSON *plane_json(const char *name, unsigned codecs, uint64_t raw, uint64_t stored)
{
    char cod[64];
    cJSON *q = cJSON_CreateObject();
    codec_list(codecs, cod, sizeof cod);
    cJSON_AddStringToObject(q, "name", name);
    cJSON_AddStringToObject(q, "codec", cod);
    cJSON_AddNumberToObject(q, "bytes", (double)raw);
    cJSON_AddNumberToObject(q, "stored", (double)stored);
    return q;
}

static cJSON *tensor_json(const csum *s, size_t i)
{
    char pn[32], shape[256];
    const stz_tensor *t = stz_reader_tensor(s->h, i);
    const tsum *ts = &s->ts[i];
    const char *type;
    cJSON *e = cJSON_CreateObject(), *pls = cJSON_CreateArray();
    type_and_shape(s, i, &type, shape, sizeof shape);
    cJSON_AddStringToObject(e, "name", t->name);
    cJSON_AddStringToObject(e, "dtype", stz_dtype_name(t->dtype));
    if (s->gt && s->gt[i])
        cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "bytes", (double)(t->end - t->begin));
    cJSON_AddNumberToObject(e, "stored", (double)ts->stored);
    for (int k = 0; k < ts->nplanes; k++)
        cJSON_AddItemToArray(pls,
                             plane_json(plane_name(ts, k, pn, sizeof pn), ts->codecs[k], ts->raw[k], ts->zipped[k]));
    if (ts->other_raw)
        cJSON_AddItemToArray(pls, plane_json("other", 0, ts->other_raw, ts->other_stored));
    cJSON_AddItemToObject(e, "planes", pls);
    return e;
}

/* The --json document; NULL (the error reported) when the quantized view fails. */
static cJSON *container_json(const csum *s, const char *path, int *rc)
{
    stz_err err;
    uint64_t orig = stz_container_original_size(s->c), size = stz_container_file_size(s->c);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray(), *dts = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", path);
    cJSON_AddStringToObject(o, "format", "stz");
    cJSON_AddNumberToObject(o, "format_version", stz_container_format_version(s->c));
    cJSON_AddNumberToObject(o, "file_size", (double)size);
    cJSON_AddNumberToObject(o, "original_size", (double)orig);
    cJSON_AddNumberToObject(o, "ratio", ratio(orig, size));
    cJSON_AddNumberToObject(o, "chunk_size", stz_container_chunk_size(s->c));
    cJSON_AddNumberToObject(o, "chunks", (double)stz_container_chunk_count(s->c));
    cJSON_AddStringToObject(o, "original_format", s->gguf ? "gguf" : "safetensors");
    for (size_t i = 0; i < s->nt; i++)
        cJSON_AddItemToArray(arr, tensor_json(s, i));
    for (int d = 0; d < KINDS; d++) {
        if (!s->by_kind[d].stored)
            continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "bytes", (double)s->by_kind[d].bytes);
        cJSON_AddNumberToObject(e, "stored", (double)s->by_kind[d].stored);
        cJSON_AddNumberToObject(e, "ratio", ratio(s->by_kind[d].bytes, s->by_kind[d].stored));
        cJSON_AddItemToObject(dts, kind_name(d), e);
    }
    cJSON_AddItemToObject(o, "tensors", arr);
    cJSON_AddItemToObject(o, "dtypes", dts);
    cJSON_AddBoolToObject(o, "lossless", !has_quant_meta(s->h));
    cJSON *md = cJSON_CreateObject();
    for (size_t i = 0; i < stz_reader_meta_count(s->h); i++)
        cJSON_AddStringToObject(md, stz_reader_meta_key(s->h, i), stz_reader_meta_value(s->h, i));
    for (size_t i = 0; s->gguf && i < stz_gguf_kv_count(s->gguf); i++)
        cJSON_AddStringToObject(md, stz_gguf_kv_key(s->gguf, i), stz_gguf_kv_text(s->gguf, i));
    cJSON_AddItemToObject(o, "metadata", md);
    if (has_quant_meta(s->h) && quant_view(s->h, o, &err))
        *rc = cli_fail(&err), cJSON_Delete(o), o = NULL;
    return o;
}

static void print_planes(const tsum *t, const char *indent)
{
    char a[32], b[32], cod[64], pn[32];
    for (int k = 0; k < t->nplanes; k++) {
        codec_list(t->codecs[k], cod, sizeof cod);
        if (indent)
            printf("%s%-17s %18s -> %18s bytes  %.3fx  %s\n", indent, plane_name(t, k, pn, sizeof pn),
                   cli_commas(a, t->raw[k]), cli_commas(b, t->zipped[k]), ratio(t->raw[k], t->zipped[k]), cod);
        else
            printf(" %s:%s %.2fx", plane_name(t, k, pn, sizeof pn), cod, ratio(t->raw[k], t->zipped[k]));
    }
    if (t->other_raw && indent)
        printf("%s%-17s %18s -> %18s bytes  %.3fx\n", indent, "other", cli_commas(a, t->other_raw),
               cli_commas(b, t->other_stored), ratio(t->other_raw, t->other_stored));
    else if (t->other_raw)
        printf(" other %.2fx", ratio(t->other_raw, t->other_stored));
}

/* The table of tensors, then the figures by kind and plane. */
static void container_table(const csum *s)
{
    char a[32], b[32], shape[256];
    const char *type;
    size_t w = 4;
    for (size_t i = 0; i < s->nt; i++)
        w = strlen(stz_reader_tensor(s->h, i)->name) > w ? strlen(stz_reader_tensor(s->h, i)->name) : w;
    w = w > 64 ? 64 : w;
    printf("%-*s  %-7s  %-16s  %13s  %13s  %7s  planes (codec ratio)\n", (int)w, "name", s->gguf ? "type" : "dtype",
           "shape", "bytes", "stored", "ratio");
    for (size_t i = 0; i < s->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(s->h, i);
        type_and_shape(s, i, &type, shape, sizeof shape);
        printf("%-*s  %-7s  %-16s  %13s  %13s  %6.3fx ", (int)w, t->name, type, shape, cli_commas(a, t->end - t->begin),
               cli_commas(b, s->ts[i].stored), ratio(t->end - t->begin, s->ts[i].stored));
        print_planes(&s->ts[i], NULL);
        printf("\n");
    }
    printf("\nby %s and plane:\n", s->gguf ? "type" : "dtype");
    for (int d = 0; d < KINDS; d++) {
        const tsum *k = &s->by_kind[d];
        if (!k->stored)
            continue;
        printf("  %-7s %18s -> %18s bytes  %.3fx\n", kind_name(d), cli_commas(a, k->bytes), cli_commas(b, k->stored),
               ratio(k->bytes, k->stored));
        print_planes(k, "    ");
    }
}

static int inspect_container(const char *path, cJSON **json)
{
    stz_err err;
    csum s = {0};
    if (stz_container_open(&s.c, path, &err))
        return cli_fail(&err);
    s.h = stz_container_header(s.c);
    s.nt = stz_reader_count(s.h);
    int rc = CLI_OK;
    if (open_gguf_view(&s, path, &err)) {
        rc = cli_fail(&err);
    } else if (!(s.ts = calloc(s.nt + 1, sizeof *s.ts))) {
        stz_err_set(&err, STZ_E_NOMEM, "%s: out of memory for %zu tensors' figures", path, s.nt);
        rc = cli_fail(&err);
    } else if (sum_chunks(&s, &err)) {
        rc = cli_fail(&err);
    } else if (json) {
        *json = container_json(&s, path, &rc);
    } else {
        char a[32], b[32];
        uint64_t orig = stz_container_original_size(s.c), size = stz_container_file_size(s.c);
        printf("%s: stz container v%u%s, %zu tensors, %s -> %s bytes (%.3fx), %zu chunks of %u bytes\n%s\n\n", path,
               stz_container_format_version(s.c), s.gguf ? " of a GGUF file" : "", s.nt, cli_commas(a, orig),
               cli_commas(b, size), ratio(orig, size), stz_container_chunk_count(s.c), stz_container_chunk_size(s.c),
               has_quant_meta(s.h) ? "lossy: holds a model quantized by stz (decompress --dequantize gives floats back)"
                                   : "lossless: unpacks to the original file byte for byte");
        container_table(&s);
        printf("\nmetadata:%s\n", stz_reader_meta_count(s.h) || s.gguf ? "" : " (none)");
        for (size_t i = 0; i < stz_reader_meta_count(s.h); i++)
            cli_print_meta(stz_reader_meta_key(s.h, i), stz_reader_meta_value(s.h, i));
        for (size_t i = 0; s.gguf && i < stz_gguf_kv_count(s.gguf); i++)
            cli_print_meta(stz_gguf_kv_key(s.gguf, i), stz_gguf_kv_text(s.gguf, i));
        if (has_quant_meta(s.h) && quant_view(s.h, NULL, &err))
            rc = cli_fail(&err);
    }
    free(s.ts);
    free(s.gt);
    stz_gguf_free(s.gguf);
    stz_container_free(s.c);
    return rc;
}

/* One file; with json, *json receives its document instead of a table. */
static int inspect_file(const char *path, cJSON **json)
{
    if (stz_is_container(path))
        return inspect_container(path, json);
    if (stz_is_gguf(path))
        return cli_inspect_gguf(path, json);
    stz_err err;
    stz_reader *r;
    if (stz_reader_open(&r, path, &err))
        return cli_fail(&err);
    int rc = CLI_OK;
    if (json)
        *json = build_json(r);
    else
        print_table(r);
    if (has_quant_meta(r) && quant_view(r, json ? *json : NULL, &err)) {
        rc = cli_fail(&err);
        if (json)
            cJSON_Delete(*json), *json = NULL;
    }
    stz_reader_free(r);
    return rc;
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'j')
            json = 1;
        else if (c == 'h')
            return fputs(inspect_help, stdout), CLI_OK;
        else
            return cli_bad_option("inspect");
    }
    if (optind != argc - 1)
        return cli_usage_error("inspect", "expected one FILE or DIR");
    stz_err err;
    char **files;
    size_t n;
    if (stz_model_files(argv[optind], &files, &n, &err))
        return cli_fail(&err);
    int rc = CLI_OK;
    cJSON *arr = json && n > 1 ? cJSON_CreateArray() : NULL;
    for (size_t i = 0; i < n && rc == CLI_OK; i++) {
        cJSON *doc = NULL;
        if (i)
            fputs(json ? "" : "\n", stdout);
        rc = inspect_file(files[i], json ? &doc : NULL);
        if (doc && arr)
            cJSON_AddItemToArray(arr, doc);
        else if (doc)
            rc = cli_print_json(doc);
    }
    if (arr && rc == CLI_OK) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "directory", argv[optind]);
        cJSON_AddItemToObject(o, "files", arr);
        rc = cli_print_json(o);
    } else {
        cJSON_Delete(arr);
    }
    stz_model_files_free(files, n);
    return rc;
}
