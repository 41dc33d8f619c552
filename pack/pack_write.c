/* stz_pack_file: SafeTensors -> container. */
#include "pack_write.h"
#include "stz_planes.h"

#include "gguf/gguf_layout.h"
#include "safetensors/st_reader.h"
#include "quant/ggml_types.h"
#include "quant/quant_tensor.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define BEST_ZSTD_LEVEL 19
#define SMALL_TENSOR    (256u << 10) /* bytes: at most this, the LZ trial always runs */
/* What a small tensor's share of a chunk's head and index entry (56 bytes)
 * is predicted to be: a quarter (14 of 56 bytes), between alone (all) and
 * among many (nothing), where the measured sizes of small models fell.
 * Over a model, predicted container sizes then land within 2% of the
 * measured ones (tests/test_pipeline.c), SVD factors (many small parts
 * together) up to 20% above. */
#define SHARED_OVERHEAD   14
#define HEADER_ZSTD_LEVEL 19 /* a header is small: 0.1-0.2 s for 1 MB */

/* zstd level of the trial on unsplit float bytes (plain zstd -3's). */
#define LZ_TRIAL_LEVEL 3

/* 1 if LZ matching may pay on the chunk: of the 4-byte words sampled
 * every 64 bytes (all of them in chunks under 64 kB), at least 1 in 16 is
 * the word last seen under its hash, which sees runs, zeros, repeated rows
 * and values drawn from a small table (DFT bases, masks, pruned weights)
 * wherever they are in the chunk. Trained weights, and the codes of
 * quantized ones, almost never repeat a 4-byte word: for them the plane
 * coder wins and the trial is skipped. About 16,000 lookups per MiB. */
static int has_repeats(const uint8_t *raw, size_t n)
{
    uint32_t seen[4096];
    memset(seen, 0, sizeof seen); /* a zero word counts as seen */
    size_t step = n >= 65536 ? 64 : 4, hits = 0, samples = 0;
    for (size_t i = 0; i + 4 <= n; i += step, samples++) {
        uint32_t w = stz_le32(raw + i), h = (w * 2654435761u) >> 20;
        hits += seen[h] == w;
        seen[h] = w;
    }
    return samples && hits * 16 >= samples;
}

/* The chunk's planes into pbuf, per the record head h (transform, block
 * type, phase) and raw sizes raw[np]; pointers to them in planes. Returns
 * the runs of a grouped codes plane (stz_blocks_split), else 0. */
static int split_chunk(const uint8_t *h, const uint8_t *src, size_t n, const uint32_t *raw, int np, uint8_t *pbuf,
                       uint8_t **planes, size_t *runs)
{
    for (int k = 0; k < np; k++, pbuf += raw[k - 1])
        planes[k] = pbuf;
    if (h[4] == STZ_XFORM_GGML)
        return stz_blocks_split(h[6], stz_le32(h + 12), src, n, planes, runs);
    stz_xform_split((stz_xform)h[4], src, n, planes);
    return 0;
}

/* The record head for a chunk of n bytes of dtype (or of `block_type`
 * blocks, `at` bytes from the tensor's start): transform, planes and their
 * raw sizes. */
static int chunk_head(uint8_t *h, stz_dtype dtype, int block_type, uint64_t at, size_t n, uint32_t *raw)
{
    stz_xform x = stz_xform_for_dtype(dtype);
    int np = (int)stz_xform_planes(x);
    memset(h, 0, RECORD_HEAD_SIZE);
    memcpy(h, "STZC", 4);
    if (stz_blocks_known(block_type)) {
        uint32_t phase = stz_blocks_phase(block_type, at);
        x = STZ_XFORM_GGML;
        np = stz_blocks_planes(block_type, phase, n, raw);
        h[6] = (uint8_t)block_type;
        stz_put_le32(h + 12, phase);
    } else if (n % stz_xform_width(x)) { /* a float span with odd bytes after it (a GGUF's padding) */
        x = STZ_XFORM_NONE, np = 1;
    }
    if (x != STZ_XFORM_GGML)
        for (int k = 0; k < np; k++)
            raw[k] = (uint32_t)(n / stz_xform_width(x));
    h[4] = (uint8_t)x;
    h[5] = (uint8_t)np;
    stz_put_le32(h + 8, (uint32_t)n);
    return np;
}

/* How a chunk is coded: CHUNK_SHARED, small tensors' bytes (zstd at its
 * best costs little on them); CHUNK_AC, codec 4 may be used (format 3). */
#define CHUNK_SHARED 1u
#define CHUNK_AC     2u

/* What plane encoding may use for the planes of span s: codec 4 when `how`
 * allows it, trying s's codes where the plane is its bytes (`whole`). */
static stz_plane_hint plane_hint(unsigned how, const stz_span *s, int whole)
{
    return (stz_plane_hint){
        .ac = !!(how & CHUNK_AC), .bits = whole ? s->code_bits : 0, .row = whole ? s->row_bytes : 0};
}

/* The record rec[*len] of one plane holding all n bytes, coded with zstd
 * at `level` (or Huffman, constant, codec 4 or raw where smaller); stored
 * only when smaller than *len bytes. pbuf: scratch. */
static stz_status try_unsplit(stz_plane_enc *enc, int level, const uint8_t *raw, size_t n, uint8_t *pbuf, size_t cap,
                              uint8_t *rec, size_t *len, stz_err *err)
{
    stz_codec codec;
    size_t stored;
    stz_status st = stz_plane_encode(enc, level, raw, n, pbuf, cap, &codec, &stored, err);
    if (st || RECORD_HEAD_SIZE + PLANE_HEAD_SIZE + stored >= *len)
        return st;
    rec[4] = STZ_XFORM_NONE, rec[5] = 1, rec[6] = 0;
    memset(rec + 12, 0, 4);
    uint8_t *ph = rec + RECORD_HEAD_SIZE;
    memset(ph, 0, PLANE_HEAD_SIZE);
    ph[0] = (uint8_t)codec;
    stz_put_le32(ph + 4, (uint32_t)stored);
    memcpy(ph + PLANE_HEAD_SIZE, pbuf, stored);
    *len = RECORD_HEAD_SIZE + PLANE_HEAD_SIZE + stored;
    return STZ_OK;
}

/* One chunk's record (without its hash) into rec (capacity *rec_len, at
 * least stz_record_bound(n); *rec_len: its length): the planes of the
 * dtype's transform (or of the span's ggml blocks), each coded the
 * cheapest way tried, or zstd on the unsplit bytes where that is smaller.
 * `at` is the chunk's offset in its span; `how`: CHUNK_*. pbuf:
 * stz_planes_bound(chunk) bytes of scratch. */
static stz_status encode_chunk(stz_plane_enc *enc, const stz_pack_params *p, const stz_span *span, unsigned how,
                               uint64_t at, const uint8_t *raw, size_t n, uint8_t *pbuf, uint8_t *rec, size_t *rec_len,
                               stz_err *err)
{
    uint32_t sizes[STZ_MAX_PLANES];
    uint8_t *planes[STZ_MAX_PLANES], *h = rec;
    size_t runs[STZ_BLOCK_RUNS]; /* Q4_K, Q5_K, Q6_K: the codes plane (before the partial blocks') by class */
    int np = chunk_head(h, span->dtype, span->block_type, at, n, sizes);
    stz_xform x = (stz_xform)h[4];
    int nruns = split_chunk(h, raw, n, sizes, np, pbuf, planes, runs);

    /* Matches find nothing in float weights (zstd -19 saved 55 bytes of
     * 661 MB on a BF16 model at 60x the time), so float planes get the
     * Huffman coder alone; integer and byte planes (quantized values,
     * ids, masks) also try zstd with matches. */
    int is_float = x == STZ_XFORM_BF16 || x == STZ_XFORM_F16 || x == STZ_XFORM_F32;
    int zlevel = is_float ? 0 : p->level == STZ_PACK_BEST ? BEST_ZSTD_LEVEL : 1;
    /* Codes of trained weights have no matches either: integer planes and
     * blocks try zstd only where repeats show (ids, masks, pruned rows,
     * padding), since the trial costs 0.4x the time of the rest of their
     * coding. */
    if (zlevel == 1 && !has_repeats(raw, n))
        zlevel = 0;
    if (zlevel == 1 && n <= STZ_GROUP_MAX) /* a small chunk: zstd at its best costs little */
        zlevel = BEST_ZSTD_LEVEL;
    size_t off = RECORD_HEAD_SIZE + (size_t)np * PLANE_HEAD_SIZE, cap = *rec_len;
    stz_status st;
    if (n > STZ_AC_MAX) /* codec 4 decodes at 12-25 MB/s: for small chunks only, where Huffman's tables cost most */
        how &= ~CHUNK_AC;
    for (int k = 0; k < np; k++) {
        stz_codec codec;
        size_t stored;
        int grouped = k == np - 2 && nruns;
        enc->hint = plane_hint(how, span, x == STZ_XFORM_NONE);
        if ((st = stz_plane_encode_runs(enc, zlevel, planes[k], sizes[k], grouped ? runs : NULL, grouped ? nruns : 0,
                                        rec + off, cap - off, &codec, &stored, err)))
            return st;
        uint8_t *ph = h + RECORD_HEAD_SIZE + k * PLANE_HEAD_SIZE;
        memset(ph, 0, PLANE_HEAD_SIZE);
        ph[0] = (uint8_t)codec;
        stz_put_le32(ph + 4, (uint32_t)stored);
        off += stored;
    }
    *rec_len = off;
    /* the unsplit bytes: codec 4 tried on ggml's blocks (for the others it saw these bytes, or floats) */
    enc->hint = plane_hint(x == STZ_XFORM_GGML ? how : how & ~CHUNK_AC, span, 1);
    /* Blocks of a small span (each plane's table and frame cost more than
     * the split gains on a few kB), or whose planes did not shrink (codes
     * kept whole take more room than packed): also the unsplit bytes. */
    if (x == STZ_XFORM_GGML && (span->end - span->begin <= SMALL_TENSOR || p->level == STZ_PACK_BEST ||
                                off > RECORD_HEAD_SIZE + PLANE_HEAD_SIZE + n))
        return try_unsplit(enc, p->level == STZ_PACK_BEST || n <= STZ_GROUP_MAX ? BEST_ZSTD_LEVEL : 1, raw, n, pbuf,
                           stz_planes_bound(p->chunk_size), rec, rec_len, err);
    /* Float planes lose the runs and repeats LZ matching finds (pruned
     * weights, mostly-zero tables, masks, DFT bases, embeddings with
     * near-identical rows): where repeats show, for every small tensor (the
     * trial costs next to nothing there, and small models are made of
     * them), or always with --best, also try zstd on the unsplit bytes and
     * keep the smaller record. The planes' buffer is free now: its bound
     * exceeds a chunk. */
    if (how & CHUNK_SHARED) /* small tensors' bytes: zstd at its best costs little */
        return try_unsplit(enc, ZSTD_maxCLevel(), raw, n, pbuf, stz_planes_bound(p->chunk_size), rec, rec_len, err);
    if (is_float && (p->level == STZ_PACK_BEST || span->end - span->begin <= SMALL_TENSOR || has_repeats(raw, n)))
        return try_unsplit(enc, p->level == STZ_PACK_BEST ? BEST_ZSTD_LEVEL : LZ_TRIAL_LEVEL, raw, n, pbuf,
                           stz_planes_bound(p->chunk_size), rec, rec_len, err);
    return STZ_OK;
}

/* A chunk record rec[len] as a member (format 3): a 4-byte head
 * (transform, plane count, block type, 0) and 4 bytes a plane (codec,
 * stored size in 24 bits) in place of 24 and 8, then the same payloads.
 * Rewritten in place; its new length. A member starts its tensor, so its
 * phase is 0. */
static size_t as_member(uint8_t *rec, size_t len)
{
    int np = rec[5];
    uint8_t head[MEMBER_HEAD_SIZE + STZ_MAX_PLANES * MEMBER_PLANE_HEAD_SIZE] = {rec[4], rec[5], rec[6], 0};
    for (int k = 0; k < np; k++) {
        const uint8_t *ph = rec + RECORD_HEAD_SIZE + k * PLANE_HEAD_SIZE;
        uint8_t *m = head + MEMBER_HEAD_SIZE + k * MEMBER_PLANE_HEAD_SIZE;
        uint32_t stored = stz_le32(ph + 4);
        m[0] = ph[0], m[1] = (uint8_t)stored, m[2] = (uint8_t)(stored >> 8), m[3] = (uint8_t)(stored >> 16);
    }
    size_t from = RECORD_HEAD_SIZE + (size_t)np * PLANE_HEAD_SIZE,
           to = MEMBER_HEAD_SIZE + (size_t)np * MEMBER_PLANE_HEAD_SIZE;
    memcpy(rec, head, to);
    memmove(rec + to, rec + from, len - from);
    return len - from + to;
}

/* Span s's bytes raw[n] as a member (format 3) into rec (capacity *len,
 * at least stz_record_bound(n); *len: its length): coded as a chunk of
 * its own would be, with codec 4. */
static stz_status encode_member(stz_plane_enc *enc, const stz_pack_params *p, const stz_span *s, const uint8_t *raw,
                                size_t n, uint8_t *pbuf, uint8_t *rec, size_t *len, stz_err *err)
{
    stz_status st = encode_chunk(enc, p, s, CHUNK_SHARED | CHUNK_AC, 0, raw, n, pbuf, rec, len, err);
    if (!st)
        *len = as_member(rec, *len);
    return st;
}

/* Format 3: the whole tensors of chunk ch (bytes raw), each coded as a
 * chunk of its own would be, with codec 4, as members of one record into
 * rec[*len] (capacity in, length out; 0 when they do not fit). */
static stz_status encode_members(stz_plane_enc *enc, const stz_pack_params *p, const stz_span *spans,
                                 const stz_chunk_info *ch, const uint8_t *raw, uint8_t *pbuf, uint8_t *rec, size_t *len,
                                 stz_err *err)
{
    size_t cap = *len, off = RECORD_HEAD_SIZE;
    memset(rec, 0, RECORD_HEAD_SIZE);
    memcpy(rec, "STZC", 4);
    rec[4] = STZ_XFORM_MEMBERS;
    stz_put_le32(rec + 8, ch->raw_size);
    for (uint32_t t = ch->tensor; t <= ch->last; t++) {
        const stz_span *s = &spans[t];
        size_t n = s->end - s->begin, m = cap - off;
        if (!n)
            continue;
        if (m < stz_record_bound(n)) {
            *len = 0;
            return STZ_OK;
        }
        stz_status st =
            encode_member(enc, p, s, raw + (s->begin - spans[ch->tensor].begin), n, pbuf, rec + off, &m, err);
        if (st)
            return st;
        off += m;
    }
    stz_put_le32(rec + 12, (uint32_t)off); /* the record's size: a reader from a pipe learns where it ends */
    *len = off;
    return STZ_OK;
}

/* Sink: waits until chunk i has arrived; 0 if stopped. Its bytes are in
 * the ring (*raw), or (*r set) in tensor *t of *r. */
static int ring_take(pack_ctx *c, size_t i, const uint8_t **raw, const stz_reader **r, const stz_tensor **t)
{
    pthread_mutex_lock(&c->lock);
    while (c->filled <= i && !c->stop)
        pthread_cond_wait(&c->cv, &c->lock);
    int ok = c->filled > i;
    pthread_mutex_unlock(&c->lock);
    if (ok && c->src_t[i])
        *r = c->src_r[i], *t = c->src_t[i];
    else if (ok)
        *raw = c->ring[c->seq_of[i] % c->nring];
    return ok;
}

/* Sink: ring chunk i's slot takes the ring chunk nring later next. */
static void ring_release(pack_ctx *c, size_t i)
{
    pthread_mutex_lock(&c->lock);
    c->next_use[c->seq_of[i] % c->nring] = c->seq_of[i] + c->nring;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

/* 1 if span s is small enough that a chunk of its own (record head, index
 * entry, coding tables: 80 to 200 bytes) costs more than coding it with its
 * neighbours gains: up to 16 KiB, each coded alone as a member of a chunk
 * of whole tensors (format 3), so that a tensor's bytes still add up on
 * their own (tune predicts a container tensor by tensor). */
#define MEMBER_MAX (16u << 10)
static int shares(const stz_span *s) { return s->end - s->begin <= MEMBER_MAX; }

/* The chunk's bytes from r: of its tensor from `begin`, or of the small
 * tensors sharing it, one after the other. */
static stz_status read_chunk(const stz_reader *r, const stz_chunk_info *ch, uint64_t begin, uint8_t *dst, stz_err *err)
{
    if (ch->last == ch->tensor)
        return stz_reader_read(r, stz_reader_tensor(r, ch->tensor), ch->data_offset - begin, dst, ch->raw_size, err);
    for (uint32_t t = ch->tensor; t <= ch->last; t++) {
        const stz_tensor *x = stz_reader_tensor(r, t);
        stz_status st = stz_reader_read(r, x, 0, dst, x->end - x->begin, err);
        if (st)
            return st;
        dst += x->end - x->begin;
    }
    return STZ_OK;
}

/* Chunk ch's record (bytes raw) into b->rec: the planes of its tensor's
 * transform; whole small tensors as members (format 3), or their bytes
 * together where the members do not fit a record. */
static stz_status encode_record(pack_ctx *c, thread_buf *b, const stz_chunk_info *ch, const uint8_t *raw, stz_err *err)
{
    const stz_span *t = &c->spans[ch->tensor];
    unsigned how = c->version >= 3 ? CHUNK_AC : 0;
    size_t bound = stz_record_bound(c->p->chunk_size);
    b->rec_len = bound;
    if (c->version < 3 || !shares(t))
        return encode_chunk(&b->enc, c->p, t, how, ch->data_offset - t->begin, raw, ch->raw_size, b->planes, b->rec,
                            &b->rec_len, err);
    stz_status st = encode_members(&b->enc, c->p, c->spans, ch, raw, b->planes, b->rec, &b->rec_len, err);
    if (st || b->rec_len)
        return st;
    stz_span bytes = {.dtype = STZ_DTYPE_U8, .begin = t->begin, .end = t->begin + ch->raw_size, .name = t->name};
    b->rec_len = bound;
    return encode_chunk(&b->enc, c->p, &bytes, how | CHUNK_SHARED, 0, raw, ch->raw_size, b->planes, b->rec, &b->rec_len,
                        err);
}

static stz_status pack_work(void *vctx, int tid, size_t i, stz_err *err)
{
    pack_ctx *c = (pack_ctx *)vctx;
    thread_buf *b = &c->tb[tid];
    const stz_chunk_info *ch = &c->chunks[i];
    const stz_span *t = &c->spans[ch->tensor];
    const stz_reader *r = c->r;
    const stz_tensor *rt = r ? stz_reader_tensor(r, ch->tensor) : NULL;
    const uint8_t *raw = NULL;
    stz_status st;
    if (!r && !ring_take(c, i, &raw, &r, &rt))
        return stz_err_set(err, STZ_E_INTERRUPTED, "%s: stopped", c->label);
    if (r) { /* the file packed, or a tensor a sink took by reference */
        if (!b->raw && !(b->raw = malloc(c->p->chunk_size)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for a chunk buffer");
        if ((st = c->r ? read_chunk(r, ch, t->begin, b->raw, err)
                       : stz_reader_read(r, rt, ch->data_offset - t->begin, b->raw, ch->raw_size, err)))
            return st;
        raw = b->raw;
    }
    stz_err sub;
    st = encode_record(c, b, ch, raw, &sub);
    c->hashes[i] = XXH3_64bits(raw, ch->raw_size);
    if (raw != b->raw)
        ring_release(c, i);
    if (st)
        return stz_err_set(err, st, "%s: tensor '%s': %s", c->label, t->name, sub.msg);
    stz_put_le64(b->rec + 16, c->hashes[i]);
    return STZ_OK;
}

uint64_t stz_pack_fixed_bytes(const char *header, size_t len)
{
    size_t cap = ZSTD_compressBound(len + 8), zs = 0;
    uint8_t *z = malloc(cap), *img = malloc(len + 8);
    if (z && img) { /* as write_head compresses it: the 8-byte length, then the JSON */
        stz_put_le64(img, len);
        memcpy(img + 8, header, len);
        zs = ZSTD_compress(z, cap, img, len + 8, HEADER_ZSTD_LEVEL);
    }
    free(z), free(img);
    zs = ZSTD_isError(zs) || !zs || zs > len + 8 ? len + 8 : zs;
    return FILE_HEADER_SIZE + zs + INDEX_HEAD_SIZE + TRAILER_SIZE;
}

stz_status stz_pack_tensor_bytes(const stz_pack_params *p, stz_dtype dtype, const stz_pack_hint *hint,
                                 const uint8_t *data, uint64_t n, uint64_t *bytes, stz_err *err)
{
    *bytes = 0;
    size_t cs = p->chunk_size;
    stz_plane_enc enc;
    stz_status st = stz_plane_enc_init(&enc, err);
    if (st)
        return st;
    uint8_t *pbuf = malloc(stz_planes_bound(cs)), *rec = malloc(stz_record_bound(cs));
    if (!pbuf || !rec)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the plane and record buffers");
    const stz_pack_hint none = {0, 0, 0}, *h = hint ? hint : &none;
    stz_span span = {.dtype = dtype, .end = n, .name = "", .row_bytes = h->row_bytes};
    span.block_type = stz_blocks_known(h->block_type) ? h->block_type : 0;
    span.code_bits = h->code_bits <= 8 ? h->code_bits : 0;
    int small = n && shares(&span);
    if (!st && small) { /* a member of a chunk of small tensors (format 3) */
        size_t len = stz_record_bound(cs);
        if (!(st = encode_member(&enc, p, &span, data, (size_t)n, pbuf, rec, &len, err)))
            *bytes = len + SHARED_OVERHEAD;
    }
    for (uint64_t off = 0; !st && !small && off < n; off += cs) {
        size_t k = n - off < cs ? (size_t)(n - off) : cs, len = stz_record_bound(cs);
        if (!(st = encode_chunk(&enc, p, &span, CHUNK_AC, off, data + off, k, pbuf, rec, &len, err)))
            *bytes += len + INDEX_ENTRY_SIZE;
    }
    free(pbuf), free(rec);
    stz_plane_enc_free(&enc);
    return st;
}

/* In order: reserve the record's place. */
static stz_status pack_commit(void *vctx, int tid, size_t i, stz_err *err)
{
    pack_ctx *c = (pack_ctx *)vctx;
    stz_chunk_info *ch = &c->chunks[i];
    ch->file_offset = c->pos;
    ch->record_size = (uint32_t)c->tb[tid].rec_len;
    c->pos += ch->record_size;
    c->pl.done += ch->raw_size;
    return c->out.path ? STZ_OK : stz_outfile_write(&c->out, c->tb[tid].rec, ch->record_size, err); /* in order */
}

/* Any order, in parallel: write the record where it was placed. */
static stz_status pack_post(void *vctx, int tid, size_t i, stz_err *err)
{
    pack_ctx *c = (pack_ctx *)vctx; /* standard output was written in order by pack_commit */
    return c->out.path ? stz_outfile_pwrite(&c->out, c->tb[tid].rec, c->tb[tid].rec_len, c->chunks[i].file_offset, err)
                       : STZ_OK;
}

stz_status stz_pack_writer_write_head(pack_ctx *c, const uint8_t *img, size_t orig, stz_err *err)
{
    size_t cap = ZSTD_compressBound(orig);
    uint8_t *z = malloc(cap), fh[FILE_HEADER_SIZE] = {0};
    if (!z)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a %zu-byte header", orig);
    size_t zs = ZSTD_compress(z, cap, img, orig, HEADER_ZSTD_LEVEL);
    int zipped = !ZSTD_isError(zs) && zs < orig;
    memcpy(fh, STZ_MAGIC, 8);
    stz_put_le16(fh + 8, (uint16_t)c->version);
    fh[10] = c->flags;
    stz_put_le32(fh + 12, c->p->chunk_size);
    stz_put_le64(fh + 16, c->orig_size);
    stz_put_le64(fh + 24, orig);
    stz_put_le64(fh + 32, zipped ? zs : orig);
    fh[40] = zipped ? HEADER_CODEC_ZSTD : HEADER_CODEC_RAW;
    c->header_hash = XXH3_64bits(img, orig);
    stz_put_le64(fh + 48, c->header_hash);
    stz_put_le64(fh + 56, XXH3_64bits(fh, 56));
    stz_status st = stz_outfile_write(&c->out, fh, sizeof fh, err);
    if (!st)
        st = stz_outfile_write(&c->out, zipped ? z : img, zipped ? zs : orig, err);
    c->pos = FILE_HEADER_SIZE + (zipped ? zs : orig);
    free(z);
    return st;
}

static stz_status write_index(pack_ctx *c, stz_err *err)
{
    size_t isize = INDEX_HEAD_SIZE + c->n * INDEX_ENTRY_SIZE;
    uint8_t *ix = malloc(isize), tr[TRAILER_SIZE];
    if (!ix)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the index");
    memcpy(ix, "STZI", 4);
    stz_put_le32(ix + 4, 0);
    stz_put_le64(ix + 8, c->n);
    for (size_t i = 0; i < c->n; i++) {
        uint8_t *e = ix + INDEX_HEAD_SIZE + i * INDEX_ENTRY_SIZE;
        const stz_chunk_info *ch = &c->chunks[i];
        stz_put_le64(e, ch->data_offset);
        stz_put_le64(e + 8, ch->file_offset);
        stz_put_le32(e + 16, ch->record_size);
        stz_put_le32(e + 20, ch->raw_size);
        stz_put_le32(e + 24, ch->tensor);
        stz_put_le32(e + 28, ch->last - ch->tensor); /* format 1: 0 */
    }
    stz_put_le64(tr, c->pos);
    stz_put_le64(tr + 8, isize);
    stz_put_le64(tr + 16, XXH3_64bits(ix, isize));
    stz_put_le64(tr + 24, stz_pack_digest(c->header_hash, c->hashes, c->n));
    memcpy(tr + 32, STZ_END_MAGIC, 8);
    stz_status st = stz_outfile_pwrite(&c->out, ix, isize, c->pos, err);
    if (!st)
        st = stz_outfile_pwrite(&c->out, tr, TRAILER_SIZE, c->pos + isize, err);
    free(ix);
    return st;
}

/* The chunk from span t at `at`: whole small spans together (the last one
 * not empty), or the span's next chunk_size bytes. */
static stz_chunk_info plan_one(const stz_span *sp, size_t nt, size_t t, uint64_t at, uint32_t cs)
{
    stz_chunk_info ch = {.tensor = (uint32_t)t, .last = (uint32_t)t, .data_offset = at};
    uint64_t end = sp[t].end < at + cs ? sp[t].end : at + cs;
    if (at == sp[t].begin && shares(&sp[t]))
        for (size_t u = t + 1; u < nt && shares(&sp[u]) && sp[u].begin == sp[u - 1].end &&
                               sp[u].end - at <= STZ_GROUP_MAX && sp[u].end - at <= cs;
             u++)
            if (sp[u].end > sp[u].begin)
                ch.last = (uint32_t)u, end = sp[u].end;
    ch.raw_size = (uint32_t)(end - at);
    return ch;
}

/* Every chunk into c->chunks (when given; the count returned). */
static size_t plan(pack_ctx *c, size_t nt)
{
    size_t n = 0;
    for (size_t t = 0; t < nt;) {
        uint64_t at = c->spans[t].begin;
        if (at == c->spans[t].end) {
            t++;
            continue;
        }
        stz_chunk_info ch;
        for (; at < c->spans[t].end; at += ch.raw_size, n++) {
            ch = plan_one(c->spans, nt, t, at, c->p->chunk_size);
            if (c->chunks)
                c->chunks[n] = ch;
        }
        t = ch.last + 1;
    }
    return n;
}

stz_status stz_pack_writer_plan_chunks(pack_ctx *c, size_t nt, stz_err *err)
{
    size_t n = plan(c, nt);
    c->chunks = calloc(n + 1, sizeof *c->chunks);
    c->hashes = calloc(n + 1, sizeof *c->hashes);
    if (!c->chunks || !c->hashes)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu chunks", n);
    c->n = plan(c, nt);
    c->version = 1; /* unless small tensors are members of a chunk: then 3 */
    for (size_t i = 0; i < c->n; i++)
        c->version = shares(&c->spans[c->chunks[i].tensor]) ? 3 : c->version;
    c->pl = (stz_ordered){
        .n = c->n, .threads = c->p->threads, .ctx = c, .work = pack_work, .commit = pack_commit, .post = pack_post};
    return STZ_OK;
}

stz_status stz_pack_writer_open(pack_ctx *c, const stz_pack_params *p, const char *out, int reads, stz_err *err)
{
    *c = (pack_ctx){.p = p, .out = STZ_OUTFILE_INIT};
    if (p->threads < 1 || p->threads > 256)
        return stz_err_set(err, STZ_E_ARG, "pack: threads must be 1..256");
    if (p->chunk_size < STZ_PACK_MIN_CHUNK || p->chunk_size > STZ_PACK_MAX_CHUNK || p->chunk_size % 8)
        return stz_err_set(err, STZ_E_ARG, "pack: chunk size %u not a multiple of 8 in [%u, %u]", p->chunk_size,
                           STZ_PACK_MIN_CHUNK, STZ_PACK_MAX_CHUNK);
    if (p->level != STZ_PACK_FAST && p->level != STZ_PACK_BEST)
        return stz_err_set(err, STZ_E_ARG, "pack: unknown level %d", (int)p->level);
    if (!(c->tb = calloc((size_t)p->threads, sizeof *c->tb)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the encoding threads' buffers");
    for (int t = 0; t < p->threads; t++) {
        thread_buf *b = &c->tb[t];
        b->raw = reads ? malloc(p->chunk_size) : NULL;
        b->planes = malloc(stz_planes_bound(p->chunk_size));
        b->rec = malloc(stz_record_bound(p->chunk_size));
        if ((reads && !b->raw) || !b->planes || !b->rec)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for thread buffers");
        stz_status st = stz_plane_enc_init(&b->enc, err);
        if (st)
            return st;
    }
    if (strcmp(out, "-"))
        return stz_outfile_open(&c->out, out, p->write_flags & STZ_WRITE_FORCE, err);
    stz_outfile_stdout(&c->out);
    return STZ_OK;
}

stz_status stz_pack_writer_finish(pack_ctx *c, stz_pack_stats *stats, stz_err *err)
{
    stz_status st = write_index(c, err);
    if (!st)
        st = stz_outfile_commit(&c->out, err);
    if (!st && stats) {
        stats->in_bytes = c->orig_size;
        stats->out_bytes = c->pos + INDEX_HEAD_SIZE + c->n * INDEX_ENTRY_SIZE + TRAILER_SIZE;
        stats->chunks = c->n;
    }
    return st;
}

void stz_pack_writer_close(pack_ctx *c)
{
    stz_outfile_abort(&c->out);
    for (int t = 0; c->tb && t < c->p->threads; t++) {
        free(c->tb[t].raw);
        free(c->tb[t].planes);
        free(c->tb[t].rec);
        stz_plane_enc_free(&c->tb[t].enc);
    }
    free(c->tb);
    free(c->chunks);
    free(c->hashes);
    free(c->spans);
    for (size_t k = 0; c->ring && k < c->nring; k++)
        free(c->ring[k]);
    free(c->ring);
    free(c->next_use), free(c->seq_of), free(c->src_r), free(c->src_t);
}

/* Where the value of "key" starts in the JSON object text `json` (one
 * without escapes in it), or NULL. No allocation: a hint must not change
 * with the memory at hand. */
static const char *json_value(const char *json, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = json; (p = strchr(p, '"')); p++) {
        if (strncmp(p + 1, key, kl) || p[1 + kl] != '"')
            continue;
        const char *q = p + 2 + kl + strspn(p + 2 + kl, " ");
        if (*q == ':')
            return q + 1 + strspn(q + 1, " ");
    }
    return NULL;
}

/* The string value of "key" into buf[cap]; 0 when there is none. */
static int json_string(const char *json, const char *key, char *buf, size_t cap)
{
    const char *q = json_value(json, key);
    size_t n = q && *q == '"' ? strcspn(q + 1, "\"") : cap;
    if (n >= cap || q[1 + n] != '"')
        return 0;
    memcpy(buf, q + 1, n);
    buf[n] = 0;
    return 1;
}

/* Span s's hint from its quantized SafeTensors entry: the ggml type of
 * llama.cpp's blocks ({"method": "q4_k", ..., "packing": "ggml"}), or the
 * width of stz's own codes ("bits") and the bytes of a row of them (the
 * stored tensor's last dimension). A hint only: a wrong one costs room,
 * never bytes (every chunk carries its hash). */
static void span_hint(stz_span *s, const stz_reader *r)
{
    char key[512], method[16], packing[16] = "";
    if (snprintf(key, sizeof key, "%s%s", STZ_QUANT_META_PREFIX, s->name) >= (int)sizeof key)
        return;
    const char *json = stz_reader_meta_get(r, key), *bits = json ? json_value(json, "bits") : NULL;
    if (!json || !json_string(json, "method", method, sizeof method))
        return;
    if (json_string(json, "packing", packing, sizeof packing) && !strcmp(packing, STZ_QUANT_GGML_PACKING)) {
        int type = stz_ggml_type_parse(method);
        s->block_type = stz_blocks_known(type) ? type : 0;
        return;
    }
    long at = stz_reader_find(r, s->name);
    const stz_tensor *t = at >= 0 ? stz_reader_tensor(r, (size_t)at) : NULL;
    if (bits && *bits >= '2' && *bits <= '8' && !isdigit((unsigned char)bits[1]) && t && t->ndim &&
        t->shape[t->ndim - 1] <= UINT32_MAX)
        s->code_bits = (unsigned)(*bits - '0'), s->row_bytes = (uint32_t)t->shape[t->ndim - 1];
}

void stz_pack_writer_hints(stz_span *spans, size_t n, const stz_reader *r)
{
    for (size_t i = 0; i < n && stz_reader_meta_count(r); i++)
        span_hint(&spans[i], r);
}

stz_span *stz_pack_writer_spans(const stz_reader *r)
{
    size_t nt = stz_reader_count(r);
    stz_span *sp = malloc((nt + 1) * sizeof *sp);
    for (size_t i = 0; sp && i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        sp[i] = (stz_span){.dtype = t->dtype, .begin = t->begin, .end = t->end, .name = t->name};
    }
    if (sp)
        stz_pack_writer_hints(sp, nt, r);
    return sp;
}

static stz_status pack_file(const stz_pack_params *p, const char *in, const char *out, stz_pack_stats *stats,
                            stz_err *err);

stz_status stz_pack_file(const stz_pack_params *p, const char *in, const char *out, stz_pack_stats *stats, stz_err *err)
{
    return stz_err_in(err, pack_file(p, in, out, stats, err), in);
}

/* A GGUF file as a reader whose tensors are its spans (stz_gguf_spans),
 * the spans (names the reader's), their count. The file is opened once: the
 * header is read through the descriptor the reader then reads through. */
static stz_status open_gguf(const char *in, stz_reader **r, stz_span **spans, size_t *nt, stz_err *err)
{
    stz_gguf *g = NULL;
    int fd = -1;
    uint64_t fsize;
    stz_status st = stz_open_regular(in, &fd, &fsize, err);
    if (!st)
        st = stz_gguf_read_layout_fd(&g, fd, fsize, in, err);
    if (!st && stz_gguf_data_offset(g) > 8 + (uint64_t)STZ_ST_MAX_HEADER) /* what a reader accepts */
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: a GGUF header of %llu bytes (the container holds up to %u)", in,
                         (unsigned long long)stz_gguf_data_offset(g), 8 + STZ_ST_MAX_HEADER);
    if (!st && !(st = stz_gguf_spans(g, spans, nt, err))) {
        st = stz_reader_open_spans(r, in, fd, fsize, stz_gguf_data_offset(g), *spans, *nt, err);
        fd = -1; /* the reader's, or closed */
    }
    for (size_t i = 0; !st && i < *nt; i++)
        (*spans)[i].name = stz_reader_tensor(*r, i)->name;
    if (fd >= 0)
        close(fd);
    stz_gguf_free(g);
    return st;
}

static stz_status pack_file(const stz_pack_params *p, const char *in, const char *out, stz_pack_stats *stats,
                            stz_err *err)
{
    pack_ctx c;
    stz_reader *r = NULL;
    stz_span *spans = NULL;
    uint8_t *img = NULL;
    size_t nt = 0;
    int gguf = stz_is_gguf(in);
    stz_status st = gguf ? open_gguf(in, &r, &spans, &nt, err) : stz_reader_open(&r, in, err);
    if (!st && strcmp(out, "-"))
        st = stz_refuse_input_as_output(in, out, err);
    if (st) {
        stz_reader_free(r);
        free(spans);
        return st;
    }
    if ((st = stz_pack_writer_open(&c, p, out, 1, err))) {
        free(spans);
        goto cleanup;
    }
    c.r = r, c.label = in, c.flags = gguf ? STZ_ORIG_GGUF : 0;
    uint64_t hlen = stz_reader_data_offset(r); /* the original's bytes before its data: the header section */
    c.orig_size = stz_reader_file_size(r);
    c.spans = gguf ? spans : stz_pack_writer_spans(r);
    nt = stz_reader_count(r);
    if (!c.spans || hlen > SIZE_MAX || !(img = malloc((size_t)hlen))) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor spans and the header");
        goto cleanup;
    }
    if ((st = stz_pack_writer_plan_chunks(&c, nt, err)) || (st = stz_reader_pread(r, 0, img, (size_t)hlen, err)) ||
        (st = stz_pack_writer_write_head(&c, img, (size_t)hlen, err)))
        goto cleanup;
    c.pl.progress = p->progress, c.pl.progress_user = p->progress_user;
    c.pl.total = c.orig_size - hlen;
    if (!(st = stz_ordered_run(&c.pl, err)))
        st = stz_pack_writer_finish(&c, stats, err);
cleanup:
    stz_pack_writer_close(&c);
    free(img);
    stz_reader_free(r);
    return st;
}
