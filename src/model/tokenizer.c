/* tokenizer.c: byte-level BPE from a Hugging Face tokenizer.json (see tokenizer.h): loading
 * here, encode and decode in tokenizer_encode.c, the tables in tok_table.c.
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
#include "model/tokenizer_impl.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_ID (1 << 26)             /* ids above are refused (a 64 M-entry vocabulary) */

/* The GPT-2 split of ByteLevel with use_regex (the library's fixed pattern). */
static const char *GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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
    tok_pair_free(&t->merges);
    pthread_mutex_destroy(&t->cache_mu);
    free(t->cache.s);
    free(t->cache_keys.b);
    free(t->cache_ids);
    free(t);
}

int sm_tokenizer_size(const sm_tokenizer *t) { return t->size; }

int sm_tokenizer_token_id(const sm_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    uint64_t h = tok_hash_bytes(token, n);
    tok_slot *s = tok_tab_find(&t->addmap, &t->a, token, n, h);
    if (s) return t->add[s->val].id;
    s = tok_tab_find(&t->vocab, &t->a, token, n, h);
    return s ? s->val : -1;
}

int sm_tokenizer_is_special(const sm_tokenizer *t, int id) { return id >= 0 && id < t->size && t->kind[id] == 3; }

int sm_tokenizer_token_bytes(const sm_tokenizer *t, int id, const unsigned char **b, size_t *len) {
    *b = NULL;
    *len = 0;
    if (id < 0 || id >= t->size || !t->kind[id]) return 0;
    *b = (const unsigned char *)t->a.b + t->dec_off[id];
    *len = t->dec_len[id];
    return t->kind[id] == 3 ? 2 : 1;
}
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
        tok_slot *s;
        int dup;
        size_t n = strlen(k);
        if (tok_tab_put(&t->vocab, &t->a, k, n, (int32_t)json_integer_value(idv), &s, &dup)) { free(buf); return sm_errf(x->e, "%s: out of memory", x->path); }
        long nb = tok_token_bytes(x->cp, k, n, buf);
        if (nb >= 0 && tok_tab_put(&t->raw, &t->a, buf, (size_t)nb, s->val, &s, &dup)) { free(buf); return sm_errf(x->e, "%s: out of memory", x->path); }
    }
    free(buf);
    json_t *unk = json_object_get(m, "unk_token");
    t->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return sm_errf(x->e, "%s: model.unk_token must be a string or null", x->path);
        tok_slot *s = tok_tab_find(&t->vocab, &t->a, json_string_value(unk), json_string_length(unk),
                           tok_hash_bytes(json_string_value(unk), json_string_length(unk)));
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
        uint64_t h = tok_hash_bytes(s, n);
        tok_slot *as = tok_tab_find(&t->addmap, &t->a, s, n, h), *vs = tok_tab_find(&t->vocab, &t->a, s, n, h);
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
        if (tok_tab_put(&t->addmap, &t->a, s, n, t->nadd, &as, &dup)) return sm_errf(x->e, "%s: out of memory", x->path);
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
        tok_slot *s = &t->vocab.s[i];
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
        long nb = tok_token_bytes(x->cp, t->a.b + soff[id], slen[id], buf);
        if (nb < 0) { /* a character outside the alphabet: the token's own UTF-8 */
            t->dec_off[id] = soff[id], t->dec_len[id] = slen[id];
        } else if (tok_arena_put(&t->a, buf, (size_t)nb, &t->dec_off[id])) {
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
        tok_slot *s = tok_tab_find(&t->raw, &t->a, &c, 1, tok_hash_bytes(&c, 1));
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
    tok_slot *v = tok_tab_find(&x->t->vocab, &x->t->a, s, n, tok_hash_bytes(s, n));
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
        int32_t s = tok_pair_slot(&t->merges, tok_pair_key(ia, ib));
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
    tok_byte_chars(x.cp);
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

