/* Reading a container from a pipe, in order (stz_unpack_stream). */
#include "pack_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
/* ---- from a pipe ---------------------------------------------------------- */

/* Reads chunk i's record as it comes (its head says how long it is and
 * how many bytes it holds, placed after the cut's) and decodes it into
 * b->raw, checked; c->chunks[i] gets its place. */
static stz_status stream_record(stz_container *c, size_t i, stz_cut *cut, dec_buf *b, stz_err *err)
{
    stz_chunk_info *ch = &c->chunks[i];
    size_t hl = RECORD_HEAD_SIZE;
    uint64_t at = c->spos;
    stz_status st = stz_container_sread(c, c->spos, b->rec, hl, "chunk record", err);
    if (st)
        return st;
    if (!stz_cut_place(cut, c->hdr, stz_reader_count(c->hdr), stz_container_tensor_bounds, c->chunk_size, c->version,
                       stz_le32(b->rec + 8), ch))
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: chunk %zu: a record of %u data bytes, which the header does not cut "
                           "there",
                           c->path, i, stz_le32(b->rec + 8));
    ch->file_offset = at;
    unsigned np = b->rec[5];
    if (np > STZ_MAX_PLANES)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: %u planes", c->path, i, np);
    if ((st = stz_container_sread(c, c->spos, b->rec + hl, np * PLANE_HEAD_SIZE, "chunk record", err)))
        return st;
    uint64_t total = hl + np * PLANE_HEAD_SIZE;
    for (unsigned k = 0; k < np; k++)
        total += stz_le32(b->rec + hl + k * PLANE_HEAD_SIZE + 4);
    if (b->rec[4] == STZ_XFORM_MEMBERS) /* members say their record's size in its head */
        total = stz_le32(b->rec + 12);
    if (total < hl + np * PLANE_HEAD_SIZE)
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: a record of %llu bytes", c->path, i,
                           (unsigned long long)total);
    if (total > stz_record_bound(ch->raw_size))
        return stz_err_set(err, STZ_E_FORMAT, "%s: chunk %zu: a record of %llu bytes", c->path, i,
                           (unsigned long long)total);
    ch->record_size = (uint32_t)total;
    hl += np * PLANE_HEAD_SIZE;
    st = stz_container_sread(c, c->spos, b->rec + hl, (size_t)total - hl, "chunk record", err);
    return st ? st : stz_container_decode_record(c, i, b, err);
}

/* What came through the stream so far: the chunks (the list grows as
 * records come, so a header declaring a huge model costs nothing until its
 * bytes do) and each one's hash. */
typedef struct {
    stz_container *c;
    dec_buf b;
    stz_chunk_info *seen;
    uint64_t *hashes;
    size_t n, cap;
} stream_state;

/* Every chunk the header implies (the writer's cut, in data order),
 * decoded, checked and written to of when out is set. */
static stz_status stream_chunks(stream_state *s, const stz_unpack_params *p, stz_outfile *of, int out, stz_err *err)
{
    stz_container *c = s->c;
    uint64_t done = 0;
    stz_cut cut = {0, 0};
    for (; done < c->orig_size - c->header_len; s->n++) {
        size_t n = s->n;
        if (n == s->cap) {
            stz_chunk_info *g = realloc(s->seen, (s->cap = s->cap ? 2 * s->cap : 64) * sizeof *g);
            uint64_t *h = realloc(s->hashes, s->cap * sizeof *h);
            s->seen = g ? g : s->seen, s->hashes = h ? h : s->hashes;
            if (!g || !h)
                return stz_err_set(err, STZ_E_NOMEM, "out of memory for the chunk list");
        }
        c->chunks = s->seen, c->n = n + 1;
        stz_status st = stream_record(c, n, &cut, &s->b, err);
        if (!st && out)
            st = stz_outfile_write(of, s->b.raw, s->seen[n].raw_size, err);
        if (st)
            return st;
        s->hashes[n] = stz_le64(s->b.rec + 16);
        done += s->seen[n].raw_size;
        if (p->progress && p->progress(p->progress_user, done, c->orig_size - c->header_len)) {
            s->n++;
            return stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
        }
    }
    return STZ_OK;
}

/* The index and the trailer, checked as in a file, and against the
 * records that came. */
static stz_status check_tail(stream_state *s, uint64_t head_end, const char *label, stz_err *err)
{
    stz_container *c = s->c;
    size_t tl = INDEX_HEAD_SIZE + s->n * INDEX_ENTRY_SIZE + TRAILER_SIZE;
    uint8_t *tail = malloc(tl);
    c->tail_off = c->spos;
    if (!tail)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the index and trailer");
    stz_status st = stz_container_sread(c, c->spos, tail, tl, "index and trailer", err);
    if (st) {
        free(tail);
        return st;
    }
    c->tail = tail, c->size = c->tail_off + tl; /* cread serves the index and trailer from here */
    c->chunks = NULL;                           /* read_index rebuilds them from the index */
    st = stz_container_read_index(c, head_end, err);
    for (size_t i = 0; !st && i < s->n; i++) {
        const stz_chunk_info *a = &c->chunks[i], *z = &s->seen[i];
        if (a->file_offset != z->file_offset || a->record_size != z->record_size || a->data_offset != z->data_offset ||
            a->raw_size != z->raw_size || a->tensor != z->tensor || a->last != z->last)
            st = stz_err_set(err, STZ_E_FORMAT, "%s: index entry %zu does not match the record that came", label, i);
    }
    free(c->chunks);
    return st;
}

stz_status stz_unpack_stream(const stz_unpack_params *p, int fd, const char *label, const char *out, stz_err *err)
{
    stz_container *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(label))) {
        free(c);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the container's state");
    }
    c->fd = fd, c->stream = 1, c->size = UINT64_MAX;
    stz_outfile of = STZ_OUTFILE_INIT;
    stream_state s = {.c = c};
    uint64_t head_end = 0;
    stz_status st = stz_container_read_head(c, &head_end, err);
    if (!st)
        st = stz_container_dec_buf_init(&s.b, c->chunk_size, err);
    if (!st && out) {
        if (!strcmp(out, "-"))
            stz_outfile_stdout(&of);
        else if (!(st = stz_outfile_open(&of, out, p->write_flags & STZ_WRITE_FORCE, err)))
            st = stz_check_space(&of, c->orig_size, "unpacking standard input", err);
        if (!st)
            st = stz_outfile_write(&of, c->header_img, c->header_len, err);
    }
    if (!st)
        st = stream_chunks(&s, p, &of, out != NULL, err);
    if (!st)
        st = check_tail(&s, head_end, label, err);
    c->chunks = s.seen;
    uint8_t extra;
    if (!st && read(fd, &extra, 1) > 0)
        st = stz_err_set(err, STZ_E_FORMAT, "%s: bytes after the container's end", label);
    if (!st && stz_pack_digest(XXH3_64bits(c->header_img, c->header_len), s.hashes, s.n) != c->whole_hash)
        st = stz_err_set(err, STZ_E_CHECKSUM, "%s: whole-file checksum mismatch", label);
    if (!st && out)
        st = stz_outfile_commit(&of, err);
    if (!of.path)
        of.fd = -1; /* standard output stays open */
    stz_outfile_abort(&of);
    stz_container_dec_buf_free(&s.b);
    free(s.hashes);
    c->fd = -1; /* the caller's */
    stz_container_free(c);
    return st;
}
