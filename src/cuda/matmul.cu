/* matmul.cu: y = r16(x W^T) for the dense projections, and the stock-path context.
 *
 * Few rows (decode / verify, n <= 128): the weight-streaming tensor-core core of common.cuh
 * reads W once (16-byte streaming loads, one slab of 16 rows x 256 bytes per warp in flight),
 * with the tokens as the mma N side ("swap AB"); when the row tiles alone cannot fill the GPU
 * the k range is split over blocks, partial sums go to the context workspace and a second
 * kernel adds them in split order (deterministic: no atomics, so replicated tensors stay
 * bit-identical across ranks).  Many rows (prefill): cuBLAS bf16 GEMM with f32 compute and
 * bf16 output, i.e. r16 of an f32 accumulation.  The router's f32-weight matmul is a small
 * register-tiled FFMA kernel (f32 x f32 must stay f32 for exact expert selection).
 * We rejected cuBLAS for the few-row case: at n = 8 its GEMM kernels read W at a fraction of
 * bandwidth, and a GEMV-style CUDA-core kernel is instruction bound at n >= 16.
 */
#include "common.cuh"
#include "kernels.h"

/* ---- context ---- */

size_t sm_cuda_ws_bytes(const sm_config *c, int max_rows) {
    size_t b = (size_t)64 << 20;
    if (c && max_rows > 0) {
        /* logits argmax partials: (value, id) per 64-row block of lm_head per row of a chunk */
        size_t lg = (size_t)sm_cdiv(c->V, SM_MM_ROWS) * (max_rows < 128 ? max_rows : 128) * 8;
        /* router logits partials: up to 16 splits of [rows, E] */
        size_t rt = (size_t)16 * max_rows * c->E * 4;
        if (lg > b) b = lg;
        if (rt > b) b = rt;
    }
    return b;
}

int sm_cuda_ctx_init(sm_cuda_ctx *c, int device, size_t ws_bytes, sm_err *e) {
    memset(c, 0, sizeof *c);
    c->device = device;
    SM_CUDA_CHECK(cudaSetDevice(device));
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&c->num_sms, cudaDevAttrMultiProcessorCount, device));
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        return sm_errf(e, "cublasCreate failed (device %d)", device);
    }
    c->blas_ws_bytes = (size_t)32 << 20;
    c->ws_bytes = ws_bytes ? ws_bytes : ((size_t)64 << 20);
    cudaError_t r1 = cudaMalloc(&c->blas_ws, c->blas_ws_bytes);
    cudaError_t r2 = r1 == cudaSuccess ? cudaMalloc(&c->ws, c->ws_bytes) : r1;
    if (r1 != cudaSuccess || r2 != cudaSuccess) {
        size_t want = c->blas_ws_bytes + c->ws_bytes;
        sm_cuda_ctx_free(c);
        return sm_errf(e, "cudaMalloc of %zu bytes of stock-path workspace failed on device %d: %s",
                       want, device, cudaGetErrorString(r1 != cudaSuccess ? r1 : r2));
    }
    return 0;
}

void sm_cuda_ctx_free(sm_cuda_ctx *c) {
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_ws) SM_CUDA_CHECK_PRINT(cudaFree(c->blas_ws));
    if (c->ws) SM_CUDA_CHECK_PRINT(cudaFree(c->ws));
    c->blas = NULL;
    c->blas_ws = c->ws = NULL;
    c->blas_ws_bytes = c->ws_bytes = 0;
}

/* ---- few-row bf16 matmul ---- */

/* EPI 0: store r16 into y [n, m]; EPI 1: store f32 partials part [gridDim.y][n][m]. */
template <int NT, int EPI>
__global__ void __launch_bounds__(SM_MM_WARPS * 32)
mm_small_kernel(const uint16_t *__restrict__ x, int n, int k, const uint16_t *__restrict__ W,
                int m, int cps, uint16_t *__restrict__ y, float *__restrict__ part) {
    extern __shared__ uint4 xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * SM_MM_ROWS + warp * 16;
    const int kc = k >> 5, c0 = blockIdx.y * cps, c1 = min(c0 + cps, kc);
    float acc[NT][4];
    /* C = W rows x tokens over this block's k range */
    sm_mm_core<NT>(x, n, k, W, m, row0, c0, c1, xs, acc);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = row0 + g + (i >> 1) * 8, tok = nt * 8 + 2 * t + (i & 1);
            if (row >= m || tok >= n) continue;
            if (EPI == 0) y[(size_t)tok * m + row] = sm_tobf(acc[nt][i]);
            else part[((size_t)blockIdx.y * n + tok) * m + row] = acc[nt][i];
        }
    }
}

/* y = r16(sum over splits, in split order) of part [S][count]. */
__global__ void mm_reduce_kernel(const float *__restrict__ part, int S, size_t count, uint16_t *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float a = part[i];
        for (int s = 1; s < S; s++) a += part[(size_t)s * count + i];
        y[i] = sm_tobf(a);
    }
}
/* Same, f32 output (router logits). */
__global__ void mm_reduce_f32_kernel(const float *__restrict__ part, int S, size_t count, float *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float a = part[i];
        for (int s = 1; s < S; s++) a += part[(size_t)s * count + i];
        y[i] = a;
    }
}

template <int NT>
static int mm_small_launch(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                           uint16_t *y, cudaStream_t st, sm_err *e) {
    const int bm = sm_cdiv(m, SM_MM_ROWS), kc = k / 32;
    /* split k until the grid holds about `target` blocks, each split >= 2 slabs */
    const int target = c->num_sms * (NT >= 8 ? 2 : 4);
    int S = sm_cdiv(target, bm);
    int smax = sm_cdiv(kc, 2 * SM_MM_CPS);
    if (S > smax) S = smax;
    size_t per = (size_t)n * m * sizeof(float);
    if (S > 1 && (size_t)S * per > c->ws_bytes) S = (int)(c->ws_bytes / per);
    if (S < 1) S = 1;
    int cps = sm_cdiv(sm_cdiv(kc, S), SM_MM_CPS) * SM_MM_CPS;
    S = sm_cdiv(kc, cps); /* every split non-empty */
    const size_t smem = SM_MM_SMEM(NT);
    dim3 grid(bm, S);
    if (S == 1) {
        SM_CUDA_CHECK(cudaFuncSetAttribute(mm_small_kernel<NT, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        mm_small_kernel<NT, 0><<<grid, SM_MM_WARPS * 32, smem, st>>>(x, n, k, W, m, cps, y, NULL);
        SM_LAUNCH_CHECK("mm_small_kernel");
        return 0;
    }
    float *part = (float *)c->ws;
    SM_CUDA_CHECK(cudaFuncSetAttribute(mm_small_kernel<NT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    mm_small_kernel<NT, 1><<<grid, SM_MM_WARPS * 32, smem, st>>>(x, n, k, W, m, cps, NULL, part);
    SM_LAUNCH_CHECK("mm_small_kernel");
    size_t count = (size_t)n * m;
    int rb = (int)((count + 255) / 256);
    if (rb > c->num_sms * 8) rb = c->num_sms * 8;
    mm_reduce_kernel<<<rb, 256, 0, st>>>(part, S, count, y);
    SM_LAUNCH_CHECK("mm_reduce_kernel");
    return 0;
}

static int mm_check(const char *who, const uint16_t *x, int n, int k, const void *W, int m, const void *y, sm_err *e) {
    if (n < 0 || k <= 0 || m <= 0) return sm_errf(e, "%s: bad shape n=%d k=%d m=%d", who, n, k, m);
    if (k % 32) return sm_errf(e, "%s: k=%d is not a multiple of 32", who, k);
    if (!x || !W || !y) return sm_errf(e, "%s: NULL pointer (x, W or y)", who);
    if (!sm_aligned(x, 16) || !sm_aligned(W, 16)) return sm_errf(e, "%s: x or W not 16-byte aligned", who);
    return 0;
}

int sm_k_mm_small(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                  uint16_t *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm_small", x, n, k, W, m, y, e)) return -1;
    if (n > SM_MM_SMALL_MAX) return sm_errf(e, "sm_k_mm_small: n=%d rows > %d", n, SM_MM_SMALL_MAX);
    if (n == 0) return 0;
    if (n <= 8) return mm_small_launch<1>(c, x, n, k, W, m, y, st, e);
    if (n <= 16) return mm_small_launch<2>(c, x, n, k, W, m, y, st, e);
    if (n <= 32) return mm_small_launch<4>(c, x, n, k, W, m, y, st, e);
    if (n <= 64) return mm_small_launch<8>(c, x, n, k, W, m, y, st, e);
    return mm_small_launch<16>(c, x, n, k, W, m, y, st, e);
}

int sm_k_mm_blas(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                 uint16_t *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm_blas", x, n, k, W, m, y, e)) return -1;
    if (n == 0) return 0;
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: Y^T [m, n] = W [m, k] (row-major = (k x m)^T) x X^T [k, n] */
    SM_CUBLAS_CHECK(cublasSetStream(c->blas, st));
    SM_CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes));
    SM_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_16BF, k,
                                 x, CUDA_R_16BF, k, &zero, y, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    return 0;
}

int sm_k_mm(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m,
            uint16_t *y, cudaStream_t st, sm_err *e) {
    if (n <= SM_MM_SMALL_MAX) return sm_k_mm_small(c, x, n, k, W, m, y, st, e);
    return sm_k_mm_blas(c, x, n, k, W, m, y, st, e);
}

/* ---- f32-weight matmul (router) ---- */
/* Block tile: 64 rows of W x 32 tokens, 256 threads, each 4 rows x 2 tokens; k in slabs of 32
 * through shared memory (rows padded to 33 floats: conflict-free column reads). */
#define F32_TM 64
#define F32_TN 32
#define F32_KS 32

__global__ void __launch_bounds__(256)
mm_f32w_kernel(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W, int m,
               int kps, float *__restrict__ out) {
    __shared__ float ws_[F32_TM][F32_KS + 1];
    __shared__ float xs_[F32_TN][F32_KS + 1];
    const int tid = threadIdx.x, tr = tid & 15, tt = tid >> 4;
    const int m0 = blockIdx.x * F32_TM, n0 = blockIdx.y * F32_TN;
    const int kb = blockIdx.z * kps, ke = min(kb + kps, k);
    float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int k0 = kb; k0 < ke; k0 += F32_KS) {
        /* stage W [64 rows][32 k] (float4 loads) and x [32 tokens][32 k] (4 bf16 loads) */
        for (int i = tid; i < F32_TM * (F32_KS / 4); i += 256) {
            const int r = i >> 3, q4 = (i & 7) * 4, kk = k0 + q4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (m0 + r < m && kk < ke) v = *(const float4 *)(W + (size_t)(m0 + r) * k + kk);
            ws_[r][q4] = v.x; ws_[r][q4 + 1] = v.y; ws_[r][q4 + 2] = v.z; ws_[r][q4 + 3] = v.w;
        }
        {
            const int r = tid >> 3, q4 = (tid & 7) * 4, kk = k0 + q4;
            uint2 v = make_uint2(0, 0);
            if (n0 + r < n && kk < ke) v = *(const uint2 *)(x + (size_t)(n0 + r) * k + kk);
            xs_[r][q4] = sm_bf_lo(v.x); xs_[r][q4 + 1] = sm_bf_hi(v.x);
            xs_[r][q4 + 2] = sm_bf_lo(v.y); xs_[r][q4 + 3] = sm_bf_hi(v.y);
        }
        __syncthreads();
        /* acc += W tile x x tile^T, in k order */
#pragma unroll 8
        for (int kk = 0; kk < F32_KS; kk++) {
            float wv[4], xv[2];
#pragma unroll
            for (int i = 0; i < 4; i++) wv[i] = ws_[tr + 16 * i][kk];
#pragma unroll
            for (int j = 0; j < 2; j++) xv[j] = xs_[tt + 16 * j][kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
        }
        __syncthreads();
    }
    /* out [gridDim.z][n][m] (split partials, or y itself when there is one split) */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int row = m0 + tr + 16 * i, tok = n0 + tt + 16 * j;
            if (row < m && tok < n) out[((size_t)blockIdx.z * n + tok) * m + row] = acc[i][j];
        }
}

int sm_k_mm_f32w(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const float *W, int m,
                 float *y, cudaStream_t st, sm_err *e) {
    if (n < 0 || k <= 0 || m <= 0) return sm_errf(e, "sm_k_mm_f32w: bad shape n=%d k=%d m=%d", n, k, m);
    if (k % 4) return sm_errf(e, "sm_k_mm_f32w: k=%d is not a multiple of 4", k);
    if (!x || !W || !y) return sm_errf(e, "sm_k_mm_f32w: NULL pointer (x, W or y)");
    if (!sm_aligned(x, 8) || !sm_aligned(W, 16)) return sm_errf(e, "sm_k_mm_f32w: x not 8-byte or W not 16-byte aligned");
    if (n == 0) return 0;
    const int bm = sm_cdiv(m, F32_TM), bn = sm_cdiv(n, F32_TN);
    /* split k so the grid holds about 2 blocks per SM, each split >= 4 slabs */
    int S = sm_cdiv(2 * c->num_sms, bm * bn);
    int smax = sm_cdiv(k, 4 * F32_KS);
    if (S > smax) S = smax;
    size_t per = (size_t)n * m * sizeof(float);
    if (S > 1 && (size_t)S * per > c->ws_bytes) S = (int)(c->ws_bytes / per);
    if (S > 65535) S = 65535;
    if (S < 1) S = 1;
    int kps = sm_cdiv(sm_cdiv(k, S), F32_KS) * F32_KS;
    S = sm_cdiv(k, kps);
    dim3 grid(bm, bn, S);
    float *out = S == 1 ? y : (float *)c->ws;
    mm_f32w_kernel<<<grid, 256, 0, st>>>(x, n, k, W, m, kps, out);
    SM_LAUNCH_CHECK("mm_f32w_kernel");
    if (S > 1) {
        size_t count = (size_t)n * m;
        int rb = (int)((count + 255) / 256);
        if (rb > c->num_sms * 8) rb = c->num_sms * 8;
        mm_reduce_f32_kernel<<<rb, 256, 0, st>>>((const float *)c->ws, S, count, y);
        SM_LAUNCH_CHECK("mm_reduce_f32_kernel");
    }
    return 0;
}
