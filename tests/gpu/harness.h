/* harness.h: the one harness of the GPU tests (every file of tests/gpu): result lines and their counts,
 * the test generator, guarded device arenas with poisoned outputs, and the comparison against
 * a CPU reference.
 *
 * Results: every check ends in one line "PASS name ...", "FAIL name ..." or "SKIP name: why"
 * (main.c counts all three per group).  A case allocates its device buffers from an arena:
 * each buffer has GH_GUARD elements of a byte pattern on both sides (checked after each
 * kernel by gh_sync and when the case ends: an overrun fails it) and its interior filled with 0xFF bytes (NaN in f32 and bf16, -1
 * in int32), so an element a kernel never wrote is found (gh_unwritten) and a NaN can never
 * pass a comparison.  A comparison reports the relative L2 error ||out - ref|| / ||ref|| and,
 * per element, |out - ref| / (|ref| + rms(ref)); a case passes when the first is within its
 * bound and the second within GH_ELEM_FACTOR times it (a tensor whose L2 error is small but
 * whose few elements are entirely wrong fails), with no NaN and infinities matched.  The worst
 * element is named by its index.  We rejected a max-abs bound alone: bf16 rounding flips move
 * single elements by one ulp of their own size while the tensor agrees to 1e-3.
 */
#ifndef SM_GPU_HARNESS_H
#define SM_GPU_HARNESS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "../check_core.h"
#ifdef __cplusplus
extern "C" {
#endif

#define GH_GUARD 64          /* guard elements on each side of a device buffer */
#define GH_GUARD_BYTE 0xA5   /* their pattern */
#define GH_ELEM_FACTOR 5.0   /* per-element bound = this x the case's relative bound */

/* ---- results ---- */
extern int gh_pass, gh_fail, gh_skip; /* lines printed by the current group */
/* "PASS ..." or "FAIL ..." (printf-style name and details), counted; returns ok. */
int gh_result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "SKIP ...", counted: a check that cannot run here (say why in the line). */
void gh_skip_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Zero the counts (a group's start). */
void gh_reset(void);
/* Checks inside a case that prints its own result line: GH_CHECK prints the failed condition
 * with its file:line and message and counts it in gh_case_fail (zeroed by the case). */
extern int gh_case_fail;
#define GH_CHECK(cond, ...) SM_CHECK_COUNT(gh_case_fail, cond, __VA_ARGS__)

/* ---- the test generator (src/model/rng.h, seeded per run) ---- */
extern uint64_t gh_rng;
/* Seed gh_rng from the clock, or from SM_TEST_SEED when set (to repeat a run), and print
 * "WHO: seed N". */
void gh_seed(const char *who);
uint64_t gh_rnd64(void);
float gh_rndu(void);         /* uniform in [-1, 1) */
float gh_rnds(float sd);     /* uniform with standard deviation sd */
int gh_rndi(int n);          /* uniform in [0, n) */
void gh_fill_bf16(uint16_t *h, size_t n, float sd);
void gh_fill_f32(float *h, size_t n, float sd);
void gh_fill_eff(float *h, size_t n); /* r16(1 + g), a small random gain */
void gh_bf16_to_f32(const uint16_t *h, float *f, size_t n);

/* ---- arenas: a case's host and device buffers, freed by gh_case_end ---- */
void *gh_halloc(size_t bytes);                                   /* exits on failure */
void *gh_dalloc(const char *name, size_t esz, size_t n);          /* guarded, interior 0xFF */
void *gh_dup_to_dev(const char *name, const void *h, size_t esz, size_t n);
void gh_to_host(void *h, const void *d, size_t bytes);
/* Refill the interior of an arena buffer with 0xFF bytes (before a second run into it). */
void gh_poison(void *d);
/* Elements of arena buffer d (its first n) still all 0xFF bytes: never written. */
size_t gh_unwritten(const void *d, size_t n);
/* 1 when every buffer's guards are intact (prints the buffers overrun). */
int gh_guards_ok(void);
/* Free the case's buffers. */
void gh_case_end(void);

/* ---- comparison ---- */
typedef struct gh_acc {
    double num, den;     /* sum of squared errors, of squared references (finite references) */
    long nan;            /* NaN outputs */
    long infbad;         /* infinite references not matched exactly */
    double elem;         /* worst |out - ref| / (|ref| + rms(ref)) */
    size_t elem_at;      /* its index (over every array added, in order) */
    size_t count;        /* elements added */
} gh_acc;
#define GH_ACC_INIT {0, 0, 0, 0, 0, 0, 0}
/* Add out [n] against ref [n] (host arrays). */
void gh_acc_add(gh_acc *a, const float *out, const float *ref, size_t n);
double gh_acc_rel(const gh_acc *a);
/* Copy a device output to the host and add it (bf16 or f32 elements). */
double gh_cmp_bf16(const uint16_t *d, const float *ref, size_t n, gh_acc *a);
double gh_cmp_f32(const float *d, const float *ref, size_t n, gh_acc *a);
/* One result line for name: ok and no NaN, infinities matched, rel <= bound, the worst
 * element within GH_ELEM_FACTOR x bound, guards intact.  _keep leaves the case's buffers. */
int gh_verdict_keep(const char *name, int ok, const gh_acc *a, double bound);
int gh_verdict(const char *name, int ok, const gh_acc *a, double bound);
/* "  why" then "FAIL name"; ends the case. */
void gh_fail_line(const char *name, const char *why);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* Synchronize st and report a CUDA error (asynchronous faults surface here), then check every
 * guard of the case's arena (the buffers overrun are named); 1 when fine.  Call it outside a
 * stream capture, from the thread that owns the arena. */
int gh_sync(cudaStream_t st);
#endif
#endif
