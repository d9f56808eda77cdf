/* sample.h: drawing a token from one row of logits under a request's sampling parameters
 * (include/sparkmono.h: sparkmono_sampling), and the speculative rule on top of it
 * (docs/model.md section 8).  Pure functions of (row, parameters, uniform): no state between
 * calls beyond the caller's workspace.
 *
 * A row's distribution p is kept as weights w[i] = exp((l_i - l_max) / T) over the ids
 * [0, nv) (nv = vocab_used), 0 for ids the min-p / top-k / top-p cut drops, with their sum W
 * taken in id order: p(i) = w[i] / W.  min_p is a threshold on the weight itself (w = p /
 * p_max), so it needs no order; the top-k / top-p cut orders the ids min_p kept by logit, ties to
 * the lowest id; only the ids that can be in it are sorted: a histogram of (l_max - l) / T in
 * 1/8 steps finds the first bucket by which k ids, or a top_p share of the mass, are reached,
 * and the sort covers the buckets up to it (the kept ids are a prefix of the order, so they all
 * lie there); with top-k alone, only those candidates get a weight computed.  A draw walks the kept ids in
 * increasing order to the first cumulative weight above u * W.  The
 * uniform of the token at position `pos` of a request is a counter-based function of
 * (seed, pos) (src/model/rng.h), so a request's tokens never depend on the batch it runs in.
 *
 * Speculation: at a verify row whose next input is the draft d, the token at that position
 * is the draw with that position's uniform u.  It equals d with probability p(d) (u falls in
 * d's interval of the walk): d is accepted.  Otherwise u is uniform over the rest of [0, 1)
 * and the token is a draw from p with d removed, renormalized; it differs from d, so the
 * drafts after it are rejected.  One uniform per position serves both the accept test and
 * the draw after a rejection, so speculative and plain sampling emit the very same tokens
 * for the same seed (on rows of identical logits), not only the same distribution.
 * We rejected sorting the whole vocabulary per row (202048 ids, for each of up to R rows of
 * every request in a step) and an independent second uniform for the draw after a rejection
 * (exact as well, but speculative output would then differ from plain output seed by seed).
 */
#ifndef SM_SAMPLE_H
#define SM_SAMPLE_H
#include <stdint.h>
#include "base/err.h"
#include "sparkmono.h"

#define SM_SAMPLE_BUCKETS 4096 /* histogram of (l_max - l) / T in steps of 1/8 (the last: all beyond) */

/* An id of the top-k / top-p cut with its logit. */
typedef struct sm_sample_item {
    float l;           /* logit */
    int id;
} sm_sample_item;

/* The distribution of the last row given to sm_sample_dist, and its scratch. */
typedef struct sm_sample_ws {
    int cap;           /* ids the buffers hold */
    int nv;            /* ids [0, nv) of the row */
    double *w;         /* [cap] weight of each id: exp((l - l_max) / T) when kept, else 0 */
    double total;      /* W: sum of w[0..nv) in id order */
    int nkept;         /* ids with a nonzero weight: kept by the cut, exp not underflowed */
    sm_sample_item *cand; /* [cap] the cut's candidates, sorted by (logit desc, id asc); then its
                             kept ids in increasing order in [0, ncut) */
    int ncut;          /* kept ids of a top-k / top-p cut (in cand); 0: no cut, every id */
    int *bkt;          /* [cap] scratch: bucket of each id */
    int *bcount;       /* [SM_SAMPLE_BUCKETS] scratch: ids a bucket */
    double *bmass;     /* [SM_SAMPLE_BUCKETS] scratch: weight a bucket */
} sm_sample_ws;

/* Allocate a workspace for rows of at most cap ids; 0 or -1 (out of memory, in e). */
int sm_sample_ws_init(sm_sample_ws *ws, int cap, sm_err *e);
void sm_sample_ws_free(sm_sample_ws *ws);

/* 0 when s holds valid sampling parameters: temperature finite and >= 0, top_k >= 0, top_p
 * and min_p in [0, 1]; else -1 with one line naming the field and value. */
int sm_sample_check(const sparkmono_sampling *s, sm_err *e);

/* Build the distribution of logits [nv] (nv <= ws->cap) under s (temperature > 0): scale by
 * 1/T, drop the ids whose weight exp((l - l_max) / T) (p / p_max) is below min_p (0: none),
 * keep the top_k largest of the rest (0 or >= nv: all; ties to the lowest id), then the
 * shortest prefix of them whose probability reaches top_p (0 or 1: all).  -inf logits get
 * weight 0.
 * -1 on a NaN logit, nv out of range or temperature <= 0 (one line in e). */
int sm_sample_dist(sm_sample_ws *ws, const float *logits, int nv, const sparkmono_sampling *s, sm_err *e);

/* p(id) of the last distribution built (0 outside [0, nv) and for dropped ids). */
double sm_sample_prob(const sm_sample_ws *ws, int id);

/* The id drawn with uniform u in [0, 1): the first id (increasing order) whose cumulative
 * weight exceeds u * W (the last kept id if rounding leaves none). */
int sm_sample_draw(const sm_sample_ws *ws, double u);

/* The speculative rule at one position with draft d (docs/model.md section 8): returns the
 * token at this position, sm_sample_draw(ws, u); it is d (the draft is accepted, *accepted =
 * 1) with probability p(d), else (*accepted = 0) a token drawn from p with d removed,
 * renormalized. */
int sm_sample_accept(const sm_sample_ws *ws, int d, double u, int *accepted);

/* The uniform in [0, 1) (53 bits) of the token at position pos of a request with this seed. */
double sm_sample_uniform(uint64_t seed, int64_t pos);

#endif
