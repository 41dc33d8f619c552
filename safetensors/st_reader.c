/* SafeTensors reader: opens a file, a memory image or a header alone, and
 * reads tensors' bytes; the header is validated whole before anything is
 * used (st_header.c). */
#include "st_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void stz_reader_set_source(stz_reader *r, stz_read_fn fn, void *user) { r->source = fn, r->source_user = user; }

static stz_status reader_init(stz_reader *r, stz_err *err)
{
    const char *P = r->path;
    uint8_t len8[8];
    if (r->file_size < 8)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: file is %llu bytes, too short for the 8-byte header length", P,
                           (unsigned long long)r->file_size);
    stz_status st = stz_reader_pread(r, 0, len8, 8, err);
    if (st)
        return st;
    uint64_t n = stz_le64(len8);
    char detail[160];
    if (n > STZ_ST_MAX_HEADER) {
        snprintf(detail, sizeof detail, "header length %llu exceeds the limit of %u bytes", (unsigned long long)n,
                 STZ_ST_MAX_HEADER);
        return stz_st_not_safetensors(r, len8, 8, STZ_E_HEADER_SIZE, detail, err);
    }
    if (n > r->file_size - 8) {
        snprintf(detail, sizeof detail, "header length %llu runs past the end of the file (%llu bytes)",
                 (unsigned long long)n, (unsigned long long)r->file_size);
        return stz_st_not_safetensors(r, len8, 8, STZ_E_HEADER_SIZE, detail, err);
    }
    r->header_len = n;
    r->header = malloc((size_t)n + 1);
    if (!r->header)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a %llu-byte header", P, (unsigned long long)n);
    r->header[n] = 0;
    if ((st = stz_reader_pread(r, 8, r->header, (size_t)n, err)) != STZ_OK)
        return st;
    return stz_st_parse_header(r, err);
}

static stz_reader *reader_new(const char *label)
{
    stz_reader *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->fd = -1;
    r->path = strdup(label ? label : "(memory)");
    if (!r->path) {
        free(r);
        return NULL;
    }
    return r;
}

static stz_status reader_open(stz_reader **out, const char *path, stz_err *err);

stz_status stz_reader_open(stz_reader **out, const char *path, stz_err *err)
{
    return stz_err_in(err, reader_open(out, path, err), path);
}

static stz_status reader_open(stz_reader **out, const char *path, stz_err *err)
{
    *out = NULL;
    stz_reader *r = reader_new(path);
    if (!r)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a reader", path);
    stz_status s = stz_open_regular(path, &r->fd, &r->file_size, err);
    if (s == STZ_OK)
        s = reader_init(r, err);
    if (s != STZ_OK) {
        stz_reader_free(r);
        return s;
    }
    *out = r;
    return STZ_OK;
}

stz_status stz_reader_open_mem(stz_reader **out, const void *buf, size_t size, const char *label, stz_err *err)
{
    *out = NULL;
    stz_reader *r = reader_new(label);
    if (!r)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a reader", label ? label : "(memory)");
    r->mem = buf;
    r->mem_size = r->file_size = size;
    stz_status s = reader_init(r, err);
    if (s != STZ_OK) {
        stz_reader_free(r);
        return s;
    }
    *out = r;
    return STZ_OK;
}

stz_status stz_reader_open_header(stz_reader **out, const void *buf, size_t size, uint64_t file_size, const char *label,
                                  stz_err *err)
{
    *out = NULL;
    if (file_size && size > file_size)
        return stz_err_set(err, STZ_E_FORMAT, "%s: header image of %zu bytes is larger than the file (%llu)",
                           label ? label : "(memory)", size, (unsigned long long)file_size);
    stz_reader *r = reader_new(label);
    if (!r)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a reader", label ? label : "(memory)");
    r->mem = buf;
    r->mem_size = size;
    r->file_size = file_size ? file_size : UINT64_MAX;
    r->size_from_header = !file_size;
    stz_status s = reader_init(r, err);
    if (s == STZ_OK && stz_reader_data_offset(r) != size)
        s = stz_err_set(err, STZ_E_FORMAT, "%s: header image is %zu bytes but declares %llu", r->path, size,
                        (unsigned long long)stz_reader_data_offset(r));
    if (s != STZ_OK) {
        stz_reader_free(r);
        return s;
    }
    *out = r;
    return STZ_OK;
}

stz_status stz_reader_open_spans(stz_reader **out, const char *label, int fd, uint64_t file_size, uint64_t data_offset,
                                 const stz_span *spans, size_t n, stz_err *err)
{
    *out = NULL;
    stz_reader *r = reader_new(label);
    size_t chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += strlen(spans[i].name) + 1;
    if (r)
        r->fd = fd, fd = -1; /* the reader's now */
    if (!r || !(r->tensors = calloc(n + 1, sizeof *r->tensors)) || !(r->by_name = calloc(n + 1, sizeof *r->by_name)) ||
        !(r->shapes = calloc(n + 1, sizeof *r->shapes)) || !(r->names = malloc(chars + 1))) {
        if (fd >= 0)
            close(fd);
        stz_reader_free(r);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu tensors", label, n);
    }
    r->file_size = file_size, r->data_offset = data_offset, r->ntensors = n;
    stz_status st;
    char *name = r->names;
    for (size_t i = 0; i < n; i++) {
        stz_tensor *t = &r->tensors[i];
        size_t len = strlen(spans[i].name) + 1;
        t->name = memcpy(name, spans[i].name, len);
        name += len;
        t->dtype = spans[i].dtype;
        t->begin = spans[i].begin, t->end = spans[i].end;
        r->shapes[i] = t->numel = (t->end - t->begin) * 8 / stz_dtype_bits(t->dtype);
        t->ndim = 1, t->shape = &r->shapes[i];
    }
    if ((st = stz_st_index_names(r, err))) {
        stz_reader_free(r);
        return st;
    }
    *out = r;
    return STZ_OK;
}

void stz_reader_free(stz_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->names);
    for (size_t i = 0; i < 2 * r->nmeta; i++)
        free(r->meta[i]);
    free(r->meta);
    free(r->tensors);
    free(r->by_name);
    free(r->shapes);
    free(r->header);
    free(r->path);
    free(r);
}

size_t stz_reader_count(const stz_reader *r) { return r->ntensors; }
const stz_tensor *stz_reader_tensor(const stz_reader *r, size_t i) { return i < r->ntensors ? &r->tensors[i] : NULL; }
size_t stz_reader_meta_count(const stz_reader *r) { return r->nmeta; }
const char *stz_reader_meta_key(const stz_reader *r, size_t i) { return i < r->nmeta ? r->meta[2 * i] : NULL; }
const char *stz_reader_meta_value(const stz_reader *r, size_t i) { return i < r->nmeta ? r->meta[2 * i + 1] : NULL; }
const char *stz_reader_path(const stz_reader *r) { return r->path; }
uint64_t stz_reader_file_size(const stz_reader *r) { return r->file_size; }
uint64_t stz_reader_data_offset(const stz_reader *r) { return r->data_offset ? r->data_offset : 8 + r->header_len; }

const uint8_t *stz_reader_header(const stz_reader *r, size_t *len)
{
    *len = (size_t)r->header_len;
    return r->header;
}

const char *stz_reader_meta_get(const stz_reader *r, const char *key)
{
    for (size_t i = 0; i < r->nmeta; i++)
        if (strcmp(r->meta[2 * i], key) == 0)
            return r->meta[2 * i + 1];
    return NULL;
}

long stz_reader_find(const stz_reader *r, const char *name)
{
    size_t lo = 0, hi = r->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->tensors[r->by_name[mid]].name, name);
        if (c == 0)
            return (long)r->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

stz_status stz_reader_pread(const stz_reader *r, uint64_t off, void *dst, size_t n, stz_err *err)
{
    if (off > r->file_size || n > r->file_size - off)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: read of %zu bytes at offset %llu is past the end (%llu bytes)",
                           r->path, n, (unsigned long long)off, (unsigned long long)r->file_size);
    if (r->source)
        return r->source(r->source_user, off, dst, n, err);
    if (r->mem) {
        if (off > r->mem_size || n > r->mem_size - off)
            return stz_err_set(err, STZ_E_BOUNDS, "%s: bytes at offset %llu are not held in memory", r->path,
                               (unsigned long long)off);
        memcpy(dst, r->mem + off, n);
        return STZ_OK;
    }
    int e = stz_pread_full(r->fd, dst, n, off);
    if (e < 0)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: file shrank while reading at offset %llu", r->path,
                           (unsigned long long)off);
    if (e)
        return stz_err_set(err, STZ_E_IO, "%s: read failed at offset %llu: %s", r->path, (unsigned long long)off,
                           strerror(e));
    return STZ_OK;
}

stz_status stz_reader_read(const stz_reader *r, const stz_tensor *t, uint64_t off, void *dst, size_t n, stz_err *err)
{
    uint64_t size = t->end - t->begin;
    if (off > size || n > size - off)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: tensor '%s': read of %zu bytes at %llu leaves its %llu bytes",
                           r->path, t->name, n, (unsigned long long)off, (unsigned long long)size);
    return stz_reader_pread(r, stz_reader_data_offset(r) + t->begin + off, dst, n, err);
}
