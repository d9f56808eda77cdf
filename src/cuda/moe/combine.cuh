/* combine.cuh: the last phase of the MoE expert stage (device body): per row, the post-expert
 * norm of each of its routes and their route-ordered weighted sum,
 *   t = r16(y * eff(post_expert_norm)), yn = t * rsqrt(mean(t^2) + eps),
 *   m[row] = r16(sum_k w[row, k] * yn(row, k)) for k = 0..K-1 in order.
 * Two variants for W ranks (template flags, the plain combine being <0, 0>): OUT32, m is the
 * f32 sum NOT rounded (an EP rank's partial m over its own routes); Y32, y is read per ROUTE
 * from f32 rows as r16(y) and a route counts when its expert id is in [0, E) (the TP finalize
 * of the rank-summed partial y).
 * One block per row: the norm needs a block reduction per route and the sum a fixed order, so
 * the result is the same bits for any grid.  We rejected fusing the norm into the down
 * matmul's epilogue: a route's sum of squares spans every block's tiles.
 */
#ifndef SM_CUDA_MOE_COMBINE_CUH
#define SM_CUDA_MOE_COMBINE_CUH
#include "cuda/common.cuh"
#include "cuda/moe.h"

#define MOE_COMBINE_THREADS 256 /* threads of the stock combine blocks */

typedef struct moe_combine_args {
    const uint16_t *y;        /* [slots, Hm] bf16: y of each slot (stage 2 of mm.cuh) */
    const int *route_slot;    /* [n * K]: slot of each route, -1: contributes nothing */
    const float *w;           /* [n, K] route weights */
    const float *pn;          /* [Hm] eff(post_expert_norm) */
    int n, K, Hm;             /* rows, routes per row, width */
    float eps;                /* post_norm_eps */
    uint16_t *m_out;          /* [n, Hm] bf16 (unused with m_f32) */
    float *m_f32;             /* NULL, or [n, Hm] f32: m NOT rounded, instead of m_out (OUT32) */
    const float *y32;         /* NULL, or [n * K, Hm] f32 y per route, read as r16(y), instead
                                 of y / route_slot (Y32) */
    const int *idx;           /* Y32: [n, K] expert ids; a route counts when 0 <= id < E */
    int E;                    /* Y32: experts of the layer */
} moe_combine_args;

/* y of route (i, k) at column x: bf16 y of its slot, or r16 of its f32 row (Y32). */
template <int Y32>
__device__ __forceinline__ float moe_combine_y(const uint16_t *yr, const float *yr32, int x) {
    if (Y32) return sm_r16d(yr32[x]);
    return sm_bf(yr[x]);
}

/* Row i (template flags: see the top of the file).  Every thread of team tm calls it
 * (common.cuh; tm.nt a multiple of 32, <= 1024; it holds team barriers; the bits depend on
 * tm.nt through the sum: MOE_COMBINE_THREADS reproduces the stock kernel); msum: the team's
 * shared [Hm] floats, each element owned by one thread; red: the team's shared [32]. */
template <int Y32, int OUT32>
__device__ __forceinline__ void moe_combine_row_t(const moe_combine_args &a, int i, float *msum, float *red, const sm_team &tm) {
    const float *__restrict__ pn = a.pn;
    const int K = a.K, Hm = a.Hm;
    for (int x = tm.tid; x < Hm; x += tm.nt) msum[x] = 0.0f;
    for (int k = 0; k < K; k++) {
        const uint16_t *yr = NULL;
        const float *yr32 = NULL;
        if (Y32) {
            const int v = a.idx[i * K + k];
            if (v < 0 || v >= a.E) continue; /* invalid expert id: the route contributes nothing */
            yr32 = a.y32 + (size_t)(i * K + k) * Hm;
        } else {
            const int slot = a.route_slot[i * K + k];
            if (slot < 0) continue; /* invalid expert id (or another rank's): contributes nothing */
            yr = a.y + (size_t)slot * Hm;
        }
        const float wk = a.w[i * K + k];
        /* t = r16(y * eff(post_expert_norm)); sum of squares */
        float ss = 0.0f;
        for (int x = tm.tid; x < Hm; x += tm.nt) {
            const float tv = sm_r16d(moe_combine_y<Y32>(yr, yr32, x) * pn[x]);
            ss += tv * tv;
        }
        ss = sm_team_sum(ss, red, tm);
        /* yn = t * rsqrt(mean(t^2) + eps); m += w_k * yn */
        const float r = 1.0f / sqrtf(ss / (float)Hm + a.eps);
        for (int x = tm.tid; x < Hm; x += tm.nt) {
            const float tv = sm_r16d(moe_combine_y<Y32>(yr, yr32, x) * pn[x]);
            msum[x] += wk * (tv * r);
        }
    }
    /* m = r16(sum), or the f32 sum (OUT32) */
    for (int x = tm.tid; x < Hm; x += tm.nt) {
        if (OUT32) a.m_f32[(size_t)i * Hm + x] = msum[x];
        else a.m_out[(size_t)i * Hm + x] = sm_tobf(msum[x]);
    }
}

/* Rows vb, vb + nb, vb + 2 nb, ... < a.n of virtual block vb of nb; same contract as
 * moe_combine_row_t.  Needs every item of the matmul's stage 2 (y): a persistent kernel puts a
 * grid barrier before this phase.  The stock kernel passes (blockIdx.x, gridDim.x = n). */
template <int Y32, int OUT32>
__device__ __forceinline__ void moe_combine_rows_t(const moe_combine_args &a, int vb, int nb, float *msum, float *red,
                                                   const sm_team &tm) {
    for (int i = vb; i < a.n; i += nb) moe_combine_row_t<Y32, OUT32>(a, i, msum, red, tm);
}

/* The plain combine (bf16 y per slot, bf16 m). */
__device__ __forceinline__ void moe_combine_row(const moe_combine_args &a, int i, float *msum, float *red, const sm_team &tm) {
    moe_combine_row_t<0, 0>(a, i, msum, red, tm);
}
__device__ __forceinline__ void moe_combine_rows(const moe_combine_args &a, int vb, int nb, float *msum, float *red,
                                                 const sm_team &tm) {
    moe_combine_rows_t<0, 0>(a, vb, nb, msum, red, tm);
}

/* ---- host side (combine.cu) ---- */
/* The combine arguments of a forward call: w [n, K] route weights, m_out [n, Hm] (m_f32,
 * y32, idx NULL: the plain combine; a caller sets m_f32 or y32 / idx / E after). */
moe_combine_args moe_combine_make(const sm_cuda_moe_layer *L, const float *w, int n, uint16_t *m_out, const sm_cuda_moe_ws *ws);
/* Kernel attribute (shared memory above 48 KB) of the stock kernel for width Hm. */
int moe_combine_prepare(int Hm, sm_err *e);
/* The stock launch: n blocks of MOE_COMBINE_THREADS, Hm floats of shared memory, on st; the
 * variant follows ca.y32 and ca.m_f32 (both NULL: the plain combine). */
int moe_combine_launch(const moe_combine_args &ca, cudaStream_t st, sm_err *e);

#endif
