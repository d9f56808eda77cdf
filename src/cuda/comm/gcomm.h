/* gcomm.h: the cross-rank operations of src/parallel/comm.h between W GPU ranks, stream-ordered on
 * each rank's device (docs/parallelism.md, "The GPU path").  Included by .cu files and C tests
 * (plain C under extern "C"; CUDA runtime types only).
 *
 * A world of W ranks is created once (sm_gcomm_create) from a device list: distinct devices
 * (one GPU per rank) or repeated ones ("virtual ranks": several ranks on one GPU, each with its
 * own stream, buffers and flags).  Each rank's host thread calls the operations below with its
 * own handle (sm_gcomm_rank) and stream, in the same order with the same shapes on every rank
 * (the shapes come from replicated state).  Every call only ENQUEUES work: the result is
 * complete on the rank's stream after the call's kernels, with no host synchronization, so a
 * rank's whole step can be captured in a CUDA graph (distinct devices).
 *
 * Two transports, chosen at creation:
 *  - SM_GCOMM_PEER: one-shot kernels over peer memory.  Every rank owns a receive area of
 *    2 parities x W slots in its device memory; "put" writes this rank's part into slot r of
 *    every rank's area (peer stores, P2P access between distinct devices), then releases a
 *    flag per receiver tagged with the operation's epoch; "take" waits (acquire loads) for the
 *    W flags of its parity, at most bound_ms, then reduces or rearranges the slots in rank order
 *    0..W-1.  A wait that runs out records (rank, layer, op, peer, epoch, waited ms) in the
 *    rank's device health words and leaves (the output untouched); every later wait of that
 *    rank is skipped (its operations too), so a dead or stalled peer costs one bound, never a
 *    hang.  Two parities suffice: a rank rewrites parity p only after its next take completed,
 *    which needs every rank's next put, which each rank enqueues after its own take of the
 *    previous operation.
 *  - SM_GCOMM_NCCL: an all-gather of the parts (ncclAllGather; libnccl.so.2 loaded at run
 *    time, its absence named in one line) into the same slot layout, then the same rank-order
 *    finish kernels: NCCL's own reduction order is not fixed, ours is.
 * Virtual ranks (peer only; NCCL refuses a duplicated device): kernels on different streams of
 * one GPU are not guaranteed to run at the same time, so a rank's take is never enqueued before
 * every rank's put: at each operation the rank threads meet at a bounded host barrier (put,
 * record an event, barrier, wait on every rank's event, take).  The device flags are still
 * written, waited on and bounded, so the fault path is the same as on distinct devices.
 *
 * Epochs: sm_gcomm_begin enqueues the increment of the rank's device step counter; the i-th
 * operation after it uses epoch step * 4096 + i (i < 4096) and parity i & 1 (i is a kernel
 * argument, the step is read on the device: a captured chunk replays with the current step).
 * Every rank calls begin once per chunk of a step, before its first operation.  Since parities
 * restart at every begin, begin also orders the chunk's first put after every rank's last take
 * of the previous chunk: distinct devices meet at a bounded device barrier inside begin's
 * kernel (begin flags; a timeout is recorded like a take's, op "begin", layer -1), virtual
 * ranks at the host barrier followed by waits on every rank's event.  Every wait is bounded, so
 * the ranks must reach each operation (the first one included) within bound_ms of each other.
 * Virtual ranks cannot be captured in a graph (their host barrier and cross-stream events).
 *
 * NVLink multicast (NVLS) is never used: the creation sets NCCL_NVLS_ENABLE=0 before NCCL
 * starts.
 */
#ifndef SM_CUDA_GCOMM_H
#define SM_CUDA_GCOMM_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "base/err.h"

#define SM_GCOMM_PEER 0
#define SM_GCOMM_NCCL 1

/* Operation tags (messages, health words, fault injection): the names of src/parallel/comm.h. */
typedef enum sm_gcomm_op {
    SM_GC_EMBED = 0,      /* embed_gather */
    SM_GC_ATTN,           /* attn_sum */
    SM_GC_POOLED,         /* pooled_gather */
    SM_GC_EXPERT,         /* expert_sum */
    SM_GC_UNPOOLED,       /* unpooled_gather */
    SM_GC_VOCAB,          /* vocab_gather */
    SM_GC_ARGMAX,         /* vocab_argmax */
    SM_GC_NOPS
} sm_gcomm_op;
const char *sm_gcomm_op_name(int op);   /* "attn_sum", ...; SM_GC_NOPS: "begin" (health words) */

typedef struct sm_gcomm_world sm_gcomm_world;
typedef struct sm_gcomm sm_gcomm;       /* one rank's handle */

typedef struct sm_gcomm_opts {
    int world;               /* ranks, 1..64 */
    const int *devices;      /* [world] CUDA device of each rank; a repeated device: virtual ranks */
    int kind;                /* SM_GCOMM_PEER or SM_GCOMM_NCCL */
    size_t max_bytes;        /* most bytes one rank contributes to one operation */
    double bound_ms;         /* longest wait of one take (and of the virtual host barrier);
                                <= 0: SPARKMONO_COMM_BOUND_MS from the environment, else 2000 */
} sm_gcomm_opts;

/* Create the world: per rank a receive area of 2 x W x max_bytes (peer) or an all-gather buffer
 * of W x max_bytes (nccl) on its device, flags, health words; P2P access between distinct
 * devices (peer); the NCCL communicators (nccl).  Refusals, one line listing every reason:
 * a device that does not exist, peer with two distinct devices lacking P2P access, nccl with a
 * repeated device ("NCCL refuses a duplicated device: use --comm peer for virtual ranks") or
 * more ranks than devices, nccl without libnccl.so.2.  Test hook: SPARKMONO_COMM_FAULT=r:l:op
 * (op a name of sm_gcomm_op_name) makes rank r stop publishing from layer l's operation op on
 * (peer transport only: its puts still copy the data, but never release the flags).  A malformed
 * SPARKMONO_COMM_FAULT or SPARKMONO_COMM_BOUND_MS is a refusal too. */
int sm_gcomm_create(const sm_gcomm_opts *o, sm_gcomm_world **out, sm_err *e);
void sm_gcomm_destroy(sm_gcomm_world *w);
sm_gcomm *sm_gcomm_rank(sm_gcomm_world *w, int r);
int sm_gcomm_is_virtual(const sm_gcomm_world *w);   /* 1: some device holds several ranks */
double sm_gcomm_bound_ms(const sm_gcomm_world *w);
/* Rank c's device step counter (incremented by sm_gcomm_begin): the epoch base of exchanges
 * made elsewhere (the monokernel's, inside its launches). */
const unsigned long long *sm_gcomm_step(const sm_gcomm *gc);

/* Fail every rank's pending and later host barrier (virtual ranks) with `why`: a rank thread
 * that fails between operations calls it so its peers do not wait for it. */
void sm_gcomm_abort(sm_gcomm_world *w, const char *why);
/* After a failed step, once no rank thread is inside an operation: forget the abort. */
void sm_gcomm_reset(sm_gcomm_world *w);

/* Start a chunk of a step on rank c's stream (capturable). */
int sm_gcomm_begin(sm_gcomm *gc, cudaStream_t st, sm_err *e);

/* ---- the operations (all collective; device pointers; st: the rank's stream) ----
 * layer tags the call (-1 before the first layer, L after the last; gather_owner and argmax
 * use -1, as the CPU communicator does).  A part (the bytes one rank contributes) is at most
 * max_bytes, a whole number of 4-byte words and 4-byte aligned (gather_owner: n * H even).
 * Each returns 0 once the work is enqueued, or -1 with one line naming the op, layer and rank. */
/* out [count] bf16 = r16(part_0 + part_1 + ... + part_{W-1}) in rank order (part f32 [count]). */
int sm_gcomm_sum_bf16(sm_gcomm *gc, int op, int layer, const float *part, size_t count, uint16_t *out, cudaStream_t st,
                      sm_err *e);
/* out [count] f32 = the rank-order sum, not rounded (out may equal part). */
int sm_gcomm_sum_f32(sm_gcomm *gc, int op, int layer, const float *part, size_t count, float *out, cudaStream_t st,
                     sm_err *e);
/* Column blocks: blk [n, row_bytes] of each rank -> out [n, W * row_bytes], rank q's row i at
 * bytes [q * row_bytes, (q + 1) * row_bytes) of out's row i.  row_bytes a multiple of 4.  out
 * may be NULL on a rank that does not need the result (the call stays collective). */
int sm_gcomm_gather_cols(sm_gcomm *gc, int op, int layer, const void *blk, int n, size_t row_bytes, void *out,
                         cudaStream_t st, sm_err *e);
/* embed_gather: rows [n, H] bf16 of each rank -> out [n, H], row i from rank tokens[i] / nv
 * (tokens [n] on the device, each in [0, W * nv); a row whose token is outside comes out as bf16
 * NaNs). */
int sm_gcomm_gather_owner(sm_gcomm *gc, const uint16_t *rows, const int *tokens, int n, int H, int nv, uint16_t *out,
                          cudaStream_t st, sm_err *e);
/* vocab_argmax: best [n] f32 and id [n] (local id >= 0 in this rank's block of nv ids, -1: none,
 * -2: a non-finite logit) -> out [n] global ids (rank q's local id k is q * nv + k): the first
 * maximum in rank order (the lowest id on ties), -1 when any rank said -2 or none has an id
 * (the CPU communicator returns 0 for the latter; it cannot happen with vocab_used > 0). */
int sm_gcomm_argmax(sm_gcomm *gc, const float *best, const int *id, int n, int nv, int *out, cudaStream_t st, sm_err *e);

/* ---- health ----
 * Enqueue the copy of the rank's health words to pinned host memory (before the caller's
 * synchronization); after it, check them: 0, or -1 with one line "rank r: layer l op: waited
 * X ms for rank q (epoch E)" when a wait ran out.  The words stay set (the world is broken). */
int sm_gcomm_health_fetch(sm_gcomm *gc, cudaStream_t st, sm_err *e);
int sm_gcomm_health_check(sm_gcomm *gc, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
