/* ops/rope_kv.cu: the stock kernel of the QK norm + RoPE + KV insert (body in
 * ops/rope_kv.cuh) and its checked extern "C" entry.
 *
 * One warp per (row, head), ROPE_WARPS heads a block; the entry computes inv_freq on the host
 * (as the CPU reference does) and passes it by value, so a captured graph holds it.  We
 * rejected a table in device memory: it would be one more buffer to own for 128 bytes.
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/rope_kv.cuh"

#define ROPE_WARPS 4

/* One warp per (row, head): grid (n, cdiv(nh + 2 nkv, ROPE_WARPS)). */
__global__ void __launch_bounds__(ROPE_WARPS * 32)
qk_rope_kv_kernel(const uint16_t *q, int ldq, const uint16_t *k, const uint16_t *v, int ldkv, int nh, int nkv,
                  const int *__restrict__ pos, const int64_t *__restrict__ slot, int rope, const __grid_constant__ sm_rope_tab tab,
                  float eps, uint16_t *q_out, int ldq_out, uint16_t *__restrict__ kv, int64_t nslots) {
    const int hh = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
    if (hh >= nh + 2 * nkv) return; /* no barrier in the body: a warp may leave */
    sm_rope_kv_head(q, ldq, k, v, ldkv, nh, nkv, pos, slot, rope, tab, eps, q_out, ldq_out, kv, nslots, blockIdx.x, hh);
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
    const sm_rope_tab tab = sm_rope_make_tab(theta);
    dim3 grid(n, sm_cdiv(nh + 2 * nkv, ROPE_WARPS));
    qk_rope_kv_kernel<<<grid, ROPE_WARPS * 32, 0, st>>>(q, ldq, k, v, ldkv, nh, nkv, pos, slot, theta > 0, tab, eps, q_out,
                                                       ldq_out, kv, (int64_t)nblocks * SM_KV_BLOCK);
    SM_LAUNCH_CHECK("qk_rope_kv_kernel");
    return 0;
}
