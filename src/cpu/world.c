/* world.c: the CPU world backend: W rank threads, each running the rank loop of layer.c on
 * its shard (shard.h) and exchanging partial results through comm.h (docs/model.md section
 * 9).  It is the oracle of multi-GPU tensor + expert parallelism; docs/parallelism.md gives
 * the sequence of local products and collectives of one step.
 * The caller's thread hands a step to the W rank threads and waits; rank 0 writes the
 * outputs.  A rank that fails aborts the communicator, so its peers fail instead of waiting.
 * With W = 1 the caller's thread runs the one rank through layer.c's single-rank
 * communicator, exactly as the single-rank backend does.
 * We rejected running the ranks one after another on one thread (no real concurrency: the
 * arrival-order and deadlock behaviour a GPU deployment has would never be exercised), and
 * one process per rank (the reference needs no isolation, and tests want one address space).
 */
#include "backend.h"
#include "comm.h"
#include "shard.h"
#include "cpu/layer.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct world_ctx world_ctx;

typedef struct world_rank {
    cpu_rank r;                  /* the rank's state and loop (layer.h) */
    world_ctx *w;                /* the backend it belongs to */
    sm_err err;                  /* this rank's error of the last step */
    int failed;                  /* 1: the last step failed on this rank */
} world_rank;

struct world_ctx {
    const sm_model *m;           /* the model every rank holds views of */
    int W;                       /* ranks */
    sm_comm_cpu *cw;             /* the communicator (NULL with W = 1) */
    world_rank *rk;              /* [W] */
    pthread_t *th;               /* [W] rank threads (none with W = 1) */
    int nth;                     /* rank threads started */
    pthread_mutex_t mu;
    pthread_cond_t go, done;     /* go: a new step or stop; done: a rank finished */
    uint64_t gen;                /* step generation, under mu */
    int pending;                 /* ranks still in the step, under mu */
    int stop;                    /* shut down, under mu */
    const sm_step *st;           /* the current step */
};

/* ---------------------------------------------------------------- threads, step, create */

static void *rank_main(void *arg) {
    world_rank *wr = arg;
    world_ctx *w = wr->w;
    uint64_t seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && w->gen == seen) pthread_cond_wait(&w->go, &w->mu);
        if (w->stop) break;
        seen = w->gen;
        const sm_step *st = w->st;
        pthread_mutex_unlock(&w->mu);
        wr->err.msg[0] = 0;
        wr->failed = cpu_rank_step(&wr->r, st, &wr->err) != 0;
        /* a failed rank fails its peers' pending and later calls instead of leaving them waiting */
        if (wr->failed) wr->r.comm->ops->abort(wr->r.comm, wr->err.msg);
        pthread_mutex_lock(&w->mu);
        if (--w->pending == 0) pthread_cond_signal(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int world_step(void *vctx, const sm_step *s, sm_err *e) {
    world_ctx *w = vctx;
    /* every row checked before any rank starts (the ranks share the cache geometry) */
    if (sm_step_check(&w->m->cfg, &w->rk[0].r.made, s, "cpu world step", e)) return -1;
    if (s->nrows == 0) return 0;
    if (w->W == 1) return cpu_rank_step(&w->rk[0].r, s, e);
    /* hand the step to every rank thread and wait for all of them */
    pthread_mutex_lock(&w->mu);
    w->st = s;
    w->pending = w->W;
    w->gen++;
    pthread_cond_broadcast(&w->go);
    while (w->pending > 0) pthread_cond_wait(&w->done, &w->mu);
    w->st = NULL;
    pthread_mutex_unlock(&w->mu);
    /* report the rank that failed first (the others failed because it aborted) */
    int who = -1;
    char msg[512] = "";
    int aborted = sm_comm_cpu_reset(w->cw, &who, msg, sizeof msg);
    if (who >= 0 && w->rk[who].failed) return sm_errf(e, "%s", w->rk[who].err.msg);
    if (aborted) return sm_errf(e, "%s", msg);
    for (int q = 0; q < w->W; q++)
        if (w->rk[q].failed) return sm_errf(e, "%s", w->rk[q].err.msg);
    return 0;
}

static void world_destroy(void *vctx) {
    world_ctx *w = vctx;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    for (int q = 0; q < w->nth; q++) pthread_join(w->th[q], NULL);
    if (w->rk)
        for (int q = 0; q < w->W; q++) cpu_rank_free(&w->rk[q].r);
    sm_comm_cpu_destroy(w->cw);
    pthread_cond_destroy(&w->go);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->mu);
    free(w->rk);
    free(w->th);
    free(w);
}

int sm_world_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e) {
    memset(b, 0, sizeof *b);
    const sm_config *c = &m->cfg;
    int W = o ? o->world : 1;
    sm_moe_layout moe = o && o->moe_tp ? SM_MOE_TP : SM_MOE_EP;
    if (W < 1) W = 1;
    if (sm_shard_check(m, W, moe, e)) return sm_errprefix(e, "cpu world backend");
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0) return sm_errf(e, "cpu world backend: a kv cache with pages is required");
    if (c->D > 256) return sm_errf(e, "cpu world backend: head_dim %d is more than 256", c->D);
    world_ctx *w = calloc(1, sizeof *w);
    if (!w) return sm_errf(e, "cpu world backend: out of memory");
    w->m = m;
    w->W = W;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->go, NULL);
    pthread_cond_init(&w->done, NULL);
    w->rk = calloc((size_t)W, sizeof *w->rk);
    w->th = calloc((size_t)W, sizeof *w->th);
    if (!w->rk || !w->th) { world_destroy(w); return sm_errf(e, "cpu world backend: out of memory for %d ranks", W); }
    if (W > 1 && sm_comm_cpu_create(W, 0, &w->cw, e)) { world_destroy(w); return sm_errprefix(e, "cpu world backend"); }
    /* threads: the online cores (or nthreads) shared among the ranks, at least one each */
    long total = o && o->nthreads > 0 ? o->nthreads : sysconf(_SC_NPROCESSORS_ONLN);
    int per = total / W > 1 ? (int)(total / W) : 1;
    int rows = o && o->max_rows > 0 ? (o->max_rows < 64 ? o->max_rows : 64) : 64;
    for (int q = 0; q < W; q++) {
        char name[48];
        snprintf(name, sizeof name, "cpu world rank %d", q);
        w->rk[q].w = w;
        sm_comm *comm = W > 1 ? sm_comm_cpu_rank(w->cw, q) : NULL;
        if (cpu_rank_init(&w->rk[q].r, name, m, W, q, moe, comm, kv, per, rows, e)) {
            world_destroy(w);
            return -1;
        }
    }
    for (int q = 0; q < W && W > 1; q++) {
        if (pthread_create(&w->th[q], NULL, rank_main, &w->rk[q]) != 0) {
            world_destroy(w);
            return sm_errf(e, "cpu world backend: pthread_create failed for rank %d of %d", q, W);
        }
        w->nth++;
    }
    b->name = "cpu-world";
    b->ctx = w;
    b->step = world_step;
    b->destroy = world_destroy;
    return 0;
}

/* The hooks below are set between steps: the step handoff (under mu) publishes them to the
 * rank threads. */
void sm_world_backend_trace(void *backend_ctx, sm_world_trace_fn fn, void *arg) {
    world_ctx *w = backend_ctx;
    for (int q = 0; q < w->W; q++) cpu_rank_trace(&w->rk[q].r, fn, arg, CPU_TRACE_REP | CPU_TRACE_ARGMAX);
}

void sm_world_backend_jitter(void *backend_ctx, uint64_t seed, int max_us) {
    world_ctx *w = backend_ctx;
    if (w->cw) sm_comm_cpu_jitter(w->cw, seed, max_us); /* one rank has no arrival order */
}

void sm_world_backend_finalize_rows(void *backend_ctx, int rows) {
    world_ctx *w = backend_ctx;
    for (int q = 0; q < w->W; q++) w->rk[q].r.finalize_rows = rows > 0 ? rows : CPU_FINALIZE_ROWS;
}
