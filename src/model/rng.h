/* rng.h: the project's one random generator (splitmix64): the counter-based normals of random
 * models, shared by make-model (host) and the device-synthesized models (src/cuda/rank/synth.cu
 * for the dense tensors, src/cuda/moe/synth.cu for the experts), so that a synthetic model and
 * a make-model checkpoint of the same seed hold the same bits; and a sequential stream
 * (sm_rng_next) for everything else that needs seeded numbers (the KV page shuffle, benchmark
 * and test inputs).
 *
 * Stream key = mix64(mix64(seed + golden) ^ FNV-1a(tensor name)); normal pair k of a stream =
 * Box-Muller on the two 24-bit halves of mix64(key + k * golden), with a series log, a
 * bit-trick + 3 Newton steps rsqrt and quarter-turn sin/cos polynomials (no libm: identical
 * bits on every machine).  Every float operation goes through SM_FMUL/SM_FADD/... which are
 * explicit round-to-nearest intrinsics on the device (nvcc would otherwise contract a*b+c
 * into an FMA) and plain operators on the host (gcc does not contract without -mfma).
 * We rejected cuRAND / libc rand: neither reproduces across host and device.
 */
#ifndef SM_RNG_H
#define SM_RNG_H
#include <stdint.h>
#include <stdio.h>
#include "model/codec.h"
#include "model/tensors.h"

#ifdef __CUDA_ARCH__
#define SM_FMUL(a, b) __fmul_rn((a), (b))
#define SM_FADD(a, b) __fadd_rn((a), (b))
#define SM_FSUB(a, b) __fsub_rn((a), (b))
#define SM_FDIV(a, b) __fdiv_rn((a), (b))
#else
#define SM_FMUL(a, b) ((a) * (b))
#define SM_FADD(a, b) ((a) + (b))
#define SM_FSUB(a, b) ((a) - (b))
#define SM_FDIV(a, b) ((a) / (b))
#endif

#define SM_RNG_GOLDEN 0x9E3779B97F4A7C15ull

/* splitmix64 finalizer */
SM_HD uint64_t sm_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Next value of the sequential stream whose state is *state (splitmix64: the state advances
 * by the golden constant, the value is its finalizer). */
SM_HD uint64_t sm_rng_next(uint64_t *state) { return sm_mix64(*state += SM_RNG_GOLDEN); }

/* Key of the stream named `name` (a tensor name) under seed. */
SM_HD uint64_t sm_rng_key(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a of the name */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001B3ull;
    return sm_mix64(sm_mix64(seed + SM_RNG_GOLDEN) ^ h);
}

/* Key of the stream of expert matrix (layer l, expert x, proj 0 gate_up / 1 down) under seed:
 * named by its logical name "P layers.<l>.mlp.experts.<x>.<gate_up_proj|down_proj>", not by a
 * tensor name, so the consolidated BF16, FP8 and MXFP4 checkpoints (and the device-made
 * experts) of one seed hold the same normals.  Host only. */
static inline uint64_t sm_rng_expert_key(uint64_t seed, int l, int x, int proj) {
    char nm[128];
    snprintf(nm, sizeof nm, SM_TENSOR_PREFIX "layers.%d.mlp.experts.%d.%s", l, x, proj ? "down_proj" : "gate_up_proj");
    return sm_rng_key(seed, nm);
}

/* Normal pair number k of stream key: z0 = r cos(theta), z1 = r sin(theta). */
SM_HD void sm_rng_normal_pair(uint64_t key, int64_t k, float *z0, float *z1) {
    uint64_t r = sm_mix64(key + (uint64_t)k * SM_RNG_GOLDEN);
    int32_t hu = (int32_t)(r >> 40);      /* 24 bits: radius uniform */
    int32_t hv = (int32_t)(r & 0xFFFFFF); /* 24 bits: angle = 2 pi hv / 2^24 */
    /* u1 in (0, 1]; ln u1 = k ln 2 + 2 atanh((m-1)/(m+1)), m in [sqrt(.5), sqrt(2)) */
    float u1 = SM_FMUL((float)(hu + 1), 5.9604645e-8f);
    uint32_t ub = sm_f32_bits(u1), mb = ub & 0x007FFFFFu;
    int32_t big = mb > 0x3504F3u; /* mantissa above sqrt(2) */
    int32_t ke = (int32_t)(ub >> 23) - 127 + big;
    float m = sm_bits_f32(mb | ((uint32_t)(127 - big) << 23));
    float sx = SM_FDIV(SM_FSUB(m, 1.0f), SM_FADD(m, 1.0f)), s2 = SM_FMUL(sx, sx);
    float t = SM_FADD(0.14285714f, SM_FMUL(s2, 0.11111111f));
    t = SM_FADD(0.2f, SM_FMUL(s2, t));
    t = SM_FADD(0.33333333f, SM_FMUL(s2, t));
    t = SM_FADD(1.0f, SM_FMUL(s2, t));
    float ln = SM_FADD(SM_FMUL(SM_FMUL(2.0f, sx), t), SM_FMUL((float)ke, 0.69314718f));
    /* radius sqrt(-2 ln u1) = x * rsqrt(x): bit-trick guess + 3 Newton steps; u1 = 1 gives
     * x = 0, which the 1e-30 keeps finite (any other x is >= 1e-7 and unchanged by it) */
    float x = SM_FADD(SM_FMUL(-2.0f, ln), 1e-30f);
    float y = sm_bits_f32(0x5F3759DFu - (sm_f32_bits(x) >> 1));
    for (int i = 0; i < 3; i++) y = SM_FMUL(y, SM_FSUB(1.5f, SM_FMUL(SM_FMUL(SM_FMUL(0.5f, x), y), y)));
    float rad = SM_FMUL(x, y);
    /* nearest quarter turn q in 0..4 and remainder a in [-pi/4, pi/4): (pi/2) / 2^22 a step */
    int32_t q = (hv + (1 << 21)) >> 22;
    float a = SM_FMUL((float)(hv - (q << 22)), 3.7450702e-7f);
    float a2 = SM_FMUL(a, a);
    float ps = SM_FADD(-1.9841270e-4f, SM_FMUL(a2, 2.7557319e-6f));
    ps = SM_FADD(8.3333333e-3f, SM_FMUL(a2, ps));
    ps = SM_FADD(-1.6666667e-1f, SM_FMUL(a2, ps));
    float sn = SM_FMUL(a, SM_FADD(1.0f, SM_FMUL(a2, ps)));
    float pc = SM_FADD(-1.3888889e-3f, SM_FMUL(a2, 2.4801587e-5f));
    pc = SM_FADD(4.1666667e-2f, SM_FMUL(a2, pc));
    pc = SM_FADD(-0.5f, SM_FMUL(a2, pc));
    float cs = SM_FADD(1.0f, SM_FMUL(a2, pc));
    /* rotate by q quarter turns: swap for odd q, then the signs of cos and sin */
    uint32_t swap = 0u - (uint32_t)(q & 1);
    uint32_t cb = (sm_f32_bits(cs) & ~swap) | (sm_f32_bits(sn) & swap);
    uint32_t sb = (sm_f32_bits(sn) & ~swap) | (sm_f32_bits(cs) & swap);
    *z0 = SM_FMUL(rad, sm_bits_f32(cb ^ ((uint32_t)(((q + 1) >> 1) & 1) << 31))); /* r cos(q pi/2 + a) */
    *z1 = SM_FMUL(rad, sm_bits_f32(sb ^ ((uint32_t)((q >> 1) & 1) << 31)));       /* r sin(q pi/2 + a) */
}

#endif
