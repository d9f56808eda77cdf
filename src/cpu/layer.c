/* layer.c: the one layer loop of the CPU forward (layer.h): docs/model.md section 4 for every
 * row of a step, on one rank's shard (section 9), for the single-rank and the world backends.
 *
 * A step runs layer by layer over ALL its rows at once (a [rows, features] activation per
 * stage), so each weight matrix is streamed once per step and, within a layer, every row has
 * written its K/V before any row attends (a row sees the earlier rows of its own step; later
 * rows are masked by position).  Per layer, rank r: q/k/v/gate rows of its heads -> QK norm,
 * RoPE, K/V into its own pages (its KV heads only) -> attention of its heads with the output
 * norm and gate -> o_proj partial over its heads' columns -> attn_sum (rank-ordered) -> r16 ->
 * replicated residual boundary and pre-FFN norm, router and top-K -> pooler rows ->
 * pooled_gather -> pre-expert norm -> experts: EP, whole routes of its experts, normed and
 * weighted, partial m per row -> expert_sum; TP, every route over its slice of I, partial y ->
 * expert_sum (or, for steps of >= finalize_rows rows, expert_scatter -> norm + weight + sum of
 * its token rows -> expert_gather) -> r16(m) -> unpooler rows -> unpooled_gather ->
 * replicated FFN boundary and the next norm.  Embedding and lm_head are vocabulary-sharded
 * (embed_gather, vocab_gather, vocab_argmax).  With W = 1 every comm operation is an
 * identity (the built-in single-rank communicator).
 *
 * This file holds no arithmetic of its own: every number is produced by an op of ops.h (the
 * same ops the GPU kernel tests take as references), so a row's result depends neither on the
 * other rows of its step, nor on the page layout, nor on the thread count.  Replicated values
 * are computed by the same ops from bit-identical inputs, and every cross-rank sum adds ranks
 * in rank order, so replicated state is bit-identical on all ranks.  What stays here is the
 * composition: buffers, the rank's view of each op (its heads, experts, vocabulary rows), the
 * communication between ops, and the debug trace.
 * We rejected a row-at-a-time forward: it reads every weight once per row, 8x the traffic of
 * a verify step, and it would not exercise the batched K/V ordering the GPU paths have.
 */
#include "cpu/layer.h"
#include "cpu/pool.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pass a stage of kind CPU_TRACE_* to the debug trace when it asked for that kind. */
#define TRACE(kind, layer, name, ptr, n, width)                                  \
    do {                                                                         \
        if (r->trace && (r->trace_kinds & (kind)))                               \
            r->trace(r->trace_arg, r->rank, (layer), (name), (ptr), (n), (width)); \
    } while (0)

/* Run a comm call; its error already names the operation, layer and rank. */
#define COMM(call) do { if ((call) != 0) return -1; } while (0)

/* ---------------------------------------------------------------- the single-rank communicator */

/* With one rank every sum is its only part and every gather its only block: identities.
 * Outputs that are a separate buffer get a copy of the input. */
static void solo_move(const float *in, float *out, int64_t cnt) {
    if (out && out != in) memmove(out, in, sizeof(float) * (size_t)cnt);
}
static int solo_embed(sm_comm *cm, const int *tokens, int n, int H, int nv, float *rows, sm_err *e) {
    (void)cm; (void)tokens; (void)n; (void)H; (void)nv; (void)rows; (void)e;
    return 0;
}
static int solo_sum(sm_comm *cm, int layer, float *part, int rows, int width, sm_err *e) {
    (void)cm; (void)layer; (void)part; (void)rows; (void)width; (void)e;
    return 0;
}
static int solo_gather(sm_comm *cm, int layer, const float *blk, int n, int width, float *out, sm_err *e) {
    (void)cm; (void)layer; (void)e;
    solo_move(blk, out, (int64_t)n * width);
    return 0;
}
static int solo_vocab(sm_comm *cm, const float *blk, int n, int nv, float *out, sm_err *e) {
    return solo_gather(cm, -1, blk, n, nv, out, e);
}
static int solo_argmax(sm_comm *cm, const float *best, const int *best_id, int n, int *out, sm_err *e) {
    (void)cm; (void)best; (void)e;
    for (int i = 0; i < n; i++) out[i] = best_id[i] == -2 ? -1 : best_id[i]; /* -2: non-finite row */
    return 0;
}
static void solo_abort(sm_comm *cm, const char *why) { (void)cm; (void)why; }

static const sm_comm_ops SOLO_OPS = {solo_embed, solo_sum, solo_gather, solo_sum, solo_gather, solo_gather,
                                     solo_gather, solo_vocab, solo_argmax, solo_abort};

/* ---------------------------------------------------------------- buffers */

static void rank_free_rows(cpu_rank *r) {
#define FREE(ptr) do { free(ptr); (ptr) = NULL; } while (0)
    FREE(r->s); FREE(r->x); FREE(r->a); FREE(r->xf); FREE(r->f); FREE(r->q); FREE(r->g); FREE(r->att); FREE(r->o);
    FREE(r->k); FREE(r->v); FREE(r->slot); FREE(r->rl); FREE(r->idx); FREE(r->rw); FREE(r->hp); FREE(r->h1);
    FREE(r->mo); FREE(r->fp); FREE(r->ymine); FREE(r->mmine); FREE(r->lg); FREE(r->lrow); FREE(r->best); FREE(r->best_id);
    FREE(r->am); FREE(r->tr);
#undef FREE
    r->cap = 0;
}

/* Size the activation buffers (and the expert workspace) for n rows. */
static int rank_reserve(cpu_rank *r, int n, sm_err *e) {
    if (n <= r->cap) return 0;
    const sm_config *c = &r->m->cfg;
    const sm_shard *sh = &r->sh;
    rank_free_rows(r);
    size_t R = (size_t)n, RK = R * (size_t)c->K, H = (size_t)c->H, Hm = (size_t)c->Hm;
    size_t QD = (size_t)sh->nHl * c->D, KD = (size_t)sh->nKVl * c->D;
    int ok = 1;
#define ALLOC(ptr, cnt) ok &= ((ptr) = malloc(sizeof *(ptr) * (cnt))) != NULL
    ALLOC(r->s, R * H); ALLOC(r->x, R * H); ALLOC(r->a, R * H); ALLOC(r->xf, R * H); ALLOC(r->f, R * H);
    ALLOC(r->q, R * QD); ALLOC(r->g, R * QD); ALLOC(r->att, R * QD); ALLOC(r->o, R * QD);
    ALLOC(r->k, R * KD); ALLOC(r->v, R * KD); ALLOC(r->slot, R);
    ALLOC(r->rl, R * (size_t)c->E); ALLOC(r->idx, RK); ALLOC(r->rw, RK); ALLOC(r->hp, R * (size_t)sh->np);
    ALLOC(r->h1, R * Hm); ALLOC(r->mo, R * Hm); ALLOC(r->fp, R * (size_t)sh->nu);
    if (sh->moe == SM_MOE_TP) { ALLOC(r->ymine, RK * Hm); ALLOC(r->mmine, R * Hm); }
    ALLOC(r->lg, R * (size_t)sh->nv); ALLOC(r->lrow, (size_t)c->V); ALLOC(r->best, R); ALLOC(r->best_id, R); ALLOC(r->am, R); ALLOC(r->tr, RK);
#undef ALLOC
    if (!ok) {
        rank_free_rows(r);
        return sm_errf(e, "%s: out of memory for the activations of %d rows", r->name, n);
    }
    r->cap = n;
    const sm_shard_experts *X = &sh->layers[0].ex;
    if (ref_moe_ws_reserve(&r->ws, n * c->K, X->ne, X->ni, c->Hm, e)) {
        rank_free_rows(r);
        return sm_errprefix(e, "%s", r->name);
    }
    return 0;
}

void cpu_rank_free(cpu_rank *r) {
    rank_free_rows(r);
    ref_moe_ws_free(&r->ws);
    free(r->scores); free(r->kvp);
    sm_pool_destroy(r->pool);
    sm_shard_free(&r->sh);
    memset(r, 0, sizeof *r);
}

int cpu_rank_init(cpu_rank *r, const char *name, const sm_model *m, int world, int rank, sm_moe_layout moe,
                  sm_comm *comm, const sm_kv *kv, int threads, int rows, sm_err *e) {
    const sm_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    if (!comm && world != 1) return sm_errf(e, "%s: world %d: the single-rank communicator needs world 1", name, world);
    r->m = m;
    r->rank = rank;
    r->finalize_rows = CPU_FINALIZE_ROWS;
    r->made = sm_kv_shape_of(kv);
    r->solo = (sm_comm){0, 1, &SOLO_OPS, NULL};
    r->comm = comm ? comm : &r->solo;
    if (sm_shard_make(m, world, rank, moe, &r->sh, e)) return sm_errprefix(e, "%s", name);
    if (threads != 1 && sm_pool_create(threads, &r->pool, e)) {
        cpu_rank_free(r);
        return sm_errprefix(e, "%s", name);
    }
    r->nthreads = sm_pool_nthreads(r->pool);
    size_t kv_elems = (size_t)c->L * kv->nblocks * r->sh.nKVl * SM_KV_BLOCK * 2 * c->D;
    r->kvp = calloc(kv_elems, sizeof(uint16_t));
    r->scores = malloc(sizeof(float) * (size_t)r->nthreads * kv->max_len);
    if (!r->kvp || !r->scores) {
        cpu_rank_free(r);
        return sm_errf(e, "%s: out of memory for %zu KV bytes (%d pages x %d layers)", name, kv_elems * 2, kv->nblocks,
                       c->L);
    }
    if (rank_reserve(r, rows, e)) { cpu_rank_free(r); return -1; }
    return 0;
}

void cpu_rank_trace(cpu_rank *r, sm_world_trace_fn fn, void *arg, int kinds) {
    r->trace = fn;
    r->trace_arg = arg;
    r->trace_kinds = kinds;
}

/* ---------------------------------------------------------------- the attention branch */

/* a [n, H] = r16(o_proj(attention(x))) of layer l, this rank's heads, summed over ranks. */
static int rank_attention(cpu_rank *r, const sm_step *st, int l, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const sm_shard *sh = &r->sh;
    const sm_shard_layer *SL = &sh->layers[l];
    int n = st->nrows, H = c->H, D = c->D, QD = sh->nHl * D, KD = sh->nKVl * D;
    uint16_t *kvl = r->kvp + (int64_t)l * r->made.nblocks * sh->nKVl * SM_KV_BLOCK * 2 * D;
    /* q, k, v, gate projections of this rank's heads */
    ref_mm(r->pool, r->x, n, H, SL->wq, QD, r->q);
    ref_mm(r->pool, r->x, n, H, SL->wk, KD, r->k);
    ref_mm(r->pool, r->x, n, H, SL->wv, KD, r->v);
    ref_mm(r->pool, r->x, n, H, SL->wg, QD, r->g);
    TRACE(CPU_TRACE_LOCAL, l, "q", r->q, n, QD);
    TRACE(CPU_TRACE_LOCAL, l, "k", r->k, n, KD);
    TRACE(CPU_TRACE_LOCAL, l, "v", r->v, n, KD);
    TRACE(CPU_TRACE_LOCAL, l, "g", r->g, n, QD);
    /* QK norm, RoPE (sliding layers; full layers are NoPE), K and V of every row into its
     * slot before any row attends */
    for (int i = 0; i < n; i++) r->slot[i] = sm_kv_slot(st->kv, st->req[i], st->pos[i]);
    ref_qk_rope_kv(r->q, QD, r->k, r->v, KD, n, sh->nHl, sh->nKVl, D, st->pos, r->slot,
                   SL->full->full ? 0.0 : c->rope_theta, c->rms_eps, kvl, r->made.nblocks);
    TRACE(CPU_TRACE_LOCAL, l, "qn", r->q, n, QD);
    TRACE(CPU_TRACE_LOCAL, l, "kn", r->k, n, KD);
    /* paged attention of the local heads with the output norm and gate, one (row, head) a task */
    ref_att at = {r->q, QD, r->g, QD, kvl, st->kv->tables, st->kv->max_bpr, st->req, st->pos, sh->nHl, sh->nKVl, D,
                  SL->full->full ? 0 : c->window, c->qk_scale_factor / sqrtf((float)D), c->rms_eps};
    int keep = r->trace && (r->trace_kinds & CPU_TRACE_LOCAL); /* the pre-norm output, for the trace */
    ref_attention(r->pool, &at, n, r->scores, r->made.max_len, keep ? r->att : NULL, r->o);
    TRACE(CPU_TRACE_LOCAL, l, "att", r->att, n, QD);
    TRACE(CPU_TRACE_LOCAL, l, "o", r->o, n, QD);
    /* a = r16(sum over ranks of o_local @ Wo[:, local columns]^T), partials in rank order */
    ref_mm_partial(r->pool, r->o, n, QD, SL->wo, SL->ld_wo, H, r->a);
    COMM(r->comm->ops->attn_sum(r->comm, l, r->a, n, H, e));
    ref_round(r->a, (int64_t)n * H);
    TRACE(CPU_TRACE_REP, l, "a", r->a, n, H);
    return 0;
}

/* ---------------------------------------------------------------- the MoE branch */

/* Route ids and weights of rows [0, n) as trace stages. */
static void trace_routes(cpu_rank *r, int l, int n) {
    int K = r->m->cfg.K;
    if (!r->trace || !(r->trace_kinds & CPU_TRACE_REP)) return;
    for (int i = 0; i < n * K; i++) r->tr[i] = (float)r->idx[i];
    TRACE(CPU_TRACE_REP, l, "route_idx", r->tr, n, K);
    TRACE(CPU_TRACE_REP, l, "route_w", r->rw, n, K);
}

/* mo [n, Hm] = r16(m) from the y of this rank's ns grouped slots (ref_moe_ffn): post-expert
 * norm, route weights, the route-ordered sum, and the cross-rank sum of the layout. */
static int rank_finalize(cpu_rank *r, int l, int n, int ns, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const float *pn = r->sh.layers[l].full->post_expert_norm;
    const sm_shard_experts *X = &r->sh.layers[l].ex;
    int K = c->K, Hm = c->Hm;
    float *y = r->ws.y;
    if (r->sh.moe == SM_MOE_EP) {
        /* EP: norm the local routes here; m partial = their weighted sum in route order */
        for (int s = 0; s < ns; s++) ref_expert_norm(pn, Hm, c->post_eps, y + (int64_t)r->ws.slot_route[s] * Hm);
        ref_route_sum(y, r->rw, r->idx, X->e0, X->ne, n, K, Hm, r->mo);
        /* expert partial sum over ranks (rank order), then r16 */
        COMM(r->comm->ops->expert_sum(r->comm, l, r->mo, n, Hm, e));
        ref_round(r->mo, (int64_t)n * Hm);
    } else if (n >= r->finalize_rows) {
        /* TP, token-sharded: reduce-scatter y by rows, finalize this rank's rows, all-gather m */
        int lo, hi;
        sm_shard_rows(n, r->sh.world, r->rank, &lo, &hi);
        COMM(r->comm->ops->expert_scatter(r->comm, l, y, n, K * Hm, r->ymine, e));
        for (int q = 0; q < (hi - lo) * K; q++) ref_expert_norm(pn, Hm, c->post_eps, r->ymine + (int64_t)q * Hm);
        ref_route_sum(r->ymine, r->rw + (int64_t)lo * K, NULL, 0, 0, hi - lo, K, Hm, r->mmine);
        ref_round(r->mmine, (int64_t)(hi - lo) * Hm);
        COMM(r->comm->ops->expert_gather(r->comm, l, r->mmine, n, Hm, r->mo, e));
    } else {
        /* TP: all-reduce every route's y partial (before the post-expert norm), finalize all rows */
        COMM(r->comm->ops->expert_sum(r->comm, l, y, n * K, Hm, e));
        for (int q = 0; q < n * K; q++) ref_expert_norm(pn, Hm, c->post_eps, y + (int64_t)q * Hm);
        ref_route_sum(y, r->rw, NULL, 0, 0, n, K, Hm, r->mo);
        ref_round(r->mo, (int64_t)n * Hm);
    }
    return 0;
}

/* f [n, H] = moe(xf) of layer l from this rank's experts (or expert slices), pooler and
 * unpooler rows, exchanging partials through the communicator. */
static int rank_moe(cpu_rank *r, int l, int n, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const sm_shard_layer *SL = &r->sh.layers[l];
    const sm_layer *Ly = SL->full;
    int K = c->K, Hm = c->Hm;
    /* router logits (f32, replicated), top-K routes and weights per row */
    ref_route(r->pool, c, r->xf, n, Ly->router, Ly->router_bias, r->rl, r->idx, r->rw);
    trace_routes(r, l, n);
    /* h1 = r16(rms(mm(xf, pooler), pre_expert_norm)): this rank's pooler rows, gathered */
    ref_mm(r->pool, r->xf, n, c->H, SL->pooler, r->sh.np, r->hp);
    COMM(r->comm->ops->pooled_gather(r->comm, l, r->hp, n, r->sh.np, r->h1, e));
    ref_rms(r->h1, n, Hm, Ly->pre_expert_norm, c->rms_eps, 1, r->h1);
    TRACE(CPU_TRACE_REP, l, "h1", r->h1, n, Hm);
    /* this rank's routes grouped by local expert; expert FFN: y per route (complete in EP,
     * partial over I in TP) */
    ref_experts X = ref_experts_of_shard(&SL->ex);
    int ns = ref_moe_group(&r->ws, r->idx, n * K, K, X.e0, X.ne);
    ref_moe_ffn(r->pool, &X, r->h1, Hm, &r->ws);
    if (rank_finalize(r, l, n, ns, e)) return -1;
    TRACE(CPU_TRACE_REP, l, "m", r->mo, n, Hm);
    /* f = mm(m, unpooler): this rank's unpooler rows, gathered */
    ref_mm(r->pool, r->mo, n, Hm, SL->unpooler, r->sh.nu, r->fp);
    COMM(r->comm->ops->unpooled_gather(r->comm, l, r->fp, n, r->sh.nu, r->f, e));
    return 0;
}

/* ---------------------------------------------------------------- the step */

/* The residual stream as it enters layer j, into the step's aux buffers that asked for it. */
static void put_aux(const cpu_rank *r, const sm_step *st, int j) {
    if (r->rank != 0) return;
    int H = r->m->cfg.H;
    for (int a = 0; a < st->naux; a++)
        if (st->aux_layers[a] == j) memcpy(st->aux + (int64_t)a * st->nrows * H, r->s, sizeof(float) * (size_t)st->nrows * H);
}

/* Logits, greedy ids and the step's outputs from h = r->x [n, H]. */
static int rank_logits(cpu_rank *r, const sm_step *st, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const sm_shard *sh = &r->sh;
    int n = st->nrows;
    /* logits of this rank's vocabulary rows (straight into the caller's buffer when the rank
     * holds the whole vocabulary and every row is wanted), gathered into the caller's buffer on
     * rank 0: every row, or (logits_at) the rows asked for, each to its row there */
    float *lg = sh->nv == c->V && st->logits && !st->logits_at ? st->logits : r->lg;
    ref_logits_rows(r->pool, c, r->x, n, sh->lm_head, sh->v0, sh->nv, lg);
    /* the constrained rows: every id their mask forbids is -inf, before anything reads the row */
    for (int i = 0; st->mask && i < n; i++)
        if (st->mask[i]) ref_mask_row(lg + (int64_t)i * sh->nv, st->mask[i], sh->v0, sh->nv);
    if (st->logits && !st->logits_at)
        COMM(r->comm->ops->vocab_gather(r->comm, lg, n, sh->nv, r->rank == 0 ? st->logits : NULL, e));
    for (int i = 0; st->logits && st->logits_at && i < n; i++)
        if (st->logits_at[i] >= 0)
            COMM(r->comm->ops->vocab_gather(r->comm, lg + (int64_t)i * sh->nv, 1, sh->nv,
                                            r->rank == 0 ? st->logits + (int64_t)st->logits_at[i] * c->V : NULL, e));
    /* logprob summaries of the rows lp_at asks for, on rank 0 from the whole row: the one just
     * handed out when the caller takes it, else this rank's when it holds every id, else gathered
     * from the ranks' blocks (every rank decides alike: the same step) */
    for (int i = 0; st->lp_at && i < n; i++) {
        if (st->lp_at[i] < 0) continue;
        const float *row = lg + (int64_t)i * sh->nv;
        const int out = st->logits && (!st->logits_at || st->logits_at[i] >= 0); /* row i is in st->logits */
        if (out) {
            row = r->rank == 0 ? st->logits + (int64_t)(st->logits_at ? st->logits_at[i] : i) * c->V : NULL;
        } else if (sh->nv < c->V) {
            COMM(r->comm->ops->vocab_gather(r->comm, row, 1, sh->nv, r->rank == 0 ? r->lrow : NULL, e));
            row = r->lrow;
        }
        if (r->rank == 0) ref_logprobs_row(row, c->vocab_used, st->lp_k, st->lp_tok ? st->lp_tok[i] : -1, &st->lp[st->lp_at[i]]);
    }
    /* greedy: this rank's first maximum among ids < vocab_used, then the first over ranks */
    int vend = c->vocab_used - sh->v0 < sh->nv ? c->vocab_used - sh->v0 : sh->nv;
    for (int i = 0; i < n; i++) {
        const float *li = lg + (int64_t)i * sh->nv;
        int best = vend > 0 ? ref_argmax_row(li, vend) : -1;
        /* -2: a NaN or +Inf here; -1: no candidate (no id below vocab_used, or all masked) */
        r->best_id[i] = vend <= 0 || (best < 0 && !ref_row_bad(li, vend)) ? -1 : best < 0 ? -2 : sh->v0 + best;
        r->best[i] = best < 0 ? -INFINITY : li[best];
    }
    COMM(r->comm->ops->vocab_argmax(r->comm, r->best, r->best_id, n, r->am, e));
    if (r->trace && (r->trace_kinds & CPU_TRACE_ARGMAX)) {
        for (int i = 0; i < n; i++) r->tr[i] = (float)r->am[i];
        TRACE(CPU_TRACE_ARGMAX, c->L, "argmax", r->tr, n, 1);
    }
    if (r->rank == 0 && st->argmax) memcpy(st->argmax, r->am, sizeof(int) * (size_t)n);
    return 0;
}

int cpu_rank_step(cpu_rank *r, const sm_step *st, sm_err *e) {
    const sm_model *m = r->m;
    const sm_config *c = &m->cfg;
    const sm_shard *sh = &r->sh;
    int n = st->nrows, H = c->H;
    if (rank_reserve(r, n, e)) return -1;
    /* embedding rows of this rank's vocabulary block (zeros elsewhere), gathered from owners;
     * s = r16(rms(embed[tok], -, eps)), x = r16(rms(s, eff(input_layernorm_0))) */
    ref_embed_rows(sh->embed, sh->v0, sh->nv, H, st->tokens, n, r->s);
    COMM(r->comm->ops->embed_gather(r->comm, st->tokens, n, H, sh->nv, r->s, e));
    ref_embed_norm(r->s, n, H, m->layers[0].in_norm, c->rms_eps, r->x);
    put_aux(r, st, 0);
    TRACE(CPU_TRACE_REP, -1, "s", r->s, n, H);
    TRACE(CPU_TRACE_REP, 0, "x", r->x, n, H);
    for (int l = 0; l < c->L; l++) {
        const sm_layer *Ly = &m->layers[l];
        int last = l == c->L - 1;
        /* attention branch */
        if (rank_attention(r, st, l, e)) return -1;
        /* post-attention boundary: s = alpha * s + beta * r16(rms(a, -, 1e-8)); xf = r16(rms(s, pre_ffn)) */
        ref_post_attn(r->s, r->a, Ly->att_alpha, Ly->att_beta, Ly->pre_ffn_norm, n, H, c->post_eps, c->rms_eps, r->xf);
        TRACE(CPU_TRACE_REP, l, "s_att", r->s, n, H);
        TRACE(CPU_TRACE_REP, l, "xf", r->xf, n, H);
        /* MoE branch */
        if (rank_moe(r, l, n, e)) return -1;
        TRACE(CPU_TRACE_REP, l, "f", r->f, n, H);
        /* post-FFN boundary, then the next layer's input norm (after the last layer: the final
         * norm of r16(s), weight as is, giving h) */
        ref_post_ffn(r->s, r->f, Ly->post_ffn_norm, Ly->ffn_alpha, Ly->ffn_beta,
                     last ? m->final_norm : m->layers[l + 1].in_norm, last, n, H, c->post_eps, c->rms_eps, r->x);
        put_aux(r, st, l + 1);
        TRACE(CPU_TRACE_REP, l, "s_ffn", r->s, n, H);
        if (!last) TRACE(CPU_TRACE_REP, l + 1, "x", r->x, n, H);
    }
    TRACE(CPU_TRACE_REP, c->L, "h", r->x, n, H);
    return rank_logits(r, st, e);
}
