/* stock/layer.cu: the stock executor (exec.h): decoder layers as per-op kernels (ops/ops.h),
 * the MoE stage of moe.h and, with W > 1, the cross-rank exchanges of comm/gcomm.h at the CPU
 * world's points (docs/model.md sections 3-6, docs/parallelism.md section 2).
 *
 * It runs any layer of any step, eager or captured: nothing here synchronizes, allocates or
 * reads device data on the host, and every pointer comes from the rank's view, so a capture
 * bakes in addresses that stay valid for the rank's life.  The eager form differs only in the
 * attention plan (per-run calls, the prefill kernel for long runs of one request); graph form
 * is one generic call.  Its only state is the view.  We rejected a layer loop per form (eager
 * and graph): they would drift apart.
 */
#include "cuda/exec/exec.h"
#include "cuda/comm/gcomm.h"
#include "cuda/common.cuh"
#include <math.h>
#include <string.h>

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
static int st_layer_qkv(const sm_exec_view *v, const sm_exec_run *r, int l, uint16_t *q, sm_err *e) {
    const sm_config *cf = v->cfg;
    const sm_exec_layer *L = &v->layers[l];
    const int n = r->n, H = cf->H, QD = v->plan->nHl * cf->D, KD = v->plan->nKVl * cf->D, NQ = 2 * QD + 2 * KD;
    uint16_t *k = q + QD, *vv = k + KD;
    if (sm_k_mm(v->kc, v->x, n, H, L->wqkvg, NQ, q, v->st, e)) return sm_errprefix(e, "cuda step: layer %d qkvg projection", l);
    if (sm_k_qk_rope_kv(q, NQ, k, vv, NQ, n, v->plan->nHl, v->plan->nKVl, v->pos, v->slot, L->full ? 0.0 : cf->rope_theta, cf->rms_eps,
                        q, NQ, L->kv, v->kvs->nblocks, v->st, e))
        return sm_errprefix(e, "cuda step: layer %d qk norm / rope / kv insert", l);
    return 0;
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
static int st_layer_rest(const sm_exec_view *v, const sm_exec_run *r, int l, uint16_t *q, sm_err *e) {
    const sm_config *cf = v->cfg;
    const sm_exec_layer *L = &v->layers[l];
    const int n = r->n, H = cf->H, QD = v->plan->nHl * cf->D, KD = v->plan->nKVl * cf->D, K = cf->K;
    cudaStream_t st = v->st;
    sm_kernel_ctx *kc = v->kc;
    uint16_t *g = q + QD + 2 * KD;
    int *idx = v->idx + (size_t)l * v->cap * K;
    float *w = v->rw + (size_t)l * v->cap * K;
    /* paged attention + output norm + sigmoid gate */
    if (st_attention(v, r, l, q, g, e)) return -1;
    /* a = mm(o, Wo); world > 1: a = r16(attn_sum(o Wo[:, my heads]^T in f32)) */
    if (v->gc) {
        if (sm_k_mm_f32(kc, v->att, n, QD, L->wo, H, v->apart, st, e) ||
            sm_gcomm_sum_bf16(v->gc, SM_GC_ATTN, l, v->apart, (size_t)n * H, v->a, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d o_proj", v->rank, l);
    } else if (sm_k_mm(kc, v->att, n, QD, L->wo, H, v->a, st, e))
        return sm_errprefix(e, "cuda step: layer %d o_proj", l);
    /* post-attention boundary, then xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
    if (sm_k_post_attn(v->s, v->a, L->att_alpha, L->att_beta, L->pre_ffn_norm, n, H, cf->post_eps, cf->rms_eps, v->xf, st, e))
        return sm_errprefix(e, "cuda step: layer %d post-attention boundary", l);
    /* router + top-K */
    if (sm_k_route(kc, v->xf, n, H, L->router, L->router_bias, cf->E, K, cf->out_mult, cf->route_scale, v->rlog, idx, w, st, e))
        return sm_errprefix(e, "cuda step: layer %d router", l);
    /* h1 = r16(rms(mm(xf, Wpre), eff(pre_expert_norm))); world > 1: the pooler's row blocks gathered */
    if (v->gc) {
        if (sm_k_mm(kc, v->xf, n, H, L->pooler, v->plan->np, v->pooled_part, st, e) ||
            sm_gcomm_gather_cols(v->gc, SM_GC_POOLED, l, v->pooled_part, n, (size_t)v->plan->np * 2, v->h1, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d pooler", v->rank, l);
    } else if (sm_k_mm(kc, v->xf, n, H, L->pooler, cf->Hm, v->h1, st, e))
        return sm_errprefix(e, "cuda step: layer %d pooler", l);
    /* W4A4: h1 rounded to MXFP4 here, once a row (mws->h1_mx: the experts take it as is) */
    if (sm_k_rms_bf16(v->h1, n, cf->Hm, L->pre_expert_norm, cf->rms_eps, v->h1, L->moe.act_mx, st, e))
        return sm_errprefix(e, "cuda step: layer %d pre-expert norm", l);
    /* m = r16(sum_k w_k yn_k) over the routed experts */
    if (v->gc) {
        if (st_world_moe(v, L, l, n, idx, w, e)) return -1;
    } else if (sm_cuda_moe_forward(&L->moe, v->h1, idx, w, n, v->mo, v->mws, st, e))
        return sm_errprefix(e, "cuda step: layer %d moe", l);
    /* f = mm(m, Wpost); world > 1: the unpooler's row blocks gathered */
    if (v->gc) {
        if (sm_k_mm(kc, v->mo, n, cf->Hm, L->unpooler, v->plan->nu, v->unpooled_part, st, e) ||
            sm_gcomm_gather_cols(v->gc, SM_GC_UNPOOLED, l, v->unpooled_part, n, (size_t)v->plan->nu * 2, v->f, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d unpooler", v->rank, l);
    } else if (sm_k_mm(kc, v->mo, n, cf->Hm, L->unpooler, H, v->f, st, e))
        return sm_errprefix(e, "cuda step: layer %d unpooler", l);
    /* post-FFN boundary + the next layer's input norm (the final norm after the last layer) */
    int last = l == cf->L - 1;
    const float *nw = last ? v->final_norm : v->layers[l + 1].in_norm;
    if (sm_k_post_ffn(v->s, v->f, L->post_ffn_norm, L->ffn_alpha, L->ffn_beta, nw, last, n, H, cf->post_eps, cf->rms_eps, v->x, st, e))
        return sm_errprefix(e, "cuda step: layer %d post-FFN boundary", l);
    return 0;
}

/* Layers [a, b): each its projections (layer a's unless made before) and the rest; then layer
 * b's projections when the run after starts from them. */
static int st_layers(void *ctx, const sm_exec_run *r, int a, int b, unsigned flags, sm_err *e) {
    const sm_exec_view *v = (const sm_exec_view *)ctx;
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
        if (!(l == a && (flags & SM_EXEC_HAVE_QKV)) && st_layer_qkv(v, r, l, q, e)) return -1;
        if (st_layer_rest(v, r, l, q, e)) return -1;
    }
    if ((flags & SM_EXEC_NEXT_QKV) && st_layer_qkv(v, r, b, st_qkv(v, r, b), e)) return -1;
    return 0;
}

int sm_exec_stock_create(const sm_exec_view *v, int strict, sm_exec *x, sm_err *e) {
    (void)strict, (void)e;
    memset(x, 0, sizeof *x);
    x->name = "stock";
    x->ctx = (void *)v;
    x->lo = 0;
    x->hi = v->cfg->L;
    x->layers = st_layers;
    return 0;
}
