/* synth.cu: a layer of random experts generated on the device (moe.h sm_cuda_moe_synth), for
 * benchmarks at the real widths without a checkpoint: raw matrices in checkpoint layout from
 * a counter-based hash of (seed, layer, expert, matrix, row, column), quantized as codec.h
 * does, then the upload's own repack (moe_build).
 * We rejected generating the repacked layout directly: the repack is the tested path.
 */
#include "cuda/common.cuh"
#include "cuda/moe/build.h"
#include <stdlib.h>
#include <string.h>

__host__ __device__ __forceinline__ uint64_t moe_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* N(0, 1) from (key, counter) by Box-Muller on two 24-bit uniforms. */
__device__ __forceinline__ float moe_normal(uint64_t key, uint64_t i) {
    const uint64_t h = moe_mix(key ^ moe_mix(i));
    const float u1 = ((float)(h >> 40) + 0.5f) * 5.9604645e-8f, u2 = ((float)(h & 0xFFFFFFu) + 0.5f) * 5.9604645e-8f;
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void moe_synth_mx_kernel(uint64_t key, int R, int K, float sd, uint8_t *w, uint8_t *s) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nb = K / 32;
    if (u >= (long long)R * nb) return;
    const int row = (int)(u / nb), blk = (int)(u % nb);
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = sd * moe_normal(key, (uint64_t)row * K + blk * 32 + j);
    uint8_t q[16];
    s[(size_t)row * nb + blk] = sm_mx_quantize_block(x, q);
    for (int j = 0; j < 16; j++) w[(size_t)row * (K / 2) + blk * 16 + j] = q[j];
}

__global__ void moe_synth_f8_kernel(uint64_t key, int R, int K, float sd, uint8_t *w, float *s) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= R) return;
    float amax = 0.0f;
    for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(sd * moe_normal(key, (uint64_t)row * K + k)));
    const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int k = 0; k < K; k++) w[(size_t)row * K + k] = sm_f32_to_e4m3(sd * moe_normal(key, (uint64_t)row * K + k) / sc);
    s[row] = sc;
}

__global__ void moe_synth_bf_kernel(uint64_t key, int R, int K, float sd, uint16_t *w) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)R * K) return;
    w[u] = sm_f32_to_bf16(sd * moe_normal(key, (uint64_t)u));
}

/* ---- host side ---- */
typedef struct moe_synth_ctx {
    const sm_config *c;       /* widths */
    int fmt;                  /* sm_expert_fmt of the layer */
    uint64_t seed;
} moe_synth_ctx;

static int moe_synth_matrix(const moe_source *src, int x, int mat, uint8_t *w, uint8_t *s, cudaStream_t st, sm_err *e) {
    const moe_synth_ctx *sx = (const moe_synth_ctx *)src->ctx;
    const int R = mat ? sx->c->Hm : 2 * sx->c->I, K = mat ? sx->c->I : sx->c->Hm;
    const uint64_t key = moe_mix(sx->seed ^ moe_mix(((uint64_t)src->l << 40) ^ ((uint64_t)x << 8) ^ (uint64_t)mat));
    const float sd = 1.0f / sqrtf((float)K);
    if (sx->fmt == SM_EXP_MXFP4) {
        const long long n = (long long)R * (K / 32);
        moe_synth_mx_kernel<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(key, R, K, sd, w, s);
    } else if (sx->fmt == SM_EXP_FP8) {
        moe_synth_f8_kernel<<<(R + 127) / 128, 128, 0, st>>>(key, R, K, sd, w, (float *)s);
    } else {
        const long long n = (long long)R * K;
        moe_synth_bf_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(key, R, K, sd, (uint16_t *)w);
    }
    SM_LAUNCH_CHECK("moe_synth_kernel");
    return 0;
}

/* eff(post_expert_norm) = r16(1 + g), g ~ N(0, 0.02) */
static int moe_synth_post_norm(const moe_source *src, float *dst, cudaStream_t st, sm_err *e) {
    const moe_synth_ctx *sx = (const moe_synth_ctx *)src->ctx;
    const int Hm = sx->c->Hm;
    float *pn = (float *)malloc(sizeof(float) * (size_t)Hm);
    if (!pn) return sm_errf(e, "cuda moe synth: out of host memory");
    for (int i = 0; i < Hm; i++) {
        const uint64_t h = moe_mix(sx->seed ^ moe_mix(0xEFFull + ((uint64_t)src->l << 32) + (uint64_t)i));
        const float u1 = ((float)(h >> 40) + 0.5f) * 5.9604645e-8f, u2 = ((float)(h & 0xFFFFFFu) + 0.5f) * 5.9604645e-8f;
        const float z = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
        pn[i] = sm_r16(1.0f + 0.02f * z);
    }
    /* pn is pageable: the copy returns once the runtime has staged it, so it may go */
    cudaError_t rc = cudaMemcpyAsync(dst, pn, sizeof(float) * (size_t)Hm, cudaMemcpyHostToDevice, st);
    free(pn);
    SM_CUDA_CHECK(rc);
    return 0;
}

extern "C" int sm_cuda_moe_synth(const sm_config *c, int l, int fmt, uint64_t seed, sm_cuda_moe_layer *L, cudaStream_t st,
                                 sm_err *e) {
    if (!c || !L) return sm_errf(e, "cuda moe synth: NULL config or layer");
    memset(L, 0, sizeof *L);
    const moe_synth_ctx sx = {c, fmt, seed};
    const moe_source src = {"cuda moe synth", l, &sx, moe_synth_matrix, moe_synth_post_norm};
    return moe_build(c, fmt, &src, L, st, e);
}
