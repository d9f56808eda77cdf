/* check.h: the test harness of the CPU tests.  Each test program runs its cases with RUN(),
 * printing "PASS name" or "FAIL name" (with the failed checks above it); tests/run.sh counts
 * those lines over all programs and prints "N passed, N failed".  A program that dies without
 * finishing counts as one failure.  We rejected a third-party framework: this is 30 lines. */
#ifndef SM_CHECK_H
#define SM_CHECK_H
#include <stdio.h>
#include "check_core.h"

static int t_pass, t_fail, t_cur;

#define CHECK(cond, ...) SM_CHECK_COUNT(t_cur, cond, __VA_ARGS__)

#define RUN(fn)                                                                       \
    do {                                                                              \
        t_cur = 0;                                                                    \
        fn();                                                                         \
        if (t_cur) { printf("FAIL %s\n", #fn); t_fail++; }                            \
        else { printf("PASS %s\n", #fn); t_pass++; }                                  \
        fflush(stdout);                                                               \
    } while (0)

#define TEST_DONE() (printf("DONE %d passed, %d failed\n", t_pass, t_fail), t_fail ? 1 : 0)

#endif
