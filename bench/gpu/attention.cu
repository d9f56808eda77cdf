/* attention.cu: microbenchmark of decode / verify attention (`gpu_test --bench attention`):
 * sm_k_attention (paged KV, GQA 128 query heads over 16 KV heads, D 64, softmax, output norm
 * and sigmoid gate) at the real widths, as a verify step calls it: n = 8 .. 128 rows as n / 8
 * requests of R = 8 rows, each request with 4096 tokens already in the cache and its rows at
 * positions 4096 .. 4103 (their own keys inserted), on a full layer (every key) and on a
 * sliding layer (the last 2048 keys of each row).  q and gate are column ranges of the fused
 * q/k/v/gate projection's output, as in the step.
 *
 * The cache is one pool of pages, the pages of every request a random permutation (a server's
 * cache after a while, not one contiguous run); the input sets are disjoint groups of
 * requests (plus their q / gate / out rows), >= 3 L2 sizes together.  Floor bytes = the KV of
 * each request's key span read ONCE (ctx + R keys on full layers, window + R - 1 on sliding
 * ones; K and V, bf16) + q and gate read (out written: n x nH x D, not counted); FLOPs = 4 D
 * per (row, query head, key it sees) (q.k and p.v).  We rejected one request per row: a verify
 * step's rows share their request's keys, and the floor is what the step must read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "cuda/common.cuh"
#include "bench.h"

#define AT_CTX 4096          /* tokens of a request already in the cache */
#define AT_R 8               /* rows a request (the last token + 7 drafts) */

typedef struct at_bufs {
    int bpr;                 /* pages a request: ceil((AT_CTX + AT_R) / 16) */
    int nreq;                /* requests in the pool */
    int maxsets;             /* sets q / gate / out are allocated for */
    uint16_t *kv;            /* device [nreq * bpr][nKV][16][2 D] bf16: the pool */
    int *tab;                /* device [nreq][bpr] page ids */
    int *htab;               /* host [nreq][bpr] the same */
    int *row_req;            /* device [BH_MAX_ROWS] i / AT_R */
    int *pos;                /* device [BH_MAX_ROWS] AT_CTX + i % AT_R */
    uint16_t *qkvg;          /* device [maxsets][BH_MAX_ROWS][(2 nH + 2 nKV) D] bf16 */
    uint16_t *out;           /* device [maxsets][BH_MAX_ROWS][nH D] bf16 */
} at_bufs;

typedef struct at_case {
    const at_bufs *b;        /* the shared buffers */
    int n;                   /* rows of the call */
    int window;              /* 0: full layer, else the sliding window */
} at_case;

/* Keys one request's rows read together, and the keys row i sees. */
static int at_span(int window) {
    const int all = AT_CTX + AT_R;
    return window > 0 && window + AT_R - 1 < all ? window + AT_R - 1 : all;
}
static int at_keys(int window, int i) {
    const int p = AT_CTX + i % AT_R;
    return window > 0 && window < p + 1 ? window : p + 1;
}

/* Bytes of one set of rows: the KV its requests read + q / gate read + out written. */
static double at_set_bytes(const bh_run *r, int n, int window) {
    const sm_config *f = &r->cfg;
    const int QD = f->nH * f->D;
    return (double)(n / AT_R) * at_span(window) * f->nKV * 2 * f->D * 2 + (double)n * QD * 2 * 2 + (double)n * QD * 2;
}

static int at_call(bh_run *r, void *arg, int set, sm_err *e) {
    const at_case *c = (const at_case *)arg;
    const at_bufs *b = c->b;
    const sm_config *f = &r->cfg;
    const int QD = f->nH * f->D, KD = f->nKV * f->D, NQ = 2 * QD + 2 * KD;
    const uint16_t *q = b->qkvg + (size_t)set * BH_MAX_ROWS * NQ, *g = q + QD + 2 * KD;
    const int *tab = b->tab + (size_t)set * (c->n / AT_R) * b->bpr;
    const float scale = f->qk_scale_factor / sqrtf((float)f->D);
    return sm_k_attention(&r->kc, q, NQ, g, NQ, b->kv, tab, b->bpr, b->row_req, b->pos, c->n, f->nH, f->nKV, c->window,
                          scale, f->rms_eps, AT_CTX + AT_R, b->out + (size_t)set * BH_MAX_ROWS * QD, r->st, e);
}

/* The pool (enough requests for every case's sets), its page tables and the row metadata. */
static int at_setup(bh_run *r, at_bufs *b, sm_err *e) {
    const sm_config *f = &r->cfg;
    const int QD = f->nH * f->D, KD = f->nKV * f->D, NQ = 2 * QD + 2 * KD;
    b->bpr = (AT_CTX + AT_R + 15) / 16;
    for (int ri = 0; ri < BH_NROWS; ri++)
        for (int k = 0; k < 2; k++) {
            const int n = r->rows[ri], sets = bh_sets(r, at_set_bytes(r, n, k ? f->window : 0));
            if (sets * (n / AT_R) > b->nreq) b->nreq = sets * (n / AT_R);
            if (sets > b->maxsets) b->maxsets = sets;
        }
    const size_t pages = (size_t)b->nreq * b->bpr, page_elems = (size_t)f->nKV * 16 * 2 * f->D;
    SM_CUDA_CHECK(cudaMalloc((void **)&b->kv, pages * page_elems * 2));
    if (bh_normal_bf16(r, b->kv, pages * page_elems, "bench.attention.kv", 0.0f, 1.0f, e)) return -1;
    /* page tables: a random permutation of the pool's pages (Fisher-Yates) */
    b->htab = (int *)malloc(pages * sizeof(int));
    if (!b->htab) return sm_errf(e, "attention: out of host memory");
    for (size_t i = 0; i < pages; i++) b->htab[i] = (int)i;
    const uint64_t key = sm_rng_key(r->seed, "bench.attention.pages");
    for (size_t i = pages - 1; i > 0; i--) {
        const size_t j = (size_t)(bh_bits(key, i) % (uint64_t)(i + 1));
        const int t = b->htab[i];
        b->htab[i] = b->htab[j];
        b->htab[j] = t;
    }
    SM_CUDA_CHECK(cudaMalloc((void **)&b->tab, pages * sizeof(int)));
    SM_CUDA_CHECK(cudaMemcpy(b->tab, b->htab, pages * sizeof(int), cudaMemcpyHostToDevice));
    int rq[BH_MAX_ROWS], ps[BH_MAX_ROWS];
    for (int i = 0; i < BH_MAX_ROWS; i++) rq[i] = i / AT_R, ps[i] = AT_CTX + i % AT_R;
    SM_CUDA_CHECK(cudaMalloc((void **)&b->row_req, sizeof rq));
    SM_CUDA_CHECK(cudaMalloc((void **)&b->pos, sizeof ps));
    SM_CUDA_CHECK(cudaMemcpy(b->row_req, rq, sizeof rq, cudaMemcpyHostToDevice));
    SM_CUDA_CHECK(cudaMemcpy(b->pos, ps, sizeof ps, cudaMemcpyHostToDevice));
    const size_t S = (size_t)b->maxsets;
    SM_CUDA_CHECK(cudaMalloc((void **)&b->qkvg, S * BH_MAX_ROWS * NQ * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&b->out, S * BH_MAX_ROWS * QD * 2));
    if (bh_normal_bf16(r, b->qkvg, S * BH_MAX_ROWS * NQ, "bench.attention.qkvg", 0.0f, 1.0f, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    return 0;
}

static int at_run(bh_run *r, at_bufs *b, sm_err *e) {
    if (at_setup(r, b, e)) return -1;
    const sm_config *f = &r->cfg;
    for (int k = 0; k < 2; k++)
        for (int ri = 0; ri < BH_NROWS; ri++) {
            at_case c = {b, r->rows[ri], k ? f->window : 0};
            const int nreq = c.n / AT_R;
            const double bytes = (double)nreq * at_span(c.window) * f->nKV * 2 * f->D * 2 + (double)c.n * f->nH * f->D * 2 * 2;
            double flops = 0;
            for (int i = 0; i < c.n; i++) flops += 4.0 * f->D * f->nH * at_keys(c.window, i);
            const int sets = bh_sets(r, at_set_bytes(r, c.n, c.window));
            float us = 0;
            if (bh_time(r, at_call, &c, sets, 1, &us, e)) return sm_errprefix(e, "%s n=%d", k ? "sliding" : "full", c.n);
            char extra[48];
            snprintf(extra, sizeof extra, "%dx%d rows, %d keys a request", nreq, AT_R, at_span(c.window));
            bh_row(r, "attention", k ? "sliding ctx4096" : "full ctx4096", c.n, us, bytes, flops, extra, 1);
        }
    return 0;
}

int bench_attention(bh_run *r, sm_err *e) {
    bh_head("attention: paged decode / verify attention + output norm + gate (sm_k_attention); n / 8 requests of R = 8 "
            "rows, 4096 tokens each in the cache; full layer and sliding layer (window 2048)",
            "each request's KV span read once (K and V bf16) + q + gate read (out written: not counted); "
            "FLOPs 4 D per (row, query head, key)");
    at_bufs b;
    memset(&b, 0, sizeof b);
    const int rc = at_run(r, &b, e);
    if (b.kv) SM_CUDA_CHECK_PRINT(cudaFree(b.kv));
    if (b.tab) SM_CUDA_CHECK_PRINT(cudaFree(b.tab));
    if (b.row_req) SM_CUDA_CHECK_PRINT(cudaFree(b.row_req));
    if (b.pos) SM_CUDA_CHECK_PRINT(cudaFree(b.pos));
    if (b.qkvg) SM_CUDA_CHECK_PRINT(cudaFree(b.qkvg));
    if (b.out) SM_CUDA_CHECK_PRINT(cudaFree(b.out));
    free(b.htab);
    return rc;
}
