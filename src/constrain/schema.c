/* schema.c: a JSON Schema compiled to the rules of a pushdown NFA (schema.h).
 *
 * The schema is parsed with jansson and walked twice.  The first walk checks every schema
 * object in the document, used or not, keyword by keyword (an unknown keyword, a value of the
 * wrong type, an unknown format or a bad pattern is a one-line refusal naming it and its JSON
 * pointer).  The second, top down from the root, makes each schema a Thompson fragment of the
 * JSON text it admits, printed compactly (or with optional whitespace between tokens) in the
 * schema's property order.  Rules (nfa.h calls) are used where a fragment would otherwise be built more
 * than once or must be recursive: every $ref target (compiled once, so a recursive $ref is a
 * rule calling itself), the generic JSON value of {} / true, the items schema of a bounded
 * array, and one string character of a counted string.  Numbers with bounds are built in
 * schema_num.c.  Objects use two chains of states, "nothing printed yet" and "something
 * printed", so a "," stands exactly between present properties whatever optional ones are
 * left out, and each property value is built once.
 *
 * The rule everywhere: what is printed is valid under the schema as a reference validator
 * (python-jsonschema, Draft 2020-12) reads it; a restriction of the printed form is fine (no
 * exponent in bounded numbers, no escapes in extra property names), a relaxation never is, so
 * anything that cannot be compiled exactly is refused (oneOf whose branches might overlap,
 * allOf of several schemas, keywords next to $ref / anyOf / enum that would have to be
 * intersected).
 *
 * We rejected compiling the schema to a regex text and handing it to regex.c: recursion
 * ($ref, nested {}) is not regular, and a text round trip loses the pointers that make the
 * refusals precise.  We rejected a DFA per object: properties x values multiply.
 */
#include "constrain/schema.h"
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "constrain/regex.h"

#define MAX_DEPTH 128          /* schemas nested in schemas */
#define MAX_ITEMS 1000         /* largest minItems / maxItems */
#define MAX_LENGTH 10000       /* largest minLength / maxLength */
#define MAX_PRODUCT (1 << 20)  /* states of a pattern counted by minLength / maxLength */

/* schema_num.c */
int sm_schema_number(sm_nfa *n, const json_t *s, int integer, sm_frag *out, const char **which);

/* JSON types as bits ("number" is T_INT | T_NUM: integers and the rest). */
enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_NUM = 64, T_ALL = 127 };

/* Keyword kinds: what a value must be, and whether the keyword asserts anything. */
enum { K_ANNOT, K_TEXT, K_FLAG, K_EXAMPLES, K_DEFS, K_NULLABLE, K_TYPE, K_PROPS, K_STRINGS, K_SCHEMA,
       K_LIST, K_ENUM, K_ANY, K_COUNT, K_STRING, K_NUMBER };

typedef struct kw_t {
    const char *name;
    int kind;
    int types;           /* the type the keyword implies when "type" is absent */
} kw_t;

static const kw_t KW[] = {
    {"title", K_TEXT, 0}, {"description", K_TEXT, 0}, {"$schema", K_TEXT, 0}, {"$id", K_TEXT, 0},
    {"default", K_ANNOT, 0}, {"examples", K_EXAMPLES, 0}, {"$comment", K_TEXT, 0}, {"readOnly", K_FLAG, 0},
    {"writeOnly", K_FLAG, 0}, {"deprecated", K_FLAG, 0},
    {"$defs", K_DEFS, 0}, {"definitions", K_DEFS, 0}, {"nullable", K_NULLABLE, 0},
    {"type", K_TYPE, 0},
    {"properties", K_PROPS, T_OBJ}, {"required", K_STRINGS, T_OBJ}, {"additionalProperties", K_SCHEMA, T_OBJ},
    {"items", K_SCHEMA, T_ARR}, {"prefixItems", K_LIST, T_ARR}, {"minItems", K_COUNT, T_ARR},
    {"maxItems", K_COUNT, T_ARR},
    {"minLength", K_COUNT, T_STR}, {"maxLength", K_COUNT, T_STR}, {"pattern", K_STRING, T_STR},
    {"format", K_STRING, T_STR},
    {"minimum", K_NUMBER, T_INT | T_NUM}, {"maximum", K_NUMBER, T_INT | T_NUM},
    {"exclusiveMinimum", K_NUMBER, T_INT | T_NUM}, {"exclusiveMaximum", K_NUMBER, T_INT | T_NUM},
    {"enum", K_ENUM, 0}, {"const", K_ANY, 0},
    {"anyOf", K_LIST, 0}, {"oneOf", K_LIST, 0}, {"allOf", K_LIST, 0}, {"$ref", K_STRING, 0},
};
#define NKW ((int)(sizeof KW / sizeof KW[0]))

static const char *TYPES[] = {"null", "boolean", "object", "array", "string", "integer", "number"};
static const int TYPE_BITS[] = {T_NULL, T_BOOL, T_OBJ, T_ARR, T_STR, T_INT, T_INT | T_NUM};

/* The regexes of the supported formats (regex.h syntax; RFC 3339 dates with leap years exact,
 * seconds 00-59, upper-case T and Z). */
#define YEAR "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
#define LEAP "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
#define MDAY "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)" \
             "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
#define DATE "(?:" YEAR "-" MDAY "|" LEAP "-02-29)"
#define TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+\\-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define HEX "[0-9a-fA-F]"
#define OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define LABEL "[A-Za-z0-9](?:[A-Za-z0-9\\-]*[A-Za-z0-9])?"
static const struct { const char *name, *re; } FORMATS[] = {
    {"date", DATE},
    {"time", TIME},
    {"date-time", DATE "T" TIME},
    {"uuid", HEX "{8}-" HEX "{4}-" HEX "{4}-" HEX "{4}-" HEX "{12}"},
    {"email", "[A-Za-z0-9_%+\\-]+(?:\\.[A-Za-z0-9_%+\\-]+)*@(?:" LABEL "\\.)+[A-Za-z]{2,}"},
    {"ipv4", OCTET "\\." OCTET "\\." OCTET "\\." OCTET},
};

/* A $ref target: the schema, its rule, and its pointer (for messages). */
typedef struct ref_t {
    const json_t *target;
    int rule;
    const char *ptr;
} ref_t;

typedef struct cx {
    sm_nfa *n;
    json_t *root;
    int ws;              /* optional whitespace between tokens */
    sm_err *e;
    ref_t *refs;         /* [nrefs] targets seen; compiled in order after the root */
    int nrefs, cap_refs;
    char **strs;         /* [nstrs] pointer strings owned here */
    int nstrs, cap_strs;
    int r_value;         /* rule: any JSON value, -1 until made */
    int r_char;          /* rule: one character of a JSON string, -1 until made */
    int depth;
} cx;

static int sch(cx *c, const json_t *s, const char *p, sm_frag *out);

/* ---- messages and pointers ------------------------------------------------------------------- */

/* Format the one-line refusal (control bytes of names become '?') and return -1. */
__attribute__((format(printf, 2, 3))) static int fail(cx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->e->msg, sizeof c->e->msg, fmt, ap);
    va_end(ap);
    for (char *q = c->e->msg; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7F) *q = '?';
    return -1;
}

static const char *at(const char *p) { return *p ? p : "the root"; }

/* Keep string s (malloc'd) until the end of the compile; s, or a placeholder on failure. */
static const char *own(cx *c, char *s) {
    if (!s) return "(?)";
    if (c->nstrs == c->cap_strs) {
        int cap = c->cap_strs ? 2 * c->cap_strs : 64;
        char **t = realloc(c->strs, sizeof(char *) * (size_t)cap);
        if (!t) { free(s); return "(?)"; }
        c->strs = t;
        c->cap_strs = cap;
    }
    c->strs[c->nstrs++] = s;
    return s;
}

/* The pointer base/tok (tok escaped: ~ as ~0, / as ~1). */
static const char *pj(cx *c, const char *base, const char *tok) {
    size_t nb = strlen(base), nt = strlen(tok);
    char *s = malloc(nb + 2 * nt + 2);
    if (!s) return "(?)";
    memcpy(s, base, nb);
    size_t k = nb;
    s[k++] = '/';
    for (size_t i = 0; i < nt; i++) {
        if (tok[i] == '~' || tok[i] == '/') { s[k++] = '~'; s[k++] = tok[i] == '~' ? '0' : '1'; }
        else s[k++] = tok[i];
    }
    s[k] = 0;
    return own(c, s);
}

/* The pointer base/kw/i. */
static const char *pji(cx *c, const char *base, const char *kw, size_t i) {
    char num[32];
    snprintf(num, sizeof num, "%zu", i);
    return pj(c, pj(c, base, kw), num);
}

/* ---- keyword checks -------------------------------------------------------------------------- */

static const kw_t *kw_find(const char *name) {
    for (int i = 0; i < NKW; i++)
        if (!strcmp(KW[i].name, name)) return &KW[i];
    return NULL;
}

static int is_schema(const json_t *v) { return json_is_object(v) || json_is_boolean(v); }

/* The type bits of a "type" value, 0 when it is malformed (*bad: the unknown name, if any). */
static int type_bits(const json_t *t, const char **bad) {
    *bad = NULL;
    if (json_is_string(t)) {
        for (int i = 0; i < 7; i++)
            if (!strcmp(json_string_value(t), TYPES[i])) return TYPE_BITS[i];
        *bad = json_string_value(t);
        return 0;
    }
    if (!json_is_array(t) || !json_array_size(t)) return 0;
    int m = 0;
    size_t i;
    json_t *v;
    json_array_foreach(t, i, v) {
        int b = json_is_string(v) ? type_bits(v, bad) : 0;
        if (!b) return 0;
        m |= b;
    }
    return m;
}

/* 1 when every element of array a is a schema (and a is a non-empty array). */
static int schema_list(const json_t *a) {
    if (!json_is_array(a) || !json_array_size(a)) return 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (!is_schema(v)) return 0;
    return 1;
}

/* Check the value of keyword k (kind kind) of the schema at p. */
static int check_value(cx *c, const char *k, int kind, const json_t *v, const char *p) {
    const char *bad, *key;
    json_t *x;
    switch (kind) {
    case K_TYPE:
        if (type_bits(v, &bad)) return 0;
        if (bad) return fail(c, "schema: unknown type '%s' in 'type' at %s", bad, at(p));
        return fail(c, "schema: 'type' must be a type name or a non-empty list of them at %s", at(p));
    case K_DEFS:
    case K_PROPS:
        if (!json_is_object(v)) return fail(c, "schema: '%s' must be an object of schemas at %s", k, at(p));
        json_object_foreach((json_t *)v, key, x)
            if (!is_schema(x)) return fail(c, "schema: '%s' must be an object of schemas at %s", k, at(pj(c, p, k)));
        return 0;
    case K_STRINGS: {
        size_t i;
        if (!json_is_array(v)) return fail(c, "schema: '%s' must be a list of strings at %s", k, at(p));
        json_array_foreach(v, i, x) if (!json_is_string(x)) return fail(c, "schema: '%s' must be a list of strings at %s", k, at(p));
        return 0;
    }
    case K_SCHEMA:
        if (!strcmp(k, "items") && json_is_array(v))
            return fail(c, "schema: 'items' as a list (the old tuple form) is not supported at %s: use prefixItems", at(p));
        return is_schema(v) ? 0 : fail(c, "schema: '%s' must be a schema (an object or a boolean) at %s", k, at(p));
    case K_LIST:
        return schema_list(v) ? 0 : fail(c, "schema: '%s' must be a non-empty list of schemas at %s", k, at(p));
    case K_ENUM:
        return json_is_array(v) && json_array_size(v) ? 0 : fail(c, "schema: 'enum' must be a non-empty list at %s", at(p));
    case K_COUNT: /* 2.0 is an integer too */
        return json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) == floor(json_number_value(v))
                   ? 0 : fail(c, "schema: '%s' must be a non-negative integer at %s", k, at(p));
    case K_STRING:
        return json_is_string(v) ? 0 : fail(c, "schema: '%s' must be a string at %s", k, at(p));
    case K_NUMBER:
        return json_is_number(v) ? 0 : fail(c, "schema: '%s' must be a number at %s", k, at(p));
    case K_NULLABLE:
    case K_FLAG:
        return json_is_boolean(v) ? 0 : fail(c, "schema: '%s' must be a boolean at %s", k, at(p));
    case K_TEXT:
        return json_is_string(v) ? 0 : fail(c, "schema: '%s' must be a string at %s", k, at(p));
    case K_EXAMPLES:
        return json_is_array(v) ? 0 : fail(c, "schema: 'examples' must be a list at %s", at(p));
    default:
        return 0;
    }
}

/* Check every keyword of schema object s: known, and of the right value type. */
static int check_keywords(cx *c, const json_t *s, const char *p) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        const kw_t *w = kw_find(k);
        if (!w) return fail(c, "schema: unsupported keyword '%s' at %s", k, at(p));
        if (check_value(c, k, w->kind, v, p)) return -1;
    }
    return 0;
}

static const char *format_re(const char *name);

/* Check schema s and every schema inside it (used or not, so a malformed or unsupported part
 * is refused wherever it is): keywords, value types, formats and pattern regexes. */
static int check_tree(cx *c, const json_t *s, const char *p, int depth) {
    if (!json_is_object(s)) return 0; /* a boolean; any other value was refused by the parent */
    if (depth >= MAX_DEPTH) return fail(c, "schema: nested deeper than %d at %s", MAX_DEPTH, at(p));
    if (check_keywords(c, s, p)) return -1;
    const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    if (fmt && !format_re(json_string_value(fmt)))
        return fail(c, "schema: unsupported format '%s' at %s", json_string_value(fmt), at(p));
    if (pat) {
        sm_nfa r;
        sm_frag f;
        sm_err re;
        sm_nfa_init(&r);
        int rc = sm_regex_compile(&r, json_string_value(pat), strlen(json_string_value(pat)), &f, &re);
        sm_nfa_free(&r);
        if (rc) return fail(c, "schema: pattern at %s: %s", at(p), re.msg);
    }
    const char *k, *name;
    json_t *v, *x;
    json_object_foreach((json_t *)s, k, v) {
        const kw_t *w = kw_find(k);
        size_t i;
        if (w->kind == K_PROPS || w->kind == K_DEFS) {
            json_object_foreach(v, name, x) if (check_tree(c, x, pj(c, pj(c, p, k), name), depth + 1)) return -1;
        } else if (w->kind == K_SCHEMA) {
            if (check_tree(c, v, pj(c, p, k), depth + 1)) return -1;
        } else if (w->kind == K_LIST) {
            json_array_foreach(v, i, x) if (check_tree(c, x, pji(c, p, k, i), depth + 1)) return -1;
        }
    }
    return 0;
}

/* 1 when keyword k asserts something (not an annotation, a container of $defs or nullable). */
static int asserts(const char *k) {
    const kw_t *w = kw_find(k);
    return w && w->kind != K_ANNOT && w->kind != K_TEXT && w->kind != K_FLAG && w->kind != K_EXAMPLES &&
           w->kind != K_DEFS && w->kind != K_NULLABLE;
}

/* Refuse an asserting keyword of s next to main other than those in the NULL-ended allow. */
static int only_with(cx *c, const json_t *s, const char *p, const char *main, const char *const *allow) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (!asserts(k) || !strcmp(k, main)) continue;
        int ok = 0;
        for (int i = 0; allow && allow[i]; i++) ok |= !strcmp(k, allow[i]);
        if (!ok) return fail(c, "schema: '%s' next to '%s' is not supported at %s", k, main, at(p));
    }
    return 0;
}

/* ---- small fragments ------------------------------------------------------------------------- */

/* Optional whitespace (any_whitespace), else nothing. */
static sm_frag ws(cx *c) {
    sm_nfa *n = c->n;
    if (!c->ws) return sm_frag_empty(n);
    sm_frag w = sm_frag_alt(n, sm_frag_alt(n, sm_frag_range(n, ' ', ' '), sm_frag_range(n, '\t', '\n')),
                            sm_frag_range(n, '\r', '\r'));
    return sm_frag_star(n, w);
}

static sm_frag lit(cx *c, const char *s) { return sm_frag_lit(c->n, s, (int)strlen(s)); }

/* A separator or bracket token: ws tok ws, "{" ws, ws "}". */
static sm_frag sep(cx *c, const char *tok) { return sm_frag_cat(c->n, sm_frag_cat(c->n, ws(c), lit(c, tok)), ws(c)); }
static sm_frag open_tok(cx *c, const char *tok) { return sm_frag_cat(c->n, lit(c, tok), ws(c)); }
static sm_frag close_tok(cx *c, const char *tok) { return sm_frag_cat(c->n, ws(c), lit(c, tok)); }

/* A growable byte buffer. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + len + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

/* The JSON escape of byte ch into e (no quotes): \" \\ \b \f \n \r \t or \u00xx; 0 when the
 * byte is printed as it is. */
static int esc(unsigned ch, char *e) {
    static const char *shortf = "\b\\b\f\\f\n\\n\r\\r\t\\t";
    if (ch == '"' || ch == '\\') { e[0] = '\\'; e[1] = (char)ch; e[2] = 0; return 1; }
    if (ch >= 0x20) return 0;
    for (int i = 0; shortf[i]; i += 3)
        if ((unsigned char)shortf[i] == ch) { memcpy(e, shortf + i + 1, 2); e[2] = 0; return 1; }
    snprintf(e, 8, "\\u%04x", ch);
    return 1;
}

/* The JSON string literal of s [len]. */
static sm_frag lit_str(cx *c, const char *s, size_t len) {
    buf b = {0};
    put(&b, "\"", 1);
    for (size_t i = 0; i < len; i++) {
        char e[8];
        if (esc((unsigned char)s[i], e)) put(&b, e, strlen(e));
        else put(&b, s + i, 1);
    }
    put(&b, "\"", 1);
    sm_frag f = b.p ? sm_frag_lit(c->n, b.p, (int)b.n) : sm_frag_none(c->n);
    free(b.p);
    return f;
}

/* A real printed with the fewest digits that read back as it, with a '.' or an exponent. */
static void real_text(double x, char *out, size_t cap) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, x);
        if (strtod(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".eE")) strncat(out, ".0", cap - strlen(out) - 1);
}

/* One JSON value v, printed (ws between its tokens). */
static sm_frag value_lit(cx *c, const json_t *v) {
    sm_nfa *n = c->n;
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        sm_frag f = open_tok(c, "{");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) f = sm_frag_cat(n, f, sep(c, ","));
            first = 0;
            f = sm_frag_cat(n, f, lit_str(c, k, strlen(k)));
            f = sm_frag_cat(n, sm_frag_cat(n, f, sep(c, ":")), value_lit(c, x));
        }
        return sm_frag_cat(n, f, close_tok(c, "}"));
    }
    case JSON_ARRAY: {
        sm_frag f = open_tok(c, "[");
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            if (i) f = sm_frag_cat(n, f, sep(c, ","));
            f = sm_frag_cat(n, f, value_lit(c, x));
        }
        return sm_frag_cat(n, f, close_tok(c, "]"));
    }
    case JSON_STRING:
        return lit_str(c, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
        return lit(c, num);
    case JSON_REAL:
        real_text(json_real_value(v), num, sizeof num);
        return lit(c, num);
    case JSON_TRUE:
        return lit(c, "true");
    case JSON_FALSE:
        return lit(c, "false");
    default:
        return lit(c, "null");
    }
}

/* ---- strings --------------------------------------------------------------------------------- */

/* One hex digit; a \u code unit that is not a surrogate (a pair would be one character to a
 * validator but two escapes here, so counts could disagree). */
static sm_frag hex(sm_nfa *n) {
    return sm_frag_alt(n, sm_frag_alt(n, sm_frag_range(n, '0', '9'), sm_frag_range(n, 'A', 'F')), sm_frag_range(n, 'a', 'f'));
}
static sm_frag unit_hex(sm_nfa *n) {
    sm_frag first = sm_frag_alt(n, sm_frag_alt(n, sm_frag_range(n, '0', '9'), sm_frag_range(n, 'A', 'C')),
                                sm_frag_alt(n, sm_frag_range(n, 'a', 'c'), sm_frag_alt(n, sm_frag_range(n, 'E', 'F'),
                                                                                  sm_frag_range(n, 'e', 'f'))));
    sm_frag a = sm_frag_cat(n, sm_frag_cat(n, first, hex(n)), sm_frag_cat(n, hex(n), hex(n)));
    sm_frag d = sm_frag_alt(n, sm_frag_range(n, 'D', 'D'), sm_frag_range(n, 'd', 'd'));
    sm_frag b = sm_frag_cat(n, sm_frag_cat(n, d, sm_frag_range(n, '0', '7')), sm_frag_cat(n, hex(n), hex(n)));
    return sm_frag_alt(n, a, b);
}

/* A code point printed as it is inside a JSON string: >= 0x20, not " or \. */
static sm_frag raw_char(sm_nfa *n) {
    return sm_frag_alt(n, sm_frag_alt(n, sm_frag_utf8(n, 0x20, 0x21), sm_frag_utf8(n, 0x23, 0x5B)),
                       sm_frag_utf8(n, 0x5D, 0x10FFFF));
}

/* One character of a JSON string: a raw code point or one escape. */
static sm_frag json_char(cx *c) {
    sm_nfa *n = c->n;
    static const char simple[] = "\"\\/bfnrt";
    sm_frag e = sm_frag_cat(n, lit(c, "u"), unit_hex(n));
    for (int i = 0; simple[i]; i++) e = sm_frag_alt(n, e, sm_frag_range(n, (uint8_t)simple[i], (uint8_t)simple[i]));
    return sm_frag_alt(n, raw_char(n), sm_frag_cat(n, lit(c, "\\"), e));
}

/* The rule of one string character (made once). */
static int char_rule(cx *c) {
    if (c->r_char < 0) {
        c->r_char = sm_nfa_rule_new(c->n);
        sm_nfa_rule_set(c->n, c->r_char, json_char(c));
    }
    return c->r_char;
}

/* A JSON string of min..max characters (max < 0: no limit). */
static sm_frag counted_string(cx *c, long min, long max) {
    sm_nfa *n = c->n;
    sm_frag body = max < 0 ? sm_frag_star(n, json_char(c)) : sm_frag_empty(n);
    if (min || max >= 0) {
        int r = char_rule(c);
        for (long i = min; i < max; i++) body = sm_frag_opt(n, sm_frag_cat(n, sm_frag_call(n, r), body));
        for (long i = 0; i < min; i++) body = sm_frag_cat(n, sm_frag_call(n, r), body);
    }
    return sm_frag_cat(n, sm_frag_cat(n, lit(c, "\""), body), lit(c, "\""));
}

/* The byte classes of a regex edge when it is copied into a JSON string: printed as they are
 * (counted as a character or not: UTF-8 continuation bytes) or escaped. */
enum { B_RAW, B_CONT, B_ESC };
static const struct { int lo, hi, how; } BYTE_CLASS[] = {
    {0x00, 0x1F, B_ESC}, {0x20, 0x21, B_RAW}, {0x22, 0x22, B_ESC}, {0x23, 0x5B, B_RAW},
    {0x5C, 0x5C, B_ESC}, {0x5D, 0x7F, B_RAW}, {0x80, 0xBF, B_CONT}, {0xC0, 0xFF, B_RAW},
};

/* A path from -> to reading the escape of byte ch. */
static void esc_path(sm_nfa *n, int from, int to, int ch) {
    char e[8];
    esc((unsigned)ch, e);
    int s = from;
    for (size_t i = 0; e[i]; i++) {
        int t = e[i + 1] ? sm_nfa_state(n) : to;
        sm_nfa_bytes(n, s, t, (uint8_t)e[i], (uint8_t)e[i]);
        s = t;
    }
}

/* The layered copy of a regex automaton r: layer k = k characters read so far (the top layer
 * absorbs when there is no maximum); layers = 1 without counting. */
typedef struct layers {
    int base, nl, count, top_absorbs;
} layers;

static int layer_state(const layers *L, const sm_nfa *r, int s, int k) { return L->base + k * r->nstates + s; }

/* Copy byte edge [lo, hi] from s to t of r at layer k, escaping and counting. */
static void copy_bytes(sm_nfa *n, const sm_nfa *r, const layers *L, int s, int t, int k, int lo, int hi) {
    for (size_t i = 0; i < sizeof BYTE_CLASS / sizeof BYTE_CLASS[0]; i++) {
        int a = lo > BYTE_CLASS[i].lo ? lo : BYTE_CLASS[i].lo, b = hi < BYTE_CLASS[i].hi ? hi : BYTE_CLASS[i].hi;
        if (a > b) continue;
        int k2 = k;
        if (L->count && BYTE_CLASS[i].how != B_CONT) {
            k2 = k + 1;
            if (k2 >= L->nl) {
                if (!L->top_absorbs) continue; /* past the maximum */
                k2 = L->nl - 1;
            }
        }
        int from = layer_state(L, r, s, k), to = layer_state(L, r, t, k2);
        if (BYTE_CLASS[i].how != B_ESC) sm_nfa_bytes(n, from, to, a, b);
        else
            for (int ch = a; ch <= b; ch++) esc_path(n, from, to, ch);
    }
}

/* The JSON string whose content the regex src fullmatches, with min..max characters (max < 0:
 * none); what names it in messages ("pattern", "format"). */
static int regex_string(cx *c, const char *src, long min, long max, const char *what, const char *p, sm_frag *out) {
    sm_nfa r;
    sm_frag rf;
    sm_err re;
    sm_nfa_init(&r);
    if (sm_regex_compile(&r, src, strlen(src), &rf, &re) || sm_nfa_ok(&r, &re)) {
        sm_nfa_free(&r);
        return fail(c, "schema: %s at %s: %s", what, at(p), re.msg);
    }
    layers L = {0, 1, min > 0 || max >= 0, 0};
    if (L.count) {
        L.nl = (int)(max >= 0 ? max + 1 : min + 1);
        L.top_absorbs = max < 0;
    }
    if ((long)r.nstates * L.nl > MAX_PRODUCT) {
        sm_nfa_free(&r);
        return fail(c, "schema: %s with minLength/maxLength at %s needs over %d automaton states", what, at(p), MAX_PRODUCT);
    }
    /* all layer states, then every edge of every layer */
    sm_nfa *n = c->n;
    L.base = n->nstates;
    for (long i = 0; i < (long)r.nstates * L.nl; i++) sm_nfa_state(n);
    for (int k = 0; k < L.nl && !n->bad; k++)
        for (int s = 0; s < r.nstates; s++)
            for (int e = r.first[s]; e >= 0; e = r.edges[e].next) {
                const sm_nfa_edge *d = &r.edges[e];
                if (d->kind == SM_NFA_EPS) sm_nfa_eps(n, layer_state(&L, &r, s, k), layer_state(&L, &r, d->to, k));
                else if (d->kind == SM_NFA_BYTES) copy_bytes(n, &r, &L, s, d->to, k, d->lo, d->hi);
            }
    sm_frag f = {sm_nfa_state(n), sm_nfa_state(n)};
    sm_nfa_eps(n, f.in, layer_state(&L, &r, rf.in, 0));
    for (long k = L.count ? min : 0; k < L.nl; k++) sm_nfa_eps(n, layer_state(&L, &r, rf.out, (int)k), f.out);
    sm_nfa_free(&r);
    *out = sm_frag_cat(n, sm_frag_cat(n, lit(c, "\""), f), lit(c, "\""));
    return 0;
}

/* The regex of format name, NULL when it is not supported. */
static const char *format_re(const char *name) {
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++)
        if (!strcmp(name, FORMATS[i].name)) return FORMATS[i].re;
    return NULL;
}

/* A count keyword's value, or dflt when absent. */
static long count_of(const json_t *s, const char *k, long dflt) {
    const json_t *v = json_object_get(s, k);
    return v ? (long)json_number_value(v) : dflt;
}

/* Check min..max of the pair (kmin, kmax) against cap; -1 refused. */
static int check_counts(cx *c, const json_t *s, const char *p, const char *kmin, const char *kmax, long cap,
                        long *min, long *max) {
    const json_t *a = json_object_get(s, kmin), *b = json_object_get(s, kmax);
    if ((a && json_number_value(a) > cap) || (b && json_number_value(b) > cap))
        return fail(c, "schema: '%s' above %ld is not supported at %s", a && json_number_value(a) > cap ? kmin : kmax,
                    cap, at(p));
    *min = count_of(s, kmin, 0);
    *max = count_of(s, kmax, -1);
    if (*max >= 0 && *min > *max) return fail(c, "schema: '%s' above '%s' admits no value at %s", kmin, kmax, at(p));
    return 0;
}

static int string_frag(cx *c, const json_t *s, const char *p, sm_frag *out) {
    long min, max;
    if (check_counts(c, s, p, "minLength", "maxLength", MAX_LENGTH, &min, &max)) return -1;
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (pat && fmt) return fail(c, "schema: 'pattern' next to 'format' is not supported at %s", at(p));
    if (pat) return regex_string(c, json_string_value(pat), min, max, "pattern", p, out);
    if (fmt) {
        const char *re = format_re(json_string_value(fmt));
        if (!re) return fail(c, "schema: unsupported format '%s' at %s", json_string_value(fmt), at(p));
        return regex_string(c, re, min, max, "format", p, out);
    }
    *out = counted_string(c, min, max);
    return 0;
}

/* ---- any JSON value -------------------------------------------------------------------------- */

static int value_rule(cx *c);

/* Any object / array whose members are any values (the value rule). */
static sm_frag any_object(cx *c) {
    sm_nfa *n = c->n;
    int v = value_rule(c);
    sm_frag m1 = sm_frag_cat(n, sm_frag_cat(n, counted_string(c, 0, -1), sep(c, ":")), sm_frag_call(n, v));
    sm_frag m2 = sm_frag_cat(n, sm_frag_cat(n, counted_string(c, 0, -1), sep(c, ":")), sm_frag_call(n, v));
    sm_frag body = sm_frag_opt(n, sm_frag_cat(n, m1, sm_frag_star(n, sm_frag_cat(n, sep(c, ","), m2))));
    return sm_frag_cat(n, sm_frag_cat(n, open_tok(c, "{"), body), close_tok(c, "}"));
}

static sm_frag any_array(cx *c) {
    sm_nfa *n = c->n;
    int v = value_rule(c);
    sm_frag rest = sm_frag_star(n, sm_frag_cat(n, sep(c, ","), sm_frag_call(n, v)));
    sm_frag body = sm_frag_opt(n, sm_frag_cat(n, sm_frag_call(n, v), rest));
    return sm_frag_cat(n, sm_frag_cat(n, open_tok(c, "["), body), close_tok(c, "]"));
}

/* Any JSON number (JSON's grammar, exponent included). */
static sm_frag any_number(cx *c, int integer) {
    sm_frag f;
    const char *which;
    json_t *none = json_object();
    if (!none || sm_schema_number(c->n, none, integer, &f, &which)) f = sm_frag_none(c->n);
    json_decref(none);
    return f;
}

/* The rule "any JSON value" (made once; calls itself for nested values). */
static int value_rule(cx *c) {
    if (c->r_value >= 0) return c->r_value;
    sm_nfa *n = c->n;
    int r = c->r_value = sm_nfa_rule_new(n);
    sm_frag f = sm_frag_alt(n, any_object(c), any_array(c));
    f = sm_frag_alt(n, f, sm_frag_alt(n, counted_string(c, 0, -1), any_number(c, 0)));
    f = sm_frag_alt(n, f, sm_frag_alt(n, lit(c, "true"), sm_frag_alt(n, lit(c, "false"), lit(c, "null"))));
    sm_nfa_rule_set(n, r, f);
    return r;
}

/* ---- objects --------------------------------------------------------------------------------- */

/* A trie of property names over code points, for extra names that must differ from them. */
typedef struct tnode {
    uint32_t cp;         /* the code point into this node */
    int end;             /* a listed name ends here */
    int kids, sib;       /* first child, next sibling: node indexes, -1 none */
    int state;           /* its NFA state */
} tnode;

/* Decode one UTF-8 code point at *s (valid: jansson checked it). */
static uint32_t utf8_next(const unsigned char **s) {
    const unsigned char *q = *s;
    uint32_t c = *q++;
    int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (more) c &= 0x3F >> more;
    while (more-- > 0) c = (c << 6) | (*q++ & 0x3F);
    *s = q;
    return c;
}

/* Add name to the trie t [*nt] (capacity cap); 0 or -1 (no room). */
static int trie_add(tnode *t, int *nt, int cap, const char *name) {
    const unsigned char *s = (const unsigned char *)name;
    int at_node = 0;
    while (*s) {
        uint32_t cp = utf8_next(&s);
        int k = t[at_node].kids;
        while (k >= 0 && t[k].cp != cp) k = t[k].sib;
        if (k < 0) {
            if (*nt >= cap) return -1;
            k = (*nt)++;
            t[k] = (tnode){cp, 0, -1, t[at_node].kids, -1};
            t[at_node].kids = k;
        }
        at_node = k;
    }
    t[at_node].end = 1;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Edges from state s to state t reading one raw code point (printed as it is in a JSON string:
 * >= 0x20, not " or \, not a surrogate) in [lo, hi]. */
static void raw_edges(sm_nfa *n, int s, int t, uint32_t lo, uint32_t hi) {
    static const uint32_t RAW[4][2] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0xD7FF}, {0xE000, 0x10FFFF}};
    for (int i = 0; i < 4; i++) {
        uint32_t a = lo > RAW[i][0] ? lo : RAW[i][0], b = hi < RAW[i][1] ? hi : RAW[i][1];
        if (a > b) continue;
        sm_frag f = sm_frag_utf8(n, a, b);
        sm_nfa_eps(n, s, f.in);
        sm_nfa_eps(n, f.out, t);
    }
}

/* Trie node i's edges: to each child, any other raw code point to free_s, '"' to end_s when no
 * name ends here.  -1 out of memory. */
static int trie_edges(sm_nfa *n, tnode *t, int i, int free_s, int end_s) {
    int m = 0;
    for (int k = t[i].kids; k >= 0; k = t[k].sib) m++;
    uint32_t *cps = malloc(sizeof(uint32_t) * (size_t)(m ? m : 1));
    if (!cps) return -1;
    m = 0;
    for (int k = t[i].kids; k >= 0; k = t[k].sib) {
        raw_edges(n, t[i].state, t[k].state, t[k].cp, t[k].cp); /* none for an escaped one */
        cps[m++] = t[k].cp;
    }
    qsort(cps, (size_t)m, sizeof cps[0], cmp_u32);
    uint32_t lo = 0;
    for (int j = 0; j < m; j++) {
        if (cps[j] > lo) raw_edges(n, t[i].state, free_s, lo, cps[j] - 1);
        lo = cps[j] + 1;
    }
    raw_edges(n, t[i].state, free_s, lo, 0x10FFFF);
    if (!t[i].end) sm_nfa_bytes(n, t[i].state, end_s, '"', '"');
    free(cps);
    return 0;
}

/* A JSON string of raw characters (no escapes) that is none of the names of props. */
static int other_name(cx *c, const json_t *props, const char *p, sm_frag *out) {
    sm_nfa *n = c->n;
    int cap = 1;
    const char *k;
    json_t *v;
    if (props) json_object_foreach((json_t *)props, k, v) cap += (int)strlen(k);
    tnode *t = malloc(sizeof(tnode) * (size_t)cap);
    if (!t) return fail(c, "schema: out of memory at %s", at(p));
    int nt = 1;
    t[0] = (tnode){0, 0, -1, -1, -1};
    if (props) json_object_foreach((json_t *)props, k, v) trie_add(t, &nt, cap, k);
    int start = sm_nfa_state(n), free_s = sm_nfa_state(n), end_s = sm_nfa_state(n);
    for (int i = 0; i < nt; i++) t[i].state = sm_nfa_state(n);
    sm_nfa_bytes(n, start, t[0].state, '"', '"');
    int rc = 0;
    for (int i = 0; i < nt && !rc; i++) rc = trie_edges(n, t, i, free_s, end_s);
    raw_edges(n, free_s, free_s, 0, 0x10FFFF);
    sm_nfa_bytes(n, free_s, end_s, '"', '"');
    free(t);
    if (rc) return fail(c, "schema: out of memory at %s", at(p));
    *out = (sm_frag){start, end_s};
    return 0;
}

/* 1 when array a holds the string name. */
static int has_name(const json_t *a, const char *name) {
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (!strcmp(json_string_value(v), name)) return 1;
    return 0;
}

/* Wire a fragment between two states. */
static void wire(sm_nfa *n, int from, sm_frag f, int to) {
    sm_nfa_eps(n, from, f.in);
    sm_nfa_eps(n, f.out, to);
}

/* The listed properties: A = nothing printed yet, B = something printed; each property is
 * reached from A directly or from B after a ",", and leads to B; an optional one may be
 * skipped on both chains. */
static int listed_props(cx *c, const json_t *props, const json_t *req, const char *p, int *A, int *B) {
    sm_nfa *n = c->n;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        int K = sm_nfa_state(n), A2 = sm_nfa_state(n), B2 = sm_nfa_state(n);
        sm_nfa_eps(n, *A, K);
        wire(n, *B, sep(c, ","), K);
        sm_frag val;
        if (sch(c, v, pj(c, pj(c, p, "properties"), k), &val)) return -1;
        sm_frag m = sm_frag_cat(n, sm_frag_cat(n, lit_str(c, k, strlen(k)), sep(c, ":")), val);
        wire(n, K, m, B2);
        if (!req || !has_name(req, k)) {
            sm_nfa_eps(n, *A, A2);
            sm_nfa_eps(n, *B, B2);
        }
        *A = A2;
        *B = B2;
    }
    return 0;
}

/* Extra properties after the listed ones: names that are not listed, values of schema ap. */
static int extra_props(cx *c, const json_t *props, const json_t *ap, const char *p, int A, int B) {
    sm_nfa *n = c->n;
    int X = sm_nfa_state(n);
    sm_nfa_eps(n, A, X);
    wire(n, B, sep(c, ","), X);
    sm_frag name, val;
    if (other_name(c, props, p, &name)) return -1;
    if (json_is_true(ap)) val = sm_frag_call(n, value_rule(c));
    else if (sch(c, ap, pj(c, p, "additionalProperties"), &val)) return -1;
    wire(n, X, sm_frag_cat(n, sm_frag_cat(n, name, sep(c, ":")), val), B);
    return 0;
}

static int object_frag(cx *c, const json_t *s, const char *p, sm_frag *out) {
    sm_nfa *n = c->n;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *v;
    /* every required name must be listed: its value's schema and its place come from there */
    if (req) json_array_foreach(req, i, v)
            if (!props || !json_object_get(props, json_string_value(v)))
                return fail(c, "schema: required property '%s' is not in 'properties' at %s", json_string_value(v), at(p));
    if (!props && !ap) { *out = any_object(c); return 0; }
    sm_frag open = open_tok(c, "{"), close = close_tok(c, "}");
    int A = sm_nfa_state(n), B = sm_nfa_state(n);
    sm_nfa_eps(n, open.out, A);
    if (props && listed_props(c, props, req, p, &A, &B)) return -1;
    if (ap && !json_is_false(ap) && extra_props(c, props, ap, p, A, B)) return -1;
    sm_nfa_eps(n, A, close.in);
    sm_nfa_eps(n, B, close.in);
    *out = (sm_frag){open.in, close.out};
    return 0;
}

/* ---- arrays ---------------------------------------------------------------------------------- */

/* An array's elements: prefixItems[i] at position i < k, the items schema after (through its
 * rule when it is printed more than once). */
typedef struct elems {
    const json_t *prefix, *items;
    size_t k;            /* prefix length */
    int rule;            /* the items' rule, -1: build inline (used once) */
    const char *p;
} elems;

static int elem(cx *c, const elems *E, size_t i, sm_frag *f) {
    if (i < E->k) return sch(c, json_array_get(E->prefix, i), pji(c, E->p, "prefixItems", i), f);
    if (E->rule >= 0) { *f = sm_frag_call(c->n, E->rule); return 0; }
    return sch(c, E->items, pj(c, E->p, "items"), f);
}

/* The items' rule when the items schema is printed more than once. */
static int items_rule(cx *c, elems *E, long uses) {
    E->rule = -1;
    if (!E->items || json_is_true(E->items)) { E->rule = value_rule(c); return 0; }
    if (uses < 2) return 0;
    int r = sm_nfa_rule_new(c->n);
    sm_frag f;
    if (sch(c, E->items, pj(c, E->p, "items"), &f)) return -1;
    sm_nfa_rule_set(c->n, r, f);
    E->rule = r;
    return 0;
}

static int array_frag(cx *c, const json_t *s, const char *p, sm_frag *out) {
    sm_nfa *n = c->n;
    long min, max;
    if (check_counts(c, s, p, "minItems", "maxItems", MAX_ITEMS, &min, &max)) return -1;
    elems E = {json_object_get(s, "prefixItems"), json_object_get(s, "items"), 0, -1, p};
    E.k = E.prefix ? json_array_size(E.prefix) : 0;
    if (E.items && json_is_false(E.items)) {
        if (max < 0 || max > (long)E.k) max = (long)E.k;
        if (min > max) return fail(c, "schema: 'minItems' above the prefixItems with items false admits no array at %s", at(p));
    }
    /* positions 0..L-1 one by one, then (unbounded) a loop of more items */
    long L = max >= 0 ? max : (min > (long)E.k ? min : (long)E.k);
    long uses = (L > (long)E.k ? L - (long)E.k : 0) + (max < 0 ? (L == 0 ? 2 : 1) : 0);
    if (items_rule(c, &E, uses)) return -1;
    sm_frag T = sm_frag_empty(n), f;
    if (max < 0) {
        if (elem(c, &E, (size_t)L, &f)) return -1;
        T = sm_frag_star(n, sm_frag_cat(n, sep(c, ","), f));
        if (L == 0) {
            if (elem(c, &E, 0, &f)) return -1;
            T = sm_frag_opt(n, sm_frag_cat(n, f, T));
        }
    }
    for (long i = L - 1; i >= 0; i--) {
        if (elem(c, &E, (size_t)i, &f)) return -1;
        if (i > 0) f = sm_frag_cat(n, sep(c, ","), f);
        T = sm_frag_cat(n, f, T);
        if (i >= min) T = sm_frag_opt(n, T);
    }
    *out = sm_frag_cat(n, sm_frag_cat(n, open_tok(c, "["), T), close_tok(c, "]"));
    return 0;
}

/* ---- numbers --------------------------------------------------------------------------------- */

static int number_frag(cx *c, const json_t *s, const char *p, int integer, sm_frag *out) {
    const char *which = "minimum";
    int rc = sm_schema_number(c->n, s, integer, out, &which);
    if (rc == 1) return fail(c, "schema: the bounds at %s admit no %s", at(p), integer ? "integer" : "number");
    if (rc == 2)
        return fail(c, "schema: '%s' at %s is an integer no double holds: only type integer takes it", which, at(p));
    if (rc) return fail(c, "schema: the bounds at %s are too long", at(p));
    return 0;
}

/* ---- enum and const -------------------------------------------------------------------------- */

/* The type bit of a value (a real with an integral value is an integer, as JSON Schema says). */
static int value_bits(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT;
    case JSON_REAL: {
        double x = json_real_value(v);
        return x == floor(x) ? T_INT : T_NUM;
    }
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    default: return T_NULL;
    }
}

/* JSON Schema equality: numbers by value (1 == 1.0), the rest structurally. */
static int jeq(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b)) return 0;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jeq(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    if (json_is_object(a)) {
        const char *k;
        json_t *v;
        if (json_object_size(a) != json_object_size(b)) return 0;
        json_object_foreach((json_t *)a, k, v) {
            const json_t *w = json_object_get(b, k);
            if (!w || !jeq(v, w)) return 0;
        }
        return 1;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/* 1 when v is in array a. */
static int in_list(const json_t *a, const json_t *v) {
    for (size_t i = 0; i < json_array_size(a); i++)
        if (jeq(json_array_get(a, i), v)) return 1;
    return 0;
}

static int enum_frag(cx *c, const json_t *s, const char *p, sm_frag *out) {
    static const char *const allow[] = {"enum", "const", "type", NULL};
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"), *ty = json_object_get(s, "type");
    if (only_with(c, s, p, en ? "enum" : "const", allow)) return -1;
    const char *bad;
    int mask = ty ? type_bits(ty, &bad) : T_ALL, any = 0;
    size_t cnt = en ? json_array_size(en) : 1;
    sm_frag f = sm_frag_none(c->n);
    for (size_t i = 0; i < cnt; i++) {
        const json_t *v = en ? json_array_get(en, i) : cn;
        if (!(value_bits(v) & mask) || (en && cn && !jeq(v, cn))) continue;
        f = any ? sm_frag_alt(c->n, f, value_lit(c, v)) : value_lit(c, v);
        any = 1;
    }
    if (!any) return fail(c, "schema: no value of '%s' at %s satisfies the schema's other keywords", en ? "enum" : "const", at(p));
    *out = f;
    return 0;
}

/* ---- $ref ------------------------------------------------------------------------------------ */

/* Decode one pointer token [len] (~0 ~1 and %XX) into out (cap bytes). */
static void ptr_token(const char *t, size_t len, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < cap; i++) {
        if (t[i] == '~' && i + 1 < len && (t[i + 1] == '0' || t[i + 1] == '1')) { out[k++] = t[i + 1] == '0' ? '~' : '/'; i++; }
        else if (t[i] == '%' && i + 2 < len) {
            char h[3] = {t[i + 1], t[i + 2], 0};
            out[k++] = (char)strtol(h, NULL, 16);
            i += 2;
        } else out[k++] = t[i];
    }
    out[k] = 0;
}

/* The schema a local $ref ("#", "#/a/b") names, NULL when none. */
static const json_t *ref_target(const cx *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *t = c->root;
    const char *q = ref + 1;
    if (*q && *q != '/') return NULL;
    while (*q && t) {
        const char *e = strchr(q + 1, '/');
        size_t len = e ? (size_t)(e - q - 1) : strlen(q + 1);
        char tok[512];
        ptr_token(q + 1, len, tok, sizeof tok);
        if (json_is_object(t)) t = json_object_get(t, tok);
        else if (json_is_array(t)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            t = *tok && !*end ? json_array_get(t, i) : NULL;
        } else t = NULL;
        q += 1 + len;
    }
    return t;
}

/* s with its chain of $refs followed: the schema at its end, NULL when a $ref dangles or the
 * chain comes back on itself (*cycle = 1); *nullable = 1 when a schema of the chain says
 * "nullable": true (then null is admitted whatever the end says). */
static const json_t *deref_c(const cx *c, const json_t *s, int *cycle, int *nullable) {
    *cycle = *nullable = 0;
    for (int hop = 0; hop < 64 && s; hop++) {
        if (!json_is_object(s)) return s;
        *nullable |= json_is_true(json_object_get(s, "nullable"));
        const json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r)) return s;
        s = ref_target(c, json_string_value(r));
    }
    *cycle = s != NULL;
    return NULL;
}
static const json_t *deref(const cx *c, const json_t *s, int *nullable) {
    int cycle;
    return deref_c(c, s, &cycle, nullable);
}

static int ref_frag(cx *c, const json_t *s, const char *p, sm_frag *out) {
    if (only_with(c, s, p, "$ref", NULL)) return -1;
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    if (ref[0] != '#') return fail(c, "schema: $ref '%s' at %s is not local: only '#...' references are supported", ref, at(p));
    const json_t *t = ref_target(c, ref);
    if (!t) return fail(c, "schema: $ref '%s' at %s points to nothing", ref, at(p));
    if (!is_schema(t)) return fail(c, "schema: $ref '%s' at %s points to a non-schema", ref, at(p));
    int cycle, nul;
    if (!deref_c(c, t, &cycle, &nul) && cycle)
        return fail(c, "schema: $ref '%s' at %s is a cycle of references that admits no value", ref, at(p));
    for (int i = 0; i < c->nrefs; i++)
        if (c->refs[i].target == t) { *out = sm_frag_call(c->n, c->refs[i].rule); return 0; }
    if (c->nrefs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 16;
        ref_t *q = realloc(c->refs, sizeof(ref_t) * (size_t)cap);
        if (!q) return fail(c, "schema: out of memory at %s", at(p));
        c->refs = q;
        c->cap_refs = cap;
    }
    char *tp = strdup(ref + 1);
    c->refs[c->nrefs] = (ref_t){t, sm_nfa_rule_new(c->n), own(c, tp)};
    *out = sm_frag_call(c->n, c->refs[c->nrefs++].rule);
    return 0;
}

/* ---- anyOf / oneOf / allOf ------------------------------------------------------------------- */

/* The types a validator lets through schema s (T_ALL when it does not restrict the type). */
static int ref_mask(const cx *c, const json_t *s, int depth) {
    int nul;
    s = deref(c, s, &nul);
    if (json_is_false(s)) return nul ? T_NULL : 0;
    if (!json_is_object(s) || depth > 16) return T_ALL;
    const char *bad;
    int m = T_ALL;
    const json_t *t = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    const char *combos[2] = {"anyOf", "oneOf"};
    for (int k = 0; k < 2; k++) {
        const json_t *l = json_object_get(s, combos[k]);
        if (!l) continue;
        int u = 0;
        for (size_t i = 0; i < json_array_size(l); i++) u |= ref_mask(c, json_array_get(l, i), depth + 1);
        m &= u;
    }
    const json_t *all = json_object_get(s, "allOf");
    for (size_t i = 0; all && i < json_array_size(all); i++) m &= ref_mask(c, json_array_get(all, i), depth + 1);
    if (t && type_bits(t, &bad)) m &= type_bits(t, &bad);
    if (cn) m &= value_bits(cn);
    if (en) {
        int u = 0;
        for (size_t i = 0; i < json_array_size(en); i++) u |= value_bits(json_array_get(en, i));
        m &= u;
    }
    return nul ? m | T_NULL : m;
}

/* The values schema s is limited to by enum / const (NULL: not limited that way). */
static json_t *value_set(const cx *c, const json_t *s) {
    int nul;
    s = deref(c, s, &nul);
    if (!json_is_object(s) || nul) return NULL;
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (cn) return json_pack("[O]", cn);
    return en ? json_incref((json_t *)en) : NULL;
}

/* 1 when schemas a and b limit property name to disjoint value sets. */
static int disjoint_values(const cx *c, const json_t *a, const json_t *b) {
    json_t *x = value_set(c, a), *y = value_set(c, b);
    int ok = x && y;
    for (size_t i = 0; ok && i < json_array_size(x); i++) ok = !in_list(y, json_array_get(x, i));
    json_decref(x);
    json_decref(y);
    return ok;
}

/* Objects a and b (both "type": "object") that no instance satisfies together: a property both
 * require has disjoint const / enum values, or one requires a property the other forbids. */
static int disjoint_objects(const cx *c, const json_t *a, const json_t *b) {
    for (int side = 0; side < 2; side++) {
        const json_t *x = side ? b : a, *y = side ? a : b;
        const json_t *rx = json_object_get(x, "required"), *px = json_object_get(x, "properties");
        const json_t *ry = json_object_get(y, "required"), *py = json_object_get(y, "properties");
        for (size_t i = 0; rx && i < json_array_size(rx); i++) {
            const char *k = json_string_value(json_array_get(rx, i));
            if (json_is_false(json_object_get(y, "additionalProperties")) && !(py && json_object_get(py, k))) return 1;
            if (ry && has_name(ry, k) && px && py && disjoint_values(c, json_object_get(px, k), json_object_get(py, k)))
                return 1;
        }
    }
    return 0;
}

/* 1 when no instance is valid under both branches a and b (a sufficient test). */
static int disjoint(const cx *c, const json_t *a, const json_t *b) {
    if (!(ref_mask(c, a, 0) & ref_mask(c, b, 0))) return 1;
    if (disjoint_values(c, a, b)) return 1;
    int na, nb;
    const json_t *x = deref(c, a, &na), *y = deref(c, b, &nb);
    return json_is_object(x) && json_is_object(y) && ref_mask(c, a, 0) == T_OBJ && ref_mask(c, b, 0) == T_OBJ &&
           json_object_get(x, "type") && json_object_get(y, "type") && disjoint_objects(c, x, y);
}

static int combo_frag(cx *c, const json_t *s, const char *p, const char *kw, sm_frag *out) {
    if (only_with(c, s, p, kw, NULL)) return -1;
    const json_t *l = json_object_get(s, kw);
    size_t cnt = json_array_size(l);
    if (!strcmp(kw, "allOf") && cnt != 1)
        return fail(c, "schema: 'allOf' of %zu schemas is not supported at %s: only of one", cnt, at(p));
    if (!strcmp(kw, "oneOf"))
        for (size_t i = 0; i < cnt; i++)
            for (size_t j = i + 1; j < cnt; j++)
                if (!disjoint(c, json_array_get(l, i), json_array_get(l, j)))
                    return fail(c, "schema: 'oneOf' branches %zu and %zu at %s may overlap: only branches of distinct "
                                "types, distinct const/enum values or distinct required const properties are supported",
                                i, j, at(p));
    sm_frag f;
    for (size_t i = 0; i < cnt; i++) {
        sm_frag b;
        if (sch(c, json_array_get(l, i), pji(c, p, kw, i), &b)) return -1;
        f = i ? sm_frag_alt(c->n, f, b) : b;
    }
    *out = f;
    return 0;
}

/* ---- the dispatcher -------------------------------------------------------------------------- */

/* The types schema s admits: "type", or those its keywords imply, or all. */
static int schema_types(const json_t *s) {
    const char *bad, *k;
    const json_t *t = json_object_get(s, "type");
    if (t) return type_bits(t, &bad);
    int m = 0;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        const kw_t *w = kw_find(k);
        if (w) m |= w->types;
    }
    return m ? m : T_ALL;
}

/* The union of the fragments of the types in mask. */
static int typed_frag(cx *c, const json_t *s, const char *p, sm_frag *out) {
    sm_nfa *n = c->n;
    int mask = schema_types(s), have = 0;
    if (mask == T_ALL && !json_object_get(s, "type")) {
        *out = sm_frag_call(n, value_rule(c));
        return 0;
    }
    sm_frag f = sm_frag_none(n), g;
    for (int bit = 1; bit <= T_NUM; bit <<= 1) {
        if (!(mask & bit) || (bit == T_NUM && (mask & T_INT))) continue;
        int rc = 0;
        switch (bit) {
        case T_NULL: g = lit(c, "null"); break;
        case T_BOOL: g = sm_frag_alt(n, lit(c, "true"), lit(c, "false")); break;
        case T_OBJ: rc = object_frag(c, s, p, &g); break;
        case T_ARR: rc = array_frag(c, s, p, &g); break;
        case T_STR: rc = string_frag(c, s, p, &g); break;
        case T_INT: rc = number_frag(c, s, p, !(mask & T_NUM), &g); break;
        default: rc = number_frag(c, s, p, 0, &g); break;
        }
        if (rc) return -1;
        f = have ? sm_frag_alt(n, f, g) : g;
        have = 1;
    }
    *out = f;
    return 0;
}

/* The fragment of schema s at pointer p. */
static int sch(cx *c, const json_t *s, const char *p, sm_frag *out) {
    if (json_is_true(s)) { *out = sm_frag_call(c->n, value_rule(c)); return 0; }
    if (json_is_false(s)) return fail(c, "schema: false admits no value at %s", at(p));
    if (!json_is_object(s)) return fail(c, "schema: a schema must be an object or a boolean at %s", at(p));
    if (c->depth >= MAX_DEPTH) return fail(c, "schema: nested deeper than %d at %s", MAX_DEPTH, at(p));
    if (check_keywords(c, s, p)) return -1;
    c->depth++;
    int rc;
    if (json_object_get(s, "$ref")) rc = ref_frag(c, s, p, out);
    else if (json_object_get(s, "anyOf")) rc = combo_frag(c, s, p, "anyOf", out);
    else if (json_object_get(s, "oneOf")) rc = combo_frag(c, s, p, "oneOf", out);
    else if (json_object_get(s, "allOf")) rc = combo_frag(c, s, p, "allOf", out);
    else if (json_object_get(s, "enum") || json_object_get(s, "const")) rc = enum_frag(c, s, p, out);
    else rc = typed_frag(c, s, p, out);
    c->depth--;
    if (!rc && json_is_true(json_object_get(s, "nullable"))) *out = sm_frag_alt(c->n, *out, lit(c, "null"));
    return rc;
}

/* ---- entry points ---------------------------------------------------------------------------- */

static void cx_init(cx *c, sm_nfa *n, const sm_schema_opts *o, sm_err *e) {
    memset(c, 0, sizeof *c);
    c->n = n;
    c->ws = o && o->any_whitespace;
    c->e = e;
    c->r_value = c->r_char = -1;
}

static void cx_free(cx *c) {
    for (int i = 0; i < c->nstrs; i++) free(c->strs[i]);
    free(c->strs);
    free(c->refs);
    json_decref(c->root);
}

/* Compile the root into rule 0, then every $ref target (the list grows as they are met). */
static int compile_all(cx *c) {
    sm_frag f;
    c->refs = malloc(sizeof(ref_t) * 16);
    if (!c->refs) return fail(c, "schema: out of memory");
    c->cap_refs = 16;
    c->refs[c->nrefs++] = (ref_t){c->root, sm_nfa_rule_new(c->n), ""};
    if (check_tree(c, c->root, "", 0) || sch(c, c->root, "", &f)) return -1;
    sm_nfa_rule_set(c->n, 0, f);
    for (int i = 1; i < c->nrefs; i++) {
        c->depth = 0;
        if (sch(c, c->refs[i].target, c->refs[i].ptr, &f)) return -1;
        sm_nfa_rule_set(c->n, c->refs[i].rule, f);
    }
    return 0;
}

int sm_schema_compile(sm_nfa *n, const char *text, size_t len, const sm_schema_opts *o, sm_err *e) {
    sm_err scratch;
    if (!e) e = &scratch;
    cx c;
    cx_init(&c, n, o, e);
    json_error_t je;
    c.root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!c.root) return fail(&c, "schema: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    int rc = compile_all(&c);
    cx_free(&c);
    if (!rc && sm_nfa_ok(n, e)) rc = -1;
    return rc;
}

int sm_schema_any_object(sm_nfa *n, const sm_schema_opts *o, sm_err *e) {
    sm_err scratch;
    if (!e) e = &scratch;
    cx c;
    cx_init(&c, n, o, e);
    int r0 = sm_nfa_rule_new(n);
    sm_nfa_rule_set(n, r0, any_object(&c));
    cx_free(&c);
    return sm_nfa_ok(n, e);
}
