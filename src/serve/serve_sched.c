/* serve_sched.c: the engine thread of `sparkmono serve` (see serve_sched.h).
 *
 * Loop: admit (sparkmono_batch_admit: cancelled requests leave, waiting ones join and emit
 * their first token), publish its events under the mutex, run one verify step
 * (sparkmono_batch_verify), publish again.  An event ends its request when done is set (eos,
 * length, failed, cancelled), and the engine thread drops its reference.  A failed verify step
 * fails every request that was in it (the engine commits nothing of a failed step, so the next
 * requests run normally).  With nothing live or queued the thread sleeps on `work`.  We rejected
 * prefilling a newcomer inside the verify step (mixed prefill + verify rows): the public API
 * prefills one request at a time, and a prompt of the tiny sizes a server sees costs about one
 * verify step.
 */
#include "serve/serve_sched.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double sm_sched_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A condition variable timed on CLOCK_MONOTONIC (wall-clock jumps do not shorten waits). */
static int cond_init(pthread_cond_t *c) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a)) return -1;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc ? -1 : 0;
}

/* Wait on c at most ms milliseconds; 0 when signalled, ETIMEDOUT otherwise. */
static int cond_wait_ms(pthread_cond_t *c, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(c, mu, &ts);
}

sm_sreq *sm_sreq_new(int *prompt, int n, int max_tokens, const sparkmono_sampling *s) {
    sm_sreq *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->ids = malloc((size_t)(max_tokens > 0 ? max_tokens : 1) * sizeof(int));
    if (!r->ids) {
        free(r);
        return NULL;
    }
    r->prompt = prompt;
    r->n = n;
    r->max_tokens = max_tokens;
    r->cap = max_tokens;
    if (s) r->samp = *s;
    /* the engine's logprobs of each id, kept beside it; the prompt ids' (echo with logprobs) */
    if ((r->samp.logprobs && sm_lp_track_alloc(&r->glp, (size_t)max_tokens, r->samp.top_logprobs)) ||
        (r->samp.prompt_logprobs && sm_lp_track_alloc(&r->plp, (size_t)n, r->samp.top_logprobs))) {
        sm_lp_track_free(&r->glp);
        free(r->ids), free(r);
        return NULL;
    }
    r->refs = 1;
    return r;
}

static void release_locked(sm_sreq *r) {
    if (--r->refs > 0) return;
    free(r->prompt);
    free(r->ids);
    sm_lp_track_free(&r->glp);
    sm_lp_track_free(&r->plp);
    free(r);
}

void sm_sreq_release(sm_sched *s, sm_sreq *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    r->notify = NULL;
    release_locked(r);
    pthread_mutex_unlock(&s->mu);
}

/* Tell r's consumer that its ids or state changed.  Under the mutex. */
static void wake_locked(sm_sreq *r) {
    if (r->notify) r->notify(r->notify_arg);
}

/* End r with state done and message why (NULL: none); wakes its consumer.  Under the mutex. */
static void finish_locked(sm_sreq *r, int done, const char *why) {
    if (r->done == SM_SREQ_RUNNING) {
        r->done = done;
        if (why && !r->err[0]) snprintf(r->err, sizeof r->err, "%s", why);
    }
    wake_locked(r);
}

/* Take r off the in-flight list and drop the engine thread's reference.  Under the mutex. */
static void leave_locked(sm_sched *s, sm_sreq *r) {
    if (r->prev) r->prev->next = r->next;
    else s->inflight = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    release_locked(r);
}

/* Apply the batch's events [nev] to their requests and wake their consumers.  Under the mutex. */
static void publish_locked(sm_sched *s, const sparkmono_batch_event *ev, int nev) {
    static const int end_of[] = {SM_SREQ_RUNNING, SM_SREQ_EOS, SM_SREQ_LENGTH, SM_SREQ_FAILED, SM_SREQ_CANCELLED};
    for (int k = 0; k < nev; k++) {
        sm_sreq *r = ev[k].user;
        int n = ev[k].n < r->cap - r->nids ? ev[k].n : r->cap - r->nids; /* the engine stops at max_tokens */
        if (r->plp.lp && ev[k].prompt_lp && ev[k].prompt_len == r->n) /* with the first ids, or the end */
            sm_lp_track_put(&r->plp, 0, ev[k].prompt_lp, ev[k].prompt_rank, ev[k].prompt_top_ids, ev[k].prompt_top_lp,
                            (size_t)r->n);
        if (n > 0) {
            memcpy(r->ids + r->nids, ev[k].ids, (size_t)n * sizeof(int));
            if (r->glp.lp && ev[k].logprobs) /* their logprobs, at the same places */
                sm_lp_track_put(&r->glp, (size_t)r->nids, ev[k].logprobs, NULL, ev[k].top_ids, ev[k].top_lp, (size_t)n);
            s->tokens += n;
            if (!r->nids) r->t_first = sm_sched_now();
            r->nids += n;
        }
        __atomic_add_fetch(&s->req_steps, ev[k].steps - r->steps, __ATOMIC_RELAXED);
        __atomic_add_fetch(&s->accepted, ev[k].accepted - r->accepted, __ATOMIC_RELAXED);
        r->steps = ev[k].steps;
        r->accepted = ev[k].accepted;
        if (ev[k].done == SM_BATCH_RUNNING) {
            wake_locked(r);
            continue;
        }
        finish_locked(r, end_of[ev[k].done], ev[k].err[0] ? ev[k].err : NULL);
        leave_locked(s, r);
    }
}

/* The engine's cache counters into s->cache.  The engine thread, outside the mutex (reads the
 * engine), then under it (publishes). */
static void cache_read(sm_sched *s, sparkmono_cache_stats *cs) {
    if (sparkmono_cache_stats_get(s->g, cs) != SM_OK) memset(cs, 0, sizeof *cs); /* not expected: g is live */
}

static void *engine_main(void *arg) {
    sm_sched *s = arg;
    const sparkmono_batch_event *ev;
    sparkmono_cache_stats cs;
    int nev, live, queued;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sparkmono_batch_counts(s->b, &live, &queued);
        if (live == 0 && queued == 0) {
            pthread_cond_broadcast(&s->idle);
            if (s->quit) break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        /* the engine is touched only by this thread, outside the mutex */
        sparkmono_batch_admit(s->b, &ev, &nev); /* a failure is in the events */
        cache_read(s, &cs);
        pthread_mutex_lock(&s->mu);
        s->cache = cs;
        publish_locked(s, ev, nev);
        sparkmono_batch_counts(s->b, &live, NULL);
        if (live == 0) continue;
        pthread_mutex_unlock(&s->mu);
        double t0 = sm_sched_now();
        sm_status st = sparkmono_batch_verify(s->b, &ev, &nev);
        if (st == SM_OK) sm_hist_add(&s->step_time, sm_sched_now() - t0);
        cache_read(s, &cs); /* ended requests left the engine: their pages are cached or free */
        pthread_mutex_lock(&s->mu);
        s->cache = cs;
        if (st == SM_OK) s->steps++;
        publish_locked(s, ev, nev);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int sm_sched_start(sm_sched *s, sparkmono_engine *g, int slots, int queue_cap, sm_err *e) {
    memset(s, 0, sizeof *s);
    s->slots = slots;
    s->queue_cap = queue_cap;
    s->g = g;
    if (sparkmono_batch_create(g, queue_cap, &s->b)) return sm_errf(e, "serve: %s", sparkmono_errmsg());
    cache_read(s, &s->cache); /* the engine thread is not started yet: this thread may read g */
    pthread_mutex_init(&s->mu, NULL);
    int rc = cond_init(&s->work) || cond_init(&s->idle) ? -1 : pthread_create(&s->th, NULL, engine_main, s);
    if (rc) {
        sparkmono_batch_destroy(s->b);
        s->b = NULL;
        if (rc < 0) return sm_errf(e, "serve: cannot create condition variables");
        return sm_errf(e, "serve: cannot start the engine thread: %s", strerror(rc));
    }
    s->started = 1;
    return 0;
}

/* Queue r: 0, SM_SCHED_FULL, or 0 with r ended FAILED when the engine refuses it.  Under the mutex. */
static int submit_locked(sm_sched *s, sm_sreq *r) {
    const sparkmono_sampling *sp = &r->samp; /* greedy too: its processors and stop ids */
    sm_status st = sparkmono_batch_submit(s->b, r->prompt, r->n, r->max_tokens, sp, r, &r->bid);
    if (st == SM_E_CACHE) return SM_SCHED_FULL; /* every slot and queue place taken */
    if (st != SM_OK) { /* refused by the engine's checks: it ends failed, as it would at admission */
        finish_locked(r, SM_SREQ_FAILED, sparkmono_errmsg());
        return 0;
    }
    r->refs++; /* the engine thread's */
    r->t_submit = sm_sched_now();
    r->next = s->inflight;
    if (s->inflight) s->inflight->prev = r;
    s->inflight = r;
    return 0;
}

static void cancel_locked(sm_sched *s, sm_sreq *r, const char *why);

int sm_sched_submit(sm_sched *s, sm_sreq **r, int n) {
    pthread_mutex_lock(&s->mu);
    int rc = 0, live, queued;
    sparkmono_batch_counts(s->b, &live, &queued);
    /* only this mutex's holders submit and the engine thread only lowers live + queued, so n
     * places free now stay free while the n go in */
    if (s->closed) rc = SM_SCHED_CLOSED;
    else if (s->queue_cap >= 0 && live + queued + n > s->slots + s->queue_cap) rc = SM_SCHED_FULL;
    for (int k = 0; !rc && k < n; k++)
        if ((rc = submit_locked(s, r[k])) != 0) /* not expected after the count above: take back the others */
            for (int q = 0; q < k; q++) cancel_locked(s, r[q], "the server is busy");
    if (!rc) pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sm_sched_poll(sm_sched *s, sm_sreq *r, int have, int *out, int cap, int *done) {
    pthread_mutex_lock(&s->mu);
    int n = r->nids - have;
    if (n > cap) n = cap;
    if (n > 0) memcpy(out, r->ids + have, (size_t)n * sizeof(int));
    else n = 0;
    /* done only once every id has been handed out */
    *done = have + n == r->nids ? r->done : SM_SREQ_RUNNING;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Cancel r with line why: a waiting request ends now, a live one at the engine thread's next
 * admit.  Under the mutex. */
static void cancel_locked(sm_sched *s, sm_sreq *r, const char *why) {
    if (r->done || r->cancel || !r->bid) return;
    r->cancel = 1;
    int queued = 0;
    if (sparkmono_batch_cancel(s->b, r->bid, &queued) == SM_OK && queued) {
        finish_locked(r, SM_SREQ_CANCELLED, why);
        leave_locked(s, r);
    } else {
        if (!r->err[0]) snprintf(r->err, sizeof r->err, "%s", why);
    }
    pthread_cond_signal(&s->work);
}

void sm_sched_cancel(sm_sched *s, sm_sreq *r) {
    pthread_mutex_lock(&s->mu);
    cancel_locked(s, r, "cancelled");
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_close(sm_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_mutex_unlock(&s->mu);
}

int sm_sched_wait_idle(sm_sched *s, int timeout_ms) {
    int live, queued;
    pthread_mutex_lock(&s->mu);
    sparkmono_batch_counts(s->b, &live, &queued);
    if (live || queued) cond_wait_ms(&s->idle, &s->mu, timeout_ms);
    sparkmono_batch_counts(s->b, &live, &queued);
    pthread_mutex_unlock(&s->mu);
    return !live && !queued;
}

void sm_sched_counts(sm_sched *s, int *live, int *queued, long long *tokens, long long *steps) {
    pthread_mutex_lock(&s->mu);
    sparkmono_batch_counts(s->b, live, queued);
    *tokens = s->tokens;
    *steps = s->steps;
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_cache(sm_sched *s, sparkmono_cache_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->cache;
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_cancel_all(sm_sched *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    for (sm_sreq *r = s->inflight, *nx; r; r = nx) {
        nx = r->next; /* a waiting one leaves the list now */
        cancel_locked(s, r, why);
    }
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_stop(sm_sched *s) {
    if (!s->started) {
        sparkmono_batch_destroy(s->b);
        s->b = NULL;
        return;
    }
    sm_sched_cancel_all(s, "server shutting down");
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->started = 0;
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    sparkmono_batch_destroy(s->b);
    s->b = NULL;
}
