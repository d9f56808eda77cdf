/* serve_sched.h: the engine thread of `sparkmono serve`: one thread owns the engine and steps
 * the engine's batch (sparkmono_batch_*, src/engine/batch.c: the FIFO, admission, one verify
 * step over every live request, cancellation), and hands generated ids to the connections.
 *
 * A connection thread builds an sm_sreq (prompt ids, budget, sampling) for each choice of its
 * HTTP request and submits them into the batch together, all or none (a request whose choices
 * do not all fit in the free slots and the queue is refused whole, so no half of one waits);
 * the engine thread admits waiting requests (sparkmono_batch_admit: add + prefill, the
 * first token published before the verify step), runs one verify step (sparkmono_batch_verify),
 * appends each event's ids to its sm_sreq and wakes the waiting connection.  A request is shared
 * by the two threads and freed by whichever releases it last (refs).  The consumer cancels a
 * request (client gone, a stop string matched): a waiting one leaves the queue at once (its
 * place is free for the next client), a live one before the next verify step.  All shared
 * fields are under one mutex (taken before the batch's own); each request has its own notify
 * callback so a step wakes only the connections it fed.  We rejected a lock-free ring per
 * request: a step publishes at most max_requests small appends, far below the cost of the step
 * itself, and a plain mutex is easy to get right.  The engine's prefix-cache counters and page
 * pool (sparkmono_cache_stats) are read the same way: by the engine thread, after each admission
 * and verify step, into a copy under the mutex that /metrics and /health read; we rejected
 * reading them from a connection thread, as the engine is one thread's at a time.
 */
#ifndef SM_SERVE_SCHED_H
#define SM_SERVE_SCHED_H
#include <pthread.h>
#include "base/err.h"
#include "base/lptrack.h"
#include "sparkmono.h"
#include "serve/serve_metrics.h"

/* How a request ended (sm_sreq.done). */
enum {
    SM_SREQ_RUNNING = 0,
    SM_SREQ_EOS = 1,       /* an eos id was emitted */
    SM_SREQ_LENGTH = 2,    /* max_tokens reached */
    SM_SREQ_FAILED = 3,    /* the engine failed (err holds the line) */
    SM_SREQ_CANCELLED = 4  /* cancelled by the consumer or by shutdown */
};

typedef struct sm_sreq {
    /* set by the submitter, read-only once submitted */
    int *prompt;               /* [n] prompt ids in [0, V) (owned: freed with the request) */
    int n;                     /* prompt length >= 1 */
    int max_tokens;            /* >= 0 (0: the prompt only, for its logprobs) */
    sparkmono_sampling samp;   /* temperature 0: greedy */
    unsigned long long serial; /* request number, for the log */
    /* shared, under the scheduler's mutex */
    int *ids;                  /* [cap] generated ids, the first nids valid */
    int nids, cap;
    sm_lp_track glp;           /* [cap] positions: each id's logprobs (samp.logprobs), else empty (glp.lp
                                  NULL); a position below nids is never written again, so a consumer
                                  reads it after sm_sched_poll */
    sm_lp_track plp;           /* [n] positions: the prompt ids' (samp.prompt_logprobs; entry 0 NaN), else
                                  empty; written once, with the first ids (nids > 0 means they are
                                  there) or, max_tokens 0, with the end (done LENGTH) */
    int done;                  /* SM_SREQ_* */
    int cancel;                /* set by the consumer: stop and free the engine slot */
    int refs;                  /* holders: the submitter and, once submitted, the engine thread */
    long long bid;             /* its id in the engine's batch (0 before it is submitted) */
    int steps, accepted;       /* verify steps taken, drafts accepted (from the engine) */
    char err[256];             /* the failure line when done == SM_SREQ_FAILED or CANCELLED */
    void (*notify)(void *arg); /* called (under the mutex, by any thread) when ids or done change */
    void *notify_arg;          /* set before submitting; cleared by sm_sreq_release */
    struct sm_sreq *prev, *next; /* the scheduler's list of submitted requests not yet ended */
    double t_submit, t_first;  /* monotonic seconds: submitted, first id out (0 before) */
} sm_sreq;

/* Submission results besides 0. */
enum { SM_SCHED_FULL = 1, SM_SCHED_CLOSED = 2 };

typedef struct sm_sched {
    sparkmono_batch *b;        /* the engine's batch (FIFO, slots, steps: src/engine/batch.c), stepped by the engine thread */
    int slots, queue_cap;      /* the batch's request slots and the requests that may wait beyond them */
    pthread_mutex_t mu;        /* guards everything below and every sm_sreq's shared fields */
    pthread_cond_t work;       /* engine thread: a submission, a cancel or a stop */
    pthread_cond_t idle;       /* signalled when nothing is live or queued */
    sm_sreq *inflight;         /* submitted requests the engine thread still holds (a list) */
    int closed;                /* no new submissions (shutdown) */
    int quit;                  /* engine thread: exit once nothing is live or queued */
    long long tokens, steps;   /* ids emitted, verify steps run (stats) */
    long long req_steps, accepted; /* GET /metrics (atomic): verify steps summed over requests, drafts accepted */
    sm_hist step_time;         /* GET /metrics: wall time of each verify step */
    sparkmono_engine *g;       /* the engine under the batch: read (sparkmono_cache_stats_get) by the engine thread only */
    sparkmono_cache_stats cache; /* GET /metrics, /health: the prefix cache's counters and the KV page pool after the
                                    last admission or verify step (the engine thread's copy, published under mu) */
    pthread_t th;
    int started;
} sm_sched;

/* A new request (refs = 1, owned by the caller) taking ownership of prompt [n]. */
sm_sreq *sm_sreq_new(int *prompt, int n, int max_tokens, const sparkmono_sampling *s);
/* Drop one reference (the caller's; its notify callback is not called again); the last one
 * frees the request. */
void sm_sreq_release(sm_sched *s, sm_sreq *r);

/* Start the engine thread over g (slots request slots) with a queue of queue_cap requests
 * beyond its slots. */
int sm_sched_start(sm_sched *s, sparkmono_engine *g, int slots, int queue_cap, sm_err *e);
/* Queue r [n], all or none (the engine thread takes a second reference of each).  0,
 * SM_SCHED_FULL (the live and waiting requests and these n would pass slots + queue_cap: none
 * is queued) or SM_SCHED_CLOSED (shutting down).  One the engine refuses ends FAILED at once. */
int sm_sched_submit(sm_sched *s, sm_sreq **r, int n);
/* Copies r's ids [have, nids) to out [cap] (as many as fit) without waiting; returns how
 * many, and *done the state (SM_SREQ_RUNNING until every id has been taken). */
int sm_sched_poll(sm_sched *s, sm_sreq *r, int have, int *out, int cap, int *done);
/* Ask the engine thread to drop r (client gone, stop string matched). */
void sm_sched_cancel(sm_sched *s, sm_sreq *r);
/* Refuse new submissions from now on. */
void sm_sched_close(sm_sched *s);
/* Wait at most timeout_ms for nothing to be live or queued; 1 when idle. */
int sm_sched_wait_idle(sm_sched *s, int timeout_ms);
/* Cancel every queued and live request with message why. */
void sm_sched_cancel_all(sm_sched *s, const char *why);
/* Stop the engine thread (after cancelling whatever is left) and free the scheduler. */
void sm_sched_stop(sm_sched *s);
/* Requests live in the engine and waiting in the queue now; ids emitted and verify steps run. */
void sm_sched_counts(sm_sched *s, int *live, int *queued, long long *tokens, long long *steps);
/* The prefix cache's counters and the KV page pool as the engine thread last saw them (after an
 * admission or a verify step; at start, the empty pool). */
void sm_sched_cache(sm_sched *s, sparkmono_cache_stats *out);
/* Monotonic seconds. */
double sm_sched_now(void);

#endif
