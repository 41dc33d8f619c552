/* The SafeTensors reader's state, shared by st_reader.c (opening, reading)
 * and st_header.c (parsing and validating the header). Not installed. */
#ifndef STZ_ST_READER_H
#define STZ_ST_READER_H

#include "st_sink.h"
#include "stz_safetensors.h"

struct stz_reader {
    char *path;
    int fd;             /* -1 for a memory image */
    const uint8_t *mem; /* memory image, not owned */
    uint64_t mem_size;  /* bytes available at mem (<= file_size) */
    uint64_t file_size;
    int size_from_header; /* stz_reader_open_header(file_size 0): the size the tensors need */
    uint8_t *header;      /* N header bytes (+1 NUL, not counted) */
    uint64_t header_len;
    stz_tensor *tensors; /* file order */
    size_t ntensors;
    size_t *by_name;  /* tensor indices sorted by name */
    uint64_t *shapes; /* all dimensions, in one block */
    char *names;      /* all names, in header order, in one block */
    char **meta;      /* key, value, key, value, ... */
    size_t nmeta;
    uint64_t data_offset; /* stz_reader_open_spans: where the data starts (0: after the header) */
    stz_read_fn source;   /* when set, reads go here (stz_reader_set_source) */
    void *source_user;
};

/* Parses and validates r->header (r->header_len bytes, NUL after them):
 * tensors, metadata, offsets against r->file_size. */
stz_status stz_st_parse_header(stz_reader *r, stz_err *err);
/* The reader's error for a file whose first bytes are not a SafeTensors
 * header: what it is instead, when that can be told. */
stz_status stz_st_not_safetensors(const stz_reader *r, const uint8_t *first, size_t n, stz_status code,
                                  const char *detail, stz_err *err);

/* The name index, which refuses a name that appears twice. */
stz_status stz_st_index_names(stz_reader *r, stz_err *err);

/* A reader of a file in another format (a GGUF, for the container): its
 * data section from data_offset to file_size, tiled by spans[n] (offsets
 * relative to data_offset, in order), which become 1-D tensors of those
 * names and dtypes; no metadata. fd >= 0: reads come from that descriptor
 * (of the file the spans were read from, so that it is one file), which
 * the reader takes over (closed by stz_reader_free, or here on failure);
 * -1: they go through stz_reader_set_source. */
stz_status stz_reader_open_spans(stz_reader **out, const char *label, int fd, uint64_t file_size, uint64_t data_offset,
                                 const stz_span *spans, size_t n, stz_err *err);

#endif /* STZ_ST_READER_H */
