/* test_world.c: tensor + expert parallelism in the CPU reference (src/parallel/shard.c, src/parallel/comm.h,
 * src/cpu/comm_cpu.c, src/cpu/world.c; docs/model.md section 9, docs/parallelism.md).
 *
 * Properties: shards refuse world sizes that do not divide a dimension (naming it) and their
 * views tile every tensor (the CPU communicator's own tests: test_comm.c); the world backend with W = 1 equals the single-rank
 * backend bit for bit; for W = 2, 4, 8 and both MoE layouts, logits stay within 1e-2 of
 * W = 1, greedy tokens are identical, every replicated tensor is bit-identical across ranks
 * at every layer, and outputs depend neither on arrival order, nor on the TP finalize path,
 * nor on threads per rank; MXFP4 and FP8 experts shard too; through the engine, speculative
 * generation with W ranks equals plain greedy with W ranks.
 * Models: mini's head and expert counts (nH 16, nKV 8, E 16: W = 8 divides) with narrow
 * widths (H = Hm = I = 128, V = 512, vocab_used 500), a 16-token window, 4 layers, and
 * residual-dominant gates (see residual_dominant).  About 1.5 s (6 s under ASan) on 2 cores.
 */
#include "model/rng.h"
#include "check.h"
#include "condition.h"
#include "tmodel.h"
#include "backend/backend.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "model/codec.h"
#include "testing/makemodel.h"
#include "sparkmono.h"
#include "engine/engine.h"
#include "cpu/debug.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- models */

/* The test config: mini's head and expert counts, narrow widths. */
static int small_config(sm_config *c, int I) {
    sm_err e = {""};
    if (sm_config_preset("mini", c, &e)) { CHECK(0, "%s", e.msg); return -1; }
    c->H = 128, c->Hm = 128, c->I = I, c->V = 512, c->vocab_used = 500, c->window = 16;
    if (sm_config_validate(c, "test config", &e)) { CHECK(0, "%s", e.msg); return -1; }
    return 0;
}

/* A test model of cfg made by tmodel.h, then residual-dominant gates (condition.h). */
static void world_make(tmodel *t, const sm_config *cfg, sm_expert_fmt fmt, uint64_t seed) {
    if (tmodel_make(t, "sm_world", cfg, fmt, seed, 0) == 0) residual_dominant(&t->m, seed + 99);
}

static uint64_t xs64(uint64_t *s) { return sm_rng_next(s); } /* the one generator (rng.h) */

/* ---------------------------------------------------------------- a backend rig */

#define MAXLEN 64
#define NREQ 2

/* Which backend: world 0 = the single-rank CPU backend, else the world backend. */
typedef struct rig_cfg {
    int world;            /* 0: sm_cpu_backend_create */
    int moe_tp;           /* world backend layout */
    int finalize_rows;    /* TP token-sharded finalize threshold (0: default) */
    uint64_t jitter;      /* arrival-order seed (0: off) */
    int nthreads;
} rig_cfg;

typedef struct rig {
    sm_kv kv;
    sm_backend b;
    int slot[NREQ];
    int ok;
} rig;

static int rig_init(rig *r, const sm_model *m, const rig_cfg *rc) {
    memset(r, 0, sizeof *r);
    sm_err e = {""};
    if (sm_kv_init(&r->kv, NREQ * MAXLEN / SM_KV_BLOCK + 2, NREQ, MAXLEN, 7, &e)) { CHECK(0, "%s", e.msg); return -1; }
    for (int i = 0; i < NREQ; i++)
        if (sm_kv_add(&r->kv, &r->slot[i], &e) || sm_kv_reserve(&r->kv, r->slot[i], MAXLEN, &e)) {
            CHECK(0, "%s", e.msg);
            sm_kv_free(&r->kv);
            return -1;
        }
    sm_backend_opts bo = {.nthreads = rc->nthreads ? rc->nthreads : 2, .world = rc->world ? rc->world : 1,
                          .moe_tp = rc->moe_tp, .max_rows = 16};
    int rv = rc->world ? sm_world_backend_create(m, &r->kv, &bo, &r->b, &e) : sm_cpu_backend_create(m, &r->kv, &bo, &r->b, &e);
    if (rv) {
        CHECK(0, "backend (world %d, %s): %s", rc->world, rc->moe_tp ? "tp" : "ep", e.msg);
        sm_kv_free(&r->kv);
        return -1;
    }
    if (rc->world) {
        if (rc->finalize_rows) sm_world_backend_finalize_rows(r->b.ctx, rc->finalize_rows);
        if (rc->jitter) sm_world_backend_jitter(r->b.ctx, rc->jitter, 150);
    }
    r->ok = 1;
    return 0;
}

static void rig_free(rig *r) {
    if (!r->ok) return;
    r->b.destroy(r->b.ctx);
    sm_kv_free(&r->kv);
    r->ok = 0;
}

/* One step: rows [0, n) of request q at positions p0.., tokens tok[p0..]. */
static int rig_step(rig *r, int q, const int *tok, int p0, int n, float *logits, int *am, int naux, const int *aux_layers,
                    float *aux) {
    int pos[MAXLEN], req[MAXLEN];
    for (int i = 0; i < n; i++) { pos[i] = p0 + i; req[i] = r->slot[q]; }
    sm_step s = {.nrows = n, .tokens = tok + p0, .pos = pos, .req = req, .kv = &r->kv, .logits = logits,
                 .argmax = am, .naux = naux, .aux_layers = aux_layers, .aux = aux};
    sm_err e = {""};
    int rc = r->b.step(r->b.ctx, &s, &e);
    CHECK(rc == 0, "step: %s", e.msg);
    return rc;
}

/* ---------------------------------------------------------------- replicated-state recorder */

typedef struct rec_entry { int layer; const char *stage; int n, width; uint64_t hash; } rec_entry;
typedef struct recorder {
    rec_entry *e[8];   /* [rank][cap] */
    int n[8], cap[8];
    int bad;           /* a rank out of range or out of memory */
} recorder;

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

/* Called concurrently by the rank threads: each appends to its own rank's list only. */
static void rec_fn(void *arg, int rank, int layer, const char *stage, const float *data, int n, int width) {
    recorder *R = arg;
    if (rank < 0 || rank >= 8) { R->bad = 1; return; }
    if (R->n[rank] == R->cap[rank]) {
        int nc = R->cap[rank] ? 2 * R->cap[rank] : 256;
        rec_entry *ne = realloc(R->e[rank], sizeof *ne * (size_t)nc);
        if (!ne) { R->bad = 1; return; }
        R->e[rank] = ne;
        R->cap[rank] = nc;
    }
    rec_entry x = {layer, stage, n, width, fnv(data, sizeof(float) * (size_t)n * width)};
    R->e[rank][R->n[rank]++] = x;
}

/* The single-rank backend's trace, recorded as rank 0. */
static void rec_cpu_fn(void *arg, int layer, const char *stage, const float *data, int n, int width) {
    rec_fn(arg, 0, layer, stage, data, n, width);
}

static void rec_free(recorder *R) {
    for (int i = 0; i < 8; i++) free(R->e[i]);
    memset(R, 0, sizeof *R);
}

/* Every rank recorded the same stages with the same bits. */
static void rec_check(const recorder *R, int W, const char *what) {
    CHECK(!R->bad, "%s: recorder failed", what);
    CHECK(R->n[0] > 40, "%s: only %d stages recorded", what, R->n[0]);
    for (int q = 1; q < W; q++) {
        CHECK(R->n[q] == R->n[0], "%s: rank %d recorded %d stages, rank 0 %d", what, q, R->n[q], R->n[0]);
        int nn = R->n[q] < R->n[0] ? R->n[q] : R->n[0];
        for (int i = 0; i < nn; i++) {
            const rec_entry *a = &R->e[0][i], *b = &R->e[q][i];
            if (a->layer != b->layer || strcmp(a->stage, b->stage) || a->n != b->n || a->width != b->width ||
                a->hash != b->hash) {
                CHECK(0, "%s: rank %d differs from rank 0 at stage %d (layer %d '%s' vs layer %d '%s')", what, q, i,
                      b->layer, b->stage, a->layer, a->stage);
                break;
            }
        }
    }
}

/* Route-choice records (stage "route_idx") of rank 0 of a and b that differ; *first = the
 * layer of the first difference (-1 if none). */
static int route_flips(const recorder *a, const recorder *b, int *first) {
    int ia = 0, ib = 0, nd = 0;
    *first = -1;
    for (;;) {
        while (ia < a->n[0] && strcmp(a->e[0][ia].stage, "route_idx")) ia++;
        while (ib < b->n[0] && strcmp(b->e[0][ib].stage, "route_idx")) ib++;
        if (ia >= a->n[0] || ib >= b->n[0]) break;
        if (a->e[0][ia].hash != b->e[0][ib].hash) {
            if (*first < 0) *first = a->e[0][ia].layer;
            nd++;
        }
        ia++, ib++;
    }
    return nd;
}

/* The schedule: request 0 prefills PRE rows, then decodes one row at a time feeding
 * tok0[PRE..]; request 1 prefills 5 rows; then both ride in one verify step of 3 + 3 rows.
 * All logits [SCHED, V] and argmax [SCHED] in that row order; aux [2, PRE, H] of the
 * prefill (layers 0 and L/2) when aux != NULL; stages recorded into rec when non-NULL. */
#define PRE 13
#define DEC 5
#define SCHED (PRE + DEC + 5 + 6)
static int run_schedule(const sm_model *m, const rig_cfg *rc, const int *tok0, const int *tok1, float *lg, int *am,
                        float *aux, recorder *rec) {
    rig r;
    if (rig_init(&r, m, rc)) return -1;
    if (rec) {
        if (rc->world) sm_world_backend_trace(r.b.ctx, rec_fn, rec);
        else sm_cpu_backend_trace(r.b.ctx, rec_cpu_fn, rec);
    }
    int V = m->cfg.V, rows = 0, rv = 0;
    int aux_layers[2] = {0, m->cfg.L / 2};
    rv |= rig_step(&r, 0, tok0, 0, PRE, lg, am, aux ? 2 : 0, aux ? aux_layers : NULL, aux);
    rows = PRE;
    for (int p = PRE; p < PRE + DEC && !rv; p++, rows++)
        rv |= rig_step(&r, 0, tok0, p, 1, lg + (int64_t)rows * V, am + rows, 0, NULL, NULL);
    if (!rv) rv |= rig_step(&r, 1, tok1, 0, 5, lg + (int64_t)rows * V, am + rows, 0, NULL, NULL);
    rows += 5;
    if (!rv) {
        /* two requests in one step: 3 rows each */
        int tk[6], pos[6], req[6];
        for (int i = 0; i < 3; i++) {
            tk[i] = tok0[PRE + DEC + i], pos[i] = PRE + DEC + i, req[i] = r.slot[0];
            tk[3 + i] = tok1[5 + i], pos[3 + i] = 5 + i, req[3 + i] = r.slot[1];
        }
        sm_step s = {.nrows = 6, .tokens = tk, .pos = pos, .req = req, .kv = &r.kv, .logits = lg + (int64_t)rows * V,
                     .argmax = am + rows};
        sm_err e = {""};
        rv = r.b.step(r.b.ctx, &s, &e);
        CHECK(rv == 0, "2-request step: %s", e.msg);
    }
    rig_free(&r);
    return rv;
}

/* ---------------------------------------------------------------- shared fixtures */

static tmodel g_bf16;             /* the test config, BF16 experts */
static int g_tok0[MAXLEN], g_tok1[MAXLEN];
static float *g_ref_lg;           /* [SCHED, V] W = 1 (single-rank backend) */
static int g_ref_am[SCHED];
static float *g_ref_aux;          /* [2, PRE, H] */
static recorder g_ref_rec;        /* W = 1 stages (route choices) */

/* Greedy prompts: after their prompts (13 and 5 random ids), tok0 and tok1 are W = 1's
 * greedy tokens, so every decode and verify row of the schedule is fed the previous row's
 * W = 1 argmax: equal argmaxes there mean an identical greedy stream. */
static void make_reference(void) {
    const sm_model *m = &g_bf16.m;
    int V = m->cfg.V;
    uint64_t s = 12345;
    for (int i = 0; i < MAXLEN; i++) {
        g_tok0[i] = (int)(xs64(&s) % (uint64_t)m->cfg.vocab_used);
        g_tok1[i] = (int)(xs64(&s) % (uint64_t)V);
    }
    g_ref_lg = malloc(sizeof(float) * SCHED * V);
    g_ref_aux = malloc(sizeof(float) * 2 * PRE * m->cfg.H);
    rig_cfg rc = {0};
    rig r;
    if (rig_init(&r, m, &rc)) return;
    int am[MAXLEN];
    /* request 0: greedy continuation of its 13-token prompt */
    rig_step(&r, 0, g_tok0, 0, PRE, NULL, am, 0, NULL, NULL);
    g_tok0[PRE] = am[PRE - 1];
    for (int p = PRE; p < PRE + DEC + 3; p++) {
        rig_step(&r, 0, g_tok0, p, 1, NULL, am, 0, NULL, NULL);
        g_tok0[p + 1] = am[0];
    }
    /* request 1: greedy continuation of its 5-token prompt */
    rig_step(&r, 1, g_tok1, 0, 5, NULL, am, 0, NULL, NULL);
    g_tok1[5] = am[4];
    for (int p = 5; p < 8; p++) {
        rig_step(&r, 1, g_tok1, p, 1, NULL, am, 0, NULL, NULL);
        g_tok1[p + 1] = am[0];
    }
    rig_free(&r);
    run_schedule(m, &rc, g_tok0, g_tok1, g_ref_lg, g_ref_am, g_ref_aux, &g_ref_rec);
}

/* ---------------------------------------------------------------- tests: shards */

static void t_shard_refusals(void) {
    sm_config c;
    sm_err e = {""};
    /* W = 3 on mini: every dimension is named */
    if (sm_config_preset("mini", &c, &e)) { CHECK(0, "%s", e.msg); return; }
    CHECK(sm_shard_check_config(&c, 3, SM_MOE_EP, &e) != 0, "world 3 accepted on mini");
    CHECK(strstr(e.msg, "world 3") && strstr(e.msg, "num_attention_heads nH = 16") &&
              strstr(e.msg, "num_key_value_heads nKV = 8") && strstr(e.msg, "num_local_experts E") &&
              strstr(e.msg, "hidden_size H = 1024") && strstr(e.msg, "vocab_size V = 2048"),
          "message: %s", e.msg);
    printf("  W=3 on mini: %s\n", e.msg);
    /* mini admits 1, 2, 4, 8 in both layouts */
    for (int W = 1; W <= 8; W *= 2)
        for (int tp = 0; tp < 2; tp++)
            CHECK(sm_shard_check_config(&c, W, sm_moe_layout_of(tp), &e) == 0, "mini W %d: %s", W, e.msg);
    /* tiny: nKV = 2 (and nH = 4) do not divide 8 */
    if (sm_config_preset("tiny", &c, &e)) { CHECK(0, "%s", e.msg); return; }
    CHECK(sm_shard_check_config(&c, 8, SM_MOE_EP, &e) != 0, "world 8 accepted on tiny");
    CHECK(strstr(e.msg, "num_key_value_heads nKV = 2") != NULL, "message: %s", e.msg);
    printf("  W=8 on tiny: %s\n", e.msg);
    CHECK(sm_shard_check_config(&c, 2, SM_MOE_TP, &e) == 0, "tiny W 2: %s", e.msg);
    /* the vocabulary alone */
    if (small_config(&c, 256)) return;
    c.V = 516, c.vocab_used = 516;
    CHECK(sm_shard_check_config(&c, 8, SM_MOE_EP, &e) != 0 && strstr(e.msg, "vocab_size V = 516") &&
              !strstr(e.msg, "nH"), "message: %s", e.msg);
    /* I only matters in TP, E only in EP */
    if (small_config(&c, 256)) return;
    c.E = 12;
    CHECK(sm_shard_check_config(&c, 8, SM_MOE_TP, &e) == 0, "E = 12 refused in TP: %s", e.msg);
    CHECK(sm_shard_check_config(&c, 8, SM_MOE_EP, &e) != 0 && strstr(e.msg, "num_local_experts E"), "message: %s", e.msg);
    /* world outside [1, 64] */
    CHECK(sm_shard_check_config(&c, 0, SM_MOE_EP, &e) != 0 && strstr(e.msg, "world 0"), "message: %s", e.msg);
    CHECK(sm_shard_check_config(&c, 65, SM_MOE_EP, &e) != 0, "world 65 accepted");
    /* layout names */
    sm_moe_layout l;
    CHECK(sm_moe_layout_parse("tp", &l, &e) == 0 && l == SM_MOE_TP, "tp");
    CHECK(sm_moe_layout_parse("ep", &l, &e) == 0 && l == SM_MOE_EP, "ep");
    CHECK(sm_moe_layout_parse("dp", &l, &e) != 0 && strstr(e.msg, "'dp'"), "message: %s", e.msg);
    /* the model-level validator names the dimension (the engine calls it: t_engine_world) */
    if (!g_bf16.ok) return;
    CHECK(sm_shard_check(&g_bf16.m, 3, SM_MOE_EP, &e) != 0 && strstr(e.msg, "num_attention_heads nH = 16"),
          "message: %s", e.msg);
}

/* Shard views tile each tensor exactly, and sliced expert rows equal the full rows' slices. */
static void check_views(const sm_model *m, int W, sm_moe_layout moe) {
    const sm_config *c = &m->cfg;
    sm_err e = {""};
    int D = c->D, H = c->H, Hm = c->Hm, I = c->I;
    float *full = malloc(sizeof(float) * (size_t)(I > Hm ? I : Hm)), *part = malloc(sizeof(float) * (size_t)(I > Hm ? I : Hm));
    for (int r = 0; r < W; r++) {
        sm_shard s;
        if (sm_shard_make(m, W, r, moe, &s, &e)) { CHECK(0, "W %d rank %d: %s", W, r, e.msg); break; }
        CHECK(s.nHl * W == c->nH && s.h0 == r * s.nHl && s.nKVl * W == c->nKV && s.kv0 == r * s.nKVl, "heads");
        CHECK(s.embed == m->embed + (int64_t)r * (c->V / W) * H && s.lm_head == m->lm_head + (int64_t)r * (c->V / W) * H,
              "vocab rows");
        for (int l = 0; l < c->L; l++) {
            const sm_shard_layer *S = &s.layers[l];
            const sm_layer *Ly = &m->layers[l];
            CHECK(S->wq == Ly->wq + (int64_t)r * s.nHl * D * H && S->wg == Ly->wg + (int64_t)r * s.nHl * D * H, "wq/wg");
            CHECK(S->wk == Ly->wk + (int64_t)r * s.nKVl * D * H && S->wv == Ly->wv + (int64_t)r * s.nKVl * D * H, "wk/wv");
            CHECK(S->wo == Ly->wo + (int64_t)r * s.nHl * D && S->ld_wo == (int64_t)c->nH * D, "wo view");
            CHECK(S->pooler == Ly->pooler + (int64_t)r * (Hm / W) * H, "pooler rows");
            CHECK(S->unpooler == Ly->unpooler + (int64_t)r * (H / W) * Hm, "unpooler rows");
            const sm_shard_experts *X = &S->ex;
            if (moe == SM_MOE_EP) CHECK(X->ne == c->E / W && X->e0 == r * X->ne && X->ni == I && X->i0 == 0, "EP experts");
            else CHECK(X->ne == c->E && X->e0 == 0 && X->ni == I / W && X->i0 == r * X->ni, "TP experts");
            /* every row of one expert's slice decodes to the slice of the full row */
            int le = X->ne - 1, ge = X->e0 + le, bad = 0;
            for (int o = 0; o < X->ni; o += 7) {
                sm_expert_row(m, l, ge, 0, X->i0 + o, full);
                sm_shard_mat_row(X->fmt, &X->gate[le], o, Hm, part);
                bad += memcmp(full, part, sizeof(float) * (size_t)Hm) != 0;
                sm_expert_row(m, l, ge, 0, I + X->i0 + o, full);
                sm_shard_mat_row(X->fmt, &X->up[le], o, Hm, part);
                bad += memcmp(full, part, sizeof(float) * (size_t)Hm) != 0;
            }
            for (int o = 0; o < Hm; o += 5) {
                sm_expert_row(m, l, ge, 1, o, full);
                sm_shard_mat_row(X->fmt, &X->down[le], o, X->ni, part);
                bad += memcmp(full + X->i0, part, sizeof(float) * (size_t)X->ni) != 0;
            }
            CHECK(bad == 0, "W %d rank %d layer %d (%s): %d expert slice rows differ", W, r, l, sm_expert_fmt_name(X->fmt), bad);
        }
        sm_shard_free(&s);
    }
    free(full);
    free(part);
}

static tmodel g_mx, g_fp8; /* MXFP4 experts with I = 128; FP8 experts with I = 256 */

static void t_shard_views(void) {
    if (!g_bf16.ok || !g_mx.ok || !g_fp8.ok) { CHECK(0, "no model"); return; }
    for (int W = 1; W <= 8; W *= 2) {
        check_views(&g_bf16.m, W, SM_MOE_EP);
        check_views(&g_bf16.m, W, SM_MOE_TP);
    }
    check_views(&g_mx.m, 4, SM_MOE_TP);
    check_views(&g_mx.m, 8, SM_MOE_EP);
    check_views(&g_fp8.m, 8, SM_MOE_TP);
    /* MXFP4 in TP: I/W = 128/8 = 16 would cut a 32-value scale block */
    sm_err e = {""};
    CHECK(sm_shard_check(&g_mx.m, 8, SM_MOE_TP, &e) != 0 && strstr(e.msg, "multiple of 32") && strstr(e.msg, "MXFP4"),
          "message: %s", e.msg);
    printf("  MXFP4 TP W=8, I=128: %s\n", e.msg);
    CHECK(sm_shard_check(&g_mx.m, 8, SM_MOE_EP, &e) == 0, "MXFP4 EP W=8: %s", e.msg);
}

/* ---------------------------------------------------------------- tests: world backend */

/* W = 1 world backend == single-rank backend, bit for bit, in both layouts. */
static void t_world1_bitexact(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok || !g_ref_lg) { CHECK(0, "no model"); return; }
    int V = m->cfg.V, H = m->cfg.H;
    float *lg = malloc(sizeof(float) * SCHED * V), *aux = malloc(sizeof(float) * 2 * PRE * H);
    int am[SCHED];
    for (int tp = 0; tp < 2; tp++) {
        rig_cfg rc = {.world = 1, .moe_tp = tp, .finalize_rows = tp ? 4 : 0};
        if (run_schedule(m, &rc, g_tok0, g_tok1, lg, am, aux, NULL)) continue;
        CHECK(memcmp(lg, g_ref_lg, sizeof(float) * SCHED * V) == 0, "%s: logits differ from the cpu backend: rel %g",
              tp ? "tp" : "ep", tm_rel_err(lg, g_ref_lg, (int64_t)SCHED * V));
        CHECK(memcmp(am, g_ref_am, sizeof am) == 0, "%s: argmax differs", tp ? "tp" : "ep");
        CHECK(memcmp(aux, g_ref_aux, sizeof(float) * 2 * PRE * H) == 0, "%s: aux differs", tp ? "tp" : "ep");
    }
    free(lg);
    free(aux);
}

/* Top-2 margin of a logits row (ids < vocab_used) relative to the row's RMS. */
static double rel_margin(const float *l, int n) {
    double t1 = -INFINITY, t2 = -INFINITY, ss = 0;
    for (int v = 0; v < n; v++) {
        ss += (double)l[v] * l[v];
        if (l[v] > t1) { t2 = t1; t1 = l[v]; }
        else if (l[v] > t2) t2 = l[v];
    }
    return (t1 - t2) / sqrt(ss / n);
}

/* W = 2, 4, 8 x EP, TP: logits within 1e-2 of W = 1, the same greedy tokens, and every
 * replicated tensor bit-identical across ranks at every layer and step.
 * Summation order moves a bf16 rounding now and then, and on a random model such a move
 * grows layer after layer and can flip a discrete choice lying within noise of a tie (a
 * route, an argmax): a failure here first says whether a route flipped.  Greedy tokens are
 * compared on rows whose W = 1 top-2 margin is at least 2% of the row's RMS (docs/model.md
 * section 10: identical on well-separated logits); this model has no closer row. */
static float *g_w_lg[3][2];       /* [log2(W) - 1][tp] logits of the schedule, [SCHED, V] */

static void t_world_vs_single(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok || !g_ref_lg) { CHECK(0, "no model"); return; }
    int V = m->cfg.V, H = m->cfg.H, nu = m->cfg.vocab_used;
    float *lg = malloc(sizeof(float) * SCHED * V), *aux = malloc(sizeof(float) * 2 * PRE * H);
    int am[SCHED], close = 0;
    for (int i = 0; i < SCHED; i++) close += rel_margin(g_ref_lg + (int64_t)i * V, nu) < 0.02;
    CHECK(close <= SCHED / 4, "%d of %d rows have a W = 1 top-2 margin under 2%%", close, SCHED);
    for (int W = 2; W <= 8; W *= 2)
        for (int tp = 0; tp < 2; tp++) {
            rig_cfg rc = {.world = W, .moe_tp = tp, .finalize_rows = tp && W == 4 ? 6 : 0};
            recorder R;
            memset(&R, 0, sizeof R);
            char what[64];
            snprintf(what, sizeof what, "W %d %s", W, tp ? "tp" : "ep");
            if (run_schedule(m, &rc, g_tok0, g_tok1, lg, am, aux, &R)) { rec_free(&R); continue; }
            int first, flips = route_flips(&g_ref_rec, &R, &first);
            double err = tm_rel_err(lg, g_ref_lg, (int64_t)SCHED * V);
            double aerr = tm_rel_err(aux + PRE * H, g_ref_aux + PRE * H, (int64_t)PRE * H);
            printf("  %s: logits rel err %.3g, aux[L/2] rel err %.3g, route choices differing from W = 1: %d\n", what, err,
                   aerr, flips);
            CHECK(err < 1e-2, "%s: logits rel err %g (%d route choices flipped, first at layer %d)", what, err, flips, first);
            CHECK(aerr < 1e-2, "%s: aux rel err %g", what, aerr);
            CHECK(memcmp(aux, g_ref_aux, sizeof(float) * PRE * H) == 0, "%s: aux[0] (embedding) not bit-identical", what);
            for (int i = 0; i < SCHED; i++)
                if (am[i] != g_ref_am[i] && rel_margin(g_ref_lg + (int64_t)i * V, nu) >= 0.02) {
                    CHECK(0, "%s: row %d: greedy token %d, W = 1 %d (margin %.3g; %d route choices flipped)", what, i,
                          am[i], g_ref_am[i], rel_margin(g_ref_lg + (int64_t)i * V, nu), flips);
                    break;
                }
            rec_check(&R, W, what);
            rec_free(&R);
            /* kept for the arrival-order and finalize tests */
            int wi = W == 2 ? 0 : W == 4 ? 1 : 2;
            g_w_lg[wi][tp] = lg;
            lg = malloc(sizeof(float) * SCHED * V);
        }
    free(lg);
    free(aux);
}

/* Outputs do not depend on arrival order, on the TP finalize path (all-reduce of every
 * route's y, or token-sharded: reduce-scatter, finalize own rows, all-gather; ranks own no
 * row when a step has fewer rows than ranks), nor on the threads per rank: each run is
 * compared bit for bit with t_world_vs_single's run of the same W and layout. */
static void t_world_arrival_and_finalize(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok || !g_ref_lg) { CHECK(0, "no model"); return; }
    int V = m->cfg.V;
    float *b = malloc(sizeof(float) * SCHED * V);
    int amb[SCHED];
    struct { int W, tp, finalize, nthreads; uint64_t seed; const char *what; } cases[] = {
        {8, 0, 0, 2, 977, "arrival order"},
        {4, 1, 1000, 2, 1954, "arrival order + all-reduce finalize (reference: token-sharded from 6 rows)"},
        {8, 1, 1, 2, 31, "arrival order + token-sharded finalize on every step (reference: all-reduce)"},
        {2, 1, 0, 6, 0, "3 threads per rank (reference: 1)"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int wi = cases[ci].W == 2 ? 0 : cases[ci].W == 4 ? 1 : 2;
        const float *a = g_w_lg[wi][cases[ci].tp];
        if (!a) { CHECK(0, "no reference run for W %d", cases[ci].W); continue; }
        rig_cfg rc = {.world = cases[ci].W, .moe_tp = cases[ci].tp, .finalize_rows = cases[ci].finalize,
                      .nthreads = cases[ci].nthreads, .jitter = cases[ci].seed};
        if (run_schedule(m, &rc, g_tok0, g_tok1, b, amb, NULL, NULL)) continue;
        CHECK(memcmp(a, b, sizeof(float) * SCHED * V) == 0, "W %d %s, %s: logits changed (rel %g)", cases[ci].W,
              cases[ci].tp ? "tp" : "ep", cases[ci].what, tm_rel_err(b, a, (int64_t)SCHED * V));
    }
    free(b);
}

/* Set W4A4 (act) on every MXFP4 expert layer of m (the test's switch of the loaded model). */
static void set_w4a4(sm_model *m, int act) {
    for (int l = 0; l < m->cfg.L; l++) m->layers[l].ex.act_mx = act && m->layers[l].ex.fmt == SM_EXP_MXFP4;
}

/* MXFP4 (W4A16 and W4A4) and FP8 experts: the sharded slices give logits near W = 1 of the
 * same model and numerics; W4A4 with W = 1 is not W4A16. */
static void t_world_formats(void) {
    struct { tmodel *t; int W, tp, w4a4; } cases[] = {{&g_mx, 4, 1, 0}, {&g_mx, 8, 0, 0}, {&g_mx, 4, 1, 1},
                                                      {&g_mx, 8, 0, 1}, {&g_mx, 2, 1, 1}, {&g_fp8, 8, 1, 0}};
    const sm_model *ref_of = NULL; /* the model whose W = 1 run is in a */
    int ref_w4a4 = 0;
    float *a = malloc(sizeof(float) * SCHED * 512), *b = malloc(sizeof(float) * SCHED * 512);
    float *a16 = malloc(sizeof(float) * SCHED * 512);
    int ama[SCHED], amb[SCHED];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        sm_model *m = &cases[ci].t->m;
        if (!cases[ci].t->ok || m->cfg.V != 512) { CHECK(0, "no model"); break; }
        int V = m->cfg.V;
        set_w4a4(m, cases[ci].w4a4);
        rig_cfg r1 = {0}, rw = {.world = cases[ci].W, .moe_tp = cases[ci].tp, .finalize_rows = 8};
        if (ref_of != m || ref_w4a4 != cases[ci].w4a4) {
            if (ref_of == m && !ref_w4a4) memcpy(a16, a, sizeof(float) * SCHED * V);
            if (run_schedule(m, &r1, g_tok0, g_tok1, a, ama, NULL, NULL)) continue;
            if (ref_of == m && cases[ci].w4a4) {
                double d = tm_rel_err(a, a16, (int64_t)SCHED * V);
                printf("  mxfp4 W 1: W4A4 vs W4A16 logits rel diff %.3g\n", d);
                CHECK(d > 1e-3, "W4A4 logits equal W4A16's within %g", d);
            }
            ref_of = m;
            ref_w4a4 = cases[ci].w4a4;
        }
        if (run_schedule(m, &rw, g_tok0, g_tok1, b, amb, NULL, NULL)) continue;
        double err = tm_rel_err(b, a, (int64_t)SCHED * V);
        int same = 0;
        for (int i = 0; i < SCHED; i++) same += ama[i] == amb[i];
        printf("  %s%s W %d %s: logits rel err %.3g, argmax %d/%d equal\n", sm_expert_fmt_name(m->layers[1].ex.fmt),
               cases[ci].w4a4 ? " W4A4" : "", cases[ci].W, cases[ci].tp ? "tp" : "ep", err, same, SCHED);
        CHECK(err < 1e-2, "rel err %g", err);
        set_w4a4(m, 0);
    }
    free(a);
    free(b);
    free(a16);
}

/* Bad steps fail with a message and leave the backend usable. */
static void t_world_errors(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok) { CHECK(0, "no model"); return; }
    rig r;
    rig_cfg rc = {.world = 4, .moe_tp = 0};
    if (rig_init(&r, m, &rc)) return;
    int tok[4] = {1, 2, m->cfg.V, 3}, pos[4] = {0, 1, 2, 3}, req[4] = {r.slot[0], r.slot[0], r.slot[0], r.slot[0]};
    sm_step s = {.nrows = 4, .tokens = tok, .pos = pos, .req = req, .kv = &r.kv};
    sm_err e = {""};
    CHECK(r.b.step(r.b.ctx, &s, &e) != 0 && strstr(e.msg, "row 2") && strstr(e.msg, "token 512"), "message: %s", e.msg);
    tok[2] = 5;
    pos[3] = MAXLEN;
    CHECK(r.b.step(r.b.ctx, &s, &e) != 0 && strstr(e.msg, "position 64"), "message: %s", e.msg);
    pos[3] = 3;
    int am[4];
    s.argmax = am;
    CHECK(r.b.step(r.b.ctx, &s, &e) == 0, "good step after bad ones: %s", e.msg);
    rig_free(&r);
}

/* The public API and the engine plumb world / moe_tp through to the world backend.  With W
 * ranks, speculative generation (verify steps of 4 rows, 3 requests batched) must emit
 * exactly the tokens of plain one-token greedy decoding with W ranks (docs/model.md section 8):
 * the world backend, like the single-rank one, computes a row independently of the rows
 * sharing its step.  (Against W = 1 the free-running streams agree only while no argmax lies
 * within rounding noise of a tie; t_world_vs_single compares them token by token instead.) */
/* Drafter of the speculative run: the plain run's continuation, every third draft wrong, so
 * verify steps accept some drafts and reject others. */
typedef struct oracle { int reqs[3], plen[3], n[3]; const int *stream[3]; } oracle;
static void oracle_draft(void *arg, int req, const int *hist, int nhist, int ndraft, int *out) {
    const oracle *o = arg;
    (void)hist;
    for (int p = 0; p < 3; p++) {
        if (o->reqs[p] != req) continue;
        int j = nhist - o->plen[p]; /* tokens generated so far: drafts start at stream[j] */
        for (int d = 0; d < ndraft; d++) {
            int t = j + d < o->n[p] ? o->stream[p][j + d] : 0;
            out[d] = (j + d) % 3 == 2 ? (t + 1) % 500 : t;
        }
        return;
    }
    for (int d = 0; d < ndraft; d++) out[d] = 0;
}

static void t_engine_world(void) {
    if (!g_bf16.ok) { CHECK(0, "no model"); return; }
    sparkmono_model *mo = NULL;
    if (sparkmono_model_open(g_bf16.dir, NULL, &mo)) { CHECK(0, "%s", sparkmono_errmsg()); return; }
    /* three prompts: random ids, a repetitive one, a short one */
    int prompts[3][12], plen[3] = {12, 12, 3};
    uint64_t sd = 777;
    for (int i = 0; i < 12; i++) {
        prompts[0][i] = (int)(xs64(&sd) % 500);
        prompts[1][i] = 40 + (i % 4) * 9;
        prompts[2][i] = (int)(xs64(&sd) % 500);
    }
    struct { int W, tp; } cases[] = {{2, 1}, {8, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int out[2][3][12], nout[2][3], accepted = 0;
        for (int spec = 0; spec < 2; spec++) {
            sparkmono_engine_opts eo = {.request_rows = spec ? 4 : 1, .max_requests = 3, .max_len = 64, .threads = 2,
                                        .world = cases[ci].W, .moe_tp = cases[ci].tp};
            sparkmono_engine *g = NULL;
            int req[3], ok = sparkmono_engine_create(mo, &eo, &g) == SM_OK;
            for (int p = 0; p < 3 && ok; p++) ok = sparkmono_add(g, prompts[p], plen[p], 12, &req[p]) == SM_OK;
            oracle orc;
            for (int p = 0; p < 3; p++) {
                orc.reqs[p] = req[p], orc.plen[p] = plen[p], orc.n[p] = nout[0][p], orc.stream[p] = out[0][p];
            }
            if (ok && spec) {
                g->draft_fn = oracle_draft;
                g->draft_arg = &orc;
            }
            if (ok) ok = sparkmono_generate(g) == SM_OK;
            CHECK(ok, "W %d %s: %s", cases[ci].W, cases[ci].tp ? "tp" : "ep", sparkmono_errmsg());
            for (int p = 0; p < 3 && ok; p++) {
                const int *ids;
                sparkmono_request_info ri;
                if (sparkmono_output(g, req[p], &ids, &nout[spec][p]) || sparkmono_request_get_info(g, req[p], &ri)) {
                    CHECK(0, "%s", sparkmono_errmsg());
                    ok = 0;
                    break;
                }
                memcpy(out[spec][p], ids, sizeof(int) * (size_t)nout[spec][p]);
                accepted += spec ? ri.accepted : 0;
            }
            sparkmono_engine_destroy(g);
            if (!ok) break;
            if (spec)
                for (int p = 0; p < 3; p++)
                    CHECK(nout[0][p] == nout[1][p] && !memcmp(out[0][p], out[1][p], sizeof(int) * (size_t)nout[0][p]),
                          "W %d %s prompt %d: speculative tokens differ from plain greedy", cases[ci].W,
                          cases[ci].tp ? "tp" : "ep", p);
        }
        CHECK(accepted > 0, "W %d: no draft was ever accepted", cases[ci].W);
    }
    /* bad options name themselves */
    sparkmono_engine_opts bad = {.world = 3};
    sparkmono_engine *g = NULL;
    CHECK(sparkmono_engine_create(mo, &bad, &g) != SM_OK && strstr(sparkmono_errmsg(), "world 3"), "message: %s",
          sparkmono_errmsg());
    sparkmono_engine_destroy(g);
    /* out of range, either side: the validator's one line, prefixed with the option's layer */
    for (int w = -1; w <= SM_MAX_WORLD + 1; w += SM_MAX_WORLD + 2) {
        char want[128];
        snprintf(want, sizeof want, "engine option: world %d: the number of ranks must be in [1, %d]", w, SM_MAX_WORLD);
        bad.world = w;
        CHECK(sparkmono_engine_create(mo, &bad, &g) == SM_E_INVALID && !strcmp(sparkmono_errmsg(), want), "world %d: '%s'", w,
              sparkmono_errmsg());
        sparkmono_engine_destroy(g);
    }
    bad.world = 2, bad.moe_tp = 2;
    CHECK(sparkmono_engine_create(mo, &bad, &g) != SM_OK && strstr(sparkmono_errmsg(), "moe_tp"), "message: %s",
          sparkmono_errmsg());
    sparkmono_engine_destroy(g);
    sparkmono_model_close(mo);
}

int main(void) {
    sm_config c;
    if (small_config(&c, 128) == 0) {
        world_make(&g_bf16, &c, SM_EXP_BF16, 16);
        world_make(&g_fp8, &c, SM_EXP_FP8, 12);
        world_make(&g_mx, &c, SM_EXP_MXFP4, 13);
    }
    if (g_bf16.ok) make_reference();
    RUN(t_shard_refusals);
    RUN(t_shard_views);
    RUN(t_world1_bitexact);
    RUN(t_world_vs_single);
    RUN(t_world_arrival_and_finalize);
    RUN(t_world_formats);
    RUN(t_world_errors);
    RUN(t_engine_world);
    free(g_ref_lg);
    free(g_ref_aux);
    for (int i = 0; i < 3; i++) free(g_w_lg[i][0]), free(g_w_lg[i][1]);
    rec_free(&g_ref_rec);
    tmodel_free(&g_bf16);
    tmodel_free(&g_mx);
    tmodel_free(&g_fp8);
    return TEST_DONE();
}
