/* kvcache.h: paged KV cache bookkeeping (docs/model.md section 5), shared by every backend.
 *
 * The host side owns the block tables, the free list and request lengths; each backend owns
 * the pages themselves (per layer bf16 [nblocks][nKV_local][16][K(64) | V(64)]) in its own
 * memory.  A request's logical block p / 16 maps to a page through its block table; the slot
 * of a row at position p is page * 16 + p % 16.  One block table serves every layer.
 * We rejected per-backend bookkeeping: the CPU and GPU paths must agree on slots bit for bit.
 */
#ifndef SM_KVCACHE_H
#define SM_KVCACHE_H
#include <stdint.h>
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SM_KV_BLOCK 16 /* tokens per page */

typedef struct sm_kv {
    int nblocks;          /* pages per layer */
    int max_req;          /* request slots */
    int max_len;          /* max model length (positions per request) */
    int max_bpr;          /* max blocks per request = ceil(max_len / 16) */
    int *free_pages;      /* [nblocks] stack of free page ids */
    int nfree;
    int *tables;          /* [max_req, max_bpr] page ids, -1 unused */
    int *nblk;            /* [max_req] pages held */
    int *len;             /* [max_req] tokens whose K/V are committed */
    unsigned char *live;  /* [max_req] slot in use */
} sm_kv;

/* shuffle_seed != 0 hands out pages in a shuffled order (tests: scattered tables). */
int sm_kv_init(sm_kv *kv, int nblocks, int max_req, int max_len, uint64_t shuffle_seed, sm_err *e);
void sm_kv_free(sm_kv *kv);
/* Take a free request slot; error when all max_req are live. */
int sm_kv_add(sm_kv *kv, int *slot, sm_err *e);
/* Make positions [0, ntokens) of slot addressable (allocating pages); error naming the
 * request when ntokens > max_len or when the cache has no free page left. */
int sm_kv_reserve(sm_kv *kv, int slot, int ntokens, sm_err *e);
/* Return the slot and its pages. */
void sm_kv_release(sm_kv *kv, int slot);
/* Cache slot (page * 16 + pos % 16) of position pos of request slot; pos must be reserved. */
static inline int64_t sm_kv_slot(const sm_kv *kv, int slot, int pos) {
    return (int64_t)kv->tables[(int64_t)slot * kv->max_bpr + pos / SM_KV_BLOCK] * SM_KV_BLOCK + pos % SM_KV_BLOCK;
}

#ifdef __cplusplus
}
#endif
#endif
