/* vocab.h: the model's vocabulary as a byte trie, and the token mask of a grammar configuration.
 *
 * Each id's bytes (what it decodes to: tokenizer.h) are inserted into a trie laid out in
 * preorder: node i has its byte, its depth and the index past its subtree, so one pass over the
 * array is a depth-first walk and a dead configuration skips its whole subtree at once.  The
 * mask of a configuration sets the bit of every id whose bytes the grammar can read from it
 * (match.h), plus the end-of-sequence ids when it accepts; it is computed on first use and kept
 * in the configuration's slot.  Ids the mask never allows: special tokens (but the eos ids),
 * ids that decode to no bytes, ids without a token, ids >= vocab_used.
 * We rejected matching each of the 202,048 tokens separately: tokens share prefixes, and the
 * preorder walk steps each shared prefix once.
 */
#ifndef SM_VOCAB_H
#define SM_VOCAB_H
#include <stdint.h>
#include "base/err.h"
#include "constrain/match.h"
#include "model/tokenizer.h"

typedef struct sm_vocab {
    int V;               /* ids of a logits row (the model's vocab_size) */
    int words;           /* ceil(V / 32): uint32 words of a mask */
    int nnodes;          /* trie nodes (node 0: the root, no byte) */
    uint8_t *byte;       /* [nnodes] the byte read entering node i */
    int *depth;          /* [nnodes] bytes from the root (root 0) */
    int *skip;           /* [nnodes] the node after i's subtree in preorder */
    int *tok_off;        /* [nnodes + 1] ids ending at node i: ids[tok_off[i] .. tok_off[i + 1]) */
    int *ids;            /* [tok_off[nnodes]] */
    int maxdepth;        /* the longest token, in bytes */
    int n_eos;
    int eos[8];          /* [n_eos] the ids an accepting configuration allows */
    uint8_t *bytes;      /* the eligible ids' bytes, back to back */
    int64_t *off;        /* [V + 1] id v's bytes: bytes[off[v] .. off[v + 1]); empty: never allowed */
} sm_vocab;

/* The trie of ids [0, V): id v's bytes b[v] [len[v]] (copied), eligible when ok[v] (a token that
 * is not special, below vocab_used, with at least one byte).  -1 with one line. */
int sm_vocab_build_raw(int V, const unsigned char *const *b, const size_t *len, const uint8_t *ok, const int *eos, int n_eos,
                       sm_vocab **out, sm_err *e);
/* The same from tokenizer t for rows of V ids (ids >= vocab_used never allowed). */
int sm_vocab_build(const sm_tokenizer *t, int V, int vocab_used, const int *eos, int n_eos, sm_vocab **out, sm_err *e);
/* The bytes of id v (*len 0: not eligible). */
static inline const uint8_t *sm_vocab_bytes(const sm_vocab *v, int id, size_t *len) {
    *len = id >= 0 && id < v->V ? (size_t)(v->off[id + 1] - v->off[id]) : 0;
    return *len ? v->bytes + v->off[id] : NULL;
}
void sm_vocab_free(sm_vocab *v);

/* The mask of configuration cfg of g (words [v->words] owned by g's slot, then one word: 1 when
 * any bit is set; NULL with one line in e when the grammar fails).  eos ids are set when cfg
 * accepts. */
const uint32_t *sm_vocab_mask(const sm_vocab *v, sm_gram *g, int cfg, sm_err *e);

/* 1 when bit id of mask m is set. */
static inline int sm_mask_has(const uint32_t *m, int id) { return (m[id >> 5] >> (id & 31)) & 1; }

#endif
