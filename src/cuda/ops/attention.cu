/* ops/attention.cu: the stock kernels of paged attention (bodies in ops/attention.cuh), the
 * launchers that choose the split-K factor and the grid, and the checked extern "C" entries.
 *
 * Decode / verify: one block per (tile of 64/G rows, KV head, split) on tensor cores, then
 * (nsplit > 1) one warp per (row, query head) to combine.  When tiles x KV heads cannot fill the
 * GPU the keys are split until one wave of resident blocks (SM_ATT_ITEMS_PER_SM an SM) is
 * full, each split >= 128 keys, bounded by the workspace; the splits are chunks of an
 * absolute key grid (sm_att_plan), so a row's bits never depend on the rows beside it.
 * Prefill: one block per (tile of 128/G rows, KV head).  We rejected choosing nsplit per row
 * (from its own length): a row's bits would then depend on its position in the batch's plan.
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/attention.cuh"

/* ---- stock kernels ---- */

/* One tile item per block: blockIdx.x = tile * nkv + KV head, blockIdx.y = split of gridDim.y. */
template <int G>
__global__ void __launch_bounds__(SM_ATT_THREADS)
att_decode_kernel(const uint16_t *__restrict__ q, int ldq, const uint16_t *__restrict__ gate, int ldg,
                  const uint16_t *__restrict__ kv, const int *__restrict__ tables, int max_bpr,
                  const int *__restrict__ row_req, const int *__restrict__ pos, int n, int nh, int nkv,
                  int window, float scale, float eps, uint16_t *__restrict__ out, float *__restrict__ wsO,
                  float *__restrict__ wsM, float *__restrict__ wsL, int chunk) {
    __shared__ sm_att_tile_smem sh;
    sm_att_tile_item<G>(q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh, nkv, window, scale, eps, out, wsO,
                        wsM, wsL, blockIdx.x / nkv, blockIdx.x % nkv, blockIdx.y, gridDim.y, chunk, sh, sm_team_block());
}

/* One combine item per warp, SM_ATT_WARPS a block. */
__global__ void __launch_bounds__(SM_ATT_THREADS)
att_combine_kernel(const float *__restrict__ wsO, const float *__restrict__ wsM, const float *__restrict__ wsL,
                   int nsplit, int n, int nh, const uint16_t *__restrict__ gate, int ldg, float eps,
                   uint16_t *__restrict__ out) {
    const int id = blockIdx.x * SM_ATT_WARPS + (threadIdx.x >> 5);
    if (id >= n * nh) return; /* warp-uniform; no block barrier in the body */
    sm_att_combine_item(wsO, wsM, wsL, nsplit, n, nh, gate, ldg, eps, out, id);
}

/* ---- launchers and checked entries ---- */

int sm_att_plan(const sm_kernel_ctx *kc, int n, int nh, int nkv, int window, int max_ctx, int *chunk) {
    const int tiles = sm_cdiv(n, 64 / (nh / nkv)), items0 = tiles * nkv;
    const int ctx = max_ctx > 0 ? max_ctx : (1 << 16);
    const int sliding = window > 0 && window < ctx;
    const int span = sliding ? window + SM_ATT_TK : ctx; /* keys a run of nearby rows can see */
    const int wave = (kc->att_items_per_sm > 0 ? kc->att_items_per_sm : SM_ATT_ITEMS_PER_SM) * kc->num_sms;
    int nsplit = 1;
    if (items0 < wave) {
        /* as many splits as one wave of resident items holds (a second, partial wave costs
         * more than it balances), each split >= 128 keys of the span; sliding layers take at
         * least 3: their moving window straddles 2 chunks of 2 very unevenly */
        nsplit = wave / items0;
        if (sliding && nsplit == 2) nsplit = 3;
        const int cap = sm_cdiv(span, 128);
        if (nsplit > cap) nsplit = cap;
        const size_t per = (size_t)n * nh * 66 * sizeof(float);
        if ((size_t)nsplit * per > kc->ws_bytes) nsplit = (int)(kc->ws_bytes / per);
        if (nsplit > 65535) nsplit = 65535;
        if (nsplit < 1) nsplit = 1;
    }
    /* chunks on the absolute key grid: nsplit of them cover [0, ctx) (full) or any window of
     * the span (sliding); one split covers everything */
    int ch = nsplit == 1 ? ctx : sliding ? sm_cdiv(span, nsplit - 1) : sm_cdiv(ctx, nsplit);
    ch = (int)(((long long)ch + SM_ATT_TK - 1) / SM_ATT_TK * SM_ATT_TK);
    if (chunk) *chunk = ch;
    return nsplit;
}

template <int G>
static int att_decode_launch(sm_kernel_ctx *kc, const uint16_t *q, int ldq, const uint16_t *gate, int ldg,
                             const uint16_t *kv, const int *tables, int max_bpr, const int *row_req, const int *pos,
                             int n, int nh, int nkv, int window, float scale, float eps, int max_ctx, uint16_t *out,
                             cudaStream_t st, sm_err *e) {
    int chunk;
    const int blocks0 = sm_cdiv(n, 64 / G) * nkv, nsplit = sm_att_plan(kc, n, nh, nkv, window, max_ctx, &chunk);
    float *wsO = (float *)kc->ws;
    float *wsM = wsO + (size_t)nsplit * n * nh * 64;
    float *wsL = wsM + (size_t)nsplit * n * nh;
    dim3 grid(blocks0, nsplit);
    att_decode_kernel<G><<<grid, SM_ATT_THREADS, 0, st>>>(q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh,
                                                       nkv, window, scale, eps, out, wsO, wsM, wsL, chunk);
    SM_LAUNCH_CHECK("att_decode_kernel");
    if (nsplit > 1) {
        att_combine_kernel<<<sm_cdiv(n * nh, SM_ATT_WARPS), SM_ATT_THREADS, 0, st>>>(wsO, wsM, wsL, nsplit, n, nh, gate, ldg,
                                                                              eps, out);
        SM_LAUNCH_CHECK("att_combine_kernel");
    }
    return 0;
}

static int att_check(const char *who, int n, int nh, int nkv, const uint16_t *q, int ldq, const uint16_t *gate,
                     int ldg, const void *kv, const void *table, const uint16_t *out, sm_err *e) {
    if (n < 0 || nh <= 0 || nkv <= 0 || nh % nkv)
        return sm_errf(e, "%s: bad heads n=%d nh=%d nkv=%d (nh %% nkv must be 0)", who, n, nh, nkv);
    const int G = nh / nkv;
    if (G != 1 && G != 2 && G != 4 && G != 8 && G != 16)
        return sm_errf(e, "%s: %d query heads per KV head unsupported (1, 2, 4, 8 or 16)", who, G);
    if (ldq < nh * 64 || ldg < nh * 64) return sm_errf(e, "%s: row stride ldq=%d or ldg=%d below nh*64=%d", who, ldq, ldg, nh * 64);
    if (ldq % 8 || ldg % 8) return sm_errf(e, "%s: row strides ldq=%d, ldg=%d must be multiples of 8", who, ldq, ldg);
    if (!q || !gate || !kv || !table || !out) return sm_errf(e, "%s: NULL pointer argument", who);
    if (!sm_aligned(q, 16) || !sm_aligned(gate, 16) || !sm_aligned(kv, 16) || !sm_aligned(out, 16))
        return sm_errf(e, "%s: q, gate, kv and out must be 16-byte aligned", who);
    return 0;
}

int sm_k_attention(sm_kernel_ctx *kc, const uint16_t *q, int ldq, const uint16_t *gate, int ldg, const uint16_t *kv,
                   const int *tables, int max_bpr, const int *row_req, const int *pos, int n, int nh, int nkv,
                   int window, float scale, float eps, int max_ctx, uint16_t *out, cudaStream_t st, sm_err *e) {
    if (att_check("sm_k_attention", n, nh, nkv, q, ldq, gate, ldg, kv, tables, out, e)) return -1;
    if (!row_req || !pos || max_bpr <= 0) return sm_errf(e, "sm_k_attention: NULL row_req/pos or max_bpr=%d", max_bpr);
    if ((int64_t)n * nkv > 2147483647) return sm_errf(e, "sm_k_attention: n=%d rows too many", n);
    if (n == 0) return 0;
    switch (nh / nkv) {
    case 1: return att_decode_launch<1>(kc, q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh, nkv, window, scale, eps, max_ctx, out, st, e);
    case 2: return att_decode_launch<2>(kc, q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh, nkv, window, scale, eps, max_ctx, out, st, e);
    case 4: return att_decode_launch<4>(kc, q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh, nkv, window, scale, eps, max_ctx, out, st, e);
    case 8: return att_decode_launch<8>(kc, q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh, nkv, window, scale, eps, max_ctx, out, st, e);
    default: return att_decode_launch<16>(kc, q, ldq, gate, ldg, kv, tables, max_bpr, row_req, pos, n, nh, nkv, window, scale, eps, max_ctx, out, st, e);
    }
}

/* ---- prefill ---- */

/* One prefill item per block: blockIdx.x = tile of 128/G rows, blockIdx.y = KV head. */
template <int G>
__global__ void __launch_bounds__(SM_ATT_PF_THREADS)
att_prefill_kernel(const uint16_t *__restrict__ q, int ldq, const uint16_t *__restrict__ gate, int ldg,
                   const uint16_t *__restrict__ kv, const int *__restrict__ table, int pos0, int T, int nh,
                   int nkv, int window, float scale, float eps, uint16_t *__restrict__ out) {
    __shared__ sm_att_prefill_smem sh;
    sm_att_prefill_item<G>(q, ldq, gate, ldg, kv, table, pos0, T, nh, nkv, window, scale, eps, out, blockIdx.x, blockIdx.y, sh);
}

int sm_k_attention_prefill(const uint16_t *q, int ldq, const uint16_t *gate, int ldg, const uint16_t *kv,
                           const int *table, int pos0, int T, int nh, int nkv, int window, float scale, float eps,
                           uint16_t *out, cudaStream_t st, sm_err *e) {
    if (att_check("sm_k_attention_prefill", T, nh, nkv, q, ldq, gate, ldg, kv, table, out, e)) return -1;
    if (pos0 < 0) return sm_errf(e, "sm_k_attention_prefill: negative start position %d", pos0);
    if (T == 0) return 0;
    const int G = nh / nkv;
    dim3 grid(sm_cdiv(T, SM_ATT_PF_THREADS / G), nkv);
    switch (G) {
    case 1: att_prefill_kernel<1><<<grid, SM_ATT_PF_THREADS, 0, st>>>(q, ldq, gate, ldg, kv, table, pos0, T, nh, nkv, window, scale, eps, out); break;
    case 2: att_prefill_kernel<2><<<grid, SM_ATT_PF_THREADS, 0, st>>>(q, ldq, gate, ldg, kv, table, pos0, T, nh, nkv, window, scale, eps, out); break;
    case 4: att_prefill_kernel<4><<<grid, SM_ATT_PF_THREADS, 0, st>>>(q, ldq, gate, ldg, kv, table, pos0, T, nh, nkv, window, scale, eps, out); break;
    case 8: att_prefill_kernel<8><<<grid, SM_ATT_PF_THREADS, 0, st>>>(q, ldq, gate, ldg, kv, table, pos0, T, nh, nkv, window, scale, eps, out); break;
    default: att_prefill_kernel<16><<<grid, SM_ATT_PF_THREADS, 0, st>>>(q, ldq, gate, ldg, kv, table, pos0, T, nh, nkv, window, scale, eps, out); break;
    }
    SM_LAUNCH_CHECK("att_prefill_kernel");
    return 0;
}
