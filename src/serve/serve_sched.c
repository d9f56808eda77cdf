/* serve_sched.c: the engine thread of `sparkmono serve` (see serve_sched.h).
 *
 * Loop: under the mutex, collect the live requests the consumers cancelled and admit queued
 * ones into the free slots; outside it, remove the cancelled ones from the engine, add and
 * prefill the admitted ones (the prefill emits each one's first token), run one verify step
 * over every live request, then publish the new ids under the mutex and remove the finished
 * requests.  A failed verify step fails every request that was in it (the engine commits
 * nothing of a failed step, so the next requests run normally).  With nothing live or queued
 * the thread sleeps on `work`.  We rejected prefilling a newcomer inside the verify step
 * (mixed prefill + verify rows): the public API prefills one request at a time, and a prompt
 * of the tiny sizes a server sees costs about one verify step.
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
    r->refs = 1;
    return r;
}

static void release_locked(sm_sreq *r) {
    if (--r->refs > 0) return;
    free(r->prompt);
    free(r->ids);
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

/* Take the engine's new ids of slot q into its request; remove it from the engine when it is
 * done.  Engine thread, under the mutex. */
static void publish_locked(sm_sched *s, int q) {
    sm_sreq *r = s->live[q];
    const int *ids;
    int n;
    sparkmono_request_info info;
    if (sparkmono_output(s->g, q, &ids, &n) || sparkmono_request_get_info(s->g, q, &info)) {
        finish_locked(r, SM_SREQ_FAILED, sparkmono_errmsg());
    } else {
        if (n > r->cap) n = r->cap; /* cannot happen: the engine stops at max_tokens */
        if (n > r->nids) {
            memcpy(r->ids + r->nids, ids + r->nids, (size_t)(n - r->nids) * sizeof(int));
            s->tokens += n - r->nids;
            if (!r->nids) r->t_first = sm_sched_now();
            r->nids = n;
        }
        r->steps = info.steps;
        r->accepted = info.accepted;
        if (info.done) finish_locked(r, info.done == 1 ? SM_SREQ_EOS : SM_SREQ_LENGTH, NULL);
        else wake_locked(r);
    }
    if (r->done) {
        sparkmono_remove(s->g, q);
        s->live[q] = NULL;
        s->nlive--;
        release_locked(r);
    }
}

/* Drop slot q from the engine, ending its request with state done.  Under the mutex. */
static void drop_locked(sm_sched *s, int q, int done, const char *why) {
    sm_sreq *r = s->live[q];
    sparkmono_remove(s->g, q);
    s->live[q] = NULL;
    s->nlive--;
    finish_locked(r, done, why);
    release_locked(r);
}

/* Add and prefill r; on success it is live in its slot with its first token published. */
static void admit(sm_sched *s, sm_sreq *r) {
    int q = -1;
    const sparkmono_sampling *sp = r->samp.temperature > 0 ? &r->samp : NULL;
    sm_status st = sparkmono_add_sampled(s->g, r->prompt, r->n, r->max_tokens, sp, &q);
    if (st == SM_OK) st = sparkmono_prefill(s->g, q, NULL);
    pthread_mutex_lock(&s->mu);
    if (st != SM_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s: %s", sparkmono_status_str(st), sparkmono_errmsg());
        if (q >= 0) sparkmono_remove(s->g, q);
        finish_locked(r, SM_SREQ_FAILED, why);
        release_locked(r);
    } else {
        s->live[q] = r;
        s->nlive++;
        publish_locked(s, q);
    }
    pthread_mutex_unlock(&s->mu);
}

static void *engine_main(void *arg) {
    sm_sched *s = arg;
    sm_sreq **adm = malloc((size_t)s->max_req * sizeof *adm); /* admitted this round */
    pthread_mutex_lock(&s->mu);
    if (!adm) { /* cannot run: fail everything that arrives */
        s->closed = 1;
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    for (;;) {
        /* requests the consumers cancelled leave first, freeing their slots */
        for (int q = 0; q < s->max_req; q++)
            if (s->live[q] && s->live[q]->cancel) drop_locked(s, q, SM_SREQ_CANCELLED, "cancelled");
        int nadm = 0;
        while (s->qhead && s->nlive + nadm < s->max_req) {
            sm_sreq *r = s->qhead;
            s->qhead = r->next;
            if (!s->qhead) s->qtail = NULL;
            s->nqueued--;
            r->next = NULL;
            if (r->cancel) {
                finish_locked(r, SM_SREQ_CANCELLED, "cancelled");
                release_locked(r);
                continue;
            }
            adm[nadm++] = r;
        }
        if (nadm == 0 && s->nlive == 0) {
            pthread_cond_broadcast(&s->idle);
            if (s->quit) break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < nadm; i++) admit(s, adm[i]);
        int nreq = 0;
        sm_status st = SM_OK;
        /* the engine is touched only by this thread; live[] changes only here too */
        if (s->nlive > 0) st = sparkmono_verify(s->g, s->ntok, s->toks, &nreq);
        pthread_mutex_lock(&s->mu);
        if (st != SM_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", sparkmono_errmsg());
            for (int q = 0; q < s->max_req; q++)
                if (s->live[q]) drop_locked(s, q, SM_SREQ_FAILED, why);
            continue;
        }
        if (nreq > 0) s->steps++;
        for (int q = 0; q < s->max_req; q++)
            if (s->live[q] && s->ntok[q] > 0) publish_locked(s, q);
    }
    pthread_mutex_unlock(&s->mu);
    free(adm);
    return NULL;
}

int sm_sched_start(sm_sched *s, sparkmono_engine *g, int max_req, int R, int queue_cap, sm_err *e) {
    memset(s, 0, sizeof *s);
    s->g = g;
    s->max_req = max_req;
    s->R = R;
    s->queue_cap = queue_cap;
    s->live = calloc((size_t)max_req, sizeof *s->live);
    s->ntok = calloc((size_t)max_req, sizeof(int));
    s->toks = calloc((size_t)max_req * (size_t)R, sizeof(int));
    if (!s->live || !s->ntok || !s->toks) {
        free(s->live);
        free(s->ntok);
        free(s->toks);
        return sm_errf(e, "serve: out of memory for %d request slots", max_req);
    }
    pthread_mutex_init(&s->mu, NULL);
    if (cond_init(&s->work) || cond_init(&s->idle)) return sm_errf(e, "serve: cannot create condition variables");
    int rc = pthread_create(&s->th, NULL, engine_main, s);
    if (rc) return sm_errf(e, "serve: cannot start the engine thread: %s", strerror(rc));
    s->started = 1;
    return 0;
}

int sm_sched_submit(sm_sched *s, sm_sreq *r) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->closed) rc = SM_SCHED_CLOSED;
    else if (s->nlive + s->nqueued >= s->max_req + s->queue_cap) rc = SM_SCHED_FULL; /* every slot and queue place taken */
    else {
        r->refs++; /* the engine thread's */
        r->t_submit = sm_sched_now();
        if (s->qtail) s->qtail->next = r;
        else s->qhead = r;
        s->qtail = r;
        s->nqueued++;
        pthread_cond_signal(&s->work);
    }
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

void sm_sched_cancel(sm_sched *s, sm_sreq *r) {
    pthread_mutex_lock(&s->mu);
    if (!r->done && !r->cancel) {
        r->cancel = 1;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_close(sm_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_mutex_unlock(&s->mu);
}

int sm_sched_wait_idle(sm_sched *s, int timeout_ms) {
    pthread_mutex_lock(&s->mu);
    if (s->nlive || s->nqueued) cond_wait_ms(&s->idle, &s->mu, timeout_ms);
    int idle = !s->nlive && !s->nqueued;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void sm_sched_counts(sm_sched *s, int *live, int *queued, long long *tokens, long long *steps) {
    pthread_mutex_lock(&s->mu);
    *live = s->nlive;
    *queued = s->nqueued;
    *tokens = s->tokens;
    *steps = s->steps;
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_cancel_all(sm_sched *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    while (s->qhead) { /* queued: never reached the engine */
        sm_sreq *r = s->qhead;
        s->qhead = r->next;
        r->next = NULL;
        s->nqueued--;
        finish_locked(r, SM_SREQ_CANCELLED, why);
        release_locked(r);
    }
    s->qtail = NULL;
    for (int q = 0; q < s->max_req; q++) { /* live: the engine thread drops them */
        sm_sreq *r = s->live[q];
        if (r && !r->cancel) {
            r->cancel = 1;
            if (!r->err[0]) snprintf(r->err, sizeof r->err, "%s", why);
        }
    }
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

void sm_sched_stop(sm_sched *s) {
    if (!s->started) return;
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
    free(s->live);
    free(s->ntok);
    free(s->toks);
}
