/* ranks.c: the rank threads of ranks.h: one mutex, a "go" condition with a generation count
 * (a new job for every thread) and a "done" condition (the last thread to finish signals). */
#include "parallel/ranks.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct sm_rank_th {
    struct sm_ranks *t;        /* the pool */
    int rank;
    pthread_t th;
    int started;               /* th was created */
} sm_rank_th;

struct sm_ranks {
    int W;
    sm_ranks_fn fn;
    void *arg;
    sm_rank_th *th;            /* [W] */
    sm_err *errs;              /* [W] of the current run, under mu */
    int nfail;                 /* failed ranks of the current run, under mu */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;              /* job generation, under mu */
    int pending;               /* ranks still running the job, under mu */
    int stop;                  /* shut down, under mu */
};

static void *sm_rank_main(void *p) {
    sm_rank_th *rt = (sm_rank_th *)p;
    sm_ranks *t = rt->t;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && t->gen == seen) pthread_cond_wait(&t->go, &t->mu);
        if (t->stop) break;
        seen = t->gen;
        sm_err *e = &t->errs[rt->rank];
        pthread_mutex_unlock(&t->mu);
        e->msg[0] = 0;
        int rc = t->fn(t->arg, rt->rank, e);
        pthread_mutex_lock(&t->mu);
        if (rc) {
            t->nfail++;
            if (!e->msg[0]) sm_errf(e, "rank %d failed", rt->rank);
        }
        if (--t->pending == 0) pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

void sm_ranks_destroy(sm_ranks *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < t->W; r++)
        if (t->th[r].started) pthread_join(t->th[r].th, NULL);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->mu);
    free(t->th);
    free(t);
}

int sm_ranks_create(int W, sm_ranks_fn fn, void *arg, sm_ranks **out, sm_err *e) {
    *out = NULL;
    if (W < 1 || W > 64) return sm_errf(e, "rank threads: %d ranks outside [1, 64]", W);
    sm_ranks *t = (sm_ranks *)calloc(1, sizeof *t);
    if (!t) return sm_errf(e, "rank threads: out of memory");
    t->W = W;
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    t->th = (sm_rank_th *)calloc((size_t)W, sizeof *t->th);
    if (!t->th) {
        sm_ranks_destroy(t);
        return sm_errf(e, "rank threads: out of memory");
    }
    for (int r = 0; r < W; r++) {
        t->th[r].t = t;
        t->th[r].rank = r;
        if (pthread_create(&t->th[r].th, NULL, sm_rank_main, &t->th[r]) != 0) {
            sm_ranks_destroy(t);
            return sm_errf(e, "rank threads: pthread_create failed for rank %d of %d", r, W);
        }
        t->th[r].started = 1;
    }
    *out = t;
    return 0;
}

int sm_ranks_run(sm_ranks *t, sm_err *errs) {
    pthread_mutex_lock(&t->mu);
    t->errs = errs;
    t->nfail = 0;
    t->pending = t->W;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    while (t->pending > 0) pthread_cond_wait(&t->done, &t->mu);
    int nf = t->nfail;
    t->errs = NULL;
    pthread_mutex_unlock(&t->mu);
    return nf;
}
