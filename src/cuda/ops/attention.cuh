/* ops/attention.cuh: the device bodies of paged attention with the fused output norm and gate
 * (docs/model.md section 5): decode / verify tile items (split-K) and their combine, prefill tiles.
 *
 * Decode / verify: the unit is one (tile of 64/G step rows, KV head, split) for one team of
 * SM_ATT_THREADS threads: the tile's rows x the G = nh/nkv query heads of the KV head are the 64
 * rows of one tensor-core tile, and a run of rows of one request shares every K/V block the team
 * stages (cp.async, two stages of 64 keys).  Per 32 keys: S = Q K^T (mma.m16n8k16, bf16 products,
 * f32 sums), mask, online softmax in f32, O += P V with p split exactly into three bf16 terms.
 * With nsplit > 1 each item writes its (max, sum, o) partial per (row, query head) and the
 * combine item (one warp per (row, query head)) merges them in split order; the epilogue (divide
 * by the sum, per-head rms norm, times sigmoid(gate), r16) runs in whichever finishes.  Splits
 * are chunks of an absolute key grid (sm_att_plan), so the bits of a row depend on its own q,
 * keys and (nsplit, chunk) only: never on the other rows of its tile or on which block runs an
 * item.
 * Prefill (T rows of one request at pos0..pos0+T-1): the unit is one (KV head, tile of 128/G
 * rows) for one block of 128 threads, thread = one query (row, head) holding q and o in
 * registers, K/V tiles of 16 keys staged in shared memory as f32 and read as broadcasts.
 * Items that use block barriers need every thread of a team of exactly that size; the scratch
 * comes from the caller (a struct below, any shared-memory address aligned to 16).
 * We rejected one (row, KV head) item on CUDA cores (each row re-reads its request's keys, R
 * times the bytes of the tile item; bench/results.md has the measurements), P rounded to bf16 for P.V (a rounding point the model does
 * not have) and one body for decode and prefill (prefill is not graph-captured and its rows are
 * one request's consecutive positions).
 */
#ifndef SM_CUDA_OPS_ATTENTION_CUH
#define SM_CUDA_OPS_ATTENTION_CUH
#include "cuda/common.cuh"

#define SM_ATT_WARPS 4
#define SM_ATT_THREADS (SM_ATT_WARPS * 32)         /* threads of a decode / verify tile item */
#define SM_ATT_PAGE_ELEMS (SM_KV_BLOCK * 128)       /* bf16 per (page, KV head) */
#define SM_ATT_PF_KEYS 16                           /* keys per prefill tile */
#define SM_ATT_PF_THREADS 128                       /* threads of a prefill item */

/* Shared scratch of a decode / verify tile item: two stages of SM_ATT_TK keys, K and V rows
 * padded to SM_ATT_KP bf16 so the 8 row addresses of an ldmatrix fall in distinct banks; after
 * the key loop (nsplit == 1) the same bytes hold the tile's f32 output rows (sm_att_tile_out). */
#define SM_ATT_TK 64   /* keys per stage */
#define SM_ATT_KP 72   /* padded K / V row of a stage, bf16 */
typedef struct __align__(16) sm_att_tile_smem {
    uint16_t k[2][SM_ATT_TK][SM_ATT_KP];
    uint16_t v[2][SM_ATT_TK][SM_ATT_KP];
    uint16_t q[64][SM_ATT_KP];       /* the run's query rows by tile row (0 outside the run) */
} sm_att_tile_smem;
typedef struct sm_att_tile_out {
    float o[64][64];                 /* [tile row][dim], o not yet divided by l */
    float l[64];                     /* [tile row] softmax sum */
} sm_att_tile_out;
/* Shared scratch of a prefill item. */
typedef struct __align__(16) sm_att_prefill_smem {
    float ks[SM_ATT_PF_KEYS][64];    /* K rows of the key tile, f32 */
    float vs[SM_ATT_PF_KEYS][64];    /* V rows of the key tile, f32 */
} sm_att_prefill_smem;

/* Row of key `key` (K at +0, V at +64) of KV head h on page `page` (the request's block table
 * entry key / SM_KV_BLOCK). */
__device__ __forceinline__ const uint16_t *sm_att_page_row(const uint16_t *kv, int page, int nkv, int h, int key) {
    return kv + ((size_t)page * nkv + h) * SM_ATT_PAGE_ELEMS + (size_t)(key % SM_KV_BLOCK) * 128;
}
/* Row of key `key` of KV head h, through the request's block table. */
__device__ __forceinline__ const uint16_t *sm_att_kv_row(const uint16_t *kv, const int *table, int nkv, int h, int key) {
    return sm_att_page_row(kv, table[key / SM_KV_BLOCK], nkv, h, key);
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

/* First key a query at position p sees (docs/model.md section 5): p - window + 1 clamped at 0 on
 * a sliding layer (window > 0), else 0. */
__device__ __forceinline__ int sm_att_first_key(int p, int window) { return window > 0 ? max(0, p - window + 1) : 0; }

/* Tile row i of a tile item whose first step row is r_first (TR = 64 / G rows a tile): its step
 * row and its query head of KV head h. */
template <int G>
__device__ __forceinline__ void sm_att_tile_row(int i, int r_first, int h, int &row, int &head) {
    row = r_first + i % (64 / G);
    head = h * G + i / (64 / G);
}

/* Stage the K and V rows of keys [sb, sb + SM_ATT_TK) of KV head h into stage buffers k, v
 * (cp.async, one group per call by the caller's commit); keys outside [lo, hi] are zero-filled
 * (never read from memory: a masked key's V must be a finite 0 for P.V).  sb is a multiple of
 * SM_ATT_TK; a team of exactly SM_ATT_THREADS threads.  The stage's page-table entries are
 * loaded before the first copy (a copy issued behind its own table load waited a memory round
 * trip each): thread tid copies part tid % 16 of keys tid / 16 + 8 i, i.e. of pages i / 2. */
__device__ __forceinline__ void sm_att_stage(const uint16_t *kv, const int *table, int nkv, int h, int sb, int lo,
                                             int hi, uint16_t (*k)[SM_ATT_KP], uint16_t (*v)[SM_ATT_KP], const sm_team &t) {
    constexpr int KS = SM_ATT_THREADS / 16, NP = SM_ATT_TK / SM_KV_BLOCK; /* keys a copy step, pages a stage */
    static_assert(SM_ATT_TK % SM_KV_BLOCK == 0 && SM_KV_BLOCK % KS == 0, "a copy step stays in one page");
    const int part = t.tid & 15, j0 = t.tid >> 4;
    int page[NP];
#pragma unroll
    for (int q = 0; q < NP; q++) {
        const int k0 = sb + q * SM_KV_BLOCK; /* the page's first key */
        page[q] = k0 <= hi && k0 + SM_KV_BLOCK - 1 >= lo ? table[k0 / SM_KV_BLOCK] : 0;
    }
#pragma unroll
    for (int i = 0; i < SM_ATT_TK / KS; i++) {
        const int j = j0 + i * KS, key = sb + j, ok = key >= lo && key <= hi;
        const uint16_t *src = ok ? sm_att_page_row(kv, page[i * KS / SM_KV_BLOCK], nkv, h, key) + part * 8 : kv;
        uint16_t *dst = part < 8 ? &k[j][part * 8] : &v[j][(part - 8) * 8];
        sm_cp_async16(dst, src, ok ? 16 : 0);
    }
}

/* (x, y) -> bf16x2 hi, mid, lo with hi + mid + lo == (x, y) exactly (each residual is exact in
 * f32 and the third term holds the last 8 bits). */
__device__ __forceinline__ void sm_att_split3(float x, float y, uint32_t &hi, uint32_t &mid, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const float rx = x - hf.x, ry = y - hf.y;
    const __nv_bfloat162 m = __floats2bfloat162_rn(rx, ry);
    const float2 mf = __bfloat1622float2(m);
    const __nv_bfloat162 l = __floats2bfloat162_rn(rx - mf.x, ry - mf.y);
    memcpy(&hi, &h, 4);
    memcpy(&mid, &m, 4);
    memcpy(&lo, &l, 4);
}

/* Decode / verify tile item (tile, KV head h, split of nsplit) by the SM_ATT_THREADS threads of
 * team t (common.cuh; the stock kernel: its block).  The tile is step rows [tile TR, tile TR + TR)
 * with TR = 64 / G: those rows x the G query heads of KV head h make the 64 rows of one tensor-
 * core tile (tile row i = query head h G + i / TR of step row tile TR + i % TR; warp w holds tile
 * rows 16 w .. 16 w + 15).  A run of rows of one request (equal row_req) shares every staged key
 * block; a tile holding several requests runs them one after the other.
 * Per 32 keys (stages of 64): S = Q K^T on tensor cores (bf16 products, f32 sums), the mask, online
 * softmax in f32 per row, and O += P V where P is split exactly into three bf16 terms, so P.V
 * sums the f32 products of the exact p.
 * Keys: split s takes chunk lo / chunk + s of the absolute grid of `chunk` keys (lo = the run's
 * first visible key; the last split also takes every key after it, so a short max_ctx hint stays
 * correct), in 32-key blocks of the absolute grid.  A block or chunk a row cannot see leaves its
 * (max, sum, o) unchanged bit for bit, so a row's bits depend only on its own q and keys and on
 * (nsplit, chunk): never on the tile's other rows (tests: "attention tile invariance").
 * nsplit == 1: out rows are written; else the partials go to wsO / wsM / wsL as laid out for
 * sm_att_combine_item.  smem: the team's own sm_att_tile_smem. */
template <int G>
__device__ __forceinline__ void sm_att_tile_item(const uint16_t *q, int ldq, const uint16_t *gate, int ldg, const uint16_t *kv,
                                                 const int *tables, int max_bpr, const int *row_req, const int *pos, int n,
                                                 int nh, int nkv, int window, float scale, float eps, uint16_t *out,
                                                 float *wsO, float *wsM, float *wsL, int tile, int h, int split, int nsplit,
                                                 int chunk, sm_att_tile_smem &sh, const sm_team &t) {
    constexpr int TR = 64 / G;
    const int warp = t.tid >> 5, lane = t.tid & 31, gid = lane >> 2, tq = lane & 3;
    const int r_first = tile * TR, r_end = min(r_first + TR, n);
    /* this thread's two tile rows (X = 0: 16 warp + gid, X = 1: 8 below): step row, query head */
    int trow[2], hq[2];
#pragma unroll
    for (int X = 0; X < 2; X++) sm_att_tile_row<G>(16 * warp + gid + 8 * X, r_first, h, trow[X], hq[X]);
    for (int r0 = r_first; r0 < r_end;) {
        /* the run [r0, r1) of one request and the keys it sees, [lo, hi] */
        const int req = row_req[r0];
        int r1 = r0 + 1, lo = pos[r0], hi = pos[r0];
        while (r1 < r_end && row_req[r1] == req) r1++;
        for (int r = r0; r < r1; r++) { lo = min(lo, pos[r]); hi = max(hi, pos[r]); }
        lo = sm_att_first_key(lo, window);
        const int *table = tables + (size_t)req * max_bpr;
        const int kb = (lo / chunk + split) * chunk;
        const int ke = split == nsplit - 1 ? hi + 1 : min(kb + chunk, hi + 1);
        /* each of this thread's rows: visible keys [plo, phi] of this split (empty: phi < plo) */
        int plo[2], phi[2], in[2];
#pragma unroll
        for (int X = 0; X < 2; X++) {
            in[X] = trow[X] >= r0 && trow[X] < r1;
            const int p = in[X] ? pos[trow[X]] : -1;
            plo[X] = max(kb, sm_att_first_key(p, window));
            phi[X] = min(ke - 1, p);
        }
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

        sm_team_sync(t); /* the stage buffers are free (previous run's epilogue, previous item) */
        /* the run's query rows into shared memory (tile row i: 8 pieces of 16 bytes, zero outside
         * the run), by cp.async in the first stage's group: their round trip overlaps the keys' */
        for (int u = t.tid; u < 64 * 8; u += t.nt) {
            const int i = u >> 3, part = u & 7;
            int row, head;
            sm_att_tile_row<G>(i, r_first, h, row, head);
            const int ok = row >= r0 && row < r1;
            sm_cp_async16(&sh.q[i][part * 8], ok ? q + (size_t)row * ldq + (size_t)head * 64 + part * 8 : q, ok ? 16 : 0);
        }
        int sb = max(kb, lo & ~(SM_ATT_TK - 1)), buf = 0;
        if (sb < ke) sm_att_stage(kv, table, nkv, h, sb, lo, hi, sh.k[0], sh.v[0], t);
        sm_cp_async_commit();
        for (; sb < ke; sb += SM_ATT_TK, buf ^= 1) {
            if (sb + SM_ATT_TK < ke) sm_att_stage(kv, table, nkv, h, sb + SM_ATT_TK, lo, hi, sh.k[buf ^ 1], sh.v[buf ^ 1], t);
            sm_cp_async_commit();
            sm_cp_async_wait<1>(); /* this block's keys have landed (this thread's copies) */
            sm_team_sync(t);       /* ... and every thread's (and the query rows) */
            /* two halves of 32 keys, each one online-softmax step */
#pragma unroll 1
            for (int hf = 0; hf < 2; hf++) {
                const int k0 = 32 * hf;
                /* S = Q K^T: 16 rows x 32 keys (n-tile j = keys k0 + 8 j .. + 7) */
                float s[4][4];
#pragma unroll
                for (int j = 0; j < 4; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    uint32_t a[4];
                    sm_ldsm_x4(a, &sh.q[16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8][16 * kk + (lane >> 4) * 8]);
#pragma unroll
                    for (int jp = 0; jp < 2; jp++) {
                        uint32_t b[4];
                        sm_ldsm_x4(b, &sh.k[buf][k0 + 16 * jp + (lane & 7) + (lane >> 4) * 8][16 * kk + ((lane >> 3) & 1) * 8]);
                        sm_mma16816(s[2 * jp], a[0], a[1], a[2], a[3], b[0], b[1]);
                        sm_mma16816(s[2 * jp + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
                    }
                }
                /* scale and mask; online softmax per row (a row's 32 scores sit in one quad).
                 * A block both rows of this thread see whole skips the mask (the same values) */
                const int kb0 = sb + k0;
                const bool whole = kb0 >= plo[0] && kb0 + 31 <= phi[0] && kb0 >= plo[1] && kb0 + 31 <= phi[1];
                float mx[2] = {-INFINITY, -INFINITY};
                if (whole) {
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            s[j][e] *= scale;
                            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
                        }
                } else {
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int X = e >> 1, key = kb0 + 8 * j + 2 * tq + (e & 1);
                            const float v = s[j][e] * scale;
                            s[j][e] = key >= plo[X] && key <= phi[X] ? v : -INFINITY;
                            mx[X] = fmaxf(mx[X], s[j][e]);
                        }
                }
                /* ms: the new max, 0 while a row has seen no key: every exp below is then
                 * expf(-inf) = 0 (a masked score, a row's first max), the value the masked
                 * cases need, without a branch an element */
                float corr[2], ms[2];
#pragma unroll
                for (int X = 0; X < 2; X++) {
                    mx[X] = fmaxf(mx[X], __shfl_xor_sync(0xffffffffu, mx[X], 1));
                    mx[X] = fmaxf(mx[X], __shfl_xor_sync(0xffffffffu, mx[X], 2));
                    const float mnew = fmaxf(m[X], mx[X]);
                    ms[X] = mnew == -INFINITY ? 0.0f : mnew;
                    corr[X] = expf(m[X] - ms[X]);
                    m[X] = mnew;
                }
                float ps[2] = {0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int X = e >> 1;
                        s[j][e] = expf(s[j][e] - ms[X]);
                        ps[X] += s[j][e];
                    }
                /* rescale by corr (skipped when no row's max moved: corr == 1 leaves the bits) */
                if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
                    for (int X = 0; X < 2; X++) l[X] *= corr[X];
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        o[j][0] *= corr[0]; o[j][1] *= corr[0];
                        o[j][2] *= corr[1]; o[j][3] *= corr[1];
                    }
                }
#pragma unroll
                for (int X = 0; X < 2; X++) l[X] += ps[X];
                /* O += P V: k16 step jj = keys k0 + 16 jj .. + 15, P exact as hi + mid + lo */
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    uint32_t ph[4], pm[4], pl[4];
                    sm_att_split3(s[2 * jj][0], s[2 * jj][1], ph[0], pm[0], pl[0]);
                    sm_att_split3(s[2 * jj][2], s[2 * jj][3], ph[1], pm[1], pl[1]);
                    sm_att_split3(s[2 * jj + 1][0], s[2 * jj + 1][1], ph[2], pm[2], pl[2]);
                    sm_att_split3(s[2 * jj + 1][2], s[2 * jj + 1][3], ph[3], pm[3], pl[3]);
#pragma unroll
                    for (int dp = 0; dp < 4; dp++) {
                        uint32_t b[4];
                        sm_ldsm_x4_trans(b, &sh.v[buf][k0 + 16 * jj + (lane & 7) + ((lane >> 3) & 1) * 8][16 * dp + (lane >> 4) * 8]);
#pragma unroll
                        for (int u = 0; u < 2; u++) {
                            float *acc = o[2 * dp + u];
                            sm_mma16816(acc, ph[0], ph[1], ph[2], ph[3], b[2 * u], b[2 * u + 1]);
                            sm_mma16816(acc, pm[0], pm[1], pm[2], pm[3], b[2 * u], b[2 * u + 1]);
                            sm_mma16816(acc, pl[0], pl[1], pl[2], pl[3], b[2 * u], b[2 * u + 1]);
                        }
                    }
                }
            }
            sm_team_sync(t); /* every warp is done with buf before it is restaged */
        }
        sm_cp_async_wait<0>();
        /* the row sums over the quad (the same bits in its 4 lanes) */
#pragma unroll
        for (int X = 0; X < 2; X++) {
            l[X] += __shfl_xor_sync(0xffffffffu, l[X], 1);
            l[X] += __shfl_xor_sync(0xffffffffu, l[X], 2);
        }
        if (nsplit > 1) {
#pragma unroll
            for (int X = 0; X < 2; X++) {
                if (!in[X]) continue;
                const size_t id = ((size_t)split * n + trow[X]) * nh + hq[X];
#pragma unroll
                for (int j = 0; j < 8; j++) *(float2 *)&wsO[id * 64 + 8 * j + 2 * tq] = make_float2(o[j][2 * X], o[j][2 * X + 1]);
                if (tq == 0) { wsM[id] = m[X]; wsL[id] = l[X]; }
            }
        } else {
            /* through shared memory to the epilogue's layout (lane = dims 2 lane, 2 lane + 1) */
            sm_att_tile_out *so = (sm_att_tile_out *)&sh;
#pragma unroll
            for (int X = 0; X < 2; X++) {
                const int i = 16 * warp + gid + 8 * X;
#pragma unroll
                for (int j = 0; j < 8; j++) *(float2 *)&so->o[i][8 * j + 2 * tq] = make_float2(o[j][2 * X], o[j][2 * X + 1]);
                if (tq == 0) so->l[i] = l[X];
            }
            sm_team_sync(t);
            for (int i = warp; i < 64; i += SM_ATT_WARPS) {
                int row, hh;
                sm_att_tile_row<G>(i, r_first, h, row, hh);
                if (row < r0 || row >= r1) continue;
                sm_att_finish(so->o[i][2 * lane], so->o[i][2 * lane + 1], so->l[i], gate + (size_t)row * ldg + (size_t)hh * 64,
                              eps, out + ((size_t)row * nh + hh) * 64, lane);
            }
        }
        r0 = r1;
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
 * block.  Arguments as sm_k_attention_prefill (cuda/ops/ops.h). */
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
    const int lo_i = sm_att_first_key(pi, window);
    /* keys any row of the tile sees */
    const int kmax = pos0 + last;
    const int kmin = sm_att_first_key(pos0 + first, window);

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
