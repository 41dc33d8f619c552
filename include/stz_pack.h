/*
 * stz_pack.h - lossless container for SafeTensors files (.stz).
 *
 * stz_pack_file() turns any valid SafeTensors file into a container and
 * stz_unpack_file() gives back the identical bytes. Each tensor is cut into
 * chunks (default 1 MiB); each chunk's elements are split into planes that
 * group similar bits (BF16: exponent byte | sign+mantissa byte; F16, F32
 * likewise; other widths: byte planes), and each plane is stored raw, as a
 * constant, as Huffman-coded literals in a zstd frame, or as a full zstd
 * frame, whichever is smallest. Every chunk carries an XXH3-64 checksum, the
 * trailer a digest of the whole original file; an index at the end gives
 * random access. Byte layout: docs/FORMAT.md.
 *
 * Output bytes depend only on the input and the level, never on threads.
 * Memory is bounded by threads x chunk size, not by the model.
 */
#ifndef STZ_PACK_H
#define STZ_PACK_H

#include "stz.h"
#include "stz_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The newest container format this library writes and reads (it reads
 * every older one); a file is written in version 1 when nothing of 3 is
 * needed (no tensor of at most 16 KiB), so older readers take it. */
#define STZ_PACK_FORMAT_VERSION 3
#define STZ_PACK_MIN_CHUNK      (64u << 10)
#define STZ_PACK_MAX_CHUNK      (64u << 20)

typedef enum { STZ_PACK_FAST = 1, STZ_PACK_BEST = 2 } stz_pack_level;

typedef struct stz_pack_params {
    stz_pack_level level;     /* FAST (default) or BEST (slower, smaller) */
    int threads;              /* >= 1 */
    uint32_t chunk_size;      /* raw bytes per chunk, multiple of 8 in [MIN, MAX] */
    unsigned write_flags;     /* STZ_WRITE_FORCE */
    stz_progress_fn progress; /* input bytes done / total */
    void *progress_user;
} stz_pack_params;

// clang-format off
#define STZ_PACK_PARAMS_DEFAULT {.level = STZ_PACK_FAST, .threads = 1, .chunk_size = 1u << 20}
// clang-format on

typedef struct stz_pack_stats {
    uint64_t in_bytes, out_bytes;
    uint64_t chunks;
} stz_pack_stats;

/* Packs SafeTensors `in` into container `out`. Input errors are the
 * reader's; STZ_E_EXISTS, STZ_E_IO, STZ_E_NOMEM, STZ_E_INTERRUPTED. */
STZ_API stz_status stz_pack_file(const stz_pack_params *p, const char *in, const char *out, stz_pack_stats *stats,
                                 stz_err *err);

/* Packs a SafeTensors file read in order from fd (a pipe: standard input),
 * `label` naming it in messages, into `out` ("-": standard output): the
 * same container stz_pack_file makes of that file. The header is checked
 * when it arrives; input that ends early (STZ_E_TRUNCATED) or goes on past
 * the last tensor (STZ_E_FORMAT) fails and leaves no output. Memory: the
 * header and a few chunks per thread. */
STZ_API stz_status stz_pack_stream(const stz_pack_params *p, int fd, const char *label, const char *out,
                                   stz_pack_stats *stats, stz_err *err);

/* What a tensor's bytes are beyond its dtype: llama.cpp's blocks of
 * block_type (STZ_GGML_*, as a quantized file's entry with "packing":
 * "ggml" declares them), or stz's own codes of code_bits bits (2-8) in rows
 * of row_bytes bytes (docs/FORMAT.md); zeros for neither. A hint only:
 * a wrong one costs room, never bytes. */
typedef struct {
    int block_type;
    unsigned code_bits;
    uint32_t row_bytes;
} stz_pack_hint;

/* Predicting a container's size (stz tune): the bytes a tensor of `dtype`
 * holding data[n] takes in a container written with p (its chunk records
 * and index entries, exactly; a tensor of at most 16 KiB, a member of a
 * chunk of whole small tensors: its member's bytes exactly, and a quarter
 * of a chunk head and index entry), and the container's fixed bytes for a
 * SafeTensors file whose JSON header is header[len]. hint: NULL for none. */
STZ_API stz_status stz_pack_tensor_bytes(const stz_pack_params *p, stz_dtype dtype, const stz_pack_hint *hint,
                                         const uint8_t *data, uint64_t n, uint64_t *bytes, stz_err *err);
STZ_API uint64_t stz_pack_fixed_bytes(const char *header, size_t len);

/* ---- reading containers ---------------------------------------------- */

typedef struct stz_container stz_container;

/* Codec of one plane. Values are part of the format. */
typedef enum {
    STZ_CODEC_RAW = 0,   /* stored as is */
    STZ_CODEC_CONST = 1, /* one byte repeated */
    STZ_CODEC_HUF = 2,   /* zstd frame of Huffman-coded literals only */
    STZ_CODEC_ZSTD = 3,  /* zstd frame with matches */
    STZ_CODEC_AC = 4,    /* adaptive binary range coder (format 3) */
    STZ_CODEC_COUNT
} stz_codec;

/* Plane transform of one chunk. Values are part of the format. */
typedef enum {
    STZ_XFORM_NONE = 0,   /* 1 plane: the bytes */
    STZ_XFORM_BF16 = 1,   /* exponent | sign+7 mantissa bits */
    STZ_XFORM_F16 = 2,    /* exponent (5b) | sign+2 top mantissa bits | 8 low mantissa bits */
    STZ_XFORM_F32 = 3,    /* exponent | sign+7 top mantissa bits | mantissa byte | mantissa byte */
    STZ_XFORM_BYTES2 = 4, /* byte planes of 2-byte elements */
    STZ_XFORM_BYTES4 = 5,
    STZ_XFORM_BYTES8 = 6,
    STZ_XFORM_GGML = 7,    /* llama.cpp's blocks: a plane per field, the codes whole (planes: the block type's) */
    STZ_XFORM_MEMBERS = 8, /* whole small tensors, each coded as a chunk of its own (format 3) */
    STZ_XFORM_COUNT
} stz_xform;

#define STZ_MAX_PLANES 8

typedef struct {
    uint32_t tensor;      /* index in stz_container_header() order */
    uint64_t data_offset; /* offset of the chunk's bytes in the data section */
    uint32_t raw_size;
    uint64_t file_offset; /* of the chunk record in the container */
    uint32_t record_size;
    uint32_t last; /* the last tensor it holds bytes of: > tensor when small tensors share it (formats 2, 3) */
} stz_chunk_info;

typedef struct {
    stz_xform xform;
    int nplanes;
    stz_codec codec[STZ_MAX_PLANES];
    uint32_t stored[STZ_MAX_PLANES]; /* payload bytes per plane */
    uint32_t raw[STZ_MAX_PLANES];    /* plane bytes after decoding */
    int block_type;                  /* STZ_XFORM_GGML: the ggml type of the blocks */
    uint32_t phase;                  /* STZ_XFORM_GGML: where in a block the chunk starts */
} stz_chunk_planes;

/* Opens a container and checks its header, trailer, index and the original
 * SafeTensors header (STZ_E_FORMAT, STZ_E_CHECKSUM, STZ_E_TRUNCATED, ...).
 * Chunk payloads are checked when decoded. */
STZ_API stz_status stz_container_open(stz_container **out, const char *path, stz_err *err);
STZ_API void stz_container_free(stz_container *c);

/* 1 if the file starts with the container magic, 0 if not (or unreadable). */
STZ_API int stz_is_container(const char *path);

/* The original file's SafeTensors header, parsed (data not readable). */
STZ_API const stz_reader *stz_container_header(const stz_container *c);
STZ_API uint64_t stz_container_file_size(const stz_container *c);     /* container */
STZ_API uint64_t stz_container_original_size(const stz_container *c); /* unpacked */
/* The original file's bytes before its data: a SafeTensors file's 8-byte
 * length and JSON header, or a GGUF file's header (keys, tensor infos and
 * padding); *gguf: 1 for a GGUF. A GGUF container's stz_container_header()
 * lists the pieces its data section was cut into: each tensor with the
 * padding after it, 1-D, U8 for llama.cpp's block types. */
STZ_API const uint8_t *stz_container_original_header(const stz_container *c, size_t *len, int *gguf);
STZ_API uint32_t stz_container_chunk_size(const stz_container *c);
/* The file's container format version (1, 2 or 3). */
STZ_API unsigned stz_container_format_version(const stz_container *c);
STZ_API size_t stz_container_chunk_count(const stz_container *c);
STZ_API const stz_chunk_info *stz_container_chunk(const stz_container *c, size_t i);
/* Reads a chunk record's plane table (no payload decoding). */
STZ_API stz_status stz_container_planes(const stz_container *c, size_t i, stz_chunk_planes *out, stz_err *err);
/* A chunk of members (format 3; its planes' xform STZ_XFORM_MEMBERS): the
 * plane table of each tensor's member (no payload decoding), out[k] and
 * bytes[k] (the member's, its head included) for tensor
 * stz_container_chunk(c, i)->tensor + k; an empty tensor has no planes and
 * no bytes. cap: out's and bytes' entries, at least the chunk's tensors. */
STZ_API stz_status stz_container_members(const stz_container *c, size_t i, stz_chunk_planes *out, uint32_t *bytes,
                                         size_t cap, stz_err *err);

typedef struct {
    int threads;
    unsigned write_flags;
    stz_progress_fn progress; /* original bytes done / total */
    void *progress_user;
} stz_unpack_params;

// clang-format off
#define STZ_UNPACK_PARAMS_DEFAULT {.threads = 1}
// clang-format on

/* Writes the original file to `out`, checking every chunk checksum and the
 * whole-file digest; on any mismatch no output is left (STZ_E_CHECKSUM).
 * out "-": standard output, in order, each chunk checked before it is
 * written (a failure stops the stream; the status says so). The same for
 * stz_unpack_tensor. */
STZ_API stz_status stz_unpack_file(const stz_unpack_params *p, const char *in, const char *out, stz_err *err);

/* Decodes and checks everything, writes nothing. */
STZ_API stz_status stz_verify_file(const stz_unpack_params *p, const char *in, stz_err *err);
/* Unpacks a container read in order from fd (a pipe: standard input),
 * `label` naming it in messages, into out ("-": standard output; NULL:
 * verify only): every record checked as it comes, then the index, the
 * trailer and the whole-file digest, and nothing after the end. One
 * thread. A file output appears only when everything checked. */
STZ_API stz_status stz_unpack_stream(const stz_unpack_params *p, int fd, const char *label, const char *out,
                                     stz_err *err);

/* Writes the raw bytes of tensor `name` (little-endian, as in the original
 * file) to `out`, decoding only its chunks. STZ_E_ARG if no such tensor. */
STZ_API stz_status stz_unpack_tensor(const stz_unpack_params *p, const char *in, const char *name, const char *out,
                                     stz_err *err);

/* Reads the raw bytes of tensor `name` (little-endian, as in the original
 * file) from an open container into dst (cap >= its size), decoding and
 * checking only its chunks, on `threads` threads; name NULL: the whole data
 * section (the original file after its header), all checks included.
 * STZ_E_ARG if no such tensor, STZ_E_BOUNDS if cap is too small. */
STZ_API stz_status stz_container_read_tensor(const stz_container *c, const char *name, void *dst, size_t cap,
                                             int threads, stz_err *err);

/* The original file's reader (stz_container_header) with its tensor data
 * readable: each read decodes the chunks it covers, checking their
 * checksums, and keeps the last one decoded (so reading a tensor row batch
 * by row batch decodes each chunk once). Not thread-safe; valid while c is
 * open. Memory: one chunk, whatever the file's size. */
STZ_API const stz_reader *stz_container_data_reader(stz_container *c);
/* Reads through stz_container_data_reader that cover two or more whole
 * chunks decode them on `threads` threads (default 1). */
STZ_API void stz_container_set_threads(stz_container *c, int threads);

/* Names of a codec and a plane transform, as `stz inspect` prints them. */
STZ_API const char *stz_codec_name(stz_codec c);
STZ_API const char *stz_xform_name(stz_xform x);
/* The name of plane k of transform x ("exponent", ...; "?" past its planes);
 * for STZ_XFORM_GGML, of llama.cpp type block_type's block field (in buf). */
STZ_API const char *stz_plane_name(stz_xform x, int block_type, int k, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* STZ_PACK_H */
