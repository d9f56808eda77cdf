/* match.h: running a constraint's grammar (nfa.h) over bytes, determinized lazily.
 *
 * A configuration is the set of places the pushdown NFA can be after some prefix: threads
 * (state, stack), closed under epsilon edges, calls (push the return state) and exits (pop),
 * kept only at states that read a byte (and the accepting exit of rule 0).  Configurations are
 * interned: equal sets get one id, and the transition of an id on a byte is computed once and
 * cached, so a walk over the vocabulary's trie (vocab.c) is a table lookup per trie node once
 * warm.  The grammar is pruned at creation to states from which the rule's exit is reachable,
 * so every live configuration can still be completed; a rule that can call itself without
 * reading a byte (left recursion) is refused there.  Stacks are interned too (a stack is a
 * (return state, parent stack) node), so a configuration is a sorted array of int pairs.
 * We rejected a backtracking matcher (exponential on nested alternatives) and compiling
 * everything to one DFA up front (the JSON Schema of a real API can have thousands of NFA
 * states; a generation visits a few hundred configurations).
 *
 * Not thread-safe by itself: the owner (constrain.c) serializes calls on one grammar.
 */
#ifndef SM_MATCH_H
#define SM_MATCH_H
#include <stddef.h>
#include <stdint.h>
#include "base/err.h"
#include "constrain/nfa.h"

#define SM_GRAM_MAX_CONFIGS (1 << 20) /* configurations one grammar may intern */
#define SM_GRAM_DEAD (-1)             /* the configuration of a prefix no string extends */

typedef struct sm_gram sm_gram;

/* Take ownership of n (freed here, also on failure): prune, check for left recursion, intern the
 * start configuration.  -1 with one line in e (left recursion names the rule; an empty
 * language is refused: "the constraint matches no string"). */
int sm_gram_create(sm_nfa *n, sm_gram **out, sm_err *e);
void sm_gram_free(sm_gram *g);

/* The configuration before any byte. */
int sm_gram_start(const sm_gram *g);
/* The configuration after byte b from cfg (cfg >= 0): another id, or SM_GRAM_DEAD.  Returns
 * -2 when the grammar is over its configuration limit or out of memory (sm_gram_error). */
int sm_gram_step(sm_gram *g, int cfg, uint8_t b);
/* The transition row of cfg (cfg >= 0): [256] next configurations, SM_GRAM_UNKNOWN where not
 * computed yet (sm_gram_step computes and fills it); NULL when out of memory.  The row stays
 * where it is while the grammar lives: a walk keeps it and reads a byte's entry directly. */
#define SM_GRAM_UNKNOWN (-3)
const int *sm_gram_row(sm_gram *g, int cfg);
/* cfg after the bytes s [len], stopping at SM_GRAM_DEAD (or -2). */
int sm_gram_walk(sm_gram *g, int cfg, const uint8_t *s, size_t len);
/* 1 when cfg accepts (the bytes read so far are a whole string of the language). */
int sm_gram_accepting(const sm_gram *g, int cfg);
/* 1 when cfg can read at least one more byte. */
int sm_gram_can_continue(sm_gram *g, int cfg);
/* Configurations interned so far, and the error line after a -2. */
int sm_gram_nconfigs(const sm_gram *g);
const char *sm_gram_error(const sm_gram *g);

/* The per-configuration slot a user of the grammar hangs data on (vocab.c: its token mask):
 * NULL until set; freed with free() by sm_gram_free. */
void *sm_gram_slot(const sm_gram *g, int cfg);
void sm_gram_set_slot(sm_gram *g, int cfg, void *p);
/* Free every slot (back to NULL). */
void sm_gram_clear_slots(sm_gram *g);

/* 1 when s [len] is in the language (tests, the choice compiler's checks). */
int sm_gram_matches(sm_gram *g, const uint8_t *s, size_t len);

#endif
