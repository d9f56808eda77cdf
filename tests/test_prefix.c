/* test_prefix.c: the prefix cache (src/backend/kvcache.c sm_kv_prefix_*, its use in
 * src/engine/engine.c sparkmono_prefill), issue 37.
 *
 * Properties: the bookkeeping (a page held by two requests, read-only; unreferenced cached pages
 * kept until a reservation needs them, least recently used first and a request's deeper blocks
 * before its first; a match needs the same tokens in every block before it; the last prompt
 * token always computed; off means off); exactness through the engine on the tiny CPU model:
 * a request whose prompt prefix is cached emits the ids (and logprobs) it emits in an engine
 * without the cache, greedy and seeded sampling, with speculation (R = 8) and without (R = 1),
 * on one rank and on two (TP), and prompt logprobs still come for every position; and the
 * prompt tokens computed for two workloads, with the cache against without (the `queries`
 * count: the tokens an engine without the cache computes, checked on a small run):
 * (a) 32 requests sharing a 4,096-token system prompt, 64-token user turns: <= 1/4;
 * (b) a 20-turn chat replayed turn by turn (each turn's prompt is the conversation so far,
 *     the model's own replies included): <= 1/5;
 * and a pool too small for the batch's requests: the newest are preempted and recomputed,
 * every request ends normally with the ids it emits alone.
 */
#include "check.h"
#include "tmodel.h"
#include "backend/kvcache.h"
#include "engine/engine.h"
#include "model/rng.h"
#include "sparkmono.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- bookkeeping */

static void fill(int *t, int n, int base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static void t_pages(void) {
    sm_kv kv;
    sm_err e = {""};
    if (sm_kv_init(&kv, 8, 4, 128, 0, &e)) { CHECK(0, "%s", e.msg); return; }
    sm_kv_prefix_enable(&kv, 1, 42);
    int a, b, c, m, u, cc, f;
    int ta[64], tb[64];
    fill(ta, 64, 100);
    fill(tb, 64, 100);
    tb[40] = 7; /* b shares a's first two blocks, not the third */
    /* a: 48 tokens (3 full pages) committed and registered */
    CHECK(!sm_kv_add(&kv, &a, &e), "add a");
    sm_kv_prefix_attach(&kv, a, ta, 48, &m);
    CHECK(m == 0, "nothing cached yet: %d", m);
    CHECK(!sm_kv_reserve(&kv, a, 48, &e), "reserve a");
    kv.len[a] = 48;
    sm_kv_prefix_commit(&kv, a, ta, 48);
    /* b: 64 tokens: blocks 0, 1 match, block 2 differs */
    CHECK(!sm_kv_add(&kv, &b, &e), "add b");
    sm_kv_prefix_attach(&kv, b, tb, 64, &m);
    CHECK(m == 32, "b takes 2 pages: %d tokens", m);
    const int *pa = kv.tables + (int64_t)a * kv.max_bpr, *pb = kv.tables + (int64_t)b * kv.max_bpr;
    CHECK(pb[0] == pa[0] && pb[1] == pa[1] && kv.ref[pa[0]] == 2 && kv.ref[pa[1]] == 2, "shared, two holders");
    CHECK(kv.len[b] == 32, "b's committed length %d", kv.len[b]);
    CHECK(!sm_kv_reserve(&kv, b, 64, &e), "reserve b");
    CHECK(pb[2] != pa[2] && pb[3] != pa[2], "b's own pages");
    /* c: exactly a's 48 tokens: at most (48 - 1) / 16 = 2 blocks, the last token is computed */
    CHECK(!sm_kv_add(&kv, &c, &e), "add c");
    sm_kv_prefix_attach(&kv, c, ta, 48, &m);
    CHECK(m == 32, "c takes 2 pages, not 3: %d", m);
    sm_kv_pages(&kv, &u, &cc, &f);
    CHECK(u == 5 && cc == 0 && f == 3, "used %d cached %d free %d", u, cc, f);
    /* release a and c: a's third page stays cached; b still holds blocks 0, 1 */
    sm_kv_release(&kv, a);
    sm_kv_release(&kv, c);
    sm_kv_pages(&kv, &u, &cc, &f);
    CHECK(u == 4 && cc == 1 && f == 3, "used %d cached %d free %d", u, cc, f);
    sm_kv_release(&kv, b);
    sm_kv_pages(&kv, &u, &cc, &f);
    CHECK(u == 0 && cc == 3 && f == 5, "after all: used %d cached %d free %d", u, cc, f);
    /* a reservation takes free pages first, then the least recently used cached page: the
     * deepest block (a's third) goes before the blocks it extends */
    int d;
    CHECK(!sm_kv_add(&kv, &d, &e), "add d");
    CHECK(!sm_kv_reserve(&kv, d, 6 * 16, &e), "reserve d: 6 pages");
    sm_kv_pages(&kv, &u, &cc, &f);
    CHECK(u == 6 && cc == 2 && f == 0, "used %d cached %d free %d", u, cc, f);
    int e2;
    CHECK(!sm_kv_add(&kv, &e2, &e), "add e");
    sm_kv_prefix_attach(&kv, e2, ta, 64, &m);
    CHECK(m == 32, "blocks 0, 1 still cached: %d", m);
    CHECK(sm_kv_reserve(&kv, e2, 64, &e) != 0, "no page left for e's last two blocks");
    sm_kv_release(&kv, e2);
    sm_kv_release(&kv, d);
    /* a different first block: no match, whatever follows */
    int g;
    CHECK(!sm_kv_add(&kv, &g, &e), "add g");
    int tg[64];
    memcpy(tg, ta, sizeof tg);
    tg[3] = 9;
    sm_kv_prefix_attach(&kv, g, tg, 64, &m);
    CHECK(m == 0, "first block differs: %d", m);
    sm_kv_release(&kv, g);
    /* off: registered pages dropped and free */
    sm_kv_prefix_enable(&kv, 0, 0);
    sm_kv_pages(&kv, &u, &cc, &f);
    CHECK(u == 0 && cc == 0 && f == 8, "off: used %d cached %d free %d", u, cc, f);
    CHECK(!sm_kv_add(&kv, &g, &e), "add");
    sm_kv_prefix_attach(&kv, g, ta, 64, &m);
    CHECK(m == 0, "off attaches nothing");
    sm_kv_free(&kv);
}

/* ---------------------------------------------------------------- the engine */

static char g_tmp[512];
static sparkmono_model *g_cyc, *g_rnd;
static int g_V, g_vu;

/* An engine on m: R rows a request, world ranks (cpu), the prefix cache on or off. */
static sparkmono_engine *engine(sparkmono_model *m, int R, int world, int cache, int max_len, int max_req) {
    sparkmono_engine_opts o;
    memset(&o, 0, sizeof o);
    o.request_rows = R;
    o.max_requests = max_req;
    o.max_len = max_len;
    o.threads = 2;
    o.world = world;
    o.moe_tp = world > 1;
    o.no_prefix_cache = !cache;
    sparkmono_engine *g = NULL;
    CHECK(sparkmono_engine_create(m, &o, &g) == SM_OK, "engine: %s", sparkmono_errmsg());
    return g;
}

/* Run one request alone on g: its ids (and logprobs, with s->logprobs) into ids/lp [*n]. */
static int run1(sparkmono_engine *g, const int *p, int n, int mt, const sparkmono_sampling *s, int *ids, float *lp, int *nout) {
    int req;
    if (sparkmono_add_sampled(g, p, n, mt, s, &req) != SM_OK || sparkmono_generate(g) != SM_OK) {
        CHECK(0, "run: %s", sparkmono_errmsg());
        return -1;
    }
    const int *o;
    sparkmono_output(g, req, &o, nout);
    memcpy(ids, o, sizeof(int) * (size_t)*nout);
    if (s && s->logprobs) {
        const float *l, *tl;
        const int *ti;
        int k;
        sparkmono_logprobs(g, req, &l, &ti, &tl, &k);
        memcpy(lp, l, sizeof(float) * (size_t)*nout);
    }
    sparkmono_remove(g, req);
    return 0;
}

static void prompt(uint64_t seed, int *p, int n) {
    uint64_t st = seed;
    for (int i = 0; i < n; i++) p[i] = 3 + (int)(sm_rng_next(&st) % (uint64_t)(g_vu - 3));
}

/* A request after another that shares its first 80 tokens: the same ids (and logprobs) as in an
 * engine without the cache; greedy and sampled, R = 8 and 1, one and two ranks. */
static void t_exact(void) {
    enum { N = 120, SH = 80, MT = 24 };
    int first[N], p[N];
    prompt(5, first, N);
    memcpy(p, first, sizeof(int) * SH);
    prompt(6, p + SH, N - SH);
    for (int world = 1; world <= 2; world++)
        for (int R = 1; R <= 8; R += 7)
            for (int mode = 0; mode < 3; mode++) {
                sparkmono_model *m = mode == 2 ? g_cyc : g_rnd;
                sparkmono_sampling s;
                memset(&s, 0, sizeof s);
                if (mode == 1) { s.temperature = 0.9f; s.seed = 77; s.logprobs = 1; s.top_logprobs = 3; }
                int a[MT], b[MT], na = 0, nb = 0;
                float la[MT], lb[MT];
                sparkmono_engine *off = engine(m, R, world, 0, 256, 1), *on = engine(m, R, world, 1, 256, 1);
                if (!off || !on) { sparkmono_engine_destroy(off); sparkmono_engine_destroy(on); return; }
                int x[MT], nx;
                float lx[MT];
                run1(on, first, N, 4, &s, x, lx, &nx); /* caches first's pages */
                run1(off, p, N, MT, &s, a, la, &na);
                run1(on, p, N, MT, &s, b, lb, &nb);
                sparkmono_cache_stats cs;
                sparkmono_cache_stats_get(on, &cs);
                CHECK(cs.hits == (SH / 16) * 16, "world %d R %d mode %d: %lld tokens hit, want %d", world, R, mode, cs.hits,
                      (SH / 16) * 16);
                CHECK(cs.computed == N + N - (SH / 16) * 16, "computed %lld", cs.computed);
                CHECK(na == nb && !memcmp(a, b, sizeof(int) * (size_t)na), "world %d R %d mode %d: ids differ with the cache",
                      world, R, mode);
                if (s.logprobs)
                    CHECK(!memcmp(la, lb, sizeof(float) * (size_t)na), "world %d R %d: logprobs differ with the cache", world, R);
                sparkmono_engine_destroy(off);
                sparkmono_engine_destroy(on);
            }
}

/* Prompt logprobs (every prompt position) and a caller's prefill logits ask for every row: the
 * prompt is computed whole, and its logprobs equal an engine's without the cache. */
static void t_prompt_logprobs(void) {
    enum { N = 70 };
    int p[N];
    prompt(9, p, N);
    sparkmono_engine *on = engine(g_rnd, 8, 1, 1, 128, 1), *off = engine(g_rnd, 8, 1, 0, 128, 1);
    if (!on || !off) { sparkmono_engine_destroy(on); sparkmono_engine_destroy(off); return; }
    int x[4], nx;
    run1(on, p, N, 2, NULL, x, NULL, &nx);
    sparkmono_sampling s;
    memset(&s, 0, sizeof s);
    s.prompt_logprobs = 1;
    float *lp[2];
    for (int v = 0; v < 2; v++) {
        sparkmono_engine *g = v ? on : off;
        int req;
        CHECK(sparkmono_add_sampled(g, p, N, 2, &s, &req) == SM_OK && sparkmono_generate(g) == SM_OK, "%s", sparkmono_errmsg());
        const float *l, *tl;
        const int *rk, *ti;
        int k;
        CHECK(sparkmono_prompt_logprobs(g, req, &l, &rk, &ti, &tl, &k) == SM_OK, "prompt logprobs: %s", sparkmono_errmsg());
        lp[v] = malloc(sizeof(float) * N);
        memcpy(lp[v], l, sizeof(float) * N);
        sparkmono_remove(g, req);
    }
    int same = 1;
    for (int i = 1; i < N; i++) same &= lp[0][i] == lp[1][i];
    CHECK(same, "prompt logprobs differ with the cache");
    sparkmono_cache_stats cs;
    sparkmono_cache_stats_get(on, &cs);
    CHECK(cs.computed == 2 * N, "the prompt-logprobs request computed its whole prompt: %lld of %d", cs.computed, 2 * N);
    free(lp[0]);
    free(lp[1]);
    sparkmono_engine_destroy(on);
    sparkmono_engine_destroy(off);
}

/* Without the cache an engine computes every prompt token, which `queries` counts with it. */
static void t_counts_off(void) {
    enum { N = 50 };
    int p[N];
    prompt(11, p, N);
    sparkmono_engine *off = engine(g_rnd, 8, 1, 0, 128, 1);
    if (!off) return;
    int x[4], nx;
    for (int i = 0; i < 3; i++) run1(off, p, N, 2, NULL, x, NULL, &nx);
    sparkmono_cache_stats cs;
    sparkmono_cache_stats_get(off, &cs);
    CHECK(!cs.enabled && cs.computed == 3 * N && cs.hits == 0 && cs.queries == 0, "off: enabled %d computed %lld hits %lld",
          cs.enabled, cs.computed, cs.hits);
    sparkmono_engine_destroy(off);
}

/* (a) 32 requests: one 4,096-token system prompt, each its own 64-token user turn. */
static void t_workload_shared_system(void) {
    enum { SYS = 4096, USER = 64, NREQ = 32, MT = 4 };
    int *p = malloc(sizeof(int) * (SYS + USER));
    prompt(21, p, SYS);
    sparkmono_engine *on = engine(g_rnd, 8, 1, 1, SYS + USER + MT, 1), *off = engine(g_rnd, 8, 1, 0, SYS + USER + MT, 1);
    if (!on || !off) { sparkmono_engine_destroy(on); sparkmono_engine_destroy(off); free(p); return; }
    int a[MT], b[MT], na, nb, same = 1;
    for (int q = 0; q < NREQ; q++) {
        prompt(100 + q, p + SYS, USER);
        run1(on, p, SYS + USER, MT, NULL, a, NULL, &na);
        if (q == 0 || q == NREQ - 1) { /* two of them against the engine without the cache */
            run1(off, p, SYS + USER, MT, NULL, b, NULL, &nb);
            same &= na == nb && !memcmp(a, b, sizeof(int) * (size_t)na);
        }
    }
    sparkmono_cache_stats cs;
    sparkmono_cache_stats_get(on, &cs);
    printf("  (a) %d requests, %d-token system prompt + %d-token turns: prompt tokens computed %lld with the cache, %lld "
           "without (1/%.1f); %lld hit\n", NREQ, SYS, USER, cs.computed, cs.queries, (double)cs.queries / (double)cs.computed,
           cs.hits);
    CHECK(cs.queries == (long long)NREQ * (SYS + USER), "queries %lld", cs.queries);
    CHECK(cs.computed * 4 <= cs.queries, "computed %lld > 1/4 of %lld", cs.computed, cs.queries);
    CHECK(same, "ids differ from the engine without the cache");
    sparkmono_engine_destroy(on);
    sparkmono_engine_destroy(off);
    free(p);
}

/* (b) a 20-turn chat: the conversation so far (its replies included) + a 40-token user turn. */
static void t_workload_chat(void) {
    enum { TURNS = 20, SYS = 60, USER = 40, MT = 12, MAXLEN = SYS + TURNS * (USER + MT) + 16 };
    int *conv = malloc(sizeof(int) * MAXLEN), n = SYS;
    prompt(31, conv, SYS);
    sparkmono_engine *on = engine(g_rnd, 8, 1, 1, MAXLEN, 1), *off = engine(g_rnd, 8, 1, 0, MAXLEN, 1);
    if (!on || !off) { sparkmono_engine_destroy(on); sparkmono_engine_destroy(off); free(conv); return; }
    int a[MT], b[MT], na, nb, same = 1;
    for (int t = 0; t < TURNS; t++) {
        prompt(300 + t, conv + n, USER);
        n += USER;
        run1(on, conv, n, MT, NULL, a, NULL, &na);
        run1(off, conv, n, MT, NULL, b, NULL, &nb);
        same &= na == nb && !memcmp(a, b, sizeof(int) * (size_t)na);
        memcpy(conv + n, a, sizeof(int) * (size_t)na); /* the reply joins the conversation */
        n += na;
    }
    sparkmono_cache_stats cs, co;
    sparkmono_cache_stats_get(on, &cs);
    sparkmono_cache_stats_get(off, &co);
    printf("  (b) %d-turn chat: prompt tokens computed %lld with the cache, %lld without (1/%.1f)\n", TURNS, cs.computed,
           co.computed, (double)co.computed / (double)cs.computed);
    CHECK(co.computed == cs.queries, "without the cache %lld computed, %lld queried with it", co.computed, cs.queries);
    CHECK(cs.computed * 5 <= co.computed, "computed %lld > 1/5 of %lld", cs.computed, co.computed);
    CHECK(same, "a turn's reply differs from the engine without the cache");
    sparkmono_engine_destroy(on);
    sparkmono_engine_destroy(off);
    free(conv);
}

/* A pool too small for every request at once: the batch preempts the newest and recomputes it
 * later; every request ends normally with the ids it emits alone (greedy and sampled). */
static void t_preempt(void) {
    enum { NQ = 6, N = 40, MT = 60 };
    sparkmono_engine_opts o;
    memset(&o, 0, sizeof o);
    o.request_rows = 8;
    o.max_requests = 4;
    o.max_len = N + MT + 8;
    o.kv_blocks = 16; /* four requests of 100+ tokens need 28 */
    o.threads = 2;
    sparkmono_engine *g = NULL, *alone = engine(g_rnd, 8, 1, 0, N + MT + 8, 1);
    sparkmono_batch *b = NULL;
    if (!alone || sparkmono_engine_create(g_rnd, &o, &g) != SM_OK || sparkmono_batch_create(g, -1, &b) != SM_OK) {
        CHECK(0, "setup: %s", sparkmono_errmsg());
        sparkmono_engine_destroy(alone);
        sparkmono_engine_destroy(g);
        return;
    }
    int p[NQ][N], got[NQ][MT], ngot[NQ], done[NQ];
    sparkmono_sampling s[NQ];
    memset(ngot, 0, sizeof ngot);
    memset(done, 0, sizeof done);
    long long id[NQ];
    for (int q = 0; q < NQ; q++) {
        prompt(500 + q, p[q], N);
        memset(&s[q], 0, sizeof s[q]);
        if (q & 1) { s[q].temperature = 0.8f; s[q].seed = 1000 + q; s[q].ignore_eos = 1; }
        else s[q].ignore_eos = 1;
        CHECK(sparkmono_batch_submit(b, p[q], N, MT, &s[q], NULL, &id[q]) == SM_OK, "submit: %s", sparkmono_errmsg());
    }
    int left = NQ, guard = 0;
    while (left && guard++ < 10000) {
        const sparkmono_batch_event *ev;
        int nev;
        if (sparkmono_batch_step(b, &ev, &nev) != SM_OK) { CHECK(0, "step: %s", sparkmono_errmsg()); break; }
        for (int k = 0; k < nev; k++) {
            int q = (int)(ev[k].id - id[0]);
            if (q < 0 || q >= NQ) continue;
            for (int i = 0; i < ev[k].n && ngot[q] < MT; i++) got[q][ngot[q]++] = ev[k].ids[i];
            if (ev[k].done) {
                CHECK(ev[k].done == SM_BATCH_LENGTH, "request %d ended %d: %s", q, ev[k].done, ev[k].err ? ev[k].err : "");
                done[q] = 1;
                left--;
            }
        }
    }
    sparkmono_cache_stats cs;
    sparkmono_cache_stats_get(g, &cs);
    printf("  %d requests of %d + %d tokens on 16 pages: %lld prompt tokens computed for %d (recomputed after "
           "preemption)\n", NQ, N, MT, cs.computed, NQ * N);
    CHECK(cs.computed > NQ * N, "no request was preempted (computed %lld)", cs.computed);
    for (int q = 0; q < NQ; q++) {
        int a[MT], na;
        run1(alone, p[q], N, MT, &s[q], a, NULL, &na);
        CHECK(done[q] && na == ngot[q] && !memcmp(a, got[q], sizeof(int) * (size_t)na), "request %d: ids differ from alone", q);
    }
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
    sparkmono_engine_destroy(alone);
}

int main(void) {
    RUN(t_pages);
    if (tm_open_tiny_pair(g_tmp, sizeof g_tmp, "sm_prefix", &g_cyc, &g_rnd, &g_V, &g_vu)) return 1;
    RUN(t_exact);
    RUN(t_prompt_logprobs);
    RUN(t_counts_off);
    RUN(t_workload_shared_system);
    RUN(t_workload_chat);
    RUN(t_preempt);
    sparkmono_model_close(g_cyc);
    sparkmono_model_close(g_rnd);
    tm_rmtree(g_tmp);
    return TEST_DONE();
}
