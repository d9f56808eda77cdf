/* tmodel.h: the temp-directory and test-model plumbing of the CPU tests, once.  A test model
 * is a random checkpoint written by sm_make_model (experts in one format, one shard) into
 * <tmp>/model of a fresh mkdtemp directory under $TMPDIR (else /tmp), then loaded; freeing it
 * frees the model and removes the whole directory.  Header-only (static inline), like check.h:
 * each test is its own program, so a shared object would only add a Makefile rule.  We
 * rejected a checked-in model file: make-model regenerates one from a seed in milliseconds.
 * Also the relative error the tests compare model outputs with.  Failures are CHECKs (so the
 * running test fails) and the helpers return 0 / -1. */
#ifndef SM_TEST_TMODEL_H
#define SM_TEST_TMODEL_H
#include "check.h"
#include "model/config.h"
#include "testing/makemodel.h"
#include "model/weights.h"
#include "sparkmono.h"
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* nftw callback: remove one entry (depth first, so directories are empty by then). */
static inline int tm_rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb; (void)flag; (void)f;
    return remove(p);
}

/* Remove the tree at dir (links not followed); an empty name is a no-op. */
static inline int tm_rmtree(const char *dir) {
    if (!dir || !dir[0]) return 0;
    return nftw(dir, tm_rm_entry, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0;
}

/* Make a fresh directory "$TMPDIR/<prefix>_XXXXXX" (else under /tmp) into out[n].  On failure
 * out keeps the template (for the caller's message) and the result is -1. */
static inline int tm_mkdtemp(char *out, size_t n, const char *prefix) {
    const char *td = getenv("TMPDIR");
    int k = snprintf(out, n, "%s/%s_XXXXXX", td && *td ? td : "/tmp", prefix);
    if (k < 0 || (size_t)k >= n) return -1;
    return mkdtemp(out) ? 0 : -1;
}

/* make-model's tiny preset into dir: experts in fmt, seed, one shard, cycle (sm_make_opts.cycle:
 * 0 random, else the period of the cycle its logits follow).  0, or -1 with the reason in e. */
static inline int tm_make_tiny(const char *dir, sm_expert_fmt fmt, uint64_t seed, int cycle, sm_err *e) {
    sm_config c;
    sm_make_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.experts = fmt;
    mo.seed = seed;
    mo.shards = 1;
    mo.cycle = cycle;
    return sm_config_preset("tiny", &c, e) || sm_make_model(&c, &mo, dir, e) ? -1 : 0;
}

/* The two tiny models of the engine-level tests (sampling, logit processors), made in a fresh
 * temp directory tmp [n] named after prefix and opened: *cyc a cycle model (period 16: drafts
 * are accepted), *rnd a random one; both MXFP4, seed 1.  *V, *vu: their vocabulary size and
 * vocab_used.  0, or -1 after one "FAIL setup" line (the directory removed). */
static inline int tm_open_tiny_pair(char *tmp, size_t n, const char *prefix, sparkmono_model **cyc, sparkmono_model **rnd,
                                    int *V, int *vu) {
    if (tm_mkdtemp(tmp, n, prefix)) {
        printf("FAIL setup: mkdtemp\n");
        return -1;
    }
    char dc[600], dr[600];
    snprintf(dc, sizeof dc, "%s/cycle", tmp);
    snprintf(dr, sizeof dr, "%s/random", tmp);
    sm_err e = {{0}};
    int ok = tm_make_tiny(dc, SM_EXP_MXFP4, 1, 16, &e) == 0 && tm_make_tiny(dr, SM_EXP_MXFP4, 1, 0, &e) == 0;
    if (!ok || sparkmono_model_open(dc, NULL, cyc) || sparkmono_model_open(dr, NULL, rnd)) {
        printf("FAIL setup: %s %s\n", e.msg, sparkmono_errmsg());
        tm_rmtree(tmp);
        return -1;
    }
    sparkmono_model_info info;
    sparkmono_model_get_info(*cyc, &info);
    *V = info.vocab_size;
    *vu = info.vocab_used;
    return 0;
}

typedef struct tmodel {
    char tmp[512];  /* the mkdtemp directory holding model/; "" when none was made */
    char dir[600];  /* the checkpoint directory, tmp/model */
    sm_model m;     /* the loaded model, valid when ok */
    int ok;         /* 1 once m is loaded */
} tmodel;

/* Write a random checkpoint of cfg (experts in fmt, seed, one shard) into a fresh temp
 * directory named after prefix and load it (online MXFP4 at load as given).  t is always
 * initialized, so tmodel_free(t) is right after a failure too. */
static inline int tmodel_make(tmodel *t, const char *prefix, const sm_config *cfg, sm_expert_fmt fmt, uint64_t seed,
                              int online) {
    memset(t, 0, sizeof *t);
    sm_err e = {""};
    if (tm_mkdtemp(t->tmp, sizeof t->tmp, prefix)) { CHECK(0, "mkdtemp %s", t->tmp); t->tmp[0] = 0; return -1; }
    snprintf(t->dir, sizeof t->dir, "%s/model", t->tmp);
    sm_make_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.experts = fmt;
    mo.seed = seed;
    mo.shards = 1;
    if (sm_make_model(cfg, &mo, t->dir, &e)) { CHECK(0, "make_model: %s", e.msg); return -1; }
    sm_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.online_mxfp4 = online;
    if (sm_model_load(t->dir, &lo, &t->m, &e)) { CHECK(0, "load: %s", e.msg); return -1; }
    t->ok = 1;
    return 0;
}

/* ||a - ref|| / ||ref|| over n values (docs/model.md section 10): a NaN in a counts as an infinite
 * difference (so it fails every bound); positions where ref is infinite (masked logits) count
 * only when a differs there. */
static inline double tm_rel_err(const float *a, const float *ref, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && a[i] == ref[i]) continue;
        double x = isnan(a[i]) ? INFINITY : (double)a[i] - ref[i];
        d += x * x;
        s += (double)ref[i] * ref[i];
    }
    return sqrt(d / s);
}

/* Free the model (when loaded) and remove its temp directory. */
static inline void tmodel_free(tmodel *t) {
    if (t->ok) sm_model_free(&t->m);
    t->ok = 0;
    tm_rmtree(t->tmp);
    t->tmp[0] = 0;
}

#endif
