/* Container layout constants and plane codec, shared by pack and unpack.
 * The byte layout is specified in docs/FORMAT.md. */
#ifndef STZ_PACK_INTERNAL_H
#define STZ_PACK_INTERNAL_H

#include "pack_sink.h"
#include "stz_pack.h"

#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#define STZ_MAGIC              "\x89STZ\r\n\x1a\n"
#define STZ_END_MAGIC          "\x89STZEND\n"
#define FILE_HEADER_SIZE       64
#define TRAILER_SIZE           40
#define INDEX_HEAD_SIZE        16
#define INDEX_ENTRY_SIZE       32
#define RECORD_HEAD_SIZE       24
#define PLANE_HEAD_SIZE        8
#define MEMBER_HEAD_SIZE       4 /* format 3: a member's transform, plane count, block type, 0 */
#define MEMBER_PLANE_HEAD_SIZE 4 /* its planes': codec, stored size (24 bits) */
#define HEADER_CODEC_RAW       0
#define HEADER_CODEC_ZSTD      3
#define STZ_ORIG_GGUF          1 /* file header byte 10: the original is a GGUF file */

/* Bytes of all planes of a chunk: F16's three planes of n/2 bytes take
 * 1.5x the chunk, ggml blocks whose 5-bit codes are kept one per byte up
 * to 1.55x (plus two partial blocks); no transform takes more. */
static inline size_t stz_planes_bound(size_t chunk) { return chunk / 8 * 13 + 512; }

/* Largest record a chunk of `chunk` bytes can produce (every plane is at
 * most its raw size); records claiming more are corrupt. */
static inline size_t stz_record_bound(size_t chunk)
{
    return RECORD_HEAD_SIZE + STZ_MAX_PLANES * PLANE_HEAD_SIZE + stz_planes_bound(chunk);
}

/* ---- transform 7: llama.cpp's blocks (blocks.c) ---- */

/* 1 if the ggml type has a block layout here. */
int stz_blocks_known(int type);
/* Where in a block of `type` the byte at `offset` (from a block's start) falls. */
uint32_t stz_blocks_phase(int type, uint64_t offset);
/* The planes of a chunk of n bytes of `type` blocks starting `phase` bytes
 * into a block: their count (0: no such type or phase) and raw sizes. */
int stz_blocks_planes(int type, uint32_t phase, size_t n, uint32_t *raw);
/* The chunk into its planes (sizes from stz_blocks_planes), and back. The
 * codes plane of Q4_K, Q5_K and Q6_K chunks is grouped by class: split
 * returns STZ_BLOCK_RUNS and the runs' lengths in runs (the plane encoder
 * codes each with its own table), 0 for other types. */
#define STZ_BLOCK_RUNS 8
int stz_blocks_split(int type, uint32_t phase, const uint8_t *src, size_t n, uint8_t *const *p, size_t *runs);
void stz_blocks_merge(int type, uint32_t phase, const uint8_t *const *p, size_t n, uint8_t *dst);
/* Plane k's name ("d.lo", "qs", "codes", "partial": the partial blocks'
 * bytes) into buf. */
const char *stz_blocks_plane_name(int type, int k, char *buf, size_t cap);

/* ---- the cut: which bytes each chunk holds (docs/FORMAT.md, "Chunks") ---- */

#define STZ_GROUP_MAX 65536u /* formats 2, 3: bytes of a chunk that whole small tensors share, at most */

/* Span t's data bytes [*begin, returned end). */
typedef uint64_t (*stz_span_bounds)(const void *src, size_t t, uint64_t *begin);
/* Where the next chunk starts: span t, data offset at ({0, 0} first). */
typedef struct {
    size_t t;
    uint64_t at;
} stz_cut;
/* A chunk of n raw bytes next, where the format allows it (1, *ch: tensor,
 * last, data_offset, raw_size; the cut moved past it), else 0: chunk-size
 * steps from each tensor's start, or (format 2 on) whole adjacent tensors of at
 * most STZ_GROUP_MAX bytes together, without an empty one at the end. The
 * index check and the pipe reader place chunks so; the writer chooses. */
int stz_cut_place(stz_cut *cut, const void *src, size_t nt, stz_span_bounds bounds, uint32_t chunk, unsigned version,
                  uint64_t n, stz_chunk_info *ch);
/* stz_span_bounds of a stz_reader's tensors */
uint64_t stz_container_tensor_bounds(const void *src, size_t t, uint64_t *begin);

/* ---- codec 4: the adaptive binary range coder (ac_codec.c) ---- */

#define STZ_AC_MAX 65536 /* bytes: larger planes are not tried with it (they amortise a Huffman table) */
/* n bytes as rows of `row` bytes (0: one row), each a string of `bits`-bit
 * symbols, the top `top` bits of a symbol coded in a tree of contexts (0:
 * the symbols are two's complement numbers, coded by magnitude): the
 * payload into dst[cap] (its bytes; 0 if it does not fit). */
size_t stz_ac_encode(const uint8_t *src, size_t n, unsigned bits, unsigned top, uint32_t row, uint8_t *dst, size_t cap);
/* Which of tries[ntries] ({bits, top, row}, as stz_ac_encode takes them)
 * codes src[n] smallest, as estimated from the symbols' counts. */
int stz_ac_choose(const uint8_t *src, size_t n, const unsigned (*tries)[3], int ntries);
/* 0 if src[stored] decodes to exactly n bytes, -1 otherwise. */
int stz_ac_decode(const uint8_t *src, size_t stored, uint8_t *dst, size_t n);

/* What the next plane encoded may use besides zstd's codecs: codec 4
 * (format 3), trying B-bit symbols in rows of `row` bytes too (stz's own
 * codes: bits 2-7) */
typedef struct {
    int ac;
    unsigned bits;
    uint32_t row;
} stz_plane_hint;

/* Per-thread encoder state. */
typedef struct {
    stz_plane_hint hint;
    ZSTD_CCtx *huf;  /* literals-only frames */
    ZSTD_CCtx *full; /* frames with matches */
    ZSTD_Sequence *seqs;
    size_t seq_cap;
    uint8_t *scratch; /* trial output, ZSTD_compressBound(plane) bytes */
    size_t scratch_cap;
} stz_plane_enc;

stz_status stz_plane_enc_init(stz_plane_enc *e, stz_err *err);
void stz_plane_enc_free(stz_plane_enc *e);

/* Encodes plane src[n] into dst (capacity >= n), choosing the smallest
 * codec among those tried; never more than n bytes. `try_zstd` is the zstd
 * level to also try (0: none). */
stz_status stz_plane_encode(stz_plane_enc *e, int try_zstd, const uint8_t *src, size_t n, uint8_t *dst, size_t cap,
                            stz_codec *codec, size_t *stored, stz_err *err);
/* The same, the Huffman coder's blocks (each with its own table) ending
 * where each of the nseg runs of lengths seg[] (adding up to n) ends. */
stz_status stz_plane_encode_runs(stz_plane_enc *e, int try_zstd, const uint8_t *src, size_t n, const size_t *seg,
                                 int nseg, uint8_t *dst, size_t cap, stz_codec *codec, size_t *stored, stz_err *err);

/* Decodes exactly n bytes. STZ_E_FORMAT if the payload does not decode to
 * exactly n bytes. */
stz_status stz_plane_decode(ZSTD_DCtx *d, stz_codec codec, const uint8_t *src, size_t stored, uint8_t *dst, size_t n,
                            stz_err *err);

/* The container's whole-file digest: XXH3-64 over the little-endian
 * XXH3-64 of the original header followed by those of every chunk in data
 * order. Every byte of the original file feeds it, yet it costs no second
 * pass over the data and no serialised hashing between threads. */
uint64_t stz_pack_digest(uint64_t header_hash, const uint64_t *chunk_hashes, size_t n);

/* Order-0 entropy of n bytes in bits per byte. */
double stz_entropy8(const uint8_t *src, size_t n, uint64_t hist[256]);

/* ---- reading containers: shared by pack_container.c (opening, checking),
 * pack_read.c (decoding, unpacking, tensors, random access) and
 * pack_stream.c (from a pipe) ---- */

struct stz_container {
    char *path;
    int fd;
    uint64_t size;
    uint32_t chunk_size;
    uint32_t max_raw; /* the largest chunk the index holds: decoding buffers' size */
    unsigned version; /* the file's format version */
    uint64_t orig_size;
    uint64_t whole_hash;
    uint8_t *header_img; /* original 8 + N header bytes */
    size_t header_len;
    stz_reader *hdr;
    stz_chunk_info *chunks;
    size_t n;
    struct dec_buf_ *cache; /* stz_container_data_reader: `threads` buffers; the first holds the last chunk decoded */
    size_t cached;          /* its number; n when none */
    int threads;            /* stz_container_data_reader: decoding threads */
    int pool_n;             /* buffers in cache */
    /* read from a pipe (stz_unpack_stream): bytes come in order; the index
     * and trailer are held in `tail` once the records are read */
    int stream;
    uint64_t spos; /* bytes read so far */
    uint8_t *tail;
    uint64_t tail_off;
    int gguf; /* the original is a GGUF file (header: its bytes before the data) */
};

typedef struct dec_buf_ {
    uint8_t *rec, *planes, *raw;
    ZSTD_DCtx *d;
} dec_buf;

stz_status stz_container_dec_buf_init(dec_buf *b, uint32_t chunk_size, stz_err *err);

/* Decoding buffers of all threads together stay under this, whatever the
 * container declares: a few hundred kB of zeros can declare 64 MiB chunks,
 * and each decoding thread holds ~3.5 chunks. */
#define STZ_DECODE_MEMORY (512u << 20)
/* Threads to decode c's chunks with: `threads` in [1, 256], fewer where
 * their buffers would pass STZ_DECODE_MEMORY. */
int stz_container_threads(const stz_container *c, int threads);
void stz_container_dec_buf_free(dec_buf *b);
stz_status stz_container_sread(stz_container *c, uint64_t off, void *dst, size_t n, const char *what, stz_err *err);
stz_status stz_container_cread(const stz_container *c, uint64_t off, void *dst, size_t n, const char *what,
                               stz_err *err);
stz_status stz_container_read_head(stz_container *c, uint64_t *head_end, stz_err *err);
stz_status stz_container_read_index(stz_container *c, uint64_t head_end, stz_err *err);
stz_status stz_container_parse_record(const stz_container *c, size_t i, const uint8_t *rec, stz_chunk_planes *pl,
                                      stz_err *err);
/* Member of n bytes (tensor `name`) at src[avail] of chunk i's record: its
 * head into pl, its bytes (head and payloads) into *used. */
stz_status stz_container_parse_member(const stz_container *c, size_t i, const char *name, const uint8_t *src,
                                      size_t avail, uint32_t n, stz_chunk_planes *pl, size_t *used, stz_err *err);
stz_status stz_container_decode_record(const stz_container *c, size_t i, dec_buf *b, stz_err *err);

#endif
