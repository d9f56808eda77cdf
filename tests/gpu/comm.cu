/* comm.cu: the `comm` group: the GPU cross-rank operations (src/cuda/comm/gcomm.h) on one
 * GPU, against a serial rank-order reference computed here on the host from the same random
 * inputs (seeded per run from the clock; the seed is printed).
 *
 * W = 1, 2, 4, 8 virtual ranks on device 0, one host thread per rank (the contract: each rank's
 * thread calls the operations with its own stream).  One plan of operations over two chunks
 * (an odd count in the first, so parities and epochs restart unevenly): both sums (16-byte and
 * 4-byte copy paths, one in place, one larger than a grid), column gathers (16-byte and
 * unaligned row widths), the owner gather, the argmax (ties across ranks, ranks with no id, a
 * non-finite rank); every output compared bit for bit on every rank, with a poisoned guard after
 * it.  Then the failure paths: fault injection (a rank stops publishing: every other rank's
 * health names it, the layer and the op, within about 2 s), an abort waking a peer at the host
 * barrier, a host barrier timing out, refusals (NCCL with a repeated device, a missing device, a
 * malformed fault variable).  With libnccl.so.2 loadable, the plan also runs on NCCL with W = 1.
 * The references are the definitions (rank-order f32 sums, codec.h's bf16 rounding, slot
 * rearrangements); we rejected comparing against the CPU communicator: it works on f32 rows
 * and global ids, the GPU interface on bytes, bf16 and local ids.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime.h>
#include "model/rng.h"
#include "model/codec.h"
#include "cuda/comm/gcomm.h"
#include "gpu_tests.h"
#include "harness.h"


#define GUARD 256        /* poisoned bytes after every device output */
#define GUARD_BYTE 0xA5
#define MAXW 8
#define MAXOPS 16

static uint64_t rnd64(void) { return sm_rng_next(&gh_rng); }
static float rndu(void) { return (float)((double)(rnd64() >> 40) * (1.0 / 8388608.0) - 1.0); } /* [-1, 1) */
static int rndi(int n) { return (int)((rnd64() >> 33) % (uint64_t)n); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* ------------------------------------------------------------------ the plan */

enum { K_SUM16, K_SUM32, K_COLS, K_OWNER, K_ARGMAX };
static const char *const KIND_NAME[] = {"sum_bf16", "sum_f32", "gather_cols", "gather_owner", "argmax"};

typedef struct op_spec {
    int kind;   /* K_* */
    int op;     /* sm_gcomm_op tag (sums, cols) */
    int layer;  /* tag */
    int a;      /* sums: count; cols, owner, argmax: rows n */
    int b;      /* cols: row bytes; owner: H */
    int nv;     /* owner, argmax: ids per rank */
    int chunk;  /* 0 or 1: begin before the first op of each chunk */
    int only0;  /* cols: ranks other than 0 pass out = NULL (take part, want no result) */
} op_spec;

static const op_spec PLAN[] = {
    {K_SUM16, SM_GC_ATTN, 0, 4096 * 3, 0, 0, 0, 0},        /* 16-byte copies */
    {K_SUM32, SM_GC_EXPERT, 0, 1001, 0, 0, 0, 0},          /* 4-byte copies, in place */
    {K_COLS, SM_GC_POOLED, 0, 5, 64, 0, 0, 0},
    {K_OWNER, SM_GC_EMBED, -1, 7, 96, 50, 0, 0},
    {K_ARGMAX, SM_GC_ARGMAX, -1, 9, 0, 100, 0, 0},
    {K_SUM16, SM_GC_ATTN, 1, 300001, 0, 0, 0, 0},          /* more elements than one grid pass */
    {K_COLS, SM_GC_UNPOOLED, 1, 3, 12, 0, 0, 0},           /* rows of 3 words */
    {K_SUM32, SM_GC_EXPERT, 1, 4096, 0, 0, 1, 0},          /* second chunk */
    {K_COLS, SM_GC_VOCAB, 2, 2, 4000, 0, 1, 1},     /* out only on rank 0 */
    {K_ARGMAX, SM_GC_ARGMAX, -1, 33, 0, 7, 1, 0},
};
#define NPLAN ((int)(sizeof PLAN / sizeof PLAN[0]))

static size_t part_bytes(const op_spec *s) {
    switch (s->kind) {
    case K_SUM16: case K_SUM32: return (size_t)s->a * 4;
    case K_COLS: return (size_t)s->a * s->b;
    case K_OWNER: return (size_t)s->a * s->b * 2;
    default: return (size_t)s->a * 8; /* best [n] f32 + id [n] int */
    }
}
static size_t out_bytes(const op_spec *s, int W) {
    switch (s->kind) {
    case K_SUM16: return (size_t)s->a * 2;
    case K_SUM32: return (size_t)s->a * 4;
    case K_COLS: return (size_t)s->a * s->b * W;
    case K_OWNER: return (size_t)s->a * s->b * 2;
    default: return (size_t)s->a * 4;
    }
}

typedef struct run {
    sm_gcomm_world *w;
    int W;
    const op_spec *plan;
    int nplan;
    uint8_t *hin[MAXW][MAXOPS];   /* host inputs [part_bytes] */
    uint8_t *din[MAXW][MAXOPS];   /* device inputs */
    uint8_t *dout[MAXW][MAXOPS];  /* device outputs [out_bytes + GUARD] (sum_f32: din, in place) */
    int *dtok[MAXOPS];            /* owner: device tokens [n] (replicated) */
    int *htok[MAXOPS];            /* host tokens */
    uint8_t *hout[MAXW][MAXOPS];  /* downloaded outputs [out_bytes + GUARD] */
    uint8_t *ref[MAXOPS];         /* expected output [out_bytes] */
    cudaStream_t st[MAXW];
    char err[MAXW][1100];         /* a rank's failure, "" if none */
    double secs;                  /* wall time of the rank threads */
} run;

typedef struct rank_arg {
    run *R;
    int r;
} rank_arg;

/* Random inputs of op k for every rank, and the expected output. */
static void make_inputs(run *R, int k) {
    const op_spec *s = &R->plan[k];
    const int W = R->W;
    size_t pb = part_bytes(s);
    for (int r = 0; r < W; r++) {
        uint8_t *h = (uint8_t *)malloc(pb + 1);
        R->hin[r][k] = h;
        if (s->kind == K_SUM16 || s->kind == K_SUM32) {
            float *f = (float *)h; /* magnitudes that make the order matter */
            for (int i = 0; i < s->a; i++) f[i] = rndu() * (float)(1 << rndi(12)) * (rndi(8) ? 1.0f : 1e-4f);
        } else if (s->kind == K_COLS || s->kind == K_OWNER) {
            for (size_t i = 0; i < pb; i++) h[i] = (uint8_t)rnd64();
        } else { /* argmax: values from a small set (ties across ranks), some ranks without id */
            float *best = (float *)h;
            int *id = (int *)(h + (size_t)s->a * 4);
            for (int i = 0; i < s->a; i++) {
                int t = rndi(10);
                id[i] = t == 0 ? -1 : (t == 1 && rndi(4) == 0) ? -2 : rndi(s->nv);
                best[i] = id[i] == -1 ? -INFINITY : (float)(rndi(3) - 1);
            }
        }
    }
    if (s->kind == K_OWNER) {
        R->htok[k] = (int *)malloc(sizeof(int) * (size_t)s->a);
        for (int i = 0; i < s->a; i++) R->htok[k][i] = rndi(W * s->nv);
    }
    /* the reference: the definition, slot by slot in rank order */
    size_t ob = out_bytes(s, W);
    uint8_t *ref = (uint8_t *)malloc(ob + 1);
    R->ref[k] = ref;
    if (s->kind == K_SUM16 || s->kind == K_SUM32) {
        for (int i = 0; i < s->a; i++) {
            float x = ((const float *)R->hin[0][k])[i];
            for (int q = 1; q < W; q++) x += ((const float *)R->hin[q][k])[i];
            if (s->kind == K_SUM16) ((uint16_t *)ref)[i] = sm_f32_to_bf16(x);
            else ((float *)ref)[i] = x;
        }
    } else if (s->kind == K_COLS) {
        for (int i = 0; i < s->a; i++)
            for (int q = 0; q < W; q++)
                memcpy(ref + ((size_t)i * W + q) * s->b, R->hin[q][k] + (size_t)i * s->b, (size_t)s->b);
    } else if (s->kind == K_OWNER) {
        for (int i = 0; i < s->a; i++) {
            int q = R->htok[k][i] / s->nv;
            memcpy(ref + (size_t)i * s->b * 2, R->hin[q][k] + (size_t)i * s->b * 2, (size_t)s->b * 2);
        }
    } else {
        for (int i = 0; i < s->a; i++) {
            int id = -1, nonfinite = 0;
            float v = 0.0f;
            for (int q = 0; q < W; q++) {
                float f = ((const float *)R->hin[q][k])[i];
                int qi = ((const int *)(R->hin[q][k] + (size_t)s->a * 4))[i];
                nonfinite |= qi == -2;
                if (qi < 0) continue;
                if (id < 0 || f > v) id = q * s->nv + qi, v = f;
            }
            ((int *)ref)[i] = nonfinite ? -1 : id;
        }
    }
}

/* Rank r's thread: every chunk begins, its operations, a synchronization; then the health. */
static void *rank_main(void *arg) {
    rank_arg *a = (rank_arg *)arg;
    run *R = a->R;
    const int r = a->r;
    sm_gcomm *c = sm_gcomm_rank(R->w, r);
    cudaStream_t st = R->st[r];
    sm_err e = {""};
    int chunk = -1;
    for (int k = 0; k < R->nplan; k++) {
        const op_spec *s = &R->plan[k];
        if (s->chunk != chunk) {
            if (chunk >= 0 && cudaStreamSynchronize(st) != cudaSuccess) {
                snprintf(R->err[r], sizeof R->err[r], "cudaStreamSynchronize failed");
                sm_gcomm_abort(R->w, "a rank's stream failed");
                return NULL;
            }
            chunk = s->chunk;
            if (sm_gcomm_begin(c, st, &e)) goto fail;
        }
        int rc = 0;
        void *in = R->din[r][k], *out = s->only0 && r ? NULL : R->dout[r][k];
        switch (s->kind) {
        case K_SUM16: rc = sm_gcomm_sum_bf16(c, s->op, s->layer, (const float *)in, (size_t)s->a, (uint16_t *)out, st, &e); break;
        case K_SUM32: rc = sm_gcomm_sum_f32(c, s->op, s->layer, (const float *)in, (size_t)s->a, (float *)out, st, &e); break;
        case K_COLS: rc = sm_gcomm_gather_cols(c, s->op, s->layer, in, s->a, (size_t)s->b, out, st, &e); break;
        case K_OWNER:
            rc = sm_gcomm_gather_owner(c, (const uint16_t *)in, R->dtok[k], s->a, s->b, s->nv, (uint16_t *)out, st, &e);
            break;
        default:
            rc = sm_gcomm_argmax(c, (const float *)in, (const int *)((uint8_t *)in + (size_t)s->a * 4), s->a, s->nv,
                                 (int *)out, st, &e);
        }
        if (rc) goto fail;
    }
    if (sm_gcomm_health_fetch(c, st, &e)) goto fail;
    if (cudaStreamSynchronize(st) != cudaSuccess) {
        snprintf(R->err[r], sizeof R->err[r], "cudaStreamSynchronize failed");
        return NULL;
    }
    if (sm_gcomm_health_check(c, &e)) goto fail;
    return NULL;
fail:
    snprintf(R->err[r], sizeof R->err[r], "%s", e.msg);
    sm_gcomm_abort(R->w, e.msg);
    return NULL;
}

static int cu_ok(cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return 1;
    printf("  %s: %s\n", what, cudaGetErrorString(rc));
    return 0;
}

/* Upload inputs, run every rank's thread, download.  0, or -1 (printed) on a CUDA error. */
static int run_ranks(run *R) {
    const int W = R->W;
    int ok = 1;
    for (int r = 0; r < W && ok; r++) {
        ok &= cu_ok(cudaStreamCreateWithFlags(&R->st[r], cudaStreamNonBlocking), "cudaStreamCreate");
        for (int k = 0; k < R->nplan && ok; k++) {
            const op_spec *s = &R->plan[k];
            size_t pb = part_bytes(s), ob = out_bytes(s, W);
            ok &= cu_ok(cudaMalloc((void **)&R->din[r][k], pb + GUARD), "cudaMalloc");
            if (!ok) break;
            ok &= cu_ok(cudaMemcpy(R->din[r][k], R->hin[r][k], pb, cudaMemcpyHostToDevice), "cudaMemcpy");
            if (s->kind == K_SUM32) {
                R->dout[r][k] = R->din[r][k]; /* in place */
            } else {
                ok &= cu_ok(cudaMalloc((void **)&R->dout[r][k], ob + GUARD), "cudaMalloc");
                if (!ok) break;
            }
            ok &= cu_ok(cudaMemset(R->dout[r][k], GUARD_BYTE, ob + GUARD), "cudaMemset");
            if (s->kind == K_SUM32)
                ok &= cu_ok(cudaMemcpy(R->din[r][k], R->hin[r][k], pb, cudaMemcpyHostToDevice), "cudaMemcpy");
            R->hout[r][k] = (uint8_t *)malloc(ob + GUARD);
        }
    }
    for (int k = 0; k < R->nplan && ok; k++)
        if (R->plan[k].kind == K_OWNER) {
            size_t tb = sizeof(int) * (size_t)R->plan[k].a;
            ok &= cu_ok(cudaMalloc((void **)&R->dtok[k], tb), "cudaMalloc");
            if (ok) ok &= cu_ok(cudaMemcpy(R->dtok[k], R->htok[k], tb, cudaMemcpyHostToDevice), "cudaMemcpy");
        }
    /* the uploads and poisons (legacy stream) are done before the ranks' non-blocking streams run */
    if (ok) ok &= cu_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (!ok) return -1;
    pthread_t th[MAXW];
    rank_arg args[MAXW];
    double t0 = now_s();
    for (int r = 0; r < W; r++) {
        args[r].R = R;
        args[r].r = r;
        R->err[r][0] = 0;
        if (pthread_create(&th[r], NULL, rank_main, &args[r])) {
            printf("  pthread_create failed\n");
            for (int q = 0; q < r; q++) pthread_join(th[q], NULL);
            return -1;
        }
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    R->secs = now_s() - t0;
    for (int r = 0; r < W && ok; r++)
        for (int k = 0; k < R->nplan && ok; k++)
            ok &= cu_ok(cudaMemcpy(R->hout[r][k], R->dout[r][k], out_bytes(&R->plan[k], W) + GUARD,
                                   cudaMemcpyDeviceToHost), "cudaMemcpy");
    return ok ? 0 : -1;
}

static void run_free(run *R) {
    for (int k = 0; k < R->nplan; k++) {
        for (int r = 0; r < R->W; r++) {
            free(R->hin[r][k]);
            free(R->hout[r][k]);
            if (R->dout[r][k] && R->dout[r][k] != R->din[r][k]) cudaFree(R->dout[r][k]);
            if (R->din[r][k]) cudaFree(R->din[r][k]);
        }
        free(R->ref[k]);
        free(R->htok[k]);
        if (R->dtok[k]) cudaFree(R->dtok[k]);
    }
    for (int r = 0; r < R->W; r++)
        if (R->st[r]) cudaStreamDestroy(R->st[r]);
    memset(R, 0, sizeof *R);
}

/* First differing element of op k on rank r (-1: none), in units of the output's element. */
static long first_diff(const run *R, int r, int k, size_t *esz) {
    const op_spec *s = &R->plan[k];
    *esz = s->kind == K_SUM16 || s->kind == K_OWNER ? 2 : 4;
    size_t ob = out_bytes(s, R->W);
    for (size_t i = 0; i < ob; i += *esz)
        if (memcmp(R->hout[r][k] + i, R->ref[k] + i, *esz)) return (long)(i / *esz);
    return -1;
}

/* The poisoned guard after the output (the whole buffer where the rank passed out = NULL) is intact. */
static int guard_ok(const run *R, int r, int k) {
    const size_t ob = out_bytes(&R->plan[k], R->W);
    const size_t from = R->plan[k].only0 && r ? 0 : ob;
    for (size_t i = from; i < ob + GUARD; i++)
        if (R->hout[r][k][i] != GUARD_BYTE) return 0;
    return 1;
}

/* The plan on a world of W ranks on `devices`; one PASS / FAIL line per operation. */
static void case_plan(int kind, int W, const int *devices, const char *label) {
    run R;
    memset(&R, 0, sizeof R);
    R.W = W;
    R.plan = PLAN;
    R.nplan = NPLAN;
    size_t maxb = 0;
    for (int k = 0; k < NPLAN; k++) {
        make_inputs(&R, k);
        if (part_bytes(&PLAN[k]) > maxb) maxb = part_bytes(&PLAN[k]);
    }
    sm_gcomm_opts o = {W, devices, kind, maxb, 0.0};
    sm_err e = {""};
    if (sm_gcomm_create(&o, &R.w, &e)) {
        gh_result(0, "comm %s W=%d create: %s", label, W, e.msg);
        run_free(&R);
        return;
    }
    if (run_ranks(&R)) {
        gh_result(0, "comm %s W=%d: CUDA error", label, W);
    } else {
        int rank_fail = 0;
        for (int r = 0; r < W; r++)
            if (R.err[r][0]) {
                printf("  rank %d: %s\n", r, R.err[r]);
                rank_fail = 1;
            }
        gh_result(!rank_fail, "comm %s W=%d: every rank ran the plan, health clean (%.3f s)", label, W, R.secs);
        for (int k = 0; k < NPLAN && !rank_fail; k++) {
            const op_spec *s = &PLAN[k];
            int bad = 0;
            for (int r = 0; r < W; r++) {
                size_t esz = 4;
                long d = s->only0 && r ? -1 : first_diff(&R, r, k, &esz);
                int g = guard_ok(&R, r, k);
                if (d >= 0 || !g) {
                    if (!bad) {
                        uint32_t got = 0, want = 0;
                        if (d >= 0) {
                            memcpy(&got, R.hout[r][k] + (size_t)d * esz, esz);
                            memcpy(&want, R.ref[k] + (size_t)d * esz, esz);
                        }
                        printf("  rank %d: %s%s element %ld: got 0x%x, want 0x%x\n", r, g ? "" : "guard overwritten; ",
                               d >= 0 ? "first difference at" : "no difference,", d, got, want);
                    }
                    bad = 1;
                }
            }
            gh_result(!bad, "comm %s W=%d op %d %s (%s layer %d, %d x %d, chunk %d%s) bit-exact on every rank", label,
                   W, k, KIND_NAME[s->kind], sm_gcomm_op_name(s->op), s->layer, s->a, s->b, s->chunk,
                   s->only0 ? ", out on rank 0 only" : "");
        }
    }
    sm_gcomm_destroy(R.w);
    run_free(&R);
}

/* ------------------------------------------------------------------ failure paths */

static const op_spec FAULT_PLAN[] = {
    {K_SUM16, SM_GC_ATTN, 1, 1000, 0, 0, 0, 0},   /* fine */
    {K_SUM16, SM_GC_ATTN, 2, 1000, 0, 0, 0, 0},   /* rank 1 stops publishing here */
    {K_SUM32, SM_GC_EXPERT, 2, 1000, 0, 0, 0, 0}, /* skipped: the health words are set */
    {K_SUM16, SM_GC_ATTN, 3, 1000, 0, 0, 1, 0},   /* a later chunk: skipped too */
};

static void case_fault(int W) {
    run R;
    memset(&R, 0, sizeof R);
    R.W = W;
    R.plan = FAULT_PLAN;
    R.nplan = (int)(sizeof FAULT_PLAN / sizeof FAULT_PLAN[0]);
    for (int k = 0; k < R.nplan; k++) make_inputs(&R, k);
    setenv("SPARKMONO_COMM_FAULT", "1:2:attn_sum", 1);
    setenv("SPARKMONO_COMM_BOUND_MS", "200", 1);
    int devices[MAXW] = {0};
    sm_gcomm_opts o = {W, devices, SM_GCOMM_PEER, 4000, 0.0};
    sm_err e = {""};
    int rc = sm_gcomm_create(&o, &R.w, &e);
    unsetenv("SPARKMONO_COMM_FAULT");
    unsetenv("SPARKMONO_COMM_BOUND_MS");
    if (rc) {
        gh_result(0, "comm fault W=%d create: %s", W, e.msg);
        run_free(&R);
        return;
    }
    gh_result(sm_gcomm_bound_ms(R.w) == 200.0, "comm fault W=%d: SPARKMONO_COMM_BOUND_MS sets the bound (%.0f ms)", W,
           sm_gcomm_bound_ms(R.w));
    if (run_ranks(&R)) {
        gh_result(0, "comm fault W=%d: CUDA error", W);
    } else {
        int named = 1;
        for (int r = 0; r < W; r++) {
            if (r == 1) continue;
            double ms = 0;
            const char *at = strstr(R.err[r], "waited ");
            if (at) sscanf(at, "waited %lf", &ms);
            char want[64];
            snprintf(want, sizeof want, "rank %d: layer 2 attn_sum: waited", r);
            int ok = strstr(R.err[r], want) && strstr(R.err[r], "for rank 1 (epoch") && ms >= 150 && ms < 1000;
            printf("  rank %d: %s\n", r, R.err[r][0] ? R.err[r] : "(no failure reported)");
            named &= ok;
        }
        gh_result(named, "comm fault W=%d: every other rank's health names rank 1, layer 2, attn_sum, ~200 ms", W);
        gh_result(R.secs < 2.5, "comm fault W=%d: the faulty world finished in %.3f s (bound 200 ms)", W, R.secs);
        /* the operation before the fault went through */
        int first_ok = 1;
        for (int r = 0; r < W; r++) {
            size_t esz;
            first_ok &= first_diff(&R, r, 0, &esz) < 0;
        }
        gh_result(first_ok, "comm fault W=%d: the operation before the fault is exact on every rank", W);
    }
    sm_gcomm_destroy(R.w);
    run_free(&R);
}

typedef struct abort_arg {
    sm_gcomm_world *w;
    int mode;                 /* 0: rank 1 aborts; 1: rank 1 never comes */
    float *part;              /* device [16] */
    uint16_t *out;            /* device [16] */
    cudaStream_t st;
    int rc;
    char msg[1100];
} abort_arg;

static void *abort_rank0(void *arg) {
    abort_arg *a = (abort_arg *)arg;
    sm_err e = {""};
    sm_gcomm *c = sm_gcomm_rank(a->w, 0);
    a->rc = sm_gcomm_begin(c, a->st, &e);
    if (!a->rc) a->rc = sm_gcomm_sum_bf16(c, SM_GC_ATTN, 4, a->part, 16, a->out, a->st, &e);
    snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    return NULL;
}

/* Rank 1 aborts (mode 0) or never arrives (mode 1): rank 0 must fail, not hang. */
static void case_host_barrier(int mode) {
    int devices[2] = {0, 0};
    sm_gcomm_opts o = {2, devices, SM_GCOMM_PEER, 64, 200.0};
    sm_err e = {""};
    abort_arg a;
    memset(&a, 0, sizeof a);
    const char *name = mode ? "timeout" : "abort";
    if (sm_gcomm_create(&o, &a.w, &e)) {
        gh_result(0, "comm %s: create: %s", name, e.msg);
        return;
    }
    if (!cu_ok(cudaMalloc((void **)&a.part, 64), "cudaMalloc") || !cu_ok(cudaMalloc((void **)&a.out, 64), "cudaMalloc") ||
        !cu_ok(cudaStreamCreateWithFlags(&a.st, cudaStreamNonBlocking), "cudaStreamCreate")) {
        gh_result(0, "comm %s: CUDA error", name);
    } else {
        pthread_t th;
        double t0 = now_s();
        if (pthread_create(&th, NULL, abort_rank0, &a)) {
            gh_result(0, "comm %s: pthread_create", name);
        } else {
            if (!mode) sm_gcomm_abort(a.w, "rank 1 failed on purpose");
            pthread_join(th, NULL);
            double secs = now_s() - t0;
            cudaStreamSynchronize(a.st);
            printf("  rank 0: %s\n", a.msg);
            if (!mode)
                gh_result(a.rc != 0 && strstr(a.msg, "rank 1 failed on purpose") != NULL,
                       "comm abort: a waiting or later rank fails with the abort's reason");
            else
                gh_result(a.rc != 0 && strstr(a.msg, "ranks not arrived: 1") != NULL && secs < 1.5,
                       "comm timeout: the host barrier gives up after the bound, naming rank 1 (%.3f s)", secs);
        }
    }
    if (a.st) cudaStreamDestroy(a.st);
    cudaFree(a.part);
    cudaFree(a.out);
    sm_gcomm_destroy(a.w);
}

/* A creation that must fail with `want` in its line. */
static void case_refusal(const char *label, int W, const int *devices, int kind, const char *want) {
    sm_gcomm_world *w = NULL;
    sm_gcomm_opts o = {W, devices, kind, 256, 0.0};
    sm_err e = {""};
    int rc = sm_gcomm_create(&o, &w, &e);
    printf("  %s: %s\n", label, rc ? e.msg : "(created)");
    gh_result(rc != 0 && w == NULL && strstr(e.msg, want) != NULL && !strchr(e.msg, '\n'),
           "comm refusal: %s, one line naming it", label);
    if (!rc) sm_gcomm_destroy(w);
}

/* ------------------------------------------------------------------ entry */

int gpu_test_comm(void) {
    gh_reset();
    gh_seed("gpu_test_comm");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("FAIL comm: no CUDA device\n");
        return 1;
    }
    unsetenv("SPARKMONO_COMM_FAULT");
    unsetenv("SPARKMONO_COMM_BOUND_MS");
    int zeros[MAXW] = {0};
    static const int ws[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) case_plan(SM_GCOMM_PEER, ws[i], zeros, "peer");
    case_fault(2);
    case_fault(4);
    case_host_barrier(0);
    case_host_barrier(1);
    case_refusal("nccl with a repeated device", 2, zeros, SM_GCOMM_NCCL, "NCCL refuses a duplicated device");
    int bad[2] = {0, 999};
    case_refusal("a device that does not exist", 2, bad, SM_GCOMM_PEER, "device 999 does not exist");
    setenv("SPARKMONO_COMM_FAULT", "1:2:no_such_op", 1);
    case_refusal("a malformed SPARKMONO_COMM_FAULT", 2, zeros, SM_GCOMM_PEER, "SPARKMONO_COMM_FAULT");
    unsetenv("SPARKMONO_COMM_FAULT");
    /* NCCL with one rank, when the library is there */
    sm_gcomm_world *w = NULL;
    sm_gcomm_opts o = {1, zeros, SM_GCOMM_NCCL, 256, 0.0};
    sm_err e = {""};
    if (sm_gcomm_create(&o, &w, &e)) {
        printf("  nccl: %s\n", e.msg);
        if (strstr(e.msg, "libnccl.so.2 not found")) gh_skip_line("comm nccl W=1: libnccl.so.2 is not loadable");
        else gh_result(0, "comm nccl W=1 create: %s", e.msg);
    } else {
        sm_gcomm_destroy(w);
        case_plan(SM_GCOMM_NCCL, 1, zeros, "nccl");
    }
    printf("DONE comm: %d passed, %d failed, %d skipped\n", gh_pass, gh_fail, gh_skip);
    return gh_fail;
}
