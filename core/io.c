/* File I/O helpers, half-precision conversion and the temporary-output
 * registry used to clean up on errors and signals. */
#include "core/stz_core.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int stz_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = (uint8_t *)buf;
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (k == 0)
            return -1;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static volatile sig_atomic_t interrupt_flag;

void stz_interrupt_request(void) { interrupt_flag = 1; }
int stz_interrupt_pending(void) { return interrupt_flag; }
void stz_interrupt_clear(void) { interrupt_flag = 0; }

/* Waits until fd is ready for `events` (at once for a regular file),
 * looking at the interruption flag every 0.2 s: 0, EINTR when interrupted,
 * or poll's errno. */
static int wait_ready(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        if (interrupt_flag)
            return EINTR;
        int k = poll(&p, 1, 200);
        if (k > 0)
            return 0; /* ready, closed or failed: the read or write says which */
        if (k < 0 && errno != EINTR)
            return errno;
    }
}

int stz_read_some(int fd, void *buf, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        int e = wait_ready(fd, POLLIN);
        if (e)
            return e;
        ssize_t k = read(fd, (uint8_t *)buf + *got, n - *got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return errno;
        if (k == 0)
            break;
        *got += (size_t)k;
    }
    return 0;
}

/* Strict UTF-8 (no overlongs, no surrogates, max U+10FFFF). Returns offset
 * of the first bad byte or `n` if all is well. */
const char *stz_control_char(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return s + i;
    return NULL;
}

size_t stz_utf8_check(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07;
        } else {
            return i;
        }
        if (n - i < len)
            return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += len;
    }
    return n;
}

int stz_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = (const uint8_t *)buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* ---- IEEE half ------------------------------------------------------- */

float stz_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t stz_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00);
    if (a >= 0x38800000u) { /* normal half */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) /* below half the smallest subnormal */
        return (uint16_t)sign;
    /* subnormal half: shift the full mantissa, round to nearest even */
    uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t v = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (v & 1)))
        v++;
    return (uint16_t)(sign | v);
}

/* ---- temporary outputs ----------------------------------------------- */

#define TMP_SLOTS 64
static char *volatile tmp_slots[TMP_SLOTS];
static pthread_mutex_t tmp_lock = PTHREAD_MUTEX_INITIALIZER;

static int tmp_register(char *path)
{
    int slot = -1;
    pthread_mutex_lock(&tmp_lock);
    for (int i = 0; i < TMP_SLOTS && slot < 0; i++)
        if (!tmp_slots[i]) {
            tmp_slots[i] = path;
            slot = i;
        }
    pthread_mutex_unlock(&tmp_lock);
    return slot;
}

static void tmp_unregister(int slot)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&tmp_lock);
    tmp_slots[slot] = NULL;
    pthread_mutex_unlock(&tmp_lock);
}

int stz_tmp_track(char *path) { return tmp_register(path); }
void stz_tmp_untrack(int handle) { tmp_unregister(handle); }

int stz_tmp_make(char *tmpl, int dir, int *handle)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int r = dir ? (mkdtemp(tmpl) ? 0 : -1) : mkstemp(tmpl), e = errno;
    *handle = r < 0 ? -1 : tmp_register(tmpl);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return r;
}

int stz_tmp_beside(stz_tmpfile *t, const char *out, const char *what)
{
    size_t n = strlen(out) + strlen(what) + 16;
    const char *slash = strrchr(out, '/');
    int dirlen = slash ? (int)(slash - out) + 1 : 0, fd;
    t->handle = -1;
    if (!(t->path = malloc(n)))
        return -1;
    snprintf(t->path, n, "%.*s.%s.%s-XXXXXX", dirlen, out, out + dirlen, what);
    if ((fd = stz_tmp_make(t->path, 0, &t->handle)) < 0) {
        free(t->path);
        t->path = NULL;
        return -1;
    }
    mode_t mask = umask(0); /* mkstemp makes it 0600; renamed into place, it is an ordinary file */
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    close(fd);
    return 0;
}

void stz_tmp_remove(stz_tmpfile *t)
{
    if (!t->path)
        return;
    unlink(t->path);
    stz_tmp_untrack(t->handle);
    free(t->path);
    t->path = NULL;
}

stz_status stz_tmp_finish(stz_tmpfile *t, FILE *f, const char *path, int force, stz_err *err)
{
    stz_status st = STZ_OK;
    if (!f || ferror(f) | fclose(f))
        st = stz_err_set(err, STZ_E_IO, "%s: cannot write: %s", path, strerror(errno));
    else
        st = stz_output_place(t->path, path, force, err);
    stz_tmp_remove(t);
    return st;
}

size_t stz_output_name_for(char *dst, size_t cap, const char *model, const char *suffix)
{
    size_t n = strlen(model);
    while (n > 1 && model[n - 1] == '/')
        n--;
    if (n > 12 && !strncmp(model + n - 12, ".safetensors", 12))
        n -= 12;
    int w = snprintf(dst, cap, "%.*s%s", (int)n, model, suffix);
    return w < 0 ? 0 : (size_t)w;
}

void stz_free(void *p) { free(p); }

/* Empties the directory open at fd, in a signal handler: raw getdents64
 * into a stack buffer and unlinkat, no allocation; passes over it until a
 * pass removes nothing (removing entries moves the others). */
static void clear_dir_raw(int fd, int depth)
{
    struct dirent64_raw {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
    };
    for (int removed = 1; removed;) {
        char buf[4096];
        long n;
        removed = 0;
        lseek(fd, 0, SEEK_SET);
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
            for (long off = 0; off < n;) {
                const struct dirent64_raw *d = (const void *)(buf + off);
                off += d->reclen;
                if (!strcmp(d->name, ".") || !strcmp(d->name, ".."))
                    continue;
                if (unlinkat(fd, d->name, 0) == 0) {
                    removed = 1;
                    continue;
                }
                int sub = depth < 16 ? openat(fd, d->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
                if (sub >= 0) {
                    clear_dir_raw(sub, depth + 1);
                    close(sub);
                    removed |= unlinkat(fd, d->name, AT_REMOVEDIR) == 0;
                }
            }
    }
}

/* One pass over the tracked paths; 1 if a directory is left that is not
 * empty. */
static int cleanup_pass(void)
{
    int left = 0;
    for (int i = 0; i < TMP_SLOTS; i++) {
        char *p = tmp_slots[i];
        if (!p || unlink(p) == 0 || errno != EISDIR)
            continue;
        int fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) { /* a temporary directory: finished shards, copied files */
            clear_dir_raw(fd, 0);
            close(fd);
        }
        left |= rmdir(p) != 0 && (errno == ENOTEMPTY || errno == EEXIST);
    }
    return left;
}

/* Other threads run on while a signal handler cleans up: one that began a
 * shard (or a copied file) just before the signal can put it into a
 * temporary directory after the pass emptied it. The pass is repeated while
 * a directory is left, every millisecond for up to a second, by when the
 * threads have seen the first signal's interrupt and stopped. */
void stz_tmp_cleanup_all(void)
{
    int saved = errno;
    for (int pass = 0; pass < 1000 && cleanup_pass(); pass++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    errno = saved;
}

stz_status stz_refuse_input_as_output(const char *in, const char *out, stz_err *err)
{
    if (stz_same_file(in, out))
        return stz_err_set(err, STZ_E_EXISTS, "%s: output is the input file; refusing to write over it", out);
    return STZ_OK;
}

/* What a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)                 ? "a directory"
           : S_ISFIFO(m)              ? "a FIFO"
           : S_ISSOCK(m)              ? "a socket"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device"
                                      : "a special file";
}

stz_status stz_output_check(const char *path, int force, stz_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return STZ_OK;
    if (!S_ISREG(st.st_mode)) /* with or without --force: never a device, a FIFO, a directory */
        return stz_err_set(err, STZ_E_EXISTS, "%s: output is %s: stz replaces only regular files%s", path,
                           file_kind(st.st_mode), S_ISDIR(st.st_mode) ? "" : " (standard output is -o - or -c)");
    if (!force)
        return stz_err_set(err, STZ_E_EXISTS, "%s: output exists (use --force to replace it)", path);
    return STZ_OK;
}

stz_status stz_output_place(const char *tmp, const char *path, int force, stz_err *err)
{
    struct stat st;
    /* checked again here: what is at `path` may have changed while we worked */
    if (force && lstat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        return stz_err_set(err, STZ_E_EXISTS, "%s: output became %s while stz was writing; left as it is", path,
                           file_kind(st.st_mode));
    if ((force ? rename(tmp, path) : stz_rename_noreplace(tmp, path)) != 0)
        return stz_err_set(err, errno == EEXIST ? STZ_E_EXISTS : STZ_E_IO,
                           errno == EEXIST ? "%s: output appeared while stz was writing; left as it is (use --force "
                                             "to replace it)"
                                           : "%s: cannot rename temporary output into place: %s",
                           path, strerror(errno));
    return STZ_OK;
}

stz_status stz_open_regular(const char *path, int *fd, uint64_t *size, stz_err *err)
{
    struct stat st;
    *fd = -1;
    if (!strcmp(path, "-")) /* the commands that can read a pipe handle "-" before this */
        return stz_err_set(err, STZ_E_ARG,
                           "standard input ('-'): this needs a seekable file (it reads at offsets); "
                           "save the stream to a file first (pack, unpack, verify, decompress and "
                           "compress --lossless read a pipe)");
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer;
     * it is cleared again for the regular file we expect. */
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (*fd < 0 || fstat(*fd, &st) != 0) {
        int e = errno;
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return stz_err_set(err, STZ_E_IO, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return stz_err_set(err, STZ_E_IO, "%s: not a regular file (%s%s)", path, file_kind(st.st_mode),
                           S_ISFIFO(st.st_mode) ? ": stz reads its inputs at offsets, give a file" : "");
    }
    int fl = fcntl(*fd, F_GETFL);
    if (fl >= 0)
        fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK);
    *size = (uint64_t)st.st_size;
    return STZ_OK;
}

stz_status stz_read_text(const char *path, size_t limit, char **text, size_t *len, stz_err *err)
{
    int fd;
    uint64_t size;
    *text = NULL;
    stz_status st = stz_open_regular(path, &fd, &size, err);
    if (st)
        return st;
    if (size > limit) {
        close(fd);
        return stz_err_set(err, STZ_E_FORMAT, "%s: %llu bytes, more than the %zu this kind of file may have", path,
                           (unsigned long long)size, limit);
    }
    char *b = malloc((size_t)size + 1);
    int e = b ? stz_pread_full(fd, b, (size_t)size, 0) : ENOMEM;
    close(fd);
    if (e) {
        free(b);
        return stz_err_set(err, e == ENOMEM ? STZ_E_NOMEM : STZ_E_IO, "%s: cannot read: %s", path,
                           e < 0 ? "file shrank" : strerror(e));
    }
    b[size] = 0;
    *text = b;
    if (len)
        *len = (size_t)size;
    return STZ_OK;
}

int stz_rename_noreplace(const char *from, const char *to)
{
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return -1;
    /* file systems without RENAME_NOREPLACE: link() never replaces either */
    struct stat st;
    if (lstat(from, &st) == 0 && !S_ISDIR(st.st_mode) && link(from, to) == 0)
        return unlink(from), 0;
    if (errno == EEXIST)
        return -1;
    if (lstat(to, &st) == 0) /* last resort: check, then rename */
        return errno = EEXIST, -1;
    return rename(from, to);
}

stz_status stz_check_space(const stz_outfile *of, uint64_t need, const char *what, stz_err *err)
{
    struct statvfs vs;
    if (statvfs(of->tmp_path, &vs) != 0)
        return STZ_OK; /* unknown: the writes will tell */
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    if (avail < need)
        return stz_err_set(err, STZ_E_IO, "%s: not enough free space: %s needs %llu bytes, the file system has %llu",
                           of->path, what, (unsigned long long)need, (unsigned long long)avail);
    return STZ_OK;
}

int stz_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) || stat(b, &sb))
        return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

stz_status stz_outfile_open(stz_outfile *of, const char *path, int force, stz_err *err)
{
    memset(of, 0, sizeof *of);
    of->fd = -1;
    of->slot = -1;
    if (!path || !*path)
        return stz_err_set(err, STZ_E_ARG, "no output path given");
    stz_status st = stz_output_check(path, force, err);
    if (st)
        return st;
    size_t len = strlen(path);
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    of->path = strdup(path);
    of->tmp_path = malloc(len + 32);
    if (!of->path || !of->tmp_path) {
        stz_outfile_abort(of);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
    }
    snprintf(of->tmp_path, len + 32, "%.*s.%s.tmp-XXXXXX", (int)dirlen, path, path + dirlen);
    of->fd = stz_tmp_make(of->tmp_path, 0, &of->slot);
    if (of->fd < 0) {
        int e = errno;
        free(of->tmp_path);
        of->tmp_path = NULL;
        stz_outfile_abort(of);
        return stz_err_set(err, STZ_E_IO, "%s: cannot create temporary output: %s", path, strerror(e));
    }
    of->force = force;
    return STZ_OK;
}

void stz_outfile_stdout(stz_outfile *of)
{
    memset(of, 0, sizeof *of);
    of->fd = STDOUT_FILENO, of->slot = -1;
}

/* Standard output takes bytes in order only. */
static stz_status stream_write(stz_outfile *of, const uint8_t *b, size_t n, stz_err *err)
{
    while (n) {
        int e = wait_ready(of->fd, POLLOUT);
        if (e)
            return stz_err_set(err, e == EINTR ? STZ_E_INTERRUPTED : STZ_E_IO, "writing to standard output: %s",
                               e == EINTR ? "interrupted" : strerror(e));
        ssize_t k = write(of->fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return stz_err_set(err, STZ_E_IO, "writing to standard output: %s",
                               k < 0 ? strerror(errno) : "no progress");
        b += k, n -= (size_t)k, of->pos += (uint64_t)k;
    }
    return STZ_OK;
}

stz_status stz_outfile_pwrite(stz_outfile *of, const void *buf, size_t n, uint64_t off, stz_err *err)
{
    if (!of->path) /* standard output: only where the bytes so far end */
        return off == of->pos ? stream_write(of, buf, n, err)
                              : stz_err_set(err, STZ_E_UNSUPPORTED,
                                            "standard output: cannot write at offset %llu, "
                                            "%llu bytes written",
                                            (unsigned long long)off, (unsigned long long)of->pos);
    int e = stz_pwrite_full(of->fd, buf, n, off);
    if (e)
        return stz_err_set(err, STZ_E_IO, "%s: write failed at offset %llu: %s", of->path, (unsigned long long)off,
                           strerror(e));
    return STZ_OK;
}

stz_status stz_outfile_write(stz_outfile *of, const void *buf, size_t n, stz_err *err)
{
    if (!of->path)
        return stream_write(of, buf, n, err);
    stz_status st = stz_outfile_pwrite(of, buf, n, of->pos, err);
    if (st == STZ_OK)
        of->pos += n;
    return st;
}

stz_status stz_outfile_commit(stz_outfile *of, stz_err *err)
{
    if (!of->path) { /* standard output: nothing to rename */
        of->fd = -1;
        return STZ_OK;
    }
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(of->fd, 0666 & ~mask) != 0 || close(of->fd) != 0) {
        of->fd = -1;
        return stz_err_set(err, STZ_E_IO, "%s: cannot finish output: %s", of->path, strerror(errno));
    }
    of->fd = -1;
    stz_status st = stz_output_place(of->tmp_path, of->path, of->force, err);
    if (st)
        return st;
    tmp_unregister(of->slot);
    of->slot = -1;
    free(of->tmp_path);
    of->tmp_path = NULL;
    return STZ_OK;
}

void stz_outfile_abort(stz_outfile *of)
{
    if (of->fd >= 0 && of->path) /* standard output stays open */
        close(of->fd);
    of->fd = -1;
    if (of->tmp_path)
        unlink(of->tmp_path);
    tmp_unregister(of->slot);
    of->slot = -1;
    free(of->tmp_path);
    free(of->path);
    of->tmp_path = of->path = NULL;
}

/* ---- JSON objects ------------------------------------------------------ */

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Both walk objects only: an array's elements have no key (NULL), so they
 * would reach strcmp. Callers check cJSON_IsObject to refuse the rest. */
int stz_has_magic(const char *path, const void *magic, size_t n)
{
    int fd = -1;
    uint64_t size;
    uint8_t m[16];
    stz_err ignored;
    int yes = n <= sizeof m && stz_open_regular(path, &fd, &size, &ignored) == STZ_OK &&
              stz_pread_full(fd, m, n, 0) == 0 && memcmp(m, magic, n) == 0;
    if (fd >= 0)
        close(fd);
    return yes;
}

const char *stz_first_duplicate(const char **names, size_t n)
{
    qsort(names, n, sizeof *names, cmp_str_ptr);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(names[i], names[i - 1]))
            return names[i];
    return NULL;
}
