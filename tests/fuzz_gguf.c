/* Fuzz target for the GGUF reader (stz inspect FILE.gguf): any byte string
 * is a GGUF file, read through a memfd. Whatever opens must list tensors
 * that lie inside the file and do not overlap, and keys with text: short
 * (strings cut after 200 bytes, arrays after 4 elements) and without a
 * control character (escaped). */
#include "fuzz_util.h"
#include "core/stz_core.h"
#include "stz_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfd(data, size, path);
    stz_err err;
    stz_gguf *g;
    stz_status st = stz_gguf_open(&g, path, &err);
    fuzz_failed(st, &err); /* a failure must say why */
    if (st == STZ_OK) {
        for (size_t i = 0; i < stz_gguf_tensor_count(g); i++) {
            const stz_gguf_tensor *t = stz_gguf_tensor_at(g, i);
            if (!t->name || t->offset > size || t->bytes > size - t->offset)
                abort();
        }
        for (size_t i = 0; i < stz_gguf_kv_count(g); i++) { /* the key/value printer's text of every key */
            const char *text = stz_gguf_kv_text(g, i);
            if (!stz_gguf_kv_key(g, i) || !text || strlen(text) > 4096 || stz_control_char(text, strlen(text)))
                abort();
        }
        stz_gguf_free(g);
    }
    close(fd);
    return 0;
}
