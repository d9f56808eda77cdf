/* router.cu: the router of src/cuda/ops/router.cu (f32 logits, sigmoid, top-K, weights)
 * against ref_route (src/cpu/ops_moe.c); its matmul alone is matmul.cu's case_mm_f32w;
 * benchmark: bench/gpu/router.cu.  The `kernels` group (kernel_cases.h), through the one
 * harness (harness.h).  Route ids are compared on rows that are no near-tie.  We rejected
 * comparing the ids of near-ties: the reference's f32 order is not the kernel's.
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

/* ------------------------------------------------------------------ router */

/* One case's reference and kernel on the same inputs (xf hx [n, H] bf16, router hr [E, H], bias
 * hb [E], c's widths and multipliers): the reference's logits, ids and weights (host), the kernel's ids and
 * weights copied to the host and its logits left on the device.  0: the kernel failed (its
 * line printed under name). */
typedef struct rt_out {
    float *lg;   /* host [n][E]: ref_route's logits */
    int *ridx;   /* host [n][K]: its ids */
    float *rw;   /* host [n][K]: its weights */
    int *gi;     /* host [n][K]: sm_k_route's ids */
    float *gw;   /* host [n][K]: its weights */
    float *dl;   /* device [n][E]: its logits */
} rt_out;

static int rt_run(const char *name, const sm_config *c, int n, const uint16_t *hx, const float *hr, const float *hb, rt_out *o) {
    const int H = c->H, E = c->E, K = c->K;
    sm_err e = {""};
    float *xf = (float *)gh_halloc((size_t)n * H * 4), *lg = (float *)gh_halloc((size_t)n * E * 4);
    gh_bf16_to_f32(hx, xf, (size_t)n * H);
    int *ridx = (int *)gh_halloc((size_t)n * K * 4);
    float *rw = (float *)gh_halloc((size_t)n * K * 4);
    ref_route(g_pool, c, xf, n, hr, hb, lg, ridx, rw);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("xf", hx, 2, (size_t)n * H);
    float *dr = (float *)gh_dup_to_dev("router", hr, 4, (size_t)E * H), *db = (float *)gh_dup_to_dev("bias", hb, 4, E);
    float *dl = (float *)gh_dalloc("logits", 4, (size_t)n * E), *dw = (float *)gh_dalloc("w", 4, (size_t)n * K);
    int *di = (int *)gh_dalloc("idx", 4, (size_t)n * K);
    if (sm_k_route(&g_ctx, dx, n, H, dr, db, E, K, c->out_mult, c->route_scale, dl, di, dw, g_st, &e)) {
        gh_fail_line(name, e.msg);
        return 0;
    }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return 0; }
    int *gi = (int *)gh_halloc((size_t)n * K * 4);
    float *gw = (float *)gh_halloc((size_t)n * K * 4);
    gh_to_host(gi, di, (size_t)n * K * 4);
    gh_to_host(gw, dw, (size_t)n * K * 4);
    *o = (rt_out){lg, ridx, rw, gi, gw, dl};
    return 1;
}

void case_route(int n, int H, int E, int K) {
    char name[128];
    snprintf(name, sizeof name, "route n=%d H=%d E=%d K=%d", n, H, E, K);
    sm_config c;
    memset(&c, 0, sizeof c);
    c.H = H; c.E = E; c.K = K;
    c.out_mult = 0.17677669529663687f; /* 2^-2.5 */
    c.route_scale = 1.0f;
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * H * 2);
    gh_fill_bf16(hx, (size_t)n * H, 1.0f);
    float *hr = (float *)gh_halloc((size_t)E * H * 4), *hb = (float *)gh_halloc((size_t)E * 4);
    gh_fill_f32(hr, (size_t)E * H, 1.0f / sqrtf((float)H));
    gh_fill_f32(hb, E, 0.01f);
    /* reference: logits, then top-K and weights per row; the kernel */
    rt_out o;
    if (!rt_run(name, &c, n, hx, hr, hb, &o)) return;
    const float *lg = o.lg, *rw = o.rw, *gw = o.gw, *dl = o.dl;
    const int *ridx = o.ridx, *gi = o.gi;
    /* idx: compared on rows whose sorted selection values (top K+1) are > 1e-5 apart */
    float *sel = (float *)gh_halloc((size_t)E * 4);
    int ok = 1, skipped = 0, bad = 0;
    gh_acc aw = GH_ACC_INIT;
    for (int i = 0; i < n; i++) {
        for (int x = 0; x < E; x++) sel[x] = 1.0f / (1.0f + expf(-(lg[(size_t)i * E + x] * c.out_mult))) + hb[x];
        int close = 0;
        float prev = sel[ridx[(size_t)i * K]];
        for (int k = 1; k <= K && k <= E; k++) {
            float v;
            if (k < K) v = sel[ridx[(size_t)i * K + k]];
            else { /* the (K+1)-th: best of the rest */
                v = -INFINITY;
                for (int x = 0; x < E; x++) {
                    int used = 0;
                    for (int j = 0; j < K; j++) used |= ridx[(size_t)i * K + j] == x;
                    if (!used && sel[x] > v) v = sel[x];
                }
            }
            if (fabsf(prev - v) < 1e-5f) close = 1;
            prev = v;
        }
        if (close) { skipped++; continue; }
        for (int k = 0; k < K; k++)
            if (gi[(size_t)i * K + k] != ridx[(size_t)i * K + k]) {
                if (bad < 3) printf("  row %d route %d: expert %d, reference %d\n", i, k, gi[(size_t)i * K + k], ridx[(size_t)i * K + k]);
                bad++;
            }
        gh_acc_add(&aw, gw + (size_t)i * K, rw + (size_t)i * K, K);
    }
    if (bad) { printf("  %d route ids differ (%d rows skipped as near-ties)\n", bad, skipped); ok = 0; }
    gh_acc al = GH_ACC_INIT;
    double rl = gh_cmp_f32(dl, lg, (size_t)n * E, &al);
    if (!(rl <= 1e-4) || al.nan) { printf("  logits rel %.3e, %ld NaN\n", rl, al.nan); ok = 0; }
    if (skipped) printf("  %d of %d rows skipped as near-ties\n", skipped, n);
    gh_verdict(name, ok, &aw, 1e-4);
}


/* Exact ties and NaN rows: the router's rows repeat `groups` random rows (expert e has row
 * e % groups, bias of group e % groups), so every selection value is shared by E / groups
 * experts and the top-K must take the lowest ids of each tied group, as the reference does;
 * ids are compared exactly on rows whose distinct group values are > 1e-5 apart.  Row 1 holds a
 * NaN (every logit NaN): its ids must be K distinct valid experts. */
void case_route_ties(int n, int H, int E, int K, int groups) {
    char name[128];
    snprintf(name, sizeof name, "route_ties n=%d H=%d E=%d K=%d groups=%d", n, H, E, K, groups);
    sm_config c;
    memset(&c, 0, sizeof c);
    c.H = H; c.E = E; c.K = K;
    c.out_mult = 0.17677669529663687f;
    c.route_scale = 2.5f;
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * H * 2);
    gh_fill_bf16(hx, (size_t)n * H, 1.0f);
    if (n > 1) hx[(size_t)H + 7] = 0x7FC0; /* row 1: a NaN */
    float *g = (float *)gh_halloc((size_t)groups * H * 4), *gb = (float *)gh_halloc((size_t)groups * 4);
    gh_fill_f32(g, (size_t)groups * H, 1.0f / sqrtf((float)H));
    gh_fill_f32(gb, groups, 0.01f);
    float *hr = (float *)gh_halloc((size_t)E * H * 4), *hb = (float *)gh_halloc((size_t)E * 4);
    for (int x = 0; x < E; x++) {
        memcpy(hr + (size_t)x * H, g + (size_t)(x % groups) * H, (size_t)H * 4);
        hb[x] = gb[x % groups];
    }
    rt_out o;
    if (!rt_run(name, &c, n, hx, hr, hb, &o)) return;
    const float *lg = o.lg, *rw = o.rw, *gw = o.gw;
    const int *ridx = o.ridx, *gi = o.gi;
    float *sel = (float *)gh_halloc((size_t)groups * 4);
    int ok = 1, bad = 0, skipped = 0, compared = 0;
    gh_acc aw = GH_ACC_INIT;
    for (int i = 0; i < n; i++) {
        const int *ids = gi + (size_t)i * K;
        if (i == 1) { /* the NaN row: K distinct valid ids */
            for (int k = 0; k < K; k++) {
                int dup = ids[k] < 0 || ids[k] >= E;
                for (int j = 0; j < k; j++) dup |= ids[j] == ids[k];
                if (dup) { printf("  NaN row: route %d is expert %d (invalid or repeated)\n", k, ids[k]); ok = 0; }
            }
            continue;
        }
        int close = 0;
        for (int a = 0; a < groups; a++)
            sel[a] = 1.0f / (1.0f + expf(-(lg[(size_t)i * E + a] * c.out_mult))) + gb[a];
        for (int a = 0; a < groups; a++)
            for (int b = a + 1; b < groups; b++) close |= fabsf(sel[a] - sel[b]) < 1e-5f;
        if (close) { skipped++; continue; }
        compared++;
        for (int k = 0; k < K; k++)
            if (ids[k] != ridx[(size_t)i * K + k]) {
                if (bad < 3) printf("  row %d route %d: expert %d, reference %d\n", i, k, ids[k], ridx[(size_t)i * K + k]);
                bad++;
            }
        gh_acc_add(&aw, gw + (size_t)i * K, rw + (size_t)i * K, K);
    }
    if (bad) { printf("  %d route ids differ\n", bad); ok = 0; }
    if (!compared) { printf("  no row without near-ties between groups\n"); ok = 0; }
    gh_verdict(name, ok, &aw, 1e-4);
}
