/* moe.cu: the `moe` group (moe_cases.h): the MoE expert stage (src/cuda/moe/moe.h) against the
 * CPU reference (its microbenchmark is bench/gpu/moe.cu).
 *
 * Cases: the device dequantizers against codec.h (every code x scale); W4A4's packed rounding
 * (moe_aq_round2) against codec.h's for every bf16 value x every bf16 amax; tiny / mini models
 * written by sm_make_model in each expert format, where ref_moe gives idx, w, h1 and m and the
 * GPU stage is fed the same idx, w, h1 (n = 1, 8, 16, 64, 128 rows); a real-width layer
 * (Hm = I = 4096) built in memory with random MXFP4 bytes (random routing, and every row on
 * the same K experts so experts carry more than 8 routes), FP8 and BF16 real-width experts,
 * extreme scale bytes (the exponent-offset path), an invalid expert id, a NaN scale refused
 * at upload, a CUDA-graph replay equal bit for bit to the direct launch, every L2-prefetch
 * setting and the other schedule of the expert matmul equal bit for bit to the default,
 * skewed routing (one expert on every row, several jobs of 8, beside experts of 1 route), a
 * 64-expert layer with every expert touched, synthetic layers (determinism), and the device
 * layout read back through the dequantizers (sm_cuda_moe_dequant) against the rows of a
 * make-model checkpoint, for its uploaded layers and for the layers sm_cuda_moe_synth makes
 * from the same seed (bit for bit: the synthesizer and make-model share src/model/rng.h).  W ranks
 * (test_shards, W = 2 and 4, EP and TP, MXFP4 / BF16 / FP8 layers of mini): each rank's shard
 * (sm_shard_make) uploaded with sm_cuda_moe_upload_shard and read back bit for bit against
 * its views, its forward_ep / forward_tp against the CPU rank's partial (ref_moe_group +
 * ref_moe_ffn on the shard's views, then ref_expert_norm + ref_route_sum for EP, as
 * cpu/layer.c does), and the rank-order sum of the partials (on the host) rounded (EP) or
 * through sm_cuda_moe_finalize (TP) against the single-rank GPU forward and the CPU m.  The
 * reference of the stage is its CPU op, ref_moe_experts (ref_moe's m for the made models).
 * Every output is poisoned with NaN before the run and has
 * guard elements on both sides; the bound is rel err <= 1e-2 over the tensor and, per element,
 * 5% of the reference + 5% of its RMS.  Inputs are fresh random per
 * run (the seed is printed).  We rejected comparing against a dequantized cuBLAS product:
 * it would share our own rounding assumptions instead of the reference's.
 */
#include "model/rng.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>
#include <algorithm>
#include <cuda_runtime.h>
extern "C" {
#include "base/err.h"
#include "model/config.h"
#include "model/weights.h"
#include "testing/makemodel.h"
#include "parallel/shard.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
}
#include "model/codec.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/mm.cuh"
#include "gpu_tests.h"
#include "harness.h"
#include "moe_cases.h"

sm_pool *m_pool;
cudaStream_t m_st;


uint64_t mrnd64(void) { return sm_rng_next(&gh_rng); } /* the one generator (rng.h) */
int mrndi(int n) { return (int)((mrnd64() >> 33) % (uint64_t)n); }
float mrndu(void) { return (float)((double)(mrnd64() >> 40) * (1.0 / 16777216.0)); } /* [0, 1) */
float mrndn(void) { /* N(0, 1) */
    float u1 = mrndu() + 1e-7f, u2 = mrndu();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}


void *xmalloc(size_t b) {
    void *p = malloc(b ? b : 1);
    if (!p) { printf("  host allocation of %zu bytes failed\n", b); exit(1); }
    return p;
}

/* Random routing of n rows: mode 0 distinct uniform top-K of E; mode 1 every row on experts
 * 0..K-1 in a shuffled order; mode 2 skewed: every row on expert 0 (n routes: several jobs of
 * 8), the other K-1 uniform (experts of 1 route beside it).  Weights positive, summing to 1
 * per row. */
void make_routing(int n, int E, int K, int mode, int *idx, float *w) {
    for (int i = 0; i < n; i++) {
        int *r = idx + i * K;
        for (int k = 0; k < K; k++) {
            int x;
            if (mode == 1 || (mode == 2 && k == 0)) x = k;
            else {
                for (;;) {
                    x = mrndi(E);
                    int dup = 0;
                    for (int j = 0; j < k; j++) dup |= r[j] == x;
                    if (!dup) break;
                }
            }
            r[k] = x;
        }
        if (mode == 1)
            for (int k = K - 1; k > 0; k--) { int j = mrndi(k + 1), t = r[k]; r[k] = r[j]; r[j] = t; }
        float s = 0.0f;
        for (int k = 0; k < K; k++) { w[i * K + k] = 0.1f + mrndu(); s += w[i * K + k]; }
        for (int k = 0; k < K; k++) w[i * K + k] /= s;
    }
}

/* ---- one GPU run compared with a reference m ---- */

int io_alloc(gpu_io *io, int max_rows, int Hm, int K) {
    memset(io, 0, sizeof *io);
    cudaError_t rc = cudaMalloc((void **)&io->h1, sizeof(uint16_t) * (size_t)max_rows * Hm);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&io->idx, sizeof(int) * (size_t)max_rows * K);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&io->w, sizeof(float) * (size_t)max_rows * K);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&io->mb, sizeof(uint16_t) * ((size_t)max_rows * Hm + 2 * MGUARD));
    if (rc != cudaSuccess) { printf("  cudaMalloc failed: %s\n", cudaGetErrorString(rc)); return -1; }
    return 0;
}
void io_free(gpu_io *io) {
    cudaFree(io->h1); cudaFree(io->idx); cudaFree(io->w); cudaFree(io->mb);
    memset(io, 0, sizeof *io);
}

/* Poison m_out with NaN (0xFFFF) and the guards with MGUARD_VAL. */
int io_poison(gpu_io *io, int n, int Hm) {
    size_t tot = (size_t)n * Hm + 2 * MGUARD;
    uint16_t *h = (uint16_t *)xmalloc(tot * 2);
    for (size_t i = 0; i < tot; i++) h[i] = (i < MGUARD || i >= tot - MGUARD) ? (uint16_t)MGUARD_VAL : (uint16_t)0xFFFFu;
    cudaError_t rc = cudaMemcpy(io->mb, h, tot * 2, cudaMemcpyHostToDevice);
    free(h);
    return rc == cudaSuccess ? 0 : -1;
}

/* Run forward (optionally through a captured graph); out [n*Hm] bf16 bits; guards checked. */
int run_gpu(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, gpu_io *io, int n, int graph, uint16_t *out,
                   int *guard_bad) {
    sm_err e = {{0}};
    const int Hm = L->Hm;
    if (io_poison(io, n, Hm)) { printf("  poison copy failed\n"); return -1; }
    if (graph) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        if (cudaStreamBeginCapture(m_st, cudaStreamCaptureModeGlobal) != cudaSuccess) { printf("  begin capture failed\n"); return -1; }
        int rc = sm_cuda_moe_forward(L, io->h1, io->idx, io->w, n, io->mb + MGUARD, ws, m_st, &e);
        cudaError_t ce = cudaStreamEndCapture(m_st, &g);
        if (rc || ce != cudaSuccess) { printf("  capture: %s %s\n", e.msg, cudaGetErrorString(ce)); return -1; }
        if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) { printf("  graph instantiate failed\n"); return -1; }
        ce = cudaGraphLaunch(ge, m_st);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(m_st);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        if (ce != cudaSuccess) { printf("  graph run: %s\n", cudaGetErrorString(ce)); return -1; }
    } else {
        if (sm_cuda_moe_forward(L, io->h1, io->idx, io->w, n, io->mb + MGUARD, ws, m_st, &e)) { printf("  forward: %s\n", e.msg); return -1; }
        cudaError_t ce = cudaStreamSynchronize(m_st);
        if (ce != cudaSuccess) { printf("  forward run: %s\n", cudaGetErrorString(ce)); return -1; }
    }
    size_t tot = (size_t)n * Hm + 2 * MGUARD;
    uint16_t *h = (uint16_t *)xmalloc(tot * 2);
    if (cudaMemcpy(h, io->mb, tot * 2, cudaMemcpyDeviceToHost) != cudaSuccess) { free(h); printf("  copy back failed\n"); return -1; }
    int gb = 0;
    for (size_t i = 0; i < MGUARD; i++) gb += (h[i] != MGUARD_VAL) + (h[tot - 1 - i] != MGUARD_VAL);
    memcpy(out, h + MGUARD, (size_t)n * Hm * 2);
    free(h);
    *guard_bad = gb;
    return 0;
}

/* Upload inputs, run, compare with mref [n, Hm]; with graph also replay through a graph and
 * require bitwise equality with the direct run.  keep: NULL, or host [n, Hm] that receives the
 * output's bf16 bits (zeros if the run failed). */
static void check_case(const char *name, const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, gpu_io *io, int n,
                       const float *h1, const int *idx, const float *w, const float *mref, int graph,
                       const float *mother = NULL, uint16_t *keep = NULL) {
    const int Hm = L->Hm, K = L->K;
    uint16_t *hb = (uint16_t *)xmalloc((size_t)n * Hm * 2);
    for (size_t i = 0; i < (size_t)n * Hm; i++) hb[i] = sm_f32_to_bf16(h1[i]);
    int ok = cudaMemcpy(io->h1, hb, (size_t)n * Hm * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(io->idx, idx, sizeof(int) * (size_t)n * K, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(io->w, w, sizeof(float) * (size_t)n * K, cudaMemcpyHostToDevice) == cudaSuccess;
    free(hb);
    uint16_t *out = (uint16_t *)xmalloc((size_t)n * Hm * 2), *out2 = (uint16_t *)xmalloc((size_t)n * Hm * 2);
    int gb = 0, gb2 = 0;
    if (ok && run_gpu(L, ws, io, n, 0, out, &gb)) ok = 0;
    double num = 0.0, den = 0.0;
    long nan = 0;
    if (ok) {
        for (size_t i = 0; i < (size_t)n * Hm; i++) {
            float g = sm_bf16_to_f32(out[i]);
            if (g != g) { nan++; continue; }
            double d = (double)g - mref[i];
            num += d * d;
            den += (double)mref[i] * mref[i];
        }
    }
    double rel = den > 0 ? sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
    int same = 1, vsame = 1;
    if (ok && graph) {
        if (run_gpu(L, ws, io, n, 1, out2, &gb2)) ok = 0;
        else same = !memcmp(out, out2, (size_t)n * Hm * 2);
    }
    /* every L2 prefetch distance, at any rows, gives the same bits as the default one (the
     * layers that prefetch: moe.h) */
    static const int pfs[3] = {0, 2, 8};
    for (int vi = 0; ok && sm_cuda_moe_kfmt(L) == MOE_F_MX8 && vi < 3; vi++) {
        const int v = pfs[vi];
        if (v == ws->prefetch) continue;
        sm_cuda_moe_ws wv = *ws;
        wv.prefetch = v;
        wv.prefetch_rows = ws->max_rows;
        int gv = 0;
        if (run_gpu(L, &wv, io, n, 0, out2, &gv) || gv) { ok = 0; break; }
        if (memcmp(out, out2, (size_t)n * Hm * 2)) { printf("  prefetch %d differs from prefetch %d\n", v, ws->prefetch); vsame = 0; }
    }
    /* the other schedule of the expert matmul gives the same bits as the workspace's */
    int ssame = 1;
    if (ok) {
        sm_cuda_moe_ws wv = *ws;
        wv.sched = ws->sched == SM_MOE_SCHED_QUEUE ? SM_MOE_SCHED_STAGES : SM_MOE_SCHED_QUEUE;
        int gv = 0;
        if (run_gpu(L, &wv, io, n, 0, out2, &gv) || gv) ok = 0;
        else if (memcmp(out, out2, (size_t)n * Hm * 2)) { printf("  schedule %d differs from schedule %d\n", wv.sched, ws->sched); ssame = 0; }
    }
    /* per element: every output written (no NaN left of the poison) and within
     * 5% of the reference + 5% of the reference's RMS (a wrong element fails even when the
     * whole-tensor error is small) */
    long far = 0;
    if (ok && den > 0) {
        const double rms = sqrt(den / (double)((size_t)n * Hm));
        for (size_t i = 0; i < (size_t)n * Hm; i++) {
            const float g = sm_bf16_to_f32(out[i]);
            far += !(fabs((double)g - mref[i]) <= 0.05 * fabs((double)mref[i]) + 0.05 * rms);
        }
    }
    /* mother: the reference of the other activation numerics (W4A16 for a W4A4 layer): the
     * GPU must be at least 10x nearer its own reference than that one */
    double rel_other = 1.0;
    if (ok && mother) {
        double no = 0.0, dn = 0.0;
        for (size_t i = 0; i < (size_t)n * Hm; i++) {
            const double d = (double)sm_bf16_to_f32(out[i]) - mother[i];
            no += d * d;
            dn += (double)mother[i] * mother[i];
        }
        rel_other = dn > 0 ? sqrt(no / dn) : 1.0;
    }
    int pass = ok && nan == 0 && gb == 0 && gb2 == 0 && rel <= 1e-2 && same && vsame && ssame && far == 0 && den > 0 &&
               (!mother || rel_other > 10 * rel);
    char full[256];
    if (mother) snprintf(full, sizeof full, "%s n=%d rel=%.2e (vs the other numerics %.2e)%s", name, n, rel, rel_other,
                         graph ? " +graph" : "");
    else snprintf(full, sizeof full, "%s n=%d rel=%.2e%s", name, n, rel, graph ? " +graph" : "");
    if (!pass) {
        printf("  %s: ok %d nan %ld guard %d/%d rel %.3e graph-equal %d prefetch-variants-equal %d schedules-equal %d "
               "elements-out-of-bound %ld\n",
               name, ok, nan, gb, gb2, rel, same, vsame, ssame, far);
        if (ok) {
            int shown = 0;
            for (size_t i = 0; i < (size_t)n * Hm && shown < 6; i++) {
                float g = sm_bf16_to_f32(out[i]);
                if (!(fabsf(g - mref[i]) <= 2e-2f * (fabsf(mref[i]) + 1e-3f))) {
                    printf("    m[%zu, %zu] gpu %g ref %g\n", i / Hm, i % Hm, g, mref[i]);
                    shown++;
                }
            }
        }
    }
    gh_result(pass, "%s", full);
    if (keep) {
        if (ok) memcpy(keep, out, (size_t)n * Hm * 2);
        else memset(keep, 0, (size_t)n * Hm * 2);
    }
    free(out);
    free(out2);
}

/* ---- models written by sm_make_model, reference ref_moe ---- */
static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *en;
        char p[1024];
        while ((en = readdir(d))) {
            if (!strcmp(en->d_name, ".") || !strcmp(en->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, en->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* A model of preset written by sm_make_model (experts fmt, seed) into a fresh temporary
 * directory and loaded; 0, or -1 with the reason printed (nothing left behind). */

int made_model_open(made_model *mm, const char *preset, int fmt, uint64_t seed) {
    sm_err e = {{0}};
    memset(mm, 0, sizeof *mm);
    if (sm_config_preset(preset, &mm->c, &e)) { printf("  %s\n", e.msg); return -1; }
    const char *tmp = getenv("TMPDIR");
    snprintf(mm->base, sizeof mm->base, "%s/sm_moe_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(mm->base)) { printf("  mkdtemp failed\n"); return -1; }
    snprintf(mm->dir, sizeof mm->dir, "%s/model", mm->base);
    sm_make_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.experts = (sm_expert_fmt)fmt;
    mo.seed = seed;
    mo.shards = 1;
    if (sm_make_model(&mm->c, &mo, mm->dir, &e) || sm_model_load(mm->dir, NULL, &mm->m, &e)) {
        printf("  %s\n", e.msg);
        rm_tree(mm->dir); rmdir(mm->base);
        return -1;
    }
    return 0;
}
void made_model_close(made_model *mm) {
    sm_model_free(&mm->m);
    rm_tree(mm->dir);
    rmdir(mm->base);
}

static void test_made_model(const char *preset, int fmt, int w4a4 = 0) {
    sm_err e = {{0}};
    char name[128];
    snprintf(name, sizeof name, "moe_%s_%s%s", preset, sm_expert_fmt_name((sm_expert_fmt)fmt), w4a4 ? "_w4a4" : "");
    made_model mm;
    if (made_model_open(&mm, preset, fmt, mrnd64())) { gh_result(0, "%s", name); return; }
    const sm_config c = mm.c;
    sm_model *m = &mm.m;
    m->layers[1].ex.act_mx = w4a4 && fmt == SM_EXP_MXFP4; /* the upload and ref_moe read it */
    const int maxr = 128, rows[5] = {1, 8, 16, 64, 128};
    sm_cuda_moe_ws ws;
    gpu_io io;
    if (sm_cuda_moe_ws_alloc(&c, maxr, &ws, &e) || io_alloc(&io, maxr, c.Hm, c.K)) {
        printf("  %s\n", e.msg);
        gh_result(0, "%s", name);
        made_model_close(&mm);
        return;
    }
    /* layer 1 holds the chosen format; layer 0 the BF16 experts of a quantized export */
    const int nl = fmt == SM_EXP_MXFP4 ? 2 : 1;
    for (int li = 0; li < nl; li++) {
        const int l = li == 0 ? 1 : 0;
        sm_cuda_moe_layer L;
        if (sm_cuda_moe_upload(m, l, &L, m_st, &e)) { printf("  upload: %s\n", e.msg); gh_result(0, "%s", name); continue; }
        for (int ri = 0; ri < 5; ri++) {
            const int n = rows[ri];
            float *xf = (float *)xmalloc(sizeof(float) * (size_t)n * c.H);
            float *f = (float *)xmalloc(sizeof(float) * (size_t)n * c.H);
            float *h1 = (float *)xmalloc(sizeof(float) * (size_t)n * c.Hm);
            float *mref = (float *)xmalloc(sizeof(float) * (size_t)n * c.Hm);
            float *w = (float *)xmalloc(sizeof(float) * (size_t)n * c.K);
            int *idx = (int *)xmalloc(sizeof(int) * (size_t)n * c.K);
            for (size_t i = 0; i < (size_t)n * c.H; i++) xf[i] = sm_r16(mrndn());
            ref_moe(m_pool, m, l, xf, n, f, idx, w, h1, mref);
            float *mo = NULL; /* W4A4: the W4A16 m of the same inputs */
            if (m->layers[l].ex.act_mx) {
                mo = (float *)xmalloc(sizeof(float) * (size_t)n * c.Hm);
                m->layers[l].ex.act_mx = 0;
                if (ref_moe_experts(m_pool, m, l, h1, idx, w, n, mo, &e)) printf("  reference: %s\n", e.msg);
                m->layers[l].ex.act_mx = 1;
            }
            char cn[200];
            snprintf(cn, sizeof cn, "%s layer%d(%s%s)", name, l, sm_expert_fmt_name(m->layers[l].ex.fmt),
                     m->layers[l].ex.act_mx ? " W4A4" : "");
            check_case(cn, &L, &ws, &io, n, h1, idx, w, mref, ri == 1, mo);
            free(mo);
            free(xf); free(f); free(h1); free(mref); free(w); free(idx);
        }
        sm_cuda_moe_free(&L);
    }
    io_free(&io);
    sm_cuda_moe_ws_free(&ws);
    made_model_close(&mm);
}

/* ---- device layout read back vs the checkpoint; synthetic layers vs make-model ---- */
/* Every row of matrix mat of expert x of device layer L, read back through the dequantizers
 * (out poisoned with NaN first), against sm_expert_row of layer l of m, bit for bit; returns
 * the mismatching values (the first few printed), or -1 on a CUDA error. */
static long cmp_expert(const char *what, const sm_cuda_moe_layer *L, const sm_model *m, int l, int x, int mat, float *dout,
                       float *hout, float *ref) {
    sm_err e = {{0}};
    const int R = mat ? L->Hm : 2 * L->I, K = mat ? L->I : L->Hm;
    const size_t nb = sizeof(float) * (size_t)R * K;
    if (cudaMemsetAsync(dout, 0xFF, nb, m_st) != cudaSuccess || sm_cuda_moe_dequant(L, x, mat, dout, m_st, &e) ||
        cudaMemcpyAsync(hout, dout, nb, cudaMemcpyDeviceToHost, m_st) != cudaSuccess || cudaStreamSynchronize(m_st) != cudaSuccess) {
        printf("  %s readback: %s %s\n", what, e.msg, cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    long bad = 0;
    for (int r = 0; r < R; r++) {
        sm_expert_row(m, l, x, mat, r, ref);
        for (int k = 0; k < K; k++) {
            const float g = hout[(size_t)r * K + k];
            if (!memcmp(&g, &ref[k], sizeof g)) continue;
            if (bad < 4)
                printf("  %s layer %d expert %d %s [%d, %d]: device %g checkpoint %g\n", what, l, x, mat ? "down" : "gate_up", r, k, g,
                       ref[k]);
            bad++;
        }
    }
    return bad;
}

/* A make-model checkpoint of a fresh seed in format fmt: its uploaded layers, and the layers
 * sm_cuda_moe_synth makes from the same seed, hold the checkpoint's expert values bit for bit
 * (layer 1: fmt, layer 0: BF16; experts 0, E/2, E-1, both matrices, every row), and the
 * synthetic eff(post_expert_norm) equals the loaded one. */
static void test_synth_equals_made(const char *preset, int fmt) {
    char nu[128], ns[128];
    snprintf(nu, sizeof nu, "moe_upload_readback_equals_checkpoint %s %s", preset, sm_expert_fmt_name((sm_expert_fmt)fmt));
    snprintf(ns, sizeof ns, "moe_synth_equals_make_model %s %s", preset, sm_expert_fmt_name((sm_expert_fmt)fmt));
    const uint64_t seed = mrnd64();
    made_model mm;
    if (made_model_open(&mm, preset, fmt, seed)) { gh_result(0, "%s", nu); gh_result(0, "%s", ns); return; }
    const sm_config *c = &mm.c;
    const size_t most = (size_t)2 * c->I * c->Hm; /* values of the larger matrix */
    const int cols = std::max(c->Hm, c->I); /* longest row */
    float *dout = NULL, *hout = (float *)xmalloc(sizeof(float) * most), *ref = (float *)xmalloc(sizeof(float) * (size_t)cols);
    float *pn = (float *)xmalloc(sizeof(float) * (size_t)c->Hm);
    long badu = cudaMalloc((void **)&dout, sizeof(float) * most) == cudaSuccess ? 0 : -1, bads = badu, badx = badu;
    const int xs[3] = {0, c->E / 2, c->E - 1};
    for (int l = 0; l < 2 && badu >= 0 && bads >= 0; l++) {
        sm_err e = {{0}};
        sm_cuda_moe_layer U, S;
        if (sm_cuda_moe_upload(&mm.m, l, &U, m_st, &e)) { printf("  upload: %s\n", e.msg); badu = -1; break; }
        if (sm_cuda_moe_synth(c, l, (int)mm.m.layers[l].ex.fmt, seed, &S, m_st, &e)) {
            printf("  synth: %s\n", e.msg);
            sm_cuda_moe_free(&U);
            bads = -1;
            break;
        }
        for (int xi = 0; xi < 3; xi++)
            for (int mat = 0; mat < 2; mat++) {
                const long u = cmp_expert("upload", &U, &mm.m, l, xs[xi], mat, dout, hout, ref);
                const long v = cmp_expert("synth", &S, &mm.m, l, xs[xi], mat, dout, hout, ref);
                badu = u < 0 || badu < 0 ? -1 : badu + u;
                bads = v < 0 || bads < 0 ? -1 : bads + v;
            }
        /* MXFP4: the codes moved to the e4m3 placement (W4A4 on the FP8 tensor cores) and back
         * read the same, through that placement's own converter */
        for (int v = 1; v >= 0 && U.fmt == SM_EXP_MXFP4 && badx >= 0; v--) {
            if (sm_cuda_moe_set_acts(&U, v, 1, m_st, &e) || U.x8 != v) {
                printf("  set acts %d: x8 %d %s\n", v, U.x8, e.msg);
                badx = -1;
                break;
            }
            for (int xi = 0; xi < 3; xi++)
                for (int mat = 0; mat < 2; mat++) {
                    const long u = cmp_expert(v ? "e4m3 placement" : "placement round trip", &U, &mm.m, l, xs[xi], mat, dout, hout, ref);
                    badx = u < 0 || badx < 0 ? -1 : badx + u;
                }
        }
        if (cudaMemcpy(pn, S.post_norm, sizeof(float) * (size_t)c->Hm, cudaMemcpyDeviceToHost) != cudaSuccess) bads = -1;
        else if (memcmp(pn, mm.m.layers[l].post_expert_norm, sizeof(float) * (size_t)c->Hm)) {
            printf("  synth layer %d: eff(post_expert_norm) differs from the checkpoint's\n", l);
            if (bads >= 0) bads++;
        }
        sm_cuda_moe_free(&U);
        sm_cuda_moe_free(&S);
    }
    if (badu || bads) printf("  seed %llu: %ld upload / %ld synth mismatches (-1: error)\n", (unsigned long long)seed, badu, bads);
    gh_result(badu == 0, "%s", nu);
    gh_result(bads == 0, "%s", ns);
    if (fmt == SM_EXP_MXFP4) {
        if (badx) printf("  seed %llu: %ld e4m3-placement mismatches (-1: error)\n", (unsigned long long)seed, badx);
        gh_result(badx == 0, "moe_x8_placement_readback_equals_checkpoint %s", preset);
    }
    cudaFree(dout);
    free(hout); free(ref); free(pn);
    made_model_close(&mm);
}

/* ---- layers built in memory (real widths), reference ref_moe_experts ---- */
typedef struct mem_layer {
    sm_model m;
    sm_layer layer;
    const void **ptrs;   /* [4][E]: gu, gus, dn, dns */
    void **owned;        /* [4][E] */
    float *pn;           /* [Hm] */
} mem_layer;

/* Random experts: MXFP4 codes uniform, scale bytes in [s_lo, s_hi]; FP8 N(0, 1/fan_in)
 * quantized with a per-row scale amax/448; BF16 N(0, 1/fan_in). */
static void mem_layer_make(mem_layer *ml, int fmt, int Hm, int I, int E, int K, int s_lo, int s_hi) {
    memset(ml, 0, sizeof *ml);
    sm_config *c = &ml->m.cfg;
    c->L = 1; c->Hm = Hm; c->I = I; c->E = E; c->K = K; c->H = Hm;
    c->post_eps = 1e-8f; c->rms_eps = 1e-5f; c->route_scale = 1.0f;
    ml->m.layers = &ml->layer;
    ml->layer.ex.fmt = (sm_expert_fmt)fmt;
    ml->ptrs = (const void **)xmalloc(sizeof(void *) * 4 * (size_t)E);
    ml->owned = (void **)xmalloc(sizeof(void *) * 4 * (size_t)E);
    memset(ml->owned, 0, sizeof(void *) * 4 * (size_t)E);
    for (int x = 0; x < E; x++) {
        for (int mat = 0; mat < 2; mat++) {
            const int R = mat ? Hm : 2 * I, Kc = mat ? I : Hm;
            void *wv = NULL, *sv = NULL;
            if (fmt == SM_EXP_MXFP4) {
                uint8_t *q = (uint8_t *)xmalloc((size_t)R * Kc / 2), *s = (uint8_t *)xmalloc((size_t)R * (Kc / 32));
                for (size_t i = 0; i < (size_t)R * Kc / 2; i += 8) {
                    uint64_t r = mrnd64();
                    memcpy(q + i, &r, 8);
                }
                for (size_t i = 0; i < (size_t)R * (Kc / 32); i++) s[i] = (uint8_t)(s_lo + mrndi(s_hi - s_lo + 1));
                wv = q; sv = s;
            } else if (fmt == SM_EXP_FP8) {
                uint8_t *q = (uint8_t *)xmalloc((size_t)R * Kc);
                float *s = (float *)xmalloc(sizeof(float) * (size_t)R), *row = (float *)xmalloc(sizeof(float) * (size_t)Kc);
                const float sd = 1.0f / sqrtf((float)Kc);
                for (int r = 0; r < R; r++) {
                    float amax = 0.0f;
                    for (int k = 0; k < Kc; k++) { row[k] = sd * mrndn(); amax = fmaxf(amax, fabsf(row[k])); }
                    s[r] = amax > 0 ? amax / 448.0f : 1.0f;
                    for (int k = 0; k < Kc; k++) q[(size_t)r * Kc + k] = sm_f32_to_e4m3(row[k] / s[r]);
                }
                free(row);
                wv = q; sv = s;
            } else {
                uint16_t *q = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)R * Kc);
                const float sd = 1.0f / sqrtf((float)Kc);
                for (size_t i = 0; i < (size_t)R * Kc; i++) q[i] = sm_f32_to_bf16(sd * mrndn());
                wv = q;
            }
            ml->owned[(2 * mat) * E + x] = wv;
            ml->owned[(2 * mat + 1) * E + x] = sv;
            ml->ptrs[(2 * mat) * E + x] = wv;
            ml->ptrs[(2 * mat + 1) * E + x] = sv;
        }
    }
    ml->layer.ex.gu = ml->ptrs;
    ml->layer.ex.gus = ml->ptrs + E;
    ml->layer.ex.dn = ml->ptrs + 2 * E;
    ml->layer.ex.dns = ml->ptrs + 3 * E;
    ml->pn = (float *)xmalloc(sizeof(float) * (size_t)Hm);
    for (int i = 0; i < Hm; i++) ml->pn[i] = sm_r16(1.0f + 0.05f * mrndn());
    ml->layer.post_expert_norm = ml->pn;
}
static void mem_layer_free(mem_layer *ml) {
    for (int i = 0; i < 4 * ml->m.cfg.E; i++) free(ml->owned[i]);
    free(ml->owned); free(ml->ptrs); free(ml->pn);
    memset(ml, 0, sizeof *ml);
}

/* One in-memory layer, several (rows, routing mode) cases; bad_route: make route 0 invalid. */
static void test_mem(const char *name, int fmt, int Hm, int I, int E, int K, int s_lo, int s_hi, const int *rows,
                     const int *modes, int ncase, int bad_route, int w4a4 = 0) {
    sm_err e = {{0}};
    mem_layer ml;
    mem_layer_make(&ml, fmt, Hm, I, E, K, s_lo, s_hi);
    ml.layer.ex.act_mx = w4a4;
    int maxr = 1;
    for (int i = 0; i < ncase; i++) maxr = std::max(maxr, rows[i]);
    sm_cuda_moe_layer L;
    sm_cuda_moe_ws ws;
    gpu_io io;
    if (sm_cuda_moe_upload(&ml.m, 0, &L, m_st, &e)) { printf("  upload: %s\n", e.msg); gh_result(0, "%s", name); mem_layer_free(&ml); return; }
    if (sm_cuda_moe_ws_alloc(&ml.m.cfg, maxr, &ws, &e) || io_alloc(&io, maxr, Hm, K)) {
        printf("  %s\n", e.msg); gh_result(0, "%s", name); sm_cuda_moe_free(&L); mem_layer_free(&ml); return;
    }
    for (int ci = 0; ci < ncase; ci++) {
        const int n = rows[ci];
        float *h1 = (float *)xmalloc(sizeof(float) * (size_t)n * Hm), *mref = (float *)xmalloc(sizeof(float) * (size_t)n * Hm);
        float *w = (float *)xmalloc(sizeof(float) * (size_t)n * K);
        int *idx = (int *)xmalloc(sizeof(int) * (size_t)n * K);
        for (size_t i = 0; i < (size_t)n * Hm; i++) h1[i] = sm_r16(mrndn());
        make_routing(n, E, K, modes[ci], idx, w);
        if (bad_route) idx[0] = E; /* out of range: contributes nothing */
        if (ref_moe_experts(m_pool, &ml.m, 0, h1, idx, w, n, mref, &e)) {
            printf("  reference: %s\n", e.msg);
            for (size_t i = 0; i < (size_t)n * Hm; i++) mref[i] = NAN;
        }
        float *mo = NULL; /* W4A4: the W4A16 m of the same inputs */
        if (w4a4) {
            mo = (float *)xmalloc(sizeof(float) * (size_t)n * Hm);
            ml.layer.ex.act_mx = 0;
            if (ref_moe_experts(m_pool, &ml.m, 0, h1, idx, w, n, mo, &e)) printf("  reference: %s\n", e.msg);
            ml.layer.ex.act_mx = 1;
        }
        /* W4A4: on the FP8 tensor cores, then with bf16 products: mm4 both, the same bits */
        uint16_t *keep[2] = {NULL, NULL};
        int ran[2] = {0, 0};
        for (int fp8 = 1; fp8 >= 0 && (fp8 || w4a4); fp8--) {
            if (w4a4 && sm_cuda_moe_set_acts(&L, 1, fp8, m_st, &e)) { printf("  set acts: %s\n", e.msg); gh_result(0, "%s", name); continue; }
            char cn[200];
            snprintf(cn, sizeof cn, "%s%s E=%d K=%d routing=%s", name, !w4a4 ? "" : L.x8 ? " fp8-mma" : " bf16-mma", E, K,
                     modes[ci] == 2 ? "skewed" : modes[ci] ? "same-experts" : "random");
            if (w4a4) keep[fp8] = (uint16_t *)xmalloc((size_t)n * Hm * 2);
            check_case(cn, &L, &ws, &io, n, h1, idx, w, mref, ci == 0, mo, keep[fp8]);
            ran[fp8] = w4a4 && (L.x8 != 0) == fp8;
        }
        if (ran[0] && ran[1]) /* a layer the FP8 path can take: both paths ran */
            gh_result(!memcmp(keep[0], keep[1], (size_t)n * Hm * 2), "%s W4A4 bf16-mma == fp8-mma bits E=%d K=%d n=%d", name, E, K, n);
        free(keep[0]); free(keep[1]);
        free(h1); free(mref); free(w); free(idx); free(mo);
    }
    io_free(&io);
    sm_cuda_moe_ws_free(&ws);
    sm_cuda_moe_free(&L);
    mem_layer_free(&ml);
}

static void test_selfcheck(void) {
    sm_err e = {{0}};
    int bad = sm_cuda_moe_selfcheck(m_st, &e);
    if (bad) printf("  selfcheck: %d mismatches %s\n", bad, e.msg);
    gh_result(bad == 0, "%s", "moe_dequant_selfcheck");
}

/* Errors: a NaN scale byte is refused at upload naming the tensor; too many rows refused. */
static void test_errors(void) {
    sm_err e = {{0}};
    mem_layer ml;
    mem_layer_make(&ml, SM_EXP_MXFP4, 256, 256, 4, 2, 118, 122);
    ((uint8_t *)ml.owned[3 * 4 + 2])[17] = 0xFF; /* expert 2 down scales */
    sm_cuda_moe_layer L;
    int rc = sm_cuda_moe_upload(&ml.m, 0, &L, m_st, &e);
    int ok = rc == -1 && strstr(e.msg, "expert 2") && strstr(e.msg, "down_proj") && strstr(e.msg, "0xFF");
    if (!ok) printf("  NaN scale: rc %d msg '%s'\n", rc, e.msg);
    gh_result(ok, "%s", "moe_upload_refuses_nan_scale");
    ((uint8_t *)ml.owned[3 * 4 + 2])[17] = 120;
    sm_cuda_moe_ws ws;
    ok = 0;
    if (!sm_cuda_moe_upload(&ml.m, 0, &L, m_st, &e) && !sm_cuda_moe_ws_alloc(&ml.m.cfg, 4, &ws, &e)) {
        e.msg[0] = 0;
        rc = sm_cuda_moe_forward(&L, (const uint16_t *)ws.buf, (const int *)ws.buf, (const float *)ws.buf, 5,
                                 (uint16_t *)ws.buf, &ws, m_st, &e);
        ok = rc == -1 && strstr(e.msg, "max_rows") != NULL;
        if (!ok) printf("  too many rows: rc %d msg '%s'\n", rc, e.msg);
        int rc0 = sm_cuda_moe_forward(&L, NULL, NULL, NULL, 0, NULL, &ws, m_st, &e);
        if (rc0) { printf("  n = 0: %s\n", e.msg); ok = 0; }
        sm_cuda_moe_ws_free(&ws);
        sm_cuda_moe_free(&L);
    } else {
        printf("  %s\n", e.msg);
    }
    gh_result(ok, "%s", "moe_forward_refuses_too_many_rows");
    mem_layer_free(&ml);
    /* W4A4 on the FP8 tensor cores only where its row factor is exact: scale bytes 0..140 in
     * one matrix (offset c = 12, stored bytes from 114) keep bf16 products; W4A4 on FP8 experts
     * is refused */
    mem_layer_make(&ml, SM_EXP_MXFP4, 256, 256, 4, 2, 0, 140);
    ml.layer.ex.act_mx = 1;
    ok = 0;
    if (!sm_cuda_moe_upload(&ml.m, 0, &L, m_st, &e)) {
        ok = sm_cuda_moe_set_acts(&L, 1, 1, m_st, &e) == 0 && L.act_mx == 1 && L.x8_ok == 0 && L.x8 == 0;
        if (!ok) printf("  scales 0..140: act_mx %d x8_ok %d x8 %d\n", L.act_mx, L.x8_ok, L.x8);
        sm_cuda_moe_free(&L);
    } else {
        printf("  scales 0..140: %s\n", e.msg);
    }
    gh_result(ok, "%s", "moe_x8_kept_off_where_inexact");
    mem_layer_free(&ml);
    mem_layer_make(&ml, SM_EXP_FP8, 256, 256, 4, 2, 0, 0);
    ok = 0;
    if (!sm_cuda_moe_upload(&ml.m, 0, &L, m_st, &e)) {
        e.msg[0] = 0;
        ok = sm_cuda_moe_set_acts(&L, 1, 1, m_st, &e) == -1 && strstr(e.msg, "MXFP4") && L.act_mx == 0;
        if (!ok) printf("  W4A4 on FP8 experts: '%s'\n", e.msg);
        sm_cuda_moe_free(&L);
    }
    gh_result(ok, "%s", "moe_set_acts_refuses_w4a4_on_fp8");
    mem_layer_free(&ml);
}

/* moe_aq_round2 (stage 1's W4A4 epilogue, bf16x2) against sm_mx_round_value under
 * sm_mx_scale_byte (codec.h, checked on the CPU by tests/test_w4a4.c), bit for bit: thread
 * (a, x) rounds x under amax a in the low half and another pair in the high half (amax
 * 3a + 1, value x ^ 0x8055), over every non-negative bf16 amax (inf and NaN included) and
 * every bf16 value.  bad[0] counts mismatches, bad[1..3] the first (amax, value, got). */
__device__ __forceinline__ uint16_t aq_want(uint16_t x, uint16_t a) {
    return sm_tobf(sm_mx_round_value(sm_bf(x), sm_mx_scale_byte(sm_bf(a))));
}
__global__ void aq_round2_sweep(unsigned *bad) {
    const uint64_t n = (uint64_t)0x8000 << 16;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint16_t a = (uint16_t)(i >> 16), x = (uint16_t)i, a2 = (uint16_t)((3u * a + 1u) & 0x7FFFu), x2 = x ^ 0x8055u;
        const uint32_t r = moe_aq_round2(x | ((uint32_t)x2 << 16), a | ((uint32_t)a2 << 16));
        const int lo = (uint16_t)r != aq_want(x, a), hi = (uint16_t)(r >> 16) != aq_want(x2, a2);
        if (lo || hi) {
            if (atomicAdd(bad, 1u) == 0) { bad[1] = lo ? a : a2; bad[2] = lo ? x : x2; bad[3] = lo ? (r & 0xFFFFu) : (r >> 16); }
        }
    }
}
static void test_aq_round2(void) {
    unsigned *d = NULL, h[4] = {0, 0, 0, 0};
    int ok = cudaMalloc(&d, sizeof h) == cudaSuccess && cudaMemsetAsync(d, 0, sizeof h, m_st) == cudaSuccess;
    if (ok) aq_round2_sweep<<<1024, 256, 0, m_st>>>(d);
    ok = ok && cudaStreamSynchronize(m_st) == cudaSuccess && cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess;
    if (!ok) printf("  aq_round2: %s\n", cudaGetErrorString(cudaGetLastError()));
    if (h[0]) printf("  aq_round2: %u mismatches; first amax 0x%04x value 0x%04x: got 0x%04x, want 0x%04x\n", h[0], h[1], h[2], h[3],
                     (unsigned)sm_f32_to_bf16(sm_mx_round_value(sm_bf16_to_f32((uint16_t)h[2]), sm_mx_scale_byte(sm_bf16_to_f32((uint16_t)h[1])))));
    gh_result(ok && h[0] == 0, "%s", "moe_w4a4_round2_every_value_and_amax");
    if (d) cudaFree(d);
}

/* Synthetic layers: same seed -> same bits; every format finite. */
static void test_synth(void) {
    sm_err e = {{0}};
    sm_config c;
    if (sm_config_preset("mini", &c, &e)) { printf("  %s\n", e.msg); gh_result(0, "%s", "moe_synth"); return; }
    const int n = 16;
    gpu_io io;
    sm_cuda_moe_ws ws;
    if (sm_cuda_moe_ws_alloc(&c, n, &ws, &e) || io_alloc(&io, n, c.Hm, c.K)) { printf("  %s\n", e.msg); gh_result(0, "%s", "moe_synth"); return; }
    uint16_t *hb = (uint16_t *)xmalloc((size_t)n * c.Hm * 2);
    for (size_t i = 0; i < (size_t)n * c.Hm; i++) hb[i] = sm_f32_to_bf16(mrndn());
    int *idx = (int *)xmalloc(sizeof(int) * (size_t)n * c.K);
    float *w = (float *)xmalloc(sizeof(float) * (size_t)n * c.K);
    make_routing(n, c.E, c.K, 0, idx, w);
    cudaMemcpy(io.h1, hb, (size_t)n * c.Hm * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(io.idx, idx, sizeof(int) * (size_t)n * c.K, cudaMemcpyHostToDevice);
    cudaMemcpy(io.w, w, sizeof(float) * (size_t)n * c.K, cudaMemcpyHostToDevice);
    uint16_t *o[2];
    o[0] = (uint16_t *)xmalloc((size_t)n * c.Hm * 2);
    o[1] = (uint16_t *)xmalloc((size_t)n * c.Hm * 2);
    const int fmts[4] = {SM_EXP_MXFP4, SM_EXP_MXFP4, SM_EXP_FP8, SM_EXP_BF16};
    int ok = 1;
    for (int v = 0; v < 4; v++) {
        sm_cuda_moe_layer L;
        if (sm_cuda_moe_synth(&c, 3, fmts[v], 42, &L, m_st, &e)) { printf("  synth: %s\n", e.msg); ok = 0; continue; }
        uint16_t *out = o[v == 1 ? 1 : 0];
        int gb = 0;
        if (run_gpu(&L, &ws, &io, n, 0, out, &gb) || gb) ok = 0;
        double ss = 0;
        for (size_t i = 0; i < (size_t)n * c.Hm; i++) {
            float f = sm_bf16_to_f32(out[i]);
            if (f != f) { ok = 0; break; }
            ss += (double)f * f;
        }
        /* rows of unit-RMS routes weighted to 1: mean square near 1/K .. 1 */
        if (!(ss > 1e-3 * n * c.Hm)) { printf("  synth %s: output energy %g\n", sm_expert_fmt_name((sm_expert_fmt)fmts[v]), ss); ok = 0; }
        if (v == 1 && memcmp(o[0], o[1], (size_t)n * c.Hm * 2)) { printf("  synth: same seed gave different outputs\n"); ok = 0; }
        sm_cuda_moe_free(&L);
    }
    gh_result(ok, "%s", "moe_synth_deterministic_and_finite");
    free(o[0]); free(o[1]); free(hb); free(idx); free(w);
    io_free(&io);
    sm_cuda_moe_ws_free(&ws);
}

extern "C" int gpu_test_moe(void) {
    gh_reset();
    gh_seed("gpu_test_moe");
    sm_err e = {{0}};
    if (sm_pool_create(0, &m_pool, &e)) { printf("  pool: %s\n", e.msg); m_pool = NULL; }
    if (cudaStreamCreate(&m_st) != cudaSuccess) { printf("FAIL moe stream\n"); return 1; }
    test_selfcheck();
    test_aq_round2();
    test_errors();
    test_made_model("tiny", SM_EXP_MXFP4);
    test_made_model("mini", SM_EXP_MXFP4);
    test_made_model("tiny", SM_EXP_MXFP4, 1);
    test_made_model("mini", SM_EXP_MXFP4, 1);
    test_made_model("mini", SM_EXP_FP8);
    test_made_model("mini", SM_EXP_BF16);
    {
        const int rows[5] = {1, 8, 16, 64, 128}, modes[5] = {0, 0, 1, 1, 2};
        test_mem("moe_real_mxfp4", SM_EXP_MXFP4, 4096, 4096, 16, 8, 116, 121, rows, modes, 5, 0);
        test_mem("moe_real_mxfp4_w4a4", SM_EXP_MXFP4, 4096, 4096, 16, 8, 116, 121, rows, modes, 5, 0, 1);
    }
    {
        /* many experts: most with 1 route, one with 100+, every expert touched at 128 rows */
        const int rows[4] = {1, 5, 128, 128}, modes[4] = {0, 2, 0, 2};
        test_mem("moe_many_experts", SM_EXP_MXFP4, 512, 384, 64, 4, 110, 125, rows, modes, 4, 0);
        test_mem("moe_many_experts_w4a4", SM_EXP_MXFP4, 512, 384, 64, 4, 110, 125, rows, modes, 4, 0, 1);
    }
    {
        const int rows[2] = {3, 8}, modes[2] = {0, 1};
        test_mem("moe_real_fp8", SM_EXP_FP8, 4096, 4096, 2, 2, 0, 0, rows, modes, 2, 0);
        test_mem("moe_real_bf16", SM_EXP_BF16, 4096, 4096, 2, 2, 0, 0, rows, modes, 2, 0);
    }
    {
        const int rows[2] = {8, 12}, modes[2] = {0, 1};
        /* scale bytes up to 140: the exponent-offset path; plus an invalid expert id */
        test_mem("moe_extreme_scales", SM_EXP_MXFP4, 256, 320, 4, 2, 100, 140, rows, modes, 2, 1);
        test_mem("moe_extreme_scales_w4a4", SM_EXP_MXFP4, 256, 320, 4, 2, 100, 140, rows, modes, 2, 1, 1);
        test_mem("moe_odd_widths_bf16", SM_EXP_BF16, 96, 160, 5, 3, 0, 0, rows, modes, 2, 0);
    }
    test_synth();
    test_shards(SM_EXP_MXFP4, 0);
    test_shards(SM_EXP_MXFP4, 1);
    test_shards(SM_EXP_FP8, 0);
    test_synth_equals_made("tiny", SM_EXP_MXFP4);
    test_synth_equals_made("tiny", SM_EXP_FP8);
    test_synth_equals_made("mini", SM_EXP_MXFP4);
    cudaStreamDestroy(m_st);
    sm_pool_destroy(m_pool);
    m_pool = NULL;
    printf("moe: %d passed, %d failed, %d skipped\n", gh_pass, gh_fail, gh_skip);
    return gh_fail;
}
