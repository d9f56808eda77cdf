/* test_sample.c: the sampler (src/engine/sample.h) and sampled generation through the engine.
 *
 * Unit level: the min-p / top-k / top-p cut and the probabilities against a brute-force
 * reference (whole-row sort, long double softmax) on random rows with ties and -inf ids, and
 * min_p by hand (before top_p and top_k, as vLLM); the draw as an
 * inverse CDF; the per-position uniform; the speculative rule (acceptance rate p(d), the
 * tokens after a rejection distributed as p without d) against an independent two-uniform
 * implementation of the textbook rule.  Engine level, on a tiny cycle model (make-model
 * --cycle: the n-gram drafts are right often, so verify steps of R = 8 accept drafts):
 * chi-square tests at a fixed threshold of the first and later tokens' frequencies over many
 * seeds against the exact softmax of the prefill logits (conditioned on the earlier tokens),
 * speculative (R = 8) against plain (R = 1) on disjoint seed sets, and the same seed giving the
 * same tokens whatever R and whatever requests share the step; greedy stays greedy.  The
 * step's selected-row logits (sm_step.logits_at) are checked against full logits on the CPU
 * backend and a 2-rank world.  Every statistical test also shows it can fail: the same counts
 * against a slightly wrong distribution exceed the threshold.  Seeds are fixed, so the test is
 * deterministic.  We rejected comparing sampled streams to recorded ones: they would pin the
 * generator, not check the distribution.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "tmodel.h"
#include "backend/backend.h"
#include "engine/engine.h"
#include "backend/kvcache.h"
#include "testing/makemodel.h"
#include "model/rng.h"
#include "engine/sample.h"
#include "sparkmono.h"

#define CHI_Z 3.719 /* standard normal quantile of 1 - 1e-4: the threshold of every chi-square test */

static char g_tmp[512];
static sparkmono_model *g_cyc;   /* tiny cycle model (cycle 3..18) */
static sparkmono_model *g_rnd;   /* tiny random model */
static int g_V, g_vu;            /* vocab size, vocab_used */

/* ---- statistics ------------------------------------------------------------------------- */

/* Chi-square critical value at 1 - 1e-4 for df degrees of freedom (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double a = 2.0 / (9.0 * df);
    double t = 1 - a + CHI_Z * sqrt(a);
    return df * t * t * t;
}

/* Goodness of fit of counts [n] (N in all) to probabilities p [n]: categories expected below 5
 * are pooled into one.  Returns the statistic; *df its degrees of freedom. */
static double chi2_gof(const long *cnt, const double *p, int n, long N, int *df) {
    double st = 0, pe = 0;
    long pc = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        double ex = p[i] * (double)N;
        if (ex < 5) { pe += ex; pc += cnt[i]; continue; }
        st += (cnt[i] - ex) * (cnt[i] - ex) / ex;
        k++;
    }
    if (pc > 0 || pe >= 1) { /* the pooled rare ids (left out when expected and seen are ~0) */
        if (pe < 1e-300) return INFINITY; /* draws where the distribution has no mass */
        st += (pc - pe) * (pc - pe) / pe;
        k++;
    }
    *df = k > 1 ? k - 1 : 1;
    return st;
}

/* Two-sample chi-square of counts a [n] (Na in all) and b [n] (Nb): categories with fewer than
 * 10 draws in both samples together are pooled. */
static double chi2_two(const long *a, const long *b, int n, long Na, long Nb, int *df) {
    double ka = sqrt((double)Nb / (double)Na), kb = sqrt((double)Na / (double)Nb), st = 0;
    long pa = 0, pb = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (a[i] + b[i] < 10) { pa += a[i]; pb += b[i]; continue; }
        double d = ka * a[i] - kb * b[i];
        st += d * d / (double)(a[i] + b[i]);
        k++;
    }
    if (pa + pb > 0) {
        double d = ka * pa - kb * pb;
        st += d * d / (double)(pa + pb);
        k++;
    }
    *df = k > 1 ? k - 1 : 1;
    return st;
}

/* ---- reference distribution ------------------------------------------------------------- */

typedef struct ref_item { float l; int id; } ref_item;
static int ref_cmp(const void *a, const void *b) {
    const ref_item *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->id - y->id;
}

/* p [nv] of logits l [nv] under (T, min_p, top_k, top_p) by the definition: sort the whole row
 * by (logit desc, id asc), drop the ids whose probability is below min_p times the first one's
 * (vLLM: after temperature, before top-k / top-p), keep the first k of the rest, then the
 * shortest prefix reaching top_p, softmax of l / T over the kept ids in long double. */
static void ref_dist(const float *l, int nv, double T, double min_p, int k, double top_p, double *p) {
    ref_item *it = malloc((size_t)nv * sizeof *it);
    long double *w = malloc((size_t)nv * sizeof *w);
    float lmax = -INFINITY;
    for (int i = 0; i < nv; i++) {
        it[i].l = l[i];
        it[i].id = i;
        if (l[i] > lmax) lmax = l[i];
    }
    qsort(it, (size_t)nv, sizeof *it, ref_cmp);
    int nm = 0; /* the ids min_p keeps: a prefix of the order (p / p_max = exp((l - l_max) / T)) */
    while (nm < nv && !(expl(((long double)it[nm].l - lmax) / T) < min_p)) nm++;
    int kk = k > 0 && k < nm ? k : nm;
    long double tot = 0;
    for (int j = 0; j < kk; j++) {
        w[j] = expl(((long double)it[j].l - lmax) / T);
        tot += w[j];
    }
    int m = kk;
    if (top_p > 0 && top_p < 1) {
        long double cum = 0;
        for (int j = 0; j < kk; j++) {
            cum += w[j];
            if (cum >= top_p * tot) { m = j + 1; break; }
        }
    }
    long double keep = 0;
    for (int j = 0; j < m; j++) keep += w[j];
    for (int i = 0; i < nv; i++) p[i] = 0;
    for (int j = 0; j < m; j++) p[it[j].id] = (double)(w[j] / keep);
    free(it);
    free(w);
}

static double unif(uint64_t *s) { return (double)(sm_rng_next(s) >> 11) * 0x1.0p-53; }

/* ---- unit tests ------------------------------------------------------------------------- */

static void test_check(void) {
    sm_err e = {{0}};
    sparkmono_sampling ok = {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .seed = 5}, s;
    CHECK(sm_sample_check(&ok, &e) == 0, "valid: %s", e.msg);
    s = ok; s.temperature = -0.1f;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "temperature"), "negative T: %s", e.msg);
    s = ok; s.temperature = NAN;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "temperature"), "NaN T: %s", e.msg);
    s = ok; s.top_k = -1;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "top_k"), "top_k: %s", e.msg);
    s = ok; s.top_p = 1.5f;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "top_p"), "top_p: %s", e.msg);
    s = ok; s.top_p = NAN;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "top_p"), "top_p NaN: %s", e.msg);
    s = ok; s.min_p = 1.5f;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "min_p 1.5 is not in [0, 1]"), "min_p: %s", e.msg);
    s = ok; s.min_p = -0.25f;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "min_p -0.25"), "min_p negative: %s", e.msg);
    s = ok; s.min_p = NAN;
    CHECK(sm_sample_check(&s, &e) == -1 && strstr(e.msg, "min_p"), "min_p NaN: %s", e.msg);
    s = ok; s.min_p = 1.0f;
    CHECK(sm_sample_check(&s, &e) == 0, "min_p 1 is valid: %s", e.msg);
    sparkmono_sampling zero = {0};
    CHECK(sm_sample_check(&zero, &e) == 0, "zero (greedy) is valid");
}

static void test_dist_reference(void) {
    /* random rows (some with heavy ties, some with -inf ids) against the definition */
    const int NV = 700;
    sm_sample_ws ws;
    sm_err e = {{0}};
    if (sm_sample_ws_init(&ws, NV, &e)) { CHECK(0, "%s", e.msg); return; }
    float *l = malloc(NV * sizeof(float));
    double *p = malloc(NV * sizeof(double));
    uint64_t s = 99;
    int bad_set = 0, bad_p = 0, runs = 0;
    double worst = 0;
    for (int it = 0; it < 600; it++) {
        int nv = 1 + (int)(sm_rng_next(&s) % NV);
        int kind = (int)(sm_rng_next(&s) % 3);
        double scale = 0.2 + 8 * unif(&s);
        for (int i = 0; i < nv; i++) {
            double z = (unif(&s) - 0.5) * scale;
            l[i] = kind == 1 ? (float)floor(z * 2) : (float)z; /* kind 1: many equal logits */
            if (kind == 2 && sm_rng_next(&s) % 5 == 0) l[i] = -INFINITY;
        }
        l[sm_rng_next(&s) % (uint64_t)nv] = (float)scale; /* at least one finite */
        static const float Ts[] = {0.05f, 0.5f, 1.0f, 1.7f, 30.0f};
        static const int Ks[] = {0, 1, 2, 5, 50, 100000};
        static const float Ps[] = {0.0f, 1.0f, 0.3f, 0.9f, 0.999f, 1e-6f};
        static const float Ms[] = {0.0f, 0.0f, 1e-4f, 0.05f, 0.3f, 0.7f, 1.0f}; /* min_p: none (twice), up to the top id's ties */
        sparkmono_sampling sp = {.temperature = Ts[sm_rng_next(&s) % 5], .top_k = Ks[sm_rng_next(&s) % 6], .top_p = Ps[sm_rng_next(&s) % 6], .seed = 0};
        sp.min_p = Ms[sm_rng_next(&s) % 7];
        if (sm_sample_dist(&ws, l, nv, &sp, &e)) { CHECK(0, "dist: %s", e.msg); break; }
        ref_dist(l, nv, sp.temperature, sp.min_p, sp.top_k, sp.top_p, p);
        int kept = 0;
        for (int i = 0; i < nv; i++) {
            double q = sm_sample_prob(&ws, i);
            kept += q > 0;
            if ((q > 0) != (p[i] > 0)) {
                if (bad_set++ < 5)
                    printf("  row %d id %d: p %.17g, reference %.17g (nv %d, T %g, min_p %g, k %d, p %g)\n", it, i, q, p[i],
                           nv, (double)sp.temperature, (double)sp.min_p, sp.top_k, (double)sp.top_p);
            }
            double d = fabs(q - p[i]) / (p[i] > 1e-300 ? p[i] : 1);
            if (d > worst) worst = d;
            if (d > 1e-9) bad_p++;
        }
        if (kept != ws.nkept) bad_set++;
        runs++;
    }
    CHECK(bad_set == 0, "%d ids kept / dropped unlike the reference", bad_set);
    CHECK(bad_p == 0, "%d probabilities off the reference (worst rel %g)", bad_p, worst);
    printf("  %d rows vs the whole-row reference: worst relative error %.2g\n", runs, worst);
    /* top_k = 1 is the greedy argmax (ties to the lowest id) */
    float t[6] = {1, 3, -2, 3, 0, 3};
    sparkmono_sampling k1 = {.temperature = 0.8f, .top_k = 1, .top_p = 0, .seed = 0};
    CHECK(sm_sample_dist(&ws, t, 6, &k1, &e) == 0 && sm_sample_prob(&ws, 1) == 1.0 && ws.nkept == 1, "top_k 1 keeps id 1");
    /* min_p by hand: T 1, logits ln 1, ln 0.5, ln 0.2, ln 0.05: p / p_max = 1, 0.5, 0.2, 0.05; min_p 0.15
     * keeps the first three, renormalized 1 : 0.5 : 0.2 */
    float h[4] = {0.0f, (float)log(0.5), (float)log(0.2), (float)log(0.05)};
    sparkmono_sampling mp = {.temperature = 1.0f, .min_p = 0.15f};
    CHECK(sm_sample_dist(&ws, h, 4, &mp, &e) == 0 && ws.nkept == 3 && sm_sample_prob(&ws, 3) == 0 &&
              fabs(sm_sample_prob(&ws, 1) - 0.5 / 1.7) < 1e-6 && fabs(sm_sample_prob(&ws, 2) - 0.2 / 1.7) < 1e-6,
          "min_p 0.15: kept %d, p %g %g %g %g", ws.nkept, sm_sample_prob(&ws, 0), sm_sample_prob(&ws, 1),
          sm_sample_prob(&ws, 2), sm_sample_prob(&ws, 3));
    /* min_p before top_p: min_p 0.3 keeps 1 : 0.5, and top_p 0.6 of that mass is the first id alone
     * (1 / 1.5 = 0.67); of the whole row's mass it would be two (1 / 1.75 = 0.57 < 0.6) */
    mp.min_p = 0.3f;
    mp.top_p = 0.6f;
    CHECK(sm_sample_dist(&ws, h, 4, &mp, &e) == 0 && ws.nkept == 1, "min_p 0.3 top_p 0.6: kept %d", ws.nkept);
    mp.top_p = 0.0f;
    mp.top_k = 3;
    CHECK(sm_sample_dist(&ws, h, 4, &mp, &e) == 0 && ws.nkept == 2 && fabs(sm_sample_prob(&ws, 0) - 1 / 1.5) < 1e-6,
          "min_p 0.3 top_k 3: kept %d", ws.nkept);
    /* a NaN is refused, naming the id */
    t[4] = NAN;
    CHECK(sm_sample_dist(&ws, t, 6, &k1, &e) == -1 && strstr(e.msg, "id 4"), "NaN: %s", e.msg);
    free(l);
    free(p);
    sm_sample_ws_free(&ws);
}

static void test_draw(void) {
    /* the inverse CDF in id order, and draws with the per-position uniforms fit p */
    const int nv = 40;
    sm_sample_ws ws;
    sm_err e = {{0}};
    if (sm_sample_ws_init(&ws, nv, &e)) { CHECK(0, "%s", e.msg); return; }
    float l[40];
    uint64_t s = 7;
    for (int i = 0; i < nv; i++) l[i] = (float)(3 * unif(&s));
    sparkmono_sampling sp = {.temperature = 1.3f, .top_k = 30, .top_p = 0.95f, .seed = 0};
    CHECK(sm_sample_dist(&ws, l, nv, &sp, &e) == 0, "%s", e.msg);
    int bad = 0;
    for (int k = 0; k <= 1000; k++) {
        double u = k / 1000.0 * (1 - 1e-12), cum = 0;
        int t = sm_sample_draw(&ws, u), want = -1;
        for (int i = 0; i < nv && want < 0; i++) {
            cum += sm_sample_prob(&ws, i);
            if (sm_sample_prob(&ws, i) > 0 && cum > u) want = i;
        }
        bad += t != want && fabs(cum - u) > 1e-12;
    }
    CHECK(bad == 0, "%d grid draws are not the inverse CDF", bad);
    long cnt[40] = {0};
    double p[40];
    const long N = 200000;
    for (long k = 0; k < N; k++) cnt[sm_sample_draw(&ws, sm_sample_uniform(12345, k))]++;
    for (int i = 0; i < nv; i++) p[i] = sm_sample_prob(&ws, i);
    int df;
    double x = chi2_gof(cnt, p, nv, N, &df);
    CHECK(x < chi2_crit(df), "draws vs p: chi2 %.1f (df %d, threshold %.1f)", x, df, chi2_crit(df));
    /* the test can fail: the same counts against the distribution at T * 1.1 */
    ref_dist(l, nv, sp.temperature * 1.1, sp.min_p, sp.top_k, sp.top_p, p);
    int df2;
    double x2 = chi2_gof(cnt, p, nv, N, &df2);
    CHECK(x2 > chi2_crit(df2), "a wrong temperature passes: chi2 %.1f (df %d)", x2, df2);
    printf("  %ld draws: chi2 %.1f (df %d, threshold %.1f); against T x 1.1: %.1f\n", N, x, df, chi2_crit(df), x2);
    sm_sample_ws_free(&ws);
}

static void test_uniform(void) {
    /* counter-based: a function of (seed, pos); in [0, 1); uniform; seeds independent */
    CHECK(sm_sample_uniform(3, 10) == sm_sample_uniform(3, 10), "not a function of (seed, pos)");
    CHECK(sm_sample_uniform(3, 10) != sm_sample_uniform(4, 10) && sm_sample_uniform(3, 10) != sm_sample_uniform(3, 11),
          "seed or position ignored");
    long cnt[16] = {0}, same = 0;
    double p[16], mn = 1, mx = 0;
    const long N = 160000;
    for (long k = 0; k < N; k++) {
        double u = sm_sample_uniform((uint64_t)k / 100, k % 100);
        if (u < mn) mn = u;
        if (u > mx) mx = u;
        cnt[(int)(u * 16)]++;
        same += (sm_sample_uniform(k, 5) < 0.5) == (sm_sample_uniform(k + 1, 5) < 0.5);
    }
    for (int i = 0; i < 16; i++) p[i] = 1.0 / 16;
    int df;
    double x = chi2_gof(cnt, p, 16, N, &df);
    CHECK(mn >= 0 && mx < 1, "range [%g, %g]", mn, mx);
    CHECK(x < chi2_crit(df), "16 bins: chi2 %.1f (df %d)", x, df);
    CHECK(fabs((double)same / N - 0.5) < 0.01, "neighbouring seeds agree %.4f of the time", (double)same / N);
}

static void test_accept_rule(void) {
    /* at one row with draft d: accepted with probability p(d); the tokens after a rejection
     * are distributed as p without d; the whole matches the textbook rule drawn with two
     * independent uniforms; and the token is always the plain draw of the same uniform */
    const int nv = 12;
    sm_sample_ws ws;
    sm_err e = {{0}};
    if (sm_sample_ws_init(&ws, nv, &e)) { CHECK(0, "%s", e.msg); return; }
    float l[12] = {0.5f, 2.0f, 1.1f, -0.3f, 1.9f, 0.0f, 0.7f, 1.5f, -1.0f, 0.2f, 1.0f, 2.2f};
    sparkmono_sampling sp = {.temperature = 1.0f, .top_k = 0, .top_p = 0.97f, .seed = 0};
    CHECK(sm_sample_dist(&ws, l, nv, &sp, &e) == 0, "%s", e.msg);
    double p[12], q[12];
    for (int i = 0; i < nv; i++) p[i] = sm_sample_prob(&ws, i);
    const long N = 100000;
    uint64_t s = 31;
    for (int d = 1; d <= 4; d += 3) { /* a likely and a less likely draft */
        long acc = 0, rej = 0, cr[12] = {0}, call[12] = {0}, cbook[12] = {0}, diff = 0, self = 0;
        for (long k = 0; k < N; k++) {
            double u = sm_sample_uniform(777 + d, k);
            int a, t = sm_sample_accept(&ws, d, u, &a);
            diff += t != sm_sample_draw(&ws, u);
            self += !a && t == d;
            call[t]++;
            if (a) acc++;
            else { rej++; cr[t]++; }
            /* textbook: accept with u1 < p(d), else draw from p without d with u2 */
            double u1 = unif(&s), u2 = unif(&s) * (1 - p[d]), cum = 0;
            int tb = d;
            if (u1 >= p[d])
                for (int i = 0; i < nv; i++) {
                    if (i == d || p[i] == 0) continue;
                    cum += p[i];
                    tb = i;
                    if (cum > u2) break;
                }
            cbook[tb]++;
        }
        CHECK(diff == 0 && self == 0, "d %d: %ld tokens differ from the plain draw, %ld rejected yet equal to d", d, diff, self);
        double z = (acc - N * p[d]) / sqrt(N * p[d] * (1 - p[d]));
        CHECK(fabs(z) < CHI_Z, "d %d: accepted %ld of %ld, p(d) = %.4f (z %.2f)", d, acc, N, p[d], z);
        for (int i = 0; i < nv; i++) q[i] = i == d ? 0 : p[i] / (1 - p[d]);
        int df, df2;
        double x = chi2_gof(cr, q, nv, rej, &df), x2 = chi2_two(call, cbook, nv, N, N, &df2);
        CHECK(x < chi2_crit(df), "d %d: after rejection vs p without d: chi2 %.1f (df %d)", d, x, df);
        CHECK(x2 < chi2_crit(df2), "d %d: vs the textbook rule: chi2 %.1f (df %d)", d, x2, df2);
        /* the test can fail: rejected tokens against p itself (d keeps its mass) */
        int df3;
        double x3 = chi2_gof(cr, p, nv, rej, &df3);
        CHECK(x3 > chi2_crit(df3), "d %d: rejected tokens also fit p with d: chi2 %.1f", d, x3);
        printf("  draft %d: p(d) %.3f, accepted %.3f; after rejection chi2 %.1f (df %d); vs textbook chi2 %.1f (df %d)\n", d,
               p[d], (double)acc / N, x, df, x2, df2);
    }
    sm_sample_ws_free(&ws);
}

/* ---- backend: logits of selected rows --------------------------------------------------- */

static void test_logits_at(void) {
    /* a step with logits_at returns exactly the full-logits rows it maps, on one rank and on a
     * 2-rank world; argmax unchanged; a bad map is refused */
    const sm_model *m = &g_rnd->m;
    const int V = m->cfg.V, n = 6;
    for (int world = 1; world <= 2; world++) {
        sm_kv kv;
        sm_backend b;
        sm_err e = {{0}};
        int slot;
        if (sm_kv_init(&kv, 4, 1, 64, 0, &e) || sm_kv_add(&kv, &slot, &e) || sm_kv_reserve(&kv, slot, 16, &e)) {
            CHECK(0, "%s", e.msg);
            return;
        }
        sm_backend_opts bo = {.nthreads = 2, .world = world, .max_rows = 16};
        if (world == 1 ? sm_cpu_backend_create(m, &kv, &bo, &b, &e) : sm_world_backend_create(m, &kv, &bo, &b, &e)) {
            CHECK(0, "backend world %d: %s", world, e.msg);
            sm_kv_free(&kv);
            return;
        }
        int tok[6] = {5, 9, 200, 31, 7, 77}, pos[6], req[6], am1[6], am2[6], at[6] = {2, -1, 0, -1, -1, 1};
        for (int i = 0; i < n; i++) { pos[i] = i; req[i] = slot; }
        float *full = malloc((size_t)n * V * sizeof(float)), *sel = malloc((size_t)3 * V * sizeof(float));
        sm_step s1 = {.nrows = n, .tokens = tok, .pos = pos, .req = req, .kv = &kv, .logits = full, .argmax = am1};
        sm_step s2 = {.nrows = n, .tokens = tok, .pos = pos, .req = req, .kv = &kv, .logits = sel, .logits_at = at, .argmax = am2};
        CHECK(b.step(b.ctx, &s1, &e) == 0 && b.step(b.ctx, &s2, &e) == 0, "world %d step: %s", world, e.msg);
        int same = !memcmp(am1, am2, sizeof am1);
        for (int i = 0; i < n; i++)
            if (at[i] >= 0) same &= !memcmp(full + (size_t)i * V, sel + (size_t)at[i] * V, (size_t)V * sizeof(float));
        CHECK(same, "world %d: selected rows differ from the full logits", world);
        at[1] = n;
        CHECK(b.step(b.ctx, &s2, &e) == -1 && strstr(e.msg, "logits_at"), "world %d bad map: %s", world, e.msg);
        s2.logits = NULL;
        at[1] = -1;
        CHECK(b.step(b.ctx, &s2, &e) == -1 && strstr(e.msg, "logits_at"), "world %d map without buffer: %s", world, e.msg);
        free(full);
        free(sel);
        b.destroy(b.ctx);
        sm_kv_free(&kv);
    }
}

/* ---- engine ----------------------------------------------------------------------------- */

#define BATCH 64
#define NCROSS 128 /* seeds whose streams are compared token for token, R = 8 vs R = 1 */
static const int g_cprompt[20] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 3, 4, 5, 6};
/* the cycle model's prompt of the statistical tests: "3 4" recurs, so the first drafts are
 * the cycle's continuation 5 6 7 ... */
static const int g_sprompt[8] = {3, 4, 5, 6, 7, 8, 3, 4};
#define SPLEN 8

/* n requests of prompt [plen] with seeds seed0 .. seed0 + n - 1 under s (NULL: greedy), R rows,
 * BATCH requests at a time; out [n, mt] (nout [n] tokens each); *acc accepted drafts. */
static sm_status run_seeds(sparkmono_model *m, int R, const int *prompt, int plen, int mt, const sparkmono_sampling *s,
                           uint64_t seed0, int n, int *out, int *nout, long *acc) {
    sparkmono_engine_opts o = {0};
    o.request_rows = R;
    o.max_requests = BATCH;
    o.max_len = plen + mt;
    o.threads = 2;
    sparkmono_engine *g;
    sm_status st = sparkmono_engine_create(m, &o, &g);
    if (st) return st;
    *acc = 0;
    for (int b0 = 0; b0 < n && !st; b0 += BATCH) {
        int nb = n - b0 < BATCH ? n - b0 : BATCH, req[BATCH];
        for (int i = 0; i < nb && !st; i++) {
            sparkmono_sampling si;
            if (s) { si = *s; si.seed = seed0 + (uint64_t)(b0 + i); }
            st = sparkmono_add_sampled(g, prompt, plen, mt, s ? &si : NULL, &req[i]);
        }
        if (!st) st = sparkmono_generate(g);
        for (int i = 0; i < nb && !st; i++) {
            const int *ids;
            sparkmono_request_info info;
            st = sparkmono_output(g, req[i], &ids, &nout[b0 + i]);
            if (!st) st = sparkmono_request_get_info(g, req[i], &info);
            if (st) break;
            memcpy(out + (size_t)(b0 + i) * mt, ids, (size_t)nout[b0 + i] * sizeof(int));
            *acc += info.accepted;
            st = sparkmono_remove(g, req[i]);
        }
    }
    sparkmono_engine_destroy(g);
    return st;
}

/* The exact distribution (reference, whole-row sort) of the token after prompt + prefix under s. */
static int exact_next(sparkmono_model *m, const int *prompt, int plen, const int *prefix, int np, const sparkmono_sampling *s,
                      double *p) {
    int ids[64], req;
    memcpy(ids, prompt, (size_t)plen * sizeof(int));
    memcpy(ids + plen, prefix, (size_t)np * sizeof(int));
    const int n = plen + np;
    sparkmono_engine_opts o = {0};
    o.request_rows = 1;
    o.max_len = n + 1;
    o.threads = 2;
    sparkmono_engine *g;
    float *lg = malloc((size_t)n * g_V * sizeof(float));
    int rc = sparkmono_engine_create(m, &o, &g) || sparkmono_add(g, ids, n, 0, &req) || sparkmono_prefill(g, req, lg);
    CHECK(!rc, "exact: %s", sparkmono_errmsg());
    if (!rc) ref_dist(lg + (size_t)(n - 1) * g_V, g_vu, s->temperature, s->min_p, s->top_k, s->top_p, p);
    sparkmono_engine_destroy(g);
    free(lg);
    return rc ? -1 : 0;
}

/* Counts [V] of the token at index j of the streams out [n, mt] whose first j tokens equal
 * prefix [j]; returns how many streams matched. */
static long count_at(const int *out, const int *nout, int n, int mt, int j, const int *prefix, long *cnt) {
    long N = 0;
    memset(cnt, 0, (size_t)g_V * sizeof(long));
    for (int i = 0; i < n; i++) {
        const int *o = out + (size_t)i * mt;
        if (nout[i] <= j || memcmp(o, prefix, (size_t)j * sizeof(int))) continue;
        cnt[o[j]]++;
        N++;
    }
    return N;
}

static void test_greedy_unchanged(void) {
    /* temperature 0 (whatever top_k / top_p) and NULL are the greedy path, bit for bit */
    int a[16 * 4], b[16 * 4], c[16 * 4], na[4], nb[4], nc[4];
    long acc;
    sparkmono_sampling t0 = {.temperature = 0.0f, .top_k = 3, .top_p = 0.5f, .seed = 99};
    CHECK(run_seeds(g_rnd, 8, g_cprompt, 20, 16, NULL, 0, 4, a, na, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(run_seeds(g_rnd, 8, g_cprompt, 20, 16, &t0, 0, 4, b, nb, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(run_seeds(g_rnd, 1, g_cprompt, 20, 16, &t0, 5, 4, c, nc, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(!memcmp(na, nb, sizeof na) && !memcmp(a, b, sizeof(int) * 16 * 4) && !memcmp(na, nc, sizeof na) &&
          !memcmp(a, c, sizeof(int) * 16 * 4), "temperature 0 differs from greedy");
}

static void test_reproducible(void) {
    /* one seed, one stream: again, with R = 1 / 4 / 8, alone or sharing its steps with other
     * sampled and greedy requests (different prompts, lengths, seeds), with prefill logits
     * asked for or not */
    const int MT = 24;
    sparkmono_sampling sp = {.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .seed = 4242};
    int ref[24], nref = 0, prompt2[7] = {100, 3, 300, 4, 5, 6, 7};
    for (int variant = 0; variant < 6; variant++) {
        int R = variant == 1 ? 1 : variant == 2 ? 4 : 8;
        sparkmono_engine_opts o = {0};
        o.request_rows = R;
        o.max_requests = 5;
        o.max_len = 64;
        o.threads = 2;
        sparkmono_engine *g;
        if (sparkmono_engine_create(g_rnd, &o, &g)) { CHECK(0, "%s", sparkmono_errmsg()); return; }
        int req = -1, other[4], no = 0;
        sm_status st = SM_OK;
        if (variant >= 3) { /* companions added first: the request gets another slot and row offset */
            sparkmono_sampling s2 = {.temperature = 0.8f, .top_k = 20, .top_p = 0.0f, .seed = 4243}, s3 = {.temperature = 1.5f, .top_k = 0, .top_p = 0.0f, .seed = 4242};
            st = sparkmono_add_sampled(g, prompt2, 7, 30, &s2, &other[no++]);
            if (!st) st = sparkmono_add(g, g_cprompt, 20, 9, &other[no++]);
            if (!st && variant >= 4) st = sparkmono_add_sampled(g, g_cprompt + 2, 11, 17, &s3, &other[no++]);
        }
        if (!st) st = sparkmono_add_sampled(g, g_cprompt, 20, MT, &sp, &req);
        float *lg = variant == 5 ? malloc((size_t)20 * g_V * sizeof(float)) : NULL;
        if (!st && variant == 5) st = sparkmono_prefill(g, req, lg); /* first token from the caller's logits */
        if (!st) st = sparkmono_generate(g);
        const int *ids;
        int n = 0;
        if (!st) st = sparkmono_output(g, req, &ids, &n);
        CHECK(st == SM_OK, "variant %d: %s", variant, sparkmono_errmsg());
        if (!st && variant == 0) { memcpy(ref, ids, (size_t)n * sizeof(int)); nref = n; }
        else if (!st) CHECK(n == nref && !memcmp(ids, ref, (size_t)n * sizeof(int)), "variant %d (R %d): stream differs", variant, R);
        free(lg);
        sparkmono_engine_destroy(g);
    }
    /* another seed gives another stream */
    int b[24], nb;
    long acc;
    sparkmono_sampling s2 = sp;
    s2.seed = 4243;
    CHECK(run_seeds(g_rnd, 8, g_cprompt, 20, MT, &s2, s2.seed, 1, b, &nb, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(nb != nref || memcmp(b, ref, (size_t)nb * sizeof(int)), "seeds 4242 and 4243 give the same stream");
}

/* Frequencies of the first MT tokens over N seeds on the cycle model: speculative (R = 8) and
 * plain (R = 1) on disjoint seeds, each against the exact distribution (first token;
 * later tokens conditioned on the most frequent prefix) and against each other (every index);
 * the same seed gives the same stream with R = 8 and R = 1. */
static void stat_case(const char *name, const sparkmono_sampling *sp, int N, int MT) {
    int *sp_out = malloc((size_t)N * MT * sizeof(int)), *pl_out = malloc((size_t)N * MT * sizeof(int)),
        *cross = malloc((size_t)N * MT * sizeof(int));
    int *sp_n = malloc((size_t)N * sizeof(int)), *pl_n = malloc((size_t)N * sizeof(int)), *cross_n = malloc((size_t)N * sizeof(int));
    long *ca = malloc((size_t)g_V * sizeof(long)), *cb = malloc((size_t)g_V * sizeof(long));
    double *p = malloc((size_t)g_V * sizeof(double));
    long acc_sp = 0, acc_pl = 0, acc_x = 0;
    const uint64_t SEED_SP = 1000000, SEED_PL = 2000000;
    sm_status st = run_seeds(g_cyc, 8, g_sprompt, SPLEN, MT, sp, SEED_SP, N, sp_out, sp_n, &acc_sp);
    if (!st) st = run_seeds(g_cyc, 1, g_sprompt, SPLEN, MT, sp, SEED_PL, N, pl_out, pl_n, &acc_pl);
    if (!st) st = run_seeds(g_cyc, 1, g_sprompt, SPLEN, MT, sp, SEED_SP, NCROSS, cross, cross_n, &acc_x);
    CHECK(st == SM_OK, "%s: %s", name, sparkmono_errmsg());
    if (st) goto out;
    /* the same seeds, plain: token for token the speculative streams */
    CHECK(!memcmp(sp_n, cross_n, NCROSS * sizeof(int)) && !memcmp(sp_out, cross, (size_t)NCROSS * MT * sizeof(int)),
          "%s: speculative and plain streams of the same %d seeds differ", name, NCROSS);
    long ntok = 0;
    for (int i = 0; i < N; i++) ntok += sp_n[i];
    CHECK(acc_sp * 4 > ntok, "%s: only %ld drafts accepted for %ld tokens", name, acc_sp, ntok);
    printf("  %s: %d seeds x %d tokens; R = 8 accepted %ld drafts for %ld tokens\n", name, N, MT, acc_sp, ntok);
    /* exact distribution: token j given the most frequent first j tokens (of the plain runs) */
    int prefix[16];
    for (int j = 0; j < MT && j < 3; j++) {
        for (int which = 0; which < 2; which++) {
            const int *o = which ? pl_out : sp_out, *no = which ? pl_n : sp_n;
            long Nj = count_at(o, no, N, MT, j, prefix, ca);
            if (exact_next(g_cyc, g_sprompt, SPLEN, prefix, j, sp, p)) goto out;
            int df;
            double x = chi2_gof(ca, p, g_V, Nj, &df);
            CHECK(Nj >= N / 4 && x < chi2_crit(df), "%s token %d (%s, %ld draws): chi2 %.1f (df %d, threshold %.1f)", name, j,
                  which ? "plain" : "speculative", Nj, x, df, chi2_crit(df));
            printf("  %s token %d given the modal prefix, %s: %ld draws, chi2 %.1f (df %d, threshold %.1f)\n", name, j,
                   which ? "plain R=1" : "speculative R=8", Nj, x, df, chi2_crit(df));
            if (j == 0 && which == 0) {
                /* the test can fail: the same counts against the distribution at T * 1.5 */
                sparkmono_sampling w = *sp;
                w.temperature *= 1.5f;
                exact_next(g_cyc, g_sprompt, SPLEN, prefix, 0, &w, p);
                int df2;
                double x2 = chi2_gof(ca, p, g_V, Nj, &df2);
                CHECK(x2 > chi2_crit(df2), "%s: a temperature off by 50%% passes (chi2 %.1f, df %d)", name, x2, df2);
                printf("  %s token 0 against the distribution at T x 1.5: chi2 %.1f (df %d): must fail\n", name, x2, df2);
            }
        }
        /* the next prefix: the most frequent token j after this one among the plain streams */
        count_at(pl_out, pl_n, N, MT, j, prefix, ca);
        int best = 0;
        for (int v = 1; v < g_V; v++)
            if (ca[v] > ca[best]) best = v;
        prefix[j] = best;
    }
    /* speculative vs plain, every token index (its marginal over the seeds) */
    for (int j = 0; j < MT; j++) {
        memset(ca, 0, (size_t)g_V * sizeof(long));
        memset(cb, 0, (size_t)g_V * sizeof(long));
        long na = 0, nb = 0;
        for (int i = 0; i < N; i++) {
            if (sp_n[i] > j) { ca[sp_out[(size_t)i * MT + j]]++; na++; }
            if (pl_n[i] > j) { cb[pl_out[(size_t)i * MT + j]]++; nb++; }
        }
        int df;
        double x = chi2_two(ca, cb, g_V, na, nb, &df);
        CHECK(na > 0 && nb > 0 && x < chi2_crit(df), "%s token %d, speculative vs plain: chi2 %.1f (df %d, threshold %.1f)", name,
              j, x, df, chi2_crit(df));
        if (j == 0 || j == MT - 1)
            printf("  %s token %d, speculative vs plain (disjoint seeds): chi2 %.1f (df %d, threshold %.1f)\n", name, j, x, df,
                   chi2_crit(df));
    }
out:
    free(sp_out); free(pl_out); free(cross); free(sp_n); free(pl_n); free(cross_n); free(ca); free(cb); free(p);
}

static void test_stat_topk(void) {
    sparkmono_sampling sp = {.temperature = 2.0f, .top_k = 4, .top_p = 0.0f, .seed = 0};
    stat_case("T 2 top_k 4", &sp, 768, 6);
}

static void test_stat_topp(void) {
    sparkmono_sampling sp = {.temperature = 2.0f, .top_k = 8, .top_p = 0.85f, .seed = 0};
    stat_case("T 2 top_k 8 top_p 0.85", &sp, 512, 6);
}

static void test_stat_minp(void) {
    /* the cycle model at T 2: its likeliest id has weight 1, the next ones about 0.1 .. 0.065 and
     * the rest of the row about 0.064: min_p 0.075 keeps the likeliest and a few others,
     * top_k 50 then cuts nothing more */
    sparkmono_sampling sp = {.temperature = 2.0f, .top_k = 50, .top_p = 0.0f, .seed = 0};
    sp.min_p = 0.075f;
    stat_case("T 2 min_p 0.075 top_k 50", &sp, 768, 6);
}

static void test_bad_sampling(void) {
    sparkmono_engine *g;
    sparkmono_engine_opts o = {0};
    o.max_len = 32;
    if (sparkmono_engine_create(g_rnd, &o, &g)) { CHECK(0, "%s", sparkmono_errmsg()); return; }
    int req, p[3] = {5, 6, 7};
    sparkmono_sampling s = {.temperature = -1.0f, .top_k = 0, .top_p = 0.0f, .seed = 0};
    const char *m;
    CHECK(sparkmono_add_sampled(g, p, 3, 4, &s, &req) == SM_E_INVALID && (m = sparkmono_errmsg()) && strstr(m, "temperature") &&
          !strchr(m, '\n'), "negative temperature: %s", sparkmono_errmsg());
    s.temperature = 1;
    s.top_p = 2;
    CHECK(sparkmono_add_sampled(g, p, 3, 4, &s, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "top_p"), "top_p: %s",
          sparkmono_errmsg());
    s.top_p = 0;
    s.top_k = -3;
    CHECK(sparkmono_add_sampled(g, p, 3, 4, &s, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "top_k"), "top_k: %s",
          sparkmono_errmsg());
    s.top_k = 0;
    s.min_p = 2;
    CHECK(sparkmono_add_sampled(g, p, 3, 4, &s, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "min_p 2 is not in [0, 1]"),
          "min_p: %s", sparkmono_errmsg());
    CHECK(g->kv.nfree == g->kv.nblocks, "a refused request holds no pages");
    sparkmono_engine_destroy(g);
}

int main(void) {
    if (tm_open_tiny_pair(g_tmp, sizeof g_tmp, "sm_test_sample", &g_cyc, &g_rnd, &g_V, &g_vu)) return 1;

    RUN(test_check);
    RUN(test_dist_reference);
    RUN(test_draw);
    RUN(test_uniform);
    RUN(test_accept_rule);
    RUN(test_logits_at);
    RUN(test_greedy_unchanged);
    RUN(test_reproducible);
    RUN(test_bad_sampling);
    RUN(test_stat_topk);
    RUN(test_stat_topp);
    RUN(test_stat_minp);

    sparkmono_model_close(g_cyc);
    sparkmono_model_close(g_rnd);
    tm_rmtree(g_tmp);
    return TEST_DONE();
}
