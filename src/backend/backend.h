/* backend.h: the one interface between the engine and a compute backend (cpu, cuda, ...).
 *
 * A step is any batch of rows: a prefill (T rows of one request), a decode (1 row each) or a
 * verify (R rows each).  Rows of one request are consecutive and at consecutive positions;
 * every row writes its K/V into the cache and attends to the cache up to its own position.
 * The engine has reserved the cache pages (sm_kv) before calling step.  We rejected separate
 * prefill/decode entry points at this seam: the math is one function of (tokens, positions),
 * and the backend picks its own kernels (chunked prefill, graph buckets) from the shape.
 */
#ifndef SM_BACKEND_H
#define SM_BACKEND_H
#include <stdint.h>
#include "base/err.h"
#include "backend/kvcache.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The logprob summary of one logits row l over the ids < vocab_used (what a step hands back for a
 * request that asked for logprobs, instead of the row): its largest logit, the log of the sum of
 * exp(l_v - lmax) in double, and its k most likely ids, largest first, ties to the lowest id.
 * The logprob of id v is sm_lp_value(sum, l_v): (l_v - lmax) - lse in double, rounded to f32
 * (the one formula, every backend and the engine).  The row's order (larger logit first, ties to
 * the lower id; -inf, an id a mask forbids, after every finite logit) is the top list's, and the
 * rank of a named id is its place in it, so an id of the top list ranks as its place there.
 * vLLM's rank counts the ids whose logit is >= the id's (batched_count_greater_than, the v2
 * runner's _ranks_kernel: a tie ranks as the last of its tied ids); the two differ only when a
 * higher id has exactly the named id's logit.  Reference: ref_logprobs_row
 * (cpu/ops.h); kernel: sm_k_logprobs (cuda/ops/ops.h). */
#define SM_LP_MAX_TOP 20     /* most ids of a summary (= SPARKMONO_MAX_TOP_LOGPROBS) */
typedef struct sm_lp_sum {
    float lmax;              /* the largest logit among ids < vocab_used */
    int bad;                 /* 1: a logit there is NaN or +-Inf (the row has no distribution) */
    double lse;              /* log(sum_v exp(l_v - lmax)) over ids < vocab_used */
    int n;                   /* ids in top: min(k, vocab_used) */
    int top_ids[SM_LP_MAX_TOP]; /* [n] the most likely ids, largest logit first, ties to the lowest id */
    float top_l[SM_LP_MAX_TOP]; /* [n] their logits */
    float tok_l;             /* the logit of the id the step named for this row (sm_step.lp_tok: a
                                prompt's next id), -inf when none */
    int tok_rank;            /* that id's rank: 1 + the ids < vocab_used before it in the row's
                                order; 0 (unknown) when none is named, it is >= vocab_used, or bad */
} sm_lp_sum;

/* The logprob of a logit x of the row summarised by s. */
static inline float sm_lp_value(const sm_lp_sum *s, float x) { return (float)(((double)x - (double)s->lmax) - s->lse); }

typedef struct sm_step {
    int nrows;               /* rows in the step, all requests together */
    const int *tokens;       /* [nrows] token ids (< V) */
    const int *pos;          /* [nrows] absolute positions */
    const int *req;          /* [nrows] request slot of each row (sm_kv slot) */
    const sm_kv *kv;         /* block tables, pages reserved for every (req, pos) above */
    float *logits;           /* [nrows, V] f32 softcapped logits, ids >= vocab_used = -inf; or NULL */
    const int *logits_at;    /* NULL: logits holds every row (row i at row i); else [nrows]: row i's
                                logits go to row logits_at[i] of logits, none when -1 (the rows of
                                the sampled requests of a verify step, packed) */
    int *argmax;             /* [nrows] greedy id among ids < vocab_used, ties to the lowest id;
                                -1 when any of those logits is NaN or +-Inf (non-finite row) */
    const int *lp_at;        /* NULL: no summaries; else [nrows]: row i's logprob summary goes to
                                lp[lp_at[i]], none when -1 (the rows of requests with logprobs) */
    int lp_k;                /* ids of each summary's top list, [1, SM_LP_MAX_TOP] (with lp_at) */
    const int *lp_tok;       /* NULL, or [nrows]: an id in [0, V) whose logit row i's summary also
                                carries (tok_l), -1 for none (with lp_at) */
    sm_lp_sum *lp;           /* [rows lp_at names] the summaries (lp_at) */
    const uint32_t *const *mask; /* NULL, or [nrows]: row i's allowed ids as bits (id v: word v / 32,
                                bit v % 32; ceil(V / 32) words), NULL for a free row.  Every id a
                                mask leaves out is -inf before the row's argmax, summary and logits
                                are made (a constrained request's rows: src/constrain/) */
    int naux;                /* aux hidden states requested */
    const int *aux_layers;   /* [naux] layer ids j */
    float *aux;              /* [naux, nrows, H] f32 residual stream entering layer j, or NULL */
} sm_step;

typedef struct sm_backend {
    const char *name;        /* "cpu", "cuda", ... */
    void *ctx;
    int (*step)(void *ctx, const sm_step *s, sm_err *e);
    void (*destroy)(void *ctx);
    int max_verify_rows;     /* most rows of one request a verify step may have (0 = any); a
                                longer run of one request is a prefill (cuda: eager) */
    int kv_pages;            /* cuda with kv_mem_util: the KV pages it allocated (the engine's pool
                                is then made that size); 0: kv->nblocks, as given */
} sm_backend;

typedef struct sm_backend_opts {
    int nthreads;            /* cpu: worker threads (0 = online cores) */
    int world;               /* ranks (tensor + expert parallel), 1 = none */
    int moe_tp;              /* 1: TP without EP (experts split along I); 0: EP */
    int max_rows;            /* most rows one step may carry */
    int verify_rows;         /* rows of one request in a verify step (the engine's R), checked
                                against the backend's max_verify_rows at creation; 0 = unchecked */
    int device;              /* cuda: device ordinal of rank 0 (default 0); rank r uses device + r
                                unless `devices` lists them */
    const int *devices;      /* cuda, world > 1: [world] device of each rank, or NULL; a repeated
                                device holds several "virtual" ranks (tests on one GPU) */
    int comm;                /* cuda, world > 1: SM_COMM_PEER (0, default) or SM_COMM_NCCL */
    int mono;                /* cuda: SM_MONO_AUTO (0, default), SM_MONO_ON, SM_MONO_OFF: layers 1..L-2 of
                                verify steps as persistent launches (docs/architecture.md) */
    double kv_mem_util;      /* cuda, > 0: size the KV pool from memory (sparkmono_engine_opts.
                                gpu_memory_utilization): after the weights, the pages that fit in this
                                share of each device; kv->nblocks only gives the pool's shape then */
} sm_backend_opts;
#define SM_MONO_AUTO 0   /* the monokernel where eligible, stock elsewhere (one log line a reason) */
#define SM_MONO_ON 1     /* as auto, but a static refusal is an engine-creation error */
#define SM_MONO_OFF 2    /* stock steps only */
#define SM_COMM_PEER 0   /* cross-rank exchanges: one-shot kernels over peer memory (cuda/comm/gcomm.h) */
#define SM_COMM_NCCL 1   /* cross-rank exchanges: NCCL all-gathers + rank-order finish kernels */

/* The CPU reference backend (src/cpu/). kv gives the page count to allocate. */
int sm_cpu_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e);
/* The CPU world backend (src/cpu/world.c): o->world rank threads, tensor + expert parallel
 * (docs/model.md section 9, docs/parallelism.md); o->moe_tp 1 splits every expert along I (TP
 * without EP), 0 splits the experts (EP).  Refuses a world size the model does not divide. */
int sm_world_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e);

#ifdef SM_HAVE_CUDA
/* The CUDA backend (src/cuda/rank/), one GPU (o->device): rank 0 of world 1's shard
 * uploaded from the mapped checkpoint, paged KV cache on the device, verify steps
 * graph-captured per row bucket.  Refuses o->verify_rows above its max_verify_rows (16).
 * o->world > 1: W ranks, each on its device (o->devices) with its own context and host thread,
 * exchanging through o->comm (src/cuda/rank/world.cu, docs/parallelism.md). */
int sm_cuda_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b, sm_err *e);
#endif

#ifdef __cplusplus
}
#endif
#endif
