/* wfixture.h: the checkpoints test_weights.c and test_weights_broken.c share: tiny models of one
 * seed in the three expert formats (and BF16 in three shards), made into a temp directory.
 *
 * Static state in a header: each test program is one translation unit.  We rejected one test
 * program for both files: it passed the 800-line bound, and the broken-checkpoint cases are a
 * subject of their own.
 */
#ifndef SM_TEST_WFIXTURE_H
#define SM_TEST_WFIXTURE_H

#include "check.h"
#include "tmodel.h"
#include "model/config.h"
#include "model/weights.h"
#include "testing/makemodel.h"
#include <stdio.h>

static char base[4096];
static char d_bf16[4200], d_mx[4200], d_fp8[4200], d_sh[4200];
static sm_config cfg;

static inline void path_in(char *out, const char *name) { snprintf(out, 4200, "%s/%s", base, name); }

static inline int make(const char *dir, const sm_config *c, sm_expert_fmt f, uint64_t seed, int shards, int threads) {
    sm_make_opts o = {.experts = f, .seed = seed, .shards = shards, .progress = 0, .threads = threads};
    sm_err e = {{0}};
    if (sm_make_model(c, &o, dir, &e)) { printf("  make-model %s: %s\n", dir, e.msg); return -1; }
    return 0;
}

static inline int load(const char *dir, int online, int threads, sm_model *m) {
    sm_load_opts o = {.online_mxfp4 = online, .threads = threads};
    sm_err e = {{0}};
    if (sm_model_load(dir, &o, m, &e)) { printf("  load %s: %s\n", dir, e.msg); return -1; }
    return 0;
}

static inline long fsize(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}


/* 1 if two loaded models hold the same values in every tensor (expert rows decoded to f32). */
static inline int same_model(const sm_model *a, const sm_model *b) {
    const sm_config *c = &a->cfg;
    int64_t H = c->H, Hm = c->Hm, I = c->I, E = c->E, Q = (int64_t)c->nH * c->D, KV = (int64_t)c->nKV * c->D;
    int d = 0;
    d += memcmp(a->embed, b->embed, (size_t)(c->V * H * 2)) != 0;
    d += memcmp(a->lm_head, b->lm_head, (size_t)(c->V * H * 2)) != 0;
    d += memcmp(a->final_norm, b->final_norm, (size_t)H * 4) != 0;
    for (int l = 0; l < c->L; l++) {
        const sm_layer *x = &a->layers[l], *y = &b->layers[l];
        d += memcmp(x->wq, y->wq, (size_t)(Q * H * 2)) || memcmp(x->wg, y->wg, (size_t)(Q * H * 2)) ||
             memcmp(x->wk, y->wk, (size_t)(KV * H * 2)) || memcmp(x->wv, y->wv, (size_t)(KV * H * 2)) ||
             memcmp(x->wo, y->wo, (size_t)(Q * H * 2)) || memcmp(x->router, y->router, (size_t)(E * H * 4)) ||
             memcmp(x->router_bias, y->router_bias, (size_t)E * 4) || memcmp(x->pooler, y->pooler, (size_t)(Hm * H * 2)) ||
             memcmp(x->unpooler, y->unpooler, (size_t)(Hm * H * 2));
        d += memcmp(x->in_norm, y->in_norm, (size_t)H * 4) || memcmp(x->att_alpha, y->att_alpha, (size_t)H * 4) ||
             memcmp(x->att_beta, y->att_beta, (size_t)H * 4) || memcmp(x->pre_ffn_norm, y->pre_ffn_norm, (size_t)H * 4) ||
             memcmp(x->post_ffn_norm, y->post_ffn_norm, (size_t)H * 4) || memcmp(x->ffn_alpha, y->ffn_alpha, (size_t)H * 4) ||
             memcmp(x->ffn_beta, y->ffn_beta, (size_t)H * 4) ||
             memcmp(x->pre_expert_norm, y->pre_expert_norm, (size_t)Hm * 4) ||
             memcmp(x->post_expert_norm, y->post_expert_norm, (size_t)Hm * 4);
        d += x->ex.fmt != y->ex.fmt;
        for (int ex = 0; ex < E && x->ex.fmt == y->ex.fmt; ex++) {
            float ra[4096], rb[4096];
            for (int w = 0; w < 2; w++)
                for (int r = 0; r < (w ? Hm : 2 * I); r++) {
                    sm_expert_row(a, l, ex, w, r, ra);
                    sm_expert_row(b, l, ex, w, r, rb);
                    d += memcmp(ra, rb, sizeof(float) * (size_t)(w ? I : Hm)) != 0;
                }
        }
    }
    return d == 0;
}

/* The checkpoints in a fresh temp directory (prefix names it), shards: also the BF16 one in
 * three files; 0, or -1 after a FAIL line. */
static inline int wfix_setup(const char *prefix, int shards) {
    sm_err e = {{0}};
    if (tm_mkdtemp(base, sizeof base, prefix) || sm_config_preset("tiny", &cfg, &e)) {
        printf("FAIL setup (%s)\n", e.msg);
        return -1;
    }
    path_in(d_bf16, "bf16");
    path_in(d_mx, "mxfp4");
    path_in(d_fp8, "fp8");
    path_in(d_sh, "bf16_shards3");
    if (make(d_bf16, &cfg, SM_EXP_BF16, 7, 1, 0) || make(d_mx, &cfg, SM_EXP_MXFP4, 7, 1, 0) ||
        make(d_fp8, &cfg, SM_EXP_FP8, 7, 1, 0) || (shards && make(d_sh, &cfg, SM_EXP_BF16, 7, 3, 3))) {
        printf("FAIL setup\n");
        tm_rmtree(base);
        return -1;
    }
    return 0;
}

#endif
