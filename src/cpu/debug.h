/* debug.h: the debug hooks of the CPU backends (forward.c: single rank, world.c: W ranks).
 *
 * A trace sees every stage's activations of a step for all its rows, so tests can evaluate
 * each stage independently (tests/test_spec_f64.c) or compare ranks bit for bit
 * (tests/test_world.c); the world backend can also randomize the arrival order of its ranks
 * and move its TP finalize threshold.  None of this changes a result.  We rejected keeping
 * them in ops.h: they are properties of the backends, not of any op.
 */
#ifndef SM_CPU_DEBUG_H
#define SM_CPU_DEBUG_H
#include <stdint.h>

/* ---- CPU backend debug trace (sm_cpu_backend_create) ---- */
/* Called after each stage of a step with the stage's activations for all rows: data [n, width]
 * f32 (route ids as exact floats).  layer = -1 for the embedding, L for the final norm.  Stages,
 * per layer: "x" (input norm), "q" "k" "v" "g" (projections), "qn" "kn" (QK norm + RoPE),
 * "att" (attention output, f32, before its norm), "o" (gated, r16), "a" (o_proj), "s_att"
 * (residual after the attention boundary), "xf", "route_idx" "route_w" [n, K], "h1" "m" [n, Hm],
 * "f", "s_ffn" (residual leaving the layer); "s" at layer -1 (after the embedding norm) and
 * "h" at layer L (final norm output).  Tests compare each stage against an f64 evaluation fed
 * with the CPU's own inputs to that stage, so a bf16 rounding that flips between f32 and f64
 * cannot cascade. */
typedef void (*sm_cpu_trace_fn)(void *arg, int layer, const char *stage, const float *data, int n, int width);
/* Install (fn != NULL) or remove the trace of a backend made by sm_cpu_backend_create. */
void sm_cpu_backend_trace(void *backend_ctx, sm_cpu_trace_fn fn, void *arg);

/* ---- CPU world backend debug hooks (sm_world_backend_create) ---- */
/* Called by every rank thread after each replicated stage (concurrently across ranks; one
 * rank's calls are sequential): rank, then as sm_cpu_trace_fn.  Stages: "s" at layer -1;
 * per layer "x", "a" (attention output after the cross-rank sum, r16), "s_att", "xf",
 * "route_idx" "route_w" [n, K], "h1" "m" [n, Hm], "f", "s_ffn"; "h" and "argmax" [n, 1] at
 * layer L.  Every one must be bit-identical on every rank. */
typedef void (*sm_world_trace_fn)(void *arg, int rank, int layer, const char *stage, const float *data, int n, int width);
void sm_world_backend_trace(void *backend_ctx, sm_world_trace_fn fn, void *arg);
/* Randomize the order in which ranks arrive at every communication (comm.h jitter): sleeps
 * of up to max_us drawn from seed; seed 0 = off.  Outputs must not change. */
void sm_world_backend_jitter(void *backend_ctx, uint64_t seed, int max_us);
/* TP layout: steps of at least `rows` rows finalize the experts token-sharded (reduce-scatter
 * of the per-route y partials by rows, norm + weight + sum of each rank's rows, all-gather of
 * m); smaller steps all-reduce every route's y.  rows <= 0 restores the default (64).  The
 * two paths are bit-identical; the threshold only moves work and traffic. */
void sm_world_backend_finalize_rows(void *backend_ctx, int rows);

#endif
