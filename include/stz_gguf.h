/*
 * stz_gguf.h - GGUF (llama.cpp's model format, versions 2 and 3): a strict
 * reader that lists a GGUF file's keys and tensors (export: stz_export.h).
 */
#ifndef STZ_GGUF_H
#define STZ_GGUF_H

#include "stz.h"
#include "stz_experimental.h"
#include "stz_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stz_gguf stz_gguf;

typedef struct {
    const char *name;
    uint32_t ndim;
    uint64_t ne[4];  /* ne[0]: elements of a row */
    int type;        /* ggml type (any value; stz_ggml_type_name may be NULL) */
    uint64_t offset; /* absolute file offset of the data */
    uint64_t bytes;  /* 0 when the type is unknown to stz */
} stz_gguf_tensor;

/* 1 when the file at path starts with GGUF's magic (how model/, pack/ and
 * the program tell GGUF files apart). */
STZ_API int stz_is_gguf(const char *path);
/* Opens and checks a GGUF file (version 2 or 3): every string and array
 * inside the file, tensor data inside the file, aligned and not
 * overlapping for the types stz knows. */
STZ_API stz_status stz_gguf_open(stz_gguf **out, const char *path, stz_err *err);
/* A GGUF header read leniently (any tensor type, offset and alignment, as
 * stz pack stores them) from img[n], a GGUF file's first n bytes ending
 * where its data section starts (stz_container_original_header's); fsize:
 * the whole file's size; label names it in messages. */
STZ_API stz_status stz_gguf_parse_layout(stz_gguf **out, const uint8_t *img, size_t n, uint64_t fsize,
                                         const char *label, stz_err *err);
STZ_API void stz_gguf_free(stz_gguf *g);
STZ_API uint32_t stz_gguf_version(const stz_gguf *g);
STZ_API size_t stz_gguf_tensor_count(const stz_gguf *g);
STZ_API const stz_gguf_tensor *stz_gguf_tensor_at(const stz_gguf *g, size_t i);
STZ_API size_t stz_gguf_kv_count(const stz_gguf *g);
/* Key i, and its value as short text: strings quoted, NUL and control
 * characters escaped (\a to \r by name, others \xHH), cut after 200 bytes
 * with "..." after the closing quote; arrays as
 * "[N x type: first, ..., fourth, ...]". Owned by g. */
STZ_API const char *stz_gguf_kv_key(const stz_gguf *g, size_t i);
STZ_API const char *stz_gguf_kv_text(const stz_gguf *g, size_t i);

#ifdef __cplusplus
}
#endif
#endif
