/* mono/build.cu: the host side of the monokernel on one rank's context (stock.h): static
 * eligibility at engine creation, the per-bucket descriptors, the launches of one layer, the
 * health words after a step, and the bench hooks (mode, trace).
 *
 * A bucket's descriptors (one per layer 1..L-2) are planned the first time the bucket runs,
 * before its graph is captured, from the context's fixed buffers: the same calls the stock
 * enqueue makes (sm_wg_plan_mm, sm_att_plan, moe_*_make), so the descriptors hold the stock
 * decomposition.  They are written once and never while a graph runs; a mode change drops
 * the graphs.  Static refusals are collected, all of them, into one line; --mono on turns
 * them into an engine-creation error, auto into one log line and stock steps.
 * We rejected planning per step (a graph replay must not depend on host work) and a single
 * descriptor rewritten per layer (a graph holds all layers' launches at once).
 */
#include "cuda/mono/mono.cuh"
#include "cuda/rank/rank.h"
#include "cuda/bench/bench.h"
#include "cuda/mono/mono.h"
extern "C" {
#include "parallel/hbar.h"
#include "base/outfile.h"
#include "backend/stats.h"
}
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The monokernel state of one context. */
struct cb_mono {
    mono_ctl *ctl;              /* device control words */
    mono_ctl *ctl_h;            /* pinned host copy (health words after a step) */
    void *ws;                   /* device: wgmma partial tiles | router partials | attention partials */
    size_t part_bytes, rpart_bytes, att_bytes;
    mono_desc *desc[CB_NBUCKETS]; /* host [L] per bucket (layers 1..L-2 filled), NULL: not built */
    int refused[CB_NBUCKETS];   /* 1: the bucket's plan failed (its steps run stock) */
    int grid;                   /* blocks of a dense launch: one per SM */
    int moe_grid;               /* blocks of an expert launch: 2 per SM (the stock expert grid) */
    size_t smem;                /* dynamic shared memory of a launch */
    unsigned long long *trace;  /* device trace buffer (bench), NULL */
    mono_prog prog;             /* launch scratch (a launch copies it into its parameters) */
    mono_moe moe;               /* expert launch scratch */
    long layers_run;            /* monokernel layers enqueued (tests) */
    int logged_eager;           /* "stock step (prefill rows)" said */
    int att_fuse;               /* 1: attention inside the launch where one wave of teams holds it
                                   (SPARKMONO_MONO_FUSED_ATT=1); 0: the stock tile kernel between
                                   launches, measured faster (bench/results.md, 2026-12-03 night) */
    /* W > 1 (docs/parallelism.md section 7) */
    uint8_t *xbuf;              /* device: this rank's exchange area, 2 parities of xbytes */
    size_t xbytes;
    unsigned long long *xflag;  /* device [W]: the epochs the ranks published to this one */
    mono_xc xc;                 /* every rank's areas and flags (cb_mono_world_link) */
    struct mono_world *mw;      /* virtual ranks: the joint launches (NULL: one rank a device) */
};

/* Virtual ranks of one world (several on one GPU): every launch is one cooperative launch of
 * all ranks' blocks, issued by rank 0's thread once every rank has enqueued what comes before
 * it (a bounded host barrier), so every rank's blocks are co-resident. */
typedef struct mono_world {
    int W;
    sm_hbar bar;                /* the ranks' rendezvous (bounded, abortable) */
    double bound_s;             /* longest wait at it */
    cudaEvent_t ev[MONO_WMAX];  /* each rank's work before the launch */
    cudaEvent_t done;           /* the joint launch */
    const mono_prog *prog[MONO_WMAX]; /* each rank's program of the current launch */
    const mono_moe *moe[MONO_WMAX];
    mono_prog jp;               /* rank 0's joint program scratch */
    mono_moe jm;
    int N, fmt;                 /* the current launch's token box / expert format (rank 0's) */
} mono_world;

static const int mono_buckets[CB_NBUCKETS] = {8, 16, 24, 32, 48, 64, 96, 128};

/* Token box of bucket rows nb: the wgmma N (8, 16, 32, 64, 128). */
static int mono_box(int nb) { return nb <= 8 ? 8 : nb <= 16 ? 16 : nb <= 32 ? 32 : nb <= 64 ? 64 : 128; }

static void reason_add(char *buf, size_t cap, const char *fmt, ...) {
    size_t l = strlen(buf);
    if (l + 3 >= cap) return;
    if (l) { buf[l++] = ';'; buf[l++] = ' '; buf[l] = 0; }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, cap - l, fmt, ap);
    va_end(ap);
}

/* Every static refusal of config cf with expert formats fmt [L] (NULL: not known yet) on
 * device `device` for `world` ranks, into buf ("" = eligible). */
static void mono_reasons(const sm_config *cf, const int *fmt, int device, int world, char *buf, size_t cap) {
    buf[0] = 0;
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    const int tma = sm_cuda_tma_encoder() != NULL;
    if (major != 9 || !tma) reason_add(buf, cap, "device %d is sm_%d%d, not Hopper sm_90 with TMA", device, major, minor);
    if (world > MONO_WMAX) reason_add(buf, cap, "world %d (the build takes at most %d ranks)", world, MONO_WMAX);
    if (cf->L < 3) reason_add(buf, cap, "%d layers (layers 1..L-2 run mono: needs L >= 3)", cf->L);
    if (cf->D != 64) reason_add(buf, cap, "head_dim %d (the build takes 64)", cf->D);
    const int G = cf->nKV > 0 ? cf->nH / cf->nKV : 0;
    if (G != 2 && G != 8) reason_add(buf, cap, "%d query heads per KV head (the build takes 2 or 8)", G);
    if (cf->E > 1024 || cf->K > 32) reason_add(buf, cap, "E=%d, K=%d (the router body takes E <= 1024, K <= 32)", cf->E, cf->K);
    if (cf->H % 64 || cf->Hm % 64 || (cf->nH * cf->D) % 64)
        reason_add(buf, cap, "H=%d, Hm=%d, nH*D=%d not multiples of 64 (wgmma k stages)", cf->H, cf->Hm, cf->nH * cf->D);
    for (int l = 1; fmt && l < cf->L - 1; l++)
        if (fmt[l] != SM_EXP_MXFP4 && fmt[l] != SM_EXP_FP8 && fmt[l] != SM_EXP_BF16) {
            reason_add(buf, cap, "layer %d experts in a format the build does not run", l);
            break;
        }
    const size_t smem = mono_smem_bytes(128, G, cf->Hm, cf->I, cf->E);
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (smem > (size_t)optin - 1024) reason_add(buf, cap, "%zu bytes of shared memory a block > %d", smem, optin);
    if (!buf[0]) {
        int occ = 0;
        sm_err e2;
        if (mono_occupancy(16, smem, &occ, &e2)) reason_add(buf, cap, "occupancy query failed: %s", e2.msg);
        else if (occ < 1) reason_add(buf, cap, "a 512-thread block with %zu bytes of shared memory is not resident", smem);
    }
    (void)cudaGetLastError();
}

/* Every static refusal of the context, into buf ("" = eligible). */
static void mono_static_reasons(const sm_cuda_rank *cr, char *buf, size_t cap) {
    int fmt[SM_MAX_LAYERS];
    for (int l = 0; l < cr->cfg.L; l++) fmt[l] = cr->layers[l].have_moe ? cr->layers[l].moe.fmt : -1;
    mono_reasons(&cr->cfg, fmt, cr->device, cr->world, buf, cap);
}

extern "C" int sm_cuda_mono_check(const sm_config *cf, const int *fmt, int device, char *buf, size_t cap, sm_err *e) {
    if (cb_device_check(device, 0, "monokernel check", e)) return -1;
    SM_CUDA_CHECK(cudaSetDevice(device));
    mono_reasons(cf, fmt, device, 1, buf, cap);
    return 0;
}

/* Descriptor of layer l for bucket rows nb (host copy): the rank's slices and, with W > 1, its
 * exchanges (the producing phases write into the rank's exchange area, forward.cu's collectives
 * at the same points). */
static int mono_plan_layer(sm_cuda_rank *cr, int nb, int l, mono_desc *d, sm_err *e) {
    cb_mono *M = cr->mono;
    const sm_config *cf = &cr->cfg;
    const cb_layer *L = &cr->layers[l], *Ln = &cr->layers[l + 1];
    const int W = cr->world, nh = cr->plan.nHl, nkv = cr->plan.nKVl, tp = W > 1 && cr->plan.moe == SM_MOE_TP;
    const int H = cf->H, Hm = cf->Hm, QD = nh * cf->D, KD = nkv * cf->D, NQ = 2 * QD + 2 * KD, N = mono_box(nb);
    uint16_t *q = (l & 1) ? cr->qkv2 : cr->qkvg, *nq = ((l + 1) & 1) ? cr->qkv2 : cr->qkvg;
    memset(d, 0, sizeof *d);
    char *ws = (char *)M->ws;
    void *part = ws;
    uint8_t *x0 = M->xbuf, *x1 = M->xbuf + M->xbytes; /* parities 0, 1 of this rank's exchange area */
    const int np = W > 1 ? cr->plan.np : Hm, nu = W > 1 ? cr->plan.nu : H;
    /* the matmuls' stream-K split over the rank's blocks (virtual ranks: its share of the SMs) */
    sm_kernel_ctx kg = cr->kc;
    kg.num_sms = M->grid;
    int rc = W > 1 ? sm_wg_plan_mm_f32(&kg, N, cr->att, nb, QD, L->wo, H, (float *)x0, part, M->part_bytes, &d->mm[0].a, &d->mm[0].tw,
                                       &d->mm[0].tx, e)
                   : sm_wg_plan_mm(&kg, N, cr->att, nb, QD, L->wo, H, cr->a, part, M->part_bytes, &d->mm[0].a, &d->mm[0].tw, &d->mm[0].tx, e);
    if (rc ||
        sm_wg_plan_mm(&kg, N, cr->xf, nb, H, L->pooler, np, W > 1 ? (uint16_t *)x1 : cr->h1, part, M->part_bytes, &d->mm[1].a,
                      &d->mm[1].tw, &d->mm[1].tx, e) ||
        sm_wg_plan_mm(&kg, N, cr->mo, nb, Hm, L->unpooler, nu, W > 1 ? (uint16_t *)x1 : cr->f, part, M->part_bytes, &d->mm[2].a,
                      &d->mm[2].tw, &d->mm[2].tx, e) ||
        sm_wg_plan_mm(&kg, N, cr->x, nb, H, Ln->wqkvg, NQ, nq, part, M->part_bytes, &d->mm[3].a, &d->mm[3].tw, &d->mm[3].tx, e))
        return sm_errprefix(e, "layer %d", l);
    d->ctl = M->ctl;
    d->xc = M->xc;
    d->xc.np = np;
    d->xc.nu = nu;
    d->layer = l;
    d->n = nb;
    d->H = H; d->Hm = Hm; d->E = cf->E; d->K = cf->K; d->nh = nh; d->nkv = nkv; d->G = nh / nkv;
    d->eps = cf->rms_eps; d->post_eps = cf->post_eps;
    /* attention of layer l (the rank's heads): as cb_attention's graph-form call */
    d->q = q; d->gate = q + QD + 2 * KD; d->ldq = NQ;
    d->kv = L->kv; d->tables = cr->d_tab; d->max_bpr = cr->kvs.max_bpr; d->rreq = cr->d_rreq; d->pos = cr->d_pos;
    d->window = L->full ? 0 : cf->window;
    d->nsplit = sm_att_plan(&cr->kc, nb, nh, nkv, d->window, cr->kvs.max_len, &d->chunk);
    d->scale = cf->qk_scale_factor / sqrtf((float)cf->D);
    const size_t per = (size_t)nb * nh;
    if ((size_t)d->nsplit * per * 66 * 4 > M->att_bytes) return sm_errf(e, "layer %d: attention partials exceed the workspace", l);
    /* the stock tile kernel between launches (measured faster than the same item run by 4
     * teams of a 512-thread block, whose attention function spills at the launch's 128
     * registers), or on request one wave of 4 teams a block inside the launch */
    d->att_fused = M->att_fuse && (long long)sm_cdiv(nb, 64 / d->G) * nkv * d->nsplit <= 4LL * M->grid;
    d->wsO = (float *)(ws + M->part_bytes + M->rpart_bytes);
    d->wsM = d->wsO + (size_t)d->nsplit * per * 64;
    d->wsL = d->wsM + (size_t)d->nsplit * per;
    d->att = cr->att;
    /* post-attention boundary (W > 1: a = r16(attn_sum) of the parts first) */
    d->s = cr->s; d->a = cr->a; d->att_alpha = L->att_alpha; d->att_beta = L->att_beta; d->pre_ffn = L->pre_ffn_norm; d->xf = cr->xf;
    /* router (replicated): the GEMV body's split (sm_k_mm_f32w's main path) */
    d->router = L->router; d->rbias = L->router_bias;
    d->rS = sm_cdiv(H, SM_RG_KL);
    d->rnt = nb <= 8 ? 8 : 16;
    const size_t need = d->rS > 1 ? (size_t)d->rS * nb * cf->E * 4 : 0;
    if (need > cr->kc.ws_bytes || sm_cdiv(nb, d->rnt) > 65535)
        return sm_errf(e, "layer %d: the stock router takes its fallback body at %d rows", l, nb);
    if ((size_t)d->rS * nb * cf->E * 4 > M->rpart_bytes) return sm_errf(e, "layer %d: router partials exceed the workspace", l);
    d->rpart = (float *)(ws + M->part_bytes);
    d->rlog = cr->rlog;
    d->idx = cr->idx + (size_t)l * cr->cap * cf->K;
    d->w = cr->rw + (size_t)l * cr->cap * cf->K;
    d->m_o = cf->out_mult; d->route_scale = cf->route_scale;
    /* pooler norm (W > 1: h1 gathered first), experts: the rank's (EP: routes to its experts;
     * TP: every route over its I slice) */
    d->h1 = cr->h1; d->pre_expert = L->pre_expert_norm;
    d->h1_mx = L->moe.act_mx; /* cr->mws.h1_mx: the experts take h1 as rounded here */
    d->fmt = L->moe.fmt;
    d->ga = moe_group_make(&L->moe, d->idx, nb, &cr->mws);
    if (W > 1 && !tp) d->ga.e0 = cf->E / W * cr->rank;
    d->mq = moe_q_make(&L->moe, cr->h1, &cr->mws, NULL);
    d->ca = moe_combine_make(&L->moe, d->w, nb, cr->mo, &cr->mws);
    if (W > 1 && !tp) d->ca.m_f32 = (float *)x0; /* the rank's partial m, summed by XSUM_M into mo */
    if (tp) {
        d->mq.a2.y32 = (float *)x0;               /* the rank's partial y per route, summed by XSUM_Y */
        d->xc.ysum = cr->xpart;
        d->ca.y = NULL;
        d->ca.route_slot = NULL;
        d->ca.y32 = cr->xpart;
        d->ca.idx = d->idx;
        d->ca.E = L->moe.E;
    }
    /* post-FFN boundary + the next layer's input norm (W > 1: f gathered first) */
    d->f = cr->f; d->post_ffn = L->post_ffn_norm; d->ffn_alpha = L->ffn_alpha; d->ffn_beta = L->ffn_beta;
    d->next_norm = Ln->in_norm; d->x = cr->x;
    /* the next layer's qk norm / rope / kv insert */
    d->nq = nq; d->nkvc = Ln->kv; d->slot = cr->d_slot; d->nslots = (int64_t)cr->kvs.nblocks * SM_KV_BLOCK;
    d->rope = !Ln->full;
    d->tab = sm_rope_make_tab(Ln->full ? 0.0 : cf->rope_theta);
    return 0;
}

int cb_mono_init(sm_cuda_rank *cr, sm_err *e) {
    if (cr->mono_mode == SM_MONO_OFF) return 0;
    char why[1024];
    mono_static_reasons(cr, why, sizeof why);
    const sm_config *cf = &cr->cfg;
    const int G = cf->nKV > 0 ? cf->nH / cf->nKV : 0;
    int mocc = 0;
    size_t smem = 0;
    if (!why[0]) {
        smem = mono_smem_bytes(128, G, cf->Hm, cf->I, cf->E);
        for (int i = 0; i < CB_NBUCKETS; i++) {
            const size_t sb = mono_smem_bytes(mono_box(mono_buckets[i]), G, cf->Hm, cf->I, cf->E);
            if (sb > smem) smem = sb;
        }
        sm_err e2;
        mono_moe mm;
        memset(&mm, 0, sizeof mm);
        mm.q[0] = moe_q_make(&cr->layers[1].moe, cr->h1, &cr->mws, NULL);
        if (mono_moe_occupancy(mm, &mocc, &e2)) reason_add(why, sizeof why, "occupancy query failed: %s", e2.msg);
        else if (mocc < 1) reason_add(why, sizeof why, "the expert block is not resident");
    }
    if (why[0]) {
        if (cr->mono_mode == SM_MONO_ON) return sm_errf(e, "--mono on: the monokernel cannot run this model here: %s", why);
        fprintf(stderr, "sparkmono: monokernel not eligible (%s): every step runs stock\n", why);
        cr->mono_mode = SM_MONO_OFF;
        return 0;
    }
    cb_mono *M = (cb_mono *)calloc(1, sizeof *M);
    if (!M) return sm_errf(e, "monokernel: out of host memory");
    cr->mono = M;
    /* a launch's blocks: the rank's SMs (virtual ranks: its share, kc.num_sms set by the world) */
    M->grid = cr->kc.num_sms;
    M->moe_grid = cr->kc.num_sms * (mocc < 2 ? mocc : 2);
    M->smem = smem;
    const size_t R = (size_t)(cr->cap < CB_GRAPH_ROWS ? cr->cap : CB_GRAPH_ROWS);
    const int Nmax = mono_box((int)R);
    M->part_bytes = (size_t)2 * M->grid * SM_WG_BM(1) * Nmax * 4;
    M->rpart_bytes = (size_t)sm_cdiv(cf->H, SM_RG_KL) * R * cf->E * 4;
    M->att_bytes = 0;
    for (int i = 0; i < CB_NBUCKETS; i++) {
        if ((size_t)mono_buckets[i] > R) break;
        for (int w = 0; w < 2; w++) {
            const int ns = sm_att_plan(&cr->kc, mono_buckets[i], cf->nH, cf->nKV, w ? cf->window : 0, cr->kvs.max_len, NULL);
            const size_t b = (size_t)ns * mono_buckets[i] * cf->nH * 66 * 4;
            if (b > M->att_bytes) M->att_bytes = b;
        }
    }
    M->part_bytes = (M->part_bytes + 255) & ~(size_t)255;
    M->rpart_bytes = (M->rpart_bytes + 255) & ~(size_t)255;
    SM_CUDA_CHECK(cudaMalloc(&M->ws, M->part_bytes + M->rpart_bytes + M->att_bytes + 256));
    SM_CUDA_CHECK(cudaMalloc((void **)&cr->qkv2, (size_t)cr->cap * (2 * cf->nH + 2 * cf->nKV) * cf->D * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&M->ctl, sizeof(mono_ctl)));
    SM_CUDA_CHECK(cudaMallocHost((void **)&M->ctl_h, sizeof(mono_ctl)));
    memset(M->ctl_h, 0, sizeof(mono_ctl));
    const char *b = getenv("SPARKMONO_MONO_BOUND_MS");
    M->ctl_h->bound_ns = (unsigned long long)((b && atof(b) > 0 ? atof(b) : 2000.0) * 1e6);
    M->ctl_h->fault_layer = M->ctl_h->fault_phase = -1;
    const char *fa = getenv("SPARKMONO_MONO_FUSED_ATT"); /* measurement / test hook: "1" (one rank) */
    M->att_fuse = fa && !strcmp(fa, "1") && cr->world == 1;
    const char *f = getenv("SPARKMONO_MONO_FAULT"); /* test hook: "layer:phase" or "layer:phase:rank" */
    if (f) {
        int fr = -1, k = sscanf(f, "%d:%d:%d", &M->ctl_h->fault_layer, &M->ctl_h->fault_phase, &fr);
        if (k < 2) return sm_errf(e, "SPARKMONO_MONO_FAULT='%s': expected layer:phase[:rank]", f);
        if (k == 3 && fr != cr->rank) M->ctl_h->fault_layer = M->ctl_h->fault_phase = -1; /* another rank's fault */
    }
    /* W > 1: this rank's exchange area (2 parities of the largest part) and flags */
    M->xc.W = 1;
    if (cr->world > 1) {
        const size_t tpk = cr->plan.moe == SM_MOE_TP ? (size_t)cf->K : 1;
        size_t xb = R * cf->H * 4;
        if (R * cf->Hm * 4 * tpk > xb) xb = R * cf->Hm * 4 * tpk;
        M->xbytes = (xb + 255) & ~(size_t)255;
        SM_CUDA_CHECK(cudaMalloc((void **)&M->xbuf, 2 * M->xbytes));
        SM_CUDA_CHECK(cudaMalloc((void **)&M->xflag, sizeof(unsigned long long) * (size_t)cr->world));
        SM_CUDA_CHECK(cudaMemsetAsync(M->xflag, 0, sizeof(unsigned long long) * (size_t)cr->world, cr->st));
    }
    SM_CUDA_CHECK(cudaMemcpyAsync(M->ctl, M->ctl_h, sizeof(mono_ctl), cudaMemcpyHostToDevice, cr->st));
    SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    return 0;
}

void cb_mono_free(sm_cuda_rank *cr) {
    cb_mono *M = cr->mono;
    if (!M) return;
    for (int i = 0; i < CB_NBUCKETS; i++)
        free(M->desc[i]);
    if (M->ws) SM_CUDA_CHECK_PRINT(cudaFree(M->ws));
    if (M->ctl) SM_CUDA_CHECK_PRINT(cudaFree(M->ctl));
    if (M->ctl_h) SM_CUDA_CHECK_PRINT(cudaFreeHost(M->ctl_h));
    if (M->trace) SM_CUDA_CHECK_PRINT(cudaFree(M->trace));
    if (M->xbuf) SM_CUDA_CHECK_PRINT(cudaFree(M->xbuf));
    if (M->xflag) SM_CUDA_CHECK_PRINT(cudaFree(M->xflag));
    if (M->mw && cr->rank == 0) { /* rank 0 owns the joint-launch state */
        for (int q = 0; q < M->mw->W; q++) SM_CUDA_CHECK_PRINT(cudaEventDestroy(M->mw->ev[q]));
        SM_CUDA_CHECK_PRINT(cudaEventDestroy(M->mw->done));
        sm_hbar_destroy(&M->mw->bar);
        free(M->mw);
    }
    if (cr->qkv2) SM_CUDA_CHECK_PRINT(cudaFree(cr->qkv2));
    cr->qkv2 = NULL;
    free(M);
    cr->mono = NULL;
}

static int mono_bucket_index(int nb) {
    for (int i = 0; i < CB_NBUCKETS; i++)
        if (mono_buckets[i] == nb) return i;
    return -1;
}

int cb_mono_bucket(sm_cuda_rank *cr, int nb, sm_err *e) {
    cb_mono *M = cr->mono;
    const int bi = mono_bucket_index(nb);
    if (!M || cr->mono_mode == SM_MONO_OFF || bi < 0 || nb > cr->cap || M->refused[bi]) return 0;
    if (M->desc[bi]) return 1;
    const int L = cr->cfg.L;
    mono_desc *h = (mono_desc *)calloc((size_t)L, sizeof(mono_desc));
    if (!h) return sm_errf(e, "monokernel: out of host memory");
    sm_err pe;
    pe.msg[0] = 0;
    for (int l = 1; l < L - 1; l++)
        if (mono_plan_layer(cr, nb, l, &h[l], &pe)) break;
    if (pe.msg[0]) {
        free(h);
        M->refused[bi] = 1;
        if (cr->mono_mode == SM_MONO_ON) return sm_errf(e, "--mono on: %d-row steps: %s", nb, pe.msg);
        fprintf(stderr, "sparkmono: stock step (%d rows: %s)\n", nb, pe.msg);
        return 0;
    }
    mono_desc *d = h;
    M->desc[bi] = d;
    fprintf(stderr, "sparkmono: monokernel engaged: %d rows, %s S=%d%s\n", nb, nb <= 16 ? "K3" : "K5", nb,
            h[1].att_fused ? " (attention inside the launches)"
            : M->att_fuse ? " (attention between launches: more key items than teams)"
                          : " (attention between launches: the stock tile kernel)");
    return 1;
}

/* Segment g of P: phases [p0, p1) of descriptor d. */
static void mono_seg(mono_prog *P, const mono_desc &d, int p0, int p1) {
    const int g = P->nseg++;
    P->d[g] = d;
    P->p0[g] = p0;
    P->p1[g] = p1;
}

/* The start of layer l (attention .. pre-expert norm) as segment of P; the stock attention
 * kernel first (enqueued now) when the layer's attention is unfused. */
static int mono_start(sm_cuda_rank *cr, const mono_desc &d, int nb, mono_prog *P, sm_err *e) {
    if (!d.att_fused &&
        sm_k_attention(&cr->kc, d.q, d.ldq, d.gate, d.ldq, d.kv, d.tables, d.max_bpr, d.rreq, d.pos, nb, d.nh, d.nkv, d.window, d.scale,
                       d.eps, cr->kvs.max_len, cr->att, cr->st, e))
        return sm_errprefix(e, "monokernel layer %d: attention", d.layer);
    mono_seg(P, d, d.att_fused ? MP_ATT : MP_OPROJ, MP_MM1);
    return 0;
}

/* ---- W ranks ---- */

/* The monokernel off on every rank of a world, with one line saying why (--mono on on any
 * rank: an error instead, nothing freed). */
static int mono_world_off(sm_cuda_rank **rk, int W, const char *why, sm_err *e) {
    for (int r = 0; r < W; r++)
        if (rk[r]->mono_mode == SM_MONO_ON) return sm_errf(e, "--mono on: %s", why);
    for (int r = 0; r < W; r++) {
        if (rk[r]->mono && cb_enter(rk[r], e) == 0) cb_mono_free(rk[r]);
        rk[r]->mono_mode = SM_MONO_OFF;
    }
    fprintf(stderr, "sparkmono: monokernel not eligible (%s): every step runs stock\n", why);
    return 0;
}

int cb_mono_world_link(sm_cuda_rank **rk, int W, int virt, int peer, const unsigned long long *const *steps, sm_err *e) {
    int on = 0;
    for (int r = 0; r < W; r++) on += rk[r]->mono != NULL;
    if (!on) return 0;
    /* every rank takes the same path: a refusal anywhere refuses everywhere */
    char why[160];
    if (on < W) {
        snprintf(why, sizeof why, "%d of %d ranks refused it (see their lines)", W - on, W);
        return mono_world_off(rk, W, why, e);
    }
    if (!peer) return mono_world_off(rk, W, "--comm nccl: the exchanges inside the launches go through peer memory; use --comm peer", e);
    for (int r = 1; virt && r < W; r++) /* virtual ranks share one joint launch: all on one device */
        if (rk[r]->device != rk[0]->device) {
            snprintf(why, sizeof why, "virtual ranks on several devices (%d and %d): all ranks on one device or one rank a device",
                     rk[0]->device, rk[r]->device);
            return mono_world_off(rk, W, why, e);
        }
    mono_xc xc;
    memset(&xc, 0, sizeof xc);
    xc.W = W;
    xc.moe_tp = rk[0]->plan.moe == SM_MOE_TP;
    xc.bytes = rk[0]->mono->xbytes;
    for (int q = 0; q < W; q++) {
        xc.buf[q] = rk[q]->mono->xbuf;
        xc.flag[q] = rk[q]->mono->xflag;
    }
    for (int r = 0; r < W; r++) {
        rk[r]->mono->xc = xc;
        rk[r]->mono->xc.rank = r;
        rk[r]->mono->xc.step = steps[r];
    }
    if (!virt) return 0;
    mono_world *mw = (mono_world *)calloc(1, sizeof *mw);
    if (!mw) return sm_errf(e, "monokernel: out of host memory");
    mw->W = W;
    sm_hbar_init(&mw->bar, W);
    mw->bound_s = (double)rk[0]->mono->ctl_h->bound_ns / 1e9 + 1.0;
    if (cb_enter(rk[0], e)) return -1;
    for (int q = 0; q < W; q++) SM_CUDA_CHECK(cudaEventCreateWithFlags(&mw->ev[q], cudaEventDisableTiming));
    SM_CUDA_CHECK(cudaEventCreateWithFlags(&mw->done, cudaEventDisableTiming));
    for (int r = 0; r < W; r++) rk[r]->mono->mw = mw;
    return 0;
}

/* The rendezvous of the virtual ranks before / after a joint launch. */
static int mono_meet(sm_cuda_rank *cr, const char *what, sm_err *e) {
    mono_world *mw = cr->mono->mw;
    int who = -1;
    char msg[512];
    if (sm_hbar_wait(&mw->bar, cr->rank, mw->bound_s, what, &who, msg, sizeof msg)) return sm_errf(e, "monokernel: %s", msg);
    return 0;
}

/* Rank 0's part of a joint launch: the launch of every rank's program (mw->prog or mw->moe). */
static int mono_joint_dense(sm_cuda_rank *cr, mono_world *mw, sm_err *e) {
    mono_prog *J = &mw->jp;
    const mono_prog *P = mw->prog[0];
    J->nseg = 1;
    J->nrank = mw->W;
    J->p0[0] = P->p0[0];
    J->p1[0] = P->p1[0];
    for (int q = 0; q < mw->W; q++) J->d[q] = mw->prog[q]->d[0];
    return mono_launch(mw->N, *J, cr->mono->grid * mw->W, cr->mono->smem, cr->st, e);
}

static int mono_joint_moe(sm_cuda_rank *cr, mono_world *mw, sm_err *e) {
    mono_moe *J = &mw->jm;
    memset(J, 0, sizeof *J);
    J->layer = mw->moe[0]->layer;
    J->nrank = mw->W;
    for (int q = 0; q < mw->W; q++) {
        J->q[q] = mw->moe[q]->q[0];
        J->ctl[q] = mw->moe[q]->ctl[0];
        J->xc[q] = mw->moe[q]->xc[0];
    }
    return mono_moe_launch(mw->fmt, *J, cr->mono->moe_grid * mw->W, cr->st, e);
}

/* A joint launch of the virtual ranks: every rank records its work so far and meets the others;
 * rank 0 waits for all of it on its stream and runs `go`; every rank then orders its stream
 * after the launch.  A failure on rank 0 aborts the rendezvous, so no rank waits for it. */
static int mono_joint(sm_cuda_rank *cr, const char *what, int (*go)(sm_cuda_rank *, mono_world *, sm_err *), sm_err *e) {
    mono_world *mw = cr->mono->mw;
    SM_CUDA_CHECK(cudaEventRecord(mw->ev[cr->rank], cr->st));
    if (mono_meet(cr, what, e)) return -1;
    int rc = 0;
    if (cr->rank == 0) {
        for (int q = 0; q < mw->W && !rc; q++)
            if (cudaStreamWaitEvent(cr->st, mw->ev[q], 0) != cudaSuccess) rc = sm_errf(e, "monokernel: cudaStreamWaitEvent failed");
        if (!rc) rc = go(cr, mw, e);
        if (!rc && cudaEventRecord(mw->done, cr->st) != cudaSuccess) rc = sm_errf(e, "monokernel: cudaEventRecord failed");
        if (rc) sm_hbar_abort(&mw->bar, 0, e->msg);
    }
    if (mono_meet(cr, what, e)) return -1;
    if (rc) return -1;
    if (cr->rank != 0) SM_CUDA_CHECK(cudaStreamWaitEvent(cr->st, mw->done, 0));
    return 0;
}

/* A dense launch of program P (this rank's), or with virtual ranks the joint launch of every
 * rank's program. */
static int mono_go_dense(sm_cuda_rank *cr, int N, mono_prog *P, sm_err *e) {
    cb_mono *M = cr->mono;
    P->nrank = 1;
    if (!M->mw) return mono_launch(N, *P, M->grid, M->smem, cr->st, e);
    if (P->nseg != 1) return sm_errf(e, "monokernel: a joint launch of virtual ranks takes one segment");
    M->mw->prog[cr->rank] = P;
    if (cr->rank == 0) M->mw->N = N;
    return mono_joint(cr, "monokernel launch", mono_joint_dense, e);
}

/* The expert launch, as mono_go_dense. */
static int mono_go_moe(sm_cuda_rank *cr, int fmt, mono_moe *P, sm_err *e) {
    cb_mono *M = cr->mono;
    P->nrank = 1;
    if (!M->mw) return mono_moe_launch(fmt, *P, M->moe_grid, cr->st, e);
    M->mw->moe[cr->rank] = P;
    if (cr->rank == 0) M->mw->fmt = fmt;
    return mono_joint(cr, "monokernel expert launch", mono_joint_moe, e);
}

int cb_mono_layer(sm_cuda_rank *cr, int nb, int l, int prev_mono, int next_mono, sm_err *e) {
    cb_mono *M = cr->mono;
    const int bi = mono_bucket_index(nb);
    if (!M || bi < 0 || !M->desc[bi] || l < 1 || l > cr->cfg.L - 2) return sm_errf(e, "monokernel: layer %d of a %d-row step not planned", l, nb);
    const mono_desc *D = M->desc[bi];
    const mono_desc &d = D[l];
    const int N = mono_box(nb);
    mono_prog *P = &M->prog;
    /* the start of layer l, unless the previous layer's launch ran it */
    if (!(prev_mono && d.att_fused)) {
        P->nseg = 0;
        if (mono_start(cr, d, nb, P, e) || mono_go_dense(cr, N, P, e)) return sm_errprefix(e, "monokernel layer %d", l);
    }
    /* the experts */
    mono_moe *mm = &M->moe;
    memset(mm, 0, sizeof *mm);
    mm->q[0] = d.mq; mm->ctl[0] = d.ctl; mm->xc[0] = d.xc; mm->layer = l;
    if (mono_go_moe(cr, d.fmt, mm, e)) return sm_errprefix(e, "monokernel layer %d experts", l);
    /* the end of layer l (+ the start of layer l+1 when it runs mono with fused attention) */
    P->nseg = 0;
    mono_seg(P, d, d.xc.W > 1 && d.xc.moe_tp ? MP_XSUM_Y : MP_COMBINE, MP_NPHASE);
    if (next_mono && D[l + 1].att_fused) mono_seg(P, D[l + 1], D[l + 1].att_fused ? MP_ATT : MP_OPROJ, MP_MM1);
    if (mono_go_dense(cr, N, P, e)) return sm_errprefix(e, "monokernel layer %d", l);
    M->layers_run++;
    return 0;
}

int cb_mono_health_fetch(sm_cuda_rank *cr, sm_err *e) {
    if (!cr->mono) return 0;
    SM_CUDA_CHECK(cudaMemcpyAsync(cr->mono->ctl_h->health, cr->mono->ctl->health, sizeof cr->mono->ctl_h->health, cudaMemcpyDeviceToHost,
                                  cr->st));
    return 0;
}

int cb_mono_health_check(sm_cuda_rank *cr, sm_err *e) {
    cb_mono *M = cr->mono;
    if (!M || !M->ctl_h->health[0]) return 0;
    const unsigned l = M->ctl_h->health[1], p = M->ctl_h->health[2], b = M->ctl_h->health[3], peer = M->ctl_h->health[4];
    if (peer)
        sm_errf(e, "monokernel: rank %d (device %d), layer %u, %s: block %u waited past the %.0f ms bound for rank %u; the step's "
                   "results are void",
                cr->rank, cr->device, l, p < MP_N ? mono_phase_name[p] : "?", b, (double)M->ctl_h->bound_ns / 1e6, peer - 1);
    else
        sm_errf(e, "monokernel: rank %d (device %d), layer %u, phase %s: block %u waited past the %.0f ms bound at the grid barrier (a "
                   "block stopped arriving); the step's results are void",
                cr->rank, cr->device, l, p < MP_N ? mono_phase_name[p] : "?", b, (double)M->ctl_h->bound_ns / 1e6);
    /* reset the control words so later steps run again */
    memset(M->ctl_h->health, 0, sizeof M->ctl_h->health);
    mono_ctl z = *M->ctl_h;
    z.count = 0; z.gen = 0; z.abort = 0;
    *M->ctl_h = z;
    if (cudaMemcpyAsync(M->ctl, M->ctl_h, sizeof(mono_ctl), cudaMemcpyHostToDevice, cr->st) != cudaSuccess ||
        cudaStreamSynchronize(cr->st) != cudaSuccess)
        cudaGetLastError();
    return -1;
}

void cb_mono_note_eager(sm_cuda_rank *cr) {
    if (cr->mono && !cr->mono->logged_eager) {
        cr->mono->logged_eager = 1;
        fprintf(stderr, "sparkmono: stock step (a prefill row in the step)\n");
    }
}

/* ---- bench hooks ---- */

extern "C" long sm_cuda_mono_layers_run(const sm_backend *b) {
    sm_cuda_rank **rk = NULL;
    if (cb_world_ranks(b, &rk) > 0) return rk[0]->mono ? rk[0]->mono->layers_run : 0;
    sm_err e;
    sm_cuda_rank *cr = cb_from_backend(b, "mono layers", &e);
    return cr && cr->mono ? cr->mono->layers_run : 0;
}

/* The ranks of backend b (a world's, or the one rank's in *one); 0 with e when b is not CUDA. */
static int mono_ranks(const sm_backend *b, sm_cuda_rank **one, sm_cuda_rank ***rk, sm_err *e) {
    const int W = cb_world_ranks(b, rk);
    if (W > 0) return W;
    *one = cb_from_backend(b, "cuda bench", e);
    if (!*one) return 0;
    *rk = one;
    return 1;
}

extern "C" int sm_cuda_bench_set_mono(const sm_backend *b, int on, sm_err *e) {
    sm_cuda_rank *one, **rk;
    const int W = mono_ranks(b, &one, &rk, e);
    if (!W) return -1;
    for (int r = 0; r < W; r++)
        if (on && !rk[r]->mono) return sm_errf(e, "cuda bench: the monokernel is not available on this engine (see the log line)");
    for (int r = 0; r < W; r++) { /* every rank together: they must take the same path */
        sm_cuda_rank *cr = rk[r];
        if (cb_enter(cr, e)) return -1;
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
        cb_graphs_drop(cr, 0);
        cr->mono_mode = on ? SM_MONO_AUTO : SM_MONO_OFF;
    }
    return 0;
}

extern "C" int sm_cuda_bench_set_acts(const sm_backend *b, int mx, sm_err *e) {
    sm_cuda_rank *one, **rk;
    const int W = mono_ranks(b, &one, &rk, e);
    if (!W) return -1;
    int any = 0;
    for (int r = 0; r < W; r++) {
        sm_cuda_rank *cr = rk[r];
        if (cb_enter(cr, e)) return -1;
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
        for (int l = 0; l < cr->cfg.L; l++) {
            sm_cuda_moe_layer *ml = &cr->layers[l].moe;
            if (!cr->layers[l].have_moe || ml->fmt != SM_EXP_MXFP4) continue;
            if (mx && ml->I % SM_MX_BLOCK) return sm_errf(e, "cuda bench: layer %d's I slice %d cuts 32-blocks", l, ml->I);
            ml->act_mx = mx;
            any = 1;
        }
        /* the graphs and the monokernel's plans hold the experts' arguments by value */
        cb_graphs_drop(cr, 0);
        if (cr->mono)
            for (int i = 0; i < CB_NBUCKETS; i++) {
                free(cr->mono->desc[i]);
                cr->mono->desc[i] = NULL;
            }
    }
    if (mx && !any) return sm_errf(e, "cuda bench: MXFP4 activations need MXFP4 expert layers; this model has none");
    return 0;
}

/* Per-phase summary of a traced step h (tb blocks a layer): per monokernel layer 2..L-2, each
 * phase's span over all blocks (first start to last end), the attention slot (from the end of
 * the previous layer's last phase to this layer's first: the stock attention kernel, its split
 * merge and the launch boundaries) and the gaps (the layer's cycle minus the spans); the median
 * over the layers, printed with the weight phases' floors (bytes / bw). */
static void mono_trace_summary(const sm_cuda_rank *cr, const unsigned long long *h, int tb, int nrows, double bw) {
    const sm_config *cf = &cr->cfg;
    const int L = cf->L;
    float span[MP_N][MONO_TRACE_MAX], att[MONO_TRACE_MAX], gap[MONO_TRACE_MAX], cyc[MONO_TRACE_MAX];
    int nl = 0;
    unsigned long long prev_end = 0;
    for (int l = 1; l <= L - 2 && l < MONO_TRACE_MAX; l++) {
        unsigned long long s0[MP_N], s1[MP_N], first = ~0ull, last = 0;
        for (int p = 0; p < MP_N; p++) {
            s0[p] = ~0ull; s1[p] = 0;
            for (int bk = 0; bk < tb; bk++) {
                const unsigned long long *q = h + (((size_t)l * tb + bk) * MP_N + p) * 2;
                if (!q[0] || !q[1]) continue;
                if (q[0] < s0[p]) s0[p] = q[0];
                if (q[1] > s1[p]) s1[p] = q[1];
            }
            if (s1[p] && s0[p] < first) first = s0[p];
            if (s1[p] > last) last = s1[p];
        }
        if (!last) break;
        if (prev_end) { /* layers 2..: the cycle from the previous layer's end */
            float sum = 0;
            for (int p = 0; p < MP_N; p++) {
                span[p][nl] = s1[p] ? (float)((s1[p] - s0[p]) / 1e3) : 0.f;
                sum += span[p][nl];
            }
            att[nl] = first > prev_end ? (float)((first - prev_end) / 1e3) : 0.f;
            cyc[nl] = (float)((last - prev_end) / 1e3);
            gap[nl] = cyc[nl] - att[nl] - sum;
            nl++;
        }
        prev_end = last;
    }
    if (!nl) return;
    /* a phase's floor: the rank's bytes x the ranks that share its GPU (virtual ranks run their
     * phases side by side on one GPU's bandwidth) / bw */
    const int W = cr->world, share = cr->mono && cr->mono->mw ? W : 1;
    const int H = cf->H, Hm = cf->Hm, nh = cr->plan.nHl, nkv = cr->plan.nKVl, NQ = (2 * nh + 2 * nkv) * cf->D;
    const int np = W > 1 ? cr->plan.np : Hm, nu = W > 1 ? cr->plan.nu : H;
    double fb[MP_N] = {0};
    fb[MP_OPROJ] = (double)H * nh * cf->D * 2 * share;
    fb[MP_ROUTER] = (double)cf->E * H * 4 * share;
    fb[MP_POOLER] = (double)np * H * 2 * share;
    fb[MP_UNPOOL] = (double)nu * Hm * 2 * share;
    fb[MP_QKVG] = (double)NQ * H * 2 * share;
    printf("monokernel trace of one %d-row step%s: median over layers 2..%d, us (span of each phase over all blocks)\n", nrows,
           W > 1 ? " (rank 0)" : "", nl + 1);
    printf("  %-40s %9.1f   (the stock attention kernel + split merge + launch boundaries)\n", "attention slot", sm_median(att, nl));
    for (int p = 0; p < MP_N; p++) {
        const double m = sm_median(span[p], nl);  /* sorts this phase's samples only */
        if (m <= 0) continue;
        if (fb[p] > 0)
            printf("  %-40s %9.1f   floor %7.1f  %5.1f%%\n", mono_phase_name[p], m, fb[p] / bw * 1e6, 100 * fb[p] / bw * 1e6 / m);
        else
            printf("  %-40s %9.1f\n", mono_phase_name[p], m);
    }
    printf("  %-40s %9.1f   (barriers, skew, launch tails)\n", "gaps between phases", sm_median(gap, nl));
    printf("  %-40s %9.1f\n\n", "layer cycle", sm_median(cyc, nl));
    fflush(stdout);
}

extern "C" int sm_cuda_bench_trace(const sm_backend *b, const sm_step *s, const char *path, double bw, sm_err *e) {
    sm_cuda_rank *one, **rk;
    const int W = mono_ranks(b, &one, &rk, e);
    if (!W) return -1;
    int tb = 0;
    for (int r = 0; r < W; r++) {
        cb_mono *M = rk[r]->mono;
        if (!M || rk[r]->mono_mode == SM_MONO_OFF) return sm_errf(e, "cuda bench --trace: the monokernel is off on this engine");
        if ((M->moe_grid > M->grid ? M->moe_grid : M->grid) > tb) tb = M->moe_grid > M->grid ? M->moe_grid : M->grid;
    }
    const size_t nb = (size_t)MONO_TRACE_MAX * tb * MP_N * 2;
    /* every rank's trace buffer on (its blocks' timestamps; the exchange waits in their slots) */
    for (int r = 0; r < W; r++) {
        sm_cuda_rank *cr = rk[r];
        cb_mono *M = cr->mono;
        if (cb_enter(cr, e)) return -1;
        if (!M->trace) SM_CUDA_CHECK(cudaMalloc((void **)&M->trace, nb * 8));
        SM_CUDA_CHECK(cudaMemsetAsync(M->trace, 0, nb * 8, cr->st));
        M->ctl_h->trace = M->trace;
        M->ctl_h->trace_blocks = tb;
        SM_CUDA_CHECK(cudaMemcpyAsync(M->ctl, M->ctl_h, sizeof(mono_ctl), cudaMemcpyHostToDevice, cr->st));
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    }
    int rc = b->step(b->ctx, s, e);
    unsigned long long *h = NULL;
    if (!rc) {
        h = (unsigned long long *)malloc(nb * 8 * (size_t)W);
        if (!h) rc = sm_errf(e, "cuda bench --trace: out of host memory");
    }
    for (int r = 0; r < W; r++) {
        sm_cuda_rank *cr = rk[r];
        cb_mono *M = cr->mono;
        if (cb_enter(cr, e)) return -1;
        if (!rc && (cudaMemcpyAsync(h + nb * r, M->trace, nb * 8, cudaMemcpyDeviceToHost, cr->st) != cudaSuccess ||
                    cudaStreamSynchronize(cr->st) != cudaSuccess))
            rc = sm_errf(e, "cuda bench --trace: copy failed on device %d", cr->device);
        M->ctl_h->trace = NULL;
        if (cudaMemcpyAsync(&M->ctl->trace, &M->ctl_h->trace, sizeof M->trace, cudaMemcpyHostToDevice, cr->st) != cudaSuccess ||
            cudaStreamSynchronize(cr->st) != cudaSuccess)
            if (!rc) rc = sm_errf(e, "cuda bench --trace: cannot switch the trace off on device %d", cr->device);
    }
    if (rc) {
        free(h);
        return -1;
    }
    mono_trace_summary(rk[0], h, tb, s->nrows, bw);
    if (W > 1) { /* each rank's exchange waits: their share of its layer cycles (the longest block's wait per exchange) */
        printf("exchange waits inside the launches, per rank (sum over layers 2..L-2 of the longest block's wait):\n");
        for (int r = 0; r < W; r++) {
            const unsigned long long *hr = h + nb * r;
            double wsum = 0, t0 = 0, t1 = 0;
            for (int l = 2; l <= rk[r]->cfg.L - 2 && l < MONO_TRACE_MAX; l++)
                for (int bk = 0; bk < tb; bk++)
                    for (int p = 0; p < MP_N; p++) {
                        const unsigned long long *q = hr + (((size_t)l * tb + bk) * MP_N + p) * 2;
                        if (!q[0] || !q[1]) continue;
                        if (!t0 || q[0] < t0) t0 = (double)q[0];
                        if (q[1] > t1) t1 = (double)q[1];
                    }
            for (int l = 2; l <= rk[r]->cfg.L - 2 && l < MONO_TRACE_MAX; l++)
                for (int p = MP_XW0; p <= MP_XW3; p++) {
                    double m = 0;
                    for (int bk = 0; bk < tb; bk++) {
                        const unsigned long long *q = hr + (((size_t)l * tb + bk) * MP_N + p) * 2;
                        if (q[0] && q[1] && (double)(q[1] - q[0]) > m) m = (double)(q[1] - q[0]);
                    }
                    wsum += m;
                }
            printf("  rank %d: %.1f us of %.1f us (%.1f%%)\n", r, wsum / 1e3, (t1 - t0) / 1e3, t1 > t0 ? 100 * wsum / (t1 - t0) : 0.0);
        }
        printf("\n");
    }
    if (!path) {
        free(h);
        return 0;
    }
    /* Chrome / Perfetto trace: a process per rank, a track (tid) per SM block, a slice per (layer, phase) */
    unsigned long long t0 = ~0ull;
    for (size_t i = 0; i < nb * W; i++)
        if (h[i] && h[i] < t0) t0 = h[i];
    sm_outfile of;
    if (sm_outfile_open(&of, path, e)) {
        free(h);
        return sm_errprefix(e, "bench --trace");
    }
    FILE *fp = of.f;
    fprintf(fp, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < W; r++)
        for (int l = 0; l < MONO_TRACE_MAX; l++)
            for (int bk = 0; bk < tb; bk++)
                for (int p = 0; p < MP_N; p++) {
                    const unsigned long long *q = h + nb * r + (((size_t)l * tb + bk) * MP_N + p) * 2;
                    if (!q[0] || !q[1]) continue;
                    /* dense blocks: one per SM; expert-stage blocks: two per SM, shown on their SM's track */
                    const int sm_track = p >= MP_MM1 && p <= MP_MM2 ? bk / 2 : bk;
                    fprintf(fp, "%s{\"name\":\"L%d %s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", first ? "" : ",\n",
                            l, mono_phase_name[p], r, sm_track, (double)(q[0] - t0) / 1000.0, (double)(q[1] - q[0]) / 1000.0);
                    first = 0;
                }
    fprintf(fp, "\n]}\n");
    free(h);
    if (sm_outfile_commit(&of, e)) return sm_errprefix(e, "bench --trace");
    return 0;
}
