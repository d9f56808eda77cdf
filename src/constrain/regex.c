/* regex.c: a regex (regex.h) parsed into a small syntax tree, then emitted as Thompson
 * fragments (nfa.h).
 *
 * The parser is recursive descent over the pattern's bytes (UTF-8 decoded strictly) and builds
 * the tree in one growable array of nodes: a set of code points (a literal, a class, `.`, a
 * shorthand), a concatenation, an alternation and a repetition {min, max}.  A set is
 * normalized when parsed (sorted, merged, negated over the code points or, for a negated class
 * holding a shorthand, over ASCII (regex.h), surrogates cut out) and emitted as one fragment:
 * its ASCII ranges as byte edges, the rest by sm_frag_utf8.
 * Before anything is emitted the tree's automaton size is computed (a repetition multiplies
 * its operand's), and a pattern over the NFA's state limit is refused naming the construct
 * that crosses it, so ((a{1000}){1000}){1000} costs nothing.  Nesting is capped (MAX_DEPTH),
 * which bounds the recursion of the parser and of both tree walks.  All state lives in a
 * parser on the caller's stack: compiles may run on any number of threads.
 * We rejected emitting fragments while parsing (one pass, no tree): {m,n} needs its operand up
 * to n times and a fragment cannot be used twice (nfa.h), so the operand would be re-parsed
 * per copy; the tree is also where the size check is done before n is touched.
 */
#include "constrain/regex.h"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 200       /* groups nested deeper are refused */
#define MAX_CP 0x10FFFFu
#define NONE (-2)           /* an atom that reads nothing (^ at the start, $ at the end) */

enum { K_SET, K_CAT, K_ALT, K_REP };

typedef struct range {
    uint32_t lo, hi;
} range;

typedef struct node {
    int kind;       /* K_* */
    int kid, next;  /* first child, next sibling; -1 none */
    int a, b;       /* K_SET: first range, count; K_REP: min, max (-1 unbounded) */
    size_t off;     /* where the construct starts in the pattern */
} node;

typedef struct parser {
    const uint8_t *s;
    size_t len, pos;
    node *nd;
    int nn, capn;
    range *rg;      /* the ranges of every set */
    int nrg, caprg;
    int failed;
    sm_err *e;
} parser;

/* The shorthands \d \w \s within ASCII, where their meanings (PCRE2's ASCII one, Python's
 * and ECMA's Unicode ones) agree but for \x1C-\x1F, white space to Python only: R_S leaves them
 * out, R_S_ALL has them.  \D \W \S are their complements within ASCII (regex.h). */
static const range R_D[] = {{'0', '9'}};
static const range R_W[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const range R_S[] = {{'\t', '\r'}, {' ', ' '}};
static const range R_S_ALL[] = {{'\t', '\r'}, {0x1C, ' '}};
/* `.`: any code point but \n \r U+2028 U+2029 (ECMA's; Python and PCRE2 exclude only \n) */
static const range R_DOT[] = {{0, '\n' - 1}, {0x0B, 0x0C}, {0x0E, 0x2027}, {0x202A, MAX_CP}};

/* ---- errors and storage ---- */

/* Refuse at offset off with one line "regex: <what> at offset <off>" (the first failure wins). */
__attribute__((format(printf, 3, 4))) static int fail(parser *p, size_t off, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!p->failed) sm_errf(p->e, "regex: %s at offset %zu", what, off);
    p->failed = 1;
    return -1;
}

/* A new node of kind at off: its index, or -1. */
static int node_new(parser *p, int kind, size_t off) {
    if (sm_grow((void **)&p->nd, &p->capn, p->nn + 1, sizeof(node))) return fail(p, off, "out of memory");
    node *d = &p->nd[p->nn];
    d->kind = kind;
    d->kid = d->next = -1;
    d->a = d->b = 0;
    d->off = off;
    return p->nn++;
}

/* Append the range [lo, hi] minus the surrogates D800..DFFF; 0 or -1. */
static int rg_push(parser *p, uint32_t lo, uint32_t hi) {
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800 && rg_push(p, lo, 0xD7FF)) return -1;
        return hi > 0xDFFF ? rg_push(p, 0xE000, hi) : 0;
    }
    if (sm_grow((void **)&p->rg, &p->caprg, p->nrg + 1, sizeof(range))) return fail(p, p->pos, "out of memory");
    p->rg[p->nrg].lo = lo;
    p->rg[p->nrg].hi = hi;
    p->nrg++;
    return 0;
}

/* ---- sets ---- */

static int range_cmp(const void *x, const void *y) {
    const range *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Normalize the ranges from s0 on: sorted, merged, complemented within [0, top] when neg;
 * 0 or -1. */
static int set_finish(parser *p, int s0, int neg, uint32_t top) {
    int k = p->nrg - s0, m = 0;
    range *r = p->rg + s0;
    if (k > 1) qsort(r, (size_t)k, sizeof *r, range_cmp);
    for (int i = 0; i < k; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    p->nrg = s0 + m;
    if (!neg) return 0;
    /* the complement has at most m + 1 ranges: build it from a copy */
    range *t = malloc(sizeof(range) * (size_t)(m + 1));
    if (!t) return fail(p, p->pos, "out of memory");
    if (m) memcpy(t, r, sizeof(range) * (size_t)m);
    p->nrg = s0;
    uint32_t lo = 0;
    int rc = 0;
    for (int i = 0; i < m && !rc && t[i].lo <= top; i++) {
        if (t[i].lo > lo) rc = rg_push(p, lo, t[i].lo - 1);
        lo = t[i].hi + 1;
    }
    if (!rc && lo <= top) rc = rg_push(p, lo, top);
    free(t);
    return rc;
}

/* Append the shorthand letter (d D w W s S) to the ranges: its table, or its complement within
 * ASCII.  What a set holds must hold under every meaning, so a plain set gets the smallest
 * reading (\s without \x1C-\x1F, \S without them either) and a negated class, whose members
 * are what it excludes, the largest (\s and \S both with them). */
static int push_shorthand(parser *p, int letter, int in_neg) {
    const range *t = R_D;
    int k = 1;
    if (letter == 'w' || letter == 'W') t = R_W, k = 4;
    if (letter == 's') t = in_neg ? R_S_ALL : R_S, k = 2;
    if (letter == 'S') t = in_neg ? R_S : R_S_ALL, k = 2;
    if (letter >= 'a') {
        for (int i = 0; i < k; i++)
            if (rg_push(p, t[i].lo, t[i].hi)) return -1;
        return 0;
    }
    uint32_t lo = 0;
    for (int i = 0; i < k; i++) {
        if (t[i].lo > lo && rg_push(p, lo, t[i].lo - 1)) return -1;
        lo = t[i].hi + 1;
    }
    return lo <= 0x7F ? rg_push(p, lo, 0x7F) : 0;
}

/* A set node over the ranges from s0 on (normalized here, complemented within [0, top] when
 * neg), at off: its index, or -1. */
static int set_node(parser *p, int s0, int neg, uint32_t top, size_t off) {
    if (set_finish(p, s0, neg, top)) return -1;
    int i = node_new(p, K_SET, off);
    if (i < 0) return -1;
    p->nd[i].a = s0;
    p->nd[i].b = p->nrg - s0;
    return i;
}

/* A set node of one code point (0) or one shorthand (a letter), at off. */
static int atom_node(parser *p, int kind, uint32_t cp, size_t off) {
    int s0 = p->nrg;
    if (kind ? push_shorthand(p, kind, 0) : rg_push(p, cp, cp)) return -1;
    return set_node(p, s0, 0, MAX_CP, off);
}

/* ---- code points and escapes ---- */

/* The code point at s[pos] (strict UTF-8: no overlong forms, no surrogates) into *cp: its
 * length, or 0 when the bytes there are not UTF-8. */
static int utf8_dec(const uint8_t *s, size_t len, size_t pos, uint32_t *cp) {
    uint8_t c = s[pos];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) n = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (len - pos < (size_t)n) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[pos + i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[pos + i] & 0x3F);
    }
    if (v < min || v > MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* The literal code point at p->pos into *cp, consumed; 0 or -1 (invalid UTF-8). */
static int read_cp(parser *p, uint32_t *cp) {
    int n = utf8_dec(p->s, p->len, p->pos, cp);
    if (!n) return fail(p, p->pos, "invalid UTF-8 in the pattern");
    p->pos += (size_t)n;
    return 0;
}

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Exactly n hex digits at p->pos into *v, consumed; 0, or -1 (not there, nothing consumed). */
static int hex_fixed(parser *p, int n, uint32_t *v) {
    if (p->len - p->pos < (size_t)n) return -1;
    uint32_t x = 0;
    for (int i = 0; i < n; i++) {
        int h = hexval(p->s[p->pos + (size_t)i]);
        if (h < 0) return -1;
        x = x << 4 | (uint32_t)h;
    }
    p->pos += (size_t)n;
    *v = x;
    return 0;
}

/* {H..} at p->pos (the '{'): hex digits naming a code point, consumed; 0 or -1
 * (refused at the escape's offset at, letter x or u). */
static int hex_brace(parser *p, size_t at, int letter, uint32_t *cp) {
    size_t k = p->pos + 1;
    uint32_t v = 0;
    int n = 0;
    for (; k < p->len && hexval(p->s[k]) >= 0; k++, n++) {
        v = v << 4 | (uint32_t)hexval(p->s[k]);
        if (v > MAX_CP) v = MAX_CP + 1; /* saturated: leading zeros stay harmless */
    }
    if (n == 0 || k >= p->len || p->s[k] != '}')
        return fail(p, at, "bad escape \\%c{...} (expected hex digits and '}')", letter);
    if (v > MAX_CP) return fail(p, at, "code point \\%c{...} above U+10FFFF", letter);
    if (v >= 0xD800 && v <= 0xDFFF) return fail(p, at, "surrogate \\%c{%X} is not a code point", letter, v);
    p->pos = k + 1;
    *cp = v;
    return 0;
}

/* \x after the letter: \xHH or \x{H..}; 0 or -1. */
static int esc_x(parser *p, size_t at, uint32_t *cp) {
    if (p->pos < p->len && p->s[p->pos] == '{') return hex_brace(p, at, 'x', cp);
    if (hex_fixed(p, 2, cp)) return fail(p, at, "bad escape \\x (expected two hex digits or {...})");
    return 0;
}

/* \u after the letter: \uHHHH (a surrogate pair \uD83D\uDE00 is one code point) or \u{H..}. */
static int esc_u(parser *p, size_t at, uint32_t *cp) {
    if (p->pos < p->len && p->s[p->pos] == '{') return hex_brace(p, at, 'u', cp);
    uint32_t v, w;
    if (hex_fixed(p, 4, &v)) return fail(p, at, "bad escape \\u (expected four hex digits or {...})");
    if (v >= 0xD800 && v <= 0xDBFF && p->len - p->pos >= 6 && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
        size_t keep = p->pos;
        p->pos += 2;
        if (!hex_fixed(p, 4, &w) && w >= 0xDC00 && w <= 0xDFFF) {
            *cp = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
            return 0;
        }
        p->pos = keep;
    }
    if (v >= 0xD800 && v <= 0xDFFF) return fail(p, at, "lone surrogate \\u%04X is not a code point", v);
    *cp = v;
    return 0;
}

/* Escapes that are refused: the one line, or NULL when letter c is not one of them. */
static const char *esc_refused(uint8_t c, int in_class) {
    switch (c) {
    case 'b': return in_class ? NULL : "word boundary \\b is not supported";
    case 'B': return "word boundary \\B is not supported";
    case 'p': return "Unicode property class \\p is not supported";
    case 'P': return "Unicode property class \\P is not supported";
    case 'k': return "backreference \\k is not supported";
    case 'g': return "backreference \\g is not supported";
    case 'A': return "anchor \\A is not supported";
    case 'z': return "anchor \\z is not supported";
    case 'Z': return "anchor \\Z is not supported";
    case 'G': return "anchor \\G is not supported";
    default: return NULL;
    }
}

/* The escape at p->pos (the backslash), consumed: 0 with a code point in *cp, a shorthand's
 * letter (d D w W s S), or -1.  In a class \b is the backspace (as in PCRE2, ECMA, Python). */
static int parse_escape(parser *p, int in_class, uint32_t *cp) {
    size_t at = p->pos;
    if (p->len - at < 2) return fail(p, at, "trailing backslash");
    uint8_t c = p->s[at + 1];
    const char *why = esc_refused(c, in_class);
    if (why) return fail(p, at, "%s", why);
    p->pos = at + 2;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'b': *cp = '\b'; return 0;
    case 'x': return esc_x(p, at, cp);
    case 'u': return esc_u(p, at, cp);
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': return c;
    case '0':
        if (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
            return fail(p, at, "octal escape \\0%c is not supported", p->s[p->pos]);
        *cp = 0;
        return 0;
    default: break;
    }
    if (c >= '1' && c <= '9')
        return fail(p, at, in_class ? "octal escape \\%c is not supported" : "backreference \\%c is not supported", c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return fail(p, at, "bad escape \\%c", c);
    if (c < 0x80) {
        *cp = c; /* escaped punctuation (\/ \. \\ ...) or another ASCII character */
        return 0;
    }
    p->pos = at + 1; /* an escaped non-ASCII character is itself */
    return read_cp(p, cp);
}

/* ---- classes ---- */

/* One member of a class at p->pos, consumed: 0 with a code point in *cp, a shorthand's
 * letter, or -1. */
static int class_atom(parser *p, uint32_t *cp) {
    uint8_t c = p->s[p->pos];
    if (c == '\\') return parse_escape(p, 1, cp);
    if (c == '[' && p->len - p->pos >= 2) {
        uint8_t d = p->s[p->pos + 1];
        if (d == ':' || d == '.' || d == '=') return fail(p, p->pos, "POSIX class syntax [%c is not supported", d);
    }
    return read_cp(p, cp);
}

/* One item of a class at p->pos (a code point, a range lo-hi or a shorthand), its ranges
 * appended (in_neg: the class is negated); a shorthand's letter, 0, or -1. */
static int class_item(parser *p, int in_neg) {
    size_t at = p->pos;
    uint32_t lo, hi;
    int k = class_atom(p, &lo);
    if (k < 0) return -1;
    int dash = p->len - p->pos >= 2 && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']';
    if (k > 0) {
        if (dash) return fail(p, at, "class range from the shorthand \\%c", k);
        return push_shorthand(p, k, in_neg) ? -1 : k;
    }
    if (!dash) return rg_push(p, lo, lo);
    p->pos++;
    size_t at2 = p->pos;
    k = class_atom(p, &hi);
    if (k < 0) return -1;
    if (k > 0) return fail(p, at2, "class range to the shorthand \\%c", k);
    if (hi < lo) return fail(p, at, "class range out of order");
    return rg_push(p, lo, hi);
}

/* The bit of a shorthand letter: a pair of bits (x, X) per shorthand. */
static int shorthand_bit(int k) {
    const char *l = k > 0 ? strchr("dDwWsS", k) : NULL;
    return l ? 1 << (int)(l - "dDwWsS") : 0;
}

/* The class at p->pos (the '['), consumed: its set node, or -1.  A ']' first is a member.  A
 * negated class holding a shorthand is complemented within ASCII (regex.h); a class holding a
 * shorthand and its complement ([\s\S]: every character under either meaning) is every code
 * point, or none when negated. */
static int parse_class(parser *p) {
    size_t at = p->pos;
    int neg = 0, s0 = p->nrg, shorthand = 0;
    p->pos++;
    if (p->pos < p->len && p->s[p->pos] == '^') neg = 1, p->pos++;
    for (int first = 1;; first = 0) {
        if (p->pos >= p->len) return fail(p, at, "unterminated class");
        if (p->s[p->pos] == ']' && !first) break;
        int k = class_item(p, neg);
        if (k < 0) return -1;
        shorthand |= shorthand_bit(k);
    }
    p->pos++;
    const int full = (shorthand & 3) == 3 || (shorthand & 12) == 12 || (shorthand & 48) == 48;
    if (full) {
        p->nrg = s0;
        if (rg_push(p, 0, MAX_CP)) return -1;
        return set_node(p, s0, neg, MAX_CP, at);
    }
    return set_node(p, s0, neg, shorthand ? 0x7F : MAX_CP, at);
}

/* ---- quantifiers ---- */

/* Digits at *k into *v (saturated at SM_REGEX_MAX_REPEAT + 1); the count of digits. */
static int digits(const parser *p, size_t *k, long *v) {
    int n = 0;
    *v = 0;
    for (; *k < p->len && p->s[*k] >= '0' && p->s[*k] <= '9'; (*k)++, n++) {
        *v = *v * 10 + (p->s[*k] - '0');
        if (*v > SM_REGEX_MAX_REPEAT) *v = SM_REGEX_MAX_REPEAT + 1;
    }
    return n;
}

/* The brace quantifier syntax at pos ({m} {m,} {m,n} {,n}): 1 with its bounds (*m or *n -1
 * when absent) and *end after the '}', or 0 (then '{' is a literal, as in PCRE2). */
static int brace_at(const parser *p, size_t pos, long *m, long *n, size_t *end) {
    if (pos >= p->len || p->s[pos] != '{') return 0;
    size_t k = pos + 1;
    int dm = digits(p, &k, m), dn = 0;
    *n = *m;
    if (k < p->len && p->s[k] == ',') {
        k++;
        dn = digits(p, &k, n);
        if (!dn) *n = -1;
        if (!dm && !dn) return 0;
    } else if (!dm) {
        return 0;
    }
    if (k >= p->len || p->s[k] != '}') return 0;
    if (!dm) *m = -1;
    *end = k + 1;
    return 1;
}

/* 1 when a quantifier starts at p->pos. */
static int quant_starts(const parser *p) {
    long m, n;
    size_t end;
    if (p->pos >= p->len) return 0;
    uint8_t c = p->s[p->pos];
    return c == '*' || c == '+' || c == '?' || brace_at(p, p->pos, &m, &n, &end);
}

/* The quantifier at p->pos, consumed: 1 with its bounds (*hi -1: unbounded), 0 when there is
 * none, -1 refused. */
static int read_quant(parser *p, int *lo, int *hi) {
    size_t at = p->pos, end;
    long m, n;
    if (!quant_starts(p)) return 0;
    uint8_t c = p->s[at];
    if (c != '{') {
        *lo = c == '+';
        *hi = c == '?' ? 1 : -1;
        p->pos++;
        return 1;
    }
    brace_at(p, at, &m, &n, &end);
    if (m < 0) return fail(p, at, "{,n} is read as {0,n} by Python but literally by PCRE2 before 10.43: write {0,n}");
    if (m > SM_REGEX_MAX_REPEAT || n > SM_REGEX_MAX_REPEAT)
        return fail(p, at, "repetition count above %d", SM_REGEX_MAX_REPEAT);
    if (n >= 0 && m > n) return fail(p, at, "repetition {%ld,%ld} with min > max", m, n);
    *lo = (int)m;
    *hi = (int)n;
    p->pos = end;
    return 1;
}

/* The quantifier after atom a, if any: a repetition node over a, or a itself; -1 refused.
 * The lazy suffix (?) is read and dropped (a fullmatch's language is the same); a possessive
 * one (+) is refused: a*+a matches nothing, and reading it as greedy would relax the regex. */
static int parse_quant(parser *p, int a) {
    size_t at = p->pos;
    int lo = 0, hi = 0;
    int q = read_quant(p, &lo, &hi);
    if (q <= 0) return q ? -1 : a;
    if (p->pos < p->len && p->s[p->pos] == '+') return fail(p, p->pos, "possessive quantifier is not supported");
    if (p->pos < p->len && p->s[p->pos] == '?') p->pos++;
    if (quant_starts(p)) return fail(p, p->pos, "nothing to repeat (a quantifier follows a quantifier)");
    int r = node_new(p, K_REP, at);
    if (r < 0) return -1;
    p->nd[r].kid = a;
    p->nd[r].a = lo;
    p->nd[r].b = hi;
    return r;
}

/* ---- groups, atoms, sequences ---- */

static int parse_alt(parser *p, int depth);

static int is_alpha(uint8_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* A group name at p->pos ([A-Za-z_][A-Za-z0-9_]*) then the byte close, consumed; 0 or -1. */
static int group_name(parser *p, size_t at, uint8_t close) {
    size_t k = p->pos;
    for (; k < p->len; k++) {
        uint8_t c = p->s[k];
        int ok = c == '_' || is_alpha(c) || (k > p->pos && c >= '0' && c <= '9');
        if (!ok) break;
    }
    if (k == p->pos || k >= p->len || p->s[k] != close) return fail(p, at, "bad group name");
    p->pos = k + 1;
    return 0;
}

/* Why the (? group at at (p->pos after "(?") is refused, or NULL when it is one we read. */
static const char *group_refused(const parser *p) {
    uint8_t c = p->pos < p->len ? p->s[p->pos] : 0;
    uint8_t d = p->len - p->pos >= 2 ? p->s[p->pos + 1] : 0;
    if (c == ':' || c == '\'' || (c == 'P' && d == '<') || (c == '<' && d != '=' && d != '!')) return NULL;
    if (c == '=' || c == '!') return "lookahead is not supported";
    if (c == '<') return "lookbehind is not supported";
    if (c == '>') return "atomic group (?> is not supported";
    if (c == 'P' && d == '=') return "backreference (?P= is not supported";
    if (c == '(') return "conditional group (?( is not supported";
    if (c == '#') return "comment group (?# is not supported";
    if (c == '|') return "branch reset group (?| is not supported";
    if (c == 'R' || c == '&' || c == '+' || (c == 'P' && d == '>') || (c >= '0' && c <= '9')) return "recursion is not supported";
    return "this group syntax is not supported";
}

/* The "(?" prefix of a group (p->pos after it), consumed: 0 for (?: and named groups, -1. */
static int group_prefix(parser *p, size_t at) {
    uint8_t c = p->pos < p->len ? p->s[p->pos] : 0;
    if ((is_alpha(c) && c != 'P' && c != 'R') || c == '-' || c == '^') {
        size_t k = p->pos;
        while (k < p->len && k - p->pos < 16 && (is_alpha(p->s[k]) || p->s[k] == '-' || p->s[k] == '^')) k++;
        return fail(p, at, "inline flags (?%.*s) are not supported", (int)(k - p->pos), (const char *)p->s + p->pos);
    }
    const char *why = group_refused(p);
    if (why) return fail(p, at, "%s", why);
    if (c == ':') {
        p->pos++;
        return 0;
    }
    if (c == '\'') {
        p->pos++;
        return group_name(p, at, '\'');
    }
    p->pos += c == 'P' ? 2 : 1;
    return group_name(p, at, '>');
}

/* The group at p->pos (the '('), consumed: its body's node, or -1. */
static int parse_group(parser *p, int depth) {
    size_t at = p->pos;
    if (depth >= MAX_DEPTH) return fail(p, at, "groups nested deeper than %d", MAX_DEPTH);
    p->pos++;
    if (p->pos < p->len && p->s[p->pos] == '?') {
        p->pos++;
        if (group_prefix(p, at)) return -1;
    }
    int body = parse_alt(p, depth + 1);
    if (body < 0) return -1;
    if (p->pos >= p->len || p->s[p->pos] != ')') return fail(p, at, "unbalanced parenthesis: '(' is never closed");
    p->pos++;
    return body;
}

/* The atom at p->pos, consumed: its node, NONE (an anchor in its allowed place), or -1. */
static int parse_atom(parser *p, int depth) {
    size_t at = p->pos;
    long m, n;
    size_t end;
    uint32_t cp = 0;
    switch (p->s[at]) {
    case '(': return parse_group(p, depth);
    case '[': return parse_class(p);
    case '.': {
        int s0 = p->nrg;
        p->pos++;
        for (size_t i = 0; i < sizeof R_DOT / sizeof *R_DOT; i++)
            if (rg_push(p, R_DOT[i].lo, R_DOT[i].hi)) return -1;
        return set_node(p, s0, 0, MAX_CP, at);
    }
    case '\\': {
        int k = parse_escape(p, 0, &cp);
        return k < 0 ? -1 : atom_node(p, k, cp, at);
    }
    case '*': case '+': case '?': return fail(p, at, "nothing to repeat");
    case '{':
        if (brace_at(p, at, &m, &n, &end)) return fail(p, at, "nothing to repeat");
        break; /* a literal '{' */
    case '^':
        if (at) return fail(p, at, "anchor ^ is only supported at the start of the pattern");
        p->pos++;
        return NONE;
    case '$':
        if (at + 1 != p->len) return fail(p, at, "anchor $ is only supported at the end of the pattern");
        p->pos++;
        return NONE;
    default: break;
    }
    if (read_cp(p, &cp)) return -1;
    return atom_node(p, 0, cp, at);
}

/* A sequence of quantified atoms up to '|', ')' or the end: its node (a concatenation, or the
 * only atom), or -1. */
static int parse_cat(parser *p, int depth) {
    int cat = node_new(p, K_CAT, p->pos);
    if (cat < 0) return -1;
    int last = -1, count = 0;
    while (p->pos < p->len && p->s[p->pos] != '|' && p->s[p->pos] != ')') {
        int a = parse_atom(p, depth);
        if (a == -1) return -1;
        if (a == NONE) {
            if (quant_starts(p)) return fail(p, p->pos, "nothing to repeat");
            continue;
        }
        a = parse_quant(p, a);
        if (a < 0) return -1;
        if (last < 0) p->nd[cat].kid = a;
        else p->nd[last].next = a;
        last = a;
        count++;
    }
    return count == 1 ? last : cat;
}

/* Alternatives separated by '|' up to ')' or the end: their node, or -1. */
static int parse_alt(parser *p, int depth) {
    size_t at = p->pos;
    int first = parse_cat(p, depth);
    if (first < 0 || p->pos >= p->len || p->s[p->pos] != '|') return first;
    int alt = node_new(p, K_ALT, at);
    if (alt < 0) return -1;
    p->nd[alt].kid = first;
    for (int last = first; p->pos < p->len && p->s[p->pos] == '|';) {
        p->pos++;
        int k = parse_cat(p, depth);
        if (k < 0) return -1;
        p->nd[last].next = k;
        last = k;
    }
    return alt;
}

/* ---- size and emission ---- */

/* The fragment of a set: one entry and one exit, ASCII ranges as byte edges between them,
 * other ranges through sm_frag_utf8. */
static sm_frag emit_set(sm_nfa *n, const range *r, int k) {
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    for (int i = 0; i < k; i++) {
        uint32_t lo = r[i].lo, hi = r[i].hi;
        if (lo < 0x80) {
            sm_nfa_bytes(n, f.in, f.out, (int)lo, (int)(hi < 0x80 ? hi : 0x7F));
            lo = 0x80;
        }
        if (lo > hi) continue;
        sm_frag g = sm_frag_utf8(n, lo, hi);
        sm_nfa_eps(n, f.in, g.in);
        sm_nfa_eps(n, g.out, f.out);
    }
    return f;
}

/* States emit_set makes for these ranges (measured on a scratch automaton; over the NFA's
 * limit when the scratch one fails). */
static long long set_states(const range *r, int k) {
    if (k == 0 || r[k - 1].hi < 0x80) return 2;
    if (k == 1 && r[0].lo == r[0].hi) return 2 + 2 * (r[0].lo < 0x800 ? 2 : r[0].lo < 0x10000 ? 3 : 4);
    sm_nfa t;
    sm_nfa_init(&t);
    emit_set(&t, r, k);
    long long s = t.bad ? (long long)SM_NFA_MAX_STATES + 1 : t.nstates;
    sm_nfa_free(&t);
    return s;
}

/* States node i emits (capped at limit + 1); *over gets the offset of the innermost node whose
 * states cross limit. */
static long long tree_states(const parser *p, int i, long long limit, size_t *over, int *crossed) {
    const node *d = &p->nd[i];
    long long s = 0, kid = 0;
    switch (d->kind) {
    case K_SET: s = set_states(p->rg + d->a, d->b); break;
    case K_CAT:
    case K_ALT:
        s = d->kind == K_ALT || d->kid < 0 ? 2 : 0;
        for (int k = d->kid; k >= 0 && s <= limit; k = p->nd[k].next) s += tree_states(p, k, limit, over, crossed);
        break;
    default: /* {0,0} emits its operand not at all */
        kid = d->b ? tree_states(p, d->kid, limit, over, crossed) : 0;
        if (d->b < 0) s = (d->a > 1 ? d->a : 1) * kid + 2;
        else s = d->b * kid + 2LL * (d->b - d->a) + (d->b == 0 ? 2 : 0);
        break;
    }
    if (s > limit) {
        if (!*crossed) *over = d->off, *crossed = 1;
        s = limit + 1;
    }
    return s;
}

static sm_frag emit(sm_nfa *n, const parser *p, int i);

/* The repetition {min, max} of d's operand: min copies, then a star (max unbounded: the last
 * copy becomes a plus) or max - min nested optional copies x(x(x)?)? (linear, not quadratic). */
static sm_frag emit_rep(sm_nfa *n, const parser *p, const node *d) {
    int lo = d->a, hi = d->b, k = d->kid, have = 0;
    sm_frag f = {0, 0}, g;
    if (hi < 0 && lo == 0) return sm_frag_star(n, emit(n, p, k));
    if (hi == 0) return sm_frag_empty(n);
    for (int j = 0; j < (hi < 0 ? lo - 1 : lo) && !n->bad; j++) {
        g = emit(n, p, k);
        f = have ? sm_frag_cat(n, f, g) : g;
        have = 1;
    }
    if (hi < 0) {
        g = sm_frag_plus(n, emit(n, p, k));
        return have ? sm_frag_cat(n, f, g) : g;
    }
    int tail = 0;
    sm_frag t = {0, 0};
    for (int j = 0; j < hi - lo && !n->bad; j++) {
        g = emit(n, p, k);
        t = sm_frag_opt(n, tail ? sm_frag_cat(n, g, t) : g);
        tail = 1;
    }
    if (!tail) return f;
    return have ? sm_frag_cat(n, f, t) : t;
}

/* The fragment of node i (every call builds fresh states). */
static sm_frag emit(sm_nfa *n, const parser *p, int i) {
    const node *d = &p->nd[i];
    sm_frag f;
    switch (d->kind) {
    case K_SET: return emit_set(n, p->rg + d->a, d->b);
    case K_CAT:
        if (d->kid < 0) return sm_frag_empty(n);
        f = emit(n, p, d->kid);
        for (int k = p->nd[d->kid].next; k >= 0; k = p->nd[k].next) f = sm_frag_cat(n, f, emit(n, p, k));
        return f;
    case K_ALT:
        f.in = sm_nfa_state(n);
        f.out = sm_nfa_state(n);
        for (int k = d->kid; k >= 0; k = p->nd[k].next) {
            sm_frag g = emit(n, p, k);
            sm_nfa_eps(n, f.in, g.in);
            sm_nfa_eps(n, g.out, f.out);
        }
        return f;
    default: return emit_rep(n, p, d);
    }
}

int sm_regex_compile(sm_nfa *n, const char *src, size_t len, sm_frag *out, sm_err *e) {
    parser p;
    memset(&p, 0, sizeof p);
    p.s = (const uint8_t *)src;
    p.len = len;
    p.e = e;
    /* parse the whole pattern; a ')' left over has no '(' */
    int root = -1;
    if (len > SM_NFA_MAX_STATES) fail(&p, SM_NFA_MAX_STATES, "the pattern is longer than %d bytes", SM_NFA_MAX_STATES);
    else root = parse_alt(&p, 0);
    if (root >= 0 && p.pos < len) fail(&p, p.pos, "unbalanced parenthesis: ')' has no matching '('");
    /* refuse a tree larger than the automaton may still grow, before touching n */
    if (!p.failed) {
        long long limit = (long long)SM_NFA_MAX_STATES - n->nstates;
        size_t over = 0;
        int crossed = 0;
        if (tree_states(&p, root, limit, &over, &crossed) > limit)
            fail(&p, over, "the pattern needs more than %lld automaton states once its repetitions are expanded",
                 limit);
    }
    /* emit; an allocation failure shows in n */
    if (!p.failed) {
        *out = emit(n, &p, root);
        if (sm_nfa_ok(n, e)) {
            sm_errprefix(e, "regex");
            p.failed = 1;
        }
    }
    free(p.nd);
    free(p.rg);
    return p.failed ? -1 : 0;
}
