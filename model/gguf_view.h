/* A GGUF file seen as a SafeTensors file of floats: every tensor decoded
 * where it is read, under the model's own names (the inverse of export's
 * mapping, with export's q/k row permutation undone). Opened by
 * stz_qmodel_open and stz_dequantize_file for a GGUF path. Not installed. */
#ifndef STZ_GGUF_VIEW_H
#define STZ_GGUF_VIEW_H

#include "gguf/gguf_layout.h" /* stz_is_gguf */
#include "stz_model.h"

typedef struct stz_gguf_view stz_gguf_view;

/* Opens the GGUF file `path` as a view whose tensors have dtype (F32, BF16
 * or F16; 1-D tensors always F32) and names in `names`. STZ_E_UNSUPPORTED
 * names a tensor of a type stz cannot decode yet. */
stz_status stz_gguf_view_open(stz_gguf_view **out, const char *path, stz_names names, stz_dtype dtype, stz_err *err);
/* The view's reader: its data reads decode the GGUF file. */
const stz_reader *stz_gguf_view_reader(const stz_gguf_view *v);
void stz_gguf_view_free(stz_gguf_view *v);
/* The ggml type name of the view's tensor i, and its bytes in the file. */
const char *stz_gguf_view_type(const stz_gguf_view *v, size_t i, uint64_t *bytes);

#endif /* STZ_GGUF_VIEW_H */
