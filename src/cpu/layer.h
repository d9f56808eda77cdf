/* layer.h: one rank of the CPU forward (SPEC.md sections 4-6 and 9): its state and the one
 * layer loop that both CPU backends run.
 *
 * The single-rank backend (forward.c) is the W = 1 case: a shard of the whole model, a
 * built-in single-rank communicator whose operations are identities, the caller's thread.
 * The world backend (world.c) runs W of these ranks on W threads over comm_cpu.c.  The loop,
 * the stage order, the rounding points and the debug trace are the same code for both; only
 * the kernel of three products may differ (see cpu_kernels).
 * We rejected keeping a second copy of the layer loop for W = 1 (two loops drift: a fix to
 * one silently leaves the other wrong) and sending W = 1 through the sharded kernels (they
 * decode a weight row per output and dot it with one activation row at a time: a verify step
 * of 8 rows on the mini preset takes 1.5x as long as with ops.c's grouped kernels).
 */
#ifndef SM_CPU_LAYER_H
#define SM_CPU_LAYER_H
#include <stdint.h>
#include "backend.h"
#include "comm.h"
#include "shard.h"
#include "cpu/ops.h"
#include "cpu/pool.h"

#define CPU_FINALIZE_ROWS 64 /* TP default: steps of at least this many rows finalize token-sharded */

/* How a rank computes o_proj, the MoE branch and the lm_head (everything else is common). */
typedef enum cpu_kernels {
    CPU_KERNELS_SHARDED = 0, /* per-rank slices: strided o_proj partial, experts of the shard,
                                vocabulary block; any W (the world backend, W = 1 included) */
    CPU_KERNELS_GROUPED = 1  /* the whole model through ops.c (ref_mm, ref_moe_ws_run,
                                ref_logits_h); W = 1 only (the single-rank backend) */
} cpu_kernels;

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
    cpu_kernels kern;            /* product kernels */
    int finalize_rows;           /* TP: steps of at least this many rows finalize token-sharded */
    int nblocks, max_len;        /* KV pages per layer, positions per request */
    sm_shard sh;                 /* this rank's views of the model */
    sm_comm *comm;               /* this rank's communicator handle (not owned) */
    sm_comm solo;                /* the W = 1 communicator when none is given */
    sm_pool *pool;               /* this rank's helper threads, NULL = its own thread only */
    int nthreads;                /* threads working for this rank (1 without a pool) */
    uint16_t *kvp;               /* [L, nblocks, nKVl, 16, 2D] bf16 pages of this rank's KV heads */
    int cap;                     /* rows the activation buffers hold */
    float *s, *x, *a, *xf, *f;   /* [cap, H] residual, normed input, attention out, MoE in, MoE out */
    float *q, *g, *o;            /* [cap, nHl*D] local query heads, gates, attention outputs */
    float *k, *v;                /* [cap, nKVl*D] local K, V */
    int *idx;                    /* [cap, K] routes */
    float *rw;                   /* [cap, K] route weights */
    float *lg;                   /* [cap, nv] logits of this rank's vocabulary rows */
    float *best;                 /* [cap] this rank's best logit per row */
    int *best_id, *am;           /* [cap] its id (-1: none); the global argmax */
    float *tr;                   /* [cap*K] route ids / argmax as floats for the trace */
    float *scores;               /* [nthreads, max_len] attention score scratch per thread */
    /* sharded kernels only (NULL with grouped ones) */
    float *rl;                   /* [cap, E] router logits */
    float *hp;                   /* [cap, np] this rank's pooler rows */
    float *h1;                   /* [cap, Hm] pooled, normed expert input */
    float *mo;                   /* [cap, Hm] weighted route sum m */
    float *fp;                   /* [cap, nu] this rank's unpooler rows */
    float *gu;                   /* [cap*K, 2*ni] gate | up outputs by slot */
    float *act;                  /* [cap*K, ni] silu(gate) * up by slot */
    float *y;                    /* [cap*K, Hm] down outputs by route id (row*K + k) */
    float *ymine;                /* [cap*K, Hm] token-sharded finalize: this rank's routes, summed */
    float *mmine;                /* [cap, Hm] token-sharded finalize: this rank's rows of m */
    int *slot_route;             /* [cap*K] route id of each slot */
    int *off;                    /* [ne + 1] first slot of each local expert */
    int *cur;                    /* [ne] placement cursor */
    int *active;                 /* [ne] local experts with routes */
    int maxw;                    /* floats of one decoded weight row */
    float *rowbuf;               /* [nthreads, maxw] decoded weight rows per thread */
    /* grouped kernels only */
    ref_moe_ws ws;               /* ops.c's MoE workspace (router, h1, m, expert slots) */
    sm_world_trace_fn trace;     /* debug hook, or NULL */
    void *trace_arg;
    int trace_kinds;             /* CPU_TRACE_* mask of the stages passed to trace */
} cpu_rank;

/* Rank `rank` of `world`: its shard (layout moe), KV pages for kv's page count and length,
 * `threads` threads (0 = online cores, 1 = the calling thread only), activations for `rows`
 * rows.  comm NULL: the built-in single-rank communicator (world must be 1).  kern GROUPED
 * needs world 1.  `name` prefixes its error messages.  On error r is freed. */
int cpu_rank_init(cpu_rank *r, const char *name, const sm_model *m, int world, int rank, sm_moe_layout moe,
                  sm_comm *comm, cpu_kernels kern, const sm_kv *kv, int threads, int rows, sm_err *e);
void cpu_rank_free(cpu_rank *r);
/* Install (fn != NULL) or remove the debug trace: stages of the `kinds` mask (CPU_TRACE_*). */
void cpu_rank_trace(cpu_rank *r, sm_world_trace_fn fn, void *arg, int kinds);
/* Check every row of a step against the model and a rank's cache before anything runs;
 * `who` starts the message ("cpu step", "cpu world step"). */
int cpu_step_check(const cpu_rank *r, const sm_step *s, const char *who, sm_err *e);
/* This rank's part of one step (checked first with cpu_step_check; nrows > 0): every layer,
 * logits and argmax; rank 0 writes the step's outputs.  Collective over the communicator. */
int cpu_rank_step(cpu_rank *r, const sm_step *st, sm_err *e);

#endif
