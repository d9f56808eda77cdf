/* synth.cu: a layer of random experts generated on the device (moe.h sm_cuda_moe_synth), for
 * benchmarks at the real widths without a checkpoint.
 *
 * The values are make-model's (src/testing/makemodel.c), bit for bit: expert matrix (layer l,
 * expert x, gate_up / down) is the rng.h stream sm_rng_expert_key(seed, l, x, mat), element
 * (row, col) = half (row * cols + col) % 2 of normal pair (row * cols + col) / 2, value
 * N(0, 1/cols) = std * z with std = 1 / sqrtf(cols); then BF16: bf16(value); MXFP4:
 * sm_mx_quantize_block of the r16 values of each 32-block; FP8: per-row scale amax / 448 of
 * the r16 values and e4m3(value / scale).  eff(post_expert_norm) = r16(1 + g) with g the
 * bf16 of 0.02 z of the stream of the tensor name, as the loader derives it.  Every float
 * operation is an explicit round-to-nearest intrinsic (no FMA contraction).  The raw
 * matrices go through the upload's own repack (moe_build), so a synthetic layer and a loaded
 * make-model checkpoint of the same seed hold the same bytes on the device.
 * We rejected a private hash + Box-Muller (the previous version): cheaper, but its layers
 * matched no checkpoint, so a synthetic benchmark could not be cross-checked.
 */
#include "cuda/common.cuh"
#include "cuda/moe/build.h"
#include "model/rng.h"
#include "model/tensors.h"
#include <stdio.h>
#include <string.h>


/* r16(sd * z), the value of an element as make-model rounds it before quantizing. */
__device__ __forceinline__ float moe_synth_r16(float sd, float z) { return sm_r16(__fmul_rn(sd, z)); }

/* MXFP4: one thread per 32-block (row, blk): 16 normal pairs, codes and scale byte. */
__global__ void moe_synth_mx_kernel(uint64_t key, int R, int K, float sd, uint8_t *w, uint8_t *s) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nb = K / 32;
    if (u >= (long long)R * nb) return;
    const int row = (int)(u / nb), blk = (int)(u % nb);
    const int64_t p0 = ((int64_t)row * K + (int64_t)blk * 32) / 2; /* first normal pair of the block */
    float x[32];
    for (int j = 0; j < 16; j++) {
        float z0, z1;
        sm_rng_normal_pair(key, p0 + j, &z0, &z1);
        x[2 * j] = moe_synth_r16(sd, z0);
        x[2 * j + 1] = moe_synth_r16(sd, z1);
    }
    uint8_t q[16];
    s[(size_t)row * nb + blk] = sm_mx_quantize_block(x, q);
    for (int j = 0; j < 16; j++) w[(size_t)row * (K / 2) + blk * 16 + j] = q[j];
}

/* FP8: one warp per row: the amax of the row's r16 values (a max: the same in any order),
 * scale amax / 448, then e4m3(value / scale). */
__global__ void moe_synth_f8_kernel(uint64_t key, int R, int K, float sd, uint8_t *w, float *s) {
    const int row = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (row >= R) return;
    const int64_t p0 = (int64_t)row * K / 2;
    float amax = 0.0f;
    for (int k2 = lane; k2 < K / 2; k2 += 32) {
        float z0, z1;
        sm_rng_normal_pair(key, p0 + k2, &z0, &z1);
        const float a0 = fabsf(moe_synth_r16(sd, z0)), a1 = fabsf(moe_synth_r16(sd, z1));
        if (a0 > amax) amax = a0;
        if (a1 > amax) amax = a1;
    }
    amax = sm_warp_max(amax);
    const float sc = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    for (int k2 = lane; k2 < K / 2; k2 += 32) {
        float z0, z1;
        sm_rng_normal_pair(key, p0 + k2, &z0, &z1);
        w[(size_t)row * K + 2 * k2] = sm_f32_to_e4m3(__fdiv_rn(moe_synth_r16(sd, z0), sc));
        w[(size_t)row * K + 2 * k2 + 1] = sm_f32_to_e4m3(__fdiv_rn(moe_synth_r16(sd, z1), sc));
    }
    if (lane == 0) s[row] = sc;
}

/* BF16: one thread per normal pair (two elements). */
__global__ void moe_synth_bf_kernel(uint64_t key, int R, int K, float sd, uint16_t *w) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)R * K / 2) return;
    float z0, z1;
    sm_rng_normal_pair(key, u, &z0, &z1);
    w[2 * u] = sm_f32_to_bf16(__fmul_rn(sd, z0));
    w[2 * u + 1] = sm_f32_to_bf16(__fmul_rn(sd, z1));
}

/* eff(post_expert_norm)[i] = r16(1 + bf16(mean + sd z_i)), i < n (mean, sd: the tensor table's). */
__global__ void moe_synth_pn_kernel(uint64_t key, int n, float mean, float sd, float *dst) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (2 * k >= n) return;
    float z[2];
    sm_rng_normal_pair(key, k, &z[0], &z[1]);
    for (int j = 0; j < 2 && 2 * k + j < n; j++) {
        const uint16_t g = sm_f32_to_bf16(__fadd_rn(mean, __fmul_rn(sd, z[j])));
        dst[2 * k + j] = sm_r16(__fadd_rn(1.0f, sm_bf16_to_f32(g)));
    }
}

/* ---- host side ---- */
typedef struct moe_synth_ctx {
    const sm_config *c;       /* widths */
    int fmt;                  /* sm_expert_fmt of the layer */
    uint64_t seed;            /* make-model's --seed */
} moe_synth_ctx;

static int moe_synth_matrix(const moe_source *src, int x, int mat, uint8_t *w, uint8_t *s, cudaStream_t st, sm_err *e) {
    const moe_synth_ctx *sx = (const moe_synth_ctx *)src->ctx;
    const int R = mat ? sx->c->Hm : 2 * sx->c->I, K = mat ? sx->c->I : sx->c->Hm;
    const uint64_t key = sm_rng_expert_key(sx->seed, src->l, x, mat); /* make-model's stream of the matrix */
    const float sd = 1.0f / sqrtf((float)K); /* makemodel.c: N(0, 1/fan_in), fan_in = cols */
    if (sx->fmt == SM_EXP_MXFP4) {
        const long long n = (long long)R * (K / 32);
        moe_synth_mx_kernel<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(key, R, K, sd, w, s);
    } else if (sx->fmt == SM_EXP_FP8) {
        const long long n = (long long)R * 32;
        moe_synth_f8_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(key, R, K, sd, w, (float *)s);
    } else {
        const long long n = (long long)R * K / 2;
        moe_synth_bf_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(key, R, K, sd, (uint16_t *)w);
    }
    SM_LAUNCH_CHECK("moe_synth_kernel");
    return 0;
}

static int moe_synth_post_norm(const moe_source *src, float *dst, cudaStream_t st, sm_err *e) {
    const moe_synth_ctx *sx = (const moe_synth_ctx *)src->ctx;
    char nm[160];
    sm_tensor_name(nm, sizeof nm, SM_T_POST_EXPERT_NORM, src->l); /* make-model's stream of the tensor */
    float mean, sd;
    sm_tensor_init(sx->c, SM_T_POST_EXPERT_NORM, &mean, &sd);
    const int np = (sx->c->Hm + 1) / 2;
    moe_synth_pn_kernel<<<(np + 255) / 256, 256, 0, st>>>(sm_rng_key(sx->seed, nm), sx->c->Hm, mean, sd, dst);
    SM_LAUNCH_CHECK("moe_synth_pn_kernel");
    return 0;
}

extern "C" int sm_cuda_moe_synth(const sm_config *c, int l, int fmt, uint64_t seed, sm_cuda_moe_layer *L, cudaStream_t st,
                                 sm_err *e) {
    if (!c || !L) return sm_errf(e, "cuda moe synth: NULL config or layer");
    memset(L, 0, sizeof *L);
    const moe_synth_ctx sx = {c, fmt, seed};
    const moe_source src = {"cuda moe synth", l, &sx, moe_synth_matrix, moe_synth_post_norm, 0, 0};
    return moe_build(c, fmt, &src, L, st, e);
}
