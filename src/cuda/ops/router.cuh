/* ops/router.cuh: the device body of the MoE route selection (docs/model.md section 6): sigmoid
 * scores, top-K with the correction bias, route weights, for one row by one warp.
 *
 * Each lane holds the selection values (score + bias) of its experts lane + 32 t in registers,
 * as order-preserving integer keys, and its own best (largest key, then lowest id).  Each of
 * the K rounds is two warp reductions (redux.sync: the largest key, then the lowest id holding
 * it), after which only the winner's lane drops that key and finds its next best: the order of
 * the reference (descending, ties to the lowest id) without a shuffle tree a round.  NaN keys
 * rank below every number (a route id stays a valid expert).  Weights are the bias-free scores
 * normalized in route order k = 0..K-1, as the reference sums them.  Only warp-level
 * synchronization: a caller may give the warps of a block different rows.  The router logits
 * themselves come from the f32-weight matmul (ops/matmul.cuh), possibly written by other blocks
 * of the same launch, so they are read at L2 (ld.cg).  We rejected a sort-based top-K (bitonic
 * over E): K = 8 rounds of two reductions are fewer instructions, and the round structure keeps
 * the tie rule obvious; and a shuffle tree of (value, id) pairs a round (ten shuffles a round,
 * latency-bound: the former body, 4x the instructions).
 */
#ifndef SM_CUDA_OPS_ROUTER_CUH
#define SM_CUDA_OPS_ROUTER_CUH
#include "cuda/common.cuh"

/* Order-preserving key of a selection value: a larger value has a larger key, -0 the key of +0;
 * NaN gets 1, below every number; 0 marks an expert taken (or none). */
__device__ __forceinline__ uint32_t sm_route_key(float v) {
    uint32_t u = __float_as_uint(v);
    if (v != v) return 1u;
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The body for PL >= cdiv(E, 32) experts a lane (compile time: the keys stay in registers). */
template <int PL>
__device__ __forceinline__ void sm_route_topk_row_pl(const float *__restrict__ logits, const float *__restrict__ bias, int E,
                                                     int K, float m_o, float route_scale, int *__restrict__ idx,
                                                     float *__restrict__ w, int row, float *scs) {
    const int lane = threadIdx.x & 31;
    const float *lg = logits + (size_t)row * E;
    /* every logit and bias of the lane first: one memory round trip (loads interleaved with the
     * scs stores below were issued one key at a time, two round trips a key) */
    float lv[PL], bv[PL];
#pragma unroll
    for (int t = 0; t < PL; t++) {
        const int x = lane + 32 * t;
        lv[t] = x < E ? __ldcg(lg + x) : 0.0f;
        bv[t] = x < E ? bias[x] : 0.0f;
    }
    /* sc = sigmoid(logit * m_o) into scs; key of the selection value sc + bias */
    uint32_t key[PL];
#pragma unroll
    for (int t = 0; t < PL; t++) {
        const int x = lane + 32 * t;
        key[t] = 0u;
        if (x < E) {
            const float s = 1.0f / (1.0f + expf(-(lv[t] * m_o)));
            scs[x] = s;
            key[t] = sm_route_key(s + bv[t]);
        }
    }
    /* the lane's best: the largest key, the first (lowest id) of equal ones */
    uint32_t bk = 0u;
    int bt = 0;
#pragma unroll
    for (int t = 0; t < PL; t++)
        if (key[t] > bk) { bk = key[t]; bt = t; }
    int mine = 0; /* lane k keeps route k */
    for (int k = 0; k < K; k++) {
        /* the warp's largest key, then the lowest id that holds it */
        const uint32_t mk = __reduce_max_sync(0xFFFFFFFFu, bk);
        int wi = (int)__reduce_min_sync(0xFFFFFFFFu, bk == mk ? (uint32_t)(lane + 32 * bt) : 0xFFFFFFFFu);
        if (wi >= E) wi = 0; /* unreachable while K <= E: keeps the id a valid expert */
        if (lane == k) mine = wi;
        if (lane == (wi & 31)) { /* the winner's lane: drop it, find its next best */
            bk = 0u;
            bt = 0;
#pragma unroll
            for (int t = 0; t < PL; t++) {
                if (t == (wi >> 5)) key[t] = 0u;
                if (key[t] > bk) { bk = key[t]; bt = t; }
            }
        }
    }
    __syncwarp(); /* scs written by every lane */
    /* w_k = sc[idx_k] / (sum_j sc[idx_j] + 1e-15) * route_scale, sum in route order */
    const float s = lane < K ? scs[mine] : 0.0f;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += __shfl_sync(0xFFFFFFFFu, s, k);
    if (lane < K) {
        idx[(size_t)row * K + lane] = mine;
        w[(size_t)row * K + lane] = s / (sum + 1e-15f) * route_scale;
    }
    __syncwarp(); /* scs may be rewritten by the warp's next row */
}

/* Row `row` by the calling warp: sc = sigmoid(logits[row] * m_o) (f32 [E]), idx[row] = top-K of
 * sc + bias, w[row][k] = sc[idx_k] / (sum_j sc[idx_j] + 1e-15) * route_scale.  sh: this warp's
 * shared scratch, float [E].  E <= 1024, K <= min(E, 32). */
__device__ __forceinline__ void sm_route_topk_row(const float *__restrict__ logits, const float *__restrict__ bias, int E,
                                                  int K, float m_o, float route_scale, int *__restrict__ idx,
                                                  float *__restrict__ w, int row, float *sh) {
    if (E <= 256) sm_route_topk_row_pl<8>(logits, bias, E, K, m_o, route_scale, idx, w, row, sh);
    else sm_route_topk_row_pl<32>(logits, bias, E, K, m_o, route_scale, idx, w, row, sh);
}

#endif
