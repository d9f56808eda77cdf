/* norm.cu: microbenchmark of the norm family (`gpu_test --bench norm`) at the real widths and
 * n = 8 .. 128 rows: the post-attention boundary sm_k_post_attn (s f32 [n, H] in place, a
 * bf16, 3 vectors [H], xf out), the post-FFN boundary sm_k_post_ffn (not the last layer: s in
 * place, f bf16, 4 vectors [H], x out), the pre-expert norm sm_k_rms_bf16 (bf16 [n, Hm] in
 * place, as the step runs it) and the embedding + first norm sm_k_embed (n random rows of the
 * 3.3 GB table [V, H], s and x out).
 *
 * These ops write about as much as they read, so their floor counts bytes read + written (each
 * input read once, each output written once).  Every buffer a call touches, outputs included,
 * is one of >= 3 L2 sizes of rotated sets, so no call finds its rows or a dirty line of its
 * outputs in L2; the embedding table is one copy (3.3 GB, random rows per set).  At 8 rows a
 * call moves under 1 MB (a fraction of a microsecond at full bandwidth): the table shows what
 * the launch of one block per row costs there.  We rejected a one-buffer loop: the L2 would
 * hold the whole working set and the floor would be meaningless.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/common.cuh"
#include "bench.h"

enum { NM_POST_ATTN, NM_POST_FFN, NM_RMS, NM_EMBED, NM_KINDS };
static const char *const nm_names[NM_KINDS] = {"post_attn", "post_ffn", "rms_bf16", "embed"};

typedef struct nm_case {
    int kind;                /* NM_* */
    int n;                   /* rows of the call */
    int W;                   /* row width: H, or Hm for the pre-expert norm */
    int nsets;               /* rotated sets */
    float *s;                /* device [nsets][n][W] f32 residual stream (in place, or embed output) */
    uint16_t *a;             /* device [nsets][n][W] bf16 input (a, f; rms_bf16 in place) */
    uint16_t *x;             /* device [nsets][n][W] bf16 output (xf, x) */
    float *vec;              /* device [nsets][4][W] f32 per-channel vectors (alpha, beta, norms) */
    int *tok;                /* device [nsets][n] token ids (embed) */
    int *htok;               /* host [nsets][n] the same ids */
    const uint16_t *embed;   /* device [V][H] the embedding table (embed) */
} nm_case;

static int nm_call(bh_run *r, void *arg, int set, sm_err *e) {
    const nm_case *c = (const nm_case *)arg;
    const sm_config *f = &r->cfg;
    const size_t o = (size_t)set * c->n * c->W;
    float *s = c->s ? c->s + o : NULL;
    uint16_t *a = c->a ? c->a + o : NULL, *x = c->x ? c->x + o : NULL;
    const float *v = c->vec + (size_t)set * 4 * c->W;
    switch (c->kind) {
    case NM_POST_ATTN:
        return sm_k_post_attn(s, a, v, v + c->W, v + 2 * c->W, c->n, c->W, f->post_eps, f->rms_eps, x, r->st, e);
    case NM_POST_FFN:
        return sm_k_post_ffn(s, a, v, v + c->W, v + 2 * c->W, v + 3 * c->W, 0, c->n, c->W, f->post_eps, f->rms_eps, x,
                             r->st, e);
    case NM_RMS:
        return sm_k_rms_bf16(a, c->n, c->W, v, f->rms_eps, a, 0, NULL, NULL, 0, r->st, e);
    default:
        return sm_k_embed(c->embed, f->V, c->W, c->tok + (size_t)set * c->n, c->n, v, f->rms_eps, s, x, r->st, e);
    }
}

/* Bytes one call reads and writes (the floor's count). */
static double nm_bytes(const nm_case *c) {
    const double nw = (double)c->n * c->W;
    switch (c->kind) {
    case NM_POST_ATTN: return nw * (4 + 2) + 3.0 * c->W * 4 + nw * (4 + 2);
    case NM_POST_FFN: return nw * (4 + 2) + 4.0 * c->W * 4 + nw * (4 + 2);
    case NM_RMS: return nw * 2 + (double)c->W * 4 + nw * 2;
    default: return nw * 2 + (double)c->W * 4 + c->n * 4.0 + nw * (4 + 2);
    }
}

/* One case: allocate and fill its sets, time, print.  Buffers freed by the caller. */
static int nm_run(bh_run *r, nm_case *c, sm_err *e) {
    c->nsets = bh_sets(r, nm_bytes(c));
    const size_t S = (size_t)c->nsets, nw = (size_t)c->n * c->W;
    char nm[64];
    if (c->kind != NM_RMS) {
        SM_CUDA_CHECK(cudaMalloc((void **)&c->s, S * nw * 4));
        SM_CUDA_CHECK(cudaMalloc((void **)&c->x, S * nw * 2));
        snprintf(nm, sizeof nm, "bench.norm.%s.s", nm_names[c->kind]);
        if (bh_normal_f32(r, c->s, S * nw, nm, 0.0f, 1.0f, e)) return -1;
    }
    if (c->kind != NM_EMBED) {
        SM_CUDA_CHECK(cudaMalloc((void **)&c->a, S * nw * 2));
        snprintf(nm, sizeof nm, "bench.norm.%s.a", nm_names[c->kind]);
        if (bh_normal_bf16(r, c->a, S * nw, nm, 0.0f, 1.0f, e)) return -1;
    } else {
        c->htok = (int *)malloc(S * c->n * sizeof(int));
        if (!c->htok) return sm_errf(e, "norm: out of host memory");
        snprintf(nm, sizeof nm, "bench.norm.embed.tokens.%d", c->n); /* other rows than the last case's */
        const uint64_t key = sm_rng_key(r->seed, nm);
        for (size_t i = 0; i < S * c->n; i++) c->htok[i] = (int)(bh_bits(key, i) % (uint64_t)r->cfg.V);
        SM_CUDA_CHECK(cudaMalloc((void **)&c->tok, S * c->n * sizeof(int)));
        SM_CUDA_CHECK(cudaMemcpy(c->tok, c->htok, S * c->n * sizeof(int), cudaMemcpyHostToDevice));
    }
    /* gains and residual-gate coefficients near 0.75: s stays bounded over repeated calls */
    SM_CUDA_CHECK(cudaMalloc((void **)&c->vec, S * 4 * c->W * 4));
    snprintf(nm, sizeof nm, "bench.norm.%s.vec", nm_names[c->kind]);
    if (bh_normal_f32(r, c->vec, S * 4 * c->W, nm, 0.75f, 0.05f, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    float us = 0;
    if (bh_time(r, nm_call, c, c->nsets, 1, &us, e)) return sm_errprefix(e, "%s n=%d", nm_names[c->kind], c->n);
    bh_row(r, "norm", nm_names[c->kind], c->n, us, nm_bytes(c), 0.0, NULL, 1);
    return 0;
}

static void nm_free(nm_case *c) {
    if (c->s) SM_CUDA_CHECK_PRINT(cudaFree(c->s));
    if (c->a) SM_CUDA_CHECK_PRINT(cudaFree(c->a));
    if (c->x) SM_CUDA_CHECK_PRINT(cudaFree(c->x));
    if (c->vec) SM_CUDA_CHECK_PRINT(cudaFree(c->vec));
    if (c->tok) SM_CUDA_CHECK_PRINT(cudaFree(c->tok));
    free(c->htok);
    c->s = NULL, c->a = c->x = NULL, c->vec = NULL, c->tok = c->htok = NULL;
}

/* The embedding table [V, H], random bf16 N(0, 1). */
static int nm_table(bh_run *r, uint16_t **embed, sm_err *e) {
    const size_t n = (size_t)r->cfg.V * r->cfg.H;
    SM_CUDA_CHECK(cudaMalloc((void **)embed, n * 2));
    if (bh_normal_bf16(r, *embed, n, "bench.norm.embed.table", 0.0f, 1.0f, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    return 0;
}

int bench_norm(bh_run *r, sm_err *e) {
    bh_head("norm: residual boundaries and row norms, one block per row (sm_k_post_attn, sm_k_post_ffn, "
            "sm_k_rms_bf16 [n, Hm] in place, sm_k_embed)",
            "read + written (these ops write as much as they read): rows, per-channel vectors, token ids");
    uint16_t *embed = NULL;
    int rc = nm_table(r, &embed, e);
    for (int k = 0; k < NM_KINDS && !rc; k++)
        for (int ri = 0; ri < BH_NROWS && !rc; ri++) {
            nm_case c;
            memset(&c, 0, sizeof c);
            c.kind = k;
            c.n = r->rows[ri];
            c.W = k == NM_RMS ? r->cfg.Hm : r->cfg.H;
            c.embed = embed;
            rc = nm_run(r, &c, e);
            nm_free(&c);
        }
    if (embed) SM_CUDA_CHECK_PRINT(cudaFree(embed));
    return rc;
}
