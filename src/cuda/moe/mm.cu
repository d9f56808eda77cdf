/* mm.cu: the stock kernels of the expert matmul (mm.cuh), one launch per stage on a
 * persistent grid fixed by the workspace (SMs x resident blocks), and the forward entry of
 * the whole MoE stage (moe.h): group -> stage 1 -> stage 2 -> combine, four launches on the
 * caller's stream, no host synchronization and no allocation (CUDA-graph capturable).
 * We rejected cuBLAS grouped GEMM on dequantized bf16 copies (4x the bytes of MXFP4) and a
 * fixed grid of (expert, tile) blocks that mostly exit (256 experts x tiles of launches for
 * ~55 touched ones at 8 rows).
 */
#include "cuda/moe/mm.cuh"
#include "cuda/moe/group.cuh"
#include "cuda/moe/combine.cuh"

template <int F, int STAGE>
__global__ void __launch_bounds__(MOE_THREADS, 2) moe_mm_kernel(const moe_args a) {
    extern __shared__ uint4 moe_smem[];
    moe_mm_block<F, STAGE, 1>(a, blockIdx.x, gridDim.x, moe_smem, sm_team_block());
}

moe_args moe_mm_make(const sm_cuda_moe_layer *L, const uint16_t *h1, const sm_cuda_moe_ws *ws, int stage) {
    const moe_geom G = moe_geometry(L->fmt, L->Hm, L->I);
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
    moe_args a;
    a.blob = (const uint8_t *)L->blob;
    a.desc = (const moe_desc *)L->desc;
    a.njobs = (const int *)(wb + W.njobs);
    a.jobs = (const int4 *)(wb + W.jobs);
    a.slot_route = (const int *)(wb + W.slot_route);
    a.K = L->K;
    a.sb = G.sb;
    a.pf = ws->prefetch < 0 ? 0 : ws->prefetch;
    if (stage == 1) {
        /* act = r16(silu(r16(h1 gate^T)) * r16(h1 up^T)) */
        a.in = h1; a.out = (uint16_t *)(wb + W.act);
        a.kin = L->Hm; a.Kp = G.Kp1; a.nsteps = G.ns1; a.rows_out = L->I;
        a.tiles = G.Ip / 16; a.pairs = G.p1; a.ipj = (G.p1 + MOE_WARPS - 1) / MOE_WARPS;
    } else {
        /* y = r16(act down^T) */
        a.in = (const uint16_t *)(wb + W.act); a.out = (uint16_t *)(wb + W.y);
        a.kin = L->I; a.Kp = G.Kp2; a.nsteps = G.ns2; a.rows_out = L->Hm;
        a.tiles = G.t2; a.pairs = G.p2; a.ipj = (G.p2 + MOE_WARPS - 1) / MOE_WARPS;
    }
    return a;
}

/* Kernel attributes of one (format, stage) and its resident blocks. */
template <int F, int STAGE>
static int moe_prep_kernel(size_t smem, int *occ, sm_err *e) {
    SM_CUDA_CHECK(cudaFuncSetAttribute(moe_mm_kernel<F, STAGE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int o = 0;
    SM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, moe_mm_kernel<F, STAGE>, MOE_THREADS, smem));
    if (o < *occ) *occ = o;
    return 0;
}

int moe_mm_prepare(int Hm, int I, int *occ, sm_err *e) {
    const size_t s1 = (size_t)moe_rup(Hm, MOE_KALIGN) * 16, s2 = (size_t)moe_rup(I, MOE_KALIGN) * 16;
    if (moe_prep_kernel<SM_EXP_MXFP4, 1>(s1, occ, e) || moe_prep_kernel<SM_EXP_MXFP4, 2>(s2, occ, e) ||
        moe_prep_kernel<SM_EXP_FP8, 1>(s1, occ, e) || moe_prep_kernel<SM_EXP_FP8, 2>(s2, occ, e) ||
        moe_prep_kernel<SM_EXP_BF16, 1>(s1, occ, e) || moe_prep_kernel<SM_EXP_BF16, 2>(s2, occ, e))
        return -1;
    return 0;
}

template <int F>
static int moe_mm_launch(const sm_cuda_moe_layer *L, const uint16_t *h1, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    const moe_args a1 = moe_mm_make(L, h1, ws, 1);
    moe_mm_kernel<F, 1><<<ws->grid, MOE_THREADS, moe_mm_smem(a1), st>>>(a1);
    SM_LAUNCH_CHECK("moe_mm_kernel (gate_up)");
    const moe_args a2 = moe_mm_make(L, h1, ws, 2);
    moe_mm_kernel<F, 2><<<ws->grid, MOE_THREADS, moe_mm_smem(a2), st>>>(a2);
    SM_LAUNCH_CHECK("moe_mm_kernel (down)");
    return 0;
}

extern "C" int sm_cuda_moe_forward(const sm_cuda_moe_layer *L, const uint16_t *h1, const int *idx, const float *w, int n,
                                   uint16_t *m_out, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    if (!L || !L->blob || !ws || !ws->buf) return sm_errf(e, "cuda moe forward: layer or workspace not allocated");
    if (n < 0 || n > ws->max_rows) return sm_errf(e, "cuda moe forward: %d rows outside [0, max_rows = %d] of the workspace", n, ws->max_rows);
    if (ws->E != L->E || ws->K != L->K || ws->Hm != L->Hm || ws->I != L->I)
        return sm_errf(e, "cuda moe forward: workspace sized for E %d K %d Hm %d I %d, layer has E %d K %d Hm %d I %d", ws->E,
                       ws->K, ws->Hm, ws->I, L->E, L->K, L->Hm, L->I);
    if (n == 0) return 0;
    if (!h1 || !idx || !w || !m_out) return sm_errf(e, "cuda moe forward: NULL h1, idx, w or m_out");
    if (!sm_aligned(h1, 16)) return sm_errf(e, "cuda moe forward: h1 must be 16-byte aligned");
    /* group routes by expert */
    if (moe_group_launch(moe_group_make(L, idx, n, ws), st, e)) return -1;
    int rc;
    switch (L->fmt) {
    case SM_EXP_MXFP4: rc = moe_mm_launch<SM_EXP_MXFP4>(L, h1, ws, st, e); break;
    case SM_EXP_FP8: rc = moe_mm_launch<SM_EXP_FP8>(L, h1, ws, st, e); break;
    case SM_EXP_BF16: rc = moe_mm_launch<SM_EXP_BF16>(L, h1, ws, st, e); break;
    default: return sm_errf(e, "cuda moe forward: unknown expert format %d", L->fmt);
    }
    if (rc) return -1;
    /* post-expert norm and the route-ordered weighted sum */
    return moe_combine_launch(moe_combine_make(L, w, n, m_out, ws), st, e);
}
