/* test_regex.c: the regex compiler (src/constrain/regex.c) against PCRE2, the oracle.
 *
 * Every compared regex runs through both sides: ours (regex.c -> NFA -> match.c's lazy DFA)
 * and PCRE2 compiled with PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED (a fullmatch).  The
 * strings: random ones over an alphabet of the regex's own characters plus a few others
 * (multi-byte characters, \n, bytes that are not UTF-8), and strings of our language found by
 * random walks over our automaton (each must be UTF-8 and matched by PCRE2, or our automaton
 * accepts too much), then mutated (a code point inserted, deleted or replaced, a byte cut off,
 * two walks joined) to probe the language's border.  The regexes: a fixed list in the style of
 * JSON Schema patterns and vLLM's `regex`, random regexes from a small syntax-tree generator,
 * and random soups of metacharacters (whatever both sides compile is compared).  Then every
 * refusal gives -1 and one line "regex: <what> at offset <k>", and hostile patterns (deep
 * nesting, huge counts, invalid UTF-8) are answered quickly.  PCRE2 lacks \uHHHH and \u{..}
 * and reads \v as a class, and our \D \W \S, `.` and negated classes holding a shorthand are
 * narrower than PCRE2's (regex.h): the pattern it gets is rewritten to say ours (to_pcre).
 * What the narrowing is for is checked too: every walk (a string we may generate) must also
 * match the pattern as written under a Unicode reading (PCRE2_UCP: Unicode \d \w \s; its \s
 * lacks Python's \x1C-\x1F, which fixed cases in test_semantics cover).  Possessive
 * quantifiers are left out of the comparison: they are read as greedy (regex.h).  We rejected
 * stored expected answers: PCRE2 is the reference the patterns are written for, and a fixed
 * seed keeps the run the same every time.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "constrain/match.h"
#include "constrain/regex.h"

/* ---- seeded random numbers (xorshift64) ---- */
static uint64_t rng = 0x5EEDC0DE2E6E7ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static uint32_t below(uint32_t n) { return rnd() % n; }

/* ---- the two sides ---- */

static pcre2_compile_context *cctx;
static pcre2_match_context *mctx;
static long n_cmp, n_skip, n_bad, n_walk, n_uni, n_uni_bad;

/* Four hex digits at s [avail bytes] into *v: 1, or 0 when they are not there. */
static int hex4(const char *s, size_t avail, unsigned *v) {
    *v = 0;
    if (avail < 4) return 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return 0;
        *v = *v << 4 | (unsigned)h;
    }
    return 1;
}

/* Our \D \W \S (regex.h) as PCRE2 class items, or NULL where PCRE2's own reading is ours
 * (\d \w \s are ASCII to PCRE2 without PCRE2_UCP).  wide: in a negated class, where \s and
 * \S both cover \x1C-\x1F. */
static const char *shorthand_items(char c, int wide) {
    switch (c) {
    case 'D': return "\\x00-\\x2f\\x3a-\\x7f";
    case 'W': return "\\x00-\\x2f\\x3a-\\x40\\x5b-\\x5e\\x60\\x7b-\\x7f";
    case 'S': return wide ? "\\x00-\\x08\\x0e-\\x1f\\x21-\\x7f" : "\\x00-\\x08\\x0e-\\x1b\\x21-\\x7f";
    case 's': return wide ? "\\s\\x1c-\\x1f" : NULL;
    default: return NULL;
    }
}

/* The class at re[i] (its '['): the offset of its closing ']' (len when it has none); *neg_sh
 * 1 when it is negated and holds a shorthand; *full 1 when it holds a shorthand and its
 * complement ([\s\S]: PCRE2's own reading, every code point, is ours).  As regex.c reads it: a
 * ']' first is a member, an escape is two bytes (more only with hex digits, never a ']'). */
static size_t class_end(const char *re, size_t len, size_t i, int *neg_sh, int *full) {
    size_t k = i + 1;
    int neg = k < len && re[k] == '^', sh = 0;
    k += (size_t)neg;
    if (k < len && re[k] == ']') k++;
    for (; k < len && re[k] != ']'; k++)
        if (re[k] == '\\' && ++k < len && re[k] && strchr("dwsDWS", re[k])) sh |= 1 << (int)(strchr("dDwWsS", re[k]) - "dDwWsS");
    *neg_sh = neg && sh;
    *full = (sh & 3) == 3 || (sh & 12) == 12 || (sh & 48) == 48;
    return k;
}

static void emit_str(char *out, size_t *o, size_t cap, const char *t) {
    *o += (size_t)snprintf(out + *o, cap - *o, "%s", t);
}

/* re in PCRE2's syntax into out [cap: 32 * len + 64 is enough]: \uHHHH (a surrogate pair as
 * one) and \u{H..} become \x{H..}; \v (a class of vertical space in PCRE2) becomes \x{0B}.
 * With ours, also our narrower semantics (regex.h): outside a class `.` becomes
 * [^\n\r\x{2028}\x{2029}] and \D \W \S their ASCII classes; in a class \D \W \S become their
 * ranges; a negated class holding a shorthand [^X] becomes (?:(?![X'])[\x00-\x7f]) (an ASCII
 * character not in X), X' being X with those ranges, \s widened to \x1C-\x1F and a leading '^'
 * escaped. */
static void to_pcre(const char *re, size_t len, char *out, size_t cap, int ours) {
    size_t o = 0, end = 0;
    int cls = 0; /* in a class (ours only): 1, or 2 for a negated one holding a shorthand */
    for (size_t i = 0; i < len && o + 64 < cap;) {
        char c = re[i];
        if (ours && !cls && c == '[') {
            int neg_sh, full;
            end = class_end(re, len, i, &neg_sh, &full);
            if (end < len && full) { /* as it is: PCRE2 reads it as we do */
                memcpy(out + o, re + i, end + 1 - i);
                o += end + 1 - i;
                i = end + 1;
                continue;
            }
            if (end < len && neg_sh) {
                cls = 2;
                emit_str(out, &o, cap, "(?:(?![");
                i += 2;
                if (re[i] == '^') emit_str(out, &o, cap, "\\^"), i++;
                continue;
            }
            cls = end < len;
            out[o++] = re[i++];
            continue;
        }
        if (cls && i == end) {
            emit_str(out, &o, cap, cls == 2 ? "])[\\x00-\\x7f])" : "]");
            cls = 0, i++;
            continue;
        }
        if (ours && !cls && c == '.') {
            emit_str(out, &o, cap, "[^\\n\\r\\x{2028}\\x{2029}]");
            i++;
            continue;
        }
        if (c != '\\' || i + 1 >= len) {
            out[o++] = re[i++];
            continue;
        }
        char d = re[i + 1];
        const char *sh = ours ? shorthand_items(d, cls == 2) : NULL;
        unsigned v = 0, w = 0;
        if (sh) {
            if (!cls) out[o++] = '[';
            emit_str(out, &o, cap, sh);
            if (!cls) out[o++] = ']';
            i += 2;
        } else if (d == 'v') {
            o += (size_t)snprintf(out + o, cap - o, "\\x{0B}");
            i += 2;
        } else if (d == 'u' && i + 2 < len && re[i + 2] == '{') {
            o += (size_t)snprintf(out + o, cap - o, "\\x");
            i += 2;
        } else if (d == 'u' && hex4(re + i + 2, len - i - 2, &v)) {
            i += 6;
            if (v >= 0xD800 && v < 0xDC00 && len - i >= 6 && re[i] == '\\' && re[i + 1] == 'u' &&
                hex4(re + i + 2, len - i - 2, &w) && w >= 0xDC00 && w < 0xE000) {
                v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
                i += 6;
            }
            o += (size_t)snprintf(out + o, cap - o, "\\x{%X}", v);
        } else {
            out[o++] = re[i++];
            out[o++] = re[i++];
        }
    }
    out[o] = 0;
}

typedef struct pair {
    sm_gram *g;            /* ours; NULL when refused */
    int ours;              /* 0 compiled, -1 refused by the regex compiler, -2 empty language */
    sm_err e;
    pcre2_code *pc;        /* PCRE2's, in our semantics; NULL when it refuses */
    pcre2_match_data *md;
    pcre2_code *pu;        /* PCRE2's of the pattern as written, Unicode \d \w \s (PCRE2_UCP) */
    pcre2_match_data *mu;
} pair;

/* Compile re [len] on both sides. */
static void pair_open(pair *q, const char *re, size_t len) {
    memset(q, 0, sizeof *q);
    sm_nfa n;
    sm_nfa_init(&n);
    int r = sm_nfa_rule_new(&n);
    sm_frag f;
    if (sm_regex_compile(&n, re, len, &f, &q->e)) {
        sm_nfa_free(&n);
        q->ours = -1;
    } else {
        sm_nfa_rule_set(&n, r, f);
        if (sm_gram_create(&n, &q->g, &q->e)) {
            q->ours = -2;
            CHECK(strstr(q->e.msg, "matches no string"), "%s: sm_gram_create: %s", re, q->e.msg);
        }
    }
    size_t cap = len * 32 + 64;
    char *t = malloc(cap);
    if (!t) return;
    int err;
    PCRE2_SIZE eoff;
    uint32_t opt = PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED;
    to_pcre(re, len, t, cap, 1);
    q->pc = pcre2_compile((PCRE2_SPTR)t, PCRE2_ZERO_TERMINATED, opt, &err, &eoff, cctx);
    to_pcre(re, len, t, cap, 0);
    q->pu = pcre2_compile((PCRE2_SPTR)t, PCRE2_ZERO_TERMINATED, opt | PCRE2_UCP, &err, &eoff, cctx);
    free(t);
    if (q->pc) q->md = pcre2_match_data_create_from_pattern(q->pc, NULL);
    if (q->pu) q->mu = pcre2_match_data_create_from_pattern(q->pu, NULL);
}

static void pair_close(pair *q) {
    sm_gram_free(q->g);
    pcre2_match_data_free(q->md);
    pcre2_code_free(q->pc);
    pcre2_match_data_free(q->mu);
    pcre2_code_free(q->pu);
}

/* 1 when s [n] is UTF-8 (strict: no overlong forms, no surrogates, at most U+10FFFF). */
static int utf8_ok(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || n - i < (size_t)k) return 0;
        uint32_t v = k == 1 ? c : (uint32_t)(c & (0x7F >> k));
        for (int j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            v = v << 6 | (s[i + j] & 0x3F);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (v < min[k] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* s [n] printable: ASCII as is (\n \t as escapes), other bytes as \xHH. */
static const char *show(const uint8_t *s, size_t n) {
    static char b[2048];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < sizeof b; i++) {
        if (s[i] >= 0x20 && s[i] < 0x7F) b[o++] = (char)s[i];
        else o += (size_t)snprintf(b + o, sizeof b - o, "\\x%02X", s[i]);
    }
    b[o] = 0;
    return b;
}

/* PCRE2's answer on s [n]: 1 match, 0 no match, -1 it gave up (match limit). */
static int oracle(pair *q, const uint8_t *s, size_t n) {
    if (!utf8_ok(s, n)) return 0; /* PCRE2_UTF refuses the subject; no code point string matches */
    int r = pcre2_match(q->pc, (PCRE2_SPTR)s, n, 0, 0, q->md, mctx);
    if (r >= 0) return 1;
    return r == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

/* One comparison of the two sides on s [n]; mismatches after the first 25 are counted only. */
static void compare(pair *q, const char *re, const uint8_t *s, size_t n) {
    int want = oracle(q, s, n);
    if (want < 0) {
        n_skip++;
        return;
    }
    n_cmp++;
    int got = sm_gram_matches(q->g, s, n);
    if (got == want) return;
    if (n_bad++ < 25) CHECK(got == want, "/%s/ on \"%s\": ours %d, PCRE2 %d", re, show(s, n), got, want);
    else t_cur++;
}

/* ---- strings ---- */

typedef struct alpha {
    char c[160][5];        /* UTF-8 characters, or one byte that is not UTF-8 */
    int n;
} alpha;

static void alpha_add(alpha *a, const char *u, int len) {
    for (int i = 0; i < a->n; i++)
        if ((int)strlen(a->c[i]) == len && !memcmp(a->c[i], u, (size_t)len)) return;
    if (a->n == 160 || len > 4) return;
    memcpy(a->c[a->n], u, (size_t)len);
    a->c[a->n++][len] = 0;
}

/* Add code point c and its neighbours c - 1, c + 1 (the edges of a class range). */
static void alpha_near(alpha *a, uint32_t c) {
    for (uint32_t x = c ? c - 1 : c; x <= c + 1; x++) {
        char u[4];
        int k = x < 0x80 ? 1 : x < 0x800 ? 2 : x < 0x10000 ? 3 : 4;
        if (x == 0 || x > 0x10FFFF || (x >= 0xD800 && x <= 0xDFFF)) continue;
        if (k == 1) u[0] = (char)x;
        else {
            u[0] = (char)((0xF00u >> k) | (x >> (6 * (k - 1))));
            for (int j = 1; j < k; j++) u[j] = (char)(0x80 | ((x >> (6 * (k - 1 - j))) & 0x3F));
        }
        alpha_add(a, u, k);
    }
}

/* The code point an escape \xHH \x{..} \uHHHH \u{..} at re [avail] names, or -1. */
static long esc_cp(const char *re, size_t avail) {
    unsigned v;
    if (avail >= 4 && re[1] == 'x' && re[2] != '{') {
        char h[5] = {'0', '0', re[2], re[3], 0};
        return hex4(h, 4, &v) ? (long)v : -1;
    }
    if (avail >= 6 && re[1] == 'u' && re[2] != '{') return hex4(re + 2, avail - 2, &v) ? (long)v : -1;
    if (avail >= 4 && (re[1] == 'x' || re[1] == 'u') && re[2] == '{') return strtol(re + 3, NULL, 16);
    return -1;
}

/* The characters of re itself, those its escapes name, their neighbours, and a few others:
 * multi-byte ones, the edges of the UTF-8 lengths. */
static void alpha_build(alpha *a, const char *re, size_t len) {
    static const char *extra[] = {"a", "Z", "0", "7", "_", " ", "\t", "\n", "-", ".", "\"", "\\", "/", "@",
                                  "\xc3\xa9", "\xc3\xbf", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\x01", "\x7f",
                                  "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xef\xbf\xbf", "\xed\x9f\xbf",
                                  "\xee\x80\x80", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf",
                                  /* the borders of regex.h's narrowing: \r U+2028 U+00A0 \x1C U+015F U+0663 */
                                  "\r", "\xe2\x80\xa8", "\xc2\xa0", "\x1c", "\xc5\x9f", "\xd9\xa3"};
    a->n = 0;
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) alpha_add(a, extra[i], (int)strlen(extra[i]));
    for (size_t i = 0; i < len;) {
        long e = re[i] == '\\' ? esc_cp(re + i, len - i) : -1;
        if (e >= 0) alpha_near(a, (uint32_t)e);
        size_t k = 1;
        while (i + k < len && k < 4 && ((uint8_t)re[i + k] & 0xC0) == 0x80) k++;
        uint32_t c = (uint8_t)re[i];
        for (size_t j = 1; j < k; j++) c = c << 6 | ((uint8_t)re[i + j] & 0x3F);
        if (k > 1) c &= (1u << (5 * k + 1)) - 1;
        if (utf8_ok((const uint8_t *)re + i, k)) alpha_near(a, c);
        i += k;
    }
}

/* Append a random alphabet character (now and then a byte that is not UTF-8) to s at *n. */
static void put_char(const alpha *a, uint8_t *s, size_t *n) {
    static const char *bad[] = {"\xff", "\x80", "\xc3", "\xed\xa0\x80", "\xc0\xaf"};
    const char *c = below(40) ? a->c[below((uint32_t)a->n)] : bad[below(5)];
    size_t k = strlen(c);
    memcpy(s + *n, c, k);
    *n += k;
}

/* A random string of up to 16 characters into s (room for 64 bytes); its length. */
static size_t rand_string(const alpha *a, uint8_t *s) {
    size_t n = 0, len = below(17);
    for (size_t i = 0; i < len; i++) put_char(a, s, &n);
    return n;
}

/* A random string of g's language (a random walk over its configurations, stopping at an
 * accepting one with probability 1/5) into s: its length, -1 past max bytes, -2 on an
 * error of the grammar. */
static int walk(sm_gram *g, uint8_t *s, int max) {
    int cfg = sm_gram_start(g), n = 0;
    for (;;) {
        if (sm_gram_accepting(g, cfg) && (below(5) == 0 || !sm_gram_can_continue(g, cfg))) return n;
        if (n >= max) return -1;
        int next[256], nb = 0;
        uint8_t byte[256];
        for (int b = 0; b < 256; b++) {
            int c = sm_gram_step(g, cfg, (uint8_t)b);
            if (c == -2) return -2;
            if (c >= 0) byte[nb] = (uint8_t)b, next[nb++] = c;
        }
        if (!nb) return sm_gram_accepting(g, cfg) ? n : -2; /* a live configuration can go on */
        int k = (int)below((uint32_t)nb);
        s[n++] = byte[k];
        cfg = next[k];
    }
}

/* The byte offset of a random code point boundary of s [n] (n included). */
static size_t boundary(const uint8_t *s, size_t n) {
    size_t k = below((uint32_t)n + 1);
    while (k < n && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

/* A mutant of w [wn] (other: another walk, [on]) into m: its length. */
static size_t mutate(const alpha *a, const uint8_t *w, size_t wn, const uint8_t *o, size_t on, uint8_t *m) {
    size_t i = boundary(w, wn), n = 0, j;
    switch (below(6)) {
    case 0: /* insert a character */
        memcpy(m, w, i), n = i;
        put_char(a, m, &n);
        memcpy(m + n, w + i, wn - i);
        return n + wn - i;
    case 1: /* delete a code point */
    case 2: /* replace a code point */
        j = i < wn ? i + 1 : i;
        while (j < wn && (w[j] & 0xC0) == 0x80) j++;
        memcpy(m, w, i), n = i;
        if (below(2)) put_char(a, m, &n);
        memcpy(m + n, w + j, wn - j);
        return n + wn - j;
    case 3: /* cut at any byte */
        n = below((uint32_t)wn + 1);
        memcpy(m, w, n);
        return n;
    case 4: /* the walk twice */
        memcpy(m, w, wn);
        memcpy(m + wn, w, wn);
        return 2 * wn;
    default: /* joined with another walk */
        memcpy(m, w, wn);
        memcpy(m + wn, o, on);
        return wn + on;
    }
}

/* Compare the two sides on nrand random strings and nwalk walks with 3 mutants each. */
static void exercise(pair *q, const char *re, size_t len, int nrand, int nwalk) {
    alpha a;
    alpha_build(&a, re, len);
    uint8_t s[512], w[256], o[256], m[600];
    size_t on = 0;
    for (int i = 0; i < nrand; i++) {
        size_t n = rand_string(&a, s);
        compare(q, re, s, n);
    }
    for (int i = 0; i < nwalk; i++) {
        int wn = walk(q->g, w, 200);
        CHECK(wn != -2, "/%s/: walk: %s", re, sm_gram_error(q->g));
        if (wn < 0) continue;
        n_walk++;
        CHECK(utf8_ok(w, (size_t)wn), "/%s/: a walk read \"%s\", not UTF-8", re, show(w, (size_t)wn));
        CHECK(sm_gram_matches(q->g, w, (size_t)wn), "/%s/: a walk's \"%s\" does not match", re, show(w, (size_t)wn));
        compare(q, re, w, (size_t)wn);
        /* valid under the Unicode reading too (what regex.h's narrowing is for); failures after
         * the first 25 are counted only */
        int u = q->pu ? pcre2_match(q->pu, (PCRE2_SPTR)w, (size_t)wn, 0, 0, q->mu, mctx) : PCRE2_ERROR_NULL;
        int valid = u >= 0 || u == PCRE2_ERROR_MATCHLIMIT;
        n_uni += u >= 0;
        if (!valid && n_uni_bad++ < 25)
            CHECK(valid, "/%s/: a walk's \"%s\" is invalid under Unicode \\d \\w \\s (%d)", re, show(w, (size_t)wn), u);
        else if (!valid) t_cur++;
        for (int k = 0; k < 3; k++) compare(q, re, m, mutate(&a, w, (size_t)wn, o, on, m));
        memcpy(o, w, (size_t)wn);
        on = (size_t)wn;
    }
}

/* ---- the fixed list ---- */

static const char *FIXED[] = {
    "^\\d{3}-\\d{4}$",
    "\\(\\d{3}\\) \\d{3}-\\d{4}",
    "^\\+?[1-9]\\d{1,14}$",
    "^\\d{4}-\\d{2}-\\d{2}$",
    "^(19|20)\\d\\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$",
    "^([01]\\d|2[0-3]):[0-5]\\d(:[0-5]\\d)?$",
    "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
    "^[\\w.+-]+@[\\w-]+\\.[\\w.-]+$",
    "^[a-zA-Z_][a-zA-Z0-9_]*$",
    "^[A-Z]{2}\\d{6}$",
    "[^\"\\\\]*",
    "\"([^\"\\\\]|\\\\.)*\"",
    "(ab|cd)*e?",
    ".*",
    ".+",
    "[\\u4e00-\\u9fff]+",
    "[\xc3\xa0-\xc3\xbf]+",
    "[a-z\xc3\xa0-\xc3\xbf ]{1,10}",
    "(yes|no|maybe)",
    "(true|false|null)",
    "-?\\d+(\\.\\d+)?([eE][+-]?\\d+)?",
    "^(0|[1-9]\\d*)$",
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$",
    "^https?://[^\\s/$.?#].[^\\s]*$",
    "^\\/[a-z0-9\\/_-]*$",
    "^#[0-9a-fA-F]{6}$",
    "^[A-Z][a-z]+( [A-Z][a-z]+)*$",
    "((a|b)*c){2,3}",
    "(a*)*b",
    "(a+|b+)+",
    "a{2,4}?b*?c+?d??",
    "(?:ab)+|c{3}",
    "(?P<year>\\d{4})-(?<month>\\d\\d)",
    "a|",
    "()",
    "|b",
    "[^a]",
    "[^\\n]*\\n",
    "\\s*\\S+\\s*",
    "[\\w\\s]{0,5}\\W",
    "\\x41\\u0042\\u{1F600}\\x{e9}",
    "\\t\\r\\f\\v\\0?",
    "[\\]\\[\\-^]+",
    "[-a]+[a-]+",
    "[]a]",
    "\\.\\*\\+\\?\\(\\)\\{\\}\\|\\^\\$\\/\\\\",
    "a{0}b{0,0}c{1}",
    "(a|ab)(c|bcd)(d*)",
    "[\\u0000-\\u007f]*",
    "[^\\u0000-\\u007f]+",
    "\xf0\x9f\x98\x80+|[\xf0\x9f\x98\x80-\xf0\x9f\x98\x82]{2}",
    "(\xe4\xb8\xad\xe6\x96\x87|\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e)+",
    "[^\"\\\\\\x00-\\x1f]*",
    "\\uD83D\\uDE00",
    "[^aeiou\\s]{3,}",
    "(\\w+\\s?){1,3}",
    "^(?:[a-z0-9!#$%&'*+/=?^_{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_{|}~-]+)*)@example\\.com$",
    "\\{[a-z]+\\}|a{b}|{\"k\": \\d}",
    "x{3}{",
    "[\\d\\-]{3,}",
    "(a(b(c(d)?)?)?)?",
    ".{2,3}",
    "ab*c|a(b|c)*d",
    "\\D\\W\\S",
    "[\\x{10000}-\\x{10FFFF}]",
    "[^\\x{80}-\\x{10FFFF}]+",
    "[\\x{7FF}-\\x{801}\\x{FFFF}\\x{D7FF}-\\x{E000}]+",
    "[\\b]",
    "[^\\w]+",
    "[^\\s,]+(,[^\\s,]+)*",
    "[^\\S\n]*",
    "[^\\d\\W]{2,}",
    "\\W+\\S*\\D?",
    "[\\W\xc3\xa9\\d]+",
    "[^\\W\xc5\x9f]*",
    "[\\s\\S]*",
    "[^\"\\\\]*\\s\\D",
    ".*\\r?",
};

static void test_fixed_list(void) {
    for (size_t i = 0; i < sizeof FIXED / sizeof *FIXED; i++) {
        const char *re = FIXED[i];
        pair q;
        pair_open(&q, re, strlen(re));
        CHECK(q.ours == 0, "/%s/: %s", re, q.e.msg);
        CHECK(q.pc, "/%s/: PCRE2 refuses it", re);
        if (q.ours == 0 && q.pc) exercise(&q, re, strlen(re), 200, 100);
        pair_close(&q);
    }
}

/* ---- random regexes ---- */

typedef struct buf {
    char s[2048];
    size_t n;
} buf;

static void put(buf *b, const char *t) {
    size_t k = strlen(t);
    if (b->n + k < sizeof b->s) memcpy(b->s + b->n, t, k), b->n += k;
    b->s[b->n] = 0;
}

static const char *LIT[] = {"a", "b", "c", "0", "1", "-", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                            "\\.", "\\n", "\\u00e9", "\\x{1F600}", "\\*", "\\/", " "};
static const char *CLS[] = {"a", "b", "0", "\xc3\xa9", "\xe4\xb8\xad", "\\n", "\\-", "\\]", "a-c", "0-9",
                            "\xc3\xa0-\xc3\xbf", "\\u4e00-\\u9fff", "\\x{1F600}-\\x{1F64F}", "\\d", "\\w", "\\s",
                            "\\W", "\\D", "\\S", "\\x00-\\x{7F}", "\\x{80}-\\x{10FFFF}", "."}; /* "." last */

static void gen_alt(buf *b, int depth);

static void gen_atom(buf *b, int depth) {
    uint32_t k = below(100);
    if (k < 40) {
        put(b, LIT[below(sizeof LIT / sizeof *LIT)]);
    } else if (k < 60) {
        put(b, below(4) ? "[" : "[^");
        /* not "." first: PCRE2 reads [.x.] as a POSIX collating element and refuses it */
        uint32_t ncls = sizeof CLS / sizeof *CLS;
        for (uint32_t i = 0, n = 1 + below(3); i < n; i++) put(b, CLS[below(i ? ncls : ncls - 1)]);
        put(b, "]");
    } else if (k < 68) {
        put(b, ".");
    } else if (k < 78 || depth == 0) {
        static const char *sh[] = {"\\d", "\\w", "\\s", "\\D", "\\W", "\\S"};
        put(b, sh[below(6)]);
    } else {
        put(b, below(2) ? "(" : "(?:");
        gen_alt(b, depth - 1);
        put(b, ")");
    }
}

static void gen_piece(buf *b, int depth) {
    char q[32];
    gen_atom(b, depth);
    if (below(100) >= 35) return;
    uint32_t m = below(4), n = m + below(4);
    switch (below(6)) {
    case 0: put(b, "*"); break;
    case 1: put(b, "+"); break;
    case 2: put(b, "?"); break;
    case 3: snprintf(q, sizeof q, "{%u}", m), put(b, q); break;
    case 4: snprintf(q, sizeof q, "{%u,}", m), put(b, q); break;
    default: snprintf(q, sizeof q, "{%u,%u}", m, n), put(b, q); break;
    }
    if (below(5) == 0) put(b, "?");
}

static void gen_cat(buf *b, int depth) {
    for (uint32_t i = 0, n = below(10) ? 1 + below(4) : 0; i < n; i++) gen_piece(b, depth);
}

static void gen_alt(buf *b, int depth) {
    gen_cat(b, depth);
    for (uint32_t i = 0, n = below(10) < 7 ? 0 : 1 + below(2); i < n; i++) {
        put(b, "|");
        gen_cat(b, depth);
    }
}

static void test_random_regexes(void) {
    int compared = 0, empty = 0;
    for (int i = 0; i < 400; i++) {
        buf b = {.n = 0};
        b.s[0] = 0;
        gen_alt(&b, 3);
        pair q;
        pair_open(&q, b.s, b.n);
        CHECK(q.ours != -1, "/%s/: %s", b.s, q.e.msg);
        CHECK(q.pc, "/%s/: PCRE2 refuses it", b.s);
        if (q.ours == 0 && q.pc) exercise(&q, b.s, b.n, 100, 40), compared++;
        if (q.ours == -2) empty++;
        pair_close(&q);
    }
    printf("  %d random regexes compared, %d with an empty language\n", compared, empty);
}

/* ---- soups of metacharacters ---- */

/* 1 when re may hold a possessive quantifier (refused here; PCRE2 reads it): left out of the
 * comparison. */
static int maybe_possessive(const char *re) {
    return strstr(re, "++") || strstr(re, "*+") || strstr(re, "?+") || strstr(re, "}+");
}

/* 1 when e holds one line "regex: ... at offset K" with K <= len. */
static int refusal_line(const sm_err *e, size_t len) {
    const char *at = strstr(e->msg, " at offset ");
    size_t k;
    char end;
    return !strncmp(e->msg, "regex: ", 7) && at && !strchr(e->msg, '\n') && sscanf(at, " at offset %zu%c", &k, &end) == 1 &&
           k <= len;
}

static void test_metachar_soup(void) {
    static const char *tok[] = {"a", "b", "\xc3\xa9", "(", ")", "(", ")", "[", "]", "^", "$", "|", "*", "+",
                                "?", "{", "}", "{2}", "{1,3}", "{2,}", ",", "\\", "\\d", "\\w", "\\s", "\\b",
                                "\\1", "-", ".", "(?:", "(?=", "(?<n>", "\\u00e9", "\\x{1F600}", "0", "9",
                                "\xff", "\\n", "\\S", "[^", "\\-", "\\]", "\\\\", "\xe4\xb8\xad"};
    int ours = 0, both = 0, ours_only = 0, compared = 0;
    for (int i = 0; i < 4000; i++) {
        buf b = {.n = 0};
        b.s[0] = 0;
        for (uint32_t k = 0, n = 1 + below(10); k < n; k++) put(&b, tok[below(sizeof tok / sizeof *tok)]);
        pair q;
        pair_open(&q, b.s, b.n);
        if (q.ours == -1) CHECK(refusal_line(&q.e, b.n), "/%s/: the refusal \"%s\"", b.s, q.e.msg);
        if (q.ours != -1) ours++;
        if (q.ours != -1 && q.pc) both++;
        if (q.ours != -1 && !q.pc && ours_only++ < 8) printf("  PCRE2 refuses what we read: /%s/\n", show((const uint8_t *)b.s, b.n));
        if (q.ours == 0 && q.pc && !maybe_possessive(b.s)) exercise(&q, b.s, b.n, 30, 10), compared++;
        pair_close(&q);
    }
    printf("  4000 soups: %d compiled by us, %d by both, %d by us only, %d compared\n", ours, both, ours_only, compared);
}

/* ---- refusals ---- */

static void test_refusals(void) {
    static const struct {
        const char *re;
        size_t off;
        const char *what;
    } R[] = {
        {"(a)\\1", 3, "backreference \\1 is not supported"},
        {"(?=a)b", 0, "lookahead is not supported"},
        {"(?!a)b", 0, "lookahead"},
        {"a(?<=a)", 1, "lookbehind"},
        {"(?<!a)b", 0, "lookbehind"},
        {"(ab", 0, "unbalanced parenthesis"},
        {"ab)", 2, "unbalanced parenthesis"},
        {"((a)", 0, "unbalanced parenthesis"},
        {"(a))(", 3, "unbalanced parenthesis"},
        {"*a", 0, "nothing to repeat"},
        {"a**", 2, "nothing to repeat"},
        {"(+a)", 1, "nothing to repeat"},
        {"a|*", 2, "nothing to repeat"},
        {"^*", 1, "nothing to repeat"},
        {"a{2}{3}", 4, "nothing to repeat"},
        {"a*?+", 3, "nothing to repeat"},
        {"a*+a", 2, "possessive quantifier is not supported"},
        {"\\d++-", 3, "possessive quantifier"},
        {"a{2}+", 4, "possessive quantifier"},
        {"{2}", 0, "nothing to repeat"},
        {"a{3,2}", 1, "min > max"},
        {"a{1001}", 1, "above 1000"},
        {"a{0,1001}", 1, "above 1000"},
        {"a{99999999999999999999}", 1, "above 1000"},
        {"a{2,99999999999999999999}", 1, "above 1000"},
        {"x{,3}", 1, "{0,n}"},
        {"ab\xff" "c", 2, "invalid UTF-8"},
        {"\xc3", 0, "invalid UTF-8"},
        {"a\xc3(", 1, "invalid UTF-8"},
        {"\xc0\xaf", 0, "invalid UTF-8"},
        {"\xed\xa0\x80", 0, "invalid UTF-8"},
        {"\xf4\x90\x80\x80", 0, "invalid UTF-8"},
        {"[a\xff]", 2, "invalid UTF-8"},
        {"\\\xff", 1, "invalid UTF-8"},
        {"\\q", 0, "bad escape \\q"},
        {"a\\", 1, "trailing backslash"},
        {"\\x4", 0, "bad escape \\x"},
        {"\\xZZ", 0, "bad escape \\x"},
        {"\\u12", 0, "bad escape \\u"},
        {"\\u{}", 0, "bad escape \\u"},
        {"\\u{12", 0, "bad escape \\u"},
        {"\\u{110000}", 0, "above U+10FFFF"},
        {"\\x{FFFFFFFFFFFF}", 0, "above U+10FFFF"},
        {"a\\uD800", 1, "surrogate"},
        {"\\uDE00\\uD83D", 0, "surrogate"},
        {"\\x{DFFF}", 0, "surrogate"},
        {"\\01", 0, "octal"},
        {"[\\1]", 1, "octal"},
        {"[abc", 0, "unterminated class"},
        {"a[^", 1, "unterminated class"},
        {"[]", 0, "unterminated class"},
        {"[a-", 0, "unterminated class"},
        {"[\\]", 0, "unterminated class"},
        {"\\b", 0, "\\b is not supported"},
        {"a\\B", 1, "\\B is not supported"},
        {"[\\B]", 1, "\\B is not supported"},
        {"(?i)abc", 0, "inline flags (?i)"},
        {"a(?i:b)", 1, "inline flags (?i)"},
        {"(?x)a", 0, "inline flags"},
        {"(?-i:a)", 0, "inline flags"},
        {"\\p{L}", 0, "\\p is not supported"},
        {"[\\p{L}]", 1, "\\p is not supported"},
        {"\\P{Lu}", 0, "\\P is not supported"},
        {"a^b", 1, "anchor ^"},
        {"a$b", 1, "anchor $"},
        {"(a$)", 2, "anchor $"},
        {"(^a)", 1, "anchor ^"},
        {"\\A", 0, "anchor \\A"},
        {"a\\z", 1, "anchor \\z"},
        {"\\Z", 0, "anchor \\Z"},
        {"[z-a]", 1, "out of order"},
        {"[\\d-z]", 1, "shorthand"},
        {"[\\w-.]", 1, "shorthand"},
        {"[a-\\d]", 3, "shorthand"},
        {"[[:alpha:]]", 1, "POSIX"},
        {"(?>a)", 0, "atomic"},
        {"(?P=n)", 0, "backreference"},
        {"\\k<n>", 0, "backreference"},
        {"(?#c)", 0, "comment"},
        {"(?(1)a|b)", 0, "conditional"},
        {"(?R)", 0, "recursion"},
        {"(?1)", 0, "recursion"},
        {"(?<1a>x)", 0, "bad group name"},
        {"(?P<n", 0, "bad group name"},
        {"(?", 0, "group syntax"},
        {"((a{1000}){1000}){1000}", 17, "automaton states"},
        {"(.{1000}){1000}", 9, "automaton states"},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        sm_nfa n;
        sm_nfa_init(&n);
        sm_nfa_rule_new(&n);
        sm_frag f;
        sm_err e;
        e.msg[0] = 0;
        size_t len = strlen(R[i].re);
        int rc = sm_regex_compile(&n, R[i].re, len, &f, &e);
        char tail[64];
        snprintf(tail, sizeof tail, " at offset %zu", R[i].off);
        size_t ml = strlen(e.msg), tl = strlen(tail);
        CHECK(rc == -1, "/%s/ compiled", R[i].re);
        CHECK(refusal_line(&e, len) && strstr(e.msg, R[i].what) && ml >= tl && !strcmp(e.msg + ml - tl, tail),
              "/%s/: \"%s\", wanted \"%s ...%s\"", R[i].re, e.msg, R[i].what, tail);
        CHECK(n.nstates == 0, "/%s/: a refusal left %d states in the automaton", R[i].re, n.nstates);
        sm_nfa_free(&n);
    }
}

/* ---- direct checks of what the comparison cannot see ---- */

static void test_semantics(void) {
    static const struct {
        const char *re, *s;
        size_t slen;  /* 0: strlen */
        int want;
    } T[] = {
        {"\\uD83D\\uDE00", "\xf0\x9f\x98\x80", 0, 1},
        {"[\\uD83D\\uDE00-\\uD83D\\uDE02]", "\xf0\x9f\x98\x81", 0, 1},
        {"\\u{1F600}", "\xf0\x9f\x98\x80", 0, 1},
        {"[^a]", "\xc3", 0, 0},
        {"[^a]", "\xc3\xa9", 0, 1},
        {"[^a]", "\xed\xa0\x80", 0, 0},
        {"[^a]*", "b\xc3\xa9\xc3", 0, 0},
        {".", "\n", 0, 0},
        {".", "\r", 0, 0},
        {".", "\xe2\x80\xa8", 0, 0}, /* U+2028 */
        {".", "\xe2\x80\xa9", 0, 0}, /* U+2029 */
        {".", "\xe2\x80\xa7", 0, 1},
        {".", "\x0b", 0, 1},
        {"[.]", "\r", 0, 0},
        /* \D \W \S and negated classes with a shorthand: within ASCII (regex.h) */
        {"\\W", "\xc5\x9f", 0, 0}, /* U+015F, a word character to Python */
        {"\\W", "-", 0, 1},
        {"\\W", "_", 0, 0},
        {"\\W", "\x7f", 0, 1},
        {"[\\W]", "\xc5\x9f", 0, 0},
        {"\\S", "\xc2\xa0", 0, 0}, /* U+00A0, Unicode white space */
        {"\\S", "\x1c", 0, 0},      /* white space to Python */
        {"\\S", "\x1f", 0, 0},
        {"\\S", "\x1b", 0, 1},
        {"\\S", "!", 0, 1},
        {"\\S", "\xc3\xa9", 0, 0},
        {"\\D", "\xd9\xa3", 0, 0}, /* U+0663, a Unicode digit */
        {"\\D", "a", 0, 1},
        {"\\D", "5", 0, 0},
        {"[\\D\\d]", "\xc3\xa9", 0, 1},
        {"[^\\w]", "\xc3\xa9", 0, 0},
        {"[^\\w]", "-", 0, 1},
        {"[\\s\\S]", "\xc3\xa9", 0, 1},
        {"[\\s\\S]", "\n", 0, 1},
        {"[\\d\\D]+", "\xd9\xa3\xe2\x80\xa8", 0, 1},
        {"a[^\\w\\W]?", "a", 0, 1},
        {"a[^\\w\\W]?", "ab", 0, 0},
        {"[^\\w]", "a", 0, 0},
        {"[^\\w\xc3\xa9]", "-", 0, 1},
        {"[^\\d\xc3\xa9]", "\xc3\xa8", 0, 0},
        {"[^\\s,]", ",", 0, 0},
        {"[^\\s,]", "\xc2\xa0", 0, 0},
        {"[^\\s,]", "a", 0, 1},
        {"[^\\s]", "\x1c", 0, 0}, /* Python's [^\s] excludes it */
        {"[^\\S]", "\x1c", 0, 0}, /* PCRE2's and ECMA's [^\S] exclude it */
        {"[^\\S]", " ", 0, 1},
        {"[^\\S]", "\xc2\xa0", 0, 0},
        {"[^^\\d]", "^", 0, 0},
        {"[^^\\d]", "a", 0, 1},
        {"[^]\\d]", "]", 0, 0},
        {"[^]\\d]", "a", 0, 1},
        {"[^\\]\\W]", "a", 0, 1},
        {"[^\\]\\W]", "]", 0, 0},
        {"[^\\\\\\d]", "a", 0, 1},
        {"[^\\\\\\d]", "\\", 0, 0},
        {"[^[\\s]", "[", 0, 0},
        {"[^[\\s]x", "ax", 0, 1},
        /* a negated class without a shorthand: over all code points */
        {"[^a]", "\xd9\xa3", 0, 1},
        {"[^\"\\\\]", "\xc5\x9f", 0, 1},
        {"[^\\x00-\\x7f]", "\xc2\xa0", 0, 1},
        {".", "\xf4\x8f\xbf\xbf", 0, 1},
        {".", "\xf4\x90\x80\x80", 0, 0},
        {"\\/", "/", 0, 1},
        {"\\v", "\x0b", 0, 1},
        {"\\v", "\n", 0, 0},
        {"\\0", "", 1, 1},
        {"[\\b]", "\b", 0, 1},
        {"(?P<x>a)(?<y>b)(?'z'c)", "abc", 0, 1},
        {"^$", "", 0, 1},
        {"^", "", 0, 1},
        {"$", "", 0, 1},
        {"", "", 0, 1},
        {"", "a", 0, 0},
        {"a|", "", 0, 1},
        {"()", "", 0, 1},
        {"(|a)+", "aa", 0, 1},
        {"((a*)*)*", "aaa", 0, 1},
        {"(a*)+b", "b", 0, 1},
        {"\\$", "$", 0, 1},
        {"[$^]+", "$^", 0, 1},
        {"a{3}", "aaa", 0, 1},
        {"a{3}", "aaaa", 0, 0},
        {"a{2,}", "aaaaaa", 0, 1},
        {"a{2,}", "a", 0, 0},
        {"(ab){1,3}", "ababab", 0, 1},
        {"(ab){1,3}", "abababab", 0, 0},
        {"\\\xc3\xa9", "\xc3\xa9", 0, 1},
    };
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
        pair q;
        pair_open(&q, T[i].re, strlen(T[i].re));
        CHECK(q.ours == 0, "/%s/: %s", T[i].re, q.e.msg);
        size_t n = T[i].slen ? T[i].slen : strlen(T[i].s);
        if (q.ours == 0)
            CHECK(sm_gram_matches(q.g, (const uint8_t *)T[i].s, n) == T[i].want, "/%s/ on \"%s\": wanted %d", T[i].re,
                  show((const uint8_t *)T[i].s, n), T[i].want);
        /* the rewritten pattern PCRE2 gets says the same */
        CHECK(q.pc && oracle(&q, (const uint8_t *)T[i].s, n) == T[i].want, "/%s/ on \"%s\": PCRE2 does not say %d",
              T[i].re, show((const uint8_t *)T[i].s, n), T[i].want);
        pair_close(&q);
    }
    /* an empty language: refused by sm_gram_create, and PCRE2 matches nothing either */
    static const char *empty[] = {"[^\\x00-\\x{10FFFF}]", "a[^\\d\\D]b", "[^\\s\\S]*x[^\\w\\W]"};
    for (size_t i = 0; i < sizeof empty / sizeof *empty; i++) {
        pair q;
        pair_open(&q, empty[i], strlen(empty[i]));
        CHECK(q.ours == -2, "/%s/: %d (%s)", empty[i], q.ours, q.e.msg);
        alpha a;
        alpha_build(&a, empty[i], strlen(empty[i]));
        uint8_t s[64];
        for (int k = 0; k < 200 && q.pc; k++) {
            size_t n = rand_string(&a, s);
            CHECK(oracle(&q, s, n) != 1, "/%s/: PCRE2 matches \"%s\"", empty[i], show(s, n));
        }
        pair_close(&q);
    }
}

/* ---- hostile input ---- */

/* Compile src [len]: 0 or -1 (then e holds a refusal line); the automaton's states in *states. */
static int try_compile(const char *src, size_t len, sm_err *e, int *states) {
    sm_nfa n;
    sm_nfa_init(&n);
    sm_nfa_rule_new(&n);
    sm_frag f;
    int rc = sm_regex_compile(&n, src, len, &f, e);
    *states = n.nstates;
    sm_nfa_free(&n);
    return rc;
}

static void test_hostile(void) {
    size_t big = 200000;
    char *s = malloc(big + 16);
    sm_err e;
    int st;
    if (!s) return;
    /* deep nesting: refused at the first group past the cap, not a stack overflow */
    memset(s, '(', big);
    CHECK(try_compile(s, big, &e, &st) == -1 && refusal_line(&e, big), "100000 '(': %s", e.msg);
    for (int d = 0; d < 2; d++) {
        size_t k = d ? 500 : 150, n = 0;
        for (size_t i = 0; i < k; i++) s[n++] = '(';
        s[n++] = 'a';
        for (size_t i = 0; i < k; i++) s[n++] = ')', s[n++] = '*';
        int rc = try_compile(s, n, &e, &st);
        CHECK(d ? rc == -1 && refusal_line(&e, n) : rc == 0, "%zu nested groups: %d %s", k, rc, e.msg);
    }
    /* huge counts and their products */
    static const char *counts[] = {"a{4294967296}", "a{18446744073709551617,}", "(((a{1000}){1000}){1000}){1000}",
                                   "((\\x{10FFFF}{1000}){1000})*", "[^a]{1000}[^a]{1000}[^a]{1000}"};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        int rc = try_compile(counts[i], strlen(counts[i]), &e, &st);
        CHECK(i == 4 ? rc == 0 : rc == -1 && refusal_line(&e, strlen(counts[i])), "/%s/: %d %s", counts[i], rc, e.msg);
    }
    /* long patterns: a literal, an alternation of many words */
    size_t n = 0;
    for (int i = 0; i < 5000; i++) n += (size_t)snprintf(s + n, 16, "%sw%d", i ? "|" : "", i);
    pair q;
    pair_open(&q, s, n);
    CHECK(q.ours == 0 && sm_gram_matches(q.g, (const uint8_t *)"w4321", 5) && !sm_gram_matches(q.g, (const uint8_t *)"w5000", 5),
          "5000 alternatives: %s", q.e.msg);
    pair_close(&q);
    memset(s, 'x', 3000);
    pair_open(&q, s, 3000);
    CHECK(q.ours == 0 && sm_gram_matches(q.g, (const uint8_t *)s, 3000) && !sm_gram_matches(q.g, (const uint8_t *)s, 2999),
          "3000 literals: %s", q.e.msg);
    pair_close(&q);
    /* random bytes: compiled or refused with one line, never a crash */
    int ok = 0;
    for (int i = 0; i < 3000; i++) {
        size_t len = below(40);
        static const char meta[] = "()[]{}|*+?\\^$.-,:<>=!P0123456789xuabdws";
        for (size_t k = 0; k < len; k++) s[k] = below(3) ? meta[below(sizeof meta - 1)] : (char)below(256);
        int rc = try_compile(s, len, &e, &st);
        if (!rc) ok++;
        else CHECK(refusal_line(&e, len), "random bytes \"%s\": \"%s\"", show((const uint8_t *)s, len), e.msg);
    }
    printf("  3000 random byte patterns: %d compiled\n", ok);
    free(s);
}

int main(void) {
    cctx = pcre2_compile_context_create(NULL);
    mctx = pcre2_match_context_create(NULL);
    pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
    pcre2_set_match_limit(mctx, 200000);
    RUN(test_semantics);
    RUN(test_fixed_list);
    RUN(test_random_regexes);
    RUN(test_metachar_soup);
    RUN(test_refusals);
    RUN(test_hostile);
    printf("  %ld strings compared (%ld of them found by walks, %ld of those valid under Unicode \\d \\w \\s), %ld mismatches, "
           "%ld left to PCRE2's match limit\n",
           n_cmp, n_walk, n_uni, n_bad, n_skip);
    pcre2_match_context_free(mctx);
    pcre2_compile_context_free(cctx);
    return TEST_DONE();
}
