/* batch.c: continuous batching over one engine (include/sparkmono.h, sparkmono_batch_*), the one
 * loop that `generate --batch`, the server's engine thread and the Python binding call.
 *
 * State: a FIFO of waiting requests (each with its own copy of the prompt) and a table with one
 * entry per engine request slot (the request in it, ids already reported, a cancel flag).  A
 * mutex guards the FIFO, the table's ids and cancel flags and the counts, so any thread may
 * submit or cancel while the stepping thread works; the engine itself is touched only by the
 * stepping thread, outside the mutex.  A call's events and their ids live in buffers of the
 * batch until its next call; an event's ids are copied out of the engine, so an ended request
 * leaves the engine at once and its slot is free for the next admission.  A request cancelled
 * while waiting leaves the FIFO at once (a dead client must not hold a place in it); one
 * cancelled while live leaves before the next verify step.  We rejected leaving the FIFO to
 * each caller (the CLI, the server and the binding each had one): a fix to admission or
 * cancellation must land in all three.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "constrain/constrain.h"
#include "engine/engine.h"

/* A waiting request. */
typedef struct bwait {
    long long id;              /* its number (submit order, from 1) */
    void *user;                /* the submitter's pointer, handed back in events */
    int *prompt;               /* [n] prompt ids (owned) */
    int n;                     /* prompt length >= 1 */
    int max_tokens;            /* >= 0 (0: the prompt only) */
    int sampled;               /* 1: s applies; 0: greedy, no processors */
    sparkmono_sampling s;      /* its sampling and logit processors when sampled */
    struct bwait *next;        /* the FIFO's link */
} bwait;

_Static_assert(SM_REQ_FAILED == SM_BATCH_FAILED, "a request that failed alone ends its batch event FAILED");

/* Free a waiting request (its constraint reference too). */
static void wait_free(bwait *w) {
    if (!w) return;
    if (w->sampled) sm_con_release(w->s.constraint);
    free(w->prompt);
    free(w);
}

/* The request in one engine slot. */
typedef struct bslot {
    long long id;              /* 0: the slot is free */
    void *user;                /* as submitted */
    int reported;              /* ids handed out in events so far */
    int cancel;                /* set by sparkmono_batch_cancel: leave before the next verify */
    long long order;           /* admission order (preemption takes the newest first) */
} bslot;

/* The batch: an event's ids are an offset into idbuf until the call returns (idbuf may move). */
struct sparkmono_batch {
    sparkmono_engine *g;       /* the engine (not owned) */
    int max_req;               /* its request slots */
    int queue_cap;             /* most waiting beyond the free slots; -1: no limit */
    pthread_mutex_t mu;        /* guards head/tail/nqueued, slot[].id/cancel, nlive, next_id, admitting */
    bwait *head, *tail;        /* the FIFO */
    int nqueued;               /* requests in it */
    bslot *slot;               /* [max_req] by engine slot */
    int nlive;                 /* slots in use, and the request being admitted */
    long long next_id;         /* the next submission's id */
    long long admitting;       /* id of the request between the FIFO and a slot (0: none) */
    long long admitted;        /* admissions so far (bslot.order) */
    int admitting_cancel;      /* it was cancelled on the way */
    sparkmono_batch_event *ev; /* [evcap] this call's events */
    int nev, evcap;
    size_t *evoff;             /* [evcap] offset of each event's ids in idbuf */
    char (*everr)[256];        /* [evcap] each event's err line */
    int *idbuf;                /* [idcap] this call's ids */
    size_t nid, idcap;
    size_t *evlp;              /* [evcap] offset of each event's logprobs in lpbuf (SIZE_MAX: none) */
    size_t *evplp;             /* [evcap] offset of each event's prompt logprobs in lpbuf (SIZE_MAX: none):
                                  prompt_len of them, then prompt_len * top of top_lp */
    float *lpbuf;              /* [lpcap] this call's logprobs: per event n, then n * top of top_lp */
    int *topbuf;               /* [lpcap] the same offsets: n unused (prompt logprobs: the prompt ids'
                                  ranks), then n * top of top_ids */
    size_t nlp, lpcap;
};

sm_status sparkmono_batch_create(sparkmono_engine *g, int queue_cap, sparkmono_batch **out) {
    if (!g || !out) return sm_engine_fail(SM_E_INVALID, "sparkmono_batch_create: NULL argument");
    *out = NULL;
    if (queue_cap < -1) {
        char m[128];
        snprintf(m, sizeof m, "sparkmono_batch_create: queue_cap %d is less than -1 (no limit)", queue_cap);
        return sm_engine_fail(SM_E_INVALID, m);
    }
    sparkmono_batch *b = calloc(1, sizeof *b);
    if (!b || !(b->slot = calloc((size_t)g->max_req, sizeof *b->slot))) {
        free(b);
        return sm_engine_fail(SM_E_NOMEM, "sparkmono_batch_create: out of memory");
    }
    b->g = g;
    b->max_req = g->max_req;
    b->queue_cap = queue_cap;
    b->next_id = 1;
    pthread_mutex_init(&b->mu, NULL);
    *out = b;
    return sm_engine_fail(SM_OK, "");
}

void sparkmono_batch_destroy(sparkmono_batch *b) {
    if (!b) return;
    while (b->head) {
        bwait *w = b->head;
        b->head = w->next;
        wait_free(w);
    }
    for (int q = 0; q < b->max_req; q++)
        if (b->slot[q].id) sparkmono_remove(b->g, q);
    pthread_mutex_destroy(&b->mu);
    free(b->slot);
    free(b->ev);
    free(b->evoff);
    free(b->everr);
    free(b->idbuf);
    free(b->evlp);
    free(b->evplp);
    free(b->lpbuf);
    free(b->topbuf);
    free(b);
}

sm_status sparkmono_batch_submit(sparkmono_batch *b, const int *prompt, int n, int max_tokens, const sparkmono_sampling *s,
                                 void *user, long long *id) {
    if (!b || !id) return sm_engine_fail(SM_E_INVALID, "sparkmono_batch_submit: NULL argument");
    *id = 0;
    sm_status st = sm_engine_check_request(b->g, prompt, n, max_tokens, s);
    if (st != SM_OK) return st;
    bwait *w = calloc(1, sizeof *w);
    if (!w || !(w->prompt = malloc((size_t)n * sizeof(int)))) {
        free(w);
        return sm_engine_fail(SM_E_NOMEM, "sparkmono_batch_submit: out of memory for the prompt");
    }
    memcpy(w->prompt, prompt, (size_t)n * sizeof(int));
    w->n = n;
    w->max_tokens = max_tokens;
    w->user = user;
    w->sampled = s != NULL; /* greedy requests keep theirs too: processors and stop ids */
    if (w->sampled) {
        w->s = *s;
        sm_con_retain(w->s.constraint); /* until it joins the engine, which holds its own */
    }
    pthread_mutex_lock(&b->mu);
    /* every slot taken and queue_cap more waiting: refused */
    if (b->queue_cap >= 0 && b->nlive + b->nqueued >= b->max_req + b->queue_cap) {
        pthread_mutex_unlock(&b->mu);
        wait_free(w);
        char m[160];
        snprintf(m, sizeof m, "sparkmono_batch_submit: every one of the %d request slots taken and %d waiting: the queue is full", b->max_req,
                 b->queue_cap);
        return sm_engine_fail(SM_E_CACHE, m);
    }
    w->id = b->next_id++;
    if (b->tail) b->tail->next = w;
    else b->head = w;
    b->tail = w;
    b->nqueued++;
    *id = w->id;
    pthread_mutex_unlock(&b->mu);
    return sm_engine_fail(SM_OK, "");
}

sm_status sparkmono_batch_cancel(sparkmono_batch *b, long long id, int *queued) {
    if (!b) return sm_engine_fail(SM_E_INVALID, "sparkmono_batch_cancel: NULL batch");
    int found = 0, was_queued = 0;
    bwait *gone = NULL;
    pthread_mutex_lock(&b->mu);
    /* waiting: unlink it now, so its place in the queue is free at once */
    for (bwait **p = &b->head, *prev = NULL; *p; prev = *p, p = &(*p)->next)
        if ((*p)->id == id) {
            gone = *p;
            *p = gone->next;
            if (b->tail == gone) b->tail = prev;
            b->nqueued--;
            found = was_queued = 1;
            break;
        }
    if (!found && id && b->admitting == id) b->admitting_cancel = found = 1;
    for (int q = 0; q < b->max_req && !found; q++)
        if (b->slot[q].id == id && id) b->slot[q].cancel = found = 1;
    pthread_mutex_unlock(&b->mu);
    if (gone) {
        wait_free(gone);
    }
    if (queued) *queued = was_queued;
    if (!found) {
        char m[128];
        snprintf(m, sizeof m, "sparkmono_batch_cancel: request %lld is neither waiting nor live", id);
        return sm_engine_fail(SM_E_INVALID, m);
    }
    return sm_engine_fail(SM_OK, "");
}

void sparkmono_batch_counts(sparkmono_batch *b, int *live, int *queued) {
    pthread_mutex_lock(&b->mu);
    if (live) *live = b->nlive;
    if (queued) *queued = b->nqueued;
    pthread_mutex_unlock(&b->mu);
}

/* ---- events ------------------------------------------------------------------------------- */

/* A new event of this call for request (id, user) with ids [n] copied; NULL when out of memory. */
static sparkmono_batch_event *ev_add(sparkmono_batch *b, long long id, void *user, const int *ids, int n) {
    if (b->nev == b->evcap) {
        int nc = b->evcap ? 2 * b->evcap : 16;
        sparkmono_batch_event *ne = realloc(b->ev, (size_t)nc * sizeof *ne);
        if (ne) b->ev = ne;
        size_t *no = ne ? realloc(b->evoff, (size_t)nc * sizeof *no) : NULL;
        if (no) b->evoff = no;
        char(*nr)[256] = no ? realloc(b->everr, (size_t)nc * sizeof *nr) : NULL;
        if (nr) b->everr = nr;
        size_t *nl = nr ? realloc(b->evlp, (size_t)nc * sizeof *nl) : NULL;
        if (nl) b->evlp = nl;
        size_t *np = nl ? realloc(b->evplp, (size_t)nc * sizeof *np) : NULL;
        if (!np) return NULL;
        b->evplp = np;
        b->evcap = nc;
    }
    if (b->nid + (size_t)n > b->idcap) {
        size_t nc = b->idcap ? 2 * b->idcap : 256;
        while (nc < b->nid + (size_t)n) nc *= 2;
        int *ni = realloc(b->idbuf, nc * sizeof *ni);
        if (!ni) return NULL;
        b->idbuf = ni;
        b->idcap = nc;
    }
    int k = b->nev++;
    sparkmono_batch_event *e = &b->ev[k];
    memset(e, 0, sizeof *e);
    e->id = id;
    e->user = user;
    e->n = n;
    b->evoff[k] = b->nid;
    if (n) memcpy(b->idbuf + b->nid, ids, (size_t)n * sizeof(int));
    b->nid += (size_t)n;
    b->everr[k][0] = 0;
    b->evlp[k] = SIZE_MAX;
    b->evplp[k] = SIZE_MAX;
    return e;
}

/* Room for need more entries in lpbuf / topbuf.  0, or -1 when out of memory. */
static int lp_reserve(sparkmono_batch *b, size_t need) {
    if (b->nlp + need <= b->lpcap) return 0;
    size_t nc = b->lpcap ? 2 * b->lpcap : 1024;
    while (nc < b->nlp + need) nc *= 2;
    float *nf = realloc(b->lpbuf, nc * sizeof *nf);
    if (nf) b->lpbuf = nf;
    int *ni = nf ? realloc(b->topbuf, nc * sizeof *ni) : NULL;
    if (!ni) return -1;
    b->topbuf = ni;
    b->lpcap = nc;
    return 0;
}

/* Copy the logprobs of slot q's generated ids [from, from + e->n) into event e (a request
 * with logprobs; others keep none).  0, or -1 when out of memory. */
static int ev_logprobs(sparkmono_batch *b, sparkmono_batch_event *e, int q, int from) {
    const float *lp, *tlp;
    const int *tid;
    int k;
    if (!e->n || sparkmono_logprobs(b->g, q, &lp, &tid, &tlp, &k) != SM_OK) return 0;
    const size_t need = (size_t)e->n * (size_t)(1 + k);
    if (lp_reserve(b, need)) return -1;
    float *o = b->lpbuf + b->nlp;
    memcpy(o, lp + from, (size_t)e->n * sizeof(float));
    memcpy(o + e->n, tlp + (size_t)from * k, (size_t)e->n * (size_t)k * sizeof(float));
    memcpy(b->topbuf + b->nlp + e->n, tid + (size_t)from * k, (size_t)e->n * (size_t)k * sizeof(int));
    b->evlp[e - b->ev] = b->nlp;
    e->top = k;
    b->nlp += need;
    return 0;
}

/* Copy the prompt logprobs of slot q into event e, its first with ids (from 0), or its end
 * without any (done: max_tokens 0); a request with prompt_logprobs, others keep none.  0, or
 * -1 when out of memory. */
static int ev_prompt_logprobs(sparkmono_batch *b, sparkmono_batch_event *e, int q, int from, int done) {
    const float *lp, *tlp;
    const int *rank, *tid;
    int k;
    if (from || (!e->n && !done) || sparkmono_prompt_logprobs(b->g, q, &lp, &rank, &tid, &tlp, &k) != SM_OK) return 0;
    const size_t P = (size_t)e->prompt_len, need = P * (size_t)(1 + k);
    if (lp_reserve(b, need)) return -1;
    float *o = b->lpbuf + b->nlp;
    memcpy(o, lp, P * sizeof(float));
    memcpy(b->topbuf + b->nlp, rank, P * sizeof(int));
    memcpy(o + P, tlp, P * (size_t)k * sizeof(float));
    memcpy(b->topbuf + b->nlp + P, tid, P * (size_t)k * sizeof(int));
    b->evplp[e - b->ev] = b->nlp;
    e->top = k;
    b->nlp += need;
    return 0;
}

/* The end of an event's err line. */
static void ev_err(sparkmono_batch *b, sparkmono_batch_event *e, const char *why) {
    snprintf(b->everr[e - b->ev], sizeof b->everr[0], "%s", why);
}

/* Free slot q (its request has ended): out of the engine and the table. */
static void slot_free(sparkmono_batch *b, int q) {
    sparkmono_remove(b->g, q);
    pthread_mutex_lock(&b->mu);
    b->slot[q].id = 0;
    b->slot[q].cancel = 0;
    b->nlive--;
    pthread_mutex_unlock(&b->mu);
}

/* End slot q with state done and line why, in an event without new ids.  0, or -1 when out of
 * memory for the event. */
static int end_slot(sparkmono_batch *b, int q, int done, const char *why) {
    sparkmono_request_info in;
    memset(&in, 0, sizeof in);
    sparkmono_request_get_info(b->g, q, &in);
    sparkmono_batch_event *e = ev_add(b, b->slot[q].id, b->slot[q].user, NULL, 0);
    int reported = b->slot[q].reported;
    slot_free(b, q);
    if (!e) return -1;
    e->ngen = reported;
    e->done = done;
    e->prompt_len = in.prompt_len;
    e->steps = in.steps;
    e->accepted = in.accepted;
    ev_err(b, e, why);
    return 0;
}

/* An event for every live request with ids not yet reported or a new end; ended ones leave. */
static sm_status report(sparkmono_batch *b) {
    for (int q = 0; q < b->max_req; q++) {
        bslot *sl = &b->slot[q];
        if (!sl->id) continue;
        sparkmono_request_info in;
        const int *ids;
        int n;
        if (sparkmono_request_get_info(b->g, q, &in) || sparkmono_output(b->g, q, &ids, &n)) return SM_E_STATE;
        if (n == sl->reported && !in.done) continue;
        sparkmono_batch_event *e = ev_add(b, sl->id, sl->user, ids + sl->reported, n - sl->reported);
        if (e) e->prompt_len = in.prompt_len;
        if (!e || ev_logprobs(b, e, q, sl->reported) || ev_prompt_logprobs(b, e, q, sl->reported, in.done))
            return sm_engine_fail(SM_E_NOMEM, "sparkmono_batch: out of memory for the step's events");
        sl->reported = n;
        e->ngen = n;
        e->done = in.done; /* 1 eos, 2 max_tokens, 3 failed alone: SM_BATCH_EOS, _LENGTH, _FAILED */
        if (in.done == SM_BATCH_FAILED) ev_err(b, e, sm_engine_req_err(b->g, q));
        e->steps = in.steps;
        e->accepted = in.accepted;
        if (in.done) slot_free(b, q);
    }
    return SM_OK;
}

/* Requests cancelled while live leave the engine, each with its CANCELLED event. */
static sm_status drop_cancelled(sparkmono_batch *b) {
    for (int q = 0; q < b->max_req; q++) {
        pthread_mutex_lock(&b->mu);
        int c = b->slot[q].id && b->slot[q].cancel;
        pthread_mutex_unlock(&b->mu);
        if (c && end_slot(b, q, SM_BATCH_CANCELLED, "cancelled"))
            return sm_engine_fail(SM_E_NOMEM, "sparkmono_batch: out of memory for the step's events");
    }
    return SM_OK;
}

/* Pages the live, running (not preempted) requests need beyond what they hold for their next
 * verify step. */
static int pages_short(const sparkmono_batch *b) {
    int more = 0;
    for (int q = 0; q < b->max_req; q++) {
        const sm_request *r = &b->g->reqs[q];
        if (!b->slot[q].id || !r->live || r->swapped || r->done) continue;
        int held, need = sm_engine_pages_next(b->g, q, &held);
        if (need > held) more += need - held;
    }
    return more;
}

/* Preempted requests come back first (oldest first) once the pool has their pages; a request
 * that fails to come back ends FAILED.  Returns 1 while one still waits (new requests wait
 * behind it). */
static int resume_preempted(sparkmono_batch *b) {
    for (;;) {
        int best = -1;
        for (int q = 0; q < b->max_req; q++)
            if (b->slot[q].id && b->g->reqs[q].swapped && (best < 0 || b->slot[q].order < b->slot[best].order)) best = q;
        if (best < 0) return 0;
        int held, need = sm_engine_pages_next(b->g, best, &held);
        if (need > sm_engine_pages_avail(b->g) - pages_short(b)) return 1;
        if (sm_engine_resume(b->g, best) != SM_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", sparkmono_errmsg());
            end_slot(b, best, SM_BATCH_FAILED, why);
        }
    }
}

/* Waiting requests join while slots are free and the pool has pages for their prompt: add +
 * prefill (the first token); preempted ones first.  A request the engine refuses ends FAILED
 * with the engine's line; the others go on. */
static sm_status admit_waiting(sparkmono_batch *b) {
    if (resume_preempted(b)) return SM_OK;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        bwait *w = b->nlive < b->max_req ? b->head : NULL;
        /* its prompt's pages beyond the live requests' next step, unless none is live (then it
         * takes what there is, or fails naming the pool); its own steps after the prefill are
         * verify_live's (preemption) */
        if (w && b->nlive > 0 && (w->n + SM_KV_BLOCK - 1) / SM_KV_BLOCK > sm_engine_pages_avail(b->g) - pages_short(b))
            w = NULL;
        if (w) {
            b->head = w->next;
            if (!b->head) b->tail = NULL;
            b->nqueued--;
            b->nlive++; /* its slot, from now on */
            b->admitting = w->id;
            b->admitting_cancel = 0;
        }
        pthread_mutex_unlock(&b->mu);
        if (!w) return SM_OK;
        int q = -1;
        sm_status st = sparkmono_add_sampled(b->g, w->prompt, w->n, w->max_tokens, w->sampled ? &w->s : NULL, &q);
        if (st == SM_OK) st = sparkmono_prefill(b->g, q, NULL);
        char why[256] = "";
        if (st != SM_OK) snprintf(why, sizeof why, "%s: %s", sparkmono_status_str(st), sparkmono_errmsg());
        pthread_mutex_lock(&b->mu);
        b->admitting = 0;
        if (st == SM_OK) {
            b->slot[q].id = w->id;
            b->slot[q].user = w->user;
            b->slot[q].reported = 0;
            b->slot[q].order = ++b->admitted;
            b->slot[q].cancel = b->admitting_cancel; /* cancelled on the way: leaves before the verify */
        } else {
            b->nlive--;
        }
        pthread_mutex_unlock(&b->mu);
        sm_status es = SM_OK;
        if (st != SM_OK) {
            if (q >= 0) sparkmono_remove(b->g, q);
            sparkmono_batch_event *e = ev_add(b, w->id, w->user, NULL, 0);
            if (e) {
                e->done = SM_BATCH_FAILED;
                e->prompt_len = w->n;
                ev_err(b, e, why);
            } else {
                es = sm_engine_fail(SM_E_NOMEM, "sparkmono_batch: out of memory for the step's events");
            }
        }
        wait_free(w);
        if (es != SM_OK) return es;
    }
}

/* One verify step over the live requests; a failure ends every one of them FAILED.  When the
 * pool cannot give every running request its next step's pages, the newest running ones are
 * preempted first (their pages back, recomputed when they resume): never an error while the
 * oldest alone fits. */
static sm_status verify_live(sparkmono_batch *b) {
    sm_status st = drop_cancelled(b);
    if (st != SM_OK) return st;
    if (b->nlive == 0) return SM_OK;
    for (;;) {
        int newest = -1, running = 0;
        for (int q = 0; q < b->max_req; q++) {
            const sm_request *r = &b->g->reqs[q];
            if (!b->slot[q].id || !r->live || !r->prefilled || r->swapped || r->done) continue;
            running++;
            if (newest < 0 || b->slot[q].order > b->slot[newest].order) newest = q;
        }
        if (running < 2 || pages_short(b) <= sm_engine_pages_avail(b->g)) break;
        if ((st = sm_engine_preempt(b->g, newest)) != SM_OK) return st;
    }
    st = sparkmono_verify(b->g, NULL, NULL, NULL);
    if (st == SM_OK) return SM_OK;
    char why[1024];
    snprintf(why, sizeof why, "%s", sparkmono_errmsg());
    for (int q = 0; q < b->max_req; q++)
        if (b->slot[q].id) end_slot(b, q, SM_BATCH_FAILED, why);
    return sm_engine_fail(st, why);
}

/* The call's events out: offsets become pointers. */
static sm_status hand_out(sparkmono_batch *b, sm_status st, const sparkmono_batch_event **ev, int *nev) {
    for (int k = 0; k < b->nev; k++) {
        b->ev[k].ids = b->ev[k].n ? b->idbuf + b->evoff[k] : NULL;
        b->ev[k].err = b->everr[k];
        if (b->evlp[k] != SIZE_MAX) { /* logprobs: n of them, then n * top alternatives */
            b->ev[k].logprobs = b->lpbuf + b->evlp[k];
            b->ev[k].top_lp = b->lpbuf + b->evlp[k] + b->ev[k].n;
            b->ev[k].top_ids = b->topbuf + b->evlp[k] + b->ev[k].n;
        }
        if (b->evplp[k] != SIZE_MAX) { /* prompt logprobs: prompt_len (and ranks), then prompt_len * top */
            const size_t P = (size_t)b->ev[k].prompt_len;
            b->ev[k].prompt_lp = b->lpbuf + b->evplp[k];
            b->ev[k].prompt_rank = b->topbuf + b->evplp[k];
            b->ev[k].prompt_top_lp = b->lpbuf + b->evplp[k] + P;
            b->ev[k].prompt_top_ids = b->topbuf + b->evplp[k] + P;
        }
    }
    *ev = b->ev;
    *nev = b->nev;
    return st == SM_OK ? sm_engine_fail(SM_OK, "") : st;
}

/* Start a call: no events yet. */
static int begin(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev, const char *fn) {
    if (!b || !ev || !nev) {
        char m[128];
        snprintf(m, sizeof m, "%s: NULL argument", fn);
        sm_engine_fail(SM_E_INVALID, m);
        return -1;
    }
    *ev = NULL;
    *nev = 0;
    b->nev = 0;
    b->nid = 0;
    b->nlp = 0;
    return 0;
}

sm_status sparkmono_batch_admit(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev) {
    if (begin(b, ev, nev, "sparkmono_batch_admit")) return SM_E_INVALID;
    sm_status st = drop_cancelled(b);
    if (st == SM_OK) st = admit_waiting(b);
    if (st == SM_OK) st = report(b);
    return hand_out(b, st, ev, nev);
}

sm_status sparkmono_batch_verify(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev) {
    if (begin(b, ev, nev, "sparkmono_batch_verify")) return SM_E_INVALID;
    sm_status st = verify_live(b);
    if (st == SM_OK) st = report(b);
    return hand_out(b, st, ev, nev);
}

sm_status sparkmono_batch_step(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev) {
    if (begin(b, ev, nev, "sparkmono_batch_step")) return SM_E_INVALID;
    sm_status st = drop_cancelled(b);
    if (st == SM_OK) st = admit_waiting(b);
    if (st == SM_OK) st = verify_live(b);
    if (st == SM_OK) st = report(b);
    return hand_out(b, st, ev, nev);
}
