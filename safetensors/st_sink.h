/* What the other stages use of the SafeTensors module beyond the public
 * header: a writer whose bytes go to a sink (the container encoder), a
 * reader whose bytes come from elsewhere (a container decoding them), and
 * what a file that is not SafeTensors probably is. Not installed. */
#ifndef STZ_ST_SINK_H
#define STZ_ST_SINK_H

#include "core/stz_core.h"
#include "stz_safetensors.h"

/* A reader's bytes from elsewhere (a container decoding them on demand):
 * reads of n bytes at offset off of the original file. */
typedef stz_status (*stz_read_fn)(void *user, uint64_t off, void *dst, size_t n, stz_err *err);
struct stz_reader;
void stz_reader_set_source(struct stz_reader *r, stz_read_fn fn, void *user);

/* ---- a SafeTensors writer's bytes handed elsewhere -------------------- */

/* A tensor's dtype and bytes in the data section of the file being written,
 * and its name (owned by the writer or reader the span comes from);
 * block_type: the ggml type of the blocks its bytes are (0: none);
 * code_bits: stz's codes of that width in rows of row_bytes bytes (0: none). */
typedef struct {
    stz_dtype dtype;
    uint64_t begin, end;
    const char *name;
    int block_type;
    unsigned code_bits;
    uint32_t row_bytes;
} stz_span;

/* Where an stz_writer opened with stz_writer_open_sink sends the file:
 * begin() gets the whole header (its 8-byte length, then the JSON) and
 * the tensors in data order, write() the data section in order, finish()
 * runs at stz_writer_finish. refer() (optional) takes a whole tensor's data
 * by reference, *taken = 1: the next bytes are those of tensor t of r, and
 * the sink reads them itself (r outlives the sink). The sink's owner cleans
 * up after a failure. */
struct stz_reader;
struct stz_tensor;
typedef struct {
    void *user;
    stz_status (*begin)(void *user, const uint8_t *head, size_t len, const stz_span *t, size_t nt, stz_err *err);
    stz_status (*write)(void *user, const void *data, size_t n, stz_err *err);
    stz_status (*refer)(void *user, const struct stz_reader *r, const struct stz_tensor *t, int *taken, stz_err *err);
    stz_status (*finish)(void *user, stz_err *err);
} stz_wsink;

struct stz_writer;
/* A writer whose bytes go to `sink` (name: for messages). */
stz_status stz_writer_open_sink(struct stz_writer **out, const char *name, const stz_wsink *sink, stz_err *err);
/* The next data bytes are tensor t of r, as they are: a sink that reads
 * them itself takes them by reference (*taken = 1); else *taken = 0 and
 * the caller writes them. */
stz_status stz_writer_refer(struct stz_writer *w, const struct stz_reader *r, const struct stz_tensor *t, int *taken,
                            stz_err *err);

/* What a file that is not what was expected probably is, from its first
 * bytes (a container, GGUF, zip, pickle, NumPy, JSON, text, and given 9
 * bytes or more SafeTensors), or NULL. */
const char *stz_file_kind(const uint8_t *b, size_t n);

#endif /* STZ_ST_SINK_H */
