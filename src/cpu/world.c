/* world.c: the CPU world backend: W rank threads, each running the rank loop of layer.c on
 * its shard (shard.h) and exchanging partial results through comm.h (docs/model.md section
 * 9).  It is the oracle of multi-GPU tensor + expert parallelism; docs/parallelism.md gives
 * the sequence of local products and collectives of one step.
 * The caller's thread hands a step to the W rank threads (src/parallel/ranks.c) and waits; rank 0 writes the
 * outputs.  A rank that fails aborts the communicator, so its peers fail instead of waiting.
 * With W = 1 the caller's thread runs the one rank through layer.c's single-rank
 * communicator, exactly as the single-rank backend does.
 * We rejected running the ranks one after another on one thread (no real concurrency: the
 * arrival-order and deadlock behaviour a GPU deployment has would never be exercised), and
 * one process per rank (the reference needs no isolation, and tests want one address space).
 */
#include "backend/backend.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "cpu/layer.h"
#include "parallel/ranks.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct world_ctx {
    const sm_model *m;           /* the model every rank holds views of */
    int W;                       /* ranks */
    sm_comm_cpu *cw;             /* the communicator (NULL with W = 1) */
    cpu_rank *rk;                /* [W] each rank's state and loop (layer.h) */
    sm_err *errs;                /* [W] each rank's error of the last step */
    sm_ranks *th;                /* the W rank threads (none with W = 1) */
    const sm_step *st;           /* the current step */
} world_ctx;

/* ---------------------------------------------------------------- threads, step, create */

/* The job of rank r's thread: its part of the step; a failed rank fails its peers' pending and
 * later calls instead of leaving them waiting. */
static int rank_job(void *arg, int r, sm_err *e) {
    world_ctx *w = arg;
    if (cpu_rank_step(&w->rk[r], w->st, e) == 0) return 0;
    w->rk[r].comm->ops->abort(w->rk[r].comm, e->msg);
    return -1;
}

static int world_step(void *vctx, const sm_step *s, sm_err *e) {
    world_ctx *w = vctx;
    /* every row checked before any rank starts (the ranks share the cache geometry) */
    if (sm_step_check(&w->m->cfg, &w->rk[0].made, s, "cpu world step", e)) return -1;
    if (s->nrows == 0) return 0;
    if (w->W == 1) return cpu_rank_step(&w->rk[0], s, e);
    /* hand the step to every rank thread and wait for all of them */
    w->st = s;
    sm_ranks_run(w->th, w->errs);
    w->st = NULL;
    /* report the rank that failed first (the others failed because it aborted) */
    int who = -1;
    char msg[512] = "";
    int aborted = sm_comm_cpu_reset(w->cw, &who, msg, sizeof msg);
    if (who >= 0 && w->errs[who].msg[0]) return sm_errf(e, "%s", w->errs[who].msg);
    if (aborted) return sm_errf(e, "%s", msg);
    for (int q = 0; q < w->W; q++)
        if (w->errs[q].msg[0]) return sm_errf(e, "%s", w->errs[q].msg);
    return 0;
}

static void world_destroy(void *vctx) {
    world_ctx *w = vctx;
    if (!w) return;
    sm_ranks_destroy(w->th);
    if (w->rk)
        for (int q = 0; q < w->W; q++) cpu_rank_free(&w->rk[q]);
    sm_comm_cpu_destroy(w->cw);
    free(w->rk);
    free(w->errs);
    free(w);
}

int sm_world_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e) {
    memset(b, 0, sizeof *b);
    const sm_config *c = &m->cfg;
    int W = o ? o->world : 1;
    sm_moe_layout moe = sm_moe_layout_of(o ? o->moe_tp : 0);
    if (W < 1) W = 1; /* (W, moe) passed sm_shard_check where world entered; the shards assert it */
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0) return sm_errf(e, "cpu world backend: a kv cache with pages is required");
    if (c->D > 256) return sm_errf(e, "cpu world backend: head_dim %d is more than 256", c->D);
    world_ctx *w = calloc(1, sizeof *w);
    if (!w) return sm_errf(e, "cpu world backend: out of memory");
    w->m = m;
    w->W = W;
    w->rk = calloc((size_t)W, sizeof *w->rk);
    w->errs = calloc((size_t)W, sizeof *w->errs);
    if (!w->rk || !w->errs) { world_destroy(w); return sm_errf(e, "cpu world backend: out of memory for %d ranks", W); }
    if (W > 1 && sm_comm_cpu_create(W, 0, &w->cw, e)) { world_destroy(w); return sm_errprefix(e, "cpu world backend"); }
    /* threads: the online cores (or nthreads) shared among the ranks, at least one each */
    long total = o && o->nthreads > 0 ? o->nthreads : sysconf(_SC_NPROCESSORS_ONLN);
    int per = total / W > 1 ? (int)(total / W) : 1;
    int rows = o && o->max_rows > 0 ? (o->max_rows < 64 ? o->max_rows : 64) : 64;
    for (int q = 0; q < W; q++) {
        char name[48];
        snprintf(name, sizeof name, "cpu world rank %d", q);
        sm_comm *comm = W > 1 ? sm_comm_cpu_rank(w->cw, q) : NULL;
        if (cpu_rank_init(&w->rk[q], name, m, W, q, moe, comm, kv, per, rows, e)) {
            world_destroy(w);
            return -1;
        }
    }
    if (W > 1 && sm_ranks_create(W, rank_job, w, &w->th, e)) {
        world_destroy(w);
        return sm_errprefix(e, "cpu world backend");
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
    for (int q = 0; q < w->W; q++) cpu_rank_trace(&w->rk[q], fn, arg, CPU_TRACE_REP | CPU_TRACE_ARGMAX);
}

void sm_world_backend_jitter(void *backend_ctx, uint64_t seed, int max_us) {
    world_ctx *w = backend_ctx;
    if (w->cw) sm_comm_cpu_jitter(w->cw, seed, max_us); /* one rank has no arrival order */
}

void sm_world_backend_finalize_rows(void *backend_ctx, int rows) {
    world_ctx *w = backend_ctx;
    for (int q = 0; q < w->W; q++) w->rk[q].finalize_rows = rows > 0 ? rows : CPU_FINALIZE_ROWS;
}
