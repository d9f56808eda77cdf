/* world.cu: the life of a GPU communication world (gcomm.h): creation (checks, per-rank device
 * buffers, P2P access, the NCCL communicators), destruction, the chunk start (sm_gcomm_begin),
 * the virtual ranks' bounded host barrier, abort / reset, and the health words.
 *
 * Each rank's small device state (flags, begin flags, step counter, arrival counter, health
 * words, the tables of its peers' pointers) is carved from one allocation on its device; the
 * receive area (peer) or all-gather buffer (nccl) is a second one.  The chunk start orders a
 * chunk's first put after every rank's last take of the previous chunk (operation parities
 * restart at every begin, so without it a fast rank could overwrite a slot a slow rank still
 * reads): distinct devices meet at a device barrier in the begin kernel (begin flags, bounded
 * like every wait), virtual ranks at the host barrier followed by waits on every rank's event.
 * We rejected a host barrier for distinct devices (it would forbid capturing a step in a graph)
 * and a device barrier for virtual ranks (kernels of different streams of one GPU are not
 * guaranteed to run at the same time).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda/comm/gc.cuh"

static const char *const GC_OP_NAMES[SM_GC_NOPS] = {"embed_gather", "attn_sum", "pooled_gather", "expert_sum",
                                                     "unpooled_gather", "vocab_gather", "vocab_argmax"};

const char *sm_gcomm_op_name(int op) {
    if (op >= 0 && op < SM_GC_NOPS) return GC_OP_NAMES[op];
    return op == GC_OP_BEGIN ? "begin" : "?";
}

/* ---------------------------------------------------------------- environment */

/* Append "; <reason>" (or the first reason) to the refusal line why [cap]. */
static void why_add(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void why_add(char *why, size_t cap, const char *fmt, ...) {
    size_t n = strlen(why);
    if (n && n + 2 < cap) memcpy(why + n, "; ", 3), n += 2;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + n, cap - n, fmt, ap);
    va_end(ap);
}

/* SPARKMONO_COMM_FAULT=r:l:op -> w->fault_*; 0, or -1 with the problem appended to why. */
static int parse_fault(sm_gcomm_world *w, char *why, size_t cap) {
    w->fault_rank = -1;
    const char *s = getenv("SPARKMONO_COMM_FAULT");
    if (!s || !*s) return 0;
    int r, l, k = 0;
    char name[32];
    if (sscanf(s, "%d:%d:%31s%n", &r, &l, name, &k) == 3 && s[k] == 0) {
        for (int op = 0; op < SM_GC_NOPS; op++)
            if (!strcmp(name, GC_OP_NAMES[op]) && r >= 0 && r < w->W) {
                w->fault_rank = r, w->fault_layer = l, w->fault_op = op;
                return 0;
            }
    }
    why_add(why, cap, "SPARKMONO_COMM_FAULT='%.64s' is not rank:layer:op with a rank < %d and an op name", s, w->W);
    return -1;
}

/* opts bound_ms, else SPARKMONO_COMM_BOUND_MS, else 2000. */
static int parse_bound(sm_gcomm_world *w, double opt, char *why, size_t cap) {
    w->bound_ms = 2000.0;
    if (opt > 0) {
        w->bound_ms = opt;
        return 0;
    }
    const char *s = getenv("SPARKMONO_COMM_BOUND_MS");
    if (!s || !*s) return 0;
    char *end;
    double v = strtod(s, &end);
    if (end != s && !*end && v > 0 && v < 1e9) {
        w->bound_ms = v;
        return 0;
    }
    why_add(why, cap, "SPARKMONO_COMM_BOUND_MS='%.64s' is not a positive number of ms", s);
    return -1;
}

/* ---------------------------------------------------------------- creation */

/* Device state of rank r (its device is current). */
static int rank_alloc(sm_gcomm_world *w, sm_gcomm *gc, sm_err *e) {
    const int W = w->W;
    /* ctl: flags [2W] | bflags [W] | step | arrive | health [GC_H_N] | peer_recv [W] | peer_flags [W] |
     * peer_bflags [W], every field 8 bytes */
    size_t words = 2 * (size_t)W + (size_t)W + 1 + 1 + GC_H_N + 3 * (size_t)W;
    uint64_t *ctl;
    SM_CUDA_CHECK(cudaMalloc((void **)&ctl, words * 8));
    gc->flags = ctl;
    SM_CUDA_CHECK(cudaMemset(ctl, 0, words * 8));
    gc->bflags = ctl + 2 * W;
    gc->step = gc->bflags + W;
    gc->arrive = (unsigned int *)(gc->step + 1);
    gc->health = gc->step + 2;
    gc->peer_recv = (uint8_t **)(gc->health + GC_H_N);
    gc->peer_flags = (uint64_t **)(gc->peer_recv + W);
    gc->peer_bflags = (uint64_t **)(gc->peer_flags + W);
    SM_CUDA_CHECK(cudaMallocHost((void **)&gc->health_host, GC_H_N * 8));
    memset(gc->health_host, 0, GC_H_N * 8);
    if (w->kind == SM_GCOMM_PEER) {
        SM_CUDA_CHECK(cudaMalloc((void **)&gc->recv, 2 * (size_t)W * w->slot));
    } else {
        SM_CUDA_CHECK(cudaMalloc((void **)&gc->gbuf, (size_t)W * w->slot));
        SM_CUDA_CHECK(cudaMalloc((void **)&gc->stage, w->slot));
    }
    if (w->virt) {
        for (int p = 0; p < 2; p++) SM_CUDA_CHECK(cudaEventCreateWithFlags(&gc->ev[p], cudaEventDisableTiming));
        SM_CUDA_CHECK(cudaEventCreateWithFlags(&gc->evb, cudaEventDisableTiming));
    }
    return 0;
}

/* P2P access from device a to device b (a current); already enabled is fine. */
static int enable_peer(int a, int b, sm_err *e) {
    cudaError_t rc = cudaDeviceEnablePeerAccess(b, 0);
    if (rc == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError(); /* clear the (non-sticky) error */
        return 0;
    }
    if (rc != cudaSuccess)
        return sm_errf(e, "cudaDeviceEnablePeerAccess(%d -> %d) failed at %s:%d: %s", a, b, __FILE__, __LINE__,
                       cudaGetErrorString(rc));
    return 0;
}

/* Everything after the checks; the caller destroys w on failure. */
static int create_devices(sm_gcomm_world *w, const int *devices, sm_err *e) {
    const int W = w->W;
    for (int r = 0; r < W; r++) {
        sm_gcomm *gc = &w->ranks[r];
        SM_CUDA_CHECK(cudaSetDevice(gc->dev));
        if (rank_alloc(w, gc, e)) return sm_errprefix(e, "comm: rank %d on device %d", r, gc->dev);
    }
    if (w->kind == SM_GCOMM_PEER) {
        /* P2P access between every ordered pair of distinct devices (the first rank of each) */
        for (int r = 0; r < W; r++) {
            int a = w->ranks[r].dev, first = 1;
            for (int k = 0; k < r; k++) first &= w->ranks[k].dev != a;
            if (!first) continue;
            SM_CUDA_CHECK(cudaSetDevice(a));
            for (int q = 0; q < W; q++) {
                int b = w->ranks[q].dev, firstb = 1;
                for (int k = 0; k < q; k++) firstb &= w->ranks[k].dev != b;
                if (b != a && firstb && enable_peer(a, b, e)) return -1;
            }
        }
        /* every rank's table of its peers' pointers */
        size_t bytes = 3 * (size_t)W * sizeof(void *);
        void **tab = (void **)malloc(bytes);
        if (!tab) return sm_errf(e, "comm: out of memory for %d ranks", W);
        for (int q = 0; q < W; q++) {
            tab[q] = w->ranks[q].recv;
            tab[W + q] = w->ranks[q].flags;
            tab[2 * W + q] = w->ranks[q].bflags;
        }
        for (int r = 0; r < W; r++) {
            cudaError_t rc = cudaSetDevice(w->ranks[r].dev);
            if (rc == cudaSuccess) rc = cudaMemcpy(w->ranks[r].peer_recv, tab, bytes, cudaMemcpyHostToDevice);
            if (rc != cudaSuccess) {
                free(tab);
                return sm_errf(e, "cudaMemcpy of rank %d's peer table failed at %s:%d (device %d): %s", r, __FILE__,
                               __LINE__, w->ranks[r].dev, cudaGetErrorString(rc));
            }
        }
        free(tab);
    } else if (gc_nccl_init(w, devices, e)) {
        return -1;
    }
    for (int r = 0; r < W; r++) {
        SM_CUDA_CHECK(cudaSetDevice(w->ranks[r].dev));
        SM_CUDA_CHECK(cudaDeviceSynchronize()); /* the memsets and copies above are done */
    }
    return 0;
}

int sm_gcomm_create(const sm_gcomm_opts *o, sm_gcomm_world **out, sm_err *e) {
    *out = NULL;
    if (!o || o->world < 1 || o->world > 64 || !o->devices)
        return sm_errf(e, "comm: world %d is not in [1, 64] or no device list", o ? o->world : 0);
    if (o->kind != SM_GCOMM_PEER && o->kind != SM_GCOMM_NCCL)
        return sm_errf(e, "comm: kind %d is neither peer (%d) nor nccl (%d)", o->kind, SM_GCOMM_PEER, SM_GCOMM_NCCL);
    if (o->max_bytes == 0 || o->max_bytes > ((size_t)1 << 40))
        return sm_errf(e, "comm: max_bytes %zu is not in [1, 2^40]", o->max_bytes);
    const int W = o->world;
    sm_gcomm_world *w = (sm_gcomm_world *)calloc(1, sizeof *w);
    sm_gcomm *ranks = (sm_gcomm *)calloc((size_t)W, sizeof *ranks);
    if (!w || !ranks) {
        free(w);
        free(ranks);
        return sm_errf(e, "comm: out of memory for %d ranks", W);
    }
    w->W = W;
    w->kind = o->kind;
    w->max_bytes = o->max_bytes;
    w->slot = (o->max_bytes + 15) / 16 * 16;
    w->ranks = ranks;
    sm_hbar_init(&w->bar, W);
    for (int r = 0; r < W; r++) {
        ranks[r].w = w;
        ranks[r].r = r;
        ranks[r].dev = o->devices[r];
    }

    /* the checks: one line listing every reason */
    char why[900] = "";
#define WHY(...) why_add(why, sizeof why, __VA_ARGS__)
    int ndev = 0, saved = 0;
    cudaError_t rc = cudaGetDeviceCount(&ndev);
    if (rc != cudaSuccess) {
        sm_gcomm_destroy(w);
        return sm_errf(e, "cudaGetDeviceCount failed at %s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(rc));
    }
    (void)cudaGetDevice(&saved);
    int bad_dev = 0;
    for (int r = 0; r < W; r++) {
        int d = o->devices[r];
        if (d < 0 || d >= ndev) {
            WHY("rank %d: device %d does not exist (%d devices)", r, d, ndev);
            bad_dev = 1;
        }
        for (int q = 0; q < r; q++) w->virt |= o->devices[q] == d;
    }
    const int dup = w->virt;
    /* Test hook: SPARKMONO_COMM_CONCURRENT=1 runs repeated devices as if distinct (no host
     * barriers: device-flag waits, graph-capturable), so one GPU exercises the path of W GPUs.
     * It relies on the GPU running the ranks' kernels of different streams side by side, which
     * CUDA does not promise (on one H200 it held for 2 small ranks, not for 4 or at the real
     * widths: docs/parallelism.md): a bounded wait turns a miss into a failed step, never a
     * hang.  A diagnostic, not a test and never for serving. */
    const char *cc = getenv("SPARKMONO_COMM_CONCURRENT");
    if (cc && !strcmp(cc, "1")) w->virt = 0;
    parse_fault(w, why, sizeof why);
    parse_bound(w, o->bound_ms, why, sizeof why);
    if (o->kind == SM_GCOMM_PEER && !bad_dev) {
        for (int r = 0; r < W; r++)
            for (int q = 0; q < W; q++) {
                int a = o->devices[r], b = o->devices[q], ok = 0, seen = a == b;
                for (int k = 0; k < r && !seen; k++) seen = o->devices[k] == a; /* each device pair once */
                for (int k = 0; k < q && !seen; k++) seen = o->devices[k] == b;
                if (seen) continue;
                rc = cudaDeviceCanAccessPeer(&ok, a, b);
                if (rc != cudaSuccess || !ok) WHY("device %d cannot access device %d's memory (no P2P)", a, b);
            }
    }
    if (o->kind == SM_GCOMM_NCCL) {
        if (dup) WHY("NCCL refuses a duplicated device: use --comm peer for virtual ranks");
        if (W > ndev) WHY("nccl: %d ranks but %d devices", W, ndev);
        sm_err le;
        if (gc_nccl_load(&w->nccl, &le)) WHY("%.400s", le.msg);
    }
#undef WHY
    if (why[0]) {
        sm_gcomm_destroy(w);
        /* the missing library's line stands alone ("--comm nccl: ..."), every other reason under "comm: " */
        return sm_errf(e, "%s%s", strncmp(why, "--comm", 6) ? "comm: " : "", why);
    }
    int rc2 = create_devices(w, o->devices, e);
    (void)cudaSetDevice(saved);
    if (rc2) {
        sm_gcomm_destroy(w);
        return -1;
    }
    *out = w;
    return 0;
}

void sm_gcomm_destroy(sm_gcomm_world *w) {
    if (!w) return;
    int saved = 0;
    (void)cudaGetDevice(&saved);
    if (w->kind == SM_GCOMM_NCCL) gc_nccl_fini(w);
    for (int r = 0; r < w->W; r++) {
        sm_gcomm *gc = &w->ranks[r];
        if (!gc->flags && !gc->health_host && !gc->recv && !gc->gbuf && !gc->ev[0]) continue;
        SM_CUDA_CHECK_PRINT(cudaSetDevice(gc->dev));
        if (gc->flags) SM_CUDA_CHECK_PRINT(cudaFree(gc->flags));
        if (gc->health_host) SM_CUDA_CHECK_PRINT(cudaFreeHost(gc->health_host));
        if (gc->recv) SM_CUDA_CHECK_PRINT(cudaFree(gc->recv));
        if (gc->gbuf) SM_CUDA_CHECK_PRINT(cudaFree(gc->gbuf));
        if (gc->stage) SM_CUDA_CHECK_PRINT(cudaFree(gc->stage));
        for (int p = 0; p < 2; p++)
            if (gc->ev[p]) SM_CUDA_CHECK_PRINT(cudaEventDestroy(gc->ev[p]));
        if (gc->evb) SM_CUDA_CHECK_PRINT(cudaEventDestroy(gc->evb));
    }
    gc_nccl_unload(&w->nccl);
    (void)cudaSetDevice(saved);
    sm_hbar_destroy(&w->bar);
    free(w->ranks);
    free(w);
}

sm_gcomm *sm_gcomm_rank(sm_gcomm_world *w, int r) { return w && r >= 0 && r < w->W ? &w->ranks[r] : NULL; }
int sm_gcomm_is_virtual(const sm_gcomm_world *w) { return w->virt; }
const unsigned long long *sm_gcomm_step(const sm_gcomm *gc) { return (const unsigned long long *)gc->step; }

double sm_gcomm_bound_ms(const sm_gcomm_world *w) { return w->bound_ms; }

/* ---------------------------------------------------------------- host barrier (virtual ranks) */

void sm_gcomm_abort(sm_gcomm_world *w, const char *why) { sm_hbar_abort(&w->bar, -1, why); }

void sm_gcomm_reset(sm_gcomm_world *w) { sm_hbar_reset(&w->bar, NULL, NULL, 0); }

/* Wait until every rank thread has arrived (0), or fail on abort / after bound_ms (-1, and the
 * world is aborted so every other waiter fails too, naming the ranks missing). */
int gc_host_barrier(sm_gcomm *gc, int op, int layer, sm_err *e) {
    sm_gcomm_world *w = gc->w;
    char what[96], msg[512];
    int who = -1;
    snprintf(what, sizeof what, "comm %s at layer %d (host barrier)", sm_gcomm_op_name(op), layer);
    if (sm_hbar_wait(&w->bar, gc->r, w->bound_ms / 1000.0, what, &who, msg, sizeof msg) == 0) return 0;
    return sm_errf(e, "comm %s at layer %d, rank %d: aborted: %s", sm_gcomm_op_name(op), layer, gc->r, msg);
}

/* ---------------------------------------------------------------- begin */

/* One block of 64 threads: step += 1; distinct devices (barrier 1): publish the new step in every
 * rank's begin flag r, then thread q waits (bounded) until rank q's begin flag here reached it. */
__global__ void gc_begin_kernel(uint64_t *step, uint64_t *const *peer_bflags, const uint64_t *bflags, uint64_t *health,
                                int r, int W, int barrier, unsigned long long bound_ns) {
    __shared__ uint64_t s;
    if (threadIdx.x == 0) {
        s = *step + 1;
        *step = s;
        if (barrier) {
            __threadfence_system();
            for (int q = 0; q < W; q++) sm_st_release_sys_u64(peer_bflags[q] + r, s);
        }
    }
    __syncthreads();
    if (!barrier) return;
    /* >=: a rank may already have published the next chunk's step when no operation came between */
    for (int q = (int)threadIdx.x; q < W; q += (int)blockDim.x)
        gc_spin(bflags + q, s, 1, health, bound_ns, r, -1, GC_OP_BEGIN, q);
}

int sm_gcomm_begin(sm_gcomm *gc, cudaStream_t st, sm_err *e) {
    sm_gcomm_world *w = gc->w;
    SM_CUDA_CHECK(cudaSetDevice(gc->dev));
    if (w->virt) { /* every rank's previous chunk is done before this rank's next put */
        SM_CUDA_CHECK(cudaEventRecord(gc->evb, st));
        if (gc_host_barrier(gc, GC_OP_BEGIN, -1, e)) return -1;
        for (int q = 0; q < w->W; q++)
            if (q != gc->r) SM_CUDA_CHECK(cudaStreamWaitEvent(st, w->ranks[q].evb, 0));
    }
    int barrier = w->kind == SM_GCOMM_PEER && !w->virt && w->W > 1;
    gc_begin_kernel<<<1, 64, 0, st>>>(gc->step, (uint64_t *const *)gc->peer_bflags, gc->bflags, gc->health, gc->r, w->W,
                                      barrier, (unsigned long long)(w->bound_ms * 1e6));
    SM_LAUNCH_CHECK("gc_begin_kernel");
    gc->i = 0;
    gc->begun = 1;
    return 0;
}

/* ---------------------------------------------------------------- health */

int sm_gcomm_health_fetch(sm_gcomm *gc, cudaStream_t st, sm_err *e) {
    SM_CUDA_CHECK(cudaSetDevice(gc->dev));
    SM_CUDA_CHECK(cudaMemcpyAsync(gc->health_host, gc->health, GC_H_N * 8, cudaMemcpyDeviceToHost, st));
    return 0;
}

int sm_gcomm_health_check(sm_gcomm *gc, sm_err *e) {
    const volatile uint64_t *h = gc->health_host;
    if (!h[GC_H_FAILED]) return 0;
    return sm_errf(e, "rank %d: layer %d %s: waited %.0f ms for rank %d (epoch %llu)", (int)h[GC_H_RANK],
                   (int)(int64_t)h[GC_H_LAYER], sm_gcomm_op_name((int)h[GC_H_OP]), (double)h[GC_H_WAITED_NS] / 1e6,
                   (int)h[GC_H_PEER], (unsigned long long)h[GC_H_EPOCH]);
}
