/* kvcache.h: paged KV cache bookkeeping (docs/model.md section 5), shared by every backend.
 *
 * The host side owns the block tables, the free list and request lengths; each backend owns
 * the pages themselves (per layer bf16 [nblocks][nKV_local][16][K(64) | V(64)]) in its own
 * memory.  A request's logical block p / 16 maps to a page through its block table; the slot
 * of a row at position p is page * 16 + p % 16.  One block table serves every layer.
 * We rejected per-backend bookkeeping: the CPU and GPU paths must agree on slots bit for bit.
 *
 * Prefix cache (sm_kv_prefix_*): a full page of a prompt, once its K/V are committed, can be
 * registered under a chained hash of the tokens of its block and of every block before it
 * (and of the engine's identity key); a later request whose prompt begins with the same blocks
 * takes those pages into its table read-only (a page is then held by several requests:
 * ref counts) and computes only the rest.  K/V of position p depend only on the tokens 0..p,
 * and every backend's ops are invariant to how rows are batched, so the reused pages hold the
 * bits the request would have computed.  A page no request holds stays cached (LRU list,
 * least recent first; a released request's deeper blocks before its first ones) until a
 * reservation needs it.  A match is exact: the hash finds a candidate, its 16 tokens and its
 * parent page (the previous block's) confirm it.  Pages a request writes are never shared:
 * only full prompt pages below its first computed position are taken.
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
    /* the prefix cache (per page) */
    int prefix;           /* 1: sm_kv_prefix_attach / _commit act (sm_kv_prefix_enable) */
    uint64_t key;         /* identity of what K/V depend on besides tokens (model, ranks, numerics) */
    int *ref;             /* [nblocks] live requests holding the page */
    unsigned char *cached;/* [nblocks] 1: registered (findable) */
    uint64_t *phash;      /* [nblocks] chained hash of a registered page */
    int *parent;          /* [nblocks] the registered page of the previous block (-1: block 0) */
    int *ptok;            /* [nblocks, 16] the block's tokens */
    int *lru_prev, *lru_next; /* [nblocks] registered pages with ref 0, head = least recent */
    int lru_head, lru_tail, nlru;
    int *htab;            /* [hcap] open addressing on phash: page id, -1 empty, -2 deleted */
    int hcap;
    long long queries, hits; /* prompt tokens looked up, of them found cached */
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
/* Return the slot's pages only (len 0; the slot stays live): a preempted request. */
void sm_kv_drop(sm_kv *kv, int slot);
/* Turn the prefix cache on (on 1) with identity key; off drops every registered page (the
 * pages stay where they are: held ones with their requests, the others free). */
void sm_kv_prefix_enable(sm_kv *kv, int on, uint64_t key);
/* A new request slot (no pages yet) with prompt tokens [n]: take the longest run of registered
 * pages matching its first blocks, at most (n - 1) / 16 of them (its last token is always
 * computed); *ntok = 16 x that many (0 when off), and len = *ntok.  Counts n queried tokens and
 * *ntok hits. */
void sm_kv_prefix_attach(sm_kv *kv, int slot, const int *tokens, int n, int *ntok);
/* Register the full pages of slot's first n tokens (their K/V committed: n <= len) that are not
 * registered yet, in block order, stopping at a block some other page already registers. */
void sm_kv_prefix_commit(sm_kv *kv, int slot, const int *tokens, int n);
/* Pages: held by live requests, registered and held by none, free. */
void sm_kv_pages(const sm_kv *kv, int *used, int *cached, int *freep);

/* Cache slot (page * 16 + pos % 16) of position pos of request slot; pos must be reserved. */
static inline int64_t sm_kv_slot(const sm_kv *kv, int slot, int pos) {
    return (int64_t)kv->tables[(int64_t)slot * kv->max_bpr + pos / SM_KV_BLOCK] * SM_KV_BLOCK + pos % SM_KV_BLOCK;
}

#ifdef __cplusplus
}
#endif
#endif
