/* ops.c: the CPU reference ops of ops.h (SPEC.md sections 3-6).
 *
 * Every product of an activation row with a weight row goes through one kernel, mdot: the
 * weight row is decoded TILE values at a time (bf16 bits, f32, fp8 x row scale, MXFP4 codes x
 * block scale) into a small f32 buffer on the stack and dotted with up to RG activation rows at
 * once, each row summed in 8 lanes in increasing index order.  The result for one (row,
 * weight row) pair is therefore always exactly ref_dot(x, w_f32, k), however rows are grouped
 * and whichever thread runs it: that is what makes batching, expert grouping and thread
 * counts bit-identical.  Threads split OUTPUT features (rows of W) or experts, never a sum.
 * We rejected dequantizing whole matrices (an expert of the real model is 27 MB in MXFP4 and
 * 64 MB in f32) and per-element function calls in the inner loop (gcc would not vectorize).
 */
#include "ops.h"
#include "pool.h"
#include "codec.h"
#include "kvcache.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TILE 256 /* weight values decoded at a time (multiple of 32: MXFP4 blocks) */
#define RG 16    /* activation rows dotted with one decoded tile */

/* ---------------------------------------------------------------- the dot kernel */

/* GNU vector types (gcc and clang, any target) for the bf16 -> f32 widening. */
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/* A weight row in its storage format. */
enum { W_BF16, W_F32, W_FP8, W_MXFP4 };
typedef struct wrow {
    int kind;          /* W_* */
    const void *w;     /* the row: uint16_t [k] | float [k] | uint8_t [k] | uint8_t [k/2] */
    const uint8_t *s;  /* MXFP4: e8m0 scales [k/32]; else NULL */
    float scale;       /* FP8: the row's scale */
} wrow;

/* Decode values [t0, t0 + tn) of a weight row into out [tn]. */
static void wrow_tile(const wrow *r, int t0, int tn, float *out) {
    switch (r->kind) {
    case W_BF16: {
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
    case W_F32:
        memcpy(out, (const float *)r->w + t0, sizeof(float) * (size_t)tn);
        break;
    case W_FP8: {
        /* dequantized value: r16(e4m3 * row scale) (weights.h) */
        const uint8_t *w = (const uint8_t *)r->w + t0;
        for (int j = 0; j < tn; j++) out[j] = sm_r16(sm_e4m3_to_f32(w[j]) * r->scale);
        break;
    }
    default: { /* W_MXFP4: e2m1 code x 2^(s-127), exact; t0 is a multiple of 32 */
        static const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
        const uint8_t *q = (const uint8_t *)r->w + t0 / 2;
        for (int b = 0; b < tn / SM_MX_BLOCK; b++) {
            float sc = sm_e8m0_to_f32(r->s[t0 / SM_MX_BLOCK + b]);
            for (int j = 0; j < SM_MX_BLOCK / 2; j++) {
                uint8_t by = q[b * (SM_MX_BLOCK / 2) + j];
                out[b * SM_MX_BLOCK + 2 * j] = e2m1[by & 15u] * sc;
                out[b * SM_MX_BLOCK + 2 * j + 1] = e2m1[by >> 4] * sc;
            }
        }
        break;
    }
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

/* out[r * ldo] = ref_dot(x_r, w, k) for nx activation rows x_r = x + (rows ? rows[r] : r) * ldx;
 * the weight row is decoded once per group of RG rows.  Not rounded. */
static void mdot(const wrow *w, int k, const float *x, int64_t ldx, const int *rows, int nx, float *out,
                 int64_t ldo) {
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
            out[(int64_t)(g0 + r) * ldo] = s;
        }
    }
}

/* ---------------------------------------------------------------- norms, mm, rope */

void ref_rms(const float *x, int n, int d, const float *w, float eps, int round, float *out) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * d;
        float *oi = out + (int64_t)i * d;
        /* mean of squares, then the reciprocal root */
        float ms = ref_dot(xi, xi, d) / (float)d;
        float r = 1.0f / sqrtf(ms + eps);
        for (int j = 0; j < d; j++) {
            float v = xi[j] * r;
            if (w) v *= w[j];
            oi[j] = round ? sm_r16(v) : v;
        }
    }
}

/* One matmul job for the pool: y[i, j] for j in a chunk, every i. */
typedef struct mm_job {
    const float *x; int n, k;  /* x [n, k] (bf16-exact for the bf16 kind) */
    const void *W; int kind;   /* W [m, k] bf16 bits or f32 */
    int m;
    float *y;                  /* [n, m] */
    int round;                 /* r16 the outputs */
} mm_job;

static void mm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    (void)tid;
    const mm_job *j = arg;
    for (int64_t o = lo; o < hi; o++) {
        wrow r = {j->kind, NULL, NULL, 0.0f};
        r.w = j->kind == W_BF16 ? (const void *)((const uint16_t *)j->W + o * j->k)
                                : (const void *)((const float *)j->W + o * j->k);
        mdot(&r, j->k, j->x, j->k, NULL, j->n, j->y + o, j->m);
        if (j->round)
            for (int i = 0; i < j->n; i++) j->y[(int64_t)i * j->m + o] = sm_r16(j->y[(int64_t)i * j->m + o]);
    }
}

static int64_t mm_grain(struct sm_pool *p, int m) {
    int64_t g = m / (8 * sm_pool_nthreads(p));
    return g < 1 ? 1 : g > 64 ? 64 : g;
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

void ref_mm(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int m, float *y) {
    float *tmp;
    const float *xb = bf16_input(x, (int64_t)n * k, &tmp);
    mm_job j = {xb, n, k, W, W_BF16, m, y, 1};
    sm_pool_for(p, m, mm_grain(p, m), mm_chunk, &j);
    free(tmp);
}

void ref_mm_f32(struct sm_pool *p, const float *x, int n, int k, const float *W, int m, float *y) {
    mm_job j = {x, n, k, W, W_F32, m, y, 0};
    sm_pool_for(p, m, mm_grain(p, m), mm_chunk, &j);
}

void ref_rope(float *x, int h, int D, int pos, double theta) {
    int half = D / 2;
    for (int j = 0; j < half; j++) {
        /* inv_freq[j] = theta^(-2j/D), angle = pos * inv_freq in f32 */
        float inv = (float)pow(theta, -2.0 * j / (double)D);
        float ang = (float)pos * inv;
        float c = (float)cos((double)ang), s = (float)sin((double)ang);
        for (int hh = 0; hh < h; hh++) {
            float *xh = x + (int64_t)hh * D;
            float a = xh[j], b = xh[j + half];
            /* rotate-half: (a, b) -> (a cos - b sin, a sin + b cos), r16 */
            xh[j] = sm_r16(a * c - b * s);
            xh[j + half] = sm_r16(a * s + b * c);
        }
    }
}

/* ---------------------------------------------------------------- attention */

void ref_attention_head(const float *q, int nKV, int kvh, int D, const uint16_t *kv_layer,
                        const int *table, int pos, int window, float scale, float *scores, float *out) {
    int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    float kf[256];
    /* scores: q . k_t * scale over the visible keys, f32 */
    float mx = -INFINITY;
    for (int t = lo; t <= pos; t++) {
        const uint16_t *kt = kv_layer + (((int64_t)table[t / SM_KV_BLOCK] * nKV + kvh) * SM_KV_BLOCK
                                         + t % SM_KV_BLOCK) * (2 * D);
        for (int d = 0; d < D; d++) kf[d] = sm_bf16_to_f32(kt[d]);
        float sc = ref_dot(q, kf, D) * scale;
        scores[t - lo] = sc;
        if (sc > mx) mx = sc;
    }
    /* softmax weights exp(s - max), their sum in key order */
    float sum = 0.0f;
    for (int t = lo; t <= pos; t++) {
        float pw = expf(scores[t - lo] - mx);
        scores[t - lo] = pw;
        sum += pw;
    }
    /* out = sum_t p_t v_t / sum, f32, key order */
    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int t = lo; t <= pos; t++) {
        const uint16_t *vt = kv_layer + (((int64_t)table[t / SM_KV_BLOCK] * nKV + kvh) * SM_KV_BLOCK
                                         + t % SM_KV_BLOCK) * (2 * D) + D;
        float pw = scores[t - lo];
        for (int d = 0; d < D; d++) out[d] += pw * sm_bf16_to_f32(vt[d]);
    }
    for (int d = 0; d < D; d++) out[d] /= sum;
}

void ref_attention(const float *q, int nH, int nKV, int D, const uint16_t *kv_layer,
                   const int *table, int pos, int window, float scale, float *out) {
    float *scores = malloc(sizeof(float) * ((size_t)pos + 1));
    if (!scores) { for (int i = 0; i < nH * D; i++) out[i] = NAN; return; }
    int group = nH / nKV;
    for (int h = 0; h < nH; h++)
        ref_attention_head(q + (int64_t)h * D, nKV, h / group, D, kv_layer, table, pos, window, scale, scores,
                           out + (int64_t)h * D);
    free(scores);
}

/* ---------------------------------------------------------------- routing */

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void ref_topk(const sm_config *c, const float *logits, const float *bias, int *idx, float *w) {
    int E = c->E, K = c->K;
    /* top-K of sigmoid(logit * m_o) + bias, descending, ties to the lowest id */
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= idx[j] == e;
            if (used) continue;
            float v = sigmoidf_(logits[e] * c->out_mult) + bias[e];
            if (best < 0 || v > bv) { best = e; bv = v; }
        }
        idx[k] = best;
    }
    /* weights: the selected scores (bias-free) normalized, times route_scale */
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += sigmoidf_(logits[idx[k]] * c->out_mult);
    for (int k = 0; k < K; k++) w[k] = sigmoidf_(logits[idx[k]] * c->out_mult) / (sum + 1e-15f) * c->route_scale;
}

void ref_route(const sm_config *c, const float *xf, const float *router, const float *bias, int *idx, float *w) {
    float *lg = malloc(sizeof(float) * (size_t)c->E);
    if (!lg) { for (int k = 0; k < c->K; k++) { idx[k] = k; w[k] = NAN; } return; }
    /* router logits: f32 x f32, f32 accumulation */
    ref_mm_f32(NULL, xf, 1, c->H, router, c->E, lg);
    ref_topk(c, lg, bias, idx, w);
    free(lg);
}

/* ---------------------------------------------------------------- experts */

/* The storage of row `row` of expert matrix `which` of expert e in layer l. */
static wrow expert_wrow(const sm_model *m, int l, int e, int which, int row) {
    const sm_config *c = &m->cfg;
    const sm_experts *x = &m->layers[l].ex;
    int cols = which ? c->I : c->Hm;
    const void *w = which ? x->dn[e] : x->gu[e];
    const void *s = which ? x->dns[e] : x->gus[e];
    wrow r = {W_BF16, NULL, NULL, 0.0f};
    switch (x->fmt) {
    case SM_EXP_FP8:
        r.kind = W_FP8;
        r.w = (const uint8_t *)w + (int64_t)row * cols;
        r.scale = ((const float *)s)[row];
        break;
    case SM_EXP_MXFP4:
        r.kind = W_MXFP4;
        r.w = (const uint8_t *)w + (int64_t)row * (cols / 2);
        r.s = (const uint8_t *)s + (int64_t)row * (cols / SM_MX_BLOCK);
        break;
    default:
        r.w = (const uint16_t *)w + (int64_t)row * cols;
        break;
    }
    return r;
}

void ref_expert_row(const sm_model *m, int l, int e, int which, int row, float *out) {
    int cols = which ? m->cfg.I : m->cfg.Hm;
    wrow r = expert_wrow(m, l, e, which, row);
    for (int t0 = 0; t0 < cols; t0 += TILE) wrow_tile(&r, t0, cols - t0 < TILE ? cols - t0 : TILE, out + t0);
}

/* The routes (slots [s0, s0 + ns)) of expert e: x_rows of h1 (rows[] gives each slot's row)
 * -> gu [ns, 2I] -> a [ns, I] -> y [ns, Hm] -> yn in place. */
static void expert_slots(const sm_model *m, int l, int e, const float *h1, const int *rows, int ns, float *gu,
                         float *a, float *y) {
    const sm_config *c = &m->cfg;
    int Hm = c->Hm, I = c->I;
    /* gu = mm(h1, gate_up[e]): each weight row decoded once for all routes */
    for (int o = 0; o < 2 * I; o++) {
        wrow r = expert_wrow(m, l, e, 0, o);
        mdot(&r, Hm, h1, Hm, rows, ns, gu + o, 2 * I);
    }
    /* a = r16(silu(r16 gate) * r16 up) */
    for (int s = 0; s < ns; s++) {
        const float *g = gu + (int64_t)s * 2 * I;
        float *as = a + (int64_t)s * I;
        for (int i = 0; i < I; i++) {
            float gg = sm_r16(g[i]), uu = sm_r16(g[I + i]);
            as[i] = sm_r16(gg * sigmoidf_(gg) * uu);
        }
    }
    /* y = mm(a, down[e]) */
    for (int o = 0; o < Hm; o++) {
        wrow r = expert_wrow(m, l, e, 1, o);
        mdot(&r, I, a, I, NULL, ns, y + o, Hm);
    }
    /* t = r16(r16(y) * post_expert_norm); yn = t * rsqrt(mean(t^2) + post_eps) */
    const float *pn = m->layers[l].post_expert_norm;
    for (int s = 0; s < ns; s++) {
        float *ys = y + (int64_t)s * Hm;
        for (int i = 0; i < Hm; i++) ys[i] = sm_r16(sm_r16(ys[i]) * pn[i]);
        float r = 1.0f / sqrtf(ref_dot(ys, ys, Hm) / (float)Hm + c->post_eps);
        for (int i = 0; i < Hm; i++) ys[i] *= r;
    }
}

void ref_expert(const sm_model *m, int l, int e, const float *h1, float *yn) {
    const sm_config *c = &m->cfg;
    float *gu = malloc(sizeof(float) * (size_t)(2 * c->I + c->I));
    if (!gu) { for (int i = 0; i < c->Hm; i++) yn[i] = NAN; return; }
    int row0 = 0;
    expert_slots(m, l, e, h1, &row0, 1, gu, gu + 2 * c->I, yn);
    free(gu);
}

void ref_moe_ws_free(ref_moe_ws *ws) {
    free(ws->logits); free(ws->idx); free(ws->w); free(ws->h1); free(ws->m);
    free(ws->gu); free(ws->a); free(ws->y);
    free(ws->off); free(ws->route_slot); free(ws->active);
    free(ws->cur); free(ws->slot_row);
    memset(ws, 0, sizeof *ws);
}

int ref_moe_ws_reserve(ref_moe_ws *ws, const sm_config *c, int n, sm_err *e) {
    if (ws->cap >= n && ws->E == c->E && ws->K == c->K && ws->Hm == c->Hm && ws->I == c->I) return 0;
    ref_moe_ws_free(ws);
    size_t R = (size_t)n, RK = R * (size_t)c->K;
    ws->logits = malloc(sizeof(float) * R * (size_t)c->E);
    ws->idx = malloc(sizeof(int) * RK);
    ws->w = malloc(sizeof(float) * RK);
    ws->h1 = malloc(sizeof(float) * R * (size_t)c->Hm);
    ws->m = malloc(sizeof(float) * R * (size_t)c->Hm);
    ws->gu = malloc(sizeof(float) * RK * 2 * (size_t)c->I);
    ws->a = malloc(sizeof(float) * RK * (size_t)c->I);
    ws->y = malloc(sizeof(float) * RK * (size_t)c->Hm);
    ws->off = malloc(sizeof(int) * ((size_t)c->E + 1));
    ws->route_slot = malloc(sizeof(int) * RK);
    ws->active = malloc(sizeof(int) * (size_t)c->E);
    ws->cur = malloc(sizeof(int) * (size_t)c->E);
    ws->slot_row = malloc(sizeof(int) * RK);
    if (!ws->logits || !ws->idx || !ws->w || !ws->h1 || !ws->m || !ws->gu || !ws->a || !ws->y || !ws->off ||
        !ws->route_slot || !ws->active || !ws->cur || !ws->slot_row) {
        ref_moe_ws_free(ws);
        return sm_errf(e, "cpu moe: out of memory for the workspace of %d rows", n);
    }
    ws->cap = n; ws->E = c->E; ws->K = c->K; ws->Hm = c->Hm; ws->I = c->I;
    return 0;
}

/* Pool job: a chunk of the active experts, each with all its routes. */
typedef struct moe_job {
    const sm_model *m; int l;
    ref_moe_ws *ws;
    const int *rows; /* [nslots] row of each slot */
} moe_job;

static void moe_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    (void)tid;
    const moe_job *j = arg;
    const sm_config *c = &j->m->cfg;
    ref_moe_ws *ws = j->ws;
    for (int64_t i = lo; i < hi; i++) {
        int e = ws->active[i], s0 = ws->off[e], ns = ws->off[e + 1] - s0;
        expert_slots(j->m, j->l, e, ws->h1, j->rows + s0, ns, ws->gu + (int64_t)s0 * 2 * c->I,
                     ws->a + (int64_t)s0 * c->I, ws->y + (int64_t)s0 * c->Hm);
    }
}

int ref_moe_ws_run(struct sm_pool *p, const sm_model *m, int l, const float *xf, int n, float *f,
                   int *idx, float *w, float *h1, float *mm_out, ref_moe_ws *ws, sm_err *e) {
    const sm_config *c = &m->cfg;
    const sm_layer *L = &m->layers[l];
    int E = c->E, K = c->K, Hm = c->Hm;
    if (ref_moe_ws_reserve(ws, c, n, e)) return -1;
    if (!idx) idx = ws->idx;
    if (!w) w = ws->w;
    /* router logits (f32), then top-K and route weights per row */
    ref_mm_f32(p, xf, n, c->H, L->router, E, ws->logits);
    for (int i = 0; i < n; i++) ref_topk(c, ws->logits + (int64_t)i * E, L->router_bias, idx + i * K, w + i * K);
    /* h1 = r16(rms(mm(xf, pooler), pre_expert_norm)) */
    ref_mm(p, xf, n, c->H, L->pooler, Hm, ws->m);
    ref_rms(ws->m, n, Hm, L->pre_expert_norm, c->rms_eps, 1, ws->h1);
    /* group routes by expert (counting sort: slots of expert e are ordered by route id) */
    for (int x = 0; x <= E; x++) ws->off[x] = 0;
    for (int r = 0; r < n * K; r++) ws->off[idx[r] + 1]++;
    int nact = 0;
    for (int x = 0; x < E; x++) {
        if (ws->off[x + 1]) ws->active[nact++] = x;
        ws->off[x + 1] += ws->off[x];
    }
    for (int x = 0; x < E; x++) ws->cur[x] = ws->off[x];
    for (int r = 0; r < n * K; r++) {
        int s = ws->cur[idx[r]]++;
        ws->slot_row[s] = r / K;
        ws->route_slot[r] = s;
    }
    /* every active expert with all its routes, experts spread over the threads */
    moe_job j = {m, l, ws, ws->slot_row};
    sm_pool_for(p, nact, 1, moe_chunk, &j);
    /* m = r16(sum_k w_k * yn_k), f32 in route order */
    for (int i = 0; i < n; i++) {
        float *mi = ws->m + (int64_t)i * Hm;
        for (int x = 0; x < Hm; x++) mi[x] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float *yn = ws->y + (int64_t)ws->route_slot[i * K + k] * Hm;
            float wk = w[i * K + k];
            for (int x = 0; x < Hm; x++) mi[x] += wk * yn[x];
        }
        for (int x = 0; x < Hm; x++) mi[x] = sm_r16(mi[x]);
    }
    if (h1) memcpy(h1, ws->h1, sizeof(float) * (size_t)n * Hm);
    if (mm_out) memcpy(mm_out, ws->m, sizeof(float) * (size_t)n * Hm);
    /* f = mm(m, unpooler) */
    ref_mm(p, ws->m, n, Hm, L->unpooler, c->H, f);
    return 0;
}

void ref_moe(struct sm_pool *p, const sm_model *m, int l, const float *xf, int n, float *f,
             int *idx, float *w, float *h1, float *mm_out) {
    ref_moe_ws ws;
    memset(&ws, 0, sizeof ws);
    if (ref_moe_ws_run(p, m, l, xf, n, f, idx, w, h1, mm_out, &ws, NULL))
        for (int64_t i = 0; i < (int64_t)n * m->cfg.H; i++) f[i] = NAN; /* out of memory */
    ref_moe_ws_free(&ws);
}

/* ---------------------------------------------------------------- logits */

typedef struct lm_job {
    const sm_model *m;
    const float *h; int n;
    float *logits;   /* [n, V] */
} lm_job;

static void lm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    (void)tid;
    const lm_job *j = arg;
    const sm_config *c = &j->m->cfg;
    for (int64_t v = lo; v < hi; v++) {
        float *lv = j->logits + v;
        if (v >= c->vocab_used) {
            for (int i = 0; i < j->n; i++) lv[(int64_t)i * c->V] = -INFINITY;
            continue;
        }
        /* raw = h . lm_head[v], f32, not rounded */
        wrow r = {W_BF16, j->m->lm_head + v * c->H, NULL, 0.0f};
        mdot(&r, c->H, j->h, c->H, NULL, j->n, lv, c->V);
        /* softcap: c * tanh(raw * m_o / c) */
        for (int i = 0; i < j->n; i++) {
            float x = lv[(int64_t)i * c->V] * c->out_mult;
            lv[(int64_t)i * c->V] = c->softcap > 0.0f ? c->softcap * tanhf(x / c->softcap) : x;
        }
    }
}

void ref_logits_h(struct sm_pool *p, const sm_model *m, const float *h, int n, float *logits, int *argmax) {
    const sm_config *c = &m->cfg;
    lm_job j = {m, h, n, logits};
    sm_pool_for(p, c->V, mm_grain(p, c->V), lm_chunk, &j);
    /* greedy id among ids < vocab_used, lowest id on ties; -1 for a non-finite row */
    if (argmax)
        for (int i = 0; i < n; i++) argmax[i] = ref_argmax_row(logits + (int64_t)i * c->V, c->vocab_used);
}

int ref_argmax_row(const float *l, int n) {
    int best = 0;
    uint32_t bad = 0;
    for (int v = 0; v < n; v++) {
        uint32_t u;
        memcpy(&u, &l[v], 4);
        bad |= (u & 0x7F800000u) == 0x7F800000u; /* all-ones exponent: NaN or +-Inf */
        if (l[v] > l[best]) best = v;
    }
    return bad || n < 1 ? -1 : best;
}

void ref_logits(struct sm_pool *p, const sm_model *m, const float *s, int n, float *logits, int *argmax) {
    const sm_config *c = &m->cfg;
    float *h = malloc(sizeof(float) * (size_t)n * c->H);
    if (!h) {
        for (int64_t i = 0; i < (int64_t)n * c->V; i++) logits[i] = NAN;
        if (argmax) for (int i = 0; i < n; i++) argmax[i] = -1; /* NaN rows */
        return;
    }
    /* h = r16(rms(r16(s), final_norm as is)) */
    for (int64_t i = 0; i < (int64_t)n * c->H; i++) h[i] = sm_r16(s[i]);
    ref_rms(h, n, c->H, m->final_norm, c->rms_eps, 1, h);
    ref_logits_h(p, m, h, n, logits, argmax);
    free(h);
}
