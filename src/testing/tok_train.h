/* tok_train.h: write a small byte-level BPE tokenizer.json for a test model (make-model, the
 * tests); the tokenizer itself (loading, encode, decode) is model/tokenizer.h.
 *
 * Kept out of src/model/: only fixtures need it, and the engine should not carry a trainer.
 * We rejected a Python script for it: make-model must run without Python.
 */
#ifndef SM_TOK_TRAIN_H
#define SM_TOK_TRAIN_H

#include "base/err.h"

typedef struct sm_tok_special {
    const char *content;     /* "<|eos|>" */
    int id;                  /* its id, distinct from every other special's */
} sm_tok_special;

/* Write a byte-level BPE tokenizer.json at path (through a temporary file, outfile.h) for a
 * test model: the special tokens sp [nsp] at their ids (in model.vocab and added_tokens), the
 * 256 byte tokens at the smallest ids that are free, then merges learned from a small
 * built-in English text (most frequent pair first, ties to the smaller ids; deterministic),
 * each new token at the next free id, until ids reach limit or no pair occurs twice.  Every
 * id is below limit except the specials'.  Error when the 256 bytes do not fit below limit.
 * *nvocab (when not NULL): the ids written (specials, bytes, merged tokens). */
int sm_tokenizer_write_trained(const char *path, const sm_tok_special *sp, int nsp, int limit, int *nvocab, sm_err *e);

#endif
