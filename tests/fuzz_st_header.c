/* Fuzz target for the SafeTensors parser: any byte string is a file image.
 * Built as a libFuzzer target with -DSTZ_FUZZ=ON (clang), and always as a
 * CTest replay over tests/corpus/safetensors (see fuzz_replay.c). */
#include "fuzz_util.h"
#include "stz_safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The header alone, as a pipe delivers it first (stz pack -): valid exactly
 * when the whole image is, once the image is as long as its tensors need. */
static void check_header_alone(const uint8_t *data, size_t size, int whole_ok)
{
    uint64_t hlen = 0;
    for (int i = 7; size >= 8 && i >= 0; i--)
        hlen = hlen << 8 | data[i];
    if (size < 8 || hlen > size - 8)
        return;
    stz_reader *h;
    stz_err err;
    if (stz_reader_open_header(&h, data, 8 + (size_t)hlen, 0, "fuzz", &err) != STZ_OK) {
        if (whole_ok || err.code == STZ_OK || !err.msg[0])
            abort();
        return;
    }
    if (whole_ok != (stz_reader_file_size(h) == size))
        abort();
    stz_reader_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    stz_reader *r;
    stz_err err;
    stz_status st = stz_reader_open_mem(&r, data, size, "fuzz", &err);
    check_header_alone(data, size, st == STZ_OK);
    if (fuzz_failed(st, &err)) /* a failure must say why */
        return 0;
    /* Whatever the reader accepts must be consistent and fully readable. */
    uint64_t expect = 0;
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        uint8_t buf[256];
        uint64_t size_t_ = t->end - t->begin;
        if (t->begin != expect || stz_reader_find(r, t->name) != (long)i)
            abort();
        expect = t->end;
        size_t n = size_t_ < sizeof buf ? (size_t)size_t_ : sizeof buf;
        if (stz_reader_read(r, t, size_t_ - n, buf, n, &err) != STZ_OK)
            abort();
    }
    if (stz_reader_data_offset(r) + expect != size)
        abort();
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        if (!stz_reader_meta_get(r, stz_reader_meta_key(r, i)))
            abort();
    stz_reader_free(r);
    return 0;
}
