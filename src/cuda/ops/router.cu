/* ops/router.cu: MoE routing on the GPU (docs/model.md section 6): the router logits through
 * sm_k_mm_f32w (f32 weights, f32 accumulation: the selection must agree with the CPU reference
 * whenever the scores are not within rounding of each other), then the top-K kernel, one warp
 * per row calling the body of ops/router.cuh.  We rejected fusing the top-K into the matmul's
 * epilogue: the logits of a row come from several blocks (split k), and the caller wants them
 * as an output too.
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/router.cuh"

#define TOPK_WARPS 4

/* One warp per row, TOPK_WARPS rows a block; dynamic shared memory float [TOPK_WARPS][2 E]. */
__global__ void __launch_bounds__(TOPK_WARPS * 32)
topk_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int n, int E, int K, float m_o,
            float route_scale, int *__restrict__ idx, float *__restrict__ w) {
    extern __shared__ float sh[];
    const int warp = threadIdx.x >> 5;
    const int row = blockIdx.x * TOPK_WARPS + warp;
    if (row >= n) return; /* warp-uniform; only warp-level sync in the body */
    sm_route_topk_row(logits, bias, E, K, m_o, route_scale, idx, w, row, sh + (size_t)warp * 2 * E);
}

int sm_k_route(sm_kernel_ctx *kc, const uint16_t *xf, int n, int H, const float *router, const float *bias, int E, int K,
               float m_o, float route_scale, float *logits, int *idx, float *w, cudaStream_t st, sm_err *e) {
    if (n < 0 || H <= 0 || E <= 0 || K <= 0) return sm_errf(e, "sm_k_route: bad shape n=%d H=%d E=%d K=%d", n, H, E, K);
    if (E > 1024 || K > 32 || K > E) return sm_errf(e, "sm_k_route: E=%d, K=%d unsupported (E <= 1024, K <= min(E, 32))", E, K);
    if (!xf || !router || !bias || !logits || !idx || !w) return sm_errf(e, "sm_k_route: NULL pointer argument");
    if (n == 0) return 0;
    /* logits = xf @ router^T, f32 */
    if (sm_k_mm_f32w(kc, xf, n, H, router, E, logits, st, e)) return sm_errprefix(e, "sm_k_route");
    /* scores, top-K, weights */
    const size_t smem = (size_t)TOPK_WARPS * 2 * E * sizeof(float);
    topk_kernel<<<sm_cdiv(n, TOPK_WARPS), TOPK_WARPS * 32, smem, st>>>(logits, bias, n, E, K, m_o, route_scale, idx, w);
    SM_LAUNCH_CHECK("topk_kernel");
    return 0;
}
