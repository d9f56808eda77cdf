/* selfcheck.cu: checks of the device layout and dequantizers that need no reference model:
 * the self-check of the dequantizers against codec.h (every e2m1 code x every e8m0 scale
 * byte through the packed word and scale word the matmul reads, every e4m3 byte x several
 * row scales, the MXFP4 bit layout a permutation), and the readback of one expert matrix
 * from the device layout through the matmul's own dequantizers (tests compare it with the
 * checkpoint's rows).
 * We rejected reading the blob back and decoding it on the host: the host decoder would
 * restate the layout instead of exercising the device code that the matmul runs.
 */
#include "cuda/common.cuh"
#include "cuda/moe/geom.cuh"
#include "cuda/moe/dequant.cuh"

#define MOE_SC_MX (16 * 255)      /* MXFP4: code x scale byte */
#define MOE_SC_F8 (256 * 4)       /* FP8: byte x row scale */
#define MOE_SC_X8 (16 * 2 * 4)    /* MXFP4 in the e4m3 placement: code x register x byte */
#define MOE_SC_XS 255             /* its row factor: every stored scale byte */

__global__ void moe_selfcheck_kernel(int *bad) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= MOE_SC_MX + MOE_SC_F8 && u < MOE_SC_MX + MOE_SC_F8 + MOE_SC_X8) {
        /* the e4m3 placement: one code at (register rho, byte c), the word's other codes a
         * neighbour pattern; moe_x8_regs must give the e4m3 byte of e2m1(code) x 2^-6 there */
        const int v = u - MOE_SC_MX - MOE_SC_F8, code = v & 15, rho = (v >> 4) & 1, c = v >> 5;
        uint32_t w = 0;
        for (int r2 = 0; r2 < 2; r2++)
            for (int c2 = 0; c2 < 4; c2++) {
                const unsigned cd = (r2 == rho && c2 == c) ? (unsigned)code : (unsigned)(code * 7 + 3 * c2 + r2) & 15u;
                for (int b = 0; b < 4; b++) w |= ((cd >> b) & 1u) << moe_x8_src(r2, c2, b);
            }
        uint32_t lo, hi;
        moe_x8_regs(w, lo, hi);
        const uint8_t byte = (uint8_t)(((rho ? hi : lo) >> (8 * c)) & 0xFFu);
        if (sm_e4m3_to_f32(byte) != sm_e2m1_to_f32((uint8_t)code) * 0.015625f ||
            (sm_e2m1_to_f32((uint8_t)code) == 0.0f && byte != ((code & 8) ? 0x80 : 0)))
            atomicAdd(bad, 1);
    } else if (u >= MOE_SC_MX + MOE_SC_F8 + MOE_SC_X8 && u < MOE_SC_MX + MOE_SC_F8 + MOE_SC_X8 + MOE_SC_XS) {
        /* the row factor of a stored byte bp: 2^(bp - 241) wherever moe_build lets MX8 run */
        const int bp = u - (MOE_SC_MX + MOE_SC_F8 + MOE_SC_X8);
        for (int k = 0; k < 4; k++)
            if (bp >= 115 && moe_x8_wscale(((uint32_t)bp << (8 * k)) | ((uint32_t)(bp ^ 0x5A) << (8 * ((k + 1) & 3))), k) !=
                                 ldexpf(1.0f, bp - 241))
                atomicAdd(bad, 1);
    } else if (u < MOE_SC_MX) {
        /* MXFP4: code x scale byte, through the packed word and scale word the kernel reads */
        const unsigned code = (unsigned)(u & 15);
        const int b = u >> 4, c = b > 128 ? b - 128 : 0, bp = b + 126 - c;
        unsigned cs[4][2];
        for (int i = 0; i < 4; i++) { cs[i][0] = code; cs[i][1] = (code + 5u * (unsigned)i + 3u) & 15u; }
        const uint32_t w = moe_mx_pack(cs);
        const uint32_t sw = (uint32_t)bp | ((uint32_t)bp << 8) | ((uint32_t)bp << 16) | ((uint32_t)bp << 24);
        {
            uint32_t mg, mg8, r[4];
            moe_mx_mults(sw, mg, mg8);
            moe_dq_mx(w, mg, mg8, r);
            for (int i = 0; i < 4; i++)
                for (int hf = 0; hf < 2; hf++) {
                    const float got = ldexpf(__uint_as_float((hf ? (r[i] >> 16) : (r[i] & 0xFFFFu)) << 16), c);
                    const float ref = sm_e2m1_to_f32(cs[i][hf]) * sm_e8m0_to_f32((uint8_t)b);
                    if (__float_as_uint(got) != __float_as_uint(ref)) atomicAdd(bad, 1);
                }
        }
    } else if (u < MOE_SC_MX + MOE_SC_F8) {
        /* FP8: byte x row scale, r16(e4m3 * s) */
        const int v = u - MOE_SC_MX, byte = v & 255, si = v >> 8;
        const float scales[4] = {1.0f, 0.0123f, 3.7e-3f, 250.0f};
        if (byte == 0x7F || byte == 0xFF) return;
        const uint32_t two = (uint32_t)byte | ((uint32_t)((byte * 7 + 1) & 0x7E) << 8);
        const uint32_t got = moe_dq_fp8(two, scales[si]);
        const uint16_t r0 = sm_f32_to_bf16(sm_e4m3_to_f32((uint8_t)byte) * scales[si]);
        const uint16_t r1 = sm_f32_to_bf16(sm_e4m3_to_f32((uint8_t)((byte * 7 + 1) & 0x7E)) * scales[si]);
        if ((got & 0xFFFFu) != r0 || (got >> 16) != r1) atomicAdd(bad, 1);
    }
}

/* The mismatches of placement x8 (0: bf16, 1: e4m3) as a map of a word's 32 code bits: 0 when
 * they land on 32 distinct bits. */
static int moe_perm_bad(int x8) {
    uint32_t seen = 0;
    int bad = 0;
    for (int j = 0; j < 32; j++) {
        const int b = j & 3;
        const uint32_t bit = 1u << (x8 ? moe_x8_src(j >> 4, (j >> 2) & 3, b) : moe_mx_src(j >> 3, (j >> 2) & 1, b));
        if (seen & bit) bad++;
        seen |= bit;
    }
    return bad + (seen != 0xFFFFFFFFu);
}

extern "C" int sm_cuda_moe_selfcheck(cudaStream_t st, sm_err *e) {
    /* host: both MXFP4 placements are permutations of the 32 bits, and a chunk survives the
     * trip to the e4m3 placement and back */
    int bad = moe_perm_bad(0) + moe_perm_bad(1);
    uint32_t x = 0x9E3779B9u;
    for (int i = 0; i < 64; i++) {
        uint32_t w4[4];
        for (int j = 0; j < 4; j++) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; w4[j] = x; }
        const uint4 v = make_uint4(w4[0], w4[1], w4[2], w4[3]), r = moe_x8_chunk(moe_x8_chunk(v, 1), 0);
        if (r.x != v.x || r.y != v.y || r.z != v.z || r.w != v.w) bad++;
    }
    int *d = NULL;
    SM_CUDA_CHECK(cudaMalloc((void **)&d, sizeof(int)));
    cudaError_t rc = cudaMemsetAsync(d, 0, sizeof(int), st);
    if (rc == cudaSuccess) {
        moe_selfcheck_kernel<<<(MOE_SC_MX + MOE_SC_F8 + MOE_SC_X8 + MOE_SC_XS + 255) / 256, 256, 0, st>>>(d);
        rc = cudaGetLastError();
    }
    int dbad = 0;
    if (rc == cudaSuccess) rc = cudaMemcpyAsync(&dbad, d, sizeof(int), cudaMemcpyDeviceToHost, st);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(st);
    cudaFree(d);
    if (rc != cudaSuccess) return sm_errf(e, "cuda moe selfcheck: %s", cudaGetErrorString(rc));
    return bad + dbad;
}

/* ---- readback of one expert matrix through the dequantizers ---- */
/* Thread u covers the 16 bytes (pair P, step S, tile X, sub q, lane) exactly as the repack
 * kernel that wrote them (repack.cu) and decodes them as moe_compute does: out[row, k] =
 * (the bf16 A value) x 2^c, for every valid row and k. */
template <int F>
__global__ void moe_dequant_kernel(const uint8_t *__restrict__ blob, const moe_desc *__restrict__ desc, int x, int mat, int R,
                                   int K, int Ip, int npairs, int nsteps, int sb, float *__restrict__ out) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)npairs * nsteps * 128) return;
    const int gu = !mat;
    const int lane = (int)(u & 31), q = (int)((u >> 5) & 1), X = (int)((u >> 6) & 1);
    const long long ps = u >> 7;
    const int S = (int)(ps % nsteps), P = (int)(ps / nsteps), T = moe_pair_tile(P, X, gu, Ip);
    const int g = lane >> 2, t = lane & 3;
    const int rows[2] = {moe_raw_row(T * 16 + g, gu, R, Ip), moe_raw_row(T * 16 + g + 8, gu, R, Ip)};
    const moe_desc d = desc[x];
    const float mul = d.mul[mat];
    const uint8_t *blk = blob + d.w[mat] + (size_t)P * moe_pstride(nsteps, sb) + (size_t)S * sb;
    const uint4 v = *(const uint4 *)(blk + X * 1024 + q * 512 + lane * 16);
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    if (F == MOE_F_MX8) {
        /* word j: block 2q + (j >> 1), slot half cm = j & 1; register rho row g + 8 rho, byte c
         * k = 8c + 4cm + t; value = e4m3 x 2^-6 x the row factor (moe_x8_scale's) x 2^c */
        const uint32_t sw = *(const uint32_t *)(blk + 2048 + X * 64 + g * 8 + q * 4);
        for (int j = 0; j < 4; j++) {
            uint32_t r[2];
            moe_x8_regs(wd[j], r[0], r[1]);
            const int bk = 2 * q + (j >> 1), cm = j & 1;
            for (int rho = 0; rho < 2; rho++) {
                const float ws = moe_x8_wscale(sw, 2 * (bk & 1) + rho);
                for (int c = 0; c < 4; c++) {
                    const int row = rows[rho], k = S * 128 + bk * 32 + 8 * c + 4 * cm + t;
                    if (row >= 0 && k < K) out[(size_t)row * K + k] = sm_e4m3_to_f32((uint8_t)(r[rho] >> (8 * c))) * 0.015625f * ws * mul;
                }
            }
        }
    } else if (F == SM_EXP_MXFP4) {
        uint32_t mg, mg8;
        moe_mx_mults(*(const uint32_t *)(blk + 2048 + X * 64 + g * 8 + q * 4), mg, mg8);
        for (int s4 = 0; s4 < 4; s4++) {
            const int s = q * 4 + s4;
            uint32_t r[4];
            moe_dq_mx(wd[s4], mg, mg8, r);
            for (int i = 0; i < 4; i++)
                for (int hf = 0; hf < 2; hf++) {
                    const int row = rows[i & 1], k = S * 128 + (2 * (s >> 2) + hf) * 32 + (s & 3) * 8 + t + 4 * (i >> 1);
                    if (row >= 0 && k < K) out[(size_t)row * K + k] = sm_bf((uint16_t)(r[i] >> (16 * hf))) * mul;
                }
        }
    } else if (F == SM_EXP_FP8) {
        const float *fs = (const float *)(blob + d.s[mat]) + P * 32 + X * 16;
        for (int j = 0; j < 2; j++) {
            const int s = q * 2 + j;
            for (int i = 0; i < 4; i++) { /* word 2j: a0 a1; word 2j+1: a2 a3 */
                const int row = rows[i & 1];
                const uint32_t two = moe_dq_fp8(wd[2 * j + (i >> 1)] >> (16 * (i & 1)), fs[g + 8 * (i & 1)]);
                for (int hf = 0; hf < 2; hf++) {
                    const int k = S * 64 + s * 16 + 2 * t + hf + 8 * (i >> 1);
                    if (row >= 0 && k < K) out[(size_t)row * K + k] = sm_bf((uint16_t)(two >> (16 * hf))) * mul;
                }
            }
        }
    } else {
        for (int i = 0; i < 4; i++)
            for (int hf = 0; hf < 2; hf++) {
                const int row = rows[i & 1], k = S * 32 + q * 16 + 2 * t + 8 * (i >> 1) + hf;
                if (row >= 0 && k < K) out[(size_t)row * K + k] = sm_bf((uint16_t)(wd[i] >> (16 * hf))) * mul;
            }
    }
}

extern "C" int sm_cuda_moe_dequant(const sm_cuda_moe_layer *L, int x, int mat, float *out, cudaStream_t st, sm_err *e) {
    if (!L || !L->blob || !out) return sm_errf(e, "cuda moe dequant: layer not allocated or NULL output");
    if (x < 0 || x >= L->E || (mat != 0 && mat != 1))
        return sm_errf(e, "cuda moe dequant: expert %d outside [0, %d) or matrix %d not 0 / 1", x, L->E, mat);
    const moe_geom G = moe_geometry(L->fmt, L->Hm, L->I);
    const int R = mat ? L->Hm : 2 * L->I, K = mat ? L->I : L->Hm;
    const int npairs = mat ? G.p2 : G.p1, nsteps = mat ? G.ns2 : G.ns1;
    const unsigned blocks = (unsigned)(((long long)npairs * nsteps * 128 + 255) / 256);
    const uint8_t *blob = (const uint8_t *)L->blob;
    const moe_desc *desc = (const moe_desc *)L->desc;
    switch (sm_cuda_moe_kfmt(L)) {
    case MOE_F_MX8: moe_dequant_kernel<MOE_F_MX8><<<blocks, 256, 0, st>>>(blob, desc, x, mat, R, K, G.Ip, npairs, nsteps, G.sb, out); break;
    case MOE_F_MX4: /* SM_EXP_MXFP4's placement */
    case SM_EXP_MXFP4: moe_dequant_kernel<SM_EXP_MXFP4><<<blocks, 256, 0, st>>>(blob, desc, x, mat, R, K, G.Ip, npairs, nsteps, G.sb, out); break;
    case SM_EXP_FP8: moe_dequant_kernel<SM_EXP_FP8><<<blocks, 256, 0, st>>>(blob, desc, x, mat, R, K, G.Ip, npairs, nsteps, G.sb, out); break;
    case SM_EXP_BF16: moe_dequant_kernel<SM_EXP_BF16><<<blocks, 256, 0, st>>>(blob, desc, x, mat, R, K, G.Ip, npairs, nsteps, G.sb, out); break;
    default: return sm_errf(e, "cuda moe dequant: unknown expert format %d", L->fmt);
    }
    SM_LAUNCH_CHECK("moe_dequant_kernel");
    return 0;
}
