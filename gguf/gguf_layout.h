/* A GGUF file's layout for the container (pack/): its header read
 * leniently (any tensor type, offset and alignment: the container stores
 * every GGUF byte for byte, whether llama.cpp would load it or not) and its
 * data section cut at the tensors' starts. Not installed. */
#ifndef STZ_GGUF_LAYOUT_H
#define STZ_GGUF_LAYOUT_H

#include "safetensors/st_sink.h"
#include "stz_gguf.h"

/* Reads a GGUF file's header leniently through fd (fsize bytes; fd stays
 * the caller's, who reads the data through it too), path naming it. */
stz_status stz_gguf_read_layout_fd(stz_gguf **out, int fd, uint64_t fsize, const char *path, stz_err *err);
/* Where the data section starts; the file's size. */
uint64_t stz_gguf_data_offset(const stz_gguf *g);
uint64_t stz_gguf_file_size(const stz_gguf *g);
/* The data section tiled by spans (offsets from
 * the data section's start, malloc'd; names owned by g): one per tensor in
 * order of offset, from its start to the next tensor's (its padding with
 * it; tensors sharing a start: empty), the last to the end of the file;
 * bytes before the first tensor (or a data section without tensors) a span
 * of their own. Floats and integers keep their dtype, anything else is U8
 * with its ggml type as block_type. Tensors said to start past the end of
 * the file have no span. */
stz_status stz_gguf_spans(const stz_gguf *g, stz_span **out, size_t *n, stz_err *err);

#endif /* STZ_GGUF_LAYOUT_H */
