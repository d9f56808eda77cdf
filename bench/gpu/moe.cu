/* moe.cu: microbenchmark of the MoE expert stage (`gpu_test --bench moe`): sm_cuda_moe_forward
 * (route grouping, gate_up + SiLU, down, post-norm and weighted sum: 4 launches) at the real
 * widths Hm = I = 4096, K = 8, with synthetic experts (sm_cuda_moe_synth): MXFP4 (E = 256,
 * 2 layers of 6.8 GB, n = 8 .. 128 rows), FP8 (E = 128) and BF16 (E = 64) (1 layer, n = 8 and
 * 32), each with both schedules of the expert matmul (queue, the default, and stages) back to
 * back, and the MXFP4 layers with bf16 (W4A16) and MXFP4 (W4A4: "w4a4f" on the FP8 tensor cores,
 * "w4a4b" with bf16 products) activations back to back in each schedule; uniform random top-8
 * routing.
 *
 * Each case is timed twice: plain stream launches ("ms stream") and a CUDA graph per (routing
 * set, layer) replayed ("ms graph", the form a step runs), rotating 8 routing sets and the
 * layers, so no call finds its experts in L2.  Floor = bytes of the distinct experts the rows
 * touch (weights + scales, read once; the mean over the 8 sets) / read bandwidth; the FLOP
 * floor (6 Hm I per route) is far lower and only enters the summary's max.  The summary takes
 * the graph time of every case with the workspace's default L2 prefetch (column pf: the
 * distance the call ran with).  Knobs (environment): SM_MOE_BENCH_PREFETCH=P times that
 * prefetch distance at every row count instead; SM_MOE_BENCH_QUICK=1 (or a format name) one
 * MXFP4 (that format's) layer at 8 rows (SM_MOE_BENCH_QUICK_ROWS=N: N rows), 4 timed calls
 * (for profilers); SM_MOE_BENCH_PROF=1 also one profiled call of the queue schedule per case
 * (mb_prof: where the blocks' time goes); SM_MOE_BENCH_GRID=G runs the persistent grid with G
 * blocks (G = SMs: one block an SM, half the weight bytes in flight: a latency-bound stand-in
 * for a GPU whose read rate outruns two blocks' loads).  We rejected the routing of a
 * synthetic router here: uniform routing is the stage's own worst case of distinct experts,
 * and `sparkmono bench` times model routing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/common.cuh"
#include "cuda/moe/moe.h"
#include "cuda/ops/ops.h"
#include "backend/stats.h"
#include "bench.h"

#define MB_SETS 8            /* routing sets */
#define MB_MAX_LAYERS 2      /* layers of a format */

typedef struct mb_case {
    int nlayers;                         /* layers rotated */
    int n;                               /* rows of the call */
    sm_cuda_moe_layer L[MB_MAX_LAYERS];  /* [nlayers] synthetic layers (fmt 0 = not made) */
    int made;                            /* layers made */
    sm_cuda_moe_ws ws;                   /* workspace for 128 rows */
    uint16_t *h1;                        /* device [BH_MAX_ROWS][Hm] bf16 */
    uint16_t *h1q;                       /* device, the same rows normed and rounded to MXFP4 by
                                            sm_k_rms_bf16 (W4A4: as the pre-expert norm gives them) */
    int aq;                              /* the case runs W4A4: h1q, ws.h1_mx */
    uint16_t *mo;                        /* device [BH_MAX_ROWS][Hm] bf16 */
    int *idx;                            /* device [MB_SETS][BH_MAX_ROWS][K] */
    float *w;                            /* device [MB_SETS][BH_MAX_ROWS][K] */
    int *hi;                             /* host, as idx */
    float *hw;                           /* host, as w */
    cudaGraphExec_t ge[MB_SETS * MB_MAX_LAYERS]; /* [set * nlayers + layer] */
} mb_case;

/* Set `set` = routing set set % MB_SETS of layer set / MB_SETS: the rotation of the former
 * loop (sets fastest, then layers). */
static int mb_stream(bh_run *r, void *arg, int set, sm_err *e) {
    mb_case *c = (mb_case *)arg;
    const int s = set % MB_SETS, l = set / MB_SETS, K = c->L[0].K;
    return sm_cuda_moe_forward(&c->L[l], c->aq ? c->h1q : c->h1, c->idx + (size_t)s * BH_MAX_ROWS * K, c->w + (size_t)s * BH_MAX_ROWS * K,
                               c->n, c->mo, &c->ws, r->st, e);
}
static int mb_graph(bh_run *r, void *arg, int set, sm_err *e) {
    mb_case *c = (mb_case *)arg;
    const int s = set % MB_SETS, l = set / MB_SETS;
    SM_CUDA_CHECK(cudaGraphLaunch(c->ge[s * c->nlayers + l], r->st));
    return 0;
}

/* Uniform random top-K of n rows (distinct experts of E a row), weights 0.1 + u normalized to
 * sum 1 a row; returns the distinct experts the rows touch. */
static int mb_routing(uint64_t key, int n, int E, int K, int *idx, float *w) {
    uint64_t k64 = 0;
    char seen[4096];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < n; i++) {
        int *row = idx + (size_t)i * K;
        float s = 0.0f;
        for (int k = 0; k < K; k++) {
            int x, dup;
            do {
                x = (int)(bh_bits(key, k64++) % (uint64_t)E);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= row[j] == x;
            } while (dup);
            row[k] = x;
            seen[x] = 1;
            w[(size_t)i * K + k] = 0.1f + (float)((double)(bh_bits(key, k64++) >> 40) * (1.0 / 16777216.0));
            s += w[(size_t)i * K + k];
        }
        for (int k = 0; k < K; k++) w[(size_t)i * K + k] /= s;
    }
    int d = 0;
    for (int x = 0; x < E; x++) d += seen[x];
    return d;
}

/* Capture one graph per (routing set, layer) of the current row count. */
static int mb_capture(bh_run *r, mb_case *c, sm_err *e) {
    for (int s = 0; s < MB_SETS; s++)
        for (int l = 0; l < c->nlayers; l++) {
            cudaGraph_t g;
            SM_CUDA_CHECK(cudaStreamBeginCapture(r->st, cudaStreamCaptureModeGlobal));
            const int rc = mb_stream(r, c, l * MB_SETS + s, e);
            SM_CUDA_CHECK(cudaStreamEndCapture(r->st, &g));
            if (rc) {
                SM_CUDA_CHECK_PRINT(cudaGraphDestroy(g));
                return sm_errprefix(e, "capture");
            }
            const cudaError_t inst = cudaGraphInstantiate(&c->ge[s * c->nlayers + l], g, 0);
            SM_CUDA_CHECK(cudaGraphDestroy(g));
            if (inst != cudaSuccess) return sm_errf(e, "cudaGraphInstantiate: %s", cudaGetErrorString(inst));
        }
    return 0;
}

static void mb_graphs_free(mb_case *c) {
    for (int i = 0; i < MB_SETS * MB_MAX_LAYERS; i++)
        if (c->ge[i]) {
            SM_CUDA_CHECK_PRINT(cudaGraphExecDestroy(c->ge[i]));
            c->ge[i] = NULL;
        }
}

static int mb_prof(bh_run *r, mb_case *c, double bytes, sm_err *e);

/* Set the case's activations: aq 0 W4A16, 1 W4A4 on the FP8 tensor cores ("w4a4f"), 2 W4A4
 * with bf16 products ("w4a4b"): every layer's act_mx and cores (sm_cuda_moe_set_acts), h1
 * rounded by its norm as the model path gives it. */
static int mb_acts(bh_run *r, mb_case *c, int aq, sm_err *e) {
    for (int l = 0; l < c->made; l++)
        if (sm_cuda_moe_set_acts(&c->L[l], aq != 0, aq == 1, r->st, e)) return -1;
    c->aq = aq != 0;
    c->ws.h1_mx = aq != 0;
    if (aq) { /* h1q: h1 normed and rounded as the pre-expert norm makes it, with its e4m3 image
               * when the layers run on the FP8 tensor cores (the workspace contract of h1_mx) */
        uint8_t *ic; float *ifac; int ikp;
        sm_cuda_moe_h1_img(&c->L[0], &c->ws, &ic, &ifac, &ikp);
        if (sm_k_rms_bf16(c->h1, BH_MAX_ROWS, r->cfg.Hm, NULL, r->cfg.rms_eps, c->h1q, 1, ic, ifac, ikp, r->st, e)) return -1;
    }
    return 0;
}
static const char *const mb_acts_name[3] = {"w4a16", "w4a4f", "w4a4b"};

/* The three activations of mb_acts interleaved call by call (the same clocks and power for
 * all): one graph set of each, then per timed iteration one call of each, the order rotating;
 * the median of each and their ratios.  The schedule is the workspace's. */
static int mb_ab(bh_run *r, mb_case *c, sm_err *e) {
    cudaGraphExec_t g[3][MB_SETS * MB_MAX_LAYERS];
    memset(g, 0, sizeof g);
    int rc = 0;
    for (int v = 0; v < 3 && !rc; v++) {
        rc = mb_acts(r, c, v, e) || mb_capture(r, c, e);
        memcpy(g[v], c->ge, sizeof c->ge);
        memset(c->ge, 0, sizeof c->ge);
    }
    float t[3][BH_MAX_ITERS];
    const int nsets = MB_SETS * c->nlayers;
    long call = 0;
    for (int it = -BH_WARM; it < r->iters && !rc; it++, call++)
        for (int h = 0; h < 3 && !rc; h++) {
            const int v = (h + it + 3 * BH_WARM) % 3, set = (int)(call % nsets); /* it starts at -BH_WARM */
            const int s = set % MB_SETS, l = set / MB_SETS;
            bh_spin_kernel<<<1, 32, 0, r->st>>>(BH_SPIN_NS);
            float ms = 0;
            if (cudaEventRecord(r->ea, r->st) != cudaSuccess || cudaGraphLaunch(g[v][s * c->nlayers + l], r->st) != cudaSuccess ||
                cudaEventRecord(r->eb, r->st) != cudaSuccess || cudaEventSynchronize(r->eb) != cudaSuccess ||
                cudaEventElapsedTime(&ms, r->ea, r->eb) != cudaSuccess)
                rc = sm_errf(e, "interleaved timing: %s", cudaGetErrorString(cudaGetLastError()));
            if (it >= 0) t[v][it] = ms * 1e3f;
        }
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < MB_SETS * MB_MAX_LAYERS; i++)
            if (g[v][i]) SM_CUDA_CHECK_PRINT(cudaGraphExecDestroy(g[v][i]));
    if (rc) return -1;
    const float a = sm_median(t[0], r->iters), b = sm_median(t[1], r->iters), b2 = sm_median(t[2], r->iters);
    double mhz = 0;
    if (bh_sm_mhz(r, &mhz, e)) return -1;
    printf("mxfp4  %-5s %-6s     %5d   interleaved: w4a16 %.3f ms, w4a4f %.3f ms, w4a4b %.3f ms; w4a4f / w4a16 %.4f, "
           "w4a4f / w4a4b %.4f   %8.0f MHz\n",
           "ab", c->ws.sched == SM_MOE_SCHED_QUEUE ? "queue" : "stages", c->n, a * 1e-3, b * 1e-3, b2 * 1e-3, b / a, b / b2, mhz);
    return 0;
}

/* A timed variant: the schedule of the expert matmul and the L2 prefetch distance (-1: the
 * workspace's defaults; P >= 0: P at every row count). */
typedef struct mb_var {
    int sched, pf;
    int aq;                   /* mb_acts: 0 W4A16, 1 W4A4 (FP8 tensor cores), 2 W4A4 (bf16 products) */
} mb_var;

/* The workspace's L2 prefetch for variant distance pf (defaults pf0, pfr0). */
static void mb_set_pf(mb_case *c, int pf, int pf0, int pfr0) {
    c->ws.prefetch = pf < 0 ? pf0 : pf;
    c->ws.prefetch_rows = pf < 0 ? pfr0 : BH_MAX_ROWS;
}

/* One format: its layers, then every (rows, variant) case (the variants of a row count back
 * to back, so they run at the same clocks).  Buffers freed by the caller. */
static int mb_format(bh_run *r, mb_case *c, int fmt, int E, const int *rows, int nrows, const mb_var *vars, int nvar,
                     sm_err *e) {
    sm_config cf = r->cfg;
    cf.E = E;
    cf.L = c->nlayers;
    for (; c->made < c->nlayers; c->made++)
        if (sm_cuda_moe_synth(&cf, c->made, fmt, r->seed, &c->L[c->made], r->st, e)) return sm_errprefix(e, "synth");
    if (sm_cuda_moe_ws_alloc(&cf, BH_MAX_ROWS, &c->ws, e)) return -1;
    const int pf0 = c->ws.prefetch, pfr0 = c->ws.prefetch_rows; /* the defaults */
    const char *gs = getenv("SM_MOE_BENCH_GRID"); /* blocks of the persistent grid (SMs: one an SM, half the bytes in flight) */
    if (gs && atoi(gs) > 0) c->ws.grid = atoi(gs);
    const int sched0 = c->ws.sched;
    const size_t rk = (size_t)MB_SETS * BH_MAX_ROWS * cf.K;
    SM_CUDA_CHECK(cudaMalloc((void **)&c->h1, (size_t)BH_MAX_ROWS * cf.Hm * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->mo, (size_t)BH_MAX_ROWS * cf.Hm * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->idx, rk * sizeof(int)));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->w, rk * sizeof(float)));
    c->hi = (int *)malloc(rk * sizeof(int));
    c->hw = (float *)malloc(rk * sizeof(float));
    if (!c->hi || !c->hw) return sm_errf(e, "out of host memory");
    if (bh_normal_bf16(r, c->h1, (size_t)BH_MAX_ROWS * cf.Hm, "bench.moe.h1", 0.0f, 1.0f, e)) return -1;
    if (fmt == SM_EXP_MXFP4) SM_CUDA_CHECK(cudaMalloc((void **)&c->h1q, (size_t)BH_MAX_ROWS * cf.Hm * 2)); /* mb_acts */
    const char *fname = sm_expert_fmt_name((sm_expert_fmt)fmt);
    printf("%-6s %-5s %-6s %3s %5s %8s %9s %10s %10s %9s %9s %8s %8s\n", "format", "acts", "sched", "pf", "rows", "experts", "MB",
           "ms stream", "ms graph", "TB/s", "floor ms", "of floor", "SM MHz");
    for (int ri = 0; ri < nrows; ri++) {
        c->n = rows[ri];
        char nm[64];
        snprintf(nm, sizeof nm, "bench.moe.%s.routing.%d", fname, c->n);
        const uint64_t key = sm_rng_key(r->seed, nm);
        double touched = 0;
        for (int s = 0; s < MB_SETS; s++) {
            const size_t o = (size_t)s * BH_MAX_ROWS * cf.K;
            touched += mb_routing(bh_bits(key, (uint64_t)s), c->n, E, cf.K, c->hi + o, c->hw + o);
        }
        touched /= MB_SETS;
        SM_CUDA_CHECK(cudaMemcpy(c->idx, c->hi, rk * sizeof(int), cudaMemcpyHostToDevice));
        SM_CUDA_CHECK(cudaMemcpy(c->w, c->hw, rk * sizeof(float), cudaMemcpyHostToDevice));
        for (int vi = 0; vi < nvar; vi++) {
            if (vars[vi].aq && fmt != SM_EXP_MXFP4) continue; /* W4A4 is an MXFP4 mode */
            mb_set_pf(c, vars[vi].pf, pf0, pfr0);
            c->ws.sched = vars[vi].sched;
            if (mb_acts(r, c, vars[vi].aq, e)) return -1;
            const char *sname = c->ws.sched == SM_MOE_SCHED_QUEUE ? "queue" : "stages";
            const char *aname = fmt == SM_EXP_MXFP4 ? mb_acts_name[vars[vi].aq] : "bf16";
            const int nsets = MB_SETS * c->nlayers;
            float us_s = 0, us_g = 0;
            double mhz = 0;
            if (bh_time(r, mb_stream, c, nsets, 1, &us_s, e)) return sm_errprefix(e, "%s n=%d stream", fname, c->n);
            const int rc = mb_capture(r, c, e) || bh_time(r, mb_graph, c, nsets, 1, &us_g, e) || bh_sm_mhz(r, &mhz, e);
            mb_graphs_free(c);
            if (rc) return sm_errprefix(e, "%s n=%d graph", fname, c->n);
            const double ms = us_s * 1e-3, mg = us_g * 1e-3;
            const double bytes = touched * (double)c->L[0].touched_bytes;
            const double floor_ms = bytes / r->bw * 1e3;
            printf("%-6s %-5s %-6s %3d %5d %8.1f %9.1f %10.3f %10.3f %9.2f %9.3f %7.1f%% %8.0f\n", fname, aname, sname,
                   sm_cuda_moe_prefetch(&c->L[0], &c->ws, c->n), c->n,
                   touched, bytes / 1e6, ms, mg, bytes / (mg * 1e-3) / 1e12, floor_ms, 100.0 * floor_ms / mg, mhz);
            fflush(stdout);
            if (c->ws.sched == SM_MOE_SCHED_QUEUE && getenv("SM_MOE_BENCH_PROF") && mb_prof(r, c, bytes, e)) return -1;
            if (vars[vi].pf < 0) { /* the summary: "moe FMT" = the default schedule, "moe FMT stages" the other;
                                       " w4a4f" / " w4a4b": W4A4 on the FP8 tensor cores / with bf16 products */
                char op[48];
                const char *an = vars[vi].aq == 1 ? " w4a4f" : vars[vi].aq == 2 ? " w4a4b" : "";
                if (c->ws.sched == sched0) snprintf(op, sizeof op, "moe %s%s", fname, an);
                else snprintf(op, sizeof op, "moe %s %s%s", fname, sname, an);
                const double flops = 6.0 * c->n * cf.K * (double)cf.Hm * cf.I;
                bh_add(r, op, c->n, us_g, bh_floor_us(r, bytes, flops));
            }
        }
        if (fmt == SM_EXP_MXFP4 && nvar > 1) { /* the two numerics interleaved, the default schedule */
            c->ws.sched = sched0;
            mb_set_pf(c, vars[0].pf, pf0, pfr0);
            if (mb_ab(r, c, e)) return sm_errprefix(e, "%s n=%d interleaved", fname, c->n);
        }
    }
    c->ws.sched = sched0;
    return 0;
}

/* SM_MOE_BENCH_PROF=1: one call of the queue schedule with per-unit timestamps, and where the
 * blocks' time went: inside units (busy), between units (epilogue, signal, B restage, waits),
 * before their first unit (head) and after their last (tail), as shares of blocks x span. */
static int mb_prof(bh_run *r, mb_case *c, double bytes, sm_err *e) {
    const size_t nb = (size_t)SM_MOE_PROF_MAX_UNITS * 3 + 2;
    unsigned long long *d = NULL;
    SM_CUDA_CHECK(cudaMalloc((void **)&d, nb * 8));
    SM_CUDA_CHECK(cudaMemsetAsync(d, 0, nb * 8, r->st));
    SM_CUDA_CHECK(cudaMemsetAsync(d + nb - 2, 0xFF, 8, r->st)); /* the kernel entry: a minimum */
    c->ws.prof = d;
    const int rc = mb_stream(r, c, 0, e);
    c->ws.prof = NULL;
    unsigned long long *h = (unsigned long long *)malloc(nb * 8);
    if (!h) return sm_errf(e, "out of host memory");
    cudaError_t ce = rc ? cudaSuccess : cudaStreamSynchronize(r->st);
    if (!rc && ce == cudaSuccess) ce = cudaMemcpy(h, d, nb * 8, cudaMemcpyDeviceToHost);
    SM_CUDA_CHECK_PRINT(cudaFree(d));
    if (rc || ce != cudaSuccess) { free(h); return rc ? -1 : sm_errf(e, "prof: %s", cudaGetErrorString(ce)); }
    const int G = c->ws.grid;
    unsigned long long t0 = ~0ull, t1 = 0;
    double *busy = (double *)calloc((size_t)G, sizeof(double));
    unsigned long long *first = (unsigned long long *)calloc((size_t)G, 8), *last = (unsigned long long *)calloc((size_t)G, 8);
    int *cntb = (int *)calloc((size_t)G, sizeof(int));
    int units = 0;
    double dur = 0, dmax = 0;
    for (int u = 0; u < SM_MOE_PROF_MAX_UNITS; u++) {
        const unsigned long long b = h[3 * (size_t)u], en = h[3 * (size_t)u + 1];
        const int blk = (int)h[3 * u + 2];
        if (!b || !en || blk < 0 || blk >= G) continue;
        units++;
        if (b < t0) t0 = b;
        if (en > t1) t1 = en;
        busy[blk] += (double)(en - b);
        dur += (double)(en - b);
        if ((double)(en - b) > dmax) dmax = (double)(en - b);
        if (!first[blk] || b < first[blk]) first[blk] = b;
        if (en > last[blk]) last[blk] = en;
        cntb[blk]++;
    }
    double sb = 0, sh = 0, st = 0, sg = 0;
    int cmin = 1 << 30, cmax = 0;
    for (int k = 0; k < G; k++) {
        if (!cntb[k]) { st += (double)(t1 - t0); continue; }
        sb += busy[k];
        sh += (double)(first[k] - t0);
        st += (double)(t1 - last[k]);
        sg += (double)(last[k] - first[k]) - busy[k];
        if (cntb[k] < cmin) cmin = cntb[k];
        if (cntb[k] > cmax) cmax = cntb[k];
    }
    const double span = (double)(t1 - t0), tot = span * G;
    const unsigned long long k0 = h[nb - 2], k1 = h[nb - 1];
    const double kspan = k1 > k0 ? (double)(k1 - k0) : 0.0;
    printf("   prof %d rows: queue kernel %.1f us (entry to its first unit %.1f us, last unit to exit %.1f us); %d units, span %.1f "
           "us, unit %.1f us mean / %.1f max, units a block %d..%d; of blocks x span: busy %.1f%%, between units %.1f%%, head "
           "%.1f%%, tail %.1f%%; rate while busy %.2f TB/s\n",
           c->n, kspan * 1e-3, t0 > k0 ? (double)(t0 - k0) * 1e-3 : 0.0, k1 > t1 ? (double)(k1 - t1) * 1e-3 : 0.0, units,
           span * 1e-3, units ? dur / units * 1e-3 : 0.0, dmax * 1e-3, cmin, cmax, 100 * sb / tot, 100 * sg / tot, 100 * sh / tot,
           100 * st / tot, sb > 0 ? bytes / (sb / G * 1e-9) / 1e12 : 0.0);
    free(h); free(busy); free(first); free(last); free(cntb);
    return 0;
}

static void mb_free(mb_case *c) {
    mb_graphs_free(c);
    if (c->h1) SM_CUDA_CHECK_PRINT(cudaFree(c->h1));
    if (c->h1q) SM_CUDA_CHECK_PRINT(cudaFree(c->h1q));
    if (c->mo) SM_CUDA_CHECK_PRINT(cudaFree(c->mo));
    if (c->idx) SM_CUDA_CHECK_PRINT(cudaFree(c->idx));
    if (c->w) SM_CUDA_CHECK_PRINT(cudaFree(c->w));
    free(c->hi);
    free(c->hw);
    if (c->ws.buf) sm_cuda_moe_ws_free(&c->ws);
    for (int l = 0; l < c->made; l++) sm_cuda_moe_free(&c->L[l]);
    memset(c, 0, sizeof *c);
}

static int mb_one(bh_run *r, int fmt, int E, int nlayers, const int *rows, int nrows, const mb_var *vars, int nvar, sm_err *e) {
    mb_case *c = (mb_case *)calloc(1, sizeof *c);
    if (!c) return sm_errf(e, "out of host memory");
    c->nlayers = nlayers;
    const int rc = mb_format(r, c, fmt, E, rows, nrows, vars, nvar, e);
    mb_free(c);
    free(c);
    return rc;
}

int bench_moe(bh_run *r, sm_err *e) {
    printf("\n== moe: expert stage sm_cuda_moe_forward, Hm = I = 4096, K = 8, uniform random top-8 routing\n"
           "   floor = touched experts' bytes / read bandwidth; median of %d calls (after %d), rotating %d routing sets and "
           "the layers (each layer >> L2); sched queue (the default) and stages (the former two launches) back to back; "
           "SM MHz probed right after each case\n",
           r->iters, BH_WARM, MB_SETS);
    /* each schedule W4A16, W4A4 and W4A4 with bf16 products back to back (the MXFP4 layers;
     * other formats skip W4A4) */
    mb_var vars[6] = {{SM_MOE_SCHED_QUEUE, -1, 0},  {SM_MOE_SCHED_QUEUE, -1, 1},  {SM_MOE_SCHED_QUEUE, -1, 2},
                      {SM_MOE_SCHED_STAGES, -1, 0}, {SM_MOE_SCHED_STAGES, -1, 1}, {SM_MOE_SCHED_STAGES, -1, 2}};
    const char *vs = getenv("SM_MOE_BENCH_PREFETCH"); /* one L2 prefetch distance for both schedules, every row count */
    if (vs)
        for (int i = 0; i < 6; i++) vars[i].pf = atoi(vs);
    const int nv = 6;
    const char *quick = getenv("SM_MOE_BENCH_QUICK");
    if (quick) { /* one layer of one format (1 = mxfp4) at 8 rows (SM_MOE_BENCH_QUICK_ROWS), 4 timed calls of each schedule
                  * (SM_MOE_BENCH_QUICK_ITERS: more, up to the run's own count) */
        const char *qi = getenv("SM_MOE_BENCH_QUICK_ITERS");
        const int it = qi ? atoi(qi) : 4;
        r->iters = it >= 1 && it <= r->iters ? it : 4;
        const int f = !strcmp(quick, "bf16") ? SM_EXP_BF16 : !strcmp(quick, "fp8") ? SM_EXP_FP8 : SM_EXP_MXFP4;
        const char *qr = getenv("SM_MOE_BENCH_QUICK_ROWS");
        int rows1 = qr ? atoi(qr) : r->rows[0];
        if (rows1 < 1 || rows1 > BH_MAX_ROWS) rows1 = r->rows[0];
        return mb_one(r, f, f == SM_EXP_MXFP4 ? 256 : f == SM_EXP_FP8 ? 128 : 64, 1, &rows1, 1, vars, nv, e);
    }
    const int rows_small[2] = {8, 32};
    if (mb_one(r, SM_EXP_MXFP4, 256, 2, r->rows, BH_NROWS, vars, nv, e) ||
        mb_one(r, SM_EXP_FP8, 128, 1, rows_small, 2, vars, nv, e) || mb_one(r, SM_EXP_BF16, 64, 1, rows_small, 2, vars, nv, e))
        return -1;
    return 0;
}
