/* stock/layer.cu: the stock executor (exec.h): decoder layers as per-op kernels (ops/ops.h),
 * the MoE stage of moe.h and, with W > 1, the cross-rank exchanges of comm/gcomm.h at the CPU
 * world's points (docs/model.md sections 3-6, docs/parallelism.md section 2).
 *
 * It runs any layer of any step, eager or captured: no step here synchronizes, allocates or
 * reads device data on the host, and every pointer comes from the rank's view, so a capture
 * bakes in addresses that stay valid for the rank's life.  The eager form differs only in the
 * attention plan (per-run calls, the prefill kernel for long runs of one request); graph form
 * is one generic call.  Its state is the view and, while the bench traces a step, the
 * timeline: a CUDA event before and after each phase of each layer (the layer phases of
 * exec.h), recorded in an eager step behind a kernel that holds the stream until the last
 * layer is enqueued, so the spans hold the kernels, not the host's launch pace.  Tracing off,
 * a step enqueues exactly what it did before.  We rejected a layer loop per form (eager and
 * graph): they would drift apart; and timestamp kernels between the phases: a launch each.
 */
#include "cuda/exec/exec.h"
#include "cuda/comm/gcomm.h"
#include "cuda/common.cuh"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_HOLD_NS 200000000ull /* most a traced step's GPU waits for the host's launches */

/* A traced step's timeline (trace hooks). */
typedef struct st_trace {
    int L;                     /* layers */
    cudaEvent_t *ev;           /* [L][SM_LP_N][2] before / after each phase */
    unsigned char *rec;        /* [L][SM_LP_N][2] 1: recorded in this step */
    cudaEvent_t ev0;           /* the stream released: time 0 */
    uint64_t *hold;            /* pinned, mapped: [0] 1 releases the hold, [1] 1: it ran out first */
} st_trace;

/* The stock executor's state. */
typedef struct st_exec {
    const sm_exec_view *v;     /* the rank */
    st_trace *tr;              /* NULL: no timeline (every untraced step) */
    const char *names[SM_LP_N]; /* the timeline's phase names (exec.h's table) */
} st_exec;

/* Mark the start (end 0) or the end (end 1) of phase p of layer l while a timeline is on. */
static int st_mark(st_exec *S, int l, int p, int end, sm_err *e) {
    st_trace *T = S->tr;
    if (!T) return 0;
    const size_t i = ((size_t)l * SM_LP_N + p) * 2 + end;
    SM_CUDA_CHECK(cudaEventRecord(T->ev[i], S->v->st));
    T->rec[i] = 1;
    return 0;
}

/* The projections buffer of layer l (a run that alternates reads layer l's while the layer
 * before writes them into the other). */
static uint16_t *st_qkv(const sm_exec_view *v, const sm_exec_run *r, int l) { return v->qkv[r->alt ? l & 1 : 0]; }

/* Paged attention + output norm + sigmoid gate of layer l: one generic call over every row,
 * or the eager plan's calls. */
static int st_attention(const sm_exec_view *v, const sm_exec_run *r, int l, const uint16_t *q, const uint16_t *g, sm_err *e) {
    const sm_config *cf = v->cfg;
    const sm_exec_layer *L = &v->layers[l];
    const int nH = v->plan->nHl, nKV = v->plan->nKVl, QD = nH * cf->D, NQ = 2 * QD + 2 * nKV * cf->D;
    const int window = L->full ? 0 : cf->window, bpr = v->kvs->max_bpr;
    const float scale = cf->qk_scale_factor / sqrtf((float)cf->D);
    if (!r->att) {
        if (sm_k_attention(v->kc, q, NQ, g, NQ, L->kv, v->tab, bpr, v->rreq, v->pos, r->n, nH, nKV, window, scale, cf->rms_eps,
                           v->kvs->max_len, v->att, v->st, e))
            return sm_errprefix(e, "cuda step: layer %d attention", l);
        return 0;
    }
    for (int i = 0; i < r->natt; i++) {
        const sm_exec_att *it = &r->att[i];
        size_t ro = (size_t)it->r0;
        int rc = it->kind == 0
            ? sm_k_attention(v->kc, q + ro * NQ, NQ, g + ro * NQ, NQ, L->kv, v->tab, bpr, v->rreq + ro, v->pos + ro, it->cnt, nH,
                             nKV, window, scale, cf->rms_eps, it->max_ctx, v->att + ro * QD, v->st, e)
            : sm_k_attention_prefill(q + ro * NQ, NQ, g + ro * NQ, NQ, L->kv, v->tab + (size_t)it->tab * bpr, it->pos0, it->cnt,
                                     nH, nKV, window, scale, cf->rms_eps, v->att + ro * QD, v->st, e);
        if (rc) return sm_errprefix(e, "cuda step: layer %d attention (rows %d..%d)", l, it->r0, it->r0 + it->cnt - 1);
    }
    return 0;
}

/* The projections of layer l into q: q | k | v | gate = x Wqkvg^T, then per-head QK norm, RoPE
 * on sliding layers, K (normed, roped) and V (raw) into the cache. */
static int st_layer_qkv(st_exec *S, const sm_exec_run *r, int l, uint16_t *q, sm_err *e) {
    const sm_exec_view *v = S->v;
    const sm_config *cf = v->cfg;
    const sm_exec_layer *L = &v->layers[l];
    const int n = r->n, H = cf->H, QD = v->plan->nHl * cf->D, KD = v->plan->nKVl * cf->D, NQ = 2 * QD + 2 * KD;
    uint16_t *k = q + QD, *vv = k + KD;
    if (st_mark(S, l, SM_LP_QKVG, 0, e)) return -1;
    if (sm_k_mm(v->kc, v->x, n, H, L->wqkvg, NQ, q, v->st, e)) return sm_errprefix(e, "cuda step: layer %d qkvg projection", l);
    if (st_mark(S, l, SM_LP_QKVG, 1, e) || st_mark(S, l, SM_LP_ROPE_KV, 0, e)) return -1;
    if (sm_k_qk_rope_kv(q, NQ, k, vv, NQ, n, v->plan->nHl, v->plan->nKVl, v->pos, v->slot, L->full ? 0.0 : cf->rope_theta, cf->rms_eps,
                        q, NQ, L->kv, v->kvs->nblocks, v->st, e))
        return sm_errprefix(e, "cuda step: layer %d qk norm / rope / kv insert", l);
    return st_mark(S, l, SM_LP_ROPE_KV, 1, e);
}

/* The expert stage of a rank of W > 1 into v->mo, docs/parallelism.md section 2.  EP: the
 * partial m over the rank's routes, rank-order summed, rounded.  TP: every route's partial y
 * over the rank's I slice, rank-order summed (before the post-expert norm), then finalized. */
static int st_world_moe(const sm_exec_view *v, const sm_exec_layer *L, int l, int n, const int *idx, const float *w, sm_err *e) {
    const sm_config *cf = v->cfg;
    int rc;
    if (v->plan->moe == SM_MOE_EP)
        rc = sm_cuda_moe_forward_ep(&L->moe, cf->E / v->world * v->rank, v->h1, idx, w, n, v->xpart, v->mws, v->st, e) ||
             sm_gcomm_sum_bf16(v->gc, SM_GC_EXPERT, l, v->xpart, (size_t)n * cf->Hm, v->mo, v->st, e);
    else
        rc = sm_cuda_moe_forward_tp(&L->moe, v->h1, idx, n, v->xpart, v->mws, v->st, e) ||
             sm_gcomm_sum_f32(v->gc, SM_GC_EXPERT, l, v->xpart, (size_t)n * cf->K * cf->Hm, v->xpart, v->st, e) ||
             sm_cuda_moe_finalize(&L->moe, v->xpart, idx, w, n, v->mo, v->mws, v->st, e);
    return rc ? sm_errprefix(e, "cuda step: rank %d layer %d moe (%s)", v->rank, l, sm_moe_layout_name(v->plan->moe)) : 0;
}

/* Decoder layer l from its projections q: s updated, x = the next layer's normed input
 * (after the last layer: h). */
static int st_layer_rest(st_exec *S, const sm_exec_run *r, int l, uint16_t *q, sm_err *e) {
    const sm_exec_view *v = S->v;
    const sm_config *cf = v->cfg;
    const sm_exec_layer *L = &v->layers[l];
    const int n = r->n, H = cf->H, QD = v->plan->nHl * cf->D, KD = v->plan->nKVl * cf->D, K = cf->K;
    cudaStream_t st = v->st;
    sm_kernel_ctx *kc = v->kc;
    uint16_t *g = q + QD + 2 * KD;
    int *idx = v->idx + (size_t)l * v->cap * K;
    float *w = v->rw + (size_t)l * v->cap * K;
    /* paged attention + output norm + sigmoid gate */
    if (st_mark(S, l, SM_LP_ATTENTION, 0, e) || st_attention(v, r, l, q, g, e) || st_mark(S, l, SM_LP_ATTENTION, 1, e)) return -1;
    /* a = mm(o, Wo); world > 1: a = r16(attn_sum(o Wo[:, my heads]^T in f32)) */
    if (st_mark(S, l, SM_LP_OPROJ, 0, e)) return -1;
    if (v->gc) {
        if (sm_k_mm_f32(kc, v->att, n, QD, L->wo, H, v->apart, st, e) ||
            sm_gcomm_sum_bf16(v->gc, SM_GC_ATTN, l, v->apart, (size_t)n * H, v->a, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d o_proj", v->rank, l);
    } else if (sm_k_mm(kc, v->att, n, QD, L->wo, H, v->a, st, e))
        return sm_errprefix(e, "cuda step: layer %d o_proj", l);
    /* post-attention boundary, then xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
    if (st_mark(S, l, SM_LP_OPROJ, 1, e) || st_mark(S, l, SM_LP_POST_ATTN, 0, e)) return -1;
    if (sm_k_post_attn(v->s, v->a, L->att_alpha, L->att_beta, L->pre_ffn_norm, n, H, cf->post_eps, cf->rms_eps, v->xf, st, e))
        return sm_errprefix(e, "cuda step: layer %d post-attention boundary", l);
    /* router + top-K */
    if (st_mark(S, l, SM_LP_POST_ATTN, 1, e) || st_mark(S, l, SM_LP_ROUTER, 0, e)) return -1;
    if (sm_k_route(kc, v->xf, n, H, L->router, L->router_bias, cf->E, K, cf->out_mult, cf->route_scale, v->rlog, idx, w, st, e))
        return sm_errprefix(e, "cuda step: layer %d router", l);
    /* h1 = r16(rms(mm(xf, Wpre), eff(pre_expert_norm))); world > 1: the pooler's row blocks gathered */
    if (st_mark(S, l, SM_LP_ROUTER, 1, e) || st_mark(S, l, SM_LP_POOLER, 0, e)) return -1;
    if (v->gc) {
        if (sm_k_mm(kc, v->xf, n, H, L->pooler, v->plan->np, v->pooled_part, st, e) ||
            sm_gcomm_gather_cols(v->gc, SM_GC_POOLED, l, v->pooled_part, n, (size_t)v->plan->np * 2, v->h1, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d pooler", v->rank, l);
    } else if (sm_k_mm(kc, v->xf, n, H, L->pooler, cf->Hm, v->h1, st, e))
        return sm_errprefix(e, "cuda step: layer %d pooler", l);
    /* W4A4: h1 rounded to MXFP4 here, once a row (mws->h1_mx: the experts take it as is), and
     * on the FP8 tensor cores its e4m3 image written for the expert stage */
    if (st_mark(S, l, SM_LP_POOLER, 1, e) || st_mark(S, l, SM_LP_PRE_NORM, 0, e)) return -1;
    uint8_t *ic; float *ifac; int ikp;
    sm_cuda_moe_h1_img(&L->moe, v->mws, &ic, &ifac, &ikp);
    if (sm_k_rms_bf16(v->h1, n, cf->Hm, L->pre_expert_norm, cf->rms_eps, v->h1, L->moe.act_mx, ic, ifac, ikp, st, e))
        return sm_errprefix(e, "cuda step: layer %d pre-expert norm", l);
    /* m = r16(sum_k w_k yn_k) over the routed experts */
    if (st_mark(S, l, SM_LP_PRE_NORM, 1, e) || st_mark(S, l, SM_LP_EXPERTS, 0, e)) return -1;
    if (v->gc) {
        if (st_world_moe(v, L, l, n, idx, w, e)) return -1;
    } else if (sm_cuda_moe_forward(&L->moe, v->h1, idx, w, n, v->mo, v->mws, st, e))
        return sm_errprefix(e, "cuda step: layer %d moe", l);
    /* f = mm(m, Wpost); world > 1: the unpooler's row blocks gathered */
    if (st_mark(S, l, SM_LP_EXPERTS, 1, e) || st_mark(S, l, SM_LP_UNPOOLER, 0, e)) return -1;
    if (v->gc) {
        if (sm_k_mm(kc, v->mo, n, cf->Hm, L->unpooler, v->plan->nu, v->unpooled_part, st, e) ||
            sm_gcomm_gather_cols(v->gc, SM_GC_UNPOOLED, l, v->unpooled_part, n, (size_t)v->plan->nu * 2, v->f, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d unpooler", v->rank, l);
    } else if (sm_k_mm(kc, v->mo, n, cf->Hm, L->unpooler, H, v->f, st, e))
        return sm_errprefix(e, "cuda step: layer %d unpooler", l);
    /* post-FFN boundary + the next layer's input norm (the final norm after the last layer) */
    if (st_mark(S, l, SM_LP_UNPOOLER, 1, e) || st_mark(S, l, SM_LP_POST_FFN, 0, e)) return -1;
    int last = l == cf->L - 1;
    const float *nw = last ? v->final_norm : v->layers[l + 1].in_norm;
    if (sm_k_post_ffn(v->s, v->f, L->post_ffn_norm, L->ffn_alpha, L->ffn_beta, nw, last, n, H, cf->post_eps, cf->rms_eps, v->x, st, e))
        return sm_errprefix(e, "cuda step: layer %d post-FFN boundary", l);
    return st_mark(S, l, SM_LP_POST_FFN, 1, e);
}

/* Release a traced step's stream (the host has enqueued what the timeline holds). */
static void st_release(st_trace *T) { __atomic_store_n(&T->hold[0], (uint64_t)1, __ATOMIC_RELEASE); }

/* Layers [a, b): each its projections (layer a's unless made before) and the rest; then layer
 * b's projections when the run after starts from them. */
static int st_layers(void *ctx, const sm_exec_run *r, int a, int b, unsigned flags, sm_err *e) {
    st_exec *S = (st_exec *)ctx;
    const sm_exec_view *v = S->v;
    if (r->moe_only) { /* bench: layer a's expert stage alone, on the routes its last step left */
        const int K = v->cfg->K;
        const int *idx = v->idx + (size_t)a * v->cap * K;
        const float *w = v->rw + (size_t)a * v->cap * K;
        if (sm_cuda_moe_forward(&v->layers[a].moe, v->h1, idx, w, r->n, v->mo, v->mws, v->st, e))
            return sm_errprefix(e, "cuda step: layer %d moe", a);
        return 0;
    }
    for (int l = a; l < b; l++) {
        uint16_t *q = st_qkv(v, r, l);
        if (!(l == a && (flags & SM_EXEC_HAVE_QKV)) && st_layer_qkv(S, r, l, q, e)) return -1;
        if (st_layer_rest(S, r, l, q, e)) return -1;
    }
    if ((flags & SM_EXEC_NEXT_QKV) && st_layer_qkv(S, r, b, st_qkv(v, r, b), e)) return -1;
    if (S->tr && b == v->cfg->L) st_release(S->tr); /* the last layer is enqueued: let the GPU run */
    return 0;
}

/* ---- the timeline (the bench's trace hooks) ---- */

/* Hold the stream until the host releases it (flag[0]) or bound_ns pass (then flag[1] = 1). */
__global__ void st_hold_kernel(uint64_t *flag, uint64_t bound_ns) {
    const uint64_t t0 = sm_now_ns();
    while (!sm_ld_acquire_sys_u64(flag)) {
        if (sm_now_ns() - t0 > bound_ns) {
            flag[1] = 1;
            return;
        }
        __nanosleep(1000);
    }
}

/* One block a layer; its phases are the layer phases of exec.h (index = SM_LP_*).  The floors
 * stay 0: the bench computes them from the table's weights and the step's routes. */
static void st_trace_fmt(void *ctx, sm_exec_trace *t) {
    st_exec *S = (st_exec *)ctx;
    memset(t, 0, sizeof *t);
    t->what = "stock";
    t->layers = S->v->cfg->L;
    t->phases = SM_LP_N;
    for (int p = 0; p < SM_LP_N; p++) {
        S->names[p] = sm_exec_lphases[p].what;
        t->part[p] = (unsigned char)p;
    }
    t->name = S->names;
    t->lead = "between layers";
    t->lead_note = "(trace events)";
    t->lead_part = SM_LP_NONE;
}

static int st_trace_blocks(void *ctx) {
    (void)ctx;
    return 1;
}

/* Frees T once its stream has drained (the hold kernel reads T->hold until then). */
static void st_trace_free(st_trace *T) {
    if (T->ev)
        for (size_t i = 0; i < (size_t)T->L * SM_LP_N * 2; i++)
            if (T->ev[i]) SM_CUDA_CHECK_PRINT(cudaEventDestroy(T->ev[i]));
    if (T->ev0) SM_CUDA_CHECK_PRINT(cudaEventDestroy(T->ev0));
    if (T->hold) SM_CUDA_CHECK_PRINT(cudaFreeHost(T->hold));
    free(T->ev);
    free(T->rec);
    free(T);
}

/* The next eager step's phases timed: the hold kernel, then time 0, on the rank's stream. */
static int st_trace_on(void *ctx, int blocks, sm_err *e) {
    st_exec *S = (st_exec *)ctx;
    const sm_exec_view *v = S->v;
    if (S->tr || blocks != 1) return sm_errf(e, "stock trace: already on, or %d blocks a layer (1)", blocks);
    st_trace *T = (st_trace *)calloc(1, sizeof *T);
    const size_t n = (size_t)v->cfg->L * SM_LP_N * 2;
    if (T) {
        T->L = v->cfg->L;
        T->ev = (cudaEvent_t *)calloc(n, sizeof *T->ev);
        T->rec = (unsigned char *)calloc(n, 1);
    }
    if (!T || !T->ev || !T->rec) {
        if (T) st_trace_free(T);
        return sm_errf(e, "stock trace: out of host memory");
    }
    uint64_t *hold_d = NULL;
    int made = cudaHostAlloc((void **)&T->hold, 2 * sizeof(uint64_t), cudaHostAllocMapped) == cudaSuccess &&
               (T->hold[0] = T->hold[1] = 0, cudaHostGetDevicePointer((void **)&hold_d, T->hold, 0)) == cudaSuccess &&
               cudaEventCreate(&T->ev0) == cudaSuccess;
    for (size_t i = 0; i < n && made; i++) made = cudaEventCreate(&T->ev[i]) == cudaSuccess;
    if (!made) {
        cudaGetLastError();
        st_trace_free(T);
        return sm_errf(e, "stock trace: cannot make its hold flag and events on device %d", v->device);
    }
    st_hold_kernel<<<1, 1, 0, v->st>>>(hold_d, ST_HOLD_NS);
    cudaError_t rc = cudaGetLastError();
    if (rc == cudaSuccess) rc = cudaEventRecord(T->ev0, v->st);
    if (rc != cudaSuccess) {
        st_release(T);
        cudaStreamSynchronize(v->st);
        st_trace_free(T);
        return sm_errf(e, "stock trace: hold kernel on device %d: %s", v->device, cudaGetErrorString(rc));
    }
    S->tr = T;
    return 0;
}

/* The timestamps (ns after time 0, plus 1000 so that none is 0) into host [L][1][SM_LP_N][2],
 * then the timeline freed. */
static int st_trace_off(void *ctx, unsigned long long *host, sm_err *e) {
    st_exec *S = (st_exec *)ctx;
    st_trace *T = S->tr;
    if (!T) return sm_errf(e, "stock trace: not on");
    S->tr = NULL;
    st_release(T); /* a step that failed before its last layer */
    int rc = 0;
    cudaError_t ce = cudaStreamSynchronize(S->v->st);
    if (ce != cudaSuccess) rc = sm_errf(e, "stock trace: device %d: %s", S->v->device, cudaGetErrorString(ce));
    if (!rc && T->hold[1])
        fprintf(stderr, "sparkmono: stock trace: enqueueing the step took the host longer than the %.0f ms hold: the phases "
                "after that point include the host's launch gaps\n", ST_HOLD_NS / 1e6);
    for (size_t i = 0; host && i < (size_t)T->L * SM_LP_N * 2; i++) {
        float ms = 0;
        host[i] = 0;
        if (rc || !T->rec[i]) continue;
        if ((ce = cudaEventElapsedTime(&ms, T->ev0, T->ev[i])) != cudaSuccess)
            rc = sm_errf(e, "stock trace: cudaEventElapsedTime: %s", cudaGetErrorString(ce));
        else host[i] = 1000ull + (unsigned long long)llround((double)ms * 1e6);
    }
    st_trace_free(T);
    return rc;
}

static void st_free(void *ctx) {
    st_exec *S = (st_exec *)ctx;
    if (S->tr) {
        sm_err e;
        st_trace_off(S, NULL, &e);
    }
    free(S);
}

int sm_exec_stock_create(const sm_exec_view *v, int strict, sm_exec *x, sm_err *e) {
    (void)strict;
    memset(x, 0, sizeof *x);
    x->name = "stock";
    x->lo = 0;
    x->hi = v->cfg->L;
    x->layers = st_layers;
    x->trace_fmt = st_trace_fmt;
    x->trace_blocks = st_trace_blocks;
    x->trace_on = st_trace_on;
    x->trace_off = st_trace_off;
    x->free = st_free;
    st_exec *S = (st_exec *)calloc(1, sizeof *S);
    if (!S) return sm_errf(e, "stock executor: out of host memory");
    S->v = v;
    x->ctx = S;
    return 0;
}
