/* Sharded models (a directory with model.safetensors.index.json, as Hugging
 * Face ships them) for stz compress / decompress. The output directory is
 * built under a temporary name next to it and renamed at the end. */
#include "cli.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME "model.safetensors.index.json"

/* dir/name into buf; 0, or -1 if it does not fit. */
static int pjoin(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int cli_is_sharded_dir(const char *path)
{
    struct stat sb;
    char p[4096];
    return pjoin(p, sizeof p, path, INDEX_NAME) == 0 && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(p, &sb) == 0;
}

static char *read_text(const char *path, stz_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        stz_err_set(err, STZ_E_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 && n < (256L << 20) ? malloc((size_t)n + 1) : NULL;
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
        stz_err_set(err, STZ_E_IO, "%s: cannot read", path);
        free(b);
        b = NULL;
    } else {
        b[n] = 0;
    }
    fclose(f);
    return b;
}

static stz_status copy_file(const char *from, const char *to, stz_err *err)
{
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    stz_status st = a && b ? STZ_OK : stz_err_set(err, STZ_E_IO, "cannot copy %s to %s: %s", from, to, strerror(errno));
    while (!st && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n)
            st = stz_err_set(err, STZ_E_IO, "%s: write failed", to);
    if (a)
        fclose(a);
    if (b && fclose(b) && !st)
        st = stz_err_set(err, STZ_E_IO, "%s: write failed", to);
    return st;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4096];
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && pjoin(p, sizeof p, dir, e->d_name) == 0)
            unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* The index of `dir`: its weight_map's shard files, in first-seen order,
 * copied (the weight_map is rewritten later, which frees its strings). */
static stz_status load_index(const char *dir, cJSON **index, char ***shards, size_t *n, stz_err *err)
{
    char p[4096];
    if (pjoin(p, sizeof p, dir, INDEX_NAME))
        return stz_err_set(err, STZ_E_ARG, "%s: path too long", dir);
    char *text = read_text(p, err);
    if (!text)
        return err->code;
    *index = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(*index, "weight_map");
    if (!cJSON_IsObject(wm))
        return stz_err_set(err, STZ_E_FORMAT, "%s: no \"weight_map\" object", p);
    *n = 0;
    *shards = calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof **shards);
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/'))
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': shard is not a plain file name", p, e->string);
        size_t k = 0;
        while (k < *n && strcmp((*shards)[k], e->valuestring))
            k++;
        if (k == *n && !((*shards)[(*n)++] = strdup(e->valuestring)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    return STZ_OK;
}

static void free_shards(char **shards, size_t n)
{
    for (size_t i = 0; shards && i < n; i++)
        free(shards[i]);
    free(shards);
}

/* Adds every tensor of `file` (a SafeTensors file) to wm, pointing at
 * `shard`, and its data bytes to *total. */
static stz_status map_shard(cJSON *wm, const char *file, const char *shard, double *total, stz_err *err)
{
    stz_reader *r;
    stz_status st = stz_reader_open(&r, file, err);
    if (st)
        return st;
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        cJSON_AddStringToObject(wm, t->name, shard);
        *total += (double)(t->end - t->begin);
    }
    stz_reader_free(r);
    return STZ_OK;
}

/*
 * For every shard SHARD of the index: convert(in/SHARD+in_suffix ->
 * tmp/SHARD+out_suffix), then (rewrite_index) map the tensors of `mapped`
 * (or of the output) to SHARD in the new index. Other files are copied. The
 * directory appears at `out` only when everything succeeded.
 */
int cli_shards_run(const char *in, const char *out, const char *in_suffix, const char *out_suffix,
                   int rewrite_index, cli_shard_fn convert, void *user)
{
    stz_err err;
    cJSON *index = NULL;
    char **shards = NULL, tmpdir[4096], p[4096], q[4096];
    size_t n = 0;
    stz_status st;
    struct stat sb;
    if (stat(out, &sb) == 0) {
        stz_err_set(&err, STZ_E_EXISTS, "%s: output directory exists; remove it first (directories are never "
                    "replaced, even with --force)", out);
        return cli_fail(&err);
    }
    if ((st = load_index(in, &index, &shards, &n, &err))) {
        cJSON_Delete(index);
        free_shards(shards, n);
        return cli_fail(&err);
    }
    const char *slash = strrchr(out, '/');
    int tl = snprintf(tmpdir, sizeof tmpdir, "%.*s.%s.tmp-XXXXXX", slash ? (int)(slash - out) + 1 : 0, out,
                      slash ? slash + 1 : out);
    if (tl < 0 || (size_t)tl >= sizeof tmpdir || !mkdtemp(tmpdir)) {
        stz_err_set(&err, STZ_E_IO, "%s: cannot create a temporary directory: %s", out, strerror(errno));
        cJSON_Delete(index);
        free_shards(shards, n);
        return cli_fail(&err);
    }
    int track = stz_tmp_track(tmpdir); /* removes the directory itself if empty on a signal */
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (rewrite_index) { /* rebuilt from the converted shards' own tensors */
        wm = cJSON_CreateObject();
        cJSON_ReplaceItemInObjectCaseSensitive(index, "weight_map", wm);
    }
    double total = 0;
    for (size_t i = 0; !st && i < n; i++) {
        /* the index always names the plain SafeTensors shards */
        char src[1024], dst[1024];
        if (snprintf(src, sizeof src, "%s%s", shards[i], in_suffix) >= (int)sizeof src ||
            snprintf(dst, sizeof dst, "%s%s", shards[i], out_suffix) >= (int)sizeof dst || pjoin(p, sizeof p, in, src) ||
            pjoin(q, sizeof q, tmpdir, dst)) {
            st = stz_err_set(&err, STZ_E_ARG, "%s: shard name or path too long", shards[i]);
            break;
        }
        char mapped[4096] = "";
        if ((st = convert(user, p, q, mapped, sizeof mapped, &err)))
            break;
        if (rewrite_index)
            st = map_shard(wm, mapped[0] ? mapped : q, shards[i], &total, &err);
        if (mapped[0] && strcmp(mapped, q))
            unlink(mapped);
    }
    /* the index: rewritten names and total size; other files copied as they are */
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(index, "metadata");
    if (!st && cJSON_IsObject(meta)) {
        cJSON_DeleteItemFromObjectCaseSensitive(meta, "total_size");
        cJSON_AddNumberToObject(meta, "total_size", total);
    }
    if (!st && pjoin(q, sizeof q, tmpdir, INDEX_NAME) == 0 && pjoin(p, sizeof p, in, INDEX_NAME) == 0) {
        if (!rewrite_index) { /* names unchanged: the index byte for byte */
            st = copy_file(p, q, &err);
        } else {
            char *txt = cJSON_Print(index);
            FILE *f = txt ? fopen(q, "w") : NULL;
            if (!f || fputs(txt, f) < 0 || fclose(f))
                st = stz_err_set(&err, STZ_E_IO, "%s: cannot write", q);
            free(txt);
        }
    }
    DIR *d = st ? NULL : opendir(in);
    struct dirent *e;
    while (d && !st && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, INDEX_NAME))
            continue;
        int is_shard = 0;
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(shards[i]);
            is_shard |= !strncmp(shards[i], e->d_name, l) && !strcmp(e->d_name + l, in_suffix);
        }
        if (is_shard || pjoin(p, sizeof p, in, e->d_name) || stat(p, &sb) || !S_ISREG(sb.st_mode) ||
            pjoin(q, sizeof q, tmpdir, e->d_name))
            continue;
        st = copy_file(p, q, &err);
    }
    if (d)
        closedir(d);
    if (!st && rename(tmpdir, out))
        st = stz_err_set(&err, STZ_E_IO, "%s: cannot rename the finished directory into place: %s", out, strerror(errno));
    if (st)
        remove_tree(tmpdir);
    stz_tmp_untrack(track);
    cJSON_Delete(index);
    free_shards(shards, n);
    return st ? cli_fail(&err) : CLI_OK;
}
