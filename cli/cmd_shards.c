/* Model directories: sharded (model.safetensors.index.json, as Hugging Face
 * ships them) and single-file repositories. compress / decompress build the
 * output directory under a temporary name next to it and rename it at the
 * end; inspect, verify, plan and eval read the files a path stands for. */
#include "cli.h"
#include "stz_pack.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
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

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int cli_is_sharded_dir(const char *path)
{
    struct stat sb;
    char p[PATH_MAX];
    return pjoin(p, sizeof p, path, INDEX_NAME) == 0 && is_dir(path) && stat(p, &sb) == 0;
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

typedef struct {
    char *dir, *real;  /* as given, and resolved */
    cJSON *index;
    char **shards;     /* file names, in first-seen order */
    size_t n;
} model_dir;

static void model_dir_free(model_dir *m)
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
static stz_status open_names(const char *path, stz_reader **r, stz_container **c, const stz_reader **h, stz_err *err)
{
    *r = NULL, *c = NULL;
    stz_status st = stz_is_container(path) ? stz_container_open(c, path, err) : stz_reader_open(r, path, err);
    *h = *c ? stz_container_header(*c) : *r;
    return st;
}

/* Every tensor of every shard must be in the index, under that shard, and
 * in one shard only; every tensor the index names must be in its shard. */
static stz_status check_index(const model_dir *m, const char *suffix, const char *ip, stz_err *err)
{
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(m->index, "weight_map");
    size_t ni = (size_t)cJSON_GetArraySize(wm), nf = 0, cap = 0, k = 0;
    entry *idx = calloc(ni + 1, sizeof *idx), *files = NULL;
    stz_reader **keep_r = calloc(m->n + 1, sizeof *keep_r);
    stz_container **keep_c = calloc(m->n + 1, sizeof *keep_c);
    stz_status st = idx && keep_r && keep_c ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (const cJSON *e = wm ? wm->child : NULL; !st && e; e = e->next) {
        size_t s = 0;
        while (strcmp(m->shards[s], e->valuestring))
            s++;
        idx[k++] = (entry){e->string, s};
    }
    for (size_t s = 0; !st && s < m->n; s++) {
        char p[PATH_MAX], f[PATH_MAX];
        const stz_reader *h;
        if (snprintf(f, sizeof f, "%s%s", m->shards[s], suffix) >= (int)sizeof f || pjoin(p, sizeof p, m->dir, f)) {
            st = stz_err_set(err, STZ_E_ARG, "%s: shard path too long", m->shards[s]);
            break;
        }
        if ((st = open_names(p, &keep_r[s], &keep_c[s], &h, err)))
            break;
        size_t nt = stz_reader_count(h);
        if (nf + nt > cap) {
            entry *g = realloc(files, (cap = 2 * (nf + nt) + 16) * sizeof *files);
            if (!g) {
                st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
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
            st = stz_err_set(err, STZ_E_DUPLICATE, "%s: tensor '%s' is in two shards, %s and %s", m->dir,
                             files[i].name, m->shards[files[i - 1].shard], m->shards[files[i].shard]);
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
static stz_status model_dir_load(model_dir *m, const char *dir, stz_err *err)
{
    char p[PATH_MAX], *text = NULL;
    memset(m, 0, sizeof *m);
    m->dir = (char *)dir;
    if (!(m->real = realpath(dir, NULL)))
        return stz_err_set(err, STZ_E_IO, "%s: %s", dir, strerror(errno));
    if (pjoin(p, sizeof p, dir, INDEX_NAME))
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
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') || e->valuestring[0] == '.')
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': shard is not a plain file name", p, e->string);
        size_t k = 0;
        while (k < m->n && strcmp(m->shards[k], e->valuestring))
            k++;
        if (k == m->n && !(m->shards[m->n++] = strdup(e->valuestring)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    return STZ_OK;
}

/* Checks the shards (SHARD + suffix): present, not links out of the
 * directory, and agreeing with the index. */
static stz_status model_dir_check(const model_dir *m, const char *suffix, stz_err *err)
{
    char ip[PATH_MAX];
    pjoin(ip, sizeof ip, m->dir, INDEX_NAME);
    for (size_t i = 0; i < m->n; i++) {
        char f[PATH_MAX], q[PATH_MAX];
        struct stat sb;
        if (snprintf(f, sizeof f, "%s%s", m->shards[i], suffix) >= (int)sizeof f || pjoin(q, sizeof q, m->dir, f))
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

static stz_status copy_file(const char *from, const char *to, stz_err *err)
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
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || pjoin(p, sizeof p, dir, e->d_name))
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
static stz_status copy_tree(const char *root, const char *from, const char *to, char *const *skip, stz_err *err)
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
        if (pjoin(p, sizeof p, from, e->d_name) || pjoin(q, sizeof q, to, e->d_name)) {
            st = stz_err_set(err, STZ_E_ARG, "%s/%s: path too long", from, e->d_name);
        } else if (lstat(p, &sb) != 0) {
            st = stz_err_set(err, STZ_E_IO, "%s: %s", p, strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            if (mkdir(q, 0777) != 0)
                st = stz_err_set(err, STZ_E_IO, "%s: cannot create directory: %s", q, strerror(errno));
            else
                st = copy_tree(root, p, q, NULL, err);
        } else if (S_ISREG(sb.st_mode)) {
            st = copy_file(p, q, err);
        } else if (S_ISLNK(sb.st_mode)) {
            ssize_t n = readlink(p, link, sizeof link - 1);
            if (n < 0 || !inside(root, p))
                st = stz_err_set(err, STZ_E_ARG, "%s: link to something outside the model directory (or dangling); "
                                 "refusing to follow or copy it", p);
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

/* The tensor names of `file` (a SafeTensors file) and its data bytes. */
typedef struct {
    char **names;
    size_t n;
    double bytes;
} shard_names;

static void names_free(shard_names *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->names[i]);
    free(s->names);
    memset(s, 0, sizeof *s);
}

/* The tensors of a SafeTensors file or of the one a container holds. */
static stz_status names_of(const char *file, shard_names *s, stz_err *err)
{
    stz_reader *own;
    stz_container *c;
    const stz_reader *r;
    stz_status st = open_names(file, &own, &c, &r, err);
    if (st)
        return st;
    s->names = calloc(stz_reader_count(r) + 1, sizeof *s->names);
    for (size_t i = 0; s->names && i < stz_reader_count(r); i++, s->n++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        if (!(s->names[i] = strdup(t->name)))
            break;
        s->bytes += (double)(t->end - t->begin);
    }
    if (!s->names || s->n < stz_reader_count(r))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
    stz_reader_free(own);
    stz_container_free(c);
    return st;
}

/* Shards converted by `workers` threads at once, each taking the next. */
typedef struct {
    const model_dir *m;
    const char *in, *tmpdir, *in_suffix, *out_suffix;
    int rewrite_index, threads, quiet;
    cli_shard_fn convert;
    void *user;
    pthread_mutex_t lock;
    size_t next;
    int failed;
    stz_err err;          /* the first failure's */
    shard_names *names;   /* per shard */
    const size_t *order;  /* the shards, largest first */
    int claim;            /* several processes share the shards (MPI) */
} shard_work;

#define FAILED_MARK ".stz-failed"

/* Under MPI, whoever first creates tmpdir/.stz-claim-SHARD converts it: the
 * ranks take the shards largest first as they become free, on any shared
 * file system (O_EXCL); once a rank failed (tmpdir/.stz-failed) no more
 * are taken. 1: ours; 0: another's (or none: a rank failed); -1: cannot
 * tell (err set). */
static int claim_shard(const shard_work *w, size_t i, stz_err *err)
{
    char p[PATH_MAX], name[64];
    snprintf(name, sizeof name, ".stz-claim-%zu", i);
    if (pjoin(p, sizeof p, w->tmpdir, FAILED_MARK) == 0 && access(p, F_OK) == 0)
        return 0;
    if (pjoin(p, sizeof p, w->tmpdir, name))
        return stz_err_set(err, STZ_E_ARG, "%s: path too long", w->tmpdir), -1;
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd >= 0)
        return close(fd), 1;
    if (errno == EEXIST)
        return 0;
    return stz_err_set(err, STZ_E_IO, "%s: cannot claim shard %s: %s", p, w->m->shards[i], strerror(errno)), -1;
}

static void unclaim_all(const shard_work *w)
{
    char p[PATH_MAX], name[64];
    for (size_t i = 0; i < w->m->n; i++)
        if (snprintf(name, sizeof name, ".stz-claim-%zu", i) > 0 && !pjoin(p, sizeof p, w->tmpdir, name))
            unlink(p);
}

static void *shard_worker(void *arg)
{
    shard_work *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        size_t i = w->failed ? w->m->n : w->next++;
        pthread_mutex_unlock(&w->lock);
        if (i >= w->m->n)
            return NULL;
        i = w->order[i];
        char src[1024], dst[1024], p[PATH_MAX], q[PATH_MAX], mapped[PATH_MAX] = "";
        stz_err err;
        stz_status st = STZ_OK;
        int mine = w->claim ? claim_shard(w, i, &err) : 1;
        if (mine == 0)
            continue;
        if (mine < 0)
            st = err.code;
        if (!st && (snprintf(src, sizeof src, "%s%s", w->m->shards[i], w->in_suffix) >= (int)sizeof src ||
            snprintf(dst, sizeof dst, "%s%s", w->m->shards[i], w->out_suffix) >= (int)sizeof dst ||
            pjoin(p, sizeof p, w->in, src) || pjoin(q, sizeof q, w->tmpdir, dst)))
            st = stz_err_set(&err, STZ_E_ARG, "%s: shard name or path too long", w->m->shards[i]);
        if (!st)
            st = w->convert(w->user, p, q, mapped, sizeof mapped, w->threads, w->quiet, &err);
        if (!st && w->rewrite_index) /* the new index's names: of the mapped file, or of the output */
            st = names_of(mapped[0] ? mapped : q, &w->names[i], &err);
        if (mapped[0] && strcmp(mapped, q))
            unlink(mapped);
        if (st) {
            pthread_mutex_lock(&w->lock);
            if (!w->failed)
                w->failed = 1, w->err = err;
            pthread_mutex_unlock(&w->lock);
            if (w->claim && pjoin(p, sizeof p, w->tmpdir, FAILED_MARK) == 0) /* the other ranks stop taking shards */
                close(open(p, O_WRONLY | O_CREAT, 0600));
        }
    }
}

/* Converts every shard on min(threads, shards) workers of threads / workers
 * threads each (each shard's bytes do not depend on it). */
static stz_status convert_shards(shard_work *w, int threads, stz_err *err)
{
    size_t nw = (size_t)(threads < 1 ? 1 : threads);
    nw = nw < w->m->n ? nw : w->m->n ? w->m->n : 1;
    w->threads = threads / (int)nw > 1 ? threads / (int)nw : 1;
    w->quiet = w->quiet || nw > 1; /* progress lines of several shards would overwrite each other */
    pthread_t *tid = calloc(nw, sizeof *tid);
    if (!tid || !(w->names = calloc(w->m->n + 1, sizeof *w->names))) {
        free(tid);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    pthread_mutex_init(&w->lock, NULL);
    size_t started = 0;
    for (; started < nw; started++)
        if (pthread_create(&tid[started], NULL, shard_worker, w))
            break;
    if (!started)
        shard_worker(w);
    for (size_t k = 0; k < started; k++)
        pthread_join(tid[k], NULL);
    pthread_mutex_destroy(&w->lock);
    free(tid);
    if (w->failed)
        return *err = w->err, err->code;
    return STZ_OK;
}

static stz_status write_text(const char *path, const char *text, stz_err *err)
{
    FILE *f = fopen(path, "wx");
    if (!f || fputs(text, f) < 0 || fclose(f))
        return stz_err_set(err, STZ_E_IO, "%s: cannot write: %s", path, strerror(errno));
    return STZ_OK;
}

/*
 * For every shard SHARD of the index: convert(in/SHARD+in_suffix ->
 * tmp/SHARD+out_suffix), several shards at once when there are threads for
 * it, then (rewrite_index) map the tensors of `mapped` (or of the output)
 * to SHARD in the new index, in shard order. Everything else is copied.
 * The directory appears at `out` only when everything succeeded.
 */
int cli_shards_run(const char *in, const char *out, const char *in_suffix, const char *out_suffix,
                   int rewrite_index, int threads, int quiet, cli_shard_fn convert, void *user)
{
    stz_err err;
    model_dir m;
    char tmpdir[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
    struct stat sb;
    if (lstat(out, &sb) == 0) {
        stz_err_set(&err, STZ_E_EXISTS, "%s: output exists; remove it first (directories are never replaced, even "
                    "with --force)", out);
        return cli_fail(&err);
    }
    stz_status st = model_dir_load(&m, in, &err);
    if (!st)
        st = model_dir_check(&m, in_suffix, &err);
    int root = cli_mpi_rank() == 0, track = -1;
    const char *slash = strrchr(out, '/');
    int tl = snprintf(tmpdir, sizeof tmpdir, "%.*s.%s.tmp-XXXXXX", slash ? (int)(slash - out) + 1 : 0, out,
                      slash ? slash + 1 : out);
    if (!st && root && (tl < 0 || (size_t)tl >= sizeof tmpdir || !mkdtemp(tmpdir)))
        st = stz_err_set(&err, STZ_E_IO, "%s: cannot create a temporary directory: %s", out, strerror(errno));
    cli_mpi_bcast(tmpdir, sizeof tmpdir, 0); /* every rank writes into rank 0's directory */
    if (cli_mpi_failed(st != STZ_OK, &err)) {
        model_dir_free(&m);
        return root ? cli_fail(&err) : CLI_ERROR;
    }
    if (root) {
        mode_t mask = umask(0);
        umask(mask);
        chmod(tmpdir, 0777 & ~mask); /* mkdtemp makes it 0700; the result is an ordinary directory */
        track = stz_tmp_track(tmpdir); /* removes the directory itself if empty on a signal */
    }
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(m.index, "weight_map");
    if (rewrite_index) { /* rebuilt from the converted shards' own tensors */
        wm = cJSON_CreateObject();
        cJSON_ReplaceItemInObjectCaseSensitive(m.index, "weight_map", wm);
    }
    double total = 0;
    /* the shards and the index are made here; everything else is copied */
    char **skip = calloc(m.n + 2, sizeof *skip);
    if (!skip)
        st = stz_err_set(&err, STZ_E_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < m.n; i++)
        if (!(skip[i] = malloc(strlen(m.shards[i]) + strlen(in_suffix) + 1)))
            st = stz_err_set(&err, STZ_E_NOMEM, "out of memory");
        else
            sprintf(skip[i], "%s%s", m.shards[i], in_suffix);
    int mpi = cli_mpi_size() > 1;
    size_t *order = calloc(m.n + 1, sizeof *order);
    double *sizes = calloc(m.n + 1, sizeof *sizes);
    if (!order || !sizes)
        st = stz_err_set(&err, STZ_E_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < m.n; i++) /* largest first: the last shard to start is a small one */
        sizes[i] = pjoin(p, sizeof p, in, skip[i]) == 0 && stat(p, &sb) == 0 ? (double)sb.st_size : 0;
    for (size_t i = 0; !st && i < m.n; i++) {
        size_t k = i;
        for (; k > 0 && sizes[order[k - 1]] < sizes[i]; k--)
            order[k] = order[k - 1];
        order[k] = i;
    }
    shard_work w = {.m = &m, .in = in, .tmpdir = tmpdir, .in_suffix = in_suffix, .out_suffix = out_suffix,
                    .rewrite_index = rewrite_index && !mpi, .quiet = quiet || (mpi && !root), .convert = convert,
                    .user = user, .order = order, .claim = mpi};
    if (!st)
        st = convert_shards(&w, threads, &err);
    if (cli_mpi_failed(st != STZ_OK, &err)) /* all ranks done writing: rank 0 finishes or removes */
        st = err.code ? err.code : STZ_E_IO;
    if (root && mpi)
        unclaim_all(&w);
    for (size_t i = 0; !st && root && mpi && rewrite_index && i < m.n; i++) { /* the shards of every rank */
        char dst[1024];
        snprintf(dst, sizeof dst, "%s%s", m.shards[i], out_suffix);
        if (pjoin(q, sizeof q, tmpdir, dst) || (st = names_of(q, &w.names[i], &err)))
            st = st ? st : stz_err_set(&err, STZ_E_ARG, "%s: path too long", dst);
    }
    free(order), free(sizes);
    for (size_t i = 0; !st && root && rewrite_index && i < m.n; i++) { /* in shard order: the same index for any -T */
        for (size_t k = 0; k < w.names[i].n; k++)
            cJSON_AddStringToObject(wm, w.names[i].names[k], m.shards[i]);
        total += w.names[i].bytes;
    }
    for (size_t i = 0; w.names && i < m.n; i++)
        names_free(&w.names[i]);
    free(w.names);
    if (skip)
        skip[m.n] = INDEX_NAME;
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(m.index, "metadata");
    if (!root) /* rank 0 writes the rest */
        goto done;
    if (!st && rewrite_index && cJSON_IsObject(meta)) {
        cJSON_DeleteItemFromObjectCaseSensitive(meta, "total_size");
        cJSON_AddNumberToObject(meta, "total_size", total);
    }
    if (!st && pjoin(q, sizeof q, tmpdir, INDEX_NAME) == 0 && pjoin(p, sizeof p, in, INDEX_NAME) == 0) {
        if (!rewrite_index) { /* names unchanged: the index byte for byte */
            st = copy_file(p, q, &err);
        } else {
            char *txt = cJSON_Print(m.index);
            st = txt ? write_text(q, txt, &err) : stz_err_set(&err, STZ_E_NOMEM, "out of memory");
            free(txt);
        }
    }
    if (!st)
        st = copy_tree(m.real, in, tmpdir, skip, &err);
    if (!st && stz_rename_noreplace(tmpdir, out))
        st = stz_err_set(&err, errno == EEXIST || errno == ENOTEMPTY ? STZ_E_EXISTS : STZ_E_IO,
                         "%s: cannot rename the finished directory into place: %s", out, strerror(errno));
    if (st)
        cli_remove_tree(tmpdir);
    stz_tmp_untrack(track);
done:
    for (size_t i = 0; skip && i < m.n; i++)
        free(skip[i]);
    free(skip);
    model_dir_free(&m);
    if (cli_mpi_failed(st != STZ_OK, &err)) /* rank 0's last steps, or a failure all ranks saw */
        return root ? cli_fail(&err) : CLI_ERROR;
    return CLI_OK;
}

/* ---- the files a model path stands for ---------------------------------- */

void cli_model_files_free(char **files, size_t n)
{
    for (size_t i = 0; files && i < n; i++)
        free(files[i]);
    free(files);
}

stz_status cli_model_files(const char *path, char ***files, size_t *n, stz_err *err)
{
    *files = NULL, *n = 0;
    if (!is_dir(path)) {
        *files = calloc(2, sizeof **files);
        if (!*files || !((*files)[0] = strdup(path)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory");
        *n = 1;
        return STZ_OK;
    }
    char p[PATH_MAX];
    model_dir m;
    stz_status st;
    if (cli_is_sharded_dir(path)) {
        /* plain shards, or a compressed directory's SHARD.stz */
        struct stat sb;
        st = model_dir_load(&m, path, err);
        const char *suffix = !st && m.n && pjoin(p, sizeof p, path, m.shards[0]) == 0 && stat(p, &sb) ? ".stz" : "";
        if (!st)
            st = model_dir_check(&m, suffix, err);
        if (!st && !(*files = calloc(m.n + 1, sizeof **files)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        for (size_t i = 0; !st && i < m.n; i++) {
            char f[PATH_MAX];
            snprintf(f, sizeof f, "%s%s", m.shards[i], suffix);
            if (pjoin(p, sizeof p, path, f) || !((*files)[i] = strdup(p)))
                st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
            else
                *n = i + 1;
        }
        model_dir_free(&m);
        if (st)
            cli_model_files_free(*files, *n), *files = NULL, *n = 0;
        return st;
    }
    static const char *const single[] = {"model.safetensors", "model.safetensors.stz", NULL};
    for (int i = 0; single[i]; i++) {
        struct stat sb;
        if (pjoin(p, sizeof p, path, single[i]) == 0 && stat(p, &sb) == 0) {
            *files = calloc(2, sizeof **files);
            if (!*files || !((*files)[0] = strdup(p)))
                return stz_err_set(err, STZ_E_NOMEM, "out of memory");
            *n = 1;
            return STZ_OK;
        }
    }
    return stz_err_set(err, STZ_E_ARG, "%s: a directory without %s or model.safetensors: not a model directory", path,
                       INDEX_NAME);
}
