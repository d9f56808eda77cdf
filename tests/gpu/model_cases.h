/* model_cases.h: what the two files of the model group share (model.c: CPU vs CUDA on the
 * same steps, the entry; model_engine.c: through the engine): bounds, sizes, made
 * models in a temporary tree, the comparison measure, the test devices of a world, and the
 * cases the entry runs. */
#ifndef SM_GPU_MODEL_CASES_H
#define SM_GPU_MODEL_CASES_H
#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "model/weights.h"
#include "backend/backend.h"
#include "backend/kvcache.h"

#define TM_BOUND 2e-2       /* GPU vs CPU logits, docs/model.md section 10 */
#define TM_WORLD_BOUND 1e-2 /* W ranks vs one rank, both on the GPU (docs/model.md section 10) */
#define TM_BOUND_W4A4 4e-2       /* the same with W4A4 layers: rounding to MXFP4 amplifies bf16 flips */
#define TM_WORLD_BOUND_W4A4 3e-2
#define TM_MAX_LEN 512      /* positions per request */
#define TM_NREQ 3           /* requests per case */
#define TM_CHUNK 128        /* backend max_rows: forces a chunked prefill */

/* Remove the tree d. */
void tm_rm_rf(const char *d);
/* ||o - r|| / ||r|| over n elements (infinite on a non-finite output); tm_relerr_parts gives
 * the two sums (-1 on a non-finite output) and tm_rel their ratio. */
double tm_relerr(const float *o, const float *r, size_t n);
int tm_relerr_parts(const float *o, const float *r, size_t n, double *num, double *den);
double tm_rel(double num, double den);
/* make-model of c (experts fmt, seed) into root/name: 0 and its path in dir, or -1. */
int tm_make(const char *root, const char *name, const sm_config *c, int fmt, uint64_t seed, char *dir, size_t cap);
/* The devices of a world of w ranks (SPARKMONO_TEST_DEVICES, else virtual ranks on device 0);
 * returns the comm kind. */
int tm_world_devices(int w, int *devs);

/* A backend-level rig (model_engine.c): make-model's tiny preset (MXFP4, seed) as root/name,
 * loaded; a cache of nslot request slots of ml positions, each added and reserved whole (slot
 * ids in slots [nslot]); the CUDA backend on it, max_rows 64, world 0 or 1: one rank, else
 * that many virtual ranks (tm_world_devices), layout moe_tp.  0, or -1 after a GH_CHECK naming
 * the failure; tm_rig_free frees what was made either way. */
typedef struct tm_rig {
    sm_model m;
    sm_kv kv;
    sm_backend b;
    int have_m, have_b;
} tm_rig;
int tm_rig_make(tm_rig *g, const char *root, const char *name, uint64_t seed, int world, int moe_tp, int nslot, int ml,
                int *slots);
void tm_rig_free(tm_rig *g);

/* model_engine.c (each returns its failures, printing PASS / FAIL lines) */
int tm_spec(const char *root, uint64_t seed);
int tm_prefix(const char *root, uint64_t seed); /* the prefix cache: the same ids with it as without */
int tm_structured(const char *root, uint64_t seed); /* constrained output on the GPU */
int tm_kv_mem(const char *root, uint64_t seed); /* the KV pool sized from memory */
int tm_spec_loop(const char *root, uint64_t seed, int world, int moe_tp);
int tm_synth(const char *root, uint64_t seed);
int tm_mono_guards(void);
/* model_phases.c: a traced step's layer phases (sm_cuda_bench_phases), stock and monokernel */
int tm_phases(void);
int tm_world_guards(const char *root, uint64_t seed);
/* model_logprobs.c */
int tm_logprobs_steps(const char *root, uint64_t seed, int world);
int tm_logprobs_engine(const char *root, uint64_t seed);
#endif
