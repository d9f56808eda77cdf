/* matmul.cu: the bf16 matmuls of src/cuda/ops/matmul.cu against ref_mm, ref_mm_partial and
 * ref_mm_f32 (src/cpu/ops_mm.c), a case per path and size: sm_k_mm and its paths (few-row
 * sync, wgmma 128 / 256, cuBLAS), the f32-output partial product sm_k_mm_f32 (its paths, a
 * column slice, its batch invariance) and the router product sm_k_mm_f32w; benchmark:
 * bench/gpu/matmul.cu.  The `kernels` group (kernel_cases.h); bounds: bf16 outputs rel 1e-2,
 * f32 outputs 1e-4, each element within GH_ELEM_FACTOR times that (harness.h).  Paths that
 * must agree bit for bit (a second run, r16 of the f32 output against the bf16 output, batch
 * invariance) are compared with memcmp.  We rejected one file for the group's kernels: 1,200
 * lines no one could find a case in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
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
#include "harness.h"
#include "kernel_cases.h"

void case_mm(int which, int n, int k, int m) {
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
void case_mm_paths(int paths, int n, int k, int m) {
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
void case_mm_f32(int paths, int n, int k, int m, int kfull) {
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
void case_mm_f32_invariance(int k, int m) {
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

void case_mm_f32w(int n, int k, int m) {
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

