/* model_engine.c: the whole-model GPU tests through the engine (model.c's group):
 * speculative == plain greedy through the engine API and through our own loop with an oracle
 * drafter (one rank and W virtual ranks), the synthetic backend (make-model's weights bit for
 * bit, finite, replay-deterministic), the monokernel's refusals and bounded barrier, and
 * tensor + expert parallelism's refusals and a stalled peer.  model.c holds the CPU vs
 * CUDA comparison on the same steps and the entry.  We rejected one file: 1,000 lines.
 */
#include "gpu_tests.h"
#include "harness.h"
#include "model_cases.h"
#include "backend/backend.h"
#include "model/config.h"
#include "backend/kvcache.h"
#include "testing/makemodel.h"
#include "model/rng.h"
#include "model/weights.h"
#include "sparkmono.h"
#include "constrain/constrain.h"
#include "cuda/rank/synth.h"
#include "cuda/bench/bench.h"
#include "../condition.h"
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Make the tiny MXFP4 model `name` under root and open it; NULL (the case `cas` failed, said)
 * when either fails. */
static sparkmono_model *tm_open_tiny(const char *root, const char *name, uint64_t seed, const char *cas) {
    sm_err e = {{0}};
    sm_config c;
    char dir[512];
    sparkmono_model *m = NULL;
    if (sm_config_preset("tiny", &c, &e) || tm_make(root, name, &c, SM_EXP_MXFP4, seed, dir, sizeof dir) ||
        sparkmono_model_open(dir, NULL, &m)) {
        GH_CHECK(0, "model: %s %s", e.msg, sparkmono_errmsg());
        printf("FAIL %s\n", cas);
        return NULL;
    }
    return m;
}

/* ---- speculative == plain greedy, through the engine API ---- */

/* The engine option devices of tm_generate: "" = one rank, else e.g. "0,0,0,0" (virtual ranks). */
static const char *tm_gen_devices = "";

static int tm_generate(const char *dir, const char *backend, int rows, int np, int *const *prompts, const int *plen,
                       int max_tokens, int **out, int *nout, int *accepted) {
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    if (sparkmono_model_open(dir, NULL, &m)) { printf("  model open: %s\n", sparkmono_errmsg()); return -1; }
    sparkmono_engine_opts o;
    memset(&o, 0, sizeof o);
    o.backend = backend;
    o.mono = strcmp(backend, "cuda") ? NULL : "on"; /* speculative == plain greedy with the monokernel */
    o.request_rows = rows;
    o.max_requests = np;
    o.max_len = 256;
    if (*tm_gen_devices) { /* W virtual ranks on device 0, the monokernel on every rank */
        o.world = (int)(strlen(tm_gen_devices) + 1) / 2;
        o.devices = tm_gen_devices;
    }
    int rc = 0;
    if (sparkmono_engine_create(m, &o, &g)) { printf("  engine (%s, R %d): %s\n", backend, rows, sparkmono_errmsg()); rc = -1; }
    int ids[8];
    for (int i = 0; i < np && !rc; i++)
        if (sparkmono_add(g, prompts[i], plen[i], max_tokens, &ids[i])) { printf("  add: %s\n", sparkmono_errmsg()); rc = -1; }
    if (!rc && sparkmono_generate(g)) { printf("  generate (%s, R %d): %s\n", backend, rows, sparkmono_errmsg()); rc = -1; }
    *accepted = 0;
    for (int i = 0; i < np && !rc; i++) {
        const int *t;
        int n;
        sparkmono_request_info ri;
        if (sparkmono_output(g, ids[i], &t, &n) || sparkmono_request_get_info(g, ids[i], &ri)) { rc = -1; break; }
        out[i] = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
        if (!out[i]) { rc = -1; break; }
        memcpy(out[i], t, sizeof(int) * (size_t)n);
        nout[i] = n;
        *accepted += ri.accepted;
    }
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
}

int tm_spec(const char *root, uint64_t seed) {
    gh_case_fail = 0;
    sm_err e = {{0}};
    sm_config c;
    char dir[512];
    if (sm_config_preset("tiny", &c, &e) || tm_make(root, "spec_tiny", &c, SM_EXP_MXFP4, seed, dir, sizeof dir)) {
        GH_CHECK(0, "make-model failed %s", e.msg);
        printf("FAIL spec_equals_greedy\n");
        return 1;
    }
    /* prompts with repeats so the n-gram drafter proposes drafts */
    enum { NP = 3 };
    int p0[24], p1[30], p2[20];
    uint64_t rng = seed + 5;
    for (int i = 0; i < 24; i++) p0[i] = 10 + i % 4;
    for (int i = 0; i < 30; i++) p1[i] = 3 + (int)(sm_rng_next(&rng) % 500);
    for (int i = 0; i < 20; i++) p2[i] = i % 2 ? 77 : 78;
    int *const prompts[NP] = {p0, p1, p2};
    const int plen[NP] = {24, 30, 20};
    int *o1[NP] = {0}, *o8[NP] = {0}, *oc[NP] = {0}, n1[NP] = {0}, n8[NP] = {0}, nc[NP] = {0}, acc1, acc8, accc;
    int r1 = tm_generate(dir, "cuda", 1, NP, prompts, plen, 48, o1, n1, &acc1);
    int r8 = tm_generate(dir, "cuda", 8, NP, prompts, plen, 48, o8, n8, &acc8);
    int rc_ = tm_generate(dir, "cpu", 8, NP, prompts, plen, 48, oc, nc, &accc);
    GH_CHECK(r1 == 0 && r8 == 0, "generation failed");
    if (r1 == 0 && r8 == 0) {
        for (int i = 0; i < NP; i++) {
            int same = n1[i] == n8[i];
            for (int j = 0; same && j < n1[i]; j++) same = o1[i][j] == o8[i][j];
            GH_CHECK(same, "request %d: speculative output (%d tokens) differs from greedy (%d tokens)", i, n8[i], n1[i]);
            int cpu_same = -1;
            if (rc_ == 0) {
                cpu_same = 0;
                while (cpu_same < nc[i] && cpu_same < n1[i] && oc[i][cpu_same] == o1[i][cpu_same]) cpu_same++;
            }
            printf("  request %d: %d tokens; first %d equal to the CPU engine's (info)\n", i, n1[i], cpu_same);
        }
        printf("  drafts accepted: %d on the GPU (R 8), %d on the CPU (R 8)\n", acc8, rc_ == 0 ? accc : -1);
    }
    for (int i = 0; i < NP; i++) { free(o1[i]); free(o8[i]); free(oc[i]); }
    printf("%s spec_equals_greedy\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    int fails = gh_case_fail ? 1 : 0;
    /* one limit, no silent slow path: 16 rows a request run through graphs, 17 are refused at
     * engine creation with the flag named */
    gh_case_fail = 0;
    int *o16[NP] = {0}, n16[NP] = {0}, acc16, *o17[NP] = {0}, n17[NP] = {0}, acc17;
    GH_CHECK(tm_generate(dir, "cuda", 16, NP, prompts, plen, 8, o16, n16, &acc16) == 0, "R 16 must run");
    int r17 = tm_generate(dir, "cuda", 17, NP, prompts, plen, 8, o17, n17, &acc17);
    GH_CHECK(r17 != 0 && strstr(sparkmono_errmsg(), "--request-rows 17"), "R 17 must be refused naming --request-rows: '%s'",
             sparkmono_errmsg());
    for (int i = 0; i < NP; i++) { free(o16[i]); free(o17[i]); }
    printf("%s request_rows_limit\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return fails + (gh_case_fail ? 1 : 0);
}

/* ---- the prefix cache on the GPU: a request whose prompt prefix is cached emits the ids it
 * emits in an engine without the cache (docs/architecture.md: exact only if the backend's K/V
 * are the same bits however prompt rows are chunked and batched) ---- */

/* Engine options of the cases below: the cuda backend, max length 256, the monokernel mono, world
 * virtual ranks of device 0 through peer memory (0 or 1: one rank). */
static sparkmono_engine_opts tm_cuda_opts(const char *mono, int world) {
    sparkmono_engine_opts o;
    memset(&o, 0, sizeof o);
    o.backend = "cuda";
    o.mono = mono;
    o.max_len = 256;
    if (world > 1) {
        o.world = world;
        o.devices = world == 2 ? "0,0" : "0,0,0,0";
        o.comm = "peer";
    }
    return o;
}

/* Ids of b (after a, whose prompt shares b's first 64 tokens) on the cuda backend: the prefix
 * cache on or off, the monokernel mono, world virtual ranks (0: one rank). */
static int tm_prefix_run(sparkmono_model *m, int cache, const char *mono, int world, const int *a, const int *b, int n, int *out,
                         int *nout, long long *hits) {
    sparkmono_engine_opts o = tm_cuda_opts(mono, world);
    o.request_rows = 8;
    o.no_prefix_cache = !cache;
    sparkmono_engine *g = NULL;
    if (sparkmono_engine_create(m, &o, &g)) { printf("  engine: %s\n", sparkmono_errmsg()); return -1; }
    int rc = 0, r;
    const int *t;
    for (int k = 0; k < 2 && !rc; k++) {
        if (sparkmono_add(g, k ? b : a, n, 24, &r) || sparkmono_generate(g) || sparkmono_output(g, r, &t, nout)) {
            printf("  run: %s\n", sparkmono_errmsg());
            rc = -1;
            break;
        }
        if (k) memcpy(out, t, sizeof(int) * (size_t)*nout);
        sparkmono_remove(g, r);
    }
    sparkmono_cache_stats cs;
    sparkmono_cache_stats_get(g, &cs);
    *hits = cs.hits;
    sparkmono_engine_destroy(g);
    return rc;
}

int tm_prefix(const char *root, uint64_t seed) {
    gh_case_fail = 0;
    sparkmono_model *m = tm_open_tiny(root, "prefix_tiny", seed, "prefix_cache_exact");
    if (!m) return 1;
    enum { N = 100 };
    int a[N], b[N];
    uint64_t rng = seed + 9;
    for (int i = 0; i < N; i++) a[i] = 3 + (int)(sm_rng_next(&rng) % 500);
    memcpy(b, a, sizeof(int) * 64);
    for (int i = 64; i < N; i++) b[i] = 3 + (int)(sm_rng_next(&rng) % 500);
    static const struct { const char *mono; int world; } v[] = {{"off", 0}, {"on", 0}, {"off", 2}, {"on", 2}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        int on[32], off[32], non = 0, noff = 0;
        long long hon = 0, hoff = 0;
        if (tm_prefix_run(m, 1, v[i].mono, v[i].world, a, b, N, on, &non, &hon) ||
            tm_prefix_run(m, 0, v[i].mono, v[i].world, a, b, N, off, &noff, &hoff)) {
            GH_CHECK(0, "mono %s world %d: a run failed", v[i].mono, v[i].world);
            continue;
        }
        GH_CHECK(hon == 64 && hoff == 0, "mono %s world %d: %lld / %lld tokens hit", v[i].mono, v[i].world, hon, hoff);
        GH_CHECK(non == noff && !memcmp(on, off, sizeof(int) * (size_t)non), "mono %s world %d: ids differ with the cache",
                 v[i].mono, v[i].world);
    }
    sparkmono_model_close(m);
    printf("%s prefix_cache_exact\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}

/* ---- speculative == greedy with our own loop and an oracle drafter ---- */

int tm_rig_make(tm_rig *g, const char *root, const char *name, uint64_t seed, int world, int moe_tp, int nslot, int ml,
                int *slots) {
    memset(g, 0, sizeof *g);
    sm_err e = {{0}};
    sm_config c;
    char dir[512];
    if (sm_config_preset("tiny", &c, &e) || tm_make(root, name, &c, SM_EXP_MXFP4, seed, dir, sizeof dir) ||
        sm_model_load(dir, NULL, &g->m, &e)) {
        GH_CHECK(0, "model: %s", e.msg);
        return -1;
    }
    g->have_m = 1;
    if (sm_kv_init(&g->kv, nslot * (ml / SM_KV_BLOCK), nslot, ml, seed, &e)) {
        GH_CHECK(0, "kv: %s", e.msg);
        return -1;
    }
    for (int r = 0; r < nslot; r++)
        if (sm_kv_add(&g->kv, &slots[r], &e) || sm_kv_reserve(&g->kv, slots[r], ml, &e)) {
            GH_CHECK(0, "kv: %s", e.msg);
            return -1;
        }
    sm_backend_opts bo;
    memset(&bo, 0, sizeof bo);
    bo.world = world > 1 ? world : 1;
    bo.max_rows = 64;
    int devs[8] = {0};
    bo.devices = world > 1 ? devs : NULL;
    if (world > 1) bo.comm = tm_world_devices(world, devs);
    bo.moe_tp = moe_tp;
    if (sm_cuda_backend_create(&g->m, &g->kv, &bo, &g->b, &e)) {
        GH_CHECK(0, "%s", e.msg);
        return -1;
    }
    g->have_b = 1;
    return 0;
}

void tm_rig_free(tm_rig *g) {
    if (g->have_b) g->b.destroy(g->b.ctx);
    sm_kv_free(&g->kv);
    if (g->have_m) sm_model_free(&g->m);
    memset(g, 0, sizeof *g);
}

/* One step of n rows (argmax only) on backend b; 0 or -1 (check failed). */
static int tm_run(sm_backend *b, sm_kv *kv, int n, const int *tok, const int *pos, const int *req, int *am) {
    sm_err e = {{0}};
    sm_step s;
    memset(&s, 0, sizeof s);
    s.nrows = n; s.tokens = tok; s.pos = pos; s.req = req; s.kv = kv; s.argmax = am;
    if (b->step(b->ctx, &s, &e)) { GH_CHECK(0, "step of %d rows: %s", n, e.msg); return -1; }
    return 0;
}

/* Plain greedy (one row a request a step) and speculative verify steps of R = 8 rows whose
 * drafts are the greedy tokens with about a third replaced by random ids (so steps accept
 * 0..7 drafts), both on the CUDA backend: the emitted tokens must be identical. */
/* world 0: the one-rank backend; else that many virtual ranks on device 0 (moe_tp: the layout). */
int tm_spec_loop(const char *root, uint64_t seed, int world, int moe_tp) {
    gh_case_fail = 0;
    enum { NG = 40, R = 8, ML = 128 };
    tm_rig rig;
    int accepted = 0, steps = 0;
    static const int plen[TM_NREQ] = {12, 23, 7};
    int prompt[TM_NREQ][32], g[TM_NREQ][NG], sp[TM_NREQ][NG + R], ns[TM_NREQ], slot[2][TM_NREQ];
    int tok[128], pos[128], req[128], am[128];
    uint64_t rng = seed;
    char name[64];
    snprintf(name, sizeof name, "spec_loop_tiny_w%d_%s", world > 1 ? world : 1, moe_tp ? "tp" : "ep");
    /* two copies of every request: greedy (slot[0]) and speculative (slot[1]) */
    if (tm_rig_make(&rig, root, name, seed, world, moe_tp, 2 * TM_NREQ, ML, &slot[0][0])) goto out;
    sm_backend *b = &rig.b;
    sm_kv *kv = &rig.kv;
    const int vu = rig.m.cfg.vocab_used;
    for (int r = 0; r < TM_NREQ; r++)
        for (int i = 0; i < plen[r]; i++) prompt[r][i] = 3 + (int)(sm_rng_next(&rng) % (uint64_t)(vu - 3));
    /* prefill both copies of every prompt in one step; the last row's argmax is token 0 */
    for (int k = 0, n = 0; k < 2; k++) {
        for (int r = 0; r < TM_NREQ; r++)
            for (int i = 0; i < plen[r]; i++, n++) { tok[n] = prompt[r][i]; pos[n] = i; req[n] = slot[k][r]; }
        if (k == 1) {
            if (tm_run(b, kv, n, tok, pos, req, am)) goto out;
            for (int r = 0, at = 0; r < 2 * TM_NREQ; r++) {
                at += plen[r % TM_NREQ];
                if (r < TM_NREQ) g[r][0] = am[at - 1];
                else { sp[r - TM_NREQ][0] = am[at - 1]; ns[r - TM_NREQ] = 1; }
            }
        }
    }
    /* greedy: one row per request per step */
    for (int t = 1; t < NG; t++) {
        for (int r = 0; r < TM_NREQ; r++) { tok[r] = g[r][t - 1]; pos[r] = plen[r] + t - 1; req[r] = slot[0][r]; }
        if (tm_run(b, kv, TM_NREQ, tok, pos, req, am)) goto out;
        for (int r = 0; r < TM_NREQ; r++) g[r][t] = am[r];
    }
    /* speculative: R rows per unfinished request: last token + R-1 (partly corrupted) drafts */
    while (1) {
        int n = 0, who[TM_NREQ], nw = 0;
        for (int r = 0; r < TM_NREQ; r++) {
            if (ns[r] >= NG) continue;
            who[nw++] = r;
            for (int j = 0; j < R; j++, n++) {
                int e0 = ns[r] - 1 + j; /* index in g the row's token stands for */
                int d = j == 0 ? sp[r][ns[r] - 1] : (e0 < NG ? g[r][e0] : 5);
                if (j > 0 && sm_rng_next(&rng) % 3 == 0) d = 3 + (int)(sm_rng_next(&rng) % (uint64_t)(vu - 3));
                tok[n] = d;
                pos[n] = plen[r] + ns[r] - 1 + j;
                req[n] = slot[1][r];
            }
        }
        if (!nw) break;
        if (tm_run(b, kv, n, tok, pos, req, am)) goto out;
        steps++;
        for (int w = 0; w < nw; w++) {
            int r = who[w], *t = tok + w * R, *a = am + w * R, k = 0;
            while (k + 1 < R && t[k + 1] == a[k]) k++; /* accept draft k+1 while it is row k's argmax */
            for (int j = 1; j <= k; j++) sp[r][ns[r]++] = t[j];
            sp[r][ns[r]++] = a[k];
            accepted += k;
        }
    }
    for (int r = 0; r < TM_NREQ; r++) {
        int same = 0;
        while (same < NG && sp[r][same] == g[r][same]) same++;
        GH_CHECK(same == NG, "request %d: speculative tokens differ from greedy at token %d of %d", r, same, NG);
    }
    printf("  %d verify steps, %d drafts accepted for %d tokens\n", steps, accepted, TM_NREQ * NG);
    GH_CHECK(accepted > 0, "no draft was ever accepted");
out:
    tm_rig_free(&rig);
    if (world > 1) printf("%s spec_loop_equals_greedy (world %d, %s)\n", gh_case_fail ? "FAIL" : "PASS", world, moe_tp ? "tp" : "ep");
    else printf("%s spec_loop_equals_greedy\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}

/* ---- the synthetic backend ---- */

int tm_synth(const char *root, uint64_t seed) {
    int fails = 0;
    for (int fi = 0; fi < 2; fi++) {
        int fmt = fi ? SM_EXP_MXFP4 : SM_EXP_BF16;
        gh_case_fail = 0;
        sm_err e = {{0}};
        sm_config c;
        char dir[512], name[64];
        sm_model m;
        memset(&m, 0, sizeof m);
        sm_kv kv;
        memset(&kv, 0, sizeof kv);
        sm_backend b;
        int have_b = 0, have_m = 0;
        snprintf(name, sizeof name, "synth_tiny_%s", sm_expert_fmt_name((sm_expert_fmt)fmt));
        enum { NR = 40 };
        float *l1 = malloc(sizeof(float) * NR * 512), *l2 = malloc(sizeof(float) * NR * 512);
        int tok[NR], pos[NR], req[NR], am[NR], slot;
        if (!l1 || !l2) { GH_CHECK(0, "out of host memory"); goto next; }
        if (sm_config_preset("tiny", &c, &e) || tm_make(root, name, &c, fmt, seed, dir, sizeof dir) ||
            sm_model_load(dir, NULL, &m, &e)) {
            GH_CHECK(0, "model: %s", e.msg);
            goto next;
        }
        have_m = 1;
        if (m.cfg.V > 512) { GH_CHECK(0, "tiny vocabulary %d > 512", m.cfg.V); goto next; }
        if (sm_kv_init(&kv, 16, 1, 256, 3, &e) || sm_kv_add(&kv, &slot, &e) || sm_kv_reserve(&kv, slot, 256, &e)) {
            GH_CHECK(0, "kv: %s", e.msg);
            goto next;
        }
        sm_backend_opts bo;
        memset(&bo, 0, sizeof bo);
        bo.world = 1;
        bo.max_rows = 64;
        if (sm_cuda_backend_create_synth(&m.cfg, fmt, seed, &kv, &bo, &b, &e)) { GH_CHECK(0, "%s", e.msg); goto next; }
        have_b = 1;
        /* dense weights = make-model's of the same seed */
        if (sm_cuda_backend_check_dense(&b, &m, &e)) GH_CHECK(0, "%s", e.msg);
        /* a prefill of 32 rows, then the same 8-row verify step twice: finite, identical */
        uint64_t rng = seed;
        for (int i = 0; i < NR; i++) { tok[i] = (int)(sm_rng_next(&rng) % 512); pos[i] = i; req[i] = slot; }
        sm_step s;
        memset(&s, 0, sizeof s);
        s.nrows = 32; s.tokens = tok; s.pos = pos; s.req = req; s.kv = &kv; s.logits = l1; s.argmax = am;
        if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "prefill: %s", e.msg); goto next; }
        s.nrows = 8; s.tokens = tok + 32; s.pos = pos + 32;
        if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "verify: %s", e.msg); goto next; }
        s.logits = l2;
        if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "verify again: %s", e.msg); goto next; }
        int finite = 1, same = 1;
        for (int i = 0; i < 8 * c.V; i++) {
            if (isnan(l2[i]) || (isinf(l2[i]) && l2[i] > 0)) finite = 0;
            if (memcmp(&l1[i], &l2[i], 4)) same = 0;
        }
        GH_CHECK(finite, "synthetic logits not finite");
        GH_CHECK(same, "the same verify step twice gave different logits (eager+capture vs graph replay)");
    next:
        if (have_b) b.destroy(b.ctx);
        sm_kv_free(&kv);
        if (have_m) sm_model_free(&m);
        free(l1);
        free(l2);
        printf("%s %s\n", gh_case_fail ? "FAIL" : "PASS", name);
        fflush(stdout);
        fails += gh_case_fail ? 1 : 0;
    }
    return fails;
}

/* ---- monokernel: refusals and the bounded barrier ---- */

/* A tiny synthetic backend (mono mode, layers), one 8-row verify step after a 16-row prefill;
 * 0 with the step's error line in e (or "" when every step ran). */
static int tm_mono_run_w(int mono, int L, int world, char *msg, size_t cap, double *secs) {
    sm_err e = {{0}};
    sm_config c;
    sm_kv kv;
    memset(&kv, 0, sizeof kv);
    sm_backend b;
    int have_b = 0, slot, tok[24], pos[24], req[24], am[24], rc = 0;
    msg[0] = 0;
    if (sm_config_preset("tiny", &c, &e) || (L && sm_config_set_layers(&c, L, &e)) || sm_kv_init(&kv, 8, 1, 128, 5, &e) ||
        sm_kv_add(&kv, &slot, &e) || sm_kv_reserve(&kv, slot, 128, &e)) {
        snprintf(msg, cap, "setup: %.900s", e.msg);
        rc = -1;
        goto out;
    }
    sm_backend_opts bo;
    memset(&bo, 0, sizeof bo);
    int devs[8] = {0};
    bo.world = world;
    if (world > 1) {
        bo.devices = devs;
        bo.comm = SM_COMM_PEER;
    }
    bo.max_rows = 32;
    bo.mono = mono;
    if (sm_cuda_backend_create_synth(&c, SM_EXP_MXFP4, 9, &kv, &bo, &b, &e)) {
        snprintf(msg, cap, "%s", e.msg);
        goto out;
    }
    have_b = 1;
    for (int i = 0; i < 24; i++) { tok[i] = (7 * i + 3) % c.V; pos[i] = i; req[i] = slot; }
    sm_step s;
    memset(&s, 0, sizeof s);
    s.nrows = 16; s.tokens = tok; s.pos = pos; s.req = req; s.kv = &kv; s.argmax = am;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (b.step(b.ctx, &s, &e)) snprintf(msg, cap, "%s", e.msg);
    s.nrows = 8; s.tokens = tok + 16; s.pos = pos + 16;
    if (!msg[0] && b.step(b.ctx, &s, &e)) snprintf(msg, cap, "%s", e.msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs) *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
out:
    if (have_b) b.destroy(b.ctx);
    sm_kv_free(&kv);
    return rc;
}

static int tm_mono_run(int mono, int L, char *msg, size_t cap, double *secs) { return tm_mono_run_w(mono, L, 1, msg, cap, secs); }

int tm_mono_guards(void) {
    gh_case_fail = 0;
    char msg[1024];
    double secs = 0;
    /* 1. a static refusal (2 layers: no layer 1..L-2) is an error with --mono on ... */
    GH_CHECK(tm_mono_run(SM_MONO_ON, 2, msg, sizeof msg, NULL) == 0 && strstr(msg, "--mono on") && strstr(msg, "2 layers"),
             "mono on, 2 layers: expected a refusal naming the layers, got '%s'", msg);
    printf("  mono on, 2 layers: %s\n", msg);
    /* ... and stock steps with auto */
    GH_CHECK(tm_mono_run(SM_MONO_AUTO, 2, msg, sizeof msg, NULL) == 0 && !msg[0], "mono auto, 2 layers: '%s'", msg);
    /* 2. the bounded grid barrier: block 1 stops arriving before layer 1's pooler phase; the
     * step fails naming layer and phase within the bound, no hang; the next engine runs */
    setenv("SPARKMONO_MONO_FAULT", "1:6", 1);
    setenv("SPARKMONO_MONO_BOUND_MS", "200", 1);
    GH_CHECK(tm_mono_run(SM_MONO_ON, 0, msg, sizeof msg, &secs) == 0 && strstr(msg, "layer 1") && strstr(msg, "pooler"),
             "fault injection: expected an error naming layer 1 and the pooler phase, got '%s'", msg);
    printf("  fault at layer 1, pooler: '%s' after %.2f s\n", msg, secs);
    GH_CHECK(secs < 5.0, "fault injection: the failed step took %.2f s (bound 0.2 s)", secs);
    unsetenv("SPARKMONO_MONO_FAULT");
    unsetenv("SPARKMONO_MONO_BOUND_MS");
    GH_CHECK(tm_mono_run(SM_MONO_ON, 0, msg, sizeof msg, NULL) == 0 && !msg[0], "after the fault test: '%s'", msg);
    /* 3. two virtual ranks: rank 1 stops mid-layer (its block 1 never reaches the barrier before
     * layer 1's pooler); rank 0 waits for rank 1's pooled part inside its launch: the step fails
     * naming the layer and a rank within the bound, no hang; a later world runs */
    GH_CHECK(tm_mono_run_w(SM_MONO_ON, 0, 2, msg, sizeof msg, NULL) == 0 && !msg[0], "world 2, mono on: '%s'", msg);
    setenv("SPARKMONO_MONO_FAULT", "1:6:1", 1);
    setenv("SPARKMONO_MONO_BOUND_MS", "200", 1);
    GH_CHECK(tm_mono_run_w(SM_MONO_ON, 0, 2, msg, sizeof msg, &secs) == 0 && strstr(msg, "layer 1") && strstr(msg, "rank"),
             "world 2 fault injection: expected an error naming layer 1 and a rank, got '%s'", msg);
    printf("  world 2, rank 1 stops at layer 1, pooler: '%s' after %.2f s\n", msg, secs);
    GH_CHECK(secs < 5.0, "world 2 fault injection: the failed step took %.2f s (bound 0.2 s)", secs);
    unsetenv("SPARKMONO_MONO_FAULT");
    unsetenv("SPARKMONO_MONO_BOUND_MS");
    GH_CHECK(tm_mono_run_w(SM_MONO_ON, 0, 2, msg, sizeof msg, NULL) == 0 && !msg[0], "world 2 after the fault test: '%s'", msg);
    printf("%s mono_guards\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}

/* ---- tensor + expert parallelism: speculative == greedy, a stalled peer, refusals ---- */

static double tm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Open dir and create an engine of backend cuda with `world` ranks on `devices`, comm `comm`. */
static int tm_world_engine(const char *dir, int world, const char *devices, const char *comm, sparkmono_model **m,
                           sparkmono_engine **g) {
    *g = NULL;
    if (sparkmono_model_open(dir, NULL, m)) return -1;
    sparkmono_engine_opts o;
    memset(&o, 0, sizeof o);
    o.backend = "cuda";
    o.request_rows = 8;
    o.max_len = 256;
    o.world = world;
    o.devices = devices;
    o.comm = comm;
    return sparkmono_engine_create(*m, &o, g) ? -1 : 0;
}

int tm_world_guards(const char *root, uint64_t seed) {
    gh_case_fail = 0;
    sm_err e = {{0}};
    sm_config c;
    char dir[512];
    if (sm_config_preset("tiny", &c, &e) || tm_make(root, "world_tiny", &c, SM_EXP_MXFP4, seed, dir, sizeof dir)) {
        printf("FAIL world_guards (make-model: %s)\n", e.msg);
        return 1;
    }
    /* speculative == plain greedy with 2 ranks */
    enum { NP = 2 };
    int p0[24], p1[20];
    for (int i = 0; i < 24; i++) p0[i] = 10 + i % 4;
    for (int i = 0; i < 20; i++) p1[i] = i % 2 ? 77 : 78;
    int *const prompts[NP] = {p0, p1};
    const int plen[NP] = {24, 20};
    int *o1[NP] = {0}, *o8[NP] = {0}, n1[NP] = {0}, n8[NP] = {0}, acc1, acc8;
    tm_gen_devices = "0,0";
    int r1 = tm_generate(dir, "cuda", 1, NP, prompts, plen, 40, o1, n1, &acc1);
    int r8 = tm_generate(dir, "cuda", 8, NP, prompts, plen, 40, o8, n8, &acc8);
    tm_gen_devices = "";
    GH_CHECK(r1 == 0 && r8 == 0, "world 2 generation failed: %s", sparkmono_errmsg());
    for (int i = 0; i < NP && r1 == 0 && r8 == 0; i++) {
        int same = n1[i] == n8[i];
        for (int j = 0; same && j < n1[i]; j++) same = o1[i][j] == o8[i][j];
        GH_CHECK(same, "world 2, request %d: speculative output differs from greedy", i);
    }
    printf("  world 2: speculative == greedy on %d requests (%d drafts accepted)\n", NP, acc8);
    for (int i = 0; i < NP; i++) { free(o1[i]); free(o8[i]); }
    /* a peer that stops publishing at layer 2's attn_sum: the step fails within about one bound,
     * naming the layer, the operation and the stuck rank; the next step is refused */
    setenv("SPARKMONO_COMM_FAULT", "1:2:attn_sum", 1);
    setenv("SPARKMONO_COMM_BOUND_MS", "200", 1);
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    if (tm_world_engine(dir, 2, "0,0", NULL, &m, &g)) {
        GH_CHECK(0, "world 2 engine: %s", sparkmono_errmsg());
    } else {
        int id;
        double t0 = tm_now();
        int rc = sparkmono_add(g, p0, 24, 8, &id) || sparkmono_prefill(g, id, NULL);
        double dt = tm_now() - t0;
        const char *msg = sparkmono_errmsg();
        printf("  stalled peer: %s after %.2f s: %s\n", rc ? "failed" : "DID NOT FAIL", dt, msg);
        GH_CHECK(rc && strstr(msg, "layer 2") && strstr(msg, "attn_sum") && strstr(msg, "rank 1"),
                 "the failure must name layer 2, attn_sum and rank 1: '%s'", msg);
        GH_CHECK(dt < 1.5, "the stalled peer took %.2f s to report (bound 0.2 s)", dt);
        int id2;
        sparkmono_remove(g, id);
        GH_CHECK(sparkmono_add(g, p1, 20, 8, &id2) == 0, "add after the failure: %s", sparkmono_errmsg());
        GH_CHECK(sparkmono_prefill(g, id2, NULL) != 0 && strstr(sparkmono_errmsg(), "refused"),
                 "a step after the failure must be refused: '%s'", sparkmono_errmsg());
    }
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    unsetenv("SPARKMONO_COMM_FAULT");
    unsetenv("SPARKMONO_COMM_BOUND_MS");
    /* refusals in one line: NCCL on a repeated device; a world the model does not divide */
    m = NULL;
    g = NULL;
    GH_CHECK(tm_world_engine(dir, 2, "0,0", "nccl", &m, &g) != 0 && strstr(sparkmono_errmsg(), "duplicated"),
             "nccl on devices 0,0 must be refused naming the duplicated device: '%s'", sparkmono_errmsg());
    printf("  nccl on 0,0: %s\n", sparkmono_errmsg());
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    m = NULL;
    g = NULL;
    GH_CHECK(tm_world_engine(dir, 4, "0,0,0,0", NULL, &m, &g) != 0 && strstr(sparkmono_errmsg(), "num_key_value_heads"),
             "world 4 on tiny (nKV 2) must be refused naming nKV: '%s'", sparkmono_errmsg());
    printf("  world 4 on tiny: %s\n", sparkmono_errmsg());
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    printf("%s world_guards\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}

/* ---- structured outputs on the GPU: the constraint masks applied where the logits are
 * (backend.h: sm_step.mask; cuda: sm_k_mask_rows after the lm_head) ---- */

/* Ids of prompt {5, 6, 7} under c on the cuda backend: R rows a request, the monokernel mono,
 * world virtual ranks (0: one), sampling s; with logprobs (top 5), their logprobs into lp. */
static int tm_con_run(sparkmono_model *m, sparkmono_constraint *c, int R, const char *mono, int world, const sparkmono_sampling *s,
                      int *out, int *n, int *done, float *lp) {
    sparkmono_engine_opts o = tm_cuda_opts(mono, world);
    o.request_rows = R;
    sparkmono_engine *g = NULL;
    if (sparkmono_engine_create(m, &o, &g)) { printf("  engine: %s\n", sparkmono_errmsg()); return -1; }
    sparkmono_sampling smp = *s;
    smp.constraint = c;
    smp.logprobs = 1;
    smp.top_logprobs = 5;
    const int prompt[3] = {5, 6, 7};
    int r, rc = 0, k;
    const int *t, *top;
    const float *l, *tl;
    sparkmono_request_info info;
    if (sparkmono_add_sampled(g, prompt, 3, 64, &smp, &r) || sparkmono_generate(g) || sparkmono_output(g, r, &t, n) ||
        sparkmono_logprobs(g, r, &l, &top, &tl, &k) || sparkmono_request_get_info(g, r, &info)) {
        printf("  run: %s\n", sparkmono_errmsg());
        rc = -1;
    } else {
        memcpy(out, t, sizeof(int) * (size_t)*n);
        memcpy(lp, l, sizeof(float) * (size_t)*n);
        *done = info.done;
    }
    sparkmono_engine_destroy(g);
    return rc;
}

/* Under each constraint, greedy and seeded sampling: the text the GPU emits keeps to the
 * constraint (every id allowed where it stands, and an eos only where the text is complete), with
 * finite logprobs; R = 8 == R = 1, the monokernel == stock, 2 virtual ranks == 1 (the same ids). */
int tm_structured(const char *root, uint64_t seed) {
    gh_case_fail = 0;
    sparkmono_model *m = tm_open_tiny(root, "structured_tiny", seed, "structured_outputs");
    if (!m) return 1;
    sm_err e = {{0}};
    static const struct { const char *kind, *spec; } cs[] = {
        {"regex", "[a-z]{2,8}( [a-z]{2,8}){0,3}\\."},
        {"choice", "[\"yes\", \"no\", \"maybe later\"]"},
        {"json_schema", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                        "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"age\"]}"},
        {"json_object", NULL},
    };
    static const struct { int R; const char *mono; int world; } v[] = {{8, "off", 0}, {1, "off", 0}, {8, "on", 0}, {8, "off", 2}};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        sparkmono_constraint *con = NULL;
        if (sparkmono_constraint_create(m, cs[ci].kind, cs[ci].spec, cs[ci].spec ? strlen(cs[ci].spec) : 0, 0, &con)) {
            GH_CHECK(0, "%s: %s", cs[ci].kind, sparkmono_errmsg());
            continue;
        }
        for (int sv = 0; sv < 3; sv++) {
            sparkmono_sampling s;
            memset(&s, 0, sizeof s);
            if (sv) s.temperature = 1.0f, s.seed = seed + (uint64_t)sv;
            int ids[4][64], n[4], done[4];
            float lp[4][64];
            int ok = 1;
            for (size_t vi = 0; vi < sizeof v / sizeof v[0] && ok; vi++)
                ok = tm_con_run(m, con, v[vi].R, v[vi].mono, v[vi].world, &s, ids[vi], &n[vi], &done[vi], lp[vi]) == 0;
            if (!ok) { GH_CHECK(0, "%s variant %d: a run failed", cs[ci].kind, sv); continue; }
            /* the text keeps to the constraint: each id advances its position, an eos only at the end */
            int pos = sm_con_start(con), bad = 0;
            for (int i = 0; i < n[0] && !bad; i++) {
                pos = sm_con_advance(con, pos, ids[0][i], &e);
                bad = pos < 0 && pos != SM_CON_ENDED;
                GH_CHECK(isfinite(lp[0][i]), "%s variant %d: logprob %d is %g", cs[ci].kind, sv, i, (double)lp[0][i]);
            }
            GH_CHECK(!bad && (done[0] != 1 || pos == SM_CON_ENDED), "%s variant %d: the ids leave the constraint (end %d)",
                     cs[ci].kind, sv, done[0]);
            for (size_t vi = 1; vi < sizeof v / sizeof v[0]; vi++)
                GH_CHECK(n[vi] == n[0] && !memcmp(ids[vi], ids[0], sizeof(int) * (size_t)n[0]),
                         "%s variant %d: R %d mono %s world %d gave %d ids, R 8 stock %d", cs[ci].kind, sv, v[vi].R, v[vi].mono,
                         v[vi].world, n[vi], n[0]);
        }
        sparkmono_constraint_release(con);
    }
    sparkmono_model_close(m);
    printf("%s structured_outputs\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}

/* ---- the KV pool sized from memory (sparkmono_engine_opts.gpu_memory_utilization) ---- */

/* Ids of prompt p [n] (greedy, 24 ids) on the cuda backend, the pool sized from util (0: the
 * default) over world virtual ranks (0: one); *pages: the pool's pages. */
static int tm_kv_run(sparkmono_model *m, float util, int world, const int *p, int n, int *out, int *nout, int *pages) {
    sparkmono_engine_opts o = tm_cuda_opts(NULL, world);
    o.gpu_memory_utilization = util;
    sparkmono_engine *g = NULL;
    if (sparkmono_engine_create(m, &o, &g)) { printf("  engine: %s\n", sparkmono_errmsg()); return -1; }
    int r, rc = 0;
    const int *t;
    if (sparkmono_add(g, p, n, 24, &r) || sparkmono_generate(g) || sparkmono_output(g, r, &t, nout)) {
        printf("  run: %s\n", sparkmono_errmsg());
        rc = -1;
    } else {
        memcpy(out, t, sizeof(int) * (size_t)*nout);
    }
    sparkmono_cache_stats cs;
    sparkmono_cache_stats_get(g, &cs);
    *pages = cs.pages;
    sparkmono_engine_destroy(g);
    return rc;
}

/* The pool sized from 0.5 of the GPU holds many more pages than the default, gives the same ids,
 * and a share too small for one request is refused in one line. */
int tm_kv_mem(const char *root, uint64_t seed) {
    gh_case_fail = 0;
    sparkmono_model *m = tm_open_tiny(root, "kvmem_tiny", seed, "kv_pool_from_memory");
    if (!m) return 1;
    int p[40], a[32], b[32], na = 0, nb = 0, pa = 0, pb = 0;
    for (int i = 0; i < 40; i++) p[i] = 3 + (int)((seed * 31 + (uint64_t)i * 7) % 400);
    for (int world = 0; world <= 2; world += 2) {
        if (tm_kv_run(m, 0, world, p, 40, a, &na, &pa) || tm_kv_run(m, 0.5f, world, p, 40, b, &nb, &pb)) {
            GH_CHECK(0, "world %d: a run failed", world);
            continue;
        }
        GH_CHECK(pb > 16 * pa, "world %d: %d pages from half the memory, %d by default", world, pb, pa);
        GH_CHECK(na == nb && !memcmp(a, b, sizeof(int) * (size_t)na), "world %d: the ids differ with the pool from memory", world);
        printf("  world %d: %d KV pages from half the GPU's memory (%d by default)\n", world, pb, pa);
    }
    sparkmono_engine_opts o = tm_cuda_opts(NULL, 0);
    o.max_len = 0;
    o.gpu_memory_utilization = 0.001f;
    sparkmono_engine *g = NULL;
    sm_status st = sparkmono_engine_create(m, &o, &g);
    GH_CHECK(st != SM_OK && strstr(sparkmono_errmsg(), "gpu memory utilization") && !strchr(sparkmono_errmsg(), '\n'),
             "a share too small: status %d, '%s'", st, sparkmono_errmsg());
    if (g) sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    printf("%s kv_pool_from_memory\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}
