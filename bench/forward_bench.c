/* Forward-pass speed: stz_fwd_compare of ORIGINAL against CANDIDATE over
 * NSEQ x LEN random tokens, against OpenBLAS sgemm on the model's own
 * matrix shapes (same rows) measured in the same run.
 * Usage: forward_bench ORIGINAL CANDIDATE THREADS [NSEQ LEN] */
#include "stz_forward.h"
#include "stz_safetensors.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int num_threads);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static stz_fwd *open_fwd(const char *path, stz_qmodel **q, int threads)
{
    stz_err err;
    stz_fwd_config c;
    stz_fwd *f = NULL;
    const char *cfg;
    if (stz_qmodel_open(q, path, &err) || !(cfg = stz_reader_meta_get(stz_qmodel_reader(*q), "config")) ||
        stz_fwd_config_parse(&c, cfg, path, &err) || stz_fwd_open(&f, q, 1, &c, path, threads, &err)) {
        fprintf(stderr, "forward_bench: %s: %s\n", path, err.msg);
        exit(1);
    }
    return f;
}

/* GFLOP/s of sgemm C (m, n) = A (m, k) @ B (n, k)^T, best of 3. */
static double sgemm_rate(size_t m, size_t n, size_t k, double *secs)
{
    float *A = malloc(m * k * sizeof *A), *B = malloc(n * k * sizeof *B), *C = malloc(m * n * sizeof *C);
    for (size_t i = 0; i < m * k; i++)
        A[i] = (float)(i % 7) * 0.01f;
    for (size_t i = 0; i < n * k; i++)
        B[i] = (float)(i % 5) * 0.01f;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1, A, (int)k, B, (int)k, 0, C,
                    (int)n);
        t = now() - t;
        best = t < best ? t : best;
    }
    free(A), free(B), free(C);
    *secs = best;
    return 2.0 * (double)m * (double)n * (double)k / best / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: forward_bench ORIGINAL CANDIDATE THREADS [NSEQ LEN]\n");
        return 2;
    }
    int threads = atoi(argv[3]);
    size_t nseq = argc > 5 ? (size_t)atoi(argv[4]) : 4, len = argc > 5 ? (size_t)atoi(argv[5]) : 128;
    stz_qmodel *qa, *qb;
    stz_fwd *a = open_fwd(argv[1], &qa, threads), *b = open_fwd(argv[2], &qb, threads);
    const stz_fwd_config *c = stz_fwd_cfg(a);
    int32_t *tok = malloc(nseq * len * sizeof *tok);
    size_t *lens = malloc(nseq * sizeof *lens);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < nseq * len; i++)
        x ^= x << 13, x ^= x >> 7, x ^= x << 17, tok[i] = (int32_t)(x % c->vocab);
    for (size_t s = 0; s < nseq; s++)
        lens[s] = len;
    stz_err err;
    stz_fwd_report r;
    double t = now();
    if (stz_fwd_compare(a, b, tok, nseq, len, lens, NULL, NULL, &r, &err)) {
        fprintf(stderr, "forward_bench: %s\n", err.msg);
        return 1;
    }
    t = now() - t;

    /* The matrix products of one pass: every layer over all n rows, the head
     * over the scored rows. */
    size_t n = nseq * len, ns = nseq * (len - 1), D = c->dim, F = c->hidden, QD = (size_t)c->n_heads * c->head_dim,
           KD = (size_t)c->n_kv_heads * c->head_dim, ffn_in = c->arch == STZ_ARCH_GPT_NEO ? 1 : 2; /* ungated: up */
    struct {
        size_t m, n, k, times;
    } shapes[] = {{n, QD, D, c->n_layers},         {n, KD, D, 2 * c->n_layers}, {n, D, QD, c->n_layers},
                  {n, F, D, ffn_in * c->n_layers}, {n, D, F, c->n_layers},      {ns, c->vocab, D, 1}};
    double flops = 0, sgemm_secs = 0;
    openblas_set_num_threads(threads);
    printf("| shape (rows x out x in) | sgemm GFLOP/s |\n|---|---|\n");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        double secs,
            f = 2.0 * (double)shapes[i].m * (double)shapes[i].n * (double)shapes[i].k * (double)shapes[i].times;
        double rate = sgemm_rate(shapes[i].m, shapes[i].n, shapes[i].k, &secs);
        printf("| %zu x %zu x %zu | %.1f |\n", shapes[i].m, shapes[i].n, shapes[i].k, rate);
        flops += f, sgemm_secs += secs * (double)shapes[i].times;
    }
    /* attention (under 1% here) is not counted: it only lowers our rate */
    flops *= 2, sgemm_secs *= 2; /* both models */
    double sgemm = flops / sgemm_secs / 1e9, got = flops / t / 1e9;
    printf("\n%zu sequences x %zu tokens, both models, %d threads: %.2f s, %.0f tokens/s (%.0f per model)\n", nseq, len,
           threads, t, 2.0 * (double)n / t, (double)n / t);
    printf("forward pass %.1f GFLOP/s, sgemm on the same shapes %.1f GFLOP/s: %.0f%% (target 50%%) %s\n", got, sgemm,
           100 * got / sgemm, got >= 0.5 * sgemm ? "PASS" : "FAIL");
    printf("(mean KL %.4g, top-1 %.4f)\n", r.kl_mean, r.top1);
    stz_fwd_free(a), stz_fwd_free(b);
    stz_qmodel_free(qa), stz_qmodel_free(qb);
    free(tok), free(lens);
    return 0;
}
