/* Internal helpers shared by the library's modules. Not installed. */
#ifndef STZ_INTERNAL_H
#define STZ_INTERNAL_H

#include "stz.h"

#include <stdint.h>
#include <string.h>

/* Function clones for newer x86-64 instruction sets, the best one chosen
 * when the program loads (GCC on x86-64; other compilers and machines build
 * the baseline only, and so does -DSTZ_NO_CLONES: ThreadSanitizer crashes
 * in the clones' resolvers). Clones must compute the same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(STZ_NO_CLONES)
#define STZ_X86_CLONES 1
#define STZ_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#else
#define STZ_X86_CLONES 0
#define STZ_CLONES(...)
#endif

/* Returns st; when st is an error whose message is a bare "out of memory...",
 * prefixes it with the path it happened for (the entry points' context). */
stz_status stz_err_in(stz_err *err, stz_status st, const char *path);

/* Little-endian loads and stores: never cast pointers into file data. */
static inline uint16_t stz_le16(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint16_t)(b[0] | (b[1] << 8));
}
static inline uint32_t stz_le32(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}
static inline uint64_t stz_le64(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint64_t)stz_le32(b) | ((uint64_t)stz_le32(b + 4) << 32);
}
static inline void stz_put_le16(void *p, uint16_t v)
{
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static inline void stz_put_le32(void *p, uint32_t v)
{
    uint8_t *b = (uint8_t *)p;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline void stz_put_le64(void *p, uint64_t v)
{
    stz_put_le32(p, (uint32_t)v);
    stz_put_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* Float conversions. BF16 rounds to nearest even; NaN stays NaN. */
static inline float stz_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t stz_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, keeps sign */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
float stz_f16_to_f32(uint16_t h);
uint16_t stz_f32_to_f16(float f);

/* pread/pwrite loops that retry on EINTR and short counts. Return 0 or
 * errno; pread returns -1 at end of file before n bytes. */
int stz_pread_full(int fd, void *buf, size_t n, uint64_t off);
int stz_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* read() until n bytes or the end of the stream (*got tells how many),
 * retrying on EINTR. Returns 0 or errno. */
int stz_read_some(int fd, void *buf, size_t n, size_t *got);


/* A reader's bytes from elsewhere (a container decoding them on demand):
 * reads of n bytes at offset off of the original file. */
typedef stz_status (*stz_read_fn)(void *user, uint64_t off, void *dst, size_t n, stz_err *err);
struct stz_reader;
void stz_reader_set_source(struct stz_reader *r, stz_read_fn fn, void *user);

/* ---- output files: temporary name, rename at the end ----------------- */

typedef struct stz_outfile {
    int fd;
    char *path;     /* final name */
    char *tmp_path; /* where bytes go until commit */
    int slot;       /* index in the cleanup registry, -1 if none */
    uint64_t pos;   /* where stz_outfile_write appends */
    int force;      /* commit may replace an existing file */
} stz_outfile;

#define STZ_OUTFILE_INIT {-1, NULL, NULL, -1, 0, 0}

/* Creates a temporary file next to `path`. STZ_E_EXISTS if path exists and
 * !force. The temp name is registered so stz_tmp_cleanup_all() removes it. */
stz_status stz_outfile_open(stz_outfile *of, const char *path, int force, stz_err *err);
/* An outfile that is standard output (no path): bytes go in order only,
 * commit and abort leave it open. */
void stz_outfile_stdout(stz_outfile *of);
/* Appends at of->pos and advances it. */
stz_status stz_outfile_write(stz_outfile *of, const void *buf, size_t n, stz_err *err);
/* Writes at an absolute offset (threads may write disjoint ranges at once);
 * does not move of->pos. */
stz_status stz_outfile_pwrite(stz_outfile *of, const void *buf, size_t n, uint64_t off, stz_err *err);
/* Renames the temporary file to the final path (permissions follow umask).
 * Without force it never replaces a file that appeared meanwhile
 * (STZ_E_EXISTS). */
stz_status stz_outfile_commit(stz_outfile *of, stz_err *err);
/* STZ_E_IO naming the output, `what`, `need` and the free bytes when the
 * output's file system has less than `need` bytes free. */
stz_status stz_check_space(const stz_outfile *of, uint64_t need, const char *what, stz_err *err);
/* Removes the temporary file if still there; safe after commit and twice. */
void stz_outfile_abort(stz_outfile *of);

/* ---- a SafeTensors writer's bytes handed elsewhere -------------------- */

/* A tensor's dtype and bytes in the data section of the file being written,
 * and its name (owned by the writer or reader the span comes from). */
typedef struct {
    stz_dtype dtype;
    uint64_t begin, end;
    const char *name;
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

/* The container encoder as a writer's sink: the SafeTensors file the writer
 * produces goes into the container `out` ("-": standard output) chunk by
 * chunk, encoded on p->threads threads in the background, exactly as
 * stz_pack_file would pack that file, in bounded memory (a few chunks per
 * thread). stz_pack_sink_free without a finish leaves no output. */
typedef struct stz_pack_sink stz_pack_sink;
struct stz_pack_params;
struct stz_pack_stats;
stz_status stz_pack_sink_open(stz_pack_sink **out, const struct stz_pack_params *p, const char *path, stz_err *err);
const stz_wsink *stz_pack_sink_wsink(stz_pack_sink *s);
/* After the writer finished: the container's and the packed file's sizes. */
void stz_pack_sink_stats(const stz_pack_sink *s, struct stz_pack_stats *stats);
void stz_pack_sink_free(stz_pack_sink *s);

/* Decodes and checks the chunks of a container's tensor `name` on `threads`
 * threads, handing each to sink (from worker thread `tid`, any order) with
 * its offset in the tensor's bytes. Chunks never span two tensors. Uses the
 * container's buffers: not with other reads of c at the same time. */
typedef stz_status (*stz_chunk_sink)(void *user, int tid, uint64_t off, const uint8_t *raw, size_t n, stz_err *err);
struct stz_container;
stz_status stz_container_tensor_map(struct stz_container *c, const char *name, int threads, stz_chunk_sink sink,
                                    void *user, stz_err *err);

/* ---- ordered parallel pipeline --------------------------------------- */

/*
 * Runs work(i) for i in [0, n) on `threads` threads (the caller's thread is
 * one of them), then commit(i) strictly in order 0, 1, 2, ... with the
 * commits serialised (but outside the pipeline's lock: the other threads
 * take and work on items meanwhile, so a commit may wait, for room in a
 * sink say), then post(i) (optional) in any order. Work that needs no order,
 * such as writing at a reserved offset, belongs in post(). Work items are
 * handed out in order, so at most `threads` items are in flight: memory
 * stays bounded by the per-thread buffers. The first error stops the run
 * and is returned. progress (optional) is called from the caller's thread
 * with `done`, which only commit() may advance.
 */
typedef struct stz_pipeline {
    size_t n;
    int threads;
    void *ctx;
    stz_status (*work)(void *ctx, int tid, size_t i, stz_err *err);
    stz_status (*commit)(void *ctx, int tid, size_t i, stz_err *err);
    stz_status (*post)(void *ctx, int tid, size_t i, stz_err *err);
    stz_progress_fn progress;
    void *progress_user;
    uint64_t done, total; /* progress units; commit() updates done */
} stz_pipeline;

stz_status stz_pipeline_run(stz_pipeline *p, stz_err *err);

#endif /* STZ_INTERNAL_H */
