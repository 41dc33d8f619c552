/* Matrix products whose every output has one fixed order of operations, so
 * that the forward pass, Gram matrices and error feedback give the same bits
 * on any CPU, instruction set and thread count (docs/ARCHITECTURE.md,
 * "Same bits everywhere").
 *
 * The kernels are written once, on GCC's 16-float vectors: an operation on
 * a vector is defined lane by lane, so the code computes the same thing
 * compiled for AVX-512 (one register), AVX2 (two) or the x86-64 baseline
 * (four SSE registers; NEON likewise on aarch64). -ffp-contract=off keeps
 * every product and sum rounded on its own. Threads split the outputs,
 * never a sum.
 *
 * - A @ B (stz_mm_nn): each output is its starting value (0 or Y) plus the
 *   products in order of k, one at a time: vectorised across outputs.
 * - X @ W^T (stz_mm_nt): both operands are rows along k, so each
 *   output is 16 partial sums, s[m] over k = m (mod 16) in order of k
 *   (lanes past k read 0), then s[m] + s[m + 8], + 4, + 2, + 1. */
#include "core/stz_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors pass only between inlined functions */

#define INLINE static inline __attribute__((always_inline))

INLINE v16 load16(const float *p)
{
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

/* s[m] + s[m + 8], + 4, + 2, + 1 */
INLINE float reduce16(v16 s)
{
    v8 a = __builtin_shufflevector(s, s, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(s, s, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* ---- X @ W^T: dot products of rows ------------------------------------------------------------------------------ */

#define MAXR 4
#define MAXC 6

/* Y (r, c; ldy) = X (r, k; ldx) @ W (c, k; ldw)^T, r <= MAXR, c <= MAXC, on vectors V of L = 16, 8 or 4 lanes:
 * each 16-lane partial sum is 16 / L vectors side by side, the same operations lane by lane, so that a copy can
 * keep its tile in the registers it has. Columns [j0, j1) of Y in tiles of R x C (constants, so the tile lives in
 * registers). */
#define NT_KERNELS(V, L)                                                                                               \
    /* acc[i][j] += the 16 products of X (r, 16; lx) and W (c, 16; lw) */                                              \
    INLINE void nt_step_##L(V acc[MAXR][MAXC][16 / L], const float *X, size_t lx, const float *W, size_t lw, int r,    \
                            int c)                                                                                     \
    {                                                                                                                  \
        V w[MAXC] = {{0}}, x;                                                                                          \
        _Pragma("GCC unroll 4") for (int h = 0; h < 16 / L; h++)                                                       \
        {                                                                                                              \
            _Pragma("GCC unroll 6") for (int j = 0; j < c; j++) memcpy(&w[j], W + j * lw + h * L, sizeof(V));          \
            _Pragma("GCC unroll 4") for (int i = 0; i < r; i++)                                                        \
            {                                                                                                          \
                memcpy(&x, X + i * lx + h * L, sizeof(V));                                                             \
                _Pragma("GCC unroll 6") for (int j = 0; j < c; j++) acc[i][j][h] += x * w[j];                          \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
                                                                                                                       \
    INLINE void nt_tile_##L(float *Y, size_t ldy, const float *X, size_t ldx, const float *W, size_t ldw, size_t k,    \
                            int r, int c)                                                                              \
    {                                                                                                                  \
        V acc[MAXR][MAXC][16 / L] = {{{{0}}}};                                                                         \
        size_t p = 0;                                                                                                  \
        for (; p + 16 <= k; p += 16)                                                                                   \
            nt_step_##L(acc, X + p, ldx, W + p, ldw, r, c);                                                            \
        if (p < k) { /* the last k % 16, then 0 */                                                                     \
            float xt[MAXR][16] = {{0}}, wt[MAXC][16] = {{0}};                                                          \
            for (int i = 0; i < r; i++)                                                                                \
                memcpy(xt[i], X + i * ldx + p, (k - p) * sizeof(float));                                               \
            for (int j = 0; j < c; j++)                                                                                \
                memcpy(wt[j], W + j * ldw + p, (k - p) * sizeof(float));                                               \
            nt_step_##L(acc, xt[0], 16, wt[0], 16, r, c);                                                              \
        }                                                                                                              \
        for (int i = 0; i < r; i++)                                                                                    \
            for (int j = 0; j < c; j++)                                                                                \
                Y[i * ldy + j] = reduce16(load16((const float *)acc[i][j]));                                           \
    }                                                                                                                  \
                                                                                                                       \
    INLINE void nt_cols_##L(float *Y, size_t ldy, const float *X, size_t ldx, const float *W, size_t ldw, size_t n,    \
                            size_t k, size_t j0, size_t j1, int R, int C)                                              \
    {                                                                                                                  \
        size_t mc = ((size_t)512 << 10) / (k * sizeof(float) + 1) / (size_t)R * (size_t)R;                             \
        mc = mc < (size_t)R ? (size_t)R : mc;                                                                          \
        for (size_t i0 = 0; i0 < n; i0 += mc) /* rows of X half a 1 MiB cache at a time */                             \
            for (size_t j = j0; j < j1; j += (size_t)C) {                                                              \
                int c = j1 - j < (size_t)C ? (int)(j1 - j) : C;                                                        \
                for (size_t i = i0; i < n && i < i0 + mc; i += (size_t)R) {                                            \
                    int r = n - i < (size_t)R ? (int)(n - i) : R;                                                      \
                    float *y = Y + i * ldy + j;                                                                        \
                    const float *x = X + i * ldx, *w = W + j * ldw;                                                    \
                    if (r == R && c == C)                                                                              \
                        nt_tile_##L(y, ldy, x, ldx, w, ldw, k, R, C);                                                  \
                    else if (r == 1 && c == C) /* one row: sampling */                                                 \
                        nt_tile_##L(y, ldy, x, ldx, w, ldw, k, 1, C);                                                  \
                    else                                                                                               \
                        nt_tile_##L(y, ldy, x, ldx, w, ldw, k, r, c);                                                  \
                }                                                                                                      \
            }                                                                                                          \
    }

NT_KERNELS(v16, 16)
NT_KERNELS(v8, 8)
NT_KERNELS(v4, 4)

/* ---- A @ B: rows of B scaled and added, in order of k ----------------------------------------------------------- */

/* Y (r, c vectors; ldy) (+)= A (r, k) @ B (k, c vectors; ldb), A's element (i, p) at A[i * ai + p * ap], the last
 * vector holding `last` (1..L) columns; products from p = k0 on (those before are known to be 0). For floats (T, V:
 * vectors of L = 16) and doubles (L = 8). */
#define NN_KERNELS(N, T, V, L)                                                                                         \
    INLINE void nn_tile_##N(T *Y, size_t ldy, const T *A, size_t ai, size_t ap, const T *B, size_t ldb, size_t k0,     \
                            size_t k, int r, int c, size_t last, int add)                                              \
    {                                                                                                                  \
        V acc[MAXR][MAXC], b[MAXC] = {{0}};                                                                            \
        for (int i = 0; i < r; i++)                                                                                    \
            for (int j = 0; j < c; j++) { /* whole vectors copied, so that the tile stays in registers */              \
                T t[L] = {0};                                                                                          \
                for (size_t e = 0; add && e < (j == c - 1 ? last : L); e++)                                            \
                    t[e] = Y[i * ldy + L * j + e];                                                                     \
                memcpy(&acc[i][j], t, sizeof(V));                                                                      \
            }                                                                                                          \
        for (size_t p = k0; p < k; p++) {                                                                              \
            _Pragma("GCC unroll 3") for (int j = 0; j < c; j++)                                                        \
            {                                                                                                          \
                if (j == c - 1 && last < L) {                                                                          \
                    b[j] = (V){0};                                                                                     \
                    for (size_t e = 0; e < last; e++)                                                                  \
                        b[j][e] = B[p * ldb + L * j + e];                                                              \
                } else                                                                                                 \
                    memcpy(&b[j], B + p * ldb + L * j, sizeof(V));                                                     \
            }                                                                                                          \
            _Pragma("GCC unroll 4") for (int i = 0; i < r; i++)                                                        \
            {                                                                                                          \
                T a = A[i * ai + p * ap];                                                                              \
                _Pragma("GCC unroll 3") for (int j = 0; j < c; j++) acc[i][j] += a * b[j];                             \
            }                                                                                                          \
        }                                                                                                              \
        for (int i = 0; i < r; i++)                                                                                    \
            for (int j = 0; j < c; j++) {                                                                              \
                T t[L];                                                                                                \
                memcpy(t, &acc[i][j], sizeof(V));                                                                      \
                memcpy(Y + i * ldy + L * j, t, (j == c - 1 ? last : L) * sizeof(T));                                   \
            }                                                                                                          \
    }                                                                                                                  \
                                                                                                                       \
    /* Columns [j0, j1), of the tiles that shape (STZ_MM_*) asks for                                                \
     */  \
    INLINE void nn_cols_##N(T *Y, size_t ldy, const T *A, size_t ai, size_t ap, const T *B, size_t ldb, size_t n,      \
                            size_t k, size_t j0, size_t j1, int add, int shape, int R, int C)                          \
    {                                                                                                                  \
        for (size_t j = j0; j < j1; j += L * (size_t)C) {                                                              \
            size_t cols = j1 - j < L * (size_t)C ? j1 - j : L * (size_t)C;                                             \
            int c = (int)((cols + L - 1) / L);                                                                         \
            size_t last = cols - L * (size_t)(c - 1), k0 = shape & STZ_MM_LOWER_B ? (j < k ? j : k) : 0;               \
            size_t i = shape & STZ_MM_LOWER ? j / (size_t)R * (size_t)R : 0;                                           \
            for (; i < n && (!(shape & STZ_MM_UPPER) || i < j + cols); i += (size_t)R) {                               \
                int r = n - i < (size_t)R ? (int)(n - i) : R;                                                          \
                T *y = Y + i * ldy + j;                                                                                \
                const T *a = A + i * ai;                                                                               \
                if (r == R && c == C && last == L)                                                                     \
                    nn_tile_##N(y, ldy, a, ai, ap, B + j, ldb, k0, k, R, C, L, add);                                   \
                else                                                                                                   \
                    nn_tile_##N(y, ldy, a, ai, ap, B + j, ldb, k0, k, r, c, last, add);                                \
            }                                                                                                          \
        }                                                                                                              \
    }

typedef double v8d __attribute__((vector_size(64)));
typedef double v4d __attribute__((vector_size(32)));
typedef double v2d __attribute__((vector_size(16)));
NN_KERNELS(f16, float, v16, 16)
NN_KERNELS(f8, float, v8, 8)
NN_KERNELS(f4, float, v4, 4)
NN_KERNELS(d8, double, v8d, 8)
NN_KERNELS(d4, double, v4d, 4)
NN_KERNELS(d2, double, v2d, 2)

/* ---- one copy per instruction set ------------------------------------------------------------------------------- */

typedef struct {
    float *Y;
    const float *X, *W;
    double *Yd; /* the products in double */
    const double *Xd, *Wd;
    size_t ldy, ldx, ldw, ai, ap, n, k, out, step;
    int add, shape; /* shape: nn_cols' */
} mm_job;

typedef void (*cols_fn)(const mm_job *j, size_t j0, size_t j1);

#define COPIES(suffix, attr, L, Rt, Ct, F, D, R, C)                                                                    \
    attr static void nt_##suffix(const mm_job *j, size_t j0, size_t j1)                                                \
    {                                                                                                                  \
        nt_cols_##L(j->Y, j->ldy, j->X, j->ldx, j->W, j->ldw, j->n, j->k, j0, j1, Rt, Ct);                             \
    }                                                                                                                  \
    attr static void nn_##suffix(const mm_job *j, size_t j0, size_t j1)                                                \
    {                                                                                                                  \
        nn_cols_##F(j->Y, j->ldy, j->X, j->ai, j->ap, j->W, j->ldw, j->n, j->k, j0, j1, j->add, j->shape, R, C);       \
    }                                                                                                                  \
    attr static void nnd_##suffix(const mm_job *j, size_t j0, size_t j1)                                               \
    {                                                                                                                  \
        nn_cols_##D(j->Yd, j->ldy, j->Xd, j->ai, j->ap, j->Wd, j->ldw, j->n, j->k, j0, j1, j->add, j->shape, R, C);    \
    }

COPIES(generic, , 4, 3, 2, f4, d2, 3, 3)
#if defined(__GNUC__) && defined(__x86_64__)
COPIES(avx2, __attribute__((target("avx2"))), 8, 3, 2, f8, d4, 3, 3)
COPIES(avx512, __attribute__((target("avx512f"))), 16, 4, 6, f16, d8, 4, 3)
#endif

typedef struct {
    const char *name;
    cols_fn nt, nn, nnd;
} kernels;

static const kernels table[] = {
    {"generic", nt_generic, nn_generic, nnd_generic},
#if defined(__GNUC__) && defined(__x86_64__)
    {"avx2", nt_avx2, nn_avx2, nnd_avx2},
    {"avx512", nt_avx512, nn_avx512, nnd_avx512},
#endif
};

/* The best copy the CPU runs, or a lower one that STZ_KERNELS names (every
 * copy gives the same bits; tests run them all); chosen once. */
static const kernels *chosen;

static const kernels *best_copy(void)
{
    const kernels *best = &table[0];
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        best = &table[2];
    else if (__builtin_cpu_supports("avx2"))
        best = &table[1];
#endif
    return best;
}

int stz_mm_use(const char *name)
{
    const kernels *best = best_copy();
    for (const kernels *k = table; name && k <= best; k++)
        if (!strcmp(name, k->name))
            return chosen = k, 0;
    return -1;
}

static const kernels *pick(void)
{
    if (!chosen && stz_mm_use(getenv("STZ_KERNELS")))
        chosen = best_copy();
    return chosen;
}

const char *stz_mm_kernels(void) { return pick()->name; }

/* ---- threads ---------------------------------------------------------------------------------------------------- */

typedef struct {
    const mm_job *j;
    cols_fn fn;
} mm_run;

static stz_status mm_work(void *ctx, int tid, size_t i, stz_err *err)
{
    (void)tid, (void)err;
    const mm_run *m = ctx;
    size_t j0 = i * m->j->step, j1 = j0 + m->j->step < m->j->out ? j0 + m->j->step : m->j->out;
    m->fn(m->j, j0, j1);
    return STZ_OK;
}

/* The columns in pieces of a multiple of 48 (every copy's tile width), a
 * piece of W about 128 KB (a cache's worth), enough pieces for the threads;
 * small products on one thread (starting threads costs more). */
static void mm_run_cols(mm_job *j, cols_fn fn, int threads)
{
    size_t step = ((size_t)128 << 10) / (j->k ? j->k * sizeof(float) : 1);
    if (threads > 1 && j->out / (size_t)threads < step)
        step = (j->out + (size_t)threads - 1) / (size_t)threads;
    step = (step + 47) / 48 * 48;
    j->step = step;
    size_t pieces = (j->out + step - 1) / step;
    mm_run m = {j, fn};
    stz_ordered p = {.n = pieces, .threads = threads, .ctx = &m, .work = mm_work, .no_interrupt = 1};
    if (threads < 2 || pieces < 2 || (double)j->n * (double)j->k * (double)j->out < 1e6 || stz_ordered_run(&p, NULL))
        for (size_t i = 0; i < pieces; i++) /* one thread (small products, or no thread could start) */
            mm_work(&m, 0, i, NULL);
}

void stz_mm_nt(float *Y, size_t ldy, const float *X, size_t ldx, const float *W, size_t ldw, size_t n, size_t k,
               size_t out, int threads)
{
    mm_job j = {.Y = Y, .X = X, .W = W, .ldy = ldy, .ldx = ldx, .ldw = ldw, .n = n, .k = k, .out = out};
    mm_run_cols(&j, pick()->nt, threads);
}

void stz_mm_nn(float *Y, size_t ldy, const float *A, size_t ai, size_t ap, const float *B, size_t ldb, size_t n,
               size_t k, size_t out, int add, int threads)
{
    mm_job j = {
        .Y = Y, .X = A, .W = B, .ldy = ldy, .ai = ai, .ap = ap, .ldw = ldb, .n = n, .k = k, .out = out, .add = add};
    mm_run_cols(&j, pick()->nn, threads);
}

void stz_transpose(float *T, const float *X, size_t rows, size_t cols)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            T[j * rows + i] = X[i * cols + j];
}

void stz_mm_gram(float *H, const float *X, size_t n, size_t c, int threads)
{
    mm_job j = {.Y = H,
                .X = X,
                .W = X,
                .ldy = c,
                .ai = 1,
                .ap = c,
                .ldw = c,
                .n = c,
                .k = n,
                .out = c,
                .add = 1,
                .shape = STZ_MM_UPPER};
    mm_run_cols(&j, pick()->nn, threads);
    for (size_t a = 0; a < c; a++) /* the products commute: a tile across the diagonal computed these bits too */
        for (size_t b = a + 1; b < c; b++)
            H[b * c + a] = H[a * c + b];
}

void stz_mm_nn_d(double *Y, size_t ldy, const double *A, size_t ai, size_t ap, const double *B, size_t ldb, size_t n,
                 size_t k, size_t out, int add, int shape, int threads)
{
    mm_job j = {.Yd = Y,
                .Xd = A,
                .Wd = B,
                .ldy = ldy,
                .ai = ai,
                .ap = ap,
                .ldw = ldb,
                .n = n,
                .k = k,
                .out = out,
                .add = add,
                .shape = shape};
    mm_run_cols(&j, pick()->nnd, threads);
}

/* ---- Cholesky factor and triangular inverse --------------------------------------------------------------------- */

#define NB 64 /* columns a panel: any width gives the same bits */

/* Columns [j0, j0 + jb) of L for rows j0.. (right-looking within the panel). */
static int chol_panel(double *A, size_t n, size_t j0, size_t jb)
{
    for (size_t j = j0; j < j0 + jb; j++) {
        if (!(A[j * n + j] > 0))
            return -1;
        double d = sqrt(A[j * n + j]);
        A[j * n + j] = d;
        for (size_t i = j + 1; i < n; i++)
            A[i * n + j] /= d;
        for (size_t i = j + 1; i < n; i++)
            for (size_t k = j + 1; k < j0 + jb && k <= i; k++)
                A[i * n + k] -= A[i * n + j] * A[k * n + j];
    }
    return 0;
}

int stz_cholesky(double *A, size_t n, int threads)
{
    double *P = malloc(NB * n * sizeof *P + 1);
    if (!P)
        return -2;
    int bad = 0;
    for (size_t j0 = 0; !bad && j0 < n; j0 += NB) {
        size_t jb = n - j0 < NB ? n - j0 : NB, t = j0 + jb, m = n - t;
        if (j0 && stz_interrupt_pending()) {
            bad = -3;
            break;
        }
        if ((bad = chol_panel(A, n, j0, jb)) || !m)
            break;
        for (size_t p = 0; p < jb; p++) /* P (jb, m) = -L[t:, j0:t]^T */
            for (size_t k = 0; k < m; k++)
                P[p * m + k] = -A[(t + k) * n + j0 + p];
        /* A[t:, t:] (m, m) += L[t:, j0:t] (m, jb) @ P (jb, m), the lower triangle */
        stz_mm_nn_d(A + t * n + t, n, A + t * n + j0, n, 1, P, m, m, jb, m, 1, STZ_MM_LOWER, threads);
    }
    free(P);
    return bad;
}

int stz_tri_inverse(const double *Lm, double *X, size_t n, int threads)
{
    memset(X, 0, n * n * sizeof *X);
    for (size_t i0 = 0; i0 < n; i0 += NB) {
        size_t ib = n - i0 < NB ? n - i0 : NB;
        if (i0 && stz_interrupt_pending())
            return -3;
        /* X[i0:, :i0] (ib, i0) = L[i0:, :i0] (ib, i0) @ X[:i0, :i0] (i0, i0): sums, signed and divided below */
        if (i0)
            stz_mm_nn_d(X + i0 * n, n, Lm + i0 * n, n, 1, X, n, ib, i0, i0, 0, STZ_MM_LOWER_B, threads);
        for (size_t i = i0; i < i0 + ib; i++) {
            double *x = X + i * n, d = Lm[i * n + i];
            for (size_t p = i0; p < i; p++) /* the block's rows above, final */
                for (size_t j = 0; j <= p; j++)
                    x[j] += Lm[i * n + p] * X[p * n + j];
            for (size_t j = 0; j < i; j++)
                x[j] = -x[j] / d;
            x[i] = 1 / d;
        }
    }
    return 0;
}
