/* jinja_lex.c: a chat template's source into tokens (see jinja_int.h), with Jinja2's
 * whitespace rules as transformers sets them: trim_blocks (the first newline after a block or
 * comment tag is dropped; "+%}" keeps it), lstrip_blocks (spaces and tabs from a line's start to
 * a block or comment tag are dropped; "{%+" keeps them), "-" at a tag's edge strips all whitespace on
 * that side, newlines normalized to "\n", one trailing newline of the template dropped; the
 * text between "{% raw %}" and "{% endraw %}" kept as it is.
 *
 * Text is cut at tags first and each tag's inside tokenized on its own, so a tag's end is
 * found by scanning its tokens (a "}}" inside a string or dict literal does not end it).  We
 * rejected a regex-driven lexer like Jinja2's: its rules are spread over a dozen patterns,
 * and a plain scan states them once.
 */
#include "jinja/jinja_int.h"
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    const char *s;             /* normalized source [n] */
    size_t n;
    jtoken *t;                 /* [nt] tokens so far */
    int nt, cap;
    sm_err *e;
} lexer;

static void pos_of(const lexer *L, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < L->n; i++) {
        if (L->s[i] == '\n') { ++*line; *col = 1; }
        else if (((unsigned char)L->s[i] & 0xC0) != 0x80) ++*col;
    }
}

static int lerr(lexer *L, size_t at, const char *msg, const char *arg) {
    int line, col;
    pos_of(L, at, &line, &col);
    return sm_errf(L->e, "line %d col %d: %s%s", line, col, msg, arg ? arg : "");
}

static jtoken *push(lexer *L, int kind, const char *s, size_t n, size_t at) {
    if (L->nt == L->cap) {
        int nc = L->cap ? L->cap * 2 : 256;
        jtoken *nt = realloc(L->t, sizeof *nt * (size_t)nc);
        if (!nt) return NULL;
        L->t = nt;
        L->cap = nc;
    }
    jtoken *k = &L->t[L->nt];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->s = malloc(n + 1);
    if (!k->s) return NULL;
    memcpy(k->s, s, n);
    k->s[n] = 0;
    k->n = n;
    pos_of(L, at, &k->line, &k->col);
    L->nt++;
    return k;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* A string literal at s[*p] (the quote): its decoded bytes, *p past the closing quote. */
static int lex_string(lexer *L, size_t *p, size_t end) {
    char q = L->s[*p];
    size_t start = *p;
    char *buf = malloc(end - start + 1);
    if (!buf) return sm_errf(L->e, "out of memory");
    size_t k = 0, i = start + 1;
    for (; i < end && L->s[i] != q; i++) {
        char ch = L->s[i];
        if (ch != '\\' || i + 1 >= end) { buf[k++] = ch; continue; }
        char x = L->s[++i];
        switch (x) {
        case 'n': buf[k++] = '\n'; break;
        case 't': buf[k++] = '\t'; break;
        case 'r': buf[k++] = '\r'; break;
        case '\\': case '\'': case '"': buf[k++] = x; break;
        case 'a': buf[k++] = '\a'; break;
        case 'b': buf[k++] = '\b'; break;
        case 'f': buf[k++] = '\f'; break;
        case 'v': buf[k++] = '\v'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': { /* a code point: 2, 4 or 8 hex digits, as UTF-8 */
            int nd = x == 'x' ? 2 : x == 'u' ? 4 : 8;
            unsigned long cp = 0;
            for (int d = 0; d < nd; d++) {
                char h = i + 1 < end ? L->s[i + 1] : 0;
                if (!isxdigit((unsigned char)h)) { free(buf); return lerr(L, i, "bad \\x / \\u escape in a string literal", NULL); }
                cp = cp * 16 + (unsigned long)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
                i++;
            }
            if (cp > 0x10FFFF) { free(buf); return lerr(L, i, "escape beyond U+10FFFF in a string literal", NULL); }
            int nb = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; /* UTF-8: lead byte, then 6 bits each */
            static const unsigned char lead[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
            for (int b = nb - 1; b > 0; b--) buf[k + b] = (char)(0x80 | ((cp >> (6 * (nb - 1 - b))) & 63));
            buf[k] = (char)(lead[nb] | (cp >> (6 * (nb - 1))));
            k += (size_t)nb;
            break;
        }
        default:
            if (x >= '0' && x <= '7') { /* up to 3 octal digits */
                int v = x - '0';
                for (int d = 0; d < 2 && i + 1 < end && L->s[i + 1] >= '0' && L->s[i + 1] <= '7'; d++) v = v * 8 + (L->s[++i] - '0');
                buf[k++] = (char)v;
            } else { buf[k++] = '\\'; buf[k++] = x; } /* Python keeps unknown escapes */
            break;
        }
    }
    if (i >= end) { free(buf); return lerr(L, start, "unterminated string literal", NULL); }
    jtoken *t = push(L, JT_STR, buf, k, start);
    free(buf);
    if (!t) return sm_errf(L->e, "out of memory");
    *p = i + 1;
    return 0;
}

static const char *OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                            ".", ",", ":", "|", "(", ")", "[", "]", "{", "}"};

/* Tokens of a tag's inside from *p; stops at the tag's end ("}}" for a variable tag, "%}"
 * for a block), optionally preceded by "-" or "+".  *p past the end; *strip_after when "-",
 * *keep_newline when "+" (no trim_blocks for this tag). */
static int lex_tag(lexer *L, size_t *p, int var, int *strip_after, int *keep_newline) {
    int depth = 0;
    size_t i = *p, open = *p - 2;
    const char *endm = var ? "}}" : "%}";
    while (1) {
        while (i < L->n && is_ws(L->s[i])) i++;
        if (i >= L->n) return lerr(L, open, var ? "'{{' is never closed" : "'{%' is never closed", NULL);
        if (depth == 0 && L->s[i] == '-' && i + 2 < L->n + 0 && !strncmp(L->s + i + 1, endm, 2)) {
            *strip_after = 1;
            i += 3;
            break;
        }
        if (depth == 0 && L->s[i] == '+' && !strncmp(L->s + i + 1, endm, 2)) {
            *keep_newline = 1;
            i += 3;
            break;
        }
        if (depth == 0 && !strncmp(L->s + i, endm, 2)) { i += 2; break; }
        char ch = L->s[i];
        if (ch == '\'' || ch == '"') {
            if (lex_string(L, &i, L->n)) return -1;
        } else if (isalpha((unsigned char)ch) || ch == '_') {
            size_t b = i;
            while (i < L->n && (isalnum((unsigned char)L->s[i]) || L->s[i] == '_')) i++;
            if (!push(L, JT_NAME, L->s + b, i - b, b)) return sm_errf(L->e, "out of memory");
        } else if (ch == '0' && i + 2 < L->n && strchr("xXoObB", L->s[i + 1]) && isxdigit((unsigned char)L->s[i + 2])) {
            size_t b = i; /* 0x1F, 0o17, 0b101 (underscores between digits) */
            int base = L->s[i + 1] == 'x' || L->s[i + 1] == 'X' ? 16 : L->s[i + 1] == 'o' || L->s[i + 1] == 'O' ? 8 : 2;
            unsigned long long v = 0;
            for (i += 2; i < L->n && (isxdigit((unsigned char)L->s[i]) || L->s[i] == '_'); i++) {
                if (L->s[i] == '_') continue;
                int d = isdigit((unsigned char)L->s[i]) ? L->s[i] - '0' : tolower((unsigned char)L->s[i]) - 'a' + 10;
                if (d >= base) return lerr(L, b, "bad digit in an integer literal", NULL);
                if (v > (9223372036854775807ull - (unsigned)d) / (unsigned)base) return lerr(L, b, "integer literal beyond 64 bits", NULL);
                v = v * (unsigned)base + (unsigned)d;
            }
            jtoken *t = push(L, JT_INT, L->s + b, i - b, b);
            if (!t) return sm_errf(L->e, "out of memory");
            t->i = (long long)v;
        } else if (isdigit((unsigned char)ch)) {
            size_t b = i;
            int fl = 0;
            while (i < L->n && (isdigit((unsigned char)L->s[i]) || L->s[i] == '_')) i++;
            if (i + 1 < L->n && L->s[i] == '.' && isdigit((unsigned char)L->s[i + 1])) {
                fl = 1;
                for (i++; i < L->n && isdigit((unsigned char)L->s[i]); i++) {}
            }
            if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
                size_t k = i + 1;
                if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
                if (k < L->n && isdigit((unsigned char)L->s[k])) {
                    fl = 1;
                    for (i = k; i < L->n && isdigit((unsigned char)L->s[i]); i++) {}
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t j = b; j < i && k < sizeof num - 1; j++)
                if (L->s[j] != '_') num[k++] = L->s[j];
            num[k] = 0;
            jtoken *t = push(L, fl ? JT_FLOAT : JT_INT, L->s + b, i - b, b);
            if (!t) return sm_errf(L->e, "out of memory");
            if (fl) t->f = strtod(num, NULL);
            else {
                errno = 0;
                t->i = strtoll(num, NULL, 10);
                if (errno == ERANGE) return lerr(L, b, "integer literal beyond 64 bits: ", num);
            }
        } else {
            size_t len = 0;
            for (size_t o = 0; o < sizeof OPS / sizeof OPS[0] && !len; o++)
                if (!strncmp(L->s + i, OPS[o], strlen(OPS[o]))) len = strlen(OPS[o]);
            if (!len) {
                char b[8];
                snprintf(b, sizeof b, "%c'", ch);
                return lerr(L, i, "unexpected character '", b);
            }
            if (L->s[i] == '(' || L->s[i] == '[' || L->s[i] == '{') depth++;
            if ((L->s[i] == ')' || L->s[i] == ']' || L->s[i] == '}') && depth > 0) depth--;
            if (!push(L, JT_OP, L->s + i, len, i)) return sm_errf(L->e, "out of memory");
            i += len;
        }
    }
    *p = i;
    return 0;
}

/* The end of a tag at s[i] after optional spaces: "%}", "-%}" or "+%}"; its length (0: none),
 * *mod the '-' or '+' (0: none). */
static size_t tag_close(const lexer *L, size_t i, char *mod) {
    size_t b = i;
    while (i < L->n && is_ws(L->s[i])) i++;
    *mod = 0;
    if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) *mod = L->s[i++];
    if (i + 2 <= L->n && L->s[i] == '%' && L->s[i + 1] == '}') return i + 2 - b;
    return 0;
}

/* At *p, just inside "{%" (and its modifier): when the tag is "raw", push the text up to
 * "{% endraw %}" unchanged but for the tags' whitespace control ("-" strips, lstrip_blocks
 * before endraw) and move *p past that tag (trim_blocks: one newline after it; "-": *strip_next).  1 done, 0 not
 * a raw tag, -1 error. */
static int raw_block(lexer *L, size_t *p, int *strip_next) {
    size_t i = *p, open = *p;
    while (i < L->n && is_ws(L->s[i])) i++;
    if (L->n - i < 3 || strncmp(L->s + i, "raw", 3) || (i + 3 < L->n && (isalnum((unsigned char)L->s[i + 3]) || L->s[i + 3] == '_')))
        return 0;
    char mod;
    size_t k = tag_close(L, i + 3, &mod);
    if (!k) return 0;
    size_t b = i + 3 + k; /* the raw text starts here (no trim_blocks after "raw %}", as in Jinja2) */
    if (mod == '-') while (b < L->n && is_ws(L->s[b])) b++;
    for (size_t t = b; t + 1 < L->n; t++) {
        if (L->s[t] != '{' || L->s[t + 1] != '%') continue;
        size_t j = t + 2;
        char lm = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) lm = L->s[j++];
        while (j < L->n && is_ws(L->s[j])) j++;
        if (L->n - j < 6 || strncmp(L->s + j, "endraw", 6)) continue;
        size_t c = tag_close(L, j + 6, &mod);
        if (!c) continue;
        size_t te = t;
        if (lm == '-') while (te > b && is_ws(L->s[te - 1])) te--;
        else if (lm != '+') { /* lstrip_blocks: the spaces from the line's start to "{% endraw" */
            size_t ls = te;
            while (ls > b && (L->s[ls - 1] == ' ' || L->s[ls - 1] == '\t')) ls--;
            if ((ls > b && L->s[ls - 1] == '\n') || (ls == b && (b == 0 || L->s[b - 1] == '\n'))) te = ls;
        }
        if (te > b && !push(L, JT_TEXT, L->s + b, te - b, b)) return sm_errf(L->e, "out of memory");
        *p = j + 6 + c;
        *strip_next = mod == '-';
        if (!mod && *p < L->n && L->s[*p] == '\n') ++*p; /* trim_blocks */
        return 1;
    }
    return lerr(L, open, "'{% raw %}' is never closed by '{% endraw %}'", NULL);
}

int sm_jinja_lex(const char *src, size_t n, jtoken **out, int *nout, sm_err *e) {
    lexer L = {0};
    L.e = e;
    char *s = malloc(n + 1);
    if (!s) return sm_errf(e, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) { /* newlines to "\n" */
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else s[m++] = src[i];
    }
    if (m && s[m - 1] == '\n') m--; /* keep_trailing_newline=False */
    s[m] = 0;
    L.s = s;
    L.n = m;
    size_t p = 0;
    int strip_next = 0, rc = -1;
    while (1) {
        size_t t = p;
        const char *hit = NULL;
        for (; t + 1 < m; t++)
            if (s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) { hit = s + t; break; }
        if (!hit) t = m;
        size_t tb = p, te = t; /* the text before the tag */
        if (strip_next) while (tb < te && is_ws(s[tb])) tb++;
        strip_next = 0;
        char kind = hit ? hit[1] : 0, mod = hit && t + 2 < m ? s[t + 2] : 0;
        if (hit && mod == '-') {
            while (te > tb && is_ws(s[te - 1])) te--;
        } else if (hit && kind != '{' && mod != '+') { /* lstrip_blocks */
            size_t ls = te;
            while (ls > tb && (s[ls - 1] == ' ' || s[ls - 1] == '\t')) ls--;
            if ((ls > tb && s[ls - 1] == '\n') || (ls == tb && (tb == 0 || s[tb - 1] == '\n'))) te = ls;
        }
        if (te > tb && !push(&L, JT_TEXT, s + tb, te - tb, tb)) { sm_errf(e, "out of memory"); goto out; }
        if (!hit) break;
        p = t + 2 + (mod == '-' || mod == '+');
        if (kind == '#') {
            const char *c = strstr(s + p, "#}");
            if (!c) { lerr(&L, t, "'{#' comment is never closed", NULL); goto out; }
            strip_next = c > s + p && c[-1] == '-';
            p = (size_t)(c - s) + 2;
            if (!strip_next && p < m && s[p] == '\n') p++; /* trim_blocks */
            continue;
        }
        if (kind == '%') { /* {% raw %}: the text up to {% endraw %} as it is */
            int r = raw_block(&L, &p, &strip_next);
            if (r < 0) goto out;
            if (r > 0) continue;
        }
        if (!push(&L, kind == '{' ? JT_VBEGIN : JT_BBEGIN, s + t, 2, t)) { sm_errf(e, "out of memory"); goto out; }
        int keep = 0;
        if (lex_tag(&L, &p, kind == '{', &strip_next, &keep)) goto out;
        if (!push(&L, kind == '{' ? JT_VEND : JT_BEND, "", 0, p - 2)) { sm_errf(e, "out of memory"); goto out; }
        if (kind == '%' && !strip_next && !keep && p < m && s[p] == '\n') p++; /* trim_blocks */
    }
    if (!push(&L, JT_EOF, "", 0, m)) { sm_errf(e, "out of memory"); goto out; }
    rc = 0;
out:
    free(s);
    if (rc) {
        sm_jinja_tokens_free(L.t, L.nt);
        return -1;
    }
    *out = L.t;
    *nout = L.nt;
    return 0;
}

void sm_jinja_tokens_free(jtoken *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].s);
    free(t);
}
