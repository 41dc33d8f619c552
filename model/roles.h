/* The tensors of a checkpoint of arch.h's families by role: their names in
 * llama2.c's, Hugging Face's, GPT-Neo's, Gemma's and GPT-2's layouts and in GGUF, one table shared by
 * the forward pass (model/), GGUF export (export/) and whatever maps names
 * between them. Not installed. */
#ifndef STZ_ROLES_H
#define STZ_ROLES_H

#include "stz_forward.h"

/* The five source layouts (stz_names), as stz_fwd_layout tells them apart. */
#define STZ_NAMES_COUNT 5

/* Roles before STZ_ROLE_PER_LAYER are one tensor per layer (%u in the
 * names is the layer); the others one per model. Biases are optional. */
typedef enum {
    STZ_ROLE_ANORM,
    STZ_ROLE_WQ,
    STZ_ROLE_WK,
    STZ_ROLE_WV,
    STZ_ROLE_WO,
    STZ_ROLE_BQ,
    STZ_ROLE_BK,
    STZ_ROLE_BV,
    STZ_ROLE_BO,
    STZ_ROLE_FNORM,
    STZ_ROLE_GATE,
    STZ_ROLE_UP,
    STZ_ROLE_DOWN,
    STZ_ROLE_QNORM,   /* Qwen3: RMSNorm of each query head (arch.h, STZ_ARCH_QK_NORM) */
    STZ_ROLE_KNORM,   /* and of each key head */
    STZ_ROLE_WQKV,    /* Phi-3: q, k and v fused (rows: QD, then KD, KD) (STZ_ARCH_FUSED) */
    STZ_ROLE_GATE_UP, /* and gate and up fused (rows: hidden, then hidden) */
    STZ_ROLE_ANORM_B, /* GPT-Neo: the LayerNorms' biases (STZ_NORM_LAYER) */
    STZ_ROLE_FNORM_B,
    STZ_ROLE_UP_B, /* and the ungated MLP's (STZ_ACT_GELU_TANH) */
    STZ_ROLE_DOWN_B,
    STZ_ROLE_POST_ANORM, /* Gemma: RMSNorm of the attention's output (STZ_ARCH_POST_NORMS) */
    STZ_ROLE_POST_FNORM, /* and of the MLP's */
    STZ_ROLE_BQKV,       /* GPT-2: the fused q/k/v's bias (STZ_ARCH_CONV1D) */
    STZ_ROLE_PER_LAYER,
    STZ_ROLE_EMBED = STZ_ROLE_PER_LAYER,
    STZ_ROLE_NORM,
    STZ_ROLE_HEAD,
    STZ_ROLE_POS,    /* GPT-Neo: the learned position embedding (STZ_POS_LEARNED) */
    STZ_ROLE_NORM_B, /* and the final LayerNorm's bias */
    STZ_ROLE_COUNT
} stz_role;

/* name[layout]: NULL where a layout has no such tensor. `perm`: Hugging
 * Face q / k rows that llama.cpp's "llama" RoPE wants in (2i, 2i+1) pairs
 * (1: query heads, 2: key/value heads), else 0. */
typedef struct {
    const char *name[STZ_NAMES_COUNT];
    const char *gguf;
    int perm;
} stz_role_info;

extern const stz_role_info stz_roles[STZ_ROLE_COUNT];

/* The role of tensor `name` in a layout (STZ_NAMES_GGUF, _LLAMA2C, _HF)
 * among the roles family `arch` has (arch.h; NULL: any), and its layer (0
 * for a per-model role), or -1. */
struct stz_arch_row;
int stz_role_find(const char *name, int names, const struct stz_arch_row *arch, unsigned *layer);
/* The k-th other name a checkpoint may store `name` under (GPT2Model's
 * without "transformer.", a multimodal Gemma 3's under
 * "language_model."), into out: 1 written, 0 no such form of this name,
 * -1 past the last k. stz_role_find also finds a role by these names. */
int stz_role_alias(const char *name, size_t k, char *out, size_t cap);
/* Whether role r is an RMSNorm's weight (Gemma's are by 1 + w). */
int stz_role_is_norm(int r);
/* The GGUF name of a model tensor named in llama2.c's, Hugging Face's,
 * GPT-Neo's or GPT-2's layout (Gemma's matrices are named as Hugging
 * Face's), into out; 0 when the name has no role. */
int stz_role_gguf_name(const char *name, char *out, size_t cap);

#endif /* STZ_ROLES_H */
