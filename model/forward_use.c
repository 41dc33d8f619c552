/* Uses of the forward pass (see stz_forward.h): sampling, comparing two
 * models on the same tokens, and the per-matrix sensitivity probe. */
#include "forward_internal.h"

#include "core/stz_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* The radix sort's key: ascending keys are descending probabilities (a
 * positive double orders as its bits do). */
static uint64_t desc_key(double p)
{
    uint64_t k;
    memcpy(&k, &p, sizeof k);
    return ~k;
}

/* c[0..n) by probability, largest first, ties in the order given (ids
 * ascending): the order a stable sort gives, on any C library, by a
 * least-significant-digit radix sort of the keys through tmp (n more). */
static void sort_by_prob(choice *c, choice *tmp, size_t n)
{
    size_t count[8][256] = {{0}};
    for (size_t i = 0; i < n; i++)
        for (uint64_t k = desc_key(c[i].p), b = 0; b < 8; b++)
            count[b][(k >> (8 * b)) & 255]++;
    choice *from = c, *to = tmp;
    for (int b = 0; b < 8; b++) {
        size_t *at = count[b], sum = 0;
        if (at[(desc_key(from[0].p) >> (8 * b)) & 255] == n)
            continue; /* every key has this byte */
        for (int d = 0; d < 256; d++) {
            size_t k = at[d];
            at[d] = sum, sum += k;
        }
        for (size_t i = 0; i < n; i++)
            to[at[(desc_key(from[i].p) >> (8 * b)) & 255]++] = from[i];
        choice *t = from;
        from = to, to = t;
    }
    if (from != c)
        memcpy(c, from, n * sizeof *c);
}

/* One token from logits: argmax at temperature 0, else softmax(l / T)
 * restricted to the smallest set of tokens holding top_p of the mass;
 * c holds 2 V choices. */
static int32_t pick(const float *l, size_t V, double temperature, double top_p, uint64_t *rng, choice *c)
{
    size_t best = 0;
    for (size_t i = 1; i < V; i++)
        best = l[i] > l[best] ? i : best;
    if (temperature <= 0)
        return (int32_t)best;
    double sum = 0;
    for (size_t i = 0; i < V; i++)
        sum += c[i].p = stz_exp((l[i] - l[best]) / temperature), c[i].id = (int32_t)i;
    /* tokens below (1 - top_p) / (V - 1) can never be in the nucleus (llama2.c's cut) */
    size_t n = 0;
    double cut = V > 1 ? (1 - top_p) / (double)(V - 1) : 0;
    for (size_t i = 0; i < V; i++)
        if (c[i].p / sum >= cut || top_p >= 1)
            c[n++] = (choice){c[i].p / sum, c[i].id};
    if (!n)
        return (int32_t)best;
    sort_by_prob(c, c + V, n);
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

/* 1 if the sequences drawn before hold these as their first nseq x len:
 * the same draw (each sequence's tokens depend on its seed, not on how many
 * sequences or tokens are drawn), nothing observing or perturbing the pass. */
static int drawn_covers(const stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p)
{
    return m->drawn.tok && nseq <= m->drawn.nseq && len <= m->drawn.len && seed == m->drawn.seed &&
           temperature == m->drawn.temperature && top_p == m->drawn.top_p && !m->hooks;
}

/* 1 when a hook changes the weights as they are read. */
static int perturbed(const stz_fwd *m)
{
    for (const stz_fwd_hook *h = m->hooks; h; h = h->next)
        if (h->weights)
            return 1;
    return 0;
}

/* Keeps what an unperturbed pass drew, when it covers what was kept. */
static void drawn_keep(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                       const int32_t *tokens)
{
    int32_t *t;
    if (perturbed(m) || (m->drawn.tok && (nseq < m->drawn.nseq || len < m->drawn.len)) ||
        !(t = malloc(nseq * len * sizeof *t)))
        return; /* without it, the next draw samples again */
    free(m->drawn.tok);
    m->drawn.tok = memcpy(t, tokens, nseq * len * sizeof *t);
    m->drawn.nseq = nseq, m->drawn.len = len, m->drawn.seed = seed;
    m->drawn.temperature = temperature, m->drawn.top_p = top_p;
}

static stz_status draw(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                       int32_t *tokens, stz_fwd_progress progress, void *user, stz_err *err);

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
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: %zu tokens is more than the sliding window of %u (not supported)", m->label, len,
                           c->sliding_window);
    if (drawn_covers(m, nseq, len, seed, temperature, top_p)) {
        for (size_t s = 0; s < nseq; s++)
            memcpy(tokens + s * len, m->drawn.tok + s * m->drawn.len, len * sizeof *tokens);
        return STZ_OK; /* no pass, no progress to show */
    }
    stz_status st = draw(m, nseq, len, seed, temperature, top_p, tokens, progress, user, err);
    m->step = 0;
    if (!st)
        drawn_keep(m, nseq, len, seed, temperature, top_p, tokens);
    return st;
}

/* Sequences drawn together: the nseq in as few groups of about equal size
 * as keep their key/value cache (kv_seq bytes each) within the budget. */
static size_t group_size(const stz_fwd *m, size_t nseq, uint64_t kv_seq)
{
    uint64_t fit = m->keep_budget / kv_seq;
    size_t groups = fit >= nseq ? 1 : fit ? (size_t)((nseq + fit - 1) / fit) : nseq;
    return (nseq + groups - 1) / groups;
}

/* The layers (and the head, when every layer is) kept as F32 in what the
 * budget leaves beside a group's cache of kv bytes. */
static stz_status keep_plan(stz_fwd *m, uint64_t kv, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    uint64_t per_layer = 0, left = m->keep_budget > kv ? m->keep_budget - kv : 0;
    uint64_t head_bytes = (uint64_t)c->vocab * c->dim * 4;
    for (int k = 0; k < STZ_ROLE_PER_LAYER; k++)
        if (m->layer[k].f >= 0)
            per_layer += stz_forward_tensor(m, m->layer[k])->numel * 4;
    m->keep_layers = per_layer ? (size_t)(left / per_layer) : c->n_layers;
    m->keep_layers = m->keep_layers > c->n_layers ? c->n_layers : m->keep_layers;
    if (!(m->keep = calloc(m->keep_layers * STZ_ROLE_PER_LAYER + 1, sizeof *m->keep)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the sampling buffers");
    if (m->keep_layers == c->n_layers && per_layer * c->n_layers + head_bytes <= left &&
        (m->keep_head = malloc(head_bytes)))
        return stz_forward_read_rows(m, m->global[G_HEAD], 0, c->vocab, m->keep_head, err);
    return STZ_OK;
}

/* The sampling buffers of a group of up to nseq sequences of len tokens. */
typedef struct {
    float *k, *v, *X, *logits;
    uint32_t *pos, *seq;
    int32_t *tok;
    choice *cd;
    uint64_t *rng;
} draw_bufs;

static void draw_free(draw_bufs *b)
{
    free(b->k), free(b->v), free(b->X), free(b->logits), free(b->pos), free(b->seq), free(b->tok), free(b->cd);
    free(b->rng);
}

/* Floats of one sequence's keys (or values) of len tokens in every layer. */
static size_t kv_floats(const stz_fwd_config *c, size_t len)
{
    return (size_t)c->n_layers * len * c->n_kv_heads * c->head_dim;
}

static stz_status draw_alloc(const stz_fwd *m, size_t nseq, size_t len, draw_bufs *b, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    size_t V = c->vocab, D = c->dim, kvn = nseq * kv_floats(c, len);
    b->k = malloc((kvn + 1) * sizeof *b->k), b->v = malloc((kvn + 1) * sizeof *b->v);
    b->X = malloc(nseq * D * sizeof *b->X), b->logits = malloc(nseq * V * sizeof *b->logits);
    b->pos = malloc(nseq * sizeof *b->pos), b->seq = malloc(nseq * sizeof *b->seq);
    b->tok = malloc(nseq * sizeof *b->tok), b->cd = malloc(2 * V * sizeof *b->cd);
    b->rng = malloc(nseq * sizeof *b->rng);
    if (!b->k || !b->v || !b->X || !b->logits || !b->pos || !b->seq || !b->tok || !b->cd || !b->rng)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the sampling buffers");
    return STZ_OK;
}

/* Sequences s0..s0+n-1 (rows of tokens) drawn step by step in buffers b. */
static stz_status draw_group(stz_fwd *m, size_t s0, size_t n, size_t len, uint64_t seed, double temperature,
                             double top_p, int32_t *tokens, draw_bufs *B, stz_fwd_progress progress, void *user,
                             uint64_t *done, uint64_t total, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    size_t V = c->vocab;
    stz_status st = STZ_OK;
    for (size_t s = 0; s < n; s++) {
        size_t g = s0 + s; /* a sequence's draw depends on its index alone */
        tokens[g * len] = c->bos, B->seq[s] = (uint32_t)s, B->rng[s] = seed ^ (0x632BE59BD9B4E019ull * (g + 1));
    }
    for (size_t p = 0; !st && p + 1 < len; p++) {
        m->step = p + 1;
        for (size_t s = 0; s < n; s++)
            B->pos[s] = (uint32_t)p, B->tok[s] = tokens[(s0 + s) * len + p];
        batch b = {n, B->pos, B->seq, len, B->k, B->v, c->n_layers};
        if ((st = stz_forward_embed(m, B->tok, B->pos, n, B->X, err)) ||
            (st = stz_forward_run_layers(m, B->X, &b, n, 0, c->n_layers, progress, user, done, total, err)) ||
            (st = stz_forward_head(m, B->X, n, B->logits, err)))
            break;
        for (size_t s = 0; s < n; s++)
            tokens[(s0 + s) * len + p + 1] = pick(B->logits + s * V, V, temperature, top_p, &B->rng[s], B->cd);
    }
    return st;
}

/* stz_fwd_sample's sampling, in groups of sequences whose key/value cache
 * fits the budget, layers kept in what it leaves; m->step says which token
 * each step draws (hooks observing the first `tokens` only stop there). */
static stz_status draw(stz_fwd *m, size_t nseq, size_t len, uint64_t seed, double temperature, double top_p,
                       int32_t *tokens, stz_fwd_progress progress, void *user, stz_err *err)
{
    const stz_fwd_config *c = &m->c;
    uint64_t kv_seq = (uint64_t)kv_floats(c, len) * 2 * sizeof(float); /* keys and values */
    size_t G = group_size(m, nseq, kv_seq), groups = (nseq + G - 1) / G;
    uint64_t done = 0, total = (uint64_t)(len - 1) * c->n_layers * groups;
    draw_bufs B = {0};
    stz_status st = keep_plan(m, kv_seq * G, err);
    if (!st)
        st = draw_alloc(m, G, len, &B, err);
    for (size_t s0 = 0; !st && s0 < nseq; s0 += G)
        st = draw_group(m, s0, nseq - s0 < G ? nseq - s0 : G, len, seed, temperature, top_p, tokens, &B, progress, user,
                        &done, total, err);
    stz_forward_drop_kept(m);
    draw_free(&B);
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
STZ_CLONES("arch=x86-64-v4", "avx2", "default")
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
            double f = v0 ? stz_exp(x->ma - mxa) : 0;
            x->sa *= f, x->ta *= f, x->ma = mxa, x->arg_a = (uint32_t)(v0 + ia);
        }
        if (!v0 || mxb > x->mb) {
            x->sb *= v0 ? stz_exp(x->mb - mxb) : 0;
            x->mb = mxb, x->arg_b = (uint32_t)(v0 + ib);
        }
        double sa = 0, ta = 0, sb = 0, ma = x->ma, mb = x->mb, ea[64], eb[64];
        for (size_t i0 = 0; i0 < k; i0 += 64) {
            size_t m = k - i0 < 64 ? k - i0 : 64;
            for (size_t i = 0; i < m; i++) /* vectorised; the sums below keep their order */
                ea[i] = stz_exp((double)la[i0 + i] - ma), eb[i] = stz_exp((double)lb[i0 + i] - mb);
            for (size_t i = 0; i < m; i++)
                sa += ea[i], ta += ea[i] * ((double)la[i0 + i] - lb[i0 + i]), sb += eb[i];
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

/* Final norm, then both heads streamed in vocabulary slices over the n
 * scored rows XA, XB, in pieces of at most dim rows (each head read once a
 * piece); stats into rs. The slices depend on the model alone, so a row's
 * figures do not depend on the rows beside it. */
static stz_status score_rows(stz_fwd *ref, stz_fwd *cand, float *XA, float *XB, size_t n, const int32_t *next,
                             row_stats *rs, stz_err *err)
{
    size_t D = ref->c.dim, V = ref->c.vocab, step = slice_step(D, D, V);
    float *W = malloc(step * D * sizeof *W), *LA = malloc(D * step * sizeof *LA), *LB = malloc(D * step * sizeof *LB);
    stz_status st =
        !W || !LA || !LB ? stz_err_set(err, STZ_E_NOMEM, "out of memory for the output-layer slices") : STZ_OK;
    if (!st && !(st = stz_forward_out_norm(ref, XA, n, err)))
        st = stz_forward_out_norm(cand, XB, n, err);
    for (size_t r0 = 0; !st && r0 < n; r0 += D) {
        size_t m = n - r0 < D ? n - r0 : D;
        const float *xa = XA + r0 * D, *xb = XB + r0 * D;
        for (size_t v0 = 0; !st && v0 < V; v0 += step) {
            size_t k = V - v0 < step ? V - v0 : step;
            /* L (m, k) = X (m, dim) @ head[v0:v0+k] (k, dim)^T, for each model */
            if ((st = stz_forward_read_rows(ref, ref->global[G_HEAD], v0, k, W, err)))
                break;
            stz_forward_linear(ref, LA, xa, W, NULL, m, D, k);
            stz_forward_cap_logits(ref, LA, m, k, k);
            if ((st = stz_forward_read_rows(cand, cand->global[G_HEAD], v0, k, W, err)))
                break;
            stz_forward_linear(cand, LB, xb, W, NULL, m, D, k);
            stz_forward_cap_logits(cand, LB, m, k, k);
            for (size_t i = 0; i < m * k; i++)
                if (!isfinite(LA[i]) || !isfinite(LB[i])) {
                    st = stz_err_set(err, STZ_E_NUMERIC, "%s: the logits at scored position %zu are not finite",
                                     isfinite(LA[i]) ? cand->label : ref->label, r0 + i / k + 1);
                    break;
                }
            if (!st)
                fold_slice(rs + r0, LA, LB, m, k, v0, next + r0);
        }
    }
    free(W), free(LA), free(LB);
    return st;
}

/* The report over `scored` rows' stats; kl: scratch of scored doubles. */
static void report_from(const row_stats *rs, size_t scored, double *kl, stz_fwd_report *out)
{
    double sum = 0, sum2 = 0, nll_a = 0, nll_b = 0;
    size_t agree = 0;
    for (size_t r = 0; r < scored; r++) {
        const row_stats *x = &rs[r];
        double lse_a = x->ma + stz_log(x->sa), lse_b = x->mb + stz_log(x->sb), d = x->ta / x->sa - lse_a + lse_b;
        d = d < 0 ? 0 : d; /* rounding can leave -1e-17 for identical rows */
        kl[r] = d, sum += d, sum2 += d * d, agree += x->arg_a == x->arg_b;
        nll_a += lse_a - x->next_a, nll_b += lse_b - x->next_b;
    }
    double mean = sum / (double)scored, var = scored > 1 ? (sum2 - sum * mean) / (double)(scored - 1) : 0;
    qsort(kl, scored, sizeof *kl, cmp_double);
#define PCT(q) kl[(size_t)((q) * (double)(scored - 1) + 0.5)]
    *out = (stz_fwd_report){scored,
                            mean,
                            sqrt(var > 0 ? var : 0) / sqrt((double)scored),
                            PCT(0.5),
                            PCT(0.95),
                            PCT(0.99),
                            kl[scored - 1],
                            (double)agree / (double)scored,
                            stz_exp(nll_a / (double)scored),
                            stz_exp(nll_b / (double)scored),
                            0};
#undef PCT
    out->ppl_change = out->ppl_cand / out->ppl_ref - 1;
}

/* Positions run through both models at once: memory bounded whatever the tokens. */
#define COMPARE_ROWS 2048

/* One batch, sequences [s0, s1) (rows positions) from tok on: both
 * models' hidden states, the rows whose next token is given (token t of
 * sequence s predicts t + 1) scored into rs from *scored on. */
static stz_status compare_batch(stz_fwd *ref, stz_fwd *cand, const int32_t *tok, size_t s0, size_t s1, size_t stride,
                                const size_t *lens, float *XA, float *XB, int32_t *next, row_stats *rs, size_t *scored,
                                stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total, stz_err *err)
{
    size_t D = ref->c.dim, first = *scored, kept = 0;
    stz_status st =
        stz_forward_hidden_states(ref, tok, s1 - s0, stride, lens + s0, XA, progress, user, done, total, err);
    if (!st)
        st = stz_forward_hidden_states(cand, tok, s1 - s0, stride, lens + s0, XB, progress, user, done, total, err);
    for (size_t s = s0, r = 0, at = 0; !st && s < s1; at = stz_seq_next(at, stride, lens[s]), s++)
        for (size_t t = 0; t < lens[s]; t++, r++)
            if (t + 1 < lens[s]) {
                memmove(XA + kept * D, XA + r * D, D * sizeof *XA);
                memmove(XB + kept * D, XB + r * D, D * sizeof *XB);
                next[first + kept++] = tok[at + t + 1];
            }
    if (!st && kept)
        st = score_rows(ref, cand, XA, XB, kept, next + first, rs + first, err);
    *scored = first + kept, ++*done;
    if (!st && progress && progress(user, *done, total))
        st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    return st;
}

stz_status stz_fwd_compare(stz_fwd *ref, stz_fwd *cand, const int32_t *tokens, size_t nseq, size_t stride,
                           const size_t *lens, stz_fwd_progress progress, void *user, stz_fwd_report *out, stz_err *err)
{
    memset(out, 0, sizeof *out);
    const stz_fwd_config *a = &ref->c, *b = &cand->c;
    if (a->dim != b->dim || a->vocab != b->vocab || a->n_layers != b->n_layers || a->hidden != b->hidden)
        return stz_err_set(err, STZ_E_SHAPE,
                           "%s and %s are not the same architecture (dim %u/%u, layers %u/%u, vocab %u/%u)", ref->label,
                           cand->label, a->dim, b->dim, a->n_layers, b->n_layers, a->vocab, b->vocab);
    size_t n = 0, most = 0, batches = 0, D = a->dim, rows;
    for (size_t s = 0; s<nseq; n += rows, most = rows> most ? rows : most, batches++)
        s = stz_forward_batch_end(lens, nseq, s, COMPARE_ROWS, &rows);
    uint64_t done = 0, total = batches * (2 * (uint64_t)a->n_layers + 1);
    float *XA = malloc((most * D + 1) * sizeof *XA), *XB = malloc((most * D + 1) * sizeof *XB);
    int32_t *next = malloc((n + 1) * sizeof *next);
    row_stats *rs = calloc(n + 1, sizeof *rs);
    double *kl = malloc((n + 1) * sizeof *kl);
    stz_status st = !XA || !XB || !next || !rs || !kl
                        ? stz_err_set(err, STZ_E_NOMEM, "out of memory for the activations and scores")
                        : STZ_OK;
    size_t scored = 0, at = 0;
    for (size_t s0 = 0, s1; !st && s0 < nseq; s0 = s1) {
        s1 = stz_forward_batch_end(lens, nseq, s0, COMPARE_ROWS, NULL);
        st = compare_batch(ref, cand, tokens + at, s0, s1, stride, lens, XA, XB, next, rs, &scored, progress, user,
                           &done, total, err);
        at = stz_seq_skip(at, stride, lens, s0, s1);
    }
    if (!st && !scored)
        st = stz_err_set(err, STZ_E_ARG, "no position to score: every sequence needs at least 2 tokens");
    if (!st)
        report_from(rs, scored, kl, out);
    free(XA), free(XB), free(next), free(rs), free(kl);
    return st;
}

/* ---- sensitivity ----------------------------------------------------------- */

#define MATS 7 /* the most projections a layer has */
static const int mats[] = {STZ_ROLE_WQ,   STZ_ROLE_WK, STZ_ROLE_WV,      STZ_ROLE_WQKV, STZ_ROLE_WO,
                           STZ_ROLE_GATE, STZ_ROLE_UP, STZ_ROLE_GATE_UP, STZ_ROLE_DOWN}; /* a family has some */
#define NMATS (sizeof mats / sizeof *mats)

/* State of stz_fwd_probe_run: the rows once (R) and MATS times over (W, one
 * copy of every sequence per stream, for the runs that perturb each
 * matrix of a layer, taken through the later layers together). */
typedef struct {
    stz_fwd *m;
    const stz_fwd_probe *probe;
    stz_fwd_hook hook; /* probe->perturb on the tensor at `at` as it is read */
    loc at;
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

#define NOWHERE ((loc){-1, 0})

static int probe_weights(stz_fwd_hook *h, const stz_fwd *m, loc at, float *rows, uint64_t r0, size_t n, size_t cols)
{
    const probe_state *ps = h->user;
    if (at.f != ps->at.f || at.i != ps->at.i)
        return 0;
    return ps->probe->perturb(ps->probe->user, stz_forward_tensor(m, at)->name, rows, r0, n, cols);
}

/* The probe perturbing the tensor at `at` from now on (at.f < 0: none). */
static void probe_at(probe_state *ps, loc at)
{
    ps->at = at;
    if (at.f < 0)
        stz_forward_detach(ps->m, &ps->hook);
    else
        stz_forward_attach(ps->m, &ps->hook);
}

/* Final norm of the `ns` streams of scored rows in ps->S, then the head in
 * vocabulary slices, each slice read once for all streams. fill (one
 * stream, unperturbed): the logits are stored (scored x vocab); else each
 * stream's are folded against them (as the original's) into its rows'
 * stats. */
static stz_status head_streams(probe_state *ps, size_t ns, int fill, stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t D = m->c.dim, V = m->c.vocab, n = ps->scored, rows = ns * n, step = slice_step(rows, D, V);
    float *W = malloc(step * D * sizeof *W), *L = malloc(rows * step * sizeof *L), *A = malloc(n * step * sizeof *A);
    stz_status st =
        !W || !L || !A ? stz_err_set(err, STZ_E_NOMEM, "out of memory for the output-layer slices") : STZ_OK;
    if (!st)
        st = stz_forward_out_norm(m, ps->S, rows, err);
    memset(ps->rs, 0, rows * sizeof *ps->rs);
    for (size_t v0 = 0; !st && v0 < V; v0 += step) {
        size_t k = V - v0 < step ? V - v0 : step;
        if ((st = stz_forward_read_rows(m, m->global[G_HEAD], v0, k, W, err)))
            break;
        stz_forward_linear(m, L, ps->S, W, NULL, rows, D, k);
        stz_forward_cap_logits(m, L, rows, k, k);
        for (size_t i = 0; i < rows * k; i++)
            if (!isfinite(L[i])) {
                st = stz_err_set(err, STZ_E_NUMERIC, "%s: the logits at scored position %zu are not finite%s", m->label,
                                 i / k % n + 1, fill ? "" : " once a matrix is perturbed");
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
    free(W), free(L), free(A);
    if (!st && ps->progress && ps->progress(ps->user, ++ps->done, ps->total))
        st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    return st;
}

/* The `ns` streams in ps->P from layer l0 to the last, then the head; one
 * result per stream (names[s]), none with fill. */
static stz_status run_streams(probe_state *ps, size_t ns, uint32_t l0, const char *const *names, int fill, stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t D = m->c.dim, n = ps->n;
    batch b = ns == 1 ? ps->R.b : ps->W.b;
    b.n = ns * n;
    stz_status st = stz_forward_run_layers(m, ps->P, &b, ns * ps->R.nseq, l0, m->c.n_layers, ps->progress, ps->user,
                                           &ps->done, ps->total, err);
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

/* The rows once (R) and MATS times over (W), the scored positions (token t
 * predicts token t + 1) and the buffers. */
static stz_status probe_setup(probe_state *ps, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                              stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t D = m->c.dim, V = m->c.vocab, all = stz_seq_skip(0, stride, lens, 0, nseq); /* tokens of the layout */
    int32_t *wide = malloc((MATS * all + 1) * sizeof *wide);
    size_t *wlens = malloc((MATS * nseq + 1) * sizeof *wlens);
    stz_status st = wide && wlens ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the probe's sequences");
    for (size_t k = 0; !st && k < MATS; k++) { /* every sequence once per stream */
        memcpy(wide + k * all, tokens, all * sizeof *wide);
        memcpy(wlens + k * nseq, lens, nseq * sizeof *wlens);
    }
    if (!st && !(st = stz_forward_rows_make(m, tokens, nseq, stride, lens, &ps->R, err)))
        st = stz_forward_rows_make(m, wide, MATS * nseq, stride, wlens, &ps->W, err);
    free(wide), free(wlens);
    size_t n = ps->n = ps->R.b.n;
    ps->idx = malloc((n + 1) * sizeof *ps->idx), ps->next = malloc((n + 1) * sizeof *ps->next);
    for (size_t s = 0, r = 0, at = 0; !st && ps->idx && ps->next && s < nseq;
         at = stz_seq_next(at, stride, lens[s]), s++)
        for (size_t t = 0; t < lens[s]; t++, r++)
            if (t + 1 < lens[s])
                ps->idx[ps->scored] = r, ps->next[ps->scored++] = tokens[at + t + 1];
    size_t sc = ps->scored;
    ps->X = malloc((n * D + 1) * sizeof *ps->X), ps->P = malloc((MATS * n * D + 1) * sizeof *ps->P);
    ps->S = malloc((MATS * sc * D + 1) * sizeof *ps->S), ps->store = malloc((sc * V + 1) * sizeof *ps->store);
    ps->rs = calloc(MATS * sc + 1, sizeof *ps->rs), ps->kl = malloc((sc + 1) * sizeof *ps->kl);
    if (!st && (!ps->idx || !ps->next || !ps->X || !ps->P || !ps->S || !ps->store || !ps->rs || !ps->kl))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", n);
    else if (!st && !sc)
        st = stz_err_set(err, STZ_E_ARG, "no position to score: every sequence needs at least 2 tokens");
    return st;
}

/* The embedding's runs: once per variant. */
static size_t emb_runs(const stz_fwd_probe *probe) { return probe->variants > 1 ? probe->variants : 1; }

/* Progress units: layers run, a head counting as one; *walk: whether the
 * layers must be walked (a layer matrix, or a separate head, selected). */
static uint64_t probe_total(const stz_fwd *m, const stz_fwd_probe *probe, int want_emb, int want_pos, int want_head,
                            int *walk)
{
    size_t L = m->c.n_layers;
    uint64_t total = L + 1 + (want_emb ? emb_runs(probe) * (L + 1) : 0) + (want_pos ? L + 1 : 0);
    *walk = want_head;
    for (size_t l = 0; l < L; l++) {
        int any = 0;
        for (size_t k = 0; k < NMATS; k++)
            if (m->layer[l * STZ_ROLE_PER_LAYER + mats[k]].f >= 0 &&
                probe->select(probe->user, stz_forward_tensor(m, m->layer[l * STZ_ROLE_PER_LAYER + mats[k]])->name))
                total += 1, any = 1, *walk = 1;
        total += any ? L - l - 1 + 1 : 0; /* the later layers and the head once */
    }
    return total + (*walk ? L : 0) + want_head; /* each layer itself, walked once */
}

/* Layer by layer: layer l once per selected matrix with that matrix
 * perturbed, those streams run to the head, then layer l unperturbed. */
static stz_status probe_layers(probe_state *ps, size_t nseq, const char **names, stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t n = ps->n, D = m->c.dim;
    const stz_fwd_probe *probe = ps->probe;
    stz_status st = STZ_OK;
    for (size_t l = 0; !st && l < m->c.n_layers; l++) {
        size_t ns = 0; /* layer l once per perturbed matrix, then all of them on together */
        for (size_t k = 0; !st && k < NMATS; k++) {
            loc at = m->layer[l * STZ_ROLE_PER_LAYER + mats[k]];
            if (at.f < 0 || !probe->select(probe->user, names[ns] = stz_forward_tensor(m, at)->name))
                continue;
            float *Pk = ps->P + ns++ * n * D;
            memcpy(Pk, ps->X, n * D * sizeof *Pk);
            probe_at(ps, at);
            st = stz_forward_run_layers(m, Pk, &ps->R.b, nseq, (uint32_t)l, (uint32_t)l + 1, ps->progress, ps->user,
                                        &ps->done, ps->total, err);
            probe_at(ps, NOWHERE);
        }
        if (!st && ns)
            st = run_streams(ps, ns, (uint32_t)l + 1, names, 0, err);
        if (!st)
            st = stz_forward_run_layers(m, ps->X, &ps->R.b, nseq, (uint32_t)l, (uint32_t)l + 1, ps->progress, ps->user,
                                        &ps->done, ps->total, err);
    }
    return st;
}

/* The model's input with the embedding at `at` perturbed, run to the head: the result as names[0]. */
static stz_status probe_input(probe_state *ps, loc at, const char *const *names, stz_err *err)
{
    probe_at(ps, at);
    stz_status st = stz_forward_embed(ps->m, ps->R.tok, ps->R.pos, ps->n, ps->P, err);
    if (!st)
        st = run_streams(ps, 1, 0, names, 0, err);
    probe_at(ps, NOWHERE);
    return st;
}

/* A separate head perturbed on the final hidden states. */
static stz_status probe_head(probe_state *ps, const char *name, stz_err *err)
{
    stz_fwd *m = ps->m;
    size_t D = m->c.dim, sc = ps->scored;
    for (size_t i = 0; i < sc; i++)
        memcpy(ps->S + i * D, ps->X + ps->idx[i] * D, D * sizeof *ps->S);
    probe_at(ps, m->global[G_HEAD]);
    stz_status st = head_streams(ps, 1, 0, err);
    probe_at(ps, NOWHERE);
    if (!st) {
        stz_fwd_report rep;
        report_from(ps->rs, sc, ps->kl, &rep);
        ps->probe->result(ps->probe->user, name, rep.kl_mean);
    }
    return st;
}

stz_status stz_fwd_probe_run(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                             const stz_fwd_probe *probe, stz_fwd_progress progress, void *user, stz_err *err)
{
    loc emb = m->global[G_EMBED], hd = m->global[G_HEAD], pe = m->global[G_POS];
    int tied = stz_forward_tied(m);
    probe_state ps = {.m = m, .probe = probe, .progress = progress, .user = user, .hook.weights = probe_weights};
    ps.hook.user = &ps;
    stz_status st = probe_setup(&ps, tokens, nseq, stride, lens, err);
    size_t n = ps.n;
    const char *names[MATS];
    names[0] = st ? NULL : stz_forward_tensor(m, emb)->name;
    int want_emb = !st && probe->select(probe->user, names[0]), walk = 0;
    const char *head = st || tied ? NULL : stz_forward_tensor(m, hd)->name,
               *pos = st || pe.f < 0 ? NULL : stz_forward_tensor(m, pe)->name;
    int want_head = head && probe->select(probe->user, head), want_pos = pos && probe->select(probe->user, pos);
    if (!st)
        ps.total = probe_total(m, probe, want_emb, want_pos, want_head, &walk);
    if (!st && !(st = stz_forward_embed(m, ps.R.tok, ps.R.pos, n, ps.P, err)))
        st = run_streams(&ps, 1, 0, NULL, 1, err); /* the reference */
    for (size_t k = 0; !st && want_emb && k < emb_runs(probe); k++) {
        if (probe->variant)
            probe->variant(probe->user, k);
        st = probe_input(&ps, emb, names, err);
    }
    if (!st && want_pos) /* GPT-Neo's learned positions */
        st = probe_input(&ps, pe, &pos, err);
    if (!st && walk)
        st = stz_forward_embed(m, ps.R.tok, ps.R.pos, n, ps.X, err);
    if (!st && walk)
        st = probe_layers(&ps, nseq, names, err);
    if (!st && want_head)
        st = probe_head(&ps, head, err);
    probe_at(&ps, NOWHERE);
    stz_forward_rows_free(&ps.R), stz_forward_rows_free(&ps.W);
    free(ps.idx), free(ps.next), free(ps.X), free(ps.P), free(ps.S), free(ps.store), free(ps.rs), free(ps.kl);
    return st;
}
