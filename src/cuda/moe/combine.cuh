/* combine.cuh: the last phase of the MoE expert stage (device bodies): per row, the post-expert
 * norm of each of its routes and their route-ordered weighted sum,
 *   t = r16(y * eff(post_expert_norm)), yn = t * rsqrt(mean(t^2) + eps),
 *   m[row] = r16(sum_k w[row, k] * yn(row, k)) for k = 0..K-1 in order.
 * Two variants for W ranks (template flags, the plain combine being <0, 0>): OUT32, m is the
 * f32 sum NOT rounded (an EP rank's partial m over its own routes); Y32, y is read per ROUTE
 * from f32 rows as r16(y) and a route counts when its expert id is in [0, E) (the TP finalize
 * of the rank-summed partial y).
 * Two steps, a grid-wide barrier between them (the stock path: two kernels; the monokernel:
 * two phases): the scale rsqrt(mean(t^2) + eps) of every (row, route), by a team of
 * MOE_COMBINE_THREADS (the sum of squares' order), then every 8 elements' route-ordered sum by
 * one thread.  Every (row, route) and element runs in parallel: the bits depend on nothing
 * but the team size.  We rejected one block per row (the first version): a row's routes one
 * after the other, a chain of dependent loads and barriers as long as the routes (K).
 * We rejected fusing the norm into the down matmul's epilogue: a route's sum of squares spans
 * every block's tiles.
 */
#ifndef SM_CUDA_MOE_COMBINE_CUH
#define SM_CUDA_MOE_COMBINE_CUH
#include "cuda/common.cuh"
#include "cuda/moe/moe.h"

#define MOE_COMBINE_THREADS 256 /* threads of the stock combine blocks */
/* The one-read form of the stock kernels (ONE = 1; the monokernel keeps the loops, ONE = 0, the
 * same bits): a step-1 thread loads its columns (at most MOE_CB_XR) before summing, a step-2
 * thread its routes' slots, weights and scales (at most MOE_CB_KR routes), then their y, where
 * the loops waited a memory round trip a few columns or a route. */
#define MOE_CB_XR 16
#define MOE_CB_KR 8

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
    float *rs;                /* [n * K] the routes' norm scales (workspace: step 1 -> step 2) */
} moe_combine_args;

/* y of route (i, k) at column x: bf16 y of its slot, or r16 of its f32 row (Y32). */
template <int Y32>
__device__ __forceinline__ float moe_combine_y(const uint16_t *yr, const float *yr32, int x) {
    if (Y32) return sm_r16d(yr32[x]);
    return sm_bf(yr[x]);
}

/* The row of y of route (i, k) (bf16 slot row, or f32 route row with Y32); 0 when the route
 * contributes nothing (an invalid expert id, or another rank's expert). */
template <int Y32>
__device__ __forceinline__ int moe_combine_route(const moe_combine_args &a, int i, int k, const uint16_t **yr, const float **yr32) {
    if (Y32) {
        const int v = a.idx[i * a.K + k];
        if (v < 0 || v >= a.E) return 0;
        *yr32 = a.y32 + (size_t)(i * a.K + k) * a.Hm;
    } else {
        const int slot = a.route_slot[i * a.K + k];
        if (slot < 0) return 0;
        *yr = a.y + (size_t)slot * a.Hm;
    }
    return 1;
}

/* t = r16(y * eff(post_expert_norm)) of one value y with its gain pn. */
__device__ __forceinline__ float moe_combine_tv(float y, float pn) { return sm_r16d(y * pn); }
/* t at column x of a route's row. */
template <int Y32>
__device__ __forceinline__ float moe_combine_t(const moe_combine_args &a, const uint16_t *yr, const float *yr32, int x) {
    return moe_combine_tv(moe_combine_y<Y32>(yr, yr32, x), a.pn[x]);
}

/* The norm scale of a route from its sum of squares: rsqrt(mean(t^2) + eps). */
__device__ __forceinline__ float moe_combine_scale_of(float ss, int Hm, float eps) { return 1.0f / sqrtf(ss / (float)Hm + eps); }

/* Step 1, item = i * K + k: a.rs[item] = the route's scale (0 when it contributes nothing), by
 * every thread of team tm (tm.nt == MOE_COMBINE_THREADS: the sum of squares' order); red: the
 * team's shared [32]. */
template <int Y32, int ONE = 0>
__device__ __forceinline__ void moe_combine_scale_item(const moe_combine_args &a, int item, float *red, const sm_team &tm) {
    float *rs = a.rs;
    const int i = item / a.K, k = item - i * a.K;
    const uint16_t *yr = NULL;
    const float *yr32 = NULL;
    if (!moe_combine_route<Y32>(a, i, k, &yr, &yr32)) {
        if (tm.tid == 0) rs[item] = 0.0f;
        return;
    }
    float ss = 0.0f;
    if (ONE && a.Hm <= MOE_CB_XR * tm.nt) { /* the one-read form: the thread's columns all in flight */
        float yv[MOE_CB_XR], pv[MOE_CB_XR];
#pragma unroll
        for (int j = 0; j < MOE_CB_XR; j++) {
            const int x = tm.tid + j * tm.nt;
            if (x < a.Hm) {
                yv[j] = moe_combine_y<Y32>(yr, yr32, x);
                pv[j] = a.pn[x];
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_CB_XR; j++)
            if (tm.tid + j * tm.nt < a.Hm) {
                const float tv = moe_combine_tv(yv[j], pv[j]);
                ss += tv * tv;
            }
    } else {
        for (int x = tm.tid; x < a.Hm; x += tm.nt) {
            const float tv = moe_combine_t<Y32>(a, yr, yr32, x);
            ss += tv * tv;
        }
    }
    ss = sm_team_sum(ss, red, tm);
    if (tm.tid == 0) rs[item] = moe_combine_scale_of(ss, a.Hm, a.eps);
}

/* y of a route's row at columns x0 .. x0 + 7 (16-byte aligned): bf16, or r16 of f32 (Y32). */
template <int Y32>
__device__ __forceinline__ void moe_combine_ld8(const uint16_t *yr, const float *yr32, int x0, float (&y)[8]) {
    if (Y32) {
        const float4 u0 = *(const float4 *)(yr32 + x0), u1 = *(const float4 *)(yr32 + x0 + 4);
        y[0] = sm_r16d(u0.x); y[1] = sm_r16d(u0.y); y[2] = sm_r16d(u0.z); y[3] = sm_r16d(u0.w);
        y[4] = sm_r16d(u1.x); y[5] = sm_r16d(u1.y); y[6] = sm_r16d(u1.z); y[7] = sm_r16d(u1.w);
    } else {
        sm_unpack8_bf(*(const uint4 *)(yr + x0), y);
    }
}
/* m += w_k * (t * r_k) over 8 columns, t = r16(y * eff(post_expert_norm)). */
__device__ __forceinline__ void moe_combine_acc8(float (&m)[8], const float (&y)[8], const float (&pn)[8], float wk, float rk) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        m[j] += wk * (moe_combine_tv(y[j], pn[j]) * rk);
    }
}

/* Step 2, 8 consecutive elements a call (chunk c: row c / (Hm / 8), columns 8 (c % (Hm / 8)) +
 * 0..7; Hm % 8 == 0, 16-byte aligned rows): m = the sum over the row's routes in order of
 * w_k * (t * rs), each element's arithmetic that of moe_combine_row_t.  ONE (the stock kernel,
 * K <= MOE_CB_KR): every route's slot, weight and scale loaded first, then every route's y,
 * then the sum in route order: two memory round trips instead of two a route. */
template <int Y32, int OUT32, int ONE = 0>
__device__ __forceinline__ void moe_combine_elem8(const moe_combine_args &a, size_t c) {
    const float *rs = a.rs;
    const int cpr = a.Hm / 8, i = (int)(c / (size_t)cpr), x0 = (int)(c - (size_t)i * cpr) * 8;
    float pn[8], m[8];
    const float4 p0 = *(const float4 *)(a.pn + x0), p1 = *(const float4 *)(a.pn + x0 + 4);
    pn[0] = p0.x; pn[1] = p0.y; pn[2] = p0.z; pn[3] = p0.w; pn[4] = p1.x; pn[5] = p1.y; pn[6] = p1.z; pn[7] = p1.w;
#pragma unroll
    for (int j = 0; j < 8; j++) m[j] = 0.0f;
    if (ONE && a.K <= MOE_CB_KR) {
        const uint16_t *yr[MOE_CB_KR];
        const float *yr32[MOE_CB_KR];
        int ok[MOE_CB_KR];
        float wk[MOE_CB_KR], rk[MOE_CB_KR], y[MOE_CB_KR][8];
#pragma unroll
        for (int k = 0; k < MOE_CB_KR; k++) {
            ok[k] = k < a.K && moe_combine_route<Y32>(a, i, k, &yr[k], &yr32[k]);
            if (k < a.K) {
                wk[k] = a.w[i * a.K + k];
                rk[k] = rs[i * a.K + k];
            }
        }
#pragma unroll
        for (int k = 0; k < MOE_CB_KR; k++)
            if (ok[k]) moe_combine_ld8<Y32>(yr[k], yr32[k], x0, y[k]);
#pragma unroll
        for (int k = 0; k < MOE_CB_KR; k++)
            if (ok[k]) moe_combine_acc8(m, y[k], pn, wk[k], rk[k]);
    } else {
        for (int k = 0; k < a.K; k++) {
            const uint16_t *yr = NULL;
            const float *yr32 = NULL;
            if (!moe_combine_route<Y32>(a, i, k, &yr, &yr32)) continue;
            float y[8];
            moe_combine_ld8<Y32>(yr, yr32, x0, y);
            moe_combine_acc8(m, y, pn, a.w[i * a.K + k], rs[i * a.K + k]);
        }
    }
    const size_t e = (size_t)i * a.Hm + x0;
    if (OUT32) {
        *(float4 *)(a.m_f32 + e) = make_float4(m[0], m[1], m[2], m[3]);
        *(float4 *)(a.m_f32 + e + 4) = make_float4(m[4], m[5], m[6], m[7]);
    } else {
        uint4 o;
        o.x = (uint32_t)sm_tobf(m[0]) | ((uint32_t)sm_tobf(m[1]) << 16);
        o.y = (uint32_t)sm_tobf(m[2]) | ((uint32_t)sm_tobf(m[3]) << 16);
        o.z = (uint32_t)sm_tobf(m[4]) | ((uint32_t)sm_tobf(m[5]) << 16);
        o.w = (uint32_t)sm_tobf(m[6]) | ((uint32_t)sm_tobf(m[7]) << 16);
        *(uint4 *)(a.m_out + e) = o;
    }
}

/* ---- host side (combine.cu) ---- */
/* The combine arguments of a forward call: w [n, K] route weights, m_out [n, Hm] (m_f32,
 * y32, idx NULL: the plain combine; a caller sets m_f32 or y32 / idx / E after). */
moe_combine_args moe_combine_make(const sm_cuda_moe_layer *L, const float *w, int n, uint16_t *m_out, const sm_cuda_moe_ws *ws);
/* Checks of width Hm for the stock kernels (Hm % 8 == 0). */
int moe_combine_prepare(int Hm, sm_err *e);
/* The stock launches: step 1 (n K blocks of MOE_COMBINE_THREADS), step 2 (a thread per 8
 * elements), on st; the variant follows ca.y32 and ca.m_f32 (both NULL: the plain combine);
 * the outputs and y32 must be 16-byte aligned. */
int moe_combine_launch(const moe_combine_args &ca, cudaStream_t st, sm_err *e);

#endif
