/* The quantizers built for AVX2 alone (test_qformat.c compares them with
 * the library's, which take the AVX-512 clone where the machine has it). */
#include "stz_internal.h"
#include "stz_quant.h"

#if STZ_X86_CLONES
#define STZ_QF_CLONES __attribute__((target("avx2")))
#define QF_COPY(name) avx2_qf_##name
#include "qformat_copy.h"
#endif
