/* tokenizer_impl.h: the tokenizer's struct, shared by its loader (tokenizer.c) and its encoder /
 * decoder (tokenizer_encode.c); nothing outside src/model/tokenizer*.c includes it.
 *
 * One struct read-only after load (except the encode cache, under its mutex).  We rejected
 * keeping load and encode in one file: together they passed the 800-line bound, and they share
 * only this struct.
 */
#ifndef SM_TOKENIZER_IMPL_H
#define SM_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tok_table.h"
#include "model/tokenizer.h"
#include <pcre2.h>
#include <pthread.h>

#define MAX_STEPS 8                  /* pre-tokenizer steps */

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
    tok_arena a;              /* token strings, decoded bytes, added contents */
    int size;             /* largest id + 1 */
    uint32_t *dec_off, *dec_len; /* [size] decoded bytes of each id (ByteLevel decoder) */
    uint8_t *kind;        /* [size] 0: no token, 1: model vocabulary, 2: added, 3: added special */
    tok_strtab vocab;         /* model.vocab: token string -> id */
    tok_strtab raw;           /* model.vocab tokens of byte-level characters: their bytes -> id */
    tok_strtab addmap;        /* added token content -> index in add */
    added *add;           /* [nadd] */
    int nadd;
    addgroup grp[2];      /* pass 0: normalized = false; pass 1: normalized = true */
    int byte_id[256];     /* id of each byte's token, -1 if absent */
    tok_pairtab merges;       /* (left, right) -> rank, merged id */
    step st[MAX_STEPS];   /* pre-tokenizer steps, in order */
    int nst;
    int unk_id, fuse_unk, ignore_merges;
    pthread_mutex_t cache_mu;
    tok_strtab cache;         /* piece bytes -> ids (val: offset in cache_ids, aux: count) */
    tok_arena cache_keys;     /* piece bytes */
    int *cache_ids;       /* [cache_nids] */
    size_t cache_nids, cache_cap;
};

#endif
