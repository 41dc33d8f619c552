/* What the fuzz targets share: the input as a file (a memfd, no disk
 * I/O), and the rule that a refusal says why. */
#ifndef STZ_FUZZ_UTIL_H
#define STZ_FUZZ_UTIL_H

#include "stz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* A file holding data[size], named by path (64 bytes); close the fd after. */
static inline int fuzz_memfd(const uint8_t *data, size_t size, char path[64])
{
    int fd = memfd_create("stz-fuzz", 0);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

/* 1 when st is a failure, which must say why (err holds st and a
 * message): a failure that does not aborts the run. */
static inline int fuzz_failed(stz_status st, const stz_err *err)
{
    if (st != STZ_OK && (err->code != st || !err->msg[0]))
        abort();
    return st != STZ_OK;
}

#endif
