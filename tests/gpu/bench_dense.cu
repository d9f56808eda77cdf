/* bench_dense.cu: microbenchmark of the dense few-row kernels (`gpu_test --bench-dense`): the
 * lm_head logits (h [n, 8192] x lm_head [202048, 8192] -> softcap, mask, argmax) and every dense
 * matmul of a real-width layer (fused q/k/v/gate [10240 x 8192], o_proj [8192 x 8192], pooler
 * [4096 x 8192], unpooler [8192 x 4096], router f32 [256 x 8192]) at n = 8, 32, 64, 128 rows,
 * through each path of kernels.h (mma.sync core, wgmma 128-row tiles, wgmma 256-row tiles, and
 * what the dispatcher picks).
 *
 * Timing: CUDA events around one call, median of 50 after 5 warm-up calls; a short spin kernel
 * before each timed call keeps host launch latency (tensor-map encoding included) out of the
 * interval; weights rotate over enough copies (>= 2, >= 3x the L2 size in all) that no call
 * finds its matrix in L2.  For the dispatcher's path the table also gives "b2b": the time per
 * call of two calls back to back on different copies (the second starts while the first drains;
 * the difference to a single call is the per-launch start and drain cost).  Weights are random bf16 / f32 (never zeros).  Floor = bytes of the
 * weight matrix / read bandwidth measured in the same run (read-only streaming kernel, 4 GiB).
 * We rejected timing inside CUDA graphs here: the question is the kernel's own speed, and the
 * graph-level view is `sparkmono bench`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cuda_runtime.h>
extern "C" {
#include "err.h"
}
#include "cuda/kernels.h"
#include "cuda/stock/bench.h"
#include "gpu_tests.h"

#define BD_ITERS 50
#define BD_WARM 5
#define BD_MAX_ROWS 128

#define BD_CHECK(x)                                                                                   \
    do {                                                                                              \
        cudaError_t rc_ = (x);                                                                        \
        if (rc_ != cudaSuccess) { printf("bench-dense: %s: %s\n", #x, cudaGetErrorString(rc_)); return 1; } \
    } while (0)

typedef struct bd_shape {
    const char *name;   /* table label */
    int m, k;           /* W [m, k] */
    int kind;           /* 0 bf16 matmul, 1 lm_head logits, 2 f32-weight router matmul */
} bd_shape;

/* Counter-based hash -> uniform in [-1, 1) -> value with standard deviation sd (never 0 bits
 * in practice: an exact zero needs the hash to hit one of 2 values out of 2^24). */
__device__ __forceinline__ float bd_rand(uint64_t key, size_t i, float sd) {
    uint64_t z = key + (uint64_t)i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
    return u * sd * 1.7320508f;
}
__global__ void bd_fill_bf16(uint16_t *p, size_t n, uint64_t key, float sd) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = bd_rand(key, i, sd);
        uint32_t u = __float_as_uint(v);
        u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
        p[i] = (uint16_t)(u >> 16);
    }
}
__global__ void bd_fill_f32(float *p, size_t n, uint64_t key, float sd) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = bd_rand(key, i, sd);
}
/* Keeps the GPU busy for about `ns` nanoseconds so the next launches queue up behind it. */
__global__ void bd_spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

static int bd_cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* One call of shape s at n rows through path p (weights copy w). */
static int bd_call(sm_cuda_ctx *c, const bd_shape *s, int p, int n, const uint16_t *x, const void *w, void *y, int *am,
                   cudaStream_t st, sm_err *e) {
    if (s->kind == 1)
        return sm_k_logits_path(c, p, x, n, s->k, (const uint16_t *)w, s->m, 201818, 0.17677669529663687f, 20.0f, NULL, am, st, e);
    if (s->kind == 2) return sm_k_mm_f32w(c, x, n, s->k, (const float *)w, s->m, (float *)y, st, e);
    return sm_k_mm_path(c, p, x, n, s->k, (const uint16_t *)w, s->m, (uint16_t *)y, st, e);
}

static const char *bd_path(int p) {
    return p == SM_PATH_SYNC ? "mma.sync" : p == SM_PATH_WG1 ? "wgmma128" : p == SM_PATH_WG2 ? "wgmma256" : "auto";
}

extern "C" int gpu_bench_dense(void) {
    sm_err e = {""};
    double bw = 0;
    if (sm_cuda_read_bandwidth(0, 4.0, 5, &bw, &e)) { printf("bench-dense: %s\n", e.msg); return 1; }
    cudaDeviceProp prop;
    BD_CHECK(cudaGetDeviceProperties(&prop, 0));
    sm_cuda_ctx c;
    if (sm_cuda_ctx_init(&c, 0, 0, &e)) { printf("bench-dense: %s\n", e.msg); return 1; }
    printf("dense bench: %s, %d SMs, L2 %d MB, read bandwidth %.0f GB/s (streaming read of 4 GiB, best of 5)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e9);
    printf("median of %d calls (CUDA events, spin kernel ahead), weights rotated beyond L2; floor = weight bytes / read bandwidth%s\n",
           BD_ITERS, c.tma_encode ? "" : "; NO wgmma path on this device");
    static const bd_shape shapes[] = {
        {"lm_head", 202048, 8192, 1}, {"qkvg", 10240, 8192, 0}, {"o_proj", 8192, 8192, 0},
        {"pooler", 4096, 8192, 0},    {"unpooler", 8192, 4096, 0}, {"router_f32", 256, 8192, 2},
    };
    static const int rows[] = {8, 32, 64, 128};
    const int nshape = (int)(sizeof shapes / sizeof shapes[0]), nrows = (int)(sizeof rows / sizeof rows[0]);
    cudaStream_t st;
    BD_CHECK(cudaStreamCreate(&st));
    cudaEvent_t ea, eb;
    BD_CHECK(cudaEventCreate(&ea));
    BD_CHECK(cudaEventCreate(&eb));
    uint16_t *x;
    void *y;
    int *am;
    BD_CHECK(cudaMalloc((void **)&x, (size_t)BD_MAX_ROWS * 8192 * 2));
    BD_CHECK(cudaMalloc(&y, (size_t)BD_MAX_ROWS * 10240 * 4));
    BD_CHECK(cudaMalloc((void **)&am, BD_MAX_ROWS * sizeof(int)));
    bd_fill_bf16<<<1024, 256, 0, st>>>(x, (size_t)BD_MAX_ROWS * 8192, 7, 1.0f);
    BD_CHECK(cudaGetLastError());
    printf("%-10s %4s %-9s %9s %9s %9s %8s %9s\n", "matrix", "rows", "path", "us", "GB/s", "floor us", "of floor", "b2b us");
    int rc = 0;
    for (int si = 0; si < nshape && !rc; si++) {
        const bd_shape *s = &shapes[si];
        const size_t esz = s->kind == 2 ? 4 : 2, bytes = (size_t)s->m * s->k * esz;
        int copies = (int)((3.0 * prop.l2CacheSize + (double)bytes - 1) / (double)bytes);
        if (copies < 2) copies = 2;
        void *w[64];
        if (copies > 64) copies = 64;
        for (int i = 0; i < copies; i++) {
            BD_CHECK(cudaMalloc(&w[i], bytes));
            if (esz == 4) bd_fill_f32<<<2048, 256, 0, st>>>((float *)w[i], bytes / 4, 100 + i, 1.0f / sqrtf((float)s->k));
            else bd_fill_bf16<<<2048, 256, 0, st>>>((uint16_t *)w[i], bytes / 2, 100 + i, s->kind == 1 ? 0.3f : 1.0f / sqrtf((float)s->k));
            BD_CHECK(cudaGetLastError());
        }
        BD_CHECK(cudaStreamSynchronize(st));
        const double floor_us = (double)bytes / bw * 1e6;
        for (int ri = 0; ri < nrows && !rc; ri++) {
            const int n = rows[ri];
            for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2 && !rc; p++) {
                if (s->kind == 2 && p != SM_PATH_AUTO) continue; /* one router kernel */
                if (!c.tma_encode && (p == SM_PATH_WG1 || p == SM_PATH_WG2)) continue;
                float t[BD_ITERS];
                for (int it = -BD_WARM; it < BD_ITERS; it++) {
                    const void *wi = w[(it + BD_WARM) % copies];
                    bd_spin<<<1, 32, 0, st>>>(30000);
                    cudaEventRecord(ea, st);
                    if (bd_call(&c, s, p, n, x, wi, y, am, st, &e)) { printf("bench-dense: %s\n", e.msg); rc = 1; break; }
                    cudaEventRecord(eb, st);
                    cudaError_t r = cudaEventSynchronize(eb);
                    if (r == cudaSuccess) r = cudaGetLastError();
                    if (r != cudaSuccess) { printf("bench-dense: %s %s n=%d: %s\n", s->name, bd_path(p), n, cudaGetErrorString(r)); rc = 1; break; }
                    float ms = 0;
                    cudaEventElapsedTime(&ms, ea, eb);
                    if (it >= 0) t[it] = ms;
                }
                if (rc) break;
                qsort(t, BD_ITERS, sizeof(float), bd_cmp);
                const double us = 0.5 * (t[BD_ITERS / 2 - 1] + t[BD_ITERS / 2]) * 1e3;
                double b2b = 0;
                if (p == SM_PATH_AUTO) {
                    /* two calls between the events, per call */
                    for (int it = -BD_WARM; it < BD_ITERS && !rc; it++) {
                        bd_spin<<<1, 32, 0, st>>>(30000);
                        cudaEventRecord(ea, st);
                        for (int h = 0; h < 2 && !rc; h++)
                            if (bd_call(&c, s, p, n, x, w[(2 * (it + BD_WARM) + h) % copies], y, am, st, &e)) { printf("bench-dense: %s\n", e.msg); rc = 1; }
                        cudaEventRecord(eb, st);
                        if (cudaEventSynchronize(eb) != cudaSuccess || cudaGetLastError() != cudaSuccess) { printf("bench-dense: b2b failed\n"); rc = 1; }
                        float ms = 0;
                        cudaEventElapsedTime(&ms, ea, eb);
                        if (it >= 0) t[it] = ms;
                    }
                    if (rc) break;
                    qsort(t, BD_ITERS, sizeof(float), bd_cmp);
                    b2b = 0.5 * (t[BD_ITERS / 2 - 1] + t[BD_ITERS / 2]) * 1e3 / 2;
                }
                printf("%-10s %4d %-9s %9.1f %9.0f %9.1f %7.1f%%", s->name, n, s->kind == 2 ? "ffma" : bd_path(p), us,
                       (double)bytes / (us * 1e-6) / 1e9, floor_us, 100.0 * floor_us / us);
                if (b2b > 0) printf(" %9.1f", b2b);
                printf("\n");
                fflush(stdout);
            }
        }
        for (int i = 0; i < copies; i++) cudaFree(w[i]);
    }
    cudaFree(x);
    cudaFree(y);
    cudaFree(am);
    cudaEventDestroy(ea);
    cudaEventDestroy(eb);
    cudaStreamDestroy(st);
    sm_cuda_ctx_free(&c);
    return rc;
}
