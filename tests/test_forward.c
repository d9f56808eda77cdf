/* test_forward.c: properties of the CPU backend (src/cpu/forward.c) that must hold bit for bit:
 * a verify step of R rows equals R one-row decodes (and a prefill step equals token-by-token);
 * scattered page tables equal contiguous ones; 1, 2 and 3 threads agree; several requests of
 * different lengths in one step equal each run alone.  Also: every expert format runs (and
 * MXFP4 / FP8 stay near BF16 of the same seed), ref_expert_row matches sm_expert_row, the
 * grouped MoE matches route-by-route experts, step input errors, and the thread pool.
 * Models: the tiny preset (4 layers) with a 16-token window so 32 positions cross it.
 */
#include "model/rng.h"
#include "check.h"
#include "tmodel.h"
#include "backend/backend.h"
#include "model/codec.h"
#include "testing/makemodel.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- models */

/* tiny, window 16, experts in fmt, loaded (online_mxfp4 as given). */
static void tiny_make(tmodel *t, sm_expert_fmt fmt, uint64_t seed, int online) {
    memset(t, 0, sizeof *t);
    sm_err e = {""};
    sm_config cfg;
    if (sm_config_preset("tiny", &cfg, &e)) { CHECK(0, "%s", e.msg); return; }
    cfg.window = 16;
    tmodel_make(t, "sm_fwd", &cfg, fmt, seed, online);
}

/* ---------------------------------------------------------------- a backend + cache rig */

#define MAXREQ 4
#define MAXLEN 48

typedef struct rig {
    sm_kv kv;
    sm_backend b;
    int slot[MAXREQ];
    int ok;
} rig;

static void rig_init(rig *r, const sm_model *m, int nthreads, uint64_t shuffle, int nreq) {
    memset(r, 0, sizeof *r);
    sm_err e = {""};
    if (sm_kv_init(&r->kv, MAXREQ * MAXLEN / SM_KV_BLOCK + 2, MAXREQ, MAXLEN, shuffle, &e)) { CHECK(0, "%s", e.msg); return; }
    for (int i = 0; i < nreq; i++) {
        if (sm_kv_add(&r->kv, &r->slot[i], &e) || sm_kv_reserve(&r->kv, r->slot[i], MAXLEN, &e)) {
            CHECK(0, "%s", e.msg);
            return;
        }
    }
    sm_backend_opts bo = {.nthreads = nthreads, .world = 1, .max_rows = 8};
    if (sm_cpu_backend_create(m, &r->kv, &bo, &r->b, &e)) { CHECK(0, "%s", e.msg); sm_kv_free(&r->kv); return; }
    r->ok = 1;
}

static void rig_free(rig *r) {
    if (!r->ok) return;
    r->b.destroy(r->b.ctx);
    sm_kv_free(&r->kv);
}

/* One step of n rows of request index q (positions p0..p0+n-1, tokens tok[p0..]);
 * logits [n, V], aux [2, n, H] (layers 0 and L). */
static int rig_step(rig *r, const sm_model *m, int q, const int *tok, int p0, int n, float *logits, int *am,
                    float *aux) {
    int pos[64], req[64], aux_layers[2] = {0, m->cfg.L};
    for (int i = 0; i < n; i++) { pos[i] = p0 + i; req[i] = r->slot[q]; }
    sm_step s = {.nrows = n, .tokens = tok + p0, .pos = pos, .req = req, .kv = &r->kv, .logits = logits,
                 .argmax = am, .naux = aux ? 2 : 0, .aux_layers = aux ? aux_layers : NULL, .aux = aux};
    sm_err e = {""};
    int rc = r->b.step(r->b.ctx, &s, &e);
    CHECK(rc == 0, "step: %s", e.msg);
    return rc;
}

static void rand_tokens(int *tok, int n, int V, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        tok[i] = (int)(seed % (uint64_t)V);
    }
}

/* The standard schedule on one request: a 24-row prefill, a verify of 8 rows at 24..31, then
 * a verify rewinding 5 rejected rows (positions 27..34).  logits [40, V] in that row order. */
#define SCHED_ROWS 40
static void run_schedule(rig *r, const sm_model *m, const int *tok, float *logits, int *am) {
    int V = m->cfg.V;
    rig_step(r, m, 0, tok, 0, 24, logits, am, NULL);
    rig_step(r, m, 0, tok, 24, 8, logits + (int64_t)24 * V, am + 24, NULL);
    rig_step(r, m, 0, tok, 27, 8, logits + (int64_t)32 * V, am + 32, NULL);
}

/* ---------------------------------------------------------------- tests */

static tmodel g_bf16; /* shared by the bit-for-bit tests */

/* Prefill in one step == token by token; a verify of 8 rows == 8 one-row decodes. */
static void t_verify_equals_decodes(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok) { CHECK(0, "no model"); return; }
    int V = m->cfg.V, H = m->cfg.H, tok[MAXLEN];
    rand_tokens(tok, MAXLEN, V, 101);
    float *la = malloc(sizeof(float) * 32 * V), *lb = malloc(sizeof(float) * 32 * V);
    float *xa = malloc(sizeof(float) * 2 * 32 * H), *xb = malloc(sizeof(float) * 2 * 32 * H);
    int aa[32], ab[32];
    rig A, B;
    rig_init(&A, m, 2, 0, 1);
    rig_init(&B, m, 2, 0, 1);
    if (!A.ok || !B.ok) goto out;
    /* A: prefill 24 rows, verify 8 rows; aux rows of a step are [2, n, H] */
    float *xs = malloc(sizeof(float) * 2 * 24 * H);
    rig_step(&A, m, 0, tok, 0, 24, la, aa, xs);
    for (int j = 0; j < 2; j++) memcpy(xa + ((int64_t)j * 32) * H, xs + (int64_t)j * 24 * H, sizeof(float) * 24 * H);
    rig_step(&A, m, 0, tok, 24, 8, la + (int64_t)24 * V, aa + 24, xs);
    for (int j = 0; j < 2; j++)
        memcpy(xa + ((int64_t)j * 32 + 24) * H, xs + (int64_t)j * 8 * H, sizeof(float) * 8 * H);
    free(xs);
    /* B: one row at a time */
    for (int p = 0; p < 32; p++) {
        float x2[2 * 256];
        if (H > 256) { CHECK(0, "H %d", H); break; }
        rig_step(&B, m, 0, tok, p, 1, lb + (int64_t)p * V, ab + p, x2);
        for (int j = 0; j < 2; j++) memcpy(xb + ((int64_t)j * 32 + p) * H, x2 + j * H, sizeof(float) * H);
    }
    CHECK(memcmp(la, lb, sizeof(float) * 24 * V) == 0, "prefill logits differ from token-by-token: rel %g",
          tm_rel_err(la, lb, (int64_t)24 * V));
    CHECK(memcmp(la + (int64_t)24 * V, lb + (int64_t)24 * V, sizeof(float) * 8 * V) == 0,
          "verify logits differ from decodes: rel %g", tm_rel_err(la + (int64_t)24 * V, lb + (int64_t)24 * V, (int64_t)8 * V));
    CHECK(memcmp(aa, ab, sizeof aa) == 0, "argmax differs");
    CHECK(memcmp(xa, xb, sizeof(float) * 2 * 32 * H) == 0, "aux hidden states differ");
    /* aux layer 0 is the embedding norm: r16(rms(embed[tok])) */
    {
        int bad = 0;
        for (int p = 0; p < 32; p++) {
            double ss = 0;
            for (int x = 0; x < H; x++) {
                double v = sm_bf16_to_f32(m->embed[(int64_t)tok[p] * H + x]);
                ss += v * v;
            }
            double r = 1.0 / sqrt(ss / H + m->cfg.rms_eps);
            for (int x = 0; x < H; x++) {
                double v = sm_bf16_to_f32(m->embed[(int64_t)tok[p] * H + x]) * r, got = xa[(int64_t)p * H + x];
                if (fabs(got - v) > fabs(v) * 8e-3 + 1e-6 || sm_r16((float)got) != (float)got) bad++;
            }
        }
        CHECK(bad == 0, "%d aux[0] values are not r16(rms(embed))", bad);
    }
    /* logits are finite below vocab_used and argmax is their lowest-id maximum */
    for (int p = 0; p < 32; p++) {
        const float *l = la + (int64_t)p * V;
        int best = 0;
        for (int v = 0; v < m->cfg.vocab_used; v++) {
            if (!isfinite(l[v])) { CHECK(0, "row %d logit %d = %g", p, v, l[v]); break; }
            if (l[v] > l[best]) best = v;
        }
        CHECK(best == aa[p], "row %d argmax %d, max at %d", p, aa[p], best);
    }
out:
    rig_free(&A);
    rig_free(&B);
    free(la); free(lb); free(xa); free(xb);
}

/* Pages handed out in shuffled order == ascending order; 1 == 2 == 3 threads. */
static void t_paged_and_threads(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok) { CHECK(0, "no model"); return; }
    int V = m->cfg.V, tok[MAXLEN];
    rand_tokens(tok, MAXLEN, V, 202);
    const struct { int threads; uint64_t shuffle; } cases[] = {{2, 0}, {2, 987654321}, {1, 0}, {3, 0}, {3, 55}};
    float *ref = malloc(sizeof(float) * SCHED_ROWS * V), *got = malloc(sizeof(float) * SCHED_ROWS * V);
    int am_ref[SCHED_ROWS], am[SCHED_ROWS];
    for (int c = 0; c < 5; c++) {
        rig r;
        rig_init(&r, m, cases[c].threads, cases[c].shuffle, 1);
        if (!r.ok) break;
        if (cases[c].shuffle) {
            int contiguous = 1;
            for (int b = 0; b < r.kv.nblk[r.slot[0]]; b++) contiguous &= r.kv.tables[b] == b;
            CHECK(!contiguous, "shuffled cache gave a contiguous table");
        }
        run_schedule(&r, m, tok, c ? got : ref, c ? am : am_ref);
        if (c)
            CHECK(memcmp(got, ref, sizeof(float) * SCHED_ROWS * V) == 0 && memcmp(am, am_ref, sizeof am) == 0,
                  "%d threads, shuffle %llu: logits differ (rel %g)", cases[c].threads,
                  (unsigned long long)cases[c].shuffle, tm_rel_err(got, ref, (int64_t)SCHED_ROWS * V));
        rig_free(&r);
    }
    free(ref);
    free(got);
}

/* Three requests of different lengths in one step == each alone. */
static void t_multi_request(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok) { CHECK(0, "no model"); return; }
    int V = m->cfg.V;
    int tok[3][MAXLEN];
    const int plen[3] = {21, 3, 9}, vrows[3] = {8, 1, 4};
    for (int q = 0; q < 3; q++) rand_tokens(tok[q], MAXLEN, V, 300 + q);
    /* alone: prefill step, then verify step, per request, each on its own rig */
    float *alone = malloc(sizeof(float) * 3 * 32 * V), *mixed = malloc(sizeof(float) * 64 * V);
    int am_alone[3][32], am_mixed[64];
    for (int q = 0; q < 3; q++) {
        rig r;
        rig_init(&r, m, 2, 0, 1);
        if (!r.ok) goto out;
        rig_step(&r, m, 0, tok[q], 0, plen[q], alone + (int64_t)q * 32 * V, am_alone[q], NULL);
        rig_step(&r, m, 0, tok[q], plen[q], vrows[q], alone + ((int64_t)q * 32 + plen[q]) * V, am_alone[q] + plen[q], NULL);
        rig_free(&r);
    }
    /* mixed: one step holding the three prefills, one step holding the three verifies */
    rig r;
    rig_init(&r, m, 3, 4242, 3);
    if (!r.ok) goto out;
    for (int phase = 0; phase < 2; phase++) {
        int t[64], p[64], rq[64], n = 0, row0[3];
        for (int q = 0; q < 3; q++) {
            int p0 = phase ? plen[q] : 0, cnt = phase ? vrows[q] : plen[q];
            row0[q] = n;
            for (int i = 0; i < cnt; i++, n++) { t[n] = tok[q][p0 + i]; p[n] = p0 + i; rq[n] = r.slot[q]; }
        }
        sm_step s = {.nrows = n, .tokens = t, .pos = p, .req = rq, .kv = &r.kv, .logits = mixed, .argmax = am_mixed};
        sm_err e = {""};
        CHECK(r.b.step(r.b.ctx, &s, &e) == 0, "%s", e.msg);
        for (int q = 0; q < 3; q++) {
            int p0 = phase ? plen[q] : 0, cnt = phase ? vrows[q] : plen[q];
            const float *a = alone + ((int64_t)q * 32 + p0) * V, *b = mixed + (int64_t)row0[q] * V;
            CHECK(memcmp(a, b, sizeof(float) * cnt * V) == 0, "request %d phase %d: logits differ (rel %g)", q, phase,
                  tm_rel_err(b, a, (int64_t)cnt * V));
            CHECK(memcmp(am_alone[q] + p0, am_mixed + row0[q], sizeof(int) * cnt) == 0, "request %d argmax differ", q);
        }
    }
    rig_free(&r);
out:
    free(alone);
    free(mixed);
}

/* Every expert format runs; MXFP4 and FP8 logits stay near BF16 of the same seed. */
static void t_expert_formats(void) {
    int V = 0;
    tmodel mx, f8, on;
    tiny_make(&mx, SM_EXP_MXFP4, 7, 0);
    tiny_make(&f8, SM_EXP_FP8, 7, 0);
    tiny_make(&on, SM_EXP_BF16, 7, 1); /* BF16 checkpoint, MXFP4 at load */
    /* online MXFP4 runs W4A4 by default (src/model/quant.h); this test measures the weight
     * formats' error alone, W4A16 as the mxfp4 checkpoint without a quantization_config runs */
    for (int l = 0; on.ok && l < on.m.cfg.L; l++) on.m.layers[l].ex.act_mx = 0;
    tmodel bf;
    tiny_make(&bf, SM_EXP_BF16, 7, 0);
    if (!mx.ok || !f8.ok || !on.ok || !bf.ok) goto out;
    V = bf.m.cfg.V;
    int L = bf.m.cfg.L;
    CHECK(mx.m.layers[1].ex.fmt == SM_EXP_MXFP4 && mx.m.layers[0].ex.fmt == SM_EXP_BF16 &&
          mx.m.layers[L - 1].ex.fmt == SM_EXP_BF16, "mxfp4 layer formats");
    CHECK(f8.m.layers[1].ex.fmt == SM_EXP_FP8, "fp8 layer format");
    CHECK(on.m.layers[1].ex.fmt == SM_EXP_MXFP4, "online mxfp4 layer format %d", on.m.layers[1].ex.fmt);
    int tok[MAXLEN];
    rand_tokens(tok, MAXLEN, V, 404);
    float *lg[4];
    int am[4][SCHED_ROWS];
    tmodel *ms[4] = {&bf, &mx, &f8, &on};
    const char *nm[4] = {"bf16", "mxfp4", "fp8", "online-mxfp4"};
    for (int i = 0; i < 4; i++) {
        lg[i] = malloc(sizeof(float) * SCHED_ROWS * V);
        rig r;
        rig_init(&r, &ms[i]->m, 2, 0, 1);
        if (!r.ok) { for (int j = 0; j <= i; j++) free(lg[j]); goto out; }
        run_schedule(&r, &ms[i]->m, tok, lg[i], am[i]);
        rig_free(&r);
        int finite = 1;
        for (int64_t k = 0; k < (int64_t)SCHED_ROWS * V; k++)
            if (k % V < ms[i]->m.cfg.vocab_used) finite &= isfinite(lg[i][k]) != 0;
        CHECK(finite, "%s: non-finite logits", nm[i]);
    }
    for (int i = 1; i < 4; i++) {
        double re = tm_rel_err(lg[i], lg[0], (int64_t)SCHED_ROWS * V);
        int same = 0;
        for (int k = 0; k < SCHED_ROWS; k++) same += am[i][k] == am[0][k];
        printf("  %s vs bf16 (same seed): logits rel err %.3f, argmax equal on %d of %d rows\n", nm[i], re, same,
               SCHED_ROWS);
        CHECK(re < 1.0, "%s: logits rel err %g vs bf16", nm[i], re);
    }
    {
        double re = tm_rel_err(lg[3], lg[1], (int64_t)SCHED_ROWS * V);
        printf("  online-mxfp4 vs the mxfp4 checkpoint: logits rel err %g%s\n", re,
               memcmp(lg[3], lg[1], sizeof(float) * SCHED_ROWS * V) ? "" : " (bit-identical)");
    }
    for (int i = 0; i < 4; i++) free(lg[i]);
    /* one MoE layer on identical inputs: the quantization error alone */
    {
        const sm_config *c = &bf.m.cfg;
        int n = 16, H = c->H, K = c->K;
        float *xf = malloc(sizeof(float) * n * H), *f0 = malloc(sizeof(float) * n * H), *f1 = malloc(sizeof(float) * n * H);
        int *i0 = malloc(sizeof(int) * n * K), *i1 = malloc(sizeof(int) * n * K);
        uint64_t sd = 99;
        for (int i = 0; i < n * H; i++) {
            xf[i] = sm_r16((float)((double)(sm_rng_next(&sd) >> 11) / 9007199254740992.0 * 3.4 - 1.7));
        }
        for (int i = 1; i < 4; i++)
            for (int l = 1; l < L - 1; l++) {
                ref_moe(NULL, &bf.m, l, xf, n, f0, i0, NULL, NULL, NULL);
                ref_moe(NULL, &ms[i]->m, l, xf, n, f1, i1, NULL, NULL, NULL);
                double re = tm_rel_err(f1, f0, (int64_t)n * H);
                printf("  %s vs bf16, MoE branch of layer %d on the same inputs: rel err %.3f\n", nm[i], l, re);
                CHECK(re < 0.3, "%s layer %d: MoE rel err %g", nm[i], l, re);
                CHECK(memcmp(i0, i1, sizeof(int) * n * K) == 0, "%s layer %d: routes differ", nm[i], l);
            }
        free(xf); free(f0); free(f1); free(i0); free(i1);
    }
    /* our dequantization == the loader's, bit for bit, every format */
    {
        const sm_config *c = &bf.m.cfg;
        int n = c->Hm > c->I ? c->Hm : c->I, bad = 0;
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        for (int i = 0; i < 4; i++)
            for (int e = 0; e < c->E; e += 3)
                for (int which = 0; which < 2; which++)
                    for (int row = 0; row < (which ? c->Hm : 2 * c->I); row += 17) {
                        int cols = which ? c->I : c->Hm;
                        ref_expert_row(&ms[i]->m, 1, e, which, row, a);
                        sm_expert_row(&ms[i]->m, 1, e, which, row, b);
                        bad += memcmp(a, b, sizeof(float) * cols) != 0;
                    }
        CHECK(bad == 0, "%d expert rows dequantize differently from sm_expert_row", bad);
        free(a);
        free(b);
    }
out:
    tmodel_free(&bf);
    tmodel_free(&mx);
    tmodel_free(&f8);
    tmodel_free(&on);
}

/* The grouped MoE (routes gathered per expert, threads across experts) == route by route. */
static void t_moe_grouping(void) {
    tmodel t;
    tiny_make(&t, SM_EXP_MXFP4, 9, 0);
    if (!t.ok) { tmodel_free(&t); return; }
    const sm_model *m = &t.m;
    const sm_config *c = &m->cfg;
    int n = 12, H = c->H, Hm = c->Hm, K = c->K;
    float *xf = malloc(sizeof(float) * n * H), *f = malloc(sizeof(float) * n * H), *f2 = malloc(sizeof(float) * n * H);
    float *h1 = malloc(sizeof(float) * n * Hm), *mo = malloc(sizeof(float) * n * Hm), *yn = malloc(sizeof(float) * Hm);
    int *idx = malloc(sizeof(int) * n * K);
    float *w = malloc(sizeof(float) * n * K);
    uint64_t s = 77;
    for (int i = 0; i < n * H; i++) {
        xf[i] = sm_r16((float)((double)(sm_rng_next(&s) >> 11) / 9007199254740992.0 * 4.0 - 2.0));
    }
    sm_pool *p = NULL;
    sm_err e = {""};
    CHECK(sm_pool_create(3, &p, &e) == 0, "%s", e.msg);
    for (int l = 0; l < c->L; l++) {
        ref_moe(p, m, l, xf, n, f, idx, w, h1, mo);
        ref_moe(NULL, m, l, xf, n, f2, NULL, NULL, NULL, NULL);
        CHECK(memcmp(f, f2, sizeof(float) * n * H) == 0, "layer %d: pool vs no pool differ", l);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            int id2[64];
            float w2[64], lg2[1024];
            if (c->E > 1024 || K > 64) break;
            ref_route(NULL, c, xf + (int64_t)i * H, 1, m->layers[l].router, m->layers[l].router_bias, lg2, id2, w2);
            bad += memcmp(id2, idx + i * K, sizeof(int) * K) != 0 || memcmp(w2, w + i * K, sizeof(float) * K) != 0;
            /* m = r16(sum_k w_k yn_k) from one-route experts */
            float acc[1024];
            if (Hm > 1024) break;
            for (int x = 0; x < Hm; x++) acc[x] = 0.0f;
            for (int k = 0; k < K; k++) {
                ref_expert(m, l, idx[i * K + k], h1 + (int64_t)i * Hm, yn);
                for (int x = 0; x < Hm; x++) acc[x] += w[i * K + k] * yn[x];
            }
            for (int x = 0; x < Hm; x++) bad += sm_r16(acc[x]) != mo[(int64_t)i * Hm + x];
            /* routes: distinct, weights positive and summing to route_scale */
            float sum = 0;
            for (int k = 0; k < K; k++) {
                sum += w[i * K + k];
                for (int j = 0; j < k; j++) bad += idx[i * K + j] == idx[i * K + k];
            }
            bad += fabsf(sum - c->route_scale) > 1e-5f;
        }
        CHECK(bad == 0, "layer %d: %d mismatches between grouped MoE and route-by-route", l, bad);
    }
    sm_pool_destroy(p);
    free(xf); free(f); free(f2); free(h1); free(mo); free(yn); free(idx); free(w);
    tmodel_free(&t);
}

/* Bad steps are refused with a message naming the row. */
static void t_step_errors(void) {
    const sm_model *m = &g_bf16.m;
    if (!g_bf16.ok) { CHECK(0, "no model"); return; }
    rig r;
    rig_init(&r, m, 1, 0, 1);
    if (!r.ok) return;
    int V = m->cfg.V, L = m->cfg.L;
    float *lg = malloc(sizeof(float) * 2 * V);
    int am[2], tok[2] = {5, V}, pos[2] = {0, 1}, req[2] = {r.slot[0], r.slot[0]};
    sm_err e = {""};
    sm_step s = {.nrows = 2, .tokens = tok, .pos = pos, .req = req, .kv = &r.kv, .logits = lg, .argmax = am};
    CHECK(r.b.step(r.b.ctx, &s, &e) == -1 && strstr(e.msg, "row 1") && strstr(e.msg, "token"), "%s", e.msg);
    tok[1] = 6;
    pos[1] = MAXLEN;
    CHECK(r.b.step(r.b.ctx, &s, &e) == -1 && strstr(e.msg, "position"), "%s", e.msg);
    pos[1] = 1;
    req[1] = 3;
    CHECK(r.b.step(r.b.ctx, &s, &e) == -1 && strstr(e.msg, "request 3"), "%s", e.msg);
    req[1] = r.slot[0];
    int al = L + 1;
    float aux[2 * 256];
    sm_step s2 = s;
    s2.naux = 1;
    s2.aux_layers = &al;
    s2.aux = aux;
    CHECK(r.b.step(r.b.ctx, &s2, &e) == -1 && strstr(e.msg, "aux layer"), "%s", e.msg);
    /* an unreserved position: release and re-add with 16 positions, ask for position 20 */
    sm_kv_release(&r.kv, r.slot[0]);
    CHECK(sm_kv_add(&r.kv, &r.slot[0], &e) == 0 && sm_kv_reserve(&r.kv, r.slot[0], 16, &e) == 0, "%s", e.msg);
    req[0] = req[1] = r.slot[0];
    pos[1] = 20;
    CHECK(r.b.step(r.b.ctx, &s, &e) == -1 && strstr(e.msg, "no reserved cache page"), "%s", e.msg);
    /* a good step still works, without a logits buffer */
    pos[1] = 1;
    sm_step s3 = s;
    s3.logits = NULL;
    CHECK(r.b.step(r.b.ctx, &s3, &e) == 0, "%s", e.msg);
    CHECK(am[0] >= 0 && am[0] < m->cfg.vocab_used, "argmax %d", am[0]);
    /* world > 1 is refused at create */
    sm_backend b2;
    sm_backend_opts bo = {.nthreads = 1, .world = 2, .max_rows = 8};
    CHECK(sm_cpu_backend_create(m, &r.kv, &bo, &b2, &e) == -1 && strstr(e.msg, "world"), "%s", e.msg);
    free(lg);
    rig_free(&r);
}

/* The pool: every index once, any thread count, nested calls inline. */
typedef struct pool_arg { atomic_int *hits; int n; sm_pool *p; atomic_int nested; } pool_arg;
static void nested_fn(void *a, int64_t lo, int64_t hi, int tid) {
    pool_arg *pa = a;
    (void)tid;
    atomic_fetch_add(&pa->nested, (int)(hi - lo));
}
static void hit_fn(void *a, int64_t lo, int64_t hi, int tid) {
    pool_arg *pa = a;
    if (tid < 0 || tid >= sm_pool_nthreads(pa->p)) atomic_fetch_add(&pa->hits[0], 1000000);
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&pa->hits[i], 1);
    if (lo == 0) sm_pool_for(pa->p, 10, 3, nested_fn, pa);
}
static void t_pool(void) {
    sm_err e = {""};
    for (int nt = 1; nt <= 4; nt++) {
        sm_pool *p;
        CHECK(sm_pool_create(nt, &p, &e) == 0, "%s", e.msg);
        CHECK(sm_pool_nthreads(p) == nt, "nthreads %d", sm_pool_nthreads(p));
        for (int rep = 0; rep < 50; rep++) {
            int n = 1 + rep * 37 % 500;
            atomic_int *hits = calloc((size_t)n, sizeof *hits);
            pool_arg pa = {hits, n, p, 0};
            sm_pool_for(p, n, 1 + rep % 7, hit_fn, &pa);
            int bad = 0;
            for (int i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
            CHECK(bad == 0, "%d threads, n %d: %d indices not hit exactly once", nt, n, bad);
            CHECK(atomic_load(&pa.nested) == 10, "nested call covered %d of 10", atomic_load(&pa.nested));
            free(hits);
        }
        sm_pool_destroy(p);
    }
    CHECK(sm_pool_create(-1, &(sm_pool *){0}, &e) == -1 && strstr(e.msg, "negative"), "%s", e.msg);
}

int main(void) {
    tiny_make(&g_bf16, SM_EXP_BF16, 3, 0);
    RUN(t_verify_equals_decodes);
    RUN(t_paged_and_threads);
    RUN(t_multi_request);
    RUN(t_expert_formats);
    RUN(t_moe_grouping);
    RUN(t_step_errors);
    RUN(t_pool);
    tmodel_free(&g_bf16);
    return TEST_DONE();
}
