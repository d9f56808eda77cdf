/* constrain.h: a compiled output constraint (include/sparkmono.h: sparkmono_constraint) and a
 * request's position in it.
 *
 * A constraint is a grammar (match.h) compiled from a regex, a JSON Schema, "any JSON object" or
 * a list of choices, bound to one vocabulary (vocab.h), with the token masks of the
 * configurations generation has met.  It is shared: every request that uses it holds a
 * reference (the server compiles a request's constraint once, its `n` choices share it), and a
 * mutex serializes its lazy automaton, so engines on several threads may use one.
 * Masks are cached per configuration up to SM_CON_MASK_BUDGET bytes (then dropped and made
 * again as met: a json_object used for hours meets ever new nesting depths); callers get copies.
 * A request's position is an int: a configuration id of the grammar, or SM_CON_ENDED once an
 * eos id was taken in an accepting configuration (then only eos ids are allowed: a request
 * with ignore_eos goes on emitting them).
 * We rejected a constraint per request: a server answering the same schema thousands of times
 * would recompile it and recompute every mask each time.
 */
#ifndef SM_CONSTRAIN_H
#define SM_CONSTRAIN_H
#include <pthread.h>
#include <stdint.h>
#include "sparkmono.h"
#include "base/err.h"
#include "constrain/match.h"
#include "constrain/vocab.h"

#define SM_CON_ENDED (-5) /* the position after an eos id */
#define SM_CON_MASK_BUDGET ((size_t)256 << 20) /* bytes of cached masks a constraint keeps; past it they
                                                  are all dropped and recomputed as met again */

struct sparkmono_constraint {
    int refs;                /* references (atomic): the creator's and each request's */
    pthread_mutex_t mu;      /* serializes g and the masks */
    sm_gram *g;              /* the grammar, its configurations and their masks */
    const sm_vocab *v;       /* the vocabulary (owned by the model) */
    uint32_t *eos_mask;      /* [v->words] the eos ids alone (the mask after SM_CON_ENDED) */
    size_t nmasks;           /* masks cached in g's slots */
    char kind[16];           /* "regex", "json_schema", "json_object", "choice" */
};

/* Compile spec [len] of kind (sparkmono.h: sparkmono_constraint_create) for vocabulary v; one
 * reference.  -1 with one line in e naming the kind and the problem. */
int sm_con_create(const sm_vocab *v, const char *kind, const char *spec, size_t len, int any_whitespace,
                  sparkmono_constraint **out, sm_err *e);
void sm_con_retain(sparkmono_constraint *c);
void sm_con_release(sparkmono_constraint *c);

/* The position before any generated id. */
int sm_con_start(const sparkmono_constraint *c);
/* The mask of position pos copied to out [v->words] (the cache may drop it once the call
 * returns: another thread's request may need room): 1 when it allows an id, 0 when none (known
 * once per state, not rescanned), -1 with one line. */
int sm_con_mask(sparkmono_constraint *c, int pos, uint32_t *out, sm_err *e);
/* The position after id tok from pos; SM_GRAM_DEAD when the constraint forbids tok there, -2
 * with one line in e when the grammar fails. */
int sm_con_advance(sparkmono_constraint *c, int pos, int tok, sm_err *e);

#endif
