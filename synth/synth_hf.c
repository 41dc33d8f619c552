/* A generated model as a Hugging Face folder holds it: its shards and
 * their index, config.json with its model_type and the keys transformers
 * and llama.cpp's converter read, and a small valid tokenizer.json
 * (byte-level BPE) covering its vocabulary, so that the folder -> GGUF ->
 * llama.cpp path runs on it. */
#include "core/stz_core.h"
#include "synth_internal.h"
#include "stz_safetensors.h"
#include "stz_synth.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A growing text. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (int tries = 0; !t->oom && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (n >= 0 && t->p && t->n + (size_t)n < t->cap) {
            t->n += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *q = realloc(t->p, cap);
        if (!q || n < 0)
            t->oom = 1;
        else
            t->p = q, t->cap = cap;
    }
}

/* GPT-2's byte-level alphabet: byte b's symbol, as a code point. */
static void byte_symbols(unsigned cs[256])
{
    int n = 0, k = 0, in[256] = {0};
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
            cs[k++] = (unsigned)b, in[b] = 1;
    for (int b = 0; b < 256; b++)
        if (!in[b])
            cs[k++] = 256u + (unsigned)n++;
}

/* Token k past the byte symbols: a word of lowercase letters, two letters
 * first, then three...: its letters into w (NUL-ended). */
static void word(uint64_t k, char *w)
{
    uint64_t len = 2, count = 26 * 26;
    while (k >= count)
        k -= count, len++, count *= 26;
    for (uint64_t i = len; i-- > 0; k /= 26)
        w[i] = (char)('a' + k % 26);
    w[len] = 0;
}

/* The tokenizer.json of a vocabulary of n ids: the byte symbols (one fewer
 * when n is 256), words each merged from its prefix and last letter, and
 * "<|endoftext|>" as the last id. */
static char *tokenizer_json(uint64_t n)
{
    unsigned cs[256];
    byte_symbols(cs);
    uint64_t nbyte = n - 1 < 256 ? n - 1 : 256, nword = n - 1 - nbyte;
    text t = {0};
    char w[16], pre[16];
    put(&t,
        "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": %llu, \"content\": \"<|endoftext|>\", \"special\": "
        "true}],\n \"model\": {\"type\": \"BPE\", \"byte_fallback\": false, \"vocab\": {",
        (unsigned long long)(n - 1));
    for (uint64_t i = 0; i < nbyte; i++)
        put(&t, "%s\"\\u%04x\": %llu", i ? ", " : "", cs[i], (unsigned long long)i);
    for (uint64_t i = 0; i < nword; i++) {
        word(i, w);
        put(&t, ", \"%s\": %llu", w, (unsigned long long)(nbyte + i));
    }
    put(&t, "},\n \"merges\": [");
    for (uint64_t i = 0; i < nword; i++) {
        word(i, w);
        size_t len = strlen(w); /* two letters or more */
        snprintf(pre, sizeof pre, "%.*s", (int)len - 1, w);
        put(&t, "%s\"%s %c\"", i ? ", " : "", pre, w[len - 1]);
    }
    put(&t, "]}}\n");
    if (t.oom)
        free(t.p);
    return t.oom ? NULL : t.p;
}

stz_status stz_synth_hf_files(const char *meta_config, char **config, char **tokenizer, stz_err *err)
{
    *config = *tokenizer = NULL;
    cJSON *c = cJSON_Parse(meta_config);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "architecture"),
                *vocab = cJSON_GetObjectItemCaseSensitive(c, "vocab_size");
    const arch *a = cJSON_IsString(name) ? stz_synth_find_arch(name->valuestring) : NULL;
    if (!a || !cJSON_IsNumber(vocab) || vocab->valuedouble < 2) {
        cJSON_Delete(c);
        return stz_err_set(err, STZ_E_ARG, "synth: not a generated model's configuration");
    }
    double eos = vocab->valuedouble - 1;
    if (!cJSON_HasObjectItem(c, "model_type"))
        cJSON_AddStringToObject(c, "model_type", a->qkv_bias ? "qwen2" : "llama");
    if (a->fam == FAM_GEMMA) {
        cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
        cJSON_AddStringToObject(c, "hidden_activation", "gelu_pytorch_tanh");
    } else if (a->fam == FAM_HF_LLAMA) {
        cJSON_AddNumberToObject(c, "rope_theta", 10000);
        cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
        cJSON_AddStringToObject(c, "hidden_act", "silu");
        cJSON_AddNumberToObject(c, "max_position_embeddings", 2048);
    } else { /* GPT-Neo and GPT-2 state their positions */
        cJSON_AddNumberToObject(c, "layer_norm_epsilon", 1e-5);
        cJSON_AddStringToObject(c, "activation_function", "gelu_new");
    }
    cJSON_AddNumberToObject(c, "bos_token_id", eos);
    cJSON_AddNumberToObject(c, "eos_token_id", eos);
    *config = cJSON_Print(c);
    *tokenizer = tokenizer_json((uint64_t)vocab->valuedouble);
    cJSON_Delete(c);
    if (*config && *tokenizer)
        return STZ_OK;
    free(*config), free(*tokenizer);
    *config = *tokenizer = NULL;
    return stz_err_set(err, STZ_E_NOMEM, "synth: out of memory for config.json and tokenizer.json");
}

/* ---- the folder ------------------------------------------------------ */

stz_status stz_synth_write_dir(const stz_synth_params *params, const char *dir, uint32_t nshards, stz_synth_stats *st,
                               stz_err *err)
{
    stz_synth_params one_shard = *params, *p = &one_shard;
    struct stat sb;
    if (lstat(dir, &sb) == 0)
        return stz_err_set(err, STZ_E_EXISTS,
                           "%s: output exists; remove it first (directories are never replaced, "
                           "even with --force)",
                           dir);
    char tmp[PATH_MAX], f[PATH_MAX + 64];
    const char *slash = strrchr(dir, '/');
    int track = -1;
    if (snprintf(tmp, sizeof tmp, "%.*s.%s.tmp-XXXXXX", slash ? (int)(slash - dir) + 1 : 0, dir,
                 slash ? slash + 1 : dir) >= (int)sizeof tmp ||
        stz_tmp_make(tmp, 1, &track) < 0)
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary directory: %s", dir, strerror(errno));
    mode_t mask = umask(0);
    umask(mask);
    chmod(tmp, 0777 & ~mask);
    memset(st, 0, sizeof *st);
    cJSON *index = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(index, "metadata"),
          *wm = cJSON_AddObjectToObject(index, "weight_map");
    char *config = NULL;
    double total = 0;
    stz_status s = STZ_OK;
    for (uint32_t k = 0; !s && k < nshards; k++) {
        char name[64];
        stz_synth_stats one;
        snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", k + 1, nshards);
        snprintf(f, sizeof f, "%s/%s", tmp, name);
        p->shard = k, p->nshards = nshards;
        if ((s = stz_synth_write(p, f, &one, err)))
            break;
        st->tensors += one.tensors, st->params += one.params, st->bytes += one.bytes;
        for (int b = 0; b < 256; b++)
            st->exp_hist[b] += one.exp_hist[b];
        stz_reader *r;
        if ((s = stz_reader_open(&r, f, err)))
            break;
        for (size_t i = 0; i < stz_reader_count(r); i++) {
            const stz_tensor *t = stz_reader_tensor(r, i);
            cJSON_AddStringToObject(wm, t->name, name);
            total += (double)(t->end - t->begin);
        }
        if (!config && stz_reader_meta_get(r, "config"))
            config = strdup(stz_reader_meta_get(r, "config"));
        stz_reader_free(r);
    }
    for (int b = 0; b < 256; b++)
        if (st->exp_hist[b]) {
            double q = (double)st->exp_hist[b] / (double)st->params;
            st->exp_entropy_bits -= q * log2(q);
        }
    cJSON_AddNumberToObject(meta, "total_size", total);
    char *index_text = cJSON_Print(index), *hf_config = NULL, *tokenizer = NULL;
    if (!s && config)
        s = stz_synth_hf_files(config, &hf_config, &tokenizer, err);
    const char *files[3] = {"model.safetensors.index.json", "config.json", "tokenizer.json"},
               *body[3] = {index_text, hf_config, tokenizer};
    for (int k = 0; !s && k < 3; k++) {
        snprintf(f, sizeof f, "%s/%s", tmp, files[k]);
        FILE *o = fopen(f, "wx");
        if (!body[k] || !o || fputs(body[k], o) < 0 || fputc('\n', o) < 0 || fclose(o)) {
            s = stz_err_set(err, STZ_E_IO, "%s: cannot write %s", dir, files[k]);
            o = NULL;
        }
    }
    free(index_text), free(config), free(hf_config), free(tokenizer);
    cJSON_Delete(index);
    if (!s && stz_rename_noreplace(tmp, dir))
        s = stz_err_set(err, STZ_E_EXISTS, "%s: cannot rename the finished directory into place: %s", dir,
                        strerror(errno));
    if (s)
        stz_remove_tree(tmp);
    stz_tmp_untrack(track);
    if (!s)
        st->bytes = stz_path_bytes(dir, 0);
    return s;
}
