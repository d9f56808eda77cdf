/* router.cu: MoE routing on the GPU (SPEC.md section 6): router logits, sigmoid scores,
 * top-K with the correction bias, route weights.
 *
 * The logits come from sm_k_mm_f32w (f32 weights, f32 accumulation: the selection must
 * agree with the CPU reference whenever the scores are not within rounding of each other).
 * Top-K: one warp per row; the E scores sit in shared memory, each of the K rounds takes a
 * warp-wide argmax of (score + bias, lowest id on ties) over the experts not yet taken, which
 * reproduces the reference's order (descending, ties to the lowest id).  Weights are the
 * bias-free scores normalized in route order k = 0..K-1, as the reference sums them.
 * We rejected a sort-based top-K (bitonic over E): K = 8 rounds of a 256-wide argmax are
 * a few hundred instructions, and the round structure makes the tie rule obvious.
 */
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#define TOPK_WARPS 4

__global__ void __launch_bounds__(TOPK_WARPS * 32)
topk_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int n, int E, int K, float m_o,
            float route_scale, int *__restrict__ idx, float *__restrict__ w) {
    extern __shared__ float sh[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * TOPK_WARPS + warp;
    if (row >= n) return; /* warp-uniform; only warp-level sync below */
    float *scs = sh + (size_t)warp * 2 * E, *sel = scs + E;
    const float *lg = logits + (size_t)row * E;
    /* sc = sigmoid(logit * m_o); selection value sc + bias */
    for (int x = lane; x < E; x += 32) {
        const float s = 1.0f / (1.0f + expf(-(lg[x] * m_o)));
        scs[x] = s;
        sel[x] = s + bias[x];
    }
    __syncwarp();
    /* K rounds of argmax over the experts not taken (lane owns experts lane + 32 t) */
    uint32_t taken = 0;
    int mine = -1; /* lane k keeps route k */
    for (int k = 0; k < K; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int t = 0, x = lane; x < E; t++, x += 32)
            if (!((taken >> t) & 1u) && sm_better(sel[x], x, bv, bi)) { bv = sel[x]; bi = x; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
            const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
            if (sm_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (bi < 0) bi = 0; /* only with NaN scores: keep the id a valid expert */
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == k) mine = bi;
    }
    /* w_k = sc[idx_k] / (sum_j sc[idx_j] + 1e-15) * route_scale, sum in route order */
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += scs[__shfl_sync(0xFFFFFFFFu, mine, k)];
    if (lane < K) {
        idx[(size_t)row * K + lane] = mine;
        w[(size_t)row * K + lane] = scs[mine] / (sum + 1e-15f) * route_scale;
    }
}

int sm_k_route(sm_cuda_ctx *c, const uint16_t *xf, int n, int H, const float *router, const float *bias, int E, int K,
               float m_o, float route_scale, float *logits, int *idx, float *w, cudaStream_t st, sm_err *e) {
    if (n < 0 || H <= 0 || E <= 0 || K <= 0) return sm_errf(e, "sm_k_route: bad shape n=%d H=%d E=%d K=%d", n, H, E, K);
    if (E > 1024 || K > 32 || K > E) return sm_errf(e, "sm_k_route: E=%d, K=%d unsupported (E <= 1024, K <= min(E, 32))", E, K);
    if (!xf || !router || !bias || !logits || !idx || !w) return sm_errf(e, "sm_k_route: NULL pointer argument");
    if (n == 0) return 0;
    /* logits = xf @ router^T, f32 */
    if (sm_k_mm_f32w(c, xf, n, H, router, E, logits, st, e)) return sm_errprefix(e, "sm_k_route");
    /* scores, top-K, weights */
    const size_t smem = (size_t)TOPK_WARPS * 2 * E * sizeof(float);
    topk_kernel<<<sm_cdiv(n, TOPK_WARPS), TOPK_WARPS * 32, smem, st>>>(logits, bias, n, E, K, m_o, route_scale, idx, w);
    SM_LAUNCH_CHECK("topk_kernel");
    return 0;
}
