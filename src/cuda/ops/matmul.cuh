/* ops/matmul.cuh: the device bodies of the matmul family: the mma.sync weight-streaming core
 * (y = x W^T for few rows, W rows on the M side), its split-k reduction, the f32-weight router
 * matmul, and the wgmma + TMA stream-K machinery (ring of stages, producer, consumer main loop,
 * stream-K fixup, bf16 epilogue) with the tile range as a parameter.
 *
 * Work units, for a persistent caller:
 *  - mma.sync core: one (block of SM_MM_ROWS rows of W, k split) per block of SM_MM_WARPS
 *    warps (sm_mm_small_tile); split partials summed by sm_mm_reduce_range in split order;
 *  - f32-weight matmul: one (32 rows of W, token block, 512-k split) per block of 256 threads
 *    (sm_mm_f32w_gemv_block), or the fallback block (sm_mm_f32w_block);
 *  - wgmma: units u = (row tile t, k stage q), u = t * ki + q.  A block runs the units
 *    [u0, u1) of virtual block b of G of the stream-K split (u0 = b U / G, sm_wg_unit0), or
 *    any range of whole tiles (u0, u1 multiples of ki); the producer thread and the 256
 *    consumer threads walk the same range; a tile shared by several blocks is summed by its
 *    last arriving block in block (= k) order (sm_wg_fixup): deterministic, no float atomics.
 *    sm_wg_segment returns each tile the block finishes, so the caller picks the epilogue
 *    (sm_wg_epi_mm here, the lm_head epilogue in ops/logits.cuh).
 * The bits of an output depend only on the work split (split counts, stream-K G), never on
 * which block or launch runs a unit.  The stock kernels and their grid choice are in
 * ops/matmul.cu.  We rejected a run-time epilogue switch inside the tile loop (the logits
 * epilogue needs registers and code the plain matmul should not pay) and one generic
 * tile loop with an epilogue callback (a per-tile return keeps the loop plain C).
 */
#ifndef SM_CUDA_OPS_MATMUL_CUH
#define SM_CUDA_OPS_MATMUL_CUH
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include <cuda.h>

/* ---- the weight-streaming matmul core ("swap AB") ----
 * One block of SM_MM_WARPS warps computes C[r, j] = sum_k W[r, k] * x[j, k] for the block's
 * SM_MM_ROWS rows r of W (warp w: rows row0 + 16w .. +15) and all tokens j < NT*8, over the
 * chunks [c0, c1) of 32 k values.  W rows are the M side of mma.m16n8k16, tokens the N side.
 * k is permuted consistently for A and B so that every lane reads 16 contiguous bytes:
 * within a chunk lane (g, t) holds k = 8t .. 8t+7; mma step 0 takes 8t+0..3 (positions
 * 2t, 2t+1, 2t+8, 2t+9), step 1 takes 8t+4..7.  W goes global -> registers one slab ahead
 * (4 chunks = 16 rows x 256 bytes per warp in flight); x goes global -> shared by cp.async,
 * double-buffered per slab, rows padded by 64 bytes so the fragment reads are conflict-free.
 * Result: acc[nt][0..1] = C[row0 + 16w + g][nt*8 + 2t + {0,1}], acc[nt][2..3] the same at
 * row + 8.  Rows >= m read row m-1 (the caller drops them); tokens >= n read zeros. */
#define SM_MM_WARPS 4
#define SM_MM_ROWS (SM_MM_WARPS * 16)
#define SM_MM_CPS 4                     /* chunks of 32 k per slab */
#define SM_MM_ROWU (SM_MM_CPS * 4 + 4)  /* uint4 per shared row: 16 data + 4 pad (64 bytes) */
/* Dynamic shared memory of the core for NT token tiles. */
#define SM_MM_SMEM(NT) ((size_t)2 * (NT) * 8 * SM_MM_ROWU * 16)

template <int NT>
__device__ __forceinline__ void sm_mm_stage_x(uint4 *dst, const uint16_t *x, int n, int k, int cb, int ce) {
    const int per_row = SM_MM_CPS * 4;
    for (int i = threadIdx.x; i < NT * 8 * per_row; i += blockDim.x) {
        const int r = i / per_row, u = i % per_row, c = cb + (u >> 2);
        const int ok = r < n && c < ce;
        const uint4 *src = ok ? (const uint4 *)(x + (size_t)r * k) + c * 4 + (u & 3) : (const uint4 *)x;
        sm_cp_async16(dst + r * SM_MM_ROWU + u, src, ok ? 16 : 0);
    }
}

template <int NT>
__device__ __forceinline__ void sm_mm_core(const uint16_t *__restrict__ x, int n, int k,
                                           const uint16_t *__restrict__ W, int m, int row0,
                                           int c0, int c1, uint4 *xs, float (&acc)[NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int ra = min(row0 + g, m - 1), rb = min(row0 + g + 8, m - 1);
    const uint4 *wa = (const uint4 *)(W + (size_t)ra * k) + t; /* chunk c: wa[4c] */
    const uint4 *wb = (const uint4 *)(W + (size_t)rb * k) + t;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int nslab = (c1 - c0 + SM_MM_CPS - 1) / SM_MM_CPS;
    /* prologue: slab 0 of x to buffer 0, slab 0 of W to registers */
    sm_mm_stage_x<NT>(xs, x, n, k, c0, min(c0 + SM_MM_CPS, c1));
    sm_cp_async_commit();
    uint4 ca[SM_MM_CPS], cb[SM_MM_CPS];
#pragma unroll
    for (int j = 0; j < SM_MM_CPS; j++) {
        const int c = c0 + j;
        ca[j] = c < c1 ? sm_ld_stream(wa + 4 * c) : zero;
        cb[j] = c < c1 ? sm_ld_stream(wb + 4 * c) : zero;
    }
    for (int s = 0; s < nslab; s++) {
        const int cs = c0 + s * SM_MM_CPS, cn = cs + SM_MM_CPS;
        /* next slab of W in flight while this one computes */
        uint4 na[SM_MM_CPS], nb[SM_MM_CPS];
#pragma unroll
        for (int j = 0; j < SM_MM_CPS; j++) {
            const int c = cn + j;
            na[j] = c < c1 ? sm_ld_stream(wa + 4 * c) : zero;
            nb[j] = c < c1 ? sm_ld_stream(wb + 4 * c) : zero;
        }
        /* next slab of x into the other buffer (freed by the barrier ending slab s-1) */
        if (cn < c1) sm_mm_stage_x<NT>(xs + ((s + 1) & 1) * NT * 8 * SM_MM_ROWU, x, n, k, cn, min(cn + SM_MM_CPS, c1));
        sm_cp_async_commit();
        sm_cp_async_wait<1>(); /* this thread's copies of slab s landed */
        __syncthreads();       /* ... and everyone's */
        const uint4 *xb = xs + (s & 1) * NT * 8 * SM_MM_ROWU;
#pragma unroll
        for (int j = 0; j < SM_MM_CPS; j++) {
            if (cs + j < c1) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint4 b = xb[(nt * 8 + g) * SM_MM_ROWU + j * 4 + t];
                    /* step 0: k 8t+0..3; step 1: k 8t+4..7 */
                    sm_mma16816(acc[nt], ca[j].x, cb[j].x, ca[j].y, cb[j].y, b.x, b.y);
                    sm_mma16816(acc[nt], ca[j].z, cb[j].z, ca[j].w, cb[j].w, b.z, b.w);
                }
            }
        }
        __syncthreads(); /* buffer (s & 1) free for slab s + 2 */
#pragma unroll
        for (int j = 0; j < SM_MM_CPS; j++) { ca[j] = na[j]; cb[j] = nb[j]; }
    }
    sm_cp_async_wait<0>(); /* nothing left in flight (empty trailing groups) */
}

/* Block (bx: rows bx * SM_MM_ROWS .. +SM_MM_ROWS of W, by: k chunks [by * cps, +cps) of 32)
 * of the few-row matmul, by the SM_MM_WARPS * 32 threads of the block; xs: dynamic shared
 * memory of SM_MM_SMEM(NT) bytes.  EPI 0: store r16 into y [n, m]; EPI 1: store the f32
 * partial into part [nsplit][n][m] at split by. */
template <int NT, int EPI>
__device__ __forceinline__ void sm_mm_small_tile(const uint16_t *__restrict__ x, int n, int k, const uint16_t *__restrict__ W,
                                                 int m, int cps, uint16_t *__restrict__ y, float *__restrict__ part,
                                                 int bx, int by, uint4 *xs) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = bx * SM_MM_ROWS + warp * 16;
    const int kc = k >> 5, c0 = by * cps, c1 = min(c0 + cps, kc);
    float acc[NT][4];
    /* C = W rows x tokens over this block's k range */
    sm_mm_core<NT>(x, n, k, W, m, row0, c0, c1, xs, acc);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = row0 + g + (i >> 1) * 8, tok = nt * 8 + 2 * t + (i & 1);
            if (row >= m || tok >= n) continue;
            if (EPI == 0) y[(size_t)tok * m + row] = sm_tobf(acc[nt][i]);
            else part[((size_t)by * n + tok) * m + row] = acc[nt][i];
        }
    }
}

/* y[i] = r16(sum over the S splits of part [S][count], in split order) for i = i0, i0 + step,
 * ... < count (any thread layout: each element is its own sum). */
__device__ __forceinline__ void sm_mm_reduce_range(const float *__restrict__ part, int S, size_t count,
                                                   uint16_t *__restrict__ y, size_t i0, size_t step) {
    for (size_t i = i0; i < count; i += step) {
        float a = part[i];
#pragma unroll 8
        for (int s = 1; s < S; s++) a += part[(size_t)s * count + i]; /* in split order; loads run ahead */
        y[i] = sm_tobf(a);
    }
}
/* Same, f32 output (router logits): element i, the sum in split order of the partials of split s
 * at part[s * count + i], read at L2 (ld.cg: they may come from other blocks of the same launch). */
__device__ __forceinline__ float sm_mm_reduce_f32_at(const float *part, int S, size_t count, size_t i) {
    float a = __ldcg(part + i);
#pragma unroll 8
    for (int s = 1; s < S; s++) a += __ldcg(part + (size_t)s * count + i); /* loads run ahead */
    return a;
}
/* Every element [0, count). */
__device__ __forceinline__ void sm_mm_reduce_f32_range(const float *part, int S, size_t count, float *__restrict__ y,
                                                       size_t i0, size_t step) {
    for (size_t i = i0; i < count; i += step) y[i] = sm_mm_reduce_f32_at(part, S, count, i);
}

/* ---- f32-weight matmul (router) ----
 * Main body (sm_mm_f32w_gemv_block): a block owns 32 rows of W x 16 (or 8) tokens x 512 k (one
 * split); each warp 4 rows, each lane 4 k of every 128, so a lane's 16 float4 of W are all in
 * flight at once before the first FMA; x goes to shared memory as f32 once per block (its loads
 * all issued before the stores); partial dots are summed over the warp (sm_warp_sum_many: the
 * butterfly's sums by recursive halving, a lane storing the sums it ends with) and the splits
 * by sm_mm_reduce_f32_range in split order.  f32 x f32 FMAs throughout (no tensor cores: the
 * router's f32 products must stay exact).  Fallback (workspace too small for the splits): the older register-tiled body
 * below.  We rejected that body as the main one: its 4 slabs of 32 k a block each waited
 * for a full memory round trip (a latency, not a bandwidth, bound at few rows), and at 128 rows its
 * 6 shared loads per 8 FMAs made it shared-memory bound. */
#define SM_RG_KL 512    /* k a block (one split) */
#define SM_RG_ROWS 32   /* rows of W a block: 8 warps x 4 */

/* Block (bx: rows bx * 32 .. +32 of W, by: tokens by * NT .. +NT, bz: k [bz * 512, +512)) of the
 * main router kernel, by the 256 threads of team tm; writes out [gridDim.z][n][m] at split bz (the caller sums
 * the splits, or out is y when there is one).  xs: shared float4 [NT][SM_RG_KL / 4].  TC: tokens
 * whose sums a lane holds at once (NT: the stock kernel; fewer keep a caller under a register cap,
 * e.g. the monokernel's 128); every output's FMA order, hence its bits, is the same for any TC. */
template <int NT, int TC = NT>
__device__ __forceinline__ void sm_mm_f32w_gemv_block(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W,
                                                      int m, float *__restrict__ out, int bx, int by, int bz,
                                                      float4 (*xs)[SM_RG_KL / 4], const sm_team &tm) {
    static_assert(NT % TC == 0, "sm_mm_f32w_gemv_block: TC must divide NT");
    const int warp = tm.tid >> 5, lane = tm.tid & 31;
    const int r0 = bx * SM_RG_ROWS + warp * 4, t0 = by * NT, kb = bz * SM_RG_KL;
    const int kl = min(SM_RG_KL, k - kb); /* a multiple of 4 */
    /* W rows r0..r0+3 (rows >= m read row m-1, dropped at the end), k = kb + 4q, q = lane + 32j */
    float4 w[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float4 *wr = (const float4 *)(W + (size_t)min(r0 + r, m - 1) * k + kb);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int q = lane + 32 * j;
            w[r][j] = 4 * q < kl ? __ldcs(wr + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    /* x [t0, t0 + NT) x [kb, kb + kl) as f32, zeros outside; every load issued before the
     * first store (one L2 round trip, not NT / 2) */
    constexpr int XI = NT * (SM_RG_KL / 4) / 256; /* x loads a thread */
    uint2 xu[XI];
#pragma unroll
    for (int u = 0; u < XI; u++) {
        const int i = tm.tid + 256 * u, tt = i / (SM_RG_KL / 4), q = i % (SM_RG_KL / 4);
        xu[u] = t0 + tt < n && 4 * q < kl ? *(const uint2 *)(x + (size_t)(t0 + tt) * k + kb + 4 * q) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < XI; u++) {
        const int i = tm.tid + 256 * u;
        xs[i / (SM_RG_KL / 4)][i % (SM_RG_KL / 4)] = make_float4(sm_bf_lo(xu[u].x), sm_bf_hi(xu[u].x), sm_bf_lo(xu[u].y), sm_bf_hi(xu[u].y));
    }
    sm_team_sync(tm);
#pragma unroll 1
    for (int c0 = 0; c0 < NT; c0 += TC) {
        /* per lane: acc[r][t] = sum over its k of W[r0 + r][k] * x[t0 + c0 + t][k], f32 FMAs */
        float acc[4][TC];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int t = 0; t < TC; t++) acc[r][t] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int q = lane + 32 * j;
#pragma unroll
            for (int t = 0; t < TC; t++) {
                const float4 xv = xs[c0 + t][q];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    acc[r][t] = fmaf(w[r][j].x, xv.x, acc[r][t]);
                    acc[r][t] = fmaf(w[r][j].y, xv.y, acc[r][t]);
                    acc[r][t] = fmaf(w[r][j].z, xv.z, acc[r][t]);
                    acc[r][t] = fmaf(w[r][j].w, xv.w, acc[r][t]);
                }
            }
        }
        /* sum over the warp's lanes (sm_warp_sum's bits); each lane stores the sums it holds of
         * the split's partial out [split][n][m] */
        constexpr int V = 4 * TC;
        float v[V];
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = acc[i / TC][i % TC];
        sm_warp_sum_many<V>(v);
#pragma unroll
        for (int j = 0; j < (V >= 32 ? V / 32 : 1); j++) {
            const int i = sm_warp_sum_many_idx<V>(lane, j), r = i / TC, t = i % TC;
            if (lane % (V >= 32 ? 1 : 32 / V) == 0 && r0 + r < m && t0 + c0 + t < n)
                out[((size_t)bz * n + t0 + c0 + t) * m + r0 + r] = v[j];
        }
    }
}

/* Fallback body.  Block tile: 64 rows of W x 32 tokens, 256 threads, each 4 rows x 2 tokens;
 * k in slabs of 32 through shared memory (rows padded to 33 floats: conflict-free column reads). */
#define SM_F32_TM 64
#define SM_F32_TN 32
#define SM_F32_KS 32

/* Block (bx: rows bx * 64 .. +64 of W, by: tokens by * 32 .. +32, bz: k [bz * kps, +kps)) of
 * the fallback router kernel, by 256 threads; writes out [gridDim.z][n][m] at split bz.
 * ws_, xs_: shared float [SM_F32_TM][SM_F32_KS + 1] and [SM_F32_TN][SM_F32_KS + 1]. */
__device__ __forceinline__ void sm_mm_f32w_block(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W,
                                                 int m, int kps, float *__restrict__ out, int bx, int by, int bz,
                                                 float (*ws_)[SM_F32_KS + 1], float (*xs_)[SM_F32_KS + 1]) {
    const int tid = threadIdx.x, tr = tid & 15, tt = tid >> 4;
    const int m0 = bx * SM_F32_TM, n0 = by * SM_F32_TN;
    const int kb = bz * kps, ke = min(kb + kps, k);
    float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int k0 = kb; k0 < ke; k0 += SM_F32_KS) {
        /* stage W [64 rows][32 k] (float4 loads) and x [32 tokens][32 k] (4 bf16 loads) */
        for (int i = tid; i < SM_F32_TM * (SM_F32_KS / 4); i += 256) {
            const int r = i >> 3, q4 = (i & 7) * 4, kk = k0 + q4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (m0 + r < m && kk < ke) v = *(const float4 *)(W + (size_t)(m0 + r) * k + kk);
            ws_[r][q4] = v.x; ws_[r][q4 + 1] = v.y; ws_[r][q4 + 2] = v.z; ws_[r][q4 + 3] = v.w;
        }
        {
            const int r = tid >> 3, q4 = (tid & 7) * 4, kk = k0 + q4;
            uint2 v = make_uint2(0, 0);
            if (n0 + r < n && kk < ke) v = *(const uint2 *)(x + (size_t)(n0 + r) * k + kk);
            xs_[r][q4] = sm_bf_lo(v.x); xs_[r][q4 + 1] = sm_bf_hi(v.x);
            xs_[r][q4 + 2] = sm_bf_lo(v.y); xs_[r][q4 + 3] = sm_bf_hi(v.y);
        }
        __syncthreads();
        /* acc += W tile x x tile^T, in k order */
#pragma unroll 8
        for (int kk = 0; kk < SM_F32_KS; kk++) {
            float wv[4], xv[2];
#pragma unroll
            for (int i = 0; i < 4; i++) wv[i] = ws_[tr + 16 * i][kk];
#pragma unroll
            for (int j = 0; j < 2; j++) xv[j] = xs_[tt + 16 * j][kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
        }
        __syncthreads();
    }
    /* out [gridDim.z][n][m] (split partials, or y itself when there is one split) */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int row = m0 + tr + 16 * i, tok = n0 + tt + 16 * j;
            if (row < m && tok < n) out[((size_t)bz * n + tok) * m + row] = acc[i][j];
        }
}

/* ---- wgmma stream-K machinery ----
 * Geometry: a tile is BM = 128 * MT rows of W (consumer warpgroup w owns rows 64*MT*w .. +64*MT,
 * one m64 wgmma tile per 64 rows) x N tokens; k goes in stages of SM_WG_BK = 64 (128 bytes a row,
 * the span of the 128-byte swizzle).  A stage holds W [BM][64] then x [N][64], both as TMA
 * writes them with SWIZZLE_128B, which is the K-major layout wgmma reads (8-row groups of
 * 1024 bytes; the k16 step j starts 32 * j bytes into the row).  Rows of W >= m, tokens >= n
 * and k >= the contraction are zero-filled by TMA and dropped by the epilogue.
 * Thread roles (the stock kernel's, which a persistent caller must keep): the consumers are
 * threads 0..255 of the block (warpgroups 0 and 1: the fragment layout, the partial-tile
 * layout and named barrier 1 of 256 threads depend on it), the producer is one other thread;
 * the consumers hold MT * N / 2 accumulators each (setmaxnreg 232 / 40 in the stock kernel).
 * Per matmul the caller provides an sm_wg_args, the two tensor maps (W boxes of BM rows, x
 * boxes of N tokens, 64 k, 128-byte swizzle: see wg_map in ops/matmul.cu), 2 G partial
 * tiles and `tiles` zeroed arrival counters. */
#define SM_WG_BK 64
#define SM_WG_THREADS 384              /* warpgroups 0, 1: consumers; warpgroup 2: producer (one thread) */
#define SM_WG_SMEM_DYN (216 * 1024)    /* dynamic shared memory budget (static adds <= 9 KB) */
#define SM_WG_BM(MT) (128 * (MT))
#define SM_WG_STAGE(N, MT) (SM_WG_BM(MT) * 128 + (N) * 128)
#define SM_WG_ST_FIT(N, MT) ((SM_WG_SMEM_DYN - 1024) / SM_WG_STAGE(N, MT))
#ifndef SM_WG_ST_CAP
#define SM_WG_ST_CAP 8                 /* most ring stages (12 at N = 8 measured slower) */
#endif
#define SM_WG_ST(N, MT) (SM_WG_ST_FIT(N, MT) > SM_WG_ST_CAP ? SM_WG_ST_CAP : SM_WG_ST_FIT(N, MT))
#define SM_WG_SMEM(N, MT) ((size_t)SM_WG_ST(N, MT) * SM_WG_STAGE(N, MT) + 1024)
#define SM_WG_EPI_MM 0                 /* y = r16(acc) */
#define SM_WG_EPI_LOGITS 1             /* softcap, mask, f32 logits, per-tile argmax */
#define SM_WG_EPI_MM32 2               /* y32 = acc (f32, not rounded: a rank's partial sum) */

typedef struct sm_wg_args {
    int n, m, k;          /* tokens, rows of W, contraction */
    int ki;               /* k stages a tile: cdiv(k, 64) */
    int tiles;            /* row tiles: cdiv(m, BM) */
    int units;            /* tiles * ki: the (tile, stage) units cut evenly over the grid
                           * (units * (grid + 1) < 2^31: 32-bit index math, no 64-bit divisions) */
    uint16_t *y;          /* EPI_MM: bf16 [n, m] */
    float *part;          /* device [2 * G][BM * N]: partial tiles, 2 slots a (virtual) block */
    unsigned *cnt;        /* device [tiles]: arrivals at a shared tile, zero between launches */
    int vocab_used;       /* EPI_LOGITS: ids >= vocab_used are masked */
    float m_o, cap;       /* EPI_LOGITS: output multiplier, softcap (<= 0: none) */
    float *logits;        /* EPI_LOGITS: f32 [n, m], or NULL */
    float *pv;            /* EPI_LOGITS: f32 [tiles][n]: best value of each token in a tile */
    int *pi;              /* EPI_LOGITS: int32 [tiles][n]: its id */
    float *y32;           /* EPI_MM32: f32 [n, m] (NULL for the other epilogues) */
} sm_wg_args;

__device__ __forceinline__ void sm_wg_mbar_init(uint32_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void sm_wg_mbar_expect_tx(uint32_t bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void sm_wg_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Spin until the phase of parity `parity` of the barrier has completed. */
__device__ __forceinline__ void sm_wg_mbar_wait(uint32_t bar, unsigned parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
/* 2-D TMA load of one box into shared memory, completing on `bar`, with an L2 policy. */
__device__ __forceinline__ void sm_wg_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar, uint64_t pol) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "l"(pol) : "memory");
}
__device__ __forceinline__ uint64_t sm_wg_policy_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t sm_wg_policy_evict_last(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
/* Shared-memory matrix descriptor: K-major, 128-byte swizzle, 1024 bytes between 8-row groups. */
__device__ __forceinline__ uint64_t sm_wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
/* Barrier of the 256 consumer threads (the producer warp never joins). */
__device__ __forceinline__ void sm_wg_cons_sync(void) { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
/* The block whose unit range [u0(b), u0(b+1)) holds unit u, for u0(b) = b * U / G. */
__device__ __forceinline__ int sm_wg_block_of(int u, int G, int U) { return ((u + 1) * G + U - 1) / U - 1; }

/* d [N/2] += A (64 x 16, descriptor da) * B (16 x N, descriptor db), bf16 in, f32 accumulate. */
template <int N> __device__ __forceinline__ void sm_wg_mma(float *d, uint64_t da, uint64_t db);
template <> __device__ __forceinline__ void sm_wg_mma<8>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3"
                 "}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void sm_wg_mma<16>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7"
                 "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void sm_wg_mma<32>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void sm_wg_mma<64>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void sm_wg_mma<128>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(1));
}


/* Shared memory of a wgmma block (the caller owns the storage). */
typedef struct sm_wg_smem {
    uint32_t base;  /* shared address of stage 0, 1024-aligned: ST stages of SM_WG_STAGE(N, MT) bytes */
    uint32_t full;  /* shared address of uint64_t [ST]: "stage landed" barriers (TMA byte count) */
    uint32_t empty; /* shared address of uint64_t [ST]: "stage free" barriers (8 consumer warps) */
    int *last;      /* shared int: this block sums the shared tile (broadcast to the consumers) */
} sm_wg_smem;

/* First unit of virtual block b of G in the stream-K split of U units: block b runs the units
 * [sm_wg_unit0(b), sm_wg_unit0(b + 1)). */
__host__ __device__ __forceinline__ int sm_wg_unit0(int b, int G, int U) { return b * U / G; }

/* Ring of ST stages: initialize its barriers (one thread; a block barrier must follow before
 * any other thread uses them).  A fresh ring starts at stage 0, phase 0 on both sides. */
template <int ST>
__device__ __forceinline__ void sm_wg_ring_init(const sm_wg_smem &sm) {
    for (int s = 0; s < ST; s++) {
        sm_wg_mbar_init(sm.full + 8u * s, 1);
        sm_wg_mbar_init(sm.empty + 8u * s, 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* Producer (one thread): for the units [u0, u1) in order, wait until the next stage of the
 * ring is free, then TMA the stage's W box [BM rows of tile t][64 k of stage q] and x box
 * [N tokens][same 64 k] into it, completing on its "full" barrier.  (s, ph): the ring position,
 * carried across calls.  fill0: 0 only for a fresh ring (its first ST stages are free without
 * a wait); pass ST otherwise (the wait is then always taken, which is always correct). */
template <int N, int MT>
__device__ __forceinline__ void sm_wg_produce(const CUtensorMap *tw, const CUtensorMap *tx, int ki, int u0, int u1, int fill0,
                                              const sm_wg_smem &sm, int &s, unsigned &ph) {
    constexpr int BM = SM_WG_BM(MT), ST = SM_WG_ST(N, MT), AB = BM * 128, STG = SM_WG_STAGE(N, MT);
    const uint64_t pw = sm_wg_policy_evict_first(), px = sm_wg_policy_evict_last();
    for (int u = u0; u < u1; u++) {
        const int t = u / ki, kq = u - t * ki;
        if (u - u0 + fill0 >= ST) sm_wg_mbar_wait(sm.empty + 8u * s, ph ^ 1u); /* consumers freed it */
        const uint32_t fb = sm.full + 8u * s, dst = sm.base + (uint32_t)(s * STG);
        sm_wg_mbar_expect_tx(fb, STG);
        sm_wg_tma_2d(dst, tw, kq * SM_WG_BK, t * BM, fb, pw);
        sm_wg_tma_2d(dst + AB, tx, kq * SM_WG_BK, 0, fb, px);
        if (++s == ST) { s = 0; ph ^= 1u; }
    }
}

/* Consumer main loop (the 256 threads of warpgroups 0 and 1): acc = the sum over the units
 * [u, se) (consecutive k stages of ONE tile) of W rows x x^T, warpgroup wg owning rows
 * 64 MT wg .. +64 MT of the tile; each stage goes back to the producer once its wgmmas are
 * done.  (s, ph): the ring position, carried across calls. */
template <int N, int MT>
__device__ __forceinline__ void sm_wg_mainloop(const sm_wg_smem &sm, int u, int se, int &s, unsigned &ph,
                                               float (&acc)[MT][N / 2]) {
    constexpr int AB = SM_WG_BM(MT) * 128, STG = SM_WG_STAGE(N, MT), ST = SM_WG_ST(N, MT), NR = N / 2;
    const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[mt][r] = 0.0f;
    int pend = -1;
    for (; u < se; u++) {
        sm_wg_mbar_wait(sm.full + 8u * s, ph);
        const uint32_t sa = sm.base + (uint32_t)(s * STG + wg * (MT * 64 * 128)), sb = sm.base + (uint32_t)(s * STG + AB);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < NR; r++) sm_wg_pin(acc[mt][r]);
        sm_wg_fence();
        /* acc[mt] += W rows (64 of them) x x^T over this stage's 64 k, 4 steps of 16 */
#pragma unroll
        for (int kk = 0; kk < SM_WG_BK / 16; kk++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                sm_wg_mma<N>(acc[mt], sm_wg_desc(sa + (uint32_t)(mt * 64 * 128 + kk * 32)), sm_wg_desc(sb + (uint32_t)(kk * 32)));
        sm_wg_commit();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < NR; r++) sm_wg_pin(acc[mt][r]);
        /* the previous stage's wgmmas are done: hand its buffer back to the producer */
        sm_wg_wait<1>();
        if (pend >= 0 && lane == 0) sm_wg_mbar_arrive(sm.empty + 8u * pend);
        pend = s;
        if (++s == ST) { s = 0; ph ^= 1u; }
    }
    sm_wg_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < NR; r++) sm_wg_pin(acc[mt][r]);
    if (lane == 0) sm_wg_mbar_arrive(sm.empty + 8u * pend);
}

/* Stream-K fixup of tile t (units [tb, te)) that virtual block b of G shares with others (the
 * 256 consumer threads): store this block's part of acc in its slot (first_tile: the tile of
 * its first unit), count the arrival; the last block to arrive sums every part in block
 * (= k) order into acc and returns 1; the others return 0.  last: shared int scratch. */
template <int N, int MT>
__device__ __forceinline__ int sm_wg_fixup(const sm_wg_args &a, int b, int G, int t, int tb, int te, int first_tile, int *last,
                                           float (&acc)[MT][N / 2]) {
    constexpr int BM = SM_WG_BM(MT), NR = N / 2;
    const int ct = threadIdx.x, U = a.units;
    /* a shared tile: store this block's part (fragment order, coalesced float4) */
    const int slot = 2 * b + (t == first_tile ? 0 : 1);
    float4 *pp = (float4 *)(a.part + (size_t)slot * (BM * N));
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int q = 0; q < NR / 4; q++)
            pp[(mt * (NR / 4) + q) * 256 + ct] = make_float4(acc[mt][4 * q], acc[mt][4 * q + 1], acc[mt][4 * q + 2], acc[mt][4 * q + 3]);
    __threadfence();
    sm_wg_cons_sync();
    const int blo = sm_wg_block_of(tb, G, U), bhi = sm_wg_block_of(te - 1, G, U);
    if (ct == 0) {
        const unsigned old = atomicAdd(&a.cnt[t], 1u);
        const int l = old == (unsigned)(bhi - blo);
        if (l) a.cnt[t] = 0; /* every part has arrived: ready for the next launch */
        *last = l;
    }
    sm_wg_cons_sync();
    if (!*last) return 0;
    __threadfence();
    /* the last to arrive sums the parts in block (= k) order; every block after blo
     * starts inside tile t (its part is in its first slot) */
    const int lo_slot = 2 * blo + (blo * U / G == tb ? 0 : 1);
    const float4 *qp = (const float4 *)(a.part + (size_t)lo_slot * (BM * N)) + ct;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int q = 0; q < NR / 4; q++) {
            const float4 v = __ldcg(qp + (mt * (NR / 4) + q) * 256);
            acc[mt][4 * q] = v.x; acc[mt][4 * q + 1] = v.y; acc[mt][4 * q + 2] = v.z; acc[mt][4 * q + 3] = v.w;
        }
    for (int bb = blo + 1; bb <= bhi; bb++) {
        qp = (const float4 *)(a.part + (size_t)(2 * bb) * (BM * N)) + ct;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int q = 0; q < NR / 4; q++) {
                const float4 v = __ldcg(qp + (mt * (NR / 4) + q) * 256);
                acc[mt][4 * q] += v.x; acc[mt][4 * q + 1] += v.y; acc[mt][4 * q + 2] += v.z; acc[mt][4 * q + 3] += v.w;
            }
    }
    return 1;
}

/* The consumers' next segment: the units of one tile from u up to the tile's end or u1, main
 * loop then (a tile the block does not own whole) the fixup; u advances past the segment.
 * Returns the tile index when acc holds the tile's full sum (this block runs its epilogue),
 * -1 when another block finishes it.  b, G, first_tile (u0 / ki): as sm_wg_fixup. */
template <int N, int MT>
__device__ __forceinline__ int sm_wg_segment(const sm_wg_args &a, int b, int G, int first_tile, int u1, const sm_wg_smem &sm,
                                             int &u, int &s, unsigned &ph, float (&acc)[MT][N / 2]) {
    const int t = u / a.ki;
    const int tb = t * a.ki, te = tb + a.ki, se = u1 < te ? u1 : te;
    const int whole = u == tb && se == te;
    sm_wg_mainloop<N, MT>(sm, u, se, s, ph, acc);
    u = se;
    if (!whole && !sm_wg_fixup<N, MT>(a, b, G, t, tb, te, first_tile, sm.last, acc)) return -1;
    return t;
}

/* Epilogue of finished tile t (the 256 consumer threads), rows < m, tokens < n: y = r16(acc)
 * (F32 0) or y32 = acc, not rounded (F32 1: a row's f32 bits are the ones F32 0 rounds).
 * acc[mt][4j + i] = C[row rb + 64 mt + 8 (i >> 1)][token 8j + 2 t4 + (i & 1)]. */
template <int N, int MT, int F32>
__device__ __forceinline__ void sm_wg_epi_mm(const sm_wg_args &a, int t, const float (&acc)[MT][N / 2]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2, g = lane >> 2, t4 = lane & 3;
    const int rb = t * SM_WG_BM(MT) + wg * (MT * 64) + (warp & 3) * 16 + g;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < N / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = rb + mt * 64 + (i >> 1) * 8, tok = j * 8 + 2 * t4 + (i & 1);
                if (row >= a.m || tok >= a.n) continue;
                if (F32) a.y32[(size_t)tok * a.m + row] = acc[mt][4 * j + i];
                else a.y[(size_t)tok * a.m + row] = sm_tobf(acc[mt][4 * j + i]);
            }
}

/* The consumer role of y = r16(x W^T) (EPI = SM_WG_EPI_MM) or y32 = x W^T in f32
 * (SM_WG_EPI_MM32) over the units [u0, u1) (virtual block b of G, or whole tiles): the 256
 * threads of warpgroups 0 and 1, after the ring's barriers exist. */
template <int N, int MT, int EPI = SM_WG_EPI_MM>
__device__ __forceinline__ void sm_wg_consume_mm(const sm_wg_args &a, int b, int G, int u0, int u1, const sm_wg_smem &sm,
                                                 int &s, unsigned &ph) {
    static_assert(EPI == SM_WG_EPI_MM || EPI == SM_WG_EPI_MM32, "sm_wg_consume_mm: matmul epilogues only");
    const int first_tile = u0 / a.ki;
    float acc[MT][N / 2];
    int u = u0;
    while (u < u1) {
        const int t = sm_wg_segment<N, MT>(a, b, G, first_tile, u1, sm, u, s, ph, acc);
        if (t >= 0) {
            sm_wg_epi_mm<N, MT, EPI == SM_WG_EPI_MM32>(a, t, acc);
        }
    }
}

/* ---- host side (ops/matmul.cu) ---- */
/* Plan y = r16(x W^T) for a persistent caller: token box N (8..128, >= n), 128-row tiles (the
 * stock path's choice at every n, so the bits equal sm_k_mm's), partial tiles at part
 * (part_bytes available), the two tensor maps (for the caller to keep in memory the kernel
 * reads).  The caller runs it over G = min(SMs, a->units) virtual blocks. */
int sm_wg_plan_mm(const sm_kernel_ctx *kc, int N, const uint16_t *x, int n, int k, const uint16_t *W, int m, uint16_t *y, void *part,
                  size_t part_bytes, sm_wg_args *a, CUtensorMap *tw, CUtensorMap *tx, sm_err *e);
/* The same plan with the f32 epilogue: y32 = x W^T, not rounded (a rank's partial sum). */
int sm_wg_plan_mm_f32(const sm_kernel_ctx *kc, int N, const uint16_t *x, int n, int k, const uint16_t *W, int m, float *y32, void *part,
                      size_t part_bytes, sm_wg_args *a, CUtensorMap *tw, CUtensorMap *tx, sm_err *e);

#endif
