/* test_config.c: config.json parsing, validation, presets, save/load round trip.
 *
 * Error cases are one table of edits applied to a valid base config (set or delete one
 * field), each with the substring the message must contain, so a new rule is one line here.
 * We rejected one fixture file per case: dozens of near-identical JSON files hide the one
 * field that differs.
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "tmodel.h"
#include "model/config.h"

/* A valid tiny-like config in the HF layout, every field spelled out. */
static const char *BASE =
    "{\"architectures\": [\"MuseSparkForConditionalGeneration\"], \"model_type\": \"muse_spark\",\n"
    " \"vision_config\": {\"hidden_size\": 1152, \"num_hidden_layers\": 27},\n"
    " \"text_config\": {\n"
    "  \"num_hidden_layers\": 4, \"hidden_size\": 256, \"moe_hidden_size\": 128,\n"
    "  \"moe_intermediate_size\": 128, \"num_local_experts\": 16, \"num_experts_per_tok\": 4,\n"
    "  \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, \"vocab_size\": 512,\n"
    "  \"sliding_window\": 64, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0},\n"
    "  \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"sliding_attention\"],\n"
    "  \"layer_rope_theta\": [500000.0, 0, 500000, 500000.0],\n"
    "  \"mlp_layer_types\": [\"sparse\", \"sparse\", \"sparse\", \"sparse\"], \"num_shared_experts\": 0,\n"
    "  \"rms_norm_eps\": 1e-05, \"post_norm_eps\": 1e-08, \"residual_gate_temperature\": 0.3,\n"
    "  \"qk_scale_factor\": 5.4730064863875, \"output_multiplier\": 0.17677669529663687,\n"
    "  \"final_logit_softcapping\": 20.0, \"routed_scaling_factor\": 1.0,\n"
    "  \"bos_token_id\": 1, \"eos_token_id\": [2], \"pad_token_id\": 0,\n"
    "  \"attention_bias\": false, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,\n"
    "  \"unknown_field_is_ignored\": [1, 2, 3]}}\n";

/* The real model as its config.json would state it: no layer_types (derived), eos a list,
 * tie_word_embeddings at the top level beside text_config. */
static const char *REAL =
    "{\"architectures\": [\"MuseSparkForConditionalGeneration\"], \"tie_word_embeddings\": false,\n"
    " \"text_config\": {\n"
    "  \"num_hidden_layers\": 62, \"hidden_size\": 8192, \"moe_hidden_size\": 4096,\n"
    "  \"moe_intermediate_size\": 4096, \"num_local_experts\": 256, \"num_experts_per_tok\": 8,\n"
    "  \"num_attention_heads\": 128, \"num_key_value_heads\": 16, \"head_dim\": 64,\n"
    "  \"vocab_size\": 202048, \"vocab_used\": 201818, \"sliding_window\": 2048,\n"
    "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000},\n"
    "  \"rms_norm_eps\": 1e-5, \"post_norm_eps\": 1e-8, \"residual_gate_temperature\": 0.3,\n"
    "  \"qk_scale_factor\": 5.4730064863875, \"output_multiplier\": 0.1767766952966369,\n"
    "  \"final_logit_softcapping\": 20, \"route_scale\": 1.0,\n"
    "  \"bos_token_id\": 200000, \"eos_token_id\": [200001, 200008], \"pad_token_id\": 200018,\n"
    "  \"attention_bias\": false, \"hidden_act\": \"silu\", \"num_shared_experts\": 0}}\n";

/* Apply one edit to BASE and parse it as "config.json".  key: a text_config field, a dotted
 * path one object deep ("rope_parameters.rope_type"), or "^name" for a top-level field.
 * val: JSON text, or NULL to delete the field. */
static int parse_edit(const char *key, const char *val, sm_config *c, sm_err *e) {
    json_error_t je;
    json_t *root = json_loads(BASE, 0, &je);
    if (!root) { printf("  BASE does not parse: %s\n", je.text); return -2; }
    json_t *obj = json_object_get(root, "text_config");
    char name[128];
    snprintf(name, sizeof name, "%s", key);
    char *k = name, *dot = strchr(name, '.');
    if (name[0] == '^') obj = root, k = name + 1;
    else if (dot) *dot = 0, obj = json_object_get(obj, name), k = dot + 1;
    if (val) json_object_set_new(obj, k, json_loads(val, JSON_DECODE_ANY, &je));
    else json_object_del(obj, k);
    char *text = json_dumps(root, 0);
    int rc = sm_config_parse(text, "config.json", c, e);
    free(text);
    json_decref(root);
    return rc;
}

static void test_base_parses(void) {
    sm_config c, t;
    sm_err e = {""};
    CHECK(sm_config_parse(BASE, "config.json", &c, &e) == 0, "%s", e.msg);
    CHECK(sm_config_preset("tiny", &t, &e) == 0, "%s", e.msg);
    const char *w = NULL;
    CHECK(sm_config_same(&c, &t, &w), "BASE differs from preset tiny in '%s'", w);
}

static void test_presets(void) {
    const char *names[] = {"tiny", "mini", "spark1x", "spark1x-l4"};
    sm_config c;
    sm_err e = {""};
    for (int i = 0; i < 4; i++) {
        CHECK(sm_config_preset(names[i], &c, &e) == 0, "%s: %s", names[i], e.msg);
        CHECK(sm_config_validate(&c, names[i], &e) == 0, "%s: %s", names[i], e.msg);
        for (int l = 0; l < c.L; l++) CHECK(c.full[l] == (l % 4 == 1), "%s layer %d", names[i], l);
        CHECK(c.D == 64 && c.vocab_used <= c.V && c.bos >= 0 && c.bos < c.vocab_used && c.pad >= 0 &&
                  c.pad < c.vocab_used && c.n_eos >= 1,
              "%s ids", names[i]);
        for (int j = 0; j < c.n_eos; j++) CHECK(c.eos[j] < c.vocab_used, "%s eos %d", names[i], j);
        CHECK(c.rms_eps == 1e-5f && c.post_eps == 1e-8f && c.gate_temp == 0.3f &&
                  c.qk_scale_factor == 5.4730064863875f && c.out_mult == (float)pow(2.0, -2.5) &&
                  c.softcap == 20.0f && c.route_scale == 1.0f && c.rope_theta == 500000.0,
              "%s scalars", names[i]);
    }
    sm_config_preset("tiny", &c, &e);
    CHECK(c.L == 4 && c.H == 256 && c.Hm == 128 && c.I == 128 && c.E == 16 && c.K == 4 && c.nH == 4 &&
              c.nKV == 2 && c.V == 512 && c.vocab_used == 512 && c.window == 64 && sm_config_group(&c) == 2,
          "tiny sizes");
    CHECK(c.bos == 1 && c.pad == 0 && c.n_eos == 1 && c.eos[0] == 2, "tiny ids");
    sm_config_preset("mini", &c, &e);
    CHECK(c.L == 4 && c.H == 1024 && c.Hm == 512 && c.I == 512 && c.E == 16 && c.K == 4 && c.nH == 16 &&
              c.nKV == 8 && c.V == 2048 && c.vocab_used == 2048 && c.window == 256,
          "mini sizes");
    sm_config r, r4;
    sm_config_preset("spark1x", &r, &e);
    CHECK(r.L == 62 && r.H == 8192 && r.Hm == 4096 && r.I == 4096 && r.E == 256 && r.K == 8 && r.nH == 128 &&
              r.nKV == 16 && r.V == 202048 && r.vocab_used == 201818 && r.window == 2048 &&
              sm_config_group(&r) == 8,
          "spark1x sizes");
    CHECK(r.bos == 200000 && r.pad == 200018 && r.n_eos == 2 && r.eos[0] == 200001 && r.eos[1] == 200008,
          "spark1x ids");
    sm_config_preset("spark1x-l4", &r4, &e);
    CHECK(r4.L == 4, "spark1x-l4 L=%d", r4.L);
    r4.L = 62;
    for (int l = 4; l < 62; l++) r4.full[l] = r.full[l];
    const char *w = NULL;
    CHECK(sm_config_same(&r, &r4, &w), "spark1x-l4 differs from spark1x in '%s' (besides L)", w);
}

static void test_preset_unknown(void) {
    sm_config c;
    sm_err e = {""};
    CHECK(sm_config_preset("huge", &c, &e) == -1, "accepted");
    CHECK(strstr(e.msg, "'huge'") && strstr(e.msg, "tiny"), "%s", e.msg);
    CHECK(sm_config_preset(NULL, &c, &e) == -1, "NULL accepted");
}

static void test_parse_real(void) {
    sm_config c, r;
    sm_err e = {""};
    CHECK(sm_config_parse(REAL, "config.json", &c, &e) == 0, "%s", e.msg);
    sm_config_preset("spark1x", &r, &e);
    const char *w = NULL;
    CHECK(sm_config_same(&c, &r, &w), "real config differs from preset spark1x in '%s'", w);
}

/* No text_config: the top level; optional fields absent take the real-model defaults. */
static void test_top_level_defaults(void) {
    const char *j =
        "{\"num_hidden_layers\": 9, \"hidden_size\": 64, \"moe_hidden_size\": 32,\n"
        " \"moe_intermediate_size\": 64, \"num_local_experts\": 8, \"num_experts_per_tok\": 8,\n"
        " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 64, \"vocab_size\": 100,\n"
        " \"attention_bias\": false, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,\n"
        " \"rope_theta\": 10000, \"routed_scaling_factor\": 2.5, \"eos_token_id\": 7}";
    sm_config c;
    sm_err e = {""};
    CHECK(sm_config_parse(j, "config.json", &c, &e) == 0, "%s", e.msg);
    CHECK(c.L == 9 && c.H == 64 && c.Hm == 32 && c.I == 64 && c.E == 8 && c.K == 8 && c.nH == 2 && c.nKV == 1 &&
              c.V == 100,
          "sizes");
    CHECK(c.vocab_used == 100 && c.window == 2048, "vocab_used %d window %d", c.vocab_used, c.window);
    CHECK(c.rope_theta == 10000.0 && c.route_scale == 2.5f, "theta %g route_scale %g", c.rope_theta,
          (double)c.route_scale);
    CHECK(c.rms_eps == 1e-5f && c.post_eps == 1e-8f && c.gate_temp == 0.3f &&
              c.qk_scale_factor == 5.4730064863875f && c.out_mult == (float)pow(2.0, -2.5) && c.softcap == 20.0f,
          "defaults");
    CHECK(c.bos == -1 && c.pad == -1 && c.n_eos == 1 && c.eos[0] == 7, "ids %d %d %d", c.bos, c.pad, c.n_eos);
    for (int l = 0; l < 9; l++) CHECK(c.full[l] == (l % 4 == 1), "layer %d", l);
}

/* Explicit layer kinds win over the rule; ids and tie_word_embeddings fall back to the top. */
static void test_layer_types_and_fallback(void) {
    json_error_t je;
    json_t *root = json_loads(BASE, 0, &je);
    json_t *tc = json_object_get(root, "text_config");
    json_object_set_new(tc, "layer_types",
                        json_loads("[\"full_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\"]",
                                   0, &je));
    json_object_set_new(tc, "layer_rope_theta", json_loads("[0, 500000, 0, 500000]", 0, &je));
    json_object_del(tc, "tie_word_embeddings");
    json_object_del(tc, "bos_token_id");
    json_object_del(tc, "eos_token_id");
    json_object_set_new(root, "tie_word_embeddings", json_false());
    json_object_set_new(root, "bos_token_id", json_integer(5));
    json_object_set_new(root, "eos_token_id", json_loads("[6, 7, 8]", 0, &je));
    json_object_set_new(tc, "num_shared_experts", json_null());
    json_object_del(tc, "mlp_layer_types");
    char *text = json_dumps(root, 0);
    sm_config c;
    sm_err e = {""};
    CHECK(sm_config_parse(text, "config.json", &c, &e) == 0, "%s", e.msg);
    CHECK(c.full[0] == 1 && c.full[1] == 0 && c.full[2] == 1 && c.full[3] == 0, "kinds %d%d%d%d", c.full[0],
          c.full[1], c.full[2], c.full[3]);
    CHECK(c.bos == 5 && c.n_eos == 3 && c.eos[0] == 6 && c.eos[2] == 8, "fallback ids");
    free(text);
    json_decref(root);
}

typedef struct edit_case {
    const char *key; /* see parse_edit */
    const char *val; /* JSON text; NULL deletes */
    const char *msg; /* substring the error must contain */
} edit_case;

static const edit_case BAD[] = {
    {"head_dim", "128", "config.json: field 'head_dim' must be 64 (got 128)"},
    {"head_dim", "\"64\"", "config.json: field 'head_dim' must be an integer (got string \"64\")"},
    {"head_dim", "64.0", "field 'head_dim' must be an integer (got real 64)"},
    {"head_dim", NULL, "field 'head_dim' is missing"},
    {"num_hidden_layers", NULL, "field 'num_hidden_layers' is missing"},
    {"hidden_size", NULL, "field 'hidden_size' is missing"},
    {"moe_hidden_size", NULL, "field 'moe_hidden_size' is missing"},
    {"moe_intermediate_size", NULL, "field 'moe_intermediate_size' is missing"},
    {"num_local_experts", NULL, "field 'num_local_experts' is missing"},
    {"num_experts_per_tok", NULL, "field 'num_experts_per_tok' is missing"},
    {"num_attention_heads", NULL, "field 'num_attention_heads' is missing"},
    {"num_key_value_heads", NULL, "field 'num_key_value_heads' is missing"},
    {"vocab_size", NULL, "field 'vocab_size' is missing"},
    {"hidden_size", "0", "field 'hidden_size' must be positive (got 0)"},
    {"num_key_value_heads", "-2", "field 'num_key_value_heads' must be positive (got -2)"},
    {"num_hidden_layers", "257", "field 'num_hidden_layers' must be at most 256 (got 257)"},
    {"vocab_size", "10000000000", "field 'vocab_size' is out of range"},
    {"hidden_size", "100000000", "field 'hidden_size' must be at most"},
    {"num_attention_heads", "3", "field 'num_attention_heads' (3) must be a multiple of 'num_key_value_heads' (2)"},
    {"num_experts_per_tok", "17", "field 'num_experts_per_tok' (17) must be at most 'num_local_experts' (16)"},
    {"moe_hidden_size", "100", "field 'moe_hidden_size' must be a multiple of 32"},
    {"moe_intermediate_size", "48", "field 'moe_intermediate_size' must be a multiple of 32"},
    {"vocab_used", "0", "field 'vocab_used' must be in [1, vocab_size=512] (got 0)"},
    {"vocab_used", "513", "field 'vocab_used' must be in [1, vocab_size=512] (got 513)"},
    {"vocab_used", "null", "field 'vocab_used' must be an integer (got null)"},
    {"sliding_window", "0", "field 'sliding_window' must be positive (got 0)"},
    {"sliding_window", "\"2048\"", "field 'sliding_window' must be an integer (got string"},
    {"eos_token_id", "[1,2,3,4,5,6,7,8,9]", "field 'eos_token_id' has 9 entries (at most 8)"},
    {"eos_token_id", "[1, \"x\"]", "field 'eos_token_id[1]' must be an integer"},
    {"eos_token_id", "{}", "field 'eos_token_id' must be an integer or a list of integers (got object)"},
    {"eos_token_id", "600", "field 'eos_token_id[0]' must be in [0, vocab_size=512) (got 600)"},
    {"bos_token_id", "512", "field 'bos_token_id' must be in [0, vocab_size=512) (got 512)"},
    {"bos_token_id", "\"1\"", "field 'bos_token_id' must be an integer or null (got string"},
    {"pad_token_id", "-3", "field 'pad_token_id' must be in [0, vocab_size=512) (got -3)"},
    {"attention_bias", "true", "field 'attention_bias' must be false (got true)"},
    {"attention_bias", "\"false\"", "field 'attention_bias' must be false (got string"},
    {"attention_bias", NULL, "field 'attention_bias' is missing"},
    {"hidden_act", "\"gelu\"", "field 'hidden_act' must be \"silu\" (got string \"gelu\")"},
    {"hidden_act", NULL, "field 'hidden_act' is missing"},
    {"tie_word_embeddings", "true", "field 'tie_word_embeddings' must be false (got true)"},
    {"tie_word_embeddings", NULL, "field 'tie_word_embeddings' is missing"},
    {"num_shared_experts", "1", "field 'num_shared_experts' must be 0 (got 1)"},
    {"num_shared_experts", "\"0\"", "field 'num_shared_experts' must be 0 (got string"},
    {"mlp_layer_types", "[\"sparse\", \"dense\", \"sparse\", \"sparse\"]", "field 'mlp_layer_types[1]' must be \"sparse\""},
    {"mlp_layer_types", "[\"sparse\"]", "field 'mlp_layer_types' has 1 entries (num_hidden_layers is 4)"},
    {"layer_types", "[\"sliding_attention\", \"full_attention\", \"chunked\", \"sliding_attention\"]",
     "field 'layer_types[2]' must be \"full_attention\" or \"sliding_attention\" (got string \"chunked\")"},
    {"layer_types", "[\"full_attention\"]", "field 'layer_types' has 1 entries"},
    {"layer_types", "\"full_attention\"", "field 'layer_types' must be a list"},
    {"layer_rope_theta", "[500000, 500000, 500000, 500000]", "field 'layer_rope_theta[1]' must be 0 on a full_attention layer"},
    {"layer_rope_theta", "[0, 0, 500000, 500000]", "field 'layer_rope_theta[0]' must be nonzero on a sliding_attention layer"},
    {"layer_rope_theta", "[10000, 0, 500000, 500000]", "field 'layer_rope_theta[0]' (10000) disagrees with rope_theta (500000)"},
    {"layer_rope_theta", "[500000, 0, \"x\", 500000]", "field 'layer_rope_theta[2]' must be a number"},
    {"rope_parameters.rope_type", "\"llama3\"", "field 'rope_parameters.rope_type' must be \"default\" (got string \"llama3\")"},
    {"rope_parameters.rope_theta", "\"big\"", "field 'rope_parameters.rope_theta' must be a number"},
    {"rope_parameters", "[]", "field 'rope_parameters' must be an object (got list)"},
    {"rope_theta", "10000", "field 'rope_theta' (10000) disagrees with 'rope_parameters.rope_theta' (500000)"},
    {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}", "field 'rope_scaling' must be null"},
    {"rms_norm_eps", "\"1e-5\"", "field 'rms_norm_eps' must be a number (got string \"1e-5\")"},
    {"rms_norm_eps", "0", "field 'rms_norm_eps' must be a finite positive number (got 0)"},
    {"post_norm_eps", "-1e-8", "field 'post_norm_eps' must be a finite positive number"},
    {"residual_gate_temperature", "0.0", "field 'residual_gate_temperature' must be a finite positive number"},
    {"qk_scale_factor", "true", "field 'qk_scale_factor' must be a number (got true)"},
    {"output_multiplier", "1e300", "field 'output_multiplier' must be a finite positive number (got inf)"},
    {"final_logit_softcapping", "null", "field 'final_logit_softcapping' must be a number (got null)"},
    {"route_scale", "2.0", "field 'route_scale' (2) disagrees with 'routed_scaling_factor' (1)"},
    {"routed_scaling_factor", "-1", "field 'route_scale' must be a finite positive number (got -1)"},
    {"^text_config", "5", "field 'text_config' must be an object (got integer 5)"},
};

static void test_errors(void) {
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        sm_config c, before;
        sm_err e = {""};
        memset(&c, 0x77, sizeof c);
        before = c;
        int rc = parse_edit(BAD[i].key, BAD[i].val, &c, &e);
        CHECK(memcmp(&c, &before, sizeof c) == 0, "%s: a failed parse changed the struct", BAD[i].key);
        CHECK(rc == -1, "%s=%s accepted", BAD[i].key, BAD[i].val ? BAD[i].val : "(deleted)");
        CHECK(strstr(e.msg, BAD[i].msg) != NULL, "%s=%s: message \"%s\" lacks \"%s\"", BAD[i].key,
              BAD[i].val ? BAD[i].val : "(deleted)", e.msg, BAD[i].msg);
        CHECK(strchr(e.msg, '\n') == NULL, "multi-line message: %s", e.msg);
    }
}

/* Edits that stay valid: the absent-ok fields and the other spellings. */
static void test_accepts(void) {
    static const edit_case OK[] = {
        {"num_shared_experts", NULL, ""}, {"mlp_layer_types", NULL, ""}, {"layer_types", NULL, ""},
        {"layer_rope_theta", NULL, ""},   {"rope_parameters", NULL, ""},  {"rope_parameters.rope_type", NULL, ""},
        {"rope_scaling", "null", ""},     {"rope_scaling", "{\"rope_type\": \"default\"}", ""},
        {"rope_theta", "500000", ""},     {"pad_token_id", "null", ""},   {"eos_token_id", "[]", ""},
        {"eos_token_id", NULL, ""},       {"vocab_used", "1", ""},        {"^text_config", NULL, ""},
    };
    for (size_t i = 0; i < sizeof OK / sizeof OK[0]; i++) {
        sm_config c;
        sm_err e = {""};
        int rc;
        if (!strcmp(OK[i].key, "^text_config")) {
            /* the same fields at the top level */
            json_error_t je;
            json_t *root = json_loads(BASE, 0, &je);
            char *text = json_dumps(json_object_get(root, "text_config"), 0);
            rc = sm_config_parse(text, "config.json", &c, &e);
            free(text);
            json_decref(root);
        } else {
            rc = parse_edit(OK[i].key, OK[i].val, &c, &e);
        }
        CHECK(rc == 0, "%s=%s rejected: %s", OK[i].key, OK[i].val ? OK[i].val : "(deleted)", e.msg);
    }
}

static void test_bad_json(void) {
    sm_config c;
    sm_err e = {""};
    CHECK(sm_config_parse("{\"hidden_size\": 1,\n \"x\": }", "config.json", &c, &e) == -1, "accepted");
    CHECK(strstr(e.msg, "config.json: invalid JSON at line 2"), "%s", e.msg);
    CHECK(sm_config_parse("[1, 2]", "config.json", &c, &e) == -1, "array accepted");
    CHECK(strstr(e.msg, "top level must be an object (got list)"), "%s", e.msg);
    CHECK(sm_config_parse("{\"text_config\": {\"head_dim\": 64, \"head_dim\": 64}}", "config.json", &c, &e) == -1,
          "duplicate key accepted");
    CHECK(strstr(e.msg, "config.json: invalid JSON") && strstr(e.msg, "head_dim"), "%s", e.msg);
    CHECK(sm_config_parse(NULL, "config.json", &c, &e) == -1, "NULL accepted");
}

static char tmpdir[512];

static void make_tmpdir(void) {
    if (tm_mkdtemp(tmpdir, sizeof tmpdir, "sm_test_config")) tmpdir[0] = 0;
}

/* Number of entries in tmpdir besides . and .. */
static int count_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *de;
    if (!d) return -1;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void roundtrip(const sm_config *c, const char *what) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    sm_err e = {""};
    sm_config b;
    memset(&b, 0x5A, sizeof b);
    CHECK(sm_config_save(c, path, &e) == 0, "%s: save: %s", what, e.msg);
    CHECK(sm_config_load(path, &b, &e) == 0, "%s: load: %s", what, e.msg);
    const char *w = NULL;
    CHECK(sm_config_same(c, &b, &w), "%s: reloaded config differs in '%s'", what, w);
    CHECK(memcmp(c, &b, sizeof b) == 0, "%s: reloaded struct differs bytewise", what);
    CHECK(count_files() == 1, "%s: %d files in the directory (temp file left?)", what, count_files());
    /* the file is HF-like: architectures and model_type at the top, the fields in text_config */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECK(root != NULL, "%s: saved file is not JSON: %s", what, je.text);
    if (!root) return;
    json_t *tc = json_object_get(root, "text_config");
    CHECK(json_is_array(json_object_get(root, "architectures")), "%s: architectures", what);
    CHECK(!strcmp(json_string_value(json_object_get(root, "model_type")) ? json_string_value(json_object_get(root, "model_type")) : "",
                  "muse_spark"),
          "%s: model_type", what);
    CHECK(json_is_object(tc), "%s: text_config", what);
    const char *need[] = {"layer_types", "layer_rope_theta", "rope_parameters", "vocab_used", "hidden_act",
                          "attention_bias", "tie_word_embeddings", "num_shared_experts", "mlp_layer_types",
                          "post_norm_eps", "residual_gate_temperature", "qk_scale_factor", "output_multiplier",
                          "final_logit_softcapping", "route_scale", "sliding_window", "eos_token_id"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        CHECK(json_object_get(tc, need[i]) != NULL, "%s: saved text_config lacks '%s'", what, need[i]);
    json_decref(root);
}

static void test_save_roundtrip(void) {
    const char *names[] = {"tiny", "mini", "spark1x", "spark1x-l4"};
    sm_config c;
    sm_err e = {""};
    CHECK(tmpdir[0], "no temp dir");
    if (!tmpdir[0]) return;
    for (int i = 0; i < 4; i++) {
        sm_config_preset(names[i], &c, &e);
        roundtrip(&c, names[i]);
    }
    /* odd values: every float must come back bit-identical */
    sm_config_preset("mini", &c, &e);
    sm_config_set_layers(&c, 7, &e);
    c.full[0] = 1, c.full[1] = 0, c.full[6] = 1;
    c.rope_theta = 1234.5678901234567;
    c.rms_eps = 1e-6f, c.post_eps = 3.3e-9f, c.gate_temp = 0.7f, c.qk_scale_factor = 1.0f / 3.0f;
    c.out_mult = 0.1f, c.softcap = 30.5f, c.route_scale = 2.5f;
    c.bos = -1, c.pad = -1, c.n_eos = 0, c.vocab_used = 2000, c.window = 17;
    memset(c.eos, 0, sizeof c.eos); /* entries past n_eos are not saved */
    roundtrip(&c, "odd");
    c.n_eos = SM_MAX_EOS;
    for (int i = 0; i < SM_MAX_EOS; i++) c.eos[i] = 2047 - i;
    roundtrip(&c, "many eos");
}

static void test_save_errors(void) {
    sm_config c;
    sm_err e = {""};
    char path[600];
    sm_config_preset("tiny", &c, &e);
    snprintf(path, sizeof path, "%s/no/such/dir/config.json", tmpdir);
    CHECK(sm_config_save(&c, path, &e) == -1, "save into a missing directory succeeded");
    CHECK(strstr(e.msg, "no/such/dir/config.json"), "%s", e.msg);
    c.D = 128;
    snprintf(path, sizeof path, "%s/bad.json", tmpdir);
    CHECK(sm_config_save(&c, path, &e) == -1, "invalid config saved");
    CHECK(strstr(e.msg, "'head_dim' must be 64"), "%s", e.msg);
    CHECK(access(path, F_OK) != 0, "invalid config left a file");
}

static void test_load_errors(void) {
    sm_config c;
    sm_err e = {""};
    char path[600];
    snprintf(path, sizeof path, "%s/missing.json", tmpdir);
    CHECK(sm_config_load(path, &c, &e) == -1, "missing file loaded");
    CHECK(strstr(e.msg, "missing.json: cannot open"), "%s", e.msg);
    /* a field error names the file path */
    snprintf(path, sizeof path, "%s/cfg.json", tmpdir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs("{\"text_config\": {\"num_hidden_layers\": \"four\"}}", f);
    fclose(f);
    CHECK(sm_config_load(path, &c, &e) == -1, "bad file loaded");
    CHECK(strstr(e.msg, "cfg.json: field 'num_hidden_layers' must be an integer (got string \"four\")"), "%s", e.msg);
    remove(path);
}

static void test_set_layers(void) {
    sm_config c;
    sm_err e = {""};
    sm_config_preset("spark1x", &c, &e);
    c.full[0] = 1;
    CHECK(sm_config_set_layers(&c, 6, &e) == 0, "%s", e.msg);
    CHECK(c.L == 6, "L %d", c.L);
    for (int l = 0; l < SM_MAX_LAYERS; l++) CHECK(c.full[l] == (l < 6 && l % 4 == 1), "layer %d", l);
    CHECK(sm_config_set_layers(&c, 0, &e) == -1 && strstr(e.msg, "(got 0)"), "0 layers: %s", e.msg);
    CHECK(sm_config_set_layers(&c, SM_MAX_LAYERS + 1, &e) == -1, "too many layers accepted");
    CHECK(c.L == 6, "failed call changed L to %d", c.L);
    CHECK(sm_config_set_layers(&c, SM_MAX_LAYERS, &e) == 0, "%s", e.msg);
}

static void test_validate(void) {
    sm_config c;
    sm_err e = {""};
    sm_config_preset("tiny", &c, &e);
    c.n_eos = SM_MAX_EOS + 1;
    CHECK(sm_config_validate(&c, "x", &e) == -1 && strstr(e.msg, "eos_token_id"), "%s", e.msg);
    sm_config_preset("tiny", &c, &e);
    c.full[2] = 7;
    CHECK(sm_config_validate(&c, "x", &e) == -1 && strstr(e.msg, "layer_types[2]"), "%s", e.msg);
    sm_config_preset("tiny", &c, &e);
    c.softcap = NAN;
    CHECK(sm_config_validate(&c, "x", &e) == -1 && strstr(e.msg, "final_logit_softcapping"), "%s", e.msg);
    sm_config_preset("tiny", &c, &e);
    c.rope_theta = INFINITY;
    CHECK(sm_config_validate(&c, "x", &e) == -1 && strstr(e.msg, "rope_theta"), "%s", e.msg);
}

int main(void) {
    make_tmpdir();
    RUN(test_base_parses);
    RUN(test_presets);
    RUN(test_preset_unknown);
    RUN(test_parse_real);
    RUN(test_top_level_defaults);
    RUN(test_layer_types_and_fallback);
    RUN(test_errors);
    RUN(test_accepts);
    RUN(test_bad_json);
    RUN(test_save_roundtrip);
    RUN(test_save_errors);
    RUN(test_load_errors);
    RUN(test_set_layers);
    RUN(test_validate);
    tm_rmtree(tmpdir);
    return TEST_DONE();
}
