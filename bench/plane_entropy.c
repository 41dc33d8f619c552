/* Order-0 entropy bound of a SafeTensors file under stz's plane split:
 * each (dtype, plane) gets one histogram over the whole file; the bound is
 * the sum of n * H / 8 bytes. Prints "bound_bytes ratio" on the first line,
 * then one line per plane: "dtype plane bytes bits_per_byte". Streams the
 * file in 1 MiB pieces. Usage: plane_entropy FILE */
#include "stz_pack.h"
#include "stz_planes.h"
#include "stz_safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: plane_entropy FILE.safetensors\n");
        return 2;
    }
    stz_reader *r;
    stz_err err;
    if (stz_reader_open(&r, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static uint64_t hist[STZ_DTYPE_COUNT][STZ_MAX_PLANES][256];
    size_t piece = 1 << 20;
    uint8_t *buf = malloc(piece), *pl = malloc(piece * 2), *planes[STZ_MAX_PLANES];
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        stz_xform x = stz_xform_for_dtype(t->dtype);
        unsigned w = stz_xform_width(x), np = stz_xform_planes(x);
        for (uint64_t off = 0; off < t->end - t->begin; off += piece) {
            size_t n = t->end - t->begin - off < piece ? (size_t)(t->end - t->begin - off) : piece;
            if (stz_reader_read(r, t, off, buf, n, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            for (unsigned k = 0; k < np; k++)
                planes[k] = pl + k * (n / w);
            stz_xform_split(x, buf, n, planes);
            for (unsigned k = 0; k < np; k++)
                for (size_t j = 0; j < n / w; j++)
                    hist[t->dtype][k][planes[k][j]]++;
        }
    }
    double bound = (double)stz_reader_data_offset(r); /* header counted as is */
    double bits[STZ_DTYPE_COUNT][STZ_MAX_PLANES] = {{0}};
    uint64_t count[STZ_DTYPE_COUNT][STZ_MAX_PLANES] = {{0}};
    for (int d = 0; d < STZ_DTYPE_COUNT; d++)
        for (int k = 0; k < STZ_MAX_PLANES; k++) {
            for (int s = 0; s < 256; s++)
                count[d][k] += hist[d][k][s];
            for (int s = 0; s < 256; s++)
                if (hist[d][k][s])
                    bits[d][k] -= (double)hist[d][k][s] * log2((double)hist[d][k][s] / (double)count[d][k]);
            bound += bits[d][k] / 8;
        }
    printf("%.0f %.4f\n", bound, (double)stz_reader_file_size(r) / bound);
    for (int d = 0; d < STZ_DTYPE_COUNT; d++)
        for (int k = 0; k < STZ_MAX_PLANES; k++)
            if (count[d][k])
                printf("%s %d %llu %.4f\n", stz_dtype_name((stz_dtype)d), k, (unsigned long long)count[d][k],
                       bits[d][k] / (double)count[d][k]);
    stz_reader_free(r);
    free(buf);
    free(pl);
    return 0;
}
