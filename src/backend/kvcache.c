/* kvcache.c: paged KV cache bookkeeping (kvcache.h): free-page stack, block tables, slots.
 *
 * Free pages are a stack; without a shuffle seed the stack is filled so pages come out in
 * ascending order (0, 1, 2, ...), which makes tables contiguous and easy to read in a
 * debugger; with a seed the stack is a Fisher-Yates permutation (splitmix64), so tests can
 * prove no backend assumes contiguous pages.  Reservation is all-or-nothing: a request that
 * cannot get every page it needs gets none.  We rejected a buddy/bitmap allocator: every page
 * has the same size, so a stack is O(1) and exact.
 */
#include "backend/kvcache.h"
#include "model/rng.h"
#include <stdlib.h>
#include <string.h>

int sm_kv_init(sm_kv *kv, int nblocks, int max_req, int max_len, uint64_t shuffle_seed, sm_err *e) {
    memset(kv, 0, sizeof *kv);
    if (nblocks <= 0) return sm_errf(e, "kv cache: nblocks %d must be positive", nblocks);
    if (max_req <= 0) return sm_errf(e, "kv cache: max_req %d must be positive", max_req);
    if (max_len <= 0) return sm_errf(e, "kv cache: max_len %d must be positive", max_len);
    int max_bpr = (int)(((int64_t)max_len + SM_KV_BLOCK - 1) / SM_KV_BLOCK);
    kv->nblocks = nblocks;
    kv->max_req = max_req;
    kv->max_len = max_len;
    kv->max_bpr = max_bpr;
    kv->free_pages = malloc(sizeof(int) * (size_t)nblocks);
    kv->tables = malloc(sizeof(int) * (size_t)max_req * (size_t)max_bpr);
    kv->nblk = calloc((size_t)max_req, sizeof(int));
    kv->len = calloc((size_t)max_req, sizeof(int));
    kv->live = calloc((size_t)max_req, 1);
    if (!kv->free_pages || !kv->tables || !kv->nblk || !kv->len || !kv->live) {
        sm_kv_free(kv);
        return sm_errf(e, "kv cache: out of memory for %d pages and %d requests of %d positions", nblocks,
                       max_req, max_len);
    }
    /* Stack top (index nfree-1) is handed out first: page 0 on top. */
    for (int i = 0; i < nblocks; i++) kv->free_pages[i] = nblocks - 1 - i;
    if (shuffle_seed) {
        uint64_t st = shuffle_seed;
        for (int i = nblocks - 1; i > 0; i--) {
            int j = (int)(sm_rng_next(&st) % (uint64_t)(i + 1));
            int t = kv->free_pages[i]; kv->free_pages[i] = kv->free_pages[j]; kv->free_pages[j] = t;
        }
    }
    kv->nfree = nblocks;
    for (int64_t i = 0; i < (int64_t)max_req * max_bpr; i++) kv->tables[i] = -1;
    return 0;
}

void sm_kv_free(sm_kv *kv) {
    if (!kv) return;
    free(kv->free_pages);
    free(kv->tables);
    free(kv->nblk);
    free(kv->len);
    free(kv->live);
    memset(kv, 0, sizeof *kv);
}

int sm_kv_add(sm_kv *kv, int *slot, sm_err *e) {
    for (int r = 0; r < kv->max_req; r++) {
        if (kv->live[r]) continue;
        kv->live[r] = 1;
        kv->nblk[r] = 0;
        kv->len[r] = 0;
        for (int b = 0; b < kv->max_bpr; b++) kv->tables[(int64_t)r * kv->max_bpr + b] = -1;
        *slot = r;
        return 0;
    }
    return sm_errf(e, "kv cache: all %d request slots are in use", kv->max_req);
}

int sm_kv_reserve(sm_kv *kv, int slot, int ntokens, sm_err *e) {
    if (slot < 0 || slot >= kv->max_req || !kv->live[slot])
        return sm_errf(e, "kv cache: request %d is not a live request slot (max_req %d)", slot, kv->max_req);
    if (ntokens < 0) return sm_errf(e, "kv cache: request %d asks for %d positions", slot, ntokens);
    if (ntokens > kv->max_len)
        return sm_errf(e, "kv cache: request %d needs %d positions, more than max_len %d", slot, ntokens,
                       kv->max_len);
    int need = (ntokens + SM_KV_BLOCK - 1) / SM_KV_BLOCK;
    int more = need - kv->nblk[slot];
    if (more <= 0) return 0;
    if (more > kv->nfree)
        return sm_errf(e, "kv cache: no free page for request %d (%d positions need %d more pages, %d of %d free)",
                       slot, ntokens, more, kv->nfree, kv->nblocks);
    int *t = kv->tables + (int64_t)slot * kv->max_bpr;
    for (int b = kv->nblk[slot]; b < need; b++) t[b] = kv->free_pages[--kv->nfree];
    kv->nblk[slot] = need;
    return 0;
}

void sm_kv_release(sm_kv *kv, int slot) {
    if (slot < 0 || slot >= kv->max_req || !kv->live[slot]) return;
    int *t = kv->tables + (int64_t)slot * kv->max_bpr;
    /* Push in reverse so the next reservation pops the same pages in the same order. */
    for (int b = kv->nblk[slot] - 1; b >= 0; b--) {
        kv->free_pages[kv->nfree++] = t[b];
        t[b] = -1;
    }
    kv->nblk[slot] = 0;
    kv->len[slot] = 0;
    kv->live[slot] = 0;
}
