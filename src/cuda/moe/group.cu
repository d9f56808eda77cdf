/* group.cu: the stock kernel of the grouping phase (group.cuh): one block of
 * MOE_GROUP_THREADS threads per call (and, for the FP8 tensor cores when h1's producer made no
 * image of it, the blocks that make h1's e4m3 image meanwhile), its launcher and its
 * arguments in the workspace.
 * We rejected launching it from the forward entry directly: a persistent kernel needs the
 * same argument pointers (moe_group_make) without the launch.
 */
#include "cuda/moe/group.cuh"

__global__ void __launch_bounds__(MOE_GROUP_THREADS) moe_group_kernel(const moe_group_args ga) {
    __shared__ moe_group_smem sm;
    sm_pdl_trigger(); /* the expert launch may start now: it waits for this grid's completion */
    if (blockIdx.x) moe_x8_img_rows<MOE_GROUP_THREADS>(ga.h1, ga.n, ga.kin, ga.img, (int)blockIdx.x - 1, (int)gridDim.x - 1);
    else moe_group<MOE_GROUP_THREADS>(ga, &sm);
}

moe_group_args moe_group_make(const sm_cuda_moe_layer *L, const int *idx, int n, const sm_cuda_moe_ws *ws) {
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
    moe_group_args ga;
    ga.idx = idx;
    ga.nr = n * L->K;
    ga.E = L->E;
    ga.njobs = (int *)(wb + W.njobs);
    ga.route_slot = (int *)(wb + W.route_slot);
    ga.slot_route = (int *)(wb + W.slot_route);
    ga.jobs = (int4 *)(wb + W.jobs);
    ga.e0 = 0;
    ga.K = L->K;
    ga.desc = (const moe_desc *)L->desc;
    ga.jobt = (moe_jobt *)(wb + W.jobt);
    ga.done1 = (int *)(wb + W.done1);
    ga.qctr = (int *)(wb + W.qctr);
    ga.h1 = NULL;
    ga.n = n;
    ga.kin = L->Hm;
    ga.img = sm_x8_img{NULL, NULL, 0};
    return ga;
}

int moe_group_launch(const moe_group_args &ga, cudaStream_t st, sm_err *e) {
    long long nx = 0; /* image blocks: an 8-value chunk a thread */
    if (ga.h1) nx = ((long long)ga.n * (ga.kin / 8) + MOE_GROUP_THREADS - 1) / MOE_GROUP_THREADS;
    moe_group_kernel<<<(unsigned)(1 + nx), MOE_GROUP_THREADS, 0, st>>>(ga);
    SM_LAUNCH_CHECK("moe_group_kernel");
    return 0;
}
