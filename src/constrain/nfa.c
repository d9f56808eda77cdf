/* nfa.c: the grammar automaton's storage and its Thompson fragments (nfa.h).
 *
 * States and edges live in growable arrays; a state's edges are a singly linked list (edges
 * are added while fragments are glued, never removed).  Every fragment gets fresh entry and
 * exit states glued by epsilon edges, so a fragment is never entered from the middle: the
 * classic construction, whose size is linear in the syntax.
 */
#include "constrain/nfa.h"
#include <stdlib.h>
#include <string.h>

void sm_nfa_init(sm_nfa *n) {
    memset(n, 0, sizeof *n);
}

void sm_nfa_free(sm_nfa *n) {
    free(n->first);
    free(n->rule_of);
    free(n->edges);
    free(n->rule_in);
    free(n->rule_out);
    memset(n, 0, sizeof *n);
}

int sm_nfa_ok(const sm_nfa *n, sm_err *e) {
    if (!n->bad) return 0;
    return sm_errf(e, "%s", n->err.msg);
}

int sm_nfa_state(sm_nfa *n) {
    if (n->bad) return 0;
    if (n->nstates >= SM_NFA_MAX_STATES) {
        n->bad = 1;
        sm_errf(&n->err, "the constraint is too large (over %d automaton states)", SM_NFA_MAX_STATES);
        return 0;
    }
    int c = n->cap_states;
    if (sm_grow((void **)&n->first, &c, n->nstates + 1, sizeof(int)) ||
        sm_grow((void **)&n->rule_of, &n->cap_states, n->nstates + 1, sizeof(int))) {
        n->bad = 1;
        sm_errf(&n->err, "out of memory building the constraint's automaton");
        return 0;
    }
    n->first[n->nstates] = -1;
    n->rule_of[n->nstates] = -1;
    return n->nstates++;
}

static void edge(sm_nfa *n, int from, int to, int kind, int lo, int hi, int rule) {
    if (n->bad) return;
    if (sm_grow((void **)&n->edges, &n->cap_edges, n->nedges + 1, sizeof(sm_nfa_edge))) {
        n->bad = 1;
        sm_errf(&n->err, "out of memory building the constraint's automaton");
        return;
    }
    sm_nfa_edge *d = &n->edges[n->nedges];
    d->to = to;
    d->kind = (uint8_t)kind;
    d->lo = (uint8_t)lo;
    d->hi = (uint8_t)hi;
    d->rule = rule;
    d->next = n->first[from];
    n->first[from] = n->nedges++;
}

void sm_nfa_bytes(sm_nfa *n, int from, int to, int lo, int hi) { edge(n, from, to, SM_NFA_BYTES, lo, hi, -1); }
void sm_nfa_eps(sm_nfa *n, int from, int to) { edge(n, from, to, SM_NFA_EPS, 0, 0, -1); }
void sm_nfa_call(sm_nfa *n, int from, int to, int rule) { edge(n, from, to, SM_NFA_CALL, 0, 0, rule); }

int sm_nfa_rule_new(sm_nfa *n) {
    if (n->bad) return 0;
    int c = n->cap_rules;
    if (sm_grow((void **)&n->rule_in, &c, n->nrules + 1, sizeof(int)) ||
        sm_grow((void **)&n->rule_out, &n->cap_rules, n->nrules + 1, sizeof(int))) {
        n->bad = 1;
        sm_errf(&n->err, "out of memory building the constraint's automaton");
        return 0;
    }
    n->rule_in[n->nrules] = -1;
    n->rule_out[n->nrules] = -1;
    return n->nrules++;
}

void sm_nfa_rule_set(sm_nfa *n, int r, sm_frag f) {
    if (n->bad) return;
    n->rule_in[r] = f.in;
    n->rule_out[r] = f.out;
    /* mark the states reachable from the entry without entering callees: the rule's own */
    int *stack = malloc(sizeof(int) * (size_t)n->nstates);
    if (!stack) {
        n->bad = 1;
        sm_errf(&n->err, "out of memory building the constraint's automaton");
        return;
    }
    int sp = 0;
    stack[sp++] = f.in;
    n->rule_of[f.in] = r;
    while (sp) {
        int s = stack[--sp];
        for (int k = n->first[s]; k >= 0; k = n->edges[k].next) {
            int t = n->edges[k].to;
            if (n->rule_of[t] != r) {
                n->rule_of[t] = r;
                stack[sp++] = t;
            }
        }
    }
    free(stack);
}

sm_frag sm_frag_empty(sm_nfa *n) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_eps(n, f.in, f.out);
    return f;
}

sm_frag sm_frag_none(sm_nfa *n) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    return f;
}

sm_frag sm_frag_range(sm_nfa *n, int lo, int hi) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_bytes(n, f.in, f.out, lo, hi);
    return f;
}

sm_frag sm_frag_lit(sm_nfa *n, const char *s, int len) {
    sm_frag f = sm_frag_empty(n);
    for (int i = 0; i < len; i++) f = sm_frag_cat(n, f, sm_frag_range(n, (uint8_t)s[i], (uint8_t)s[i]));
    return f;
}

sm_frag sm_frag_cat(sm_nfa *n, sm_frag a, sm_frag b) {
    sm_nfa_eps(n, a.out, b.in);
    sm_frag f = {a.in, b.out};
    return f;
}

sm_frag sm_frag_alt(sm_nfa *n, sm_frag a, sm_frag b) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_eps(n, f.in, a.in);
    sm_nfa_eps(n, f.in, b.in);
    sm_nfa_eps(n, a.out, f.out);
    sm_nfa_eps(n, b.out, f.out);
    return f;
}

sm_frag sm_frag_star(sm_nfa *n, sm_frag a) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_eps(n, f.in, a.in);
    sm_nfa_eps(n, f.in, f.out);
    sm_nfa_eps(n, a.out, a.in);
    sm_nfa_eps(n, a.out, f.out);
    return f;
}

sm_frag sm_frag_plus(sm_nfa *n, sm_frag a) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_eps(n, f.in, a.in);
    sm_nfa_eps(n, a.out, a.in);
    sm_nfa_eps(n, a.out, f.out);
    return f;
}

sm_frag sm_frag_opt(sm_nfa *n, sm_frag a) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_eps(n, f.in, a.in);
    sm_nfa_eps(n, f.in, f.out);
    sm_nfa_eps(n, a.out, f.out);
    return f;
}

sm_frag sm_frag_call(sm_nfa *n, int rule) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_call(n, f.in, f.out, rule);
    return f;
}

/* The UTF-8 bytes of code point c into b; returns the length. */
static int utf8_enc(uint32_t c, uint8_t *b) {
    if (c < 0x80) { b[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { b[0] = (uint8_t)(0xC0 | (c >> 6)); b[1] = (uint8_t)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (c >> 12));
        b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | (c >> 18));
    b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    b[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* Add to the union f the code points [lo, hi] (one encoded length, no surrogates), split until
 * every byte position of the piece ranges independently (the split of Rust's utf8-ranges). */
static void utf8_piece(sm_nfa *n, uint32_t lo, uint32_t hi, sm_frag *f, int *have) {
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_piece(n, lo, lo | m, f, have);
                utf8_piece(n, (lo | m) + 1, hi, f, have);
                return;
            }
            if ((hi & m) != m) {
                utf8_piece(n, lo, (hi & ~m) - 1, f, have);
                utf8_piece(n, hi & ~m, hi, f, have);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    int len = utf8_enc(lo, a);
    utf8_enc(hi, b);
    sm_frag p = sm_frag_range(n, a[0], b[0]);
    for (int k = 1; k < len; k++) p = sm_frag_cat(n, p, sm_frag_range(n, a[k], b[k]));
    *f = *have ? sm_frag_alt(n, *f, p) : p;
    *have = 1;
}

sm_frag sm_frag_utf8(sm_nfa *n, uint32_t lo, uint32_t hi) {
    static const uint32_t lim[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    sm_frag f = {0, 0};
    int have = 0;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    for (int k = 0; k < 4 && lo <= hi; k++) {
        uint32_t top = hi < lim[k] ? hi : lim[k];
        if (lo > top) continue;
        uint32_t a = lo, b = top;
        /* the surrogates D800..DFFF are not code points: split around them */
        if (k == 2 && a <= 0xDFFF && b >= 0xD800) {
            if (a < 0xD800) utf8_piece(n, a, 0xD7FF, &f, &have);
            if (b > 0xDFFF) utf8_piece(n, 0xE000, b, &f, &have);
        } else {
            utf8_piece(n, a, b, &f, &have);
        }
        lo = top + 1;
    }
    return have ? f : sm_frag_none(n);
}
