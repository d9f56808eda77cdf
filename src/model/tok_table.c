/* tok_table.c: the tokenizer's tables, arena and UTF-8 / byte-level helpers (tok_table.h).
 *
 * Plain C over malloc'd arrays; every growth doubles and rehashes.  We rejected growing tables
 * in place (incremental rehash): tables are built once at load, and the encode cache grows to
 * a bound, so a full rehash is rare and simple.
 */
#include "model/tok_table.h"
#include <stdlib.h>

/* ---- hashing and tables ---- */

/* Hash of n bytes; never 0 (0 marks an empty slot). */
uint64_t tok_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = tok_mix64(h ^ w);
    return h ? h : 1;
}

/* Append n bytes; their offset in *off.  -1 when out of memory or past 4 GiB. */
int tok_arena_put(tok_arena *a, const void *p, size_t n, uint32_t *off) {
    if (a->n + n > UINT32_MAX) return -1;
    if (a->n + n > a->cap) {
        size_t nc = a->cap ? a->cap : 4096;
        while (nc < a->n + n) nc *= 2;
        char *nb = realloc(a->b, nc);
        if (!nb) return -1;
        a->b = nb;
        a->cap = nc;
    }
    if (n) memcpy(a->b + a->n, p, n);
    *off = (uint32_t)a->n;
    a->n += n;
    return 0;
}

/* Room for one more entry (load <= 1/2), up to maxcap slots; -1 when it cannot grow. */
int tok_tab_reserve(tok_strtab *t, uint32_t maxcap) {
    if ((uint64_t)(t->n + 1) * 2 <= t->cap) return 0;
    uint32_t nc = t->cap ? t->cap * 2 : 1024;
    if (nc > maxcap || nc < t->cap) return -1;
    tok_slot *ns = calloc(nc, sizeof *ns);
    if (!ns) return -1;
    for (uint32_t i = 0; i < t->cap; i++) {
        if (!t->s[i].h) continue;
        uint32_t j = (uint32_t)t->s[i].h & (nc - 1);
        while (ns[j].h) j = (j + 1) & (nc - 1);
        ns[j] = t->s[i];
    }
    free(t->s);
    t->s = ns;
    t->cap = nc;
    return 0;
}

/* Insert a key known to be absent (after tab_reserve). */
tok_slot *tok_tab_add(tok_strtab *t, uint64_t h, uint32_t off, uint32_t len, int32_t val) {
    uint32_t m = t->cap - 1, i = (uint32_t)h & m;
    while (t->s[i].h) i = (i + 1) & m;
    tok_slot *s = &t->s[i];
    s->h = h, s->off = off, s->len = len, s->val = val, s->aux = 0;
    t->n++;
    return s;
}

/* Key bytes in the arena, then the entry; *dup set when the key was there (nothing added). */
int tok_tab_put(tok_strtab *t, tok_arena *a, const void *k, size_t n, int32_t val, tok_slot **out, int *dup) {
    uint64_t h = tok_hash_bytes(k, n);
    tok_slot *s = tok_tab_find(t, a, k, n, h);
    *dup = s != NULL;
    if (s) { *out = s; return 0; }
    uint32_t off;
    if (tok_tab_reserve(t, UINT32_MAX / 2 + 1) || tok_arena_put(a, k, n, &off)) return -1;
    *out = tok_tab_add(t, h, off, (uint32_t)n, val);
    return 0;
}

void tok_pair_free(tok_pairtab *p) {
    free(p->key);
    free(p->rank);
    free(p->id);
    memset(p, 0, sizeof *p);
}

/* The slot of key k (inserted with rank 0, id -1 when new); -1 when out of memory. */
int32_t tok_pair_slot(tok_pairtab *p, uint64_t k) {
    if ((uint64_t)(p->n + 1) * 2 > p->cap) {
        uint32_t nc = p->cap ? p->cap * 2 : 1024;
        tok_pairtab q = {malloc(sizeof(uint64_t) * nc), malloc(sizeof(uint32_t) * nc), malloc(sizeof(int32_t) * nc), nc, p->n};
        if (!q.key || !q.rank || !q.id) { tok_pair_free(&q); return -1; }
        memset(q.key, 0xff, sizeof(uint64_t) * nc);
        for (uint32_t i = 0; i < p->cap; i++) {
            if (p->key[i] == UINT64_MAX) continue;
            uint32_t j = (uint32_t)tok_mix64(p->key[i]) & (nc - 1);
            while (q.key[j] != UINT64_MAX) j = (j + 1) & (nc - 1);
            q.key[j] = p->key[i], q.rank[j] = p->rank[i], q.id[j] = p->id[i];
        }
        tok_pair_free(p);
        *p = q;
    }
    uint32_t m = p->cap - 1, i = (uint32_t)tok_mix64(k) & m;
    for (; p->key[i] != UINT64_MAX; i = (i + 1) & m)
        if (p->key[i] == k) return (int32_t)i;
    p->key[i] = k, p->rank[i] = 0, p->id[i] = -1;
    p->n++;
    return (int32_t)i;
}

/* ---- UTF-8 and the byte-level alphabet ---- */

/* Length of the valid UTF-8 character at s [n >= 1], or 0 when invalid; then *skip is the
 * length of the longest prefix of a valid sequence there (>= 1): one U+FFFD in lossy decoding. */
size_t tok_utf8_char(const uint8_t *s, size_t n, size_t *skip) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t w;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) w = 2;
    else if (c >= 0xE0 && c <= 0xEF) w = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) w = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else { *skip = 1; return 0; }
    for (size_t i = 1; i < w; i++) {
        if (i >= n || s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) { *skip = i; return 0; }
    }
    return w;
}

/* Code point of the valid character at s (length w). */
uint32_t tok_utf8_cp(const uint8_t *s, size_t w) {
    if (w == 1) return s[0];
    uint32_t c = s[0] & (0xFF >> (w + 1));
    for (size_t i = 1; i < w; i++) c = (c << 6) | (s[i] & 0x3F);
    return c;
}

size_t tok_utf8_put(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* GPT-2's byte -> character table: printable Latin-1 bytes map to themselves, the other 68
 * (0-32, 127-160, 173) to 256, 257, ... in byte order. */
void tok_byte_chars(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* Byte of a byte-level character, or -1. */
int tok_char_byte(const uint32_t cp[256], uint32_t c) {
    if (c < 256) return cp[c] == c ? (int)c : -1;
    if (c >= 256 + 68) return -1;
    for (int b = 0; b < 256; b++)
        if (cp[b] == c) return b;
    return -1;
}

/* Bytes of a token string s [n] under the byte-level alphabet into out [n]: their count, or
 * -1 when a character is outside it. */
long tok_token_bytes(const uint32_t cp[256], const char *s, size_t n, char *out) {
    size_t i = 0, k = 0, skip;
    while (i < n) {
        size_t w = tok_utf8_char((const uint8_t *)s + i, n - i, &skip);
        if (!w) return -1;
        int b = tok_char_byte(cp, tok_utf8_cp((const uint8_t *)s + i, w));
        if (b < 0) return -1;
        out[k++] = (char)b;
        i += w;
    }
    return (long)k;
}
