/* test_acts.c: config.json's quantization_config and the activations of each layer's experts
 * (src/model/quant.c, the loader's act_mx, the C API's sparkmono_model_opts.activations).
 * Parsing: a Quark W4A4 config as real exports write it, then one field changed at a time;
 * each accepted variant says what it declares, each refusal names the field and the file.
 * Loading: tiny models (layers 0 and 3 BF16, 1-2 MXFP4) without a config, with make-model's
 * W4A4 and weight-only configs, with excludes, online MXFP4, forced either way; the shard
 * copy; the numerics switch through the C API (default == mxfp4 != bf16 on a W4A4 model). */
#include "check.h"
#include "tmodel.h"
#include "model/config.h"
#include "model/quant.h"
#include "model/weights.h"
#include "parallel/shard.h"
#include "sparkmono.h"
#include "testing/makemodel.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHERE "m/config.json"

static char tmp[512];
static sm_config cfg;

/* A Quark MXFP4 W4A4 export's quantization_config (fields as the amd MXFP4 checkpoints carry them). */
static json_t *quark_w4a4(void) {
    char *q;
    sm_err e = {{0}};
    if (sm_quant_quark_json(&cfg, 1, &q, &e)) return NULL;
    json_t *o = json_loads(q, 0, NULL);
    free(q);
    json_object_set_new(o, "version", json_string("0.12+9d3d471cdf1"));
    return o;
}

/* config.json text {"quantization_config": qc} (qc stolen; NULL: none). */
static char *doc(json_t *qc) {
    json_t *r = json_object();
    if (qc) json_object_set_new(r, "quantization_config", qc);
    char *s = json_dumps(r, 0);
    json_decref(r);
    return s;
}

/* Set member path "a.b.c" of o to v (stolen); v NULL deletes it. */
static void set_path(json_t *o, const char *path, json_t *v) {
    char p[256];
    snprintf(p, sizeof p, "%s", path);
    char *k = p, *dot;
    while ((dot = strchr(k, '.'))) {
        *dot = 0;
        o = json_object_get(o, k);
        k = dot + 1;
    }
    if (v) json_object_set_new(o, k, v);
    else json_object_del(o, k);
}

static int parse(json_t *qc, sm_quant *q, sm_err *e) {
    char *s = doc(qc);
    int rc = sm_quant_parse(s, WHERE, q, e);
    free(s);
    return rc;
}

/* ---- accepted ---- */
static void test_parse_accepted(void) {
    sm_quant q;
    sm_err e = {{0}};
    CHECK(parse(quark_w4a4(), &q, &e) == 0, "quark w4a4: %s", e.msg);
    CHECK(q.method == SM_QM_QUARK && !strcmp(q.input, "fp4") && !strcmp(q.weight, "fp4") && q.nexclude == 7 &&
              !strcmp(q.version, "0.12+9d3d471cdf1"),
          "quark w4a4 read as method %d input '%s' weight '%s' %d excludes", q.method, q.input, q.weight, q.nexclude);
    char d[512];
    sm_quant_describe(&q, d, sizeof d);
    CHECK(strstr(d, "input tensors fp4 dynamic per_group 32 (W4A4)"), "describe: %s", d);
    sm_quant_free(&q);

    json_t *o = quark_w4a4(); /* weight-only */
    set_path(o, "global_quant_config.input_tensors", json_null());
    CHECK(parse(o, &q, &e) == 0 && q.input[0] == 0 && !strcmp(q.weight, "fp4"), "weight-only: %s", e.msg);
    sm_quant_free(&q);

    o = quark_w4a4(); /* older Quark: dtype "mx" + mx_element_dtype "fp4" */
    set_path(o, "global_quant_config.input_tensors.dtype", json_string("mx"));
    set_path(o, "global_quant_config.input_tensors.mx_element_dtype", json_string("fp4"));
    set_path(o, "global_quant_config.input_tensors.scale_format", NULL);
    CHECK(parse(o, &q, &e) == 0 && !strcmp(q.input, "fp4"), "mx + fp4: %s", e.msg);
    sm_quant_free(&q);

    o = quark_w4a4(); /* unknown members holding nothing; informational ones with values */
    set_path(o, "future_field", json_null());
    set_path(o, "global_quant_config.input_tensors.future", json_false());
    set_path(o, "global_quant_config.target_device", json_string("cuda"));
    set_path(o, "algo_config", json_pack("[{s:s}]", "name", "awq"));
    set_path(o, "exclude", json_pack("[s, s]", "lm_head", "re:model\\.language_model\\.layers\\.\\d+\\.self_attn"));
    CHECK(parse(o, &q, &e) == 0 && q.nexclude == 2, "empty unknowns, awq, re: exclude: %s", e.msg);
    sm_quant_free(&q);

    o = quark_w4a4(); /* W8A8 FP8 (ours keeps bf16 activations) */
    json_t *w = json_object_get(json_object_get(o, "global_quant_config"), "weight");
    json_object_set_new(w, "dtype", json_string("fp8_e4m3"));
    json_object_set_new(w, "qscheme", json_string("per_channel"));
    json_object_set_new(w, "ch_axis", json_integer(0));
    json_object_set_new(w, "group_size", json_null());
    json_object_set_new(w, "scale_format", json_null());
    json_object_set_new(w, "scale_calculation_mode", json_null());
    json_object_set_new(w, "symmetric", json_true());
    json_t *in = json_deep_copy(w);
    json_object_set_new(in, "qscheme", json_string("per_tensor"));
    json_object_set_new(in, "ch_axis", json_integer(-1));
    json_object_set_new(in, "is_dynamic", json_true());
    set_path(o, "global_quant_config.input_tensors", in);
    CHECK(parse(o, &q, &e) == 0 && !strcmp(q.input, "fp8_e4m3") && !strcmp(q.weight, "fp8_e4m3"), "fp8 w8a8: %s", e.msg);
    sm_quant_free(&q);

    CHECK(parse(NULL, &q, &e) == 0 && q.method == SM_QM_NONE, "no config: %s", e.msg);
    CHECK(parse(json_null(), &q, &e) == 0 && q.method == SM_QM_NONE, "null config: %s", e.msg);
    CHECK(parse(json_pack("{s:s, s:[s]}", "quant_method", "mxfp4", "modules_to_not_convert", "lm_head"), &q, &e) == 0 &&
              q.method == SM_QM_MXFP4 && q.input[0] == 0 && q.nexclude == 1,
          "gpt-oss mxfp4: %s", e.msg);
    sm_quant_free(&q);
    /* under text_config */
    const char *tc = "{\"text_config\": {\"quantization_config\": {\"quant_method\": \"mxfp4\"}}}";
    CHECK(sm_quant_parse(tc, WHERE, &q, &e) == 0 && q.method == SM_QM_MXFP4, "text_config: %s", e.msg);
    sm_quant_free(&q);
}

/* ---- refused: one change, the field named ---- */
static void refused(const char *path, json_t *v, const char *want) {
    json_t *o = quark_w4a4();
    set_path(o, path, v);
    sm_quant q;
    sm_err e = {{0}};
    int rc = parse(o, &q, &e);
    CHECK(rc == -1 && strstr(e.msg, want) && !strncmp(e.msg, WHERE ": ", strlen(WHERE) + 2) && !strchr(e.msg, '\n'),
          "%s: rc %d, want '%s' in '%s'", path, rc, want, e.msg);
    if (rc == 0) sm_quant_free(&q);
}

#define IN "global_quant_config.input_tensors."
#define W "global_quant_config.weight."
static void test_parse_refused(void) {
    refused(IN "group_size", json_integer(64),
            "m/config.json: quantization_config.global_quant_config.input_tensors.group_size: 64 is not supported "
            "(MXFP4 activations take 32)");
    refused("quant_method", json_string("gptq"), "quantization_config.quant_method: \"gptq\" is not supported");
    refused("quant_method", NULL, "quantization_config.quant_method is missing");
    refused(IN "is_dynamic", json_false(), "quantization_config." IN "is_dynamic: false");
    refused(IN "dtype", json_string("int8"), "quantization_config." IN "dtype: \"int8\"");
    refused(IN "qscheme", json_string("per_tensor"), "quantization_config." IN "qscheme");
    refused(IN "scale_format", json_string("fp32"), "quantization_config." IN "scale_format");
    refused(IN "scale_calculation_mode", json_string("floor"), "quantization_config." IN "scale_calculation_mode");
    refused(IN "round_method", json_string("round"), "quantization_config." IN "round_method");
    refused(IN "ch_axis", json_integer(0), "quantization_config." IN "ch_axis");
    refused(IN "is_scale_quant", json_true(), "quantization_config." IN "is_scale_quant");
    refused(IN "new_knob", json_integer(3), "quantization_config." IN "new_knob: 3");
    refused(W "dtype", json_string("int4"), "quantization_config." W "dtype: \"int4\"");
    refused(W "group_size", json_integer(16), "quantization_config." W "group_size: 16");
    refused(W "is_dynamic", json_true(), "quantization_config." W "is_dynamic");
    refused("global_quant_config.output_tensors", json_pack("{s:s}", "dtype", "fp4"),
            "quantization_config.global_quant_config.output_tensors");
    refused("global_quant_config.bias", json_pack("{s:s}", "dtype", "fp4"), "quantization_config.global_quant_config.bias");
    refused("global_quant_config.weight", NULL, "quantization_config." IN "dtype"); /* fp4 inputs need fp4 weights */
    refused("layer_quant_config", json_pack("{s:{}}", "*experts*"), "quantization_config.layer_quant_config");
    refused("layer_type_quant_config", json_pack("{s:{}}", "Linear"), "quantization_config.layer_type_quant_config");
    refused("kv_cache_quant_config", json_pack("{s:{}}", "*k_proj"), "quantization_config.kv_cache_quant_config");
    refused("softmax_quant_spec", json_pack("{s:s}", "dtype", "fp8_e4m3"), "quantization_config.softmax_quant_spec");
    refused("algo_config", json_pack("[{s:s}]", "name", "rotation"), "quantization_config.algo_config: \"rotation\"");
    refused("export.weight_format", json_string("fake_quantized"), "quantization_config.export.weight_format");
    refused("exclude", json_string("lm_head"), "quantization_config.exclude: \"lm_head\"");
    refused("exclude", json_pack("[s, i]", "lm_head", 3), "quantization_config.exclude[1]");
    refused("exclude", json_pack("[s]", "re:(unclosed"), "quantization_config.exclude[0]");
    refused("mystery", json_string("on"), "quantization_config.mystery: \"on\"");
    sm_quant q;
    sm_err e = {{0}};
    CHECK(parse(json_string("quark"), &q, &e) == -1 && strstr(e.msg, "quantization_config must be an object"), "%s", e.msg);
    CHECK(parse(json_pack("{s:s, s:i}", "quant_method", "mxfp4", "group_size", 64), &q, &e) == -1 &&
              strstr(e.msg, "quantization_config.group_size: 64"),
          "%s", e.msg);
}

/* ---- the loader ---- */

/* make-model's tiny model (cfg) into tmp/name: experts fmt, the config of acts (sm_make_opts). */
static int mk(const char *name, sm_expert_fmt fmt, sm_acts acts, char *dir) {
    snprintf(dir, 600, "%s/%s", tmp, name);
    sm_make_opts o = {.experts = fmt, .seed = 3, .shards = 1, .activations = acts};
    sm_err e = {{0}};
    if (sm_make_model(&cfg, &o, dir, &e)) { printf("  make %s: %s\n", name, e.msg); return -1; }
    return 0;
}

/* Replace dir/config.json's quantization_config.exclude by the patterns pats [n]. */
static int set_exclude(const char *dir, const char *const *pats, int n) {
    char p[700], *text;
    sm_err e = {{0}};
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (sm_config_read_text(p, &text, &e)) return -1;
    json_t *r = json_loads(text, 0, NULL);
    free(text);
    json_t *ex = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(ex, json_string(pats[i]));
    json_object_set_new(json_object_get(r, "quantization_config"), "exclude", ex);
    int rc = json_dump_file(r, p, JSON_INDENT(2));
    json_decref(r);
    return rc;
}

/* Load dir with online / acts: 0 and act_mx [L] + src [L], or -1 with the message in e. */
static int acts_of(const char *dir, int online, sm_acts acts, int *act, int *src, sm_err *e) {
    sm_model m;
    sm_load_opts o = {.online_mxfp4 = online, .activations = acts};
    if (sm_model_load(dir, &o, &m, e)) return -1;
    for (int l = 0; l < m.cfg.L; l++) act[l] = m.layers[l].ex.act_mx, src[l] = m.act_src[l];
    sm_model_free(&m);
    return 0;
}

/* "a0 a1 a2 a3" == want, and the sources of layers 1-2 are s. */
static void expect(const char *what, const char *dir, int online, sm_acts acts, const char *want, int s) {
    int a[8], src[8];
    sm_err e = {{0}};
    if (acts_of(dir, online, acts, a, src, &e)) { CHECK(0, "%s: load: %s", what, e.msg); return; }
    char got[32];
    snprintf(got, sizeof got, "%d %d %d %d", a[0], a[1], a[2], a[3]);
    CHECK(!strcmp(got, want), "%s: act_mx %s, want %s", what, got, want);
    CHECK(src[0] == SM_ACT_SRC_FMT && src[3] == SM_ACT_SRC_FMT, "%s: bf16 layers' source %d %d", what, src[0], src[3]);
    if (s >= 0) CHECK(src[1] == s, "%s: layer 1's source %d, want %d", what, src[1], s);
}

static char d_none[600], d_w4a4[600], d_wonly[600], d_bf16[600], d_fp8[600];

static void test_load_acts(void) {
    expect("no config", d_none, 0, SM_ACTS_AUTO, "0 0 0 0", SM_ACT_SRC_UNDECLARED);
    expect("w4a4 config", d_w4a4, 0, SM_ACTS_AUTO, "0 1 1 0", SM_ACT_SRC_DECLARED);
    expect("weight-only config", d_wonly, 0, SM_ACTS_AUTO, "0 0 0 0", SM_ACT_SRC_UNDECLARED);
    expect("online", d_bf16, 1, SM_ACTS_AUTO, "0 1 1 0", SM_ACT_SRC_ONLINE);
    expect("bf16 experts", d_bf16, 0, SM_ACTS_AUTO, "0 0 0 0", -1);
    expect("fp8 experts", d_fp8, 0, SM_ACTS_BF16, "0 0 0 0", -1);
    expect("forced mxfp4", d_none, 0, SM_ACTS_MXFP4, "0 1 1 0", SM_ACT_SRC_FORCED);
    expect("forced mxfp4, weight-only", d_wonly, 0, SM_ACTS_MXFP4, "0 1 1 0", SM_ACT_SRC_FORCED);
    expect("forced bf16", d_w4a4, 0, SM_ACTS_BF16, "0 0 0 0", SM_ACT_SRC_FORCED);
    expect("forced bf16, online", d_bf16, 1, SM_ACTS_BF16, "0 0 0 0", SM_ACT_SRC_FORCED);
    expect("forced mxfp4, online", d_bf16, 1, SM_ACTS_MXFP4, "0 1 1 0", SM_ACT_SRC_FORCED);
    int a[8], s[8];
    sm_err e = {{0}};
    CHECK(acts_of(d_bf16, 0, SM_ACTS_MXFP4, a, s, &e) == -1 && strstr(e.msg, "activations mxfp4") &&
              strstr(e.msg, "--online-mxfp4") && strstr(e.msg, "bf16"),
          "forced mxfp4 on bf16 experts: '%s'", e.msg);
    CHECK(acts_of(d_fp8, 0, SM_ACTS_MXFP4, a, s, &e) == -1 && strstr(e.msg, "fp8"), "forced mxfp4 on fp8: '%s'", e.msg);
}

static void test_exclude(void) {
    char d[600];
    if (mk("excl", SM_EXP_MXFP4, SM_ACTS_MXFP4, d)) { CHECK(0, "make"); return; }
    const char *p1[] = {"lm_head", "model.language_model.layers.2.mlp.experts"};
    CHECK(set_exclude(d, p1, 2) == 0, "write");
    expect("exclude layer 2's module", d, 0, SM_ACTS_AUTO, "0 1 0 0", SM_ACT_SRC_DECLARED);
    int a[8], s[8];
    sm_err e = {{0}};
    CHECK(acts_of(d, 0, SM_ACTS_AUTO, a, s, &e) == 0 && s[2] == SM_ACT_SRC_EXCLUDED, "layer 2's source %d", s[2]);
    expect("exclude, forced mxfp4", d, 0, SM_ACTS_MXFP4, "0 1 1 0", SM_ACT_SRC_FORCED);
    const char *p2[] = {"*.layers.1.mlp.experts.*"}; /* every per-expert module of layer 1 */
    CHECK(set_exclude(d, p2, 1) == 0, "write");
    expect("exclude layer 1's expert modules", d, 0, SM_ACTS_AUTO, "0 0 1 0", SM_ACT_SRC_EXCLUDED);
    const char *p3[] = {"re:model\\.language_model\\.layers\\.[12]\\.mlp\\.experts$"};
    CHECK(set_exclude(d, p3, 1) == 0, "write");
    expect("exclude by re:", d, 0, SM_ACTS_AUTO, "0 0 0 0", SM_ACT_SRC_EXCLUDED);
    const char *p4[] = {"*.layers.2.mlp.experts.3.*"}; /* one expert of layer 2 */
    CHECK(set_exclude(d, p4, 1) == 0, "write");
    CHECK(acts_of(d, 0, SM_ACTS_AUTO, a, s, &e) == -1 && strstr(e.msg, "quantization_config.exclude") &&
              strstr(e.msg, "layer 2") && strstr(e.msg, "config.json"),
          "partial exclude: '%s'", e.msg);
    const char *p5[] = {"*.layers.2.mlp.experts.3.*", "*self_attn*"}; /* ... unless forced: no exclude is read */
    CHECK(set_exclude(d, p5, 2) == 0, "write");
    expect("partial exclude, forced bf16", d, 0, SM_ACTS_BF16, "0 0 0 0", SM_ACT_SRC_FORCED);
}

/* A config the engine does not implement stops the load, naming the field. */
static void test_load_refused(void) {
    char d[600], p[700], *text;
    sm_err e = {{0}};
    if (mk("refused", SM_EXP_MXFP4, SM_ACTS_MXFP4, d)) { CHECK(0, "make"); return; }
    snprintf(p, sizeof p, "%s/config.json", d);
    if (sm_config_read_text(p, &text, &e)) { CHECK(0, "%s", e.msg); return; }
    json_t *r = json_loads(text, 0, NULL);
    free(text);
    set_path(r, "quantization_config.global_quant_config.input_tensors.group_size", json_integer(64));
    json_dump_file(r, p, 0);
    json_decref(r);
    sm_model m;
    CHECK(sm_model_load(d, NULL, &m, &e) == -1 && strstr(e.msg, "config.json: quantization_config.global_quant_config."
                                                                "input_tensors.group_size: 64 is not supported"),
          "load: '%s'", e.msg);
}

/* A rank's shard carries its layer's act_mx (both splits). */
static void test_shard_copy(void) {
    sm_model m;
    sm_err e = {{0}};
    if (sm_model_load(d_w4a4, NULL, &m, &e)) { CHECK(0, "%s", e.msg); return; }
    for (int moe = 0; moe < 2; moe++) {
        sm_shard s;
        if (sm_shard_make(&m, 2, 1, moe ? SM_MOE_TP : SM_MOE_EP, &s, &e)) { CHECK(0, "shard: %s", e.msg); continue; }
        for (int l = 0; l < m.cfg.L; l++)
            CHECK(s.layers[l].ex.act_mx == m.layers[l].ex.act_mx, "moe %d layer %d: shard act_mx %d", moe, l,
                  s.layers[l].ex.act_mx);
        sm_shard_free(&s);
    }
    sm_model_free(&m);
}

/* ---- the C API ---- */
static void test_api(void) {
    CHECK(sparkmono_struct_size("sparkmono_model_opts") == sizeof(sparkmono_model_opts), "struct size");
    sparkmono_model *m = NULL;
    sparkmono_model_opts o = {0};
    o.activations = "w4a4";
    CHECK(sparkmono_model_open(d_w4a4, &o, &m) == SM_E_INVALID && !m &&
              strstr(sparkmono_errmsg(), "activations 'w4a4' is not one of auto, mxfp4, bf16"),
          "bad word: %s", sparkmono_errmsg());
    const char *ok[] = {NULL, "", "auto", "mxfp4", "bf16"};
    for (int i = 0; i < 5; i++) {
        o.activations = ok[i];
        CHECK(sparkmono_model_open(d_w4a4, &o, &m) == SM_OK, "'%s': %s", ok[i] ? ok[i] : "NULL", sparkmono_errmsg());
        sparkmono_model_close(m);
        m = NULL;
    }
    o.activations = "mxfp4";
    CHECK(sparkmono_model_open(d_bf16, &o, &m) == SM_E_MODEL && strstr(sparkmono_errmsg(), "online"),
          "mxfp4 on bf16: %s", sparkmono_errmsg());
    o.online_mxfp4 = 1;
    CHECK(sparkmono_model_open(d_bf16, &o, &m) == SM_OK, "mxfp4 online: %s", sparkmono_errmsg());
    sparkmono_model_close(m);
}

/* Prefill logits [n, V] of prompt on dir with activations acts (C API, CPU). */
static float *logits_of(const char *dir, const char *acts, const int *prompt, int n, int *V) {
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    sparkmono_model_opts mo = {0};
    mo.activations = acts;
    sparkmono_engine_opts eo = {0};
    eo.threads = 2;
    eo.max_len = 64;
    float *out = NULL;
    int req;
    sparkmono_model_info info;
    if (sparkmono_model_open(dir, &mo, &m) || sparkmono_model_get_info(m, &info) ||
        sparkmono_engine_create(m, &eo, &g) || sparkmono_add(g, prompt, n, 0, &req))
        goto out;
    *V = info.vocab_size;
    out = malloc(sizeof(float) * (size_t)n * (size_t)info.vocab_size);
    if (out && sparkmono_prefill(g, req, out)) { free(out); out = NULL; }
out:
    if (!out) printf("  %s (%s): %s\n", dir, acts, sparkmono_errmsg());
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return out;
}

/* The switch changes the numerics: on a W4A4 checkpoint auto == mxfp4 bit for bit and bf16
 * differs; on one without a config auto == bf16 and mxfp4 differs.  (Needs the CPU reference
 * to read sm_experts.act_mx: src/cpu/ops_moe.c.) */
static void test_numerics_switch(void) {
    const int prompt[6] = {5, 6, 7, 8, 9, 10};
    const char *dirs[2] = {d_w4a4, d_none};
    for (int k = 0; k < 2; k++) {
        int V = 0;
        float *a = logits_of(dirs[k], "auto", prompt, 6, &V), *mx = logits_of(dirs[k], "mxfp4", prompt, 6, &V),
              *bf = logits_of(dirs[k], "bf16", prompt, 6, &V);
        if (a && mx && bf) {
            size_t nb = sizeof(float) * 6 * (size_t)V;
            const float *same = k == 0 ? mx : bf, *other = k == 0 ? bf : mx;
            CHECK(!memcmp(a, same, nb), "%s: auto differs from %s", k ? "no config" : "w4a4", k ? "bf16" : "mxfp4");
            CHECK(memcmp(a, other, nb) != 0, "%s: auto equals %s: act_mx changes nothing", k ? "no config" : "w4a4",
                  k ? "mxfp4" : "bf16");
        } else
            CHECK(0, "logits");
        free(a), free(mx), free(bf);
    }
}

int main(void) {
    sm_err e = {{0}};
    if (sm_config_preset("tiny", &cfg, &e) || tm_mkdtemp(tmp, sizeof tmp, "sm_test_acts")) {
        printf("FAIL setup (%s)\n", e.msg);
        return 1;
    }
    RUN(test_parse_accepted);
    RUN(test_parse_refused);
    if (mk("none", SM_EXP_MXFP4, SM_ACTS_AUTO, d_none) || mk("w4a4", SM_EXP_MXFP4, SM_ACTS_MXFP4, d_w4a4) ||
        mk("wonly", SM_EXP_MXFP4, SM_ACTS_BF16, d_wonly) || mk("bf16", SM_EXP_BF16, SM_ACTS_AUTO, d_bf16) ||
        mk("fp8", SM_EXP_FP8, SM_ACTS_AUTO, d_fp8)) {
        printf("FAIL setup\n");
        tm_rmtree(tmp);
        return 1;
    }
    RUN(test_load_acts);
    RUN(test_exclude);
    RUN(test_load_refused);
    RUN(test_shard_copy);
    RUN(test_api);
    RUN(test_numerics_switch);
    tm_rmtree(tmp);
    return TEST_DONE();
}
