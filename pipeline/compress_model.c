/* A whole model compressed (stz compress, tune's rounds, Python's
 * compress): error feedback calibrated when the policy asks for it, then
 * every file quantized straight into its container (or packed as it is),
 * a sharded directory shard by shard on threads and ranks, the statistics
 * summed over all of them. */
#include "core/stz_core.h"
#include "stages.h"
#include "stz_feedback.h"
#include "stz_imatrix.h"
#include "stz_pipeline.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- error feedback -------------------------------------------------- */

stz_status stz_seqs_get_staged(stz_fwd *m, const stz_seq_spec *seqs, const char *label, const stz_stages *progress,
                               int quiet, stz_seqs *q, char *source, stz_err *err)
{
    stz_stage g = stz_stage_open(progress, "sampling", quiet || seqs->path, 1);
    stz_status st = stz_seqs_get(seqs, m, label, stz_stage_step, &g, q, source, err);
    stz_stage_close(&g);
    return st;
}

uint64_t stz_feedback_keep(const stz_fwd *m, const stz_seq_spec *seqs)
{
    const stz_seq_spec defaults = STZ_FEEDBACK_SEQS, *s = seqs ? seqs : &defaults;
    const stz_fwd_config *c = stz_fwd_cfg(m);
    uint64_t positions = (uint64_t)s->nseq * stz_seq_spec_len(s, m);
    return positions * 6 * ((uint64_t)c->dim + c->hidden) * sizeof(float);
}

stz_status stz_feedback_seqs(stz_fwd *m, const stz_seq_spec *seqs, const char *label, const stz_stages *progress,
                             int quiet, stz_seqs *q, stz_err *err)
{
    const stz_seq_spec defaults = STZ_FEEDBACK_SEQS;
    char source[STZ_SEQS_SOURCE_MAX];
    stz_fwd_set_keep(m, stz_feedback_keep(m, seqs));
    return stz_seqs_get_staged(m, seqs ? seqs : &defaults, label, progress, quiet, q, source, err);
}

stz_status stz_feedback_calibrate(stz_feedback **fb, const char *model, stz_policy *policy, const stz_seq_spec *seqs,
                                  const stz_seqs *drawn, const char *config, int threads, const stz_stages *progress,
                                  int quiet, stz_err *err)
{
    *fb = NULL;
    if (!stz_policy_feedback(policy))
        return STZ_OK;
    stz_model_set S = {0};
    stz_fwd *fwd = NULL;
    stz_seqs q = {0};
    stz_status st = stz_fwd_open_model(&fwd, &S, model, config, threads, err);
    if (!st && !drawn)
        st = stz_feedback_seqs(fwd, seqs, model, progress, quiet, &q, err);
    if (!st) {
        const stz_seqs *d = drawn ? drawn : &q;
        stz_stage g = stz_stage_open(progress, "feedback", quiet, 1);
        st = stz_feedback_run(fb, fwd, policy, d->tok, d->nseq, 0, d->lens, threads, stz_stage_step, &g, err);
        stz_stage_close(&g);
    }
    if (st) {
        stz_feedback_free(*fb);
        *fb = NULL;
    }
    stz_seqs_free(&q);
    stz_fwd_free(fwd);
    stz_model_set_free(&S);
    return st;
}

/* 1 if sampling `ahead` draws the sequences of s and more tokens of each. */
static int draws_ahead(const stz_seq_spec *s, const stz_seq_spec *ahead, const stz_fwd *m)
{
    return ahead && !s->path && !ahead->path && ahead->nseq == s->nseq && ahead->seed == s->seed &&
           ahead->temperature == s->temperature && ahead->top_p == s->top_p &&
           stz_seq_spec_len(ahead, m) > stz_seq_spec_len(s, m);
}

stz_status stz_imatrix_sample(stz_imatrix *im, stz_fwd *m, const stz_seq_spec *seqs, const stz_seq_spec *ahead,
                              const char *label, const stz_stages *progress, int quiet, stz_seqs *q, char *source,
                              stz_err *err)
{
    const stz_seq_spec defaults = STZ_IMATRIX_SEQS;
    const stz_seq_spec *s = seqs ? seqs : &defaults;
    stz_status st;
    if (draws_ahead(s, ahead, m)) { /* m keeps them: s's are their first tokens, given without a pass */
        stz_seqs a = {0};
        char from[STZ_SEQS_SOURCE_MAX];
        stz_fwd_set_imatrix_tokens(m, im, stz_seq_spec_len(s, m));
        st = stz_seqs_get_staged(m, ahead, label, progress, quiet, &a, from, err);
        stz_fwd_set_imatrix(m, NULL);
        stz_seqs_free(&a);
        if (!st)
            st = stz_seqs_get(s, m, label, NULL, NULL, q, source, err);
    } else {
        stz_fwd_set_imatrix(m, s->path ? NULL : im); /* sampled: collected as they are sampled */
        st = stz_seqs_get_staged(m, s, label, progress, quiet, q, source, err);
        stz_fwd_set_imatrix(m, NULL);
    }
    if (!st && s->path) {
        stz_stage g = stz_stage_open(progress, "imatrix", quiet, 1);
        st = stz_imatrix_collect(im, m, q->tok, q->nseq, 0, q->lens, stz_stage_step, &g, err);
        stz_stage_close(&g);
    }
    if (!st) {
        char dataset[STZ_SEQS_SOURCE_MAX + 64];
        snprintf(dataset, sizeof dataset, "stz imatrix: %zu sequences, %s", q->nseq, source);
        stz_imatrix_describe(im, dataset, (uint32_t)q->nseq, (uint32_t)q->longest);
    }
    return st;
}

/* ---- the files ------------------------------------------------------- */

typedef struct {
    const stz_compress_params *p;
    stz_feedback *fb;
    stz_compress_result *r;
    int64_t wfix; /* sum of cosine x parameters in 1/65536: integers add up the same in any order */
    double wtot;
    pthread_mutex_t lock; /* the sums, when shards run at once */
} compress_run;

/* One file's statistics into the sums: qs->in_bytes the model's bytes (not
 * a quantized file's), out_bytes the container's. */
static void add_stats(compress_run *c, const stz_quant_stats *qs, uint64_t out_bytes)
{
    stz_quant_stats *t = &c->r->stats;
    pthread_mutex_lock(&c->lock);
    t->tensors += qs->tensors;
    t->quantized += qs->quantized;
    t->params += qs->params;
    t->params_quantized += qs->params_quantized;
    c->wfix += llround(ldexp(qs->weighted_cosine * (double)qs->params, 16));
    c->wtot += (double)qs->params;
    if (qs->quantized && qs->min_cosine < t->min_cosine) {
        t->min_cosine = qs->min_cosine;
        memcpy(t->worst, qs->worst, sizeof qs->worst);
    }
    c->r->in_bytes += qs->in_bytes;
    c->r->out_bytes += out_bytes;
    c->r->files++;
    pthread_mutex_unlock(&c->lock);
}

/* One file: quantized straight into the container (one pass, no
 * intermediate file), or packed as it is without a policy; "-" is
 * standard input (packed). */
static stz_status compress_one(void *user, const char *in, const char *out, int threads, int quiet, stz_err *err)
{
    compress_run *c = (compress_run *)user;
    const stz_compress_params *p = c->p;
    const char *shard = strrchr(in, '/') ? strrchr(in, '/') + 1 : in;
    char label[64];
    snprintf(label, sizeof label, "compress %.40s", shard);
    stz_stage g = stz_stage_open(p->progress, label, quiet, 0);
    stz_pack_params pp = STZ_PACK_PARAMS_DEFAULT;
    pp.threads = threads;
    pp.level = p->best ? STZ_PACK_BEST : STZ_PACK_FAST;
    pp.write_flags = p->write_flags;
    stz_pack_stats ps;
    stz_quant_stats qs = {0};
    stz_status s;
    if (!p->policy) {
        pp.progress = stz_stage_step;
        pp.progress_user = &g;
        s = strcmp(in, "-") ? stz_pack_file(&pp, in, out, &ps, err)
                            : stz_pack_stream(&pp, STDIN_FILENO, "standard input", out, &ps, err);
        qs.in_bytes = ps.in_bytes;
    } else {
        stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
        qp.threads = threads;
        qp.progress = stz_stage_step;
        qp.progress_user = &g;
        qp.imatrix = p->imatrix;
        qp.feedback = c->fb;
        qp.config = p->config;
        s = stz_compress_file(&qp, &pp, p->policy, in, out, &qs, &ps, err);
    }
    stz_stage_close(&g);
    if (!s)
        add_stats(c, &qs, ps.out_bytes);
    return s;
}

/* Under ranks: every rank's sums, the lowest cosine and its tensor. */
static void gather(const stz_ranks *k, compress_run *c)
{
    stz_compress_result *r = c->r;
    stz_quant_stats *t = &r->stats;
    double v[10] = {(double)r->in_bytes,
                    (double)r->out_bytes,
                    (double)r->files,
                    (double)t->tensors,
                    (double)t->quantized,
                    (double)t->params,
                    (double)t->params_quantized,
                    (double)(c->wfix >> 32),
                    (double)(c->wfix & 0xffffffff), /* exact in doubles */
                    c->wtot};
    k->sum(k->user, v, 10);
    r->in_bytes = (uint64_t)v[0], r->out_bytes = (uint64_t)v[1], r->files = (size_t)v[2];
    t->tensors = (size_t)v[3], t->quantized = (size_t)v[4], t->params = (uint64_t)v[5];
    t->params_quantized = (uint64_t)v[6], c->wfix = (int64_t)v[7] * ((int64_t)1 << 32) + (int64_t)v[8];
    c->wtot = v[9];
    int who = k->min_rank(k->user, t->min_cosine);
    k->bcast(k->user, &t->min_cosine, sizeof t->min_cosine, who);
    k->bcast(k->user, t->worst, sizeof t->worst, who);
}

/* The files: a sharded directory's shards, or one file. */
static stz_status compress_files(compress_run *c, const char *in, int sharded, const char *out, stz_err *err)
{
    const stz_compress_params *p = c->p;
    if (!sharded)
        return compress_one(c, in, out, p->threads, p->quiet, err);
    stz_shards_params sp = {.in_suffix = "",
                            .out_suffix = ".stz",
                            .rewrite_index = p->policy != NULL,
                            .threads = p->threads,
                            .quiet = p->quiet,
                            .convert = compress_one,
                            .user = c,
                            .ranks = p->ranks};
    stz_status st = stz_convert_shards(&sp, in, out, err);
    if (!st && p->ranks && p->ranks->size > 1)
        gather(p->ranks, c);
    return st;
}

/* stz_compress_model on `in`, a file or a sharded directory. */
static stz_status compress_model(const stz_compress_params *p, const char *in, const char *out, stz_compress_result *r,
                                 stz_err *err)
{
    compress_run c = {.p = p, .r = r};
    int sharded = stz_model_is_sharded(in);
    if (p->ranks && p->ranks->size > 1 && !sharded)
        return stz_err_set(err, STZ_E_ARG, "%s: on several ranks the model must be a sharded directory", in);
    if (!strcmp(in, "-") && p->policy)
        return stz_err_set(err, STZ_E_ARG, "standard input: quantizing needs a file (it reads each tensor twice)");
    size_t n = strlen(out);
    if (!sharded && n > 5 && !strcasecmp(out + n - 5, ".gguf"))
        return stz_err_set(err, STZ_E_ARG,
                           "%s: stz compress writes an stz container, not a GGUF file llama.cpp runs: export one "
                           "(stz export --gguf, or stz gguf)",
                           out);
    stz_status st = STZ_OK;
    if (!sharded && strcmp(out, "-")) /* before the long work */
        st = stz_output_check(out, (p->write_flags & STZ_WRITE_FORCE) != 0, err);
    if (!st && p->policy)
        st = stz_feedback_calibrate(&c.fb, in, p->policy, p->feedback_seqs, p->feedback_drawn, p->config, p->threads,
                                    p->progress, p->quiet, err);
    if (p->ranks && p->ranks->size > 1 && p->ranks->any_failed(p->ranks->user, st != STZ_OK, err))
        st = st ? st : err->code; /* every rank stops, with the lowest failing rank's error */
    if (st) {
        stz_feedback_free(c.fb);
        return st;
    }
    pthread_mutex_init(&c.lock, NULL);
    st = compress_files(&c, in, sharded, out, err);
    pthread_mutex_destroy(&c.lock);
    stz_feedback_free(c.fb);
    r->stats.weighted_cosine = c.wtot ? ldexp((double)c.wfix, -16) / c.wtot : 1;
    return st;
}

stz_status stz_compress_model(const stz_compress_params *p, const char *in, const char *out, stz_compress_result *r,
                              stz_err *err)
{
    char *file;
    memset(r, 0, sizeof *r);
    r->stats.min_cosine = 1;
    stz_status st = stz_model_file(in, &file, err); /* a directory holding model.safetensors: that file */
    if (!st)
        st = compress_model(p, file, out, r, err);
    free(file);
    return st;
}

/* ---- what the commands choose by default ----------------------------- */

stz_status stz_policy_for_model(const stz_policy_spec *spec, const char *model, const char *config, int fast, int asked,
                                stz_policy **out, stz_err *note, stz_err *err)
{
    stz_policy_spec s = *spec;
    *out = NULL;
    stz_err_clear(note);
    if (!fast && (asked || config))
        s.feedback = STZ_POLICY_FEEDBACK_UNSAID; /* calibration's options: it is asked for */
    if (!fast && !s.feedback) {
        int runs = stz_fwd_runs(model, config, note);
        if (runs < 0)
            return *err = *note, err->code;
        s.feedback = runs ? STZ_POLICY_FEEDBACK_UNSAID : 0;
        if (runs)
            stz_err_clear(note);
    }
    stz_status st = stz_policy_build(&s, out, err);
    if (!st && (asked || config) && !stz_policy_feedback(*out))
        st = stz_err_set(err, STZ_E_ARG,
                         fast ? "--tokens, --sequences, --seq-len, --seed and --config are calibration's: not with "
                                "--fast"
                              : "--tokens, --sequences, --seq-len, --seed and --config are calibration's, and the "
                                "policy quantizes no blocks");
    if (st) {
        stz_policy_free(*out);
        *out = NULL;
    }
    return st;
}

size_t stz_compress_output_name(char *dst, size_t cap, const char *in, int lossless, const char *policy)
{
    size_t n = strlen(in);
    while (n > 1 && in[n - 1] == '/')
        n--;
    const char *p = policy ? policy : "custom", *slash = strrchr(p, '/'), *tag = slash ? slash + 1 : p;
    size_t t = strlen(tag);
    if (t > 5 && !strcmp(tag + t - 5, ".json")) /* a policy file: its name without .json */
        t -= 5;
    int w = lossless ? snprintf(dst, cap, "%.*s.stz", (int)n, in)
            : n > 12 && !strncmp(in + n - 12, ".safetensors", 12)
                ? snprintf(dst, cap, "%.*s.%.*s.safetensors.stz", (int)(n - 12), in, (int)t, tag)
                : snprintf(dst, cap, "%.*s.%.*s.stz", (int)n, in, (int)t, tag);
    return w < 0 ? 0 : (size_t)w;
}
