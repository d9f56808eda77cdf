/* test_kernels.cu: every stock-path kernel of src/cuda/kernels.h against its CPU reference
 * (src/cpu/ops.h) on fresh random inputs (seeded per run from the clock; the seed is printed).
 *
 * Every reference is the kernel's CPU op (ops.h lists the pairs), called on the same inputs;
 * the test holds no math of its own.  Each case: random inputs, outputs poisoned with NaN, 64 guard elements on each side of
 * every device buffer filled with a byte pattern and checked afterwards, the relative error
 * ||out - ref|| / ||ref|| against a bound (bf16 outputs 1e-2, f32 logits 1e-3, f32 router
 * logits and residual stream 1e-4), any NaN failing.  The argmax's non-finite guard is checked
 * with planted NaN / Inf values (case_logits_nonfinite).  One "PASS name" / "FAIL name" line per
 * kernel and size.  Device and host buffers of a case are registered in a small arena and
 * freed when the case ends, so a failing case does not leak into the next.  We rejected a
 * comparison by max-abs error: bf16 rounding flips make single elements differ by one ulp
 * while the tensor as a whole agrees to 1e-3.
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
#include "cuda/kernels.h"
#include "gpu_tests.h"

/* ------------------------------------------------------------------ harness */

static int g_pass, g_fail;
static uint64_t g_rng;
static sm_pool *g_pool;
static sm_cuda_ctx g_ctx;
static cudaStream_t g_st;

#define GUARD 64            /* elements of guard on each side of a device buffer */
#define GUARD_BYTE 0xA5     /* guard pattern */
#define MAX_ARENA 256

typedef struct dbuf {
    unsigned char *base;    /* cudaMalloc'd: [GUARD + n + GUARD] elements */
    size_t esz;             /* bytes per element */
    size_t n;               /* elements in the interior */
    const char *name;       /* for messages */
} dbuf;

static dbuf g_dbufs[MAX_ARENA];
static int g_ndbuf;
static void *g_hbufs[MAX_ARENA];
static int g_nhbuf;

static uint64_t rnd64(void) { return sm_rng_next(&g_rng); } /* the one generator (rng.h) */
/* uniform in [-1, 1) */
static float rndu(void) { return (float)((double)(rnd64() >> 40) * (1.0 / 8388608.0) - 1.0); }
/* uniform with standard deviation sd */
static float rnds(float sd) { return rndu() * sd * 1.7320508f; }
static int rndi(int n) { return (int)((rnd64() >> 33) % (uint64_t)n); }

static void *halloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { printf("  host allocation of %zu bytes failed\n", bytes); exit(1); }
    if (g_nhbuf < MAX_ARENA) g_hbufs[g_nhbuf++] = p;
    return p;
}

/* Device buffer of n elements of esz bytes: guards = pattern, interior = 0xFF bytes (NaN). */
static void *dalloc(const char *name, size_t esz, size_t n) {
    if (g_ndbuf >= MAX_ARENA) { printf("  too many device buffers\n"); exit(1); }
    dbuf *b = &g_dbufs[g_ndbuf];
    size_t bytes = (n + 2 * GUARD) * esz;
    if (cudaMalloc((void **)&b->base, bytes) != cudaSuccess) {
        printf("  cudaMalloc of %zu bytes for %s failed\n", bytes, name);
        exit(1);
    }
    b->esz = esz;
    b->n = n;
    b->name = name;
    cudaMemset(b->base, GUARD_BYTE, bytes);
    cudaMemset(b->base + GUARD * esz, 0xFF, n * esz);
    g_ndbuf++;
    return b->base + GUARD * esz;
}
/* Device copy of a host array (guarded like every buffer). */
static void *dup_to_dev(const char *name, const void *h, size_t esz, size_t n) {
    void *d = dalloc(name, esz, n);
    cudaMemcpy(d, h, esz * n, cudaMemcpyHostToDevice);
    return d;
}
static void to_host(void *h, const void *d, size_t bytes) { cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost); }

/* Every buffer's guards unchanged; prints the buffer names that were overrun. */
static int guards_ok(void) {
    int ok = 1;
    for (int i = 0; i < g_ndbuf; i++) {
        dbuf *b = &g_dbufs[i];
        size_t gb = GUARD * b->esz;
        unsigned char *h = (unsigned char *)malloc(2 * gb);
        cudaMemcpy(h, b->base, gb, cudaMemcpyDeviceToHost);
        cudaMemcpy(h + gb, b->base + gb + b->n * b->esz, gb, cudaMemcpyDeviceToHost);
        for (size_t j = 0; j < 2 * gb; j++)
            if (h[j] != GUARD_BYTE) {
                printf("  guard of %s overwritten (%s side, byte %zu)\n", b->name, j < gb ? "low" : "high", j % gb);
                ok = 0;
                break;
            }
        free(h);
    }
    return ok;
}

static void case_end(void) {
    for (int i = 0; i < g_ndbuf; i++) cudaFree(g_dbufs[i].base);
    for (int i = 0; i < g_nhbuf; i++) free(g_hbufs[i]);
    g_ndbuf = g_nhbuf = 0;
}

/* Synchronize and report a CUDA error (asynchronous kernel faults surface here). */
static int sync_ok(void) {
    cudaError_t r = cudaStreamSynchronize(g_st);
    if (r == cudaSuccess) r = cudaGetLastError();
    if (r != cudaSuccess) { printf("  CUDA error: %s\n", cudaGetErrorString(r)); return 0; }
    return 1;
}

/* ||out - ref|| / ||ref|| over finite reference entries; NaN in out -> nan flag. Entries
 * where ref is infinite must be equal in out (masked logits). */
typedef struct rel_acc {
    double num, den;  /* squared error and squared reference */
    long nan;         /* NaN outputs */
    long infbad;      /* infinite reference not matched */
} rel_acc;

static void rel_add(rel_acc *a, const float *out, const float *ref, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (out[i] != out[i]) { a->nan++; continue; }
        if (isinf(ref[i])) { if (out[i] != ref[i]) a->infbad++; continue; }
        double d = (double)out[i] - (double)ref[i];
        a->num += d * d;
        a->den += (double)ref[i] * (double)ref[i];
    }
}
static double rel_val(const rel_acc *a) { return a->den > 0 ? sqrt(a->num / a->den) : sqrt(a->num); }

static void bf16_to_f32(const uint16_t *h, float *f, size_t n) { for (size_t i = 0; i < n; i++) f[i] = sm_bf16_to_f32(h[i]); }
static void fill_bf16(uint16_t *h, size_t n, float sd) { for (size_t i = 0; i < n; i++) h[i] = sm_f32_to_bf16(rnds(sd)); }
static void fill_f32(float *h, size_t n, float sd) { for (size_t i = 0; i < n; i++) h[i] = rnds(sd); }
/* eff(g) = r16(1 + g) with a small random gain */
static void fill_eff(float *h, size_t n) { for (size_t i = 0; i < n; i++) h[i] = sm_r16(1.0f + rnds(0.1f)); }

/* Compare a device bf16 output with a float reference. */
static double cmp_bf16(const uint16_t *d, const float *ref, size_t n, rel_acc *a) {
    uint16_t *hb = (uint16_t *)halloc(n * 2);
    float *hf = (float *)halloc(n * 4);
    to_host(hb, d, n * 2);
    bf16_to_f32(hb, hf, n);
    rel_add(a, hf, ref, n);
    return rel_val(a);
}
static double cmp_f32(const float *d, const float *ref, size_t n, rel_acc *a) {
    float *hf = (float *)halloc(n * 4);
    to_host(hf, d, n * 4);
    rel_add(a, hf, ref, n);
    return rel_val(a);
}

/* One PASS/FAIL line: ok requires no NaN, matched infinities, rel <= bound, guards intact.
 * verdict_keep leaves the case's buffers allocated (several paths checked on one reference). */
static int verdict_keep(const char *name, int ok, const rel_acc *a, double bound) {
    double r = rel_val(a);
    if (a->nan) { printf("  %ld NaN outputs\n", a->nan); ok = 0; }
    if (a->infbad) { printf("  %ld masked (-inf) entries not matched\n", a->infbad); ok = 0; }
    if (!(r <= bound)) { printf("  relative error %.3e above bound %.1e\n", r, bound); ok = 0; }
    if (!guards_ok()) ok = 0;
    printf("%s %s (rel %.2e)\n", ok ? "PASS" : "FAIL", name, r);
    fflush(stdout);
    if (ok) g_pass++; else g_fail++;
    return ok;
}
static int verdict(const char *name, int ok, const rel_acc *a, double bound) {
    ok = verdict_keep(name, ok, a, bound);
    case_end();
    return ok;
}
static void fail_line(const char *name, const char *why) {
    printf("  %s\nFAIL %s\n", why, name);
    fflush(stdout);
    g_fail++;
    case_end();
}

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
    uint16_t *hx = (uint16_t *)halloc((size_t)n * k * 2), *hw = (uint16_t *)halloc((size_t)m * k * 2);
    fill_bf16(hx, (size_t)n * k, 1.0f);
    fill_bf16(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    float *xf = (float *)halloc((size_t)n * k * 4), *ref = (float *)halloc((size_t)n * m * 4);
    bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm(g_pool, xf, n, k, hw, m, ref);
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)n * k);
    uint16_t *dw = (uint16_t *)dup_to_dev("W", hw, 2, (size_t)m * k);
    uint16_t *dy = (uint16_t *)dalloc("y", 2, (size_t)n * m);
    int rc = which == 0 ? sm_k_mm(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)
           : which == 1 ? sm_k_mm_small(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)
                        : sm_k_mm_blas(&g_ctx, dx, n, k, dw, m, dy, g_st, &e);
    if (rc) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc a = {0, 0, 0, 0};
    cmp_bf16(dy, ref, (size_t)n * m, &a);
    verdict(name, 1, &a, 1e-2);
}

/* The few-row paths (mask of P_*) on one input and one reference; each path writes a fresh
 * poisoned output, and runs twice: the second result must equal the first bit for bit (the
 * wgmma kernel's shared tiles are summed in a fixed order, its counters reset themselves). */
static void case_mm_paths(int paths, int n, int k, int m) {
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)halloc((size_t)n * k * 2), *hw = (uint16_t *)halloc((size_t)m * k * 2);
    fill_bf16(hx, (size_t)n * k, 1.0f);
    fill_bf16(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    float *xf = (float *)halloc((size_t)n * k * 4), *ref = (float *)halloc((size_t)n * m * 4);
    bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm(g_pool, xf, n, k, hw, m, ref);
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)n * k);
    uint16_t *dw = (uint16_t *)dup_to_dev("W", hw, 2, (size_t)m * k);
    uint16_t *h1 = (uint16_t *)halloc((size_t)n * m * 2), *h2 = (uint16_t *)halloc((size_t)n * m * 2);
    for (int p = SM_PATH_SYNC; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[128];
        snprintf(name, sizeof name, "mm_%s n=%d k=%d m=%d", path_name(p), n, k, m);
        uint16_t *dy = (uint16_t *)dalloc("y", 2, (size_t)n * m);
        int ok = 1;
        if (sm_k_mm_path(&g_ctx, p, dx, n, k, dw, m, dy, g_st, &e)) { printf("  %s\n", e.msg); ok = 0; }
        if (ok && !sync_ok()) ok = 0;
        if (ok) {
            to_host(h1, dy, (size_t)n * m * 2);
            cudaMemset(dy, 0xFF, (size_t)n * m * 2);
            if (sm_k_mm_path(&g_ctx, p, dx, n, k, dw, m, dy, g_st, &e)) { printf("  %s\n", e.msg); ok = 0; }
            if (ok && !sync_ok()) ok = 0;
            if (ok) {
                to_host(h2, dy, (size_t)n * m * 2);
                if (memcmp(h1, h2, (size_t)n * m * 2)) { printf("  second run differs from the first\n"); ok = 0; }
            }
        }
        rel_acc a = {0, 0, 0, 0};
        if (ok) cmp_bf16(dy, ref, (size_t)n * m, &a);
        else a.nan = 1;
        verdict_keep(name, ok, &a, 1e-2);
    }
    case_end();
}

/* sm_k_mm_f32 (paths: mask of P_AUTO, P_SYNC, P_WG1) against ref_mm_partial: W is the column
 * slice [c0, c0 + k) of a host matrix [m, kfull] (kfull == k: the whole matrix; else a rank's
 * o_proj columns, read by the reference through the strided view, packed contiguous for the
 * device).  Each path runs twice (same bits), and at n <= 128 r16 of its f32 output must equal
 * sm_k_mm_path's bf16 output of the same path bit for bit (the same work split). */
static void case_mm_f32(int paths, int n, int k, int m, int kfull) {
    sm_err e = {""};
    const int c0 = kfull - k;
    uint16_t *hx = (uint16_t *)halloc((size_t)n * k * 2), *hwf = (uint16_t *)halloc((size_t)m * kfull * 2);
    uint16_t *hw = (uint16_t *)halloc((size_t)m * k * 2);
    fill_bf16(hx, (size_t)n * k, 1.0f);
    fill_bf16(hwf, (size_t)m * kfull, 1.0f / sqrtf((float)kfull));
    for (int r = 0; r < m; r++) memcpy(hw + (size_t)r * k, hwf + (size_t)r * kfull + c0, (size_t)k * 2);
    float *xf = (float *)halloc((size_t)n * k * 4), *ref = (float *)halloc((size_t)n * m * 4);
    bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm_partial(g_pool, xf, n, k, hwf + c0, kfull, m, ref);
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)n * k);
    uint16_t *dw = (uint16_t *)dup_to_dev("W", hw, 2, (size_t)m * k);
    float *h1 = (float *)halloc((size_t)n * m * 4), *h2 = (float *)halloc((size_t)n * m * 4);
    uint16_t *hb = (uint16_t *)halloc((size_t)n * m * 2);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG1; p++) {
        if (!(paths & (1 << p)) || (n > SM_MM_SMALL_MAX && p != SM_PATH_AUTO)) continue;
        char name[160];
        snprintf(name, sizeof name, "mm_f32_%s n=%d k=%d m=%d%s", path_name(p), n, k, m, kfull > k ? " (column slice)" : "");
        float *dy = (float *)dalloc("y32", 4, (size_t)n * m);
        int ok = 1;
        for (int run = 0; run < 2 && ok; run++) {
            if (run) cudaMemset(dy, 0xFF, (size_t)n * m * 4);
            int rc = n > SM_MM_SMALL_MAX ? sm_k_mm_f32(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)
                                         : sm_k_mm_f32_path(&g_ctx, p, dx, n, k, dw, m, dy, g_st, &e);
            if (rc) { printf("  %s\n", e.msg); ok = 0; }
            if (ok && !sync_ok()) ok = 0;
            if (ok) to_host(run ? h2 : h1, dy, (size_t)n * m * 4);
        }
        if (ok && memcmp(h1, h2, (size_t)n * m * 4)) { printf("  second run differs from the first\n"); ok = 0; }
        if (ok && n <= SM_MM_SMALL_MAX) {
            /* the bf16 matmul of the same path rounds exactly these sums */
            uint16_t *dyb = (uint16_t *)dalloc("y", 2, (size_t)n * m);
            if (sm_k_mm_path(&g_ctx, p, dx, n, k, dw, m, dyb, g_st, &e)) { printf("  %s\n", e.msg); ok = 0; }
            if (ok && !sync_ok()) ok = 0;
            if (ok) {
                to_host(hb, dyb, (size_t)n * m * 2);
                long bad = 0;
                for (size_t i = 0; i < (size_t)n * m; i++) bad += sm_f32_to_bf16(h1[i]) != hb[i];
                if (bad) { printf("  %ld outputs: r16(f32 output) differs from sm_k_mm's bf16 output\n", bad); ok = 0; }
            }
        }
        rel_acc a = {0, 0, 0, 0};
        if (ok) rel_add(&a, h1, ref, (size_t)n * m);
        else a.nan = 1;
        verdict_keep(name, ok, &a, 1e-4);
    }
    case_end();
}

/* Batch invariance of sm_k_mm_f32 (the auto path): the rows of a 128-row input run as n = 1,
 * 8, 37 and 128 rows give every row the same f32 bits (speculative verify == greedy). */
static void case_mm_f32_invariance(int k, int m) {
    char name[128];
    snprintf(name, sizeof name, "mm_f32 batch invariance k=%d m=%d (n = 1, 8, 37 vs 128)", k, m);
    if (!g_ctx.tma_encode) { printf("INFO %s: skipped, no wgmma path on this device\n", name); return; }
    sm_err e = {""};
    const int N = 128, ns[3] = {1, 8, 37};
    uint16_t *hx = (uint16_t *)halloc((size_t)N * k * 2), *hw = (uint16_t *)halloc((size_t)m * k * 2);
    fill_bf16(hx, (size_t)N * k, 1.0f);
    fill_bf16(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)N * k);
    uint16_t *dw = (uint16_t *)dup_to_dev("W", hw, 2, (size_t)m * k);
    float *dy = (float *)dalloc("y32", 4, (size_t)N * m);
    float *all = (float *)halloc((size_t)N * m * 4), *part = (float *)halloc((size_t)N * m * 4);
    int ok = sm_k_mm_f32(&g_ctx, dx, N, k, dw, m, dy, g_st, &e) == 0 && sync_ok();
    if (ok) to_host(all, dy, (size_t)N * m * 4);
    for (int i = 0; i < 3 && ok; i++) {
        cudaMemset(dy, 0xFF, (size_t)N * m * 4);
        if (sm_k_mm_f32(&g_ctx, dx, ns[i], k, dw, m, dy, g_st, &e) || !sync_ok()) { ok = 0; break; }
        to_host(part, dy, (size_t)ns[i] * m * 4);
        if (memcmp(part, all, (size_t)ns[i] * m * 4)) { printf("  n=%d: rows differ from the n=128 run\n", ns[i]); ok = 0; }
    }
    if (e.msg[0]) printf("  %s\n", e.msg);
    rel_acc a = {0, 0, 0, 0};
    verdict(name, ok, &a, 1.0);
}

static void case_mm_f32w(int n, int k, int m) {
    char name[128];
    snprintf(name, sizeof name, "mm_f32w n=%d k=%d m=%d", n, k, m);
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)halloc((size_t)n * k * 2);
    float *hw = (float *)halloc((size_t)m * k * 4);
    fill_bf16(hx, (size_t)n * k, 1.0f);
    fill_f32(hw, (size_t)m * k, 1.0f / sqrtf((float)k));
    float *xf = (float *)halloc((size_t)n * k * 4), *ref = (float *)halloc((size_t)n * m * 4);
    bf16_to_f32(hx, xf, (size_t)n * k);
    ref_mm_f32(g_pool, xf, n, k, hw, m, ref);
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)n * k);
    float *dw = (float *)dup_to_dev("W", hw, 4, (size_t)m * k);
    float *dy = (float *)dalloc("y", 4, (size_t)n * m);
    if (sm_k_mm_f32w(&g_ctx, dx, n, k, dw, m, dy, g_st, &e)) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc a = {0, 0, 0, 0};
    cmp_f32(dy, ref, (size_t)n * m, &a);
    verdict(name, 1, &a, 1e-4);
}

/* ------------------------------------------------------------------ norms and boundaries */

static void case_embed(int n, int H, int V) {
    char name[128];
    snprintf(name, sizeof name, "embed n=%d H=%d V=%d", n, H, V);
    sm_err e = {""};
    const float eps = 1e-5f;
    uint16_t *hemb = (uint16_t *)halloc((size_t)V * H * 2);
    fill_bf16(hemb, (size_t)V * H, 0.05f);
    int *tok = (int *)halloc((size_t)n * 4);
    for (int i = 0; i < n; i++) tok[i] = rndi(V);
    float *w = (float *)halloc((size_t)H * 4);
    fill_eff(w, H);
    /* reference: s = r16(rms(embed[tok])), x = r16(rms(s, w)) */
    float *s = (float *)halloc((size_t)n * H * 4), *x = (float *)halloc((size_t)n * H * 4);
    ref_embed(hemb, V, H, tok, n, w, eps, s, x);
    uint16_t *demb = (uint16_t *)dup_to_dev("embed", hemb, 2, (size_t)V * H);
    int *dtok = (int *)dup_to_dev("tokens", tok, 4, n);
    float *dw = (float *)dup_to_dev("in_norm", w, 4, H);
    float *ds = (float *)dalloc("s", 4, (size_t)n * H);
    uint16_t *dx = (uint16_t *)dalloc("x", 2, (size_t)n * H);
    if (sm_k_embed(demb, V, H, dtok, n, dw, eps, ds, dx, g_st, &e)) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc as = {0, 0, 0, 0}, ax = {0, 0, 0, 0};
    double rs = cmp_f32(ds, s, (size_t)n * H, &as);
    cmp_bf16(dx, x, (size_t)n * H, &ax);
    int ok = rs <= 1e-2 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    verdict(name, ok, &ax, 1e-2);
}

static void case_post_attn(int n, int H) {
    char name[128];
    snprintf(name, sizeof name, "post_attn n=%d H=%d", n, H);
    sm_err e = {""};
    const float eps = 1e-5f, peps = 1e-8f;
    float *s = (float *)halloc((size_t)n * H * 4);
    fill_f32(s, (size_t)n * H, 1.0f);
    uint16_t *ha = (uint16_t *)halloc((size_t)n * H * 2), *hg = (uint16_t *)halloc((size_t)H * 2);
    fill_bf16(ha, (size_t)n * H, 0.3f);
    fill_bf16(hg, H, 1.0f);
    float *al = (float *)halloc((size_t)H * 4), *be = (float *)halloc((size_t)H * 4), *w = (float *)halloc((size_t)H * 4);
    sm_residual_gate(hg, H, 0.3f, al, be);
    fill_eff(w, H);
    float *ds = (float *)dup_to_dev("s", s, 4, (size_t)n * H);
    uint16_t *da = (uint16_t *)dup_to_dev("a", ha, 2, (size_t)n * H);
    float *dal = (float *)dup_to_dev("alpha", al, 4, H), *dbe = (float *)dup_to_dev("beta", be, 4, H);
    float *dw = (float *)dup_to_dev("pre_ffn", w, 4, H);
    uint16_t *dxf = (uint16_t *)dalloc("xf", 2, (size_t)n * H);
    /* reference: s = alpha s + beta r16(rms(a, -, 1e-8)); xf = r16(rms(s, w)) */
    float *a = (float *)halloc((size_t)n * H * 4), *xf = (float *)halloc((size_t)n * H * 4);
    bf16_to_f32(ha, a, (size_t)n * H);
    ref_post_attn(s, a, al, be, w, n, H, peps, eps, xf);
    if (sm_k_post_attn(ds, da, dal, dbe, dw, n, H, peps, eps, dxf, g_st, &e)) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc as = {0, 0, 0, 0}, ax = {0, 0, 0, 0};
    double rs = cmp_f32(ds, s, (size_t)n * H, &as);
    cmp_bf16(dxf, xf, (size_t)n * H, &ax);
    /* s (f32) adds beta * r16(normalized branch): an rsqrt one f32 ulp apart moves that r16 by
     * a bf16 step (2^-8) on a few elements, so s gets a bf16-scale bound, not an f32 one */
    int ok = rs <= 1e-3 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    verdict(name, ok, &ax, 1e-2);
}

static void case_post_ffn(int n, int H, int last) {
    char name[128];
    snprintf(name, sizeof name, "post_ffn%s n=%d H=%d", last ? "_last" : "", n, H);
    sm_err e = {""};
    const float eps = 1e-5f, peps = 1e-8f;
    float *s = (float *)halloc((size_t)n * H * 4);
    fill_f32(s, (size_t)n * H, 1.0f);
    uint16_t *hf = (uint16_t *)halloc((size_t)n * H * 2), *hg = (uint16_t *)halloc((size_t)H * 2);
    fill_bf16(hf, (size_t)n * H, 0.3f);
    fill_bf16(hg, H, 1.0f);
    float *al = (float *)halloc((size_t)H * 4), *be = (float *)halloc((size_t)H * 4);
    float *pf = (float *)halloc((size_t)H * 4), *w = (float *)halloc((size_t)H * 4);
    sm_residual_gate(hg, H, 0.3f, al, be);
    fill_eff(pf, H);
    if (last) fill_f32(w, H, 1.0f); else fill_eff(w, H); /* final norm weight is used as is */
    for (int i = 0; last && i < H; i++) w[i] = sm_r16(w[i]);
    float *ds = (float *)dup_to_dev("s", s, 4, (size_t)n * H);
    uint16_t *df = (uint16_t *)dup_to_dev("f", hf, 2, (size_t)n * H);
    float *dal = (float *)dup_to_dev("alpha", al, 4, H), *dbe = (float *)dup_to_dev("beta", be, 4, H);
    float *dpf = (float *)dup_to_dev("post_ffn", pf, 4, H), *dw = (float *)dup_to_dev("norm", w, 4, H);
    uint16_t *dx = (uint16_t *)dalloc("x", 2, (size_t)n * H);
    /* reference: t = r16(f pf); s = alpha s + beta r16(rms(t, -, 1e-8)); x = r16(rms(s | r16(s), w)) */
    float *f = (float *)halloc((size_t)n * H * 4), *x = (float *)halloc((size_t)n * H * 4);
    bf16_to_f32(hf, f, (size_t)n * H);
    ref_post_ffn(s, f, pf, al, be, w, last, n, H, peps, eps, x);
    if (sm_k_post_ffn(ds, df, dpf, dal, dbe, dw, last, n, H, peps, eps, dx, g_st, &e)) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc as = {0, 0, 0, 0}, ax = {0, 0, 0, 0};
    double rs = cmp_f32(ds, s, (size_t)n * H, &as);
    cmp_bf16(dx, x, (size_t)n * H, &ax);
    /* s (f32) adds beta * r16(normalized branch): an rsqrt one f32 ulp apart moves that r16 by
     * a bf16 step (2^-8) on a few elements, so s gets a bf16-scale bound, not an f32 one */
    int ok = rs <= 1e-3 && !as.nan;
    if (!ok) printf("  s: rel %.3e, %ld NaN\n", rs, as.nan);
    verdict(name, ok, &ax, 1e-2);
}

static void case_rms_bf16(int n, int d, int inplace) {
    char name[128];
    snprintf(name, sizeof name, "rms_bf16%s n=%d d=%d", inplace ? "_inplace" : "", n, d);
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)halloc((size_t)n * d * 2);
    fill_bf16(hx, (size_t)n * d, 0.7f);
    float *w = (float *)halloc((size_t)d * 4), *ref = (float *)halloc((size_t)n * d * 4);
    fill_eff(w, d);
    bf16_to_f32(hx, ref, (size_t)n * d);
    ref_rms(ref, n, d, w, 1e-5f, 1, ref);
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)n * d);
    float *dw = (float *)dup_to_dev("w", w, 4, d);
    uint16_t *dy = inplace ? dx : (uint16_t *)dalloc("y", 2, (size_t)n * d);
    if (sm_k_rms_bf16(dx, n, d, dw, 1e-5f, dy, g_st, &e)) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc a = {0, 0, 0, 0};
    cmp_bf16(dy, ref, (size_t)n * d, &a);
    verdict(name, 1, &a, 1e-2);
}

/* ------------------------------------------------------------------ router */

static void case_route(int n, int H, int E, int K) {
    char name[128];
    snprintf(name, sizeof name, "route n=%d H=%d E=%d K=%d", n, H, E, K);
    sm_err e = {""};
    sm_config c;
    memset(&c, 0, sizeof c);
    c.H = H; c.E = E; c.K = K;
    c.out_mult = 0.17677669529663687f; /* 2^-2.5 */
    c.route_scale = 1.0f;
    uint16_t *hx = (uint16_t *)halloc((size_t)n * H * 2);
    fill_bf16(hx, (size_t)n * H, 1.0f);
    float *hr = (float *)halloc((size_t)E * H * 4), *hb = (float *)halloc((size_t)E * 4);
    fill_f32(hr, (size_t)E * H, 1.0f / sqrtf((float)H));
    fill_f32(hb, E, 0.01f);
    /* reference: logits, then top-K and weights per row */
    float *xf = (float *)halloc((size_t)n * H * 4), *lg = (float *)halloc((size_t)n * E * 4);
    bf16_to_f32(hx, xf, (size_t)n * H);
    int *ridx = (int *)halloc((size_t)n * K * 4);
    float *rw = (float *)halloc((size_t)n * K * 4);
    ref_route(g_pool, &c, xf, n, hr, hb, lg, ridx, rw);
    uint16_t *dx = (uint16_t *)dup_to_dev("xf", hx, 2, (size_t)n * H);
    float *dr = (float *)dup_to_dev("router", hr, 4, (size_t)E * H), *db = (float *)dup_to_dev("bias", hb, 4, E);
    float *dl = (float *)dalloc("logits", 4, (size_t)n * E), *dw = (float *)dalloc("w", 4, (size_t)n * K);
    int *di = (int *)dalloc("idx", 4, (size_t)n * K);
    if (sm_k_route(&g_ctx, dx, n, H, dr, db, E, K, c.out_mult, c.route_scale, dl, di, dw, g_st, &e)) {
        fail_line(name, e.msg);
        return;
    }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    int *gi = (int *)halloc((size_t)n * K * 4);
    float *gw = (float *)halloc((size_t)n * K * 4);
    to_host(gi, di, (size_t)n * K * 4);
    to_host(gw, dw, (size_t)n * K * 4);
    /* idx: compared on rows whose sorted selection values (top K+1) are > 1e-5 apart */
    float *sel = (float *)halloc((size_t)E * 4);
    int ok = 1, skipped = 0, bad = 0;
    rel_acc aw = {0, 0, 0, 0};
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
        rel_add(&aw, gw + (size_t)i * K, rw + (size_t)i * K, K);
    }
    if (bad) { printf("  %d route ids differ (%d rows skipped as near-ties)\n", bad, skipped); ok = 0; }
    rel_acc al = {0, 0, 0, 0};
    double rl = cmp_f32(dl, lg, (size_t)n * E, &al);
    if (!(rl <= 1e-4) || al.nan) { printf("  logits rel %.3e, %ld NaN\n", rl, al.nan); ok = 0; }
    if (skipped) printf("  %d of %d rows skipped as near-ties\n", skipped, n);
    verdict(name, ok, &aw, 1e-4);
}

/* ------------------------------------------------------------------ QK norm + RoPE + KV */

static void case_rope_kv(int n, int nh, int nkv, double theta) {
    char name[128];
    snprintf(name, sizeof name, "qk_rope_kv n=%d nh=%d nkv=%d theta=%g", n, nh, nkv, theta);
    sm_err e = {""};
    const int D = 64, ld = (2 * nh + 2 * nkv) * D; /* fused q | k | v | gate rows */
    const int nblocks = n / 4 + 8;
    const float eps = 1e-5f;
    uint16_t *hq = (uint16_t *)halloc((size_t)n * ld * 2);
    fill_bf16(hq, (size_t)n * ld, 1.0f);
    const size_t kvn = (size_t)nblocks * nkv * 16 * 128;
    uint16_t *hkv = (uint16_t *)halloc(kvn * 2);
    fill_bf16(hkv, kvn, 1.0f);
    int *pos = (int *)halloc((size_t)n * 4);
    int64_t *slot = (int64_t *)halloc((size_t)n * 8);
    /* distinct random slots; the last row is padding (slot -1) */
    int *perm = (int *)halloc((size_t)nblocks * 16 * 4);
    for (int i = 0; i < nblocks * 16; i++) perm[i] = i;
    for (int i = nblocks * 16 - 1; i > 0; i--) { int j = rndi(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int i = 0; i < n; i++) {
        pos[i] = rndi(i % 3 == 0 ? 200000 : 5000);
        slot[i] = (n > 1 && i == n - 1) ? -1 : perm[i];
    }
    /* reference: the fused rows as f32, q and k normed and roped in place, K/V into kvref */
    float *qkvg = (float *)halloc((size_t)n * ld * 4);
    uint16_t *kvref = (uint16_t *)halloc(kvn * 2);
    bf16_to_f32(hq, qkvg, (size_t)n * ld);
    memcpy(kvref, hkv, kvn * 2);
    ref_qk_rope_kv(qkvg, ld, qkvg + nh * D, qkvg + (nh + nkv) * D, ld, n, nh, nkv, D, pos, slot, theta, eps, kvref,
                   nblocks);
    uint16_t *dq = (uint16_t *)dup_to_dev("qkvg", hq, 2, (size_t)n * ld);
    uint16_t *dkv = (uint16_t *)dup_to_dev("kv", hkv, 2, kvn);
    int *dpos = (int *)dup_to_dev("pos", pos, 4, n);
    int64_t *dslot = (int64_t *)dup_to_dev("slot", slot, 8, n);
    /* q normed and roped in place, as the backend does */
    if (sm_k_qk_rope_kv(dq, ld, dq + nh * D, dq + (nh + nkv) * D, ld, n, nh, nkv, dpos, dslot, theta, eps, dq, ld, dkv,
                        nblocks, g_st, &e)) {
        fail_line(name, e.msg);
        return;
    }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    uint16_t *gq = (uint16_t *)halloc((size_t)n * ld * 2), *gkv = (uint16_t *)halloc(kvn * 2);
    to_host(gq, dq, (size_t)n * ld * 2);
    to_host(gkv, dkv, kvn * 2);
    int ok = 1;
    /* the rest of each row (k, v, gate columns) must be untouched */
    for (int i = 0; i < n && ok; i++)
        if (memcmp(gq + (size_t)i * ld + nh * D, hq + (size_t)i * ld + nh * D, (size_t)(ld - nh * D) * 2)) {
            printf("  row %d: k/v/gate columns of the fused buffer changed\n", i);
            ok = 0;
        }
    rel_acc a = {0, 0, 0, 0};
    float *gf = (float *)halloc((size_t)nh * D * 4);
    for (int i = 0; i < n; i++) {
        bf16_to_f32(gq + (size_t)i * ld, gf, (size_t)nh * D);
        rel_add(&a, gf, qkvg + (size_t)i * ld, (size_t)nh * D);
    }
    /* cache: written slots vs the reference, everything else bit-identical */
    float *c1 = (float *)halloc(kvn * 4), *c2 = (float *)halloc(kvn * 4);
    bf16_to_f32(gkv, c1, kvn);
    bf16_to_f32(kvref, c2, kvn);
    rel_acc ak = {0, 0, 0, 0};
    rel_add(&ak, c1, c2, kvn);
    size_t diff = 0;
    for (size_t j = 0; j < kvn; j++) diff += gkv[j] != kvref[j];
    double rk = rel_val(&ak);
    if (ak.nan || rk > 1e-2) { printf("  cache rel %.3e, %ld NaN\n", rk, ak.nan); ok = 0; }
    printf("  %zu of %zu cache values differ from the reference (bf16 rounding flips)\n", diff, kvn);
    verdict(name, ok, &a, 1e-2);
}

/* ------------------------------------------------------------------ attention */

/* A batch of requests, each with rows at consecutive positions, in a shuffled paged cache. */
typedef struct att_setup {
    int n, nreq, max_bpr, nblocks;
    int *row_req, *pos;   /* [n] */
    int *tables;          /* [nreq, max_bpr] */
    uint16_t *kv;         /* [nblocks][nkv][16][128] */
    int max_ctx;
} att_setup;

static void att_make(att_setup *s, int nkv, int nreq, const int *R, const int *p0) {
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
    int *perm = (int *)halloc((size_t)s->nblocks * 4);
    for (int i = 0; i < s->nblocks; i++) perm[i] = i;
    for (int i = s->nblocks - 1; i > 0; i--) { int j = rndi(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    s->tables = (int *)halloc((size_t)nreq * s->max_bpr * 4);
    int next = 0;
    for (int r = 0; r < nreq; r++)
        for (int b = 0; b < s->max_bpr; b++)
            s->tables[(size_t)r * s->max_bpr + b] = b < (p0[r] + R[r] + 15) / 16 ? perm[next++] : -1;
    s->row_req = (int *)halloc((size_t)s->n * 4);
    s->pos = (int *)halloc((size_t)s->n * 4);
    for (int r = 0, i = 0; r < nreq; r++)
        for (int j = 0; j < R[r]; j++, i++) { s->row_req[i] = r; s->pos[i] = p0[r] + j; }
    size_t kvn = (size_t)s->nblocks * nkv * 16 * 128;
    s->kv = (uint16_t *)halloc(kvn * 2);
    fill_bf16(s->kv, kvn, 1.0f);
}

/* prefill: 1 = sm_k_attention_prefill on the single request (nreq must be 1); hint0: the
 * max_ctx hint is 0 = exact, 1 = unknown (0), 2 = too small (64: the last key split takes the
 * rest, still correct) */
static void case_attention(const char *label, int nh, int nkv, int window, int nreq, const int *R, const int *p0,
                           int prefill, int hint0) {
    char name[192];
    att_setup s;
    att_make(&s, nkv, nreq, R, p0);
    snprintf(name, sizeof name, "%s %s n=%d nh=%d nkv=%d window=%d ctx<=%d", prefill ? "attention_prefill" : "attention",
             label, s.n, nh, nkv, window, s.max_ctx);
    sm_err e = {""};
    const int D = 64, ld = (2 * nh + 2 * nkv) * D, n = s.n;
    const float scale = 5.4730064863875f / 8.0f, eps = 1e-5f;
    uint16_t *hq = (uint16_t *)halloc((size_t)n * ld * 2);
    fill_bf16(hq, (size_t)n * ld, 1.0f);
    /* reference: attention of the q columns, output norm and gate of the gate columns */
    float *qkvg = (float *)halloc((size_t)n * ld * 4), *ref = (float *)halloc((size_t)n * nh * D * 4);
    bf16_to_f32(hq, qkvg, (size_t)n * ld);
    ref_att ra = {qkvg, ld, qkvg + (nh + 2 * nkv) * D, ld, s.kv, s.tables, s.max_bpr, s.row_req, s.pos, nh, nkv, D,
                  window, scale, eps};
    ref_attention(g_pool, &ra, n, NULL, 0, NULL, ref);
    size_t kvn = (size_t)s.nblocks * nkv * 16 * 128;
    uint16_t *dq = (uint16_t *)dup_to_dev("qkvg", hq, 2, (size_t)n * ld);
    uint16_t *dkv = (uint16_t *)dup_to_dev("kv", s.kv, 2, kvn);
    int *dtab = (int *)dup_to_dev("tables", s.tables, 4, (size_t)nreq * s.max_bpr);
    int *dreq = (int *)dup_to_dev("row_req", s.row_req, 4, n), *dpos = (int *)dup_to_dev("pos", s.pos, 4, n);
    uint16_t *dout = (uint16_t *)dalloc("out", 2, (size_t)n * nh * D);
    const uint16_t *dgate = dq + (nh + 2 * nkv) * D;
    int rc = prefill ? sm_k_attention_prefill(dq, ld, dgate, ld, dkv, dtab, p0[0], n, nh, nkv, window, scale, eps, dout,
                                              g_st, &e)
                     : sm_k_attention(&g_ctx, dq, ld, dgate, ld, dkv, dtab, s.max_bpr, dreq, dpos, n, nh, nkv, window,
                                      scale, eps, hint0 == 1 ? 0 : hint0 == 2 ? 64 : s.max_ctx, dout, g_st, &e);
    if (rc) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    rel_acc a = {0, 0, 0, 0};
    cmp_bf16(dout, ref, (size_t)n * nh * D, &a);
    verdict(name, 1, &a, 1e-2);
}

/* A row's attention bits do not depend on the rows beside it: the R rows of one request run
 * (a) together, (b) each alone (one call per row), (c) interleaved with a second request of the
 * same cache (every run one row long) and (d) in reverse order; every row's output must be
 * bit-identical to (a).  The same n keeps the same split plan in (a), (c), (d); (b) shares it
 * when the rows fit one tile (R <= 64 / G). */
static void case_attention_invariance(const char *label, int nh, int nkv, int window, int R, int p0) {
    char name[192];
    att_setup s;
    const int Rv[1] = {R}, Pv[1] = {p0};
    att_make(&s, nkv, 1, Rv, Pv);
    snprintf(name, sizeof name, "attention tile invariance %s R=%d nh=%d nkv=%d window=%d p0=%d", label, R, nh, nkv, window, p0);
    sm_err e = {""};
    const int D = 64, ld = (2 * nh + 2 * nkv) * D, n = s.n, G = nh / nkv;
    const float scale = 5.4730064863875f / 8.0f, eps = 1e-5f;
    const size_t orow = (size_t)nh * D;
    uint16_t *hq = (uint16_t *)halloc((size_t)n * ld * 2), *hqr = (uint16_t *)halloc((size_t)n * ld * 2);
    fill_bf16(hq, (size_t)n * ld, 1.0f);
    for (int i = 0; i < n; i++) memcpy(hqr + (size_t)i * ld, hq + (size_t)(n - 1 - i) * ld, (size_t)ld * 2);
    int *tab2 = (int *)halloc((size_t)2 * s.max_bpr * 4), *req2 = (int *)halloc((size_t)n * 4), *posr = (int *)halloc((size_t)n * 4);
    for (int b = 0; b < s.max_bpr; b++) tab2[b] = tab2[s.max_bpr + b] = s.tables[b];
    for (int i = 0; i < n; i++) { req2[i] = i & 1; posr[i] = s.pos[n - 1 - i]; }
    size_t kvn = (size_t)s.nblocks * nkv * 16 * 128;
    uint16_t *dq = (uint16_t *)dup_to_dev("qkvg", hq, 2, (size_t)n * ld), *dqr = (uint16_t *)dup_to_dev("qkvg rev", hqr, 2, (size_t)n * ld);
    uint16_t *dkv = (uint16_t *)dup_to_dev("kv", s.kv, 2, kvn);
    int *dtab = (int *)dup_to_dev("tables", tab2, 4, (size_t)2 * s.max_bpr);
    int *dreq = (int *)dup_to_dev("row_req", s.row_req, 4, n), *dreq2 = (int *)dup_to_dev("row_req 2", req2, 4, n);
    int *dpos = (int *)dup_to_dev("pos", s.pos, 4, n), *dposr = (int *)dup_to_dev("pos rev", posr, 4, n);
    uint16_t *out[4];
    const char *what[4] = {"together", "alone", "interleaved", "reversed"};
    for (int v = 0; v < 4; v++) out[v] = (uint16_t *)dalloc("out", 2, (size_t)n * orow);
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
    if (rc) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "kernel failed"); return; }
    uint16_t *h[4];
    for (int v = 0; v < 4; v++) {
        h[v] = (uint16_t *)halloc((size_t)n * orow * 2);
        to_host(h[v], out[v], (size_t)n * orow * 2);
    }
    int ok = 1;
    for (int v = 1; v < 4; v++) {
        if (v == 1 && R > 64 / G) continue; /* alone: another split plan */
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const int j = v == 3 ? n - 1 - i : i; /* row i of (a) is row j of the variant */
            if (memcmp(h[0] + (size_t)i * orow, h[v] + (size_t)j * orow, orow * 2)) bad++;
        }
        if (bad) { printf("  %s: %d of %d rows differ from the rows run together\n", what[v], bad, n); ok = 0; }
    }
    rel_acc a = {0, 0, 0, 0};
    verdict(name, ok, &a, 1.0);
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
    uint16_t *hw = (uint16_t *)halloc((size_t)V * H * 2), *hh = (uint16_t *)halloc((size_t)n * H * 2);
    fill_bf16(hw, (size_t)V * H, 0.3f);
    fill_bf16(hh, (size_t)n * H, 1.0f);
    m.lm_head = hw;
    float *h = (float *)halloc((size_t)n * H * 4), *ref = (float *)halloc((size_t)n * V * 4);
    int *ram = (int *)halloc((size_t)n * 4);
    bf16_to_f32(hh, h, (size_t)n * H);
    ref_logits_h(g_pool, &m, h, n, ref, ram);
    uint16_t *dw = (uint16_t *)dup_to_dev("lm_head", hw, 2, (size_t)V * H), *dh = (uint16_t *)dup_to_dev("h", hh, 2, (size_t)n * H);
    int *gam = (int *)halloc((size_t)n * 4);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[160];
        snprintf(name, sizeof name, "logits_%s n=%d H=%d V=%d vocab_used=%d%s", path_name(p), n, H, V, vu,
                 want_logits ? "" : " (argmax only)");
        float *dl = want_logits ? (float *)dalloc("logits", 4, (size_t)n * V) : NULL;
        int *dam = (int *)dalloc("argmax", 4, n);
        if (sm_k_logits_path(&g_ctx, p, dh, n, H, dw, V, vu, m.cfg.out_mult, m.cfg.softcap, dl, dam, g_st, &e)) {
            printf("  %s\n", e.msg);
            rel_acc bad = {0, 0, 1, 0};
            verdict_keep(name, 0, &bad, 1e-3);
            continue;
        }
        if (!sync_ok()) {
            rel_acc bad = {0, 0, 1, 0};
            verdict_keep(name, 0, &bad, 1e-3);
            continue;
        }
        to_host(gam, dam, (size_t)n * 4);
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
        rel_acc a = {0, 0, 0, 0};
        if (want_logits) cmp_f32(dl, ref, (size_t)n * V, &a);
        verdict_keep(name, ok, &a, 1e-3);
    }
    case_end();
}

/* The non-finite guard of the argmax (kernels.h, sm_k_logits): a row whose logits among ids <
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
    if (!sync_ok()) return -1;
    to_host(out, dam, (size_t)n * 4);
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
    uint16_t *hw = (uint16_t *)halloc((size_t)V * H * 2), *hh = (uint16_t *)halloc((size_t)n * H * 2);
    fill_bf16(hw, (size_t)V * H, 0.3f);
    fill_bf16(hh, (size_t)n * H, 1.0f);
    const int ra = rndi(n), rb = n > 1 ? (ra + 1 + rndi(n - 1)) % n : -1;
    const int vb = rndi(vu), vm = vu < V ? vu + rndi(V - vu) : -1;
    uint16_t *dh = (uint16_t *)dup_to_dev("h", hh, 2, (size_t)n * H), *dw = (uint16_t *)dup_to_dev("lm_head", hw, 2, (size_t)V * H);
    /* h with one NaN in row ra (A); then also +Inf in row rb (B) */
    hh[(size_t)ra * H + rndi(H)] = LG_NAN_BF16;
    uint16_t *dha = (uint16_t *)dup_to_dev("h NaN", hh, 2, (size_t)n * H);
    if (rb >= 0) hh[(size_t)rb * H + rndi(H)] = LG_INF_BF16;
    uint16_t *dhb = (uint16_t *)dup_to_dev("h NaN Inf", hh, 2, (size_t)n * H);
    /* lm_head with one NaN in row vb (C), another copy with one in the masked row vm (D) */
    const size_t jb = (size_t)vb * H + rndi(H);
    const uint16_t keep = hw[jb];
    hw[jb] = LG_NAN_BF16;
    uint16_t *dwc = (uint16_t *)dup_to_dev("lm_head NaN", hw, 2, (size_t)V * H);
    hw[jb] = keep;
    uint16_t *dwd = NULL;
    if (vm >= 0) {
        hw[(size_t)vm * H + rndi(H)] = LG_NAN_BF16;
        dwd = (uint16_t *)dup_to_dev("lm_head NaN masked", hw, 2, (size_t)V * H);
    }
    int *dam = (int *)dalloc("argmax", 4, n);
    int *capped = (int *)halloc((size_t)n * 4), *plain = (int *)halloc((size_t)n * 4), *got = (int *)halloc((size_t)n * 4);
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
        rel_acc a = {0, 0, 0, 0};
        verdict_keep(name, ok, &a, 1e-3);
    }
    case_end();
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
    printf("%s preconditions\n", ok ? "PASS" : "FAIL");
    if (ok) g_pass++; else g_fail++;
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
#define GRAPH_BF16(field, cnt, sd) hb = (uint16_t *)halloc((size_t)(cnt) * 2); fill_bf16(hb, (cnt), (sd)); g.field = (uint16_t *)dup_to_dev(#field, hb, 2, (cnt))
#define GRAPH_F32(field, cnt, sd) hf = (float *)halloc((size_t)(cnt) * 4); fill_f32(hf, (cnt), (sd)); g.field = (float *)dup_to_dev(#field, hf, 4, (cnt))
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
    hb = (uint16_t *)halloc((size_t)g.ld * 2);
    fill_bf16(hb, g.ld, 1.0f);
    g.att_q = (uint16_t *)dup_to_dev("att_q", hb, 2, g.ld);
    g.att_kv = (uint16_t *)dup_to_dev("att_kv", s.kv, 2, (size_t)s.nblocks * g.nkv * 16 * 128);
    g.tab = (int *)dup_to_dev("tables", s.tables, 4, s.max_bpr);
    g.req = (int *)dup_to_dev("row_req", s.row_req, 4, 1);
    g.pos = (int *)dup_to_dev("pos", s.pos, 4, 1);
    g.y = (uint16_t *)dalloc("y", 2, 8 * 1024);
    g.y2 = (uint16_t *)dalloc("y2", 2, 8 * 1000);
    g.rlog = (float *)dalloc("rlog", 4, 8 * 256);
    g.idx = (int *)dalloc("idx", 4, 8 * 8);
    g.rw = (float *)dalloc("rw", 4, 8 * 8);
    g.att_out = (uint16_t *)dalloc("att_out", 2, 128 * 64);
    g.logits = (float *)dalloc("logits", 4, 8 * 1000);
    g.am = (int *)dalloc("argmax", 4, 8);
    g.y3 = (uint16_t *)dalloc("y3", 2, 64 * 1024);
    g.logits3 = (float *)dalloc("logits3", 4, 64 * 1000);
    g.am3 = (int *)dalloc("argmax3", 4, 64);
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
    if (graph_ops(&g, &e)) { fail_line(name, e.msg); return; }
    if (!sync_ok()) { fail_line(name, "eager run failed"); return; }
    for (int i = 0; i < nout; i++) {
        outs[i].h = halloc(outs[i].bytes);
        to_host(outs[i].h, outs[i].d, outs[i].bytes);
        cudaMemset(outs[i].d, 0xFF, outs[i].bytes); /* poison before the replays */
    }
    /* captured */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t r = cudaStreamBeginCapture(g_st, cudaStreamCaptureModeGlobal);
    if (r != cudaSuccess) { fail_line(name, cudaGetErrorString(r)); return; }
    int rc = graph_ops(&g, &e);
    r = cudaStreamEndCapture(g_st, &graph);
    if (rc || r != cudaSuccess || !graph) {
        char why[1200];
        snprintf(why, sizeof why, "capture failed: %s / %s", rc ? e.msg : "launchers ok", cudaGetErrorString(r));
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        fail_line(name, why);
        return;
    }
    r = cudaGraphInstantiate(&exec, graph, 0);
    if (r == cudaSuccess) r = cudaGraphLaunch(exec, g_st);
    if (r == cudaSuccess) r = cudaGraphLaunch(exec, g_st);
    if (r != cudaSuccess) {
        if (exec) cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        fail_line(name, cudaGetErrorString(r));
        return;
    }
    int ok = sync_ok();
    for (int i = 0; ok && i < nout; i++) {
        void *h2 = halloc(outs[i].bytes);
        to_host(h2, outs[i].d, outs[i].bytes);
        if (outs[i].exact) {
            if (memcmp(h2, outs[i].h, outs[i].bytes)) { printf("  %s: graph replay differs from the eager run\n", outs[i].what); ok = 0; }
        } else {
            size_t cnt = outs[i].bytes / 2;
            float *f1 = (float *)halloc(cnt * 4), *f2 = (float *)halloc(cnt * 4);
            bf16_to_f32((const uint16_t *)outs[i].h, f1, cnt);
            bf16_to_f32((const uint16_t *)h2, f2, cnt);
            rel_acc a = {0, 0, 0, 0};
            rel_add(&a, f2, f1, cnt);
            if (a.nan || rel_val(&a) > 1e-6) { printf("  %s: graph replay rel %.3e from the eager run\n", outs[i].what, rel_val(&a)); ok = 0; }
        }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    rel_acc none = {0, 0, 0, 0};
    verdict(name, ok, &none, 1.0);
}

/* ------------------------------------------------------------------ timing (information only) */

static void info_mm_bandwidth(int n, int k, int m) {
    sm_err e = {""};
    uint16_t *hx = (uint16_t *)halloc((size_t)n * k * 2);
    fill_bf16(hx, (size_t)n * k, 1.0f);
    /* rotate 4 weight copies so the timing is not an L2 measurement */
    uint16_t *dx = (uint16_t *)dup_to_dev("x", hx, 2, (size_t)n * k), *dw[4];
    for (int i = 0; i < 4; i++) {
        dw[i] = (uint16_t *)dalloc("W", 2, (size_t)m * k);
        cudaMemset(dw[i], 0x3C, (size_t)m * k * 2); /* bf16 0x3C3C: finite, non-zero */
    }
    uint16_t *dy = (uint16_t *)dalloc("y", 2, (size_t)n * m);
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
    case_end();
}

/* ------------------------------------------------------------------ entry */

int gpu_test_kernels(void) {
    sm_err e = {""};
    g_pass = g_fail = 0;
    uint64_t seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)clock();
    if (!seed) seed = 1;
    g_rng = seed;
    printf("gpu_test_kernels: seed %llu\n", (unsigned long long)seed);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) { printf("FAIL kernels: no CUDA device\n"); return 1; }
    if (sm_cuda_ctx_init(&g_ctx, 0, 0, &e)) { printf("FAIL kernels: %s\n", e.msg); return 1; }
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
        for (int r = 0; r < 8; r++) { R64[r] = 8; P64[r] = rndi(3000); }
        for (int r = 0; r < 16; r++) { R128[r] = 8; P128[r] = rndi(2500); }
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
    sm_cuda_ctx_free(&g_ctx);
    printf("gpu_test_kernels: %d passed, %d failed\n", g_pass, g_fail);
    fflush(stdout);
    return g_fail;
}
