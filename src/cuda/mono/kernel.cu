/* mono/kernel.cu: the persistent kernel of the monokernel (mono.cuh): one 512-thread block per
 * SM runs a range of phases of one layer, calling the stock kernels' device bodies with the
 * stock decomposition, a bounded grid barrier between phases.
 *
 * Thread roles per phase: teams (common.cuh sm_team) of 128 (attention items), 256 (router
 * GEMV, expert stages, combine) or sm_norm_threads(width) (norm rows); the wgmma matmuls keep
 * the stock roles (threads 0..255 consume, thread 256 produces, the rest wait at the next
 * barrier).  The wgmma ring (mbarriers + stages in shared memory) is set up once per launch and
 * its position carried from one matmul phase to the next.  Before its arrival every thread
 * fences its global writes towards the async proxy (the next phase may read them by TMA).
 * We rejected a block of 384 threads (the stock wgmma block): the norms need 512-thread teams
 * at H = 8192 to give the stock bits, and the attention and expert phases run 4 / 2 items a
 * block at 512.
 */
#include "cuda/mono/mono.cuh"
#include "cuda/ops/attention.cuh"
#include "cuda/ops/norm.cuh"
#include "cuda/ops/router.cuh"

static_assert(sizeof(mono_prog) <= 32000, "the program is a kernel parameter (at most 32764 bytes on sm_90)");

const char *const mono_phase_name[MP_N] = {
    "attention", "attention split sum", "o_proj", "post-attention boundary", "router", "top-k", "pooler",
    "pre-expert norm | top-k + grouping", "experts gate_up", "experts down", "expert combine", "unpooler", "post-FFN boundary",
    "next layer qkvg projection", "next layer qk norm / rope / kv insert"};

/* Grid barrier number k (1, 2, ... within the launch) before phase `phase` of layer `layer`
 * (every thread calls it): 1 when every block has arrived, 0 when this block must leave (a
 * wait timed out here or anywhere).  The arrival count only grows within a launch (barrier k
 * is passed at k * grid arrivals: one release-add a block, acquire polls, no read-modify-write
 * round trip on the wait path); mono_exit resets it for the next launch. */
__device__ __noinline__ int mono_grid_sync(mono_ctl *ctl, int layer, int phase, unsigned k, int *flag) {
    asm volatile("fence.proxy.async.global;" ::: "memory"); /* our writes, for TMA readers */
    __syncthreads();
    if (threadIdx.x == 0) {
        int ok = 1;
        if (ctl->fault_layer == layer && ctl->fault_phase == phase && blockIdx.x == 1) {
            ok = 0; /* test hook: this block stops arriving */
        } else {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&ctl->count) : "memory");
            const unsigned target = k * gridDim.x;
            if (sm_ld_acquire_gpu_u32(&ctl->count) < target) {
                const unsigned long long t0 = sm_now_ns(), bound = ctl->bound_ns;
                while (sm_ld_acquire_gpu_u32(&ctl->count) < target) {
                    if (*(volatile unsigned *)&ctl->abort) { ok = 0; break; }
                    if (sm_now_ns() - t0 > bound) {
                        if (atomicCAS(&ctl->health[0], 0u, 1u) == 0u) {
                            ctl->health[1] = (unsigned)layer;
                            ctl->health[2] = (unsigned)phase;
                            ctl->health[3] = blockIdx.x;
                        }
                        atomicExch(&ctl->abort, 1u);
                        ok = 0;
                        break;
                    }
                }
            }
        }
        *flag = ok;
    }
    __syncthreads();
    return *flag;
}

/* Every block at the end of a launch: the last one out zeroes the arrival count (the next
 * launch on the stream starts after this one has ended). */
__device__ __forceinline__ void mono_exit(mono_ctl *ctl) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned old = atomicAdd(&ctl->gen, 1u);
        if (old == gridDim.x - 1) {
            ctl->count = 0;
            ctl->gen = 0;
        }
    }
}

/* ---- phases ----
 * The descriptor is the kernel's __grid_constant__ parameter (constant bank, as the stock
 * kernels' arguments).  The expert stages, the combine and the matmuls are inlined, so their
 * arguments stay constant-bank operands (the expert stage sits at the stock kernel's 128
 * registers); the other phases are functions of their own, so their registers do not add to
 * the kernel's. */

template <int G>
__device__ __noinline__ void mono_att(const mono_desc &d, uint8_t *dyn) {
    const int k = threadIdx.x >> 7; /* team of 128: one tile item at a time */
    const sm_team t = sm_team_slice(k, SM_ATT_THREADS);
    sm_att_tile_smem *sh = (sm_att_tile_smem *)dyn + k;
    const int nr = (d.n + 64 / G - 1) / (64 / G) * d.nkv, items = nr * d.nsplit;
    for (int v = blockIdx.x * 4 + k; v < items; v += gridDim.x * 4) {
        /* the stock grid: x = tile * nkv + KV head, y = split */
        const int split = v / nr, rem = v - split * nr, tile = rem / d.nkv, h = rem - tile * d.nkv;
        sm_att_tile_item<G>(d.q, d.ldq, d.gate, d.ldq, d.kv, d.tables, d.max_bpr, d.rreq, d.pos, d.n, d.nh, d.nkv,
                            d.window, d.scale, d.eps, d.att, d.wsO, d.wsM, d.wsL, tile, h, split, d.nsplit, d.chunk, *sh, t);
    }
}

__device__ __noinline__ void mono_att_sum(const mono_desc &d) {
    const int nw = MONO_THREADS / 32;
    for (int id = blockIdx.x * nw + (threadIdx.x >> 5); id < d.n * d.nh; id += gridDim.x * nw)
        sm_att_combine_item(d.wsO, d.wsM, d.wsL, d.nsplit, d.n, d.nh, d.gate, d.ldq, d.eps, d.att, id);
}

/* One matmul over the stock stream-K split (G = min(grid, units) virtual blocks); inlined:
 * a wgmma pipeline must not cross a function call. */
template <int N>
__device__ __forceinline__ void mono_mm_phase(const mono_mm *mm, const sm_wg_smem &sm, int &rs, unsigned &rph) {
    const sm_wg_args a = mm->a;
    const int G = (int)gridDim.x < a.units ? (int)gridDim.x : a.units, b = blockIdx.x;
    if (b >= G) return;
    const int u0 = sm_wg_unit0(b, G, a.units), u1 = sm_wg_unit0(b + 1, G, a.units);
    if (threadIdx.x < 256) {
        sm_wg_consume_mm<N, 1>(a, b, G, u0, u1, sm, rs, rph);
    } else if (threadIdx.x == 256) {
        asm volatile("fence.proxy.async.global;" ::: "memory");
        sm_wg_produce<N, 1>(&mm->tw, &mm->tx, a.ki, u0, u1, SM_WG_ST(N, 1), sm, rs, rph);
    }
}

/* Norm rows: teams of sm_norm_threads(width), rows dealt over blocks [0, nblk). */
__device__ __forceinline__ int mono_norm_team(int width, int *k, sm_team *t) {
    const int T = sm_norm_threads(width), per = MONO_THREADS / T;
    *k = threadIdx.x / T;
    *t = sm_team_slice(*k, T);
    return per;
}

__device__ __noinline__ void mono_post_att(const mono_desc &d, float (*red)[32]) {
    int k;
    sm_team t;
    const int per = mono_norm_team(d.H, &k, &t);
    for (int row = blockIdx.x * per + k; row < d.n; row += gridDim.x * per)
        sm_norm_post_attn_row(d.s, d.a, d.att_alpha, d.att_beta, d.pre_ffn, d.H, d.post_eps, d.eps, d.xf, (size_t)row,
                              red[k], t);
}

template <int NT>
__device__ __noinline__ void mono_router(const mono_desc &d, uint8_t *dyn) {
    const int k = threadIdx.x >> 8;
    const sm_team t = sm_team_slice(k, 256);
    float4(*xs)[SM_RG_KL / 4] = (float4(*)[SM_RG_KL / 4])(dyn + (size_t)k * NT * SM_RG_KL * 4);
    const int gx = (d.E + SM_RG_ROWS - 1) / SM_RG_ROWS, gy = (d.n + NT - 1) / NT, items = gx * gy * d.rS;
    for (int v = blockIdx.x * 2 + k; v < items; v += gridDim.x * 2) {
        const int bx = v % gx, by = (v / gx) % gy, bz = v / (gx * gy);
        sm_mm_f32w_gemv_block<NT>(d.xf, d.n, d.H, d.router, d.E, d.rpart, bx, by, bz, xs, t);
        sm_team_sync(t); /* xs is rewritten by the team's next item */
    }
}

/* Top-K of every row by the calling block (a warp a row), from the summed logits. */
__device__ __forceinline__ void mono_topk(const mono_desc &d, uint8_t *dyn) {
    const int warp = threadIdx.x >> 5, nw = MONO_THREADS / 32;
    for (int row = warp; row < d.n; row += nw) {
        sm_route_topk_row(d.rlog, d.rbias, d.E, d.K, d.m_o, d.route_scale, d.idx, d.w, row,
                          (float *)dyn + (size_t)warp * 2 * d.E);
    }
}

__device__ __noinline__ void mono_pre_norm(const mono_desc &d, uint8_t *dyn, float (*red)[32]) {
    if (blockIdx.x == gridDim.x - 1) {
        /* the last block: top-K of every row, then the grouping of the routes by expert (the
         * other blocks norm the pooled rows meanwhile) */
        mono_topk(d, dyn);
        __syncthreads(); /* idx complete (block-visible), smem free */
        moe_group<MONO_THREADS>(d.ga, (moe_group_smem *)dyn);
        return;
    }
    int k;
    sm_team t;
    const int per = mono_norm_team(d.Hm, &k, &t), nblk = gridDim.x - 1;
    for (int row = blockIdx.x * per + k; row < d.n; row += nblk * per)
        sm_norm_rms_bf16_row(d.h1, d.Hm, d.pre_expert, d.eps, d.h1, (size_t)row, red[k], t);
}

__device__ __noinline__ void mono_post_ffn(const mono_desc &d, float (*red)[32]) {
    int k;
    sm_team t;
    const int per = mono_norm_team(d.H, &k, &t);
    for (int row = blockIdx.x * per + k; row < d.n; row += gridDim.x * per)
        sm_norm_post_ffn_row(d.s, d.f, d.post_ffn, d.ffn_alpha, d.ffn_beta, d.next_norm, 0, d.H, d.post_eps, d.eps, d.x,
                             (size_t)row, red[k], t);
}

__device__ __noinline__ void mono_rope(const mono_desc &d) {
    const int nw = MONO_THREADS / 32, heads = d.nh + 2 * d.nkv, QD = d.nh * 64, KD = d.nkv * 64;
    const sm_rope_tab tab = d.tab;
    for (int it = blockIdx.x * nw + (threadIdx.x >> 5); it < d.n * heads; it += gridDim.x * nw) {
        const int row = it / heads, hh = it - row * heads;
        sm_rope_kv_head(d.nq, d.ldq, d.nq + QD, d.nq + QD + KD, d.ldq, d.nh, d.nkv, d.pos, d.slot, d.rope, tab, d.eps,
                        d.nq, d.ldq, d.nkvc, d.nslots, (size_t)row, hh);
    }
}

/* ---- the kernels ---- */

/* Phase p of layer descriptor d (a dense phase: not the experts). */
template <int N>
__device__ __forceinline__ void mono_phase(const mono_desc &d, int p, uint8_t *dyn, const sm_wg_smem &sm, int &rs, unsigned &rph,
                                           float (*red)[32]) {
    switch (p) {
    case MP_ATT:
        if (d.G == 8) mono_att<8>(d, dyn);
        else mono_att<2>(d, dyn);
        break;
    case MP_ATT_SUM: mono_att_sum(d); break;
    case MP_OPROJ: mono_mm_phase<N>(&d.mm[0], sm, rs, rph); break;
    case MP_POST_ATT: mono_post_att(d, red); break;
    case MP_ROUTER:
        if (d.rnt == 8) mono_router<8>(d, dyn);
        else mono_router<16>(d, dyn);
        break;
    case MP_POOLER:
        /* the matmul's idle warps (9..15) sum the router's k splits meanwhile, in split order
         * (sm_mm_reduce_f32_range: the stock reduce's arithmetic) */
        if (threadIdx.x >= 288) {
            const size_t nt = MONO_THREADS - 288;
            sm_mm_reduce_f32_range(d.rpart, d.rS, (size_t)d.n * d.E, d.rlog, blockIdx.x * nt + (threadIdx.x - 288), gridDim.x * nt);
        }
        mono_mm_phase<N>(&d.mm[1], sm, rs, rph);
        break;
    case MP_PRE_NORM: mono_pre_norm(d, dyn, red); break;
    case MP_COMBINE: /* team 0 (the stock combine's 256 threads: its bits); 1 row a block */
        if (threadIdx.x < MOE_COMBINE_THREADS)
            moe_combine_rows(d.ca, blockIdx.x, gridDim.x, (float *)dyn, red[0], sm_team_slice(0, MOE_COMBINE_THREADS));
        break;
    case MP_UNPOOL: mono_mm_phase<N>(&d.mm[2], sm, rs, rph); break;
    case MP_POST_FFN: mono_post_ffn(d, red); break;
    case MP_QKVG: mono_mm_phase<N>(&d.mm[3], sm, rs, rph); break;
    case MP_ROPE: mono_rope(d); break;
    default: break;
    }
}

/* Trace slot of (layer, block, phase) (ctl->trace_blocks blocks a layer), or NULL. */
__device__ __forceinline__ unsigned long long *mono_tr(const mono_ctl *ctl, int layer, int p) {
    unsigned long long *t = ctl->trace;
    return t ? t + (((size_t)(layer % MONO_TRACE_MAX) * ctl->trace_blocks + blockIdx.x) * MP_N + p) * 2 : NULL;
}

/* The dense kernel: segment 0 (phases [p0[0], p1[0]) of d[0]), then segment 1 (of d[1]),
 * a grid barrier between consecutive phases. */
template <int N>
__global__ void __launch_bounds__(MONO_THREADS, 1) mono_kernel(const __grid_constant__ mono_prog P) {
    constexpr int ST = SM_WG_ST(N, 1);
    extern __shared__ uint8_t mono_dyn[];
    __shared__ __align__(8) uint64_t full_bar[ST], empty_bar[ST];
    __shared__ int last_s, flag_s;
    __shared__ float red_s[4][32];
    mono_ctl *ctl = P.d[0].ctl;
    if (*(volatile unsigned *)&ctl->abort) return; /* an earlier launch of the step timed out */
    uint8_t *dyn = (uint8_t *)(((uintptr_t)mono_dyn + 1023) & ~(uintptr_t)1023);
    sm_wg_smem sm;
    sm.base = sm_wg_u32(dyn);
    sm.full = sm_wg_u32(full_bar);
    sm.empty = sm_wg_u32(empty_bar);
    sm.last = &last_s;
    if (threadIdx.x == 0) sm_wg_ring_init<ST>(sm);
    __syncthreads();
    int rs = 0;       /* ring position, carried across the matmul phases (each role its own copy) */
    unsigned rph = 0;
    unsigned nbar = 0; /* barriers passed in this launch */
    int first = 1;
    for (int g = 0; g < P.nseg; g++) {
        const mono_desc &d = P.d[g];
        for (int p = P.p0[g]; p < P.p1[g]; p++) {
            if ((p == MP_ATT_SUM && d.nsplit == 1) || p == MP_TOPK) continue; /* top-K runs in PRE_NORM */
            if (!first && !mono_grid_sync(ctl, d.layer, p, ++nbar, &flag_s)) return;
            first = 0;
            unsigned long long *tr = mono_tr(ctl, d.layer, p);
            if (tr && threadIdx.x == 0) tr[0] = sm_now_ns();
            mono_phase<N>(d, p, dyn, sm, rs, rph, red_s);
            if (tr) {
                __syncthreads();
                if (threadIdx.x == 0) tr[1] = sm_now_ns();
            }
        }
    }
    mono_exit(ctl);
}

/* The expert kernel of one layer: stage 1 | stage 2, the stock expert kernels'
 * blocks (MOE_THREADS threads, 2 an SM, the same body, arguments in the constant bank: the
 * stock register allocation), a grid barrier between the phases. */
template <int F>
__global__ void __launch_bounds__(MOE_THREADS, 2) mono_moe_kernel(const __grid_constant__ mono_moe P) {
    extern __shared__ uint4 moe_dyn[];
    __shared__ int flag_s;
    mono_ctl *ctl = P.ctl;
    if (*(volatile unsigned *)&ctl->abort) return;
    const sm_team t = sm_team_block();
    for (int p = MP_MM1; p <= MP_MM2; p++) {
        if (p > MP_MM1 && !mono_grid_sync(ctl, P.layer, p, (unsigned)(p - MP_MM1), &flag_s)) return;
        unsigned long long *tr = mono_tr(ctl, P.layer, p);
        if (tr && threadIdx.x == 0) tr[0] = sm_now_ns();
        if (p == MP_MM1) moe_mm_block<F, 1, 1>(P.a1, blockIdx.x, gridDim.x, moe_dyn, t); /* h1: an earlier launch's */
        else moe_mm_block<F, 2, 0>(P.a2, blockIdx.x, gridDim.x, moe_dyn, t);
        if (tr) {
            __syncthreads();
            if (threadIdx.x == 0) tr[1] = sm_now_ns();
        }
    }
    mono_exit(ctl);
}

/* ---- host side ---- */

size_t mono_smem_bytes(int N, int G, int Hm, int I, int E) {
    size_t b = SM_WG_SMEM(N, 1);                                           /* the wgmma ring */
    const size_t att = 4 * sizeof(sm_att_tile_smem);                       /* 4 attention teams */
    const size_t rt = (size_t)2 * 16 * SM_RG_KL * 4;                         /* router x tiles */
    const size_t tk = (size_t)(MONO_THREADS / 32) * 2 * E * 4;              /* top-k scratch */
    const size_t gr = sizeof(moe_group_smem);
    const size_t cb = (size_t)Hm * 4;                                       /* combine sums (team 0) */
    const size_t o[5] = {att, rt, tk, gr, cb};
    (void)I; (void)G; /* the attention scratch no longer depends on G */
    for (int i = 0; i < 5; i++) if (o[i] > b) b = o[i];
    return b + 1024;                                                        /* 1024-byte alignment */
}

/* A cooperative launch: the driver refuses a grid that cannot be co-resident. */
template <typename T>
static int mono_coop(void (*k)(T), const T &arg, int grid, int threads, size_t smem, cudaStream_t st, sm_err *e) {
    SM_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    SM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, arg));
    return 0;
}

int mono_launch(int N, const mono_prog &P, int grid, size_t smem, cudaStream_t st, sm_err *e) {
    switch (N) {
    case 8: return mono_coop(mono_kernel<8>, P, grid, MONO_THREADS, smem, st, e);
    case 16: return mono_coop(mono_kernel<16>, P, grid, MONO_THREADS, smem, st, e);
    case 32: return mono_coop(mono_kernel<32>, P, grid, MONO_THREADS, smem, st, e);
    case 64: return mono_coop(mono_kernel<64>, P, grid, MONO_THREADS, smem, st, e);
    case 128: return mono_coop(mono_kernel<128>, P, grid, MONO_THREADS, smem, st, e);
    default: return sm_errf(e, "monokernel: no build for a token box of %d rows", N);
    }
}

size_t mono_moe_smem(const mono_moe &P) {
    const size_t a = (size_t)P.a1.Kp * 16, b = (size_t)P.a2.Kp * 16;
    return a > b ? a : b;
}

int mono_moe_launch(int fmt, const mono_moe &P, int grid, cudaStream_t st, sm_err *e) {
    const size_t smem = mono_moe_smem(P);
    switch (fmt) {
    case SM_EXP_MXFP4: return mono_coop(mono_moe_kernel<SM_EXP_MXFP4>, P, grid, MOE_THREADS, smem, st, e);
    case SM_EXP_FP8: return mono_coop(mono_moe_kernel<SM_EXP_FP8>, P, grid, MOE_THREADS, smem, st, e);
    case SM_EXP_BF16: return mono_coop(mono_moe_kernel<SM_EXP_BF16>, P, grid, MOE_THREADS, smem, st, e);
    default: return sm_errf(e, "monokernel: expert format %d has no build", fmt);
    }
}

int mono_moe_occupancy(const mono_moe &P, int *b, sm_err *e) {
    const size_t smem = mono_moe_smem(P);
    *b = 0;
    int o[3];
    void (*k[3])(mono_moe) = {mono_moe_kernel<SM_EXP_MXFP4>, mono_moe_kernel<SM_EXP_FP8>, mono_moe_kernel<SM_EXP_BF16>};
    for (int i = 0; i < 3; i++) {
        SM_CUDA_CHECK(cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        SM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[i], k[i], MOE_THREADS, smem));
    }
    *b = o[0] < o[1] ? (o[0] < o[2] ? o[0] : o[2]) : (o[1] < o[2] ? o[1] : o[2]);
    return 0;
}

template <int N>
static int mono_occ_n(size_t smem, int *b, sm_err *e) {
    SM_CUDA_CHECK(cudaFuncSetAttribute(mono_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    SM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(b, mono_kernel<N>, MONO_THREADS, smem));
    return 0;
}

int mono_occupancy(int N, size_t smem, int *b, sm_err *e) {
    *b = 0;
    switch (N) {
    case 8: return mono_occ_n<8>(smem, b, e);
    case 16: return mono_occ_n<16>(smem, b, e);
    case 32: return mono_occ_n<32>(smem, b, e);
    case 64: return mono_occ_n<64>(smem, b, e);
    case 128: return mono_occ_n<128>(smem, b, e);
    default: return sm_errf(e, "monokernel: no build for a token box of %d rows", N);
    }
}
