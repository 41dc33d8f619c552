/* The tensor roles table (roles.h). */
#include "arch.h"
#include "roles.h"

#include <stdio.h>
#include <string.h>

const stz_role_info stz_roles[STZ_ROLE_COUNT] = {
    [STZ_ROLE_ANORM] = {{"layers.%u.attention_norm.weight", "model.layers.%u.input_layernorm.weight",
                         "transformer.h.%u.ln_1.weight", "model.layers.%u.input_layernorm.weight",
                         "transformer.h.%u.ln_1.weight"},
                        "blk.%u.attn_norm.weight",
                        0},
    [STZ_ROLE_WQ] = {{"layers.%u.attention.wq.weight", "model.layers.%u.self_attn.q_proj.weight",
                      "transformer.h.%u.attn.attention.q_proj.weight", "model.layers.%u.self_attn.q_proj.weight"},
                     "blk.%u.attn_q.weight",
                     1},
    [STZ_ROLE_WK] = {{"layers.%u.attention.wk.weight", "model.layers.%u.self_attn.k_proj.weight",
                      "transformer.h.%u.attn.attention.k_proj.weight", "model.layers.%u.self_attn.k_proj.weight"},
                     "blk.%u.attn_k.weight",
                     2},
    [STZ_ROLE_WV] = {{"layers.%u.attention.wv.weight", "model.layers.%u.self_attn.v_proj.weight",
                      "transformer.h.%u.attn.attention.v_proj.weight", "model.layers.%u.self_attn.v_proj.weight"},
                     "blk.%u.attn_v.weight",
                     0},
    [STZ_ROLE_WO] = {{"layers.%u.attention.wo.weight", "model.layers.%u.self_attn.o_proj.weight",
                      "transformer.h.%u.attn.attention.out_proj.weight", "model.layers.%u.self_attn.o_proj.weight",
                      "transformer.h.%u.attn.c_proj.weight"},
                     "blk.%u.attn_output.weight",
                     0},
    [STZ_ROLE_BQ] = {{"layers.%u.attention.wq.bias", "model.layers.%u.self_attn.q_proj.bias", NULL, NULL},
                     "blk.%u.attn_q.bias",
                     1},
    [STZ_ROLE_BK] = {{"layers.%u.attention.wk.bias", "model.layers.%u.self_attn.k_proj.bias", NULL, NULL},
                     "blk.%u.attn_k.bias",
                     2},
    [STZ_ROLE_BV] = {{"layers.%u.attention.wv.bias", "model.layers.%u.self_attn.v_proj.bias", NULL, NULL},
                     "blk.%u.attn_v.bias",
                     0},
    [STZ_ROLE_BO] = {{"layers.%u.attention.wo.bias", "model.layers.%u.self_attn.o_proj.bias",
                      "transformer.h.%u.attn.attention.out_proj.bias", NULL, "transformer.h.%u.attn.c_proj.bias"},
                     "blk.%u.attn_output.bias",
                     0},
    [STZ_ROLE_FNORM] = {{"layers.%u.ffn_norm.weight", "model.layers.%u.post_attention_layernorm.weight",
                         "transformer.h.%u.ln_2.weight", "model.layers.%u.pre_feedforward_layernorm.weight",
                         "transformer.h.%u.ln_2.weight"},
                        "blk.%u.ffn_norm.weight",
                        0},
    [STZ_ROLE_GATE] = {{"layers.%u.feed_forward.w1.weight", "model.layers.%u.mlp.gate_proj.weight", NULL,
                        "model.layers.%u.mlp.gate_proj.weight"},
                       "blk.%u.ffn_gate.weight",
                       0},
    [STZ_ROLE_UP] = {{"layers.%u.feed_forward.w3.weight", "model.layers.%u.mlp.up_proj.weight",
                      "transformer.h.%u.mlp.c_fc.weight", "model.layers.%u.mlp.up_proj.weight",
                      "transformer.h.%u.mlp.c_fc.weight"},
                     "blk.%u.ffn_up.weight",
                     0},
    [STZ_ROLE_DOWN] = {{"layers.%u.feed_forward.w2.weight", "model.layers.%u.mlp.down_proj.weight",
                        "transformer.h.%u.mlp.c_proj.weight", "model.layers.%u.mlp.down_proj.weight",
                        "transformer.h.%u.mlp.c_proj.weight"},
                       "blk.%u.ffn_down.weight",
                       0},
    [STZ_ROLE_QNORM] = {{"layers.%u.attention.q_norm.weight", "model.layers.%u.self_attn.q_norm.weight", NULL,
                         "model.layers.%u.self_attn.q_norm.weight"},
                        "blk.%u.attn_q_norm.weight",
                        0},
    [STZ_ROLE_KNORM] = {{"layers.%u.attention.k_norm.weight", "model.layers.%u.self_attn.k_norm.weight", NULL,
                         "model.layers.%u.self_attn.k_norm.weight"},
                        "blk.%u.attn_k_norm.weight",
                        0},
    [STZ_ROLE_WQKV] = {{"layers.%u.attention.wqkv.weight", "model.layers.%u.self_attn.qkv_proj.weight", NULL, NULL,
                        "transformer.h.%u.attn.c_attn.weight"},
                       "blk.%u.attn_qkv.weight",
                       0},
    [STZ_ROLE_GATE_UP] = {{"layers.%u.feed_forward.w13.weight", "model.layers.%u.mlp.gate_up_proj.weight", NULL, NULL},
                          "blk.%u.ffn_up.weight",
                          0},
    [STZ_ROLE_ANORM_B] = {{NULL, NULL, "transformer.h.%u.ln_1.bias", NULL, "transformer.h.%u.ln_1.bias"},
                          "blk.%u.attn_norm.bias",
                          0},
    [STZ_ROLE_FNORM_B] = {{NULL, NULL, "transformer.h.%u.ln_2.bias", NULL, "transformer.h.%u.ln_2.bias"},
                          "blk.%u.ffn_norm.bias",
                          0},
    [STZ_ROLE_UP_B] = {{NULL, NULL, "transformer.h.%u.mlp.c_fc.bias", NULL, "transformer.h.%u.mlp.c_fc.bias"},
                       "blk.%u.ffn_up.bias",
                       0},
    [STZ_ROLE_DOWN_B] = {{NULL, NULL, "transformer.h.%u.mlp.c_proj.bias", NULL, "transformer.h.%u.mlp.c_proj.bias"},
                         "blk.%u.ffn_down.bias",
                         0},
    [STZ_ROLE_POST_ANORM] = {{NULL, NULL, NULL, "model.layers.%u.post_attention_layernorm.weight"},
                             "blk.%u.post_attention_norm.weight",
                             0},
    [STZ_ROLE_POST_FNORM] = {{NULL, NULL, NULL, "model.layers.%u.post_feedforward_layernorm.weight"},
                             "blk.%u.post_ffw_norm.weight",
                             0},
    [STZ_ROLE_BQKV] = {{NULL, NULL, NULL, NULL, "transformer.h.%u.attn.c_attn.bias"}, "blk.%u.attn_qkv.bias", 0},
    [STZ_ROLE_EMBED] = {{"tok_embeddings.weight", "model.embed_tokens.weight", "transformer.wte.weight",
                         "model.embed_tokens.weight", "transformer.wte.weight"},
                        "token_embd.weight",
                        0},
    [STZ_ROLE_NORM] = {{"norm.weight", "model.norm.weight", "transformer.ln_f.weight", "model.norm.weight",
                        "transformer.ln_f.weight"},
                       "output_norm.weight",
                       0},
    [STZ_ROLE_HEAD] = {{"output.weight", "lm_head.weight", "lm_head.weight", "lm_head.weight", "lm_head.weight"},
                       "output.weight",
                       0},
    [STZ_ROLE_POS] = {{NULL, NULL, "transformer.wpe.weight", NULL, "transformer.wpe.weight"},
                      "position_embd.weight",
                      0},
    [STZ_ROLE_NORM_B] = {{NULL, NULL, "transformer.ln_f.bias", NULL, "transformer.ln_f.bias"}, "output_norm.bias", 0},
};

/* The prefixes checkpoints store a layout's names under: GPT-2's with
 * "transformer." (as GPT2LMHeadModel saves them) or without (GPT2Model);
 * a multimodal Gemma 3's language model under "language_model." (older
 * transformers) or "model.language_model." (newer). */
static const struct {
    const char *canonical, *stored;
} aliases[] = {{"transformer.", ""},
               {"model.", "language_model.model."},
               {"model.", "model.language_model."},
               {"lm_head.", "language_model.lm_head."}};

int stz_role_alias(const char *name, size_t k, char *out, size_t cap)
{
    if (k >= sizeof aliases / sizeof *aliases)
        return -1;
    size_t n = strlen(aliases[k].canonical);
    if (strncmp(name, aliases[k].canonical, n))
        return 0;
    return snprintf(out, cap, "%s%s", aliases[k].stored, name + n) < (int)cap;
}

static int role_find(const char *name, int names, const stz_arch *arch, unsigned *layer);

int stz_role_find(const char *name, int names, const stz_arch *arch, unsigned *layer)
{
    int r = role_find(name, names, arch, layer);
    for (size_t k = 0; r < 0 && names >= 0 && k < sizeof aliases / sizeof *aliases; k++) {
        size_t n = strlen(aliases[k].stored);
        char full[256];
        if (n ? !strncmp(name, aliases[k].stored, n)
              : names == STZ_NAMES_GPT2 && strncmp(name, aliases[k].canonical, strlen(aliases[k].canonical)))
            if (snprintf(full, sizeof full, "%s%s", aliases[k].canonical, name + n) < (int)sizeof full)
                r = role_find(full, names, arch, layer);
    }
    return r;
}

static int role_find(const char *name, int names, const stz_arch *arch, unsigned *layer)
{
    for (int r = 0; r < STZ_ROLE_COUNT; r++) {
        if (arch && r < STZ_ROLE_PER_LAYER && stz_arch_use(arch, r) == STZ_USE_NONE)
            continue;
        const char *pat = names < 0 ? stz_roles[r].gguf : stz_roles[r].name[names];
        if (!pat)
            continue;
        char back[256];
        unsigned l = 0;
        if (r < STZ_ROLE_PER_LAYER) { /* the layer is the first number after the pattern's fixed prefix */
            size_t pre = (size_t)(strstr(pat, "%u") - pat);
            if (strncmp(name, pat, pre) || sscanf(name + pre, "%u", &l) != 1)
                continue;
        }
        snprintf(back, sizeof back, pat, l);
        if (!strcmp(back, name))
            return *layer = l, r;
    }
    return -1;
}

int stz_role_is_norm(int r)
{
    return r == STZ_ROLE_ANORM || r == STZ_ROLE_FNORM || r == STZ_ROLE_POST_ANORM || r == STZ_ROLE_POST_FNORM ||
           r == STZ_ROLE_QNORM || r == STZ_ROLE_KNORM || r == STZ_ROLE_NORM;
}

int stz_role_gguf_name(const char *name, char *out, size_t cap)
{
    unsigned l = 0;
    static const int order[] = {STZ_NAMES_GPT2, STZ_NAMES_GPT_NEO, STZ_NAMES_HF, STZ_NAMES_LLAMA2C};
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) { /* Gemma's matrices are HF's */
        int r = stz_role_find(name, order[k], NULL, &l);
        if (r >= 0)
            return snprintf(out, cap, stz_roles[r].gguf, l), 1;
    }
    return 0;
}
