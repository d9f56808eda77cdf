/* ops_logits.c: the logits ops of the CPU reference (ops.h): the lm_head product with its
 * epilogue (softcap, vocabulary mask, non-finite rule) and the greedy argmax with its
 * non-finite guard (docs/model.md section 4, "Final norm and logits").
 *
 * The vocabulary rows are split over the threads, each lm_head row decoded once for all the
 * step's rows; a rank of W computes the rows of its vocabulary block with the same op.  A
 * raw logit that is not finite becomes NaN (ref_logit), so that one +-Inf reaching the
 * lm_head cannot be squashed by the softcap into a finite +-c, and the argmax guard, which
 * answers -1 for any row with a NaN or +-Inf among ids < vocab_used, catches every bad row.
 * We rejected scanning the raw logits separately for the guard: the epilogue already sees
 * every raw value once, and a second pass over [n, V] would double the logits' memory
 * traffic.  ref_logprobs_row is the logprob summary a step hands back instead of a row.
 */
#include "cpu/ops.h"
#include "cpu/pool.h"
#include <math.h>
#include <string.h>

float ref_logit(const sm_config *c, float raw) {
    /* non-finite rule (ours): NaN, so the argmax guard sees it whatever the softcap */
    if (!isfinite(raw)) return NAN;
    /* softcap: c * tanh(raw * m_o / c) */
    float x = raw * c->out_mult;
    float v = c->softcap > 0.0f ? c->softcap * tanhf(x / c->softcap) : x;
    /* an overflow to +-Inf is non-finite too: -inf is left to the ids a mask forbids */
    return isfinite(v) ? v : NAN;
}

/* Pool job of ref_logits_rows: a chunk of vocabulary rows for every step row. */
typedef struct lm_job {
    const sm_config *c;
    const float *h; int n;     /* [n, H] */
    const uint16_t *lm;        /* [nv, H] lm_head rows v0.. */
    int v0, nv;
    float *logits;             /* [n, nv] */
} lm_job;

static void lm_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    (void)tid;
    const lm_job *j = arg;
    const sm_config *c = j->c;
    for (int64_t v = lo; v < hi; v++) {
        float *lv = j->logits + v;
        if (j->v0 + v >= c->vocab_used) { /* untrained padding ids */
            for (int i = 0; i < j->n; i++) lv[(int64_t)i * j->nv] = -INFINITY;
            continue;
        }
        /* raw = h . lm_head[v], f32, not rounded */
        ref_wrow r = {REF_W_BF16, j->lm + v * c->H, NULL, 0.0f};
        ref_wrow_dot(&r, c->H, j->h, c->H, NULL, j->n, lv, j->nv, NULL);
        /* the epilogue */
        for (int i = 0; i < j->n; i++) lv[(int64_t)i * j->nv] = ref_logit(c, lv[(int64_t)i * j->nv]);
    }
}

void ref_logits_rows(struct sm_pool *p, const sm_config *c, const float *h, int n, const uint16_t *lm_rows, int v0,
                     int nv, float *logits) {
    lm_job j = {c, h, n, lm_rows, v0, nv, logits};
    sm_pool_for(p, nv, sm_pool_grain(p, nv), lm_chunk, &j);
}

int ref_argmax_row(const float *l, int n) {
    int best = 0;
    uint32_t bad = 0;
    for (int v = 0; v < n; v++) {
        uint32_t u;
        memcpy(&u, &l[v], 4);
        bad |= (u & 0x7F800000u) == 0x7F800000u && u != 0xFF800000u; /* NaN or +Inf (-inf: a masked id) */
        if (l[v] > l[best]) best = v;
    }
    return bad || n < 1 || l[best] == -INFINITY ? -1 : best;
}

int ref_row_bad(const float *l, int n) {
    for (int v = 0; v < n; v++)
        if (isnan(l[v]) || l[v] == INFINITY) return 1;
    return 0;
}

void ref_mask_row(float *row, const uint32_t *mask, int v0, int nv) {
    /* ids v0 .. v0 + nv - 1 whose bit is clear: -inf */
    for (int v = 0; v < nv; v++)
        if (!((mask[(v0 + v) >> 5] >> ((v0 + v) & 31)) & 1)) row[v] = -INFINITY;
}

void ref_logits_h(struct sm_pool *p, const sm_model *m, const float *h, int n, float *logits, int *argmax) {
    const sm_config *c = &m->cfg;
    ref_logits_rows(p, c, h, n, m->lm_head, 0, c->V, logits);
    /* greedy id among ids < vocab_used, lowest id on ties; -1 for a non-finite row */
    if (argmax)
        for (int i = 0; i < n; i++) argmax[i] = ref_argmax_row(logits + (int64_t)i * c->V, c->vocab_used);
}

void ref_logprobs_row(const float *l, int n, int k, int tok, sm_lp_sum *out) {
    memset(out, 0, sizeof *out);
    const int named = tok >= 0 && tok < n;
    const float tl = named ? l[tok] : -INFINITY;
    out->tok_l = tl; /* the named id's logit */
    const int am = ref_argmax_row(l, n);
    if (am < 0) { /* NaN or +-Inf: no distribution (rank 0: unknown) */
        out->bad = 1;
        return;
    }
    out->lmax = l[am];
    /* lse = log(sum_v exp(l_v - lmax)), the sum in double in id order; in the same pass the ids
     * before tok in the row's order (larger logit, or equal and lower id: the top list's) */
    double sum = 0;
    int before = 0;
    for (int v = 0; v < n; v++) {
        sum += exp((double)l[v] - (double)out->lmax);
        before += l[v] > tl || (l[v] == tl && v < tok);
    }
    out->lse = log(sum);
    out->tok_rank = named ? 1 + before : 0;
    /* the k largest by insertion into a sorted list: strict > keeps the lowest id first */
    if (k > SM_LP_MAX_TOP) k = SM_LP_MAX_TOP;
    int m = 0;
    for (int v = 0; v < n && k > 0; v++) {
        if (m == k && !(l[v] > out->top_l[k - 1])) continue;
        int j = m < k ? m++ : k - 1;
        for (; j > 0 && l[v] > out->top_l[j - 1]; j--) {
            out->top_l[j] = out->top_l[j - 1];
            out->top_ids[j] = out->top_ids[j - 1];
        }
        out->top_l[j] = l[v];
        out->top_ids[j] = v;
    }
    out->n = m;
}
