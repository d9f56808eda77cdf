/* err.c: formatting of sm_err messages (see err.h). */
#include "base/err.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int sm_errf(sm_err *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int sm_errprefix(sm_err *e, const char *fmt, ...) {
    if (!e) return -1;
    char pre[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(pre), cap = sizeof e->msg - 1;
    if (n > cap) n = cap;
    memcpy(e->msg, pre, n);
    const char *parts[2] = {": ", old};
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(parts[i]);
        if (k > cap - n) k = cap - n;
        memcpy(e->msg + n, parts[i], k);
        n += k;
    }
    e->msg[n] = 0;
    return -1;
}
