/* stz tune: the budget solved over the measured candidates (the lower
 * convex hull of each tensor's bytes and predicted KL, walked by slope;
 * see stz_tune.h). */
#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_pack.h"
#include "stz_safetensors.h"
#include "stz_tune.h"
#include "quant/quant_tensor.h"
#include "quant/ggml_types.h"
#include "gguf/gguf_format.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- solving --------------------------------------------------------------------- */

/* One step of a tensor's lower convex hull: from candidate `from` to `to`. */
typedef struct {
    size_t t, step;
    int from, to;
    double slope; /* KL saved per byte */
    uint64_t db;
    double dkl;
} segment;

static int by_slope(const void *a, const void *b)
{
    const segment *x = a, *y = b;
    if (x->slope != y->slope)
        return x->slope < y->slope ? 1 : -1;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

static double pred_kl(const stz_tune_tensor *t, int c, double scale) { return t->sens * t->err2[c] * scale; }

/* The lower convex hull of a tensor's (bytes, KL) points, from the
 * fewest bytes to no KL: candidate indices into hull; returns the count. */
static size_t hull_of(const stz_tune *T, const stz_tune_tensor *t, double scale, int *hull)
{
    size_t n = 0;
    int *ord = malloc(T->ncand * sizeof *ord);
    if (!ord)
        return 0;
    for (size_t c = 0; c < T->noffered; c++)
        if (t->bytes[c] != UINT64_MAX)
            ord[n++] = (int)c;
    for (size_t i = 1; i < n; i++) /* by bytes, then KL; n is small */
        for (size_t j = i; j > 0; j--) {
            int a = ord[j - 1], b = ord[j];
            double ka = pred_kl(t, a, scale), kb = pred_kl(t, b, scale);
            if (t->bytes[a] > t->bytes[b] || (t->bytes[a] == t->bytes[b] && ka > kb))
                ord[j - 1] = b, ord[j] = a;
        }
    size_t h = 0;
    for (size_t i = 0; i < n; i++) {
        int c = ord[i];
        double k = pred_kl(t, c, scale);
        if (h && k >= pred_kl(t, hull[h - 1], scale))
            continue;    /* more bytes, no less KL */
        while (h >= 2) { /* drop the last point if it lies above the chord */
            int a = hull[h - 2], b = hull[h - 1];
            double s1 = (pred_kl(t, a, scale) - pred_kl(t, b, scale)) / (double)(t->bytes[b] - t->bytes[a]);
            double s2 = (pred_kl(t, b, scale) - k) / (double)(t->bytes[c] - t->bytes[b]);
            if (s2 < s1)
                break;
            h--;
        }
        hull[h++] = c;
    }
    free(ord);
    return h;
}

/* Adds tensor `name` (dtype, rows x cols, len bytes at *off) to header h. */
static void add_entry(cJSON *h, const char *name, stz_dtype dtype, uint64_t rows, uint64_t cols, uint64_t len,
                      uint64_t *off)
{
    cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *of = cJSON_CreateArray();
    cJSON_AddStringToObject(e, "dtype", stz_dtype_name(dtype));
    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)rows));
    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)cols));
    cJSON_AddItemToObject(e, "shape", sh);
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)*off));
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(*off += len)));
    cJSON_AddItemToObject(e, "data_offsets", of);
    cJSON_AddItemToObject(h, name, e);
}

/* The header stz quantize writes for file f under the current choice,
 * rebuilt (names, dtypes, shapes, offsets, metadata with each tensor's
 * description), and the container's fixed bytes for it. */
static uint64_t file_fixed_bytes(const stz_tune *T, size_t f)
{
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *orig = cJSON_Parse(T->meta[f]), *kv;
    cJSON_AddItemToObject(h, "__metadata__", meta);
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "stz.quant.version", "1");
    cJSON_ArrayForEach(kv, orig) cJSON_AddStringToObject(meta, kv->string, cJSON_GetStringValue(kv));
    cJSON_Delete(orig);
    uint64_t off = 0;
    char name[600], val[1600];
    for (size_t i = 0; i < T->nt; i++) {
        const stz_tune_tensor *t = &T->t[i];
        const stz_decision *d = t->tunable ? &T->cand[t->choice].d : NULL;
        if (t->file != f)
            continue;
        uint64_t rows = t->rows ? t->rows : 1, cols = t->params / rows;
        if (!d || d->action == STZ_ACTION_KEEP) {
            add_entry(h, t->name, t->dtype, rows, cols, t->params * stz_dtype_bits(t->dtype) / 8, &off);
            continue;
        }
        if (d->action == STZ_ACTION_SVD) {
            uint64_t r = d->svd_rank;
            static const char *const sfx[5] = {".U", ".U.scales", ".S", ".Vh", ".Vh.scales"};
            const uint64_t shp[5][2] = {{rows, r}, {rows, 0}, {r, 0}, {r, cols}, {r, 0}};
            for (int k = 0; k < 5; k++) {
                snprintf(name, sizeof name, "%s%s", t->name, sfx[k]);
                int f32 = k == 1 || k == 4;
                add_entry(h, name, f32 ? STZ_DTYPE_F32 : STZ_DTYPE_I8, shp[k][0], shp[k][1],
                          shp[k][0] * (shp[k][1] ? shp[k][1] : 1) * (f32 ? 4 : 1), &off);
            }
            snprintf(
                val, sizeof val,
                "{\"method\":\"svd\",\"svd_method\":\"exact\",\"bits\":8,\"rank\":%llu,"
                "\"dtype\":\"%s\",\"shape\":[%llu,%llu],\"U\":\"%s.U\",\"U_scales\":\"%s.U.scales\",\"S\":"
                "\"%s.S\",\"S_scale\":0.0123456789,\"Vh\":\"%s.Vh\",\"Vh_scales\":\"%s.Vh.scales\",\"scale_dtype\":"
                "\"F32\",\"rel_error\":0.123456789012345}",
                (unsigned long long)r, stz_dtype_name(t->dtype), (unsigned long long)rows, (unsigned long long)cols,
                t->name, t->name, t->name, t->name, t->name);
            snprintf(name, sizeof name, "stz.quant.%s", t->name);
            cJSON_AddStringToObject(meta, name, val);
            continue;
        }
        int bits = stz_action_bits(d->action, d->ggml_type), type = stz_decision_ggml_type(d);
        if (type >= 0) { /* a llama.cpp type: its rows of blocks, scales inside */
            uint64_t rb = stz_ggml_row_bytes(type, cols);
            add_entry(h, t->name, STZ_DTYPE_U8, rows, rb, rows * rb, &off);
            snprintf(val, sizeof val,
                     "{\"method\":\"%s\",\"bits\":%d,\"block_size\":%u,\"dtype\":\"%s\",\"shape\":"
                     "[%llu,%llu],\"packing\":\"" STZ_QUANT_GGML_PACKING "\"}",
                     stz_action_name(d->action, d->ggml_type), bits, stz_ggml_block(type), stz_dtype_name(t->dtype),
                     (unsigned long long)rows, (unsigned long long)cols);
            snprintf(name, sizeof name, "stz.quant.%s", t->name);
            cJSON_AddStringToObject(meta, name, val);
            continue;
        }
        uint64_t nb = stz_q_blocks(cols, d->block_size), ssz = stz_dtype_bits(d->scale_dtype) / 8;
        add_entry(h, t->name, stz_quant_values_dtype(bits, d->method), rows, stz_qf_row_bytes(bits, cols),
                  rows * stz_qf_row_bytes(bits, cols), &off);
        for (int k = 1; k <= (d->method == STZ_QMETHOD_ASYM ? 2 : 1); k++) {
            snprintf(name, sizeof name, "%s.%s", t->name, k == 1 ? "scales" : "mins");
            add_entry(h, name, d->scale_dtype, rows, nb, rows * nb * ssz, &off);
        }
        int n = snprintf(val, sizeof val,
                         "{\"method\":\"%s\",\"bits\":%d,\"block_size\":%u,\"dtype\":\"%s\",\"shape\":"
                         "[%llu,%llu],\"scales\":\"%s.scales\",\"scale_dtype\":\"%s\"",
                         d->method == STZ_QMETHOD_NL_FIT ? "nl" : stz_qmethod_name(d->method), bits, d->block_size,
                         stz_dtype_name(t->dtype), (unsigned long long)rows, (unsigned long long)cols, t->name,
                         stz_dtype_name(d->scale_dtype));
        if (d->scale_dtype == STZ_DTYPE_U8 && n > 0 && (size_t)n < sizeof val)
            n += snprintf(val + n, sizeof val - (size_t)n, ",\"scale_base\":%.17g", t->fmt[T->probe].scale_base);
        if (d->method == STZ_QMETHOD_NL_FIT && n > 0 && (size_t)n < sizeof val) /* 2^bits levels, 6 digits or so */
            for (int k = 0; k < 1 << bits && (size_t)n + 16 < sizeof val; k++)
                n += snprintf(val + n, sizeof val - (size_t)n, "%s%d", k ? "," : ",\"levels\":[", 1000 * k - 32767);
        if (n > 0 && (size_t)n < sizeof val)
            snprintf(val + n, sizeof val - (size_t)n, "%s%s\"}", d->method == STZ_QMETHOD_NL_FIT ? "]" : "",
                     bits == 8   ? ""
                     : bits == 4 ? ",\"packing\":\"int4-pairs-high-nibble-first"
                                 : ",\"packing\":\"bits-high-first");
        if (bits == 8) /* no packing key: close the object */
            val[strlen(val) - 2] = '}', val[strlen(val) - 1] = 0;
        snprintf(name, sizeof name, "stz.quant.%s", t->name);
        cJSON_AddStringToObject(meta, name, val);
    }
    char *s = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    uint64_t b = s ? stz_pack_fixed_bytes(s, strlen(s)) : 0;
    free(s);
    return b;
}

/* The GGUF type export writes tensor t's candidate c in (-1: t kept). */
static int gguf_type(const stz_tune *T, const stz_tune_tensor *t, int c)
{
    int type = c < 0 ? -1 : stz_decision_ggml_type(&T->cand[c].d);
    return type >= 0                    ? type
           : t->dtype == STZ_DTYPE_F16  ? STZ_GGML_F16
           : t->dtype == STZ_DTYPE_BF16 ? STZ_GGML_BF16
                                        : STZ_GGML_F32;
}

/* With gguf: what export's widening of the FFN adds (its widen_ffn) when
 * a down projection takes a 32-block type on rows that are not whole
 * blocks: the header's key, zero rows after the gate and up projections,
 * zero columns after the down projections written as floats. */
static uint64_t widened_bytes(const stz_tune *T)
{
    uint64_t to = 0, add = T->widen_header;
    for (size_t i = 0; i < T->nt; i++) {
        const stz_tune_tensor *t = &T->t[i];
        if (t->ffn == STZ_TUNE_FFN_DOWN && t->tunable && stz_ggml_block(gguf_type(T, t, t->choice)) > 1)
            to = (t->params / t->rows + STZ_GGML_QK - 1) / STZ_GGML_QK * STZ_GGML_QK;
    }
    for (size_t i = 0; to && i < T->nt; i++) {
        const stz_tune_tensor *t = &T->t[i];
        int c = t->tunable ? t->choice : -1, type = gguf_type(T, t, c);
        uint64_t rows = t->rows, cols = t->params / t->rows;
        if (!t->ffn || (t->ffn == STZ_TUNE_FFN_DOWN && stz_ggml_block(type) > 1))
            continue; /* no FFN part, or already written in whole padded blocks */
        *(t->ffn == STZ_TUNE_FFN_IN ? &rows : &cols) = to;
        add += gguf_padded(rows * stz_ggml_row_bytes(type, cols)) - t->bytes[c < 0 ? 0 : c];
    }
    return to ? add : 0;
}

static uint64_t fixed_bytes(const stz_tune *T)
{
    uint64_t b = T->extra_bytes + (T->gguf ? widened_bytes(T) : 0);
    for (size_t f = 0; !T->gguf && f < T->nfiles; f++) /* a GGUF header does not change with the choice */
        b += file_fixed_bytes(T, f);
    return b;
}

uint64_t stz_tune_bytes(const stz_tune *T)
{
    uint64_t b = fixed_bytes(T);
    for (size_t i = 0; i < T->nt; i++)
        b += T->t[i].bytes[T->t[i].tunable ? T->t[i].choice : 0];
    return b;
}

static double total_kl(const stz_tune *T, double scale)
{
    double k = 0;
    for (size_t i = 0; i < T->nt; i++)
        k += T->t[i].tunable ? pred_kl(&T->t[i], T->t[i].choice, scale) : 0;
    return k;
}

void stz_tune_solution_free(stz_tune_solution *s)
{
    free(s->curve);
    memset(s, 0, sizeof *s);
}

stz_status stz_tune_solve(stz_tune *T, stz_budget kind, double value, double kl_scale, stz_tune_solution *out,
                          stz_err *err)
{
    memset(out, 0, sizeof *out);
    int *hull = malloc(T->nt * T->ncand * sizeof *hull + 1);
    size_t *nh = calloc(T->nt + 1, sizeof *nh), nseg = 0;
    segment *seg = malloc(T->nt * T->ncand * sizeof *seg + 1);
    if (!hull || !nh || !seg) {
        free(hull), free(nh), free(seg);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the Pareto hulls");
    }
    for (size_t i = 0; i < T->nt; i++) {
        stz_tune_tensor *t = &T->t[i];
        if (!t->tunable)
            continue;
        int *h = hull + i * T->ncand;
        nh[i] = hull_of(T, t, kl_scale, h);
        t->choice = h[0];
        for (size_t k = 1; k < nh[i]; k++) {
            double dkl = pred_kl(t, h[k - 1], kl_scale) - pred_kl(t, h[k], kl_scale);
            uint64_t db = t->bytes[h[k]] - t->bytes[h[k - 1]];
            seg[nseg++] = (segment){i, k, h[k - 1], h[k], db ? dkl / (double)db : INFINITY, db, dkl};
        }
    }
    qsort(seg, nseg, sizeof *seg, by_slope);
    /* the path from the fewest bytes: its points are the Pareto curve */
    uint64_t fixed = fixed_bytes(T), bytes = 0;
    for (size_t i = 0; i < T->nt; i++)
        bytes += T->t[i].bytes[T->t[i].tunable ? T->t[i].choice : 0];
    double kl = total_kl(T, kl_scale);
    out->curve = malloc((nseg + 1) * sizeof *out->curve);
    if (!out->curve) {
        free(hull), free(nh), free(seg);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the Pareto curve");
    }
    out->curve[out->ncurve++] = (stz_tune_point){bytes + fixed, kl};
    for (size_t s = 0; s < nseg; s++) { /* what is left below the sums' rounding is 0 */
        bytes += seg[s].db, kl -= seg[s].dkl;
        out->curve[out->ncurve++] = (stz_tune_point){bytes + fixed, kl > 1e-12 * out->curve[0].kl ? kl : 0};
    }
    /* walk it again, choosing */
    bytes = out->curve[0].bytes - fixed, kl = out->curve[0].kl;
    int *blocked = calloc(T->nt + 1, sizeof *blocked);
    size_t *at = calloc(T->nt + 1, sizeof *at), *applied = malloc((nseg + 1) * sizeof *applied), napplied = 0;
    stz_status st =
        blocked && at && applied ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the solver's state");
    if (!st && kind == STZ_BUDGET_BYTES) {
        out->met = bytes + fixed <= value;
        for (size_t s = 0; out->met && s < nseg; s++) {
            const segment *g = &seg[s];
            if (blocked[g->t] || at[g->t] + 1 != g->step)
                continue;
            if ((double)(bytes + g->db + fixed) > value) {
                blocked[g->t] = 1; /* its later steps cost more per KL saved */
                continue;
            }
            bytes += g->db, kl -= g->dkl, at[g->t] = g->step, T->t[g->t].choice = g->to;
            applied[napplied++] = s;
        }
        /* the header grew with the choice: step back until the whole fits */
        while (out->met && napplied && (double)stz_tune_bytes(T) > value) {
            const segment *g = &seg[applied[--napplied]];
            T->t[g->t].choice = g->from, at[g->t] = g->step - 1;
        }
        /* a widened FFN is kilobytes that no tensor's steps see: what the
           steps back left, filled with the next steps that fit */
        for (size_t s = 0; out->met && T->gguf && s < nseg; s++) {
            const segment *g = &seg[s];
            if (at[g->t] + 1 != g->step)
                continue;
            T->t[g->t].choice = g->to;
            if ((double)stz_tune_bytes(T) > value)
                T->t[g->t].choice = g->from;
            else
                at[g->t] = g->step;
        }
    } else if (!st) {
        for (size_t s = 0; kl > value && s < nseg; s++)
            kl -= seg[s].dkl, T->t[seg[s].t].choice = seg[s].to;
        out->met = kl <= value * (1 + 1e-12);
    }
    free(blocked), free(at), free(applied), free(hull), free(nh), free(seg);
    if (!st)
        out->pred = (stz_tune_point){stz_tune_bytes(T), total_kl(T, kl_scale)};
    return st;
}
