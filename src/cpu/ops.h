/* ops.h: the CPU reference, one function per step of SPEC.md sections 3-6.
 *
 * These are the oracle: the CPU layer loop (layer.c) is built from them, and every GPU kernel
 * test compares against them.  Activations are f32 arrays holding the values the spec names;
 * where the spec rounds (r16), the function rounds, so outputs marked "bf16-exact" hold values
 * that are exactly representable in bf16.  Weights are bf16 bits (uint16_t) as in the
 * checkpoint.  All functions are single-threaded and deterministic except where a `pool`
 * argument is taken (then results are still bit-identical for any thread count: each output
 * element is computed by exactly one thread with a fixed summation order).
 * We rejected a generic tensor type: each op states its shapes in its comment.
 */
#ifndef SM_CPU_OPS_H
#define SM_CPU_OPS_H
#include <stdint.h>
#include "weights.h"

struct sm_pool; /* thread pool (src/cpu/pool.h); NULL = run on the calling thread */

/* out [n, d] = x * rsqrt(mean(x^2) + eps) * (w ? w : 1) per row of x [n, d]; if round, r16. */
void ref_rms(const float *x, int n, int d, const float *w, float eps, int round, float *out);
/* y [n, m] = r16(sum_k bf16(x[i,k]) * W[j,k]), f32 accumulation in k order; W [m, k] bf16. */
void ref_mm(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int m, float *y);
/* Same with an f32 matrix and no rounding (router logits): y [n, m] = x [n, k] @ W [m, k]^T. */
void ref_mm_f32(struct sm_pool *p, const float *x, int n, int k, const float *W, int m, float *y);
/* RoPE (rotate-half) in place on h heads of D values at position pos, r16 output. */
void ref_rope(float *x, int h, int D, int pos, double theta);
/* Attention of one query row: q [nH, D] (bf16-exact) at position pos over keys 0..pos of the
 * request (k > pos - window when window > 0), K/V read from the paged cache
 * kv_layer [nblocks][nKV][16][128] bf16 through table (the request's block table).
 * out [nH, D] f32 (unnormalized attention output, before the output norm). */
void ref_attention(const float *q, int nH, int nKV, int D, const uint16_t *kv_layer,
                   const int *table, int pos, int window, float scale, float *out);
/* Router + top-K: sc = sigmoid(logits * m_o); idx = top-K of sc + bias, ties to the lowest id;
 * w = sc[idx] / (sum sc[idx] + 1e-15) * route_scale.  xf [H] f32, router [E, H] f32. */
void ref_route(const sm_config *c, const float *xf, const float *router, const float *bias,
               int *idx, float *w);
/* One route of one row: h1 [Hm] (bf16-exact) through expert e of layer l:
 * gu = mm(h1, gate_up), a = r16(silu(gate) * up), y = mm(a, down),
 * t = r16(y * post_norm), yn [Hm] = t * rsqrt(mean(t^2) + 1e-8) (f32, not rounded). */
void ref_expert(const sm_model *m, int l, int e, const float *h1, float *yn);
/* MoE branch of n rows (SPEC.md section 6) from xf [n, H] (bf16-exact) to f [n, H] (bf16-exact);
 * also returns idx [n, K], w [n, K], h1 [n, Hm] and m [n, Hm] (= r16(sum_k w_k yn_k)) when
 * those pointers are non-NULL (tests compare GPU stages against them). */
void ref_moe(struct sm_pool *p, const sm_model *m, int l, const float *xf, int n, float *f,
             int *idx, float *w, float *h1, float *mm_out);
/* Final logits of n rows from the residual stream s [n, H]: h = r16(rms(r16(s), final_norm)),
 * raw = h . lm_head[v] (f32), logits = c * tanh(raw * m_o / c); ids >= vocab_used -> -inf.
 * logits [n, V]; argmax [n] (ref_argmax_row of each row's ids < vocab_used) when non-NULL. */
void ref_logits(struct sm_pool *p, const sm_model *m, const float *s, int n, float *logits, int *argmax);

/* ---- Additions (CPU engine): the building blocks the functions above are made of. ---- */

/* The one f32 dot product of the reference: 8 lanes, lane u sums a[i]*b[i] for i = u mod 8 in
 * increasing i, lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), then the n % 8 tail in order.
 * Every mm / attention score / rms sum of squares above uses it (so gcc vectorizes it). */
float ref_dot(const float *a, const float *b, int n);
/* Routing from router logits [E] (= xf @ router^T): the second half of ref_route. */
void ref_topk(const sm_config *c, const float *logits, const float *bias, int *idx, float *w);
/* Dequantize row `row` of expert matrix `which` (0: gate_up, 1: down) of expert e of layer l
 * into out [Hm or I]: the same values as sm_expert_row (bf16-exact), our own fast path. */
void ref_expert_row(const sm_model *m, int l, int e, int which, int row, float *out);
/* Attention of ONE query head: q [D] (bf16-exact) of query head h, reading KV head kvh, keys
 * lo..pos (lo = max(0, pos - window + 1) when window > 0, else 0).  scores: scratch of at
 * least pos + 1 floats.  out [D] f32 unnormalized.  ref_attention loops this over heads. */
void ref_attention_head(const float *q, int nKV, int kvh, int D, const uint16_t *kv_layer,
                        const int *table, int pos, int window, float scale, float *scores, float *out);

/* Workspace of ref_moe_ws_run (buffers grow to the largest n seen; free with ref_moe_ws_free).
 * Zero-initialize before first use. */
typedef struct ref_moe_ws {
    int cap;        /* rows the buffers hold */
    int E, K, Hm, I;/* dims the buffers were sized for */
    float *logits;  /* [cap, E] router logits */
    int *idx;       /* [cap, K] routes (used when the caller passes idx == NULL) */
    float *w;       /* [cap, K] route weights (idem) */
    float *h1;      /* [cap, Hm] pooled, normed expert input */
    float *m;       /* [cap, Hm] weighted sum of routes */
    float *gu;      /* [cap*K, 2I] gate_up outputs, by expert-sorted slot */
    float *a;       /* [cap*K, I] silu(gate) * up */
    float *y;       /* [cap*K, Hm] down outputs, then yn in place */
    int *off;       /* [E + 1] first slot of each expert */
    int *route_slot;/* [cap*K] slot of each route id */
    int *active;    /* [E] experts with at least one route */
    int *cur;       /* [E] placement cursor of each expert */
    int *slot_row;  /* [cap*K] row of each slot */
} ref_moe_ws;
/* ref_moe with a caller-owned workspace (the CPU backend keeps one for its lifetime). */
int ref_moe_ws_run(struct sm_pool *p, const sm_model *m, int l, const float *xf, int n, float *f,
                   int *idx, float *w, float *h1, float *mm_out, ref_moe_ws *ws, sm_err *e);
/* Size ws for n rows of m's config (done by ref_moe_ws_run too). */
int ref_moe_ws_reserve(ref_moe_ws *ws, const sm_config *c, int n, sm_err *e);
void ref_moe_ws_free(ref_moe_ws *ws);
/* Greedy id of one logits row l [n]: the lowest id among the maxima; -1 when any l[v] is NaN
 * or +-Inf, or n < 1.  The argmax of every backend answers -1 for such a row (backend.h), and
 * the engine turns it into an error naming the step. */
int ref_argmax_row(const float *l, int n);
/* ref_logits from h [n, H] = r16(rms(r16(s), final_norm)) already computed (no allocation). */
void ref_logits_h(struct sm_pool *p, const sm_model *m, const float *h, int n, float *logits, int *argmax);

/* ---- CPU backend debug trace (src/cpu/forward.c) ---- */
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

/* ---- CPU world backend debug hooks (src/cpu/world.c, sm_world_backend_create) ---- */
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
