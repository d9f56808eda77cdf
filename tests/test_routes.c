/* test_routes.c: route coverage (tests/condition.h: route_coverage, route_cover_ok,
 * route_same), the check the GPU model tests run on every natural-routing step.
 *
 * On hand-made routes: the bounds (half the experts in every layer of an assessed step, every
 * EP rank reached), the step size from which they apply, ids out of range, route sets in any
 * order.  On tiny models through the CPU reference (its debug trace hands over each layer's
 * route ids): steps shaped like the GPU test's (prefill chunks of 128 rows, verify steps of 3
 * to 48 rows) pass with the router's own bias and fail, every assessed one, with
 * separate_routing's 100x bias, so the check can tell the two apart.  We rejected a bound on
 * the expected distinct count of uniform routing: a real router is not uniform, and what the
 * check must catch is the biased one.
 */
#include "check.h"
#include "condition.h"
#include "tmodel.h"
#include "backend/backend.h"
#include "backend/kvcache.h"
#include "cpu/debug.h"
#include "model/rng.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXLEN 256  /* positions per request */
#define NREQ 3
#define NSTEP 32    /* steps of the plan, at most */
#define CHUNK 128   /* prefill rows a step */

/* ---------------------------------------------------------------- hand-made routes */

static void test_cover_synthetic(void) {
    enum { L = 2, K = 4, E = 16, N = 16 };
    int idx[L * N * K];
    /* every row on experts 0..3 (a dominating bias): 4 < 8 experts, 6 of 8 ranks idle a layer */
    for (int i = 0; i < L * N * K; i++) idx[i] = i % K;
    route_cover c = route_coverage(idx, L, N, K, E, 8);
    CHECK(c.assessed && !c.ranks_assessed && c.min_distinct == 4 && c.need == 8 && c.idle == 12 && !c.bad,
          "same experts: %d %d %d %d %d", c.assessed, c.ranks_assessed, c.min_distinct, c.idle, c.bad);
    CHECK(!route_cover_ok(&c), "a step on 4 of 16 experts passes");
    /* row i on experts 4i..4i+3 mod 16: all 16 in both layers, every rank */
    for (int l = 0; l < L; l++)
        for (int i = 0; i < N; i++)
            for (int k = 0; k < K; k++) idx[(l * N + i) * K + k] = (i * K + k) % E;
    for (int w = 1; w <= 8; w *= 2) {
        c = route_coverage(idx, L, N, K, E, w);
        CHECK(route_cover_ok(&c) && c.min_distinct == E && c.idle == 0, "spread routes fail at W = %d", w);
    }
    /* 32 rows on experts 0..3: 8 ranks assessed (16 routes each expected), 6 idle a layer */
    int idx32[L * 32 * K];
    for (int i = 0; i < L * 32 * K; i++) idx32[i] = i % K;
    c = route_coverage(idx32, L, 32, K, E, 8);
    CHECK(c.ranks_assessed && c.idle == 12 && !route_cover_ok(&c), "32 rows: ranks not assessed (%d) or idle %d", c.ranks_assessed,
          c.idle);
    /* layer 1 on experts 0..7 only: exactly half (passes), but rank 1 of 2 idle */
    for (int i = 0; i < N * K; i++) idx[N * K + i] = i % 8;
    c = route_coverage(idx, L, N, K, E, 1);
    CHECK(route_cover_ok(&c) && c.min_distinct == 8 && c.min_layer == 1, "half the experts: %d in layer %d", c.min_distinct,
          c.min_layer);
    c = route_coverage(idx, L, N, K, E, 2);
    CHECK(c.ranks_assessed && !route_cover_ok(&c) && c.idle == 1, "an idle rank passes (idle %d)", c.idle);
    c = route_coverage(idx, L, N, K, E, 8); /* 8 routes a rank expected: reported only */
    CHECK(!c.ranks_assessed && route_cover_ok(&c) && c.idle == 4, "16 rows, W = 8: ranks assessed or idle %d", c.idle);
    /* one expert fewer: fails */
    for (int i = 0; i < N * K; i++) idx[N * K + i] = i % 7;
    c = route_coverage(idx, L, N, K, E, 1);
    CHECK(!route_cover_ok(&c) && c.min_distinct == 7, "7 of 16 experts pass");
    /* 15 rows (60 routes < 4E): reported, not assessed */
    c = route_coverage(idx, L, 15, K, E, 8);
    CHECK(!c.assessed && route_cover_ok(&c), "a step of 15 rows is assessed");
    /* an id out of range fails any step */
    idx[5] = E;
    c = route_coverage(idx, L, 15, K, E, 1);
    CHECK(c.bad == 1 && !route_cover_ok(&c), "id %d passes", E);
    idx[5] = -1;
    c = route_coverage(idx, L, N, K, E, 1);
    CHECK(c.bad == 1 && !route_cover_ok(&c), "id -1 passes");
}

static void test_route_same(void) {
    const int a[4] = {3, 9, 0, 12}, b[4] = {12, 0, 3, 9}, d[4] = {3, 9, 0, 13};
    CHECK(route_same(a, a, 4) && route_same(a, b, 4) && route_same(b, a, 4), "the same set in another order differs");
    CHECK(!route_same(a, d, 4) && !route_same(d, a, 4), "sets differing in one expert are the same");
}

/* ---------------------------------------------------------------- a model's routes */

/* The route ids of the last step, from the CPU backend's trace: [L, cap, K]. */
typedef struct rt_rec {
    int L, K, cap;
    int *idx;
} rt_rec;

static void rt_trace(void *arg, int layer, const char *stage, const float *data, int n, int width) {
    rt_rec *r = arg;
    if (strcmp(stage, "route_idx") || layer < 0 || layer >= r->L || n > r->cap || width != r->K) return;
    for (int i = 0; i < n * width; i++) r->idx[(size_t)layer * n * width + i] = (int)data[i];
}

/* Run the plan on tiny (MXFP4, seed; routing scaled by bias_scale, 1 = the router's own) and
 * put each step's coverage at W = 1, 2, 4, 8 into cov[step][0..3]; returns the steps, or -1. */
static int run_plan(uint64_t seed, float bias_scale, route_cover cov[NSTEP][4]) {
    tmodel t;
    sm_config c;
    sm_err e = {""};
    float *bias = NULL;
    int ns = -1, ok_kv = 0, ok_b = 0;
    sm_kv kv;
    sm_backend b;
    rt_rec rec = {0, 0, 0, NULL};
    if (sm_config_preset("tiny", &c, &e)) { CHECK(0, "%s", e.msg); return -1; }
    if (tmodel_make(&t, "sm_routes", &c, SM_EXP_MXFP4, seed, 0)) goto done;
    residual_dominant(&t.m, seed);
    if (bias_scale != 1.0f && separate_routing(&t.m, bias_scale, &bias)) { CHECK(0, "out of memory"); goto done; }
    c = t.m.cfg;
    rec = (rt_rec){c.L, c.K, 2 * CHUNK, malloc(sizeof(int) * (size_t)c.L * 2 * CHUNK * c.K)};
    int *tok = malloc(sizeof(int) * 3 * CHUNK), *pos = tok ? tok + CHUNK : NULL, *req = tok ? tok + 2 * CHUNK : NULL;
    if (!rec.idx || !tok) { CHECK(0, "out of memory"); free(tok); goto done; }
    if (sm_kv_init(&kv, NREQ * MAXLEN / SM_KV_BLOCK + 2, NREQ, MAXLEN, seed, &e)) { CHECK(0, "%s", e.msg); free(tok); goto done; }
    ok_kv = 1;
    int slot[NREQ], cur[NREQ] = {0, 0, 0};
    static const int lens[NREQ] = {33, 64, 97};
    for (int q = 0; q < NREQ; q++)
        if (sm_kv_add(&kv, &slot[q], &e) || sm_kv_reserve(&kv, slot[q], MAXLEN, &e)) { CHECK(0, "%s", e.msg); free(tok); goto done; }
    sm_backend_opts bo = {.nthreads = 2, .world = 1, .max_rows = CHUNK};
    if (sm_cpu_backend_create(&t.m, &kv, &bo, &b, &e)) { CHECK(0, "%s", e.msg); free(tok); goto done; }
    ok_b = 1;
    sm_cpu_backend_trace(b.ctx, rt_trace, &rec);
    uint64_t rng = seed * 7919 + 1;
    /* the prompts in steps of at most CHUNK rows, then verify steps of 3 to 48 rows, then 17
     * rows of one request */
    static const int widths[][NREQ] = {{8, 5, 8}, {8, 8, 8}, {1, 1, 1}, {16, 16, 16}, {3, 8, 2}, {8, 1, 16}, {7, 7, 7}};
    const int nw = (int)(sizeof widths / sizeof widths[0]);
    int q0 = 0, st = 0;
    ns = 0;
    while (st < nw + 1) {
        int n = 0;
        if (q0 < NREQ) { /* prefill rows, request by request, up to CHUNK a step */
            while (q0 < NREQ && n < CHUNK) {
                req[n] = slot[q0], pos[n] = cur[q0]++, n++;
                if (cur[q0] == lens[q0]) q0++;
            }
        } else if (st < nw) {
            for (int q = 0; q < NREQ; q++)
                for (int j = 0; j < widths[st][q]; j++, n++) req[n] = slot[q], pos[n] = cur[q] + j;
            for (int q = 0; q < NREQ; q++) cur[q] += 1 + (int)(sm_rng_next(&rng) % (uint64_t)widths[st][q]);
            st++;
        } else {
            for (int j = 0; j < 17; j++, n++) req[n] = slot[1], pos[n] = cur[1] + j;
            st++;
        }
        for (int i = 0; i < n; i++) tok[i] = (int)(sm_rng_next(&rng) % (uint64_t)c.V);
        sm_step s = {.nrows = n, .tokens = tok, .pos = pos, .req = req, .kv = &kv};
        if (b.step(b.ctx, &s, &e)) { CHECK(0, "step: %s", e.msg); ns = -1; break; }
        for (int w = 0; w < 4; w++) cov[ns][w] = route_coverage(rec.idx, c.L, n, c.K, c.E, 1 << w);
        if (++ns == NSTEP) break;
    }
    free(tok);
done:
    if (ok_b) b.destroy(b.ctx);
    if (ok_kv) sm_kv_free(&kv);
    free(rec.idx);
    free(bias);
    tmodel_free(&t);
    return ns;
}

/* The router's own bias: every assessed step passes, at every W. */
static void test_natural_covers(void) {
    for (uint64_t seed = 3000; seed < 3003; seed++) {
        route_cover cov[NSTEP][4];
        int ns = run_plan(seed, 1.0f, cov), assessed = 0, lo = 99;
        for (int i = 0; i < ns; i++) {
            if (!cov[i][0].assessed) continue;
            assessed++;
            if (cov[i][0].min_distinct < lo) lo = cov[i][0].min_distinct;
            for (int w = 0; w < 4; w++)
                CHECK(route_cover_ok(&cov[i][w]), "seed %llu step %d W %d: %d experts in layer %d (need %d), %d idle rank-layers",
                      (unsigned long long)seed, i, 1 << w, cov[i][w].min_distinct, cov[i][w].min_layer, cov[i][w].need,
                      cov[i][w].idle);
        }
        CHECK(assessed >= 8, "seed %llu: %d assessed steps", (unsigned long long)seed, assessed);
        printf("  natural routing, seed %llu: %d of %d steps assessed, fewest experts a layer %d of 16\n", (unsigned long long)seed,
               assessed, ns, lo);
    }
}

/* separate_routing's 100x bias: every assessed step fails at W = 1 (experts), and every one
 * whose ranks are assessed at W = 8 (idle ranks alone). */
static void test_biased_fails(void) {
    for (uint64_t seed = 3000; seed < 3003; seed++) {
        route_cover cov[NSTEP][4];
        int ns = run_plan(seed, 100.0f, cov), assessed = 0, ranked = 0, hi = 0;
        for (int i = 0; i < ns; i++) {
            if (!cov[i][0].assessed) continue;
            assessed++;
            if (cov[i][0].min_distinct > hi) hi = cov[i][0].min_distinct;
            CHECK(!route_cover_ok(&cov[i][0]), "seed %llu step %d: a biased router passes (%d experts)", (unsigned long long)seed, i,
                  cov[i][0].min_distinct);
            if (!cov[i][3].ranks_assessed) continue;
            ranked++;
            CHECK(cov[i][3].idle > 0, "seed %llu step %d: a biased router reaches all 8 ranks", (unsigned long long)seed, i);
        }
        CHECK(assessed >= 8 && ranked >= 3, "seed %llu: %d assessed steps, %d with W = 8 ranks", (unsigned long long)seed, assessed,
              ranked);
        printf("  bias x100, seed %llu: %d of %d steps assessed (%d at W = 8), most experts in its fewest layer %d of 16\n",
               (unsigned long long)seed, assessed, ns, ranked, hi);
    }
}

int main(void) {
    RUN(test_cover_synthetic);
    RUN(test_route_same);
    RUN(test_natural_covers);
    RUN(test_biased_fails);
    return TEST_DONE();
}
