/* lptrack.h: the logprobs of a run of positions: each position's logprob, its id's rank and its
 * k most likely ids with theirs.  The engine keeps two a request (its generated ids, its prompt
 * ids: engine.h), the server's scheduler the copies it hands to connections (serve_sched.h).
 * We rejected loose pointers in each place: their allocation, cleanup and copies were
 * written four times.
 */
#ifndef SM_LPTRACK_H
#define SM_LPTRACK_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_lp_track {
    float *lp;         /* [n] each position's logprob; NULL: none kept */
    int *rank;         /* [n] each position's id's rank in its row (backend.h: sm_lp_sum.tok_rank), 0:
                          unknown */
    int *top_ids;      /* [n * k] each position's k most likely ids */
    float *top_lp;     /* [n * k] their logprobs */
    int k;             /* alternatives a position (0..) */
} sm_lp_track;

/* n positions (at least one is made) of k alternatives.  0, or -1 out of memory with t empty. */
int sm_lp_track_alloc(sm_lp_track *t, size_t n, int k);
/* Free and empty t (an empty one too). */
void sm_lp_track_free(sm_lp_track *t);
/* Copy n positions (lp and rank [n], rank NULL: unknown; ids and tlp [n * t->k]) into t from
 * position at. */
void sm_lp_track_put(sm_lp_track *t, size_t at, const float *lp, const int *rank, const int *ids, const float *tlp, size_t n);

#ifdef __cplusplus
}
#endif
#endif
