/* test_batch.c: the engine's continuous batching (sparkmono_batch_*, src/engine/batch.c).
 *
 * The reference of every stream is the same request run alone on an engine of one slot
 * (add, prefill, generate).  Checked: more requests than slots, greedy and sampled, give each
 * request exactly its stream alone, whether stepped whole (step) or in halves (admit, verify);
 * every request gets one last event and its events' ids add up to its stream; the queue's
 * limit refuses with a line, a cancelled waiting request frees its place at once and gets no
 * event; a cancelled live request leaves before the next verify step (its step count stops)
 * while the others go on unchanged; bad submissions and calls are refused with a line.  The
 * model is a random "tiny" checkpoint written into a temp directory.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "tmodel.h"
#include "model/config.h"
#include "model/rng.h"
#include "testing/makemodel.h"
#include "sparkmono.h"

#define NREQ 6
#define MT 24 /* most tokens a request */

static char g_tmp[512];
static sparkmono_model *g_model;
static int g_V;
static int g_prompt[NREQ][12], g_plen[NREQ], g_mt[NREQ];
static sparkmono_sampling g_samp[NREQ];
static int g_ref[NREQ][MT], g_nref[NREQ], g_refdone[NREQ]; /* each request alone */

static int one_line(const char *s) { return s && s[0] && !strchr(s, '\n'); }

static sparkmono_engine *engine(int max_requests) {
    sparkmono_engine_opts o = {0};
    o.request_rows = 4;
    o.max_requests = max_requests;
    o.max_len = 64;
    o.threads = 2;
    sparkmono_engine *g = NULL;
    if (sparkmono_engine_create(g_model, &o, &g) != SM_OK) CHECK(0, "engine: %s", sparkmono_errmsg());
    return g;
}

static void test_reference_alone(void) {
    uint64_t s = 77;
    for (int i = 0; i < NREQ; i++) {
        g_plen[i] = 1 + i * 2 % 11;
        for (int k = 0; k < g_plen[i]; k++) g_prompt[i][k] = 3 + (int)(sm_rng_next(&s) % (uint64_t)(g_V - 3));
        g_mt[i] = 6 + 3 * i;
        memset(&g_samp[i], 0, sizeof g_samp[i]);
        if (i % 2) { /* every other request sampled */
            g_samp[i].temperature = 0.9f;
            g_samp[i].top_k = 50;
            g_samp[i].seed = 1000 + (unsigned)i;
        }
        sparkmono_engine *g = engine(1);
        if (!g) return;
        int req;
        const int *ids;
        sparkmono_request_info in;
        sm_status st = sparkmono_add_sampled(g, g_prompt[i], g_plen[i], g_mt[i], &g_samp[i], &req);
        if (st == SM_OK) st = sparkmono_generate(g);
        if (st == SM_OK) st = sparkmono_output(g, req, &ids, &g_nref[i]);
        if (st == SM_OK) st = sparkmono_request_get_info(g, req, &in);
        CHECK(st == SM_OK, "request %d alone: %s", i, sparkmono_errmsg());
        if (st == SM_OK) {
            memcpy(g_ref[i], ids, (size_t)g_nref[i] * sizeof(int));
            g_refdone[i] = in.done;
        }
        sparkmono_engine_destroy(g);
    }
}

/* What the events said about each request. */
typedef struct seen {
    int ids[MT], n;  /* ids of its events, in order */
    int ends;        /* events with done set */
    int done;        /* the last one's done */
    int steps;       /* its steps in the last event */
    int bad;         /* an event disagreed with the ones before it */
} seen;

/* Apply events ev [nev] (each one's user pointer is its request's seen). */
static void take(const sparkmono_batch_event *ev, int nev) {
    for (int k = 0; k < nev; k++) {
        seen *x = ev[k].user;
        if (x->ends || x->n + ev[k].n > MT || ev[k].ngen != x->n + ev[k].n || (ev[k].n && !ev[k].ids) || !ev[k].err)
            x->bad = 1;
        if (x->n + ev[k].n <= MT && ev[k].n > 0) memcpy(x->ids + x->n, ev[k].ids, (size_t)ev[k].n * sizeof(int));
        x->n += ev[k].n;
        x->steps = ev[k].steps;
        if (ev[k].done) {
            x->ends++;
            x->done = ev[k].done;
        }
    }
}

/* Run every request through a batch of `slots` slots, stepped whole (halves = 0) or by admit
 * and verify; checks each against its run alone. */
static void run_all(int slots, int halves) {
    sparkmono_engine *g = engine(slots);
    sparkmono_batch *b = NULL;
    if (!g) return;
    CHECK(sparkmono_batch_create(g, -1, &b) == SM_OK, "create: %s", sparkmono_errmsg());
    seen sn[NREQ];
    memset(sn, 0, sizeof sn);
    long long id[NREQ];
    for (int i = 0; b && i < NREQ; i++)
        CHECK(sparkmono_batch_submit(b, g_prompt[i], g_plen[i], g_mt[i], &g_samp[i], &sn[i], &id[i]) == SM_OK && id[i] == i + 1,
              "submit %d: %s", i, sparkmono_errmsg());
    int live, queued, rounds = 0, max_live = 0;
    for (; b && rounds < 1000; rounds++) {
        sparkmono_batch_counts(b, &live, &queued);
        if (!live && !queued) break;
        const sparkmono_batch_event *ev;
        int nev;
        sm_status st;
        if (halves) {
            st = sparkmono_batch_admit(b, &ev, &nev);
            take(ev, nev);
            for (int k = 0; k < nev; k++) /* admit's events carry first tokens: no verify yet */
                CHECK(ev[k].steps == 0, "slots %d: an admit event of request %lld after %d steps", slots, ev[k].id, ev[k].steps);
            sparkmono_batch_counts(b, &live, NULL);
            if (live > max_live) max_live = live;
            if (st == SM_OK) st = sparkmono_batch_verify(b, &ev, &nev);
        } else {
            st = sparkmono_batch_step(b, &ev, &nev);
        }
        CHECK(st == SM_OK, "slots %d: step: %s", slots, sparkmono_errmsg());
        if (st != SM_OK) break;
        take(ev, nev);
    }
    CHECK(rounds < 1000, "slots %d: the batch never emptied", slots);
    if (halves) CHECK(max_live == slots, "slots %d: at most %d live at once", slots, max_live);
    for (int i = 0; i < NREQ; i++) {
        CHECK(!sn[i].bad && sn[i].ends == 1, "slots %d: request %d: events inconsistent (%d ends)", slots, i, sn[i].ends);
        CHECK(sn[i].n == g_nref[i] && !memcmp(sn[i].ids, g_ref[i], (size_t)g_nref[i] * sizeof(int)),
              "slots %d: request %d: %d ids, not its %d alone", slots, i, sn[i].n, g_nref[i]);
        CHECK(sn[i].done == g_refdone[i], "slots %d: request %d ended %d, alone %d", slots, i, sn[i].done, g_refdone[i]);
    }
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
}

static void test_batch_equals_alone(void) {
    run_all(2, 0);
    run_all(3, 1);
    run_all(NREQ, 0);
}

static void test_queue_limit_and_cancel_waiting(void) {
    sparkmono_engine *g = engine(1);
    sparkmono_batch *b = NULL;
    if (!g || sparkmono_batch_create(g, 2, &b) != SM_OK) { CHECK(0, "create: %s", sparkmono_errmsg()); sparkmono_engine_destroy(g); return; }
    seen sn[5];
    memset(sn, 0, sizeof sn);
    long long id[5];
    for (int i = 0; i < 3; i++)
        CHECK(sparkmono_batch_submit(b, g_prompt[i], g_plen[i], g_mt[i], &g_samp[i], &sn[i], &id[i]) == SM_OK, "submit %d", i);
    /* one slot and two waiting places: the fourth is refused */
    sm_status st = sparkmono_batch_submit(b, g_prompt[3], g_plen[3], g_mt[3], &g_samp[3], &sn[3], &id[3]);
    CHECK(st == SM_E_CACHE && strstr(sparkmono_errmsg(), "queue is full") && one_line(sparkmono_errmsg()) && id[3] == 0,
          "a full queue took a request: %d '%s'", st, sparkmono_errmsg());
    /* the second one's client is gone: it leaves the queue now, its place is free */
    int queued = -1, live, nq;
    CHECK(sparkmono_batch_cancel(b, id[1], &queued) == SM_OK && queued == 1, "cancel waiting: %s", sparkmono_errmsg());
    sparkmono_batch_counts(b, &live, &nq);
    CHECK(live == 0 && nq == 2, "after cancel: %d live, %d waiting", live, nq);
    CHECK(sparkmono_batch_cancel(b, id[1], &queued) == SM_E_INVALID && strstr(sparkmono_errmsg(), "neither waiting nor live"),
          "cancel twice: '%s'", sparkmono_errmsg());
    CHECK(sparkmono_batch_cancel(b, 999, NULL) == SM_E_INVALID && strstr(sparkmono_errmsg(), "request 999"),
          "cancel unknown: '%s'", sparkmono_errmsg());
    CHECK(sparkmono_batch_submit(b, g_prompt[3], g_plen[3], g_mt[3], &g_samp[3], &sn[3], &id[3]) == SM_OK && id[3] == 4,
          "submit into the freed place: %s", sparkmono_errmsg());
    for (int r = 0; r < 1000; r++) {
        sparkmono_batch_counts(b, &live, &nq);
        if (!live && !nq) break;
        const sparkmono_batch_event *ev;
        int nev;
        CHECK(sparkmono_batch_step(b, &ev, &nev) == SM_OK, "step: %s", sparkmono_errmsg());
        take(ev, nev);
    }
    CHECK(sn[1].n == 0 && sn[1].ends == 0, "the cancelled waiting request had events");
    for (int i = 0; i < 4; i++) {
        if (i == 1) continue;
        CHECK(sn[i].ends == 1 && sn[i].n == g_nref[i] && !memcmp(sn[i].ids, g_ref[i], (size_t)sn[i].n * sizeof(int)),
              "request %d: not its stream alone", i);
    }
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
}

static void test_cancel_live(void) {
    /* two greedy requests with long budgets live; the first is cancelled after one step */
    sparkmono_engine *g = engine(2);
    sparkmono_batch *b = NULL;
    if (!g || sparkmono_batch_create(g, -1, &b) != SM_OK) { CHECK(0, "create: %s", sparkmono_errmsg()); sparkmono_engine_destroy(g); return; }
    seen sn[2];
    memset(sn, 0, sizeof sn);
    long long id[2];
    int which[2] = {0, 4}; /* greedy requests */
    for (int k = 0; k < 2; k++)
        CHECK(sparkmono_batch_submit(b, g_prompt[which[k]], g_plen[which[k]], g_mt[which[k]], NULL, &sn[k], &id[k]) == SM_OK,
              "submit: %s", sparkmono_errmsg());
    const sparkmono_batch_event *ev;
    int nev, queued = -1, live;
    CHECK(sparkmono_batch_step(b, &ev, &nev) == SM_OK, "step 1: %s", sparkmono_errmsg());
    take(ev, nev);
    CHECK(sn[0].ends == 0 && sn[0].steps == 1 && sn[1].ends == 0, "the requests should run past step 1");
    int steps0 = sn[0].steps, n0 = sn[0].n;
    CHECK(sparkmono_batch_cancel(b, id[0], &queued) == SM_OK && queued == 0, "cancel live: %s", sparkmono_errmsg());
    CHECK(sparkmono_batch_step(b, &ev, &nev) == SM_OK, "step 2: %s", sparkmono_errmsg());
    take(ev, nev);
    /* gone before the verify: its last event says CANCELLED, no new ids, no new step */
    CHECK(sn[0].ends == 1 && sn[0].done == SM_BATCH_CANCELLED && sn[0].n == n0 && sn[0].steps == steps0 && !sn[0].bad,
          "cancelled: ends %d done %d ids %d/%d steps %d/%d", sn[0].ends, sn[0].done, sn[0].n, n0, sn[0].steps, steps0);
    for (int k = 0; k < nev; k++)
        if (ev[k].user == &sn[0]) CHECK(!strcmp(ev[k].err, "cancelled"), "its line: '%s'", ev[k].err);
    sparkmono_batch_counts(b, &live, NULL);
    CHECK(live == 1 && sn[1].steps == 2, "after the cancel: %d live, the other at %d steps", live, sn[1].steps);
    for (int r = 0; r < 1000 && live; r++) {
        CHECK(sparkmono_batch_step(b, &ev, &nev) == SM_OK, "step: %s", sparkmono_errmsg());
        take(ev, nev);
        sparkmono_batch_counts(b, &live, NULL);
    }
    CHECK(sn[1].ends == 1 && sn[1].n == g_nref[which[1]] && !memcmp(sn[1].ids, g_ref[which[1]], (size_t)sn[1].n * sizeof(int)),
          "the other request: not its stream alone");
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
}

static void test_bad_input(void) {
    sparkmono_engine *g = engine(1);
    sparkmono_batch *b = NULL;
    if (!g) return;
    CHECK(sparkmono_batch_create(g, -2, &b) == SM_E_INVALID && strstr(sparkmono_errmsg(), "queue_cap -2") && !b,
          "queue_cap -2: '%s'", sparkmono_errmsg());
    CHECK(sparkmono_batch_create(NULL, 0, &b) == SM_E_INVALID && one_line(sparkmono_errmsg()), "NULL engine");
    if (sparkmono_batch_create(g, 0, &b) != SM_OK) { CHECK(0, "create"); sparkmono_engine_destroy(g); return; }
    long long id = -1;
    int p[3] = {5, 6, 7}, bad_id[2] = {5, g_V};
    struct { const int *prompt; int n, mt; const char *says; } cases[] = {
        {p, 3, -1, "max tokens -1 is negative"},
        {p, 0, 4, "prompt is empty"},
        {NULL, 3, 4, "prompt is empty"},
        {bad_id, 2, 4, "out of range"},
        {p, 3, 62, "exceeds the max model length 64"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sm_status st = sparkmono_batch_submit(b, cases[k].prompt, cases[k].n, cases[k].mt, NULL, NULL, &id);
        CHECK(st == SM_E_INVALID && strstr(sparkmono_errmsg(), cases[k].says) && one_line(sparkmono_errmsg()) && id == 0,
              "case %zu: %d '%s'", k, st, sparkmono_errmsg());
    }
    sparkmono_sampling s = {.temperature = -1};
    CHECK(sparkmono_batch_submit(b, p, 3, 4, &s, NULL, &id) == SM_E_INVALID && strstr(sparkmono_errmsg(), "temperature"),
          "bad sampling: '%s'", sparkmono_errmsg());
    int live, queued;
    sparkmono_batch_counts(b, &live, &queued);
    CHECK(live == 0 && queued == 0, "a refused request was kept: %d live, %d waiting", live, queued);
    /* queue_cap 0: one in the slot's place, the next refused */
    CHECK(sparkmono_batch_submit(b, p, 3, 4, NULL, NULL, &id) == SM_OK, "submit: %s", sparkmono_errmsg());
    CHECK(sparkmono_batch_submit(b, p, 3, 4, NULL, NULL, &id) == SM_E_CACHE, "queue_cap 0 took a second request");
    const sparkmono_batch_event *ev;
    int nev;
    CHECK(sparkmono_batch_step(NULL, &ev, &nev) == SM_E_INVALID && strstr(sparkmono_errmsg(), "sparkmono_batch_step"), "NULL step");
    CHECK(sparkmono_batch_submit(b, p, 3, 4, NULL, NULL, NULL) == SM_E_INVALID, "NULL id");
    sparkmono_batch_destroy(b); /* with a request waiting: freed, no leak (ASan) */
    sparkmono_engine_destroy(g);
    CHECK(!strcmp(sparkmono_version(), SPARKMONO_VERSION) && strchr(SPARKMONO_VERSION, '.'), "version '%s'", sparkmono_version());
}

int main(void) {
    if (tm_mkdtemp(g_tmp, sizeof g_tmp, "sm_test_batch")) { printf("FAIL setup: mkdtemp\n"); return 1; }
    char dir[600];
    snprintf(dir, sizeof dir, "%s/tiny", g_tmp);
    sm_err e = {{0}};
    if (tm_make_tiny(dir, SM_EXP_MXFP4, 1, 0, &e) || sparkmono_model_open(dir, NULL, &g_model)) {
        printf("FAIL setup: %s %s\n", e.msg, sparkmono_errmsg());
        tm_rmtree(g_tmp);
        return 1;
    }
    sparkmono_model_info info;
    sparkmono_model_get_info(g_model, &info);
    g_V = info.vocab_size;
    RUN(test_reference_alone);
    RUN(test_batch_equals_alone);
    RUN(test_queue_limit_and_cancel_waiting);
    RUN(test_cancel_live);
    RUN(test_bad_input);
    sparkmono_model_close(g_model);
    tm_rmtree(g_tmp);
    return TEST_DONE();
}
