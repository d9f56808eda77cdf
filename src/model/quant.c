/* quant.c: config.json's quantization_config (quant.h) and the per-layer activations rule.
 *
 * The parser walks every member of the object it knows with a small table per object
 * (Quark's top level, global_quant_config, a tensor spec): a member is either checked against
 * the values the engine implements, kept (dtype, exclude, version), or accepted as
 * informational (observer class, export packing); a member not in the table is accepted only
 * when null, false or empty.  Messages are "<file>: quantization_config.<path>: <value> is not
 * supported (<why>)".  We rejected a schema library: jansson and a dozen string compares say
 * the same in less code, and the messages name the field the way a user reads the file.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/quant.h"
#include "model/config.h"
#include "model/weights.h"
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QC "quantization_config"

int sm_acts_parse(const char *s, sm_acts *out) {
    if (!s || !*s || !strcmp(s, "auto")) *out = SM_ACTS_AUTO;
    else if (!strcmp(s, "mxfp4")) *out = SM_ACTS_MXFP4;
    else if (!strcmp(s, "bf16")) *out = SM_ACTS_BF16;
    else return -1;
    return 0;
}

const char *sm_acts_name(sm_acts a) {
    return a == SM_ACTS_MXFP4 ? "mxfp4" : a == SM_ACTS_BF16 ? "bf16" : "auto";
}

const char *sm_act_src_text(sm_act_src s) {
    switch (s) {
    case SM_ACT_SRC_FMT: return "not MXFP4 experts";
    case SM_ACT_SRC_DECLARED: return "declared by quantization_config";
    case SM_ACT_SRC_UNDECLARED: return "no MXFP4 input tensors declared";
    case SM_ACT_SRC_EXCLUDED: return "excluded by quantization_config";
    case SM_ACT_SRC_ONLINE: return "online MXFP4";
    case SM_ACT_SRC_FORCED: return "forced by the activations option";
    }
    return "?";
}

/* ------------------------------------------------------------------------------------------
 * Values and messages.
 */
typedef struct qctx {
    const char *where;  /* the file */
    sm_err *e;
} qctx;

/* The value as the message shows it: a string quoted, numbers and literals as JSON, an
 * object or list by its kind. */
static void vstr(const json_t *v, char *b, size_t n) {
    switch (json_typeof(v)) {
    case JSON_STRING: snprintf(b, n, "\"%.60s\"", json_string_value(v)); break;
    case JSON_INTEGER: snprintf(b, n, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: snprintf(b, n, "%g", json_real_value(v)); break;
    case JSON_TRUE: snprintf(b, n, "true"); break;
    case JSON_FALSE: snprintf(b, n, "false"); break;
    case JSON_NULL: snprintf(b, n, "null"); break;
    case JSON_OBJECT: snprintf(b, n, "an object of %zu members", json_object_size(v)); break;
    case JSON_ARRAY: snprintf(b, n, "a list of %zu entries", json_array_size(v)); break;
    }
}

/* "<file>: quantization_config.<path>: <value> is not supported (<why>)" */
static int refuse(const qctx *x, const char *path, const json_t *v, const char *why) {
    char b[96];
    vstr(v, b, sizeof b);
    return sm_errf(x->e, "%s: " QC ".%s: %s is not supported (%s)", x->where, path, b, why);
}

static int is_empty(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) || (json_is_object(v) && json_object_size(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0) || (json_is_string(v) && !*json_string_value(v));
}

static int str_is(const json_t *v, const char *s) { return json_is_string(v) && !strcmp(json_string_value(v), s); }

/* A member that must be absent, null or one of the '|'-separated strings of ok. */
static int want_str(const qctx *x, const char *path, const json_t *v, const char *ok, const char *why) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        const char *s = json_string_value(v), *p = ok;
        size_t n = strlen(s);
        while (*p) {
            const char *bar = strchr(p, '|');
            size_t k = bar ? (size_t)(bar - p) : strlen(p);
            if (k == n && !strncmp(p, s, n)) return 0;
            p += k + (bar ? 1 : 0);
        }
    }
    return refuse(x, path, v, why);
}

/* An unknown member: accepted when it holds nothing. */
static int unknown(const qctx *x, const char *path, const json_t *v) {
    return is_empty(v) ? 0 : refuse(x, path, v, "a field this engine does not know; only null or empty is accepted");
}

/* ------------------------------------------------------------------------------------------
 * A Quark tensor spec (weight, input_tensors): every member.
 */
typedef struct spec {
    char dtype[16];     /* "fp4", "fp8_e4m3" */
    int dynamic;        /* is_dynamic */
} spec;

static int parse_spec(const qctx *x, const char *pfx, const json_t *o, int is_input, spec *s) {
    char p[160];
    if (!json_is_object(o)) {
        snprintf(p, sizeof p, "%s", pfx);
        return refuse(x, p, o, "a tensor spec is an object or null");
    }
    memset(s, 0, sizeof *s);
    /* dtype first: the other members' rules depend on it */
    const json_t *dt = json_object_get(o, "dtype"), *mxe = json_object_get(o, "mx_element_dtype");
    snprintf(p, sizeof p, "%s.dtype", pfx);
    if (str_is(dt, "mx") && str_is(mxe, "fp4")) snprintf(s->dtype, sizeof s->dtype, "fp4"); /* older Quark: mx + fp4 */
    else if (str_is(dt, "fp4") || str_is(dt, "fp8_e4m3")) snprintf(s->dtype, sizeof s->dtype, "%s", json_string_value(dt));
    else if (!dt) return sm_errf(x->e, "%s: " QC ".%s is missing", x->where, p);
    else return refuse(x, p, dt, is_input ? "MXFP4 activations are fp4" : "expert weights are fp4 (MXFP4) or fp8_e4m3");
    int fp4 = !strcmp(s->dtype, "fp4");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        snprintf(p, sizeof p, "%s.%s", pfx, k);
        if (!strcmp(k, "dtype")) continue;
        else if (!strcmp(k, "mx_element_dtype")) {
            if (!json_is_null(v) && !(str_is(dt, "mx") && str_is(v, "fp4")))
                return refuse(x, p, v, "only with dtype \"mx\", as \"fp4\"");
        } else if (!strcmp(k, "is_dynamic")) {
            if (!json_is_boolean(v)) return refuse(x, p, v, "true or false");
            s->dynamic = json_is_true(v);
            if (is_input && !s->dynamic)
                return refuse(x, p, v, "activations are quantized dynamically, per 32 values as they are made");
        } else if (!strcmp(k, "qscheme")) {
            if (fp4 && want_str(x, p, v, "per_group", "MXFP4 is per_group")) return -1;
            if (!fp4 && want_str(x, p, v, is_input ? "per_tensor" : "per_channel",
                                 is_input ? "fp8 activations: per_tensor" : "fp8 expert weights: one f32 scale per row")) return -1;
        } else if (!strcmp(k, "group_size")) {
            if (fp4 && !(json_is_integer(v) && json_integer_value(v) == 32))
                return refuse(x, p, v, is_input ? "MXFP4 activations take 32" : "MXFP4 weights take 32");
            if (!fp4 && !json_is_null(v)) return refuse(x, p, v, "fp8 specs have no group");
        } else if (!strcmp(k, "ch_axis")) {
            /* fp4: the contraction axis, the last; fp8 weights: the output row */
            long want = fp4 || is_input ? -1 : 0;
            if (!json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == want))
                return refuse(x, p, v, fp4 ? "MXFP4 groups run along the last (contraction) axis, -1"
                                           : is_input ? "-1" : "one fp8 scale per output row: 0");
        } else if (!strcmp(k, "scale_format")) {
            if (fp4 && want_str(x, p, v, "e8m0", "MXFP4 scales are e8m0")) return -1;
            if (!fp4 && !json_is_null(v)) return refuse(x, p, v, "fp8 scales are f32");
        } else if (!strcmp(k, "scale_type")) {
            if (want_str(x, p, v, "float", "float scales")) return -1;
        } else if (!strcmp(k, "round_method")) {
            if (want_str(x, p, v, "half_even", "values round to nearest even (docs/model.md section 7)")) return -1;
        } else if (!strcmp(k, "scale_calculation_mode")) {
            if (want_str(x, p, v, "even", "the \"even\" scale rule of docs/model.md section 7")) return -1;
        } else if (!strcmp(k, "symmetric")) {
            if (!json_is_null(v) && !json_is_true(v)) return refuse(x, p, v, "symmetric quantization only");
        } else if (!strcmp(k, "block_size")) {
            if (!json_is_null(v)) return refuse(x, p, v, "2-D blocks; groups only");
        } else if (!strcmp(k, "is_scale_quant")) {
            if (!json_is_null(v) && !json_is_false(v)) return refuse(x, p, v, "quantized scales");
        } else if (!strcmp(k, "observer_cls") || !strcmp(k, "enable_buffer_reuse") || !strcmp(k, "max_input_numel")) {
            /* how Quark computed the values: nothing at inference */
        } else if (unknown(x, p, v))
            return -1;
    }
    if (!is_input && s->dynamic) {
        snprintf(p, sizeof p, "%s.is_dynamic", pfx);
        return refuse(x, p, json_object_get(o, "is_dynamic"), "weights are stored quantized (static)");
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * exclude patterns.
 */
static int add_patterns(const qctx *x, const char *path, const json_t *v, sm_quant *q) {
    if (json_is_null(v)) return 0;
    if (!json_is_array(v)) return refuse(x, path, v, "a list of module name patterns");
    size_t n = json_array_size(v);
    q->exclude = calloc(n ? n : 1, sizeof *q->exclude);
    q->re = calloc(n ? n : 1, sizeof *q->re);
    if (!q->exclude || !q->re) return sm_errf(x->e, "%s: out of memory", x->where);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(v, i);
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        if (!json_is_string(s)) return refuse(x, p, s, "a module name pattern is a string");
        if (!(q->exclude[i] = strdup(json_string_value(s)))) return sm_errf(x->e, "%s: out of memory", x->where);
        q->nexclude = (int)i + 1;
        if (!strncmp(q->exclude[i], "re:", 3)) {
            int ec;
            PCRE2_SIZE eo;
            q->re[i] = pcre2_compile((PCRE2_SPTR)(q->exclude[i] + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &ec, &eo, NULL);
            if (!q->re[i]) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(ec, msg, sizeof msg);
                return sm_errf(x->e, "%s: " QC ".%s: \"%.60s\": regular expression error at offset %zu: %s", x->where, p,
                               q->exclude[i], (size_t)eo, (const char *)msg);
            }
        }
    }
    return 0;
}

/* 1 when name matches pattern i of q. */
static int pattern_match(const sm_quant *q, int i, const char *name) {
    if (!q->re[i]) return fnmatch(q->exclude[i], name, 0) == 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(q->re[i], NULL);
    if (!md) return 0;
    int rc = pcre2_match(q->re[i], (PCRE2_SPTR)name, strlen(name), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static int any_match(const sm_quant *q, const char *name, int *which) {
    for (int i = 0; i < q->nexclude; i++)
        if (pattern_match(q, i, name)) {
            if (which) *which = i;
            return 1;
        }
    return 0;
}

int sm_quant_excluded(const sm_quant *q, const sm_config *c, int l, const char *where, sm_err *e) {
    char nm[256];
    if (q->nexclude == 0) return 0;
    snprintf(nm, sizeof nm, SM_TENSOR_PREFIX "layers.%d.mlp.experts", l);
    if (any_match(q, nm, NULL)) return 1;
    /* the per-expert modules: all of them, or none */
    static const char *const proj[2] = {"gate_up_proj", "down_proj"};
    int hit = 0, miss = 0, pat = -1;
    for (int x = 0; x < c->E && !(hit && miss); x++)
        for (int j = 0; j < 2; j++) {
            snprintf(nm, sizeof nm, SM_TENSOR_PREFIX "layers.%d.mlp.experts.%d.%s", l, x, proj[j]);
            int w;
            if (any_match(q, nm, &w)) hit++, pat = w;
            else miss++;
        }
    if (!hit) return 0;
    if (!miss) return 1;
    return sm_errf(e, "%s: " QC ".exclude: \"%.80s\" excludes some of layer %d's expert modules and not the others "
                   "(a layer's experts share one format)", where, q->exclude[pat], l);
}

/* ------------------------------------------------------------------------------------------
 * The object.
 */
static int parse_algo(const qctx *x, const json_t *v) {
    /* algorithms whose result is in the stored weights (nothing at inference) are accepted */
    if (is_empty(v)) return 0;
    const json_t *one = v;
    for (size_t i = 0; json_is_array(v) ? i < json_array_size(v) : i < 1; i++) {
        if (json_is_array(v)) one = json_array_get(v, i);
        const json_t *nm = json_is_object(one) ? json_object_get(one, "name") : NULL;
        if (!(str_is(nm, "awq") || str_is(nm, "gptq")))
            return refuse(x, "algo_config", nm ? nm : one,
                          "only awq and gptq, whose results are in the weights; others change inference");
    }
    return 0;
}

static int parse_quark(const qctx *x, const json_t *o, sm_quant *q) {
    const char *k;
    const json_t *v;
    spec w = {{0}, 0}, in = {{0}, 0};
    int have_w = 0, have_in = 0;
    json_object_foreach((json_t *)o, k, v) {
        if (!strcmp(k, "quant_method")) continue;
        if (!strcmp(k, "global_quant_config")) {
            if (!json_is_object(v)) return refuse(x, k, v, "an object");
            const char *k2;
            const json_t *v2;
            json_object_foreach((json_t *)v, k2, v2) {
                char p[96];
                snprintf(p, sizeof p, "%s.%s", k, k2);
                if (!strcmp(k2, "weight")) {
                    if (json_is_null(v2)) continue;
                    if (parse_spec(x, p, v2, 0, &w)) return -1;
                    have_w = 1;
                } else if (!strcmp(k2, "input_tensors")) {
                    if (json_is_null(v2)) continue;
                    if (parse_spec(x, p, v2, 1, &in)) return -1;
                    have_in = 1;
                } else if (!strcmp(k2, "output_tensors") || !strcmp(k2, "bias")) {
                    if (!json_is_null(v2)) return refuse(x, p, v2, "only weights and input tensors are quantized");
                } else if (!strcmp(k2, "target_device")) {
                    /* where Quark ran */
                } else if (unknown(x, p, v2))
                    return -1;
            }
        } else if (!strcmp(k, "exclude")) {
            if (add_patterns(x, k, v, q)) return -1;
        } else if (!strcmp(k, "layer_quant_config") || !strcmp(k, "layer_type_quant_config")) {
            if (!is_empty(v)) return refuse(x, k, v, "per-layer overrides; the global config applies to every layer");
        } else if (!strcmp(k, "kv_cache_quant_config")) {
            if (!is_empty(v)) return refuse(x, k, v, "the KV cache is bf16");
        } else if (!strcmp(k, "softmax_quant_spec")) {
            if (!is_empty(v)) return refuse(x, k, v, "attention runs in f32");
        } else if (!strcmp(k, "algo_config")) {
            if (parse_algo(x, v)) return -1;
        } else if (!strcmp(k, "export")) {
            if (!is_empty(v) && !json_is_object(v)) return refuse(x, k, v, "an object");
            const json_t *wf = json_is_object(v) ? json_object_get(v, "weight_format") : NULL;
            if (wf && want_str(x, "export.weight_format", wf, "real_quantized",
                               "the weights are read as stored: real_quantized"))
                return -1;
        } else if (!strcmp(k, "version")) {
            if (json_is_string(v)) snprintf(q->version, sizeof q->version, "%s", json_string_value(v));
        } else if (!strcmp(k, "quant_mode") || !strcmp(k, "kv_cache_post_rope")) {
            /* how Quark ran; no KV cache quantization (above) makes post-RoPE moot */
        } else if (unknown(x, k, v))
            return -1;
    }
    if (have_w) snprintf(q->weight, sizeof q->weight, "%s", w.dtype);
    if (have_in) {
        const json_t *g = json_object_get(o, "global_quant_config");
        if (strcmp(in.dtype, w.dtype) != 0 || !have_w)
            return refuse(x, "global_quant_config.input_tensors.dtype", json_object_get(json_object_get(g, "input_tensors"), "dtype"),
                          "input tensors are quantized like the weights they meet: fp4 with fp4, fp8_e4m3 with fp8_e4m3");
        snprintf(q->input, sizeof q->input, "%s", in.dtype);
    }
    return 0;
}

static int parse_gptoss(const qctx *x, const json_t *o, sm_quant *q) {
    const char *k;
    const json_t *v;
    snprintf(q->weight, sizeof q->weight, "fp4");
    json_object_foreach((json_t *)o, k, v) {
        if (!strcmp(k, "quant_method")) continue;
        if (!strcmp(k, "modules_to_not_convert")) {
            if (add_patterns(x, k, v, q)) return -1;
        } else if (unknown(x, k, v))
            return -1;
    }
    return 0;
}

static int parse_root(const qctx *x, json_t *root, sm_quant *q) {
    if (!json_is_object(root)) return 0; /* config.c says what is wrong with it */
    json_t *o = json_object_get(root, QC);
    json_t *tc = json_object_get(root, "text_config");
    if ((!o || json_is_null(o)) && json_is_object(tc)) o = json_object_get(tc, QC);
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o))
        return sm_errf(x->e, "%s: " QC " must be an object or null", x->where);
    json_t *qm = json_object_get(o, "quant_method");
    if (!qm) return sm_errf(x->e, "%s: " QC ".quant_method is missing", x->where);
    if (str_is(qm, "quark")) {
        q->method = SM_QM_QUARK;
        return parse_quark(x, o, q);
    }
    if (str_is(qm, "mxfp4")) {
        q->method = SM_QM_MXFP4;
        return parse_gptoss(x, o, q);
    }
    return refuse(x, "quant_method", qm, "the engine reads \"quark\" and \"mxfp4\"");
}

int sm_quant_parse(const char *json, const char *where, sm_quant *q, sm_err *e) {
    memset(q, 0, sizeof *q);
    if (!where) where = "config";
    json_error_t je;
    json_t *root = json_loads(json ? json : "", JSON_REJECT_DUPLICATES, &je);
    if (!root) return sm_errf(e, "%s: invalid JSON at line %d column %d: %s", where, je.line, je.column, je.text);
    qctx x = {where, e};
    int rc = parse_root(&x, root, q);
    json_decref(root);
    if (rc) sm_quant_free(q);
    return rc;
}

int sm_quant_load(const char *path, sm_quant *q, sm_err *e) {
    char *text;
    memset(q, 0, sizeof *q);
    if (sm_config_read_text(path, &text, e)) return -1;
    int rc = sm_quant_parse(text, path, q, e);
    free(text);
    return rc;
}

void sm_quant_free(sm_quant *q) {
    for (int i = 0; i < q->nexclude; i++) {
        free(q->exclude[i]);
        if (q->re && q->re[i]) pcre2_code_free(q->re[i]);
    }
    free(q->exclude);
    free(q->re);
    memset(q, 0, sizeof *q);
}

/* ------------------------------------------------------------------------------------------
 * The rule.
 */
int sm_quant_layer_acts(const sm_quant *q, const sm_config *c, const sm_expert_fmt *fmt, const unsigned char *online,
                        sm_acts asked, const char *where, int *act_mx, unsigned char *src, sm_err *e) {
    int nmx = 0;
    for (int l = 0; l < c->L; l++) nmx += fmt[l] == SM_EXP_MXFP4;
    if (asked == SM_ACTS_MXFP4 && nmx == 0)
        return sm_errf(e, "%s: activations mxfp4 need MXFP4 experts and this checkpoint has none (its experts are "
                       "%s): load it with online MXFP4 (--online-mxfp4) to round layers 1..L-2 to MXFP4",
                       where, sm_expert_fmt_name(fmt[c->L > 2 ? 1 : 0]));
    int declared = !strcmp(q->input, "fp4");
    for (int l = 0; l < c->L; l++) {
        sm_act_src s;
        if (fmt[l] != SM_EXP_MXFP4) s = SM_ACT_SRC_FMT;
        else if (asked != SM_ACTS_AUTO) s = SM_ACT_SRC_FORCED;
        else if (online && online[l]) s = SM_ACT_SRC_ONLINE;
        else {
            int x = declared ? sm_quant_excluded(q, c, l, where, e) : 0;
            if (x < 0) return -1;
            s = x ? SM_ACT_SRC_EXCLUDED : declared ? SM_ACT_SRC_DECLARED : SM_ACT_SRC_UNDECLARED;
        }
        act_mx[l] = s == SM_ACT_SRC_DECLARED || s == SM_ACT_SRC_ONLINE || (s == SM_ACT_SRC_FORCED && asked == SM_ACTS_MXFP4);
        src[l] = (unsigned char)s;
    }
    return 0;
}

void sm_quant_describe(const sm_quant *q, char *buf, size_t n) {
    if (q->method == SM_QM_NONE) {
        snprintf(buf, n, "none");
        return;
    }
    char ex[64] = "";
    if (q->nexclude) snprintf(ex, sizeof ex, ", %d exclude pattern%s", q->nexclude, q->nexclude == 1 ? "" : "s");
    if (q->method == SM_QM_MXFP4) {
        snprintf(buf, n, "mxfp4 (weights fp4, activations not quantized: W4A16%s)", ex);
        return;
    }
    const char *in = !strcmp(q->input, "fp4") ? "fp4 dynamic per_group 32 (W4A4)"
                     : q->input[0] ? "fp8_e4m3 dynamic per_tensor (W8A8 declared; ours keeps bf16 activations)"
                                   : "none (W4A16)";
    char ver[96] = "";
    if (q->version[0]) snprintf(ver, sizeof ver, " (version \"%s\")", q->version);
    snprintf(buf, n, "quark%s: weight %s, input tensors %s%s", ver, q->weight[0] ? q->weight : "none", in, ex);
}

/* ------------------------------------------------------------------------------------------
 * Writing (make-model).
 */
static json_t *mx_spec(int dynamic) {
    return json_pack("{s:s, s:b, s:s, s:i, s:i, s:n, s:n, s:s, s:s, s:s, s:s, s:n, s:s, s:b, s:b, s:i}", "dtype", "fp4",
                     "is_dynamic", dynamic, "qscheme", "per_group", "ch_axis", -1, "group_size", 32, "block_size",
                     "symmetric", "round_method", "half_even", "scale_type", "float", "scale_format", "e8m0",
                     "scale_calculation_mode", "even", "mx_element_dtype", "observer_cls", "PerBlockMXObserver",
                     "is_scale_quant", 0, "enable_buffer_reuse", 0, "max_input_numel", 4194304);
}

int sm_quant_quark_json(const sm_config *c, int act_fp4, char **out, sm_err *e) {
    *out = NULL;
    json_t *ex = json_pack("[s, s, s, s, s]", "lm_head", "*.self_attn.*", "*.mlp.gate", "*.mlp.pre_expert_proj",
                           "*.mlp.post_expert_proj");
    char nm[160];
    for (int l = 0; ex && l < c->L; l++)
        if (sm_layer_keeps_bf16(c, l)) {
            snprintf(nm, sizeof nm, SM_TENSOR_PREFIX "layers.%d.mlp.experts", l);
            json_array_append_new(ex, json_string(nm));
        }
    json_t *g = json_pack("{s:o, s:o, s:n, s:n, s:n}", "input_tensors", act_fp4 ? mx_spec(1) : json_null(), "weight",
                          mx_spec(0), "output_tensors", "bias", "target_device");
    json_t *exp = json_pack("{s:[], s:f, s:s, s:s, s:n}", "kv_cache_group", "min_kv_scale", 0.0, "pack_method", "reorder",
                            "weight_format", "real_quantized", "weight_merge_groups");
    json_t *o = ex && g && exp ? json_pack("{s:n, s:o, s:o, s:o, s:b, s:{}, s:{}, s:{}, s:s, s:s, s:n, s:s}", "algo_config",
                                           "exclude", ex, "export", exp, "global_quant_config", g, "kv_cache_post_rope", 0,
                                           "kv_cache_quant_config", "layer_quant_config", "layer_type_quant_config",
                                           "quant_method", "quark", "quant_mode", "eager_mode", "softmax_quant_spec",
                                           "version", "sparkmono make-model")
                               : NULL;
    if (!o) return sm_errf(e, "quantization_config: out of memory");
    *out = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return *out ? 0 : sm_errf(e, "quantization_config: out of memory");
}
