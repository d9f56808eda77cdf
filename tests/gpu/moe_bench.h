/* moe_bench.h: the microbenchmark of the MoE expert stage (tests/gpu/test_moe.cu), run from
 * the GPU script.  Real widths (Hm = I = 4096, E = 256, K = 8), synthetic MXFP4 experts,
 * n = 8 .. 128 rows of uniform random top-8 routing; prints time (stream and CUDA graph),
 * distinct experts touched, their bytes, the read bandwidth measured in the same run and
 * the fraction of the floor achieved.  Returns 0, or 1 on a CUDA error. */
#ifndef SM_GPU_MOE_BENCH_H
#define SM_GPU_MOE_BENCH_H
#ifdef __cplusplus
extern "C" {
#endif
int gpu_bench_moe(void);
#ifdef __cplusplus
}
#endif
#endif
