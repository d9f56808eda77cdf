/* stats.h: the median of timing samples, the one statistic every benchmark reports
 * (DESIGN.md: "report the median").  Header-only, C and CUDA host code alike.
 *
 * The samples are sorted in place (qsort), so a caller also finds the minimum and maximum at
 * v[0] and v[n - 1] afterwards.  We rejected a selection algorithm (nth_element): sample
 * counts are tens to hundreds, and the sorted array is what the callers want anyway.
 */
#ifndef SM_STATS_H
#define SM_STATS_H
#include <stdlib.h>

/* qsort order of floats, ascending. */
static inline int sm_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n), n >= 1 (the mean of the two middle values when n is even).  Sorts v
 * ascending. */
static inline float sm_median(float *v, int n) {
    qsort(v, (size_t)n, sizeof(float), sm_cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

#endif
