/* Internal helpers shared by the library's modules. Not installed. */
#ifndef STZ_CORE_H
#define STZ_CORE_H

#include "stz.h"
#include "stz_files.h" /* the helpers the command layer uses too */

#include <stdint.h>
#include <string.h>

/* Function clones for newer x86-64 instruction sets, the best one chosen
 * when the program loads (GCC on x86-64; other compilers and machines build
 * the baseline only, and so does -DSTZ_NO_CLONES: ThreadSanitizer crashes
 * in the clones' resolvers). Clones must compute the same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(STZ_NO_CLONES)
#define STZ_X86_CLONES  1
#define STZ_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#else
#define STZ_X86_CLONES 0
#define STZ_CLONES(...)
#endif

/* The library's error style: each step either succeeds or jumps to the
 * function's `cleanup:` label with st set, where everything is freed once
 * (functions with nothing to free return the error directly).
 *   STZ_TRY(st, step(...));   st = step; on error, goto cleanup */
#define STZ_TRY(st, call)                                                                                              \
    do {                                                                                                               \
        if (((st) = (call)) != STZ_OK)                                                                                 \
            goto cleanup;                                                                                              \
    } while (0)

/* Returns st; when st is an error whose message is a bare "out of memory...",
 * prefixes it with the path it happened for (the entry points' context). */
stz_status stz_err_in(stz_err *err, stz_status st, const char *path);

/* ---- files, names and JSON ----------------------------------------- */

/* Adds a path of the caller's (an intermediate file) to what
 * stz_tmp_cleanup_all() removes; returns a handle for stz_tmp_untrack, or
 * -1 when the table is full. The path must stay valid while tracked. */
int stz_tmp_track(char *path);
void stz_tmp_untrack(int handle);
/* mkstemp (dir 0: returns the descriptor) or mkdtemp (dir 1: returns 0) on
 * tmpl, tracked as stz_tmp_track does (*handle), with every signal held
 * back from before the file exists until it is tracked, so that no signal
 * can leave it behind; -1 (errno set) when it cannot be made. */
int stz_tmp_make(char *tmpl, int dir, int *handle);

/* 1 if a and b name the same existing file (same device and inode), else 0. */
int stz_same_file(const char *a, const char *b);

/* Opens an existing regular file for reading: *fd and its *size, or
 * STZ_E_IO naming the path (*fd = -1); a FIFO
 * or device is refused without blocking. */
stz_status stz_open_regular(const char *path, int *fd, uint64_t *size, stz_err *err);

/* 1 if path is a regular file whose first n bytes are magic (never blocks
 * on a FIFO or device). */
int stz_has_magic(const char *path, const void *magic, size_t n);

/* Sorts names[0..n) and returns the first name that appears twice, or NULL. */
const char *stz_first_duplicate(const char **names, size_t n);

/* JSON objects parsed by cJSON, which keeps every duplicate key (and
 * lookups return the first): the first key that appears twice in `obj`, or
 * NULL. */
struct cJSON;
const char *stz_json_duplicate_key(const struct cJSON *obj);
/* The first key of `obj` not in the NULL-terminated list `allowed`, or NULL. */
const char *stz_json_unknown_key(const struct cJSON *obj, const char *const *allowed);

/* The first control character (below 0x20, or DEL) of s[0..n), NUL
 * included, or NULL: names of tensors and keys may hold none. */
const char *stz_control_char(const char *s, size_t n);

/* rename() that never replaces an existing `to` (EEXIST); 0 or -1/errno. */
int stz_rename_noreplace(const char *from, const char *to);

/* ---- directories (dirs.c) ---------------------------------------------- */

/* dir/name into buf; 0, or -1 if it does not fit. */
int stz_path_join(char *buf, size_t cap, const char *dir, const char *name);
/* 1 if `path` is a directory (or a link to one). */
int stz_is_dir(const char *path);
/* 1 if `path` (which may be a link) resolves to a place inside `root_real`
 * (an already resolved directory). */
int stz_path_inside(const char *root_real, const char *path);
/* Copies the regular file `from` to a new file `to` (never replaced). */
stz_status stz_copy_file(const char *from, const char *to, stz_err *err);
/* Copies everything below `from` into `to` (which exists), hidden files and
 * subdirectories included, except `skip` (a NULL-terminated list of names at
 * the top level). A link whose target is inside the directory `root` (an
 * already resolved path) is made again as the same link; a link out of it,
 * or a FIFO, socket or device, is refused by name. */
stz_status stz_copy_tree(const char *root, const char *from, const char *to, char *const *skip, stz_err *err);
/* Removes a directory and everything below it (links themselves, never
 * what they point to). */
void stz_remove_tree(const char *dir);

/* Little-endian loads and stores: never cast pointers into file data. */
static inline uint16_t stz_le16(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint16_t)(b[0] | (b[1] << 8));
}
static inline uint32_t stz_le32(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}
static inline uint64_t stz_le64(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint64_t)stz_le32(b) | ((uint64_t)stz_le32(b + 4) << 32);
}
static inline void stz_put_le16(void *p, uint16_t v)
{
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static inline void stz_put_le32(void *p, uint32_t v)
{
    uint8_t *b = (uint8_t *)p;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline void stz_put_le64(void *p, uint64_t v)
{
    stz_put_le32(p, (uint32_t)v);
    stz_put_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* Float conversions. BF16 rounds to nearest even; NaN stays NaN. */
static inline float stz_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t stz_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, keeps sign */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
float stz_f16_to_f32(uint16_t h);
uint16_t stz_f32_to_f16(float f);

/* pread/pwrite loops that retry on EINTR and short counts. Return 0 or
 * errno; pread returns -1 at end of file before n bytes. */
int stz_pread_full(int fd, void *buf, size_t n, uint64_t off);
int stz_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* read() until n bytes or the end of the stream (*got tells how many),
 * retrying on EINTR. Returns 0 or errno. */
int stz_read_some(int fd, void *buf, size_t n, size_t *got);

/* ---- output files: temporary name, rename at the end ----------------- */

typedef struct stz_outfile {
    int fd;
    char *path;     /* final name */
    char *tmp_path; /* where bytes go until commit */
    int slot;       /* index in the cleanup registry, -1 if none */
    uint64_t pos;   /* where stz_outfile_write appends */
    int force;      /* commit may replace an existing file */
} stz_outfile;

// clang-format off
#define STZ_OUTFILE_INIT {-1, NULL, NULL, -1, 0, 0}
// clang-format on

/* Creates a temporary file next to `path`. STZ_E_EXISTS if path exists and
 * !force. The temp name is registered so stz_tmp_cleanup_all() removes it. */
stz_status stz_outfile_open(stz_outfile *of, const char *path, int force, stz_err *err);
/* An outfile that is standard output (no path): bytes go in order only,
 * commit and abort leave it open. */
void stz_outfile_stdout(stz_outfile *of);
/* Appends at of->pos and advances it. */
stz_status stz_outfile_write(stz_outfile *of, const void *buf, size_t n, stz_err *err);
/* Writes at an absolute offset (threads may write disjoint ranges at once);
 * does not move of->pos. */
stz_status stz_outfile_pwrite(stz_outfile *of, const void *buf, size_t n, uint64_t off, stz_err *err);
/* Renames the temporary file to the final path (permissions follow umask).
 * Without force it never replaces a file that appeared meanwhile
 * (STZ_E_EXISTS). */
stz_status stz_outfile_commit(stz_outfile *of, stz_err *err);
/* STZ_E_IO naming the output, `what`, `need` and the free bytes when the
 * output's file system has less than `need` bytes free. */
stz_status stz_check_space(const stz_outfile *of, uint64_t need, const char *what, stz_err *err);
/* Removes the temporary file if still there; safe after commit and twice. */
void stz_outfile_abort(stz_outfile *of);

/* ---- ordered parallel work --------------------------------------- */

/*
 * Runs work(i) for i in [0, n) on `threads` threads (the caller's thread is
 * one of them), then commit(i) strictly in order 0, 1, 2, ... with the
 * commits serialised (but outside the pipeline's lock: the other threads
 * take and work on items meanwhile, so a commit may wait, for room in a
 * sink say), then post(i) (optional) in any order. Work that needs no order,
 * such as writing at a reserved offset, belongs in post(). Work items are
 * handed out in order, so at most `threads` items are in flight: memory
 * stays bounded by the per-thread buffers. The first error stops the run
 * and is returned. progress (optional) is called from the caller's thread
 * with `done`, which only commit() may advance. Without commit() nothing
 * waits for order: a thread takes the next item as soon as it is done.
 */
typedef struct stz_ordered {
    size_t n;
    int threads;
    void *ctx;
    stz_status (*work)(void *ctx, int tid, size_t i, stz_err *err);
    stz_status (*commit)(void *ctx, int tid, size_t i, stz_err *err);
    stz_status (*post)(void *ctx, int tid, size_t i, stz_err *err);
    stz_progress_fn progress;
    void *progress_user;
    uint64_t done, total; /* progress units; commit() updates done */
    int no_interrupt;     /* 1: items are taken after stz_interrupt_request() too (else the run stops with
                           * STZ_E_INTERRUPTED before the next item) */
} stz_ordered;

stz_status stz_ordered_run(stz_ordered *p, stz_err *err);

/* Sets OpenBLAS's thread count (process-wide; at least 1): the one place the
 * library does, for the operations whose public headers say they do (SVD,
 * the forward pass). */
void stz_blas_threads(int n);

/* ---- products with the same bits everywhere (matmul.c) ------------------ */

/* Y (n, out; rows ldy apart) = X (n, k; ldx) @ W (out, k; ldw)^T. Each
 * output: 16 partial sums s[m] of x[p] * w[p] over p = m (mod 16), in order
 * of p, then s[m] + s[m + 8], + 4, + 2, + 1; the same bits on every CPU,
 * instruction set and thread count (threads split the outputs). */
void stz_mm_nt(float *Y, size_t ldy, const float *X, size_t ldx, const float *W, size_t ldw, size_t n, size_t k,
               size_t out, int threads);
/* Y (n, out; ldy) = (add ? Y : 0) + A (n, k) @ B (k, out; ldb), A's element
 * (i, p) at A[i * ai + p * ap] (ai = 1, ap = lda for A^T). Each output takes
 * its products one at a time in order of p, so a sum split over calls
 * (add = 1) gives the bits of one call. */
void stz_mm_nn(float *Y, size_t ldy, const float *A, size_t ai, size_t ap, const float *B, size_t ldb, size_t n,
               size_t k, size_t out, int add, int threads);
/* H (c, c) += X (n, c)^T @ X, as stz_mm_nn (the upper triangle computed,
 * mirrored to the lower: a symmetric H). */
void stz_mm_gram(float *H, const float *X, size_t n, size_t c, int threads);
/* T (cols x rows) = X (rows x cols)^T, both row-major. */
void stz_transpose(float *T, const float *X, size_t rows, size_t cols);
/* Shapes of a product: only the upper or lower triangle of Y (n == out) is
 * wanted (tiles wholly on the other side are skipped); B is lower
 * triangular (the products of its zeros above the diagonal, which add
 * nothing, are left out). */
enum { STZ_MM_FULL = 0, STZ_MM_UPPER = 1, STZ_MM_LOWER = 2, STZ_MM_LOWER_B = 4 };
/* stz_mm_nn in double, on the tiles `shape` (STZ_MM_*) asks for. */
void stz_mm_nn_d(double *Y, size_t ldy, const double *A, size_t ai, size_t ap, const double *B, size_t ldb, size_t n,
                 size_t k, size_t out, int add, int shape, int threads);
/* The Cholesky factor L (L L^T = A) of A (n x n, row-major, its lower
 * triangle read), in place in A's lower triangle; the same bits as the
 * unblocked right-looking algorithm (each element's products taken in
 * order), whatever the threads. 0, -1 if A is not positive definite, -2
 * out of memory, -3 interrupted (stz_interrupt_pending, between panels:
 * an 8192-wide one takes seconds). */
int stz_cholesky(double *A, size_t n, int threads);
/* X (n x n) = L^-1 for L lower triangular (n x n, its lower triangle read):
 * row i of X is -(L[i, :i] @ X[:i, :]) / L[i][i], the products in order.
 * 0, or -3 interrupted (between blocks of rows; X is then incomplete). */
int stz_tri_inverse(const double *L, double *X, size_t n, int threads);
/* The instruction set the products run on: "avx512", "avx2" or "generic";
 * STZ_KERNELS (for tests) picks a lower one. Every one gives the same bits. */
const char *stz_mm_kernels(void);
/* Makes the products run on the copy `name` ("generic", "avx2", "avx512");
 * -1 (nothing changed) when this CPU cannot run it. For tests. */
int stz_mm_use(const char *name);

#endif /* STZ_CORE_H */
