/* ops.h: the CPU reference, ONE family of ops: one op per GPU kernel (fused ones included),
 * each the oracle of that kernel's test, and the steps the CPU layer loop (layer.c) composes.
 *
 * Every op states its math (citing "docs/model.md section N", "the spec" below), its shapes
 * and its rounding points.  Activations are f32 arrays holding the values the spec names;
 * where the spec rounds (r16), the op rounds, so an output marked "bf16-exact" holds values exactly
 * representable in bf16.  Weights are bf16 bits (uint16_t) as in the checkpoint, or expert
 * views (shard.h) in their storage format.  Every sum of products is ref_dot's fixed order
 * (docs/model.md section 3, ours), so an output never depends on how rows are batched, which
 * other rows share a step, the page layout of the cache, or the thread count.  Ops taking a pool
 * split OUTPUT elements (weight rows, experts, (row, head) items) over its threads, never a
 * sum: their results are bit-identical for any thread count.  Ops taking an item range
 * [lo, hi) let the caller's pool split them (same guarantee).
 *
 * The files, one family each: ops_mm.c (dot, weight rows, matmuls), ops_norm.c (embedding,
 * norms, residual boundaries), ops_attn.c (QK norm + RoPE + KV insert, attention + output
 * gate), ops_moe.c (router, experts, route sum, the MoE branch), ops_logits.c (lm_head,
 * softcap, argmax).
 *
 * GPU kernel (src/cuda/ops/ops.h, moe.h)   CPU op
 *   sm_k_embed                             ref_embed (= ref_embed_rows + ref_embed_norm)
 *   sm_k_post_attn                         ref_post_attn
 *   sm_k_post_ffn                          ref_post_ffn
 *   sm_k_rms_bf16                          ref_rms (round = 1)
 *   sm_k_mm, _small, _blas, _path          ref_mm
 *   sm_k_mm_f32w                           ref_mm_f32
 *   sm_k_route                             ref_route (= ref_mm_f32 + ref_topk per row)
 *   sm_k_qk_rope_kv                        ref_qk_rope_kv
 *   sm_k_attention, _prefill               ref_attention (= ref_attention_items over all items)
 *   sm_k_logits, _path                     ref_logits_h (= ref_logits_rows + ref_argmax_row)
 *   sm_k_mask_rows                         ref_mask_row + ref_argmax_row
 *   sm_k_logprobs                          ref_logprobs_row
 *   sm_cuda_moe_forward                    ref_moe_experts (= ref_moe_group, ref_moe_ffn,
 *                                          ref_expert_norm, ref_route_sum, ref_round)
 * The stock MoE branch (route, pooler, pre-expert norm, experts, unpooler) is ref_moe.
 * We rejected a generic tensor type: each op states its shapes, and a kernel test reads its
 * reference off the op's argument list.
 */
#ifndef SM_CPU_OPS_H
#define SM_CPU_OPS_H
#include <stdint.h>
#include "parallel/shard.h"
#include "model/weights.h"
#include "backend/backend.h"

struct sm_pool; /* thread pool (src/cpu/pool.h); NULL = run on the calling thread */

/* ==== dot products, weight rows, matmuls (ops_mm.c) ===================================== */

/* The one f32 dot product of the reference (docs/model.md section 3, ours): 8 lanes, lane u sums
 * a[i]*b[i] for i = u mod 8 in increasing i, lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), then
 * the n % 8 tail in order.  Every product below equals it bit for bit. */
float ref_dot(const float *a, const float *b, int n);

/* One weight row in its storage format, decoded on the fly by ref_wrow_dot. */
enum { REF_W_BF16, REF_W_F32, REF_W_FP8, REF_W_MXFP4 };
typedef struct ref_wrow {
    int kind;          /* REF_W_* */
    const void *w;     /* the row: uint16_t [k] | float [k] | uint8_t e4m3 [k] | MXFP4 codes [k/2] */
    const uint8_t *s;  /* MXFP4: e8m0 scales [k/32] of the row; else NULL */
    float scale;       /* FP8: the row's scale; else unused */
} ref_wrow;

/* out[o_r * ldo] = ref_dot(x_r, dequant(w), k), not rounded, for nx activation rows
 * x_r = x + (rows ? rows[r] : r) * ldx and o_r = orows ? orows[r] : r.  The weight row is
 * decoded once for every 16 activation rows.  Dequantized values (docs/model.md section 7):
 * bf16 and f32 as stored, FP8 r16(e4m3 * scale), MXFP4 e2m1 * 2^(s - 127) (exact). */
void ref_wrow_dot(const ref_wrow *w, int k, const float *x, int64_t ldx, const int *rows, int nx, float *out,
                  int64_t ldo, const int *orows);
/* W4A4 (docs/model.md section 6): activation rows rounded to MXFP4, held as the unscaled e2m1
 * values v [rows, ld] (0, +-0.5, .. +-6) and their scale bytes s [rows, ld / 32]. */
typedef struct ref_mxrows {
    float *v;
    uint8_t *s;
    int64_t ld;        /* values per row, a multiple of 32 */
} ref_mxrows;
/* Row r of x [k] (bf16-exact, k % 32 == 0) rounded to MXFP4 into row r of q (codec.h's
 * quantizer: one scale byte per 32 values, the "even" amax rule). */
void ref_mx_round_row(const float *x, int k, ref_mxrows *q, int64_t r);
/* The W4A4 product of MXFP4 weight row w (kind REF_W_MXFP4) with activation rows of q, as
 * ref_wrow_dot (rows, orows, ldo alike): for each 32-block b in increasing order the exact
 * block sum S_b = sum of e2m1 products (multiples of 1/4, |S_b| <= 1152) times
 * 2^(e_w + e_a) (exact unless under f32's range: then ldexpf's one rounding) is added to an
 * f32 accumulator. */
void ref_wrow_dot_mx(const ref_wrow *w, int k, const ref_mxrows *q, const int *rows, int nx, float *out, int64_t ldo,
                     const int *orows);
/* out [k] = the dequantized values of weight row w (those ref_wrow_dot multiplies). */
void ref_wrow_decode(const ref_wrow *w, int k, float *out);
/* Row `row` of an expert matrix view (shard.h) of format fmt, as a ref_wrow. */
ref_wrow ref_wrow_view(sm_expert_fmt fmt, const sm_shard_mat *v, int row);

/* sm_k_mm (every path), docs/model.md section 3:
 * y [n, m] = mm(x, W) = r16(sum_k bf16(x[i,k]) * W[j,k]), f32 accumulation.
 * x [n, k] f32 (bf16-exact, else rounded first as bf16(x)); W [m, k] bf16.  One rounding
 * point: the output. */
void ref_mm(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int m, float *y);
/* sm_k_mm_f32w (the router product): y [n, m] = x [n, k] @ W [m, k]^T, f32 weights, f32
 * accumulation, NOT rounded (docs/model.md section 6: router logits). */
void ref_mm_f32(struct sm_pool *p, const float *x, int n, int k, const float *W, int m, float *y);
/* A rank's partial product (docs/model.md section 9, o_proj over its heads' columns):
 * y [n, m] = bf16(x) [n, k] @ W^T with W row j at W + j*ldw (bf16, k of its values used), f32, NOT
 * rounded (the caller sums the ranks' partials, then rounds: r16 of the sum is ref_mm). */
void ref_mm_partial(struct sm_pool *p, const float *x, int n, int k, const uint16_t *W, int64_t ldw, int m, float *y);
/* x[i] = r16(x[i]) for i in [0, n): a rounding point of the spec applied to a whole tensor. */
void ref_round(float *x, int64_t n);

/* ==== embedding, norms, residual boundaries (ops_norm.c) ================================ */

/* rms (docs/model.md section 3): out [n, d] = x * rsqrt(mean(x^2) + eps) * (w ? w : 1) per
 * row of x [n, d], f32; round != 0: r16 of each output (sm_k_rms_bf16: the pre-expert norm).
 * out == x allowed. */
void ref_rms(const float *x, int n, int d, const float *w, float eps, int round, float *out);
/* Embedding rows (docs/model.md section 4, "Embedding"; section 9: vocabulary-sharded):
 * s [n, H] row i = embed row tokens[i] - v0 (bf16 -> f32, exact) when that token lies in
 * [v0, v0 + nv), else zeros (a rank fills the rows of its vocabulary block).  embed [nv, H]
 * bf16: rows v0.. . */
void ref_embed_rows(const uint16_t *embed, int v0, int nv, int H, const int *tokens, int n, float *s);
/* The embedding norms (docs/model.md section 4): s = r16(rms(s, -, eps)) in place
 * (weightless), then x = r16(rms(s, in_norm, eps)).  s, x [n, H] (x != s);
 * in_norm [H] = eff(input_layernorm_0). */
void ref_embed_norm(float *s, int n, int H, const float *in_norm, float eps, float *x);
/* sm_k_embed: ref_embed_rows of the whole vocabulary (embed [V, H]) then ref_embed_norm.
 * Rounding points: s and x. */
void ref_embed(const uint16_t *embed, int V, int H, const int *tokens, int n, const float *in_norm, float eps,
               float *s, float *x);
/* sm_k_post_attn, the post-attention boundary (docs/model.md section 4), per row:
 *   s  = alpha * s + beta * r16(a * rsqrt(mean(a^2) + post_eps))     (s f32 [n, H], in place)
 *   xf = r16(rms(s, pre_ffn, eps))                                   (xf [n, H], bf16-exact)
 * a [n, H] bf16-exact (o_proj output); alpha, beta [H] (post_attention_residual_gate);
 * pre_ffn [H] = eff(pre_feedforward_layernorm).  Rounding points: the normed branch, xf.
 * xf must not alias s or a. */
void ref_post_attn(float *s, const float *a, const float *alpha, const float *beta, const float *pre_ffn, int n,
                   int H, float post_eps, float eps, float *xf);
/* sm_k_post_ffn, the post-FFN boundary and the next norm (docs/model.md section 4), per row:
 *   t = r16(f * post_ffn)                                            (gain BEFORE the norm)
 *   s = alpha * s + beta * r16(t * rsqrt(mean(t^2) + post_eps))      (s f32 [n, H], in place)
 *   last == 0: x = r16(rms(s, norm, eps))        norm = eff(input_layernorm of layer l + 1)
 *   last != 0: x = r16(rms(r16(s), norm, eps))   norm = the final norm weight as is: x = h
 * f [n, H] bf16-exact (unpooler output); post_ffn [H] = eff(post_feedforward_layernorm);
 * alpha, beta [H] (post_feedforward_residual_gate); x [n, H] bf16-exact, used as the scratch of
 * t (x must not alias s or f).  Rounding points: t, the normed branch, r16(s) (last), x. */
void ref_post_ffn(float *s, const float *f, const float *post_ffn, const float *alpha, const float *beta,
                  const float *norm, int last, int n, int H, float post_eps, float eps, float *x);

/* ==== attention (ops_attn.c) ============================================================= */

/* RoPE (docs/model.md section 4, "RoPE"), rotate-half in place on h heads of D values at
 * position pos: inv_freq[j] = theta^(-2j/D) in double rounded to f32, angle = pos * inv_freq[j]
 * (f32), cos and sin in double of the angle rounded to f32; out = r16 of the rotated pair. */
void ref_rope(float *x, int h, int D, int pos, double theta);
/* sm_k_qk_rope_kv, for each row i of n (docs/model.md sections 4 and 5):
 *   q[i, h] = rope(r16(rms(q[i, h], -, eps)), pos[i])    for the nh query heads, in place
 *   k[i, h] = rope(r16(rms(k[i, h], -, eps)), pos[i])    for the nkv KV heads, in place
 *   kv[slot[i]][h] = (bf16(k[i, h]) | bf16(v[i, h]))     (skipped for slot < 0 or outside)
 * theta <= 0: no RoPE (full-attention layers, NoPE).  q [n, ldq], k and v [n, ldkv] f32
 * (bf16-exact: the projections), heads of D at columns h*D; kv bf16 pages
 * [nblocks][nkv][16][2D] (K | V), slot = page * 16 + pos % 16 (int64 [n]).  Rounding points:
 * the QK norm and RoPE outputs; K and V are stored bf16-exact. */
void ref_qk_rope_kv(float *q, int ldq, float *k, const float *v, int ldkv, int n, int nh, int nkv, int D,
                    const int *pos, const int64_t *slot, double theta, float eps, uint16_t *kv, int nblocks);

/* The inputs of attention over the rows of a step (sm_k_attention's arguments, host side). */
typedef struct ref_att {
    const float *q; int ldq;        /* [n, ldq] queries (QK-normed, roped, bf16-exact), head h
                                       at columns h*D */
    const float *gate; int ldg;     /* [n, ldg] output gates g (bf16-exact), head h at h*D */
    const uint16_t *kv;             /* the layer's pages [nblocks][nkv][16][2D] bf16 (K | V) */
    const int *tables; int max_bpr; /* block tables [requests, max_bpr]: page of block p / 16 */
    const int *row_req, *pos;       /* [n] table row (request) and position of each row */
    int nh, nkv, D;                 /* query heads, KV heads (head h reads h / (nh/nkv)), head
                                       dim (<= 256) */
    int window;                     /* keys a query sees, itself included; 0 = all (full) */
    float scale, eps;               /* score scale qk_scale_factor / sqrt(D); output-norm eps */
} ref_att;
/* Attention with its output norm and gate (docs/model.md sections 4 and 5) for the items
 * [lo, hi) of the n * nh (row i = t / nh, head h = t % nh) pairs:
 *   score_t = (q . k_t) * scale over the keys t in [max(0, pos - window + 1), pos] (f32)
 *   o       = sum_t softmax(score)_t v_t, softmax as exp(score - max) / sum (f32, key order)
 *   out     = r16(rms(o, -, eps) * sigmoid(gate))                       (per head of D)
 * att [n, nh*D] (NULL: not kept) receives o before its norm (f32, for traces); out
 * [n, nh*D] bf16-exact.  scores: scratch of more than pos floats for the item's row.
 * Rounding point: out. */
void ref_attention_items(const ref_att *a, int64_t lo, int64_t hi, float *scores, float *att, float *out);
/* sm_k_attention / sm_k_attention_prefill: ref_attention_items over all n * nh items, split
 * over the pool.  scores: per-thread scratch [sm_pool_nthreads(p), ld_scores], ld_scores >
 * every pos; NULL: allocated here (on out of memory every output is NaN). */
void ref_attention(struct sm_pool *p, const ref_att *a, int n, float *scores, int64_t ld_scores, float *att,
                   float *out);

/* ==== MoE (ops_moe.c) ==================================================================== */

/* Routing of one row from its router logits [E] (docs/model.md section 6):
 * sc = sigmoid(logit * m_o); idx [K] = top-K of sc + bias in selection order (descending,
 * ties to the lowest id); w [K] = sc[idx_k] / (sum_j sc[idx_j] + 1e-15) * route_scale, the
 * sum in route order, f32.  The bias selects, never weighs.  No rounding point. */
void ref_topk(const sm_config *c, const float *logits, const float *bias, int *idx, float *w);
/* sm_k_route: logits [n, E] = xf [n, H] @ router [E, H]^T (ref_mm_f32), then ref_topk per row
 * into idx, w [n, K].  bias [E]. */
void ref_route(struct sm_pool *p, const sm_config *c, const float *xf, int n, const float *router, const float *bias,
               float *logits, int *idx, float *w);

/* The experts an op reads: expert j (global id e0 + j) has gate rows [0, ni) of gate[j], up
 * rows [up0, up0 + ni) of up[j] (each [*, Hm]) and down [Hm, ni] in down[j], as views in format
 * fmt.  ni = I for whole experts, I / W for a rank's TP slice (then y is a partial sum). */
typedef struct ref_experts {
    sm_expert_fmt fmt;                    /* storage format of every expert */
    int e0, ne;                           /* global expert ids [e0, e0 + ne) held */
    int ni;                               /* I columns held */
    const sm_shard_mat *gate, *up, *down; /* [ne] each */
    int up0;                              /* first up row in up[j] (I when up[j] is the whole
                                             gate_up matrix, 0 for a shard's up view) */
    int act_mx;                           /* 1: W4A4 (fmt MXFP4): h1 and a rounded to MXFP4 */
} ref_experts;
/* A rank's experts (EP: whole, TP: slices along I). */
ref_experts ref_experts_of_shard(const sm_shard_experts *X);

/* Workspace of the expert ops (sized by ref_moe_ws_reserve; zero-initialize before first use;
 * free with ref_moe_ws_free).  Slots are the routes grouped by expert, each expert's slots in
 * route id order (route id r = row * K + k). */
typedef struct ref_moe_ws {
    int cap;         /* routes the buffers hold */
    int ne, ni, Hm;  /* experts, I columns and Hm the buffers were sized for */
    float *gu;       /* [cap, 2*ni] gate | up outputs by slot (r16 applied when read) */
    float *act;      /* [cap, ni] r16(silu(gate) * up) by slot */
    float *y;        /* [cap, Hm] down outputs by ROUTE ID (then yn in place) */
    int *slot_route; /* [cap] route id of each slot */
    int *slot_row;   /* [cap] row (route id / K) of each slot */
    int *off;        /* [ne + 1] first slot of each held expert */
    int *cur;        /* [ne] placement cursor */
    int *active;     /* [ne] held experts with at least one route, ascending */
    int nact;        /* entries of active */
    ref_mxrows hq;   /* W4A4: [cap, Hm] the h1 rows rounded to MXFP4 (by row) */
    ref_mxrows aq;   /* W4A4: [cap, ni] the act rows rounded to MXFP4 (by slot) */
} ref_moe_ws;
int ref_moe_ws_reserve(ref_moe_ws *ws, int routes, int ne, int ni, int Hm, sm_err *e);
void ref_moe_ws_free(ref_moe_ws *ws);

/* Group the routes idx [nroutes] (K per row) whose expert lies in [e0, e0 + ne) by expert
 * (a counting sort, stable in route id): fills ws's slots, off, active, nact; routes of other
 * experts (another rank's, or an invalid id) get no slot.  Returns the slots filled. */
int ref_moe_group(ref_moe_ws *ws, const int *idx, int nroutes, int K, int e0, int ne);
/* The expert FFN of every grouped slot (docs/model.md section 6), experts split over the pool:
 *   gu = mm(h1[row], gate_up[e]) (gate, up: [ni] each)
 *   a  = r16(silu(gate) * up)
 *   y[route] = h1-row's a . down[e] rows, f32 NOT rounded ([Hm]; with a TP slice a partial
 *              sum over its ni columns: the caller sums the ranks, then ref_expert_norm)
 * With X->act_mx (W4A4) both products take their activations rounded to MXFP4 (h1 per row,
 * a per slot: a TP slice holds whole 32-blocks) and ref_wrow_dot_mx's block sums.
 * h1 [rows, Hm] bf16-exact (the pre-expert norm output).  Rounding points: gate, up, a. */
void ref_moe_ffn(struct sm_pool *p, const ref_experts *X, const float *h1, int Hm, ref_moe_ws *ws);
/* The post-expert norm of one complete route output y [Hm], in place (docs/model.md section 6):
 * t = r16(r16(y) * pn) (the mm rounding of y, then the gain BEFORE the norm);
 * yn = t * rsqrt(mean(t^2) + post_eps), f32.  pn [Hm] = eff(post_expert_norm). */
void ref_expert_norm(const float *pn, int Hm, float post_eps, float *y);
/* m [n, Hm] row i = sum over k = 0..K-1 of w[i*K + k] * yn[i*K + k] in route order, f32, NOT
 * rounded (docs/model.md section 6; section 9: with idx given, only the routes of experts
 * [e0, e0 + ne) count: a rank's partial m; idx NULL: every route).  yn [n*K, Hm] by route id. */
void ref_route_sum(const float *yn, const float *w, const int *idx, int e0, int ne, int n, int K, int Hm, float *m);
/* sm_cuda_moe_forward (docs/model.md section 6, from h1 to m) on whole experts of layer l of m:
 * m_out [n, Hm] = r16(sum_k w_k * yn_k) in route order from h1 [n, Hm] (bf16-exact), routes
 * idx [n, K] (ids outside [0, E) contribute nothing) and weights w [n, K].  Uses
 * m->cfg (E, K, Hm, I, post_eps), m->layers[l].ex and .post_expert_norm only.  0, or -1 with
 * e filled (out of memory). */
int ref_moe_experts(struct sm_pool *p, const sm_model *m, int l, const float *h1, const int *idx, const float *w,
                    int n, float *m_out, sm_err *e);
/* One route alone (docs/model.md section 6): h1 [Hm] (bf16-exact) through whole expert e of
 * layer l: yn [Hm] = the post-expert-normed output, f32 (ref_moe_ffn of one slot, ref_expert_norm).
 * What ref_moe_experts weighs and sums; tests check the grouping against it. */
void ref_expert(const sm_model *m, int l, int e, const float *h1, float *yn);
/* The whole MoE branch of layer l (docs/model.md section 6), f = moe(xf): ref_route, h1 =
 * r16(rms(mm(xf, pooler), pre_expert_norm)), ref_moe_experts, f = mm(m, unpooler).
 * xf, f [n, H] bf16-exact; idx, w [n, K], h1, m_out [n, Hm] are also returned when non-NULL
 * (GPU tests feed their stages with them).  On out of memory f is NaN. */
void ref_moe(struct sm_pool *p, const sm_model *m, int l, const float *xf, int n, float *f, int *idx, float *w,
             float *h1, float *m_out);
/* Row `row` of matrix `which` (0: gate_up [2I, Hm], 1: down [Hm, I]) of expert e of layer l,
 * dequantized into out [Hm or I]: the values ref_wrow_dot multiplies (= sm_expert_row). */
void ref_expert_row(const sm_model *m, int l, int e, int which, int row, float *out);

/* ==== logits (ops_logits.c) ============================================================== */

/* The logits epilogue of one raw logit (docs/model.md section 4): c * tanh(raw * m_o / c), or
 * raw * m_o without a softcap (c <= 0).  Non-finite rule (ours): a raw logit that is NaN or
 * +-Inf gives a NaN logit, softcap or not: c * tanh(+-Inf) would be a finite +-c and hide an
 * Inf that reached the lm_head (a weight or a final-norm value), so the row's argmax would not
 * be -1.  The GPU logits epilogue (src/cuda/ops/logits.cuh) must apply the same rule. */
float ref_logit(const sm_config *c, float raw);
/* Logits of the lm_head rows [v0, v0 + nv) (a rank's vocabulary block; v0 = 0, nv = V: all):
 * logits [n, nv] column j = ref_logit(h . lm_rows[j]) (raw f32, not rounded), -inf for ids
 * v0 + j >= vocab_used.  h [n, H] bf16-exact (the final norm output); lm_rows [nv, H] bf16.
 * Vocabulary rows are split over the pool. */
void ref_logits_rows(struct sm_pool *p, const sm_config *c, const float *h, int n, const uint16_t *lm_rows, int v0,
                     int nv, float *logits);
/* Greedy id of one logits row l [n] (docs/model.md section 4): the lowest id among the maxima;
 * -1 when any l[v] is NaN or +Inf, when every l[v] is -inf, or n < 1.  -inf is the logit of an
 * id a constraint's mask forbids (ref_logit never makes it).  The argmax of every backend
 * answers -1 for such a row (backend.h), and the engine turns it into an error naming the step. */
int ref_argmax_row(const float *l, int n);
/* 1 when l [n] holds a NaN or +Inf. */
int ref_row_bad(const float *l, int n);
/* The constraint mask of a row (backend.h: sm_step.mask): the ids v0 .. v0 + nv - 1 of row
 * [nv] whose bit in mask is clear become -inf.  Kernel: sm_k_mask_rows (cuda/ops/ops.h). */
void ref_mask_row(float *row, const uint32_t *mask, int v0, int nv);
/* The logprob summary (backend.h: sm_lp_sum) of one logits row l [n] (n = vocab_used): lmax, lse
 * in double (the sum in id order), the min(k, n) largest logits with their ids, ties to the
 * lowest id (k <= SM_LP_MAX_TOP), tok_l = l[tok] (-inf for tok outside [0, n)) and tok_rank (tok's
 * place in that order, 1..n; 0 for tok outside [0, n)); out->bad = 1, tok_l and tok_rank 0 for a
 * row ref_argmax_row refuses. */
void ref_logprobs_row(const float *l, int n, int k, int tok, sm_lp_sum *out);
/* sm_k_logits: ref_logits_rows over the whole vocabulary of m (logits [n, V]), then argmax [n]
 * (ref_argmax_row over ids < vocab_used) when non-NULL. */
void ref_logits_h(struct sm_pool *p, const sm_model *m, const float *h, int n, float *logits, int *argmax);

#endif
