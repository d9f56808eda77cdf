/* pool.c: the pthread pool of pool.h.
 *
 * One job at a time: the caller publishes (fn, arg, n, grain), bumps a generation number and
 * broadcasts; every thread (caller included) takes chunks from an atomic counter until the
 * range is exhausted; the caller waits until all workers have checked out of the generation.
 * We rejected a task queue with per-task allocation: every parallel region of the forward is a
 * plain index range, and a queue would allocate on the hot path.
 */
#include "pool.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sm_pool {
    int nthreads;              /* threads in all, caller included */
    pthread_t *th;             /* [nthreads - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t go, done;   /* go: new generation or stop; done: a worker checked out */
    uint64_t gen;              /* job generation, under mu */
    int busy;                  /* workers still inside the current generation, under mu */
    int stop;                  /* shut down, under mu */
    sm_pool_fn fn; void *arg;  /* the current job */
    int64_t n, grain;          /* its range and chunk size */
    atomic_llong next;         /* next unclaimed index */
};

/* 1 while this thread runs inside a parallel-for (nested calls then run inline). */
static _Thread_local int tl_inside;

typedef struct { sm_pool *p; int tid; } worker_arg;

static void run_chunks(sm_pool *p, int tid) {
    for (;;) {
        int64_t lo = (int64_t)atomic_fetch_add(&p->next, (long long)p->grain);
        if (lo >= p->n) break;
        int64_t hi = lo + p->grain < p->n ? lo + p->grain : p->n;
        p->fn(p->arg, lo, hi, tid);
    }
}

static void *worker(void *varg) {
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    sm_pool *p = wa.p;
    uint64_t seen = 0;
    tl_inside = 1;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int sm_pool_create(int nthreads, sm_pool **out, sm_err *e) {
    *out = NULL;
    if (nthreads < 0) return sm_errf(e, "thread pool: nthreads %d is negative", nthreads);
    if (nthreads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = c > 0 ? (int)c : 1;
    }
    if (nthreads > 1024) return sm_errf(e, "thread pool: nthreads %d is more than 1024", nthreads);
    sm_pool *p = calloc(1, sizeof *p);
    if (!p) return sm_errf(e, "thread pool: out of memory");
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    if (nthreads > 1) {
        p->th = calloc((size_t)nthreads - 1, sizeof *p->th);
        if (!p->th) { sm_pool_destroy(p); return sm_errf(e, "thread pool: out of memory"); }
    }
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->nthreads = i; sm_pool_destroy(p); return sm_errf(e, "thread pool: out of memory"); }
        wa->p = p; wa->tid = i;
        if (pthread_create(&p->th[i - 1], NULL, worker, wa) != 0) {
            free(wa);
            p->nthreads = i; /* only threads 1..i-1 exist */
            sm_pool_destroy(p);
            return sm_errf(e, "thread pool: pthread_create failed for thread %d of %d", i, nthreads);
        }
    }
    *out = p;
    return 0;
}

void sm_pool_destroy(sm_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++) pthread_join(p->th[i - 1], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
}

int sm_pool_nthreads(const sm_pool *p) { return p ? p->nthreads : 1; }

void sm_pool_for(sm_pool *p, int64_t n, int64_t grain, sm_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    /* Inline: no pool, one thread, one chunk, or a nested call. */
    if (!p || p->nthreads == 1 || n <= grain || tl_inside) {
        for (int64_t lo = 0; lo < n; lo += grain) fn(arg, lo, lo + grain < n ? lo + grain : n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn; p->arg = arg; p->n = n; p->grain = grain;
    atomic_store(&p->next, 0);
    p->busy = p->nthreads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    tl_inside = 1;
    run_chunks(p, 0);
    tl_inside = 0;
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int64_t sm_pool_grain(const sm_pool *p, int64_t n) {
    int64_t g = n / (8 * sm_pool_nthreads(p));
    return g < 1 ? 1 : g > 64 ? 64 : g;
}
