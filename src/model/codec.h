/* codec.h: number formats shared by CPU and GPU code (docs/model.md sections 3 and 7).
 *
 * bf16 <-> f32 (round to nearest even), fp8 e4m3 (OCP "fn": no infinities, 0x7F/0xFF NaN,
 * max 448), e2m1 (4-bit float: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives), e8m0 (power-of-two
 * scale byte, 0xFF NaN) and the MXFP4 block quantizer with the "even" amax rule of the Quark
 * and AITER exports.  Header-only and free of libc beyond math, so .cu files include it too
 * (functions are __host__ __device__ there).  This is the one definition of the block layout,
 * value table and rounding rule: the loader, the reference and the kernels all use it.
 * We rejected per-backend copies: two tables drift, and a drift here is silent.
 */
#ifndef SM_CODEC_H
#define SM_CODEC_H
#include <stdint.h>
#include <string.h>
#include <math.h>

#ifdef __CUDACC__
#define SM_HD __host__ __device__ __forceinline__
#else
#define SM_HD static inline
#endif

#define SM_MX_BLOCK 32 /* values per e8m0 scale, along the contraction axis */

SM_HD uint32_t sm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
SM_HD float sm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- bf16 ---- */
/* f32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN. */
SM_HD uint16_t sm_f32_to_bf16(float f) {
    uint32_t u = sm_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
SM_HD float sm_bf16_to_f32(uint16_t h) { return sm_bits_f32((uint32_t)h << 16); }
/* r16(x): round to bf16 and back (docs/model.md section 3). */
SM_HD float sm_r16(float f) { return sm_bf16_to_f32(sm_f32_to_bf16(f)); }

/* ---- fp8 e4m3 (OCP E4M3FN): bias 7, 3 mantissa bits, subnormals, no inf ---- */
SM_HD float sm_e4m3_to_f32(uint8_t b) {
    uint32_t s = b >> 7, ex = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (ex == 15u && m == 7u) return sm_bits_f32(0x7FC00000u | (s << 31));
    if (ex == 0) v = (float)m * 0.001953125f; /* m * 2^-9 */
    else v = sm_bits_f32(((ex + 120u) << 23) | (m << 20));
    return s ? -v : v;
}
/* f32 -> e4m3, round to nearest even, saturating to +-448 (ours: scaled exports never
 * exceed it); NaN -> 0x7F. */
SM_HD uint8_t sm_f32_to_e4m3(float f) {
    uint32_t u = sm_f32_bits(f);
    uint8_t s = (uint8_t)((u >> 31) << 7);
    float a = fabsf(f);
    if (a != a) return 0x7F;
    if (a >= 448.0f) return s | 0x7E;
    if (a < 0.015625f) { /* below 2^-6: subnormal grid of step 2^-9 */
        float q = a * 512.0f;                      /* exact */
        float r = rintf(q);                        /* nearest even (default mode) */
        return s | (uint8_t)r;                     /* r <= 8 -> 8 is the first normal, encodes as 0x08 */
    }
    uint32_t ua = sm_f32_bits(a);
    uint32_t lsb = (ua >> 20) & 1u;
    ua += 0x7FFFFu + lsb;                          /* round mantissa to 3 bits, nearest even */
    uint32_t ex = (ua >> 23) - 120u, m = (ua >> 20) & 7u;
    if (ex > 15u || (ex == 15u && m == 7u)) return s | 0x7E;
    return s | (uint8_t)((ex << 3) | m);
}

/* ---- e2m1 ---- */
/* The value of every code 0..15 (bit 3 the sign; code 8 is -0): the one e2m1 table, as an
 * initializer so host and device code alike can hold it in a local array. */
#define SM_E2M1_VALUES                                                                        \
    {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f}
/* Value of code c in 0..15 (bit 3 sign). */
SM_HD float sm_e2m1_to_f32(unsigned c) {
    const float v[16] = SM_E2M1_VALUES;
    return v[c & 15u];
}
/* f32 -> e2m1 code, nearest with ties to the even code (0, 2, 4, 6), saturating at +-6.
 * Midpoints: .25 .75 1.25 1.75 2.5 3.5 5. */
SM_HD unsigned sm_f32_to_e2m1(float x) {
    unsigned s = (sm_f32_bits(x) >> 31) ? 8u : 0u;
    float a = fabsf(x);
    unsigned c;
    if (a <= 0.25f) c = 0;          /* tie .25 -> 0 (even) */
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;     /* tie .75 -> 1.0, tie 1.25 -> 1.0 */
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;      /* tie 1.75 -> 2, tie 2.5 -> 2 */
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;      /* tie 3.5 -> 4, tie 5 -> 4 */
    else c = 7;                     /* saturate (also inf) */
    if (a != a) c = 7;              /* NaN: saturate (inputs are finite in practice) */
    return c ? (s | c) : 0u;        /* -0 encodes as +0 */
}

/* ---- e8m0 ---- */
SM_HD int sm_e8m0_is_nan(uint8_t b) { return b == 0xFF; }
/* 2^(b-127) for b in 0..254 (b = 0 gives 2^-127, a float subnormal). */
SM_HD float sm_e8m0_to_f32(uint8_t b) {
    if (b == 0) return sm_bits_f32(0x00400000u);
    if (b == 0xFF) return sm_bits_f32(0x7FC00000u);
    return sm_bits_f32((uint32_t)b << 23);
}

/* ---- MXFP4 blocks ---- */
/* Scale byte of a block by the "even" rule: amax' = bits(amax) rounded up at mantissa bit 21
 * and truncated to a power of two, e = floor(log2(amax')) - 2 clamped to [-127, 127]. */
SM_HD uint8_t sm_mx_scale_byte(float amax) {
    uint32_t u = (sm_f32_bits(amax) + 0x200000u) & 0xFF800000u;
    int ex = (int)((u >> 23) & 0xFFu);
    int e = (ex == 0) ? -127 : ex - 127 - 2;
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}
/* 2^-e as a float for scale byte b (e = b - 127 in [-127, 127]): exponent field 254 - b (b = 254
 * gives the subnormal 2^-127); x * 2^-e rounds exactly like ldexpf(x, -e). */
SM_HD float sm_e8m0_inv(uint8_t b) {
    return (b == 254) ? sm_bits_f32(0x00400000u) : sm_bits_f32((uint32_t)(254 - b) << 23);
}
/* Quantize 32 consecutive values x[0..31] into 16 packed bytes q (element 2i in the LOW
 * nibble of q[i]) and return the scale byte.  An all-zero block: byte 0, zero codes. */
SM_HD uint8_t sm_mx_quantize_block(const float *x, uint8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < SM_MX_BLOCK; i++) { float a = fabsf(x[i]); if (a > amax) amax = a; }
    if (amax == 0.0f) { for (int i = 0; i < SM_MX_BLOCK / 2; i++) q[i] = 0; return 0; }
    uint8_t b = sm_mx_scale_byte(amax);
    float inv = sm_e8m0_inv(b);
    for (int i = 0; i < SM_MX_BLOCK / 2; i++) {
        unsigned lo = sm_f32_to_e2m1(x[2 * i] * inv);
        unsigned hi = sm_f32_to_e2m1(x[2 * i + 1] * inv);
        q[i] = (uint8_t)(lo | (hi << 4));
    }
    return b;
}
/* The value of x rounded to MXFP4 under scale byte b (e = b - 127): e2m1(x / 2^e) x 2^e, the
 * value of the code sm_mx_quantize_block gives x in a block of byte b (+0 for a zero code).
 * Without branches or the code table, for the kernels that round activations (W4A4,
 * docs/model.md section 6): the e2m1 grid has step 2^(max(ey, 0) - 1) for y = |x| / 2^e in
 * binade ey (1/2 below 2, 1 below 4, 2 up to 8), so adding and subtracting C = 2^(max(ey, 0) + 22),
 * whose f32 ulp is that step, rounds y to the grid with ties to the even code; then saturate
 * at 6.  For y >= 2^106 C's bits leave the finite range (inf, or a wrapped tiny negative) and
 * the sum is NaN or y itself: fminf still gives 6.  tests/test_w4a4.c checks it against the
 * codes for every bf16 value and byte. */
SM_HD float sm_mx_round_value(float x, uint8_t b) {
    const float y = fabsf(x * sm_e8m0_inv(b));
    const uint32_t ey = sm_f32_bits(y) & 0x7F800000u;
    const float c = sm_bits_f32((ey > 0x3F800000u ? ey : 0x3F800000u) + (22u << 23));
    const float q = fminf((y + c) - c, 6.0f);
    return (copysignf(q, x) + 0.0f) * sm_e8m0_to_f32(b);
}
/* Element j of a packed row (two codes a byte, low nibble first). */
SM_HD unsigned sm_mx_code(const uint8_t *q, int64_t j) {
    uint8_t b = q[j >> 1];
    return (j & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 15u);
}
/* Dequantize n values (n % 32 == 0) of one row: q [n/2] packed codes, s [n/32] scale bytes;
 * value = e2m1(code) x 2^(s - 127), exact.  The one CPU dequantizer (loader, shards, the CPU
 * reference's weight tiles): block by block, a byte (two codes) at a time from the one table,
 * a loop gcc vectorizes.  A partial last block (n % 32 != 0) is decoded value by value. */
SM_HD void sm_mx_dequantize_row(const uint8_t *q, const uint8_t *s, int64_t n, float *out) {
    const float v[16] = SM_E2M1_VALUES;
    const int64_t nb = n / SM_MX_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        const float sc = sm_e8m0_to_f32(s[b]);
        const uint8_t *qb = q + b * (SM_MX_BLOCK / 2);
        float *ob = out + b * SM_MX_BLOCK;
        for (int j = 0; j < SM_MX_BLOCK / 2; j++) {
            ob[2 * j] = v[qb[j] & 15u] * sc;  /* element 2j: the low nibble */
            ob[2 * j + 1] = v[qb[j] >> 4] * sc;
        }
    }
    for (int64_t j = nb * SM_MX_BLOCK; j < n; j++) out[j] = v[sm_mx_code(q, j)] * sm_e8m0_to_f32(s[j >> 5]);
}
/* Quantize a row of n values (n % 32 == 0): q [n/2], s [n/32]. */
SM_HD void sm_mx_quantize_row(const float *x, int64_t n, uint8_t *q, uint8_t *s) {
    for (int64_t b = 0; b < n / SM_MX_BLOCK; b++) s[b] = sm_mx_quantize_block(x + b * SM_MX_BLOCK, q + b * (SM_MX_BLOCK / 2));
}

#endif
