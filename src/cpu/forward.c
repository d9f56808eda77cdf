/* forward.c: the CPU reference backend (backend.h): SPEC.md section 4 for every row of a step.
 *
 * The step runs layer by layer over ALL its rows at once (a [rows, features] activation per
 * stage), so each weight matrix is streamed once per step and, within a layer, every row has
 * written its K/V before any row attends (a row sees the earlier rows of its own step; later
 * rows are masked by position).  Every number is produced by the ops of ops.h, whose sums have
 * a fixed order, so a row's result does not depend on which other rows share its step, on the
 * page layout of the cache, or on the thread count.  The KV pages live here, in host memory,
 * per layer bf16 [nblocks][nKV][16][K(64) | V(64)].  Scratch is allocated at create for
 * max_rows and grown (never per row) if a larger step comes.  One step at a time per backend
 * (the threads are inside a step).  An optional trace (ops.h) sees every stage's activations.
 * We rejected a row-at-a-time forward: it reads every weight once per row, 8x the traffic
 * of a verify step, and it would not exercise the batched K/V ordering the GPU paths have.
 */
#include "backend.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
#include "codec.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_ctx {
    const sm_model *m;
    sm_pool *pool;
    int nthreads;        /* threads of pool */
    int nblocks;         /* KV pages per layer */
    int max_len;         /* positions a request may hold (score scratch length) */
    uint16_t *kvp;       /* [L, nblocks, nKV, 16, 2D] bf16 K | V pages */
    int cap;             /* rows the activation buffers hold */
    float *s;            /* [cap, H] residual stream, f32 */
    float *x;            /* [cap, H] normed layer input (bf16-exact) */
    float *q, *g, *o;    /* [cap, nH*D] query, output gate, attention output */
    float *k, *v;        /* [cap, nKV*D] */
    float *a;            /* [cap, H] attention branch output, then scratch */
    float *xf;           /* [cap, H] normed MoE input */
    float *f;            /* [cap, H] MoE output */
    float *logits;       /* [cap, V] when the step gives no logits buffer */
    float *scores;       /* [nthreads, max_len] attention score scratch per thread */
    ref_moe_ws moe;      /* MoE workspace */
    sm_cpu_trace_fn trace; void *trace_arg; /* debug trace of every stage, or NULL */
    float *tr;           /* [cap, K] route ids / weights as floats for the trace */
} cpu_ctx;

#define TRACE(layer, name, ptr, n, width) \
    do { if (c->trace) c->trace(c->trace_arg, (layer), (name), (ptr), (n), (width)); } while (0)

void sm_cpu_backend_trace(void *backend_ctx, sm_cpu_trace_fn fn, void *arg) {
    cpu_ctx *c = backend_ctx;
    c->trace = fn;
    c->trace_arg = arg;
}

/* Route ids and weights of the last MoE call, as floats, for the trace. */
static void trace_routes(cpu_ctx *c, int l, int n) {
    int K = c->m->cfg.K;
    if (!c->trace) return;
    for (int i = 0; i < n * K; i++) c->tr[i] = (float)c->moe.idx[i];
    TRACE(l, "route_idx", c->tr, n, K);
    TRACE(l, "route_w", c->moe.w, n, K);
    TRACE(l, "h1", c->moe.h1, n, c->m->cfg.Hm);
    TRACE(l, "m", c->moe.m, n, c->m->cfg.Hm);
}

static void ctx_free_rows(cpu_ctx *c) {
    free(c->s); free(c->x); free(c->q); free(c->g); free(c->o); free(c->k); free(c->v);
    free(c->a); free(c->xf); free(c->f); free(c->logits); free(c->tr);
    c->tr = NULL;
    c->s = c->x = c->q = c->g = c->o = c->k = c->v = c->a = c->xf = c->f = c->logits = NULL;
    c->cap = 0;
}

/* Size the activation buffers for n rows. */
static int ctx_reserve(cpu_ctx *c, int n, sm_err *e) {
    if (n <= c->cap) return 0;
    const sm_config *cf = &c->m->cfg;
    ctx_free_rows(c);
    size_t R = (size_t)n, H = (size_t)cf->H, QD = (size_t)cf->nH * cf->D, KD = (size_t)cf->nKV * cf->D;
    c->s = malloc(sizeof(float) * R * H);
    c->x = malloc(sizeof(float) * R * H);
    c->q = malloc(sizeof(float) * R * QD);
    c->g = malloc(sizeof(float) * R * QD);
    c->o = malloc(sizeof(float) * R * QD);
    c->k = malloc(sizeof(float) * R * KD);
    c->v = malloc(sizeof(float) * R * KD);
    c->a = malloc(sizeof(float) * R * H);
    c->xf = malloc(sizeof(float) * R * H);
    c->f = malloc(sizeof(float) * R * H);
    c->logits = malloc(sizeof(float) * R * (size_t)cf->V);
    c->tr = malloc(sizeof(float) * R * (size_t)cf->K);
    if (!c->tr || !c->s || !c->x || !c->q || !c->g || !c->o || !c->k || !c->v || !c->a || !c->xf || !c->f || !c->logits) {
        ctx_free_rows(c);
        return sm_errf(e, "cpu backend: out of memory for the activations of %d rows", n);
    }
    c->cap = n;
    if (ref_moe_ws_reserve(&c->moe, cf, n, e)) { ctx_free_rows(c); return -1; }
    return 0;
}

static void cpu_destroy(void *vctx) {
    cpu_ctx *c = vctx;
    if (!c) return;
    ctx_free_rows(c);
    ref_moe_ws_free(&c->moe);
    free(c->scores);
    free(c->kvp);
    sm_pool_destroy(c->pool);
    free(c);
}

/* Attention job: one (row, query head) per index. */
typedef struct att_job {
    cpu_ctx *c;
    const sm_step *st;
    const uint16_t *kvl; /* this layer's pages */
    int window;          /* 0: full attention */
    float scale;
} att_job;

static void att_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const att_job *j = arg;
    const sm_config *cf = &j->c->m->cfg;
    int nH = cf->nH, D = cf->D, group = sm_config_group(cf);
    for (int64_t t = lo; t < hi; t++) {
        int i = (int)(t / nH), h = (int)(t % nH);
        const int *table = j->st->kv->tables + (int64_t)j->st->req[i] * j->st->kv->max_bpr;
        int64_t qo = (int64_t)i * nH * D + (int64_t)h * D;
        ref_attention_head(j->c->q + qo, cf->nKV, h / group, D, j->kvl, table, j->st->pos[i], j->window,
                           j->scale, j->c->scores + (int64_t)tid * j->c->max_len, j->c->o + qo);
    }
}

/* Check every row of the step against the model and the cache before touching anything. */
static int check_step(const cpu_ctx *c, const sm_step *s, sm_err *e) {
    const sm_config *cf = &c->m->cfg;
    const sm_kv *kv = s->kv;
    if (s->nrows < 0) return sm_errf(e, "cpu step: nrows %d is negative", s->nrows);
    if (s->nrows > 0 && (!s->tokens || !s->pos || !s->req || !kv))
        return sm_errf(e, "cpu step: tokens, pos, req and kv must all be given");
    if (s->naux < 0 || (s->naux > 0 && (!s->aux_layers || !s->aux)))
        return sm_errf(e, "cpu step: naux %d needs aux_layers and aux buffers", s->naux);
    for (int a = 0; a < s->naux; a++)
        if (s->aux_layers[a] < 0 || s->aux_layers[a] > cf->L)
            return sm_errf(e, "cpu step: aux layer %d (entry %d) outside [0, %d]", s->aux_layers[a], a, cf->L);
    for (int i = 0; i < s->nrows; i++) {
        int t = s->tokens[i], p = s->pos[i], r = s->req[i];
        if (t < 0 || t >= cf->V) return sm_errf(e, "cpu step: row %d: token %d outside the vocabulary [0, %d)", i, t, cf->V);
        if (r < 0 || r >= kv->max_req || !kv->live[r])
            return sm_errf(e, "cpu step: row %d: request %d is not a live kv cache slot", i, r);
        if (p < 0 || p >= kv->max_len || p >= c->max_len)
            return sm_errf(e, "cpu step: row %d: position %d outside [0, %d)", i, p,
                           kv->max_len < c->max_len ? kv->max_len : c->max_len);
        if (p / SM_KV_BLOCK >= kv->nblk[r])
            return sm_errf(e, "cpu step: row %d: position %d of request %d has no reserved cache page", i, p, r);
        const int *tb = kv->tables + (int64_t)r * kv->max_bpr;
        for (int b = 0; b <= p / SM_KV_BLOCK; b++)
            if (tb[b] < 0 || tb[b] >= c->nblocks)
                return sm_errf(e, "cpu step: row %d: request %d block %d maps to page %d outside [0, %d)", i, r, b,
                               tb[b], c->nblocks);
    }
    return 0;
}

static void put_aux(const cpu_ctx *c, const sm_step *s, int j) {
    int H = c->m->cfg.H;
    for (int a = 0; a < s->naux; a++)
        if (s->aux_layers[a] == j)
            memcpy(s->aux + (int64_t)a * s->nrows * H, c->s, sizeof(float) * (size_t)s->nrows * H);
}

/* s = alpha * s + beta * r16(rms(b, -, post_eps)) per row (b is overwritten). */
static void residual_gate(const sm_config *cf, float *s, float *b, int n, const float *alpha, const float *beta) {
    int H = cf->H;
    ref_rms(b, n, H, NULL, cf->post_eps, 1, b);
    for (int i = 0; i < n; i++)
        for (int x = 0; x < H; x++) {
            int64_t o = (int64_t)i * H + x;
            s[o] = alpha[x] * s[o] + beta[x] * b[o];
        }
}

static int cpu_step(void *vctx, const sm_step *s, sm_err *e) {
    cpu_ctx *c = vctx;
    const sm_model *m = c->m;
    const sm_config *cf = &m->cfg;
    if (check_step(c, s, e)) return -1;
    int n = s->nrows;
    if (n == 0) return 0;
    if (ctx_reserve(c, n, e)) return -1;
    int H = cf->H, D = cf->D, nH = cf->nH, nKV = cf->nKV, QD = nH * D, KD = nKV * D;
    int64_t layer_elems = (int64_t)c->nblocks * nKV * SM_KV_BLOCK * 2 * D;

    /* s = r16(rms(embed[tok], -, eps)): weightless embedding norm */
    for (int i = 0; i < n; i++) {
        const uint16_t *er = m->embed + (int64_t)s->tokens[i] * H;
        for (int x = 0; x < H; x++) c->s[(int64_t)i * H + x] = sm_bf16_to_f32(er[x]);
    }
    ref_rms(c->s, n, H, NULL, cf->rms_eps, 1, c->s);
    put_aux(c, s, 0);
    TRACE(-1, "s", c->s, n, H);
    /* x = r16(rms(s, eff(input_layernorm_0))) */
    ref_rms(c->s, n, H, m->layers[0].in_norm, cf->rms_eps, 1, c->x);
    TRACE(0, "x", c->x, n, H);

    for (int l = 0; l < cf->L; l++) {
        const sm_layer *Ly = &m->layers[l];
        uint16_t *kvl = c->kvp + (int64_t)l * layer_elems;
        /* q, k, v, gate projections */
        ref_mm(c->pool, c->x, n, H, Ly->wq, QD, c->q);
        ref_mm(c->pool, c->x, n, H, Ly->wk, KD, c->k);
        ref_mm(c->pool, c->x, n, H, Ly->wv, KD, c->v);
        ref_mm(c->pool, c->x, n, H, Ly->wg, QD, c->g);
        TRACE(l, "q", c->q, n, QD);
        TRACE(l, "k", c->k, n, KD);
        TRACE(l, "v", c->v, n, KD);
        TRACE(l, "g", c->g, n, QD);
        /* per-head QK rms norm (weightless), r16 */
        ref_rms(c->q, n * nH, D, NULL, cf->rms_eps, 1, c->q);
        ref_rms(c->k, n * nKV, D, NULL, cf->rms_eps, 1, c->k);
        /* RoPE on sliding layers only (full layers are NoPE) */
        if (!Ly->full)
            for (int i = 0; i < n; i++) {
                ref_rope(c->q + (int64_t)i * QD, nH, D, s->pos[i], cf->rope_theta);
                ref_rope(c->k + (int64_t)i * KD, nKV, D, s->pos[i], cf->rope_theta);
            }
        TRACE(l, "qn", c->q, n, QD);
        TRACE(l, "kn", c->k, n, KD);
        /* every row writes K (normed, roped) and V (raw) at its slot, bf16, before any row attends */
        for (int i = 0; i < n; i++) {
            const int *tb = s->kv->tables + (int64_t)s->req[i] * s->kv->max_bpr;
            int p = s->pos[i];
            int64_t page = tb[p / SM_KV_BLOCK];
            for (int h = 0; h < nKV; h++) {
                uint16_t *dst = kvl + ((page * nKV + h) * SM_KV_BLOCK + p % SM_KV_BLOCK) * 2 * D;
                const float *kr = c->k + (int64_t)i * KD + (int64_t)h * D;
                const float *vr = c->v + (int64_t)i * KD + (int64_t)h * D;
                for (int d = 0; d < D; d++) {
                    dst[d] = sm_f32_to_bf16(kr[d]);
                    dst[D + d] = sm_f32_to_bf16(vr[d]);
                }
            }
        }
        /* paged attention, one (row, head) per task, f32 */
        att_job aj = {c, s, kvl, Ly->full ? 0 : cf->window, cf->qk_scale_factor / sqrtf((float)D)};
        sm_pool_for(c->pool, (int64_t)n * nH, 1, att_chunk, &aj);
        TRACE(l, "att", c->o, n, QD);
        /* o = r16(rms_per_head(o) * sigmoid(g)) */
        ref_rms(c->o, n * nH, D, NULL, cf->rms_eps, 0, c->o);
        for (int64_t t = 0; t < (int64_t)n * QD; t++) c->o[t] = sm_r16(c->o[t] * (1.0f / (1.0f + expf(-c->g[t]))));
        /* a = mm(o, Wo) */
        TRACE(l, "o", c->o, n, QD);
        ref_mm(c->pool, c->o, n, QD, Ly->wo, H, c->a);
        TRACE(l, "a", c->a, n, H);
        /* post-attention boundary: s = alpha * s + beta * r16(rms(a, -, 1e-8)) */
        residual_gate(cf, c->s, c->a, n, Ly->att_alpha, Ly->att_beta);
        TRACE(l, "s_att", c->s, n, H);
        /* xf = r16(rms(s, eff(pre_feedforward_layernorm))) */
        ref_rms(c->s, n, H, Ly->pre_ffn_norm, cf->rms_eps, 1, c->xf);
        TRACE(l, "xf", c->xf, n, H);
        /* MoE branch */
        if (ref_moe_ws_run(c->pool, m, l, c->xf, n, c->f, NULL, NULL, NULL, NULL, &c->moe, e))
            return sm_errprefix(e, "cpu step: layer %d", l);
        trace_routes(c, l, n);
        TRACE(l, "f", c->f, n, H);
        /* post-FFN boundary: t = r16(f * eff(post_ffn)); s = alpha * s + beta * r16(rms(t, -, 1e-8)) */
        for (int64_t t = 0; t < (int64_t)n * H; t++) c->a[t] = sm_r16(c->f[t] * Ly->post_ffn_norm[t % H]);
        residual_gate(cf, c->s, c->a, n, Ly->ffn_alpha, Ly->ffn_beta);
        put_aux(c, s, l + 1);
        TRACE(l, "s_ffn", c->s, n, H);
        /* next layer's input norm */
        if (l < cf->L - 1) {
            ref_rms(c->s, n, H, m->layers[l + 1].in_norm, cf->rms_eps, 1, c->x);
            TRACE(l + 1, "x", c->x, n, H);
        }
    }
    /* final norm of r16(s), lm_head, softcap, mask, argmax */
    float *lg = s->logits ? s->logits : c->logits;
    for (int64_t t = 0; t < (int64_t)n * H; t++) c->x[t] = sm_r16(c->s[t]);
    ref_rms(c->x, n, H, m->final_norm, cf->rms_eps, 1, c->x);
    TRACE(cf->L, "h", c->x, n, H);
    int *am = s->argmax;
    ref_logits_h(c->pool, m, c->x, n, lg, am);
    return 0;
}

int sm_cpu_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e) {
    memset(b, 0, sizeof *b);
    const sm_config *cf = &m->cfg;
    int world = o ? o->world : 1;
    if (world > 1) return sm_errf(e, "cpu backend: world %d: tensor/expert parallelism is not implemented on the CPU", world);
    if (!kv || kv->nblocks <= 0 || kv->max_len <= 0) return sm_errf(e, "cpu backend: a kv cache with pages is required");
    if (cf->D > 256) return sm_errf(e, "cpu backend: head_dim %d is more than 256", cf->D);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return sm_errf(e, "cpu backend: out of memory");
    c->m = m;
    c->nblocks = kv->nblocks;
    c->max_len = kv->max_len;
    if (sm_pool_create(o ? o->nthreads : 0, &c->pool, e)) { free(c); return sm_errprefix(e, "cpu backend"); }
    c->nthreads = sm_pool_nthreads(c->pool);
    size_t kv_elems = (size_t)cf->L * c->nblocks * cf->nKV * SM_KV_BLOCK * 2 * cf->D;
    c->kvp = calloc(kv_elems, sizeof(uint16_t));
    c->scores = malloc(sizeof(float) * (size_t)c->nthreads * c->max_len);
    if (!c->kvp || !c->scores) {
        cpu_destroy(c);
        return sm_errf(e, "cpu backend: out of memory for %zu KV bytes (%d pages x %d layers)", kv_elems * 2,
                       kv->nblocks, cf->L);
    }
    int rows = o && o->max_rows > 0 ? o->max_rows : 64;
    if (ctx_reserve(c, rows, e)) { cpu_destroy(c); return -1; }
    b->name = "cpu";
    b->ctx = c;
    b->step = cpu_step;
    b->destroy = cpu_destroy;
    return 0;
}
