/* serve.h: `sparkmono serve`, an OpenAI-compatible HTTP server over the engine.
 *
 * sm_serve_run opens the model (and its tokenizer.json when the directory has one), creates
 * one engine, starts the engine thread (serve_sched.h) and the HTTP server (serve_http.h),
 * and blocks until SIGTERM or SIGINT: then it stops accepting connections, lets the requests
 * in flight finish for at most drain_s seconds (a second signal cuts that short), cancels what
 * is left and returns 0.  The server is split by job: serve_http.c speaks HTTP and
 * server-sent events, serve_api.c the OpenAI JSON, serve_text.c turns ids into text,
 * serve_sched.c batches the requests on the engine.  We rejected a server process per
 * request or a request loop that steps the engine from connection threads: the engine is
 * used by one thread at a time, and one verify step over all live requests is the point.
 */
#ifndef SM_SERVE_H
#define SM_SERVE_H
#include <stddef.h>
#include "err.h"

typedef struct sm_serve_opts {
    const char *model_dir;   /* checkpoint directory (tokenizer.json optional) */
    const char *model_name;  /* the id clients name in "model"; NULL: the directory's basename */
    const char *host;        /* address to bind ("127.0.0.1", "0.0.0.0", "::1") */
    int port;                /* 0: any free port (the one bound is printed) */
    const char *backend;     /* "cpu" or "cuda" */
    int request_rows;        /* R: rows per request in a verify step (1 = no speculation) */
    int max_requests;        /* requests batched in one verify step */
    int queue;               /* requests waiting beyond those; one more is a 503 */
    int max_len;             /* prompt + max_tokens of a request */
    size_t max_body;         /* bytes of a request body; more is a 413 */
    int max_connections;     /* open connections served; past it requests are a 503 (/health answered) */
    int request_timeout_s;   /* seconds to receive a whole request from its request line; then a 408 */
    int idle_timeout_s;      /* seconds a connection may stay open without a request under way */
    int threads;             /* CPU worker threads (0: online cores) */
    int world, moe_tp;       /* tensor + expert parallel ranks, MoE split */
    const char *devices;     /* cuda with world > 1: "0,1,.." the device of each rank, or NULL */
    const char *comm;        /* cuda with world > 1: "peer" or "nccl" (NULL: peer) */
    int online_mxfp4;        /* round BF16 experts to MXFP4 at load */
    int drain_s;             /* seconds in-flight requests may take after SIGTERM */
    int quiet;               /* no log line per request */
} sm_serve_opts;

/* Serve until SIGTERM / SIGINT.  0 after a clean shutdown; -1 with one line in e when the
 * model, engine or socket cannot be set up. */
int sm_serve_run(const sm_serve_opts *o, sm_err *e);

#endif
