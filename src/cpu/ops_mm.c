/* ops_mm.c: the product kernel of the CPU reference (ops.h): ref_dot, weight rows, matmuls.
 *
 * Every product of an activation row with a weight row goes through one kernel,
 * ref_wrow_dot: the weight row is decoded TILE values at a time (bf16 bits, f32, fp8 x row
 * scale, MXFP4 codes x block scale) into a small f32 buffer on the stack and dotted with up to
 * RG activation rows at once, each row summed in 8 lanes in increasing index order.  The
 * result for one (row, weight row) pair is therefore always exactly ref_dot(x, w_f32, k),
 * however rows are grouped and whichever thread runs it: that is what makes batching, expert
 * grouping and thread counts bit-identical.  Threads split OUTPUT features (rows of W), never
 * a sum.  We rejected dequantizing whole matrices (an expert of the real model is 27 MB in
 * MXFP4 and 64 MB in f32) and per-element function calls in the inner loop (gcc would not
 * vectorize).
 */
#include "cpu/ops.h"
#include "cpu/pool.h"
#include "model/codec.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TILE 256 /* weight values decoded at a time (multiple of 32: MXFP4 blocks) */
#define RG 16    /* activation rows dotted with one decoded tile */

/* ---------------------------------------------------------------- the dot kernel */

/* GNU vector types (gcc and clang, any target) for the bf16 -> f32 widening. */
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/* Decode values [t0, t0 + tn) of a weight row into out [tn]. */
static void wrow_tile(const ref_wrow *r, int t0, int tn, float *out) {
    switch (r->kind) {
    case REF_W_BF16: {
        const uint16_t *w = (const uint16_t *)r->w + t0;
        int j = 0;
        for (; j + 8 <= tn; j += 8) { /* 8 at a time in vector registers: bits << 16 */
            v8u16 h;
            memcpy(&h, w + j, sizeof h);
            v8u32 b = __builtin_convertvector(h, v8u32) << 16;
            memcpy(out + j, &b, sizeof b);
        }
        for (; j < tn; j++) out[j] = sm_bits_f32((uint32_t)w[j] << 16);
        break;
    }
    case REF_W_F32:
        memcpy(out, (const float *)r->w + t0, sizeof(float) * (size_t)tn);
        break;
    case REF_W_FP8: {
        /* dequantized value: r16(e4m3 * row scale) (weights.h) */
        const uint8_t *w = (const uint8_t *)r->w + t0;
        for (int j = 0; j < tn; j++) out[j] = sm_r16(sm_e4m3_to_f32(w[j]) * r->scale);
        break;
    }
    default: /* REF_W_MXFP4: e2m1 code x 2^(s-127), exact (codec.h); t0 is a multiple of 32 */
        sm_mx_dequantize_row((const uint8_t *)r->w + t0 / 2, r->s + t0 / SM_MX_BLOCK, tn, out);
        break;
    }
}

static inline float lanes8(const float *a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

float ref_dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
    float s = lanes8(acc);
    for (int i = n8; i < n; i++) s += a[i] * b[i];
    return s;
}

typedef float v4f __attribute__((vector_size(16)));
static inline v4f ld4(const float *p) { v4f v; memcpy(&v, p, sizeof v); return v; }

/* acc[r] (8 lanes each) += x_r[i] * wt[i] over i in [0, tn), tn % 8 == 0, lane u taking i = u
 * mod 8 in increasing i.  Four rows at a time share each weight load and give the CPU eight
 * independent add chains; the per-lane order is the same as one row alone. */
static void tile_dot(const float *const *xr, int gn, int t0, const float *wt, int tn, float (*acc)[8]) {
    int r = 0;
    for (; r + 4 <= gn; r += 4) {
        const float *x0 = xr[r] + t0, *x1 = xr[r + 1] + t0, *x2 = xr[r + 2] + t0, *x3 = xr[r + 3] + t0;
        v4f a0l = ld4(acc[r]), a0h = ld4(acc[r] + 4), a1l = ld4(acc[r + 1]), a1h = ld4(acc[r + 1] + 4);
        v4f a2l = ld4(acc[r + 2]), a2h = ld4(acc[r + 2] + 4), a3l = ld4(acc[r + 3]), a3h = ld4(acc[r + 3] + 4);
        for (int i = 0; i < tn; i += 8) {
            v4f wl = ld4(wt + i), wh = ld4(wt + i + 4);
            a0l += ld4(x0 + i) * wl; a0h += ld4(x0 + i + 4) * wh;
            a1l += ld4(x1 + i) * wl; a1h += ld4(x1 + i + 4) * wh;
            a2l += ld4(x2 + i) * wl; a2h += ld4(x2 + i + 4) * wh;
            a3l += ld4(x3 + i) * wl; a3h += ld4(x3 + i + 4) * wh;
        }
        memcpy(acc[r], &a0l, 16); memcpy(acc[r] + 4, &a0h, 16);
        memcpy(acc[r + 1], &a1l, 16); memcpy(acc[r + 1] + 4, &a1h, 16);
        memcpy(acc[r + 2], &a2l, 16); memcpy(acc[r + 2] + 4, &a2h, 16);
        memcpy(acc[r + 3], &a3l, 16); memcpy(acc[r + 3] + 4, &a3h, 16);
    }
    if (r + 2 <= gn) {
        const float *x0 = xr[r] + t0, *x1 = xr[r + 1] + t0;
        v4f a0l = ld4(acc[r]), a0h = ld4(acc[r] + 4), a1l = ld4(acc[r + 1]), a1h = ld4(acc[r + 1] + 4);
        for (int i = 0; i < tn; i += 8) {
            v4f wl = ld4(wt + i), wh = ld4(wt + i + 4);
            a0l += ld4(x0 + i) * wl; a0h += ld4(x0 + i + 4) * wh;
            a1l += ld4(x1 + i) * wl; a1h += ld4(x1 + i + 4) * wh;
        }
        memcpy(acc[r], &a0l, 16); memcpy(acc[r] + 4, &a0h, 16);
        memcpy(acc[r + 1], &a1l, 16); memcpy(acc[r + 1] + 4, &a1h, 16);
        r += 2;
    }
    for (; r < gn; r++) {
        const float *x0 = xr[r] + t0;
        v4f al = ld4(acc[r]), ah = ld4(acc[r] + 4);
        for (int i = 0; i < tn; i += 8) {
            al += ld4(x0 + i) * ld4(wt + i);
            ah += ld4(x0 + i + 4) * ld4(wt + i + 4);
        }
        memcpy(acc[r], &al, 16); memcpy(acc[r] + 4, &ah, 16);
    }
}

void ref_wrow_dot(const ref_wrow *w, int k, const float *x, int64_t ldx, const int *rows, int nx, float *out,
                  int64_t ldo, const int *orows) {
    float wt[TILE];
    int k8 = k & ~7;
    for (int g0 = 0; g0 < nx; g0 += RG) {
        int gn = nx - g0 < RG ? nx - g0 : RG;
        const float *xr[RG];
        float acc[RG][8];
        for (int r = 0; r < gn; r++) {
            xr[r] = x + (int64_t)(rows ? rows[g0 + r] : g0 + r) * ldx;
            for (int u = 0; u < 8; u++) acc[r][u] = 0.0f;
        }
        for (int t0 = 0; t0 < k8; t0 += TILE) {
            int tn = k8 - t0 < TILE ? k8 - t0 : TILE;
            wrow_tile(w, t0, tn, wt);
            tile_dot(xr, gn, t0, wt, tn, acc);
        }
        int tail = k - k8;
        if (tail) wrow_tile(w, k8, tail, wt); /* k8 is a multiple of 32 whenever MXFP4 (k % 32 == 0) */
        for (int r = 0; r < gn; r++) {
            float s = lanes8(acc[r]);
            for (int i = 0; i < tail; i++) s += xr[r][k8 + i] * wt[i];
            out[(int64_t)(orows ? orows[g0 + r] : g0 + r) * ldo] = s;
        }
    }
}

/* ---------------------------------------------------------------- W4A4 */

void ref_mx_round_row(const float *x, int k, ref_mxrows *q, int64_t r) {
    const float tab[16] = SM_E2M1_VALUES;
    float *v = q->v + r * q->ld;
    uint8_t *s = q->s + r * (q->ld / SM_MX_BLOCK);
    uint8_t codes[SM_MX_BLOCK / 2];
    for (int b = 0; b < k / SM_MX_BLOCK; b++) {
        /* codes and scale byte of the block, then the codes' unscaled values */
        s[b] = sm_mx_quantize_block(x + b * SM_MX_BLOCK, codes);
        for (int j = 0; j < SM_MX_BLOCK / 2; j++) {
            v[b * SM_MX_BLOCK + 2 * j] = tab[codes[j] & 15u];
            v[b * SM_MX_BLOCK + 2 * j + 1] = tab[codes[j] >> 4];
        }
    }
}

/* The exact sum of the 32 products of one block: every product is a multiple of 1/4 of at
 * most 36 and every partial sum one of at most 1152, so f32 adds them exactly in any order
 * (which lets gcc vectorize). */
static inline float block_sum(const float *a, const float *b) {
    float s = 0.0f;
    for (int j = 0; j < SM_MX_BLOCK; j++) s += a[j] * b[j];
    return s;
}

void ref_wrow_dot_mx(const ref_wrow *w, int k, const ref_mxrows *q, const int *rows, int nx, float *out, int64_t ldo,
                     const int *orows) {
    const float tab[16] = SM_E2M1_VALUES;
    const uint8_t *wq = (const uint8_t *)w->w;
    float wt[TILE];
    for (int g0 = 0; g0 < nx; g0 += RG) {
        int gn = nx - g0 < RG ? nx - g0 : RG;
        float acc[RG];
        for (int r = 0; r < gn; r++) acc[r] = 0.0f;
        for (int t0 = 0; t0 < k; t0 += TILE) {
            int tn = k - t0 < TILE ? k - t0 : TILE;
            /* the weight tile's unscaled e2m1 values, decoded once for gn rows */
            for (int j = 0; j < tn / 2; j++) {
                wt[2 * j] = tab[wq[t0 / 2 + j] & 15u];
                wt[2 * j + 1] = tab[wq[t0 / 2 + j] >> 4];
            }
            for (int r = 0; r < gn; r++) {
                int64_t row = rows ? rows[g0 + r] : g0 + r;
                const float *xv = q->v + row * q->ld + t0;
                const uint8_t *xs = q->s + row * (q->ld / SM_MX_BLOCK) + t0 / SM_MX_BLOCK;
                const uint8_t *ws = w->s + t0 / SM_MX_BLOCK;
                /* acc += S_b * 2^(e_w + e_a), block by block in order */
                for (int b = 0; b < tn / SM_MX_BLOCK; b++)
                    acc[r] += ldexpf(block_sum(xv + b * SM_MX_BLOCK, wt + b * SM_MX_BLOCK),
                                     (int)ws[b] + (int)xs[b] - 254);
            }
        }
        for (int r = 0; r < gn; r++) out[(int64_t)(orows ? orows[g0 + r] : g0 + r) * ldo] = acc[r];
    }
}

void ref_wrow_decode(const ref_wrow *w, int k, float *out) {
    for (int t0 = 0; t0 < k; t0 += TILE) wrow_tile(w, t0, k - t0 < TILE ? k - t0 : TILE, out + t0);
}

ref_wrow ref_wrow_view(sm_expert_fmt fmt, const sm_shard_mat *v, int row) {
    ref_wrow r = {REF_W_BF16, NULL, NULL, 0.0f};
    switch (fmt) {
    case SM_EXP_FP8:
        r.kind = REF_W_FP8;
        r.w = (const uint8_t *)v->w + (int64_t)row * v->ld;
        r.scale = ((const float *)v->s)[row];
        break;
    case SM_EXP_MXFP4:
        r.kind = REF_W_MXFP4;
        r.w = (const uint8_t *)v->w + (int64_t)row * (v->ld / 2);
        r.s = (const uint8_t *)v->s + (int64_t)row * (v->ld / SM_MX_BLOCK);
        break;
    default:
        r.w = (const uint16_t *)v->w + (int64_t)row * v->ld;
        break;
    }
    return r;
}

/* ---------------------------------------------------------------- matmuls */

/* One matmul job for the pool: y[i, j] for j in a chunk, every i. */
typedef struct mm_job {
    const float *x; int n, k;  /* x [n, k] (bf16-exact for the bf16 kind) */
    const void *W; int kind;   /* W [m, ldw] bf16 bits or f32, k values of each row used */
    int64_t ldw;
    int m;
    float *y;                  /* [n, m] */
    int round;                 /* r16 the outputs */
} mm_job;

static void mm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    (void)tid;
    const mm_job *j = arg;
    for (int64_t o = lo; o < hi; o++) {
        ref_wrow r = {j->kind, NULL, NULL, 0.0f};
        r.w = j->kind == REF_W_BF16 ? (const void *)((const uint16_t *)j->W + o * j->ldw)
                                    : (const void *)((const float *)j->W + o * j->ldw);
        ref_wrow_dot(&r, j->k, j->x, j->k, NULL, j->n, j->y + o, j->m, NULL);
        if (j->round)
            for (int i = 0; i < j->n; i++) j->y[(int64_t)i * j->m + o] = sm_r16(j->y[(int64_t)i * j->m + o]);
    }
}

/* Rows of x rounded to bf16 when they are not bf16-exact already (the spec's bf16(x_k)). */
static const float *bf16_input(const float *x, int64_t cnt, float **tmp) {
    *tmp = NULL;
    int64_t i = 0;
    while (i < cnt && sm_r16(x[i]) == x[i]) i++;
    if (i == cnt) return x;
    float *t = malloc(sizeof(float) * (size_t)cnt);
    if (!t) return x; /* out of memory: fall back to unrounded (never happens at our sizes) */
    for (int64_t j = 0; j < cnt; j++) t[j] = sm_r16(x[j]);
    *tmp = t;
    return t;
}

/* y = x @ W^T over the pool, bf16 weights with row stride ldw, rounded or not. */
static void mm_bf16(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int64_t ldw, int m, float *y,
                    int round) {
    float *tmp;
    const float *xb = bf16_input(x, (int64_t)n * k, &tmp);
    mm_job j = {xb, n, k, W, REF_W_BF16, ldw, m, y, round};
    sm_pool_for(p, m, sm_pool_grain(p, m), mm_chunk, &j);
    free(tmp);
}

void ref_mm(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int m, float *y) {
    mm_bf16(p, x, n, k, W, k, m, y, 1);
}

void ref_mm_partial(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int64_t ldw, int m, float *y) {
    mm_bf16(p, x, n, k, W, ldw, m, y, 0);
}

void ref_mm_f32(struct sm_pool *p, const float *x, int n, int k, const float *W, int m, float *y) {
    mm_job j = {x, n, k, W, REF_W_F32, k, m, y, 0};
    sm_pool_for(p, m, sm_pool_grain(p, m), mm_chunk, &j);
}

void ref_round(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = sm_r16(x[i]);
}
