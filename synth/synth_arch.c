/* Synthetic models: the architectures (names, shapes) and each one's
 * tensor list, in the order real checkpoints store them. */
#include "synth_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const arch archs[] = {
    {"qwen2-0.5b", "Qwen2-0.5B: 24 layers, hidden 896, 14/2 heads, q/k/v biases, tied embeddings", FAM_HF_LLAMA, 896,
     4864, 24, 14, 2, 151936, 0, 1, 1, NULL, 0, 0, 0, 0, 0},
    {"qwen3-0.6b", "Qwen3-0.6B: 28 layers, hidden 1024, 16/8 heads of 128, q/k head norms, tied embeddings",
     FAM_HF_LLAMA, 1024, 3072, 28, 16, 8, 151936, 0, 0, 1, "qwen3", 128, 1, 0, 0, 0},
    {"phi3-mini", "Phi-3-mini-4k: 32 layers, hidden 3072, 32 heads, fused qkv and gate_up projections, lm_head",
     FAM_HF_LLAMA, 3072, 8192, 32, 32, 32, 32064, 0, 0, 0, "phi3", 0, 0, 1, 0, 0},
    {"llama-1b", "Llama-3.2-1B: 16 layers, hidden 2048, 32/8 heads, tied embeddings", FAM_HF_LLAMA, 2048, 8192, 16, 32,
     8, 128256, 0, 0, 1, NULL, 0, 0, 0, 0, 0},
    {"llama-3.1-8b", "Llama-3.1-8B: 32 layers, hidden 4096, 32/8 heads, separate lm_head", FAM_HF_LLAMA, 4096, 14336,
     32, 32, 8, 128256, 0, 0, 0, NULL, 0, 0, 0, 0, 0},
    {"tinyllama-1.1b", "TinyLlama-1.1B: 22 layers, hidden 2048, 32/4 heads, separate lm_head", FAM_HF_LLAMA, 2048, 5632,
     22, 32, 4, 32000, 0, 0, 0, NULL, 0, 0, 0, 0, 0},
    {"gpt-neo-1.3b", "GPT-Neo-1.3B: 24 layers, hidden 2048, 16 heads, learned positions, tied", FAM_GPT_NEO, 2048, 8192,
     24, 16, 16, 50257, 2048, 0, 1, NULL, 0, 0, 0, 256, 0},
    {"gpt2", "GPT-2 (124M): 12 layers, hidden 768, 12 heads, Conv1D weights (in, out), learned positions, tied",
     FAM_GPT2, 768, 3072, 12, 12, 12, 50257, 1024, 0, 1, NULL, 0, 0, 0, 0, 0},
    {"small", "small Llama-style model for quick runs: 8 layers, hidden 512, 8/4 heads, vocab 32000", FAM_HF_LLAMA, 512,
     1408, 8, 8, 4, 32000, 0, 0, 1, NULL, 0, 0, 0, 0, 0},
    {"tiny", "tiny Llama/Qwen2-style test model: 2 layers, hidden 64, q/k/v biases, lm_head", FAM_HF_LLAMA, 64, 172, 2,
     4, 2, 256, 0, 1, 0, NULL, 0, 0, 0, 0, 0},
    {"qwen3-tiny", "tiny Qwen3-style test model: 2 layers, hidden 64, 4/2 heads of 32, q/k head norms, lm_head",
     FAM_HF_LLAMA, 64, 192, 2, 4, 2, 256, 0, 0, 0, "qwen3", 32, 1, 0, 0, 0},
    {"phi3-tiny", "tiny Phi-3-style test model: 2 layers, hidden 64, 4/2 heads, fused qkv and gate_up, lm_head",
     FAM_HF_LLAMA, 64, 192, 2, 4, 2, 256, 0, 0, 0, "phi3", 0, 0, 1, 0, 0},
    {"gpt-neo-tiny", "tiny GPT-Neo-style test model: 2 layers, hidden 64, local attention on layer 1 (window 32)",
     FAM_GPT_NEO, 64, 256, 2, 4, 4, 256, 128, 0, 1, NULL, 0, 0, 0, 32, 0},
    {"gpt2-tiny", "tiny GPT-2-style test model: 2 layers, hidden 64, Conv1D weights", FAM_GPT2, 64, 256, 2, 4, 4, 256,
     128, 0, 1, NULL, 0, 0, 0, 0, 0},
    {"gemma2-2b",
     "Gemma-2-2B: 26 layers, hidden 2304, 8/4 heads of 256, window 4096 on alternate layers, soft-capping, tied",
     FAM_GEMMA, 2304, 9216, 26, 8, 4, 256000, 8192, 0, 1, "gemma2", 256, 0, 0, 4096, 2},
    {"gemma3-1b",
     "Gemma-3-1B: 26 layers, hidden 1152, 4/1 heads of 256, q/k head norms, 5 windowed (512) to 1 global, tied",
     FAM_GEMMA, 1152, 6912, 26, 4, 1, 262144, 32768, 0, 1, "gemma3_text", 256, 1, 0, 512, 6},
    {"gemma2-tiny",
     "tiny Gemma-2-style test model: 2 layers, hidden 64, 4/2 heads of 32, layer 0 windowed (16), soft-capping",
     FAM_GEMMA, 64, 256, 2, 4, 2, 256, 128, 0, 1, "gemma2", 32, 0, 0, 16, 2},
    {"gemma3-tiny",
     "tiny Gemma-3-style test model: 2 layers, hidden 64, 4/2 heads of 32, q/k head norms, layer 0 windowed (16)",
     FAM_GEMMA, 64, 256, 2, 4, 2, 256, 128, 0, 1, "gemma3_text", 32, 1, 0, 16, 2},
};
#define NARCH (sizeof archs / sizeof archs[0])

const char *stz_synth_arch_name(size_t i) { return i < NARCH ? archs[i].name : NULL; }
const char *stz_synth_arch_desc(size_t i) { return i < NARCH ? archs[i].desc : NULL; }

/* ---- tensor list ----------------------------------------------------- */

static void add(specs *s, enum kind k, uint64_t d0, uint64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void add(specs *s, enum kind k, uint64_t d0, uint64_t d1, const char *fmt, ...)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        spec *v = realloc(s->v, cap * sizeof *v);
        if (!v) {
            s->oom = 1;
            return;
        }
        s->v = v, s->cap = cap;
    }
    spec *t = &s->v[s->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->kind = k;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0, t->shape[1] = d1;
}

void stz_synth_build_specs(const arch *a, specs *s)
{
    uint64_t H = a->hidden, I = a->inter, V = a->vocab, HD = a->head_dim ? a->head_dim : H / a->heads,
             Q = HD * a->heads, KV = HD * a->kv_heads;
    if (a->fam == FAM_HF_LLAMA || a->fam == FAM_GEMMA) { /* Gemma: norms by 1 + w, after the attention and MLP too */
        int gemma = a->fam == FAM_GEMMA;
        enum kind norm = gemma ? K_NORM1 : K_NORM;
        add(s, K_EMBED, V, H, "model.embed_tokens.weight");
        for (uint64_t l = 0; l < a->layers; l++) {
            const char *p = "model.layers";
            add(s, norm, H, 0, "%s.%llu.input_layernorm.weight", p, (unsigned long long)l);
            const char *qkv[3] = {"q", "k", "v"};
            if (a->fused)
                add(s, K_LINEAR, Q + 2 * KV, H, "%s.%llu.self_attn.qkv_proj.weight", p, (unsigned long long)l);
            for (int j = 0; !a->fused && j < 3; j++) {
                uint64_t out = j ? KV : Q;
                add(s, K_LINEAR, out, H, "%s.%llu.self_attn.%s_proj.weight", p, (unsigned long long)l, qkv[j]);
                if (a->qkv_bias)
                    add(s, K_BIAS, out, 0, "%s.%llu.self_attn.%s_proj.bias", p, (unsigned long long)l, qkv[j]);
            }
            add(s, K_LINEAR, H, Q, "%s.%llu.self_attn.o_proj.weight", p, (unsigned long long)l);
            if (a->qk_norm)
                for (int j = 0; j < 2; j++)
                    add(s, norm, HD, 0, "%s.%llu.self_attn.%s_norm.weight", p, (unsigned long long)l, qkv[j]);
            add(s, norm, H, 0, "%s.%llu.post_attention_layernorm.weight", p, (unsigned long long)l);
            if (gemma)
                add(s, norm, H, 0, "%s.%llu.pre_feedforward_layernorm.weight", p, (unsigned long long)l);
            if (a->fused)
                add(s, K_LINEAR, 2 * I, H, "%s.%llu.mlp.gate_up_proj.weight", p, (unsigned long long)l);
            else {
                add(s, K_LINEAR, I, H, "%s.%llu.mlp.gate_proj.weight", p, (unsigned long long)l);
                add(s, K_LINEAR, I, H, "%s.%llu.mlp.up_proj.weight", p, (unsigned long long)l);
            }
            add(s, K_LINEAR, H, I, "%s.%llu.mlp.down_proj.weight", p, (unsigned long long)l);
            if (gemma)
                add(s, norm, H, 0, "%s.%llu.post_feedforward_layernorm.weight", p, (unsigned long long)l);
        }
        add(s, norm, H, 0, "model.norm.weight");
        if (!a->tied)
            add(s, K_LINEAR, V, H, "lm_head.weight");
    } else { /* GPT-Neo and GPT-2: learned positions, LayerNorms and MLP with biases; GPT-2's
              * Conv1D weights are stored (in, out), its q/k/v fused */
        int conv = a->fam == FAM_GPT2;
        enum kind w = conv ? K_CONV : K_LINEAR;
        add(s, K_EMBED, V, H, "transformer.wte.weight");
        add(s, K_EMBED, a->positions, H, "transformer.wpe.weight");
        for (uint64_t l = 0; l < a->layers; l++) {
            unsigned long long L = (unsigned long long)l;
            add(s, K_NORM, H, 0, "transformer.h.%llu.ln_1.weight", L);
            add(s, K_BIAS, H, 0, "transformer.h.%llu.ln_1.bias", L);
            if (conv) {
                add(s, K_CONV, H, 3 * H, "transformer.h.%llu.attn.c_attn.weight", L);
                add(s, K_BIAS, 3 * H, 0, "transformer.h.%llu.attn.c_attn.bias", L);
                add(s, K_CONV, H, H, "transformer.h.%llu.attn.c_proj.weight", L);
                add(s, K_BIAS, H, 0, "transformer.h.%llu.attn.c_proj.bias", L);
            } else {
                add(s, K_LINEAR, H, H, "transformer.h.%llu.attn.attention.k_proj.weight", L);
                add(s, K_LINEAR, H, H, "transformer.h.%llu.attn.attention.v_proj.weight", L);
                add(s, K_LINEAR, H, H, "transformer.h.%llu.attn.attention.q_proj.weight", L);
                add(s, K_LINEAR, H, H, "transformer.h.%llu.attn.attention.out_proj.weight", L);
                add(s, K_BIAS, H, 0, "transformer.h.%llu.attn.attention.out_proj.bias", L);
            }
            add(s, K_NORM, H, 0, "transformer.h.%llu.ln_2.weight", L);
            add(s, K_BIAS, H, 0, "transformer.h.%llu.ln_2.bias", L);
            add(s, w, conv ? H : I, conv ? I : H, "transformer.h.%llu.mlp.c_fc.weight", L);
            add(s, K_BIAS, I, 0, "transformer.h.%llu.mlp.c_fc.bias", L);
            add(s, w, conv ? I : H, conv ? H : I, "transformer.h.%llu.mlp.c_proj.weight", L);
            add(s, K_BIAS, H, 0, "transformer.h.%llu.mlp.c_proj.bias", L);
        }
        add(s, K_NORM, H, 0, "transformer.ln_f.weight");
        add(s, K_BIAS, H, 0, "transformer.ln_f.bias");
    }
}

const arch *stz_synth_find_arch(const char *name)
{
    for (size_t i = 0; i < NARCH; i++)
        if (name && strcmp(archs[i].name, name) == 0)
            return &archs[i];
    return NULL;
}

stz_status stz_synth_arch_size(const char *name, size_t *tensors, uint64_t *params, stz_err *err)
{
    const arch *a = stz_synth_find_arch(name);
    if (!a)
        return stz_err_set(err, STZ_E_ARG, "unknown architecture '%s' (see 'stz synth --list')", name ? name : "");
    specs s = {0};
    stz_synth_build_specs(a, &s);
    if (s.oom) {
        free(s.v);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the configuration");
    }
    *tensors = s.n;
    *params = 0;
    for (size_t i = 0; i < s.n; i++)
        *params += stz_synth_spec_numel(&s.v[i]);
    free(s.v);
    return STZ_OK;
}
