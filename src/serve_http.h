/* serve_http.h: the HTTP side of `sparkmono serve` on libmicrohttpd: routes, body limits,
 * JSON answers, server-sent event streams and client disconnects.
 *
 * One thread per connection (libmicrohttpd's thread-per-connection mode): a connection thread
 * parses its request, submits it to the engine thread and then waits for ids, turning them
 * into text and writing them out (all at once, or as SSE chunks).  While waiting it checks
 * the socket for a hang-up every SM_HTTP_POLL_MS, so a client that goes away mid-stream (or
 * while queued) cancels its request at once.  We rejected libmicrohttpd's single polling
 * thread with suspended connections: the waits would need a wake-up pipe per step and the
 * text work would run on the thread that polls every socket; a thread per connection costs
 * a stack per client, and the connection limit bounds that.
 */
#ifndef SM_SERVE_HTTP_H
#define SM_SERVE_HTTP_H
#include "serve.h"
#include "serve_api.h"
#include "serve_sched.h"

#define SM_HTTP_POLL_MS 50 /* longest wait before a hang-up is noticed */

struct MHD_Daemon;

typedef struct sm_server {
    const sm_serve_opts *o;
    sm_api_model api;          /* name, tokenizer, vocabulary, max_len */
    sm_sched sched;            /* the engine thread */
    long created;              /* unix time the server started ("created" fields) */
    int chat_template;         /* the model directory ships a chat template (tokenizer_config.json) */
    struct MHD_Daemon *d;
    int port;                  /* bound port */
    unsigned long long serial; /* requests seen (atomic) */
    int closing;               /* SIGTERM seen: /health answers 503 (atomic) */
    int jobs;                  /* completions not yet fully answered (atomic) */
} sm_server;

/* Bind host:port and start serving s. */
int sm_http_start(sm_server *s, sm_err *e);
/* Stop accepting connections (the listening socket is closed); open ones go on. */
void sm_http_quiesce(sm_server *s);
/* Close every connection and stop (their threads are joined). */
void sm_http_stop(sm_server *s);

#endif
