/* bench.h: the hooks benchmarks and tests drive the CUDA backend with, beyond
 * backend.h: device facts, the read-bandwidth probe that floors are computed from, KV fill,
 * graph-replay timing of whole steps and of single layers, the routing of the last step, and
 * the bit-exact check of the uploaded dense weights (src/cuda/bench/: bench.cu, check_dense.cu),
 * the monokernel's mode, activations and timeline, the per-phase time of a layer on either
 * path (trace.cu).  C-compatible, no CUDA types:
 * tools/cmd_bench.c and the GPU tests include it.  Only meaningful when SM_HAVE_CUDA is
 * defined.  Every hook that takes a backend runs on that backend's device; the others take a
 * device ordinal.  We rejected exposing the device context to C: the hooks are the seam.
 */
#ifndef SM_CUDA_BENCH_H
#define SM_CUDA_BENCH_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" { /* the project headers below are C headers, some without their own guards */
#endif
#include "backend/backend.h"
#include "model/weights.h"

/* Facts of CUDA device `device` (made current).  Fails with one line when it does not exist. */
typedef struct sm_cuda_devinfo {
    char name[256];        /* cudaDeviceProp.name */
    int cc_major, cc_minor;/* compute capability */
    int sms;               /* multiprocessors */
    double mem_total;      /* bytes of device memory */
    double mem_free;       /* bytes free now */
    double l2_bytes;       /* L2 cache bytes */
} sm_cuda_devinfo;
int sm_cuda_device_info(int device, sm_cuda_devinfo *d, sm_err *e);

/* Read bandwidth (bytes/s) of device `device`: a read-only streaming kernel over `gib` GiB
 * (>= 4 recommended, well beyond L2), best of `reps` timed passes after one warm-up pass, on
 * a stream of its own.  Allocates and frees its buffer. */
int sm_cuda_read_bandwidth(int device, double gib, int reps, double *bytes_per_s, sm_err *e);

/* World backends (o->world > 1): copy rank `rank`'s aux entry a (rows [0, n) of the last
 * step's final chunk, f32 [n, H]) to host; every rank computes the replicated residual stream,
 * so tests compare them across ranks bit for bit. */
int sm_cuda_world_aux(const sm_backend *b, int rank, int a, int n, float *host, sm_err *e);
/* World backends: the cross-rank exchanges of one step of n rows alone (the forward's
 * operations and shapes, in its order), iters timed runs on every rank at once; us [W]
 * receives each rank's median microseconds (CUDA events on its stream).  The other hooks of
 * this header act on rank 0 of a world (routing, layer info), or on every rank (KV fill); the
 * step timing of a world is host wall clock around b->step (its ranks synchronize each step). */
int sm_cuda_world_bench_exchanges(const sm_backend *b, int n, int iters, float *us, sm_err *e);

/* Fill every KV page of every layer of a CUDA backend with random bf16 (never zeros). */
int sm_cuda_bench_fill_kv(const sm_backend *b, uint64_t seed, sm_err *e);

/* Per layer l: expert format fmt[l] (sm_expert_fmt) and device bytes of one expert. */
int sm_cuda_bench_layer_info(const sm_backend *b, int *fmt, double *expert_bytes, sm_err *e);

/* Time verify steps: each of sets[0..nsets) is run once through b->step (checks, graph
 * capture), then warmup + iters steps rotate over the sets; ms[0..iters) receives the time of
 * each timed step (metadata copy + graph replay, CUDA events).  Every set must be one graph
 * (<= 128 rows, <= 16 rows a request), have the same rows, and ask for no logits and no aux.
 * *graphed (may be NULL) = 1. */
int sm_cuda_bench_steps(const sm_backend *b, const sm_step *sets, int nsets, int warmup, int iters, float *ms,
                        int *graphed, sm_err *e);

/* Routing of the last step: idx [L, n, K] expert ids of its first n rows in every layer. */
int sm_cuda_bench_routing(const sm_backend *b, int n, int *idx, sm_err *e);

/* Per-layer timing: runs s once, then captures and replays (median of iters) a graph of each
 * layer alone (layer_us [L]), of each layer's MoE expert stage alone (moe_us [L]) and of the
 * embedding + logits alone (*head_us).  s must be one graph (as above), without logits and
 * aux. */
int sm_cuda_bench_layers(const sm_backend *b, const sm_step *s, int iters, float *layer_us, float *moe_us,
                         float *head_us, sm_err *e);

/* Monokernel on (1: where eligible) or off (0) for the next steps of a CUDA backend (drops
 * the captured graphs); error when on is asked and the engine has no monokernel. */
int sm_cuda_bench_set_mono(const sm_backend *b, int on, sm_err *e);
/* The MXFP4 expert layers' activations for the next steps of a CUDA backend (every rank):
 * mx 1 W4A4 (fp8 1 on the FP8 tensor cores, 0 with bf16 products: sm_cuda_moe_set_acts), 0
 * W4A16 (drops the captured graphs and the monokernel's plans); error when W4A4 is asked of a
 * model without MXFP4 expert layers. */
int sm_cuda_bench_set_acts(const sm_backend *b, int mx, int fp8, sm_err *e);
/* Run step s once with the monokernel's per-block phase timestamps on, print the per-phase
 * summary (median span over layers 2..L-2, the weight phases against their floors at read
 * bandwidth bw bytes/s) and, when path is not NULL, write the timestamps to path as a Chrome /
 * Perfetto trace (one track per SM, slices "L<layer> <phase>"). */
int sm_cuda_bench_trace(const sm_backend *b, const sm_step *s, const char *path, double bw, sm_err *e);
/* The phases of a decoder layer in one traced step (sm_cuda_bench_phases): the table both
 * executors' timelines map onto (SM_LP_* of cuda/exec/exec.h, index 0 unused), each phase's
 * median time over a set of layers. */
#define SM_BENCH_LPHASES 16
typedef struct sm_bench_phases {
    int n;                               /* phases [1, n) */
    const char *name[SM_BENCH_LPHASES];  /* one word each: "qkvg", "attention", ... */
    unsigned weights[SM_BENCH_LPHASES];  /* bit r: tensor role r (model/tensors.h) is read as its
                                            weights (the expert roles: the routed experts); 0: none */
    float us[SM_BENCH_LPHASES];          /* median over the set's layers that ran it, us; < 0: none */
    int layers;                          /* layers of the set the traced step ran on that path */
} sm_bench_phases;
/* One traced step s (one graph-form chunk; logits allowed) of a one-rank backend on the stock
 * path (mono 0: every layer stock, the bucket's launches run eagerly between CUDA events, the
 * same launches as its graph) or the monokernel's (mono 1: its graph with the per-block
 * timestamps on; its layers only): the phases of every layer into layer_us [L][SM_BENCH_LPHASES]
 * (may be NULL; -1: not measured) and their medians over the layers l with set[l] != 0 (NULL:
 * all) into p.  The gaps phase (the layer's cycle minus its phases) needs the layer before it
 * traced too.  The mode of the next steps is left as it was. */
int sm_cuda_bench_phases(const sm_backend *b, const sm_step *s, int mono, const unsigned char *set, sm_bench_phases *p,
                         float *layer_us, sm_err *e);
/* Tests: monokernel layers rank 0 of backend b (one rank or a world) has run (0: none / off). */
long sm_cuda_mono_layers_run(const sm_backend *b);
/* Tests: 0 when every dense tensor of the CUDA backend b (everything but the experts and the
 * KV cache) is bit-identical to its rank's shard of model m; else -1 naming the first tensor
 * that differs.  Checks the upload of a loaded model, and that a synthetic backend equals
 * make-model's checkpoint of the same config and seed. */
int sm_cuda_backend_check_dense(const sm_backend *b, const sm_model *m, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
