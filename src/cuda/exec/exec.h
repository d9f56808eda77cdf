/* exec.h: the per-layer executor interface: what runs the decoder layers of a step on one rank.
 *
 * A rank (cuda/rank/: context, upload, graphs, steps, W ranks) runs a step's embedding and
 * logits itself and hands its decoder layers to an executor, in runs of consecutive layers:
 *  - the stock executor (cuda/stock/): per-op kernels, cuBLAS, the cross-rank exchanges of
 *    cuda/comm/; any layer of any step;
 *  - the monokernel (cuda/mono/): persistent launches; layers [lo, hi) of the graph-form row
 *    buckets it has planned.
 * The rank picks per bucket from --mono (sm_backend_opts.mono: off | on | auto): the monokernel
 * for its layers of a bucket it planned, stock for the rest (cuda/rank/exec.cu).  An executor
 * sees the rank only through a view (sm_exec_view: the weights, buffers, KV cache, step
 * metadata and stream it reads), and the rank sees an executor only through this table
 * (sm_exec: function pointers and their state); neither executor includes the other.  The
 * bench (cuda/bench/) drives an executor's timeline through the trace hooks.
 *
 * Consecutive runs hand the projections (q | k | v | gate) of the layer between them over
 * through the view's buffers: an executor that starts from projections made before it
 * (qkv_in) gets them from the run before, which makes them after its last layer when asked
 * (SM_EXEC_NEXT_QKV) or always (qkv_out); one that reads a layer's projections while it writes
 * the next layer's (qkv_alt) makes every layer of the step alternate two buffers.
 * We rejected the monokernel calling into the stock step through hooks while holding the whole
 * rank context: each could change the other's state, and neither could be read alone.
 */
#ifndef SM_CUDA_EXEC_H
#define SM_CUDA_EXEC_H
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" { /* C headers without their own extern "C" guards */
#include "base/err.h"
#include "model/config.h"
#include "parallel/shard.h"
#include "model/tensors.h"
}
#include "backend/step.h"
#include "cuda/ops/ops.h"
#include "cuda/moe/moe.h"

/* Row buckets of graph-form steps: the rank captures a graph per bucket, an executor plans per
 * bucket; a chunk of n rows runs in the smallest bucket >= n. */
#define SM_EXEC_NBUCKETS 8
#define SM_EXEC_MAX_ROWS 128   /* rows of the largest bucket */
/* Rows of bucket i (0 <= i < SM_EXEC_NBUCKETS): 8 16 24 32 48 64 96 128. */
static inline int sm_exec_bucket_rows(int i) {
    static const int rows[SM_EXEC_NBUCKETS] = {8, 16, 24, 32, 48, 64, 96, 128};
    return rows[i];
}

/* One layer of a rank on the device (the rank uploads or makes it; executors read it).  Dense
 * fields are carved from `dense` (one cudaMalloc); widths are the rank's (nHl, nKVl, np, nu of
 * its plan; all global when world = 1). */
typedef struct sm_exec_layer {
    int full;                  /* 1: full attention (NoPE), 0: sliding window + RoPE */
    uint16_t *wqkvg;           /* [(2 nHl + 2 nKVl) D, H] bf16: rows q | k | v | gate */
    uint16_t *wo;              /* [H, nHl D] bf16 */
    float *in_norm;            /* [H] eff(input_layernorm) */
    float *att_alpha, *att_beta; /* [H] post-attention residual gate */
    float *pre_ffn_norm;       /* [H] eff(pre_feedforward_layernorm) */
    float *post_ffn_norm;      /* [H] eff(post_feedforward_layernorm) */
    float *ffn_alpha, *ffn_beta; /* [H] post-FFN residual gate */
    float *router;             /* [E, H] f32 */
    float *router_bias;        /* [E] f32 */
    uint16_t *pooler;          /* [np, H] bf16 */
    float *pre_expert_norm;    /* [Hm] eff(pre_expert_norm) */
    uint16_t *unpooler;        /* [nu, Hm] bf16 */
    sm_cuda_moe_layer moe;     /* experts and post_expert_norm (the MoE module's layout, moe.h) */
    int have_moe;              /* moe holds device memory */
    void *dense;               /* the allocation the dense fields live in */
    size_t dense_bytes;        /* its size */
    uint16_t *kv;              /* [nblocks + 1][nKVl][16][2 D] bf16; page nblocks stays zero
                                  (the page of padding rows) */
} sm_exec_layer;

/* What an executor sees of one rank: views of the rank's fields, made once the weights are on
 * the device (before any executor is made) and valid for the rank's life.  Facts that may
 * change later are reached through pointers (the KV pool is sized after the executors are
 * made; a bench may change a layer's activations).  Every buffer is the rank's: an executor
 * allocates only its own state. */
typedef struct sm_exec_view {
    /* where it runs */
    int device;                /* CUDA device ordinal, current whenever a hook is called */
    int rank, world;           /* this rank of `world` ranks */
    const sm_config *cfg;      /* the model configuration (global widths) */
    const sm_shard *plan;      /* the rank's ranges (nHl, nKVl, np, nu, its MoE layout) */
    cudaStream_t st;           /* [1] the rank's stream: every launch and copy */
    sm_kernel_ctx *kc;         /* the stock kernels' context (cuBLAS, workspace; num_sms: the
                                  rank's SMs, its share with virtual ranks) */
    /* weights and KV cache */
    sm_exec_layer *layers;     /* [L] */
    const float *final_norm;   /* [H] the final norm (the last layer's post-FFN boundary) */
    const sm_kv_shape *kvs;    /* KV geometry (nblocks: the pages, final once the pool is sized) */
    /* activations, for cap rows */
    int cap;                   /* rows the buffers below hold */
    float *s;                  /* [cap, H] residual stream f32 */
    uint16_t *x;               /* [cap, H] layer input (after the last layer: h) */
    uint16_t *qkv[2];          /* [cap, (2 nH + 2 nKV) D] projections (q normed / roped in place):
                                  layer l's in qkv[l & 1] when the run alternates (sm_exec_run.alt),
                                  else qkv[0]; qkv[1] NULL while no executor alternates */
    uint16_t *att;             /* [cap, nHl D] gated attention output */
    uint16_t *a;               /* [cap, H] o_proj output */
    uint16_t *xf;              /* [cap, H] pre-FFN normed input */
    float *rlog;               /* [cap, E] router logits */
    int *idx;                  /* [L, cap, K] routes of every layer */
    float *rw;                 /* [L, cap, K] route weights */
    uint16_t *h1;              /* [cap, Hm] pooled + normed expert input */
    uint16_t *mo;              /* [cap, Hm] MoE stage output */
    uint16_t *f;               /* [cap, H] unpooler output */
    sm_cuda_moe_ws *mws;       /* MoE workspace for cap rows */
    /* the step's metadata on the device (the rank packs and copies it before each chunk) */
    const int64_t *slot;       /* [cap] cache slot of each row, -1 for padding */
    const int *pos, *rreq;     /* [cap] position, block-table index of each row */
    const int *tab;            /* [*, kvs->max_bpr] block tables of the step's requests */
    /* W > 1 (docs/parallelism.md): the rank's exchange handle and local parts; NULL with W = 1 */
    struct sm_gcomm *gc;       /* the world's exchanges (cuda/comm/gcomm.h) */
    float *apart;              /* [cap, H] f32 o_proj partial over the rank's heads */
    uint16_t *pooled_part;     /* [cap, np] the rank's pooler block */
    float *xpart;              /* EP [cap, Hm] f32 m partial; TP [cap * K, Hm] f32 y partial */
    uint16_t *unpooled_part;   /* [cap, nu] the rank's unpooler block */
} sm_exec_view;

/* One attention call of an eager step: a run of rows through sm_k_attention (kind 0) or one
 * request's long run through sm_k_attention_prefill (kind 1). */
typedef struct sm_exec_att {
    int kind;                  /* 0 generic, 1 prefill */
    int r0, cnt;               /* rows [r0, r0 + cnt) of the chunk */
    int pos0, tab;             /* prefill: first position, block-table index */
    int max_ctx;               /* generic: max position + 1 over its rows */
} sm_exec_att;

/* The rows a layers() call runs (the same for every run of one step). */
typedef struct sm_exec_run {
    int n;                     /* rows (graph form: the bucket's, padding included) */
    int alt;                   /* 1: layer l's projections in qkv[l & 1], 0: all in qkv[0] */
    const sm_exec_att *att;    /* [natt] eager attention plan; NULL: one generic call */
    int natt;
    int moe_only;              /* bench: only layer a's MoE stage (stock, b = a + 1) */
} sm_exec_run;

/* flags of a layers() call on [a, b) */
#define SM_EXEC_HAVE_QKV 1u    /* layer a's projections are made (the run before ends with them) */
#define SM_EXEC_NEXT_QKV 2u    /* make layer b's after layer b - 1 (the run after starts from them) */

/* W > 1: what the ranks' executors agree on once every rank has made its own. */
typedef struct sm_exec_world {
    int virt;                  /* virtual ranks (a device holds several) */
    int peer;                  /* the exchanges go through peer memory (0: NCCL) */
    const unsigned long long *const *steps; /* [W] rank r's step counter (sm_gcomm_step) */
} sm_exec_world;

/* The phases of a decoder layer as the bench reports them (`sparkmono bench --phases`, one
 * line each): the one table both executors' timelines map their own phases onto
 * (sm_exec_trace.part), so a phase has one name whichever executor ran it.  Its weights are
 * the tensor roles (model/tensors.h) whose bytes make its floor; the norm and gate vectors (a
 * few KB) count as none: a phase without weights is latency work. */
enum {
    SM_LP_NONE,        /* not a layer phase (a wait inside another phase) */
    SM_LP_QKVG, SM_LP_ROPE_KV, SM_LP_ATTENTION, SM_LP_OPROJ, SM_LP_POST_ATTN, SM_LP_ROUTER, SM_LP_POOLER, SM_LP_PRE_NORM,
    SM_LP_EXPERTS, SM_LP_COMBINE, SM_LP_EXPERT_SUM, SM_LP_UNPOOLER, SM_LP_POST_FFN, SM_LP_GAPS,
    SM_LP_N
};
#define SM_LP_ROLE(r) (1u << (r)) /* a role's bit in sm_exec_lphase.weights */
typedef struct sm_exec_lphase {
    const char *name;          /* one word: the bench's lines */
    const char *what;          /* what it runs (stock; the monokernel's differences in brackets) */
    unsigned weights;          /* SM_LP_ROLE(r) of each role r it reads as weights (the expert
                                  roles: the experts the step's rows route to); 0: none */
} sm_exec_lphase;
inline const sm_exec_lphase sm_exec_lphases[SM_LP_N] = {
    {"-", "-", 0},
    {"qkvg", "q | k | v | gate projection",
     SM_LP_ROLE(SM_T_WQ) | SM_LP_ROLE(SM_T_WK) | SM_LP_ROLE(SM_T_WV) | SM_LP_ROLE(SM_T_WG)},
    {"rope_kv", "qk norm / rope / kv insert", 0},
    {"attention", "paged attention + output norm + gate (mono: the slot between its launches)", 0},
    {"o_proj", "o_proj", SM_LP_ROLE(SM_T_WO)},
    {"post_attn", "post-attention boundary + pre-FFN norm (mono: + router logits)", 0},
    {"router", "router logits + top-k (mono: in post_attn and pooler)", SM_LP_ROLE(SM_T_ROUTER) | SM_LP_ROLE(SM_T_ROUTER_BIAS)},
    {"pooler", "pooler (mono: + top-k)", SM_LP_ROLE(SM_T_POOLER)},
    {"pre_norm", "pre-expert norm (mono: + route grouping)", 0},
    {"experts", "route grouping + expert FFN + combine (mono: the expert FFN)",
     SM_LP_ROLE(SM_T_EXPERTS_GU) | SM_LP_ROLE(SM_T_EXPERTS_DN)},
    {"combine", "expert combine (mono; stock: inside experts)", 0},
    {"expert_sum", "the ranks' expert sum (W > 1)", 0},
    {"unpooler", "unpooler", SM_LP_ROLE(SM_T_UNPOOLER)},
    {"post_ffn", "post-FFN boundary + next layer's input norm", 0},
    {"gaps", "between the phases (launch gaps, barriers, trace events)", 0},
};

/* The layout of an executor's timeline (trace hooks): per layer, per block, per phase, the
 * start and end (globaltimer ns, or any ns clock of the rank; 0: the block did not run it),
 * and what the bench summary says of each phase. */
#define SM_EXEC_TRACE_PHASES 32 /* most phases a timeline names */
typedef struct sm_exec_trace {
    const char *what;          /* the executor's name in the summary ("monokernel") */
    int layers, phases;        /* the buffer: [layers][blocks][phases][2] (blocks: trace_on's) */
    const char *const *name;   /* [phases] phase names */
    double floor[SM_EXEC_TRACE_PHASES]; /* bytes a phase must read (its floor at a bandwidth); 0: none */
    unsigned char pair[SM_EXEC_TRACE_PHASES]; /* 1: its blocks run two an SM (an SM's track: block / 2) */
    unsigned char wait[SM_EXEC_TRACE_PHASES]; /* 1: a wait for the other ranks (W > 1) */
    unsigned char nested[SM_EXEC_TRACE_PHASES]; /* 1 + the phase it is timed inside (a part of that
                                                    phase's time, not summed); 0: none */
    const char *lead;          /* the time before a layer's first phase: its name */
    const char *lead_note;     /* what it holds */
    unsigned char part[SM_EXEC_TRACE_PHASES]; /* the layer phase (SM_LP_*) a phase is part of (SM_LP_NONE
                                                  for a nested one) */
    unsigned char lead_part;   /* the lead's layer phase (SM_LP_NONE: counted in gaps) */
} sm_exec_trace;

/* An executor on one rank: its operations and its state (ctx).  Every hook runs with the view's
 * device current and enqueues on its stream; a hook left NULL has nothing to do (plan: every
 * bucket runs here). */
typedef struct sm_exec {
    const char *name;          /* "stock", "monokernel" */
    void *ctx;                 /* its state; NULL: not made (refused, or --mono off) */
    int lo, hi;                /* the layers it runs: [lo, hi) */
    int qkv_in;                /* 1: its first layer reads projections made before it */
    int qkv_out;               /* 1: it always ends with the projections of the layer after */
    int qkv_alt;               /* 1: a step it runs alternates the two projection buffers */
    /* 1: steps of nb rows (a bucket) run here, planned on first use; 0: not (a refusal is
     * logged once); -1 on error (strict: a refusal is an error, --mono on) */
    int (*plan)(void *ctx, int nb, int strict, sm_err *e);
    /* Enqueue layers [a, b) of run r (flags: SM_EXEC_*) */
    int (*layers)(void *ctx, const sm_exec_run *r, int a, int b, unsigned flags, sm_err *e);
    /* Enqueue the copy of its health words to the host (before the step's sync); after the
     * sync check them: -1 with one line when a wait inside the step ran out */
    int (*health_fetch)(void *ctx, sm_err *e);
    int (*health_check)(void *ctx, sm_err *e);
    /* Drop every bucket's plan (the layers' arguments changed; planned again on next use) */
    void (*forget)(void *ctx);
    /* W > 1, once every rank's executor is made (ctx [W], NULL where a rank refused): 1 when
     * they run together (each learns the others' exchange areas), 0 when they cannot (one line
     * logged; the caller frees them all), -1 on error (strict: instead of 0) */
    int (*world_link)(void *const *ctx, int W, const sm_exec_world *w, int strict, sm_err *e);
    /* The timeline: its layout; blocks a layer of it needs (0: none); timestamps on (the buffer
     * zeroed) for blocks per layer; the buffer copied to host (NULL: not copied), then off */
    void (*trace_fmt)(void *ctx, sm_exec_trace *t);
    int (*trace_blocks)(void *ctx);
    int (*trace_on)(void *ctx, int blocks, sm_err *e);
    int (*trace_off)(void *ctx, unsigned long long *host, sm_err *e);
    void (*free)(void *ctx);
} sm_exec;

/* The executors.  Each fills x (its hooks even when it refuses: then x->ctx is NULL and, with
 * strict 0, one line is logged; strict 1: a refusal is an error).  On error x->ctx may hold
 * what was made: free it with x->free. */
int sm_exec_stock_create(const sm_exec_view *v, int strict, sm_exec *x, sm_err *e); /* cuda/stock/layer.cu */
int sm_exec_mono_create(const sm_exec_view *v, int strict, sm_exec *x, sm_err *e);  /* cuda/mono/build.cu */

#endif
