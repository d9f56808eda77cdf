/* ops.h: the CPU reference, one function per step of SPEC.md sections 3-6.
 *
 * These are the oracle: the CPU backend (forward.c) is built from them, and every GPU kernel
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
 * logits [n, V]; argmax [n] (lowest id on ties) when non-NULL. */
void ref_logits(struct sm_pool *p, const sm_model *m, const float *s, int n, float *logits, int *argmax);

#endif
