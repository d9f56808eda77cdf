/* serve_http.h: the HTTP side of `sparkmono serve` on libmicrohttpd: routes, body limits,
 * JSON answers, server-sent event streams, client disconnects, connection limits and timeouts.
 *
 * Event-driven: SM_HTTP_THREADS polling threads (libmicrohttpd's thread pool over epoll, or
 * poll where there is no epoll) serve every connection, so an open connection costs a socket
 * and a few KiB, not a thread.  A completion never blocks a polling thread: once submitted, its
 * connection is suspended ("parked") until the engine thread's notify callback (serve_sched.h)
 * says its request has news; the connection is then resumed and turns the new ids into text
 * and writes them out (all at once, or as SSE chunks).  libmicrohttpd does not watch a
 * suspended socket, so a watch thread polls the parked sockets for a hang-up every
 * SM_HTTP_POLL_MS (a client that goes away mid-stream or while queued cancels its request at
 * once) and enforces the deadlines of the connections (below).  We rejected a thread per
 * connection (the former design): a few hundred slow clients used up the connection limit
 * and locked everyone out, and thousands of threads cost far more than thousands of sockets.
 *
 * Limits and timeouts (each is one rule, enforced in one place):
 *  - a connection with no request under way (new, or kept alive after an answer) is closed
 *    after idle_timeout seconds (the watch thread; no answer: there is no request);
 *  - a request must be received whole (headers and body) within request_timeout seconds of
 *    its request line, or it is answered 408 and its connection closed (the watch thread);
 *  - an answer is never cut for its length: a parked connection has no timeout, and one that
 *    is writing is cut only when the client takes none of its bytes for SM_HTTP_SEND_TIMEOUT_S
 *    (libmicrohttpd's inactivity timeout);
 *  - past max_connections open connections, a new connection's requests are answered 503
 *    (Retry-After, Connection: close) except /health, which is answered; past
 *    SM_HTTP_SPARE_CONNECTIONS more, new connections wait in the kernel's accept queue;
 *  - a full request queue is a 503 with Retry-After; /health never waits for the queue;
 *  - a first line libmicrohttpd cannot split into a method and a target (no space, or no
 *    method) is answered 400 by the accept front (serve_front.h), which owns the listening
 *    socket and hands every other connection to libmicrohttpd.
 */
#ifndef SM_SERVE_HTTP_H
#define SM_SERVE_HTTP_H
#include <pthread.h>
#include "serve/serve_opts.h"
#include "serve/serve_api.h"
#include "serve/serve_metrics.h"
#include "serve/serve_chat.h"
#include "serve/serve_sched.h"
#include "serve/serve_front.h"

#define SM_HTTP_POLL_MS 50            /* the watch thread's tick: a hang-up or deadline is seen within it */
#define SM_HTTP_THREADS 4             /* libmicrohttpd's polling threads */
#define SM_HTTP_SPARE_CONNECTIONS 64  /* connections past max_connections that are still answered (503, /health) */
#define SM_HTTP_SEND_TIMEOUT_S 60     /* an answer the client takes no byte of for this long is cut */
#define SM_HTTP_FD_RESERVE 128        /* open files besides the connections (model, epoll, pipes) */
#define SM_HTTP_PEEK 4096             /* a first line's first space must come within its first this many bytes */
/* bytes of a connection's buffers (request line, headers, body pieces, answer head); above
 * 32 KiB libmicrohttpd maps each connection's buffers on their own, so a closed connection's
 * memory goes back to the system instead of into the heap, where a thousand of them fragment it */
#define SM_HTTP_CONN_MEMORY (64 << 10)

struct MHD_Daemon;
struct sm_job;

typedef struct sm_server {
    const sm_serve_opts *o;
    sm_api_model api;          /* name, tokenizer, vocabulary, max_len */
    sm_sched sched;            /* the engine thread */
    long created;              /* unix time the server started ("created" fields) */
    sm_chat_tmpl chat;         /* the model directory's chat template (chat.t NULL: none) */
    struct MHD_Daemon *d;
    int port;                  /* bound port */
    int max_conns;             /* connections answered normally: --max-connections, or fewer when
                                  the open-file limit is lower */
    unsigned long long serial; /* requests seen (atomic) */
    int closing;               /* SIGTERM seen: /health answers 503 (atomic) */
    int jobs;                  /* completions not yet fully answered (atomic) */
    sm_metrics met;            /* GET /metrics: the HTTP side's counters (atomic) */
    /* the HTTP side's own state; the lock is taken after the scheduler's, never before it */
    pthread_mutex_t mu;        /* guards the fields below and every peer's and job's parking fields */
    struct peer *peers;        /* open connections (a list), from their accept */
    int npeers;                /* open connections */
    sm_front front;            /* the accept front: the listening socket, the connections it holds */
    struct sm_job *parked;     /* completions whose connection is suspended (a list) */
    int stopping;              /* sm_http_stop: nothing parks any more, the watch thread ends */
    pthread_t watch;           /* the watch thread: hang-ups of parked connections, deadlines */
    int watching;              /* the watch thread runs */
    char r408[512];            /* the whole 408 answer, written by the watch thread */
    int r408_len;
} sm_server;

/* Raise the open-file limit, bind host:port and start serving s. */
int sm_http_start(sm_server *s, sm_err *e);
/* Stop accepting connections (the listening socket is closed, on the front's thread); open ones go on. */
void sm_http_quiesce(sm_server *s);
/* Close every connection and stop (the front, polling and watch threads are joined). */
void sm_http_stop(sm_server *s);

#endif
