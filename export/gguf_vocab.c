/* The tokenizer as GGUF keys: from a Hugging Face tokenizer.json (BPE) or
 * a llama2.c tokenizer file (pieces with scores). */
#include "gguf_export.h"
#include "core/stz_core.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct {
    char **text;
    float *score;
    int32_t *type;
    uint32_t n;
} vocab;

static void vocab_free(vocab *v)
{
    for (uint32_t i = 0; v->text && i < v->n; i++)
        free(v->text[i]);
    free(v->text), free(v->score), free(v->type);
}

static stz_status vocab_alloc(vocab *v, uint32_t n, stz_err *err)
{
    v->n = n;
    v->text = calloc(n + 1, sizeof *v->text);
    v->score = calloc(n + 1, sizeof *v->score);
    v->type = calloc(n + 1, sizeof *v->type);
    return v->text && v->score && v->type ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the vocabulary");
}

static int is_byte_piece(const char *s)
{
    unsigned x;
    char end;
    return strlen(s) == 6 && sscanf(s, "<0x%2X%c", &x, &end) == 2 && end == '>';
}

/* Writes tokens, scores (if any) and types. */
static void put_vocab(gbuf *kv, const vocab *v, int scores)
{
    kv_arr(kv, "tokenizer.ggml.tokens", GV_STR, v->n);
    for (uint32_t i = 0; i < v->n; i++)
        gb_str(kv, v->text[i], strlen(v->text[i]));
    if (scores) {
        kv_arr(kv, "tokenizer.ggml.scores", GV_F32, v->n);
        for (uint32_t i = 0; i < v->n; i++) {
            uint32_t u;
            memcpy(&u, &v->score[i], 4);
            gb_u32(kv, u);
        }
    }
    kv_arr(kv, "tokenizer.ggml.token_type", GV_I32, v->n);
    for (uint32_t i = 0; i < v->n; i++)
        gb_u32(kv, (uint32_t)v->type[i]);
}

/* ---- llama2.c ------------------------------------------------------------ */

/* int32 max_token_length, then per token: float32 score, int32 length,
 * bytes; exactly n_vocab tokens. Ids 0, 1, 2 are <unk>, <s>, </s>. */
static stz_status llama2c_vocab(gbuf *kv, const char *path, uint32_t n_vocab, stz_err *err)
{
    char *data;
    size_t size, at = 4;
    stz_status st = stz_read_text(path, 64u << 20, &data, &size, err);
    if (st)
        return st;
    vocab v = {0};
    if ((st = vocab_alloc(&v, n_vocab, err)))
        goto cleanup;
    for (uint32_t i = 0; i < n_vocab; i++) {
        int32_t len;
        if (size < 8 || at > size - 8) {
            st = stz_err_set(err, STZ_E_TRUNCATED,
                             "%s: ends at token %u of the model's %u (a llama2.c tokenizer "
                             "of another vocabulary?)",
                             path, i, n_vocab);
            goto cleanup;
        }
        memcpy(&v.score[i], data + at, 4), memcpy(&len, data + at + 4, 4);
        at += 8;
        if (len < 0 || (size_t)len > size - at) {
            st = stz_err_set(err, STZ_E_FORMAT, "%s: token %u: length %d runs past the end of the file", path, i, len);
            goto cleanup;
        }
        /* pieces spell spaces as ' '; llama.cpp's SentencePiece vocabulary as U+2581 */
        char *t = malloc((size_t)len * 3 + 8), *o = t;
        if (!(v.text[i] = t)) {
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a token");
            goto cleanup;
        }
        for (int32_t k = 0; k < len; k++)
            if (data[at + (size_t)k] == ' ')
                memcpy(o, "\xe2\x96\x81", 3), o += 3;
            else
                *o++ = data[at + (size_t)k];
        *o = 0;
        at += (size_t)len;
        v.type[i] = i == 0 ? TT_UNKNOWN : i <= 2 || !len ? TT_CONTROL : is_byte_piece(t) ? TT_BYTE : TT_NORMAL;
        if (i < 3)
            strcpy(t, i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
    }
    if (at != size) {
        st = stz_err_set(err, STZ_E_FORMAT,
                         "%s: %zu bytes after the model's %u tokens (a tokenizer of another "
                         "vocabulary?)",
                         path, size - at, n_vocab);
        goto cleanup;
    }
    kv_str(kv, "tokenizer.ggml.model", "llama");
    put_vocab(kv, &v, 1);
    kv_u32(kv, "tokenizer.ggml.unknown_token_id", 0);
    kv_u32(kv, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(kv, "tokenizer.ggml.eos_token_id", 2);
    kv_bool(kv, "tokenizer.ggml.add_bos_token", 1);
    kv_bool(kv, "tokenizer.ggml.add_eos_token", 0);
cleanup:
    vocab_free(&v);
    free(data);
    return st;
}

/* ---- tokenizer.json -------------------------------------------------------- */

/* Merges as "a b" strings (either JSON form: "a b" or ["a", "b"]). */
static char *merge_text(const cJSON *m)
{
    if (cJSON_IsString(m))
        return strdup(m->valuestring);
    if (cJSON_GetArraySize(m) != 2 || !cJSON_IsString(m->child) || !cJSON_IsString(m->child->next))
        return NULL;
    size_t a = strlen(m->child->valuestring), b = strlen(m->child->next->valuestring);
    char *s = malloc(a + b + 2);
    if (s)
        memcpy(s, m->child->valuestring, a), s[a] = ' ', memcpy(s + a + 1, m->child->next->valuestring, b + 1);
    return s;
}

/* model.vocab's tokens sorted, for lookups in O(log n) (cJSON's are linear). */
typedef struct {
    const cJSON **e;
    size_t n;
} vocab_index;

static int by_token(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static int index_build(vocab_index *ix, const cJSON *vmap)
{
    ix->n = 0;
    for (const cJSON *e = vmap->child; e; e = e->next)
        ix->n++;
    if (!(ix->e = malloc((ix->n + 1) * sizeof *ix->e)))
        return -1;
    size_t k = 0;
    for (const cJSON *e = vmap->child; e; e = e->next)
        ix->e[k++] = e;
    qsort(ix->e, ix->n, sizeof *ix->e, by_token);
    return 0;
}

/* The vocabulary entry of token s (its id in ->valuedouble), or NULL. */
static const cJSON *index_find(const vocab_index *ix, const char *s)
{
    cJSON key = {.string = (char *)s};
    const cJSON *k = &key, **hit = bsearch(&k, ix->e, ix->n, sizeof *ix->e, by_token);
    return hit ? *hit : NULL;
}

/* A merge "a b": two tokens of the vocabulary joined by one space. */
static int merge_of_tokens(const vocab_index *ix, char *m)
{
    char *sp = strchr(m, ' ');
    if (!sp || sp == m || !sp[1] || strchr(sp + 1, ' '))
        return 0;
    *sp = 0;
    int ok = index_find(ix, m) && index_find(ix, sp + 1);
    *sp = ' ';
    return ok;
}

static int config_id(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsArray(v))
        v = v->child;
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 2147483647.0 ? (int)v->valuedouble : -1;
}

/* The tokens of model.vocab and added_tokens by id, checked. */
static stz_status fill_tokens(vocab *v, const cJSON *vmap, const cJSON *added, int spm, uint32_t n_vocab,
                              const char *path, stz_err *err)
{
    const cJSON *lists[2] = {vmap, added};
    for (int l = 0; l < 2; l++)
        for (const cJSON *e = lists[l] ? lists[l]->child : NULL; e; e = e->next) {
            const cJSON *idv = l ? cJSON_GetObjectItemCaseSensitive(e, "id") : e;
            const cJSON *content = l ? cJSON_GetObjectItemCaseSensitive(e, "content") : NULL;
            const char *s = l ? (cJSON_IsString(content) ? content->valuestring : NULL) : e->string;
            if (!cJSON_IsNumber(idv) || idv->valuedouble < 0 ||
                idv->valuedouble != (double)(uint32_t)idv->valuedouble || !s)
                return stz_err_set(err, STZ_E_FORMAT, "%s: %s entry '%.80s' has no whole-number id", path,
                                   l ? "added_tokens" : "model.vocab", s ? s : "?");
            uint32_t id = (uint32_t)idv->valuedouble;
            if (id >= n_vocab)
                return stz_err_set(err, STZ_E_FORMAT, "%s: token '%.80s' has id %u, past the model's vocabulary of %u",
                                   path, s, id, n_vocab);
            if (stz_utf8_check((const uint8_t *)s, strlen(s)) != strlen(s))
                return stz_err_set(err, STZ_E_FORMAT, "%s: token %u is not valid UTF-8", path, id);
            if (v->text[id] && (!l || strcmp(v->text[id], s))) /* added_tokens may repeat a token as it is */
                return stz_err_set(err, STZ_E_FORMAT, "%s: id %u is given to '%.80s' and to '%.80s'", path, id,
                                   v->text[id], s);
            free(v->text[id]);
            if (!(v->text[id] = strdup(s)))
                return stz_err_set(err, STZ_E_NOMEM, "out of memory for a token");
            v->type[id] = l ? (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) ? TT_CONTROL : TT_USER)
                          : spm && is_byte_piece(s) ? TT_BYTE
                                                    : TT_NORMAL;
        }
    return STZ_OK;
}

/* The model's rows past the tokenizer's ids as [PADn] tokens, counted into
 * *padded: more than 1% of them (another model's tokenizer, whose text the
 * model would write as garbage) only with pad_vocab. */
static stz_status pad_tokens(vocab *v, uint32_t n_vocab, int pad_vocab, const char *path, uint32_t *padded,
                             stz_err *err)
{
    *padded = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        *padded += !v->text[i];
    if (*padded > n_vocab / 100 && !pad_vocab)
        return stz_err_set(err, STZ_E_ARG,
                           "%s: its ids cover %u of the model's %u embedding rows: the other %u would be [PADn] "
                           "tokens, and text the model writes with them garbage; give the model's own tokenizer, "
                           "or pad anyway (--pad-vocab)",
                           path, n_vocab - *padded, n_vocab, *padded);
    for (uint32_t i = 0; i < n_vocab; i++)
        if (!v->text[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%u]", i);
            if (!(v->text[i] = strdup(pad)))
                return stz_err_set(err, STZ_E_NOMEM, "out of memory for a token");
            v->type[i] = TT_UNUSED;
        }
    return STZ_OK;
}

/* SentencePiece-style BPE: llama.cpp merges the pair whose result scores
 * highest, so a token made by merge r scores -r. */
static void spm_scores(vocab *v, const vocab_index *ix, char *const *mtext, int nm, uint32_t n_vocab)
{
    for (uint32_t k = 0; k < n_vocab; k++)
        v->score[k] = v->type[k] == TT_NORMAL ? 0.0f : -1e9f;
    for (int r = nm - 1; r >= 0; r--) {
        char *sp = strchr(mtext[r], ' ');
        if (!sp)
            continue;
        size_t a = (size_t)(sp - mtext[r]);
        char joined[1024];
        if (strlen(mtext[r]) >= sizeof joined)
            continue;
        memcpy(joined, mtext[r], a), strcpy(joined + a, sp + 1);
        const cJSON *idv = index_find(ix, joined);
        if (cJSON_IsNumber(idv) && (uint32_t)idv->valuedouble < n_vocab)
            v->score[(uint32_t)idv->valuedouble] = (float)-r;
    }
}

/* The configuration's BOS and EOS ids, which must be tokens. */
static stz_status special_ids(gbuf *kv, const cJSON *cfg, const stz_arch *arch, int spm, uint32_t n_vocab,
                              const char *path, stz_err *err)
{
    int bos = config_id(cfg, "bos_token_id"), eos = config_id(cfg, "eos_token_id");
    if ((bos >= 0 && (uint32_t)bos >= n_vocab) || (eos >= 0 && (uint32_t)eos >= n_vocab))
        return stz_err_set(err, STZ_E_FORMAT, "%s: the configuration's %s %d is past the vocabulary of %u tokens", path,
                           bos >= 0 && (uint32_t)bos >= n_vocab ? "bos_token_id" : "eos_token_id",
                           bos >= 0 && (uint32_t)bos >= n_vocab ? bos : eos, n_vocab);
    if (bos >= 0)
        kv_u32(kv, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0)
        kv_u32(kv, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    kv_bool(kv, "tokenizer.ggml.add_bos_token", spm || (!(arch->flags & STZ_ARCH_NO_BOS) && bos >= 0));
    return STZ_OK;
}

static stz_status hf_vocab(gbuf *kv, const char *path, const stz_arch *arch, const char *config_json, uint32_t n_vocab,
                           int pad_vocab, uint32_t *padded, stz_err *err)
{
    char *text;
    stz_status st = stz_read_text(path, 1u << 30, &text, NULL, err);
    if (st)
        return st;
    cJSON *doc = cJSON_Parse(text), *cfg = cJSON_Parse(config_json ? config_json : "{}");
    free(text);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vmap = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(doc, "added_tokens");
    int spm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    vocab v = {0};
    vocab_index ix = {0};
    char **mtext = NULL;
    int nm = cJSON_GetArraySize(merges);
    if (!doc || !cJSON_IsObject(vmap) || !cJSON_IsArray(merges)) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: not a tokenizer.json with model.vocab and model.merges", path);
        goto cleanup;
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tokenizer model '%s' (stz exports BPE tokenizers)", path,
                         cJSON_IsString(type) ? type->valuestring : "?");
        goto cleanup;
    }
    if (!vmap->child) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: model.vocab holds no token", path);
        goto cleanup;
    }
    STZ_TRY(st, vocab_alloc(&v, n_vocab, err));
    if (!(mtext = calloc((size_t)nm + 1, sizeof *mtext)) || index_build(&ix, vmap)) {
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %d merges", path, nm);
        goto cleanup;
    }
    for (size_t k = 1; k < ix.n; k++)
        if (!strcmp(ix.e[k - 1]->string, ix.e[k]->string)) {
            st =
                stz_err_set(err, STZ_E_FORMAT, "%s: token '%.80s' appears twice in model.vocab", path, ix.e[k]->string);
            goto cleanup;
        }
    STZ_TRY(st, fill_tokens(&v, vmap, added, spm, n_vocab, path, err));
    STZ_TRY(st, pad_tokens(&v, n_vocab, pad_vocab, path, padded, err));
    int i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++)
        if (!(mtext[i] = merge_text(m)) || !merge_of_tokens(&ix, mtext[i])) {
            st = stz_err_set(err, STZ_E_FORMAT,
                             "%s: merge %d is not two tokens of model.vocab, as \"a b\" or "
                             "[\"a\", \"b\"]",
                             path, i);
            goto cleanup;
        }
    if (spm) {
        spm_scores(&v, &ix, mtext, nm, n_vocab);
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
        const cJSON *uid = cJSON_IsString(unk) ? index_find(&ix, unk->valuestring) : NULL;
        if (cJSON_IsNumber(uid)) {
            v.type[(uint32_t)uid->valuedouble] = TT_UNKNOWN;
            kv_u32(kv, "tokenizer.ggml.unknown_token_id", (uint32_t)uid->valuedouble);
        }
        kv_str(kv, "tokenizer.ggml.model", "llama");
        put_vocab(kv, &v, 1);
    } else {
        kv_str(kv, "tokenizer.ggml.model", "gpt2");
        kv_str(kv, "tokenizer.ggml.pre", arch->pre);
        put_vocab(kv, &v, 0);
        kv_arr(kv, "tokenizer.ggml.merges", GV_STR, (uint64_t)nm);
        for (int k = 0; k < nm; k++)
            gb_str(kv, mtext[k], strlen(mtext[k]));
    }
    st = special_ids(kv, cfg, arch, spm, n_vocab, path, err);
cleanup:
    for (int k = 0; mtext && k < nm; k++)
        free(mtext[k]);
    free(mtext);
    free(ix.e);
    vocab_free(&v);
    cJSON_Delete(doc);
    cJSON_Delete(cfg);
    return st;
}

stz_status gguf_vocab(gbuf *kv, const char *path, const stz_arch *arch, const char *config_json, uint32_t n_vocab,
                      int pad_vocab, uint32_t *padded, stz_err *err)
{
    size_t n = strlen(path);
    *padded = 0;
    return n >= 5 && !strcmp(path + n - 5, ".json")
               ? hf_vocab(kv, path, arch, config_json, n_vocab, pad_vocab, padded, err)
               : llama2c_vocab(kv, path, n_vocab, err);
}
