/* group.cuh: grouping of the routes of a call by expert (device body), the first phase of the
 * MoE expert stage.  A route is one (row, k) choice of the router (idx [n, K]); grouping gives
 * each valid route a slot (slots are expert-major: the routes of expert x are contiguous) and
 * cuts each expert's routes into jobs of at most MOE_CH = 8 (one mma n-tile), so the matmul
 * reads each touched expert's weights once per job.
 *
 * One block does the whole call (counts per expert in shared memory, two exclusive scans,
 * then the slots); the body is written for NT threads so a persistent kernel with another
 * block size can run it in one of its blocks.  Slot order within an expert follows the
 * shared-memory atomics (it may vary from run to run); nothing downstream depends on it:
 * the combine reads every route through route_slot in route order.
 * We rejected a multi-block grouping: it needs a grid-wide barrier between count and scan,
 * and one block groups 4096 routes in a few microseconds.
 */
#ifndef SM_CUDA_MOE_GROUP_CUH
#define SM_CUDA_MOE_GROUP_CUH
#include "cuda/common.cuh"
#include "cuda/moe/geom.cuh"

#define MOE_GROUP_THREADS 1024 /* threads of the stock grouping block */

typedef struct moe_group_args {
    const int *idx;           /* [nr] expert id of route r = row * K + k */
    int nr;                   /* routes, <= MOE_MAX_ROUTES */
    int E;                    /* experts, <= MOE_MAX_E */
    int *njobs;               /* out: jobs made */
    int *route_slot;          /* out [nr]: slot of route r, -1 for an id outside [e0, e0 + E) */
    int *slot_route;          /* out [slots]: route of slot s */
    int4 *jobs;               /* out [njobs]: (expert, first slot, routes <= MOE_CH, 0) */
    int e0;                   /* global id of local expert 0: route r goes to local expert
                                 idx[r] - e0 when that lies in [0, E) (0: a whole layer) */
    int K;                    /* routes per row (jobt rows = route / K) */
    const moe_desc *desc;     /* [E] the layer's experts (jobt) */
    moe_jobt *jobt;           /* out [njobs]: the jobs for the queue schedule */
    int *done1;               /* out [njobs]: zeroed (the queue schedule's counters) */
    int *qctr;                /* out: zeroed (the queue schedule's claim counter) */
    const uint16_t *h1;       /* non-NULL (MOE_F_MX8, h1 not rounded by its producer): the stock
                                 launch's blocks past the first make h1's e4m3 image (img) of its
                                 n rows of kin values meanwhile (moe_x8_img_rows) */
    int n, kin;
    sm_x8_img img;
} moe_group_args;

/* Shared memory of the grouping body. */
typedef struct moe_group_smem {
    int cnt[MOE_MAX_E];       /* routes per expert */
    int off[MOE_MAX_E];       /* first slot of each expert */
    int joff[MOE_MAX_E];      /* first job of each expert */
    int wsum[2][32];          /* per-warp sums of counts / jobs, then their scan */
} moe_group_smem;

/* Group the routes of ga.  Run by ONE block of exactly NT threads (NT a multiple of 32, at
 * most 1024, dividing MOE_MAX_ROUTES); every thread must call it (it holds barriers); sm:
 * shared memory of that block.  The outputs are complete when the block has finished: a
 * persistent kernel puts a grid barrier between this phase and the matmul. */
template <int NT>
__device__ __forceinline__ void moe_group(const moe_group_args &ga, moe_group_smem *sm) {
    static_assert(NT % 32 == 0 && NT <= 1024 && MOE_MAX_ROUTES % NT == 0, "moe_group: bad block size");
    constexpr int NW = NT / 32, PQ = MOE_MAX_ROUTES / NT;
    int *cnt = sm->cnt, *off = sm->off, *joff = sm->joff;
    int(*wsum)[32] = sm->wsum;
    const int nr = ga.nr, E = ga.E;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int x = tid; x < E; x += NT) cnt[x] = 0;
    __syncthreads();
    /* count routes per expert; pos = rank of the route among its expert's routes */
    int ex[PQ], pos[PQ];
#pragma unroll
    for (int q = 0; q < PQ; q++) {
        const int r = tid + q * NT;
        ex[q] = -1; pos[q] = 0;
        if (r < nr) {
            const int v = ga.idx[r] - ga.e0; /* local expert id */
            if (v >= 0 && v < E) { ex[q] = v; pos[q] = atomicAdd(&cnt[v], 1); }
        }
    }
    __syncthreads();
    /* exclusive scans of counts (slot offsets) and jobs per expert (job offsets) */
    const int per = (E + NT - 1) / NT, b0 = tid * per;
    int sc = 0, sj = 0;
    for (int i = 0; i < per; i++) {
        const int x = b0 + i;
        if (x < E) { sc += cnt[x]; sj += (cnt[x] + MOE_CH - 1) / MOE_CH; }
    }
    int ic = sc, ij = sj;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xFFFFFFFFu, ic, o), b = __shfl_up_sync(0xFFFFFFFFu, ij, o);
        if (lane >= o) { ic += a; ij += b; }
    }
    if (lane == 31) { wsum[0][warp] = ic; wsum[1][warp] = ij; }
    __syncthreads();
    if (warp == 0) {
        int a = lane < NW ? wsum[0][lane] : 0, b = lane < NW ? wsum[1][lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xFFFFFFFFu, a, o), v = __shfl_up_sync(0xFFFFFFFFu, b, o);
            if (lane >= o) { a += u; b += v; }
        }
        wsum[0][lane] = a; wsum[1][lane] = b;
    }
    __syncthreads();
    int c0 = (warp ? wsum[0][warp - 1] : 0) + ic - sc, j0 = (warp ? wsum[1][warp - 1] : 0) + ij - sj;
    for (int i = 0; i < per; i++) {
        const int x = b0 + i;
        if (x < E) { off[x] = c0; joff[x] = j0; c0 += cnt[x]; j0 += (cnt[x] + MOE_CH - 1) / MOE_CH; }
    }
    if (tid == 0) *ga.njobs = wsum[1][NW - 1];
    __syncthreads();
    /* slots: expert-major; route -> slot and slot -> route */
#pragma unroll
    for (int q = 0; q < PQ; q++) {
        const int r = tid + q * NT;
        if (r < nr) {
            if (ex[q] >= 0) {
                const int s = off[ex[q]] + pos[q];
                ga.route_slot[r] = s;
                ga.slot_route[s] = r;
                ga.jobt[joff[ex[q]] + pos[q] / MOE_CH].row[pos[q] % MOE_CH] = (unsigned short)(r / ga.K); /* its input row */
            } else {
                ga.route_slot[r] = -1;
            }
        }
    }
    for (int x = tid; x < E; x += NT) {
        const int c = cnt[x];
        for (int j = 0; j * MOE_CH < c; j++)
            ga.jobs[joff[x] + j] = make_int4(x, off[x] + j * MOE_CH, min(MOE_CH, c - j * MOE_CH), 0);
    }
    /* the queue schedule's job table (its rows written with the slots above) and counters */
    if (tid == 0) *ga.qctr = 0;
    for (int x = tid; x < E; x += NT) {
        const int c = cnt[x];
        if (!c) continue;
        const moe_desc d = ga.desc[x];
        for (int j = 0; j * MOE_CH < c; j++) {
            moe_jobt *t = ga.jobt + joff[x] + j;
            t->w[0] = d.w[0]; t->w[1] = d.w[1]; t->s[0] = d.s[0]; t->s[1] = d.s[1];
            t->mul[0] = d.mul[0]; t->mul[1] = d.mul[1];
            t->s0 = off[x] + j * MOE_CH;
            t->cnt = min(MOE_CH, c - j * MOE_CH);
            ga.done1[joff[x] + j] = 0;
        }
    }
}

/* h1's e4m3 image for the queue schedule (MOE_F_MX8, common.cuh sm_x8_img) from rows x [n, kin]
 * (kin % 32 == 0), each value rounded to MXFP4 first (idempotent): block b of nb blocks of NT
 * threads, a thread an 8-value chunk, the 4 chunks of a 32-block in consecutive lanes. */
template <int NT>
__device__ __forceinline__ void moe_x8_img_rows(const uint16_t *x, int n, int kin, const sm_x8_img &img, int b, int nb) {
    const int cpr = kin / 8;
    const long long total = (long long)n * cpr;
    for (long long c = (long long)b * NT + threadIdx.x; c < total; c += (long long)nb * NT) {
        const int row = (int)(c / cpr), k0 = (int)(c - (long long)row * cpr) * 8;
        float v[8];
        sm_unpack8_bf(__ldg((const uint4 *)(x + (size_t)row * kin + k0)), v);
        sm_mx_round8(v, img.codes + (size_t)row * img.kp, img.fac + (size_t)row * (img.kp / 32), k0);
    }
}

/* ---- host side (group.cu) ---- */
/* The grouping arguments of a forward call of n rows into workspace ws (e0 = 0: the layer's
 * experts are ids [0, E); a rank's forward sets e0 to its first global expert). */
moe_group_args moe_group_make(const sm_cuda_moe_layer *L, const int *idx, int n, const sm_cuda_moe_ws *ws);
/* The stock launch: one block of MOE_GROUP_THREADS on st (and, with ga.h1, the blocks that
 * make h1's image). */
int moe_group_launch(const moe_group_args &ga, cudaStream_t st, sm_err *e);

#endif
