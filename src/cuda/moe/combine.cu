/* combine.cu: the stock kernel of the combine phase (combine.cuh): one block of
 * MOE_COMBINE_THREADS per row, Hm floats of dynamic shared memory; its launcher, kernel
 * attribute and arguments in the workspace.
 * We rejected a fixed grid looping over rows: one block per row is the measured layout and
 * the body gives the same bits for any grid.
 */
#include "cuda/moe/combine.cuh"
#include "cuda/moe/geom.cuh"

template <int Y32, int OUT32>
__global__ void __launch_bounds__(MOE_COMBINE_THREADS) moe_combine_kernel(const uint16_t *__restrict__ y, const int *__restrict__ route_slot,
                                                                          const float *__restrict__ w, const float *__restrict__ pn, int K,
                                                                          int Hm, float eps, uint16_t *__restrict__ m_out,
                                                                          float *__restrict__ m_f32, const float *__restrict__ y32,
                                                                          const int *__restrict__ idx, int E) {
    extern __shared__ float msum[]; /* [Hm], each element owned by one thread */
    __shared__ float red[32];
    const moe_combine_args ca = {y, route_slot, w, pn, (int)gridDim.x, K, Hm, eps, m_out, m_f32, y32, idx, E};
    moe_combine_rows_t<Y32, OUT32>(ca, blockIdx.x, gridDim.x, msum, red, sm_team_block());
}

moe_combine_args moe_combine_make(const sm_cuda_moe_layer *L, const float *w, int n, uint16_t *m_out, const sm_cuda_moe_ws *ws) {
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    const uint8_t *wb = (const uint8_t *)ws->buf;
    moe_combine_args ca;
    ca.y = (const uint16_t *)(wb + W.y);
    ca.route_slot = (const int *)(wb + W.route_slot);
    ca.w = w;
    ca.pn = L->post_norm;
    ca.n = n; ca.K = L->K; ca.Hm = L->Hm;
    ca.eps = L->post_eps;
    ca.m_out = m_out;
    ca.m_f32 = NULL;
    ca.y32 = NULL;
    ca.idx = NULL;
    ca.E = L->E;
    return ca;
}

int moe_combine_prepare(int Hm, sm_err *e) {
    const size_t csm = sizeof(float) * (size_t)Hm;
    if (csm > 48 * 1024) {
        SM_CUDA_CHECK(cudaFuncSetAttribute(moe_combine_kernel<0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm));
        SM_CUDA_CHECK(cudaFuncSetAttribute(moe_combine_kernel<0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm));
        SM_CUDA_CHECK(cudaFuncSetAttribute(moe_combine_kernel<1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm));
    }
    return 0;
}

int moe_combine_launch(const moe_combine_args &ca, cudaStream_t st, sm_err *e) {
    const size_t smem = sizeof(float) * (size_t)ca.Hm;
    if (ca.y32)
        moe_combine_kernel<1, 0><<<ca.n, MOE_COMBINE_THREADS, smem, st>>>(ca.y, ca.route_slot, ca.w, ca.pn, ca.K, ca.Hm, ca.eps,
                                                                           ca.m_out, ca.m_f32, ca.y32, ca.idx, ca.E);
    else if (ca.m_f32)
        moe_combine_kernel<0, 1><<<ca.n, MOE_COMBINE_THREADS, smem, st>>>(ca.y, ca.route_slot, ca.w, ca.pn, ca.K, ca.Hm, ca.eps,
                                                                           ca.m_out, ca.m_f32, ca.y32, ca.idx, ca.E);
    else
        moe_combine_kernel<0, 0><<<ca.n, MOE_COMBINE_THREADS, smem, st>>>(ca.y, ca.route_slot, ca.w, ca.pn, ca.K, ca.Hm, ca.eps,
                                                                           ca.m_out, ca.m_f32, ca.y32, ca.idx, ca.E);
    SM_LAUNCH_CHECK("moe_combine_kernel");
    return 0;
}
