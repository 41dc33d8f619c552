/* llama.cpp's tensor types as a table of traits (ggml.h's numbering, the
 * block layouts of ggml-common.h): elements and bytes per block, and for the
 * types stz writes the packer from stz's values and the reference
 * dequantizer. Export writes GGUF files with it, the GGUF reader sizes
 * tensors with it; a new block type is a row here. Not installed. */
#ifndef STZ_GGML_TYPES_H
#define STZ_GGML_TYPES_H

#include "stz_quant.h"

#define STZ_GGML_QK 32 /* elements per block of the 32-blocks */

/* A field of a block, ggml-common.h's layout: bytes [off, off + len). */
typedef struct {
    const char *name; /* "d", "qs", ...; NULL ends a row's list */
    uint16_t off, len;
    uint8_t kind; /* STZ_FIELD_* */
} stz_ggml_field;

enum {
    STZ_FIELD_BYTES, /* bytes kept as they are */
    STZ_FIELD_F16,   /* an F16 scale (2 bytes) */
    STZ_FIELD_CODES  /* part of every element's code (low nibbles, high bits): see `codes` */
};

/* How a type's whole codes are assembled from its STZ_FIELD_CODES fields
 * (pack/blocks.c, docs/FORMAT.md "Transform 7"). */
enum { STZ_CODES_NONE, STZ_CODES_Q5, STZ_CODES_Q4_K, STZ_CODES_Q5_K, STZ_CODES_Q6_K };

#define STZ_GGML_FIELDS     6  /* fields of a block, at most */
#define STZ_GGML_TYPE_LIMIT 64 /* every row's number is below it */

typedef struct stz_ggml_traits {
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
    /* The row x[n] (a multiple of block) quantized by stz's search
     * (ggml_quant.c) or converted, weights w (NULL: 1): 0, or -1 when a
     * scale passes F16's range. NULL: stz does not write the type. */
    int (*quantize)(int type, const float *x, const float *w, size_t n, uint8_t *out);
    int bits; /* the code width stz's actions give it (q4_k 4, f16 16) */
    int lib;  /* 1: decoded by llama.cpp's own library (ggml_lib.c) */
    /* The types stz writes: llama.cpp's LLAMA_FTYPE of a file whose
     * matrices are mostly of this type (general.file_type), and its place
     * among the policy's actions (STZ_ACTION_GGML of this type, named as
     * the type; 1 first, after stz's own kinds; 0: no action writes it). */
    int ftype;
    int policy;
    int tune; /* stz tune --gguf offers it: its place in the list (1 first, the largest), 0 not */
    /* The block's fields in block order (the types the container splits
     * into planes: docs/FORMAT.md, transform 7; none for the others), and
     * how its whole codes are assembled. */
    uint8_t codes; /* STZ_CODES_* */
    stz_ggml_field fields[STZ_GGML_FIELDS];
} stz_ggml_traits;

/* The type of the k-th action among llama.cpp's (its row's policy: 1
 * first), NULL past the last. */
const stz_ggml_traits *stz_ggml_traits_of_policy(int k);

/* ggml's to_float: k elements (whole blocks) of packed rows x into y. */
typedef void (*stz_ggml_to_float)(const void *x, float *y, int64_t k);

/* 1 when stz decodes type t: its own decoder, or llama.cpp's when t->lib;
 * 0 with why (n bytes; NULL and 0 when not wanted) saying why not. */
int stz_ggml_can_decode(const stz_ggml_traits *t, char *why, size_t n);

/* The values of n elements (whole blocks) of packed rows of a type
 * stz_ggml_can_decode accepted. */
void stz_ggml_decode(const stz_ggml_traits *t, const uint8_t *in, size_t n, float *y);

/* llama.cpp's to_float for t (a t->lib type), from a libggml-base loaded
 * and checked once, at the first call (ggml_lib.c); NULL with why (n
 * bytes; NULL and 0 when not wanted) saying what is missing. */
stz_ggml_to_float stz_ggml_lib_decoder(const stz_ggml_traits *t, char *why, size_t n);

/* The names of the types stz decodes itself (lib 0) or through llama.cpp's
 * library (lib 1), comma-separated in ggml's numbering, into buf (cut at
 * cap). Returns buf. */
char *stz_ggml_type_names(char *buf, size_t cap, int lib);

/* The traits of a ggml type, or NULL for a number ggml does not have. */
const stz_ggml_traits *stz_ggml_traits_of(int type);

/* 1 for the block types stz writes (blocks over 1, a quantizer). */
int stz_ggml_is_block(int type);
/* The type a row of n elements of `type` is stored in: stz_ggml_fallback's,
 * or with pad (a policy's "pad": true), when n is not whole 32-blocks, a
 * 32-block type (`type`, or a 256-block type's 32-block stand-in) whose
 * last block per row is zero-padded. */
int stz_ggml_fit(int type, uint64_t n, int pad);

/* IQ4_NL's 16 non-uniform levels (ggml-common.h's kvalues_iq4nl): IQ4_NL,
 * IQ4_XS and stz's 4-bit nl codebook. */
extern const int8_t stz_iq4nl_levels[16];

/* 32 codes L into a 32-block's nibbles qs (element j in byte j's low
 * nibble, j + 16 in its high one), stored as L - lo; bits 5: the fifth
 * bits into the little-endian word at qh. */
void stz_ggml_put_nibbles(const int8_t *L, int lo, int bits, uint8_t *qh, uint8_t *qs);

/* ggml_quant.c's searches, for the 32-blocks and the 256-blocks. */
int stz_ggml_quant32(int type, const float *x, const float *w, size_t n, uint8_t *out);
int stz_ggml_quant256(int type, const float *x, const float *w, size_t n, uint8_t *out);

#endif /* STZ_GGML_TYPES_H */
