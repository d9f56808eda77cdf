/* weights.h: a loaded checkpoint as plain structs (docs/model.md section 2).
 *
 * Matrices are views into the mmapped safetensors files (bf16 as uint16_t bits, f32 as float),
 * never copies, except where a copy is unavoidable: a view not aligned for its type, experts
 * quantized online to MXFP4, and the small per-channel vectors we precompute once (effective
 * norm weights eff(g) = r16(1 + g) and the residual-gate coefficients alpha/beta).  Owned
 * buffers are listed in sm_model.owned and freed by sm_model_free.  We rejected converting
 * everything to one in-memory format at load: the real model is 1/4 TB, and the GPU upload
 * reads straight from the mapping.
 */
#ifndef SM_WEIGHTS_H
#define SM_WEIGHTS_H
#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sm_expert_fmt and the per-expert tensors of each format: tensors.h. */
const char *sm_expert_fmt_name(sm_expert_fmt f); /* "bf16", "fp8", "mxfp4" */

/* Checkpoint bytes of one expert matrix of rows x cols values in format f: its weights
 * (*wbytes: BF16 2 bytes a value, FP8 1, MXFP4 1/2) and its scales (*sbytes: BF16 none, FP8 one
 * f32 a row, MXFP4 one e8m0 byte per 32 values of a row); cols a multiple of 32 for MXFP4.
 * Either pointer may be NULL.  The one statement of the storage sizes (docs/model.md section
 * 2): the loader, make-model, shards, the summary of `check` and the device upload use it. */
void sm_expert_mat_bytes(sm_expert_fmt f, int64_t rows, int64_t cols, size_t *wbytes, size_t *sbytes);
/* Checkpoint bytes of one whole expert of config c in format f: gate_up [2I, Hm] and down
 * [Hm, I], weights and scales.  (The device layout has its own size:
 * sm_cuda_moe_device_expert_bytes.) */
size_t sm_expert_bytes(const sm_config *c, sm_expert_fmt f);

/* 1 when layer l keeps BF16 experts although the other layers are quantized: layers 0 and
 * L-1, as the Quark OCP-MX export does (docs/model.md section 2).  The one statement of the
 * rule: make-model, online MXFP4 at load and the device-synthesized models follow it. */
int sm_layer_keeps_bf16(const sm_config *c, int l);

/* One layer's experts, all in one format.  Per expert e (views or owned):
 *   gu[e]:  gate_up [2I, Hm]  rows 0..I-1 gate, I..2I-1 up
 *           BF16: uint16_t [2I, Hm] | FP8: uint8_t e4m3 [2I, Hm] | MXFP4: uint8_t [2I, Hm/2]
 *   gus[e]: NULL | float [2I] (FP8 per-row scale) | uint8_t e8m0 [2I, Hm/32] (MXFP4)
 *   dn[e]:  down [Hm, I]      BF16 [Hm, I] | FP8 [Hm, I] | MXFP4 [Hm, I/2]
 *   dns[e]: NULL | float [Hm] | uint8_t [Hm, I/32]
 * Dequantized value: BF16 as is; FP8 e4m3(w) * scale[row] rounded to bf16 (ours: the product
 * is rounded to bf16 so every backend multiplies bf16 x bf16); MXFP4 e2m1 * 2^(s-127), exact. */
typedef struct sm_experts {
    sm_expert_fmt fmt;
    const void **gu, **gus; /* [E] */
    const void **dn, **dns; /* [E] */
    int act_mx;                /* 1: W4A4, the activations entering both matmuls (h1, a) are
                                  rounded to MXFP4 per 32 values (docs/model.md section 6);
                                  only with fmt MXFP4.  0: W4A16 (bf16 activations) */
} sm_experts;

typedef struct sm_layer {
    int full;                  /* 1: full attention, NoPE; 0: sliding window + RoPE */
    const uint16_t *wq;        /* [nH*D, H] bf16 */
    const uint16_t *wk, *wv;   /* [nKV*D, H] bf16 */
    const uint16_t *wg;        /* [nH*D, H] bf16, attention output gate (self_attn.gate_proj) */
    const uint16_t *wo;        /* [H, nH*D] bf16 */
    float *in_norm;            /* [H] eff(input_layernorm) */
    float *att_alpha, *att_beta; /* [H] post-attention residual gate coefficients */
    float *pre_ffn_norm;       /* [H] eff(pre_feedforward_layernorm) */
    float *post_ffn_norm;      /* [H] eff(post_feedforward_layernorm), applied before its norm */
    float *ffn_alpha, *ffn_beta; /* [H] post-FFN residual gate coefficients */
    const float *router;       /* [E, H] f32 */
    const float *router_bias;  /* [E] f32 e_score_correction_bias */
    const uint16_t *pooler;    /* [Hm, H] bf16 pre_expert_proj */
    float *pre_expert_norm;    /* [Hm] eff(pre_expert_norm) */
    sm_experts ex;
    float *post_expert_norm;   /* [Hm] eff(post_expert_norm), applied before its norm */
    const uint16_t *unpooler;  /* [H, Hm] bf16 post_expert_proj */
} sm_layer;

typedef struct sm_model {
    sm_config cfg;
    st_archive ar;             /* the mapped files the views point into */
    const uint16_t *embed;     /* [V, H] bf16 */
    float *final_norm;         /* [H] norm.weight as is (gain centre 0, NOT 1+g) */
    const uint16_t *lm_head;   /* [V, H] bf16 */
    sm_layer *layers;          /* [L] */
    sm_quant quant;            /* config.json's quantization_config, as declared (quant.h) */
    sm_acts acts;              /* the activations load option it was loaded with */
    unsigned char act_src[SM_MAX_LAYERS]; /* [L] sm_act_src: why layer l's ex.act_mx is what it is */
    void **owned; int nowned, capowned; /* owned buffers, freed by sm_model_free */
} sm_model;

/* sm_acts, the activations of the MXFP4 expert matmuls (AUTO: as the checkpoint declares, or
 * forced): quant.h. */
typedef struct sm_load_opts {
    int online_mxfp4;          /* round BF16 experts of layers 1..L-2 to MXFP4 at load */
    sm_acts activations;       /* the MXFP4 experts' activations (SM_ACTS_AUTO: as declared) */
    int threads;               /* online quantization workers; 0 = online cores (bytes do not
                                  depend on it) */
} sm_load_opts;

/* Residual gate coefficients from a gate vector g [n] (bf16 bits): u = g / T_g,
 * beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) * (1 + beta), 1e-3)), f32. */
void sm_residual_gate(const uint16_t *g, int n, float T_g, float *alpha, float *beta);

/* The loaded form of tensor r (tensors.h) of layer l (l ignored for a model-level role): the
 * field of sm_layer / sm_model that holds it (k = 1: a residual gate's beta, else 0); NULL for
 * the experts (sm_experts).  Its type follows sm_tensor_loaded: uint16_t bf16 or float f32
 * values of the stored shape. */
const void *sm_model_tensor(const sm_model *m, int l, sm_tensor_role r, int k);

/* The f32 gain of a norm from its stored bf16 weight g [n] (bits): eff(g) = r16(1 + g) for a
 * gain centred at 1 (kind SM_TK_NORM1), f32(g) for the final norm (SM_TK_NORM0). */
void sm_norm_gain(const uint16_t *g, int64_t n, sm_tensor_kind kind, float *out);

/* Load dir (config.json + safetensors); o may be NULL (defaults).  Every tensor is checked:
 * unknown names, missing / duplicate / mixed-format experts, dtypes and shapes, NaN e8m0
 * scales; a quantization_config the engine does not implement is refused (quant.h).  Each
 * layer's ex.act_mx follows sm_quant_layer_acts (o->activations, the declaration, online
 * MXFP4).  Errors name the tensor (and file) or the field.  On failure *m is left empty. */
int sm_model_load(const char *dir, const sm_load_opts *o, sm_model *m, sm_err *e);
void sm_model_free(sm_model *m);

/* Dequantize row `row` of expert matrix (which = 0: gate_up [2I, Hm], 1: down [Hm, I]) of
 * expert e in layer l into out [cols] as bf16-exact floats. */
void sm_expert_row(const sm_model *m, int l, int e, int which, int row, float *out);

#ifdef __cplusplus
}
#endif
#endif
