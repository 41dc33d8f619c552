/* Model configuration of the forward pass: Hugging Face config.json or
 * llama2.c-style JSON, checked and refused by name when unsupported. */
#include "arch.h"
#include "core/stz_core.h"
#include "stz_forward.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A whole number in [lo, hi] under `key`, or `dflt` when absent (or null). */
static int get_u32(const cJSON *o, const char *key, double lo, double hi, uint32_t dflt, uint32_t *v, const char *label,
                   stz_err *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        if (dflt == UINT32_MAX)
            return stz_err_set(err, STZ_E_FORMAT, "%s: '%s' is missing", label, key), -1;
        *v = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return stz_err_set(err, STZ_E_FORMAT, "%s: '%s' must be a whole number in [%.0f, %.0f]", label, key, lo, hi),
               -1;
    *v = (uint32_t)j->valuedouble;
    return 0;
}

static int get_real(const cJSON *o, const char *key, double lo, double hi, double dflt, double *v, const char *label,
                    stz_err *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j))
        return *v = dflt, 0;
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi))
        return stz_err_set(err, STZ_E_FORMAT, "%s: '%s' must be a number in [%g, %g]", label, key, lo, hi), -1;
    *v = j->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *key, int dflt)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

static const char *get_str(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

#define BIG 1048576.0

/* rope_scaling: null, "linear" or "llama3"; anything else is refused. */
static int parse_rope_scaling(stz_fwd_config *c, const cJSON *root, const char *label, stz_err *err)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return 0;
    const char *kind = get_str(rs, "rope_type");
    kind = kind ? kind : get_str(rs, "type");
    if (!cJSON_IsObject(rs) || !kind)
        return stz_err_set(err, STZ_E_FORMAT, "%s: 'rope_scaling' has no 'rope_type'", label), -1;
    if (get_real(rs, "factor", 1, 1e6, NAN, &c->rope_factor, label, err))
        return -1;
    if (isnan(c->rope_factor))
        return stz_err_set(err, STZ_E_FORMAT, "%s: 'rope_scaling' has no 'factor'", label), -1;
    if (!strcmp(kind, "linear"))
        return c->rope_scaling = STZ_ROPE_LINEAR, 0;
    if (!strcmp(kind, "llama3")) {
        uint32_t orig;
        if (get_real(rs, "low_freq_factor", 1e-6, 1e6, 1, &c->rope_low_freq, label, err) ||
            get_real(rs, "high_freq_factor", 1e-6, 1e6, 4, &c->rope_high_freq, label, err) ||
            get_u32(rs, "original_max_position_embeddings", 1, 1e9, 8192, &orig, label, err))
            return -1;
        if (c->rope_high_freq <= c->rope_low_freq)
            return stz_err_set(err, STZ_E_FORMAT, "%s: rope_scaling high_freq_factor must exceed low_freq_factor",
                               label),
                   -1;
        c->rope_orig_pos = orig;
        return c->rope_scaling = STZ_ROPE_LLAMA3, 0;
    }
    return stz_err_set(err, STZ_E_UNSUPPORTED,
                       "%s: rope_scaling of type '%s' is not supported (only linear and llama3)", label, kind),
           -1;
}

/* The family of a Hugging Face config.json: its model_type's row, whose
 * class architectures[0] must be when given; Llama when neither is given
 * (stz synth's metadata). */
static int parse_arch(stz_fwd_config *c, const cJSON *root, const char *label, stz_err *err)
{
    const char *mt = get_str(root, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const char *cls = cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0))
                          ? cJSON_GetArrayItem(archs, 0)->valuestring
                          : NULL;
    int a = mt    ? stz_arch_find(mt, STZ_ARCH_BY_MODEL_TYPE)
            : cls ? stz_arch_find(cls, STZ_ARCH_BY_CLASS)
                  : STZ_ARCH_LLAMA;
    char list[256];
    if (a < 0 || (cls && strcmp(cls, stz_arch_get(a)->hf_class)))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: %s '%s' is not supported (stz runs %s)", label,
                           a < 0 && mt ? "model_type" : "architecture", a < 0 && mt ? mt : cls,
                           stz_arch_list(list, sizeof list, !(a < 0 && mt))),
               -1;
    c->arch = (stz_arch_id)a;
    return 0;
}

/* The names of a global and a local layer: GPT-Neo's attention_types, Gemma's layer_types. */
static const char *const kind_names[2][2] = {{"global", "local"}, {"full_attention", "sliding_attention"}};

/* Appends `times` x the kinds of `list` (names: kind_names[names]) to local[*l..n). 0, or
 * -1 a kind neither, -2 more than n layers. */
static int add_kinds(const cJSON *list, double times, int names, unsigned char *local, uint32_t n, uint32_t *l)
{
    const cJSON *k;
    for (double t = 0; t < times; t++)
        cJSON_ArrayForEach(k, list)
        {
            int is_local = cJSON_IsString(k) && !strcmp(k->valuestring, kind_names[names][1]);
            if (!is_local && !(cJSON_IsString(k) && !strcmp(k->valuestring, kind_names[names][0])))
                return -1;
            if (*l >= n)
                return -2;
            local[(*l)++] = (unsigned char)is_local;
        }
    return 0;
}

/* The kinds of attention of the layers: GPT-Neo's attention_types
 * ([[["global", "local"], 12]]: each list of kinds repeated its count of
 * times) or attention_layers (the list expanded), or Gemma's layer_types
 * (["sliding_attention", ..., "full_attention"]), as local_window's period
 * and mask; none: every layer global (Gemma: its row's pattern). The
 * window: `window_key`'s. */
static int parse_local_layers(stz_fwd_config *c, const cJSON *root, const char *window_key, uint32_t window,
                              const char *label, stz_err *err)
{
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "attention_types"),
                *layers = cJSON_GetObjectItemCaseSensitive(root, "attention_layers"),
                *gemma = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *g;
    int names = cJSON_IsArray(gemma);
    layers = names ? gemma : layers;
    if (!cJSON_IsArray(types) && !cJSON_IsArray(layers))
        return 0;
    unsigned char *local = malloc(c->n_layers);
    if (!local)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the attention types"), -1;
    uint32_t n = c->n_layers, l = 0, period = 1, mask = 0;
    int r = 0;
    if (cJSON_IsArray(types))
        cJSON_ArrayForEach(g, types)
        {
            const cJSON *kinds = cJSON_GetArrayItem(g, 0), *count = cJSON_GetArrayItem(g, 1);
            double times = cJSON_IsNumber(count) ? count->valuedouble : -1;
            r = !cJSON_IsArray(kinds) || !(times >= 0 && times <= 65536) || times != floor(times)
                    ? -3
                    : add_kinds(kinds, times, 0, local, n, &l);
            if (r)
                break;
        }
    else
        r = add_kinds(layers, 1, names, local, n, &l);
    r = r ? r : l != n ? -2 : 0;
    for (; !r && period <= 32; period++) { /* the shortest period the layers repeat */
        uint32_t i = period;
        while (i < n && local[i] == local[i % period])
            i++;
        if (i == n)
            break;
    }
    for (uint32_t i = 0; !r && period <= 32 && i < period && i < n; i++)
        mask |= (uint32_t)local[i] << i;
    free(local);
    if ((r == -1 || r == -3) && names)
        return stz_err_set(err, STZ_E_FORMAT, "%s: 'layer_types' must list \"sliding_attention\" or \"full_attention\"",
                           label),
               -1;
    if (r == -1 || r == -3)
        return stz_err_set(err, STZ_E_FORMAT, "%s: '%s' must list [[\"global\" or \"local\", ...], count] groups",
                           label, cJSON_IsArray(types) ? "attention_types" : "attention_layers"),
               -1;
    if (r == -2)
        return stz_err_set(err, STZ_E_FORMAT, "%s: the attention types are not one for each of the %u layers", label,
                           n),
               -1;
    if (period > 32)
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: local attention on layers that do not repeat every 32 or fewer is not supported",
                           label),
               -1;
    if (!mask)
        return 0;
    c->local_period = period, c->local_mask = mask;
    return get_u32(root, window_key, 1, 1e9, window, &c->local_window, label, err);
}

/* Gemma's sliding windows: layer_types, else every sliding_window_pattern-th
 * layer global (Gemma 2: every second), the others windowed. */
static int parse_swa_layers(stz_fwd_config *c, const cJSON *root, const stz_arch *row, const char *label, stz_err *err)
{
    uint32_t period;
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "layer_types")))
        return parse_local_layers(c, root, "sliding_window", 4096, label, err);
    if (get_u32(root, "sliding_window_pattern", 1, 32, row->swa_period, &period, label, err))
        return -1;
    if (period > 1)
        c->local_period = period, c->local_mask = (1u << (period - 1)) - 1;
    else
        c->local_period = 1, c->local_mask = 1; /* every layer windowed */
    return get_u32(root, "sliding_window", 1, 1e9, 4096, &c->local_window, label, err);
}

/* Gemma's scores and soft-capping, and Gemma 3's local RoPE base (absent: none). */
static int parse_gemma(stz_fwd_config *c, const cJSON *root, const stz_arch *row, const char *label, stz_err *err)
{
    double q;
    if (get_real(root, "query_pre_attn_scalar", 1e-6, 1e9, 0, &q, label, err) ||
        get_real(root, "attn_logit_softcapping", 1e-6, 1e9, 0, &c->attn_softcap, label, err) ||
        get_real(root, "final_logit_softcapping", 1e-6, 1e9, 0, &c->final_softcap, label, err) ||
        get_real(root, "rope_local_base_freq", 1, 1e12, c->arch == STZ_ARCH_GEMMA3 ? 10000 : 0, &c->rope_local_theta,
                 label, err))
        return -1;
    c->attn_scale = q ? 1 / sqrt(q) : 0;
    return parse_swa_layers(c, root, row, label, err);
}

/* Hugging Face config.json of a family in arch.c (and stz synth's
 * metadata), under the keys of its row. */
static int parse_hf(stz_fwd_config *c, const cJSON *root, const char *label, stz_err *err)
{
    if (parse_arch(c, root, label, err))
        return -1;
    const stz_arch *row = stz_arch_of(c);
    const stz_arch_keys *k = row->keys;
    const char *act = get_str(root, k->act);
    if (act && strcmp(act, k->act_value))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: %s '%s' is not supported (%s only)", label, k->act, act,
                           k->act_value),
               -1;
    double rotary;
    if (get_real(root, "partial_rotary_factor", 0, 1, 1, &rotary, label, err))
        return -1;
    if (rotary != 1)
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: partial_rotary_factor %g is not supported (RoPE on whole heads only)", label, rotary),
               -1;
    if (get_bool(root, "mlp_bias", 0))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: mlp_bias is not supported", label), -1;
    if (c->arch == STZ_ARCH_GPT2 &&
        (get_bool(root, "scale_attn_by_inverse_layer_idx", 0) || !get_bool(root, "scale_attn_weights", 1)))
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: GPT-2 attention scaled otherwise than by 1/sqrt(head size) is not supported "
                           "(scale_attn_weights false, or scale_attn_by_inverse_layer_idx)",
                           label),
               -1;
    if (get_u32(root, k->dim, 1, BIG, UINT32_MAX, &c->dim, label, err) ||
        get_u32(root, k->hidden, 1, BIG, k->hidden_x4 && c->dim <= BIG / 4 ? 4 * c->dim : UINT32_MAX, &c->hidden, label,
                err) ||
        get_u32(root, k->layers, 1, 65536, UINT32_MAX, &c->n_layers, label, err) ||
        get_u32(root, k->heads, 1, 65536, UINT32_MAX, &c->n_heads, label, err) ||
        get_u32(root, "num_key_value_heads", 1, 65536, c->n_heads, &c->n_kv_heads, label, err) ||
        get_u32(root, "head_dim", 2, 65536, c->dim / c->n_heads, &c->head_dim, label, err) ||
        get_u32(root, "vocab_size", 1, 1 << 24, UINT32_MAX, &c->vocab, label, err) ||
        get_u32(root, k->max_pos, 1, 1e9, 0, &c->max_pos, label, err) ||
        get_real(root, "rope_theta", 1, 1e12, 10000, &c->rope_theta, label, err) ||
        get_real(root, k->eps, 0, 1, k->eps_default, &c->norm_eps, label, err) ||
        parse_rope_scaling(c, root, label, err) ||
        (row->swa_period ? parse_gemma(c, root, row, label, err)
                         : parse_local_layers(c, root, "window_size", 256, label, err)))
        return -1;
    uint32_t bos = 1;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (cJSON_IsNumber(b) && get_u32(root, "bos_token_id", 0, c->vocab - 1, 1, &bos, label, err))
        return -1;
    c->bos = (int32_t)(bos < c->vocab ? bos : 0);
    c->tied = get_bool(root, "tie_word_embeddings", row->layout != STZ_NAMES_HF); /* GPT-Neo's, Gemma's are tied */
    /* Qwen2 states a window it does not use unless use_sliding_window; Gemma's is per layer (above) */
    int sw = row->flags & STZ_ARCH_SW_OPT_IN ? get_bool(root, "use_sliding_window", 0) : !row->swa_period;
    if (sw && get_u32(root, "sliding_window", 1, 1e9, 0, &c->sliding_window, label, err))
        return -1;
    c->rope_interleaved = 0;
    return 0;
}

/* llama2.c's Config as JSON (dim, hidden_dim, n_layers, ...). */
static int parse_llama2c(stz_fwd_config *c, const cJSON *root, const char *label, stz_err *err)
{
    if (get_u32(root, "dim", 1, BIG, UINT32_MAX, &c->dim, label, err) ||
        get_u32(root, "hidden_dim", 1, BIG, UINT32_MAX, &c->hidden, label, err) ||
        get_u32(root, "n_layers", 1, 65536, UINT32_MAX, &c->n_layers, label, err) ||
        get_u32(root, "n_heads", 1, 65536, UINT32_MAX, &c->n_heads, label, err) ||
        get_u32(root, "n_kv_heads", 1, 65536, c->n_heads, &c->n_kv_heads, label, err) ||
        get_u32(root, "vocab_size", 1, 1 << 24, UINT32_MAX, &c->vocab, label, err) ||
        get_u32(root, "seq_len", 1, 1e9, 0, &c->max_pos, label, err) ||
        get_real(root, "rope_theta", 1, 1e12, 10000, &c->rope_theta, label, err) ||
        get_real(root, "norm_eps", 0, 1, 1e-5, &c->norm_eps, label, err))
        return -1;
    c->head_dim = c->dim / c->n_heads;
    c->bos = c->vocab > 1; /* token 1, when there is one */
    c->tied = get_bool(root, "shared_classifier", 1);
    c->rope_interleaved = 1;
    return 0;
}

/* A multimodal checkpoint's language model (Gemma 3's): its text_config,
 * as the family's own config.json with the defaults it leaves out;
 * NULL for any other configuration. */
static cJSON *text_model(const cJSON *root)
{
    const char *mt = get_str(root, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures"), *tc;
    const char *cls = cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0))
                          ? cJSON_GetArrayItem(archs, 0)->valuestring
                          : NULL;
    for (int i = 0; i < STZ_ARCH_COUNT; i++) {
        const stz_arch *a = stz_arch_get(i);
        if (!a->outer_type || !((mt && !strcmp(mt, a->outer_type)) || (cls && !strcmp(cls, a->outer_class))) ||
            !cJSON_IsObject(tc = cJSON_GetObjectItemCaseSensitive(root, "text_config")))
            continue;
        cJSON *t = cJSON_Duplicate(tc, 1), *d = cJSON_Parse(a->defaults), *k;
        if (t) {
            cJSON_DeleteItemFromObjectCaseSensitive(t, "model_type");
            cJSON_DeleteItemFromObjectCaseSensitive(t, "architectures");
            cJSON_AddStringToObject(t, "model_type", a->model_type);
        }
        cJSON_ArrayForEach(k, d) if (t && !cJSON_GetObjectItemCaseSensitive(t, k->string))
            cJSON_AddItemToObject(t, k->string, cJSON_Duplicate(k, 1));
        cJSON_Delete(d);
        return t;
    }
    return NULL;
}

stz_status stz_fwd_config_parse(stz_fwd_config *c, const char *json, const char *label, stz_err *err)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_ParseWithLength(json, strlen(json));
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return stz_err_set(err, STZ_E_JSON, "%s: not a JSON object", label);
    }
    cJSON *text = text_model(root);
    int bad = cJSON_GetObjectItemCaseSensitive(root, "dim") ? parse_llama2c(c, root, label, err)
                                                            : parse_hf(c, text ? text : root, label, err);
    cJSON_Delete(text);
    cJSON_Delete(root);
    if (bad)
        return err->code;
    if (c->n_heads % c->n_kv_heads)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %u attention heads are not a multiple of %u key/value heads", label,
                           c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 || !c->head_dim)
        return stz_err_set(err, STZ_E_FORMAT, "%s: the head size %u is not even", label, c->head_dim);
    if ((uint64_t)c->head_dim * c->n_heads > BIG)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %u heads of %u are too wide", label, c->n_heads, c->head_dim);
    return STZ_OK;
}

/* ---- finding a model's configuration ------------------------------------ */

/* The configuration of the language model json describes (a multimodal
 * checkpoint's text_config with its defaults, text_model), malloc'd. */
static char *language_json(const char *json)
{
    cJSON *root = cJSON_Parse(json), *t = text_model(root);
    char *s = t ? cJSON_PrintUnformatted(t) : strdup(json);
    cJSON_Delete(t);
    cJSON_Delete(root);
    return s;
}

static int parse_config(const char *json, const char *label, stz_fwd_config *c, char **text, stz_err *err)
{
    if (stz_fwd_config_parse(c, json, label, err))
        return -1;
    if (text && !(*text = language_json(json)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the configuration"), -1;
    return 1;
}

int stz_fwd_config_find(const char *path, const stz_model_set *s, const char *config, stz_fwd_config *c, char *from,
                        char **text, stz_err *err)
{
    char *json = NULL;
    if (text)
        *text = NULL;
    if (!config) {
        char *copy = strdup(path);
        if (!copy)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for a path"), -1;
        snprintf(from, STZ_FWD_FROM_MAX, "%s/config.json", stz_is_dir(path) ? path : dirname(copy));
        free(copy);
        int in_dir = stz_is_dir(path) && access(from, F_OK) == 0;
        for (size_t f = 0; !in_dir && f < s->n; f++) {
            const char *meta = stz_reader_meta_get(stz_qmodel_reader(s->m[f]), "config");
            if (meta) {
                snprintf(from, STZ_FWD_FROM_MAX, "%s: __metadata__[\"config\"]", path);
                return parse_config(meta, from, c, text, err);
            }
        }
        if (access(from, F_OK) != 0)
            return 0;
    } else
        snprintf(from, STZ_FWD_FROM_MAX, "%s", config);
    if (stz_read_text(from, 16u << 20, &json, NULL, err))
        return -1;
    int r = parse_config(json, from, c, text, err);
    free(json);
    return r;
}

stz_status stz_fwd_no_config(const char *path, const stz_model_set *s, stz_err *err)
{
    /* --config helps only a model of a family stz runs: say so when the names are another's */
    if (s && s->n && stz_qmodel_count(s->m[0]) && stz_fwd_layout(s->m, s->n) < 0)
        return stz_err_set(err, STZ_E_UNSUPPORTED,
                           "%s: not a model of a family stz runs (no model.embed_tokens.weight, "
                           "tok_embeddings.weight or GPT-Neo's and GPT-2's transformer.wte.weight; its tensors are "
                           "named like '%s'): stz runs Llama, Mistral, Qwen2, Qwen3, Phi-3, GPT-Neo, GPT-2, Gemma 2, "
                           "Gemma 3 and llama2.c models",
                           path, stz_qmodel_tensor(s->m[0], 0)->name);
    return stz_err_set(err, STZ_E_FORMAT,
                       "%s: no model configuration (no config.json beside it, no "
                       "__metadata__[\"config\"]): give one with --config FILE",
                       path);
}

/* The model set at `path` (opened into `s`) and its configuration: 1 found,
 * 0 none (why in err), -1 an error reading the configuration, -2 the files
 * cannot be read as a model set. */
static int model_config(stz_model_set *s, const char *path, const char *config, stz_fwd_config *cfg, stz_err *err)
{
    char from[STZ_FWD_FROM_MAX];
    if (stz_model_set_open(s, path, err))
        return -2;
    int found = stz_fwd_config_find(path, s, config, cfg, from, NULL, err);
    if (!found)
        stz_fwd_no_config(path, s, err);
    return found;
}

stz_status stz_fwd_open_model(stz_fwd **out, stz_model_set *s, const char *path, const char *config, int threads,
                              stz_err *err)
{
    stz_fwd_config cfg;
    *out = NULL;
    if (model_config(s, path, config, &cfg, err) <= 0)
        return err->code;
    return stz_fwd_open(out, s->m, s->n, &cfg, path, threads, err);
}

int stz_fwd_runs(const char *path, const char *config, stz_err *err)
{
    stz_model_set s = {0};
    stz_fwd_config cfg;
    stz_fwd *m = NULL;
    int r = model_config(&s, path, config, &cfg, err);
    if (r > 0 && stz_fwd_open(&m, s.m, s.n, &cfg, path, 1, err))
        r = -1;
    if (r == -2 && err->code == STZ_E_IO)
        r = -1; /* not there, or unreadable: an error, not a model to quantize by names */
    if (r == -2 || (r < 0 && !config && err->code == STZ_E_UNSUPPORTED))
        r = 0; /* files the forward pass cannot read, or an architecture it does not run: quantized by names */
    stz_fwd_free(m);
    stz_model_set_free(&s);
    return r;
}
