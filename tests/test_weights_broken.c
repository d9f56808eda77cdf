/* test_weights_broken.c: the checkpoint loader's refusals and accepted variants
 * (src/model/weights.c, src/model/safetensors.c).  Broken checkpoints are written tensor by
 * tensor with st_writer from a good one (drop / add / retype / reshape / poke) and each load
 * must fail with a message naming the tensor; accepted variants (F4 / F8_E8M0 dtypes,
 * per-expert BF16, misaligned views) must load and equal the good model.  The good models:
 * wfixture.h (shared with test_weights.c). */
#include "check.h"
#include "tmodel.h"
#include "engine/check.h"
#include "model/codec.h"
#include "model/config.h"
#include "testing/makemodel.h"
#include "model/safetensors.h"
#include "parallel/shard.h"
#include "model/weights.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "wfixture.h"

#define P_ "model.language_model."

/* ---- broken checkpoints ---- */
typedef struct otensor {
    char name[200];
    st_dtype dt;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
    uint8_t *owned; /* modified copy of data, or NULL */
} otensor;
typedef struct olist { otensor t[4096]; int n; } olist;

static olist *from_archive(const st_archive *a) {
    olist *l = calloc(1, sizeof *l);
    for (int i = 0; i < a->ntensors && l->n < 4096; i++) {
        otensor *o = &l->t[l->n++];
        const st_tensor *t = &a->tensors[i];
        snprintf(o->name, sizeof o->name, "%s", t->name);
        o->dt = t->dtype;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, sizeof o->shape);
        o->data = t->data;
        o->nbytes = t->nbytes;
    }
    return l;
}
static otensor *ofind(olist *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}
static void odrop(olist *l, const char *name) {
    otensor *t = ofind(l, name);
    if (!t) { printf("  (test bug: no tensor %s to drop)\n", name); return; }
    free(t->owned);
    *t = l->t[--l->n];
}
static otensor *oadd(olist *l, const char *name, st_dtype dt, int ndim, const int64_t *shape, const void *data, size_t nb) {
    otensor *o = &l->t[l->n++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dt = dt;
    o->ndim = ndim;
    memcpy(o->shape, shape, sizeof(int64_t) * (size_t)ndim);
    o->data = data;
    o->nbytes = nb;
    return o;
}
static void ofree(olist *l) {
    for (int i = 0; i < l->n; i++) free(l->t[i].owned);
    free(l);
}
/* Write the list as dir/model.safetensors (+ config.json of cfg c); first_name is declared first. */
static int owrite(olist *l, const char *dir, const sm_config *c, const char *first_name) {
    char p[4400];
    sm_err e = {{0}};
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (sm_config_save(c, p, &e)) { printf("  %s\n", e.msg); return -1; }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_writer w;
    if (st_writer_open(&w, p, &e)) { printf("  %s\n", e.msg); return -1; }
    int order[4096], k = 0;
    for (int i = 0; i < l->n; i++)
        if (first_name && !strcmp(l->t[i].name, first_name)) order[k++] = i;
    for (int i = 0; i < l->n; i++)
        if (!first_name || strcmp(l->t[i].name, first_name)) order[k++] = i;
    for (int i = 0; i < k; i++) {
        otensor *t = &l->t[order[i]];
        if (st_writer_declare(&w, t->name, t->dt, t->ndim, t->shape, &e)) { printf("  %s\n", e.msg); st_writer_abort(&w); return -1; }
    }
    for (int i = 0; i < k; i++) {
        otensor *t = &l->t[order[i]];
        if (t->nbytes && st_writer_write(&w, t->owned ? t->owned : t->data, t->nbytes, &e)) {
            printf("  %s\n", e.msg);
            st_writer_abort(&w);
            return -1;
        }
    }
    if (st_writer_finish(&w, &e)) { printf("  %s\n", e.msg); return -1; }
    return 0;
}

static int ncase;
/* Write l as a fresh checkpoint and load it: expect failure naming `want1` (and `want2`). */
static void expect_fail(olist *l, const char *what, const char *want1, const char *want2) {
    char d[4200], nm[64];
    snprintf(nm, sizeof nm, "bad%02d", ncase++);
    path_in(d, nm);
    if (owrite(l, d, &cfg, NULL)) { CHECK(0, "%s: could not write the checkpoint", what); return; }
    sm_model m;
    sm_err e = {{0}};
    int rc = sm_model_load(d, NULL, &m, &e);
    CHECK(rc == -1, "%s: loaded a broken checkpoint", what);
    if (rc == 0) { sm_model_free(&m); return; }
    CHECK(strstr(e.msg, want1) && (!want2 || strstr(e.msg, want2)) && !strchr(e.msg, '\n'),
          "%s: message '%s' lacks '%s'%s%s", what, e.msg, want1, want2 ? " / " : "", want2 ? want2 : "");
    printf("  %-22s -> %s\n", what, e.msg);
}

/* The three good models of the test as archives (BF16, MXFP4, FP8 experts). */
static int open_good(st_archive *ab, st_archive *am, st_archive *af) {
    sm_err e = {{0}};
    if (st_open_dir(d_bf16, ab, &e) || st_open_dir(d_mx, am, &e) || st_open_dir(d_fp8, af, &e)) {
        CHECK(0, "open: %s", e.msg);
        st_close(ab);
        st_close(am);
        st_close(af);
        return -1;
    }
    return 0;
}

/* Broken checkpoints (1): duplicate and missing tensors. */
static void test_broken(void) {
    st_archive ab = {0}, am = {0}, af = {0};
    if (open_good(&ab, &am, &af)) return;
    const sm_config *c = &cfg;
    int64_t I2 = 2 * (int64_t)c->I, Hm = c->Hm;
    olist *l;
    const char *n;

    /* both layouts in one layer */
    l = from_archive(&ab);
    const st_tensor *cgu = st_find(&ab, P_ "layers.1.mlp.experts.gate_up_proj");
    int64_t s2[2] = {I2, Hm};
    n = P_ "layers.1.mlp.experts.0.gate_up_proj.weight";
    oadd(l, n, ST_BF16, 2, s2, cgu->data, (size_t)(I2 * Hm * 2));
    expect_fail(l, "duplicate layouts", n, "duplicate");
    ofree(l);

    /* the same expert twice through a non-canonical index */
    l = from_archive(&am);
    const st_tensor *t = st_find(&am, P_ "layers.1.mlp.experts.1.gate_up_proj.weight");
    n = P_ "layers.1.mlp.experts.01.gate_up_proj.weight";
    oadd(l, n, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    expect_fail(l, "duplicate index", "experts.01.gate_up_proj.weight", "duplicate");
    ofree(l);

    /* missing expert (all four tensors of expert 3) */
    l = from_archive(&am);
    odrop(l, P_ "layers.1.mlp.experts.3.gate_up_proj.weight");
    odrop(l, P_ "layers.1.mlp.experts.3.gate_up_proj.weight_scale");
    odrop(l, P_ "layers.1.mlp.experts.3.down_proj.weight");
    odrop(l, P_ "layers.1.mlp.experts.3.down_proj.weight_scale");
    expect_fail(l, "missing expert", P_ "layers.1.mlp.experts.3.gate_up_proj.weight", "missing expert 3");
    ofree(l);

    /* missing projection; missing scale */
    l = from_archive(&am);
    n = P_ "layers.2.mlp.experts.5.down_proj.weight";
    odrop(l, n);
    expect_fail(l, "missing projection", n, "missing");
    ofree(l);
    l = from_archive(&af);
    n = P_ "layers.2.mlp.experts.0.gate_up_proj.weight_scale";
    odrop(l, n);
    expect_fail(l, "missing fp8 scale", n, "missing");
    ofree(l);

    /* missing dense tensor; missing consolidated half */
    l = from_archive(&ab);
    n = P_ "layers.3.self_attn.o_proj.weight";
    odrop(l, n);
    expect_fail(l, "missing tensor", n, "missing");
    ofree(l);
    l = from_archive(&ab);
    n = P_ "layers.0.mlp.experts.down_proj";
    odrop(l, n);
    expect_fail(l, "missing down_proj", n, "missing");
    ofree(l);

    st_close(&ab);
    st_close(&am);
    st_close(&af);
}

/* Broken checkpoints (2): shapes, dtypes, formats, names, scales, a truncated file. */
static void test_broken_values(void) {
    st_archive ab = {0}, am = {0}, af = {0};
    if (open_good(&ab, &am, &af)) return;
    sm_err e = {{0}};
    const sm_config *c = &cfg;
    int64_t I2 = 2 * (int64_t)c->I, Hm = c->Hm;
    olist *l;
    const char *n;
    const st_tensor *t;

    /* wrong shape (same bytes) */
    l = from_archive(&ab);
    n = P_ "layers.0.self_attn.q_proj.weight";
    otensor *o = ofind(l, n);
    o->shape[0] /= 2;
    o->shape[1] *= 2;
    expect_fail(l, "wrong shape", n, "shape");
    ofree(l);
    l = from_archive(&am);
    n = P_ "layers.1.mlp.experts.2.down_proj.weight_scale";
    o = ofind(l, n);
    o->shape[0] *= o->shape[1];
    o->shape[1] = 1;
    expect_fail(l, "wrong scale shape", n, "shape");
    ofree(l);

    /* wrong dtype (same bytes) */
    l = from_archive(&ab);
    n = P_ "layers.2.mlp.gate.weight";
    ofind(l, n)->dt = ST_I32;
    expect_fail(l, "wrong dtype", n, "dtype");
    ofree(l);
    l = from_archive(&ab);
    n = P_ "embed_tokens.weight";
    ofind(l, n)->dt = ST_F16;
    expect_fail(l, "wrong embed dtype", n, "dtype");
    ofree(l);
    l = from_archive(&am);
    n = P_ "layers.1.mlp.experts.0.gate_up_proj.weight";
    ofind(l, n)->dt = ST_I8;
    expect_fail(l, "bad expert dtype", n, "dtype");
    ofree(l);

    /* mixed formats: expert 6 of layer 1 taken from the FP8 model */
    l = from_archive(&am);
    odrop(l, P_ "layers.1.mlp.experts.6.gate_up_proj.weight");
    odrop(l, P_ "layers.1.mlp.experts.6.gate_up_proj.weight_scale");
    n = P_ "layers.1.mlp.experts.6.gate_up_proj.weight";
    t = st_find(&af, n);
    oadd(l, n, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    t = st_find(&af, P_ "layers.1.mlp.experts.6.gate_up_proj.weight_scale");
    oadd(l, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    expect_fail(l, "mixed formats", n, "mixes");
    ofree(l);

    /* unknown names: under P, top level, bad suffix of an expert, layer and expert out of range */
    int64_t s1[1] = {4};
    static const uint8_t four[16] = {0};
    const char *unknown[] = {P_ "layers.0.mlp.foo.weight", "foo.weight", P_ "layers.1.mlp.experts.2.up_proj.weight",
                             P_ "layers.x.input_layernorm.weight", P_ "rotary_emb.inv_freq"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        l = from_archive(&ab);
        oadd(l, unknown[i], ST_F32, 1, s1, four, 16);
        expect_fail(l, "unknown name", unknown[i], "unknown");
        ofree(l);
    }
    l = from_archive(&ab);
    n = P_ "layers.4.input_layernorm.weight";
    oadd(l, n, ST_F32, 1, s1, four, 16);
    expect_fail(l, "layer out of range", n, ">=");
    ofree(l);
    l = from_archive(&am);
    t = st_find(&am, P_ "layers.1.mlp.experts.0.down_proj.weight");
    n = P_ "layers.1.mlp.experts.16.down_proj.weight";
    oadd(l, n, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    expect_fail(l, "expert index >= E", n, ">=");
    ofree(l);

    /* NaN e8m0 scale byte */
    l = from_archive(&am);
    n = P_ "layers.2.mlp.experts.7.down_proj.weight_scale";
    o = ofind(l, n);
    o->owned = malloc(o->nbytes);
    memcpy(o->owned, o->data, o->nbytes);
    o->owned[5] = 0xFF;
    expect_fail(l, "NaN scale", n, "NaN");
    ofree(l);

    /* BF16 per-expert weights with a scale */
    l = from_archive(&ab);
    odrop(l, P_ "layers.1.mlp.experts.gate_up_proj");
    odrop(l, P_ "layers.1.mlp.experts.down_proj");
    const st_tensor *cgu = st_find(&ab, P_ "layers.1.mlp.experts.gate_up_proj");
    const st_tensor *cdn = st_find(&ab, P_ "layers.1.mlp.experts.down_proj");
    int64_t s2[2] = {I2, Hm}, sd[2] = {Hm, c->I};
    for (int ex = 0; ex < c->E; ex++) {
        char b1[200], b2[200];
        snprintf(b1, sizeof b1, P_ "layers.1.mlp.experts.%d.gate_up_proj.weight", ex);
        snprintf(b2, sizeof b2, P_ "layers.1.mlp.experts.%d.down_proj.weight", ex);
        oadd(l, b1, ST_BF16, 2, s2, (const uint8_t *)cgu->data + ex * I2 * Hm * 2, (size_t)(I2 * Hm * 2));
        oadd(l, b2, ST_BF16, 2, sd, (const uint8_t *)cdn->data + ex * Hm * c->I * 2, (size_t)(Hm * c->I * 2));
    }
    int64_t sc1[1] = {I2};
    n = P_ "layers.1.mlp.experts.9.gate_up_proj.weight_scale";
    static float scales[4096];
    oadd(l, n, ST_F32, 1, sc1, scales, (size_t)I2 * 4);
    expect_fail(l, "bf16 with scale", n, "scale");
    ofree(l);

    /* a truncated shard: the reader's error names the file */
    char d[4200], p[4400];
    path_in(d, "truncated");
    l = from_archive(&ab);
    if (owrite(l, d, &cfg, NULL) == 0) {
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        CHECK(truncate(p, fsize(p) - 1000) == 0, "truncate");
        sm_model m;
        CHECK(sm_model_load(d, NULL, &m, &e) == -1 && strstr(e.msg, "model.safetensors"), "truncated: '%s'", e.msg);
    }
    ofree(l);
    st_close(&ab);
    st_close(&am);
    st_close(&af);
}

/* ---- accepted variants: F4 / F8_E8M0 dtypes, per-expert BF16, misaligned views ---- */
static void test_variants(void) {
    st_archive ab = {0}, am = {0};
    sm_err e = {{0}};
    if (st_open_dir(d_bf16, &ab, &e) || st_open_dir(d_mx, &am, &e)) { CHECK(0, "open: %s", e.msg); return; }
    const sm_config *c = &cfg;
    int64_t I2 = 2 * (int64_t)c->I, Hm = c->Hm;
    char d[4200];
    sm_model ref, m;
    /* F4 weights (shape in elements) and F8_E8M0 scales in layer 1 */
    olist *l = from_archive(&am);
    for (int i = 0; i < l->n; i++) {
        otensor *o = &l->t[i];
        if (strncmp(o->name, P_ "layers.1.mlp.experts.", strlen(P_ "layers.1.mlp.experts.")) || o->ndim != 2) continue;
        if (strstr(o->name, "weight_scale")) o->dt = ST_F8_E8M0;
        else { o->dt = ST_F4; o->shape[1] *= 2; }
    }
    path_in(d, "f4");
    if (owrite(l, d, c, NULL) == 0 && load(d, 0, 0, &m) == 0) {
        if (load(d_mx, 0, 0, &ref) == 0) {
            CHECK(m.layers[1].ex.fmt == SM_EXP_MXFP4, "F4 layer format");
            CHECK(same_model(&m, &ref), "F4 / F8_E8M0 model differs from the U8 one");
            sm_model_free(&ref);
        }
        sm_model_free(&m);
    } else CHECK(0, "F4 model did not load");
    ofree(l);
    /* per-expert BF16 in layer 2 */
    l = from_archive(&ab);
    const st_tensor *cgu = st_find(&ab, P_ "layers.2.mlp.experts.gate_up_proj"), *cdn = st_find(&ab, P_ "layers.2.mlp.experts.down_proj");
    odrop(l, cgu->name);
    odrop(l, cdn->name);
    int64_t s2[2] = {I2, Hm}, sd[2] = {Hm, c->I};
    for (int ex = 0; ex < c->E; ex++) {
        char b1[200], b2[200];
        snprintf(b1, sizeof b1, P_ "layers.2.mlp.experts.%d.gate_up_proj.weight", ex);
        snprintf(b2, sizeof b2, P_ "layers.2.mlp.experts.%d.down_proj.weight", ex);
        oadd(l, b1, ST_BF16, 2, s2, (const uint8_t *)cgu->data + ex * I2 * Hm * 2, (size_t)(I2 * Hm * 2));
        oadd(l, b2, ST_BF16, 2, sd, (const uint8_t *)cdn->data + ex * Hm * c->I * 2, (size_t)(Hm * c->I * 2));
    }
    path_in(d, "perexpert_bf16");
    if (owrite(l, d, c, NULL) == 0 && load(d, 0, 0, &m) == 0) {
        if (load(d_bf16, 0, 0, &ref) == 0) {
            CHECK(m.layers[2].ex.fmt == SM_EXP_BF16, "per-expert BF16 format");
            CHECK(same_model(&m, &ref), "per-expert BF16 model differs from the consolidated one");
            sm_model_free(&ref);
        }
        sm_model_free(&m);
    } else CHECK(0, "per-expert BF16 model did not load");
    ofree(l);
    st_close(&ab);
    st_close(&am);
    /* misaligned f32 views: H odd puts every f32 tensor after a [H] bf16 one at 2 mod 4 */
    sm_config co = cfg;
    co.H = 255;
    char da[4200];
    path_in(da, "odd_aligned");
    path_in(d, "odd_misaligned");
    if (make(da, &co, SM_EXP_BF16, 3, 1, 0)) { CHECK(0, "make H=255"); return; }
    st_archive ao = {0};
    if (st_open_dir(da, &ao, &e)) { CHECK(0, "%s", e.msg); return; }
    l = from_archive(&ao);
    if (owrite(l, d, &co, P_ "norm.weight") == 0 && load(d, 0, 0, &m) == 0) {
        int mis = 0;
        for (int i = 0; i < m.ar.ntensors; i++) {
            const st_tensor *t = &m.ar.tensors[i];
            mis += (t->dtype == ST_F32 && ((uintptr_t)t->data & 3)) || (t->dtype == ST_BF16 && ((uintptr_t)t->data & 1));
        }
        CHECK(mis > 0, "test premise: no misaligned tensor in the reordered file");
        int al = 1;
        for (int ly = 0; ly < co.L; ly++)
            al &= ((uintptr_t)m.layers[ly].router & 3) == 0 && ((uintptr_t)m.layers[ly].router_bias & 3) == 0;
        CHECK(al, "misaligned f32 views were not copied to aligned buffers");
        if (load(da, 0, 0, &ref) == 0) {
            CHECK(same_model(&m, &ref), "reordered (misaligned) model differs");
            sm_model_free(&ref);
        }
        sm_model_free(&m);
    } else CHECK(0, "misaligned model did not load");
    ofree(l);
    st_close(&ao);
}

int main(void) {
    if (wfix_setup("sm_test_weights_broken", 0)) return 1;
    RUN(test_broken);
    RUN(test_broken_values);
    RUN(test_variants);
    tm_rmtree(base);
    return TEST_DONE();
}
