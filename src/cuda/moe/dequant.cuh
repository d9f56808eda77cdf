/* dequant.cuh: the in-register dequantizers of the expert weights (mma A operands) and the
 * MXFP4 bit layout they read, shared by the matmul body (mm.cuh), the repack (repack.cu,
 * which writes the layout) and the self-check (selfcheck.cu).
 *
 * Hopper has no e2m1 conversion instruction.  MXFP4: the nibble bits are stored so that one
 * mask (or a rotate + mask) puts sign at bit 15, exponent at bits 7-8 and mantissa at bit 6
 * of each bf16 half: the e2m1 value times 2^-126 (a bf16 subnormal for codes +-0.5); one
 * bf16x2 FMA by 2^(s-1) makes the exact value.  k is permuted inside each 128-k step so the
 * two halves of a register come from two different 32-blocks: one bf16x2 scale register
 * serves both halves, built from a packed scale word by one shift + mask.  Scales above 2^1
 * overflow the bf16 multiplier; an expert whose largest scale byte exceeds 128 stores every
 * scale lowered by c and the f32 result is multiplied by 2^c (moe_desc.mul).
 * FP8: the hardware e4m3x2 -> f16x2 conversion, then r16(e4m3 * row scale) in f32.
 * We rejected a shared-memory lookup table for e2m1 (a load per pair of weights) and the
 * shifts as integer multiplies (FMA pipe: measured slower, bench/moe.md).
 */
#ifndef SM_CUDA_MOE_DEQUANT_CUH
#define SM_CUDA_MOE_DEQUANT_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>
#include "cuda/common.cuh"

/* ---- MXFP4 bit layout: where bit b (0 mantissa, 1-2 exponent, 3 sign) of the value in half
 * hf of A register i lives in the stored 32-bit word.  Register i is recovered as
 *   0: w & M   1: rotl(w,4) & M   2: rotl(w,10) & M   3: rotl(w,6) & M1 | rotl(w,14) & M2
 * with M = bits {6,7,8,15} of each half (M1 = bit 6, M2 = bits 7,8,15): 9 instructions for
 * four bf16x2 registers (no 4 rotations of M tile 32 bits; this is the cheapest cover). */
#define MOE_M 0x81C081C0u
#define MOE_M1 0x00400040u
#define MOE_M2 0x81808180u
__host__ __device__ __forceinline__ int moe_mx_src(int i, int hf, int b) {
    int p = (b < 3 ? 6 + b : 15) + 16 * hf;
    switch (i) {
    case 0: return p;
    case 1: return (p - 4) & 31;
    case 2: return (p - 10) & 31;
    default: return ((p & 15) == 6) ? ((p - 6) & 31) : ((p - 14) & 31);
    }
}
/* Pack the 8 codes c[i][hf] of one word. */
__host__ __device__ __forceinline__ uint32_t moe_mx_pack(const unsigned c[4][2]) {
    uint32_t w = 0;
    for (int i = 0; i < 4; i++)
        for (int hf = 0; hf < 2; hf++)
            for (int b = 0; b < 4; b++) w |= (uint32_t)((c[i][hf] >> b) & 1u) << moe_mx_src(i, hf, b);
    return w;
}

/* ---- MXFP4 in the e4m3 placement (W4A4 on the FP8 tensor cores: the kernel format MOE_F_MX8).
 * An e2m1 code's bits (s e1 e0 m) at bits 7, 4, 3, 2 of a byte make the e4m3 byte of the same
 * value times 2^-6.  Per 32-block and tile a lane holds the 16 codes of its wgmma A fragment
 * (m64nNk32, 8-bit elements: a0 row g, k slots 4t..4t+3; a1 row g+8, the same slots; a2, a3
 * the slots 16+4t..) in two words: word cm holds a(2cm) in place (one LOP3) and a(2cm+1) at
 * bits 0 (m), 1 (e0), 6 (e1), 5 (s) of each byte, which (w << 2) & 0x8C.. | (w >> 2) & 0x10..
 * moves to 2, 3, 4, 7 (two shifts, two LOP3: five instructions for 8 codes).  Slot
 * 16 cm + 4t + c of a block holds k = 8c + 4cm + t, so a lane holds the same 16 (row, k) codes
 * of a block as in the bf16 placement above, in the same 16-byte chunk (sub q: blocks 2q,
 * 2q+1): the two placements are permutations of the bits of each chunk (moe_x8_chunk). */
#define MOE_X8_LO 0x9C9C9C9Cu   /* bits 7, 4, 3, 2 of each byte */
/* Bit of code bit b (0 m, 1 e0, 2 e1, 3 s) of register rho (0 in place, 1 moved) at byte c. */
__host__ __device__ __forceinline__ int moe_x8_src(int rho, int c, int b) {
    return 8 * c + (rho ? (b < 2 ? b : 8 - b) /* 0 1 6 5 */ : (b < 3 ? b + 2 : 7) /* 2 3 4 7 */);
}
/* The two A registers (rows g, g+8) of one stored word. */
__device__ __forceinline__ void moe_x8_regs(uint32_t w, uint32_t &lo, uint32_t &hi) {
    lo = w & MOE_X8_LO;
    hi = ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u);
}
/* One 16-byte chunk (tile X, sub q, lane (g, t)) from the bf16 placement to the e4m3 one
 * (to_x8 = 1) or back.  Chunk word j of the e4m3 placement is block 2q + (j >> 1), k-slot
 * half cm = j & 1; its register rho is row g + 8 rho, byte c holds k = 8c + 4cm + t.  In the
 * bf16 placement the same code is in word c (k16 step 4q + c), register i = 2cm + rho, half
 * hf = j >> 1 (moe_mx_src). */
__host__ __device__ __forceinline__ uint4 moe_x8_chunk(uint4 v, int to_x8) {
    const uint32_t in[4] = {v.x, v.y, v.z, v.w};
    uint32_t out[4] = {0u, 0u, 0u, 0u};
    for (int j = 0; j < 4; j++)
        for (int rho = 0; rho < 2; rho++)
            for (int c = 0; c < 4; c++)
                for (int b = 0; b < 4; b++) {
                    const int x8 = moe_x8_src(rho, c, b), mx = moe_mx_src(2 * (j & 1) + rho, j >> 1, b);
                    if (to_x8) out[j] |= ((in[c] >> mx) & 1u) << x8;
                    else out[c] |= ((in[j] >> x8) & 1u) << mx;
                }
    return make_uint4(out[0], out[1], out[2], out[3]);
}
/* The routes' side of MOE_F_MX8 (the B operand, mm.cuh): a route's 32-block of activations,
 * rounded to MXFP4, as 32 e4m3 codes in the slot order above and a factor: common.cuh's
 * sm_x8_* (its writers: the staging, moe_x8_entry; the pre-expert norm, ops/norm.cuh; stage
 * 1's epilogue). */

/* The weight scale of byte k of scale word sw (a stored byte bp, moe_repack_mxs_kernel: b + 126
 * - c) as the f32 factor 2^(bp - 241) = 2^(b - c - 127) x 2^12 (the 2^12 undoes the two 2^-6 of
 * the e4m3 operands): exponent field bp - 114, one PRMT and one IMAD (bp * 2^23 - 114 * 2^23);
 * exact for bp >= 115 (moe_build checks every matrix of a layer it lets run MX8). */
__device__ __forceinline__ float moe_x8_wscale(uint32_t sw, int k) {
    const uint32_t bp = __byte_perm(sw, 0u, 0x4440u | (uint32_t)k);
    uint32_t f;
    asm("mad.lo.u32 %0, %1, 8388608, -956301312;" : "=r"(f) : "r"(bp));
    return __uint_as_float(f);
}

/* ---- dequantizers ---- */
__device__ __forceinline__ uint32_t moe_u4(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
/* d = a * b (bf16x2), exact for our operands; -0 addend keeps the sign of zero products. */
__device__ __forceinline__ uint32_t moe_hmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}
/* Scale word [b'(g,blk0), b'(g+8,blk0), b'(g,blk1), b'(g+8,blk1)] -> bf16x2 multipliers
 * 2^(b'-127) for row g (lo: blk0, hi: blk1) and row g+8. */
__device__ __forceinline__ void moe_mx_mults(uint32_t sw, uint32_t &mg, uint32_t &mg8) {
    mg = (sw << 7) & 0x7F807F80u;
    mg8 = (sw >> 1) & 0x7F807F80u;
}
/* One stored word -> the four A registers of one k16 step. */
__device__ __forceinline__ void moe_dq_mx(uint32_t w, uint32_t mg, uint32_t mg8, uint32_t a[4]) {
    const uint32_t r0 = w & MOE_M;
    const uint32_t r1 = __funnelshift_l(w, w, 4) & MOE_M;
    const uint32_t r2 = __funnelshift_l(w, w, 10) & MOE_M;
    const uint32_t r3 = (__funnelshift_l(w, w, 6) & MOE_M1) | (__funnelshift_l(w, w, 14) & MOE_M2);
    a[0] = moe_hmul2(r0, mg);
    a[1] = moe_hmul2(r1, mg8);
    a[2] = moe_hmul2(r2, mg);
    a[3] = moe_hmul2(r3, mg8);
}
/* Two e4m3 bytes (lo = first) -> bf16x2 of r16(e4m3 * s) (f32 product, as codec/weights.h). */
__device__ __forceinline__ uint32_t moe_dq_fp8(uint32_t two, float s) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3);
    __half2 h;
    memcpy(&h, &hr, 4);
    const float2 f = __half22float2(h);
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
    uint32_t u;
    memcpy(&u, &b, 4);
    return u;
}

#endif
