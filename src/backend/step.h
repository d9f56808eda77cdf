/* step.h: the one validator of a step (backend.h: sm_step), shared by every backend.
 *
 * A backend is made for one cache geometry (the sm_kv given at creation: pages per layer,
 * request slots, positions, blocks per request) and keeps a copy of it as an sm_kv_shape.
 * Every step is checked against the model and that geometry before anything runs: tokens in
 * the vocabulary, live request slots, positions inside the cache and backed by reserved
 * pages that exist, aux layer ids in [0, L].  Each problem is one line naming the backend
 * (`who`), the row and the value.  We rejected a check per backend: the CPU reference and the
 * CUDA backend must refuse exactly the same steps, or a test could pass on one and crash the
 * other.
 */
#ifndef SM_STEP_H
#define SM_STEP_H
#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#include "model/config.h"
#include "base/err.h"
#include "backend/kvcache.h"

#define SM_STEP_MAX_AUX (SM_MAX_LAYERS + 1) /* most aux entries of one step */

/* The cache geometry a backend was made for (no pointers: a copy outlives nothing). */
typedef struct sm_kv_shape {
    int nblocks;             /* pages per layer */
    int max_req;             /* request slots */
    int max_len;             /* positions per request */
    int max_bpr;             /* blocks per request */
} sm_kv_shape;

static inline sm_kv_shape sm_kv_shape_of(const sm_kv *kv) {
    sm_kv_shape g;
    g.nblocks = kv->nblocks;
    g.max_req = kv->max_req;
    g.max_len = kv->max_len;
    g.max_bpr = kv->max_bpr;
    return g;
}

/* 0 when step s is valid for a backend of model config c made for cache geometry `made`;
 * else -1 with one line "<who>: ..." in e.  A step of 0 rows needs no inputs. */
int sm_step_check(const sm_config *c, const sm_kv_shape *made, const sm_step *s, const char *who, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
