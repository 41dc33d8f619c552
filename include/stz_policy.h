/*
 * stz_policy.h - per-tensor decisions from a JSON policy.
 *
 * A policy is an ordered list of rules plus a default; the first rule whose
 * pattern and conditions match a tensor decides its action (docs/POLICY.md):
 *
 *   {"default": "keep",
 *    "rules": [{"match": "*embed_tokens*", "action": "keep"},
 *              {"match": "re:.*\\.(q|k|v|o)_proj\\.weight$", "action": "int4", "block_size": 128},
 *              {"match": "*.mlp.*", "action": "int8", "dtypes": ["BF16","F16","F32"], "min_ndim": 2}]}
 *
 * Safe by default: a quantizing action is never applied to a tensor with
 * fewer than 2 dimensions (norms, biases) or of a non-float dtype unless
 * the rule opts in with "include_1d": true (floats only); such tensors are
 * kept and the decision says why.
 */
#ifndef STZ_POLICY_H
#define STZ_POLICY_H

#include "stz.h"
#include "stz_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    STZ_ACTION_KEEP = 0,
    STZ_ACTION_INT8 = 1,
    STZ_ACTION_INT4 = 2,
    STZ_ACTION_SVD = 3,
    STZ_ACTION_INT2 = 4,
    STZ_ACTION_INT3 = 5,
    STZ_ACTION_INT5 = 6,
    STZ_ACTION_INT6 = 7,
    STZ_ACTION_COUNT
} stz_action;

/* absmax: symmetric, the largest magnitude maps to +-(2^(bits-1) - 1);
 * full: symmetric, the signed extreme maps to -2^(bits-1) (llama.cpp's Q4_0);
 * mse: symmetric, the scale searched for the lowest squared error;
 * asym: scale and minimum per block, codes 0..2^bits - 1;
 * nl: a non-uniform codebook of 2^bits levels (a fixed one), scale searched;
 * nl-fit: nl with the codebook fitted to each tensor. */
typedef enum {
    STZ_QMETHOD_ABSMAX = 0,
    STZ_QMETHOD_MSE = 1,
    STZ_QMETHOD_FULL = 2,
    STZ_QMETHOD_ASYM = 3,
    STZ_QMETHOD_NL = 4,
    STZ_QMETHOD_NL_FIT = 5, /* nl with the codebook fitted to each tensor (stored in the file) */
    STZ_QMETHOD_COUNT
} stz_qmethod;
typedef enum { STZ_NONFINITE_ERROR = 0, STZ_NONFINITE_KEEP = 1 } stz_nonfinite;

typedef struct {
    stz_action action;
    uint32_t block_size;     /* elements per block along the last dimension */
    stz_dtype scale_dtype;   /* F16 (default), F32, or U8 (8-bit log codes under a per-tensor base) */
    stz_qmethod method;      /* absmax (default), mse, full, asym, nl */
    stz_nonfinite nonfinite; /* what NaN/Inf in the tensor does */
    /* svd only: exactly one of rank / energy / max_error is set (non-zero) */
    uint32_t svd_rank;
    double svd_energy, svd_max_error;
    int svd_randomized;      /* method "randomized" (default "exact") */
    uint32_t svd_power_iters; /* randomized: power iterations q (default 1) */
    uint32_t svd_oversample;  /* randomized: extra sketch columns (default 10) */
    stz_action fallback;     /* when factors would not be smaller: keep, int8 (default) or int4 */
    int rule;                /* index of the deciding rule, -1 for the default */
    const char *reason;      /* static text when the action was overridden, else NULL */
} stz_decision;

typedef struct stz_policy stz_policy;

/* Parses policy JSON text; `label` names it in messages. Errors
 * (STZ_E_POLICY) name the rule index and pattern and the problem: unknown
 * key, unknown action, bad regex, bad value. */
stz_status stz_policy_parse(stz_policy **out, const char *json, size_t len, const char *label, stz_err *err);
/* Loads a policy file, or a shipped policy by name ("int8", "int5", "int4",
 * "int4-small", "lossless", "gpt-neo-surgical") when no such file exists. */
stz_status stz_policy_load(stz_policy **out, const char *path_or_name, stz_err *err);
void stz_policy_free(stz_policy *p);

/* Decides for one tensor. Also counts matches per rule (for warnings);
 * safe to call from several threads. */
stz_decision stz_policy_decide(stz_policy *p, const stz_tensor *t);

size_t stz_policy_rule_count(const stz_policy *p);
const char *stz_policy_rule_pattern(const stz_policy *p, size_t i);
/* 1 if rule i says "optional": true (it may match nothing, unwarned). */
int stz_policy_rule_optional(const stz_policy *p, size_t i);
/* Tensors that rule i matched since the policy was loaded. */
uint64_t stz_policy_rule_hits(const stz_policy *p, size_t i);

const char *stz_action_name(stz_action a);
/* Bits per value of a quantizing action (int2..int8), 0 for keep and svd. */
int stz_action_bits(stz_action a);
const char *stz_qmethod_name(stz_qmethod m);

/* Shipped policies: name i (NULL past the end) and its JSON text. */
const char *stz_policy_builtin_name(size_t i);
const char *stz_policy_builtin_text(const char *name);

#ifdef __cplusplus
}
#endif
#endif
