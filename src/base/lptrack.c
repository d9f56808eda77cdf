/* lptrack.c: a run of positions' logprobs (see lptrack.h). */
#include "base/lptrack.h"
#include <stdlib.h>
#include <string.h>

int sm_lp_track_alloc(sm_lp_track *t, size_t n, int k) {
    const size_t np = n ? n : 1, nk = np * (size_t)k + 1; /* + 1: k may be 0 */
    t->lp = malloc(np * sizeof(float));
    t->rank = malloc(np * sizeof(int));
    t->top_ids = malloc(nk * sizeof(int));
    t->top_lp = malloc(nk * sizeof(float));
    t->k = k;
    if (t->lp && t->rank && t->top_ids && t->top_lp) return 0;
    sm_lp_track_free(t);
    return -1;
}

void sm_lp_track_free(sm_lp_track *t) {
    free(t->lp);
    free(t->rank);
    free(t->top_ids);
    free(t->top_lp);
    memset(t, 0, sizeof *t);
}

void sm_lp_track_put(sm_lp_track *t, size_t at, const float *lp, const int *rank, const int *ids, const float *tlp, size_t n) {
    const size_t k = (size_t)t->k;
    memcpy(t->lp + at, lp, n * sizeof(float));
    if (rank) memcpy(t->rank + at, rank, n * sizeof(int));
    else memset(t->rank + at, 0, n * sizeof(int));
    memcpy(t->top_ids + at * k, ids, n * k * sizeof(int));
    memcpy(t->top_lp + at * k, tlp, n * k * sizeof(float));
}
