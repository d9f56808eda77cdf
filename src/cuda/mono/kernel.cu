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
    "attention", "attention split sum", "o_proj", "post-attention boundary", "router", "route rows (split sum, top-k)", "pooler",
    "pre-expert norm | grouping", "experts gate_up + down (queue)", "experts down (in the queue)", "expert sum (TP y)", "expert combine scales",
    "expert combine sums", "expert sum (EP m)", "unpooler", "post-FFN boundary", "next layer qkvg projection", "next layer qk norm / rope / kv insert",
    "wait attn_sum", "wait pooled_gather", "wait expert_sum", "wait unpooled_gather"};

/* Where a block stands: its rank in the launch and its index among that rank's G blocks. */
typedef struct mono_blk {
    int b, G;                   /* block b of the rank's G */
    int rank;                   /* index of the rank in the launch (0 for one rank) */
} mono_blk;

__device__ __forceinline__ mono_blk mono_where(int nrank) {
    mono_blk B;
    B.G = (int)gridDim.x / nrank;
    B.rank = (int)blockIdx.x / B.G;
    B.b = (int)blockIdx.x - B.rank * B.G;
    return B;
}

/* Trace slot of (layer, block, phase) (ctl->trace_blocks blocks a layer), or NULL. */
__device__ __forceinline__ unsigned long long *mono_tr(const mono_ctl *ctl, int layer, int p, const mono_blk &B) {
    unsigned long long *t = ctl->trace;
    return t ? t + (((size_t)(layer % MONO_TRACE_MAX) * ctl->trace_blocks + B.b) * MP_N + p) * 2 : NULL;
}

/* A wait of block b ran past the bound in (layer, phase): the first such record into the health
 * words (peer + 1 of a cross-rank wait, 0 of a wait inside the rank), then every block leaves
 * at its next barrier. */
__device__ __forceinline__ void mono_fail(mono_ctl *ctl, int layer, int phase, int b, unsigned peer) {
    if (atomicCAS(&ctl->health[0], 0u, 1u) == 0u) {
        ctl->health[1] = (unsigned)layer;
        ctl->health[2] = (unsigned)phase;
        ctl->health[3] = (unsigned)b;
        ctl->health[4] = peer;
    }
    atomicExch(&ctl->abort, 1u);
}

/* Grid barrier number k (1, 2, ... within the launch) before phase `phase` of layer `layer`
 * (every thread calls it): 1 when every block has arrived, 0 when this block must leave (a
 * wait timed out here or anywhere).  The arrival count only grows within a launch (barrier k
 * is passed at k * grid arrivals: one release-add a block, acquire polls, no read-modify-write
 * round trip on the wait path); mono_exit resets it for the next launch. */
__device__ __noinline__ int mono_grid_sync(mono_ctl *ctl, int layer, int phase, unsigned k, const mono_blk &B, int *flag) {
    asm volatile("fence.proxy.async.global;" ::: "memory"); /* our writes, for TMA readers */
    __syncthreads();
    if (threadIdx.x == 0) {
        int ok = 1;
        if (ctl->fault_layer == layer && ctl->fault_phase == phase && B.b == 1) {
            ok = 0; /* test hook: this block stops arriving */
        } else {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&ctl->count) : "memory");
            const unsigned target = k * (unsigned)B.G;
            if (sm_ld_acquire_gpu_u32(&ctl->count) < target) {
                const unsigned long long t0 = sm_now_ns(), bound = ctl->bound_ns;
                while (sm_ld_acquire_gpu_u32(&ctl->count) < target) {
                    if (*(volatile unsigned *)&ctl->abort) { ok = 0; break; }
                    if (sm_now_ns() - t0 > bound) {
                        mono_fail(ctl, layer, phase, B.b, 0u);
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
__device__ __forceinline__ void mono_exit(mono_ctl *ctl, const mono_blk &B) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned old = atomicAdd(&ctl->gen, 1u);
        if (old == (unsigned)B.G - 1) {
            ctl->count = 0;
            ctl->gen = 0;
            ctl->xrows = 0;
        }
    }
}

/* ---- the exchanges (W > 1) ---- */

/* Exchange k of layer d.layer at the start of its consuming phase (every thread calls
 * it, after the grid barrier that ended the producing phase): block 0 releases the epoch into
 * flag `rank` of every rank when `publish` (the producer ran in this launch), then thread 0 of
 * every block waits until the W flags of this rank hold it.  1: the parts may be read; 0: a
 * wait ran out (recorded) or the rank aborted: leave. */
__device__ __noinline__ int mono_xchg(const mono_desc &d, int k, int publish, const mono_blk &B, int *flag) {
    const mono_xc &x = d.xc;
    mono_ctl *ctl = d.ctl;
    if (threadIdx.x == 0) {
        const unsigned long long ep = *(volatile const unsigned long long *)x.step * 4096ull + 4ull * (unsigned)d.layer + (unsigned)k + 1ull;
        unsigned long long *tr = ctl->trace ? ctl->trace + (((size_t)(d.layer % MONO_TRACE_MAX) * ctl->trace_blocks + B.b) * MP_N + MP_XW0 + k) * 2 : NULL;
        const unsigned long long t0 = sm_now_ns();
        if (tr) tr[0] = t0;
        if (publish && B.b == 0) {
            __threadfence_system(); /* the rank's parts (every block's, ordered by the grid barrier) before the flags */
            for (int q = 0; q < x.W; q++) sm_st_release_sys_u64((uint64_t *)x.flag[q] + x.rank, (uint64_t)ep);
        }
        int ok = 1;
        const uint64_t *mine = (const uint64_t *)x.flag[x.rank];
        for (int q = 0; q < x.W && ok; q++) {
            while (sm_ld_acquire_sys_u64(mine + q) < (uint64_t)ep) {
                if (*(volatile unsigned *)&ctl->abort) { ok = 0; break; }
                if (sm_now_ns() - t0 > ctl->bound_ns) {
                    mono_fail(ctl, d.layer, MP_XW0 + k, B.b, (unsigned)q + 1u);
                    ok = 0;
                    break;
                }
                __nanosleep(64);
            }
        }
        if (tr) tr[1] = sm_now_ns();
        *flag = ok;
    }
    __syncthreads();
    return *flag;
}

/* Exchange read by phase p (-1: none). */
__device__ __forceinline__ int mono_xop(const mono_desc &d, int p) {
    if (d.xc.W <= 1) return -1;
    switch (p) {
    case MP_POST_ATT: return 0;
    case MP_PRE_NORM: return 1;
    case MP_XSUM_Y:
    case MP_XSUM_M: return 2;
    case MP_POST_FFN: return 3;
    default: return -1;
    }
}

/* Part of rank q of exchange k (parity k & 1). */
__device__ __forceinline__ const uint8_t *mono_part(const mono_xc &x, int q, int k) { return x.buf[q] + (size_t)(k & 1) * x.bytes; }

/* Elements [i0 + i, i0 + count) step `step` (i, step in units of 4 elements when the range
 * allows 16-byte loads, else of 1) of exchange k's f32 parts: out = r16(part_0 + part_1 + ...)
 * in rank order (BF) or the f32 sum (the gcomm finish kernels' arithmetic). */
template <int BF>
__device__ __forceinline__ void mono_xsum(const mono_xc &x, int k, size_t i0, size_t count, size_t i, size_t step, void *out) {
    if (count % 4 == 0 && i0 % 4 == 0) {
        for (i *= 4; i < count; i += step * 4) {
            float4 v = __ldcg((const float4 *)((const float *)mono_part(x, 0, k) + i0 + i));
            for (int q = 1; q < x.W; q++) {
                const float4 u = __ldcg((const float4 *)((const float *)mono_part(x, q, k) + i0 + i));
                v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
            }
            if (BF) {
                uint2 o;
                o.x = (uint32_t)sm_tobf(v.x) | ((uint32_t)sm_tobf(v.y) << 16);
                o.y = (uint32_t)sm_tobf(v.z) | ((uint32_t)sm_tobf(v.w) << 16);
                *(uint2 *)((uint16_t *)out + i0 + i) = o;
            } else {
                *(float4 *)((float *)out + i0 + i) = v;
            }
        }
        return;
    }
    for (; i < count; i += step) {
        float v = __ldcg((const float *)mono_part(x, 0, k) + i0 + i);
        for (int q = 1; q < x.W; q++) v += __ldcg((const float *)mono_part(x, q, k) + i0 + i);
        if (BF) ((uint16_t *)out)[i0 + i] = sm_tobf(v);
        else ((float *)out)[i0 + i] = v;
    }
}

/* Row `row` of a column gather: out[row, q cols + c] = rank q's part[row, c] (bf16), team t
 * (16-byte moves when the widths allow). */
__device__ __forceinline__ void mono_xgather(const mono_xc &x, int k, int row, int cols, uint16_t *out, int ld, const sm_team &t) {
    const int vec = cols % 8 == 0 && ld % 8 == 0;
    for (int q = 0; q < x.W; q++) {
        const unsigned short *src = (const unsigned short *)mono_part(x, q, k) + (size_t)row * cols;
        uint16_t *dst = out + (size_t)row * ld + (size_t)q * cols;
        if (vec) {
            for (int c = t.tid; c < cols / 8; c += t.nt) ((uint4 *)dst)[c] = __ldcg((const uint4 *)src + c);
        } else {
            for (int c = t.tid; c < cols; c += t.nt) dst[c] = __ldcg(src + c);
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
__device__ __noinline__ void mono_att(const mono_desc &d, uint8_t *dyn, const mono_blk &B) {
    const int k = threadIdx.x >> 7; /* team of 128: one tile item at a time */
    const sm_team t = sm_team_slice(k, SM_ATT_THREADS);
    sm_att_tile_smem *sh = (sm_att_tile_smem *)dyn + k;
    const int nr = (d.n + 64 / G - 1) / (64 / G) * d.nkv, items = nr * d.nsplit;
    for (int v = B.b * 4 + k; v < items; v += B.G * 4) {
        /* the stock grid: x = tile * nkv + KV head, y = split */
        const int split = v / nr, rem = v - split * nr, tile = rem / d.nkv, h = rem - tile * d.nkv;
        sm_att_tile_item<G>(d.q, d.ldq, d.gate, d.ldq, d.kv, d.tables, d.max_bpr, d.rreq, d.pos, d.n, d.nh, d.nkv,
                            d.window, d.scale, d.eps, d.att, d.wsO, d.wsM, d.wsL, tile, h, split, d.nsplit, d.chunk, *sh, t);
    }
}

__device__ __noinline__ void mono_att_sum(const mono_desc &d, const mono_blk &B) {
    const int nw = MONO_THREADS / 32;
    for (int id = B.b * nw + (threadIdx.x >> 5); id < d.n * d.nh; id += B.G * nw)
        sm_att_combine_item(d.wsO, d.wsM, d.wsL, d.nsplit, d.n, d.nh, d.gate, d.ldq, d.eps, d.att, id);
}

/* One matmul over the stock stream-K split (G = min(the rank's blocks, units) virtual blocks);
 * inlined: a wgmma pipeline must not cross a function call.  y32 set: the f32 epilogue (a
 * rank's partial sum). */
template <int N>
__device__ __forceinline__ void mono_mm_phase(const mono_mm *mm, const sm_wg_smem &sm, int &rs, unsigned &rph, const mono_blk &B) {
    const sm_wg_args a = mm->a;
    const int G = B.G < a.units ? B.G : a.units, b = B.b;
    if (b >= G) return;
    const int u0 = sm_wg_unit0(b, G, a.units), u1 = sm_wg_unit0(b + 1, G, a.units);
    if (threadIdx.x < 256) {
        if (a.y32) sm_wg_consume_mm<N, 1, SM_WG_EPI_MM32>(a, b, G, u0, u1, sm, rs, rph);
        else sm_wg_consume_mm<N, 1>(a, b, G, u0, u1, sm, rs, rph);
    } else if (threadIdx.x == 256) {
        asm volatile("fence.proxy.async.global;" ::: "memory");
        sm_wg_produce<N, 1>(&mm->tw, &mm->tx, a.ki, u0, u1, SM_WG_ST(N, 1), sm, rs, rph);
    }
}

/* Norm rows: teams of sm_norm_threads(width), rows dealt over the rank's blocks. */
__device__ __forceinline__ int mono_norm_team(int width, int *k, sm_team *t) {
    const int T = sm_norm_threads(width), per = MONO_THREADS / T;
    *k = threadIdx.x / T;
    *t = sm_team_slice(*k, T);
    return per;
}

/* The post-attention boundary and the router logits in one phase.  The norm rows are dealt to
 * blocks 0, 1, ... (a team a row); each row written is counted in ctl->xrows (once a launch: the
 * last block out resets it).  The router's GEMV items (2 teams of 256 a block) start on the
 * blocks past the norm rows: each team waits until all n rows of xf are counted (bounded, as a
 * grid barrier), then runs the stock router kernel's items (the same split, hence the same
 * partials).  No grid barrier between the two.  We measured and dropped an L2 prefetch of each
 * team's first W slab before its wait: its traffic slowed the norm rows (bench/results.md). */
template <int NT>
__device__ __noinline__ void mono_post_att_router(const mono_desc &d, uint8_t *dyn, float (*red)[32], const mono_blk &B) {
    int k;
    sm_team t;
    const int per = mono_norm_team(d.H, &k, &t), nrb = min(B.G, (d.n + per - 1) / per);
    for (int row = B.b * per + k; row < d.n; row += B.G * per) {
        if (d.xc.W > 1) { /* a = r16(attn_sum): the W partials of the row in rank order */
            mono_xsum<1>(d.xc, 0, (size_t)row * d.H, (size_t)d.H, (size_t)t.tid, (size_t)t.nt, (void *)d.a);
            sm_team_sync(t);
        }
        sm_norm_post_attn_row(d.s, d.a, d.att_alpha, d.att_beta, d.pre_ffn, d.H, d.post_eps, d.eps, d.xf, (size_t)row,
                              red[k], t);
        __threadfence(); /* the row's xf, then its count */
        sm_team_sync(t);
        if (t.tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&d.ctl->xrows) : "memory");
    }
    __syncthreads(); /* the norm teams' named barriers are free before the router teams take theirs */
    unsigned long long *tr = mono_tr(d.ctl, d.layer, MP_ROUTER, B);
    if (tr && threadIdx.x == 0) tr[0] = sm_now_ns();
    const int kr = threadIdx.x >> 8;
    const sm_team tt = sm_team_slice(kr, 256);
    float4(*xs)[SM_RG_KL / 4] = (float4(*)[SM_RG_KL / 4])(dyn + (size_t)kr * NT * SM_RG_KL * 4);
    const int gx = (d.E + SM_RG_ROWS - 1) / SM_RG_ROWS, gy = (d.n + NT - 1) / NT, items = gx * gy * d.rS;
    const int rb = (B.b + B.G - nrb) % B.G; /* the blocks without a norm row first */
    int v = rb * 2 + kr;
    if (v < items) {
        /* every row of xf counted: thread 0 polls, the team follows */
        if (tt.tid == 0 && sm_ld_acquire_gpu_u32(&d.ctl->xrows) < (unsigned)d.n) {
            const unsigned long long t0 = sm_now_ns();
            while (sm_ld_acquire_gpu_u32(&d.ctl->xrows) < (unsigned)d.n) {
                if (*(volatile unsigned *)&d.ctl->abort) break;
                if (sm_now_ns() - t0 > d.ctl->bound_ns) {
                    mono_fail(d.ctl, d.layer, MP_ROUTER, B.b, 0u);
                    break;
                }
            }
        }
        sm_team_sync(tt);
    }
    for (; v < items; v += B.G * 2) {
        const int bx = v % gx, by = (v / gx) % gy, bz = v / (gx * gy);
        sm_mm_f32w_gemv_block<NT, 4>(d.xf, d.n, d.H, d.router, d.E, d.rpart, bx, by, bz, xs, tt); /* 4 tokens at once: no spills at 128 registers */
        sm_team_sync(tt); /* xs is rewritten by the team's next item */
    }
    if (tr) {
        __syncthreads();
        if (threadIdx.x == 0) tr[1] = sm_now_ns();
    }
}

/* Threads [MONO_RT0, MONO_THREADS) of a block: idle in a matmul phase (the consumers are threads
 * 0..255, the producer thread 256), they route the step's rows meanwhile, on named barrier
 * MONO_RT_BAR. */
#define MONO_RT0 288
#define MONO_RT_BAR 15

/* The rows b, b + G, ... of the step (a row a block): the row's logits, the sum of the router's
 * k splits in split order (sm_mm_reduce_f32_at: the stock split sum's arithmetic), by every
 * routing thread; then its top-K by the first routing warp (scs: float [E] of shared memory
 * outside the wgmma ring).  The block's time in its TOPK trace slot.  We measured and dropped
 * the route grouping here too (by the last of these blocks to finish): under the matmul's
 * weight stream it took longer than the matmul (bench/results.md). */
__device__ __noinline__ void mono_route_rows(const mono_desc &d, float *scs, const mono_blk &B) {
    const int tid = (int)threadIdx.x - MONO_RT0, nt = MONO_THREADS - MONO_RT0;
    if (B.b >= d.n) return;
    unsigned long long *tr = mono_tr(d.ctl, d.layer, MP_TOPK, B);
    if (tr && tid == 0) tr[0] = sm_now_ns();
    const size_t count = (size_t)d.n * d.E;
    for (int row = B.b; row < d.n; row += B.G) {
        for (int x = tid; x < d.E; x += nt) {
            const size_t i = (size_t)row * d.E + x;
            d.rlog[i] = sm_mm_reduce_f32_at(d.rpart, d.rS, count, i);
        }
        asm volatile("bar.sync %0, %1;" ::"n"(MONO_RT_BAR), "n"(MONO_THREADS - MONO_RT0) : "memory"); /* the row's logits written */
        if (tid < 32) sm_route_topk_row(d.rlog, d.rbias, d.E, d.K, d.m_o, d.route_scale, d.idx, d.w, row, scs);
    }
    if (tr && tid == 0) tr[1] = sm_now_ns();
}

__device__ __noinline__ void mono_pre_norm(const mono_desc &d, uint8_t *dyn, float (*red)[32], const mono_blk &B) {
    if (B.b == B.G - 1) {
        /* the last block: the grouping of the routes by expert (their top-K ran in the pooler
         * phase); the other blocks norm the pooled rows meanwhile */
        moe_group<MONO_THREADS>(d.ga, (moe_group_smem *)dyn);
        return;
    }
    int k;
    sm_team t;
    const int per = mono_norm_team(d.Hm, &k, &t), nblk = B.G - 1;
    for (int row = B.b * per + k; row < d.n; row += nblk * per) {
        if (d.xc.W > 1) { /* h1 = pooled_gather: the W column blocks of the row */
            mono_xgather(d.xc, 1, row, d.xc.np, d.h1, d.Hm, t);
            sm_team_sync(t);
        }
        sm_norm_rms_bf16_row(d.h1, d.Hm, d.pre_expert, d.eps, d.h1, (size_t)row, red[k], t, d.h1_mx, d.h1img);
    }
}

/* The rank-order expert sums over every element (all threads of the rank's blocks): TP y (f32,
 * before the combine), EP m (r16, after it). */
__device__ __noinline__ void mono_xsum_phase(const mono_desc &d, int p, const mono_blk &B) {
    const size_t i = (size_t)B.b * MONO_THREADS + threadIdx.x, step = (size_t)B.G * MONO_THREADS;
    if (p == MP_XSUM_Y) mono_xsum<0>(d.xc, 2, 0, (size_t)d.n * d.K * d.Hm, i, step, (void *)d.xc.ysum);
    else mono_xsum<1>(d.xc, 2, 0, (size_t)d.n * d.Hm, i, step, (void *)d.ca.m_out);
}

__device__ __noinline__ void mono_post_ffn(const mono_desc &d, float (*red)[32], const mono_blk &B) {
    int k;
    sm_team t;
    const int per = mono_norm_team(d.H, &k, &t);
    for (int row = B.b * per + k; row < d.n; row += B.G * per) {
        if (d.xc.W > 1) { /* f = unpooled_gather: the W column blocks of the row */
            mono_xgather(d.xc, 3, row, d.xc.nu, (uint16_t *)d.f, d.H, t);
            sm_team_sync(t);
        }
        sm_norm_post_ffn_row(d.s, d.f, d.post_ffn, d.ffn_alpha, d.ffn_beta, d.next_norm, 0, d.H, d.post_eps, d.eps, d.x,
                             (size_t)row, red[k], t);
    }
}

__device__ __noinline__ void mono_rope(const mono_desc &d, const mono_blk &B) {
    const int nw = MONO_THREADS / 32, heads = d.nh + 2 * d.nkv, QD = d.nh * 64, KD = d.nkv * 64;
    for (int it = B.b * nw + (threadIdx.x >> 5); it < d.n * heads; it += B.G * nw) {
        const int row = it / heads, hh = it - row * heads;
        sm_rope_kv_head(d.nq, d.ldq, d.nq + QD, d.nq + QD + KD, d.ldq, d.nh, d.nkv, d.pos, d.slot, d.rope, d.tab, d.eps,
                        d.nq, d.ldq, d.nkvc, d.nslots, (size_t)row, hh);
    }
}

/* The combine of the layer's experts in two phases (moe/combine.cuh, the stock kernels' steps):
 * the scale of every (row, route) by a team of 256 (2 a block), then every element's sum by a
 * thread; plain, EP (f32 m over the rank's routes) or TP (the summed f32 y per route). */
__device__ __noinline__ void mono_combine(const mono_desc &d, float (*red)[32], const mono_blk &B) {
    const int k = threadIdx.x >> 8, items = d.n * d.K;
    const sm_team t = sm_team_slice(k, MOE_COMBINE_THREADS);
    for (int v = B.b * 2 + k; v < items; v += B.G * 2) {
        if (d.ca.y32) moe_combine_scale_item<1>(d.ca, v, red[k], t);
        else moe_combine_scale_item<0>(d.ca, v, red[k], t);
    }
}

__device__ __noinline__ void mono_combine_sum(const mono_desc &d, const mono_blk &B) {
    /* 8 elements a thread, 16-byte loads (Hm % 64 == 0: a static refusal otherwise) */
    const size_t step = (size_t)B.G * MONO_THREADS, chunks = (size_t)d.n * (d.Hm / 8);
    for (size_t c = (size_t)B.b * MONO_THREADS + threadIdx.x; c < chunks; c += step) {
        if (d.ca.y32) moe_combine_elem8<1, 0>(d.ca, c);
        else if (d.ca.m_f32) moe_combine_elem8<0, 1>(d.ca, c);
        else moe_combine_elem8<0, 0>(d.ca, c);
    }
}

/* ---- the kernels ---- */

/* Phase p of layer descriptor d (a dense phase: not the experts). */
template <int N>
__device__ __forceinline__ void mono_phase(const mono_desc &d, int p, uint8_t *dyn, const sm_wg_smem &sm, int &rs, unsigned &rph,
                                           float (*red)[32], const mono_blk &B) {
    switch (p) {
    case MP_ATT:
        if (d.G == 8) mono_att<8>(d, dyn, B);
        else mono_att<2>(d, dyn, B);
        break;
    case MP_ATT_SUM: mono_att_sum(d, B); break;
    case MP_OPROJ: mono_mm_phase<N>(&d.mm[0], sm, rs, rph, B); break;
    case MP_POST_ATT:
        if (d.rnt == 8) mono_post_att_router<8>(d, dyn, red, B);
        else mono_post_att_router<16>(d, dyn, red, B);
        break;
    case MP_POOLER:
        /* the matmul's idle warps (9..15) route the step's rows meanwhile (scratch past the ring) */
        if (threadIdx.x >= MONO_RT0) mono_route_rows(d, (float *)(dyn + (size_t)SM_WG_ST(N, 1) * SM_WG_STAGE(N, 1)), B);
        mono_mm_phase<N>(&d.mm[1], sm, rs, rph, B);
        break;
    case MP_PRE_NORM: mono_pre_norm(d, dyn, red, B); break;
    case MP_XSUM_Y:
    case MP_XSUM_M: mono_xsum_phase(d, p, B); break;
    case MP_COMBINE: mono_combine(d, red, B); break;
    case MP_COMBINE_SUM: mono_combine_sum(d, B); break;
    case MP_UNPOOL: mono_mm_phase<N>(&d.mm[2], sm, rs, rph, B); break;
    case MP_POST_FFN: mono_post_ffn(d, red, B); break;
    case MP_QKVG: mono_mm_phase<N>(&d.mm[3], sm, rs, rph, B); break;
    case MP_ROPE: mono_rope(d, B); break;
    default: break;
    }
}

/* 1 when phase p does not run for descriptor d. */
__device__ __forceinline__ int mono_skip(const mono_desc &d, int p) {
    if (p == MP_ROUTER) return 1; /* the router runs in POST_ATT */
    if (p == MP_TOPK) return 1; /* top-K runs in POOLER */
    if (p == MP_ATT_SUM) return d.nsplit == 1;
    if (p == MP_XSUM_Y) return !(d.xc.W > 1 && d.xc.moe_tp);
    if (p == MP_XSUM_M) return !(d.xc.W > 1 && !d.xc.moe_tp);
    return 0;
}

/* The dense kernel: segment 0 (phases [p0[0], p1[0]) of the rank's descriptor), then segment 1,
 * a grid barrier of the rank's blocks between consecutive phases, an exchange wait before a
 * consuming phase. */
template <int N>
__global__ void __launch_bounds__(MONO_THREADS, 1) mono_kernel(const __grid_constant__ mono_prog P) {
    constexpr int ST = SM_WG_ST(N, 1);
    extern __shared__ uint8_t mono_dyn[];
    __shared__ __align__(8) uint64_t full_bar[ST], empty_bar[ST];
    __shared__ int last_s, flag_s;
    __shared__ float red_s[4][32];
    const mono_blk B = mono_where(P.nrank);
    mono_ctl *ctl = P.d[B.rank].ctl;
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
        const mono_desc &d = P.d[g * P.nrank + B.rank];
        for (int p = P.p0[g]; p < P.p1[g]; p++) {
            if (mono_skip(d, p)) continue;
            if (!first && !mono_grid_sync(ctl, d.layer, p, ++nbar, B, &flag_s)) return;
            const int xo = mono_xop(d, p);
            if (xo >= 0 && !mono_xchg(d, xo, !first, B, &flag_s)) return;
            first = 0;
            unsigned long long *tr = mono_tr(ctl, d.layer, p, B);
            if (tr && threadIdx.x == 0) tr[0] = sm_now_ns();
            mono_phase<N>(d, p, dyn, sm, rs, rph, red_s, B);
            if (tr) {
                __syncthreads();
                if (threadIdx.x == 0) tr[1] = sm_now_ns();
            }
        }
    }
    mono_exit(ctl, B);
}

/* The expert kernel of one layer: the stock expert kernel's blocks (MOE_THREADS threads, 2 an
 * SM, the same queue body, arguments in the constant bank: the stock register allocation),
 * both stages in one phase (traced as MM1; stage 2 units wait for their job's stage 1 inside
 * the queue, queue.cuh).  Y32: stage 2 writes the TP rank's f32 y per route, published as
 * exchange 2 after a last barrier.  JOINT: several ranks in the launch (virtual ranks; the
 * arguments indexed by rank, each rank its own queue over its B.G blocks). */
template <int F, int Y32, int JOINT>
__global__ void __launch_bounds__(MOE_THREADS, 2) mono_moe_kernel(const __grid_constant__ mono_moe P) {
    extern __shared__ uint4 moe_dyn[];
    __shared__ moe_qslot ring[MOE_Q_RING];
    __shared__ int flag_s;
    const mono_blk B = mono_where(JOINT ? P.nrank : 1);
    const int r = JOINT ? B.rank : 0;
    mono_ctl *ctl = P.ctl[r];
    if (*(volatile unsigned *)&ctl->abort) return;
    unsigned long long *tr = mono_tr(ctl, P.layer, MP_MM1, B);
    if (tr && threadIdx.x == 0) tr[0] = sm_now_ns();
    moe_q_block<F, Y32>(P.q[r], (uint2 *)moe_dyn, ring, B.G); /* h1: an earlier launch's */
    if (tr) {
        __syncthreads();
        if (threadIdx.x == 0) tr[1] = sm_now_ns();
    }
    if (Y32) { /* every block's y written: publish exchange 2 (the dense launch waits for it) */
        if (!mono_grid_sync(ctl, P.layer, MP_XSUM_Y, 1u, B, &flag_s)) return;
        if (B.b == 0 && threadIdx.x == 0) {
            const mono_xc &x = P.xc[r];
            const unsigned long long ep = *(volatile const unsigned long long *)x.step * 4096ull + 4ull * (unsigned)P.layer + 3ull;
            __threadfence_system();
            for (int q = 0; q < x.W; q++) sm_st_release_sys_u64((uint64_t *)x.flag[q] + x.rank, (uint64_t)ep);
        }
    }
    mono_exit(ctl, B);
}

/* ---- host side ---- */

size_t mono_smem_bytes(int N, int G, int Hm, int I, int E) {
    size_t b = SM_WG_SMEM(N, 1) + (size_t)E * 4;                          /* the wgmma ring, the top-K's scratch past it */
    const size_t att = 4 * sizeof(sm_att_tile_smem);                       /* 4 attention teams */
    const size_t rt = (size_t)2 * 16 * SM_RG_KL * 4;                         /* router x tiles */
    const size_t gr = sizeof(moe_group_smem);
    const size_t o[3] = {att, rt, gr};
    (void)I; (void)G; (void)Hm; /* the attention scratch no longer depends on G; the combine keeps no row in shared memory */
    for (int i = 0; i < 3; i++) if (o[i] > b) b = o[i];
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

size_t mono_moe_smem(const mono_moe &P) { return moe_q_smem(P.q[0]); }

/* The expert kernel of format F for the program's ranks and stage-2 output. */
template <int F>
static int mono_moe_launch_f(const mono_moe &P, int grid, size_t smem, cudaStream_t st, sm_err *e) {
    const int y32 = P.q[0].a2.y32 != NULL, joint = P.nrank > 1;
    if (!y32 && !joint) return mono_coop(mono_moe_kernel<F, 0, 0>, P, grid, MOE_THREADS, smem, st, e);
    if (!y32) return mono_coop(mono_moe_kernel<F, 0, 1>, P, grid, MOE_THREADS, smem, st, e);
    if (!joint) return mono_coop(mono_moe_kernel<F, 1, 0>, P, grid, MOE_THREADS, smem, st, e);
    return mono_coop(mono_moe_kernel<F, 1, 1>, P, grid, MOE_THREADS, smem, st, e);
}

int mono_moe_launch(int fmt, const mono_moe &P, int grid, cudaStream_t st, sm_err *e) {
    const size_t smem = mono_moe_smem(P);
    switch (fmt) {
    case MOE_F_MX8: return mono_moe_launch_f<MOE_F_MX8>(P, grid, smem, st, e);
    case MOE_F_MX4: return mono_moe_launch_f<MOE_F_MX4>(P, grid, smem, st, e);
    case SM_EXP_MXFP4: return mono_moe_launch_f<SM_EXP_MXFP4>(P, grid, smem, st, e);
    case SM_EXP_FP8: return mono_moe_launch_f<SM_EXP_FP8>(P, grid, smem, st, e);
    case SM_EXP_BF16: return mono_moe_launch_f<SM_EXP_BF16>(P, grid, smem, st, e);
    default: return sm_errf(e, "monokernel: expert format %d has no build", fmt);
    }
}

int mono_moe_occupancy(const mono_moe &P, int *b, sm_err *e) {
    const size_t smem = mono_moe_smem(P);
    *b = 0;
    void (*k[5])(mono_moe) = {mono_moe_kernel<SM_EXP_MXFP4, 0, 0>, mono_moe_kernel<SM_EXP_FP8, 0, 0>, mono_moe_kernel<SM_EXP_BF16, 0, 0>,
                              mono_moe_kernel<MOE_F_MX8, 0, 0>, mono_moe_kernel<MOE_F_MX4, 0, 0>};
    for (int i = 0; i < 5; i++) {
        int o = 0;
        SM_CUDA_CHECK(cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        SM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, k[i], MOE_THREADS, smem));
        if (i == 0 || o < *b) *b = o;
    }
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
