/* ops/logprobs.cu: the logprob summary of logits rows already on the device (backend.h:
 * sm_lp_sum), so a request with logprobs takes back about 200 bytes a row instead of the row
 * (V f32: 800 KB in the real model).  Reference: ref_logprobs_row (src/cpu/ops_logits.c).
 *
 * The row is cut into slices of LP_SLICE ids, one warp each.  Two launches:
 *  1. lp_slice_kernel, one warp per (slice, row): the slice's non-finite flag, its maximum m_w,
 *     the sum s_w of exp(l - m_w) in double (each lane in id order, lanes by butterfly) and the
 *     count c_w of its ids before the named id in the row's order (backend.h).  This is the one
 *     full read of the row.
 *  2. lp_row_kernel, one block per row: lmax = max m_w; lse = log(sum_w s_w exp(m_w - lmax)) in
 *     a fixed order; T = the k-th largest slice maximum (k rounds of a warp argmax).  Every
 *     one of the row's k largest logits is >= T (k slices hold a value >= T), and only the
 *     slices with m_w >= T can hold one, so only those (k of them, more on ties) are read
 *     again: their ids with a logit >= T become candidates in shared memory, and k rounds of a
 *     warp argmax over the candidates give the top k.  When more than LP_CAND ids tie at
 *     or above T (a flat row), the rounds run over the selected slices themselves instead.
 *     The named id's rank is 1 + the sum of c_w, integers: exact, the reference's count.
 * Every argmax is common.cuh's order (larger value, then lower id), so the ids, their logits
 * and lmax are the reference's bit for bit; lse differs from the reference's id-order sum only
 * in the last bits of a double, below the f32 rounding of a logprob.  A row's summary never
 * depends on the other rows of the launch.  The slices' partials live in kc->ws.
 * We rejected (measured, bench/results.md): one block per row with a sorted list per thread
 * (the insertions diverge within a warp: 8 rows took 0.8 ms, longer than copying them to the
 * host), and k rounds of a warp argmax in every slice (every slice pays the k rounds: 0.1 ms).
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"

#define LP_THREADS 512                    /* threads of the row kernel */
#define LP_WARPS (LP_THREADS / 32)  /* a power of 2 dividing 32 (lp_block_best) */
#define LP_EPT 16                         /* ids a lane reads of a slice */
#define LP_SLICE (32 * LP_EPT)            /* ids of a slice */
#define LP_SLICE_WARPS 8                  /* slices a block of the slice kernel */
#define LP_MAXW_T 4                       /* slices a thread of the row kernel holds: at most
                                             LP_THREADS x 4 slices, 1 M ids */
#define LP_CAND 4096                      /* candidates the row kernel keeps in shared memory */
#define LP_NONE (-1)                      /* id of no candidate */

/* The partials of one (row, slice) in the workspace. */
typedef struct lp_part {
    float m;                              /* the slice's maximum */
    int bad;                              /* a NaN or +Inf among its ids (-inf: an id a mask forbids) */
    double s;                             /* sum of exp(l - m) over its ids */
    int before;                           /* its ids before the named id in the row's order */
} lp_part;

/* The rows of one launch (kernel parameter, by value: capturable, no metadata copy). */
typedef struct lp_rows {
    int row[SM_LP_ROWS];                  /* the logits row of each entry */
    int tok[SM_LP_ROWS];                  /* the id whose logit it also carries, -1: none */
} lp_rows;

/* Warp (slice blockIdx.x * LP_SLICE_WARPS + warp, entry blockIdx.y of rows): its partials. */
__global__ void __launch_bounds__(32 * LP_SLICE_WARPS)
lp_slice_kernel(const float *__restrict__ logits, size_t ld, lp_rows rows, int vu, int nw, lp_part *__restrict__ parts) {
    const int lane = threadIdx.x & 31, w = blockIdx.x * LP_SLICE_WARPS + (threadIdx.x >> 5);
    if (w >= nw) return;
    const float *l = logits + (size_t)rows.row[blockIdx.y] * ld + (size_t)w * LP_SLICE;
    const int n = vu - w * LP_SLICE < LP_SLICE ? vu - w * LP_SLICE : LP_SLICE;
    const int tok = rows.tok[blockIdx.y], named = tok >= 0 && tok < vu;
    /* the named id's logit (one address for the warp: a broadcast load) */
    const float tl = named ? logits[(size_t)rows.row[blockIdx.y] * ld + tok] : -INFINITY;
    float x[LP_EPT], m = -INFINITY;
    int bad = 0, before = 0;
#pragma unroll
    for (int j = 0; j < LP_EPT; j++) { /* lane-interleaved: coalesced */
        const int v = j * 32 + lane;
        x[j] = v < n ? l[v] : -INFINITY;
        bad |= v < n && (isnan(x[j]) || x[j] == INFINITY);
        m = fmaxf(m, x[j]);
        /* before tok in the row's order: a larger logit, or an equal one at a lower id */
        before += v < n && (x[j] > tl || (x[j] == tl && w * LP_SLICE + v < tok));
    }
    m = sm_warp_max(m);
    before = __reduce_add_sync(0xFFFFFFFFu, before);
    /* sum of exp(l - m) in double, each lane in id order, then the lanes by butterfly */
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < LP_EPT; j++) /* -inf adds nothing (and a slice of -inf only: m = -inf, s = 0) */
        if (j * 32 + lane < n && x[j] != -INFINITY) s += exp((double)x[j] - (double)m);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, d);
    bad = __any_sync(0xFFFFFFFFu, bad);
    if (lane == 0) {
        lp_part *p = parts + (size_t)blockIdx.y * nw + w;
        p->m = m;
        p->bad = bad;
        p->s = s;
        p->before = before;
    }
}

/* The better of (v, i) over the warp by butterfly: every lane ends with the best. */
__device__ __forceinline__ void lp_warp_best(float &v, int &i) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, d);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, i, d);
        if (sm_better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

/* One warp: k rounds of an argmax over v [n] / id [n] in shared memory (distinct ids; LP_NONE:
 * none), each winner struck out (its id set to LP_NONE); lane 0 writes the winners to ov / oid
 * when they are not NULL.  Returns the winners found and *last the last one's value (every
 * lane).  We rejected the block for these rounds: two barriers a round cost more than the
 * warp's scan of a few hundred entries. */
__device__ __forceinline__ int lp_warp_rounds(const float *v, int *id, int n, int k, float *ov, int *oid, float *last) {
    const int lane = threadIdx.x & 31;
    int found = 0;
    for (int r = 0; r < k; r++) {
        float bv = -INFINITY;
        int bi = LP_NONE, bq = -1;
        for (int q = lane; q < n; q += 32)
            if (sm_better(v[q], id[q], bv, bi)) {
                bv = v[q];
                bi = id[q];
                bq = q;
            }
        const int mine = bi;
        lp_warp_best(bv, bi);
        if (bi == LP_NONE) break; /* fewer entries than k */
        if (bq >= 0 && mine == bi) id[bq] = LP_NONE;
        __syncwarp();
        if (lane == 0 && ov) {
            ov[r] = bv;
            oid[r] = bi;
        }
        *last = bv;
        found++;
    }
    return found;
}

/* (value, id) as one 64-bit key whose unsigned order is common.cuh's argmax order: the float
 * made monotone in the high word (-0 taken as +0, equal to it), ~id in the low word (the lower
 * id the larger); 0: none.  A round's argmax is then a max without branches. */
__device__ __forceinline__ unsigned long long lp_key(float v, int id) {
    unsigned u = __float_as_uint(v + 0.0f);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return id < 0 ? 0ull : ((unsigned long long)u << 32) | (unsigned)~id;
}
__device__ __forceinline__ float lp_key_v(unsigned long long k) {
    unsigned u = (unsigned)(k >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u);
}
__device__ __forceinline__ int lp_key_id(unsigned long long k) { return k ? (int)~(unsigned)k : LP_NONE; }

/* lp_warp_rounds with the entries in registers as keys when they fit (n <= 32 LP_REG: LP_REG a
 * lane), else from shared memory; the same winners either way.  We rejected sm_better's
 * compare-and-select here: it compiles to a branch and a reconvergence per entry, and a round
 * took 0.6-0.8 us (bench/results.md). */
#define LP_REG 16
__device__ __forceinline__ int lp_warp_rounds_fast(const float *v, int *id, int n, int k, float *ov, int *oid, float *last) {
    if (n > 32 * LP_REG) return lp_warp_rounds(v, id, n, k, ov, oid, last);
    const int lane = threadIdx.x & 31;
    unsigned long long x[LP_REG];
#pragma unroll
    for (int j = 0; j < LP_REG; j++) {
        const int q = lane + 32 * j;
        x[j] = q < n ? lp_key(v[q], id[q]) : 0ull;
    }
    int found = 0;
    for (int r = 0; r < k; r++) {
        unsigned long long b = 0;
#pragma unroll
        for (int j = 0; j < LP_REG; j++) b = x[j] > b ? x[j] : b;
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) {
            const unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, b, d);
            b = o > b ? o : b;
        }
        if (!b) break; /* fewer entries than k */
#pragma unroll
        for (int j = 0; j < LP_REG; j++) x[j] = x[j] == b ? 0ull : x[j]; /* struck out (keys are distinct) */
        if (lane == 0 && ov) {
            ov[r] = lp_key_v(b);
            oid[r] = lp_key_id(b);
        }
        *last = lp_key_v(b);
        found++;
    }
    return found;
}

/* The block's best (value, id) by common.cuh's order; every thread gets it.  red_v / red_i:
 * __shared__ [LP_WARPS]. */
__device__ __forceinline__ void lp_block_best(float &v, int &i, float *red_v, int *red_i) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    lp_warp_best(v, i);
    __syncthreads(); /* the previous call's red_v / red_i are read */
    if (lane == 0) {
        red_v[w] = v;
        red_i[w] = i;
    }
    __syncthreads();
    /* the warps' bests by butterfly again (a total order: any order of the merges gives it) */
    v = red_v[lane % LP_WARPS]; /* LP_WARPS divides 32: each half-warp holds every warp's */
    i = red_i[lane % LP_WARPS];
#pragma unroll
    for (int d = LP_WARPS / 2; d > 0; d >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, d);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, i, d);
        if (sm_better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

/* Block (entry blockIdx.x of rows): the row's summary. */
__global__ void __launch_bounds__(LP_THREADS)
lp_row_kernel(const float *__restrict__ logits, size_t ld, lp_rows rows, int vu, int nw, int k,
              const lp_part *__restrict__ parts, sm_lp_sum *__restrict__ out) {
    __shared__ float red_v[LP_WARPS];
    __shared__ int red_i[LP_WARPS];
    __shared__ double red_d[LP_WARPS];
    __shared__ int red_c[LP_WARPS];
    __shared__ float cv[LP_CAND];
    __shared__ int ci[LP_CAND];
    __shared__ int sel[LP_THREADS * LP_MAXW_T];
    __shared__ int nsel, ncand;
    __shared__ float T_s;
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const float *l = logits + (size_t)rows.row[blockIdx.x] * ld;
    const lp_part *p = parts + (size_t)blockIdx.x * nw;
    sm_lp_sum *o = out + blockIdx.x;
    const int tok = rows.tok[blockIdx.x];
    if (t == 0) o->tok_l = tok >= 0 && tok < vu ? l[tok] : -INFINITY; /* the named id's logit */
    /* this thread's slices t, t + LP_THREADS, ..: their maxima, the non-finite flag */
    float wm[LP_MAXW_T];
    int bad = 0;
#pragma unroll
    for (int j = 0; j < LP_MAXW_T; j++) {
        const int q = t + j * LP_THREADS;
        wm[j] = q < nw ? p[q].m : -INFINITY;
        bad |= q < nw && p[q].bad;
    }
    /* lmax: every slice -inf (each id masked) means no distribution either */
    float mx = -INFINITY;
    int dummy = 0;
#pragma unroll
    for (int j = 0; j < LP_MAXW_T; j++) mx = fmaxf(mx, wm[j]);
    lp_block_best(mx, dummy, red_v, red_i);
    if (__syncthreads_or(bad || mx == -INFINITY)) { /* NaN or +Inf: the row has no distribution */
        if (t == 0) {
            o->bad = 1;
            o->tok_rank = 0;
            o->lmax = 0.0f;
            o->lse = 0.0;
            o->n = 0;
        }
        return;
    }
    /* lse = log(sum_w s_w exp(m_w - lmax)): each thread its slices in order, then the lanes by
     * butterfly, the warps in order */
    double s = 0.0;
    int before = 0;
#pragma unroll
    for (int j = 0; j < LP_MAXW_T; j++) {
        const int q = t + j * LP_THREADS;
        if (q < nw && wm[j] != -INFINITY) s += p[q].s * exp((double)wm[j] - (double)mx);
        if (q < nw) before += p[q].before;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, d);
    before = __reduce_add_sync(0xFFFFFFFFu, before);
    if (lane == 0) {
        red_d[w] = s;
        red_c[w] = before;
    }
    /* T = the k-th largest slice maximum (slice index: the tie order), -inf with fewer slices:
     * warp 0's rounds over the maxima, staged in cv / sel (free until the candidates) */
#pragma unroll
    for (int j = 0; j < LP_MAXW_T; j++) {
        const int q = t + j * LP_THREADS;
        if (q < nw) {
            cv[q] = wm[j];
            sel[q] = q;
        }
    }
    __syncthreads();
    if (w == 0) {
        float last = -INFINITY;
        const int f = lp_warp_rounds_fast(cv, sel, nw, k, NULL, NULL, &last);
        if (lane == 0) T_s = f == k ? last : -INFINITY;
    }
    __syncthreads();
    const float T = T_s;
    /* the slices that can hold a top-k logit: m_w >= T */
    if (t == 0) nsel = ncand = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < LP_MAXW_T; j++) {
        const int q = t + j * LP_THREADS;
        if (q < nw && wm[j] >= T) sel[atomicAdd(&nsel, 1)] = q;
    }
    __syncthreads();
    /* their ids with a logit >= T into the candidates (a warp a slice) */
    for (int a = w; a < nsel; a += LP_WARPS) {
        const int q = sel[a];
        const int n = vu - q * LP_SLICE < LP_SLICE ? vu - q * LP_SLICE : LP_SLICE;
        float x[LP_EPT];
#pragma unroll
        for (int j = 0; j < LP_EPT; j++) /* every load in flight at once */
            x[j] = j * 32 + lane < n ? l[(size_t)q * LP_SLICE + j * 32 + lane] : -INFINITY;
#pragma unroll
        for (int j = 0; j < LP_EPT; j++)
            if (j * 32 + lane < n && x[j] >= T) {
                const int c = atomicAdd(&ncand, 1);
                if (c < LP_CAND) {
                    cv[c] = x[j];
                    ci[c] = q * LP_SLICE + j * 32 + lane;
                }
            }
    }
    __syncthreads();
    const int nc = ncand, flat = nc > LP_CAND; /* flat: too many ties to keep, read the slices */
    int n = 0;
    if (!flat) { /* warp 0's rounds over the candidates */
        float last;
        if (w == 0) n = lp_warp_rounds_fast(cv, ci, nc, k, o->top_l, o->top_ids, &last);
    } else { /* block rounds: the best id after the last winner in the order, over the slices */
        float last_v = INFINITY;
        int last_i = LP_NONE;
        for (int r = 0; r < k; r++) {
            float bv = -INFINITY;
            int bi = LP_NONE;
            for (int a = 0; a < nsel; a++) {
                const int q = sel[a], n2 = vu - q * LP_SLICE < LP_SLICE ? vu - q * LP_SLICE : LP_SLICE;
                for (int j = t; j < n2; j += LP_THREADS) {
                    const float x = l[(size_t)q * LP_SLICE + j];
                    const int id = q * LP_SLICE + j;
                    if (x >= T && (r == 0 || sm_better(last_v, last_i, x, id)) && sm_better(x, id, bv, bi)) {
                        bv = x;
                        bi = id;
                    }
                }
            }
            lp_block_best(bv, bi, red_v, red_i);
            if (bi == LP_NONE) break; /* fewer ids than k (the same in every thread) */
            last_v = bv;
            last_i = bi;
            if (t == 0) {
                o->top_ids[r] = bi;
                o->top_l[r] = bv;
            }
            n++;
        }
    }
    if (t == 0) {
        double sum = 0.0;
        int nb = 0;
        for (int q = 0; q < LP_WARPS; q++) sum += red_d[q], nb += red_c[q];
        o->bad = 0;
        o->tok_rank = tok >= 0 && tok < vu ? 1 + nb : 0;
        o->lmax = mx;
        o->lse = log(sum);
        o->n = n;
    }
}

int sm_k_logprobs(sm_kernel_ctx *kc, const float *logits, size_t ld, const int *rows, const int *toks, int nsel, int vocab_used,
                  int k, sm_lp_sum *out, cudaStream_t st, sm_err *e) {
    if (nsel < 0 || vocab_used < 1 || (size_t)vocab_used > ld)
        return sm_errf(e, "sm_k_logprobs: bad shape nsel=%d vocab_used=%d ld=%zu", nsel, vocab_used, ld);
    if (k < 1 || k > SM_LP_MAX_TOP) return sm_errf(e, "sm_k_logprobs: k=%d outside [1, %d]", k, SM_LP_MAX_TOP);
    if (nsel == 0) return 0;
    if (!logits || !rows || !out) return sm_errf(e, "sm_k_logprobs: NULL logits, rows or out");
    const int nw = sm_cdiv(vocab_used, LP_SLICE);
    if (nw > LP_THREADS * LP_MAXW_T)
        return sm_errf(e, "sm_k_logprobs: vocab_used=%d above the %d ids a row kernel holds", vocab_used,
                       LP_THREADS * LP_MAXW_T * LP_SLICE);
    const int per = nsel < SM_LP_ROWS ? nsel : SM_LP_ROWS;
    const size_t need = (size_t)per * nw * sizeof(lp_part);
    if (need > kc->ws_bytes) return sm_errf(e, "sm_k_logprobs: workspace of %zu bytes below the %zu of the partials", kc->ws_bytes, need);
    lp_part *parts = (lp_part *)kc->ws;
    for (int i0 = 0; i0 < nsel; i0 += SM_LP_ROWS) {
        const int nb = nsel - i0 < SM_LP_ROWS ? nsel - i0 : SM_LP_ROWS;
        lp_rows rs;
        for (int i = 0; i < nb; i++) {
            if (rows[i0 + i] < 0) return sm_errf(e, "sm_k_logprobs: row entry %d is %d", i0 + i, rows[i0 + i]);
            rs.row[i] = rows[i0 + i];
            rs.tok[i] = toks ? toks[i0 + i] : -1;
        }
        lp_slice_kernel<<<dim3(sm_cdiv(nw, LP_SLICE_WARPS), nb), 32 * LP_SLICE_WARPS, 0, st>>>(logits, ld, rs, vocab_used, nw, parts);
        SM_LAUNCH_CHECK("lp_slice_kernel");
        lp_row_kernel<<<nb, LP_THREADS, 0, st>>>(logits, ld, rs, vocab_used, nw, k, parts, out + i0);
        SM_LAUNCH_CHECK("lp_row_kernel");
    }
    return 0;
}
