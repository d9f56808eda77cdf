/* ops.cu: the operations of gcomm.h: put (peer: this rank's part into slot r of every rank's
 * receive area, then a release of the epoch into every receiver's flag; nccl: an all-gather,
 * nccl.cu), and the finish kernels, which wait for the W flags of the operation's parity
 * (peer; bounded, recorded in the health words on timeout) and then reduce or rearrange the
 * W slots in rank order 0..W-1.  A finish block whose wait ran out, or whose rank's health words
 * were already set, leaves without writing: the output keeps its old bytes, the health words
 * say why (the world is broken from then on).
 *
 * Put is multi-block: each block copies a stretch of the part to every receiver (16-byte
 * words when the part allows, else 4-byte words), fences at system scope and counts itself in
 * the rank's arrival counter; the last block resets the counter and releases the flags, so a
 * flag never precedes the data it announces.  Every finish block waits for the flags itself
 * (threads 0..W-1, one flag each) before touching a slot, which keeps the take one kernel and
 * needs no grid barrier.  Slots are read with ld.global.cg (L2, never a stale L1 line: peers
 * write them over NVLink).  The epoch is step * 4096 + i: the step is read on the device (so
 * a captured graph replays with the current step), i is a kernel argument (the same in every
 * replay of one chunk's capture).  We rejected a separate wait kernel before each finish
 * kernel: one launch more per operation on the decode path, where launches dominate.
 */
#include <stdio.h>
#include "cuda/comm/gc.cuh"

#define GC_THREADS 256   /* threads of every put / finish block (>= 64: one waiter per rank) */
#define GC_MAX_BLOCKS 128

/* ---------------------------------------------------------------- put */

template <typename V>
__global__ void __launch_bounds__(GC_THREADS) gc_put_kernel(const uint8_t *src0, size_t n0, const uint8_t *src1,
                                                            size_t n1, uint8_t *const *peer_recv,
                                                            uint64_t *const *peer_flags, size_t slot_off, int W,
                                                            int r, unsigned i, const uint64_t *step,
                                                            unsigned int *arrive, int release) {
    __shared__ uint8_t *dst[64];
    __shared__ int last;
    for (int q = (int)threadIdx.x; q < W; q += (int)blockDim.x) dst[q] = peer_recv[q] + slot_off;
    __syncthreads();
    const size_t u0 = n0 / sizeof(V), un = u0 + n1 / sizeof(V);
    for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < un; u += (size_t)gridDim.x * blockDim.x) {
        V v = u < u0 ? ((const V *)src0)[u] : ((const V *)src1)[u - u0];
        for (int q = 0; q < W; q++) ((V *)dst[q])[u] = v;
    }
    __threadfence_system(); /* this block's stores are visible everywhere before it counts itself */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(arrive, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    *arrive = 0; /* the next put (stream-ordered) counts from 0 */
    __threadfence_system();
    if (!release) return; /* fault injection: the data went out, the flags never do */
    const uint64_t epoch = *(volatile const uint64_t *)step * GC_EPOCH_OPS + i;
    const int p = (int)(i & 1u);
    for (int q = 0; q < W; q++) sm_st_release_sys_u64(peer_flags[q] + (size_t)p * W + r, epoch);
}

/* ---------------------------------------------------------------- wait */

/* Every thread of the block calls it; 1: the W flags of the parity hold the epoch (the slots
 * may be read), 0: a wait ran out or the rank had failed before (skip the operation). */
__device__ __forceinline__ int gc_block_wait(const gc_wait &w) {
    __shared__ int bail;
    if (!w.active) return 1;
    if (threadIdx.x == 0) bail = 0;
    __syncthreads();
    if ((int)threadIdx.x < w.W) {
        const int q = (int)threadIdx.x;
        const uint64_t epoch = *(volatile const uint64_t *)w.step * GC_EPOCH_OPS + w.i;
        const uint64_t *f = w.flags + (size_t)(w.i & 1u) * w.W + q;
        if (gc_spin(f, epoch, 0, w.health, w.bound_ns, w.r, w.layer, w.op, q)) bail = 1;
        __threadfence_system();
    }
    __syncthreads();
    return !bail;
}

/* ---------------------------------------------------------------- finish kernels
 * base: slot 0 of the operation; slot q at base + q * stride. */

/* out[k] = ((s0[k] + s1[k]) + s2[k]) + ... in f32; BF: then rounded to bf16 (nearest even). */
template <int BF>
__global__ void __launch_bounds__(GC_THREADS) gc_sum_kernel(gc_wait wt, const uint8_t *base, size_t stride, int W,
                                                            size_t count, void *out) {
    if (!gc_block_wait(wt)) return;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += (size_t)gridDim.x * blockDim.x) {
        float x = __ldcg((const float *)base + k);
        for (int q = 1; q < W; q++) x += __ldcg((const float *)(base + (size_t)q * stride) + k);
        if (BF) ((uint16_t *)out)[k] = sm_tobf(x);
        else ((float *)out)[k] = x;
    }
}

/* out [n, W * rw] words: rank q's row i (rw 4-byte words) at words [q rw, (q + 1) rw) of row i;
 * out NULL: the wait only (the rank takes part, wants no result). */
__global__ void __launch_bounds__(GC_THREADS) gc_cols_kernel(gc_wait wt, const uint8_t *base, size_t stride, int W,
                                                             int n, size_t rw, uint32_t *out) {
    if (!gc_block_wait(wt) || !out) return;
    const size_t per_row = (size_t)W * rw, total = (size_t)n * per_row;
    for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (size_t)gridDim.x * blockDim.x) {
        size_t i = u / per_row, rem = u - i * per_row, q = rem / rw, c = rem - q * rw;
        out[u] = __ldcg((const unsigned int *)(base + q * stride) + i * rw + c);
    }
}

/* out [n, H] bf16: row i from the slot of rank tokens[i] / nv (a bf16 NaN row for a token outside
 * the W x nv vocabulary blocks: the caller's bug made visible). */
__global__ void __launch_bounds__(GC_THREADS) gc_owner_kernel(gc_wait wt, const uint8_t *base, size_t stride, int W,
                                                              const int *tokens, int n, int H, int nv,
                                                              uint16_t *out) {
    if (!gc_block_wait(wt)) return;
    const size_t total = (size_t)n * (size_t)H;
    for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (size_t)gridDim.x * blockDim.x) {
        int t = tokens[u / (size_t)H];
        int q = t >= 0 && nv > 0 ? t / nv : -1;
        out[u] = q >= 0 && q < W ? __ldcg((const unsigned short *)(base + (size_t)q * stride) + u) : (uint16_t)0x7FC0;
    }
}

/* out[i] = the first maximum over ranks in rank order (global id q nv + local id), -1 when a
 * rank said -2 (non-finite) or no rank has an id.  Slot: best [n] f32 then id [n] int. */
__global__ void __launch_bounds__(GC_THREADS) gc_argmax_kernel(gc_wait wt, const uint8_t *base, size_t stride,
                                                               int W, int n, int nv, int *out) {
    if (!gc_block_wait(wt)) return;
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) {
        int id = -1, nonfinite = 0;
        float v = 0.0f;
        for (int q = 0; q < W; q++) {
            const uint8_t *s = base + (size_t)q * stride;
            int qi = __ldcg((const int *)(s + (size_t)n * 4) + i);
            nonfinite |= qi == -2;
            if (qi < 0) continue;
            float f = __ldcg((const float *)s + i);
            if (id < 0 || f > v) id = q * nv + qi, v = f;
        }
        out[i] = nonfinite ? -1 : id;
    }
}

/* ---------------------------------------------------------------- the exchange */

static int gc_grid(size_t units) {
    size_t b = (units + GC_THREADS - 1) / GC_THREADS;
    return b < 1 ? 1 : b > GC_MAX_BLOCKS ? GC_MAX_BLOCKS : (int)b;
}

/* Move this rank's part (segments s0 [n0 bytes], s1 [n1 bytes]) to every rank and describe where
 * the finish kernel finds the W parts: *base, *stride, *wt.  Counts the operation. */
static int gc_exchange(sm_gcomm *gc, int op, int layer, const void *s0, size_t n0, const void *s1, size_t n1,
                       cudaStream_t st, const uint8_t **base, size_t *stride, gc_wait *wt, sm_err *e) {
    sm_gcomm_world *w = gc->w;
    const size_t bytes = n0 + n1;
    const char *name = sm_gcomm_op_name(op);
    if (!gc->begun) /* the step counter is 0: the flags' initial zeros would pass for epochs */
        return sm_errf(e, "comm %s at layer %d, rank %d: no sm_gcomm_begin before the first operation", name, layer,
                       gc->r);
    if (gc->i >= GC_EPOCH_OPS)
        return sm_errf(e, "comm %s at layer %d, rank %d: more than %d operations since sm_gcomm_begin", name, layer,
                       gc->r, GC_EPOCH_OPS);
    if (bytes > w->max_bytes)
        return sm_errf(e, "comm %s at layer %d, rank %d: a part of %zu bytes exceeds the world's %zu", name, layer,
                       gc->r, bytes, w->max_bytes);
    if (n0 % 4 || n1 % 4 || !sm_aligned(s0, 4) || !sm_aligned(s1, 4) || (n0 && !s0) || (n1 && !s1))
        return sm_errf(e, "comm %s at layer %d, rank %d: parts must be 4-byte aligned whole words (%zu + %zu bytes)",
                       name, layer, gc->r, n0, n1);
    SM_CUDA_CHECK(cudaSetDevice(gc->dev));
    const unsigned i = gc->i++;
    const int p = (int)(i & 1u);
    memset(wt, 0, sizeof *wt);
    if (w->kind == SM_GCOMM_NCCL) {
        const void *part = s0;
        if (n1) { /* one contiguous send buffer */
            if (n0) SM_CUDA_CHECK(cudaMemcpyAsync(gc->stage, s0, n0, cudaMemcpyDeviceToDevice, st));
            SM_CUDA_CHECK(cudaMemcpyAsync(gc->stage + n0, s1, n1, cudaMemcpyDeviceToDevice, st));
            part = gc->stage;
        }
        if (gc_nccl_gather(gc, part, bytes, st, e))
            return sm_errprefix(e, "comm %s at layer %d, rank %d", name, layer, gc->r);
        *base = gc->gbuf;
        *stride = bytes;
        return 0;
    }
    if (w->fault_rank == gc->r && w->fault_layer == layer && w->fault_op == op) gc->faulted = 1;
    const size_t off = ((size_t)p * w->W + gc->r) * w->slot;
    const int vec16 = n0 % 16 == 0 && n1 % 16 == 0 && sm_aligned(s0, 16) && sm_aligned(s1, 16);
    const uint8_t *a = (const uint8_t *)s0, *b = (const uint8_t *)s1;
    if (vec16) {
        gc_put_kernel<uint4><<<gc_grid(bytes / 16), GC_THREADS, 0, st>>>(a, n0, b, n1, gc->peer_recv, gc->peer_flags,
                                                                         off, w->W, gc->r, i, gc->step, gc->arrive,
                                                                         !gc->faulted);
    } else {
        gc_put_kernel<uint32_t><<<gc_grid(bytes / 4), GC_THREADS, 0, st>>>(a, n0, b, n1, gc->peer_recv,
                                                                           gc->peer_flags, off, w->W, gc->r, i,
                                                                           gc->step, gc->arrive, !gc->faulted);
    }
    SM_LAUNCH_CHECK("gc_put_kernel");
    if (w->virt) { /* no take before every rank's put is enqueued: put, event, barrier, waits */
        SM_CUDA_CHECK(cudaEventRecord(gc->ev[p], st));
        if (gc_host_barrier(gc, op, layer, e)) return -1;
        for (int q = 0; q < w->W; q++)
            if (q != gc->r) SM_CUDA_CHECK(cudaStreamWaitEvent(st, w->ranks[q].ev[p], 0));
    }
    *base = gc->recv + (size_t)p * w->W * w->slot;
    *stride = w->slot;
    wt->flags = gc->flags;
    wt->step = gc->step;
    wt->health = gc->health;
    wt->bound_ns = (unsigned long long)(w->bound_ms * 1e6);
    wt->i = i;
    wt->r = gc->r;
    wt->W = w->W;
    wt->layer = layer;
    wt->op = op;
    wt->active = 1;
    return 0;
}

/* ---------------------------------------------------------------- the operations */

static int gc_sum(sm_gcomm *gc, int op, int layer, const float *part, size_t count, void *out, int bf,
                  cudaStream_t st, sm_err *e) {
    const uint8_t *base;
    size_t stride;
    gc_wait wt;
    if (op < 0 || op >= SM_GC_NOPS) return sm_errf(e, "comm: op %d is not an operation tag", op);
    if (gc_exchange(gc, op, layer, part, count * 4, NULL, 0, st, &base, &stride, &wt, e)) return -1;
    if (bf) gc_sum_kernel<1><<<gc_grid(count), GC_THREADS, 0, st>>>(wt, base, stride, gc->w->W, count, out);
    else gc_sum_kernel<0><<<gc_grid(count), GC_THREADS, 0, st>>>(wt, base, stride, gc->w->W, count, out);
    SM_LAUNCH_CHECK("gc_sum_kernel");
    return 0;
}

int sm_gcomm_sum_bf16(sm_gcomm *gc, int op, int layer, const float *part, size_t count, uint16_t *out, cudaStream_t st,
                      sm_err *e) {
    return gc_sum(gc, op, layer, part, count, out, 1, st, e);
}

int sm_gcomm_sum_f32(sm_gcomm *gc, int op, int layer, const float *part, size_t count, float *out, cudaStream_t st,
                     sm_err *e) {
    return gc_sum(gc, op, layer, part, count, out, 0, st, e);
}

int sm_gcomm_gather_cols(sm_gcomm *gc, int op, int layer, const void *blk, int n, size_t row_bytes, void *out,
                         cudaStream_t st, sm_err *e) {
    const uint8_t *base;
    size_t stride;
    gc_wait wt;
    if (op < 0 || op >= SM_GC_NOPS) return sm_errf(e, "comm: op %d is not an operation tag", op);
    if (n < 0 || row_bytes % 4)
        return sm_errf(e, "comm %s at layer %d, rank %d: %d rows of %zu bytes (rows must be whole 4-byte words)",
                       sm_gcomm_op_name(op), layer, gc->r, n, row_bytes);
    if (gc_exchange(gc, op, layer, blk, (size_t)n * row_bytes, NULL, 0, st, &base, &stride, &wt, e)) return -1;
    const size_t rw = row_bytes / 4;
    gc_cols_kernel<<<out ? gc_grid((size_t)n * gc->w->W * rw) : 1, GC_THREADS, 0, st>>>(wt, base, stride, gc->w->W, n, rw,
                                                                              (uint32_t *)out);
    SM_LAUNCH_CHECK("gc_cols_kernel");
    return 0;
}

int sm_gcomm_gather_owner(sm_gcomm *gc, const uint16_t *rows, const int *tokens, int n, int H, int nv, uint16_t *out,
                          cudaStream_t st, sm_err *e) {
    const uint8_t *base;
    size_t stride;
    gc_wait wt;
    if (n < 0 || H < 0 || nv < 1)
        return sm_errf(e, "comm embed_gather at layer -1, rank %d: n %d, H %d, nv %d", gc->r, n, H, nv);
    if (gc_exchange(gc, SM_GC_EMBED, -1, rows, (size_t)n * H * 2, NULL, 0, st, &base, &stride, &wt, e)) return -1;
    gc_owner_kernel<<<gc_grid((size_t)n * H), GC_THREADS, 0, st>>>(wt, base, stride, gc->w->W, tokens, n, H, nv, out);
    SM_LAUNCH_CHECK("gc_owner_kernel");
    return 0;
}

int sm_gcomm_argmax(sm_gcomm *gc, const float *best, const int *id, int n, int nv, int *out, cudaStream_t st,
                    sm_err *e) {
    const uint8_t *base;
    size_t stride;
    gc_wait wt;
    if (n < 0 || nv < 1) return sm_errf(e, "comm vocab_argmax at layer -1, rank %d: n %d, nv %d", gc->r, n, nv);
    if (gc_exchange(gc, SM_GC_ARGMAX, -1, best, (size_t)n * 4, id, (size_t)n * 4, st, &base, &stride, &wt, e))
        return -1;
    gc_argmax_kernel<<<gc_grid((size_t)n), GC_THREADS, 0, st>>>(wt, base, stride, gc->w->W, n, nv, out);
    SM_LAUNCH_CHECK("gc_argmax_kernel");
    return 0;
}
