/* ops/norm.cuh: the device bodies of the norm family (docs/model.md section 4): embedding gather +
 * first norm, the post-attention and post-FFN residual boundaries, and the plain bf16 row norm.
 *
 * Each body computes ONE row and is executed by every thread of a team t (common.cuh: the
 * stock kernels' whole block, or a slice of a persistent block; t.nt a multiple of 32, at
 * most 1024; it contains team barriers, so no thread of the team may skip it).  A thread owns
 * the same elements of the row in every pass (SM_NORM_CHUNKS: 8-element chunks read with 16-byte
 * loads, all of a pass in flight at once; scalar loads keep ~16 dependent round trips a
 * pass), so a pass may read back what the same
 * thread wrote in the previous pass and the only cross-thread step is the team reduction
 * (fixed order: deterministic).  The bits depend on t.nt through that reduction: a caller
 * reproduces the stock kernels (ops/norm.cu) exactly with t.nt == sm_norm_threads(H).  `red`
 * is the team's __shared__ float [32] scratch.
 * Products use __fmul_rn / __fadd_rn where the CPU reference rounds each operation, so the f32
 * residual stream does not drift from it by FMA contraction.  ONE = 1 (the stock kernels): where
 * a thread's share of the row fits SM_NORM_RC chunks, the bodies load everything first and keep
 * it in registers (the one-read form below), since each later pass re-read the row, the
 * residual and the gains at L2 or memory latency, a round trip each between the reductions.
 * Its bits are the pass-by-pass form's, which the monokernel keeps (ONE = 0: its norm phases
 * are functions under its 128-register cap, where the one-read form spills).  We rejected
 * keeping the row in shared memory: registers hold a thread's share, and shared memory adds a
 * barrier.
 */
#ifndef SM_CUDA_OPS_NORM_CUH
#define SM_CUDA_OPS_NORM_CUH
#include "model/codec.h"
#include "cuda/common.cuh"

/* Threads per row of the stock norm kernels for a row of H elements. */
__host__ __device__ __forceinline__ int sm_norm_threads(int H) { return H >= 4096 ? 512 : (H >= 1024 ? 256 : 128); }

/* 1 / sqrt(mean + eps) with IEEE sqrt and division, as the CPU computes it. */
__device__ __forceinline__ float sm_rms_scale(float sumsq, int d, float eps) {
    return 1.0f / sqrtf(sumsq / (float)d + eps);
}

/* Element ownership of a row of d: thread tid owns the 8-element chunks tid, tid + nt, ...
 * (16-byte loads, all of a pass's loads in flight at once) and the tail elements
 * 8 chunks + tid, + nt, ... ; every pass walks the same elements in the same order.  Rows
 * whose width is not a multiple of 8 (not 16-byte aligned past row 0) are all tail. */
__host__ __device__ __forceinline__ int sm_norm_nchunks(int d) { return d % 8 ? 0 : d >> 3; }
#define SM_NORM_CHUNKS(c, d, t) for (int c = (t).tid; c < sm_norm_nchunks(d); c += (t).nt)
#define SM_NORM_TAIL(i, d, t) for (int i = 8 * sm_norm_nchunks(d) + (t).tid; i < (d); i += (t).nt)
/* The one-read form (design comment above) holds a thread's chunks in registers: it applies
 * where a row of d has no tail and at most SM_NORM_RC chunks a thread; SM_NORM_RCHUNKS walks
 * them in the order SM_NORM_CHUNKS does, so the sums and their bits are the same. */
#define SM_NORM_RC 2
__host__ __device__ __forceinline__ int sm_norm_regs_fit(int d, int nt) { return d % 8 == 0 && d <= 8 * SM_NORM_RC * nt; }
#define SM_NORM_RCHUNKS(q, c, d, t) \
    _Pragma("unroll") for (int q = 0, c = (t).tid; q < SM_NORM_RC; q++, c += (t).nt) if (c < sm_norm_nchunks(d))
__device__ __forceinline__ void sm_ld8_bf(const uint16_t *p, float (&v)[8]) { sm_unpack8_bf(*(const uint4 *)p, v); }
__device__ __forceinline__ void sm_st8_bf(uint16_t *p, const float (&v)[8]) {
    uint4 u;
    u.x = (uint32_t)sm_tobf(v[0]) | ((uint32_t)sm_tobf(v[1]) << 16);
    u.y = (uint32_t)sm_tobf(v[2]) | ((uint32_t)sm_tobf(v[3]) << 16);
    u.z = (uint32_t)sm_tobf(v[4]) | ((uint32_t)sm_tobf(v[5]) << 16);
    u.w = (uint32_t)sm_tobf(v[6]) | ((uint32_t)sm_tobf(v[7]) << 16);
    *(uint4 *)p = u;
}
__device__ __forceinline__ void sm_ld8_f(const float *p, float (&v)[8]) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void sm_st8_f(float *p, const float (&v)[8]) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

/* This thread's part of sum(v^2) over a bf16 row of d (reduce it with sm_team_sum). */
__device__ __forceinline__ float sm_norm_sumsq_bf16(const uint16_t *xr, int d, const sm_team &t) {
    float ss = 0.0f;
#pragma unroll 2
    SM_NORM_CHUNKS(c, d, t) {
        float v[8];
        sm_ld8_bf(xr + 8 * c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) ss += v[j] * v[j];
    }
    SM_NORM_TAIL(i, d, t) { const float v = sm_bf(xr[i]); ss += v * v; }
    return ss;
}
/* The last pass of a row norm: xr = r16(v * r * w) with v = s (r16s == 0) or r16(s), s f32. */
__device__ __forceinline__ void sm_norm_out_bf16(const float *sr, int d, float r, const float *__restrict__ w, int r16s,
                                                 uint16_t *__restrict__ xr, const sm_team &t) {
#pragma unroll 2
    SM_NORM_CHUNKS(c, d, t) {
        float v[8], wv[8];
        sm_ld8_f(sr + 8 * c, v);
        sm_ld8_f(w + 8 * c, wv);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fmul_rn(__fmul_rn(r16s ? sm_r16d(v[j]) : v[j], r), wv[j]);
        sm_st8_bf(xr + 8 * c, v);
    }
    SM_NORM_TAIL(i, d, t) xr[i] = sm_tobf(__fmul_rn(__fmul_rn(r16s ? sm_r16d(sr[i]) : sr[i], r), w[i]));
}

/* Embedding + first norm of row `row`: v = embed[tokens[row]] (bf16 [V, H]),
 * s[row] = r16(rms(v, -, eps)) (f32), x[row] = r16(rms(s[row], w, eps)) (bf16); a token outside
 * [0, V) gives a NaN row. */
__device__ __forceinline__ void sm_norm_embed_row(const uint16_t *__restrict__ embed, int V, int H,
                                                  const int *__restrict__ tokens, const float *__restrict__ w,
                                                  float eps, float *__restrict__ s, uint16_t *__restrict__ x,
                                                  size_t row, float *red, const sm_team &t) {
    const int tok = tokens[row];
    const int bad = tok < 0 || tok >= V;
    const uint16_t *src = embed + (size_t)(bad ? 0 : tok) * H;
    float *sr = s + row * H;
    uint16_t *xr = x + row * H;
    /* weightless norm of the embedding row: s = r16(v * rsqrt(mean v^2 + eps)) */
    const float ss = sm_norm_sumsq_bf16(src, H, t);
    const float r = bad ? __int_as_float(0x7FC00000) : sm_rms_scale(sm_team_sum(ss, red, t), H, eps);
    float ss2 = 0.0f;
#pragma unroll 2
    SM_NORM_CHUNKS(c, H, t) {
        float v[8];
        sm_ld8_bf(src + 8 * c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) { v[j] = sm_r16d(__fmul_rn(v[j], r)); ss2 += v[j] * v[j]; }
        sm_st8_f(sr + 8 * c, v);
    }
    SM_NORM_TAIL(i, H, t) {
        const float v = sm_r16d(__fmul_rn(sm_bf(src[i]), r));
        sr[i] = v;
        ss2 += v * v;
    }
    /* x = r16(rms(s, eff(in_norm_0))) */
    sm_norm_out_bf16(sr, H, sm_rms_scale(sm_team_sum(ss2, red, t), H, eps), w, 0, xr, t);
}

/* 8 values of a one-read chunk as f32: XV uint4 (8 bf16 kept packed: fewer registers) or float[8]. */
__device__ __forceinline__ void sm_norm_x8(const uint4 &u, float (&v)[8]) { sm_unpack8_bf(u, v); }
__device__ __forceinline__ void sm_norm_x8(const float (&x)[8], float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = x[j];
}
/* This thread's part of sum(x^2) over its chunks xv of a row of d (one-read form; reduce it
 * with sm_team_sum). */
template <typename XV>
__device__ __forceinline__ float sm_norm_sumsq_rc(const XV (&xv)[SM_NORM_RC], int d, const sm_team &t) {
    float ss = 0.0f;
    SM_NORM_RCHUNKS(q, c, d, t) {
        float x[8];
        sm_norm_x8(xv[q], x);
#pragma unroll
        for (int j = 0; j < 8; j++) ss += x[j] * x[j];
    }
    return ss;
}
/* A thread's chunks of a boundary's residual s and its gains (alpha, beta, the next norm's wn), in
 * registers for the one-read form; sm_norm_bd_ld loads chunk q (elements 8c .. 8c + 7). */
typedef struct sm_norm_bd {
    float s[SM_NORM_RC][8], al[SM_NORM_RC][8], be[SM_NORM_RC][8], wn[SM_NORM_RC][8];
} sm_norm_bd;
__device__ __forceinline__ void sm_norm_bd_ld(sm_norm_bd &b, int q, int c, const float *sr, const float *__restrict__ alpha,
                                              const float *__restrict__ beta, const float *__restrict__ wn) {
    sm_ld8_f(sr + 8 * c, b.s[q]);
    sm_ld8_f(alpha + 8 * c, b.al[q]);
    sm_ld8_f(beta + 8 * c, b.be[q]);
    sm_ld8_f(wn + 8 * c, b.wn[q]);
}
/* The one-read form of a residual boundary (post-attention, post-FFN) from the branch's values
 * xv (a, or t = r16(f * eff(post_ffn))) and b: rx = rsqrt(mean x^2 + post_eps); s = alpha * s +
 * beta * r16(x * rx), stored; then out = r16(rms(v, wn, eps)) with v = s (last 0) or r16(s). */
template <typename XV>
__device__ __forceinline__ void sm_norm_boundary_rc(const XV (&xv)[SM_NORM_RC], sm_norm_bd &b, int last, int H, float post_eps,
                                                    float eps, float *__restrict__ sr, uint16_t *__restrict__ xr, float *red,
                                                    const sm_team &t) {
    const float rx = sm_rms_scale(sm_team_sum(sm_norm_sumsq_rc(xv, H, t), red, t), H, post_eps);
    float ss2 = 0.0f;
    SM_NORM_RCHUNKS(q, c, H, t) {
        float x[8];
        sm_norm_x8(xv[q], x);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float xn = sm_r16d(__fmul_rn(x[j], rx));
            b.s[q][j] = __fadd_rn(__fmul_rn(b.al[q][j], b.s[q][j]), __fmul_rn(b.be[q][j], xn));
            const float v = last ? sm_r16d(b.s[q][j]) : b.s[q][j];
            ss2 += v * v;
        }
        sm_st8_f(sr + 8 * c, b.s[q]);
    }
    const float r = sm_rms_scale(sm_team_sum(ss2, red, t), H, eps);
    SM_NORM_RCHUNKS(q, c, H, t) {
#pragma unroll
        for (int j = 0; j < 8; j++) b.s[q][j] = __fmul_rn(__fmul_rn(last ? sm_r16d(b.s[q][j]) : b.s[q][j], r), b.wn[q][j]);
        sm_st8_bf(xr + 8 * c, b.s[q]);
    }
}

/* Post-attention boundary of row `row`: s = alpha * s + beta * r16(rms(a, -, post_eps)) in
 * place (s f32, a bf16 rows of H), then xf = r16(rms(s, wn, eps)) (bf16). */
template <int ONE = 0>
__device__ __forceinline__ void sm_norm_post_attn_row(float *__restrict__ s, const uint16_t *__restrict__ a,
                                                      const float *__restrict__ alpha, const float *__restrict__ beta,
                                                      const float *__restrict__ wn, int H, float post_eps, float eps,
                                                      uint16_t *__restrict__ xf, size_t row, float *red, const sm_team &t) {
    float *sr = s + row * H;
    const uint16_t *ar = a + row * H;
    uint16_t *xr = xf + row * H;
    if (ONE && sm_norm_regs_fit(H, t.nt)) { /* the one-read form */
        uint4 au[SM_NORM_RC];
        sm_norm_bd b;
        SM_NORM_RCHUNKS(q, c, H, t) {
            au[q] = *(const uint4 *)(ar + 8 * c);
            sm_norm_bd_ld(b, q, c, sr, alpha, beta, wn);
        }
        sm_norm_boundary_rc(au, b, 0, H, post_eps, eps, sr, xr, red, t);
        return;
    }
    /* ra = rsqrt(mean a^2 + post_eps) */
    const float ss = sm_norm_sumsq_bf16(ar, H, t);
    const float ra = sm_rms_scale(sm_team_sum(ss, red, t), H, post_eps);
    /* s = alpha * s + beta * r16(a * ra) */
    float ss2 = 0.0f;
#pragma unroll 2
    SM_NORM_CHUNKS(c, H, t) {
        float av[8], sv[8], al[8], be[8];
        sm_ld8_bf(ar + 8 * c, av);
        sm_ld8_f(sr + 8 * c, sv);
        sm_ld8_f(alpha + 8 * c, al);
        sm_ld8_f(beta + 8 * c, be);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float an = sm_r16d(__fmul_rn(av[j], ra));
            sv[j] = __fadd_rn(__fmul_rn(al[j], sv[j]), __fmul_rn(be[j], an));
            ss2 += sv[j] * sv[j];
        }
        sm_st8_f(sr + 8 * c, sv);
    }
    SM_NORM_TAIL(i, H, t) {
        const float an = sm_r16d(__fmul_rn(sm_bf(ar[i]), ra));
        const float sn = __fadd_rn(__fmul_rn(alpha[i], sr[i]), __fmul_rn(beta[i], an));
        sr[i] = sn;
        ss2 += sn * sn;
    }
    /* xf = r16(rms(s, eff(pre_ffn))) */
    sm_norm_out_bf16(sr, H, sm_rms_scale(sm_team_sum(ss2, red, t), H, eps), wn, 0, xr, t);
}

/* Post-FFN boundary of row `row`: t = r16(f * pf), s = alpha * s + beta * r16(t * rsqrt(mean
 * t^2 + post_eps)) in place, then x = r16(rms(s, wn, eps)) (last == 0) or
 * x = r16(rms(r16(s), wn, eps)) (last != 0: h, the lm_head input). */
template <int ONE = 0>
__device__ __forceinline__ void sm_norm_post_ffn_row(float *__restrict__ s, const uint16_t *__restrict__ f,
                                                     const float *__restrict__ pf, const float *__restrict__ alpha,
                                                     const float *__restrict__ beta, const float *__restrict__ wn,
                                                     int last, int H, float post_eps, float eps,
                                                     uint16_t *__restrict__ x, size_t row, float *red, const sm_team &t) {
    float *sr = s + row * H;
    const uint16_t *fr = f + row * H;
    uint16_t *xr = x + row * H;
    if (ONE && sm_norm_regs_fit(H, t.nt)) { /* the one-read form */
        uint4 fu[SM_NORM_RC];
        float pv[SM_NORM_RC][8];
        sm_norm_bd b;
        SM_NORM_RCHUNKS(q, c, H, t) {
            fu[q] = *(const uint4 *)(fr + 8 * c);
            sm_ld8_f(pf + 8 * c, pv[q]);
            sm_norm_bd_ld(b, q, c, sr, alpha, beta, wn);
        }
        /* t = r16(f * eff(post_ffn)), kept in pv */
        SM_NORM_RCHUNKS(q, c, H, t) {
            float fv[8];
            sm_unpack8_bf(fu[q], fv);
#pragma unroll
            for (int j = 0; j < 8; j++) pv[q][j] = sm_r16d(__fmul_rn(fv[j], pv[q][j]));
        }
        sm_norm_boundary_rc(pv, b, last, H, post_eps, eps, sr, xr, red, t);
        return;
    }
    /* t = r16(f * eff(post_ffn)); rt = rsqrt(mean t^2 + post_eps) */
    float ss = 0.0f;
#pragma unroll 2
    SM_NORM_CHUNKS(c, H, t) {
        float fv[8], pv[8];
        sm_ld8_bf(fr + 8 * c, fv);
        sm_ld8_f(pf + 8 * c, pv);
#pragma unroll
        for (int j = 0; j < 8; j++) { const float tv = sm_r16d(__fmul_rn(fv[j], pv[j])); ss += tv * tv; }
    }
    SM_NORM_TAIL(i, H, t) { const float tv = sm_r16d(__fmul_rn(sm_bf(fr[i]), pf[i])); ss += tv * tv; }
    const float rt = sm_rms_scale(sm_team_sum(ss, red, t), H, post_eps);
    /* s = alpha * s + beta * r16(t * rt) */
    float ss2 = 0.0f;
#pragma unroll 2
    SM_NORM_CHUNKS(c, H, t) {
        float fv[8], pv[8], sv[8], al[8], be[8];
        sm_ld8_bf(fr + 8 * c, fv);
        sm_ld8_f(pf + 8 * c, pv);
        sm_ld8_f(sr + 8 * c, sv);
        sm_ld8_f(alpha + 8 * c, al);
        sm_ld8_f(beta + 8 * c, be);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float tv = sm_r16d(__fmul_rn(fv[j], pv[j]));
            const float tn = sm_r16d(__fmul_rn(tv, rt));
            sv[j] = __fadd_rn(__fmul_rn(al[j], sv[j]), __fmul_rn(be[j], tn));
            const float v = last ? sm_r16d(sv[j]) : sv[j];
            ss2 += v * v;
        }
        sm_st8_f(sr + 8 * c, sv);
    }
    SM_NORM_TAIL(i, H, t) {
        const float tv = sm_r16d(__fmul_rn(sm_bf(fr[i]), pf[i]));
        const float tn = sm_r16d(__fmul_rn(tv, rt));
        const float sn = __fadd_rn(__fmul_rn(alpha[i], sr[i]), __fmul_rn(beta[i], tn));
        sr[i] = sn;
        const float v = last ? sm_r16d(sn) : sn;
        ss2 += v * v;
    }
    /* x = r16(rms(s, eff(in_norm_next))), or h = r16(rms(r16(s), final_norm)) */
    sm_norm_out_bf16(sr, H, sm_rms_scale(sm_team_sum(ss2, red, t), H, eps), wn, last, xr, t);
}

/* y[row] = r16(x[row] * rsqrt(mean x^2 + eps) [* w]) for bf16 rows of d; y may alias x (each
 * element is read and written by the same thread); w NULL: no weight.  mx (W4A4's h1,
 * docs/model.md section 6; d % 32 == 0): the bf16 values then rounded to MXFP4 per 32 (a
 * block is the 8-value chunks of 4 consecutive lanes, all in or all past the row together);
 * img.codes non-NULL (mx only): the row's e4m3 image for the expert stage too (sm_x8_img). */
/* One chunk (k0..k0 + 7) of the row norm's output: yc = r16(v * r [* w]), then (mx) rounded
 * to MXFP4, and (ic: the row's image codes, ifac its factors) its e4m3 image written. */
__device__ __forceinline__ void sm_norm_rms_chunk_out(float (&v)[8], float r, const float *__restrict__ w, const float (&wv)[8],
                                                      int mx, uint16_t *yc, uint8_t *ic, float *ifac, int k0) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        v[j] = __fmul_rn(v[j], r);
        if (w) v[j] = __fmul_rn(v[j], wv[j]);
    }
    if (mx) { /* Q(r16(v)) */
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = sm_r16d(v[j]);
        sm_mx_round8(v, ic, ifac, k0);
    }
    sm_st8_bf(yc, v);
}

template <int ONE = 0>
__device__ __forceinline__ void sm_norm_rms_bf16_row(const uint16_t *x, int d, const float *__restrict__ w, float eps,
                                                     uint16_t *y, size_t row, float *red, const sm_team &t, int mx = 0,
                                                     sm_x8_img img = sm_x8_img{NULL, NULL, 0}) {
    const uint16_t *xr = x + row * d;
    uint16_t *yr = y + row * d;
    uint8_t *ic = img.codes ? img.codes + row * img.kp : NULL;
    float *ifac = img.codes ? img.fac + row * (img.kp / 32) : NULL;
    if (ONE && sm_norm_regs_fit(d, t.nt)) { /* the one-read form */
        uint4 xu[SM_NORM_RC];
        float wv[SM_NORM_RC][8];
        SM_NORM_RCHUNKS(q, c, d, t) {
            xu[q] = *(const uint4 *)(xr + 8 * c);
            if (w) sm_ld8_f(w + 8 * c, wv[q]);
        }
        const float r = sm_rms_scale(sm_team_sum(sm_norm_sumsq_rc(xu, d, t), red, t), d, eps);
        SM_NORM_RCHUNKS(q, c, d, t) {
            float v[8];
            sm_unpack8_bf(xu[q], v);
            sm_norm_rms_chunk_out(v, r, w, wv[q], mx, yr + 8 * c, ic, ifac, 8 * c);
        }
        return;
    }
    const float r = sm_rms_scale(sm_team_sum(sm_norm_sumsq_bf16(xr, d, t), red, t), d, eps);
#pragma unroll 2
    SM_NORM_CHUNKS(c, d, t) {
        float v[8], wv[8];
        sm_ld8_bf(xr + 8 * c, v);
        if (w) sm_ld8_f(w + 8 * c, wv);
        sm_norm_rms_chunk_out(v, r, w, wv, mx, yr + 8 * c, ic, ifac, 8 * c);
    }
    SM_NORM_TAIL(i, d, t) {
        const float v = __fmul_rn(sm_bf(xr[i]), r);
        yr[i] = sm_tobf(w ? __fmul_rn(v, w[i]) : v);
    }
}

#endif
