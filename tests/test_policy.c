/* Policies: matching, errors naming the rule, svd keys, the shipped
 * policies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "stz_eval.h"
#include "core/stz_core.h"
#include "stz_policy.h"
#include "stz_pack.h"
#include "stz_pipeline.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "stz_synth.h"
#include "test_util.h"

#include <math.h>

/* ---- policies -------------------------------------------------------- */

static stz_tensor mk(const char *name, stz_dtype dt, int ndim, const uint64_t *shape)
{
    stz_tensor t = {.name = name, .dtype = dt, .ndim = ndim, .shape = shape, .numel = 1};
    for (int i = 0; i < ndim; i++)
        t.numel *= shape[i];
    return t;
}

/* The llama.cpp type p decides for t (-1: another action). */
static int ggml_type_of(stz_policy *p, const stz_tensor *t)
{
    stz_decision d = stz_policy_decide(p, t);
    return stz_decision_ggml_type(&d);
}

static void test_policy_matching(void **state)
{
    (void)state;
    stz_policy *p = tu_policy(
        "{\"default\": \"int8\", \"rules\": ["
        "{\"match\": \"*embed_tokens*\", \"action\": \"keep\"},"
        "{\"match\": \"re:.*\\\\.(q|k|v|o)_proj\\\\.weight\", \"action\": \"int4\", \"block_size\": 64},"
        "{\"match\": \"*.mlp.*\", \"action\": \"int8\", \"dtypes\": [\"F32\"], \"min_ndim\": 2, "
        "\"scale_dtype\": \"F32\"},"
        "{\"match\": \"layers.[0-3].norm\", \"action\": \"int8\", \"include_1d\": true},"
        "{\"match\": \"big?\", \"action\": \"int4\", \"min_numel\": 1000, \"method\": \"mse\"},"
        "{\"match\": \"nothing.matches.me\", \"action\": \"keep\"}]}");
    uint64_t s2[2] = {64, 64}, s1[1] = {64}, sbig[2] = {100, 100}, ssmall[2] = {2, 2};
    stz_tensor t;
    stz_decision d;
    t = mk("model.embed_tokens.weight", STZ_DTYPE_BF16, 2, s2);
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.action, STZ_ACTION_KEEP);
    assert_int_equal(d.rule, 0);
    t = mk("model.layers.0.self_attn.k_proj.weight", STZ_DTYPE_BF16, 2, s2);
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.action, STZ_ACTION_INT4);
    assert_int_equal(d.block_size, 64);
    t = mk("model.layers.0.self_attn.k_proj.weight.extra", STZ_DTYPE_BF16, 2, s2); /* regex is anchored */
    assert_int_equal(stz_policy_decide(p, &t).rule, -1);
    t = mk("model.layers.0.mlp.up_proj.weight", STZ_DTYPE_F32, 2, s2);
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.rule, 2);
    assert_int_equal(d.scale_dtype, STZ_DTYPE_F32);
    t = mk("model.layers.0.mlp.up_proj.weight", STZ_DTYPE_BF16, 2, s2); /* dtype condition fails: default */
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.rule, -1);
    assert_int_equal(d.action, STZ_ACTION_INT8);
    t = mk("model.layers.0.mlp.bias", STZ_DTYPE_F32, 1, s1); /* min_ndim fails, default int8, but 1-D: kept */
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.action, STZ_ACTION_KEEP);
    assert_non_null(d.reason);
    t = mk("layers.2.norm", STZ_DTYPE_F16, 1, s1); /* explicit opt-in for 1-D */
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.action, STZ_ACTION_INT8);
    t = mk("layers.7.norm", STZ_DTYPE_F16, 1, s1); /* [0-3] does not match 7 */
    assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP);
    t = mk("bigA", STZ_DTYPE_F32, 2, sbig);
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.rule, 4);
    assert_int_equal(d.method, STZ_QMETHOD_MSE);
    t = mk("bigA", STZ_DTYPE_F32, 2, ssmall); /* min_numel fails */
    assert_int_equal(stz_policy_decide(p, &t).rule, -1);
    t = mk("ids", STZ_DTYPE_I64, 2, s2); /* non-float: kept whatever the rule says */
    d = stz_policy_decide(p, &t);
    assert_int_equal(d.action, STZ_ACTION_KEEP);
    assert_non_null(strstr(d.reason, "float"));
    assert_int_equal(stz_policy_rule_hits(p, 5), 0); /* plan warns about it */
    assert_true(stz_policy_rule_hits(p, 1) >= 1);
    stz_policy_free(p);
}

static void expect_policy_error(const char *json, const char *needle1, const char *needle2)
{
    stz_policy *p;
    stz_err err;
    assert_int_equal(stz_policy_parse(&p, json, strlen(json), "pol.json", &err), STZ_E_POLICY);
    assert_null(p);
    if (!strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2)))
        fail_msg("message '%s' lacks '%s' / '%s'", err.msg, needle1, needle2 ? needle2 : "");
    assert_non_null(strstr(err.msg, "pol.json"));
}

/* stz_policy_build: rules on top in the order given (the first match wins),
 * --method and --feedback on every block rule they reach, and the errors. */
static void test_policy_build(void **state)
{
    (void)state;
    static const stz_policy_rule_text rules[] = {{"norm*", 1}, {"*.weight=int8:block_size=32", 0}};
    stz_policy_spec spec = {NULL, rules, 2, "mse", 0, 1};
    stz_policy *p;
    stz_err err;
    if (stz_policy_build(&spec, &p, &err))
        fail_msg("%s", err.msg);
    uint64_t shape[2] = {8, 64};
    stz_tensor t = mk("a.weight", STZ_DTYPE_F32, 2, shape), n = mk("norm.weight", STZ_DTYPE_F32, 2, shape);
    stz_decision d = stz_policy_decide(p, &t);
    assert_int_equal(d.action, STZ_ACTION_INT8);
    assert_int_equal(d.block_size, 32);
    assert_int_equal(d.method, STZ_QMETHOD_MSE);
    assert_int_equal(d.feedback, 1);
    assert_int_equal(d.rule, 1);
    assert_int_equal(stz_policy_decide(p, &n).action, STZ_ACTION_KEEP); /* the first rule, before the second */
    stz_policy_free(p);
    static const stz_policy_rule_text keep_only[] = {{"*", 1}};
    stz_policy_spec none = {NULL, keep_only, 1, NULL, 64, 0};
    assert_int_equal(stz_policy_build(&none, &p, &err), STZ_E_ARG);
    assert_non_null(strstr(err.msg, "no int2..int8 rule to change"));
    static const stz_policy_rule_text bad[] = {{"*.weight", 0}};
    stz_policy_spec noeq = {"int8", bad, 1, NULL, 0, 0};
    assert_int_equal(stz_policy_build(&noeq, &p, &err), STZ_E_ARG);
    assert_non_null(strstr(err.msg, "expected PATTERN=ACTION"));
}

static void test_policy_errors(void **state)
{
    (void)state;
    expect_policy_error("[1]", "not a JSON object", NULL);
    expect_policy_error("{\"rules\": [", "invalid JSON", NULL);
    expect_policy_error("{\"colour\": 1}", "unknown top-level key 'colour'", NULL);
    expect_policy_error("{\"rules\": {}}", "must be an array", NULL);
    expect_policy_error("{\"default\": \"zip\"}", "default", "unknown action 'zip'");
    expect_policy_error("{\"rules\": [{\"match\": \"a*\", \"action\": \"int7\"}]}", "rule 0 ('a*')",
                        "unknown action 'int7'");
    expect_policy_error(
        "{\"rules\": [{\"match\": \"a\", \"action\": \"keep\"}, {\"match\": \"b*\", \"action\": \"int8\", "
        "\"blocksize\": 4}]}",
        "rule 1 ('b*')", "unknown key 'blocksize'");
    expect_policy_error("{\"rules\": [{\"match\": \"re:([a-\", \"action\": \"int8\"}]}", "rule 0 ('re:([a-')",
                        "bad regular expression");
    expect_policy_error("{\"rules\": [{\"match\": \"x\", \"action\": \"int8\", \"block_size\": 0}]}", "rule 0 ('x')",
                        "block_size");
    expect_policy_error("{\"rules\": [{\"match\": \"x\", \"action\": \"int8\", \"block_size\": 1.5}]}", "block_size",
                        NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"x\", \"action\": \"int8\", \"scale_dtype\": \"I8\"}]}",
                        "scale_dtype", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"x\", \"action\": \"int8\", \"dtypes\": [\"F99\"]}]}",
                        "unknown dtype 'F99'", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"x\", \"action\": \"int8\", \"include_1d\": 1}]}", "include_1d",
                        NULL);
    expect_policy_error("{\"rules\": [{\"action\": \"int8\"}]}", "rule 0", "missing \"match\"");
    expect_policy_error("{\"rules\": [{\"match\": \"x\"}]}", "rule 0 ('x')", "missing \"action\"");
    expect_policy_error("{\"rules\": [{\"match\": \"x\", \"action\": \"int8\", \"rank\": 4}]}",
                        "'rank' applies to the svd", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"*k_proj.weight\", \"action\": \"svd\"}]}",
                        "rule 0 ('*k_proj.weight')", "exactly one of rank, energy, max_error");
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"rank\": 8, \"energy\": 0.9}]}",
                        "rule 0 ('k')", "exactly one");
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"rank\": 0}]}", "rank must be", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"energy\": 1.5}]}", "energy must be",
                        NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"max_error\": 0}]}", "max_error must be",
                        NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"rank\": 4, \"fallback\": \"svd\"}]}",
                        "fallback must be", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"int8\", \"method\": \"randomized\"}]}",
                        "'method' applies to the svd action", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"rank\": 4, \"power_iters\": 2}]}",
                        "'power_iters' applies to method \"randomized\"", NULL);
    expect_policy_error(
        "{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"rank\": 4, \"method\": \"randomized\", "
        "\"power_iters\": 17}]}",
        "power_iters must be", NULL);
    expect_policy_error(
        "{\"rules\": [{\"match\": \"k\", \"action\": \"svd\", \"rank\": 4, \"method\": \"randomized\", "
        "\"oversample\": -1}]}",
        "oversample must be", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"int4\", \"oversample\": 5}]}",
                        "'oversample' applies to the svd action", NULL);
}

static void test_policy_randomized_keys(void **state)
{
    (void)state;
    static const char json[] =
        "{\"rules\": [{\"match\": \"a\", \"action\": \"svd\", \"rank\": 8, \"oversample\": 0, "
        "\"method\": \"randomized\", \"power_iters\": 3}, "
        "{\"match\": \"b\", \"action\": \"svd\", \"rank\": 8, \"method\": \"randomized\"}]}";
    stz_policy *p;
    stz_err err;
    assert_int_equal(stz_policy_parse(&p, json, sizeof json - 1, "t", &err), STZ_OK);
    uint64_t sq[2] = {64, 64};
    stz_tensor t = mk("a", STZ_DTYPE_F32, 2, sq);
    stz_decision d = stz_policy_decide(p, &t);
    assert_true(d.svd_randomized && d.svd_power_iters == 3 && d.svd_oversample == 0);
    t = mk("b", STZ_DTYPE_F32, 2, sq);
    d = stz_policy_decide(p, &t);
    assert_true(d.svd_randomized && d.svd_power_iters == 1 && d.svd_oversample == 10); /* the defaults */
    stz_policy_free(p);
}

/* A width with no method: int4 takes nl and int8 mse (measured best at
 * the same bytes), other widths absmax; a method the rule or the default
 * names wins, and the default's is inherited. */
static void test_policy_width_methods(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        stz_qmethod a, b, c;
    } cases[] = {
        {"{\"rules\": [{\"match\": \"a\", \"action\": \"int4\"}, {\"match\": \"b\", \"action\": \"int8\"}, "
         "{\"match\": \"c\", \"action\": \"int5\"}]}",
         STZ_QMETHOD_NL, STZ_QMETHOD_MSE, STZ_QMETHOD_ABSMAX},
        {"{\"rules\": [{\"match\": \"a\", \"action\": \"int4\", \"method\": \"absmax\"}, "
         "{\"match\": \"b\", \"action\": \"int8\", \"method\": \"full\"}, {\"match\": \"c\", \"action\": \"int4\", "
         "\"method\": \"mse\"}]}",
         STZ_QMETHOD_ABSMAX, STZ_QMETHOD_FULL, STZ_QMETHOD_MSE},
        {"{\"default\": {\"action\": \"keep\", \"method\": \"full\"}, \"rules\": [{\"match\": \"a\", \"action\": "
         "\"int4\"}, {\"match\": \"b\", \"action\": \"int8\"}, {\"match\": \"c\", \"action\": \"int4\", \"method\": "
         "\"nl\"}]}",
         STZ_QMETHOD_FULL, STZ_QMETHOD_FULL, STZ_QMETHOD_NL},
    };
    uint64_t sq[2] = {64, 128};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        stz_policy *p;
        stz_err err;
        assert_int_equal(stz_policy_parse(&p, cases[k].json, strlen(cases[k].json), "t", &err), STZ_OK);
        const char *names[] = {"a", "b", "c"};
        stz_qmethod want[] = {cases[k].a, cases[k].b, cases[k].c};
        for (int i = 0; i < 3; i++) {
            stz_tensor t = mk(names[i], STZ_DTYPE_F32, 2, sq);
            assert_int_equal(stz_policy_decide(p, &t).method, want[i]);
        }
        stz_policy_free(p);
    }
}

/* "pad": rows that are not whole 32-blocks keep a 32-block type (a
 * 256-block type its stand-in), not F16; whole rows are as without it. */
static void test_policy_pad(void **state)
{
    (void)state;
    static const char json[] =
        "{\"rules\": [{\"match\": \"a\", \"action\": \"q5_1\", \"pad\": true}, "
        "{\"match\": \"b\", \"action\": \"q4_k\", \"pad\": true}, "
        "{\"match\": \"c\", \"action\": \"q4_k\"}]}";
    stz_policy *p;
    stz_err err;
    assert_int_equal(stz_policy_parse(&p, json, sizeof json - 1, "t", &err), STZ_OK);
    uint64_t odd[2] = {64, 172}, w32[2] = {64, 64}, w256[2] = {4, 512};
    const struct {
        const char *name;
        const uint64_t *shape;
        int want; /* the llama.cpp type */
        int reason;
    } cases[] = {{"a", odd, STZ_GGML_Q5_1, 0}, {"b", odd, STZ_GGML_Q5_0, 1},  {"c", odd, STZ_GGML_F16, 1},
                 {"b", w32, STZ_GGML_Q5_0, 1}, {"b", w256, STZ_GGML_Q4_K, 0}, {"a", w32, STZ_GGML_Q5_1, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        stz_tensor t = mk(cases[k].name, STZ_DTYPE_F32, 2, cases[k].shape);
        stz_decision d = stz_policy_decide(p, &t);
        assert_int_equal(d.action, STZ_ACTION_GGML);
        assert_int_equal(d.ggml_type, cases[k].want);
        assert_int_equal(d.reason != NULL, cases[k].reason);
    }
    stz_policy_free(p);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"int4\", \"pad\": true}]}",
                        "pad applies to llama.cpp's block types", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"f16\", \"pad\": true}]}",
                        "pad applies to llama.cpp's block types", NULL);
    expect_policy_error("{\"rules\": [{\"match\": \"k\", \"action\": \"q4_0\", \"pad\": 1}]}",
                        "pad must be true or false", NULL);
}

static void test_builtin_policies(void **state)
{
    (void)state;
    int n = 0;
    for (size_t i = 0; stz_policy_builtin_name(i); i++, n++) {
        const char *name = stz_policy_builtin_name(i);
        stz_policy *p;
        stz_err err;
        stz_status st = stz_policy_load(&p, name, &err);
        if (st)
            fail_msg("%s: %s", name, err.msg);
        if (!strcmp(name, "gpt-neo-surgical")) {
            uint64_t sq[2] = {2048, 2048};
            stz_tensor t = mk("transformer.h.4.attn.attention.k_proj.weight", STZ_DTYPE_F32, 2, sq);
            assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP); /* the sensitive layer */
            t = mk("transformer.h.5.attn.attention.k_proj.weight", STZ_DTYPE_F32, 2, sq);
            stz_decision d = stz_policy_decide(p, &t);
            assert_int_equal(d.action, STZ_ACTION_SVD);
            assert_int_equal(d.svd_rank, 128);
            assert_int_equal(d.fallback, STZ_ACTION_INT8);
            t = mk("transformer.h.5.mlp.c_fc.weight", STZ_DTYPE_F32, 2, sq);
            assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP);
            t = mk("transformer.h.5.attn.attention.q_proj.weight", STZ_DTYPE_F32, 2, sq);
            assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP);
            stz_policy_free(p);
            continue;
        }
        if (!strcmp(name, "int4") ||
            !strcmp(name, "gguf-mix4")) { /* llama.cpp's types by role, with its fallbacks for narrow rows */
            static const char *roles[] = {"model.embed_tokens.weight",
                                          "tok_embeddings.weight",
                                          "lm_head.weight",
                                          "model.layers.3.self_attn.v_proj.weight",
                                          "layers.1.attention.wk.weight",
                                          "model.layers.3.self_attn.q_proj.weight",
                                          "transformer.h.0.attn.c_attn.weight"};
            static const int wide[] = {STZ_GGML_Q5_K, STZ_GGML_Q5_K,   STZ_GGML_Q6_K,  STZ_GGML_Q6_K,
                                       STZ_GGML_Q5_K, STZ_GGML_IQ4_NL, STZ_GGML_IQ4_NL};
            static const int narrow[] = {STZ_GGML_Q5_1, STZ_GGML_Q5_1,   STZ_GGML_Q8_0,  STZ_GGML_Q8_0,
                                         STZ_GGML_Q5_1, STZ_GGML_IQ4_NL, STZ_GGML_IQ4_NL};
            uint64_t sw[2] = {64, 512}, sn[2] = {512, 64}, so[2] = {64, 172}, s1[1] = {64};
            for (int k = 0; k < 7; k++) {
                stz_tensor t = mk(roles[k], STZ_DTYPE_F32, 2, sw);
                assert_int_equal(ggml_type_of(p, &t), wide[k]);
                t = mk(roles[k], STZ_DTYPE_F32, 2, sn);
                assert_int_equal(ggml_type_of(p, &t), narrow[k]);
                t = mk(roles[k], STZ_DTYPE_BF16, 2, so);
                assert_int_equal(ggml_type_of(p, &t), STZ_GGML_BF16); /* no block type takes 172 */
            }
            stz_tensor t = mk("model.norm.weight", STZ_DTYPE_F32, 1, s1);
            assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP);
            stz_policy_free(p);
            continue;
        }
        /* int8 (gguf-q8_0) and gguf-q4_0: Q8_0 or Q4_0 everywhere, embeddings and head included; F16 where
           rows are not whole blocks */
        if (!strcmp(name, "int8") || !strcmp(name, "gguf-q8_0") || !strcmp(name, "gguf-q4_0")) {
            uint64_t s2[2] = {512, 64}, so[2] = {64, 172}, s1[1] = {64};
            static const char *names[] = {"model.embed_tokens.weight", "lm_head.weight", "tok_embeddings.weight",
                                          "model.layers.3.self_attn.q_proj.weight", "layers.2.feed_forward.w1.weight"};
            for (int k = 0; k < 5; k++) {
                stz_tensor t = mk(names[k], STZ_DTYPE_F32, 2, s2);
                assert_int_equal(ggml_type_of(p, &t), !strcmp(name, "gguf-q4_0") ? STZ_GGML_Q4_0 : STZ_GGML_Q8_0);
                t = mk(names[k], STZ_DTYPE_F32, 2, so);
                assert_int_equal(ggml_type_of(p, &t), STZ_GGML_F16);
            }
            stz_tensor t = mk("model.norm.weight", STZ_DTYPE_F32, 1, s1);
            assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP);
            stz_policy_free(p);
            continue;
        }
        /* every shipped policy keeps norms and embeddings, under every naming */
        uint64_t s1[1] = {64}, s2[2] = {512, 64};
        static const char *keep_names[] = {
            "model.embed_tokens.weight", "transformer.wte.weight", "transformer.wpe.weight",
            "tok_embeddings.weight",     "lm_head.weight",         "output.weight"};
        stz_tensor t = mk("model.norm.weight", STZ_DTYPE_BF16, 1, s1);
        assert_int_equal(stz_policy_decide(p, &t).action, STZ_ACTION_KEEP);
        for (int k = 0; k < 6; k++) {
            t = mk(keep_names[k], STZ_DTYPE_BF16, 2, s2);
            stz_action want = !strcmp(name, "int4-small") ? STZ_ACTION_INT8 : STZ_ACTION_KEEP;
            if (stz_policy_decide(p, &t).action != want)
                fail_msg("policy %s: %s", name, keep_names[k]);
        }
        static const char *lin[] = {"model.layers.3.self_attn.q_proj.weight", "transformer.h.0.attn.c_attn.weight",
                                    "transformer.h.4.attn.attention.k_proj.weight", "layers.2.feed_forward.w1.weight"};
        for (int k = 0; k < 4; k++) {
            t = mk(lin[k], STZ_DTYPE_BF16, 2, s2);
            stz_action got = stz_policy_decide(p, &t).action;
            stz_action want = !strcmp(name, "lossless")    ? STZ_ACTION_KEEP
                              : !strcmp(name, "int8-b128") ? STZ_ACTION_INT8
                              : !strcmp(name, "int5")      ? STZ_ACTION_INT5
                                                           : STZ_ACTION_INT4;
            if (got != want)
                fail_msg("policy %s: %s got %s", name, lin[k], stz_action_name(got, -1));
            /* the 4- and 5-bit policies use the nl codebook with U8 scales */
            stz_decision d = stz_policy_decide(p, &t);
            if (want == STZ_ACTION_INT4 || want == STZ_ACTION_INT5)
                assert_true(d.method == STZ_QMETHOD_NL && d.scale_dtype == STZ_DTYPE_U8);
        }
        stz_policy_free(p);
    }
    assert_int_equal(n, 11);
    /* the old names read the old rules */
    const char *a = stz_policy_builtin_text("gguf-mix4"), *b = stz_policy_builtin_text("int4");
    assert_true(a && b && !strcmp(a, b));
    stz_policy *p;
    stz_err err;
    assert_int_equal(stz_policy_load(&p, "no-such-policy", &err), STZ_E_IO);
    assert_non_null(strstr(err.msg, "no-such-policy"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_matching),      cmocka_unit_test(test_policy_errors),
        cmocka_unit_test(test_builtin_policies),     cmocka_unit_test(test_policy_randomized_keys),
        cmocka_unit_test(test_policy_pad),           cmocka_unit_test(test_policy_build),
        cmocka_unit_test(test_policy_width_methods),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
