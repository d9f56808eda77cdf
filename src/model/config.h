/* config.h: the model configuration (docs/model.md section 1).
 *
 * Parsed from config.json with jansson (top level, or the `text_config` object when present),
 * or built from a named preset for test and benchmark models.  Every requirement of docs/model.md
 * section 1 is checked at parse time so later code can trust the struct.  We rejected a
 * generic key/value store: the engine reads these fields in hot setup paths and the compiler
 * should see every name.
 */
#ifndef SM_CONFIG_H
#define SM_CONFIG_H
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SM_MAX_LAYERS 256
#define SM_MAX_EOS 8

typedef struct sm_config {
    int L;          /* num_hidden_layers */
    int H;          /* hidden_size: residual stream width */
    int Hm;         /* moe_hidden_size: pooled width the experts work in */
    int I;          /* moe_intermediate_size: expert FFN width */
    int E;          /* num_local_experts */
    int K;          /* num_experts_per_tok */
    int nH;         /* num_attention_heads */
    int nKV;        /* num_key_value_heads */
    int D;          /* head_dim, always 64 */
    int V;          /* vocab_size */
    int vocab_used; /* ids >= vocab_used are never selected (ours; default V) */
    int window;     /* sliding_window W_s: keys a sliding query sees, itself included */
    double rope_theta;       /* rope_parameters.rope_theta (rope_type "default") */
    float rms_eps;           /* rms_norm_eps: pre-norms, QK norms, attention-output norm */
    float post_eps;          /* post_norm_eps: post-attention/FFN/expert norms */
    float gate_temp;         /* residual_gate_temperature T_g */
    float qk_scale_factor;   /* softmax scale = qk_scale_factor / sqrt(D) */
    float out_mult;          /* output_multiplier m_o: router logits and final logits */
    float softcap;           /* final_logit_softcapping c */
    float route_scale;       /* route_scale / routed_scaling_factor */
    int bos, pad;            /* bos_token_id, pad_token_id (-1 if absent) */
    int n_eos;               /* entries of eos */
    int eos[SM_MAX_EOS];     /* eos_token_id (int or list) */
    unsigned char full[SM_MAX_LAYERS]; /* [L] 1: full attention + NoPE, 0: sliding + RoPE */
} sm_config;

/* Parse and validate config.json at path. Errors name the file and the field; on any error
 * *c is left unchanged (the same holds for every function below that fills a config).
 * Sizes (L, H, Hm, I, E, K, nH, nKV, head_dim, V) are required; the other numbers default to
 * the real model's values.  attention_bias=false, hidden_act="silu", tie_word_embeddings=false
 * must be present; num_shared_experts (0) and mlp_layer_types ("sparse") may be absent.
 * Token ids and tie_word_embeddings are also looked up at the top level when text_config
 * lacks them.  layer_rope_theta, when present, must be 0 on full layers and equal rope_theta
 * on sliding ones; rope_scaling must be null or "default". */
int sm_config_load(const char *path, sm_config *c, sm_err *e);
/* The whole text of the file at path (at most 16 MiB, no NUL byte) into *text (malloc'd,
 * NUL-terminated): what sm_config_load parses; quant.c reads quantization_config from it. */
int sm_config_read_text(const char *path, char **text, sm_err *e);
/* Same, from a JSON text; `where` names the source in messages. */
int sm_config_parse(const char *json, const char *where, sm_config *c, sm_err *e);
/* Fill c from a preset: "tiny", "mini", "spark1x", "spark1x-l4". Unknown name -> error. */
int sm_config_preset(const char *name, sm_config *c, sm_err *e);
/* Optionally override the layer count of a preset (make-model --layers N); re-derives layer kinds. */
int sm_config_set_layers(sm_config *c, int L, sm_err *e);
/* Validate the invariants (also run by load/parse/preset). */
int sm_config_validate(const sm_config *c, const char *where, sm_err *e);
/* Write c as a HF-style config.json (text_config layout accepted by sm_config_load) to path,
 * through a temporary file, fsync and rename (outfile.h). */
int sm_config_save(const sm_config *c, const char *path, sm_err *e);
/* Same, with one more top-level member: "name": json (a JSON value's text, e.g. make-model's
 * quantization_config, sm_quant_quark_json). */
int sm_config_save_with(const sm_config *c, const char *name, const char *json, const char *path, sm_err *e);
/* 1 if a and b hold the same configuration (every field, eos[0..n_eos), full[0..L)), else 0
 * with *what (if non-NULL) set to the JSON name of the first field that differs. */
int sm_config_same(const sm_config *a, const sm_config *b, const char **what);
/* Number of query heads per KV head. */
static inline int sm_config_group(const sm_config *c) { return c->nH / c->nKV; }

#ifdef __cplusplus
}
#endif
#endif
