/* stz tune as a call: the model and its forward pass opened, every
 * candidate measured and every matrix's sensitivity probed, the budget
 * solved; then the choice compressed (and exported) and run against the
 * original, solved again with the prediction corrected while the budget is
 * missed, and the last one placed. */
#include "core/stz_core.h"
#include "gguf/gguf_format.h"
#include "pipeline/stages.h"
#include "stz_export.h"
#include "stz_imatrix.h"
#include "stz_tune.h"
#include "tune_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One run: the model, its forward pass and sequences, the intermediate
 * files of the verification. */
typedef struct {
    const stz_tune_run_params *p;
    const char *model;
    stz_tune_result *r;
    int sharded;
    stz_model_set S;
    stz_imatrix *im;
    stz_fwd *fwd;
    stz_fwd_config cfg;
    char *cfg_json; /* config.json's text, for gguf's export */
    stz_seqs q;
    stz_seqs fq;      /* error feedback's sequences, drawn once for the measures and every round's compress */
    const char *list; /* the candidates, as given or by default */
    stz_tune_cand *cand;
    size_t ncand;
    uint64_t gguf_keep;  /* gguf: the GGUF file's bytes with every tensor kept */
    uint64_t gguf_widen; /* gguf: what its header grows by with a widened FFN */
    stz_tmpfile tc;      /* the container, or with gguf the GGUF file */
    stz_tmpfile tcc;     /* gguf: the container exported */
} tune_run;

const char *stz_tune_goal_option(stz_tune_goal g)
{
    static const char *const opt[] = {"--size",   "--ratio",           "--bits-per-weight",
                                      "--max-kl", "--bits-per-weight", "--like"};
    return (unsigned)g < sizeof opt / sizeof *opt ? opt[g] : "?";
}

void stz_tune_bpw(const stz_tune *T, uint64_t bytes, double *data_bpw, double *file_bpw)
{
    double params = (double)T->params, data = bytes > T->extra_bytes ? (double)(bytes - T->extra_bytes) : 0;
    *data_bpw = params > 0 ? data * 8 / params : 0;
    *file_bpw = params > 0 ? (double)bytes * 8 / params : 0;
}

static stz_gguf_params gguf_params(const stz_tune_run_params *p)
{
    stz_gguf_params g = STZ_GGUF_PARAMS_DEFAULT;
    g.tokenizer = p->tokenizer, g.name = p->name, g.threads = p->threads, g.write_flags = STZ_WRITE_FORCE;
    g.pad_vocab = p->pad_vocab;
    return g;
}

/* The sequences error feedback calibrates on: the file's when given (tune
 * measures on them too), else NULL, its default sampled ones. */
static const stz_seq_spec *feedback_seqs(const stz_tune_run_params *p) { return p->seqs.path ? &p->seqs : NULL; }

int stz_tune_missed(const stz_tune_result *r, const stz_tune_check *m)
{
    return r->kind == STZ_BUDGET_KL ? m->fwd.kl_mean > r->budget : (double)m->bytes > r->budget;
}

/* 1 if a candidate is quantized with error feedback. */
static int any_feedback(const tune_run *t)
{
    for (size_t c = 0; c < t->ncand; c++)
        if (t->cand[c].d.feedback)
            return 1;
    return 0;
}

/* ---- opening --------------------------------------------------------- */

/* gguf: before the long work, a model export cannot write; the file's
 * bytes with every tensor kept, and what a widened FFN adds. */
static stz_status gguf_check(tune_run *t, stz_err *err)
{
    stz_gguf_params gp = gguf_params(t->p);
    stz_gguf_stats *gs = &t->r->gguf;
    stz_status st = stz_gguf_export(&gp, t->S.m, t->S.n, &t->cfg, t->cfg_json, t->model, NULL, NULL, gs, err);
    if (!st && t->p->goal == STZ_TUNE_LIKE && !gs->like_bytes[stz_gguf_like_parse(t->p->like)])
        return stz_err_set(err, STZ_E_ARG,
                           "%s: llama-quantize %s cannot make a file of this model: a matrix's rows are not whole "
                           "blocks of its type or of the fallback it allows (llama.cpp: \"Unsupported tensor size "
                           "encountered\"); give another --like, --size or --bits-per-weight",
                           t->model, t->p->like);
    t->gguf_keep = gs->file_bytes;
    t->gguf_widen = gguf_padded(gs->header_bytes + STZ_GGUF_KEY_FFN_BYTES) - gguf_padded(gs->header_bytes);
    return st;
}

/* STZ_TUNE_LIKE of a type stz does not compute (or without gguf). */
static stz_status like_unknown(const char *like, stz_err *err)
{
    char names[256] = "";
    for (int i = 0; stz_gguf_like_name(i); i++) {
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", stz_gguf_like_name(i));
    }
    return stz_err_set(err, STZ_E_ARG, "--like %s: a GGUF budget takes one of llama-quantize's types: %s",
                       like ? like : "(none)", names);
}

/* calibrate: the importance matrix of the model's own sequences (the
 * tokens file's when given), as stz imatrix collects it; sampled, in the
 * pass that samples error feedback's longer sequences when a candidate
 * takes feedback (the forward pass keeps them for tune_feedback). */
static stz_status calibrate(tune_run *t, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    const stz_seq_spec fb = STZ_FEEDBACK_SEQS;
    stz_seqs q = {0};
    char source[STZ_SEQS_SOURCE_MAX];
    stz_status st = stz_imatrix_new(&t->im, err);
    stz_fwd_set_keep(t->fwd, stz_feedback_keep(t->fwd, feedback_seqs(p))); /* layers past it are read again */
    if (!st)
        st = stz_imatrix_sample(t->im, t->fwd, feedback_seqs(p), any_feedback(t) ? &fb : NULL, t->model, p->progress,
                                p->quiet, &q, source, err);
    stz_seqs_free(&q);
    return st;
}

/* The output checked, the candidates parsed, the model and its forward
 * pass opened, the sequences sampled or read. */
static stz_status tune_open(tune_run *t, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    stz_status st = STZ_OK;
    t->list = p->candidates ? p->candidates : stz_tune_candidate_set(p->gguf ? "gguf" : "default");
    if (p->out && !p->verify)
        return stz_err_set(err, STZ_E_ARG, "%s: a tune writes the verified container: verify it", p->out);
    if (p->goal == STZ_TUNE_LIKE && (!p->gguf || stz_gguf_like_parse(p->like) < 0))
        return like_unknown(p->like, err);
    if ((p->out && (st = stz_output_check(p->out, p->write_flags & STZ_WRITE_FORCE, err))) ||
        (st = stz_tune_parse_candidates(t->list, &t->cand, &t->ncand, err)) ||
        (p->gguf && (st = stz_tune_gguf_cands(t->cand, t->ncand, err))) || /* named as given, before +fb */
        (st = stz_model_set_open(&t->S, t->model, err)) ||
        (p->out && (st = stz_refuse_input_as_output(t->model, p->out, err))) ||
        (st = stz_imatrix_load_for(&t->im, p->imatrix, t->model, err)) ||
        (p->feedback && (st = stz_tune_cands_feedback(t->cand, t->ncand, err)))) /* keep, svd and f16 stay */
        return st;
    t->sharded = stz_model_is_sharded(t->model);
    char from[STZ_FWD_FROM_MAX];
    int found = stz_fwd_config_find(t->model, &t->S, p->config, &t->cfg, from, &t->cfg_json, err);
    if (found < 0)
        return err->code;
    if ((!found && (st = stz_fwd_no_config(t->model, &t->S, err))) || (p->gguf && (st = gguf_check(t, err))) ||
        (st = stz_fwd_open(&t->fwd, t->S.m, t->S.n, &t->cfg, t->model, p->threads, err)))
        return st;
    if (p->calibrate && !p->imatrix && (st = calibrate(t, err)))
        return st;
    stz_fwd_set_keep(t->fwd, stz_feedback_keep(t->fwd, NULL)); /* within feedback's memory, whatever the depth */
    return stz_seqs_get_staged(t->fwd, &p->seqs, t->model, p->progress, p->quiet, &t->q, t->r->source, err);
}

/* ---- measuring ------------------------------------------------------- */

/* With feedback candidates: the output errors, on the sequences error
 * feedback calibrates on (so that they are compress's). */
static stz_status tune_feedback(tune_run *t, stz_tune_params *tp, stz_err *err)
{
    if (!any_feedback(t))
        return STZ_OK;
    const stz_tune_run_params *p = t->p;
    stz_seqs *q = &t->fq;
    stz_status st = stz_feedback_seqs(t->fwd, feedback_seqs(p), t->model, p->progress, p->quiet, q, err);
    if (!st) {
        stz_stage g = stz_stage_open(p->progress, "tune: feedback", p->quiet, 1);
        tp->progress_user = &g;
        st = stz_tune_feedback(&t->r->T, t->fwd, q->tok, q->nseq, 0, q->lens, tp, err);
        stz_stage_close(&g);
    }
    return st;
}

/* The bytes besides the tuned tensors: with gguf the GGUF header and what
 * export writes besides them; a sharded directory's index and other files. */
static void extra_bytes(tune_run *t, double model_bytes)
{
    stz_tune *T = &t->r->T;
    if (t->p->gguf) {
        uint64_t kept = 0;
        for (size_t i = 0; i < T->nt; i++)
            kept += T->t[i].bytes[0];
        T->extra_bytes = t->gguf_keep > kept ? t->gguf_keep - kept : 0;
        T->widen_header = t->gguf_widen;
    } else if (t->sharded) {
        T->extra_bytes = (uint64_t)model_bytes;
        for (size_t f = 0; f < t->S.n; f++)
            T->extra_bytes -= stz_reader_file_size(stz_qmodel_reader(t->S.m[f]));
    }
}

/* Every candidate measured on every matrix, every matrix's sensitivity
 * probed; then the budget in bytes or KL. */
static stz_status tune_measure(tune_run *t, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    stz_tune_result *r = t->r;
    stz_stage g = stz_stage_open(p->progress, "tune: measure candidates", p->quiet, 0);
    stz_tune_params tp = {p->threads, stz_stage_step, &g, t->im, p->gguf, p->no_pad};
    stz_status st = stz_tune_measure(&r->T, t->S.m, t->S.n, t->cand, t->ncand, &tp, err);
    stz_stage_close(&g);
    if (!st)
        st = tune_feedback(t, &tp, err);
    if (st)
        return st;
    g = stz_stage_open(p->progress, "tune: sensitivity", p->quiet, 1);
    tp.progress_user = &g;
    st = stz_tune_probe(&r->T, t->fwd, t->q.tok, t->q.nseq, 0, t->q.lens, &tp, err);
    stz_stage_close(&g);
    if (st)
        return st;
    double model_bytes = (double)stz_path_bytes(t->model, 0);
    extra_bytes(t, model_bytes);
    r->kind = p->goal == STZ_TUNE_MAX_KL ? STZ_BUDGET_KL : STZ_BUDGET_BYTES;
    r->budget = p->goal == STZ_TUNE_RATIO      ? model_bytes / p->amount
                : p->goal == STZ_TUNE_BPW      ? p->amount * (double)r->T.params / 8
                : p->goal == STZ_TUNE_DATA_BPW ? p->amount * (double)r->T.params / 8 + (double)r->T.extra_bytes
                : p->goal == STZ_TUNE_LIKE     ? (double)r->gguf.like_bytes[stz_gguf_like_parse(p->like)]
                                               : p->amount;
    return STZ_OK;
}

/* The choice as a policy, described by how it was made. */
static stz_status write_policy(tune_run *t, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    const char *list = t->list;
    char desc[512];
    if (p->goal == STZ_TUNE_LIKE)
        snprintf(desc, sizeof desc, "stz gguf of %.200s for --like %.32s (candidates %.200s)", t->model, p->like, list);
    else
        snprintf(desc, sizeof desc, "stz tune of %.200s for %s %g (candidates %.200s)", t->model,
                 stz_tune_goal_option(p->goal), p->amount, list);
    int fb_tokens = feedback_seqs(p) && any_feedback(t);
    if (t->im && !p->imatrix) { /* calibrate's */
        size_t n = strlen(desc);
        snprintf(desc + n, sizeof desc - n, "; importance: %.200s", stz_imatrix_dataset(t->im, NULL));
    }
    if (p->imatrix || fb_tokens) { /* the figures hold with the importance and calibration the candidates had */
        size_t n = strlen(desc);
        snprintf(desc + n, sizeof desc - n, "; quantize with%s%.200s%s%.200s", p->imatrix ? " --imatrix " : "",
                 p->imatrix ? p->imatrix : "", fb_tokens ? " --tokens " : "", fb_tokens ? p->seqs.path : "");
    }
    free(t->r->policy);
    if (!(t->r->policy = stz_tune_policy(&t->r->T, desc)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the policy");
    return STZ_OK;
}

/* ---- verifying ------------------------------------------------------- */

/* The model compressed with the policy into `out` (a file replaced, a
 * directory made), as stz compress does; *bytes: what out holds. */
static stz_status compress(const tune_run *t, stz_policy *pol, const char *out, uint64_t *bytes, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    stz_compress_params cp = {.policy = pol,
                              .imatrix = t->im,
                              .feedback_seqs = feedback_seqs(p),
                              .config = p->config,
                              .threads = p->threads,
                              .write_flags = STZ_WRITE_FORCE,
                              .quiet = p->quiet,
                              .progress = p->progress,
                              .ranks = p->ranks,
                              .feedback_drawn = t->fq.nseq ? &t->fq : NULL};
    stz_compress_result cr;
    stz_status st = stz_compress_model(&cp, t->model, out, &cr, err);
    *bytes = st ? 0 : stz_path_bytes(out, 0);
    return st;
}

/* Compresses the model with the policy into the container (gguf: into
 * t->tcc, exported to t->tc) and runs what it holds against the original
 * on the same sequences. */
static stz_status verify(tune_run *t, stz_tune_check *res, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    const char *out = t->tc.path, *container = p->gguf ? t->tcc.path : out;
    stz_policy *pol = NULL;
    stz_model_set C = {0}, R = {0};
    stz_fwd *cand = NULL;
    stz_gguf_params gp = gguf_params(p);
    stz_gguf_stats gs;
    stz_status st = stz_policy_parse(&pol, t->r->policy, strlen(t->r->policy), "tuned policy", err);
    if (!st && t->sharded)
        stz_remove_tree(container); /* the first round's */
    if (!st)
        st = compress(t, pol, container, &res->bytes, err);
    if (!st)
        st = stz_model_set_open(&C, container, err);
    if (!st && p->gguf && !(st = stz_gguf_export(&gp, C.m, C.n, &t->cfg, t->cfg_json, t->model, NULL, out, &gs, err))) {
        res->bytes = stz_path_bytes(out, 0);
        st = stz_model_set_open_like(&R, out, &t->S, err); /* what llama.cpp runs */
    }
    const stz_model_set *run = p->gguf ? &R : &C;
    if (!st && !(st = stz_fwd_open(&cand, run->m, run->n, &t->cfg, out, p->threads, err))) {
        stz_stage g = stz_stage_open(p->progress, "tune: verify, forward", p->quiet, 1);
        st = stz_fwd_compare(t->fwd, cand, t->q.tok, t->q.nseq, 0, t->q.lens, stz_stage_step, &g, &res->fwd, err);
        stz_stage_close(&g);
    }
    stz_fwd_free(cand);
    stz_model_set_free(&R);
    stz_model_set_free(&C);
    stz_policy_free(pol);
    return st;
}

/* The intermediate files, beside `out` (else scratch, else the model). */
static stz_status make_temps(tune_run *t, stz_err *err)
{
    const stz_tune_run_params *p = t->p;
    const char *near = p->out ? p->out : p->scratch ? p->scratch : t->model;
    if (stz_tmp_beside(&t->tc, near, "tune") || (p->gguf && stz_tmp_beside(&t->tcc, near, "tune")))
        return stz_err_set(err, STZ_E_IO, "%s: cannot create a temporary file next to it", near);
    if (t->sharded) /* a name for the directory */
        unlink(p->gguf ? t->tcc.path : t->tc.path);
    return STZ_OK;
}

/* Verifies the choice; while the budget is missed, solves and verifies
 * again with the prediction corrected by what was measured (KL scaled by
 * measured / predicted; bytes: the budget less the last choice's measured
 * - predicted), at most STZ_TUNE_CORRECTIONS times. */
static stz_status tune_verify(tune_run *t, stz_err *err)
{
    stz_tune_result *r = t->r;
    stz_status st = make_temps(t, err);
    if (!st)
        st = verify(t, &r->check[0], err);
    r->checks = !st;
    double kl_scale = 1, value = r->budget;
    for (; !st && r->checks <= STZ_TUNE_CORRECTIONS && stz_tune_missed(r, &r->check[r->checks - 1]); r->checks++) {
        const stz_tune_check *m = &r->check[r->checks - 1];
        if (r->kind == STZ_BUDGET_KL)
            kl_scale *= r->sol.pred.kl > 0 ? m->fwd.kl_mean / r->sol.pred.kl : 1;
        else
            value = r->budget - ((double)m->bytes - (double)r->sol.pred.bytes);
        stz_tune_solution_free(&r->sol);
        if (!(st = stz_tune_solve(&r->T, r->kind, value, kl_scale, &r->sol, err)) && !(st = write_policy(t, err)))
            st = verify(t, &r->check[r->checks], err);
        if (st)
            break;
    }
    if (!st && t->p->out) /* directories are never replaced */
        st = stz_output_place(t->tc.path, t->p->out,
                              (t->p->write_flags & STZ_WRITE_FORCE) && (t->p->gguf || !t->sharded), err);
    return st;
}

static void tune_close(tune_run *t)
{
    if (t->tc.path && t->sharded && !t->p->gguf)
        stz_remove_tree(t->tc.path);
    if (t->tcc.path && t->sharded)
        stz_remove_tree(t->tcc.path);
    stz_tmp_remove(&t->tc);
    stz_tmp_remove(&t->tcc);
    free(t->cfg_json);
    free(t->cand);
    stz_seqs_free(&t->q);
    stz_seqs_free(&t->fq);
    stz_fwd_free(t->fwd);
    stz_imatrix_free(t->im);
    stz_model_set_free(&t->S);
}

stz_status stz_tune_run(const stz_tune_run_params *p, const char *model, stz_tune_result *r, stz_err *err)
{
    tune_run t = {.p = p, .model = model, .r = r};
    memset(r, 0, sizeof *r);
    stz_status st = tune_open(&t, err);
    if (!st)
        st = tune_measure(&t, err);
    if (!st)
        st = stz_tune_solve(&r->T, r->kind, r->budget, 1, &r->sol, err);
    r->first = r->sol.pred;
    if (!st && r->sol.met && !(st = write_policy(&t, err)) && p->verify)
        st = tune_verify(&t, err);
    tune_close(&t);
    return st;
}

void stz_tune_result_free(stz_tune_result *r)
{
    free(r->policy);
    stz_tune_solution_free(&r->sol);
    stz_tune_free(&r->T);
    memset(r, 0, sizeof *r);
}
