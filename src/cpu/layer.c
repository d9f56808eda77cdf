/* layer.c: the one layer loop of the CPU forward (layer.h): SPEC.md section 4 for every row
 * of a step, on one rank's shard (section 9), for the single-rank and the world backends.
 *
 * A step runs layer by layer over ALL its rows at once (a [rows, features] activation per
 * stage), so each weight matrix is streamed once per step and, within a layer, every row has
 * written its K/V before any row attends (a row sees the earlier rows of its own step; later
 * rows are masked by position).  Per layer, rank r: q/k/v/gate rows of its heads -> QK norm,
 * RoPE, K/V into its own pages (its KV heads only) -> attention of its heads -> output gate
 * -> o_proj partial over its heads' columns -> attn_sum (rank-ordered) -> r16 -> replicated
 * residual boundary, pre-FFN norm, router and top-K -> pooler rows -> pooled_gather ->
 * pre-expert norm -> experts: EP, whole routes of its experts, normed and weighted, partial m
 * per row -> expert_sum; TP, every route over its slice of I, partial y -> expert_sum (or,
 * for steps of >= finalize_rows rows, expert_scatter -> norm + weight + sum of its token rows
 * -> expert_gather) -> r16(m) -> unpooler rows -> unpooled_gather -> replicated FFN boundary.
 * Embedding and lm_head are vocabulary-sharded (embed_gather, vocab_gather, vocab_argmax).
 * With W = 1 every comm operation is an identity (the built-in single-rank communicator).
 *
 * Every number is produced by the fixed-order dot of ops.c (ref_dot), so a row's result does
 * not depend on the other rows of its step, the page layout, the thread count, nor on the
 * kernel choice: the sharded kernels (one decoded weight row dotted with each activation row)
 * and the grouped ones of ops.c (a decoded tile dotted with up to 16 rows) give the same bits,
 * which the W = 1 world backend checks against the single-rank one.  Replicated values are
 * computed by the same code from bit-identical inputs, and every cross-rank sum adds ranks in
 * rank order, so replicated state is bit-identical on all ranks.
 * We rejected a row-at-a-time forward: it reads every weight once per row, 8x the traffic of
 * a verify step, and it would not exercise the batched K/V ordering the GPU paths have.
 */
#include "cpu/layer.h"
#include "cpu/pool.h"
#include "codec.h"
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
static int solo_embed(sm_comm *c, const int *tokens, int n, int H, int nv, float *rows, sm_err *e) {
    (void)c; (void)tokens; (void)n; (void)H; (void)nv; (void)rows; (void)e;
    return 0;
}
static int solo_sum(sm_comm *c, int layer, float *part, int rows, int width, sm_err *e) {
    (void)c; (void)layer; (void)part; (void)rows; (void)width; (void)e;
    return 0;
}
static int solo_gather(sm_comm *c, int layer, const float *blk, int n, int width, float *out, sm_err *e) {
    (void)c; (void)layer; (void)e;
    solo_move(blk, out, (int64_t)n * width);
    return 0;
}
static int solo_vocab(sm_comm *c, const float *blk, int n, int nv, float *out, sm_err *e) {
    return solo_gather(c, -1, blk, n, nv, out, e);
}
static int solo_argmax(sm_comm *c, const float *best, const int *best_id, int n, int *out, sm_err *e) {
    (void)c; (void)best; (void)e;
    for (int i = 0; i < n; i++) out[i] = best_id[i] == -2 ? -1 : best_id[i]; /* -2: non-finite row */
    return 0;
}
static void solo_abort(sm_comm *c, const char *why) { (void)c; (void)why; }

static const sm_comm_ops SOLO_OPS = {solo_embed, solo_sum, solo_gather, solo_sum, solo_gather, solo_gather,
                                     solo_gather, solo_vocab, solo_argmax, solo_abort};

/* ---------------------------------------------------------------- buffers */

static void rank_free_rows(cpu_rank *r) {
#define FREE(ptr) do { free(ptr); (ptr) = NULL; } while (0)
    FREE(r->s); FREE(r->x); FREE(r->a); FREE(r->xf); FREE(r->f); FREE(r->q); FREE(r->g); FREE(r->o);
    FREE(r->k); FREE(r->v); FREE(r->idx); FREE(r->rw); FREE(r->lg); FREE(r->best); FREE(r->best_id); FREE(r->am);
    FREE(r->tr); FREE(r->rl); FREE(r->hp); FREE(r->h1); FREE(r->mo); FREE(r->fp); FREE(r->gu); FREE(r->act);
    FREE(r->y); FREE(r->ymine); FREE(r->mmine); FREE(r->slot_route);
#undef FREE
    r->cap = 0;
}

/* Size the activation buffers for n rows. */
static int rank_reserve(cpu_rank *r, int n, sm_err *e) {
    if (n <= r->cap) return 0;
    const sm_config *c = &r->m->cfg;
    const sm_shard *sh = &r->sh;
    rank_free_rows(r);
    size_t R = (size_t)n, RK = R * (size_t)c->K, H = (size_t)c->H, Hm = (size_t)c->Hm;
    size_t QD = (size_t)sh->nHl * c->D, KD = (size_t)sh->nKVl * c->D, ni = (size_t)sh->layers[0].ex.ni;
    int ok = 1;
#define ALLOC(ptr, cnt) ok &= ((ptr) = malloc(sizeof *(ptr) * (cnt))) != NULL
    ALLOC(r->s, R * H); ALLOC(r->x, R * H); ALLOC(r->a, R * H); ALLOC(r->xf, R * H); ALLOC(r->f, R * H);
    ALLOC(r->q, R * QD); ALLOC(r->g, R * QD); ALLOC(r->o, R * QD); ALLOC(r->k, R * KD); ALLOC(r->v, R * KD);
    ALLOC(r->idx, RK); ALLOC(r->rw, RK);
    ALLOC(r->lg, R * (size_t)sh->nv); ALLOC(r->best, R); ALLOC(r->best_id, R); ALLOC(r->am, R); ALLOC(r->tr, RK);
    if (r->kern == CPU_KERNELS_SHARDED) {
        ALLOC(r->rl, R * (size_t)c->E); ALLOC(r->hp, R * (size_t)sh->np); ALLOC(r->h1, R * Hm); ALLOC(r->mo, R * Hm);
        ALLOC(r->fp, R * (size_t)sh->nu); ALLOC(r->gu, RK * 2 * ni); ALLOC(r->act, RK * ni); ALLOC(r->y, RK * Hm);
        ALLOC(r->ymine, RK * Hm); ALLOC(r->mmine, R * Hm); ALLOC(r->slot_route, RK);
    }
#undef ALLOC
    if (!ok) {
        rank_free_rows(r);
        return sm_errf(e, "%s: out of memory for the activations of %d rows", r->name, n);
    }
    r->cap = n;
    if (r->kern == CPU_KERNELS_GROUPED && ref_moe_ws_reserve(&r->ws, c, n, e)) {
        rank_free_rows(r);
        return sm_errprefix(e, "%s", r->name);
    }
    return 0;
}

void cpu_rank_free(cpu_rank *r) {
    rank_free_rows(r);
    ref_moe_ws_free(&r->ws);
    free(r->off); free(r->cur); free(r->active);
    free(r->rowbuf); free(r->scores); free(r->kvp);
    sm_pool_destroy(r->pool);
    sm_shard_free(&r->sh);
    memset(r, 0, sizeof *r);
}

int cpu_rank_init(cpu_rank *r, const char *name, const sm_model *m, int world, int rank, sm_moe_layout moe,
                  sm_comm *comm, cpu_kernels kern, const sm_kv *kv, int threads, int rows, sm_err *e) {
    const sm_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    if ((!comm || kern == CPU_KERNELS_GROUPED) && world != 1)
        return sm_errf(e, "%s: world %d: the single-rank communicator and the grouped kernels need world 1", name, world);
    r->m = m;
    r->rank = rank;
    r->kern = kern;
    r->finalize_rows = CPU_FINALIZE_ROWS;
    r->nblocks = kv->nblocks;
    r->max_len = kv->max_len;
    r->solo = (sm_comm){0, 1, &SOLO_OPS, NULL};
    r->comm = comm ? comm : &r->solo;
    if (sm_shard_make(m, world, rank, moe, &r->sh, e)) return sm_errprefix(e, "%s", name);
    if (threads != 1 && sm_pool_create(threads, &r->pool, e)) {
        cpu_rank_free(r);
        return sm_errprefix(e, "%s", name);
    }
    r->nthreads = sm_pool_nthreads(r->pool);
    size_t kv_elems = (size_t)c->L * r->nblocks * r->sh.nKVl * SM_KV_BLOCK * 2 * c->D;
    r->kvp = calloc(kv_elems, sizeof(uint16_t));
    r->scores = malloc(sizeof(float) * (size_t)r->nthreads * r->max_len);
    int ok = r->kvp && r->scores;
    if (kern == CPU_KERNELS_SHARDED) {
        int QD = c->nH * c->D, ne = r->sh.layers[0].ex.ne;
        r->maxw = c->H > c->Hm ? c->H : c->Hm;
        if (c->I > r->maxw) r->maxw = c->I;
        if (QD > r->maxw) r->maxw = QD;
        r->rowbuf = malloc(sizeof(float) * (size_t)r->nthreads * r->maxw);
        r->off = malloc(sizeof(int) * ((size_t)ne + 1));
        r->cur = malloc(sizeof(int) * (size_t)ne);
        r->active = malloc(sizeof(int) * (size_t)ne);
        ok &= r->rowbuf && r->off && r->cur && r->active;
    }
    if (!ok) {
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

int cpu_step_check(const cpu_rank *r, const sm_step *s, const char *who, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const sm_kv *kv = s->kv;
    if (s->nrows < 0) return sm_errf(e, "%s: nrows %d is negative", who, s->nrows);
    if (s->nrows > 0 && (!s->tokens || !s->pos || !s->req || !kv))
        return sm_errf(e, "%s: tokens, pos, req and kv must all be given", who);
    if (s->naux < 0 || (s->naux > 0 && (!s->aux_layers || !s->aux)))
        return sm_errf(e, "%s: naux %d needs aux_layers and aux buffers", who, s->naux);
    for (int a = 0; a < s->naux; a++)
        if (s->aux_layers[a] < 0 || s->aux_layers[a] > c->L)
            return sm_errf(e, "%s: aux layer %d (entry %d) outside [0, %d]", who, s->aux_layers[a], a, c->L);
    for (int i = 0; i < s->nrows; i++) {
        int t = s->tokens[i], p = s->pos[i], q = s->req[i];
        if (t < 0 || t >= c->V) return sm_errf(e, "%s: row %d: token %d outside the vocabulary [0, %d)", who, i, t, c->V);
        if (q < 0 || q >= kv->max_req || !kv->live[q])
            return sm_errf(e, "%s: row %d: request %d is not a live kv cache slot", who, i, q);
        if (p < 0 || p >= kv->max_len || p >= r->max_len)
            return sm_errf(e, "%s: row %d: position %d outside [0, %d)", who, i, p,
                           kv->max_len < r->max_len ? kv->max_len : r->max_len);
        if (p / SM_KV_BLOCK >= kv->nblk[q])
            return sm_errf(e, "%s: row %d: position %d of request %d has no reserved cache page", who, i, p, q);
        const int *tb = kv->tables + (int64_t)q * kv->max_bpr;
        for (int b = 0; b <= p / SM_KV_BLOCK; b++)
            if (tb[b] < 0 || tb[b] >= r->nblocks)
                return sm_errf(e, "%s: row %d: request %d block %d maps to page %d outside [0, %d)", who, i, q, b, tb[b],
                               r->nblocks);
    }
    return 0;
}

/* ---------------------------------------------------------------- sharded products */

/* A bf16 matrix slice: y [n, m] = x [n, k] @ W^T with W row j at W + j*ldw, f32 not rounded
 * (each element one ref_dot, the sum of ops.c's mm). */
typedef struct pmm_job {
    cpu_rank *r;
    const float *x; int n, k;
    const uint16_t *W; int64_t ldw; int m;
    float *y;
} pmm_job;

static void pmm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const pmm_job *j = arg;
    float *wr = j->r->rowbuf + (int64_t)tid * j->r->maxw;
    for (int64_t o = lo; o < hi; o++) {
        const uint16_t *row = j->W + o * j->ldw;
        for (int t = 0; t < j->k; t++) wr[t] = sm_bf16_to_f32(row[t]);
        for (int i = 0; i < j->n; i++) j->y[(int64_t)i * j->m + o] = ref_dot(j->x + (int64_t)i * j->k, wr, j->k);
    }
}

/* Chunks of about 1/8 of a thread's share of m outputs, 1..64 (as ops.c's mm). */
static int64_t out_grain(const cpu_rank *r, int64_t m) {
    int64_t g = m / (8 * r->nthreads);
    return g < 1 ? 1 : g > 64 ? 64 : g;
}

static void part_mm(cpu_rank *r, const float *x, int n, int k, const uint16_t *W, int64_t ldw, int m, float *y) {
    pmm_job j = {r, x, n, k, W, ldw, m, y};
    sm_pool_for(r->pool, m, out_grain(r, m), pmm_chunk, &j);
}

/* Logits of this rank's vocabulary rows: lg [n, nv] from h [n, H]; softcapped, ids >=
 * vocab_used -> -inf (as ops.c's ref_logits_h). */
typedef struct lm_job { cpu_rank *r; const float *h; int n; float *lg; } lm_job;

static void lm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const lm_job *j = arg;
    cpu_rank *r = j->r;
    const sm_config *c = &r->m->cfg;
    int H = c->H, nv = r->sh.nv;
    float *wr = r->rowbuf + (int64_t)tid * r->maxw;
    for (int64_t v = lo; v < hi; v++) {
        float *lv = j->lg + v;
        if (r->sh.v0 + v >= c->vocab_used) {
            for (int i = 0; i < j->n; i++) lv[(int64_t)i * nv] = -INFINITY;
            continue;
        }
        /* raw = h . lm_head[v], f32; softcap c * tanh(raw * m_o / c) */
        const uint16_t *row = r->sh.lm_head + v * H;
        for (int t = 0; t < H; t++) wr[t] = sm_bf16_to_f32(row[t]);
        for (int i = 0; i < j->n; i++) {
            float x = ref_dot(j->h + (int64_t)i * H, wr, H) * c->out_mult;
            lv[(int64_t)i * nv] = c->softcap > 0.0f ? c->softcap * tanhf(x / c->softcap) : x;
        }
    }
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Expert FFN of this rank's slots, one local expert per task: gu = h1 . gate/up rows of its
 * slice, act = r16(silu(r16 gate) * r16 up), y[route] = act . down columns of its slice
 * (complete in EP, a partial sum over the I slice in TP; not rounded). */
typedef struct ex_job { cpu_rank *r; int l; } ex_job;

static void ex_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const ex_job *j = arg;
    cpu_rank *r = j->r;
    const sm_config *c = &r->m->cfg;
    const sm_shard_experts *X = &r->sh.layers[j->l].ex;
    int Hm = c->Hm, ni = X->ni, K = c->K;
    float *wr = r->rowbuf + (int64_t)tid * r->maxw;
    for (int64_t t = lo; t < hi; t++) {
        int le = r->active[t], s0 = r->off[le], s1 = r->off[le + 1];
        /* gate rows then up rows of the slice, each decoded once for all the expert's routes */
        for (int o = 0; o < 2 * ni; o++) {
            sm_shard_mat_row(X->fmt, o < ni ? &X->gate[le] : &X->up[le], o < ni ? o : o - ni, Hm, wr);
            for (int s = s0; s < s1; s++)
                r->gu[(int64_t)s * 2 * ni + o] = ref_dot(r->h1 + (int64_t)(r->slot_route[s] / K) * Hm, wr, Hm);
        }
        /* act = r16(silu(r16 gate) * r16 up) */
        for (int s = s0; s < s1; s++) {
            const float *gs = r->gu + (int64_t)s * 2 * ni;
            float *as = r->act + (int64_t)s * ni;
            for (int i = 0; i < ni; i++) {
                float gg = sm_r16(gs[i]), uu = sm_r16(gs[ni + i]);
                as[i] = sm_r16(gg * sigmoidf_(gg) * uu);
            }
        }
        /* y = act . down[:, slice], per route id */
        for (int o = 0; o < Hm; o++) {
            sm_shard_mat_row(X->fmt, &X->down[le], o, ni, wr);
            for (int s = s0; s < s1; s++)
                r->y[(int64_t)r->slot_route[s] * Hm + o] = ref_dot(r->act + (int64_t)s * ni, wr, ni);
        }
    }
}

/* Post-expert norm of one complete route output in place: t = r16(r16(y) * post_norm),
 * yn = t * rsqrt(mean(t^2) + post_eps) (as ops.c). */
static void expert_norm(const sm_config *c, const float *pn, float *y) {
    int Hm = c->Hm;
    for (int i = 0; i < Hm; i++) y[i] = sm_r16(sm_r16(y[i]) * pn[i]);
    float rs = 1.0f / sqrtf(ref_dot(y, y, Hm) / (float)Hm + c->post_eps);
    for (int i = 0; i < Hm; i++) y[i] *= rs;
}

/* TP finalize of rows [0, nr) whose routes' complete y are ys [nr*K, Hm] and weights
 * w [nr*K]: norm each route, m [nr, Hm] = r16(sum_k w_k yn_k) in route order. */
static void tp_finalize(const sm_config *c, const float *pn, float *ys, const float *w, int nr, float *m) {
    int K = c->K, Hm = c->Hm;
    for (int i = 0; i < nr; i++) {
        float *mi = m + (int64_t)i * Hm;
        for (int x = 0; x < Hm; x++) mi[x] = 0.0f;
        for (int k = 0; k < K; k++) {
            float *yn = ys + ((int64_t)i * K + k) * Hm;
            expert_norm(c, pn, yn);
            float wk = w[i * K + k];
            for (int x = 0; x < Hm; x++) mi[x] += wk * yn[x];
        }
        for (int x = 0; x < Hm; x++) mi[x] = sm_r16(mi[x]);
    }
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

/* f [n, H] = moe(xf) of layer l on a rank holding the whole model: ops.c's grouped MoE. */
static int moe_grouped(cpu_rank *r, int l, int n, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    if (ref_moe_ws_run(r->pool, r->m, l, r->xf, n, r->f, r->idx, r->rw, NULL, NULL, &r->ws, e))
        return sm_errprefix(e, "cpu step: layer %d", l);
    trace_routes(r, l, n);
    TRACE(CPU_TRACE_REP, l, "h1", r->ws.h1, n, c->Hm);
    TRACE(CPU_TRACE_REP, l, "m", r->ws.m, n, c->Hm);
    return 0;
}

/* f [n, H] = moe(xf) of layer l from this rank's experts (or expert slices), pooler and
 * unpooler rows, exchanging partials through the communicator. */
static int moe_sharded(cpu_rank *r, int l, int n, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const sm_shard_layer *SL = &r->sh.layers[l];
    const sm_layer *Ly = SL->full;
    const sm_shard_experts *X = &SL->ex;
    int E = c->E, K = c->K, Hm = c->Hm, ne = X->ne, e0 = X->e0;
    /* router logits (f32, replicated), top-K routes and weights per row */
    ref_mm_f32(r->pool, r->xf, n, c->H, Ly->router, E, r->rl);
    for (int i = 0; i < n; i++) ref_topk(c, r->rl + (int64_t)i * E, Ly->router_bias, r->idx + i * K, r->rw + i * K);
    trace_routes(r, l, n);
    /* h1 = r16(rms(mm(xf, pooler), pre_expert_norm)): this rank's pooler rows, gathered */
    ref_mm(r->pool, r->xf, n, c->H, SL->pooler, r->sh.np, r->hp);
    COMM(r->comm->ops->pooled_gather(r->comm, l, r->hp, n, r->sh.np, r->h1, e));
    ref_rms(r->h1, n, Hm, Ly->pre_expert_norm, c->rms_eps, 1, r->h1);
    TRACE(CPU_TRACE_REP, l, "h1", r->h1, n, Hm);
    /* this rank's routes grouped by local expert (counting sort: slots in route order) */
    for (int j = 0; j <= ne; j++) r->off[j] = 0;
    for (int q = 0; q < n * K; q++)
        if (r->idx[q] >= e0 && r->idx[q] < e0 + ne) r->off[r->idx[q] - e0 + 1]++;
    int nact = 0;
    for (int j = 0; j < ne; j++) {
        if (r->off[j + 1]) r->active[nact++] = j;
        r->off[j + 1] += r->off[j];
    }
    for (int j = 0; j < ne; j++) r->cur[j] = r->off[j];
    for (int q = 0; q < n * K; q++)
        if (r->idx[q] >= e0 && r->idx[q] < e0 + ne) r->slot_route[r->cur[r->idx[q] - e0]++] = q;
    /* expert FFN of the local slots: y per route (complete in EP, partial over I in TP) */
    ex_job xj = {r, l};
    sm_pool_for(r->pool, nact, 1, ex_chunk, &xj);
    if (r->sh.moe == SM_MOE_EP) {
        /* EP: norm and weight the local routes here; m partial = their sum in route order */
        for (int s = 0; s < r->off[ne]; s++) expert_norm(c, Ly->post_expert_norm, r->y + (int64_t)r->slot_route[s] * Hm);
        for (int i = 0; i < n; i++) {
            float *mi = r->mo + (int64_t)i * Hm;
            for (int x = 0; x < Hm; x++) mi[x] = 0.0f;
            for (int k = 0; k < K; k++) {
                int q = i * K + k;
                if (r->idx[q] < e0 || r->idx[q] >= e0 + ne) continue;
                const float *yn = r->y + (int64_t)q * Hm;
                float wk = r->rw[q];
                for (int x = 0; x < Hm; x++) mi[x] += wk * yn[x];
            }
        }
        /* expert partial sum over ranks (rank order), then r16 */
        COMM(r->comm->ops->expert_sum(r->comm, l, r->mo, n, Hm, e));
        for (int64_t t = 0; t < (int64_t)n * Hm; t++) r->mo[t] = sm_r16(r->mo[t]);
    } else if (n >= r->finalize_rows) {
        /* TP, token-sharded: reduce-scatter y by rows, finalize this rank's rows, all-gather m */
        int lo, hi;
        sm_shard_rows(n, r->sh.world, r->rank, &lo, &hi);
        COMM(r->comm->ops->expert_scatter(r->comm, l, r->y, n, K * Hm, r->ymine, e));
        tp_finalize(c, Ly->post_expert_norm, r->ymine, r->rw + lo * K, hi - lo, r->mmine);
        COMM(r->comm->ops->expert_gather(r->comm, l, r->mmine, n, Hm, r->mo, e));
    } else {
        /* TP: all-reduce every route's y partial (before the post-expert norm), finalize all rows */
        COMM(r->comm->ops->expert_sum(r->comm, l, r->y, n * K, Hm, e));
        tp_finalize(c, Ly->post_expert_norm, r->y, r->rw, n, r->mo);
    }
    TRACE(CPU_TRACE_REP, l, "m", r->mo, n, Hm);
    /* f = mm(m, unpooler): this rank's unpooler rows, gathered */
    ref_mm(r->pool, r->mo, n, Hm, SL->unpooler, r->sh.nu, r->fp);
    COMM(r->comm->ops->unpooled_gather(r->comm, l, r->fp, n, r->sh.nu, r->f, e));
    return 0;
}

/* ---------------------------------------------------------------- the step */

/* Attention job: one (row, local query head) per index. */
typedef struct att_job {
    cpu_rank *r;
    const sm_step *st;
    const uint16_t *kvl;  /* this layer's pages of this rank */
    int window;           /* 0: full attention */
    float scale;
} att_job;

static void att_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const att_job *j = arg;
    cpu_rank *r = j->r;
    const sm_config *c = &r->m->cfg;
    int nHl = r->sh.nHl, D = c->D, group = sm_config_group(c);
    for (int64_t t = lo; t < hi; t++) {
        int i = (int)(t / nHl), hl = (int)(t % nHl);
        const int *table = j->st->kv->tables + (int64_t)j->st->req[i] * j->st->kv->max_bpr;
        int64_t qo = (int64_t)i * nHl * D + (int64_t)hl * D;
        /* global head h0 + hl reads global KV head (h0 + hl) / group, local index minus kv0 */
        int kvh = (r->sh.h0 + hl) / group - r->sh.kv0;
        ref_attention_head(r->q + qo, r->sh.nKVl, kvh, D, j->kvl, table, j->st->pos[i], j->window, j->scale,
                           r->scores + (int64_t)tid * r->max_len, r->o + qo);
    }
}

/* s = alpha * s + beta * r16(rms(b, -, post_eps)) per row (b is overwritten). */
static void residual_gate(const sm_config *c, float *s, float *b, int n, const float *alpha, const float *beta) {
    int H = c->H;
    ref_rms(b, n, H, NULL, c->post_eps, 1, b);
    for (int i = 0; i < n; i++)
        for (int x = 0; x < H; x++) {
            int64_t o = (int64_t)i * H + x;
            s[o] = alpha[x] * s[o] + beta[x] * b[o];
        }
}

static void put_aux(const cpu_rank *r, const sm_step *st, int j) {
    if (r->rank != 0) return;
    int H = r->m->cfg.H;
    for (int a = 0; a < st->naux; a++)
        if (st->aux_layers[a] == j) memcpy(st->aux + (int64_t)a * st->nrows * H, r->s, sizeof(float) * (size_t)st->nrows * H);
}

/* Every row writes its K (normed, roped) and V of the local KV heads at its slot, bf16. */
static void kv_insert(cpu_rank *r, const sm_step *st, uint16_t *kvl) {
    int D = r->m->cfg.D, nKVl = r->sh.nKVl, KD = nKVl * D;
    for (int i = 0; i < st->nrows; i++) {
        const int *tb = st->kv->tables + (int64_t)st->req[i] * st->kv->max_bpr;
        int p = st->pos[i];
        int64_t page = tb[p / SM_KV_BLOCK];
        for (int h = 0; h < nKVl; h++) {
            uint16_t *dst = kvl + ((page * nKVl + h) * SM_KV_BLOCK + p % SM_KV_BLOCK) * 2 * D;
            const float *kr = r->k + (int64_t)i * KD + (int64_t)h * D;
            const float *vr = r->v + (int64_t)i * KD + (int64_t)h * D;
            for (int d = 0; d < D; d++) {
                dst[d] = sm_f32_to_bf16(kr[d]);
                dst[D + d] = sm_f32_to_bf16(vr[d]);
            }
        }
    }
}

/* Logits, greedy ids and the step's outputs from h = r->x [n, H]. */
static int rank_logits(cpu_rank *r, const sm_step *st, sm_err *e) {
    const sm_config *c = &r->m->cfg;
    const sm_shard *sh = &r->sh;
    int n = st->nrows;
    /* logits of this rank's vocabulary rows (grouped: the whole vocabulary, straight into the
     * caller's buffer when it gave one); gathered into the caller's buffer on rank 0 */
    float *lg = r->kern == CPU_KERNELS_GROUPED && st->logits ? st->logits : r->lg;
    if (r->kern == CPU_KERNELS_GROUPED) {
        ref_logits_h(r->pool, r->m, r->x, n, lg, NULL);
    } else {
        lm_job lj = {r, r->x, n, lg};
        sm_pool_for(r->pool, sh->nv, out_grain(r, sh->nv), lm_chunk, &lj);
    }
    if (st->logits) COMM(r->comm->ops->vocab_gather(r->comm, lg, n, sh->nv, r->rank == 0 ? st->logits : NULL, e));
    /* greedy: this rank's first maximum among ids < vocab_used, then the first over ranks */
    int vend = c->vocab_used - sh->v0 < sh->nv ? c->vocab_used - sh->v0 : sh->nv;
    for (int i = 0; i < n; i++) {
        const float *li = lg + (int64_t)i * sh->nv;
        int best = vend > 0 ? ref_argmax_row(li, vend) : -1;
        r->best_id[i] = vend <= 0 ? -1 : best < 0 ? -2 : sh->v0 + best; /* -2: a NaN or Inf here */
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
    int n = st->nrows;
    if (rank_reserve(r, n, e)) return -1;
    int H = c->H, D = c->D, nHl = sh->nHl, nKVl = sh->nKVl, QD = nHl * D, KD = nKVl * D;
    int64_t layer_elems = (int64_t)r->nblocks * nKVl * SM_KV_BLOCK * 2 * D;

    /* embedding rows of this rank's vocabulary block (zeros elsewhere), gathered from owners */
    for (int i = 0; i < n; i++) {
        float *si = r->s + (int64_t)i * H;
        int t = st->tokens[i] - sh->v0;
        if (t >= 0 && t < sh->nv)
            for (int x = 0; x < H; x++) si[x] = sm_bf16_to_f32(sh->embed[(int64_t)t * H + x]);
        else
            memset(si, 0, sizeof(float) * (size_t)H);
    }
    COMM(r->comm->ops->embed_gather(r->comm, st->tokens, n, H, sh->nv, r->s, e));
    /* s = r16(rms(embed[tok], -, eps)): weightless embedding norm */
    ref_rms(r->s, n, H, NULL, c->rms_eps, 1, r->s);
    put_aux(r, st, 0);
    TRACE(CPU_TRACE_REP, -1, "s", r->s, n, H);
    /* x = r16(rms(s, eff(input_layernorm_0))) */
    ref_rms(r->s, n, H, m->layers[0].in_norm, c->rms_eps, 1, r->x);
    TRACE(CPU_TRACE_REP, 0, "x", r->x, n, H);

    for (int l = 0; l < c->L; l++) {
        const sm_shard_layer *SL = &sh->layers[l];
        const sm_layer *Ly = SL->full;
        uint16_t *kvl = r->kvp + (int64_t)l * layer_elems;
        /* q, k, v, gate projections of this rank's heads */
        ref_mm(r->pool, r->x, n, H, SL->wq, QD, r->q);
        ref_mm(r->pool, r->x, n, H, SL->wk, KD, r->k);
        ref_mm(r->pool, r->x, n, H, SL->wv, KD, r->v);
        ref_mm(r->pool, r->x, n, H, SL->wg, QD, r->g);
        TRACE(CPU_TRACE_LOCAL, l, "q", r->q, n, QD);
        TRACE(CPU_TRACE_LOCAL, l, "k", r->k, n, KD);
        TRACE(CPU_TRACE_LOCAL, l, "v", r->v, n, KD);
        TRACE(CPU_TRACE_LOCAL, l, "g", r->g, n, QD);
        /* per-head QK rms norm (weightless), r16 */
        ref_rms(r->q, n * nHl, D, NULL, c->rms_eps, 1, r->q);
        ref_rms(r->k, n * nKVl, D, NULL, c->rms_eps, 1, r->k);
        /* RoPE on sliding layers only (full layers are NoPE) */
        if (!Ly->full)
            for (int i = 0; i < n; i++) {
                ref_rope(r->q + (int64_t)i * QD, nHl, D, st->pos[i], c->rope_theta);
                ref_rope(r->k + (int64_t)i * KD, nKVl, D, st->pos[i], c->rope_theta);
            }
        TRACE(CPU_TRACE_LOCAL, l, "qn", r->q, n, QD);
        TRACE(CPU_TRACE_LOCAL, l, "kn", r->k, n, KD);
        /* every row writes K and V before any row attends */
        kv_insert(r, st, kvl);
        /* paged attention of the local heads, one (row, head) per task, f32 */
        att_job aj = {r, st, kvl, Ly->full ? 0 : c->window, c->qk_scale_factor / sqrtf((float)D)};
        sm_pool_for(r->pool, (int64_t)n * nHl, 1, att_chunk, &aj);
        TRACE(CPU_TRACE_LOCAL, l, "att", r->o, n, QD);
        /* o = r16(rms_per_head(o) * sigmoid(g)) */
        ref_rms(r->o, n * nHl, D, NULL, c->rms_eps, 0, r->o);
        for (int64_t t = 0; t < (int64_t)n * QD; t++) r->o[t] = sm_r16(r->o[t] * (1.0f / (1.0f + expf(-r->g[t]))));
        TRACE(CPU_TRACE_LOCAL, l, "o", r->o, n, QD);
        /* a = r16(sum over ranks of o_local @ Wo[:, local columns]^T), partials in rank order
         * (grouped: one rank holds every column, so ref_mm's rounded product is the sum) */
        if (r->kern == CPU_KERNELS_GROUPED) ref_mm(r->pool, r->o, n, QD, SL->wo, H, r->a);
        else part_mm(r, r->o, n, QD, SL->wo, SL->ld_wo, H, r->a);
        COMM(r->comm->ops->attn_sum(r->comm, l, r->a, n, H, e));
        for (int64_t t = 0; t < (int64_t)n * H; t++) r->a[t] = sm_r16(r->a[t]);
        TRACE(CPU_TRACE_REP, l, "a", r->a, n, H);
        /* post-attention boundary: s = alpha * s + beta * r16(rms(a, -, 1e-8)) */
        residual_gate(c, r->s, r->a, n, Ly->att_alpha, Ly->att_beta);
        TRACE(CPU_TRACE_REP, l, "s_att", r->s, n, H);
        /* xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
        ref_rms(r->s, n, H, Ly->pre_ffn_norm, c->rms_eps, 1, r->xf);
        TRACE(CPU_TRACE_REP, l, "xf", r->xf, n, H);
        /* MoE branch */
        if ((r->kern == CPU_KERNELS_GROUPED ? moe_grouped : moe_sharded)(r, l, n, e)) return -1;
        TRACE(CPU_TRACE_REP, l, "f", r->f, n, H);
        /* post-FFN boundary: t = r16(f * eff(post_ffn)); s = alpha * s + beta * r16(rms(t, -, 1e-8)) */
        for (int64_t t = 0; t < (int64_t)n * H; t++) r->a[t] = sm_r16(r->f[t] * Ly->post_ffn_norm[t % H]);
        residual_gate(c, r->s, r->a, n, Ly->ffn_alpha, Ly->ffn_beta);
        put_aux(r, st, l + 1);
        TRACE(CPU_TRACE_REP, l, "s_ffn", r->s, n, H);
        /* next layer's input norm */
        if (l < c->L - 1) {
            ref_rms(r->s, n, H, m->layers[l + 1].in_norm, c->rms_eps, 1, r->x);
            TRACE(CPU_TRACE_REP, l + 1, "x", r->x, n, H);
        }
    }
    /* final norm of r16(s) (weight as is) */
    for (int64_t t = 0; t < (int64_t)n * H; t++) r->x[t] = sm_r16(r->s[t]);
    ref_rms(r->x, n, H, m->final_norm, c->rms_eps, 1, r->x);
    TRACE(CPU_TRACE_REP, c->L, "h", r->x, n, H);
    return rank_logits(r, st, e);
}
