/* gpu_tests.h: the GPU test program (`make gpu-test` -> build/gpu_test), run on a Hopper GPU.
 * main.c runs each group below; each prints "PASS name" / "FAIL name" lines (and details) to
 * stdout and returns its failure count.  Groups live in their own files. */
#ifndef SM_GPU_TESTS_H
#define SM_GPU_TESTS_H
#ifdef __cplusplus
extern "C" {
#endif
int gpu_test_kernels(void);  /* per-op kernels vs the CPU reference ops (tests/gpu/test_kernels.cu) */
int gpu_test_moe(void);      /* MoE expert stage vs the CPU reference (tests/gpu/test_moe.cu) */
int gpu_test_model(void);    /* whole-model logits and generation vs the CPU backend (tests/gpu/test_model.c) */
/* Microbenchmark of the dense few-row kernels (lm_head logits, dense matmuls) at 8..128 rows,
 * each path, % of the weight-read floor (tests/gpu/bench_dense.cu).  0, or 1 on a CUDA error. */
int gpu_bench_dense(void);
#ifdef __cplusplus
}
#endif
#endif
