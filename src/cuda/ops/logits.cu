/* ops/logits.cu: the stock kernels of the final logits and greedy argmax (bodies in
 * ops/logits.cuh), the path choice and the checked extern "C" entries.
 *
 * lm_head [V, H] is the largest matrix of a step (3.3 GB in the real model); it is streamed
 * once per chunk of up to 128 rows.  Two paths compute raw = h . lm_head[v]:
 *  - the wgmma stream-K kernel of ops/matmul.cu (sm_k_logits_wg) with the logits epilogue,
 *    tiles of 128 * LG_WG_MT ids, each row of lm_head read once per chunk;
 *  - without the wgmma path (not a Hopper device, old driver), or when forced for tests: the
 *    mma.sync swap-AB core, one block per 64 ids (at many rows bound by mma.sync issue, and it
 *    re-reads all of h from L2 for every 64 ids).  bench/results.md has what each path measured.
 * Both leave one (value, id) partial per tile and row; argmax_reduce_kernel reduces them per
 * row.  We rejected a last-block-reduces scheme inside the matmul kernels (an arrival counter
 * per chunk): the reduce kernel is a few microseconds and keeps both paths alike.
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/logits.cuh"

/* One sm_lg_sync_tile per block: blockIdx.x = tile of SM_MM_ROWS ids. */
template <int NT>
__global__ void __launch_bounds__(SM_MM_WARPS * 32)
logits_kernel(const uint16_t *__restrict__ h, int n, int k, const uint16_t *__restrict__ Wl, int V, int vocab_used,
              float m_o, float cap, float *__restrict__ logits, float *__restrict__ pv, int *__restrict__ pi) {
    extern __shared__ uint4 xs[];
    __shared__ float bv_s[SM_MM_WARPS][NT * 8];
    __shared__ int bi_s[SM_MM_WARPS][NT * 8];
    sm_lg_sync_tile<NT>(h, n, k, Wl, V, vocab_used, m_o, cap, logits, pv, pi, blockIdx.x, xs, bv_s, bi_s);
}

/* One sm_lg_argmax_row per block of 256 threads: blockIdx.x = token. */
__global__ void __launch_bounds__(256)
argmax_reduce_kernel(const float *__restrict__ pv, const int *__restrict__ pi, int nb, int n, int *__restrict__ argmax) {
    __shared__ float sv[8];
    __shared__ int si[8];
    sm_lg_argmax_row(pv, pi, nb, n, blockIdx.x, argmax, sv, si);
}

template <int NT>
static int logits_launch(int nb, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V, int vocab_used,
                         float m_o, float softcap, float *logits, float *pv, int *pi, cudaStream_t st, sm_err *e) {
    const size_t smem = SM_MM_SMEM(NT);
    SM_CUDA_CHECK(cudaFuncSetAttribute(logits_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    logits_kernel<NT><<<nb, SM_MM_WARPS * 32, smem, st>>>(h, n, H, lm_head, V, vocab_used, m_o, softcap, logits, pv, pi);
    SM_LAUNCH_CHECK("logits_kernel");
    return 0;
}

#define LG_WG_MIN_ROWS 1  /* the wgmma kernel from this many rows of a chunk (keep 1: the path,
                            * hence a row's bits, must not depend on the batch size) */
#define LG_WG_MT 1         /* its tiles: 128 * LG_WG_MT ids (256-id tiles measured slower at 128
                            * rows and equal at 8: bench/results.md) */

int sm_k_logits_path(sm_kernel_ctx *kc, int path, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V,
                     int vocab_used, float m_o, float softcap, float *logits, int *argmax, cudaStream_t st, sm_err *e) {
    if (n < 0 || H <= 0 || V <= 0) return sm_errf(e, "sm_k_logits: bad shape n=%d H=%d V=%d", n, H, V);
    if (H % 32) return sm_errf(e, "sm_k_logits: H=%d is not a multiple of 32", H);
    if (vocab_used < 1 || vocab_used > V) return sm_errf(e, "sm_k_logits: vocab_used=%d outside [1, V=%d]", vocab_used, V);
    if (!h || !lm_head || !argmax) return sm_errf(e, "sm_k_logits: NULL h, lm_head or argmax");
    if (!sm_aligned(h, 16) || !sm_aligned(lm_head, 16)) return sm_errf(e, "sm_k_logits: h or lm_head not 16-byte aligned");
    if (path < SM_PATH_AUTO || path > SM_PATH_WG2) return sm_errf(e, "sm_k_logits: unknown path %d", path);
    if (n == 0) return 0;
    for (int r0 = 0; r0 < n; r0 += SM_MM_SMALL_MAX) {
        const int rn = n - r0 < SM_MM_SMALL_MAX ? n - r0 : SM_MM_SMALL_MAX;
        const uint16_t *hr = h + (size_t)r0 * H;
        float *lr = logits ? logits + (size_t)r0 * V : NULL;
        int p = path;
        if (p == SM_PATH_AUTO) p = kc->tma_encode && rn >= LG_WG_MIN_ROWS ? (LG_WG_MT == 2 ? SM_PATH_WG2 : SM_PATH_WG1) : SM_PATH_SYNC;
        float *pv;
        int *pi, nb;
        if (p == SM_PATH_SYNC) {
            /* raw, softcap, mask, per-64-id best (value, id) */
            nb = sm_cdiv(V, SM_MM_ROWS);
            const size_t need = (size_t)nb * rn * (sizeof(float) + sizeof(int));
            if (need > kc->ws_bytes)
                return sm_errf(e, "sm_k_logits: workspace of %zu bytes below the %zu bytes of argmax partials (V=%d, %d rows)",
                               kc->ws_bytes, need, V, rn);
            pv = (float *)kc->ws;
            pi = (int *)(pv + (size_t)nb * rn);
            int rc;
            if (rn <= 8) rc = logits_launch<1>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else if (rn <= 16) rc = logits_launch<2>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else if (rn <= 32) rc = logits_launch<4>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else if (rn <= 64) rc = logits_launch<8>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else rc = logits_launch<16>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            if (rc) return -1;
        } else if (sm_k_logits_wg(kc, p == SM_PATH_WG2 ? 2 : 1, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, &pv, &pi, &nb,
                                  st, e)) {
            return -1;
        }
        /* argmax per row over the partials */
        argmax_reduce_kernel<<<rn, 256, 0, st>>>(pv, pi, nb, rn, argmax + r0);
        SM_LAUNCH_CHECK("argmax_reduce_kernel");
    }
    return 0;
}

int sm_k_logits(sm_kernel_ctx *kc, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V, int vocab_used,
                float m_o, float softcap, float *logits, int *argmax, cudaStream_t st, sm_err *e) {
    return sm_k_logits_path(kc, SM_PATH_AUTO, h, n, H, lm_head, V, vocab_used, m_o, softcap, logits, argmax, st, e);
}

/* ---- constraint masks (sm_k_mask_rows) ---- */

#define MK_EPT 16                       /* ids a thread of the slice kernel reads */
#define MK_THREADS 256
#define MK_SLICE (MK_THREADS * MK_EPT)  /* ids of a slice: one block */

/* The rows of one mask launch (kernel parameter, by value). */
typedef struct mask_rows {
    int row[SM_MASK_ROWS];     /* the logits row of each entry */
    int midx[SM_MASK_ROWS];    /* its mask in the masks buffer */
} mask_rows;

/* A slice's partial of one entry: its best allowed (value, id), and whether an allowed id < vocab_used is NaN or +Inf. */
typedef struct mask_part {
    float v;
    int i;
    int bad;
} mask_part;

/* Block (slice blockIdx.x, entry blockIdx.y): forbidden ids -> -inf in place, the best allowed
 * (value, id) among ids < vocab_used (sm_better) and the NaN / +Inf flag into parts.  Every
 * thread's MK_EPT loads are issued before any is used (lane-interleaved: coalesced): one block
 * a row would wait on one load at a time. */
__global__ void __launch_bounds__(MK_THREADS)
mask_slice_kernel(float *__restrict__ logits, size_t ld, int V, int vocab_used, const uint32_t *__restrict__ masks, int words,
                  mask_rows mr, int nslice, mask_part *__restrict__ parts) {
    __shared__ float sv[MK_THREADS / 32];
    __shared__ int si[MK_THREADS / 32];
    float *l = logits + (size_t)mr.row[blockIdx.y] * ld;
    const uint32_t *m = masks + (size_t)mr.midx[blockIdx.y] * words;
    const int v0 = blockIdx.x * MK_SLICE;
    float x[MK_EPT];
#pragma unroll
    for (int j = 0; j < MK_EPT; j++) {
        const int v = v0 + j * MK_THREADS + threadIdx.x;
        x[j] = v < V ? l[v] : -INFINITY;
    }
    float bv = -INFINITY;
    int bi = -1, bad = 0;
#pragma unroll
    for (int j = 0; j < MK_EPT; j++) {
        const int v = v0 + j * MK_THREADS + threadIdx.x;
        if (v >= V) continue;
        if (!((m[v >> 5] >> (v & 31)) & 1)) { /* forbidden: -inf, never a candidate */
            l[v] = -INFINITY;
            continue;
        }
        if (v >= vocab_used) continue;
        if (isnan(x[j]) || x[j] == INFINITY) bad = 1;
        else if (x[j] != -INFINITY && sm_better(x[j], v, bv, bi)) { bv = x[j]; bi = v; }
    }
    /* the block's best: warps by butterfly, then thread 0 over the warps */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, d);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, d);
        if (sm_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { sv[w] = bv; si[w] = bi; }
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        for (int q = 1; q < MK_THREADS / 32; q++)
            if (sm_better(sv[q], si[q], sv[0], si[0])) { sv[0] = sv[q]; si[0] = si[q]; }
        mask_part *p = parts + (size_t)blockIdx.y * nslice + blockIdx.x;
        p->v = sv[0];
        p->i = si[0];
        p->bad = bad;
    }
}

/* One warp an entry: its slices' partials reduced in the same order; the argmax written. */
__global__ void __launch_bounds__(32)
mask_reduce_kernel(const mask_part *__restrict__ parts, int nslice, mask_rows mr, int *__restrict__ argmax) {
    const mask_part *p = parts + (size_t)blockIdx.x * nslice;
    float bv = -INFINITY;
    int bi = -1, bad = 0;
    for (int q = threadIdx.x; q < nslice; q += 32) {
        bad |= p[q].bad;
        if (sm_better(p[q].v, p[q].i, bv, bi)) { bv = p[q].v; bi = p[q].i; }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, d);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, d);
        if (sm_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    bad = __any_sync(0xFFFFFFFFu, bad);
    if (threadIdx.x == 0) argmax[mr.row[blockIdx.x]] = bad ? -1 : bi;
}

int sm_k_mask_rows(sm_kernel_ctx *kc, float *logits, size_t ld, int V, int vocab_used, const uint32_t *masks, int words,
                   const int *rows, const int *midx, int n, int *argmax, cudaStream_t st, sm_err *e) {
    if (n < 0 || n > SM_MASK_ROWS || V < 1 || (size_t)V > ld || vocab_used < 1 || vocab_used > V || words < (V + 31) / 32)
        return sm_errf(e, "sm_k_mask_rows: bad shape n=%d V=%d ld=%zu vocab_used=%d words=%d", n, V, ld, vocab_used, words);
    if (n == 0) return 0;
    if (!logits || !masks || !rows || !midx || !argmax) return sm_errf(e, "sm_k_mask_rows: NULL argument");
    const int nslice = sm_cdiv(V, MK_SLICE);
    const size_t need = (size_t)n * nslice * sizeof(mask_part);
    if (need > kc->ws_bytes) return sm_errf(e, "sm_k_mask_rows: workspace of %zu bytes below the %zu of the partials", kc->ws_bytes, need);
    mask_rows mr;
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || midx[i] < 0) return sm_errf(e, "sm_k_mask_rows: entry %d: row %d, mask %d", i, rows[i], midx[i]);
        mr.row[i] = rows[i];
        mr.midx[i] = midx[i];
    }
    mask_part *parts = (mask_part *)kc->ws;
    mask_slice_kernel<<<dim3(nslice, n), MK_THREADS, 0, st>>>(logits, ld, V, vocab_used, masks, words, mr, nslice, parts);
    SM_LAUNCH_CHECK("mask_slice_kernel");
    mask_reduce_kernel<<<n, 32, 0, st>>>(parts, nslice, mr, argmax);
    SM_LAUNCH_CHECK("mask_reduce_kernel");
    return 0;
}
