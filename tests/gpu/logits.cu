/* logits.cu: lm_head + softcap + argmax (src/cuda/ops/logits.cu, every path) against
 * ref_logits_h (src/cpu/ops_logits.c), and the argmax's non-finite guard with planted NaN / Inf
 * values; benchmark: bench/gpu/logits.cu.  The `kernels` group (kernel_cases.h); bounds: the
 * f32 logits rel 1e-3, each element within GH_ELEM_FACTOR times that (harness.h), masked ids
 * -inf exactly, the argmax compared on rows that are no near-tie.  We rejected comparing the
 * argmax of near-ties: either id is right.
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

/* ------------------------------------------------------------------ logits */

void case_logits(int paths, int n, int H, int V, int vu, int want_logits) {
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
void case_logits_nonfinite(int paths, int n, int H, int V, int vu) {
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

