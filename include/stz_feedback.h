/*
 * stz_feedback.h - error feedback (GPTQ-style) with sequential calibration
 * (docs/cli/quantize.md, "Error feedback").
 *
 * A policy rule with "feedback": true quantizes its matrices with
 * stz_quantize_tensor_feedback (stz_kernels.h): each rounding error is pushed
 * onto the columns not yet quantized through the inverse Gram matrix of the
 * layer's inputs. Those inputs come from stz's own forward pass over
 * calibration sequences (sampled from the model, or given), layer by
 * layer, and within a layer input by input: each matrix's inputs are
 * collected with the matrices before it already quantized, and with the
 * original model's inputs beside them each matrix is first moved to its
 * least-squares fit of the original outputs (stz_quantize_tensor_feedback's
 * D); the layer then runs with them to give layer l + 1 its inputs. The results wait in an unlinked temporary
 * file until stz_quantize_file / stz_compress_file write them
 * (stz_quant_params.feedback); the format is the one the rule's action
 * always writes, so every reader and export works unchanged.
 *
 * Memory: one layer's weights (F32, and quantized), one input's Gram
 * matrix and drift (cols x cols floats each), the calibration hidden
 * states twice (the original model's too) and the original model's inputs
 * to one layer's matrices, and the largest layer matrix twice while it is
 * quantized (the head once): not the model.
 */
#ifndef STZ_FEEDBACK_H
#define STZ_FEEDBACK_H

#include "stz.h"
#include "stz_kernels.h"
#include "stz_experimental.h"
#include "stz_forward.h"
#include "stz_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What stz_forward_grams does with each matrix it reaches. */
typedef struct {
    /* 1: visit this 2-D tensor of the model (a layer's projection, the head) */
    int (*wants)(void *user, const stz_qtensor *t);
    /* W: its values (rows x cols, F32); H: the Gram matrix of its inputs over
     * the sequences (cols x cols, symmetric); D: with rewrite, how the
     * original model's inputs X differ from those, (X - Xq)^T Xq (cols x
     * cols; NULL without rewrite and for a tied head); y: with rewrite,
     * where to put the values the layer runs with from now on (NULL for
     * the head) */
    stz_status (*matrix)(void *user, const stz_qtensor *t, const float *W, const float *H, const float *D, float *y,
                         stz_err *err);
    void *user;
    int rewrite; /* 1: each layer runs again with its matrices' new values (sequential calibration) */
} stz_gram_visitor;

/* Runs m over nseq sequences (lens[s] tokens each, stride apart; 0: back to back) layer by
 * layer; in each layer, collects the Gram matrix of the inputs of every
 * matrix v->wants and gives it to v->matrix; last, the head's (a tied
 * head is the embedding), through the final norm. Without rewrite the
 * model runs as it is, once per layer; with it, input by input in the
 * layer's order, each matrix's inputs come from the matrices before it as
 * rewritten (earlier layers' and its own layer's), with D beside H: the
 * original model runs alongside. Memory: one layer's Gram matrices and
 * the largest matrix (with rewrite: one input's Gram matrix and drift, the
 * original model's states and one layer's inputs, the largest matrix
 * twice). Progress counts layers. */
STZ_API stz_status stz_forward_grams(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                                     const stz_gram_visitor *v, stz_fwd_progress progress, void *user, stz_err *err);

typedef struct stz_feedback stz_feedback;

/* Runs m over nseq sequences (lens[s] tokens each, stride apart; 0: back to back) layer by
 * layer and quantizes with error feedback every matrix whose decision
 * under `policy` says "feedback": true (the projections of each layer, and
 * the output head; a tied head is the embedding). Other tensors are left
 * to the pipeline; so is an untied token embedding, which no matrix
 * product reads (stz_feedback_skipped counts such tensors). `threads`:
 * the quantizers' threads (the bytes do not depend on it). Progress counts
 * layers. */
STZ_API stz_status stz_feedback_run(stz_feedback **out, stz_fwd *m, stz_policy *policy, const int32_t *tokens,
                                    size_t nseq, size_t stride, const size_t *lens, int threads,
                                    stz_fwd_progress progress, void *user, stz_err *err);
STZ_API void stz_feedback_free(stz_feedback *fb);

/* Matrices quantized with feedback; feedback rules' tensors left to plain
 * quantization (no matrix input), and the first such tensor's name. */
STZ_API size_t stz_feedback_count(const stz_feedback *fb);
STZ_API size_t stz_feedback_skipped(const stz_feedback *fb, const char **example);

/* Tensor `name` as quantized with feedback, read back into *out (the caller
 * frees it with stz_qmem_free; its cosine against the original included);
 * *found = 0 when fb does not hold it. STZ_E_ARG when it was quantized
 * under another decision than d (another policy). */
STZ_API stz_status stz_feedback_take(stz_feedback *fb, const char *name, const stz_decision *d, stz_qmem *out,
                                     int *found, stz_err *err);

#ifdef __cplusplus
}
#endif
#endif
