/* quant.h: the checkpoint's `quantization_config` (config.json) and the activations each
 * layer's experts run with (docs/model.md section 6: W4A4 or W4A16).
 *
 * Two declarations are understood: Quark's (`quant_method: "quark"`: `global_quant_config`
 * with `weight` and `input_tensors` specs, `exclude` module patterns) and gpt-oss's
 * weight-only `quant_method: "mxfp4"`.  Every field of them is read; one the engine does not
 * implement (another input dtype or group size, static or non-e8m0 activation scales, output,
 * bias, KV-cache or softmax quantization, per-layer overrides, an unknown field with a value)
 * is refused with one line naming the field and the file, because running such a checkpoint
 * with other numerics than it declares would be silently wrong.  We rejected reading only the
 * fields the rule needs (input dtype, group size): a config the engine half understands would
 * load and compute something else.
 */
#ifndef SM_QUANT_H
#define SM_QUANT_H
#include "model/config.h"
#include "model/tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activations of the MXFP4 expert matmuls asked for at load: AUTO as the checkpoint
 * declares (MXFP4 input tensors, or online MXFP4: W4A4; else W4A16), or forced.  Layers with
 * BF16 or FP8 experts always keep bf16 activations.  The words of every interface (CLI
 * --activations, sparkmono_model_opts.activations, the binding's activations=): SM_ACTS_WORDS. */
typedef enum sm_acts { SM_ACTS_AUTO = 0, SM_ACTS_MXFP4 = 1, SM_ACTS_BF16 = 2 } sm_acts;
#define SM_ACTS_WORDS "auto|mxfp4|bf16"
/* "auto", "mxfp4", "bf16" -> *out (NULL or "" reads as auto); -1 for another word. */
int sm_acts_parse(const char *s, sm_acts *out);
const char *sm_acts_name(sm_acts a);

typedef enum sm_quant_method {
    SM_QM_NONE = 0,   /* no quantization_config (or null) */
    SM_QM_QUARK,      /* quant_method "quark" */
    SM_QM_MXFP4       /* quant_method "mxfp4" (gpt-oss: MXFP4 weights, bf16 activations) */
} sm_quant_method;

/* What config.json declares.  Strings are "" when not declared. */
typedef struct sm_quant {
    sm_quant_method method;
    char weight[16];          /* weight dtype: "fp4" (MXFP4: per_group 32, e8m0) or "fp8_e4m3" */
    char input[16];           /* input-tensor dtype: "fp4" (dynamic MXFP4 per 32 values along the
                                 contraction axis: W4A4) or "fp8_e4m3" (with fp8 weights: W8A8,
                                 ours runs bf16 activations, docs/model.md section 6) */
    char version[64];         /* Quark's version string, for check */
    int nexclude;             /* patterns in exclude (Quark) / modules_to_not_convert (mxfp4) */
    char **exclude;           /* [nexclude] fnmatch(3) patterns, or "re:" + a regular expression
                                 matched at the start of the name (as vLLM reads Quark's) */
    void **re;                /* [nexclude] compiled "re:" patterns (pcre2_code *), NULL for the others */
} sm_quant;

/* Parse the quantization_config of the config.json text json (top level, else text_config);
 * where names the file in messages ("DIR/config.json: quantization_config.X: ...").  No
 * config: method SM_QM_NONE.  On failure *q is empty.  sm_quant_free releases it. */
int sm_quant_parse(const char *json, const char *where, sm_quant *q, sm_err *e);
/* The same from the file at path. */
int sm_quant_load(const char *path, sm_quant *q, sm_err *e);
void sm_quant_free(sm_quant *q);

/* 1 when the experts of layer l are excluded from quantization by q (the module
 * "P layers.{l}.mlp.experts" or every one of its per-expert projections matches a pattern);
 * 0 when not; -1 with one line in e when a pattern excludes some of the layer's experts and
 * not the others (a layer's experts share one format). */
int sm_quant_excluded(const sm_quant *q, const sm_config *c, int l, const char *where, sm_err *e);

/* Why a layer's experts run the activations they do; sm_act_src_text: "declared by
 * quantization_config", ... (sm_check_print prints it). */
typedef enum sm_act_src {
    SM_ACT_SRC_FMT = 0,       /* BF16 or FP8 experts: bf16 activations always */
    SM_ACT_SRC_DECLARED,      /* quantization_config declares MXFP4 input tensors */
    SM_ACT_SRC_UNDECLARED,    /* MXFP4 experts, no MXFP4 input tensors declared: W4A16 */
    SM_ACT_SRC_EXCLUDED,      /* the layer's experts are in quantization_config's exclude */
    SM_ACT_SRC_ONLINE,        /* BF16 experts rounded to MXFP4 at load: W4A4 */
    SM_ACT_SRC_FORCED         /* the activations option (mxfp4 or bf16) */
} sm_act_src;
const char *sm_act_src_text(sm_act_src s);

/* The activations of every layer: fmt [L] each layer's expert format as loaded, online [L] 1
 * where online MXFP4 made it, asked the load option.  Out: act_mx [L] (1 W4A4), src [L].
 * Forcing mxfp4 on a model with no MXFP4 expert layer is an error (where names the model). */
int sm_quant_layer_acts(const sm_quant *q, const sm_config *c, const sm_expert_fmt *fmt, const unsigned char *online,
                        sm_acts asked, const char *where, int *act_mx, unsigned char *src, sm_err *e);

/* One line describing q (check prints it): "none (...)", "quark 0.12: weight fp4, input
 * tensors fp4 dynamic per_group 32 (W4A4), 7 exclude patterns", ... */
void sm_quant_describe(const sm_quant *q, char *buf, size_t n);

/* The Quark quantization_config of an MXFP4 checkpoint of c as Quark exports it (make-model):
 * weight fp4 per_group 32 e8m0; input tensors fp4 dynamic per_group 32 when act_fp4, else
 * null (weight-only: W4A16); exclude: lm_head, the attention, router and pooler modules and the
 * experts of the layers that keep BF16 (sm_layer_keeps_bf16).  *out malloc'd JSON text (an
 * object), or -1. */
int sm_quant_quark_json(const sm_config *c, int act_fp4, char **out, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
