/* stz's quantizers for llama.cpp's types against ggml's own (the
 * quantize_* functions llama-quantize calls), side by side on the same
 * tensors with the same importance weights, on one thread:
 *   - importance-weighted squared error sum w[j] (x - y)^2 over the tensors,
 *     stz / ggml (below 1: stz's blocks are better);
 *   - speed, stz's time / ggml's;
 *   - exactness: ggml's to_float of stz's blocks equals stz's dequantizer,
 *     bit for bit (what llama.cpp computes from a file stz wrote).
 * Importance: per column, exp(1.5 z), z normal (seeded by the tensor): the
 * spread of a real importance matrix; the same array for both, as
 * llama-quantize --imatrix passes it. With --no-imatrix both quantize
 * unweighted (ggml's reference quantizers, stz's plain squared error).
 * With --read, types stz reads but does not write (tq1_0, tq2_0, mxfp4,
 * nvfp4): ggml's to_float against stz's dequantizer, bit for bit, on
 * ggml's own blocks of every tensor and on as many rows of random bytes.
 * Usage: ggml_types_bench MODEL [--no-imatrix | --read] TYPE... (built by
 * bench/bench_ggml_types.sh against a ggml snapshot; not part of the build). */
#include "ggml.h"
#include "stz_kernels.h"
#include "stz_quant.h"
#include "stz_safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double normal(uint64_t *s)
{
    double u = 0, v = 0;
    while (u <= 0)
        u = (double)((*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11) / 9007199254740992.0;
    v = (double)((*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

typedef struct {
    double e_stz, e_ggml, t_stz, t_ggml, weights;
    size_t tensors, mismatched;
} totals;

static double werr(const float *x, const float *y, const float *w, size_t rows, size_t cols)
{
    double e = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++) {
            double d = (double)x[r * cols + j] - y[r * cols + j];
            e += (w ? w[j] : 1.0) * d * d;
        }
    return e;
}

/* One tensor x (rows x cols) quantized both ways to `type`. */
static void one(int type, const float *x, size_t rows, size_t cols, const float *w, totals *t)
{
    size_t rb = (size_t)stz_ggml_row_bytes(type, cols);
    uint8_t *qs = malloc(rows * rb), *qg = malloc(rows * rb);
    float *ys = malloc(rows * cols * sizeof *ys), *yg = malloc(rows * cols * sizeof *yg);
    double t0 = now();
    for (size_t r = 0; r < rows; r++)
        if (stz_ggml_quantize_row(type, x + r * cols, w, cols, qs + r * rb)) {
            fprintf(stderr, "stz could not quantize a row of %zu to %s\n", cols, stz_ggml_type_name(type));
            exit(1);
        }
    double t1 = now();
    ggml_quantize_chunk((enum ggml_type)type, x, qg, 0, (int64_t)rows, (int64_t)cols, w);
    double t2 = now();
    const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)type);
    for (size_t r = 0; r < rows; r++) {
        stz_ggml_dequantize_row(type, qs + r * rb, cols, ys + r * cols);
        float *g = yg + r * cols; /* ggml's reading of stz's row, then of its own */
        tr->to_float(qs + r * rb, g, (int64_t)cols);
        t->mismatched += memcmp(g, ys + r * cols, cols * sizeof *g) != 0;
        tr->to_float(qg + r * rb, g, (int64_t)cols);
    }
    t->e_stz += werr(x, ys, w, rows, cols), t->e_ggml += werr(x, yg, w, rows, cols);
    t->t_stz += t1 - t0, t->t_ggml += t2 - t1, t->weights += (double)(rows * cols), t->tensors++;
    free(qs), free(qg), free(ys), free(yg);
}

/* The type named s, read-only ones too; -1 for none. */
static int type_named(const char *s)
{
    for (int t = 0; t < 64; t++)
        if (stz_ggml_type_name(t) && !strcmp(stz_ggml_type_name(t), s))
            return t;
    return -1;
}

/* Rows of a read-only type: ggml's blocks of x, then random bytes; the
 * rows where stz's values differ from ggml's to_float in any bit. */
static size_t read_rows(int type, const float *x, size_t rows, size_t cols, uint64_t *seed)
{
    size_t rb = (size_t)stz_ggml_row_bytes(type, cols), bad = 0;
    uint8_t *q = malloc(2 * rows * rb);
    float *ys = malloc(cols * sizeof *ys), *yg = malloc(cols * sizeof *yg);
    ggml_quantize_chunk((enum ggml_type)type, x, q, 0, (int64_t)rows, (int64_t)cols, NULL);
    for (size_t i = rows * rb; i < 2 * rows * rb; i++)
        q[i] = (uint8_t)((*seed = *seed * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)type);
    for (size_t r = 0; r < 2 * rows; r++) {
        stz_ggml_dequantize_row(type, q + r * rb, cols, ys);
        tr->to_float(q + r * rb, yg, (int64_t)cols);
        bad += memcmp(ys, yg, cols * sizeof *ys) != 0;
    }
    free(q), free(ys), free(yg);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ggml_types_bench MODEL [--no-imatrix] TYPE...\n");
        return 2;
    }
    int use_w = strcmp(argv[2], "--no-imatrix") != 0, reading = !strcmp(argv[2], "--read");
    int first = use_w && !reading ? 2 : 3;
    stz_reader *r;
    stz_err err;
    if (stz_reader_open(&r, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (reading)
        printf("%-7s %8s %10s %9s\n", "type", "tensors", "rows", "inexact");
    else
        printf("%-7s %8s %12s %14s %14s %10s %10s %9s\n", "type", "tensors", "weights", "err stz/ggml", "time stz/ggml",
               "stz Mw/s", "ggml Mw/s", "inexact");
    for (int a = first; a < argc; a++) {
        int type = reading ? type_named(argv[a]) : stz_ggml_type_parse(argv[a]);
        if (type < 0) {
            fprintf(stderr, "unknown type %s\n", argv[a]);
            return 2;
        }
        ggml_quantize_init((enum ggml_type)type);
        totals t = {0};
        size_t nrows = 0;
        uint64_t seed = 7;
        for (size_t i = 0; i < stz_reader_count(r); i++) {
            const stz_tensor *tn = stz_reader_tensor(r, i);
            if (tn->ndim != 2 || tn->shape[1] % stz_ggml_block(type))
                continue;
            size_t rows = (size_t)tn->shape[0], cols = (size_t)tn->shape[1], esz = stz_dtype_bits(tn->dtype) / 8;
            uint8_t *raw = malloc(rows * cols * esz);
            float *x = malloc(rows * cols * sizeof *x), *w = malloc(cols * sizeof *w);
            if (stz_reader_read(r, tn, 0, raw, rows * cols * esz, &err) ||
                stz_to_f32(tn->dtype, raw, rows * cols, x, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            uint64_t s = 1000 + i;
            for (size_t j = 0; j < cols; j++)
                w[j] = (float)exp(1.5 * normal(&s));
            if (reading)
                t.mismatched += read_rows(type, x, rows, cols, &seed), t.tensors++, nrows += 2 * rows;
            else
                one(type, x, rows, cols, use_w ? w : NULL, &t);
            free(raw), free(x), free(w);
        }
        if (!t.tensors) {
            printf("%-7s  (no tensor with rows of whole blocks)\n", argv[a]);
            continue;
        }
        if (reading) {
            printf("%-7s %8zu %10zu %9zu\n", argv[a], t.tensors, nrows, t.mismatched);
            continue;
        }
        printf("%-7s %8zu %12.0f %14.4f %14.3f %10.2f %10.2f %9zu\n", argv[a], t.tensors, t.weights, t.e_stz / t.e_ggml,
               t.t_stz / t.t_ggml, t.weights / t.t_stz / 1e6, t.weights / t.t_ggml / 1e6, t.mismatched);
    }
    stz_reader_free(r);
    return 0;
}
