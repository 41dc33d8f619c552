/* Reading a quantized file's __metadata__: each entry parsed and checked
 * against the tensors it names (docs/FORMAT.md, "Quantized SafeTensors"),
 * and its rows dequantized. */
#include "quant_meta.h"
#include "stz_kernels.h"
#include "ggml_types.h"
#include "stz_svd.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The levels of an nl entry: absent (the fixed codebook for its bits), or
 * 2^bits integers n in [-32767, 32767], non-decreasing, level n / 32767. */
static int parse_levels(const cJSON *lv, stz_qformat *f)
{
    int k = 1 << f->bits;
    if (!lv) {
        stz_qf_default_levels(f->bits, f->levels);
        return 0;
    }
    if (!cJSON_IsArray(lv) || cJSON_GetArraySize(lv) != k)
        return -1;
    int i = 0;
    for (const cJSON *e = lv->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || fabs(e->valuedouble) > 32767)
            return -1;
        f->levels[i] = (float)e->valuedouble / 32767.0f;
        if (i && f->levels[i] < f->levels[i - 1])
            return -1;
    }
    return 0;
}

/* t has the original shape of qi with the last dimension `last` (a 0-D
 * original is stored 1-D): the layout the writer gives values and scales,
 * so that transposed or flattened tensors are refused. */
static int same_layout(const stz_tensor *t, const qinfo *qi, uint64_t last)
{
    int nd = qi->ndim ? qi->ndim : 1;
    if (t->ndim != nd || t->shape[nd - 1] != last)
        return 0;
    for (int d = 0; d < nd - 1; d++) /* a transposed matrix: its rows are the original's columns */
        if (t->shape[d] != (qi->transposed ? qi->rows : qi->shape[d]))
            return 0;
    return 1;
}

/* The original dtypes of quantized tensors: those stz quantizes and
 * dequantizes back to (stz_from_f32). */
static int float_origin(stz_dtype d)
{
    return d == STZ_DTYPE_BF16 || d == STZ_DTYPE_F16 || d == STZ_DTYPE_F32 || d == STZ_DTYPE_F64;
}

/* Parses and checks __metadata__["stz.quant.NAME"] against the file. */
/* The original shape (whole numbers), and the rows, columns and blocks it
 * makes: of the transpose when "transposed" is true (a matrix only). */
static stz_status parse_shape(const stz_reader *r, const stz_tensor *t, const cJSON *o, qinfo *qi, stz_err *err)
{
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *tr = cJSON_GetObjectItemCaseSensitive(o, "transposed");
    qi->numel = 1;
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble != floor(d->valuedouble) ||
            d->valuedouble > 9007199254740992.0)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid original shape", stz_reader_path(r),
                               t->name);
        qi->shape[qi->ndim++] = (uint64_t)d->valuedouble;
        qi->numel *= (uint64_t)d->valuedouble;
    }
    if (tr && (!cJSON_IsTrue(tr) || qi->ndim != 2))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': 'transposed' must be true, and for a matrix only",
                           stz_reader_path(r), t->name);
    qi->transposed = tr != NULL;
    qi->cols = qi->ndim >= 2 ? qi->shape[qi->transposed ? 0 : qi->ndim - 1] : qi->numel;
    qi->rows = qi->cols ? qi->numel / qi->cols : 0;
    qi->nblocks = stz_q_blocks(qi->cols, qi->block);
    return STZ_OK;
}

/* The scales (and minimums) tensors the entry o names, which must have the
 * scale dtype and one value per block; or its single scale (and minimum). */
static stz_status find_companions(const stz_reader *r, const stz_tensor *t, const cJSON *o, qinfo *qi, stz_err *err)
{
    const char *P = stz_reader_path(r);
    const cJSON *names[2] = {cJSON_GetObjectItemCaseSensitive(o, "scales"),
                             cJSON_GetObjectItemCaseSensitive(o, "mins")};
    const stz_tensor **found[2] = {&qi->sc, &qi->mn};
    for (int k = 0; k < 2; k++) {
        if (!cJSON_IsString(names[k]))
            continue;
        long si = stz_reader_find(r, names[k]->valuestring);
        *found[k] = si >= 0 ? stz_reader_tensor(r, (size_t)si) : NULL;
        if (!*found[k] || (*found[k])->dtype != qi->scale_dtype || !same_layout(*found[k], qi, qi->nblocks))
            return stz_err_set(err, STZ_E_FORMAT,
                               "%s: tensor '%s': %s tensor '%s' is missing or has the wrong "
                               "dtype or size",
                               P, t->name, k ? "minimums" : "scales", names[k]->valuestring);
    }
    if (!qi->sc) {
        const cJSON *scv = cJSON_GetObjectItemCaseSensitive(o, "scale"),
                    *mnv = cJSON_GetObjectItemCaseSensitive(o, "min");
        if (qi->rows * qi->nblocks != 1)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': one scale for %llu blocks", P, t->name,
                               (unsigned long long)(qi->rows * qi->nblocks));
        qi->scalar = (float)scv->valuedouble;
        qi->scalar_min = cJSON_IsNumber(mnv) ? (float)mnv->valuedouble : 0;
    }
    return STZ_OK;
}

/* An entry of a ggml-type action: {"method": TYPE, "bits", "block_size",
 * "dtype", "shape", "packing": "ggml"}; the values tensor U8 with the
 * type's row bytes as the last dimension. */
static stz_status parse_ggml_info(const stz_reader *r, const stz_tensor *t, const cJSON *o, int type, qinfo *qi,
                                  stz_err *err)
{
    const char *P = stz_reader_path(r);
    static const char *const known[] = {"method", "bits",    "block_size", "dtype",
                                        "shape",  "packing", "transposed", NULL};
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *pk = cJSON_GetObjectItemCaseSensitive(o, "packing"),
                *bits = cJSON_GetObjectItemCaseSensitive(o, "bits"),
                *blk = cJSON_GetObjectItemCaseSensitive(o, "block_size");
    const char *unknown = stz_json_unknown_key(o, known);
    const stz_ggml_traits *g = stz_ggml_traits_of(type);
    if (unknown)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': %s%s has an unknown key '%s'", P, t->name,
                           STZ_QUANT_META_PREFIX, t->name, unknown);
    if (!cJSON_IsString(pk) || strcmp(pk->valuestring, STZ_QUANT_GGML_PACKING))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': unknown packing '%s' for %s (this stz reads '%s')",
                           P, t->name, cJSON_IsString(pk) ? pk->valuestring : "(none)", g->name,
                           STZ_QUANT_GGML_PACKING);
    if (!cJSON_IsString(dt) || stz_dtype_parse(dt->valuestring, &qi->dtype) || !float_origin(qi->dtype) ||
        !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > STZ_ST_MAX_NDIM || !cJSON_IsNumber(bits) ||
        bits->valuedouble != g->bits || !cJSON_IsNumber(blk) || blk->valuedouble != g->block)
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid %s%s entry (%s: bits %d, block_size %u)", P,
                           t->name, STZ_QUANT_META_PREFIX, t->name, g->name, g->bits, g->block);
    qi->fmt.ggml = g, qi->fmt.bits = qi->bits = g->bits, qi->fmt.block = qi->block = g->block;
    qi->method = g->name, qi->scale_dtype = STZ_DTYPE_F16;
    stz_status st = parse_shape(r, t, o, qi, err);
    if (st)
        return st;
    if (!qi->numel || (qi->cols % g->block && g->block != STZ_GGML_QK) || t->dtype != STZ_DTYPE_U8 ||
        !same_layout(t, qi, stz_ggml_row_bytes(type, qi->cols)))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': %s values do not match the recorded shape as %s blocks",
                           P, t->name, stz_dtype_name(t->dtype), g->name);
    return STZ_OK;
}

/* One stz.quant.NAME entry checked against docs/FORMAT.md and the values
 * tensor t. Longer than most: the checks run in a fixed order whose error
 * codes the corrupt-file corpus pins (tests/corpus/quant). */
static stz_status parse_qinfo(const stz_reader *r, const stz_tensor *t, const char *json, qinfo *qi, stz_err *err)
{
    const char *P = stz_reader_path(r);
    cJSON *o = cJSON_Parse(json);
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(o, "bits"),
                *blk = cJSON_GetObjectItemCaseSensitive(o, "block_size"),
                *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *scn = cJSON_GetObjectItemCaseSensitive(o, "scales"),
                *scv = cJSON_GetObjectItemCaseSensitive(o, "scale"),
                *sdt = cJSON_GetObjectItemCaseSensitive(o, "scale_dtype"),
                *base = cJSON_GetObjectItemCaseSensitive(o, "scale_base"),
                *mnn = cJSON_GetObjectItemCaseSensitive(o, "mins"), *mnv = cJSON_GetObjectItemCaseSensitive(o, "min"),
                *lv = cJSON_GetObjectItemCaseSensitive(o, "levels");
    static const char *const known[] = {"method", "bits",   "block_size",  "dtype",      "shape",
                                        "scales", "scale",  "scale_dtype", "scale_base", "mins",
                                        "min",    "levels", "packing",     "transposed", NULL};
    const cJSON *meth = cJSON_GetObjectItemCaseSensitive(o, "method"),
                *pk = cJSON_GetObjectItemCaseSensitive(o, "packing");
    const char *unknown = stz_json_unknown_key(o, known), *dup = stz_json_duplicate_key(o);
    stz_status st = STZ_OK;
    int m = -1;
    memset(qi, 0, sizeof *qi);
    qi->t = t;
    if (!cJSON_IsObject(o)) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': %s%s is not a JSON object", P, t->name,
                         STZ_QUANT_META_PREFIX, t->name);
        goto cleanup;
    }
    if (unknown || dup) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': %s%s has %s key '%s'", P, t->name,
                         STZ_QUANT_META_PREFIX, t->name, unknown ? "an unknown" : "a duplicate",
                         unknown ? unknown : dup);
        goto cleanup;
    }
    for (int j = 0; j < STZ_QMETHOD_COUNT && cJSON_IsString(meth); j++) /* nl-fit is stored as nl + levels */
        if (j != STZ_QMETHOD_NL_FIT && !strcmp(meth->valuestring, stz_qmethod_name((stz_qmethod)j)))
            m = j;
    stz_action a;
    int type;
    if (m < 0 && cJSON_IsString(meth) && !stz_action_parse(meth->valuestring, &a, &type) && a == STZ_ACTION_GGML) {
        st = parse_ggml_info(r, t, o, type, qi, err);
        goto cleanup;
    }
    if (m < 0) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': unknown quantization method '%s'", P, t->name,
                         cJSON_IsString(meth) ? meth->valuestring : "(none)");
        goto cleanup;
    }
    int nb = cJSON_IsNumber(bits) ? (int)bits->valuedouble : 0;
    const char *want_pk = nb == 4 ? STZ_QUANT_INT4_PACKING : nb == 8 ? NULL : STZ_QUANT_MSB_PACKING;
    if (want_pk ? !cJSON_IsString(pk) || strcmp(pk->valuestring, want_pk) : pk != NULL) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED,
                         "%s: tensor '%s': unknown packing '%s' (this stz reads '%s' for "
                         "4 bits, '%s' for 2, 3, 5 and 6, and none for 8)",
                         P, t->name, cJSON_IsString(pk) ? pk->valuestring : "(none)", STZ_QUANT_INT4_PACKING,
                         STZ_QUANT_MSB_PACKING);
        goto cleanup;
    }
    qi->fmt.method = (stz_qmethod)m;
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(bits) || bits->valuedouble != nb || nb < 2 || nb > 8 || nb == 7 ||
        ((m == STZ_QMETHOD_NL) && nb > 6) || (m == STZ_QMETHOD_TRELLIS && nb > 4) || !cJSON_IsNumber(blk) ||
        blk->valuedouble < 1 || blk->valuedouble > (1 << 20) || !cJSON_IsString(dt) ||
        stz_dtype_parse(dt->valuestring, &qi->dtype) || !float_origin(qi->dtype) || !cJSON_IsArray(sh) ||
        cJSON_GetArraySize(sh) > STZ_ST_MAX_NDIM || !(cJSON_IsString(scn) || cJSON_IsNumber(scv)) ||
        !cJSON_IsString(sdt) || stz_dtype_parse(sdt->valuestring, &qi->scale_dtype) ||
        (qi->scale_dtype != STZ_DTYPE_F16 && qi->scale_dtype != STZ_DTYPE_F32 && qi->scale_dtype != STZ_DTYPE_U8) ||
        (qi->scale_dtype == STZ_DTYPE_U8) != cJSON_IsNumber(base) ||
        (cJSON_IsNumber(base) && !(base->valuedouble > 0 && base->valuedouble <= FLT_MAX)) || /* a float tensor's max */
        (scn && scv) || (mnn && mnv) || /* one place for the scales: a tensor, or one number */
        (m == STZ_QMETHOD_ASYM) != (cJSON_IsString(mnn) || cJSON_IsNumber(mnv)) ||
        (m == STZ_QMETHOD_ASYM && (qi->scale_dtype == STZ_DTYPE_U8 || cJSON_IsString(scn) != cJSON_IsString(mnn))) ||
        (lv && m != STZ_QMETHOD_NL)) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid %s%s entry", P, t->name, STZ_QUANT_META_PREFIX,
                         t->name);
        goto cleanup;
    }
    qi->bits = nb;
    qi->block = (uint32_t)blk->valuedouble;
    qi->method = stz_qmethod_name((stz_qmethod)m);
    qi->fmt.bits = nb, qi->fmt.block = qi->block, qi->fmt.scale_dtype = qi->scale_dtype;
    qi->fmt.scale_base = base ? (float)base->valuedouble : 0;
    if (m == STZ_QMETHOD_NL && parse_levels(lv, &qi->fmt)) {
        st = stz_err_set(err, STZ_E_FORMAT,
                         "%s: tensor '%s': 'levels' must be %d whole numbers in [-32767, 32767] "
                         "in increasing order",
                         P, t->name, 1 << nb);
        goto cleanup;
    }
    if ((st = parse_shape(r, t, o, qi, err)))
        goto cleanup;
    /* the values tensor must be what the metadata says it is, shape included:
     * the original's with the last dimension in bytes (the writer's layout) */
    if (t->dtype != stz_quant_values_dtype(nb, (stz_qmethod)m) || !qi->numel ||
        !same_layout(t, qi, stz_qf_row_bytes(nb, qi->cols))) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': %s values do not match the recorded shape", P, t->name,
                         stz_dtype_name(t->dtype));
        goto cleanup;
    }
    if ((st = find_companions(r, t, o, qi, err)))
        goto cleanup;
    if (m == STZ_QMETHOD_NL)
        stz_qf_prepare(&qi->fmt);
cleanup:
    cJSON_Delete(o);
    return st;
}

/* Dequantizes rows [row, row + nr) into f. `raw` holds nr * row bytes and
 * `sbytes` the scales' bytes; `sc` receives nr * nblocks floats. */
void stz_qi_free(qinfo *qi)
{
    free(qi->vh);
    free(qi->sv);
}

/* S and Vh of an svd entry, dequantized once. */
static stz_status svd_load(const stz_reader *r, qinfo *qi, stz_err *err)
{
    size_t k = (size_t)qi->rank, n = (size_t)qi->cols;
    int8_t *q = malloc(k * n + k);
    float *vs = malloc(k * sizeof *vs);
    uint8_t *b = malloc(k * 4 + 1);
    qi->vh = malloc(k * n * sizeof *qi->vh), qi->sv = malloc(k * sizeof *qi->sv);
    stz_status st =
        q && vs && b && qi->vh && qi->sv ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the SVD factors");
    if (!st && !(st = stz_reader_read(r, qi->Vh, 0, q, k * n, err)) &&
        !(st = stz_reader_read(r, qi->Vs, 0, b, k * 4, err)) && !(st = stz_to_f32(STZ_DTYPE_F32, b, k, vs, err)) &&
        !(st = stz_reader_read(r, qi->S, 0, q + k * n, k, err))) {
        for (size_t i = 0; i < k; i++)
            stz_q8_dequantize_ref(q + i * n, vs + i, n, n, qi->vh + i * n);
        stz_q8_dequantize_ref(q + k * n, &qi->s_scale, k, k, qi->sv);
    }
    free(q), free(vs), free(b);
    if (st)
        stz_qi_free(qi), qi->vh = qi->sv = NULL;
    return st;
}

/* Rows [row, row + nr) of a trellis entry (their scales in sc): the codes
 * of their segments read, then decoded. */
static stz_status trellis_rows(const stz_reader *r, const qinfo *qi, uint64_t row, size_t nr, const float *sc, float *f,
                               stz_err *err)
{
    uint64_t a, b, a2, b2;
    if (!nr)
        return STZ_OK;
    stz_trellis_segment(qi->rows, row, &a, &b);
    stz_trellis_segment(qi->rows, row + nr - 1, &a2, &b2);
    size_t rb = stz_qf_row_bytes(qi->bits, (size_t)qi->cols);
    uint8_t *codes = malloc((size_t)(b2 - a) * rb + 1);
    stz_status st = codes ? stz_reader_read(r, qi->t, a * rb, codes, (size_t)(b2 - a) * rb, err)
                          : stz_err_set(err, STZ_E_NOMEM, "out of memory for the codes of '%s'", qi->name);
    if (!st && stz_trellis_dequantize_rows(&qi->fmt, codes, a, qi->rows, row, nr, sc, (size_t)qi->cols, f))
        st =
            stz_err_set(err, STZ_E_NOMEM, "%s: tensor '%s': out of memory decoding rows", stz_reader_path(r), qi->name);
    free(codes);
    return st;
}

stz_status stz_qi_rows(const stz_reader *r, qinfo *qi, uint64_t row, size_t nr, uint8_t *raw, uint8_t *sbytes,
                       float *sc, float *f, stz_err *err)
{
    if (qi->svd) {
        /* W rows (nr, n) = U rows (nr, k) @ diag(S) @ Vh (k, n) */
        size_t k = (size_t)qi->rank;
        stz_status st = qi->vh ? STZ_OK : svd_load(r, qi, err);
        if (st || (st = stz_reader_read(r, qi->t, row * k, raw, nr * k, err)) ||
            (st = stz_reader_read(r, qi->Us, row * 4, sbytes, nr * 4, err)))
            return st;
        float *us = sc + nr * k; /* row scales after the U values */
        if ((st = stz_to_f32(STZ_DTYPE_F32, sbytes, nr, us, err)))
            return st;
        for (size_t i = 0; i < nr; i++)
            stz_q8_dequantize_ref((const int8_t *)raw + i * k, us + i, k, k, sc + i * k);
        if (stz_svd_reconstruct(sc, qi->sv, qi->vh, nr, (size_t)qi->cols, k, f))
            return stz_err_set(err, STZ_E_NOMEM, "%s: tensor '%s': out of memory rebuilding rows", stz_reader_path(r),
                               qi->name);
        return STZ_OK;
    }
    size_t rb = stz_qf_bytes(&qi->fmt, qi->cols), ssz = stz_dtype_bits(qi->scale_dtype) / 8;
    size_t nsc = nr * (size_t)qi->nblocks;
    if (qi->fmt.ggml) { /* scales inside the blocks */
        stz_status st = stz_reader_read(r, qi->t, row * rb, raw, nr * rb, err);
        for (size_t k = 0; !st && k < nr; k++)
            stz_qf_dequantize_row(&qi->fmt, raw + k * rb, NULL, NULL, (size_t)qi->cols, f + k * qi->cols);
        return st;
    }
    float *mn = sc + nsc; /* asym: the minimums after the scales */
    int tr = qi->fmt.method == STZ_QMETHOD_TRELLIS;
    stz_status st = tr ? STZ_OK : stz_reader_read(r, qi->t, row * rb, raw, nr * rb, err);
    if (st)
        return st;
    const stz_tensor *src[2] = {qi->sc, qi->mn};
    float *dst[2] = {sc, mn};
    for (int k = 0; k < (qi->mn ? 2 : 1) && qi->sc; k++) {
        if ((st = stz_reader_read(r, src[k], row * qi->nblocks * ssz, sbytes, nsc * ssz, err)))
            return st;
        if (qi->scale_dtype == STZ_DTYPE_U8)
            for (size_t i = 0; i < nsc; i++)
                dst[k][i] = stz_qf_scale_value(qi->fmt.scale_base, sbytes[i]);
        else if ((st = stz_to_f32(qi->scale_dtype, sbytes, nsc, dst[k], err)))
            return st;
    }
    if (!qi->sc)
        sc[0] = qi->scalar, mn[0] = qi->scalar_min;
    if (tr)
        return trellis_rows(r, qi, row, nr, sc, f, err);
    for (size_t k = 0; k < nr; k++)
        stz_qf_dequantize_row(&qi->fmt, raw + k * rb, sc + k * qi->nblocks, mn + k * qi->nblocks, (size_t)qi->cols,
                              f + k * qi->cols);
    return STZ_OK;
}

/* Reads an svd entry; qi->t is its U tensor. */
static stz_status parse_svd_info(const stz_reader *r, const char *name, const cJSON *o, qinfo *qi, stz_err *err)
{
    const char *P = stz_reader_path(r);
    static const char *const keys[5] = {"U", "U_scales", "S", "Vh", "Vh_scales"};
    const stz_tensor *f[5];
    const cJSON *rk = cJSON_GetObjectItemCaseSensitive(o, "rank"), *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"),
                *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *ss = cJSON_GetObjectItemCaseSensitive(o, "S_scale");
    static const char *const known[] = {"method", "svd_method", "power_iters", "oversample", "bits", "rank",
                                        "dtype",  "shape",      "U",           "U_scales",   "S",    "S_scale",
                                        "Vh",     "Vh_scales",  "scale_dtype", "rel_error",  NULL};
    const char *unknown = stz_json_unknown_key(o, known), *dup = stz_json_duplicate_key(o);
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(o, "bits"),
                *sdt = cJSON_GetObjectItemCaseSensitive(o, "scale_dtype");
    memset(qi, 0, sizeof *qi);
    qi->name = name, qi->svd = 1, qi->bits = 8, qi->method = "svd";
    if (unknown || dup)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': svd entry has %s key '%s'", P, name,
                           unknown ? "an unknown" : "a duplicate", unknown ? unknown : dup);
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(o, "svd_method");
    if (sm && !(cJSON_IsString(sm) && (!strcmp(sm->valuestring, "exact") || !strcmp(sm->valuestring, "randomized"))))
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: tensor '%s': unknown svd_method (this stz writes \"exact\" and "
                           "\"randomized\")",
                           P, name);
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 8 || !cJSON_IsString(sdt) || strcmp(sdt->valuestring, "F32"))
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: tensor '%s': svd factors with 'bits' other than 8 or "
                           "'scale_dtype' other than F32 (this stz reads INT8 factors with F32 scales)",
                           P, name);
    for (int j = 0; j < 5; j++) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, keys[j]);
        long ti = cJSON_IsString(k) ? stz_reader_find(r, k->valuestring) : -1;
        f[j] = ti >= 0 ? stz_reader_tensor(r, (size_t)ti) : NULL;
        if (!f[j])
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': svd factor '%s' is missing", P, name, keys[j]);
    }
    if (!cJSON_IsNumber(rk) || rk->valuedouble < 1 || !cJSON_IsString(dt) ||
        stz_dtype_parse(dt->valuestring, &qi->dtype) || !float_origin(qi->dtype) || !cJSON_IsArray(sh) ||
        cJSON_GetArraySize(sh) < 2 || cJSON_GetArraySize(sh) > STZ_ST_MAX_NDIM || !cJSON_IsNumber(ss))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid svd entry", P, name);
    qi->numel = 1;
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 1 || d->valuedouble != floor(d->valuedouble) ||
            d->valuedouble > 1e15)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid original shape", P, name);
        qi->shape[qi->ndim++] = (uint64_t)d->valuedouble;
        qi->numel *= (uint64_t)d->valuedouble;
    }
    qi->rank = (uint64_t)rk->valuedouble;
    qi->cols = qi->shape[qi->ndim - 1];
    qi->rows = qi->numel / qi->cols;
    qi->s_scale = (float)ss->valuedouble;
    qi->t = f[0], qi->Us = f[1], qi->S = f[2], qi->Vh = f[3], qi->Vs = f[4];
    uint64_t m = qi->rows, n = qi->cols, k = qi->rank;
    /* U (m, k), U_scales (m,), S (k,), Vh (k, n), Vh_scales (k,): shapes, not only element counts */
    const uint64_t shp[5][2] = {{m, k}, {m, 0}, {k, 0}, {k, n}, {k, 0}};
    const stz_dtype dts[5] = {STZ_DTYPE_I8, STZ_DTYPE_F32, STZ_DTYPE_I8, STZ_DTYPE_I8, STZ_DTYPE_F32};
    int bad = k >= (m < n ? m : n);
    for (int j = 0; j < 5; j++)
        bad |= f[j]->dtype != dts[j] || f[j]->ndim != (shp[j][1] ? 2 : 1) || f[j]->shape[0] != shp[j][0] ||
               (shp[j][1] && f[j]->shape[1] != shp[j][1]);
    if (bad)
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': svd factors do not match rank %llu of %llu x %llu", P,
                           name, (unsigned long long)k, (unsigned long long)m, (unsigned long long)n);
    return STZ_OK;
}

/* Quantization entries, from the "stz.quant.NAME" metadata: qi[i] is set at
 * the reader index of the entry's values tensor (svd: its U); skip[i] marks
 * the other tensors an entry owns (scales, svd factors). */
stz_status stz_qi_scan(const stz_reader *r, qinfo *qi, char *skip, size_t *maxcols, stz_err *err)
{
    const char *P = stz_reader_path(r);
    size_t plen = strlen(STZ_QUANT_META_PREFIX);
    const stz_tensor *base = stz_reader_tensor(r, 0);
    const char *version = stz_reader_meta_get(r, "stz.quant.version");
    *maxcols = 0;
    if (version && strcmp(version, STZ_QUANT_VERSION))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: quantized with format version '%s' (this stz reads version %s)",
                           P, version, STZ_QUANT_VERSION);
    for (size_t k = 0; k < stz_reader_meta_count(r); k++) {
        const char *key = stz_reader_meta_key(r, k);
        if (strncmp(key, STZ_QUANT_META_PREFIX, plen) || !strcmp(key, "stz.quant.version"))
            continue;
        if (!version)
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: metadata '%s' without 'stz.quant.version': not a file "
                               "this stz wrote, refusing to guess its layout",
                               P, key);
        const char *name = key + plen;
        cJSON *o = cJSON_Parse(stz_reader_meta_value(r, k));
        const cJSON *meth = cJSON_GetObjectItemCaseSensitive(o, "method");
        int is_svd = cJSON_IsString(meth) && !strcmp(meth->valuestring, "svd");
        qinfo tmp;
        stz_status st;
        if (is_svd) {
            st = stz_reader_find(r, name) >= 0
                     ? stz_err_set(err, STZ_E_FORMAT, "%s: SVD entry '%s' has the name of a stored tensor", P, name)
                     : parse_svd_info(r, name, o, &tmp, err);
        } else {
            long ti = stz_reader_find(r, name);
            st = ti < 0
                     ? stz_err_set(err, STZ_E_FORMAT, "%s: metadata describes tensor '%s', which is missing", P, name)
                     : parse_qinfo(r, stz_reader_tensor(r, (size_t)ti), stz_reader_meta_value(r, k), &tmp, err);
            tmp.name = name;
        }
        cJSON_Delete(o);
        if (st)
            return st;
        size_t at = (size_t)(tmp.t - base);
        if (qi[at].bits)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' is described twice", P, tmp.t->name);
        qi[at] = tmp;
        const stz_tensor *owned[6] = {tmp.sc, tmp.Us, tmp.S, tmp.Vh, tmp.Vs, tmp.mn};
        for (int j = 0; j < 6; j++) {
            if (owned[j] && skip[owned[j] - base])
                return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' belongs to two quantized entries", P,
                                   owned[j]->name);
            if (owned[j])
                skip[owned[j] - base] = 1;
        }
        *maxcols = tmp.cols > *maxcols ? tmp.cols : *maxcols;
    }
    for (size_t i = 0; i < stz_reader_count(r); i++)
        if (skip[i] && qi[i].bits)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' belongs to two quantized entries", P,
                               stz_reader_tensor(r, i)->name);
    return STZ_OK;
}
