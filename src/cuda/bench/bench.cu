/* bench.cu: the bench hooks of the CUDA backend (bench.h): device facts, the read-bandwidth
 * probe, random KV fill, graph-replay timing of whole steps and of single layers, routing
 * and expert facts for the floors, a world's exchanges alone and its ranks' aux outputs.
 *
 * Timing follows DESIGN.md: CUDA events on the context's stream around a graph replay (plus
 * the metadata copy for whole steps), after warm-up, median over many replays (stats.h); the
 * probe streams a buffer far larger than L2 with read-only loads and reports the best pass.
 * Every hook makes the backend's device current first (cb_from_backend).  We rejected host
 * clocks around single launches: launch gaps and host jitter dominate small row counts.
 */
#include "cuda/rank/rank.h"
#include "backend/stats.h"
#include "model/rng.h"
#include "bench.h"
#include <stdlib.h>
#include <time.h>
#include <string.h>

/* ---- device facts ---------------------------------------------------------------------------- */

extern "C" int sm_cuda_device_info(int device, sm_cuda_devinfo *d, sm_err *e) {
    memset(d, 0, sizeof *d);
    if (sm_cuda_device_check(device, 0, "cuda", e)) return -1;
    cudaDeviceProp p;
    SM_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    SM_CUDA_CHECK(cudaSetDevice(device));
    snprintf(d->name, sizeof d->name, "%s", p.name);
    d->cc_major = p.major;
    d->cc_minor = p.minor;
    d->sms = p.multiProcessorCount;
    d->l2_bytes = (double)p.l2CacheSize;
    size_t fr = 0, tot = 0;
    SM_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    d->mem_total = (double)tot;
    d->mem_free = (double)fr;
    return 0;
}

/* ---- read bandwidth ---------------------------------------------------------------------------- */

/* Read every 16-byte word of p once (4 loads in flight a thread); the xor keeps them alive. */
__global__ void cb_read_kernel(const uint4 *__restrict__ p, size_t n, uint32_t *sink) {
    uint32_t acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) { uint4 a = __ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9E3779B9u) sink[0] = acc; /* practically never: only defeats dead-code removal */
}

/* Best time (ms) of reps passes of the read kernel over buf [bytes] on st, after a warm-up. */
static int cb_time_reads(const void *buf, size_t bytes, uint32_t *sink, int sms, int reps, cudaStream_t st, float *best,
                         sm_err *e) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    *best = 0;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) rc = sm_errf(e, "read bandwidth: cudaEventCreate failed");
    for (int it = -1; it < reps && !rc; it++) { /* one warm-up pass */
        cudaEventRecord(e0, st);
        cb_read_kernel<<<sms * 4, 512, 0, st>>>((const uint4 *)buf, bytes / 16, sink);
        cudaEventRecord(e1, st);
        cudaError_t r = cudaEventSynchronize(e1);
        if (r == cudaSuccess) r = cudaGetLastError();
        if (r != cudaSuccess) { rc = sm_errf(e, "read bandwidth: kernel failed: %s", cudaGetErrorString(r)); break; }
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (it >= 0 && (*best == 0 || ms < *best)) *best = ms;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

extern "C" int sm_cuda_read_bandwidth(int device, double gib, int reps, double *bytes_per_s, sm_err *e) {
    size_t bytes = (size_t)(gib * 1073741824.0) / 16 * 16;
    if (bytes < 16 || reps < 1) return sm_errf(e, "read bandwidth: bad size %.2f GiB or reps %d", gib, reps);
    if (sm_cuda_device_check(device, 0, "read bandwidth", e)) return -1;
    SM_CUDA_CHECK(cudaSetDevice(device));
    int sms = 132;
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    void *buf = NULL;
    uint32_t *sink = NULL;
    cudaStream_t st = NULL;
    if (cudaMalloc(&buf, bytes) != cudaSuccess) {
        cudaGetLastError();
        return sm_errf(e, "read bandwidth: cannot allocate %.2f GiB on device %d", gib, device);
    }
    int rc = 0;
    float best = 0;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess || cudaMalloc(&sink, 4) != cudaSuccess ||
        cudaMemsetAsync(buf, 0x5A, bytes, st) != cudaSuccess)
        rc = sm_errf(e, "read bandwidth: setup failed on device %d", device);
    if (!rc) rc = cb_time_reads(buf, bytes, sink, sms, reps, st, &best, e);
    if (st) SM_CUDA_CHECK_PRINT(cudaStreamDestroy(st));
    if (sink) SM_CUDA_CHECK_PRINT(cudaFree(sink));
    SM_CUDA_CHECK_PRINT(cudaFree(buf));
    if (!rc) *bytes_per_s = (double)bytes / (best * 1e-3);
    return rc;
}

/* ---- KV fill, facts -------------------------------------------------------------------------- */

/* bf16 N(0, 1) from the hash of (key, i), never exactly zero in practice. */
__global__ void cb_fill_kernel(uint16_t *p, size_t n, uint64_t key) {
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; 2 * k < n; k += (size_t)gridDim.x * blockDim.x) {
        float z0, z1;
        sm_rng_normal_pair(key, (int64_t)k, &z0, &z1);
        p[2 * k] = sm_f32_to_bf16(z0);
        if (2 * k + 1 < n) p[2 * k + 1] = sm_f32_to_bf16(z1);
    }
}

/* Fill rank cr's KV pages (the zero page nblocks stays zero). */
static int cb_fill_kv(sm_cuda_rank *cr, uint64_t seed, sm_err *e) {
    if (cb_enter(cr, e)) return -1;
    size_t n = (size_t)cr->kvs.nblocks * cr->plan.nKVl * SM_KV_BLOCK * 2 * cr->cfg.D;
    for (int l = 0; l < cr->cfg.L; l++) {
        cb_fill_kernel<<<cr->kc.num_sms * 8, 256, 0, cr->st>>>(cr->layers[l].kv, n,
                                                             sm_mix64(seed * 1000003ull + (uint64_t)(cr->rank * 4096 + l) + 1));
        SM_LAUNCH_CHECK("cb_fill_kernel");
    }
    SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    return 0;
}

extern "C" int sm_cuda_bench_fill_kv(const sm_backend *b, uint64_t seed, sm_err *e) {
    sm_cuda_rank **rk;
    const int W = cb_world_ranks(b, &rk);
    for (int r = 0; r < W; r++)
        if (cb_fill_kv(rk[r], seed, e)) return -1;
    if (W) return 0;
    sm_cuda_rank *cr = cb_from_backend(b, "cuda bench", e);
    return cr ? cb_fill_kv(cr, seed, e) : -1;
}

extern "C" int sm_cuda_bench_layer_info(const sm_backend *b, int *fmt, double *expert_bytes, sm_err *e) {
    sm_cuda_rank *cr = cb_rank0(b, "cuda bench", e);
    if (!cr) return -1;
    for (int l = 0; l < cr->cfg.L; l++) {
        const sm_cuda_moe_layer *M = &cr->layers[l].moe;
        fmt[l] = M->fmt;
        expert_bytes[l] = M->touched_bytes ? (double)M->touched_bytes
                        : M->expert_bytes ? (double)M->expert_bytes
                        : M->E > 0 ? (double)M->blob_bytes / M->E : 0.0;
    }
    return 0;
}

extern "C" int sm_cuda_bench_routing(const sm_backend *b, int n, int *idx, sm_err *e) {
    sm_cuda_rank *cr = cb_rank0(b, "cuda bench", e);
    if (!cr) return -1;
    if (n < 1 || n > cr->cap) return sm_errf(e, "cuda bench: routing of %d rows (capacity %d)", n, cr->cap);
    size_t K = (size_t)cr->cfg.K;
    for (int l = 0; l < cr->cfg.L; l++)
        SM_CUDA_CHECK(cudaMemcpyAsync(idx + (size_t)l * n * K, cr->idx + (size_t)l * cr->cap * K, (size_t)n * K * 4,
                                      cudaMemcpyDeviceToHost, cr->st));
    SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    return 0;
}

/* ---- timing ---------------------------------------------------------------------------------- */

/* A step the timing hooks take: one graph (<= CB_GRAPH_ROWS rows, graph form), no outputs
 * but argmax. */
static int cb_timed_form(const sm_step *s, sm_err *e) {
    if (s->logits || s->naux) return sm_errf(e, "cuda bench: timed steps take no logits and no aux");
    if (s->nrows < 1 || s->nrows > CB_GRAPH_ROWS || !cb_graph_form(s))
        return sm_errf(e, "cuda bench: step of %d rows is not one graph-form verify step (1..%d rows, <= %d a request)",
                       s->nrows, CB_GRAPH_ROWS, CB_GRAPH_REQ_ROWS);
    return 0;
}

/* warmup + iters timed steps rotating over sets (already captured); ms [iters]. */
static int cb_time_steps(sm_cuda_rank *cr, const sm_step *sets, int nsets, int warmup, int iters, float *ms, sm_err *e) {
    cudaEvent_t e0, e1;
    SM_CUDA_CHECK(cudaEventCreate(&e0));
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return sm_errf(e, "cuda bench: cudaEventCreate failed (device %d)", cr->device);
    }
    int n = sets[0].nrows, nb = cb_bucket_rows(n), rc = 0;
    for (int it = 0; it < warmup + iters && !rc; it++) {
        const sm_step *s = &sets[it % nsets];
        size_t bytes = cb_pack(cr, s, 0, n, nb);
        int fresh = 0;
        /* timed: metadata copy + graph replay */
        if (cudaEventRecord(e0, cr->st) != cudaSuccess) { rc = sm_errf(e, "cuda bench: cudaEventRecord failed"); break; }
        if (cb_launch_graph(cr, s, bytes, nb, &fresh, e)) { rc = -1; break; }
        if (cudaEventRecord(e1, cr->st) != cudaSuccess) { rc = sm_errf(e, "cuda bench: cudaEventRecord failed"); break; }
        cudaError_t r = cudaEventSynchronize(e1);
        if (r != cudaSuccess) { rc = sm_errf(e, "cuda bench: step failed on device %d: %s", cr->device, cudaGetErrorString(r)); break; }
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= warmup) ms[it - warmup] = t;
    }
    cudaStreamSynchronize(cr->st);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cr->last_nb = nb;
    cr->last_graph = 1;
    return rc;
}

extern "C" int sm_cuda_bench_steps(const sm_backend *b, const sm_step *sets, int nsets, int warmup, int iters, float *ms,
                                   int *graphed, sm_err *e) {
    sm_cuda_rank **rk;
    sm_cuda_rank *cr = cb_rank0(b, "cuda bench", e);
    if (!cr) return -1;
    if (nsets < 1 || iters < 1) return sm_errf(e, "cuda bench: need at least one input set and one iteration");
    for (int i = 0; i < nsets; i++) {
        if (cb_timed_form(&sets[i], e)) return -1;
        if (sets[i].nrows != sets[0].nrows) return sm_errf(e, "cuda bench: every input set must have the same rows");
        /* first run of each set: checks, captures the bucket's graph */
        if (b->step(b->ctx, &sets[i], e)) return -1;
    }
    if (cb_world_ranks(b, &rk)) { /* a world: host wall clock around each step */
        if (graphed) *graphed = 0;
        for (int it = 0; it < warmup + iters; it++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            if (b->step(b->ctx, &sets[it % nsets], e)) return -1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (it >= warmup) ms[it - warmup] = (float)(1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec));
        }
        return 0;
    }
    if (graphed) *graphed = 1;
    return cb_time_steps(cr, sets, nsets, warmup, iters, ms, e);
}

/* Median microseconds of `iters` replays of exec (after two warm-up replays). */
static int cb_time_graph(sm_cuda_rank *cr, cudaGraphExec_t exec, int iters, float *us, sm_err *e) {
    float *v = (float *)malloc(sizeof(float) * (size_t)iters);
    if (!v) return sm_errf(e, "cuda bench: out of host memory");
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        rc = sm_errf(e, "cuda bench: cudaEventCreate failed (device %d)", cr->device);
    for (int it = -2; it < iters && !rc; it++) {
        cudaEventRecord(e0, cr->st);
        cudaError_t r = cudaGraphLaunch(exec, cr->st);
        cudaEventRecord(e1, cr->st);
        if (r == cudaSuccess) r = cudaEventSynchronize(e1);
        if (r != cudaSuccess) { rc = sm_errf(e, "cuda bench: graph replay failed on device %d: %s", cr->device, cudaGetErrorString(r)); break; }
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= 0) v[it] = t * 1000.0f;
    }
    if (!rc) *us = sm_median(v, iters);
    free(v);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

extern "C" int sm_cuda_bench_layers(const sm_backend *b, const sm_step *s, int iters, float *layer_us, float *moe_us,
                                    float *head_us, sm_err *e) {
    sm_cuda_rank *cr = cb_from_backend(b, "cuda bench", e);
    if (!cr) return -1;
    if (cb_timed_form(s, e)) return -1;
    if (iters < 1) return sm_errf(e, "cuda bench: iters %d", iters);
    /* one real step leaves its metadata and activations on the device */
    if (b->step(b->ctx, s, e)) return -1;
    int nb = cr->last_nb;
    for (int l = -1; l < cr->cfg.L; l++) {
        for (int part = 0; part < 2; part++) {
            if (l < 0 && part) continue;
            cb_run r;
            memset(&r, 0, sizeof r);
            r.n = nb;
            if (l < 0) { r.embed = 1; r.head = 1; r.l0 = r.l1 = cr->cfg.L; } /* embedding + logits alone */
            else { r.l0 = l; r.l1 = l + 1; r.moe_only = part; }
            r.mono = !part && cb_exec_pick(cr, nb, e) == 1; /* a mono layer: its launches alone */
            cudaGraphExec_t ex;
            if (cb_capture(cr, &r, &ex, e)) return -1;
            float us = 0;
            int rc = cb_time_graph(cr, ex, iters, &us, e);
            cudaGraphExecDestroy(ex);
            if (rc) return -1;
            if (l < 0) *head_us = us;
            else if (part) moe_us[l] = us;
            else layer_us[l] = us;
        }
    }
    return 0;
}

/* ---- W ranks --------------------------------------------------------------------------------- */

extern "C" int sm_cuda_world_bench_exchanges(const sm_backend *b, int n, int iters, float *us, sm_err *e) {
    return cb_world_time_exchanges(b, n, iters, us, e);
}

extern "C" int sm_cuda_world_aux(const sm_backend *b, int rank, int a, int n, float *host, sm_err *e) {
    sm_cuda_rank **rk;
    const int W = cb_world_ranks(b, &rk);
    if (!W) return sm_errf(e, "sm_cuda_world_aux: not a CUDA world backend");
    if (rank < 0 || rank >= W) return sm_errf(e, "sm_cuda_world_aux: rank %d outside [0, %d)", rank, W);
    sm_cuda_rank *cr = rk[rank];
    if (a < 0 || a >= cr->aux_cap || n < 0 || n > cr->cap) return sm_errf(e, "sm_cuda_world_aux: entry %d / %d rows out of range", a, n);
    if (cb_enter(cr, e)) return -1;
    SM_CUDA_CHECK(cudaMemcpy(host, cr->aux + (size_t)a * cr->cap * cr->cfg.H, (size_t)n * cr->cfg.H * 4, cudaMemcpyDeviceToHost));
    return 0;
}
