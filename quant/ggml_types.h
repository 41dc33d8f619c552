/* llama.cpp's tensor types as a table of traits (ggml.h's numbering, the
 * block layouts of ggml-common.h): elements and bytes per block, and for the
 * types stz writes the packer from stz's values and the reference
 * dequantizer. Export writes GGUF files with it, the GGUF reader sizes
 * tensors with it; a new block type is a row here. Not installed. */
#ifndef STZ_GGML_TYPES_H
#define STZ_GGML_TYPES_H

#include "stz_quant.h"

#define STZ_GGML_QK 32 /* elements per block of the 32-blocks */

typedef struct {
    int type;         /* ggml's number */
    const char *name; /* llama.cpp's name: "q4_0", "q4_k", ... */
    uint32_t block;   /* elements per block (1 for floats) */
    uint32_t bytes;   /* bytes per block */
    /* Packs a row of n values (a multiple of block). Floats: converted.
     * Block types: scales[n / block] are the blocks' scales (F16 values)
     * and each value must be code * scale exactly with the code in the
     * type's range. Returns the first element that is not (so that the
     * caller can refuse), or -1 when the row is packed. NULL: stz does not
     * write the type. */
    long (*pack)(const float *v, const float *scales, size_t n, uint8_t *out);
    /* The values of n elements (a multiple of block) of packed rows,
     * exactly as ggml's to_float gives them. NULL: not read yet. */
    void (*dequantize_ref)(const uint8_t *in, size_t n, float *y);
} stz_ggml_traits;

/* The traits of a ggml type, or NULL for a number ggml does not have. */
const stz_ggml_traits *stz_ggml_traits_of(int type);

/* 1 for the block types stz writes (those with a packer and blocks over 1:
 * Q4_0, Q5_0, Q8_0). */
int stz_ggml_is_block(int type);

/* The stz format that quantizes floats to one of those block types the way
 * ggml does (block 32, F16 scales; Q8_0 absmax, Q4_0 / Q5_0 with the signed
 * extreme at the lowest code). */
void stz_ggml_block_format(int type, stz_qformat *f);

#endif /* STZ_GGML_TYPES_H */
