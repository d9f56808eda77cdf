/* backend_priv.h: the device state of the CUDA stock backend, shared by backend.cu (upload,
 * step, graphs, bench hooks) and synth.cu (weights generated on the device).  CUDA types
 * allowed: included by .cu files only.
 *
 * One context per backend: the weights of every layer on the device (dense matrices carved
 * from one allocation per layer, experts in moe.cu's layout), the paged KV cache, fixed
 * activation buffers for `cap` rows and one packed metadata buffer that every kernel of a
 * step reads, so a captured CUDA graph only needs that buffer refreshed.  We rejected
 * per-step allocations and pointer arguments that change between steps: a graph bakes its
 * pointers in, so everything it touches must live at a fixed address for the backend's life.
 */
#ifndef SM_CUDA_BACKEND_PRIV_H
#define SM_CUDA_BACKEND_PRIV_H
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" { /* C headers without their own extern "C" guards: include them first */
#include "err.h"
#include "backend.h"
}
#include "cuda/kernels.h"
#include "cuda/moe.h"

#define CB_NBUCKETS 8          /* graph row buckets: 8 16 24 32 48 64 96 128 */
#define CB_GRAPH_ROWS 128      /* most rows of a graph-captured step */
#define CB_GRAPH_REQ_ROWS 16   /* most rows of one request in a graph-captured step */
#define CB_LOGIT_ROWS 128      /* rows of the device logits buffer (lm_head runs in chunks) */
#define CB_MAX_AUX (SM_MAX_LAYERS + 1)

/* One layer on the device.  Dense fields are carved from `dense` (one cudaMalloc). */
typedef struct cb_layer {
    int full;                  /* 1: full attention (NoPE), 0: sliding window + RoPE */
    uint16_t *wqkvg;           /* [(2 nH + 2 nKV) D, H] bf16: rows q | k | v | gate */
    uint16_t *wo;              /* [H, nH D] bf16 */
    float *in_norm;            /* [H] eff(input_layernorm) */
    float *att_alpha, *att_beta; /* [H] post-attention residual gate */
    float *pre_ffn_norm;       /* [H] eff(pre_feedforward_layernorm) */
    float *post_ffn_norm;      /* [H] eff(post_feedforward_layernorm) */
    float *ffn_alpha, *ffn_beta; /* [H] post-FFN residual gate */
    float *router;             /* [E, H] f32 */
    float *router_bias;        /* [E] f32 */
    uint16_t *pooler;          /* [Hm, H] bf16 */
    float *pre_expert_norm;    /* [Hm] eff(pre_expert_norm) */
    uint16_t *unpooler;        /* [H, Hm] bf16 */
    sm_cuda_moe_layer moe;     /* experts (moe.cu layout) */
    int have_moe;              /* moe holds device memory */
    void *dense;               /* the allocation the dense fields live in */
    size_t dense_bytes;        /* its size */
    uint16_t *kv;              /* [nblocks + 1][nKV][16][2 D] bf16; page nblocks stays zero
                                  (the page of padding rows) */
} cb_layer;

/* A captured step graph: one per (row bucket, logits wanted). */
typedef struct cb_graph {
    cudaGraphExec_t exec;      /* NULL: not captured */
    int naux;                  /* aux entries it copies */
    int aux[CB_MAX_AUX];       /* [naux] their layer ids, in the step's order */
} cb_graph;

typedef struct cb_ctx {
    sm_config cfg;             /* the model configuration */
    int device;                /* CUDA device ordinal */
    sm_cuda_ctx kc;            /* stock-kernel context (cuBLAS, workspace) */
    int have_kc;               /* kc initialized */
    cudaStream_t st;           /* the one stream every step runs on */
    cb_layer *layers;          /* [L] */
    uint16_t *embed;           /* [V, H] bf16 */
    uint16_t *lm_head;         /* [V, H] bf16 */
    float *final_norm;         /* [H] final norm weight as is */
    void *glob;                /* allocation holding embed, lm_head, final_norm */
    int nblocks;               /* KV pages per layer (page nblocks = zero page) */
    int max_req, max_len, max_bpr; /* sm_kv geometry the backend was made for */
    int cap;                   /* rows the activation buffers hold (steps are chunked) */
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
    cb_graph graphs[CB_NBUCKETS][2]; /* [bucket][logits wanted] */
    int last_nb;               /* rows (padded) of the last step's final chunk */
    int last_graph;            /* that chunk ran through a graph */
    double weight_bytes;       /* bytes of weights on the device */
} cb_ctx;

/* backend.cu: allocate everything except the weights (activations, metadata, KV, stream,
 * kernel context); cfg, cap and the kv geometry are taken from the arguments. */
int cb_ctx_create(const sm_config *cfg, const sm_kv *kv, const sm_backend_opts *o, cb_ctx **out, sm_err *e);
/* backend.cu: carve one layer's dense allocation (fills every dense pointer of L). */
int cb_layer_alloc(cb_ctx *c, cb_layer *L, sm_err *e);
/* backend.cu: allocate embed / lm_head / final_norm. */
int cb_glob_alloc(cb_ctx *c, sm_err *e);
/* backend.cu: fill the sm_backend table once every weight is on the device. */
void cb_backend_fill(cb_ctx *c, sm_backend *b);
/* backend.cu: free everything (safe on a partly built context). */
void cb_ctx_destroy(cb_ctx *c);
/* backend.cu: the context of a CUDA backend, or NULL (with an error) for any other backend. */
cb_ctx *cb_from_backend(const sm_backend *b, sm_err *e);

#endif
