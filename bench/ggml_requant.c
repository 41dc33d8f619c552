/* bench only: a GGUF file written again with every block tensor's blocks
 * chosen by llama.cpp's own quantizer (ggml's ggml_quantize_chunk, as
 * llama-quantize calls it): the same layout, keys and types, llama.cpp's
 * bytes. Without FROM, the blocks are quantized again from the values
 * stz's blocks hold, with no importance matrix (the packing bench: files
 * whose blocks llama.cpp made). With FROM, an F32 GGUF of the original
 * model under IN's names (stz export --gguf of the unquantized model),
 * they are quantized from the original values, weighted by IMATRIX's
 * columns when given: what `llama-quantize --imatrix` makes of the model
 * with IN's types (the tune --gguf bench's peer). Built by
 * bench/bench_pack_quant.sh and bench/bench_tune_gguf.sh against a ggml
 * snapshot; never part of the build or the tests.
 * Usage: ggml_requant IN.gguf OUT.gguf [FROM.gguf [IMATRIX]] */
#define STZ_EXPERIMENTAL
#include "ggml.h"
#include "stz_kernels.h"
#include "stz_gguf.h"
#include "stz_imatrix.h"
#include "stz_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    long n = f && !fseek(f, 0, SEEK_END) ? ftell(f) : -1;
    uint8_t *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (f)
        rewind(f);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: cannot read\n", path);
        exit(1);
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

static stz_gguf *open_gguf(const char *path)
{
    stz_gguf *g;
    stz_err err;
    if (stz_gguf_open(&g, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return g;
}

/* FROM's F32 values of tensor t (n columns), or exit. */
static const float *original(stz_gguf *from, const uint8_t *fb, const stz_gguf_tensor *t, uint64_t n)
{
    for (size_t i = 0; i < stz_gguf_tensor_count(from); i++) {
        const stz_gguf_tensor *s = stz_gguf_tensor_at(from, i);
        if (!strcmp(s->name, t->name)) {
            if (s->type != GGML_TYPE_F32 || s->ne[0] != n ||
                s->bytes != t->bytes / stz_ggml_row_bytes(t->type, n) * n * 4) {
                fprintf(stderr, "%s: not F32 of the same shape in the original\n", t->name);
                exit(1);
            }
            return (const float *)(fb + s->offset);
        }
    }
    fprintf(stderr, "%s: not in the original\n", t->name);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: ggml_requant IN.gguf OUT.gguf [FROM.gguf [IMATRIX]]\n");
        return 2;
    }
    stz_gguf *g = open_gguf(argv[1]), *from = argc > 3 ? open_gguf(argv[3]) : NULL;
    stz_imatrix *im = NULL;
    stz_err err;
    if (argc > 4 && stz_imatrix_load(&im, argv[4], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t size, fsize, done = 0;
    uint8_t *b = slurp(argv[1], &size), *fb = from ? slurp(argv[3], &fsize) : NULL;
    for (size_t i = 0; i < stz_gguf_tensor_count(g); i++) {
        const stz_gguf_tensor *t = stz_gguf_tensor_at(g, i);
        uint64_t n = t->ne[0], row = stz_ggml_row_bytes(t->type, n);
        if (stz_ggml_block(t->type) <= 1 || !row)
            continue;
        const float *x = from ? original(from, fb, t, n) : NULL, *w = NULL;
        if (im && stz_imatrix_find(im, t->name, n, &w, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        float *y = malloc(n * sizeof *y);
        for (uint64_t r = 0; r < t->bytes / row; r++) {
            uint8_t *at = b + t->offset + r * row;
            if (x)
                memcpy(y, x + r * n, n * sizeof *y);
            else if (stz_ggml_dequantize_row(t->type, at, n, y)) {
                fprintf(stderr, "%s: type %d not read by stz\n", t->name, t->type);
                return 1;
            }
            ggml_quantize_chunk((enum ggml_type)t->type, y, at, 0, 1, (int64_t)n, w);
        }
        free(y);
        done++;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f || fwrite(b, 1, size, f) != size || fclose(f))
        return 1;
    printf("%s: %zu tensors quantized by ggml%s\n", argv[2], done,
           from ? im ? " from the original, with the importance matrix" : " from the original" : "");
    stz_gguf_free(g);
    if (from)
        stz_gguf_free(from);
    stz_imatrix_free(im);
    free(b), free(fb);
    return 0;
}
