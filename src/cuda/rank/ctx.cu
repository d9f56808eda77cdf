/* ctx.cu: the device context of one rank (rank.h: sm_cuda_rank): device checks, creation of
 * everything but the weights, the carving of weight allocations, destruction.
 *
 * Few large allocations, carved: one per layer for its dense weights, one for embed /
 * lm_head / final norm, one for the activations, one packed metadata buffer (device) with its
 * pinned host twin.  The device comes from the backend options (sm_backend_opts.device) and
 * is made current at every entry; the stream is non-blocking, and every memset of the setup
 * runs on it.  We rejected one cudaMalloc per tensor (thousands of calls on the real model,
 * and scattered pointers a future peer mapping would have to export one by one) and the
 * legacy default stream (it serializes with every other rank's work on the same host).
 */
#include "rank.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CB_ALIGN 256
static size_t cb_al(size_t x) { return (x + CB_ALIGN - 1) / CB_ALIGN * CB_ALIGN; }

/* ---- weight allocations ---------------------------------------------------------------- */

/* Byte offsets of the parts of one layer's dense allocation (the rank's widths). */
typedef struct cb_dense_layout {
    size_t wqkvg, wo, vec, router, bias, pooler, pen, unpooler, total; /* byte offsets; total */
} cb_dense_layout;

static cb_dense_layout cb_layout(const sm_cuda_rank *cr) {
    const sm_config *cf = &cr->cfg;
    cb_dense_layout d;
    size_t H = (size_t)cf->H, QD = (size_t)cr->plan.nHl * cf->D, KD = (size_t)cr->plan.nKVl * cf->D;
    size_t o = 0;
    d.wqkvg = o; o += cb_al((2 * QD + 2 * KD) * H * 2);
    d.wo = o; o += cb_al(H * QD * 2);
    d.vec = o; o += 7 * cb_al(H * 4);
    d.router = o; o += cb_al((size_t)cf->E * H * 4);
    d.bias = o; o += cb_al((size_t)cf->E * 4);
    d.pooler = o; o += cb_al((size_t)cr->plan.np * H * 2);
    d.pen = o; o += cb_al((size_t)cf->Hm * 4);
    d.unpooler = o; o += cb_al((size_t)cr->plan.nu * cf->Hm * 2);
    d.total = o;
    return d;
}

size_t cb_layer_bytes(const sm_cuda_rank *cr) { return cb_layout(cr).total; }

int cb_layer_alloc(sm_cuda_rank *cr, sm_exec_layer *L, sm_err *e) {
    cb_dense_layout d = cb_layout(cr);
    SM_CUDA_CHECK(cudaMalloc(&L->dense, d.total));
    L->dense_bytes = d.total;
    char *b = (char *)L->dense;
    size_t hv = cb_al((size_t)cr->cfg.H * 4);
    L->wqkvg = (uint16_t *)(b + d.wqkvg);
    L->wo = (uint16_t *)(b + d.wo);
    L->in_norm = (float *)(b + d.vec + 0 * hv);
    L->att_alpha = (float *)(b + d.vec + 1 * hv);
    L->att_beta = (float *)(b + d.vec + 2 * hv);
    L->pre_ffn_norm = (float *)(b + d.vec + 3 * hv);
    L->post_ffn_norm = (float *)(b + d.vec + 4 * hv);
    L->ffn_alpha = (float *)(b + d.vec + 5 * hv);
    L->ffn_beta = (float *)(b + d.vec + 6 * hv);
    L->router = (float *)(b + d.router);
    L->router_bias = (float *)(b + d.bias);
    L->pooler = (uint16_t *)(b + d.pooler);
    L->pre_expert_norm = (float *)(b + d.pen);
    L->unpooler = (uint16_t *)(b + d.unpooler);
    cr->weight_bytes += (double)d.total;
    return 0;
}

void *cb_tensor_dev(const sm_cuda_rank *cr, int l, sm_tensor_role r, int k) {
    if (l < 0) {
        switch (r) {
        case SM_T_EMBED: return cr->embed;
        case SM_T_LM_HEAD: return cr->lm_head;
        case SM_T_FINAL_NORM: return cr->final_norm;
        default: return NULL;
        }
    }
    const sm_exec_layer *L = &cr->layers[l];
    const size_t H = (size_t)cr->cfg.H, QD = (size_t)cr->plan.nHl * cr->cfg.D, KD = (size_t)cr->plan.nKVl * cr->cfg.D;
    switch (r) {
    /* q, k, v and the attention gate: row blocks of one matrix [(2 QD + 2 KD), H] */
    case SM_T_WQ: return L->wqkvg;
    case SM_T_WK: return L->wqkvg + QD * H;
    case SM_T_WV: return L->wqkvg + (QD + KD) * H;
    case SM_T_WG: return L->wqkvg + (QD + 2 * KD) * H;
    case SM_T_WO: return L->wo;
    case SM_T_IN_NORM: return L->in_norm;
    case SM_T_ATT_GATE: return k ? L->att_beta : L->att_alpha;
    case SM_T_PRE_FFN_NORM: return L->pre_ffn_norm;
    case SM_T_POST_FFN_NORM: return L->post_ffn_norm;
    case SM_T_FFN_GATE: return k ? L->ffn_beta : L->ffn_alpha;
    case SM_T_ROUTER: return L->router;
    case SM_T_ROUTER_BIAS: return L->router_bias;
    case SM_T_POOLER: return L->pooler;
    case SM_T_PRE_EXPERT_NORM: return L->pre_expert_norm;
    case SM_T_UNPOOLER: return L->unpooler;
    default: return NULL; /* post_expert_norm and the experts: the MoE module (L->moe) */
    }
}

int cb_glob_alloc(sm_cuda_rank *cr, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    size_t vh = cb_al((size_t)cr->plan.nv * cf->H * 2);
    size_t tot = 2 * vh + cb_al((size_t)cf->H * 4);
    SM_CUDA_CHECK(cudaMalloc(&cr->glob, tot));
    cr->embed = (uint16_t *)cr->glob;
    cr->lm_head = (uint16_t *)((char *)cr->glob + vh);
    cr->final_norm = (float *)((char *)cr->glob + 2 * vh);
    cr->weight_bytes += (double)tot;
    return 0;
}

/* ---- the rest of the context --------------------------------------------------------------- */

/* Activations for cap rows, one allocation; the routes start valid (expert 0, weight 0) so a
 * bench read before any step is harmless. */
static int cb_act_alloc(sm_cuda_rank *cr, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    size_t R = (size_t)cr->cap, H = (size_t)cf->H, QD = (size_t)cf->nH * cf->D, KD = (size_t)cf->nKV * cf->D;
    size_t NQ = 2 * QD + 2 * KD, L = (size_t)cf->L, K = (size_t)cf->K;
    size_t off[13], o = 0;
    off[0] = o; o += cb_al(R * H * 4);               /* s */
    off[1] = o; o += cb_al(R * H * 2);               /* x */
    off[2] = o; o += cb_al(R * NQ * 2);              /* qkvg */
    off[3] = o; o += cb_al(R * QD * 2);              /* att */
    off[4] = o; o += cb_al(R * H * 2);               /* a */
    off[5] = o; o += cb_al(R * H * 2);               /* xf */
    off[6] = o; o += cb_al(R * (size_t)cf->E * 4);   /* rlog */
    off[7] = o; o += cb_al(L * R * K * 4);           /* idx */
    off[8] = o; o += cb_al(L * R * K * 4);           /* rw */
    off[9] = o; o += cb_al(R * (size_t)cf->Hm * 2);  /* h1 */
    off[10] = o; o += cb_al(R * (size_t)cf->Hm * 2); /* mo */
    off[11] = o; o += cb_al(R * H * 2);              /* f */
    off[12] = o; o += cb_al(R * 4);                  /* am */
    SM_CUDA_CHECK(cudaMalloc(&cr->act, o));
    char *ab = (char *)cr->act;
    cr->s = (float *)(ab + off[0]);
    cr->x = (uint16_t *)(ab + off[1]);
    cr->qkvg = (uint16_t *)(ab + off[2]);
    cr->att = (uint16_t *)(ab + off[3]);
    cr->a = (uint16_t *)(ab + off[4]);
    cr->xf = (uint16_t *)(ab + off[5]);
    cr->rlog = (float *)(ab + off[6]);
    cr->idx = (int *)(ab + off[7]);
    cr->rw = (float *)(ab + off[8]);
    cr->h1 = (uint16_t *)(ab + off[9]);
    cr->mo = (uint16_t *)(ab + off[10]);
    cr->f = (uint16_t *)(ab + off[11]);
    cr->am = (int *)(ab + off[12]);
    SM_CUDA_CHECK(cudaMemsetAsync(cr->idx, 0, L * R * K * 4, cr->st));
    SM_CUDA_CHECK(cudaMemsetAsync(cr->rw, 0, L * R * K * 4, cr->st));
    return 0;
}

/* Packed metadata: slot int64 [cap] | tok [cap] | pos [cap] | rreq [cap] | tables, on the
 * device and in pinned host staging; pinned argmax staging. */
static int cb_meta_alloc(sm_cuda_rank *cr, sm_err *e) {
    size_t R = (size_t)cr->cap;
    size_t m0 = 0, m1 = m0 + cb_al(R * 8), m2 = m1 + cb_al(R * 4), m3 = m2 + cb_al(R * 4), m4 = m3 + cb_al(R * 4);
    cr->off_tab = m4;
    cr->meta_bytes = m4 + (size_t)cr->ntab * (size_t)cr->kvs.max_bpr * 4;
    SM_CUDA_CHECK(cudaMalloc(&cr->meta_d, cr->meta_bytes));
    SM_CUDA_CHECK(cudaMallocHost(&cr->meta_h, cr->meta_bytes));
    SM_CUDA_CHECK(cudaMallocHost((void **)&cr->h_am, R * 4));
    char *mb = (char *)cr->meta_d;
    cr->d_slot = (int64_t *)(mb + m0);
    cr->d_tok = (int *)(mb + m1);
    cr->d_pos = (int *)(mb + m2);
    cr->d_rreq = (int *)(mb + m3);
    cr->d_tab = (int *)(mb + m4);
    return 0;
}

size_t cb_kv_page_bytes(const sm_cuda_rank *cr) {
    /* K and V, bf16, SM_KV_BLOCK positions of the rank's KV heads, every layer */
    return (size_t)cr->plan.nKVl * SM_KV_BLOCK * 2 * cr->cfg.D * 2 * (size_t)cr->cfg.L;
}

/* KV pages of every layer (the rank's KV heads), plus the zero page nblocks, all zero. */
static int cb_kv_alloc(sm_cuda_rank *cr, sm_err *e) {
    size_t page = cb_kv_page_bytes(cr) / (size_t)cr->cfg.L;
    size_t bytes = page * ((size_t)cr->kvs.nblocks + 1);
    for (int l = 0; l < cr->cfg.L; l++) {
        SM_CUDA_CHECK(cudaMalloc(&cr->layers[l].kv, bytes));
        SM_CUDA_CHECK(cudaMemsetAsync(cr->layers[l].kv, 0, bytes, cr->st));
    }
    return 0;
}

#define CB_KV_RESERVE ((size_t)512 << 20) /* for graphs, cuBLAS and what else comes on first use */

int cb_kv_fit(const sm_cuda_rank *cr, double util, int k, int *pages, sm_err *e) {
    size_t fr = 0, total = 0;
    SM_CUDA_CHECK(cudaSetDevice(cr->device));
    SM_CUDA_CHECK(cudaMemGetInfo(&fr, &total));
    /* allocated on first use: the logits of a chunk, the masks' staging, the summaries */
    const size_t later = (size_t)CB_LOGIT_ROWS * cr->cfg.V * 4 + (size_t)SM_MASK_ROWS * ((cr->cfg.V + 31) / 32) * 4 +
                         (size_t)cr->cap * sizeof(sm_lp_sum) + CB_KV_RESERVE;
    const double budget = util * (double)total - (double)(total - fr) - (double)k * (double)later;
    /* one page a layer of every rank stays for its zero page */
    const double n = budget / ((double)cb_kv_page_bytes(cr) * k) - 1;
    const int need = (cr->kvs.max_len + SM_KV_BLOCK - 1) / SM_KV_BLOCK;
    if (n < need)
        return sm_errf(e, "gpu memory utilization %.2f of device %d (%.1f GiB, %.1f GiB in use after the weights) leaves %d KV pages "
                       "for %d rank(s) there; one request of the max length %d needs %d: raise it or lower the max length",
                       util, cr->device, (double)total / (1 << 30), (double)(total - fr) / (1 << 30), n > 0 ? (int)n : 0, k,
                       cr->kvs.max_len, need);
    *pages = n > (double)(1 << 30) ? 1 << 30 : (int)n;
    return 0;
}

int cb_kv_finish(sm_cuda_rank *cr, int pages, sm_err *e) {
    if (cb_enter(cr, e)) return -1;
    cr->kvs.nblocks = pages;
    if (cb_kv_alloc(cr, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    cr->kv_deferred = 0;
    return 0;
}

/* The checks that need no device, then the host part of the context. */
static int cb_dev_new(const sm_config *cfg, const sm_kv *kv, const sm_backend_opts *o, int rank, int device, sm_cuda_rank **out,
                      sm_err *e) {
    int world = o && o->world > 1 ? o->world : 1;
    if (o && o->verify_rows > CB_GRAPH_REQ_ROWS)
        return sm_errf(e, "cuda backend: --request-rows %d > %d: the CUDA backend captures verify steps of at most %d rows a request",
                       o->verify_rows, CB_GRAPH_REQ_ROWS, CB_GRAPH_REQ_ROWS);
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0 || kv->max_req <= 0)
        return sm_errf(e, "cuda backend: a kv cache with pages and request slots is required");
    if (cfg->D != 64) return sm_errf(e, "cuda backend: head_dim %d: the kernels support 64 only", cfg->D);
    if (cfg->L > SM_MAX_LAYERS) return sm_errf(e, "cuda backend: %d layers, more than %d", cfg->L, SM_MAX_LAYERS);
    if (sm_cuda_device_check(device, 1, "cuda backend", e)) return -1;
    sm_cuda_rank *cr = (sm_cuda_rank *)calloc(1, sizeof *cr);
    if (!cr) return sm_errf(e, "cuda backend: out of host memory");
    *out = cr;
    cr->cfg = *cfg;
    cr->device = device;
    cr->rank = rank;
    cr->world = world;
    cr->mono_mode = o ? o->mono : SM_MONO_AUTO;
    sm_shard_plan(cfg, world, cr->rank, sm_moe_layout_of(o ? o->moe_tp : 0), &cr->plan);
    cr->kvs = sm_kv_shape_of(kv);
    cr->kv_deferred = o && o->kv_mem_util > 0;
    /* rows per eager chunk: at least a full graph chunk; at most what the MoE stage takes
     * (max_rows * K <= 4096, moe.h); longer steps run in chunks */
    int cap = o && o->max_rows > 0 ? o->max_rows : 256;
    if (cap > 4096 / cfg->K) cap = 4096 / cfg->K;
    if (cap < CB_GRAPH_ROWS) cap = CB_GRAPH_ROWS;
    cr->cap = cap;
    cr->ntab = (cap < kv->max_req ? cap : kv->max_req) + 1;
    cr->layers = (sm_exec_layer *)calloc((size_t)cfg->L, sizeof(sm_exec_layer));
    cr->tab_of_req = (int *)malloc(sizeof(int) * (size_t)kv->max_req);
    if (!cr->layers || !cr->tab_of_req) return sm_errf(e, "cuda backend: out of host memory");
    for (int r = 0; r < kv->max_req; r++) cr->tab_of_req[r] = -1;
    for (int l = 0; l < cfg->L; l++) cr->layers[l].full = cfg->full[l];
    return 0;
}

/* The buffers of a rank's local parts (world > 1): one allocation; iota filled. */
static int cb_world_alloc(sm_cuda_rank *cr, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const size_t R = (size_t)cr->cap, H = (size_t)cf->H, Hm = (size_t)cf->Hm;
    const size_t xrows = cr->plan.moe == SM_MOE_TP ? R * (size_t)cf->K : R;
    size_t off[9], o = 0;
    off[0] = o; o += cb_al(R * H * 4);                              /* apart */
    off[1] = o; o += cb_al(R * (size_t)cr->plan.np * 2);             /* pooled_part */
    off[2] = o; o += cb_al(xrows * Hm * 4);                         /* xpart */
    off[3] = o; o += cb_al(R * (size_t)cr->plan.nu * 2);             /* unpooled_part */
    off[4] = o; o += cb_al(R * H * 2);                              /* embed_part */
    off[5] = o; o += cb_al(R * 4);                                  /* iota */
    off[6] = o; o += cb_al((size_t)CB_LOGIT_ROWS * cr->plan.nv * 4); /* logits_part */
    off[7] = o; o += cb_al(R * 4);                                  /* best */
    off[8] = o; o += cb_al(R * 4);                                  /* argmax_part */
    SM_CUDA_CHECK(cudaMalloc(&cr->wbuf, o));
    char *b = (char *)cr->wbuf;
    cr->apart = (float *)(b + off[0]);
    cr->pooled_part = (uint16_t *)(b + off[1]);
    cr->xpart = (float *)(b + off[2]);
    cr->unpooled_part = (uint16_t *)(b + off[3]);
    cr->embed_part = (uint16_t *)(b + off[4]);
    cr->iota = (int *)(b + off[5]);
    cr->logits_part = (float *)(b + off[6]);
    cr->best = (float *)(b + off[7]);
    cr->argmax_part = (int *)(b + off[8]);
    int *h = (int *)malloc(R * 4);
    if (!h) return sm_errf(e, "out of host memory");
    for (size_t i = 0; i < R; i++) h[i] = (int)i;
    cudaError_t r = cudaMemcpy(cr->iota, h, R * 4, cudaMemcpyHostToDevice);
    free(h);
    if (r != cudaSuccess) return sm_errf(e, "cudaMemcpy of the row indices on device %d: %s", cr->device, cudaGetErrorString(r));
    return 0;
}

/* The MoE workspace for the rank's experts: EP sizes it for its ne experts, TP for its I slice.
 * h1_mx: the pre-expert norm of a W4A4 layer rounds h1 (the stock layers' and the monokernel's norm). */
static int cb_moe_ws(sm_cuda_rank *cr, sm_err *e) {
    int rc;
    if (cr->world == 1) {
        rc = sm_cuda_moe_ws_alloc(&cr->cfg, cr->cap, &cr->mws, e);
    } else {
        const int W = cr->world, r = cr->rank, tp = cr->plan.moe == SM_MOE_TP;
        sm_shard_experts X;
        memset(&X, 0, sizeof X);
        X.e0 = tp ? 0 : r * (cr->cfg.E / W);
        X.ne = tp ? cr->cfg.E : cr->cfg.E / W;
        X.i0 = tp ? r * (cr->cfg.I / W) : 0;
        X.ni = tp ? cr->cfg.I / W : cr->cfg.I;
        rc = sm_cuda_moe_ws_alloc_shard(&cr->cfg, &X, cr->cap, &cr->mws, e);
    }
    if (!rc) cr->mws.h1_mx = 1;
    return rc;
}

/* The device part: kernel context, stream, activations, metadata, KV, MoE workspace. */
static int cb_dev_setup(sm_cuda_rank *cr, sm_err *e) {
    if (cb_enter(cr, e)) return -1;
    if (sm_kernel_ctx_init(&cr->kc, cr->device, sm_cuda_ws_bytes(&cr->cfg, cr->cap), e)) return -1;
    cr->have_kc = 1;
    SM_CUDA_CHECK(cudaStreamCreateWithFlags(&cr->st, cudaStreamNonBlocking));
    if (cb_act_alloc(cr, e) || cb_meta_alloc(cr, e) || (!cr->kv_deferred && cb_kv_alloc(cr, e))) return -1;
    if (cr->world > 1 && cb_world_alloc(cr, e)) return -1;
    if (cb_moe_ws(cr, e)) return -1;
    /* the memsets above ran on cr->st (sm_kernel_ctx_init waited for its own): wait for them */
    SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    return 0;
}

int cb_dev_create(const sm_config *cfg, const sm_kv *kv, const sm_backend_opts *o, int rank, int device, sm_cuda_rank **out,
                  sm_err *e) {
    *out = NULL;
    sm_cuda_rank *cr = NULL;
    if (cb_dev_new(cfg, kv, o, rank, device, &cr, e)) { /* its messages name the backend */
        cb_dev_destroy(cr);
        return -1;
    }
    if (cb_dev_setup(cr, e)) {
        cb_dev_destroy(cr);
        return sm_errprefix(e, "cuda backend");
    }
    *out = cr;
    return 0;
}

void cb_dev_destroy(sm_cuda_rank *cr) {
    if (!cr) return;
    SM_CUDA_CHECK_PRINT(cudaSetDevice(cr->device));
    if (cr->st) SM_CUDA_CHECK_PRINT(cudaStreamSynchronize(cr->st));
    cb_graphs_drop(cr, 0);
    cb_exec_detach(cr);
    if (cr->layers) {
        for (int l = 0; l < cr->cfg.L; l++) {
            sm_exec_layer *L = &cr->layers[l];
            if (L->have_moe) sm_cuda_moe_free(&L->moe);
            if (L->dense) SM_CUDA_CHECK_PRINT(cudaFree(L->dense));
            if (L->kv) SM_CUDA_CHECK_PRINT(cudaFree(L->kv));
        }
        free(cr->layers);
    }
    if (cr->glob) SM_CUDA_CHECK_PRINT(cudaFree(cr->glob));
    if (cr->act) SM_CUDA_CHECK_PRINT(cudaFree(cr->act));
    if (cr->wbuf) SM_CUDA_CHECK_PRINT(cudaFree(cr->wbuf));
    if (cr->logits) SM_CUDA_CHECK_PRINT(cudaFree(cr->logits));
    if (cr->lps) SM_CUDA_CHECK_PRINT(cudaFree(cr->lps));
    if (cr->h_lps) SM_CUDA_CHECK_PRINT(cudaFreeHost(cr->h_lps));
    if (cr->mask_d) SM_CUDA_CHECK_PRINT(cudaFree(cr->mask_d));
    if (cr->mask_h) SM_CUDA_CHECK_PRINT(cudaFreeHost(cr->mask_h));
    if (cr->aux) SM_CUDA_CHECK_PRINT(cudaFree(cr->aux));
    if (cr->meta_d) SM_CUDA_CHECK_PRINT(cudaFree(cr->meta_d));
    if (cr->meta_h) SM_CUDA_CHECK_PRINT(cudaFreeHost(cr->meta_h));
    if (cr->h_am) SM_CUDA_CHECK_PRINT(cudaFreeHost(cr->h_am));
    free(cr->tab_of_req);
    if (cr->mws.buf) sm_cuda_moe_ws_free(&cr->mws);
    if (cr->st) SM_CUDA_CHECK_PRINT(cudaStreamDestroy(cr->st));
    if (cr->have_kc) sm_kernel_ctx_free(&cr->kc);
    free(cr);
}

static void cb_destroy(void *vctx) { cb_dev_destroy((sm_cuda_rank *)vctx); }

void cb_backend_fill(sm_cuda_rank *cr, sm_backend *b) {
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->ctx = cr;
    b->step = cb_step;
    b->destroy = cb_destroy;
    b->max_verify_rows = CB_GRAPH_REQ_ROWS;
}

sm_cuda_rank *cb_rank0(const sm_backend *b, const char *who, sm_err *e) {
    sm_cuda_rank **rk;
    if (cb_world_ranks(b, &rk)) return cb_enter(rk[0], e) ? NULL : rk[0];
    return cb_from_backend(b, who, e);
}

sm_cuda_rank *cb_from_backend(const sm_backend *b, const char *who, sm_err *e) {
    sm_cuda_rank **rk;
    if (cb_world_ranks(b, &rk)) {
        sm_errf(e, "%s: this hook runs one rank; the backend is a world of ranks", who);
        return NULL;
    }
    if (!b || b->step != cb_step || !b->ctx) {
        sm_errf(e, "%s: the backend is not a CUDA backend", who);
        return NULL;
    }
    sm_cuda_rank *cr = (sm_cuda_rank *)b->ctx;
    if (cb_enter(cr, e)) return NULL;
    return cr;
}
