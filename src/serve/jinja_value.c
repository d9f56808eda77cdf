/* jinja_value.c: the render-time values of the Jinja renderer (see jinja_int.h) with Python's
 * meaning, since templates are written against Jinja2 on Python: truth, str() and repr()
 * (True, None, 1.0, ['a', 1]), == across int / float / bool, and json.dumps as transformers'
 * tojson calls it (ensure_ascii=False, ", " and ": " separators, keys in their order).
 *
 * Floats print as Python's repr: the shortest digits that read back to the same double, in
 * fixed notation for exponents -4..15, else "1e+16".  We rejected "%g": 0.1 + 0.2 prints
 * "0.3" there and "0.30000000000000004" in Python.
 */
#include "serve/jinja_int.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int jerr(jctx *c, const jnode *at, const char *fmt, ...) {
    char m[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!c->e->msg[0]) {
        if (at) sm_errf(c->e, "line %d col %d: %s", at->line, at->col, m);
        else sm_errf(c->e, "%s", m);
    }
    return -1;
}

jv jv_own(jctx *c, json_t *j) {
    jv v = {JV_UNDEF, NULL, NULL};
    if (!j) { jerr(c, NULL, "out of memory"); return v; }
    if (c->npool == c->cappool) {
        int nc = c->cappool ? c->cappool * 2 : 1024;
        json_t **np = realloc(c->pool, sizeof *np * (size_t)nc);
        if (!np) { json_decref(j); jerr(c, NULL, "out of memory"); return v; }
        c->pool = np;
        c->cappool = nc;
    }
    c->pool[c->npool++] = j;
    v.k = JV_JSON;
    v.j = j;
    return v;
}

jv jv_borrow(jctx *c, json_t *j) {
    if (!j) return (jv){JV_UNDEF, NULL, NULL};
    return jv_own(c, json_incref(j));
}

jv jv_str(jctx *c, const char *s, size_t n) { return jv_own(c, json_stringn_nocheck(s ? s : "", n)); }
jv jv_int(jctx *c, long long x) { return jv_own(c, json_integer(x)); }
jv jv_real(jctx *c, double x) { return jv_own(c, json_real(x)); }
jv jv_bool(jctx *c, int x) { return jv_own(c, json_boolean(x)); }
jv jv_none(jctx *c) { return jv_own(c, json_null()); }

int jv_truthy(jv v) {
    if (v.k == JV_UNDEF) return 0;
    if (v.k != JV_JSON) return 1;
    switch (json_typeof(v.j)) {
    case JSON_NULL: case JSON_FALSE: return 0;
    case JSON_TRUE: return 1;
    case JSON_INTEGER: return json_integer_value(v.j) != 0;
    case JSON_REAL: return json_real_value(v.j) != 0;
    case JSON_STRING: return json_string_length(v.j) > 0;
    case JSON_ARRAY: return json_array_size(v.j) > 0;
    case JSON_OBJECT: return json_object_size(v.j) > 0;
    }
    return 0;
}

int jv_isnum(jv v) { return v.k == JV_JSON && (json_is_number(v.j) || json_is_boolean(v.j)); }
int jv_isint(jv v) { return v.k == JV_JSON && (json_is_integer(v.j) || json_is_boolean(v.j)); }
long long jv_intv(jv v) { return json_is_boolean(v.j) ? json_is_true(v.j) : json_integer_value(v.j); }
double jv_num(jv v) { return json_is_real(v.j) ? json_real_value(v.j) : (double)jv_intv(v); }

/* Python's repr of a double into b [64]. */
static void pyfloat(double x, char *b) {
    if (isnan(x)) { strcpy(b, "nan"); return; }
    if (isinf(x)) { strcpy(b, x < 0 ? "-inf" : "inf"); return; }
    int p = 1;
    char t[64];
    for (; p < 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, x);
        if (strtod(t, NULL) == x) break;
    }
    snprintf(t, sizeof t, "%.*e", p - 1, x);
    int ex = atoi(strchr(t, 'e') + 1);
    if (ex >= -4 && ex < 16) {
        snprintf(b, 64, "%.*f", p - 1 - ex > 0 ? p - 1 - ex : 0, x);
        if (!strchr(b, '.')) strcat(b, ".0");
    } else {
        snprintf(b, 64, "%.*e", p - 1, x); /* C and Python agree: 1e+16, 1.5e-05 */
    }
}

static int str_repr(sm_sbuf *o, const char *s, size_t n) {
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    int rc = sm_sbuf_add(o, &q, 1);
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        char b[8];
        if (ch == '\\' || ch == (unsigned char)q) { b[0] = '\\'; b[1] = (char)ch; rc = sm_sbuf_add(o, b, 2); }
        else if (ch == '\n') rc = sm_sbuf_str(o, "\\n");
        else if (ch == '\r') rc = sm_sbuf_str(o, "\\r");
        else if (ch == '\t') rc = sm_sbuf_str(o, "\\t");
        else if (ch < 0x20 || ch == 0x7f) { snprintf(b, sizeof b, "\\x%02x", ch); rc = sm_sbuf_str(o, b); }
        else rc = sm_sbuf_add(o, s + i, 1);
    }
    return rc || sm_sbuf_add(o, &q, 1) ? -1 : 0;
}

static int json_repr(jctx *c, json_t *j, sm_sbuf *o, int top) {
    char b[64];
    switch (json_typeof(j)) {
    case JSON_NULL: return sm_sbuf_str(o, "None");
    case JSON_TRUE: return sm_sbuf_str(o, "True");
    case JSON_FALSE: return sm_sbuf_str(o, "False");
    case JSON_INTEGER: snprintf(b, sizeof b, "%lld", (long long)json_integer_value(j)); return sm_sbuf_str(o, b);
    case JSON_REAL: pyfloat(json_real_value(j), b); return sm_sbuf_str(o, b);
    case JSON_STRING:
        if (top) return sm_sbuf_add(o, json_string_value(j), json_string_length(j));
        return str_repr(o, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        int rc = sm_sbuf_str(o, "[");
        for (size_t i = 0; i < json_array_size(j) && !rc; i++)
            rc = (i && sm_sbuf_str(o, ", ")) || json_repr(c, json_array_get(j, i), o, 0);
        return rc || sm_sbuf_str(o, "]");
    }
    case JSON_OBJECT: {
        int rc = sm_sbuf_str(o, "{"), first = 1;
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            rc = rc || (!first && sm_sbuf_str(o, ", ")) || str_repr(o, k, strlen(k)) || sm_sbuf_str(o, ": ") ||
                 json_repr(c, v, o, 0);
            first = 0;
        }
        return rc || sm_sbuf_str(o, "}");
    }
    }
    return 0;
}

int jv_tostr(jctx *c, jv v, sm_sbuf *out) {
    if (v.k == JV_UNDEF) return 0;
    if (v.k == JV_MACRO) return sm_sbuf_str(out, "<macro>");
    if (v.k == JV_NS) return sm_sbuf_str(out, "<Namespace>");
    return json_repr(c, v.j, out, 1);
}

int jv_repr(jctx *c, jv v, sm_sbuf *out) {
    if (v.k != JV_JSON) return jv_tostr(c, v, out);
    return json_repr(c, v.j, out, 0);
}

int jv_equal(jv a, jv b) {
    if (a.k == JV_UNDEF || b.k == JV_UNDEF) return a.k == b.k;
    if (a.k != JV_JSON || b.k != JV_JSON) return a.j == b.j && a.mac == b.mac;
    if (jv_isnum(a) && jv_isnum(b)) {
        if (jv_isint(a) && jv_isint(b)) return jv_intv(a) == jv_intv(b);
        return jv_num(a) == jv_num(b);
    }
    if (json_typeof(a.j) != json_typeof(b.j)) return 0;
    if (json_is_array(a.j)) {
        size_t n = json_array_size(a.j);
        if (n != json_array_size(b.j)) return 0;
        for (size_t i = 0; i < n; i++)
            if (!jv_equal((jv){JV_JSON, json_array_get(a.j, i), NULL}, (jv){JV_JSON, json_array_get(b.j, i), NULL}))
                return 0;
        return 1;
    }
    if (json_is_object(a.j)) {
        if (json_object_size(a.j) != json_object_size(b.j)) return 0;
        const char *k;
        json_t *x;
        json_object_foreach(a.j, k, x) {
            json_t *y = json_object_get(b.j, k);
            if (!y || !jv_equal((jv){JV_JSON, x, NULL}, (jv){JV_JSON, y, NULL})) return 0;
        }
        return 1;
    }
    return json_equal(a.j, b.j);
}

/* A JSON string as Python's json.dumps writes it (ascii: ensure_ascii=True). */
static int json_str(sm_sbuf *o, const char *s, size_t n, int ascii) {
    int rc = sm_sbuf_str(o, "\"");
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        char b[8];
        switch (ch) {
        case '"': rc = sm_sbuf_str(o, "\\\""); break;
        case '\\': rc = sm_sbuf_str(o, "\\\\"); break;
        case '\n': rc = sm_sbuf_str(o, "\\n"); break;
        case '\r': rc = sm_sbuf_str(o, "\\r"); break;
        case '\t': rc = sm_sbuf_str(o, "\\t"); break;
        case '\b': rc = sm_sbuf_str(o, "\\b"); break;
        case '\f': rc = sm_sbuf_str(o, "\\f"); break;
        default:
            if (ch < 0x20) { snprintf(b, sizeof b, "\\u%04x", ch); rc = sm_sbuf_str(o, b); }
            else if (ascii && ch >= 0x80) { /* decode one UTF-8 sequence (the text is valid UTF-8) */
                int nb = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : 2;
                unsigned long cp = ch & (0x7F >> nb);
                for (int k = 1; k < nb && i + 1 < n; k++) cp = cp << 6 | ((unsigned char)s[++i] & 63);
                if (cp >= 0x10000) { /* a surrogate pair */
                    cp -= 0x10000;
                    snprintf(b, sizeof b, "\\u%04x", (unsigned)(0xD800 + (cp >> 10)) & 0xFFFFu);
                    rc = sm_sbuf_str(o, b);
                    cp = 0xDC00 + (cp & 0x3FF);
                }
                snprintf(b, sizeof b, "\\u%04x", (unsigned)cp & 0xFFFFu);
                rc = rc || sm_sbuf_str(o, b);
            } else rc = sm_sbuf_add(o, s + i, 1);
        }
    }
    return rc || sm_sbuf_str(o, "\"");
}

static int newline_indent(sm_sbuf *o, int indent, int level) {
    if (sm_sbuf_str(o, "\n")) return -1;
    for (int i = 0; i < indent * level; i++)
        if (sm_sbuf_str(o, " ")) return -1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Python's json.dumps layout: one line, or indent=N with a newline and N spaces a level. */
int jv_tojson(jctx *c, jv v, const jjson_opts *op, int level, sm_sbuf *o) {
    int indent = op->indent;
    if (v.k == JV_UNDEF) return jerr(c, NULL, "tojson: the value is undefined");
    if (v.k != JV_JSON) return jerr(c, NULL, "tojson: a %s is not JSON serializable", v.k == JV_NS ? "namespace" : "macro");
    json_t *j = v.j;
    char b[64];
    const char *sep = op->item_sep;
    switch (json_typeof(j)) {
    case JSON_NULL: return sm_sbuf_str(o, "null");
    case JSON_TRUE: return sm_sbuf_str(o, "true");
    case JSON_FALSE: return sm_sbuf_str(o, "false");
    case JSON_INTEGER: snprintf(b, sizeof b, "%lld", (long long)json_integer_value(j)); return sm_sbuf_str(o, b);
    case JSON_REAL:
        pyfloat(json_real_value(j), b);
        return sm_sbuf_str(o, !strcmp(b, "nan") ? "NaN" : !strcmp(b, "inf") ? "Infinity" : !strcmp(b, "-inf") ? "-Infinity" : b);
    case JSON_STRING: return json_str(o, json_string_value(j), json_string_length(j), op->ascii);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (!n) return sm_sbuf_str(o, "[]");
        int rc = sm_sbuf_str(o, "[");
        for (size_t i = 0; i < n && !rc; i++) {
            if (i) rc = sm_sbuf_str(o, sep);
            if (!rc && indent >= 0) rc = newline_indent(o, indent, level + 1);
            if (!rc) rc = jv_tojson(c, (jv){JV_JSON, json_array_get(j, i), NULL}, op, level + 1, o);
        }
        if (!rc && indent >= 0) rc = newline_indent(o, indent, level);
        return rc || sm_sbuf_str(o, "]");
    }
    case JSON_OBJECT: {
        if (!json_object_size(j)) return sm_sbuf_str(o, "{}");
        size_t nk = json_object_size(j), i = 0;
        const char **keys = malloc(sizeof *keys * nk), *k;
        json_t *x;
        if (!keys) return jerr(c, NULL, "out of memory");
        json_object_foreach(j, k, x) keys[i++] = k;
        if (op->sort_keys) qsort(keys, nk, sizeof *keys, cmp_str); /* UTF-8 byte order is code point order */
        int rc = sm_sbuf_str(o, "{");
        for (i = 0; i < nk && !rc; i++) {
            if (i) rc = sm_sbuf_str(o, sep);
            if (indent >= 0) rc = rc || newline_indent(o, indent, level + 1);
            rc = rc || json_str(o, keys[i], strlen(keys[i]), op->ascii) || sm_sbuf_str(o, op->key_sep) ||
                 jv_tojson(c, (jv){JV_JSON, json_object_get(j, keys[i]), NULL}, op, level + 1, o);
        }
        free(keys);
        if (!rc && indent >= 0) rc = newline_indent(o, indent, level);
        return rc || sm_sbuf_str(o, "}");
    }
    }
    return 0;
}

json_t *jv_chars(const char *s, size_t n) {
    json_t *l = json_array();
    for (size_t i = 0, k; l && i < n; i = k) {
        for (k = i + 1; k < n && ((unsigned char)s[k] & 0xC0) == 0x80; k++) {}
        json_array_append_new(l, json_stringn_nocheck(s + i, k - i));
    }
    return l;
}

size_t jv_ulen(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

int jv_utf8_index(const char *s, size_t n, size_t **offs, size_t *count) {
    size_t *o = malloc(sizeof *o * (n + 1)), k = 0;
    if (!o) return -1;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n; /* the end, one past the last codepoint */
    *offs = o;
    *count = k;
    return 0;
}
