/* test_w4a4.c: MXFP4 experts with MXFP4 activations, W4A4 (docs/model.md section 6), in the
 * CPU reference (src/cpu/ops_mm.c ref_mx_round_row / ref_wrow_dot_mx, src/cpu/ops_moe.c).
 *
 * Properties: the kernels' branch-free rounding (codec.h sm_mx_round_value) gives the value
 * of the quantizer's code for every bf16 value and scale byte; the W4A4 product equals an
 * independent evaluation written here from the spec's words (the quantizer by frexp and a
 * nearest-grid search, block sums in f64, then the f32 accumulation in block order) bit for
 * bit, on random rows, ties, zero blocks and extreme scales; the expert FFN of a tiny MXFP4
 * model under W4A4 equals the same independent evaluation route by route (gate, up, act, y);
 * the W4A4 route differs from the W4A16 one; grouping and threads change no bit.
 */
#include "check.h"
#include "tmodel.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
#include "model/codec.h"
#include "model/rng.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the independent evaluation */

/* The spec's quantizer of one block (section 7), by frexp and a search of the grid: scale
 * exponent e and the 32 rounded values x / 2^e on the e2m1 grid (ties to the even code). */
static int indep_quant(const float *x, double *q) {
    static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    double amax = 0;
    for (int i = 0; i < 32; i++) amax = fmax(amax, fabs((double)x[i]));
    int e = -127;
    if (amax > 0) {
        /* amax' = amax's bit pattern rounded up at mantissa bit 21, truncated to a power of two */
        float a = (float)amax;
        uint32_t u;
        memcpy(&u, &a, 4);
        u = (u + 0x200000u) & 0xFF800000u;
        memcpy(&a, &u, 4);
        int ex;
        frexp((double)a, &ex); /* a = 2^(ex - 1) */
        e = ex - 1 - 2;
        if (e < -127) e = -127;
        if (e > 127) e = 127;
    }
    for (int i = 0; i < 32; i++) {
        double y = fabs((double)x[i]) / ldexp(1.0, e);
        int best = 0;
        for (int c = 1; c < 8; c++) {
            double d = fabs(y - grid[c]), db = fabs(y - grid[best]);
            if (d < db || (d == db && (c & 1) == 0)) best = c;
        }
        if (y > 6) best = 7;
        q[i] = (x[i] < 0 ? -1 : 1) * grid[best];
    }
    return e;
}

/* out = the W4A4 product of weight row (codes wq [k/2], bytes ws [k/32]) and x [k]: exact block
 * sums in f64, times 2^(e_w + e_a), added in f32 in block order. */
static float indep_dot(const uint8_t *wq, const uint8_t *ws, const float *x, int k) {
    static const double val[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    float acc = 0.0f;
    for (int b = 0; b < k / 32; b++) {
        double q[32], s = 0;
        int ea = indep_quant(x + b * 32, q);
        for (int j = 0; j < 32; j++) {
            int i = b * 32 + j;
            double w = val[(i & 1) ? wq[i / 2] >> 4 : wq[i / 2] & 15];
            s += w * q[j];
        }
        acc += (float)ldexp(s, (int)ws[b] - 127 + ea);
    }
    return acc;
}

/* ---------------------------------------------------------------- the cases */

/* A normal variate of the sequential stream *st (rng.h's pairs, the first of each). */
static float normal(uint64_t *st) {
    float z0, z1;
    sm_rng_normal_pair(sm_rng_next(st), 0, &z0, &z1);
    return z0;
}

/* sm_mx_round_value against the quantizer's code value, every bf16 value x every byte. */
static void t_round_value(void) {
    long bad = 0;
    for (int b = 0; b < 255; b++) {
        float inv = b == 254 ? sm_bits_f32(0x00400000u) : sm_bits_f32((uint32_t)(254 - b) << 23);
        for (uint32_t h = 0; h < 65536; h++) {
            float x = sm_bf16_to_f32((uint16_t)h);
            if (isnan(x)) continue;
            float want = sm_e2m1_to_f32(sm_f32_to_e2m1(x * inv)) * sm_e8m0_to_f32((uint8_t)b);
            float got = sm_mx_round_value(x, (uint8_t)b);
            if (sm_f32_bits(got) != sm_f32_bits(want) && bad++ < 5)
                CHECK(0, "x %g byte %d: %g, want %g", x, b, got, want);
        }
    }
    CHECK(bad == 0, "%ld mismatches", bad);
}

/* A random bf16-exact activation value: mostly N(0, 1) x a per-block magnitude, with ties and
 * zero blocks mixed in. */
static float act_value(uint64_t *st, int blk_kind, float mag) {
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    if (blk_kind == 1) return 0.0f;
    if (blk_kind == 2) { /* exact midpoints of the grid under the block's scale (amax 6 x mag) */
        uint64_t r = sm_rng_next(st);
        float v = (r & 1) ? mids[(r >> 1) % 7] : 6.0f;
        return sm_r16(((r >> 8) & 1 ? -v : v) * mag);
    }
    return sm_r16((float)normal(st) * mag);
}

/* ref_wrow_dot_mx == the independent evaluation, bit for bit. */
static void t_dot(void) {
    enum { K = 512, ROWS = 21, WROWS = 7 };
    uint64_t st = 7;
    float *x = malloc(sizeof(float) * ROWS * K);
    uint8_t *wq = malloc(WROWS * K / 2), *ws = malloc(WROWS * K / 32);
    ref_mxrows q = {malloc(sizeof(float) * ROWS * K), malloc(ROWS * K / 32), K};
    float out[ROWS * WROWS];
    const float mags[] = {1.0f, 3e-3f, 700.0f, 1e-30f, 1e30f};
    for (int r = 0; r < ROWS; r++)
        for (int b = 0; b < K / 32; b++) {
            int kind = (r + b) % 9 == 0 ? 1 : (r * 3 + b) % 5 == 0 ? 2 : 0;
            float mag = mags[(r + 2 * b) % 5];
            for (int j = 0; j < 32; j++) x[r * K + b * 32 + j] = act_value(&st, kind, mag);
        }
    for (int i = 0; i < WROWS * K / 2; i++) wq[i] = (uint8_t)sm_rng_next(&st);
    for (int i = 0; i < WROWS * K / 32; i++) ws[i] = (uint8_t)(100 + sm_rng_next(&st) % 50);
    ws[3] = 1; ws[20] = 254; /* extreme weight scales: an underflowing and a huge block */
    for (int r = 0; r < ROWS; r++) ref_mx_round_row(x + r * K, K, &q, r);
    for (int o = 0; o < WROWS; o++) {
        ref_wrow w = {REF_W_MXFP4, wq + o * K / 2, ws + o * K / 32, 0.0f};
        ref_wrow_dot_mx(&w, K, &q, NULL, ROWS, out + o, WROWS, NULL);
    }
    int bad = 0;
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < WROWS; o++) {
            float want = indep_dot(wq + o * K / 2, ws + o * K / 32, x + r * K, K);
            if (sm_f32_bits(out[r * WROWS + o]) != sm_f32_bits(want) && bad++ < 5)
                CHECK(0, "row %d out %d: %.9g, want %.9g", r, o, out[r * WROWS + o], want);
        }
    CHECK(bad == 0, "%d mismatches", bad);
    free(x); free(wq); free(ws); free(q.v); free(q.s);
}

/* Row `row` of gate_up (which 0) or down (1) of expert e, layer l: codes and scale bytes. */
static void expert_row(const sm_model *m, int l, int e, int which, int row, const uint8_t **q, const uint8_t **s) {
    const sm_config *c = &m->cfg;
    const sm_experts *x = &m->layers[l].ex;
    int cols = which ? c->I : c->Hm;
    *q = (const uint8_t *)(which ? x->dn[e] : x->gu[e]) + (int64_t)row * cols / 2;
    *s = (const uint8_t *)(which ? x->dns[e] : x->gus[e]) + (int64_t)row * cols / 32;
}

/* One route by the independent evaluation: y [Hm] (not rounded) of h1 [Hm] through expert e. */
static void indep_route(const sm_model *m, int l, int e, const float *h1, float *y) {
    const sm_config *c = &m->cfg;
    int I = c->I, Hm = c->Hm;
    float *a = malloc(sizeof(float) * I);
    const uint8_t *q, *s;
    for (int i = 0; i < I; i++) {
        /* a = r16(silu(r16 gate) * r16 up), gate and up W4A4 */
        expert_row(m, l, e, 0, i, &q, &s);
        float g = sm_r16(indep_dot(q, s, h1, Hm));
        expert_row(m, l, e, 0, I + i, &q, &s);
        float u = sm_r16(indep_dot(q, s, h1, Hm));
        a[i] = sm_r16(g * (1.0f / (1.0f + expf(-g))) * u);
    }
    for (int o = 0; o < Hm; o++) {
        expert_row(m, l, e, 1, o, &q, &s);
        y[o] = indep_dot(q, s, a, I);
    }
    free(a);
}

static tmodel g_mx;

/* The expert FFN under W4A4 == the independent evaluation, every route; W4A16 differs. */
static void t_ffn(void) {
    if (!g_mx.ok) { CHECK(0, "no model"); return; }
    sm_model *m = &g_mx.m;
    const sm_config *c = &m->cfg;
    const int l = 1, n = 6, Hm = c->Hm;
    CHECK(m->layers[l].ex.fmt == SM_EXP_MXFP4, "layer 1 is not MXFP4");
    uint64_t st = 11;
    float *h1 = malloc(sizeof(float) * n * Hm), *y = malloc(sizeof(float) * Hm);
    int *idx = malloc(sizeof(int) * n * c->K);
    for (int i = 0; i < n * Hm; i++) h1[i] = sm_r16((float)normal(&st) * 1.5f);
    for (int i = 0; i < n * c->K; i++) idx[i] = (int)((i * 5 + i / c->K) % c->E);
    sm_shard_mat *views = malloc(sizeof *views * 2 * c->E);
    for (int j = 0; j < c->E; j++) {
        views[j] = (sm_shard_mat){m->layers[l].ex.gu[j], m->layers[l].ex.gus[j], Hm};
        views[c->E + j] = (sm_shard_mat){m->layers[l].ex.dn[j], m->layers[l].ex.dns[j], c->I};
    }
    double diff16 = 0;
    sm_err e = {""};
    for (int threads = 1; threads <= 3; threads += 2) {
        sm_pool *p = NULL;
        if (threads > 1 && sm_pool_create(threads, &p, &e)) { CHECK(0, "%s", e.msg); break; }
        for (int mode = 1; mode >= 0; mode--) {
            ref_experts X = {SM_EXP_MXFP4, 0, c->E, c->I, views, views, views + c->E, c->I, mode};
            ref_moe_ws ws;
            memset(&ws, 0, sizeof ws);
            if (ref_moe_ws_reserve(&ws, n * c->K, c->E, c->I, Hm, NULL)) { CHECK(0, "ws"); break; }
            ref_moe_group(&ws, idx, n * c->K, c->K, 0, c->E);
            ref_moe_ffn(p, &X, h1, Hm, &ws);
            int bad = 0;
            for (int r = 0; r < n * c->K; r++) {
                indep_route(m, l, idx[r], h1 + (r / c->K) * Hm, y);
                const float *got = ws.y + (int64_t)r * Hm;
                if (mode) {
                    for (int o = 0; o < Hm; o++)
                        if (sm_f32_bits(got[o]) != sm_f32_bits(y[o]) && bad++ < 3)
                            CHECK(0, "threads %d route %d y[%d] %.9g, want %.9g", threads, r, o, got[o], y[o]);
                } else {
                    diff16 += tm_rel_err(got, y, Hm);
                }
            }
            CHECK(bad == 0, "threads %d: %d mismatches", threads, bad);
            ref_moe_ws_free(&ws);
        }
        if (p) sm_pool_destroy(p);
    }
    /* W4A16 is another function: its routes differ from W4A4's by far more than rounding */
    diff16 /= 2.0 * n * c->K;
    printf("  W4A16 vs W4A4 y: mean rel diff %.3g\n", diff16);
    CHECK(diff16 > 1e-2, "W4A16 and W4A4 routes differ by only %g", diff16);
    free(h1); free(y); free(idx); free(views);
}

int main(void) {
    sm_config c;
    sm_err e = {""};
    if (sm_config_preset("tiny", &c, &e) == 0) tmodel_make(&g_mx, "sm_w4a4", &c, SM_EXP_MXFP4, 5, 0);
    RUN(t_round_value);
    RUN(t_dot);
    RUN(t_ffn);
    tmodel_free(&g_mx);
    return TEST_DONE();
}
