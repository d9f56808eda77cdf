/* queue.cuh: the expert matmul as ONE persistent launch over a queue of units (device body),
 * the default schedule of the MoE stage (sm_cuda_moe_ws.sched = SM_MOE_SCHED_QUEUE).
 *
 * A unit is one item of mm.cuh (a job's group of MOE_WARPS tile pairs, a pair a warp, the whole
 * contraction) of stage 1 (gate_up + SiLU) or stage 2 (down).  The units of a call form one
 * list: every stage-1 unit (job-major), then every stage-2 unit (job-major).  A block claims
 * its next unit with one atomic on a counter of the workspace, late in its current unit, so
 * every SM streams to the end of the layer (one tail, not one per stage) and no block holds
 * work another could take.  A stage-2 unit of job j waits (bounded) until the job's stage-1
 * units have all signalled (done1[j]), its first weight loads already in flight (weights never
 * depend on activations).  Units are claimed in list order by running blocks only, so every
 * stage-1 unit a wait needs is held by a block that never waits: the wait always ends, however
 * many blocks are resident.
 *
 * The hot loop is mm.cuh's k step (three register buffers, loads two steps ahead, the same
 * dequant and mma, the same k order: the same bits as the stage schedule; MOE_F_MX8 adds an
 * L2 prefetch further ahead, moe_q_pf_step).  What a unit needs
 * of its job (weight offsets, slots, input rows, result factor) is one 64-byte entry of the
 * grouping's job table, copied by thread 0 (cp.async) into a ring of shared-memory slots while
 * the block streams; the warps read only shared memory at a unit switch.  The load cursor
 * crosses into the next unit two steps before the compute cursor, so the stream goes on
 * across the switch: the epilogue, the counter signal and the restage of B (the job's routes
 * only: the columns of the other lanes keep stale values whose outputs are never written) run
 * with the next unit's first two steps in flight.
 * W4A4 on the FP8 tensor cores (MOE_F_MX8) keeps B ready-made: stage 1's from h1's e4m3 image
 * (written by h1's producer, the pre-expert norm, or else by the grouping launch), stage 2's
 * from act's image per job (written by stage 1's epilogue), so B is copied, not converted, and
 * two B buffers let the next unit's copy (cp.async) start at the load cursor's crossing, while
 * the current unit still streams; the switch then only waits for copies already landed.
 * We rejected static item ranges (the stage schedule: at 8 rows some blocks get one item more
 * than others, and each stage ends in its own tail) and claiming the next unit at the start
 * of the current one (at the end of the queue a block then sits on a unit others could run).
 */
#ifndef SM_CUDA_MOE_QUEUE_CUH
#define SM_CUDA_MOE_QUEUE_CUH
#include "cuda/moe/mm.cuh"

#define MOE_Q_RING 4                  /* slots of unit metadata in shared memory */
#define MOE_Q_WAIT_NS 10000000000ull  /* bound of a stage-2 unit's wait for its job's stage 1 */

typedef struct moe_qargs {
    moe_args a1, a2;          /* stage 1 and stage 2 (moe_mm_make; a2.y32 for TP ranks) */
    const moe_jobt *jobt;     /* [njobs] the grouping's job table */
    int *done1;               /* [njobs] stage-1 units finished per job (zeroed by the grouping) */
    int *qctr;                /* units claimed (zeroed by the grouping) */
    unsigned long long *prof; /* NULL, or [SM_MOE_PROF_MAX_UNITS][3]: per unit its compute's begin
                                 and end (globaltimer ns, thread 0) and block (benchmarks) */
    uint8_t *act8;            /* MOE_F_MX8: [njobs] stage 2's B of each job, made by stage 1's
                                 epilogue (geom.cuh moe_wsl.act8); NULL for other formats */
    sm_x8_img h1i;            /* MOE_F_MX8: h1's image (its producer's or the grouping launch's) */
} moe_qargs;

/* One slot of the ring: unit u (-1: the queue is empty) with sequence number seq in the
 * block's list of units, and its job's entry. */
typedef struct moe_qslot {
    moe_jobt jt;
    int u;
    volatile int seq;         /* written last by thread 0; readers wait for their number */
    int ready;                /* MOE_F_MX8: the unit's B may be copied (a stage-2 unit: its job's
                                 stage 1 was complete when thread 0 published the slot, seen by
                                 its acquire, which the readers' seq wait orders before them) */
    int pad;
} moe_qslot;

/* The loop state of one thread. */
typedef struct moe_qstate {
    int cm, S, ns;            /* compute cursor: sequence number of the unit, its step, its steps */
    int u;                    /* the unit */
    int stage, job, itile;    /* the unit */
    int P1, P2, P3;           /* steps at which thread 0 claims, copies and publishes unit cm + A */
    int pu;                   /* thread 0: the unit it claimed */
    int cn, ce;               /* thread 0: next and end unit of its current chunk of claimed units */
    int done;                 /* the queue is empty: leave */
    float acc[2][4];
    moe_cur lc;               /* load cursor: pointers of the step to load next */
    int lm, LS, lns, live;    /* its unit's sequence number, step, steps; 0 once the queue is empty */
    int bcur;                 /* MOE_F_MX8: the B buffer of the compute cursor's unit (0, 1) */
    int bpre;                 /* this thread's copies of the next unit's B are in flight */
} moe_qstate;

/* Unit u -> (stage, job, tile group) in the list [stage 1 units | stage 2 units]. */
__device__ __forceinline__ void moe_q_decode(const moe_qargs &q, int n1, int u, int &stage, int &job, int &itile) {
    if (u < n1) {
        stage = 1; job = u / q.a1.ipj; itile = u - job * q.a1.ipj;
    } else {
        const int v = u - n1;
        stage = 2; job = v / q.a2.ipj; itile = v - job * q.a2.ipj;
    }
}

/* Wait until slot sl holds sequence number m (thread 0 publishes it during an earlier step). */
__device__ __forceinline__ void moe_q_await(const moe_qslot *sl, int m) {
    while (sl->seq != m) {
    }
    __threadfence_block();
}

/* The claim schedule of a call: the list's first nc * m units are claimed in chunks of m
 * consecutive units (one job's: m divides both stages' units per job), the rest one by one, so
 * a block restages B once per chunk while the end of the queue stays fine-grained. */
typedef struct moe_qplan {
    int n, n1;                /* units, stage-1 units */
    int m, nc;                /* units a chunk, chunks */
    int A;                    /* units published ahead of the compute cursor */
} moe_qplan;

__device__ __forceinline__ moe_qplan moe_q_plan(const moe_qargs &q, int nj, int nb) {
    moe_qplan P;
    P.n1 = nj * q.a1.ipj;
    P.n = P.n1 + nj * q.a2.ipj;
    /* chunks of 2 when the nb blocks get 16 units or more each on average (the last 2 nb units
     * single) */
    int m = P.n >= 16 * nb ? 2 : 1;
    if (q.a1.ipj % m || q.a2.ipj % m) m = 1;
    const int chunked = P.n - 2 * nb;
    P.m = m;
    P.nc = m > 1 && chunked > 0 ? chunked / m : 0;
    P.A = (q.a1.nsteps < 2 || q.a2.nsteps < 2) ? 2 : 1;
    return P;
}

/* Stage 2's input of job j is complete: its stage-1 units have all signalled. */
__device__ __forceinline__ int moe_q_ready1(const moe_qargs &q, int job) {
    return sm_ld_acquire_gpu_u32((const unsigned *)(q.done1 + job)) >= (unsigned)q.a1.ipj;
}

/* Thread 0, once per step before the loads: claim (P1), copy the job entry (P2) and publish
 * (P3) the unit of sequence number cm + A. */
template <int F>
__device__ __forceinline__ void moe_q_prep(moe_qstate &Q, const moe_qargs &q, moe_qslot *ring, const moe_qplan &P) {
    if (Q.S == Q.P1) {
        if (Q.cn >= Q.ce) { /* a new chunk (or single unit) */
            const int c = atomicAdd(q.qctr, 1);
            if (c < P.nc) { Q.cn = c * P.m; Q.ce = Q.cn + P.m; }
            else { Q.cn = P.nc * P.m + (c - P.nc); Q.ce = Q.cn + 1; }
        }
        Q.pu = Q.cn++;
    }
    moe_qslot *sl = ring + ((Q.cm + P.A) & (MOE_Q_RING - 1));
    if (Q.S == Q.P2 && Q.pu < P.n) {
        int st, job, it;
        moe_q_decode(q, P.n1, Q.pu, st, job, it);
        const uint4 *src = (const uint4 *)(q.jobt + job);
#pragma unroll
        for (int i = 0; i < 4; i++) sm_cp_async16((uint4 *)&sl->jt + i, src + i, 16);
        sm_cp_async_commit();
    }
    if (Q.S == Q.P3) {
        if (Q.pu < P.n) sm_cp_async_wait<0>();
        sl->u = Q.pu < P.n ? Q.pu : -1;
        if (F == MOE_F_MX8 && Q.pu < P.n) {
            int st, job, it;
            moe_q_decode(q, P.n1, Q.pu, st, job, it);
            sl->ready = st == 1 || moe_q_ready1(q, job);
        }
        __threadfence_block();
        sl->seq = Q.cm + P.A;
    }
}

/* The steps of the current unit at which thread 0 works on unit cm + A: with A = 1 as late as
 * the load cursor allows (it crosses at step ns - 2), 3 steps apart (atomic, then copy). */
__device__ __forceinline__ void moe_q_points(moe_qstate &Q, int A) {
    if (A == 2) {
        Q.P1 = Q.P2 = Q.P3 = 0;
    } else {
        Q.P3 = Q.ns > 3 ? Q.ns - 3 : 0;
        Q.P2 = Q.P3 > 3 ? Q.P3 - 3 : 0;
        Q.P1 = Q.P2 > 3 ? Q.P2 - 3 : 0;
    }
}

/* B buffer i: MOE_F_MX8 keeps two (the compute cursor's unit's and the next one's, copied
 * while the current unit streams); other formats one, staged at the switch. */
template <int F>
__device__ __forceinline__ uint2 *moe_q_bbuf(const moe_qargs &q, uint2 *Bs, int i) {
    if (F != MOE_F_MX8) return Bs;
    return (uint2 *)((uint8_t *)Bs + (size_t)i * moe_x8_bbuf(q.a1.Kp, q.a2.Kp));
}

/* MOE_F_MX8: issue this thread's cp.async copies of the B of a unit (stage st, job entry jt,
 * job) into dst, one commit group: stage 2 the job's act image (written in this launch,
 * ordered by done1: copies through L2 only), stage 1 the image rows of its routes (two 16-byte
 * core-matrix rows and a factor a 32-block and route).  Other formats: nothing, 0. */
template <int F>
__device__ __forceinline__ int moe_q_b_copy(const moe_qargs &q, int st, const moe_jobt &jt, int job, uint2 *dst_, int tid) {
    if (F != MOE_F_MX8) return 0;
    uint8_t *dst = (uint8_t *)dst_;
    /* (loops kept rolled: this code sits in each of the k loop's step copies) */
    if (st == 2) {
        const size_t bb = moe_x8_bbytes(q.a2.Kp);
        const uint4 *src = (const uint4 *)(q.act8 + (size_t)job * bb);
#pragma unroll 1
        for (int i = tid; i < (int)(bb / 16); i += MOE_THREADS) sm_cp_async16((uint4 *)dst + i, src + i, 16);
    } else {
        /* a thread keeps one route (r = tid & 7) and core matrix (tid >> 3 & 1): blocks
         * tid >> 4, + 16, ...; the factors: the threads of core matrix 0 */
        const int r = tid & 7, cm = (tid >> 3) & 1, nblk = q.a1.Kp / 32;
        if (r < jt.cnt) {
            const size_t row = jt.row[r];
            const uint8_t *cs = q.h1i.codes + row * q.h1i.kp + cm * 16;
            const float *fs = q.h1i.fac + row * (q.h1i.kp / 32);
#pragma unroll 1
            for (int blk = tid >> 4; blk < nblk; blk += MOE_THREADS / 16) {
                sm_cp_async16(dst + blk * MOE_X8_BLK + cm * 128 + r * 16, cs + blk * 32, 16);
                if (!cm) sm_cp_async4(dst + blk * MOE_X8_BLK + 256 + 4 * r, fs + blk);
            }
        }
    }
    sm_cp_async_commit();
    return 1;
}

/* L2 prefetch pf = q.a1.pf k steps ahead of the register loads (0: none), within the load
 * cursor's unit: after each step's loads the line pf steps on (a lane a 128-byte line of the
 * pair-step block), and at the crossing into a unit (after its step 0's loads and B copies, so
 * those do not queue behind it) its steps 2 .. pf at once.  More bytes in flight than the
 * register buffers hold, for a GPU whose read rate outruns them (bench/results.md).  MOE_F_MX8
 * only (moe.h sm_cuda_moe_ws.prefetch). */
template <int F>
__device__ __forceinline__ void moe_q_pf_step(const moe_qstate &Q, int pf, int sb, int lane) { /* after step LS - 1's loads */
    if (F == MOE_F_MX8 && pf && lane * 128 < sb && Q.LS - 1 + pf < Q.lns) moe_prefetch_l2(Q.lc.w + (size_t)(pf - 1) * sb + lane * 128);
}
__device__ __forceinline__ void moe_q_pf_burst(const moe_qstate &Q, int pf, int sb, int lane) { /* after step 0's loads */
    if (pf && lane * 128 < sb)
        for (int j = 2; j <= pf && j < Q.lns; j++) moe_prefetch_l2(Q.lc.w + (size_t)(j - 1) * sb + lane * 128);
}

/* Issue the loads of the next step of the load cursor (crossing into its next unit first when
 * the current one is loaded).  MOE_F_MX8 (units published one ahead, P.A = 1): at the crossing
 * the next unit's B, when it differs from the compute cursor's (another job or stage) and is
 * ready (moe_qslot.ready), starts copying into the other buffer (Q.bpre, the same in every
 * thread). */
template <int F>
__device__ __forceinline__ void moe_q_load(moe_qstate &Q, moe_buf &b, const moe_qargs &q, const moe_qslot *ring, const moe_qplan &P,
                                           uint2 *Bs, int warp, int lane, int tid) {
    if (!Q.live) return;
    if (Q.LS == Q.lns) {
        Q.lm++;
        const moe_qslot *sl = ring + (Q.lm & (MOE_Q_RING - 1));
        moe_q_await(sl, Q.lm);
        const int u = sl->u;
        if (u < 0) {
            Q.live = 0;
            return;
        }
        int st, job, it;
        moe_q_decode(q, P.n1, u, st, job, it);
        const int pairs = st == 1 ? q.a1.pairs : q.a2.pairs, ns = st == 1 ? q.a1.nsteps : q.a2.nsteps;
        int p = it * MOE_WARPS + warp;
        if (p >= pairs) p = 0; /* past the matrix: valid memory, outputs never written */
        Q.lc.w = q.a1.blob + sl->jt.w[st - 1] + (size_t)p * moe_pstride(ns, q.a1.sb);
        Q.lc.fs = (const float *)(q.a1.blob + sl->jt.s[st - 1]) + p * 32;
        Q.lns = ns;
        Q.LS = 0;
        if (F == MOE_F_MX8) {
            /* the weights first, the copies queue behind them.  (This branch's own load and
             * return, not one load path with the copy after it: on the H200 the latter made
             * this format's stage up to 2% slower, and the former the other formats' up to 8%
             * slower: bench/results.md.) */
            moe_load<F>(b, Q.lc, lane);
            Q.lc.w += q.a1.sb;
            Q.LS++;
            if (P.A == 1 && Q.lm == Q.cm + 1 && (st != Q.stage || job != Q.job) && sl->ready)
                Q.bpre = moe_q_b_copy<F>(q, st, sl->jt, job, moe_q_bbuf<F>(q, Bs, Q.bcur ^ 1), tid);
            if (Q.lm) moe_q_pf_burst(Q, q.a1.pf, q.a1.sb, lane); /* (not the block's first unit: its B copy follows) */
            return;
        }
    }
    moe_load<F>(b, Q.lc, lane);
    Q.lc.w += q.a1.sb;
    Q.LS++;
    moe_q_pf_step<F>(Q, q.a1.pf, q.a1.sb, lane);
}

/* A thread's share of a B restage in flight: MOE_Q_NB entries (k16 step ks, route r) of the
 * job's routes, loaded, not yet stored. */
#define MOE_Q_NB 2            /* entries a thread loads before it stores (4: spills, slower) */
typedef struct moe_qbe {
    uint4 A[MOE_Q_NB], B[MOE_Q_NB];
    int ks[MOE_Q_NB], r[MOE_Q_NB];
} moe_qbe;

/* Load entries u0 + h MOE_THREADS (h < MOE_Q_NB) of stage st's B for job entry jt
 * (route-major: a thread's 16-byte loads walk one row); past the end: zeros, not stored. */
template <int F>
__device__ __forceinline__ void moe_q_b_fetch(const moe_qargs &q, int st, const moe_jobt &jt, int u0, moe_qbe &E) {
    const int kin = st == 1 ? q.a1.kin : q.a2.kin, nks = (st == 1 ? q.a1.Kp : q.a2.Kp) / 16;
    const int total = nks * jt.cnt;
#pragma unroll
    for (int h = 0; h < MOE_Q_NB; h++) {
        const int u = u0 + h * MOE_THREADS;
        E.A[h] = make_uint4(0, 0, 0, 0); E.B[h] = E.A[h];
        E.r[h] = u / nks; E.ks[h] = u - E.r[h] * nks;
        if (u < total) {
            int ka, kb;
            moe_b_kofs<F>(E.ks[h], ka, kb);
            if (st == 1) { /* h1: written by an earlier launch */
                const uint16_t *row = q.a1.in + (size_t)jt.row[E.r[h]] * kin;
                if (ka < kin) E.A[h] = moe_ld_in<1>(row + ka);
                if (kb < kin) E.B[h] = moe_ld_in<1>(row + kb);
            } else { /* act: written in this launch (ordered by done1) */
                const uint16_t *row = q.a2.in + (size_t)(jt.s0 + E.r[h]) * kin;
                if (ka < kin) E.A[h] = moe_ld_in<0>(row + ka);
                if (kb < kin) E.B[h] = moe_ld_in<0>(row + kb);
            }
        }
    }
    /* W4A4 (h1 not rounded by its producer): a block's 4 groups are in 4 consecutive lanes
     * (route-major entries, nks and total multiples of 4: those lanes are all in this turn,
     * inside or past the total) */
    if (moe_is_mxb(F) && ((st == 1 ? q.a1.aq : q.a2.aq) & MOE_AQ_IN)) {
        const unsigned mask = 0xFu << ((threadIdx.x & 31) & ~3u);
#pragma unroll
        for (int h = 0; h < MOE_Q_NB; h++) moe_aq_round<1, 2>(E.A[h], E.B[h], mask);
    }
    /* W4A4 on the FP8 tensor cores: to e4m3 codes and the block's factor; a block's two halves
     * are in 2 consecutive lanes (nks even) */
    if (F == MOE_F_MX8) {
        const unsigned mask = 0x3u << ((threadIdx.x & 31) & ~1u);
        const int aq = (st == 1 ? q.a1.aq : q.a2.aq) & MOE_AQ_IN;
#pragma unroll
        for (int h = 0; h < MOE_Q_NB; h++) moe_x8_entry<1>(E.A[h], E.B[h], aq, mask);
    }
}

/* Store the fetched entries (those inside the job's total) in fragment order. */
template <int F>
__device__ __forceinline__ void moe_q_b_put(const moe_qargs &q, int st, const moe_jobt &jt, int u0, const moe_qbe &E, uint2 *Bs) {
    const int total = (st == 1 ? q.a1.Kp : q.a2.Kp) / 16 * jt.cnt;
#pragma unroll
    for (int h = 0; h < MOE_Q_NB; h++)
        if (u0 + h * MOE_THREADS < total) {
            if (F == MOE_F_MX8) moe_x8_put(E.A[h], E.B[h].x, Bs, E.ks[h], E.r[h]);
            else moe_b_put<F>(E.A[h], E.B[h], Bs + (size_t)(E.ks[h] * MOE_CH + E.r[h]) * 4);
        }
}

/* Stage B of the compute cursor's (new) unit into dst, unless its copies are in flight already
 * (Q.bpre): a stage-2 unit first waits (bounded) for its job's stage 1 (thread 0, then the
 * block); MOE_F_MX8 copies images, other formats load and convert the input rows (only the
 * job's cnt routes are written).  Ends with the block synchronized and B readable.
 * (Measured: loading a stage-1 job's first entries before the previous unit's epilogue gained
 * nothing; the MOE_F_MX8 copies during the unit before replace that.) */
template <int F>
__device__ __forceinline__ void moe_q_restage(const moe_qstate &Q, const moe_qargs &q, const moe_jobt &jt, uint2 *dst, int tid) {
    if (F != MOE_F_MX8 || !Q.bpre) {
        if (Q.stage == 2) {
            if (tid == 0 && !moe_q_ready1(q, Q.job)) {
                const uint64_t t0 = sm_now_ns();
                while (!moe_q_ready1(q, Q.job)) {
                    __nanosleep(128);
                    if (sm_now_ns() - t0 > MOE_Q_WAIT_NS) {
                        /* (no message with MOE_F_MX8: a call anywhere in the kernel makes ptxas
                         * serialize its wgmma) */
                        if (F != MOE_F_MX8)
                            printf("moe queue: block %d waited past %llu ns for job %d's gate_up units\n", (int)blockIdx.x,
                                   MOE_Q_WAIT_NS, Q.job);
                        __trap();
                    }
                }
            }
            __syncthreads();
        }
        if (!moe_q_b_copy<F>(q, Q.stage, jt, Q.job, dst, tid)) {
            const int st = Q.stage, total = (st == 1 ? q.a1.Kp : q.a2.Kp) / 16 * jt.cnt;
            for (int u0 = tid; u0 < total; u0 += MOE_Q_NB * MOE_THREADS) {
                moe_qbe E;
                moe_q_b_fetch<F>(q, st, jt, u0, E);
                moe_q_b_put<F>(q, st, jt, u0, E, dst);
            }
        }
    }
    if (F == MOE_F_MX8) sm_cp_async_wait<0>();
    moe_b_fence<F>();
    __syncthreads();
}

/* Profile: the compute of unit Q.u begins (its B staged). */
__device__ __forceinline__ void moe_q_prof_begin(const moe_qstate &Q, const moe_qargs &q, int tid) {
    if (q.prof && tid == 0 && Q.u < SM_MOE_PROF_MAX_UNITS) {
        q.prof[3 * Q.u] = sm_now_ns();
        q.prof[3 * Q.u + 2] = blockIdx.x;
    }
}

/* Profile: this block leaves. */
__device__ __forceinline__ void moe_q_prof_exit(const moe_qargs &q, int tid) {
    if (q.prof && tid == 0) atomicMax(q.prof + 3 * SM_MOE_PROF_MAX_UNITS + 1, (unsigned long long)sm_now_ns());
}

/* The compute cursor finished its unit: outputs, the stage-1 signal, the next unit (restaging
 * B on a new job or stage). */
template <int F, int Y32>
__device__ __forceinline__ void moe_q_unit_end(moe_qstate &Q, const moe_qargs &q, uint2 *Bs, const moe_qslot *ring, const moe_qplan &P,
                                               int warp, int lane, int tid) {
    if (q.prof && tid == 0 && Q.u < SM_MOE_PROF_MAX_UNITS) q.prof[3 * Q.u + 1] = sm_now_ns();
    const moe_qslot *cs = ring + (Q.cm & (MOE_Q_RING - 1));
    const int p = Q.itile * MOE_WARPS + warp;
    __shared__ __nv_bfloat162 amx[MOE_WARPS * MOE_CH / 2]; /* W4A4: the warps' act amax (moe_epilogue_at) */
    const sm_team tm = sm_team_block();
    if (Q.stage == 1)
        moe_epilogue_at<1, 0>(q.a1, p, cs->jt.s0, cs->jt.cnt, cs->jt.mul[0], lane, Q.acc, amx, &tm,
                              F == MOE_F_MX8 ? q.act8 + (size_t)Q.job * moe_x8_bbytes(q.a2.Kp) : NULL);
    else moe_epilogue_at<2, Y32>(q.a2, p, cs->jt.s0, cs->jt.cnt, cs->jt.mul[1], lane, Q.acc);
#pragma unroll
    for (int X = 0; X < 2; X++) Q.acc[X][0] = Q.acc[X][1] = Q.acc[X][2] = Q.acc[X][3] = 0.0f;
    Q.S = 0;
    __syncthreads(); /* every warp's outputs written, B no longer read */
    if (Q.stage == 1 && tid == 0) {
        __threadfence(); /* the block's act stores (ordered by the barrier) before the count */
        atomicAdd(q.done1 + Q.job, 1);
    }
    Q.cm++;
    const moe_qslot *sl = ring + (Q.cm & (MOE_Q_RING - 1));
    moe_q_await(sl, Q.cm);
    const int u = sl->u;
    if (u < 0) {
        Q.done = 1;
        return;
    }
    const int ost = Q.stage, ojob = Q.job;
    Q.u = u;
    moe_q_decode(q, P.n1, u, Q.stage, Q.job, Q.itile);
    Q.ns = Q.stage == 1 ? q.a1.nsteps : q.a2.nsteps;
    if (Q.stage != ost || Q.job != ojob) {
        if (F == MOE_F_MX8) Q.bcur ^= 1;
        moe_q_restage<F>(Q, q, sl->jt, moe_q_bbuf<F>(q, Bs, Q.bcur), tid);
        Q.bpre = 0;
    }
    moe_q_points(Q, P.A);
    moe_q_prof_begin(Q, q, tid);
}

template <int F, int Y32>
__device__ __forceinline__ void moe_q_step(moe_qstate &Q, const moe_buf &cur, moe_buf &n2, const moe_qargs &q, uint2 *Bs,
                                           moe_qslot *ring, const moe_qplan &P, int warp, int lane, int tid) {
    if (tid == 0) moe_q_prep<F>(Q, q, ring, P);
    moe_q_load<F>(Q, n2, q, ring, P, Bs, warp, lane, tid);
    moe_compute<F>(cur, Q.S, moe_q_bbuf<F>(q, Bs, Q.bcur), lane, Q.acc);
    if (++Q.S == Q.ns) moe_q_unit_end<F, Y32>(Q, q, Bs, ring, P, warp, lane, tid);
}

/* Run the expert matmul of a call (both stages) as one block of the queue schedule: the whole
 * block (MOE_THREADS threads) calls it; Bs: moe_q_smem(q) bytes of shared memory, ring:
 * MOE_Q_RING slots.  Needs the grouping complete (njobs, jobs, slots, job
 * table, zeroed counters); h1 written by an earlier launch.  Y32: as moe_mm_block's. */
template <int F, int Y32>
__device__ __forceinline__ void moe_q_block(const moe_qargs &q, uint2 *Bs, moe_qslot *ring, int nb) {
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (q.prof && tid == 0) atomicMin(q.prof + 3 * SM_MOE_PROF_MAX_UNITS, (unsigned long long)sm_now_ns());
    const moe_qplan P = moe_q_plan(q, *q.a1.njobs, nb);
    moe_qstate Q;
    Q.cm = 0; Q.S = 0; Q.done = 0; Q.pu = 0; Q.cn = Q.ce = 0;
    if (tid == 0) {
        for (int m = 0; m < MOE_Q_RING; m++) ring[m].seq = -1;
        for (int m = 0; m < P.A; m++) { /* the first A units, claimed and published at once */
            Q.P1 = Q.P2 = Q.P3 = 0;
            Q.cm = m - P.A;
            moe_q_prep<F>(Q, q, ring, P);
        }
        Q.cm = 0;
    }
    __syncthreads();
    const moe_qslot *s0 = ring;
    if (s0->u < 0) {
        moe_q_prof_exit(q, tid);
        return;
    }
    Q.u = s0->u;
    moe_q_decode(q, P.n1, s0->u, Q.stage, Q.job, Q.itile);
    Q.ns = Q.stage == 1 ? q.a1.nsteps : q.a2.nsteps;
#pragma unroll
    for (int X = 0; X < 2; X++) Q.acc[X][0] = Q.acc[X][1] = Q.acc[X][2] = Q.acc[X][3] = 0.0f;
    Q.lm = -1; Q.LS = 0; Q.lns = 0; Q.live = 1;
    Q.lc.w = q.a1.blob; Q.lc.fs = (const float *)q.a1.blob;
    Q.bcur = 0; Q.bpre = 0;
    moe_buf X, Y, Z;
    moe_q_load<F>(Q, X, q, ring, P, Bs, warp, lane, tid);
    moe_q_load<F>(Q, Y, q, ring, P, Bs, warp, lane, tid);
    moe_q_restage<F>(Q, q, s0->jt, moe_q_bbuf<F>(q, Bs, 0), tid);
    moe_q_points(Q, P.A);
    moe_q_prof_begin(Q, q, tid);
    /* three register buffers in rotation: a step computes one while the next two are in flight */
    for (;;) {
        moe_q_step<F, Y32>(Q, X, Z, q, Bs, ring, P, warp, lane, tid);
        if (Q.done) break;
        moe_q_step<F, Y32>(Q, Y, X, q, Bs, ring, P, warp, lane, tid);
        if (Q.done) break;
        moe_q_step<F, Y32>(Q, Z, Y, q, Bs, ring, P, warp, lane, tid);
        if (Q.done) break;
    }
    moe_q_prof_exit(q, tid);
}

/* ---- host side (mm.cu) ---- */
/* The queue schedule's arguments for layer L, input h1 of n rows, workspace ws (y32: as
 * moe_mm_launch). */
moe_qargs moe_q_make(const sm_cuda_moe_layer *L, const uint16_t *h1, int n, const sm_cuda_moe_ws *ws, float *y32);
/* Dynamic shared memory of a queue block: the B buffers (two for MOE_F_MX8, q.act8). */
size_t moe_q_smem(const moe_qargs &q);

#endif
