/* Error and speed of every quantization method on a set of tensors: mean
 * relative Frobenius error ||W - Q|| / ||W|| over the tensors, bits per
 * weight (codes, scales, minimums; the per-tensor U8 base and fitted
 * codebook apart, as bits per tensor), and MB/s of
 * F32 input on one thread (codebook fit included).
 * Usage: quant_methods MODEL [--cols-multiple K] [--layers A,B] [CONFIG...]
 * CONFIG is bits:method:block:scale_dtype, e.g. 4:nl:32:U8; default: a set. */
#include "stz_model.h"
#include "stz_kernels.h"
#include "stz_quant.h"
#include "quant/quant_tensor.h"
#include "stz_safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const defaults[] = {"4:absmax:128:F16", "4:absmax:32:F16", "4:full:32:F16",   "4:mse:32:F16",
                                       "4:mse:32:U8",      "4:nl:32:F16",     "4:nl:32:U8",      "4:nl-fit:32:U8",
                                       "4:nl:16:U8",       "4:nl-fit:16:U8",  "4:asym:32:F16",   "2:nl:32:U8",
                                       "3:nl:32:U8",       "3:mse:32:U8",     "5:mse:32:U8",     "5:nl:32:U8",
                                       "6:mse:32:U8",      "6:nl:32:U8",      "8:absmax:32:F16", "8:mse:32:U8"};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: quant_methods MODEL [--cols-multiple K] [--layers A,B] [CONFIG...]\n");
        return 2;
    }
    int a = 2, mult = 1;
    const char *layers = NULL;
    for (; a < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--cols-multiple"))
            mult = atoi(argv[a + 1]);
        else
            layers = argv[a + 1];
    }
    const char *const *cfg = a < argc ? (const char *const *)argv + a : defaults;
    int ncfg = a < argc ? argc - a : (int)(sizeof defaults / sizeof *defaults);
    stz_qmodel *m;
    stz_err err;
    if (stz_qmodel_open(&m, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* the tensors: matrices (cols a multiple of `mult`), of the listed layers */
    size_t nt = 0, *ids = malloc(stz_qmodel_count(m) * sizeof *ids);
    for (size_t i = 0; i < stz_qmodel_count(m); i++) {
        const stz_qtensor *t = stz_qmodel_tensor(m, i);
        if (t->ndim != 2 || t->cols % (uint64_t)mult)
            continue;
        if (layers) { /* "layers.1." is not inside "layers.12." */
            char a1[32], a2[32];
            int l1 = -1, l2 = -1;
            sscanf(layers, "%d,%d", &l1, &l2);
            snprintf(a1, sizeof a1, "layers.%d.", l1), snprintf(a2, sizeof a2, "layers.%d.", l2);
            if (!strstr(t->name, a1) && !strstr(t->name, a2))
                continue;
        }
        ids[nt++] = i;
    }
    printf(
        "%zu tensors\n\n| bits:method:block:scales | bits/weight | + per tensor | mean rel. error | MB/s "
        "(F32, 1 thread) |\n"
        "|---|---|---|---|---|\n",
        nt);
    for (int c = 0; c < ncfg; c++) {
        stz_qformat f;
        char meth[16], sdt[8];
        memset(&f, 0, sizeof f);
        if (sscanf(cfg[c], "%d:%15[^:]:%u:%7s", &f.bits, meth, &f.block, sdt) != 4) {
            fprintf(stderr, "bad config '%s'\n", cfg[c]);
            return 2;
        }
        int mi = -1;
        for (int k = 0; k < STZ_QMETHOD_COUNT; k++)
            mi = !strcmp(meth, stz_qmethod_name((stz_qmethod)k)) ? k : mi;
        if (mi < 0) {
            fprintf(stderr, "unknown method '%s'\n", meth);
            return 2;
        }
        int fit = mi == STZ_QMETHOD_NL_FIT;
        f.method = fit ? STZ_QMETHOD_NL : (stz_qmethod)mi;
        f.scale_dtype = !strcmp(sdt, "U8") ? STZ_DTYPE_U8 : !strcmp(sdt, "F32") ? STZ_DTYPE_F32 : STZ_DTYPE_F16;
        double sum_err = 0, bits = 0, extra = 0, weights = 0, secs = 0;
        for (size_t k = 0; k < nt; k++) {
            const stz_qtensor *t = stz_qmodel_tensor(m, ids[k]);
            size_t rows = (size_t)t->rows, cols = (size_t)t->cols, nb = (cols + f.block - 1) / f.block;
            float *w = malloc(rows * cols * sizeof *w), *y = malloc(cols * sizeof *y),
                  *sc = malloc(rows * nb * sizeof *sc), *mn = malloc(rows * nb * sizeof *mn);
            uint8_t *q = malloc(rows * stz_qf_row_bytes(f.bits, cols));
            stz_qmodel_read_rows(m, ids[k], 0, rows, w, &err);
            double t0 = now();
            float amax = 0;
            for (size_t i = 0; i < rows * cols; i++)
                amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
            f.scale_base = amax;
            if (fit) /* as stz quantize does: up to 256 rows spread over the tensor */
                stz_qf_fit_tensor(&f, w, rows, cols, &err);
            else if (f.method == STZ_QMETHOD_NL)
                stz_qf_default_levels(f.bits, f.levels), stz_qf_prepare(&f);
            size_t rb = stz_qf_row_bytes(f.bits, cols);
            for (size_t r = 0; r < rows; r++)
                if (stz_qf_quantize_row(&f, w + r * cols, cols, q + r * rb, sc + r * nb, mn + r * nb))
                    fprintf(stderr, "%s: scale overflow\n", t->name);
            secs += now() - t0;
            double e = 0, n2 = 0;
            for (size_t r = 0; r < rows; r++) {
                stz_qf_dequantize_row(&f, q + r * rb, sc + r * nb, mn + r * nb, cols, y);
                for (size_t i = 0; i < cols; i++) {
                    double d = (double)w[r * cols + i] - y[i];
                    e += d * d, n2 += (double)w[r * cols + i] * w[r * cols + i];
                }
            }
            sum_err += sqrt(e / n2);
            int sbits = f.scale_dtype == STZ_DTYPE_U8 ? 8 : f.scale_dtype == STZ_DTYPE_F16 ? 16 : 32;
            bits += 8.0 * rows * rb + (double)rows * nb * sbits * (f.method == STZ_QMETHOD_ASYM ? 2 : 1);
            extra += (fit ? 16 << f.bits : 0) + (f.scale_dtype == STZ_DTYPE_U8 ? 32 : 0); /* levels, base */
            weights += (double)rows * cols;
            free(w), free(y), free(sc), free(mn), free(q);
        }
        printf("| %s | %.3f | %.0f bits | %.4f | %.0f |\n", cfg[c], bits / weights, extra / (double)nt,
               sum_err / (double)nt, weights * 4 / secs / 1e6);
        fflush(stdout);
    }
    stz_qmodel_free(m);
    free(ids);
    return 0;
}
