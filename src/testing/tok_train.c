/* tok_train.c: the tokenizer.json of make-model's test models (tok_train.h): byte-level BPE
 * merges learned from a small built-in English text, written in the format model/tokenizer.c
 * reads (and the Python tokenizers package, which the tests compare against).
 *
 * Training is the textbook loop: count adjacent pairs over the distinct words (weighted by
 * their counts), merge the most frequent, repeat; quadratic, but the text is 3 KB.  We rejected
 * shipping a fixed tokenizer.json with the tests: its vocabulary would not follow the
 * configuration's vocabulary size and special ids, and it is one more file to keep in sync.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "testing/tok_train.h"
#include "base/outfile.h"
#include "model/tok_table.h"
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_MAX 256                /* a learned token's bytes: longer than any word of the text */

/* The split of the tokenizers sm_tokenizer_write_trained writes (GPT-4 / Llama-3 kind). */
static const char *TRAIN_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

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
static int train_words(pcre2_code *re, tok_strtab *words, tok_arena *wa, int **count, int *nw, sm_err *e) {
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!md) return sm_errf(e, "make-model: tokenizer: out of memory");
    size_t n = sizeof TRAIN_TEXT - 1, pos = 0;
    int cap = 0, rc = 0;
    while (pos < n) {
        int r = pcre2_match(re, (PCRE2_SPTR)TRAIN_TEXT, n, pos, 0, md, NULL);
        if (r < 0) break; /* the pattern matches every character: no gaps */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { pos++; continue; }
        tok_slot *s;
        int dup;
        if (tok_tab_put(words, wa, TRAIN_TEXT + ov[0], ov[1] - ov[0], *nw, &s, &dup)) { rc = -1; break; }
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
    for (size_t i = 0; i < n; i++) k += tok_utf8_put(cp[(uint8_t)b[i]], o + k);
    json_t *s = json_stringn(o, k);
    if (o != buf) free(o);
    return s;
}

typedef struct trainer {
    tok_arena tb;             /* token bytes */
    uint32_t *off, *len;  /* [limit] bytes of each id; len 0: not a learned / byte token */
    tok_strtab bytes;         /* token bytes -> id */
    int *syms;            /* every word's symbols, word after word */
    int *wstart, *wlen;   /* [nw] a word's symbols in syms */
} trainer;

int sm_tokenizer_write_trained(const char *path, const sm_tok_special *sp, int nsp, int limit, int *nvocab, sm_err *e) {
    uint32_t cp[256];
    tok_byte_chars(cp);
    trainer tr = {0};
    tok_strtab words = {0};
    tok_arena wa = {0};
    tok_pairtab cnt = {0};
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
        tok_slot *s;
        int dup;
        if (tok_tab_put(&tr.bytes, &tr.tb, &c, 1, next, &s, &dup)) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
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
        tok_slot *s = &words.s[i];
        if (!s->h) continue;
        tr.wstart[s->val] = (int)k;
        tr.wlen[s->val] = (int)s->len;
        for (uint32_t j = 0; j < s->len; j++) {
            char c = wa.b[s->off + j];
            tr.syms[k++] = tok_tab_find(&tr.bytes, &tr.tb, &c, 1, tok_hash_bytes(&c, 1))->val;
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
                int32_t s = tok_pair_slot(&cnt, tok_pair_key(tr.syms[tr.wstart[w] + i], tr.syms[tr.wstart[w] + i + 1]));
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
        char cat[2 * TOKEN_MAX];
        size_t nl = tr.len[l], nr = tr.len[r];
        if (nl + nr > sizeof cat) break; /* longer tokens than any word of the text: never */
        memcpy(cat, tr.tb.b + tr.off[l], nl);
        memcpy(cat + nl, tr.tb.b + tr.off[r], nr);
        tok_slot *s;
        int dup, id;
        if (tok_tab_put(&tr.bytes, &tr.tb, cat, nl + nr, next, &s, &dup)) { sm_errf(e, "make-model: tokenizer: out of memory"); goto out; }
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
    tok_pair_free(&cnt);
    return rc;
}
