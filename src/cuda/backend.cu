/* backend.cu: the CUDA stock backend on one GPU (backend.h: sm_cuda_backend_create).
 *
 * Weights go to the device tensor by tensor straight from the mapped checkpoint (no host copy
 * of the model); q, k, v and the attention gate of a layer are stored as ONE matrix so one
 * matmul launch produces all four.  A step is: copy the step's metadata (tokens, positions,
 * slots, per-row block-table index, the block tables of its requests) with one async copy of
 * a packed pinned buffer into a fixed device buffer; enqueue embedding, the L layers (stock
 * kernels of kernels.h + the MoE stage of moe.h) and the logits; copy argmax (logits, aux)
 * back.  Verify/decode steps (<= 16 rows per request, <= 128 rows) run as CUDA graphs, one
 * per row bucket, captured the first time the bucket is seen: every kernel reads the fixed
 * metadata buffer, so a replay only needs the metadata copy.  Padding rows of a bucket get
 * slot -1 (no KV write), position 0 and a block table pointing at an extra zero page, so
 * their attention reads zeros and stays finite.  Other steps (prefill) run eagerly, in chunks
 * of `cap` rows, with the prefill attention kernel for long runs of one request and cuBLAS
 * (inside sm_k_mm) for the projections when rows are many.
 * We rejected one graph per exact row count (too many captures, each costing a few ms) and
 * re-capturing per step with new pointers (capture costs more than the step it saves).
 */
#include "backend_priv.h"
#include "common.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "synth.h"

static const int cb_bucket_rows[CB_NBUCKETS] = {8, 16, 24, 32, 48, 64, 96, 128};

#define CB_ALIGN 256
static size_t cb_al(size_t x) { return (x + CB_ALIGN - 1) / CB_ALIGN * CB_ALIGN; }

static int cb_step(void *vctx, const sm_step *s, sm_err *e);
static void cb_destroy(void *vctx);

/* ---- allocation ------------------------------------------------------------------------ */

/* Bytes of one layer's dense allocation and the offsets of its parts. */
typedef struct cb_dense_layout {
    size_t wqkvg, wo, vec, router, bias, pooler, pen, unpooler, total; /* byte offsets; total */
} cb_dense_layout;

static cb_dense_layout cb_layout(const sm_config *c) {
    cb_dense_layout d;
    size_t H = (size_t)c->H, QD = (size_t)c->nH * c->D, KD = (size_t)c->nKV * c->D;
    size_t o = 0;
    d.wqkvg = o; o += cb_al((2 * QD + 2 * KD) * H * 2);
    d.wo = o; o += cb_al(H * QD * 2);
    d.vec = o; o += 7 * cb_al(H * 4);
    d.router = o; o += cb_al((size_t)c->E * H * 4);
    d.bias = o; o += cb_al((size_t)c->E * 4);
    d.pooler = o; o += cb_al((size_t)c->Hm * H * 2);
    d.pen = o; o += cb_al((size_t)c->Hm * 4);
    d.unpooler = o; o += cb_al(H * (size_t)c->Hm * 2);
    d.total = o;
    return d;
}

int cb_layer_alloc(cb_ctx *c, cb_layer *L, sm_err *e) {
    const sm_config *cf = &c->cfg;
    cb_dense_layout d = cb_layout(cf);
    SM_CUDA_CHECK(cudaMalloc(&L->dense, d.total));
    L->dense_bytes = d.total;
    char *b = (char *)L->dense;
    size_t hv = cb_al((size_t)cf->H * 4);
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
    c->weight_bytes += (double)d.total;
    return 0;
}

int cb_glob_alloc(cb_ctx *c, sm_err *e) {
    const sm_config *cf = &c->cfg;
    size_t vh = cb_al((size_t)cf->V * cf->H * 2);
    size_t tot = 2 * vh + cb_al((size_t)cf->H * 4);
    SM_CUDA_CHECK(cudaMalloc(&c->glob, tot));
    c->embed = (uint16_t *)c->glob;
    c->lm_head = (uint16_t *)((char *)c->glob + vh);
    c->final_norm = (float *)((char *)c->glob + 2 * vh);
    c->weight_bytes += (double)tot;
    return 0;
}

void cb_ctx_destroy(cb_ctx *c) {
    if (!c) return;
    if (c->st) cudaStreamSynchronize(c->st);
    for (int b = 0; b < CB_NBUCKETS; b++)
        for (int w = 0; w < 2; w++)
            if (c->graphs[b][w].exec) cudaGraphExecDestroy(c->graphs[b][w].exec);
    if (c->layers) {
        for (int l = 0; l < c->cfg.L; l++) {
            cb_layer *L = &c->layers[l];
            if (L->have_moe) sm_cuda_moe_free(&L->moe);
            if (L->dense) cudaFree(L->dense);
            if (L->kv) cudaFree(L->kv);
        }
        free(c->layers);
    }
    if (c->glob) cudaFree(c->glob);
    if (c->act) cudaFree(c->act);
    if (c->logits) cudaFree(c->logits);
    if (c->aux) cudaFree(c->aux);
    if (c->meta_d) cudaFree(c->meta_d);
    if (c->meta_h) cudaFreeHost(c->meta_h);
    if (c->h_am) cudaFreeHost(c->h_am);
    free(c->tab_of_req);
    if (c->mws.buf) sm_cuda_moe_ws_free(&c->mws);
    if (c->st) cudaStreamDestroy(c->st);
    if (c->have_kc) sm_cuda_ctx_free(&c->kc);
    free(c);
}

/* The device: present and a Hopper (the kernels are built for sm_90a only). */
static int cb_pick_device(int *dev, sm_err *e) {
    int n = 0;
    cudaError_t r = cudaGetDeviceCount(&n);
    if (r != cudaSuccess || n == 0)
        return sm_errf(e, "cuda backend: no CUDA device available (%s)",
                       r != cudaSuccess ? cudaGetErrorString(r) : "0 devices");
    cudaDeviceProp p;
    SM_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    if (p.major != 9)
        return sm_errf(e, "cuda backend: device 0 (%s) has compute capability %d.%d; this build targets sm_90a (Hopper)",
                       p.name, p.major, p.minor);
    *dev = 0;
    return 0;
}

int cb_ctx_create(const sm_config *cfg, const sm_kv *kv, const sm_backend_opts *o, cb_ctx **out, sm_err *e) {
    *out = NULL;
    if (o && o->world > 1)
        return sm_errf(e, "cuda backend: world %d: tensor/expert parallelism is not implemented yet", o->world);
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0 || kv->max_req <= 0)
        return sm_errf(e, "cuda backend: a kv cache with pages and request slots is required");
    if (cfg->D != 64) return sm_errf(e, "cuda backend: head_dim %d: the kernels support 64 only", cfg->D);
    if (cfg->L > SM_MAX_LAYERS) return sm_errf(e, "cuda backend: %d layers, more than %d", cfg->L, SM_MAX_LAYERS);
    int dev;
    if (cb_pick_device(&dev, e)) return -1;
    cb_ctx *c = (cb_ctx *)calloc(1, sizeof *c);
    if (!c) return sm_errf(e, "cuda backend: out of host memory");
    c->cfg = *cfg;
    c->device = dev;
    c->nblocks = kv->nblocks;
    c->max_req = kv->max_req;
    c->max_len = kv->max_len;
    c->max_bpr = kv->max_bpr;
    /* rows per chunk: at least a full graph bucket; at most what the MoE stage takes
     * (max_rows * K <= 4096, moe.h); longer steps run in chunks */
    int cap = o && o->max_rows > 0 ? o->max_rows : 256;
    if (cap > 4096 / cfg->K) cap = 4096 / cfg->K;
    if (cap < CB_GRAPH_ROWS) cap = CB_GRAPH_ROWS;
    c->cap = cap;
    c->ntab = (cap < kv->max_req ? cap : kv->max_req) + 1;
    c->layers = (cb_layer *)calloc((size_t)cfg->L, sizeof(cb_layer));
    c->tab_of_req = (int *)malloc(sizeof(int) * (size_t)kv->max_req);
    if (!c->layers || !c->tab_of_req) { cb_ctx_destroy(c); return sm_errf(e, "cuda backend: out of host memory"); }
    for (int r = 0; r < kv->max_req; r++) c->tab_of_req[r] = -1;
    for (int l = 0; l < cfg->L; l++) c->layers[l].full = cfg->full[l];

    if (sm_cuda_ctx_init(&c->kc, dev, sm_cuda_ws_bytes(cfg, cap), e)) { cb_ctx_destroy(c); return sm_errprefix(e, "cuda backend"); }
    c->have_kc = 1;
#define CB_TRY(call) do { cudaError_t r_ = (call); if (r_ != cudaSuccess) { \
        sm_errf(e, "cuda backend: %s failed at %s:%d: %s", #call, __FILE__, __LINE__, cudaGetErrorString(r_)); \
        cb_ctx_destroy(c); return -1; } } while (0)
    CB_TRY(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));

    /* activations, one allocation */
    size_t R = (size_t)cap, H = (size_t)cfg->H, QD = (size_t)cfg->nH * cfg->D, KD = (size_t)cfg->nKV * cfg->D;
    size_t NQ = 2 * QD + 2 * KD, L = (size_t)cfg->L, K = (size_t)cfg->K;
    size_t off[13], o_ = 0;
    off[0] = o_; o_ += cb_al(R * H * 4);            /* s */
    off[1] = o_; o_ += cb_al(R * H * 2);            /* x */
    off[2] = o_; o_ += cb_al(R * NQ * 2);           /* qkvg */
    off[3] = o_; o_ += cb_al(R * QD * 2);           /* att */
    off[4] = o_; o_ += cb_al(R * H * 2);            /* a */
    off[5] = o_; o_ += cb_al(R * H * 2);            /* xf */
    off[6] = o_; o_ += cb_al(R * (size_t)cfg->E * 4); /* rlog */
    off[7] = o_; o_ += cb_al(L * R * K * 4);        /* idx */
    off[8] = o_; o_ += cb_al(L * R * K * 4);        /* rw */
    off[9] = o_; o_ += cb_al(R * (size_t)cfg->Hm * 2); /* h1 */
    off[10] = o_; o_ += cb_al(R * (size_t)cfg->Hm * 2); /* mo */
    off[11] = o_; o_ += cb_al(R * H * 2);           /* f */
    off[12] = o_; o_ += cb_al(R * 4);               /* am */
    CB_TRY(cudaMalloc(&c->act, o_));
    char *ab = (char *)c->act;
    c->s = (float *)(ab + off[0]);
    c->x = (uint16_t *)(ab + off[1]);
    c->qkvg = (uint16_t *)(ab + off[2]);
    c->att = (uint16_t *)(ab + off[3]);
    c->a = (uint16_t *)(ab + off[4]);
    c->xf = (uint16_t *)(ab + off[5]);
    c->rlog = (float *)(ab + off[6]);
    c->idx = (int *)(ab + off[7]);
    c->rw = (float *)(ab + off[8]);
    c->h1 = (uint16_t *)(ab + off[9]);
    c->mo = (uint16_t *)(ab + off[10]);
    c->f = (uint16_t *)(ab + off[11]);
    c->am = (int *)(ab + off[12]);
    /* routes start valid (expert 0, weight 0) so a bench read before any step is harmless */
    CB_TRY(cudaMemset(c->idx, 0, L * R * K * 4));
    CB_TRY(cudaMemset(c->rw, 0, L * R * K * 4));

    /* packed metadata: slot int64 [cap] | tok [cap] | pos [cap] | rreq [cap] | tables */
    size_t m0 = 0, m1 = m0 + cb_al(R * 8), m2 = m1 + cb_al(R * 4), m3 = m2 + cb_al(R * 4), m4 = m3 + cb_al(R * 4);
    c->off_tab = m4;
    c->meta_bytes = m4 + (size_t)c->ntab * (size_t)c->max_bpr * 4;
    CB_TRY(cudaMalloc(&c->meta_d, c->meta_bytes));
    CB_TRY(cudaMallocHost(&c->meta_h, c->meta_bytes));
    CB_TRY(cudaMallocHost((void **)&c->h_am, R * 4));
    char *mb = (char *)c->meta_d;
    c->d_slot = (int64_t *)(mb + m0);
    c->d_tok = (int *)(mb + m1);
    c->d_pos = (int *)(mb + m2);
    c->d_rreq = (int *)(mb + m3);
    c->d_tab = (int *)(mb + m4);

    /* KV pages per layer, plus the zero page nblocks */
    size_t page = (size_t)cfg->nKV * SM_KV_BLOCK * 2 * cfg->D * 2;
    for (int l = 0; l < cfg->L; l++) {
        CB_TRY(cudaMalloc(&c->layers[l].kv, page * ((size_t)c->nblocks + 1)));
        CB_TRY(cudaMemset(c->layers[l].kv, 0, page * ((size_t)c->nblocks + 1)));
    }
#undef CB_TRY
    if (sm_cuda_moe_ws_alloc(cfg, cap, &c->mws, e)) { cb_ctx_destroy(c); return sm_errprefix(e, "cuda backend"); }
    /* the memsets above ran on the legacy stream; steps run on c->st (non-blocking) */
    if (cudaDeviceSynchronize() != cudaSuccess) { cb_ctx_destroy(c); return sm_errf(e, "cuda backend: device setup failed"); }
    *out = c;
    return 0;
}

void cb_backend_fill(cb_ctx *c, sm_backend *b) {
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->ctx = c;
    b->step = cb_step;
    b->destroy = cb_destroy;
}

static void cb_destroy(void *vctx) { cb_ctx_destroy((cb_ctx *)vctx); }

cb_ctx *cb_from_backend(const sm_backend *b, sm_err *e) {
    if (!b || b->step != cb_step || !b->ctx) {
        sm_errf(e, "cuda bench: the backend is not a CUDA backend");
        return NULL;
    }
    return (cb_ctx *)b->ctx;
}

/* ---- upload from a loaded checkpoint ---------------------------------------------------- */

typedef struct cb_progress {
    double done, total;        /* bytes */
    double last;               /* time of the last line */
    int shown;                 /* a line is on stderr */
} cb_progress;

static double cb_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void cb_progress_add(cb_progress *p, double bytes) {
    p->done += bytes;
    if (p->total < 4e9) return; /* small models: silent */
    double t = cb_now();
    if (t - p->last < 1.0 && p->done < p->total) return;
    p->last = t;
    fprintf(stderr, "\rcuda backend: uploading weights %.1f / %.1f GB   ", p->done / 1e9, p->total / 1e9);
    p->shown = 1;
}

static int cb_up(void *dst, const void *src, size_t bytes, cb_progress *p, const char *what, int l, sm_err *e) {
    if (!src) return sm_errf(e, "cuda backend: layer %d: tensor %s is missing", l, what);
    cudaError_t r = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (r != cudaSuccess)
        return sm_errf(e, "cuda backend: upload of %s (layer %d, %zu bytes) failed: %s", what, l, bytes, cudaGetErrorString(r));
    cb_progress_add(p, (double)bytes);
    return 0;
}

/* Device bytes one expert of format fmt takes (weights + scales). */
static double cb_expert_bytes(const sm_config *c, int fmt) {
    double n = 3.0 * (double)c->I * (double)c->Hm;
    if (fmt == SM_EXP_MXFP4) return n / 2 + n / 32;
    if (fmt == SM_EXP_FP8) return n + 4.0 * (2.0 * c->I + c->Hm);
    return 2 * n;
}

extern "C" int sm_cuda_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b,
                                      sm_err *e) {
    memset(b, 0, sizeof *b);
    const sm_config *cf = &m->cfg;
    cb_ctx *c;
    if (cb_ctx_create(cf, kv, o, &c, e)) return -1;
    /* room check before the long upload */
    cb_dense_layout d = cb_layout(cf);
    double need = 2.0 * cf->V * cf->H * 2 + (double)d.total * cf->L;
    for (int l = 0; l < cf->L; l++) need += cb_expert_bytes(cf, m->layers[l].ex.fmt) * cf->E;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && need > (double)fr) {
        cb_ctx_destroy(c);
        return sm_errf(e, "cuda backend: the model needs %.1f GB of device memory, %.1f GB are free", need / 1e9,
                       (double)fr / 1e9);
    }
    cb_progress p = {0, need, 0, 0};
    size_t H = (size_t)cf->H, QD = (size_t)cf->nH * cf->D, KD = (size_t)cf->nKV * cf->D, Hm = (size_t)cf->Hm;
    int rc = cb_glob_alloc(c, e);
    if (!rc) rc = cb_up(c->embed, m->embed, (size_t)cf->V * H * 2, &p, "embed_tokens", -1, e);
    if (!rc) rc = cb_up(c->lm_head, m->lm_head, (size_t)cf->V * H * 2, &p, "lm_head", -1, e);
    if (!rc) rc = cb_up(c->final_norm, m->final_norm, H * 4, &p, "norm", -1, e);
    for (int l = 0; l < cf->L && !rc; l++) {
        const sm_layer *S = &m->layers[l];
        cb_layer *L = &c->layers[l];
        L->full = S->full;
        rc = cb_layer_alloc(c, L, e);
        if (!rc) rc = cb_up(L->wqkvg, S->wq, QD * H * 2, &p, "q_proj", l, e);
        if (!rc) rc = cb_up(L->wqkvg + QD * H, S->wk, KD * H * 2, &p, "k_proj", l, e);
        if (!rc) rc = cb_up(L->wqkvg + (QD + KD) * H, S->wv, KD * H * 2, &p, "v_proj", l, e);
        if (!rc) rc = cb_up(L->wqkvg + (QD + 2 * KD) * H, S->wg, QD * H * 2, &p, "gate_proj", l, e);
        if (!rc) rc = cb_up(L->wo, S->wo, H * QD * 2, &p, "o_proj", l, e);
        if (!rc) rc = cb_up(L->in_norm, S->in_norm, H * 4, &p, "input_layernorm", l, e);
        if (!rc) rc = cb_up(L->att_alpha, S->att_alpha, H * 4, &p, "post_attention_residual_gate", l, e);
        if (!rc) rc = cb_up(L->att_beta, S->att_beta, H * 4, &p, "post_attention_residual_gate", l, e);
        if (!rc) rc = cb_up(L->pre_ffn_norm, S->pre_ffn_norm, H * 4, &p, "pre_feedforward_layernorm", l, e);
        if (!rc) rc = cb_up(L->post_ffn_norm, S->post_ffn_norm, H * 4, &p, "post_feedforward_layernorm", l, e);
        if (!rc) rc = cb_up(L->ffn_alpha, S->ffn_alpha, H * 4, &p, "post_feedforward_residual_gate", l, e);
        if (!rc) rc = cb_up(L->ffn_beta, S->ffn_beta, H * 4, &p, "post_feedforward_residual_gate", l, e);
        if (!rc) rc = cb_up(L->router, S->router, (size_t)cf->E * H * 4, &p, "mlp.gate", l, e);
        if (!rc) rc = cb_up(L->router_bias, S->router_bias, (size_t)cf->E * 4, &p, "e_score_correction_bias", l, e);
        if (!rc) rc = cb_up(L->pooler, S->pooler, Hm * H * 2, &p, "pre_expert_proj", l, e);
        if (!rc) rc = cb_up(L->pre_expert_norm, S->pre_expert_norm, Hm * 4, &p, "pre_expert_norm", l, e);
        if (!rc) rc = cb_up(L->unpooler, S->unpooler, H * Hm * 2, &p, "post_expert_proj", l, e);
        if (!rc) {
            rc = sm_cuda_moe_upload(m, l, &L->moe, c->st, e);
            if (rc) sm_errprefix(e, "cuda backend: layer %d experts", l);
            else {
                L->have_moe = 1;
                c->weight_bytes += (double)L->moe.blob_bytes;
                cb_progress_add(&p, cb_expert_bytes(cf, m->layers[l].ex.fmt) * cf->E);
            }
        }
    }
    if (p.shown) fputc('\n', stderr);
    if (!rc && cudaDeviceSynchronize() != cudaSuccess) rc = sm_errf(e, "cuda backend: weight upload failed on the device");
    if (rc) { cb_ctx_destroy(c); return -1; }
    cb_backend_fill(c, b);
    return 0;
}

/* ---- one step ---------------------------------------------------------------------------- */

/* One attention call of an eager step: a run of rows through sm_k_attention (kind 0) or one
 * request's long run through sm_k_attention_prefill (kind 1). */
typedef struct cb_att_item {
    int kind;                  /* 0 generic, 1 prefill */
    int r0, cnt;               /* rows [r0, r0 + cnt) of the chunk */
    int pos0, tab;             /* prefill: first position, block-table index */
    int max_ctx;               /* generic: max position + 1 over its rows */
} cb_att_item;

/* What cb_enqueue runs. */
typedef struct cb_run {
    int n;                     /* rows (a graph bucket: padded) */
    int l0, l1;                /* layers [l0, l1) */
    int embed;                 /* run the embedding before l0 */
    int head;                  /* run the logits after l1 - 1 (l1 must be L) */
    float *logits_dev;         /* head: device logits [n, V] (n <= CB_LOGIT_ROWS), or NULL */
    float *logits_host;        /* head, eager: host logits [n, V] written in chunks, or NULL */
    int naux;                  /* aux entries */
    const int *aux;            /* [naux] layer ids */
    const cb_att_item *att;    /* [natt] eager attention plan; NULL: one generic call */
    int natt;
    int moe_only;              /* bench: only layer l0's MoE stage */
} cb_run;

static int cb_aux_copy(cb_ctx *c, const cb_run *r, int j, sm_err *e) {
    for (int a = 0; a < r->naux; a++)
        if (r->aux[a] == j)
            SM_CUDA_CHECK(cudaMemcpyAsync(c->aux + (size_t)a * c->cap * c->cfg.H, c->s,
                                          (size_t)r->n * c->cfg.H * 4, cudaMemcpyDeviceToDevice, c->st));
    return 0;
}

/* Enqueue the work of r on c->st (capturable when r->logits_host is NULL). */
static int cb_enqueue(cb_ctx *c, const cb_run *r, sm_err *e) {
    const sm_config *cf = &c->cfg;
    const int n = r->n, H = cf->H, D = cf->D, nH = cf->nH, nKV = cf->nKV, QD = nH * D, KD = nKV * D;
    const int NQ = 2 * QD + 2 * KD, K = cf->K;
    const float scale = cf->qk_scale_factor / sqrtf((float)D);
    cudaStream_t st = c->st;
    sm_cuda_ctx *kc = &c->kc;
    if (r->moe_only) {
        const cb_layer *L = &c->layers[r->l0];
        const int *idx = c->idx + (size_t)r->l0 * c->cap * K;
        const float *w = c->rw + (size_t)r->l0 * c->cap * K;
        if (sm_cuda_moe_forward(&L->moe, c->h1, idx, w, n, c->mo, &c->mws, st, e))
            return sm_errprefix(e, "cuda step: layer %d moe", r->l0);
        return 0;
    }
    if (r->embed) {
        /* s = r16(rms(embed[tok])); x = r16(rms(s, eff(input_layernorm_0))) */
        if (sm_k_embed(c->embed, cf->V, H, c->d_tok, n, c->layers[0].in_norm, cf->rms_eps, c->s, c->x, st, e))
            return sm_errprefix(e, "cuda step: embedding");
        if (cb_aux_copy(c, r, 0, e)) return -1;
    }
    for (int l = r->l0; l < r->l1; l++) {
        const cb_layer *L = &c->layers[l];
        uint16_t *q = c->qkvg, *k = q + QD, *v = k + KD, *g = v + KD;
        int *idx = c->idx + (size_t)l * c->cap * K;
        float *w = c->rw + (size_t)l * c->cap * K;
        /* q | k | v | gate = x @ Wqkvg^T */
        if (sm_k_mm(kc, c->x, n, H, L->wqkvg, NQ, c->qkvg, st, e)) return sm_errprefix(e, "cuda step: layer %d qkvg projection", l);
        /* per-head QK norm, RoPE on sliding layers, K (normed, roped) and V (raw) into the cache */
        if (sm_k_qk_rope_kv(q, NQ, k, v, NQ, n, nH, nKV, c->d_pos, c->d_slot, L->full ? 0.0 : cf->rope_theta, cf->rms_eps,
                            q, NQ, L->kv, c->nblocks, st, e))
            return sm_errprefix(e, "cuda step: layer %d qk norm / rope / kv insert", l);
        /* paged attention + output norm + sigmoid gate */
        int window = L->full ? 0 : cf->window;
        if (!r->att) {
            if (sm_k_attention(kc, q, NQ, g, NQ, L->kv, c->d_tab, c->max_bpr, c->d_rreq, c->d_pos, n, nH, nKV, window,
                               scale, cf->rms_eps, c->max_len, c->att, st, e))
                return sm_errprefix(e, "cuda step: layer %d attention", l);
        } else {
            for (int i = 0; i < r->natt; i++) {
                const cb_att_item *it = &r->att[i];
                size_t ro = (size_t)it->r0;
                int rc = it->kind == 0
                    ? sm_k_attention(kc, q + ro * NQ, NQ, g + ro * NQ, NQ, L->kv, c->d_tab, c->max_bpr, c->d_rreq + ro,
                                     c->d_pos + ro, it->cnt, nH, nKV, window, scale, cf->rms_eps, it->max_ctx,
                                     c->att + ro * QD, st, e)
                    : sm_k_attention_prefill(q + ro * NQ, NQ, g + ro * NQ, NQ, L->kv, c->d_tab + (size_t)it->tab * c->max_bpr,
                                             it->pos0, it->cnt, nH, nKV, window, scale, cf->rms_eps, c->att + ro * QD,
                                             st, e);
                if (rc) return sm_errprefix(e, "cuda step: layer %d attention (rows %d..%d)", l, it->r0, it->r0 + it->cnt - 1);
            }
        }
        /* a = mm(o, Wo) */
        if (sm_k_mm(kc, c->att, n, QD, L->wo, H, c->a, st, e)) return sm_errprefix(e, "cuda step: layer %d o_proj", l);
        /* post-attention boundary, then xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
        if (sm_k_post_attn(c->s, c->a, L->att_alpha, L->att_beta, L->pre_ffn_norm, n, H, cf->post_eps, cf->rms_eps, c->xf,
                           st, e))
            return sm_errprefix(e, "cuda step: layer %d post-attention boundary", l);
        /* router + top-K */
        if (sm_k_route(kc, c->xf, n, H, L->router, L->router_bias, cf->E, K, cf->out_mult, cf->route_scale, c->rlog, idx, w,
                       st, e))
            return sm_errprefix(e, "cuda step: layer %d router", l);
        /* h1 = r16(rms(mm(xf, Wpre), eff(pre_expert_norm))) */
        if (sm_k_mm(kc, c->xf, n, H, L->pooler, cf->Hm, c->h1, st, e)) return sm_errprefix(e, "cuda step: layer %d pooler", l);
        if (sm_k_rms_bf16(c->h1, n, cf->Hm, L->pre_expert_norm, cf->rms_eps, c->h1, st, e))
            return sm_errprefix(e, "cuda step: layer %d pre-expert norm", l);
        /* m = r16(sum_k w_k yn_k) over the routed experts */
        if (sm_cuda_moe_forward(&L->moe, c->h1, idx, w, n, c->mo, &c->mws, st, e)) return sm_errprefix(e, "cuda step: layer %d moe", l);
        /* f = mm(m, Wpost) */
        if (sm_k_mm(kc, c->mo, n, cf->Hm, L->unpooler, H, c->f, st, e)) return sm_errprefix(e, "cuda step: layer %d unpooler", l);
        /* post-FFN boundary + the next layer's input norm (the final norm after the last layer) */
        int last = l == cf->L - 1;
        const float *nw = last ? c->final_norm : c->layers[l + 1].in_norm;
        if (sm_k_post_ffn(c->s, c->f, L->post_ffn_norm, L->ffn_alpha, L->ffn_beta, nw, last, n, H, cf->post_eps, cf->rms_eps,
                          c->x, st, e))
            return sm_errprefix(e, "cuda step: layer %d post-FFN boundary", l);
        if (cb_aux_copy(c, r, l + 1, e)) return -1;
    }
    if (r->head) {
        /* logits = c * tanh(h . lm_head * m_o / c), masked; argmax */
        if (!r->logits_host) {
            if (sm_k_logits(kc, c->x, n, H, c->lm_head, cf->V, cf->vocab_used, cf->out_mult, cf->softcap, r->logits_dev,
                            c->am, st, e))
                return sm_errprefix(e, "cuda step: logits");
        } else {
            for (int c0 = 0; c0 < n; c0 += CB_LOGIT_ROWS) {
                int nc = n - c0 < CB_LOGIT_ROWS ? n - c0 : CB_LOGIT_ROWS;
                if (sm_k_logits(kc, c->x + (size_t)c0 * H, nc, H, c->lm_head, cf->V, cf->vocab_used, cf->out_mult,
                                cf->softcap, c->logits, c->am + c0, st, e))
                    return sm_errprefix(e, "cuda step: logits");
                SM_CUDA_CHECK(cudaMemcpyAsync(r->logits_host + (size_t)c0 * cf->V, c->logits, (size_t)nc * cf->V * 4,
                                              cudaMemcpyDeviceToHost, st));
            }
        }
    }
    return 0;
}

/* Check every row against the model, the cache geometry and the reserved pages. */
static int cb_check_step(const cb_ctx *c, const sm_step *s, sm_err *e) {
    const sm_config *cf = &c->cfg;
    const sm_kv *kv = s->kv;
    if (s->nrows < 0) return sm_errf(e, "cuda step: nrows %d is negative", s->nrows);
    if (s->nrows == 0) return 0;
    if (!s->tokens || !s->pos || !s->req || !kv)
        return sm_errf(e, "cuda step: tokens, pos, req and kv must all be given");
    if (kv->nblocks != c->nblocks || kv->max_bpr != c->max_bpr || kv->max_req != c->max_req)
        return sm_errf(e, "cuda step: kv cache geometry (%d pages, %d blocks/request, %d requests) differs from the "
                       "backend's (%d, %d, %d)", kv->nblocks, kv->max_bpr, kv->max_req, c->nblocks, c->max_bpr, c->max_req);
    if (s->naux < 0 || s->naux > CB_MAX_AUX || (s->naux > 0 && (!s->aux_layers || !s->aux)))
        return sm_errf(e, "cuda step: naux %d needs aux_layers and aux buffers (at most %d)", s->naux, CB_MAX_AUX);
    for (int a = 0; a < s->naux; a++)
        if (s->aux_layers[a] < 0 || s->aux_layers[a] > cf->L)
            return sm_errf(e, "cuda step: aux layer %d (entry %d) outside [0, %d]", s->aux_layers[a], a, cf->L);
    for (int i = 0; i < s->nrows; i++) {
        int t = s->tokens[i], p = s->pos[i], r = s->req[i];
        if (t < 0 || t >= cf->V) return sm_errf(e, "cuda step: row %d: token %d outside the vocabulary [0, %d)", i, t, cf->V);
        if (r < 0 || r >= kv->max_req || !kv->live[r])
            return sm_errf(e, "cuda step: row %d: request %d is not a live kv cache slot", i, r);
        if (p < 0 || p >= kv->max_len) return sm_errf(e, "cuda step: row %d: position %d outside [0, %d)", i, p, kv->max_len);
        if (p / SM_KV_BLOCK >= kv->nblk[r])
            return sm_errf(e, "cuda step: row %d: position %d of request %d has no reserved cache page", i, p, r);
        const int *tb = kv->tables + (int64_t)r * kv->max_bpr;
        for (int b = 0; b <= p / SM_KV_BLOCK; b++)
            if (tb[b] < 0 || tb[b] >= c->nblocks)
                return sm_errf(e, "cuda step: row %d: request %d block %d maps to page %d outside [0, %d)", i, r, b, tb[b],
                               c->nblocks);
    }
    return 0;
}

/* Pack rows [r0, r0 + n) of s into the pinned staging buffer, padded to nb rows; returns the
 * number of bytes to copy and fills tabidx [n] (table index of each row) when non-NULL. */
static size_t cb_pack(cb_ctx *c, const sm_step *s, int r0, int n, int nb) {
    char *h = (char *)c->meta_h;
    char *d = (char *)c->meta_d;
    int64_t *slot = (int64_t *)(h + ((char *)c->d_slot - d));
    int *tok = (int *)(h + ((char *)c->d_tok - d));
    int *pos = (int *)(h + ((char *)c->d_pos - d));
    int *rreq = (int *)(h + ((char *)c->d_rreq - d));
    int *tab = (int *)(h + c->off_tab);
    const sm_kv *kv = s->kv;
    int nt = 0;
    for (int i = 0; i < n; i++) {
        int r = s->req[r0 + i], p = s->pos[r0 + i];
        if (c->tab_of_req[r] < 0) {
            c->tab_of_req[r] = nt;
            memcpy(tab + (size_t)nt * c->max_bpr, kv->tables + (size_t)r * kv->max_bpr, sizeof(int) * (size_t)c->max_bpr);
            nt++;
        }
        tok[i] = s->tokens[r0 + i];
        pos[i] = p;
        slot[i] = sm_kv_slot(kv, r, p);
        rreq[i] = c->tab_of_req[r];
    }
    for (int i = 0; i < n; i++) c->tab_of_req[s->req[r0 + i]] = -1;
    if (nb > n) {
        /* padding rows: token 0 at position 0, no KV write, a table of zero pages */
        for (int b = 0; b < c->max_bpr; b++) tab[(size_t)nt * c->max_bpr + b] = c->nblocks;
        for (int i = n; i < nb; i++) { tok[i] = 0; pos[i] = 0; slot[i] = -1; rreq[i] = nt; }
        nt++;
    }
    return c->off_tab + (size_t)nt * c->max_bpr * 4;
}

/* Rows of s in graph form: <= 128 rows and no run of one request longer than 16 rows. */
static int cb_graphable(const sm_step *s) {
    if (s->nrows > CB_GRAPH_ROWS) return 0;
    int run = 0;
    for (int i = 0; i < s->nrows; i++) {
        run = (i > 0 && s->req[i] == s->req[i - 1]) ? run + 1 : 1;
        if (run > CB_GRAPH_REQ_ROWS) return 0;
    }
    return 1;
}

static int cb_bucket(int n) {
    for (int b = 0; b < CB_NBUCKETS; b++)
        if (n <= cb_bucket_rows[b]) return b;
    return -1;
}

/* Make room for naux aux entries and (if wanted) the logits buffer, before any capture. */
static int cb_reserve_outputs(cb_ctx *c, int naux, int want_logits, sm_err *e) {
    if (naux > c->aux_cap) {
        SM_CUDA_CHECK(cudaStreamSynchronize(c->st));
        /* graphs that copy aux hold the old pointer: drop them */
        for (int b = 0; b < CB_NBUCKETS; b++)
            for (int w = 0; w < 2; w++)
                if (c->graphs[b][w].exec && c->graphs[b][w].naux > 0) {
                    cudaGraphExecDestroy(c->graphs[b][w].exec);
                    c->graphs[b][w].exec = NULL;
                }
        if (c->aux) cudaFree(c->aux);
        c->aux = NULL;
        c->aux_cap = 0;
        SM_CUDA_CHECK(cudaMalloc(&c->aux, (size_t)naux * c->cap * c->cfg.H * 4));
        c->aux_cap = naux;
    }
    if (want_logits && !c->logits)
        SM_CUDA_CHECK(cudaMalloc(&c->logits, (size_t)CB_LOGIT_ROWS * c->cfg.V * 4));
    return 0;
}

/* Capture run r (on the metadata buffer) as a graph. */
static int cb_capture(cb_ctx *c, const cb_run *r, cudaGraphExec_t *out, sm_err *e) {
    *out = NULL;
    SM_CUDA_CHECK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeRelaxed));
    int rc = cb_enqueue(c, r, e);
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamEndCapture(c->st, &g);
    if (rc) { if (g) cudaGraphDestroy(g); return sm_errprefix(e, "cuda graph capture (%d rows)", r->n); }
    if (ce != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return sm_errf(e, "cuda graph capture (%d rows): cudaStreamEndCapture: %s", r->n, cudaGetErrorString(ce));
    }
    ce = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        *out = NULL;
        return sm_errf(e, "cuda graph capture (%d rows): cudaGraphInstantiate: %s", r->n, cudaGetErrorString(ce));
    }
    return 0;
}

static int cb_same_aux(const cb_graph *g, const sm_step *s) {
    if (g->naux != s->naux) return 0;
    for (int a = 0; a < s->naux; a++)
        if (g->aux[a] != s->aux_layers[a]) return 0;
    return 1;
}

/* Enqueue a graph-form step (metadata copy + graph replay, capturing on first use).  *fresh
 * is set when this call captured (the step then ran eagerly once before the capture). */
static int cb_launch_graph(cb_ctx *c, const sm_step *s, size_t bytes, int nb, int *fresh, sm_err *e) {
    int bi = cb_bucket(nb), wl = s->logits != NULL;
    cb_graph *G = &c->graphs[bi][wl];
    *fresh = 0;
    if (G->exec && !cb_same_aux(G, s)) {
        SM_CUDA_CHECK(cudaStreamSynchronize(c->st));
        cudaGraphExecDestroy(G->exec);
        G->exec = NULL;
    }
    SM_CUDA_CHECK(cudaMemcpyAsync(c->meta_d, c->meta_h, bytes, cudaMemcpyHostToDevice, c->st));
    if (G->exec) {
        SM_CUDA_CHECK(cudaGraphLaunch(G->exec, c->st));
        return 0;
    }
    cb_run r;
    memset(&r, 0, sizeof r);
    r.n = nb;
    r.l0 = 0;
    r.l1 = c->cfg.L;
    r.embed = 1;
    r.head = 1;
    r.logits_dev = wl ? c->logits : NULL;
    r.naux = s->naux;
    r.aux = s->aux_layers;
    /* first use: run eagerly (warms every launcher up), then capture for the next steps */
    if (cb_enqueue(c, &r, e)) return -1;
    if (cb_capture(c, &r, &G->exec, e)) return -1;
    G->naux = s->naux;
    for (int a = 0; a < s->naux; a++) G->aux[a] = s->aux_layers[a];
    *fresh = 1;
    return 0;
}

/* Attention plan of rows [r0, r0 + n) of s: long runs of one request -> prefill kernel,
 * the rows between them -> generic calls. */
static int cb_plan(cb_ctx *c, const sm_step *s, int r0, int n, cb_att_item *att) {
    int na = 0, i = 0;
    (void)c;
    while (i < n) {
        int j = i + 1;
        while (j < n && s->req[r0 + j] == s->req[r0 + i] && s->pos[r0 + j] == s->pos[r0 + j - 1] + 1) j++;
        if (j - i > CB_GRAPH_REQ_ROWS) {
            cb_att_item *it = &att[na++];
            it->kind = 1;
            it->r0 = i;
            it->cnt = j - i;
            it->pos0 = s->pos[r0 + i];
            it->tab = -1; /* filled below from the packed rreq */
            it->max_ctx = 0;
        } else {
            int mx = 0;
            for (int t = i; t < j; t++) if (s->pos[r0 + t] + 1 > mx) mx = s->pos[r0 + t] + 1;
            if (na > 0 && att[na - 1].kind == 0 && att[na - 1].r0 + att[na - 1].cnt == i) {
                att[na - 1].cnt += j - i;
                if (mx > att[na - 1].max_ctx) att[na - 1].max_ctx = mx;
            } else {
                cb_att_item *it = &att[na++];
                it->kind = 0;
                it->r0 = i;
                it->cnt = j - i;
                it->pos0 = 0;
                it->tab = -1;
                it->max_ctx = mx;
            }
        }
        i = j;
    }
    return na;
}

/* Enqueue rows [r0, r0 + n) of s eagerly (metadata copy included). */
static int cb_launch_eager(cb_ctx *c, const sm_step *s, int r0, int n, cb_att_item *att, sm_err *e) {
    size_t bytes = cb_pack(c, s, r0, n, n);
    int na = cb_plan(c, s, r0, n, att);
    const int *rreq_h = (const int *)((char *)c->meta_h + ((char *)c->d_rreq - (char *)c->meta_d));
    for (int i = 0; i < na; i++)
        if (att[i].kind == 1) att[i].tab = rreq_h[att[i].r0];
    SM_CUDA_CHECK(cudaMemcpyAsync(c->meta_d, c->meta_h, bytes, cudaMemcpyHostToDevice, c->st));
    cb_run r;
    memset(&r, 0, sizeof r);
    r.n = n;
    r.l0 = 0;
    r.l1 = c->cfg.L;
    r.embed = 1;
    r.head = 1;
    r.logits_host = s->logits ? s->logits + (size_t)r0 * c->cfg.V : NULL;
    r.naux = s->naux;
    r.aux = s->aux_layers;
    r.att = att;
    r.natt = na;
    return cb_enqueue(c, &r, e);
}

/* Copy argmax (and aux, and graph logits) of rows [r0, r0 + n) back and wait for the step. */
static int cb_collect(cb_ctx *c, const sm_step *s, int r0, int n, int graph_logits, sm_err *e) {
    const sm_config *cf = &c->cfg;
    SM_CUDA_CHECK(cudaMemcpyAsync(c->h_am, c->am, (size_t)n * 4, cudaMemcpyDeviceToHost, c->st));
    if (graph_logits)
        SM_CUDA_CHECK(cudaMemcpyAsync(s->logits + (size_t)r0 * cf->V, c->logits, (size_t)n * cf->V * 4,
                                      cudaMemcpyDeviceToHost, c->st));
    for (int a = 0; a < s->naux; a++)
        SM_CUDA_CHECK(cudaMemcpyAsync(s->aux + ((size_t)a * s->nrows + r0) * cf->H, c->aux + (size_t)a * c->cap * cf->H,
                                      (size_t)n * cf->H * 4, cudaMemcpyDeviceToHost, c->st));
    cudaError_t r = cudaStreamSynchronize(c->st);
    if (r != cudaSuccess) return sm_errf(e, "cuda step: the step failed on the device: %s", cudaGetErrorString(r));
    if (s->argmax) memcpy(s->argmax + r0, c->h_am, (size_t)n * 4);
    return 0;
}

static int cb_step(void *vctx, const sm_step *s, sm_err *e) {
    cb_ctx *c = (cb_ctx *)vctx;
    if (cb_check_step(c, s, e)) return -1;
    int n = s->nrows;
    if (n == 0) return 0;
    if (cb_reserve_outputs(c, s->naux, s->logits != NULL, e)) return -1;
    if (cb_graphable(s)) {
        int nb = cb_bucket_rows[cb_bucket(n)], fresh;
        size_t bytes = cb_pack(c, s, 0, n, nb);
        if (cb_launch_graph(c, s, bytes, nb, &fresh, e)) { cudaStreamSynchronize(c->st); return -1; }
        c->last_nb = nb;
        c->last_graph = 1;
        return cb_collect(c, s, 0, n, s->logits != NULL, e);
    }
    cb_att_item *att = (cb_att_item *)malloc(sizeof(cb_att_item) * (size_t)c->cap);
    if (!att) return sm_errf(e, "cuda step: out of host memory");
    for (int r0 = 0; r0 < n; r0 += c->cap) {
        int nc = n - r0 < c->cap ? n - r0 : c->cap;
        if (cb_launch_eager(c, s, r0, nc, att, e) || cb_collect(c, s, r0, nc, 0, e)) {
            cudaStreamSynchronize(c->st);
            free(att);
            return -1;
        }
        c->last_nb = nc;
        c->last_graph = 0;
    }
    free(att);
    return 0;
}

/* ---- bench hooks (synth.h) ---------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static float cb_median(float *v, int n) {
    qsort(v, (size_t)n, sizeof(float), cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

extern "C" int sm_cuda_bench_steps(const sm_backend *b, const sm_step *sets, int nsets, int warmup, int iters, float *ms,
                                   int *graphed, sm_err *e) {
    cb_ctx *c = cb_from_backend(b, e);
    if (!c) return -1;
    if (nsets < 1 || iters < 1) return sm_errf(e, "cuda bench: need at least one input set and one iteration");
    for (int i = 0; i < nsets; i++) {
        if (sets[i].logits || sets[i].naux) return sm_errf(e, "cuda bench: timed steps take no logits and no aux");
        if (sets[i].nrows != sets[0].nrows) return sm_errf(e, "cuda bench: every input set must have the same rows");
        if (!cb_graphable(&sets[i]) || sets[i].nrows > c->cap)
            return sm_errf(e, "cuda bench: step of %d rows is not a graph-form verify step (<= %d rows, <= %d a request)",
                           sets[i].nrows, CB_GRAPH_ROWS, CB_GRAPH_REQ_ROWS);
        /* first run of each set: checks, captures the bucket's graph */
        if (b->step(b->ctx, &sets[i], e)) return -1;
    }
    if (graphed) *graphed = 1;
    cudaEvent_t e0, e1;
    SM_CUDA_CHECK(cudaEventCreate(&e0));
    SM_CUDA_CHECK(cudaEventCreate(&e1));
    int n = sets[0].nrows, nb = cb_bucket_rows[cb_bucket(n)], rc = 0;
    for (int it = 0; it < warmup + iters && !rc; it++) {
        const sm_step *s = &sets[it % nsets];
        size_t bytes = cb_pack(c, s, 0, n, nb);
        int fresh = 0;
        /* timed: metadata copy + graph replay */
        if (cudaEventRecord(e0, c->st) != cudaSuccess) { rc = sm_errf(e, "cuda bench: cudaEventRecord failed"); break; }
        if (cb_launch_graph(c, s, bytes, nb, &fresh, e)) { rc = -1; break; }
        if (cudaEventRecord(e1, c->st) != cudaSuccess) { rc = sm_errf(e, "cuda bench: cudaEventRecord failed"); break; }
        cudaError_t r = cudaEventSynchronize(e1);
        if (r != cudaSuccess) { rc = sm_errf(e, "cuda bench: step failed on the device: %s", cudaGetErrorString(r)); break; }
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= warmup) ms[it - warmup] = t;
    }
    cudaStreamSynchronize(c->st);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    c->last_nb = nb;
    c->last_graph = 1;
    return rc;
}

extern "C" int sm_cuda_bench_routing(const sm_backend *b, int n, int *idx, sm_err *e) {
    cb_ctx *c = cb_from_backend(b, e);
    if (!c) return -1;
    if (n < 1 || n > c->cap) return sm_errf(e, "cuda bench: routing of %d rows (capacity %d)", n, c->cap);
    size_t K = (size_t)c->cfg.K;
    for (int l = 0; l < c->cfg.L; l++)
        SM_CUDA_CHECK(cudaMemcpy(idx + (size_t)l * n * K, c->idx + (size_t)l * c->cap * K, (size_t)n * K * 4,
                                 cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int sm_cuda_bench_layer_info(const sm_backend *b, int *fmt, double *expert_bytes, sm_err *e) {
    cb_ctx *c = cb_from_backend(b, e);
    if (!c) return -1;
    for (int l = 0; l < c->cfg.L; l++) {
        fmt[l] = c->layers[l].moe.fmt;
        const sm_cuda_moe_layer *M = &c->layers[l].moe;
        expert_bytes[l] = M->touched_bytes ? (double)M->touched_bytes
                        : M->expert_bytes ? (double)M->expert_bytes
                        : M->E > 0 ? (double)M->blob_bytes / M->E : 0.0;
    }
    return 0;
}

/* Median microseconds of `iters` replays of exec. */
static int cb_time_graph(cb_ctx *c, cudaGraphExec_t exec, int iters, float *us, sm_err *e) {
    float *v = (float *)malloc(sizeof(float) * (size_t)iters);
    if (!v) return sm_errf(e, "cuda bench: out of host memory");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int rc = 0;
    for (int it = -2; it < iters && !rc; it++) { /* two warm-up replays */
        cudaEventRecord(e0, c->st);
        cudaError_t r = cudaGraphLaunch(exec, c->st);
        cudaEventRecord(e1, c->st);
        if (r == cudaSuccess) r = cudaEventSynchronize(e1);
        if (r != cudaSuccess) { rc = sm_errf(e, "cuda bench: graph replay failed: %s", cudaGetErrorString(r)); break; }
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= 0) v[it] = t * 1000.0f;
    }
    if (!rc) *us = cb_median(v, iters);
    free(v);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}

extern "C" int sm_cuda_bench_layers(const sm_backend *b, const sm_step *s, int iters, float *layer_us, float *moe_us,
                                    float *head_us, sm_err *e) {
    cb_ctx *c = cb_from_backend(b, e);
    if (!c) return -1;
    if (s->logits || s->naux) return sm_errf(e, "cuda bench: timed steps take no logits and no aux");
    if (!cb_graphable(s)) return sm_errf(e, "cuda bench: per-layer timing needs a graph-form verify step");
    if (iters < 1) return sm_errf(e, "cuda bench: iters %d", iters);
    /* one real step leaves its metadata and activations on the device */
    if (b->step(b->ctx, s, e)) return -1;
    int nb = c->last_nb;
    for (int l = -1; l < c->cfg.L; l++) {
        for (int part = 0; part < 2; part++) {
            if (l < 0 && part) continue;
            cb_run r;
            memset(&r, 0, sizeof r);
            r.n = nb;
            if (l < 0) { r.embed = 1; r.head = 1; r.l0 = r.l1 = c->cfg.L; } /* embedding + logits alone */
            else { r.l0 = l; r.l1 = l + 1; r.moe_only = part; }
            cudaGraphExec_t ex;
            if (cb_capture(c, &r, &ex, e)) return -1;
            float us = 0;
            int rc = cb_time_graph(c, ex, iters, &us, e);
            cudaGraphExecDestroy(ex);
            if (rc) return -1;
            if (l < 0) *head_us = us;
            else if (part) moe_us[l] = us;
            else layer_us[l] = us;
        }
    }
    return 0;
}

/* Compare a device tensor with its host copy; 0 when bit-identical. */
static int cb_cmp(const void *dev, const void *host, size_t bytes, const char *what, int l, sm_err *e) {
    if (!host) return sm_errf(e, "dense check: layer %d: %s missing in the model", l, what);
    unsigned char *h = (unsigned char *)malloc(bytes);
    if (!h) return sm_errf(e, "dense check: out of host memory");
    cudaError_t r = cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost);
    if (r != cudaSuccess) { free(h); return sm_errf(e, "dense check: download of %s failed: %s", what, cudaGetErrorString(r)); }
    const unsigned char *g = (const unsigned char *)host;
    size_t i = 0;
    while (i < bytes && h[i] == g[i]) i++;
    free(h);
    if (i < bytes) return sm_errf(e, "dense check: layer %d: %s differs from the model at byte %zu of %zu", l, what, i, bytes);
    return 0;
}

extern "C" int sm_cuda_backend_check_dense(const sm_backend *b, const sm_model *m, sm_err *e) {
    cb_ctx *c = cb_from_backend(b, e);
    if (!c) return -1;
    const sm_config *cf = &c->cfg;
    if (cf->L != m->cfg.L || cf->H != m->cfg.H || cf->V != m->cfg.V || cf->Hm != m->cfg.Hm || cf->E != m->cfg.E)
        return sm_errf(e, "dense check: the backend and the model have different configurations");
    size_t H = (size_t)cf->H, QD = (size_t)cf->nH * cf->D, KD = (size_t)cf->nKV * cf->D, Hm = (size_t)cf->Hm;
    if (cb_cmp(c->embed, m->embed, (size_t)cf->V * H * 2, "embed_tokens", -1, e) ||
        cb_cmp(c->lm_head, m->lm_head, (size_t)cf->V * H * 2, "lm_head", -1, e) ||
        cb_cmp(c->final_norm, m->final_norm, H * 4, "norm", -1, e))
        return -1;
    for (int l = 0; l < cf->L; l++) {
        const sm_layer *S = &m->layers[l];
        const cb_layer *L = &c->layers[l];
        if (cb_cmp(L->wqkvg, S->wq, QD * H * 2, "q_proj", l, e) || cb_cmp(L->wqkvg + QD * H, S->wk, KD * H * 2, "k_proj", l, e) ||
            cb_cmp(L->wqkvg + (QD + KD) * H, S->wv, KD * H * 2, "v_proj", l, e) ||
            cb_cmp(L->wqkvg + (QD + 2 * KD) * H, S->wg, QD * H * 2, "gate_proj", l, e) ||
            cb_cmp(L->wo, S->wo, H * QD * 2, "o_proj", l, e) || cb_cmp(L->in_norm, S->in_norm, H * 4, "input_layernorm", l, e) ||
            cb_cmp(L->att_alpha, S->att_alpha, H * 4, "att_alpha", l, e) || cb_cmp(L->att_beta, S->att_beta, H * 4, "att_beta", l, e) ||
            cb_cmp(L->pre_ffn_norm, S->pre_ffn_norm, H * 4, "pre_feedforward_layernorm", l, e) ||
            cb_cmp(L->post_ffn_norm, S->post_ffn_norm, H * 4, "post_feedforward_layernorm", l, e) ||
            cb_cmp(L->ffn_alpha, S->ffn_alpha, H * 4, "ffn_alpha", l, e) || cb_cmp(L->ffn_beta, S->ffn_beta, H * 4, "ffn_beta", l, e) ||
            cb_cmp(L->router, S->router, (size_t)cf->E * H * 4, "mlp.gate", l, e) ||
            cb_cmp(L->router_bias, S->router_bias, (size_t)cf->E * 4, "e_score_correction_bias", l, e) ||
            cb_cmp(L->pooler, S->pooler, Hm * H * 2, "pre_expert_proj", l, e) ||
            cb_cmp(L->pre_expert_norm, S->pre_expert_norm, Hm * 4, "pre_expert_norm", l, e) ||
            cb_cmp(L->unpooler, S->unpooler, H * Hm * 2, "post_expert_proj", l, e))
            return -1;
    }
    return 0;
}
