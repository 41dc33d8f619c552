/* The size of the file llama.cpp's llama-quantize TYPE makes of a model
 * (no importance matrix, not --pure): its per-tensor rules, as
 * llama_tensor_get_type in llama.cpp's src/llama-quant.cpp gives them for
 * Llama and Qwen2 models without experts, and its fallbacks for rows that
 * are not whole 256-blocks: the budget `stz gguf --like TYPE` meets, and
 * the types `stz export --type q4_k_m` (a mix) writes. */
#include "gguf_export.h"
#include "quant/ggml_types.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

/* llama-quantize's types: the name, the type most tensors get, its
 * LLAMA_FTYPE (general.file_type). */
static const struct {
    const char *name;
    int type, ftype;
} likes[STZ_GGUF_LIKE_COUNT] = {
    {"q4_0", STZ_GGML_Q4_0, 2},      {"q4_1", STZ_GGML_Q4_1, 3},    {"q5_0", STZ_GGML_Q5_0, 8},
    {"q5_1", STZ_GGML_Q5_1, 9},      {"q8_0", STZ_GGML_Q8_0, 7},    {"iq4_nl", STZ_GGML_IQ4_NL, 25},
    {"iq4_xs", STZ_GGML_IQ4_XS, 30}, {"q2_k", STZ_GGML_Q2_K, 10},   {"q3_k_s", STZ_GGML_Q3_K, 11},
    {"q3_k_m", STZ_GGML_Q3_K, 12},   {"q3_k_l", STZ_GGML_Q3_K, 13}, {"q4_k_s", STZ_GGML_Q4_K, 14},
    {"q4_k_m", STZ_GGML_Q4_K, 15},   {"q5_k_s", STZ_GGML_Q5_K, 16}, {"q5_k_m", STZ_GGML_Q5_K, 17},
    {"q6_k", STZ_GGML_Q6_K, 18},
};
enum {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    IQ4_NL,
    IQ4_XS,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K
};

const char *stz_gguf_like_name(int i) { return i >= 0 && i < STZ_GGUF_LIKE_COUNT ? likes[i].name : NULL; }

void stz_gguf_like_json(cJSON *d, const stz_gguf_stats *s)
{
    cJSON *like = cJSON_AddObjectToObject(d, "llama_quantize_bytes");
    for (int i = 0; like && i < STZ_GGUF_LIKE_COUNT; i++)
        if (s->like_bytes[i])
            cJSON_AddNumberToObject(like, stz_gguf_like_name(i), (double)s->like_bytes[i]);
}

int stz_gguf_like_parse(const char *name)
{
    for (int i = 0; name && i < STZ_GGUF_LIKE_COUNT; i++)
        if (!strcasecmp(name, likes[i].name))
            return i;
    return -1;
}

/* What llama-quantize leaves as it is: not a matrix, not named "weight",
 * a norm. */
static int kept(const etensor *e)
{
    size_t n = strlen(e->name);
    return e->ndim < 2 || n < 6 || strcmp(e->name + n - 6, "weight") || strstr(e->name, "_norm.weight");
}

/* llama.cpp's use_more_bits: the first and last eighth, and every third
 * layer between. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The layer of "blk.N.*", else -1. */
static int layer_of(const char *name)
{
    int l;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

/* The model's shape as the rules read it. */
typedef struct {
    int n_layer, gqa4, is_70b, tied;
} shape;

static int attn_v(int f, int def, int i, const shape *s)
{
    int t = f == Q2_K                                                  ? (s->gqa4 ? STZ_GGML_Q4_K : STZ_GGML_Q3_K)
            : f == Q3_K_M                                              ? (i < 2 ? STZ_GGML_Q5_K : STZ_GGML_Q4_K)
            : f == Q3_K_L                                              ? STZ_GGML_Q5_K
            : (f == IQ4_NL || f == IQ4_XS) && s->gqa4                  ? STZ_GGML_Q5_K
            : (f == Q4_K_M || f == Q5_K_M) && more_bits(i, s->n_layer) ? STZ_GGML_Q6_K
            : f == Q4_K_S && i < 4                                     ? STZ_GGML_Q5_K
                                                                       : def;
    return s->is_70b && (t == STZ_GGML_Q3_K || t == STZ_GGML_Q4_K) ? STZ_GGML_Q5_K : t;
}

static int ffn_down(int f, int def, int i, const shape *s)
{
    int n = s->n_layer;
    return f == Q2_K                                                  ? STZ_GGML_Q3_K
           : f == Q3_K_M                                              ? (i < n / 16 ? STZ_GGML_Q5_K : STZ_GGML_Q4_K)
           : f == Q3_K_L                                              ? STZ_GGML_Q5_K
           : (f == Q4_K_M || f == Q5_K_M) && more_bits(i, n)          ? STZ_GGML_Q6_K
           : (f == Q4_K_S || f == IQ4_NL || f == IQ4_XS) && i < n / 8 ? STZ_GGML_Q5_K
                                                                      : def;
}

/* llama_tensor_get_type's choice for tensor e under type f. */
static int rule(int f, const etensor *e, const shape *s)
{
    int def = likes[f].type, i = layer_of(e->name);
    if (!strcmp(e->name, "output.weight") || (s->tied && !strcmp(e->name, "token_embd.weight")))
        return e->ne[0] % stz_ggml_traits_of(def)->block ? STZ_GGML_Q8_0 : def == STZ_GGML_Q8_0 ? def : STZ_GGML_Q6_K;
    if (strstr(e->name, "attn_v.weight"))
        return attn_v(f, def, i, s);
    if (strstr(e->name, "ffn_down"))
        return ffn_down(f, def, i, s);
    if (strstr(e->name, "attn_qkv.weight"))
        return f == Q3_K_M || f == Q3_K_L ? STZ_GGML_Q4_K
               : f == Q4_K_M              ? STZ_GGML_Q5_K
               : f == Q5_K_M              ? STZ_GGML_Q6_K
                                          : def;
    if (strstr(e->name, "attn_output.weight"))
        return f == Q2_K ? STZ_GGML_Q3_K : f == Q3_K_M ? STZ_GGML_Q4_K : f == Q3_K_L ? STZ_GGML_Q5_K : def;
    return def;
}

static shape shape_of(const stz_fwd_config *c, int tied)
{
    return (shape){
        (int)c->n_layers, c->n_kv_heads && c->n_heads / c->n_kv_heads >= 4,
        c->n_layers == 80 && ((stz_arch_of(c)->flags & STZ_ARCH_70B_BY_DEPTH) || c->n_heads != c->n_kv_heads), tied};
}

/* The type tensor e takes under type f before fallbacks (F32 where
 * llama-quantize keeps a tensor, as llama.cpp's convert writes it). */
static int like_rule(int f, const etensor *e, const shape *s) { return kept(e) ? STZ_GGML_F32 : rule(f, e, s); }

int stz_gguf_like_type(int like, const etensor *e, const stz_fwd_config *c, int tied)
{
    shape s = shape_of(c, tied);
    return like_rule(like, e, &s);
}

int stz_gguf_like_ftype(int like) { return likes[like].ftype; }

/* ... and after them: llama.cpp's fallbacks for rows that are not whole
 * blocks (stz_ggml_fallback); -1 where llama-quantize fails ("Unsupported
 * tensor size encountered": a 32-block type on such rows). */
static int like_final(int f, const etensor *e, const shape *s)
{
    int t = like_rule(f, e, s), fb = t == STZ_GGML_F32 ? t : stz_ggml_fallback(t, e->ne[0]);
    return fb == STZ_GGML_F16 && stz_ggml_block(t) != 256 ? -1 : fb;
}

/* The file's bytes under type f: the header, each tensor's data padded to
 * the alignment; 0 when llama-quantize cannot make it. */
static uint64_t like_bytes(const etensor *t, size_t n, int f, const shape *s, uint64_t header)
{
    uint64_t total = gguf_padded(header);
    for (size_t k = 0; k < n; k++) {
        const etensor *e = &t[k];
        int type = like_final(f, e, s);
        if (type < 0)
            return 0;
        total += gguf_padded(stz_ggml_row_bytes(type, e->ne[0]) * (e->ndim == 2 ? e->ne[1] : 1));
    }
    return total;
}

void stz_gguf_like_sizes(const etensor *t, size_t n, const stz_fwd_config *c, int tied, uint64_t header, uint64_t *out)
{
    shape s = shape_of(c, tied);
    for (int f = 0; f < STZ_GGUF_LIKE_COUNT; f++)
        out[f] = like_bytes(t, n, f, &s, header);
}
