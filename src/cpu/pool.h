/* pool.h: a small pthread pool with one primitive, a parallel-for over an index range.
 *
 * sm_pool_for(p, n, grain, fn, arg) calls fn(arg, lo, hi, tid) on disjoint chunks
 * [lo, hi) covering [0, n); chunks of `grain` indices are handed out dynamically (an atomic
 * counter), the calling thread works too (tid 0), workers have tids 1..nthreads-1, and the
 * call returns when every chunk is done.  Results are deterministic as long as fn writes each
 * output from one index only and sums in a fixed order: WHICH thread runs a chunk never
 * changes WHAT it computes.  `tid` indexes per-thread scratch owned by the caller.
 * A call made from inside a running parallel-for (nesting) runs inline on the caller.
 * We rejected OpenMP: the reduction order of `omp for` is not ours to fix, it is one more
 * runtime under ASan, and the pool is 100 lines.
 */
#ifndef SM_CPU_POOL_H
#define SM_CPU_POOL_H
#include <stdint.h>
#include "base/err.h"

typedef struct sm_pool sm_pool;
typedef void (*sm_pool_fn)(void *arg, int64_t lo, int64_t hi, int tid);

/* nthreads >= 1 threads in all (the caller included); nthreads = 0: online cores. */
int sm_pool_create(int nthreads, sm_pool **out, sm_err *e);
void sm_pool_destroy(sm_pool *p);
/* Threads of the pool (1 for a NULL pool). */
int sm_pool_nthreads(const sm_pool *p);
/* The grain of a parallel-for over n output features (weight rows): about 1/8 of a thread's
 * share, clamped to [1, 64] (chunks small enough to balance, large enough to amortize). */
int64_t sm_pool_grain(const sm_pool *p, int64_t n);
/* Run fn over [0, n) in chunks of grain (>= 1); p == NULL runs inline with tid 0. */
void sm_pool_for(sm_pool *p, int64_t n, int64_t grain, sm_pool_fn fn, void *arg);

#endif
