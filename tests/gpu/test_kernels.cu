/* test_kernels.cu: the kernel group of the GPU tests.  Every stock-path kernel of
 * src/cuda/ops/ops.h against its CPU op (src/cpu/ops.h) on fresh random inputs (seeded per run
 * from the clock; the seed is printed): here the dense ones (few-row and wgmma matmuls, f32
 * matmuls and their batch invariance, the router matmul, logits + argmax and its non-finite
 * guard), the launchers' preconditions and graph capture, and the entry that runs every case;
 * test_layer_ops.cu holds the per-layer kernels.  Every reference is the kernel's CPU op,
 * called on the same inputs: the tests hold no math of their own.  Each case goes through
 * harness.h: guarded arenas, outputs poisoned with NaN (an unwritten element fails), the
 * relative L2 error against a bound (bf16 outputs 1e-2, f32 logits 1e-3, f32 router logits and
 * residual stream 1e-4) and every element within 5x that bound of its size plus the tensor's
 * RMS.  Invariance checks (a row's bits do not depend on its batch) also require the reference
 * run to have written every element.  We rejected a comparison by max-abs error alone: bf16
 * rounding flips make single elements differ by one ulp while the tensor agrees to 1e-3.
 */
#include "model/rng.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <cuda_runtime.h>
extern "C" {
#include "base/err.h"
#include "model/config.h"
#include "model/weights.h"
#include "backend/kvcache.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
}
#include "model/codec.h"
#include "cuda/ops/ops.h"
#include "gpu_tests.h"
#include "harness.h"
#include "kernel_cases.h"

/* ------------------------------------------------------------------ state (kernel_cases.h) */

sm_pool *g_pool;
sm_kernel_ctx g_ctx;
cudaStream_t g_st;

/* ------------------------------------------------------------------ matmul */

/* Paths of the few-row matmul and the logits checked by the cases below. */
#define P_AUTO (1 << SM_PATH_AUTO)
#define P_SYNC (1 << SM_PATH_SYNC)
#define P_WG1 (1 << SM_PATH_WG1)
#define P_WG2 (1 << SM_PATH_WG2)
#define P_ALL (P_SYNC | P_WG1 | P_WG2)
static const char *path_name(int p) { return p == SM_PATH_SYNC ? "sync" : p == SM_PATH_WG1 ? "wg128" : p == SM_PATH_WG2 ? "wg256" : "auto"; }

static void case_mm(int which, int n, int k, int m) {
    /* which: 0 sm_k_mm (dispatch), 1 small, 2 cuBLAS */
    static const char *wn[3] = {"mm", "mm_small", "mm_blas"};
    char name[128];
    snprintf(name, sizeof name, "%s n=%d k=%d m=%d", wn[which], n, k, m);
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * k * 2), *hw = (uint16_t *)gh_halloc((size_t)m * k * 2);
    gh_fill_bf16(hx, (size_t)n * k, 1.0f);
    gh_fill_bf16(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    float *xf = (float *)gh_halloc((size_t)n * k * 4), *ref = (float *)gh_halloc((size_t)n * m * 4);
    gh_bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm(g_pool, xf, n, k, hw, m, ref);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)n * k);
    uint16_t *dw = (uint16_t *)gh_dup_to_dev("W", hw, 2, (size_t)m * k);
    uint16_t *dy = (uint16_t *)gh_dalloc("y", 2, (size_t)n * m);
    int rc = which == 0 ? sm_k_mm(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)
           : which == 1 ? sm_k_mm_small(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)
                        : sm_k_mm_blas(&g_ctx, dx, n, k, dw, m, dy, g_st, &e);
    if (rc) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc a = GH_ACC_INIT;
    gh_cmp_bf16(dy, ref, (size_t)n * m, &a);
    gh_verdict(name, 1, &a, 1e-2);
}

/* The few-row paths (mask of P_*) on one input and one reference; each path writes a fresh
 * poisoned output, and runs twice: the second result must equal the first bit for bit (the
 * wgmma kernel's shared tiles are summed in a fixed order, its counters reset themselves). */
static void case_mm_paths(int paths, int n, int k, int m) {
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * k * 2), *hw = (uint16_t *)gh_halloc((size_t)m * k * 2);
    gh_fill_bf16(hx, (size_t)n * k, 1.0f);
    gh_fill_bf16(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    float *xf = (float *)gh_halloc((size_t)n * k * 4), *ref = (float *)gh_halloc((size_t)n * m * 4);
    gh_bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm(g_pool, xf, n, k, hw, m, ref);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)n * k);
    uint16_t *dw = (uint16_t *)gh_dup_to_dev("W", hw, 2, (size_t)m * k);
    uint16_t *h1 = (uint16_t *)gh_halloc((size_t)n * m * 2), *h2 = (uint16_t *)gh_halloc((size_t)n * m * 2);
    for (int p = SM_PATH_SYNC; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[128];
        snprintf(name, sizeof name, "mm_%s n=%d k=%d m=%d", path_name(p), n, k, m);
        uint16_t *dy = (uint16_t *)gh_dalloc("y", 2, (size_t)n * m);
        int ok = 1;
        if (sm_k_mm_path(&g_ctx, p, dx, n, k, dw, m, dy, g_st, &e)) { printf("  %s\n", e.msg); ok = 0; }
        if (ok && !gh_sync(g_st)) ok = 0;
        if (ok) {
            gh_to_host(h1, dy, (size_t)n * m * 2);
            cudaMemset(dy, 0xFF, (size_t)n * m * 2);
            if (sm_k_mm_path(&g_ctx, p, dx, n, k, dw, m, dy, g_st, &e)) { printf("  %s\n", e.msg); ok = 0; }
            if (ok && !gh_sync(g_st)) ok = 0;
            if (ok) {
                gh_to_host(h2, dy, (size_t)n * m * 2);
                if (memcmp(h1, h2, (size_t)n * m * 2)) { printf("  second run differs from the first\n"); ok = 0; }
            }
        }
        gh_acc a = GH_ACC_INIT;
        if (ok) gh_cmp_bf16(dy, ref, (size_t)n * m, &a);
        else a.nan = 1;
        gh_verdict_keep(name, ok, &a, 1e-2);
    }
    gh_case_end();
}

/* sm_k_mm_f32 (paths: mask of P_AUTO, P_SYNC, P_WG1) against ref_mm_partial: W is the column
 * slice [c0, c0 + k) of a host matrix [m, kfull] (kfull == k: the whole matrix; else a rank's
 * o_proj columns, read by the reference through the strided view, packed contiguous for the
 * device).  Each path runs twice (same bits), and at n <= 128 r16 of its f32 output must equal
 * sm_k_mm_path's bf16 output of the same path bit for bit (the same work split). */
static void case_mm_f32(int paths, int n, int k, int m, int kfull) {
    sm_err e = {""};
    const int c0 = kfull - k;
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * k * 2), *hwf = (uint16_t *)gh_halloc((size_t)m * kfull * 2);
    uint16_t *hw = (uint16_t *)gh_halloc((size_t)m * k * 2);
    gh_fill_bf16(hx, (size_t)n * k, 1.0f);
    gh_fill_bf16(hwf, (size_t)m * kfull, 1.0f / sqrtf((float)kfull));
    for (int r = 0; r < m; r++) memcpy(hw + (size_t)r * k, hwf + (size_t)r * kfull + c0, (size_t)k * 2);
    float *xf = (float *)gh_halloc((size_t)n * k * 4), *ref = (float *)gh_halloc((size_t)n * m * 4);
    gh_bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm_partial(g_pool, xf, n, k, hwf + c0, kfull, m, ref);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)n * k);
    uint16_t *dw = (uint16_t *)gh_dup_to_dev("W", hw, 2, (size_t)m * k);
    float *h1 = (float *)gh_halloc((size_t)n * m * 4), *h2 = (float *)gh_halloc((size_t)n * m * 4);
    uint16_t *hb = (uint16_t *)gh_halloc((size_t)n * m * 2);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG1; p++) {
        if (!(paths & (1 << p)) || (n > SM_MM_SMALL_MAX && p != SM_PATH_AUTO)) continue;
        char name[160];
        snprintf(name, sizeof name, "mm_f32_%s n=%d k=%d m=%d%s", path_name(p), n, k, m, kfull > k ? " (column slice)" : "");
        float *dy = (float *)gh_dalloc("y32", 4, (size_t)n * m);
        int ok = 1;
        for (int run = 0; run < 2 && ok; run++) {
            if (run) cudaMemset(dy, 0xFF, (size_t)n * m * 4);
            int rc = n > SM_MM_SMALL_MAX ? sm_k_mm_f32(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)
                                         : sm_k_mm_f32_path(&g_ctx, p, dx, n, k, dw, m, dy, g_st, &e);
            if (rc) { printf("  %s\n", e.msg); ok = 0; }
            if (ok && !gh_sync(g_st)) ok = 0;
            if (ok) gh_to_host(run ? h2 : h1, dy, (size_t)n * m * 4);
        }
        if (ok && memcmp(h1, h2, (size_t)n * m * 4)) { printf("  second run differs from the first\n"); ok = 0; }
        if (ok && n <= SM_MM_SMALL_MAX) {
            /* the bf16 matmul of the same path rounds exactly these sums */
            uint16_t *dyb = (uint16_t *)gh_dalloc("y", 2, (size_t)n * m);
            if (sm_k_mm_path(&g_ctx, p, dx, n, k, dw, m, dyb, g_st, &e)) { printf("  %s\n", e.msg); ok = 0; }
            if (ok && !gh_sync(g_st)) ok = 0;
            if (ok) {
                gh_to_host(hb, dyb, (size_t)n * m * 2);
                long bad = 0;
                for (size_t i = 0; i < (size_t)n * m; i++) bad += sm_f32_to_bf16(h1[i]) != hb[i];
                if (bad) { printf("  %ld outputs: r16(f32 output) differs from sm_k_mm's bf16 output\n", bad); ok = 0; }
            }
        }
        gh_acc a = GH_ACC_INIT;
        if (ok) gh_acc_add(&a, h1, ref, (size_t)n * m);
        else a.nan = 1;
        gh_verdict_keep(name, ok, &a, 1e-4);
    }
    gh_case_end();
}

/* Batch invariance of sm_k_mm_f32 (the auto path): the rows of a 128-row input run as n = 1,
 * 8, 37 and 128 rows give every row the same f32 bits (speculative verify == greedy). */
static void case_mm_f32_invariance(int k, int m) {
    char name[128];
    snprintf(name, sizeof name, "mm_f32 batch invariance k=%d m=%d (n = 1, 8, 37 vs 128)", k, m);
    if (!g_ctx.tma_encode) { gh_skip_line("%s: no wgmma path on this device", name); return; }
    sm_err e = {""};
    const int N = 128, ns[3] = {1, 8, 37};
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)N * k * 2), *hw = (uint16_t *)gh_halloc((size_t)m * k * 2);
    gh_fill_bf16(hx, (size_t)N * k, 1.0f);
    gh_fill_bf16(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)N * k);
    uint16_t *dw = (uint16_t *)gh_dup_to_dev("W", hw, 2, (size_t)m * k);
    float *dy = (float *)gh_dalloc("y32", 4, (size_t)N * m);
    float *all = (float *)gh_halloc((size_t)N * m * 4), *part = (float *)gh_halloc((size_t)N * m * 4);
    int ok = sm_k_mm_f32(&g_ctx, dx, N, k, dw, m, dy, g_st, &e) == 0 && gh_sync(g_st);
    if (ok) gh_to_host(all, dy, (size_t)N * m * 4);
    /* the reference run wrote every output (else poisoned rows would compare equal) */
    const size_t unw = ok ? gh_unwritten(dy, (size_t)N * m) : 0;
    if (unw) { printf("  n=128: %zu of %d outputs never written\n", unw, N * m); ok = 0; }
    for (int i = 0; i < 3 && ok; i++) {
        cudaMemset(dy, 0xFF, (size_t)N * m * 4);
        if (sm_k_mm_f32(&g_ctx, dx, ns[i], k, dw, m, dy, g_st, &e) || !gh_sync(g_st)) { ok = 0; break; }
        gh_to_host(part, dy, (size_t)ns[i] * m * 4);
        if (memcmp(part, all, (size_t)ns[i] * m * 4)) { printf("  n=%d: rows differ from the n=128 run\n", ns[i]); ok = 0; }
    }
    if (e.msg[0]) printf("  %s\n", e.msg);
    gh_acc a = GH_ACC_INIT;
    gh_verdict(name, ok, &a, 1.0);
}

static void case_mm_f32w(int n, int k, int m) {
    char name[128];
    snprintf(name, sizeof name, "mm_f32w n=%d k=%d m=%d", n, k, m);
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * k * 2);
    float *hw = (float *)gh_halloc((size_t)m * k * 4);
    gh_fill_bf16(hx, (size_t)n * k, 1.0f);
    gh_fill_f32(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    float *xf = (float *)gh_halloc((size_t)n * k * 4), *ref = (float *)gh_halloc((size_t)n * m * 4);
    gh_bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm_f32(g_pool, xf, n, k, hw, m, ref);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)n * k);
    float *dw = (float *)gh_dup_to_dev("W", hw, 4, (size_t)m * k);
    float *dy = (float *)gh_dalloc("y", 4, (size_t)n * m);
    if (sm_k_mm_f32w(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc a = GH_ACC_INIT;
    gh_cmp_f32(dy, ref, (size_t)n * m, &a);
    gh_verdict(name, 1, &a, 1e-4);
}

/* ------------------------------------------------------------------ logits */

static void case_logits(int paths, int n, int H, int V, int vu, int want_logits) {
    sm_err e = {""};
    sm_model m;
    memset(&m, 0, sizeof m);
    m.cfg.H = H; m.cfg.V = V; m.cfg.vocab_used = vu;
    m.cfg.out_mult = 0.17677669529663687f;
    m.cfg.softcap = 20.0f;
    m.cfg.rms_eps = 1e-5f;
    uint16_t *hw = (uint16_t *)gh_halloc((size_t)V * H * 2), *hh = (uint16_t *)gh_halloc((size_t)n * H * 2);
    gh_fill_bf16(hw, (size_t)V * H, 0.3f);
    gh_fill_bf16(hh, (size_t)n * H, 1.0f);
    m.lm_head = hw;
    float *h = (float *)gh_halloc((size_t)n * H * 4), *ref = (float *)gh_halloc((size_t)n * V * 4);
    int *ram = (int *)gh_halloc((size_t)n * 4);
    gh_bf16_to_f32(hh, h, (size_t)n * H);
    ref_logits_h(g_pool, &m, h, n, ref, ram);
    uint16_t *dw = (uint16_t *)gh_dup_to_dev("lm_head", hw, 2, (size_t)V * H), *dh = (uint16_t *)gh_dup_to_dev("h", hh, 2, (size_t)n * H);
    int *gam = (int *)gh_halloc((size_t)n * 4);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[160];
        snprintf(name, sizeof name, "logits_%s n=%d H=%d V=%d vocab_used=%d%s", path_name(p), n, H, V, vu,
                 want_logits ? "" : " (argmax only)");
        float *dl = want_logits ? (float *)gh_dalloc("logits", 4, (size_t)n * V) : NULL;
        int *dam = (int *)gh_dalloc("argmax", 4, n);
        if (sm_k_logits_path(&g_ctx, p, dh, n, H, dw, V, vu, m.cfg.out_mult, m.cfg.softcap, dl, dam, g_st, &e)) {
            printf("  %s\n", e.msg);
            gh_acc bad = {0, 0, 1, 0, 0, 0, 0};
            gh_verdict_keep(name, 0, &bad, 1e-3);
            continue;
        }
        if (!gh_sync(g_st)) {
            gh_acc bad = {0, 0, 1, 0, 0, 0, 0};
            gh_verdict_keep(name, 0, &bad, 1e-3);
            continue;
        }
        gh_to_host(gam, dam, (size_t)n * 4);
        int ok = 1, bad = 0, skipped = 0;
        for (int i = 0; i < n; i++) {
            const float *li = ref + (size_t)i * V;
            float b1 = li[ram[i]], b2 = -INFINITY;
            for (int v = 0; v < vu; v++) if (v != ram[i] && li[v] > b2) b2 = li[v];
            if (b1 - b2 < 1e-4f * fabsf(b1) + 1e-6f) { skipped++; continue; }
            if (gam[i] != ram[i]) {
                if (bad < 3) printf("  row %d: argmax %d, reference %d\n", i, gam[i], ram[i]);
                bad++;
            }
        }
        if (bad) { printf("  %d argmax ids differ\n", bad); ok = 0; }
        if (skipped) printf("  %d rows skipped as near-ties\n", skipped);
        gh_acc a = GH_ACC_INIT;
        if (want_logits) gh_cmp_f32(dl, ref, (size_t)n * V, &a);
        gh_verdict_keep(name, ok, &a, 1e-3);
    }
    gh_case_end();
}

/* The non-finite guard of the argmax (cuda/ops/ops.h, sm_k_logits): a row whose logits among ids <
 * vocab_used hold NaN or +-Inf gets argmax -1, every other row keeps the argmax of the clean
 * run with the same path (bit for bit: a row's logits do not depend on the other rows).  Per
 * path: A) one NaN in h row ra (softcap on): ra -> -1; B) NaN in row ra and +Inf in row rb,
 * softcap off and on: both -1 (an infinite raw logit is NaN, never capped to +-20); C) NaN in lm_head row vb < vocab_used: every
 * row -1; D) NaN in a masked lm_head row vm >= vocab_used: every row as clean. */
#define LG_NAN_BF16 0x7FC0
#define LG_INF_BF16 0x7F80
static int lg_run(int p, const uint16_t *dh, int n, int H, const uint16_t *dw, int V, int vu, float cap, int *dam, int *out,
                  sm_err *e) {
    if (sm_k_logits_path(&g_ctx, p, dh, n, H, dw, V, vu, 0.17677669529663687f, cap, NULL, dam, g_st, e)) {
        printf("  %s\n", e->msg);
        return -1;
    }
    if (!gh_sync(g_st)) return -1;
    gh_to_host(out, dam, (size_t)n * 4);
    return 0;
}
/* Rows of got equal to want, except rows bad0 / bad1 (-1: none) which must be -1; all != 0:
 * every row must be -1.  Prints the first mismatches under `what`. */
static int lg_expect(const char *what, const int *got, const int *want, int n, int bad0, int bad1, int all) {
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        const int exp = (all || i == bad0 || i == bad1) ? -1 : want[i];
        if (got[i] != exp) {
            if (wrong < 3) printf("  %s: row %d argmax %d, expected %d\n", what, i, got[i], exp);
            wrong++;
        }
    }
    return wrong == 0;
}
static void case_logits_nonfinite(int paths, int n, int H, int V, int vu) {
    sm_err e = {""};
    uint16_t *hw = (uint16_t *)gh_halloc((size_t)V * H * 2), *hh = (uint16_t *)gh_halloc((size_t)n * H * 2);
    gh_fill_bf16(hw, (size_t)V * H, 0.3f);
    gh_fill_bf16(hh, (size_t)n * H, 1.0f);
    const int ra = gh_rndi(n), rb = n > 1 ? (ra + 1 + gh_rndi(n - 1)) % n : -1;
    const int vb = gh_rndi(vu), vm = vu < V ? vu + gh_rndi(V - vu) : -1;
    uint16_t *dh = (uint16_t *)gh_dup_to_dev("h", hh, 2, (size_t)n * H), *dw = (uint16_t *)gh_dup_to_dev("lm_head", hw, 2, (size_t)V * H);
    /* h with one NaN in row ra (A); then also +Inf in row rb (B) */
    hh[(size_t)ra * H + gh_rndi(H)] = LG_NAN_BF16;
    uint16_t *dha = (uint16_t *)gh_dup_to_dev("h NaN", hh, 2, (size_t)n * H);
    if (rb >= 0) hh[(size_t)rb * H + gh_rndi(H)] = LG_INF_BF16;
    uint16_t *dhb = (uint16_t *)gh_dup_to_dev("h NaN Inf", hh, 2, (size_t)n * H);
    /* lm_head with one NaN in row vb (C), another copy with one in the masked row vm (D) */
    const size_t jb = (size_t)vb * H + gh_rndi(H);
    const uint16_t keep = hw[jb];
    hw[jb] = LG_NAN_BF16;
    uint16_t *dwc = (uint16_t *)gh_dup_to_dev("lm_head NaN", hw, 2, (size_t)V * H);
    hw[jb] = keep;
    uint16_t *dwd = NULL;
    if (vm >= 0) {
        hw[(size_t)vm * H + gh_rndi(H)] = LG_NAN_BF16;
        dwd = (uint16_t *)gh_dup_to_dev("lm_head NaN masked", hw, 2, (size_t)V * H);
    }
    int *dam = (int *)gh_dalloc("argmax", 4, n);
    int *capped = (int *)gh_halloc((size_t)n * 4), *plain = (int *)gh_halloc((size_t)n * 4), *got = (int *)gh_halloc((size_t)n * 4);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[160];
        snprintf(name, sizeof name, "logits_nonfinite_%s n=%d H=%d V=%d vocab_used=%d (NaN row %d, Inf row %d, NaN ids %d, %d)",
                 path_name(p), n, H, V, vu, ra, rb, vb, vm);
        int ok = lg_run(p, dh, n, H, dw, V, vu, 20.0f, dam, capped, &e) == 0 && lg_run(p, dh, n, H, dw, V, vu, 0.0f, dam, plain, &e) == 0;
        for (int i = 0; ok && i < n; i++)
            if (capped[i] < 0 || plain[i] < 0) { printf("  clean row %d has argmax -1\n", i); ok = 0; }
        if (ok) ok = lg_run(p, dha, n, H, dw, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN in h", got, capped, n, ra, -1, 0);
        if (ok) ok = lg_run(p, dhb, n, H, dw, V, vu, 0.0f, dam, got, &e) == 0 && lg_expect("NaN, Inf in h, no softcap", got, plain, n, ra, rb, 0);
        if (ok) ok = lg_run(p, dhb, n, H, dw, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN, Inf in h, softcap on", got, capped, n, ra, rb, 0);
        if (ok) ok = lg_run(p, dh, n, H, dwc, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN in lm_head", got, capped, n, -1, -1, 1);
        if (ok && dwd) ok = lg_run(p, dh, n, H, dwd, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN in a masked lm_head row", got, capped, n, -1, -1, 0);
        gh_acc a = GH_ACC_INIT;
        gh_verdict_keep(name, ok, &a, 1e-3);
    }
    gh_case_end();
}

/* ------------------------------------------------------------------ preconditions */

static void case_preconditions(void) {
    sm_err e = {""};
    int ok = 1;
    const uint16_t *p = (const uint16_t *)(uintptr_t)256; /* never dereferenced: host checks fail first */
    uint16_t *y = (uint16_t *)(uintptr_t)256;
    if (sm_k_mm(&g_ctx, p, 4, 33, p, 16, y, g_st, &e) == 0 || !strstr(e.msg, "k=33")) { printf("  mm k=33: '%s'\n", e.msg); ok = 0; }
    if (sm_k_mm_small(&g_ctx, p, 129, 64, p, 16, y, g_st, &e) == 0 || !strstr(e.msg, "n=129")) { printf("  mm_small n=129: '%s'\n", e.msg); ok = 0; }
    if (sm_k_mm_f32(&g_ctx, p, 4, 33, p, 16, (float *)y, g_st, &e) == 0 || !strstr(e.msg, "k=33")) { printf("  mm_f32 k=33: '%s'\n", e.msg); ok = 0; }
    if (sm_k_mm_f32_path(&g_ctx, SM_PATH_WG2, p, 4, 64, p, 16, (float *)y, g_st, &e) == 0 || !strstr(e.msg, "path 3")) {
        printf("  mm_f32 path wg256: '%s'\n", e.msg);
        ok = 0;
    }
    if (sm_k_attention(&g_ctx, p, 384, p, 384, p, (const int *)p, 4, (const int *)p, (const int *)p, 1, 6, 4, 0, 1.0f,
                       1e-5f, 0, y, g_st, &e) == 0 || !strstr(e.msg, "nh=6")) { printf("  attention nh=6 nkv=4: '%s'\n", e.msg); ok = 0; }
    if (sm_k_logits(&g_ctx, p, 1, 64, p, 100, 101, 1.0f, 20.0f, NULL, (int *)y, g_st, &e) == 0 || !strstr(e.msg, "vocab_used=101")) {
        printf("  logits vocab_used > V: '%s'\n", e.msg);
        ok = 0;
    }
    if (sm_k_route(&g_ctx, p, 1, 64, (const float *)p, (const float *)p, 2048, 8, 1.0f, 1.0f, (float *)y, (int *)y,
                   (float *)y, g_st, &e) == 0 || !strstr(e.msg, "E=2048")) { printf("  route E=2048: '%s'\n", e.msg); ok = 0; }
    gh_result(ok, "preconditions");
}

/* ------------------------------------------------------------------ graph capture */

/* Run the launchers that use the workspace, cuBLAS and dynamic shared memory once eagerly and
 * once captured in a CUDA graph (replayed twice): the graph must capture without error and
 * reproduce the eager results bit for bit (cuBLAS: to 1e-6). */
typedef struct graph_io {
    uint16_t *x, *W, *y, *x2, *W2, *y2, *y3, *xf, *h, *lm, *att_q, *att_kv, *att_out;
    float *router, *bias, *rlog, *rw, *logits, *logits3;
    int *idx, *am, *am3, *tab, *req, *pos;
    int max_bpr, nh, nkv, ld, max_ctx;
} graph_io;

static int graph_ops(const graph_io *g, sm_err *e) {
    const uint16_t *gate = g->att_q + (g->nh + 2 * g->nkv) * 64;
    if (sm_k_mm(&g_ctx, g->x, 8, 8192, g->W, 1024, g->y, g_st, e)) return -1;
    if (sm_k_mm_blas(&g_ctx, g->x2, 8, 1024, g->W2, 1000, g->y2, g_st, e)) return -1;
    if (sm_k_route(&g_ctx, g->xf, 8, 8192, g->router, g->bias, 256, 8, 0.17677669529663687f, 1.0f, g->rlog, g->idx,
                   g->rw, g_st, e)) return -1;
    if (sm_k_attention(&g_ctx, g->att_q, g->ld, gate, g->ld, g->att_kv, g->tab, g->max_bpr, g->req, g->pos, 1, g->nh,
                       g->nkv, 0, 0.684f, 1e-5f, g->max_ctx, g->att_out, g_st, e)) return -1;
    if (sm_k_logits(&g_ctx, g->h, 8, 256, g->lm, 1000, 990, 0.17677669529663687f, 20.0f, g->logits, g->am, g_st, e)) return -1;
    /* the wgmma kernel: shared tiles (stream-K), tile counters, logits epilogue */
    if (sm_k_mm_path(&g_ctx, SM_PATH_WG2, g->x, 64, 1024, g->W, 1024, g->y3, g_st, e)) return -1;
    if (sm_k_logits_path(&g_ctx, SM_PATH_WG2, g->x, 64, 256, g->lm, 1000, 990, 0.17677669529663687f, 20.0f, g->logits3,
                         g->am3, g_st, e)) return -1;
    return 0;
}

typedef struct graph_out { void *d; size_t bytes; int exact; const char *what; void *h; } graph_out;

static void case_graph(void) {
    const char *name = "graph_capture mm(split) mm_blas route attention(split-K) logits mm(wgmma) logits(wgmma)";
    sm_err e = {""};
    graph_io g;
    memset(&g, 0, sizeof g);
    uint16_t *hb;
    float *hf;
#define GRAPH_BF16(field, cnt, sd) hb = (uint16_t *)gh_halloc((size_t)(cnt) * 2); gh_fill_bf16(hb, (cnt), (sd)); g.field = (uint16_t *)gh_dup_to_dev(#field, hb, 2, (cnt))
#define GRAPH_F32(field, cnt, sd) hf = (float *)gh_halloc((size_t)(cnt) * 4); gh_fill_f32(hf, (cnt), (sd)); g.field = (float *)gh_dup_to_dev(#field, hf, 4, (cnt))
    GRAPH_BF16(x, 8 * 8192, 1.0f);
    GRAPH_BF16(W, 1024 * 8192, 0.011f);
    GRAPH_BF16(x2, 8 * 1024, 1.0f);
    GRAPH_BF16(W2, 1000 * 1024, 0.03f);
    GRAPH_BF16(xf, 8 * 8192, 1.0f);
    GRAPH_F32(router, 256 * 8192, 0.011f);
    GRAPH_F32(bias, 256, 0.01f);
    GRAPH_BF16(h, 8 * 256, 1.0f);
    GRAPH_BF16(lm, 1000 * 256, 0.3f);
#undef GRAPH_BF16
#undef GRAPH_F32
    att_setup s;
    const int R1[] = {1}, P1[] = {9000};
    g.nh = 128; g.nkv = 16; g.ld = (2 * g.nh + 2 * g.nkv) * 64;
    att_make(&s, g.nkv, 1, R1, P1);
    g.max_bpr = s.max_bpr; g.max_ctx = s.max_ctx;
    hb = (uint16_t *)gh_halloc((size_t)g.ld * 2);
    gh_fill_bf16(hb, g.ld, 1.0f);
    g.att_q = (uint16_t *)gh_dup_to_dev("att_q", hb, 2, g.ld);
    g.att_kv = (uint16_t *)gh_dup_to_dev("att_kv", s.kv, 2, (size_t)s.nblocks * g.nkv * 16 * 128);
    g.tab = (int *)gh_dup_to_dev("tables", s.tables, 4, s.max_bpr);
    g.req = (int *)gh_dup_to_dev("row_req", s.row_req, 4, 1);
    g.pos = (int *)gh_dup_to_dev("pos", s.pos, 4, 1);
    g.y = (uint16_t *)gh_dalloc("y", 2, 8 * 1024);
    g.y2 = (uint16_t *)gh_dalloc("y2", 2, 8 * 1000);
    g.rlog = (float *)gh_dalloc("rlog", 4, 8 * 256);
    g.idx = (int *)gh_dalloc("idx", 4, 8 * 8);
    g.rw = (float *)gh_dalloc("rw", 4, 8 * 8);
    g.att_out = (uint16_t *)gh_dalloc("att_out", 2, 128 * 64);
    g.logits = (float *)gh_dalloc("logits", 4, 8 * 1000);
    g.am = (int *)gh_dalloc("argmax", 4, 8);
    g.y3 = (uint16_t *)gh_dalloc("y3", 2, 64 * 1024);
    g.logits3 = (float *)gh_dalloc("logits3", 4, 64 * 1000);
    g.am3 = (int *)gh_dalloc("argmax3", 4, 64);
    graph_out outs[] = {
        {g.y, 8 * 1024 * 2, 1, "mm", NULL}, {g.y2, 8 * 1000 * 2, 0, "mm_blas", NULL},
        {g.rlog, 8 * 256 * 4, 1, "router logits", NULL}, {g.idx, 8 * 8 * 4, 1, "route ids", NULL},
        {g.rw, 8 * 8 * 4, 1, "route weights", NULL}, {g.att_out, 128 * 64 * 2, 1, "attention", NULL},
        {g.logits, 8 * 1000 * 4, 1, "logits", NULL}, {g.am, 8 * 4, 1, "argmax", NULL},
        {g.y3, 64 * 1024 * 2, 1, "mm wgmma", NULL}, {g.logits3, 64 * 1000 * 4, 1, "logits wgmma", NULL},
        {g.am3, 64 * 4, 1, "argmax wgmma", NULL},
    };
    const int nout = (int)(sizeof outs / sizeof outs[0]);
    /* eager */
    if (graph_ops(&g, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "eager run failed"); return; }
    for (int i = 0; i < nout; i++) {
        outs[i].h = gh_halloc(outs[i].bytes);
        gh_to_host(outs[i].h, outs[i].d, outs[i].bytes);
        cudaMemset(outs[i].d, 0xFF, outs[i].bytes); /* poison before the replays */
    }
    /* captured */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t r = cudaStreamBeginCapture(g_st, cudaStreamCaptureModeGlobal);
    if (r != cudaSuccess) { gh_fail_line(name, cudaGetErrorString(r)); return; }
    int rc = graph_ops(&g, &e);
    r = cudaStreamEndCapture(g_st, &graph);
    if (rc || r != cudaSuccess || !graph) {
        char why[1200];
        snprintf(why, sizeof why, "capture failed: %s / %s", rc ? e.msg : "launchers ok", cudaGetErrorString(r));
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        gh_fail_line(name, why);
        return;
    }
    r = cudaGraphInstantiate(&exec, graph, 0);
    if (r == cudaSuccess) r = cudaGraphLaunch(exec, g_st);
    if (r == cudaSuccess) r = cudaGraphLaunch(exec, g_st);
    if (r != cudaSuccess) {
        if (exec) cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        gh_fail_line(name, cudaGetErrorString(r));
        return;
    }
    int ok = gh_sync(g_st);
    for (int i = 0; ok && i < nout; i++) {
        void *h2 = gh_halloc(outs[i].bytes);
        gh_to_host(h2, outs[i].d, outs[i].bytes);
        if (outs[i].exact) {
            if (memcmp(h2, outs[i].h, outs[i].bytes)) { printf("  %s: graph replay differs from the eager run\n", outs[i].what); ok = 0; }
        } else {
            size_t cnt = outs[i].bytes / 2;
            float *f1 = (float *)gh_halloc(cnt * 4), *f2 = (float *)gh_halloc(cnt * 4);
            gh_bf16_to_f32((const uint16_t *)outs[i].h, f1, cnt);
            gh_bf16_to_f32((const uint16_t *)h2, f2, cnt);
            gh_acc a = GH_ACC_INIT;
            gh_acc_add(&a, f2, f1, cnt);
            if (a.nan || gh_acc_rel(&a) > 1e-6) { printf("  %s: graph replay rel %.3e from the eager run\n", outs[i].what, gh_acc_rel(&a)); ok = 0; }
        }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    gh_acc none = GH_ACC_INIT;
    gh_verdict(name, ok, &none, 1.0);
}

/* ------------------------------------------------------------------ timing (information only) */

static void info_mm_bandwidth(int n, int k, int m) {
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * k * 2);
    gh_fill_bf16(hx, (size_t)n * k, 1.0f);
    /* rotate 4 weight copies so the timing is not an L2 measurement */
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)n * k), *dw[4];
    for (int i = 0; i < 4; i++) {
        dw[i] = (uint16_t *)gh_dalloc("W", 2, (size_t)m * k);
        cudaMemset(dw[i], 0x3C, (size_t)m * k * 2); /* bf16 0x3C3C: finite, non-zero */
    }
    uint16_t *dy = (uint16_t *)gh_dalloc("y", 2, (size_t)n * m);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float t[21] = {0};
    for (int r = -3; r < 21; r++) {
        cudaEventRecord(a, g_st);
        if (sm_k_mm(&g_ctx, dx, n, k, dw[(r + 4) % 4], m, dy, g_st, &e)) { printf("  %s\n", e.msg); break; }
        cudaEventRecord(b, g_st);
        cudaEventSynchronize(b);
        if (r >= 0) cudaEventElapsedTime(&t[r], a, b);
    }
    for (int i = 0; i < 21; i++)
        for (int j = i + 1; j < 21; j++) if (t[j] < t[i]) { float x = t[i]; t[i] = t[j]; t[j] = x; }
    double bytes = (double)m * k * 2;
    printf("INFO mm n=%d k=%d m=%d: median %.1f us, %.0f GB/s of weights\n", n, k, m, t[10] * 1e3, bytes / (t[10] * 1e-3) / 1e9);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    gh_case_end();
}

/* ------------------------------------------------------------------ entry */

int gpu_test_kernels(void) {
    sm_err e = {""};
    gh_reset();
    gh_seed("gpu_test_kernels");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) { printf("FAIL kernels: no CUDA device\n"); return 1; }
    if (sm_kernel_ctx_init(&g_ctx, 0, 0, &e)) { printf("FAIL kernels: %s\n", e.msg); return 1; }
    if (cudaStreamCreate(&g_st) != cudaSuccess) { printf("FAIL kernels: stream\n"); return 1; }
    if (sm_pool_create(0, &g_pool, &e)) { printf("FAIL kernels: %s\n", e.msg); return 1; }
    fflush(stdout);

    case_preconditions();

    static const int ns[] = {1, 8, 13, 64, 128};
    const int nn = 5;
    /* matmul: small and real widths, the dispatcher for a prefill size, cuBLAS directly */
    static const int km[][2] = {{256, 72}, {1024, 1000}, {8192, 1024}, {1024, 8192}, {8192, 8192}};
    for (int s = 0; s < 5; s++)
        for (int i = 0; i < nn; i++) case_mm_paths(P_ALL, ns[i], km[s][0], km[s][1]);
    /* the wgmma kernel's edges: k % 64 == 32, one k stage, m = 1, m not a multiple of the
     * tile, many blocks sharing few tiles, a 128-token tile with padding, real dense shapes */
    case_mm_paths(P_WG1 | P_WG2, 40, 96, 300);
    case_mm_paths(P_WG1 | P_WG2, 100, 32, 1);
    case_mm_paths(P_WG1 | P_WG2, 3, 8192, 5000);
    case_mm_paths(P_WG1 | P_WG2, 24, 4096, 4096);
    case_mm_paths(P_ALL, 96, 4096, 8192);
    case_mm_paths(P_WG1 | P_WG2, 128, 8192, 10240);
    case_mm(1, 13, 1024, 1000);
    case_mm(0, 300, 1024, 1000);
    case_mm(0, 700, 8192, 1024);
    case_mm(2, 8, 1024, 1000);
    case_mm(2, 128, 8192, 1024);
    /* f32-output matmul (partial sums): n = 1 .. 200 (200: cuBLAS), a column slice of o_proj
     * (W = 4: 2048 of 8192 columns), a short odd shape, and batch invariance */
    {
        static const int nf[6] = {1, 8, 16, 37, 128, 200};
        for (int i = 0; i < 6; i++) case_mm_f32(P_AUTO | P_SYNC | P_WG1, nf[i], 1024, 1000, 1024);
        case_mm_f32(P_AUTO | P_SYNC | P_WG1, 8, 2048, 8192, 8192);
        case_mm_f32(P_AUTO | P_SYNC | P_WG1, 37, 2048, 8192, 8192);
        case_mm_f32(P_AUTO | P_SYNC | P_WG1, 13, 96, 300, 160);
        case_mm_f32(P_AUTO, 300, 2048, 1024, 8192);
        case_mm_f32_invariance(2048, 8192);
        case_mm_f32_invariance(96, 300);
    }
    /* router matmul */
    for (int i = 0; i < nn; i++) case_mm_f32w(ns[i], 8192, 256);
    case_mm_f32w(13, 256, 16);
    case_mm_f32w(16, 8192, 256);  /* the 16-token block exactly */
    case_mm_f32w(9, 1000, 40);    /* a short last split (488 k), rows < one block */
    case_mm_f32w(129, 516, 33);   /* 9 token blocks, the last with one token */
    case_mm_f32w(300, 1024, 100);
    /* norms and boundaries */
    for (int i = 0; i < nn; i++) {
        case_embed(ns[i], 8192, 1000);
        case_post_attn(ns[i], 8192);
        case_post_ffn(ns[i], 8192, 0);
        case_post_ffn(ns[i], 8192, 1);
        case_rms_bf16(ns[i], 4096, i & 1);
    }
    case_embed(300, 256, 512);
    case_post_attn(300, 256);
    case_post_ffn(13, 1024, 1);
    case_rms_bf16(300, 128, 1);
    /* widths that are not multiples of 8: every element through the scalar tail */
    case_embed(5, 1003, 64);
    case_post_attn(7, 1003);
    case_post_ffn(7, 1003, 1);
    case_rms_bf16(9, 1003, 1);
    case_rms_bf16(9, 1003, 0);
    /* router */
    for (int i = 0; i < nn; i++) case_route(ns[i], 8192, 256, 8);
    case_route(300, 8192, 256, 8);
    case_route(13, 256, 16, 4);
    /* QK norm + RoPE + KV insert */
    for (int i = 0; i < nn; i++) case_rope_kv(ns[i], 128, 16, 500000.0);
    case_rope_kv(13, 128, 16, 0.0);
    case_rope_kv(8, 4, 2, 10000.0);
    case_rope_kv(300, 16, 8, 500000.0);
    /* decode / verify attention */
    {
        const int R1[] = {1}, P1[] = {9000};
        case_attention("split-K", 128, 16, 0, 1, R1, P1, 0, 0);
        case_attention("split-K no hint", 128, 16, 0, 1, R1, P1, 0, 1);
        case_attention("split-K hint too small", 128, 16, 0, 1, R1, P1, 0, 2);
        const int R8[] = {8}, P8[] = {3001};
        case_attention("verify", 128, 16, 0, 1, R8, P8, 0, 0);
        const int P8w[] = {5000};
        case_attention("verify sliding", 128, 16, 2048, 1, R8, P8w, 0, 0);
        const int R13[] = {1, 4, 8}, P13[] = {17, 500, 2047};
        case_attention("mixed", 128, 16, 0, 3, R13, P13, 0, 0);
        case_attention("mixed sliding", 128, 16, 2048, 3, R13, P13, 0, 0);
        case_attention("mixed sliding hint too small", 128, 16, 2048, 3, R13, P13, 0, 2);
        int R64[8], P64[8], R128[16], P128[16];
        for (int r = 0; r < 8; r++) { R64[r] = 8; P64[r] = gh_rndi(3000); }
        for (int r = 0; r < 16; r++) { R128[r] = 8; P128[r] = gh_rndi(2500); }
        case_attention("batch", 128, 16, 0, 8, R64, P64, 0, 0);
        case_attention("batch sliding", 128, 16, 2048, 16, R128, P128, 0, 0);
        const int Rt[] = {8}, Pt[] = {90};
        case_attention("tiny", 4, 2, 64, 1, Rt, Pt, 0, 0);
        case_attention("G=16", 32, 2, 0, 3, R13, P13, 0, 0);
        case_attention("G=1", 4, 4, 0, 3, R13, P13, 0, 0);
        case_attention("G=2", 16, 8, 256, 3, R13, P13, 0, 0);
        const int Rz[] = {1}, Pz[] = {0};
        case_attention("first token", 128, 16, 0, 1, Rz, Pz, 0, 0);
        /* a row's bits never depend on the rows beside it (speculative == greedy) */
        case_attention_invariance("verify", 128, 16, 0, 8, 3001);
        case_attention_invariance("verify sliding", 128, 16, 2048, 8, 5000);
        case_attention_invariance("short", 128, 16, 0, 8, 40);
        case_attention_invariance("R=16", 128, 16, 2048, 16, 2500);
        case_attention_invariance("G=2", 16, 8, 256, 24, 700);
    }
    /* prefill attention */
    {
        const int R1[] = {1}, P0[] = {0};
        case_attention("one row", 128, 16, 0, 1, R1, P0, 1, 0);
        const int R13[] = {13};
        case_attention("short", 4, 2, 64, 1, R13, P0, 1, 0);
        const int R200[] = {200}, P30[] = {30};
        case_attention("tiny window", 4, 2, 64, 1, R200, P30, 1, 0);
        const int R300[] = {300}, P1900[] = {1900};
        case_attention("real", 128, 16, 0, 1, R300, P0, 1, 0);
        case_attention("real sliding", 128, 16, 2048, 1, R300, P1900, 1, 0);
        const int R77[] = {77}, P5[] = {5};
        case_attention("G=16", 32, 2, 0, 1, R77, P5, 1, 0);
        case_attention("G=1", 4, 4, 16, 1, R77, P5, 1, 0);
    }
    /* logits + argmax */
    case_logits(P_AUTO | P_SYNC | P_WG2, 1, 8192, 202048, 201818, 1);
    case_logits(P_AUTO | P_ALL, 8, 8192, 202048, 201818, 0);
    for (int i = 2; i < nn; i++) case_logits(P_AUTO | P_ALL, ns[i], 8192, 20000, 19990, 1);
    for (int i = 0; i < nn; i++) case_logits(P_AUTO | P_ALL, ns[i], 256, 1000, 990, 1);
    case_logits(P_AUTO | P_ALL, 40, 96, 777, 700, 1);
    case_logits(P_AUTO | P_SYNC | P_WG2, 200, 256, 1000, 990, 1);
    /* the non-finite guard of the argmax, every path, one and two chunks of 128 rows */
    case_logits_nonfinite(P_AUTO | P_ALL, 1, 256, 1000, 990);
    case_logits_nonfinite(P_AUTO | P_ALL, 13, 256, 1000, 990);
    case_logits_nonfinite(P_AUTO | P_ALL, 128, 1024, 5000, 4990);
    case_logits_nonfinite(P_AUTO | P_ALL, 200, 256, 1000, 1000);

    /* the launchers inside a captured CUDA graph */
    case_graph();

    /* bandwidth of the weight-streaming matmul (information, not a test) */
    info_mm_bandwidth(8, 8192, 8192);
    info_mm_bandwidth(128, 8192, 8192);

    sm_pool_destroy(g_pool);
    cudaStreamDestroy(g_st);
    sm_kernel_ctx_free(&g_ctx);
    printf("gpu_test_kernels: %d passed, %d failed, %d skipped\n", gh_pass, gh_fail, gh_skip);
    fflush(stdout);
    return gh_fail;
}
