/* schema_num.c: the numbers of a JSON Schema (schema.c): "integer" and "number" with minimum,
 * maximum, exclusiveMinimum and exclusiveMaximum, exactly, as an automaton over the printed
 * digits.
 *
 * Bounds become inclusive decimal strings first.  For "integer" the bound is exact (ceil or
 * floor of a real bound, +-1 for an exclusive one, in decimal so int64 ends do not overflow).
 * For "number" the printed text is read by a validator as a double (a Python float when it has
 * a '.', an exact int when not), so a bound b becomes a decimal L with fl(L) = b: rounding is
 * monotone, so d >= L implies fl(d) >= b, and for |b| < 2^53 no integer lies between L and b;
 * an exclusive bound uses the next double past b; beyond 2^53 the bound is b's exact integer.
 * The printed form is then -?(0|[1-9][0-9]*)(\.[0-9]+)? (no exponent, no "-0"): a restriction
 * of JSON's number grammar, never a relaxation.
 *
 * The automaton is a DFA built here by breadth-first search over small tuples (phase, sign,
 * nonzero seen, digits read, and for each bound how the digits so far compare with it), pruned
 * to the states that can still accept, then emitted as NFA states and byte-range edges.  Both
 * bounds advance over the same digits, so the product stays linear in the bounds' lengths.
 * We rejected the classic range-to-regex split into digit-length cases: it covers integers
 * only, and fractions with two bounds multiply its cases.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "constrain/nfa.h"

#define DEC_MAX 1200 /* digits of a decimal (bounds reach 309 integer or 324 fraction digits) */

/* A decimal: sign and magnitude, integer digits without leading zeros ("0" for none),
 * fraction digits without trailing zeros. */
typedef struct dec {
    int neg;
    char ip[DEC_MAX], fp[DEC_MAX];
} dec;

/* Parse "[-]digits[.digits][e[+-]digits]" into d (normalized); 0 or -1 when too long. */
static int dec_parse(const char *s, dec *d) {
    char dig[DEC_MAX];
    int nd = 0, point = -1, neg = 0;
    if (*s == '-') neg = 1, s++;
    else if (*s == '+') s++;
    for (; *s && *s != 'e' && *s != 'E'; s++) {
        if (*s == '.') { point = nd; continue; }
        if (nd >= DEC_MAX - 1) return -1;
        dig[nd++] = *s;
    }
    long ex = *s ? strtol(s + 1, NULL, 10) : 0;
    /* digit i has weight 10^(ipos - 1 - i): ipos digits stand before the point */
    long ipos = (point < 0 ? nd : point) + ex;
    if (ipos > DEC_MAX - 2 || nd - ipos > DEC_MAX - 2) return -1;
    int ni = 0, nf = 0;
    for (long i = 0; i < ipos; i++) {
        char c = i < nd ? dig[i] : '0';
        if (ni || c != '0') d->ip[ni++] = c;
    }
    for (long i = ipos < 0 ? ipos : nd; i < 0; i++) d->fp[nf++] = '0';
    for (long i = ipos < 0 ? 0 : ipos; i < nd; i++) d->fp[nf++] = dig[i];
    if (ni == 0) d->ip[ni++] = '0';
    while (nf > 0 && d->fp[nf - 1] == '0') nf--;
    d->ip[ni] = 0;
    d->fp[nf] = 0;
    d->neg = neg && !(ni == 1 && d->ip[0] == '0' && nf == 0);
    return 0;
}

/* The shortest decimal that reads back as x (|x| < 2^53), or x's exact integer value. */
static int dec_of_double(double x, dec *d) {
    char buf[DEC_MAX];
    if (fabs(x) >= 9007199254740992.0) {
        snprintf(buf, sizeof buf, "%.0f", x);
        return dec_parse(buf, d);
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    return dec_parse(buf, d);
}

/* The exact integer x (integral) as a decimal. */
static int dec_of_integral(double x, dec *d) {
    char buf[DEC_MAX];
    snprintf(buf, sizeof buf, "%.0f", x);
    return dec_parse(buf, d);
}

/* Magnitude + 1 or - 1 (d an integer, |d| >= 1 for the - 1). */
static void mag_inc(dec *d) {
    int n = (int)strlen(d->ip), i = n - 1;
    while (i >= 0 && d->ip[i] == '9') d->ip[i--] = '0';
    if (i >= 0) { d->ip[i]++; return; }
    memmove(d->ip + 1, d->ip, (size_t)n + 1);
    d->ip[0] = '1';
}
static void mag_dec(dec *d) {
    int n = (int)strlen(d->ip), i = n - 1;
    while (i >= 0 && d->ip[i] == '0') d->ip[i--] = '9';
    d->ip[i]--;
    if (d->ip[0] == '0' && n > 1) memmove(d->ip, d->ip + 1, (size_t)n);
}
/* d (an integer) plus delta (+1 or -1). */
static void dec_add1(dec *d, int delta) {
    int zero = !strcmp(d->ip, "0");
    if (zero) { strcpy(d->ip, "1"); d->neg = delta < 0; return; }
    if ((delta > 0) == !d->neg) mag_inc(d);
    else mag_dec(d);
    if (!strcmp(d->ip, "0")) d->neg = 0;
}

/* Compare the magnitudes, then the signed values: -1, 0, 1. */
static int mag_cmp(const dec *a, const dec *b) {
    size_t la = strlen(a->ip), lb = strlen(b->ip);
    if (la != lb) return la < lb ? -1 : 1;
    int c = strcmp(a->ip, b->ip);
    if (!c) c = strcmp(a->fp, b->fp);
    return (c > 0) - (c < 0);
}
static int dec_cmp(const dec *a, const dec *b) {
    if (a->neg != b->neg) return a->neg ? -1 : 1;
    int m = mag_cmp(a, b);
    return a->neg ? -m : m;
}

/* ---- bounds ---------------------------------------------------------------------------------- */

/* The inclusive integer bound of keyword value v: lower (1) or upper (0), exclusive or not. */
static int int_bound(const json_t *v, int lower, int excl, dec *d) {
    if (json_is_integer(v)) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        if (dec_parse(buf, d)) return -1;
        if (excl) dec_add1(d, lower ? 1 : -1);
        return 0;
    }
    /* a real: the first integer at or past it (past it, when exclusive) */
    double x = json_real_value(v);
    double r = lower ? (excl ? floor(x) : ceil(x)) : (excl ? ceil(x) : floor(x));
    if (dec_of_integral(r, d)) return -1;
    if (excl) dec_add1(d, lower ? 1 : -1);
    return 0;
}

/* The inclusive bound of a "number" for keyword value v; 1 when no double lies past it. */
static int num_bound(const json_t *v, int lower, int excl, dec *d) {
    double x;
    if (json_is_integer(v)) {
        long long k = (long long)json_integer_value(v);
        x = (double)k;
        if (x >= 9223372036854775808.0 || (long long)x != k) return 2; /* not a double */
    } else {
        x = json_real_value(v);
    }
    if (excl) x = nextafter(x, lower ? INFINITY : -INFINITY);
    if (isinf(x)) return 1;
    return dec_of_double(x, d);
}

/* ---- the comparison automaton ---------------------------------------------------------------- */

enum { P_START, P_SIGN, P_ZERO, P_INT, P_DOT, P_FRAC, NPHASE };
enum { LT = 0, EQ = 1, GT = 2 };

typedef struct bnd {
    int on;              /* the bound exists */
    int lower;           /* 1: x >= it, 0: x <= it */
    const dec *d;
    int li, lf;          /* its digit counts */
} bnd;

typedef struct st {
    int phase, neg, nz, pos, c[2];
} st;

typedef struct dfa {
    bnd b[2];
    int integer;         /* no fraction */
    int K, J, P;         /* caps: integer digits, fraction digits, their max */
} dfa;

static int st_id(const dfa *a, st s) {
    return ((((s.phase * 2 + s.neg) * 2 + s.nz) * (a->P + 1) + s.pos) * 3 + s.c[0]) * 3 + s.c[1];
}
static st st_of(const dfa *a, int id) {
    st s;
    s.c[1] = id % 3; id /= 3;
    s.c[0] = id % 3; id /= 3;
    s.pos = id % (a->P + 1); id /= a->P + 1;
    s.nz = id % 2; id /= 2;
    s.neg = id % 2; id /= 2;
    s.phase = id;
    return s;
}

static int cmp3(int x, int y) { return x < y ? LT : x > y ? GT : EQ; }

/* The magnitude comparison of bound k once the integer part (pos digits) is complete. */
static int int_resolve(const bnd *b, const st *s, int k) {
    if (s->pos < b->li) return LT;
    if (s->pos > b->li) return GT;
    return s->c[k];
}

/* The next state after byte ch, or -1. */
static int step(const dfa *a, st s, int ch) {
    int digit = ch >= '0' && ch <= '9', dv = ch - '0';
    switch (s.phase) {
    case P_START:
        if (ch == '-') { s.phase = P_SIGN; s.neg = 1; return st_id(a, s); }
        /* fall through */
    case P_SIGN:
        if (!digit) return -1;
        s.phase = dv ? P_INT : P_ZERO;
        break;
    case P_INT:
        if (digit) break;
        /* fall through */
    case P_ZERO:
        if (ch != '.' || a->integer) return -1;
        for (int k = 0; k < 2; k++)
            if (a->b[k].on) s.c[k] = int_resolve(&a->b[k], &s, k);
        s.phase = P_DOT;
        s.pos = 0;
        return st_id(a, s);
    case P_DOT:
    case P_FRAC:
        if (!digit) return -1;
        for (int k = 0; k < 2; k++) {
            const bnd *b = &a->b[k];
            if (b->on && s.c[k] == EQ) s.c[k] = cmp3(dv, s.pos < b->lf ? b->d->fp[s.pos] - '0' : 0);
        }
        s.phase = P_FRAC;
        if (dv) s.nz = 1;
        if (s.pos < a->J) s.pos++;
        return st_id(a, s);
    default:
        return -1;
    }
    /* an integer digit */
    for (int k = 0; k < 2; k++) {
        const bnd *b = &a->b[k];
        if (b->on && s.pos < b->li && s.c[k] == EQ) s.c[k] = cmp3(dv, b->d->ip[s.pos] - '0');
    }
    if (dv) s.nz = 1;
    if (s.pos < a->K) s.pos++;
    return st_id(a, s);
}

/* 1 when the string read so far, ending here, is a number within the bounds. */
static int accepts(const dfa *a, st s) {
    if (s.phase != P_ZERO && s.phase != P_INT && s.phase != P_FRAC) return 0;
    if (s.neg && !s.nz) return 0; /* no "-0" */
    for (int k = 0; k < 2; k++) {
        const bnd *b = &a->b[k];
        if (!b->on) continue;
        int m = s.phase == P_FRAC ? s.c[k] : int_resolve(b, &s, k);
        /* equal so far, but the bound has fraction digits left (never all zeros): below it */
        if (m == EQ && (s.phase == P_FRAC ? s.pos < b->lf : b->lf > 0)) m = LT;
        int v = !s.neg && !b->d->neg ? m : s.neg && b->d->neg ? 2 - m : s.neg ? LT : GT;
        if (b->lower ? v == LT : v == GT) return 0;
    }
    return 1;
}

/* The alphabet: '-', '.', '0'..'9'. */
static const char ALPHA[] = "-.0123456789";

/* Build the pruned DFA into n as a fragment; 1 when it accepts nothing, -1 out of memory. */
static int emit_dfa(sm_nfa *n, const dfa *a, sm_frag *out) {
    int total = NPHASE * 4 * (a->P + 1) * 9, na = (int)sizeof ALPHA - 1, rc = -1;
    int *seen = malloc(sizeof(int) * (size_t)total), *order = malloc(sizeof(int) * (size_t)total);
    int *next = NULL, *live = NULL, *nstate = NULL;
    if (!seen || !order) goto done;
    for (int i = 0; i < total; i++) seen[i] = -1;
    /* reachable states (breadth first) and their transitions */
    st s0 = {P_START, 0, 0, 0, {EQ, EQ}};
    int nq = 0, start = st_id(a, s0);
    seen[start] = nq;
    order[nq++] = start;
    for (int q = 0; q < nq; q++) {
        int *t = realloc(next, sizeof(int) * (size_t)(q + 1) * (size_t)na);
        if (!t) goto done;
        next = t;
        for (int c = 0; c < na; c++) {
            int to = step(a, st_of(a, order[q]), ALPHA[c]);
            if (to >= 0 && seen[to] < 0) { seen[to] = nq; order[nq++] = to; }
            next[q * na + c] = to < 0 ? -1 : seen[to];
        }
    }
    /* live: can reach an accepting state (fixed point; the DFA is small) */
    live = calloc((size_t)nq, sizeof(int));
    nstate = malloc(sizeof(int) * (size_t)nq);
    if (!live || !nstate) goto done;
    for (int q = 0; q < nq; q++) live[q] = accepts(a, st_of(a, order[q]));
    for (int changed = 1; changed;) {
        changed = 0;
        for (int q = nq - 1; q >= 0; q--)
            for (int c = 0; c < na && !live[q]; c++)
                if (next[q * na + c] >= 0 && live[next[q * na + c]]) live[q] = changed = 1;
    }
    if (!live[0]) { rc = 1; goto done; }
    /* emit: one NFA state per live state, digit runs with one target as one range */
    out->in = sm_nfa_state(n);
    out->out = sm_nfa_state(n);
    for (int q = 0; q < nq; q++) nstate[q] = live[q] ? (q ? sm_nfa_state(n) : out->in) : -1;
    for (int q = 0; q < nq; q++) {
        if (!live[q]) continue;
        if (accepts(a, st_of(a, order[q]))) sm_nfa_eps(n, nstate[q], out->out);
        for (int c = 0; c < na;) {
            int to = next[q * na + c], e = c + 1;
            if (c >= 2)
                while (e < na && next[q * na + e] == to) e++;
            if (to >= 0 && live[to]) sm_nfa_bytes(n, nstate[q], nstate[to], ALPHA[c], ALPHA[e - 1]);
            c = e;
        }
    }
    rc = 0;
done:
    free(seen); free(order); free(next); free(live); free(nstate);
    return rc;
}

/* The number grammar of JSON (no bounds): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static sm_frag plain_number(sm_nfa *n, int integer) {
    sm_frag f = sm_frag_opt(n, sm_frag_lit(n, "-", 1));
    sm_frag ip = sm_frag_alt(n, sm_frag_lit(n, "0", 1),
                             sm_frag_cat(n, sm_frag_range(n, '1', '9'), sm_frag_star(n, sm_frag_range(n, '0', '9'))));
    f = sm_frag_cat(n, f, ip);
    if (integer) return f;
    sm_frag frac = sm_frag_cat(n, sm_frag_lit(n, ".", 1), sm_frag_plus(n, sm_frag_range(n, '0', '9')));
    sm_frag ex = sm_frag_cat(n, sm_frag_alt(n, sm_frag_lit(n, "e", 1), sm_frag_lit(n, "E", 1)),
                             sm_frag_opt(n, sm_frag_alt(n, sm_frag_lit(n, "+", 1), sm_frag_lit(n, "-", 1))));
    ex = sm_frag_cat(n, ex, sm_frag_plus(n, sm_frag_range(n, '0', '9')));
    return sm_frag_cat(n, sm_frag_cat(n, f, sm_frag_opt(n, frac)), sm_frag_opt(n, ex));
}

/* Tighten the bound (have, cur) with candidate d: the larger of two lower bounds, the smaller of
 * two upper ones. */
static void tighten(int lower, int *have, dec *cur, const dec *d) {
    if (!*have || (lower ? dec_cmp(d, cur) > 0 : dec_cmp(d, cur) < 0)) *cur = *d;
    *have = 1;
}

/* Numbers (integer = 1: integers) within the bound keywords of schema s (their values already
 * checked to be numbers).  0 with the fragment, 1 when no number is within them, 2 when a
 * bound of a "number" is an integer no double holds, -1 out of memory or too long. */
int sm_schema_number(sm_nfa *n, const json_t *s, int integer, sm_frag *out, const char **which);
int sm_schema_number(sm_nfa *n, const json_t *s, int integer, sm_frag *out, const char **which) {
    static const char *kw[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    dec *d = malloc(sizeof(dec) * 3); /* lower, upper, scratch */
    if (!d) return -1;
    int have[2] = {0, 0}, rc = 0;
    for (int k = 0; k < 4 && !rc; k++) {
        const json_t *v = json_object_get(s, kw[k]);
        if (!v) continue;
        int lower = k < 2, excl = k & 1;
        *which = kw[k];
        rc = integer ? int_bound(v, lower, excl, &d[2]) : num_bound(v, lower, excl, &d[2]);
        if (!rc) tighten(lower, &have[lower ? 0 : 1], &d[lower ? 0 : 1], &d[2]);
    }
    if (rc) { free(d); return rc; }
    if (!have[0] && !have[1]) { *out = plain_number(n, integer); free(d); return 0; }
    if (have[0] && have[1] && dec_cmp(&d[0], &d[1]) > 0) { free(d); return 1; }
    dfa a;
    memset(&a, 0, sizeof a);
    a.integer = integer;
    for (int k = 0; k < 2; k++) {
        a.b[k].on = have[k];
        a.b[k].lower = k == 0;
        a.b[k].d = &d[k];
        a.b[k].li = have[k] ? (int)strlen(d[k].ip) : 0;
        a.b[k].lf = have[k] ? (int)strlen(d[k].fp) : 0;
        if (a.b[k].li + 1 > a.K) a.K = a.b[k].li + 1;
        if (a.b[k].lf > a.J) a.J = a.b[k].lf;
    }
    a.P = a.K > a.J ? a.K : a.J;
    rc = emit_dfa(n, &a, out);
    free(d);
    return rc;
}
