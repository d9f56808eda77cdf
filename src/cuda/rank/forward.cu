/* forward.cu: a step on the rank's stream (docs/model.md sections 3-6): the embedding, the
 * decoder layers handed to the executors (exec.h: the stock layers, the monokernel for its
 * layers of a bucket it planned), the aux copies between them, and the logits, for the rows
 * whose metadata sits in the context's metadata buffer.
 *
 * The same enqueue serves the eager path and graph capture: nothing here synchronizes,
 * allocates or reads device data on the host, and every pointer is a field of the context,
 * so a capture bakes in addresses that stay valid for the context's life.  What differs
 * between the two is only the attention plan (eager: per-run calls, prefill kernel for long
 * runs of one request; graph: one generic call) and where the logits go.  We rejected two
 * copies of the layer loop (eager and graph): they would drift apart.
 */
#include "rank.h"
#include <string.h>

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

/* The executor of layer l of run r: the monokernel for its layers of a bucket it planned, else
 * stock. */
static const sm_exec *cb_exec_of(const sm_cuda_rank *cr, const cb_run *r, int l) {
    return r->mono && l >= cr->mono.lo && l < cr->mono.hi ? &cr->mono : &cr->stock;
}

/* Layers [l0, l1) of run r in runs of one executor, each ended where the next layer's residual
 * is an aux output (copied between the two); the projections handed over between runs as the
 * executors ask (exec.h). */
static int cb_layers(sm_cuda_rank *cr, const cb_run *r, const sm_exec_run *x, sm_err *e) {
    for (int a = r->l0, b; a < r->l1; a = b) {
        const sm_exec *X = cb_exec_of(cr, r, a);
        for (b = a + 1; b < r->l1 && cb_exec_of(cr, r, b) == X && !cb_wants_aux(r, b); b++) {}
        unsigned flags = 0;
        if (a > r->l0 && cb_exec_of(cr, r, a - 1)->qkv_out) flags |= SM_EXEC_HAVE_QKV;
        if (b < r->l1 && cb_exec_of(cr, r, b)->qkv_in) flags |= SM_EXEC_NEXT_QKV;
        if (X->layers(X->ctx, x, a, b, flags, e)) return -1;
        if (X == &cr->mono) cr->mono_layers += b - a;
        if (cb_aux_copy(cr, r, b, e)) return -1;
    }
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
    sm_exec_run x;
    memset(&x, 0, sizeof x);
    x.n = r->n;
    x.alt = r->mono && cr->mono.qkv_alt;
    x.att = r->att;
    x.natt = r->natt;
    x.moe_only = r->moe_only;
    if (r->moe_only) /* bench: layer l0's expert stage alone, stock */
        return cr->stock.layers(cr->stock.ctx, &x, r->l0, r->l0 + 1, 0, e);
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
    if (cb_layers(cr, r, &x, e)) return -1;
    if (r->head && cb_head(cr, r, e)) return -1;
    return 0;
}
