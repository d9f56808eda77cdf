/* test_comm.c: the CPU communicator (src/parallel/comm.h, src/cpu/comm_cpu.c; docs/parallelism.md).
 *
 * Properties: every cross-rank operation equals a serial rank-ordered reference bit for bit
 * under random arrival orders, and every rank fails (no hang) on divergent calls, an abort
 * and a timeout.  W = 3 ranks on threads, rows of mixed magnitudes; no model (test_world.c
 * tests the world backend built on this communicator).
 */
#include "check.h"
#include "model/rng.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t xs64(uint64_t *s) { return sm_rng_next(s); } /* the one generator (rng.h) */

#define CW 3
#define CN 5    /* rows */
#define CB 7    /* block width */

typedef struct comm_case {
    sm_comm_cpu *w;
    int rank;
    int mode;        /* 0: every op; 1: rank 1 calls a different op; 2: rank 2 aborts; 3: rank 1 never calls */
    int rc[4];       /* per operation: return codes */
    char msg[1024];
    float attn[CN * CB], pooled[CN * CB * CW], esum[CN * CB], mine[CN * CB], gath[CN * CB], vocab[CN * CB * CW];
    float emb[CN * CB];
    int am[CN];
} comm_case;

/* Deterministic part of rank r for op `op`: value (op, r, i) with mixed magnitudes. */
static float part_val(int op, int r, int i) {
    uint64_t s = 0x9E37u + (uint64_t)op * 1000003u + (uint64_t)r * 7919u + (uint64_t)i * 104729u;
    for (int k = 0; k < 3; k++) xs64(&s);
    double u = (double)(s >> 11) / 9007199254740992.0 - 0.5;
    return (float)(u * pow(10.0, (double)(int)(s % 7) - 3));
}

static const int g_ctok[CN] = {0, 18, 8, 20, 13}; /* owners 0, 2, 1, 2, 1 */

static void *comm_rank(void *arg) {
    comm_case *k = arg;
    sm_comm *cm = sm_comm_cpu_rank(k->w, k->rank);
    sm_err e = {""};
    int r = k->rank;
    if (k->mode == 3 && r == 1) return NULL;
    if (k->mode == 2 && r == 2) { cm->ops->abort(cm, "rank 2 ran out of luck"); return NULL; }
    /* attention partial sum */
    for (int i = 0; i < CN * CB; i++) k->attn[i] = part_val(0, r, i);
    if (k->mode == 1 && r == 1) k->rc[0] = cm->ops->pooled_gather(cm, 0, k->attn, CN, CB, k->pooled, &e);
    else k->rc[0] = cm->ops->attn_sum(cm, 0, k->attn, CN, CB, &e);
    if (k->rc[0]) { snprintf(k->msg, sizeof k->msg, "%s", e.msg); return NULL; }
    /* pooled gather */
    float blk[CN * CB];
    for (int i = 0; i < CN * CB; i++) blk[i] = part_val(1, r, i);
    k->rc[1] = cm->ops->pooled_gather(cm, 1, blk, CN, CB, k->pooled, &e);
    /* token-sharded finalize: scatter then gather */
    float part[CN * CB];
    for (int i = 0; i < CN * CB; i++) part[i] = part_val(2, r, i);
    k->rc[2] = cm->ops->expert_scatter(cm, 1, part, CN, CB, k->mine, &e);
    int lo, hi;
    sm_shard_rows(CN, CW, r, &lo, &hi);
    float fin[CN * CB];
    for (int i = 0; i < (hi - lo) * CB; i++) fin[i] = k->mine[i] * 2.0f;
    k->rc[2] |= cm->ops->expert_gather(cm, 1, fin, CN, CB, k->gath, &e);
    /* vocabulary: embedding rows, logits gather (rank 0 only), argmax */
    for (int i = 0; i < CN; i++)
        for (int x = 0; x < CB; x++) k->emb[i * CB + x] = g_ctok[i] / 7 == r ? part_val(3, r, i * CB + x) : 0.0f;
    k->rc[3] = cm->ops->embed_gather(cm, g_ctok, CN, CB, 7, k->emb, &e);
    float lg[CN * CB], best[CN];
    int bid[CN];
    for (int i = 0; i < CN; i++) {
        for (int x = 0; x < CB; x++) lg[i * CB + x] = (float)((i + x + r) % 4);
        best[i] = 3.0f;                     /* every rank has a 3: ties go to rank 0's id */
        bid[i] = r * CB + (3 - i % 4 + 4) % 4;
        if (r == 2 && i == 4) best[i] = 5.0f;
        if (r == 1 && i == 3) bid[i] = -1;  /* rank 1 has no valid id for row 3 */
    }
    k->rc[3] |= cm->ops->vocab_gather(cm, lg, CN, CB, r == 0 ? k->vocab : NULL, &e);
    k->rc[3] |= cm->ops->vocab_argmax(cm, best, bid, CN, k->am, &e);
    if (k->rc[1] || k->rc[2] || k->rc[3]) snprintf(k->msg, sizeof k->msg, "%s", e.msg);
    return NULL;
}

static void comm_run(comm_case *k, int mode, uint64_t jitter, double timeout) {
    sm_comm_cpu *w;
    sm_err e = {""};
    if (sm_comm_cpu_create(CW, timeout, &w, &e)) { CHECK(0, "%s", e.msg); return; }
    sm_comm_cpu_jitter(w, jitter, 300);
    pthread_t th[CW];
    for (int r = 0; r < CW; r++) {
        memset(&k[r], 0, sizeof k[r]);
        k[r].w = w, k[r].rank = r, k[r].mode = mode;
        pthread_create(&th[r], NULL, comm_rank, &k[r]);
    }
    for (int r = 0; r < CW; r++) pthread_join(th[r], NULL);
    int who = -2;
    char msg[512] = "";
    int ab = sm_comm_cpu_reset(w, &who, msg, sizeof msg);
    if (mode == 0) CHECK(ab == 0, "abort in a clean run: %s", msg);
    if (mode == 2) CHECK(ab == 1 && who == 2 && strstr(msg, "out of luck"), "abort record: %d %d %s", ab, who, msg);
    sm_comm_cpu_destroy(w);
}

static void t_comm_ops(void) {
    comm_case k[CW], k2[CW];
    comm_run(k, 0, 0, 0);
    for (int r = 0; r < CW; r++) CHECK(!k[r].rc[0] && !k[r].rc[1] && !k[r].rc[2] && !k[r].rc[3], "rank %d: %s", r, k[r].msg);
    /* serial references: sums in rank order, blocks at rank positions */
    int bad = 0;
    for (int i = 0; i < CN * CB; i++) {
        float s = part_val(0, 0, i);
        for (int q = 1; q < CW; q++) s += part_val(0, q, i);
        for (int r = 0; r < CW; r++) bad += memcmp(&s, &k[r].attn[i], 4) != 0;
    }
    CHECK(bad == 0, "attn_sum: %d values differ from the rank-ordered sum", bad);
    bad = 0;
    for (int r = 0; r < CW; r++)
        for (int i = 0; i < CN; i++)
            for (int q = 0; q < CW; q++)
                for (int x = 0; x < CB; x++) bad += k[r].pooled[(i * CW + q) * CB + x] != part_val(1, q, i * CB + x);
    CHECK(bad == 0, "pooled_gather: %d values misplaced", bad);
    bad = 0;
    for (int r = 0; r < CW; r++)
        for (int i = 0; i < CN * CB; i++) {
            float s = part_val(2, 0, i);
            for (int q = 1; q < CW; q++) s += part_val(2, q, i);
            s *= 2.0f;
            bad += memcmp(&s, &k[r].gath[i], 4) != 0;
        }
    CHECK(bad == 0, "expert_scatter + expert_gather: %d values differ", bad);
    bad = 0;
    for (int r = 0; r < CW; r++)
        for (int i = 0; i < CN; i++)
            for (int x = 0; x < CB; x++) bad += k[r].emb[i * CB + x] != part_val(3, g_ctok[i] / 7, i * CB + x);
    CHECK(bad == 0, "embed_gather: %d values differ", bad);
    bad = 0;
    for (int i = 0; i < CN; i++)
        for (int q = 0; q < CW; q++)
            for (int x = 0; x < CB; x++) bad += k[0].vocab[i * CW * CB + q * CB + x] != (float)((i + x + q) % 4);
    CHECK(bad == 0, "vocab_gather: %d values differ", bad);
    for (int r = 0; r < CW; r++) {
        int want[CN];
        for (int i = 0; i < CN; i++) want[i] = (3 - i % 4 + 4) % 4; /* rank 0's id of the tie */
        want[4] = 2 * CB + (3 - 4 % 4 + 4) % 4;                      /* rank 2's larger maximum */
        CHECK(memcmp(want, k[r].am, sizeof want) == 0, "vocab_argmax rank %d: %d %d %d %d %d", r, k[r].am[0], k[r].am[1],
              k[r].am[2], k[r].am[3], k[r].am[4]);
    }
    /* random arrival orders: every result bit-identical */
    for (uint64_t seed = 1; seed <= 3; seed++) {
        comm_run(k2, 0, seed, 0);
        for (int r = 0; r < CW; r++)
            CHECK(!memcmp(k[r].attn, k2[r].attn, sizeof k[r].attn) && !memcmp(k[r].gath, k2[r].gath, sizeof k[r].gath) &&
                      !memcmp(k[r].pooled, k2[r].pooled, sizeof k[r].pooled) && !memcmp(k[r].am, k2[r].am, sizeof k[r].am),
                  "seed %llu rank %d: results differ", (unsigned long long)seed, r);
    }
}

static void t_comm_failures(void) {
    comm_case k[CW];
    /* divergent calls: every rank fails, naming both calls */
    comm_run(k, 1, 5, 0);
    for (int r = 0; r < CW; r++)
        CHECK(k[r].rc[0] != 0 && strstr(k[r].msg, "diverged") && strstr(k[r].msg, "pooled_gather") &&
                  strstr(k[r].msg, "attn_sum"), "rank %d: rc %d: %s", r, k[r].rc[0], k[r].msg);
    printf("  divergence: %s\n", k[0].msg);
    /* a rank aborts: the others fail naming it */
    comm_run(k, 2, 0, 0);
    for (int r = 0; r < 2; r++)
        CHECK(k[r].rc[0] != 0 && strstr(k[r].msg, "aborted by rank 2") && strstr(k[r].msg, "out of luck"), "rank %d: %s", r,
              k[r].msg);
    /* a rank never arrives: bounded wait, the missing rank named */
    comm_run(k, 3, 0, 0.2);
    for (int r = 0; r < CW; r += 2)
        CHECK(k[r].rc[0] != 0 && strstr(k[r].msg, "ranks not arrived: 1"), "rank %d: %s", r, k[r].msg);
    printf("  timeout: %s\n", k[0].msg);
}

int main(void) {
    RUN(t_comm_ops);
    RUN(t_comm_failures);
    return TEST_DONE();
}
