/* makemodel.h: random checkpoints in the real tensor names (SPEC.md section 2), for tests and
 * benchmarks.  Deterministic per seed: every tensor is generated from (seed, tensor name) alone,
 * so any tensor can be regenerated without the others, and the writer streams (a spark1x
 * checkpoint is never held in memory).  Magnitudes are realistic (DESIGN.md "Numbers"):
 * matrices ~ N(0, 1/fan_in) in bf16, norm gains small around 0 (effective weights near 1),
 * residual gates ~ N(0, 0.5), router bias ~ N(0, 0.01), embedding rows of RMS ~ 1.
 * The directory is written under a temporary name and renamed when complete. */
#ifndef SM_MAKEMODEL_H
#define SM_MAKEMODEL_H
#include <stdint.h>
#include "config.h"
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_make_opts {
    sm_expert_fmt experts;   /* format of the experts of layers 1..L-2 (0 and L-1 stay BF16
                                consolidated when experts != BF16, as the Quark export does) */
    uint64_t seed;
    int shards;              /* 1: model.safetensors; K > 1: K shards + index.json */
    int progress;            /* progress line on stderr for anything over a second */
    int threads;             /* generation workers; 0 = online cores, at least 2 (the bytes
                                do not depend on it) */
} sm_make_opts;

int sm_make_model(const sm_config *c, const sm_make_opts *o, const char *outdir, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
