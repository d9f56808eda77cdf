/* test_layer_ops.cu: the per-layer kernels of src/cuda/ops/ops.h (embedding, the norms and
 * residual boundaries, the router + top-K, QK norm + RoPE + KV insert, decode / verify /
 * prefill attention and its row invariance) against their CPU ops (src/cpu/ops.h), through the
 * one harness (harness.h: guarded, poisoned outputs, relative L2 and per-element bounds).
 * test_kernels.cu holds the dense ones (matmul, logits), the preconditions, graph capture, and
 * the entry that runs every case of both files.  We rejected one file: 1,200 lines.
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

/* ------------------------------------------------------------------ norms and boundaries */

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
    uint16_t *da = (uint16_t *)gh_dup_to_dev("a", ha, 2, (size_t)n * H);
    float *dal = (float *)gh_dup_to_dev("alpha", al, 4, H), *dbe = (float *)gh_dup_to_dev("beta", be, 4, H);
    float *dw = (float *)gh_dup_to_dev("pre_ffn", w, 4, H);
    uint16_t *dxf = (uint16_t *)gh_dalloc("xf", 2, (size_t)n * H);
    /* reference: s = alpha s + beta r16(rms(a, -, 1e-8)); xf = r16(rms(s, w)) */
    float *a = (float *)gh_halloc((size_t)n * H * 4), *xf = (float *)gh_halloc((size_t)n * H * 4);
    gh_bf16_to_f32(ha, a, (size_t)n * H);
    ref_post_attn(s, a, al, be, w, n, H, peps, eps, xf);
    if (sm_k_post_attn(ds, da, dal, dbe, dw, n, H, peps, eps, dxf, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc as = GH_ACC_INIT, ax = GH_ACC_INIT;
    double rs = gh_cmp_f32(ds, s, (size_t)n * H, &as);
    gh_cmp_bf16(dxf, xf, (size_t)n * H, &ax);
    /* s (f32) adds beta * r16(normalized branch): an rsqrt one f32 ulp apart moves that r16 by
     * a bf16 step (2^-8) on a few elements, so s gets a bf16-scale bound, not an f32 one */
    int ok = rs <= 1e-3 && !as.nan;
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
    uint16_t *df = (uint16_t *)gh_dup_to_dev("f", hf, 2, (size_t)n * H);
    float *dal = (float *)gh_dup_to_dev("alpha", al, 4, H), *dbe = (float *)gh_dup_to_dev("beta", be, 4, H);
    float *dpf = (float *)gh_dup_to_dev("post_ffn", pf, 4, H), *dw = (float *)gh_dup_to_dev("norm", w, 4, H);
    uint16_t *dx = (uint16_t *)gh_dalloc("x", 2, (size_t)n * H);
    /* reference: t = r16(f pf); s = alpha s + beta r16(rms(t, -, 1e-8)); x = r16(rms(s | r16(s), w)) */
    float *f = (float *)gh_halloc((size_t)n * H * 4), *x = (float *)gh_halloc((size_t)n * H * 4);
    gh_bf16_to_f32(hf, f, (size_t)n * H);
    ref_post_ffn(s, f, pf, al, be, w, last, n, H, peps, eps, x);
    if (sm_k_post_ffn(ds, df, dpf, dal, dbe, dw, last, n, H, peps, eps, dx, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc as = GH_ACC_INIT, ax = GH_ACC_INIT;
    double rs = gh_cmp_f32(ds, s, (size_t)n * H, &as);
    gh_cmp_bf16(dx, x, (size_t)n * H, &ax);
    /* s (f32) adds beta * r16(normalized branch): an rsqrt one f32 ulp apart moves that r16 by
     * a bf16 step (2^-8) on a few elements, so s gets a bf16-scale bound, not an f32 one */
    int ok = rs <= 1e-3 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    gh_verdict(name, ok, &ax, 1e-2);
}

void case_rms_bf16(int n, int d, int inplace) {
    char name[128];
    snprintf(name, sizeof name, "rms_bf16%s n=%d d=%d", inplace ? "_inplace" : "", n, d);
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
    if (sm_k_rms_bf16(dx, n, d, dw, 1e-5f, dy, g_st, &e)) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc a = GH_ACC_INIT;
    gh_cmp_bf16(dy, ref, (size_t)n * d, &a);
    gh_verdict(name, 1, &a, 1e-2);
}

/* ------------------------------------------------------------------ router */

void case_route(int n, int H, int E, int K) {
    char name[128];
    snprintf(name, sizeof name, "route n=%d H=%d E=%d K=%d", n, H, E, K);
    sm_err e = {""};
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
    /* reference: logits, then top-K and weights per row */
    float *xf = (float *)gh_halloc((size_t)n * H * 4), *lg = (float *)gh_halloc((size_t)n * E * 4);
    gh_bf16_to_f32(hx, xf, (size_t)n * H);
    int *ridx = (int *)gh_halloc((size_t)n * K * 4);
    float *rw = (float *)gh_halloc((size_t)n * K * 4);
    ref_route(g_pool, &c, xf, n, hr, hb, lg, ridx, rw);
    uint16_t *dx = (uint16_t *)gh_dup_to_dev("xf", hx, 2, (size_t)n * H);
    float *dr = (float *)gh_dup_to_dev("router", hr, 4, (size_t)E * H), *db = (float *)gh_dup_to_dev("bias", hb, 4, E);
    float *dl = (float *)gh_dalloc("logits", 4, (size_t)n * E), *dw = (float *)gh_dalloc("w", 4, (size_t)n * K);
    int *di = (int *)gh_dalloc("idx", 4, (size_t)n * K);
    if (sm_k_route(&g_ctx, dx, n, H, dr, db, E, K, c.out_mult, c.route_scale, dl, di, dw, g_st, &e)) {
        gh_fail_line(name, e.msg);
        return;
    }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    int *gi = (int *)gh_halloc((size_t)n * K * 4);
    float *gw = (float *)gh_halloc((size_t)n * K * 4);
    gh_to_host(gi, di, (size_t)n * K * 4);
    gh_to_host(gw, dw, (size_t)n * K * 4);
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

/* ------------------------------------------------------------------ QK norm + RoPE + KV */

void case_rope_kv(int n, int nh, int nkv, double theta) {
    char name[128];
    snprintf(name, sizeof name, "qk_rope_kv n=%d nh=%d nkv=%d theta=%g", n, nh, nkv, theta);
    sm_err e = {""};
    const int D = 64, ld = (2 * nh + 2 * nkv) * D; /* fused q | k | v | gate rows */
    const int nblocks = n / 4 + 8;
    const float eps = 1e-5f;
    uint16_t *hq = (uint16_t *)gh_halloc((size_t)n * ld * 2);
    gh_fill_bf16(hq, (size_t)n * ld, 1.0f);
    const size_t kvn = (size_t)nblocks * nkv * 16 * 128;
    uint16_t *hkv = (uint16_t *)gh_halloc(kvn * 2);
    gh_fill_bf16(hkv, kvn, 1.0f);
    int *pos = (int *)gh_halloc((size_t)n * 4);
    int64_t *slot = (int64_t *)gh_halloc((size_t)n * 8);
    /* distinct random slots; the last row is padding (slot -1) */
    int *perm = (int *)gh_halloc((size_t)nblocks * 16 * 4);
    for (int i = 0; i < nblocks * 16; i++) perm[i] = i;
    for (int i = nblocks * 16 - 1; i > 0; i--) { int j = gh_rndi(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int i = 0; i < n; i++) {
        pos[i] = gh_rndi(i % 3 == 0 ? 200000 : 5000);
        slot[i] = (n > 1 && i == n - 1) ? -1 : perm[i];
    }
    /* reference: the fused rows as f32, q and k normed and roped in place, K/V into kvref */
    float *qkvg = (float *)gh_halloc((size_t)n * ld * 4);
    uint16_t *kvref = (uint16_t *)gh_halloc(kvn * 2);
    gh_bf16_to_f32(hq, qkvg, (size_t)n * ld);
    memcpy(kvref, hkv, kvn * 2);
    ref_qk_rope_kv(qkvg, ld, qkvg + nh * D, qkvg + (nh + nkv) * D, ld, n, nh, nkv, D, pos, slot, theta, eps, kvref,
                   nblocks);
    uint16_t *dq = (uint16_t *)gh_dup_to_dev("qkvg", hq, 2, (size_t)n * ld);
    uint16_t *dkv = (uint16_t *)gh_dup_to_dev("kv", hkv, 2, kvn);
    int *dpos = (int *)gh_dup_to_dev("pos", pos, 4, n);
    int64_t *dslot = (int64_t *)gh_dup_to_dev("slot", slot, 8, n);
    /* q normed and roped in place, as the backend does */
    if (sm_k_qk_rope_kv(dq, ld, dq + nh * D, dq + (nh + nkv) * D, ld, n, nh, nkv, dpos, dslot, theta, eps, dq, ld, dkv,
                        nblocks, g_st, &e)) {
        gh_fail_line(name, e.msg);
        return;
    }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    uint16_t *gq = (uint16_t *)gh_halloc((size_t)n * ld * 2), *gkv = (uint16_t *)gh_halloc(kvn * 2);
    gh_to_host(gq, dq, (size_t)n * ld * 2);
    gh_to_host(gkv, dkv, kvn * 2);
    int ok = 1;
    /* the rest of each row (k, v, gate columns) must be untouched */
    for (int i = 0; i < n && ok; i++)
        if (memcmp(gq + (size_t)i * ld + nh * D, hq + (size_t)i * ld + nh * D, (size_t)(ld - nh * D) * 2)) {
            printf("  row %d: k/v/gate columns of the fused buffer changed\n", i);
            ok = 0;
        }
    gh_acc a = GH_ACC_INIT;
    float *gf = (float *)gh_halloc((size_t)nh * D * 4);
    for (int i = 0; i < n; i++) {
        gh_bf16_to_f32(gq + (size_t)i * ld, gf, (size_t)nh * D);
        gh_acc_add(&a, gf, qkvg + (size_t)i * ld, (size_t)nh * D);
    }
    /* cache: written slots vs the reference, everything else bit-identical */
    float *c1 = (float *)gh_halloc(kvn * 4), *c2 = (float *)gh_halloc(kvn * 4);
    gh_bf16_to_f32(gkv, c1, kvn);
    gh_bf16_to_f32(kvref, c2, kvn);
    gh_acc ak = GH_ACC_INIT;
    gh_acc_add(&ak, c1, c2, kvn);
    size_t diff = 0;
    for (size_t j = 0; j < kvn; j++) diff += gkv[j] != kvref[j];
    double rk = gh_acc_rel(&ak);
    if (ak.nan || rk > 1e-2) { printf("  cache rel %.3e, %ld NaN\n", rk, ak.nan); ok = 0; }
    printf("  %zu of %zu cache values differ from the reference (bf16 rounding flips)\n", diff, kvn);
    gh_verdict(name, ok, &a, 1e-2);
}

/* ------------------------------------------------------------------ attention */

/* A batch of requests, each with rows at consecutive positions, in a shuffled paged cache. */

void att_make(att_setup *s, int nkv, int nreq, const int *R, const int *p0) {
    s->nreq = nreq;
    s->n = 0;
    int maxlen = 1;
    for (int r = 0; r < nreq; r++) {
        s->n += R[r];
        if (p0[r] + R[r] > maxlen) maxlen = p0[r] + R[r];
    }
    s->max_ctx = maxlen;
    s->max_bpr = (maxlen + 15) / 16;
    int pages = 0;
    for (int r = 0; r < nreq; r++) pages += (p0[r] + R[r] + 15) / 16;
    s->nblocks = pages + 3;
    int *perm = (int *)gh_halloc((size_t)s->nblocks * 4);
    for (int i = 0; i < s->nblocks; i++) perm[i] = i;
    for (int i = s->nblocks - 1; i > 0; i--) { int j = gh_rndi(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    s->tables = (int *)gh_halloc((size_t)nreq * s->max_bpr * 4);
    int next = 0;
    for (int r = 0; r < nreq; r++)
        for (int b = 0; b < s->max_bpr; b++)
            s->tables[(size_t)r * s->max_bpr + b] = b < (p0[r] + R[r] + 15) / 16 ? perm[next++] : -1;
    s->row_req = (int *)gh_halloc((size_t)s->n * 4);
    s->pos = (int *)gh_halloc((size_t)s->n * 4);
    for (int r = 0, i = 0; r < nreq; r++)
        for (int j = 0; j < R[r]; j++, i++) { s->row_req[i] = r; s->pos[i] = p0[r] + j; }
    size_t kvn = (size_t)s->nblocks * nkv * 16 * 128;
    s->kv = (uint16_t *)gh_halloc(kvn * 2);
    gh_fill_bf16(s->kv, kvn, 1.0f);
}

/* prefill: 1 = sm_k_attention_prefill on the single request (nreq must be 1); hint0: the
 * max_ctx hint is 0 = exact, 1 = unknown (0), 2 = too small (64: the last key split takes the
 * rest, still correct) */
void case_attention(const char *label, int nh, int nkv, int window, int nreq, const int *R, const int *p0,
                           int prefill, int hint0) {
    char name[192];
    att_setup s;
    att_make(&s, nkv, nreq, R, p0);
    snprintf(name, sizeof name, "%s %s n=%d nh=%d nkv=%d window=%d ctx<=%d", prefill ? "attention_prefill" : "attention",
             label, s.n, nh, nkv, window, s.max_ctx);
    sm_err e = {""};
    const int D = 64, ld = (2 * nh + 2 * nkv) * D, n = s.n;
    const float scale = 5.4730064863875f / 8.0f, eps = 1e-5f;
    uint16_t *hq = (uint16_t *)gh_halloc((size_t)n * ld * 2);
    gh_fill_bf16(hq, (size_t)n * ld, 1.0f);
    /* reference: attention of the q columns, output norm and gate of the gate columns */
    float *qkvg = (float *)gh_halloc((size_t)n * ld * 4), *ref = (float *)gh_halloc((size_t)n * nh * D * 4);
    gh_bf16_to_f32(hq, qkvg, (size_t)n * ld);
    ref_att ra = {qkvg, ld, qkvg + (nh + 2 * nkv) * D, ld, s.kv, s.tables, s.max_bpr, s.row_req, s.pos, nh, nkv, D,
                  window, scale, eps};
    ref_attention(g_pool, &ra, n, NULL, 0, NULL, ref);
    size_t kvn = (size_t)s.nblocks * nkv * 16 * 128;
    uint16_t *dq = (uint16_t *)gh_dup_to_dev("qkvg", hq, 2, (size_t)n * ld);
    uint16_t *dkv = (uint16_t *)gh_dup_to_dev("kv", s.kv, 2, kvn);
    int *dtab = (int *)gh_dup_to_dev("tables", s.tables, 4, (size_t)nreq * s.max_bpr);
    int *dreq = (int *)gh_dup_to_dev("row_req", s.row_req, 4, n), *dpos = (int *)gh_dup_to_dev("pos", s.pos, 4, n);
    uint16_t *dout = (uint16_t *)gh_dalloc("out", 2, (size_t)n * nh * D);
    const uint16_t *dgate = dq + (nh + 2 * nkv) * D;
    int rc = prefill ? sm_k_attention_prefill(dq, ld, dgate, ld, dkv, dtab, p0[0], n, nh, nkv, window, scale, eps, dout,
                                              g_st, &e)
                     : sm_k_attention(&g_ctx, dq, ld, dgate, ld, dkv, dtab, s.max_bpr, dreq, dpos, n, nh, nkv, window,
                                      scale, eps, hint0 == 1 ? 0 : hint0 == 2 ? 64 : s.max_ctx, dout, g_st, &e);
    if (rc) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    gh_acc a = GH_ACC_INIT;
    gh_cmp_bf16(dout, ref, (size_t)n * nh * D, &a);
    gh_verdict(name, 1, &a, 1e-2);
}

/* A row's attention bits do not depend on the rows beside it: the R rows of one request run
 * (a) together, (b) each alone (one call per row), (c) interleaved with a second request of the
 * same cache (every run one row long) and (d) in reverse order; every row's output must be
 * bit-identical to (a).  The same n keeps the same split plan in (a), (c), (d); (b) shares it
 * when the rows fit one tile (R <= 64 / G). */
void case_attention_invariance(const char *label, int nh, int nkv, int window, int R, int p0) {
    char name[192];
    att_setup s;
    const int Rv[1] = {R}, Pv[1] = {p0};
    att_make(&s, nkv, 1, Rv, Pv);
    snprintf(name, sizeof name, "attention tile invariance %s R=%d nh=%d nkv=%d window=%d p0=%d", label, R, nh, nkv, window, p0);
    sm_err e = {""};
    const int D = 64, ld = (2 * nh + 2 * nkv) * D, n = s.n, G = nh / nkv;
    const float scale = 5.4730064863875f / 8.0f, eps = 1e-5f;
    const size_t orow = (size_t)nh * D;
    uint16_t *hq = (uint16_t *)gh_halloc((size_t)n * ld * 2), *hqr = (uint16_t *)gh_halloc((size_t)n * ld * 2);
    gh_fill_bf16(hq, (size_t)n * ld, 1.0f);
    for (int i = 0; i < n; i++) memcpy(hqr + (size_t)i * ld, hq + (size_t)(n - 1 - i) * ld, (size_t)ld * 2);
    int *tab2 = (int *)gh_halloc((size_t)2 * s.max_bpr * 4), *req2 = (int *)gh_halloc((size_t)n * 4), *posr = (int *)gh_halloc((size_t)n * 4);
    for (int b = 0; b < s.max_bpr; b++) tab2[b] = tab2[s.max_bpr + b] = s.tables[b];
    for (int i = 0; i < n; i++) { req2[i] = i & 1; posr[i] = s.pos[n - 1 - i]; }
    size_t kvn = (size_t)s.nblocks * nkv * 16 * 128;
    uint16_t *dq = (uint16_t *)gh_dup_to_dev("qkvg", hq, 2, (size_t)n * ld), *dqr = (uint16_t *)gh_dup_to_dev("qkvg rev", hqr, 2, (size_t)n * ld);
    uint16_t *dkv = (uint16_t *)gh_dup_to_dev("kv", s.kv, 2, kvn);
    int *dtab = (int *)gh_dup_to_dev("tables", tab2, 4, (size_t)2 * s.max_bpr);
    int *dreq = (int *)gh_dup_to_dev("row_req", s.row_req, 4, n), *dreq2 = (int *)gh_dup_to_dev("row_req 2", req2, 4, n);
    int *dpos = (int *)gh_dup_to_dev("pos", s.pos, 4, n), *dposr = (int *)gh_dup_to_dev("pos rev", posr, 4, n);
    uint16_t *out[4];
    const char *what[4] = {"together", "alone", "interleaved", "reversed"};
    for (int v = 0; v < 4; v++) out[v] = (uint16_t *)gh_dalloc("out", 2, (size_t)n * orow);
    const int go = nh * D + 2 * nkv * D; /* gate columns */
    int rc = sm_k_attention(&g_ctx, dq, ld, dq + go, ld, dkv, dtab, s.max_bpr, dreq, dpos, n, nh, nkv, window, scale, eps,
                            s.max_ctx, out[0], g_st, &e);
    for (int i = 0; i < n && !rc; i++)
        rc = sm_k_attention(&g_ctx, dq + (size_t)i * ld, ld, dq + (size_t)i * ld + go, ld, dkv, dtab, s.max_bpr, dreq + i,
                            dpos + i, 1, nh, nkv, window, scale, eps, s.max_ctx, out[1] + (size_t)i * orow, g_st, &e);
    if (!rc)
        rc = sm_k_attention(&g_ctx, dq, ld, dq + go, ld, dkv, dtab, s.max_bpr, dreq2, dpos, n, nh, nkv, window, scale, eps,
                            s.max_ctx, out[2], g_st, &e);
    if (!rc)
        rc = sm_k_attention(&g_ctx, dqr, ld, dqr + go, ld, dkv, dtab, s.max_bpr, dreq, dposr, n, nh, nkv, window, scale, eps,
                            s.max_ctx, out[3], g_st, &e);
    if (rc) { gh_fail_line(name, e.msg); return; }
    if (!gh_sync(g_st)) { gh_fail_line(name, "kernel failed"); return; }
    uint16_t *h[4];
    for (int v = 0; v < 4; v++) {
        h[v] = (uint16_t *)gh_halloc((size_t)n * orow * 2);
        gh_to_host(h[v], out[v], (size_t)n * orow * 2);
    }
    int ok = 1;
    /* the rows run together wrote every output (else poisoned rows would compare equal) */
    const size_t unw = gh_unwritten(out[0], (size_t)n * orow);
    if (unw) { printf("  together: %zu of %zu outputs never written\n", unw, (size_t)n * orow); ok = 0; }
    for (int v = 1; v < 4; v++) {
        if (v == 1 && R > 64 / G) continue; /* alone: another split plan */
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const int j = v == 3 ? n - 1 - i : i; /* row i of (a) is row j of the variant */
            if (memcmp(h[0] + (size_t)i * orow, h[v] + (size_t)j * orow, orow * 2)) bad++;
        }
        if (bad) { printf("  %s: %d of %d rows differ from the rows run together\n", what[v], bad, n); ok = 0; }
    }
    gh_acc a = GH_ACC_INIT;
    gh_verdict(name, ok, &a, 1.0);
}
