/* serve_fields.h: the request fields that set a request's sampling and logit processors
 * (include/sparkmono.h: sparkmono_sampling), parsed once for every endpoint (completions
 * here, chat beside it): presence_penalty, frequency_penalty, repetition_penalty, logit_bias,
 * min_tokens, ignore_eos, stop_token_ids, min_p, allowed_token_ids, and bad_words (strings
 * made ids with the model's tokenizer); and the record of unknown fields, which are
 * accepted with one line in the server's log (vLLM's rule).  A field's bad type or value is a
 * 400 naming the field and its allowed range.  We rejected a parser per endpoint: the same
 * field would get two range checks that drift apart.
 */
#ifndef SM_SERVE_FIELDS_H
#define SM_SERVE_FIELDS_H
#include <jansson.h>
#include "base/err.h"
#include "engine/logitproc.h"
#include "sparkmono.h"

#define SM_FIELDS_IGNORED 512 /* bytes of the list of ignored field names */

/* Field k with value v, for a vocabulary of V ids and at most max_len tokens: 1 when k is one
 * of the fields above (s updated), 0 when it is not, -1 on a bad value (e: one line naming
 * k and the allowed range; param [32]: k). */
int sm_fields_sampling(const char *k, const json_t *v, int V, int max_len, sparkmono_sampling *s, char *param, sm_err *e);
/* The same for bad_words (a list of strings, made id sequences with tok as vLLM makes them:
 * src/engine/logitproc.h, sm_lp_bad_words); tok NULL: a nonempty list is refused. */
int sm_fields_bad_words(const char *k, const json_t *v, const sm_tokenizer *tok, int V, sparkmono_sampling *s, char *param,
                        sm_err *e);

/* Add the name of an unknown field k to the list ig [SM_FIELDS_IGNORED] ("a, b", cut short
 * with "..." when full). */
void sm_fields_ignore(char *ig, const char *k);

#endif
