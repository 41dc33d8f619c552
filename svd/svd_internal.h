/* Internal: the SVD without its finiteness check, so that tests can drive
 * LAPACK into its own failure paths (NaN input). */
#ifndef STZ_SVD_INTERNAL_H
#define STZ_SVD_INTERNAL_H

#include "stz_svd.h"

stz_status stz_svd_factor_unchecked(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                                    stz_err *err);

#endif
