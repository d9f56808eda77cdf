/* hbar.c: the bounded, abortable barrier of hbar.h (one mutex, one condition, a generation). */
#include "parallel/hbar.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void sm_hbar_init(sm_hbar *b, int n) {
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->n = n;
    b->abort_rank = -1;
}

void sm_hbar_destroy(sm_hbar *b) {
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
}

static void abort_locked(sm_hbar *b, int rank, const char *why) {
    if (!b->aborted) {
        b->aborted = 1;
        b->abort_rank = rank;
        snprintf(b->abort_msg, sizeof b->abort_msg, "%s", why);
    }
    pthread_cond_broadcast(&b->cv);
}

void sm_hbar_abort(sm_hbar *b, int rank, const char *why) {
    pthread_mutex_lock(&b->mu);
    abort_locked(b, rank, why);
    pthread_mutex_unlock(&b->mu);
}

int sm_hbar_wait(sm_hbar *b, int rank, double timeout_s, const char *what, int *who, char *msg, size_t cap) {
    pthread_mutex_lock(&b->mu);
    if (!b->aborted) {
        uint64_t my = b->gen;
        b->arrived++;
        b->arrived_mask |= 1ull << rank;
        if (b->arrived == b->n) {
            b->arrived = 0;
            b->arrived_mask = 0;
            b->gen++;
            pthread_cond_broadcast(&b->cv);
            pthread_mutex_unlock(&b->mu);
            return 0;
        }
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += (time_t)timeout_s;
        dl.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        while (b->gen == my && !b->aborted) {
            int rc = pthread_cond_timedwait(&b->cv, &b->mu, &dl);
            if (rc == ETIMEDOUT && b->gen == my && !b->aborted) {
                char why[512], miss[256] = "";
                size_t k = 0;
                for (int q = 0; q < b->n && k < sizeof miss - 8; q++)
                    if (!(b->arrived_mask >> q & 1)) k += (size_t)snprintf(miss + k, sizeof miss - k, " %d", q);
                snprintf(why, sizeof why, "%s: rank %d waited more than %.3g s; ranks not arrived:%s", what, rank, timeout_s, miss);
                abort_locked(b, -1, why);
            }
        }
        if (b->gen != my) { /* completed (an abort after it concerns later waits) */
            pthread_mutex_unlock(&b->mu);
            return 0;
        }
    }
    if (who) *who = b->abort_rank;
    if (msg && cap) snprintf(msg, cap, "%s", b->abort_msg);
    pthread_mutex_unlock(&b->mu);
    return -1;
}

int sm_hbar_reset(sm_hbar *b, int *who, char *msg, size_t cap) {
    pthread_mutex_lock(&b->mu);
    int was = b->aborted;
    if (was) {
        if (who) *who = b->abort_rank;
        if (msg && cap) snprintf(msg, cap, "%s", b->abort_msg);
    }
    b->aborted = 0;
    b->abort_rank = -1;
    b->abort_msg[0] = 0;
    b->arrived = 0;
    b->arrived_mask = 0;
    b->gen++;
    pthread_mutex_unlock(&b->mu);
    return was;
}
