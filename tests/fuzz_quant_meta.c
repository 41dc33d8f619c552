/* Fuzz target for quantized metadata: any byte string is a SafeTensors file
 * image read as a quantized model (stz.quant.* metadata, .scales and SVD
 * factor companions). Whatever stz_qmodel accepts must be consistent and
 * every row readable; whatever it refuses must say why. Built with
 * -DSTZ_FUZZ=ON as a libFuzzer target; replayed in CTest over
 * tests/corpus/quant. */
#include "stz_model.h"
#include "stz_quant.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    stz_reader *r;
    stz_qmodel *m;
    stz_err err;
    if (stz_reader_open_mem(&r, data, size, "fuzz", &err) != STZ_OK)
        return 0; /* fuzz_st_header covers the reader */
    if (stz_qmodel_open_reader(&m, r, &err) != STZ_OK) {
        if (err.code == STZ_OK || !err.msg[0])
            abort();
        stz_reader_free(r);
        return 0;
    }
    for (size_t i = 0; i < stz_qmodel_count(m); i++) {
        const stz_qtensor *t = stz_qmodel_tensor(m, i);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= t->shape[d];
        if (numel != t->numel || t->rows * t->cols != t->numel || stz_qmodel_find(m, t->name) != (long)i)
            abort();
        if (t->bits && (!t->method || t->bits < 2 || (t->bits > 8 && t->bits != 16))) /* 16: f16, bf16 */
            abort();
        if (!t->numel || t->cols > (1u << 16))
            continue;
        float *row = malloc(t->cols * sizeof *row);
        /* first and last row: values are read through the scales and factors */
        stz_status s = stz_qmodel_read_rows(m, i, 0, 1, row, &err);
        if (s == STZ_OK)
            s = stz_qmodel_read_rows(m, i, t->rows - 1, 1, row, &err);
        if (s != STZ_OK && s != STZ_E_DTYPE && (!err.msg[0] || t->bits))
            abort(); /* a quantized tensor that opened must read */
        free(row);
    }
    stz_qmodel_free(m);
    stz_reader_free(r);
    return 0;
}
