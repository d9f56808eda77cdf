/* config.c: config.json parsing, validation, presets and saving (docs/model.md section 1).
 *
 * Parsing reads the `text_config` object when present, else the top level, with jansson
 * (duplicate keys refused).  Each field goes through one typed getter that names the field on
 * a type error; every invariant lives in sm_config_validate so presets and parsed files meet
 * the same checks.  Saving uses a small fprintf emitter of a fixed layout instead of jansson's
 * dumper: jansson prints a float such as 1e-5 as 9.9999997473787516e-06, we print the shortest
 * decimal that reads back to the same float (or double), so the file stays readable and
 * loads back bit-identical.  We rejected a table-driven reflective parser: the number of
 * fields is small and the special cases (eos int-or-list, rope in two places, layer lists)
 * would each need an escape hatch anyway.
 */
#include "model/config.h"
#include "base/outfile.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Upper bound on every size field (ours): keeps products like nH*D, 2*I, V*H far from int
 * and int64 overflow in the code that trusts this struct. */
#define SM_CONFIG_MAX_DIM (1 << 24)
/* config.json is a few KiB; anything past this is not a config. */
#define SM_CONFIG_MAX_BYTES (16 << 20)

/* Real-model defaults of the optional fields (docs/model.md section 1). */
#define DEF_RMS_EPS 1e-5
#define DEF_POST_EPS 1e-8
#define DEF_GATE_TEMP 0.3
#define DEF_QK_SCALE 5.4730064863875
#define DEF_OUT_MULT 0.17677669529663688110 /* 2^-2.5 */
#define DEF_SOFTCAP 20.0
#define DEF_ROUTE_SCALE 1.0
#define DEF_WINDOW 2048
#define DEF_ROPE_THETA 500000.0

/* ------------------------------------------------------------------------------------------
 * Typed field access.  A field is looked up in `o` (text_config or the top level); the few
 * fields multimodal configs keep beside text_config (token ids, tie_word_embeddings) fall
 * back to the top level `top` when `o` lacks them.
 */
typedef struct pctx {
    json_t *o;          /* object holding the text model's fields */
    json_t *top;        /* the top-level object (== o without text_config) */
    const char *where;  /* file name for messages */
    sm_err *e;
} pctx;

static json_t *field(const pctx *x, const char *name, int top_fallback) {
    json_t *v = json_object_get(x->o, name);
    if (!v && top_fallback && x->top != x->o) v = json_object_get(x->top, name);
    return v;
}

static const char *jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

/* "field 'x' must be <want> (got string "abc")": the got-part shows the value when short. */
static int type_err(const pctx *x, const char *name, const char *want, const json_t *v) {
    if (json_is_string(v))
        return sm_errf(x->e, "%s: field '%s' must be %s (got string \"%.40s\")", x->where, name,
                       want, json_string_value(v));
    if (json_is_integer(v))
        return sm_errf(x->e, "%s: field '%s' must be %s (got integer %lld)", x->where, name, want,
                       (long long)json_integer_value(v));
    if (json_is_real(v))
        return sm_errf(x->e, "%s: field '%s' must be %s (got real %g)", x->where, name, want,
                       json_real_value(v));
    return sm_errf(x->e, "%s: field '%s' must be %s (got %s)", x->where, name, want, jtype(v));
}

/* Integer field: required -> missing is an error, else `def` when absent. */
static int get_int(const pctx *x, const char *name, int required, int def, int *out) {
    json_t *v = field(x, name, 0);
    if (!v) {
        if (required) return sm_errf(x->e, "%s: field '%s' is missing (required)", x->where, name);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return type_err(x, name, "an integer", v);
    json_int_t n = json_integer_value(v);
    if (n < INT_MIN || n > INT_MAX)
        return sm_errf(x->e, "%s: field '%s' is out of range (got %lld)", x->where, name, (long long)n);
    *out = (int)n;
    return 0;
}

/* Number field (integer or real in JSON), `def` when absent; null is a type error. */
static int get_num(const pctx *x, json_t *v, const char *name, double def, double *out) {
    if (!v) { *out = def; return 0; }
    if (!json_is_number(v)) return type_err(x, name, "a number", v);
    *out = json_number_value(v);
    return 0;
}

/* Token id: absent or null -> -1, else an integer (range checked by validate). */
static int get_token(const pctx *x, const char *name, int *out) {
    json_t *v = field(x, name, 1);
    if (!v || json_is_null(v)) { *out = -1; return 0; }
    if (!json_is_integer(v)) return type_err(x, name, "an integer or null", v);
    json_int_t n = json_integer_value(v);
    *out = (n < INT_MIN || n > INT_MAX) ? INT_MAX : (int)n; /* validate rejects INT_MAX */
    return 0;
}

/* A boolean that must be present and false (attention_bias, tie_word_embeddings). */
static int need_false(const pctx *x, const char *name, int top_fallback) {
    json_t *v = field(x, name, top_fallback);
    if (!v) return sm_errf(x->e, "%s: field '%s' is missing (required: false)", x->where, name);
    if (!json_is_boolean(v)) return type_err(x, name, "false", v);
    if (json_is_true(v)) return sm_errf(x->e, "%s: field '%s' must be false (got true)", x->where, name);
    return 0;
}

/* A string that must be present and equal `want`. */
static int need_string(const pctx *x, const char *name, const char *want) {
    json_t *v = field(x, name, 0);
    if (!v) return sm_errf(x->e, "%s: field '%s' is missing (required: \"%s\")", x->where, name, want);
    if (!json_is_string(v) || strcmp(json_string_value(v), want) != 0) {
        char w[64];
        snprintf(w, sizeof w, "\"%s\"", want);
        return type_err(x, name, w, v);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Parsing.
 */

/* Layer kinds by the real model's rule: l % 4 == 1 full attention (NoPE), else sliding. */
static void derive_layers(sm_config *c) {
    memset(c->full, 0, sizeof c->full);
    for (int l = 0; l < c->L && l < SM_MAX_LAYERS; l++) c->full[l] = (unsigned char)(l % 4 == 1);
}

/* rope_parameters {rope_type, rope_theta} and/or rope_theta; rope_scaling must be absent,
 * null or of type "default". */
static int parse_rope(const pctx *x, sm_config *c) {
    double th_rp = NAN, th_top = NAN;
    json_t *rp = field(x, "rope_parameters", 0);
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return type_err(x, "rope_parameters", "an object", rp);
        json_t *ty = json_object_get(rp, "rope_type");
        if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "default") != 0))
            return type_err(x, "rope_parameters.rope_type", "\"default\"", ty);
        json_t *th = json_object_get(rp, "rope_theta");
        if (th && get_num(x, th, "rope_parameters.rope_theta", 0, &th_rp)) return -1;
    }
    json_t *th = field(x, "rope_theta", 0);
    if (th && get_num(x, th, "rope_theta", 0, &th_top)) return -1;
    if (!isnan(th_rp) && !isnan(th_top) && th_rp != th_top)
        return sm_errf(x->e, "%s: field 'rope_theta' (%.17g) disagrees with 'rope_parameters.rope_theta' (%.17g)",
                       x->where, th_top, th_rp);
    c->rope_theta = !isnan(th_rp) ? th_rp : !isnan(th_top) ? th_top : DEF_ROPE_THETA;
    json_t *rs = field(x, "rope_scaling", 0);
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return type_err(x, "rope_scaling", "null or an object", rs);
        json_t *ty = json_object_get(rs, "rope_type");
        if (!ty) ty = json_object_get(rs, "type");
        if (!ty || !json_is_string(ty) || strcmp(json_string_value(ty), "default") != 0)
            return sm_errf(x->e, "%s: field 'rope_scaling' must be null or of rope_type \"default\" (scaled RoPE is not supported)",
                           x->where);
    }
    return 0;
}

/* A list field of exactly L entries (absent or null -> *out NULL). */
static int get_layer_list(const pctx *x, const sm_config *c, const char *name, json_t **out) {
    json_t *v = field(x, name, 0);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return type_err(x, name, "a list", v);
    if (json_array_size(v) != (size_t)c->L)
        return sm_errf(x->e, "%s: field '%s' has %zu entries (num_hidden_layers is %d)", x->where, name,
                       json_array_size(v), c->L);
    *out = v;
    return 0;
}

/* layer_types, layer_rope_theta, mlp_layer_types, num_shared_experts (needs a valid L). */
static int parse_layers(const pctx *x, sm_config *c) {
    json_t *lt, *lr, *ml;
    derive_layers(c);
    if (get_layer_list(x, c, "layer_types", &lt)) return -1;
    for (int l = 0; lt && l < c->L; l++) {
        json_t *v = json_array_get(lt, (size_t)l);
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (s && !strcmp(s, "full_attention")) c->full[l] = 1;
        else if (s && !strcmp(s, "sliding_attention")) c->full[l] = 0;
        else {
            char nm[64];
            snprintf(nm, sizeof nm, "layer_types[%d]", l);
            return type_err(x, nm, "\"full_attention\" or \"sliding_attention\"", v);
        }
    }
    if (get_layer_list(x, c, "layer_rope_theta", &lr)) return -1;
    for (int l = 0; lr && l < c->L; l++) {
        char nm[64];
        double th = 0;
        snprintf(nm, sizeof nm, "layer_rope_theta[%d]", l);
        if (get_num(x, json_array_get(lr, (size_t)l), nm, 0, &th)) return -1;
        if (c->full[l] && th != 0)
            return sm_errf(x->e, "%s: field '%s' must be 0 on a full_attention layer (got %.17g)", x->where, nm, th);
        if (!c->full[l] && th == 0)
            return sm_errf(x->e, "%s: field '%s' must be nonzero on a sliding_attention layer (got 0)", x->where, nm);
        if (!c->full[l] && th != c->rope_theta)
            return sm_errf(x->e, "%s: field '%s' (%.17g) disagrees with rope_theta (%.17g)", x->where, nm, th,
                           c->rope_theta);
    }
    if (get_layer_list(x, c, "mlp_layer_types", &ml)) return -1;
    for (int l = 0; ml && l < c->L; l++) {
        json_t *v = json_array_get(ml, (size_t)l);
        if (!json_is_string(v) || strcmp(json_string_value(v), "sparse") != 0) {
            char nm[64];
            snprintf(nm, sizeof nm, "mlp_layer_types[%d]", l);
            return type_err(x, nm, "\"sparse\"", v);
        }
    }
    json_t *se = field(x, "num_shared_experts", 0);
    if (se && !json_is_null(se)) {
        if (!json_is_integer(se)) return type_err(x, "num_shared_experts", "0", se);
        if (json_integer_value(se) != 0)
            return sm_errf(x->e, "%s: field 'num_shared_experts' must be 0 (got %lld)", x->where,
                           (long long)json_integer_value(se));
    }
    return 0;
}

/* eos_token_id: absent/null, an integer, or a list of at most SM_MAX_EOS integers. */
static int parse_eos(const pctx *x, sm_config *c) {
    json_t *v = field(x, "eos_token_id", 1);
    c->n_eos = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) return get_token(x, "eos_token_id", &c->eos[c->n_eos++]);
    if (!json_is_array(v)) return type_err(x, "eos_token_id", "an integer or a list of integers", v);
    if (json_array_size(v) > SM_MAX_EOS)
        return sm_errf(x->e, "%s: field 'eos_token_id' has %zu entries (at most %d)", x->where,
                       json_array_size(v), SM_MAX_EOS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *t = json_array_get(v, i);
        if (!json_is_integer(t)) {
            char nm[64];
            snprintf(nm, sizeof nm, "eos_token_id[%zu]", i);
            return type_err(x, nm, "an integer", t);
        }
        json_int_t n = json_integer_value(t);
        c->eos[c->n_eos++] = (n < INT_MIN || n > INT_MAX) ? INT_MAX : (int)n;
    }
    return 0;
}

static int from_json(json_t *root, const char *where, sm_config *c, sm_err *e) {
    pctx x = {root, root, where, e};
    double d = 0;
    if (!json_is_object(root))
        return sm_errf(e, "%s: the top level must be an object (got %s)", where, jtype(root));
    json_t *tc = json_object_get(root, "text_config");
    if (tc && !json_is_null(tc)) {
        if (!json_is_object(tc)) return type_err(&x, "text_config", "an object", tc);
        x.o = tc;
    }
    memset(c, 0, sizeof *c);
    /* required sizes */
    if (get_int(&x, "num_hidden_layers", 1, 0, &c->L) || get_int(&x, "hidden_size", 1, 0, &c->H) ||
        get_int(&x, "moe_hidden_size", 1, 0, &c->Hm) || get_int(&x, "moe_intermediate_size", 1, 0, &c->I) ||
        get_int(&x, "num_local_experts", 1, 0, &c->E) || get_int(&x, "num_experts_per_tok", 1, 0, &c->K) ||
        get_int(&x, "num_attention_heads", 1, 0, &c->nH) ||
        get_int(&x, "num_key_value_heads", 1, 0, &c->nKV) || get_int(&x, "head_dim", 1, 0, &c->D) ||
        get_int(&x, "vocab_size", 1, 0, &c->V))
        return -1;
    /* optional sizes */
    if (get_int(&x, "vocab_used", 0, c->V, &c->vocab_used) ||
        get_int(&x, "sliding_window", 0, DEF_WINDOW, &c->window))
        return -1;
    /* scalars with real-model defaults */
    if (get_num(&x, field(&x, "rms_norm_eps", 0), "rms_norm_eps", DEF_RMS_EPS, &d)) return -1;
    c->rms_eps = (float)d;
    if (get_num(&x, field(&x, "post_norm_eps", 0), "post_norm_eps", DEF_POST_EPS, &d)) return -1;
    c->post_eps = (float)d;
    if (get_num(&x, field(&x, "residual_gate_temperature", 0), "residual_gate_temperature", DEF_GATE_TEMP, &d))
        return -1;
    c->gate_temp = (float)d;
    if (get_num(&x, field(&x, "qk_scale_factor", 0), "qk_scale_factor", DEF_QK_SCALE, &d)) return -1;
    c->qk_scale_factor = (float)d;
    if (get_num(&x, field(&x, "output_multiplier", 0), "output_multiplier", DEF_OUT_MULT, &d)) return -1;
    c->out_mult = (float)d;
    if (get_num(&x, field(&x, "final_logit_softcapping", 0), "final_logit_softcapping", DEF_SOFTCAP, &d))
        return -1;
    c->softcap = (float)d;
    /* route_scale, or its other name routed_scaling_factor; both present must agree */
    json_t *rs = field(&x, "route_scale", 0), *rsf = field(&x, "routed_scaling_factor", 0);
    double d2 = DEF_ROUTE_SCALE;
    if (get_num(&x, rs, "route_scale", DEF_ROUTE_SCALE, &d) ||
        get_num(&x, rsf, "routed_scaling_factor", DEF_ROUTE_SCALE, &d2))
        return -1;
    if (rs && rsf && d != d2)
        return sm_errf(e, "%s: field 'route_scale' (%g) disagrees with 'routed_scaling_factor' (%g)", where, d, d2);
    c->route_scale = (float)(rs ? d : d2);
    if (parse_rope(&x, c)) return -1;
    /* token ids */
    if (get_token(&x, "bos_token_id", &c->bos) || get_token(&x, "pad_token_id", &c->pad) || parse_eos(&x, c))
        return -1;
    /* constant fields the engine does not implement otherwise */
    if (need_false(&x, "attention_bias", 0) || need_string(&x, "hidden_act", "silu") ||
        need_false(&x, "tie_word_embeddings", 1))
        return -1;
    /* sizes must be sane before the per-layer lists are read */
    derive_layers(c);
    if (sm_config_validate(c, where, e)) return -1;
    if (parse_layers(&x, c)) return -1;
    return sm_config_validate(c, where, e);
}

int sm_config_parse(const char *json, const char *where, sm_config *c, sm_err *e) {
    json_error_t je;
    if (!where) where = "config";
    if (!json) return sm_errf(e, "%s: no JSON text", where);
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!root) return sm_errf(e, "%s: invalid JSON at line %d column %d: %s", where, je.line, je.column, je.text);
    sm_config t; /* *c is left untouched on failure */
    int rc = from_json(root, where, &t, e);
    json_decref(root);
    if (rc == 0) *c = t;
    return rc;
}

int sm_config_read_text(const char *path, char **text, sm_err *e) {
    *text = NULL;
    if (!path) return sm_errf(e, "config: no path given");
    FILE *f = fopen(path, "rb");
    if (!f) return sm_errf(e, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) { fclose(f); return sm_errf(e, "%s: out of memory", path); }
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        if (cap >= SM_CONFIG_MAX_BYTES) {
            free(buf), fclose(f);
            return sm_errf(e, "%s: larger than %d bytes, not a config", path, SM_CONFIG_MAX_BYTES);
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb, cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return sm_errf(e, "%s: read error", path); }
    buf[n] = 0;
    if (strlen(buf) != n) { free(buf); return sm_errf(e, "%s: contains a NUL byte, not JSON text", path); }
    *text = buf;
    return 0;
}

int sm_config_load(const char *path, sm_config *c, sm_err *e) {
    char *buf;
    if (sm_config_read_text(path, &buf, e)) return -1;
    int rc = sm_config_parse(buf, path, c, e);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Validation: every invariant, messages name the JSON field.
 */
static int check_size(const char *where, const char *name, int v, sm_err *e) {
    if (v < 1) return sm_errf(e, "%s: field '%s' must be positive (got %d)", where, name, v);
    if (v > SM_CONFIG_MAX_DIM) return sm_errf(e, "%s: field '%s' must be at most %d (got %d)", where, name, SM_CONFIG_MAX_DIM, v);
    return 0;
}

static int check_pos(const char *where, const char *name, double v, sm_err *e) {
    if (!(v > 0) || isinf(v)) return sm_errf(e, "%s: field '%s' must be a finite positive number (got %g)", where, name, v);
    return 0;
}

static int check_token(const char *where, const char *name, int t, int V, sm_err *e) {
    if (t < 0 || t >= V) return sm_errf(e, "%s: field '%s' must be in [0, vocab_size=%d) (got %d)", where, name, V, t);
    return 0;
}

int sm_config_validate(const sm_config *c, const char *where, sm_err *e) {
    if (!where) where = "config";
    if (!c) return sm_errf(e, "%s: no config", where);
    if (check_size(where, "num_hidden_layers", c->L, e) || check_size(where, "hidden_size", c->H, e) ||
        check_size(where, "moe_hidden_size", c->Hm, e) || check_size(where, "moe_intermediate_size", c->I, e) ||
        check_size(where, "num_local_experts", c->E, e) || check_size(where, "num_experts_per_tok", c->K, e) ||
        check_size(where, "num_attention_heads", c->nH, e) || check_size(where, "num_key_value_heads", c->nKV, e) ||
        check_size(where, "head_dim", c->D, e) || check_size(where, "vocab_size", c->V, e) ||
        check_size(where, "sliding_window", c->window, e))
        return -1;
    if (c->L > SM_MAX_LAYERS)
        return sm_errf(e, "%s: field 'num_hidden_layers' must be at most %d (got %d)", where, SM_MAX_LAYERS, c->L);
    if (c->D != 64) return sm_errf(e, "%s: field 'head_dim' must be 64 (got %d)", where, c->D);
    if (c->nH % c->nKV)
        return sm_errf(e, "%s: field 'num_attention_heads' (%d) must be a multiple of 'num_key_value_heads' (%d)",
                       where, c->nH, c->nKV);
    if (c->K > c->E)
        return sm_errf(e, "%s: field 'num_experts_per_tok' (%d) must be at most 'num_local_experts' (%d)", where,
                       c->K, c->E);
    if (c->Hm % 32)
        return sm_errf(e, "%s: field 'moe_hidden_size' must be a multiple of 32 (MXFP4 blocks) (got %d)", where, c->Hm);
    if (c->I % 32)
        return sm_errf(e, "%s: field 'moe_intermediate_size' must be a multiple of 32 (MXFP4 blocks) (got %d)", where,
                       c->I);
    if (c->vocab_used < 1 || c->vocab_used > c->V)
        return sm_errf(e, "%s: field 'vocab_used' must be in [1, vocab_size=%d] (got %d)", where, c->V, c->vocab_used);
    if (check_pos(where, "rope_theta", c->rope_theta, e) || check_pos(where, "rms_norm_eps", c->rms_eps, e) ||
        check_pos(where, "post_norm_eps", c->post_eps, e) ||
        check_pos(where, "residual_gate_temperature", c->gate_temp, e) ||
        check_pos(where, "qk_scale_factor", c->qk_scale_factor, e) ||
        check_pos(where, "output_multiplier", c->out_mult, e) ||
        check_pos(where, "final_logit_softcapping", c->softcap, e) ||
        check_pos(where, "route_scale", c->route_scale, e))
        return -1;
    if (c->bos != -1 && check_token(where, "bos_token_id", c->bos, c->V, e)) return -1;
    if (c->pad != -1 && check_token(where, "pad_token_id", c->pad, c->V, e)) return -1;
    if (c->n_eos < 0 || c->n_eos > SM_MAX_EOS)
        return sm_errf(e, "%s: field 'eos_token_id' has %d entries (at most %d)", where, c->n_eos, SM_MAX_EOS);
    for (int i = 0; i < c->n_eos; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "eos_token_id[%d]", i);
        if (check_token(where, nm, c->eos[i], c->V, e)) return -1;
    }
    for (int l = 0; l < c->L; l++)
        if (c->full[l] > 1)
            return sm_errf(e, "%s: field 'layer_types[%d]' has invalid kind %d", where, l, c->full[l]);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Presets.
 */
static void set_defaults(sm_config *c) {
    c->D = 64;
    c->window = DEF_WINDOW;
    c->rope_theta = DEF_ROPE_THETA;
    c->rms_eps = (float)DEF_RMS_EPS;
    c->post_eps = (float)DEF_POST_EPS;
    c->gate_temp = (float)DEF_GATE_TEMP;
    c->qk_scale_factor = (float)DEF_QK_SCALE;
    c->out_mult = (float)DEF_OUT_MULT;
    c->softcap = (float)DEF_SOFTCAP;
    c->route_scale = (float)DEF_ROUTE_SCALE;
}

static void set_sizes(sm_config *c, int L, int H, int Hm, int I, int E, int K, int nH, int nKV, int V) {
    c->L = L, c->H = H, c->Hm = Hm, c->I = I, c->E = E, c->K = K, c->nH = nH, c->nKV = nKV, c->V = V;
    c->vocab_used = V;
}

int sm_config_preset(const char *name, sm_config *out, sm_err *e) {
    sm_config t, *c = &t; /* *out is left untouched on failure */
    memset(c, 0, sizeof *c);
    set_defaults(c);
    if (name && !strcmp(name, "tiny")) {
        set_sizes(c, 4, 256, 128, 128, 16, 4, 4, 2, 512);
        c->window = 64;
        c->bos = 1, c->pad = 0, c->n_eos = 1, c->eos[0] = 2;
    } else if (name && !strcmp(name, "mini")) {
        set_sizes(c, 4, 1024, 512, 512, 16, 4, 16, 8, 2048);
        c->window = 256;
        c->bos = 1, c->pad = 0, c->n_eos = 1, c->eos[0] = 2;
    } else if (name && (!strcmp(name, "spark1x") || !strcmp(name, "spark1x-l4"))) {
        /* the real model (docs/model.md section 1); -l4: the same widths with 4 layers */
        set_sizes(c, name[7] ? 4 : 62, 8192, 4096, 4096, 256, 8, 128, 16, 202048);
        c->vocab_used = 201818;
        c->bos = 200000, c->pad = 200018, c->n_eos = 2, c->eos[0] = 200001, c->eos[1] = 200008;
    } else {
        return sm_errf(e, "unknown preset '%s' (known: tiny, mini, spark1x, spark1x-l4)", name ? name : "(null)");
    }
    derive_layers(c);
    char where[64];
    snprintf(where, sizeof where, "preset '%s'", name);
    if (sm_config_validate(c, where, e)) return -1;
    *out = t;
    return 0;
}

int sm_config_set_layers(sm_config *c, int L, sm_err *e) {
    if (L < 1 || L > SM_MAX_LAYERS)
        return sm_errf(e, "layer count must be in [1, %d] (got %d)", SM_MAX_LAYERS, L);
    sm_config t = *c; /* *c is left untouched on failure */
    t.L = L;
    derive_layers(&t);
    if (sm_config_validate(&t, "config", e)) return -1;
    *c = t;
    return 0;
}

int sm_config_same(const sm_config *a, const sm_config *b, const char **what) {
    const char *w = NULL;
#define SAME(f, name) else if (a->f != b->f) w = name;
    if (0) {}
    SAME(L, "num_hidden_layers") SAME(H, "hidden_size") SAME(Hm, "moe_hidden_size")
    SAME(I, "moe_intermediate_size") SAME(E, "num_local_experts") SAME(K, "num_experts_per_tok")
    SAME(nH, "num_attention_heads") SAME(nKV, "num_key_value_heads") SAME(D, "head_dim")
    SAME(V, "vocab_size") SAME(vocab_used, "vocab_used") SAME(window, "sliding_window")
    SAME(rope_theta, "rope_theta") SAME(rms_eps, "rms_norm_eps") SAME(post_eps, "post_norm_eps")
    SAME(gate_temp, "residual_gate_temperature") SAME(qk_scale_factor, "qk_scale_factor")
    SAME(out_mult, "output_multiplier") SAME(softcap, "final_logit_softcapping")
    SAME(route_scale, "route_scale") SAME(bos, "bos_token_id") SAME(pad, "pad_token_id")
    SAME(n_eos, "eos_token_id")
#undef SAME
    for (int i = 0; !w && i < a->n_eos && i < SM_MAX_EOS; i++)
        if (a->eos[i] != b->eos[i]) w = "eos_token_id";
    for (int l = 0; !w && l < a->L && l < SM_MAX_LAYERS; l++)
        if (a->full[l] != b->full[l]) w = "layer_types";
    if (what) *what = w;
    return w == NULL;
}

/* ------------------------------------------------------------------------------------------
 * Saving.
 */

/* Shortest decimal that reads back as the same float (p <= 9) / double (p <= 17); whole
 * numbers as "500000.0" rather than "5e+05". */
static void fmt_real(char *buf, size_t n, double v, int is_float) {
    if (v == floor(v) && fabs(v) < 1e15) { snprintf(buf, n, "%.1f", v); return; }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        double r = strtod(buf, NULL);
        if (is_float ? (float)r == (float)v : r == v) return;
    }
}
static void fmt_float(char *buf, size_t n, float v) { fmt_real(buf, n, (double)v, 1); }
static void fmt_double(char *buf, size_t n, double v) { fmt_real(buf, n, v, 0); }

static void put_token(FILE *f, const char *name, int t) {
    if (t < 0) fprintf(f, "    \"%s\": null,\n", name);
    else fprintf(f, "    \"%s\": %d,\n", name, t);
}

static void emit(FILE *f, const sm_config *c, const char *xname, const char *xjson) {
    char th[40], b[40];
    fmt_double(th, sizeof th, c->rope_theta);
    fprintf(f, "{\n  \"architectures\": [\"MuseSparkForCausalLM\"],\n  \"model_type\": \"muse_spark\",\n");
    if (xname) { /* the extra top-level member, its lines indented one level */
        fprintf(f, "  \"%s\": ", xname);
        for (const char *p = xjson; *p; p++) {
            if (*p == '\n') fputs("\n  ", f);
            else fputc(*p, f);
        }
        fprintf(f, ",\n");
    }
    fprintf(f, "  \"text_config\": {\n    \"model_type\": \"muse_spark_text\",\n");
    fprintf(f, "    \"num_hidden_layers\": %d,\n    \"hidden_size\": %d,\n    \"moe_hidden_size\": %d,\n", c->L, c->H, c->Hm);
    fprintf(f, "    \"moe_intermediate_size\": %d,\n    \"num_local_experts\": %d,\n    \"num_experts_per_tok\": %d,\n",
            c->I, c->E, c->K);
    fprintf(f, "    \"num_attention_heads\": %d,\n    \"num_key_value_heads\": %d,\n    \"head_dim\": %d,\n", c->nH, c->nKV, c->D);
    fprintf(f, "    \"vocab_size\": %d,\n    \"vocab_used\": %d,\n    \"sliding_window\": %d,\n", c->V, c->vocab_used, c->window);
    fprintf(f, "    \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %s},\n", th);
    const struct { const char *name; float v; } fl[] = {
        {"rms_norm_eps", c->rms_eps},
        {"post_norm_eps", c->post_eps},
        {"residual_gate_temperature", c->gate_temp},
        {"qk_scale_factor", c->qk_scale_factor},
        {"output_multiplier", c->out_mult},
        {"final_logit_softcapping", c->softcap},
        {"route_scale", c->route_scale},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        fmt_float(b, sizeof b, fl[i].v);
        fprintf(f, "    \"%s\": %s,\n", fl[i].name, b);
    }
    put_token(f, "bos_token_id", c->bos);
    fprintf(f, "    \"eos_token_id\": [");
    for (int i = 0; i < c->n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", c->eos[i]);
    fprintf(f, "],\n");
    put_token(f, "pad_token_id", c->pad);
    fprintf(f, "    \"attention_bias\": false,\n    \"hidden_act\": \"silu\",\n    \"num_shared_experts\": 0,\n");
    fprintf(f, "    \"tie_word_embeddings\": false,\n    \"layer_types\": [");
    for (int l = 0; l < c->L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", c->full[l] ? "full_attention" : "sliding_attention");
    fprintf(f, "],\n    \"layer_rope_theta\": [");
    for (int l = 0; l < c->L; l++) fprintf(f, "%s%s", l ? ", " : "", c->full[l] ? "0" : th);
    fprintf(f, "],\n    \"mlp_layer_types\": [");
    for (int l = 0; l < c->L; l++) fprintf(f, "%s\"sparse\"", l ? ", " : "");
    fprintf(f, "]\n  }\n}\n");
}

int sm_config_save(const sm_config *c, const char *path, sm_err *e) { return sm_config_save_with(c, NULL, NULL, path, e); }

int sm_config_save_with(const sm_config *c, const char *name, const char *json, const char *path, sm_err *e) {
    if (!path) return sm_errf(e, "config: no path to save to");
    if (name && !json) return sm_errf(e, "%s: no value for the member '%s'", path, name);
    if (sm_config_validate(c, path, e)) return -1;
    sm_outfile of; /* temporary file, fsync, rename (outfile.h) */
    if (sm_outfile_open(&of, path, e)) return -1;
    emit(of.f, c, name, json);
    if (ferror(of.f)) {
        sm_outfile_abort(&of);
        return sm_errf(e, "%s: cannot write", path);
    }
    return sm_outfile_commit(&of, e);
}
