/* matmul.cu: microbenchmark of the dense projections of a layer (`gpu_test --bench matmul`):
 * y [n, m] = x [n, k] @ W [m, k]^T in bf16 at the real widths, for the fused q/k/v/gate
 * projection [(2 nH + 2 nKV) D, H], o_proj [H, nH D], pooler [Hm, H] and unpooler [H, Hm], at
 * n = 8 .. 128 rows, through sm_k_mm (what a step runs: "auto") and each path of cuda/ops/ops.h
 * (mma.sync core, wgmma 128-row tiles, wgmma 256-row tiles).
 *
 * Each case rotates over copies of W, x and y that hold >= 3 L2 sizes together; floor bytes =
 * W + x read (y written is n x m, small); FLOPs 2 n k m.  For sm_k_mm the table also gives
 * "b2b": the time per call of two calls back to back on different copies (the second starts
 * while the first drains; the difference to one call is the launch's start and drain cost).
 * Only the sm_k_mm line of a case enters the summary.  We rejected timing inside CUDA graphs
 * here: the question is the kernel's own speed; the graph-level view is `sparkmono bench`.
 */
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include "cuda/common.cuh"
#include "cuda/ops/matmul.cuh"
#include "bench.h"

typedef struct mm_case {
    const char *name;        /* table label */
    int m, k;                /* W [m, k] */
    int nsets;               /* copies of W, x, y */
    int n;                   /* rows of the call */
    int path;                /* SM_PATH_*; SM_PATH_AUTO calls sm_k_mm */
    uint16_t *w;             /* device [nsets][m][k] */
    uint16_t *x;             /* device [nsets][BH_MAX_ROWS][k] */
    uint16_t *y;             /* device [nsets][BH_MAX_ROWS][m] */
} mm_case;

static int mm_call(bh_run *r, void *arg, int set, sm_err *e) {
    const mm_case *c = (const mm_case *)arg;
    const uint16_t *w = c->w + (size_t)set * c->m * c->k, *x = c->x + (size_t)set * BH_MAX_ROWS * c->k;
    uint16_t *y = c->y + (size_t)set * BH_MAX_ROWS * c->m;
    if (c->path == SM_PATH_AUTO) return sm_k_mm(&r->kc, x, c->n, c->k, w, c->m, y, r->st, e);
    return sm_k_mm_path(&r->kc, c->path, x, c->n, c->k, w, c->m, y, r->st, e);
}

static const char *mm_path_name(int p) {
    return p == SM_PATH_SYNC ? "mma.sync" : p == SM_PATH_WG1 ? "wgmma128" : p == SM_PATH_WG2 ? "wgmma256" : "sm_k_mm";
}

/* Every row count and path of one matrix; c->w, x, y allocated here (freed by the caller). */
static int mm_matrix(bh_run *r, mm_case *c, sm_err *e) {
    const double wbytes = (double)c->m * c->k * 2;
    c->nsets = bh_sets(r, wbytes + (double)BH_MAX_ROWS * (c->k + c->m) * 2);
    const size_t S = (size_t)c->nsets;
    SM_CUDA_CHECK(cudaMalloc((void **)&c->w, S * c->m * c->k * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->x, S * BH_MAX_ROWS * c->k * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->y, S * BH_MAX_ROWS * c->m * 2));
    char nm[64];
    snprintf(nm, sizeof nm, "bench.matmul.%s.w", c->name);
    if (bh_normal_bf16(r, c->w, S * c->m * c->k, nm, 0.0f, 1.0f / sqrtf((float)c->k), e)) return -1;
    snprintf(nm, sizeof nm, "bench.matmul.%s.x", c->name);
    if (bh_normal_bf16(r, c->x, S * BH_MAX_ROWS * c->k, nm, 0.0f, 1.0f, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    for (int ri = 0; ri < BH_NROWS; ri++) {
        c->n = r->rows[ri];
        const double bytes = wbytes + (double)c->n * c->k * 2, flops = 2.0 * c->n * c->k * c->m;
        for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
            if (!r->kc.tma_encode && (p == SM_PATH_WG1 || p == SM_PATH_WG2)) continue;
            c->path = p;
            float us = 0, b2b = 0;
            if (bh_time(r, mm_call, c, c->nsets, 1, &us, e)) return sm_errprefix(e, "%s %s n=%d", c->name, mm_path_name(p), c->n);
            char extra[48] = "";
            if (p == SM_PATH_AUTO) {
                if (bh_time(r, mm_call, c, c->nsets, 2, &b2b, e)) return sm_errprefix(e, "%s b2b n=%d", c->name, c->n);
                snprintf(extra, sizeof extra, "b2b %.2f us", b2b);
            }
            char what[40];
            snprintf(what, sizeof what, "%s %s", c->name, mm_path_name(p));
            bh_row(r, "matmul", what, c->n, us, bytes, flops, extra[0] ? extra : NULL, p == SM_PATH_AUTO);
        }
    }
    return 0;
}

/* ---- the wgmma kernel's timeline (SM_MM_BENCH_TL=1): where a few-row call loses its time ----
 * mmtl_kernel is the stock kernel wg_kernel<8, 1, SM_WG_EPI_MM> (ops/matmul.cu) with three
 * globaltimer stamps a block (its start, its first ring stage landed, the consumers done:
 * fixups and epilogues included) and its SM, at tl[block * MMTL_N + MMTL_*]. */
#define MMTL_REPS 4
enum { MMTL_START, MMTL_FIRST, MMTL_DONE, MMTL_SM, MMTL_N };

__global__ void __launch_bounds__(SM_WG_THREADS, 1)
mmtl_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, const sm_wg_args a,
            unsigned long long *tl) {
    constexpr int ST = SM_WG_ST(8, 1);
    extern __shared__ uint8_t mmtl_dyn[];
    __shared__ __align__(8) uint64_t full_bar[ST], empty_bar[ST];
    __shared__ int last_s;
    const unsigned long long t0 = sm_now_ns();
    sm_wg_smem sm;
    sm.base = (sm_wg_u32(mmtl_dyn) + 1023u) & ~1023u;
    sm.full = sm_wg_u32(full_bar);
    sm.empty = sm_wg_u32(empty_bar);
    sm.last = &last_s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = gridDim.x, b = blockIdx.x;
    unsigned long long *o = tl + (size_t)b * MMTL_N;
    if (threadIdx.x == 0) sm_wg_ring_init<ST>(sm);
    __syncthreads();
    int s = 0;
    unsigned ph = 0;
    const int u0 = sm_wg_unit0(b, G, a.units), u1 = sm_wg_unit0(b + 1, G, a.units);
    if (warp >= 8) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0) sm_wg_produce<8, 1>(&tw, &tx, a.ki, u0, u1, 0, sm, s, ph);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        if (threadIdx.x == 0) {
            sm_wg_mbar_wait(sm.full, 0u); /* the first stage landed (the main loop waits on it too) */
            o[MMTL_FIRST] = sm_now_ns();
        }
        sm_wg_consume_mm<8, 1, SM_WG_EPI_MM>(a, b, G, u0, u1, sm, s, ph);
        sm_wg_cons_sync();
        if (threadIdx.x == 0) {
            unsigned smid;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
            o[MMTL_START] = t0;
            o[MMTL_DONE] = sm_now_ns();
            o[MMTL_SM] = smid;
        }
    }
}

/* One globaltimer stamp by a one-warp kernel: where the kernel before the matmul ends and the
 * one after it starts.  mmtl_stamp_kernel_s is the same kernel with the carveout of the
 * matmul (maximum shared memory), so no SM changes its L1 / shared split between the two. */
__global__ void mmtl_stamp_kernel(unsigned long long *t) {
    if (threadIdx.x == 0) *t = sm_now_ns();
}
__global__ void mmtl_stamp_kernel_s(unsigned long long *t) {
    if (threadIdx.x == 0) *t = sm_now_ns();
}

static int mmtl_cmp(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* MMTL_REPS calls of c (8 rows) on rotating sets, each with its timeline: the call's time
 * (events), the blocks' start spread, first-stage latency, producer and consumer ends (us from
 * the first block's start: min / median / max), each block's stream rate, the slowest SMs. */
static int mmtl_matrix(bh_run *r, mm_case *c, sm_err *e) {
    const int n = 8;
    unsigned long long *dtl = NULL, *htl = NULL;
    SM_CUDA_CHECK(cudaMalloc((void **)&dtl, ((size_t)r->sms * MMTL_N + 2) * sizeof *dtl));
    htl = (unsigned long long *)malloc(((size_t)r->sms * MMTL_N + 2) * sizeof *htl);
    double *v = (double *)malloc((size_t)r->sms * sizeof *v); /* one measure over the blocks at a time */
    int rc = 0;
    if (!htl || !v) rc = sm_errf(e, "bench matmul timeline: out of host memory");
    const size_t smem = SM_WG_SMEM(8, 1);
    if (!rc && cudaFuncSetAttribute(mmtl_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        rc = sm_errf(e, "bench matmul timeline: cudaFuncSetAttribute failed");
    if (!rc && cudaFuncSetAttribute(mmtl_stamp_kernel_s, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared) != cudaSuccess)
        rc = sm_errf(e, "bench matmul timeline: carveout attribute failed");
    for (int rep = 0; rep < 2 * (MMTL_REPS + 1) && !rc; rep++) {
        const int set = rep % c->nsets, same = rep >= MMTL_REPS + 1; /* the stamps' carveout: the matmul's */
        void (*stamp)(unsigned long long *) = same ? mmtl_stamp_kernel_s : mmtl_stamp_kernel;
        const uint16_t *w = c->w + (size_t)set * c->m * c->k, *x = c->x + (size_t)set * BH_MAX_ROWS * c->k;
        uint16_t *y = c->y + (size_t)set * BH_MAX_ROWS * c->m;
        sm_wg_args a;
        CUtensorMap tw, tx;
        if (sm_wg_plan_mm(&r->kc, 8, x, n, c->k, w, c->m, y, r->kc.ws, r->kc.ws_bytes, &a, &tw, &tx, e)) { rc = -1; break; }
        const int G = a.units < r->sms ? a.units : r->sms;
        if (cudaMemsetAsync(dtl, 0, ((size_t)r->sms * MMTL_N + 2) * sizeof *dtl, r->st) != cudaSuccess) { rc = sm_errf(e, "memset"); break; }
        bh_spin_kernel<<<1, 32, 0, r->st>>>(BH_SPIN_NS);
        if (cudaEventRecord(r->ea, r->st) != cudaSuccess) { rc = sm_errf(e, "event"); break; }
        stamp<<<1, 32, 0, r->st>>>(dtl + (size_t)G * MMTL_N);
        mmtl_kernel<<<G, SM_WG_THREADS, smem, r->st>>>(tw, tx, a, dtl);
        stamp<<<1, 32, 0, r->st>>>(dtl + (size_t)G * MMTL_N + 1);
        if (cudaEventRecord(r->eb, r->st) != cudaSuccess || cudaStreamSynchronize(r->st) != cudaSuccess ||
            cudaGetLastError() != cudaSuccess) { rc = sm_errf(e, "bench matmul timeline: %s failed", c->name); break; }
        float ms = 0;
        SM_CUDA_CHECK(cudaEventElapsedTime(&ms, r->ea, r->eb));
        SM_CUDA_CHECK(cudaMemcpy(htl, dtl, ((size_t)G * MMTL_N + 2) * sizeof *htl, cudaMemcpyDeviceToHost));
        if (rep == 0 || rep == MMTL_REPS + 1) continue; /* warm-up */
        unsigned long long tmin = ~0ull, tend = 0;
        for (int b = 0; b < G; b++) {
            const unsigned long long *t = htl + (size_t)b * MMTL_N;
            if (t[MMTL_START] < tmin) tmin = t[MMTL_START];
            if (t[MMTL_DONE] > tend) tend = t[MMTL_DONE];
        }
        const double gap_in = ((double)tmin - (double)htl[(size_t)G * MMTL_N]) / 1e3, gap_out = ((double)htl[(size_t)G * MMTL_N + 1] - (double)tend) / 1e3;
        const double ub = (double)SM_WG_STAGE(8, 1);
        double q[4][3];
        int slow[4] = {-1, -1, -1, -1};
        double sv[4] = {0, 0, 0, 0};
        for (int f = 0; f < 4; f++) {
            for (int b = 0; b < G; b++) {
                const unsigned long long *t = htl + (size_t)b * MMTL_N;
                const double units = (double)(sm_wg_unit0(b + 1, G, a.units) - sm_wg_unit0(b, G, a.units));
                v[b] = f == 0   ? (t[MMTL_START] - tmin) / 1e3
                       : f == 1 ? (t[MMTL_FIRST] - t[MMTL_START]) / 1e3
                       : f == 2 ? (t[MMTL_DONE] - tmin) / 1e3
                                : units * ub / ((t[MMTL_DONE] - t[MMTL_FIRST]) * 1e-9) / 1e9; /* GB/s while streaming */
                if (f == 2) for (int i = 0; i < 4; i++) if (slow[i] < 0 || v[b] > sv[i]) {
                    for (int j = 3; j > i; j--) { slow[j] = slow[j - 1]; sv[j] = sv[j - 1]; }
                    slow[i] = (int)t[MMTL_SM]; sv[i] = v[b];
                    break;
                }
            }
            qsort(v, (size_t)G, sizeof *v, mmtl_cmp);
            q[f][0] = v[0]; q[f][1] = v[G / 2]; q[f][2] = v[G - 1];
        }
        printf("mm-timeline %s n=%d%s call %.2f us (floor %.2f): stamp before -> first block %.2f us, last block -> stamp after %.2f us; start spread %.2f us; first stage %.2f / %.2f / %.2f us; "
               "consumers done %.2f / %.2f / %.2f us; stream rate %.1f / %.1f / %.1f GB/s a block (x %d = %.0f GB/s at the median); "
               "slowest SMs %d (%.2f) %d (%.2f) %d (%.2f) %d (%.2f)\n",
               c->name, n, same ? " (stamps at max shared)" : "", ms * 1e3, ((double)c->m * c->k * 2) / r->bw * 1e6, gap_in, gap_out, q[0][2], q[1][0], q[1][1], q[1][2], q[2][0], q[2][1],
               q[2][2], q[3][0], q[3][1], q[3][2], G, q[3][1] * G, slow[0], sv[0], slow[1], sv[1], slow[2], sv[2], slow[3], sv[3]);
    }
    SM_CUDA_CHECK_PRINT(cudaFree(dtl));
    free(htl);
    free(v);
    return rc;
}

int bench_matmul(bh_run *r, sm_err *e) {
    const sm_config *f = &r->cfg;
    const int QD = f->nH * f->D, KD = f->nKV * f->D;
    mm_case cs[4] = {
        {"qkvg", 2 * QD + 2 * KD, f->H, 0, 0, 0, NULL, NULL, NULL},
        {"o_proj", f->H, QD, 0, 0, 0, NULL, NULL, NULL},
        {"pooler", f->Hm, f->H, 0, 0, 0, NULL, NULL, NULL},
        {"unpooler", f->H, f->Hm, 0, 0, 0, NULL, NULL, NULL},
    };
    bh_head("matmul: y = x @ W^T, bf16 (sm_k_mm and its paths); qkvg [(2nH+2nKV)D, H], o_proj [H, nH D], pooler [Hm, H], "
            "unpooler [H, Hm]",
            "W + x read (y written: n x m, not counted); FLOPs 2 n k m; b2b = per call, two calls back to back");
    int rc = 0;
    const char *tl = getenv("SM_MM_BENCH_TL");
    for (int i = 0; i < 4 && !rc; i++) {
        rc = mm_matrix(r, &cs[i], e);
        if (!rc && tl && tl[0] == '1' && r->kc.tma_encode) rc = mmtl_matrix(r, &cs[i], e);
        if (cs[i].w) SM_CUDA_CHECK_PRINT(cudaFree(cs[i].w));
        if (cs[i].x) SM_CUDA_CHECK_PRINT(cudaFree(cs[i].x));
        if (cs[i].y) SM_CUDA_CHECK_PRINT(cudaFree(cs[i].y));
    }
    return rc;
}
