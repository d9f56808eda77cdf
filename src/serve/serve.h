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
#include "base/err.h"
#include "serve/serve_opts.h"

/* Serve until SIGTERM / SIGINT.  0 after a clean shutdown; -1 with one line in e when the
 * model, engine or socket cannot be set up. */
int sm_serve_run(const sm_serve_opts *o, sm_err *e);

#endif
