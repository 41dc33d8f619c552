/* Exact vs randomized SVD at a given rank on matrices of a model file:
 * wall time (best of 3) and relative Frobenius error of each, as Markdown.
 * Usage: svd_bench MODEL.safetensors RANK THREADS POWER_ITERS TENSOR... */
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "stz_svd.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: svd_bench MODEL RANK THREADS POWER_ITERS TENSOR...\n");
        return 2;
    }
    stz_reader *r;
    stz_err err;
    if (stz_reader_open(&r, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t rank = (size_t)atol(argv[2]);
    int threads = atoi(argv[3]), q = atoi(argv[4]);
    int fails = 0;
    printf(
        "| matrix | shape | exact s | exact rel. error | randomized s | randomized rel. error | speed-up | "
        "error ratio |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int a = 5; a < argc; a++) {
        long ti = stz_reader_find(r, argv[a]);
        if (ti < 0) {
            fprintf(stderr, "no tensor %s\n", argv[a]);
            return 1;
        }
        const stz_tensor *t = stz_reader_tensor(r, (size_t)ti);
        size_t m = t->shape[0], n = t->shape[1], esz = stz_dtype_bits(t->dtype) / 8;
        unsigned char *raw = malloc(m * n * esz);
        float *W = malloc(m * n * sizeof *W);
        if (stz_reader_read(r, t, 0, raw, m * n * esz, &err) || stz_to_f32(t->dtype, raw, m * n, W, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double best[2] = {1e9, 1e9}, e[2] = {0, 0};
        for (int meth = 0; meth < 2; meth++)
            for (int run = 0; run < 3; run++) {
                stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
                p.rank = rank, p.method = (stz_svd_method)meth, p.threads = threads, p.power_iters = q;
                stz_svd_result res;
                double t0 = now();
                if (stz_svd_factor(W, m, n, &p, &res, &err)) {
                    fprintf(stderr, "%s\n", err.msg);
                    return 1;
                }
                double dt = now() - t0;
                best[meth] = dt < best[meth] ? dt : best[meth];
                e[meth] = res.rel_error;
                stz_svd_result_free(&res);
            }
        printf("| %s | %zu x %zu | %.3f | %.5f | %.3f | %.5f | %.1fx | %.4f |\n", argv[a], m, n, best[0], e[0], best[1],
               e[1], best[0] / best[1], e[1] / e[0]);
        fails += best[0] / best[1] < 5 || e[1] / e[0] > 1.05;
        free(raw), free(W);
    }
    printf("\nTarget: randomized at least 5x faster at no more than 1.05x the error of exact: %s\n",
           fails ? "FAIL" : "PASS");
    stz_reader_free(r);
    return 0;
}
