/* The forward pass's model and layers, shared by forward.c (loading, the
 * layers, logits) and forward_use.c (sampling, comparing two models,
 * sensitivity probes). Library-internal. */
#ifndef STZ_FORWARD_INTERNAL_H
#define STZ_FORWARD_INTERNAL_H

#include "core/stz_core.h"
#include "roles.h"

/* m->global[]: the per-model roles, STZ_ROLE_EMBED + G_x (G_POS, G_NORM_B: absent, f -1, but in GPT-Neo) */
enum { G_EMBED, G_NORM, G_HEAD, G_POS, G_NORM_B, G_COUNT };

typedef struct {
    int f; /* file, -1: absent */
    size_t i;
} loc;

struct stz_fwd {
    stz_fwd_config c;
    stz_qmodel **files;
    size_t nfiles;
    char label[512];
    int threads;
    loc *layer;                 /* n_layers x STZ_ROLE_PER_LAYER */
    loc global[G_COUNT];        /* G_HEAD is the embedding when tied */
    float *inv_freq;            /* head_dim / 2 RoPE frequencies, then the local layers' (Gemma 3) */
    float **keep;               /* sampling: weights kept between steps, per layer x STZ_ROLE_PER_LAYER */
    size_t keep_layers;         /* layers kept */
    float *keep_head;           /* sampling: the output head (vocab, dim), when it fits too */
    uint64_t keep_budget;       /* sampling: bytes of F32 weights kept between steps */
    struct stz_fwd_hook *hooks; /* observers and rewriters attached (stz_forward_attach), in order */
    size_t step;                /* sampling: the tokens drawn so far, the one being drawn included (0: not sampling) */
    struct {                    /* the largest sequences stz_fwd_sample drew, for the requests they cover */
        int32_t *tok;
        size_t nseq, len;
        uint64_t seed;
        double temperature, top_p;
    } drawn;
};

/* An observer or rewriter of the forward pass (llama.cpp's cb_eval),
 * attached to a model and called as its layers run: the importance matrix
 * (imatrix.c), error feedback's Gram matrices and rewritten weights
 * (calibrate.c) and tune's probes (forward_use.c) are its clients, so the
 * layers name none of them. Callbacks may be NULL. */
typedef struct stz_fwd_hook stz_fwd_hook;
struct stz_fwd_hook {
    /* X (n rows of cols): the input of matrices roles[0..k) of `layer` (the head's: layer 0) */
    stz_status (*input)(stz_fwd_hook *h, const stz_fwd *m, uint32_t layer, const int *roles, int k, const float *X,
                        size_t n, size_t cols, stz_err *err);
    /* rows [r0, r0 + n) of the tensor at `at` as read, changed in place; nonzero: out of memory */
    int (*weights)(stz_fwd_hook *h, const stz_fwd *m, loc at, float *rows, uint64_t r0, size_t n, size_t cols);
    size_t tokens; /* sampling: observes the steps that draw the first `tokens` tokens only (0: all) */
    void *user;
    stz_fwd_hook *next; /* the model's list */
};

/* Attaches h after the hooks attached before (none twice); detaches it. */
void stz_forward_attach(stz_fwd *m, stz_fwd_hook *h);
void stz_forward_detach(stz_fwd *m, const stz_fwd_hook *h);

/* A batch of rows: row r is the token at position pos[r] of sequence
 * seq[r]; the key/value cache holds cap positions per sequence. */
typedef struct {
    size_t n;
    const uint32_t *pos, *seq;
    size_t cap;
    float *k, *v; /* per layer: nseq x cap x kv_dim, for `layers` layers (1: reused) */
    size_t layers;
} batch;

/* The rows of nseq sequences (lens[s] tokens each, stride apart; 0: back to back) laid
 * out for the layers: position, sequence and token of each row, and one
 * layer's key/value cache. */
typedef struct {
    uint32_t *pos, *seq;
    int32_t *tok;
    float *k, *v;
    size_t nseq;
    batch b;
} seq_rows;

const stz_qtensor *stz_forward_tensor(const stz_fwd *m, loc at);
/* 1 when the output head is the token embedding (tied embeddings). */
static inline int stz_forward_tied(const stz_fwd *m)
{
    return m->global[G_HEAD].f == m->global[G_EMBED].f && m->global[G_HEAD].i == m->global[G_EMBED].i;
}
stz_status stz_forward_read_rows(stz_fwd *m, loc at, uint64_t r0, size_t n, float *dst, stz_err *err);
/* The model's norm of one row of n (RMSNorm, Gemma's by 1 + w, or LayerNorm with bias b). */
void stz_forward_norm(const stz_fwd *m, float *o, const float *x, const float *w, const float *b, size_t n);
void stz_forward_linear(const stz_fwd *m, float *Y, const float *X, const float *W, const float *b, size_t n, size_t in,
                        size_t out);
stz_status stz_forward_run_layers(stz_fwd *m, float *X, const batch *b, size_t nseq, uint32_t l0, uint32_t l1,
                                  stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total, stz_err *err);
/* The input of rows: token embeddings, plus the learned position embedding of pos[r] (GPT-Neo): X (n, dim). */
stz_status stz_forward_embed(stz_fwd *m, const int32_t *tok, const uint32_t *pos, size_t n, float *X, stz_err *err);
stz_status stz_forward_head(stz_fwd *m, float *X, size_t n, float *logits, stz_err *err);
/* Gemma 2's soft-capping of n rows of k logits (ld apart) in place, if the model caps them. */
void stz_forward_cap_logits(const stz_fwd *m, float *L, size_t n, size_t k, size_t ld);
void stz_forward_rows_free(seq_rows *R);
stz_status stz_forward_rows_make(const stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                                 const size_t *lens, seq_rows *R, stz_err *err);
stz_status stz_forward_hidden_states(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                                     float *X, stz_fwd_progress progress, void *user, uint64_t *done, uint64_t total,
                                     stz_err *err);
/* Where the sequence after one of `len` tokens at `at` starts: `stride`
 * apart, or back to back when stride is 0 (the public functions' layout). */
static inline size_t stz_seq_next(size_t at, size_t stride, size_t len) { return at + (stride ? stride : len); }

/* Where sequence s1 starts, from where s0 starts (the same layout). */
static inline size_t stz_seq_skip(size_t at, size_t stride, const size_t *lens, size_t s0, size_t s1)
{
    for (size_t s = s0; s < s1; s++)
        at = stz_seq_next(at, stride, lens[s]);
    return at;
}

/* The end s1 of the batch of sequences from s0 that a pass takes at once:
 * at most `rows` positions (the activations), at most 4 * rows padded to
 * the longest (the keys and values); at least one sequence. *sum (if not
 * NULL): its positions. Batches give the bits of one pass: a row's values
 * depend on its own sequence alone. */
size_t stz_forward_batch_end(const size_t *lens, size_t nseq, size_t s0, size_t rows, size_t *sum);
void stz_forward_drop_kept(stz_fwd *m);
/* The final norm of rows X (n, dim) in place (the head's input), given to the hooks as the head's input. */
stz_status stz_forward_final_norm(stz_fwd *m, float *X, size_t n, stz_err *err);
/* The final norm alone (no hook sees it). */
stz_status stz_forward_out_norm(stz_fwd *m, float *X, size_t n, stz_err *err);
/* Gives X (n rows of cols), the input of matrices roles[0..k) of `layer`,
 * to the hooks attached. */
stz_status stz_forward_observe(stz_fwd *m, uint32_t layer, const int *roles, int k, const float *X, size_t n,
                               size_t cols, stz_err *err);

#endif /* STZ_FORWARD_INTERNAL_H */
