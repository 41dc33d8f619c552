/*
 * stz_imatrix.h - importance matrices: per weight matrix, the mean square
 * of each input column over calibration tokens (stz imatrix,
 * docs/cli/imatrix.md).
 *
 * Quantizing row w of a matrix changes its output by sum_j (w_j - q_j) x_j;
 * over tokens, with the columns taken as uncorrelated, the mean squared
 * change is sum_j E[x_j^2] (w_j - q_j)^2. The importance of column j is
 * E[x_j^2], and a quantizer that minimizes the error weighted by it
 * minimizes the layer's output error rather than the weights'.
 *
 * Entries are named as llama.cpp names the matrices (blk.N.attn_q.weight,
 * output.weight; token_embd.weight when the head is the tied embedding),
 * and files are llama.cpp's imatrix GGUF (NAME.in_sum2: per column the sum
 * of squares; NAME.counts: the tokens), which llama-quantize reads too;
 * llama.cpp's legacy .dat files are read as well.
 */
#ifndef STZ_IMATRIX_H
#define STZ_IMATRIX_H

#include "stz.h"
#include "stz_experimental.h"
#include "stz_forward.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stz_imatrix stz_imatrix;

/* An empty importance matrix, to collect into. */
STZ_API stz_status stz_imatrix_new(stz_imatrix **out, stz_err *err);
STZ_API void stz_imatrix_free(stz_imatrix *im);

/* While attached (im not NULL), every pass of m adds the inputs of its
 * matrices to im: stz_fwd_sample's included, so that sampling calibration
 * sequences collects their importance in the same pass. NULL detaches. */
STZ_API void stz_fwd_set_imatrix(stz_fwd *m, stz_imatrix *im);
/* The same, but stz_fwd_sample adds only the steps that draw each
 * sequence's first len tokens (what sampling len tokens adds), so that one
 * sampling of longer sequences collects it too (0: every step). */
STZ_API void stz_fwd_set_imatrix_tokens(stz_fwd *m, stz_imatrix *im, size_t len);

/* Runs m's layers over nseq sequences (lens[s] tokens each, stride apart; 0: back to back),
 * a few sequences at a time, adding every matrix's inputs to im (the
 * head's too; no logits are computed). Progress counts layers. */
STZ_API stz_status stz_imatrix_collect(stz_imatrix *im, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                                       const size_t *lens, stz_fwd_progress progress, void *user, stz_err *err);

/* Records where the tokens came from and how they were grouped (the
 * file's imatrix.datasets, imatrix.chunk_count and imatrix.chunk_size):
 * a description, the sequences and the tokens of the longest. */
STZ_API void stz_imatrix_describe(stz_imatrix *im, const char *dataset, uint32_t chunks, uint32_t chunk_size);
/* The description (a loaded file's imatrix.datasets as text), and the
 * tokens of the entry that saw the most. */
STZ_API const char *stz_imatrix_dataset(const stz_imatrix *im, double *tokens);

/* Writes im as llama.cpp's imatrix GGUF (a temporary name, renamed at the
 * end; an existing file only with force). */
STZ_API stz_status stz_imatrix_save(const stz_imatrix *im, const char *path, int force, stz_err *err);

/* Reads an imatrix GGUF (llama.cpp's or stz's) or llama.cpp's legacy .dat
 * file, opened once. Entries of stacked expert matrices (several counts)
 * are pooled into one; names may be of any length. STZ_E_FORMAT names the
 * file and the entry at fault: a sum that is negative, NaN or infinite, a
 * negative token count, an entry zero in every column. */
STZ_API stz_status stz_imatrix_load(stz_imatrix **out, const char *path, stz_err *err);

/* stz_imatrix_load of `path` (NULL: *im NULL, STZ_OK) checked against the
 * model at `model` (a file or a directory, stz_model_files): an entry's
 * columns must match the tensor it names (STZ_E_SHAPE naming the file),
 * and some entry must name a matrix of the model (STZ_E_ARG: an importance
 * matrix of another model?). What --imatrix FILE does before any work. */
STZ_API stz_status stz_imatrix_load_for(stz_imatrix **im, const char *path, const char *model, stz_err *err);

/* Entries: count, and entry i's name, columns and tokens. */
STZ_API size_t stz_imatrix_count(const stz_imatrix *im);
STZ_API const char *stz_imatrix_name(const stz_imatrix *im, size_t i, uint64_t *cols, double *tokens);

/* The importance of each of the `cols` columns of tensor `name` (a GGUF
 * name, or a model's own in llama2.c's or Hugging Face's layout, mapped as
 * stz export maps it): *w points into im (NULL when im has no entry for
 * the tensor, or a collected entry that weighs nothing), the mean squares
 * divided by their mean, so that a constant scale of the inputs changes
 * nothing. STZ_E_SHAPE when the entry's columns differ. */
STZ_API stz_status stz_imatrix_find(const stz_imatrix *im, const char *name, uint64_t cols, const float **w,
                                    stz_err *err);

#ifdef __cplusplus
}
#endif
#endif
