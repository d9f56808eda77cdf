/* sample.c: the sampler of sample.h: temperature, top-k / top-p cut, draw, speculative rule,
 * and the per-position uniform.
 *
 * Everything is computed in double from the f32 logits, in a fixed order (ids increasing for
 * sums and the draw, (logit desc, id asc) for the cut), so a row and a uniform give the same
 * token on every machine and whatever else is in the step.  We rejected a float softmax: the
 * weights of a 202048-id row summed in f32 lose the small ids' mass that top-p and the draw
 * must see.
 */
#include "engine/sample.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/rng.h"

int sm_sample_ws_init(sm_sample_ws *ws, int cap, sm_err *e) {
    memset(ws, 0, sizeof *ws);
    if (cap < 1) return sm_errf(e, "sampler: vocabulary of %d ids", cap);
    ws->cap = cap;
    ws->w = malloc((size_t)cap * sizeof(double));
    ws->cand = malloc((size_t)cap * sizeof(sm_sample_item));
    ws->bcount = malloc(SM_SAMPLE_BUCKETS * sizeof(int));
    ws->bmass = malloc(SM_SAMPLE_BUCKETS * sizeof(double));
    ws->bkt = malloc((size_t)cap * sizeof(int));
    if (!ws->w || !ws->cand || !ws->bcount || !ws->bmass || !ws->bkt) {
        sm_sample_ws_free(ws);
        return sm_errf(e, "sampler: out of memory for %d ids", cap);
    }
    return 0;
}

void sm_sample_ws_free(sm_sample_ws *ws) {
    free(ws->w);
    free(ws->cand);
    free(ws->bcount);
    free(ws->bmass);
    free(ws->bkt);
    memset(ws, 0, sizeof *ws);
}

int sm_sample_check(const sparkmono_sampling *s, sm_err *e) {
    if (!isfinite(s->temperature) || s->temperature < 0)
        return sm_errf(e, "sampling: temperature %g is not a finite number >= 0", (double)s->temperature);
    if (s->top_k < 0) return sm_errf(e, "sampling: top_k %d is negative", s->top_k);
    if (!isfinite(s->top_p) || s->top_p < 0 || s->top_p > 1)
        return sm_errf(e, "sampling: top_p %g is not in [0, 1]", (double)s->top_p);
    if (!isfinite(s->min_p) || s->min_p < 0 || s->min_p > 1)
        return sm_errf(e, "sampling: min_p %g is not in [0, 1]", (double)s->min_p);
    return 0;
}

static int cut_cmp(const void *a, const void *b) {
    const sm_sample_item *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Bucket of a scaled distance d = (l_max - l) / T >= 0 (inf: the last). */
static int bucket_of(double d) {
    double b = d * 8.0;
    return b >= (double)(SM_SAMPLE_BUCKETS - 1) ? SM_SAMPLE_BUCKETS - 1 : (int)b;
}

static int id_cmp(const void *a, const void *b) {
    const sm_sample_item *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

int sm_sample_dist(sm_sample_ws *ws, const float *logits, int nv, const sparkmono_sampling *s, sm_err *e) {
    if (nv < 1 || nv > ws->cap) return sm_errf(e, "sampler: row of %d ids, workspace of %d", nv, ws->cap);
    const double T = s->temperature;
    if (!(T > 0) || !isfinite(T)) return sm_errf(e, "sampler: temperature %g is not > 0", T);
    /* l_max (a NaN is an error; -inf ids get weight 0) */
    float lmax = -INFINITY;
    for (int i = 0; i < nv; i++) {
        if (isnan(logits[i])) return sm_errf(e, "sampler: logit of id %d is NaN", i);
        if (logits[i] > lmax) lmax = logits[i];
    }
    if (lmax == -INFINITY) return sm_errf(e, "sampler: every logit of the row is -inf");
    const double invT = 1.0 / T, minp = s->min_p;
    const int cutk = s->top_k > 0 && s->top_k < nv, cutp = s->top_p > 0 && s->top_p < 1;
    double *w = ws->w, tot = 0;
    int kept = 0;
    ws->nv = nv;
    ws->ncut = 0;
    if (!cutk && !cutp) {
        /* every id: weights exp((l - l_max) / T), those below min_p (p / p_max < min_p) 0, W
         * summed in id order */
        for (int i = 0; i < nv; i++) {
            w[i] = exp(((double)logits[i] - (double)lmax) * invT);
            if (w[i] < minp) w[i] = 0;
            tot += w[i];
            kept += w[i] > 0;
        }
        ws->nkept = kept;
        ws->total = tot;
        return 0;
    }
    /* histogram of the scaled distances d = (l_max - l) / T: ids a bucket, and (top-p without
     * top-k, which needs the whole row's mass) weight a bucket; an id min_p drops (its weight
     * exp(-d) below min_p) is in none, past every bucket */
    memset(ws->bcount, 0, SM_SAMPLE_BUCKETS * sizeof(int));
    memset(ws->bmass, 0, SM_SAMPLE_BUCKETS * sizeof(double));
    double wall = 0;
    for (int i = 0; i < nv; i++) {
        double d = ((double)lmax - (double)logits[i]) * invT;
        if (minp > 0 && exp(-d) < minp) {
            ws->bkt[i] = SM_SAMPLE_BUCKETS;
            continue;
        }
        int b = bucket_of(d);
        ws->bkt[i] = b;
        ws->bcount[b]++;
        if (!cutk) {
            w[i] = exp(-d);
            ws->bmass[b] += w[i];
            wall += w[i];
        }
    }
    /* J: the first bucket by which top_k ids (else top_p of the mass) are reached; the cut is a
     * prefix of the (logit desc, id asc) order, so it lies in buckets 0..J */
    int J = SM_SAMPLE_BUCKETS - 1, cnt = 0;
    double mass = 0;
    for (int b = 0; b < SM_SAMPLE_BUCKETS; b++) {
        cnt += ws->bcount[b];
        mass += ws->bmass[b];
        if (cutk ? cnt >= s->top_k : mass >= s->top_p * wall) {
            J = b;
            break;
        }
    }
    /* candidates: ids in buckets 0..J (their weights), sorted; every other id is dropped */
    sm_sample_item *c = ws->cand;
    int nc = 0;
    for (int i = 0; i < nv; i++) {
        if (ws->bkt[i] <= J) {
            if (cutk) w[i] = exp(((double)logits[i] - (double)lmax) * invT);
            c[nc].l = logits[i];
            c[nc].id = i;
            nc++;
        } else {
            w[i] = 0;
        }
    }
    qsort(c, (size_t)nc, sizeof *c, cut_cmp);
    /* top-k: the first k (of those min_p kept); top-p: the shortest prefix of those reaching
     * top_p of their mass (of the whole row's mass without top-k) */
    int m = cutk && s->top_k < nc ? s->top_k : nc;
    if (cutp) {
        double wk = 0, cum = 0;
        if (cutk)
            for (int j = 0; j < m; j++) wk += w[c[j].id];
        else
            wk = wall;
        for (int j = 0; j < m; j++) {
            cum += w[c[j].id];
            if (cum >= s->top_p * wk) {
                m = j + 1;
                break;
            }
        }
    }
    for (int j = m; j < nc; j++) w[c[j].id] = 0;
    /* the kept ids in increasing order (the draw walks them); W summed in that order, which is
     * the id order of the whole row with the dropped ids' zeros left out */
    qsort(c, (size_t)m, sizeof *c, id_cmp);
    for (int j = 0; j < m; j++) {
        tot += w[c[j].id];
        kept += w[c[j].id] > 0;
    }
    ws->ncut = m;
    ws->nkept = kept;
    ws->total = tot;
    return 0;
}

double sm_sample_prob(const sm_sample_ws *ws, int id) {
    if (id < 0 || id >= ws->nv || ws->total <= 0) return 0;
    return ws->w[id] / ws->total;
}

int sm_sample_draw(const sm_sample_ws *ws, double u) {
    const double target = u * ws->total;
    double cum = 0;
    int last = -1;
    const int n = ws->ncut ? ws->ncut : ws->nv;
    for (int j = 0; j < n; j++) {
        int i = ws->ncut ? ws->cand[j].id : j; /* ids in increasing order: the kept ones, or all */
        if (ws->w[i] <= 0) continue;
        /* id i covers [cum, cum + w[i]) of [0, W) */
        cum += ws->w[i];
        last = i;
        if (cum > target) return i;
    }
    return last;
}

int sm_sample_accept(const sm_sample_ws *ws, int d, double u, int *accepted) {
    /* u in d's interval: accept d (probability p(d)); otherwise u is uniform over the other
     * intervals and the id holding it is a draw from p with d removed, renormalized */
    int t = sm_sample_draw(ws, u);
    *accepted = t == d;
    return t;
}

double sm_sample_uniform(uint64_t seed, int64_t pos) {
    /* counter-based: the stream "sample" of seed, element pos (src/model/rng.h) */
    uint64_t r = sm_mix64(sm_rng_key(seed, "sample") + (uint64_t)pos * SM_RNG_GOLDEN);
    return (double)(r >> 11) * 0x1.0p-53;
}
