/* test_tokenizer.c: the tokenizer.json reader, encode and decode (src/model/tokenizer.h).
 *
 * Each case builds a small tokenizer.json with jansson (the 256 byte tokens at ids equal to
 * their byte, plus the merges and added tokens the case needs), writes it to a temp dir and
 * checks exact ids: merge order by rank and leftmost among equals, both merge formats,
 * ignore_merges, the prefix space, special tokens longest first, invalid UTF-8 offsets, lossy
 * decoding, refusals (one line naming the file and the field), long pieces, the cache across
 * calls and threads, and the tokenizer make-model writes.  The comparison with the Python
 * tokenizers package on thousands of strings is tests/tok/tokcmp.py.  We rejected fixture
 * files: the edit that makes each case is visible here.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "tmodel.h"
#include "model/tokenizer.h"
#include "testing/tok_train.h"

static char g_dir[512];

/* GPT-2's byte -> character map, written out here independently of the library. */
static unsigned byte_cp(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return (unsigned)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) n++;
    return 256u + (unsigned)n;
}

/* The token string of raw bytes s (NUL-terminated) in the byte-level alphabet. */
static const char *mapped(const char *s) {
    static char buf[8][512];
    static int k;
    char *o = buf[k++ & 7];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = byte_cp(*p);
        if (c < 0x80) o[n++] = (char)c;
        else o[n++] = (char)(0xC0 | (c >> 6)), o[n++] = (char)(0x80 | (c & 0x3F));
    }
    o[n] = 0;
    return o;
}

/* 256 byte tokens (id = byte), ByteLevel without prefix space or regex, ByteLevel decoder. */
static json_t *base(void) {
    json_t *v = json_object();
    for (int b = 0; b < 256; b++) {
        char s[2] = {(char)b, 0};
        if (b == 0) json_object_set_new(v, "\xc4\x80", json_integer(0)); /* U+0100 */
        else json_object_set_new(v, mapped(s), json_integer(b));
    }
    return json_pack("{s:n, s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s}, s:[], s:{s:s, s:o, s:[]}}", "normalizer", "post_processor",
                     "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
                     "decoder", "type", "ByteLevel", "added_tokens", "model", "type", "BPE", "vocab", v, "merges");
}

static void vocab_add(json_t *r, const char *raw, int id) {
    json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), mapped(raw), json_integer(id));
}
/* A merge of raw-byte tokens a, b (pair form; legacy: "a b"). */
static void merge_add(json_t *r, const char *a, const char *b, int legacy) {
    json_t *m = json_object_get(json_object_get(r, "model"), "merges");
    char ab[1024];
    snprintf(ab, sizeof ab, "%s %s", mapped(a), mapped(b));
    json_array_append_new(m, legacy ? json_string(ab) : json_pack("[s, s]", mapped(a), mapped(b)));
}
static void added_add(json_t *r, const char *content, int id, int special, int normalized) {
    json_array_append_new(json_object_get(r, "added_tokens"),
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0,
                                    "lstrip", 0, "rstrip", 0, "normalized", normalized, "special", special));
}

/* Write r (consumed) as <g_dir>/<name>.json and load it; NULL (and e set) on failure. */
static sm_tokenizer *load(json_t *r, const char *name, char *path, sm_err *e) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s.json", g_dir, name);
    if (path) strcpy(path, p);
    json_dump_file(r, p, 0);
    json_decref(r);
    sm_tokenizer *t = NULL;
    if (sm_tokenizer_load(p, &t, e)) return NULL;
    return t;
}

/* Encode s and compare with want [nw] (-1 terminated list). */
static int enc_is(const sm_tokenizer *t, const char *s, size_t n, const int *want) {
    int *ids = NULL, k = 0, nw = 0;
    sm_err e = {{0}};
    while (want[nw] >= 0) nw++;
    if (sm_tokenizer_encode(t, s, n, &ids, &k, &e)) { printf("  encode '%s': %s\n", s, e.msg); return 0; }
    int ok = k == nw && (k == 0 || !memcmp(ids, want, sizeof(int) * (size_t)k));
    if (!ok) {
        printf("  encode '%.40s': got", s);
        for (int i = 0; i < k && i < 20; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    free(ids);
    return ok;
}
#define ENC(t, s, ...) enc_is(t, s, strlen(s), (const int[]){__VA_ARGS__, -1})

/* Decode ids and compare with want (exact bytes). */
static int dec_is(const sm_tokenizer *t, const int *ids, int n, const char *want) {
    char *s = NULL;
    size_t len = 0;
    sm_err e = {{0}};
    if (sm_tokenizer_decode(t, ids, n, &s, &len, &e)) { printf("  decode: %s\n", e.msg); return 0; }
    int ok = len == strlen(want) && !memcmp(s, want, len) && s[len] == 0;
    if (!ok) printf("  decode: got '%s' (%zu bytes), want '%s'\n", s, len, want);
    free(s);
    return ok;
}

static void test_bytes(void) {
    sm_err e = {{0}};
    CHECK(!strcmp(mapped(" "), "\xc4\xa0") && !strcmp(mapped("\n"), "\xc4\x8a") && !strcmp(mapped("\xad"), "\xc5\x83"),
          "GPT-2 map: space is U+0120, newline U+010A, 0xAD U+0143");
    sm_tokenizer *t = load(base(), "bytes", NULL, &e);
    CHECK(t, "load: %s", e.msg);
    if (!t) return;
    CHECK(ENC(t, "Hi \xc3\xa9\n", 'H', 'i', ' ', 0xc3, 0xa9, '\n'), "one id a byte");
    int none[] = {-1};
    CHECK(enc_is(t, "", 0, none), "empty text: no ids");
    CHECK(enc_is(t, "a\0b", 3, (const int[]){'a', 0, 'b', -1}), "a NUL byte is a token");
    CHECK(dec_is(t, (const int[]){'H', 'i', 0xc3, 0xa9}, 4, "Hi\xc3\xa9"), "decode bytes");
    CHECK(sm_tokenizer_size(t) == 256 && sm_tokenizer_token_id(t, "\xc4\xa0") == 32 && sm_tokenizer_token_id(t, "zz") == -1,
          "size %d, token_id", sm_tokenizer_size(t));
    sm_tokenizer_free(t);
}

static void test_merge_order(void) {
    sm_err e = {{0}};
    for (int legacy = 0; legacy < 2; legacy++) {
        /* b c ranks before a b: "abc" -> a, bc */
        json_t *r = base();
        vocab_add(r, "ab", 300), vocab_add(r, "bc", 301), vocab_add(r, "aa", 302), vocab_add(r, "aaaa", 303);
        merge_add(r, "b", "c", legacy), merge_add(r, "a", "b", legacy), merge_add(r, "a", "a", legacy);
        merge_add(r, "aa", "aa", legacy);
        sm_tokenizer *t = load(r, legacy ? "merge_legacy" : "merge_pairs", NULL, &e);
        CHECK(t, "load: %s", e.msg);
        if (!t) continue;
        CHECK(ENC(t, "abc", 'a', 301), "lower rank first (legacy %d)", legacy);
        CHECK(ENC(t, "abx", 300, 'x'), "a b merges alone");
        CHECK(ENC(t, "aaa", 302, 'a'), "leftmost among equal ranks");
        CHECK(ENC(t, "aaaaa", 303, 'a'), "merged tokens merge again");
        CHECK(dec_is(t, (const int[]){303, 'a', 301}, 3, "aaaaabc"), "decode merged");
        sm_tokenizer_free(t);
    }
    /* the reverse rank order gives the other split */
    json_t *r = base();
    vocab_add(r, "ab", 300), vocab_add(r, "bc", 301);
    merge_add(r, "a", "b", 0), merge_add(r, "b", "c", 0);
    sm_tokenizer *t = load(r, "merge_rev", NULL, &e);
    CHECK(t && ENC(t, "abc", 300, 'c'), "a b first when it ranks first");
    sm_tokenizer_free(t);
}

static void test_ignore_merges_and_prefix(void) {
    sm_err e = {{0}};
    for (int ig = 0; ig < 2; ig++) {
        json_t *r = base();
        vocab_add(r, "xyz", 400);
        json_object_set_new(json_object_get(r, "model"), "ignore_merges", json_boolean(ig));
        sm_tokenizer *t = load(r, "ignore", NULL, &e);
        CHECK(t, "load: %s", e.msg);
        if (t) CHECK(ig ? ENC(t, "xyz", 400) : ENC(t, "xyz", 'x', 'y', 'z'), "ignore_merges %d: a piece in the vocabulary", ig);
        sm_tokenizer_free(t);
    }
    json_t *r = base();
    json_object_set_new(json_object_get(r, "pre_tokenizer"), "add_prefix_space", json_true());
    json_object_set_new(json_object_get(r, "pre_tokenizer"), "use_regex", json_true());
    sm_tokenizer *t = load(r, "prefix", NULL, &e);
    CHECK(t, "load: %s", e.msg);
    if (t) {
        CHECK(ENC(t, "hi", ' ', 'h', 'i'), "a space is prefixed");
        CHECK(ENC(t, " hi", ' ', 'h', 'i'), "not when there is one");
        CHECK(ENC(t, "hi 12", ' ', 'h', 'i', ' ', '1', '2'), "GPT-2 split");
    }
    sm_tokenizer_free(t);
}

static void test_added(void) {
    sm_err e = {{0}};
    json_t *r = base();
    vocab_add(r, "<|end|>", 256); /* a special that is also in the vocabulary keeps its id */
    added_add(r, "<|end|>", 256, 1, 0);
    added_add(r, "<|end_of_text|>", 257, 1, 0);
    added_add(r, "<|e", 258, 0, 1);   /* normalized: only in the second pass */
    added_add(r, "x<|end|>", 259, 0, 1); /* never: the first pass took <|end|> */
    sm_tokenizer *t = load(r, "added", NULL, &e);
    CHECK(t, "load: %s", e.msg);
    if (!t) return;
    CHECK(ENC(t, "a<|end_of_text|>b<|end|>", 'a', 257, 'b', 256), "longest first, never split");
    CHECK(ENC(t, "<|ex<|end|>", 258, 'x', 256), "two passes");
    CHECK(ENC(t, "x<|end|>", 'x', 256), "the first pass wins");
    CHECK(ENC(t, "<|end", 258, 'n', 'd'), "a prefix of a special");
    CHECK(sm_tokenizer_token_id(t, "<|end_of_text|>") == 257 && sm_tokenizer_is_special(t, 257) &&
              !sm_tokenizer_is_special(t, 258) && !sm_tokenizer_is_special(t, 'a') && sm_tokenizer_size(t) == 260,
          "token_id / is_special / size");
    CHECK(dec_is(t, (const int[]){'a', 257, 258}, 3, "a<|end_of_text|><|e"), "specials decode to their text");
    sm_tokenizer_free(t);
}

static void test_utf8(void) {
    sm_err e = {{0}};
    sm_tokenizer *t = load(base(), "utf8", NULL, &e);
    CHECK(t, "load: %s", e.msg);
    if (!t) return;
    struct { const char *s; size_t at; } bad[] = {
        {"\xff", 0}, {"ab\xe2\x82", 2}, {"\xc0\x80", 0}, {"x\xed\xa0\x80", 1}, {"ok\xf4\x90\x80\x80", 2}, {"\x80", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int *ids = NULL, n = 0;
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", bad[i].at);
        int rc = sm_tokenizer_encode(t, bad[i].s, strlen(bad[i].s), &ids, &n, &e);
        CHECK(rc == -1 && strstr(e.msg, want) && !ids, "case %zu: '%s'", i, e.msg);
        free(ids);
    }
    /* decoding: one U+FFFD per maximal invalid subsequence, as Rust's from_utf8_lossy */
    CHECK(dec_is(t, (const int[]){0xe2, 0x82, 'a'}, 3, "\xef\xbf\xbd" "a"), "truncated sequence: one U+FFFD");
    CHECK(dec_is(t, (const int[]){0xf0, 0x9f, 0x98}, 3, "\xef\xbf\xbd"), "truncated at the end: one U+FFFD");
    CHECK(dec_is(t, (const int[]){0xe0, 0x80}, 2, "\xef\xbf\xbd\xef\xbf\xbd"), "E0 80: two");
    CHECK(dec_is(t, (const int[]){0xff, 'b', 0xc3}, 3, "\xef\xbf\xbd" "b\xef\xbf\xbd"), "FF and a lone lead byte");
    char *s = NULL;
    size_t len;
    CHECK(sm_tokenizer_decode(t, (const int[]){'a', 999}, 2, &s, &len, &e) == -1 && strstr(e.msg, "id 999 (index 1)") && !s,
          "unknown id: '%s'", e.msg);
    CHECK(sm_tokenizer_decode(t, (const int[]){-3}, 1, &s, &len, &e) == -1 && strstr(e.msg, "id -3 (index 0)"), "negative id");
    sm_tokenizer_free(t);
}

/* One edit of the base file -> the message must name the file and contain want. */
typedef struct refusal {
    const char *name, *json_path, *value, *want;
} refusal;

static void test_refusals(void) {
    const refusal cases[] = {
        {"model_type", "model.type", "\"WordPiece\"", "model.type is 'WordPiece'; only BPE"},
        {"normalizer", "normalizer", "{\"type\": \"NFC\"}", "normalizer.type is 'NFC'"},
        {"pretok", "pre_tokenizer", "{\"type\": \"Whitespace\"}", "pre_tokenizer.type is 'Whitespace'"},
        {"pretok_seq", "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
         "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Digits\"}]}",
         "pre_tokenizer.pretokenizers[1] is 'Digits'"},
        {"pretok_after", "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"a\"}, \"behavior\": \"Isolated\"}]}",
         "pre_tokenizer.pretokenizers[1].type: a step after ByteLevel"},
        {"no_bytelevel", "pre_tokenizer",
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\", \"invert\": false}",
         "no ByteLevel step"},
        {"bad_regex", "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
         "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\"}]}",
         "pre_tokenizer.pretokenizers[0].pattern: bad regex"},
        {"behavior", "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
         "\"behavior\": \"Sideways\", \"invert\": false}, {\"type\": \"ByteLevel\"}]}",
         "pre_tokenizer.pretokenizers[0].behavior must be one of"},
        {"empty_literal", "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"String\": \"\"}, "
         "\"behavior\": \"Removed\", \"invert\": true}, {\"type\": \"ByteLevel\"}]}",
         "pre_tokenizer.pretokenizers[0].pattern is an empty string"},
        {"decoder", "decoder", "{\"type\": \"WordPiece\"}", "decoder.type is 'WordPiece'"},
        {"decoder_null", "decoder", "null", "decoder is null"},
        {"merge_tok", "model.merges", "[\"q zz\"]", "model.merges[0]: 'zz' is not in model.vocab"},
        {"merge_form", "model.merges", "[\"abc\"]", "model.merges[0] must be two tokens separated by one space"},
        {"merge_result", "model.merges", "[[\"q\", \"r\"]]", "model.merges[0]: 'qr' is not in model.vocab"},
        {"vocab_id", "model.vocab", "{\"a\": -1}", "model.vocab['a'] must be an integer id"},
        {"dup_id", "model.vocab", "{\"a\": 1, \"b\": 1}", "model.vocab: id 1 is given to two tokens"},
        {"dropout", "model.dropout", "0.1", "model.dropout is set"},
        {"suffix", "model.end_of_word_suffix", "\"</w>\"", "model.end_of_word_suffix is set"},
        {"byte_fallback", "model.byte_fallback", "true", "model.byte_fallback is true"},
        {"unk", "model.unk_token", "\"<unk>\"", "model.unk_token '<unk>' is not in model.vocab"},
        {"lstrip", "added_tokens",
         "[{\"id\": 256, \"content\": \"<s>\", \"lstrip\": true, \"special\": true}]", "added_tokens[0].lstrip is true"},
        {"added_id", "added_tokens", "[{\"id\": 300, \"content\": \"<s>\", \"special\": true}]",
         "added_tokens[0] ('<s>') has id 300 but the tokenizers library gives it 256"},
        {"added_vocab_id", "added_tokens", "[{\"id\": 5, \"content\": \"a\", \"special\": true}]",
         "has id 5 but the tokenizers library gives it 97 (its id in model.vocab)"},
        {"no_model", "model", NULL, "no 'model' field"},
    };
    sm_err e = {{0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const refusal *c = &cases[i];
        json_t *r = base(), *obj = r;
        char key[64];
        snprintf(key, sizeof key, "%s", c->json_path);
        char *dot = strchr(key, '.');
        if (dot) *dot = 0, obj = json_object_get(r, key);
        const char *leaf = dot ? dot + 1 : key;
        if (c->value) json_object_set_new(obj, leaf, json_loads(c->value, JSON_DECODE_ANY, NULL));
        else json_object_del(obj, leaf);
        char path[700];
        sm_tokenizer *t = load(r, c->name, path, &e);
        CHECK(!t && strstr(e.msg, c->want) && strstr(e.msg, path) && !strchr(e.msg, '\n'), "%s: '%s'", c->name, e.msg);
        sm_tokenizer_free(t);
    }
    char path[700];
    sm_tokenizer *t = NULL;
    snprintf(path, sizeof path, "%s/notjson.json", g_dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("{\"model\": [1, 2,", f), fclose(f);
    CHECK(sm_tokenizer_load(path, &t, &e) == -1 && strstr(e.msg, "not valid JSON") && strstr(e.msg, path), "bad JSON: '%s'", e.msg);
    snprintf(path, sizeof path, "%s/missing.json", g_dir);
    CHECK(sm_tokenizer_load(path, &t, &e) == -1 && strstr(e.msg, "cannot open") && strstr(e.msg, path), "missing: '%s'", e.msg);
    CHECK(sm_tokenizer_load(g_dir, &t, &e) == -1 && strstr(e.msg, "not a regular file"), "a directory: '%s'", e.msg);
}

static void test_long_piece(void) {
    sm_err e = {{0}};
    json_t *r = base();
    vocab_add(r, "aa", 300), vocab_add(r, "aaaa", 301);
    merge_add(r, "a", "a", 0), merge_add(r, "aa", "aa", 0);
    sm_tokenizer *t = load(r, "long", NULL, &e);
    CHECK(t, "load: %s", e.msg);
    if (!t) return;
    size_t n = 1 << 20;
    char *s = malloc(n + 1);
    memset(s, 'a', n);
    s[n - 1] = 'b';
    int *ids = NULL, k = 0;
    clock_t c0 = clock();
    int rc = sm_tokenizer_encode(t, s, n, &ids, &k, &e);
    double sec = (double)(clock() - c0) / CLOCKS_PER_SEC;
    /* 2^20 - 1 a's: 262143 "aaaa", then "aa", "a", "b" */
    int ok = rc == 0 && k == 262143 + 3 && ids[0] == 301 && ids[262142] == 301 && ids[262143] == 300 && ids[262144] == 'a' &&
             ids[262145] == 'b';
    CHECK(ok, "one piece of 1 MiB: rc %d, %d ids", rc, k);
    CHECK(sec < 2.0, "1 MiB piece took %.2f s (merging is not n log n)", sec);
    free(ids);
    sm_tokenizer_free(t);
    /* a match that backtracks through a group n times: past PCRE2's default JIT stack */
    r = base();
    json_object_set_new(r, "pre_tokenizer",
                        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}", "type", "Sequence", "pretokenizers",
                                  "type", "Split", "pattern", "Regex", "(a|b)+(?=b)|x", "behavior", "Isolated", "invert", 0,
                                  "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
    t = load(r, "deep", NULL, &e);
    CHECK(t, "load: %s", e.msg);
    if (t) {
        n = 1 << 18;
        s[n - 1] = 'b';
        rc = sm_tokenizer_encode(t, s, n, &ids, &k, &e);
        CHECK(rc == 0 && k == (int)n, "a deep match: rc %d, %d ids: %s", rc, k, e.msg);
        free(ids);
    }
    free(s);
    sm_tokenizer_free(t);
}

typedef struct targ {
    const sm_tokenizer *t;
    const char *text;
    int *ids;
    int n;
    int rc;
} targ;

static void *enc_thread(void *p) {
    targ *a = p;
    sm_err e = {{0}};
    for (int i = 0; i < 20 && !a->rc; i++) {
        free(a->ids);
        a->rc = sm_tokenizer_encode(a->t, a->text, strlen(a->text), &a->ids, &a->n, &e);
    }
    return NULL;
}

/* The same ids cold and warm, and from threads that race for the cache. */
static void test_cache(void) {
    char path[700];
    sm_err e = {{0}};
    snprintf(path, sizeof path, "%s/trained_cache.json", g_dir);
    sm_tok_special sp[] = {{"<|eos|>", 2}};
    sm_tokenizer *t = NULL;
    CHECK(sm_tokenizer_write_trained(path, sp, 1, 1024, NULL, &e) == 0 && sm_tokenizer_load(path, &t, &e) == 0, "%s", e.msg);
    if (!t) return;
    const char *text = "The keeper of the lighthouse wrote the weather in her logbook, every evening, for years.<|eos|>";
    targ a[4];
    for (int i = 0; i < 4; i++) a[i] = (targ){t, text, NULL, 0, 0};
    enc_thread(&a[0]); /* cold, then warm */
    pthread_t th[3];
    for (int i = 1; i < 4; i++) pthread_create(&th[i - 1], NULL, enc_thread, &a[i]);
    for (int i = 1; i < 4; i++) pthread_join(th[i - 1], NULL);
    for (int i = 1; i < 4; i++)
        CHECK(!a[i].rc && a[i].n == a[0].n && !memcmp(a[i].ids, a[0].ids, sizeof(int) * (size_t)a[0].n), "thread %d", i);
    CHECK(a[0].n < (int)strlen(text) / 2 && a[0].ids[a[0].n - 1] == 2, "merges compress English; eos last (%d ids)", a[0].n);
    for (int i = 0; i < 4; i++) free(a[i].ids);
    sm_tokenizer_free(t);
}

static void test_trained(void) {
    char p1[700], p2[700];
    sm_err e = {{0}};
    snprintf(p1, sizeof p1, "%s/trained1.json", g_dir);
    snprintf(p2, sizeof p2, "%s/trained2.json", g_dir);
    sm_tok_special sp[] = {{"<|pad|>", 0}, {"<|bos|>", 1}, {"<|eos|>", 2}};
    int nv = 0, nv2 = 0;
    CHECK(sm_tokenizer_write_trained(p1, sp, 3, 512, &nv, &e) == 0, "write: %s", e.msg);
    CHECK(sm_tokenizer_write_trained(p2, sp, 3, 512, &nv2, &e) == 0, "write again: %s", e.msg);
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", p1, p2);
    CHECK(system(cmd) == 0, "the same bytes twice");
    sm_tokenizer *t = NULL;
    CHECK(sm_tokenizer_load(p1, &t, &e) == 0, "load: %s", e.msg);
    if (!t) return;
    CHECK(nv == 512 && sm_tokenizer_size(t) == 512, "fills the vocabulary: %d ids, size %d", nv, sm_tokenizer_size(t));
    CHECK(sm_tokenizer_token_id(t, "<|eos|>") == 2 && sm_tokenizer_token_id(t, "<|pad|>") == 0 && sm_tokenizer_is_special(t, 1),
          "specials at their ids");
    CHECK(sm_tokenizer_token_id(t, "\xc4\x80") == 3 && sm_tokenizer_token_id(t, mapped("\xff")) == 258, "bytes at 3..258");
    const char *texts[] = {"Hello, world! It's 2024-05-17 and the harbour is quiet.\n\n  ",
                           "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 e\xcc\x81 \t\r\n 12345678 <|eos|>x", ""};
    for (int i = 0; i < 3; i++) {
        int *ids = NULL, n = 0;
        char *back = NULL;
        size_t len = 0;
        int ok = sm_tokenizer_encode(t, texts[i], strlen(texts[i]), &ids, &n, &e) == 0 &&
                 sm_tokenizer_decode(t, ids, n, &back, &len, &e) == 0 && len == strlen(texts[i]) && !memcmp(back, texts[i], len);
        for (int k = 0; ok && k < n; k++) ok = ids[k] >= 0 && ids[k] < 512;
        CHECK(ok, "round trip %d: %s", i, e.msg);
        free(ids);
        free(back);
    }
    sm_tokenizer_free(t);
    /* the real model's layout: specials above the learned ids, the text runs out of pairs */
    sm_tok_special big[] = {{"<|bos|>", 200000}, {"<|eos|>", 200001}, {"<|eot|>", 200008}, {"<|pad|>", 200018}};
    CHECK(sm_tokenizer_write_trained(p2, big, 4, 201818, &nv, &e) == 0 && sm_tokenizer_load(p2, &t, &e) == 0, "big: %s", e.msg);
    CHECK(t && sm_tokenizer_size(t) == 200019 && sm_tokenizer_token_id(t, "<|eot|>") == 200008 && nv > 400 && nv < 20000,
          "big: size %d, %d ids", t ? sm_tokenizer_size(t) : -1, nv);
    sm_tokenizer_free(t);
    CHECK(sm_tokenizer_write_trained(p2, sp, 3, 258, &nv, &e) == -1 && strstr(e.msg, "do not fit below id 258"), "too small: '%s'",
          e.msg);
}

int main(void) {
    if (tm_mkdtemp(g_dir, sizeof g_dir, "sm_test_tok")) {
        printf("FAIL tokenizer_tmpdir\nDONE 0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_bytes);
    RUN(test_merge_order);
    RUN(test_ignore_merges_and_prefix);
    RUN(test_added);
    RUN(test_utf8);
    RUN(test_refusals);
    RUN(test_long_piece);
    RUN(test_cache);
    RUN(test_trained);
    tm_rmtree(g_dir);
    return TEST_DONE();
}
