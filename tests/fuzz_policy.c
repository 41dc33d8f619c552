/* Fuzz target for policies: any byte string is policy JSON. Whatever the
 * parser accepts must decide every tensor of a fixed set with an action,
 * block size and method in range; whatever it refuses must say why. Built
 * with -DSTZ_FUZZ=ON as a libFuzzer target; replayed in CTest over
 * tests/corpus/policy. */
#include "stz_policy.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint64_t mat[2] = {64, 96}, vec[1] = {64}, big[2] = {512, 4096};
    static const stz_tensor ts[] = {
        {"model.embed_tokens.weight", STZ_DTYPE_BF16, 2, big, 512 * 4096, 0, 0},
        {"model.layers.0.self_attn.q_proj.weight", STZ_DTYPE_F32, 2, mat, 64 * 96, 0, 0},
        {"model.layers.0.mlp.down_proj.weight", STZ_DTYPE_F16, 2, mat, 64 * 96, 0, 0},
        {"model.layers.0.input_layernorm.weight", STZ_DTYPE_F32, 1, vec, 64, 0, 0},
        {"lm_head.weight", STZ_DTYPE_BF16, 2, big, 512 * 4096, 0, 0},
        {"model.layers.0.mlp.gate_proj.bias", STZ_DTYPE_I32, 1, vec, 64, 0, 0},
    };
    stz_policy *p;
    stz_err err;
    if (stz_policy_parse(&p, (const char *)data, size, "fuzz", &err) != STZ_OK) {
        if (err.code == STZ_OK || !err.msg[0])
            abort();
        return 0;
    }
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        stz_decision d = stz_policy_decide(p, &ts[i]);
        if (d.action >= STZ_ACTION_COUNT || d.rule < -1 || d.rule >= (int)stz_policy_rule_count(p))
            abort();
        if (!strcmp(stz_action_name(d.action, d.ggml_type), "?"))
            abort(); /* a llama.cpp action is one of the types stz writes */
        if ((d.action == STZ_ACTION_INT8 || d.action == STZ_ACTION_INT4) &&
            (!d.block_size || d.method >= STZ_QMETHOD_COUNT))
            abort();
        if (d.action != STZ_ACTION_KEEP && ts[i].dtype == STZ_DTYPE_I32)
            abort(); /* integer tensors are never quantized, whatever the rule says */
        if (d.action == STZ_ACTION_SVD && !d.svd_rank && d.svd_energy <= 0 && d.svd_max_error <= 0)
            abort();
    }
    for (size_t i = 0; i < stz_policy_rule_count(p); i++)
        if (!stz_policy_rule_pattern(p, i))
            abort();
    stz_policy_free(p);
    return 0;
}
