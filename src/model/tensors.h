/* tensors.h: the one table of the checkpoint's tensors (docs/model.md section 2).
 *
 * Every tensor of a layer and of the model is one row of sm_tensors: its name, stored dtype,
 * shape in terms of the config, what the loader makes of it (a view, eff(g) = r16(1 + g), the
 * residual-gate alpha/beta, the final norm as is, consolidated experts), how W ranks split it,
 * which component of the byte summary it counts in, and the distribution make-model draws it
 * from.  The per-expert tensors of quantized layers are the second table (sm_expert_formats:
 * dtypes and shapes per format).  The loader (weights.c), make-model, the shards, `check`, the
 * CUDA upload, its dense check and the device-synthesized models all walk these tables; code
 * that must treat one tensor specially (the device address of q inside the fused qkvg matrix,
 * the cycle model's lm_head) is keyed by the role enum, never by the name string.  Adding a
 * tensor is one row here, a field for its loaded form (weights.h, cuda/exec/exec.h) and the
 * code that uses it.  We rejected one list per consumer (the previous state): five lists of
 * the same names and shapes drift apart silently.
 */
#ifndef SM_TENSORS_H
#define SM_TENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SM_TENSOR_PREFIX "model.language_model." /* P of docs/model.md section 2 */

/* Roles: the per-layer tensors first (names "P layers.{l}." + suffix), in the order make-model
 * writes them, then the model-level ones. */
typedef enum sm_tensor_role {
    SM_T_IN_NORM, SM_T_WQ, SM_T_WK, SM_T_WV, SM_T_WG, SM_T_WO, SM_T_ATT_GATE, SM_T_PRE_FFN_NORM,
    SM_T_POST_FFN_NORM, SM_T_FFN_GATE, SM_T_ROUTER, SM_T_ROUTER_BIAS, SM_T_POOLER, SM_T_PRE_EXPERT_NORM,
    SM_T_POST_EXPERT_NORM, SM_T_UNPOOLER, SM_T_EXPERTS_GU, SM_T_EXPERTS_DN,
    SM_T_NLAYER,                                   /* count of per-layer roles */
    SM_T_EMBED = SM_T_NLAYER, SM_T_FINAL_NORM, SM_T_LM_HEAD,
    SM_T_N                                         /* count of all roles */
} sm_tensor_role;

/* What the loader keeps of a tensor (weights.h), its "loaded form". */
typedef enum sm_tensor_kind {
    SM_TK_VIEW,    /* the stored values, in place (bf16 or f32 view) */
    SM_TK_NORM1,   /* a norm gain centred at 1: eff(g) = r16(1 + g), f32 */
    SM_TK_NORM0,   /* the final norm gain, used as stored: f32(g) */
    SM_TK_GATE,    /* a residual gate vector: two f32 vectors alpha, beta (sm_residual_gate) */
    SM_TK_EXPERTS  /* consolidated BF16 experts [E, rows, cols] (or per-expert tensors instead) */
} sm_tensor_kind;

/* How rank r of W holds it (docs/parallelism.md). */
typedef enum sm_tensor_split {
    SM_SPLIT_NONE, /* replicated */
    SM_SPLIT_ROWS, /* rows [r rows/W, (r+1) rows/W): heads, pooled / hidden features, vocabulary */
    SM_SPLIT_COLS, /* columns [r cols/W, (r+1) cols/W) of every row (o_proj) */
    SM_SPLIT_EXPERTS /* whole experts (EP) or a slice of I of every expert (TP), shard.h */
} sm_tensor_split;

/* Component of the byte summary of `check` (check.h: sm_bytes). */
typedef enum sm_tensor_part {
    SM_PART_EMBED, SM_PART_LM_HEAD, SM_PART_ATTN, SM_PART_ROUTER, SM_PART_POOL, SM_PART_NORMS, SM_PART_EXPERTS
} sm_tensor_part;

typedef struct sm_tensor_def {
    const char *name;        /* per layer: the suffix after "P layers.{l}."; per model: the
                                suffix after P, or the whole name when `bare` */
    int bare;                /* 1: the name has no prefix P (lm_head.weight) */
    st_dtype dtype;          /* stored dtype */
    char dims[4];            /* shape, one code a dimension: H hidden, Q nH*D, K nKV*D, E experts,
                                M Hm, I I, 2 2I, V vocabulary */
    sm_tensor_kind kind;
    sm_tensor_split split;
    sm_tensor_part part;
    int first;               /* model-level: make-model writes it before the layers */
    float mean, std;         /* make-model's values: mean + std * z, z ~ N(0, 1); std 0 means
                                1 / sqrt(columns) (N(0, 1/fan_in)) */
} sm_tensor_def;

extern const sm_tensor_def sm_tensors[SM_T_N];

/* Value of a dimension code of sm_tensor_def.dims (-1 for an unknown code). */
int64_t sm_tensor_dim(const sm_config *c, char code);
/* Shape of role r into shape [3]; returns ndim (1..3). */
int sm_tensor_shape(const sm_config *c, sm_tensor_role r, int64_t *shape);
/* Elements of role r; its stored bytes. */
int64_t sm_tensor_numel(const sm_config *c, sm_tensor_role r);
int64_t sm_tensor_bytes(const sm_config *c, sm_tensor_role r);
/* Loaded form of role r (SM_TK_EXPERTS: none): *nvec arrays (2 for a gate, else 1) of
 * *elt_bytes a value (the stored dtype for a view, else 4: f32), each of the stored shape. */
void sm_tensor_loaded(sm_tensor_role r, int *nvec, int *elt_bytes);
/* Bytes of that loaded form, all vectors (0 for the consolidated experts). */
int64_t sm_tensor_loaded_bytes(const sm_config *c, sm_tensor_role r);
/* Full name of role r in layer l (l ignored for a model-level role). */
void sm_tensor_name(char *buf, size_t n, sm_tensor_role r, int l);
/* The per-layer role whose suffix is s, or -1. */
int sm_tensor_find_layer(const char *s);
/* The model-level role whose full name is s, or -1. */
int sm_tensor_find_model(const char *s);
/* make-model's mean and std of role r (std resolved: never 0). */
void sm_tensor_init(const sm_config *c, sm_tensor_role r, float *mean, float *std);

/* ---- per-expert tensors of quantized layers: "P layers.{l}.mlp.experts.{x}." + suffix ---- */

typedef enum sm_expert_fmt { SM_EXP_BF16 = 0, SM_EXP_FP8 = 1, SM_EXP_MXFP4 = 2 } sm_expert_fmt;
#define SM_EXP_NFMT 3

/* The four tensors of one expert: gate_up weight and scale, down weight and scale.  Slot s
 * belongs to logical matrix s / 2 (0 gate_up [2I, Hm], 1 down [Hm, I]), s % 2 is the scale. */
typedef enum sm_expert_slot { SM_XS_GU_W, SM_XS_GU_S, SM_XS_DN_W, SM_XS_DN_S, SM_XS_N } sm_expert_slot;
extern const char *const sm_expert_slot_suffix[SM_XS_N];

/* One expert storage format.  Weights: a matrix [rows, cols] of `value_bits`-bit values stored
 * as dtype w (or w_alt), [rows, cols * value_bits / bits(dtype)].  Scales: none, one a row
 * (s [rows]), or one a block of 32 values of a row (s or s_alt [rows, cols / 32]). */
typedef struct sm_expert_format {
    const char *name;        /* "bf16", "fp8", "mxfp4" */
    int value_bits;          /* bits of one stored value: 16, 8, 4 */
    st_dtype w, w_alt;       /* weight dtype make-model writes; also accepted (= w if none) */
    int scale;               /* 0 none, 1 one a row, 32 one a block of 32 values of a row */
    st_dtype s, s_alt;       /* scale dtype make-model writes; also accepted */
} sm_expert_format;

extern const sm_expert_format sm_expert_formats[SM_EXP_NFMT]; /* [sm_expert_fmt] */

/* Rows and columns of logical matrix mat (0 gate_up [2I, Hm], 1 down [Hm, I]). */
void sm_expert_dims(const sm_config *c, int mat, int64_t *rows, int64_t *cols);
/* The format whose weight dtype (w or w_alt) is dt, or -1. */
int sm_expert_fmt_of_dtype(st_dtype dt);
/* Shape of slot s of format f stored as dtype dt (a weight or scale dtype of f); returns ndim,
 * 0 when f has no such tensor (scales of BF16). */
int sm_expert_slot_shape(const sm_config *c, sm_expert_fmt f, int s, st_dtype dt, int64_t *shape);
/* Full name of slot s of expert x in layer l. */
void sm_expert_tensor_name(char *buf, size_t n, int l, int x, int s);

#ifdef __cplusplus
}
#endif
#endif
