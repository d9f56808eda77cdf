/* ops/matmul.cu: y = r16(x W^T) for the dense projections, the lm_head product of the logits,
 * and the stock-path context: the stock kernels (thin wrappers of the bodies in
 * ops/matmul.cuh), their launchers (grid, split counts, tensor maps) and the checked entries.
 *
 * Few rows (decode / verify, n <= 128), two weight-streaming tensor-core kernels:
 *  - the mma.sync core (64 rows of W a block, W straight into registers, k
 *    split over blocks with an ordered reduce kernel): only where the wgmma path is missing,
 *    or forced (tests).  At 64-128 rows it is bound by mma.sync issue, by each warp re-reading
 *    all of x from shared memory, and by every 64-row block re-reading all of x from L2 (2x
 *    the bytes of W at 128 rows; bench/results.md has what it measured).
 *  - the wgmma stream-K kernel, the default at every n (each byte of W read once; its measured
 *    fraction of the read floor: bench/results.md): one persistent block per SM (2 consumer warpgroups
 *    + 1 producer warp), tiles of 128 * MT rows of W x N tokens (N = n rounded up to 8..128),
 *    k in stages of 64 (one 128-byte swizzled row) fed by TMA into an mbarrier ring, wgmma
 *    m64nNk16 with both operands in shared memory ("swap AB": W rows are the M side).  The
 *    (tile, k stage) units are cut evenly over the blocks ("stream-K"), so every SM streams
 *    the same number of bytes whatever the shape; a tile shared by several blocks is summed by
 *    its last arriving block, in block (= k) order: deterministic, no float atomics, so
 *    replicated tensors stay bit-identical across ranks.  x is re-read once per tile of W
 *    rows, not once per 64 rows.
 * Many rows (prefill): cuBLAS bf16 GEMM with f32 compute and bf16 output, i.e. r16 of an f32
 * accumulation.  The f32-output variant (a rank's partial sum, summed over ranks before any
 * rounding) runs the same kernels and split with an f32 store (SM_WG_EPI_MM32, the mma.sync
 * core's f32 partials) and cuBLAS with f32 output.  The router's f32-weight matmul is an FFMA kernel, split-k GEMV style (f32 x f32
 * must stay f32 for exact expert selection).
 * We rejected cuBLAS for the few-row case (its GEMMs read W at a fraction of bandwidth at n = 8),
 * a fixed split-K grid for the wgmma kernel (4096- and 8192-row matrices give 16..80 tiles: a
 * grid of tiles x splits either leaves SMs idle or runs a second partial wave), and TMA
 * multicast of x over a cluster (the stream-K blocks do not share k ranges).
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/matmul.cuh"
#include "cuda/ops/logits.cuh"
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

/* Zero `bytes` at p on a stream of its own and wait for it: the context has no stream of its
 * caller's yet, and the legacy default stream is never used. */
static int ctx_zero(void *p, size_t bytes, sm_err *e) {
    cudaStream_t z = NULL;
    SM_CUDA_CHECK(cudaStreamCreateWithFlags(&z, cudaStreamNonBlocking));
    cudaError_t memset_on_own_stream = cudaMemsetAsync(p, 0, bytes, z);
    if (memset_on_own_stream == cudaSuccess) memset_on_own_stream = cudaStreamSynchronize(z);
    SM_CUDA_CHECK_PRINT(cudaStreamDestroy(z));
    SM_CUDA_CHECK(memset_on_own_stream);
    return 0;
}

/* The cuBLAS handle and the device buffers of c (sizes set); the first failure returns -1
 * with the check macro's line, leaving what was created for sm_kernel_ctx_free. */
static int ctx_create(sm_kernel_ctx *kc, sm_err *e) {
    cublasHandle_t h = NULL; /* kc->blas stays NULL when creation fails */
    SM_CUBLAS_CHECK(cublasCreate(&h));
    kc->blas = h;
    SM_CUDA_CHECK(cudaMalloc(&kc->blas_ws, kc->blas_ws_bytes));
    SM_CUDA_CHECK(cudaMalloc(&kc->ws, kc->ws_bytes));
    SM_CUDA_CHECK(cudaMalloc((void **)&kc->tile_cnt, (size_t)kc->tile_cnt_len * sizeof(unsigned)));
    return ctx_zero(kc->tile_cnt, (size_t)kc->tile_cnt_len * sizeof(unsigned), e);
}

int sm_kernel_ctx_init(sm_kernel_ctx *kc, int device, size_t ws_bytes, sm_err *e) {
    memset(kc, 0, sizeof *kc);
    kc->device = device;
    SM_CUDA_CHECK(cudaSetDevice(device));
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&kc->num_sms, cudaDevAttrMultiProcessorCount, device));
    int major = 0;
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    kc->blas_ws_bytes = (size_t)32 << 20;
    kc->ws_bytes = ws_bytes ? ws_bytes : ((size_t)64 << 20);
    kc->tile_cnt_len = WG_TILE_CNT_LEN;
    const char *ai = getenv("SPARKMONO_ATT_ITEMS_PER_SM");
    kc->att_items_per_sm = ai && atoi(ai) > 0 && atoi(ai) <= 64 ? atoi(ai) : SM_ATT_ITEMS_PER_SM;
    if (ctx_create(kc, e)) {
        const size_t want = kc->blas_ws_bytes + kc->ws_bytes + (size_t)kc->tile_cnt_len * sizeof(unsigned);
        sm_kernel_ctx_free(kc);
        return sm_errprefix(e, "stock-path context (%zu bytes of workspace) on device %d", want, device);
    }
    /* the wgmma path needs a Hopper device and the driver's tensor-map encoder; this is a
     * probe (a failure means "no wgmma path", not an error), so its error state is cleared */
    if (major == 9) kc->tma_encode = sm_cuda_tma_encoder();
    return 0;
}

void *sm_cuda_tma_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        fn = NULL;
    (void)cudaGetLastError(); /* a probe: a failure means "no wgmma path", not an error */
    return fn;
}

void sm_kernel_ctx_free(sm_kernel_ctx *kc) {
    if (kc->blas) SM_CUBLAS_CHECK_PRINT(cublasDestroy(kc->blas));
    if (kc->blas_ws) SM_CUDA_CHECK_PRINT(cudaFree(kc->blas_ws));
    if (kc->ws) SM_CUDA_CHECK_PRINT(cudaFree(kc->ws));
    if (kc->tile_cnt) SM_CUDA_CHECK_PRINT(cudaFree(kc->tile_cnt));
    kc->blas = NULL;
    kc->blas_ws = kc->ws = NULL;
    kc->tile_cnt = NULL;
    kc->tma_encode = NULL;
    kc->blas_ws_bytes = kc->ws_bytes = 0;
    kc->tile_cnt_len = 0;
}

/* ---- few-row bf16 matmul ---- */

/* One sm_mm_small_tile per block: blockIdx.x = row block, blockIdx.y = k split. */
template <int NT, int EPI>
__global__ void __launch_bounds__(SM_MM_WARPS * 32)
mm_small_kernel(const uint16_t *__restrict__ x, int n, int k, const uint16_t *__restrict__ W,
                int m, int cps, uint16_t *__restrict__ y, float *__restrict__ part) {
    extern __shared__ uint4 xs[];
    sm_mm_small_tile<NT, EPI>(x, n, k, W, m, cps, y, part, blockIdx.x, blockIdx.y, xs);
}

/* Grid-stride split sums (sm_mm_reduce_range / sm_mm_reduce_f32_range). */
__global__ void mm_reduce_kernel(const float *__restrict__ part, int S, size_t count, uint16_t *__restrict__ y) {
    sm_mm_reduce_range(part, S, count, y, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}
__global__ void mm_reduce_f32_kernel(const float *__restrict__ part, int S, size_t count, float *__restrict__ y) {
    sm_mm_reduce_f32_range(part, S, count, y, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}

/* y = r16(x W^T) into y, or (y32 != NULL) the unrounded f32 sums into y32: the same split and
 * the same split-ordered sums, only the final store differs. */
template <int NT>
static int mm_small_launch(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                           uint16_t *y, float *y32, cudaStream_t st, sm_err *e) {
    const int bm = sm_cdiv(m, SM_MM_ROWS), kslabs = k / 32;
    /* split k until the grid holds about `target` blocks, each split >= 2 slabs */
    const int target = kc->num_sms * (NT >= 8 ? 2 : 4);
    int S = sm_cdiv(target, bm);
    int smax = sm_cdiv(kslabs, 2 * SM_MM_CPS);
    if (S > smax) S = smax;
    size_t per = (size_t)n * m * sizeof(float);
    if (S > 1 && (size_t)S * per > kc->ws_bytes) S = (int)(kc->ws_bytes / per);
    if (S < 1) S = 1;
    int cps = sm_cdiv(sm_cdiv(kslabs, S), SM_MM_CPS) * SM_MM_CPS;
    S = sm_cdiv(kslabs, cps); /* every split non-empty */
    const size_t smem = SM_MM_SMEM(NT);
    dim3 grid(bm, S);
    if (S == 1 && y32) {
        /* one split: its f32 "partial" [1][n][m] is y32 itself */
        SM_CUDA_CHECK(cudaFuncSetAttribute(mm_small_kernel<NT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        mm_small_kernel<NT, 1><<<grid, SM_MM_WARPS * 32, smem, st>>>(x, n, k, W, m, cps, NULL, y32);
        SM_LAUNCH_CHECK("mm_small_kernel");
        return 0;
    }
    if (S == 1) {
        SM_CUDA_CHECK(cudaFuncSetAttribute(mm_small_kernel<NT, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        mm_small_kernel<NT, 0><<<grid, SM_MM_WARPS * 32, smem, st>>>(x, n, k, W, m, cps, y, NULL);
        SM_LAUNCH_CHECK("mm_small_kernel");
        return 0;
    }
    float *part = (float *)kc->ws;
    SM_CUDA_CHECK(cudaFuncSetAttribute(mm_small_kernel<NT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    mm_small_kernel<NT, 1><<<grid, SM_MM_WARPS * 32, smem, st>>>(x, n, k, W, m, cps, NULL, part);
    SM_LAUNCH_CHECK("mm_small_kernel");
    size_t count = (size_t)n * m;
    int rb = (int)((count + 255) / 256);
    if (rb > kc->num_sms * 8) rb = kc->num_sms * 8;
    if (y32) {
        mm_reduce_f32_kernel<<<rb, 256, 0, st>>>(part, S, count, y32);
        SM_LAUNCH_CHECK("mm_reduce_f32_kernel");
        return 0;
    }
    mm_reduce_kernel<<<rb, 256, 0, st>>>(part, S, count, y);
    SM_LAUNCH_CHECK("mm_reduce_kernel");
    return 0;
}

/* The token tile NT of the mma.sync core for n <= 128 rows. */
static int mm_small_rows(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m, uint16_t *y, float *y32,
                         cudaStream_t st, sm_err *e) {
    if (n <= 8) return mm_small_launch<1>(kc, x, n, k, W, m, y, y32, st, e);
    if (n <= 16) return mm_small_launch<2>(kc, x, n, k, W, m, y, y32, st, e);
    if (n <= 32) return mm_small_launch<4>(kc, x, n, k, W, m, y, y32, st, e);
    if (n <= 64) return mm_small_launch<8>(kc, x, n, k, W, m, y, y32, st, e);
    return mm_small_launch<16>(kc, x, n, k, W, m, y, y32, st, e);
}

static int mm_check(const char *who, const uint16_t *x, int n, int k, const void *W, int m, const void *y, sm_err *e) {
    if (n < 0 || k <= 0 || m <= 0) return sm_errf(e, "%s: bad shape n=%d k=%d m=%d", who, n, k, m);
    if (k % 32) return sm_errf(e, "%s: k=%d is not a multiple of 32", who, k);
    if (!x || !W || !y) return sm_errf(e, "%s: NULL pointer (x, W or y)", who);
    if (!sm_aligned(x, 16) || !sm_aligned(W, 16)) return sm_errf(e, "%s: x or W not 16-byte aligned", who);
    return 0;
}

/* ---- wgmma stream-K kernel ----
 * One persistent block per SM (at most): virtual block b = blockIdx.x of G = gridDim.x takes
 * the units [b U / G, (b + 1) U / G).  Warpgroup 2 gives its registers to the consumers and
 * one of its threads runs the producer; warpgroups 0 and 1 consume (ops/matmul.cuh) and run
 * the epilogue EPI of each tile they finish (SM_WG_EPI_LOGITS: ops/logits.cuh). */
template <int N, int MT, int EPI>
__global__ void __launch_bounds__(SM_WG_THREADS, 1)
wg_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, const sm_wg_args a) {
    constexpr int ST = SM_WG_ST(N, MT);
    constexpr int RV = EPI == SM_WG_EPI_LOGITS ? 8 : 1;
    extern __shared__ uint8_t wg_dyn[];
    __shared__ __align__(8) uint64_t full_bar[ST], empty_bar[ST];
    __shared__ int last_s;
    __shared__ float red_v[RV][N];
    __shared__ int red_i[RV][N];
    sm_wg_smem sm;
    sm.base = (sm_wg_u32(wg_dyn) + 1023u) & ~1023u;
    sm.full = sm_wg_u32(full_bar);
    sm.empty = sm_wg_u32(empty_bar);
    sm.last = &last_s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0) sm_wg_ring_init<ST>(sm);
    __syncthreads();
    int s = 0;
    unsigned ph = 0;
    if (warp >= 8) {
        /* producer warpgroup: gives registers to the consumers; one thread walks the block's
         * units in order and keeps the ring full */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0)
            sm_wg_produce<N, MT>(&tw, &tx, a.ki, sm_wg_unit0(b, G, a.units), sm_wg_unit0(b + 1, G, a.units), 0, sm, s, ph);
    } else {
        /* consumers: warps 0-3 = warpgroup 0, 4-7 = warpgroup 1 */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int u0 = sm_wg_unit0(b, G, a.units), u1 = sm_wg_unit0(b + 1, G, a.units);
        if constexpr (EPI == SM_WG_EPI_LOGITS) sm_lg_wg_consume<N, MT, RV>(a, b, G, u0, u1, sm, s, ph, red_v, red_i);
        else sm_wg_consume_mm<N, MT, EPI>(a, b, G, u0, u1, sm, s, ph);
    }
}

/* Tensor map of a row-major bf16 matrix [rows, k]: boxes of 64 k x box_rows rows, 128-byte
 * swizzle, zero fill outside. */
static int wg_map(const sm_kernel_ctx *kc, CUtensorMap *map, const uint16_t *p, int rows, int k, int box_rows,
                  const char *what, sm_err *e) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)kc->tma_encode;
    cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    cuuint32_t box[2] = {SM_WG_BK, (cuuint32_t)box_rows};
    cuuint32_t es[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return sm_errf(e, "cuTensorMapEncodeTiled failed (error %d) for %s [%d, %d], box %d x %d (device %d)", (int)r, what, rows, k,
                       box_rows, SM_WG_BK, kc->device);
    return 0;
}

/* The split of y = x W^T (n tokens, box of N tokens, tiles of 128 MT rows) over at most one
 * block per SM: fills a's shape fields, a.part = part (2 G partial tiles of BM x N floats,
 * part_bytes available), a.cnt, and the two tensor maps.  The work split depends on (m, k)
 * and the SM count only, never on n.  Shared by the stock launch and the persistent kernel. */
static int wg_plan(const sm_kernel_ctx *kc, int N, int MT, const uint16_t *x, int n, int k, const uint16_t *W, int m, void *part,
                   size_t part_bytes, sm_wg_args *a, CUtensorMap *tw, CUtensorMap *tx, int *grid, sm_err *e) {
    const int BM = SM_WG_BM(MT);
    a->n = n; a->m = m; a->k = k;
    a->ki = sm_cdiv(k, SM_WG_BK);
    a->tiles = sm_cdiv(m, BM);
    const long long units = (long long)a->tiles * a->ki;
    if (a->tiles > kc->tile_cnt_len)
        return sm_errf(e, "wgmma matmul: %d row tiles of %d > %d counters (m=%d)", a->tiles, BM, kc->tile_cnt_len, m);
    int G = kc->num_sms;
    if ((long long)G > units) G = (int)units;
    if (units * (G + 1) >= ((long long)1 << 31))
        return sm_errf(e, "wgmma matmul: %lld tile stages (m=%d, k=%d) overflow the 32-bit work split", units, m, k);
    a->units = (int)units;
    const size_t slot = (size_t)BM * N * sizeof(float);
    /* no fewer blocks when the workspace is short: the work split (hence every row's bits)
     * must depend on (m, k) only, never on n */
    if ((size_t)2 * G * slot > part_bytes)
        return sm_errf(e, "wgmma matmul: workspace of %zu bytes below the %zu bytes of partial tiles (n=%d, m=%d, %d blocks)",
                       part_bytes, (size_t)2 * G * slot, n, m, G);
    a->part = (float *)part;
    a->cnt = kc->tile_cnt;
    if (wg_map(kc, tw, W, m, k, BM, "W", e) || wg_map(kc, tx, x, n, k, N, "x", e)) return -1;
    *grid = G;
    return 0;
}

/* The plan of a persistent caller's matmul with output y (bf16) or y32 (f32, the other NULL). */
static int wg_plan_persistent(const sm_kernel_ctx *kc, int N, const uint16_t *x, int n, int k, const uint16_t *W, int m, uint16_t *y,
                              float *y32, void *part, size_t part_bytes, sm_wg_args *a, CUtensorMap *tw, CUtensorMap *tx, sm_err *e) {
    if (!kc->tma_encode) return sm_errf(e, "wgmma plan: needs a Hopper device and cuTensorMapEncodeTiled (device %d)", kc->device);
    if (mm_check("wgmma plan", x, n, k, W, m, y ? (const void *)y : (const void *)y32, e)) return -1;
    memset(a, 0, sizeof *a);
    a->y = y;
    a->y32 = y32;
    int G = 0;
    return wg_plan(kc, N, 1, x, n, k, W, m, part, part_bytes, a, tw, tx, &G, e);
}

int sm_wg_plan_mm(const sm_kernel_ctx *kc, int N, const uint16_t *x, int n, int k, const uint16_t *W, int m, uint16_t *y, void *part,
                  size_t part_bytes, sm_wg_args *a, CUtensorMap *tw, CUtensorMap *tx, sm_err *e) {
    return wg_plan_persistent(kc, N, x, n, k, W, m, y, NULL, part, part_bytes, a, tw, tx, e);
}

int sm_wg_plan_mm_f32(const sm_kernel_ctx *kc, int N, const uint16_t *x, int n, int k, const uint16_t *W, int m, float *y32, void *part,
                      size_t part_bytes, sm_wg_args *a, CUtensorMap *tw, CUtensorMap *tx, sm_err *e) {
    return wg_plan_persistent(kc, N, x, n, k, W, m, NULL, y32, part, part_bytes, a, tw, tx, e);
}

/* Launch over at most one block per SM; the partial tiles live at kc->ws + ws_off. */
template <int N, int MT, int EPI>
static int wg_launch(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m, size_t ws_off, sm_wg_args a,
                     cudaStream_t st, sm_err *e) {
    ws_off = (ws_off + 255) & ~(size_t)255;
    const size_t avail = kc->ws_bytes > ws_off ? kc->ws_bytes - ws_off : 0;
    CUtensorMap tw, tx;
    int G = 0;
    if (wg_plan(kc, N, MT, x, n, k, W, m, (char *)kc->ws + ws_off, avail, &a, &tw, &tx, &G, e)) return -1;
    const size_t smem = SM_WG_SMEM(N, MT);
    SM_CUDA_CHECK(cudaFuncSetAttribute(wg_kernel<N, MT, EPI>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    wg_kernel<N, MT, EPI><<<G, SM_WG_THREADS, smem, st>>>(tw, tx, a);
    SM_LAUNCH_CHECK("wg_kernel");
    return 0;
}

/* Token tile N = n rounded up to 8, 16, 32, 64 or 128. */
template <int MT, int EPI>
static int wg_rows(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m, size_t ws_off, const sm_wg_args *a,
                   cudaStream_t st, sm_err *e) {
    if (n <= 8) return wg_launch<8, MT, EPI>(kc, x, n, k, W, m, ws_off, *a, st, e);
    if (n <= 16) return wg_launch<16, MT, EPI>(kc, x, n, k, W, m, ws_off, *a, st, e);
    if (n <= 32) return wg_launch<32, MT, EPI>(kc, x, n, k, W, m, ws_off, *a, st, e);
    if (n <= 64) return wg_launch<64, MT, EPI>(kc, x, n, k, W, m, ws_off, *a, st, e);
    return wg_launch<128, MT, EPI>(kc, x, n, k, W, m, ws_off, *a, st, e);
}

int sm_k_logits_wg(sm_kernel_ctx *kc, int mt, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V, int vocab_used,
                   float m_o, float softcap, float *logits, float **pv, int **pi, int *ntiles, cudaStream_t st, sm_err *e) {
    if (!kc->tma_encode) return sm_errf(e, "sm_k_logits: the wgmma path needs a Hopper device and cuTensorMapEncodeTiled (device %d)", kc->device);
    if (n < 1 || n > SM_MM_SMALL_MAX || (mt != 1 && mt != 2)) return sm_errf(e, "sm_k_logits_wg: n=%d (1..%d), mt=%d (1, 2)", n, SM_MM_SMALL_MAX, mt);
    const int tiles = sm_cdiv(V, SM_WG_BM(mt));
    const size_t pb = (size_t)tiles * n * (sizeof(float) + sizeof(int));
    if (pb > kc->ws_bytes) return sm_errf(e, "sm_k_logits: workspace of %zu bytes below the %zu bytes of argmax partials", kc->ws_bytes, pb);
    sm_wg_args a;
    memset(&a, 0, sizeof a);
    a.vocab_used = vocab_used;
    a.m_o = m_o;
    a.cap = softcap;
    a.logits = logits;
    a.pv = (float *)kc->ws;
    a.pi = (int *)(a.pv + (size_t)tiles * n);
    *pv = a.pv;
    *pi = a.pi;
    *ntiles = tiles;
    return mt == 2 ? wg_rows<2, SM_WG_EPI_LOGITS>(kc, h, n, H, lm_head, V, pb, &a, st, e)
                   : wg_rows<1, SM_WG_EPI_LOGITS>(kc, h, n, H, lm_head, V, pb, &a, st, e);
}


int sm_k_mm_small(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                  uint16_t *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm_small", x, n, k, W, m, y, e)) return -1;
    if (n > SM_MM_SMALL_MAX) return sm_errf(e, "sm_k_mm_small: n=%d rows > %d", n, SM_MM_SMALL_MAX);
    if (n == 0) return 0;
    return mm_small_rows(kc, x, n, k, W, m, y, NULL, st, e);
}

/* cuBLAS y = x W^T with f32 compute, output type yt (bf16: r16 of the f32 sums; f32: the
 * sums); shapes checked by the caller. */
static int mm_blas(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m, void *y, cudaDataType yt,
                   cudaStream_t st, sm_err *e) {
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: Y^T [m, n] = W [m, k] (row-major = (k x m)^T) x X^T [k, n] */
    SM_CUBLAS_CHECK(cublasSetStream(kc->blas, st));
    SM_CUBLAS_CHECK(cublasSetWorkspace(kc->blas, kc->blas_ws, kc->blas_ws_bytes));
    SM_CUBLAS_CHECK(cublasGemmEx(kc->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_16BF, k,
                                 x, CUDA_R_16BF, k, &zero, y, yt, m, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    return 0;
}

int sm_k_mm_blas(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                 uint16_t *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm_blas", x, n, k, W, m, y, e)) return -1;
    if (n == 0) return 0;
    return mm_blas(kc, x, n, k, W, m, y, CUDA_R_16BF, st, e);
}

/* The few-row path sm_k_mm takes (bench/results.md, 2026-12-02, `gpu_test --bench-dense`):
 * the wgmma kernel with 128-row tiles at every n (256-row tiles measured slower at every n).
 * The choice must NOT depend on n: a row's bits must not depend on the batch it is in
 * (speculative verify == greedy decoding), and the wgmma kernel's work split depends only on
 * (m, k).  Measured and dropped for that reason: the mma.sync core for 8 rows of the 4096 x
 * 8192 / 8192 x 4096 matrices (faster there, but other bits than the 16-row steps). */
static int mm_auto_path(const sm_kernel_ctx *kc) {
    return kc->tma_encode ? SM_PATH_WG1 : SM_PATH_SYNC;
}

int sm_k_mm_path(sm_kernel_ctx *kc, int path, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                 uint16_t *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm", x, n, k, W, m, y, e)) return -1;
    if (n > SM_MM_SMALL_MAX) return sm_errf(e, "sm_k_mm_path: n=%d rows > %d", n, SM_MM_SMALL_MAX);
    if (n == 0) return 0;
    if (path == SM_PATH_AUTO) path = mm_auto_path(kc);
    if (path == SM_PATH_SYNC) return sm_k_mm_small(kc, x, n, k, W, m, y, st, e);
    if (path != SM_PATH_WG1 && path != SM_PATH_WG2) return sm_errf(e, "sm_k_mm_path: unknown path %d", path);
    if (!kc->tma_encode)
        return sm_errf(e, "sm_k_mm: the wgmma path needs a Hopper device and cuTensorMapEncodeTiled (device %d)", kc->device);
    sm_wg_args a;
    memset(&a, 0, sizeof a);
    a.y = y;
    return path == SM_PATH_WG2 ? wg_rows<2, SM_WG_EPI_MM>(kc, x, n, k, W, m, 0, &a, st, e)
                               : wg_rows<1, SM_WG_EPI_MM>(kc, x, n, k, W, m, 0, &a, st, e);
}

int sm_k_mm(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
            uint16_t *y, cudaStream_t st, sm_err *e) {
    if (n <= SM_MM_SMALL_MAX) return sm_k_mm_path(kc, SM_PATH_AUTO, x, n, k, W, m, y, st, e);
    return sm_k_mm_blas(kc, x, n, k, W, m, y, st, e);
}

/* ---- f32-output matmul (a rank's partial sum): sm_k_mm's work split, f32 stores ---- */

int sm_k_mm_f32_path(sm_kernel_ctx *kc, int path, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                     float *y, cudaStream_t st, sm_err *e) {
    if (mm_check("sm_k_mm_f32", x, n, k, W, m, y, e)) return -1;
    if (n > SM_MM_SMALL_MAX) return sm_errf(e, "sm_k_mm_f32_path: n=%d rows > %d", n, SM_MM_SMALL_MAX);
    if (n == 0) return 0;
    if (path == SM_PATH_AUTO) path = mm_auto_path(kc);
    if (path == SM_PATH_SYNC) return mm_small_rows(kc, x, n, k, W, m, NULL, y, st, e);
    if (path != SM_PATH_WG1) return sm_errf(e, "sm_k_mm_f32_path: path %d not available (sync or wg128 only)", path);
    if (!kc->tma_encode)
        return sm_errf(e, "sm_k_mm_f32: the wgmma path needs a Hopper device and cuTensorMapEncodeTiled (device %d)", kc->device);
    sm_wg_args a;
    memset(&a, 0, sizeof a);
    a.y32 = y;
    return wg_rows<1, SM_WG_EPI_MM32>(kc, x, n, k, W, m, 0, &a, st, e);
}

int sm_k_mm_f32(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const uint16_t *W, int m,
                float *y, cudaStream_t st, sm_err *e) {
    if (n <= SM_MM_SMALL_MAX) return sm_k_mm_f32_path(kc, SM_PATH_AUTO, x, n, k, W, m, y, st, e);
    if (mm_check("sm_k_mm_f32", x, n, k, W, m, y, e)) return -1;
    return mm_blas(kc, x, n, k, W, m, y, CUDA_R_32F, st, e);
}

/* ---- f32-weight matmul (router): bodies in ops/matmul.cuh ---- */

/* One sm_mm_f32w_gemv_block per block: grid (row blocks, token blocks, 512-k splits). */
template <int NT>
__global__ void __launch_bounds__(256)
mm_f32w_gemv_kernel(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W, int m, float *__restrict__ out) {
    __shared__ float4 xs[NT][SM_RG_KL / 4];
    sm_mm_f32w_gemv_block<NT>(x, n, k, W, m, out, blockIdx.x, blockIdx.y, blockIdx.z, xs, sm_team_block());
}

/* One sm_mm_f32w_block per block: grid (row blocks of 64, token blocks of 32, k splits). */
__global__ void __launch_bounds__(256)
mm_f32w_kernel(const uint16_t *__restrict__ x, int n, int k, const float *__restrict__ W, int m,
               int kps, float *__restrict__ out) {
    __shared__ float ws_[SM_F32_TM][SM_F32_KS + 1];
    __shared__ float xs_[SM_F32_TN][SM_F32_KS + 1];
    sm_mm_f32w_block(x, n, k, W, m, kps, out, blockIdx.x, blockIdx.y, blockIdx.z, ws_, xs_);
}

int sm_k_mm_f32w(sm_kernel_ctx *kc, const uint16_t *x, int n, int k, const float *W, int m,
                 float *y, cudaStream_t st, sm_err *e) {
    if (n < 0 || k <= 0 || m <= 0) return sm_errf(e, "sm_k_mm_f32w: bad shape n=%d k=%d m=%d", n, k, m);
    if (k % 4) return sm_errf(e, "sm_k_mm_f32w: k=%d is not a multiple of 4", k);
    if (!x || !W || !y) return sm_errf(e, "sm_k_mm_f32w: NULL pointer (x, W or y)");
    if (!sm_aligned(x, 8) || !sm_aligned(W, 16)) return sm_errf(e, "sm_k_mm_f32w: x not 8-byte or W not 16-byte aligned");
    if (n == 0) return 0;
    {
        /* main kernel: splits of 512 k, then the ordered split sum */
        const int S = sm_cdiv(k, SM_RG_KL), nt = n <= 8 ? 8 : 16;
        const size_t need = S > 1 ? (size_t)S * n * m * sizeof(float) : 0;
        if (need <= kc->ws_bytes && S <= 65535 && sm_cdiv(n, nt) <= 65535) {
            dim3 grid(sm_cdiv(m, SM_RG_ROWS), sm_cdiv(n, nt), S);
            float *out = S == 1 ? y : (float *)kc->ws;
            if (nt == 8) mm_f32w_gemv_kernel<8><<<grid, 256, 0, st>>>(x, n, k, W, m, out);
            else mm_f32w_gemv_kernel<16><<<grid, 256, 0, st>>>(x, n, k, W, m, out);
            SM_LAUNCH_CHECK("mm_f32w_gemv_kernel");
            if (S > 1) {
                const size_t count = (size_t)n * m;
                int rb = (int)((count + 127) / 128);
                if (rb > kc->num_sms * 16) rb = kc->num_sms * 16;
                mm_reduce_f32_kernel<<<rb, 128, 0, st>>>((const float *)kc->ws, S, count, y);
                SM_LAUNCH_CHECK("mm_reduce_f32_kernel");
            }
            return 0;
        }
    }
    const int bm = sm_cdiv(m, SM_F32_TM), bn = sm_cdiv(n, SM_F32_TN);
    /* split k so the grid holds about 2 blocks per SM, each split >= 4 slabs */
    int S = sm_cdiv(2 * kc->num_sms, bm * bn);
    int smax = sm_cdiv(k, 4 * SM_F32_KS);
    if (S > smax) S = smax;
    size_t per = (size_t)n * m * sizeof(float);
    if (S > 1 && (size_t)S * per > kc->ws_bytes) S = (int)(kc->ws_bytes / per);
    if (S > 65535) S = 65535;
    if (S < 1) S = 1;
    int kps = sm_cdiv(sm_cdiv(k, S), SM_F32_KS) * SM_F32_KS;
    S = sm_cdiv(k, kps);
    dim3 grid(bm, bn, S);
    float *out = S == 1 ? y : (float *)kc->ws;
    mm_f32w_kernel<<<grid, 256, 0, st>>>(x, n, k, W, m, kps, out);
    SM_LAUNCH_CHECK("mm_f32w_kernel");
    if (S > 1) {
        size_t count = (size_t)n * m;
        int rb = (int)((count + 255) / 256);
        if (rb > kc->num_sms * 8) rb = kc->num_sms * 8;
        mm_reduce_f32_kernel<<<rb, 256, 0, st>>>((const float *)kc->ws, S, count, y);
        SM_LAUNCH_CHECK("mm_reduce_f32_kernel");
    }
    return 0;
}
