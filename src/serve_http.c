/* serve_http.c: routes, bodies, answers and SSE streams of `sparkmono serve` on
 * libmicrohttpd (see serve_http.h).
 *
 * Routes: GET /health, GET /v1/models, GET /v1/models/NAME, POST /v1/completions (JSON or, with
 * "stream": true, server-sent events "data: {chunk}" ending "data: [DONE]"), POST
 * /v1/chat/completions (a 400 naming why there is no chat).  A body longer than max_body is
 * a 413: at once when Content-Length says so, else once it has been read up to the limit
 * (the rest is discarded; a client that keeps sending far past it is disconnected).  A
 * "job" is one completion on its way out: the ids received so far, the text decoder and the
 * bytes not yet written; the plain answer and the stream share it.  We rejected writing the
 * stream from the engine thread: a slow client would stall every request's next step.
 */
#include "serve_http.h"
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DISCARD_LIMIT ((size_t)16 << 20) /* bytes past max_body read and dropped before hanging up */

enum route { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT };

/* One HTTP request (libmicrohttpd's per-request pointer). */
typedef struct conn {
    int route;                 /* enum route */
    sm_sbuf body;              /* the request body read so far */
    size_t seen;               /* body bytes received, kept or not */
    int too_big;               /* the body passed max_body */
} conn;

/* One completion on its way to the client. */
typedef struct job {
    sm_server *s;
    sm_sreq *r;                /* the scheduler's request (one reference held here) */
    sm_api_req req;            /* parsed request: stop strings, stream flags (prompt moved to r) */
    int prompt_len;            /* tokens of the prompt */
    int fd;                    /* the client's socket, polled for a hang-up */
    char id[48];               /* "cmpl-..." */
    int *ids;                  /* [max_tokens] ids received */
    int nids;                  /* ids received */
    int sent_ids;              /* ids already put in a chunk */
    sm_detok dt;               /* ids -> text */
    sm_sbuf text;              /* text not yet put in a chunk (all of it for a plain answer) */
    const char *finish;        /* "stop" / "length" once ended normally */
    char err[256];             /* the reason once ended by a failure or cancellation */
    int err_status;            /* HTTP status of that reason (500 or 503) */
    int ended;                 /* the request is over (finish or err set) */
    sm_sbuf out;               /* stream bytes not yet handed to libmicrohttpd */
    size_t off;                /* of out, already handed */
    int closed;                /* stream: [DONE] written */
} job;

/* ---- answers ---------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *mc, unsigned status, char *json) {
    static const char OOM[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    struct MHD_Response *resp =
        json ? MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof OOM - 1, (void *)OOM, MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(json);
        return MHD_NO;
    }
    if (!json) status = 500;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(mc, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* OpenAI's error type of an HTTP status. */
static const char *error_type(unsigned status) {
    if (status == 404) return "not_found_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

static enum MHD_Result reply_error(struct MHD_Connection *mc, unsigned status, const char *msg, const char *param,
                                   const char *code) {
    return reply(mc, status, sm_api_error(msg, error_type(status), param, code));
}

/* ---- jobs ------------------------------------------------------------------------------- */

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void job_free(job *j) {
    if (!j) return;
    if (j->r) {
        if (!j->ended) sm_sched_cancel(&j->s->sched, j->r); /* the client left first */
        sm_sreq_release(&j->s->sched, j->r);
        if (!j->s->o->quiet)
            fprintf(stderr, "serve: %s: prompt %d tokens, %d generated, %s\n", j->id, j->prompt_len, j->nids,
                    j->finish ? j->finish : j->err[0] ? j->err : "client disconnected");
    }
    sm_detok_free(&j->dt);
    sm_api_req_free(&j->req);
    sm_sbuf_free(&j->text);
    sm_sbuf_free(&j->out);
    free(j->ids);
    __atomic_sub_fetch(&j->s->jobs, 1, __ATOMIC_RELAXED);
    free(j);
}

/* Wait (at most SM_HTTP_POLL_MS) for news of j's request: new ids and their text go to
 * j->ids and j->text.  1 when the request is over (j->finish or j->err set), 0 when it goes
 * on, -1 when the client hung up. */
static int job_pump(job *j) {
    int done;
    int k = sm_sched_wait(&j->s->sched, j->r, j->nids, j->ids + j->nids, j->req.max_tokens - j->nids, SM_HTTP_POLL_MS,
                          &done);
    j->nids += k;
    if (k == 0 && done == SM_SREQ_RUNNING) return client_gone(j->fd) ? -1 : 0;
    sm_err e = {{0}};
    int st = sm_detok_push(&j->dt, j->ids, j->nids, done != SM_SREQ_RUNNING, &j->text, &e);
    j->ended = 1;
    if (st < 0) {
        sm_sched_cancel(&j->s->sched, j->r);
        snprintf(j->err, sizeof j->err, "%.255s", e.msg);
        j->err_status = 500;
    } else if (st == 1) { /* a stop string: the text ends before it, generation stops */
        sm_sched_cancel(&j->s->sched, j->r);
        j->finish = "stop";
    } else if (done == SM_SREQ_EOS) {
        j->finish = "stop";
    } else if (done == SM_SREQ_LENGTH) {
        j->finish = "length";
    } else if (done == SM_SREQ_RUNNING) {
        j->ended = 0;
    } else { /* failed in the engine, or cancelled by a shutdown */
        snprintf(j->err, sizeof j->err, "%s", j->r->err[0] ? j->r->err : "request failed");
        j->err_status = done == SM_SREQ_CANCELLED ? 503 : 500;
    }
    return j->ended;
}

/* Append one SSE event "data: <json>\n\n" (json freed) to j->out. */
static int sse(job *j, char *json) {
    int rc = !json || sm_sbuf_str(&j->out, "data: ") || sm_sbuf_str(&j->out, json) || sm_sbuf_str(&j->out, "\n\n");
    free(json);
    return rc ? -1 : 0;
}

/* The stream's reader: blocks (in SM_HTTP_POLL_MS slices) until it has bytes to send. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    const sm_server *s = j->s;
    (void)pos;
    while (j->off == j->out.n) {
        if (j->closed) return MHD_CONTENT_READER_END_OF_STREAM;
        j->out.n = j->off = 0;
        int st = job_pump(j);
        if (st < 0) return MHD_CONTENT_READER_END_WITH_ERROR; /* the free callback cancels */
        int rc = 0;
        if (j->text.n || j->nids > j->sent_ids || (st == 1 && j->finish)) {
            rc |= sse(j, sm_api_chunk(j->id, s->created, s->api.name, j->text.p, j->text.n, j->ids + j->sent_ids,
                                      j->nids - j->sent_ids, st == 1 ? j->finish : NULL));
            j->text.n = 0;
            j->sent_ids = j->nids;
        }
        if (st == 1) {
            if (j->err[0]) rc |= sse(j, sm_api_error(j->err, error_type((unsigned)j->err_status), NULL, NULL));
            if (j->req.include_usage) rc |= sse(j, sm_api_usage_chunk(j->id, s->created, s->api.name, j->prompt_len, j->nids));
            rc |= sm_sbuf_str(&j->out, "data: [DONE]\n\n");
            j->closed = 1;
        }
        if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = j->out.n - j->off < max ? j->out.n - j->off : max;
    memcpy(buf, j->out.p + j->off, n);
    j->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { job_free(cls); }

/* POST /v1/completions with the whole body in c. */
static enum MHD_Result completions(sm_server *s, struct MHD_Connection *mc, conn *c) {
    job *j = calloc(1, sizeof *j);
    if (!j) return reply(mc, 500, NULL);
    j->s = s;
    __atomic_add_fetch(&s->jobs, 1, __ATOMIC_RELAXED);
    int status = 400;
    char param[SM_API_PARAM];
    sm_err e = {{0}};
    if (sm_api_parse_completion(c->body.p ? c->body.p : "", c->body.n, &s->api, &j->req, &status, param, &e)) {
        job_free(j);
        return reply_error(mc, (unsigned)status, e.msg, param, status == 404 ? "model_not_found" : NULL);
    }
    unsigned long long serial = __atomic_add_fetch(&s->serial, 1, __ATOMIC_RELAXED);
    snprintf(j->id, sizeof j->id, "cmpl-%lx%06llx", (unsigned long)s->created, serial);
    if (!j->req.has_seed && j->req.samp.temperature > 0) /* a seed of its own: distinct draws per request */
        j->req.samp.seed = (unsigned long long)s->created * 0x9E3779B97F4A7C15ull ^ serial;
    j->prompt_len = j->req.n;
    j->ids = malloc((size_t)j->req.max_tokens * sizeof(int));
    j->r = j->ids ? sm_sreq_new(j->req.prompt, j->req.n, j->req.max_tokens, &j->req.samp) : NULL;
    if (!j->r) {
        job_free(j);
        return reply(mc, 500, NULL);
    }
    j->r->serial = serial;
    j->req.prompt = NULL; /* now the request's */
    j->dt.tok = s->api.tok;
    for (int i = 0; i < j->req.nstop; i++) j->dt.stop[i] = j->req.stop[i];
    j->dt.nstop = j->req.nstop;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    int rc = sm_sched_submit(&s->sched, j->r);
    if (rc) {
        char msg[160];
        if (rc == SM_SCHED_FULL)
            snprintf(msg, sizeof msg, "the server is busy (%d requests running, %d queued); retry later",
                     s->o->max_requests, s->o->queue);
        else
            snprintf(msg, sizeof msg, "the server is shutting down");
        j->ended = 1; /* never ran */
        snprintf(j->err, sizeof j->err, "%s", msg);
        job_free(j);
        return reply_error(mc, 503, msg, NULL, rc == SM_SCHED_FULL ? "overloaded" : "shutting_down");
    }
    if (j->req.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
        if (!resp) {
            job_free(j);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result qr = MHD_queue_response(mc, 200, resp);
        MHD_destroy_response(resp); /* libmicrohttpd holds it; stream_free runs when it is done */
        return qr;
    }
    /* a plain answer: wait for the end (or the client's hang-up) on this connection's thread */
    int st;
    while ((st = job_pump(j)) == 0) {}
    if (st < 0) {
        job_free(j); /* cancels */
        return MHD_NO;
    }
    enum MHD_Result qr;
    if (j->err[0]) qr = reply_error(mc, (unsigned)j->err_status, j->err, NULL, NULL);
    else qr = reply(mc, 200, sm_api_completion(j->id, s->created, s->api.name, j->text.p, j->text.n, j->ids, j->nids,
                                               j->finish, j->prompt_len));
    job_free(j);
    return qr;
}

/* ---- routing ---------------------------------------------------------------------------- */

static int route_of(const char *url) {
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11)) return R_MODEL;
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    return R_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    sm_server *s = cls;
    conn *c = *con_cls;
    (void)version;
    if (!c) { /* headers read: route and check what can be checked before the body */
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        *con_cls = c;
        c->route = route_of(url);
        int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        int wants_post = c->route == R_COMPLETIONS || c->route == R_CHAT;
        char msg[256];
        if (c->route == R_NONE) {
            snprintf(msg, sizeof msg, "no route %.16s %.160s (this server has GET /health, GET /v1/models, POST /v1/completions)",
                     method, url);
            return reply_error(mc, 404, msg, NULL, "not_found");
        }
        if (wants_post ? !post : !get) {
            snprintf(msg, sizeof msg, "%.160s takes %s, not %.16s", url, wants_post ? "POST" : "GET", method);
            return reply_error(mc, 405, msg, NULL, "method_not_allowed");
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o->max_body) {
            snprintf(msg, sizeof msg, "the request body has %.24s bytes; this server takes at most %zu", cl, s->o->max_body);
            return reply_error(mc, 413, msg, NULL, "request_too_large");
        }
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        size_t n = *upload_size;
        *upload_size = 0;
        c->seen += n;
        if (c->too_big || c->body.n + n > s->o->max_body) {
            c->too_big = 1;
            sm_sbuf_free(&c->body);
            return c->seen > s->o->max_body + DISCARD_LIMIT ? MHD_NO : MHD_YES;
        }
        return sm_sbuf_add(&c->body, upload, n) ? MHD_NO : MHD_YES;
    }
    /* the whole request is in */
    if (c->too_big) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is longer than %zu bytes", s->o->max_body);
        return reply_error(mc, 413, msg, NULL, "request_too_large");
    }
    switch (c->route) {
    case R_HEALTH: {
        int live, queued, closing = __atomic_load_n(&s->closing, __ATOMIC_RELAXED);
        long long tokens, steps;
        sm_sched_counts(&s->sched, &live, &queued, &tokens, &steps);
        char b[256];
        snprintf(b, sizeof b, "{\"status\":\"%s\",\"running\":%d,\"queued\":%d,\"tokens\":%lld,\"steps\":%lld}",
                 closing ? "shutting down" : "ok", live, queued, tokens, steps);
        return reply(mc, closing ? 503 : 200, strdup(b));
    }
    case R_MODELS:
        return reply(mc, 200, sm_api_models(s->api.name, s->created, s->api.max_len, 1));
    case R_MODEL:
        if (strcmp(url + 11, s->api.name)) {
            char msg[400];
            snprintf(msg, sizeof msg, "The model '%.200s' does not exist (this server serves '%s')", url + 11, s->api.name);
            return reply_error(mc, 404, msg, "model", "model_not_found");
        }
        return reply(mc, 200, sm_api_models(s->api.name, s->created, s->api.max_len, 0));
    case R_CHAT:
        return reply_error(mc, 400,
                           s->chat_template
                               ? "this model's chat template needs a template engine, which this server does not have; "
                                 "format the conversation yourself and use /v1/completions"
                               : "this model ships no chat template; use /v1/completions with a prompt",
                           NULL, "chat_template_unavailable");
    default:
        return completions(s, mc, c);
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn *c = *con_cls;
    (void)cls;
    (void)mc;
    (void)toe;
    if (!c) return;
    sm_sbuf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

/* libmicrohttpd's own messages: kept while starting (the caller's error line quotes the last
 * one), printed afterwards. */
static char g_last_log[256];
static int g_log_live;
static void on_log(void *cls, const char *fmt, va_list ap) {
    const sm_server *s = cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '.')) line[--n] = 0;
    if (!g_log_live) memcpy(g_last_log, line, sizeof line);
    else if (!s->o->quiet) fprintf(stderr, "serve: http: %s\n", line);
}

int sm_http_start(sm_server *s, sm_err *e) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->o->port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(s->o->host, port, &hints, &ai);
    if (rc) return sm_errf(e, "serve: --host '%s': %s", s->o->host, gai_strerror(rc));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* every running and queued request, plus room for health checks and model lists */
    unsigned limit = (unsigned)(s->o->max_requests + s->o->queue + 64);
    g_last_log[0] = 0;
    s->d = MHD_start_daemon(flags, (uint16_t)s->o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_EXTERNAL_LOGGER, on_log, s,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d)
        return sm_errf(e, "serve: cannot listen on %s port %d: %s", s->o->host, s->o->port,
                       g_last_log[0] ? g_last_log : "libmicrohttpd refused to start");
    g_log_live = 1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->o->port;
    return 0;
}

void sm_http_quiesce(sm_server *s) {
    if (!s->d) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void sm_http_stop(sm_server *s) {
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
}
