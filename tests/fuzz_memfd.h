/* Fuzz targets that read a file: the input as a memfd (no disk I/O). */
#ifndef STZ_FUZZ_MEMFD_H
#define STZ_FUZZ_MEMFD_H

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

#endif
