/* Opening containers: the file header, the original SafeTensors (or GGUF)
 * header, the index and trailer, all checked; chunk records' plane tables. */
#include "pack_internal.h"
#include "stz_planes.h"
#include "gguf/gguf_layout.h"
#include "safetensors/st_reader.h"
#include "safetensors/st_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

stz_status stz_container_dec_buf_init(dec_buf *b, uint32_t chunk_size, stz_err *err)
{
    b->rec = malloc(stz_record_bound(chunk_size));
    b->planes = malloc(stz_planes_bound(chunk_size));
    b->raw = malloc(chunk_size);
    b->d = ZSTD_createDCtx();
    return b->rec && b->planes && b->raw && b->d ? STZ_OK
                                                 : stz_err_set(err, STZ_E_NOMEM, "out of memory for chunk buffers");
}

int stz_container_threads(const stz_container *c, int threads)
{
    size_t per = stz_record_bound(c->max_raw) + stz_planes_bound(c->max_raw) + c->max_raw;
    size_t cap = STZ_DECODE_MEMORY / per;
    threads = threads < 1 ? 1 : threads > 256 ? 256 : threads;
    return (size_t)threads <= cap ? threads : cap ? (int)cap : 1;
}

void stz_container_dec_buf_free(dec_buf *b)
{
    free(b->rec), free(b->planes), free(b->raw);
    ZSTD_freeDCtx(b->d);
}

/* From a pipe: skips forward to off, then reads n bytes; or from the held tail. */
stz_status stz_container_sread(stz_container *c, uint64_t off, void *dst, size_t n, const char *what, stz_err *err)
{
    if (c->tail && off >= c->tail_off && off - c->tail_off <= c->size - c->tail_off && n <= c->size - off) {
        memcpy(dst, c->tail + (off - c->tail_off), n);
        return STZ_OK;
    }
    if (off < c->spos)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %s at offset %llu lies behind what was read (%llu)", c->path, what,
                           (unsigned long long)off, (unsigned long long)c->spos);
    uint8_t skip[4096];
    while (c->spos < off || n) {
        uint8_t *to = c->spos < off ? skip : dst;
        size_t want = c->spos < off ? (size_t)(off - c->spos < sizeof skip ? off - c->spos : sizeof skip) : n, got;
        int e = stz_read_some(c->fd, to, want, &got);
        if (e || got < want)
            return stz_err_set(err,
                               e == EINTR ? STZ_E_INTERRUPTED
                               : e        ? STZ_E_IO
                                          : STZ_E_TRUNCATED,
                               "%s: cannot read %s: %s", c->path, what,
                               e == EINTR ? "interrupted"
                               : e        ? strerror(e)
                                          : "the stream ended early");
        c->spos += (uint64_t)got;
        if (to == dst)
            dst = (uint8_t *)dst + got, n -= got;
    }
    return STZ_OK;
}

stz_status stz_container_cread(const stz_container *c, uint64_t off, void *dst, size_t n, const char *what,
                               stz_err *err)
{
    if (c->stream) /* one reader, in order */
        return stz_container_sread((stz_container *)c, off, dst, n, what, err);
    if (off > c->size || n > c->size - off)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: %s at offset %llu (%zu bytes) is past the end of the file",
                           c->path, what, (unsigned long long)off, n);
    int e = stz_pread_full(c->fd, dst, n, off);
    if (e)
        return stz_err_set(err, e < 0 ? STZ_E_TRUNCATED : STZ_E_IO, "%s: cannot read %s: %s", c->path, what,
                           e < 0 ? "file shrank" : strerror(e));
    return STZ_OK;
}

int stz_is_container(const char *path) { return stz_has_magic(path, STZ_MAGIC, 8); }

/* The original GGUF's header, read leniently as pack read it, as c->hdr:
 * a reader of its spans. */
static stz_status gguf_header(stz_container *c, stz_err *err)
{
    stz_gguf *g = NULL;
    stz_span *spans = NULL;
    size_t n = 0;
    stz_status st = stz_gguf_parse_layout(&g, c->header_img, c->header_len, c->orig_size, c->path, err);
    if (!st && !(st = stz_gguf_spans(g, &spans, &n, err)))
        st = stz_reader_open_spans(&c->hdr, c->path, -1, c->orig_size, c->header_len, spans, n, err);
    free(spans);
    stz_gguf_free(g);
    return st;
}

/* 1 if n bytes at p are all zero: reserved fields must be, so that a later
 * version can give them a meaning that older readers refuse. */
static int zeros(const uint8_t *p, size_t n)
{
    while (n && !*p)
        p++, n--;
    return n == 0;
}

/* The cut's view of a container's tensors (stz_span_bounds). */
uint64_t stz_container_tensor_bounds(const void *src, size_t t, uint64_t *begin)
{
    const stz_tensor *x = stz_reader_tensor((const stz_reader *)src, t);
    *begin = x->begin;
    return x->end;
}

#define BAD(code, ...)                                                                                                 \
    do {                                                                                                               \
        st = stz_err_set(err, code, __VA_ARGS__);                                                                      \
        goto cleanup;                                                                                                  \
    } while (0)

stz_status stz_container_read_head(stz_container *c, uint64_t *head_end, stz_err *err)
{
    uint8_t fh[FILE_HEADER_SIZE];
    uint8_t *z = NULL;
    stz_status st;
    const char *P = c->path;
    if (c->size < FILE_HEADER_SIZE + TRAILER_SIZE)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: %llu bytes is too short for a container", P,
                           (unsigned long long)c->size);
    if ((st = stz_container_cread(c, 0, fh, sizeof fh, "file header", err)))
        return st;
    if (memcmp(fh, STZ_MAGIC, 8) != 0) {
        const char *kind = stz_file_kind(fh, sizeof fh);
        return stz_err_set(err, STZ_E_FORMAT, "%s: %s", P, kind ? kind : "not an stz container (bad magic)");
    }
    if (stz_le64(fh + 56) != XXH3_64bits(fh, 56))
        return stz_err_set(err, STZ_E_CHECKSUM, "%s: file header checksum mismatch", P);
    c->version = stz_le16(fh + 8);
    if (c->version < 1 || c->version > STZ_PACK_FORMAT_VERSION)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: container format version %u (this stz reads 1 to %u)", P,
                           c->version, STZ_PACK_FORMAT_VERSION);
    if ((fh[10] & ~STZ_ORIG_GGUF) || fh[11] || !zeros(fh + 41, 7))
        return stz_err_set(err, STZ_E_FORMAT, "%s: reserved bytes of the file header are not zero", P);
    c->gguf = fh[10] & STZ_ORIG_GGUF;
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
    if (stored > c->size - FILE_HEADER_SIZE - TRAILER_SIZE || stored > hlen ||
        (codec == HEADER_CODEC_RAW && stored != hlen) || (codec != HEADER_CODEC_RAW && codec != HEADER_CODEC_ZSTD))
        return stz_err_set(err, STZ_E_FORMAT, "%s: header section (codec %u, %llu bytes) is invalid", P, codec,
                           (unsigned long long)stored);
    c->header_len = (size_t)hlen;
    c->header_img = malloc(c->header_len);
    z = malloc((size_t)stored + 1);
    if (!c->header_img || !z)
        BAD(STZ_E_NOMEM, "%s: out of memory for the header", P);
    if ((st = stz_container_cread(c, FILE_HEADER_SIZE, z, (size_t)stored, "header section", err)))
        goto cleanup;
    if (codec == HEADER_CODEC_RAW) {
        memcpy(c->header_img, z, c->header_len);
    } else {
        ZSTD_DCtx *d = ZSTD_createDCtx();
        stz_err sub;
        st = d ? stz_plane_decode(d, STZ_CODEC_ZSTD, z, (size_t)stored, c->header_img, c->header_len, &sub)
               : stz_err_set(&sub, STZ_E_NOMEM, "out of memory for a zstd context for the header");
        ZSTD_freeDCtx(d);
        if (st)
            BAD(st, "%s: header section: %s", P, sub.msg);
    }
    if (XXH3_64bits(c->header_img, c->header_len) != stz_le64(fh + 48))
        BAD(STZ_E_CHECKSUM, "%s: original header checksum mismatch", P);
    st = c->gguf ? gguf_header(c, err)
                 : stz_reader_open_header(&c->hdr, c->header_img, c->header_len, c->orig_size, P, err);
    if (st)
        goto cleanup;
    *head_end = FILE_HEADER_SIZE + stored;
cleanup:
    free(z);
    return st;
}

stz_status stz_container_read_index(stz_container *c, uint64_t head_end, stz_err *err)
{
    uint8_t tr[TRAILER_SIZE], *ix = NULL;
    const char *P = c->path;
    stz_status st;
    if ((st = stz_container_cread(c, c->size - TRAILER_SIZE, tr, TRAILER_SIZE, "trailer", err)))
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
    if ((st = stz_container_cread(c, ioff, ix, (size_t)isize, "index", err)))
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
     * order, cut as the writer cuts (which reading from a pipe relies on). */
    uint64_t data = stz_reader_data_offset(c->hdr), expect_data = 0, expect_file = head_end;
    size_t nt = stz_reader_count(c->hdr);
    stz_cut cut = {0, 0};
    stz_chunk_info want;
    c->max_raw = 64;
    for (size_t i = 0; i < c->n; i++) {
        const uint8_t *e = ix + INDEX_HEAD_SIZE + i * INDEX_ENTRY_SIZE;
        stz_chunk_info *ch = &c->chunks[i];
        ch->data_offset = stz_le64(e);
        ch->file_offset = stz_le64(e + 8);
        ch->record_size = stz_le32(e + 16);
        ch->raw_size = stz_le32(e + 20);
        ch->tensor = stz_le32(e + 24);
        ch->last = ch->tensor + stz_le32(e + 28); /* format 1: 0 */
        if (!stz_cut_place(&cut, c->hdr, nt, stz_container_tensor_bounds, c->chunk_size, c->version, ch->raw_size,
                           &want) ||
            want.tensor != ch->tensor || want.last != ch->last || want.data_offset != ch->data_offset ||
            want.raw_size != ch->raw_size || ch->data_offset != expect_data || ch->file_offset != expect_file ||
            ch->record_size < RECORD_HEAD_SIZE || ch->record_size > stz_record_bound(ch->raw_size) ||
            ch->raw_size > c->chunk_size)
            BAD(STZ_E_FORMAT, "%s: index entry %zu is inconsistent (data offset %llu, record at %llu)", P, i,
                (unsigned long long)ch->data_offset, (unsigned long long)ch->file_offset);
        expect_data += ch->raw_size;
        expect_file += ch->record_size;
        c->max_raw = ch->raw_size > c->max_raw ? ch->raw_size : c->max_raw;
    }
    if (expect_data != c->orig_size - data || expect_file != ioff)
        BAD(STZ_E_FORMAT, "%s: chunks cover %llu of %llu data bytes", P, (unsigned long long)expect_data,
            (unsigned long long)(c->orig_size - data));
cleanup:
    free(ix);
    return st;
}

static stz_status container_open(stz_container **out, const char *path, stz_err *err);

stz_status stz_container_open(stz_container **out, const char *path, stz_err *err)
{
    return stz_err_in(err, container_open(out, path, err), path);
}

static stz_status container_open(stz_container **out, const char *path, stz_err *err)
{
    *out = NULL;
    stz_container *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
    }
    uint64_t head_end = 0;
    stz_status st = stz_open_regular(path, &c->fd, &c->size, err);
    if (!st && !(st = stz_container_read_head(c, &head_end, err)))
        st = stz_container_read_index(c, head_end, err);
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
        stz_container_dec_buf_free(&c->cache[t]);
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
const uint8_t *stz_container_original_header(const stz_container *c, size_t *len, int *gguf)
{
    *len = c->header_len, *gguf = c->gguf;
    return c->header_img;
}
uint32_t stz_container_chunk_size(const stz_container *c) { return c->chunk_size; }
unsigned stz_container_format_version(const stz_container *c) { return c->version; }
size_t stz_container_chunk_count(const stz_container *c) { return c->n; }
const stz_chunk_info *stz_container_chunk(const stz_container *c, size_t i) { return i < c->n ? &c->chunks[i] : NULL; }

/* The planes transform pl->xform (block type and phase set) makes of n
 * bytes: their count, raw sizes into pl->raw; 0 if it cannot hold them. */
static int expected_planes(stz_chunk_planes *pl, uint32_t n)
{
    unsigned w = stz_xform_width(pl->xform);
    if (!w || n % w || pl->xform == STZ_XFORM_MEMBERS)
        return 0;
    if (pl->xform == STZ_XFORM_GGML)
        return stz_blocks_planes(pl->block_type, pl->phase, n, pl->raw);
    int np = (int)stz_xform_planes(pl->xform);
    for (int k = 0; k < np; k++)
        pl->raw[k] = n / w;
    return np;
}

/* A codec this file's version has (codec 4 came with format 3). */
static int codec_known(const stz_container *c, unsigned codec)
{
    return codec < STZ_CODEC_COUNT && (codec != STZ_CODEC_AC || c->version >= 3);
}

/* Format 3's members record: it holds its tensors' bytes whole, each
 * member parsed when decoded (stz_container_parse_member). */
static stz_status parse_members(const stz_container *c, size_t i, const uint8_t *rec, stz_chunk_planes *pl,
                                stz_err *err)
{
    const stz_chunk_info *ch = &c->chunks[i];
    const stz_tensor *first = stz_reader_tensor(c->hdr, ch->tensor), *last = stz_reader_tensor(c->hdr, ch->last);
    pl->nplanes = 0;
    if (c->version < 3 || rec[5] || rec[6] || rec[7] || stz_le32(rec + 12) != ch->record_size ||
        stz_le32(rec + 8) != ch->raw_size || ch->data_offset != first->begin ||
        ch->data_offset + ch->raw_size != last->end)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): invalid members record", c->path, i,
                           first->name);
    return STZ_OK;
}

/* Parses and checks a record head already in rec (record_size bytes). */
stz_status stz_container_parse_record(const stz_container *c, size_t i, const uint8_t *rec, stz_chunk_planes *pl,
                                      stz_err *err)
{
    const stz_chunk_info *ch = &c->chunks[i];
    const char *name = stz_reader_tensor(c->hdr, ch->tensor)->name;
    if (memcmp(rec, "STZC", 4) != 0)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): bad record magic", c->path, i, name);
    pl->xform = (stz_xform)rec[4];
    pl->nplanes = rec[5];
    pl->block_type = pl->xform == STZ_XFORM_GGML ? rec[6] : 0;
    pl->phase = pl->xform == STZ_XFORM_GGML ? stz_le32(rec + 12) : 0;
    if (pl->xform == STZ_XFORM_MEMBERS)
        return parse_members(c, i, rec, pl, err);
    int np = expected_planes(pl, ch->raw_size);
    uint64_t at = ch->data_offset - stz_reader_tensor(c->hdr, ch->tensor)->begin; /* the chunk's offset in its span */
    if (!np || pl->nplanes != np || stz_le32(rec + 8) != ch->raw_size || rec[7] ||
        (pl->xform != STZ_XFORM_GGML && (rec[6] || !zeros(rec + 12, 4))) ||
        (pl->xform == STZ_XFORM_GGML && pl->phase != stz_blocks_phase(pl->block_type, at)))
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): invalid transform or size", c->path, i,
                           name);
    uint64_t total = RECORD_HEAD_SIZE + (uint64_t)pl->nplanes * PLANE_HEAD_SIZE;
    for (int k = 0; k < pl->nplanes; k++) {
        const uint8_t *ph = rec + RECORD_HEAD_SIZE + k * PLANE_HEAD_SIZE;
        pl->codec[k] = (stz_codec)ph[0];
        pl->stored[k] = stz_le32(ph + 4);
        total += pl->stored[k];
        if (!codec_known(c, ph[0]) || !zeros(ph + 1, 3))
            return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): unknown codec %u or reserved bytes set",
                               c->path, i, name, ph[0]);
    }
    if (total != ch->record_size)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): planes hold %llu bytes, record %u", c->path,
                           i, name, (unsigned long long)total, ch->record_size);
    return STZ_OK;
}

stz_status stz_container_parse_member(const stz_container *c, size_t i, const char *name, const uint8_t *src,
                                      size_t avail, uint32_t n, stz_chunk_planes *pl, size_t *used, stz_err *err)
{
    *pl = (stz_chunk_planes){.xform = avail >= MEMBER_HEAD_SIZE ? (stz_xform)src[0] : STZ_XFORM_MEMBERS};
    pl->nplanes = avail >= MEMBER_HEAD_SIZE ? src[1] : 0;
    pl->block_type = pl->xform == STZ_XFORM_GGML ? src[2] : 0;
    int np = expected_planes(pl, n);
    uint64_t total = MEMBER_HEAD_SIZE + (uint64_t)np * MEMBER_PLANE_HEAD_SIZE;
    if (!np || pl->nplanes != np || total > avail || src[3] || (pl->xform != STZ_XFORM_GGML && src[2]))
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): invalid member head", c->path, i, name);
    for (int k = 0; k < np; k++) {
        const uint8_t *ph = src + MEMBER_HEAD_SIZE + k * MEMBER_PLANE_HEAD_SIZE;
        pl->codec[k] = (stz_codec)ph[0];
        pl->stored[k] = (uint32_t)ph[1] | (uint32_t)ph[2] << 8 | (uint32_t)ph[3] << 16;
        total += pl->stored[k];
        if (!codec_known(c, ph[0]))
            return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu (tensor '%s'): unknown codec %u", c->path, i, name,
                               ph[0]);
    }
    if (total > avail)
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: chunk %zu (tensor '%s'): member of %llu bytes, %zu left in the record", c->path, i,
                           name, (unsigned long long)total, avail);
    *used = (size_t)total;
    return STZ_OK;
}

stz_status stz_container_planes(const stz_container *c, size_t i, stz_chunk_planes *out, stz_err *err)
{
    if (i >= c->n)
        return stz_err_set(err, STZ_E_ARG, "chunk %zu out of range", i);
    uint8_t head[RECORD_HEAD_SIZE + STZ_MAX_PLANES * PLANE_HEAD_SIZE];
    const stz_chunk_info *ch = &c->chunks[i];
    size_t n = ch->record_size < sizeof head ? ch->record_size : sizeof head;
    stz_status st = stz_container_cread(c, ch->file_offset, head, n, "chunk record", err);
    if (st)
        return st;
    /* parse_record compares sizes against the whole record; only the head
     * is needed, so check it against a copy of the entry. */
    if (n < RECORD_HEAD_SIZE + (size_t)head[5] * PLANE_HEAD_SIZE || head[5] > STZ_MAX_PLANES)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: record head too short", c->path, i);
    return stz_container_parse_record(c, i, head, out, err);
}

stz_status stz_container_members(const stz_container *c, size_t i, stz_chunk_planes *out, uint32_t *bytes, size_t cap,
                                 stz_err *err)
{
    if (i >= c->n || c->chunks[i].last - c->chunks[i].tensor >= cap)
        return stz_err_set(err, STZ_E_ARG, "chunk %zu out of range, or room for %zu tensors", i, cap);
    const stz_chunk_info *ch = &c->chunks[i];
    uint8_t *rec = malloc(ch->record_size);
    if (!rec)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a record of %u bytes", ch->record_size);
    stz_chunk_planes pl;
    stz_status st = stz_container_cread(c, ch->file_offset, rec, ch->record_size, "chunk record", err);
    if (!st && !(st = stz_container_parse_record(c, i, rec, &pl, err)) && pl.xform != STZ_XFORM_MEMBERS)
        st = stz_err_set(err, STZ_E_ARG, "%s: chunk %zu holds no members", c->path, i);
    size_t at = RECORD_HEAD_SIZE, used = 0;
    for (uint32_t t = ch->tensor; !st && t <= ch->last; t++, at += used) {
        const stz_tensor *x = stz_reader_tensor(c->hdr, t);
        uint32_t n = (uint32_t)(x->end - x->begin);
        out[t - ch->tensor] = (stz_chunk_planes){.xform = STZ_XFORM_MEMBERS};
        used = 0;
        if (n)
            st = stz_container_parse_member(c, i, x->name, rec + at, ch->record_size - at, n, &out[t - ch->tensor],
                                            &used, err);
        bytes[t - ch->tensor] = (uint32_t)used;
    }
    free(rec);
    return st;
}

/* ---- where each chunk lies -------------------------------------------------------------------------------------- */

int stz_cut_place(stz_cut *cut, const void *src, size_t nt, stz_span_bounds bounds, uint32_t chunk, unsigned version,
                  uint64_t n, stz_chunk_info *ch)
{
    uint64_t b = 0, e = 0;
    for (; cut->t < nt && cut->at >= (e = bounds(src, cut->t, &b)); cut->t++) /* past empty and finished spans */
        ;
    if (cut->t >= nt || !n)
        return 0;
    uint64_t at = cut->at > b ? cut->at : b;
    *ch = (stz_chunk_info){
        .tensor = (uint32_t)cut->t, .last = (uint32_t)cut->t, .data_offset = at, .raw_size = (uint32_t)n};
    if (n == (e - at < chunk ? e - at : chunk)) /* the tensor's own: chunk-size steps from its start */
        return cut->at = at + n, 1;
    if (version < 2 || at != b || n > STZ_GROUP_MAX || n > chunk || n < e - b)
        return 0;
    while (e < b + n && ch->last + 1 < nt) { /* whole small tensors, one after the other */
        uint64_t b2, e2 = bounds(src, ch->last + 1, &b2);
        if (b2 != e)
            return 0;
        ch->last++, e = e2;
    }
    return e == b + n ? (cut->t = ch->last + 1, cut->at = e, 1) : 0;
}
