/* tokenizer.c: byte-level BPE from a Hugging Face tokenizer.json (see tokenizer.h).
 *
 * Encode is the tokenizers library's pipeline, step for step: added tokens are cut out first
 * (leftmost, then longest; those with normalized = false in a first pass over the text, the
 * others in a second pass over what is left), every remaining segment goes through the
 * pre-tokenizer steps (regex Split with its delimiter behaviour, ByteLevel's optional prefix
 * space and GPT-2 split), and each piece is merged by BPE on its bytes: the pair of lowest
 * merge rank first, the leftmost among equals, with a binary heap over a linked list of
 * symbols (n log n: a piece of one million equal bytes stays fast).  Pieces of up to 256 bytes
 * are cached (bytes -> ids) in an open-addressing hash table that only grows, up to a bound;
 * merge ranks are looked up in a hash table keyed by the pair of ids.  The cache is used by
 * one encode at a time (a mutex taken with trylock): a concurrent encode runs without it and
 * gets the same ids.  Regexes are compiled by PCRE2 with UTF, UCP and MULTILINE (Oniguruma,
 * which the library uses, has Ruby's line anchors) and JIT-compiled when the library can;
 * matches are iterated as Oniguruma does (an empty match right after the previous one is
 * skipped by one character).  Decode maps each token to bytes (ByteLevel's table; a token
 * with a character outside it is its own UTF-8) and replaces invalid UTF-8 with U+FFFD, one
 * per maximal invalid subsequence, as Rust's from_utf8_lossy does.
 *
 * Supported: model BPE (merges as "a b" strings or [a, b] pairs; unk_token, fuse_unk,
 * ignore_merges); normalizer null; pre_tokenizer ByteLevel, Split or a Sequence of Splits
 * ending with ByteLevel; decoder ByteLevel; added tokens without lstrip, rstrip or
 * single_word.  The post_processor, truncation and padding are not applied (encode returns
 * the ids of the text alone, like encode(text, add_special_tokens=False)).  Anything else is
 * refused at load with the file and the field.
 *
 * We rejected a trie of merges walked greedily (not BPE's order: it gives other ids) and
 * re-scanning the symbol list for the best pair after every merge (quadratic in the piece).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer.h"
#include "base/outfile.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_STEPS 8                  /* pre-tokenizer steps */
#define MAX_ID (1 << 26)             /* ids above are refused (a 64 M-entry vocabulary) */
#define CACHE_KEY_MAX 256            /* longest piece the cache holds (bytes) */
#define CACHE_MAX ((uint32_t)1 << 18) /* most cached pieces */

/* The GPT-2 split of ByteLevel with use_regex (the library's fixed pattern). */
static const char *GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* The split of the tokenizers sm_tokenizer_write_trained writes (GPT-4 / Llama-3 kind). */
static const char *TRAIN_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- hashing and tables ---- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

/* Hash of n bytes; never 0 (0 marks an empty slot). */
static uint64_t hash_bytes(const void *p, size_t n) {
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
    h = mix64(h ^ w);
    return h ? h : 1;
}

typedef struct arena {
    char *b;              /* [cap] bytes */
    size_t n, cap;        /* used, allocated */
} arena;

/* Append n bytes; their offset in *off.  -1 when out of memory or past 4 GiB. */
static int arena_put(arena *a, const void *p, size_t n, uint32_t *off) {
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

typedef struct slot {
    uint64_t h;           /* hash of the key; 0: empty */
    uint32_t off, len;    /* key bytes in the table's arena */
    int32_t val, aux;     /* value (cache: offset of the ids; others: an id or index), cache: id count */
} slot;

typedef struct strtab {
    slot *s;              /* [cap] open addressing, linear probing */
    uint32_t cap, n;      /* slots (a power of two), entries */
} strtab;

/* Equal bytes (short keys inline: most pieces are a few bytes). */
static inline int same(const char *x, const char *y, size_t n) {
    if (n > 16) return !memcmp(x, y, n);
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return 0;
    return 1;
}

static inline slot *tab_find(const strtab *t, const arena *a, const void *k, size_t n, uint64_t h) {
    if (!t->cap) return NULL;
    uint32_t m = t->cap - 1;
    for (uint32_t i = (uint32_t)h & m;; i = (i + 1) & m) {
        slot *s = &t->s[i];
        if (!s->h) return NULL;
        if (s->h == h && s->len == n && same(a->b + s->off, k, n)) return s;
    }
}

/* Room for one more entry (load <= 1/2), up to maxcap slots; -1 when it cannot grow. */
static int tab_reserve(strtab *t, uint32_t maxcap) {
    if ((uint64_t)(t->n + 1) * 2 <= t->cap) return 0;
    uint32_t nc = t->cap ? t->cap * 2 : 1024;
    if (nc > maxcap || nc < t->cap) return -1;
    slot *ns = calloc(nc, sizeof *ns);
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
static slot *tab_add(strtab *t, uint64_t h, uint32_t off, uint32_t len, int32_t val) {
    uint32_t m = t->cap - 1, i = (uint32_t)h & m;
    while (t->s[i].h) i = (i + 1) & m;
    slot *s = &t->s[i];
    s->h = h, s->off = off, s->len = len, s->val = val, s->aux = 0;
    t->n++;
    return s;
}

/* Key bytes in the arena, then the entry; *dup set when the key was there (nothing added). */
static int tab_put(strtab *t, arena *a, const void *k, size_t n, int32_t val, slot **out, int *dup) {
    uint64_t h = hash_bytes(k, n);
    slot *s = tab_find(t, a, k, n, h);
    *dup = s != NULL;
    if (s) { *out = s; return 0; }
    uint32_t off;
    if (tab_reserve(t, UINT32_MAX / 2 + 1) || arena_put(a, k, n, &off)) return -1;
    *out = tab_add(t, h, off, (uint32_t)n, val);
    return 0;
}

typedef struct pairtab {
    uint64_t *key;        /* [cap] (left id << 32) | right id; UINT64_MAX: empty */
    uint32_t *rank;       /* [cap] merge rank (training: the pair's count) */
    int32_t *id;          /* [cap] id of the merged token */
    uint32_t cap, n;      /* slots (a power of two), entries */
} pairtab;

static inline uint64_t pair_key(int a, int b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static inline int32_t pair_find(const pairtab *p, uint64_t k) {
    if (!p->cap) return -1;
    uint32_t m = p->cap - 1;
    for (uint32_t i = (uint32_t)mix64(k) & m;; i = (i + 1) & m) {
        if (p->key[i] == k) return (int32_t)i;
        if (p->key[i] == UINT64_MAX) return -1;
    }
}

static void pair_free(pairtab *p) {
    free(p->key);
    free(p->rank);
    free(p->id);
    memset(p, 0, sizeof *p);
}

/* The slot of key k (inserted with rank 0, id -1 when new); -1 when out of memory. */
static int32_t pair_slot(pairtab *p, uint64_t k) {
    if ((uint64_t)(p->n + 1) * 2 > p->cap) {
        uint32_t nc = p->cap ? p->cap * 2 : 1024;
        pairtab q = {malloc(sizeof(uint64_t) * nc), malloc(sizeof(uint32_t) * nc), malloc(sizeof(int32_t) * nc), nc, p->n};
        if (!q.key || !q.rank || !q.id) { pair_free(&q); return -1; }
        memset(q.key, 0xff, sizeof(uint64_t) * nc);
        for (uint32_t i = 0; i < p->cap; i++) {
            if (p->key[i] == UINT64_MAX) continue;
            uint32_t j = (uint32_t)mix64(p->key[i]) & (nc - 1);
            while (q.key[j] != UINT64_MAX) j = (j + 1) & (nc - 1);
            q.key[j] = p->key[i], q.rank[j] = p->rank[i], q.id[j] = p->id[i];
        }
        pair_free(p);
        *p = q;
    }
    uint32_t m = p->cap - 1, i = (uint32_t)mix64(k) & m;
    for (; p->key[i] != UINT64_MAX; i = (i + 1) & m)
        if (p->key[i] == k) return (int32_t)i;
    p->key[i] = k, p->rank[i] = 0, p->id[i] = -1;
    p->n++;
    return (int32_t)i;
}

/* ---- UTF-8 and the byte-level alphabet ---- */

/* Length of the valid UTF-8 character at s [n >= 1], or 0 when invalid; then *skip is the
 * length of the longest prefix of a valid sequence there (>= 1): one U+FFFD in lossy decoding. */
static size_t utf8_char(const uint8_t *s, size_t n, size_t *skip) {
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
static uint32_t utf8_cp(const uint8_t *s, size_t w) {
    if (w == 1) return s[0];
    uint32_t c = s[0] & (0xFF >> (w + 1));
    for (size_t i = 1; i < w; i++) c = (c << 6) | (s[i] & 0x3F);
    return c;
}

static size_t utf8_put(uint32_t c, char *o) {
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
static void byte_chars(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* Byte of a byte-level character, or -1. */
static int char_byte(const uint32_t cp[256], uint32_t c) {
    if (c < 256) return cp[c] == c ? (int)c : -1;
    if (c >= 256 + 68) return -1;
    for (int b = 0; b < 256; b++)
        if (cp[b] == c) return b;
    return -1;
}

/* Bytes of a token string s [n] under the byte-level alphabet into out [n]: their count, or
 * -1 when a character is outside it. */
static long token_bytes(const uint32_t cp[256], const char *s, size_t n, char *out) {
    size_t i = 0, k = 0, skip;
    while (i < n) {
        size_t w = utf8_char((const uint8_t *)s + i, n - i, &skip);
        if (!w) return -1;
        int b = char_byte(cp, utf8_cp((const uint8_t *)s + i, w));
        if (b < 0) return -1;
        out[k++] = (char)b;
        i += w;
    }
    return (long)k;
}

/* ---- the tokenizer ---- */

enum { ST_SPLIT, ST_PREFIX };
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

typedef struct step {
    int kind;             /* ST_SPLIT: regex split; ST_PREFIX: ByteLevel's add_prefix_space */
    pcre2_code *re;       /* ST_SPLIT: the pattern */
    int jit;              /* re is JIT-compiled */
    int behavior;         /* ST_SPLIT: B_* */
    int invert;           /* ST_SPLIT: the pieces between matches are the matches */
} step;

typedef struct added {
    uint32_t off, len;    /* content in t->a */
    int id;
    int special, normalized;
} added;

typedef struct addgroup {
    int *order;           /* [n] indices into t->add: by first byte, then longest first */
    int n;
    int first[257];       /* order[first[b] .. first[b+1]): the tokens that start with byte b */
} addgroup;

struct sm_tokenizer {
    arena a;              /* token strings, decoded bytes, added contents */
    int size;             /* largest id + 1 */
    uint32_t *dec_off, *dec_len; /* [size] decoded bytes of each id (ByteLevel decoder) */
    uint8_t *kind;        /* [size] 0: no token, 1: model vocabulary, 2: added, 3: added special */
    strtab vocab;         /* model.vocab: token string -> id */
    strtab raw;           /* model.vocab tokens of byte-level characters: their bytes -> id */
    strtab addmap;        /* added token content -> index in add */
    added *add;           /* [nadd] */
    int nadd;
    addgroup grp[2];      /* pass 0: normalized = false; pass 1: normalized = true */
    int byte_id[256];     /* id of each byte's token, -1 if absent */
    pairtab merges;       /* (left, right) -> rank, merged id */
    step st[MAX_STEPS];   /* pre-tokenizer steps, in order */
    int nst;
    int unk_id, fuse_unk, ignore_merges;
    pthread_mutex_t cache_mu;
    strtab cache;         /* piece bytes -> ids (val: offset in cache_ids, aux: count) */
    arena cache_keys;     /* piece bytes */
    int *cache_ids;       /* [cache_nids] */
    size_t cache_nids, cache_cap;
};

void sm_tokenizer_free(sm_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->nst; i++) pcre2_code_free(t->st[i].re);
    for (int g = 0; g < 2; g++) free(t->grp[g].order);
    free(t->a.b);
    free(t->dec_off);
    free(t->dec_len);
    free(t->kind);
    free(t->vocab.s);
    free(t->raw.s);
    free(t->addmap.s);
    free(t->add);
    pair_free(&t->merges);
    pthread_mutex_destroy(&t->cache_mu);
    free(t->cache.s);
    free(t->cache_keys.b);
    free(t->cache_ids);
    free(t);
}

int sm_tokenizer_size(const sm_tokenizer *t) { return t->size; }

int sm_tokenizer_token_id(const sm_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    uint64_t h = hash_bytes(token, n);
    slot *s = tab_find(&t->addmap, &t->a, token, n, h);
    if (s) return t->add[s->val].id;
    s = tab_find(&t->vocab, &t->a, token, n, h);
    return s ? s->val : -1;
}

int sm_tokenizer_is_special(const sm_tokenizer *t, int id) { return id >= 0 && id < t->size && t->kind[id] == 3; }

/* ---- loading ---- */

typedef struct lctx {
    const char *path;     /* the file, for messages */
    sm_tokenizer *t;
    sm_err *e;
    uint32_t cp[256];     /* byte -> byte-level character */
} lctx;

static const char *jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A boolean field (absent or null: dflt). */
static int get_bool(lctx *x, json_t *o, const char *where, const char *name, int dflt, int *out) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_boolean(v)) return sm_errf(x->e, "%s: %s.%s must be a boolean (is %s)", x->path, where, name, jtype(v));
    *out = json_is_true(v);
    return 0;
}

/* A string field that must be absent, null or "" (a feature we do not have). */
static int want_empty(lctx *x, json_t *o, const char *where, const char *name) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v) || (json_is_string(v) && !json_string_length(v))) return 0;
    return sm_errf(x->e, "%s: %s.%s is set; it is not supported (byte-level BPE has none)", x->path, where, name);
}

/* Rewrite an Oniguruma pattern for PCRE2: \h / \H (a hex digit and its complement in
 * Oniguruma, horizontal space in PCRE2).  *out malloc'd. */
static int onig_to_pcre(lctx *x, const char *where, const char *p, size_t n, char **out, size_t *on) {
    char *o = malloc(n * 12 + 1);
    if (!o) return sm_errf(x->e, "%s: out of memory", x->path);
    size_t k = 0;
    int cls = 0; /* inside [...] */
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[++i];
            if (d == 'h') k += (size_t)sprintf(o + k, cls ? "0-9a-fA-F" : "[0-9a-fA-F]");
            else if (d == 'H' && !cls) k += (size_t)sprintf(o + k, "[^0-9a-fA-F]");
            else if (d == 'H') {
                free(o);
                return sm_errf(x->e, "%s: %s: \\H inside a character class is not supported", x->path, where);
            } else o[k++] = c, o[k++] = d;
            continue;
        }
        if (c == '[' && !cls) {
            cls = 1;
            o[k++] = c;
            if (i + 1 < n && p[i + 1] == '^') o[k++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') o[k++] = p[++i]; /* a leading ] is a literal */
            continue;
        }
        if (c == ']' && cls) cls = 0;
        o[k++] = c;
    }
    o[k] = 0;
    *out = o;
    *on = k;
    return 0;
}

/* A split step of pattern p [n] (literal: the text itself). */
static int add_split(lctx *x, const char *where, const char *p, size_t n, int literal, int behavior, int invert) {
    sm_tokenizer *t = x->t;
    if (t->nst == MAX_STEPS) return sm_errf(x->e, "%s: %s: more than %d pre-tokenizer steps", x->path, where, MAX_STEPS);
    char *pat = NULL;
    size_t pn = n;
    if (!literal && onig_to_pcre(x, where, p, n, &pat, &pn)) return -1;
    int err;
    PCRE2_SIZE eoff;
    uint32_t opt = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? p : pat), pn, opt, &err, &eoff, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return sm_errf(x->e, "%s: %s: bad regex at offset %zu: %s", x->path, where, (size_t)eoff, (char *)msg);
    }
    step *s = &t->st[t->nst++];
    s->kind = ST_SPLIT;
    s->re = re;
    s->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    s->behavior = behavior;
    s->invert = invert;
    return 0;
}

/* One pre-tokenizer object (not a Sequence); *bytelevel set when it was ByteLevel. */
static int parse_pretok1(lctx *x, json_t *o, const char *where, int *bytelevel) {
    char w[128];
    json_t *ty = json_object_get(o, "type");
    if (!json_is_object(o) || !json_is_string(ty))
        return sm_errf(x->e, "%s: %s must be an object with a string 'type'", x->path, where);
    const char *type = json_string_value(ty);
    *bytelevel = 0;
    if (!strcmp(type, "ByteLevel")) {
        int prefix, regex;
        if (get_bool(x, o, where, "add_prefix_space", 1, &prefix) || get_bool(x, o, where, "use_regex", 1, &regex)) return -1;
        if (prefix) {
            if (x->t->nst == MAX_STEPS) return sm_errf(x->e, "%s: %s: more than %d pre-tokenizer steps", x->path, where, MAX_STEPS);
            x->t->st[x->t->nst++].kind = ST_PREFIX;
        }
        *bytelevel = 1;
        return regex ? add_split(x, where, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, B_ISOLATED, 0) : 0;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(o, "pattern"), *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        json_t *beh = json_object_get(o, "behavior");
        const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1, invert;
        for (int i = 0; i < 5; i++)
            if (json_is_string(beh) && !strcmp(json_string_value(beh), names[i])) b = i;
        snprintf(w, sizeof w, "%s.behavior", where);
        if (b < 0)
            return sm_errf(x->e, "%s: %s must be one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                           x->path, w);
        if (get_bool(x, o, where, "invert", 0, &invert)) return -1;
        snprintf(w, sizeof w, "%s.pattern", where);
        json_t *ps = json_is_string(rx) ? rx : lit;
        if (!json_is_object(pat) || !json_is_string(ps))
            return sm_errf(x->e, "%s: %s must be {\"Regex\": STRING} or {\"String\": STRING}", x->path, w);
        if (ps == lit && !json_string_length(ps)) /* the library matches nothing; PCRE2 would match everywhere */
            return sm_errf(x->e, "%s: %s is an empty string; it is not supported", x->path, w);
        return add_split(x, w, json_string_value(ps), json_string_length(ps), ps == lit, b, invert);
    }
    return sm_errf(x->e, "%s: %s is '%s'; supported: ByteLevel, Split, Sequence", x->path, where, type);
}

static int parse_pretok(lctx *x, json_t *root) {
    json_t *o = json_object_get(root, "pre_tokenizer");
    if (!o || json_is_null(o)) return sm_errf(x->e, "%s: pre_tokenizer is null; a byte-level BPE needs ByteLevel", x->path);
    json_t *ty = json_object_get(o, "type");
    int bl = 0;
    if (json_is_string(ty) && !strcmp(json_string_value(ty), "Sequence")) {
        json_t *l = json_object_get(o, "pretokenizers");
        if (!json_is_array(l)) return sm_errf(x->e, "%s: pre_tokenizer.pretokenizers must be an array", x->path);
        for (size_t i = 0; i < json_array_size(l); i++) {
            char w[64];
            snprintf(w, sizeof w, "pre_tokenizer.pretokenizers[%zu].type", i);
            if (bl) return sm_errf(x->e, "%s: %s: a step after ByteLevel is not supported", x->path, w);
            json_t *ti = json_object_get(json_array_get(l, i), "type");
            if (json_is_string(ti) && !strcmp(json_string_value(ti), "Sequence"))
                return sm_errf(x->e, "%s: %s: a nested Sequence is not supported", x->path, w);
            w[strlen(w) - 5] = 0; /* drop ".type": parse_pretok1 names the object */
            if (parse_pretok1(x, json_array_get(l, i), w, &bl)) return -1;
        }
    } else if (parse_pretok1(x, o, "pre_tokenizer.type", &bl)) {
        return -1;
    }
    if (!bl) return sm_errf(x->e, "%s: pre_tokenizer has no ByteLevel step; only byte-level BPE is supported", x->path);
    return 0;
}

static int parse_decoder(lctx *x, json_t *root) {
    json_t *o = json_object_get(root, "decoder"), *ty = json_object_get(o, "type");
    if (json_is_string(ty) && !strcmp(json_string_value(ty), "ByteLevel")) return 0;
    if (json_is_string(ty) && !strcmp(json_string_value(ty), "Sequence")) {
        json_t *l = json_object_get(o, "decoders"), *d0 = json_object_get(json_array_get(l, 0), "type");
        if (json_array_size(l) == 1 && json_is_string(d0) && !strcmp(json_string_value(d0), "ByteLevel")) return 0;
        return sm_errf(x->e, "%s: decoder is a Sequence other than [ByteLevel]; only ByteLevel is supported", x->path);
    }
    if (!o || json_is_null(o)) return sm_errf(x->e, "%s: decoder is null; only ByteLevel is supported", x->path);
    return sm_errf(x->e, "%s: decoder.type is '%s'; only ByteLevel is supported", x->path,
                   json_is_string(ty) ? json_string_value(ty) : "(missing)");
}

/* model: BPE options and the vocabulary. */
static int parse_model(lctx *x, json_t *m, int *maxid) {
    sm_tokenizer *t = x->t;
    if (!json_is_object(m)) return sm_errf(x->e, "%s: model must be an object", x->path);
    json_t *ty = json_object_get(m, "type");
    if (json_is_string(ty) ? strcmp(json_string_value(ty), "BPE") != 0 : !json_object_get(m, "merges"))
        return sm_errf(x->e, "%s: model.type is '%s'; only BPE is supported", x->path,
                       json_is_string(ty) ? json_string_value(ty) : "(missing)");
    int bf;
    json_t *dr = json_object_get(m, "dropout");
    if (dr && !json_is_null(dr) && !(json_is_number(dr) && json_number_value(dr) == 0))
        return sm_errf(x->e, "%s: model.dropout is set; BPE dropout is not supported", x->path);
    if (want_empty(x, m, "model", "continuing_subword_prefix") || want_empty(x, m, "model", "end_of_word_suffix") ||
        get_bool(x, m, "model", "fuse_unk", 0, &t->fuse_unk) || get_bool(x, m, "model", "byte_fallback", 0, &bf) ||
        get_bool(x, m, "model", "ignore_merges", 0, &t->ignore_merges))
        return -1;
    if (bf) return sm_errf(x->e, "%s: model.byte_fallback is true; it is not supported with byte-level BPE", x->path);
    json_t *v = json_object_get(m, "vocab");
    if (!json_is_object(v)) return sm_errf(x->e, "%s: model.vocab must be an object (token -> id)", x->path);
    const char *k;
    json_t *idv;
    size_t maxlen = 0;
    json_object_foreach(v, k, idv) {
        (void)k;
        if (!json_is_integer(idv) || json_integer_value(idv) < 0 || json_integer_value(idv) >= MAX_ID)
            return sm_errf(x->e, "%s: model.vocab['%.60s'] must be an integer id in [0, %d)", x->path, k, MAX_ID);
        int id = (int)json_integer_value(idv);
        if (id > *maxid) *maxid = id;
        if (strlen(k) > maxlen) maxlen = strlen(k);
    }
    char *buf = malloc(maxlen + 1);
    if (!buf) return sm_errf(x->e, "%s: out of memory", x->path);
    json_object_foreach(v, k, idv) {
        slot *s;
        int dup;
        size_t n = strlen(k);
        if (tab_put(&t->vocab, &t->a, k, n, (int32_t)json_integer_value(idv), &s, &dup)) { free(buf); return sm_errf(x->e, "%s: out of memory", x->path); }
        long nb = token_bytes(x->cp, k, n, buf);
        if (nb >= 0 && tab_put(&t->raw, &t->a, buf, (size_t)nb, s->val, &s, &dup)) { free(buf); return sm_errf(x->e, "%s: out of memory", x->path); }
    }
    free(buf);
    json_t *unk = json_object_get(m, "unk_token");
    t->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return sm_errf(x->e, "%s: model.unk_token must be a string or null", x->path);
        slot *s = tab_find(&t->vocab, &t->a, json_string_value(unk), json_string_length(unk),
                           hash_bytes(json_string_value(unk), json_string_length(unk)));
        if (!s) return sm_errf(x->e, "%s: model.unk_token '%.60s' is not in model.vocab", x->path, json_string_value(unk));
        t->unk_id = s->val;
    }
    return 0;
}

/* added_tokens: ids as the library assigns them (a content of the model vocabulary keeps its
 * id; the others count on from the vocabulary's size); a file whose ids differ is refused. */
static int parse_added(lctx *x, json_t *root, int *maxid) {
    sm_tokenizer *t = x->t;
    json_t *l = json_object_get(root, "added_tokens");
    if (!l || json_is_null(l)) return 0;
    if (!json_is_array(l)) return sm_errf(x->e, "%s: added_tokens must be an array", x->path);
    t->add = calloc(json_array_size(l) + 1, sizeof *t->add);
    if (!t->add) return sm_errf(x->e, "%s: out of memory", x->path);
    int64_t next = t->vocab.n; /* the library's next id: the model vocabulary's size */
    for (size_t i = 0; i < json_array_size(l); i++) {
        json_t *o = json_array_get(l, i), *c = json_object_get(o, "content"), *idv = json_object_get(o, "id");
        char w[48];
        snprintf(w, sizeof w, "added_tokens[%zu]", i);
        if (!json_is_object(o) || !json_is_string(c) || !json_is_integer(idv))
            return sm_errf(x->e, "%s: %s must be an object with a string 'content' and an integer 'id'", x->path, w);
        int special, normalized, f;
        if (get_bool(x, o, w, "special", 0, &special) || get_bool(x, o, w, "normalized", !special, &normalized)) return -1;
        const char *flags[] = {"single_word", "lstrip", "rstrip"};
        for (int j = 0; j < 3; j++) {
            if (get_bool(x, o, w, flags[j], 0, &f)) return -1;
            if (f) return sm_errf(x->e, "%s: %s.%s is true; it is not supported", x->path, w, flags[j]);
        }
        const char *s = json_string_value(c);
        size_t n = json_string_length(c);
        if (!n) continue; /* the library ignores an empty content */
        uint64_t h = hash_bytes(s, n);
        slot *as = tab_find(&t->addmap, &t->a, s, n, h), *vs = tab_find(&t->vocab, &t->a, s, n, h);
        int64_t id = as ? t->add[as->val].id : vs ? vs->val : next++;
        if (id != json_integer_value(idv))
            return sm_errf(x->e, "%s: %s ('%.60s') has id %lld but the tokenizers library gives it %lld%s", x->path, w, s,
                           (long long)json_integer_value(idv), (long long)id,
                           vs ? " (its id in model.vocab)" : " (added tokens not in model.vocab follow it, in order)");
        if (id >= MAX_ID) return sm_errf(x->e, "%s: %s: id %lld is too large", x->path, w, (long long)id);
        if (as) { /* the same content again: its flags change, its id stays */
            t->add[as->val].special = special;
            t->add[as->val].normalized = normalized;
            continue;
        }
        added *a = &t->add[t->nadd];
        int dup;
        if (tab_put(&t->addmap, &t->a, s, n, t->nadd, &as, &dup)) return sm_errf(x->e, "%s: out of memory", x->path);
        a->off = as->off, a->len = as->len, a->id = (int)id, a->special = special, a->normalized = normalized;
        t->nadd++;
        if (a->id > *maxid) *maxid = a->id;
    }
    return 0;
}

static int cmp_by_first_then_longest(const void *pa, const void *pb, void *arg) {
    const sm_tokenizer *t = arg;
    const added *a = &t->add[*(const int *)pa], *b = &t->add[*(const int *)pb];
    uint8_t fa = (uint8_t)t->a.b[a->off], fb = (uint8_t)t->a.b[b->off];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return 0;
}

/* The two matching passes over the added tokens. */
static int build_groups(lctx *x) {
    sm_tokenizer *t = x->t;
    for (int g = 0; g < 2; g++) {
        addgroup *gr = &t->grp[g];
        gr->order = malloc(sizeof(int) * (size_t)(t->nadd + 1));
        if (!gr->order) return sm_errf(x->e, "%s: out of memory", x->path);
        for (int i = 0; i < t->nadd; i++)
            if (t->add[i].normalized == g) gr->order[gr->n++] = i;
        qsort_r(gr->order, (size_t)gr->n, sizeof(int), cmp_by_first_then_longest, t);
        int k = 0;
        for (int b = 0; b <= 256; b++) {
            while (k < gr->n && (uint8_t)t->a.b[t->add[gr->order[k]].off] < b) k++;
            gr->first[b] = k;
        }
    }
    return 0;
}

/* Per id: kind and decoded bytes (an added token's content wins over the vocabulary's). */
static int build_ids(lctx *x, int maxid) {
    sm_tokenizer *t = x->t;
    t->size = maxid + 1;
    t->dec_off = calloc((size_t)t->size, sizeof(uint32_t));
    t->dec_len = calloc((size_t)t->size, sizeof(uint32_t));
    t->kind = calloc((size_t)t->size, 1);
    uint32_t *soff = calloc((size_t)t->size, sizeof(uint32_t)), *slen = calloc((size_t)t->size, sizeof(uint32_t));
    int rc = -1;
    if (!t->dec_off || !t->dec_len || !t->kind || !soff || !slen) { sm_errf(x->e, "%s: out of memory", x->path); goto out; }
    for (uint32_t i = 0; i < t->vocab.cap; i++) {
        slot *s = &t->vocab.s[i];
        if (!s->h) continue;
        if (t->kind[s->val]) {
            sm_errf(x->e, "%s: model.vocab: id %d is given to two tokens", x->path, s->val);
            goto out;
        }
        t->kind[s->val] = 1, soff[s->val] = s->off, slen[s->val] = s->len;
    }
    for (int i = 0; i < t->nadd; i++) {
        added *a = &t->add[i];
        t->kind[a->id] = a->special ? 3 : 2, soff[a->id] = a->off, slen[a->id] = a->len;
    }
    size_t maxlen = 0;
    for (int id = 0; id < t->size; id++)
        if (slen[id] > maxlen) maxlen = slen[id];
    char *buf = malloc(maxlen + 1);
    if (!buf) { sm_errf(x->e, "%s: out of memory", x->path); goto out; }
    for (int id = 0; id < t->size; id++) {
        if (!t->kind[id]) continue;
        long nb = token_bytes(x->cp, t->a.b + soff[id], slen[id], buf);
        if (nb < 0) { /* a character outside the alphabet: the token's own UTF-8 */
            t->dec_off[id] = soff[id], t->dec_len[id] = slen[id];
        } else if (arena_put(&t->a, buf, (size_t)nb, &t->dec_off[id])) {
            free(buf);
            sm_errf(x->e, "%s: out of memory", x->path);
            goto out;
        } else {
            t->dec_len[id] = (uint32_t)nb;
        }
    }
    free(buf);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        slot *s = tab_find(&t->raw, &t->a, &c, 1, hash_bytes(&c, 1));
        t->byte_id[b] = s ? s->val : -1;
    }
    rc = 0;
out:
    free(soff);
    free(slen);
    return rc;
}

/* The id of a merge's token string s [n] (an element of model.merges[i]). */
static int merge_tok(lctx *x, size_t i, const char *s, size_t n, int *id) {
    slot *v = tab_find(&x->t->vocab, &x->t->a, s, n, hash_bytes(s, n));
    if (!v) return sm_errf(x->e, "%s: model.merges[%zu]: '%.*s' is not in model.vocab", x->path, i, (int)(n > 60 ? 60 : n), s);
    *id = v->val;
    return 0;
}

static int parse_merges(lctx *x, json_t *m) {
    sm_tokenizer *t = x->t;
    json_t *l = json_object_get(m, "merges");
    if (!l || json_is_null(l)) return 0;
    if (!json_is_array(l)) return sm_errf(x->e, "%s: model.merges must be an array", x->path);
    size_t maxlen = 0;
    char *buf = NULL;
    int rc = -1;
    for (size_t i = 0; i < json_array_size(l); i++) {
        json_t *o = json_array_get(l, i);
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(o)) { /* "a b": exactly one space */
            a = json_string_value(o);
            const char *sp = memchr(a, ' ', json_string_length(o));
            if (!sp || memchr(sp + 1, ' ', json_string_length(o) - (size_t)(sp + 1 - a))) {
                sm_errf(x->e, "%s: model.merges[%zu] must be two tokens separated by one space", x->path, i);
                goto out;
            }
            na = (size_t)(sp - a), b = sp + 1, nb = json_string_length(o) - na - 1;
        } else if (json_is_array(o) && json_array_size(o) == 2 && json_is_string(json_array_get(o, 0)) &&
                   json_is_string(json_array_get(o, 1))) {
            a = json_string_value(json_array_get(o, 0)), na = json_string_length(json_array_get(o, 0));
            b = json_string_value(json_array_get(o, 1)), nb = json_string_length(json_array_get(o, 1));
        } else {
            sm_errf(x->e, "%s: model.merges[%zu] must be a string \"a b\" or a pair [\"a\", \"b\"]", x->path, i);
            goto out;
        }
        int ia, ib, im;
        if (merge_tok(x, i, a, na, &ia) || merge_tok(x, i, b, nb, &ib)) goto out;
        if (na + nb > maxlen) {
            free(buf);
            maxlen = (na + nb) * 2;
            buf = malloc(maxlen);
            if (!buf) { sm_errf(x->e, "%s: out of memory", x->path); goto out; }
        }
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
        if (merge_tok(x, i, buf, na + nb, &im)) goto out;
        int32_t s = pair_slot(&t->merges, pair_key(ia, ib));
        if (s < 0) { sm_errf(x->e, "%s: out of memory", x->path); goto out; }
        t->merges.rank[s] = (uint32_t)i, t->merges.id[s] = im; /* a repeated pair: the last one counts, as in the library */
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

/* The whole of path into *buf [*len] (malloc'd, NUL-terminated). */
static int read_file(const char *path, char **buf, size_t *len, sm_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return sm_errf(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) { fclose(f); return sm_errf(e, "%s: not a regular file", path); }
    char *b = malloc((size_t)st.st_size + 1);
    if (!b) { fclose(f); return sm_errf(e, "%s: out of memory for %lld bytes", path, (long long)st.st_size); }
    size_t n = fread(b, 1, (size_t)st.st_size, f);
    int bad = ferror(f) || n != (size_t)st.st_size;
    fclose(f);
    if (bad) { free(b); return sm_errf(e, "%s: read error", path); }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

int sm_tokenizer_load(const char *path, sm_tokenizer **out, sm_err *e) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    if (read_file(path, &buf, &len, e)) return -1;
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    free(buf);
    if (!root) return sm_errf(e, "%s: not valid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
    sm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { json_decref(root); return sm_errf(e, "%s: out of memory", path); }
    pthread_mutex_init(&t->cache_mu, NULL);
    lctx x = {path, t, e, {0}};
    byte_chars(x.cp);
    int maxid = -1, rc = -1;
    json_t *nm = json_object_get(root, "normalizer");
    if (!json_is_object(root)) { sm_errf(e, "%s: the top level must be an object", path); goto out; }
    if (nm && !json_is_null(nm)) {
        json_t *ty = json_object_get(nm, "type");
        sm_errf(e, "%s: normalizer.type is '%s'; only a null normalizer is supported", path,
                json_is_string(ty) ? json_string_value(ty) : "(missing)");
        goto out;
    }
    json_t *m = json_object_get(root, "model");
    if (!m) { sm_errf(e, "%s: no 'model' field", path); goto out; }
    if (parse_model(&x, m, &maxid) || parse_pretok(&x, root) || parse_decoder(&x, root) || parse_added(&x, root, &maxid) ||
        build_groups(&x) || parse_merges(&x, m))
        goto out;
    if (maxid < 0) { sm_errf(e, "%s: model.vocab and added_tokens are empty", path); goto out; }
    if (build_ids(&x, maxid)) goto out;
    rc = 0;
out:
    json_decref(root);
    if (rc) sm_tokenizer_free(t);
    else *out = t;
    return rc;
}

/* ---- encode ---- */

typedef struct enc {
    sm_tokenizer *t;      /* the cache is written when use_cache */
    int use_cache;        /* this call holds cache_mu */
    pcre2_match_data *md;
    pcre2_match_context *mc; /* with a large JIT stack, made on the first stack-limit error */
    pcre2_jit_stack *js;
    int *ids;             /* [n] output, [cap] allocated */
    size_t n, cap;
    int *sym, *prev, *next; /* [scap] BPE symbols of one piece: id (-1: merged away), links */
    uint64_t *heap;       /* [3 scap] (rank << 32) | position */
    size_t scap;
    uint32_t *rg;         /* [rcap] split ranges: start, end, is_match triples */
    size_t rcap;
    sm_err *e;
} enc;

static int push_ids(enc *c, const int *ids, size_t n) {
    if (n == 1 && c->n < c->cap) { /* the common case: one token */
        c->ids[c->n++] = ids[0];
        return 0;
    }
    if (c->n + n > c->cap) {
        size_t nc = c->cap ? c->cap : 256;
        while (nc < c->n + n) nc *= 2;
        if (nc > (size_t)INT_MAX) return sm_errf(c->e, "tokenizer: more than %d ids", INT_MAX);
        int *ni = realloc(c->ids, sizeof(int) * nc);
        if (!ni) return sm_errf(c->e, "tokenizer: out of memory");
        c->ids = ni;
        c->cap = nc;
    }
    memcpy(c->ids + c->n, ids, sizeof(int) * n);
    c->n += n;
    return 0;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l >= *n) break;
        m = l + 1 < *n && h[l + 1] < h[l] ? l + 1 : l;
        if (h[m] >= v) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = v;
    return top;
}

/* Push the merge of the pair starting at symbol i, if there is one. */
static inline void push_pair(const pairtab *mg, enc *c, size_t *hn, int i) {
    int j = c->next[i];
    if (j < 0) return;
    int32_t s = pair_find(mg, pair_key(c->sym[i], c->sym[j]));
    if (s >= 0) heap_push(c->heap, hn, ((uint64_t)mg->rank[s] << 32) | (uint32_t)i);
}

/* BPE of one piece's bytes p [n]: ids appended to the output; the ids' range in *first, *cnt. */
static int bpe(enc *c, const uint8_t *p, size_t n, size_t *first, size_t *cnt) {
    const sm_tokenizer *t = c->t;
    if (n > c->scap) {
        size_t nc = n < 64 ? 64 : n;
        free(c->sym), free(c->prev), free(c->next), free(c->heap);
        c->sym = malloc(sizeof(int) * nc), c->prev = malloc(sizeof(int) * nc), c->next = malloc(sizeof(int) * nc);
        c->heap = malloc(sizeof(uint64_t) * 3 * nc);
        c->scap = c->sym && c->prev && c->next && c->heap ? nc : 0;
        if (!c->scap) return sm_errf(c->e, "tokenizer: out of memory for a piece of %zu bytes", n);
    }
    /* one symbol a byte; bytes without a token become unk (fused when fuse_unk) or vanish */
    int m = 0, pend = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[p[i]];
        if (id >= 0) {
            if (pend) c->sym[m++] = t->unk_id, pend = 0;
            c->sym[m++] = id;
        } else if (t->unk_id >= 0) {
            if (pend && !t->fuse_unk) c->sym[m++] = t->unk_id;
            pend = 1;
        }
    }
    if (pend) c->sym[m++] = t->unk_id;
    size_t hn = 0;
    for (int i = 0; i < m; i++) c->prev[i] = i - 1, c->next[i] = i + 1 < m ? i + 1 : -1;
    for (int i = 0; i + 1 < m; i++) push_pair(&t->merges, c, &hn, i);
    while (hn) {
        uint64_t top = heap_pop(c->heap, &hn);
        int i = (int)(uint32_t)top, j = c->next[i];
        if (c->sym[i] < 0 || j < 0) continue; /* merged away, or now the last symbol */
        int32_t s = pair_find(&t->merges, pair_key(c->sym[i], c->sym[j]));
        if (s < 0 || t->merges.rank[s] != (uint32_t)(top >> 32)) continue; /* stale: the pair changed */
        c->sym[i] = t->merges.id[s];
        c->sym[j] = -1;
        c->next[i] = c->next[j];
        if (c->next[j] >= 0) c->prev[c->next[j]] = i;
        if (c->prev[i] >= 0) push_pair(&t->merges, c, &hn, c->prev[i]);
        push_pair(&t->merges, c, &hn, i);
    }
    *first = c->n;
    size_t k = 0;
    for (int i = 0; i >= 0 && i < m; i = c->next[i]) c->sym[k++] = c->sym[i];
    *cnt = k;
    return push_ids(c, c->sym, k);
}

/* One piece (bytes of the text after every pre-tokenizer step): ids appended. */
static int piece(enc *c, const char *p, size_t n) {
    sm_tokenizer *t = c->t;
    const uint8_t *u = (const uint8_t *)p;
    if (n == 1 && t->byte_id[u[0]] >= 0) return push_ids(c, &t->byte_id[u[0]], 1);
    uint64_t h = 0;
    if (t->ignore_merges) { /* a piece that is a token is that token */
        h = hash_bytes(p, n);
        slot *s = tab_find(&t->raw, &t->a, p, n, h);
        if (s) return push_ids(c, &s->val, 1);
    }
    int cache = c->use_cache && n <= CACHE_KEY_MAX;
    if (cache) {
        if (!h) h = hash_bytes(p, n);
        slot *s = tab_find(&t->cache, &t->cache_keys, p, n, h);
        if (s) return push_ids(c, t->cache_ids + s->val, (size_t)s->aux);
    }
    size_t first = 0, cnt = 0;
    if (bpe(c, u, n, &first, &cnt)) return -1;
    if (cache && t->cache.n < CACHE_MAX && t->cache_nids + cnt <= (size_t)INT32_MAX && !tab_reserve(&t->cache, 2 * CACHE_MAX)) {
        if (t->cache_nids + cnt > t->cache_cap) {
            size_t nc = t->cache_cap ? t->cache_cap * 2 : 4096;
            while (nc < t->cache_nids + cnt) nc *= 2;
            int *ni = realloc(t->cache_ids, sizeof(int) * nc);
            if (!ni) return 0; /* the cache only helps: leave it as it is */
            t->cache_ids = ni;
            t->cache_cap = nc;
        }
        uint32_t off;
        if (arena_put(&t->cache_keys, p, n, &off)) return 0;
        memcpy(t->cache_ids + t->cache_nids, c->ids + first, sizeof(int) * cnt);
        slot *s = tab_add(&t->cache, h, off, (uint32_t)n, (int32_t)t->cache_nids);
        s->aux = (int32_t)cnt;
        t->cache_nids += cnt;
    }
    return 0;
}

/* The next match of re in p [n] from *pos, as Oniguruma's iterator: an empty match right at
 * the end of the previous match is skipped by one character.  1 with [*s, *e), 0 at the end. */
static int re_next(enc *c, const step *st, const char *p, size_t n, size_t *pos, long *last, size_t *s, size_t *e) {
    while (*pos <= n) {
        int rc = st->jit && !c->mc ? pcre2_jit_match(st->re, (PCRE2_SPTR)p, n, *pos, 0, c->md, NULL)
                                   : pcre2_match(st->re, (PCRE2_SPTR)p, n, *pos, PCRE2_NO_UTF_CHECK, c->md, c->mc);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->mc) { /* a deep match: again with a large stack */
            c->js = pcre2_jit_stack_create(1 << 16, 64 << 20, NULL);
            c->mc = pcre2_match_context_create(NULL);
            if (!c->js || !c->mc) return sm_errf(c->e, "tokenizer: out of memory for the regex stack");
            pcre2_jit_stack_assign(c->mc, NULL, c->js);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return sm_errf(c->e, "tokenizer: regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        if (ov[0] == ov[1] && *last == (long)ov[1]) {
            size_t skip, w = *pos < n ? utf8_char((const uint8_t *)p + *pos, n - *pos, &skip) : 1;
            *pos += w ? w : 1;
            continue;
        }
        *s = ov[0], *e = ov[1];
        *pos = ov[1];
        *last = (long)ov[1];
        return 1;
    }
    return 0;
}

static int pretok(enc *c, int k, const char *p, size_t n);

/* Split step k over p [n]: the library's delimiter behaviours, on the list of matches and
 * the pieces between them. */
static int split(enc *c, int k, const char *p, size_t n) {
    const step *st = &c->t->st[k];
    size_t pos = 0, s, e, prev = 0;
    long last = -1;
    int r;
    if (st->behavior == B_ISOLATED) { /* every match and every gap is a piece: no list needed */
        while ((r = re_next(c, st, p, n, &pos, &last, &s, &e)) == 1) {
            if (s > prev && pretok(c, k + 1, p + prev, s - prev)) return -1;
            if (pretok(c, k + 1, p + s, e - s)) return -1;
            prev = e;
        }
        if (r < 0) return -1;
        return pretok(c, k + 1, p + prev, n - prev);
    }
    /* ranges (start, end, is_match) covering p, then folded by the behaviour */
    size_t nr = 0;
    for (;;) {
        r = re_next(c, st, p, n, &pos, &last, &s, &e);
        if (r < 0) return -1;
        if (nr + 6 > c->rcap) {
            size_t nc = c->rcap ? c->rcap * 2 : 192;
            uint32_t *ng = realloc(c->rg, sizeof(uint32_t) * nc);
            if (!ng) return sm_errf(c->e, "tokenizer: out of memory");
            c->rg = ng;
            c->rcap = nc;
        }
        if (!r) break;
        if (s > prev) c->rg[nr++] = (uint32_t)prev, c->rg[nr++] = (uint32_t)s, c->rg[nr++] = (uint32_t)st->invert;
        c->rg[nr++] = (uint32_t)s, c->rg[nr++] = (uint32_t)e, c->rg[nr++] = (uint32_t)!st->invert;
        prev = e;
    }
    if (prev < n) c->rg[nr++] = (uint32_t)prev, c->rg[nr++] = (uint32_t)n, c->rg[nr++] = (uint32_t)st->invert;
    /* fold into o (start, end, removed); a copy, since later split steps reuse c->rg */
    const uint32_t *g = c->rg;
    uint32_t sbuf[96], *o = nr <= 96 ? sbuf : malloc(sizeof(uint32_t) * nr);
    if (!o) return sm_errf(c->e, "tokenizer: out of memory");
    size_t no = 0;
    int pm = 0; /* the previous range (in the fold's direction) was a match */
    if (st->behavior == B_MERGED_NEXT) { /* from the right: a match joins the range after it */
        for (size_t i = nr; i >= 3; i -= 3) {
            uint32_t a = g[i - 3], b = g[i - 2], m = g[i - 1];
            if (m && !pm && no) o[no - 3] = a;
            else o[no] = a, o[no + 1] = b, o[no + 2] = 0, no += 3;
            pm = (int)m;
        }
        for (size_t i = 0, j = no - 3; no && i < j; i += 3, j -= 3)
            for (int q = 0; q < 3; q++) { uint32_t tmp = o[i + q]; o[i + q] = o[j + q]; o[j + q] = tmp; }
    } else {
        for (size_t i = 0; i < nr; i += 3) {
            uint32_t a = g[i], b = g[i + 1], m = g[i + 2];
            if (st->behavior == B_REMOVED) o[no] = a, o[no + 1] = b, o[no + 2] = m, no += 3;
            else if (st->behavior == B_MERGED_PREV && m && !pm && no) o[no - 2] = b;
            else if (st->behavior == B_CONTIGUOUS && (int)m == pm && no) o[no - 2] = b;
            else o[no] = a, o[no + 1] = b, o[no + 2] = 0, no += 3;
            pm = (int)m;
        }
    }
    int rc = 0;
    for (size_t i = 0; i < no && !rc; i += 3)
        if (!o[i + 2] && o[i + 1] > o[i]) rc = pretok(c, k + 1, p + o[i], o[i + 1] - o[i]);
    if (o != sbuf) free(o);
    return rc;
}

/* Pre-tokenizer steps k.. over p [n]; past the last step, BPE. */
static int pretok(enc *c, int k, const char *p, size_t n) {
    if (n == 0) return 0;
    if (k == c->t->nst) return piece(c, p, n);
    if (c->t->st[k].kind == ST_SPLIT) return split(c, k, p, n);
    if (p[0] == ' ') return pretok(c, k + 1, p, n); /* ByteLevel's prefix space */
    char sb[256], *b = n < sizeof sb ? sb : malloc(n + 1);
    if (!b) return sm_errf(c->e, "tokenizer: out of memory");
    b[0] = ' ';
    memcpy(b + 1, p, n);
    int rc = pretok(c, k + 1, b, n + 1);
    if (b != sb) free(b);
    return rc;
}

/* Cut the added tokens of pass g out of p [n] (leftmost, then longest); the rest goes to pass
 * g + 1, past the last pass to the pre-tokenizer. */
static int added_pass(enc *c, int g, const char *p, size_t n) {
    if (g == 2) return pretok(c, 0, p, n);
    const sm_tokenizer *t = c->t;
    const addgroup *gr = &t->grp[g];
    if (!gr->n) return added_pass(c, g + 1, p, n);
    size_t seg = 0, i = 0;
    while (i < n) {
        uint8_t b = (uint8_t)p[i];
        const added *hit = NULL;
        for (int k = gr->first[b]; k < gr->first[b + 1]; k++) {
            const added *a = &t->add[gr->order[k]];
            if (a->len <= n - i && !memcmp(t->a.b + a->off, p + i, a->len)) { hit = a; break; }
        }
        if (!hit) { i++; continue; }
        if (i > seg && added_pass(c, g + 1, p + seg, i - seg)) return -1;
        if (push_ids(c, &hit->id, 1)) return -1;
        i += hit->len;
        seg = i;
    }
    return seg < n ? added_pass(c, g + 1, p + seg, n - seg) : 0;
}

int sm_tokenizer_encode(const sm_tokenizer *t, const char *text, size_t len, int **ids, int *n, sm_err *e) {
    *ids = NULL;
    *n = 0;
    for (size_t i = 0, skip, w; i < len; i += w)
        if (!(w = utf8_char((const uint8_t *)text + i, len - i, &skip)))
            return sm_errf(e, "tokenizer: the text is not valid UTF-8 at byte offset %zu", i);
    sm_tokenizer *mt = (sm_tokenizer *)t; /* the cache, under cache_mu */
    enc c = {.t = mt, .e = e};
    c.use_cache = pthread_mutex_trylock(&mt->cache_mu) == 0;
    int rc = -1;
    if (t->nst && !(c.md = pcre2_match_data_create(1, NULL))) { sm_errf(e, "tokenizer: out of memory"); goto out; }
    if (added_pass(&c, 0, text, len)) goto out;
    if (c.n > (size_t)INT_MAX) { sm_errf(e, "tokenizer: more than %d ids", INT_MAX); goto out; }
    if (!c.ids && !(c.ids = malloc(sizeof(int)))) { sm_errf(e, "tokenizer: out of memory"); goto out; }
    *ids = c.ids;
    *n = (int)c.n;
    c.ids = NULL;
    rc = 0;
out:
    if (c.use_cache) pthread_mutex_unlock(&mt->cache_mu);
    free(c.ids);
    free(c.sym), free(c.prev), free(c.next), free(c.heap), free(c.rg);
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mc);
    pcre2_jit_stack_free(c.js);
    return rc;
}

/* ---- decode ---- */

int sm_tokenizer_decode(const sm_tokenizer *t, const int *ids, int n, char **text, size_t *len, sm_err *e) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->size || !t->kind[ids[i]])
            return sm_errf(e, "tokenizer: id %d (index %d) is not in the vocabulary (size %d)", ids[i], i, t->size);
        total += t->dec_len[ids[i]];
    }
    /* the bytes, then invalid UTF-8 replaced: at most 3 output bytes (U+FFFD) per input byte */
    char *raw = malloc(total + 1), *o = malloc(3 * total + 1);
    if (!raw || !o) { free(raw); free(o); return sm_errf(e, "tokenizer: out of memory for %zu bytes", total); }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        memcpy(raw + k, t->a.b + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        k += t->dec_len[ids[i]];
    }
    size_t on = 0, skip;
    for (size_t i = 0; i < total;) {
        size_t w = utf8_char((const uint8_t *)raw + i, total - i, &skip);
        if (w) {
            memcpy(o + on, raw + i, w);
            on += w, i += w;
        } else {
            on += utf8_put(0xFFFD, o + on);
            i += skip;
        }
    }
    free(raw);
    o[on] = 0;
    *text = o;
    *len = on;
    return 0;
}

/* ---- a trained tokenizer for test models ---- */

/* Original text the merges of make-model's tokenizers are learned from (no '|', so no learned
 * token can equal a "<|...|>" special). */
static const char TRAIN_TEXT[] =
    "The harbour town woke slowly on the first cold morning of the year. Fishing boats rocked against the "
    "stone quay, their ropes creaking, while the baker on the corner lit his ovens and the smell of fresh "
    "bread drifted down to the water. Nobody was in a hurry; the tide would not turn for another hour.\n\n"
    "Anna kept the lighthouse at the end of the northern pier. Every evening she climbed the one hundred and "
    "twelve steps, cleaned the great lens, checked the oil and wrote the weather in her logbook: wind from "
    "the west, seven knots; sky clear; visibility good. She had kept the book for twenty-three years, and "
    "she liked to read the old pages when the nights were long. In 1998 the storm had broken three windows. "
    "In 2004 a whale had been seen near the rocks, and the whole town came out to watch it.\n\n"
    "\"Do you ever get tired of it?\" her nephew asked when he visited in the summer. He was twelve, and he "
    "thought that a job which never changed must be the dullest thing in the world.\n"
    "\"Tired? No,\" she said. \"The sea is different every day. The light is the same, but the ships are "
    "not, and the people on them are not. Somebody out there is always glad to see it.\"\n\n"
    "He did not believe her at first. But that night they sat together at the top of the tower and counted "
    "the ships that passed: a ferry with its decks lit up like a small city, two trawlers going home, a "
    "yacht that had lost its way and turned sharply when the beam swept over it. By midnight he had written "
    "down eleven names, and he wanted to know where every one of them was going.\n\n"
    "The next morning the market was busy. Traders sold apples, cheese, honey and wool; a man with a cart "
    "offered to sharpen knives for two coins each. The schoolteacher bought a basket of pears and told the "
    "children that the town had been founded more than four hundred years ago, when the first families "
    "built their houses from the same grey stone as the harbour wall. They listened politely and then ran "
    "off to the beach, where the water was still too cold for swimming but perfect for throwing stones.\n\n"
    "Later, the weather changed. Clouds came in from the sea, the wind rose to thirty knots and the boats "
    "stayed in. Anna wrote it down carefully, as she always did, and then she made a pot of tea. Her nephew "
    "asked whether the light would be enough in the rain. \"It has always been enough,\" she said. \"That is "
    "the whole point of it. You do not build a lighthouse for the easy nights.\"\n\n"
    "It's the small things that matter: we'll see, they're here, I've seen it, you'd know, she'll come. "
    "Numbers such as 7, 42, 365, 1024 and 65536 appear in tables; dates like 2024-05-17 and times like "
    "09:30 are common too. Lists have items (one, two, three) and sentences end with full stops, question "
    "marks or exclamation marks!\n";

/* Pre-tokenize TRAIN_TEXT with TRAIN_PATTERN: distinct words and their counts. */
static int train_words(pcre2_code *re, strtab *words, arena *wa, int **count, int *nw, sm_err *e) {
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!md) return sm_errf(e, "make-model: tokenizer: out of memory");
    size_t n = sizeof TRAIN_TEXT - 1, pos = 0;
    int cap = 0, rc = 0;
    while (pos < n) {
        int r = pcre2_match(re, (PCRE2_SPTR)TRAIN_TEXT, n, pos, 0, md, NULL);
        if (r < 0) break; /* the pattern matches every character: no gaps */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { pos++; continue; }
        slot *s;
        int dup;
        if (tab_put(words, wa, TRAIN_TEXT + ov[0], ov[1] - ov[0], *nw, &s, &dup)) { rc = -1; break; }
        if (!dup) {
            if (*nw == cap) {
                int *nc = realloc(*count, sizeof(int) * (size_t)(cap = cap ? 2 * cap : 256));
                if (!nc) { rc = -1; break; }
                *count = nc;
            }
            (*count)[(*nw)++] = 0;
        }
        (*count)[s->val]++;
        pos = ov[1];
    }
    pcre2_match_data_free(md);
    return rc ? sm_errf(e, "make-model: tokenizer: out of memory") : 0;
}

/* A token's string: its bytes in the byte-level alphabet, as a JSON string. */
static json_t *tok_json(const uint32_t cp[256], const char *b, size_t n) {
    char buf[4 * 256 + 1] = {0}, *o = n <= 256 ? buf : malloc(4 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += utf8_put(cp[(uint8_t)b[i]], o + k);
    json_t *s = json_stringn(o, k);
    if (o != buf) free(o);
    return s;
}

typedef struct trainer {
    arena tb;             /* token bytes */
    uint32_t *off, *len;  /* [limit] bytes of each id; len 0: not a learned / byte token */
    strtab bytes;         /* token bytes -> id */
    int *syms;            /* every word's symbols, word after word */
    int *wstart, *wlen;   /* [nw] a word's symbols in syms */
} trainer;

int sm_tokenizer_write_trained(const char *path, const sm_tok_special *sp, int nsp, int limit, int *nvocab, sm_err *e) {
    uint32_t cp[256];
    byte_chars(cp);
    trainer tr = {0};
    strtab words = {0};
    arena wa = {0};
    pairtab cnt = {0};
    int *count = NULL, nw = 0, rc = -1, next = 0, nmerge = 0, *mleft = NULL, *mright = NULL;
    json_t *root = NULL;
    pcre2_code *re = NULL;
    sm_outfile of = {0};
    uint8_t *isspec = calloc((size_t)(limit > 0 ? limit : 1), 1);
    tr.off = calloc((size_t)(limit > 0 ? limit : 1), sizeof(uint32_t));
    tr.len = calloc((size_t)(limit > 0 ? limit : 1), sizeof(uint32_t));
    if (!isspec || !tr.off || !tr.len) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
    for (int i = 0; i < nsp; i++)
        if (sp[i].id >= 0 && sp[i].id < limit) isspec[sp[i].id] = 1;
    /* the 256 bytes at the smallest free ids */
    for (int b = 0; b < 256; b++, next++) {
        while (next < limit && isspec[next]) next++;
        if (next >= limit) {
            sm_errf(e, "make-model: tokenizer: the 256 byte tokens and %d special tokens do not fit below id %d", nsp, limit);
            goto out;
        }
        char c = (char)b;
        slot *s;
        int dup;
        if (tab_put(&tr.bytes, &tr.tb, &c, 1, next, &s, &dup)) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
        tr.off[next] = s->off, tr.len[next] = 1;
    }
    /* the words of the text, as byte symbols */
    int err;
    PCRE2_SIZE eoff;
    re = pcre2_compile((PCRE2_SPTR)TRAIN_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &eoff, NULL);
    if (!re) { sm_errf(e, "make-model: tokenizer: the built-in pattern does not compile (error %d)", err); goto out; }
    if (train_words(re, &words, &wa, &count, &nw, e)) goto out;
    tr.wstart = malloc(sizeof(int) * (size_t)nw), tr.wlen = malloc(sizeof(int) * (size_t)nw);
    tr.syms = malloc(sizeof(int) * (wa.n + 1));
    mleft = malloc(sizeof(int) * (size_t)limit), mright = malloc(sizeof(int) * (size_t)limit);
    if (!tr.wstart || !tr.wlen || !tr.syms || !mleft || !mright) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
    for (uint32_t i = 0, k = 0; i < words.cap; i++) {
        slot *s = &words.s[i];
        if (!s->h) continue;
        tr.wstart[s->val] = (int)k;
        tr.wlen[s->val] = (int)s->len;
        for (uint32_t j = 0; j < s->len; j++) {
            char c = wa.b[s->off + j];
            tr.syms[k++] = tab_find(&tr.bytes, &tr.tb, &c, 1, hash_bytes(&c, 1))->val;
        }
    }
    /* merges: the most frequent adjacent pair (ties: smaller left id, then right id) */
    for (;;) {
        while (next < limit && isspec[next]) next++;
        if (next >= limit) break;
        free(cnt.key), free(cnt.rank), free(cnt.id);
        memset(&cnt, 0, sizeof cnt);
        for (int w = 0; w < nw; w++)
            for (int i = 0; i + 1 < tr.wlen[w]; i++) {
                int32_t s = pair_slot(&cnt, pair_key(tr.syms[tr.wstart[w] + i], tr.syms[tr.wstart[w] + i + 1]));
                if (s < 0) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
                cnt.rank[s] += (uint32_t)count[w];
            }
        uint64_t best = UINT64_MAX;
        uint32_t bc = 1;
        for (uint32_t i = 0; i < cnt.cap; i++)
            if (cnt.key[i] != UINT64_MAX && (cnt.rank[i] > bc || (cnt.rank[i] == bc && bc > 1 && cnt.key[i] < best)))
                bc = cnt.rank[i], best = cnt.key[i];
        if (bc < 2) break;
        int l = (int)(best >> 32), r = (int)(uint32_t)best;
        char cat[2 * CACHE_KEY_MAX];
        size_t nl = tr.len[l], nr = tr.len[r];
        if (nl + nr > sizeof cat) break; /* longer tokens than any word of the text: never */
        memcpy(cat, tr.tb.b + tr.off[l], nl);
        memcpy(cat + nl, tr.tb.b + tr.off[r], nr);
        slot *s;
        int dup, id;
        if (tab_put(&tr.bytes, &tr.tb, cat, nl + nr, next, &s, &dup)) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
        id = s->val;
        if (!dup) tr.off[id] = s->off, tr.len[id] = (uint32_t)(nl + nr), next++;
        mleft[nmerge] = l, mright[nmerge] = r, nmerge++;
        for (int w = 0; w < nw; w++) { /* replace the pair, left to right */
            int *q = tr.syms + tr.wstart[w], m = 0;
            for (int i = 0; i < tr.wlen[w]; i++) {
                if (i + 1 < tr.wlen[w] && q[i] == l && q[i + 1] == r) q[m++] = id, i++;
                else q[m++] = q[i];
            }
            tr.wlen[w] = m;
        }
        if (nmerge >= limit) break;
    }
    /* tokenizer.json */
    root = json_object();
    json_t *vocab = json_object(), *merges = json_array(), *addl = json_array();
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b}", "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                              "ignore_merges", 0);
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence", "pretokenizers",
                            "type", "Split", "pattern", "Regex", TRAIN_PATTERN, "behavior", "Isolated", "invert", 0,
                            "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    json_t *dec = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1);
    if (!root || !vocab || !merges || !addl || !model || !pre || !dec) {
        json_decref(vocab), json_decref(merges), json_decref(addl), json_decref(model), json_decref(pre), json_decref(dec);
        sm_errf(e, "make-model: tokenizer: out of memory");
        goto out;
    }
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", addl);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer", pre);
    json_object_set_new(root, "post_processor", json_null());
    json_object_set_new(root, "decoder", dec);
    json_object_set_new(root, "model", model);
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    int nv = 0, maxsp = -1;
    for (int i = 0; i < nsp; i++) maxsp = sp[i].id > maxsp ? sp[i].id : maxsp;
    int top = limit > maxsp + 1 ? limit : maxsp + 1;
    for (int id = 0; id < top; id++) { /* vocabulary and added tokens in id order */
        const sm_tok_special *spc = NULL;
        for (int i = 0; i < nsp; i++)
            if (sp[i].id == id) spc = &sp[i];
        json_t *ks = NULL;
        if (spc) {
            json_array_append_new(addl, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", spc->content,
                                                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
            ks = json_string(spc->content);
        } else if (id < limit && tr.len[id]) {
            ks = tok_json(cp, tr.tb.b + tr.off[id], tr.len[id]);
        }
        if (!ks) continue;
        if (json_object_get(vocab, json_string_value(ks))) {
            sm_errf(e, "make-model: tokenizer: token '%s' (id %d) appears twice", json_string_value(ks), id);
            json_decref(ks);
            goto out;
        }
        json_object_set_new(vocab, json_string_value(ks), json_integer(id));
        json_decref(ks);
        nv++;
    }
    for (int i = 0; i < nmerge; i++) {
        json_t *a = tok_json(cp, tr.tb.b + tr.off[mleft[i]], tr.len[mleft[i]]);
        json_t *b = tok_json(cp, tr.tb.b + tr.off[mright[i]], tr.len[mright[i]]);
        char *ab = a && b ? malloc(json_string_length(a) + json_string_length(b) + 2) : NULL;
        if (ab) sprintf(ab, "%s %s", json_string_value(a), json_string_value(b));
        json_decref(a), json_decref(b);
        if (!ab) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
        json_array_append_new(merges, json_string(ab));
        free(ab);
    }
    if (sm_outfile_open(&of, path, e)) goto out;
    if (json_dumpf(root, of.f, JSON_INDENT(1)) || fputc('\n', of.f) == EOF) {
        sm_outfile_abort(&of);
        sm_errf(e, "%s: write error", path);
        goto out;
    }
    if (sm_outfile_commit(&of, e)) goto out;
    if (nvocab) *nvocab = nv;
    rc = 0;
out:
    json_decref(root);
    pcre2_code_free(re);
    free(isspec), free(tr.off), free(tr.len), free(tr.tb.b), free(tr.bytes.s), free(tr.syms), free(tr.wstart), free(tr.wlen);
    free(words.s), free(wa.b), free(count), free(mleft), free(mright);
    pair_free(&cnt);
    return rc;
}
