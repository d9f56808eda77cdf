/* gc.cuh: the state of a GPU communication world (gcomm.h), shared by the files of
 * src/cuda/comm/: world.cu (creation, destruction, begin, the virtual ranks' host barrier,
 * health), ops.cu (the put / wait / finish kernels and the operations), nccl.cu (the NCCL
 * transport, loaded with dlopen).  CUDA types allowed: included by .cu files only.
 *
 * Everything lives in one world struct and its per-rank structs: no file statics, so several
 * worlds (tests: W = 1, 2, 4, 8 one after the other) never share state.  We rejected one
 * struct per transport: both transports use the same finish kernels, health words and step
 * counter, only the way the parts reach the slots differs.
 */
#ifndef SM_CUDA_COMM_GC_CUH
#define SM_CUDA_COMM_GC_CUH
#include <pthread.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <nccl.h>              /* types only: the library is loaded with dlopen (nccl.cu) */
#include "cuda/comm/gcomm.h"
#include "parallel/hbar.h"
#include "cuda/common.cuh"

#define GC_EPOCH_OPS 4096      /* operations of one chunk: epoch = step * 4096 + i */

/* The rank's device health words (uint64 each), written by the first wait that ran out. */
enum { GC_H_FAILED, GC_H_RANK, GC_H_LAYER, GC_H_OP, GC_H_PEER, GC_H_EPOCH, GC_H_WAITED_NS, GC_H_N };
/* Op tag of the chunk-start barrier of sm_gcomm_begin (distinct devices) in health words. */
#define GC_OP_BEGIN SM_GC_NOPS

struct sm_gcomm {                 /* one rank */
    sm_gcomm_world *w;            /* its world */
    int r;                        /* rank, 0..W-1 */
    int dev;                      /* CUDA device */
    uint8_t *recv;                /* peer: [2][W][slot] bytes, this rank's receive area (own device) */
    uint64_t *flags;              /* peer: [2][W] epochs released by each sender (own device) */
    uint64_t *bflags;             /* peer, distinct devices: [W] step published by each rank's begin */
    uint8_t **peer_recv;          /* device array [W]: every rank's recv (peer pointers) */
    uint64_t **peer_flags;        /* device array [W]: every rank's flags */
    uint64_t **peer_bflags;       /* device array [W]: every rank's bflags */
    uint64_t *step;               /* device counter, incremented by begin */
    unsigned int *arrive;         /* device: blocks of the current put done (reset by the last) */
    uint64_t *health;             /* device [GC_H_N] */
    uint64_t *health_host;        /* pinned [GC_H_N], filled by sm_gcomm_health_fetch */
    uint8_t *gbuf;                /* nccl: [W][max_bytes] all-gather buffer (own device) */
    uint8_t *stage;               /* nccl: [max_bytes] contiguous send part (argmax) */
    ncclComm_t nccl_comm;         /* nccl: this rank's communicator, or NULL */
    cudaEvent_t ev[2];            /* virtual: put done, by parity */
    cudaEvent_t evb;              /* virtual: the previous chunk done (begin) */
    unsigned i;                   /* operations since the last begin (host; the epoch's low part) */
    int begun;                    /* 1 once begin was called (an operation before it is refused) */
    int faulted;                  /* fault injection fired: puts stop releasing flags */
};

typedef struct gc_nccl_api {      /* libnccl.so.2 entry points (nccl.cu) */
    void *lib;                    /* dlopen handle, NULL: not loaded */
    ncclResult_t (*init_all)(ncclComm_t *comms, int ndev, const int *devlist);
    ncclResult_t (*all_gather)(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                               cudaStream_t st);
    ncclResult_t (*destroy)(ncclComm_t comm);
    const char *(*errstr)(ncclResult_t rc);
} gc_nccl_api;

struct sm_gcomm_world {
    int W;                        /* ranks */
    int kind;                     /* SM_GCOMM_PEER or SM_GCOMM_NCCL */
    int virt;                     /* 1: some device holds several ranks */
    size_t max_bytes;             /* most bytes of one rank's part */
    size_t slot;                  /* bytes of one receive slot: max_bytes rounded up to 16 */
    double bound_ms;              /* longest wait of a take / host barrier */
    int fault_rank, fault_layer, fault_op; /* SPARKMONO_COMM_FAULT, fault_rank -1: none */
    gc_nccl_api nccl;             /* kind nccl */
    sm_gcomm *ranks;              /* [W] */
    sm_hbar bar;                  /* virtual ranks' host barrier, abortable (src/parallel/hbar.h) */
};

/* The wait of one take, passed by value to the finish kernels (active 0: no wait, nccl). */
typedef struct gc_wait {
    const uint64_t *flags;        /* this rank's flags [2][W] */
    const uint64_t *step;         /* this rank's step counter */
    uint64_t *health;             /* this rank's health words */
    unsigned long long bound_ns;  /* longest wait */
    unsigned i;                   /* operation index since begin */
    int r, W, layer, op;          /* for the health record */
    int active;                   /* 1: wait for the W flags of parity i & 1 */
} gc_wait;

/* world.cu */
int gc_host_barrier(sm_gcomm *gc, int op, int layer, sm_err *e);
/* nccl.cu */
int gc_nccl_load(gc_nccl_api *api, sm_err *e);
void gc_nccl_unload(gc_nccl_api *api);
int gc_nccl_init(sm_gcomm_world *w, const int *devices, sm_err *e);   /* every rank's comm */
void gc_nccl_fini(sm_gcomm_world *w);
int gc_nccl_gather(sm_gcomm *gc, const void *part, size_t bytes, cudaStream_t st, sm_err *e);

/* ---- device helpers (used by ops.cu and world.cu) ---- */
/* Record a wait that ran out; only the first record of the rank stays. */
__device__ __forceinline__ void gc_record(uint64_t *h, int r, int layer, int op, int peer, uint64_t epoch,
                                          uint64_t waited_ns) {
    if (atomicCAS((unsigned long long *)&h[GC_H_FAILED], 0ull, 1ull) == 0ull) {
        volatile uint64_t *v = h;
        v[GC_H_RANK] = (uint64_t)r;
        v[GC_H_LAYER] = (uint64_t)(int64_t)layer;
        v[GC_H_OP] = (uint64_t)op;
        v[GC_H_PEER] = (uint64_t)peer;
        v[GC_H_EPOCH] = epoch;
        v[GC_H_WAITED_NS] = waited_ns;
        __threadfence_system();
    }
}
/* Thread t < n waits until *flag(t) satisfies want (ge: >=, else ==), at most bound_ns; returns 0,
 * or 1 when it ran out (recorded) or the rank had already failed. */
__device__ __forceinline__ int gc_spin(const uint64_t *flag, uint64_t want, int ge, uint64_t *h,
                                       unsigned long long bound_ns, int r, int layer, int op, int peer) {
    volatile const uint64_t *failed = h + GC_H_FAILED;
    if (*failed) return 1;
    uint64_t t0 = sm_now_ns();
    for (unsigned spins = 1;; spins++) {
        uint64_t v = sm_ld_acquire_sys_u64(flag);
        if (ge ? v >= want : v == want) return 0;
        if ((spins & 31u) == 0) {
            if (*failed) return 1;
            uint64_t dt = sm_now_ns() - t0;
            if (dt > bound_ns) {
                gc_record(h, r, layer, op, peer, want, dt);
                return 1;
            }
        }
        __nanosleep(100);
    }
}
#endif
