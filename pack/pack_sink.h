/* What the other stages use of the container beyond the public header:
 * the encoder as a SafeTensors writer's sink (the pipeline's one-pass
 * compress) and a tensor's chunks decoded in parallel. Not installed. */
#ifndef STZ_PACK_SINK_H
#define STZ_PACK_SINK_H

#include "safetensors/st_sink.h"
#include "stz_pack.h"

/* The container encoder as a writer's sink: the SafeTensors file the writer
 * produces goes into the container `out` ("-": standard output) chunk by
 * chunk, encoded on p->threads threads in the background, exactly as
 * stz_pack_file would pack that file, in bounded memory (a few chunks per
 * thread). stz_pack_sink_free without a finish leaves no output. */
typedef struct stz_pack_sink stz_pack_sink;
stz_status stz_pack_sink_open(stz_pack_sink **out, const stz_pack_params *p, const char *path, stz_err *err);
const stz_wsink *stz_pack_sink_wsink(stz_pack_sink *s);
/* After the writer finished: the container's and the packed file's sizes. */
void stz_pack_sink_stats(const stz_pack_sink *s, stz_pack_stats *stats);
void stz_pack_sink_free(stz_pack_sink *s);

/* Decodes and checks the chunks of a container's tensor `name` on `threads`
 * threads, handing each to sink (from worker thread `tid`, any order) with
 * its offset in the tensor's bytes. Chunks never span two tensors. Uses the
 * container's buffers: not with other reads of c at the same time. */
typedef stz_status (*stz_chunk_sink)(void *user, int tid, uint64_t off, const uint8_t *raw, size_t n, stz_err *err);
struct stz_container;
stz_status stz_container_tensor_map(struct stz_container *c, const char *name, int threads, stz_chunk_sink sink,
                                    void *user, stz_err *err);

#endif /* STZ_PACK_SINK_H */
