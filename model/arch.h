/* The architectures the forward pass runs, one row each: the names a
 * family goes by (Hugging Face's model_type and class, llama.cpp's GGUF
 * architecture and tokenizer pre-processing) and what its layers do that
 * a Llama layer does not. config.c, the forward pass, GGUF export and the
 * vocabulary read the row; adding a Llama variant is a row here (the
 * table in docs/ARCHITECTURE.md says what else a new family takes). Not
 * installed. */
#ifndef STZ_ARCH_H
#define STZ_ARCH_H

#include "stz_forward.h"

enum {
    STZ_ARCH_QK_NORM = 1 << 0,      /* RMSNorm of every query and key head (q_norm, k_norm) before RoPE */
    STZ_ARCH_SW_OPT_IN = 1 << 1,    /* sliding_window applies only with use_sliding_window */
    STZ_ARCH_NO_BOS = 1 << 2,       /* llama.cpp adds no BOS token for a BPE vocabulary */
    STZ_ARCH_QKV_BIAS = 1 << 3,     /* llama.cpp's loader needs the q, k and v biases of every layer */
    STZ_ARCH_ROPE_PAIRS = 1 << 4,   /* llama.cpp's RoPE takes (2i, 2i+1) pairs: HF q/k rows permuted */
    STZ_ARCH_70B_BY_DEPTH = 1 << 5, /* llama-quantize takes 80 layers for its 70B rules */
    STZ_ARCH_FUSED = 1 << 6,        /* q/k/v and gate/up fused in one matrix each (Phi-3) */
    STZ_ARCH_GGUF_SWA = 1 << 7,     /* the sliding window written as GGUF's attention.sliding_window */
    STZ_ARCH_NO_SCALE = 1 << 8,     /* attention scores not scaled by 1/sqrt(head_dim) (GPT-Neo) */
    STZ_ARCH_POST_NORMS = 1 << 9,   /* RMSNorms of the attention's and the MLP's outputs too (Gemma) */
    STZ_ARCH_EMBED_SCALE = 1 << 10, /* the embedding's rows times sqrt(dim) (Gemma) */
    STZ_ARCH_CONV1D = 1 << 11,      /* q/k/v fused with a bias, the matrices stored (in, out) (GPT-2's Conv1D) */
};

/* A layer's norms, MLP and positions (the row's norm, act and pos). */
enum { STZ_NORM_RMS, STZ_NORM_LAYER, STZ_NORM_RMS_1W }; /* RMSNorm; LayerNorm with a bias; RMSNorm by 1 + w */
/* SiLU-gated gate/up; ungated up, tanh GELU, with biases; tanh-GELU-gated gate/up */
enum { STZ_ACT_SWIGLU, STZ_ACT_GELU_TANH, STZ_ACT_GEGLU };
enum { STZ_POS_ROPE, STZ_POS_LEARNED }; /* RoPE on q and k; a learned position embedding added to the input */

/* The keys of a family's config.json, and the defaults where one is absent. */
typedef struct {
    const char *dim, *hidden, *layers, *heads, *max_pos, *eps, *act, *act_value;
    double eps_default;
    int hidden_x4; /* an absent or null hidden size is 4 x dim */
} stz_arch_keys;

/* How a family has a per-layer role (roles.h). */
enum { STZ_USE_NONE, STZ_USE_NEED, STZ_USE_MAY };

typedef struct stz_arch_row {
    const char *model_type; /* Hugging Face config.json's model_type */
    const char *hf_class;   /* its architectures[0] */
    const char *gguf;       /* general.architecture, and the prefix of the hyperparameters' keys; NULL: llama.cpp
                             * has no such architecture (export refuses it) */
    const char *pre;        /* tokenizer.ggml.pre of a BPE vocabulary */
    unsigned flags;
    const stz_arch_keys *keys;
    unsigned char norm, act, pos;
    int layout;               /* the tensors' names (stz_names): Hugging Face's, GPT-Neo's, Gemma's or GPT-2's */
    unsigned char swa_period; /* sliding_window on all but every swa_period-th layer, unless the config's
                               * layer_types or sliding_window_pattern say otherwise (0: on all layers) */
    const char *title;        /* the family as messages name it */
    /* A multimodal checkpoint whose language model is this family: its
     * model_type and class, its config.json's text_config read with
     * `defaults` (JSON) for the keys it leaves out (NULL: none) */
    const char *outer_type, *outer_class, *defaults;
} stz_arch;

/* Row `id` (stz_arch_id), or NULL. */
const stz_arch *stz_arch_get(int id);
/* The row of config.c's stz_fwd_config.arch. */
const stz_arch *stz_arch_of(const stz_fwd_config *c);
/* Whether family a stores role `role`'s matrix (in, out), transposed (GPT-2's Conv1D). */
int stz_arch_conv1d(const stz_arch *a, int role);
/* How family a has role `role` (per layer or per model): STZ_USE_NONE, _NEED or _MAY (optional). */
int stz_arch_use(const stz_arch *a, int role);
/* Which name stz_arch_find looks up. */
enum { STZ_ARCH_BY_MODEL_TYPE, STZ_ARCH_BY_CLASS, STZ_ARCH_BY_GGUF };
/* The first row of that name, or -1. */
int stz_arch_find(const char *name, int by);
/* The model_types (classes) stz runs, comma-separated, into buf (for messages). */
const char *stz_arch_list(char *buf, size_t cap, int classes);

#endif /* STZ_ARCH_H */
