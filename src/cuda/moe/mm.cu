/* mm.cu: the stock kernels of the expert matmul and the forward entries of the MoE stage
 * (moe.h): group -> expert matmul -> combine on the caller's stream, no host synchronization
 * and no allocation (CUDA-graph capturable).  The expert matmul runs as ws->sched says: the
 * queue schedule (queue.cuh, the default: both stages in one persistent launch) or the stage
 * schedule (mm.cuh: one launch a stage on a persistent grid fixed by the workspace, SMs x
 * resident blocks); the same bits either way.  The queue kernel and the combine's kernels are
 * programmatic dependent launches (common.cuh sm_launch_pdl): each waits for the grid before
 * it on entry, so their launches overlap that kernel (bench/results.md, 2026-12-04).
 * The rank entries reuse the same phases: EP groups with the rank's first expert as offset and
 * combines into an f32 partial m; TP stores stage 2's y in f32 per route (routes of invalid
 * ids zeroed by a small kernel), and the finalize is the combine reading that y.
 * We rejected cuBLAS grouped GEMM on dequantized bf16 copies (4x the bytes of MXFP4) and a
 * fixed grid of (expert, tile) blocks that mostly exit (256 experts x tiles of launches for
 * ~55 touched ones at 8 rows).
 */
#include "cuda/moe/mm.cuh"
#include "cuda/moe/queue.cuh"
#include "cuda/moe/group.cuh"
#include "cuda/moe/combine.cuh"

template <int F, int STAGE, int Y32 = 0>
__global__ void __launch_bounds__(MOE_THREADS, 2) moe_mm_kernel(const moe_args a) {
    extern __shared__ uint4 moe_smem[];
    moe_mm_block<F, STAGE, 1, Y32>(a, blockIdx.x, gridDim.x, moe_smem, sm_team_block());
}

/* The queue schedule (queue.cuh): both stages in one launch. */
template <int F, int Y32>
__global__ void __launch_bounds__(MOE_THREADS, 2) moe_q_kernel(const __grid_constant__ moe_qargs q) {
    extern __shared__ uint4 moe_smem[];
    __shared__ moe_qslot ring[MOE_Q_RING];
    sm_pdl_wait();    /* the grouping (launched before this grid: programmatic dependent launch) */
    sm_pdl_trigger(); /* the combine may launch as this grid's blocks leave */
    moe_q_block<F, Y32>(q, (uint2 *)moe_smem, ring, (int)gridDim.x);
}

/* TP: rows of y [nr, Hm] f32 of routes without a slot (invalid expert ids) = 0; one block per
 * route, grid-stride. */
__global__ void moe_zero_routes_kernel(const int *__restrict__ route_slot, int nr, int Hm, float *__restrict__ y) {
    for (int r = blockIdx.x; r < nr; r += gridDim.x) {
        if (route_slot[r] >= 0) continue;
        for (int x = threadIdx.x; x < Hm; x += blockDim.x) y[(size_t)r * Hm + x] = 0.0f;
    }
}

moe_args moe_mm_make(const sm_cuda_moe_layer *L, const uint16_t *h1, int n, const sm_cuda_moe_ws *ws, int stage) {
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
    a.pf = sm_cuda_moe_prefetch(L, ws, n);
    a.y32 = NULL;
    /* W4A4: h1 rounded as staged unless its producer rounded it; act by stage 1's epilogue */
    const int w4a4 = L->fmt == SM_EXP_MXFP4 && L->act_mx;
    a.aq = !w4a4 ? 0 : stage == 1 ? (ws->h1_mx ? 0 : MOE_AQ_IN) | MOE_AQ_OUT : 0;
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

/* Where h1's e4m3 image lives in ws (MOE_F_MX8: written by h1's producer or the grouping launch). */
static sm_x8_img moe_h1_img_at(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws) {
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
    return sm_x8_img{wb + W.h1c, (float *)(wb + W.h1f), W.kp1};
}

moe_qargs moe_q_make(const sm_cuda_moe_layer *L, const uint16_t *h1, int n, const sm_cuda_moe_ws *ws, float *y32) {
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
    moe_qargs q;
    q.a1 = moe_mm_make(L, h1, n, ws, 1);
    q.a2 = moe_mm_make(L, h1, n, ws, 2);
    q.a2.y32 = y32;
    q.jobt = (const moe_jobt *)(wb + W.jobt);
    q.done1 = (int *)(wb + W.done1);
    q.qctr = (int *)(wb + W.qctr);
    q.prof = ws->prof;
    q.act8 = NULL;
    q.h1i = sm_x8_img{NULL, NULL, 0};
    if (sm_cuda_moe_kfmt(L) == MOE_F_MX8) {
        q.act8 = wb + W.act8;
        q.h1i = moe_h1_img_at(L, ws);
    }
    return q;
}

size_t moe_q_smem(const moe_qargs &q) {
    const size_t s1 = moe_mm_smem(q.a1), s2 = moe_mm_smem(q.a2);
    if (q.act8) return 2 * moe_x8_bbuf(q.a1.Kp, q.a2.Kp);
    return s1 > s2 ? s1 : s2;
}

extern "C" int sm_cuda_moe_h1_img(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, uint8_t **codes, float **fac, int *kp) {
    *codes = NULL; *fac = NULL; *kp = 0;
    if (!L || !ws || !ws->buf || !ws->h1_mx || sm_cuda_moe_kfmt(L) != MOE_F_MX8) return 0;
    const sm_x8_img im = moe_h1_img_at(L, ws);
    *codes = im.codes; *fac = im.fac; *kp = im.kp;
    return 1;
}

/* Raise kernel k's dynamic shared memory limit to at least smem, never lower it: the limit is
 * one per kernel and device, and layers of other widths (a TP rank's I slice beside a
 * one-rank backend in one process) keep launching with their own, larger needs. */
static int moe_smem_at_least(const void *k, size_t smem, sm_err *e) {
    cudaFuncAttributes fa;
    SM_CUDA_CHECK(cudaFuncGetAttributes(&fa, k));
    if ((size_t)fa.maxDynamicSharedSizeBytes < smem)
        SM_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return 0;
}

/* Kernel attributes of one (format, stage) and its resident blocks. */
template <int F, int STAGE>
static int moe_prep_kernel(size_t smem, int *occ, sm_err *e) {
    if (moe_smem_at_least((const void *)moe_mm_kernel<F, STAGE>, smem, e)) return -1;
    int o = 0;
    SM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, moe_mm_kernel<F, STAGE>, MOE_THREADS, smem));
    if (o < *occ) *occ = o;
    return 0;
}

int moe_mm_prepare(int Hm, int I, int *occ, sm_err *e) {
    const size_t s1 = (size_t)moe_rup(Hm, MOE_KALIGN) * 16, s2 = (size_t)moe_rup(I, MOE_KALIGN) * 16;
    if (moe_prep_kernel<SM_EXP_MXFP4, 1>(s1, occ, e) || moe_prep_kernel<SM_EXP_MXFP4, 2>(s2, occ, e) ||
        moe_prep_kernel<MOE_F_MX8, 1>(s1, occ, e) || moe_prep_kernel<MOE_F_MX8, 2>(s2, occ, e) ||
        moe_prep_kernel<MOE_F_MX4, 1>(s1, occ, e) || moe_prep_kernel<MOE_F_MX4, 2>(s2, occ, e) ||
        moe_prep_kernel<SM_EXP_FP8, 1>(s1, occ, e) || moe_prep_kernel<SM_EXP_FP8, 2>(s2, occ, e) ||
        moe_prep_kernel<SM_EXP_BF16, 1>(s1, occ, e) || moe_prep_kernel<SM_EXP_BF16, 2>(s2, occ, e))
        return -1;
    /* the queue schedule: attributes only (its blocks need not all be resident: queue.cuh);
     * MOE_F_MX8 double-buffers its smaller B (moe_q_smem) */
    const size_t sq = s1 > s2 ? s1 : s2;
    const size_t sx = 2 * moe_x8_bbuf(moe_rup(Hm, MOE_KALIGN), moe_rup(I, MOE_KALIGN));
    if (moe_smem_at_least((const void *)moe_q_kernel<SM_EXP_MXFP4, 0>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<MOE_F_MX4, 0>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<MOE_F_MX4, 1>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<MOE_F_MX8, 0>, sx, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<MOE_F_MX8, 1>, sx, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<SM_EXP_FP8, 0>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<SM_EXP_BF16, 0>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<SM_EXP_MXFP4, 1>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<SM_EXP_FP8, 1>, sq, e) ||
        moe_smem_at_least((const void *)moe_q_kernel<SM_EXP_BF16, 1>, sq, e))
        return -1;
    return 0;
}

/* Stages 1 and 2 on st, as ws->sched says; y32 NULL: y bf16 per slot in the workspace, else f32 per route. */
template <int F>
static int moe_mm_launch(const sm_cuda_moe_layer *L, const uint16_t *h1, int n, const sm_cuda_moe_ws *ws, float *y32,
                         cudaStream_t st, sm_err *e) {
    if (ws->sched == SM_MOE_SCHED_QUEUE) {
        const moe_qargs q = moe_q_make(L, h1, n, ws, y32);
        const size_t smem = moe_q_smem(q);
        if (y32) SM_CUDA_CHECK(sm_launch_pdl(moe_q_kernel<F, 1>, (unsigned)ws->grid, MOE_THREADS, smem, st, q));
        else SM_CUDA_CHECK(sm_launch_pdl(moe_q_kernel<F, 0>, (unsigned)ws->grid, MOE_THREADS, smem, st, q));
        return 0;
    }
    const moe_args a1 = moe_mm_make(L, h1, n, ws, 1);
    moe_mm_kernel<F, 1><<<ws->grid, MOE_THREADS, moe_mm_smem(a1), st>>>(a1);
    SM_LAUNCH_CHECK("moe_mm_kernel (gate_up)");
    moe_args a2 = moe_mm_make(L, h1, n, ws, 2);
    if (y32) {
        a2.y32 = y32;
        moe_mm_kernel<F, 2, 1><<<ws->grid, MOE_THREADS, moe_mm_smem(a2), st>>>(a2);
    } else {
        moe_mm_kernel<F, 2><<<ws->grid, MOE_THREADS, moe_mm_smem(a2), st>>>(a2);
    }
    SM_LAUNCH_CHECK("moe_mm_kernel (down)");
    return 0;
}

extern "C" int sm_cuda_moe_kfmt(const sm_cuda_moe_layer *L) {
    if (L->fmt == SM_EXP_MXFP4 && L->act_mx) return L->x8 ? MOE_F_MX8 : MOE_F_MX4;
    return L->fmt;
}

extern "C" int sm_cuda_moe_prefetch(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, int n) {
    return sm_cuda_moe_kfmt(L) == MOE_F_MX8 && ws->prefetch > 0 && n <= ws->prefetch_rows ? ws->prefetch : 0;
}

/* The checks every forward entry makes (who: the entry's name in messages); 1 when n == 0
 * (nothing to do), 0 to go on, -1 with e filled. */
static int moe_fwd_check(const char *who, const sm_cuda_moe_layer *L, const uint16_t *h1, int n, const sm_cuda_moe_ws *ws, sm_err *e) {
    if (!L || !L->blob || !ws || !ws->buf) return sm_errf(e, "%s: layer or workspace not allocated", who);
    if (n < 0 || n > ws->max_rows) return sm_errf(e, "%s: %d rows outside [0, max_rows = %d] of the workspace", who, n, ws->max_rows);
    if (ws->E != L->E || ws->K != L->K || ws->Hm != L->Hm || ws->I != L->I)
        return sm_errf(e, "%s: workspace sized for E %d K %d Hm %d I %d, layer has E %d K %d Hm %d I %d", who, ws->E, ws->K, ws->Hm,
                       ws->I, L->E, L->K, L->Hm, L->I);
    if (n == 0) return 1;
    if (h1 && !sm_aligned(h1, 16)) return sm_errf(e, "%s: h1 must be 16-byte aligned", who);
    return 0;
}

/* Group the routes (local expert = id - e0), then stages 1 and 2 (y32: as moe_mm_launch). */
static int moe_experts_run(const char *who, const sm_cuda_moe_layer *L, int e0, const uint16_t *h1, const int *idx, int n,
                           float *y32, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    moe_group_args ga = moe_group_make(L, idx, n, ws);
    ga.e0 = e0;
    if (sm_cuda_moe_kfmt(L) == MOE_F_MX8 && ws->sched == SM_MOE_SCHED_QUEUE && !ws->h1_mx) {
        /* the queue copies h1's image; its producer did not write it: the grouping launch does */
        ga.h1 = h1;
        ga.img = moe_h1_img_at(L, ws);
    }
    if (moe_group_launch(ga, st, e)) return -1;
    switch (sm_cuda_moe_kfmt(L)) {
    case MOE_F_MX8: return moe_mm_launch<MOE_F_MX8>(L, h1, n, ws, y32, st, e);
    case MOE_F_MX4: return moe_mm_launch<MOE_F_MX4>(L, h1, n, ws, y32, st, e);
    case SM_EXP_MXFP4: return moe_mm_launch<SM_EXP_MXFP4>(L, h1, n, ws, y32, st, e);
    case SM_EXP_FP8: return moe_mm_launch<SM_EXP_FP8>(L, h1, n, ws, y32, st, e);
    case SM_EXP_BF16: return moe_mm_launch<SM_EXP_BF16>(L, h1, n, ws, y32, st, e);
    default: return sm_errf(e, "%s: unknown expert format %d", who, L->fmt);
    }
}

extern "C" int sm_cuda_moe_forward(const sm_cuda_moe_layer *L, const uint16_t *h1, const int *idx, const float *w, int n,
                                   uint16_t *m_out, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    const char *who = "cuda moe forward";
    const int ck = moe_fwd_check(who, L, h1, n, ws, e);
    if (ck) return ck > 0 ? 0 : -1;
    if (!h1 || !idx || !w || !m_out) return sm_errf(e, "%s: NULL h1, idx, w or m_out", who);
    /* group routes by expert, gate_up + SiLU, down */
    if (moe_experts_run(who, L, 0, h1, idx, n, NULL, ws, st, e)) return -1;
    /* post-expert norm and the route-ordered weighted sum */
    return moe_combine_launch(moe_combine_make(L, w, n, m_out, ws), st, e);
}

extern "C" int sm_cuda_moe_forward_ep(const sm_cuda_moe_layer *L, int e0, const uint16_t *h1, const int *idx, const float *w, int n,
                                      float *m_part, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    const char *who = "cuda moe forward (EP rank)";
    const int ck = moe_fwd_check(who, L, h1, n, ws, e);
    if (ck) return ck > 0 ? 0 : -1;
    if (!h1 || !idx || !w || !m_part) return sm_errf(e, "%s: NULL h1, idx, w or m_part", who);
    if (e0 < 0) return sm_errf(e, "%s: first expert e0 = %d is negative", who, e0);
    /* this rank's routes (ids in [e0, e0 + E)) grouped by local expert, gate_up + SiLU, down */
    if (moe_experts_run(who, L, e0, h1, idx, n, NULL, ws, st, e)) return -1;
    /* post-expert norm and the route-ordered weighted sum of this rank's routes, f32 */
    moe_combine_args ca = moe_combine_make(L, w, n, NULL, ws);
    ca.m_f32 = m_part;
    return moe_combine_launch(ca, st, e);
}

extern "C" int sm_cuda_moe_forward_tp(const sm_cuda_moe_layer *L, const uint16_t *h1, const int *idx, int n, float *y_part,
                                      const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    const char *who = "cuda moe forward (TP rank)";
    const int ck = moe_fwd_check(who, L, h1, n, ws, e);
    if (ck) return ck > 0 ? 0 : -1;
    if (!h1 || !idx || !y_part) return sm_errf(e, "%s: NULL h1, idx or y_part", who);
    /* every valid route grouped by expert, gate_up + SiLU over this rank's I slice, down
     * columns of the slice: y per route in f32 */
    if (moe_experts_run(who, L, 0, h1, idx, n, y_part, ws, st, e)) return -1;
    /* routes of invalid ids: y = 0 */
    const moe_group_args ga = moe_group_make(L, idx, n, ws);
    const int nr = n * L->K;
    moe_zero_routes_kernel<<<nr < 1024 ? nr : 1024, 128, 0, st>>>(ga.route_slot, nr, L->Hm, y_part);
    SM_LAUNCH_CHECK("moe_zero_routes_kernel");
    return 0;
}

extern "C" int sm_cuda_moe_finalize(const sm_cuda_moe_layer *L, const float *y, const int *idx, const float *w, int n,
                                    uint16_t *m_out, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    const char *who = "cuda moe finalize";
    const int ck = moe_fwd_check(who, L, NULL, n, ws, e);
    if (ck) return ck > 0 ? 0 : -1;
    if (!y || !idx || !w || !m_out) return sm_errf(e, "%s: NULL y, idx, w or m_out", who);
    /* per route: t = r16(r16(y) * eff(post_expert_norm)), yn = t * rsqrt(mean(t^2) + eps);
     * m = r16(sum_k w_k yn_k) over the valid routes in route order */
    moe_combine_args ca = moe_combine_make(L, w, n, m_out, ws);
    ca.y = NULL;
    ca.route_slot = NULL;
    ca.y32 = y;
    ca.idx = idx;
    ca.E = L->E;
    return moe_combine_launch(ca, st, e);
}
