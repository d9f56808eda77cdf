/* serve_front.c: the accept front of `sparkmono serve`.  One thread owns the listening socket.
 * It accepts a connection (counted in s->npeers from then on, so the connection limit and the
 * 'over' peers are as before), peeks at its first bytes without reading them, and as soon as the
 * first line's first space is there hands the connection to libmicrohttpd (MHD_add_connection),
 * which then reads it from its first byte.  A first line without a space ("HELLO", "GET"), one
 * that starts with one (no method), or one with no space in its first SM_HTTP_PEEK bytes it
 * answers 400 itself, then waits for the client to close.  A connection whose first bytes are
 * already there is judged at its accept: it waits for nothing.  Until then a held connection is
 * idle (no request line yet): the watch thread closes it at its idle deadline, as before.
 *
 * Why: libmicrohttpd 0.9.75 closes a request line without a space (or with an empty method)
 * without an answer; it calls none of our callbacks for it and shuts the socket's sending side
 * before its close notice, and logs nothing (connection.c, parse_initial_message_line and
 * CONNECTION_CLOSE_ERROR_CHECK with no message), so nothing behind it can answer.  We rejected
 * MHD_USE_TURBO (it leaves the socket open for the close notice, but changes how every
 * connection is polled and closed: a close with unread bytes resets the connection), and
 * reading the line ourselves (libmicrohttpd cannot be given bytes already read).
 *
 * A connection handed over is PEER_HANDED until libmicrohttpd's STARTED notice adopts it by its
 * socket: while it is open no other accept can return that number, so the match is unique.  If
 * libmicrohttpd drops it before that notice (out of memory), the number's next accept retires
 * it.  libmicrohttpd's own limit is set so it never refuses what we hand it (serve_http.c).
 */
#include "serve/serve_front.h"
#include "serve/serve_http.h"
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

enum front_400 { F400_NO_TARGET, F400_NO_METHOD, F400_LONG };

int sm_http_raw_answer(char *out, size_t cap, unsigned status, const char *reason, const char *msg, const char *code) {
    char *body = sm_api_error(msg, sm_api_error_type(status), NULL, code);
    if (!body) return -1;
    int n = snprintf(out, cap,
                     "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, reason, strlen(body), body);
    free(body);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

/* ---- the peers' list (s->peers, s->npeers) ----------------------------------------------- */

/* Take p out of s->peers.  Under s->mu. */
static void unlink_locked(sm_server *s, peer *p) {
    if (p->prev) p->prev->next = p->next;
    else s->peers = p->next;
    if (p->next) p->next->prev = p->prev;
    s->npeers--;
    if (s->front.full) { /* room again: the front accepts the connections waiting in the kernel */
        s->front.full = 0;
        uint64_t one = 1;
        (void)!write(s->front.wake, &one, sizeof one);
    }
}

void sm_front_closed(sm_server *s, peer *p) { unlink_locked(s, p); }

peer *sm_front_adopt(sm_server *s, int fd) {
    for (peer **pp = &s->front.handed; *pp; pp = &(*pp)->hnext)
        if ((*pp)->fd == fd) {
            peer *p = *pp;
            *pp = p->hnext;
            p->at = PEER_MHD;
            return p;
        }
    return NULL;
}

/* ---- one held connection ------------------------------------------------------------------ */

/* Close a connection of the front's (held or answered). */
static void drop(sm_server *s, peer *p) {
    epoll_ctl(s->front.ep, EPOLL_CTL_DEL, p->fd, NULL);
    pthread_mutex_lock(&s->mu);
    unlink_locked(s, p);
    pthread_mutex_unlock(&s->mu); /* out of the list first: the watch thread never shuts a reused number */
    close(p->fd);
    free(p);
}

/* Give p to libmicrohttpd; from here on it may be adopted, served and freed at any time. */
static void hand(sm_server *s, peer *p) {
    sm_front *f = &s->front;
    pthread_mutex_lock(&s->mu);
    int cut = p->cut;
    if (!cut) {
        p->at = PEER_HANDED; /* the watch thread leaves it alone until it is adopted */
        p->hnext = f->handed;
        f->handed = p;
    }
    pthread_mutex_unlock(&s->mu);
    if (cut) { /* the watch thread was first */
        drop(s, p);
        return;
    }
    epoll_ctl(f->ep, EPOLL_CTL_DEL, p->fd, NULL);
    if (MHD_add_connection(s->d, p->fd, (const struct sockaddr *)&p->addr, p->addr_len) == MHD_YES) return;
    /* refused before it was queued (no STARTED notice can come): the socket is closed already */
    pthread_mutex_lock(&s->mu);
    sm_front_adopt(s, p->fd);
    unlink_locked(s, p);
    pthread_mutex_unlock(&s->mu);
    free(p);
}

/* Read and drop what p's client sent, at most a few pieces (a client that keeps sending must not
 * hold the thread); 0 while p stays open, -1 once it has ended. */
static int discard(int fd) {
    char b[4096];
    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(fd, b, sizeof b, 0);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 0;
}

/* Answer p 400 and end its sending side.  It stays open, idle, until the client closes: its
 * bytes are read and dropped (a close with unread bytes would reset the connection, and the
 * client could lose the 400 before reading it). */
static void answer(sm_server *s, peer *p, int which) {
    sm_front *f = &s->front;
    int gone = discard(p->fd);
    (void)!send(p->fd, f->r400[which], (size_t)f->r400_len[which], MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(p->fd, SHUT_WR);
    sm_metrics_status(&s->met, 400);
    if (gone) {
        drop(s, p);
        return;
    }
    pthread_mutex_lock(&s->mu);
    p->at = PEER_ANSWERED;
    p->deadline = sm_sched_now() + s->o->idle_timeout_s;
    pthread_mutex_unlock(&s->mu);
}

/* Judge held p's first line, or go on with an answered p, on ev (its epoll events; 0 at its
 * accept).  p may be freed or handed over on return. */
static void judge(sm_server *s, peer *p, uint32_t ev) {
    pthread_mutex_lock(&s->mu);
    int cut = p->cut, at = p->at;
    pthread_mutex_unlock(&s->mu);
    if (cut || (ev & EPOLLERR)) {
        drop(s, p);
        return;
    }
    if (at == PEER_ANSWERED) {
        if (discard(p->fd) || (ev & EPOLLHUP)) drop(s, p);
        return;
    }
    char b[SM_HTTP_PEEK];
    ssize_t n;
    while ((n = recv(p->fd, b, sizeof b, MSG_PEEK)) < 0 && errno == EINTR) {}
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (ev & (EPOLLHUP | EPOLLRDHUP)) drop(s, p);
        return;
    }
    if (n <= 0) { /* the client left (or the connection failed) before a whole first line */
        drop(s, p);
        return;
    }
    /* empty lines before the request line are skipped, as libmicrohttpd skips them (they count
     * toward the limit: nothing here reads them, so a flood of them cannot hold the thread) */
    size_t i = 0;
    while (i < (size_t)n && (b[i] == '\n' || (b[i] == '\r' && i + 1 < (size_t)n && b[i + 1] == '\n')))
        i += b[i] == '\n' ? 1 : 2;
    const char *l = b + i, *sp = memchr(l, ' ', (size_t)n - i), *nl = memchr(l, '\n', (size_t)n - i);
    if (sp == l) answer(s, p, F400_NO_METHOD);
    else if (sp && (!nl || sp < nl)) hand(s, p); /* a method and more: libmicrohttpd's to parse */
    else if (nl) answer(s, p, F400_NO_TARGET);
    else if (n == (ssize_t)sizeof b) answer(s, p, F400_LONG);
    else if (ev & (EPOLLHUP | EPOLLRDHUP)) drop(s, p); /* the line can never end */
    /* else: wait for more */
}

/* ---- the thread ----------------------------------------------------------------------------- */

/* Accept what waits, while there is room (past it, connections wait in the kernel's queue
 * until a close wakes the front). */
static void accept_some(sm_server *s) {
    sm_front *f = &s->front;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int room = s->npeers < s->max_conns + SM_HTTP_SPARE_CONNECTIONS;
        if (!room) f->full = 1;
        pthread_mutex_unlock(&s->mu);
        if (!room) return;
        struct sockaddr_storage a;
        socklen_t alen = sizeof a;
        int fd = accept4(f->lfd, (struct sockaddr *)&a, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                pthread_mutex_lock(&s->mu); /* out of files or memory: again after the next close */
                f->full = 1;
                pthread_mutex_unlock(&s->mu);
                return;
            }
            continue; /* that connection failed (aborted, interrupted): the next one */
        }
        peer *p = calloc(1, sizeof *p);
        struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = p};
        if (!p || epoll_ctl(f->ep, EPOLL_CTL_ADD, fd, &e)) { /* out of memory: refused */
            free(p);
            close(fd);
            continue;
        }
        p->fd = fd;
        p->at = PEER_HELD;
        memcpy(&p->addr, &a, alen);
        p->addr_len = alen;
        pthread_mutex_lock(&s->mu);
        /* a handed connection of the same number was dropped by libmicrohttpd unadopted: retire it */
        for (peer **pp = &f->handed; *pp; pp = &(*pp)->hnext)
            if ((*pp)->fd == fd) {
                peer *old = *pp;
                *pp = old->hnext;
                unlink_locked(s, old);
                free(old);
                break;
            }
        p->deadline = sm_sched_now() + s->o->idle_timeout_s;
        p->over = s->npeers >= s->max_conns;
        p->next = s->peers;
        if (s->peers) s->peers->prev = p;
        s->peers = p;
        s->npeers++;
        pthread_mutex_unlock(&s->mu);
        judge(s, p, 0); /* its first bytes may be here already */
    }
}

static void *front_main(void *arg) {
    sm_server *s = arg;
    sm_front *f = &s->front;
    struct epoll_event ev[64];
    for (;;) {
        int n = epoll_wait(f->ep, ev, 64, -1), wake = 0;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.ptr == &f->lfd) {
                wake = 1;
            } else if (ev[i].data.ptr == &f->wake) {
                uint64_t v;
                (void)!read(f->wake, &v, sizeof v);
                wake = 1;
            } else {
                judge(s, ev[i].data.ptr, ev[i].events);
            }
        }
        if (!wake) continue;
        pthread_mutex_lock(&s->mu);
        int stop = f->stop, quiesce = f->quiesce;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (quiesce && f->lfd >= 0) { /* no new connections; the open ones go on */
            close(f->lfd);
            f->lfd = -1;
        }
        if (f->lfd >= 0) accept_some(s);
    }
    /* the front's own connections end with it */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        peer *p = s->peers;
        while (p && p->at != PEER_HELD && p->at != PEER_ANSWERED) p = p->next;
        pthread_mutex_unlock(&s->mu);
        if (!p) break;
        drop(s, p);
    }
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------------------ */

int sm_front_listen(sm_server *s, const struct sockaddr *a, socklen_t len, sm_err *e) {
    sm_front *f = &s->front;
    f->lfd = f->ep = f->wake = -1;
    char msg[3][160];
    snprintf(msg[F400_NO_TARGET], sizeof msg[0], "malformed request line: no request target");
    snprintf(msg[F400_NO_METHOD], sizeof msg[0], "malformed request line: no method");
    snprintf(msg[F400_LONG], sizeof msg[0], "malformed request line: no space in its first %d bytes", SM_HTTP_PEEK);
    for (int i = 0; i < 3; i++)
        if ((f->r400_len[i] = sm_http_raw_answer(f->r400[i], sizeof f->r400[i], 400, "Bad Request", msg[i], "bad_request")) < 0)
            return sm_errf(e, "serve: the 400 answer does not fit");
    int fd = socket(a->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), on = 1;
    if (fd < 0) return sm_errf(e, "serve: cannot listen on %s port %d: %s", s->o->host, s->o->port, strerror(errno));
    /* as libmicrohttpd did: a restart need not wait out the old connections; IPv6 means IPv6 only */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (a->sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    struct sockaddr_storage b;
    socklen_t blen = sizeof b;
    if (bind(fd, a, len) || listen(fd, SOMAXCONN) || getsockname(fd, (struct sockaddr *)&b, &blen)) {
        int err = errno;
        close(fd);
        return sm_errf(e, "serve: cannot listen on %s port %d: %s", s->o->host, s->o->port, strerror(err));
    }
    s->port = ntohs(b.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&b)->sin6_port : ((struct sockaddr_in *)&b)->sin_port);
    f->lfd = fd;
    f->ep = epoll_create1(EPOLL_CLOEXEC);
    f->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event el = {.events = EPOLLIN | EPOLLET, .data.ptr = &f->lfd}, ew = {.events = EPOLLIN, .data.ptr = &f->wake};
    if (f->ep < 0 || f->wake < 0 || epoll_ctl(f->ep, EPOLL_CTL_ADD, f->lfd, &el) ||
        epoll_ctl(f->ep, EPOLL_CTL_ADD, f->wake, &ew)) {
        int err = errno;
        sm_front_stop(s);
        return sm_errf(e, "serve: cannot start accepting connections: %s", strerror(err));
    }
    return 0;
}

int sm_front_start(sm_server *s, sm_err *e) {
    int rc = pthread_create(&s->front.thread, NULL, front_main, s);
    if (rc) return sm_errf(e, "serve: cannot start the accept thread: %s", strerror(rc));
    s->front.running = 1;
    return 0;
}

/* Ask the thread for stop or quiesce (flag: which field) and wake it. */
static void ask(sm_server *s, int *flag) {
    pthread_mutex_lock(&s->mu);
    *flag = 1;
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    (void)!write(s->front.wake, &one, sizeof one);
}

void sm_front_quiesce(sm_server *s) {
    if (s->front.running) ask(s, &s->front.quiesce);
}

void sm_front_stop(sm_server *s) {
    sm_front *f = &s->front;
    if (f->running) {
        ask(s, &f->stop);
        pthread_join(f->thread, NULL);
        f->running = 0;
    }
    if (f->lfd >= 0) close(f->lfd);
    if (f->ep >= 0) close(f->ep);
    if (f->wake >= 0) close(f->wake);
    f->lfd = f->ep = f->wake = -1;
}
