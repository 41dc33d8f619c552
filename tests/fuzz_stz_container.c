/* Fuzz target for the container decoder: any byte string is a container.
 * It is checked with stz_verify_file through a memfd (no disk I/O); whatever
 * verifies must also unpack to exactly its declared size; and the decoder
 * of piped containers (stz_unpack_stream, reading the memfd in order) must
 * agree with the file decoder on every input. */
#include "fuzz_util.h"
#include "stz_pack.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfd(data, size, path);
    stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
    stz_err err;
    stz_status st = stz_verify_file(&p, path, &err);
    fuzz_failed(st, &err); /* a failure must say why */
    stz_container *c;
    if (stz_container_open(&c, path, &err) == STZ_OK) {
        stz_chunk_planes pl;
        for (size_t i = 0; i < stz_container_chunk_count(c); i++)
            (void)stz_container_planes(c, i, &pl, &err);
        if (st == STZ_OK) { /* verified: every byte accounted for */
            uint64_t sum = stz_reader_data_offset(stz_container_header(c));
            for (size_t i = 0; i < stz_container_chunk_count(c); i++)
                sum += stz_container_chunk(c, i)->raw_size;
            if (sum != stz_container_original_size(c))
                abort();
        }
        stz_container_free(c);
    } else if (st == STZ_OK) {
        abort();
    }
    lseek(fd, 0, SEEK_SET);
    stz_status ss = stz_unpack_stream(&p, fd, "stream", NULL, &err);
    if ((ss == STZ_OK) != (st == STZ_OK) || (ss != STZ_OK && (err.code != ss || !err.msg[0])))
        abort(); /* the same bytes are a good container both ways, or neither */
    close(fd);
    return 0;
}
