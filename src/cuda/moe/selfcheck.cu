/* selfcheck.cu: the self-check of the dequantizers against codec.h, on the device: every
 * e2m1 code x every e8m0 scale byte through the packed word and scale word the matmul reads,
 * every e4m3 byte x several row scales, and the MXFP4 bit layout a permutation (host).
 * We rejected checking on the host: the device conversion instructions are what run.
 */
#include "cuda/common.cuh"
#include "cuda/moe/geom.cuh"
#include "cuda/moe/dequant.cuh"

__global__ void moe_selfcheck_kernel(int *bad) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u < 16 * 255) {
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
    } else if (u < 16 * 255 + 256 * 4) {
        /* FP8: byte x row scale, r16(e4m3 * s) */
        const int v = u - 16 * 255, byte = v & 255, si = v >> 8;
        const float scales[4] = {1.0f, 0.0123f, 3.7e-3f, 250.0f};
        if (byte == 0x7F || byte == 0xFF) return;
        const uint32_t two = (uint32_t)byte | ((uint32_t)((byte * 7 + 1) & 0x7E) << 8);
        const uint32_t got = moe_dq_fp8(two, scales[si]);
        const uint16_t r0 = sm_f32_to_bf16(sm_e4m3_to_f32((uint8_t)byte) * scales[si]);
        const uint16_t r1 = sm_f32_to_bf16(sm_e4m3_to_f32((uint8_t)((byte * 7 + 1) & 0x7E)) * scales[si]);
        if ((got & 0xFFFFu) != r0 || (got >> 16) != r1) atomicAdd(bad, 1);
    }
}

extern "C" int sm_cuda_moe_selfcheck(cudaStream_t st, sm_err *e) {
    /* host: the MXFP4 bit layout is a permutation of the 32 bits */
    uint32_t seen = 0;
    int bad = 0;
    for (int i = 0; i < 4; i++)
        for (int hf = 0; hf < 2; hf++)
            for (int b = 0; b < 4; b++) {
                const uint32_t bit = 1u << moe_mx_src(i, hf, b);
                if (seen & bit) bad++;
                seen |= bit;
            }
    if (seen != 0xFFFFFFFFu) bad++;
    int *d = NULL;
    SM_CUDA_CHECK(cudaMalloc((void **)&d, sizeof(int)));
    cudaError_t rc = cudaMemsetAsync(d, 0, sizeof(int), st);
    if (rc == cudaSuccess) {
        moe_selfcheck_kernel<<<(16 * 255 + 256 * 4 + 255) / 256, 256, 0, st>>>(d);
        rc = cudaGetLastError();
    }
    int dbad = 0;
    if (rc == cudaSuccess) rc = cudaMemcpyAsync(&dbad, d, sizeof(int), cudaMemcpyDeviceToHost, st);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(st);
    cudaFree(d);
    if (rc != cudaSuccess) return sm_errf(e, "cuda moe selfcheck: %s", cudaGetErrorString(rc));
    return bad + dbad;
}
