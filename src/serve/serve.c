/* serve.c: `sparkmono serve` from start to clean exit (see serve.h): open the model, its
 * tokenizer and the engine, start the engine thread and the HTTP server, wait for a signal,
 * drain, stop.
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread (the mask is set before any thread
 * starts, so the engine's CPU workers and the HTTP polling threads inherit it) and taken by
 * this thread with sigwait, so no handler runs inside a thread holding a lock.  We rejected a
 * handler that sets a flag: the main thread would need to poll it, and async-signal-safety
 * rules out anything more.  The signals stay blocked when sm_serve_run returns (the process
 * is about to exit): a second SIGTERM during the shutdown must not kill it with status 143.
 */
#include "serve/serve.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "serve/serve_http.h"
#include "serve/serve_misc.h"

/* The served model's default name: the directory's last component. */
static void base_name(const char *dir, char *out, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, n, "%.*s", (int)(len - b), dir + b);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int sm_serve_run(const sm_serve_opts *o, sm_err *e) {
    sm_server s;
    memset(&s, 0, sizeof s);
    s.o = o;
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    sm_tokenizer *tok = NULL;
    sm_struct_cache cons = {0}; /* structured outputs compiled for m, shared by the requests */
    char name[256], path[4096];
    int rc = -1;

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up is an error return of the write */

    sparkmono_model_opts mo = {0};
    mo.online_mxfp4 = o->online_mxfp4;
    mo.activations = o->activations;
    if (sparkmono_model_open(o->model_dir, &mo, &m)) {
        sm_errf(e, "serve: %s", sparkmono_errmsg());
        goto out;
    }
    sparkmono_model_info info;
    sparkmono_model_get_info(m, &info);
    if (sm_tokenizer_load_dir(o->model_dir, &tok, path, sizeof path, e)) {
        sm_errprefix(e, "serve");
        goto out;
    }
    if (sm_chat_load(o->model_dir, o->chat_template, &s.chat, e)) { /* a template outside the subset stops the start */
        sm_errprefix(e, "serve");
        goto out;
    }
    if (o->model_name) snprintf(name, sizeof name, "%s", o->model_name);
    else base_name(o->model_dir, name, sizeof name);

    sparkmono_engine_opts eo = {0};
    eo.backend = o->backend;
    eo.request_rows = o->request_rows;
    eo.max_requests = o->max_requests;
    eo.max_len = o->max_len;
    eo.kv_blocks = o->kv_blocks;
    eo.gpu_memory_utilization = o->gpu_memory_utilization;
    eo.threads = o->threads;
    eo.world = o->world;
    eo.moe_tp = o->moe_tp;
    eo.devices = o->devices;
    eo.comm = o->comm;
    eo.no_prefix_cache = o->no_prefix_cache;
    if (sparkmono_engine_create(m, &eo, &g)) {
        sm_errf(e, "serve: %s", sparkmono_errmsg());
        goto out;
    }
    s.api.name = name;
    s.api.tok = tok;
    s.api.vocab = info.vocab_size;
    s.api.max_len = o->max_len;
    sm_struct_cache_init(&cons, m);
    s.api.cons = &cons;
    /* a request's choices are queued all at once: no more than the slots and the queue hold */
    s.api.max_choices = o->max_requests + o->queue;
    if (s.api.max_choices > SM_API_MAX_CHOICES) s.api.max_choices = SM_API_MAX_CHOICES;
    s.created = (long)time(NULL);
    if (sm_sched_start(&s.sched, g, o->max_requests, o->queue, e)) goto out;
    if (sm_http_start(&s, e)) goto stop_sched;
    const char *v6 = strchr(o->host, ':') ? "[" : "";
    printf("serve: listening on http://%s%s%s:%d/v1 (model '%s', %s, tokenizer %s; %d requests a step of %d rows each, "
           "queue %d; %d connections, request timeout %d s, idle timeout %d s; chat template %s; prefix cache %s)\n",
           v6, o->host, *v6 ? "]" : "", s.port, name, o->backend, tok ? "yes" : "none (token ids only)",
           o->max_requests, o->request_rows, o->queue, s.max_conns, o->request_timeout_s, o->idle_timeout_s,
           s.chat.t ? s.chat.source : "none", o->no_prefix_cache ? "off" : "on");
    fflush(stdout);
    if (!o->api_key && !sm_misc_loopback(o->host))
        fprintf(stderr, "serve: warning: listening on %s without an API key (--api-key or SPARKMONO_API_KEY): anyone who "
                "can reach port %d can use this server\n", o->host, s.port);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {}
    /* drain: no new connections, no new requests; the running ones may finish */
    __atomic_store_n(&s.closing, 1, __ATOMIC_RELAXED);
    sm_http_quiesce(&s);
    sm_sched_close(&s.sched);
    fprintf(stderr, "serve: %s: finishing the requests in flight (at most %d s; signal again to cancel them)\n",
            strsignal(sig), o->drain_s);
    struct timespec tick = {0, 100 * 1000000L};
    int waited_ms = 0, again = 0;
    while (!again && waited_ms < o->drain_s * 1000 &&
           !(sm_sched_wait_idle(&s.sched, 0) && __atomic_load_n(&s.jobs, __ATOMIC_RELAXED) == 0)) {
        again = sigtimedwait(&sigs, NULL, &tick) > 0;
        waited_ms += 100;
    }
    sm_sched_cancel_all(&s.sched, "the server is shutting down");
    /* the cancelled ones end their answers; give their connections a moment to write them */
    for (int i = 0; i < 50 && __atomic_load_n(&s.jobs, __ATOMIC_RELAXED) > 0; i++) sleep_ms(20);
    sm_http_stop(&s);
    fprintf(stderr, "serve: stopped (%lld tokens in %lld verify steps)\n", s.sched.tokens, s.sched.steps);
    rc = 0;
stop_sched:
    sm_sched_stop(&s.sched);
out:
    sparkmono_engine_destroy(g);
    if (tok) sm_tokenizer_free(tok);
    if (s.chat.special) sm_chat_free(&s.chat);
    sm_struct_cache_free(&cons); /* its constraints read the model's vocabulary */
    sparkmono_model_close(m);
    return rc;
}
