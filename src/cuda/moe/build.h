/* build.h: building one layer's experts on the device, shared by the upload of a checkpoint
 * (repack.cu) and the device synthesizer (synth.cu): the layer allocation (layer.cu) and the
 * driver that fills a staging buffer with each raw expert matrix and repacks it (repack.cu).
 * Host functions only; the caller's current device is the one used.
 * We rejected one driver per source: the two copies of the expert loop, the NaN check and
 * the stream handling drifted apart before.
 */
#ifndef SM_CUDA_MOE_BUILD_H
#define SM_CUDA_MOE_BUILD_H
#include "cuda/moe/moe.h"

/* Validate the widths of config c for expert format fmt (moe.h limits); 0 or -1 with e.
 * shard: c describes a rank's shard (E = its experts, I = its slice), which may hold fewer
 * experts than K. */
int moe_check_dims(const sm_config *c, int fmt, int shard, sm_err *e);
/* Allocate blob, desc and post_norm of a layer of config c, format fmt (L zeroed first);
 * shard as moe_check_dims. */
int moe_layer_alloc(const sm_config *c, int fmt, int shard, sm_cuda_moe_layer *L, sm_err *e);

/* c with E = X->ne experts and I = X->ni: the config a shard's layer and workspace have. */
sm_config moe_shard_config(const sm_config *c, const sm_shard_experts *X);

/* Where a layer's raw (checkpoint-layout) expert matrices come from. */
typedef struct moe_source {
    const char *who;          /* error prefix, e.g. "cuda moe upload" */
    int l;                    /* layer index (messages, synthesis keys) */
    const void *ctx;          /* the source's own data */
    /* Write matrix mat (0: gate_up [2I, Hm], 1: down [Hm, I]) of expert x in checkpoint
     * layout to the device staging buffer (weights at w, scales at s), all work on st. */
    int (*matrix)(const struct moe_source *src, int x, int mat, uint8_t *w, uint8_t *s, cudaStream_t st, sm_err *e);
    /* Write eff(post_expert_norm) [Hm] floats to the device array dst, on st. */
    int (*post_norm)(const struct moe_source *src, float *dst, cudaStream_t st, sm_err *e);
    int shard;                /* 1: a rank's shard (c's E and I are the shard's; moe_check_dims) */
    int x0;                   /* global id of local expert 0 (messages) */
} moe_source;

/* Allocate layer L of config c, format fmt, and fill it from src on stream st; the layer is
 * complete on return (st synchronized).  On error L is freed. */
int moe_build(const sm_config *c, int fmt, const moe_source *src, sm_cuda_moe_layer *L, cudaStream_t st, sm_err *e);

#endif
