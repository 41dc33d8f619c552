/* Forward pass: reproduces llama2.c's reference logits on stories260K,
 * continues its greedy text, and KL behaves (0 on itself, grows with noise);
 * bad models and tokens are refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>

#include "stz_forward.h"
#include "stz_imatrix.h"
#include "stz_policy.h"
#include "stz_pipeline.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "stz_synth.h"
#include "test_util.h"

static char *dir;

/* A model and its forward pass over one file. */
typedef struct {
    stz_qmodel *q;
    stz_fwd *f;
} model;

static stz_status open_model(model *m, const char *path, stz_err *err)
{
    memset(m, 0, sizeof *m);
    stz_status st = stz_qmodel_open(&m->q, path, err);
    if (st)
        return st;
    const char *cfg = stz_reader_meta_get(stz_qmodel_reader(m->q), "config");
    stz_fwd_config c;
    if (!cfg)
        return stz_err_set(err, STZ_E_FORMAT, "%s: no config", path);
    if ((st = stz_fwd_config_parse(&c, cfg, path, err)))
        return st;
    return stz_fwd_open(&m->f, &m->q, 1, &c, path, 2, err);
}

static void close_model(model *m)
{
    stz_fwd_free(m->f);
    stz_qmodel_free(m->q);
}

/* Copies src to dst as F32: matrices get Gaussian noise of `sigma` times
 * their RMS; `skip` is left out; `poison` gets a NaN; `config` replaces
 * the metadata config when not NULL. */
typedef struct {
    double sigma;
    const char *skip, *poison, *config;
} edit;

static void rewrite(const char *src, const char *dst, const edit *e)
{
    stz_err err;
    stz_qmodel *q;
    stz_writer *w;
    assert_int_equal(stz_qmodel_open(&q, src, &err), STZ_OK);
    assert_int_equal(stz_writer_open(&w, dst, STZ_WRITE_FORCE, &err), STZ_OK);
    const char *cfg = stz_reader_meta_get(stz_qmodel_reader(q), "config");
    assert_int_equal(stz_writer_set_meta(w, "config", e->config ? e->config : cfg, &err), STZ_OK);
    size_t n = stz_qmodel_count(q);
    for (size_t i = 0; i < n; i++) {
        const stz_qtensor *t = stz_qmodel_tensor(q, i);
        if (!e->skip || strcmp(t->name, e->skip))
            assert_int_equal(stz_writer_add(w, t->name, STZ_DTYPE_F32, t->ndim, t->shape, &err), STZ_OK);
    }
    uint64_t rng = 12345;
    for (size_t i = 0; i < n; i++) {
        const stz_qtensor *t = stz_qmodel_tensor(q, i);
        if (e->skip && !strcmp(t->name, e->skip))
            continue;
        float *v = malloc(t->numel * sizeof *v + 4);
        assert_int_equal(stz_qmodel_read_rows(q, i, 0, (size_t)t->rows, v, &err), STZ_OK);
        double ss = 0;
        for (uint64_t j = 0; j < t->numel; j++)
            ss += (double)v[j] * v[j];
        double s = e->sigma * sqrt(ss / (double)t->numel);
        for (uint64_t j = 0; t->ndim == 2 && s > 0 && j < t->numel; j++) {
            double u1, u2; /* Box-Muller from an LCG */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull, u1 = ((rng >> 11) + 1.0) / 9007199254740993.0;
            rng = rng * 6364136223846793005ull + 1442695040888963407ull, u2 = (rng >> 11) / 9007199254740992.0;
            v[j] += (float)(s * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
        }
        if (e->poison && !strcmp(t->name, e->poison))
            v[t->numel / 2] = NAN;
        assert_int_equal(stz_writer_write(w, v, t->numel * 4, &err), STZ_OK);
        free(v);
    }
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
    stz_qmodel_free(q);
}

static char *synth_tiny(void)
{
    char *p = tu_path(dir, "tiny.safetensors");
    stz_synth_params sp = STZ_SYNTH_PARAMS_DEFAULT;
    sp.dtype = STZ_DTYPE_F32;
    sp.write_flags = STZ_WRITE_FORCE;
    stz_err err;
    assert_int_equal(stz_synth_write(&sp, p, NULL, &err), STZ_OK);
    return p;
}

static int have_data(const char *name)
{
    char *p = tu_path(STZ_SHARED_DATA_DIR, name);
    int ok = access(p, R_OK) == 0;
    free(p);
    if (!ok)
        printf("skip: %s/%s is not there\n", STZ_SHARED_DATA_DIR, name);
    return ok;
}

static int32_t *greedy_tokens(size_t *n)
{
    char *p = tu_path(STZ_SHARED_DATA_DIR, "stories260K.greedy.json");
    FILE *f = fopen(p, "rb");
    char buf[8192];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    free(p);
    buf[len] = 0;
    cJSON *j = cJSON_Parse(buf), *a = cJSON_GetObjectItem(j, "tokens");
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *t = malloc(*n * sizeof *t);
    for (size_t i = 0; i < *n; i++)
        t[i] = cJSON_GetArrayItem(a, (int)i)->valueint;
    cJSON_Delete(j);
    return t;
}

static void test_stories_reference_logits(void **state)
{
    (void)state;
    if (!have_data("stories260K.f32.safetensors") || !have_data("stories260K.greedy.logits.f32"))
        skip();
    size_t n;
    int32_t *tok = greedy_tokens(&n);
    assert_int_equal(n, 128);
    model m;
    stz_err err;
    char *p = tu_path(STZ_SHARED_DATA_DIR, "stories260K.f32.safetensors");
    assert_int_equal(open_model(&m, p, &err), STZ_OK);
    float *got = malloc(n * 512 * sizeof *got), *want = malloc(n * 512 * sizeof *want);
    assert_int_equal(stz_fwd_logits(m.f, tok, 1, n, got, &err), STZ_OK);
    char *lp = tu_path(STZ_SHARED_DATA_DIR, "stories260K.greedy.logits.f32");
    FILE *f = fopen(lp, "rb");
    assert_int_equal(fread(want, sizeof *want, n * 512, f), n * 512);
    fclose(f);
    double worst = 0;
    for (size_t i = 0; i < n * 512; i++)
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    printf("stories260K: largest |logit - reference| = %.3g\n", worst);
    assert_true(worst <= 1e-4);

    /* greedy continuation from BOS gives the same 128 tokens */
    int32_t *cont = malloc(n * sizeof *cont);
    assert_int_equal(stz_fwd_sample(m.f, 1, n, 7, 0, 0.9, cont, NULL, NULL, &err), STZ_OK);
    assert_memory_equal(cont, tok, n * sizeof *tok);
    close_model(&m);
    free(got), free(want), free(cont), free(tok), free(p), free(lp);
}

static stz_fwd_report compare(const char *a, const char *b, const int32_t *tok, size_t nseq, size_t len)
{
    model A, B;
    stz_err err;
    stz_fwd_report r;
    assert_int_equal(open_model(&A, a, &err), STZ_OK);
    assert_int_equal(open_model(&B, b, &err), STZ_OK);
    size_t *lens = malloc(nseq * sizeof *lens);
    for (size_t s = 0; s < nseq; s++)
        lens[s] = len;
    assert_int_equal(stz_fwd_compare(A.f, B.f, tok, nseq, len, lens, NULL, NULL, &r, &err), STZ_OK);
    assert_int_equal(r.positions, nseq * (len - 1));
    close_model(&A), close_model(&B);
    free(lens);
    return r;
}

/* KL 0 on itself, small for BF16, growing with noise: on stories260K when
 * present, on stz synth's tiny model always. */
static void kl_behaves(const char *path, const char *bf16)
{
    model m;
    stz_err err;
    assert_int_equal(open_model(&m, path, &err), STZ_OK);
    enum { NSEQ = 3, LEN = 48 };
    int32_t tok[NSEQ * LEN];
    assert_int_equal(stz_fwd_sample(m.f, NSEQ, LEN, 42, 1.0, 0.9, tok, NULL, NULL, &err), STZ_OK);
    close_model(&m);
    int32_t again[NSEQ * LEN];
    assert_int_equal(open_model(&m, path, &err), STZ_OK); /* a new pass: nothing kept */
    assert_int_equal(stz_fwd_sample(m.f, NSEQ, LEN, 42, 1.0, 0.9, again, NULL, NULL, &err), STZ_OK);
    assert_memory_equal(tok, again, sizeof tok); /* same seed, same text */
    close_model(&m);

    stz_fwd_report r = compare(path, path, tok, NSEQ, LEN);
    assert_true(r.kl_mean == 0 && r.kl_max == 0 && r.top1 == 1 && r.ppl_change == 0);
    assert_true(r.ppl_ref > 1 && isfinite(r.ppl_ref));
    if (bf16) {
        r = compare(path, bf16, tok, NSEQ, LEN);
        printf("BF16: KL %.3g, top-1 %.4f\n", r.kl_mean, r.top1);
        assert_true(r.kl_mean > 0 && r.kl_mean < 1e-3);
    }
    double last = 0;
    const double sigmas[] = {0.01, 0.05, 0.2, 0.5};
    for (size_t i = 0; i < 4; i++) {
        char *noisy = tu_path(dir, "noisy.safetensors");
        rewrite(path, noisy, &(edit){sigmas[i], NULL, NULL, NULL});
        r = compare(path, noisy, tok, NSEQ, LEN);
        printf("noise %.2f: KL %.4g +- %.2g (median %.3g, p99 %.3g, max %.3g), top-1 %.3f, ppl %.3f -> %.3f\n",
               sigmas[i], r.kl_mean, r.kl_stderr, r.kl_median, r.kl_p99, r.kl_max, r.top1, r.ppl_ref, r.ppl_cand);
        assert_true(r.kl_mean > last);
        assert_true(r.kl_median <= r.kl_p95 && r.kl_p95 <= r.kl_p99 && r.kl_p99 <= r.kl_max);
        last = r.kl_mean;
        free(noisy);
    }
}

static void test_kl_stories(void **state)
{
    (void)state;
    if (!have_data("stories260K.f32.safetensors") || !have_data("stories260K.bf16.safetensors"))
        skip();
    char *a = tu_path(STZ_SHARED_DATA_DIR, "stories260K.f32.safetensors"),
         *b = tu_path(STZ_SHARED_DATA_DIR, "stories260K.bf16.safetensors");
    kl_behaves(a, b);
    free(a), free(b);
}

static void test_kl_synth(void **state)
{
    (void)state;
    char *p = synth_tiny();
    kl_behaves(p, NULL);
    free(p);
}

/* The bytes of the importance matrix of a draw of n x len tokens, attached
 * for its first `first` tokens (0: all), saved as `name` in dir. */
static void *imatrix_of(const char *path, const char *name, size_t n, size_t first, size_t len, size_t *bytes)
{
    model m;
    stz_err err;
    stz_imatrix *im;
    int32_t tok[4 * 48];
    assert_int_equal(open_model(&m, path, &err), STZ_OK);
    assert_int_equal(stz_imatrix_new(&im, &err), STZ_OK);
    stz_fwd_set_imatrix_tokens(m.f, im, first);
    assert_int_equal(stz_fwd_sample(m.f, n, len, 9, 1.0, 0.9, tok, NULL, NULL, &err), STZ_OK);
    stz_fwd_set_imatrix(m.f, NULL);
    stz_imatrix_describe(im, "test", (uint32_t)n, 20);
    char *file = tu_path(dir, name);
    assert_int_equal(stz_imatrix_save(im, file, 1, &err), STZ_OK);
    void *b = tu_read(file, bytes);
    stz_imatrix_free(im);
    close_model(&m);
    free(file);
    return b;
}

static int count_steps(void *user, uint64_t done, uint64_t total)
{
    (void)done, (void)total;
    ++*(int *)user;
    return 0;
}

/* stz_fwd_sample keeps its largest draw and answers what it covers: the
 * first sequences and tokens of a longer draw are a shorter draw's (a new
 * pass computes them the same), and an importance matrix attached for the
 * first tokens of a longer draw is the shorter draw's, byte for byte. */
static void draws_kept(const char *path)
{
    enum { NSEQ = 4, LEN = 48, N = 3, L = 20 };
    model m, fresh;
    stz_err err;
    int32_t tok[NSEQ * LEN], shorter[N * L], kept[N * L];
    assert_int_equal(open_model(&m, path, &err), STZ_OK);
    assert_int_equal(open_model(&fresh, path, &err), STZ_OK);
    assert_int_equal(stz_fwd_sample(m.f, NSEQ, LEN, 9, 1.0, 0.9, tok, NULL, NULL, &err), STZ_OK);
    assert_int_equal(stz_fwd_sample(fresh.f, N, L, 9, 1.0, 0.9, shorter, NULL, NULL, &err), STZ_OK);
    int steps = 0;
    assert_int_equal(stz_fwd_sample(m.f, N, L, 9, 1.0, 0.9, kept, count_steps, &steps, &err), STZ_OK);
    assert_int_equal(steps, 0); /* no pass */
    for (size_t s = 0; s < N; s++)
        assert_memory_equal(shorter + s * L, tok + s * LEN, L * sizeof *tok);
    assert_memory_equal(kept, shorter, sizeof kept);
    assert_int_equal(stz_fwd_sample(m.f, N, L, 10, 1.0, 0.9, kept, count_steps, &steps, &err), STZ_OK);
    assert_true(steps > 0); /* another seed: a pass */
    assert_memory_not_equal(kept, shorter, sizeof kept);
    close_model(&m), close_model(&fresh);

    /* within any memory the same tokens: one sequence at a time (0), two
     * by two (twice their key/value cache's bytes), all at once (above) */
    for (int groups = NSEQ; groups >= 2; groups /= 2) {
        int32_t grouped[NSEQ * LEN];
        assert_int_equal(open_model(&m, path, &err), STZ_OK);
        const stz_fwd_config *c = stz_fwd_cfg(m.f);
        uint64_t kv_seq = (uint64_t)c->n_layers * LEN * c->n_kv_heads * c->head_dim * 2 * sizeof(float);
        stz_fwd_set_keep(m.f, groups == NSEQ ? 0 : kv_seq * NSEQ / groups + 1);
        steps = 0;
        assert_int_equal(stz_fwd_sample(m.f, NSEQ, LEN, 9, 1.0, 0.9, grouped, count_steps, &steps, &err), STZ_OK);
        assert_int_equal(steps, groups * (LEN - 1) * (int)c->n_layers); /* a pass per group */
        assert_memory_equal(grouped, tok, sizeof tok);
        close_model(&m);
    }

    size_t na, nb;
    void *a = imatrix_of(path, "alone.imatrix", NSEQ, 0, L, &na),
         *b = imatrix_of(path, "ahead.imatrix", NSEQ, L, LEN, &nb),
         *all = imatrix_of(path, "all.imatrix", NSEQ, 0, LEN, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    assert_memory_not_equal(a, all, na); /* the test tells apart what it compares */
    free(a), free(b), free(all);
}

static void test_draws_kept(void **state)
{
    (void)state;
    char *p = synth_tiny();
    draws_kept(p);
    free(p);
    if (!have_data("stories260K.f32.safetensors"))
        skip();
    p = tu_path(STZ_SHARED_DATA_DIR, "stories260K.f32.safetensors");
    draws_kept(p);
    free(p);
}

/* stz_fwd_compare runs many tokens in batches of sequences, and scores
 * them in pieces of rows: each position's figures are those of its
 * sequence compared alone (max KL and top-1 counts exactly, the means of
 * KL and log-perplexity to rounding), over sequences of unequal lengths. */
static void test_compare_in_batches(void **state)
{
    (void)state;
    char *p = synth_tiny(), *noisy = tu_path(dir, "noisy_batches.safetensors");
    rewrite(p, noisy, &(edit){0.2, NULL, NULL, NULL});
    model A, B;
    stz_err err;
    assert_int_equal(open_model(&A, p, &err), STZ_OK);
    assert_int_equal(open_model(&B, noisy, &err), STZ_OK);
    enum { NSEQ = 24, LEN = 160 }; /* 3,000 positions: more than one batch */
    int32_t *tok = malloc(NSEQ * LEN * sizeof *tok);
    size_t lens[NSEQ], positions = 0;
    assert_int_equal(stz_fwd_sample(A.f, NSEQ, LEN, 5, 1.0, 0.9, tok, NULL, NULL, &err), STZ_OK);
    for (size_t s = 0; s < NSEQ; s++)
        lens[s] = LEN - (s % 5) * 31, positions += lens[s] - 1;
    stz_fwd_report all, one;
    assert_int_equal(stz_fwd_compare(A.f, B.f, tok, NSEQ, LEN, lens, NULL, NULL, &all, &err), STZ_OK);
    assert_int_equal(all.positions, positions);
    double kl_max = 0, kl_sum = 0, agree = 0, nll_a = 0, nll_b = 0;
    for (size_t s = 0; s < NSEQ; s++) {
        assert_int_equal(stz_fwd_compare(A.f, B.f, tok + s * LEN, 1, LEN, lens + s, NULL, NULL, &one, &err), STZ_OK);
        kl_max = fmax(kl_max, one.kl_max), kl_sum += one.kl_mean * (double)one.positions;
        agree += round(one.top1 * (double)one.positions);
        nll_a += log(one.ppl_ref) * (double)one.positions, nll_b += log(one.ppl_cand) * (double)one.positions;
    }
    assert_true(all.kl_max == kl_max);
    assert_true(round(all.top1 * (double)positions) == agree);
    assert_true(fabs(all.kl_mean - kl_sum / (double)positions) <= 1e-12 * all.kl_mean);
    assert_true(fabs(log(all.ppl_ref) * (double)positions - nll_a) <= 1e-9 * nll_a);
    assert_true(fabs(log(all.ppl_cand) * (double)positions - nll_b) <= 1e-9 * nll_b);
    assert_true(all.kl_mean > 0);
    close_model(&A), close_model(&B);
    free(tok), free(p), free(noisy);
}

/* stz_fwd_probe_run: each matrix perturbed alone (its rows replaced, as
 * read, by those of an INT4 copy of the model) gives the KL that comparing
 * the model with a file where only that matrix is quantized gives; the
 * matrices of a layer run together as streams, and must not see each
 * other's perturbation. */
typedef struct {
    stz_qmodel *q4;
    char names[40][96];
    double kl[40];
    int n;
} probe_ctx;

static int probe_all(void *user, const char *name)
{
    (void)user, (void)name;
    return 1;
}

static int probe_rows(void *user, const char *name, float *rows, uint64_t r0, size_t n, size_t cols)
{
    probe_ctx *c = user;
    stz_err err;
    long i = stz_qmodel_find(c->q4, name);
    assert_true(i >= 0);
    assert_int_equal(stz_qmodel_tensor(c->q4, (size_t)i)->cols, cols);
    assert_int_equal(stz_qmodel_read_rows(c->q4, (size_t)i, r0, n, rows, &err), STZ_OK);
    return 0;
}

static void probe_result(void *user, const char *name, double kl)
{
    probe_ctx *c = user;
    snprintf(c->names[c->n], sizeof c->names[0], "%s", name);
    c->kl[c->n++] = kl;
}

/* Variants of the embedding's probe: k = 1 leaves its rows as they are. */
typedef struct {
    probe_ctx *c;
    const char *emb;
    size_t k;
    double kl[3];
} variant_ctx;

static int variant_select(void *user, const char *name) { return !strcmp(((variant_ctx *)user)->emb, name); }

static int variant_rows(void *user, const char *name, float *rows, uint64_t r0, size_t n, size_t cols)
{
    variant_ctx *v = user;
    return v->k == 1 ? 0 : probe_rows(v->c, name, rows, r0, n, cols);
}

static void variant_result(void *user, const char *name, double kl)
{
    variant_ctx *v = user;
    (void)name, v->kl[v->k] = kl;
}

static void variant_set(void *user, size_t k) { ((variant_ctx *)user)->k = k; }

static void test_probe_matches_compare(void **state)
{
    (void)state;
    /* a vocabulary large enough for the head to be read in several slices */
    char *p = tu_path(dir, "small1.safetensors"), *q = tu_path(dir, "q4.safetensors"),
         *one = tu_path(dir, "one.safetensors");
    stz_err err;
    stz_synth_params sp = STZ_SYNTH_PARAMS_DEFAULT;
    sp.arch = "small", sp.layers = 1, sp.write_flags = STZ_WRITE_FORCE;
    assert_int_equal(stz_synth_write(&sp, p, NULL, &err), STZ_OK);
    stz_policy *pol;
    const char *all = "{\"rules\": [{\"match\": \"*\", \"action\": \"int4\", \"min_ndim\": 2}]}";
    stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
    qp.write_flags = STZ_WRITE_FORCE;
    assert_int_equal(stz_policy_parse(&pol, all, strlen(all), "all", &err), STZ_OK);
    assert_int_equal(stz_quantize_file(&qp, pol, p, q, NULL, &err), STZ_OK);
    stz_policy_free(pol);
    model m;
    assert_int_equal(open_model(&m, p, &err), STZ_OK);
    enum { NSEQ = 2, LEN = 24 };
    int32_t tok[NSEQ * LEN];
    size_t lens[NSEQ] = {LEN, LEN - 5};
    assert_int_equal(stz_fwd_sample(m.f, NSEQ, LEN, 3, 1.0, 0.9, tok, NULL, NULL, &err), STZ_OK);
    probe_ctx c = {0};
    assert_int_equal(stz_qmodel_open(&c.q4, q, &err), STZ_OK);
    stz_fwd_probe pr = {.select = probe_all, .perturb = probe_rows, .result = probe_result, .user = &c};
    assert_int_equal(stz_fwd_probe_run(m.f, tok, NSEQ, LEN, lens, &pr, NULL, NULL, &err), STZ_OK);
    assert_true(c.n == 1 + 7 || c.n == 1 + 7 + 1);  /* embedding, 7 per layer, a separate head */
    for (int k = 0; k < c.n; k += k == 0 ? 1 : 3) { /* the embedding, q, o, down, the head */
        char json[400];
        snprintf(json, sizeof json, "{\"rules\": [{\"match\": \"%s\", \"action\": \"int4\"}]}", c.names[k]);
        assert_int_equal(stz_policy_parse(&pol, json, strlen(json), "one", &err), STZ_OK);
        assert_int_equal(stz_quantize_file(&qp, pol, p, one, NULL, &err), STZ_OK);
        stz_policy_free(pol);
        model o;
        stz_fwd_report r;
        assert_int_equal(open_model(&o, one, &err), STZ_OK);
        assert_int_equal(stz_fwd_compare(m.f, o.f, tok, NSEQ, LEN, lens, NULL, NULL, &r, &err), STZ_OK);
        close_model(&o);
        if (!(r.kl_mean > 0) || fabs(c.kl[k] / r.kl_mean - 1) > 1e-3)
            fail_msg("%s: probe KL %.6g, compare KL %.6g", c.names[k], c.kl[k], r.kl_mean);
    }
    /* the embedding alone, three times after one unperturbed run: INT4, as
     * it is, INT4 again: the first run's KL, 0, the same KL */
    variant_ctx v = {&c, c.names[0], 0, {-1, -1, -1}};
    stz_fwd_probe pv = {.select = variant_select,
                        .perturb = variant_rows,
                        .result = variant_result,
                        .user = &v,
                        .variants = 3,
                        .variant = variant_set};
    assert_int_equal(stz_fwd_probe_run(m.f, tok, NSEQ, LEN, lens, &pv, NULL, NULL, &err), STZ_OK);
    if (v.kl[0] != c.kl[0] || v.kl[1] != 0 || v.kl[2] != c.kl[0])
        fail_msg("variants: %.9g %.9g %.9g, the probe's %.9g", v.kl[0], v.kl[1], v.kl[2], c.kl[0]);
    stz_qmodel_free(c.q4);
    close_model(&m);
    unlink(p), unlink(q), unlink(one);
    free(p), free(q), free(one);
}

static size_t argmax(const float *l, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        best = l[i] > l[best] ? i : best;
    return best;
}

/* GPT-Neo (learned positions, LayerNorm, GELU, local attention on layer 1
 * with a window of 32): a greedy draw past the window continues as the
 * whole sequence's logits predict (the cached rows' window is the
 * sequence's), the window changes the logits past it and nothing before,
 * and KL behaves as for Llama models. */
static void test_gpt_neo(void **state)
{
    (void)state;
    enum { LEN = 80 };
    char *p = tu_path(dir, "neo.safetensors");
    stz_synth_params sp = STZ_SYNTH_PARAMS_DEFAULT;
    sp.arch = "gpt-neo-tiny", sp.dtype = STZ_DTYPE_F32, sp.write_flags = STZ_WRITE_FORCE;
    stz_err err;
    assert_int_equal(stz_synth_write(&sp, p, NULL, &err), STZ_OK);
    model m;
    assert_int_equal(open_model(&m, p, &err), STZ_OK);
    stz_fwd_config g = *stz_fwd_cfg(m.f);
    assert_true(g.arch == STZ_ARCH_GPT_NEO && g.local_window == 32 && g.local_period == 2 && g.local_mask == 2);
    size_t V = g.vocab;
    int32_t tok[LEN];
    float *lw = malloc(LEN * V * sizeof *lw), *lg = malloc(LEN * V * sizeof *lg);
    assert_int_equal(stz_fwd_sample(m.f, 1, LEN, 5, 0, 1, tok, NULL, NULL, &err), STZ_OK);
    assert_int_equal(stz_fwd_logits(m.f, tok, 1, LEN, lw, &err), STZ_OK);
    for (size_t t = 0; t + 1 < LEN; t++)
        assert_int_equal(argmax(lw + t * V, V), tok[t + 1]);
    stz_fwd *global;
    g.local_window = 0;
    assert_int_equal(stz_fwd_open(&global, &m.q, 1, &g, p, 1, &err), STZ_OK);
    assert_int_equal(stz_fwd_logits(global, tok, 1, LEN, lg, &err), STZ_OK);
    assert_memory_equal(lw, lg, 32 * V * sizeof *lw);
    assert_memory_not_equal(lw + 32 * V, lg + 32 * V, V * sizeof *lw);
    stz_fwd_free(global);
    close_model(&m);
    free(lw), free(lg);
    kl_behaves(p, NULL);
    draws_kept(p);
    free(p);
}

static void expect_open_error(const char *path, stz_status code, const char *text)
{
    model m;
    stz_err err;
    stz_status st = open_model(&m, path, &err);
    if (st != code || !strstr(err.msg, text))
        fail_msg("%s: got %s '%s', wanted %s with '%s'", path, stz_status_name(st), err.msg, stz_status_name(code),
                 text);
    close_model(&m);
}

static void test_bad_models(void **state)
{
    (void)state;
    char *p = synth_tiny(), *bad = tu_path(dir, "bad.safetensors");
    rewrite(p, bad, &(edit){0, "model.layers.1.mlp.up_proj.weight", NULL, NULL});
    expect_open_error(bad, STZ_E_FORMAT, "tensor 'model.layers.1.mlp.up_proj.weight' is missing");
    rewrite(p, bad,
            &(edit){0, NULL, NULL,
                    "{\"hidden_size\":64,\"intermediate_size\":170,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256}"});
    expect_open_error(bad, STZ_E_SHAPE, "has shape [172, 64], the config says [170, 64]");
    rewrite(p, bad,
            &(edit){0, NULL, NULL,
                    "{\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":1,"
                    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256}"});
    expect_open_error(bad, STZ_E_FORMAT, "the config says 1 layers but 'model.layers.1");
    rewrite(p, bad, &(edit){0, NULL, NULL, "{\"model_type\":\"bloom\",\"hidden_size\":64}"});
    expect_open_error(bad, STZ_E_UNSUPPORTED, "model_type 'bloom' is not supported");
    rewrite(p, bad,
            &(edit){0, NULL, NULL,
                    "{\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"vocab_size\":256,"
                    "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4}}"});
    expect_open_error(bad, STZ_E_UNSUPPORTED, "rope_scaling of type 'yarn' is not supported");
    rewrite(p, bad,
            &(edit){0, NULL, NULL,
                    "{\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":3,\"vocab_size\":256}"});
    expect_open_error(bad, STZ_E_FORMAT, "not even");

    /* NaN in a weight, token ids outside the vocabulary, too long a sequence */
    rewrite(p, bad, &(edit){0, NULL, "model.layers.0.self_attn.k_proj.weight", NULL});
    model m;
    stz_err err;
    assert_int_equal(open_model(&m, bad, &err), STZ_OK);
    int32_t tok[4] = {1, 5, 7, 9};
    float *logits = malloc(4 * 256 * sizeof *logits);
    assert_int_equal(stz_fwd_logits(m.f, tok, 1, 4, logits, &err), STZ_E_NUMERIC);
    assert_non_null(strstr(err.msg, "tensor 'model.layers.0.self_attn.k_proj.weight' holds NaN or Inf"));
    close_model(&m);
    assert_int_equal(open_model(&m, p, &err), STZ_OK);
    tok[2] = 256;
    assert_int_equal(stz_fwd_logits(m.f, tok, 1, 4, logits, &err), STZ_E_ARG);
    assert_non_null(strstr(err.msg, "token id 256 is outside the vocabulary [0, 256)"));
    tok[2] = -1;
    assert_int_equal(stz_fwd_logits(m.f, tok, 1, 4, logits, &err), STZ_E_ARG);
    close_model(&m);
    rewrite(p, bad,
            &(edit){0, NULL, NULL,
                    "{\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,"
                    "\"max_position_embeddings\":3}"});
    assert_int_equal(open_model(&m, bad, &err), STZ_OK);
    tok[2] = 3;
    assert_int_equal(stz_fwd_logits(m.f, tok, 1, 4, logits, &err), STZ_E_ARG);
    assert_non_null(strstr(err.msg, "sequence 1 has 4 tokens, more than the model's 3 positions"));
    close_model(&m);
    free(logits), free(p), free(bad);
}

/* Linear and llama3 rope scaling change the frequencies as published. */
static void test_config(void **state)
{
    (void)state;
    stz_fwd_config c;
    stz_err err;
    assert_int_equal(
        stz_fwd_config_parse(&c,
                             "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,"
                             "\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
                             "\"num_key_value_heads\":8,\"vocab_size\":128256,\"rope_theta\":500000.0,"
                             "\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":true,\"bos_token_id\":128000,"
                             "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
                             "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}",
                             "cfg", &err),
        STZ_OK);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.bos, 128000);
    assert_true(c.tied && c.rope_scaling == STZ_ROPE_LLAMA3 && c.rope_factor == 32 && c.norm_eps == 1e-5);
    assert_int_equal(stz_fwd_config_parse(&c,
                                          "{\"dim\":64,\"hidden_dim\":172,\"n_layers\":5,\"n_heads\":8,"
                                          "\"n_kv_heads\":4,\"vocab_size\":512,\"seq_len\":512}",
                                          "cfg", &err),
                     STZ_OK);
    assert_true(c.rope_interleaved && c.tied && c.norm_eps == 1e-5 && c.max_pos == 512 && c.head_dim == 8);
    assert_int_equal(stz_fwd_config_parse(&c, "{\"hidden_size\":64}", "cfg.json", &err), STZ_E_FORMAT);
    assert_string_equal(err.msg, "cfg.json: 'intermediate_size' is missing");
    assert_int_equal(stz_fwd_config_parse(&c, "[1]", "cfg.json", &err), STZ_E_JSON);
    assert_int_equal(stz_fwd_config_parse(&c, "{\"architectures\":[\"BloomForCausalLM\"]}", "c", &err),
                     STZ_E_UNSUPPORTED);
    assert_int_equal(stz_fwd_config_parse(&c, "{\"hidden_act\":\"gelu\"}", "c", &err), STZ_E_UNSUPPORTED);
    /* GPT-Neo: its keys, a hidden size of 4 x dim by default, the kinds of
     * attention as the shortest period that repeats (layer 1, 3 and 5 local
     * here: period 2, mask 0b10); a pattern that does not repeat within 32
     * layers is refused, one for other layers than the model's too */
    const char *neo =
        "{\"model_type\":\"gpt_neo\",\"hidden_size\":64,\"intermediate_size\":null,\"num_layers\":%d,"
        "\"num_heads\":4,\"vocab_size\":256,\"max_position_embeddings\":128,\"window_size\":8,"
        "\"attention_types\":[%s]}";
    char json[512];
    snprintf(json, sizeof json, neo, 6, "[[\"global\",\"local\"],2],[[\"global\"],1],[[\"local\"],1]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "neo", &err), STZ_OK);
    assert_true(c.arch == STZ_ARCH_GPT_NEO && c.hidden == 256 && c.n_kv_heads == 4 && c.tied && c.norm_eps == 1e-5);
    assert_true(c.local_window == 8 && c.local_period == 2 && c.local_mask == 2);
    snprintf(json, sizeof json, neo, 3, "[[\"local\",\"local\",\"global\"],1]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "neo", &err), STZ_OK);
    assert_true(c.local_period == 3 && c.local_mask == 3);
    snprintf(json, sizeof json, neo, 40, "[[\"global\"],33],[[\"local\"],7]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "neo", &err), STZ_E_UNSUPPORTED);
    snprintf(json, sizeof json, neo, 4, "[[\"global\",\"local\"],1]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "neo", &err), STZ_E_FORMAT);
    assert_string_equal(err.msg, "neo: the attention types are not one for each of the 4 layers");
    snprintf(json, sizeof json, neo, 2, "[[\"global\",\"local\"],1]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "neo", &err), STZ_OK);
    assert_true(c.local_period == 2 && c.local_mask == 2);
    /* Gemma: every sliding_window_pattern-th layer global (Gemma 3 by
     * default every sixth, local RoPE base 10000; Gemma 2 every second, no
     * local base), or the kinds layer_types lists; the score scale from
     * query_pre_attn_scalar; tied by default; no model-wide window */
    const char *gemma =
        "{\"model_type\":\"%s\",\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":6,\"num_attention_heads\":4,\"head_dim\":32,\"vocab_size\":256,"
        "\"query_pre_attn_scalar\":16,\"sliding_window\":8%s}";
    snprintf(json, sizeof json, gemma, "gemma3_text", "");
    assert_int_equal(stz_fwd_config_parse(&c, json, "g3", &err), STZ_OK);
    assert_true(c.arch == STZ_ARCH_GEMMA3 && c.tied && c.sliding_window == 0 && c.local_window == 8);
    assert_true(c.local_period == 6 && c.local_mask == 0x1f && c.rope_local_theta == 10000 && c.attn_scale == 0.25);
    snprintf(json, sizeof json, gemma, "gemma2", ",\"attn_logit_softcapping\":50,\"final_logit_softcapping\":30");
    assert_int_equal(stz_fwd_config_parse(&c, json, "g2", &err), STZ_OK);
    assert_true(c.arch == STZ_ARCH_GEMMA2 && c.local_period == 2 && c.local_mask == 1 && !c.rope_local_theta);
    assert_true(c.attn_softcap == 50 && c.final_softcap == 30);
    snprintf(json, sizeof json, gemma, "gemma2",
             ",\"layer_types\":[\"full_attention\",\"sliding_attention\",\"sliding_attention\","
             "\"full_attention\",\"sliding_attention\",\"sliding_attention\"]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "g2", &err), STZ_OK);
    assert_true(c.local_period == 3 && c.local_mask == 6 && c.local_window == 8);
    snprintf(json, sizeof json, gemma, "gemma2", ",\"layer_types\":[\"full_attention\"]");
    assert_int_equal(stz_fwd_config_parse(&c, json, "g2", &err), STZ_E_FORMAT);
    assert_string_equal(err.msg, "g2: the attention types are not one for each of the 6 layers");
    snprintf(json, sizeof json, gemma, "gemma2", ",\"hidden_activation\":\"gelu\"");
    assert_int_equal(stz_fwd_config_parse(&c, json, "g2", &err), STZ_E_UNSUPPORTED);
    /* a multimodal Gemma 3 (Gemma 3 4B's config.json, vision_config cut):
     * its text_config, Gemma3TextConfig's defaults for what it leaves out */
    assert_int_equal(stz_fwd_config_parse(&c,
                                          "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],"
                                          "\"eos_token_id\":[1,106],\"model_type\":\"gemma3\",\"text_config\":"
                                          "{\"hidden_size\":2560,\"intermediate_size\":10240,\"model_type\":"
                                          "\"gemma3_text\",\"num_hidden_layers\":34,\"rope_scaling\":{\"factor\":"
                                          "8.0,\"rope_type\":\"linear\"},\"sliding_window\":1024},"
                                          "\"vision_config\":{\"hidden_size\":1152}}",
                                          "g3mm", &err),
                     STZ_OK);
    assert_true(c.arch == STZ_ARCH_GEMMA3 && c.dim == 2560 && c.hidden == 10240 && c.n_layers == 34);
    assert_true(c.vocab == 262208 && c.n_heads == 8 && c.n_kv_heads == 4 && c.head_dim == 256 && c.bos == 2);
    assert_true(c.attn_scale == 1.0 / 16 && c.local_period == 6 && c.local_window == 1024 && c.tied);
    assert_true(c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && c.rope_scaling == STZ_ROPE_LINEAR);
    /* GPT-2: its keys (GPT-2 124M's config.json), n_inner null for 4 x
     * n_embd, tied, no window; other attention scales refused by name */
    const char *gpt2 =
        "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_embd\":768,"
        "\"n_inner\":null,\"n_layer\":12,\"n_head\":12,\"n_positions\":1024,\"n_ctx\":1024,"
        "\"vocab_size\":50257,\"bos_token_id\":50256,\"layer_norm_epsilon\":1e-05,"
        "\"activation_function\":\"gelu_new\"%s}";
    snprintf(json, sizeof json, gpt2, "");
    assert_int_equal(stz_fwd_config_parse(&c, json, "gpt2", &err), STZ_OK);
    assert_true(c.arch == STZ_ARCH_GPT2 && c.dim == 768 && c.hidden == 3072 && c.n_heads == 12 && c.head_dim == 64);
    assert_true(c.n_kv_heads == 12 && c.max_pos == 1024 && c.bos == 50256 && c.tied && !c.local_window);
    snprintf(json, sizeof json, gpt2, ",\"scale_attn_by_inverse_layer_idx\":true");
    assert_int_equal(stz_fwd_config_parse(&c, json, "gpt2", &err), STZ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "scale_attn_by_inverse_layer_idx"));
    snprintf(json, sizeof json, gpt2, ",\"scale_attn_weights\":false");
    assert_int_equal(stz_fwd_config_parse(&c, json, "gpt2", &err), STZ_E_UNSUPPORTED);
}

int main(void)
{
    dir = tu_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_stories_reference_logits),
        cmocka_unit_test(test_kl_stories),
        cmocka_unit_test(test_kl_synth),
        cmocka_unit_test(test_bad_models),
        cmocka_unit_test(test_probe_matches_compare),
        cmocka_unit_test(test_compare_in_batches),
        cmocka_unit_test(test_draws_kept),
        cmocka_unit_test(test_gpt_neo),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmdir(dir);
    return rc;
}
