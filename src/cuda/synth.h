/* synth.h: C entry points of the CUDA backend beyond backend.h: a backend whose weights are
 * generated on the device (benchmarks of the real widths without a checkpoint), and the hooks
 * `sparkmono bench` times a backend with.  C-compatible, no CUDA types: tools/cmd_bench.c and
 * the GPU tests include it.  Only meaningful when SM_HAVE_CUDA is defined.
 *
 * The synthetic weights are those sm_make_model (makemodel.h) writes for the same config,
 * expert format and seed: the same counter-based normals, keyed by the same tensor names, so a
 * synthetic backend and a backend loaded from `make-model` output hold the same dense weights
 * bit for bit (the experts as far as the MoE module's sm_cuda_moe_synth follows makemodel).
 * We rejected host-side generation + upload: the 4-layer real-width model is 60-110 GB, which
 * the device fills in seconds and the host in minutes.
 */
#ifndef SM_CUDA_SYNTH_H
#define SM_CUDA_SYNTH_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" { /* the project headers below are C headers without their own guards */
#endif
#include "backend.h"
#include "config.h"
#include "weights.h"

/* A CUDA backend for model config c with random weights made on the device from seed.
 * expert_fmt (sm_expert_fmt): format of the experts of layers 1..L-2 (layers 0 and L-1 keep
 * BF16 experts when it is not BF16, as make-model and the Quark export do). */
int sm_cuda_backend_create_synth(const sm_config *c, int expert_fmt, uint64_t seed, const sm_kv *kv,
                                 const sm_backend_opts *o, sm_backend *b, sm_err *e);

/* The device the backend would use (device 0).  Fails with one line when there is none. */
typedef struct sm_cuda_devinfo {
    char name[256];        /* cudaDeviceProp.name */
    int cc_major, cc_minor;/* compute capability */
    int sms;               /* multiprocessors */
    double mem_total;      /* bytes of device memory */
    double mem_free;       /* bytes free now */
    double l2_bytes;       /* L2 cache bytes */
} sm_cuda_devinfo;
int sm_cuda_device_info(sm_cuda_devinfo *d, sm_err *e);

/* Read bandwidth (bytes/s) of a read-only streaming kernel over `gib` GiB (>= 4 recommended),
 * best of `reps` timed passes after one warm-up pass.  Allocates and frees its buffer. */
int sm_cuda_read_bandwidth(double gib, int reps, double *bytes_per_s, sm_err *e);

/* Fill every KV page of every layer of a CUDA backend with random bf16 (never zeros). */
int sm_cuda_bench_fill_kv(const sm_backend *b, uint64_t seed, sm_err *e);

/* Per layer l: expert format fmt[l] (sm_expert_fmt) and device bytes of one expert. */
int sm_cuda_bench_layer_info(const sm_backend *b, int *fmt, double *expert_bytes, sm_err *e);

/* Time verify steps: each of sets[0..nsets) is run once through b->step (checks, graph
 * capture), then warmup + iters steps rotate over the sets; ms[0..iters) receives the time of
 * each timed step (metadata copy + graph replay, CUDA events).  Every set must be graph-form
 * (<= 128 rows, <= 16 rows a request), have the same rows, and ask for no logits and no aux.
 * *graphed (may be NULL) = 1. */
int sm_cuda_bench_steps(const sm_backend *b, const sm_step *sets, int nsets, int warmup, int iters, float *ms,
                        int *graphed, sm_err *e);

/* Routing of the last step: idx [L, n, K] expert ids of its first n rows in every layer. */
int sm_cuda_bench_routing(const sm_backend *b, int n, int *idx, sm_err *e);

/* Per-layer timing: runs s once, then captures and replays (median of iters) a graph of each
 * layer alone (layer_us [L]), of each layer's MoE expert stage alone (moe_us [L]) and of the
 * embedding + logits alone (*head_us).  s must be graph-form, without logits and aux. */
int sm_cuda_bench_layers(const sm_backend *b, const sm_step *s, int iters, float *layer_us, float *moe_us,
                         float *head_us, sm_err *e);

/* Tests: 0 when every dense tensor of the CUDA backend b (everything but the experts and the
 * KV cache) is bit-identical to model m's; else -1 naming the first tensor that differs.
 * Checks the upload of a loaded model, and that a synthetic backend equals make-model's
 * checkpoint of the same config and seed. */
int sm_cuda_backend_check_dense(const sm_backend *b, const sm_model *m, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
