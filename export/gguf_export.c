/* stz_gguf_export: a Llama-family checkpoint to GGUF, streamed tensor by
 * tensor in row batches (see stz_gguf.h). */
#include "gguf_export.h"
#include "model/roles.h"
#include "quant/ggml_types.h"
#include "core/stz_core.h"
#include "stz_pack.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The order of tensors in the file: the embedding, layer by layer, then
 * the norm and head. */
static const stz_role file_order[] = {
    STZ_ROLE_EMBED,   STZ_ROLE_POS,        STZ_ROLE_ANORM,   STZ_ROLE_ANORM_B, STZ_ROLE_WQKV,       STZ_ROLE_BQKV,
    STZ_ROLE_WQ,      STZ_ROLE_BQ,         STZ_ROLE_QNORM,   STZ_ROLE_WK,      STZ_ROLE_BK,         STZ_ROLE_KNORM,
    STZ_ROLE_WV,      STZ_ROLE_BV,         STZ_ROLE_WO,      STZ_ROLE_BO,      STZ_ROLE_POST_ANORM, STZ_ROLE_FNORM,
    STZ_ROLE_FNORM_B, STZ_ROLE_GATE,       STZ_ROLE_GATE_UP, STZ_ROLE_UP,      STZ_ROLE_UP_B,       STZ_ROLE_DOWN,
    STZ_ROLE_DOWN_B,  STZ_ROLE_POST_FNORM, STZ_ROLE_NORM,    STZ_ROLE_NORM_B,  STZ_ROLE_HEAD};

#define NROLES (sizeof file_order / sizeof file_order[0])

static int float_type(stz_dtype d)
{
    return d == STZ_DTYPE_F16 ? STZ_GGML_F16 : d == STZ_DTYPE_BF16 ? STZ_GGML_BF16 : STZ_GGML_F32;
}

/* The GGUF type stz's quantized tensor q maps to exactly, or -1. */
static int exact_type(const stz_qtensor *q)
{
    if (!q->bits || q->rank || q->block_size != STZ_GGML_QK || q->cols % STZ_GGML_QK ||
        q->scale_dtype != STZ_DTYPE_F16 ||
        (strcmp(q->method, "absmax") && strcmp(q->method, "full") && strcmp(q->method, "mse")))
        return -1;
    return q->bits == 8 ? STZ_GGML_Q8_0 : q->bits == 5 ? STZ_GGML_Q5_0 : q->bits == 4 ? STZ_GGML_Q4_0 : -1;
}

/* The nearest GGUF block type for stz's quantized tensor q (requantize). */
static int nearest_type(const stz_qtensor *q)
{
    return q->rank || q->bits >= 6 ? STZ_GGML_Q8_0 : q->bits == 5 ? STZ_GGML_Q5_0 : STZ_GGML_Q4_0;
}

/* Decides how tensor e (source q) is written. */
static stz_status choose(exporter *x, etensor *e, stz_err *err)
{
    const stz_qtensor *q = e->q;
    /* a mix's type for e, before fallbacks: counted below as --type's are */
    int want = x->mix < 0 ? x->p->type : stz_gguf_like_type(x->mix, e, x->c, x->tied);
    e->kind = K_FLOAT;
    if (e->ndim == 1) {
        e->type = STZ_GGML_F32; /* norms and biases: llama.cpp keeps them F32 */
        e->kind = !q->bits && q->dtype == STZ_DTYPE_F32 && !e->heads && !e->add ? K_COPY : K_FLOAT;
    } else if (q->bits && !q->rank && !e->held && (e->type = stz_ggml_type_parse(q->method)) >= 0)
        e->kind = K_COPY; /* stored as the type's blocks: byte for byte */
    else if (q->bits && !e->held && (e->type = exact_type(q)) >= 0)
        /* stored codes and scales when there is a scales tensor (more than one block) */
        e->kind = e->type != STZ_GGML_Q5_0 && e->rows * (e->cols / STZ_GGML_QK) > 1 ? K_RAW : K_REPACK;
    else if (q->bits && e->cols % STZ_GGML_QK)
        e->type = STZ_GGML_Q8_0; /* any block type: replaced below */
    else if (q->bits) {
        if (!x->p->requantize)
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: tensor '%s' is stored as %s %d-bit%s, block %u, %s scales%s, which GGUF cannot "
                               "hold exactly: use --requantize, or quantize to one of llama.cpp's types (e.g. --set "
                               "'*=q4_k'; or absmax/full/mse, 8/5/4 bits, block 32, F16 scales)",
                               x->model, q->name, q->method, q->bits, q->rank ? " factors" : "", q->block_size,
                               q->scale_dtype < STZ_DTYPE_COUNT ? stz_dtype_name(q->scale_dtype) : "F32",
                               e->held ? " along the rows of its stored (in, out) layout" : "");
        e->kind = K_REQUANT;
        e->type = block_type(want) ? want : nearest_type(q);
    } else {
        e->type = want == STZ_GGML_AUTO ? float_type(q->dtype) : want;
        if (!block_type(e->type) && e->type == float_type(q->dtype) && q->dtype != STZ_DTYPE_F64 && !e->held)
            e->kind = K_COPY;
    }
    /* a down projection in padded 32-blocks ("pad") stays: widen_ffn widens the FFN to them */
    int padded = e->kind == K_COPY && e->role == STZ_ROLE_DOWN && stz_ggml_block(e->type) == STZ_GGML_QK;
    int fb = block_type(e->type) && !padded ? stz_ggml_fallback(e->type, e->cols) : e->type;
    if (fb != e->type && fb != STZ_GGML_F16) { /* a 256-block type on rows of whole 32-blocks: llama.cpp's fallback */
        if (!x->stats->block_fallback++) {
            snprintf(x->stats->block_fallback_first, sizeof x->stats->block_fallback_first, "%s", q->name);
            x->stats->block_fallback_from = e->type;
            x->stats->block_fallback_to = fb;
        }
        e->type = fb;
    } else if (fb != e->type) {
        /* no block type takes such rows: F16 as llama.cpp does, or F32 for
           stz's quantized values, which it holds exactly */
        if (!x->stats->fallback++)
            snprintf(x->stats->fallback_first, sizeof x->stats->fallback_first, "%s", q->name);
        e->type = q->bits ? STZ_GGML_F32 : STZ_GGML_F16;
        e->kind = K_FLOAT;
    }
    return STZ_OK;
}

static stz_status plan(exporter *x, stz_qmodel *const *files, size_t nfiles, int names, int permute, stz_err *err)
{
    const stz_fwd_config *c = x->c;
    size_t cap = NROLES * (size_t)c->n_layers + 8;
    if (!(x->t = calloc(cap, sizeof *x->t)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor plan");
    x->tied = 1;
    for (size_t f = 0; f < nfiles; f++)
        x->tied &= stz_qmodel_find(files[f], stz_roles[STZ_ROLE_HEAD].name[names]) < 0;
    /* in file order: the embedding, layer by layer, then the norm and head */
    for (uint32_t l = 0; l <= c->n_layers + 1; l++)
        for (size_t k = 0; k < NROLES; k++) {
            stz_role r = file_order[k];
            int layered = r < STZ_ROLE_PER_LAYER, first = r == STZ_ROLE_EMBED || r == STZ_ROLE_POS;
            if (layered ? !l || l > c->n_layers : (l != 0) != !first || (l && l <= c->n_layers))
                continue;
            char src[256];
            const char *pat = stz_roles[r].name[names];
            if (!pat)
                continue; /* not a tensor of the family's layout */
            snprintf(src, sizeof src, pat, l - 1);
            etensor *e = &x->t[x->n];
            long at = -1;
            for (size_t f = 0; f < nfiles && at < 0; f++)
                if ((at = stz_qmodel_find(files[f], src)) >= 0)
                    e->m = files[f], e->i = (size_t)at;
            if (at < 0)
                continue; /* biases, a tied head: stz_fwd_open checked what is required */
            e->q = stz_qmodel_tensor(e->m, e->i);
            if (stz_arch_conv1d(stz_arch_of(c), r)) { /* GPT-2: GGUF's rows are its columns */
                stz_status st = stz_qmodel_transpose(e->m, e->i, err);
                if (st)
                    return st;
                e->held = e->q->transposed == STZ_TRANSPOSED_HELD;
            }
            snprintf(e->name, sizeof e->name, stz_roles[r].gguf, l - 1);
            e->role = (int)r;
            e->rows = e->q->rows, e->cols = e->q->cols;
            e->ndim = e->q->ndim >= 2 ? 2 : 1;
            e->ne[0] = e->cols, e->ne[1] = e->rows;
            if (e->ndim == 1)
                e->ne[0] = e->q->numel, e->rows = 1, e->cols = e->q->numel;
            if (permute && stz_roles[r].perm)
                e->heads = stz_roles[r].perm == 1 ? c->n_heads : c->n_kv_heads;
            e->add = stz_arch_of(c)->norm == STZ_NORM_RMS_1W && stz_role_is_norm(r) ? 1.0f : 0.0f;
            stz_status st = choose(x, e, err);
            if (st)
                return st;
            x->n++;
        }
    if (c->rope_scaling == STZ_ROPE_LLAMA3) {
        etensor *e = &x->t[x->n++];
        snprintf(e->name, sizeof e->name, "rope_freqs.weight");
        e->kind = K_ROPE, e->type = STZ_GGML_F32, e->ndim = 1;
        e->ne[0] = e->cols = c->head_dim / 2, e->rows = 1;
    }
    return STZ_OK;
}

/* A down projection stored in padded 32-blocks ("pad") cannot be cut to
 * the FFN's width, so the FFN grows to the blocks' instead: zero rows
 * after the gate and up projections (whole zero blocks decode to 0 in
 * every type, so the new units output silu(0) * 0 = 0) and zero columns
 * after any down projection not stored so. The model computes the same.
 * Not done for a fused gate and up (Phi-3): refused. */
static stz_status widen_ffn(exporter *x, stz_err *err)
{
    uint64_t from = x->c->hidden, to = from;
    const char *padded = NULL;
    for (size_t i = 0; i < x->n; i++) {
        const etensor *e = &x->t[i];
        if (e->role == STZ_ROLE_DOWN && e->kind == K_COPY && e->cols % stz_ggml_block(e->type))
            to = (e->cols + STZ_GGML_QK - 1) / STZ_GGML_QK * STZ_GGML_QK, padded = e->q->name;
    }
    if (to == from)
        return STZ_OK;
    if (stz_arch_of(x->c)->flags & STZ_ARCH_FUSED)
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: tensor '%s' is stored in padded blocks, which would widen the FFN; a fused "
                           "gate_up_proj is not widened: quantize it without pad",
                           x->model, padded);
    for (size_t i = 0; i < x->n; i++) {
        etensor *e = &x->t[i];
        if ((e->role == STZ_ROLE_GATE || e->role == STZ_ROLE_UP) && e->ndim == 2 && e->rows == from)
            e->ne[1] = to;
        else if (e->role == STZ_ROLE_DOWN && e->cols == from) {
            e->ne[0] = to;
            if (!(e->kind == K_COPY && block_type(e->type)))
                e->kind = K_FLOAT; /* floats, widened as they are written */
        }
    }
    x->stats->ffn_from = from, x->stats->ffn_to = to;
    return STZ_OK;
}

/* ---- metadata -------------------------------------------------------------- */

static void put_hparams(gbuf *kv, const stz_fwd_config *c, const char *arch, const char *name)
{
    const stz_arch *row = stz_arch_of(c);
    char k[96];
    uint32_t context = c->max_pos ? c->max_pos : 2048; /* a window of the whole context: none */
#define KEY(s) (snprintf(k, sizeof k, "%s." s, arch), k)
    kv_str(kv, "general.architecture", arch);
    kv_str(kv, "general.name", name);
    kv_u32(kv, "general.quantization_version", 2); /* as llama.cpp's convert writes it: the header's size does not
                                                      depend on the types */
    kv_u32(kv, KEY("context_length"), context);
    kv_u32(kv, KEY("embedding_length"), c->dim);
    kv_u32(kv, KEY("block_count"), c->n_layers);
    kv_u32(kv, KEY("feed_forward_length"), c->hidden);
    kv_u32(kv, KEY("attention.head_count"), c->n_heads);
    kv_u32(kv, KEY("attention.head_count_kv"), c->n_kv_heads);
    if (row->norm == STZ_NORM_LAYER)
        kv_f32(kv, KEY("attention.layer_norm_epsilon"), (float)c->norm_eps);
    else
        kv_f32(kv, KEY("attention.layer_norm_rms_epsilon"), (float)c->norm_eps);
    if (row->pos == STZ_POS_ROPE) {
        kv_f32(kv, KEY("rope.freq_base"), (float)c->rope_theta);
        kv_u32(kv, KEY("rope.dimension_count"), c->head_dim);
    }
    kv_u32(kv, KEY("vocab_size"), c->vocab);
    if (c->head_dim * c->n_heads != c->dim) {
        kv_u32(kv, KEY("attention.key_length"), c->head_dim);
        kv_u32(kv, KEY("attention.value_length"), c->head_dim);
    }
    if (row->flags & STZ_ARCH_GGUF_SWA) /* llama.cpp requires it (no window: the whole context) */
        kv_u32(kv, KEY("attention.sliding_window"), c->sliding_window ? c->sliding_window : context);
    if (c->rope_scaling == STZ_ROPE_LINEAR) {
        kv_str(kv, KEY("rope.scaling.type"), "linear");
        kv_f32(kv, KEY("rope.scaling.factor"), (float)c->rope_factor);
    }
    if (row->swa_period) { /* Gemma: the windowed layers, every local_period-th global */
        kv_u32(kv, KEY("attention.sliding_window"), c->local_window ? c->local_window : context);
        kv_u32(kv, KEY("attention.sliding_window_pattern"), c->local_window ? c->local_period : 1);
    }
    if (c->rope_local_theta)
        kv_f32(kv, KEY("rope.freq_base_swa"), (float)c->rope_local_theta);
    if (c->attn_softcap)
        kv_f32(kv, KEY("attn_logit_softcapping"), (float)c->attn_softcap);
    if (c->final_softcap)
        kv_f32(kv, KEY("final_logit_softcapping"), (float)c->final_softcap);
#undef KEY
}

/* What llama.cpp's Gemma cannot express, refused: it windows every layer
 * but the last of each attention.sliding_window_pattern; it takes the score
 * scale from the model's size, not from query_pre_attn_scalar:
 * 1/sqrt(head_dim), or 1/sqrt(dim / heads) for the 27B models (Gemma 2's 46
 * layers, Gemma 3's 62). */
static stz_status gemma_check(const stz_fwd_config *c, const char *model_path, stz_err *err)
{
    if (!stz_arch_of(c)->swa_period)
        return STZ_OK;
    if (c->local_window && (c->local_period < 2 || c->local_mask != (1u << (c->local_period - 1)) - 1))
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: its windowed layers (%s) are not a pattern llama.cpp's sliding_window_pattern "
                           "expresses (all but the last of each period)",
                           model_path, c->local_period < 2 ? "every layer" : "a period whose last layer is windowed");
    if (!c->attn_scale)
        return STZ_OK;
    int big = c->n_layers == (c->arch == STZ_ARCH_GEMMA2 ? 46u : 62u);
    double want = 1 / sqrt(big ? (double)c->dim / c->n_heads : (double)c->head_dim);
    if (fabs(c->attn_scale / want - 1) < 1e-6)
        return STZ_OK;
    return stz_err_set(err, STZ_E_UNSUPPORTED,
                       "%s: query_pre_attn_scalar %.9g is not the one llama.cpp takes for this model (%.9g): "
                       "llama.cpp would score its attention differently",
                       model_path, 1 / (c->attn_scale * c->attn_scale), 1 / (want * want));
}

/* llama.cpp's qwen2 loader requires the q, k and v biases of every layer. */
static stz_status qwen2_biases(const exporter *x, stz_err *err)
{
    static const char *const need[] = {"attn_q", "attn_k", "attn_v"};
    for (uint32_t l = 0; l < x->c->n_layers; l++)
        for (size_t k = 0; k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.%s.bias", l, need[k]);
            size_t i = 0;
            while (i < x->n && strcmp(x->t[i].name, name))
                i++;
            if (i == x->n)
                return stz_err_set(err, STZ_E_FORMAT,
                                   "%s: a Qwen2 model without the %c bias of layer %u (%s): "
                                   "llama.cpp cannot load it",
                                   x->model, need[k][5], l, name);
        }
    return STZ_OK;
}

/* tokenizer.json in dir, or (dir NULL) beside model_path: in it when it is a
 * directory, else in the directory holding it; -1 out of memory. */
static int tokenizer_beside(char **tok, const char *dir, const char *model_path)
{
    if (dir)
        return asprintf(tok, "%s/tokenizer.json", dir);
    char *copy = strdup(model_path);
    int n = copy ? asprintf(tok, "%s/tokenizer.json", stz_is_dir(model_path) ? model_path : dirname(copy)) : -1;
    free(copy);
    return n;
}

/* The tokenizer: --tokenizer, else the model directory's tokenizer.json.
 * The tokenizer's path (*tok, malloc'd: a path of any length, never cut). */
static stz_status find_tokenizer(const stz_gguf_params *p, const char *dir, const char *model_path, char **tok,
                                 stz_err *err)
{
    if (p->tokenizer ? !(*tok = strdup(p->tokenizer)) : tokenizer_beside(tok, dir, model_path) < 0)
        return *tok = NULL, stz_err_set(err, STZ_E_NOMEM, "out of memory for a path");
    if (!p->tokenizer && access(*tok, F_OK))
        return stz_err_set(err, STZ_E_ARG,
                           "%s: no tokenizer (no %s): give one with --tokenizer FILE (a "
                           "tokenizer.json, or a llama2.c tokenizer .bin)",
                           model_path, *tok);
    return STZ_OK;
}

/* general.name: --name, else the model file's name without its extension. */
static stz_status model_name(const stz_gguf_params *p, const char *model_path, char **name, stz_err *err)
{
    char *copy = strdup(model_path);
    *name = copy ? strdup(p->name ? p->name : basename(copy)) : NULL;
    free(copy);
    if (!*name)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a path");
    if (!p->name && strchr(*name + 1, '.'))
        *strchr(*name + 1, '.') = 0;
    return STZ_OK;
}

/* general.file_type: llama.cpp's LLAMA_FTYPE (its row of traits) of the
 * type most matrix elements have. */
static uint32_t file_type(const exporter *x)
{
    uint64_t elems[STZ_GGML_TYPE_LIMIT] = {0};
    int most = STZ_GGML_F32;
    if (x->mix >= 0)
        return (uint32_t)stz_gguf_like_ftype(x->mix);
    for (size_t i = 0; i < x->n; i++)
        if (x->t[i].ndim == 2 && (elems[x->t[i].type] += x->t[i].rows * x->t[i].cols) > elems[most])
            most = x->t[i].type;
    return (uint32_t)stz_ggml_traits_of(most)->ftype;
}

/* The file's header: magic, version, counts, the pairs, the tensor infos
 * (each tensor's data offset assigned here), padding. */
static void build_header(exporter *x, const gbuf *kv, gbuf *head, stz_gguf_stats *stats)
{
    gb_u32(head, 0x46554747u);
    gb_u32(head, 3);
    gb_u64(head, x->n);
    gb_u64(head, kv->count);
    gb_bytes(head, kv->p, kv->n);
    uint64_t off = 0;
    for (size_t i = 0; i < x->n; i++) {
        etensor *e = &x->t[i];
        e->bytes = stz_ggml_row_bytes(e->type, e->ne[0]) * (e->ndim == 2 ? e->ne[1] : 1);
        e->offset = off;
        off += gguf_padded(e->bytes);
        gb_tensor_info(head, e->name, e->ndim, e->ne, e->type, e->offset);
        stats->tensors[e->type]++, stats->bytes[e->type] += e->bytes;
        stats->repacked += e->kind == K_REPACK || e->kind == K_RAW || (e->kind == K_COPY && e->q->bits);
    }
    stats->header_bytes = head->n;
    gb_pad(head);
    x->total = off;
}

stz_status stz_gguf_export(const stz_gguf_params *p, stz_qmodel *const *files, size_t nfiles, const stz_fwd_config *c,
                           const char *config_json, const char *model_path, const char *dir, const char *out,
                           stz_gguf_stats *stats, stz_err *err)
{
    exporter x = {.p = p, .c = c, .model = model_path, .mix = -1, .of = STZ_OUTFILE_INIT, .stats = stats};
    memset(stats, 0, sizeof *stats);
    gbuf kv = {0}, head = {0};
    char *tok = NULL, *name = NULL;
    stz_status st = STZ_OK;
    const stz_arch *A = stz_arch_of(c);
    const char *arch = A->gguf;
    if (!arch)
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: llama.cpp has no %s architecture: no GGUF file can hold this model (stz's own "
                           "formats, eval --forward, imatrix and tune take it)",
                           model_path, A->title);
    snprintf(stats->arch, sizeof stats->arch, "%s", arch);
    if (p->mix && (x.mix = stz_gguf_like_parse(p->mix)) < 0) {
        return stz_err_set(err, STZ_E_ARG, "%s: '%s' is not one of llama-quantize's types", model_path, p->mix);
    }
    /* the names' layout: the embedding's; llama.cpp's "llama" RoPE takes Hugging Face's rows in pairs */
    int names = stz_fwd_layout(files, nfiles);
    STZ_TRY(st, gemma_check(c, model_path, err));
    STZ_TRY(st, plan(&x, files, nfiles, names, names == STZ_NAMES_HF && (A->flags & STZ_ARCH_ROPE_PAIRS), err));
    if (A->flags & STZ_ARCH_QKV_BIAS)
        STZ_TRY(st, qwen2_biases(&x, err));
    STZ_TRY(st, find_tokenizer(p, dir, model_path, &tok, err));
    STZ_TRY(st, model_name(p, model_path, &name, err));
    uint32_t ftype = file_type(&x);
    STZ_TRY(st, widen_ffn(&x, err));
    stz_fwd_config wide = *c;
    wide.hidden = (uint32_t)(stats->ffn_to ? stats->ffn_to : c->hidden);
    put_hparams(&kv, &wide, arch, name);
    kv_u32(&kv, "general.file_type", ftype);
    if (stats->ffn_to) /* the model's own width, for readers that take the zero units out (stz) */
        kv_u32(&kv, STZ_GGUF_KEY_FFN, c->hidden);
    STZ_TRY(st, gguf_vocab(&kv, tok, A, config_json, c->vocab, p->pad_vocab, &stats->vocab_padded, err));
    build_header(&x, &kv, &head, stats);
    if (kv.oom || head.oom) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the GGUF header");
        goto cleanup;
    }
    stats->file_bytes = head.n + x.total;
    stz_gguf_like_sizes(x.t, x.n, c, x.tied, stats->header_bytes, stats->like_bytes);
    if (!out)
        goto cleanup; /* the figures only */
    STZ_TRY(st, stz_outfile_open(&x.of, out, (p->write_flags & STZ_WRITE_FORCE) != 0, err));
    STZ_TRY(st, stz_check_space(&x.of, stats->file_bytes, "the GGUF file", err));
    STZ_TRY(st, stz_outfile_write(&x.of, head.p, head.n, err));
    for (size_t i = 0; i < x.n && !st; i++)
        st = stz_gguf_write_tensor(&x, &x.t[i], err);
    if (!st)
        st = stz_outfile_commit(&x.of, err);
cleanup:
    stz_outfile_abort(&x.of);
    free(x.f), free(x.g), free(x.sc), free(x.sg), free(x.q), free(x.out), free(x.t);
    free(kv.p), free(head.p), free(tok), free(name);
    return st;
}
