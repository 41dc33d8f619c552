/* Reading containers: validation, unpack, verify, single-tensor extract. */
#include "pack_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

struct stz_container {
    char *path;
    int fd;
    uint64_t size;
    uint32_t chunk_size;
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
    uint64_t spos;          /* bytes read so far */
    uint8_t *tail;
    uint64_t tail_off;
};

typedef struct dec_buf_ {
    uint8_t *rec, *planes, *raw;
    ZSTD_DCtx *d;
} dec_buf;

static stz_status dec_buf_init(dec_buf *b, uint32_t chunk_size, stz_err *err)
{
    b->rec = malloc(stz_record_bound(chunk_size));
    b->planes = malloc(stz_planes_bound(chunk_size));
    b->raw = malloc(chunk_size);
    b->d = ZSTD_createDCtx();
    return b->rec && b->planes && b->raw && b->d ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for chunk buffers");
}

static void dec_buf_free(dec_buf *b)
{
    free(b->rec), free(b->planes), free(b->raw);
    ZSTD_freeDCtx(b->d);
}

/* From a pipe: skips forward to off, then reads n bytes; or from the held tail. */
static stz_status sread(stz_container *c, uint64_t off, void *dst, size_t n, const char *what, stz_err *err)
{
    if (c->tail && off >= c->tail_off && off - c->tail_off <= c->size - c->tail_off &&
        n <= c->size - off) {
        memcpy(dst, c->tail + (off - c->tail_off), n);
        return STZ_OK;
    }
    if (off < c->spos)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %s at offset %llu lies behind what was read (%llu)", c->path, what,
                           (unsigned long long)off, (unsigned long long)c->spos);
    uint8_t skip[4096];
    while (c->spos < off || n) {
        uint8_t *to = c->spos < off ? skip : dst;
        size_t want = c->spos < off ? (size_t)(off - c->spos < sizeof skip ? off - c->spos : sizeof skip) : n;
        ssize_t k = read(c->fd, to, want);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return stz_err_set(err, k ? STZ_E_IO : STZ_E_TRUNCATED, "%s: cannot read %s: %s", c->path, what,
                               k ? strerror(errno) : "the stream ended early");
        c->spos += (uint64_t)k;
        if (to == dst)
            dst = (uint8_t *)dst + k, n -= (size_t)k;
    }
    return STZ_OK;
}

static stz_status cread(const stz_container *c, uint64_t off, void *dst, size_t n, const char *what, stz_err *err)
{
    if (c->stream) /* one reader, in order */
        return sread((stz_container *)c, off, dst, n, what, err);
    if (off > c->size || n > c->size - off)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: %s at offset %llu (%zu bytes) is past the end of the file", c->path,
                           what, (unsigned long long)off, n);
    int e = stz_pread_full(c->fd, dst, n, off);
    if (e)
        return stz_err_set(err, e < 0 ? STZ_E_TRUNCATED : STZ_E_IO, "%s: cannot read %s: %s", c->path, what,
                           e < 0 ? "file shrank" : strerror(e));
    return STZ_OK;
}

int stz_is_container(const char *path)
{
    int fd;
    uint64_t size;
    uint8_t m[8];
    stz_err ignored;
    int yes = stz_open_regular(path, &fd, &size, &ignored) == STZ_OK && stz_pread_full(fd, m, 8, 0) == 0 &&
              memcmp(m, STZ_MAGIC, 8) == 0;
    if (fd >= 0)
        close(fd);
    return yes;
}

/* 1 if n bytes at p are all zero: reserved fields must be, so that a later
 * version can give them a meaning that older readers refuse. */
static int zeros(const uint8_t *p, size_t n)
{
    while (n && !*p)
        p++, n--;
    return n == 0;
}

#define BAD(code, ...) do { st = stz_err_set(err, code, __VA_ARGS__); goto cleanup; } while (0)

static stz_status read_head(stz_container *c, uint64_t *head_end, stz_err *err)
{
    uint8_t fh[FILE_HEADER_SIZE];
    uint8_t *z = NULL;
    stz_status st;
    const char *P = c->path;
    if (c->size < FILE_HEADER_SIZE + TRAILER_SIZE)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: %llu bytes is too short for a container", P,
                           (unsigned long long)c->size);
    if ((st = cread(c, 0, fh, sizeof fh, "file header", err)))
        return st;
    if (memcmp(fh, STZ_MAGIC, 8) != 0)
        return stz_err_set(err, STZ_E_FORMAT, "%s: not an stz container (bad magic)", P);
    if (stz_le64(fh + 56) != XXH3_64bits(fh, 56))
        return stz_err_set(err, STZ_E_CHECKSUM, "%s: file header checksum mismatch", P);
    if (stz_le16(fh + 8) != STZ_PACK_FORMAT_VERSION)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: container format version %u (this stz reads %u)", P,
                           stz_le16(fh + 8), STZ_PACK_FORMAT_VERSION);
    if (!zeros(fh + 10, 2) || !zeros(fh + 41, 7))
        return stz_err_set(err, STZ_E_FORMAT, "%s: reserved bytes of the file header are not zero", P);
    c->chunk_size = stz_le32(fh + 12);
    c->orig_size = stz_le64(fh + 16);
    uint64_t hlen = stz_le64(fh + 24), stored = stz_le64(fh + 32);
    unsigned codec = fh[40];
    if (c->chunk_size < STZ_PACK_MIN_CHUNK || c->chunk_size > STZ_PACK_MAX_CHUNK || c->chunk_size % 8)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk size %u out of range", P, c->chunk_size);
    if (hlen < 8 || hlen > 8 + (uint64_t)STZ_ST_MAX_HEADER || hlen > c->orig_size)
        return stz_err_set(err, STZ_E_FORMAT, "%s: original header length %llu out of range", P,
                           (unsigned long long)hlen);
    /* stz pack stores the header compressed only when that is smaller: never more than hlen bytes */
    if (stored > c->size - FILE_HEADER_SIZE - TRAILER_SIZE || stored > hlen || (codec == HEADER_CODEC_RAW && stored != hlen) ||
        (codec != HEADER_CODEC_RAW && codec != HEADER_CODEC_ZSTD))
        return stz_err_set(err, STZ_E_FORMAT, "%s: header section (codec %u, %llu bytes) is invalid", P, codec,
                           (unsigned long long)stored);
    c->header_len = (size_t)hlen;
    c->header_img = malloc(c->header_len);
    z = malloc((size_t)stored + 1);
    if (!c->header_img || !z)
        BAD(STZ_E_NOMEM, "%s: out of memory for the header", P);
    if ((st = cread(c, FILE_HEADER_SIZE, z, (size_t)stored, "header section", err)))
        goto cleanup;
    if (codec == HEADER_CODEC_RAW) {
        memcpy(c->header_img, z, c->header_len);
    } else {
        ZSTD_DCtx *d = ZSTD_createDCtx();
        stz_err sub;
        st = d ? stz_plane_decode(d, STZ_CODEC_ZSTD, z, (size_t)stored, c->header_img, c->header_len, &sub)
               : stz_err_set(&sub, STZ_E_NOMEM, "out of memory");
        ZSTD_freeDCtx(d);
        if (st)
            BAD(st, "%s: header section: %s", P, sub.msg);
    }
    if (XXH3_64bits(c->header_img, c->header_len) != stz_le64(fh + 48))
        BAD(STZ_E_CHECKSUM, "%s: original header checksum mismatch", P);
    if ((st = stz_reader_open_header(&c->hdr, c->header_img, c->header_len, c->orig_size, P, err)))
        goto cleanup;
    *head_end = FILE_HEADER_SIZE + stored;
cleanup:
    free(z);
    return st;
}

static stz_status read_index(stz_container *c, uint64_t head_end, stz_err *err)
{
    uint8_t tr[TRAILER_SIZE], *ix = NULL;
    const char *P = c->path;
    stz_status st;
    if ((st = cread(c, c->size - TRAILER_SIZE, tr, TRAILER_SIZE, "trailer", err)))
        return st;
    if (memcmp(tr + 32, STZ_END_MAGIC, 8) != 0)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: no end marker: the file is truncated or not a container", P);
    uint64_t ioff = stz_le64(tr), isize = stz_le64(tr + 8);
    c->whole_hash = stz_le64(tr + 24);
    if (ioff < head_end || isize < INDEX_HEAD_SIZE || ioff + isize != c->size - TRAILER_SIZE ||
        (isize - INDEX_HEAD_SIZE) % INDEX_ENTRY_SIZE)
        return stz_err_set(err, STZ_E_FORMAT, "%s: index at %llu (%llu bytes) does not fit the file", P,
                           (unsigned long long)ioff, (unsigned long long)isize);
    ix = malloc((size_t)isize);
    if (!ix)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the index", P);
    if ((st = cread(c, ioff, ix, (size_t)isize, "index", err)))
        goto cleanup;
    if (XXH3_64bits(ix, (size_t)isize) != stz_le64(tr + 16))
        BAD(STZ_E_CHECKSUM, "%s: index checksum mismatch", P);
    c->n = (size_t)((isize - INDEX_HEAD_SIZE) / INDEX_ENTRY_SIZE);
    if (memcmp(ix, "STZI", 4) != 0 || !zeros(ix + 4, 4) || stz_le64(ix + 8) != c->n)
        BAD(STZ_E_FORMAT, "%s: index header is invalid", P);
    c->chunks = calloc(c->n + 1, sizeof *c->chunks);
    if (!c->chunks)
        BAD(STZ_E_NOMEM, "%s: out of memory for %zu chunks", P, c->n);
    /* Chunks must tile the data section and the record area exactly, in
     * order, each inside its own tensor. */
    uint64_t data = stz_reader_data_offset(c->hdr), expect_data = 0, expect_file = head_end;
    uint64_t rec_max = stz_record_bound(c->chunk_size);
    size_t nt = stz_reader_count(c->hdr);
    for (size_t i = 0; i < c->n; i++) {
        const uint8_t *e = ix + INDEX_HEAD_SIZE + i * INDEX_ENTRY_SIZE;
        stz_chunk_info *ch = &c->chunks[i];
        ch->data_offset = stz_le64(e);
        ch->file_offset = stz_le64(e + 8);
        ch->record_size = stz_le32(e + 16);
        ch->raw_size = stz_le32(e + 20);
        ch->tensor = stz_le32(e + 24);
        const stz_tensor *t = ch->tensor < nt ? stz_reader_tensor(c->hdr, ch->tensor) : NULL;
        if (ch->data_offset != expect_data || ch->file_offset != expect_file || !ch->raw_size ||
            ch->raw_size > c->chunk_size || ch->record_size < RECORD_HEAD_SIZE || ch->record_size > rec_max || !t ||
            ch->data_offset < t->begin || ch->data_offset + ch->raw_size > t->end || !zeros(e + 28, 4))
            BAD(STZ_E_FORMAT, "%s: index entry %zu is inconsistent (data offset %llu, record at %llu)", P, i,
                (unsigned long long)ch->data_offset, (unsigned long long)ch->file_offset);
        expect_data += ch->raw_size;
        expect_file += ch->record_size;
    }
    if (expect_data != c->orig_size - data || expect_file != ioff)
        BAD(STZ_E_FORMAT, "%s: chunks cover %llu of %llu data bytes", P, (unsigned long long)expect_data,
            (unsigned long long)(c->orig_size - data));
cleanup:
    free(ix);
    return st;
}

stz_status stz_container_open(stz_container **out, const char *path, stz_err *err)
{
    *out = NULL;
    stz_container *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
    }
    uint64_t head_end = 0;
    stz_status st = stz_open_regular(path, &c->fd, &c->size, err);
    if (!st && !(st = read_head(c, &head_end, err)))
        st = read_index(c, head_end, err);
    if (st) {
        stz_container_free(c);
        return st;
    }
    *out = c;
    return STZ_OK;
}

void stz_container_free(stz_container *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    stz_reader_free(c->hdr);
    for (int t = 0; c->cache && t < c->pool_n; t++)
        dec_buf_free(&c->cache[t]);
    free(c->cache);
    free(c->header_img);
    free(c->chunks);
    free(c->tail);
    free(c->path);
    free(c);
}

const stz_reader *stz_container_header(const stz_container *c) { return c->hdr; }
uint64_t stz_container_file_size(const stz_container *c) { return c->size; }
uint64_t stz_container_original_size(const stz_container *c) { return c->orig_size; }
uint32_t stz_container_chunk_size(const stz_container *c) { return c->chunk_size; }
size_t stz_container_chunk_count(const stz_container *c) { return c->n; }
const stz_chunk_info *stz_container_chunk(const stz_container *c, size_t i) { return i < c->n ? &c->chunks[i] : NULL; }

/* Parses and checks a record head already in rec (record_size bytes). */
static stz_status parse_record(const stz_container *c, size_t i, const uint8_t *rec, stz_chunk_planes *pl,
                               stz_err *err)
{
    const stz_chunk_info *ch = &c->chunks[i];
    const char *name = stz_reader_tensor(c->hdr, ch->tensor)->name;
    if (memcmp(rec, "STZC", 4) != 0)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): bad record magic", c->path, i, name);
    pl->xform = (stz_xform)rec[4];
    pl->nplanes = rec[5];
    unsigned w = stz_xform_width(pl->xform);
    if (!w || (unsigned)pl->nplanes != stz_xform_planes(pl->xform) || stz_le32(rec + 8) != ch->raw_size ||
        ch->raw_size % w || !zeros(rec + 6, 2) || !zeros(rec + 12, 4))
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): invalid transform or size", c->path, i,
                           name);
    uint64_t total = RECORD_HEAD_SIZE + (uint64_t)pl->nplanes * PLANE_HEAD_SIZE;
    for (int k = 0; k < pl->nplanes; k++) {
        const uint8_t *ph = rec + RECORD_HEAD_SIZE + k * PLANE_HEAD_SIZE;
        pl->codec[k] = (stz_codec)ph[0];
        pl->stored[k] = stz_le32(ph + 4);
        pl->raw[k] = ch->raw_size / w;
        total += pl->stored[k];
        if (pl->codec[k] >= STZ_CODEC_COUNT || !zeros(ph + 1, 3))
            return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): unknown codec %u or reserved bytes set",
                               c->path, i, name, ph[0]);
    }
    if (total != ch->record_size)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): planes hold %llu bytes, record %u",
                           c->path, i, name, (unsigned long long)total, ch->record_size);
    return STZ_OK;
}

stz_status stz_container_planes(const stz_container *c, size_t i, stz_chunk_planes *out, stz_err *err)
{
    if (i >= c->n)
        return stz_err_set(err, STZ_E_ARG, "chunk %zu out of range", i);
    uint8_t head[RECORD_HEAD_SIZE + STZ_MAX_PLANES * PLANE_HEAD_SIZE];
    const stz_chunk_info *ch = &c->chunks[i];
    size_t n = ch->record_size < sizeof head ? ch->record_size : sizeof head;
    stz_status st = cread(c, ch->file_offset, head, n, "chunk record", err);
    if (st)
        return st;
    /* parse_record compares sizes against the whole record; only the head
     * is needed, so check it against a copy of the entry. */
    if (n < RECORD_HEAD_SIZE + (size_t)head[5] * PLANE_HEAD_SIZE || head[5] > STZ_MAX_PLANES)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: record head too short", c->path, i);
    return parse_record(c, i, head, out, err);
}

/* ---- decoding ---------------------------------------------------------- */

typedef struct {
    const stz_container *c;
    const size_t *sel;  /* chunk numbers to decode, NULL = all */
    dec_buf *tb;
    stz_outfile *out;   /* NULL for verify */
    uint8_t *mem;       /* or a memory destination (stz_container_read_tensor) */
    uint64_t out_base;  /* output offset of the first decoded byte */
    uint64_t out_skip;  /* data offset of the first decoded byte */
    uint64_t *hashes;   /* per decoded chunk */
    stz_chunk_sink sink; /* or each decoded chunk handed to this */
    void *sink_user;
    stz_pipeline pl;
} dec_ctx;

/* Decodes chunk i, its record in b->rec, into b->raw and checks it against
 * its record's hash. */
static stz_status decode_record(const stz_container *c, size_t i, dec_buf *b, stz_err *err)
{
    const stz_chunk_info *ch = &c->chunks[i];
    const char *name = stz_reader_tensor(c->hdr, ch->tensor)->name;
    stz_chunk_planes pl;
    stz_status st = parse_record(c, i, b->rec, &pl, err);
    if (st)
        return st;
    const uint8_t *src = b->rec + RECORD_HEAD_SIZE + pl.nplanes * PLANE_HEAD_SIZE, *planes[STZ_MAX_PLANES];
    for (int k = 0; k < pl.nplanes; k++) {
        uint8_t *dst = b->planes + (size_t)k * pl.raw[k];
        stz_err sub;
        planes[k] = dst;
        if (pl.codec[k] == STZ_CODEC_RAW && pl.stored[k] == pl.raw[k])
            planes[k] = src; /* no copy: merge reads the record directly */
        else if ((st = stz_plane_decode(b->d, pl.codec[k], src, pl.stored[k], dst, pl.raw[k], &sub)))
            return stz_err_set(err, st, "%s: chunk %zu (tensor '%s', plane %d): %s", c->path, i, name, k, sub.msg);
        src += pl.stored[k];
    }
    stz_xform_merge(pl.xform, planes, ch->raw_size, b->raw);
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
    stz_status st = cread(c, c->chunks[i].file_offset, b->rec, c->chunks[i].record_size, "chunk record", err);
    return st ? st : decode_record(c, i, b, err);
}

/* Decode and write in parallel: every chunk's output offset is known. */
static stz_status dec_work(void *vctx, int tid, size_t i, stz_err *err)
{
    dec_ctx *x = (dec_ctx *)vctx;
    size_t ci = x->sel ? x->sel[i] : i;
    const stz_chunk_info *ch = &x->c->chunks[ci];
    stz_status st = decode_chunk(x->c, ci, &x->tb[tid], err);
    if (st)
        return st;
    x->hashes[i] = stz_le64(x->tb[tid].rec + 16);
    if (x->mem)
        memcpy(x->mem + (ch->data_offset - x->out_skip), x->tb[tid].raw, ch->raw_size);
    if (x->sink)
        return x->sink(x->sink_user, tid, ch->data_offset - x->out_skip, x->tb[tid].raw, ch->raw_size, err);
    return x->out && x->out->path ? stz_outfile_pwrite(x->out, x->tb[tid].raw, ch->raw_size,
                                                       x->out_base + ch->data_offset - x->out_skip, err)
                                   : STZ_OK;
}

static stz_status dec_commit(void *vctx, int tid, size_t i, stz_err *err)
{
    dec_ctx *x = (dec_ctx *)vctx;
    uint32_t n = x->c->chunks[x->sel ? x->sel[i] : i].raw_size;
    x->pl.done += n;
    return x->out && !x->out->path ? stz_outfile_write(x->out, x->tb[tid].raw, n, err) : STZ_OK; /* in order */
}

/* Decodes the selected chunks (all if sel == NULL), writing them to `out`
 * if given: the whole file, or for a selection the bytes from the first
 * selected chunk on. A full decode also checks the whole-file digest. */
static stz_status run_decode_with(const stz_unpack_params *p, const stz_container *c, const size_t *sel, size_t nsel,
                                  stz_outfile *out, uint8_t *mem, dec_buf *pool, stz_chunk_sink sink, void *user,
                                  stz_err *err);
static stz_status run_decode(const stz_unpack_params *p, const stz_container *c, const size_t *sel, size_t nsel,
                             stz_outfile *out, uint8_t *mem, stz_err *err)
{
    return run_decode_with(p, c, sel, nsel, out, mem, NULL, NULL, NULL, err);
}

/* run_decode with the threads' buffers `pool` (p->threads of them, kept by
 * the caller), or buffers of its own when pool is NULL; each chunk also
 * handed to `sink` if given (offsets from the first selected chunk). */
static stz_status run_decode_with(const stz_unpack_params *p, const stz_container *c, const size_t *sel, size_t nsel,
                                  stz_outfile *out, uint8_t *mem, dec_buf *pool, stz_chunk_sink sink, void *user,
                                  stz_err *err)
{
    int nt = p->threads < 1 ? 1 : p->threads > 256 ? 256 : p->threads;
    dec_ctx x = {.c = c, .sel = sel, .out = out, .mem = mem, .sink = sink, .sink_user = user};
    stz_status st = STZ_OK;
    x.tb = pool ? pool : calloc((size_t)nt, sizeof *x.tb);
    x.hashes = calloc(nsel + 1, sizeof *x.hashes);
    if (!x.tb || !x.hashes)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (int t = 0; !st && !pool && t < nt; t++)
        st = dec_buf_init(&x.tb[t], c->chunk_size, err);
    uint64_t total = 0;
    for (size_t i = 0; i < nsel; i++)
        total += c->chunks[sel ? sel[i] : i].raw_size;
    x.out_base = sel ? 0 : c->header_len;
    x.out_skip = sel && nsel ? c->chunks[sel[0]].data_offset : 0;
    if (!st && out && !sel)
        st = out->path ? stz_outfile_pwrite(out, c->header_img, c->header_len, 0, err)
                       : stz_outfile_write(out, c->header_img, c->header_len, err);
    if (!st) {
        x.pl = (stz_pipeline){.n = nsel, .threads = nt, .ctx = &x, .work = dec_work, .commit = dec_commit,
                              .progress = p->progress, .progress_user = p->progress_user, .total = total};
        st = stz_pipeline_run(&x.pl, err);
    }
    if (!st && !sel && stz_pack_digest(XXH3_64bits(c->header_img, c->header_len), x.hashes, nsel) != c->whole_hash)
        st = stz_err_set(err, STZ_E_CHECKSUM, "%s: whole-file checksum mismatch", c->path);
    for (int t = 0; x.tb && !pool && t < nt; t++)
        dec_buf_free(&x.tb[t]);
    if (!pool)
        free(x.tb);
    free(x.hashes);
    return st;
}

static stz_status unpack_to(const stz_unpack_params *p, const char *in, const char *name, const char *out,
                            stz_err *err)
{
    stz_container *c;
    stz_status st = stz_container_open(&c, in, err);
    if (st)
        return st;
    stz_outfile of = STZ_OUTFILE_INIT;
    size_t *sel = NULL, nsel = c->n;
    uint64_t need = c->orig_size;
    if (name) {
        long ti = stz_reader_find(c->hdr, name);
        if (ti < 0) {
            st = stz_err_set(err, STZ_E_ARG, "%s: no tensor named '%s'", in, name);
            goto cleanup;
        }
        sel = calloc(c->n + 1, sizeof *sel);
        if (!sel) {
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
            goto cleanup;
        }
        nsel = 0;
        need = stz_reader_tensor(c->hdr, (size_t)ti)->end - stz_reader_tensor(c->hdr, (size_t)ti)->begin;
        for (size_t i = 0; i < c->n; i++)
            if (c->chunks[i].tensor == (uint32_t)ti)
                sel[nsel++] = i;
    }
    int stream = out && !strcmp(out, "-");
    if (stream) { /* standard output: written in order, each chunk checked first */
        stz_outfile_stdout(&of);
        st = run_decode(p, c, sel, nsel, &of, NULL, err);
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
    if ((st = run_decode(p, c, sel, nsel, out ? &of : NULL, NULL, err)))
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
    return unpack_to(p, in, NULL, out, err);
}

stz_status stz_verify_file(const stz_unpack_params *p, const char *in, stz_err *err)
{
    return unpack_to(p, in, NULL, NULL, err);
}

stz_status stz_unpack_tensor(const stz_unpack_params *p, const char *in, const char *name, const char *out,
                             stz_err *err)
{
    return unpack_to(p, in, name, out, err);
}

/* The container's own decoding buffers, at least `threads` of them, kept
 * between calls (fresh chunk buffers would be page-faulted in each time). */
static stz_status pool_get(stz_container *c, int threads, stz_err *err)
{
    if (c->cache && c->pool_n >= threads)
        return STZ_OK;
    for (int t = 0; c->cache && t < c->pool_n; t++)
        dec_buf_free(&c->cache[t]);
    free(c->cache);
    c->cached = c->n, c->pool_n = 0;
    if (!(c->cache = calloc((size_t)threads, sizeof *c->cache)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    c->pool_n = threads;
    stz_status st = STZ_OK;
    for (int t = 0; !st && t < threads; t++)
        st = dec_buf_init(&c->cache[t], c->chunk_size, err);
    return st;
}

/* The chunks of tensor ti (each lies inside one tensor), in order. */
static size_t *tensor_chunks(const stz_container *c, size_t ti, size_t *nsel)
{
    size_t *sel = calloc(c->n + 1, sizeof *sel);
    *nsel = 0;
    for (size_t i = 0; sel && i < c->n; i++)
        if (c->chunks[i].tensor == (uint32_t)ti)
            sel[(*nsel)++] = i;
    return sel;
}

stz_status stz_container_tensor_map(stz_container *c, const char *name, int threads, stz_chunk_sink sink, void *user,
                                    stz_err *err)
{
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    stz_status st = pool_get(c, threads, err);
    if (st)
        return st;
    long ti = stz_reader_find(c->hdr, name);
    if (ti < 0)
        return stz_err_set(err, STZ_E_ARG, "%s: no tensor named '%s'", c->path, name);
    size_t nsel, *sel = tensor_chunks(c, (size_t)ti, &nsel);
    if (!sel)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
    p.threads = threads;
    st = run_decode_with(&p, c, sel, nsel, NULL, NULL, c->cache, sink, user, err);
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
            return stz_err_set(err, STZ_E_BOUNDS, "%s: %llu data bytes, the buffer %zu", c->path,
                               (unsigned long long)n, cap);
        return run_decode(&p, c, NULL, c->n, NULL, dst, err);
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
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    stz_status st = run_decode(&p, c, sel, nsel, NULL, dst, err);
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
                return stz_err_set(err, STZ_E_NOMEM, "out of memory");
            for (; k < whole; k++)
                sel[k] = i + k;
            stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
            p.threads = c->threads;
            st = run_decode_with(&p, c, sel, whole, NULL, o, c->cache, NULL, NULL, err);
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

void stz_container_set_threads(stz_container *c, int threads) { c->threads = threads < 1 ? 1 : threads > 64 ? 64 : threads; }

const stz_reader *stz_container_data_reader(stz_container *c)
{
    c->cached = c->n;
    c->threads = c->threads < 1 ? 1 : c->threads;
    stz_reader_set_source(c->hdr, read_range, c);
    return c->hdr;
}

/* ---- from a pipe ---------------------------------------------------------- */

/* Reads chunk i's record as it comes (its head says how long it is) and
 * decodes it into b->raw, checked; c->chunks[i] has its place. */
static stz_status stream_record(stz_container *c, size_t i, dec_buf *b, stz_err *err)
{
    stz_chunk_info *ch = &c->chunks[i];
    size_t hl = RECORD_HEAD_SIZE;
    stz_status st = sread(c, c->spos, b->rec, hl, "chunk record", err);
    if (st)
        return st;
    unsigned np = b->rec[5];
    if (np > STZ_MAX_PLANES)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: %u planes", c->path, i, np);
    if ((st = sread(c, c->spos, b->rec + hl, np * PLANE_HEAD_SIZE, "chunk record", err)))
        return st;
    uint64_t total = hl + np * PLANE_HEAD_SIZE;
    for (unsigned k = 0; k < np; k++)
        total += stz_le32(b->rec + hl + k * PLANE_HEAD_SIZE + 4);
    if (total > stz_record_bound(c->chunk_size))
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: a record of %llu bytes", c->path, i,
                           (unsigned long long)total);
    ch->record_size = (uint32_t)total;
    hl += np * PLANE_HEAD_SIZE;
    st = sread(c, c->spos, b->rec + hl, (size_t)total - hl, "chunk record", err);
    return st ? st : decode_record(c, i, b, err);
}

stz_status stz_unpack_stream(const stz_unpack_params *p, int fd, const char *label, const char *out, stz_err *err)
{
    stz_container *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(label))) {
        free(c);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    }
    c->fd = fd, c->stream = 1, c->size = UINT64_MAX;
    stz_outfile of = STZ_OUTFILE_INIT;
    dec_buf b = {0};
    stz_chunk_info *seen = NULL;
    uint64_t *hashes = NULL, head_end = 0, done = 0;
    size_t n = 0, cap = 0;
    stz_status st = read_head(c, &head_end, err);
    if (!st)
        st = dec_buf_init(&b, c->chunk_size, err);
    if (!st && out) {
        if (!strcmp(out, "-"))
            stz_outfile_stdout(&of);
        else if (!(st = stz_outfile_open(&of, out, p->write_flags & STZ_WRITE_FORCE, err)))
            st = stz_check_space(&of, c->orig_size, "unpacking standard input", err);
        if (!st)
            st = stz_outfile_write(&of, c->header_img, c->header_len, err);
    }
    /* the chunks follow from the header: every tensor cut at the chunk size, in data order; the list
     * grows as records come, so a header declaring a huge model costs nothing until its bytes do */
    for (size_t t = 0; !st && t < stz_reader_count(c->hdr); t++) {
        const stz_tensor *x = stz_reader_tensor(c->hdr, t);
        for (uint64_t off = x->begin; !st && off < x->end; off += c->chunk_size, n++) {
            if (n == cap) {
                stz_chunk_info *g = realloc(seen, (cap = cap ? 2 * cap : 64) * sizeof *g);
                uint64_t *h = realloc(hashes, cap * sizeof *h);
                seen = g ? g : seen, hashes = h ? h : hashes;
                if (!g || !h) {
                    st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the chunk list");
                    break;
                }
            }
            seen[n] = (stz_chunk_info){.tensor = (uint32_t)t, .data_offset = off, .file_offset = c->spos,
                                       .raw_size = (uint32_t)(x->end - off < c->chunk_size ? x->end - off
                                                                                            : c->chunk_size)};
            c->chunks = seen, c->n = n + 1;
            if ((st = stream_record(c, n, &b, err)) ||
                (out && (st = stz_outfile_write(&of, b.raw, seen[n].raw_size, err))))
                break;
            hashes[n] = stz_le64(b.rec + 16);
            done += seen[n].raw_size;
            if (p->progress && p->progress(p->progress_user, done, c->orig_size - c->header_len))
                st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        }
    }
    /* then the index and the trailer, checked as in a file, and against what came */
    if (!st) {
        size_t tl = INDEX_HEAD_SIZE + n * INDEX_ENTRY_SIZE + TRAILER_SIZE;
        uint8_t *tail = malloc(tl);
        c->tail_off = c->spos;
        if (!tail)
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        else if ((st = sread(c, c->spos, tail, tl, "index and trailer", err)))
            free(tail);
        else {
            c->tail = tail, c->size = c->tail_off + tl; /* cread serves the index and trailer from here */
            c->chunks = NULL; /* read_index rebuilds them from the index */
            st = read_index(c, head_end, err);
            for (size_t i = 0; !st && i < n; i++) {
                const stz_chunk_info *a = &c->chunks[i], *z = &seen[i];
                if (a->file_offset != z->file_offset || a->record_size != z->record_size ||
                    a->data_offset != z->data_offset || a->raw_size != z->raw_size || a->tensor != z->tensor)
                    st = stz_err_set(err, STZ_E_FORMAT, "%s: index entry %zu does not match the record that came",
                                     label, i);
            }
            free(c->chunks);
        }
    }
    c->chunks = seen;
    uint8_t extra;
    if (!st && read(fd, &extra, 1) > 0)
        st = stz_err_set(err, STZ_E_FORMAT, "%s: bytes after the container's end", label);
    if (!st && stz_pack_digest(XXH3_64bits(c->header_img, c->header_len), hashes, n) != c->whole_hash)
        st = stz_err_set(err, STZ_E_CHECKSUM, "%s: whole-file checksum mismatch", label);
    if (!st && out)
        st = stz_outfile_commit(&of, err);
    if (!of.path)
        of.fd = -1; /* standard output stays open */
    stz_outfile_abort(&of);
    dec_buf_free(&b);
    free(hashes);
    c->fd = -1; /* the caller's */
    stz_container_free(c);
    return st;
}
