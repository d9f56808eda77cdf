/* hbar.h: a bounded barrier of n host threads that any of them can abort: the rendezvous of the
 * CPU communicator (src/cpu/comm_cpu.c) and of virtual GPU ranks (src/cuda/comm/world.cu).
 *
 * Each wait either completes (every party arrived), or fails: because some party aborted
 * (before or during the wait: then every waiting and later wait fails with its reason), or
 * because the wait outlived its timeout (then the barrier is aborted with a line naming the
 * parties that never arrived, so the others fail too).  An abort sticks until sm_hbar_reset.
 * We rejected pthread_barrier_t: it can neither time out nor be aborted, so one dead party
 * would hang the rest.
 */
#ifndef SM_HBAR_H
#define SM_HBAR_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_hbar {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;                      /* parties, 1..64 */
    uint64_t gen;               /* generation, under mu */
    int arrived;                /* parties at the current generation, under mu */
    uint64_t arrived_mask;      /* bit r: party r arrived, under mu */
    int aborted;                /* under mu */
    int abort_rank;             /* the first aborting party, -1 for a timeout */
    char abort_msg[512];        /* its reason */
} sm_hbar;

void sm_hbar_init(sm_hbar *b, int n);
void sm_hbar_destroy(sm_hbar *b);
/* Fail every waiting and later wait with `why` (the first abort wins); rank -1: no party. */
void sm_hbar_abort(sm_hbar *b, int rank, const char *why);
/* Party `rank` waits up to timeout_s seconds for the others.  0 when all arrived; -1 when the
 * barrier is or becomes aborted: *who = the aborting party (-1 for a timeout) and msg its
 * reason (a timeout's reason: "<what>: rank r waited more than T s; ranks not arrived: q ..."). */
int sm_hbar_wait(sm_hbar *b, int rank, double timeout_s, const char *what, int *who, char *msg, size_t cap);
/* Forget an abort and start a fresh generation (no party may be waiting); returns 1 when an
 * abort had happened (then *who and msg as in sm_hbar_wait; either may be NULL). */
int sm_hbar_reset(sm_hbar *b, int *who, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
