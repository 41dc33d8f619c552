/* Rank-reduced SVD: exact (sgesdd) and randomized (Halko et al. 2011). */
#include "stz_svd.h"
#include "svd_internal.h"

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

stz_status stz_svd_reconstruct(const float *U, const float *S, const float *Vh, size_t m, size_t n, size_t r,
                               float *W)
{
    /* US (m, r) = U scaled column-wise by S; W (m, n) = US (m, r) @ Vh (r, n) */
    float *US = malloc(m * r * sizeof *US + 1);
    if (!US)
        return STZ_E_NOMEM;
    for (size_t i = 0; i < m; i++)
        for (size_t k = 0; k < r; k++)
            US[i * r + k] = U[i * r + k] * S[k];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)r, 1.0f, US, (int)r, Vh, (int)n, 0.0f,
                W, (int)n);
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

static float gauss(uint64_t *s)
{
    double u1 = ((double)(rng_next(s) >> 11) + 1.0) / 9007199254740993.0, u2 = (double)(rng_next(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Orthonormalises the columns of a column-major rows x cols matrix A
 * (rows >= cols), in place. Column-major: LAPACK's own order, no copies. */
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

/* Thin SVD of the row-major m x n matrix A (destroyed): U m x k, S k,
 * Vh k x n, row-major, k = min(m, n). A row-major A is the column-major
 * A^T = Vh^T S U^T, so LAPACK's column-major U and Vt of A^T are exactly
 * our row-major Vh and U: no transposition. */
static stz_status thin_svd(float *A, size_t m, size_t n, float *U, float *S, float *Vh, stz_err *err)
{
    size_t k = m < n ? m : n;
    lapack_int info = LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'S', (lapack_int)n, (lapack_int)m, A, (lapack_int)n, S, Vh,
                                     (lapack_int)n, U, (lapack_int)k);
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

/* Randomized range finder + small SVD at rank `l` (rank + oversampling).
 * Y (m, l) and Z (n, l) are kept column-major, i.e. as the row-major
 * buffers Yt (l, m) and Zt (l, n), so that QR needs no transposition. */
static stz_status randomized(const float *W, size_t m, size_t n, size_t l, const stz_svd_params *p, float **Uo,
                             float **So, float **Vho, stz_err *err)
{
    stz_status st = STZ_OK;
    float *Omt = malloc(l * n * sizeof *Omt), *Yt = malloc(l * m * sizeof *Yt), *Zt = malloc(l * n * sizeof *Zt);
    float *tau = malloc(l * sizeof *tau), *B = malloc(l * n * sizeof *B), *Ub = malloc(l * l * sizeof *Ub);
    float *S = malloc(l * sizeof *S), *Vh = malloc(l * n * sizeof *Vh), *U = malloc(m * l * sizeof *U);
    if (!Omt || !Yt || !Zt || !tau || !B || !Ub || !S || !Vh || !U) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a randomized SVD of %zu x %zu", m, n);
        goto done;
    }
    uint64_t seed = p->seed;
    for (size_t i = 0; i < n * l; i++)
        Omt[i] = gauss(&seed);
    /* Y (m, l) = W (m, n) @ Om (n, l), i.e. Yt (l, m) = Omt (l, n) @ W^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)l, (int)m, (int)n, 1, Omt, (int)n, W, (int)n, 0, Yt, (int)m);
    if ((st = orthonormalize(Yt, m, l, tau, err)))
        goto done;
    for (int it = 0; it < p->power_iters; it++) {
        /* Z (n, l) = W^T @ Y: Zt (l, n) = Yt (l, m) @ W (m, n); then Y = W @ Z: Yt = Zt @ W^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)l, (int)n, (int)m, 1, Yt, (int)m, W, (int)n, 0, Zt, (int)n);
        if ((st = orthonormalize(Zt, n, l, tau, err)))
            goto done;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)l, (int)m, (int)n, 1, Zt, (int)n, W, (int)n, 0, Yt, (int)m);
        if ((st = orthonormalize(Yt, m, l, tau, err)))
            goto done;
    }
    /* B (l, n) = Q^T (l, m) @ W (m, n) = Yt @ W; B = Ub S Vh; U (m, l) = Q @ Ub = Yt^T @ Ub */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)l, (int)n, (int)m, 1, Yt, (int)m, W, (int)n, 0, B, (int)n);
    if ((st = thin_svd(B, l, n, Ub, S, Vh, err)))
        goto done;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)l, (int)l, 1, Yt, (int)m, Ub, (int)l, 0, U, (int)l);
    *Uo = U, *So = S, *Vho = Vh;
    U = S = Vh = NULL;
done:
    free(Omt), free(Yt), free(Zt), free(tau), free(B), free(Ub), free(S), free(Vh), free(U);
    return st;
}

stz_status stz_svd_factor(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                          stz_err *err)
{
    memset(res, 0, sizeof *res);
    for (size_t i = 0; i < m * n; i++) /* LAPACK catches NaN but not Inf */
        if (!isfinite(W[i]))
            return stz_err_set(err, STZ_E_NUMERIC, "element %zu of the %zu x %zu matrix is %s", i, m, n,
                               isnan(W[i]) ? "NaN" : "infinite");
    return stz_svd_factor_unchecked(W, m, n, p, res, err);
}

stz_status stz_svd_factor_unchecked(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                                    stz_err *err)
{
    memset(res, 0, sizeof *res);
    size_t k = m < n ? m : n;
    int given = (p->rank > 0) + (p->energy > 0) + (p->max_error > 0); /* 0 means unset: rank 0 is refused */
    if (m == 0 || n == 0)
        return stz_err_set(err, STZ_E_ARG, "SVD of an empty %zu x %zu matrix", m, n);
    if (given != 1)
        return stz_err_set(err, STZ_E_ARG, "give exactly one of rank (> 0), energy, max_error (> 0)");
    if (p->rank >= k && p->rank)
        return stz_err_set(err, STZ_E_ARG, "rank %zu is not below min(m, n) = %zu of a %zu x %zu matrix: "
                           "a full-rank factorisation saves nothing", p->rank, k, m, n);
    if (p->energy < 0 || p->energy > 1 || p->max_error < 0 || p->max_error >= 1)
        return stz_err_set(err, STZ_E_ARG, "energy must be in (0, 1] and max_error in [0, 1)");
    openblas_set_num_threads(p->threads < 1 ? 1 : p->threads);
    double total = 0;
    for (size_t i = 0; i < m * n; i++)
        total += (double)W[i] * W[i];
    float *U = NULL, *S = NULL, *Vh = NULL;
    size_t have = k; /* singular triplets computed */
    stz_status st = STZ_OK;
    if (p->method == STZ_SVD_EXACT) {
        float *A = malloc(m * n * sizeof *A);
        U = malloc(m * k * sizeof *U), S = malloc(k * sizeof *S), Vh = malloc(k * n * sizeof *Vh);
        if (!A || !U || !S || !Vh) {
            free(A);
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for an SVD of %zu x %zu", m, n);
            goto done;
        }
        memcpy(A, W, m * n * sizeof *A);
        st = thin_svd(A, m, n, U, S, Vh, err);
        free(A);
        if (st)
            goto done;
    } else {
        /* a given rank: one pass; energy / max_error: double l until met */
        size_t l = p->rank ? p->rank + p->oversample : 64;
        for (;;) {
            if (l > k)
                l = k;
            free(U), free(S), free(Vh);
            U = S = Vh = NULL;
            if ((st = randomized(W, m, n, l, p, &U, &S, &Vh, err)))
                goto done;
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
done:
    free(U), free(S), free(Vh);
    return st;
}
