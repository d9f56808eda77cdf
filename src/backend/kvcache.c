/* kvcache.c: paged KV cache bookkeeping (kvcache.h): free-page stack, block tables, slots.
 *
 * Free pages are a stack; without a shuffle seed the stack is filled so pages come out in
 * ascending order (0, 1, 2, ...), which makes tables contiguous and easy to read in a
 * debugger; with a seed the stack is a Fisher-Yates permutation (splitmix64), so tests can
 * prove no backend assumes contiguous pages.  Reservation is all-or-nothing: a request that
 * cannot get every page it needs gets none.  We rejected a buddy/bitmap allocator: every page
 * has the same size, so a stack is O(1) and exact.  The prefix cache (kvcache.h) adds per-page
 * reference counts, a hash table of registered pages (open addressing, linear probing, twice
 * the pages in slots) and an LRU list of the registered pages no request holds.
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
    kv->ref = calloc((size_t)nblocks, sizeof(int));
    kv->cached = calloc((size_t)nblocks, 1);
    kv->phash = calloc((size_t)nblocks, sizeof(uint64_t));
    kv->parent = malloc(sizeof(int) * (size_t)nblocks);
    kv->ptok = malloc(sizeof(int) * (size_t)nblocks * SM_KV_BLOCK);
    kv->lru_prev = malloc(sizeof(int) * (size_t)nblocks);
    kv->lru_next = malloc(sizeof(int) * (size_t)nblocks);
    kv->hcap = 16;
    while (kv->hcap < 2 * nblocks) kv->hcap *= 2;
    kv->htab = malloc(sizeof(int) * (size_t)kv->hcap);
    if (!kv->free_pages || !kv->tables || !kv->nblk || !kv->len || !kv->live || !kv->ref || !kv->cached || !kv->phash ||
        !kv->parent || !kv->ptok || !kv->lru_prev || !kv->lru_next || !kv->htab) {
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
    for (int i = 0; i < kv->hcap; i++) kv->htab[i] = -1;
    kv->lru_head = kv->lru_tail = -1;
    return 0;
}

void sm_kv_free(sm_kv *kv) {
    if (!kv) return;
    free(kv->free_pages);
    free(kv->tables);
    free(kv->nblk);
    free(kv->len);
    free(kv->live);
    free(kv->ref); free(kv->cached); free(kv->phash); free(kv->parent); free(kv->ptok);
    free(kv->lru_prev); free(kv->lru_next); free(kv->htab);
    memset(kv, 0, sizeof *kv);
}

/* ---------------------------------------------------------------- the prefix cache */

/* The LRU list of registered pages no request holds. */
static void lru_unlink(sm_kv *kv, int p) {
    int a = kv->lru_prev[p], b = kv->lru_next[p];
    if (a >= 0) kv->lru_next[a] = b; else kv->lru_head = b;
    if (b >= 0) kv->lru_prev[b] = a; else kv->lru_tail = a;
    kv->nlru--;
}
static void lru_push_tail(sm_kv *kv, int p) {
    kv->lru_prev[p] = kv->lru_tail;
    kv->lru_next[p] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = p; else kv->lru_head = p;
    kv->lru_tail = p;
    kv->nlru++;
}

/* The hash of block i's tokens t [16] chained to the previous block's hash h. */
static uint64_t chain(uint64_t h, const int *t) {
    for (int j = 0; j < SM_KV_BLOCK; j++) h = sm_mix64(h ^ ((uint64_t)(uint32_t)t[j] + 0x9E3779B97F4A7C15ull * (uint64_t)(j + 1)));
    return h;
}

/* The registered page with hash h, tokens t and parent pp, or -1. */
static int table_find(const sm_kv *kv, uint64_t h, const int *t, int pp) {
    const int mask = kv->hcap - 1;
    for (int i = (int)(h & (uint64_t)mask), n = 0; n < kv->hcap; i = (i + 1) & mask, n++) {
        const int p = kv->htab[i];
        if (p == -1) return -1;
        if (p >= 0 && kv->phash[p] == h && kv->parent[p] == pp &&
            !memcmp(kv->ptok + (int64_t)p * SM_KV_BLOCK, t, sizeof(int) * SM_KV_BLOCK))
            return p;
    }
    return -1;
}
static void table_put(sm_kv *kv, int p) {
    const int mask = kv->hcap - 1;
    int i = (int)(kv->phash[p] & (uint64_t)mask);
    while (kv->htab[i] >= 0) i = (i + 1) & mask;
    kv->htab[i] = p;
}
static void table_del(sm_kv *kv, int p) {
    const int mask = kv->hcap - 1;
    for (int i = (int)(kv->phash[p] & (uint64_t)mask), n = 0; n < kv->hcap && kv->htab[i] != -1; i = (i + 1) & mask, n++)
        if (kv->htab[i] == p) { kv->htab[i] = -2; return; }
}

/* Unregister page p (it keeps its holders, if any). */
static void uncache(sm_kv *kv, int p) {
    if (!kv->cached[p]) return;
    table_del(kv, p);
    kv->cached[p] = 0;
    if (kv->ref[p] == 0) lru_unlink(kv, p);
}

void sm_kv_prefix_enable(sm_kv *kv, int on, uint64_t key) {
    if (!on)
        for (int p = 0; p < kv->nblocks; p++)
            if (kv->cached[p]) {
                const int idle = kv->ref[p] == 0;
                uncache(kv, p);
                if (idle) kv->free_pages[kv->nfree++] = p;
            }
    kv->prefix = on;
    kv->key = key;
}

void sm_kv_prefix_attach(sm_kv *kv, int slot, const int *tokens, int n, int *ntok) {
    *ntok = 0;
    if (!kv->prefix || slot < 0 || slot >= kv->max_req || !kv->live[slot] || kv->nblk[slot] || n < 1) return;
    kv->queries += n;
    int *t = kv->tables + (int64_t)slot * kv->max_bpr;
    uint64_t h = kv->key;
    int m = 0, pp = -1;
    /* at most (n - 1) / 16 blocks: the last prompt token is always computed */
    for (; m < (n - 1) / SM_KV_BLOCK; m++) {
        h = chain(h, tokens + (int64_t)m * SM_KV_BLOCK);
        const int p = table_find(kv, h, tokens + (int64_t)m * SM_KV_BLOCK, pp);
        if (p < 0) break;
        if (kv->ref[p]++ == 0) lru_unlink(kv, p);
        t[m] = p;
        pp = p;
    }
    kv->nblk[slot] = m;
    kv->len[slot] = m * SM_KV_BLOCK;
    kv->hits += (long long)m * SM_KV_BLOCK;
    *ntok = m * SM_KV_BLOCK;
}

void sm_kv_prefix_commit(sm_kv *kv, int slot, const int *tokens, int n) {
    if (!kv->prefix || slot < 0 || slot >= kv->max_req || !kv->live[slot]) return;
    if (n > kv->len[slot]) n = kv->len[slot];
    const int *t = kv->tables + (int64_t)slot * kv->max_bpr;
    uint64_t h = kv->key;
    int pp = -1;
    for (int b = 0; b < n / SM_KV_BLOCK && b < kv->nblk[slot]; b++) {
        const int *tb = tokens + (int64_t)b * SM_KV_BLOCK, p = t[b];
        h = chain(h, tb);
        if (!kv->cached[p]) {
            /* another page holding the same blocks: this request's pages stay its own from here */
            if (table_find(kv, h, tb, pp) >= 0) return;
            kv->cached[p] = 1;
            kv->phash[p] = h;
            kv->parent[p] = pp;
            memcpy(kv->ptok + (int64_t)p * SM_KV_BLOCK, tb, sizeof(int) * SM_KV_BLOCK);
            table_put(kv, p);
        }
        pp = p;
    }
}

void sm_kv_pages(const sm_kv *kv, int *used, int *cached, int *freep) {
    *cached = kv->nlru;
    *freep = kv->nfree;
    *used = kv->nblocks - kv->nlru - kv->nfree;
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
    if (more > kv->nfree + kv->nlru)
        return sm_errf(e, "kv cache: no free page for request %d (%d positions need %d more pages, %d of %d free)",
                       slot, ntokens, more, kv->nfree + kv->nlru, kv->nblocks);
    int *t = kv->tables + (int64_t)slot * kv->max_bpr;
    for (int b = kv->nblk[slot]; b < need; b++) {
        int p;
        if (kv->nfree) {
            p = kv->free_pages[--kv->nfree];
        } else { /* the least recently used cached page no request holds */
            p = kv->lru_head;
            uncache(kv, p);
        }
        kv->ref[p] = 1;
        t[b] = p;
    }
    kv->nblk[slot] = need;
    return 0;
}

void sm_kv_release(sm_kv *kv, int slot) {
    if (slot < 0 || slot >= kv->max_req || !kv->live[slot]) return;
    sm_kv_drop(kv, slot);
    kv->live[slot] = 0;
}

void sm_kv_drop(sm_kv *kv, int slot) {
    if (slot < 0 || slot >= kv->max_req || !kv->live[slot]) return;
    int *t = kv->tables + (int64_t)slot * kv->max_bpr;
    /* Push in reverse so the next reservation pops the same pages in the same order; a
     * registered page no one holds any more joins the LRU list instead (deeper blocks first,
     * so they are evicted before the blocks they extend). */
    for (int b = kv->nblk[slot] - 1; b >= 0; b--) {
        const int p = t[b];
        if (--kv->ref[p] == 0) {
            if (kv->cached[p]) lru_push_tail(kv, p);
            else kv->free_pages[kv->nfree++] = p;
        }
        t[b] = -1;
    }
    kv->nblk[slot] = 0;
    kv->len[slot] = 0;
}
