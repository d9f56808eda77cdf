/* err.h: one error type for the whole host code.
 *
 * Every fallible function returns 0 on success or -1 on failure and, on failure, leaves one
 * line in an sm_err that names the problem and where (file, tensor, field).  The CLI prints
 * that line and exits with status 2.  We rejected errno-style integer codes alone: a user
 * must learn WHICH tensor of WHICH file is wrong, not just that something is.
 */
#ifndef SM_ERR_H
#define SM_ERR_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_err {
    char msg[1024]; /* one line, no trailing newline; "" when no error */
} sm_err;

/* Format msg into e (if non-NULL) and return -1, so callers can `return sm_errf(e, ...)`. */
int sm_errf(sm_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix an existing message: "<prefix>: <old msg>"; returns -1. */
int sm_errprefix(sm_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
