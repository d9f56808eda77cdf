/* tokenizer.h: a Hugging Face tokenizer.json (byte-level BPE with a regex pre-tokenizer,
 * added / special tokens) read in C: encode text to ids, decode ids to text.
 *
 * The file is parsed with jansson and the pre-tokenizer pattern compiled with PCRE2 (UTF-8,
 * Unicode properties); merges are looked up by pair rank.  Special tokens are matched first,
 * longest first, and never split.  We rejected a hand-written regex engine (the pattern uses
 * Unicode classes and lookahead that a small matcher gets subtly wrong) and a Python helper
 * process (the server and the CLI must not need Python).
 */
#ifndef SM_TOKENIZER_H
#define SM_TOKENIZER_H

#include "base/err.h"
#include <stddef.h>

typedef struct sm_tokenizer sm_tokenizer;

/* Load tokenizer.json at path; one line naming the file and the problem on failure. */
int sm_tokenizer_load(const char *path, sm_tokenizer **out, sm_err *e);
void sm_tokenizer_free(sm_tokenizer *t);
/* The tokenizer of model directory dir (tokenizer_dir.c): path [npath] gets dir/tokenizer.json;
 * 0 with *out NULL when there is none, -1 with one line when it cannot be loaded. */
int sm_tokenizer_load_dir(const char *dir, sm_tokenizer **out, char *path, size_t npath, sm_err *e);
/* Ids of text [len bytes, UTF-8]: *ids malloc'd [*n] (caller frees).  Special tokens in the
 * text are recognized.  Invalid UTF-8 is an error naming the byte offset.  The ids of the text
 * alone (the file's post_processor is not applied): a caller that wants bos prepends it.
 * Thread-safe: concurrent calls on one tokenizer are fine (one at a time uses the cache). */
int sm_tokenizer_encode(const sm_tokenizer *t, const char *text, size_t len, int **ids, int *n, sm_err *e);
/* Text of ids [n]: *text malloc'd, NUL-terminated, *len bytes (caller frees).  An id outside
 * the vocabulary is an error naming it and its index. */
int sm_tokenizer_decode(const sm_tokenizer *t, const int *ids, int n, char **text, size_t *len, sm_err *e);
/* Largest id + 1 (vocabulary and added tokens). */
int sm_tokenizer_size(const sm_tokenizer *t);
/* Id of a token string (e.g. "<|eos|>"), -1 if absent. */
int sm_tokenizer_token_id(const sm_tokenizer *t, const char *token);
/* 1 if id is a special added token (decoders that skip special tokens drop it), else 0. */
int sm_tokenizer_is_special(const sm_tokenizer *t, int id);
/* The bytes id decodes to (*b [*len], owned by t): 1 for a vocabulary or added token, 2 for a
 * special one, 0 for an id with no token (then *len = 0). */
int sm_tokenizer_token_bytes(const sm_tokenizer *t, int id, const unsigned char **b, size_t *len);

#endif
