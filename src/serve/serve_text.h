/* serve_text.h: generated ids to the text a client sees, piece by piece: incremental decoding
 * that never splits a UTF-8 character, stop strings that may span pieces, and the byte
 * buffer the server writes responses into.
 *
 * Byte-level BPE decodes a sequence of ids to the concatenation of their bytes, so the text of
 * ids [0, n) is a prefix of the text of ids [0, n + k) up to its last character, which may be
 * cut between two tokens (the tokenizer then ends the text with U+FFFD, or with the bytes of
 * an unfinished character): the decoder keeps a window of the ids whose text is not all out
 * yet, decodes only that window and hands out everything before such an ending.  Special
 * tokens (an eos) are left out of the text, as the `tokenizers` library's
 * skip_special_tokens does (unless keep_special).  Text that could be the start of a stop
 * string is held back until it is known not to be one; a match ends the text before the stop
 * string (OpenAI's rule: the stop string itself is not returned), or just after it with
 * include_stop (vLLM's include_stop_str_in_output).  Stop strings are byte strings of their own
 * length (a NUL byte is a byte like any other).  Every piece handed out is
 * valid UTF-8 (an invalid byte becomes U+FFFD), as JSON needs.  We rejected decoding all ids
 * at every step (quadratic in the output length) and stopping on token ids (a stop string is
 * text: it may start inside one token and end in another).
 */
#ifndef SM_SERVE_TEXT_H
#define SM_SERVE_TEXT_H
#include <stddef.h>
#include "base/buf.h"
#include "base/err.h"
#include "model/tokenizer.h"

#define SM_MAX_STOP 4 /* stop strings a request may give (OpenAI's limit) */

/* Append s [n] to b with every invalid UTF-8 sequence replaced by U+FFFD. */
int sm_utf8_sanitize(sm_buf *b, const char *s, size_t n);
/* Length of the longest prefix of s [n] that does not end inside a UTF-8 character (a
 * trailing lead byte still waiting for its continuation bytes). */
size_t sm_utf8_complete(const char *s, size_t n);

typedef struct sm_detok {
    const sm_tokenizer *tok;   /* NULL: the model has no tokenizer; no text is produced */
    int w0;                    /* first id of the window not yet fully handed out */
    size_t wb;                 /* bytes of the window's text already handed out */
    sm_buf pend;              /* text decoded but held back (a possible stop string start) */
    const char *stop[SM_MAX_STOP]; /* [nstop] stop strings, non-empty (not owned) */
    size_t stop_len[SM_MAX_STOP];  /* [nstop] their bytes */
    int nstop;
    int include_stop;          /* 1: a matched stop string stays in the text (the text ends after it) */
    int keep_special;          /* 1: special tokens' text is kept (skip_special_tokens false) */
} sm_detok;

/* ids [n] are every id generated so far (a prefix of the next call's).  Appends the new text
 * that is safe to hand out to out.  final: no more ids will come (flush everything held
 * back).  Returns 1 when a stop string matched (out ends just before it, or after it with
 * include_stop; the request is over), 0 otherwise, -1 when out of memory (e says so).  An id the
 * tokenizer cannot decode becomes U+FFFD. */
int sm_detok_push(sm_detok *d, const int *ids, int n, int final, sm_buf *out, sm_err *e);
void sm_detok_free(sm_detok *d);

#endif
