/* check.h: the summary `sparkmono check` prints for a loaded checkpoint: configuration, layer
 * kinds, expert format per layer, bytes per component, and the weight bytes one GPU holds in a
 * TP = EP deployment of W ranks (SPEC.md section 9).  Byte counts are computed from the
 * configuration and each layer's expert format (what the files store, or the online-MXFP4
 * copies when the model was loaded that way), not from file sizes, so they describe what a
 * backend uploads.  We rejected printing from the archive directly: the per-rank split
 * needs the component of every tensor anyway. */
#ifndef SM_SRC_CHECK_H
#define SM_SRC_CHECK_H
#include <stdint.h>
#include <stdio.h>
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_bytes {
    int64_t embed;        /* [V, H] bf16 */
    int64_t lm_head;      /* [V, H] bf16 */
    int64_t attn;         /* q, k, v, gate, o projections of all layers, bf16 */
    int64_t router;       /* router weights [E, H] + bias [E], f32, all layers */
    int64_t pool;         /* pooler [Hm, H] + unpooler [H, Hm], bf16, all layers */
    int64_t experts[3];   /* [sm_expert_fmt] expert weights + scales, all layers */
    int64_t norms;        /* norm gains and residual gates (bf16 in the file), all layers + final */
    int64_t total;        /* sum of the above */
} sm_bytes;

/* Bytes per component of m. */
void sm_model_bytes(const sm_model *m, sm_bytes *b);
/* Weight bytes one rank holds with W ranks (SPEC.md section 9: heads, experts, pooler rows
 * and unpooler rows split by W; router and norms replicated; embedding and lm_head split by
 * vocab rows, ceil(V/W)).  -1 when W does not divide nH, nKV, E, Hm and H. */
int64_t sm_rank_bytes(const sm_model *m, int W);
/* "SFSS SFSS ..." (F full, S sliding; a space every 4 layers) into buf. */
void sm_layer_kinds(const sm_config *c, char *buf, size_t n);
/* The whole summary. */
void sm_check_print(const sm_model *m, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
