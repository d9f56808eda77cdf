/* world.cu: the CUDA backend of W > 1 ranks (tensor + expert parallelism, docs/parallelism.md
 * "The GPU path"): one device context per rank (rank.h: sm_cuda_rank, on the rank's device),
 * one host thread per rank (ranks.h), the cross-rank exchanges of cuda/comm/gcomm.h on each rank's
 * stream.  Each rank uploads only its shard (sm_shard_make) and runs the same layer loop as one
 * rank (forward.cu; the stock layers' collectives sit where the CPU world has them); rank 0 writes the step's
 * outputs.  Ranks on distinct devices replay per-bucket CUDA graphs with the exchanges inside;
 * virtual ranks (a device listed twice) run eagerly, because their exchanges meet at host
 * barriers (gcomm.h).  A failed step (an error on a rank, or a peer that stopped publishing:
 * the health words) fails with one line naming rank, layer and operation, and the backend
 * refuses later steps: the ranks' caches and epochs no longer agree.
 * We rejected one host thread driving every rank: a rank's host-side wait (a virtual barrier,
 * a cudaStreamSynchronize) would stall the others' enqueues.
 */
#include "rank.h"
extern "C" {
#include "parallel/ranks.h"
#include "backend/stats.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cw_world {
    int W;                     /* ranks */
    sm_cuda_rank **rk;          /* [W] the ranks' contexts */
    sm_gcomm_world *gw;        /* their exchanges */
    sm_ranks *th;              /* [W] rank threads */
    sm_err *errs;              /* [W] each rank's error of the last job */
    int job;                   /* CW_UPLOAD, CW_SYNTH, CW_STEP, CW_EXCH or CW_KV */
    int kv_pages;              /* CW_KV: the pages every rank allocates */
    const sm_model *m;         /* CW_UPLOAD: the model */
    int fmt;                   /* CW_SYNTH: expert format of layers 1..L-2 */
    uint64_t seed;             /* CW_SYNTH: seed */
    const sm_step *st;         /* CW_STEP: the step */
    int xn, xiters;            /* CW_EXCH: rows, timed repetitions */
    float *xus;                /* CW_EXCH: [W] each rank's median microseconds */
    int broken;                /* a step failed: later steps are refused */
    char why[1024];       /* its message */
} cw_world;
#define CW_UPLOAD 0
#define CW_SYNTH 1
#define CW_STEP 2
#define CW_EXCH 3
#define CW_KV 4

/* ---- the ranks' small kernels (rank.h) ---- */

/* embed_part[i] = embed row tok[i] - v0 when the token lies in [v0, v0 + nv), zeros else. */
__global__ void cw_embed_local_kernel(const uint16_t *__restrict__ embed, int v0, int nv, int H, const int *__restrict__ tok,
                                      uint16_t *__restrict__ embed_part) {
    const int i = blockIdx.x, t = tok[i] - v0;
    const uint16_t *src = t >= 0 && t < nv ? embed + (size_t)t * H : NULL;
    for (int x = threadIdx.x; x < H; x += blockDim.x) embed_part[(size_t)i * H + x] = src ? src[x] : (uint16_t)0;
}

int cb_embed_local(sm_cuda_rank *cr, int n, sm_err *e) {
    if (n <= 0) return 0;
    cw_embed_local_kernel<<<n, 256, 0, cr->st>>>(cr->embed, cr->plan.v0, cr->plan.nv, cr->cfg.H, cr->d_tok, cr->embed_part);
    SM_LAUNCH_CHECK("cw_embed_local_kernel");
    return 0;
}

/* best[i] = logits_part[i, argmax_part[i]]; argmax_part: -1 (a non-finite logit) -> -2; no usable id (vu 0) -> -1. */
__global__ void cw_best_kernel(const float *__restrict__ logits_part, int nv, int vu, int n, float *__restrict__ best, int *__restrict__ argmax_part) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int id = argmax_part[i];
    if (vu <= 0) { best[i] = 0.0f; argmax_part[i] = -1; return; }
    if (id < 0) { best[i] = 0.0f; argmax_part[i] = -2; return; }
    best[i] = logits_part[(size_t)i * nv + id];
}

int cb_best_local(sm_cuda_rank *cr, int n, int vu_local, sm_err *e) {
    if (n <= 0) return 0;
    cw_best_kernel<<<(n + 127) / 128, 128, 0, cr->st>>>(cr->logits_part, cr->plan.nv, vu_local, n, cr->best, cr->argmax_part);
    SM_LAUNCH_CHECK("cw_best_kernel");
    return 0;
}

/* ---- rank jobs ---- */

/* The exchanges of one step of n rows alone, in the forward's order and shapes (the
 * embedding, per layer attn_sum, pooled_gather, expert_sum, unpooled_gather, then
 * vocab_argmax), on the rank's stream. */
static int cw_exchanges(sm_cuda_rank *cr, int n, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    sm_gcomm *g = cr->gc;
    if (sm_gcomm_begin(g, cr->st, e) || sm_gcomm_gather_owner(g, cr->embed_part, cr->d_tok, n, cf->H, cr->plan.nv, cr->f, cr->st, e))
        return -1;
    for (int l = 0; l < cf->L; l++) {
        if (sm_gcomm_sum_bf16(g, SM_GC_ATTN, l, cr->apart, (size_t)n * cf->H, cr->a, cr->st, e) ||
            sm_gcomm_gather_cols(g, SM_GC_POOLED, l, cr->pooled_part, n, (size_t)cr->plan.np * 2, cr->h1, cr->st, e))
            return -1;
        if (cr->plan.moe == SM_MOE_EP ? sm_gcomm_sum_bf16(g, SM_GC_EXPERT, l, cr->xpart, (size_t)n * cf->Hm, cr->mo, cr->st, e)
                                     : sm_gcomm_sum_f32(g, SM_GC_EXPERT, l, cr->xpart, (size_t)n * cf->K * cf->Hm, cr->xpart, cr->st, e))
            return -1;
        if (sm_gcomm_gather_cols(g, SM_GC_UNPOOLED, l, cr->unpooled_part, n, (size_t)cr->plan.nu * 2, cr->f, cr->st, e)) return -1;
    }
    return sm_gcomm_argmax(g, cr->best, cr->argmax_part, n, cr->plan.nv, cr->am, cr->st, e);
}

/* CW_EXCH on rank cr: 2 warm-up and w->xiters timed runs of cw_exchanges (CUDA events, each
 * run synchronized), the median into w->xus[rank]. */
static int cw_time_exchanges(cw_world *w, sm_cuda_rank *cr, sm_err *e) {
    if (cb_enter(cr, e)) return -1;
    float *t = (float *)malloc(sizeof(float) * (size_t)w->xiters);
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = !t ? sm_errf(e, "out of host memory") : 0;
    if (!rc && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        rc = sm_errf(e, "cudaEventCreate failed on device %d", cr->device);
    /* the row indices stand in for tokens (rank 0 owns them): valid for any vocabulary */
    if (!rc && cudaMemcpyAsync(cr->d_tok, cr->iota, (size_t)w->xn * 4, cudaMemcpyDeviceToDevice, cr->st) != cudaSuccess)
        rc = sm_errf(e, "cudaMemcpyAsync failed on device %d", cr->device);
    for (int it = 0; it < w->xiters + 2 && !rc; it++) {
        if (cudaEventRecord(e0, cr->st) != cudaSuccess || cw_exchanges(cr, w->xn, e) || cudaEventRecord(e1, cr->st) != cudaSuccess) {
            rc = e->msg[0] ? -1 : sm_errf(e, "cudaEventRecord failed on device %d", cr->device);
            break;
        }
        cudaError_t r = cudaEventSynchronize(e1);
        if (r != cudaSuccess) { rc = sm_errf(e, "exchanges failed on device %d: %s", cr->device, cudaGetErrorString(r)); break; }
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (it >= 2) t[it - 2] = 1000.0f * ms;
    }
    if (!rc && sm_gcomm_health_fetch(cr->gc, cr->st, e)) rc = -1;
    if (!rc && cudaStreamSynchronize(cr->st) != cudaSuccess) rc = sm_errf(e, "synchronize failed on device %d", cr->device);
    if (!rc && sm_gcomm_health_check(cr->gc, e)) rc = -1;
    if (!rc) w->xus[cr->rank] = sm_median(t, w->xiters);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(t);
    return rc;
}

static int cw_job(void *arg, int r, sm_err *e) {
    cw_world *w = (cw_world *)arg;
    sm_cuda_rank *cr = w->rk[r];
    int rc;
    if (w->job == CW_UPLOAD) rc = cb_enter(cr, e) || cb_upload_model(cr, w->m, e) || cb_exec_attach(cr, e) ? -1 : 0;
    else if (w->job == CW_SYNTH) rc = cb_synth_weights(cr, w->fmt, w->seed, e) || cb_exec_attach(cr, e) ? -1 : 0;
    else if (w->job == CW_EXCH) rc = cw_time_exchanges(w, cr, e);
    else if (w->job == CW_KV) rc = cb_kv_finish(cr, w->kv_pages, e);
    else rc = cb_step_run(cr, w->st, e); /* checked once in cw_step */
    if (rc) sm_gcomm_abort(w->gw, e->msg); /* the peers stop waiting for this rank */
    return rc;
}

/* Run the job on every rank; on failure one line, the cause before its consequences: a rank's
 * own error (neither a wait that ran out nor an abort by a peer) first, then a rank that saw
 * a peer stop (health words: names the stuck rank), then the first failed rank. */
static int cw_run(cw_world *w, sm_err *e) {
    int nf = sm_ranks_run(w->th, w->errs);
    if (nf == 0) return 0;
    int pick = -1;
    for (int r = 0; r < w->W && pick < 0; r++)
        if (w->errs[r].msg[0] && !strstr(w->errs[r].msg, "waited") && !strstr(w->errs[r].msg, "aborted")) pick = r;
    for (int r = 0; r < w->W && pick < 0; r++)
        if (w->errs[r].msg[0] && strstr(w->errs[r].msg, "waited")) pick = r;
    for (int r = 0; r < w->W && pick < 0; r++)
        if (w->errs[r].msg[0]) pick = r;
    sm_gcomm_reset(w->gw);
    return sm_errf(e, "%s", pick >= 0 ? w->errs[pick].msg : "cuda world: a rank failed");
}

static int cw_step(void *vctx, const sm_step *s, sm_err *e) {
    cw_world *w = (cw_world *)vctx;
    if (w->broken) return sm_errf(e, "cuda world: refused after a failed step (%s)", w->why);
    if (sm_step_check(&w->rk[0]->cfg, &w->rk[0]->kvs, s, "cuda world step", e)) return -1;
    if (s->nrows == 0) return 0;
    w->job = CW_STEP;
    w->st = s;
    int rc = cw_run(w, e);
    w->st = NULL;
    if (rc) {
        w->broken = 1;
        snprintf(w->why, sizeof w->why, "%s", e->msg);
    }
    return rc;
}

static void cw_destroy(void *vctx) {
    cw_world *w = (cw_world *)vctx;
    if (!w) return;
    sm_ranks_destroy(w->th);
    if (w->rk)
        for (int r = 0; r < w->W; r++) cb_dev_destroy(w->rk[r]);
    sm_gcomm_destroy(w->gw);
    free(w->rk);
    free(w->errs);
    free(w);
}

/* The most bytes one rank contributes to one exchange (cap rows; the logits in chunks). */
static size_t cw_max_bytes(const sm_cuda_rank *cr) {
    const sm_config *cf = &cr->cfg;
    const size_t R = (size_t)cr->cap;
    size_t b = R * cf->H * 4;                                                   /* attn_sum */
    size_t x = R * cf->Hm * 4 * (cr->plan.moe == SM_MOE_TP ? (size_t)cf->K : 1); /* expert_sum */
    size_t v = (size_t)CB_LOGIT_ROWS * cr->plan.nv * 4;                          /* vocab_gather */
    if (x > b) b = x;
    if (v > b) b = v;
    return b;
}

int cb_world_create(const sm_model *m, const sm_config *cf, int fmt, uint64_t seed, const sm_kv *kv, const sm_backend_opts *o,
                    sm_backend *b, sm_err *e) {
    const int W = o->world;
    const sm_moe_layout moe = sm_moe_layout_of(o->moe_tp);
    /* (W, moe) passed sm_shard_check where world entered; each rank's sm_shard_plan asserts it */
    if (o->comm != SM_COMM_PEER && o->comm != SM_COMM_NCCL) return sm_errf(e, "cuda world: unknown comm kind %d", o->comm);
    cw_world *w = (cw_world *)calloc(1, sizeof *w);
    int *dev = (int *)malloc(sizeof(int) * (size_t)W);
    if (!w || !dev) {
        free(w);
        free(dev);
        return sm_errf(e, "cuda world: out of host memory");
    }
    w->W = W;
    for (int r = 0; r < W; r++) dev[r] = o->devices ? o->devices[r] : o->device + r;
    w->rk = (sm_cuda_rank **)calloc((size_t)W, sizeof *w->rk);
    w->errs = (sm_err *)calloc((size_t)W, sizeof *w->errs);
    int rc = !w->rk || !w->errs ? sm_errf(e, "cuda world: out of host memory") : 0;
    sm_backend_opts ro = *o;
    for (int r = 0; r < W && !rc; r++)
        if (cb_dev_create(cf, kv, &ro, r, dev[r], &w->rk[r], e)) rc = sm_errprefix(e, "cuda world: rank %d", r);
    if (!rc) {
        sm_gcomm_opts go;
        memset(&go, 0, sizeof go);
        go.world = W;
        go.devices = dev;
        go.kind = o->comm == SM_COMM_NCCL ? SM_GCOMM_NCCL : SM_GCOMM_PEER;
        go.max_bytes = cw_max_bytes(w->rk[0]);
        if (sm_gcomm_create(&go, &w->gw, e)) rc = sm_errprefix(e, "cuda world");
    }
    for (int r = 0; r < W && !rc; r++) {
        w->rk[r]->gc = sm_gcomm_rank(w->gw, r);
        w->rk[r]->eager_only = sm_gcomm_is_virtual(w->gw);
        /* virtual ranks share one GPU's SMs: each rank's kernels split their work over its share
         * (the matmuls' stream-K split, hence their bits, as the monokernel's joint launch) */
        if (w->rk[r]->eager_only) w->rk[r]->kc.num_sms = w->rk[r]->kc.num_sms / W > 0 ? w->rk[r]->kc.num_sms / W : 1;
    }
    if (!rc && sm_ranks_create(W, cw_job, w, &w->th, e)) rc = sm_errprefix(e, "cuda world");
    if (!rc) { /* every rank uploads (or makes) its shard at once */
        w->job = m ? CW_UPLOAD : CW_SYNTH;
        w->m = m;
        w->fmt = fmt;
        w->seed = seed;
        rc = cw_run(w, e);
        w->m = NULL;
    }
    int kv_pages = 0; /* sized from memory: the pages of every rank */
    if (!rc && o->kv_mem_util > 0) { /* the KV pool from memory: the fewest pages any device fits, its ranks sharing it */
        int pages = 1 << 30;
        for (int r = 0; r < W && !rc; r++) {
            int k = 0, p;
            for (int q = 0; q < W; q++) k += dev[q] == dev[r];
            if (cb_kv_fit(w->rk[r], o->kv_mem_util, k, &p, e)) rc = sm_errprefix(e, "cuda world: rank %d", r);
            else if (p < pages) pages = p;
        }
        if (!rc) {
            w->job = CW_KV;
            w->kv_pages = pages;
            rc = cw_run(w, e);
            kv_pages = pages;
        }
    }
    if (!rc) /* the executors across the ranks: the same path on every rank, the in-kernel exchanges */
        if (cb_exec_world_link(w->rk, W, sm_gcomm_is_virtual(w->gw), o->comm == SM_COMM_PEER, e)) rc = sm_errprefix(e, "cuda world");
    if (!rc) { /* one line of what was built */
        char dl[256] = "";
        size_t k = 0;
        for (int r = 0; r < W && k < sizeof dl - 8; r++) k += (size_t)snprintf(dl + k, sizeof dl - k, r ? ",%d" : "%d", dev[r]);
        fprintf(stderr, "sparkmono: cuda world of %d ranks (%s experts) on devices %s, exchanges through %s%s\n", W,
                sm_moe_layout_name(moe), dl, o->comm == SM_COMM_NCCL ? "nccl" : "peer memory",
                sm_gcomm_is_virtual(w->gw) ? "; virtual ranks (a device holds several): eager steps, host barriers" : "");
    }
    free(dev);
    if (rc) {
        cw_destroy(w);
        return -1;
    }
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->ctx = w;
    b->step = cw_step;
    b->destroy = cw_destroy;
    b->max_verify_rows = CB_GRAPH_REQ_ROWS;
    b->kv_pages = kv_pages;
    return 0;
}

/* ---- hooks (rank.h; the bench's, cuda/bench/) ---- */

int cb_world_ranks(const sm_backend *b, sm_cuda_rank ***rk) {
    if (!b || b->step != cw_step || !b->ctx) return 0;
    cw_world *w = (cw_world *)b->ctx;
    *rk = w->rk;
    return w->W;
}

int cb_world_time_exchanges(const sm_backend *b, int n, int iters, float *us, sm_err *e) {
    if (!b || b->step != cw_step) return sm_errf(e, "cuda bench: the exchanges need a CUDA world backend (--world W)");
    cw_world *w = (cw_world *)b->ctx;
    if (w->broken) return sm_errf(e, "cuda bench: refused after a failed step (%s)", w->why);
    if (n < 1 || n > w->rk[0]->cap || iters < 1) return sm_errf(e, "cuda bench: exchanges of %d rows x %d iterations", n, iters);
    w->job = CW_EXCH;
    w->xn = n;
    w->xiters = iters;
    w->xus = us;
    int rc = cw_run(w, e);
    if (rc) {
        w->broken = 1;
        snprintf(w->why, sizeof w->why, "%s", e->msg);
    }
    return rc;
}
