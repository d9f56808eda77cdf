/* frontend.cu: microbenchmark of the SM's instruction front end (`gpu_test --bench frontend`):
 * what straight-line code costs when its instructions are not in the SM's instruction caches,
 * against the same code once it is.  A decode layer's latency phases (norms, top-K, the route
 * grouping, boundaries) run bodies of 0.5-6 K SASS instructions once a layer on one or a few
 * blocks, after the matmuls and the expert stage have filled the SM's caches with their own
 * code; this measures what such a body pays for that, so the layer's budget can tell it apart
 * from memory latency.
 *
 * fe_line_kernel<NI, TAG>: one warp an SM runs NI FMAs in 8 independent chains (inline PTX, so
 * the code is NI instructions in that order; 8 chains cover the FMA latency, so warm code
 * issues about one a cycle) twice, clock64 around each pass.  Pass 0 runs right after fe_evict
 * (the same kernel with TAG 1 and 16 K instructions, 256 KB of other code, on every SM), so its
 * instructions come from L2, or, with the L2 flushed first (3 L2 sizes written, as the expert
 * stage's weight stream leaves it), from device memory; pass 1 runs the same addresses again.
 * The figure is cycles an instruction (median over the SMs, then over the repetitions); the
 * first repetition (the kernel's first run) is printed apart.
 * bh_evict_icache (flush + evictor) also serves the other drivers: with bh_run.evict set,
 * bh_time runs it ahead of every timed interval (a cold-code timing of an op, e.g. the
 * router's "cold" lines).
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "cuda/common.cuh"
#include "backend/stats.h"
#include "bench.h"

#define FE_F(a) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(a) : "f"(m), "f"(c));
#define FE_8 FE_F(a0) FE_F(a1) FE_F(a2) FE_F(a3) FE_F(a4) FE_F(a5) FE_F(a6) FE_F(a7)
#define FE_64 FE_8 FE_8 FE_8 FE_8 FE_8 FE_8 FE_8 FE_8
#define FE_512 FE_64 FE_64 FE_64 FE_64 FE_64 FE_64 FE_64 FE_64
#define FE_REPS 7         /* repetitions of a measurement (the first one printed apart) */
#define FE_EVICT_NI 16384 /* instructions of the evicting body (256 KB) */

/* cyc[2 b + pass]: cycles of pass 0 (after the evictor) and pass 1 of block b; out keeps the
 * chains alive. */
template <int NI, int TAG>
__global__ void __launch_bounds__(32) fe_line_kernel(float x, float m, float c, long long *cyc, float *out) {
    static_assert(NI % 512 == 0, "fe_line_kernel: NI a multiple of 512");
    float a0 = x, a1 = x + 1.f, a2 = x + 2.f, a3 = x + 3.f, a4 = x + 4.f, a5 = x + 5.f, a6 = x + 6.f, a7 = x + 7.f;
    long long t[3];
#pragma unroll 1
    for (int pass = 0; pass < 2; pass++) {
        t[pass] = clock64();
#pragma unroll
        for (int r = 0; r < NI / 512; r++) { FE_512 }
    }
    t[2] = clock64();
    if (threadIdx.x == 0) {
        if (cyc) {
            cyc[2 * blockIdx.x] = t[1] - t[0];
            cyc[2 * blockIdx.x + 1] = t[2] - t[1];
        }
        out[blockIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + (float)TAG;
    }
}

/* Every SM runs FE_EVICT_NI instructions of other code (flush: after 3 L2 sizes of writes, so
 * the next kernel's code is not in L2 either). */
static int fe_evict(bh_run *r, int flush, sm_err *e) {
    const size_t fb = (size_t)(BH_L2_TIMES * r->l2);
    if (!r->fe_out) SM_CUDA_CHECK(cudaMalloc((void **)&r->fe_out, (size_t)r->sms * sizeof(float)));
    if (flush && !r->fe_flush) SM_CUDA_CHECK(cudaMalloc((void **)&r->fe_flush, fb));
    if (flush) SM_CUDA_CHECK(cudaMemsetAsync(r->fe_flush, 0x5a, fb, r->st));
    fe_line_kernel<FE_EVICT_NI, 1><<<r->sms, 32, 0, r->st>>>(0.5f, 0.999f, 0.001f, NULL, r->fe_out);
    SM_LAUNCH_CHECK("fe_line_kernel (evict)");
    return 0;
}

int bh_evict_icache(bh_run *r, sm_err *e) { return fe_evict(r, 1, e); }

/* Cycles an instruction of NI-instruction straight-line code, cold (after fe_evict) and warm,
 * FE_REPS times: rep 0 into first[2], the median of the others into med[2]. */
template <int NI>
static int fe_measure(bh_run *r, int flush, long long *d_cyc, long long *h_cyc, double first[2], double med[2], sm_err *e) {
    float cold[FE_REPS], warm[FE_REPS], sc[1024], sw[1024];
    for (int rep = 0; rep < FE_REPS; rep++) {
        if (fe_evict(r, flush, e)) return -1;
        fe_line_kernel<NI, 0><<<r->sms, 32, 0, r->st>>>(0.5f, 0.999f, 0.001f, d_cyc, r->fe_out);
        SM_LAUNCH_CHECK("fe_line_kernel");
        SM_CUDA_CHECK(cudaMemcpyAsync(h_cyc, d_cyc, (size_t)r->sms * 2 * sizeof(long long), cudaMemcpyDeviceToHost, r->st));
        SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
        for (int b = 0; b < r->sms; b++) {
            sc[b] = (float)h_cyc[2 * b] / NI;
            sw[b] = (float)h_cyc[2 * b + 1] / NI;
        }
        cold[rep] = sm_median(sc, r->sms);
        warm[rep] = sm_median(sw, r->sms);
    }
    first[0] = cold[0];
    first[1] = warm[0];
    med[0] = sm_median(cold + 1, FE_REPS - 1);
    med[1] = sm_median(warm + 1, FE_REPS - 1);
    return 0;
}

int bench_frontend(bh_run *r, sm_err *e) {
    if (r->sms > 1024) return sm_errf(e, "bench frontend: %d SMs (at most 1024)", r->sms);
    long long *d_cyc = NULL, *h_cyc = (long long *)malloc((size_t)r->sms * 2 * sizeof(long long));
    if (!h_cyc) return sm_errf(e, "bench frontend: out of host memory");
    int rc = 0;
    double mhz = 0;
    if (cudaMalloc((void **)&d_cyc, (size_t)r->sms * 2 * sizeof(long long)) != cudaSuccess) {
        free(h_cyc);
        return sm_errf(e, "bench frontend: cudaMalloc failed");
    }
    printf("\n== frontend: straight-line code, one warp an SM, 8 independent FMA chains; cycles an instruction "
           "(median over SMs) right after %d K instructions of other code ran on every SM (cold: the code in L2; "
           "cold, L2 flushed: %.0f MB written first) and on the second pass (warm)\n", FE_EVICT_NI / 1024,
           BH_L2_TIMES * r->l2 / 1e6);
    printf("%-8s %-8s %-10s %12s %12s %12s %12s %10s\n", "instrs", "code KB", "L2", "cold c/i", "warm c/i", "cold us", "first c/i",
           "MHz");
    double first[2], med[2];
    const int nis[3] = {512, 2048, 8192};
    for (int i = 0; i < 3 && !rc; i++)
        for (int flush = 0; flush < 2 && !rc; flush++) {
            const int ni = nis[i];
            if (i == 0) rc = fe_measure<512>(r, flush, d_cyc, h_cyc, first, med, e);
            else if (i == 1) rc = fe_measure<2048>(r, flush, d_cyc, h_cyc, first, med, e);
            else rc = fe_measure<8192>(r, flush, d_cyc, h_cyc, first, med, e);
            if (!rc) rc = bh_sm_mhz(r, &mhz, e);
            if (rc) break;
            const double cold_us = mhz > 0 ? med[0] * ni / mhz : 0.0;
            printf("%-8d %-8d %-10s %12.2f %12.2f %12.2f %12.2f %10.0f\n", ni, ni * 16 / 1024, flush ? "flushed" : "holds it", med[0],
                   med[1], cold_us, first[0], mhz);
            char op[64];
            snprintf(op, sizeof op, "frontend cold%s %d", flush ? " flushed" : "", ni);
            bh_add(r, op, 1, (float)cold_us, mhz > 0 ? med[1] * ni / mhz : 0.0); /* floor: the same code warm */
        }
    fflush(stdout);
    SM_CUDA_CHECK_PRINT(cudaFree(d_cyc));
    free(h_cyc);
    return rc;
}
