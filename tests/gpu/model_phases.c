/* model_phases.c: the layer phases of a traced step (sm_cuda_bench_phases, `sparkmono bench
 * --phases`; model.c's group).  On a tiny synthetic MXFP4 model of 6 layers, an 8-row verify
 * step: traced on the stock path, every layer has one non-negative time for each phase the
 * stock layers run (and none for the monokernel's own), and the traced step's logits are the
 * untraced step's bit for bit; the same on the monokernel's path for its layers 1..L-2; the
 * untraced steps after the traces still give the same bits (a trace leaves nothing behind);
 * and with W4A4 on either tensor-core path the monokernel gives the stock path's bits.
 * We rejected checking the times against each other or against floors: they depend on the
 * machine; what a trace must never do is change the numbers or lose a phase.
 */
#include "gpu_tests.h"
#include "harness.h"
#include "model_cases.h"
#include "backend/backend.h"
#include "model/config.h"
#include "backend/kvcache.h"
#include "cuda/rank/synth.h"
#include "cuda/bench/bench.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layer phases the stock layers run, and the monokernel's (by their names: the hook's). */
static const char *const tp_stock[] = {"qkvg", "rope_kv", "attention", "o_proj", "post_attn", "router",
                                       "pooler", "pre_norm", "experts", "unpooler", "post_ffn"};
static const char *const tp_mono[] = {"qkvg", "rope_kv", "o_proj", "post_attn", "pooler",
                                      "pre_norm", "experts", "combine", "unpooler", "post_ffn"};
#define TP_NSTOCK (int)(sizeof tp_stock / sizeof tp_stock[0])
#define TP_NMONO (int)(sizeof tp_mono / sizeof tp_mono[0])

/* The index of phase `name` in p (0: none). */
static int tp_at(const sm_bench_phases *p, const char *name) {
    for (int q = 1; q < p->n; q++)
        if (p->name[q] && !strcmp(p->name[q], name)) return q;
    return 0;
}

/* 1 when the two logits [n] are the same bits. */
static int tp_same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

/* Print a path's median phases over layers 1..L-2 (those it has). */
static void tp_print(const char *path, int L, const sm_bench_phases *p) {
    printf("  %s, median of layers 1..%d:", path, L - 2);
    for (int q = 1; q < p->n; q++)
        if (p->us[q] >= 0) printf(" %s %.1f", p->name[q], p->us[q]);
    printf(" us\n");
}

int tm_phases(void) {
    gh_case_fail = 0;
    enum { NP = 16, NV = 8, L = 6 };
    sm_err e = {{0}};
    sm_config c;
    sm_kv kv;
    memset(&kv, 0, sizeof kv);
    sm_backend b;
    int have_b = 0, slot, tok[NP + NV], pos[NP + NV], req[NP + NV], am[NP + NV], mono = 0;
    float *lg[4] = {NULL, NULL, NULL, NULL}, *lus = malloc(sizeof(float) * L * SM_BENCH_LPHASES);
    sm_bench_phases p;
    unsigned char set[L] = {0, 1, 1, 1, 1, 0};
    if (sm_config_preset("tiny", &c, &e) || sm_config_set_layers(&c, L, &e) || sm_kv_init(&kv, 8, 1, 128, 5, &e) ||
        sm_kv_add(&kv, &slot, &e) || sm_kv_reserve(&kv, slot, 128, &e)) {
        GH_CHECK(0, "setup: %s", e.msg);
        goto out;
    }
    for (int i = 0; i < 4; i++) lg[i] = malloc(sizeof(float) * NV * (size_t)c.V);
    if (!lus || !lg[0] || !lg[1] || !lg[2] || !lg[3]) { GH_CHECK(0, "out of host memory"); goto out; }
    sm_backend_opts bo;
    memset(&bo, 0, sizeof bo);
    bo.world = 1;
    bo.max_rows = 32;
    bo.mono = SM_MONO_AUTO;
    if (sm_cuda_backend_create_synth(&c, SM_EXP_MXFP4, 11, &kv, &bo, &b, &e)) { GH_CHECK(0, "backend: %s", e.msg); goto out; }
    have_b = 1;
    for (int i = 0; i < NP + NV; i++) { tok[i] = (5 * i + 7) % c.V; pos[i] = i; req[i] = slot; }
    sm_step s;
    memset(&s, 0, sizeof s);
    s.nrows = NP; s.tokens = tok; s.pos = pos; s.req = req; s.kv = &kv; s.argmax = am;
    if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "prefill: %s", e.msg); goto out; }
    /* the verify step on the stock path: first run (capture), then a replay: the reference */
    s.nrows = NV; s.tokens = tok + NP; s.pos = pos + NP;
    mono = sm_cuda_bench_set_mono(&b, 1, &e) == 0;
    if (sm_cuda_bench_set_mono(&b, 0, &e)) { GH_CHECK(0, "mono off: %s", e.msg); goto out; }
    s.logits = lg[0];
    if (b.step(b.ctx, &s, &e) || b.step(b.ctx, &s, &e)) { GH_CHECK(0, "verify: %s", e.msg); goto out; }
    /* traced on the stock path: the same bits, every phase of every layer timed */
    s.logits = lg[1];
    if (sm_cuda_bench_phases(&b, &s, 0, set, &p, lus, &e)) { GH_CHECK(0, "stock trace: %s", e.msg); goto out; }
    GH_CHECK(tp_same(lg[0], lg[1], (size_t)NV * c.V), "the traced stock step's logits differ from the untraced step's");
    const int q_comb = tp_at(&p, "combine"), q_xsum = tp_at(&p, "expert_sum"), q_gaps = tp_at(&p, "gaps"),
              q_att = tp_at(&p, "attention"), q_exp = tp_at(&p, "experts");
    int bad = 0, q[TP_NSTOCK > TP_NMONO ? TP_NSTOCK : TP_NMONO];
    for (int i = 0; i < TP_NSTOCK; i++) bad += !(q[i] = tp_at(&p, tp_stock[i]));
    GH_CHECK(!bad && q_comb && q_xsum && q_gaps && q_att && q_exp, "the phase table lacks %d of the stock phases, or combine, "
             "expert_sum, gaps", bad);
    if (gh_case_fail) goto out;
    for (int l = 0; l < L; l++) {
        const float *u = lus + (size_t)l * SM_BENCH_LPHASES;
        for (int i = 0; i < TP_NSTOCK; i++) bad += !(u[q[i]] >= 0);
        bad += u[q_comb] >= 0 || u[q_xsum] >= 0; /* the monokernel's and a world's */
        bad += l > 0 && !(u[q_gaps] >= 0);      /* the cycle from the layer before */
        bad += !(u[q_exp] > 0);
    }
    GH_CHECK(!bad, "stock trace: %d phases missing, negative or foreign over %d layers", bad, L);
    GH_CHECK(p.layers == L - 2, "stock trace: %d layers of the set (expected %d)", p.layers, L - 2);
    for (int i = 0; i < TP_NSTOCK; i++) GH_CHECK(p.us[q[i]] >= 0, "stock median of %s: %.1f", tp_stock[i], p.us[q[i]]);
    GH_CHECK(p.weights[tp_at(&p, "qkvg")] && p.weights[q_exp] && !p.weights[tp_at(&p, "rope_kv")] && !p.weights[q_gaps],
             "the weights of the table");
    tp_print("stock", L, &p);
    /* an untraced step after it: still the same bits (graph replay) */
    s.logits = lg[2];
    if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "verify after the trace: %s", e.msg); goto out; }
    GH_CHECK(tp_same(lg[0], lg[2], (size_t)NV * c.V), "the untraced step after the stock trace differs");
    if (!mono) {
        printf("  (no monokernel on this device: its half skipped)\n");
        goto out;
    }
    /* the monokernel's path: its layers 1..L-2 traced, the stock path's bits */
    if (sm_cuda_bench_set_mono(&b, 1, &e) || b.step(b.ctx, &s, &e)) { GH_CHECK(0, "mono: %s", e.msg); goto out; }
    s.logits = lg[3];
    if (sm_cuda_bench_phases(&b, &s, 1, set, &p, lus, &e)) { GH_CHECK(0, "mono trace: %s", e.msg); goto out; }
    GH_CHECK(tp_same(lg[0], lg[3], (size_t)NV * c.V), "the traced monokernel step's logits differ from the stock step's");
    bad = 0;
    for (int i = 0; i < TP_NMONO; i++) bad += !(q[i] = tp_at(&p, tp_mono[i]));
    for (int l = 0; l < L && !bad; l++) {
        const float *u = lus + (size_t)l * SM_BENCH_LPHASES;
        const int in = l >= 1 && l <= L - 2;
        for (int i = 0; i < TP_NMONO; i++) bad += in ? !(u[q[i]] >= 0) : u[q[i]] >= 0;
        if (in && l >= 2) bad += !(u[q_att] >= 0) + !(u[q_gaps] >= 0); /* the slot after the layer before */
    }
    GH_CHECK(!bad, "mono trace: %d phases missing, negative or outside layers 1..%d", bad, L - 2);
    GH_CHECK(p.layers == L - 2, "mono trace: %d layers of the set (expected %d)", p.layers, L - 2);
    tp_print("mono", L, &p);
    s.logits = lg[2];
    if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "mono verify after the trace: %s", e.msg); goto out; }
    GH_CHECK(tp_same(lg[0], lg[2], (size_t)NV * c.V), "the untraced mono step after the trace differs");
    /* W4A4 on both tensor-core paths (the uploads use one: SM_MOE_W4A4_FP8): the monokernel
     * gives the stock path's bits on each */
    for (int fp8 = 1; fp8 >= 0; fp8--) {
        const char *w = fp8 ? "W4A4 on the FP8 tensor cores" : "W4A4 with bf16 products";
        s.logits = lg[1];
        if (sm_cuda_bench_set_acts(&b, 1, fp8, &e) || sm_cuda_bench_set_mono(&b, 0, &e) || b.step(b.ctx, &s, &e)) {
            GH_CHECK(0, "%s, stock: %s", w, e.msg);
            goto out;
        }
        s.logits = lg[3];
        if (sm_cuda_bench_set_mono(&b, 1, &e) || b.step(b.ctx, &s, &e)) { GH_CHECK(0, "%s, mono: %s", w, e.msg); goto out; }
        GH_CHECK(tp_same(lg[1], lg[3], (size_t)NV * c.V), "%s: the monokernel's logits differ from the stock path's", w);
    }
out:
    if (have_b) b.destroy(b.ctx);
    sm_kv_free(&kv);
    for (int i = 0; i < 4; i++) free(lg[i]);
    free(lus);
    printf("%s model_phases\n", gh_case_fail ? "FAIL" : "PASS");
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}
