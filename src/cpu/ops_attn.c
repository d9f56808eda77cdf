/* ops_attn.c: the attention ops of the CPU reference (ops.h): RoPE, the QK norm + RoPE + KV
 * insert of a step's rows, and paged attention with its output norm and gate (docs/model.md
 * sections 4 and 5).
 *
 * Attention is computed per (row, query head) item, straight from the paged cache through the
 * row's block table, keys in increasing position order, so an item's result depends only on
 * its query and the cache: the caller may split the items over any number of threads, and a
 * row attends to the K/V of the earlier rows of its own step as soon as every row of the step
 * has been inserted (ref_qk_rope_kv runs over all rows first).  We rejected gathering a
 * request's keys into a contiguous buffer first: it would copy the whole context once per
 * step and layer, and the page walk is exactly what the GPU kernels must reproduce.
 */
#include "cpu/ops.h"
#include "cpu/pool.h"
#include "model/codec.h"
#include "backend/kvcache.h"
#include <math.h>
#include <stdlib.h>

#define MAX_D 256 /* largest head dimension ref_attention_items supports (stack row of K) */

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

void ref_qk_rope_kv(float *q, int ldq, float *k, const float *v, int ldkv, int n, int nh, int nkv, int D,
                    const int *pos, const int64_t *slot, double theta, float eps, uint16_t *kv, int nblocks) {
    for (int i = 0; i < n; i++) {
        float *qi = q + (int64_t)i * ldq, *ki = k + (int64_t)i * ldkv;
        const float *vi = v + (int64_t)i * ldkv;
        /* per-head QK rms norm (weightless), r16 */
        ref_rms(qi, nh, D, NULL, eps, 1, qi);
        ref_rms(ki, nkv, D, NULL, eps, 1, ki);
        /* RoPE on sliding layers only (full layers are NoPE) */
        if (theta > 0) {
            ref_rope(qi, nh, D, pos[i], theta);
            ref_rope(ki, nkv, D, pos[i], theta);
        }
        /* K (normed, roped) and V (as projected) into the row's cache slot, bf16 */
        int64_t sl = slot[i];
        if (sl < 0 || sl >= (int64_t)nblocks * SM_KV_BLOCK) continue;
        for (int h = 0; h < nkv; h++) {
            uint16_t *dst = kv + (((sl / SM_KV_BLOCK) * nkv + h) * SM_KV_BLOCK + sl % SM_KV_BLOCK) * 2 * D;
            for (int d = 0; d < D; d++) {
                dst[d] = sm_f32_to_bf16(ki[h * D + d]);
                dst[D + d] = sm_f32_to_bf16(vi[h * D + d]);
            }
        }
    }
}

/* K (part 0) or V (part 1) of the key at position t of KV head kvh, through the block table. */
static const uint16_t *kv_at(const ref_att *a, const int *table, int kvh, int t, int part) {
    return a->kv + (((int64_t)table[t / SM_KV_BLOCK] * a->nkv + kvh) * SM_KV_BLOCK + t % SM_KV_BLOCK) * (2 * a->D)
           + part * a->D;
}

/* o [D] = attention of query q [D] (KV head kvh) over keys lo..pos, f32, unnormalized. */
static void attend(const ref_att *a, const float *q, int kvh, const int *table, int pos, float *scores, float *o) {
    int D = a->D, lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    float kf[MAX_D];
    /* scores: q . k_t * scale over the visible keys, f32 */
    float mx = -INFINITY;
    for (int t = lo; t <= pos; t++) {
        const uint16_t *kt = kv_at(a, table, kvh, t, 0);
        for (int d = 0; d < D; d++) kf[d] = sm_bf16_to_f32(kt[d]);
        float sc = ref_dot(q, kf, D) * a->scale;
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
    /* o = sum_t p_t v_t / sum, f32, key order */
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (int t = lo; t <= pos; t++) {
        const uint16_t *vt = kv_at(a, table, kvh, t, 1);
        float pw = scores[t - lo];
        for (int d = 0; d < D; d++) o[d] += pw * sm_bf16_to_f32(vt[d]);
    }
    for (int d = 0; d < D; d++) o[d] /= sum;
}

void ref_attention_items(const ref_att *a, int64_t lo, int64_t hi, float *scores, float *att, float *out) {
    int D = a->D, QD = a->nh * D, group = a->nh / a->nkv;
    for (int64_t t = lo; t < hi; t++) {
        int i = (int)(t / a->nh), h = (int)(t % a->nh);
        const int *table = a->tables + (int64_t)a->row_req[i] * a->max_bpr;
        const float *g = a->gate + (int64_t)i * a->ldg + (int64_t)h * D;
        float *o = out + (int64_t)i * QD + (int64_t)h * D;
        /* o = softmax(q K^T * scale) V over the visible keys, f32 */
        attend(a, a->q + (int64_t)i * a->ldq + (int64_t)h * D, h / group, table, a->pos[i], scores, o);
        if (att)
            for (int d = 0; d < D; d++) att[(int64_t)i * QD + (int64_t)h * D + d] = o[d];
        /* out = r16(rms(o, -, eps) * sigmoid(g)): output norm (f32) and gate, per channel */
        ref_rms(o, 1, D, NULL, a->eps, 0, o);
        for (int d = 0; d < D; d++) o[d] = sm_r16(o[d] * (1.0f / (1.0f + expf(-g[d]))));
    }
}

/* Pool job of ref_attention: a chunk of items, the thread's own score row. */
typedef struct att_job {
    const ref_att *a;
    float *scores;   /* [nthreads, ld] */
    int64_t ld;
    float *att, *out;
} att_job;

static void att_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    const att_job *j = arg;
    ref_attention_items(j->a, lo, hi, j->scores + (int64_t)tid * j->ld, j->att, j->out);
}

void ref_attention(struct sm_pool *p, const ref_att *a, int n, float *scores, int64_t ld_scores, float *att,
                   float *out) {
    float *own = NULL;
    if (!scores) {
        ld_scores = 1;
        for (int i = 0; i < n; i++)
            if (a->pos[i] + 1 > ld_scores) ld_scores = a->pos[i] + 1;
        scores = own = malloc(sizeof(float) * (size_t)(ld_scores * sm_pool_nthreads(p)));
    }
    if (!scores || a->D > MAX_D) {
        for (int64_t t = 0; t < (int64_t)n * a->nh * a->D; t++) out[t] = NAN;
        free(own);
        return;
    }
    att_job j = {a, scores, ld_scores, att, out};
    sm_pool_for(p, (int64_t)n * a->nh, 1, att_chunk, &j);
    free(own);
}
