/* logits.cu: microbenchmark of the final logits (`gpu_test --bench logits`): h [n, H] (bf16) @
 * lm_head [V, H]^T, softcap, the vocab_used mask and the argmax, at the real widths (H 8192,
 * V 202048) and n = 8 .. 128 rows, through sm_k_logits (what a verify step runs: argmax only,
 * no logits written) and each forced path of sm_k_logits_path.
 *
 * lm_head is 3.3 GB, beyond L2 alone; the case still rotates over 2 copies (and their h) so
 * the tail one call leaves in L2 is not the head the next one reads.  Floor bytes = lm_head + h
 * read; FLOPs 2 n H V (at 128 rows the FLOP floor is about 3/4 of the byte floor).  For
 * sm_k_logits "b2b" is the time per call of two calls back to back.  We rejected writing the
 * f32 logits here: a verify step asks for the argmax only.
 *
 * `--bench logprobs`: the logprob summaries of n rows of f32 logits [n, V] (sm_k_logprobs, top 20:
 * what the rows of a request with logprobs cost on the device), floor = the rows read once;
 * beside it the copy of the same rows to pinned host memory, what taking the rows back costs.
 */
#include <stdio.h>
#include <string.h>
#include "cuda/common.cuh"
#include "bench.h"

typedef struct lg_case {
    int nsets;               /* copies of lm_head and h */
    int n;                   /* rows of the call */
    int path;                /* SM_PATH_*; SM_PATH_AUTO calls sm_k_logits */
    uint16_t *lm;            /* device [nsets][V][H] */
    uint16_t *h;             /* device [nsets][BH_MAX_ROWS][H] */
    int *am;                 /* device [nsets][BH_MAX_ROWS] argmax */
} lg_case;

static int lg_call(bh_run *r, void *arg, int set, sm_err *e) {
    const lg_case *c = (const lg_case *)arg;
    const sm_config *f = &r->cfg;
    const uint16_t *lm = c->lm + (size_t)set * f->V * f->H, *h = c->h + (size_t)set * BH_MAX_ROWS * f->H;
    int *am = c->am + (size_t)set * BH_MAX_ROWS;
    if (c->path == SM_PATH_AUTO)
        return sm_k_logits(&r->kc, h, c->n, f->H, lm, f->V, f->vocab_used, f->out_mult, f->softcap, NULL, am, r->st, e);
    return sm_k_logits_path(&r->kc, c->path, h, c->n, f->H, lm, f->V, f->vocab_used, f->out_mult, f->softcap, NULL, am,
                            r->st, e);
}

static const char *lg_path_name(int p) {
    return p == SM_PATH_SYNC ? "mma.sync" : p == SM_PATH_WG1 ? "wgmma128" : p == SM_PATH_WG2 ? "wgmma256" : "sm_k_logits";
}

static int lg_run(bh_run *r, lg_case *c, sm_err *e) {
    const sm_config *f = &r->cfg;
    const double lbytes = (double)f->V * f->H * 2;
    c->nsets = bh_sets(r, lbytes);
    const size_t S = (size_t)c->nsets;
    SM_CUDA_CHECK(cudaMalloc((void **)&c->lm, S * f->V * f->H * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->h, S * BH_MAX_ROWS * f->H * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->am, S * BH_MAX_ROWS * sizeof(int)));
    /* lm_head N(0, 0.3^2) and h N(0, 1): raw logits of a few tens, so the softcap's tanh works */
    if (bh_normal_bf16(r, c->lm, S * f->V * f->H, "bench.logits.lm_head", 0.0f, 0.3f, e) ||
        bh_normal_bf16(r, c->h, S * BH_MAX_ROWS * f->H, "bench.logits.h", 0.0f, 1.0f, e))
        return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    for (int ri = 0; ri < BH_NROWS; ri++) {
        c->n = r->rows[ri];
        const double bytes = lbytes + (double)c->n * f->H * 2, flops = 2.0 * c->n * f->H * (double)f->V;
        for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
            if (!r->kc.tma_encode && (p == SM_PATH_WG1 || p == SM_PATH_WG2)) continue;
            c->path = p;
            float us = 0, b2b = 0;
            if (bh_time(r, lg_call, c, c->nsets, 1, &us, e)) return sm_errprefix(e, "%s n=%d", lg_path_name(p), c->n);
            char extra[48] = "";
            if (p == SM_PATH_AUTO) {
                if (bh_time(r, lg_call, c, c->nsets, 2, &b2b, e)) return sm_errprefix(e, "b2b n=%d", c->n);
                snprintf(extra, sizeof extra, "b2b %.2f us", b2b);
            }
            bh_row(r, "logits", lg_path_name(p), c->n, us, bytes, flops, extra[0] ? extra : NULL, p == SM_PATH_AUTO);
        }
    }
    return 0;
}

int bench_logits(bh_run *r, sm_err *e) {
    bh_head("logits: h @ lm_head^T, softcap, mask, argmax (sm_k_logits and its paths); lm_head [V, H] bf16",
            "lm_head + h read (argmax written); FLOPs 2 n H V; b2b = per call, two calls back to back");
    lg_case c;
    memset(&c, 0, sizeof c);
    const int rc = lg_run(r, &c, e);
    if (c.lm) SM_CUDA_CHECK_PRINT(cudaFree(c.lm));
    if (c.h) SM_CUDA_CHECK_PRINT(cudaFree(c.h));
    if (c.am) SM_CUDA_CHECK_PRINT(cudaFree(c.am));
    return rc;
}

/* ---- logprob summaries ---- */

typedef struct lp_case {
    int n;                   /* rows */
    int d2h;                 /* 1: time the rows' copy to the host instead */
    float *lg;               /* device [nsets][BH_MAX_ROWS][V] */
    sm_lp_sum *out;          /* device [nsets][BH_MAX_ROWS] */
    float *host;             /* pinned [BH_MAX_ROWS][V] */
    int rows[BH_MAX_ROWS];   /* 0 .. n-1 */
} lp_case;

static int lp_call(bh_run *r, void *arg, int set, sm_err *e) {
    const lp_case *c = (const lp_case *)arg;
    const size_t V = (size_t)r->cfg.V;
    const float *lg = c->lg + (size_t)set * BH_MAX_ROWS * V;
    if (c->d2h) {
        SM_CUDA_CHECK(cudaMemcpyAsync(c->host, lg, (size_t)c->n * V * 4, cudaMemcpyDeviceToHost, r->st));
        return 0;
    }
    return sm_k_logprobs(&r->kc, lg, V, c->rows, NULL, c->n, r->cfg.vocab_used, SM_LP_MAX_TOP, c->out + (size_t)set * BH_MAX_ROWS, r->st, e);
}

static int lp_run(bh_run *r, lp_case *c, sm_err *e) {
    const sm_config *f = &r->cfg;
    const double set_bytes = (double)BH_MAX_ROWS * f->V * 4;
    const int nsets = bh_sets(r, set_bytes);
    SM_CUDA_CHECK(cudaMalloc((void **)&c->lg, (size_t)nsets * BH_MAX_ROWS * f->V * 4));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->out, (size_t)nsets * BH_MAX_ROWS * sizeof(sm_lp_sum)));
    SM_CUDA_CHECK(cudaMallocHost((void **)&c->host, (size_t)BH_MAX_ROWS * f->V * 4));
    /* logits N(0, 3^2): a spread like the softcapped model's */
    if (bh_normal_f32(r, c->lg, (size_t)nsets * BH_MAX_ROWS * f->V, "bench.logprobs.logits", 0.0f, 3.0f, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    for (int i = 0; i < BH_MAX_ROWS; i++) c->rows[i] = i;
    for (int ri = 0; ri < BH_NROWS; ri++) {
        c->n = r->rows[ri];
        const double bytes = (double)c->n * f->vocab_used * 4;
        for (c->d2h = 0; c->d2h < 2; c->d2h++) {
            float us = 0;
            if (bh_time(r, lp_call, c, nsets, 1, &us, e)) return sm_errprefix(e, "logprobs n=%d", c->n);
            bh_row(r, "logprobs", c->d2h ? "rows to host" : "sm_k_logprobs", c->n, us, bytes, 0.0, NULL, !c->d2h);
        }
    }
    return 0;
}

int bench_logprobs(bh_run *r, sm_err *e) {
    bh_head("logprobs: summaries of n rows of f32 logits [n, V], top 20 (sm_k_logprobs); beside it the rows' copy to the host",
            "the rows read once (ids < vocab_used); 'rows to host': the same bytes over PCIe to pinned memory");
    lp_case c;
    memset(&c, 0, sizeof c);
    const int rc = lp_run(r, &c, e);
    if (c.lg) SM_CUDA_CHECK_PRINT(cudaFree(c.lg));
    if (c.out) SM_CUDA_CHECK_PRINT(cudaFree(c.out));
    if (c.host) SM_CUDA_CHECK_PRINT(cudaFreeHost(c.host));
    return rc;
}
