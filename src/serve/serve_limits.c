/* serve_limits.c: the server's process-wide limits and its HTTP library's messages: the
 * open-file limit raised to fit --max-connections (or the connections cut to what it leaves
 * room for), and libmicrohttpd's log lines, kept while starting and then throttled to one a
 * second.  Apart from serve_http.c because neither touches a request.  We rejected printing
 * every library message: a thousand clients that hang up at once are a thousand lines.
 */
#include "serve/serve_limits.h"
#include "serve/serve_sched.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

/* libmicrohttpd's own messages: kept while starting (the caller's error line quotes the last
 * one), printed afterwards at most one a second (a thousand clients that hang up at once are
 * one line and a count, not a thousand lines).  Its own lock: libmicrohttpd may log holding
 * its locks. */
static char g_last_log[256];
static int g_log_live;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static double g_log_t;  /* when the last line was printed */
static int g_log_held;  /* messages left out since */
void sm_http_log(void *cls, const char *fmt, va_list ap) {
    const sm_server *s = cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '.')) line[--n] = 0;
    if (!g_log_live) {
        memcpy(g_last_log, line, sizeof line);
        return;
    }
    if (s->o->quiet) return;
    pthread_mutex_lock(&g_log_mu);
    double t = sm_sched_now();
    if (t - g_log_t < 1.0) {
        g_log_held++;
    } else {
        if (g_log_held) fprintf(stderr, "serve: http: %s (and %d more messages in the last %.0f s)\n", line, g_log_held, t - g_log_t);
        else fprintf(stderr, "serve: http: %s\n", line);
        g_log_t = t;
        g_log_held = 0;
    }
    pthread_mutex_unlock(&g_log_mu);
}

/* Raise the open-file limit to its hard limit and set s->max_conns to what it leaves room
 * for (one line on stderr when that is less than --max-connections). */
int sm_http_fit_open_files(sm_server *s, sm_err *e) {
    s->max_conns = s->o->max_connections;
    rlim_t need = (rlim_t)s->o->max_connections + SM_HTTP_SPARE_CONNECTIONS + SM_HTTP_FD_RESERVE;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return 0;
    if (rl.rlim_cur < rl.rlim_max) { /* the hard limit, or as much as the kernel allows of it */
        struct rlimit up = rl;
        up.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
        else if (need < rl.rlim_max && (up.rlim_cur = need, setrlimit(RLIMIT_NOFILE, &up) == 0)) rl = up;
    }
    if (rl.rlim_cur >= need) return 0;
    long room = (long)rl.rlim_cur - SM_HTTP_SPARE_CONNECTIONS - SM_HTTP_FD_RESERVE;
    if (room < 1)
        return sm_errf(e, "serve: the open-file limit is %llu (ulimit -n), too low to serve; raise it above %d",
                       (unsigned long long)rl.rlim_cur, SM_HTTP_SPARE_CONNECTIONS + SM_HTTP_FD_RESERVE);
    s->max_conns = (int)room;
    fprintf(stderr,
            "serve: the open-file limit is %llu and cannot be raised (ulimit -Hn): at most %d connections, not "
            "--max-connections %d\n",
            (unsigned long long)rl.rlim_cur, s->max_conns, s->o->max_connections);
    return 0;
}

void sm_http_log_begin(void) {
    g_last_log[0] = 0;
    g_log_live = 0;
}
const char *sm_http_log_last(void) { return g_last_log; }
void sm_http_log_live(void) { g_log_live = 1; }
