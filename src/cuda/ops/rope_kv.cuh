/* ops/rope_kv.cuh: the device body of the fused per-head QK rms norm, RoPE and KV-cache insert
 * (docs/model.md sections 4-5).
 *
 * The unit of work is one (row, head) for one warp: heads hh < nh are query heads, then nkv key
 * heads, then nkv value heads.  Lane j holds the rotate-half pair (j, j + 32) of D = 64, so norm
 * and rotation need no data exchange beyond one warp sum and no block barrier: a caller may give
 * the warps of a block any mix of (row, head) items.  inv_freq comes in sm_rope_tab, computed on
 * the host exactly as the CPU reference does ((float)pow(theta, -2j/D)) and passed by value (a
 * captured graph holds it); cos and sin are taken in double of the f32 angle, as the reference
 * does, so the rotation is bit-identical to it.  We rejected separate norm, rope and cache
 * passes: three passes over q/k for work that is a few microseconds.
 */
#ifndef SM_CUDA_OPS_ROPE_KV_CUH
#define SM_CUDA_OPS_ROPE_KV_CUH
#include "cuda/common.cuh"

typedef struct sm_rope_tab {
    float inv[32]; /* inv_freq[j], j < D/2 */
} sm_rope_tab;

/* inv_freq[j] = theta^(-2j / 64) (all zero for theta <= 0: no rope), the one host rule. */
static inline sm_rope_tab sm_rope_make_tab(double theta) {
    sm_rope_tab tab;
    for (int j = 0; j < 32; j++) tab.inv[j] = theta > 0 ? (float)pow(theta, -2.0 * j / 64.0) : 0.0f;
    return tab;
}

/* Head hh (0 <= hh < nh + 2 nkv) of row `row`, by the calling warp (lane = threadIdx.x & 31):
 *   query head:  q_out[row, hh] = rope(r16(rms(q[row, hh], -, eps)))
 *   key head:    cache[slot[row]][h] K half = rope(r16(rms(k[row, h], -, eps)))
 *   value head:  cache[slot[row]][h] V half = v[row, h]
 * rope only when `rope` != 0, at pos[row]; slots outside [0, nslots) write nothing.  Layouts as
 * sm_k_qk_rope_kv (cuda/ops/ops.h).  tab: a reference into the kernel's parameters (a copy
 * indexed by lane would go through local memory).  The row's position and slot are loaded
 * with its elements, before the norm: one memory round trip, not three. */
__device__ __forceinline__ void sm_rope_kv_head(const uint16_t *q, int ldq, const uint16_t *k, const uint16_t *v, int ldkv,
                                                int nh, int nkv, const int *__restrict__ pos,
                                                const int64_t *__restrict__ slot, int rope, const sm_rope_tab &tab,
                                                float eps, uint16_t *q_out, int ldq_out, uint16_t *__restrict__ kv,
                                                int64_t nslots, size_t row, int hh) {
    const int lane = threadIdx.x & 31;
    const int kind = hh < nh ? 0 : (hh < nh + nkv ? 1 : 2); /* 0 q, 1 k, 2 v */
    const int h = kind == 0 ? hh : (kind == 1 ? hh - nh : hh - nh - nkv);
    const uint16_t *src = (kind == 0 ? q + row * ldq : (kind == 1 ? k : v) + row * ldkv) + (size_t)h * 64;
    const int p = kind != 2 && rope ? sm_ld_now_s32(pos + row) : 0;
    const int64_t sl = kind != 0 ? sm_ld_now_s64(slot + row) : -1;
    float a = sm_bf(src[lane]), b = sm_bf(src[lane + 32]);
    if (kind != 2) {
        /* per-head weightless rms norm, r16 */
        const float ss = sm_warp_sum(__fadd_rn(__fmul_rn(a, a), __fmul_rn(b, b)));
        const float r = 1.0f / sqrtf(ss / 64.0f + eps);
        a = sm_r16d(__fmul_rn(a, r));
        b = sm_r16d(__fmul_rn(b, r));
        if (rope) {
            /* rotate-half: (a, b) -> (a cos - b sin, a sin + b cos) at angle pos * inv_freq, r16 */
            const float ang = __fmul_rn((float)p, tab.inv[lane]);
            double sd, cd;
            sincos((double)ang, &sd, &cd);
            const float c = (float)cd, s = (float)sd;
            const float na = sm_r16d(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
            const float nb = sm_r16d(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
            a = na;
            b = nb;
        }
    }
    if (kind == 0) {
        uint16_t *dst = q_out + row * ldq_out + (size_t)h * 64;
        dst[lane] = sm_tobf(a);
        dst[lane + 32] = sm_tobf(b);
        return;
    }
    /* K (normed, roped) or V (raw) into the page: [page][nkv][16][K 64 | V 64] */
    if (sl < 0 || sl >= nslots) return;
    uint16_t *dst = kv + (((sl / SM_KV_BLOCK) * nkv + h) * SM_KV_BLOCK + sl % SM_KV_BLOCK) * 128 + (kind == 2 ? 64 : 0);
    dst[lane] = sm_tobf(a);
    dst[lane + 32] = sm_tobf(b);
}

#endif
