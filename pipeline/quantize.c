/* Quantize whole SafeTensors files, streaming row batches into a file or
 * straight into a container (SVD decisions are in svd_factors.c; the
 * readers of the result: dequantize.c, model/qmodel.c).
 *
 * Per quantized tensor NAME the output holds:
 *   NAME          I8 of the original shape (INT8), or U8 with the last
 *                 dimension ceil(n/2) (INT4, two values per byte, first high)
 *   NAME.scales   F16/F32 of the original shape with the last dimension
 *                 replaced by the block count (omitted for a single block)
 * and __metadata__["stz.quant.NAME"] = JSON {"method", "bits", "block_size",
 * "dtype", "shape", "scales" | "scale", "scale_dtype", "packing"}.
 * docs/FORMAT.md, "Quantized SafeTensors", is the reference. */
#include "pack/pack_sink.h"
#include "stz_kernels.h"
#include "quant/ggml_types.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "stz_eval.h"
#include "stz_imatrix.h"
#include "stz_feedback.h"
#include "stz_svd.h"
#include "plan.h"
#include "model/arch.h"
#include "model/roles.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void row_shape(const stz_tensor *t, uint64_t *rows, uint64_t *cols)
{
    *cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    *rows = *cols ? t->numel / *cols : 0;
}

/* A file stz already quantized holds INT8/INT4 codes and scales tensors:
 * quantizing those again would give a file that no longer reads back. */
static stz_status refuse_quantized(const stz_reader *r, stz_err *err)
{
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        if (!strncmp(stz_reader_meta_key(r, i), STZ_QUANT_META_PREFIX, strlen(STZ_QUANT_META_PREFIX)))
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: already quantized by stz (metadata '%s'); quantizing it again would quantize "
                               "its codes and scales. Quantize the original model, or dequantize this one first "
                               "(stz dequantize)",
                               stz_reader_path(r), stz_reader_meta_key(r, i));
    return STZ_OK;
}

static int quant_row(const stz_quant_plan *pl, const float *x, uint8_t *q, float *scales, float *mins)
{
    return stz_qf_quantize_any(&pl->fmt, x, pl->cols, q, scales, mins);
}

/* An entry's common keys: method, bits, block_size, the original dtype and shape. */
static cJSON *meta_head(const stz_tensor *t, const stz_quant_plan *pl, const char *method, uint32_t block)
{
    int bits = pl->bits;
    cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "method", method);
    cJSON_AddNumberToObject(o, "bits", bits);
    cJSON_AddNumberToObject(o, "block_size", block);
    cJSON_AddStringToObject(o, "dtype", stz_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
        stz_json_put(sh, NULL, cJSON_CreateNumber((double)t->shape[d]));
    stz_json_put(o, "shape", sh);
    if (pl->transposed)
        cJSON_AddTrueToObject(o, "transposed");
    return o;
}

static stz_status meta_for(stz_writer *w, const stz_tensor *t, const stz_quant_plan *pl, stz_err *err)
{
    stz_json_begin();
    if (pl->fmt.ggml) { /* a llama.cpp type: its blocks hold the scales (FORMAT.md) */
        cJSON *o = meta_head(t, pl, stz_action_name(pl->d.action, pl->d.ggml_type), pl->fmt.block);
        cJSON_AddStringToObject(o, "packing", STZ_QUANT_GGML_PACKING);
        return stz_quant_put_meta(w, t, o, "quantization", err);
    }
    cJSON *o =
        meta_head(t, pl, pl->d.method == STZ_QMETHOD_NL_FIT ? "nl" : stz_qmethod_name(pl->d.method), pl->d.block_size);
    if (pl->scales_name)
        cJSON_AddStringToObject(o, "scales", pl->scales_name);
    else
        cJSON_AddNumberToObject(o, "scale", pl->scalar);
    cJSON_AddStringToObject(o, "scale_dtype", stz_dtype_name(pl->d.scale_dtype));
    if (pl->d.scale_dtype == STZ_DTYPE_U8)
        cJSON_AddNumberToObject(o, "scale_base", pl->fmt.scale_base);
    if (pl->d.method == STZ_QMETHOD_ASYM) {
        if (pl->mins_name)
            cJSON_AddStringToObject(o, "mins", pl->mins_name);
        else
            cJSON_AddNumberToObject(o, "min", pl->scalar_min);
    }
    if (pl->d.method == STZ_QMETHOD_NL_FIT) {
        cJSON *lv = cJSON_CreateArray();
        for (int k = 0; k < 1 << pl->bits; k++)
            stz_json_put(lv, NULL, cJSON_CreateNumber(lrintf(pl->fmt.levels[k] * 32767.0f)));
        stz_json_put(o, "levels", lv);
    }
    if (pl->bits == 4)
        cJSON_AddStringToObject(o, "packing", STZ_QUANT_INT4_PACKING);
    else if (pl->bits != 8)
        cJSON_AddStringToObject(o, "packing", STZ_QUANT_MSB_PACKING);
    return stz_quant_put_meta(w, t, o, "quantization", err);
}

/* One tensor quantized by the ordered pipeline: batches of rows are read,
 * quantized and measured in parallel, written and their metrics merged in
 * order, so the output and the figures do not depend on the thread count. */
typedef struct {
    stz_ordered pl;
    stz_writer *w;
    const stz_reader *r;
    const stz_tensor *t;
    const stz_quant_plan *x;
    qslot *slot;
    float *sc;    /* rows x nblocks scales */
    float *mn;    /* asym: rows x nblocks minimums */
    uint64_t per; /* rows per batch */
    stz_metrics_acc acc;
} qjob;

/* Element `at` of tensor t is v, NaN or infinite: the error. */
static stz_status nonfinite(const stz_reader *r, const stz_tensor *t, uint64_t at, float v, stz_err *err)
{
    return stz_err_set(err, STZ_E_NUMERIC,
                       "%s: tensor '%s': element %llu is %s; quantization needs finite values "
                       "(or \"nonfinite\": \"keep\" in the policy rule)",
                       stz_reader_path(r), t->name, (unsigned long long)at, isnan(v) ? "NaN" : "infinite");
}

static stz_status q_work(void *ctx, int tid, size_t i, stz_err *err)
{
    qjob *j = ctx;
    qslot *s = &j->slot[tid];
    const stz_quant_plan *pl = j->x;
    const stz_tensor *t = j->t;
    size_t rb = stz_qf_bytes(&pl->fmt, pl->cols);
    uint64_t row = i * j->per;
    size_t nr = pl->rows - row < j->per ? (size_t)(pl->rows - row) : (size_t)j->per, n = nr * (size_t)pl->cols;
    stz_status st;
    s->rows = nr;
    memset(&s->acc, 0, sizeof s->acc);
    if ((st = stz_quant_plan_rows(j->r, t, pl, row, nr, s->in, s->f, err)))
        return st;
    size_t bad = stz_quant_first_nonfinite(s->f, n);
    if (bad < n)
        return nonfinite(j->r, t, row * pl->cols + bad, s->f[bad], err);
    for (size_t k = 0; k < nr; k++) {
        const float *x = s->f + k * pl->cols;
        float *s_row = j->sc + (row + k) * pl->nblocks, *m_row = j->mn ? j->mn + (row + k) * pl->nblocks : NULL;
        if (quant_row(pl, x, s->q + k * rb, s_row, m_row))
            return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s': row %llu: a block scale exceeds the F16 range; %s",
                               stz_reader_path(j->r), t->name, (unsigned long long)(row + k),
                               pl->fmt.ggml ? "quantize it to a type without F16 scales (int8, bf16)"
                                            : "use \"scale_dtype\": \"F32\"");
        /* the quality as the reader will see it: stored scales, dequantized */
        stz_qf_dequantize_row(&pl->fmt, s->q + k * rb, s_row, m_row, pl->cols, s->y);
        stz_metrics_add(&s->acc, x, s->y, pl->cols); /* scales are exact in their stored dtype */
    }
    return STZ_OK;
}

static stz_status q_commit(void *ctx, int tid, size_t i, stz_err *err)
{
    qjob *j = ctx;
    qslot *s = &j->slot[tid];
    (void)i;
    stz_metrics_merge(&j->acc, &s->acc);
    return stz_writer_write(j->w, s->q, s->rows * stz_qf_bytes(&j->x->fmt, j->x->cols), err);
}

/* Writes n per-block floats as the scale dtype (U8: log codes under the base). */
static stz_status write_blockwise(stz_writer *w, const stz_quant_plan *pl, const float *v, size_t n, uint8_t *buf,
                                  stz_err *err)
{
    stz_dtype dt = pl->d.scale_dtype;
    size_t sz = stz_dtype_bits(dt) / 8;
    stz_status st = STZ_OK;
    for (size_t i = 0; !st && i < n; i += STZ_QUANT_BATCH_BYTES / 4) {
        size_t k = n - i < STZ_QUANT_BATCH_BYTES / 4 ? n - i : STZ_QUANT_BATCH_BYTES / 4;
        stz_qf_store_scales(&pl->fmt, v + i, k, buf);
        st = stz_writer_write(w, buf, k * sz, err);
    }
    return st;
}

/* A tensor error feedback quantized (stz_feedback_take): its values,
 * scales and minimums as it holds them; *taken = 0 when it does not. */
static stz_status write_fed(stz_writer *w, const stz_tensor *t, stz_quant_plan *pl, stz_feedback *fb, int *taken,
                            stz_err *err)
{
    stz_qmem q;
    stz_status st = stz_feedback_take(fb, t->name, &pl->d, &q, taken, err);
    if (st || !*taken)
        return st;
    if ((pl->d.scale_dtype == STZ_DTYPE_U8 && q.fmt.scale_base != pl->fmt.scale_base) ||
        (pl->d.method == STZ_QMETHOD_NL_FIT && memcmp(q.fmt.levels, pl->fmt.levels, sizeof q.fmt.levels)))
        st = stz_err_set(err, STZ_E_ARG,
                         "tensor '%s': quantized with feedback from other values than the file's "
                         "(another model?)",
                         t->name);
    for (int k = STZ_PART_VALUES; !st && k <= STZ_PART_MINS; k++)
        if (q.part[k])
            st = stz_writer_write(w, q.part[k], q.len[k], err);
    pl->cosine = q.cosine;
    stz_qmem_free(&q);
    return st;
}

/* A trellis's rows [a, b), whole segments, read (in, x), quantized into q
 * and the scales sc (the tensor's), and measured as read back (a segment
 * at a time in y) into acc. */
static stz_status trellis_batch(const stz_reader *r, const stz_tensor *t, const stz_quant_plan *pl, uint64_t a,
                                uint64_t b, int threads, uint8_t *in, float *x, float *y, uint8_t *q, float *sc,
                                stz_metrics_acc *acc, stz_err *err)
{
    size_t nr = (size_t)(b - a), cols = (size_t)pl->cols, n = nr * cols;
    float *s = sc + a * pl->nblocks;
    stz_err sub;
    stz_status st;
    if ((st = stz_quant_plan_rows(r, t, pl, a, nr, in, x, err)))
        return st;
    size_t bad = stz_quant_first_nonfinite(x, n);
    if (bad < n)
        return nonfinite(r, t, a * cols + bad, x[bad], err);
    if ((st = stz_trellis_rows(&pl->fmt, x, nr, cols, (size_t)a, threads, q, s, &sub)))
        return stz_err_set(err, st, "%s: tensor '%s': %s", stz_reader_path(r), t->name, sub.msg);
    for (uint64_t u = 0, v, skip; u < nr; u = v) { /* a segment at a time, into y */
        stz_trellis_segment(nr, u, &skip, &v);
        if (stz_trellis_dequantize_rows(&pl->fmt, q, 0, nr, u, (size_t)(v - u), s + u * pl->nblocks, cols, y))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the rows of '%s'", t->name);
        stz_metrics_add(acc, x + u * cols, y, (size_t)(v - u) * cols);
    }
    return STZ_OK;
}

/* A trellis without feedback, streamed: batches of whole segments (each
 * value depends on its segment's rows; at least one per thread) read,
 * quantized and written in turn, then the scales, held for the tensor as
 * write_quantized holds them. */
static stz_status write_trellis(stz_writer *w, const stz_reader *r, const stz_tensor *t, stz_quant_plan *pl,
                                qslot *slot, int threads, stz_err *err)
{
    size_t cols = (size_t)pl->cols, esz = stz_dtype_bits(t->dtype) / 8, rb = stz_qf_bytes(&pl->fmt, cols);
    size_t segs = stz_trellis_segments(pl->rows), per = STZ_QUANT_BATCH_BYTES / esz / cols / STZ_TRELLIS_ROWS;
    per = per > (size_t)threads ? per : (size_t)threads;
    size_t most = (per + 1) * STZ_TRELLIS_ROWS, nsc = (size_t)(pl->rows * pl->nblocks); /* the last segment is longer */
    most = most < pl->rows ? most : (size_t)pl->rows;
    uint8_t *in = malloc(most * cols * esz + 1), *q = malloc(most * rb + 1);
    float *x = malloc(most * cols * sizeof *x + 1), *y = malloc(2 * STZ_TRELLIS_ROWS * cols * sizeof *y + 1),
          *sc = malloc(nsc * sizeof *sc + 1);
    stz_metrics_acc acc = {0};
    stz_status st =
        in && q && x && y && sc ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the rows of '%s'", t->name);
    for (size_t s0 = 0; !st && s0 < segs; s0 += per) {
        uint64_t a, b, skip;
        stz_trellis_segment(pl->rows, s0 * STZ_TRELLIS_ROWS, &a, &skip);
        stz_trellis_segment(pl->rows, ((s0 + per < segs ? s0 + per : segs) - 1) * STZ_TRELLIS_ROWS, &skip, &b);
        if (!(st = trellis_batch(r, t, pl, a, b, threads, in, x, y, q, sc, &acc, err)))
            st = stz_writer_write(w, q, (size_t)(b - a) * rb, err);
    }
    if (!st && pl->scales_name)
        st = write_blockwise(w, pl, sc, nsc, slot[0].in, err);
    pl->cosine = stz_metrics_finish(&acc).cosine;
    free(in), free(q), free(x), free(y), free(sc);
    return st;
}

/* Streams one quantized tensor: values row batch by row batch on
 * `threads` threads, then its scales (and minimums), held for the tensor:
 * rows x blocks floats. */
static stz_status write_quantized(stz_writer *w, const stz_reader *r, const stz_tensor *t, stz_quant_plan *pl,
                                  qslot *slot, int threads, stz_err *err)
{
    size_t esz = stz_dtype_bits(t->dtype) / 8;
    /* batches of at most STZ_QUANT_BATCH_BYTES, and a tensor in at least 16
     * when batches stay over 64 KB, so that threads share even the small
     * matrices (the same for any thread count: the figures merge alike) */
    uint64_t per = STZ_QUANT_BATCH_BYTES / esz / pl->cols, split = (pl->rows + 15) / 16,
             least = (64u << 10) / esz / pl->cols;
    split = split > least ? split : least;
    per = split < per ? split : per;
    if (per == 0)
        per = 1; /* one row larger than a batch: the caller sized buffers for it */
    size_t nsc = (size_t)(pl->rows * pl->nblocks);
    int asym = pl->d.method == STZ_QMETHOD_ASYM;
    qjob j = {.w = w,
              .r = r,
              .t = t,
              .x = pl,
              .slot = slot,
              .per = per,
              .sc = malloc(nsc * sizeof(float) + 1),
              .mn = asym ? malloc(nsc * sizeof(float) + 1) : NULL};
    if (!j.sc || (asym && !j.mn)) {
        free(j.sc), free(j.mn);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu scales of '%s'", nsc, t->name);
    }
    j.pl = (stz_ordered){
        .n = (size_t)((pl->rows + per - 1) / per), .threads = threads, .ctx = &j, .work = q_work, .commit = q_commit};
    stz_status st = stz_ordered_run(&j.pl, err);
    if (!st && pl->scales_name)
        st = write_blockwise(w, pl, j.sc, nsc, slot[0].in, err);
    if (!st && pl->mins_name)
        st = write_blockwise(w, pl, j.mn, nsc, slot[0].in, err);
    pl->cosine = stz_metrics_finish(&j.acc).cosine;
    free(j.sc), free(j.mn);
    return st;
}

stz_status stz_quant_copy_tensor(stz_writer *w, const stz_reader *r, const stz_tensor *t, uint8_t *buf, stz_err *err)
{
    int taken;
    stz_status st = stz_writer_refer(w, r, t, &taken, err); /* the container encoder reads it itself */
    for (uint64_t off = 0; !st && !taken && off < t->end - t->begin; off += STZ_QUANT_BATCH_BYTES) {
        size_t n =
            t->end - t->begin - off < STZ_QUANT_BATCH_BYTES ? (size_t)(t->end - t->begin - off) : STZ_QUANT_BATCH_BYTES;
        if (!(st = stz_reader_read(r, t, off, buf, n, err)))
            st = stz_writer_write(w, buf, n, err);
    }
    return st;
}

/* ---- a whole file: plan, declare the outputs, stream, collect ----------- */

/* One run of stz_quantize_file / stz_compress_file. */
typedef struct {
    const char *in, *out;
    stz_reader *r;
    size_t nt;
    stz_quant_plan *pl; /* per tensor of r */
    size_t maxrow;      /* the longest row quantized */
    qslot *slot;        /* per thread: buffers and figures */
    int nslots;
    stz_writer *w;
    stz_pack_sink *sink; /* compress: the container the writer's bytes go to */
} qfile;

/* The family of the file's model when it stores matrices (in, out)
 * (GPT-2's Conv1D; its configuration found as the forward pass finds it),
 * else NULL: a model of another family, or without a configuration. */
static const stz_arch *conv1d_family(const qfile *j, const char *config)
{
    stz_qmodel *q = NULL;
    stz_fwd_config c;
    char from[STZ_FWD_FROM_MAX];
    stz_err ignored;
    int found = !stz_qmodel_open_reader(&q, j->r, &ignored) &&
                stz_fwd_config_find(j->in, &(stz_model_set){&q, 1}, config, &c, from, NULL, &ignored) > 0;
    stz_qmodel_free(q);
    return found && stz_arch_of(&c)->flags & STZ_ARCH_CONV1D ? stz_arch_of(&c) : NULL;
}

/* Whether tensor t (2-D) is one of family a's matrices stored (in, out). */
static int stored_in_out(const stz_arch *a, const stz_tensor *t)
{
    unsigned layer;
    return a && t->ndim == 2 && stz_arch_conv1d(a, stz_role_find(t->name, a->layout, a, &layer));
}

/* The policy's decision and the row shape of every tensor. */
static stz_status plan_tensors(qfile *j, stz_policy *policy, const stz_quant_params *p, stz_err *err)
{
    const stz_imatrix *im = p->imatrix;
    const stz_arch *conv = conv1d_family(j, p->config);
    if (!(j->pl = calloc(j->nt + 1, sizeof *j->pl)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the plan of every tensor");
    for (size_t i = 0; i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        stz_quant_plan *x = &j->pl[i];
        x->d = stz_policy_decide(policy, t);
        if (x->d.action == STZ_ACTION_KEEP)
            continue;
        x->svd = x->d.action == STZ_ACTION_SVD;
        stz_quant_plan_format(x);
        row_shape(t, &x->rows, &x->cols);
        if ((x->transposed = !x->svd && stored_in_out(conv, t))) /* quantized along its input */
            x->rows = t->shape[1], x->cols = t->shape[0];
        x->nblocks = stz_q_blocks(x->cols, x->d.block_size);
        if (t->ndim < 2) /* include_1d: one row */
            x->rows = 1, x->cols = t->numel, x->nblocks = stz_q_blocks(t->numel, x->d.block_size);
        else if (im && !x->svd) {
            stz_status st = stz_imatrix_find(im, t->name, x->cols, &x->fmt.weights, err);
            if (st)
                return st;
        }
        j->maxrow = x->cols > j->maxrow ? x->cols : j->maxrow;
    }
    return STZ_OK;
}

/* Each thread's buffers: a batch of STZ_QUANT_BATCH_BYTES of input (>= 2-byte
 * values), or one longer row. */
static stz_status open_slots(qfile *j, int threads, stz_err *err)
{
    size_t maxrow = j->maxrow, batch_elems = STZ_QUANT_BATCH_BYTES / 2 > maxrow ? STZ_QUANT_BATCH_BYTES / 2 : maxrow;
    j->nslots = threads < 1 ? 1 : threads;
    if (!(j->slot = calloc((size_t)j->nslots, sizeof *j->slot)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the quantizing threads' buffers");
    for (int k = 0; k < j->nslots; k++) {
        qslot *s = &j->slot[k];
        s->in = malloc(maxrow * 8 > STZ_QUANT_BATCH_BYTES ? maxrow * 8 : STZ_QUANT_BATCH_BYTES);
        s->f = malloc(batch_elems * sizeof *s->f);
        s->q = malloc(batch_elems / 16 * 17 + 64); /* Q8_0's 34 bytes per 32 values at most */
        s->y = malloc(maxrow * sizeof *s->y + 1);
        if (!s->in || !s->f || !s->q || !s->y)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the buffers of %d threads", j->nslots);
    }
    return STZ_OK;
}

/* The names of tensor t's scales (and minimums), which must not exist yet. */
static stz_status name_companions(qfile *j, const stz_tensor *t, stz_quant_plan *x, stz_err *err)
{
    char **names[2] = {&x->scales_name, &x->mins_name};
    for (int k = 0; k < (x->d.method == STZ_QMETHOD_ASYM ? 2 : 1); k++) {
        size_t len = strlen(t->name) + 8;
        if (!(*names[k] = malloc(len)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the scales' names");
        snprintf(*names[k], len, "%s.%s", t->name, k ? "mins" : "scales");
        if (stz_reader_find(j->r, *names[k]) >= 0)
            return stz_err_set(err, STZ_E_DUPLICATE,
                               "%s: tensor '%s': its %s would be stored as '%s', which already exists in the file",
                               j->in, t->name, k ? "minimums" : "scales", *names[k]);
    }
    return STZ_OK;
}

/* What the header needs before it is written: SVD factors (ranks,
 * fallbacks), tensors the policy keeps when they hold NaN/Inf, single-block
 * scales (stored in __metadata__), the companions' names. */
static stz_status settle_plan(qfile *j, const stz_quant_params *p, stz_err *err)
{
    stz_status st = stz_quant_plan_svd(p, j->r, j->pl, j->nt, err);
    for (size_t i = 0; !st && i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        stz_quant_plan *x = &j->pl[i];
        if (!x->bits || x->svd)
            continue;
        if ((st = stz_quant_plan_prepare(j->r, t, x, j->slot, j->nslots, err)) || !x->bits || x->fmt.ggml)
            continue; /* an error, NaN/Inf and the policy keeps such tensors, or scales inside the blocks */
        if (x->rows * x->nblocks == 1) {
            size_t esz = stz_dtype_bits(t->dtype) / 8;
            qslot *s = &j->slot[0];
            if (!(st = stz_reader_read(j->r, t, 0, s->in, t->numel * esz, err)) &&
                !(st = stz_to_f32(t->dtype, s->in, (size_t)t->numel, s->f, err)))
                quant_row(x, s->f, s->q, &x->scalar, &x->scalar_min); /* a non-finite value is reported later */
            continue;
        }
        st = name_companions(j, t, x, err);
    }
    return st;
}

/* Tensor t's quantized values, scales and minimums, and its metadata entry. */
static stz_status declare_quantized(stz_writer *w, const stz_tensor *t, const stz_quant_plan *x, stz_err *err)
{
    uint64_t shape[STZ_ST_MAX_NDIM];
    int nd = t->ndim ? t->ndim : 1;
    memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
    shape[nd - 1] = stz_qf_bytes(&x->fmt, t->ndim ? t->shape[nd - 1] : 1);
    if (t->ndim < 2)
        shape[0] = stz_qf_bytes(&x->fmt, t->numel);
    if (x->transposed) /* rows of the transpose */
        shape[0] = x->rows, shape[1] = stz_qf_bytes(&x->fmt, x->cols);
    stz_dtype vd = x->fmt.ggml ? STZ_DTYPE_U8 : stz_quant_values_dtype(x->bits, x->d.method);
    stz_status st = stz_writer_add(w, t->name, vd, nd, shape, err);
    if (!st && x->scales_name) {
        shape[nd - 1] = x->nblocks;
        st = stz_writer_add(w, x->scales_name, x->d.scale_dtype, nd, shape, err);
        if (!st && x->mins_name)
            st = stz_writer_add(w, x->mins_name, x->d.scale_dtype, nd, shape, err);
    }
    return st ? st : meta_for(w, t, x, err);
}

/* Opens the output (a file, or pp's container) and declares its header:
 * the metadata (the original's first), then every tensor as it will be
 * stored. */
static stz_status declare_outputs(qfile *j, const stz_quant_params *p, const stz_pack_params *pp, stz_err *err)
{
    stz_status st = pp ? stz_pack_sink_open(&j->sink, pp, j->out, err) : STZ_OK;
    if (!st)
        st = pp ? stz_writer_open_sink(&j->w, j->out, stz_pack_sink_wsink(j->sink), err)
                : stz_writer_open(&j->w, j->out, p->write_flags, err);
    if (!st)
        st = stz_writer_set_meta(j->w, "stz.quant.version", STZ_QUANT_VERSION, err);
    for (size_t i = 0; !st && i < stz_reader_meta_count(j->r); i++)
        if (strcmp(stz_reader_meta_key(j->r, i), "format"))
            st = stz_writer_set_meta(j->w, stz_reader_meta_key(j->r, i), stz_reader_meta_value(j->r, i), err);
    for (size_t i = 0; !st && i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        const stz_quant_plan *x = &j->pl[i];
        st = !x->bits ? stz_writer_add(j->w, t->name, t->dtype, t->ndim, t->shape, err)
             : x->svd ? stz_quant_declare_svd(j->w, t, x, err)
                      : declare_quantized(j->w, t, x, err);
    }
    return st;
}

/* A block-quantized tensor: as error feedback left it, or quantized now. */
static stz_status write_block(qfile *j, const stz_quant_params *p, const stz_tensor *t, stz_quant_plan *x, stz_err *err)
{
    int taken = 0;
    stz_status st = p->feedback && x->d.feedback ? write_fed(j->w, t, x, p->feedback, &taken, err) : STZ_OK;
    if (st || taken || (st = stz_quant_plan_hold(j->r, t, x, err)))
        return st;
    st = x->fmt.method == STZ_QMETHOD_TRELLIS ? write_trellis(j->w, j->r, t, x, j->slot, j->nslots, err)
                                              : write_quantized(j->w, j->r, t, x, j->slot, j->nslots, err);
    stz_quant_plan_release(x);
    return st;
}

/* Every tensor in file order: factors, quantized rows, or the bytes kept. */
static stz_status stream_tensors(qfile *j, const stz_quant_params *p, stz_err *err)
{
    uint64_t done = 0, total = stz_reader_file_size(j->r);
    uint8_t *buf = j->slot[0].in;
    for (size_t i = 0; i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        stz_quant_plan *x = &j->pl[i];
        stz_status st = x->svd    ? stz_quant_write_svd(j->r, t, j->w, x, buf, err)
                        : x->bits ? write_block(j, p, t, x, err)
                                  : stz_quant_copy_tensor(j->w, j->r, t, buf, err);
        if (st)
            return st;
        done += t->end - t->begin;
        if (p->progress && p->progress(p->progress_user, done, total))
            return stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", j->out);
    }
    return stz_writer_finish(j->w, err);
}

/* The run's figures, as stz eval reports them: every float tensor counts,
 * kept ones at cosine 1. */
static void collect_stats(const qfile *j, const stz_pack_stats *ps, stz_quant_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    stats->in_bytes = stz_reader_file_size(j->r);
    stats->tensors = j->nt;
    stats->min_cosine = 1;
    double wsum = 0, wtot = 0;
    for (size_t i = 0; i < j->nt; i++) {
        const stz_tensor *t = stz_reader_tensor(j->r, i);
        const stz_quant_plan *x = &j->pl[i];
        stats->params += t->numel;
        if (stz_dtype_is_float(t->dtype))
            wtot += (double)t->numel, wsum += x->bits ? 0 : (double)t->numel;
        if (!x->bits)
            continue;
        stats->quantized++, stats->params_quantized += t->numel;
        wsum += x->cosine * (double)t->numel;
        if (x->cosine < stats->min_cosine) {
            stats->min_cosine = x->cosine;
            snprintf(stats->worst, sizeof stats->worst, "%s", t->name);
        }
    }
    stats->weighted_cosine = wtot ? wsum / wtot : 1;
    struct stat sb;
    stats->out_bytes = j->sink ? ps->in_bytes : stat(j->out, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static void qfile_free(qfile *j)
{
    stz_writer_free(j->w);
    stz_pack_sink_free(j->sink);
    for (size_t i = 0; j->pl && i < j->nt; i++)
        stz_quant_plan_free(&j->pl[i]);
    free(j->pl);
    for (int k = 0; j->slot && k < j->nslots; k++)
        free(j->slot[k].in), free(j->slot[k].f), free(j->slot[k].q), free(j->slot[k].y);
    free(j->slot);
    stz_reader_free(j->r);
}

/* stz_quantize_file, or with pp the container of its output (stz_compress_file). */
static stz_status quantize(const stz_quant_params *p, const stz_pack_params *pp, stz_policy *policy, const char *in,
                           const char *out, stz_quant_stats *stats, stz_pack_stats *pstats, stz_err *err)
{
    qfile j = {.in = in, .out = out};
    stz_status st;
    if ((st = stz_reader_open(&j.r, in, err)))
        return st;
    j.nt = stz_reader_count(j.r);
    STZ_TRY(st, stz_refuse_input_as_output(in, out, err));
    STZ_TRY(st, refuse_quantized(j.r, err));
    STZ_TRY(st, plan_tensors(&j, policy, p, err));
    STZ_TRY(st, open_slots(&j, p->threads, err));
    STZ_TRY(st, settle_plan(&j, p, err));
    STZ_TRY(st, declare_outputs(&j, p, pp, err));
    STZ_TRY(st, stream_tensors(&j, p, err));
    stz_pack_stats ps = {0};
    if (j.sink)
        stz_pack_sink_stats(j.sink, &ps);
    if (pstats)
        *pstats = ps;
    if (stats)
        collect_stats(&j, &ps, stats);
cleanup:
    qfile_free(&j);
    return st;
}

stz_status stz_quantize_file(const stz_quant_params *p, stz_policy *policy, const char *in, const char *out,
                             stz_quant_stats *stats, stz_err *err)
{
    return stz_err_in(err, quantize(p, NULL, policy, in, out, stats, NULL, err), in);
}

stz_status stz_compress_file(const stz_quant_params *qp, const stz_pack_params *pp, stz_policy *policy, const char *in,
                             const char *out, stz_quant_stats *qstats, stz_pack_stats *pstats, stz_err *err)
{
    return stz_err_in(err, quantize(qp, pp, policy, in, out, qstats, pstats, err), in);
}
