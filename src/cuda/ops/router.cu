/* ops/router.cu: MoE routing on the GPU (docs/model.md section 6): the router logits (f32
 * weights, f32 accumulation: the selection must agree with the CPU reference whenever the
 * scores are not within rounding of each other), sigmoid, top-K, route weights, in one launch.
 *
 * route_kernel runs the router GEMV body of ops/matmul.cuh (a block: 32 experts x a token
 * block x a 512-k split); the last of a tile's splits to arrive sums them in split order (the
 * arithmetic of sm_k_mm_f32w's split sum: the same logits, bit for bit), and the last tile of
 * a token block to arrive runs its rows' top-K (ops/router.cuh, a warp a row).  Arrival
 * counters are the context's tile counters (tile_cnt), reset by their last arrival, so graph
 * replays find them zero.  When the workspace cannot hold the splits, the fallback is
 * sm_k_mm_f32w then the top-K kernel.  We rejected the three launches as the main path (GEMV,
 * split sum, top-K: two launch gaps and two tiny kernels on the critical path of every layer)
 * and fusing the top-K into the GEMV's epilogue without the counters (a row's logits come from
 * several blocks).
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/matmul.cuh"
#include "cuda/ops/router.cuh"

#define TOPK_WARPS 4

/* The fallback's top-K: one warp per row, TOPK_WARPS rows a block; dynamic shared memory float
 * [TOPK_WARPS][E]. */
__global__ void __launch_bounds__(TOPK_WARPS * 32)
topk_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int n, int E, int K, float m_o,
            float route_scale, int *__restrict__ idx, float *__restrict__ w) {
    extern __shared__ float sh[];
    const int warp = threadIdx.x >> 5;
    const int row = blockIdx.x * TOPK_WARPS + warp;
    if (row >= n) return; /* warp-uniform; only warp-level sync in the body */
    sm_route_topk_row(logits, bias, E, K, m_o, route_scale, idx, w, row, sh + (size_t)warp * E);
}

#define ROUTE_NT 8 /* tokens a block: the token block's top-K is then one row a warp */

/* Block (bx: experts bx * 32 .., by: tokens by * ROUTE_NT .., bz: k split) of the one-launch
 * router; S splits of partials in part [S][n][E] (S == 1: the GEMV writes logits itself); cnt:
 * tile counters [gx * gy] then token-block counters [gy], zero on entry and on exit.  Dynamic
 * shared memory: max(ROUTE_NT x 512 floats (the GEMV's x), 8 warps x E floats (the top-K's
 * scores)). */
__global__ void __launch_bounds__(256, 2)
route_kernel(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W, const float *__restrict__ bias, int E,
             int K, float m_o, float route_scale, int S, float *part, float *logits, int *__restrict__ idx,
             float *__restrict__ w, unsigned *cnt) {
    extern __shared__ float4 dsm[];
    const int bx = blockIdx.x, by = blockIdx.y, gx = gridDim.x, gy = gridDim.y, tid = threadIdx.x;
    sm_mm_f32w_gemv_block<ROUTE_NT>(x, n, k, W, E, S == 1 ? logits : part, bx, by, blockIdx.z, (float4(*)[SM_RG_KL / 4])dsm,
                                    sm_team_block());
    const int t0 = by * ROUTE_NT, t1 = min(n, t0 + ROUTE_NT);
    if (S > 1) { /* the tile's last split: logits = sum of the splits, in split order */
        if (!sm_block_last_arrival(cnt + by * gx + bx, (unsigned)S)) return;
        const int r0 = bx * SM_RG_ROWS, nr = min(SM_RG_ROWS, E - r0);
        for (int t = t0 + (tid >> 5); t < t1; t += 8)
            if ((tid & 31) < nr) {
                const size_t i = (size_t)t * E + r0 + (tid & 31);
                logits[i] = sm_mm_reduce_f32_at(part, S, (size_t)n * E, i);
            }
    }
    /* the token block's last tile: top-K of its rows, a warp a row */
    if (!sm_block_last_arrival(cnt + gx * gy + by, (unsigned)gx)) return;
    float *sh = (float *)dsm + (size_t)(tid >> 5) * E;
    for (int row = t0 + (tid >> 5); row < t1; row += 8) sm_route_topk_row(logits, bias, E, K, m_o, route_scale, idx, w, row, sh);
}

int sm_k_route(sm_kernel_ctx *kc, const uint16_t *xf, int n, int H, const float *router, const float *bias, int E, int K,
               float m_o, float route_scale, float *logits, int *idx, float *w, cudaStream_t st, sm_err *e) {
    if (n < 0 || H <= 0 || E <= 0 || K <= 0) return sm_errf(e, "sm_k_route: bad shape n=%d H=%d E=%d K=%d", n, H, E, K);
    if (E > 1024 || K > 32 || K > E) return sm_errf(e, "sm_k_route: E=%d, K=%d unsupported (E <= 1024, K <= min(E, 32))", E, K);
    if (!xf || !router || !bias || !logits || !idx || !w) return sm_errf(e, "sm_k_route: NULL pointer argument");
    if (n == 0) return 0;
    if (H % 4) return sm_errf(e, "sm_k_route: H=%d is not a multiple of 4", H);
    if (!sm_aligned(xf, 8) || !sm_aligned(router, 16)) return sm_errf(e, "sm_k_route: xf not 8-byte or router not 16-byte aligned");
    {
        /* one launch: splits of 512 k, their sum and the top-K by the last arrivals */
        const int S = sm_cdiv(H, SM_RG_KL), gx = sm_cdiv(E, SM_RG_ROWS), gy = sm_cdiv(n, ROUTE_NT);
        const size_t need = S > 1 ? (size_t)S * n * E * sizeof(float) : 0;
        const size_t xs = (size_t)ROUTE_NT * SM_RG_KL * sizeof(float), ts = (size_t)8 * E * sizeof(float);
        if (need <= kc->ws_bytes && S <= 65535 && gy <= 65535 && (size_t)gx * gy + gy <= (size_t)kc->tile_cnt_len) {
            const dim3 grid(gx, gy, S);
            route_kernel<<<grid, 256, xs > ts ? xs : ts, st>>>(xf, n, H, router, bias, E, K, m_o, route_scale, S, (float *)kc->ws,
                                                               logits, idx, w, kc->tile_cnt);
            SM_LAUNCH_CHECK("route_kernel");
            return 0;
        }
    }
    /* fallback: logits = xf @ router^T (f32), then the top-K kernel */
    if (sm_k_mm_f32w(kc, xf, n, H, router, E, logits, st, e)) return sm_errprefix(e, "sm_k_route");
    /* scores, top-K, weights */
    const size_t smem = (size_t)TOPK_WARPS * E * sizeof(float);
    topk_kernel<<<sm_cdiv(n, TOPK_WARPS), TOPK_WARPS * 32, smem, st>>>(logits, bias, n, E, K, m_o, route_scale, idx, w);
    SM_LAUNCH_CHECK("topk_kernel");
    return 0;
}
