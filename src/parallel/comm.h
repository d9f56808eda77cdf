/* comm.h: the cross-rank communication a sharded forward needs (docs/model.md section 9), named
 * after what the model does at each point, not after the collective that implements it.
 *
 * Every operation is collective: all W ranks call the same operations in the same order with
 * the same shapes (the shapes come from replicated state: the step's rows and the routing),
 * and each returns only when its result is complete on the calling rank.  Sums add the ranks'
 * parts in rank order 0..W-1 whatever order they arrive in (each rank deposits its part in
 * its slot; the reducer adds slots 0, 1, ..., W-1 left to right), so the result is
 * bit-identical on every rank and from run to run.  Gathers place rank r's block at position
 * r; they move bits and never round.  A failed operation returns -1 with one line naming the
 * operation, the layer and the rank, on every rank (no rank is left waiting): a rank that
 * fails between operations calls `abort` so its peers' pending and later calls fail too.
 *
 * Shapes (n = rows of the step, W = world, r = this rank):
 *   embed_gather     rows [n, H]: in, rank r filled the rows whose token lies in its vocab
 *                    block [r*V/W, (r+1)*V/W) (others zero); out, every row from its owner
 *   attn_sum         a [n, H] f32: in, this rank's o_proj partial (its heads' columns, not
 *                    rounded); out, the rank-ordered sum (the caller rounds to bf16)
 *   pooled_gather    blk [n, Hm/W] (pooler rows r*Hm/W..) -> out [n, Hm]
 *   expert_sum       part [rows, width] f32, in place: EP rows = n, width = Hm (partial
 *                    sums of m over this rank's routes); TP rows = n*K, width = Hm (each
 *                    route's partial y over this rank's slice of I, BEFORE the post-expert
 *                    norm)
 *   expert_scatter   TP token-sharded finalize, step 1 (reduce-scatter by token rows):
 *                    part [n, width] -> mine [hi-lo, width] = rank-ordered sum of rows
 *                    [lo, hi) (sm_shard_rows(n, W, r)); width = K*Hm
 *   expert_gather    TP token-sharded finalize, step 3 (all-gather by token rows):
 *                    mine [hi-lo, width] (this rank's finalized rows of m) -> out [n, width]
 *   unpooled_gather  blk [n, H/W] (unpooler rows r*H/W..) -> out [n, H]
 *   vocab_gather     blk [n, V/W] (logits of vocab rows r*V/W..) -> out [n, V]; out may be
 *                    NULL on ranks that do not need the logits (the call stays collective)
 *   vocab_argmax     best [n], best_id [n] (this rank's first maximum among its ids <
 *                    vocab_used, id -1 if it has none, -2 if one of them is NaN or Inf)
 *                    -> out [n] global greedy ids: the first maximum in rank order, i.e. the
 *                    lowest id among equal maxima; -1 when any rank said -2 (backend.h)
 * `layer` tags an operation for messages and consistency checks (-1 before the first layer,
 * L after the last).
 *
 * We rejected exposing raw all-reduce / all-gather entry points: the names say where in the
 * forward a GPU implementation may fuse (the attention sum into the residual boundary, the
 * token-sharded finalize into the expert kernel), and a mismatch report naming
 * "attn_sum at layer 3" is worth more than one naming "allreduce #41".
 */
#ifndef SM_COMM_H
#define SM_COMM_H
#include <stdint.h>
#include "base/err.h"

typedef struct sm_comm sm_comm;

typedef struct sm_comm_ops {
    int (*embed_gather)(sm_comm *cm, const int *tokens, int n, int H, int nv, float *rows, sm_err *e);
    int (*attn_sum)(sm_comm *cm, int layer, float *a, int n, int H, sm_err *e);
    int (*pooled_gather)(sm_comm *cm, int layer, const float *blk, int n, int np, float *out, sm_err *e);
    int (*expert_sum)(sm_comm *cm, int layer, float *part, int rows, int width, sm_err *e);
    int (*expert_scatter)(sm_comm *cm, int layer, const float *part, int n, int width, float *mine, sm_err *e);
    int (*expert_gather)(sm_comm *cm, int layer, const float *mine, int n, int width, float *out, sm_err *e);
    int (*unpooled_gather)(sm_comm *cm, int layer, const float *blk, int n, int nu, float *out, sm_err *e);
    int (*vocab_gather)(sm_comm *cm, const float *blk, int n, int nv, float *out, sm_err *e);
    int (*vocab_argmax)(sm_comm *cm, const float *best, const int *best_id, int n, int *out, sm_err *e);
    /* Fail every pending and later operation of every rank with `why` (a one-line reason). */
    void (*abort)(sm_comm *cm, const char *why);
} sm_comm_ops;

struct sm_comm {
    int rank;                 /* this rank, 0..world-1 */
    int world;                /* ranks in all */
    const sm_comm_ops *ops;   /* the implementation */
    void *impl;               /* its per-rank state */
};

/* ---- CPU implementation (src/cpu/comm_cpu.c): W threads of one process ----
 * Each rank copies its part into its own slot (double-buffered by operation parity, so one
 * barrier per operation suffices), waits on a barrier, then reads the slots it needs in rank
 * order.  Every operation first checks that all ranks called the same operation with the same
 * layer and shapes; a mismatch fails on every rank with both calls named.  Waits are bounded:
 * a rank that waits longer than the timeout fails every rank, naming the ranks missing. */
typedef struct sm_comm_cpu sm_comm_cpu;

/* Shared state for `world` ranks; timeout_s <= 0 means the default (600 s). */
int sm_comm_cpu_create(int world, double timeout_s, sm_comm_cpu **out, sm_err *e);
void sm_comm_cpu_destroy(sm_comm_cpu *w);
/* The handle of rank r (owned by w; one thread uses it at a time). */
sm_comm *sm_comm_cpu_rank(sm_comm_cpu *w, int r);
/* Test hook: before depositing, each rank sleeps a pseudo-random 0..max_us microseconds (or
 * yields when the draw is small), drawn from (seed, rank, operation count): the arrival order
 * changes from seed to seed; results must not.  seed 0 turns it off. */
void sm_comm_cpu_jitter(sm_comm_cpu *w, uint64_t seed, int max_us);
/* After an aborted step, once no rank is inside an operation: forget the abort and start a
 * fresh operation sequence.  Returns 1 if an abort had happened (then *who is the first
 * aborting rank, -1 for a timeout seen by no single culprit, and msg gets its reason). */
int sm_comm_cpu_reset(sm_comm_cpu *w, int *who, char *msg, size_t cap);

#endif
