/* group.cu: the stock kernel of the grouping phase (group.cuh): one block of
 * MOE_GROUP_THREADS threads per call, its launcher and its arguments in the workspace.
 * We rejected launching it from the forward entry directly: a persistent kernel needs the
 * same argument pointers (moe_group_make) without the launch.
 */
#include "cuda/moe/group.cuh"

__global__ void __launch_bounds__(MOE_GROUP_THREADS) moe_group_kernel(const moe_group_args ga) {
    __shared__ moe_group_smem sm;
    sm_pdl_trigger(); /* the expert launch may start now: it waits for this grid's completion */
    moe_group<MOE_GROUP_THREADS>(ga, &sm);
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
    return ga;
}

int moe_group_launch(const moe_group_args &ga, cudaStream_t st, sm_err *e) {
    moe_group_kernel<<<1, MOE_GROUP_THREADS, 0, st>>>(ga);
    SM_LAUNCH_CHECK("moe_group_kernel");
    return 0;
}
