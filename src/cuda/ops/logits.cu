/* logits.cu: final logits and greedy argmax (SPEC.md section 4, last lines).
 *
 * lm_head [V, H] is the largest matrix of a step (3.3 GB in the real model); it is streamed
 * once per chunk of up to 128 rows.  Two kernels compute raw = h . lm_head[v]:
 *  - the wgmma stream-K kernel of matmul.cu (sm_k_logits_wg) with its logits epilogue, tiles
 *    of 128 * LG_WG_MT ids: 94% of the read floor at 8 rows, 79% at 128 (measured);
 *  - without the wgmma path (not a Hopper device, old driver), or when forced for tests: the
 *    mma.sync swap-AB core of common.cuh, one block per 64 ids (82% at 8 rows, but 30% at 128:
 *    bound by mma.sync issue, and it re-reads all of h from L2 for every 64 ids).
 * Both epilogues apply the softcap and the vocab_used mask, write f32 logits when asked, and
 * reduce each block's (or tile's) ids to one (value, id) per row; argmax_reduce_kernel then
 * reduces those partials per row.  Both reductions take the larger value and, on equal values,
 * the lower id, so the result is the reference's argmax whatever the grid.
 * We rejected writing all logits and running a separate argmax over [n, V]: that is 800 KB a
 * row of extra traffic when the caller only wants the argmax.
 */
#include "cuda/common.cuh"
#include "cuda/kernels.h"

template <int NT>
__global__ void __launch_bounds__(SM_MM_WARPS * 32)
logits_kernel(const uint16_t *__restrict__ h, int n, int k, const uint16_t *__restrict__ Wl, int V, int vocab_used,
              float m_o, float cap, float *__restrict__ logits, float *__restrict__ pv, int *__restrict__ pi) {
    extern __shared__ uint4 xs[];
    __shared__ float bv_s[SM_MM_WARPS][NT * 8];
    __shared__ int bi_s[SM_MM_WARPS][NT * 8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * SM_MM_ROWS + warp * 16;
    float acc[NT][4];
    /* raw = h . lm_head[v] for this block's 64 ids, f32 */
    sm_mm_core<NT>(h, n, k, Wl, V, row0, 0, k >> 5, xs, acc);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int tok = nt * 8 + 2 * t + e2;
            float best = 0.0f;
            int bi = -1;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = row0 + g + 8 * hh;
                /* softcap c * tanh(raw * m_o / c); ids >= vocab_used masked */
                const float x = acc[nt][2 * hh + e2] * m_o;
                float v = cap > 0.0f ? cap * tanhf(x / cap) : x;
                if (row >= vocab_used) v = -INFINITY;
                if (logits && row < V && tok < n) logits[(size_t)tok * V + row] = v;
                if (row < vocab_used && sm_better(v, row, best, bi)) { best = v; bi = row; }
            }
            /* best of the warp's 16 ids for this token: reduce over g (lane bits 2..4) */
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
                const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
                if (sm_better(ov, oi, best, bi)) { best = ov; bi = oi; }
            }
            if (g == 0) { bv_s[warp][tok] = best; bi_s[warp][tok] = bi; }
        }
    }
    __syncthreads();
    /* best of the block's 64 ids per token */
    for (int tok = threadIdx.x; tok < n; tok += blockDim.x) {
        float best = bv_s[0][tok];
        int bi = bi_s[0][tok];
        for (int w = 1; w < SM_MM_WARPS; w++)
            if (sm_better(bv_s[w][tok], bi_s[w][tok], best, bi)) { best = bv_s[w][tok]; bi = bi_s[w][tok]; }
        pv[(size_t)blockIdx.x * n + tok] = best;
        pi[(size_t)blockIdx.x * n + tok] = bi;
    }
}

/* argmax[tok] = best over the nb block partials of token tok (one block per token). */
__global__ void __launch_bounds__(256)
argmax_reduce_kernel(const float *__restrict__ pv, const int *__restrict__ pi, int nb, int n, int *__restrict__ argmax) {
    __shared__ float sv[8];
    __shared__ int si[8];
    const int tok = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float best = 0.0f;
    int bi = -1;
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        if (sm_better(pv[(size_t)b * n + tok], pi[(size_t)b * n + tok], best, bi)) { best = pv[(size_t)b * n + tok]; bi = pi[(size_t)b * n + tok]; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (sm_better(ov, oi, best, bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++)
            if (sm_better(sv[w], si[w], best, bi)) { best = sv[w]; bi = si[w]; }
        argmax[tok] = bi < 0 ? 0 : bi;
    }
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
#define LG_WG_MT 1         /* its tiles: 128 * LG_WG_MT ids (measured: 256-id tiles 72% of the
                            * floor at 128 rows, 128-id tiles 79%; equal at 8 rows) */

int sm_k_logits_path(sm_cuda_ctx *c, int path, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V,
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
        if (p == SM_PATH_AUTO) p = c->tma_encode && rn >= LG_WG_MIN_ROWS ? (LG_WG_MT == 2 ? SM_PATH_WG2 : SM_PATH_WG1) : SM_PATH_SYNC;
        float *pv;
        int *pi, nb;
        if (p == SM_PATH_SYNC) {
            /* raw, softcap, mask, per-64-id best (value, id) */
            nb = sm_cdiv(V, SM_MM_ROWS);
            const size_t need = (size_t)nb * rn * (sizeof(float) + sizeof(int));
            if (need > c->ws_bytes)
                return sm_errf(e, "sm_k_logits: workspace of %zu bytes below the %zu bytes of argmax partials (V=%d, %d rows)",
                               c->ws_bytes, need, V, rn);
            pv = (float *)c->ws;
            pi = (int *)(pv + (size_t)nb * rn);
            int rc;
            if (rn <= 8) rc = logits_launch<1>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else if (rn <= 16) rc = logits_launch<2>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else if (rn <= 32) rc = logits_launch<4>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else if (rn <= 64) rc = logits_launch<8>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            else rc = logits_launch<16>(nb, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, pv, pi, st, e);
            if (rc) return -1;
        } else if (sm_k_logits_wg(c, p == SM_PATH_WG2 ? 2 : 1, hr, rn, H, lm_head, V, vocab_used, m_o, softcap, lr, &pv, &pi, &nb,
                                  st, e)) {
            return -1;
        }
        /* argmax per row over the partials */
        argmax_reduce_kernel<<<rn, 256, 0, st>>>(pv, pi, nb, rn, argmax + r0);
        SM_LAUNCH_CHECK("argmax_reduce_kernel");
    }
    return 0;
}

int sm_k_logits(sm_cuda_ctx *c, const uint16_t *h, int n, int H, const uint16_t *lm_head, int V, int vocab_used,
                float m_o, float softcap, float *logits, int *argmax, cudaStream_t st, sm_err *e) {
    return sm_k_logits_path(c, SM_PATH_AUTO, h, n, H, lm_head, V, vocab_used, m_o, softcap, logits, argmax, st, e);
}
