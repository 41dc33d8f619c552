/* A generated model as a Hugging Face folder holds it: config.json with
 * its model_type and the keys transformers and llama.cpp's converter read,
 * and a small valid tokenizer.json (byte-level BPE) covering its
 * vocabulary, so that the folder -> GGUF -> llama.cpp path runs on it. */
#include "core/stz_core.h"
#include "synth_internal.h"
#include "stz_synth.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cJSON_AddStringToObject(c, "model_type", a->fam == FAM_GPT_NEO ? "gpt_neo" : a->qkv_bias ? "qwen2" : "llama");
    cJSON_AddNumberToObject(c, "rope_theta", 10000);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "max_position_embeddings", a->positions ? (double)a->positions : 2048);
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
