/* Fuzz target for the importance-matrix reader (--imatrix FILE: llama.cpp's
 * imatrix GGUF or legacy .dat, stz's own): any byte string is such a file,
 * read through a memfd. Whatever loads must give every entry a name and
 * columns, and find each entry again, its weights non-negative, finite and
 * of mean 1 (an entry that weighs nothing is refused). */
#include "fuzz_util.h"
#include "stz_imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfd(data, size, path);
    stz_err err;
    stz_imatrix *im;
    stz_status st = stz_imatrix_load(&im, path, &err);
    fuzz_failed(st, &err); /* a failure must say why */
    if (st == STZ_OK) {
        for (size_t i = 0; i < stz_imatrix_count(im); i++) {
            uint64_t cols;
            double tokens;
            const char *name = stz_imatrix_name(im, i, &cols, &tokens);
            const float *w;
            if (!name || !cols || !(tokens >= 0) || stz_imatrix_find(im, name, cols, &w, &err) || !w)
                abort();
            double sum = 0;
            for (uint64_t j = 0; j < cols; j++)
                if (!(w[j] >= 0) || !isfinite(w[j]))
                    abort();
                else
                    sum += w[j];
            if (!(fabs(sum / (double)cols - 1) < 1e-3)) /* divided by their mean */
                abort();
        }
        stz_imatrix_free(im);
    }
    close(fd);
    return 0;
}
