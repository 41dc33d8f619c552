/* Fuzz target for reading a GGUF file's tensors as floats (stz dequantize
 * X.gguf, stz eval with a GGUF candidate: model/gguf_view.c): any byte
 * string is a GGUF file, read through a memfd under the names byte 0
 * chooses (llama.cpp's own, llama2.c's or Hugging Face's, which undoes
 * export's q/k permutation). Whatever opens must read every tensor of up
 * to 2^20 values, row by row, or fail saying why. */
#include "fuzz_util.h"
#include "stz_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const stz_names names[3] = {STZ_NAMES_GGUF, STZ_NAMES_LLAMA2C, STZ_NAMES_HF};
    char path[64];
    int fd = fuzz_memfd(data + 1, size - 1, path);
    stz_err err;
    stz_qmodel *m;
    stz_status st = stz_qmodel_open_gguf(&m, path, names[data[0] % 3], &err);
    fuzz_failed(st, &err); /* a failure must say why */
    for (size_t i = 0; st == STZ_OK && i < stz_qmodel_count(m); i++) {
        const stz_qtensor *t = stz_qmodel_tensor(m, i);
        if (t->numel > (1u << 20) || !t->rows)
            continue;
        uint64_t cols = t->cols;
        float *row = malloc(cols * sizeof *row + 1);
        for (uint64_t r = 0; row && r < t->rows; r++)
            if (stz_qmodel_read_rows(m, i, r, 1, row, &err) && (!err.code || !err.msg[0]))
                abort();
        free(row);
    }
    if (st == STZ_OK)
        stz_qmodel_free(m);
    close(fd);
    return 0;
}
