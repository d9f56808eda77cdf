/* test_finite.c: NaN and Inf in a checkpoint.  `check`'s scan (sm_check_finite) must name the
 * first non-finite value (tensor, flat index, coordinates, kind) for every floating dtype, in
 * file order whatever the thread count, and pass the largest finite codes; the engine must
 * fail a step whose logits hold a NaN or Inf (argmax -1, backend.h) with a line naming the
 * step, request and row, and never emit an id from such a row; an Inf that reaches a raw
 * logit must not be hidden by the softcap.
 *
 * Poisons are written into a fresh tiny checkpoint in place (pwrite at the tensor's offset,
 * then a reload) and undone after each case.  For the engine the property tested is exact:
 * row i's argmax is -1 iff our own scan of its logits finds a non-finite value, and the prefill
 * fails iff some row does, naming the first.  Poisons that must reach the logits (q_proj,
 * embedding row of a prompt token, final norm, lm_head row (NaN or +Inf), an FP8 expert that
 * row 0 routes to) are also required to fail; router and bias poisons saturate in the sigmoid or only
 * select, so only the property is required there.  We rejected comparing against stored
 * outputs: the property holds for any seed.
 */
#include "check.h"
#include "tmodel.h"
#include "engine/check.h"
#include "cpu/debug.h"
#include "engine/engine.h"
#include "sparkmono.h"
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define P_ "model.language_model."
#define MAXP 16 /* prompt rows of the engine runs */

static tmodel g_bf16, g_fp8; /* tiny models: BF16 experts; FP8 experts in layers 1..L-2 */

/* ---- poisons ---------------------------------------------------------------------------- */

static int reload(tmodel *t) {
    sm_err e = {""};
    sm_load_opts lo;
    memset(&lo, 0, sizeof lo);
    if (t->ok) sm_model_free(&t->m);
    t->ok = 0;
    if (sm_model_load(t->dir, &lo, &t->m, &e)) { CHECK(0, "reload: %s", e.msg); return -1; }
    t->ok = 1;
    return 0;
}

typedef struct patch {
    char path[700];        /* file written */
    int64_t off;           /* file offset */
    size_t n;              /* bytes */
    unsigned char *old;    /* [n] the bytes before */
} patch;

/* Write `count` copies of the w-byte little-endian code from element elem of tensor name, keep
 * the old bytes in p, reload t.  0 or -1. */
static int patch_apply(tmodel *t, patch *p, const char *name, int64_t elem, int64_t count, int w, uint64_t code) {
    memset(p, 0, sizeof *p);
    const st_tensor *x = st_find(&t->m.ar, name);
    CHECK(x != NULL, "no tensor %s", name);
    if (!x) return -1;
    int64_t b0 = elem * w;
    p->n = (size_t)(count * w);
    CHECK(b0 >= 0 && b0 + (int64_t)p->n <= (int64_t)x->nbytes, "%s: elements %lld+%lld outside", name, (long long)elem,
          (long long)count);
    const st_file *f = &t->m.ar.files[x->file];
    snprintf(p->path, sizeof p->path, "%s", f->path);
    p->off = (int64_t)((const char *)x->data - (const char *)f->map) + b0;
    p->old = malloc(p->n);
    unsigned char *buf = malloc(p->n);
    if (!p->old || !buf) { free(buf); CHECK(0, "out of memory"); return -1; }
    memcpy(p->old, (const char *)x->data + b0, p->n);
    for (int64_t i = 0; i < count; i++) memcpy(buf + i * w, &code, (size_t)w);
    int fd = open(p->path, O_WRONLY);
    ssize_t wr = fd >= 0 ? pwrite(fd, buf, p->n, (off_t)p->off) : -1;
    if (fd >= 0) close(fd);
    free(buf);
    CHECK(wr == (ssize_t)p->n, "pwrite %s", p->path);
    return wr == (ssize_t)p->n ? reload(t) : -1;
}

static void patch_undo(tmodel *t, patch *p) {
    if (!p->old) return;
    int fd = open(p->path, O_WRONLY);
    ssize_t wr = fd >= 0 ? pwrite(fd, p->old, p->n, (off_t)p->off) : -1;
    if (fd >= 0) close(fd);
    CHECK(wr == (ssize_t)p->n, "undo pwrite %s", p->path);
    free(p->old);
    p->old = NULL;
    reload(t);
}

/* ---- the scan --------------------------------------------------------------------------- */

/* sm_check_finite on t with `threads` must report tensor name, element idx at coords, kind. */
static void expect_found(const tmodel *t, int threads, const char *name, int64_t idx, const char *coords, const char *kind) {
    sm_finite_scan r;
    sm_err e = {""};
    int rc = sm_check_finite(&t->m.ar, threads, 0, &r, &e);
    CHECK(rc == -1 && r.found, "threads %d: rc %d found %d (%s), want %s in %s", threads, rc, r.found, e.msg, kind, name);
    if (!r.found) return;
    CHECK(!strcmp(r.t->name, name) && r.index == idx && !strcmp(r.kind, kind),
          "threads %d: found %s element %lld %s, want %s element %lld %s", threads, r.t->name, (long long)r.index, r.kind,
          name, (long long)idx, kind);
    char want[400]; /* coords NULL: not checked */
    if (coords) snprintf(want, sizeof want, "tensor '%s' element %lld [%s] is %s", name, (long long)idx, coords, kind);
    else snprintf(want, sizeof want, "tensor '%s' element %lld [", name, (long long)idx);
    CHECK(strstr(e.msg, want) && !strchr(e.msg, '\n') && strstr(e.msg, t->dir), "message '%s' lacks '%s'", e.msg, want);
}

static void expect_clean(const tmodel *t, int threads, const char *what) {
    sm_finite_scan r;
    sm_err e = {""};
    int rc = sm_check_finite(&t->m.ar, threads, 0, &r, &e);
    CHECK(rc == 0 && !r.found && r.bytes > 0 && r.tensors > 0, "%s, threads %d: rc %d: %s", what, threads, rc, e.msg);
}

/* ---- the engine ------------------------------------------------------------------------- */

typedef struct run_out {
    sm_status st;      /* prefill status */
    char msg[1024];    /* its message */
    int nbad;          /* rows with a NaN / Inf among ids < vocab_used (our own scan of the logits) */
    int first_bad;     /* the first of them, -1 when none */
} run_out;

static int row_bad(const float *l, int n) {
    for (int v = 0; v < n; v++)
        if (!isfinite(l[v])) return 1;
    return 0;
}

/* Prefill prompt [n] (one step, logits requested) on t's checkpoint with the CPU engine of
 * `world` ranks, and check the contract on every row: argmax -1 iff the row is non-finite,
 * else the lowest id of the maximum; the prefill fails iff a row is non-finite, naming the
 * first with the agreed line.  route1: when non-NULL, receives the first expert row 0 routes
 * to in layer 1 (world 1 only). */
static void run_prefill(const tmodel *t, int world, const int *prompt, int n, run_out *o, int *route1);

static int g_route1 = -1;
static void on_trace(void *arg, int layer, const char *stage, const float *data, int n, int width) {
    (void)arg; (void)n; (void)width;
    if (layer == 1 && !strcmp(stage, "route_idx")) g_route1 = (int)data[0];
}

static void run_prefill(const tmodel *t, int world, const int *prompt, int n, run_out *o, int *route1) {
    memset(o, 0, sizeof *o);
    o->first_bad = -1;
    o->st = SM_E_STATE;
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    const sm_config *c = &t->m.cfg;
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)c->V);
    sparkmono_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.max_requests = 1;
    eo.max_len = 64;
    eo.threads = 2;
    eo.world = world;
    int req;
    if (!lg || sparkmono_model_open(t->dir, NULL, &m) || sparkmono_engine_create(m, &eo, &g) ||
        sparkmono_add(g, prompt, n, 4, &req)) {
        CHECK(0, "engine setup: %s", sparkmono_errmsg());
        goto out;
    }
    if (route1) sm_cpu_backend_trace(g->be.ctx, on_trace, NULL);
    g_route1 = -1;
    o->st = sparkmono_prefill(g, req, lg);
    snprintf(o->msg, sizeof o->msg, "%s", sparkmono_errmsg());
    if (route1) *route1 = g_route1;
    for (int i = 0; i < n; i++) {
        const float *li = lg + (size_t)i * (size_t)c->V;
        int bad = row_bad(li, c->vocab_used), best = 0;
        for (int v = 1; v < c->vocab_used; v++)
            if (li[v] > li[best]) best = v;
        CHECK(g->argmax[i] == (bad ? -1 : best), "world %d row %d: argmax %d, row %s, max at %d", world, i, g->argmax[i],
              bad ? "non-finite" : "finite", best);
        if (bad && o->first_bad < 0) o->first_bad = i;
        o->nbad += bad;
    }
    if (o->first_bad < 0) {
        const int *ids;
        int nids = 0;
        CHECK(o->st == SM_OK, "world %d: prefill of finite logits failed: %s", world, o->msg);
        CHECK(sparkmono_output(g, req, &ids, &nids) == SM_OK && nids == 1 && ids[0] == g->argmax[n - 1],
              "first token %d, argmax %d", nids ? ids[0] : -1, g->argmax[n - 1]);
    } else {
        char want[256];
        snprintf(want, sizeof want, "prefill step 1, request %d, row %d: non-finite logits (", req, o->first_bad);
        CHECK(o->st == SM_E_MODEL && !strncmp(o->msg, want, strlen(want)) && !strchr(o->msg, '\n'),
              "world %d: status %d message '%s', want '%s...'", world, o->st, o->msg, want);
        sparkmono_request_info ri;
        CHECK(sparkmono_request_get_info(g, req, &ri) == SM_OK && ri.ngen == 0 && !ri.prefilled,
              "a failed prefill emitted %d ids", ri.ngen);
    }
out:
    free(lg);
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
}

static const int k_prompt[8] = {5, 6, 7, 8, 5, 6, 7, 8};

/* ---- cases ------------------------------------------------------------------------------ */

static void test_clean(void) {
    for (int th = 1; th <= 4; th *= 2) {
        expect_clean(&g_bf16, th, "bf16");
        expect_clean(&g_fp8, th, "fp8");
    }
    run_out o;
    run_prefill(&g_bf16, 1, k_prompt, 8, &o, NULL);
    CHECK(o.nbad == 0, "clean model: %d non-finite rows", o.nbad);
    run_prefill(&g_fp8, 2, k_prompt, 8, &o, NULL);
    CHECK(o.nbad == 0, "clean fp8 model, world 2: %d non-finite rows", o.nbad);
}

/* The largest finite codes of each dtype are not flagged. */
static void test_largest_finite(void) {
    patch p[5];
    memset(p, 0, sizeof p);
    char gu[200];
    snprintf(gu, sizeof gu, P_ "layers.1.mlp.experts.3.gate_up_proj.weight");
    int ok = !patch_apply(&g_bf16, &p[0], P_ "norm.weight", 0, 1, 2, 0x7F7F) &&      /* bf16 max */
             !patch_apply(&g_bf16, &p[1], P_ "norm.weight", 1, 1, 2, 0xFF7F) &&      /* bf16 -max */
             !patch_apply(&g_bf16, &p[2], P_ "layers.0.mlp.gate.weight", 0, 1, 4, 0xFF7FFFFF) && /* f32 -max */
             !patch_apply(&g_fp8, &p[3], gu, 0, 1, 1, 0x7E) &&                       /* e4m3 448 */
             !patch_apply(&g_fp8, &p[4], gu, 1, 1, 1, 0xFE);                         /* e4m3 -448 */
    if (ok) {
        expect_clean(&g_bf16, 2, "largest finite bf16 / f32");
        expect_clean(&g_fp8, 2, "largest finite e4m3");
    }
    for (int i = 4; i >= 0; i--) patch_undo(i < 3 ? &g_bf16 : &g_fp8, &p[i]);
}

static void test_qproj_nan(void) {
    const sm_config *c = &g_bf16.m.cfg;
    patch p;
    int64_t n = (int64_t)c->nH * c->D * c->H;
    if (patch_apply(&g_bf16, &p, P_ "layers.1.self_attn.q_proj.weight", 0, n, 2, 0x7FC0) == 0) {
        for (int th = 1; th <= 8; th *= 2) expect_found(&g_bf16, th, P_ "layers.1.self_attn.q_proj.weight", 0, "0, 0", "NaN");
        run_out o;
        run_prefill(&g_bf16, 1, k_prompt, 8, &o, NULL);
        CHECK(o.first_bad == 0 && o.nbad == 8, "q_proj NaN: first bad row %d, %d bad", o.first_bad, o.nbad);
        run_prefill(&g_bf16, 2, k_prompt, 8, &o, NULL);
        CHECK(o.first_bad == 0 && o.nbad == 8, "q_proj NaN, world 2: first bad row %d, %d bad", o.first_bad, o.nbad);
    }
    patch_undo(&g_bf16, &p);
}

/* One NaN in the embedding row of token 9: caught by check; harmless to a prompt without 9;
 * from 9's position on, every row of a prompt with it is non-finite (attention spreads it). */
static void test_embed_nan(void) {
    const sm_config *c = &g_bf16.m.cfg;
    patch p;
    if (patch_apply(&g_bf16, &p, P_ "embed_tokens.weight", 9LL * c->H + 5, 1, 2, 0xFFC1) == 0) {
        expect_found(&g_bf16, 2, P_ "embed_tokens.weight", 9LL * c->H + 5, "9, 5", "NaN");
        run_out o;
        run_prefill(&g_bf16, 1, k_prompt, 8, &o, NULL);
        CHECK(o.nbad == 0 && o.st == SM_OK, "prompt without the token: %d bad rows", o.nbad);
        int with[8] = {5, 6, 7, 9, 5, 6, 7, 8};
        run_prefill(&g_bf16, 1, with, 8, &o, NULL);
        CHECK(o.first_bad == 3 && o.nbad == 5, "prompt with the token at 3: first bad row %d, %d bad", o.first_bad, o.nbad);
    }
    patch_undo(&g_bf16, &p);
}

static void test_final_norm_inf(void) {
    const sm_config *c = &g_bf16.m.cfg;
    patch p;
    if (patch_apply(&g_bf16, &p, P_ "norm.weight", 0, c->H, 2, 0x7F80) == 0) {
        expect_found(&g_bf16, 2, P_ "norm.weight", 0, "0", "+Inf");
        run_out o;
        run_prefill(&g_bf16, 1, k_prompt, 8, &o, NULL);
        CHECK(o.first_bad == 0 && o.nbad == 8, "final norm Inf: first bad row %d, %d bad", o.first_bad, o.nbad);
    }
    patch_undo(&g_bf16, &p);
}

/* A NaN in lm_head row 300 makes logit 300 NaN in every row; with 2 ranks only rank 1 (ids
 * 256..511) sees it, and the cross-rank argmax must still say -1. */
static void test_lm_head_nan(void) {
    const sm_config *c = &g_bf16.m.cfg;
    patch p;
    if (patch_apply(&g_bf16, &p, "lm_head.weight", 300LL * c->H + 17, 1, 2, 0x7FC0) == 0) {
        expect_found(&g_bf16, 2, "lm_head.weight", 300LL * c->H + 17, "300, 17", "NaN");
        run_out o;
        for (int w = 1; w <= 2; w++) {
            run_prefill(&g_bf16, w, k_prompt, 8, &o, NULL);
            CHECK(o.first_bad == 0 && o.nbad == 8, "lm_head NaN, world %d: first bad row %d, %d bad", w, o.first_bad, o.nbad);
        }
    }
    patch_undo(&g_bf16, &p);
}

/* One +Inf in lm_head row 100 (ids < vocab_used; rank 0 of 2): its raw logit is +-Inf (or
 * NaN) in every row, which the softcap c * tanh(x / c) would turn into a finite +-c.  The
 * non-finite rule of the logits (ops.h, ref_logit) makes it NaN, so every row's argmax is -1
 * and the prefill fails, with 1 and 2 ranks. */
static void test_lm_head_inf(void) {
    const sm_config *c = &g_bf16.m.cfg;
    patch p;
    CHECK(100 < c->vocab_used && c->softcap > 0.0f, "vocab_used %d, softcap %g", c->vocab_used, (double)c->softcap);
    if (patch_apply(&g_bf16, &p, "lm_head.weight", 100LL * c->H + 17, 1, 2, 0x7F80) == 0) {
        expect_found(&g_bf16, 2, "lm_head.weight", 100LL * c->H + 17, "100, 17", "+Inf");
        run_out o;
        for (int w = 1; w <= 2; w++) {
            run_prefill(&g_bf16, w, k_prompt, 8, &o, NULL);
            CHECK(o.first_bad == 0 && o.nbad == 8 && o.st == SM_E_MODEL, "lm_head +Inf, world %d: first bad row %d, %d bad, status %d",
                  w, o.first_bad, o.nbad, o.st);
        }
    }
    patch_undo(&g_bf16, &p);
}

/* -Inf in the f32 router; NaN in the router bias. */
static void test_router(void) {
    const sm_config *c = &g_bf16.m.cfg;
    patch p;
    run_out o;
    if (patch_apply(&g_bf16, &p, P_ "layers.2.mlp.gate.weight", 3LL * c->H + 10, 1, 4, 0xFF800000u) == 0) {
        expect_found(&g_bf16, 2, P_ "layers.2.mlp.gate.weight", 3LL * c->H + 10, "3, 10", "-Inf");
        run_prefill(&g_bf16, 1, k_prompt, 8, &o, NULL);
        printf("  router -Inf: %d of 8 rows non-finite\n", o.nbad);
    }
    patch_undo(&g_bf16, &p);
    if (patch_apply(&g_bf16, &p, P_ "layers.1.mlp.gate.e_score_correction_bias", 5, 1, 4, 0x7FC00000u) == 0) {
        expect_found(&g_bf16, 2, P_ "layers.1.mlp.gate.e_score_correction_bias", 5, "5", "NaN");
        run_prefill(&g_bf16, 1, k_prompt, 8, &o, NULL);
        printf("  router bias NaN: %d of 8 rows non-finite\n", o.nbad);
    }
    patch_undo(&g_bf16, &p);
}

/* One NaN code (0xFF) in gate row 0 of the FP8 expert that row 0 routes to first in layer 1. */
static void test_fp8_nan(void) {
    const sm_config *c = &g_fp8.m.cfg;
    run_out o;
    int e = -1;
    run_prefill(&g_fp8, 1, k_prompt, 8, &o, &e);
    CHECK(e >= 0 && e < c->E, "route of row 0 in layer 1: %d", e);
    if (e < 0 || e >= c->E) return;
    char nm[200];
    snprintf(nm, sizeof nm, P_ "layers.1.mlp.experts.%d.gate_up_proj.weight", e);
    patch p;
    if (patch_apply(&g_fp8, &p, nm, 3, 1, 1, 0xFF) == 0) {
        expect_found(&g_fp8, 2, nm, 3, "0, 3", "NaN");
        run_prefill(&g_fp8, 1, k_prompt, 8, &o, NULL);
        CHECK(o.first_bad == 0, "FP8 NaN in a routed expert: first bad row %d", o.first_bad);
        run_prefill(&g_fp8, 2, k_prompt, 8, &o, NULL);
        CHECK(o.first_bad == 0, "FP8 NaN in a routed expert, world 2: first bad row %d", o.first_bad);
    }
    patch_undo(&g_fp8, &p);
}

/* The embedding row of the first generated token poisoned: the prefill passes and emits it,
 * verify step 1 fails on row 0 (its input) and emits nothing. */
static void test_verify_step(void) {
    const sm_config *c = &g_bf16.m.cfg;
    int prompt[8], t1 = -1;
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    sparkmono_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.max_requests = 1;
    eo.max_len = 64;
    eo.threads = 2;
    int req, n;
    const int *ids;
    /* a prompt whose first generated token is not in it */
    for (int s = 0; s < 20 && t1 < 0; s++) {
        for (int i = 0; i < 8; i++) prompt[i] = 10 + 11 * s + i % 4;
        if (sparkmono_model_open(g_bf16.dir, NULL, &m) || sparkmono_engine_create(m, &eo, &g) ||
            sparkmono_add(g, prompt, 8, 1, &req) || sparkmono_prefill(g, req, NULL) || sparkmono_output(g, req, &ids, &n)) {
            CHECK(0, "clean run: %s", sparkmono_errmsg());
            break;
        }
        int in = 0;
        for (int i = 0; i < 8; i++) in |= prompt[i] == ids[0];
        if (!in) t1 = ids[0];
        sparkmono_engine_destroy(g);
        sparkmono_model_close(m);
        g = NULL;
        m = NULL;
    }
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    g = NULL;
    m = NULL;
    CHECK(t1 >= 0, "no prompt of 20 avoids its first token");
    if (t1 < 0) return;
    patch p;
    if (patch_apply(&g_bf16, &p, P_ "embed_tokens.weight", (int64_t)t1 * c->H, 1, 2, 0x7FC0) == 0) {
        if (!sparkmono_model_open(g_bf16.dir, NULL, &m) && !sparkmono_engine_create(m, &eo, &g) &&
            !sparkmono_add(g, prompt, 8, 6, &req)) {
            sm_status s1 = sparkmono_prefill(g, req, NULL);
            int ntok[1] = {0}, toks[8], nreq;
            sm_status s2 = sparkmono_verify(g, ntok, toks, &nreq);
            char want[128];
            snprintf(want, sizeof want, "verify step 1, request %d, row 0: non-finite logits (", req);
            const char *msg = sparkmono_errmsg();
            CHECK(s1 == SM_OK && s2 == SM_E_MODEL && !strncmp(msg, want, strlen(want)), "prefill %d verify %d: %s", s1, s2, msg);
            CHECK(sparkmono_output(g, req, &ids, &n) == SM_OK && n == 1 && ids[0] == t1 && ntok[0] == 0,
                  "after the failed step: %d ids, first %d (want %d), ntok %d", n, n ? ids[0] : -1, t1, ntok[0]);
        } else {
            CHECK(0, "poisoned run: %s", sparkmono_errmsg());
        }
        sparkmono_engine_destroy(g);
        sparkmono_model_close(m);
    }
    patch_undo(&g_bf16, &p);
}

/* Every floating dtype the scan knows, in a small file of one [2, 3] tensor: the largest finite
 * code passes; each non-finite code at element 4 is found as [1, 1] with its kind. */
static void test_dtypes(void) {
    struct { st_dtype t; int w; uint64_t big, code; const char *kind; } k[] = {
        {ST_BF16, 2, 0xFF7F, 0xFF80, "-Inf"},          {ST_F16, 2, 0x7BFF, 0x7C00, "+Inf"},
        {ST_F16, 2, 0xFBFF, 0xFE01, "NaN"},            {ST_F32, 4, 0x7F7FFFFF, 0x7FFFFFFF, "NaN"},
        {ST_F64, 8, 0x7FEFFFFFFFFFFFFFull, 0xFFF0000000000000ull, "-Inf"},
        {ST_F8_E4M3, 1, 0xFE, 0x7F, "NaN"},            {ST_F8_E5M2, 1, 0x7B, 0x7C, "+Inf"},
        {ST_F8_E5M2, 1, 0xFB, 0xFD, "NaN"},            {ST_F8_E8M0, 1, 0xFE, 0xFF, "NaN"},
    };
    char dir[512], path[600];
    if (tm_mkdtemp(dir, sizeof dir, "sm_finite_dt")) { CHECK(0, "mkdtemp %s", dir); return; }
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        for (int bad = 0; bad < 2; bad++) {
            unsigned char buf[6 * 8];
            for (int j = 0; j < 6; j++) memcpy(buf + j * k[i].w, j == 4 && bad ? &k[i].code : &k[i].big, (size_t)k[i].w);
            st_writer w;
            sm_err e = {""};
            int64_t shape[2] = {2, 3};
            st_archive a;
            memset(&a, 0, sizeof a);
            if (st_writer_open(&w, path, &e) || st_writer_declare(&w, "x", k[i].t, 2, shape, &e) ||
                st_writer_write(&w, buf, (size_t)(6 * k[i].w), &e) || st_writer_finish(&w, &e) || st_open_file(path, &a, &e)) {
                CHECK(0, "%s: %s", st_dtype_name(k[i].t), e.msg);
                continue;
            }
            sm_finite_scan r;
            int rc = sm_check_finite(&a, 2, 0, &r, &e);
            if (!bad) CHECK(rc == 0 && !r.found && r.bytes == 6 * k[i].w, "%s largest finite: %s", st_dtype_name(k[i].t), e.msg);
            else
                CHECK(rc == -1 && r.found && r.index == 4 && !strcmp(r.kind, k[i].kind) && strstr(e.msg, "[1, 1]") &&
                      r.bits == k[i].code, "%s code 0x%llx: rc %d %s", st_dtype_name(k[i].t), (unsigned long long)k[i].code, rc, e.msg);
            st_close(&a);
        }
    tm_rmtree(dir);
}

/* Several bad values: the first in file order is reported, for any thread count, including
 * two in one tensor of several scan chunks (a mini model's 16 MiB consolidated gate_up). */
static void test_first_in_order(void) {
    tmodel t;
    sm_config c;
    sm_err e = {""};
    CHECK(sm_config_preset("mini", &c, &e) == 0, "%s", e.msg);
    if (tmodel_make(&t, "sm_finite_mini", &c, SM_EXP_BF16, 3, 0)) { tmodel_free(&t); return; }
    const char *gu = P_ "layers.2.mlp.experts.gate_up_proj";
    const st_tensor *x = st_find(&t.m.ar, gu);
    CHECK(x && x->nbytes >= (16u << 20), "%s: %zu bytes", gu, x ? x->nbytes : 0);
    /* a tensor after gu in the same file, and one before it */
    const st_tensor *after = NULL, *before = NULL;
    for (int i = 0; x && i < t.m.ar.ntensors; i++) {
        const st_tensor *y = &t.m.ar.tensors[i];
        if (y->file != x->file || y->dtype != ST_BF16) continue;
        if ((const char *)y->data > (const char *)x->data && (!after || y->data < after->data)) after = y;
        if ((const char *)y->data < (const char *)x->data && (!before || y->data > before->data)) before = y;
    }
    CHECK(after && before, "no BF16 tensor before and after %s", gu);
    if (!x || !after || !before) { tmodel_free(&t); return; }
    char an[200], bn[200];
    snprintf(an, sizeof an, "%s", after->name);
    snprintf(bn, sizeof bn, "%s", before->name);
    int64_t cols = x->shape[2], rows = x->shape[1];
    int64_t late = (int64_t)(12u << 20) / 2 + 99, early = (int64_t)(5u << 20) / 2 + 7; /* chunks 3 and 1 of 4 MiB */
    char co[64];
    snprintf(co, sizeof co, "%lld, %lld, %lld", (long long)(early / (rows * cols)), (long long)(early / cols % rows),
             (long long)(early % cols));
    patch p[4];
    memset(p, 0, sizeof p);
    if (!patch_apply(&t, &p[0], an, 0, 1, 2, 0x7FC0) && !patch_apply(&t, &p[1], gu, late, 1, 2, 0xFF80)) {
        for (int th = 1; th <= 8; th++) expect_found(&t, th, gu, late, NULL, "-Inf");
    }
    if (!patch_apply(&t, &p[2], gu, early, 1, 2, 0x7F80)) {
        for (int rep = 0; rep < 3; rep++)
            for (int th = 1; th <= 8; th++) expect_found(&t, th, gu, early, co, "+Inf");
    }
    if (!patch_apply(&t, &p[3], bn, 1, 1, 2, 0x7F81)) {
        for (int th = 1; th <= 8; th *= 2) expect_found(&t, th, bn, 1, NULL, "NaN");
    }
    for (int i = 0; i < 4; i++) free(p[i].old); /* the files go with the directory */
    tmodel_free(&t);
}

int main(void) {
    sm_config c;
    sm_err e = {""};
    if (sm_config_preset("tiny", &c, &e)) { printf("FAIL setup (%s)\nDONE 0 passed, 1 failed\n", e.msg); return 1; }
    if (tmodel_make(&g_bf16, "sm_finite_bf16", &c, SM_EXP_BF16, 11, 0) ||
        tmodel_make(&g_fp8, "sm_finite_fp8", &c, SM_EXP_FP8, 12, 0)) {
        tmodel_free(&g_bf16);
        tmodel_free(&g_fp8);
        printf("FAIL setup\nDONE 0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_clean);
    RUN(test_largest_finite);
    RUN(test_dtypes);
    RUN(test_qproj_nan);
    RUN(test_embed_nan);
    RUN(test_final_norm_inf);
    RUN(test_lm_head_nan);
    RUN(test_lm_head_inf);
    RUN(test_router);
    RUN(test_fp8_nan);
    RUN(test_verify_step);
    RUN(test_first_in_order);
    tmodel_free(&g_bf16);
    tmodel_free(&g_fp8);
    return TEST_DONE();
}
