/* combine.cu: the stock kernels of the combine phase (combine.cuh): step 1, one block of
 * MOE_COMBINE_THREADS per (row, route); step 2, one thread per 8 elements of m; their
 * launcher and the arguments in the workspace.
 * We rejected one kernel of a block per row (the first version): its routes ran one after the
 * other (combine.cuh says what it cost).
 */
#include "cuda/moe/combine.cuh"
#include "cuda/moe/geom.cuh"

#define MOE_COMBINE_SUM_THREADS 256 /* threads of a step-2 block */

template <int Y32>
__global__ void __launch_bounds__(MOE_COMBINE_THREADS) moe_combine_scale_kernel(const moe_combine_args ca) {
    __shared__ float red[32];
    sm_pdl_wait();    /* y of the expert launch (programmatic dependent launch) */
    sm_pdl_trigger(); /* step 2 may launch now: it waits for this grid's completion */
    moe_combine_scale_item<Y32, 1>(ca, (int)blockIdx.x, red, sm_team_block());
}

template <int Y32, int OUT32>
__global__ void __launch_bounds__(MOE_COMBINE_SUM_THREADS) moe_combine_sum_kernel(const moe_combine_args ca) {
    const size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    sm_pdl_wait(); /* step 1's scales */
    if (c < (size_t)ca.n * (ca.Hm / 8)) moe_combine_elem8<Y32, OUT32, 1>(ca, c);
}

moe_combine_args moe_combine_make(const sm_cuda_moe_layer *L, const float *w, int n, uint16_t *m_out, const sm_cuda_moe_ws *ws) {
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
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
    ca.rs = (float *)(wb + W.rs);
    return ca;
}

int moe_combine_prepare(int Hm, sm_err *e) {
    if (Hm % 8) return sm_errf(e, "cuda moe combine: moe_hidden_size %d is not a multiple of 8", Hm);
    return 0;
}

int moe_combine_launch(const moe_combine_args &ca, cudaStream_t st, sm_err *e) {
    if (ca.n <= 0) return 0;
    if (ca.Hm % 8 || !sm_aligned(ca.pn, 16) || (ca.y32 && !sm_aligned(ca.y32, 16)) ||
        (ca.m_f32 ? !sm_aligned(ca.m_f32, 16) : !sm_aligned(ca.m_out, 16)))
        return sm_errf(e, "cuda moe combine: Hm %d must be a multiple of 8 and y32, m and the norm 16-byte aligned", ca.Hm);
    const int items = ca.n * ca.K;
    const unsigned sb = (unsigned)(((size_t)ca.n * (ca.Hm / 8) + MOE_COMBINE_SUM_THREADS - 1) / MOE_COMBINE_SUM_THREADS);
    /* both steps launched programmatically dependent (each waits for the grid before it) */
    if (ca.y32) {
        SM_CUDA_CHECK(sm_launch_pdl(moe_combine_scale_kernel<1>, (unsigned)items, MOE_COMBINE_THREADS, 0, st, ca));
        SM_CUDA_CHECK(sm_launch_pdl(moe_combine_sum_kernel<1, 0>, sb, MOE_COMBINE_SUM_THREADS, 0, st, ca));
    } else {
        SM_CUDA_CHECK(sm_launch_pdl(moe_combine_scale_kernel<0>, (unsigned)items, MOE_COMBINE_THREADS, 0, st, ca));
        if (ca.m_f32) SM_CUDA_CHECK(sm_launch_pdl(moe_combine_sum_kernel<0, 1>, sb, MOE_COMBINE_SUM_THREADS, 0, st, ca));
        else SM_CUDA_CHECK(sm_launch_pdl(moe_combine_sum_kernel<0, 0>, sb, MOE_COMBINE_SUM_THREADS, 0, st, ca));
    }
    return 0;
}
