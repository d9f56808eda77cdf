/* synth.h: a CUDA backend whose weights are generated on the device (benchmarks of the
 * real widths without a checkpoint).  C-compatible, no CUDA types: tools/cmd_bench.c and the
 * GPU tests include it.  Only meaningful when SM_HAVE_CUDA is defined; the hooks that time or
 * check a backend are in cuda/bench/bench.h.
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
extern "C" { /* the project headers below are C headers, some without their own guards */
#endif
#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

/* A CUDA backend (device o->device) for model config c with random weights made on the
 * device from seed.  expert_fmt (sm_expert_fmt): format of the experts of layers 1..L-2
 * (layers 0 and L-1 keep BF16 experts when it is not BF16, as make-model and the Quark export
 * do). */
int sm_cuda_backend_create_synth(const sm_config *c, int expert_fmt, uint64_t seed, const sm_kv *kv,
                                 const sm_backend_opts *o, sm_backend *b, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
