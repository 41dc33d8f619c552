/*
 * stz_safetensors.h - validated SafeTensors reader and streaming writer.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *   u64 LE  N                 header length
 *   N bytes JSON object       {"__metadata__":{str:str}, NAME:{"dtype","shape","data_offsets"}}
 *   data                      tensors' bytes; offsets are relative to here
 *
 * The reader checks every rule of the reference implementation before it
 * hands anything out: N <= STZ_ST_MAX_HEADER and 8+N <= file size; header
 * is UTF-8 JSON starting with '{'; known dtypes; shapes of whole numbers
 * whose product (times the element bits) does not overflow and is a whole
 * number of bytes; end-begin equals that size; offsets, sorted, start at 0,
 * are contiguous and end exactly at the end of the file; no duplicate
 * names; __metadata__ maps strings to strings.
 *
 * Tensor bytes are read with pread on demand: opening a 100 GB file costs
 * the header only.
 */
#ifndef STZ_SAFETENSORS_H
#define STZ_SAFETENSORS_H

#include "stz.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STZ_ST_MAX_HEADER 100000000u /* the reference implementation's limit */
#define STZ_ST_MAX_NDIM   64         /* deeper shapes are rejected (STZ_E_SHAPE) */
/* Tensors in one file. Each entry costs ~1 kB while the header is parsed
 * (~50 bytes of JSON), so without a cap a 100 MB header of empty tensors
 * would take ~1.5 GB to open; the largest real checkpoints hold a few
 * thousand per file. STZ_E_FORMAT past it. */
#define STZ_ST_MAX_TENSORS 262144

typedef struct stz_tensor {
    const char *name; /* UTF-8, NUL-terminated, owned by the reader */
    stz_dtype dtype;
    int ndim;              /* 0 for a scalar */
    const uint64_t *shape; /* ndim entries, owned by the reader */
    uint64_t numel;        /* product of shape (1 for a scalar) */
    uint64_t begin, end;   /* byte range inside the data section */
} stz_tensor;

/* ---- reader ---------------------------------------------------------- */

typedef struct stz_reader stz_reader;

/*
 * Opens and validates `path`. On success *out owns an open descriptor and
 * the parsed header (not the data). Errors: STZ_E_IO, STZ_E_NOMEM,
 * STZ_E_TRUNCATED, STZ_E_HEADER_SIZE, STZ_E_JSON, STZ_E_FORMAT, STZ_E_DTYPE,
 * STZ_E_SHAPE, STZ_E_OFFSETS, STZ_E_DUPLICATE, STZ_E_METADATA.
 */
STZ_API stz_status stz_reader_open(stz_reader **out, const char *path, stz_err *err);

/*
 * Same validation over a whole file image in memory. `buf` is not copied
 * and must outlive the reader. `label` names the buffer in messages.
 */
STZ_API stz_status stz_reader_open_mem(stz_reader **out, const void *buf, size_t size, const char *label, stz_err *err);

/*
 * Validates a header image (the 8-byte length and the JSON, `size` bytes)
 * as if it began a file of `file_size` bytes. The data is not available:
 * reading tensor bytes gives STZ_E_BOUNDS. Used for containers that keep the
 * original header apart from the data. `buf` must outlive the reader.
 * file_size 0: the file is as long as its tensors need (a stream whose
 * header came first); stz_reader_file_size then gives that length.
 */
STZ_API stz_status stz_reader_open_header(stz_reader **out, const void *buf, size_t size, uint64_t file_size,
                                          const char *label, stz_err *err);

/* Closes the file and frees the reader (NULL is fine). */
STZ_API void stz_reader_free(stz_reader *r);

/* Tensors in file order (increasing begin; ties keep header order). */
STZ_API size_t stz_reader_count(const stz_reader *r);
STZ_API const stz_tensor *stz_reader_tensor(const stz_reader *r, size_t i);
/* Index of the tensor called `name`, or -1. O(log n). */
STZ_API long stz_reader_find(const stz_reader *r, const char *name);

/* __metadata__ entries in header order; `get` returns NULL if absent. */
STZ_API size_t stz_reader_meta_count(const stz_reader *r);
STZ_API const char *stz_reader_meta_key(const stz_reader *r, size_t i);
STZ_API const char *stz_reader_meta_value(const stz_reader *r, size_t i);
STZ_API const char *stz_reader_meta_get(const stz_reader *r, const char *key);

/* The path (or label) the reader was opened with, and the file's size. */
STZ_API const char *stz_reader_path(const stz_reader *r);
STZ_API uint64_t stz_reader_file_size(const stz_reader *r);
/* Offset of the data section in the file: 8 + header length. */
STZ_API uint64_t stz_reader_data_offset(const stz_reader *r);
/* The header JSON exactly as stored (len = N; not NUL-terminated). */
STZ_API const uint8_t *stz_reader_header(const stz_reader *r, size_t *len);

/* Reads n bytes at `off` inside tensor t's range. STZ_E_BOUNDS if the
 * range leaves the tensor, STZ_E_IO / STZ_E_TRUNCATED if the file changed. */
STZ_API stz_status stz_reader_read(const stz_reader *r, const stz_tensor *t, uint64_t off, void *dst, size_t n,
                                   stz_err *err);
/* Reads n raw bytes at file offset `off` (any region). */
STZ_API stz_status stz_reader_pread(const stz_reader *r, uint64_t off, void *dst, size_t n, stz_err *err);

/* ---- writer ---------------------------------------------------------- */

typedef struct stz_writer stz_writer;

enum { STZ_WRITE_FORCE = 1 }; /* replace an existing output file */

/*
 * Starts writing `path`. Bytes go to a temporary file in the same directory,
 * renamed to `path` by stz_writer_finish(); stz_writer_free() without a
 * successful finish removes it. Without STZ_WRITE_FORCE an existing `path`
 * gives STZ_E_EXISTS. Metadata starts as {"format":"pt"}.
 */
STZ_API stz_status stz_writer_open(stz_writer **out, const char *path, unsigned flags, stz_err *err);

/* Adds or replaces a __metadata__ entry (before the first write). */
STZ_API stz_status stz_writer_set_meta(stz_writer *w, const char *key, const char *value, stz_err *err);

/* Declares the next tensor (before the first write). Copies name and shape.
 * STZ_E_DUPLICATE, STZ_E_SHAPE, STZ_E_ARG ("__metadata__", empty name). */
STZ_API stz_status stz_writer_add(stz_writer *w, const char *name, stz_dtype dtype, int ndim, const uint64_t *shape,
                                  stz_err *err);

/* Appends n bytes of tensor data, in declaration order; the first call
 * writes the header. STZ_E_BOUNDS if more than declared. */
STZ_API stz_status stz_writer_write(stz_writer *w, const void *data, size_t n, stz_err *err);

/* Checks that every declared byte was written (STZ_E_BOUNDS otherwise),
 * then renames the temporary file into place. */
STZ_API stz_status stz_writer_finish(stz_writer *w, stz_err *err);

/* Bytes still owed by the declared tensors. */
STZ_API uint64_t stz_writer_remaining(const stz_writer *w);

/* Frees the writer; before stz_writer_finish it removes the unfinished output. */
STZ_API void stz_writer_free(stz_writer *w);

#ifdef __cplusplus
}
#endif
#endif /* STZ_SAFETENSORS_H */
