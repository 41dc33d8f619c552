/* Model directories: sharded (model.safetensors.index.json, as Hugging Face
 * ships them) and single-file repositories: the index checked against the
 * shards, and the files a model path stands for (inspect, verify, plan,
 * eval, Python's load_dir read them). */
#include "model/model_dir.h"
#include "model/roles.h"
#include "core/stz_core.h"
#include "gguf/gguf_layout.h"
#include "stz_forward.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int stz_model_is_sharded(const char *path)
{
    struct stat sb;
    char p[PATH_MAX];
    return stz_path_join(p, sizeof p, path, STZ_INDEX_NAME) == 0 && stz_is_dir(path) && stat(p, &sb) == 0;
}

/* ---- the index and its shards ------------------------------------------ */

void stz_model_dir_free(stz_model_dir *m)
{
    for (size_t i = 0; m->shards && i < m->n; i++)
        free(m->shards[i]);
    free(m->shards);
    free(m->real);
    cJSON_Delete(m->index);
    memset(m, 0, sizeof *m);
}

typedef struct {
    const char *name;
    size_t shard;
} entry;

static int by_name(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->shard > y->shard) - (x->shard < y->shard);
}

/* The tensor names of a SafeTensors file or of a container's original. */
stz_status stz_open_names(const char *path, stz_reader **r, stz_container **c, const stz_reader **h, stz_err *err)
{
    *r = NULL, *c = NULL;
    stz_status st = stz_is_container(path) ? stz_container_open(c, path, err) : stz_reader_open(r, path, err);
    *h = *c ? stz_container_header(*c) : *r;
    return st;
}

int stz_shard_path(char *buf, size_t cap, const char *dir, const char *shard, const char *suffix)
{
    int n = snprintf(buf, cap, "%s/%s%s", dir, shard, suffix);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The path of shard i: dir/SHARD+suffix; suffix NULL: SHARD when it
 * exists, else SHARD.stz (a shard packed on its own). 0, or -1 if it does
 * not fit. */
static int shard_path(const stz_model_dir *m, size_t i, const char *suffix, char *p, size_t cap)
{
    if (suffix)
        return stz_shard_path(p, cap, m->dir, m->shards[i], suffix);
    char packed[PATH_MAX];
    struct stat sb;
    if (shard_path(m, i, "", p, cap))
        return -1;
    if (lstat(p, &sb) != 0 && !shard_path(m, i, ".stz", packed, sizeof packed) && lstat(packed, &sb) == 0)
        return shard_path(m, i, ".stz", p, cap);
    return 0; /* SHARD (messages name it when neither is there) */
}

/* Every tensor of every shard must be in the index, under that shard, and
 * in one shard only; every tensor the index names must be in its shard. */
static stz_status check_index(const stz_model_dir *m, const char *suffix, const char *ip, stz_err *err)
{
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(m->index, "weight_map");
    size_t ni = (size_t)cJSON_GetArraySize(wm), nf = 0, cap = 0, k = 0;
    entry *idx = calloc(ni + 1, sizeof *idx), *files = NULL;
    stz_reader **keep_r = calloc(m->n + 1, sizeof *keep_r);
    stz_container **keep_c = calloc(m->n + 1, sizeof *keep_c);
    stz_status st =
        idx && keep_r && keep_c ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the shards' readers");
    for (const cJSON *e = wm ? wm->child : NULL; !st && e; e = e->next) {
        size_t s = 0;
        while (strcmp(m->shards[s], e->valuestring))
            s++;
        idx[k++] = (entry){e->string, s};
    }
    for (size_t s = 0; !st && s < m->n; s++) {
        char p[PATH_MAX];
        const stz_reader *h;
        if (shard_path(m, s, suffix, p, sizeof p)) {
            st = stz_err_set(err, STZ_E_ARG, "%s: shard path too long", m->shards[s]);
            break;
        }
        if ((st = stz_open_names(p, &keep_r[s], &keep_c[s], &h, err)))
            break;
        size_t nt = stz_reader_count(h);
        if (nf + nt > cap) {
            entry *g = realloc(files, (cap = 2 * (nf + nt) + 16) * sizeof *files);
            if (!g) {
                st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor list");
                break;
            }
            files = g;
        }
        for (size_t i = 0; i < nt; i++)
            files[nf++] = (entry){stz_reader_tensor(h, i)->name, s};
    }
    if (!st) {
        qsort(idx, ni, sizeof *idx, by_name);
        qsort(files, nf, sizeof *files, by_name);
    }
    for (size_t i = 1; !st && i < nf; i++)
        if (!strcmp(files[i].name, files[i - 1].name))
            st = stz_err_set(err, STZ_E_DUPLICATE, "%s: tensor '%s' is in two shards, %s and %s", m->dir, files[i].name,
                             m->shards[files[i - 1].shard], m->shards[files[i].shard]);
    for (size_t i = 0, j = 0; !st && (i < ni || j < nf);) {
        int c = i == ni ? 1 : j == nf ? -1 : strcmp(idx[i].name, files[j].name);
        if (c < 0)
            st = stz_err_set(err, STZ_E_FORMAT, "%s: the index maps tensor '%s' to %s, which does not hold it", ip,
                             idx[i].name, m->shards[idx[i].shard]);
        else if (c > 0)
            st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' of %s is missing from the index", ip, files[j].name,
                             m->shards[files[j].shard]);
        else if (idx[i].shard != files[j].shard)
            st = stz_err_set(err, STZ_E_FORMAT, "%s: the index maps tensor '%s' to %s, but it is in %s", ip,
                             idx[i].name, m->shards[idx[i].shard], m->shards[files[j].shard]);
        i++, j++;
    }
    for (size_t s = 0; s < m->n; s++) {
        stz_reader_free(keep_r ? keep_r[s] : NULL);
        stz_container_free(keep_c ? keep_c[s] : NULL);
    }
    free(keep_r), free(keep_c), free(idx), free(files);
    return st;
}

/* Reads the index of `dir`: an object without duplicate keys whose
 * weight_map maps tensor names to plain file names. */
stz_status stz_model_dir_load(stz_model_dir *m, const char *dir, stz_err *err)
{
    char p[PATH_MAX], *text = NULL;
    memset(m, 0, sizeof *m);
    m->dir = dir;
    if (!(m->real = realpath(dir, NULL)))
        return stz_err_set(err, STZ_E_IO, "%s: %s", dir, strerror(errno));
    if (stz_path_join(p, sizeof p, dir, STZ_INDEX_NAME))
        return stz_err_set(err, STZ_E_ARG, "%s: path too long", dir);
    stz_status st = stz_read_text(p, 256u << 20, &text, NULL, err);
    if (st)
        return st;
    m->index = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(m->index, "weight_map");
    const char *dup = stz_json_duplicate_key(m->index);
    dup = dup ? dup : stz_json_duplicate_key(wm);
    if (!cJSON_IsObject(m->index))
        return stz_err_set(err, STZ_E_FORMAT, "%s: not a JSON object", p);
    if (dup)
        return stz_err_set(err, STZ_E_DUPLICATE, "%s: key '%s' appears twice", p, dup);
    if (!cJSON_IsObject(wm))
        return stz_err_set(err, STZ_E_FORMAT, "%s: no \"weight_map\" object", p);
    m->shards = calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof *m->shards);
    if (!m->shards)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the shard names");
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') || e->valuestring[0] == '.')
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': shard is not a plain file name", p, e->string);
        size_t k = 0;
        while (k < m->n && strcmp(m->shards[k], e->valuestring))
            k++;
        if (k == m->n && !(m->shards[m->n++] = strdup(e->valuestring)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for a shard name");
    }
    return STZ_OK;
}

/* Checks the shards (SHARD + suffix; suffix NULL: SHARD where it exists,
 * else SHARD.stz): present, not links out of the directory, and agreeing
 * with the index. */
stz_status stz_model_dir_check(const stz_model_dir *m, const char *suffix, stz_err *err)
{
    char ip[PATH_MAX];
    stz_path_join(ip, sizeof ip, m->dir, STZ_INDEX_NAME);
    for (size_t i = 0; i < m->n; i++) {
        char q[PATH_MAX];
        struct stat sb;
        if (shard_path(m, i, suffix, q, sizeof q))
            return stz_err_set(err, STZ_E_ARG, "%s: shard path too long", m->shards[i]);
        if (lstat(q, &sb) != 0)
            return stz_err_set(err, STZ_E_IO, "%s: shard %s of the index: %s", q, m->shards[i], strerror(errno));
        if (S_ISLNK(sb.st_mode) && !stz_path_inside(m->real, q))
            return stz_err_set(err, STZ_E_ARG, "%s: shard is a link to a file outside %s; refusing to follow it", q,
                               m->dir);
    }
    return check_index(m, suffix, ip, err);
}

/* ---- the files a model path stands for ---------------------------------- */

void stz_model_files_free(char **files, size_t n)
{
    for (size_t i = 0; files && i < n; i++)
        free(files[i]);
    free(files);
}

/* The list of one file. */
static stz_status one_file(const char *path, char ***files, size_t *n, stz_err *err)
{
    if (!(*files = calloc(2, sizeof **files)) || !((*files)[0] = strdup(path))) {
        free(*files), *files = NULL;
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for its name", path);
    }
    *n = 1;
    return STZ_OK;
}

stz_status stz_model_files(const char *path, char ***files, size_t *n, stz_err *err)
{
    *files = NULL, *n = 0;
    if (!stz_is_dir(path))
        return one_file(path, files, n, err);
    char p[PATH_MAX];
    stz_model_dir m;
    stz_status st;
    if (stz_model_is_sharded(path)) {
        /* plain shards, a compressed directory's SHARD.stz, or some of each */
        st = stz_model_dir_load(&m, path, err);
        if (!st)
            st = stz_model_dir_check(&m, NULL, err);
        if (!st && !(*files = calloc(m.n + 1, sizeof **files)))
            st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu shard names", path, m.n);
        for (size_t i = 0; !st && i < m.n; i++) {
            if (shard_path(&m, i, NULL, p, sizeof p) || !((*files)[i] = strdup(p)))
                st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the shard names", path);
            else
                *n = i + 1;
        }
        stz_model_dir_free(&m);
        if (st)
            stz_model_files_free(*files, *n), *files = NULL, *n = 0;
        return st;
    }
    static const char *const single[] = {"model.safetensors", "model.safetensors.stz", NULL};
    for (int i = 0; single[i]; i++) {
        struct stat sb;
        if (stz_path_join(p, sizeof p, path, single[i]) == 0 && stat(p, &sb) == 0)
            return one_file(p, files, n, err);
    }
    return stz_err_set(err, STZ_E_ARG, "%s: a directory without %s or model.safetensors: not a model directory", path,
                       STZ_INDEX_NAME);
}

stz_status stz_model_file(const char *path, char **file, stz_err *err)
{
    char **files;
    size_t n;
    *file = NULL;
    if (!stz_is_dir(path) || stz_model_is_sharded(path))
        return (*file = strdup(path)) ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
    stz_status st = stz_model_files(path, &files, &n, err);
    if (!st) {
        *file = files[0];
        files[0] = NULL;
        stz_model_files_free(files, n);
    }
    return st;
}

/* ---- a model's files together ------------------------------------------- */

void stz_model_set_free(stz_model_set *s)
{
    for (size_t i = 0; s->m && i < s->n; i++)
        stz_qmodel_free(s->m[i]);
    free(s->m);
}

/* The files of path; a GGUF file's tensors under `names`. */
static stz_status set_open(stz_model_set *s, const char *path, stz_names names, stz_err *err)
{
    char **files;
    size_t n;
    memset(s, 0, sizeof *s);
    stz_status st = stz_model_files(path, &files, &n, err);
    if (!st && !(s->m = calloc(n + 1, sizeof *s->m)))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the model's files");
    for (size_t i = 0; !st && i < n; i++, s->n++)
        st = stz_is_gguf(files[i]) ? stz_qmodel_open_gguf(&s->m[i], files[i], names, err)
                                   : stz_qmodel_open(&s->m[i], files[i], err);
    stz_model_files_free(files, n);
    if (st) /* nothing left for the caller to free */
        stz_model_set_free(s), memset(s, 0, sizeof *s);
    return st;
}

stz_status stz_model_set_open(stz_model_set *s, const char *path, stz_err *err)
{
    return set_open(s, path, STZ_NAMES_HF, err);
}

stz_status stz_model_set_open_like(stz_model_set *s, const char *path, const stz_model_set *like, stz_err *err)
{
    int names = like->n ? stz_fwd_layout(like->m, like->n) : -1;
    return set_open(s, path, names == STZ_NAMES_LLAMA2C ? STZ_NAMES_LLAMA2C : STZ_NAMES_HF, err);
}

/* The tensor named `name` in any file of the set: file *f, index *i. */
int stz_model_set_find(const stz_model_set *s, const char *name, size_t *f, size_t *i)
{
    for (*f = 0; *f < s->n; (*f)++) {
        long j = stz_qmodel_find(s->m[*f], name);
        if (j >= 0)
            return *i = (size_t)j, 1;
    }
    return 0;
}

static int set_has(stz_qmodel *const *files, size_t nfiles, const char *name)
{
    for (size_t f = 0; f < nfiles; f++)
        if (stz_qmodel_find(files[f], name) >= 0)
            return 1;
    return 0;
}

int stz_fwd_layout(stz_qmodel *const *files, size_t nfiles)
{
    /* GPT-2 names its embedding as GPT-Neo does, and Gemma as Hugging Face's
       Llama: told apart by a tensor of the first layer */
    static const struct {
        int names, role;
    } tell[] = {{STZ_NAMES_GPT_NEO, STZ_ROLE_WO}, {STZ_NAMES_GEMMA, STZ_ROLE_FNORM}, {STZ_NAMES_GPT2, STZ_ROLE_WQKV}};
    for (int names = STZ_NAMES_COUNT - 1; names >= STZ_NAMES_LLAMA2C; names--) {
        int ok = set_has(files, nfiles, stz_roles[STZ_ROLE_EMBED].name[names]);
        for (size_t k = 0; ok && k < sizeof tell / sizeof *tell; k++)
            if (tell[k].names == names) {
                char first[96];
                snprintf(first, sizeof first, stz_roles[tell[k].role].name[names], 0u);
                ok = set_has(files, nfiles, first);
            }
        if (ok)
            return names;
    }
    return -1;
}
