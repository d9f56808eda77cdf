/* matmul.cu: y = r16(x W^T) for the dense projections, the lm_head product of the logits, and
 * the stock-path context.
 *
 * Few rows (decode / verify, n <= 128), two weight-streaming tensor-core kernels:
 *  - the mma.sync core of common.cuh (64 rows of W a block, W straight into registers, k
 *    split over blocks with an ordered reduce kernel): only where the wgmma path is missing,
 *    or forced (tests).  At 64-128 rows it is bound by mma.sync issue, by each warp re-reading
 *    all of x from shared memory, and by every 64-row block re-reading all of x from L2 (2x
 *    the bytes of W at 128 rows): 18-21% of the read floor at 128 rows (bench/results.md).
 *  - the wgmma stream-K kernel below, the default at every n (62-68% at 128 rows for the
 *    8192-wide matrices, 94% for lm_head at 8 rows): one persistent block per SM (2 consumer warpgroups +
 *    1 producer warp), tiles of 128 * MT rows of W x N tokens (N = n rounded up to 8..128),
 *    k in stages of 64 (one 128-byte swizzled row) fed by TMA into an mbarrier ring, wgmma
 *    m64nNk16 with both operands in shared memory ("swap AB": W rows are the M side).  The
 *    (tile, k stage) units are cut evenly over the blocks ("stream-K"), so every SM streams
 *    the same number of bytes whatever the shape; a tile shared by several blocks is summed by
 *    its last arriving block, in block (= k) order: deterministic, no float atomics, so
 *    replicated tensors stay bit-identical across ranks.  x is re-read once per tile of W
 *    rows, not once per 64 rows.
 * Many rows (prefill): cuBLAS bf16 GEMM with f32 compute and bf16 output, i.e. r16 of an f32
 * accumulation.  The router's f32-weight matmul is an FFMA kernel, split-k GEMV style (f32 x f32
 * must stay f32 for exact expert selection).
 * We rejected cuBLAS for the few-row case (its GEMMs read W at a fraction of bandwidth at n = 8),
 * a fixed split-K grid for the wgmma kernel (4096- and 8192-row matrices give 16..80 tiles: a
 * grid of tiles x splits either leaves SMs idle or runs a second partial wave), and TMA
 * multicast of x over a cluster (the stream-K blocks do not share k ranges).
 */
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include <cuda.h>
#include <cudaTypedefs.h>

/* ---- context ---- */

#define WG_MAX_SMS 160          /* bound on multiprocessors used to size the default workspace */
#define WG_TILE_CNT_LEN 65536   /* arrival counters (tiles of one wgmma launch) */

size_t sm_cuda_ws_bytes(const sm_config *c, int max_rows) {
    size_t b = (size_t)64 << 20;
    if (c && max_rows > 0) {
        const size_t r = (size_t)(max_rows < 128 ? max_rows : 128);
        /* logits argmax partials: (value, id) per 64-row block of lm_head per row of a chunk,
         * then the wgmma kernel's partial tiles: 2 per block of at most 256 x 128 floats */
        size_t lg = (size_t)sm_cdiv(c->V, SM_MM_ROWS) * r * 8 + (size_t)2 * WG_MAX_SMS * 256 * 128 * 4 + 256;
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
    int major = 0;
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        return sm_errf(e, "cublasCreate failed (device %d)", device);
    }
    c->blas_ws_bytes = (size_t)32 << 20;
    c->ws_bytes = ws_bytes ? ws_bytes : ((size_t)64 << 20);
    c->tile_cnt_len = WG_TILE_CNT_LEN;
    cudaError_t r1 = cudaMalloc(&c->blas_ws, c->blas_ws_bytes);
    cudaError_t r2 = r1 == cudaSuccess ? cudaMalloc(&c->ws, c->ws_bytes) : r1;
    cudaError_t r3 = r2 == cudaSuccess ? cudaMalloc((void **)&c->tile_cnt, (size_t)c->tile_cnt_len * sizeof(unsigned)) : r2;
    if (r3 == cudaSuccess) r3 = cudaMemset(c->tile_cnt, 0, (size_t)c->tile_cnt_len * sizeof(unsigned));
    if (r3 != cudaSuccess) {
        size_t want = c->blas_ws_bytes + c->ws_bytes + (size_t)c->tile_cnt_len * sizeof(unsigned);
        sm_cuda_ctx_free(c);
        return sm_errf(e, "cudaMalloc of %zu bytes of stock-path workspace failed on device %d: %s",
                       want, device, cudaGetErrorString(r3));
    }
    /* the wgmma path needs a Hopper device and the driver's tensor-map encoder */
    if (major == 9) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            c->tma_encode = fn;
        cudaGetLastError();
    }
    return 0;
}

void sm_cuda_ctx_free(sm_cuda_ctx *c) {
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_ws) SM_CUDA_CHECK_PRINT(cudaFree(c->blas_ws));
    if (c->ws) SM_CUDA_CHECK_PRINT(cudaFree(c->ws));
    if (c->tile_cnt) SM_CUDA_CHECK_PRINT(cudaFree(c->tile_cnt));
    c->blas = NULL;
    c->blas_ws = c->ws = NULL;
    c->tile_cnt = NULL;
    c->tma_encode = NULL;
    c->blas_ws_bytes = c->ws_bytes = 0;
    c->tile_cnt_len = 0;
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
#pragma unroll 8
        for (int s = 1; s < S; s++) a += part[(size_t)s * count + i]; /* in split order; loads run ahead */
        y[i] = sm_tobf(a);
    }
}
/* Same, f32 output (router logits). */
__global__ void mm_reduce_f32_kernel(const float *__restrict__ part, int S, size_t count, float *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float a = part[i];
#pragma unroll 8
        for (int s = 1; s < S; s++) a += part[(size_t)s * count + i]; /* in split order; loads run ahead */
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

/* ---- wgmma stream-K kernel ----
 * Geometry: a tile is BM = 128 * MT rows of W (consumer warpgroup w owns rows 64*MT*w .. +64*MT,
 * one m64 wgmma tile per 64 rows) x N tokens; k goes in stages of WG_BK = 64 (128 bytes a row,
 * the span of the 128-byte swizzle).  A stage holds W [BM][64] then x [N][64], both as TMA
 * writes them with SWIZZLE_128B, which is the K-major layout wgmma reads (8-row groups of
 * 1024 bytes; the k16 step j starts 32 * j bytes into the row).  Rows of W >= m, tokens >= n
 * and k >= the contraction are zero-filled by TMA and dropped by the epilogue. */
#define WG_BK 64
#define WG_THREADS 384                 /* warpgroups 0, 1: consumers; warpgroup 2: producer (one thread) */
#define WG_SMEM_DYN (216 * 1024)       /* dynamic shared memory budget (static adds <= 9 KB) */
#define WG_BM(MT) (128 * (MT))
#define WG_STAGE(N, MT) (WG_BM(MT) * 128 + (N) * 128)
#define WG_ST_FIT(N, MT) ((WG_SMEM_DYN - 1024) / WG_STAGE(N, MT))
#define WG_ST(N, MT) (WG_ST_FIT(N, MT) > 8 ? 8 : WG_ST_FIT(N, MT))
#define WG_SMEM(N, MT) ((size_t)WG_ST(N, MT) * WG_STAGE(N, MT) + 1024)
#define WG_EPI_MM 0                    /* y = r16(acc) */
#define WG_EPI_LOGITS 1                /* softcap, mask, f32 logits, per-tile argmax */

typedef struct wg_args {
    int n, m, k;          /* tokens, rows of W, contraction */
    int ki;               /* k stages a tile: cdiv(k, 64) */
    int tiles;            /* row tiles: cdiv(m, BM) */
    int units;            /* tiles * ki: the (tile, stage) units cut evenly over the grid
                           * (units * (grid + 1) < 2^31: 32-bit index math, no 64-bit divisions) */
    uint16_t *y;          /* EPI_MM: bf16 [n, m] */
    float *part;          /* device [2 * gridDim.x][BM * N]: partial tiles, 2 slots a block */
    unsigned *cnt;        /* device [tiles]: arrivals at a shared tile, zero between launches */
    int vocab_used;       /* EPI_LOGITS: ids >= vocab_used are masked */
    float m_o, cap;       /* EPI_LOGITS: output multiplier, softcap (<= 0: none) */
    float *logits;        /* EPI_LOGITS: f32 [n, m], or NULL */
    float *pv;            /* EPI_LOGITS: f32 [tiles][n]: best value of each token in a tile */
    int *pi;              /* EPI_LOGITS: int32 [tiles][n]: its id */
} wg_args;

__device__ __forceinline__ uint32_t wg_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void wg_mbar_init(uint32_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_mbar_expect_tx(uint32_t bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wg_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Spin until the phase of parity `parity` of the barrier has completed. */
__device__ __forceinline__ void wg_mbar_wait(uint32_t bar, unsigned parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
/* 2-D TMA load of one box into shared memory, completing on `bar`, with an L2 policy. */
__device__ __forceinline__ void wg_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar, uint64_t pol) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "l"(pol) : "memory");
}
__device__ __forceinline__ uint64_t wg_policy_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t wg_policy_evict_last(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
/* Shared-memory matrix descriptor: K-major, 128-byte swizzle, 1024 bytes between 8-row groups. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int K> __device__ __forceinline__ void wg_wait(void) { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(K) : "memory"); }
/* Keep the compiler from moving accumulator accesses across the asynchronous wgmma window. */
__device__ __forceinline__ void wg_pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }
/* Barrier of the 256 consumer threads (the producer warp never joins). */
__device__ __forceinline__ void wg_cons_sync(void) { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
/* The block whose unit range [u0(b), u0(b+1)) holds unit u, for u0(b) = b * U / G. */
__device__ __forceinline__ int wg_block_of(int u, int G, int U) { return ((u + 1) * G + U - 1) / U - 1; }

/* d [N/2] += A (64 x 16, descriptor da) * B (16 x N, descriptor db), bf16 in, f32 accumulate. */
template <int N> __device__ __forceinline__ void wg_mma(float *d, uint64_t da, uint64_t db);
template <> __device__ __forceinline__ void wg_mma<8>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3"
                 "}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<16>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7"
                 "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<32>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<64>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<128>(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(1));
}

template <int N, int MT, int EPI>
__global__ void __launch_bounds__(WG_THREADS, 1)
wg_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, const wg_args a) {
    constexpr int BM = WG_BM(MT), ST = WG_ST(N, MT), AB = BM * 128, STG = WG_STAGE(N, MT), NR = N / 2;
    constexpr int RV = EPI == WG_EPI_LOGITS ? 8 : 1;
    extern __shared__ uint8_t wg_dyn[];
    __shared__ __align__(8) uint64_t full_bar[ST], empty_bar[ST];
    __shared__ int last_s;
    __shared__ float red_v[RV][N];
    __shared__ int red_i[RV][N];
    const uint32_t base = (wg_u32(wg_dyn) + 1023u) & ~1023u;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = gridDim.x, b = blockIdx.x;
    const int U = a.units, u0 = b * U / G, u1 = (b + 1) * U / G;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) {
            wg_mbar_init(wg_u32(&full_bar[s]), 1);
            wg_mbar_init(wg_u32(&empty_bar[s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (warp >= 8) {
        /* producer warpgroup: gives registers to the consumers; one thread walks the block's
         * units in order and keeps the ring full */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0) {
            const uint64_t pw = wg_policy_evict_first(), px = wg_policy_evict_last();
            int s = 0;
            unsigned ph = 0;
            for (int u = u0; u < u1; u++) {
                const int t = u / a.ki, kq = u - t * a.ki;
                if (u - u0 >= ST) wg_mbar_wait(wg_u32(&empty_bar[s]), ph ^ 1u); /* consumers freed it */
                const uint32_t fb = wg_u32(&full_bar[s]), dst = base + (uint32_t)(s * STG);
                wg_mbar_expect_tx(fb, STG);
                wg_tma_2d(dst, &tw, kq * WG_BK, t * BM, fb, pw);
                wg_tma_2d(dst + AB, &tx, kq * WG_BK, 0, fb, px);
                if (++s == ST) { s = 0; ph ^= 1u; }
            }
        }
    } else {
    /* consumers: warps 0-3 = warpgroup 0, 4-7 = warpgroup 1 */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int wg = warp >> 2, g = lane >> 2, t4 = lane & 3, ct = threadIdx.x;
    const int first_tile = u0 / a.ki;
    float acc[MT][NR];
    int s = 0;
    unsigned ph = 0;
    int u = u0;
    while (u < u1) {
        /* one segment: this block's units of tile t, k stages [u - tb, se - tb) */
        const int t = u / a.ki;
        const int tb = t * a.ki, te = tb + a.ki, se = u1 < te ? u1 : te;
        const int whole = u == tb && se == te;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < NR; r++) acc[mt][r] = 0.0f;
        int pend = -1;
        for (; u < se; u++) {
            wg_mbar_wait(wg_u32(&full_bar[s]), ph);
            const uint32_t sa = base + (uint32_t)(s * STG + wg * (MT * 64 * 128)), sb = base + (uint32_t)(s * STG + AB);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < NR; r++) wg_pin(acc[mt][r]);
            wg_fence();
            /* acc[mt] += W rows (64 of them) x x^T over this stage's 64 k, 4 steps of 16 */
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; kk++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    wg_mma<N>(acc[mt], wg_desc(sa + (uint32_t)(mt * 64 * 128 + kk * 32)), wg_desc(sb + (uint32_t)(kk * 32)));
            wg_commit();
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < NR; r++) wg_pin(acc[mt][r]);
            /* the previous stage's wgmmas are done: hand its buffer back to the producer */
            wg_wait<1>();
            if (pend >= 0 && lane == 0) wg_mbar_arrive(wg_u32(&empty_bar[pend]));
            pend = s;
            if (++s == ST) { s = 0; ph ^= 1u; }
        }
        wg_wait<0>();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < NR; r++) wg_pin(acc[mt][r]);
        if (lane == 0) wg_mbar_arrive(wg_u32(&empty_bar[pend]));
        if (!whole) {
            /* a shared tile: store this block's part (fragment order, coalesced float4) */
            const int slot = 2 * b + (t == first_tile ? 0 : 1);
            float4 *pp = (float4 *)(a.part + (size_t)slot * (BM * N));
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int q = 0; q < NR / 4; q++)
                    pp[(mt * (NR / 4) + q) * 256 + ct] = make_float4(acc[mt][4 * q], acc[mt][4 * q + 1], acc[mt][4 * q + 2], acc[mt][4 * q + 3]);
            __threadfence();
            wg_cons_sync();
            const int blo = wg_block_of(tb, G, U), bhi = wg_block_of(te - 1, G, U);
            if (ct == 0) {
                const unsigned old = atomicAdd(&a.cnt[t], 1u);
                const int last = old == (unsigned)(bhi - blo);
                if (last) a.cnt[t] = 0; /* every part has arrived: ready for the next launch */
                last_s = last;
            }
            wg_cons_sync();
            if (!last_s) continue;
            __threadfence();
            /* the last to arrive sums the parts in block (= k) order; every block after blo
             * starts inside tile t (its part is in its first slot) */
            const int lo_slot = 2 * blo + (blo * U / G == tb ? 0 : 1);
            const float4 *qp = (const float4 *)(a.part + (size_t)lo_slot * (BM * N)) + ct;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int q = 0; q < NR / 4; q++) {
                    const float4 v = __ldcg(qp + (mt * (NR / 4) + q) * 256);
                    acc[mt][4 * q] = v.x; acc[mt][4 * q + 1] = v.y; acc[mt][4 * q + 2] = v.z; acc[mt][4 * q + 3] = v.w;
                }
            for (int bb = blo + 1; bb <= bhi; bb++) {
                qp = (const float4 *)(a.part + (size_t)(2 * bb) * (BM * N)) + ct;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int q = 0; q < NR / 4; q++) {
                        const float4 v = __ldcg(qp + (mt * (NR / 4) + q) * 256);
                        acc[mt][4 * q] += v.x; acc[mt][4 * q + 1] += v.y; acc[mt][4 * q + 2] += v.z; acc[mt][4 * q + 3] += v.w;
                    }
            }
        }
        /* acc[mt][4j + i] = C[row rb + 64 mt + 8 (i >> 1)][token 8j + 2 t4 + (i & 1)] */
        const int rb = t * BM + wg * (MT * 64) + (warp & 3) * 16 + g;
        if (EPI == WG_EPI_MM) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < N / 8; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int row = rb + mt * 64 + (i >> 1) * 8, tok = j * 8 + 2 * t4 + (i & 1);
                        if (row < a.m && tok < a.n) a.y[(size_t)tok * a.m + row] = sm_tobf(acc[mt][4 * j + i]);
                    }
        } else {
#pragma unroll
            for (int j = 0; j < N / 8; j++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const int tok = j * 8 + 2 * t4 + e2;
                    float best = 0.0f;
                    int bi = -1;
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int hh = 0; hh < 2; hh++) {
                            const int row = rb + mt * 64 + hh * 8;
                            /* softcap c * tanh(raw * m_o / c); ids >= vocab_used masked */
                            const float xv = acc[mt][4 * j + 2 * hh + e2] * a.m_o;
                            float v = a.cap > 0.0f ? a.cap * tanhf(xv / a.cap) : xv;
                            if (row >= a.vocab_used) v = -INFINITY;
                            if (a.logits && row < a.m && tok < a.n) a.logits[(size_t)tok * a.m + row] = v;
                            if (row < a.vocab_used && sm_better(v, row, best, bi)) { best = v; bi = row; }
                        }
                    /* best of the warp's rows for this token: reduce over g (lane bits 2..4) */
#pragma unroll
                    for (int o = 4; o < 32; o <<= 1) {
                        const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
                        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
                        if (sm_better(ov, oi, best, bi)) { best = ov; bi = oi; }
                    }
                    if (g == 0) { red_v[warp & (RV - 1)][tok] = best; red_i[warp & (RV - 1)][tok] = bi; }
                }
            wg_cons_sync();
            /* best of the tile's rows per token */
            for (int tok = ct; tok < a.n; tok += 256) {
                float best = red_v[0][tok];
                int bi = red_i[0][tok];
                for (int w = 1; w < RV; w++)
                    if (sm_better(red_v[w][tok], red_i[w][tok], best, bi)) { best = red_v[w][tok]; bi = red_i[w][tok]; }
                a.pv[(size_t)t * a.n + tok] = best;
                a.pi[(size_t)t * a.n + tok] = bi;
            }
            wg_cons_sync(); /* red_v / red_i free for the next tile */
        }
    }
    }
}

/* Tensor map of a row-major bf16 matrix [rows, k]: boxes of 64 k x box_rows rows, 128-byte
 * swizzle, zero fill outside. */
static int wg_map(const sm_cuda_ctx *c, CUtensorMap *map, const uint16_t *p, int rows, int k, int box_rows,
                  const char *what, sm_err *e) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)c->tma_encode;
    cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    cuuint32_t box[2] = {WG_BK, (cuuint32_t)box_rows};
    cuuint32_t es[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return sm_errf(e, "cuTensorMapEncodeTiled failed (error %d) for %s [%d, %d], box %d x %d (device %d)", (int)r, what, rows, k,
                       box_rows, WG_BK, c->device);
    return 0;
}

/* Launch over at most one block per SM; the partial tiles live at c->ws + ws_off. */
template <int N, int MT, int EPI>
static int wg_launch(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m, size_t ws_off, wg_args a,
                     cudaStream_t st, sm_err *e) {
    const int BM = WG_BM(MT);
    a.n = n; a.m = m; a.k = k;
    a.ki = sm_cdiv(k, WG_BK);
    a.tiles = sm_cdiv(m, BM);
    const long long units = (long long)a.tiles * a.ki;
    if (a.tiles > c->tile_cnt_len)
        return sm_errf(e, "wgmma matmul: %d row tiles of %d > %d counters (m=%d)", a.tiles, BM, c->tile_cnt_len, m);
    int G = c->num_sms;
    if ((long long)G > units) G = (int)units;
    if (units * (G + 1) >= ((long long)1 << 31))
        return sm_errf(e, "wgmma matmul: %lld tile stages (m=%d, k=%d) overflow the 32-bit work split", units, m, k);
    a.units = (int)units;
    const size_t slot = (size_t)BM * N * sizeof(float);
    ws_off = (ws_off + 255) & ~(size_t)255;
    const size_t avail = c->ws_bytes > ws_off ? c->ws_bytes - ws_off : 0;
    /* no fewer blocks when the workspace is short: the work split (hence every row's bits)
     * must depend on (m, k) only, never on n */
    if ((size_t)2 * G * slot > avail)
        return sm_errf(e, "wgmma matmul: workspace of %zu bytes (%zu after offset %zu) below the %zu bytes of partial tiles "
                       "(n=%d, m=%d, %d blocks)", c->ws_bytes, avail, ws_off, (size_t)2 * G * slot, n, m, G);
    a.part = (float *)((char *)c->ws + ws_off);
    a.cnt = c->tile_cnt;
    CUtensorMap tw, tx;
    if (wg_map(c, &tw, W, m, k, BM, "W", e) || wg_map(c, &tx, x, n, k, N, "x", e)) return -1;
    const size_t smem = WG_SMEM(N, MT);
    SM_CUDA_CHECK(cudaFuncSetAttribute(wg_kernel<N, MT, EPI>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    wg_kernel<N, MT, EPI><<<G, WG_THREADS, smem, st>>>(tw, tx, a);
    SM_LAUNCH_CHECK("wg_kernel");
    return 0;
}

/* Token tile N = n rounded up to 8, 16, 32, 64 or 128. */
template <int MT, int EPI>
static int wg_rows(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m, size_t ws_off, const wg_args *a,
                   cudaStream_t st, sm_err *e) {
    if (n <= 8) return wg_launch<8, MT, EPI>(c, x, n, k, W, m, ws_off, *a, st, e);
    if (n <= 16) return wg_launch<16, MT, EPI>(c, x, n, k, W, m, ws_off, *a, st, e);
    if (n <= 32) return wg_launch<32, MT, EPI>(c, x, n, k, W, m, ws_off, *a, st, e);
    if (n <= 64) return wg_launch<64, MT, EPI>(c, x, n, k, W, m, ws_off, *a, st, e);
    return wg_launch<128, MT, EPI>(c, x, n, k, W, m, ws_off, *a, st, e);
}

int sm_k_logits_wg(sm_cuda_ctx *c, int mt, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V, int vocab_used,
                   float m_o, float softcap, float *logits, float **pv, int **pi, int *ntiles, cudaStream_t st, sm_err *e) {
    if (!c->tma_encode) return sm_errf(e, "sm_k_logits: the wgmma path needs a Hopper device and cuTensorMapEncodeTiled (device %d)", c->device);
    if (n < 1 || n > SM_MM_SMALL_MAX || (mt != 1 && mt != 2)) return sm_errf(e, "sm_k_logits_wg: n=%d (1..%d), mt=%d (1, 2)", n, SM_MM_SMALL_MAX, mt);
    const int tiles = sm_cdiv(V, WG_BM(mt));
    const size_t pb = (size_t)tiles * n * (sizeof(float) + sizeof(int));
    if (pb > c->ws_bytes) return sm_errf(e, "sm_k_logits: workspace of %zu bytes below the %zu bytes of argmax partials", c->ws_bytes, pb);
    wg_args a;
    memset(&a, 0, sizeof a);
    a.vocab_used = vocab_used;
    a.m_o = m_o;
    a.cap = softcap;
    a.logits = logits;
    a.pv = (float *)c->ws;
    a.pi = (int *)(a.pv + (size_t)tiles * n);
    *pv = a.pv;
    *pi = a.pi;
    *ntiles = tiles;
    return mt == 2 ? wg_rows<2, WG_EPI_LOGITS>(c, h, n, H, lm_head, V, pb, &a, st, e)
                   : wg_rows<1, WG_EPI_LOGITS>(c, h, n, H, lm_head, V, pb, &a, st, e);
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

/* The few-row path sm_k_mm takes (bench/results.md, 2026-12-02, `gpu_test --bench-dense`):
 * the wgmma kernel with 128-row tiles at every n (256-row tiles measured slower at every n).
 * The choice must NOT depend on n: a row's bits must not depend on the batch it is in
 * (speculative verify == greedy decoding), and the wgmma kernel's work split depends only on
 * (m, k).  Measured and dropped for that reason: the mma.sync core for 8 rows of the 4096 x
 * 8192 / 8192 x 4096 matrices (~1 us faster there, but other bits than the 16-row steps). */
static int mm_auto_path(const sm_cuda_ctx *c) {
    return c->tma_encode ? SM_PATH_WG1 : SM_PATH_SYNC;
}

int sm_k_mm_path(sm_cuda_ctx *c, int path, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                 uint16_t *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm", x, n, k, W, m, y, e)) return -1;
    if (n > SM_MM_SMALL_MAX) return sm_errf(e, "sm_k_mm_path: n=%d rows > %d", n, SM_MM_SMALL_MAX);
    if (n == 0) return 0;
    if (path == SM_PATH_AUTO) path = mm_auto_path(c);
    if (path == SM_PATH_SYNC) return sm_k_mm_small(c, x, n, k, W, m, y, st, e);
    if (path != SM_PATH_WG1 && path != SM_PATH_WG2) return sm_errf(e, "sm_k_mm_path: unknown path %d", path);
    if (!c->tma_encode)
        return sm_errf(e, "sm_k_mm: the wgmma path needs a Hopper device and cuTensorMapEncodeTiled (device %d)", c->device);
    wg_args a;
    memset(&a, 0, sizeof a);
    a.y = y;
    return path == SM_PATH_WG2 ? wg_rows<2, WG_EPI_MM>(c, x, n, k, W, m, 0, &a, st, e)
                               : wg_rows<1, WG_EPI_MM>(c, x, n, k, W, m, 0, &a, st, e);
}

int sm_k_mm(sm_cuda_ctx *c, const uint16_t *x, int n, int k, const uint16_t *W, int m,
            uint16_t *y, cudaStream_t st, sm_err *e) {
    if (n <= SM_MM_SMALL_MAX) return sm_k_mm_path(c, SM_PATH_AUTO, x, n, k, W, m, y, st, e);
    return sm_k_mm_blas(c, x, n, k, W, m, y, st, e);
}

/* ---- f32-weight matmul (router) ----
 * Main kernel (mm_f32w_gemv_kernel): a block owns 32 rows of W x 16 (or 8) tokens x 512 k (one
 * split); each warp 4 rows, each lane 4 k of every 128, so a lane's 16 float4 of W are all in
 * flight at once before the first FMA; x goes to shared memory as f32 once per block; partial
 * dots are summed over the warp (butterfly) and the splits by mm_reduce_f32_kernel in split
 * order.  f32 x f32 FMAs throughout (no tensor cores: the router's f32 products must stay
 * exact).  Fallback (workspace too small for the splits): the older register-tiled kernel
 * below.  We rejected that kernel as the main one: its 4 slabs of 32 k a block each waited
 * for a full memory round trip (21 us at 8 rows for 8 MB of weights), and at 128 rows its
 * 6 shared loads per 8 FMAs made it shared-memory bound. */
#define RG_KL 512    /* k a block (one split) */
#define RG_ROWS 32   /* rows of W a block: 8 warps x 4 */

template <int NT>
__global__ void __launch_bounds__(256)
mm_f32w_gemv_kernel(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W, int m, float *__restrict__ out) {
    __shared__ float4 xs[NT][RG_KL / 4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * RG_ROWS + warp * 4, t0 = blockIdx.y * NT, kb = blockIdx.z * RG_KL;
    const int kl = min(RG_KL, k - kb); /* a multiple of 4 */
    /* W rows r0..r0+3 (rows >= m read row m-1, dropped at the end), k = kb + 4q, q = lane + 32j */
    float4 w[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float4 *wr = (const float4 *)(W + (size_t)min(r0 + r, m - 1) * k + kb);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int q = lane + 32 * j;
            w[r][j] = 4 * q < kl ? __ldcs(wr + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    /* x [t0, t0 + NT) x [kb, kb + kl) as f32, zeros outside */
    for (int i = threadIdx.x; i < NT * (RG_KL / 4); i += 256) {
        const int tt = i / (RG_KL / 4), q = i % (RG_KL / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t0 + tt < n && 4 * q < kl) {
            const uint2 u = *(const uint2 *)(x + (size_t)(t0 + tt) * k + kb + 4 * q);
            v = make_float4(sm_bf_lo(u.x), sm_bf_hi(u.x), sm_bf_lo(u.y), sm_bf_hi(u.y));
        }
        xs[tt][q] = v;
    }
    __syncthreads();
    /* per lane: acc[r][t] = sum over its k of W[r0 + r][k] * x[t0 + t][k], f32 FMAs */
    float acc[4][NT];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int q = lane + 32 * j;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 xv = xs[t][q];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                acc[r][t] = fmaf(w[r][j].x, xv.x, acc[r][t]);
                acc[r][t] = fmaf(w[r][j].y, xv.y, acc[r][t]);
                acc[r][t] = fmaf(w[r][j].z, xv.z, acc[r][t]);
                acc[r][t] = fmaf(w[r][j].w, xv.w, acc[r][t]);
            }
        }
    }
    /* sum over the warp's lanes; lane 0 stores the split's partial out [split][n][m] */
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = sm_warp_sum(acc[r][t]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (r0 + r < m && t0 + t < n) out[((size_t)blockIdx.z * n + t0 + t) * m + r0 + r] = acc[r][t];
    }
}

/* Fallback kernel.  Block tile: 64 rows of W x 32 tokens, 256 threads, each 4 rows x 2 tokens;
 * k in slabs of 32 through shared memory (rows padded to 33 floats: conflict-free column reads). */
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
    {
        /* main kernel: splits of 512 k, then the ordered split sum */
        const int S = sm_cdiv(k, RG_KL), nt = n <= 8 ? 8 : 16;
        const size_t need = S > 1 ? (size_t)S * n * m * sizeof(float) : 0;
        if (need <= c->ws_bytes && S <= 65535 && sm_cdiv(n, nt) <= 65535) {
            dim3 grid(sm_cdiv(m, RG_ROWS), sm_cdiv(n, nt), S);
            float *out = S == 1 ? y : (float *)c->ws;
            if (nt == 8) mm_f32w_gemv_kernel<8><<<grid, 256, 0, st>>>(x, n, k, W, m, out);
            else mm_f32w_gemv_kernel<16><<<grid, 256, 0, st>>>(x, n, k, W, m, out);
            SM_LAUNCH_CHECK("mm_f32w_gemv_kernel");
            if (S > 1) {
                const size_t count = (size_t)n * m;
                int rb = (int)((count + 127) / 128);
                if (rb > c->num_sms * 16) rb = c->num_sms * 16;
                mm_reduce_f32_kernel<<<rb, 128, 0, st>>>((const float *)c->ws, S, count, y);
                SM_LAUNCH_CHECK("mm_reduce_f32_kernel");
            }
            return 0;
        }
    }
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
