/* buf.c: the growable byte buffer (see buf.h); capacity doubles, so n appends cost O(n). */
#include "base/buf.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sm_buf_add(sm_buf *b, const void *s, size_t n) {
    if (n + 1 > b->cap - b->n || !b->p) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) {
            if (cap > ((size_t)-1) / 2) return -1;
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int sm_buf_str(sm_buf *b, const char *s) { return sm_buf_add(b, s, strlen(s)); }

int sm_buf_addf(sm_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (k < 0) return -1;
    if ((size_t)k < sizeof small) return sm_buf_add(b, small, (size_t)k);
    char *big = malloc((size_t)k + 1); /* longer than the stack piece: format again */
    if (!big) return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    int rc = sm_buf_add(b, big, (size_t)k);
    free(big);
    return rc;
}

void sm_buf_free(sm_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
