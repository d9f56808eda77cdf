/* layer.h: one rank of the CPU forward (docs/model.md sections 4-6 and 9): its state and the
 * one layer loop that both CPU backends run.
 *
 * The single-rank backend (forward.c) is the W = 1 case: a shard of the whole model, a
 * built-in single-rank communicator whose operations are identities, the caller's thread
 * and its pool.  The world backend (world.c) runs W of these ranks on W threads over
 * comm_cpu.c.  The loop, the stage order, the rounding points and the debug trace are the
 * same code for both, and every number in it comes from an op of ops.h.
 * We rejected keeping a second copy of the layer loop for W = 1 (two loops drift: a fix to
 * one silently leaves the other wrong).
 */
#ifndef SM_CPU_LAYER_H
#define SM_CPU_LAYER_H
#include <stdint.h>
#include "backend/backend.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "backend/step.h"
#include "cpu/debug.h"
#include "cpu/ops.h"
#include "cpu/pool.h"

#define CPU_FINALIZE_ROWS 64 /* TP default: steps of at least this many rows finalize token-sharded */

/* Which trace stages a rank emits (a mask). */
enum {
    CPU_TRACE_REP = 1,    /* replicated stages: "s" "x" "a" "s_att" "xf" "route_idx" "route_w"
                             "h1" "m" "f" "s_ffn" "h" */
    CPU_TRACE_LOCAL = 2,  /* per-rank stages: "q" "k" "v" "g" "qn" "kn" "att" "o" */
    CPU_TRACE_ARGMAX = 4  /* "argmax" [n, 1] at layer L */
};

typedef struct cpu_rank {
    const sm_model *m;           /* the whole model (replicated tensors are read from it) */
    char name[48];               /* "cpu backend" | "cpu world rank r": error message prefix */
    int rank;                    /* this rank, 0..W-1 */
    int finalize_rows;           /* TP: steps of at least this many rows finalize token-sharded */
    sm_kv_shape made;            /* the cache geometry the rank was made for */
    sm_shard sh;                 /* this rank's views of the model */
    sm_comm *comm;               /* this rank's communicator handle (not owned) */
    sm_comm solo;                /* the W = 1 communicator when none is given */
    sm_pool *pool;               /* this rank's helper threads, NULL = its own thread only */
    int nthreads;                /* threads working for this rank (1 without a pool) */
    uint16_t *kvp;               /* [L, nblocks, nKVl, 16, 2D] bf16 pages of this rank's KV heads */
    float *scores;               /* [nthreads, max_len] attention score scratch per thread */
    int cap;                     /* rows the activation buffers hold */
    float *s, *x, *a, *xf, *f;   /* [cap, H] residual, normed input, attention out, MoE in, MoE out */
    float *q, *g, *att, *o;      /* [cap, nHl*D] local queries, gates, attention before (kept
                                    for the trace only) / after its output norm and gate */
    float *k, *v;                /* [cap, nKVl*D] local K, V */
    int64_t *slot;               /* [cap] cache slot of each row */
    float *rl;                   /* [cap, E] router logits */
    int *idx;                    /* [cap, K] routes */
    float *rw;                   /* [cap, K] route weights */
    float *hp;                   /* [cap, np] this rank's pooler rows */
    float *h1;                   /* [cap, Hm] pooled, normed expert input */
    float *mo;                   /* [cap, Hm] weighted route sum m */
    float *fp;                   /* [cap, nu] this rank's unpooler rows */
    float *ymine;                /* [cap*K, Hm] token-sharded finalize (TP only): this rank's
                                    routes, summed */
    float *mmine;                /* [cap, Hm] token-sharded finalize (TP only): its rows of m */
    ref_moe_ws ws;               /* the expert ops' workspace (y by route id, slots) */
    float *lg;                   /* [cap, nv] logits of this rank's vocabulary rows */
    float *lrow;                 /* [V] one row's logits gathered (sm_step.lp_at, nv < V) */
    float *best;                 /* [cap] this rank's best logit per row */
    int *best_id, *am;           /* [cap] its id (-1: none, -2: non-finite); the global argmax */
    float *tr;                   /* [cap*K] route ids / argmax as floats for the trace */
    sm_world_trace_fn trace;     /* debug hook, or NULL */
    void *trace_arg;
    int trace_kinds;             /* CPU_TRACE_* mask of the stages passed to trace */
} cpu_rank;

/* Rank `rank` of `world`: its shard (layout moe), KV pages for kv's geometry, `threads`
 * threads (0 = online cores, 1 = the calling thread only), activations for `rows` rows.
 * comm NULL: the built-in single-rank communicator (world must be 1).  `name` prefixes its
 * error messages.  On error r is freed. */
int cpu_rank_init(cpu_rank *r, const char *name, const sm_model *m, int world, int rank, sm_moe_layout moe,
                  sm_comm *comm, const sm_kv *kv, int threads, int rows, sm_err *e);
void cpu_rank_free(cpu_rank *r);
/* Install (fn != NULL) or remove the debug trace: stages of the `kinds` mask (CPU_TRACE_*). */
void cpu_rank_trace(cpu_rank *r, sm_world_trace_fn fn, void *arg, int kinds);
/* This rank's part of one step (checked first with sm_step_check against r->made; nrows > 0):
 * every layer, logits and argmax; rank 0 writes the step's outputs.  Collective over the
 * communicator. */
int cpu_rank_step(cpu_rank *r, const sm_step *st, sm_err *e);

#endif
