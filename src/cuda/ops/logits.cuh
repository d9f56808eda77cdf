/* ops/logits.cuh: the device bodies of the final logits and greedy argmax (docs/model.md section 4,
 * last lines): the lm_head epilogue of both matmul paths and the argmax reduction.
 *
 * raw = h . lm_head[v] comes from the mma.sync core (sm_lg_sync_tile: one tile of SM_MM_ROWS
 * ids per block of SM_MM_WARPS warps) or from the wgmma stream-K loop (sm_lg_wg_consume: the
 * tiles of 128 * MT ids a block finishes).  Each epilogue applies the softcap and the
 * vocab_used mask (sm_lg_elem), writes f32 logits when asked, and reduces its tile's ids to one
 * (value, id) partial per token (sm_lg_reduce_g over the lanes, sm_lg_tile_best over the
 * warps); sm_lg_argmax_row then reduces a token's partials.  Every step takes the larger value
 * and, on equal values, the lower id, so the result is the reference's argmax whatever the
 * grid.  Non-finite guard: a logit of an id < vocab_used that is NaN or +-Inf turns the
 * partial into the id SM_LG_BAD, which absorbs every other candidate in the same reduction,
 * and the row's argmax into -1 (one FMA per logit and one warp vote per token, no extra pass).  We rejected writing all
 * logits and running a separate argmax over [n, V]: that is 800 KB a row of extra traffic when
 * the caller only wants the argmax.
 */
#ifndef SM_CUDA_OPS_LOGITS_CUH
#define SM_CUDA_OPS_LOGITS_CUH
#include "cuda/common.cuh"
#include "cuda/ops/matmul.cuh"

/* Argmax partial id meaning "a non-finite logit (NaN, +-Inf) was seen among the ids < vocab_used":
 * it absorbs every other candidate, and the row's argmax becomes -1 (cuda/ops/ops.h). */
#define SM_LG_BAD (-2)

/* Fold candidate (v, i) into the running argmax (bv, bi): i == SM_LG_BAD makes the result
 * SM_LG_BAD for good; otherwise the larger value wins, then the lower id (sm_better). */
__device__ __forceinline__ void sm_lg_fold(float &bv, int &bi, float v, int i) {
    if (i == SM_LG_BAD) bi = SM_LG_BAD;
    else if (bi != SM_LG_BAD && sm_better(v, i, bv, bi)) { bv = v; bi = i; }
}

/* The logit of id `row` for token `tok` from its raw product: softcap c * tanh(raw * m_o / c)
 * (cap <= 0: raw * m_o), -inf for ids >= vocab_used; stored to logits [n, V] when non-NULL and
 * in range.  For row < vocab_used it is folded into the running (best, bi) and into the
 * non-finite detector nf (start 0): nf = v * 0 + nf stays 0 for finite v and becomes NaN for
 * good once v is NaN or +-Inf (0 * Inf = NaN; c * tanh of a NaN raw is NaN; raw * m_o may be
 * +-Inf without the softcap): one FMA a logit.  IEEE arithmetic is required (no fast-math
 * flags, which may fold v * 0 to 0); sm_lg_reduce_g turns a NaN nf into the id SM_LG_BAD. */
__device__ __forceinline__ void sm_lg_elem(float raw, int row, int tok, int n, int V, int vocab_used, float m_o, float cap,
                                           float *__restrict__ logits, float &best, int &bi, float &nf) {
    const float x = raw * m_o;
    /* softcap; a non-finite raw value gives NaN (raw * 0 is NaN for +-Inf), not the finite
     * +-cap that tanh would make of it, so the guard below sees it */
    float v = cap > 0.0f ? fmaf(raw, 0.0f, cap * tanhf(x / cap)) : x;
    if (row >= vocab_used) v = -INFINITY;
    if (logits && row < V && tok < n) logits[(size_t)tok * V + row] = v;
    if (row < vocab_used) {
        nf = fmaf(v, 0.0f, nf); /* stays 0 unless v is NaN or +-Inf (0 * Inf = NaN) */
        if (sm_better(v, row, best, bi)) { best = v; bi = row; }
    }
}

/* Best (value, id) over the 8 lanes of a fragment column (lane bits 2..4: g = lane >> 2), every
 * lane ending with the column's best; then the id SM_LG_BAD when the detector nf of any lane of
 * the column is NaN (sm_lg_elem).  All 32 lanes must call it together. */
__device__ __forceinline__ void sm_lg_reduce_g(float &best, int &bi, float nf) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (sm_better(ov, oi, best, bi)) { best = ov; bi = oi; }
    }
    if (__ballot_sync(0xFFFFFFFFu, nf != nf) & (0x11111111u << (threadIdx.x & 3))) bi = SM_LG_BAD;
}

/* Tile partial per token: the best of rv / ri [NW][LD] (one row per warp) for the tokens
 * tok = tid, tid + step, ... < n, stored to pv / pi at [tok]. */
template <int NW, int LD>
__device__ __forceinline__ void sm_lg_tile_best(const float (*rv)[LD], const int (*ri)[LD], int n, int tid, unsigned step,
                                                float *__restrict__ pv, int *__restrict__ pi) {
    for (int tok = tid; tok < n; tok += step) {
        float best = rv[0][tok];
        int bi = ri[0][tok];
        for (int w = 1; w < NW; w++) sm_lg_fold(best, bi, rv[w][tok], ri[w][tok]);
        pv[tok] = best;
        pi[tok] = bi;
    }
}

/* mma.sync path, tile `tile` (ids tile * SM_MM_ROWS .. +SM_MM_ROWS) for the n <= NT * 8 tokens,
 * by the SM_MM_WARPS * 32 threads of a block: raw over all of k (H), the epilogue, and the
 * tile's partial to pv / pi [tiles][n].  xs: dynamic shared memory of SM_MM_SMEM(NT) bytes;
 * bv_s / bi_s: shared [SM_MM_WARPS][NT * 8]. */
template <int NT>
__device__ __forceinline__ void sm_lg_sync_tile(const uint16_t *__restrict__ h, int n, int k, const uint16_t *__restrict__ Wl,
                                                int V, int vocab_used, float m_o, float cap, float *__restrict__ logits,
                                                float *__restrict__ pv, int *__restrict__ pi, int tile, uint4 *xs,
                                                float (*bv_s)[NT * 8], int (*bi_s)[NT * 8]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = tile * SM_MM_ROWS + warp * 16;
    float acc[NT][4];
    /* raw = h . lm_head[v] for this tile's 64 ids, f32 */
    sm_mm_core<NT>(h, n, k, Wl, V, row0, 0, k >> 5, xs, acc);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int tok = nt * 8 + 2 * t + e2;
            float best = 0.0f;
            int bi = -1;
            float nf = 0.0f;
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                sm_lg_elem(acc[nt][2 * hh + e2], row0 + g + 8 * hh, tok, n, V, vocab_used, m_o, cap, logits, best, bi, nf);
            /* best of the warp's 16 ids for this token */
            sm_lg_reduce_g(best, bi, nf);
            if (g == 0) { bv_s[warp][tok] = best; bi_s[warp][tok] = bi; }
        }
    }
    __syncthreads();
    /* best of the tile's 64 ids per token */
    sm_lg_tile_best<SM_MM_WARPS, NT * 8>(bv_s, bi_s, n, threadIdx.x, blockDim.x, pv + (size_t)tile * n, pi + (size_t)tile * n);
}

/* wgmma path: the epilogue of finished tile t (ids t * 128 MT ..), by the 256 consumer
 * threads; fragment layout as sm_wg_epi_mm.  red_v / red_i: shared [RV][N] (RV = 8: one row
 * per consumer warp); the tile's partial goes to a.pv / a.pi [tiles][n]. */
template <int N, int MT, int RV>
__device__ __forceinline__ void sm_lg_wg_epilogue(const sm_wg_args &a, int t, const float (&acc)[MT][N / 2], float (*red_v)[N],
                                                  int (*red_i)[N]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2, g = lane >> 2, t4 = lane & 3, ct = threadIdx.x;
    const int rb = t * SM_WG_BM(MT) + wg * (MT * 64) + (warp & 3) * 16 + g;
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int tok = j * 8 + 2 * t4 + e2;
            float best = 0.0f;
            int bi = -1;
            float nf = 0.0f;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    sm_lg_elem(acc[mt][4 * j + 2 * hh + e2], rb + mt * 64 + hh * 8, tok, a.n, a.m, a.vocab_used, a.m_o, a.cap,
                               a.logits, best, bi, nf);
            /* best of the warp's rows for this token */
            sm_lg_reduce_g(best, bi, nf);
            if (g == 0) { red_v[warp & (RV - 1)][tok] = best; red_i[warp & (RV - 1)][tok] = bi; }
        }
    sm_wg_cons_sync();
    /* best of the tile's rows per token */
    sm_lg_tile_best<RV, N>(red_v, red_i, a.n, ct, 256u, a.pv + (size_t)t * a.n, a.pi + (size_t)t * a.n);
    sm_wg_cons_sync(); /* red_v / red_i free for the next tile */
}

/* The consumer role of the lm_head product over the units [u0, u1) (as sm_wg_consume_mm),
 * with the logits epilogue on every tile this block finishes. */
template <int N, int MT, int RV>
__device__ __forceinline__ void sm_lg_wg_consume(const sm_wg_args &a, int b, int G, int u0, int u1, const sm_wg_smem &sm,
                                                 int &s, unsigned &ph, float (*red_v)[N], int (*red_i)[N]) {
    const int first_tile = u0 / a.ki;
    float acc[MT][N / 2];
    int u = u0;
    while (u < u1) {
        const int t = sm_wg_segment<N, MT>(a, b, G, first_tile, u1, sm, u, s, ph, acc);
        if (t >= 0) sm_lg_wg_epilogue<N, MT, RV>(a, t, acc, red_v, red_i);
    }
}

/* argmax[tok] = the best of the nb partials pv / pi [nb][n] of token tok, by a block of 256
 * threads (sv / si: shared [8]): -1 when a partial is SM_LG_BAD, 0 when none has a candidate. */
__device__ __forceinline__ void sm_lg_argmax_row(const float *__restrict__ pv, const int *__restrict__ pi, int nb, int n, int tok,
                                                 int *__restrict__ argmax, float *sv, int *si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float best = 0.0f;
    int bi = -1;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) sm_lg_fold(best, bi, pv[(size_t)b * n + tok], pi[(size_t)b * n + tok]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        sm_lg_fold(best, bi, ov, oi);
    }
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) sm_lg_fold(best, bi, sv[w], si[w]);
        argmax[tok] = bi == SM_LG_BAD ? -1 : (bi < 0 ? 0 : bi);
    }
}

#endif
