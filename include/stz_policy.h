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
#include "stz_quant.h"
#include "stz_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stz_policy stz_policy;

/* Parses policy JSON text; `label` names it in messages. Errors
 * (STZ_E_POLICY) name the rule index and pattern and the problem: unknown
 * key, unknown action, bad regex, bad value. */
STZ_API stz_status stz_policy_parse(stz_policy **out, const char *json, size_t len, const char *label, stz_err *err);
/* Loads a policy file, or a shipped policy by name ("int8", "int5", "int4",
 * "int4-small", "lossless", "gpt-neo-surgical") when no such file exists. */
STZ_API stz_status stz_policy_load(stz_policy **out, const char *path_or_name, stz_err *err);
STZ_API void stz_policy_free(stz_policy *p);

/* A rule given on top of a policy: PATTERN=ACTION[:key=value...] (a value
 * that reads as a number or true/false is one), or with keep, a PATTERN
 * whose tensors are kept. */
typedef struct {
    const char *text;
    int keep;
} stz_policy_rule_text;
/* A policy (a file or a shipped name; NULL: {"default": "keep"}) with, on
 * top of it, rules before its own in the order given (the first match
 * wins), a method and a block size for every int2..int8 rule (NULL, 0: as
 * they are; asym's scales become F16 where they were U8), and with
 * feedback "feedback": true on every block quantization rule
 * (STZ_POLICY_FEEDBACK_ALL) or on those that do not say (UNSAID: the
 * default calibration); as the command line's --set, --keep, --method,
 * --block-size and --feedback (docs/POLICY.md). */
enum { STZ_POLICY_FEEDBACK_ALL = 1, STZ_POLICY_FEEDBACK_UNSAID = 2 };
typedef struct {
    const char *policy;
    const stz_policy_rule_text *rules;
    size_t nrules;
    const char *method;
    int block_size;
    int feedback;
} stz_policy_spec;
/* The policy spec describes, parsed (errors in the policy itself are
 * reported against it first). A method or block size with no int2..int8
 * rule to change is an error. */
STZ_API stz_status stz_policy_build(const stz_policy_spec *spec, stz_policy **out, stz_err *err);

/* Decides for one tensor. Also counts matches per rule (for warnings);
 * safe to call from several threads. */
STZ_API stz_decision stz_policy_decide(stz_policy *p, const stz_tensor *t);

/* 1 if a rule (or the default) asks for error feedback ("feedback": true). */
STZ_API int stz_policy_feedback(const stz_policy *p);

/* The policy's rules: how many, and rule i's "match" pattern as written. */
STZ_API size_t stz_policy_rule_count(const stz_policy *p);
STZ_API const char *stz_policy_rule_pattern(const stz_policy *p, size_t i);
/* 1 if rule i says "optional": true (it may match nothing, unwarned). */
STZ_API int stz_policy_rule_optional(const stz_policy *p, size_t i);
/* Tensors that rule i matched since the policy was loaded. */
STZ_API uint64_t stz_policy_rule_hits(const stz_policy *p, size_t i);

/* Shipped policies: name i (NULL past the end) and its JSON text. */
STZ_API const char *stz_policy_builtin_name(size_t i);
STZ_API const char *stz_policy_builtin_text(const char *name);

#ifdef __cplusplus
}
#endif
#endif
