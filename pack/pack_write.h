/* The container writer's state, shared by the file packer (pack_write.c)
 * and the writer's sink and stream packer built on it (pack_sink.c). Not
 * installed. */
#ifndef STZ_PACK_WRITE_H
#define STZ_PACK_WRITE_H

#include "pack_internal.h"

#include <pthread.h>

typedef struct {
    uint8_t *raw, *planes, *rec;
    size_t rec_len;
    stz_plane_enc enc;
} thread_buf;

typedef struct {
    const stz_pack_params *p;
    stz_reader *r;     /* the file packed, or NULL: its bytes come through the ring (a writer's sink) */
    const char *label; /* the input (or, for a sink, the output) in messages */
    stz_span *spans;   /* its tensors in data order */
    stz_outfile out;
    stz_chunk_info *chunks;
    size_t n;
    thread_buf *tb;
    uint64_t pos; /* next free offset in the output */
    uint64_t header_hash;
    uint64_t *hashes; /* per chunk, for the whole-file digest */
    stz_ordered pl;
    /* sink: chunks arrive in order. The k-th chunk written through the ring
     * (seq_of[i] = k) goes into ring[k % nring] once next_use[k % nring] == k;
     * a tensor taken by reference sets its chunks' src_r/src_t, and the
     * encoding threads read those chunks themselves. */
    uint8_t **ring;
    size_t nring, *next_use, *seq_of, seq;
    const stz_reader **src_r;
    const stz_tensor **src_t;
    size_t filled, fill; /* chunks delivered; bytes of the next one so far */
    int stop, done, running;
    stz_status pl_status;
    stz_err pl_err;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    uint64_t orig_size; /* of the file packed */
    uint8_t flags;      /* the file header's: STZ_ORIG_GGUF */
    unsigned version;   /* the format version written: 2 when small tensors share chunks */
} pack_ctx;

/* Checks the parameters, opens the output, makes the thread buffers (with
 * `reads`, one for the raw chunk each: the packer reads its input; a sink's
 * chunks arrive in its ring). */
stz_status stz_pack_writer_open(pack_ctx *c, const stz_pack_params *p, const char *out, int reads, stz_err *err);
/* Chunks never straddle tensors, so every chunk has one dtype. */
stz_status stz_pack_writer_plan_chunks(pack_ctx *c, size_t nt, stz_err *err);
/* File header + the original SafeTensors header img[orig] (its 8-byte
 * length, then the JSON), zstd-compressed. */
stz_status stz_pack_writer_write_head(pack_ctx *c, const uint8_t *img, size_t orig, stz_err *err);
/* The index and trailer after the records, then the output renamed into place. */
stz_status stz_pack_writer_finish(pack_ctx *c, stz_pack_stats *stats, stz_err *err);
void stz_pack_writer_close(pack_ctx *c);
/* The tensors of r as spans (malloc'd; NULL out of memory), with the
 * block types stz_pack_writer_hints finds. */
stz_span *stz_pack_writer_spans(const stz_reader *r);
/* Sets spans[i].block_type for the quantized tensors of r's metadata whose
 * values are llama.cpp's blocks (the same names as r's tensors). */
void stz_pack_writer_hints(stz_span *spans, size_t n, const stz_reader *r);

#endif /* STZ_PACK_WRITE_H */
