/* Fuzz target for the tokenizer readers of stz export --gguf (a
 * tokenizer.json or a llama2.c tokenizer file). The first two bytes choose:
 * byte 0 bit 0 the kind (1: tokenizer.json), bit 1 the architecture
 * (qwen2 or llama), bit 2 a configuration with BOS/EOS ids; byte 1 the
 * model's vocabulary, 1 to 256 tokens. The rest is the file, written under
 * $TMPDIR (the readers tell the kinds apart by the name). A failure must
 * say why; a success must have written keys. */
#include "fuzz_util.h"
#include "export/gguf_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *dir = getenv("TMPDIR");
    char path[4096];
    int json = data[0] & 1;
    snprintf(path, sizeof path, "%s/stz-fuzz-vocab-%d.%s", dir && *dir ? dir : "/tmp", (int)getpid(),
             json ? "json" : "bin");
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data + 2, 1, size - 2, f) != size - 2 || fclose(f))
        abort();
    gbuf kv = {0};
    stz_err err;
    uint32_t padded;
    stz_status st = gguf_vocab(&kv, path, stz_arch_get(data[0] & 2 ? STZ_ARCH_QWEN2 : STZ_ARCH_LLAMA),
                               data[0] & 4 ? "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3]}" : NULL,
                               (uint32_t)data[1] + 1, data[0] & 8, &padded, &err);
    fuzz_failed(st, &err); /* a failure must say why */
    if (st == STZ_OK && !kv.oom && !kv.count)
        abort();
    free(kv.p);
    unlink(path);
    return 0;
}
