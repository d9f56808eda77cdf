/* bench.cu: the per-op microbenchmarks' harness (bench.h) and their one entry, gpu_bench
 * (`gpu_test --bench OP[,OP..]`, OP one of norm, router, attention, matmul, moe, logits, logprobs, frontend,
 * kstep, all).
 *
 * gpu_bench checks the op list first (an unknown name: one line on stderr, status 2, nothing
 * run), then sets up one bh_run on device 0: the stock-kernel context at the spark1x widths,
 * the read bandwidth (sm_cuda_read_bandwidth, 4 GiB, best of 5) and the bf16 tensor-core rate
 * (a cuBLAS product of 8192 x 8192 x 8192 on random bf16 through sm_k_mm_blas, best of 5 after
 * one warm-up), runs each op's driver, which prints its table, and ends with the summary
 * table (one line per op, case and row count).  We rejected one program per op: the probes,
 * context and summary would be set up six times, and the ops would drift apart in method.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda/common.cuh"
#include "backend/stats.h"
#include "cuda/bench/bench.h"
#include "bench.h"
#include "../../tests/gpu/gpu_tests.h"

/* ---- kernels ---------------------------------------------------------------------------- */

/* Keeps the GPU busy for about ns nanoseconds, so the launches after it queue up behind it. */
__global__ void bh_spin_kernel(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

/* SM cycles and globaltimer ns over about ns nanoseconds, by one thread. */
__global__ void bh_clock_kernel(long long ns, long long *out) {
    long long t0, t;
    const long long c0 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    out[0] = clock64() - c0;
    out[1] = t - t0;
}

/* out[i] = mean + sd * z_i (src/model/rng.h normals of stream key), bf16 (f32 when f32 != 0). */
__global__ void bh_normal_kernel(void *out, int64_t n, uint64_t key, float mean, float sd, int f32) {
    const int64_t np = (n + 1) / 2;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < np; k += (int64_t)gridDim.x * blockDim.x) {
        float z[2];
        sm_rng_normal_pair(key, k, &z[0], &z[1]);
        for (int j = 0; j < 2; j++) {
            const int64_t i = 2 * k + j;
            if (i >= n) break;
            const float v = mean + sd * z[j];
            if (f32) ((float *)out)[i] = v;
            else ((uint16_t *)out)[i] = sm_f32_to_bf16(v);
        }
    }
}

/* ---- harness ------------------------------------------------------------------------------ */

int bh_sets(const bh_run *r, double set_bytes) {
    if (set_bytes <= 0) return BH_MAX_SETS;
    const double want = BH_L2_TIMES * r->l2 / set_bytes;
    int n = want >= BH_MAX_SETS ? BH_MAX_SETS : (int)want + 1;
    return n < 2 ? 2 : n;
}

int bh_time(bh_run *r, bh_call fn, void *arg, int nsets, int per_interval, float *us, sm_err *e) {
    static_assert(BH_WARM >= 1, "one warm-up call at least");
    if (nsets < 1 || per_interval < 1 || r->iters < 1 || r->iters > BH_MAX_ITERS)
        return sm_errf(e, "bench: bad timing request (sets %d, calls %d, iters %d)", nsets, per_interval, r->iters);
    float t[BH_MAX_ITERS];
    long call = 0;
    for (int it = -BH_WARM; it < r->iters; it++) {
        bh_spin_kernel<<<1, 32, 0, r->st>>>(BH_SPIN_NS);
        SM_LAUNCH_CHECK("bh_spin_kernel");
        if (r->evict && bh_evict_icache(r, e)) return -1;
        SM_CUDA_CHECK(cudaEventRecord(r->ea, r->st));
        for (int h = 0; h < per_interval; h++, call++)
            if (fn(r, arg, (int)(call % nsets), e)) return -1;
        SM_CUDA_CHECK(cudaEventRecord(r->eb, r->st));
        SM_CUDA_CHECK(cudaEventSynchronize(r->eb));
        SM_CUDA_CHECK(cudaGetLastError());
        float ms = 0;
        SM_CUDA_CHECK(cudaEventElapsedTime(&ms, r->ea, r->eb));
        if (it >= 0) t[it] = ms * 1e3f / (float)per_interval;
    }
    *us = sm_median(t, r->iters);
    return 0;
}

int bh_sm_mhz(bh_run *r, double *mhz, sm_err *e) {
    long long *d = NULL, h[2] = {0, 0};
    SM_CUDA_CHECK(cudaMalloc((void **)&d, sizeof h));
    bh_clock_kernel<<<1, 1, 0, r->st>>>(1000000, d);
    cudaError_t rc = cudaGetLastError();
    if (rc == cudaSuccess) rc = cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, r->st);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(r->st);
    SM_CUDA_CHECK_PRINT(cudaFree(d));
    if (rc != cudaSuccess) return sm_errf(e, "bench: SM clock probe: %s", cudaGetErrorString(rc));
    *mhz = h[1] > 0 ? (double)h[0] / (double)h[1] * 1e3 : 0.0;
    return 0;
}

static int bh_normal(bh_run *r, void *p, size_t n, const char *name, float mean, float sd, int f32, sm_err *e) {
    if (!n) return 0;
    const int64_t np = (int64_t)((n + 1) / 2);
    int64_t blocks = (np + 255) / 256;
    if (blocks > (int64_t)r->sms * 16) blocks = (int64_t)r->sms * 16;
    bh_normal_kernel<<<(unsigned)blocks, 256, 0, r->st>>>(p, (int64_t)n, sm_rng_key(r->seed, name), mean, sd, f32);
    SM_LAUNCH_CHECK("bh_normal_kernel");
    return 0;
}
int bh_normal_bf16(bh_run *r, uint16_t *p, size_t n, const char *name, float mean, float sd, sm_err *e) {
    return bh_normal(r, p, n, name, mean, sd, 0, e);
}
int bh_normal_f32(bh_run *r, float *p, size_t n, const char *name, float mean, float sd, sm_err *e) {
    return bh_normal(r, p, n, name, mean, sd, 1, e);
}

double bh_floor_us(const bh_run *r, double bytes, double flops) {
    const double b = bytes / r->bw * 1e6, f = flops / r->rate * 1e6;
    return b > f ? b : f;
}

void bh_head(const char *title, const char *counts) {
    printf("\n== %s\n   floor = max(bytes / read bandwidth, FLOPs / bf16 rate); bytes: %s\n", title, counts);
    printf("%-10s %-20s %4s %9s %9s %7s %9s %9s %8s\n", "op", "case", "rows", "us", "MB", "GB/s", "floor_B", "floor_F",
           "%floor");
}

void bh_add(bh_run *r, const char *op, int rows, float us, double floor_us) {
    if (r->nlines >= BH_MAX_LINES) return;
    bh_line *l = &r->lines[r->nlines++];
    snprintf(l->op, sizeof l->op, "%s", op);
    l->rows = rows;
    l->us = us;
    l->floor_us = (float)floor_us;
}

void bh_row(bh_run *r, const char *op, const char *what, int rows, float us, double bytes, double flops,
            const char *extra, int summary) {
    const double fb = bytes / r->bw * 1e6, ff = flops / r->rate * 1e6, fl = bh_floor_us(r, bytes, flops);
    char fs[32] = "-";
    if (flops > 0) snprintf(fs, sizeof fs, "%.2f", ff);
    printf("%-10s %-20s %4d %9.2f %9.2f %7.0f %9.2f %9s %7.1f%%%s%s\n", op, what, rows, us, bytes / 1e6,
           bytes / (us * 1e-6) / 1e9, fb, fs, 100.0 * fl / us, extra ? "  " : "", extra ? extra : "");
    fflush(stdout);
    if (summary) {
        char name[64];
        snprintf(name, sizeof name, "%s %s", op, what);
        bh_add(r, name, rows, us, fl);
    }
}

/* bf16 tensor-core rate: best of 5 products y [N, N] = x [N, N] @ W [N, N]^T (cuBLAS) after one
 * warm-up, on random inputs.  Buffers in *bufs (freed by the caller). */
static int bh_rate(bh_run *r, void *bufs[3], sm_err *e) {
    const int N = 8192;
    const size_t bytes = (size_t)N * N * 2;
    for (int i = 0; i < 3; i++) SM_CUDA_CHECK(cudaMalloc(&bufs[i], bytes));
    if (bh_normal_bf16(r, (uint16_t *)bufs[0], (size_t)N * N, "bench.rate.x", 0.0f, 1.0f, e) ||
        bh_normal_bf16(r, (uint16_t *)bufs[1], (size_t)N * N, "bench.rate.w", 0.0f, 0.011f, e))
        return -1;
    float best = 0;
    for (int it = -1; it < 5; it++) {
        SM_CUDA_CHECK(cudaEventRecord(r->ea, r->st));
        if (sm_k_mm_blas(&r->kc, (const uint16_t *)bufs[0], N, N, (const uint16_t *)bufs[1], N, (uint16_t *)bufs[2], r->st, e))
            return sm_errprefix(e, "bench: tensor-core rate probe");
        SM_CUDA_CHECK(cudaEventRecord(r->eb, r->st));
        SM_CUDA_CHECK(cudaEventSynchronize(r->eb));
        float ms = 0;
        SM_CUDA_CHECK(cudaEventElapsedTime(&ms, r->ea, r->eb));
        if (it >= 0 && (best == 0 || ms < best)) best = ms;
    }
    r->rate = 2.0 * N * (double)N * N / (best * 1e-3);
    return 0;
}

/* Everything of r that needs the device: context, stream, events, both ceilings. */
static int bh_setup(bh_run *r, sm_err *e) {
    if (sm_config_preset("spark1x", &r->cfg, e)) return -1;
    sm_cuda_devinfo d;
    if (sm_cuda_device_info(0, &d, e)) return -1;
    r->sms = d.sms;
    r->l2 = d.l2_bytes;
    if (sm_cuda_read_bandwidth(0, 4.0, 5, &r->bw, e)) return -1;
    if (sm_kernel_ctx_init(&r->kc, 0, sm_cuda_ws_bytes(&r->cfg, BH_MAX_ROWS), e)) return -1;
    SM_CUDA_CHECK(cudaStreamCreateWithFlags(&r->st, cudaStreamNonBlocking));
    SM_CUDA_CHECK(cudaEventCreate(&r->ea));
    SM_CUDA_CHECK(cudaEventCreate(&r->eb));
    void *bufs[3] = {NULL, NULL, NULL};
    int rc = bh_rate(r, bufs, e);
    for (int i = 0; i < 3; i++)
        if (bufs[i]) SM_CUDA_CHECK_PRINT(cudaFree(bufs[i]));
    if (rc) return -1;
    printf("per-op benchmarks: %s, %d SMs, L2 %.0f MB; read bandwidth %.0f GB/s (streaming read of 4 GiB, best of 5); "
           "bf16 tensor rate %.0f TFLOP/s (cuBLAS 8192^3, best of 5)\n",
           d.name, d.sms, r->l2 / 1e6, r->bw / 1e9, r->rate / 1e12);
    printf("widths of spark1x: H %d, Hm %d, I %d, E %d, K %d, nH %d, nKV %d, D %d, V %d; seed %llu%s\n", r->cfg.H,
           r->cfg.Hm, r->cfg.I, r->cfg.E, r->cfg.K, r->cfg.nH, r->cfg.nKV, r->cfg.D, r->cfg.V, (unsigned long long)r->seed,
           r->kc.tma_encode ? "" : "; NO wgmma path on this device");
    printf("each case: %d warm-up calls, median of %d timed calls (CUDA events, a %d us spin kernel ahead of each), "
           "inputs rotated over sets of >= %d x L2 in all, random (src/model/rng.h), never zeros\n",
           BH_WARM, r->iters, BH_SPIN_NS / 1000, BH_L2_TIMES);
    return 0;
}

static void bh_teardown(bh_run *r) {
    if (r->ea) SM_CUDA_CHECK_PRINT(cudaEventDestroy(r->ea));
    if (r->eb) SM_CUDA_CHECK_PRINT(cudaEventDestroy(r->eb));
    if (r->st) SM_CUDA_CHECK_PRINT(cudaStreamDestroy(r->st));
    if (r->fe_out) SM_CUDA_CHECK_PRINT(cudaFree(r->fe_out));
    if (r->fe_flush) SM_CUDA_CHECK_PRINT(cudaFree(r->fe_flush));
    sm_kernel_ctx_free(&r->kc);
}

static void bh_summary(const bh_run *r) {
    printf("\nop summary (spark1x widths; read bandwidth %.0f GB/s, bf16 rate %.0f TFLOP/s; "
           "floor = max(bytes / bandwidth, FLOPs / rate)):\n", r->bw / 1e9, r->rate / 1e12);
    printf("%-28s %4s %10s %10s %7s\n", "op", "rows", "us", "floor us", "%floor");
    for (int i = 0; i < r->nlines; i++) {
        const bh_line *l = &r->lines[i];
        printf("%-28s %4d %10.2f %10.2f %6.1f%%\n", l->op, l->rows, l->us, l->floor_us, 100.0 * l->floor_us / l->us);
    }
    fflush(stdout);
}

/* ---- entry ------------------------------------------------------------------------------- */

typedef struct bh_op {
    const char *name;                     /* OP of `--bench OP` */
    int (*fn)(bh_run *r, sm_err *e);      /* its driver */
} bh_op;

static const bh_op bh_ops[] = {
    {"norm", bench_norm}, {"router", bench_router}, {"attention", bench_attention},
    {"matmul", bench_matmul}, {"moe", bench_moe}, {"logits", bench_logits}, {"logprobs", bench_logprobs},
    {"frontend", bench_frontend}, {"kstep", bench_kstep},
};
#define BH_NOPS ((int)(sizeof bh_ops / sizeof bh_ops[0]))
#define BH_OP_LIST "norm, router, attention, matmul, moe, logits, logprobs, frontend, kstep, all" /* the names above, for the messages */

/* want[i] = 1 for each op named in the comma-separated list (or all); -1 on an unknown name. */
static int bh_parse(const char *list, int want[BH_NOPS]) {
    memset(want, 0, sizeof(int) * BH_NOPS);
    const char *p = list;
    if (!*p) {
        fprintf(stderr, "gpu_test --bench: empty op list (ops: " BH_OP_LIST ")\n");
        return -1;
    }
    while (*p) {
        const char *q = strchr(p, ',');
        const size_t len = q ? (size_t)(q - p) : strlen(p);
        int found = 0;
        if (len == 3 && !strncmp(p, "all", 3)) {
            for (int i = 0; i < BH_NOPS; i++) want[i] = 1;
            found = 1;
        }
        for (int i = 0; i < BH_NOPS && !found; i++)
            if (strlen(bh_ops[i].name) == len && !strncmp(p, bh_ops[i].name, len)) want[i] = found = 1;
        if (!found) {
            fprintf(stderr, "gpu_test --bench: unknown op '%.*s' in '%s' (ops: " BH_OP_LIST ")\n",
                    (int)len, p, list);
            return -1;
        }
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

extern "C" int gpu_bench(const char *ops) {
    int want[BH_NOPS];
    if (bh_parse(ops, want)) return 2;
    bh_run *r = (bh_run *)calloc(1, sizeof *r);
    if (!r) { printf("bench: out of host memory\n"); return 1; }
    const char *s = getenv("SM_BENCH_SEED");
    r->seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    r->iters = BH_ITERS;
    const int rows[BH_NROWS] = {8, 16, 32, 64, 128};
    memcpy(r->rows, rows, sizeof rows);
    sm_err e = {""};
    int rc = bh_setup(r, &e) ? 1 : 0;
    if (rc) printf("bench: setup: %s\n", e.msg);
    for (int i = 0; i < BH_NOPS && !rc; i++) {
        if (!want[i]) continue;
        r->iters = BH_ITERS;
        if (bh_ops[i].fn(r, &e)) {
            printf("bench %s: %s\n", bh_ops[i].name, e.msg);
            rc = 1;
        }
    }
    if (r->nlines) bh_summary(r);
    bh_teardown(r);
    free(r);
    return rc;
}
