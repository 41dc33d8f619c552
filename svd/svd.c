/* Rank-reduced SVD: exact (sgesdd) and randomized (Halko et al. 2011). */
#include "stz_svd.h"
#include "svd_internal.h"
#include "core/stz_core.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void stz_svd_result_free(stz_svd_result *r)
{
    free(r->U);
    free(r->S);
    free(r->Vh);
    memset(r, 0, sizeof *r);
}

stz_status stz_svd_reconstruct(const float *U, const float *S, const float *Vh, size_t m, size_t n, size_t r, float *W)
{
    /* US (m, r) = U scaled column-wise by S; W (m, n) = US (m, r) @ Vh (r, n) */
    float *US = malloc(m * r * sizeof *US + 1);
    if (!US)
        return STZ_E_NOMEM;
    for (size_t i = 0; i < m; i++)
        for (size_t k = 0; k < r; k++)
            US[i * r + k] = U[i * r + k] * S[k];
    stz_mm_nn(W, n, US, r, 1, Vh, n, m, r, n, 0, 1); /* the same bits everywhere: reading a file back is exact */
    free(US);
    return STZ_OK;
}

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills x[0..count) with standard normal values: Box-Muller, both outputs. */
static void gauss_fill(float *x, size_t count, uint64_t seed)
{
    for (size_t i = 0; i < count; i += 2) {
        double u1 = ((double)(rng_next(&seed) >> 11) + 1.0) / 9007199254740993.0;
        double u2 = (double)(rng_next(&seed) >> 11) / 9007199254740992.0;
        double rad = sqrt(-2 * log(u1)), ang = 6.283185307179586 * u2;
        x[i] = (float)(rad * cos(ang));
        if (i + 1 < count)
            x[i + 1] = (float)(rad * sin(ang));
    }
}

/* dst (cols x rows) = src (rows x cols)^T, row-major, in cache-sized tiles */
static void transpose(const float *src, size_t rows, size_t cols, float *dst)
{
    for (size_t i0 = 0; i0 < rows; i0 += 32)
        for (size_t j0 = 0; j0 < cols; j0 += 32)
            for (size_t i = i0; i < rows && i < i0 + 32; i++)
                for (size_t j = j0; j < cols && j < j0 + 32; j++)
                    dst[j * rows + i] = src[i * cols + j];
}

/* Orthonormalises the columns of a column-major rows x cols matrix A
 * (rows >= cols), in place: Householder QR. */
static stz_status orthonormalize(float *A, size_t rows, size_t cols, float *tau, stz_err *err)
{
    lapack_int info = LAPACKE_sgeqrf(LAPACK_COL_MAJOR, (lapack_int)rows, (lapack_int)cols, A, (lapack_int)rows, tau);
    if (info)
        return stz_err_set(err, STZ_E_LAPACK, "LAPACK sgeqrf failed (info %d)", (int)info);
    info = LAPACKE_sorgqr(LAPACK_COL_MAJOR, (lapack_int)rows, (lapack_int)cols, (lapack_int)cols, A, (lapack_int)rows,
                          tau);
    if (info)
        return stz_err_set(err, STZ_E_LAPACK, "LAPACK sorgqr failed (info %d)", (int)info);
    return STZ_OK;
}

/* Replaces the column-major rows x cols matrix A (rows >= cols) by a
 * well-conditioned basis of its column space: P^T L from A = P^T L U (LU
 * with partial pivoting, |L| <= 1). A third of a QR's work, and all the
 * power iterations need (Halko et al. 2011, section 4.5; as in fbpca and
 * scikit-learn); the last basis is made orthonormal by QR. */
static stz_status lu_basis(float *A, size_t rows, size_t cols, lapack_int *ipiv, stz_err *err)
{
    lapack_int info = LAPACKE_sgetrf(LAPACK_COL_MAJOR, (lapack_int)rows, (lapack_int)cols, A, (lapack_int)rows, ipiv);
    if (info < 0) /* > 0 is an exactly zero pivot in U: L is still a basis */
        return stz_err_set(err, STZ_E_LAPACK, "LAPACK sgetrf failed (info %d)", (int)info);
    for (size_t j = 0; j < cols; j++) {
        memset(A + j * rows, 0, j * sizeof *A);
        A[j * rows + j] = 1;
    }
    LAPACKE_slaswp(LAPACK_COL_MAJOR, (lapack_int)cols, A, (lapack_int)rows, 1, (lapack_int)cols, ipiv, -1);
    return STZ_OK;
}

/* Thin SVD of the row-major m x n matrix A (destroyed): U m x k, S k,
 * Vh k x n, row-major, k = min(m, n). LAPACK is column-major and fastest
 * on tall input (a QR first: 0.30 s against 0.57 s for the LQ path on
 * 4864 x 896). With m <= n our row-major A is the tall column-major
 * A^T = Vh^T S U^T, whose U and Vt are exactly our Vh and U. With m > n,
 * A is transposed into the tall column-major A and the factors back. */
static stz_status thin_svd(float *A, size_t m, size_t n, float *U, float *S, float *Vh, stz_err *err)
{
    lapack_int info;
    if (m <= n) {
        info = LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'S', (lapack_int)n, (lapack_int)m, A, (lapack_int)n, S, Vh,
                              (lapack_int)n, U, (lapack_int)m);
    } else {
        float *T = malloc(m * n * sizeof *T);
        if (!T)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for an SVD of %zu x %zu", m, n);
        transpose(A, m, n, T);
        /* column-major: T (m x n) = Uc (m x n, into A) diag(S) Vt (n x n, into T's head) */
        info = LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'S', (lapack_int)m, (lapack_int)n, T, (lapack_int)m, S, A,
                              (lapack_int)m, Vh, (lapack_int)n);
        if (!info) {
            transpose(A, n, m, U);
            memcpy(T, Vh, n * n * sizeof *T);
            transpose(T, n, n, Vh);
        }
        free(T);
    }
    if (info)
        return stz_err_set(err, STZ_E_LAPACK, "LAPACK sgesdd failed (info %d%s)", (int)info,
                           info > 0 ? ": did not converge" : ": invalid argument");
    return STZ_OK;
}

/* Chooses the rank from the spectrum S[0..k) and ||W||_F^2. */
static size_t choose_rank(const stz_svd_params *p, const float *S, size_t k, double total)
{
    if (p->rank)
        return p->rank;
    double kept = 0;
    for (size_t r = 1; r <= k; r++) {
        kept += (double)S[r - 1] * S[r - 1];
        if (p->energy > 0 && kept >= p->energy * total * (1 - 1e-12))
            return r;
        if (p->energy == 0 && sqrt(fmax(total - kept, 0) / total) <= p->max_error)
            return r;
    }
    return k;
}

/* Row-major C = X @ A (X: l x M) or, with `at`, C = X @ A^T (X: l x N),
 * where A (M x N) is W (m x n) or, with t, W^T: a gemm on W itself. */
static void times_a(const float *W, size_t n, int t, int at, size_t l, size_t M, size_t N, const float *X, float *C)
{
    size_t inner = at ? N : M, cols = at ? M : N;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, at ^ t ? CblasTrans : CblasNoTrans, (int)l, (int)cols, (int)inner, 1, X,
                (int)inner, W, (int)n, 0, C, (int)cols);
}

/* Randomized SVD at rank `l` (rank + oversampling) of A, the tall one of W
 * and W^T (M x N, M >= N): no copy of W, every product with A is a gemm on
 * W with the matching transpose flag, and the Gaussian test matrix and the
 * small SVD are on the short side (the same work for W and W^T). Y (M, l)
 * and Z (N, l) are column-major, i.e. the row-major buffers Yt (l, M) and
 * Zt (l, N), as LAPACK wants. */
static stz_status randomized(const float *W, size_t m, size_t n, size_t l, const stz_svd_params *p, float **Uo,
                             float **So, float **Vho, stz_err *err)
{
    int t = m < n; /* A = W^T */
    size_t M = t ? n : m, N = t ? m : n;
    stz_status st = STZ_OK;
    float *Yt = malloc(l * M * sizeof *Yt), *Zt = malloc(l * N * sizeof *Zt), *tau = malloc(l * sizeof *tau);
    float *B = malloc(l * N * sizeof *B), *Ub = malloc(l * l * sizeof *Ub), *S = malloc(l * sizeof *S);
    float *U = malloc(m * l * sizeof *U), *Vh = malloc(l * n * sizeof *Vh);
    float *Vb = t ? malloc(l * N * sizeof *Vb) : Vh; /* without t, Vb is Vh */
    lapack_int *ipiv = malloc(l * sizeof *ipiv);
    if (!Yt || !Zt || !tau || !B || !Ub || !S || !Vb || !U || !Vh || !ipiv) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a randomized SVD of %zu x %zu", m, n);
        goto cleanup;
    }
    gauss_fill(Zt, l * N, p->seed);
    /* Y = A Om: Yt (l, M) = Omt (l, N) @ A^T; each power step Z = A^T Y,
     * Y = A Z: Zt (l, N) = Yt (l, M) @ A and Yt = Zt @ A^T */
    times_a(W, n, t, 1, l, M, N, Zt, Yt);
    for (int it = 0; it < p->power_iters; it++) {
        if ((st = lu_basis(Yt, M, l, ipiv, err)))
            goto cleanup;
        times_a(W, n, t, 0, l, M, N, Yt, Zt);
        if ((st = lu_basis(Zt, N, l, ipiv, err)))
            goto cleanup;
        times_a(W, n, t, 1, l, M, N, Zt, Yt);
    }
    if ((st = orthonormalize(Yt, M, l, tau, err)))
        goto cleanup;
    /* B (l, N) = Q^T A = Yt @ A; B = Ub S Vb; A ~= (Q Ub) S Vb */
    times_a(W, n, t, 0, l, M, N, Yt, B);
    if ((st = thin_svd(B, l, N, Ub, S, Vb, err)))
        goto cleanup;
    if (!t) { /* U (m, l) = Q Ub = Yt^T @ Ub; Vh = Vb already */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)l, (int)l, 1, Yt, (int)M, Ub, (int)l, 0, U,
                    (int)l);
    } else { /* W = A^T = Vb^T S (Q Ub)^T: U = Vb^T, Vh (l, n) = Ub^T @ Yt */
        transpose(Vb, l, m, U);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)l, (int)n, (int)l, 1, Ub, (int)l, Yt, (int)M, 0, Vh,
                    (int)n);
    }
    *Uo = U, *So = S, *Vho = Vh;
    U = S = Vh = NULL;
cleanup:
    if (t)
        free(Vb);
    free(Yt), free(Zt), free(tau), free(B), free(Ub), free(S), free(U), free(Vh), free(ipiv);
    return st;
}

/* sum of squares in double; 8 chains so that the adds overlap */
static double sum_squares(const float *x, size_t count)
{
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += (double)x[i + j] * x[i + j];
    for (; i < count; i++)
        acc[0] += (double)x[i] * x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static stz_status factor(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                         int check_finite, stz_err *err)
{
    memset(res, 0, sizeof *res);
    size_t k = m < n ? m : n;
    int given = (p->rank > 0) + (p->energy > 0) + (p->max_error > 0); /* 0 means unset: rank 0 is refused */
    if (m == 0 || n == 0)
        return stz_err_set(err, STZ_E_ARG, "SVD of an empty %zu x %zu matrix", m, n);
    if (given != 1)
        return stz_err_set(err, STZ_E_ARG, "give exactly one of rank (> 0), energy, max_error (> 0)");
    if (p->rank >= k && p->rank)
        return stz_err_set(err, STZ_E_ARG,
                           "rank %zu is not below min(m, n) = %zu of a %zu x %zu matrix: "
                           "a full-rank factorisation saves nothing",
                           p->rank, k, m, n);
    if (p->energy < 0 || p->energy > 1 || p->max_error < 0 || p->max_error >= 1)
        return stz_err_set(err, STZ_E_ARG, "energy must be in (0, 1] and max_error in [0, 1)");
    /* squares of finite floats cannot overflow a double: a non-finite sum
     * means a NaN or Inf in W, which LAPACK would not all catch */
    double total = sum_squares(W, m * n);
    for (size_t i = 0; check_finite && !isfinite(total) && i < m * n; i++)
        if (!isfinite(W[i]))
            return stz_err_set(err, STZ_E_NUMERIC, "element %zu of the %zu x %zu matrix is %s", i, m, n,
                               isnan(W[i]) ? "NaN" : "infinite");
    stz_blas_threads(p->threads);
    float *U = NULL, *S = NULL, *Vh = NULL;
    size_t have = k; /* singular triplets computed */
    stz_status st = STZ_OK;
    if (p->method == STZ_SVD_EXACT) {
        float *A = malloc(m * n * sizeof *A);
        U = malloc(m * k * sizeof *U), S = malloc(k * sizeof *S), Vh = malloc(k * n * sizeof *Vh);
        if (!A || !U || !S || !Vh) {
            free(A);
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for an SVD of %zu x %zu", m, n);
            goto cleanup;
        }
        memcpy(A, W, m * n * sizeof *A);
        st = thin_svd(A, m, n, U, S, Vh, err);
        free(A);
        if (st)
            goto cleanup;
    } else {
        /* a given rank: one pass; energy / max_error: double l until met */
        size_t l = p->rank ? p->rank + p->oversample : 64;
        for (;;) {
            if (l > k)
                l = k;
            free(U), free(S), free(Vh);
            U = S = Vh = NULL;
            if ((st = randomized(W, m, n, l, p, &U, &S, &Vh, err)))
                goto cleanup;
            have = l;
            size_t r = choose_rank(p, S, l, total);
            if (p->rank || r < l || l == k)
                break;
            l *= 2;
        }
    }
    size_t r = choose_rank(p, S, have, total);
    if (r > have)
        r = have;
    /* keep the first r triplets: U (m, have) -> (m, r), Vh rows are contiguous */
    for (size_t i = 0; i < m; i++)
        memmove(U + i * r, U + i * have, r * sizeof *U);
    /* with the whole spectrum, sum what is dropped (no cancellation) */
    double kept = 0, dropped = 0;
    for (size_t i = 0; i < have; i++)
        *(i < r ? &kept : &dropped) += (double)S[i] * S[i];
    if (have < k)
        dropped = fmax(total - kept, 0);
    res->m = m, res->n = n, res->rank = r;
    float *shrunk = realloc(U, m * r * sizeof *U + 1);
    res->U = shrunk ? shrunk : U;
    res->S = S;
    res->Vh = Vh;
    res->rel_error = total > 0 ? sqrt(dropped / total) : 0;
    return STZ_OK;
cleanup:
    free(U), free(S), free(Vh);
    return st;
}

stz_status stz_svd_factor(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                          stz_err *err)
{
    return factor(W, m, n, p, res, 1, err);
}

stz_status stz_svd_factor_unchecked(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                                    stz_err *err)
{
    return factor(W, m, n, p, res, 0, err);
}
