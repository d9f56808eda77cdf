/* serve_http.c: routes, bodies, answers, SSE streams, parking and deadlines of `sparkmono
 * serve` on libmicrohttpd (see serve_http.h).
 *
 * Routes: GET /health, GET /v1/models, GET /v1/models/NAME, POST /v1/completions (JSON or, with
 * "stream": true, server-sent events "data: {chunk}" ending "data: [DONE]"), POST
 * /v1/chat/completions (the same path: serve_chat.c turns the messages into the prompt; the
 * answers are chat-shaped, a stream's first chunk carries the role); POST /tokenize, POST
 * /detokenize, GET /version (serve_misc.c) and GET /metrics (serve_metrics.c).  With an API key,
 * a /v1/ request without it is a 401 before it is routed.  A body longer than max_body is
 * a 413: at once when Content-Length says so, else once the whole body has been read (past
 * the limit it is dropped as it comes; a client that sends for longer than --request-timeout
 * is cut with a 408, as any slow request).  A
 * "job" is one completion request on its way out, its choices and the bytes not yet written
 * (serve_job.c); the plain answer and the stream share it, and here it is parked and resumed.
 * A "peer" is one open connection: its socket and its deadline, seen by the watch thread; the
 * accept front (serve_front.c) makes it at the accept and holds it until its first line can be
 * judged, and libmicrohttpd's STARTED notice adopts it (on_connection).  We
 * rejected writing the stream from the engine thread: a slow client would stall every
 * request's next step.
 *
 * Locks: the scheduler's mutex, then s->mu, then libmicrohttpd's own.  The engine thread calls
 * on_news holding the scheduler's mutex; nothing here calls the scheduler holding s->mu, and
 * libmicrohttpd calls none of our callbacks holding its lock.
 */
#include "serve/serve_http.h"
#include "serve/serve_job.h"
#include "serve/serve_misc.h"
#include "serve/serve_limits.h"
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum route { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT,
             R_TOKENIZE, R_DETOKENIZE, R_VERSION, R_METRICS /* serve_misc.c, serve_metrics.c */ };

/* One HTTP request (libmicrohttpd's per-request pointer, made by on_uri). */
typedef struct conn {
    int headers;               /* on_request has seen its headers */
    const char *target;        /* the request target as on_uri saw it, raw (libmicrohttpd then splits
                                  and unescapes it in place, in its read buffer) */
    size_t target_len;         /* its length then, to its first NUL */
    int nul;                   /* its path holds "%00": a NUL once unescaped */
    int route;                 /* enum route */
    sm_buf body;              /* the request body read so far */
    size_t seen;               /* body bytes received, kept or not */
    int too_big;               /* the body passed max_body */
    sm_job *job;               /* a plain completion under way (its connection parks between news) */
} conn;

static double now_s(void) { return sm_sched_now(); }

/* The peer of a connection (NULL when its allocation failed). */
static peer *peer_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The request on mc has its answer on the way: no deadline until it is done.  -1 when the
 * watch thread cut the connection first (answer nothing). */
static int answering(sm_server *s, struct MHD_Connection *mc) {
    peer *p = peer_of(mc);
    if (!p) return 0;
    pthread_mutex_lock(&s->mu);
    int cut = p->cut;
    p->deadline = 0;
    pthread_mutex_unlock(&s->mu);
    return cut ? -1 : 0;
}

/* ---- answers ---------------------------------------------------------------------------- */

/* Queue status + body of type ctype (freed; NULL: out of memory, a 500).  A 503 says when to
 * retry; a connection past the limit is closed after its answer. */
/* allow: the methods a 405's route takes (its Allow header, RFC 9110 section 15.5.6), else NULL. */
static enum MHD_Result reply_as(sm_server *s, struct MHD_Connection *mc, unsigned status, char *json, const char *ctype,
                                const char *allow) {
    static const char OOM[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    struct MHD_Response *resp =
        json ? MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof OOM - 1, (void *)OOM, MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(json);
        return MHD_NO;
    }
    if (!json) status = 500;
    const peer *p = peer_of(mc);
    if (answering(s, mc)) {
        MHD_destroy_response(resp);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", json ? ctype : "application/json");
    sm_metrics_status(&s->met, status);
    if (status == 503 && !__atomic_load_n(&s->closing, __ATOMIC_RELAXED)) MHD_add_response_header(resp, "Retry-After", "1");
    if (p && p->over) MHD_add_response_header(resp, "Connection", "close");
    if (allow) MHD_add_response_header(resp, "Allow", allow);
    enum MHD_Result rc = MHD_queue_response(mc, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* MHD_get_connection_values iterator: whether the Content-Length headers disagree. */
typedef struct cl_seen {
    const char *first; /* the first Content-Length value, NULL before it */
    int conflict;
} cl_seen;
static enum MHD_Result cl_check(void *arg, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    cl_seen *c = arg;
    if (!key || strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) return MHD_YES;
    if (!c->first) c->first = value ? value : "";
    else if (strcmp(c->first, value ? value : "")) c->conflict = 1;
    return MHD_YES;
}

static enum MHD_Result reply(sm_server *s, struct MHD_Connection *mc, unsigned status, char *json) {
    return reply_as(s, mc, status, json, "application/json", NULL);
}

static enum MHD_Result reply_error(sm_server *s, struct MHD_Connection *mc, unsigned status, const char *msg,
                                   const char *param, const char *code) {
    return reply(s, mc, status, sm_api_error(msg, sm_api_error_type(status), param, code));
}

/* ---- parking ---------------------------------------------------------------------------- */

/* Take j out of s->parked and resume its connection.  Under s->mu. */
static void unpark_locked(sm_server *s, sm_job *j) {
    if (!j->parked) return;
    if (j->pprev) j->pprev->pnext = j->pnext;
    else s->parked = j->pnext;
    if (j->pnext) j->pnext->pprev = j->pprev;
    j->pprev = j->pnext = NULL;
    j->parked = 0;
    MHD_resume_connection(j->mc);
}

/* The scheduler's notify callback: j's request has new ids or ended.  Engine thread (or the
 * shutdown), scheduler mutex held. */
static void on_news(void *arg) {
    sm_job *j = arg;
    sm_server *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (j->parked) unpark_locked(s, j);
    else j->news = 1;
    pthread_mutex_unlock(&s->mu);
}

/* Suspend j's connection until news (called from a libmicrohttpd callback of it).  1 parked:
 * return and wait; 0 news came meanwhile: look again; -1 the server is stopping: end. */
static int park(sm_job *j) {
    sm_server *s = j->s;
    int rc = 1;
    pthread_mutex_lock(&s->mu);
    if (j->news) {
        j->news = 0;
        rc = 0;
    } else if (s->stopping) {
        rc = -1;
    } else {
        j->pnext = s->parked;
        if (s->parked) s->parked->pprev = j;
        s->parked = j;
        j->parked = 1;
        MHD_suspend_connection(j->mc);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- jobs ------------------------------------------------------------------------------- */

/* The stream's reader: bytes when it has some, else it parks the connection and returns 0
 * (libmicrohttpd calls it again once on_news resumes the connection). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    sm_job *j = cls;
    (void)pos;
    while (j->off == j->out.n) {
        if (j->closed) return MHD_CONTENT_READER_END_OF_STREAM;
        j->out.n = j->off = 0;
        int st = sm_job_pump(j);
        if (st < 0) return MHD_CONTENT_READER_END_WITH_ERROR; /* the free callback cancels */
        if (sm_job_stream(j, st)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (j->out.n == 0) { /* nothing new: wait for news */
            int p = park(j);
            if (p > 0) return 0;
            if (p < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = j->out.n - j->off < max ? j->out.n - j->off : max;
    memcpy(buf, j->out.p + j->off, n);
    j->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { sm_job_free(cls); }

/* A plain completion under way on c: answer once its request is over, else park.  Called
 * when the request is in and again each time the connection is resumed. */
static enum MHD_Result plain_next(sm_server *s, struct MHD_Connection *mc, conn *c) {
    sm_job *j = c->job;
    int st;
    while ((st = sm_job_pump(j)) == 0) {
        int p = park(j);
        if (p > 0) return MHD_YES;
        if (p < 0) return MHD_NO;
    }
    if (st < 0) return MHD_NO; /* hung up: on_completed frees the job, which cancels */
    enum MHD_Result qr = j->err[0] ? reply_error(s, mc, (unsigned)j->err_status, j->err, NULL, NULL)
                                   : reply(s, mc, 200, sm_job_answer(j));
    c->job = NULL;
    sm_job_free(j);
    return qr;
}

/* POST /v1/completions or /v1/chat/completions with the whole body in c. */
static enum MHD_Result completions(sm_server *s, struct MHD_Connection *mc, conn *c) {
    int status = 400;
    char param[SM_API_PARAM];
    sm_err e = {{0}};
    if (c->route == R_CHAT && !s->chat.t)
        return reply_error(s, mc, 400, "this model ships no chat template (tokenizer_config.json \"chat_template\" or "
                           "chat_template.jinja); use /v1/completions with a prompt", NULL, "chat_template_unavailable");
    sm_job *j = sm_job_new(s, c->route == R_CHAT, c->body.p, c->body.n, on_news, &status, param, &e);
    if (!j) return reply_error(s, mc, (unsigned)status, e.msg, param, status == 404 ? "model_not_found" : NULL);
    j->mc = mc;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    int rc = sm_job_submit(j); /* all choices or none */
    if (rc) {
        enum MHD_Result qr = reply_error(s, mc, 503, j->err, NULL, rc == SM_SCHED_FULL ? "overloaded" : "shutting_down");
        sm_job_free(j);
        return qr;
    }
    if (j->req.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
        if (!resp) {
            sm_job_free(j);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result qr = MHD_queue_response(mc, 200, resp);
        sm_metrics_status(&s->met, 200);
        MHD_destroy_response(resp); /* libmicrohttpd holds it; stream_free runs when it is done */
        return qr;
    }
    c->job = j; /* a plain answer: the connection parks until the request is over */
    return plain_next(s, mc, c);
}

/* ---- routing ---------------------------------------------------------------------------- */

static int route_of(const char *url) {
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11)) return R_MODEL;
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return R_DETOKENIZE;
    if (!strcmp(url, "/version")) return R_VERSION;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    return R_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    sm_server *s = cls;
    conn *c = *con_cls;
    if (!c || !c->headers) { /* headers read: route and check what can be checked before the body */
        if (!c && !(c = calloc(1, sizeof *c))) return MHD_NO;
        *con_cls = c;
        c->headers = 1;
        c->route = route_of(url);
        int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        int wants_post = c->route == R_COMPLETIONS || c->route == R_CHAT || c->route == R_TOKENIZE || c->route == R_DETOKENIZE;
        char msg[400];
        const peer *p = peer_of(mc);
        /* a NUL in the path: libmicrohttpd (0.9.75) ends the target's string at it without a word,
         * so "/health\0/x" would be served as /health.  The raw target lies in its read buffer up to
         * the space before the HTTP version (version - 1): a target string on_uri found shorter than
         * that span held a NUL.  ("%00" is the same NUL, escaped.) */
        if (c->nul || (c->target == url && version > url && (size_t)(version - 1 - url) > c->target_len))
            return reply_error(s, mc, 400, "the request target holds a NUL character", NULL, "bad_request");
        if (s->o->api_key && sm_misc_key_guards(url) &&
            !sm_misc_key_ok(s->o->api_key, MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION)))
            return reply_error(s, mc, 401, "Incorrect API key provided: give 'Authorization: Bearer KEY' with this server's --api-key",
                               NULL, "invalid_api_key");
        if (p && p->over && c->route != R_HEALTH) {
            snprintf(msg, sizeof msg, "the server has %d open connections (--max-connections); retry later",
                     s->max_conns);
            return reply_error(s, mc, 503, msg, NULL, "too_many_connections");
        }
        if (c->route == R_NONE) {
            snprintf(msg, sizeof msg, "no route %.16s %.120s (this server has GET /health, GET /v1/models, POST /v1/completions, "
                     "POST /tokenize, POST /detokenize, GET /version, GET /metrics)",
                     method, url);
            return reply_error(s, mc, 404, msg, NULL, "not_found");
        }
        if (wants_post ? !post : !get) {
            snprintf(msg, sizeof msg, "%.160s takes %s, not %.16s", url, wants_post ? "POST" : "GET", method);
            return reply_as(s, mc, 405, sm_api_error(msg, sm_api_error_type(405), NULL, "method_not_allowed"), "application/json",
                            wants_post ? "POST" : "GET, HEAD");
        }
        /* two Content-Length headers that disagree: a 400 (RFC 9112 section 6.3; a proxy in front
         * might have framed the body by the other one) */
        cl_seen cls = {NULL, 0};
        MHD_get_connection_values(mc, MHD_HEADER_KIND, cl_check, &cls);
        if (cls.conflict)
            return reply_error(s, mc, 400, "the request has Content-Length headers that disagree", NULL, "bad_request");
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o->max_body) {
            snprintf(msg, sizeof msg, "the request body has %.24s bytes; this server takes at most %zu", cl, s->o->max_body);
            return reply_error(s, mc, 413, msg, NULL, "request_too_large");
        }
        return MHD_YES;
    }
    if (c->job) return plain_next(s, mc, c); /* resumed: the completion has news */
    if (*upload_size) { /* a piece of the body */
        size_t n = *upload_size;
        *upload_size = 0;
        c->seen += n;
        if (c->too_big || c->body.n + n > s->o->max_body) {
            c->too_big = 1;
            sm_buf_free(&c->body);
            return MHD_YES; /* read and dropped to its end: then the 413 (--request-timeout bounds it) */
        }
        return sm_buf_add(&c->body, upload, n) ? MHD_NO : MHD_YES;
    }
    /* the whole request is in: from here on no deadline cuts it */
    if (answering(s, mc)) return MHD_NO;
    if (c->too_big) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is longer than %zu bytes", s->o->max_body);
        return reply_error(s, mc, 413, msg, NULL, "request_too_large");
    }
    switch (c->route) {
    case R_HEALTH: {
        int live, queued, closing = __atomic_load_n(&s->closing, __ATOMIC_RELAXED);
        long long tokens, steps;
        sparkmono_cache_stats cs;
        sm_sched_counts(&s->sched, &live, &queued, &tokens, &steps);
        sm_sched_cache(&s->sched, &cs);
        pthread_mutex_lock(&s->mu);
        int npeers = s->npeers;
        pthread_mutex_unlock(&s->mu);
        char b[512];
        snprintf(b, sizeof b,
                 "{\"status\":\"%s\",\"running\":%d,\"queued\":%d,\"tokens\":%lld,\"steps\":%lld,\"connections\":%d,"
                 "\"prefix_cache\":%s,\"kv_pages\":{\"total\":%d,\"used\":%d,\"cached\":%d,\"free\":%d}}",
                 closing ? "shutting down" : "ok", live, queued, tokens, steps, npeers, cs.enabled ? "true" : "false",
                 cs.pages, cs.pages_used, cs.pages_cached, cs.pages_free);
        return reply(s, mc, closing ? 503 : 200, strdup(b));
    }
    case R_MODELS:
        return reply(s, mc, 200, sm_api_models(s->api.name, s->created, s->api.max_len, 1));
    case R_MODEL:
        if (strcmp(url + 11, s->api.name)) {
            char msg[400];
            snprintf(msg, sizeof msg, "The model '%.200s' does not exist (this server serves '%s')", url + 11, s->api.name);
            return reply_error(s, mc, 404, msg, "model", "model_not_found");
        }
        return reply(s, mc, 200, sm_api_models(s->api.name, s->created, s->api.max_len, 0));
    case R_TOKENIZE:
    case R_DETOKENIZE: {
        char *out = NULL;
        int st = (c->route == R_TOKENIZE ? sm_misc_tokenize : sm_misc_detokenize)(&s->api, c->body.p, c->body.n, &out);
        return reply(s, mc, (unsigned)st, out);
    }
    case R_VERSION:
        return reply(s, mc, 200, sm_misc_version());
    case R_METRICS:
        return reply_as(s, mc, 200, sm_serve_metrics(s), "text/plain; version=0.0.4; charset=utf-8", NULL);
    default:
        return completions(s, mc, c);
    }
}

/* The request line of a request was read: it now has request_timeout to arrive whole.  Its
 * conn starts here, with the raw target (on_request checks it for a NUL). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc) {
    sm_server *s = cls;
    peer *p = peer_of(mc);
    if (p) {
        pthread_mutex_lock(&s->mu);
        p->in_request = 1;
        p->deadline = now_s() + s->o->request_timeout_s;
        pthread_mutex_unlock(&s->mu);
    }
    conn *c = calloc(1, sizeof *c); /* NULL: on_request makes one, without the NUL check */
    if (c && uri) {
        c->target = uri;
        c->target_len = strlen(uri);
        const char *q = memchr(uri, '?', c->target_len), *z = strstr(uri, "%00");
        c->nul = z && (!q || z < q);
    }
    return c;
}

/* A request is over (answered, or its connection is closing). */
static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    sm_server *s = cls;
    conn *c = *con_cls;
    peer *p = peer_of(mc);
    if (p && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) { /* kept alive: idle until the next request line */
        pthread_mutex_lock(&s->mu);
        p->in_request = 0;
        p->deadline = now_s() + s->o->idle_timeout_s;
        pthread_mutex_unlock(&s->mu);
    }
    if (!c) return;
    sm_job_free(c->job); /* a plain completion whose client left */
    sm_buf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

/* A connection the front handed over was taken in (its peer, counted and idle since its
 * accept, is adopted) or closed (before its socket is). */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    sm_server *s = cls;
    peer *p = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        pthread_mutex_lock(&s->mu);
        *socket_context = ci ? sm_front_adopt(s, ci->connect_fd) : NULL; /* NULL: served without deadlines */
        pthread_mutex_unlock(&s->mu);
    } else if (p) {
        pthread_mutex_lock(&s->mu);
        sm_front_closed(s, p);
        pthread_mutex_unlock(&s->mu);
        free(p);
        *socket_context = NULL;
    }
}

/* ---- the watch thread ------------------------------------------------------------------- */

/* Close p at its deadline: a request not received whole is answered 408 first; an idle
 * connection is just closed.  libmicrohttpd (or the front) sees the shut-down socket and closes
 * it.  Under s->mu. */
static void cut_locked(sm_server *s, peer *p) {
    if (p->in_request && p->fd >= 0) (void)!send(p->fd, s->r408, (size_t)s->r408_len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (p->fd >= 0) shutdown(p->fd, SHUT_RDWR);
    p->deadline = 0;
    p->cut = 1;
}

static void *watch_main(void *arg) {
    sm_server *s = arg;
    struct pollfd *pf = NULL;
    sm_job **pj = NULL;
    size_t cap = 0;
    struct timespec tick = {0, SM_HTTP_POLL_MS * 1000000L};
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        /* hang-ups of parked connections (libmicrohttpd does not watch a suspended socket) */
        size_t n = 0;
        for (sm_job *j = s->parked; j; j = j->pnext) {
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 64;
                struct pollfd *npf = realloc(pf, nc * sizeof *pf);
                if (npf) pf = npf;
                sm_job **npj = npf ? realloc(pj, nc * sizeof *pj) : NULL;
                if (!npj) break; /* out of memory: watch the first cap this tick */
                pj = npj;
                cap = nc;
            }
            pf[n] = (struct pollfd){j->fd, POLLRDHUP, 0};
            pj[n++] = j;
        }
        if (n && poll(pf, n, 0) > 0)
            for (size_t i = 0; i < n; i++)
                if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
                    __atomic_store_n(&pj[i]->gone, 1, __ATOMIC_RELEASE);
                    unpark_locked(s, pj[i]); /* its callback sees gone and closes */
                }
        /* deadlines: idle connections and requests that did not arrive in time */
        double now = now_s();
        int late = 0;
        for (peer *p = s->peers; p; p = p->next)
            if (p->at != PEER_HANDED && p->deadline > 0 && now >= p->deadline) { /* a handed socket is in transit */
                late += p->in_request;
                if (p->in_request) sm_metrics_status(&s->met, 408);
                cut_locked(s, p);
            }
        if (late && !s->o->quiet)
            fprintf(stderr, "serve: %d request%s not received whole within %d s: answered 408, closed\n", late,
                    late > 1 ? "s" : "", s->o->request_timeout_s);
        pthread_mutex_unlock(&s->mu);
        nanosleep(&tick, NULL);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    free(pf);
    free(pj);
    return NULL;
}

/* ---- start and stop --------------------------------------------------------------------- */

int sm_http_start(sm_server *s, sm_err *e) {
    pthread_mutex_init(&s->mu, NULL);
    if (sm_http_fit_open_files(s, e)) return -1;
    /* the 408 the watch thread writes, whole */
    char msg[160];
    snprintf(msg, sizeof msg, "the request was not received whole within %d s (--request-timeout)", s->o->request_timeout_s);
    s->r408_len = sm_http_raw_answer(s->r408, sizeof s->r408, 408, "Request Timeout", msg, "request_timeout");
    if (s->r408_len < 0) return sm_errf(e, "serve: the 408 answer does not fit");

    char port[16];
    snprintf(port, sizeof port, "%d", s->o->port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(s->o->host, port, &hints, &ai);
    if (rc) return sm_errf(e, "serve: --host '%s': %s", s->o->host, gai_strerror(rc));
    /* the front accepts (serve_front.c: it answers a first line libmicrohttpd would close without
     * a word, and keeps the connection limit: past it, connections wait in the kernel's queue) */
    rc = sm_front_listen(s, ai->ai_addr, ai->ai_addrlen, e);
    freeaddrinfo(ai);
    if (rc) return -1;
    /* epoll (poll where there is none) in a pool of polling threads; parked connections; the
     * connections come from the front.  Its limit never refuses one: a polling thread counts a
     * connection handed to it only once it takes it in, and one is picked by socket number, so
     * each thread may get all of ours (and those closing, counted a moment longer). */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET;
    unsigned limit = ((unsigned)s->max_conns + SM_HTTP_SPARE_CONNECTIONS + SM_HTTP_THREADS) * SM_HTTP_THREADS;
    /* libmicrohttpd's inactivity timeout only cuts a stalled answer: the watch thread's deadlines come first */
    int t = s->o->request_timeout_s > s->o->idle_timeout_s ? s->o->request_timeout_s : s->o->idle_timeout_s;
    unsigned send_timeout = (unsigned)(t > SM_HTTP_SEND_TIMEOUT_S ? t : SM_HTTP_SEND_TIMEOUT_S) + 1;
    sm_http_log_begin();
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)SM_HTTP_THREADS,
                            MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT, send_timeout,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SM_HTTP_CONN_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                            MHD_OPTION_EXTERNAL_LOGGER, sm_http_log, s, MHD_OPTION_END);
    if (!s->d) {
        sm_front_stop(s);
        return sm_errf(e, "serve: cannot start serving on %s port %d: %s", s->o->host, s->o->port,
                       sm_http_log_last()[0] ? sm_http_log_last() : "libmicrohttpd refused to start");
    }
    sm_http_log_live();
    rc = pthread_create(&s->watch, NULL, watch_main, s);
    if (rc) sm_errf(e, "serve: cannot start the watch thread: %s", strerror(rc));
    else s->watching = 1;
    if (rc || sm_front_start(s, e)) {
        sm_http_stop(s);
        return -1;
    }
    return 0;
}

void sm_http_quiesce(sm_server *s) {
    if (s->d) sm_front_quiesce(s);
}

void sm_http_stop(sm_server *s) {
    if (!s->d) return;
    /* libmicrohttpd stops only with no connection suspended: resume every parked one, park no more */
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    while (s->parked) unpark_locked(s, s->parked);
    pthread_mutex_unlock(&s->mu);
    if (s->watching) pthread_join(s->watch, NULL);
    s->watching = 0;
    sm_front_stop(s); /* first: nothing is handed to a stopping daemon */
    MHD_stop_daemon(s->d); /* closes every connection: their peers are freed */
    s->d = NULL;
    while (s->peers) { /* handed over but never taken in: closed unadopted by the stop */
        peer *p = s->peers;
        s->peers = p->next;
        free(p);
    }
    s->npeers = 0;
    pthread_mutex_destroy(&s->mu);
}
