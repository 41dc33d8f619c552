/* The synthetic model generator's architectures and tensor lists
 * (synth_arch.c), used by the value generator (synth.c). Not installed. */
#ifndef STZ_SYNTH_INTERNAL_H
#define STZ_SYNTH_INTERNAL_H

#include "core/stz_core.h"
#include "stz_synth.h"

enum family { FAM_HF_LLAMA, FAM_GPT_NEO, FAM_GPT2, FAM_GEMMA };

typedef struct {
    const char *name, *desc;
    enum family fam;
    uint64_t hidden, inter, layers, heads, kv_heads, vocab, positions;
    int qkv_bias, tied;
    const char *model_type; /* written into the configuration (NULL: llama, or qwen2 with qkv_bias) */
    uint64_t head_dim;      /* 0: hidden / heads */
    int qk_norm;            /* q_norm and k_norm of every head (Qwen3) */
    int fused;              /* qkv_proj and gate_up_proj (Phi-3) */
    uint64_t window;        /* GPT-Neo: the local layers' window (window_size); Gemma: sliding_window */
    uint64_t pattern;       /* Gemma 3: sliding_window_pattern (every pattern-th layer global) */
} arch;

/* K_CONV: GPT-2's Conv1D, (in, out); K_NORM1: Gemma's norm weights w of 1 + w */
enum kind { K_LINEAR, K_EMBED, K_NORM, K_BIAS, K_CONV, K_NORM1 };

typedef struct {
    char name[96];
    int ndim;
    uint64_t shape[2];
    enum kind kind;
    int skip; /* not in the shard being written */
} spec;

typedef struct {
    spec *v;
    size_t n, cap;
    int oom;
} specs;

/* The architecture named `name`, or NULL. */
const arch *stz_synth_find_arch(const char *name);
/* Its tensors in file order (s->oom set if memory ran out). */
void stz_synth_build_specs(const arch *a, specs *s);
static inline uint64_t stz_synth_spec_numel(const spec *t) { return t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1); }

#endif /* STZ_SYNTH_INTERNAL_H */
