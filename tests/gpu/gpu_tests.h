/* gpu_tests.h: the GPU test program (`make gpu-test` -> build/gpu_test), run on a Hopper GPU.
 * main.c runs each group below; each prints "PASS name" / "FAIL name" lines (and details) to
 * stdout and returns its failure count.  Groups live in their own files. */
#ifndef SM_GPU_TESTS_H
#define SM_GPU_TESTS_H
#ifdef __cplusplus
extern "C" {
#endif
int gpu_test_kernels(void);  /* per-op kernels vs the CPU reference ops (tests/gpu/kernels.cu, kernel_cases.h) */
int gpu_test_moe(void);      /* MoE expert stage vs the CPU reference (tests/gpu/moe.cu, moe_shards.cu) */
int gpu_test_model(void);    /* whole models vs the CPU backend, through the engine (tests/gpu/model.c, model_engine.c) */
int gpu_test_comm(void);     /* cross-rank operations (cuda/comm/gcomm.h) vs a rank-order reference (tests/gpu/comm.cu) */
/* Per-op microbenchmarks (bench/gpu/, `gpu_test --bench OP`): ops is a comma-separated list of
 * norm, router, attention, matmul, moe, logits, logprobs or all.  Prints each op's table (median time,
 * floor, % of floor at the real widths and 8..128 rows), then a summary table.  0; 1 on a CUDA
 * error; 2 (one line on stderr, nothing run) on an unknown op. */
int gpu_bench(const char *ops);
#ifdef __cplusplus
}
#endif
#endif
