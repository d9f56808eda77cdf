/* ops/norm.cuh: the device bodies of the norm family (docs/model.md section 4): embedding gather +
 * first norm, the post-attention and post-FFN residual boundaries, and the plain bf16 row norm.
 *
 * Each body computes ONE row and is executed by every thread of a team t (common.cuh: the
 * stock kernels' whole block, or a slice of a persistent block; t.nt a multiple of 32, at
 * most 1024; it contains team barriers, so no thread of the team may skip it).  Thread i owns
 * the elements i, i + t.nt, ... of the row in every pass, so a pass may read back what the same
 * thread wrote in the previous pass and the only cross-thread step is the team reduction
 * (fixed order: deterministic).  The bits depend on t.nt through that reduction: a caller
 * reproduces the stock kernels (ops/norm.cu) exactly with t.nt == sm_norm_threads(H).  `red`
 * is the team's __shared__ float [32] scratch.
 * Products use __fmul_rn / __fadd_rn where the CPU reference rounds each operation, so the f32
 * residual stream does not drift from it by FMA contraction.  We rejected keeping the row in
 * shared memory: rows are up to 8192 f32 and re-reading them hits L1/L2, while the work is a
 * few microseconds either way.
 */
#ifndef SM_CUDA_OPS_NORM_CUH
#define SM_CUDA_OPS_NORM_CUH
#include "cuda/common.cuh"

/* Threads per row of the stock norm kernels for a row of H elements. */
__host__ __device__ __forceinline__ int sm_norm_threads(int H) { return H >= 4096 ? 512 : (H >= 1024 ? 256 : 128); }

/* 1 / sqrt(mean + eps) with IEEE sqrt and division, as the CPU computes it. */
__device__ __forceinline__ float sm_rms_scale(float sumsq, int d, float eps) {
    return 1.0f / sqrtf(sumsq / (float)d + eps);
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
    float ss = 0.0f;
    for (int i = t.tid; i < H; i += t.nt) { const float v = sm_bf(src[i]); ss += v * v; }
    const float r = bad ? __int_as_float(0x7FC00000) : sm_rms_scale(sm_team_sum(ss, red, t), H, eps);
    float ss2 = 0.0f;
    for (int i = t.tid; i < H; i += t.nt) {
        const float v = sm_r16d(__fmul_rn(sm_bf(src[i]), r));
        sr[i] = v;
        ss2 += v * v;
    }
    /* x = r16(rms(s, eff(in_norm_0))) */
    const float r2 = sm_rms_scale(sm_team_sum(ss2, red, t), H, eps);
    for (int i = t.tid; i < H; i += t.nt) xr[i] = sm_tobf(__fmul_rn(__fmul_rn(sr[i], r2), w[i]));
}

/* Post-attention boundary of row `row`: s = alpha * s + beta * r16(rms(a, -, post_eps)) in
 * place (s f32, a bf16 rows of H), then xf = r16(rms(s, wn, eps)) (bf16). */
__device__ __forceinline__ void sm_norm_post_attn_row(float *__restrict__ s, const uint16_t *__restrict__ a,
                                                      const float *__restrict__ alpha, const float *__restrict__ beta,
                                                      const float *__restrict__ wn, int H, float post_eps, float eps,
                                                      uint16_t *__restrict__ xf, size_t row, float *red, const sm_team &t) {
    float *sr = s + row * H;
    const uint16_t *ar = a + row * H;
    uint16_t *xr = xf + row * H;
    /* ra = rsqrt(mean a^2 + post_eps) */
    float ss = 0.0f;
    for (int i = t.tid; i < H; i += t.nt) { const float v = sm_bf(ar[i]); ss += v * v; }
    const float ra = sm_rms_scale(sm_team_sum(ss, red, t), H, post_eps);
    /* s = alpha * s + beta * r16(a * ra) */
    float ss2 = 0.0f;
    for (int i = t.tid; i < H; i += t.nt) {
        const float an = sm_r16d(__fmul_rn(sm_bf(ar[i]), ra));
        const float sn = __fadd_rn(__fmul_rn(alpha[i], sr[i]), __fmul_rn(beta[i], an));
        sr[i] = sn;
        ss2 += sn * sn;
    }
    /* xf = r16(rms(s, eff(pre_ffn))) */
    const float rs = sm_rms_scale(sm_team_sum(ss2, red, t), H, eps);
    for (int i = t.tid; i < H; i += t.nt) xr[i] = sm_tobf(__fmul_rn(__fmul_rn(sr[i], rs), wn[i]));
}

/* Post-FFN boundary of row `row`: t = r16(f * pf), s = alpha * s + beta * r16(t * rsqrt(mean
 * t^2 + post_eps)) in place, then x = r16(rms(s, wn, eps)) (last == 0) or
 * x = r16(rms(r16(s), wn, eps)) (last != 0: h, the lm_head input). */
__device__ __forceinline__ void sm_norm_post_ffn_row(float *__restrict__ s, const uint16_t *__restrict__ f,
                                                     const float *__restrict__ pf, const float *__restrict__ alpha,
                                                     const float *__restrict__ beta, const float *__restrict__ wn,
                                                     int last, int H, float post_eps, float eps,
                                                     uint16_t *__restrict__ x, size_t row, float *red, const sm_team &t) {
    float *sr = s + row * H;
    const uint16_t *fr = f + row * H;
    uint16_t *xr = x + row * H;
    /* t = r16(f * eff(post_ffn)); rt = rsqrt(mean t^2 + post_eps) */
    float ss = 0.0f;
    for (int i = t.tid; i < H; i += t.nt) {
        const float t = sm_r16d(__fmul_rn(sm_bf(fr[i]), pf[i]));
        ss += t * t;
    }
    const float rt = sm_rms_scale(sm_team_sum(ss, red, t), H, post_eps);
    /* s = alpha * s + beta * r16(t * rt) */
    float ss2 = 0.0f;
    for (int i = t.tid; i < H; i += t.nt) {
        const float t = sm_r16d(__fmul_rn(sm_bf(fr[i]), pf[i]));
        const float tn = sm_r16d(__fmul_rn(t, rt));
        const float sn = __fadd_rn(__fmul_rn(alpha[i], sr[i]), __fmul_rn(beta[i], tn));
        sr[i] = sn;
        const float v = last ? sm_r16d(sn) : sn;
        ss2 += v * v;
    }
    /* x = r16(rms(s, eff(in_norm_next))), or h = r16(rms(r16(s), final_norm)) */
    const float r2 = sm_rms_scale(sm_team_sum(ss2, red, t), H, eps);
    for (int i = t.tid; i < H; i += t.nt) {
        const float v = last ? sm_r16d(sr[i]) : sr[i];
        xr[i] = sm_tobf(__fmul_rn(__fmul_rn(v, r2), wn[i]));
    }
}

/* y[row] = r16(x[row] * rsqrt(mean x^2 + eps) [* w]) for bf16 rows of d; y may alias x (each
 * element is read and written by the same thread); w NULL: no weight. */
__device__ __forceinline__ void sm_norm_rms_bf16_row(const uint16_t *x, int d, const float *__restrict__ w, float eps,
                                                     uint16_t *y, size_t row, float *red, const sm_team &t) {
    const uint16_t *xr = x + row * d;
    uint16_t *yr = y + row * d;
    float ss = 0.0f;
    for (int i = t.tid; i < d; i += t.nt) { const float v = sm_bf(xr[i]); ss += v * v; }
    const float r = sm_rms_scale(sm_team_sum(ss, red, t), d, eps);
    for (int i = t.tid; i < d; i += t.nt) {
        const float v = __fmul_rn(sm_bf(xr[i]), r);
        yr[i] = sm_tobf(w ? __fmul_rn(v, w[i]) : v);
    }
}

#endif
