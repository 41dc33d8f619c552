/* A reference forward pass of Llama-family decoders, one layer at a time
 * over every position of a batch (see stz_forward.h). */
#include "arch.h"
#include "forward_internal.h"

#include "core/stz_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tensors the model needs ------------------------------------------ */

const stz_fwd_config *stz_fwd_cfg(const stz_fwd *m) { return &m->c; }

const char *stz_fwd_embedding(const stz_fwd *m, int *tied)
{
    if (tied)
        *tied = stz_forward_tied(m);
    return stz_forward_tensor(m, m->global[G_EMBED])->name;
}

static int find(const stz_fwd *m, const char *name, loc *at)
{
    for (size_t f = 0; f < m->nfiles; f++) {
        long i = stz_qmodel_find(m->files[f], name);
        if (i >= 0)
            return at->f = (int)f, at->i = (size_t)i, 1;
    }
    at->f = -1;
    return 0;
}

const stz_qtensor *stz_forward_tensor(const stz_fwd *m, loc at) { return stz_qmodel_tensor(m->files[at.f], at.i); }

/* Whether the tensors' layout (stz_fwd_layout) is one family `arch` is
 * named in, and the configuration one the layers can run. */
static stz_status layout_check(const stz_fwd *m, const stz_arch *arch, int layout, stz_err *err)
{
    if (layout < 0)
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: no token embedding (model.embed_tokens.weight, tok_embeddings.weight or GPT-Neo's "
                           "and GPT-2's transformer.wte.weight): not a model of a family stz runs",
                           m->label);
    int own = layout == STZ_NAMES_GPT_NEO || layout == STZ_NAMES_GPT2; /* names no other family shares */
    if ((own || arch->layout == STZ_NAMES_GPT_NEO || arch->layout == STZ_NAMES_GPT2) && layout != arch->layout)
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: the configuration says a %s model, but the tensors are named as in %s checkpoints",
                           m->label, arch->title,
                           layout == STZ_NAMES_GPT_NEO ? "GPT-Neo"
                           : layout == STZ_NAMES_GPT2  ? "GPT-2"
                                                       : "Llama-family");
    if (arch->pos == STZ_POS_LEARNED && !m->c.max_pos)
        return stz_err_set(err, STZ_E_FORMAT, "%s: a %s model needs max_position_embeddings (its positions' rows)",
                           m->label, arch->title);
    if (m->c.local_window && (m->c.local_period < 1 || m->c.local_period > 32))
        return stz_err_set(err, STZ_E_ARG, "%s: local attention repeats every 1 to 32 layers, not %u", m->label,
                           m->c.local_period);
    return STZ_OK;
}

/* The tensor `name` with shape [d0] (d1 == 0) or [d0, d1]; optional ones may be absent. */
static stz_status need(stz_fwd *m, const char *name, uint64_t d0, uint64_t d1, int optional, loc *at, stz_err *err)
{
    if (!find(m, name, at))
        return optional
                   ? STZ_OK
                   : stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' is missing (the config has %u layers, dim %u)",
                                 m->label, name, m->c.n_layers, m->c.dim);
    const stz_qtensor *t = stz_forward_tensor(m, *at);
    int nd = d1 ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
        char got[96] = "[", want[64];
        for (int k = 0; k < t->ndim && strlen(got) < 64; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", k ? ", " : "",
                     (unsigned long long)t->shape[k]);
        snprintf(want, sizeof want, d1 ? "[%llu, %llu]" : "[%llu]", (unsigned long long)d0, (unsigned long long)d1);
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s' has shape %s], the config says %s", m->label, name, got,
                           want);
    }
    if (!stz_dtype_is_float(t->dtype) || t->dtype == STZ_DTYPE_C64)
        return stz_err_set(err, STZ_E_DTYPE, "%s: tensor '%s' is %s, not floating point", m->label, name,
                           stz_dtype_name(t->dtype));
    return STZ_OK;
}

void stz_fwd_rope_frequencies(const stz_fwd_config *c, float *f)
{
    for (uint32_t i = 0; i < c->head_dim / 2; i++) {
        double freq = stz_pow(c->rope_theta, -2.0 * i / c->head_dim);
        if (c->rope_scaling == STZ_ROPE_LINEAR)
            freq /= c->rope_factor;
        else if (c->rope_scaling == STZ_ROPE_LLAMA3) { /* Llama 3.1's smoothed NTK-by-parts rule */
            double wavelen = 2 * M_PI / freq, lo = c->rope_orig_pos / c->rope_low_freq,
                   hi = c->rope_orig_pos / c->rope_high_freq;
            if (wavelen > lo)
                freq /= c->rope_factor;
            else if (wavelen >= hi) {
                double s = (c->rope_orig_pos / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                freq = (1 - s) * freq / c->rope_factor + s * freq;
            }
        }
        f[i] = (float)freq;
    }
}

stz_status stz_fwd_open(stz_fwd **out, stz_qmodel *const *files, size_t nfiles, const stz_fwd_config *c,
                        const char *label, int threads, stz_err *err)
{
    *out = NULL;
    stz_fwd *m = calloc(1, sizeof *m);
    if (!m || !(m->files = malloc((nfiles + 1) * sizeof *m->files)) ||
        !(m->layer = calloc((size_t)c->n_layers * STZ_ROLE_PER_LAYER, sizeof *m->layer)) ||
        !(m->inv_freq = malloc(c->head_dim * sizeof *m->inv_freq))) {
        stz_fwd_free(m);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the model's weights");
    }
    memcpy(m->files, files, nfiles * sizeof *files);
    m->nfiles = nfiles, m->c = *c, m->threads = threads < 1 ? 1 : threads, m->keep_budget = STZ_FWD_KEEP_DEFAULT;
    snprintf(m->label, sizeof m->label, "%s", label);
    const stz_arch *arch = stz_arch_of(c);
    int hf = stz_fwd_layout(files, nfiles);
    stz_status st = layout_check(m, arch, hf, err);
    if (st) {
        stz_fwd_free(m);
        return st;
    }
    m->c.rope_interleaved = !hf; /* llama2.c keeps Meta's pairwise layout; HF checkpoints are permuted */
    stz_fwd_rope_frequencies(&m->c, m->inv_freq);
    stz_fwd_config local = m->c;
    local.rope_theta = c->rope_local_theta ? c->rope_local_theta : c->rope_theta;
    if (c->rope_local_theta) /* Gemma 3's local layers: their own base, unscaled */
        local.rope_scaling = STZ_ROPE_NONE;
    stz_fwd_rope_frequencies(&local, m->inv_freq + c->head_dim / 2);
    uint64_t D = c->dim, F = c->hidden, QD = (uint64_t)c->n_heads * c->head_dim,
             KD = (uint64_t)c->n_kv_heads * c->head_dim;
    const uint64_t shape[STZ_ROLE_PER_LAYER][2] = {[STZ_ROLE_ANORM] = {D, 0},
                                                   [STZ_ROLE_WQ] = {QD, D},
                                                   [STZ_ROLE_WK] = {KD, D},
                                                   [STZ_ROLE_WV] = {KD, D},
                                                   [STZ_ROLE_WO] = {D, QD},
                                                   [STZ_ROLE_BQ] = {QD, 0},
                                                   [STZ_ROLE_BK] = {KD, 0},
                                                   [STZ_ROLE_BV] = {KD, 0},
                                                   [STZ_ROLE_BO] = {D, 0},
                                                   [STZ_ROLE_FNORM] = {D, 0},
                                                   [STZ_ROLE_GATE] = {F, D},
                                                   [STZ_ROLE_UP] = {F, D},
                                                   [STZ_ROLE_DOWN] = {D, F},
                                                   [STZ_ROLE_QNORM] = {c->head_dim, 0},
                                                   [STZ_ROLE_KNORM] = {c->head_dim, 0},
                                                   [STZ_ROLE_WQKV] = {QD + 2 * KD, D},
                                                   [STZ_ROLE_GATE_UP] = {2 * F, D},
                                                   [STZ_ROLE_ANORM_B] = {D, 0},
                                                   [STZ_ROLE_FNORM_B] = {D, 0},
                                                   [STZ_ROLE_UP_B] = {F, 0},
                                                   [STZ_ROLE_DOWN_B] = {D, 0},
                                                   [STZ_ROLE_POST_ANORM] = {D, 0},
                                                   [STZ_ROLE_POST_FNORM] = {D, 0},
                                                   [STZ_ROLE_BQKV] = {QD + 2 * KD, 0}};
    char name[160];
    for (uint32_t l = 0; !st && l <= c->n_layers; l++)
        for (int k = 0; !st && k < STZ_ROLE_PER_LAYER; k++) {
            int use = stz_arch_use(arch, k);
            loc *at = l < c->n_layers ? &m->layer[(size_t)l * STZ_ROLE_PER_LAYER + k] : NULL, extra;
            if (use == STZ_USE_NONE ||
                !stz_roles[k].name[hf]) { /* not the family's (a family's layout names its own) */
                if (at)
                    at->f = -1;
                continue;
            }
            snprintf(name, sizeof name, stz_roles[k].name[hf], l);
            if (!at && find(m, name, &extra)) /* more layers than the config says */
                st = stz_err_set(err, STZ_E_FORMAT, "%s: the config says %u layers but '%s' is there", label,
                                 c->n_layers, name);
            else if (at && !stz_arch_conv1d(arch, k))
                st = need(m, name, shape[k][0], shape[k][1], use == STZ_USE_MAY, at, err);
            else if (at && !(st = need(m, name, shape[k][1], shape[k][0], 0, at, err))) /* GPT-2: (in, out) */
                st = stz_qmodel_transpose(m->files[at->f], at->i, err);                 /* read as (out, in) */
        }
    const uint64_t gshape[G_COUNT][2] = {[G_EMBED] = {c->vocab, D},
                                         [G_NORM] = {D, 0},
                                         [G_HEAD] = {c->vocab, D},
                                         [G_POS] = {c->max_pos, D},
                                         [G_NORM_B] = {D, 0}};
    for (int g = 0; !st && g < G_COUNT; g++) {
        const char *gname = stz_roles[STZ_ROLE_EMBED + g].name[hf];
        m->global[g].f = -1;
        if (gname && stz_arch_use(arch, STZ_ROLE_EMBED + g) != STZ_USE_NONE)
            st = need(m, gname, gshape[g][0], gshape[g][1], g == G_HEAD && c->tied, &m->global[g], err);
    }
    if (!st && m->global[G_HEAD].f < 0)
        m->global[G_HEAD] = m->global[G_EMBED];
    if (st) {
        stz_fwd_free(m);
        return st;
    }
    *out = m;
    return STZ_OK;
}

void stz_forward_drop_kept(stz_fwd *m)
{
    for (size_t i = 0; m->keep && i < m->keep_layers * STZ_ROLE_PER_LAYER; i++)
        free(m->keep[i]);
    free(m->keep);
    free(m->keep_head);
    m->keep = NULL, m->keep_layers = 0, m->keep_head = NULL;
}

void stz_fwd_free(stz_fwd *m)
{
    if (!m)
        return;
    stz_forward_drop_kept(m);
    free(m->drawn.tok);
    free(m->files);
    free(m->layer);
    free(m->inv_freq);
    free(m);
}

/* ---- weights ------------------------------------------------------------ */

/* 1 if any of x[0..n) is NaN or Inf: a scan the compiler vectorises (an
 * exponent of all ones, no early exit), for every weight read. */
STZ_CLONES("arch=x86-64-v4", "avx2", "default")
static int any_nonfinite(const float *x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

/* The index of x[0..n)'s first NaN or Inf, n if none. */
static size_t nonfinite_at(const float *x, size_t n)
{
    size_t i = 0;
    for (size_t piece = 4096; i < n && !any_nonfinite(x + i, n - i < piece ? n - i : piece); i += piece)
        ;
    while (i < n && isfinite(x[i]))
        i++;
    return i < n ? i : n; /* the last piece may end past n */
}

/* Rows [r0, r0 + n) of a tensor as floats, refused if any is NaN or Inf. */
stz_status stz_forward_read_rows(stz_fwd *m, loc at, uint64_t r0, size_t n, float *dst, stz_err *err)
{
    const stz_qtensor *t = stz_forward_tensor(m, at);
    size_t step = (size_t)(t->cols >= (1u << 20) ? 1 : (1u << 20) / t->cols);
    for (size_t r = 0; r < n; r += step) {
        size_t k = n - r < step ? n - r : step;
        float *d = dst + r * t->cols;
        stz_status st = stz_qmodel_read_rows(m->files[at.f], at.i, r0 + r, k, d, err);
        if (st)
            return st;
        for (stz_fwd_hook *h = m->hooks; h; h = h->next)
            if (h->weights && h->weights(h, m, at, d, r0 + r, k, (size_t)t->cols))
                return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory perturbing '%s'", m->label, t->name);
        size_t bad = nonfinite_at(d, k * t->cols);
        if (bad < k * t->cols)
            return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s' holds NaN or Inf (row %llu)", m->label, t->name,
                               (unsigned long long)(r0 + r + bad / t->cols));
    }
    return STZ_OK;
}

/* One layer's weights into w (NULL where an optional bias is absent): the
 * kept copy when sampling keeps this layer, else read into buf, buffers
 * the caller reuses for every layer (all layers have the same shapes). */
static stz_status load_layer(stz_fwd *m, uint32_t l, float *const buf[STZ_ROLE_PER_LAYER], float *w[STZ_ROLE_PER_LAYER],
                             stz_err *err)
{
    float **kept = l < m->keep_layers ? m->keep + (size_t)l * STZ_ROLE_PER_LAYER : NULL;
    if (kept && kept[STZ_ROLE_WO]) { /* every family has it */
        memcpy(w, kept, STZ_ROLE_PER_LAYER * sizeof *w);
        return STZ_OK;
    }
    for (int k = 0; k < STZ_ROLE_PER_LAYER; k++) {
        loc at = m->layer[(size_t)l * STZ_ROLE_PER_LAYER + k];
        w[k] = NULL;
        if (at.f < 0)
            continue;
        const stz_qtensor *t = stz_forward_tensor(m, at);
        if (kept && !(kept[k] = malloc(t->numel * sizeof(float))))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory reading '%s'", t->name);
        w[k] = kept ? kept[k] : buf[k];
        stz_status st = stz_forward_read_rows(m, at, 0, (size_t)t->rows, w[k], err);
        if (st)
            return st;
    }
    return STZ_OK;
}

/* ---- the layers ----------------------------------------------------------- */

/* What RMSNorm adds to its weights: 1 for Gemma's norms by 1 + w, else 0. */
static float norm_one(const stz_fwd *m) { return stz_arch_of(&m->c)->norm == STZ_NORM_RMS_1W ? 1.0f : 0.0f; }

/* x / rms(x) * (w + one). */
static void rmsnorm(float *o, const float *x, const float *w, float one, size_t n, double eps)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float s = (float)(1 / sqrt(ss / (double)n + eps));
    for (size_t i = 0; i < n; i++)
        o[i] = (w[i] + one) * (x[i] * s);
}

/* (x - mean) / sqrt(var + eps) * w + b, the statistics in double. */
static void layernorm(float *o, const float *x, const float *w, const float *b, size_t n, double eps)
{
    double sum = 0, ss = 0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    double mean = sum / (double)n;
    for (size_t i = 0; i < n; i++)
        ss += ((double)x[i] - mean) * ((double)x[i] - mean);
    float s = (float)(1 / sqrt(ss / (double)n + eps)), mu = (float)mean;
    for (size_t i = 0; i < n; i++)
        o[i] = w[i] * ((x[i] - mu) * s) + b[i];
}

void stz_forward_norm(const stz_fwd *m, float *o, const float *x, const float *w, const float *b, size_t n)
{
    if (stz_arch_of(&m->c)->norm == STZ_NORM_LAYER)
        layernorm(o, x, w, b, n, m->c.norm_eps);
    else
        rmsnorm(o, x, w, norm_one(m), n, m->c.norm_eps);
}

/* Y (n, out; rows ldy apart) = X (n, in) @ W (out, in)^T + b */
static void linear_ld(const stz_fwd *m, float *Y, size_t ldy, const float *X, const float *W, const float *b, size_t n,
                      size_t in, size_t out)
{
    stz_mm_nt(Y, ldy, X, in, W, in, n, in, out, m->threads);
    for (size_t r = 0; b && r < n; r++)
        for (size_t j = 0; j < out; j++)
            Y[r * ldy + j] += b[j];
}

void stz_forward_linear(const stz_fwd *m, float *Y, const float *X, const float *W, const float *b, size_t n, size_t in,
                        size_t out)
{
    linear_ld(m, Y, out, X, W, b, n, in, out);
}

/* RoPE of nheads heads at pos: the local layers' frequencies (Gemma 3) when local. */
static void rope(const stz_fwd *m, float *v, size_t nheads, uint32_t pos, int local)
{
    size_t hd = m->c.head_dim, half = hd / 2;
    const float *freq = m->inv_freq + (local ? half : 0);
    for (size_t i = 0; i < half; i++) {
        double sd, cd;
        stz_sincos((double)pos * freq[i], &sd, &cd);
        float c = (float)cd, s = (float)sd;
        for (size_t h = 0; h < nheads; h++) {
            float *x = v + h * hd;
            size_t i0 = m->c.rope_interleaved ? 2 * i : i, i1 = m->c.rope_interleaved ? 2 * i + 1 : i + half;
            float x0 = x[i0], x1 = x[i1];
            x[i0] = x0 * c - x1 * s;
            x[i1] = x1 * c + x0 * s;
        }
    }
}

/* The RMSNorm of every query head (n rows of QD in q) and key head (n
 * rows of KD in k), with the weights of one head each. */
static void head_norms(const stz_fwd *m, float *q, float *k, const float *wq, const float *wk, size_t n)
{
    const stz_fwd_config *c = &m->c;
    size_t hd = c->head_dim;
    float one = norm_one(m);
    for (size_t h = 0; h < n * c->n_heads; h++)
        rmsnorm(q + h * hd, q + h * hd, wq, one, hd, c->norm_eps);
    for (size_t h = 0; h < n * c->n_kv_heads; h++)
        rmsnorm(k + h * hd, k + h * hd, wk, one, hd, c->norm_eps);
}

static float attn_scale(const stz_fwd_config *c)
{
    return stz_arch_of(c)->flags & STZ_ARCH_NO_SCALE ? 1.0f
           : c->attn_scale                           ? (float)c->attn_scale
                                                     : 1.0f / sqrtf((float)c->head_dim);
}

/* A score scaled, then soft-capped (Gemma 2: cap tanh(x / cap); cap 0: none). */
static inline float score(float s, float scale, float cap)
{
    return cap ? cap * stz_tanhf(s * scale / cap) : s * scale;
}

void stz_forward_cap_logits(const stz_fwd *m, float *L, size_t n, size_t k, size_t ld)
{
    float cap = (float)m->c.final_softcap;
    for (size_t r = 0; cap && r < n; r++)
        for (size_t j = 0; j < k; j++)
            L[r * ld + j] = score(L[r * ld + j], 1.0f, cap);
}

/* How many positions (a row's own and those before it) layer l attends to: 0 all, or its local window. */
static size_t layer_window(const stz_fwd_config *c, uint32_t l)
{
    return c->local_window && (c->local_mask >> (l % c->local_period) & 1) ? c->local_window : 0;
}

/* The first of positions 0..P-1 that the row at P - 1 sees in a window of win (0: all of them). */
static size_t window_start(size_t P, size_t win) { return win && P > win ? P - win : 0; }

/* Causal attention, one row at a time: row r sees positions 0..pos[r] of
 * its sequence in the caches (the last win of them, win > 0). att (n, QD);
 * sc: pos + 1 floats. */
static void attend_rows(const stz_fwd_config *c, const batch *b, const float *q, const float *kc, const float *vc,
                        float *att, float *sc, size_t win)
{
    size_t hd = c->head_dim, QD = (size_t)c->n_heads * hd, KD = (size_t)c->n_kv_heads * hd,
           group = c->n_heads / c->n_kv_heads;
    float scale = attn_scale(c), cap = (float)c->attn_softcap;
    for (size_t r = 0; r < b->n; r++) {
        const float *ks = kc + b->seq[r] * b->cap * KD, *vs = vc + b->seq[r] * b->cap * KD;
        size_t P = b->pos[r] + 1, lo = window_start(P, win);
        for (size_t h = 0; h < c->n_heads; h++) {
            const float *qh = q + r * QD + h * hd;
            size_t g = h / group * hd;
            float mx = -INFINITY;
            for (size_t t = lo; t < P; t++) { /* the products attend_seq takes, in its order */
                float s = 0;
                for (size_t i = 0; i < hd; i++)
                    s += qh[i] * ks[t * KD + g + i];
                sc[t] = score(s, scale, cap);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            double sum = 0;
            for (size_t t = lo; t < P; t++)
                sum += sc[t] = stz_expf(sc[t] - mx);
            float *o = att + r * QD + h * hd, inv = (float)(1 / sum);
            memset(o, 0, hd * sizeof *o);
            for (size_t t = lo; t < P; t++) {
                float a = sc[t] * inv;
                for (size_t i = 0; i < hd; i++)
                    o[i] += a * vs[t * KD + g + i];
            }
        }
    }
}

#define QUERY_BLOCK 256

/* Causal attention of a whole sequence (positions 0..L-1) as products,
 * QUERY_BLOCK queries at a time, the same bits as attend_rows (win: as
 * there). q, att: L
 * rows of QD; ks, vs: the sequence's caches; S: QUERY_BLOCK x L floats,
 * then the keys of a group transposed, head_dim x L. */
static void attend_seq(const stz_fwd_config *c, const float *q, const float *ks, const float *vs, size_t L, float *att,
                       float *S, size_t win, int threads)
{
    size_t hd = c->head_dim, QD = (size_t)c->n_heads * hd, KD = (size_t)c->n_kv_heads * hd,
           group = c->n_heads / c->n_kv_heads;
    float scale = attn_scale(c), cap = (float)c->attn_softcap, *Kt = S + QUERY_BLOCK * L;
    for (size_t h = 0; h < c->n_heads; h++) {
        size_t g = h / group * hd;
        for (size_t t = 0; h % group == 0 && t < L; t++) /* Kt (hd, L) = k[0:L, g]^T */
            for (size_t i = 0; i < hd; i++)
                Kt[i * L + t] = ks[t * KD + g + i];
        for (size_t t0 = 0; t0 < L; t0 += QUERY_BLOCK) {
            size_t nq = L - t0 < QUERY_BLOCK ? L - t0 : QUERY_BLOCK, P = t0 + nq;
            /* S (nq, P) = q[t0:P, h] (nq, hd) @ Kt[:, 0:P] (hd, P), then * scale */
            stz_mm_nn(S, P, q + t0 * QD + h * hd, QD, 1, Kt, L, nq, hd, P, 0, threads);
            for (size_t i = 0; i < nq; i++) {
                float *row = S + i * P, mx = -INFINITY;
                size_t valid = t0 + i + 1, lo = window_start(valid, win);
                for (size_t t = lo; t < valid; t++)
                    mx = (row[t] = score(row[t], scale, cap)) > mx ? row[t] : mx;
                double sum = 0;
                for (size_t t = lo; t < valid; t++)
                    sum += row[t] = stz_expf(row[t] - mx);
                float inv = (float)(1 / sum);
                for (size_t t = lo; t < valid; t++)
                    row[t] *= inv;
                memset(row, 0, lo * sizeof *row);
                memset(row + valid, 0, (P - valid) * sizeof *row);
            }
            /* att[t0:P, h] (nq, hd) = S (nq, P) @ v[0:P, g] (P, hd) */
            stz_mm_nn(att + t0 * QD + h * hd, QD, S, P, 1, vs + g, KD, nq, P, hd, 0, threads);
        }
    }
}

void stz_forward_attach(stz_fwd *m, stz_fwd_hook *h)
{
    stz_fwd_hook **end = &m->hooks;
    while (*end && *end != h)
        end = &(*end)->next;
    if (!*end)
        *end = h, h->next = NULL;
}

void stz_forward_detach(stz_fwd *m, const stz_fwd_hook *h)
{
    for (stz_fwd_hook **at = &m->hooks; *at; at = &(*at)->next)
        if (*at == h) {
            *at = h->next;
            return;
        }
}

stz_status stz_forward_observe(stz_fwd *m, uint32_t layer, const int *roles, int k, const float *X, size_t n,
                               size_t cols, stz_err *err)
{
    stz_status st = STZ_OK;
    for (stz_fwd_hook *h = m->hooks; !st && h; h = h->next)
        if (h->input && !(m->step && h->tokens && m->step >= h->tokens))
            st = h->input(h, m, layer, roles, k, X, n, cols, err);
    return st;
}

/* The matrices that read each input, for the hooks (fused: Phi-3's). */
static const int attn_in[3] = {STZ_ROLE_WQ, STZ_ROLE_WK, STZ_ROLE_WV}, out_in[1] = {STZ_ROLE_WO},
                 ffn_in[2] = {STZ_ROLE_GATE, STZ_ROLE_UP}, up_in[1] = {STZ_ROLE_UP}, down_in[1] = {STZ_ROLE_DOWN},
                 head_in[1] = {STZ_ROLE_HEAD}, attn_fused[1] = {STZ_ROLE_WQKV}, ffn_fused[1] = {STZ_ROLE_GATE_UP};

/* A fused matrix's row ranges as the separate roles: q, k and v of WQKV;
 * gate and up of GATE_UP. Products over a range's rows are those over the
 * separate matrix, bit for bit. */
static void split_fused(float *w[STZ_ROLE_PER_LAYER], const stz_fwd_config *c)
{
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    if (w[STZ_ROLE_WQKV])
        w[STZ_ROLE_WQ] = w[STZ_ROLE_WQKV], w[STZ_ROLE_WK] = w[STZ_ROLE_WQKV] + QD * D,
        w[STZ_ROLE_WV] = w[STZ_ROLE_WQKV] + (QD + KD) * D;
    if (w[STZ_ROLE_BQKV]) /* GPT-2 */
        w[STZ_ROLE_BQ] = w[STZ_ROLE_BQKV], w[STZ_ROLE_BK] = w[STZ_ROLE_BQKV] + QD,
        w[STZ_ROLE_BV] = w[STZ_ROLE_BQKV] + QD + KD;
    if (w[STZ_ROLE_GATE_UP])
        w[STZ_ROLE_GATE] = w[STZ_ROLE_GATE_UP], w[STZ_ROLE_UP] = w[STZ_ROLE_GATE_UP] + (size_t)c->hidden * D;
}

/* X += Y (n rows of dim), Y first normed by post (Gemma's post-norms) unless NULL. */
static void add_output(const stz_fwd *m, float *X, float *Y, const float *post, size_t n)
{
    size_t D = m->c.dim;
    for (size_t r = 0; post && r < n; r++)
        stz_forward_norm(m, Y + r * D, Y + r * D, post, NULL, D);
    for (size_t i = 0; i < n * D; i++)
        X[i] += Y[i];
}

/* Every row through layers l0..l1-1: X (n, dim) in place. */
stz_status stz_forward_run_layers(stz_fwd *m, float *X, const batch *b, size_t nseq, uint32_t l0, uint32_t l1,
                                  stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    size_t n = b->n, D = c->dim, F = c->hidden, hd = c->head_dim, QD = (size_t)c->n_heads * hd,
           KD = (size_t)c->n_kv_heads * hd;
    int act = stz_arch_of(c)->act, gated = act != STZ_ACT_GELU_TANH, rope_on = stz_arch_of(c)->pos == STZ_POS_ROPE;
    size_t maxpos = 0;
    for (size_t r = 0; r < n; r++)
        maxpos = b->pos[r] + 1 > maxpos ? b->pos[r] + 1 : maxpos;
    float *xb = malloc(n * (QD > D ? QD : D) * sizeof *xb), *q = malloc(n * QD * sizeof *q),
          *kv = malloc(n * 2 * KD * sizeof *kv), *att = malloc(n * QD * sizeof *att), *h1 = malloc(n * F * sizeof *h1),
          *h3 = malloc(n * F * sizeof *h3), *sc = malloc((b->layers == 1 ? QUERY_BLOCK + hd : 1) * maxpos * sizeof *sc);
    stz_status st = STZ_OK;
    if (!xb || !q || !kv || !att || !h1 || !h3 || !sc)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", n);
    float *buf[STZ_ROLE_PER_LAYER] = {0};
    for (int k = 0; !st && m->keep_layers < c->n_layers && k < STZ_ROLE_PER_LAYER; k++)
        if (m->layer[k].f >= 0 && !(buf[k] = malloc(stz_forward_tensor(m, m->layer[k])->numel * sizeof(float))))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a layer's weights");
    for (uint32_t l = l0; !st && l < l1; l++) {
        float *w[STZ_ROLE_PER_LAYER];
        if ((st = load_layer(m, l, buf, w, err)))
            break;
        split_fused(w, c);
        int fused_qkv = w[STZ_ROLE_WQKV] != NULL;
        size_t lk = b->layers > 1 ? l : 0;
        float *kc = b->k + lk * nseq * b->cap * KD, *vc = b->v + lk * nseq * b->cap * KD;
        for (size_t r = 0; r < n; r++)
            stz_forward_norm(m, xb + r * D, X + r * D, w[STZ_ROLE_ANORM], w[STZ_ROLE_ANORM_B], D);
        if ((st = stz_forward_observe(m, l, fused_qkv ? attn_fused : attn_in, fused_qkv ? 1 : 3, xb, n, D, err)))
            break;
        stz_forward_linear(m, q, xb, w[STZ_ROLE_WQ], w[STZ_ROLE_BQ], n, D, QD);  /* (n, dim) @ wq^T -> (n, QD) */
        stz_forward_linear(m, kv, xb, w[STZ_ROLE_WK], w[STZ_ROLE_BK], n, D, KD); /* -> (n, KD) */
        stz_forward_linear(m, kv + n * KD, xb, w[STZ_ROLE_WV], w[STZ_ROLE_BV], n, D, KD);
        if (w[STZ_ROLE_QNORM]) /* Qwen3, Gemma 3: every head normed before RoPE */
            head_norms(m, q, kv, w[STZ_ROLE_QNORM], w[STZ_ROLE_KNORM], n);
        size_t win = layer_window(c, l);
        for (size_t r = 0; r < n; r++) {
            if (rope_on) {
                rope(m, q + r * QD, c->n_heads, b->pos[r], win != 0);
                rope(m, kv + r * KD, c->n_kv_heads, b->pos[r], win != 0);
            }
            size_t at = (b->seq[r] * b->cap + b->pos[r]) * KD;
            memcpy(kc + at, kv + r * KD, KD * sizeof *kc);
            memcpy(vc + at, kv + (n + r) * KD, KD * sizeof *vc);
        }
        if (b->layers == 1) /* whole sequences, rows in order: through sgemm */
            for (size_t r0 = 0, L; r0 < n; r0 += L) {
                for (L = 1; r0 + L < n && b->seq[r0 + L] == b->seq[r0]; L++)
                    ;
                attend_seq(c, q + r0 * QD, kc + b->seq[r0] * b->cap * KD, vc + b->seq[r0] * b->cap * KD, L,
                           att + r0 * QD, sc, win, m->threads);
            }
        else
            attend_rows(c, b, q, kc, vc, att, sc, win);
        if ((st = stz_forward_observe(m, l, out_in, 1, att, n, QD, err)))
            break;
        stz_forward_linear(m, xb, att, w[STZ_ROLE_WO], w[STZ_ROLE_BO], n, QD, D); /* (n, QD) @ wo^T -> (n, dim) */
        add_output(m, X, xb, w[STZ_ROLE_POST_ANORM], n);
        for (size_t r = 0; r < n; r++)
            stz_forward_norm(m, xb + r * D, X + r * D, w[STZ_ROLE_FNORM], w[STZ_ROLE_FNORM_B], D);
        int fused_ffn = w[STZ_ROLE_GATE_UP] != NULL;
        if ((st = stz_forward_observe(m, l,
                                      fused_ffn ? ffn_fused
                                      : gated   ? ffn_in
                                                : up_in,
                                      fused_ffn || !gated ? 1 : 2, xb, n, D, err)))
            break;
        if (gated) {
            stz_forward_linear(m, h1, xb, w[STZ_ROLE_GATE], NULL, n, D, F); /* (n, dim) @ w1^T -> (n, hidden) */
            stz_forward_linear(m, h3, xb, w[STZ_ROLE_UP], NULL, n, D, F);
            for (size_t i = 0; act == STZ_ACT_SWIGLU && i < n * F; i++)
                h1[i] = stz_silu(h1[i]) * h3[i];
            for (size_t i = 0; act == STZ_ACT_GEGLU && i < n * F; i++) /* Gemma */
                h1[i] = stz_gelu_tanh(h1[i]) * h3[i];
        } else { /* GPT-Neo: gelu(x @ c_fc^T + b) */
            stz_forward_linear(m, h1, xb, w[STZ_ROLE_UP], w[STZ_ROLE_UP_B], n, D, F);
            for (size_t i = 0; i < n * F; i++)
                h1[i] = stz_gelu_tanh(h1[i]);
        }
        if ((st = stz_forward_observe(m, l, down_in, 1, h1, n, F, err)))
            break;
        stz_forward_linear(m, xb, h1, w[STZ_ROLE_DOWN], w[STZ_ROLE_DOWN_B], n, F,
                           D); /* (n, hidden) @ w2^T -> (n, dim) */
        add_output(m, X, xb, w[STZ_ROLE_POST_FNORM], n);
        if (progress && progress(user, ++*done, total))
            st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    }
    free(xb), free(q), free(kv), free(att), free(h1), free(h3), free(sc);
    for (int k = 0; k < STZ_ROLE_PER_LAYER; k++)
        free(buf[k]);
    return st;
}

stz_status stz_forward_embed(stz_fwd *m, const int32_t *tok, const uint32_t *pos, size_t n, float *X, stz_err *err)
{
    size_t D = m->c.dim;
    float *p = m->global[G_POS].f >= 0 ? malloc(D * sizeof *p) : NULL,
          scale = stz_arch_of(&m->c)->flags & STZ_ARCH_EMBED_SCALE ? sqrtf((float)D) : 0;
    stz_status st =
        m->global[G_POS].f >= 0 && !p ? stz_err_set(err, STZ_E_NOMEM, "out of memory for a position") : STZ_OK;
    for (size_t r = 0; !st && r < n; r++) {
        if (tok[r] < 0 || (uint32_t)tok[r] >= m->c.vocab)
            st = stz_err_set(err, STZ_E_ARG, "%s: token id %d is outside the vocabulary [0, %u)", m->label, tok[r],
                             m->c.vocab);
        else
            st = stz_forward_read_rows(m, m->global[G_EMBED], (uint64_t)tok[r], 1, X + r * D, err);
        if (!st && p && !(st = stz_forward_read_rows(m, m->global[G_POS], pos[r], 1, p, err)))
            for (size_t i = 0; i < D; i++) /* GPT-Neo: wte[token] + wpe[position] */
                X[r * D + i] += p[i];
        for (size_t i = 0; !st && scale && i < D; i++) /* Gemma: wte[token] x sqrt(dim) */
            X[r * D + i] *= scale;
    }
    free(p);
    return st;
}

stz_status stz_forward_out_norm(stz_fwd *m, float *X, size_t n, stz_err *err)
{
    size_t D = m->c.dim;
    float *nw = malloc(2 * D * sizeof *nw);
    stz_status st = !nw ? stz_err_set(err, STZ_E_NOMEM, "out of memory for the output norm") : STZ_OK;
    int bias = m->global[G_NORM_B].f >= 0;
    if (!st)
        st = stz_forward_read_rows(m, m->global[G_NORM], 0, 1, nw, err);
    if (!st && bias)
        st = stz_forward_read_rows(m, m->global[G_NORM_B], 0, 1, nw + D, err);
    for (size_t r = 0; !st && r < n; r++)
        stz_forward_norm(m, X + r * D, X + r * D, nw, bias ? nw + D : NULL, D);
    free(nw);
    return st;
}

stz_status stz_forward_final_norm(stz_fwd *m, float *X, size_t n, stz_err *err)
{
    stz_status st = stz_forward_out_norm(m, X, n, err);
    return st ? st : stz_forward_observe(m, 0, head_in, 1, X, n, m->c.dim, err);
}

/* Final norm in place, then logits (n, vocab) = X (n, dim) @ head (vocab, dim)^T,
 * the head read in slices so it is never whole in memory. */
stz_status stz_forward_head(stz_fwd *m, float *X, size_t n, float *logits, stz_err *err)
{
    size_t D = m->c.dim, V = m->c.vocab, step = (1u << 22) / D ? (1u << 22) / D : 1;
    float *w = malloc((step < V ? step : V) * D * sizeof *w);
    stz_status st = !w ? stz_err_set(err, STZ_E_NOMEM, "out of memory for the output layer") : STZ_OK;
    if (!st)
        st = stz_forward_final_norm(m, X, n, err);
    /* logits (n, V) = X (n, dim) @ head (V, dim)^T, a slice of the vocabulary at a time */
    for (size_t v0 = 0; !st && v0 < V; v0 += step) {
        size_t k = V - v0 < step ? V - v0 : step;
        const float *h = m->keep_head ? m->keep_head + v0 * D : w;
        if (m->keep_head || !(st = stz_forward_read_rows(m, m->global[G_HEAD], v0, k, w, err))) {
            linear_ld(m, logits + v0, V, X, h, NULL, n, D, k);
            stz_forward_cap_logits(m, logits + v0, n, k, V);
        }
    }
    for (size_t i = 0; !st && i < n * V; i++)
        if (!isfinite(logits[i]))
            st = stz_err_set(err, STZ_E_NUMERIC, "%s: the logits at position %zu are not finite", m->label, i / V);
    free(w);
    return st;
}

void stz_forward_rows_free(seq_rows *R)
{
    free(R->pos), free(R->seq), free(R->tok), free(R->k), free(R->v);
    memset(R, 0, sizeof *R);
}

stz_status stz_forward_rows_make(const stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                                 const size_t *lens, seq_rows *R, stz_err *err)
{
    memset(R, 0, sizeof *R);
    size_t n = 0, cap = 0;
    for (size_t s = 0; s < nseq; s++) {
        if (m->c.max_pos && lens[s] > m->c.max_pos)
            return stz_err_set(err, STZ_E_ARG, "%s: sequence %zu has %zu tokens, more than the model's %u positions",
                               m->label, s + 1, lens[s], m->c.max_pos);
        if (m->c.sliding_window && lens[s] > m->c.sliding_window)
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: sequence %zu has %zu tokens, more than the sliding window of %u (not supported)",
                               m->label, s + 1, lens[s], m->c.sliding_window);
        n += lens[s], cap = lens[s] > cap ? lens[s] : cap;
    }
    size_t KD = (size_t)m->c.n_kv_heads * m->c.head_dim;
    R->pos = malloc((n + 1) * sizeof *R->pos), R->seq = malloc((n + 1) * sizeof *R->seq);
    R->tok = malloc((n + 1) * sizeof *R->tok);
    R->k = malloc((nseq * cap * KD + 1) * sizeof *R->k), R->v = malloc((nseq * cap * KD + 1) * sizeof *R->v);
    if (!R->pos || !R->seq || !R->tok || !R->k || !R->v) {
        stz_forward_rows_free(R);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the sequences' state");
    }
    for (size_t s = 0, r = 0, at = 0; s < nseq; at = stz_seq_next(at, stride, lens[s]), s++)
        for (size_t t = 0; t < lens[s]; t++, r++)
            R->pos[r] = (uint32_t)t, R->seq[r] = (uint32_t)s, R->tok[r] = tokens[at + t];
    R->nseq = nseq;
    R->b = (batch){n, R->pos, R->seq, cap, R->k, R->v, 1};
    return STZ_OK;
}

size_t stz_forward_batch_end(const size_t *lens, size_t nseq, size_t s0, size_t rows, size_t *sum)
{
    size_t s1 = s0 + 1, n = lens[s0], cap = lens[s0];
    for (; s1 < nseq; s1++) {
        size_t c = lens[s1] > cap ? lens[s1] : cap;
        if (n + lens[s1] > rows || (s1 - s0 + 1) * c > 4 * rows)
            break;
        n += lens[s1], cap = c;
    }
    if (sum)
        *sum = n;
    return s1;
}

/* Hidden states after every layer for all rows of nseq sequences (lens[s]
 * tokens each, stride apart); X gets sum(lens) rows. */
stz_status stz_forward_hidden_states(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                                     float *X, stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total,
                                     stz_err *err)
{
    seq_rows R;
    stz_status st = stz_forward_rows_make(m, tokens, nseq, stride, lens, &R, err);
    if (!st && !(st = stz_forward_embed(m, R.tok, R.pos, R.b.n, X, err)))
        st = stz_forward_run_layers(m, X, &R.b, nseq, 0, m->c.n_layers, progress, user, done, total, err);
    stz_forward_rows_free(&R);
    return st;
}

stz_status stz_fwd_logits(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t len, float *logits, stz_err *err)
{
    size_t *lens = malloc((nseq + 1) * sizeof *lens), n = nseq * len;
    float *X = malloc((n * m->c.dim + 1) * sizeof *X);
    uint64_t done = 0;
    stz_status st = !lens || !X ? stz_err_set(err, STZ_E_NOMEM, "out of memory for the activations") : STZ_OK;
    for (size_t s = 0; !st && s < nseq; s++)
        lens[s] = len;
    if (!st)
        st = stz_forward_hidden_states(m, tokens, nseq, len, lens, X, NULL, NULL, &done, 0, err);
    if (!st)
        st = stz_forward_head(m, X, n, logits, err);
    free(lens), free(X);
    return st;
}
