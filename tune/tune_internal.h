/* Pieces shared by tune's measuring (probe.c) and its output errors
 * (output_error.c). Not installed. */
#ifndef STZ_TUNE_INTERNAL_H
#define STZ_TUNE_INTERNAL_H

#include "stz_tune.h"
#include "stz_kernels.h"

/* The tensor of that name, or NULL. */
stz_tune_tensor *stz_tune_find(const stz_tune *T, const char *name);

/* Candidate c of tensor t stored as q: its bytes in the container (or the
 * GGUF file) in t->bytes[c], and *raw its stored bytes before the
 * lossless stage. */
stz_status stz_tune_cand_bytes(const stz_tune *T, stz_tune_tensor *t, size_t c, const stz_qmem *q, uint64_t *raw,
                               stz_err *err);

/* With gguf, STZ_E_ARG naming the first candidate GGUF cannot hold (not
 * keep, not one of llama.cpp's types). */
stz_status stz_tune_gguf_cands(const stz_tune_cand *cand, size_t ncand, stz_err *err);

#endif
