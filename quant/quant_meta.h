/* A quantized file's metadata entries parsed and checked (quant_meta.c),
 * for its readers (model/qmodel.c, pipeline/dequantize.c). Not installed. */
#ifndef STZ_QUANT_META_H
#define STZ_QUANT_META_H

#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "quant_tensor.h"

typedef struct {
    const char *name;     /* original name (owned by the reader's metadata) */
    const char *method;   /* "absmax", "mse", "svd" (static) */
    const stz_tensor *t;  /* values tensor (svd: U) in the quantized file */
    const stz_tensor *sc; /* scales tensor, NULL for a single scale */
    const stz_tensor *mn; /* asym: minimums tensor, NULL for a single block */
    float scalar_min;
    stz_qformat fmt; /* how to dequantize (not svd) */
    int bits;
    uint32_t block;
    stz_dtype dtype, scale_dtype;
    int ndim;
    uint64_t shape[STZ_ST_MAX_NDIM];
    uint64_t numel, rows, cols, nblocks; /* rows, cols: of the transpose when transposed */
    int transposed;                      /* "transposed": the codes are the matrix's transpose, rows by rows */
    float scalar;
    /* svd: W = U diag(S) Vh, INT8 factors with per-row F32 scales */
    int svd;
    uint64_t rank;
    const stz_tensor *Us, *S, *Vh, *Vs;
    float s_scale;
    float *vh, *sv; /* Vh and S dequantized, on first use */
} qinfo;

void stz_qi_free(qinfo *qi);
stz_status stz_qi_rows(const stz_reader *r, qinfo *qi, uint64_t row, size_t nr, uint8_t *raw, uint8_t *sbytes,
                       float *sc, float *f, stz_err *err);
stz_status stz_qi_scan(const stz_reader *r, qinfo *qi, char *skip, size_t *maxcols, stz_err *err);

#endif /* STZ_QUANT_META_H */
