/* ops/router.cuh: the device body of the MoE route selection (docs/model.md section 6): sigmoid
 * scores, top-K with the correction bias, route weights, for one row by one warp.
 *
 * The E scores sit in the warp's shared scratch; each of the K rounds takes a warp-wide argmax
 * of (score + bias, lowest id on ties) over the experts not yet taken, which reproduces the
 * reference's order (descending, ties to the lowest id).  Weights are the bias-free scores
 * normalized in route order k = 0..K-1, as the reference sums them.  Only warp-level
 * synchronization: a caller may give the warps of a block different rows.  The router logits
 * themselves come from the f32-weight matmul (ops/matmul.cuh).  We rejected a sort-based top-K
 * (bitonic over E): K = 8 rounds of a 256-wide argmax are a few hundred instructions, and the
 * round structure makes the tie rule obvious.
 */
#ifndef SM_CUDA_OPS_ROUTER_CUH
#define SM_CUDA_OPS_ROUTER_CUH
#include "cuda/common.cuh"

/* Row `row` by the calling warp: sc = sigmoid(logits[row] * m_o) (f32 [E]), idx[row] = top-K of
 * sc + bias, w[row][k] = sc[idx_k] / (sum_j sc[idx_j] + 1e-15) * route_scale.  sh: this warp's
 * shared scratch, float [2 E].  E <= 1024, K <= min(E, 32). */
__device__ __forceinline__ void sm_route_topk_row(const float *__restrict__ logits, const float *__restrict__ bias, int E,
                                                  int K, float m_o, float route_scale, int *__restrict__ idx,
                                                  float *__restrict__ w, int row, float *sh) {
    const int lane = threadIdx.x & 31;
    float *scs = sh, *sel = scs + E;
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

#endif
