/* shard.h: what one rank of W owns of a loaded model (docs/model.md section 9), as views.
 *
 * Tensor parallelism splits the attention by heads, the pooler and unpooler by output rows,
 * the embedding and lm_head by vocabulary rows, and the experts either whole (EP: rank r
 * holds experts [r*E/W, (r+1)*E/W)) or along I (TP without EP: rank r holds gate_up rows
 * [r*I/W, (r+1)*I/W) and the matching up rows, and the same columns of down, of every
 * expert).  The router, every norm and every residual-gate vector are replicated.
 * Every field below is a view into the model (the mmapped checkpoint, or the loader's owned
 * buffers): a rank reads only the bytes it owns and nothing is copied.  Column slices
 * (o_proj, down) are strided views: a pointer to the slice's first element plus the full
 * matrix's row length as leading dimension.  The model must outlive its shards.
 * We rejected copying each rank's slice into a contiguous buffer: on the real model that is
 * a second copy of 1/4 TB, and the GPU upload reads the slices straight from the mapping.
 *
 * Divisibility (all refused with one line naming every dimension that does not divide):
 * nH, nKV, Hm, H and V by W; E by W (EP) or I by W (TP); with MXFP4 experts in TP mode,
 * I/W must be a multiple of 32 (a column slice of down must not cut a scale block).  The
 * vocabulary is refused, not padded: padding would invent lm_head rows the checkpoint does
 * not have (the real V = 202048 divides 8).
 */
#ifndef SM_SHARD_H
#define SM_SHARD_H
#include <stdint.h>
#include "model/weights.h"

#define SM_MAX_WORLD 64 /* most ranks (comm bookkeeping uses 64-bit rank masks) */

typedef enum sm_moe_layout {
    SM_MOE_EP = 0, /* experts split whole across ranks */
    SM_MOE_TP = 1  /* every expert split along I across ranks (TP without EP) */
} sm_moe_layout;

/* A (possibly strided) view of an expert matrix slice of `rows` x `cols` values. */
typedef struct sm_shard_mat {
    const void *w;   /* value (0, 0) of the slice in its storage: BF16 uint16_t, FP8 uint8_t,
                        MXFP4 uint8_t pairs (cols even, column offset a multiple of 32) */
    const void *s;   /* NULL (BF16) | FP8: float [rows] scale of each slice row |
                        MXFP4: e8m0 byte of the slice's first block, [rows, cols/32] */
    int64_t ld;      /* values between consecutive rows (the full matrix's column count) */
} sm_shard_mat;

/* One layer's experts as held by a rank. */
typedef struct sm_shard_experts {
    sm_expert_fmt fmt;     /* storage format of every expert of the layer */
    int e0, ne;            /* global experts [e0, e0 + ne) held: EP E/W of them, TP all E */
    int i0, ni;            /* I indices [i0, i0 + ni) held: EP all I, TP I/W */
    sm_shard_mat *gate;    /* [ne] gate rows i0.. of gate_up: [ni, Hm], ld Hm */
    sm_shard_mat *up;      /* [ne] up rows I + i0.. of gate_up: [ni, Hm], ld Hm */
    sm_shard_mat *down;    /* [ne] columns i0.. of down: [Hm, ni], ld I */
    int act_mx;            /* sm_experts.act_mx: 1 W4A4 (TP slices hold whole 32-blocks of I) */
} sm_shard_experts;

typedef struct sm_shard_layer {
    const sm_layer *full;       /* the whole layer: norms, residual gates, router (replicated) */
    const uint16_t *wq, *wg;    /* [nHl*D, H] bf16 rows h0*D.. of q_proj / gate_proj (row stride H) */
    const uint16_t *wk, *wv;    /* [nKVl*D, H] bf16 rows kv0*D.. of k_proj / v_proj */
    const uint16_t *wo;         /* [H, nHl*D] bf16 columns h0*D.. of o_proj, row stride ld_wo */
    int64_t ld_wo;              /* = nH*D */
    const uint16_t *pooler;     /* [np, H] bf16 rows p0.. of pre_expert_proj */
    const uint16_t *unpooler;   /* [nu, Hm] bf16 rows u0.. of post_expert_proj */
    sm_shard_experts ex;        /* this rank's experts (EP) or expert slices (TP) */
} sm_shard_layer;

typedef struct sm_shard {
    const sm_model *m;          /* the model the views point into */
    int rank, world;            /* this rank, ranks in all */
    sm_moe_layout moe;          /* expert layout */
    int h0, nHl;                /* query heads [h0, h0 + nHl), nHl = nH/W */
    int kv0, nKVl;              /* KV heads [kv0, kv0 + nKVl), nKVl = nKV/W */
    int p0, np;                 /* pooled features (pooler rows) [p0, p0 + np), np = Hm/W */
    int u0, nu;                 /* hidden features (unpooler rows) [u0, u0 + nu), nu = H/W */
    int v0, nv;                 /* vocabulary rows [v0, v0 + nv), nv = V/W */
    const uint16_t *embed;      /* [nv, H] bf16 rows v0.. of embed_tokens */
    const uint16_t *lm_head;    /* [nv, H] bf16 rows v0.. of lm_head */
    sm_shard_layer *layers;     /* [L] owned (the views in it are not) */
    sm_shard_mat *mats;         /* [L * 3 * ne] storage of every layer's gate/up/down views (owned) */
} sm_shard;

/* Parse "ep" / "tp" into *out; error naming the word otherwise. */
int sm_moe_layout_parse(const char *s, sm_moe_layout *out, sm_err *e);
const char *sm_moe_layout_name(sm_moe_layout l); /* "ep", "tp" */
/* The layout of an options' moe_tp flag (nonzero: TP, 0: EP): the one conversion. */
sm_moe_layout sm_moe_layout_of(int moe_tp);

/* THE validator of a world size and layout, called once where the option enters (the engine,
 * `sparkmono bench`); every layer below asserts what it established.  Can a model of config c
 * run on `world` ranks with this layout?  world in [1, SM_MAX_WORLD], then one line listing
 * every dimension that does not divide (e.g. "world 3 does not divide num_attention_heads
 * nH = 16, ...").  Format-independent checks only; sm_shard_check adds the MXFP4 rule. */
int sm_shard_check_config(const sm_config *c, int world, sm_moe_layout moe, sm_err *e);
/* sm_shard_check_config plus, in TP mode, I/W a multiple of 32 on every MXFP4 layer. */
int sm_shard_check(const sm_model *m, int world, sm_moe_layout moe, sm_err *e);
/* The ranges alone: fill rank, world, moe and the index ranges (h0/nHl .. v0/nv) of rank
 * `rank` of a model of config c; m, every view and layers stay NULL (a device backend sizes
 * its buffers from them before, or without, a loaded model).  Asserts that (world, moe)
 * passed sm_shard_check_config and rank is in [0, world). */
void sm_shard_plan(const sm_config *c, int world, int rank, sm_moe_layout moe, sm_shard *s);
/* Fill *s with rank `rank`'s views of m (asserts as sm_shard_plan; sm_shard_check passed).
 * On error (out of memory) *s is zeroed. */
int sm_shard_make(const sm_model *m, int world, int rank, sm_moe_layout moe, sm_shard *s, sm_err *e);
void sm_shard_free(sm_shard *s);

/* The rank's part of a tensor in its loaded form: `rows` rows of `row_bytes` bytes, row i at
 * host + i * pitch (pitch > row_bytes: a column slice; a vector is one row). */
typedef struct sm_shard_part {
    const void *host;          /* the part's first byte: a view into the model; NULL when the
                                  model has no such loaded form (the experts) */
    int64_t rows, row_bytes;   /* its shape in bytes */
    int64_t pitch;             /* bytes between consecutive rows in the model */
} sm_shard_part;

/* Rank s->rank's part of role r (tensors.h) of layer l (ignored for a model-level role),
 * vector k (1: a residual gate's beta), by the table's split rule over the loaded form
 * (sm_model_tensor).  s must have been made by sm_shard_make. */
sm_shard_part sm_shard_tensor(const sm_shard *s, int l, sm_tensor_role r, int k);

/* Decode `cols` values of row `row` of an expert slice view into out [cols] as bf16-exact
 * floats (the same values as sm_expert_row gives for those positions), reading only the
 * slice's bytes.  MXFP4: cols a multiple of 32. */
void sm_shard_mat_row(sm_expert_fmt fmt, const sm_shard_mat *v, int row, int cols, float *out);

/* The devices of `world` ranks from "0,1,2,3" (engine option devices, --devices): exactly
 * `world` comma-separated ordinals in [0, 63] into out [world]; one line naming the list
 * otherwise.  A device may repeat (several ranks on one device). */
int sm_devices_parse(const char *s, int world, int *out, sm_err *e);

/* Rows [*lo, *hi) of n that rank `rank` of `world` owns in a row-sharded (token-sharded)
 * phase: lo = rank*n/world, balanced, some ranks empty when n < world. */
static inline void sm_shard_rows(int n, int world, int rank, int *lo, int *hi) {
    *lo = (int)((int64_t)rank * n / world);
    *hi = (int)((int64_t)(rank + 1) * n / world);
}

#endif
