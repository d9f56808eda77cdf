/* ranks.h: W host threads, one per rank, that run a job together and report back (the rank
 * threads of the multi-rank backends).
 *
 * sm_ranks_run hands the job fn(arg, r) to every rank thread r at once and waits for all of
 * them; each returns 0 or -1 with its own error.  A job that fails should first make its peers
 * stop waiting for it (the comm's abort), since they run at the same time.  We rejected running
 * the ranks' jobs one after another on the caller's thread: a rank that waits for a peer (a
 * barrier, an exchange) would wait for a job that has not started; and the CPU thread pool
 * (cpu/pool.h) for the same reason: its parallel-for hands chunks to whichever thread is free
 * (one thread may run two ranks in turn) and runs nested parallel-fors inline, which would
 * serialize each rank's own pool.  Users: the CPU world (cpu/world.c) and the CUDA world.
 */
#ifndef SM_RANKS_H
#define SM_RANKS_H
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int (*sm_ranks_fn)(void *arg, int rank, sm_err *e);
typedef struct sm_ranks sm_ranks;

/* W threads (1..64) that will run fn(arg, r). */
int sm_ranks_create(int W, sm_ranks_fn fn, void *arg, sm_ranks **out, sm_err *e);
/* Run the job on every rank and wait; errs [W] gets each rank's error (msg "" when it
 * succeeded).  Returns the number of ranks that failed. */
int sm_ranks_run(sm_ranks *t, sm_err *errs);
/* Stop and join the threads (NULL is ignored). */
void sm_ranks_destroy(sm_ranks *t);

#ifdef __cplusplus
}
#endif
#endif
