/* buf.h: a growable byte buffer, always NUL-terminated once anything was added (p NULL before).
 *
 * The text a template renders, the server's answers and stream pieces are appended here.  We rejected
 * open_memstream: it cannot hold a NUL byte a string value may carry, and its failures are
 * known only at fclose.
 */
#ifndef SM_BUF_H
#define SM_BUF_H
#include <stddef.h>

typedef struct sm_buf {
    char *p;                   /* [cap] bytes, p[n] = 0 (NULL: nothing added yet) */
    size_t n, cap;
} sm_buf;

int sm_buf_add(sm_buf *b, const void *s, size_t n); /* 0, or -1 when out of memory (b unchanged) */
int sm_buf_str(sm_buf *b, const char *s);
int sm_buf_addf(sm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sm_buf_free(sm_buf *b);

#endif
