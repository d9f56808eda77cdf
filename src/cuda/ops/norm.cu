/* norm.cu: embedding gather, the residual boundaries and plain row norms (SPEC.md section 4).
 *
 * One block per row; each thread owns the elements i = tid, tid + blockDim, ... of its row in
 * every pass, so a pass may read back what the same thread wrote in the previous pass and the
 * only cross-thread step is the block reduction (fixed order: deterministic).  Products are
 * written with __fmul_rn / __fadd_rn where the CPU reference rounds each operation, so the
 * f32 residual stream does not drift from it by FMA contraction.  We rejected keeping the row
 * in shared memory: rows are up to 8192 f32 and re-reading them hits L1/L2, while the kernels
 * are a few microseconds either way.
 */
#include "cuda/common.cuh"
#include "cuda/kernels.h"

static inline int norm_threads(int H) { return H >= 4096 ? 512 : (H >= 1024 ? 256 : 128); }

/* 1 / sqrt(mean + eps) with IEEE sqrt and division, as the CPU computes it. */
__device__ __forceinline__ float rms_scale(float sumsq, int d, float eps) {
    return 1.0f / sqrtf(sumsq / (float)d + eps);
}

__global__ void embed_kernel(const uint16_t *__restrict__ embed, int V, int H, const int *__restrict__ tokens,
                             const float *__restrict__ w, float eps, float *__restrict__ s, uint16_t *__restrict__ x) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    const int tok = tokens[row];
    const int bad = tok < 0 || tok >= V;
    const uint16_t *src = embed + (size_t)(bad ? 0 : tok) * H;
    float *sr = s + row * H;
    uint16_t *xr = x + row * H;
    /* weightless norm of the embedding row: s = r16(v * rsqrt(mean v^2 + eps)) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) { const float v = sm_bf(src[i]); ss += v * v; }
    const float r = bad ? __int_as_float(0x7FC00000) : rms_scale(sm_block_sum(ss, red), H, eps);
    float ss2 = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float v = sm_r16d(__fmul_rn(sm_bf(src[i]), r));
        sr[i] = v;
        ss2 += v * v;
    }
    /* x = r16(rms(s, eff(in_norm_0))) */
    const float r2 = rms_scale(sm_block_sum(ss2, red), H, eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = sm_tobf(__fmul_rn(__fmul_rn(sr[i], r2), w[i]));
}

__global__ void post_attn_kernel(float *__restrict__ s, const uint16_t *__restrict__ a, const float *__restrict__ alpha,
                                 const float *__restrict__ beta, const float *__restrict__ wn, int H, float post_eps,
                                 float eps, uint16_t *__restrict__ xf) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    float *sr = s + row * H;
    const uint16_t *ar = a + row * H;
    uint16_t *xr = xf + row * H;
    /* ra = rsqrt(mean a^2 + post_eps) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) { const float v = sm_bf(ar[i]); ss += v * v; }
    const float ra = rms_scale(sm_block_sum(ss, red), H, post_eps);
    /* s = alpha * s + beta * r16(a * ra) */
    float ss2 = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float an = sm_r16d(__fmul_rn(sm_bf(ar[i]), ra));
        const float sn = __fadd_rn(__fmul_rn(alpha[i], sr[i]), __fmul_rn(beta[i], an));
        sr[i] = sn;
        ss2 += sn * sn;
    }
    /* xf = r16(rms(s, eff(pre_ffn))) */
    const float rs = rms_scale(sm_block_sum(ss2, red), H, eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = sm_tobf(__fmul_rn(__fmul_rn(sr[i], rs), wn[i]));
}

__global__ void post_ffn_kernel(float *__restrict__ s, const uint16_t *__restrict__ f, const float *__restrict__ pf,
                                const float *__restrict__ alpha, const float *__restrict__ beta,
                                const float *__restrict__ wn, int last, int H, float post_eps, float eps,
                                uint16_t *__restrict__ x) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    float *sr = s + row * H;
    const uint16_t *fr = f + row * H;
    uint16_t *xr = x + row * H;
    /* t = r16(f * eff(post_ffn)); rt = rsqrt(mean t^2 + post_eps) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float t = sm_r16d(__fmul_rn(sm_bf(fr[i]), pf[i]));
        ss += t * t;
    }
    const float rt = rms_scale(sm_block_sum(ss, red), H, post_eps);
    /* s = alpha * s + beta * r16(t * rt) */
    float ss2 = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float t = sm_r16d(__fmul_rn(sm_bf(fr[i]), pf[i]));
        const float tn = sm_r16d(__fmul_rn(t, rt));
        const float sn = __fadd_rn(__fmul_rn(alpha[i], sr[i]), __fmul_rn(beta[i], tn));
        sr[i] = sn;
        const float v = last ? sm_r16d(sn) : sn;
        ss2 += v * v;
    }
    /* x = r16(rms(s, eff(in_norm_next))), or h = r16(rms(r16(s), final_norm)) */
    const float r2 = rms_scale(sm_block_sum(ss2, red), H, eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float v = last ? sm_r16d(sr[i]) : sr[i];
        xr[i] = sm_tobf(__fmul_rn(__fmul_rn(v, r2), wn[i]));
    }
}

__global__ void rms_bf16_kernel(const uint16_t *x, int d, const float *__restrict__ w, float eps, uint16_t *y) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    const uint16_t *xr = x + row * d;
    uint16_t *yr = y + row * d;
    /* y = r16(x * rsqrt(mean x^2 + eps) [* w]); y may alias x (same thread, same element) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) { const float v = sm_bf(xr[i]); ss += v * v; }
    const float r = rms_scale(sm_block_sum(ss, red), d, eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = __fmul_rn(sm_bf(xr[i]), r);
        yr[i] = sm_tobf(w ? __fmul_rn(v, w[i]) : v);
    }
}

static int rows_check(const char *who, int n, int H, sm_err *e) {
    if (n < 0 || H <= 0) return sm_errf(e, "%s: bad shape n=%d H=%d", who, n, H);
    if (n > 2147483647 / 2) return sm_errf(e, "%s: n=%d rows too many", who, n);
    return 0;
}

int sm_k_embed(const uint16_t *embed, int V, int H, const int *tokens, int n, const float *in_norm, float eps,
               float *s, uint16_t *x, cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_embed", n, H, e)) return -1;
    if (V <= 0) return sm_errf(e, "sm_k_embed: bad vocabulary size V=%d", V);
    if (!embed || !tokens || !in_norm || !s || !x) return sm_errf(e, "sm_k_embed: NULL pointer argument");
    if (n == 0) return 0;
    embed_kernel<<<n, norm_threads(H), 0, st>>>(embed, V, H, tokens, in_norm, eps, s, x);
    SM_LAUNCH_CHECK("embed_kernel");
    return 0;
}

int sm_k_post_attn(float *s, const uint16_t *a, const float *alpha, const float *beta, const float *pre_ffn,
                   int n, int H, float post_eps, float eps, uint16_t *xf, cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_post_attn", n, H, e)) return -1;
    if (!s || !a || !alpha || !beta || !pre_ffn || !xf) return sm_errf(e, "sm_k_post_attn: NULL pointer argument");
    if (n == 0) return 0;
    post_attn_kernel<<<n, norm_threads(H), 0, st>>>(s, a, alpha, beta, pre_ffn, H, post_eps, eps, xf);
    SM_LAUNCH_CHECK("post_attn_kernel");
    return 0;
}

int sm_k_post_ffn(float *s, const uint16_t *f, const float *post_ffn, const float *alpha, const float *beta,
                  const float *norm, int last, int n, int H, float post_eps, float eps, uint16_t *x,
                  cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_post_ffn", n, H, e)) return -1;
    if (!s || !f || !post_ffn || !alpha || !beta || !norm || !x) return sm_errf(e, "sm_k_post_ffn: NULL pointer argument");
    if (n == 0) return 0;
    post_ffn_kernel<<<n, norm_threads(H), 0, st>>>(s, f, post_ffn, alpha, beta, norm, last != 0, H, post_eps, eps, x);
    SM_LAUNCH_CHECK("post_ffn_kernel");
    return 0;
}

int sm_k_rms_bf16(const uint16_t *x, int n, int d, const float *w, float eps, uint16_t *y, cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_rms_bf16", n, d, e)) return -1;
    if (!x || !y) return sm_errf(e, "sm_k_rms_bf16: NULL x or y");
    if (n == 0) return 0;
    rms_bf16_kernel<<<n, norm_threads(d), 0, st>>>(x, d, w, eps, y);
    SM_LAUNCH_CHECK("rms_bf16_kernel");
    return 0;
}
