/* tok_table.h: the tokenizer's hash tables, byte arena and byte-level alphabet, shared by the
 * tokenizer (model/tokenizer.c, tokenizer_encode.c) and make-model's trainer (testing/tok_train.c).
 *
 * Keys are byte strings kept in an arena (one allocation that grows; slots hold offsets, so
 * growth moves no key); tables use open addressing with linear probing at load <= 1/2.  The
 * lookups on encode's hot path (tok_tab_find, tok_pair_find) are static inline here.  We
 * rejected a general-purpose hash map library: the keys are offsets into our own arena and the
 * merge table's key is a pair of ids, which such a map would copy or box.
 */
#ifndef SM_TOK_TABLE_H
#define SM_TOK_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- hashing and tables ---- */

static inline uint64_t tok_mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

/* Hash of n bytes; never 0 (0 marks an empty slot). */
uint64_t tok_hash_bytes(const void *p, size_t n);

typedef struct tok_arena {
    char *b;              /* [cap] bytes */
    size_t n, cap;        /* used, allocated */
} tok_arena;

/* Append n bytes; their offset in *off.  -1 when out of memory or past 4 GiB. */
int tok_arena_put(tok_arena *a, const void *p, size_t n, uint32_t *off);

typedef struct tok_slot {
    uint64_t h;           /* hash of the key; 0: empty */
    uint32_t off, len;    /* key bytes in the table's arena */
    int32_t val, aux;     /* value (cache: offset of the ids; others: an id or index), cache: id count */
} tok_slot;

typedef struct tok_strtab {
    tok_slot *s;          /* [cap] open addressing, linear probing */
    uint32_t cap, n;      /* slots (a power of two), entries */
} tok_strtab;

/* Equal bytes (short keys inline: most pieces are a few bytes). */
static inline int tok_same(const char *x, const char *y, size_t n) {
    if (n > 16) return !memcmp(x, y, n);
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return 0;
    return 1;
}

static inline tok_slot *tok_tab_find(const tok_strtab *t, const tok_arena *a, const void *k, size_t n, uint64_t h) {
    if (!t->cap) return NULL;
    uint32_t m = t->cap - 1;
    for (uint32_t i = (uint32_t)h & m;; i = (i + 1) & m) {
        tok_slot *s = &t->s[i];
        if (!s->h) return NULL;
        if (s->h == h && s->len == n && tok_same(a->b + s->off, k, n)) return s;
    }
}

/* Room for one more entry (load <= 1/2), up to maxcap slots; -1 when it cannot grow. */
int tok_tab_reserve(tok_strtab *t, uint32_t maxcap);

/* Insert a key known to be absent (after tok_tab_reserve). */
tok_slot *tok_tab_add(tok_strtab *t, uint64_t h, uint32_t off, uint32_t len, int32_t val);

/* Key bytes in the arena, then the entry; *dup set when the key was there (nothing added). */
int tok_tab_put(tok_strtab *t, tok_arena *a, const void *k, size_t n, int32_t val, tok_slot **out, int *dup);

typedef struct tok_pairtab {
    uint64_t *key;        /* [cap] (left id << 32) | right id; UINT64_MAX: empty */
    uint32_t *rank;       /* [cap] merge rank (training: the pair's count) */
    int32_t *id;          /* [cap] id of the merged token */
    uint32_t cap, n;      /* slots (a power of two), entries */
} tok_pairtab;

static inline uint64_t tok_pair_key(int a, int b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static inline int32_t tok_pair_find(const tok_pairtab *p, uint64_t k) {
    if (!p->cap) return -1;
    uint32_t m = p->cap - 1;
    for (uint32_t i = (uint32_t)tok_mix64(k) & m;; i = (i + 1) & m) {
        if (p->key[i] == k) return (int32_t)i;
        if (p->key[i] == UINT64_MAX) return -1;
    }
}

void tok_pair_free(tok_pairtab *p);

/* The slot of key k (inserted with rank 0, id -1 when new); -1 when out of memory. */
int32_t tok_pair_slot(tok_pairtab *p, uint64_t k);

/* ---- UTF-8 and the byte-level alphabet ---- */

/* Length of the valid UTF-8 character at s [n >= 1], or 0 when invalid; then *skip is the
 * length of the longest prefix of a valid sequence there (>= 1): one U+FFFD in lossy decoding. */
size_t tok_utf8_char(const uint8_t *s, size_t n, size_t *skip);

/* Code point of the valid character at s (length w). */
uint32_t tok_utf8_cp(const uint8_t *s, size_t w);

size_t tok_utf8_put(uint32_t c, char *o);

/* GPT-2's byte -> character table: printable Latin-1 bytes map to themselves, the other 68
 * (0-32, 127-160, 173) to 256, 257, ... in byte order. */
void tok_byte_chars(uint32_t cp[256]);

/* Byte of a byte-level character, or -1. */
int tok_char_byte(const uint32_t cp[256], uint32_t c);

/* Bytes of a token string s [n] under the byte-level alphabet into out [n]: their count, or
 * -1 when a character is outside it. */
long tok_token_bytes(const uint32_t cp[256], const char *s, size_t n, char *out);

#endif
