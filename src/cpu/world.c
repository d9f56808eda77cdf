/* world.c: the CPU world backend: W rank threads, each running the layer loop of SPEC.md
 * section 4 on its shard (shard.h) and exchanging partial results through comm.h (SPEC.md
 * section 9).  It is the oracle of multi-GPU tensor + expert parallelism.
 *
 * Per layer, rank r: q/k/v/gate rows of its heads -> QK norm, RoPE, K/V into its own pages
 * (its KV heads only) -> attention of its heads -> output gate -> o_proj partial over its
 * heads' columns -> attn_sum (rank-ordered) -> r16 -> replicated residual boundary, pre-FFN
 * norm, router and top-K -> pooler rows -> pooled_gather -> pre-expert norm -> experts: EP,
 * whole routes of its experts, normed and weighted, partial m per row -> expert_sum; TP, every
 * route over its slice of I, partial y -> expert_sum (or, for steps of >= finalize_rows rows,
 * expert_scatter -> norm + weight + sum of its token rows -> expert_gather) -> r16(m) ->
 * unpooler rows -> unpooled_gather -> replicated FFN boundary.  Embedding and lm_head are
 * vocabulary-sharded (embed_gather, vocab_gather, vocab_argmax).
 * Every replicated value is computed by the same code from bit-identical inputs, and every
 * cross-rank sum adds ranks in rank order, so replicated state is bit-identical on all ranks.
 * Each local product is the same fixed-order dot as ops.c (ref_dot over the decoded row), so
 * with W = 1 this backend reproduces the single-rank backend bit for bit.
 * The caller's thread hands a step to the W rank threads and waits; rank 0 writes the
 * outputs.  A rank that fails aborts the communicator, so its peers fail instead of waiting.
 * We rejected running the ranks one after another on one thread (no real concurrency: the
 * arrival-order and deadlock behaviour a GPU deployment has would never be exercised), and
 * one process per rank (the reference needs no isolation, and tests want one address space).
 */
#include "backend.h"
#include "comm.h"
#include "shard.h"
#include "codec.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORLD_FINALIZE_ROWS 64 /* TP: steps of at least this many rows finalize token-sharded */

typedef struct world_ctx world_ctx;

typedef struct rank_ctx {
    world_ctx *w;
    int rank;
    sm_shard sh;                 /* this rank's views of the model */
    sm_comm *comm;               /* this rank's communicator handle */
    sm_pool *pool;               /* this rank's helper threads, NULL = its own thread only */
    int nthreads;                /* threads working for this rank (1 without a pool) */
    uint16_t *kvp;               /* [L, nblocks, nKVl, 16, 2D] bf16 pages of this rank's KV heads */
    int cap;                     /* rows the activation buffers hold */
    float *s, *x, *a, *xf, *f;   /* [cap, H] residual, normed input, attention out, MoE in, MoE out */
    float *q, *g, *o;            /* [cap, nHl*D] local query heads, gates, attention outputs */
    float *k, *v;                /* [cap, nKVl*D] local K, V */
    float *rl;                   /* [cap, E] router logits */
    int *idx;                    /* [cap, K] routes */
    float *rw;                   /* [cap, K] route weights */
    float *hp;                   /* [cap, np] this rank's pooler rows */
    float *h1;                   /* [cap, Hm] pooled, normed expert input */
    float *m;                    /* [cap, Hm] weighted route sum */
    float *fp;                   /* [cap, nu] this rank's unpooler rows */
    float *gu;                   /* [cap*K, 2*ni] gate | up outputs by slot */
    float *act;                  /* [cap*K, ni] silu(gate) * up by slot */
    float *y;                    /* [cap*K, Hm] down outputs by route id (row*K + k) */
    float *ymine;                /* [cap*K, Hm] token-sharded finalize: this rank's routes, summed */
    float *mmine;                /* [cap, Hm] token-sharded finalize: this rank's rows of m */
    int *off;                    /* [ne + 1] first slot of each local expert */
    int *cur;                    /* [ne] placement cursor */
    int *active;                 /* [ne] local experts with routes */
    int *slot_route;             /* [cap*K] route id of each slot */
    float *lg;                   /* [cap, nv] logits of this rank's vocabulary rows */
    float *best;                 /* [cap] this rank's best logit per row */
    int *best_id, *am;           /* [cap] its id (-1: none); the global argmax */
    float *tr;                   /* [cap*K] route ids / argmax as floats for the trace */
    int maxw;                    /* floats of one decoded weight row */
    float *rowbuf;               /* [nthreads, maxw] decoded weight rows per thread */
    float *scores;               /* [nthreads, max_len] attention score scratch per thread */
    sm_err err;                  /* this rank's error of the last step */
    int failed;                  /* 1: the last step failed on this rank */
} rank_ctx;

struct world_ctx {
    const sm_model *m;
    int W;                       /* ranks */
    sm_moe_layout moe;           /* expert layout */
    int nblocks, max_len;        /* KV pages per layer, positions per request */
    int finalize_rows;           /* TP token-sharded finalize from this many rows */
    sm_comm_cpu *cw;             /* the communicator */
    rank_ctx *rk;                /* [W] */
    pthread_t *th;               /* [W] rank threads */
    int nth;                     /* rank threads started */
    pthread_mutex_t mu;
    pthread_cond_t go, done;     /* go: a new step or stop; done: a rank finished */
    uint64_t gen;                /* step generation, under mu */
    int pending;                 /* ranks still in the step, under mu */
    int stop;                    /* shut down, under mu */
    const sm_step *st;           /* the current step */
    sm_world_trace_fn trace;     /* debug hook of replicated stages, or NULL */
    void *trace_arg;
};

#define TRACE(layer, name, ptr, n, width) \
    do { if (w->trace) w->trace(w->trace_arg, r->rank, (layer), (name), (ptr), (n), (width)); } while (0)

/* Run a comm call; its error already names the operation, layer and rank. */
#define COMM(call) do { if ((call) != 0) return -1; } while (0)

/* ---------------------------------------------------------------- buffers */

static void rank_free_rows(rank_ctx *r) {
#define FREE(ptr) do { free(ptr); (ptr) = NULL; } while (0)
    FREE(r->s); FREE(r->x); FREE(r->a); FREE(r->xf); FREE(r->f); FREE(r->q); FREE(r->g); FREE(r->o);
    FREE(r->k); FREE(r->v); FREE(r->rl); FREE(r->idx); FREE(r->rw); FREE(r->hp); FREE(r->h1); FREE(r->m);
    FREE(r->fp); FREE(r->gu); FREE(r->act); FREE(r->y); FREE(r->ymine); FREE(r->mmine); FREE(r->slot_route);
    FREE(r->lg); FREE(r->best); FREE(r->best_id); FREE(r->am); FREE(r->tr);
#undef FREE
    r->cap = 0;
}

/* Size the activation buffers for n rows. */
static int rank_reserve(rank_ctx *r, int n, sm_err *e) {
    if (n <= r->cap) return 0;
    const sm_config *c = &r->w->m->cfg;
    const sm_shard *sh = &r->sh;
    rank_free_rows(r);
    size_t R = (size_t)n, RK = R * (size_t)c->K, H = (size_t)c->H, Hm = (size_t)c->Hm;
    size_t QD = (size_t)sh->nHl * c->D, KD = (size_t)sh->nKVl * c->D, ni = (size_t)sh->layers[0].ex.ni;
    int ok = 1;
#define ALLOC(ptr, cnt) ok &= ((ptr) = malloc(sizeof *(ptr) * (cnt))) != NULL
    ALLOC(r->s, R * H); ALLOC(r->x, R * H); ALLOC(r->a, R * H); ALLOC(r->xf, R * H); ALLOC(r->f, R * H);
    ALLOC(r->q, R * QD); ALLOC(r->g, R * QD); ALLOC(r->o, R * QD); ALLOC(r->k, R * KD); ALLOC(r->v, R * KD);
    ALLOC(r->rl, R * (size_t)c->E); ALLOC(r->idx, RK); ALLOC(r->rw, RK);
    ALLOC(r->hp, R * (size_t)sh->np); ALLOC(r->h1, R * Hm); ALLOC(r->m, R * Hm); ALLOC(r->fp, R * (size_t)sh->nu);
    ALLOC(r->gu, RK * 2 * ni); ALLOC(r->act, RK * ni); ALLOC(r->y, RK * Hm); ALLOC(r->ymine, RK * Hm);
    ALLOC(r->mmine, R * Hm); ALLOC(r->slot_route, RK);
    ALLOC(r->lg, R * (size_t)sh->nv); ALLOC(r->best, R); ALLOC(r->best_id, R); ALLOC(r->am, R); ALLOC(r->tr, RK);
#undef ALLOC
    if (!ok) {
        rank_free_rows(r);
        return sm_errf(e, "cpu world rank %d: out of memory for the activations of %d rows", r->rank, n);
    }
    r->cap = n;
    return 0;
}

static void rank_destroy(rank_ctx *r) {
    rank_free_rows(r);
    free(r->off); free(r->cur); free(r->active);
    free(r->rowbuf); free(r->scores); free(r->kvp);
    sm_pool_destroy(r->pool);
    sm_shard_free(&r->sh);
}

/* ---------------------------------------------------------------- local products */

/* A bf16 matrix slice: y [n, m] = x [n, k] @ W^T with W row j at W + j*ldw, f32 not rounded
 * (each element one ref_dot, the sum of ops.c's mm). */
typedef struct pmm_job {
    rank_ctx *r;
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

static void part_mm(rank_ctx *r, const float *x, int n, int k, const uint16_t *W, int64_t ldw, int m, float *y) {
    pmm_job j = {r, x, n, k, W, ldw, m, y};
    int64_t g = m / (8 * r->nthreads);
    sm_pool_for(r->pool, m, g < 1 ? 1 : g > 64 ? 64 : g, pmm_chunk, &j);
}

/* Logits of this rank's vocabulary rows: lg [n, nv] from h [n, H]; softcapped, ids >=
 * vocab_used -> -inf (as ops.c's ref_logits_h). */
typedef struct lm_job { rank_ctx *r; const float *h; int n; } lm_job;

static void lm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const lm_job *j = arg;
    rank_ctx *r = j->r;
    const sm_config *c = &r->w->m->cfg;
    int H = c->H, nv = r->sh.nv;
    float *wr = r->rowbuf + (int64_t)tid * r->maxw;
    for (int64_t v = lo; v < hi; v++) {
        float *lv = r->lg + v;
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
typedef struct ex_job { rank_ctx *r; int l; } ex_job;

static void ex_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const ex_job *j = arg;
    rank_ctx *r = j->r;
    const sm_config *c = &r->w->m->cfg;
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

/* ---------------------------------------------------------------- the rank's MoE branch */

static int rank_moe(rank_ctx *r, int l, int n, sm_err *e) {
    world_ctx *w = r->w;
    const sm_config *c = &w->m->cfg;
    const sm_shard_layer *SL = &r->sh.layers[l];
    const sm_layer *Ly = SL->full;
    const sm_shard_experts *X = &SL->ex;
    int E = c->E, K = c->K, Hm = c->Hm, ne = X->ne, e0 = X->e0;
    /* router logits (f32, replicated), top-K routes and weights per row */
    ref_mm_f32(r->pool, r->xf, n, c->H, Ly->router, E, r->rl);
    for (int i = 0; i < n; i++) ref_topk(c, r->rl + (int64_t)i * E, Ly->router_bias, r->idx + i * K, r->rw + i * K);
    if (w->trace) {
        for (int i = 0; i < n * K; i++) r->tr[i] = (float)r->idx[i];
        TRACE(l, "route_idx", r->tr, n, K);
        TRACE(l, "route_w", r->rw, n, K);
    }
    /* h1 = r16(rms(mm(xf, pooler), pre_expert_norm)): this rank's pooler rows, gathered */
    ref_mm(r->pool, r->xf, n, c->H, SL->pooler, r->sh.np, r->hp);
    COMM(r->comm->ops->pooled_gather(r->comm, l, r->hp, n, r->sh.np, r->h1, e));
    ref_rms(r->h1, n, Hm, Ly->pre_expert_norm, c->rms_eps, 1, r->h1);
    TRACE(l, "h1", r->h1, n, Hm);
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
    if (w->moe == SM_MOE_EP) {
        /* EP: norm and weight the local routes here; m partial = their sum in route order */
        for (int s = 0; s < r->off[ne]; s++) expert_norm(c, Ly->post_expert_norm, r->y + (int64_t)r->slot_route[s] * Hm);
        for (int i = 0; i < n; i++) {
            float *mi = r->m + (int64_t)i * Hm;
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
        COMM(r->comm->ops->expert_sum(r->comm, l, r->m, n, Hm, e));
        for (int64_t t = 0; t < (int64_t)n * Hm; t++) r->m[t] = sm_r16(r->m[t]);
    } else if (n >= w->finalize_rows) {
        /* TP, token-sharded: reduce-scatter y by rows, finalize this rank's rows, all-gather m */
        int lo, hi;
        sm_shard_rows(n, w->W, r->rank, &lo, &hi);
        COMM(r->comm->ops->expert_scatter(r->comm, l, r->y, n, K * Hm, r->ymine, e));
        tp_finalize(c, Ly->post_expert_norm, r->ymine, r->rw + lo * K, hi - lo, r->mmine);
        COMM(r->comm->ops->expert_gather(r->comm, l, r->mmine, n, Hm, r->m, e));
    } else {
        /* TP: all-reduce every route's y partial (before the post-expert norm), finalize all rows */
        COMM(r->comm->ops->expert_sum(r->comm, l, r->y, n * K, Hm, e));
        tp_finalize(c, Ly->post_expert_norm, r->y, r->rw, n, r->m);
    }
    TRACE(l, "m", r->m, n, Hm);
    /* f = mm(m, unpooler): this rank's unpooler rows, gathered */
    ref_mm(r->pool, r->m, n, Hm, SL->unpooler, r->sh.nu, r->fp);
    COMM(r->comm->ops->unpooled_gather(r->comm, l, r->fp, n, r->sh.nu, r->f, e));
    return 0;
}

/* ---------------------------------------------------------------- the rank's step */

/* Attention job: one (row, local query head) per index. */
typedef struct att_job {
    rank_ctx *r;
    const sm_step *st;
    const uint16_t *kvl;  /* this layer's pages of this rank */
    int window;           /* 0: full attention */
    float scale;
} att_job;

static void att_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const att_job *j = arg;
    rank_ctx *r = j->r;
    const sm_config *c = &r->w->m->cfg;
    int nHl = r->sh.nHl, D = c->D, group = sm_config_group(c);
    for (int64_t t = lo; t < hi; t++) {
        int i = (int)(t / nHl), hl = (int)(t % nHl);
        const int *table = j->st->kv->tables + (int64_t)j->st->req[i] * j->st->kv->max_bpr;
        int64_t qo = (int64_t)i * nHl * D + (int64_t)hl * D;
        /* global head h0 + hl reads global KV head (h0 + hl) / group, local index minus kv0 */
        int kvh = (r->sh.h0 + hl) / group - r->sh.kv0;
        ref_attention_head(r->q + qo, r->sh.nKVl, kvh, D, j->kvl, table, j->st->pos[i], j->window, j->scale,
                           r->scores + (int64_t)tid * r->w->max_len, r->o + qo);
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

static void put_aux(const rank_ctx *r, const sm_step *st, int j) {
    if (r->rank != 0) return;
    int H = r->w->m->cfg.H;
    for (int a = 0; a < st->naux; a++)
        if (st->aux_layers[a] == j) memcpy(st->aux + (int64_t)a * st->nrows * H, r->s, sizeof(float) * (size_t)st->nrows * H);
}

static int rank_step(rank_ctx *r, const sm_step *st, sm_err *e) {
    world_ctx *w = r->w;
    const sm_model *m = w->m;
    const sm_config *c = &m->cfg;
    const sm_shard *sh = &r->sh;
    int n = st->nrows;
    if (rank_reserve(r, n, e)) return -1;
    int H = c->H, D = c->D, nHl = sh->nHl, nKVl = sh->nKVl, QD = nHl * D, KD = nKVl * D;
    int64_t layer_elems = (int64_t)w->nblocks * nKVl * SM_KV_BLOCK * 2 * D;

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
    TRACE(-1, "s", r->s, n, H);
    /* x = r16(rms(s, eff(input_layernorm_0))) */
    ref_rms(r->s, n, H, m->layers[0].in_norm, c->rms_eps, 1, r->x);
    TRACE(0, "x", r->x, n, H);

    for (int l = 0; l < c->L; l++) {
        const sm_shard_layer *SL = &sh->layers[l];
        const sm_layer *Ly = SL->full;
        uint16_t *kvl = r->kvp + (int64_t)l * layer_elems;
        /* q, k, v, gate projections of this rank's heads */
        ref_mm(r->pool, r->x, n, H, SL->wq, QD, r->q);
        ref_mm(r->pool, r->x, n, H, SL->wk, KD, r->k);
        ref_mm(r->pool, r->x, n, H, SL->wv, KD, r->v);
        ref_mm(r->pool, r->x, n, H, SL->wg, QD, r->g);
        /* per-head QK rms norm (weightless), r16 */
        ref_rms(r->q, n * nHl, D, NULL, c->rms_eps, 1, r->q);
        ref_rms(r->k, n * nKVl, D, NULL, c->rms_eps, 1, r->k);
        /* RoPE on sliding layers only */
        if (!Ly->full)
            for (int i = 0; i < n; i++) {
                ref_rope(r->q + (int64_t)i * QD, nHl, D, st->pos[i], c->rope_theta);
                ref_rope(r->k + (int64_t)i * KD, nKVl, D, st->pos[i], c->rope_theta);
            }
        /* every row writes its K (normed, roped) and V of the local KV heads before any row attends */
        for (int i = 0; i < n; i++) {
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
        /* paged attention of the local heads, f32 */
        att_job aj = {r, st, kvl, Ly->full ? 0 : c->window, c->qk_scale_factor / sqrtf((float)D)};
        sm_pool_for(r->pool, (int64_t)n * nHl, 1, att_chunk, &aj);
        /* o = r16(rms_per_head(o) * sigmoid(g)) */
        ref_rms(r->o, n * nHl, D, NULL, c->rms_eps, 0, r->o);
        for (int64_t t = 0; t < (int64_t)n * QD; t++) r->o[t] = sm_r16(r->o[t] * (1.0f / (1.0f + expf(-r->g[t]))));
        /* a = r16(sum over ranks of o_local @ Wo[:, local columns]^T), partials in rank order */
        part_mm(r, r->o, n, QD, SL->wo, SL->ld_wo, H, r->a);
        COMM(r->comm->ops->attn_sum(r->comm, l, r->a, n, H, e));
        for (int64_t t = 0; t < (int64_t)n * H; t++) r->a[t] = sm_r16(r->a[t]);
        TRACE(l, "a", r->a, n, H);
        /* post-attention boundary: s = alpha * s + beta * r16(rms(a, -, 1e-8)) */
        residual_gate(c, r->s, r->a, n, Ly->att_alpha, Ly->att_beta);
        TRACE(l, "s_att", r->s, n, H);
        /* xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
        ref_rms(r->s, n, H, Ly->pre_ffn_norm, c->rms_eps, 1, r->xf);
        TRACE(l, "xf", r->xf, n, H);
        /* MoE branch */
        if (rank_moe(r, l, n, e)) return -1;
        TRACE(l, "f", r->f, n, H);
        /* post-FFN boundary: t = r16(f * eff(post_ffn)); s = alpha * s + beta * r16(rms(t, -, 1e-8)) */
        for (int64_t t = 0; t < (int64_t)n * H; t++) r->a[t] = sm_r16(r->f[t] * Ly->post_ffn_norm[t % H]);
        residual_gate(c, r->s, r->a, n, Ly->ffn_alpha, Ly->ffn_beta);
        put_aux(r, st, l + 1);
        TRACE(l, "s_ffn", r->s, n, H);
        /* next layer's input norm */
        if (l < c->L - 1) {
            ref_rms(r->s, n, H, m->layers[l + 1].in_norm, c->rms_eps, 1, r->x);
            TRACE(l + 1, "x", r->x, n, H);
        }
    }
    /* final norm of r16(s) (weight as is) */
    for (int64_t t = 0; t < (int64_t)n * H; t++) r->x[t] = sm_r16(r->s[t]);
    ref_rms(r->x, n, H, m->final_norm, c->rms_eps, 1, r->x);
    TRACE(c->L, "h", r->x, n, H);
    /* logits of this rank's vocabulary rows; gathered into the caller's buffer on rank 0 */
    lm_job lj = {r, r->x, n};
    int64_t g = sh->nv / (8 * r->nthreads);
    sm_pool_for(r->pool, sh->nv, g < 1 ? 1 : g > 64 ? 64 : g, lm_chunk, &lj);
    if (st->logits) COMM(r->comm->ops->vocab_gather(r->comm, r->lg, n, sh->nv, r->rank == 0 ? st->logits : NULL, e));
    /* greedy: this rank's first maximum among ids < vocab_used, then the first over ranks */
    int vend = c->vocab_used - sh->v0 < sh->nv ? c->vocab_used - sh->v0 : sh->nv;
    for (int i = 0; i < n; i++) {
        const float *li = r->lg + (int64_t)i * sh->nv;
        int best = -1;
        for (int v = 0; v < vend; v++)
            if (best < 0 || li[v] > li[best]) best = v;
        r->best_id[i] = best < 0 ? -1 : sh->v0 + best;
        r->best[i] = best < 0 ? -INFINITY : li[best];
    }
    COMM(r->comm->ops->vocab_argmax(r->comm, r->best, r->best_id, n, r->am, e));
    if (w->trace) {
        for (int i = 0; i < n; i++) r->tr[i] = (float)r->am[i];
        TRACE(c->L, "argmax", r->tr, n, 1);
    }
    if (r->rank == 0 && st->argmax) memcpy(st->argmax, r->am, sizeof(int) * (size_t)n);
    return 0;
}

/* ---------------------------------------------------------------- threads, step, create */

static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    world_ctx *w = r->w;
    uint64_t seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && w->gen == seen) pthread_cond_wait(&w->go, &w->mu);
        if (w->stop) break;
        seen = w->gen;
        const sm_step *st = w->st;
        pthread_mutex_unlock(&w->mu);
        r->err.msg[0] = 0;
        r->failed = rank_step(r, st, &r->err) != 0;
        /* a failed rank fails its peers' pending and later calls instead of leaving them waiting */
        if (r->failed) r->comm->ops->abort(r->comm, r->err.msg);
        pthread_mutex_lock(&w->mu);
        if (--w->pending == 0) pthread_cond_signal(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Check every row of the step against the model and the cache before any rank starts. */
static int check_step(const world_ctx *w, const sm_step *s, sm_err *e) {
    const sm_config *c = &w->m->cfg;
    const sm_kv *kv = s->kv;
    if (s->nrows < 0) return sm_errf(e, "cpu world step: nrows %d is negative", s->nrows);
    if (s->nrows > 0 && (!s->tokens || !s->pos || !s->req || !kv))
        return sm_errf(e, "cpu world step: tokens, pos, req and kv must all be given");
    if (s->naux < 0 || (s->naux > 0 && (!s->aux_layers || !s->aux)))
        return sm_errf(e, "cpu world step: naux %d needs aux_layers and aux buffers", s->naux);
    for (int a = 0; a < s->naux; a++)
        if (s->aux_layers[a] < 0 || s->aux_layers[a] > c->L)
            return sm_errf(e, "cpu world step: aux layer %d (entry %d) outside [0, %d]", s->aux_layers[a], a, c->L);
    for (int i = 0; i < s->nrows; i++) {
        int t = s->tokens[i], p = s->pos[i], q = s->req[i];
        if (t < 0 || t >= c->V) return sm_errf(e, "cpu world step: row %d: token %d outside the vocabulary [0, %d)", i, t, c->V);
        if (q < 0 || q >= kv->max_req || !kv->live[q])
            return sm_errf(e, "cpu world step: row %d: request %d is not a live kv cache slot", i, q);
        if (p < 0 || p >= kv->max_len || p >= w->max_len)
            return sm_errf(e, "cpu world step: row %d: position %d outside [0, %d)", i, p,
                           kv->max_len < w->max_len ? kv->max_len : w->max_len);
        if (p / SM_KV_BLOCK >= kv->nblk[q])
            return sm_errf(e, "cpu world step: row %d: position %d of request %d has no reserved cache page", i, p, q);
        const int *tb = kv->tables + (int64_t)q * kv->max_bpr;
        for (int b = 0; b <= p / SM_KV_BLOCK; b++)
            if (tb[b] < 0 || tb[b] >= w->nblocks)
                return sm_errf(e, "cpu world step: row %d: request %d block %d maps to page %d outside [0, %d)", i, q, b,
                               tb[b], w->nblocks);
    }
    return 0;
}

static int world_step(void *vctx, const sm_step *s, sm_err *e) {
    world_ctx *w = vctx;
    if (check_step(w, s, e)) return -1;
    if (s->nrows == 0) return 0;
    /* hand the step to every rank thread and wait for all of them */
    pthread_mutex_lock(&w->mu);
    w->st = s;
    w->pending = w->W;
    w->gen++;
    pthread_cond_broadcast(&w->go);
    while (w->pending > 0) pthread_cond_wait(&w->done, &w->mu);
    w->st = NULL;
    pthread_mutex_unlock(&w->mu);
    /* report the rank that failed first (the others failed because it aborted) */
    int who = -1;
    char msg[512] = "";
    int aborted = sm_comm_cpu_reset(w->cw, &who, msg, sizeof msg);
    if (who >= 0 && w->rk[who].failed) return sm_errf(e, "%s", w->rk[who].err.msg);
    if (aborted) return sm_errf(e, "%s", msg);
    for (int q = 0; q < w->W; q++)
        if (w->rk[q].failed) return sm_errf(e, "%s", w->rk[q].err.msg);
    return 0;
}

static void world_destroy(void *vctx) {
    world_ctx *w = vctx;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    for (int q = 0; q < w->nth; q++) pthread_join(w->th[q], NULL);
    if (w->rk)
        for (int q = 0; q < w->W; q++) rank_destroy(&w->rk[q]);
    sm_comm_cpu_destroy(w->cw);
    pthread_cond_destroy(&w->go);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->mu);
    free(w->rk);
    free(w->th);
    free(w);
}

/* One rank's shard, pages, pool and scratch. */
static int rank_init(world_ctx *w, rank_ctx *r, int q, int threads, int rows, sm_err *e) {
    const sm_config *c = &w->m->cfg;
    r->w = w;
    r->rank = q;
    r->comm = sm_comm_cpu_rank(w->cw, q);
    if (sm_shard_make(w->m, w->W, q, w->moe, &r->sh, e)) return -1;
    if (threads > 1 && sm_pool_create(threads, &r->pool, e)) return sm_errprefix(e, "cpu world rank %d", q);
    r->nthreads = sm_pool_nthreads(r->pool);
    int QD = c->nH * c->D;
    r->maxw = c->H > c->Hm ? c->H : c->Hm;
    if (c->I > r->maxw) r->maxw = c->I;
    if (QD > r->maxw) r->maxw = QD;
    size_t kv_elems = (size_t)c->L * w->nblocks * r->sh.nKVl * SM_KV_BLOCK * 2 * c->D;
    int ne = r->sh.layers[0].ex.ne;
    r->kvp = calloc(kv_elems, sizeof(uint16_t));
    r->rowbuf = malloc(sizeof(float) * (size_t)r->nthreads * r->maxw);
    r->scores = malloc(sizeof(float) * (size_t)r->nthreads * w->max_len);
    r->off = malloc(sizeof(int) * ((size_t)ne + 1));
    r->cur = malloc(sizeof(int) * (size_t)ne);
    r->active = malloc(sizeof(int) * (size_t)ne);
    if (!r->kvp || !r->rowbuf || !r->scores || !r->off || !r->cur || !r->active)
        return sm_errf(e, "cpu world rank %d: out of memory for %zu KV bytes (%d pages x %d layers)", q, kv_elems * 2,
                       w->nblocks, c->L);
    return rank_reserve(r, rows, e);
}

int sm_world_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e) {
    memset(b, 0, sizeof *b);
    const sm_config *c = &m->cfg;
    int W = o ? o->world : 1;
    sm_moe_layout moe = o && o->moe_tp ? SM_MOE_TP : SM_MOE_EP;
    if (W < 1) W = 1;
    if (sm_shard_check(m, W, moe, e)) return sm_errprefix(e, "cpu world backend");
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0) return sm_errf(e, "cpu world backend: a kv cache with pages is required");
    if (c->D > 256) return sm_errf(e, "cpu world backend: head_dim %d is more than 256", c->D);
    world_ctx *w = calloc(1, sizeof *w);
    if (!w) return sm_errf(e, "cpu world backend: out of memory");
    w->m = m;
    w->W = W;
    w->moe = moe;
    w->nblocks = kv->nblocks;
    w->max_len = kv->max_len;
    w->finalize_rows = WORLD_FINALIZE_ROWS;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->go, NULL);
    pthread_cond_init(&w->done, NULL);
    w->rk = calloc((size_t)W, sizeof *w->rk);
    w->th = calloc((size_t)W, sizeof *w->th);
    if (!w->rk || !w->th) { world_destroy(w); return sm_errf(e, "cpu world backend: out of memory for %d ranks", W); }
    if (sm_comm_cpu_create(W, 0, &w->cw, e)) { world_destroy(w); return sm_errprefix(e, "cpu world backend"); }
    /* threads: the online cores (or nthreads) shared among the ranks, at least one each */
    long total = o && o->nthreads > 0 ? o->nthreads : sysconf(_SC_NPROCESSORS_ONLN);
    int per = total / W > 1 ? (int)(total / W) : 1;
    int rows = o && o->max_rows > 0 ? (o->max_rows < 64 ? o->max_rows : 64) : 64;
    for (int q = 0; q < W; q++)
        if (rank_init(w, &w->rk[q], q, per, rows, e)) { world_destroy(w); return -1; }
    for (int q = 0; q < W; q++) {
        if (pthread_create(&w->th[q], NULL, rank_main, &w->rk[q]) != 0) {
            world_destroy(w);
            return sm_errf(e, "cpu world backend: pthread_create failed for rank %d of %d", q, W);
        }
        w->nth++;
    }
    b->name = "cpu-world";
    b->ctx = w;
    b->step = world_step;
    b->destroy = world_destroy;
    return 0;
}

void sm_world_backend_trace(void *backend_ctx, sm_world_trace_fn fn, void *arg) {
    world_ctx *w = backend_ctx;
    w->trace = fn;
    w->trace_arg = arg;
}

void sm_world_backend_jitter(void *backend_ctx, uint64_t seed, int max_us) {
    world_ctx *w = backend_ctx;
    sm_comm_cpu_jitter(w->cw, seed, max_us);
}

void sm_world_backend_finalize_rows(void *backend_ctx, int rows) {
    world_ctx *w = backend_ctx;
    w->finalize_rows = rows > 0 ? rows : WORLD_FINALIZE_ROWS;
}
