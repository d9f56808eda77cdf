/* serve_front.h: the accept front of `sparkmono serve` (serve_front.c) and the peer, one open
 * connection from its accept to its close.  The front owns the listening socket; it holds a new
 * connection until its first line can be judged, answers a malformed one 400 itself and hands
 * every other one to libmicrohttpd. */
#ifndef SM_SERVE_FRONT_H
#define SM_SERVE_FRONT_H
#include <pthread.h>
#include <stddef.h>
#include <sys/socket.h>
#include "base/err.h"

struct sm_server;

/* Where a connection is. */
enum peer_at {
    PEER_MHD,      /* libmicrohttpd's: it reads and answers its requests */
    PEER_HELD,     /* the front's: its first line is not judged yet */
    PEER_HANDED,   /* given to libmicrohttpd, not taken in yet (its STARTED notice adopts it) */
    PEER_ANSWERED, /* the front answered it 400: idle until the client closes */
};

/* One open connection; fields under s->mu. */
typedef struct peer {
    int fd;                       /* the socket, valid until its close (the front's, or after
                                     libmicrohttpd's CLOSED notice) */
    double deadline;              /* monotonic seconds: cut when reached; 0: none (an answer is on its way) */
    int in_request;               /* a request line was read: a cut is answered 408 */
    int cut;                      /* the watch thread shut the socket down */
    int over;                     /* opened past max_conns: only /health is served, then closed */
    int at;                       /* enum peer_at */
    struct sockaddr_storage addr; /* the client's address, as accepted (libmicrohttpd is given it) */
    socklen_t addr_len;
    struct peer *prev, *next;     /* s->peers */
    struct peer *hnext;           /* s->front.handed */
} peer;

/* The front's state; the fields marked so are under s->mu, the others its thread's own. */
typedef struct sm_front {
    int lfd;                 /* the listening socket; -1 once closed (quiesced) */
    int ep;                  /* epoll set: the listening socket, wake, the held connections */
    int wake;                /* eventfd: stop, quiesce, or room for a connection again */
    pthread_t thread;
    int running;             /* the thread runs */
    int full;                /* (s->mu) it stopped accepting: a close must wake it */
    int quiesce, stop;       /* (s->mu) asked of the thread */
    struct peer *handed;     /* (s->mu) PEER_HANDED connections (a list through hnext) */
    char r400[3][512];       /* the whole 400 answers, enum front_400 */
    int r400_len[3];
} sm_front;

/* Bind and listen on a (SO_REUSEADDR; an IPv6 address only), set s->port, build the 400s. */
int sm_front_listen(struct sm_server *s, const struct sockaddr *a, socklen_t len, sm_err *e);
/* Start the front's thread (s->d serving). */
int sm_front_start(struct sm_server *s, sm_err *e);
/* The PEER_HANDED connection of socket fd, now libmicrohttpd's (NULL: none).  Under s->mu. */
peer *sm_front_adopt(struct sm_server *s, int fd);
/* p is closing (libmicrohttpd's CLOSED notice): uncount it; the caller frees it.  Under s->mu. */
void sm_front_closed(struct sm_server *s, peer *p);
/* Close the listening socket (soon, on the front's thread); held connections go on. */
void sm_front_quiesce(struct sm_server *s);
/* Stop the front: its held connections are closed, its thread joined, its sockets closed. */
void sm_front_stop(struct sm_server *s);
/* A whole answer with a JSON error body and Connection: close, written by us, not libmicrohttpd,
 * into out (cap bytes); its length, or -1 when it does not fit or memory ran out. */
int sm_http_raw_answer(char *out, size_t cap, unsigned status, const char *reason, const char *msg, const char *code);
#endif
