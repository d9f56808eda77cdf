/* kernels.cu: the `kernels` group of the GPU tests (kernel_cases.h lists its files, one per op
 * family beside src/cuda/ops and bench/gpu: matmul.cu, norm.cu, router.cu, attention.cu,
 * logits.cu).  Here: the entry that runs every case at the real widths and the edge sizes
 * (fresh random inputs, seeded per run from the clock; the seed is printed), the launchers'
 * precondition messages, and every launcher that uses the workspace, cuBLAS or dynamic shared
 * memory inside a captured CUDA graph (replay == eager run).  Every reference is the kernel's
 * CPU op (src/cpu/ops.h), called on the same inputs: the tests hold no math of their own.
 * Each case goes through harness.h: guarded arenas, outputs poisoned with NaN (an unwritten
 * element fails), the relative L2 error against a bound (bf16 outputs 1e-2, f32 logits 1e-3,
 * f32 router logits and residual stream 1e-4) and every element within 5x that bound of its
 * size plus the tensor's RMS.  We rejected a case list per op file: one list here shows what
 * the group covers.
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
    case_rms_bf16(8, 4096, 0, 1);
    case_rms_bf16(128, 4096, 1, 1);
    case_rms_bf16(300, 128, 0, 1);
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
    case_route(9, 512, 1024, 16);  /* the top-K's 32 experts a lane */
    case_route(21, 256, 200, 8);   /* a partial last tile of experts */
    case_route_ties(8, 8192, 256, 8, 5);
    case_route_ties(40, 1024, 256, 8, 3);
    case_route_ties(9, 512, 1024, 32, 7);
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
    case_logprobs(8, 202048, 201818, 20, 8, 0);
    case_logprobs(128, 202048, 201818, 5, 128, 0);
    case_logprobs(16, 202048, 201818, 20, 16, 1);
    case_logprobs(130, 1000, 990, 1, 300, 0); /* three launches */
    case_logprobs(6, 3000, 15, 20, 6, 0);     /* fewer ids than k */
    case_logprobs(4, 512, 512, 20, 4, 1);
    case_mask_rows(8, 202048, 201818, 0, 20);   /* about half allowed */
    case_mask_rows(9, 202048, 201818, 3, 5);    /* fewer allowed ids than k */
    case_mask_rows(120, 4096, 4000, 40, 8);     /* many rows, every mask distinct */

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

