/* nfa.h: the automaton every output constraint compiles to (regex.c, schema.c), and the
 * Thompson fragments that build it.
 *
 * A grammar is a set of rules; each rule is a byte-level NFA with one entry and one exit state,
 * whose edges read a byte range, read nothing (epsilon) or call another rule (enter its entry,
 * come back to the edge's target when the callee reaches its exit).  Rule 0 is the whole
 * constraint: a byte string is accepted when rule 0 reads it from entry to exit.  Calls make it
 * a pushdown automaton: a JSON value nested to any depth (json_object, a recursive $ref) is one
 * rule calling itself.  A grammar without calls is a plain NFA (a regex).  match.c runs it.
 *
 * Fragments are built bottom up: each sm_frag_* returns a new fragment (entry, exit) and never
 * reuses the states of its arguments twice, so a fragment used twice must be built twice (a
 * compiler re-emits it from its own syntax tree: counted repetition, a schema used in two
 * places).  Allocation failure and the size limit set n->err once and later calls return
 * harmless fragments; the compiler checks sm_nfa_ok at the end.  We rejected building a DFA
 * per rule at compile time: subset construction can blow up (a{1000} over classes), while
 * match.c determinizes lazily only the configurations a generation and its token masks visit.
 */
#ifndef SM_NFA_H
#define SM_NFA_H
#include <stdint.h>
#include <stdlib.h>
#include "base/err.h"

#define SM_NFA_MAX_STATES (1 << 22) /* a constraint larger than this is refused */

enum { SM_NFA_BYTES = 0, SM_NFA_EPS = 1, SM_NFA_CALL = 2 };

typedef struct sm_nfa_edge {
    int to;              /* target state */
    int next;            /* next edge of the same source state, -1 = last */
    uint8_t kind;        /* SM_NFA_BYTES / _EPS / _CALL */
    uint8_t lo, hi;      /* BYTES: the byte range [lo, hi] read */
    int rule;            /* CALL: the rule entered */
} sm_nfa_edge;

typedef struct sm_nfa {
    int nstates, cap_states;
    int *first;          /* [nstates] first edge of each state, -1 = none */
    int *rule_of;        /* [nstates] the rule a state belongs to (set by sm_nfa_rule_set), -1 */
    int nedges, cap_edges;
    sm_nfa_edge *edges;  /* [nedges] */
    int nrules, cap_rules;
    int *rule_in;        /* [nrules] entry state of each rule, -1 until set */
    int *rule_out;       /* [nrules] exit state of each rule */
    int bad;             /* 1: out of memory or over SM_NFA_MAX_STATES (err says which) */
    sm_err err;
} sm_nfa;

typedef struct sm_frag {
    int in, out;         /* entry and exit state */
} sm_frag;

/* Grow the array *p of *cap elements of sz bytes to hold need (doubling); 0, or -1 out of
 * memory (*p and *cap unchanged).  The one growth rule of src/constrain/. */
static inline int sm_grow(void **p, int *cap, int need, size_t sz) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 32;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

void sm_nfa_init(sm_nfa *n);
void sm_nfa_free(sm_nfa *n);
/* 0, or -1 with the one line of the first failure copied to e. */
int sm_nfa_ok(const sm_nfa *n, sm_err *e);

/* Low level: a new state; an edge reading [lo, hi]; an epsilon edge; a call of rule r. */
int sm_nfa_state(sm_nfa *n);
void sm_nfa_bytes(sm_nfa *n, int from, int to, int lo, int hi);
void sm_nfa_eps(sm_nfa *n, int from, int to);
void sm_nfa_call(sm_nfa *n, int from, int to, int rule);

/* Rules: a new rule id (its body set later, so rules may call each other before they are
 * built); set rule r's body to fragment f (states of f are marked as r's). */
int sm_nfa_rule_new(sm_nfa *n);
void sm_nfa_rule_set(sm_nfa *n, int r, sm_frag f);

/* Fragments. */
sm_frag sm_frag_empty(sm_nfa *n);                          /* the empty string */
sm_frag sm_frag_range(sm_nfa *n, int lo, int hi);          /* one byte in [lo, hi] */
sm_frag sm_frag_lit(sm_nfa *n, const char *s, int len);    /* these bytes */
sm_frag sm_frag_cat(sm_nfa *n, sm_frag a, sm_frag b);      /* a then b */
sm_frag sm_frag_alt(sm_nfa *n, sm_frag a, sm_frag b);      /* a or b */
sm_frag sm_frag_star(sm_nfa *n, sm_frag a);                /* a* */
sm_frag sm_frag_plus(sm_nfa *n, sm_frag a);                /* a+ */
sm_frag sm_frag_opt(sm_nfa *n, sm_frag a);                 /* a? */
sm_frag sm_frag_call(sm_nfa *n, int rule);                 /* the language of rule */
sm_frag sm_frag_none(sm_nfa *n);                           /* matches nothing */
/* One UTF-8 encoded code point in [lo, hi] (0 <= lo <= hi <= 0x10FFFF, surrogates excluded):
 * the byte sequences of the range as a union of byte-range chains. */
sm_frag sm_frag_utf8(sm_nfa *n, uint32_t lo, uint32_t hi);

#endif
