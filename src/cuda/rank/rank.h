/* rank.h: one rank of the CUDA backend (sm_cuda_rank), shared by the files of src/cuda/rank/
 * (ctx: create / destroy / allocation, upload: a rank's shard, synth: weights made on the
 * device, forward: a step on the stream, exec: the executors of its layers, graph: buckets and
 * capture, step: the backend's step entry, world: W ranks) and by the bench hooks
 * (src/cuda/bench/).  CUDA types allowed: included by .cu files only.
 *
 * All device state of a rank lives in one plain struct, sm_cuda_rank: its device ordinal, its
 * stream, the kernels' launch context (sm_kernel_ctx: cuBLAS, workspace), the rank's weights (dense matrices
 * carved from one allocation per layer, experts in the MoE module's layout, src/cuda/moe/),
 * the paged KV cache, fixed activation buffers for `cap` rows, one packed metadata buffer that
 * every kernel of a step reads, the captured graphs, and the executors that run its layers
 * (exec.h), which see it only through one view.  Every call that touches it first makes its device
 * current (cb_enter) and runs on its stream: another rank's context may have switched the
 * device of this host thread.  We rejected file statics and the implicit device 0: W ranks
 * on W GPUs need W contexts side by side; and per-step allocations or pointer arguments that
 * change between steps: a graph bakes its pointers in, so everything it touches lives at a
 * fixed address for the context's life.
 */
#ifndef SM_CUDA_RANK_H
#define SM_CUDA_RANK_H
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>
extern "C" { /* C headers without their own extern "C" guards: include them first */
#include "base/err.h"
#include "backend/backend.h"
#include "parallel/shard.h"
#include "model/tensors.h"
}
#include "backend/step.h"
#include "cuda/ops/ops.h"
#include "cuda/moe/moe.h"
#include "cuda/comm/gcomm.h"
#include "cuda/exec/exec.h"
#include "cuda/common.cuh"

#define CB_GRAPH_ROWS SM_EXEC_MAX_ROWS /* most rows of one graph replay (wider steps run in chunks) */
#define CB_GRAPH_REQ_ROWS 16   /* most rows of one request in a graph-captured (verify) step */
#define CB_LOGIT_ROWS 128      /* rows of the device logits buffer (lm_head runs in chunks) */
#define CB_MAX_AUX SM_STEP_MAX_AUX

/* A captured step graph: one per (row bucket, logits wanted). */
typedef struct cb_graph {
    cudaGraphExec_t exec;      /* NULL: not captured */
    int naux;                  /* aux entries it copies */
    int aux[CB_MAX_AUX];       /* [naux] their layer ids, in the step's order */
} cb_graph;

/* The device context of one rank. */
typedef struct sm_cuda_rank {
    /* where it runs */
    int device;                /* CUDA device ordinal: every call below runs with it current */
    int rank, world;           /* this rank of world ranks (world = 1 in this build) */
    sm_shard plan;             /* the rank's ranges (sm_shard_plan: h0/nHl, kv0/nKVl, p0/np,
                                  u0/nu, v0/nv); no views: those live only during the upload */
    sm_config cfg;             /* the model configuration (global widths) */
    cudaStream_t st;           /* [1] non-blocking stream: every launch, copy and memset */
    sm_kernel_ctx kc;          /* stock-kernel context (cuBLAS handle, workspace) */
    int have_kc;               /* kc initialized */
    /* the rank's weights */
    sm_exec_layer *layers;     /* [L] */
    uint16_t *embed;           /* [nv, H] bf16 */
    uint16_t *lm_head;         /* [nv, H] bf16 */
    float *final_norm;         /* [H] final norm weight as is */
    void *glob;                /* allocation holding embed, lm_head, final_norm */
    double weight_bytes;       /* bytes of weights on the device */
    /* KV cache and step geometry */
    sm_kv_shape kvs;           /* the sm_kv geometry the context was made for (page nblocks of
                                  every layer's cache is the zero page) */
    int cap;                   /* rows the activation buffers hold (eager steps are chunked) */
    int ntab;                  /* block tables the metadata buffer holds */
    /* activations */
    float *s;                  /* [cap, H] residual stream f32 */
    uint16_t *x;               /* [cap, H] layer input (after the last layer: h) */
    uint16_t *qkvg;            /* [cap, (2 nH + 2 nKV) D] projections; q normed/roped in place */
    uint16_t *att;             /* [cap, nH D] gated attention output */
    uint16_t *a;               /* [cap, H] o_proj output */
    uint16_t *xf;              /* [cap, H] pre-FFN normed input */
    float *rlog;               /* [cap, E] router logits scratch */
    int *idx;                  /* [L, cap, K] routes of every layer (kept for the bench) */
    float *rw;                 /* [L, cap, K] route weights */
    uint16_t *h1;              /* [cap, Hm] pooled + normed expert input */
    uint16_t *mo;              /* [cap, Hm] MoE stage output */
    uint16_t *f;               /* [cap, H] unpooler output */
    int *am;                   /* [cap] argmax */
    float *logits;             /* [CB_LOGIT_ROWS, V] f32, allocated on first use */
    sm_lp_sum *lps, *h_lps;    /* [cap] logprob summaries of a run's rows (sm_step.lp_at), in row
                                  order, and their pinned host staging; allocated on first use */
    uint32_t *mask_d, *mask_h; /* [SM_MASK_ROWS, ceil(V / 32)] the distinct constraint masks of a
                                  chunk's rows (sm_step.mask) and their pinned staging; first use */
    int mask_busy;             /* 1: a copy from mask_h may be in flight (until the step's wait) */
    int kv_deferred;           /* 1: the KV pages wait for cb_kv_finish (sized from memory) */
    float *aux;                /* [aux_cap, cap, H] f32, allocated on first use */
    int aux_cap;               /* aux entries aux holds */
    sm_cuda_moe_ws mws;        /* MoE workspace for cap rows */
    void *act;                 /* allocation holding the activations above */
    /* per-step metadata: device buffer and pinned host staging, same packed layout */
    void *meta_d, *meta_h;     /* [meta_bytes] */
    size_t meta_bytes;
    int64_t *d_slot;           /* [cap] cache slot of each row, -1 for padding */
    int *d_tok, *d_pos, *d_rreq; /* [cap] token, position, block-table index of each row */
    int *d_tab;                /* [ntab, max_bpr] block tables of the step's requests */
    size_t off_tab;            /* byte offset of d_tab in the packed layout */
    int *h_am;                 /* [cap] pinned argmax staging */
    int *tab_of_req;           /* [max_req] host scratch: table index of a request, -1 */
    /* graphs */
    cb_graph graphs[SM_EXEC_NBUCKETS][2]; /* [bucket][logits wanted] */
    /* the executors of its layers (exec.h, exec.cu), chosen per bucket */
    sm_exec_view view;         /* what they see of this context (made by cb_exec_attach) */
    sm_exec stock;             /* the stock layers: every layer of every step */
    sm_exec mono;              /* the monokernel: its layers of the buckets it plans; ctx NULL: none */
    int mono_mode;             /* SM_MONO_* (backend.h, --mono); OFF when it is not eligible */
    uint16_t *qkv2;            /* [cap, NQ] the second projections buffer (view.qkv[1]), while an
                                  executor alternates them (sm_exec.qkv_alt) */
    long mono_layers;          /* layers the monokernel ran (tests) */
    int logged_eager;          /* "stock step (prefill rows)" said */
    int last_nb;               /* rows (padded) of the last step's final chunk */
    int last_graph;            /* that chunk ran through a graph */
    /* tensor + expert parallelism (world > 1, world.cu; docs/parallelism.md): the rank's
     * exchange handle and the buffers of its local parts.  NULL / unused with world 1. */
    struct sm_gcomm *gc;       /* this rank's handle of the world's exchanges (cuda/comm/gcomm.h) */
    int eager_only;            /* 1: no graphs (virtual ranks: their exchanges meet at host barriers) */
    void *wbuf;                /* the allocation holding the buffers below */
    float *apart;              /* [cap, H] f32 o_proj partial over the rank's heads */
    uint16_t *pooled_part;     /* [cap, np] the rank's pooler block */
    float *xpart;              /* EP [cap, Hm] f32 m partial; TP [cap * K, Hm] f32 y partial */
    uint16_t *unpooled_part;   /* [cap, nu] the rank's unpooler block */
    uint16_t *embed_part;      /* [cap, H] embedding rows of the rank's vocab block (zero rows else) */
    int *iota;                 /* [cap] 0, 1, ...: row i of the gathered embedding is "token" i */
    float *logits_part;        /* [CB_LOGIT_ROWS, nv] f32 logits of the rank's vocab block */
    float *best;               /* [cap] the value of the rank's best id */
    int *argmax_part;          /* [cap] the rank's argmax (local id; -1 none, -2 non-finite) */
} sm_cuda_rank;

/* What cb_enqueue runs. */
typedef struct cb_run {
    int n;                     /* rows (a graph bucket: padded) */
    int l0, l1;                /* layers [l0, l1) */
    int embed;                 /* run the embedding before l0 */
    int head;                  /* run the logits after l1 - 1 (l1 must be L) */
    float *logits_dev;         /* head: device logits [n, V] (n <= CB_LOGIT_ROWS), or NULL */
    float *logits_host;        /* head, eager: host logits [n, V] written in chunks, or NULL */
    const int *logits_at;      /* head, eager: NULL (row i to row i of logits_host), or [n] the row
                                  of logits_host each row's logits go to, -1 for none */
    const int *lp_at;          /* head, eager: NULL, or [n]: the rows >= 0 get a logprob summary
                                  (cr->lps, in row order) */
    int lp_k;                  /* their top ids (sm_step.lp_k) */
    const int *lp_tok;         /* head, eager: NULL, or [n] sm_step.lp_tok of the rows */
    const uint32_t *const *mask; /* head, eager: NULL, or [n] sm_step.mask of the rows */
    int naux;                  /* aux entries */
    const int *aux;            /* [naux] layer ids */
    const sm_exec_att *att;    /* [natt] eager attention plan; NULL: one generic call */
    int natt;
    int moe_only;              /* bench: only layer l0's MoE stage */
    int mono;                  /* layers [mono.lo, mono.hi) run on the monokernel (n: a bucket it planned) */
} cb_run;

/* The run of a whole step of n rows: embedding, every layer, logits, the step's aux layers. */
static inline cb_run cb_run_step(const sm_cuda_rank *cr, const sm_step *s, int n) {
    cb_run r;
    memset(&r, 0, sizeof r);
    r.n = n;
    r.l0 = 0;
    r.l1 = cr->cfg.L;
    r.embed = 1;
    r.head = 1;
    r.naux = s->naux;
    r.aux = s->aux_layers;
    return r;
}

/* Make cr's device current on this host thread (every entry that touches cr calls it first). */
static inline int cb_enter(const sm_cuda_rank *cr, sm_err *e) {
    SM_CUDA_CHECK(cudaSetDevice(cr->device));
    return 0;
}

/* A host <-> device copy of one dense tensor of a rank: `rows` rows of `row_bytes`, contiguous
 * on the device, row i at host + i * pitch on the host (pitch > row_bytes: a column slice). */
typedef struct cb_xfer {
    const char *what;          /* the tensor's name in messages (its table suffix) */
    int k;                     /* which vector of it (1: a residual gate's beta) */
    void *dev;                 /* device [rows, row_bytes] */
    const void *host;          /* host view (NULL: missing in the model) */
    size_t rows, row_bytes;    /* shape in bytes */
    size_t pitch;              /* host bytes between rows */
} cb_xfer;
#define CB_MAX_XFER (2 * SM_T_NLAYER) /* dense tensor vectors of one layer (at most two a role) */

/* ---- ctx.cu ---- */
/* A context on `device` for rank `rank` of o->world with everything but the weights (stream,
 * kernel context, activations, metadata, KV, the world buffers); cfg, cap and the kv geometry
 * come from the arguments.  Refuses o->verify_rows > CB_GRAPH_REQ_ROWS and a missing or
 * non-Hopper device, each with one line. */
int cb_dev_create(const sm_config *cfg, const sm_kv *kv, const sm_backend_opts *o, int rank, int device, sm_cuda_rank **out,
                  sm_err *e);
/* Free everything (safe on a partly built context; makes its device current). */
void cb_dev_destroy(sm_cuda_rank *cr);
/* Bytes of one layer's dense allocation (the rank's widths). */
size_t cb_layer_bytes(const sm_cuda_rank *cr);
/* Carve one layer's dense allocation (fills every dense pointer of L). */
int cb_layer_alloc(sm_cuda_rank *cr, sm_exec_layer *L, sm_err *e);
/* Allocate embed / lm_head / final_norm. */
int cb_glob_alloc(sm_cuda_rank *cr, sm_err *e);
/* Device address of role r (tensors.h) of layer l (-1: a model-level role), vector k (1: a
 * residual gate's beta) in cr's weight allocations: the rank's part (sm_shard_tensor), rows
 * contiguous.  NULL for what the dense allocations do not hold (post_expert_norm and the
 * experts live in the MoE module).  The one map from roles to device fields (the upload, its
 * check and the synthesis walk the table through it). */
void *cb_tensor_dev(const sm_cuda_rank *cr, int l, sm_tensor_role r, int k);
/* Fill the sm_backend table once every weight is on the device. */
void cb_backend_fill(sm_cuda_rank *cr, sm_backend *b);
/* The context of a one-rank CUDA backend with its device made current, or NULL (with an
 * error) for any other backend, a world included; cb_rank0 also takes a world (its rank 0). */
sm_cuda_rank *cb_from_backend(const sm_backend *b, const char *who, sm_err *e);
sm_cuda_rank *cb_rank0(const sm_backend *b, const char *who, sm_err *e);

/* ---- upload.cu ---- */
/* Rank cr->rank's shard of m onto cr's device (dense tensors, experts); drains cr->st. */
int cb_upload_model(sm_cuda_rank *cr, const sm_model *m, sm_err *e);
/* The dense tensors of layer l of shard sh (l = -1: embedding, lm_head, final norm) as
 * copies to / from cr's buffers; returns their count (<= CB_MAX_XFER). */
int cb_dense_xfers(const sm_cuda_rank *cr, const sm_shard *sh, int l, cb_xfer *t);

/* The KV pool sized from memory (sm_backend_opts.kv_mem_util), after the weights: the bytes of
 * one page of every layer of cr; the pages that fit in util x cr's device's memory shared by k
 * ranks (what is allocated now, and a reserve for what is allocated on first use, left out);
 * then cr's pages allocated (cr->kvs.nblocks = pages).  0, or -1 with one line. */
size_t cb_kv_page_bytes(const sm_cuda_rank *cr);
int cb_kv_fit(const sm_cuda_rank *cr, double util, int k, int *pages, sm_err *e);
int cb_kv_finish(sm_cuda_rank *cr, int pages, sm_err *e);

/* ---- step.cu ---- */
/* Enqueue the copy of device logits [n, V] to the host: row i to row at[i] of host (none when
 * -1; runs of consecutive rows in one copy), or, at NULL, all n rows to host [n, V]. */
int cb_logits_to_host(sm_cuda_rank *cr, const float *dev, int n, const int *at, float *host, sm_err *e);
/* The constraint masks mask [n] (sm_step.mask of n consecutive rows; NULL entries: free rows) on
 * rows [0, n) of the device logits dev [n, V], and those rows' argmax into am [n]. */
int cb_mask(sm_cuda_rank *cr, const uint32_t *const *mask, int n, float *dev, int *am, sm_err *e);

/* ---- forward.cu ---- */
/* Enqueue the work of r on cr->st (capturable when r->logits_host is NULL). */
int cb_enqueue(sm_cuda_rank *cr, const cb_run *r, sm_err *e);

/* ---- graph.cu ---- */
/* Padded rows of the smallest bucket holding n <= CB_GRAPH_ROWS rows. */
int cb_bucket_rows(int n);
/* 1 when no run of one request in s is longer than CB_GRAPH_REQ_ROWS (a verify / decode
 * step: its chunks of CB_GRAPH_ROWS rows replay graphs); 0: a prefill (eager). */
int cb_graph_form(const sm_step *s);
/* Make room for naux aux entries and (if wanted) the logits buffer, before any capture. */
int cb_reserve_outputs(sm_cuda_rank *cr, int naux, int want_logits, int want_lp, sm_err *e);
/* The logprob summaries of the rows i < n of cr->logits with at[i] >= 0 (tok: NULL, or [n] the id
 * whose logit each also carries) into cr->lps from entry *ord on (rank 0), *ord advanced. */
int cb_logprobs(sm_cuda_rank *cr, const int *at, const int *tok, int n, int k, int *ord, sm_err *e);
/* Capture run r (on the metadata buffer) as a graph. */
int cb_capture(sm_cuda_rank *cr, const cb_run *r, cudaGraphExec_t *out, sm_err *e);
/* Enqueue a graph-form chunk already packed (bytes of metadata, nb padded rows): metadata
 * copy + graph replay, capturing on first use (*fresh = 1: it then ran eagerly once). */
int cb_launch_graph(sm_cuda_rank *cr, const sm_step *s, size_t bytes, int nb, int *fresh, sm_err *e);
/* The graph form of a bucket run eagerly (virtual ranks: their exchanges meet at host barriers,
 * which a graph cannot hold): the same run as the capture. */
int cb_launch_bucket_eager(sm_cuda_rank *cr, const sm_step *s, size_t bytes, int nb, sm_err *e);
/* Destroy every graph (aux_only: only those that copy aux entries). */
void cb_graphs_drop(sm_cuda_rank *cr, int aux_only);

/* ---- exec.cu ---- */
/* After the weights (and, W > 1, the exchange handle): the view, the stock executor and, unless
 * mono_mode is OFF, the monokernel (auto + refused: one log line, mode OFF; on + refused: an
 * error listing every reason), with the second projections buffer it needs. */
int cb_exec_attach(sm_cuda_rank *cr, sm_err *e);
/* Free the executors (device current). */
void cb_exec_detach(sm_cuda_rank *cr);
/* 1 when steps of bucket rows nb run the monokernel's layers (planned on first use), 0 for
 * stock (mode off, refused bucket: logged once), -1 on error. */
int cb_exec_pick(sm_cuda_rank *cr, int nb, sm_err *e);
/* W > 1, after every rank's cb_exec_attach: the ranks' executors agree (a refusal anywhere
 * turns the monokernel off on every rank; --mono on: an error). */
int cb_exec_world_link(sm_cuda_rank **rk, int W, int virt, int peer, sm_err *e);
/* The executors' health words: copy enqueued before the step's sync, checked after it. */
int cb_exec_health_fetch(sm_cuda_rank *cr, sm_err *e);
int cb_exec_health_check(sm_cuda_rank *cr, sm_err *e);

/* ---- synth.cu ---- */
/* Every weight of rank cr made on its device (synth.h's values; a rank of a world: its
 * slices); drains cr->st. */
int cb_synth_weights(sm_cuda_rank *cr, int expert_fmt, uint64_t seed, sm_err *e);

/* ---- world.cu ---- */
/* The CUDA backend of o->world > 1 ranks (backend.h: sm_cuda_backend_create and
 * sm_cuda_backend_create_synth dispatch here): every rank uploads its shard of m, or, m NULL,
 * synthesizes its slices of a model of config cf (expert format fmt, seed). */
int cb_world_create(const sm_model *m, const sm_config *cf, int fmt, uint64_t seed, const sm_kv *kv, const sm_backend_opts *o,
                    sm_backend *b, sm_err *e);
/* The small kernels of a rank's local parts (world.cu): embedding rows of the rank's vocab
 * block (zero rows for other tokens) into cr->embed_part; the best (value, local id) of each row from
 * cr->logits_part and cr->argmax_part (local argmax of sm_k_logits: -1 = non-finite -> -2; vu_local 0 -> -1). */
int cb_embed_local(sm_cuda_rank *cr, int n, sm_err *e);
/* The rank contexts of a world backend: their count W and *rk [W]; 0 for any other backend. */
int cb_world_ranks(const sm_backend *b, sm_cuda_rank ***rk);
int cb_best_local(sm_cuda_rank *cr, int n, int vu_local, sm_err *e);
/* The cross-rank exchanges of one step of n rows alone, timed on every rank of world backend b
 * (bench.h: sm_cuda_world_bench_exchanges says how). */
int cb_world_time_exchanges(const sm_backend *b, int n, int iters, float *us, sm_err *e);

/* ---- step.cu ---- */
/* The sm_backend step entry (backend.h): sm_step_check, then cb_step_run (a world checks a step
 * once for all its ranks and runs cb_step_run on each). */
int cb_step(void *vctx, const sm_step *s, sm_err *e);
int cb_step_run(sm_cuda_rank *cr, const sm_step *s, sm_err *e);
/* Pack rows [r0, r0 + n) of s into the pinned staging buffer, padded to nb rows; returns the
 * number of bytes to copy. */
size_t cb_pack(sm_cuda_rank *cr, const sm_step *s, int r0, int n, int nb);

#endif
