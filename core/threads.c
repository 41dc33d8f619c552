/* Ordered parallel pipeline: parallel work, in-order commit. */
#include "core/stz_core.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    stz_ordered *p;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    size_t next;      /* next item to hand out */
    size_t committed; /* items committed so far */
    stz_status status;
    stz_err err;
} run_state;

typedef struct {
    run_state *s;
    int tid;
} worker_arg;

static void fail(run_state *s, stz_status st, const stz_err *e)
{
    if (s->status == STZ_OK) {
        s->status = st;
        s->err = *e;
    }
    pthread_cond_broadcast(&s->turn);
}

static void *worker(void *arg)
{
    worker_arg *a = (worker_arg *)arg;
    run_state *s = a->s;
    stz_ordered *p = s->p;
    stz_err e;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        size_t i = s->next;
        if (i < p->n && s->status == STZ_OK && !p->no_interrupt && stz_interrupt_pending()) {
            stz_err_set(&e, STZ_E_INTERRUPTED, "interrupted");
            fail(s, STZ_E_INTERRUPTED, &e);
        }
        if (i >= p->n || s->status != STZ_OK) {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        s->next++;
        pthread_mutex_unlock(&s->lock);

        stz_err_clear(&e);
        stz_status st = p->work(p->ctx, a->tid, i, &e);

        pthread_mutex_lock(&s->lock);
        if (st != STZ_OK)
            fail(s, st, &e);
        while (p->commit && s->status == STZ_OK && s->committed != i) /* no commit: no order to wait for */
            pthread_cond_wait(&s->turn, &s->lock);
        int turn = s->status == STZ_OK, committed = 0;
        pthread_mutex_unlock(&s->lock);
        /* Our turn: no other commit runs until `committed` moves on, while
         * the other workers take and work on items (a commit may wait, for
         * room in a writer's buffers say). */
        uint64_t done = 0, total = 0;
        if (turn) {
            st = p->commit ? p->commit(p->ctx, a->tid, i, &e) : STZ_OK;
            done = p->done, total = p->total; /* only commits change them */
        }
        pthread_mutex_lock(&s->lock);
        if (turn) {
            if (st != STZ_OK)
                fail(s, st, &e);
            committed = st == STZ_OK;
            s->committed++;
            pthread_cond_broadcast(&s->turn);
        }
        pthread_mutex_unlock(&s->lock);

        if (committed && p->post && (st = p->post(p->ctx, a->tid, i, &e)) != STZ_OK) {
            pthread_mutex_lock(&s->lock);
            fail(s, st, &e);
            pthread_mutex_unlock(&s->lock);
        }

        if (a->tid == 0 && p->progress && p->progress(p->progress_user, done, total)) {
            stz_err_set(&e, STZ_E_INTERRUPTED, "interrupted");
            pthread_mutex_lock(&s->lock);
            fail(s, STZ_E_INTERRUPTED, &e);
            pthread_mutex_unlock(&s->lock);
        }
    }
    return NULL;
}

stz_status stz_ordered_run(stz_ordered *p, stz_err *err)
{
    int nt = p->threads < 1 ? 1 : p->threads;
    run_state s = {.p = p, .status = STZ_OK};
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.turn, NULL);
    pthread_t *tids = calloc((size_t)nt, sizeof *tids);
    worker_arg *args = calloc((size_t)nt, sizeof *args);
    int started = 0;
    if (!tids || !args) {
        free(tids);
        free(args);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %d threads", nt);
    }
    for (int t = 0; t < nt; t++)
        args[t] = (worker_arg){&s, t};
    for (int t = 1; t < nt; t++, started++)
        if (pthread_create(&tids[t], NULL, worker, &args[t]) != 0)
            break; /* run with the threads we have */
    worker(&args[0]);
    for (int t = 1; t <= started; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    free(args);
    pthread_mutex_destroy(&s.lock);
    pthread_cond_destroy(&s.turn);
    if (s.status != STZ_OK) {
        if (err)
            *err = s.err;
        return s.status;
    }
    return STZ_OK;
}

void openblas_set_num_threads(int num_threads); /* OpenBLAS's own, not in cblas.h */

void stz_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
