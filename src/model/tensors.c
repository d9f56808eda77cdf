/* tensors.c: the tensor tables of tensors.h and their small helpers (names, shapes, bytes).
 *
 * The rows follow docs/model.md section 2; the make-model magnitudes follow DESIGN.md
 * "Numbers" (matrices N(0, 1/fan_in), norm gains near 0, residual gates N(0, 0.5), router bias
 * N(0, 0.01), embedding rows of RMS 1).  Shapes are dimension codes resolved against the
 * config at the time of use, so one row serves every model size.  We rejected a shape callback
 * per row: a code string reads like the spec's table and cannot hide arithmetic.
 */
#include "model/tensors.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Short names for the columns below (undefined after the table). */
#define T_(role, name, bare, dt, dims, kind, split, part, first, mean, std) \
    [role] = {name, bare, ST_##dt, dims, SM_TK_##kind, SM_SPLIT_##split, SM_PART_##part, first, mean, std}

const sm_tensor_def sm_tensors[SM_T_N] = {
    /*  role                   name                                bare dtype dims   kind     split    part   first mean std */
    T_(SM_T_IN_NORM,          "input_layernorm.weight",               0, BF16, "H",   NORM1,   NONE,    NORMS,   0, 0.0f, 0.02f),
    T_(SM_T_WQ,               "self_attn.q_proj.weight",              0, BF16, "QH",  VIEW,    ROWS,    ATTN,    0, 0.0f, 0.0f),
    T_(SM_T_WK,               "self_attn.k_proj.weight",              0, BF16, "KH",  VIEW,    ROWS,    ATTN,    0, 0.0f, 0.0f),
    T_(SM_T_WV,               "self_attn.v_proj.weight",              0, BF16, "KH",  VIEW,    ROWS,    ATTN,    0, 0.0f, 0.0f),
    T_(SM_T_WG,               "self_attn.gate_proj.weight",           0, BF16, "QH",  VIEW,    ROWS,    ATTN,    0, 0.0f, 0.0f),
    T_(SM_T_WO,               "self_attn.o_proj.weight",              0, BF16, "HQ",  VIEW,    COLS,    ATTN,    0, 0.0f, 0.0f),
    T_(SM_T_ATT_GATE,         "post_attention_residual_gate.gate",    0, BF16, "H",   GATE,    NONE,    NORMS,   0, 0.0f, 0.5f),
    T_(SM_T_PRE_FFN_NORM,     "pre_feedforward_layernorm.weight",     0, BF16, "H",   NORM1,   NONE,    NORMS,   0, 0.0f, 0.02f),
    T_(SM_T_POST_FFN_NORM,    "post_feedforward_layernorm.weight",    0, BF16, "H",   NORM1,   NONE,    NORMS,   0, 0.0f, 0.02f),
    T_(SM_T_FFN_GATE,         "post_feedforward_residual_gate.gate",  0, BF16, "H",   GATE,    NONE,    NORMS,   0, 0.0f, 0.5f),
    T_(SM_T_ROUTER,           "mlp.gate.weight",                      0, F32,  "EH",  VIEW,    NONE,    ROUTER,  0, 0.0f, 0.0f),
    T_(SM_T_ROUTER_BIAS,      "mlp.gate.e_score_correction_bias",     0, F32,  "E",   VIEW,    NONE,    ROUTER,  0, 0.0f, 0.01f),
    T_(SM_T_POOLER,           "mlp.pre_expert_proj.weight",           0, BF16, "MH",  VIEW,    ROWS,    POOL,    0, 0.0f, 0.0f),
    T_(SM_T_PRE_EXPERT_NORM,  "mlp.pre_expert_norm.weight",           0, BF16, "M",   NORM1,   NONE,    NORMS,   0, 0.0f, 0.02f),
    T_(SM_T_POST_EXPERT_NORM, "mlp.experts.post_expert_norm.weight",  0, BF16, "M",   NORM1,   NONE,    NORMS,   0, 0.0f, 0.02f),
    T_(SM_T_UNPOOLER,         "mlp.post_expert_proj.weight",          0, BF16, "HM",  VIEW,    ROWS,    POOL,    0, 0.0f, 0.0f),
    T_(SM_T_EXPERTS_GU,       "mlp.experts.gate_up_proj",             0, BF16, "E2M", EXPERTS, EXPERTS, EXPERTS, 0, 0.0f, 0.0f),
    T_(SM_T_EXPERTS_DN,       "mlp.experts.down_proj",                0, BF16, "EMI", EXPERTS, EXPERTS, EXPERTS, 0, 0.0f, 0.0f),
    /* model-level */
    T_(SM_T_EMBED,            "embed_tokens.weight",                  0, BF16, "VH",  VIEW,    ROWS,    EMBED,   1, 0.0f, 1.0f),
    T_(SM_T_FINAL_NORM,       "norm.weight",                          0, BF16, "H",   NORM0,   NONE,    NORMS,   0, 1.0f, 0.02f),
    T_(SM_T_LM_HEAD,          "lm_head.weight",                       1, BF16, "VH",  VIEW,    ROWS,    LM_HEAD, 0, 0.0f, 0.0f),
};
#undef T_

int64_t sm_tensor_dim(const sm_config *c, char code) {
    switch (code) {
    case 'H': return c->H;
    case 'Q': return (int64_t)c->nH * c->D;
    case 'K': return (int64_t)c->nKV * c->D;
    case 'E': return c->E;
    case 'M': return c->Hm;
    case 'I': return c->I;
    case '2': return 2 * (int64_t)c->I;
    case 'V': return c->V;
    }
    return -1;
}

int sm_tensor_shape(const sm_config *c, sm_tensor_role r, int64_t *shape) {
    const char *d = sm_tensors[r].dims;
    int n = (int)strlen(d);
    for (int i = 0; i < n; i++) shape[i] = sm_tensor_dim(c, d[i]);
    return n;
}

int64_t sm_tensor_numel(const sm_config *c, sm_tensor_role r) {
    int64_t s[3], n = 1;
    int nd = sm_tensor_shape(c, r, s);
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

int64_t sm_tensor_bytes(const sm_config *c, sm_tensor_role r) {
    return st_nbytes(sm_tensors[r].dtype, sm_tensor_numel(c, r));
}

void sm_tensor_loaded(sm_tensor_role r, int *nvec, int *elt_bytes) {
    const sm_tensor_def *d = &sm_tensors[r];
    *nvec = d->kind == SM_TK_GATE ? 2 : d->kind == SM_TK_EXPERTS ? 0 : 1;
    *elt_bytes = d->kind == SM_TK_VIEW ? st_dtype_bits(d->dtype) / 8 : 4;
}

int64_t sm_tensor_loaded_bytes(const sm_config *c, sm_tensor_role r) {
    int nvec, eb;
    sm_tensor_loaded(r, &nvec, &eb);
    return nvec * eb * sm_tensor_numel(c, r);
}

void sm_tensor_name(char *buf, size_t n, sm_tensor_role r, int l) {
    const sm_tensor_def *d = &sm_tensors[r];
    if (r < SM_T_NLAYER) snprintf(buf, n, SM_TENSOR_PREFIX "layers.%d.%s", l, d->name);
    else snprintf(buf, n, "%s%s", d->bare ? "" : SM_TENSOR_PREFIX, d->name);
}

int sm_tensor_find_layer(const char *s) {
    for (int r = 0; r < SM_T_NLAYER; r++)
        if (!strcmp(s, sm_tensors[r].name)) return r;
    return -1;
}

int sm_tensor_find_model(const char *s) {
    size_t np = sizeof SM_TENSOR_PREFIX - 1;
    for (int r = SM_T_NLAYER; r < SM_T_N; r++) {
        const sm_tensor_def *d = &sm_tensors[r];
        if (d->bare ? !strcmp(s, d->name) : !strncmp(s, SM_TENSOR_PREFIX, np) && !strcmp(s + np, d->name)) return r;
    }
    return -1;
}

void sm_tensor_init(const sm_config *c, sm_tensor_role r, float *mean, float *std) {
    const sm_tensor_def *d = &sm_tensors[r];
    int64_t s[3];
    int nd = sm_tensor_shape(c, r, s);
    *mean = d->mean;
    *std = d->std != 0.0f ? d->std : 1.0f / sqrtf((float)s[nd - 1]); /* N(0, 1/fan_in), fan_in = columns */
}

/* ---- per-expert tensors ---- */

const char *const sm_expert_slot_suffix[SM_XS_N] = {
    "gate_up_proj.weight", "gate_up_proj.weight_scale", "down_proj.weight", "down_proj.weight_scale"};

const sm_expert_format sm_expert_formats[SM_EXP_NFMT] = {
    [SM_EXP_BF16] = {"bf16", 16, ST_BF16, ST_BF16, 0, ST_BF16, ST_BF16},
    [SM_EXP_FP8] = {"fp8", 8, ST_F8_E4M3, ST_F8_E4M3, 1, ST_F32, ST_F32},   /* e4m3, f32 scale a row */
    [SM_EXP_MXFP4] = {"mxfp4", 4, ST_U8, ST_F4, 32, ST_U8, ST_F8_E8M0},    /* e2m1 pairs, e8m0 a block */
};

void sm_expert_dims(const sm_config *c, int mat, int64_t *rows, int64_t *cols) {
    *rows = mat ? c->Hm : 2 * (int64_t)c->I;
    *cols = mat ? c->I : c->Hm;
}

int sm_expert_fmt_of_dtype(st_dtype dt) {
    for (int f = 0; f < SM_EXP_NFMT; f++)
        if (dt == sm_expert_formats[f].w || dt == sm_expert_formats[f].w_alt) return f;
    return -1;
}

int sm_expert_slot_shape(const sm_config *c, sm_expert_fmt f, int s, st_dtype dt, int64_t *shape) {
    const sm_expert_format *F = &sm_expert_formats[f];
    int64_t rows, cols;
    sm_expert_dims(c, s / 2, &rows, &cols);
    shape[0] = rows;
    if (s % 2 == 0) { /* weights: value_bits-bit values packed into dtype dt */
        shape[1] = cols * F->value_bits / st_dtype_bits(dt);
        return 2;
    }
    if (F->scale == 0) return 0;
    if (F->scale == 1) return 1;
    shape[1] = cols / F->scale;
    return 2;
}

void sm_expert_tensor_name(char *buf, size_t n, int l, int x, int s) {
    snprintf(buf, n, SM_TENSOR_PREFIX "layers.%d.mlp.experts.%d.%s", l, x, sm_expert_slot_suffix[s]);
}
