/* A reference forward pass of Llama-family decoders, one layer at a time
 * over every position of a batch (see stz_forward.h). */
#include "stz_forward.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void openblas_set_num_threads(int num_threads);

/* ---- tensors the model needs ------------------------------------------ */

enum { T_ANORM, T_WQ, T_WK, T_WV, T_WO, T_BQ, T_BK, T_BV, T_BO, T_FNORM, T_GATE, T_UP, T_DOWN, T_PER_LAYER };
enum { G_EMBED, G_NORM, G_HEAD, G_COUNT };

/* Names in llama2.c's layout and in Hugging Face's; biases are optional. */
static const char *const layer_names[2][T_PER_LAYER] = {
    {"layers.%u.attention_norm.weight", "layers.%u.attention.wq.weight", "layers.%u.attention.wk.weight",
     "layers.%u.attention.wv.weight", "layers.%u.attention.wo.weight", "layers.%u.attention.wq.bias",
     "layers.%u.attention.wk.bias", "layers.%u.attention.wv.bias", "layers.%u.attention.wo.bias",
     "layers.%u.ffn_norm.weight", "layers.%u.feed_forward.w1.weight", "layers.%u.feed_forward.w3.weight",
     "layers.%u.feed_forward.w2.weight"},
    {"model.layers.%u.input_layernorm.weight", "model.layers.%u.self_attn.q_proj.weight",
     "model.layers.%u.self_attn.k_proj.weight", "model.layers.%u.self_attn.v_proj.weight",
     "model.layers.%u.self_attn.o_proj.weight", "model.layers.%u.self_attn.q_proj.bias",
     "model.layers.%u.self_attn.k_proj.bias", "model.layers.%u.self_attn.v_proj.bias",
     "model.layers.%u.self_attn.o_proj.bias", "model.layers.%u.post_attention_layernorm.weight",
     "model.layers.%u.mlp.gate_proj.weight", "model.layers.%u.mlp.up_proj.weight",
     "model.layers.%u.mlp.down_proj.weight"}};
static const char *const global_names[2][G_COUNT] = {{"tok_embeddings.weight", "norm.weight", "output.weight"},
                                                      {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}};

typedef struct {
    int f; /* file, -1: absent */
    size_t i;
} loc;

struct stz_fwd {
    stz_fwd_config c;
    stz_qmodel **files;
    size_t nfiles;
    char label[512];
    int threads;
    loc *layer;          /* n_layers x T_PER_LAYER */
    loc global[G_COUNT]; /* G_HEAD is the embedding when tied */
    float *inv_freq;     /* head_dim / 2 RoPE frequencies */
    float **keep;        /* sampling: weights kept between steps, per layer x T_PER_LAYER */
    size_t keep_layers;  /* layers kept */
    float *keep_head;    /* sampling: the output head (vocab, dim), when it fits too */
    uint64_t keep_budget; /* sampling: bytes of F32 weights kept between steps */
    const stz_fwd_probe *probe; /* stz_fwd_probe_run: the matrix at probe_at is perturbed as it is read */
    loc probe_at;
};

const stz_fwd_config *stz_fwd_cfg(const stz_fwd *m) { return &m->c; }

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

static const stz_qtensor *tensor(const stz_fwd *m, loc at) { return stz_qmodel_tensor(m->files[at.f], at.i); }

/* The tensor `name` with shape [d0] (d1 == 0) or [d0, d1]; optional ones may be absent. */
static stz_status need(stz_fwd *m, const char *name, uint64_t d0, uint64_t d1, int optional, loc *at, stz_err *err)
{
    if (!find(m, name, at))
        return optional ? STZ_OK
                        : stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' is missing (the config has %u layers, dim %u)",
                                      m->label, name, m->c.n_layers, m->c.dim);
    const stz_qtensor *t = tensor(m, *at);
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
        double freq = pow(c->rope_theta, -2.0 * i / c->head_dim);
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
        !(m->layer = calloc((size_t)c->n_layers * T_PER_LAYER, sizeof *m->layer)) ||
        !(m->inv_freq = malloc(c->head_dim / 2 * sizeof *m->inv_freq))) {
        stz_fwd_free(m);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    memcpy(m->files, files, nfiles * sizeof *files);
    m->nfiles = nfiles, m->c = *c, m->threads = threads < 1 ? 1 : threads, m->keep_budget = STZ_FWD_KEEP_DEFAULT;
    snprintf(m->label, sizeof m->label, "%s", label);
    loc probe;
    int hf = find(m, global_names[1][G_EMBED], &probe);
    if (!hf && !find(m, global_names[0][G_EMBED], &probe)) {
        stz_fwd_free(m);
        return stz_err_set(err, STZ_E_FORMAT, "%s: no token embedding (model.embed_tokens.weight or "
                                              "tok_embeddings.weight): not a Llama-family model", label);
    }
    m->c.rope_interleaved = !hf; /* llama2.c keeps Meta's pairwise layout; HF checkpoints are permuted */
    stz_fwd_rope_frequencies(&m->c, m->inv_freq);
    uint64_t D = c->dim, F = c->hidden, QD = (uint64_t)c->n_heads * c->head_dim,
             KD = (uint64_t)c->n_kv_heads * c->head_dim;
    const uint64_t shape[T_PER_LAYER][2] = {{D, 0}, {QD, D}, {KD, D}, {KD, D}, {D, QD}, {QD, 0}, {KD, 0},
                                            {KD, 0}, {D, 0}, {D, 0}, {F, D},  {F, D},  {D, F}};
    stz_status st = STZ_OK;
    char name[160];
    for (uint32_t l = 0; !st && l <= c->n_layers; l++)
        for (int k = 0; !st && k < T_PER_LAYER; k++) {
            snprintf(name, sizeof name, layer_names[hf][k], l);
            if (l == c->n_layers) { /* more layers than the config says */
                if (find(m, name, &probe))
                    st = stz_err_set(err, STZ_E_FORMAT, "%s: the config says %u layers but '%s' is there", label,
                                     c->n_layers, name);
                continue;
            }
            int optional = k >= T_BQ && k <= T_BO;
            st = need(m, name, shape[k][0], shape[k][1], optional, &m->layer[(size_t)l * T_PER_LAYER + k], err);
        }
    if (!st)
        st = need(m, global_names[hf][G_EMBED], c->vocab, D, 0, &m->global[G_EMBED], err);
    if (!st)
        st = need(m, global_names[hf][G_NORM], D, 0, 0, &m->global[G_NORM], err);
    if (!st && (st = need(m, global_names[hf][G_HEAD], c->vocab, D, c->tied, &m->global[G_HEAD], err)) == STZ_OK &&
        m->global[G_HEAD].f < 0)
        m->global[G_HEAD] = m->global[G_EMBED];
    if (st) {
        stz_fwd_free(m);
        return st;
    }
    *out = m;
    return STZ_OK;
}

static void drop_kept(stz_fwd *m)
{
    for (size_t i = 0; m->keep && i < m->keep_layers * T_PER_LAYER; i++)
        free(m->keep[i]);
    free(m->keep);
    free(m->keep_head);
    m->keep = NULL, m->keep_layers = 0, m->keep_head = NULL;
}

void stz_fwd_free(stz_fwd *m)
{
    if (!m)
        return;
    drop_kept(m);
    free(m->files);
    free(m->layer);
    free(m->inv_freq);
    free(m);
}

/* ---- weights ------------------------------------------------------------ */

/* Rows [r0, r0 + n) of a tensor as floats, refused if any is NaN or Inf. */
static stz_status read_rows(stz_fwd *m, loc at, uint64_t r0, size_t n, float *dst, stz_err *err)
{
    const stz_qtensor *t = tensor(m, at);
    size_t step = (size_t)(t->cols >= (1u << 20) ? 1 : (1u << 20) / t->cols);
    for (size_t r = 0; r < n; r += step) {
        size_t k = n - r < step ? n - r : step;
        float *d = dst + r * t->cols;
        stz_status st = stz_qmodel_read_rows(m->files[at.f], at.i, r0 + r, k, d, err);
        if (st)
            return st;
        if (m->probe && at.f == m->probe_at.f && at.i == m->probe_at.i &&
            m->probe->perturb(m->probe->user, t->name, d, r0 + r, k, (size_t)t->cols))
            return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory perturbing '%s'", m->label, t->name);
        for (size_t i = 0; i < k * t->cols; i++)
            if (!isfinite(d[i]))
                return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s' holds NaN or Inf (row %llu)", m->label,
                                   t->name, (unsigned long long)(r0 + r + i / t->cols));
    }
    return STZ_OK;
}

/* One layer's weights into w (NULL where an optional bias is absent): the
 * kept copy when sampling keeps this layer, else read into buf, buffers
 * the caller reuses for every layer (all layers have the same shapes). */
static stz_status load_layer(stz_fwd *m, uint32_t l, float *const buf[T_PER_LAYER], float *w[T_PER_LAYER],
                             stz_err *err)
{
    float **kept = l < m->keep_layers ? m->keep + (size_t)l * T_PER_LAYER : NULL;
    if (kept && kept[T_WQ]) {
        memcpy(w, kept, T_PER_LAYER * sizeof *w);
        return STZ_OK;
    }
    for (int k = 0; k < T_PER_LAYER; k++) {
        loc at = m->layer[(size_t)l * T_PER_LAYER + k];
        w[k] = NULL;
        if (at.f < 0)
            continue;
        const stz_qtensor *t = tensor(m, at);
        if (kept && !(kept[k] = malloc(t->numel * sizeof(float))))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory reading '%s'", t->name);
        w[k] = kept ? kept[k] : buf[k];
        stz_status st = read_rows(m, at, 0, (size_t)t->rows, w[k], err);
        if (st)
            return st;
    }
    return STZ_OK;
}

/* ---- the layers ----------------------------------------------------------- */

static void rmsnorm(float *o, const float *x, const float *w, size_t n, double eps)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float s = (float)(1 / sqrt(ss / (double)n + eps));
    for (size_t i = 0; i < n; i++)
        o[i] = w[i] * (x[i] * s);
}

/* Y (n, out; rows ldy apart) = X (n, in) @ W (out, in)^T + b */
static void linear_ld(float *Y, size_t ldy, const float *X, const float *W, const float *b, size_t n, size_t in,
                      size_t out)
{
    if (n <= 8) /* a few rows (sampling a token at a time): sgemm would repack all of W, sgemv streams it */
        for (size_t r = 0; r < n; r++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)out, (int)in, 1.0f, W, (int)in, X + r * in, 1, 0.0f,
                        Y + r * ldy, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.0f, X, (int)in, W, (int)in,
                    0.0f, Y, (int)ldy);
    for (size_t r = 0; b && r < n; r++)
        for (size_t j = 0; j < out; j++)
            Y[r * ldy + j] += b[j];
}

static void linear(float *Y, const float *X, const float *W, const float *b, size_t n, size_t in, size_t out)
{
    linear_ld(Y, out, X, W, b, n, in, out);
}

static void rope(const stz_fwd *m, float *v, size_t nheads, uint32_t pos)
{
    size_t hd = m->c.head_dim, half = hd / 2;
    for (size_t i = 0; i < half; i++) {
        double a = (double)pos * m->inv_freq[i];
        float c = (float)cos(a), s = (float)sin(a);
        for (size_t h = 0; h < nheads; h++) {
            float *x = v + h * hd;
            size_t i0 = m->c.rope_interleaved ? 2 * i : i, i1 = m->c.rope_interleaved ? 2 * i + 1 : i + half;
            float x0 = x[i0], x1 = x[i1];
            x[i0] = x0 * c - x1 * s;
            x[i1] = x1 * c + x0 * s;
        }
    }
}

/* A batch of rows: row r is the token at position pos[r] of sequence
 * seq[r]; the key/value cache holds cap positions per sequence. */
typedef struct {
    size_t n;
    const uint32_t *pos, *seq;
    size_t cap;
    float *k, *v; /* per layer: nseq x cap x kv_dim, for `layers` layers (1: reused) */
    size_t layers;
} batch;

/* Causal attention, one row at a time: row r sees positions 0..pos[r] of
 * its sequence in the caches. att (n, QD); sc: pos + 1 floats. */
static void attend_rows(const stz_fwd_config *c, const batch *b, const float *q, const float *kc, const float *vc,
                        float *att, float *sc)
{
    size_t hd = c->head_dim, QD = (size_t)c->n_heads * hd, KD = (size_t)c->n_kv_heads * hd,
           group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    for (size_t r = 0; r < b->n; r++) {
        const float *ks = kc + b->seq[r] * b->cap * KD, *vs = vc + b->seq[r] * b->cap * KD;
        size_t P = b->pos[r] + 1;
        for (size_t h = 0; h < c->n_heads; h++) {
            const float *qh = q + r * QD + h * hd;
            size_t g = h / group * hd;
            float mx = -INFINITY;
            for (size_t t = 0; t < P; t++) {
                float s = 0;
                for (size_t i = 0; i < hd; i++)
                    s += qh[i] * ks[t * KD + g + i];
                sc[t] = s * scale;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            double sum = 0;
            for (size_t t = 0; t < P; t++)
                sum += sc[t] = expf(sc[t] - mx);
            float *o = att + r * QD + h * hd, inv = (float)(1 / sum);
            memset(o, 0, hd * sizeof *o);
            for (size_t t = 0; t < P; t++) {
                float a = sc[t] * inv;
                for (size_t i = 0; i < hd; i++)
                    o[i] += a * vs[t * KD + g + i];
            }
        }
    }
}

#define QUERY_BLOCK 256

/* Causal attention of a whole sequence (positions 0..L-1) through sgemm,
 * QUERY_BLOCK queries at a time. q, att: L rows of QD; ks, vs: the
 * sequence's caches; S: QUERY_BLOCK x L floats. */
static void attend_seq(const stz_fwd_config *c, const float *q, const float *ks, const float *vs, size_t L, float *att,
                       float *S)
{
    size_t hd = c->head_dim, QD = (size_t)c->n_heads * hd, KD = (size_t)c->n_kv_heads * hd,
           group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    for (size_t h = 0; h < c->n_heads; h++) {
        size_t g = h / group * hd;
        for (size_t t0 = 0; t0 < L; t0 += QUERY_BLOCK) {
            size_t nq = L - t0 < QUERY_BLOCK ? L - t0 : QUERY_BLOCK, P = t0 + nq;
            /* S (nq, P) = q[t0:P, h] (nq, hd) @ k[0:P, g] (P, hd)^T * scale */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)P, (int)hd, scale, q + t0 * QD + h * hd,
                        (int)QD, ks + g, (int)KD, 0.0f, S, (int)P);
            for (size_t i = 0; i < nq; i++) {
                float *row = S + i * P, mx = -INFINITY;
                size_t valid = t0 + i + 1;
                for (size_t t = 0; t < valid; t++)
                    mx = row[t] > mx ? row[t] : mx;
                double sum = 0;
                for (size_t t = 0; t < valid; t++)
                    sum += row[t] = expf(row[t] - mx);
                float inv = (float)(1 / sum);
                for (size_t t = 0; t < valid; t++)
                    row[t] *= inv;
                memset(row + valid, 0, (P - valid) * sizeof *row);
            }
            /* att[t0:P, h] (nq, hd) = S (nq, P) @ v[0:P, g] (P, hd) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)hd, (int)P, 1.0f, S, (int)P, vs + g,
                        (int)KD, 0.0f, att + t0 * QD + h * hd, (int)QD);
        }
    }
}

/* Every row through layers l0..l1-1: X (n, dim) in place. */
static stz_status run_layers(stz_fwd *m, float *X, const batch *b, size_t nseq, uint32_t l0, uint32_t l1,
                             stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    size_t n = b->n, D = c->dim, F = c->hidden, hd = c->head_dim, QD = (size_t)c->n_heads * hd,
           KD = (size_t)c->n_kv_heads * hd;
    size_t maxpos = 0;
    for (size_t r = 0; r < n; r++)
        maxpos = b->pos[r] + 1 > maxpos ? b->pos[r] + 1 : maxpos;
    float *xb = malloc(n * (QD > D ? QD : D) * sizeof *xb), *q = malloc(n * QD * sizeof *q),
          *kv = malloc(n * 2 * KD * sizeof *kv), *att = malloc(n * QD * sizeof *att),
          *h1 = malloc(n * F * sizeof *h1), *h3 = malloc(n * F * sizeof *h3),
          *sc = malloc((b->layers == 1 ? QUERY_BLOCK : 1) * maxpos * sizeof *sc);
    stz_status st = STZ_OK;
    if (!xb || !q || !kv || !att || !h1 || !h3 || !sc)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", n);
    float *buf[T_PER_LAYER] = {0};
    for (int k = 0; !st && m->keep_layers < c->n_layers && k < T_PER_LAYER; k++)
        if (m->layer[k].f >= 0 && !(buf[k] = malloc(tensor(m, m->layer[k])->numel * sizeof(float))))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a layer's weights");
    for (uint32_t l = l0; !st && l < l1; l++) {
        float *w[T_PER_LAYER];
        if ((st = load_layer(m, l, buf, w, err)))
            break;
        size_t lk = b->layers > 1 ? l : 0;
        float *kc = b->k + lk * nseq * b->cap * KD, *vc = b->v + lk * nseq * b->cap * KD;
        for (size_t r = 0; r < n; r++)
            rmsnorm(xb + r * D, X + r * D, w[T_ANORM], D, c->norm_eps);
        linear(q, xb, w[T_WQ], w[T_BQ], n, D, QD);    /* (n, dim) @ wq^T -> (n, QD) */
        linear(kv, xb, w[T_WK], w[T_BK], n, D, KD);   /* -> (n, KD) */
        linear(kv + n * KD, xb, w[T_WV], w[T_BV], n, D, KD);
        for (size_t r = 0; r < n; r++) {
            rope(m, q + r * QD, c->n_heads, b->pos[r]);
            rope(m, kv + r * KD, c->n_kv_heads, b->pos[r]);
            size_t at = (b->seq[r] * b->cap + b->pos[r]) * KD;
            memcpy(kc + at, kv + r * KD, KD * sizeof *kc);
            memcpy(vc + at, kv + (n + r) * KD, KD * sizeof *vc);
        }
        if (b->layers == 1) /* whole sequences, rows in order: through sgemm */
            for (size_t r0 = 0, L; r0 < n; r0 += L) {
                for (L = 1; r0 + L < n && b->seq[r0 + L] == b->seq[r0]; L++)
                    ;
                attend_seq(c, q + r0 * QD, kc + b->seq[r0] * b->cap * KD, vc + b->seq[r0] * b->cap * KD, L,
                           att + r0 * QD, sc);
            }
        else
            attend_rows(c, b, q, kc, vc, att, sc);
        linear(xb, att, w[T_WO], w[T_BO], n, QD, D); /* (n, QD) @ wo^T -> (n, dim) */
        for (size_t i = 0; i < n * D; i++)
            X[i] += xb[i];
        for (size_t r = 0; r < n; r++)
            rmsnorm(xb + r * D, X + r * D, w[T_FNORM], D, c->norm_eps);
        linear(h1, xb, w[T_GATE], NULL, n, D, F); /* (n, dim) @ w1^T -> (n, hidden) */
        linear(h3, xb, w[T_UP], NULL, n, D, F);
        for (size_t i = 0; i < n * F; i++)
            h1[i] = h1[i] / (1.0f + expf(-h1[i])) * h3[i];
        linear(xb, h1, w[T_DOWN], NULL, n, F, D); /* (n, hidden) @ w2^T -> (n, dim) */
        for (size_t i = 0; i < n * D; i++)
            X[i] += xb[i];
        if (progress && progress(user, ++*done, total))
            st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    }
    free(xb), free(q), free(kv), free(att), free(h1), free(h3), free(sc);
    for (int k = 0; k < T_PER_LAYER; k++)
        free(buf[k]);
    return st;
}

/* Token embeddings of rows: X (n, dim). */
static stz_status embed(stz_fwd *m, const int32_t *tok, size_t n, float *X, stz_err *err)
{
    for (size_t r = 0; r < n; r++) {
        if (tok[r] < 0 || (uint32_t)tok[r] >= m->c.vocab)
            return stz_err_set(err, STZ_E_ARG, "%s: token id %d is outside the vocabulary [0, %u)", m->label, tok[r],
                               m->c.vocab);
        stz_status st = read_rows(m, m->global[G_EMBED], (uint64_t)tok[r], 1, X + r * m->c.dim, err);
        if (st)
            return st;
    }
    return STZ_OK;
}

/* Final norm in place, then logits (n, vocab) = X (n, dim) @ head (vocab, dim)^T,
 * the head read in slices so it is never whole in memory. */
static stz_status head(stz_fwd *m, float *X, size_t n, float *logits, stz_err *err)
{
    size_t D = m->c.dim, V = m->c.vocab, step = (1u << 22) / D ? (1u << 22) / D : 1;
    float *nw = malloc(D * sizeof *nw), *w = malloc((step < V ? step : V) * D * sizeof *w);
    stz_status st = !nw || !w ? stz_err_set(err, STZ_E_NOMEM, "out of memory") : STZ_OK;
    if (!st)
        st = read_rows(m, m->global[G_NORM], 0, 1, nw, err);
    for (size_t r = 0; !st && r < n; r++)
        rmsnorm(X + r * D, X + r * D, nw, D, m->c.norm_eps);
    /* logits (n, V) = X (n, dim) @ head (V, dim)^T, a slice of the vocabulary at a time */
    for (size_t v0 = 0; !st && v0 < V; v0 += step) {
        size_t k = V - v0 < step ? V - v0 : step;
        const float *h = m->keep_head ? m->keep_head + v0 * D : w;
        if (m->keep_head || !(st = read_rows(m, m->global[G_HEAD], v0, k, w, err)))
            linear_ld(logits + v0, V, X, h, NULL, n, D, k);
    }
    for (size_t i = 0; !st && i < n * V; i++)
        if (!isfinite(logits[i]))
            st = stz_err_set(err, STZ_E_NUMERIC, "%s: the logits at position %zu are not finite", m->label, i / V);
    free(nw), free(w);
    return st;
}

/* The rows of nseq sequences (lens[s] tokens each, stride apart) laid
 * out for the layers: position, sequence and token of each row, and one
 * layer's key/value cache. */
typedef struct {
    uint32_t *pos, *seq;
    int32_t *tok;
    float *k, *v;
    size_t nseq;
    batch b;
} seq_rows;

static void rows_free(seq_rows *R)
{
    free(R->pos), free(R->seq), free(R->tok), free(R->k), free(R->v);
    memset(R, 0, sizeof *R);
}

static stz_status rows_make(const stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                            seq_rows *R, stz_err *err)
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
        rows_free(R);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    for (size_t s = 0, r = 0; s < nseq; s++)
        for (size_t t = 0; t < lens[s]; t++, r++)
            R->pos[r] = (uint32_t)t, R->seq[r] = (uint32_t)s, R->tok[r] = tokens[s * stride + t];
    R->nseq = nseq;
    R->b = (batch){n, R->pos, R->seq, cap, R->k, R->v, 1};
    return STZ_OK;
}

/* Hidden states after every layer for all rows of nseq sequences (lens[s]
 * tokens each, stride apart); X gets sum(lens) rows. */
static stz_status hidden_states(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                                float *X, stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total,
                                stz_err *err)
{
    seq_rows R;
    stz_status st = rows_make(m, tokens, nseq, stride, lens, &R, err);
    if (!st && !(st = embed(m, R.tok, R.b.n, X, err)))
        st = run_layers(m, X, &R.b, nseq, 0, m->c.n_layers, progress, user, done, total, err);
    rows_free(&R);
    return st;
}

stz_status stz_fwd_logits(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t len, float *logits, stz_err *err)
{
    size_t *lens = malloc((nseq + 1) * sizeof *lens), n = nseq * len;
    float *X = malloc((n * m->c.dim + 1) * sizeof *X);
    uint64_t done = 0;
    stz_status st = !lens || !X ? stz_err_set(err, STZ_E_NOMEM, "out of memory") : STZ_OK;
    for (size_t s = 0; !st && s < nseq; s++)
        lens[s] = len;
    openblas_set_num_threads(m->threads);
    if (!st)
        st = hidden_states(m, tokens, nseq, len, lens, X, NULL, NULL, &done, 0, err);
    if (!st)
        st = head(m, X, n, logits, err);
    free(lens), free(X);
    return st;
}

/* ---- sampling ------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    double p;
    int32_t id;
} choice;

static int by_prob_desc(const void *a, const void *b)
{
    double x = ((const choice *)a)->p, y = ((const choice *)b)->p;
    return (x < y) - (x > y);
}

/* One token from logits: argmax at temperature 0, else softmax(l / T)
 * restricted to the smallest set of tokens holding top_p of the mass. */
static int32_t pick(const float *l, size_t V, double temperature, double top_p, uint64_t *rng, choice *c)
{
    size_t best = 0;
    for (size_t i = 1; i < V; i++)
        best = l[i] > l[best] ? i : best;
    if (temperature <= 0)
        return (int32_t)best;
    double sum = 0;
    for (size_t i = 0; i < V; i++)
        sum += c[i].p = exp((l[i] - l[best]) / temperature), c[i].id = (int32_t)i;
    /* tokens below (1 - top_p) / (V - 1) can never be in the nucleus (llama2.c's cut) */
    size_t n = 0;
    double cut = V > 1 ? (1 - top_p) / (double)(V - 1) : 0;
    for (size_t i = 0; i < V; i++)
        if (c[i].p / sum >= cut || top_p >= 1)
            c[n++] = (choice){c[i].p / sum, c[i].id};
    if (!n)
        return (int32_t)best;
    qsort(c, n, sizeof *c, by_prob_desc);
    double cum = 0;
    size_t last = n - 1;
    for (size_t i = 0; i < n; i++)
        if ((cum += c[i].p) > top_p) {
            last = i;
            break;
        }
    double mass = 0, u = (double)(rng_next(rng) >> 11) / 9007199254740992.0;
    for (size_t i = 0; i <= last; i++)
        mass += c[i].p;
    u *= mass, cum = 0;
    for (size_t i = 0; i <= last; i++)
        if ((cum += c[i].p) > u)
            return c[i].id;
    return c[last].id;
}

void stz_fwd_set_keep(stz_fwd *m, uint64_t bytes) { m->keep_budget = bytes; }

stz_status stz_fwd_sample(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                          int32_t *tokens, stz_fwd_progress progress, void *user, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    if (!nseq || !len)
        return STZ_OK;
    if (c->max_pos && len > c->max_pos)
        return stz_err_set(err, STZ_E_ARG, "%s: %zu tokens per sequence is more than the model's %u positions",
                           m->label, len, c->max_pos);
    if (c->sliding_window && len > c->sliding_window)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: %zu tokens is more than the sliding window of %u (not supported)",
                           m->label, len, c->sliding_window);
    size_t V = c->vocab, D = c->dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    uint64_t per_layer = 0;
    for (int k = 0; k < T_PER_LAYER; k++)
        if (m->layer[k].f >= 0)
            per_layer += tensor(m, m->layer[k])->numel * 4;
    m->keep_layers = per_layer ? (size_t)(m->keep_budget / per_layer) : c->n_layers;
    m->keep_layers = m->keep_layers > c->n_layers ? c->n_layers : m->keep_layers;
    m->keep = calloc(m->keep_layers * T_PER_LAYER + 1, sizeof *m->keep);
    uint64_t head_bytes = (uint64_t)c->vocab * c->dim * 4;
    if (m->keep_layers == c->n_layers && per_layer * c->n_layers + head_bytes <= m->keep_budget &&
        (m->keep_head = malloc(head_bytes)) && read_rows(m, m->global[G_HEAD], 0, c->vocab, m->keep_head, err)) {
        drop_kept(m);
        return err->code;
    }
    size_t kvn = (size_t)c->n_layers * nseq * len * KD;
    float *k = malloc((kvn + 1) * sizeof *k), *v = malloc((kvn + 1) * sizeof *v), *X = malloc(nseq * D * sizeof *X),
          *logits = malloc(nseq * V * sizeof *logits);
    uint32_t *pos = malloc(nseq * sizeof *pos), *seq = malloc(nseq * sizeof *seq);
    int32_t *tok = malloc(nseq * sizeof *tok);
    choice *cd = malloc(V * sizeof *cd);
    uint64_t *rng = malloc(nseq * sizeof *rng), done = 0, total = (uint64_t)(len - 1) * c->n_layers;
    stz_status st = !m->keep || !k || !v || !X || !logits || !pos || !seq || !tok || !cd || !rng
                        ? stz_err_set(err, STZ_E_NOMEM, "out of memory")
                        : STZ_OK;
    openblas_set_num_threads(m->threads);
    for (size_t s = 0; !st && s < nseq; s++)
        tokens[s * len] = c->bos, seq[s] = (uint32_t)s, rng[s] = seed ^ (0x632BE59BD9B4E019ull * (s + 1));
    for (size_t p = 0; !st && p + 1 < len; p++) {
        for (size_t s = 0; s < nseq; s++)
            pos[s] = (uint32_t)p, tok[s] = tokens[s * len + p];
        batch b = {nseq, pos, seq, len, k, v, c->n_layers};
        if ((st = embed(m, tok, nseq, X, err)) || (st = run_layers(m, X, &b, nseq, 0, c->n_layers, progress, user, &done, total, err)) ||
            (st = head(m, X, nseq, logits, err)))
            break;
        for (size_t s = 0; s < nseq; s++)
            tokens[s * len + p + 1] = pick(logits + s * V, V, temperature, top_p, &rng[s], cd);
    }
    drop_kept(m);
    free(k), free(v), free(X), free(logits), free(pos), free(seq), free(tok), free(cd), free(rng);
    return st;
}

/* ---- comparing two models ------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Running log-softmax statistics of one scored row, over vocabulary slices:
 * with m the largest logit so far, s = sum exp(l - m); for the original,
 * t = sum exp(la - ma) (la - lb), so KL = t / s - lse_a + lse_b. */
typedef struct {
    double ma, sa, ta, mb, sb, next_a, next_b;
    uint32_t arg_a, arg_b;
} row_stats;

/* Folds logits LA, LB (n rows x k, vocabulary ids v0..v0+k) into the rows' stats. */
static void fold_slice(row_stats *rs, const float *LA, const float *LB, size_t n, size_t k, size_t v0,
                       const int32_t *next)
{
    for (size_t r = 0; r < n; r++) {
        row_stats *x = &rs[r];
        const float *la = LA + r * k, *lb = LB + r * k;
        float mxa = la[0], mxb = lb[0];
        size_t ia = 0, ib = 0;
        for (size_t i = 1; i < k; i++) {
            if (la[i] > mxa)
                mxa = la[i], ia = i;
            if (lb[i] > mxb)
                mxb = lb[i], ib = i;
        }
        if (!v0 || mxa > x->ma) { /* rescale to the new maximum */
            double f = v0 ? exp(x->ma - mxa) : 0;
            x->sa *= f, x->ta *= f, x->ma = mxa, x->arg_a = (uint32_t)(v0 + ia);
        }
        if (!v0 || mxb > x->mb) {
            x->sb *= v0 ? exp(x->mb - mxb) : 0;
            x->mb = mxb, x->arg_b = (uint32_t)(v0 + ib);
        }
        double sa = 0, ta = 0, sb = 0;
        for (size_t i = 0; i < k; i++) {
            double e = exp((double)la[i] - x->ma);
            sa += e, ta += e * ((double)la[i] - lb[i]), sb += exp((double)lb[i] - x->mb);
        }
        x->sa += sa, x->ta += ta, x->sb += sb;
        if ((size_t)next[r] >= v0 && (size_t)next[r] < v0 + k)
            x->next_a = la[next[r] - v0], x->next_b = lb[next[r] - v0];
    }
}

/* Vocabulary entries per slice of the head for n scored rows. */
static size_t slice_step(size_t n, size_t D, size_t V)
{
    size_t step = ((size_t)8 << 20) / (n > D ? n : D);
    return step < 1 ? 1 : step > V ? V : step;
}

/* Final norm, then both heads streamed in vocabulary slices (each read
 * once) over the n scored rows XA, XB; stats into rs. */
static stz_status score_rows(stz_fwd *ref, stz_fwd *cand, float *XA, float *XB, size_t n, const int32_t *next,
                             row_stats *rs, stz_err *err)
{
    size_t D = ref->c.dim, V = ref->c.vocab, step = slice_step(n, D, V);
    float *na = malloc(D * sizeof *na), *nb = malloc(D * sizeof *nb), *W = malloc(step * D * sizeof *W),
          *LA = malloc(n * step * sizeof *LA), *LB = malloc(n * step * sizeof *LB);
    stz_status st = !na || !nb || !W || !LA || !LB ? stz_err_set(err, STZ_E_NOMEM, "out of memory") : STZ_OK;
    if (!st && !(st = read_rows(ref, ref->global[G_NORM], 0, 1, na, err)))
        st = read_rows(cand, cand->global[G_NORM], 0, 1, nb, err);
    for (size_t r = 0; !st && r < n; r++) {
        rmsnorm(XA + r * D, XA + r * D, na, D, ref->c.norm_eps);
        rmsnorm(XB + r * D, XB + r * D, nb, D, cand->c.norm_eps);
    }
    for (size_t v0 = 0; !st && v0 < V; v0 += step) {
        size_t k = V - v0 < step ? V - v0 : step;
        /* L (n, k) = X (n, dim) @ head[v0:v0+k] (k, dim)^T, for each model */
        if ((st = read_rows(ref, ref->global[G_HEAD], v0, k, W, err)))
            break;
        linear(LA, XA, W, NULL, n, D, k);
        if ((st = read_rows(cand, cand->global[G_HEAD], v0, k, W, err)))
            break;
        linear(LB, XB, W, NULL, n, D, k);
        for (size_t i = 0; i < n * k; i++)
            if (!isfinite(LA[i]) || !isfinite(LB[i])) {
                st = stz_err_set(err, STZ_E_NUMERIC, "%s: the logits at scored position %zu are not finite",
                                 isfinite(LA[i]) ? cand->label : ref->label, i / k + 1);
                break;
            }
        if (!st)
            fold_slice(rs, LA, LB, n, k, v0, next);
    }
    free(na), free(nb), free(W), free(LA), free(LB);
    return st;
}

/* The report over `scored` rows' stats; kl: scratch of scored doubles. */
static void report_from(const row_stats *rs, size_t scored, double *kl, stz_fwd_report *out)
{
    double sum = 0, sum2 = 0, nll_a = 0, nll_b = 0;
    size_t agree = 0;
    for (size_t r = 0; r < scored; r++) {
        const row_stats *x = &rs[r];
        double lse_a = x->ma + log(x->sa), lse_b = x->mb + log(x->sb), d = x->ta / x->sa - lse_a + lse_b;
        d = d < 0 ? 0 : d; /* rounding can leave -1e-17 for identical rows */
        kl[r] = d, sum += d, sum2 += d * d, agree += x->arg_a == x->arg_b;
        nll_a += lse_a - x->next_a, nll_b += lse_b - x->next_b;
    }
    double mean = sum / (double)scored, var = scored > 1 ? (sum2 - sum * mean) / (double)(scored - 1) : 0;
    qsort(kl, scored, sizeof *kl, cmp_double);
#define PCT(q) kl[(size_t)((q) * (double)(scored - 1) + 0.5)]
    *out = (stz_fwd_report){scored, mean, sqrt(var > 0 ? var : 0) / sqrt((double)scored), PCT(0.5), PCT(0.95),
                            PCT(0.99), kl[scored - 1], (double)agree / (double)scored,
                            exp(nll_a / (double)scored), exp(nll_b / (double)scored), 0};
#undef PCT
    out->ppl_change = out->ppl_cand / out->ppl_ref - 1;
}

stz_status stz_fwd_compare(stz_fwd *ref, stz_fwd *cand, const int32_t *tokens, size_t nseq, size_t stride,
                           const size_t *lens, stz_fwd_progress progress, void *user, stz_fwd_report *out,
                           stz_err *err)
{
    memset(out, 0, sizeof *out);
    const stz_fwd_config *a = &ref->c, *b = &cand->c;
    if (a->dim != b->dim || a->vocab != b->vocab || a->n_layers != b->n_layers || a->hidden != b->hidden)
        return stz_err_set(err, STZ_E_SHAPE, "%s and %s are not the same architecture (dim %u/%u, layers %u/%u, vocab %u/%u)",
                           ref->label, cand->label, a->dim, b->dim, a->n_layers, b->n_layers, a->vocab, b->vocab);
    size_t n = 0, D = a->dim;
    for (size_t s = 0; s < nseq; s++)
        n += lens[s];
    uint64_t done = 0, total = 2 * (uint64_t)a->n_layers + 1;
    float *XA = malloc((n * D + 1) * sizeof *XA), *XB = malloc((n * D + 1) * sizeof *XB);
    int32_t *next = malloc((n + 1) * sizeof *next);
    row_stats *rs = calloc(n + 1, sizeof *rs);
    double *kl = malloc((n + 1) * sizeof *kl);
    stz_status st = !XA || !XB || !next || !rs || !kl ? stz_err_set(err, STZ_E_NOMEM, "out of memory") : STZ_OK;
    openblas_set_num_threads(ref->threads);
    if (!st)
        st = hidden_states(ref, tokens, nseq, stride, lens, XA, progress, user, &done, total, err);
    openblas_set_num_threads(cand->threads);
    if (!st)
        st = hidden_states(cand, tokens, nseq, stride, lens, XB, progress, user, &done, total, err);
    /* keep the rows whose next token is given: token t of sequence s predicts t + 1 */
    size_t scored = 0;
    for (size_t s = 0, r = 0; !st && s < nseq; s++)
        for (size_t t = 0; t < lens[s]; t++, r++)
            if (t + 1 < lens[s]) {
                memmove(XA + scored * D, XA + r * D, D * sizeof *XA);
                memmove(XB + scored * D, XB + r * D, D * sizeof *XB);
                next[scored++] = tokens[s * stride + t + 1];
            }
    if (!st && !scored)
        st = stz_err_set(err, STZ_E_ARG, "no position to score: every sequence needs at least 2 tokens");
    if (!st)
        st = score_rows(ref, cand, XA, XB, scored, next, rs, err);
    if (!st && progress && progress(user, total, total))
        st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    if (!st)
        report_from(rs, scored, kl, out);
    free(XA), free(XB), free(next), free(rs), free(kl);
    return st;
}

/* ---- sensitivity ----------------------------------------------------------- */

#define MATS 7 /* the projections of a layer */
static const int mats[MATS] = {T_WQ, T_WK, T_WV, T_WO, T_GATE, T_UP, T_DOWN};

/* State of stz_fwd_probe_run: the rows once (R) and MATS times over (W, one
 * copy of every sequence per stream, for the runs that perturb each
 * matrix of a layer, taken through the later layers together). */
typedef struct {
    stz_fwd *m;
    const stz_fwd_probe *probe;
    seq_rows R, W;
    size_t n, scored, *idx; /* rows; scored rows and their index */
    int32_t *next;
    float *X, *P, *S, *store; /* layer input; streams; their scored rows; the reference logits */
    row_stats *rs;
    double *kl;
    stz_fwd_progress progress;
    void *user;
    uint64_t done, total;
} probe_state;

/* Final norm of the `ns` streams of scored rows in ps->S, then the head in
 * vocabulary slices, each slice read once for all streams. fill (one
 * stream, unperturbed): the logits are stored (scored x vocab); else each
 * stream's are folded against them (as the original's) into its rows'
 * stats. */
static stz_status head_streams(probe_state *ps, size_t ns, int fill, stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t D = m->c.dim, V = m->c.vocab, n = ps->scored, rows = ns * n, step = slice_step(rows, D, V);
    float *nw = malloc(D * sizeof *nw), *W = malloc(step * D * sizeof *W), *L = malloc(rows * step * sizeof *L),
          *A = malloc(n * step * sizeof *A);
    stz_status st = !nw || !W || !L || !A ? stz_err_set(err, STZ_E_NOMEM, "out of memory") : STZ_OK;
    if (!st)
        st = read_rows(m, m->global[G_NORM], 0, 1, nw, err);
    for (size_t r = 0; !st && r < rows; r++)
        rmsnorm(ps->S + r * D, ps->S + r * D, nw, D, m->c.norm_eps);
    memset(ps->rs, 0, rows * sizeof *ps->rs);
    for (size_t v0 = 0; !st && v0 < V; v0 += step) {
        size_t k = V - v0 < step ? V - v0 : step;
        if ((st = read_rows(m, m->global[G_HEAD], v0, k, W, err)))
            break;
        linear(L, ps->S, W, NULL, rows, D, k);
        for (size_t i = 0; i < rows * k; i++)
            if (!isfinite(L[i])) {
                st = stz_err_set(err, STZ_E_NUMERIC, "%s: the logits at scored position %zu are not finite%s",
                                 m->label, i / k % n + 1, fill ? "" : " once a matrix is perturbed");
                break;
            }
        for (size_t r = 0; !st && r < n; r++) /* this slice of the stored logits, or into the store */
            if (fill)
                memcpy(ps->store + r * V + v0, L + r * k, k * sizeof *L);
            else
                memcpy(A + r * k, ps->store + r * V + v0, k * sizeof *A);
        for (size_t s = 0; !st && !fill && s < ns; s++)
            fold_slice(ps->rs + s * n, A, L + s * n * k, n, k, v0, ps->next);
    }
    free(nw), free(W), free(L), free(A);
    if (!st && ps->progress && ps->progress(ps->user, ++ps->done, ps->total))
        st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    return st;
}

/* The `ns` streams in ps->P from layer l0 to the last, then the head; one
 * result per stream (names[s]), none with fill. */
static stz_status run_streams(probe_state *ps, size_t ns, uint32_t l0, const char *const *names, int fill,
                              stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t D = m->c.dim, n = ps->n;
    batch b = ns == 1 ? ps->R.b : ps->W.b;
    b.n = ns * n;
    stz_status st = run_layers(m, ps->P, &b, ns * ps->R.nseq, l0, m->c.n_layers, ps->progress, ps->user, &ps->done,
                               ps->total, err);
    for (size_t s = 0; !st && s < ns; s++)
        for (size_t i = 0; i < ps->scored; i++)
            memcpy(ps->S + (s * ps->scored + i) * D, ps->P + (s * n + ps->idx[i]) * D, D * sizeof *ps->S);
    if (!st)
        st = head_streams(ps, ns, fill, err);
    for (size_t s = 0; !st && !fill && s < ns; s++) {
        stz_fwd_report rep;
        report_from(ps->rs + s * ps->scored, ps->scored, ps->kl, &rep);
        ps->probe->result(ps->probe->user, names[s], rep.kl_mean);
    }
    return st;
}

stz_status stz_fwd_probe_run(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                             const stz_fwd_probe *probe, stz_fwd_progress progress, void *user, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    size_t D = c->dim, V = c->vocab, L = c->n_layers;
    loc emb = m->global[G_EMBED], hd = m->global[G_HEAD];
    int tied = hd.f == emb.f && hd.i == emb.i;
    probe_state ps = {.m = m, .probe = probe, .progress = progress, .user = user};
    int32_t *wide = malloc((MATS * nseq * stride + 1) * sizeof *wide);
    size_t *wlens = malloc((MATS * nseq + 1) * sizeof *wlens);
    stz_status st = wide && wlens ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (size_t k = 0; !st && k < MATS; k++) { /* every sequence once per stream */
        memcpy(wide + k * nseq * stride, tokens, nseq * stride * sizeof *wide);
        memcpy(wlens + k * nseq, lens, nseq * sizeof *wlens);
    }
    if (!st && !(st = rows_make(m, tokens, nseq, stride, lens, &ps.R, err)))
        st = rows_make(m, wide, MATS * nseq, stride, wlens, &ps.W, err);
    free(wide), free(wlens);
    size_t n = ps.n = ps.R.b.n;
    ps.idx = malloc((n + 1) * sizeof *ps.idx), ps.next = malloc((n + 1) * sizeof *ps.next);
    for (size_t s = 0, r = 0; !st && ps.idx && ps.next && s < nseq; s++) /* token t predicts token t + 1 */
        for (size_t t = 0; t < lens[s]; t++, r++)
            if (t + 1 < lens[s])
                ps.idx[ps.scored] = r, ps.next[ps.scored++] = tokens[s * stride + t + 1];
    size_t sc = ps.scored;
    ps.X = malloc((n * D + 1) * sizeof *ps.X), ps.P = malloc((MATS * n * D + 1) * sizeof *ps.P);
    ps.S = malloc((MATS * sc * D + 1) * sizeof *ps.S), ps.store = malloc((sc * V + 1) * sizeof *ps.store);
    ps.rs = calloc(MATS * sc + 1, sizeof *ps.rs), ps.kl = malloc((sc + 1) * sizeof *ps.kl);
    if (!st && (!ps.idx || !ps.next || !ps.X || !ps.P || !ps.S || !ps.store || !ps.rs || !ps.kl))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", n);
    else if (!st && !sc)
        st = stz_err_set(err, STZ_E_ARG, "no position to score: every sequence needs at least 2 tokens");
    /* progress in layers run, a head counting as one */
    const char *names[MATS];
    names[0] = st ? NULL : tensor(m, emb)->name;
    int want_emb = !st && probe->select(probe->user, names[0]);
    ps.total = L + 1 + (want_emb ? L + 1 : 0);
    for (size_t l = 0; !st && l < L; l++) {
        int any = 0;
        for (size_t k = 0; k < MATS; k++)
            if (probe->select(probe->user, tensor(m, m->layer[l * T_PER_LAYER + mats[k]])->name))
                ps.total += 1, any = 1;
        ps.total += any ? L - l - 1 + 1 + 1 : 1; /* the later layers and the head once; layer l itself */
    }
    if (!st && !tied && probe->select(probe->user, tensor(m, hd)->name))
        ps.total++;
    openblas_set_num_threads(m->threads);
    if (!st && !(st = embed(m, ps.R.tok, n, ps.P, err)))
        st = run_streams(&ps, 1, 0, NULL, 1, err); /* the reference */
    if (!st && want_emb) {
        m->probe = probe, m->probe_at = emb;
        if (!(st = embed(m, ps.R.tok, n, ps.P, err)))
            st = run_streams(&ps, 1, 0, names, 0, err);
        m->probe = NULL;
    }
    if (!st)
        st = embed(m, ps.R.tok, n, ps.X, err);
    for (size_t l = 0; !st && l < L; l++) {
        size_t ns = 0; /* layer l once per perturbed matrix, then all of them on together */
        for (size_t k = 0; !st && k < MATS; k++) {
            loc at = m->layer[l * T_PER_LAYER + mats[k]];
            if (!probe->select(probe->user, names[ns] = tensor(m, at)->name))
                continue;
            float *Pk = ps.P + ns++ * n * D;
            memcpy(Pk, ps.X, n * D * sizeof *Pk);
            m->probe = probe, m->probe_at = at;
            st = run_layers(m, Pk, &ps.R.b, nseq, (uint32_t)l, (uint32_t)l + 1, progress, user, &ps.done, ps.total,
                            err);
            m->probe = NULL;
        }
        if (!st && ns)
            st = run_streams(&ps, ns, (uint32_t)l + 1, names, 0, err);
        if (!st)
            st = run_layers(m, ps.X, &ps.R.b, nseq, (uint32_t)l, (uint32_t)l + 1, progress, user, &ps.done, ps.total,
                            err);
    }
    if (!st && !tied && probe->select(probe->user, names[0] = tensor(m, hd)->name)) {
        for (size_t i = 0; i < sc; i++)
            memcpy(ps.S + i * D, ps.X + ps.idx[i] * D, D * sizeof *ps.S);
        m->probe = probe, m->probe_at = hd;
        if (!(st = head_streams(&ps, 1, 0, err))) {
            stz_fwd_report rep;
            report_from(ps.rs, sc, ps.kl, &rep);
            probe->result(probe->user, names[0], rep.kl_mean);
        }
    }
    m->probe = NULL;
    rows_free(&ps.R), rows_free(&ps.W);
    free(ps.idx), free(ps.next), free(ps.X), free(ps.P), free(ps.S), free(ps.store), free(ps.rs), free(ps.kl);
    return st;
}
