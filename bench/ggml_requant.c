/* bench only: a GGUF file written again with every block tensor's blocks
 * chosen by llama.cpp's own quantizer (ggml's ggml_quantize_chunk, as
 * llama-quantize calls it, no importance matrix) from the values stz's
 * blocks hold: the same layout, keys and types, llama.cpp's bytes. Lets the
 * packing bench measure files whose blocks llama.cpp made. Built by
 * bench/bench_pack_quant.sh against a ggml snapshot; never part of the
 * build or the tests. Usage: ggml_requant IN.gguf OUT.gguf */
#define STZ_EXPERIMENTAL
#include "ggml.h"
#include "stz_gguf.h"
#include "stz_quant.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: ggml_requant IN.gguf OUT.gguf\n");
        return 2;
    }
    stz_gguf *g;
    stz_err err;
    if (stz_gguf_open(&g, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f || fseek(f, 0, SEEK_END))
        return 1;
    long size = ftell(f);
    uint8_t *b = malloc((size_t)size);
    rewind(f);
    if (!b || fread(b, 1, (size_t)size, f) != (size_t)size)
        return 1;
    fclose(f);
    size_t done = 0;
    for (size_t i = 0; i < stz_gguf_tensor_count(g); i++) {
        const stz_gguf_tensor *t = stz_gguf_tensor_at(g, i);
        uint64_t n = t->ne[0], row = stz_ggml_row_bytes(t->type, n);
        if (stz_ggml_block(t->type) <= 1 || !row)
            continue;
        float *y = malloc(n * sizeof *y);
        for (uint64_t r = 0; r < t->bytes / row; r++) {
            uint8_t *at = b + t->offset + r * row;
            if (stz_ggml_dequantize_row(t->type, at, n, y)) {
                fprintf(stderr, "%s: type %d not read by stz\n", t->name, t->type);
                return 1;
            }
            ggml_quantize_chunk((enum ggml_type)t->type, y, at, 0, 1, (int64_t)n, NULL);
        }
        free(y);
        done++;
    }
    f = fopen(argv[2], "wb");
    if (!f || fwrite(b, 1, (size_t)size, f) != (size_t)size || fclose(f))
        return 1;
    printf("%s: %zu tensors requantized by ggml\n", argv[2], done);
    stz_gguf_free(g);
    free(b);
    return 0;
}
