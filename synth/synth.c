/* Synthetic models with real architectures' names and shapes and values
 * shaped like trained weights. See stz_synth.h. */
#include "synth_internal.h"
#include "stz_safetensors.h"
#include "core/stz_math.h"

#include <math.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers -------------------------------------------------- */

static inline uint64_t wyrand(uint64_t *s)
{
    *s += 0xa0761d6478bd642full;
    __uint128_t t = (__uint128_t)*s * (*s ^ 0xe7037ed1a0b428dbull);
    return (uint64_t)(t >> 64) ^ (uint64_t)t;
}

static uint64_t mix(uint64_t a, uint64_t b)
{
    uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Two standard normals from one 64-bit draw (Box-Muller on 24-bit uniforms). */
static inline void normal2(uint64_t r, float *a, float *b)
{
    float u1 = ((float)(r & 0xffffff) + 1.0f) * (1.0f / 16777217.0f);
    float u2 = (float)((r >> 24) & 0xffffff) * (1.0f / 16777216.0f);
    float m = sqrtf(-2.0f * (float)stz_log(u1));
    double s, c;
    stz_sincos(6.2831853f * u2, &s, &c);
    *a = m * (float)c, *b = m * (float)s;
}

static float normal1(uint64_t *st)
{
    float a, b;
    normal2(wyrand(st), &a, &b);
    return a;
}

/* Student-t with NU degrees of freedom = normal * sqrt(NU / chi2_NU). The
 * mixing factor comes from a 256-entry table of its quantiles, normalised
 * to unit variance, so one draw gives two heavy-tailed values. */
#define NU 8
static float t_scale[256];
static pthread_once_t t_once = PTHREAD_ONCE_INIT;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void t_init(void)
{
    enum { SAMPLES = 256 * 64 };
    static float v[SAMPLES];
    uint64_t st = 12345;
    for (int i = 0; i < SAMPLES; i++) {
        float chi2 = 0;
        for (int k = 0; k < NU; k++) {
            float z = normal1(&st);
            chi2 += z * z;
        }
        v[i] = sqrtf((float)(NU - 2) / chi2); /* var(t_NU) = NU/(NU-2) */
    }
    qsort(v, SAMPLES, sizeof *v, cmp_float);
    for (int i = 0; i < 256; i++)
        t_scale[i] = v[i * 64 + 32];
}

/* ---- generation ------------------------------------------------------ */

#define CHUNK ((uint64_t)1 << 16) /* elements per independently seeded chunk */
#define BATCH ((uint64_t)1 << 22) /* elements generated before each write */

typedef struct {
    const spec *t;
    uint64_t seed; /* tensor seed */
    float base;    /* overall scale */
    const float *row, *col;
    const float *la, *lb; /* low-rank part: la (rows, R), lb (cols, R); NULL if none */
    size_t lr;            /* R */
    float noise;          /* scale of the iid part when there is a low-rank part */
    stz_dtype dtype;
    int prune; /* 0 none, 1 |z| below `cut`, 2 two of every four */
    float cut;
    uint64_t first; /* first element of this batch */
    uint64_t count;
    uint8_t *out; /* count * elem bytes */
    int tid, nthreads;
    uint64_t hist[256];
} job;

static inline float value_at(const job *j, uint64_t e, float z)
{
    switch (j->t->kind) {
    case K_NORM: return stz_expf(0.15f * z) * j->base;
    case K_NORM1: return stz_expf(0.15f * z) * j->base - 1.0f;
    case K_BIAS: return j->base * z;
    default: {
        uint64_t cols = j->t->shape[1], r = e / cols, c = e % cols;
        if (!j->la)
            return j->base * j->row[r] * j->col[c] * z;
        const float *a = j->la + r * j->lr, *b = j->lb + c * j->lr;
        float l = 0;
        for (size_t k = 0; k < j->lr; k++)
            l += a[k] * b[k];
        return j->row[r] * j->col[c] * (j->base * j->noise * z + l);
    }
    }
}

static void *gen_batch(void *arg)
{
    job *j = (job *)arg;
    size_t esz = stz_dtype_bits(j->dtype) / 8;
    memset(j->hist, 0, sizeof j->hist);
    uint64_t c0 = j->first / CHUNK, c1 = (j->first + j->count + CHUNK - 1) / CHUNK;
    for (uint64_t c = c0 + (uint64_t)j->tid; c < c1; c += (uint64_t)j->nthreads) {
        uint64_t st = mix(j->seed, c);
        uint64_t e0 = c * CHUNK, e1 = e0 + CHUNK;
        if (e1 > j->first + j->count)
            e1 = j->first + j->count;
        for (uint64_t e = e0; e < e1; e += 4) { /* two pairs: the same draws as pair by pair */
            float z[4];
            for (int h = 0; h < 2; h++) {
                uint64_t r = wyrand(&st);
                normal2(r, &z[2 * h], &z[2 * h + 1]);
                z[2 * h] *= t_scale[(r >> 48) & 0xff];
                z[2 * h + 1] *= t_scale[r >> 56];
            }
            int zero[4] = {0};
            if (j->prune == 1)
                for (int k = 0; k < 4; k++)
                    zero[k] = fabsf(z[k]) < j->cut;
            else if (j->prune == 2) /* the two smallest magnitudes of the group */
                for (int k = 0; k < 4; k++) {
                    int smaller = 0;
                    for (int m = 0; m < 4; m++)
                        smaller += fabsf(z[m]) < fabsf(z[k]) || (fabsf(z[m]) == fabsf(z[k]) && m < k);
                    zero[k] = smaller < 2;
                }
            for (int k = 0; k < 4 && e + (uint64_t)k < e1; k++) {
                float v = zero[k] ? 0.0f : value_at(j, e + (uint64_t)k, z[k]);
                uint16_t b = stz_f32_to_bf16(v);
                j->hist[(b >> 7) & 0xff]++;
                uint8_t *o = j->out + (e + (uint64_t)k - j->first) * esz;
                if (j->dtype == STZ_DTYPE_BF16) {
                    stz_put_le16(o, b);
                } else if (j->dtype == STZ_DTYPE_F16) {
                    stz_put_le16(o, stz_f32_to_f16(v));
                } else {
                    uint32_t u;
                    memcpy(&u, &v, 4);
                    stz_put_le32(o, u);
                }
            }
        }
    }
    return NULL;
}

/* The |z| below which a fraction q of the draws lies (from a fixed sample). */
static float magnitude_quantile(double q)
{
    enum { N = 1 << 16 };
    float *v = malloc(N * sizeof *v);
    if (!v)
        return 0;
    uint64_t st = 777;
    for (int i = 0; i < N; i += 2) {
        uint64_t r = wyrand(&st);
        normal2(r, &v[i], &v[i + 1]);
        v[i] = fabsf(v[i] * t_scale[(r >> 48) & 0xff]), v[i + 1] = fabsf(v[i + 1] * t_scale[r >> 56]);
    }
    qsort(v, N, sizeof *v, cmp_float);
    float c = v[(size_t)(q * (N - 1))];
    free(v);
    return c;
}

/* Per-row and per-column log-normal magnitudes; ~0.5% of input columns of
 * linear layers are outlier channels several times larger. */
static void make_factors(const spec *t, uint64_t seed, float *row, float *col)
{
    uint64_t st = mix(seed, 0xfacade);
    uint64_t rows = t->shape[0], cols = t->shape[1];
    for (uint64_t i = 0; i < rows; i++)
        row[i] = stz_expf(0.15f * normal1(&st));
    for (uint64_t i = 0; i < cols; i++) {
        col[i] = stz_expf(0.10f * normal1(&st));
        if ((t->kind == K_LINEAR || t->kind == K_CONV) && (wyrand(&st) % 200) == 0)
            col[i] *= 2.0f + 1.0f * (float)(wyrand(&st) % 1000) / 1000.0f;
    }
}

/* Trained attention query/key matrices are far from full rank (stories260K
 * wq keeps 72% of its norm at rank 16 of 64, a random matrix 42%), so
 * their stand-ins get a low-rank part: R = min(rows, cols, 256) rank-one
 * terms with power-law singular values i^-LR_ALPHA, carrying 1 - LR_NOISE
 * of the variance; the rest stays iid heavy-tailed. */
#define LR_ALPHA 0.9f
#define LR_NOISE 0.10f
#define LR_MAX   256

static int is_query_key(const spec *t)
{
    return t->kind == K_LINEAR && (strstr(t->name, "q_proj.") || strstr(t->name, "k_proj.") ||
                                   strstr(t->name, ".wq.") || strstr(t->name, ".wk."));
}

/* la (rows, R) and lb (cols, R) such that sum_k la[r][k] lb[c][k] has
 * variance (1 - LR_NOISE) base^2 per element. Returns R. */
static size_t make_lowrank(const spec *t, uint64_t seed, float base, float *la, float *lb)
{
    size_t rows = t->shape[0], cols = t->shape[1], R = rows < cols ? rows : cols;
    R = R < LR_MAX ? R : LR_MAX;
    double norm = 0;
    for (size_t k = 0; k < R; k++)
        norm += stz_pow((double)(k + 1), -2.0 * LR_ALPHA);
    uint64_t st = mix(seed, 0x10ad);
    for (size_t k = 0; k < R; k++) {
        float sk = base * sqrtf((1 - LR_NOISE) / (float)norm) * (float)stz_pow((double)(k + 1), -LR_ALPHA);
        for (size_t r = 0; r < rows; r++)
            la[r * R + k] = sk * normal1(&st);
        for (size_t c = 0; c < cols; c++)
            lb[c * R + k] = normal1(&st);
    }
    return R;
}

static float base_scale(const spec *t)
{
    switch (t->kind) {
    case K_LINEAR: return 1.0f / sqrtf((float)t->shape[1]);
    case K_CONV: return 1.0f / sqrtf((float)t->shape[0]);
    case K_EMBED: return 1.0f / sqrtf((float)t->shape[1]);
    case K_NORM:
    case K_NORM1: return 1.0f;
    default: return 0.02f;
    }
}

/* The configuration's JSON, under the keys of the family's own config.json. */
static void config_json(const arch *a, char *cfg, size_t cap)
{
    unsigned long long H = a->hidden, I = a->inter, L = a->layers, NH = a->heads, V = a->vocab, P = a->positions;
    const char *tied = a->tied ? "true" : "false";
    char more[96] = "";
    if (a->fam == FAM_GPT_NEO) /* global and local layers in turn, as GPT-Neo's */
        snprintf(cfg, cap,
                 "{\"architecture\":\"%s\",\"model_type\":\"gpt_neo\",\"hidden_size\":%llu,"
                 "\"intermediate_size\":%llu,\"num_layers\":%llu,\"num_heads\":%llu,\"vocab_size\":%llu,"
                 "\"max_position_embeddings\":%llu,\"window_size\":%llu,\"attention_types\":[[[\"global\","
                 "\"local\"],%llu]%s],\"tie_word_embeddings\":%s}",
                 a->name, H, I, L, NH, V, P, (unsigned long long)a->window, L / 2, L % 2 ? ",[[\"global\"],1]" : "",
                 tied);
    else if (a->fam == FAM_GPT2)
        snprintf(cfg, cap,
                 "{\"architecture\":\"%s\",\"model_type\":\"gpt2\",\"n_embd\":%llu,\"n_inner\":%llu,"
                 "\"n_layer\":%llu,\"n_head\":%llu,\"vocab_size\":%llu,\"n_positions\":%llu,"
                 "\"tie_word_embeddings\":%s}",
                 a->name, H, I, L, NH, V, P, tied);
    else if (a->fam == FAM_GEMMA) { /* Gemma 2 soft-caps; Gemma 3 norms q/k heads, its local layers' own RoPE base */
        if (a->qk_norm)
            snprintf(more, sizeof more,
                     "\"sliding_window_pattern\":%llu,\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,",
                     (unsigned long long)a->pattern);
        else
            snprintf(more, sizeof more, "\"attn_logit_softcapping\":50.0,\"final_logit_softcapping\":30.0,");
        snprintf(cfg, cap,
                 "{\"architecture\":\"%s\",\"model_type\":\"%s\",\"hidden_size\":%llu,\"intermediate_size\":%llu,"
                 "\"num_hidden_layers\":%llu,\"num_attention_heads\":%llu,\"num_key_value_heads\":%llu,"
                 "\"head_dim\":%llu,\"query_pre_attn_scalar\":%llu,\"vocab_size\":%llu,"
                 "\"max_position_embeddings\":%llu,\"sliding_window\":%llu,%s\"tie_word_embeddings\":%s}",
                 a->name, a->model_type, H, I, L, NH, (unsigned long long)a->kv_heads, (unsigned long long)a->head_dim,
                 (unsigned long long)a->head_dim, V, P, (unsigned long long)a->window, more, tied);
    } else {
        if (a->model_type) /* a family the configuration's other keys do not tell */
            snprintf(more, sizeof more, ",\"model_type\":\"%s\",\"head_dim\":%llu", a->model_type,
                     (unsigned long long)(a->head_dim ? a->head_dim : a->hidden / a->heads));
        snprintf(cfg, cap,
                 "{\"architecture\":\"%s\",\"hidden_size\":%llu,\"intermediate_size\":%llu,"
                 "\"num_hidden_layers\":%llu,\"num_attention_heads\":%llu,\"num_key_value_heads\":%llu,"
                 "\"vocab_size\":%llu,\"tie_word_embeddings\":%s%s}",
                 a->name, H, I, L, NH, (unsigned long long)a->kv_heads, V, tied, more);
    }
}

static stz_status write_config_meta(stz_writer *w, const arch *a, const stz_synth_params *p, stz_err *err)
{
    char cfg[1024], seed[32];
    config_json(a, cfg, sizeof cfg);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    stz_status st;
    if ((st = stz_writer_set_meta(w, "stz.synthetic", "true", err)) ||
        (st = stz_writer_set_meta(w, "stz.synth.arch", a->name, err)) ||
        (st = stz_writer_set_meta(w, "stz.synth.seed", seed, err)) || (st = stz_writer_set_meta(w, "config", cfg, err)))
        return st;
    char sp[32];
    snprintf(sp, sizeof sp, "%g", p->sparsity);
    if (p->sparsity > 0 || p->two_four)
        st = stz_writer_set_meta(w, "stz.synth.sparsity", p->two_four ? "2:4" : sp, err);
    return st;
}

/* One run of stz_synth_write: the tensors, the shared buffers, the
 * threads' jobs, the histogram of exponent bytes. */
typedef struct {
    const stz_synth_params *p;
    const char *path;
    specs s;
    float *row, *col, *la, *lb;
    uint8_t *buf;
    job *jobs;
    pthread_t *tids;
    size_t esz;
    float cut; /* magnitude pruning threshold (sparsity) */
    uint64_t hist[256], params, maxdim;
} synth_run;

static stz_status check_params(const stz_synth_params *p, stz_err *err)
{
    if (p->layers > 1024)
        return stz_err_set(err, STZ_E_ARG, "synth: layers must be 1..1024");
    if (p->dtype != STZ_DTYPE_BF16 && p->dtype != STZ_DTYPE_F16 && p->dtype != STZ_DTYPE_F32)
        return stz_err_set(err, STZ_E_ARG, "synth: dtype must be BF16, F16 or F32");
    if (p->threads < 1 || p->threads > 256)
        return stz_err_set(err, STZ_E_ARG, "synth: threads must be 1..256");
    if (!(p->sparsity >= 0 && p->sparsity < 1) || (p->sparsity > 0 && p->two_four))
        return stz_err_set(err, STZ_E_ARG, "synth: sparsity must be in [0, 1), and not with 2:4");
    return STZ_OK;
}

/* Elements [first, first + count) of tensor t into the buffer, on the
 * run's threads (the caller's among them). */
static void gen_batches(synth_run *g, const spec *t, uint64_t tseed, size_t lr, uint64_t first, uint64_t count)
{
    const stz_synth_params *p = g->p;
    for (int k = 0; k < p->threads; k++) {
        g->jobs[k] = (job){.t = t,
                           .seed = tseed,
                           .base = base_scale(t),
                           .row = g->row,
                           .col = g->col,
                           .la = lr ? g->la : NULL,
                           .lb = lr ? g->lb : NULL,
                           .lr = lr,
                           .noise = sqrtf(LR_NOISE),
                           .dtype = p->dtype,
                           .first = first,
                           .count = count,
                           .out = g->buf,
                           .prune = (t->kind != K_LINEAR && t->kind != K_CONV) || !strcmp(t->name, "lm_head.weight") ? 0
                                    : p->two_four                                                                    ? 2
                                                  : p->sparsity > 0,
                           .cut = g->cut,
                           .tid = k,
                           .nthreads = p->threads};
        if (k && pthread_create(&g->tids[k], NULL, gen_batch, &g->jobs[k]) != 0) {
            /* run it here instead */
            gen_batch(&g->jobs[k]);
            g->tids[k] = 0;
        }
    }
    gen_batch(&g->jobs[0]);
    for (int k = 0; k < p->threads; k++) {
        if (k && g->tids[k])
            pthread_join(g->tids[k], NULL);
        for (int b = 0; b < 256; b++)
            g->hist[b] += g->jobs[k].hist[b];
    }
}

/* Declares the tensors of this shard (those starting in its share of the
 * bytes, or all): how many, and their bytes. */
static stz_status declare_tensors(synth_run *g, stz_writer *w, size_t *written, uint64_t *total, stz_err *err)
{
    const stz_synth_params *p = g->p;
    for (size_t i = 0, before = 0; i < g->s.n; i++) {
        spec *v = &g->s.v[i];
        uint64_t b = stz_synth_spec_numel(v) * g->esz;
        size_t k = p->nshards ? (size_t)((double)before * p->nshards / (double)(g->params * g->esz)) : 0;
        v->skip = p->nshards && k != p->shard;
        before += b, *total += v->skip ? 0 : b, *written += !v->skip;
        stz_status st = v->skip ? STZ_OK : stz_writer_add(w, v->name, p->dtype, v->ndim, v->shape, err);
        if (st)
            return st;
    }
    return STZ_OK;
}

/* Every declared tensor's values, batch by batch. */
static stz_status write_tensors(synth_run *g, stz_writer *w, uint64_t total, stz_err *err)
{
    const stz_synth_params *p = g->p;
    uint64_t done = 0;
    for (size_t i = 0; i < g->s.n; i++) {
        const spec *t = &g->s.v[i];
        if (t->skip)
            continue;
        uint64_t tseed = mix(p->seed, i + 1), n = stz_synth_spec_numel(t);
        size_t lr = 0;
        if (t->ndim == 2)
            make_factors(t, tseed, g->row, g->col);
        if (is_query_key(t))
            lr = make_lowrank(t, tseed, base_scale(t), g->la, g->lb);
        for (uint64_t first = 0; first < n; first += BATCH) {
            uint64_t count = n - first < BATCH ? n - first : BATCH;
            gen_batches(g, t, tseed, lr, first, count);
            stz_status st = stz_writer_write(w, g->buf, count * g->esz, err);
            if (st)
                return st;
            done += count * g->esz;
            if (p->progress && p->progress(p->progress_user, done, total))
                return stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", g->path);
        }
    }
    return STZ_OK;
}

static void synth_stats(const synth_run *g, size_t written, uint64_t total, stz_synth_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    stats->tensors = written;
    uint64_t params = stats->params = total / g->esz;
    struct stat sb;
    stats->bytes = stat(g->path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    double h = 0;
    for (int b = 0; b < 256; b++) {
        stats->exp_hist[b] = g->hist[b];
        if (g->hist[b]) {
            double q = (double)g->hist[b] / (double)params;
            h -= q * stz_log2(q);
        }
    }
    stats->exp_entropy_bits = h;
}

stz_status stz_synth_write(const stz_synth_params *p, const char *path, stz_synth_stats *stats, stz_err *err)
{
    const arch *found = stz_synth_find_arch(p->arch);
    if (!found)
        return stz_err_set(err, STZ_E_ARG, "unknown architecture '%s' (see 'stz synth --list')",
                           p->arch ? p->arch : "");
    stz_status st = check_params(p, err);
    if (st)
        return st;
    arch custom = *found;
    custom.layers = p->layers ? p->layers : found->layers;
    pthread_once(&t_once, t_init);
    synth_run g = {.p = p,
                   .path = path,
                   .cut = p->sparsity > 0 ? magnitude_quantile(p->sparsity) : 0,
                   .esz = stz_dtype_bits(p->dtype) / 8};
    stz_writer *w = NULL;
    g.jobs = calloc((size_t)p->threads, sizeof *g.jobs);
    g.tids = calloc((size_t)p->threads, sizeof *g.tids);
    stz_synth_build_specs(&custom, &g.s);
    for (size_t i = 0; i < g.s.n; i++) {
        g.params += stz_synth_spec_numel(&g.s.v[i]);
        for (int d = 0; d < g.s.v[i].ndim; d++)
            g.maxdim = g.s.v[i].shape[d] > g.maxdim ? g.s.v[i].shape[d] : g.maxdim;
    }
    g.row = malloc(g.maxdim * sizeof *g.row);
    g.col = malloc(g.maxdim * sizeof *g.col);
    g.la = malloc(g.maxdim * LR_MAX * sizeof *g.la);
    g.lb = malloc(g.maxdim * LR_MAX * sizeof *g.lb);
    g.buf = malloc(BATCH * g.esz);
    if (g.s.oom || !g.jobs || !g.tids || !g.row || !g.col || !g.la || !g.lb || !g.buf) {
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    if (p->nshards && p->shard >= p->nshards) {
        st = stz_err_set(err, STZ_E_ARG, "synth: shard %u of %u", p->shard, p->nshards);
        goto cleanup;
    }
    size_t written = 0;
    uint64_t total = 0;
    STZ_TRY(st, stz_writer_open(&w, path, p->write_flags, err));
    STZ_TRY(st, write_config_meta(w, &custom, p, err));
    STZ_TRY(st, declare_tensors(&g, w, &written, &total, err));
    STZ_TRY(st, write_tensors(&g, w, total, err));
    STZ_TRY(st, stz_writer_finish(w, err));
    if (stats)
        synth_stats(&g, written, total, stats);
cleanup:
    stz_writer_free(w);
    free(g.s.v), free(g.row), free(g.col), free(g.la), free(g.lb), free(g.buf), free(g.jobs), free(g.tids);
    return st;
}
