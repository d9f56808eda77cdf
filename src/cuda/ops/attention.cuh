/* ops/attention.cuh: the device bodies of paged attention with the fused output norm and gate
 * (docs/model.md section 5): decode / verify work items (split-K) and their combine, prefill tiles.
 *
 * Decode / verify: the unit is one (row, KV head, split) for one block of SM_ATT_THREADS
 * threads; the G = nh/nkv query heads of the group share every K/V row the block reads.
 * Scores with lane = key (each lane reads its key's 128-byte K row, q is broadcast from shared
 * memory), online softmax in f32 per warp, then P.V with lane = pair of dims (coalesced
 * 128-byte V rows); the 4 warps merge through shared memory.  With nsplit > 1 the key range is
 * cut in nsplit equal chunks (multiples of 32 keys), each item writes its (max, sum, o) partial
 * to the workspace and the combine item (one warp per (row, query head)) merges them in split
 * order.  The epilogue (divide by the sum, per-head rms norm, times sigmoid(gate), r16) runs in
 * whichever finishes.  The bits of a row depend on nsplit, never on which block runs an item.
 * Prefill (T rows of one request at pos0..pos0+T-1): the unit is one (KV head, tile of 128/G
 * rows) for one block of 128 threads, thread = one query (row, head) holding q and o in
 * registers, K/V tiles of 16 keys staged in shared memory as f32 and read as broadcasts.
 * Items that use block barriers need every thread of a block of exactly that size; the scratch
 * comes from the caller (a struct below, any shared-memory address aligned to 16).
 * We rejected tensor cores for now (correctness first; decode attention is a small part of
 * a verify step, prefill is not graph-captured) and one body for both cases (a per-row
 * block re-reads the whole context for every prefill row).
 */
#ifndef SM_CUDA_OPS_ATTENTION_CUH
#define SM_CUDA_OPS_ATTENTION_CUH
#include "cuda/common.cuh"

#define SM_ATT_WARPS 4
#define SM_ATT_THREADS (SM_ATT_WARPS * 32)         /* threads of a decode item */
#define SM_ATT_PAGE_ELEMS (SM_KV_BLOCK * 128)       /* bf16 per (page, KV head) */
#define SM_ATT_PF_KEYS 16                           /* keys per prefill tile */
#define SM_ATT_PF_THREADS 128                       /* threads of a prefill item */

/* Shared scratch of a decode item (G query heads per KV head). */
template <int G> struct __align__(16) sm_att_decode_smem {
    float qs[G][64];                 /* the group's query heads, f32 */
    float ps[SM_ATT_WARPS][32][G];   /* per warp: p of its 32 keys of the batch */
    float os[SM_ATT_WARPS][G][64];   /* per warp: o, for the merge of the warps */
    float ms[SM_ATT_WARPS][G];       /* per warp: running max */
    float ls[SM_ATT_WARPS][G];       /* per warp: running sum */
};
/* Shared scratch of a prefill item. */
typedef struct __align__(16) sm_att_prefill_smem {
    float ks[SM_ATT_PF_KEYS][64];    /* K rows of the key tile, f32 */
    float vs[SM_ATT_PF_KEYS][64];    /* V rows of the key tile, f32 */
} sm_att_prefill_smem;

/* Row of key `key` (K at +0, V at +64) of KV head h, through the request's block table. */
__device__ __forceinline__ const uint16_t *sm_att_kv_row(const uint16_t *kv, const int *table, int nkv, int h, int key) {
    return kv + ((size_t)table[key / SM_KV_BLOCK] * nkv + h) * SM_ATT_PAGE_ELEMS + (size_t)(key % SM_KV_BLOCK) * 128;
}

/* Epilogue of one head, lane = dims (2 lane, 2 lane + 1): o = a / L, o *= rsqrt(mean o^2 + eps),
 * out = r16(o * sigmoid(gate)). */
__device__ __forceinline__ void sm_att_finish(float a0, float a1, float L, const uint16_t *gate, float eps,
                                              uint16_t *out, int lane) {
    const float o0 = L > 0.0f ? a0 / L : 0.0f, o1 = L > 0.0f ? a1 / L : 0.0f;
    const float ss = sm_warp_sum(__fadd_rn(__fmul_rn(o0, o0), __fmul_rn(o1, o1)));
    const float r = 1.0f / sqrtf(ss / 64.0f + eps);
    const uint32_t gg = ((const uint32_t *)gate)[lane];
    const float s0 = 1.0f / (1.0f + expf(-sm_bf_lo(gg))), s1 = 1.0f / (1.0f + expf(-sm_bf_hi(gg)));
    const uint32_t lo = sm_tobf(__fmul_rn(__fmul_rn(o0, r), s0)), hi = sm_tobf(__fmul_rn(__fmul_rn(o1, r), s1));
    ((uint32_t *)out)[lane] = lo | (hi << 16);
}

/* Decode / verify item (row, KV head h, split of nsplit) by the SM_ATT_THREADS threads of team t
 * (common.cuh; the stock kernel: its block).  nsplit == 1: out[row, heads of h] is written; else the partials of the split go to
 * wsO [nsplit][n][nh][64], wsM / wsL [nsplit][n][nh] for sm_att_combine_item.  Arguments as
 * sm_k_attention (kernels.h). */
template <int G>
__device__ __forceinline__ void sm_att_decode_item(const uint16_t *__restrict__ q, int ldq, const uint16_t *__restrict__ gate,
                                                   int ldg, const uint16_t *__restrict__ kv, const int *__restrict__ tables,
                                                   int max_bpr, const int *__restrict__ row_req, const int *__restrict__ pos,
                                                   int n, int nh, int nkv, int window, float scale, float eps,
                                                   uint16_t *__restrict__ out, float *__restrict__ wsO,
                                                   float *__restrict__ wsM, float *__restrict__ wsL, int row, int h,
                                                   int split, int nsplit, sm_att_decode_smem<G> &sh,
                                                   const sm_team &t) {
    const int warp = t.tid >> 5, lane = t.tid & 31;
    /* this split's keys [kb, ke) of the row's visible range [lo, p] */
    const int p = pos[row];
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int len = max(p + 1 - lo, 0);
    const int chunk = (((len + nsplit - 1) / nsplit) + 31) & ~31;
    const int kb = lo + split * chunk, ke = min(kb + chunk, p + 1);
    const int *table = tables + (size_t)row_req[row] * max_bpr;

    /* the group's G query heads, f32 */
    for (int i = t.tid; i < G * 64; i += SM_ATT_THREADS)
        sh.qs[i >> 6][i & 63] = sm_bf(q[(size_t)row * ldq + (size_t)h * G * 64 + i]);
    sm_team_sync(t);

    float m_run[G], l_run[G], o0[G], o1[G];
#pragma unroll
    for (int g = 0; g < G; g++) { m_run[g] = -INFINITY; l_run[g] = 0.0f; o0[g] = 0.0f; o1[g] = 0.0f; }

    for (int base = kb + warp * 32; base < ke; base += SM_ATT_WARPS * 32) {
        const int j = base + lane;
        const int valid = j < ke;
        /* scores s_g = q_g . k_j * scale, lane = key */
        float sc[G];
#pragma unroll
        for (int g = 0; g < G; g++) sc[g] = 0.0f;
        if (valid) {
            const uint4 *kp = (const uint4 *)sm_att_kv_row(kv, table, nkv, h, j);
            uint4 kr[8];
#pragma unroll
            for (int c = 0; c < 8; c++) kr[c] = kp[c];
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const float kf[8] = {sm_bf_lo(kr[c].x), sm_bf_hi(kr[c].x), sm_bf_lo(kr[c].y), sm_bf_hi(kr[c].y),
                                     sm_bf_lo(kr[c].z), sm_bf_hi(kr[c].z), sm_bf_lo(kr[c].w), sm_bf_hi(kr[c].w)};
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float4 qa = *(const float4 *)&sh.qs[g][8 * c], qb = *(const float4 *)&sh.qs[g][8 * c + 4];
                    float a = sc[g];
                    a = fmaf(qa.x, kf[0], a); a = fmaf(qa.y, kf[1], a); a = fmaf(qa.z, kf[2], a); a = fmaf(qa.w, kf[3], a);
                    a = fmaf(qb.x, kf[4], a); a = fmaf(qb.y, kf[5], a); a = fmaf(qb.z, kf[6], a); a = fmaf(qb.w, kf[7], a);
                    sc[g] = a;
                }
            }
        }
        /* online softmax: new running max, rescale, p = exp(s - max) */
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float s = valid ? sc[g] * scale : -INFINITY;
            const float mnew = fmaxf(m_run[g], sm_warp_max(s)); /* finite: lane 0 is valid */
            const float corr = m_run[g] == -INFINITY ? 0.0f : expf(m_run[g] - mnew);
            const float pj = valid ? expf(s - mnew) : 0.0f;
            l_run[g] = l_run[g] * corr + pj; /* lane-local part of the sum */
            o0[g] *= corr;
            o1[g] *= corr;
            m_run[g] = mnew;
            sh.ps[warp][lane][g] = pj;
        }
        __syncwarp();
        /* o += p_j v_j, lane = dims (2 lane, 2 lane + 1) */
        const int nk = min(32, ke - base);
#pragma unroll 4
        for (int jj = 0; jj < nk; jj++) {
            const uint32_t vv = ((const uint32_t *)(sm_att_kv_row(kv, table, nkv, h, base + jj) + 64))[lane];
            const float v0 = sm_bf_lo(vv), v1 = sm_bf_hi(vv);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float pj = sh.ps[warp][jj][g];
                o0[g] = fmaf(pj, v0, o0[g]);
                o1[g] = fmaf(pj, v1, o1[g]);
            }
        }
        __syncwarp(); /* ps is rewritten by the next batch */
    }

    /* merge the 4 warps: M = max m_w, L = sum l_w e^(m_w - M), O = sum o_w e^(m_w - M) */
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float lt = sm_warp_sum(l_run[g]);
        if (lane == 0) { sh.ms[warp][g] = m_run[g]; sh.ls[warp][g] = lt; }
        *(float2 *)&sh.os[warp][g][2 * lane] = make_float2(o0[g], o1[g]);
    }
    sm_team_sync(t);
    for (int g = warp; g < G; g += SM_ATT_WARPS) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < SM_ATT_WARPS; w++) M = fmaxf(M, sh.ms[w][g]);
        float L = 0.0f, a0 = 0.0f, a1 = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < SM_ATT_WARPS; w++) {
                const float f = sh.ms[w][g] == -INFINITY ? 0.0f : expf(sh.ms[w][g] - M);
                L += sh.ls[w][g] * f;
                a0 += sh.os[w][g][2 * lane] * f;
                a1 += sh.os[w][g][2 * lane + 1] * f;
            }
        }
        const int hq = h * G + g;
        if (nsplit == 1) {
            sm_att_finish(a0, a1, L, gate + (size_t)row * ldg + (size_t)hq * 64, eps, out + ((size_t)row * nh + hq) * 64, lane);
        } else {
            const size_t id = ((size_t)split * n + row) * nh + hq;
            *(float2 *)&wsO[id * 64 + 2 * lane] = make_float2(a0, a1);
            if (lane == 0) { wsM[id] = M; wsL[id] = L; }
        }
    }
}

/* Combine item `id` = row * nh + query head, by one warp: merge the nsplit partials in split
 * order, then finish into out. */
__device__ __forceinline__ void sm_att_combine_item(const float *__restrict__ wsO, const float *__restrict__ wsM,
                                                    const float *__restrict__ wsL, int nsplit, int n, int nh,
                                                    const uint16_t *__restrict__ gate, int ldg, float eps,
                                                    uint16_t *__restrict__ out, int id) {
    const int lane = threadIdx.x & 31;
    const int row = id / nh, hq = id % nh;
    const size_t stride = (size_t)n * nh;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, wsM[s * stride + id]);
    float L = 0.0f, a0 = 0.0f, a1 = 0.0f;
    if (M != -INFINITY) {
        for (int s = 0; s < nsplit; s++) {
            const float ms = wsM[s * stride + id];
            const float f = ms == -INFINITY ? 0.0f : expf(ms - M);
            const float2 o = *(const float2 *)&wsO[(s * stride + id) * 64 + 2 * lane];
            L += wsL[s * stride + id] * f;
            a0 += o.x * f;
            a1 += o.y * f;
        }
    }
    sm_att_finish(a0, a1, L, gate + (size_t)row * ldg + (size_t)hq * 64, eps, out + (size_t)id * 64, lane);
}

/* Prefill item (tile of 128/G rows, KV head h) by all SM_ATT_PF_THREADS threads of the
 * block.  Arguments as sm_k_attention_prefill (kernels.h). */
template <int G>
__device__ __forceinline__ void sm_att_prefill_item(const uint16_t *__restrict__ q, int ldq, const uint16_t *__restrict__ gate,
                                                    int ldg, const uint16_t *__restrict__ kv, const int *__restrict__ table,
                                                    int pos0, int T, int nh, int nkv, int window, float scale, float eps,
                                                    uint16_t *__restrict__ out, int tile, int h, sm_att_prefill_smem &sh) {
    constexpr int QT = SM_ATT_PF_THREADS / G; /* rows per tile */
    const int r = threadIdx.x / G, g = threadIdx.x % G;
    const int first = tile * QT, last = min(first + QT, T) - 1;
    const int i = first + r;
    const int active = i < T;
    const int hq = h * G + g;
    const int pi = pos0 + (active ? i : last);
    const int lo_i = window > 0 ? max(0, pi - window + 1) : 0;
    /* keys any row of the tile sees */
    const int kmax = pos0 + last;
    const int kmin = window > 0 ? max(0, pos0 + first - window + 1) : 0;

    float qr[64], o[64];
    {
        const uint4 *qp = (const uint4 *)(q + (size_t)(active ? i : last) * ldq + (size_t)hq * 64);
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const uint4 u = qp[c];
            qr[8 * c + 0] = sm_bf_lo(u.x); qr[8 * c + 1] = sm_bf_hi(u.x);
            qr[8 * c + 2] = sm_bf_lo(u.y); qr[8 * c + 3] = sm_bf_hi(u.y);
            qr[8 * c + 4] = sm_bf_lo(u.z); qr[8 * c + 5] = sm_bf_hi(u.z);
            qr[8 * c + 6] = sm_bf_lo(u.w); qr[8 * c + 7] = sm_bf_hi(u.w);
        }
    }
#pragma unroll
    for (int d = 0; d < 64; d++) o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (int t0 = kmin; t0 <= kmax; t0 += SM_ATT_PF_KEYS) {
        /* stage SM_ATT_PF_KEYS keys: K and V rows as f32 */
        __syncthreads(); /* previous tile fully read */
        for (int u = threadIdx.x; u < SM_ATT_PF_KEYS * 16; u += SM_ATT_PF_THREADS) {
            const int jj = u >> 4, part = u & 15, key = t0 + jj;
            uint4 w = make_uint4(0, 0, 0, 0);
            if (key <= kmax) w = ((const uint4 *)sm_att_kv_row(kv, table, nkv, h, key))[part];
            float *dst = part < 8 ? &sh.ks[jj][part * 8] : &sh.vs[jj][(part - 8) * 8];
            *(float4 *)dst = make_float4(sm_bf_lo(w.x), sm_bf_hi(w.x), sm_bf_lo(w.y), sm_bf_hi(w.y));
            *(float4 *)(dst + 4) = make_float4(sm_bf_lo(w.z), sm_bf_hi(w.z), sm_bf_lo(w.w), sm_bf_hi(w.w));
        }
        __syncthreads();
        /* scores of this thread's query over the tile, masked to [lo_i, pi] */
        float s[SM_ATT_PF_KEYS];
        float tmax = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < SM_ATT_PF_KEYS; jj++) {
            float a = 0.0f;
#pragma unroll
            for (int d = 0; d < 64; d += 4) {
                const float4 kk = *(const float4 *)&sh.ks[jj][d];
                a = fmaf(qr[d], kk.x, a); a = fmaf(qr[d + 1], kk.y, a);
                a = fmaf(qr[d + 2], kk.z, a); a = fmaf(qr[d + 3], kk.w, a);
            }
            const int key = t0 + jj;
            const int ok = active && key <= pi && key >= lo_i;
            s[jj] = ok ? a * scale : -INFINITY;
            tmax = fmaxf(tmax, s[jj]);
        }
        if (tmax == -INFINITY) continue; /* nothing visible in this tile (no barrier skipped: next one is at loop top) */
        /* online softmax update, then o += p v */
        const float mnew = fmaxf(m, tmax);
        const float corr = m == -INFINITY ? 0.0f : expf(m - mnew);
        l *= corr;
#pragma unroll
        for (int d = 0; d < 64; d++) o[d] *= corr;
#pragma unroll
        for (int jj = 0; jj < SM_ATT_PF_KEYS; jj++) {
            const float pj = s[jj] == -INFINITY ? 0.0f : expf(s[jj] - mnew);
            l += pj;
#pragma unroll
            for (int d = 0; d < 64; d += 4) {
                const float4 vv = *(const float4 *)&sh.vs[jj][d];
                o[d] = fmaf(pj, vv.x, o[d]); o[d + 1] = fmaf(pj, vv.y, o[d + 1]);
                o[d + 2] = fmaf(pj, vv.z, o[d + 2]); o[d + 3] = fmaf(pj, vv.w, o[d + 3]);
            }
        }
        m = mnew;
    }
    if (!active) return;
    /* o / l, per-head rms norm, times sigmoid(gate), r16 */
    float ss = 0.0f;
#pragma unroll
    for (int d = 0; d < 64; d++) {
        o[d] = l > 0.0f ? o[d] / l : 0.0f;
        ss = fmaf(o[d], o[d], ss);
    }
    const float rr = 1.0f / sqrtf(ss / 64.0f + eps);
    const uint4 *gp = (const uint4 *)(gate + (size_t)i * ldg + (size_t)hq * 64);
    uint4 *op = (uint4 *)(out + ((size_t)i * nh + hq) * 64);
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const uint4 gu = gp[c];
        const uint32_t gw[4] = {gu.x, gu.y, gu.z, gu.w};
        uint32_t ow[4];
#pragma unroll
        for (int k2 = 0; k2 < 4; k2++) {
            const int d = 8 * c + 2 * k2;
            const float s0 = 1.0f / (1.0f + expf(-sm_bf_lo(gw[k2]))), s1 = 1.0f / (1.0f + expf(-sm_bf_hi(gw[k2])));
            const uint32_t lo16 = sm_tobf(__fmul_rn(__fmul_rn(o[d], rr), s0));
            const uint32_t hi16 = sm_tobf(__fmul_rn(__fmul_rn(o[d + 1], rr), s1));
            ow[k2] = lo16 | (hi16 << 16);
        }
        op[c] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
    }
}

#endif
