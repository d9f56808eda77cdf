/* rope_kv.cu: per-head QK rms norm, RoPE and the KV-cache insert, fused (SPEC.md sections 4-5).
 *
 * One warp per (row, head) over the nh query heads, nkv key heads and nkv value heads of a
 * row; lane j holds the rotate-half pair (j, j + 32) of D = 64, so norm and rotation need no
 * data exchange beyond one warp sum.  inv_freq is computed on the host exactly as the CPU
 * reference does ((float)pow(theta, -2j/D)) and passed by value in the kernel parameters (so a
 * captured graph holds it); cos and sin are taken in double of the f32 angle, as the reference
 * does, so the rotation is bit-identical to it.  We rejected separate norm, rope and cache
 * kernels: three launches and three passes over q/k for work that is a few microseconds.
 */
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#define ROPE_WARPS 4

typedef struct rope_tab {
    float inv[32]; /* inv_freq[j], j < D/2 */
} rope_tab;

__global__ void __launch_bounds__(ROPE_WARPS * 32)
qk_rope_kv_kernel(const uint16_t *q, int ldq, const uint16_t *k, const uint16_t *v, int ldkv, int nh, int nkv,
                  const int *__restrict__ pos, const int64_t *__restrict__ slot, int rope, rope_tab tab,
                  float eps, uint16_t *q_out, int ldq_out, uint16_t *__restrict__ kv, int64_t nslots) {
    const int lane = threadIdx.x & 31;
    const int hh = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
    const size_t row = blockIdx.x;
    if (hh >= nh + 2 * nkv) return; /* no barrier below: a warp may leave */
    const int kind = hh < nh ? 0 : (hh < nh + nkv ? 1 : 2); /* 0 q, 1 k, 2 v */
    const int h = kind == 0 ? hh : (kind == 1 ? hh - nh : hh - nh - nkv);
    const uint16_t *src = (kind == 0 ? q + row * ldq : (kind == 1 ? k : v) + row * ldkv) + (size_t)h * 64;
    float a = sm_bf(src[lane]), b = sm_bf(src[lane + 32]);
    if (kind != 2) {
        /* per-head weightless rms norm, r16 */
        const float ss = sm_warp_sum(__fadd_rn(__fmul_rn(a, a), __fmul_rn(b, b)));
        const float r = 1.0f / sqrtf(ss / 64.0f + eps);
        a = sm_r16d(__fmul_rn(a, r));
        b = sm_r16d(__fmul_rn(b, r));
        if (rope) {
            /* rotate-half: (a, b) -> (a cos - b sin, a sin + b cos) at angle pos * inv_freq, r16 */
            const float ang = __fmul_rn((float)pos[row], tab.inv[lane]);
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
    const int64_t sl = slot[row];
    if (sl < 0 || sl >= nslots) return;
    uint16_t *dst = kv + (((sl / SM_KV_BLOCK) * nkv + h) * SM_KV_BLOCK + sl % SM_KV_BLOCK) * 128 + (kind == 2 ? 64 : 0);
    dst[lane] = sm_tobf(a);
    dst[lane + 32] = sm_tobf(b);
}

int sm_k_qk_rope_kv(const uint16_t *q, int ldq, const uint16_t *k, const uint16_t *v, int ldkv, int n, int nh, int nkv,
                    const int *pos, const int64_t *slot, double theta, float eps, uint16_t *q_out, int ldq_out,
                    uint16_t *kv, int nblocks, cudaStream_t st, sm_err *e) {
    if (n < 0 || nh <= 0 || nkv <= 0 || nblocks <= 0)
        return sm_errf(e, "sm_k_qk_rope_kv: bad shape n=%d nh=%d nkv=%d nblocks=%d", n, nh, nkv, nblocks);
    if (nkv > nh) return sm_errf(e, "sm_k_qk_rope_kv: nkv=%d > nh=%d", nkv, nh);
    if (ldq < nh * 64 || ldkv < nkv * 64)
        return sm_errf(e, "sm_k_qk_rope_kv: row strides ldq=%d / ldkv=%d below nh*64=%d / nkv*64=%d", ldq, ldkv, nh * 64, nkv * 64);
    if (ldq_out < nh * 64) return sm_errf(e, "sm_k_qk_rope_kv: ldq_out=%d < nh*64=%d", ldq_out, nh * 64);
    if (!q || !k || !v || !pos || !slot || !q_out || !kv) return sm_errf(e, "sm_k_qk_rope_kv: NULL pointer argument");
    if (q_out == q && ldq_out != ldq) return sm_errf(e, "sm_k_qk_rope_kv: in place needs ldq_out == ldq (%d != %d)", ldq_out, ldq);
    if (n == 0) return 0;
    rope_tab tab;
    for (int j = 0; j < 32; j++) tab.inv[j] = theta > 0 ? (float)pow(theta, -2.0 * j / 64.0) : 0.0f;
    dim3 grid(n, sm_cdiv(nh + 2 * nkv, ROPE_WARPS));
    qk_rope_kv_kernel<<<grid, ROPE_WARPS * 32, 0, st>>>(q, ldq, k, v, ldkv, nh, nkv, pos, slot, theta > 0, tab, eps, q_out,
                                                       ldq_out, kv, (int64_t)nblocks * SM_KV_BLOCK);
    SM_LAUNCH_CHECK("qk_rope_kv_kernel");
    return 0;
}
