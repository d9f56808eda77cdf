/* mono/build.cu: the monokernel as an executor (exec.h) on one rank's view: static eligibility
 * when it is made, the per-bucket descriptors, the launches of a run of layers, the health
 * words after a step, the ranks' agreement with W > 1, and its timeline (the trace hooks the
 * bench drives).
 *
 * A bucket's descriptors (one per layer 1..L-2) are planned the first time the bucket runs,
 * before its graph is captured, from the rank's fixed buffers: the same calls the stock
 * layers make (sm_wg_plan_mm, sm_att_plan, moe_*_make), so the descriptors hold the stock
 * decomposition.  They are written once and never while a graph runs; a mode change drops
 * the graphs.  Static refusals are collected, all of them, into one line; --mono on turns
 * them into an engine-creation error, auto into one log line and stock steps.
 * We rejected planning per step (a graph replay must not depend on host work) and a single
 * descriptor rewritten per layer (a graph holds all layers' launches at once).
 */
#include "cuda/mono/mono.cuh"
#include "cuda/exec/exec.h"
#include "cuda/mono/mono.h"
extern "C" {
#include "parallel/hbar.h"
}
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The monokernel state of one rank. */
typedef struct mono_rank {
    const sm_exec_view *v;      /* the rank's weights, buffers, KV cache and stream */
    mono_ctl *ctl;              /* device control words */
    mono_ctl *ctl_h;            /* pinned host copy (health words after a step) */
    void *ws;                   /* device: wgmma partial tiles | router partials | attention partials */
    size_t part_bytes, rpart_bytes, att_bytes;
    mono_desc *desc[SM_EXEC_NBUCKETS]; /* host [L] per bucket (layers 1..L-2 filled), NULL: not built */
    int refused[SM_EXEC_NBUCKETS]; /* 1: the bucket's plan failed (its steps run stock) */
    int grid;                   /* blocks of a dense launch: one per SM */
    int moe_grid;               /* blocks of an expert launch: 2 per SM (the stock expert grid) */
    size_t smem;                /* dynamic shared memory of a launch */
    unsigned long long *trace;  /* device trace buffer (bench), NULL */
    mono_prog prog;             /* launch scratch (a launch copies it into its parameters) */
    mono_moe moe;               /* expert launch scratch */
    int att_fuse;               /* 1: attention inside the launch where one wave of teams holds it
                                   (SPARKMONO_MONO_FUSED_ATT=1); 0: the stock tile kernel between
                                   launches, measured faster (bench/results.md, 2026-12-03 night) */
    /* W > 1 (docs/parallelism.md section 7) */
    uint8_t *xbuf;              /* device: this rank's exchange area, 2 parities of xbytes */
    size_t xbytes;
    unsigned long long *xflag;  /* device [W]: the epochs the ranks published to this one */
    mono_xc xc;                 /* every rank's areas and flags (mono_world_link) */
    struct mono_world *mw;      /* virtual ranks: the joint launches (NULL: one rank a device) */
} mono_rank;

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

/* Every static refusal of the rank, into buf ("" = eligible). */
static void mono_static_reasons(const sm_exec_view *v, char *buf, size_t cap) {
    int fmt[SM_MAX_LAYERS];
    for (int l = 0; l < v->cfg->L; l++) fmt[l] = v->layers[l].have_moe ? v->layers[l].moe.fmt : -1;
    mono_reasons(v->cfg, fmt, v->device, v->world, buf, cap);
}

extern "C" int sm_cuda_mono_check(const sm_config *cf, const int *fmt, int device, char *buf, size_t cap, sm_err *e) {
    if (sm_cuda_device_check(device, 0, "monokernel check", e)) return -1;
    SM_CUDA_CHECK(cudaSetDevice(device));
    mono_reasons(cf, fmt, device, 1, buf, cap);
    return 0;
}

/* Descriptor of layer l for bucket rows nb (host copy): the rank's slices and, with W > 1, its
 * exchanges (the producing phases write into the rank's exchange area, the stock layers'
 * collectives at the same points). */
static int mono_plan_layer(mono_rank *M, int nb, int l, mono_desc *d, sm_err *e) {
    const sm_exec_view *v = M->v;
    const sm_config *cf = v->cfg;
    const sm_exec_layer *L = &v->layers[l], *Ln = &v->layers[l + 1];
    const int W = v->world, nh = v->plan->nHl, nkv = v->plan->nKVl, tp = W > 1 && v->plan->moe == SM_MOE_TP;
    const int H = cf->H, Hm = cf->Hm, QD = nh * cf->D, KD = nkv * cf->D, NQ = 2 * QD + 2 * KD, N = mono_box(nb);
    uint16_t *q = v->qkv[l & 1], *nq = v->qkv[(l + 1) & 1];
    memset(d, 0, sizeof *d);
    char *ws = (char *)M->ws;
    void *part = ws;
    uint8_t *x0 = M->xbuf, *x1 = M->xbuf + M->xbytes; /* parities 0, 1 of this rank's exchange area */
    const int np = W > 1 ? v->plan->np : Hm, nu = W > 1 ? v->plan->nu : H;
    /* the matmuls' stream-K split over the rank's blocks (virtual ranks: its share of the SMs) */
    sm_kernel_ctx kg = *v->kc;
    kg.num_sms = M->grid;
    int rc = W > 1 ? sm_wg_plan_mm_f32(&kg, N, v->att, nb, QD, L->wo, H, (float *)x0, part, M->part_bytes, &d->mm[0].a, &d->mm[0].tw,
                                       &d->mm[0].tx, e)
                   : sm_wg_plan_mm(&kg, N, v->att, nb, QD, L->wo, H, v->a, part, M->part_bytes, &d->mm[0].a, &d->mm[0].tw, &d->mm[0].tx, e);
    if (rc ||
        sm_wg_plan_mm(&kg, N, v->xf, nb, H, L->pooler, np, W > 1 ? (uint16_t *)x1 : v->h1, part, M->part_bytes, &d->mm[1].a,
                      &d->mm[1].tw, &d->mm[1].tx, e) ||
        sm_wg_plan_mm(&kg, N, v->mo, nb, Hm, L->unpooler, nu, W > 1 ? (uint16_t *)x1 : v->f, part, M->part_bytes, &d->mm[2].a,
                      &d->mm[2].tw, &d->mm[2].tx, e) ||
        sm_wg_plan_mm(&kg, N, v->x, nb, H, Ln->wqkvg, NQ, nq, part, M->part_bytes, &d->mm[3].a, &d->mm[3].tw, &d->mm[3].tx, e))
        return sm_errprefix(e, "layer %d", l);
    d->ctl = M->ctl;
    d->xc = M->xc;
    d->xc.np = np;
    d->xc.nu = nu;
    d->layer = l;
    d->n = nb;
    d->H = H; d->Hm = Hm; d->E = cf->E; d->K = cf->K; d->nh = nh; d->nkv = nkv; d->G = nh / nkv;
    d->eps = cf->rms_eps; d->post_eps = cf->post_eps;
    /* attention of layer l (the rank's heads): as the stock layers' graph-form call */
    d->q = q; d->gate = q + QD + 2 * KD; d->ldq = NQ;
    d->kv = L->kv; d->tables = v->tab; d->max_bpr = v->kvs->max_bpr; d->rreq = v->rreq; d->pos = v->pos;
    d->window = L->full ? 0 : cf->window;
    d->nsplit = sm_att_plan(v->kc, nb, nh, nkv, d->window, v->kvs->max_len, &d->chunk);
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
    d->att = v->att;
    /* post-attention boundary (W > 1: a = r16(attn_sum) of the parts first) */
    d->s = v->s; d->a = v->a; d->att_alpha = L->att_alpha; d->att_beta = L->att_beta; d->pre_ffn = L->pre_ffn_norm; d->xf = v->xf;
    /* router (replicated): the GEMV body's split (sm_k_mm_f32w's main path) */
    d->router = L->router; d->rbias = L->router_bias;
    d->rS = sm_cdiv(H, SM_RG_KL);
    d->rnt = nb <= 8 ? 8 : 16;
    const size_t need = d->rS > 1 ? (size_t)d->rS * nb * cf->E * 4 : 0;
    if (need > v->kc->ws_bytes || sm_cdiv(nb, d->rnt) > 65535)
        return sm_errf(e, "layer %d: the stock router takes its fallback body at %d rows", l, nb);
    if ((size_t)d->rS * nb * cf->E * 4 > M->rpart_bytes) return sm_errf(e, "layer %d: router partials exceed the workspace", l);
    d->rpart = (float *)(ws + M->part_bytes);
    d->rlog = v->rlog;
    d->idx = v->idx + (size_t)l * v->cap * cf->K;
    d->w = v->rw + (size_t)l * v->cap * cf->K;
    d->m_o = cf->out_mult; d->route_scale = cf->route_scale;
    /* pooler norm (W > 1: h1 gathered first), experts: the rank's (EP: routes to its experts;
     * TP: every route over its I slice) */
    d->h1 = v->h1; d->pre_expert = L->pre_expert_norm;
    d->h1_mx = L->moe.act_mx; /* mws->h1_mx: the experts take h1 as rounded here */
    d->fmt = sm_cuda_moe_kfmt(&L->moe); /* the kernel format: W4A4 may run on the FP8 tensor cores */
    d->ga = moe_group_make(&L->moe, d->idx, nb, v->mws);
    if (W > 1 && !tp) d->ga.e0 = cf->E / W * v->rank;
    d->mq = moe_q_make(&L->moe, v->h1, nb, v->mws, NULL);
    sm_cuda_moe_h1_img(&L->moe, v->mws, &d->h1img.codes, &d->h1img.fac, &d->h1img.kp);
    if (d->fmt == MOE_F_MX8 && !d->h1img.codes) /* the expert phase copies the image the norm writes */
        return sm_errf(e, "monokernel layer %d: W4A4 on the FP8 tensor cores needs a workspace whose h1 comes rounded (h1_mx)", l);
    d->ca = moe_combine_make(&L->moe, d->w, nb, v->mo, v->mws);
    if (W > 1 && !tp) d->ca.m_f32 = (float *)x0; /* the rank's partial m, summed by XSUM_M into mo */
    if (tp) {
        d->mq.a2.y32 = (float *)x0;               /* the rank's partial y per route, summed by XSUM_Y */
        d->xc.ysum = v->xpart;
        d->ca.y = NULL;
        d->ca.route_slot = NULL;
        d->ca.y32 = v->xpart;
        d->ca.idx = d->idx;
        d->ca.E = L->moe.E;
    }
    /* post-FFN boundary + the next layer's input norm (W > 1: f gathered first) */
    d->f = v->f; d->post_ffn = L->post_ffn_norm; d->ffn_alpha = L->ffn_alpha; d->ffn_beta = L->ffn_beta;
    d->next_norm = Ln->in_norm; d->x = v->x;
    /* the next layer's qk norm / rope / kv insert */
    d->nq = nq; d->nkvc = Ln->kv; d->slot = v->slot; d->nslots = (int64_t)v->kvs->nblocks * SM_KV_BLOCK;
    d->rope = !Ln->full;
    d->tab = sm_rope_make_tab(Ln->full ? 0.0 : cf->rope_theta);
    return 0;
}

/* The state of the rank of view v into *out (NULL when refused: strict, an error; else one
 * line); on error *out may hold what was made. */
static int mono_init(const sm_exec_view *v, int strict, mono_rank **out, sm_err *e) {
    *out = NULL;
    char why[1024];
    mono_static_reasons(v, why, sizeof why);
    const sm_config *cf = v->cfg;
    const int G = cf->nKV > 0 ? cf->nH / cf->nKV : 0;
    int mocc = 0;
    size_t smem = 0;
    if (!why[0]) {
        smem = mono_smem_bytes(128, G, cf->Hm, cf->I, cf->E);
        for (int i = 0; i < SM_EXEC_NBUCKETS; i++) {
            const size_t sb = mono_smem_bytes(mono_box(sm_exec_bucket_rows(i)), G, cf->Hm, cf->I, cf->E);
            if (sb > smem) smem = sb;
        }
        sm_err e2;
        mono_moe mm;
        memset(&mm, 0, sizeof mm);
        mm.q[0] = moe_q_make(&v->layers[1].moe, v->h1, 0, v->mws, NULL); /* (rows: no matter to the occupancy) */
        if (mono_moe_occupancy(mm, &mocc, &e2)) reason_add(why, sizeof why, "occupancy query failed: %s", e2.msg);
        else if (mocc < 1) reason_add(why, sizeof why, "the expert block is not resident");
    }
    if (why[0]) {
        if (strict) return sm_errf(e, "--mono on: the monokernel cannot run this model here: %s", why);
        fprintf(stderr, "sparkmono: monokernel not eligible (%s): every step runs stock\n", why);
        return 0;
    }
    mono_rank *M = (mono_rank *)calloc(1, sizeof *M);
    if (!M) return sm_errf(e, "monokernel: out of host memory");
    *out = M;
    M->v = v;
    /* a launch's blocks: the rank's SMs (virtual ranks: its share, kc.num_sms set by the world) */
    M->grid = v->kc->num_sms;
    M->moe_grid = v->kc->num_sms * (mocc < 2 ? mocc : 2);
    M->smem = smem;
    const size_t R = (size_t)(v->cap < SM_EXEC_MAX_ROWS ? v->cap : SM_EXEC_MAX_ROWS);
    const int Nmax = mono_box((int)R);
    M->part_bytes = (size_t)2 * M->grid * SM_WG_BM(1) * Nmax * 4;
    M->rpart_bytes = (size_t)sm_cdiv(cf->H, SM_RG_KL) * R * cf->E * 4;
    M->att_bytes = 0;
    for (int i = 0; i < SM_EXEC_NBUCKETS; i++) {
        const int nb = sm_exec_bucket_rows(i);
        if ((size_t)nb > R) break;
        for (int w = 0; w < 2; w++) {
            const int ns = sm_att_plan(v->kc, nb, cf->nH, cf->nKV, w ? cf->window : 0, v->kvs->max_len, NULL);
            const size_t b = (size_t)ns * nb * cf->nH * 66 * 4;
            if (b > M->att_bytes) M->att_bytes = b;
        }
    }
    M->part_bytes = (M->part_bytes + 255) & ~(size_t)255;
    M->rpart_bytes = (M->rpart_bytes + 255) & ~(size_t)255;
    SM_CUDA_CHECK(cudaMalloc(&M->ws, M->part_bytes + M->rpart_bytes + M->att_bytes + 256));
    SM_CUDA_CHECK(cudaMalloc((void **)&M->ctl, sizeof(mono_ctl)));
    SM_CUDA_CHECK(cudaMallocHost((void **)&M->ctl_h, sizeof(mono_ctl)));
    memset(M->ctl_h, 0, sizeof(mono_ctl));
    const char *b = getenv("SPARKMONO_MONO_BOUND_MS");
    M->ctl_h->bound_ns = (unsigned long long)((b && atof(b) > 0 ? atof(b) : 2000.0) * 1e6);
    M->ctl_h->fault_layer = M->ctl_h->fault_phase = -1;
    const char *fa = getenv("SPARKMONO_MONO_FUSED_ATT"); /* measurement / test hook: "1" (one rank) */
    M->att_fuse = fa && !strcmp(fa, "1") && v->world == 1;
    const char *f = getenv("SPARKMONO_MONO_FAULT"); /* test hook: "layer:phase" or "layer:phase:rank" */
    if (f) {
        int fr = -1, k = sscanf(f, "%d:%d:%d", &M->ctl_h->fault_layer, &M->ctl_h->fault_phase, &fr);
        if (k < 2) return sm_errf(e, "SPARKMONO_MONO_FAULT='%s': expected layer:phase[:rank]", f);
        if (k == 3 && fr != v->rank) M->ctl_h->fault_layer = M->ctl_h->fault_phase = -1; /* another rank's fault */
    }
    /* W > 1: this rank's exchange area (2 parities of the largest part) and flags */
    M->xc.W = 1;
    if (v->world > 1) {
        const size_t tpk = v->plan->moe == SM_MOE_TP ? (size_t)cf->K : 1;
        size_t xb = R * cf->H * 4;
        if (R * cf->Hm * 4 * tpk > xb) xb = R * cf->Hm * 4 * tpk;
        M->xbytes = (xb + 255) & ~(size_t)255;
        SM_CUDA_CHECK(cudaMalloc((void **)&M->xbuf, 2 * M->xbytes));
        SM_CUDA_CHECK(cudaMalloc((void **)&M->xflag, sizeof(unsigned long long) * (size_t)v->world));
        SM_CUDA_CHECK(cudaMemsetAsync(M->xflag, 0, sizeof(unsigned long long) * (size_t)v->world, v->st));
    }
    SM_CUDA_CHECK(cudaMemcpyAsync(M->ctl, M->ctl_h, sizeof(mono_ctl), cudaMemcpyHostToDevice, v->st));
    SM_CUDA_CHECK(cudaStreamSynchronize(v->st));
    return 0;
}

static void mono_free(void *ctx) {
    mono_rank *M = (mono_rank *)ctx;
    if (!M) return;
    for (int i = 0; i < SM_EXEC_NBUCKETS; i++)
        free(M->desc[i]);
    if (M->ws) SM_CUDA_CHECK_PRINT(cudaFree(M->ws));
    if (M->ctl) SM_CUDA_CHECK_PRINT(cudaFree(M->ctl));
    if (M->ctl_h) SM_CUDA_CHECK_PRINT(cudaFreeHost(M->ctl_h));
    if (M->trace) SM_CUDA_CHECK_PRINT(cudaFree(M->trace));
    if (M->xbuf) SM_CUDA_CHECK_PRINT(cudaFree(M->xbuf));
    if (M->xflag) SM_CUDA_CHECK_PRINT(cudaFree(M->xflag));
    if (M->mw && M->v->rank == 0) { /* rank 0 owns the joint-launch state */
        for (int q = 0; q < M->mw->W; q++) SM_CUDA_CHECK_PRINT(cudaEventDestroy(M->mw->ev[q]));
        SM_CUDA_CHECK_PRINT(cudaEventDestroy(M->mw->done));
        sm_hbar_destroy(&M->mw->bar);
        free(M->mw);
    }
    free(M);
}

static int mono_bucket_index(int nb) {
    for (int i = 0; i < SM_EXEC_NBUCKETS; i++)
        if (sm_exec_bucket_rows(i) == nb) return i;
    return -1;
}

static int mono_plan(void *ctx, int nb, int strict, sm_err *e) {
    mono_rank *M = (mono_rank *)ctx;
    const sm_exec_view *v = M->v;
    const int bi = mono_bucket_index(nb);
    if (bi < 0 || nb > v->cap || M->refused[bi]) return 0;
    if (M->desc[bi]) return 1;
    const int L = v->cfg->L;
    mono_desc *h = (mono_desc *)calloc((size_t)L, sizeof(mono_desc));
    if (!h) return sm_errf(e, "monokernel: out of host memory");
    sm_err pe;
    pe.msg[0] = 0;
    for (int l = 1; l < L - 1; l++)
        if (mono_plan_layer(M, nb, l, &h[l], &pe)) break;
    if (pe.msg[0]) {
        free(h);
        M->refused[bi] = 1;
        if (strict) return sm_errf(e, "--mono on: %d-row steps: %s", nb, pe.msg);
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
static int mono_start(mono_rank *M, const mono_desc &d, int nb, mono_prog *P, sm_err *e) {
    const sm_exec_view *v = M->v;
    if (!d.att_fused &&
        sm_k_attention(v->kc, d.q, d.ldq, d.gate, d.ldq, d.kv, d.tables, d.max_bpr, d.rreq, d.pos, nb, d.nh, d.nkv, d.window, d.scale,
                       d.eps, v->kvs->max_len, v->att, v->st, e))
        return sm_errprefix(e, "monokernel layer %d: attention", d.layer);
    mono_seg(P, d, d.att_fused ? MP_ATT : MP_OPROJ, MP_MM1);
    return 0;
}

/* ---- W ranks ---- */

/* The monokernel off on every rank of a world, with one line saying why (strict, --mono on on
 * any rank: an error instead); the caller frees every rank's state. */
static int mono_world_off(const char *why, int strict, sm_err *e) {
    if (strict) return sm_errf(e, "--mono on: %s", why);
    fprintf(stderr, "sparkmono: monokernel not eligible (%s): every step runs stock\n", why);
    return 0;
}

static int mono_world_link(void *const *ctx, int W, const sm_exec_world *w, int strict, sm_err *e) {
    mono_rank *const *rk = (mono_rank *const *)ctx;
    int on = 0;
    for (int r = 0; r < W; r++) on += rk[r] != NULL;
    /* every rank takes the same path: a refusal anywhere refuses everywhere */
    char why[160];
    if (on < W) {
        snprintf(why, sizeof why, "%d of %d ranks refused it (see their lines)", W - on, W);
        return mono_world_off(why, strict, e);
    }
    if (!w->peer) return mono_world_off("--comm nccl: the exchanges inside the launches go through peer memory; use --comm peer", strict, e);
    for (int r = 1; w->virt && r < W; r++) /* virtual ranks share one joint launch: all on one device */
        if (rk[r]->v->device != rk[0]->v->device) {
            snprintf(why, sizeof why, "virtual ranks on several devices (%d and %d): all ranks on one device or one rank a device",
                     rk[0]->v->device, rk[r]->v->device);
            return mono_world_off(why, strict, e);
        }
    mono_xc xc;
    memset(&xc, 0, sizeof xc);
    xc.W = W;
    xc.moe_tp = rk[0]->v->plan->moe == SM_MOE_TP;
    xc.bytes = rk[0]->xbytes;
    for (int q = 0; q < W; q++) {
        xc.buf[q] = rk[q]->xbuf;
        xc.flag[q] = rk[q]->xflag;
    }
    for (int r = 0; r < W; r++) {
        rk[r]->xc = xc;
        rk[r]->xc.rank = r;
        rk[r]->xc.step = w->steps[r];
    }
    if (!w->virt) return 1;
    mono_world *mw = (mono_world *)calloc(1, sizeof *mw);
    if (!mw) return sm_errf(e, "monokernel: out of host memory");
    mw->W = W;
    sm_hbar_init(&mw->bar, W);
    mw->bound_s = (double)rk[0]->ctl_h->bound_ns / 1e9 + 1.0;
    SM_CUDA_CHECK(cudaSetDevice(rk[0]->v->device));
    for (int q = 0; q < W; q++) SM_CUDA_CHECK(cudaEventCreateWithFlags(&mw->ev[q], cudaEventDisableTiming));
    SM_CUDA_CHECK(cudaEventCreateWithFlags(&mw->done, cudaEventDisableTiming));
    for (int r = 0; r < W; r++) rk[r]->mw = mw;
    return 1;
}

/* The rendezvous of the virtual ranks before / after a joint launch. */
static int mono_meet(mono_rank *M, const char *what, sm_err *e) {
    mono_world *mw = M->mw;
    int who = -1;
    char msg[512];
    if (sm_hbar_wait(&mw->bar, M->v->rank, mw->bound_s, what, &who, msg, sizeof msg)) return sm_errf(e, "monokernel: %s", msg);
    return 0;
}

/* Rank 0's part of a joint launch: the launch of every rank's program (mw->prog or mw->moe). */
static int mono_joint_dense(mono_rank *M, mono_world *mw, sm_err *e) {
    mono_prog *J = &mw->jp;
    const mono_prog *P = mw->prog[0];
    J->nseg = 1;
    J->nrank = mw->W;
    J->p0[0] = P->p0[0];
    J->p1[0] = P->p1[0];
    for (int q = 0; q < mw->W; q++) J->d[q] = mw->prog[q]->d[0];
    return mono_launch(mw->N, *J, M->grid * mw->W, M->smem, M->v->st, e);
}

static int mono_joint_moe(mono_rank *M, mono_world *mw, sm_err *e) {
    mono_moe *J = &mw->jm;
    memset(J, 0, sizeof *J);
    J->layer = mw->moe[0]->layer;
    J->nrank = mw->W;
    for (int q = 0; q < mw->W; q++) {
        J->q[q] = mw->moe[q]->q[0];
        J->ctl[q] = mw->moe[q]->ctl[0];
        J->xc[q] = mw->moe[q]->xc[0];
    }
    return mono_moe_launch(mw->fmt, *J, M->moe_grid * mw->W, M->v->st, e);
}

/* A joint launch of the virtual ranks: every rank records its work so far and meets the others;
 * rank 0 waits for all of it on its stream and runs `go`; every rank then orders its stream
 * after the launch.  A failure on rank 0 aborts the rendezvous, so no rank waits for it. */
static int mono_joint(mono_rank *M, const char *what, int (*go)(mono_rank *, mono_world *, sm_err *), sm_err *e) {
    const sm_exec_view *v = M->v;
    mono_world *mw = M->mw;
    SM_CUDA_CHECK(cudaEventRecord(mw->ev[v->rank], v->st));
    if (mono_meet(M, what, e)) return -1;
    int rc = 0;
    if (v->rank == 0) {
        for (int q = 0; q < mw->W && !rc; q++)
            if (cudaStreamWaitEvent(v->st, mw->ev[q], 0) != cudaSuccess) rc = sm_errf(e, "monokernel: cudaStreamWaitEvent failed");
        if (!rc) rc = go(M, mw, e);
        if (!rc && cudaEventRecord(mw->done, v->st) != cudaSuccess) rc = sm_errf(e, "monokernel: cudaEventRecord failed");
        if (rc) sm_hbar_abort(&mw->bar, 0, e->msg);
    }
    if (mono_meet(M, what, e)) return -1;
    if (rc) return -1;
    if (v->rank != 0) SM_CUDA_CHECK(cudaStreamWaitEvent(v->st, mw->done, 0));
    return 0;
}

/* A dense launch of program P (this rank's), or with virtual ranks the joint launch of every
 * rank's program. */
static int mono_go_dense(mono_rank *M, int N, mono_prog *P, sm_err *e) {
    const sm_exec_view *v = M->v;
    P->nrank = 1;
    if (!M->mw) return mono_launch(N, *P, M->grid, M->smem, v->st, e);
    if (P->nseg != 1) return sm_errf(e, "monokernel: a joint launch of virtual ranks takes one segment");
    M->mw->prog[v->rank] = P;
    if (v->rank == 0) M->mw->N = N;
    return mono_joint(M, "monokernel launch", mono_joint_dense, e);
}

/* The expert launch, as mono_go_dense. */
static int mono_go_moe(mono_rank *M, int fmt, mono_moe *P, sm_err *e) {
    const sm_exec_view *v = M->v;
    P->nrank = 1;
    if (!M->mw) return mono_moe_launch(fmt, *P, M->moe_grid, v->st, e);
    M->mw->moe[v->rank] = P;
    if (v->rank == 0) M->mw->fmt = fmt;
    return mono_joint(M, "monokernel expert launch", mono_joint_moe, e);
}

/* Enqueue layer l's launches (1 <= l <= L-2) for a planned bucket nb: its start (attention ..
 * pre-expert norm) unless prev_mono (the layer before ran here in this run and its last launch
 * ran this start), the experts, and its end (unpooler .. the next layer's projections), merged
 * with the next layer's start when next_mono. */
static int mono_layer(mono_rank *M, int nb, int l, int prev_mono, int next_mono, sm_err *e) {
    const int bi = mono_bucket_index(nb);
    if (bi < 0 || !M->desc[bi] || l < 1 || l > M->v->cfg->L - 2) return sm_errf(e, "monokernel: layer %d of a %d-row step not planned", l, nb);
    const mono_desc *D = M->desc[bi];
    const mono_desc &d = D[l];
    const int N = mono_box(nb);
    mono_prog *P = &M->prog;
    /* the start of layer l, unless the previous layer's launch ran it */
    if (!(prev_mono && d.att_fused)) {
        P->nseg = 0;
        if (mono_start(M, d, nb, P, e) || mono_go_dense(M, N, P, e)) return sm_errprefix(e, "monokernel layer %d", l);
    }
    /* the experts */
    mono_moe *mm = &M->moe;
    memset(mm, 0, sizeof *mm);
    mm->q[0] = d.mq; mm->ctl[0] = d.ctl; mm->xc[0] = d.xc; mm->layer = l;
    if (mono_go_moe(M, d.fmt, mm, e)) return sm_errprefix(e, "monokernel layer %d experts", l);
    /* the end of layer l (+ the start of layer l+1 when it runs mono with fused attention) */
    P->nseg = 0;
    mono_seg(P, d, d.xc.W > 1 && d.xc.moe_tp ? MP_XSUM_Y : MP_COMBINE, MP_NPHASE);
    if (next_mono && D[l + 1].att_fused) mono_seg(P, D[l + 1], D[l + 1].att_fused ? MP_ATT : MP_OPROJ, MP_MM1);
    if (mono_go_dense(M, N, P, e)) return sm_errprefix(e, "monokernel layer %d", l);
    return 0;
}

/* Layers [a, b): each starts from its projections (made before this run, or by the launch
 * before it) and ends with the next layer's, whatever the flags say. */
static int mono_layers(void *ctx, const sm_exec_run *r, int a, int b, unsigned flags, sm_err *e) {
    (void)flags;
    for (int l = a; l < b; l++)
        if (mono_layer((mono_rank *)ctx, r->n, l, l > a, l + 1 < b, e)) return -1;
    return 0;
}

static int mono_health_fetch(void *ctx, sm_err *e) {
    mono_rank *M = (mono_rank *)ctx;
    SM_CUDA_CHECK(cudaMemcpyAsync(M->ctl_h->health, M->ctl->health, sizeof M->ctl_h->health, cudaMemcpyDeviceToHost,
                                  M->v->st));
    return 0;
}

static int mono_health_check(void *ctx, sm_err *e) {
    mono_rank *M = (mono_rank *)ctx;
    const sm_exec_view *v = M->v;
    if (!M->ctl_h->health[0]) return 0;
    const unsigned l = M->ctl_h->health[1], p = M->ctl_h->health[2], b = M->ctl_h->health[3], peer = M->ctl_h->health[4];
    if (peer)
        sm_errf(e, "monokernel: rank %d (device %d), layer %u, %s: block %u waited past the %.0f ms bound for rank %u; the step's "
                   "results are void",
                v->rank, v->device, l, p < MP_N ? mono_phase_name[p] : "?", b, (double)M->ctl_h->bound_ns / 1e6, peer - 1);
    else
        sm_errf(e, "monokernel: rank %d (device %d), layer %u, phase %s: block %u waited past the %.0f ms bound at the grid barrier (a "
                   "block stopped arriving); the step's results are void",
                v->rank, v->device, l, p < MP_N ? mono_phase_name[p] : "?", b, (double)M->ctl_h->bound_ns / 1e6);
    /* reset the control words so later steps run again */
    memset(M->ctl_h->health, 0, sizeof M->ctl_h->health);
    mono_ctl z = *M->ctl_h;
    z.count = 0; z.gen = 0; z.abort = 0;
    *M->ctl_h = z;
    if (cudaMemcpyAsync(M->ctl, M->ctl_h, sizeof(mono_ctl), cudaMemcpyHostToDevice, v->st) != cudaSuccess ||
        cudaStreamSynchronize(v->st) != cudaSuccess)
        cudaGetLastError();
    return -1;
}

/* The layers' arguments changed (a bench's activations): every bucket planned again. */
static void mono_forget(void *ctx) {
    mono_rank *M = (mono_rank *)ctx;
    for (int i = 0; i < SM_EXEC_NBUCKETS; i++) {
        free(M->desc[i]);
        M->desc[i] = NULL;
    }
}

/* ---- the timeline (the bench's trace hooks) ---- */

static_assert(MP_N <= SM_EXEC_TRACE_PHASES, "the monokernel's phases fit a timeline");

/* Per layer, per block, per phase (MP_*) its start and end; a weight phase's floor is the
 * rank's bytes times the ranks that share its GPU (virtual ranks run their phases side by side
 * on one GPU's bandwidth). */
static void mono_trace_fmt(void *ctx, sm_exec_trace *t) {
    const mono_rank *M = (const mono_rank *)ctx;
    const sm_exec_view *v = M->v;
    const sm_config *cf = v->cfg;
    memset(t, 0, sizeof *t);
    t->what = "monokernel";
    t->layers = MONO_TRACE_MAX;
    t->phases = MP_N;
    t->name = mono_phase_name;
    const int W = v->world, share = M->mw ? W : 1;
    const int H = cf->H, Hm = cf->Hm, nh = v->plan->nHl, nkv = v->plan->nKVl, NQ = (2 * nh + 2 * nkv) * cf->D;
    const int np = W > 1 ? v->plan->np : Hm, nu = W > 1 ? v->plan->nu : H;
    t->floor[MP_OPROJ] = (double)H * nh * cf->D * 2 * share;
    t->floor[MP_ROUTER] = (double)cf->E * H * 4 * share;
    t->floor[MP_POOLER] = (double)np * H * 2 * share;
    t->floor[MP_UNPOOL] = (double)nu * Hm * 2 * share;
    t->floor[MP_QKVG] = (double)NQ * H * 2 * share;
    for (int p = MP_MM1; p <= MP_MM2; p++) t->pair[p] = 1; /* the expert blocks: two an SM */
    for (int p = MP_XW0; p <= MP_XW3; p++) t->wait[p] = 1;
    t->nested[MP_ROUTER] = 1 + MP_POST_ATT; /* the router's GEMV items, stamped inside the post-attention phase */
    t->nested[MP_TOPK] = 1 + MP_POOLER; /* the routing warps' split sum and top-K, stamped inside the pooler */
    t->lead = "attention slot";
    t->lead_note = "(the stock attention kernel + split merge + launch boundaries)";
    /* the layer phases (exec.h) its phases make up; the exchange waits count in the gaps */
    static const unsigned char part[MP_NPHASE] = {
        SM_LP_ATTENTION, SM_LP_ATTENTION, SM_LP_OPROJ, SM_LP_POST_ATTN, SM_LP_NONE, SM_LP_NONE, SM_LP_POOLER,
        SM_LP_PRE_NORM, SM_LP_EXPERTS, SM_LP_EXPERTS, SM_LP_EXPERT_SUM, SM_LP_COMBINE, SM_LP_COMBINE, SM_LP_EXPERT_SUM,
        SM_LP_UNPOOLER, SM_LP_POST_FFN, SM_LP_QKVG, SM_LP_ROPE_KV};
    memcpy(t->part, part, sizeof part);
    t->lead_part = SM_LP_ATTENTION;
}

/* A layer's timeline holds the larger grid's blocks (the expert launch: two an SM). */
static int mono_trace_blocks(void *ctx) {
    const mono_rank *M = (const mono_rank *)ctx;
    return M->moe_grid > M->grid ? M->moe_grid : M->grid;
}

static int mono_trace_on(void *ctx, int blocks, sm_err *e) {
    mono_rank *M = (mono_rank *)ctx;
    const size_t nb = (size_t)MONO_TRACE_MAX * blocks * MP_N * 2;
    if (!M->trace) SM_CUDA_CHECK(cudaMalloc((void **)&M->trace, nb * 8));
    SM_CUDA_CHECK(cudaMemsetAsync(M->trace, 0, nb * 8, M->v->st));
    M->ctl_h->trace = M->trace;
    M->ctl_h->trace_blocks = blocks;
    SM_CUDA_CHECK(cudaMemcpyAsync(M->ctl, M->ctl_h, sizeof(mono_ctl), cudaMemcpyHostToDevice, M->v->st));
    SM_CUDA_CHECK(cudaStreamSynchronize(M->v->st));
    return 0;
}

static int mono_trace_off(void *ctx, unsigned long long *host, sm_err *e) {
    mono_rank *M = (mono_rank *)ctx;
    const sm_exec_view *v = M->v;
    const size_t nb = (size_t)MONO_TRACE_MAX * M->ctl_h->trace_blocks * MP_N * 2;
    int rc = 0;
    if (host && (cudaMemcpyAsync(host, M->trace, nb * 8, cudaMemcpyDeviceToHost, v->st) != cudaSuccess ||
                 cudaStreamSynchronize(v->st) != cudaSuccess))
        rc = sm_errf(e, "copy failed on device %d", v->device);
    M->ctl_h->trace = NULL;
    if (cudaMemcpyAsync(&M->ctl->trace, &M->ctl_h->trace, sizeof M->trace, cudaMemcpyHostToDevice, v->st) != cudaSuccess ||
        cudaStreamSynchronize(v->st) != cudaSuccess)
        if (!rc) rc = sm_errf(e, "cannot switch the trace off on device %d", v->device);
    return rc;
}

int sm_exec_mono_create(const sm_exec_view *v, int strict, sm_exec *x, sm_err *e) {
    memset(x, 0, sizeof *x);
    x->name = "monokernel";
    x->lo = 1; /* layer 0 and layer L-1 keep BF16 experts in the quantized export: stock */
    x->hi = v->cfg->L - 1;
    x->qkv_in = 1;
    x->qkv_out = 1;
    x->qkv_alt = 1;
    x->plan = mono_plan;
    x->layers = mono_layers;
    x->health_fetch = mono_health_fetch;
    x->health_check = mono_health_check;
    x->forget = mono_forget;
    x->world_link = mono_world_link;
    x->trace_fmt = mono_trace_fmt;
    x->trace_blocks = mono_trace_blocks;
    x->trace_on = mono_trace_on;
    x->trace_off = mono_trace_off;
    x->free = mono_free;
    mono_rank *M = NULL;
    const int rc = mono_init(v, strict, &M, e);
    x->ctx = M;
    return rc;
}
