/* ops.h: the extern "C" launchers of the CUDA stock-path kernels (docs/model.md sections 3-6),
 * everything of a step except the MoE expert stage (cuda/moe/moe.h).  They are defined in
 * src/cuda/ops/<family>.cu; the __device__ bodies the kernels run (callable from a persistent
 * kernel on any row / tile range) are in src/cuda/ops/<family>.cuh.
 *
 * Conventions of every launcher below:
 *  - all array arguments are DEVICE pointers unless the comment says host; bf16 values are
 *    uint16_t bits (the residual stream s stays f32; every value docs/model.md rounds with r16 is
 *    stored as bf16);
 *  - the launch goes on `st` and is CUDA-graph capturable: no synchronization, no allocation,
 *    no host read of device data; workspaces come from the sm_kernel_ctx;
 *  - the host-side preconditions (shapes, alignment, workspace size) are checked first and a
 *    violation returns -1 with one line in `e`; a launch error returns -1 too;
 *  - outputs never alias inputs unless the comment allows it.
 * Included by .cu files and by the GPU tests; plain C under extern "C" so a C file may include
 * it too (CUDA runtime and cuBLAS headers are C).  We rejected one launcher per kernel variant
 * (row-count templates, split counts): the launcher picks the variant from the shape, callers
 * state only the math.
 */
#ifndef SM_CUDA_OPS_H
#define SM_CUDA_OPS_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#ifdef __cplusplus
extern "C" { /* err.h and config.h are C headers without their own guards */
#endif
#include "base/err.h"
#include "model/config.h"
#include "backend/backend.h" /* sm_lp_sum */
#ifdef __cplusplus
}
#endif

#define SM_MM_SMALL_MAX 128  /* sm_k_mm uses the weight-streaming kernel up to this many rows */
#define SM_ATT_MAX_GROUP 16  /* most query heads per KV head the attention kernels support */
#define SM_ATT_ITEMS_PER_SM 4 /* resident attention tile items an SM (46 KB of shared memory, 128
                                * registers a thread): the key splits fill one wave (sm_att_plan) */

/* The kernels' launch context on one device: what every launcher below needs (cuBLAS handle,
 * workspaces), nothing of a model.  A rank of the CUDA backend (rank/rank.h: sm_cuda_rank,
 * its weights, buffers and graphs) holds one, as do the GPU tests and benchmarks.  One ctx
 * serves one stream at a time: its workspace is reused by consecutive launches (stream order
 * makes that safe). */
typedef struct sm_kernel_ctx {
    int device;              /* CUDA device ordinal */
    int num_sms;             /* multiprocessors of that device */
    cublasHandle_t blas;     /* cuBLAS handle for many-row matmuls */
    void *blas_ws;           /* device [blas_ws_bytes]: cuBLAS workspace (none allocated in capture) */
    size_t blas_ws_bytes;
    void *ws;                /* device [ws_bytes]: split-K partials, attention partials, argmax partials */
    size_t ws_bytes;
    unsigned *tile_cnt;      /* device [tile_cnt_len]: arrival counters of the wgmma matmul's shared
                              * tiles; zero between launches (each launch resets what it used) */
    int tile_cnt_len;
    void *tma_encode;        /* host: the driver's cuTensorMapEncodeTiled, NULL when the wgmma
                              * path is unavailable (not a 9.x device, or an old driver) */
    int att_items_per_sm;    /* attention key splits aim at this many tile items an SM
                              * (sm_att_plan; SPARKMONO_ATT_ITEMS_PER_SM, a measurement hook) */
} sm_kernel_ctx;

#ifdef __cplusplus
extern "C" {
#endif

/* ---- context ---- */
/* The driver's cuTensorMapEncodeTiled, or NULL when the driver has none (the one probe of the
 * wgmma / TMA path). */
void *sm_cuda_tma_encoder(void);
/* Workspace bytes that let every launcher below use its preferred split counts for steps of
 * up to max_rows rows of model c (attention contexts of any length). */
size_t sm_cuda_ws_bytes(const sm_config *c, int max_rows);
/* Bind to `device` (cudaSetDevice), create the cuBLAS handle and allocate ws_bytes of
 * workspace (0: a default of 64 MiB). */
int sm_kernel_ctx_init(sm_kernel_ctx *kc, int device, size_t ws_bytes, sm_err *e);
void sm_kernel_ctx_free(sm_kernel_ctx *kc);

/* ---- norms and residual boundaries (ops/norm.cu); one block per row ---- */
/* Embedding + first norm: for each row i, v = embed[tokens[i]] (bf16 [V, H]),
 * s[i] = r16(rms(v, -, eps)) (f32 [n, H]), x[i] = r16(rms(s[i], in_norm, eps)) (bf16 [n, H]).
 * in_norm [H] f32 = eff(input_layernorm_0).  A token outside [0, V) gives NaN rows. */
int sm_k_embed(const uint16_t *embed, int V, int H, const int *tokens, int n,
               const float *in_norm, float eps, float *s, uint16_t *x, cudaStream_t st, sm_err *e);
/* Post-attention boundary, per row: s = alpha * s + beta * r16(rms(a, -, post_eps)) in place
 * (s f32 [n, H]; a bf16 [n, H]; alpha, beta f32 [H]), then
 * xf = r16(rms(s, pre_ffn, eps)) (bf16 [n, H]; pre_ffn f32 [H] = eff(pre_feedforward_layernorm)). */
int sm_k_post_attn(float *s, const uint16_t *a, const float *alpha, const float *beta,
                   const float *pre_ffn, int n, int H, float post_eps, float eps, uint16_t *xf,
                   cudaStream_t st, sm_err *e);
/* Post-FFN boundary, per row: t = r16(f * post_ffn) (f bf16 [n, H]; post_ffn f32 [H]),
 * s = alpha * s + beta * r16(t * rsqrt(mean(t^2) + post_eps)) in place (s f32 [n, H]), then
 *   last == 0: x = r16(rms(s, norm, eps))         (norm [H] = eff(input_layernorm of l+1))
 *   last != 0: x = r16(rms(r16(s), norm, eps))    (norm [H] = final norm weight, as is)
 * x bf16 [n, H] (for the last layer it is h, the lm_head input). */
int sm_k_post_ffn(float *s, const uint16_t *f, const float *post_ffn, const float *alpha,
                  const float *beta, const float *norm, int last, int n, int H, float post_eps,
                  float eps, uint16_t *x, cudaStream_t st, sm_err *e);
/* y = r16(rms(x, w, eps)) per row; x, y bf16 [n, d] (y == x allowed); w f32 [d] or NULL.
 * Used for the pre-expert norm after the pooler matmul.  mx 1 (W4A4's h1, docs/model.md
 * section 6; d % 32 == 0): y then rounded to MXFP4 per 32 values of a row; img_codes non-NULL
 * (mx only): y's e4m3 image for the expert stage written too (common.cuh sm_x8_img: codes
 * [n, img_kp], factors img_fac [n, img_kp / 32]). */
int sm_k_rms_bf16(const uint16_t *x, int n, int d, const float *w, float eps, uint16_t *y, int mx,
                  uint8_t *img_codes, float *img_fac, int img_kp, cudaStream_t st, sm_err *e);

/* ---- matmuls (ops/matmul.cu) ---- */
/* y [n, m] = r16(x [n, k] @ W [m, k]^T), bf16 in, f32 accumulation, bf16 out.  n <= 128: the
 * wgmma stream-K kernel (the mma.sync core where the wgmma path is unavailable), whose work
 * split depends on (m, k) only, so a row's bits do not depend on n (speculative == greedy);
 * more rows: cuBLAS (sm_k_mm_blas).  Requires k % 32 == 0 and 16-byte aligned x, W (m any
 * >= 1).  Uses kc->ws for split-K partials. */
int sm_k_mm(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
            uint16_t *y, cudaStream_t st, sm_err *e);
/* The paths of sm_k_mm, callable directly (tests, benchmarks): small (the mma.sync core of
 * ops/matmul.cuh) requires n <= 128. */
int sm_k_mm_small(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                  uint16_t *y, cudaStream_t st, sm_err *e);
int sm_k_mm_blas(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                 uint16_t *y, cudaStream_t st, sm_err *e);
/* Path choice for tests and benchmarks (sm_k_mm_path, sm_k_logits_path). */
#define SM_PATH_AUTO 0  /* what sm_k_mm / sm_k_logits pick */
#define SM_PATH_SYNC 1  /* mma.sync weight-streaming core (ops/matmul.cuh), 64-row blocks */
#define SM_PATH_WG1 2   /* wgmma stream-K kernel, 128-row tiles (TMA-fed, 2 consumer warpgroups) */
#define SM_PATH_WG2 3   /* wgmma stream-K kernel, 256-row tiles */
/* sm_k_mm with the path forced (n <= 128; a WG path fails with one line when kc->tma_encode is
 * NULL). */
int sm_k_mm_path(sm_kernel_ctx *kc, int path, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                 uint16_t *y, cudaStream_t st, sm_err *e);
/* f32-output variant (a rank's partial sum, e.g. o_proj over its heads' columns): y [n, m] =
 * x [n, k] @ W [m, k]^T, bf16 in, f32 accumulation, f32 output NOT rounded.  n <= 128: the
 * work split of sm_k_mm (wgmma stream-K, or the mma.sync core where the wgmma path is
 * unavailable) with an f32 epilogue, so a row's f32 bits do not depend on n on the wgmma path
 * and r16 of them is sm_k_mm's output; more rows: cuBLAS with f32 output.  Same
 * preconditions and workspace use as sm_k_mm.  A column slice of a wider matrix must be
 * packed contiguous ([m, k]) by the caller. */
int sm_k_mm_f32(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                float *y, cudaStream_t st, sm_err *e);
/* sm_k_mm_f32 with the path forced (n <= 128; SM_PATH_AUTO, SM_PATH_SYNC or SM_PATH_WG1). */
int sm_k_mm_f32_path(sm_kernel_ctx *kc, int path, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                     float *y, cudaStream_t st, sm_err *e);
/* f32-weight variant (router): y [n, m] = x [n, k] (bf16) @ W [m, k]^T (f32), f32
 * accumulation, f32 output NOT rounded.  Any n; k % 4 == 0, x 8-byte and W 16-byte aligned. */
int sm_k_mm_f32w(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const float *W, int m,
                 float *y, cudaStream_t st, sm_err *e);

/* ---- router (ops/router.cu) ---- */
/* MoE routing of n rows (docs/model.md section 6): logits = xf @ router^T (f32 [n, E], also an
 * output: a scratch the caller owns), sc = sigmoid(logits * m_o), idx [n, K] int32 = top-K of
 * sc + bias (descending, ties to the lowest expert id), w [n, K] f32 =
 * sc[idx] / (sum_k sc[idx_k] + 1e-15) * route_scale.  xf bf16 [n, H]; router f32 [E, H];
 * bias f32 [E].  E <= 1024, K <= min(E, 32), H % 4 == 0.  One launch (kc->ws holds the k
 * splits, kc->tile_cnt counts their arrivals); the logits' bits are sm_k_mm_f32w's. */
int sm_k_route(sm_kernel_ctx *kc, const uint16_t *xf, int n, int H, const float *router,
               const float *bias, int E, int K, float m_o, float route_scale, float *logits,
               int *idx, float *w, cudaStream_t st, sm_err *e);

/* ---- QK norm + RoPE + KV insert (ops/rope_kv.cu) ---- */
/* For each row i (position pos[i], cache slot slot[i]; slot -1 = padding row: no write):
 *   q_out[i, h] = rope(r16(rms(q[i, h], -, eps)))      for the nh query heads of D = 64
 *   kh          = rope(r16(rms(k[i, h], -, eps)))      for the nkv KV heads
 *   cache[slot][h] = (kh | v[i, h]) as bf16
 * rope = rotate-half at pos[i] with inv_freq[j] = theta^(-2j/64) (f32), r16 output;
 * theta <= 0: no RoPE (full-attention layers, NoPE).
 * q: bf16 rows of stride ldq elements; k, v: bf16 rows of stride ldkv (all three may be column
 * ranges of one fused QKV output, then ldq == ldkv); q_out: bf16 [n, ldq_out] (q_out == q with
 * ldq_out == ldq allowed: in place).
 * kv: the layer's cache, bf16 [nblocks][nkv][16][128] (K 0..63 | V 64..127); slots outside
 * [0, nblocks*16) are skipped.  pos int32 [n], slot int64 [n]. */
int sm_k_qk_rope_kv(const uint16_t *q, int ldq, const uint16_t *k, const uint16_t *v, int ldkv,
                    int n, int nh, int nkv, const int *pos, const int64_t *slot, double theta, float eps,
                    uint16_t *q_out, int ldq_out, uint16_t *kv, int nblocks, cudaStream_t st,
                    sm_err *e);

/* ---- attention (ops/attention.cu) ---- */
/* Key splits of sm_k_attention's tile items for n rows (one wave of SM_ATT_ITEMS_PER_SM items an
 * SM, each split >= 128 keys, bounded by the workspace) and, in *chunk (may be NULL), the keys of one chunk of the
 * absolute key grid the splits take: the one rule, shared with the persistent kernel so both
 * give the same bits. */
int sm_att_plan(const sm_kernel_ctx *kc, int n, int nh, int nkv, int window, int max_ctx, int *chunk);
/* Decode / verify attention with the fused output gate.  Row i (request row_req[i], position
 * pos[i]) attends to its request's keys p' in [lo, pos[i]] (lo = pos[i] - window + 1 clamped
 * at 0 when window > 0, else 0), read from kv (layout as above) through the block table
 * tables + row_req[i] * max_bpr (page of p' = table[p' / 16]).  GQA: query head h uses KV head
 * h / (nh / nkv).  Scores q.k * scale (tensor cores: exact bf16 products, f32 sums), f32
 * softmax, o f32 (P.V over the exact p); then per head
 * out = r16(rms(o, -, eps) * sigmoid(gate)).  q bf16 rows of stride ldq ([n, nh*64] used);
 * gate bf16 rows of stride ldg; out bf16 [n, nh*64].  max_ctx (host) is an upper bound of
 * pos[i] + 1 over the rows (it sizes split-K; a smaller value is still correct, just slower;
 * 0 = unknown).  nh % nkv == 0, nh / nkv <= SM_ATT_MAX_GROUP. */
int sm_k_attention(sm_kernel_ctx *kc, const uint16_t *q, int ldq, const uint16_t *gate, int ldg,
                   const uint16_t *kv, const int *tables, int max_bpr, const int *row_req,
                   const int *pos, int n, int nh, int nkv, int window, float scale, float eps,
                   int max_ctx, uint16_t *out, cudaStream_t st, sm_err *e);
/* Prefill attention of T consecutive rows of ONE request at positions pos0 .. pos0+T-1 (host
 * ints; the K/V of these rows already written to the cache), same math and layouts as
 * sm_k_attention; table = that request's block table (device int [>= (pos0+T+15)/16]). */
int sm_k_attention_prefill(const uint16_t *q, int ldq, const uint16_t *gate, int ldg,
                           const uint16_t *kv, const int *table, int pos0, int T, int nh,
                           int nkv, int window, float scale, float eps, uint16_t *out,
                           cudaStream_t st, sm_err *e);

/* ---- final logits (ops/logits.cu) ---- */
/* raw [n, V] = h [n, H] (bf16) @ lm_head [V, H]^T (bf16), f32 accumulation, not rounded;
 * logits = softcap * tanh(raw * m_o / softcap) (softcap <= 0: raw * m_o); ids >= vocab_used
 * -> -inf.  logits f32 [n, V] written when non-NULL; argmax int32 [n] = id of the largest
 * logit among ids < vocab_used, ties to the lowest id.  Non-finite guard (every path): when
 * any raw logit of a row among ids < vocab_used is NaN or +-Inf, that row's argmax is -1 and
 * its logits there are NaN (a non-finite raw value is never capped to a finite +-softcap); the
 * other rows are unaffected.  Any n (chunks of 128 rows); H % 32 == 0;
 * 1 <= vocab_used <= V.  Uses kc->ws for per-block argmax partials. */
int sm_k_logits(sm_kernel_ctx *kc, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V,
                int vocab_used, float m_o, float softcap, float *logits, int *argmax,
                cudaStream_t st, sm_err *e);
/* The constraint masks of logits rows (sm_step.mask): for entry i < n, row rows[i] of logits
 * [*, ld] (f32, V ids) gets -inf at every id whose bit in mask midx[i] of masks [*, words]
 * (device, uint32 words, id v: word v / 32, bit v % 32) is clear, and argmax[rows[i]] becomes
 * the row's greedy id among ids < vocab_used, ties to the lowest; -1 when an allowed id there
 * is NaN or +Inf, or none is finite.  rows, midx: HOST ints [n], n <= SM_MASK_ROWS.  Slices of
 * 4096 ids a block (the row's partials in kc->ws), then one warp a row reduces them.
 * Reference: ref_mask_row then ref_argmax_row (cpu/ops.h). */
#define SM_MASK_ROWS 128
int sm_k_mask_rows(sm_kernel_ctx *kc, float *logits, size_t ld, int V, int vocab_used, const uint32_t *masks, int words, const int *rows,
                   const int *midx, int n, int *argmax, cudaStream_t st, sm_err *e);
/* ---- logprob summaries (ops/logprobs.cu) ---- */
#define SM_LP_ROWS 128 /* rows of one sm_k_logprobs launch (more run in several) */
/* out [nsel] (device sm_lp_sum, backend.h) = the summary of row rows[i] of logits [*, ld] (f32)
 * over its ids < vocab_used, with the k largest (1 <= k <= SM_LP_MAX_TOP) and the logit and rank
 * of id toks[i] (toks NULL or -1: none): ref_logprobs_row, but for the order of the double sum lse
 * (its last bits).  rows, toks: HOST ints [nsel].  Uses kc->ws for the partials of the row's
 * slices. */
int sm_k_logprobs(sm_kernel_ctx *kc, const float *logits, size_t ld, const int *rows, const int *toks, int nsel, int vocab_used,
                  int k, sm_lp_sum *out, cudaStream_t st, sm_err *e);
/* sm_k_logits with the path forced (SM_PATH_*), for tests and benchmarks. */
int sm_k_logits_path(sm_kernel_ctx *kc, int path, const uint16_t *h, int n, int H, const uint16_t *lm_head,
                     int V, int vocab_used, float m_o, float softcap, float *logits, int *argmax,
                     cudaStream_t st, sm_err *e);
/* Internal to ops/logits.cu (defined in ops/matmul.cu, next to the wgmma kernel it shares
 * with sm_k_mm): the lm_head product of n <= 128 rows with the logits epilogue.  Reads lm_head
 * once; writes logits (f32 [n, V], when non-NULL) and, per tile of 128 * mt rows of lm_head
 * (mt 1 or 2), the best (value, id) of each row: pv f32 / pi int32 [*ntiles][n], laid out at
 * the start of kc->ws (the kernel's partial tiles follow them); id -2 marks a tile with a
 * non-finite logit of the row (ops/logits.cuh: SM_LG_BAD).  The caller reduces pv / pi. */
int sm_k_logits_wg(sm_kernel_ctx *kc, int mt, const uint16_t *h, int n, int H, const uint16_t *lm_head,
                   int V, int vocab_used, float m_o, float softcap, float *logits, float **pv,
                   int **pi, int *ntiles, cudaStream_t st, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
