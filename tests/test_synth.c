/* Synthetic model generator: exact architectures, determinism across
 * thread counts, realistic value statistics, clean failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "core/stz_core.h"
#include "stz_safetensors.h"
#include "stz_synth.h"
#include "test_util.h"

#include <math.h>

static void test_arch_sizes(void **state)
{
    (void)state;
    size_t nt;
    uint64_t np;
    stz_err err;
    assert_int_equal(stz_synth_arch_size("qwen2-0.5b", &nt, &np, &err), STZ_OK);
    assert_int_equal(nt, 290);
    assert_int_equal(np, 494032768ull);
    assert_int_equal(stz_synth_arch_size("llama-1b", &nt, &np, &err), STZ_OK);
    assert_int_equal(np, 1235814400ull); /* Llama-3.2-1B */
    assert_int_equal(stz_synth_arch_size("tinyllama-1.1b", &nt, &np, &err), STZ_OK);
    assert_int_equal(np, 1100048384ull);
    assert_int_equal(stz_synth_arch_size("nope", &nt, &np, &err), STZ_E_ARG);
    assert_non_null(strstr(err.msg, "nope"));
}

static uint64_t synth(const char *dir, const char *arch, stz_dtype dt, uint64_t seed, int threads, stz_synth_stats *st)
{
    char name[128];
    snprintf(name, sizeof name, "%s-%s-%llu-%d.safetensors", arch, stz_dtype_name(dt), (unsigned long long)seed,
             threads);
    char *p = tu_path(dir, name);
    stz_synth_params prm = STZ_SYNTH_PARAMS_DEFAULT;
    prm.arch = arch, prm.dtype = dt, prm.seed = seed, prm.threads = threads;
    stz_err err;
    if (stz_synth_write(&prm, p, st, &err) != STZ_OK)
        fail_msg("%s", err.msg);
    uint64_t h = tu_hash_file(p);
    free(p);
    return h;
}

static void test_deterministic(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    stz_synth_stats st;
    for (int dt = 0; dt < 3; dt++) {
        stz_dtype d = dt == 0 ? STZ_DTYPE_BF16 : dt == 1 ? STZ_DTYPE_F16 : STZ_DTYPE_F32;
        uint64_t h1 = synth(dir, "tiny", d, 7, 1, &st), h3 = synth(dir, "tiny", d, 7, 3, NULL);
        assert_true(h1 == h3); /* same bytes whatever the thread count */
        assert_true(h1 != synth(dir, "tiny", d, 8, 2, NULL));
    }
    assert_true(synth(dir, "gpt-neo-tiny", STZ_DTYPE_BF16, 1, 1, NULL) ==
                synth(dir, "gpt-neo-tiny", STZ_DTYPE_BF16, 1, 2, NULL));
    tu_rmdir(dir);
}

static void test_contents(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *p = tu_path(dir, "tiny.safetensors");
    stz_synth_params prm = STZ_SYNTH_PARAMS_DEFAULT;
    prm.dtype = STZ_DTYPE_F32;
    prm.threads = 2;
    stz_synth_stats st;
    stz_err err;
    assert_int_equal(stz_synth_write(&prm, p, &st, &err), STZ_OK);
    assert_int_equal(stz_synth_write(&prm, p, &st, &err), STZ_E_EXISTS); /* no silent overwrite */
    stz_reader *r;
    assert_int_equal(stz_reader_open(&r, p, &err), STZ_OK);
    assert_int_equal(stz_reader_count(r), st.tensors);
    assert_string_equal(stz_reader_meta_get(r, "stz.synthetic"), "true");
    assert_string_equal(stz_reader_meta_get(r, "format"), "pt");
    long iq = stz_reader_find(r, "model.layers.0.self_attn.q_proj.weight");
    long in = stz_reader_find(r, "model.layers.1.input_layernorm.weight");
    long ib = stz_reader_find(r, "model.layers.0.self_attn.k_proj.bias");
    assert_true(iq >= 0 && in >= 0 && ib >= 0);
    assert_true(stz_reader_find(r, "lm_head.weight") >= 0);
    const stz_tensor *q = stz_reader_tensor(r, (size_t)iq);
    assert_int_equal(q->shape[0], 64);
    assert_int_equal(q->shape[1], 64);
    assert_int_equal(stz_reader_tensor(r, (size_t)ib)->shape[0], 32); /* 2 KV heads of 16 */
    /* a weight matrix: zero mean, std near 1/sqrt(fan_in), heavy tails */
    float *v = malloc(q->numel * 4);
    assert_int_equal(stz_reader_read(r, q, 0, v, q->numel * 4, &err), STZ_OK);
    double s = 0, s2 = 0, s4 = 0;
    for (uint64_t i = 0; i < q->numel; i++)
        s += v[i], s2 += (double)v[i] * v[i];
    double mean = s / (double)q->numel, var = s2 / (double)q->numel - mean * mean;
    for (uint64_t i = 0; i < q->numel; i++)
        s4 += pow(v[i] - mean, 4);
    double kurt = s4 / (double)q->numel / (var * var);
    assert_true(fabs(mean) < 0.1 * sqrt(var));
    assert_true(sqrt(var) > 0.5 / 8 && sqrt(var) < 2.0 / 8);
    assert_true(kurt > 3.3); /* a Gaussian has 3 */
    free(v);
    /* norm weights near 1 */
    const stz_tensor *nw = stz_reader_tensor(r, (size_t)in);
    float nv[64];
    assert_int_equal(stz_reader_read(r, nw, 0, nv, sizeof nv, &err), STZ_OK);
    for (int i = 0; i < 64; i++)
        assert_true(nv[i] > 0.4f && nv[i] < 2.5f);
    stz_reader_free(r);
    /* the exponent entropy of a weight distribution (qwen2-0.5b measures 2.75) */
    assert_true(st.exp_entropy_bits > 2.4 && st.exp_entropy_bits < 3.0);
    free(p);
    tu_rmdir(dir);
}

static int stop_early(void *u, uint64_t done, uint64_t total)
{
    (void)u;
    return done * 2 >= total;
}

static void test_interrupted_leaves_nothing(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *p = tu_path(dir, "x.safetensors");
    stz_synth_params prm = STZ_SYNTH_PARAMS_DEFAULT;
    prm.progress = stop_early;
    stz_err err;
    assert_int_equal(stz_synth_write(&prm, p, NULL, &err), STZ_E_INTERRUPTED);
    assert_int_equal(tu_count_entries(dir), 0);
    prm.dtype = STZ_DTYPE_I8;
    assert_int_equal(stz_synth_write(&prm, p, NULL, &err), STZ_E_ARG);
    free(p);
    tu_rmdir(dir);
}

/* A Hugging Face folder: its shards hold the single file's tensors (the
 * same counts), beside the index, config.json and tokenizer.json; an
 * existing folder is refused and left as it is; an interrupted one leaves
 * nothing behind. */
static void test_folder(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *hf = tu_path(dir, "hf"), *hf2 = tu_path(dir, "hf2"), *one = tu_path(dir, "one.st");
    stz_synth_params prm = STZ_SYNTH_PARAMS_DEFAULT;
    stz_synth_stats a, b;
    stz_err err;
    assert_int_equal(stz_synth_write(&prm, one, &a, &err), STZ_OK);
    assert_int_equal(stz_synth_write_dir(&prm, hf, 3, &b, &err), STZ_OK);
    assert_int_equal(b.tensors, a.tensors);
    assert_int_equal(b.params, a.params);
    assert_int_equal(tu_count_entries(hf), 6);
    static const char *const names[] = {"model-00003-of-00003.safetensors", "model.safetensors.index.json",
                                        "config.json", "tokenizer.json"};
    for (int k = 0; k < 4; k++) {
        char *f = tu_path(hf, names[k]);
        assert_true(tu_exists(f));
        free(f);
    }
    assert_int_equal(stz_synth_write_dir(&prm, hf, 3, &b, &err), STZ_E_EXISTS);
    assert_int_equal(tu_count_entries(hf), 6);
    prm.progress = stop_early;
    assert_int_equal(stz_synth_write_dir(&prm, hf2, 2, &b, &err), STZ_E_INTERRUPTED);
    assert_int_equal(tu_count_entries(dir), 2); /* one.st and hf: no temporary folder left */
    stz_remove_tree(dir);
    free(dir), free(hf), free(hf2), free(one);
}

/* Pruned variants: the fraction of zeros in linear weights, whole 2:4
 * groups, embeddings and norms untouched, the other values as in the dense
 * model; bad settings refused. */
static void test_sparsity(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *dense = tu_path(dir, "d.safetensors"), *sparse = tu_path(dir, "s.safetensors");
    stz_synth_params prm = STZ_SYNTH_PARAMS_DEFAULT;
    prm.arch = "tiny", prm.dtype = STZ_DTYPE_F32;
    stz_err err;
    assert_int_equal(stz_synth_write(&prm, dense, NULL, &err), STZ_OK);
    for (int mode = 0; mode < 2; mode++) {
        prm.sparsity = mode ? 0 : 0.6, prm.two_four = mode, prm.write_flags = STZ_WRITE_FORCE;
        assert_int_equal(stz_synth_write(&prm, sparse, NULL, &err), STZ_OK);
        stz_reader *a, *b;
        assert_int_equal(stz_reader_open(&a, dense, &err), STZ_OK);
        assert_int_equal(stz_reader_open(&b, sparse, &err), STZ_OK);
        assert_string_equal(stz_reader_meta_get(b, "stz.synth.sparsity"), mode ? "2:4" : "0.6");
        uint64_t zeros = 0, linear = 0;
        for (size_t i = 0; i < stz_reader_count(a); i++) {
            const stz_tensor *t = stz_reader_tensor(a, i);
            size_t n = (size_t)t->numel;
            float *x = malloc(n * 4), *y = malloc(n * 4);
            assert_int_equal(stz_reader_read(a, t, 0, x, n * 4, &err), STZ_OK);
            assert_int_equal(stz_reader_read(b, stz_reader_tensor(b, i), 0, y, n * 4, &err), STZ_OK);
            int pruned = strstr(t->name, "_proj.weight") != NULL;
            for (size_t k = 0; k < n; k++) {
                assert_true(y[k] == 0 ? pruned : y[k] == x[k]); /* kept values unchanged */
                zeros += pruned && y[k] == 0, linear += pruned;
            }
            for (size_t g = 0; mode && pruned && g + 4 <= n; g += 4)
                assert_int_equal((y[g] == 0) + (y[g + 1] == 0) + (y[g + 2] == 0) + (y[g + 3] == 0), 2);
            free(x), free(y);
        }
        double frac = (double)zeros / (double)linear;
        if (fabs(frac - (mode ? 0.5 : 0.6)) > 0.01)
            fail_msg("mode %d: %.4f of the linear weights are zero", mode, frac);
        stz_reader_free(a), stz_reader_free(b);
    }
    prm.sparsity = 1.0, prm.two_four = 0;
    assert_int_equal(stz_synth_write(&prm, sparse, NULL, &err), STZ_E_ARG);
    prm.sparsity = 0.5, prm.two_four = 1;
    assert_int_equal(stz_synth_write(&prm, sparse, NULL, &err), STZ_E_ARG);
    unlink(dense), unlink(sparse);
    free(dense), free(sparse);
    tu_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arch_sizes), cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_contents),   cmocka_unit_test(test_interrupted_leaves_nothing),
        cmocka_unit_test(test_sparsity),   cmocka_unit_test(test_folder),
    };
    return cmocka_run_group_tests_name("synth", tests, NULL, NULL);
}
