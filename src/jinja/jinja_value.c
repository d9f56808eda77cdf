/* jinja_value.c: the render-time values of the Jinja renderer (see jinja_int.h) with Python's
 * meaning, since templates are written against Jinja2 on Python: truth, str() and repr()
 * (True, None, 1.0, ['a', 1], ('a',), <Namespace {...}>), == across int / float / bool, the
 * ordering sort / min / max use, and json.dumps as transformers' tojson calls it
 * (ensure_ascii=False, ", " and ": " separators, keys in their order, indent=N).
 *
 * Floats print as Python's repr: the shortest digits that read back to the same double, in
 * fixed notation for exponents -4..15, else "1e+16".  We rejected "%g": 0.1 + 0.2 prints
 * "0.3" there and "0.30000000000000004" in Python.  Tuples are lists marked in a table by
 * address (jv_set_tag), each held until the render ends so an address is never reused; we
 * rejected a tuple kind of jv: a tuple inside a list is a bare json_t, which has no room for it.
 */
#include "jinja/jinja_int.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const jv JV_UNDEFINED = {JV_UNDEF, NULL, NULL, NULL};

int jerr(jctx *c, const jnode *at, const char *fmt, ...) {
    char m[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!c->e->msg[0]) { /* the first error is the one reported */
        if (at) sm_errf(c->e, "line %d col %d: %s", at->line, at->col, m);
        else sm_errf(c->e, "%s", m);
    }
    return -1;
}

int joom(jctx *c) { return jerr(c, NULL, "out of memory"); }

/* ---- the pool ------------------------------------------------------------------------------ */

jv jv_own(jctx *c, json_t *j) {
    jv v = JV_UNDEFINED;
    if (!j) { joom(c); return v; }
    if (c->npool == c->cappool) {
        int nc = c->cappool ? c->cappool * 2 : 1024;
        json_t **np = realloc(c->pool, sizeof *np * (size_t)nc);
        if (!np) { json_decref(j); joom(c); return v; }
        c->pool = np;
        c->cappool = nc;
    }
    c->pool[c->npool++] = j;
    v.k = JV_JSON;
    v.j = j;
    return v;
}

jv jv_borrow(jctx *c, json_t *j) {
    if (!j) return JV_UNDEFINED;
    return jv_own(c, json_incref(j));
}

jv jv_str(jctx *c, const char *s, size_t n) {
    if (n > MAX_OUT) { jerr(c, NULL, "a string longer than %zu bytes", MAX_OUT); return JV_UNDEFINED; }
    return jv_own(c, json_stringn_nocheck(s ? s : "", n));
}
jv jv_buf(jctx *c, sm_buf *b) {
    jv v = jv_str(c, b->p, b->n);
    sm_buf_free(b);
    return v;
}
jv jv_int(jctx *c, long long x) { return jv_own(c, json_integer(x)); }
jv jv_real(jctx *c, double x) {
    if (isnan(x) || isinf(x)) { /* JSON (jansson) has no such numbers */
        jerr(c, NULL, "a float that is %s is not supported here", isnan(x) ? "nan" : "infinite");
        return JV_UNDEFINED;
    }
    return jv_own(c, json_real(x));
}
jv jv_bool(jctx *c, int x) { return jv_own(c, json_boolean(x)); }
jv jv_none(jctx *c) { return jv_own(c, json_null()); }
jv jv_list(jctx *c) { return jv_own(c, json_array()); }

jv jv_elem(const jctx *c, json_t *x) {
    if (!x || x == c->undef) return JV_UNDEFINED;
    return (jv){JV_JSON, x, NULL, NULL};
}

json_t *jv_json(jctx *c, const jnode *at, jv v) {
    if (v.k == JV_JSON) return v.j;
    if (v.k == JV_UNDEF) {
        if (!c->undef && !(c->undef = json_object())) { joom(c); return NULL; }
        return c->undef;
    }
    jerr(c, at, "a list or dict can hold only data values, not a %s", jv_kind_name(v));
    return NULL;
}

/* ---- kinds ------------------------------------------------------------------------------- */

int jv_is_str(jv v) { return v.k == JV_JSON && json_is_string(v.j); }
int jv_is_list(jv v) { return v.k == JV_JSON && json_is_array(v.j); }
int jv_is_dict(jv v) { return v.k == JV_JSON && json_is_object(v.j); }
int jv_has_attrs(jv v) { return (v.k == JV_JSON || v.k == JV_NS || v.k == JV_LOOP) && json_is_object(v.j); }

int jv_truthy(jv v) {
    if (v.k == JV_UNDEF) return 0;
    if (v.k != JV_JSON) return 1; /* objects without __bool__ / __len__ */
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

const char *jv_kind_name(jv v) {
    switch (v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    }
    switch (json_typeof(v.j)) {
    case JSON_NULL: return "NoneType";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_STRING: return "str";
    case JSON_ARRAY: return "list";
    case JSON_OBJECT: return "dict";
    }
    return "object";
}

/* ---- tags: tuples and groupby's pairs, by address ------------------------------------------ */

static size_t tag_slot(const jctx *c, const json_t *j) {
    size_t h = (size_t)(((uintptr_t)j >> 4) * 0x9E3779B97F4A7C15ull);
    return h & (c->captag - 1);
}

int jv_tag(const jctx *c, const json_t *j) {
    if (!c->ntag || !j) return 0;
    for (size_t i = tag_slot(c, j);; i = (i + 1) & (c->captag - 1)) { /* linear probing */
        if (!c->tagk[i]) return 0;
        if (c->tagk[i] == j) return c->tagv[i];
    }
}

int jv_is_tuple(const jctx *c, const json_t *j) {
    int t = jv_tag(c, j);
    return t == JTAG_TUPLE || t == JTAG_GROUP;
}

int jv_set_tag(jctx *c, json_t *j, int tag) {
    if ((c->ntag + 1) * 2 > c->captag) { /* keep it at most half full: rehash into twice the room */
        size_t nc = c->captag ? c->captag * 2 : 64;
        json_t **nk = calloc(nc, sizeof *nk);
        unsigned char *nv = calloc(nc, 1);
        if (!nk || !nv) { free(nk); free(nv); return joom(c); }
        json_t **ok = c->tagk;
        unsigned char *ov = c->tagv;
        size_t oc = c->captag;
        c->tagk = nk;
        c->tagv = nv;
        c->captag = nc;
        for (size_t i = 0; i < oc; i++) {
            if (!ok[i]) continue;
            size_t s = tag_slot(c, ok[i]);
            while (nk[s]) s = (s + 1) & (nc - 1);
            nk[s] = ok[i];
            nv[s] = ov[i];
        }
        free(ok);
        free(ov);
    }
    size_t s = tag_slot(c, j);
    while (c->tagk[s] && c->tagk[s] != j) s = (s + 1) & (c->captag - 1);
    if (!c->tagk[s]) {
        c->tagk[s] = json_incref(j); /* held: its address stays its own until the render ends */
        c->ntag++;
    }
    c->tagv[s] = (unsigned char)tag;
    return 0;
}

jv jv_tuple(jctx *c, json_t *items) {
    jv v = jv_own(c, items);
    if (v.k != JV_UNDEF && jv_set_tag(c, v.j, JTAG_TUPLE)) return JV_UNDEFINED;
    return v;
}

/* ---- str() and repr() ------------------------------------------------------------------------ */

void jv_pyfloat(double x, char *b) {
    if (isnan(x)) { strcpy(b, "nan"); return; }
    if (isinf(x)) { strcpy(b, x < 0 ? "-inf" : "inf"); return; }
    int p = 1;
    char t[64];
    for (; p < 17; p++) { /* the fewest significant digits that read back as x */
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

/* Python's repr of a str: quotes chosen as Python does, non-printables escaped. */
static int str_repr(sm_buf *o, const char *s, size_t n) {
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    int rc = sm_buf_add(o, &q, 1);
    for (size_t i = 0; i < n && !rc;) {
        size_t st = i;
        uint32_t cp = ju_next(s, n, &i);
        if (cp == '\\' || cp == (uint32_t)q) rc = sm_buf_addf(o, "\\%c", (char)cp);
        else if (cp == '\n') rc = sm_buf_str(o, "\\n");
        else if (cp == '\r') rc = sm_buf_str(o, "\\r");
        else if (cp == '\t') rc = sm_buf_str(o, "\\t");
        else if (cp < 0x80 ? (cp < 0x20 || cp == 0x7f) : !ju_isprintable(cp))
            rc = sm_buf_addf(o, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
        else rc = sm_buf_add(o, s + st, i - st);
    }
    return rc || sm_buf_add(o, &q, 1) ? -1 : 0;
}

static int json_repr(const jctx *c, json_t *j, sm_buf *o, int top) {
    char b[64];
    if (j == c->undef) return top ? 0 : sm_buf_str(o, "Undefined");
    switch (json_typeof(j)) {
    case JSON_NULL: return sm_buf_str(o, "None");
    case JSON_TRUE: return sm_buf_str(o, "True");
    case JSON_FALSE: return sm_buf_str(o, "False");
    case JSON_INTEGER: return sm_buf_addf(o, "%lld", (long long)json_integer_value(j));
    case JSON_REAL: jv_pyfloat(json_real_value(j), b); return sm_buf_str(o, b);
    case JSON_STRING:
        if (top) return sm_buf_add(o, json_string_value(j), json_string_length(j));
        return str_repr(o, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        static const char *const view[] = {"dict_keys(", "dict_values(", "dict_items("};
        int tag = jv_tag(c, j), tuple = tag == JTAG_TUPLE || tag == JTAG_GROUP;
        size_t n = json_array_size(j);
        int rc = tag >= JTAG_KEYS && sm_buf_str(o, view[tag - JTAG_KEYS]);
        rc = rc || sm_buf_str(o, tuple ? "(" : "[");
        for (size_t i = 0; i < n && !rc; i++)
            rc = (i && sm_buf_str(o, ", ")) || json_repr(c, json_array_get(j, i), o, 0);
        if (!rc && tuple && n == 1) rc = sm_buf_str(o, ",");
        return rc || sm_buf_str(o, tuple ? ")" : "]") || (tag >= JTAG_KEYS && sm_buf_str(o, ")"));
    }
    case JSON_OBJECT: {
        int rc = sm_buf_str(o, "{"), first = 1;
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            rc = rc || (!first && sm_buf_str(o, ", ")) || str_repr(o, k, strlen(k)) || sm_buf_str(o, ": ") ||
                 json_repr(c, v, o, 0);
            first = 0;
        }
        return rc || sm_buf_str(o, "}");
    }
    }
    return 0;
}

static int str_or_repr(jctx *c, jv v, sm_buf *out, int top) {
    int rc = 0;
    switch (v.k) {
    case JV_UNDEF: return 0;
    case JV_JSON: rc = json_repr(c, v.j, out, top); break;
    case JV_NS: rc = sm_buf_str(out, "<Namespace ") || json_repr(c, v.j, out, 0) || sm_buf_str(out, ">"); break;
    case JV_LOOP:
        rc = sm_buf_addf(out, "<LoopContext %lld/%lld>", (long long)json_integer_value(json_object_get(v.j, "index")),
                         (long long)json_integer_value(json_object_get(v.j, "length")));
        break;
    case JV_MACRO: rc = sm_buf_addf(out, "<Macro '%s'>", ((const jnode *)v.p)->s); break;
    default: return jerr(c, NULL, "a %s cannot be written out (Python would write its address)", jv_kind_name(v));
    }
    return rc ? joom(c) : 0;
}

int jv_tostr(jctx *c, jv v, sm_buf *out) { return str_or_repr(c, v, out, 1); }
int jv_repr(jctx *c, jv v, sm_buf *out) { return str_or_repr(c, v, out, 0); }

int jv_string(jctx *c, jv v, jv *out) {
    if (jv_is_str(v)) { *out = v; return 0; }
    sm_buf b = {0};
    if (jv_tostr(c, v, &b)) { sm_buf_free(&b); return -1; }
    *out = jv_buf(c, &b);
    return out->k == JV_UNDEF ? -1 : 0;
}

/* ---- comparison ------------------------------------------------------------------------------ */

int jv_equal(const jctx *c, jv a, jv b) {
    if (a.k == JV_JSON) a = jv_elem(c, a.j);
    if (b.k == JV_JSON) b = jv_elem(c, b.j);
    if (a.k == JV_UNDEF || b.k == JV_UNDEF) return a.k == b.k;
    if (a.k != JV_JSON || b.k != JV_JSON) return a.k == b.k && a.j == b.j && a.p == b.p;
    if (jv_isnum(a) && jv_isnum(b)) {
        if (jv_isint(a) && jv_isint(b)) return jv_intv(a) == jv_intv(b);
        return jv_num(a) == jv_num(b);
    }
    if (json_typeof(a.j) != json_typeof(b.j)) return 0;
    if (json_is_array(a.j)) {
        size_t n = json_array_size(a.j);
        if (n != json_array_size(b.j) || jv_is_tuple(c, a.j) != jv_is_tuple(c, b.j)) return 0;
        for (size_t i = 0; i < n; i++)
            if (!jv_equal(c, (jv){JV_JSON, json_array_get(a.j, i), NULL, NULL}, (jv){JV_JSON, json_array_get(b.j, i), NULL, NULL}))
                return 0;
        return 1;
    }
    if (json_is_object(a.j)) {
        if (json_object_size(a.j) != json_object_size(b.j)) return 0;
        const char *k;
        json_t *x;
        json_object_foreach(a.j, k, x) {
            json_t *y = json_object_get(b.j, k);
            if (!y || !jv_equal(c, (jv){JV_JSON, x, NULL, NULL}, (jv){JV_JSON, y, NULL, NULL})) return 0;
        }
        return 1;
    }
    return json_equal(a.j, b.j);
}

int jv_cmp(jctx *c, const jnode *at, jv a, jv b, int *r) {
    if (jv_isnum(a) && jv_isnum(b)) {
        if (jv_isint(a) && jv_isint(b)) *r = (jv_intv(a) > jv_intv(b)) - (jv_intv(a) < jv_intv(b));
        else *r = (jv_num(a) > jv_num(b)) - (jv_num(a) < jv_num(b));
        return 0;
    }
    if (jv_is_str(a) && jv_is_str(b)) { /* UTF-8 byte order is code point order */
        size_t an = json_string_length(a.j), bn = json_string_length(b.j);
        int k = memcmp(json_string_value(a.j), json_string_value(b.j), an < bn ? an : bn);
        *r = k ? (k > 0) - (k < 0) : (an > bn) - (an < bn);
        return 0;
    }
    if (jv_is_list(a) && jv_is_list(b) && jv_is_tuple(c, a.j) == jv_is_tuple(c, b.j)) {
        size_t an = json_array_size(a.j), bn = json_array_size(b.j);
        for (size_t i = 0; i < an && i < bn; i++) { /* the first items that differ decide */
            jv x = {JV_JSON, json_array_get(a.j, i), NULL, NULL}, y = {JV_JSON, json_array_get(b.j, i), NULL, NULL};
            if (!jv_equal(c, x, y)) return jv_cmp(c, at, x, y, r);
        }
        *r = (an > bn) - (an < bn);
        return 0;
    }
    const char *ta = jv_is_list(a) && jv_is_tuple(c, a.j) ? "tuple" : jv_kind_name(a);
    const char *tb = jv_is_list(b) && jv_is_tuple(c, b.j) ? "tuple" : jv_kind_name(b);
    return jerr(c, at, "'<' not supported between instances of '%s' and '%s'", ta, tb);
}

/* ---- iteration --------------------------------------------------------------------------------- */

int jv_items(jctx *c, const jnode *at, jv v, json_t **items) {
    *items = NULL;
    json_t *l = NULL;
    if (v.k == JV_UNDEF) l = json_array();
    else if (v.k != JV_JSON) return jerr(c, at, "'%s' object is not iterable", jv_kind_name(v));
    else if (json_is_array(v.j)) { *items = v.j; return 0; }
    else if (json_is_object(v.j)) { /* a dict's keys */
        l = json_array();
        const char *k;
        json_t *x;
        json_object_foreach(v.j, k, x) if (l && json_array_append_new(l, json_string_nocheck(k))) { json_decref(l); l = NULL; break; }
    } else if (json_is_string(v.j)) l = ju_chars(json_string_value(v.j), json_string_length(v.j));
    else return jerr(c, at, "'%s' object is not iterable", jv_kind_name(v));
    jv h = jv_own(c, l);
    if (h.k == JV_UNDEF) return -1;
    *items = h.j;
    return 0;
}

/* ---- json.dumps ------------------------------------------------------------------------------- */

/* A JSON string as Python's json.dumps writes it (ascii: ensure_ascii=True). */
static int json_str(sm_buf *o, const char *s, size_t n, int ascii) {
    int rc = sm_buf_str(o, "\"");
    for (size_t i = 0; i < n && !rc;) {
        size_t st = i;
        uint32_t cp = ju_next(s, n, &i);
        switch (cp) {
        case '"': rc = sm_buf_str(o, "\\\""); break;
        case '\\': rc = sm_buf_str(o, "\\\\"); break;
        case '\n': rc = sm_buf_str(o, "\\n"); break;
        case '\r': rc = sm_buf_str(o, "\\r"); break;
        case '\t': rc = sm_buf_str(o, "\\t"); break;
        case '\b': rc = sm_buf_str(o, "\\b"); break;
        case '\f': rc = sm_buf_str(o, "\\f"); break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7f)) {
                if (cp >= 0x10000) { /* a surrogate pair */
                    rc = sm_buf_addf(o, "\\u%04x\\u%04x", (unsigned)(0xD800 + ((cp - 0x10000) >> 10)),
                                     (unsigned)(0xDC00 + ((cp - 0x10000) & 0x3FF)));
                } else rc = sm_buf_addf(o, "\\u%04x", (unsigned)cp);
            } else rc = sm_buf_add(o, s + st, i - st);
        }
    }
    return rc || sm_buf_str(o, "\"");
}

static int newline_indent(sm_buf *o, const char *indent, int level) {
    if (sm_buf_str(o, "\n")) return -1;
    for (int i = 0; i < level; i++)
        if (sm_buf_str(o, indent)) return -1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Python's json.dumps layout: one line, or an indent with a newline and the indent a level. */
int jv_tojson(jctx *c, jv v, const jjson_opts *op, int level, sm_buf *o) {
    const char *indent = op->indent;
    if (v.k == JV_UNDEF) return jerr(c, NULL, "tojson: Object of type Undefined is not JSON serializable");
    if (v.k != JV_JSON) return jerr(c, NULL, "tojson: Object of type %s is not JSON serializable", jv_kind_name(v));
    if (level > 1000) return jerr(c, NULL, "tojson: values nested more than 1000 deep");
    json_t *j = v.j;
    if (j == c->undef) return jerr(c, NULL, "tojson: Object of type Undefined is not JSON serializable");
    char b[64];
    int rc = 0;
    switch (json_typeof(j)) {
    case JSON_NULL: return sm_buf_str(o, "null") ? joom(c) : 0;
    case JSON_TRUE: return sm_buf_str(o, "true") ? joom(c) : 0;
    case JSON_FALSE: return sm_buf_str(o, "false") ? joom(c) : 0;
    case JSON_INTEGER: return sm_buf_addf(o, "%lld", (long long)json_integer_value(j)) ? joom(c) : 0;
    case JSON_REAL:
        jv_pyfloat(json_real_value(j), b);
        rc = sm_buf_str(o, !strcmp(b, "nan") ? "NaN" : !strcmp(b, "inf") ? "Infinity" : !strcmp(b, "-inf") ? "-Infinity" : b);
        return rc ? joom(c) : 0;
    case JSON_STRING: return json_str(o, json_string_value(j), json_string_length(j), op->ascii) ? joom(c) : 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (jv_tag(c, j) >= JTAG_KEYS) return jerr(c, NULL, "tojson: Object of type dict_%s is not JSON serializable",
                                                   jv_tag(c, j) == JTAG_KEYS ? "keys" : jv_tag(c, j) == JTAG_VALUES ? "values" : "items");
        if (!n) return sm_buf_str(o, "[]") ? joom(c) : 0;
        if (sm_buf_str(o, "[")) return joom(c);
        for (size_t i = 0; i < n; i++) {
            if ((i && sm_buf_str(o, op->item_sep)) || (indent && newline_indent(o, indent, level + 1))) return joom(c);
            if (jv_tojson(c, (jv){JV_JSON, json_array_get(j, i), NULL, NULL}, op, level + 1, o)) return -1;
        }
        if ((indent && newline_indent(o, indent, level)) || sm_buf_str(o, "]")) return joom(c);
        return 0;
    }
    case JSON_OBJECT: {
        if (!json_object_size(j)) return sm_buf_str(o, "{}") ? joom(c) : 0;
        size_t nk = json_object_size(j), i = 0;
        const char **keys = malloc(sizeof *keys * nk), *k;
        json_t *x;
        if (!keys) return joom(c);
        json_object_foreach(j, k, x) keys[i++] = k;
        if (op->sort_keys) qsort(keys, nk, sizeof *keys, cmp_str); /* UTF-8 byte order is code point order */
        rc = sm_buf_str(o, "{");
        for (i = 0; i < nk && !rc; i++) {
            if ((i && sm_buf_str(o, op->item_sep)) || (indent && newline_indent(o, indent, level + 1)) ||
                json_str(o, keys[i], strlen(keys[i]), op->ascii) || sm_buf_str(o, op->key_sep)) {
                rc = joom(c);
                break;
            }
            rc = jv_tojson(c, (jv){JV_JSON, json_object_get(j, keys[i]), NULL, NULL}, op, level + 1, o);
        }
        free(keys);
        if (!rc && ((indent && newline_indent(o, indent, level)) || sm_buf_str(o, "}"))) rc = joom(c);
        return rc;
    }
    }
    return 0;
}
