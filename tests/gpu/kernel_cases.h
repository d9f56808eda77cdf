/* kernel_cases.h: what the two files of the kernel group share (test_kernels.cu: the dense
 * kernels, preconditions, graph capture and the entry; test_layer_ops.cu: the per-layer
 * kernels): the group's device state and the case functions the entry runs. */
#ifndef SM_GPU_KERNEL_CASES_H
#define SM_GPU_KERNEL_CASES_H
#include <cuda_runtime.h>
extern "C" {
#include "cpu/pool.h"
}
#include "cuda/ops/ops.h"

extern sm_pool *g_pool;       /* the CPU reference ops' thread pool */
extern sm_kernel_ctx g_ctx;   /* the kernels' context on device 0 */
extern cudaStream_t g_st;     /* every case's stream */

/* An attention case's requests: rows, positions, block tables and a random paged cache. */
typedef struct att_setup {
    int n, nreq, max_bpr, nblocks; /* rows, requests, blocks a request row, cache blocks */
    int *row_req, *pos;            /* [n] each row's request and position */
    int *tables;                   /* [nreq, max_bpr] block tables */
    uint16_t *kv;                  /* [nblocks][nkv][16][128] the cache (host) */
    int max_ctx;                   /* the longest context */
} att_setup;
/* nreq requests, request r with R[r] rows from position p0[r], in s (host arena buffers). */
void att_make(att_setup *s, int nkv, int nreq, const int *R, const int *p0);

/* test_layer_ops.cu (each prints one PASS / FAIL / SKIP line a case) */
void case_embed(int n, int H, int V);
void case_post_attn(int n, int H);
void case_post_ffn(int n, int H, int last);
void case_rms_bf16(int n, int d, int inplace);
void case_route(int n, int H, int E, int K);
void case_rope_kv(int n, int nh, int nkv, double theta);
/* decode / verify attention (prefill 0) or the prefill kernel (1), with a split hint mode */
void case_attention(const char *label, int nh, int nkv, int window, int nreq, const int *R, const int *p0, int prefill,
                    int hint);
void case_attention_invariance(const char *label, int nh, int nkv, int window, int R, int p0);
#endif
