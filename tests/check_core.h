/* check_core.h: the one failed-check line of every test harness (tests/check.h for the CPU
 * tests, tests/gpu/harness.h for the GPU tests): when cond is false, count it in counter and
 * print "  check failed at FILE:LINE: COND: MESSAGE". */
#ifndef SM_CHECK_CORE_H
#define SM_CHECK_CORE_H
#include <stdio.h>

#define SM_CHECK_COUNT(counter, cond, ...)                                            \
    do {                                                                              \
        if (!(cond)) {                                                                \
            (counter)++;                                                              \
            printf("  check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            printf(__VA_ARGS__);                                                      \
            printf("\n");                                                             \
            fflush(stdout);                                                           \
        }                                                                             \
    } while (0)

#endif
