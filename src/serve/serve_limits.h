/* serve_limits.h: the server's open-file limit and libmicrohttpd's log (serve_limits.c). */
#ifndef SM_SERVE_LIMITS_H
#define SM_SERVE_LIMITS_H
#include <stdarg.h>
#include "base/err.h"
#include "serve/serve_http.h"

/* Raise the open-file limit to its hard limit and set s->max_conns to what it leaves room for
 * (one line on stderr when that is less than --max-connections); -1 when too low to serve. */
int sm_http_fit_open_files(sm_server *s, sm_err *e);
/* libmicrohttpd's logger (cls: the sm_server): before sm_http_log_live the last message is
 * kept (sm_http_log_last, for the start's error line); after it, lines go to stderr at most one
 * a second unless quiet.  sm_http_log_begin clears the kept message. */
void sm_http_log(void *cls, const char *fmt, va_list ap);
void sm_http_log_begin(void);
const char *sm_http_log_last(void);
void sm_http_log_live(void);
#endif
