/* test_kvcache.c: the paged KV cache bookkeeping (src/backend/kvcache.c): allocation, release, reuse,
 * the full-cache and too-long errors, slot mapping, shuffled page order. */
#include "check.h"
#include "backend/kvcache.h"
#include <string.h>

static void t_alloc_and_slots(void) {
    sm_kv kv;
    sm_err e = {""};
    CHECK(sm_kv_init(&kv, 8, 2, 100, 0, &e) == 0, "%s", e.msg);
    CHECK(kv.max_bpr == 7, "max_bpr %d", kv.max_bpr);
    int a = -1, b = -1;
    CHECK(sm_kv_add(&kv, &a, &e) == 0 && a == 0, "slot %d", a);
    CHECK(sm_kv_add(&kv, &b, &e) == 0 && b == 1, "slot %d", b);
    CHECK(sm_kv_reserve(&kv, a, 17, &e) == 0, "%s", e.msg); /* 2 pages: 0, 1 */
    CHECK(sm_kv_reserve(&kv, b, 5, &e) == 0, "%s", e.msg);  /* 1 page: 2 */
    CHECK(kv.nblk[a] == 2 && kv.nblk[b] == 1 && kv.nfree == 5, "nblk %d %d free %d", kv.nblk[a], kv.nblk[b], kv.nfree);
    CHECK(sm_kv_slot(&kv, a, 0) == 0 && sm_kv_slot(&kv, a, 15) == 15, "slots of page 0");
    CHECK(sm_kv_slot(&kv, a, 16) == 16 && sm_kv_slot(&kv, a, 16 + 3) == 19, "slots of page 1");
    CHECK(sm_kv_slot(&kv, b, 4) == 2 * 16 + 4, "slot of b: %lld", (long long)sm_kv_slot(&kv, b, 4));
    /* growing keeps the old pages and adds at the end */
    CHECK(sm_kv_reserve(&kv, a, 40, &e) == 0, "%s", e.msg);
    CHECK(kv.nblk[a] == 3 && kv.tables[0] == 0 && kv.tables[1] == 1 && kv.tables[2] == 3, "table %d %d %d",
          kv.tables[0], kv.tables[1], kv.tables[2]);
    /* reserving fewer positions keeps the pages */
    CHECK(sm_kv_reserve(&kv, a, 3, &e) == 0 && kv.nblk[a] == 3, "shrink kept %d", kv.nblk[a]);
    /* a third request: no slot */
    int c = -1;
    CHECK(sm_kv_add(&kv, &c, &e) == -1 && strstr(e.msg, "request slots"), "%s", e.msg);
    sm_kv_free(&kv);
}

static void t_release_reuse(void) {
    sm_kv kv;
    sm_err e = {""};
    CHECK(sm_kv_init(&kv, 4, 3, 64, 0, &e) == 0, "%s", e.msg);
    int a, b;
    sm_kv_add(&kv, &a, &e);
    sm_kv_add(&kv, &b, &e);
    CHECK(sm_kv_reserve(&kv, a, 48, &e) == 0, "%s", e.msg);
    int pa[3];
    memcpy(pa, kv.tables + (long)a * kv.max_bpr, sizeof pa);
    kv.len[a] = 48;
    sm_kv_release(&kv, a);
    CHECK(kv.nfree == 4 && !kv.live[a] && kv.len[a] == 0 && kv.nblk[a] == 0, "release: free %d", kv.nfree);
    CHECK(kv.tables[(long)a * kv.max_bpr] == -1, "table cleared");
    sm_kv_release(&kv, a); /* twice: no-op */
    CHECK(kv.nfree == 4, "double release changed free count to %d", kv.nfree);
    /* the slot and its pages are reused, in the same order */
    int c;
    CHECK(sm_kv_add(&kv, &c, &e) == 0 && c == a, "reused slot %d", c);
    CHECK(sm_kv_reserve(&kv, c, 48, &e) == 0, "%s", e.msg);
    CHECK(memcmp(pa, kv.tables + (long)c * kv.max_bpr, sizeof pa) == 0, "same pages on reuse");
    sm_kv_release(&kv, b);
    sm_kv_release(&kv, c);
    CHECK(kv.nfree == 4, "all pages back: %d", kv.nfree);
    sm_kv_free(&kv);
}

static void t_errors(void) {
    sm_kv kv;
    sm_err e = {""};
    CHECK(sm_kv_init(&kv, 0, 1, 16, 0, &e) == -1 && strstr(e.msg, "nblocks"), "%s", e.msg);
    CHECK(sm_kv_init(&kv, 4, 0, 16, 0, &e) == -1 && strstr(e.msg, "max_req"), "%s", e.msg);
    CHECK(sm_kv_init(&kv, 4, 2, 0, 0, &e) == -1 && strstr(e.msg, "max_len"), "%s", e.msg);
    CHECK(sm_kv_init(&kv, 3, 2, 64, 0, &e) == 0, "%s", e.msg);
    int a, b;
    sm_kv_add(&kv, &a, &e);
    sm_kv_add(&kv, &b, &e);
    /* too long: names the request and max_len */
    CHECK(sm_kv_reserve(&kv, a, 65, &e) == -1 && strstr(e.msg, "request 0") && strstr(e.msg, "max_len 64"), "%s",
          e.msg);
    CHECK(kv.nblk[a] == 0 && kv.nfree == 3, "failed reserve took pages");
    /* full cache: all or nothing */
    CHECK(sm_kv_reserve(&kv, a, 32, &e) == 0, "%s", e.msg);
    CHECK(sm_kv_reserve(&kv, b, 32, &e) == -1 && strstr(e.msg, "no free page") && strstr(e.msg, "request 1"), "%s",
          e.msg);
    CHECK(kv.nblk[b] == 0 && kv.nfree == 1, "partial reservation: nblk %d free %d", kv.nblk[b], kv.nfree);
    CHECK(sm_kv_reserve(&kv, b, 16, &e) == 0, "%s", e.msg);
    /* not a live slot */
    sm_kv_release(&kv, b);
    CHECK(sm_kv_reserve(&kv, b, 1, &e) == -1 && strstr(e.msg, "not a live"), "%s", e.msg);
    CHECK(sm_kv_reserve(&kv, 7, 1, &e) == -1 && strstr(e.msg, "request 7"), "%s", e.msg);
    sm_kv_free(&kv);
}

static void t_shuffled(void) {
    sm_kv kv, k2;
    sm_err e = {""};
    CHECK(sm_kv_init(&kv, 32, 1, 512, 12345, &e) == 0, "%s", e.msg);
    CHECK(sm_kv_init(&k2, 32, 1, 512, 12345, &e) == 0, "%s", e.msg);
    int a, b;
    sm_kv_add(&kv, &a, &e);
    sm_kv_add(&k2, &b, &e);
    CHECK(sm_kv_reserve(&kv, a, 512, &e) == 0, "%s", e.msg);
    CHECK(sm_kv_reserve(&k2, b, 512, &e) == 0, "%s", e.msg);
    /* a permutation of all pages, not the identity, same for the same seed */
    int seen[32] = {0}, ident = 1;
    for (int i = 0; i < 32; i++) {
        int p = kv.tables[i];
        CHECK(p >= 0 && p < 32 && !seen[p], "page %d at %d", p, i);
        if (p >= 0 && p < 32) seen[p] = 1;
        ident &= p == i;
    }
    CHECK(!ident, "shuffled pages came out in order");
    CHECK(memcmp(kv.tables, k2.tables, 32 * sizeof(int)) == 0, "same seed, different order");
    /* slot mapping through the scattered table */
    for (int p = 0; p < 512; p += 37)
        CHECK(sm_kv_slot(&kv, a, p) == (long long)kv.tables[p / 16] * 16 + p % 16, "slot of %d", p);
    sm_kv_free(&kv);
    sm_kv_free(&k2);
}

int main(void) {
    RUN(t_alloc_and_slots);
    RUN(t_release_reuse);
    RUN(t_errors);
    RUN(t_shuffled);
    return TEST_DONE();
}
