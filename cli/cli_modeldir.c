/* Model directories: sharded (model.safetensors.index.json, as Hugging Face
 * ships them) and single-file repositories: the index checked against the
 * shards, what is not a shard copied, and the files a model path stands for
 * (inspect, verify, plan and eval read them). */
#include "cli_modeldir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* dir/name into buf; 0, or -1 if it does not fit. */
int cli_pjoin(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int cli_is_sharded_dir(const char *path)
{
    struct stat sb;
    char p[PATH_MAX];
    return cli_pjoin(p, sizeof p, path, INDEX_NAME) == 0 && is_dir(path) && stat(p, &sb) == 0;
}

/* 1 if `path` (which may be a link) resolves to a place inside `root_real`
 * (an already resolved directory). */
static int inside(const char *root_real, const char *path)
{
    char real[PATH_MAX];
    size_t n = strlen(root_real);
    return realpath(path, real) && !strncmp(real, root_real, n) && (real[n] == '/' || real[n] == 0);
}

/* ---- the index and its shards ------------------------------------------ */

void cli_model_dir_free(cli_model_dir *m)
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
stz_status cli_open_names(const char *path, stz_reader **r, stz_container **c, const stz_reader **h, stz_err *err)
{
    *r = NULL, *c = NULL;
    stz_status st = stz_is_container(path) ? stz_container_open(c, path, err) : stz_reader_open(r, path, err);
    *h = *c ? stz_container_header(*c) : *r;
    return st;
}

/* Every tensor of every shard must be in the index, under that shard, and
 * in one shard only; every tensor the index names must be in its shard. */
static stz_status check_index(const cli_model_dir *m, const char *suffix, const char *ip, stz_err *err)
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
        char p[PATH_MAX], f[PATH_MAX];
        const stz_reader *h;
        if (snprintf(f, sizeof f, "%s%s", m->shards[s], suffix) >= (int)sizeof f || cli_pjoin(p, sizeof p, m->dir, f)) {
            st = stz_err_set(err, STZ_E_ARG, "%s: shard path too long", m->shards[s]);
            break;
        }
        if ((st = cli_open_names(p, &keep_r[s], &keep_c[s], &h, err)))
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
stz_status cli_model_dir_load(cli_model_dir *m, const char *dir, stz_err *err)
{
    char p[PATH_MAX], *text = NULL;
    memset(m, 0, sizeof *m);
    m->dir = (char *)dir;
    if (!(m->real = realpath(dir, NULL)))
        return stz_err_set(err, STZ_E_IO, "%s: %s", dir, strerror(errno));
    if (cli_pjoin(p, sizeof p, dir, INDEX_NAME))
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

/* Checks the shards (SHARD + suffix): present, not links out of the
 * directory, and agreeing with the index. */
stz_status cli_model_dir_check(const cli_model_dir *m, const char *suffix, stz_err *err)
{
    char ip[PATH_MAX];
    cli_pjoin(ip, sizeof ip, m->dir, INDEX_NAME);
    for (size_t i = 0; i < m->n; i++) {
        char f[PATH_MAX], q[PATH_MAX];
        struct stat sb;
        if (snprintf(f, sizeof f, "%s%s", m->shards[i], suffix) >= (int)sizeof f || cli_pjoin(q, sizeof q, m->dir, f))
            return stz_err_set(err, STZ_E_ARG, "%s: shard path too long", m->shards[i]);
        if (lstat(q, &sb) != 0)
            return stz_err_set(err, STZ_E_IO, "%s: shard %s of the index: %s", q, m->shards[i], strerror(errno));
        if (S_ISLNK(sb.st_mode) && !inside(m->real, q))
            return stz_err_set(err, STZ_E_ARG, "%s: shard is a link to a file outside %s; refusing to follow it", q,
                               m->dir);
    }
    return check_index(m, suffix, ip, err);
}

/* ---- copying what is not a shard ---------------------------------------- */

stz_status cli_copy_file(const char *from, const char *to, stz_err *err)
{
    int fd;
    uint64_t size;
    stz_status st = stz_open_regular(from, &fd, &size, err);
    if (st)
        return st;
    FILE *a = fdopen(fd, "rb"), *b = a ? fopen(to, "wbx") : NULL;
    char buf[1 << 16];
    size_t n;
    if (!a || !b)
        st = stz_err_set(err, STZ_E_IO, "cannot copy %s to %s: %s", from, to, strerror(errno));
    while (!st && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n)
            st = stz_err_set(err, STZ_E_IO, "%s: write failed: %s", to, strerror(errno));
    if (!st && ferror(a))
        st = stz_err_set(err, STZ_E_IO, "%s: read failed", from);
    if (a)
        fclose(a);
    else
        close(fd);
    if (b && fclose(b) && !st)
        st = stz_err_set(err, STZ_E_IO, "%s: write failed: %s", to, strerror(errno));
    return st;
}

void cli_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[PATH_MAX];
    struct stat sb;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || cli_pjoin(p, sizeof p, dir, e->d_name))
            continue;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            cli_remove_tree(p);
        else
            unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Copies everything below `from` into `to` (which exists), hidden files and
 * subdirectories included, except `skip` (a NULL-terminated list of names at
 * the top level). A link whose target is inside the model directory `root`
 * is made again as the same link; a link out of it, or a FIFO, socket or
 * device, is refused by name. */
stz_status cli_copy_tree(const char *root, const char *from, const char *to, char *const *skip, stz_err *err)
{
    DIR *d = opendir(from);
    struct dirent *e;
    stz_status st = d ? STZ_OK : stz_err_set(err, STZ_E_IO, "%s: cannot read directory: %s", from, strerror(errno));
    while (!st && (e = readdir(d))) {
        char p[PATH_MAX], q[PATH_MAX], link[PATH_MAX];
        struct stat sb;
        int skipped = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
        for (size_t i = 0; skip && skip[i] && !skipped; i++)
            skipped = !strcmp(skip[i], e->d_name);
        if (skipped)
            continue;
        if (cli_pjoin(p, sizeof p, from, e->d_name) || cli_pjoin(q, sizeof q, to, e->d_name)) {
            st = stz_err_set(err, STZ_E_ARG, "%s/%s: path too long", from, e->d_name);
        } else if (lstat(p, &sb) != 0) {
            st = stz_err_set(err, STZ_E_IO, "%s: %s", p, strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            if (mkdir(q, 0777) != 0)
                st = stz_err_set(err, STZ_E_IO, "%s: cannot create directory: %s", q, strerror(errno));
            else
                st = cli_copy_tree(root, p, q, NULL, err);
        } else if (S_ISREG(sb.st_mode)) {
            st = cli_copy_file(p, q, err);
        } else if (S_ISLNK(sb.st_mode)) {
            ssize_t n = readlink(p, link, sizeof link - 1);
            if (n < 0 || !inside(root, p))
                st = stz_err_set(err, STZ_E_ARG,
                                 "%s: link to something outside the model directory (or dangling); "
                                 "refusing to follow or copy it",
                                 p);
            else if (link[n] = 0, link[0] == '/')
                st = stz_err_set(err, STZ_E_ARG, "%s: absolute link; it would not point into the new directory", p);
            else if (symlink(link, q) != 0)
                st = stz_err_set(err, STZ_E_IO, "%s: cannot create link: %s", q, strerror(errno));
        } else {
            st = stz_err_set(err, STZ_E_ARG, "%s: not a regular file, directory or link; cannot be carried", p);
        }
    }
    if (d)
        closedir(d);
    return st;
}

/* ---- the files a model path stands for ---------------------------------- */

void cli_model_files_free(char **files, size_t n)
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

stz_status cli_model_files(const char *path, char ***files, size_t *n, stz_err *err)
{
    *files = NULL, *n = 0;
    if (!is_dir(path))
        return one_file(path, files, n, err);
    char p[PATH_MAX];
    cli_model_dir m;
    stz_status st;
    if (cli_is_sharded_dir(path)) {
        /* plain shards, or a compressed directory's SHARD.stz */
        struct stat sb;
        st = cli_model_dir_load(&m, path, err);
        const char *suffix = !st && m.n && cli_pjoin(p, sizeof p, path, m.shards[0]) == 0 && stat(p, &sb) ? ".stz" : "";
        if (!st)
            st = cli_model_dir_check(&m, suffix, err);
        if (!st && !(*files = calloc(m.n + 1, sizeof **files)))
            st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu shard names", path, m.n);
        for (size_t i = 0; !st && i < m.n; i++) {
            char f[PATH_MAX];
            snprintf(f, sizeof f, "%s%s", m.shards[i], suffix);
            if (cli_pjoin(p, sizeof p, path, f) || !((*files)[i] = strdup(p)))
                st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the shard names", path);
            else
                *n = i + 1;
        }
        cli_model_dir_free(&m);
        if (st)
            cli_model_files_free(*files, *n), *files = NULL, *n = 0;
        return st;
    }
    static const char *const single[] = {"model.safetensors", "model.safetensors.stz", NULL};
    for (int i = 0; single[i]; i++) {
        struct stat sb;
        if (cli_pjoin(p, sizeof p, path, single[i]) == 0 && stat(p, &sb) == 0)
            return one_file(p, files, n, err);
    }
    return stz_err_set(err, STZ_E_ARG, "%s: a directory without %s or model.safetensors: not a model directory", path,
                       INDEX_NAME);
}
