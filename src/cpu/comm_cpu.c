/* comm_cpu.c: the communication interface of comm.h for W ranks that are threads of one
 * process (the CPU world backend, src/cpu/world.c).
 *
 * Each rank owns two slots (one per operation parity).  An operation is: (test jitter),
 * write the call's header and copy the part into this rank's slot of the current parity,
 * one barrier, check that every rank made the same call, then read the slots in rank order
 * into this rank's output.  Two parities make one barrier per operation enough: a rank can
 * only start writing parity p again (operation k+2) after every rank has reached the barrier
 * of operation k+1, i.e. after every rank has finished reading operation k.  Every rank does
 * its own reduction of the slots it needs, so no rank waits for a "root" after the barrier.
 * The barrier is a mutex/condvar generation counter with an abort flag and a deadline: an
 * aborted or timed-out world fails every waiting and later call instead of hanging.
 * We rejected pthread_barrier_t (no timeout, no way to wake waiters on a peer's failure) and
 * reading peers' buffers in place (the caller's output is often its input, so a rank could
 * overwrite its part while a peer still reads it).
 */
#include "parallel/comm.h"
#include "parallel/hbar.h"
#include "model/rng.h"
#include "parallel/shard.h"
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_EMBED, OP_ATTN, OP_POOLED, OP_EXPERT_SUM, OP_EXPERT_SCATTER, OP_EXPERT_GATHER, OP_UNPOOLED,
       OP_VOCAB, OP_ARGMAX, OP_N };
static const char *const OP_NAME[OP_N] = {"embed_gather", "attn_sum", "pooled_gather", "expert_sum",
                                          "expert_scatter", "expert_gather", "unpooled_gather", "vocab_gather",
                                          "vocab_argmax"};

typedef struct slot {
    int op, layer, d0, d1, d2;  /* the call: operation, layer tag, shape (n, width, extra) */
    float *f; size_t fcap;      /* deposited floats [fcap] */
    int *i; size_t icap;        /* deposited ints [icap] */
} slot;

typedef struct rank_state {
    sm_comm_cpu *w;
    int rank;
    uint64_t nops;              /* operations started since the last reset */
} rank_state;

struct sm_comm_cpu {
    int world;                  /* ranks */
    double timeout_s;           /* longest wait at a barrier */
    sm_hbar bar;                /* the ranks' rendezvous, abortable (hbar.h) */
    uint64_t jseed;             /* jitter seed, 0 = off */
    int jmax_us;                /* jitter bound */
    slot *slots;                /* [2, world] by parity then rank */
    rank_state *rs;             /* [world] */
    sm_comm *h;                 /* [world] handles */
};

static const sm_comm_ops CPU_OPS;

/* ---------------------------------------------------------------- jitter, barrier */

static uint64_t mix64(uint64_t x) { return sm_mix64(x + SM_RNG_GOLDEN); } /* rng.h's mixer */

/* Sleep or yield for a draw of (seed, rank, op count): changes the deposit order. */
static void jitter(const sm_comm_cpu *w, int rank, uint64_t nop) {
    if (!w->jseed || w->jmax_us <= 0) return;
    uint64_t h = mix64(w->jseed ^ mix64((uint64_t)rank * 0x100000001B3ull + nop));
    int us = (int)(h % (uint64_t)(w->jmax_us + 1));
    if (us < w->jmax_us / 4) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, (long)us * 1000L};
    nanosleep(&ts, NULL);
}

static void cpu_abort(sm_comm *cm, const char *why) {
    rank_state *rs = cm->impl;
    sm_hbar_abort(&rs->w->bar, rs->rank, why);
}

/* Wait until every rank has arrived (0), or fail on abort / timeout (-1). */
static int barrier(rank_state *rs, int op, int layer, sm_err *e) {
    char what[96], msg[512];
    int who = -1;
    snprintf(what, sizeof what, "comm %s at layer %d", OP_NAME[op], layer);
    if (sm_hbar_wait(&rs->w->bar, rs->rank, rs->w->timeout_s, what, &who, msg, sizeof msg) == 0) return 0;
    if (who >= 0)
        return sm_errf(e, "comm %s at layer %d, rank %d: aborted by rank %d: %s", OP_NAME[op], layer, rs->rank, who, msg);
    return sm_errf(e, "%s", msg);
}

/* ---------------------------------------------------------------- one operation */

/* Grow a slot's payload buffers (contents need not survive). */
static int slot_reserve(slot *s, size_t nf, size_t ni) {
    if (nf > s->fcap) {
        free(s->f);
        s->f = malloc(sizeof(float) * nf);
        s->fcap = s->f ? nf : 0;
        if (!s->f) return -1;
    }
    if (ni > s->icap) {
        free(s->i);
        s->i = malloc(sizeof(int) * ni);
        s->icap = s->i ? ni : 0;
        if (!s->i) return -1;
    }
    return 0;
}

/* Start an operation: jitter, then this rank's slot of the current parity with its header
 * written and room for nf floats and ni ints.  The caller fills the payload, then meets. */
static slot *begin(sm_comm *cm, int op, int layer, int d0, int d1, int d2, size_t nf, size_t ni, sm_err *e) {
    rank_state *rs = cm->impl;
    sm_comm_cpu *w = rs->w;
    jitter(w, rs->rank, rs->nops);
    int p = (int)(rs->nops & 1);
    rs->nops++;
    slot *s = &w->slots[p * w->world + rs->rank];
    if (slot_reserve(s, nf, ni)) {
        char why[256];
        snprintf(why, sizeof why, "comm %s at layer %d, rank %d: out of memory for a %zu-float slot", OP_NAME[op], layer,
                 rs->rank, nf);
        cpu_abort(cm, why);
        sm_errf(e, "%s", why);
        return NULL;
    }
    s->op = op, s->layer = layer, s->d0 = d0, s->d1 = d1, s->d2 = d2;
    return s;
}

/* Barrier, then check every rank made the same call; returns the slots of this parity. */
static slot *meet(sm_comm *cm, const slot *mine, sm_err *e) {
    rank_state *rs = cm->impl;
    sm_comm_cpu *w = rs->w;
    if (barrier(rs, mine->op, mine->layer, e)) return NULL;
    slot *all = w->slots + (mine - w->slots) / w->world * w->world;
    for (int q = 1; q < w->world; q++) {
        const slot *a = &all[0], *b = &all[q];
        if (a->op != b->op || a->layer != b->layer || a->d0 != b->d0 || a->d1 != b->d1 || a->d2 != b->d2) {
            char why[512];
            snprintf(why, sizeof why,
                     "comm: ranks diverged: rank 0 called %s(layer %d, %d x %d x %d) but rank %d called %s(layer %d, "
                     "%d x %d x %d)", OP_NAME[a->op], a->layer, a->d0, a->d1, a->d2, q, OP_NAME[b->op], b->layer,
                     b->d0, b->d1, b->d2);
            cpu_abort(cm, why);
            sm_errf(e, "%s", why);
            return NULL;
        }
    }
    return all;
}

/* In-place rank-ordered sum of cnt floats: x = ((slot0 + slot1) + slot2) + ... */
static void sum_slots(const slot *all, int world, size_t off, size_t cnt, float *x) {
    memcpy(x, all[0].f + off, sizeof(float) * cnt);
    for (int q = 1; q < world; q++) {
        const float *p = all[q].f + off;
        for (size_t i = 0; i < cnt; i++) x[i] += p[i];
    }
}

/* Gather column blocks: out [n, world*b] from each rank's [n, b]. */
static void gather_cols(const slot *all, int world, int n, int b, float *out) {
    int64_t wd = (int64_t)world * b;
    for (int q = 0; q < world; q++)
        for (int i = 0; i < n; i++)
            memcpy(out + i * wd + (int64_t)q * b, all[q].f + (int64_t)i * b, sizeof(float) * (size_t)b);
}

/* ---------------------------------------------------------------- the operations */

static int cpu_embed_gather(sm_comm *cm, const int *tokens, int n, int H, int nv, float *rows, sm_err *e) {
    size_t cnt = (size_t)n * (size_t)H;
    slot *s = begin(cm, OP_EMBED, -1, n, H, nv, cnt, 0, e), *all;
    if (!s) return -1;
    memcpy(s->f, rows, sizeof(float) * cnt);
    if (!(all = meet(cm, s, e))) return -1;
    /* row i comes from the rank whose vocabulary block holds its token */
    for (int i = 0; i < n; i++) {
        int q = nv > 0 ? tokens[i] / nv : -1;
        if (q < 0 || q >= cm->world)
            return sm_errf(e, "comm embed_gather, rank %d: row %d: token %d is outside the %d x %d vocabulary blocks",
                           cm->rank, i, tokens[i], cm->world, nv);
        if (q != cm->rank) memcpy(rows + (int64_t)i * H, all[q].f + (int64_t)i * H, sizeof(float) * (size_t)H);
    }
    return 0;
}

static int allreduce(sm_comm *cm, int op, int layer, float *x, int rows, int width, sm_err *e) {
    size_t cnt = (size_t)rows * (size_t)width;
    slot *s = begin(cm, op, layer, rows, width, 0, cnt, 0, e), *all;
    if (!s) return -1;
    memcpy(s->f, x, sizeof(float) * cnt);
    if (!(all = meet(cm, s, e))) return -1;
    sum_slots(all, cm->world, 0, cnt, x);
    return 0;
}

static int cpu_attn_sum(sm_comm *cm, int layer, float *a, int n, int H, sm_err *e) {
    return allreduce(cm, OP_ATTN, layer, a, n, H, e);
}

static int cpu_expert_sum(sm_comm *cm, int layer, float *part, int rows, int width, sm_err *e) {
    return allreduce(cm, OP_EXPERT_SUM, layer, part, rows, width, e);
}

static int allgather_cols(sm_comm *cm, int op, int layer, const float *blk, int n, int b, float *out, sm_err *e) {
    size_t cnt = (size_t)n * (size_t)b;
    slot *s = begin(cm, op, layer, n, b, 0, cnt, 0, e), *all;
    if (!s) return -1;
    memcpy(s->f, blk, sizeof(float) * cnt);
    if (!(all = meet(cm, s, e))) return -1;
    if (out) gather_cols(all, cm->world, n, b, out);
    return 0;
}

static int cpu_pooled_gather(sm_comm *cm, int layer, const float *blk, int n, int np, float *out, sm_err *e) {
    return allgather_cols(cm, OP_POOLED, layer, blk, n, np, out, e);
}

static int cpu_unpooled_gather(sm_comm *cm, int layer, const float *blk, int n, int nu, float *out, sm_err *e) {
    return allgather_cols(cm, OP_UNPOOLED, layer, blk, n, nu, out, e);
}

static int cpu_vocab_gather(sm_comm *cm, const float *blk, int n, int nv, float *out, sm_err *e) {
    return allgather_cols(cm, OP_VOCAB, -1, blk, n, nv, out, e);
}

static int cpu_expert_scatter(sm_comm *cm, int layer, const float *part, int n, int width, float *mine, sm_err *e) {
    size_t cnt = (size_t)n * (size_t)width;
    slot *s = begin(cm, OP_EXPERT_SCATTER, layer, n, width, 0, cnt, 0, e), *all;
    if (!s) return -1;
    memcpy(s->f, part, sizeof(float) * cnt);
    if (!(all = meet(cm, s, e))) return -1;
    /* this rank's token rows, summed over ranks in rank order */
    int lo, hi;
    sm_shard_rows(n, cm->world, cm->rank, &lo, &hi);
    sum_slots(all, cm->world, (size_t)lo * (size_t)width, (size_t)(hi - lo) * (size_t)width, mine);
    return 0;
}

static int cpu_expert_gather(sm_comm *cm, int layer, const float *mine, int n, int width, float *out, sm_err *e) {
    int lo, hi;
    sm_shard_rows(n, cm->world, cm->rank, &lo, &hi);
    size_t cnt = (size_t)(hi - lo) * (size_t)width;
    slot *s = begin(cm, OP_EXPERT_GATHER, layer, n, width, 0, cnt, 0, e), *all;
    if (!s) return -1;
    if (cnt) memcpy(s->f, mine, sizeof(float) * cnt);
    if (!(all = meet(cm, s, e))) return -1;
    /* rank q's finalized rows go to rows [lo_q, hi_q) */
    for (int q = 0; q < cm->world; q++) {
        int a, b;
        sm_shard_rows(n, cm->world, q, &a, &b);
        if (b > a) memcpy(out + (int64_t)a * width, all[q].f, sizeof(float) * (size_t)(b - a) * (size_t)width);
    }
    return 0;
}

static int cpu_vocab_argmax(sm_comm *cm, const float *best, const int *best_id, int n, int *out, sm_err *e) {
    slot *s = begin(cm, OP_ARGMAX, -1, n, 0, 0, (size_t)n, (size_t)n, e), *all;
    if (!s) return -1;
    memcpy(s->f, best, sizeof(float) * (size_t)n);
    memcpy(s->i, best_id, sizeof(int) * (size_t)n);
    if (!(all = meet(cm, s, e))) return -1;
    /* first maximum in rank order: ranks hold increasing id blocks, so ties go to the lowest id */
    for (int i = 0; i < n; i++) {
        int id = -1, nonfinite = 0;
        float v = 0.0f;
        for (int q = 0; q < cm->world; q++) {
            int qi = all[q].i[i];
            nonfinite |= qi == -2;
            if (qi < 0) continue;
            if (id < 0 || all[q].f[i] > v) { id = qi; v = all[q].f[i]; }
        }
        out[i] = nonfinite ? -1 : id < 0 ? 0 : id;
    }
    return 0;
}

static const sm_comm_ops CPU_OPS = {
    cpu_embed_gather, cpu_attn_sum, cpu_pooled_gather, cpu_expert_sum, cpu_expert_scatter,
    cpu_expert_gather, cpu_unpooled_gather, cpu_vocab_gather, cpu_vocab_argmax, cpu_abort,
};

/* ---------------------------------------------------------------- lifetime */

int sm_comm_cpu_create(int world, double timeout_s, sm_comm_cpu **out, sm_err *e) {
    *out = NULL;
    if (world < 1 || world > SM_MAX_WORLD) return sm_errf(e, "comm: world %d is not in [1, %d]", world, SM_MAX_WORLD);
    sm_comm_cpu *w = calloc(1, sizeof *w);
    if (!w) return sm_errf(e, "comm: out of memory");
    w->world = world;
    w->timeout_s = timeout_s > 0 ? timeout_s : 600.0;
    w->slots = calloc(2 * (size_t)world, sizeof *w->slots);
    w->rs = calloc((size_t)world, sizeof *w->rs);
    w->h = calloc((size_t)world, sizeof *w->h);
    if (!w->slots || !w->rs || !w->h) {
        free(w->slots); free(w->rs); free(w->h); free(w);
        return sm_errf(e, "comm: out of memory for %d ranks", world);
    }
    sm_hbar_init(&w->bar, world);
    for (int r = 0; r < world; r++) {
        w->rs[r].w = w;
        w->rs[r].rank = r;
        w->h[r].rank = r;
        w->h[r].world = world;
        w->h[r].ops = &CPU_OPS;
        w->h[r].impl = &w->rs[r];
    }
    *out = w;
    return 0;
}

void sm_comm_cpu_destroy(sm_comm_cpu *w) {
    if (!w) return;
    for (int i = 0; i < 2 * w->world; i++) {
        free(w->slots[i].f);
        free(w->slots[i].i);
    }
    sm_hbar_destroy(&w->bar);
    free(w->slots);
    free(w->rs);
    free(w->h);
    free(w);
}

sm_comm *sm_comm_cpu_rank(sm_comm_cpu *w, int r) { return r >= 0 && r < w->world ? &w->h[r] : NULL; }

void sm_comm_cpu_jitter(sm_comm_cpu *w, uint64_t seed, int max_us) {
    w->jseed = seed;
    w->jmax_us = max_us;
}

int sm_comm_cpu_reset(sm_comm_cpu *w, int *who, char *msg, size_t cap) {
    /* no rank is inside an operation: the operation counts restart with the barrier */
    for (int r = 0; r < w->world; r++) w->rs[r].nops = 0;
    return sm_hbar_reset(&w->bar, who, msg, cap);
}
