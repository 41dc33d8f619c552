/* The GGUF format's pieces for export/: the byte and key/value builder.
 * Not installed. */
#ifndef STZ_GGUF_FORMAT_H
#define STZ_GGUF_FORMAT_H

#include "quant/ggml_types.h"
#include "stz_gguf.h"

#define GGUF_ALIGN 32
/* stz export: the FFN width before it widened it with zero units (export/gguf_export.c) */
#define STZ_GGUF_KEY_FFN "stz.feed_forward_length"
/* That key-value pair's bytes in the header: key length and text, type, u32 */
#define STZ_GGUF_KEY_FFN_BYTES (8 + sizeof STZ_GGUF_KEY_FFN - 1 + 4 + 4)

/* A tensor's n bytes as a GGUF file holds them: padded to GGUF_ALIGN. */
static inline uint64_t gguf_padded(uint64_t n) { return (n + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN; }

/* GGUF value types */
enum { GV_U8, GV_I8, GV_U16, GV_I16, GV_U32, GV_I32, GV_F32, GV_BOOL, GV_STR, GV_ARR, GV_U64, GV_I64, GV_F64 };

/* A growing byte string; `oom` is set (and stays) when memory runs out. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
    uint64_t count; /* key/value pairs added */
} gbuf;

void gb_bytes(gbuf *b, const void *v, size_t n);
void gb_u32(gbuf *b, uint32_t v);
void gb_u64(gbuf *b, uint64_t v);
void gb_str(gbuf *b, const char *s, size_t n);
/* A tensor's info in the header: name, dimensions ne[0..ndim), ggml type,
 * data offset (from the data section's start). */
void gb_tensor_info(gbuf *b, const char *name, uint32_t ndim, const uint64_t *ne, int type, uint64_t offset);
/* Zeros up to the next multiple of GGUF_ALIGN bytes. */
void gb_pad(gbuf *b);
/* Key/value pairs (each counts one in b->count). */
void kv_u32(gbuf *b, const char *key, uint32_t v);
void kv_i32(gbuf *b, const char *key, int32_t v);
void kv_f32(gbuf *b, const char *key, float v);
void kv_bool(gbuf *b, const char *key, int v);
void kv_str(gbuf *b, const char *key, const char *v);
/* An array header: element type and count; the caller appends elements. */
void kv_arr(gbuf *b, const char *key, uint32_t type, uint64_t n);

/* Reads the GGUF file open at fd (fsize bytes; path names it in errors) as
 * stz_gguf_open does, through fd only: a caller that reads the tensors'
 * data through the same descriptor sees one file, even if path is
 * replaced meanwhile. fd stays the caller's. */
stz_status stz_gguf_read_fd(stz_gguf **out, int fd, uint64_t fsize, const char *path, stz_err *err);
/* Key `key` as a whole number: 1 with *v (an integer of any width that is
 * not negative, or an array of them whose elements are all equal, as
 * llama.cpp writes per-layer values), 0 when g has no such key, -1 when it
 * holds something else (a float, a string, elements that differ). */
int stz_gguf_kv_uint(const stz_gguf *g, const char *key, uint64_t *v);

#endif
