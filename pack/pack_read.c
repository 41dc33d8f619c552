/* Reading containers: decoding, unpack, verify, single-tensor extract,
 * random access to the original file. */
#include "pack_internal.h"
#include "stz_planes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
/* ---- decoding ---------------------------------------------------------- */

typedef struct {
    const stz_container *c;
    const size_t *sel; /* chunk numbers to decode, NULL = all */
    dec_buf *tb;
    stz_outfile *out;    /* NULL for verify */
    uint8_t *mem;        /* or a memory destination (stz_container_read_tensor) */
    uint64_t out_base;   /* output offset of the first byte written */
    uint64_t lo, hi;     /* the data bytes wanted: [lo, hi), written from out_base (memory: from 0) */
    uint64_t *hashes;    /* per decoded chunk */
    stz_chunk_sink sink; /* or each decoded chunk handed to this */
    void *sink_user;
    stz_ordered pl;
} dec_ctx;

/* The planes pl describes, their payloads at src, decoded and merged into
 * the n bytes at out (chunk i's, or one member's: tensor `name`). */
static stz_status decode_planes(const stz_container *c, size_t i, const char *name, dec_buf *b,
                                const stz_chunk_planes *pl, const uint8_t *src, uint8_t *out, uint32_t n, stz_err *err)
{
    const uint8_t *planes[STZ_MAX_PLANES];
    uint8_t *dst = b->planes;
    for (int k = 0; k < pl->nplanes; k++, dst += pl->raw[k - 1]) {
        stz_err sub;
        stz_status st;
        planes[k] = dst;
        if (pl->codec[k] == STZ_CODEC_RAW && pl->stored[k] == pl->raw[k])
            planes[k] = src; /* no copy: merge reads the record directly */
        else if ((st = stz_plane_decode(b->d, pl->codec[k], src, pl->stored[k], dst, pl->raw[k], &sub)))
            return stz_err_set(err, st, "%s: chunk %zu (tensor '%s', plane %d): %s", c->path, i, name, k, sub.msg);
        src += pl->stored[k];
    }
    if (pl->xform == STZ_XFORM_GGML)
        stz_blocks_merge(pl->block_type, pl->phase, planes, n, out);
    else
        stz_xform_merge(pl->xform, planes, n, out);
    return STZ_OK;
}

/* Format 3's members: each tensor of chunk i with bytes, coded alone. */
static stz_status decode_members(const stz_container *c, size_t i, dec_buf *b, stz_err *err)
{
    const stz_chunk_info *ch = &c->chunks[i];
    size_t at = RECORD_HEAD_SIZE;
    for (uint32_t t = ch->tensor; t <= ch->last; t++) {
        const stz_tensor *x = stz_reader_tensor(c->hdr, t);
        uint32_t n = (uint32_t)(x->end - x->begin);
        if (!n)
            continue;
        stz_chunk_planes pl;
        size_t used;
        stz_status st =
            stz_container_parse_member(c, i, x->name, b->rec + at, ch->record_size - at, n, &pl, &used, err);
        const uint8_t *payloads = b->rec + at + MEMBER_HEAD_SIZE + (size_t)pl.nplanes * MEMBER_PLANE_HEAD_SIZE;
        if (st || (st = decode_planes(c, i, x->name, b, &pl, payloads, b->raw + (x->begin - ch->data_offset), n, err)))
            return st;
        at += used;
    }
    if (at != ch->record_size)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): members hold %zu bytes, record %u", c->path,
                           i, stz_reader_tensor(c->hdr, ch->tensor)->name, at, ch->record_size);
    return STZ_OK;
}

/* Decodes chunk i, its record in b->rec, into b->raw and checks it against
 * its record's hash. */
stz_status stz_container_decode_record(const stz_container *c, size_t i, dec_buf *b, stz_err *err)
{
    const stz_chunk_info *ch = &c->chunks[i];
    const char *name = stz_reader_tensor(c->hdr, ch->tensor)->name;
    stz_chunk_planes pl;
    stz_status st = stz_container_parse_record(c, i, b->rec, &pl, err);
    if (!st)
        st = pl.xform == STZ_XFORM_MEMBERS
                 ? decode_members(c, i, b, err)
                 : decode_planes(c, i, name, b, &pl, b->rec + RECORD_HEAD_SIZE + pl.nplanes * PLANE_HEAD_SIZE, b->raw,
                                 ch->raw_size, err);
    if (st)
        return st;
    if (XXH3_64bits(b->raw, ch->raw_size) != stz_le64(b->rec + 16))
        return stz_err_set(err, STZ_E_CHECKSUM,
                           "%s: chunk %zu (tensor '%s', data bytes %llu-%llu): checksum mismatch, data is corrupt",
                           c->path, i, name, (unsigned long long)ch->data_offset,
                           (unsigned long long)(ch->data_offset + ch->raw_size));
    return STZ_OK;
}

/* Reads and decodes chunk i into b->raw, checked. */
static stz_status decode_chunk(const stz_container *c, size_t i, dec_buf *b, stz_err *err)
{
    stz_status st =
        stz_container_cread(c, c->chunks[i].file_offset, b->rec, c->chunks[i].record_size, "chunk record", err);
    return st ? st : stz_container_decode_record(c, i, b, err);
}

/* The part of decoded chunk i that is wanted: its bytes (*src, returned
 * length) and where they go (*at, from the first byte wanted). A chunk
 * small tensors share holds more than one of them wants. */
static size_t wanted(const dec_ctx *x, size_t i, const uint8_t *raw, const uint8_t **src, uint64_t *at)
{
    const stz_chunk_info *ch = &x->c->chunks[x->sel ? x->sel[i] : i];
    uint64_t a = ch->data_offset > x->lo ? ch->data_offset : x->lo, z = ch->data_offset + ch->raw_size;
    z = z < x->hi ? z : x->hi;
    *src = raw + (a - ch->data_offset), *at = a - x->lo;
    return (size_t)(z - a);
}

/* Decode and write in parallel: every chunk's output offset is known. */
static stz_status dec_work(void *vctx, int tid, size_t i, stz_err *err)
{
    dec_ctx *x = (dec_ctx *)vctx;
    size_t ci = x->sel ? x->sel[i] : i;
    stz_status st = decode_chunk(x->c, ci, &x->tb[tid], err);
    if (st)
        return st;
    x->hashes[i] = stz_le64(x->tb[tid].rec + 16);
    const uint8_t *src;
    uint64_t at;
    size_t n = wanted(x, i, x->tb[tid].raw, &src, &at);
    if (x->mem)
        memcpy(x->mem + at, src, n);
    if (x->sink)
        return x->sink(x->sink_user, tid, at, src, n, err);
    return x->out && x->out->path ? stz_outfile_pwrite(x->out, src, n, x->out_base + at, err) : STZ_OK;
}

static stz_status dec_commit(void *vctx, int tid, size_t i, stz_err *err)
{
    dec_ctx *x = (dec_ctx *)vctx;
    x->pl.done += x->c->chunks[x->sel ? x->sel[i] : i].raw_size;
    const uint8_t *src;
    uint64_t at;
    size_t n = wanted(x, i, x->tb[tid].raw, &src, &at);
    return x->out && !x->out->path ? stz_outfile_write(x->out, src, n, err) : STZ_OK; /* in order */
}

/* Decodes the selected chunks (all if sel == NULL), writing them to `out`
 * if given: the whole file, or for a selection its data bytes from lo (the
 * first selected chunk's offset, or a tensor's begin) to hi. A full decode
 * also checks the whole-file digest. */
static stz_status run_decode_with(const stz_unpack_params *p, const stz_container *c, const size_t *sel, size_t nsel,
                                  uint64_t lo, uint64_t hi, stz_outfile *out, uint8_t *mem, dec_buf *pool,
                                  stz_chunk_sink sink, void *user, stz_err *err);
static stz_status run_decode(const stz_unpack_params *p, const stz_container *c, const size_t *sel, size_t nsel,
                             uint64_t lo, uint64_t hi, stz_outfile *out, uint8_t *mem, stz_err *err)
{
    return run_decode_with(p, c, sel, nsel, lo, hi, out, mem, NULL, NULL, NULL, err);
}

/* run_decode with the threads' buffers `pool` (p->threads of them, kept by
 * the caller), or buffers of its own when pool is NULL; each chunk also
 * handed to `sink` if given (offsets from the first selected chunk). */
static stz_status run_decode_with(const stz_unpack_params *p, const stz_container *c, const size_t *sel, size_t nsel,
                                  uint64_t lo, uint64_t hi, stz_outfile *out, uint8_t *mem, dec_buf *pool,
                                  stz_chunk_sink sink, void *user, stz_err *err)
{
    int nt = stz_container_threads(c, p->threads);
    nt = nsel && (size_t)nt > nsel ? (int)nsel : nt;
    dec_ctx x = {.c = c, .sel = sel, .out = out, .mem = mem, .sink = sink, .sink_user = user, .lo = lo, .hi = hi};
    stz_status st = STZ_OK;
    x.tb = pool ? pool : calloc((size_t)nt, sizeof *x.tb);
    x.hashes = calloc(nsel + 1, sizeof *x.hashes);
    if (!x.tb || !x.hashes)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the decoding threads' buffers");
    for (int t = 0; !st && !pool && t < nt; t++)
        st = stz_container_dec_buf_init(&x.tb[t], c->max_raw, err);
    uint64_t total = 0;
    for (size_t i = 0; i < nsel; i++)
        total += c->chunks[sel ? sel[i] : i].raw_size;
    x.out_base = sel ? 0 : c->header_len;
    if (!st && out && !sel)
        st = out->path ? stz_outfile_pwrite(out, c->header_img, c->header_len, 0, err)
                       : stz_outfile_write(out, c->header_img, c->header_len, err);
    if (!st) {
        x.pl = (stz_ordered){.n = nsel,
                             .threads = nt,
                             .ctx = &x,
                             .work = dec_work,
                             .commit = dec_commit,
                             .progress = p->progress,
                             .progress_user = p->progress_user,
                             .total = total};
        st = stz_ordered_run(&x.pl, err);
    }
    if (!st && !sel && stz_pack_digest(XXH3_64bits(c->header_img, c->header_len), x.hashes, nsel) != c->whole_hash)
        st = stz_err_set(err, STZ_E_CHECKSUM, "%s: whole-file checksum mismatch", c->path);
    for (int t = 0; x.tb && !pool && t < nt; t++)
        stz_container_dec_buf_free(&x.tb[t]);
    if (!pool)
        free(x.tb);
    free(x.hashes);
    return st;
}

/* The chunks holding bytes of tensor ti (its own, or one it shares), in order. */
static size_t *tensor_chunks(const stz_container *c, size_t ti, size_t *nsel)
{
    size_t *sel = calloc(c->n + 1, sizeof *sel);
    *nsel = 0;
    for (size_t i = 0; sel && i < c->n; i++)
        if (c->chunks[i].tensor <= ti && ti <= c->chunks[i].last)
            sel[(*nsel)++] = i;
    return sel;
}

static stz_status unpack_to(const stz_unpack_params *p, const char *in, const char *name, const char *out, stz_err *err)
{
    stz_container *c;
    stz_status st = stz_container_open(&c, in, err);
    if (st)
        return st;
    stz_outfile of = STZ_OUTFILE_INIT;
    size_t *sel = NULL, nsel = c->n;
    uint64_t need = c->orig_size, lo = 0, hi = UINT64_MAX;
    if (name) {
        long ti = stz_reader_find(c->hdr, name);
        if (ti < 0) {
            st = stz_err_set(err, STZ_E_ARG, "%s: no tensor named '%s'", in, name);
            goto cleanup;
        }
        if (!(sel = tensor_chunks(c, (size_t)ti, &nsel))) {
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the chunk list");
            goto cleanup;
        }
        lo = stz_reader_tensor(c->hdr, (size_t)ti)->begin, hi = stz_reader_tensor(c->hdr, (size_t)ti)->end;
        need = hi - lo;
    }
    int stream = out && !strcmp(out, "-");
    if (stream) { /* standard output: written in order, each chunk checked first */
        stz_outfile_stdout(&of);
        st = run_decode(p, c, sel, nsel, lo, hi, &of, NULL, err);
        of.fd = -1;
        goto cleanup;
    }
    if (out && (st = stz_refuse_input_as_output(in, out, err)))
        goto cleanup;
    if (out && (st = stz_outfile_open(&of, out, p->write_flags & STZ_WRITE_FORCE, err)))
        goto cleanup;
    /* a small container may declare a huge file: fail now, not when the disk is full */
    char what[512];
    snprintf(what, sizeof what, "unpacking %s", in);
    if (out && (st = stz_check_space(&of, need, what, err)))
        goto cleanup;
    if ((st = run_decode(p, c, sel, nsel, lo, hi, out ? &of : NULL, NULL, err)))
        goto cleanup;
    if (out)
        st = stz_outfile_commit(&of, err);
cleanup:
    stz_outfile_abort(&of);
    free(sel);
    stz_container_free(c);
    return st;
}

stz_status stz_unpack_file(const stz_unpack_params *p, const char *in, const char *out, stz_err *err)
{
    return stz_err_in(err, unpack_to(p, in, NULL, out, err), in);
}

stz_status stz_verify_file(const stz_unpack_params *p, const char *in, stz_err *err)
{
    return stz_err_in(err, unpack_to(p, in, NULL, NULL, err), in);
}

stz_status stz_unpack_tensor(const stz_unpack_params *p, const char *in, const char *name, const char *out,
                             stz_err *err)
{
    return stz_err_in(err, unpack_to(p, in, name, out, err), in);
}

/* The container's own decoding buffers, at least `threads` of them, kept
 * between calls (fresh chunk buffers would be page-faulted in each time). */
static stz_status pool_get(stz_container *c, int threads, stz_err *err)
{
    if (c->cache && c->pool_n >= threads)
        return STZ_OK;
    for (int t = 0; c->cache && t < c->pool_n; t++)
        stz_container_dec_buf_free(&c->cache[t]);
    free(c->cache);
    c->cached = c->n, c->pool_n = 0;
    if (!(c->cache = calloc((size_t)threads, sizeof *c->cache)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the decoding buffers");
    c->pool_n = threads;
    stz_status st = STZ_OK;
    for (int t = 0; !st && t < threads; t++)
        st = stz_container_dec_buf_init(&c->cache[t], c->max_raw, err);
    return st;
}

stz_status stz_container_tensor_map(stz_container *c, const char *name, int threads, stz_chunk_sink sink, void *user,
                                    stz_err *err)
{
    threads = stz_container_threads(c, threads > 64 ? 64 : threads);
    stz_status st = pool_get(c, threads, err);
    if (st)
        return st;
    long ti = stz_reader_find(c->hdr, name);
    if (ti < 0)
        return stz_err_set(err, STZ_E_ARG, "%s: no tensor named '%s'", c->path, name);
    size_t nsel, *sel = tensor_chunks(c, (size_t)ti, &nsel);
    if (!sel)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor's chunk list");
    stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
    p.threads = threads;
    const stz_tensor *t = stz_reader_tensor(c->hdr, (size_t)ti);
    st = run_decode_with(&p, c, sel, nsel, t->begin, t->end, NULL, NULL, c->cache, sink, user, err);
    c->cached = c->n; /* the buffers were used */
    free(sel);
    return st;
}

stz_status stz_container_read_tensor(const stz_container *c, const char *name, void *dst, size_t cap, int threads,
                                     stz_err *err)
{
    stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
    p.threads = threads;
    if (!name) { /* the whole data section, every checksum and the file digest checked */
        uint64_t n = c->orig_size - c->header_len;
        if (cap < n)
            return stz_err_set(err, STZ_E_BOUNDS, "%s: %llu data bytes, the buffer %zu", c->path, (unsigned long long)n,
                               cap);
        return run_decode(&p, c, NULL, c->n, 0, UINT64_MAX, NULL, dst, err);
    }
    long ti = stz_reader_find(c->hdr, name);
    if (ti < 0)
        return stz_err_set(err, STZ_E_ARG, "%s: no tensor named '%s'", c->path, name);
    const stz_tensor *t = stz_reader_tensor(c->hdr, (size_t)ti);
    if (cap < t->end - t->begin)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: tensor '%s' has %llu bytes, the buffer %zu", c->path, name,
                           (unsigned long long)(t->end - t->begin), cap);
    size_t nsel, *sel = tensor_chunks(c, (size_t)ti, &nsel);
    if (!sel)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor's chunk list");
    stz_status st = run_decode(&p, c, sel, nsel, t->begin, t->end, NULL, dst, err);
    free(sel);
    return st;
}

/* ---- random access to the original file --------------------------------- */

/* n bytes at offset off of the original file: the header from memory, data
 * from the chunks that cover it, each decoded and checked (the last one
 * kept for the next read). */
static stz_status read_range(void *user, uint64_t off, void *dst, size_t n, stz_err *err)
{
    stz_container *c = user;
    uint8_t *o = dst;
    if (off < c->header_len) {
        size_t k = off + n < c->header_len ? n : (size_t)(c->header_len - off);
        memcpy(o, c->header_img + off, k);
        o += k, off += k, n -= k;
    }
    uint64_t d = off - c->header_len;
    size_t lo = 0, hi = c->n; /* the first chunk ending after d */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->chunks[mid].data_offset + c->chunks[mid].raw_size <= d)
            lo = mid + 1;
        else
            hi = mid;
    }
    stz_status st = STZ_OK;
    if (n && (st = pool_get(c, c->threads, err)))
        return st;
    for (size_t i = lo; n; i++) {
        const stz_chunk_info *ch = &c->chunks[i];
        if (i >= c->n || ch->data_offset > d)
            return stz_err_set(err, STZ_E_FORMAT, "%s: no chunk holds data byte %llu", c->path, (unsigned long long)d);
        size_t in = (size_t)(d - ch->data_offset), whole = 0, span = 0; /* chunks are contiguous (checked at open) */
        while (!in && c->threads > 1 && i + whole < c->n && span + c->chunks[i + whole].raw_size <= n)
            span += c->chunks[i + whole++].raw_size;
        if (whole >= 2) { /* whole chunks straight into dst, on several threads */
            size_t *sel = malloc(whole * sizeof *sel), k = 0;
            if (!sel)
                return stz_err_set(err, STZ_E_NOMEM, "out of memory for the chunk list");
            for (; k < whole; k++)
                sel[k] = i + k;
            stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
            p.threads = c->threads;
            st = run_decode_with(&p, c, sel, whole, ch->data_offset, UINT64_MAX, NULL, o, c->cache, NULL, NULL, err);
            c->cached = c->n; /* the first buffer was used */
            free(sel);
            if (st)
                return st;
            o += span, d += span, n -= span, i += whole - 1;
            continue;
        }
        if (c->cached != i) {
            c->cached = c->n;
            if ((st = decode_chunk(c, i, c->cache, err)))
                return st;
            c->cached = i;
        }
        size_t k = n < ch->raw_size - in ? n : ch->raw_size - in;
        memcpy(o, c->cache->raw + in, k);
        o += k, d += k, n -= k;
    }
    return STZ_OK;
}

void stz_container_set_threads(stz_container *c, int threads)
{
    c->threads = stz_container_threads(c, threads > 64 ? 64 : threads);
}

const stz_reader *stz_container_data_reader(stz_container *c)
{
    c->cached = c->n;
    c->threads = c->threads < 1 ? 1 : c->threads;
    stz_reader_set_source(c->hdr, read_range, c);
    return c->hdr;
}
