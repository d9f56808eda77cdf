/* tokenizer_encode.c: encode text to ids and decode ids to text (tokenizer.h; the pipeline is
 * described atop tokenizer.c).
 *
 * BPE merges a piece with a binary heap of (rank, position) over a linked list of symbols;
 * pieces up to CACHE_KEY_MAX bytes are cached under a trylock'd mutex.  We rejected a
 * per-thread cache (memory grows with threads, and a server's threads come and go).
 */
#include "model/tokenizer_impl.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_KEY_MAX 256            /* longest piece the cache holds (bytes) */
#define CACHE_MAX ((uint32_t)1 << 18) /* most cached pieces */

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

static int push_ids(enc *en, const int *ids, size_t n) {
    if (n == 1 && en->n < en->cap) { /* the common case: one token */
        en->ids[en->n++] = ids[0];
        return 0;
    }
    if (en->n + n > en->cap) {
        size_t nc = en->cap ? en->cap : 256;
        while (nc < en->n + n) nc *= 2;
        if (nc > (size_t)INT_MAX) return sm_errf(en->e, "tokenizer: more than %d ids", INT_MAX);
        int *ni = realloc(en->ids, sizeof(int) * nc);
        if (!ni) return sm_errf(en->e, "tokenizer: out of memory");
        en->ids = ni;
        en->cap = nc;
    }
    memcpy(en->ids + en->n, ids, sizeof(int) * n);
    en->n += n;
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
static inline void push_pair(const tok_pairtab *mg, enc *en, size_t *hn, int i) {
    int j = en->next[i];
    if (j < 0) return;
    int32_t s = tok_pair_find(mg, tok_pair_key(en->sym[i], en->sym[j]));
    if (s >= 0) heap_push(en->heap, hn, ((uint64_t)mg->rank[s] << 32) | (uint32_t)i);
}

/* BPE of one piece's bytes p [n]: ids appended to the output; the ids' range in *first, *cnt. */
static int bpe(enc *en, const uint8_t *p, size_t n, size_t *first, size_t *cnt) {
    const sm_tokenizer *t = en->t;
    if (n > en->scap) {
        size_t nc = n < 64 ? 64 : n;
        free(en->sym), free(en->prev), free(en->next), free(en->heap);
        en->sym = malloc(sizeof(int) * nc), en->prev = malloc(sizeof(int) * nc), en->next = malloc(sizeof(int) * nc);
        en->heap = malloc(sizeof(uint64_t) * 3 * nc);
        en->scap = en->sym && en->prev && en->next && en->heap ? nc : 0;
        if (!en->scap) return sm_errf(en->e, "tokenizer: out of memory for a piece of %zu bytes", n);
    }
    /* one symbol a byte; bytes without a token become unk (fused when fuse_unk) or vanish */
    int m = 0, pend = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[p[i]];
        if (id >= 0) {
            if (pend) en->sym[m++] = t->unk_id, pend = 0;
            en->sym[m++] = id;
        } else if (t->unk_id >= 0) {
            if (pend && !t->fuse_unk) en->sym[m++] = t->unk_id;
            pend = 1;
        }
    }
    if (pend) en->sym[m++] = t->unk_id;
    size_t hn = 0;
    for (int i = 0; i < m; i++) en->prev[i] = i - 1, en->next[i] = i + 1 < m ? i + 1 : -1;
    for (int i = 0; i + 1 < m; i++) push_pair(&t->merges, en, &hn, i);
    while (hn) {
        uint64_t top = heap_pop(en->heap, &hn);
        int i = (int)(uint32_t)top, j = en->next[i];
        if (en->sym[i] < 0 || j < 0) continue; /* merged away, or now the last symbol */
        int32_t s = tok_pair_find(&t->merges, tok_pair_key(en->sym[i], en->sym[j]));
        if (s < 0 || t->merges.rank[s] != (uint32_t)(top >> 32)) continue; /* stale: the pair changed */
        en->sym[i] = t->merges.id[s];
        en->sym[j] = -1;
        en->next[i] = en->next[j];
        if (en->next[j] >= 0) en->prev[en->next[j]] = i;
        if (en->prev[i] >= 0) push_pair(&t->merges, en, &hn, en->prev[i]);
        push_pair(&t->merges, en, &hn, i);
    }
    *first = en->n;
    size_t k = 0;
    for (int i = 0; i >= 0 && i < m; i = en->next[i]) en->sym[k++] = en->sym[i];
    *cnt = k;
    return push_ids(en, en->sym, k);
}

/* One piece (bytes of the text after every pre-tokenizer step): ids appended. */
static int piece(enc *en, const char *p, size_t n) {
    sm_tokenizer *t = en->t;
    const uint8_t *u = (const uint8_t *)p;
    if (n == 1 && t->byte_id[u[0]] >= 0) return push_ids(en, &t->byte_id[u[0]], 1);
    uint64_t h = 0;
    if (t->ignore_merges) { /* a piece that is a token is that token */
        h = tok_hash_bytes(p, n);
        tok_slot *s = tok_tab_find(&t->raw, &t->a, p, n, h);
        if (s) return push_ids(en, &s->val, 1);
    }
    int cache = en->use_cache && n <= CACHE_KEY_MAX;
    if (cache) {
        if (!h) h = tok_hash_bytes(p, n);
        tok_slot *s = tok_tab_find(&t->cache, &t->cache_keys, p, n, h);
        if (s) return push_ids(en, t->cache_ids + s->val, (size_t)s->aux);
    }
    size_t first = 0, cnt = 0;
    if (bpe(en, u, n, &first, &cnt)) return -1;
    if (cache && t->cache.n < CACHE_MAX && t->cache_nids + cnt <= (size_t)INT32_MAX && !tok_tab_reserve(&t->cache, 2 * CACHE_MAX)) {
        if (t->cache_nids + cnt > t->cache_cap) {
            size_t nc = t->cache_cap ? t->cache_cap * 2 : 4096;
            while (nc < t->cache_nids + cnt) nc *= 2;
            int *ni = realloc(t->cache_ids, sizeof(int) * nc);
            if (!ni) return 0; /* the cache only helps: leave it as it is */
            t->cache_ids = ni;
            t->cache_cap = nc;
        }
        uint32_t off;
        if (tok_arena_put(&t->cache_keys, p, n, &off)) return 0;
        memcpy(t->cache_ids + t->cache_nids, en->ids + first, sizeof(int) * cnt);
        tok_slot *s = tok_tab_add(&t->cache, h, off, (uint32_t)n, (int32_t)t->cache_nids);
        s->aux = (int32_t)cnt;
        t->cache_nids += cnt;
    }
    return 0;
}

/* The next match of re in p [n] from *pos, as Oniguruma's iterator: an empty match right at
 * the end of the previous match is skipped by one character.  1 with [*s, *e), 0 at the end. */
static int re_next(enc *en, const step *st, const char *p, size_t n, size_t *pos, long *last, size_t *s, size_t *e) {
    while (*pos <= n) {
        int rc = st->jit && !en->mc ? pcre2_jit_match(st->re, (PCRE2_SPTR)p, n, *pos, 0, en->md, NULL)
                                   : pcre2_match(st->re, (PCRE2_SPTR)p, n, *pos, PCRE2_NO_UTF_CHECK, en->md, en->mc);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !en->mc) { /* a deep match: again with a large stack */
            en->js = pcre2_jit_stack_create(1 << 16, 64 << 20, NULL);
            en->mc = pcre2_match_context_create(NULL);
            if (!en->js || !en->mc) return sm_errf(en->e, "tokenizer: out of memory for the regex stack");
            pcre2_jit_stack_assign(en->mc, NULL, en->js);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return sm_errf(en->e, "tokenizer: regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(en->md);
        if (ov[0] == ov[1] && *last == (long)ov[1]) {
            size_t skip, w = *pos < n ? tok_utf8_char((const uint8_t *)p + *pos, n - *pos, &skip) : 1;
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

static int pretok(enc *en, int k, const char *p, size_t n);

/* Split step k over p [n]: the library's delimiter behaviours, on the list of matches and
 * the pieces between them. */
static int split(enc *en, int k, const char *p, size_t n) {
    const step *st = &en->t->st[k];
    size_t pos = 0, s, e, prev = 0;
    long last = -1;
    int r;
    if (st->behavior == B_ISOLATED) { /* every match and every gap is a piece: no list needed */
        while ((r = re_next(en, st, p, n, &pos, &last, &s, &e)) == 1) {
            if (s > prev && pretok(en, k + 1, p + prev, s - prev)) return -1;
            if (pretok(en, k + 1, p + s, e - s)) return -1;
            prev = e;
        }
        if (r < 0) return -1;
        return pretok(en, k + 1, p + prev, n - prev);
    }
    /* ranges (start, end, is_match) covering p, then folded by the behaviour */
    size_t nr = 0;
    for (;;) {
        r = re_next(en, st, p, n, &pos, &last, &s, &e);
        if (r < 0) return -1;
        if (nr + 6 > en->rcap) {
            size_t nc = en->rcap ? en->rcap * 2 : 192;
            uint32_t *ng = realloc(en->rg, sizeof(uint32_t) * nc);
            if (!ng) return sm_errf(en->e, "tokenizer: out of memory");
            en->rg = ng;
            en->rcap = nc;
        }
        if (!r) break;
        if (s > prev) en->rg[nr++] = (uint32_t)prev, en->rg[nr++] = (uint32_t)s, en->rg[nr++] = (uint32_t)st->invert;
        en->rg[nr++] = (uint32_t)s, en->rg[nr++] = (uint32_t)e, en->rg[nr++] = (uint32_t)!st->invert;
        prev = e;
    }
    if (prev < n) en->rg[nr++] = (uint32_t)prev, en->rg[nr++] = (uint32_t)n, en->rg[nr++] = (uint32_t)st->invert;
    /* fold into o (start, end, removed); a copy, since later split steps reuse en->rg */
    const uint32_t *g = en->rg;
    uint32_t sbuf[96], *o = nr <= 96 ? sbuf : malloc(sizeof(uint32_t) * nr);
    if (!o) return sm_errf(en->e, "tokenizer: out of memory");
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
        if (!o[i + 2] && o[i + 1] > o[i]) rc = pretok(en, k + 1, p + o[i], o[i + 1] - o[i]);
    if (o != sbuf) free(o);
    return rc;
}

/* Pre-tokenizer steps k.. over p [n]; past the last step, BPE. */
static int pretok(enc *en, int k, const char *p, size_t n) {
    if (n == 0) return 0;
    if (k == en->t->nst) return piece(en, p, n);
    if (en->t->st[k].kind == ST_SPLIT) return split(en, k, p, n);
    if (p[0] == ' ') return pretok(en, k + 1, p, n); /* ByteLevel's prefix space */
    char sb[256], *b = n < sizeof sb ? sb : malloc(n + 1);
    if (!b) return sm_errf(en->e, "tokenizer: out of memory");
    b[0] = ' ';
    memcpy(b + 1, p, n);
    int rc = pretok(en, k + 1, b, n + 1);
    if (b != sb) free(b);
    return rc;
}

/* Cut the added tokens of pass g out of p [n] (leftmost, then longest); the rest goes to pass
 * g + 1, past the last pass to the pre-tokenizer. */
static int added_pass(enc *en, int g, const char *p, size_t n) {
    if (g == 2) return pretok(en, 0, p, n);
    const sm_tokenizer *t = en->t;
    const addgroup *gr = &t->grp[g];
    if (!gr->n) return added_pass(en, g + 1, p, n);
    size_t seg = 0, i = 0;
    while (i < n) {
        uint8_t b = (uint8_t)p[i];
        const added *hit = NULL;
        for (int k = gr->first[b]; k < gr->first[b + 1]; k++) {
            const added *a = &t->add[gr->order[k]];
            if (a->len <= n - i && !memcmp(t->a.b + a->off, p + i, a->len)) { hit = a; break; }
        }
        if (!hit) { i++; continue; }
        if (i > seg && added_pass(en, g + 1, p + seg, i - seg)) return -1;
        if (push_ids(en, &hit->id, 1)) return -1;
        i += hit->len;
        seg = i;
    }
    return seg < n ? added_pass(en, g + 1, p + seg, n - seg) : 0;
}

int sm_tokenizer_encode(const sm_tokenizer *t, const char *text, size_t len, int **ids, int *n, sm_err *e) {
    *ids = NULL;
    *n = 0;
    for (size_t i = 0, skip, w; i < len; i += w)
        if (!(w = tok_utf8_char((const uint8_t *)text + i, len - i, &skip)))
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
        size_t w = tok_utf8_char((const uint8_t *)raw + i, total - i, &skip);
        if (w) {
            memcpy(o + on, raw + i, w);
            on += w, i += w;
        } else {
            on += tok_utf8_put(0xFFFD, o + on);
            i += skip;
        }
    }
    free(raw);
    o[on] = 0;
    *text = o;
    *len = on;
    return 0;
}
