/* Converting a sharded model directory (compress, decompress): every
 * shard, on threads and on the caller's ranks, into an output directory
 * built under a temporary name next to it and renamed at the end. */
#include "core/stz_core.h"
#include "model/model_dir.h"
#include "stz_pipeline.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    stz_status st = stz_open_names(file, &own, &c, &r, err);
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
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor names");
    stz_reader_free(own);
    stz_container_free(c);
    return st;
}

/* Shards converted by `workers` threads at once, each taking the next. */
typedef struct {
    const stz_model_dir *m;
    const char *in, *tmpdir, *in_suffix, *out_suffix;
    int rewrite_index, threads, quiet;
    stz_shard_fn convert;
    void *user;
    pthread_mutex_t lock;
    size_t next;
    int failed;
    stz_err err;         /* the first failure's */
    shard_names *names;  /* per shard */
    const size_t *order; /* the shards, largest first */
    int claim;           /* several processes share the shards (MPI) */
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
    if (stz_path_join(p, sizeof p, w->tmpdir, FAILED_MARK) == 0 && access(p, F_OK) == 0)
        return 0;
    if (stz_path_join(p, sizeof p, w->tmpdir, name))
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
        if (snprintf(name, sizeof name, ".stz-claim-%zu", i) > 0 && !stz_path_join(p, sizeof p, w->tmpdir, name))
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
        char p[PATH_MAX], q[PATH_MAX];
        stz_err err;
        stz_status st = STZ_OK;
        int mine = w->claim ? claim_shard(w, i, &err) : 1;
        if (mine == 0)
            continue;
        if (mine < 0)
            st = err.code;
        if (!st && (stz_shard_path(p, sizeof p, w->in, w->m->shards[i], w->in_suffix) ||
                    stz_shard_path(q, sizeof q, w->tmpdir, w->m->shards[i], w->out_suffix)))
            st = stz_err_set(&err, STZ_E_ARG, "%s: shard name or path too long", w->m->shards[i]);
        if (!st)
            st = w->convert(w->user, p, q, w->threads, w->quiet, &err);
        if (!st && w->rewrite_index) /* the new index's names: the output's */
            st = names_of(q, &w->names[i], &err);
        if (st) {
            pthread_mutex_lock(&w->lock);
            if (!w->failed)
                w->failed = 1, w->err = err;
            pthread_mutex_unlock(&w->lock);
            /* the other ranks stop taking shards */
            if (w->claim && stz_path_join(p, sizeof p, w->tmpdir, FAILED_MARK) == 0)
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
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the workers' state");
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
    int bad = !f || fputs(text, f) < 0;
    if (f && fclose(f))
        bad = 1;
    return bad ? stz_err_set(err, STZ_E_IO, "%s: cannot write: %s", path, strerror(errno)) : STZ_OK;
}

/* The names of the input's shard files (what is made here rather than
 * copied), with room for the index's name after them; NULL when out of
 * memory (*st set). */
static char **shard_files(const stz_model_dir *m, const char *in_suffix, stz_status *st, stz_err *err)
{
    char **skip = calloc(m->n + 2, sizeof *skip);
    if (!skip && !*st)
        *st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the file list");
    for (size_t i = 0; !*st && i < m->n; i++)
        if (!(skip[i] = malloc(strlen(m->shards[i]) + strlen(in_suffix) + 1)))
            *st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a file name");
        else
            sprintf(skip[i], "%s%s", m->shards[i], in_suffix);
    return skip;
}

/* The shards largest first: the last one to start is a small one. */
static stz_status order_shards(const stz_model_dir *m, const char *in, char *const *files, size_t *order, stz_err *err)
{
    double *sizes = calloc(m->n + 1, sizeof *sizes);
    if (!sizes)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the shard order");
    char p[PATH_MAX];
    struct stat sb;
    for (size_t i = 0; i < m->n; i++)
        sizes[i] = stz_path_join(p, sizeof p, in, files[i]) == 0 && stat(p, &sb) == 0 ? (double)sb.st_size : 0;
    stz_largest_first(sizes, m->n, order);
    free(sizes);
    return STZ_OK;
}

/* The index into tmpdir: byte for byte when the names are unchanged, else
 * rebuilt. */
static stz_status write_index(const stz_model_dir *m, const char *in, const char *tmpdir, int rewrite_index,
                              stz_err *err)
{
    char p[PATH_MAX], q[PATH_MAX];
    if (stz_path_join(q, sizeof q, tmpdir, STZ_INDEX_NAME) || stz_path_join(p, sizeof p, in, STZ_INDEX_NAME))
        return STZ_OK;
    if (!rewrite_index)
        return stz_copy_file(p, q, err);
    char *txt = cJSON_Print(m->index);
    stz_status st = txt ? write_text(q, txt, err) : stz_err_set(err, STZ_E_NOMEM, "out of memory for the index");
    free(txt);
    return st;
}

/* ---- the caller's ranks ------------------------------------------------- */

static int many(const stz_ranks *r) { return r && r->size > 1; }

static void bcast(const stz_ranks *r, void *buf, size_t n, int root)
{
    if (many(r))
        r->bcast(r->user, buf, n, root);
}

/* 1 if this or any other rank failed (err: the first failing rank's). */
static int any_failed(const stz_ranks *r, int failed, stz_err *err)
{
    return many(r) ? r->any_failed(r->user, failed, err) : failed;
}

/* ---- the run ------------------------------------------------------------ */

/* Rank 0's temporary directory next to `out` (tracked: a signal removes it
 * while empty), made an ordinary directory (mkdtemp makes it 0700). */
static stz_status make_tmpdir(const char *out, char *tmpdir, size_t cap, int *track, stz_err *err)
{
    const char *slash = strrchr(out, '/');
    int tl =
        snprintf(tmpdir, cap, "%.*s.%s.tmp-XXXXXX", slash ? (int)(slash - out) + 1 : 0, out, slash ? slash + 1 : out);
    if (tl < 0 || (size_t)tl >= cap || stz_tmp_make(tmpdir, 1, track) < 0)
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary directory: %s", out, strerror(errno));
    mode_t mask = umask(0);
    umask(mask);
    chmod(tmpdir, 0777 & ~mask);
    return STZ_OK;
}

/* The new index's weight map from the outputs' tensors, in shard order (the
 * same index for any thread count or rank count); its total_size too.
 * Under ranks the names are read here, from every rank's outputs. */
static stz_status rebuild_index(const stz_model_dir *m, shard_work *w, int read_outputs, stz_err *err)
{
    cJSON *wm = cJSON_CreateObject();
    if (!wm || !cJSON_ReplaceItemInObjectCaseSensitive(m->index, "weight_map", wm))
        return cJSON_Delete(wm), stz_err_set(err, STZ_E_NOMEM, "out of memory for the index");
    double total = 0;
    for (size_t i = 0; i < m->n; i++) {
        char q[PATH_MAX];
        stz_status st;
        if (read_outputs) {
            if (stz_shard_path(q, sizeof q, w->tmpdir, m->shards[i], w->out_suffix))
                return stz_err_set(err, STZ_E_ARG, "%s: path too long", m->shards[i]);
            if ((st = names_of(q, &w->names[i], err)))
                return st;
        }
        for (size_t k = 0; k < w->names[i].n; k++)
            cJSON_AddStringToObject(wm, w->names[i].names[k], m->shards[i]);
        total += w->names[i].bytes;
    }
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(m->index, "metadata");
    if (cJSON_IsObject(meta)) {
        cJSON_DeleteItemFromObjectCaseSensitive(meta, "total_size");
        cJSON_AddNumberToObject(meta, "total_size", total);
    }
    return STZ_OK;
}

/* Rank 0 after every shard is converted: the index, the other files, the
 * rename into place (the temporary directory removed on failure). */
static stz_status finish(const stz_shards_params *p, const stz_model_dir *m, shard_work *w, char **skip, const char *in,
                         const char *out, stz_err *err)
{
    stz_status st = p->rewrite_index ? rebuild_index(m, w, many(p->ranks), err) : STZ_OK;
    skip[m->n] = STZ_INDEX_NAME;
    if (!st)
        st = write_index(m, in, w->tmpdir, p->rewrite_index, err);
    if (!st)
        st = stz_copy_tree(m->real, in, w->tmpdir, skip, err);
    if (!st && stz_rename_noreplace(w->tmpdir, out))
        st = stz_err_set(err, errno == EEXIST || errno == ENOTEMPTY ? STZ_E_EXISTS : STZ_E_IO,
                         "%s: cannot rename the finished directory into place: %s", out, strerror(errno));
    if (st)
        stz_remove_tree(w->tmpdir);
    return st;
}

static void free_names(shard_work *w, size_t n)
{
    for (size_t i = 0; w->names && i < n; i++)
        names_free(&w->names[i]);
    free(w->names);
}

/* Every rank takes the same collective steps (broadcast, failure
 * agreement) in this order, kept in one function so that they stay visible
 * and matched. */
stz_status stz_convert_shards(const stz_shards_params *p, const char *in, const char *out, stz_err *err)
{
    const stz_ranks *ranks = p->ranks;
    int root = !ranks || ranks->rank == 0, mpi = many(ranks), track = -1;
    char tmpdir[PATH_MAX] = "";
    struct stat sb;
    if (lstat(out, &sb) == 0)
        return stz_err_set(err, STZ_E_EXISTS,
                           "%s: output exists; remove it first (directories are never replaced, even with --force)",
                           out);
    stz_model_dir m;
    stz_status st = stz_model_dir_load(&m, in, err);
    if (!st)
        st = stz_model_dir_check(&m, p->in_suffix, err);
    if (!st && root)
        st = make_tmpdir(out, tmpdir, sizeof tmpdir, &track, err);
    bcast(ranks, tmpdir, sizeof tmpdir, 0); /* every rank writes into rank 0's directory */
    if (any_failed(ranks, st != STZ_OK, err)) {
        if (track >= 0) { /* made here; another rank failed */
            stz_tmp_untrack(track);
            rmdir(tmpdir);
        }
        stz_model_dir_free(&m);
        return err->code ? err->code : STZ_E_IO;
    }
    char **skip = shard_files(&m, p->in_suffix, &st, err);
    size_t *order = calloc(m.n + 1, sizeof *order);
    if (!order && !st)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the shard order");
    if (!st)
        st = order_shards(&m, in, skip, order, err);
    shard_work w = {.m = &m,
                    .in = in,
                    .tmpdir = tmpdir,
                    .in_suffix = p->in_suffix,
                    .out_suffix = p->out_suffix,
                    .rewrite_index = p->rewrite_index && !mpi, /* under ranks rank 0 reads every output */
                    .quiet = p->quiet || !root,
                    .convert = p->convert,
                    .user = p->user,
                    .order = order,
                    .claim = mpi};
    if (!st)
        st = convert_shards(&w, p->threads, err);
    if (any_failed(ranks, st != STZ_OK, err)) /* every rank done writing: rank 0 finishes or removes */
        st = err->code ? err->code : STZ_E_IO;
    if (root && mpi)
        unclaim_all(&w);
    if (root && !st)
        st = finish(p, &m, &w, skip, in, out, err);
    else if (root)
        stz_remove_tree(tmpdir);
    if (root)
        stz_tmp_untrack(track);
    free(order);
    free_names(&w, m.n);
    for (size_t i = 0; skip && i < m.n; i++)
        free(skip[i]);
    free(skip);
    stz_model_dir_free(&m);
    if (any_failed(ranks, st != STZ_OK, err)) /* rank 0's last steps, or a failure every rank saw */
        return err->code ? err->code : STZ_E_IO;
    return STZ_OK;
}
