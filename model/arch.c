/* The architecture rows (arch.h). */
#include "arch.h"
#include "roles.h"

#include <stdio.h>
#include <string.h>

static const stz_arch_keys llama_keys = {"hidden_size",
                                         "intermediate_size",
                                         "num_hidden_layers",
                                         "num_attention_heads",
                                         "max_position_embeddings",
                                         "rms_norm_eps",
                                         "hidden_act",
                                         "silu",
                                         1e-6,
                                         0};
static const stz_arch_keys gpt_neo_keys = {
    "hidden_size",        "intermediate_size",   "num_layers", "num_heads", "max_position_embeddings",
    "layer_norm_epsilon", "activation_function", "gelu_new",   1e-5,        1};

static const stz_arch_keys gemma_keys = {"hidden_size",
                                         "intermediate_size",
                                         "num_hidden_layers",
                                         "num_attention_heads",
                                         "max_position_embeddings",
                                         "rms_norm_eps",
                                         "hidden_activation",
                                         "gelu_pytorch_tanh",
                                         1e-6,
                                         0};

static const stz_arch_keys gpt2_keys = {
    "n_embd",   "n_inner", "n_layer", "n_head", "n_positions", "layer_norm_epsilon", "activation_function",
    "gelu_new", 1e-5,      1};

/* Gemma3TextConfig's defaults: a multimodal checkpoint's text_config
 * holds only the keys that differ from them. */
static const char gemma3_defaults[] =
    "{\"vocab_size\":262208,\"hidden_size\":2304,\"intermediate_size\":9216,\"num_hidden_layers\":26,"
    "\"num_attention_heads\":8,\"num_key_value_heads\":4,\"head_dim\":256,\"max_position_embeddings\":131072,"
    "\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,\"query_pre_attn_scalar\":256,\"sliding_window\":4096,"
    "\"sliding_window_pattern\":6,\"rope_local_base_freq\":10000.0,\"bos_token_id\":2,\"tie_word_embeddings\":true}";

#define LLAMA_LIKE  .keys = &llama_keys, .layout = STZ_NAMES_HF
#define GEMMA_FLAGS (STZ_ARCH_POST_NORMS | STZ_ARCH_EMBED_SCALE)
#define GEMMA_LIKE  .keys = &gemma_keys, .norm = STZ_NORM_RMS_1W, .act = STZ_ACT_GEGLU, .layout = STZ_NAMES_GEMMA

static const stz_arch rows[STZ_ARCH_COUNT] = {
    [STZ_ARCH_LLAMA] = {"llama", "LlamaForCausalLM", "llama", "llama-bpe", STZ_ARCH_ROPE_PAIRS, LLAMA_LIKE,
                        .title = "Llama"},
    [STZ_ARCH_MISTRAL] = {"mistral", "MistralForCausalLM", "llama", "llama-bpe", STZ_ARCH_ROPE_PAIRS, LLAMA_LIKE,
                          .title = "Mistral"},
    [STZ_ARCH_QWEN2] = {"qwen2", "Qwen2ForCausalLM", "qwen2", "qwen2",
                        STZ_ARCH_SW_OPT_IN | STZ_ARCH_NO_BOS | STZ_ARCH_QKV_BIAS | STZ_ARCH_70B_BY_DEPTH, LLAMA_LIKE,
                        .title = "Qwen2"},
    [STZ_ARCH_QWEN3] = {"qwen3", "Qwen3ForCausalLM", "qwen3", "qwen2",
                        STZ_ARCH_QK_NORM | STZ_ARCH_SW_OPT_IN | STZ_ARCH_NO_BOS, LLAMA_LIKE, .title = "Qwen3"},
    [STZ_ARCH_PHI3] = {"phi3", "Phi3ForCausalLM", "phi3", "default", STZ_ARCH_FUSED | STZ_ARCH_GGUF_SWA, LLAMA_LIKE,
                       .title = "Phi-3"},
    [STZ_ARCH_GPT_NEO] = {"gpt_neo", "GPTNeoForCausalLM", NULL, NULL, STZ_ARCH_NO_SCALE, .keys = &gpt_neo_keys,
                          .norm = STZ_NORM_LAYER, .act = STZ_ACT_GELU_TANH, .pos = STZ_POS_LEARNED,
                          .layout = STZ_NAMES_GPT_NEO, .title = "GPT-Neo"},
    [STZ_ARCH_GEMMA2] = {"gemma2", "Gemma2ForCausalLM", "gemma2", "default", GEMMA_FLAGS, GEMMA_LIKE, .swa_period = 2,
                         .title = "Gemma 2"},
    [STZ_ARCH_GEMMA3] = {"gemma3_text", "Gemma3ForCausalLM", "gemma3", "default", GEMMA_FLAGS | STZ_ARCH_QK_NORM,
                         GEMMA_LIKE, .swa_period = 6, .title = "Gemma 3", .outer_type = "gemma3",
                         .outer_class = "Gemma3ForConditionalGeneration", .defaults = gemma3_defaults},
    [STZ_ARCH_GPT2] = {"gpt2", "GPT2LMHeadModel", "gpt2", "gpt-2", STZ_ARCH_CONV1D | STZ_ARCH_NO_BOS,
                       .keys = &gpt2_keys, .norm = STZ_NORM_LAYER, .act = STZ_ACT_GELU_TANH, .pos = STZ_POS_LEARNED,
                       .layout = STZ_NAMES_GPT2, .title = "GPT-2"},
};

int stz_arch_conv1d(const stz_arch *a, int role)
{
    return (a->flags & STZ_ARCH_CONV1D) &&
           (role == STZ_ROLE_WQKV || role == STZ_ROLE_WO || role == STZ_ROLE_UP || role == STZ_ROLE_DOWN);
}

int stz_arch_use(const stz_arch *a, int role)
{
    int fused = (a->flags & STZ_ARCH_FUSED) != 0, conv = (a->flags & STZ_ARCH_CONV1D) != 0,
        layer_norm = a->norm == STZ_NORM_LAYER, gated = a->act != STZ_ACT_GELU_TANH;
    switch (role) {
    case STZ_ROLE_BQ:
    case STZ_ROLE_BK:
    case STZ_ROLE_BV: return fused || !gated ? STZ_USE_NONE : STZ_USE_MAY; /* GPT-Neo, GPT-2: none */
    case STZ_ROLE_BO: return fused ? STZ_USE_NONE : gated ? STZ_USE_MAY : STZ_USE_NEED;
    case STZ_ROLE_BQKV: return conv ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_QNORM:
    case STZ_ROLE_KNORM: return a->flags & STZ_ARCH_QK_NORM ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_WQ:
    case STZ_ROLE_WK:
    case STZ_ROLE_WV: return fused || conv ? STZ_USE_NONE : STZ_USE_NEED;
    case STZ_ROLE_UP: return fused ? STZ_USE_NONE : STZ_USE_NEED;
    case STZ_ROLE_GATE: return fused || !gated ? STZ_USE_NONE : STZ_USE_NEED;
    case STZ_ROLE_WQKV: return fused || conv ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_GATE_UP: return fused ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_ANORM_B:
    case STZ_ROLE_FNORM_B: return layer_norm ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_UP_B:
    case STZ_ROLE_DOWN_B: return gated ? STZ_USE_NONE : STZ_USE_NEED;
    case STZ_ROLE_POS: return a->pos == STZ_POS_LEARNED ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_NORM_B: return layer_norm ? STZ_USE_NEED : STZ_USE_NONE;
    case STZ_ROLE_POST_ANORM:
    case STZ_ROLE_POST_FNORM: return a->flags & STZ_ARCH_POST_NORMS ? STZ_USE_NEED : STZ_USE_NONE;
    default: return STZ_USE_NEED;
    }
}

const stz_arch *stz_arch_get(int id) { return id >= 0 && id < STZ_ARCH_COUNT ? &rows[id] : NULL; }

const stz_arch *stz_arch_of(const stz_fwd_config *c) { return &rows[c->arch < STZ_ARCH_COUNT ? c->arch : 0]; }

int stz_arch_find(const char *name, int by)
{
    for (int i = 0; i < STZ_ARCH_COUNT; i++) {
        const char *n = by == STZ_ARCH_BY_GGUF    ? rows[i].gguf
                        : by == STZ_ARCH_BY_CLASS ? rows[i].hf_class
                                                  : rows[i].model_type;
        if (n && !strcmp(n, name))
            return i;
    }
    return -1;
}

const char *stz_arch_list(char *buf, size_t cap, int classes)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < STZ_ARCH_COUNT && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", classes ? rows[i].hf_class : rows[i].model_type);
    return buf;
}
