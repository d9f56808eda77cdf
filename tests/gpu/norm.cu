/* norm.cu: the norms and residual boundaries of src/cuda/ops/norm.cu (embedding + first norm,
 * rms norm, the post-attention and post-FFN boundaries) against ref_embed, ref_rms,
 * ref_post_attn and ref_post_ffn (src/cpu/ops_norm.c); benchmark: bench/gpu/norm.cu.  The
 * `kernels` group (kernel_cases.h), through the one harness (harness.h: guarded, poisoned
 * outputs, relative L2 and per-element bounds).  We rejected one file for the group: 1,200
 * lines.
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
#include "cuda/ops/norm.cuh"
#include "harness.h"
#include "kernel_cases.h"

/* ------------------------------------------------------------------ norms and boundaries */

/* The pass-by-pass form of the bodies (ONE = 0: what the monokernel runs) as stock-shaped
 * kernels, against which the stock kernels' one-read form must give the same bits. */
__global__ void tn_post_attn_passes(float *s, const uint16_t *a, const float *al, const float *be, const float *w, int H,
                                    float peps, float eps, uint16_t *xf) {
    __shared__ float red[32];
    sm_norm_post_attn_row<0>(s, a, al, be, w, H, peps, eps, xf, blockIdx.x, red, sm_team_block());
}
__global__ void tn_post_ffn_passes(float *s, const uint16_t *f, const float *pf, const float *al, const float *be,
                                   const float *w, int last, int H, float peps, float eps, uint16_t *x) {
    __shared__ float red[32];
    sm_norm_post_ffn_row<0>(s, f, pf, al, be, w, last, H, peps, eps, x, blockIdx.x, red, sm_team_block());
}
__global__ void tn_rms_bf16_passes(const uint16_t *x, int d, const float *w, float eps, uint16_t *y, int mx) {
    __shared__ float red[32];
    sm_norm_rms_bf16_row<0>(x, d, w, eps, y, blockIdx.x, red, sm_team_block(), mx);
}

/* 1 when the n elements of size esz at device a and b are the same bytes (else prints what). */
static int tn_same(const char *what, const void *a, const void *b, size_t n, size_t esz) {
    void *ha = gh_halloc(n * esz), *hb = gh_halloc(n * esz);
    if (cudaMemcpy(ha, a, n * esz, cudaMemcpyDeviceToHost) != cudaSuccess || cudaMemcpy(hb, b, n * esz, cudaMemcpyDeviceToHost) != cudaSuccess) {
        printf("  %s: copy failed\n", what);
        return 0;
    }
    if (memcmp(ha, hb, n * esz)) { printf("  %s: the one-read form differs from the pass-by-pass form\n", what); return 0; }
    return 1;
}

void case_embed(int n, int H, int V) {
    char name[128];
    snprintf(name, sizeof name, "embed n=%d H=%d V=%d", n, H, V);
    sm_err e = {""};
    const float eps = 1e-5f;
    uint16_t *hemb = (uint16_t *)gh_halloc((size_t)V * H * 2);
    gh_fill_bf16(hemb, (size_t)V * H, 0.05f);
    int *tok = (int *)gh_halloc((size_t)n * 4);
    for (int i = 0; i < n; i++) tok[i] = gh_rndi(V);
    float *w = (float *)gh_halloc((size_t)H * 4);
    gh_fill_eff(w, H);
    /* reference: s = r16(rms(embed[tok])), x = r16(rms(s, w)) */
    float *s = (float *)gh_halloc((size_t)n * H * 4), *x = (float *)gh_halloc((size_t)n * H * 4);
    ref_embed(hemb, V, H, tok, n, w, eps, s, x);
    uint16_t *demb = (uint16_t *)gh_dup_to_dev("embed", hemb, 2, (size_t)V * H);
    int *dtok = (int *)gh_dup_to_dev("tokens", tok, 4, n);
    float *dw = (float *)gh_dup_to_dev("in_norm", w, 4, H);
    float *ds = (float *)gh_dalloc("s", 4, (size_t)n * H);
    uint16_t *dx = (uint16_t *)gh_dalloc("x", 2, (size_t)n * H);
    if (sm_k_embed(demb, V, H, dtok, n, dw, eps, ds, dx, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc as = GH_ACC_INIT, ax = GH_ACC_INIT;
    double rs = gh_cmp_f32(ds, s, (size_t)n * H, &as);
    gh_cmp_bf16(dx, x, (size_t)n * H, &ax);
    int ok = rs <= 1e-2 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    gh_verdict(name, ok, &ax, 1e-2);
}

void case_post_attn(int n, int H) {
    char name[128];
    snprintf(name, sizeof name, "post_attn n=%d H=%d", n, H);
    sm_err e = {""};
    const float eps = 1e-5f, peps = 1e-8f;
    float *s = (float *)gh_halloc((size_t)n * H * 4);
    gh_fill_f32(s, (size_t)n * H, 1.0f);
    uint16_t *ha = (uint16_t *)gh_halloc((size_t)n * H * 2), *hg = (uint16_t *)gh_halloc((size_t)H * 2);
    gh_fill_bf16(ha, (size_t)n * H, 0.3f);
    gh_fill_bf16(hg, H, 1.0f);
    float *al = (float *)gh_halloc((size_t)H * 4), *be = (float *)gh_halloc((size_t)H * 4), *w = (float *)gh_halloc((size_t)H * 4);
    sm_residual_gate(hg, H, 0.3f, al, be);
    gh_fill_eff(w, H);
    float *ds = (float *)gh_dup_to_dev("s", s, 4, (size_t)n * H);
    float *ds2 = (float *)gh_dup_to_dev("s2", s, 4, (size_t)n * H); /* the input again, for the pass-by-pass form */
    uint16_t *da = (uint16_t *)gh_dup_to_dev("a", ha, 2, (size_t)n * H);
    float *dal = (float *)gh_dup_to_dev("alpha", al, 4, H), *dbe = (float *)gh_dup_to_dev("beta", be, 4, H);
    float *dw = (float *)gh_dup_to_dev("pre_ffn", w, 4, H);
    uint16_t *dxf = (uint16_t *)gh_dalloc("xf", 2, (size_t)n * H);
    /* reference: s = alpha s + beta r16(rms(a, -, 1e-8)); xf = r16(rms(s, w)) */
    float *a = (float *)gh_halloc((size_t)n * H * 4), *xf = (float *)gh_halloc((size_t)n * H * 4);
    gh_bf16_to_f32(ha, a, (size_t)n * H);
    ref_post_attn(s, a, al, be, w, n, H, peps, eps, xf);
    uint16_t *dxf2 = (uint16_t *)gh_dalloc("xf2", 2, (size_t)n * H);
    if (sm_k_post_attn(ds, da, dal, dbe, dw, n, H, peps, eps, dxf, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    tn_post_attn_passes<<<n, sm_norm_threads(H), 0, g_st>>>(ds2, da, dal, dbe, dw, H, peps, eps, dxf2);
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    int ok = tn_same("s", ds, ds2, (size_t)n * H, 4) && tn_same("xf", dxf, dxf2, (size_t)n * H, 2);
    gh_acc as = GH_ACC_INIT, ax = GH_ACC_INIT;
    double rs = gh_cmp_f32(ds, s, (size_t)n * H, &as);
    gh_cmp_bf16(dxf, xf, (size_t)n * H, &ax);
    /* s (f32) adds beta * r16(normalized branch): an rsqrt one f32 ulp apart moves that r16 by
     * a bf16 step (2^-8) on a few elements, so s gets a bf16-scale bound, not an f32 one */
    ok = ok && rs <= 1e-3 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    gh_verdict(name, ok, &ax, 1e-2);
}

void case_post_ffn(int n, int H, int last) {
    char name[128];
    snprintf(name, sizeof name, "post_ffn%s n=%d H=%d", last ? "_last" : "", n, H);
    sm_err e = {""};
    const float eps = 1e-5f, peps = 1e-8f;
    float *s = (float *)gh_halloc((size_t)n * H * 4);
    gh_fill_f32(s, (size_t)n * H, 1.0f);
    uint16_t *hf = (uint16_t *)gh_halloc((size_t)n * H * 2), *hg = (uint16_t *)gh_halloc((size_t)H * 2);
    gh_fill_bf16(hf, (size_t)n * H, 0.3f);
    gh_fill_bf16(hg, H, 1.0f);
    float *al = (float *)gh_halloc((size_t)H * 4), *be = (float *)gh_halloc((size_t)H * 4);
    float *pf = (float *)gh_halloc((size_t)H * 4), *w = (float *)gh_halloc((size_t)H * 4);
    sm_residual_gate(hg, H, 0.3f, al, be);
    gh_fill_eff(pf, H);
    if (last) gh_fill_f32(w, H, 1.0f); else gh_fill_eff(w, H); /* final norm weight is used as is */
    for (int i = 0; last && i < H; i++) w[i] = sm_r16(w[i]);
    float *ds = (float *)gh_dup_to_dev("s", s, 4, (size_t)n * H);
    float *ds2 = (float *)gh_dup_to_dev("s2", s, 4, (size_t)n * H); /* the input again, for the pass-by-pass form */
    uint16_t *df = (uint16_t *)gh_dup_to_dev("f", hf, 2, (size_t)n * H);
    float *dal = (float *)gh_dup_to_dev("alpha", al, 4, H), *dbe = (float *)gh_dup_to_dev("beta", be, 4, H);
    float *dpf = (float *)gh_dup_to_dev("post_ffn", pf, 4, H), *dw = (float *)gh_dup_to_dev("norm", w, 4, H);
    uint16_t *dx = (uint16_t *)gh_dalloc("x", 2, (size_t)n * H);
    /* reference: t = r16(f pf); s = alpha s + beta r16(rms(t, -, 1e-8)); x = r16(rms(s | r16(s), w)) */
    float *f = (float *)gh_halloc((size_t)n * H * 4), *x = (float *)gh_halloc((size_t)n * H * 4);
    gh_bf16_to_f32(hf, f, (size_t)n * H);
    ref_post_ffn(s, f, pf, al, be, w, last, n, H, peps, eps, x);
    uint16_t *dx2 = (uint16_t *)gh_dalloc("x2", 2, (size_t)n * H);
    if (sm_k_post_ffn(ds, df, dpf, dal, dbe, dw, last, n, H, peps, eps, dx, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    tn_post_ffn_passes<<<n, sm_norm_threads(H), 0, g_st>>>(ds2, df, dpf, dal, dbe, dw, last, H, peps, eps, dx2);
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    int ok = tn_same("s", ds, ds2, (size_t)n * H, 4) && tn_same("x", dx, dx2, (size_t)n * H, 2);
    gh_acc as = GH_ACC_INIT, ax = GH_ACC_INIT;
    double rs = gh_cmp_f32(ds, s, (size_t)n * H, &as);
    gh_cmp_bf16(dx, x, (size_t)n * H, &ax);
    /* s (f32) adds beta * r16(normalized branch): an rsqrt one f32 ulp apart moves that r16 by
     * a bf16 step (2^-8) on a few elements, so s gets a bf16-scale bound, not an f32 one */
    ok = ok && rs <= 1e-3 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    gh_verdict(name, ok, &ax, 1e-2);
}

void case_rms_bf16(int n, int d, int inplace, int mx) {
    char name[128];
    snprintf(name, sizeof name, "rms_bf16%s%s n=%d d=%d", inplace ? "_inplace" : "", mx ? "_mxfp4" : "", n, d);
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)gh_halloc((size_t)n * d * 2);
    gh_fill_bf16(hx, (size_t)n * d, 0.7f);
    float *w = (float *)gh_halloc((size_t)d * 4), *ref = (float *)gh_halloc((size_t)n * d * 4);
    gh_fill_eff(w, d);
    gh_bf16_to_f32(hx, ref, (size_t)n * d);
    ref_rms(ref, n, d, w, 1e-5f, 1, ref);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("x", hx, 2, (size_t)n * d);
    float *dw = (float *)gh_dup_to_dev("w", w, 4, d);
    uint16_t *dy = inplace ? dx : (uint16_t *)gh_dalloc("y", 2, (size_t)n * d);
    /* mx: first the plain output (kept), then the rounded one from the same input */
    uint16_t *dy0 = mx ? (uint16_t *)gh_dalloc("y0", 2, (size_t)n * d) : NULL;
    /* the pass-by-pass form first, from the same input (dx is overwritten when inplace) */
    uint16_t *dyp = (uint16_t *)gh_dalloc("y_passes", 2, (size_t)n * d);
    tn_rms_bf16_passes<<<n, sm_norm_threads(d), 0, g_st>>>(dx, d, dw, 1e-5f, dyp, mx);
    if (mx && sm_k_rms_bf16(dx, n, d, dw, 1e-5f, dy0, 0, NULL, NULL, 0, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (sm_k_rms_bf16(dx, n, d, dw, 1e-5f, dy, mx, NULL, NULL, 0, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc a = GH_ACC_INIT;
    gh_cmp_bf16(mx ? dy0 : dy, ref, (size_t)n * d, &a);
    int ok = tn_same("y", dy, dyp, (size_t)n * d, 2);
    if (mx) {
        /* the rounded output == codec.h's block quantizer applied to the plain one, bit for bit */
        uint16_t *y0 = (uint16_t *)gh_halloc((size_t)n * d * 2), *y = (uint16_t *)gh_halloc((size_t)n * d * 2);
        ok = cudaMemcpy(y0, dy0, (size_t)n * d * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(y, dy, (size_t)n * d * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
        long bad = 0;
        for (size_t b0 = 0; ok && b0 < (size_t)n * d; b0 += SM_MX_BLOCK) {
            float xb[SM_MX_BLOCK], qv[SM_MX_BLOCK];
            uint8_t q[SM_MX_BLOCK / 2];
            for (int j = 0; j < SM_MX_BLOCK; j++) xb[j] = sm_bf16_to_f32(y0[b0 + j]);
            const uint8_t sb = sm_mx_quantize_block(xb, q);
            sm_mx_dequantize_row(q, &sb, SM_MX_BLOCK, qv);
            for (int j = 0; j < SM_MX_BLOCK; j++) bad += y[b0 + j] != sm_f32_to_bf16(qv[j]);
        }
        if (bad) printf("  %s: %ld values differ from the block quantizer's\n", name, bad);
        ok = ok && bad == 0;
    }
    gh_verdict(name, ok, &a, 1e-2);
}

