/* stz_pack_file: SafeTensors -> container. */
#include "pack_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <xxhash.h>

#define BEST_ZSTD_LEVEL 19
#define SMALL_TENSOR (256u << 10) /* bytes: at most this, the LZ trial always runs */
#define HEADER_ZSTD_LEVEL 9

typedef struct {
    uint8_t *raw, *planes, *rec;
    size_t rec_len;
    stz_plane_enc enc;
} thread_buf;

typedef struct {
    const stz_pack_params *p;
    stz_reader *r;        /* the file packed, or NULL: its bytes come through the ring (a writer's sink) */
    const char *label;    /* the input (or, for a sink, the output) in messages */
    stz_span *spans;      /* its tensors in data order */
    stz_outfile out;
    stz_chunk_info *chunks;
    size_t n;
    thread_buf *tb;
    uint64_t pos;          /* next free offset in the output */
    uint64_t header_hash;
    uint64_t *hashes;      /* per chunk, for the whole-file digest */
    stz_pipeline pl;
    /* sink: chunk i is delivered into ring[i % nring] once next_use[i % nring] == i */
    uint8_t **ring;
    size_t nring, *next_use;
    size_t filled, fill;   /* chunks delivered; bytes of the next one so far */
    int stop, done, running;
    stz_status pl_status;
    stz_err pl_err;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    uint64_t orig_size;    /* of the file packed */
} pack_ctx;

/* zstd level of the trial on unsplit float bytes (plain zstd -3's). */
#define LZ_TRIAL_LEVEL 3

/* 1 if a sample of the chunk's elements (w bytes each) holds zeros or
 * repeats of the previous element often enough (1 in 16) for LZ matching
 * to beat the plane coder; trained weights have almost none. */
static int lz_friendly(const uint8_t *raw, size_t n, size_t w)
{
    size_t ne = n / w, hits = 0, samples = 0;
    static const uint8_t zero[8];
    for (size_t k = 0; k < 1024 && ne > 1; k++, samples++) {
        size_t e = 1 + (uint64_t)k * (ne - 1) / 1024;
        const uint8_t *p = raw + e * w;
        hits += !memcmp(p, zero, w) || !memcmp(p, p - w, w);
    }
    return samples && hits * 16 >= samples;
}

/* One chunk's record (without its hash) into rec: the planes of the
 * dtype's transform, each coded the cheapest way tried, or zstd on the
 * unsplit bytes where that is smaller. `whole` is the size of the tensor
 * the chunk belongs to. planes: stz_planes_bound(chunk) bytes of scratch. */
static stz_status encode_chunk(stz_plane_enc *enc, const stz_pack_params *p, stz_dtype dtype, uint64_t whole,
                               const uint8_t *raw, size_t n, uint8_t *pbuf, uint8_t *rec, size_t *rec_len,
                               stz_err *err)
{
    stz_xform x = stz_xform_for_dtype(dtype);
    unsigned np = stz_xform_planes(x);
    size_t plane_len = n / stz_xform_width(x);
    uint8_t *planes[STZ_MAX_PLANES];
    for (unsigned k = 0; k < np; k++)
        planes[k] = pbuf + k * plane_len;
    stz_xform_split(x, raw, n, planes);

    /* Matches find nothing in float weights (zstd -19 saved 55 bytes of
     * 661 MB on a BF16 model at 60x the time), so float planes get the
     * Huffman coder alone; integer and byte planes (quantized values,
     * ids, masks) also try zstd with matches. */
    int is_float = x == STZ_XFORM_BF16 || x == STZ_XFORM_F16 || x == STZ_XFORM_F32;
    int zlevel = is_float ? 0 : p->level == STZ_PACK_BEST ? BEST_ZSTD_LEVEL : 1;
    uint8_t *h = rec;
    memcpy(h, "STZC", 4);
    h[4] = (uint8_t)x;
    h[5] = (uint8_t)np;
    stz_put_le16(h + 6, 0);
    stz_put_le32(h + 8, (uint32_t)n);
    stz_put_le32(h + 12, 0);
    size_t off = RECORD_HEAD_SIZE + np * PLANE_HEAD_SIZE, cap = stz_record_bound(p->chunk_size);
    stz_status st;
    for (unsigned k = 0; k < np; k++) {
        stz_codec codec;
        size_t stored;
        if ((st = stz_plane_encode(enc, zlevel, planes[k], plane_len, rec + off, cap - off, &codec, &stored, err)))
            return st;
        uint8_t *ph = h + RECORD_HEAD_SIZE + k * PLANE_HEAD_SIZE;
        ph[0] = (uint8_t)codec;
        ph[1] = ph[2] = ph[3] = 0;
        stz_put_le32(ph + 4, (uint32_t)stored);
        off += stored;
    }
    *rec_len = off;
    /* Float planes lose the runs and repeats LZ matching finds (pruned
     * weights, mostly-zero tables, masks, embeddings with near-identical
     * rows): where a sample shows them, for every small tensor (the trial
     * costs next to nothing there, and small models are made of them), or
     * always with --best, also try zstd on the unsplit bytes and keep the
     * smaller record. */
    if (is_float && (p->level == STZ_PACK_BEST || whole <= SMALL_TENSOR || lz_friendly(raw, n, stz_xform_width(x)))) {
        uint8_t *trial = pbuf; /* free now: its bound exceeds a chunk */
        stz_codec codec;
        size_t stored;
        int level = p->level == STZ_PACK_BEST ? BEST_ZSTD_LEVEL : LZ_TRIAL_LEVEL;
        if ((st = stz_plane_encode(enc, level, raw, n, trial, stz_planes_bound(p->chunk_size), &codec, &stored, err)))
            return st;
        if (RECORD_HEAD_SIZE + PLANE_HEAD_SIZE + stored < off) {
            h[4] = STZ_XFORM_NONE, h[5] = 1;
            uint8_t *ph = h + RECORD_HEAD_SIZE;
            ph[0] = (uint8_t)codec;
            ph[1] = ph[2] = ph[3] = 0;
            stz_put_le32(ph + 4, (uint32_t)stored);
            memcpy(h + RECORD_HEAD_SIZE + PLANE_HEAD_SIZE, trial, stored);
            *rec_len = RECORD_HEAD_SIZE + PLANE_HEAD_SIZE + stored;
        }
    }
    return STZ_OK;
}

/* Sink: waits until chunk i has arrived, and returns its bytes. */
static const uint8_t *ring_take(pack_ctx *c, size_t i)
{
    pthread_mutex_lock(&c->lock);
    while (c->filled <= i && !c->stop)
        pthread_cond_wait(&c->cv, &c->lock);
    int ok = c->filled > i;
    pthread_mutex_unlock(&c->lock);
    return ok ? c->ring[i % c->nring] : NULL;
}

/* Sink: chunk i's slot takes chunk i + nring next. */
static void ring_release(pack_ctx *c, size_t i)
{
    pthread_mutex_lock(&c->lock);
    c->next_use[i % c->nring] = i + c->nring;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

static stz_status pack_work(void *vctx, int tid, size_t i, stz_err *err)
{
    pack_ctx *c = (pack_ctx *)vctx;
    thread_buf *b = &c->tb[tid];
    const stz_chunk_info *ch = &c->chunks[i];
    const stz_span *t = &c->spans[ch->tensor];
    const uint8_t *raw = b->raw;
    stz_status st;
    if (c->r) {
        const stz_tensor *rt = stz_reader_tensor(c->r, ch->tensor);
        if ((st = stz_reader_read(c->r, rt, ch->data_offset - rt->begin, b->raw, ch->raw_size, err)))
            return st;
    } else if (!(raw = ring_take(c, i))) {
        return stz_err_set(err, STZ_E_INTERRUPTED, "%s: stopped", c->label);
    }
    stz_err sub;
    st = encode_chunk(&b->enc, c->p, t->dtype, t->end - t->begin, raw, ch->raw_size, b->planes, b->rec, &b->rec_len,
                      &sub);
    c->hashes[i] = XXH3_64bits(raw, ch->raw_size);
    if (!c->r)
        ring_release(c, i);
    if (st)
        return stz_err_set(err, st, "%s: tensor %u of the file: %s", c->label, ch->tensor, sub.msg);
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

stz_status stz_pack_tensor_bytes(const stz_pack_params *p, stz_dtype dtype, const uint8_t *data, uint64_t n,
                                 uint64_t *bytes, stz_err *err)
{
    *bytes = 0;
    size_t cs = p->chunk_size;
    stz_plane_enc enc;
    stz_status st = stz_plane_enc_init(&enc, err);
    if (st)
        return st;
    uint8_t *pbuf = malloc(stz_planes_bound(cs)), *rec = malloc(stz_record_bound(cs));
    if (!pbuf || !rec)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (uint64_t off = 0; !st && off < n; off += cs) {
        size_t k = n - off < cs ? (size_t)(n - off) : cs, len;
        if (!(st = encode_chunk(&enc, p, dtype, n, data + off, k, pbuf, rec, &len, err)))
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

/* File header + the original SafeTensors header img[orig] (its 8-byte
 * length, then the JSON), zstd-compressed. */
static stz_status write_head(pack_ctx *c, const uint8_t *img, size_t orig, stz_err *err)
{
    size_t cap = ZSTD_compressBound(orig);
    uint8_t *z = malloc(cap), fh[FILE_HEADER_SIZE] = {0};
    if (!z)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a %zu-byte header", orig);
    size_t zs = ZSTD_compress(z, cap, img, orig, HEADER_ZSTD_LEVEL);
    int zipped = !ZSTD_isError(zs) && zs < orig;
    memcpy(fh, STZ_MAGIC, 8);
    stz_put_le16(fh + 8, STZ_PACK_FORMAT_VERSION);
    stz_put_le16(fh + 10, 0);
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
        stz_put_le32(e + 28, 0);
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

/* Chunks never straddle tensors, so every chunk has one dtype. */
static stz_status plan_chunks(pack_ctx *c, size_t nt, stz_err *err)
{
    uint32_t cs = c->p->chunk_size;
    size_t n = 0;
    for (size_t i = 0; i < nt; i++)
        n += (size_t)((c->spans[i].end - c->spans[i].begin + cs - 1) / cs);
    c->chunks = calloc(n + 1, sizeof *c->chunks);
    c->hashes = calloc(n + 1, sizeof *c->hashes);
    if (!c->chunks || !c->hashes)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu chunks", n);
    for (size_t i = 0; i < nt; i++) {
        const stz_span *t = &c->spans[i];
        for (uint64_t off = t->begin; off < t->end; off += cs)
            c->chunks[c->n++] = (stz_chunk_info){.tensor = (uint32_t)i,
                                                 .data_offset = off,
                                                 .raw_size = (uint32_t)(t->end - off < cs ? t->end - off : cs)};
    }
    c->pl = (stz_pipeline){.n = c->n, .threads = c->p->threads, .ctx = c, .work = pack_work, .commit = pack_commit,
                           .post = pack_post};
    return STZ_OK;
}

/* Checks the parameters, opens the output, makes the thread buffers. */
static stz_status pack_open(pack_ctx *c, const stz_pack_params *p, const char *out, stz_err *err)
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
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (int t = 0; t < p->threads; t++) {
        thread_buf *b = &c->tb[t];
        b->raw = malloc(p->chunk_size);
        b->planes = malloc(stz_planes_bound(p->chunk_size));
        b->rec = malloc(stz_record_bound(p->chunk_size));
        if (!b->raw || !b->planes || !b->rec)
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

/* The index and trailer after the records, then the output renamed into place. */
static stz_status pack_finish(pack_ctx *c, stz_pack_stats *stats, stz_err *err)
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

static void pack_close(pack_ctx *c)
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
    free(c->next_use);
}

stz_status stz_pack_file(const stz_pack_params *p, const char *in, const char *out, stz_pack_stats *stats,
                         stz_err *err)
{
    pack_ctx c;
    stz_reader *r = NULL;
    uint8_t *img = NULL;
    stz_status st;
    if ((st = stz_reader_open(&r, in, err)))
        return st;
    if (strcmp(out, "-") && (st = stz_refuse_input_as_output(in, out, err))) {
        stz_reader_free(r);
        return st;
    }
    if ((st = pack_open(&c, p, out, err)))
        goto cleanup;
    c.r = r, c.label = in;
    size_t nt = stz_reader_count(r), hlen;
    stz_reader_header(r, &hlen);
    c.orig_size = stz_reader_file_size(r);
    if (!(c.spans = malloc((nt + 1) * sizeof *c.spans)) || !(img = malloc(8 + hlen))) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        c.spans[i] = (stz_span){t->dtype, t->begin, t->end};
    }
    if ((st = plan_chunks(&c, nt, err)) || (st = stz_reader_pread(r, 0, img, 8 + hlen, err)) ||
        (st = write_head(&c, img, 8 + hlen, err)))
        goto cleanup;
    c.pl.progress = p->progress, c.pl.progress_user = p->progress_user;
    c.pl.total = c.orig_size - stz_reader_data_offset(r);
    if (!(st = stz_pipeline_run(&c.pl, err)))
        st = pack_finish(&c, stats, err);
cleanup:
    pack_close(&c);
    free(img);
    stz_reader_free(r);
    return st;
}

/* ---- the container encoder as a SafeTensors writer's sink ------------- */

struct stz_pack_sink {
    pack_ctx c;
    stz_pack_params p;
    stz_wsink ws;
    char *path;
    stz_pack_stats stats;
};

static void *sink_thread(void *v)
{
    pack_ctx *c = (pack_ctx *)v;
    stz_status st = stz_pipeline_run(&c->pl, &c->pl_err);
    pthread_mutex_lock(&c->lock);
    c->pl_status = st, c->done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static stz_status sink_begin(void *user, const uint8_t *head, size_t len, const stz_span *t, size_t nt, stz_err *err)
{
    pack_ctx *c = &((stz_pack_sink *)user)->c;
    uint64_t data = 0;
    for (size_t i = 0; i < nt; i++)
        data += t[i].end - t[i].begin;
    c->orig_size = len + data;
    if (!(c->spans = malloc((nt + 1) * sizeof *c->spans)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    memcpy(c->spans, t, nt * sizeof *t);
    stz_status st = plan_chunks(c, nt, err);
    if (st || (st = write_head(c, head, len, err)))
        return st;
    c->nring = 2 * (size_t)c->p->threads + 2; /* the producer runs ahead of every encoding thread */
    c->ring = calloc(c->nring, sizeof *c->ring);
    c->next_use = calloc(c->nring, sizeof *c->next_use);
    for (size_t k = 0; c->ring && c->next_use && k < c->nring; k++)
        if ((c->ring[k] = malloc(c->p->chunk_size)))
            c->next_use[k] = k;
        else
            break;
    if (!c->ring || !c->next_use || !c->ring[c->nring - 1])
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the chunk buffers");
    if (pthread_create(&c->thread, NULL, sink_thread, c))
        return stz_err_set(err, STZ_E_NOMEM, "%s: cannot start the encoding thread", c->label);
    c->running = 1;
    return STZ_OK;
}

/* The encoder's failure, or (status OK) its early end. */
static stz_status sink_failed(pack_ctx *c, stz_err *err)
{
    if (c->pl_status) {
        *err = c->pl_err;
        return c->pl_status;
    }
    return stz_err_set(err, STZ_E_BOUNDS, "%s: more bytes than the header declares", c->label);
}

static stz_status sink_write(void *user, const void *data, size_t n, stz_err *err)
{
    pack_ctx *c = &((stz_pack_sink *)user)->c;
    const uint8_t *d = (const uint8_t *)data;
    while (n) {
        pthread_mutex_lock(&c->lock);
        size_t j = c->filled;
        while (j < c->n && c->next_use[j % c->nring] != j && !c->done)
            pthread_cond_wait(&c->cv, &c->lock);
        int ok = j < c->n && c->next_use[j % c->nring] == j && !c->done;
        pthread_mutex_unlock(&c->lock);
        if (!ok)
            return sink_failed(c, err);
        size_t room = c->chunks[j].raw_size - c->fill, k = n < room ? n : room;
        memcpy(c->ring[j % c->nring] + c->fill, d, k);
        d += k, n -= k, c->fill += k;
        if (c->fill == c->chunks[j].raw_size) {
            pthread_mutex_lock(&c->lock);
            c->filled++, c->fill = 0;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->lock);
        }
    }
    return STZ_OK;
}

static void sink_join(pack_ctx *c)
{
    if (!c->running)
        return;
    pthread_join(c->thread, NULL);
    c->running = 0;
}

static stz_status sink_finish(void *user, stz_err *err)
{
    stz_pack_sink *s = (stz_pack_sink *)user;
    pack_ctx *c = &s->c;
    sink_join(c);
    if (c->pl_status || c->filled != c->n)
        return c->pl_status ? sink_failed(c, err)
                            : stz_err_set(err, STZ_E_BOUNDS, "%s: %zu of %zu chunks written", c->label, c->filled, c->n);
    return pack_finish(c, &s->stats, err);
}

stz_status stz_pack_sink_open(stz_pack_sink **out, const stz_pack_params *p, const char *path, stz_err *err)
{
    *out = NULL;
    stz_pack_sink *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    s->p = *p;
    s->p.progress = NULL; /* the producer reports progress */
    stz_status st = pack_open(&s->c, &s->p, path, err);
    s->c.label = strcmp(path, "-") ? s->path : "standard output";
    pthread_mutex_init(&s->c.lock, NULL);
    pthread_cond_init(&s->c.cv, NULL);
    s->ws = (stz_wsink){.user = s, .begin = sink_begin, .write = sink_write, .finish = sink_finish};
    if (st) {
        stz_pack_sink_free(s);
        return st;
    }
    *out = s;
    return STZ_OK;
}

const stz_wsink *stz_pack_sink_wsink(stz_pack_sink *s) { return &s->ws; }

void stz_pack_sink_stats(const stz_pack_sink *s, stz_pack_stats *stats) { *stats = s->stats; }

void stz_pack_sink_free(stz_pack_sink *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->c.lock);
    s->c.stop = 1; /* encoding threads waiting for a chunk give up */
    pthread_cond_broadcast(&s->c.cv);
    pthread_mutex_unlock(&s->c.lock);
    sink_join(&s->c);
    pack_close(&s->c);
    pthread_mutex_destroy(&s->c.lock);
    pthread_cond_destroy(&s->c.cv);
    free(s->path);
    free(s);
}

/* ---- packing a stream ----------------------------------------------------- */

/* Up to n bytes from fd: fewer only at its end. */
static stz_status read_some(int fd, const char *label, uint8_t *dst, size_t n, size_t *got, stz_err *err)
{
    *got = 0;
    while (*got < n) {
        ssize_t k = read(fd, dst + *got, n - *got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return stz_err_set(err, STZ_E_IO, "%s: read failed: %s", label, strerror(errno));
        if (k == 0)
            break;
        *got += (size_t)k;
    }
    return STZ_OK;
}

stz_status stz_pack_stream(const stz_pack_params *p, int fd, const char *label, const char *out,
                           stz_pack_stats *stats, stz_err *err)
{
    uint8_t len8[8] = {0}, *img = NULL, *buf = NULL;
    stz_reader *r = NULL;
    stz_pack_sink *s = NULL;
    stz_span *spans = NULL;
    size_t got = 0;
    stz_status st = stz_pack_sink_open(&s, p, out, err); /* checks p first */
    if (!st)
        st = read_some(fd, label, len8, 8, &got, err);
    uint64_t hlen = stz_le64(len8);
    if (!st && got < 8)
        st = stz_err_set(err, STZ_E_TRUNCATED, "%s: ended after %zu bytes, before the header's length", label, got);
    else if (!st && hlen > STZ_ST_MAX_HEADER)
        st = stz_err_set(err, STZ_E_HEADER_SIZE, "%s: header length %llu exceeds the limit of %u bytes (not "
                         "SafeTensors?)", label, (unsigned long long)hlen, STZ_ST_MAX_HEADER);
    if (!st && !(img = malloc(8 + hlen)))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a %llu-byte header", (unsigned long long)hlen);
    if (!st) {
        memcpy(img, len8, 8);
        if (!(st = read_some(fd, label, img + 8, hlen, &got, err)) && got < hlen)
            st = stz_err_set(err, STZ_E_TRUNCATED, "%s: ended inside the header (%zu of %llu bytes)", label, got,
                             (unsigned long long)hlen);
    }
    if (!st)
        st = stz_reader_open_header(&r, img, 8 + hlen, 0, label, err);
    size_t nt = r ? stz_reader_count(r) : 0;
    if (!st && (!(spans = malloc((nt + 1) * sizeof *spans)) || !(buf = malloc(p->chunk_size))))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        spans[i] = (stz_span){t->dtype, t->begin, t->end};
    }
    if (!st)
        st = s->ws.begin(s, img, 8 + hlen, spans, nt, err);
    uint64_t total = r ? stz_reader_file_size(r) - 8 - hlen : 0, done = 0;
    while (!st && done < total) { /* the data, in order, to the encoder */
        size_t want = total - done < p->chunk_size ? (size_t)(total - done) : p->chunk_size;
        if (!(st = read_some(fd, label, buf, want, &got, err)) && got < want)
            st = stz_err_set(err, STZ_E_TRUNCATED, "%s: ended after %llu of the %llu data bytes its header declares",
                             label, (unsigned long long)(done + got), (unsigned long long)total);
        if (!st)
            st = s->ws.write(s, buf, want, err);
        done += want;
        if (!st && p->progress && p->progress(p->progress_user, done, total))
            st = stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", label);
    }
    if (!st && !(st = read_some(fd, label, len8, 1, &got, err)) && got)
        st = stz_err_set(err, STZ_E_FORMAT, "%s: bytes after the last tensor's data (not one SafeTensors file)", label);
    if (!st && !(st = s->ws.finish(s, err)) && stats)
        stz_pack_sink_stats(s, stats);
    stz_pack_sink_free(s);
    stz_reader_free(r);
    free(spans), free(buf), free(img);
    return st;
}
