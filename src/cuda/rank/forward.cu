/* forward.cu: the math of a step on the context's stream (docs/model.md sections 3-6): embedding,
 * the decoder layers (stock kernels of ops/ops.h + the MoE stage of moe.h) and the logits,
 * for the rows whose metadata sits in the context's metadata buffer.
 *
 * The same enqueue serves the eager path and graph capture: nothing here synchronizes,
 * allocates or reads device data on the host, and every pointer is a field of the context,
 * so a capture bakes in addresses that stay valid for the context's life.  What differs
 * between the two is only the attention plan (eager: per-run calls, prefill kernel for long
 * runs of one request; graph: one generic call) and where the logits go.  We rejected two
 * copies of the layer loop (eager and graph): they would drift apart.
 */
#include "rank.h"
#include <math.h>

/* 1 when run r copies the residual stream entering layer j. */
static int cb_wants_aux(const cb_run *r, int j) {
    for (int a = 0; a < r->naux; a++)
        if (r->aux[a] == j) return 1;
    return 0;
}

/* Copy the residual stream entering layer j into every aux entry that asks for it. */
static int cb_aux_copy(sm_cuda_rank *cr, const cb_run *r, int j, sm_err *e) {
    for (int a = 0; a < r->naux; a++)
        if (r->aux[a] == j)
            SM_CUDA_CHECK(cudaMemcpyAsync(cr->aux + (size_t)a * cr->cap * cr->cfg.H, cr->s, (size_t)r->n * cr->cfg.H * 4,
                                          cudaMemcpyDeviceToDevice, cr->st));
    return 0;
}

/* Paged attention + output norm + sigmoid gate of layer l: one generic call over every row,
 * or the eager plan's calls. */
static int cb_attention(sm_cuda_rank *cr, const cb_run *r, int l, const uint16_t *q, const uint16_t *g, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const cb_layer *L = &cr->layers[l];
    const int nH = cr->plan.nHl, nKV = cr->plan.nKVl, QD = nH * cf->D, NQ = 2 * QD + 2 * nKV * cf->D;
    const int window = L->full ? 0 : cf->window, bpr = cr->kvs.max_bpr;
    const float scale = cf->qk_scale_factor / sqrtf((float)cf->D);
    if (!r->att) {
        if (sm_k_attention(&cr->kc, q, NQ, g, NQ, L->kv, cr->d_tab, bpr, cr->d_rreq, cr->d_pos, r->n, nH, nKV, window, scale,
                           cf->rms_eps, cr->kvs.max_len, cr->att, cr->st, e))
            return sm_errprefix(e, "cuda step: layer %d attention", l);
        return 0;
    }
    for (int i = 0; i < r->natt; i++) {
        const cb_att_item *it = &r->att[i];
        size_t ro = (size_t)it->r0;
        int rc = it->kind == 0
            ? sm_k_attention(&cr->kc, q + ro * NQ, NQ, g + ro * NQ, NQ, L->kv, cr->d_tab, bpr, cr->d_rreq + ro, cr->d_pos + ro,
                             it->cnt, nH, nKV, window, scale, cf->rms_eps, it->max_ctx, cr->att + ro * QD, cr->st, e)
            : sm_k_attention_prefill(q + ro * NQ, NQ, g + ro * NQ, NQ, L->kv, cr->d_tab + (size_t)it->tab * bpr, it->pos0,
                                     it->cnt, nH, nKV, window, scale, cf->rms_eps, cr->att + ro * QD, cr->st, e);
        if (rc) return sm_errprefix(e, "cuda step: layer %d attention (rows %d..%d)", l, it->r0, it->r0 + it->cnt - 1);
    }
    return 0;
}

/* The projections buffer of layer l: a mono step alternates two (a launch reads layer l's
 * while it writes layer l+1's); stock steps use one. */
static uint16_t *cb_qkv(const sm_cuda_rank *cr, const cb_run *r, int l) { return r->mono && (l & 1) ? cr->qkv2 : cr->qkvg; }

/* 1 when layer l of run r is a monokernel layer. */
static int cb_is_mono(const sm_cuda_rank *cr, const cb_run *r, int l) { return r->mono && l >= 1 && l <= cr->cfg.L - 2; }

/* The projections of layer l into q: q | k | v | gate = x Wqkvg^T, then per-head QK norm, RoPE
 * on sliding layers, K (normed, roped) and V (raw) into the cache. */
static int cb_layer_qkv(sm_cuda_rank *cr, const cb_run *r, int l, uint16_t *q, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const cb_layer *L = &cr->layers[l];
    const int n = r->n, H = cf->H, QD = cr->plan.nHl * cf->D, KD = cr->plan.nKVl * cf->D, NQ = 2 * QD + 2 * KD;
    uint16_t *k = q + QD, *v = k + KD;
    if (sm_k_mm(&cr->kc, cr->x, n, H, L->wqkvg, NQ, q, cr->st, e)) return sm_errprefix(e, "cuda step: layer %d qkvg projection", l);
    if (sm_k_qk_rope_kv(q, NQ, k, v, NQ, n, cr->plan.nHl, cr->plan.nKVl, cr->d_pos, cr->d_slot, L->full ? 0.0 : cf->rope_theta, cf->rms_eps,
                        q, NQ, L->kv, cr->kvs.nblocks, cr->st, e))
        return sm_errprefix(e, "cuda step: layer %d qk norm / rope / kv insert", l);
    return 0;
}

/* The expert stage of rank cr (world > 1) into cr->mo, docs/parallelism.md section 2.  EP: the
 * partial m over the rank's routes, rank-order summed, rounded.  TP: every route's partial y
 * over the rank's I slice, rank-order summed (before the post-expert norm), then finalized. */
static int cb_world_moe(sm_cuda_rank *cr, const cb_layer *L, int l, int n, const int *idx, const float *w, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    int rc;
    if (cr->plan.moe == SM_MOE_EP)
        rc = sm_cuda_moe_forward_ep(&L->moe, cf->E / cr->world * cr->rank, cr->h1, idx, w, n, cr->xpart, &cr->mws, cr->st, e) ||
             sm_gcomm_sum_bf16(cr->gc, SM_GC_EXPERT, l, cr->xpart, (size_t)n * cf->Hm, cr->mo, cr->st, e);
    else
        rc = sm_cuda_moe_forward_tp(&L->moe, cr->h1, idx, n, cr->xpart, &cr->mws, cr->st, e) ||
             sm_gcomm_sum_f32(cr->gc, SM_GC_EXPERT, l, cr->xpart, (size_t)n * cf->K * cf->Hm, cr->xpart, cr->st, e) ||
             sm_cuda_moe_finalize(&L->moe, cr->xpart, idx, w, n, cr->mo, &cr->mws, cr->st, e);
    return rc ? sm_errprefix(e, "cuda step: rank %d layer %d moe (%s)", cr->rank, l, sm_moe_layout_name(cr->plan.moe)) : 0;
}

/* Decoder layer l from its projections q: s updated, x = the next layer's normed input
 * (after the last layer: h). */
static int cb_layer_rest(sm_cuda_rank *cr, const cb_run *r, int l, uint16_t *q, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const cb_layer *L = &cr->layers[l];
    const int n = r->n, H = cf->H, QD = cr->plan.nHl * cf->D, KD = cr->plan.nKVl * cf->D, K = cf->K;
    cudaStream_t st = cr->st;
    sm_kernel_ctx *kc = &cr->kc;
    uint16_t *g = q + QD + 2 * KD;
    int *idx = cr->idx + (size_t)l * cr->cap * K;
    float *w = cr->rw + (size_t)l * cr->cap * K;
    /* paged attention + output norm + sigmoid gate */
    if (cb_attention(cr, r, l, q, g, e)) return -1;
    /* a = mm(o, Wo); world > 1: a = r16(attn_sum(o Wo[:, my heads]^T in f32)) */
    if (cr->gc) {
        if (sm_k_mm_f32(kc, cr->att, n, QD, L->wo, H, cr->apart, st, e) ||
            sm_gcomm_sum_bf16(cr->gc, SM_GC_ATTN, l, cr->apart, (size_t)n * H, cr->a, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d o_proj", cr->rank, l);
    } else if (sm_k_mm(kc, cr->att, n, QD, L->wo, H, cr->a, st, e))
        return sm_errprefix(e, "cuda step: layer %d o_proj", l);
    /* post-attention boundary, then xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
    if (sm_k_post_attn(cr->s, cr->a, L->att_alpha, L->att_beta, L->pre_ffn_norm, n, H, cf->post_eps, cf->rms_eps, cr->xf, st, e))
        return sm_errprefix(e, "cuda step: layer %d post-attention boundary", l);
    /* router + top-K */
    if (sm_k_route(kc, cr->xf, n, H, L->router, L->router_bias, cf->E, K, cf->out_mult, cf->route_scale, cr->rlog, idx, w, st, e))
        return sm_errprefix(e, "cuda step: layer %d router", l);
    /* h1 = r16(rms(mm(xf, Wpre), eff(pre_expert_norm))); world > 1: the pooler's row blocks gathered */
    if (cr->gc) {
        if (sm_k_mm(kc, cr->xf, n, H, L->pooler, cr->plan.np, cr->pooled_part, st, e) ||
            sm_gcomm_gather_cols(cr->gc, SM_GC_POOLED, l, cr->pooled_part, n, (size_t)cr->plan.np * 2, cr->h1, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d pooler", cr->rank, l);
    } else if (sm_k_mm(kc, cr->xf, n, H, L->pooler, cf->Hm, cr->h1, st, e))
        return sm_errprefix(e, "cuda step: layer %d pooler", l);
    /* W4A4: h1 rounded to MXFP4 here, once a row (cr->mws.h1_mx: the experts take it as is) */
    if (sm_k_rms_bf16(cr->h1, n, cf->Hm, L->pre_expert_norm, cf->rms_eps, cr->h1, L->moe.act_mx, st, e))
        return sm_errprefix(e, "cuda step: layer %d pre-expert norm", l);
    /* m = r16(sum_k w_k yn_k) over the routed experts */
    if (cr->gc) {
        if (cb_world_moe(cr, L, l, n, idx, w, e)) return -1;
    } else if (sm_cuda_moe_forward(&L->moe, cr->h1, idx, w, n, cr->mo, &cr->mws, st, e))
        return sm_errprefix(e, "cuda step: layer %d moe", l);
    /* f = mm(m, Wpost); world > 1: the unpooler's row blocks gathered */
    if (cr->gc) {
        if (sm_k_mm(kc, cr->mo, n, cf->Hm, L->unpooler, cr->plan.nu, cr->unpooled_part, st, e) ||
            sm_gcomm_gather_cols(cr->gc, SM_GC_UNPOOLED, l, cr->unpooled_part, n, (size_t)cr->plan.nu * 2, cr->f, st, e))
            return sm_errprefix(e, "cuda step: rank %d layer %d unpooler", cr->rank, l);
    } else if (sm_k_mm(kc, cr->mo, n, cf->Hm, L->unpooler, H, cr->f, st, e))
        return sm_errprefix(e, "cuda step: layer %d unpooler", l);
    /* post-FFN boundary + the next layer's input norm (the final norm after the last layer) */
    int last = l == cf->L - 1;
    const float *nw = last ? cr->final_norm : cr->layers[l + 1].in_norm;
    if (sm_k_post_ffn(cr->s, cr->f, L->post_ffn_norm, L->ffn_alpha, L->ffn_beta, nw, last, n, H, cf->post_eps, cf->rms_eps, cr->x,
                      st, e))
        return sm_errprefix(e, "cuda step: layer %d post-FFN boundary", l);
    return 0;
}

/* Layer l of run r: a monokernel layer's launches (attention of l .. projections of l+1), or
 * a stock layer (its projections unless the previous mono launch made them; then, when the
 * next layer runs mono, that layer's projections, where its launch starts). */
static int cb_layer_fwd(sm_cuda_rank *cr, const cb_run *r, int l, sm_err *e) {
    /* the end of layer l-1 and the start of l share a launch unless the residual entering l
     * is an aux output (copied between the two) */
    if (cb_is_mono(cr, r, l))
        return cb_mono_layer(cr, r->n, l, l > r->l0 && cb_is_mono(cr, r, l - 1) && !cb_wants_aux(r, l),
                             l + 1 < r->l1 && cb_is_mono(cr, r, l + 1) && !cb_wants_aux(r, l + 1), e);
    uint16_t *q = cb_qkv(cr, r, l);
    const int have_qkv = l > r->l0 && cb_is_mono(cr, r, l - 1);
    if (!have_qkv && cb_layer_qkv(cr, r, l, q, e)) return -1;
    if (cb_layer_rest(cr, r, l, q, e)) return -1;
    if (l + 1 < r->l1 && cb_is_mono(cr, r, l + 1) && cb_layer_qkv(cr, r, l + 1, cb_qkv(cr, r, l + 1), e)) return -1;
    return 0;
}

/* logits = c * tanh(h . lm_head * m_o / c), masked; argmax.  Into the device buffer (graph
 * form) or, eager, in chunks of CB_LOGIT_ROWS copied to the host buffer (the rows asked for). */
/* The logits of rank cr (world > 1) for rows [c0, c0 + nc) of h: its vocab block into cr->logits_part,
 * the global argmax through vocab_argmax into cr->am + c0, and, when `out` is not NULL, the
 * gathered logits [nc, V] into out. */
static int cb_world_logits(sm_cuda_rank *cr, const uint16_t *h, int c0, int nc, float *out, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const int nv = cr->plan.nv;
    int vu = cf->vocab_used - cr->plan.v0;
    vu = vu < 0 ? 0 : vu > nv ? nv : vu;
    if (sm_k_logits(&cr->kc, h, nc, cf->H, cr->lm_head, nv, vu > 0 ? vu : 1, cf->out_mult, cf->softcap, cr->logits_part, cr->argmax_part, cr->st, e) ||
        cb_best_local(cr, nc, vu, e) || sm_gcomm_argmax(cr->gc, cr->best, cr->argmax_part, nc, nv, cr->am + c0, cr->st, e) ||
        (out && sm_gcomm_gather_cols(cr->gc, SM_GC_VOCAB, cf->L, cr->logits_part, nc, (size_t)nv * 4, out, cr->st, e)))
        return sm_errprefix(e, "cuda step: rank %d logits", cr->rank);
    return 0;
}

static int cb_head(sm_cuda_rank *cr, const cb_run *r, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const int n = r->n, H = cf->H;
    int ord = 0; /* eager: logprob summaries made so far (cr->lps, row order) */
    if (cr->gc) { /* world > 1: every rank takes part; rank 0 copies to the host */
        for (int c0 = 0; c0 < n; c0 += CB_LOGIT_ROWS) {
            int nc = n - c0 < CB_LOGIT_ROWS ? n - c0 : CB_LOGIT_ROWS;
            float *out = r->logits_dev ? r->logits_dev + (size_t)c0 * cf->V : r->logits_host || r->lp_at || r->mask ? cr->logits : NULL;
            if (cb_world_logits(cr, cr->x + (size_t)c0 * H, c0, nc, out, e)) return -1;
            /* the constraint masks (eager; rank 0 holds the rows the host reads) */
            if (r->mask && !r->logits_dev && cr->rank == 0 && cb_mask(cr, r->mask + c0, nc, cr->logits, cr->am + c0, e)) return -1;
            if (r->logits_host && cr->rank == 0 &&
                cb_logits_to_host(cr, cr->logits, nc, r->logits_at ? r->logits_at + c0 : NULL,
                                  r->logits_at ? r->logits_host : r->logits_host + (size_t)c0 * cf->V, e))
                return -1;
            if (r->lp_at && cr->rank == 0 &&
                cb_logprobs(cr, r->lp_at + c0, r->lp_tok ? r->lp_tok + c0 : NULL, nc, r->lp_k, &ord, e))
                return -1;
        }
        return 0;
    }
    if (!r->logits_host && !r->lp_at && !r->mask) {
        if (sm_k_logits(&cr->kc, cr->x, n, H, cr->lm_head, cf->V, cf->vocab_used, cf->out_mult, cf->softcap, r->logits_dev, cr->am,
                        cr->st, e))
            return sm_errprefix(e, "cuda step: logits");
        return 0;
    }
    for (int c0 = 0; c0 < n; c0 += CB_LOGIT_ROWS) {
        int nc = n - c0 < CB_LOGIT_ROWS ? n - c0 : CB_LOGIT_ROWS;
        if (sm_k_logits(&cr->kc, cr->x + (size_t)c0 * H, nc, H, cr->lm_head, cf->V, cf->vocab_used, cf->out_mult, cf->softcap,
                        cr->logits, cr->am + c0, cr->st, e))
            return sm_errprefix(e, "cuda step: logits");
        if (r->mask && cb_mask(cr, r->mask + c0, nc, cr->logits, cr->am + c0, e)) return -1;
        if (r->logits_host && cb_logits_to_host(cr, cr->logits, nc, r->logits_at ? r->logits_at + c0 : NULL,
                                                r->logits_at ? r->logits_host : r->logits_host + (size_t)c0 * cf->V, e))
            return -1;
        if (r->lp_at && cb_logprobs(cr, r->lp_at + c0, r->lp_tok ? r->lp_tok + c0 : NULL, nc, r->lp_k, &ord, e)) return -1;
    }
    return 0;
}

int cb_enqueue(sm_cuda_rank *cr, const cb_run *r, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    if (r->moe_only) {
        const int K = cf->K;
        const int *idx = cr->idx + (size_t)r->l0 * cr->cap * K;
        const float *w = cr->rw + (size_t)r->l0 * cr->cap * K;
        if (sm_cuda_moe_forward(&cr->layers[r->l0].moe, cr->h1, idx, w, r->n, cr->mo, &cr->mws, cr->st, e))
            return sm_errprefix(e, "cuda step: layer %d moe", r->l0);
        return 0;
    }
    if (cr->gc && sm_gcomm_begin(cr->gc, cr->st, e)) return sm_errprefix(e, "cuda step: rank %d", cr->rank);
    if (r->embed) {
        /* s = r16(rms(embed[tok])); x = r16(rms(s, eff(input_layernorm_0))); world > 1: each row
         * from the rank owning its token (embed_gather), then the same norms */
        if (cr->gc) {
            if (cb_embed_local(cr, r->n, e) ||
                sm_gcomm_gather_owner(cr->gc, cr->embed_part, cr->d_tok, r->n, cf->H, cr->plan.nv, cr->f, cr->st, e) ||
                sm_k_embed(cr->f, cr->cap, cf->H, cr->iota, r->n, cr->layers[0].in_norm, cf->rms_eps, cr->s, cr->x, cr->st, e))
                return sm_errprefix(e, "cuda step: rank %d embedding", cr->rank);
        } else if (sm_k_embed(cr->embed, cf->V, cf->H, cr->d_tok, r->n, cr->layers[0].in_norm, cf->rms_eps, cr->s, cr->x, cr->st, e))
            return sm_errprefix(e, "cuda step: embedding");
        if (cb_aux_copy(cr, r, 0, e)) return -1;
    }
    for (int l = r->l0; l < r->l1; l++) {
        if (cb_layer_fwd(cr, r, l, e) || cb_aux_copy(cr, r, l + 1, e)) return -1;
    }
    if (r->head && cb_head(cr, r, e)) return -1;
    return 0;
}
