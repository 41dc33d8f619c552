/* Directories: joining paths, whether a link stays inside a directory,
 * copying a file or a tree (what a model directory holds beside its
 * shards), removing a tree (an unfinished output). */
#include "core/stz_core.h"

#include <dirent.h>
#include <ftw.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int stz_path_join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int stz_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int stz_path_inside(const char *root_real, const char *path)
{
    char real[PATH_MAX];
    size_t n = strlen(root_real);
    return realpath(path, real) && !strncmp(real, root_real, n) && (real[n] == '/' || real[n] == 0);
}

stz_status stz_copy_file(const char *from, const char *to, stz_err *err)
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

void stz_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[PATH_MAX];
    struct stat sb;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || stz_path_join(p, sizeof p, dir, e->d_name))
            continue;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            stz_remove_tree(p);
        else
            unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* A link in the tree: made again as the same relative link when its target
 * is inside root, else refused. */
static stz_status copy_link(const char *root, const char *p, const char *q, stz_err *err)
{
    char link[PATH_MAX];
    ssize_t n = readlink(p, link, sizeof link - 1);
    if (n < 0 || !stz_path_inside(root, p))
        return stz_err_set(err, STZ_E_ARG,
                           "%s: link to something outside the model directory (or dangling); "
                           "refusing to follow or copy it",
                           p);
    link[n] = 0;
    if (link[0] == '/')
        return stz_err_set(err, STZ_E_ARG, "%s: absolute link; it would not point into the new directory", p);
    if (symlink(link, q) != 0)
        return stz_err_set(err, STZ_E_IO, "%s: cannot create link: %s", q, strerror(errno));
    return STZ_OK;
}

/* One entry of the tree: p copied to q. */
static stz_status copy_entry(const char *root, const char *p, const char *q, stz_err *err)
{
    struct stat sb;
    if (lstat(p, &sb) != 0)
        return stz_err_set(err, STZ_E_IO, "%s: %s", p, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        if (mkdir(q, 0777) != 0)
            return stz_err_set(err, STZ_E_IO, "%s: cannot create directory: %s", q, strerror(errno));
        return stz_copy_tree(root, p, q, NULL, err);
    }
    if (S_ISREG(sb.st_mode))
        return stz_copy_file(p, q, err);
    if (S_ISLNK(sb.st_mode))
        return copy_link(root, p, q, err);
    return stz_err_set(err, STZ_E_ARG, "%s: not a regular file, directory or link; cannot be carried", p);
}

stz_status stz_copy_tree(const char *root, const char *from, const char *to, char *const *skip, stz_err *err)
{
    DIR *d = opendir(from);
    struct dirent *e;
    stz_status st = d ? STZ_OK : stz_err_set(err, STZ_E_IO, "%s: cannot read directory: %s", from, strerror(errno));
    while (!st && (e = readdir(d))) {
        char p[PATH_MAX], q[PATH_MAX];
        int skipped = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
        for (size_t i = 0; skip && skip[i] && !skipped; i++)
            skipped = !strcmp(skip[i], e->d_name);
        if (skipped)
            continue;
        if (stz_path_join(p, sizeof p, from, e->d_name) || stz_path_join(q, sizeof q, to, e->d_name))
            st = stz_err_set(err, STZ_E_ARG, "%s/%s: path too long", from, e->d_name);
        else
            st = copy_entry(root, p, q, err);
    }
    if (d)
        closedir(d);
    return st;
}

void stz_largest_first(const double *sizes, size_t n, size_t *order)
{
    for (size_t i = 0; i < n; i++) { /* insertion, stable: files are few */
        size_t k = i;
        for (; k > 0 && sizes[order[k - 1]] < sizes[i]; k--)
            order[k] = order[k - 1];
        order[k] = i;
    }
}

static __thread uint64_t tree_bytes; /* nftw passes no user pointer */
static __thread int tree_model_only;
static int add_bytes(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    size_t n = strlen(path);
    int model = (n > 12 && !strcmp(path + n - 12, ".safetensors")) || (n > 4 && !strcmp(path + n - 4, ".stz"));
    if (type == FTW_F && S_ISREG(sb->st_mode) && (ftw->level == 0 || model || !tree_model_only))
        tree_bytes += (uint64_t)sb->st_size;
    return 0;
}

uint64_t stz_path_bytes(const char *path, int model_only)
{
    tree_bytes = 0, tree_model_only = model_only;
    nftw(path, add_bytes, 16, FTW_PHYS);
    return tree_bytes;
}
