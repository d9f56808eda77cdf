/* logitproc.h: the logit processors of a request (include/sparkmono.h: the processor fields of
 * sparkmono_sampling): allowed ids, bad words, min_tokens, logit_bias, repetition / frequency /
 * presence penalties, and the stop rules (eos, ignore_eos, stop ids); and bad words as text made
 * id sequences with the model's tokenizer, once for the server and the Python binding.  A row's
 * logprobs are the step's summary (backend.h: sm_lp_sum, made where the logits are).
 *
 * A processor is a function of (raw row, history before the position): the engine calls
 * sm_lp_apply once per position with the request's history and the tokens accepted so far in
 * the step (drafts included), so the processed row of a verify row is exactly the one plain
 * decoding would build at that position.  The penalties walk the history once with a count
 * per id (a workspace of V counters, back to zero after each call), so a row costs O(V +
 * history).  We rejected keeping running counts in the request: a verify step's rejected
 * drafts would have to be taken back out, and a row-local count cannot go stale.
 */
#ifndef SM_LOGITPROC_H
#define SM_LOGITPROC_H
#include <stddef.h>
#include "base/err.h"
#include "model/tokenizer.h"
#include "sparkmono.h"

/* The scratch of sm_lp_apply. */
typedef struct sm_lp_ws {
    int cap;        /* ids the buffers hold (V) */
    int *count;     /* [cap] occurrences of each id among the generated ids; 0 between calls */
    char *seen;     /* [cap] 1: id in the history (prompt or generated); 0 between calls */
    float *row;     /* [cap] the last processed row */
} sm_lp_ws;

int sm_lp_ws_init(sm_lp_ws *ws, int cap, sm_err *e);
void sm_lp_ws_free(sm_lp_ws *ws);

/* 0 when the processor fields of s are valid for a vocabulary of V ids: penalties in range,
 * repetition_penalty 0 or > 0 and finite, min_tokens >= 0, ignore_eos 0 / 1, bias, stop ids,
 * allowed ids and bad words within their counts and [0, V) (each bad word one id or more), bias
 * in [-100, 100]; else -1 with one line naming the field. */
int sm_lp_check(const sparkmono_sampling *s, int V, sm_err *e);

/* 1 when s changes a row's distribution (allowed ids, bad words, a penalty, a bias, or
 * min_tokens > 0). */
int sm_lp_active(const sparkmono_sampling *s);

/* Bad words as vLLM takes them: each of words [n] (word i: lens[i] bytes of UTF-8, NUL allowed),
 * its leading whitespace stripped, encoded by t as it is (one id sequence) and after one space
 * (a second sequence, kept when its first id differs from the first's and it has as many ids:
 * the word after another word), appended to s's bad words.  0, or -1 with one line naming the
 * word (empty, not text the tokenizer takes, an id outside [0, V), more sequences or ids than
 * sparkmono_sampling holds). */
int sm_lp_bad_words(const sm_tokenizer *t, const char *const *words, const size_t *lens, int n, int V, sparkmono_sampling *s,
                    sm_err *e);

/* 1 when token t ends a request under s: an eos id (eos [n_eos]) unless ignore_eos, or a stop id. */
int sm_lp_stops(const sparkmono_sampling *s, const int *eos, int n_eos, int t);

/* The processed row of raw logits lg [nv] for the next position of a request whose history is
 * hist [nhist] (the first plen ids its prompt) followed by extra [nextra] (generated ids not yet
 * in hist: a verify step's accepted drafts).  Returns ws->row (valid until the next call). */
const float *sm_lp_apply(sm_lp_ws *ws, const float *lg, int nv, const sparkmono_sampling *s, const int *hist,
                         int nhist, int plen, const int *extra, int nextra, const int *eos, int n_eos);

/* The id of the largest logit of row [nv] (ties to the lowest id); -1 when a logit is NaN or
 * every one is -inf. */
int sm_lp_argmax(const float *row, int nv);

#endif
