/* kernel_cases.h: what the files of the `kernels` group share, one file per op family beside
 * src/cuda/ops and bench/gpu (matmul.cu, norm.cu, router.cu, attention.cu, logits.cu) and
 * kernels.cu (the entry, the preconditions, the graph capture): the group's device state, the
 * matmul / logits paths and the case functions the entry runs (each prints one PASS / FAIL /
 * SKIP line a case). */
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

/* Paths of the few-row matmul and the logits (a mask of P_* bits). */
#define P_AUTO (1 << SM_PATH_AUTO)
#define P_SYNC (1 << SM_PATH_SYNC)
#define P_WG1 (1 << SM_PATH_WG1)
#define P_WG2 (1 << SM_PATH_WG2)
#define P_ALL (P_SYNC | P_WG1 | P_WG2)
static inline const char *path_name(int p) {
    return p == SM_PATH_SYNC ? "sync" : p == SM_PATH_WG1 ? "wg128" : p == SM_PATH_WG2 ? "wg256" : "auto";
}

/* matmul.cu: which 0 sm_k_mm (dispatch), 1 small, 2 cuBLAS; paths a mask of P_*; kfull > k:
 * W is a column slice of a [m, kfull] matrix */
void case_mm(int which, int n, int k, int m);
void case_mm_paths(int paths, int n, int k, int m);
void case_mm_f32(int paths, int n, int k, int m, int kfull);
void case_mm_f32_invariance(int k, int m);
void case_mm_f32w(int n, int k, int m);
/* norm.cu */
void case_embed(int n, int H, int V);
void case_post_attn(int n, int H);
void case_post_ffn(int n, int H, int last);
void case_rms_bf16(int n, int d, int inplace, int mx = 0); /* mx: MXFP4 output (W4A4's h1) */
/* router.cu */
void case_route(int n, int H, int E, int K);
void case_route_ties(int n, int H, int E, int K, int groups);
/* attention.cu */
void case_rope_kv(int n, int nh, int nkv, double theta);
/* decode / verify attention (prefill 0) or the prefill kernel (1), with a split hint mode */
void case_attention(const char *label, int nh, int nkv, int window, int nreq, const int *R, const int *p0, int prefill,
                    int hint);
void case_attention_invariance(const char *label, int nh, int nkv, int window, int R, int p0);
/* logits.cu: want_logits 0: the argmax only */
void case_logits(int paths, int n, int H, int V, int vu, int want_logits);
void case_logits_nonfinite(int paths, int n, int H, int V, int vu);
/* k top ids of nsel random rows of n (n >= 4: a NaN row and an Inf row among them) */
void case_logprobs(int n, int V, int vu, int k, int nsel, int ties);
void case_mask_rows(int n, int V, int vu, int allow, int k);
#endif
