/* The container encoder as a SafeTensors writer's sink (compress streams
 * quantized tensors into it), and packing a stream (standard input). */
#include "pack_write.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the container encoder as a SafeTensors writer's sink ------------- */

#define RING_AHEAD ((size_t)32 << 20)

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
    stz_status st = stz_ordered_run(&c->pl, &c->pl_err);
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
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor spans");
    memcpy(c->spans, t, nt * sizeof *t);
    stz_reader *hdr = NULL; /* the block types of the quantized tensors it declares */
    stz_status st = stz_reader_open_header(&hdr, head, len, 0, c->label, err);
    if (st)
        return st;
    stz_pack_writer_hints(c->spans, nt, hdr);
    stz_reader_free(hdr);
    st = stz_pack_writer_plan_chunks(c, nt, err);
    if (st || (st = stz_pack_writer_write_head(c, head, len, err)))
        return st;
    /* the producer runs ahead of every encoding thread, and goes on while they
     * read a tensor taken by reference (up to RING_AHEAD bytes, 32 chunks, more) */
    size_t ahead = RING_AHEAD / c->p->chunk_size;
    c->nring = 2 * (size_t)c->p->threads + 2 + (ahead < 32 ? ahead : 32);
    c->ring = calloc(c->nring, sizeof *c->ring);
    c->next_use = calloc(c->nring, sizeof *c->next_use);
    c->seq_of = calloc(c->n + 1, sizeof *c->seq_of);
    c->src_r = calloc(c->n + 1, sizeof *c->src_r);
    c->src_t = calloc(c->n + 1, sizeof *c->src_t);
    for (size_t k = 0; c->ring && c->next_use && k < c->nring; k++)
        if ((c->ring[k] = malloc(c->p->chunk_size)))
            c->next_use[k] = k;
        else
            break;
    if (!c->ring || !c->next_use || !c->ring[c->nring - 1] || !c->seq_of || !c->src_r || !c->src_t)
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
        size_t j = c->filled, k = c->seq, slot = k % c->nring;
        while (j < c->n && c->next_use[slot] != k && !c->done)
            pthread_cond_wait(&c->cv, &c->lock);
        int ok = j < c->n && c->next_use[slot] == k && !c->done;
        pthread_mutex_unlock(&c->lock);
        if (!ok)
            return sink_failed(c, err);
        size_t room = c->chunks[j].raw_size - c->fill, m = n < room ? n : room;
        memcpy(c->ring[slot] + c->fill, d, m);
        d += m, n -= m, c->fill += m;
        if (c->fill == c->chunks[j].raw_size) {
            pthread_mutex_lock(&c->lock);
            c->seq_of[j] = k, c->seq++, c->filled++, c->fill = 0;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->lock);
        }
    }
    return STZ_OK;
}

/* A whole tensor's chunks, read by the encoding threads from r: the
 * producer goes on at once. Only at a chunk boundary where the tensor's
 * chunks begin (always so between tensors: chunks never span two). */
static stz_status sink_refer(void *user, const stz_reader *r, const stz_tensor *t, int *taken, stz_err *err)
{
    pack_ctx *c = &((stz_pack_sink *)user)->c;
    size_t j = c->filled, k = j;
    uint64_t len = t->end - t->begin, got = 0;
    (void)err;
    *taken = 0;
    if (!len || c->fill || j >= c->n)
        return STZ_OK;
    const stz_span *sp = &c->spans[c->chunks[j].tensor];
    if (c->chunks[j].data_offset != sp->begin || sp->end - sp->begin != len)
        return STZ_OK;
    for (; k < c->n && c->chunks[k].tensor == c->chunks[j].tensor && c->chunks[k].last == c->chunks[k].tensor; k++)
        got += c->chunks[k].raw_size;
    if (got != len)
        return STZ_OK;
    pthread_mutex_lock(&c->lock);
    for (size_t i = j; i < k; i++)
        c->src_r[i] = r, c->src_t[i] = t;
    c->filled = k;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    *taken = 1;
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
        return c->pl_status
                   ? sink_failed(c, err)
                   : stz_err_set(err, STZ_E_BOUNDS, "%s: %zu of %zu chunks written", c->label, c->filled, c->n);
    return stz_pack_writer_finish(c, &s->stats, err);
}

stz_status stz_pack_sink_open(stz_pack_sink **out, const stz_pack_params *p, const char *path, stz_err *err)
{
    *out = NULL;
    stz_pack_sink *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the container writer");
    }
    s->p = *p;
    s->p.progress = NULL; /* the producer reports progress */
    stz_status st = stz_pack_writer_open(&s->c, &s->p, path, 0, err);
    s->c.label = strcmp(path, "-") ? s->path : "standard output";
    pthread_mutex_init(&s->c.lock, NULL);
    pthread_cond_init(&s->c.cv, NULL);
    s->ws =
        (stz_wsink){.user = s, .begin = sink_begin, .write = sink_write, .refer = sink_refer, .finish = sink_finish};
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
    stz_pack_writer_close(&s->c);
    pthread_mutex_destroy(&s->c.lock);
    pthread_cond_destroy(&s->c.cv);
    free(s->path);
    free(s);
}

/* ---- packing a stream ----------------------------------------------------- */

/* Up to n bytes from fd: fewer only at its end. */
static stz_status read_some(int fd, const char *label, uint8_t *dst, size_t n, size_t *got, stz_err *err)
{
    int e = stz_read_some(fd, dst, n, got);
    return e ? stz_err_set(err, e == EINTR ? STZ_E_INTERRUPTED : STZ_E_IO, "%s: read failed: %s", label,
                           e == EINTR ? "interrupted" : strerror(e))
             : STZ_OK;
}

stz_status stz_pack_stream(const stz_pack_params *p, int fd, const char *label, const char *out, stz_pack_stats *stats,
                           stz_err *err)
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
    else if (!st && !memcmp(len8, "GGUF", 4))
        st = stz_err_set(err, STZ_E_UNSUPPORTED,
                         "%s: a GGUF file: stz packs GGUF files named on the command line, "
                         "not from a pipe",
                         label);
    else if (!st && hlen > STZ_ST_MAX_HEADER)
        st = stz_err_set(err, STZ_E_HEADER_SIZE,
                         "%s: header length %llu exceeds the limit of %u bytes (not "
                         "SafeTensors?)",
                         label, (unsigned long long)hlen, STZ_ST_MAX_HEADER);
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
    if (!st && (!(spans = stz_pack_writer_spans(r)) || !(buf = malloc(p->chunk_size))))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor spans and a chunk buffer");
    if (!st)
        st = s->ws.begin(s, img, 8 + hlen, spans, stz_reader_count(r), err);
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
