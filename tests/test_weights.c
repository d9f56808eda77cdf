/* test_weights.c: make-model + the checkpoint loader (src/testing/makemodel.c, src/model/weights.c,
 * src/engine/check.c).  Tiny models of one seed in the three expert formats are made into a temp
 * directory and loaded: shapes and formats, quantized expert rows against the BF16 model,
 * online MXFP4 against the MXFP4 file bit for bit, shards against one file, precomputed
 * vectors against their formulas, determinism.  Broken checkpoints and accepted variants:
 * test_weights_broken.c. */
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

#define P_ "model.language_model."

#include "wfixture.h"

/* 1 if the two files have identical bytes. */
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    char ba[65536], bb[65536];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        if (na != nb || memcmp(ba, bb, na)) same = 0;
        if (na == 0) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static double relerr(const float *x, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num) / sqrt(den); /* NaN in x propagates and fails every "<" check */
}

/* ---- shapes, formats ---- */
static void test_shapes_and_formats(void) {
    const char *dirs[3] = {d_bf16, d_mx, d_fp8};
    sm_expert_fmt mid[3] = {SM_EXP_BF16, SM_EXP_MXFP4, SM_EXP_FP8};
    for (int k = 0; k < 3; k++) {
        sm_model m;
        if (load(dirs[k], 0, 0, &m)) { CHECK(0, "load %s", dirs[k]); continue; }
        const sm_config *c = &m.cfg;
        CHECK(c->L == cfg.L && c->H == cfg.H && c->E == cfg.E && c->V == cfg.V && c->Hm == cfg.Hm && c->I == cfg.I,
              "config of %s differs from the preset", dirs[k]);
        for (int l = 0; l < c->L; l++) {
            sm_expert_fmt want = sm_layer_keeps_bf16(c, l) ? SM_EXP_BF16 : mid[k];
            CHECK(m.layers[l].ex.fmt == want, "%s layer %d: format %s, want %s", dirs[k], l,
                  sm_expert_fmt_name(m.layers[l].ex.fmt), sm_expert_fmt_name(want));
            CHECK(m.layers[l].full == c->full[l], "layer %d kind", l);
            CHECK(((uintptr_t)m.layers[l].router & 3) == 0 && ((uintptr_t)m.layers[l].wq & 1) == 0, "alignment");
        }
        const st_tensor *t = st_find(&m.ar, P_ "layers.1.mlp.experts.3.gate_up_proj.weight");
        if (k == 1) CHECK(t && t->dtype == ST_U8 && t->shape[0] == 2 * c->I && t->shape[1] == c->Hm / 2, "mxfp4 shape");
        if (k == 2) CHECK(t && t->dtype == ST_F8_E4M3 && t->shape[0] == 2 * c->I && t->shape[1] == c->Hm, "fp8 shape");
        if (k == 0) CHECK(!t && st_find(&m.ar, P_ "layers.1.mlp.experts.gate_up_proj"), "bf16 consolidated");
        /* byte accounting of check.c equals the stored tensor bytes */
        sm_bytes b;
        sm_model_bytes(&m, &b);
        int64_t sum = 0;
        for (int i = 0; i < m.ar.ntensors; i++) sum += (int64_t)m.ar.tensors[i].nbytes;
        CHECK(b.total == sum, "%s: sm_model_bytes total %lld != stored %lld", dirs[k], (long long)b.total, (long long)sum);
        CHECK(sm_rank_bytes(&m, 1) == b.total, "W=1 bytes");
        CHECK(sm_rank_bytes(&m, 2) > 0 && sm_rank_bytes(&m, 2) < b.total, "W=2 bytes");
        sm_model_free(&m);
    }
}

/* ---- which layers keep BF16 experts: 0 and L-1 (docs/model.md section 2) ---- */
static void test_keeps_bf16_rule(void) {
    static const int want4[4] = {1, 0, 0, 1}, want2[2] = {1, 1};
    sm_config c = cfg;
    c.L = 4;
    for (int l = 0; l < 4; l++) CHECK(sm_layer_keeps_bf16(&c, l) == want4[l], "L = 4, layer %d", l);
    c.L = 2;
    for (int l = 0; l < 2; l++) CHECK(sm_layer_keeps_bf16(&c, l) == want2[l], "L = 2, layer %d", l);
    c.L = 1;
    CHECK(sm_layer_keeps_bf16(&c, 0) == 1, "L = 1, layer 0");
}

/* ---- quantized rows vs the BF16 model of the same seed ---- */
static void compare_rows(const char *qdir, double bound) {
    sm_model a, q;
    if (load(d_bf16, 0, 0, &a)) { CHECK(0, "load bf16"); return; }
    if (load(qdir, 0, 0, &q)) { CHECK(0, "load %s", qdir); sm_model_free(&a); return; }
    const sm_config *c = &a.cfg;
    int64_t cap = 2 * (int64_t)c->I * c->Hm;
    float *x = malloc(sizeof(float) * cap), *r = malloc(sizeof(float) * cap);
    double worst = 0;
    for (int l = 0; l < c->L; l++)
        for (int ex = 0; ex < c->E; ex++)
            for (int w = 0; w < 2; w++) {
                int rows = w ? c->Hm : 2 * c->I, cols = w ? c->I : c->Hm;
                for (int row = 0; row < rows; row++) {
                    sm_expert_row(&a, l, ex, w, row, r + (int64_t)row * cols);
                    sm_expert_row(&q, l, ex, w, row, x + (int64_t)row * cols);
                }
                double re = relerr(x, r, (int64_t)rows * cols);
                if (sm_layer_keeps_bf16(c, l)) {
                    CHECK(re == 0, "%s layer %d expert %d: BF16 layer differs (rel %g)", qdir, l, ex, re);
                } else {
                    CHECK(re < bound && re > 0, "%s layer %d expert %d matrix %d: rel err %g (bound %g)", qdir, l, ex, w,
                          re, bound);
                    if (re > worst) worst = re;
                }
            }
    printf("  %s: worst per-matrix rel err %.4f\n", qdir, worst);
    /* dense tensors are the same streams in every format */
    CHECK(!memcmp(a.embed, q.embed, (size_t)c->V * c->H * 2), "embedding differs across formats");
    CHECK(!memcmp(a.layers[1].router, q.layers[1].router, (size_t)c->E * c->H * 4), "router differs across formats");
    free(x);
    free(r);
    sm_model_free(&a);
    sm_model_free(&q);
}
static void test_mxfp4_rows(void) { compare_rows(d_mx, 0.15); }
static void test_fp8_rows(void) { compare_rows(d_fp8, 0.05); }

/* ---- online MXFP4 == MXFP4 checkpoint, for any thread count ---- */
static void test_online_mxfp4(void) {
    sm_model q, o1, o3;
    if (load(d_mx, 0, 0, &q)) { CHECK(0, "load"); return; }
    if (load(d_bf16, 1, 1, &o1) || load(d_bf16, 1, 3, &o3)) { CHECK(0, "load online"); sm_model_free(&q); return; }
    const sm_config *c = &q.cfg;
    size_t gq = (size_t)2 * c->I * c->Hm / 2, gs = (size_t)2 * c->I * c->Hm / 32;
    size_t dq = (size_t)c->Hm * c->I / 2, ds = (size_t)c->Hm * c->I / 32;
    int bad = 0;
    for (int l = 0; l < c->L; l++) {
        CHECK(o1.layers[l].ex.fmt == q.layers[l].ex.fmt, "layer %d: online format %s", l,
              sm_expert_fmt_name(o1.layers[l].ex.fmt));
        if (q.layers[l].ex.fmt != SM_EXP_MXFP4) continue;
        for (int ex = 0; ex < c->E; ex++) {
            const sm_experts *A = &q.layers[l].ex, *B = &o1.layers[l].ex, *C = &o3.layers[l].ex;
            bad += memcmp(A->gu[ex], B->gu[ex], gq) != 0 || memcmp(A->gus[ex], B->gus[ex], gs) != 0 ||
                   memcmp(A->dn[ex], B->dn[ex], dq) != 0 || memcmp(A->dns[ex], B->dns[ex], ds) != 0;
            bad += memcmp(C->gu[ex], B->gu[ex], gq) != 0 || memcmp(C->gus[ex], B->gus[ex], gs) != 0 ||
                   memcmp(C->dn[ex], B->dn[ex], dq) != 0 || memcmp(C->dns[ex], B->dns[ex], ds) != 0;
        }
    }
    CHECK(bad == 0, "%d expert matrices differ between online MXFP4 (1 / 3 threads) and the MXFP4 file", bad);
    sm_model_free(&q);
    sm_model_free(&o1);
    sm_model_free(&o3);
}

/* ---- shards ---- */
static void test_shards(void) {
    sm_model a, b;
    if (load(d_bf16, 0, 0, &a)) { CHECK(0, "load"); return; }
    if (load(d_sh, 0, 0, &b)) { CHECK(0, "load shards"); sm_model_free(&a); return; }
    CHECK(b.ar.nfiles == 3, "sharded model has %d files", b.ar.nfiles);
    char p[4400];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d_sh);
    CHECK(fsize(p) > 0, "no index.json");
    snprintf(p, sizeof p, "%s/model.safetensors", d_sh);
    CHECK(fsize(p) < 0, "sharded dir also has model.safetensors");
    CHECK(same_model(&a, &b), "sharded load differs from the single file");
    sm_model_free(&a);
    sm_model_free(&b);
}

/* ---- eff, final norm, alpha / beta ---- */
static uint16_t bf16_at(const st_tensor *t, int64_t i) {
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
    return h;
}

static void test_precomputed(void) {
    sm_model m;
    if (load(d_bf16, 0, 0, &m)) { CHECK(0, "load"); return; }
    const sm_config *c = &m.cfg;
    char nm[256];
    int bad_eff = 0, bad_gate = 0, bad_final = 0;
    double maxd = 0;
    for (int l = 0; l < c->L; l++) {
        const sm_layer *L = &m.layers[l];
        struct { const char *s; const float *w; int n; } effs[5] = {
            {"input_layernorm.weight", L->in_norm, c->H},
            {"pre_feedforward_layernorm.weight", L->pre_ffn_norm, c->H},
            {"post_feedforward_layernorm.weight", L->post_ffn_norm, c->H},
            {"mlp.pre_expert_norm.weight", L->pre_expert_norm, c->Hm},
            {"mlp.experts.post_expert_norm.weight", L->post_expert_norm, c->Hm}};
        for (int k = 0; k < 5; k++) {
            snprintf(nm, sizeof nm, P_ "layers.%d.%s", l, effs[k].s);
            const st_tensor *t = st_find(&m.ar, nm);
            if (!t) { CHECK(0, "no %s", nm); continue; }
            for (int i = 0; i < effs[k].n; i++) {
                float g = sm_bf16_to_f32(bf16_at(t, i));
                bad_eff += effs[k].w[i] != sm_r16(1.0f + g); /* eff(g) = r16(1 + g) */
            }
        }
        struct { const char *s; const float *al, *be; } gates[2] = {
            {"post_attention_residual_gate.gate", L->att_alpha, L->att_beta},
            {"post_feedforward_residual_gate.gate", L->ffn_alpha, L->ffn_beta}};
        for (int k = 0; k < 2; k++) {
            snprintf(nm, sizeof nm, P_ "layers.%d.%s", l, gates[k].s);
            const st_tensor *t = st_find(&m.ar, nm);
            if (!t) { CHECK(0, "no %s", nm); continue; }
            for (int i = 0; i < c->H; i++) {
                double u = sm_bf16_to_f32(bf16_at(t, i)) / (double)c->gate_temp;
                double be = 1 / (1 + exp(-u)), al = sqrt(fmax((1 / (1 + exp(u))) * (1 + be), 1e-3));
                double d = fmax(fabs(al - gates[k].al[i]), fabs(be - gates[k].be[i]));
                if (d > maxd) maxd = d;
                bad_gate += !(d < 2e-6);
                /* norm preserving: alpha^2 + beta^2 = 1 unless clamped */
                if (al * al > 2e-3) bad_gate += !(fabs((double)gates[k].al[i] * gates[k].al[i] +
                                                       (double)gates[k].be[i] * gates[k].be[i] - 1) < 1e-5);
            }
        }
    }
    const st_tensor *fn = st_find(&m.ar, P_ "norm.weight");
    for (int i = 0; fn && i < c->H; i++) bad_final += m.final_norm[i] != sm_bf16_to_f32(bf16_at(fn, i));
    double mean = 0;
    for (int i = 0; i < c->H; i++) mean += m.final_norm[i] / c->H;
    CHECK(bad_eff == 0, "%d eff values differ from r16(1 + g)", bad_eff);
    CHECK(bad_gate == 0, "%d alpha/beta values off (max diff %g)", bad_gate, maxd);
    CHECK(fn && bad_final == 0, "%d final norm values differ", bad_final);
    CHECK(fabs(mean - 1) < 0.01, "final norm gain mean %g, want ~1 (used as is)", mean);
    sm_model_free(&m);
    /* the clamp: a large gate logit gives alpha = sqrt(1e-3) */
    uint16_t g[3] = {sm_f32_to_bf16(30.0f), sm_f32_to_bf16(0.0f), sm_f32_to_bf16(-30.0f)};
    float al[3], be[3];
    sm_residual_gate(g, 3, 0.3f, al, be);
    CHECK(fabsf(al[0] - sqrtf(1e-3f)) < 1e-7f && be[0] > 0.999f, "clamp: alpha %g beta %g", al[0], be[0]);
    CHECK(fabsf(al[1] - sqrtf(0.75f)) < 1e-6f && be[1] == 0.5f, "u=0: alpha %g beta %g", al[1], be[1]);
    CHECK(fabsf(al[2] - 1.0f) < 1e-6f && be[2] < 1e-6f, "u<<0: alpha %g beta %g", al[2], be[2]);
}

/* ---- the tensor table (tensors.h) against the files, the loaded fields and a rank's parts ---- */
static void test_tensor_table(void) {
    sm_model m;
    if (load(d_mx, 0, 0, &m)) { CHECK(0, "load"); return; }
    const sm_config *c = &m.cfg;
    char nm[256];
    int64_t sh[3];
    /* every row names a stored tensor of its dtype and shape (consolidated experts: BF16 layers) */
    int nfound = 0;
    for (int l = -1; l < c->L; l++)
        for (int r = l < 0 ? SM_T_NLAYER : 0; r < (l < 0 ? SM_T_N : SM_T_NLAYER); r++) {
            sm_tensor_name(nm, sizeof nm, (sm_tensor_role)r, l);
            const st_tensor *t = st_find(&m.ar, nm);
            if (sm_tensors[r].kind == SM_TK_EXPERTS && !sm_layer_keeps_bf16(c, l)) {
                CHECK(!t, "%s: consolidated experts in an MXFP4 layer", nm);
                continue;
            }
            if (!t) { CHECK(0, "%s: not in the checkpoint", nm); continue; }
            nfound++;
            int nd = sm_tensor_shape(c, (sm_tensor_role)r, sh);
            int same = t->dtype == sm_tensors[r].dtype && t->ndim == nd;
            for (int i = 0; same && i < nd; i++) same = t->shape[i] == sh[i];
            CHECK(same, "%s: dtype or shape differs from the table", nm);
            CHECK((int64_t)t->nbytes == sm_tensor_bytes(c, (sm_tensor_role)r), "%s: bytes", nm);
        }
    /* the rest are the per-expert tensors: 4 a expert of every MXFP4 layer */
    CHECK(nfound + 4 * c->E * (c->L - 2) == m.ar.ntensors, "%d table tensors + per-expert ones != %d stored", nfound,
          m.ar.ntensors);
    /* role -> loaded field (an independent list of the fields of weights.h) */
    for (int l = 0; l < c->L; l++) {
        const sm_layer *L = &m.layers[l];
        const void *want[SM_T_NLAYER][2] = {
            [SM_T_IN_NORM] = {L->in_norm}, [SM_T_WQ] = {L->wq}, [SM_T_WK] = {L->wk}, [SM_T_WV] = {L->wv},
            [SM_T_WG] = {L->wg}, [SM_T_WO] = {L->wo}, [SM_T_ATT_GATE] = {L->att_alpha, L->att_beta},
            [SM_T_PRE_FFN_NORM] = {L->pre_ffn_norm}, [SM_T_POST_FFN_NORM] = {L->post_ffn_norm},
            [SM_T_FFN_GATE] = {L->ffn_alpha, L->ffn_beta}, [SM_T_ROUTER] = {L->router},
            [SM_T_ROUTER_BIAS] = {L->router_bias}, [SM_T_POOLER] = {L->pooler},
            [SM_T_PRE_EXPERT_NORM] = {L->pre_expert_norm}, [SM_T_POST_EXPERT_NORM] = {L->post_expert_norm},
            [SM_T_UNPOOLER] = {L->unpooler}};
        for (int r = 0; r < SM_T_NLAYER; r++) {
            int nvec, eb;
            sm_tensor_loaded((sm_tensor_role)r, &nvec, &eb);
            CHECK(nvec == (r == SM_T_ATT_GATE || r == SM_T_FFN_GATE ? 2 : sm_tensors[r].kind == SM_TK_EXPERTS ? 0 : 1),
                  "role %d: %d vectors", r, nvec);
            for (int k = 0; k < nvec; k++)
                CHECK(want[r][k] && sm_model_tensor(&m, l, (sm_tensor_role)r, k) == want[r][k], "layer %d role %d vector %d",
                      l, r, k);
        }
        CHECK(!sm_model_tensor(&m, l, SM_T_EXPERTS_GU, 0), "consolidated experts have no loaded field");
    }
    CHECK(sm_model_tensor(&m, -1, SM_T_EMBED, 0) == m.embed && sm_model_tensor(&m, -1, SM_T_FINAL_NORM, 0) == m.final_norm &&
          sm_model_tensor(&m, -1, SM_T_LM_HEAD, 0) == m.lm_head, "model-level fields");
    /* rank 1 of 2: the parts by the split rules, against explicit arithmetic */
    sm_shard s;
    sm_err e = {{0}};
    if (sm_shard_make(&m, 2, 1, SM_MOE_EP, &s, &e)) { CHECK(0, "shard: %s", e.msg); sm_model_free(&m); return; }
    const sm_layer *L = &m.layers[1];
    int64_t H = c->H, QD = (int64_t)c->nH * c->D, hq = QD / 2, hk = (int64_t)c->nKV * c->D / 2;
    sm_shard_part p = sm_shard_tensor(&s, 1, SM_T_WQ, 0);
    CHECK(p.host == L->wq + hq * H && p.rows == hq && p.row_bytes == 2 * H && p.pitch == 2 * H, "q part");
    p = sm_shard_tensor(&s, 1, SM_T_WV, 0);
    CHECK(p.host == L->wv + hk * H && p.rows == hk, "v part");
    p = sm_shard_tensor(&s, 1, SM_T_WO, 0);
    CHECK(p.host == L->wo + hq && p.rows == H && p.row_bytes == 2 * hq && p.pitch == 2 * QD, "o_proj part");
    p = sm_shard_tensor(&s, 1, SM_T_UNPOOLER, 0);
    CHECK(p.host == L->unpooler + H / 2 * c->Hm && p.rows == H / 2 && p.row_bytes == 2 * c->Hm, "unpooler part");
    p = sm_shard_tensor(&s, 1, SM_T_FFN_GATE, 1);
    CHECK(p.host == L->ffn_beta && p.rows == 1 && p.row_bytes == 4 * H, "gate beta replicated");
    p = sm_shard_tensor(&s, 1, SM_T_ROUTER, 0);
    CHECK(p.host == L->router && p.rows == c->E && p.row_bytes == 4 * H, "router replicated");
    p = sm_shard_tensor(&s, -1, SM_T_EMBED, 0);
    CHECK(p.host == m.embed + (int64_t)c->V / 2 * H && p.rows == c->V / 2, "embedding part");
    CHECK(s.layers[1].wo == L->wo + hq && s.layers[1].ld_wo == QD, "shard view of o_proj");
    sm_shard_free(&s);
    sm_model_free(&m);
}

/* ---- value magnitudes (makemodel.h) ---- */
static double rms_t(const st_tensor *t) {
    double s = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        double v = t->dtype == ST_F32 ? ((const float *)t->data)[i] : sm_bf16_to_f32(bf16_at(t, i));
        s += v * v;
    }
    return sqrt(s / (double)t->numel);
}
static void test_magnitudes(void) {
    sm_model m;
    if (load(d_bf16, 0, 0, &m)) { CHECK(0, "load"); return; }
    const sm_config *c = &m.cfg;
    struct { const char *n; double want; } w[] = {
        {P_ "embed_tokens.weight", 1.0},
        {"lm_head.weight", 1 / sqrt(c->H)},
        {P_ "layers.1.self_attn.q_proj.weight", 1 / sqrt(c->H)},
        {P_ "layers.1.self_attn.o_proj.weight", 1 / sqrt(c->nH * c->D)},
        {P_ "layers.1.mlp.gate.weight", 1 / sqrt(c->H)},
        {P_ "layers.1.mlp.gate.e_score_correction_bias", 0.01},
        {P_ "layers.1.post_attention_residual_gate.gate", 0.5},
        {P_ "layers.1.input_layernorm.weight", 0.02},
        {P_ "layers.1.mlp.experts.gate_up_proj", 1 / sqrt(c->Hm)},
        {P_ "layers.1.mlp.experts.down_proj", 1 / sqrt(c->I)},
        {P_ "layers.1.mlp.post_expert_proj.weight", 1 / sqrt(c->Hm)},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        const st_tensor *t = st_find(&m.ar, w[i].n);
        if (!t) { CHECK(0, "no %s", w[i].n); continue; }
        double r = rms_t(t), tol = t->numel < 100 ? 0.5 : 0.1;
        CHECK(fabs(r / w[i].want - 1) < tol, "%s: rms %g, want ~%g", w[i].n, r, w[i].want);
    }
    /* the normals themselves: mean ~0, variance ~1, a few 4-sigma values but no 7-sigma */
    const st_tensor *t = st_find(&m.ar, P_ "embed_tokens.weight");
    double s1 = 0, s2 = 0, mx = 0;
    int64_t n4 = 0;
    for (int64_t i = 0; t && i < t->numel; i++) {
        double v = sm_bf16_to_f32(bf16_at(t, i));
        s1 += v;
        s2 += v * v;
        if (fabs(v) > mx) mx = fabs(v);
        n4 += fabs(v) > 4;
    }
    double mean = s1 / (double)t->numel, var = s2 / (double)t->numel - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1) < 0.02 && mx < 7 && n4 > 0 && n4 < 30, "normals: mean %g var %g max %g n4 %lld",
          mean, var, mx, (long long)n4);
    sm_model_free(&m);
}

/* ---- determinism ---- */
static void test_determinism(void) {
    char a[4200], b[4200], d[4200], pa[4400], pb[4400];
    path_in(a, "det_a");
    path_in(b, "det_b");
    path_in(d, "det_seed8");
    if (make(a, &cfg, SM_EXP_MXFP4, 7, 1, 2) || make(b, &cfg, SM_EXP_MXFP4, 7, 1, 5) ||
        make(d, &cfg, SM_EXP_MXFP4, 8, 1, 0)) {
        CHECK(0, "make-model failed");
        return;
    }
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    CHECK(same_file(pa, pb), "same seed, 2 vs 5 threads: files differ");
    snprintf(pb, sizeof pb, "%s/model.safetensors", d_mx);
    CHECK(same_file(pa, pb), "same seed, default threads: files differ");
    snprintf(pb, sizeof pb, "%s/model.safetensors", d);
    CHECK(!same_file(pa, pb) && fsize(pa) == fsize(pb), "different seed: files identical (or sizes differ)");
    snprintf(pa, sizeof pa, "%s/config.json", a);
    snprintf(pb, sizeof pb, "%s/config.json", d);
    CHECK(same_file(pa, pb), "config.json differs between seeds");
}

/* ---- output directory handling ---- */
static void test_outdir(void) {
    char d[4200], f[4400];
    path_in(d, "nonempty");
    mkdir(d, 0755);
    snprintf(f, sizeof f, "%s/keep", d);
    FILE *fp = fopen(f, "w");
    if (fp) fclose(fp);
    sm_make_opts o = {.experts = SM_EXP_BF16, .seed = 1, .shards = 1};
    sm_err e = {{0}};
    CHECK(sm_make_model(&cfg, &o, d, &e) == -1 && strstr(e.msg, "not an empty directory"), "non-empty out: '%s'", e.msg);
    CHECK(fsize(f) == 0, "existing file touched");
    path_in(d, "emptydir");
    mkdir(d, 0755);
    CHECK(make(d, &cfg, SM_EXP_BF16, 1, 1, 0) == 0, "empty existing out dir refused");
    snprintf(f, sizeof f, "%s/model.safetensors", d);
    CHECK(fsize(f) > 0, "no model written into the empty dir");
    o.shards = 100000;
    path_in(d, "toomanyshards");
    CHECK(sm_make_model(&cfg, &o, d, &e) == -1 && strstr(e.msg, "shards"), "shards > tensors: '%s'", e.msg);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", d, (long)getpid());
    struct stat st;
    CHECK(stat(d, &st) != 0 && stat(tmp, &st) != 0, "failed make-model left a directory behind");
}

int main(void) {
    if (wfix_setup("sm_test_weights", 1)) return 1;
    RUN(test_keeps_bf16_rule);
    RUN(test_shapes_and_formats);
    RUN(test_mxfp4_rows);
    RUN(test_fp8_rows);
    RUN(test_online_mxfp4);
    RUN(test_shards);
    RUN(test_precomputed);
    RUN(test_tensor_table);
    RUN(test_magnitudes);
    RUN(test_determinism);
    RUN(test_outdir);
    tm_rmtree(base);
    return TEST_DONE();
}
