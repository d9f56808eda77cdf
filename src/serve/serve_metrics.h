/* serve_metrics.h: the counters and histograms of `sparkmono serve`'s GET /metrics and their
 * Prometheus text (format 0.0.4).
 *
 * Every counter is a plain integer updated with relaxed atomic adds by whichever thread sees
 * the event (the HTTP side: answers by status, prompt tokens, time to first token; the engine
 * thread: verify step times, drafts), and read with atomic loads when /metrics is asked for.
 * Counters only grow, so a scrape may see one a moment older than another, never one going
 * back.  We rejected a lock around the whole set: the engine thread would take a second lock
 * every step for numbers that need no consistency between them.  The prefix cache's counters
 * and the KV page gauges come from the engine itself (sparkmono_cache_stats), copied by the
 * engine thread after each admission and verify step (serve_sched.h: sm_sched_cache); the counts
 * of the structured-output cache under its own mutex (serve_struct.h).
 */
#ifndef SM_SERVE_METRICS_H
#define SM_SERVE_METRICS_H
#include "sparkmono.h"

#define SM_HIST_BUCKETS 15 /* finite upper bounds of a histogram (sm_hist_bounds), +Inf besides */

/* A histogram of durations in seconds (Prometheus "histogram"). */
typedef struct sm_hist {
    long long count[SM_HIST_BUCKETS + 1]; /* [b] observations <= bound b (not cumulative); the last: above every bound */
    long long sum_us;                      /* sum of every observation, microseconds */
} sm_hist;

/* Record one duration of t seconds (any thread). */
void sm_hist_add(sm_hist *h, double t);

#define SM_METRICS_CODES 600 /* HTTP statuses counted: [0, 600) */

/* What the HTTP side counts (every field atomic). */
typedef struct sm_metrics {
    long long status[SM_METRICS_CODES]; /* [code] answers given with that HTTP status */
    long long prompt_tokens;            /* prompt tokens of the completions accepted into the queue */
    sm_hist ttft;                       /* seconds from a completion's body read to its first id handed to its connection */
} sm_metrics;

/* Count one answer of HTTP status code. */
void sm_metrics_status(sm_metrics *m, unsigned code);

/* What the scrape reads besides sm_metrics (a snapshot taken by the caller). */
typedef struct sm_metrics_now {
    int running, queued;       /* requests live in the engine, waiting in its queue */
    long long tokens;          /* ids the engine emitted */
    long long steps;           /* verify steps run */
    long long drafts;          /* draft tokens proposed: R-1 a request a verify step */
    long long accepted;        /* draft tokens accepted */
    const sm_hist *step_time;  /* the verify steps' wall time */
    sparkmono_cache_stats cache; /* the prefix cache's counters and the KV page pool (the engine thread's copy) */
    long long cons_compiled;   /* structured outputs compiled (serve_struct.h) */
    long long cons_hits;       /* structured outputs found compiled in the cache */
    int cons_cached;           /* compiled constraints the cache holds */
} sm_metrics_now;

/* The Prometheus text of m and now (malloc'd; NULL when out of memory). */
char *sm_metrics_text(const sm_metrics *m, const sm_metrics_now *now);

#endif
