/* forward.c: the CPU reference backend (backend.h): docs/model.md section 4 for every row of
 * a step, on one rank.
 *
 * It is the W = 1 case of the rank loop of layer.c: a shard of the whole model, the built-in
 * single-rank communicator (every sum and gather an identity), and the caller's thread with
 * a pool of helpers.  Every number comes from the fixed-order ops of ops.h, so a row's result
 * does not depend on which other rows share its step, on the page layout of the cache, or on
 * the thread count.  The KV pages live in host memory, per layer bf16
 * [nblocks][nKV][16][K(64) | V(64)].  Scratch is allocated at create for max_rows and grown
 * (never per row) if a larger step comes.  One step at a time per backend (the threads are
 * inside a step).  An optional trace (debug.h) sees every stage's activations, the per-head
 * ones included.  Steps are checked by the one validator of every backend (step.h).
 * We rejected running W = 1 through the world backend's rank threads and comm_cpu.c: a thread
 * handoff per step and a barrier per collective buy nothing with one rank.
 */
#include "backend/backend.h"
#include "cpu/layer.h"
#include <stdlib.h>
#include <string.h>

typedef struct cpu_ctx {
    cpu_rank r;                  /* the one rank: the whole model */
    sm_cpu_trace_fn trace;       /* the caller's debug trace, or NULL */
    void *trace_arg;
} cpu_ctx;

/* The rank's trace call, without the rank (always 0 here). */
static void trace_one_rank(void *arg, int rank, int layer, const char *stage, const float *data, int n, int width) {
    const cpu_ctx *ctx = arg;
    (void)rank;
    ctx->trace(ctx->trace_arg, layer, stage, data, n, width);
}

void sm_cpu_backend_trace(void *backend_ctx, sm_cpu_trace_fn fn, void *arg) {
    cpu_ctx *ctx = backend_ctx;
    ctx->trace = fn;
    ctx->trace_arg = arg;
    cpu_rank_trace(&ctx->r, fn ? trace_one_rank : NULL, ctx, CPU_TRACE_REP | CPU_TRACE_LOCAL);
}

static void cpu_destroy(void *vctx) {
    cpu_ctx *ctx = vctx;
    if (!ctx) return;
    cpu_rank_free(&ctx->r);
    free(ctx);
}

static int cpu_step(void *vctx, const sm_step *s, sm_err *e) {
    cpu_ctx *ctx = vctx;
    if (sm_step_check(&ctx->r.m->cfg, &ctx->r.made, s, "cpu step", e)) return -1;
    if (s->nrows == 0) return 0;
    return cpu_rank_step(&ctx->r, s, e);
}

int sm_cpu_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e) {
    memset(b, 0, sizeof *b);
    int world = o ? o->world : 1;
    if (world > 1)
        return sm_errf(e, "cpu backend: world %d: the single-rank backend runs world 1 (tensor/expert parallelism: "
                          "the cpu world backend)", world);
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0) return sm_errf(e, "cpu backend: a kv cache with pages is required");
    if (m->cfg.D > 256) return sm_errf(e, "cpu backend: head_dim %d is more than 256", m->cfg.D);
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return sm_errf(e, "cpu backend: out of memory");
    int rows = o && o->max_rows > 0 ? o->max_rows : 64;
    if (cpu_rank_init(&ctx->r, "cpu backend", m, 1, 0, SM_MOE_EP, NULL, kv, o ? o->nthreads : 0, rows, e)) {
        free(ctx);
        return -1;
    }
    b->name = "cpu";
    b->ctx = ctx;
    b->step = cpu_step;
    b->destroy = cpu_destroy;
    return 0;
}
