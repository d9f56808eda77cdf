/* jinja_builtin.c: the filters, tests, string / dict methods and global functions of the
 * Jinja subset (see jinja.h), each with Jinja2's (Python's) meaning, and the lists of their
 * names the parser checks templates against.
 *
 * One table per kind holds the names, so the parser's refusals and the evaluator agree; the
 * evaluation is a chain of strcmp per call (chat templates call a few dozen per render).  We
 * rejected function-pointer tables: most built-ins are three lines and share their argument
 * handling, which a chain keeps in one place.
 */
#include "serve/jinja_int.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const char *const FILTERS[] = {"trim", "length", "count", "upper", "lower", "default", "d", "join", "first",
                                      "last", "tojson", "items", "selectattr", "rejectattr", "map", "string", "int",
                                      "float", "list", "replace", "capitalize", "indent", "reverse", "safe", "abs",
                                      "title", "dictsort", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "mapping", "iterable", "number",
                                    "integer", "float", "boolean", "true", "false", "sequence", "eq", "equalto",
                                    "ne", "odd", "even", "divisibleby", "in", "lower", "upper", "callable", NULL};
static const char *const METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper",
                                      "lower", "replace", "items", "keys", "values", "get", "title", "capitalize", NULL};
static const char *const FUNCTIONS[] = {"raise_exception", "namespace", "range", "dict", "strftime_now", NULL};

static int in_list(const char *const *l, const char *s) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], s)) return 1;
    return 0;
}
int sm_jinja_known_filter(const char *name) { return in_list(FILTERS, name); }
int sm_jinja_known_test(const char *name) { return in_list(TESTS, name); }
int sm_jinja_known_method(const char *name) { return in_list(METHODS, name); }
int sm_jinja_known_function(const char *name) { return in_list(FUNCTIONS, name); }

static const jv UNDEF = {JV_UNDEF, NULL, NULL};

static int is_str(jv v) { return v.k == JV_JSON && json_is_string(v.j); }
static int is_list(jv v) { return v.k == JV_JSON && json_is_array(v.j); }
static int is_dict(jv v) { return (v.k == JV_JSON || v.k == JV_NS) && json_is_object(v.j); }

/* Argument i, or the keyword argument name, or UNDEF. */
static jv arg(jv *args, int nargs, char **kw, int i, const char *name) {
    int pos = 0;
    for (int k = 0; k < nargs; k++) {
        if (kw && kw[k]) { if (name && !strcmp(kw[k], name)) return args[k]; }
        else if (pos++ == i) return args[k];
    }
    return UNDEF;
}

/* str(v) as a new string value. */
static int to_string(jctx *c, jv v, jv *out) {
    if (is_str(v)) { *out = v; return 0; }
    sm_sbuf b = {0};
    int rc = jv_tostr(c, v, &b);
    *out = rc ? UNDEF : jv_str(c, b.p, b.n);
    sm_sbuf_free(&b);
    return out->k == JV_UNDEF ? jerr(c, NULL, "out of memory") : 0;
}

static int py_space(unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f); }

/* s.strip(chars) / lstrip / rstrip: which ends (1 left, 2 right, 3 both). */
static int strip(jctx *c, jv s, jv chars, int ends, jv *out) {
    const char *p = json_string_value(s.j), *set = is_str(chars) ? json_string_value(chars.j) : NULL;
    size_t b = 0, e = json_string_length(s.j);
#define STRIPS(ch) (set ? strchr(set, (ch)) != NULL && (ch) : py_space((unsigned char)(ch)))
    if (ends & 1) while (b < e && STRIPS(p[b])) b++;
    if (ends & 2) while (e > b && STRIPS(p[e - 1])) e--;
#undef STRIPS
    *out = jv_str(c, p + b, e - b);
    return out->k == JV_UNDEF ? -1 : 0;
}

static int str_case(jctx *c, jv s, int mode, jv *out) { /* 0 lower, 1 upper, 2 capitalize, 3 title */
    size_t n = json_string_length(s.j);
    char *b = malloc(n + 1);
    if (!b) return jerr(c, NULL, "out of memory");
    memcpy(b, json_string_value(s.j), n);
    int start = 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)b[i];
        int up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && start);
        b[i] = (char)(up ? toupper(ch) : tolower(ch));
        start = !isalpha(ch);
    }
    *out = jv_str(c, b, n);
    free(b);
    return out->k == JV_UNDEF ? -1 : 0;
}

static int replace(jctx *c, jv s, jv from, jv to, jv count, jv *out) {
    if (!is_str(from) || !is_str(to)) return jerr(c, NULL, "replace() takes two strings");
    const char *p = json_string_value(s.j), *f = json_string_value(from.j);
    size_t n = json_string_length(s.j), fn = json_string_length(from.j);
    long long left = jv_isint(count) ? jv_intv(count) : -1;
    sm_sbuf b = {0};
    size_t i = 0;
    while (i <= n) {
        if (left != 0 && (fn ? i + fn <= n && !memcmp(p + i, f, fn) : 1)) {
            sm_sbuf_add(&b, json_string_value(to.j), json_string_length(to.j));
            if (left > 0) left--;
            if (fn) { i += fn; continue; }
        }
        if (i < n) sm_sbuf_add(&b, p + i, 1);
        i++;
    }
    *out = jv_str(c, b.p, b.n);
    sm_sbuf_free(&b);
    return out->k == JV_UNDEF ? -1 : 0;
}

static int split(jctx *c, jv s, jv sep, jv maxsplit, jv *out) {
    const char *p = json_string_value(s.j);
    size_t n = json_string_length(s.j), i = 0;
    long long left = jv_isint(maxsplit) ? jv_intv(maxsplit) : -1;
    json_t *l = json_array();
    if (jv_own(c, l).k == JV_UNDEF) return -1;
    if (is_str(sep)) {
        const char *f = json_string_value(sep.j);
        size_t fn = json_string_length(sep.j), st = 0;
        if (!fn) return jerr(c, NULL, "split(): empty separator");
        for (i = 0; i + fn <= n;) {
            if (left != 0 && !memcmp(p + i, f, fn)) {
                json_array_append_new(l, json_stringn_nocheck(p + st, i - st));
                i += fn;
                st = i;
                if (left > 0) left--;
            } else i++;
        }
        json_array_append_new(l, json_stringn_nocheck(p + st, n - st));
    } else { /* runs of whitespace, no empty pieces */
        while (1) {
            while (i < n && py_space((unsigned char)p[i])) i++;
            if (i >= n) break;
            size_t st = i;
            if (left == 0) { /* maxsplit reached: the rest, its trailing space stripped */
                size_t e = n;
                while (e > st && py_space((unsigned char)p[e - 1])) e--;
                json_array_append_new(l, json_stringn_nocheck(p + st, e - st));
                break;
            }
            while (i < n && !py_space((unsigned char)p[i])) i++;
            json_array_append_new(l, json_stringn_nocheck(p + st, i - st));
            if (left > 0) left--;
        }
    }
    *out = (jv){JV_JSON, l, NULL};
    return 0;
}

/* A dict's items as a list of [key, value] pairs. */
static int items(jctx *c, jv d, jv *out) {
    json_t *l = json_array();
    const char *k;
    json_t *x;
    json_object_foreach(d.j, k, x) json_array_append_new(l, json_pack("[sO]", k, x));
    *out = jv_own(c, l);
    return out->k == JV_UNDEF ? -1 : 0;
}

int jb_method(jctx *c, const jnode *n, jv obj, const char *name, jv *args, int nargs, char **kw, jv *out) {
    jv a0 = arg(args, nargs, kw, 0, NULL), a1 = arg(args, nargs, kw, 1, NULL), a2 = arg(args, nargs, kw, 2, NULL);
    *out = UNDEF;
    if (obj.k == JV_UNDEF) return jerr(c, n, "'%s()' of an undefined value", name);
    if (is_str(obj)) {
        if (!strcmp(name, "strip")) return strip(c, obj, a0, 3, out);
        if (!strcmp(name, "lstrip")) return strip(c, obj, a0, 1, out);
        if (!strcmp(name, "rstrip")) return strip(c, obj, a0, 2, out);
        if (!strcmp(name, "lower")) return str_case(c, obj, 0, out);
        if (!strcmp(name, "upper")) return str_case(c, obj, 1, out);
        if (!strcmp(name, "capitalize")) return str_case(c, obj, 2, out);
        if (!strcmp(name, "title")) return str_case(c, obj, 3, out);
        if (!strcmp(name, "replace")) return replace(c, obj, a0, a1, a2, out);
        if (!strcmp(name, "split")) return split(c, obj, a0, arg(args, nargs, kw, 1, "maxsplit"), out);
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            if (!is_str(a0)) return jerr(c, n, "%s() takes a string", name);
            size_t sn = json_string_length(obj.j), pn = json_string_length(a0.j);
            const char *s = json_string_value(obj.j), *p = json_string_value(a0.j);
            int r = pn <= sn && !memcmp(name[0] == 's' ? s : s + sn - pn, p, pn);
            *out = jv_bool(c, r);
            return out->k == JV_UNDEF ? -1 : 0;
        }
    } else if (is_dict(obj)) {
        if (!strcmp(name, "items")) return items(c, obj, out);
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            json_t *l = json_array();
            const char *k;
            json_t *x;
            json_object_foreach(obj.j, k, x) json_array_append_new(l, name[0] == 'k' ? json_string(k) : json_incref(x));
            *out = jv_own(c, l);
            return out->k == JV_UNDEF ? -1 : 0;
        }
        if (!strcmp(name, "get")) {
            if (!is_str(a0)) { *out = a1.k == JV_UNDEF ? jv_none(c) : a1; return 0; }
            json_t *x = json_object_get(obj.j, json_string_value(a0.j));
            *out = x ? jv_borrow(c, x) : a1.k == JV_UNDEF ? jv_none(c) : a1;
            return out->k == JV_UNDEF ? -1 : 0;
        }
    }
    return jerr(c, n, "this value has no method '%s()'", name);
}

/* The value of attribute name of item x (a dict's key), UNDEF when absent. */
static jv attr_of(jctx *c, jv x, jv name) {
    if (!is_dict(x) || !is_str(name)) return UNDEF;
    return jv_borrow(c, json_object_get(x.j, json_string_value(name.j)));
}

static int as_list(jctx *c, const jnode *n, jv v, json_t **l) {
    if (is_list(v)) { *l = v.j; return 0; }
    if (v.k == JV_UNDEF) { *l = json_array(); return jv_own(c, *l).k == JV_UNDEF ? -1 : 0; }
    return jerr(c, n, "filter '%s' needs a list", n->s);
}

int jb_filter(jctx *c, const jnode *n, jv in, jv *args, int nargs, char **kw, jv *out) {
    const char *f = n->s;
    jv a0 = arg(args, nargs, kw, 0, NULL), a1 = arg(args, nargs, kw, 1, NULL);
    *out = UNDEF;
    if (!strcmp(f, "safe")) { *out = in; return 0; }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv dv = arg(args, nargs, kw, 0, "default_value"), bo = arg(args, nargs, kw, 1, "boolean");
        int use = jv_truthy(bo) ? !jv_truthy(in) : in.k == JV_UNDEF;
        *out = use ? (dv.k == JV_UNDEF ? jv_str(c, "", 0) : dv) : in;
        return 0;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        long long len = 0;
        if (is_str(in)) len = (long long)jv_ulen(json_string_value(in.j), json_string_length(in.j));
        else if (is_list(in)) len = (long long)json_array_size(in.j);
        else if (is_dict(in)) len = (long long)json_object_size(in.j);
        else if (in.k != JV_UNDEF) return jerr(c, n, "length of a value that has none");
        *out = jv_int(c, len);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(f, "tojson")) {
        jv ind = arg(args, nargs, kw, 1, "indent"), sep = arg(args, nargs, kw, 2, "separators");
        jv sort = arg(args, nargs, kw, 3, "sort_keys"); /* tojson(x, ensure_ascii, indent, separators, sort_keys) */
        jjson_opts op = {jv_isint(ind) ? (int)jv_intv(ind) : -1, jv_isint(ind) ? "," : ", ", ": ", jv_truthy(sort),
                         jv_truthy(arg(args, nargs, kw, 0, "ensure_ascii"))};
        if (sep.k == JV_JSON && json_is_array(sep.j) && json_array_size(sep.j) == 2 &&
            json_is_string(json_array_get(sep.j, 0)) && json_is_string(json_array_get(sep.j, 1))) {
            op.item_sep = json_string_value(json_array_get(sep.j, 0));
            op.key_sep = json_string_value(json_array_get(sep.j, 1));
        } else if (sep.k != JV_UNDEF && !(sep.k == JV_JSON && json_is_null(sep.j)))
            return jerr(c, n, "tojson: separators must be a pair of strings");
        sm_sbuf b = {0};
        int rc = jv_tojson(c, in, &op, 0, &b);
        if (!rc) *out = jv_str(c, b.p, b.n);
        sm_sbuf_free(&b);
        return rc || out->k == JV_UNDEF ? jerr(c, n, "tojson failed") : 0;
    }
    if (!strcmp(f, "string")) return to_string(c, in, out);
    if (!strcmp(f, "list")) {
        if (is_list(in)) { *out = in; return 0; }
        if (is_str(in) || is_dict(in)) { /* characters / keys */
            json_t *l = is_str(in) ? jv_chars(json_string_value(in.j), json_string_length(in.j)) : json_array();
            const char *k;
            json_t *x;
            if (l && is_dict(in)) json_object_foreach(in.j, k, x) json_array_append_new(l, json_string(k));
            *out = jv_own(c, l);
            return out->k == JV_UNDEF ? -1 : 0;
        }
        return jerr(c, n, "list of a value that is not iterable");
    }
    if (!strcmp(f, "items")) {
        if (in.k == JV_UNDEF) { *out = jv_own(c, json_array()); return 0; }
        if (!is_dict(in)) return jerr(c, n, "items needs a dict");
        return items(c, in, out);
    }
    if (!strcmp(f, "dictsort")) { /* [key, value] pairs by key, case-insensitive (Jinja2's default) */
        if (!is_dict(in)) return jerr(c, n, "dictsort needs a dict");
        if (items(c, in, out)) return -1;
        json_t *l = out->j;
        for (size_t i = 1; i < json_array_size(l); i++) /* insertion sort: dicts of a chat template are small */
            for (size_t k = i; k > 0 && strcasecmp(json_string_value(json_array_get(json_array_get(l, k - 1), 0)),
                                                   json_string_value(json_array_get(json_array_get(l, k), 0))) > 0; k--) {
                json_t *a = json_incref(json_array_get(l, k - 1));
                json_array_set(l, k - 1, json_array_get(l, k));
                json_array_set_new(l, k, a);
            }
        return 0;
    }
    if (!strcmp(f, "int") || !strcmp(f, "float")) {
        double x = 0;
        if (jv_isnum(in)) x = jv_num(in);
        else if (is_str(in)) { char *e; x = strtod(json_string_value(in.j), &e); if (*e) x = 0; }
        *out = f[0] == 'i' ? jv_int(c, (long long)x) : jv_real(c, x);
        if (f[0] == 'i' && jv_isint(in)) *out = jv_int(c, jv_intv(in));
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(f, "abs")) {
        if (!jv_isnum(in)) return jerr(c, n, "abs of a non-number");
        *out = jv_isint(in) ? jv_int(c, llabs(jv_intv(in))) : jv_real(c, jv_num(in) < 0 ? -jv_num(in) : jv_num(in));
        return 0;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        json_t *l;
        if (is_str(in)) { /* a string's first / last character */
            l = jv_chars(json_string_value(in.j), json_string_length(in.j));
            if (jv_own(c, l).k == JV_UNDEF) return -1;
        } else if (as_list(c, n, in, &l)) return -1;
        size_t sz = json_array_size(l);
        if (sz) *out = jv_borrow(c, json_array_get(l, f[0] == 'f' ? 0 : sz - 1));
        return 0;
    }
    if (!strcmp(f, "reverse")) {
        if (is_str(in)) {
            size_t *o, cnt; const char *s = json_string_value(in.j);
            if (jv_utf8_index(s, json_string_length(in.j), &o, &cnt)) return -1;
            sm_sbuf b = {0};
            for (size_t i = cnt; i-- > 0;) sm_sbuf_add(&b, s + o[i], o[i + 1] - o[i]);
            *out = jv_str(c, b.p, b.n);
            sm_sbuf_free(&b);
            free(o);
            return 0;
        }
        json_t *l, *r = json_array();
        if (as_list(c, n, in, &l)) { json_decref(r); return -1; }
        for (size_t i = json_array_size(l); i-- > 0;) json_array_append(r, json_array_get(l, i));
        *out = jv_own(c, r);
        return 0;
    }
    if (!strcmp(f, "join")) {
        json_t *l;
        if (as_list(c, n, in, &l)) return -1;
        jv attr = arg(args, nargs, kw, 1, "attribute");
        jv sep = arg(args, nargs, kw, 0, "d");
        sm_sbuf b = {0};
        for (size_t i = 0; i < json_array_size(l); i++) {
            if (i && is_str(sep)) sm_sbuf_add(&b, json_string_value(sep.j), json_string_length(sep.j));
            jv x = jv_borrow(c, json_array_get(l, i));
            if (attr.k != JV_UNDEF) x = attr_of(c, x, attr);
            jv_tostr(c, x, &b);
        }
        *out = jv_str(c, b.p, b.n);
        sm_sbuf_free(&b);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr") || !strcmp(f, "map")) {
        json_t *l, *r = json_array();
        if (jv_own(c, r).k == JV_UNDEF || as_list(c, n, in, &l)) return -1;
        int sel = f[0] == 's';
        jv attr = f[0] == 'm' ? arg(args, nargs, kw, 99, "attribute") : a0;
        if (!is_str(attr)) return jerr(c, n, "%s needs an attribute name%s", f, f[0] == 'm' ? " (map(attribute='x'))" : "");
        jv dflt = arg(args, nargs, kw, 99, "default");
        for (size_t i = 0; i < json_array_size(l); i++) {
            jv x = jv_borrow(c, json_array_get(l, i)), v = attr_of(c, x, attr);
            if (f[0] == 'm') {
                if (v.k == JV_UNDEF) v = dflt;
                if (v.k != JV_JSON) return jerr(c, n, "map: item %zu has no attribute '%s'", i, json_string_value(attr.j));
                json_array_append(r, v.j);
                continue;
            }
            int t = jv_truthy(v);
            if (a1.k != JV_UNDEF) { /* a test with its arguments */
                if (!is_str(a1) || !sm_jinja_known_test(json_string_value(a1.j))) return jerr(c, n, "%s: unsupported test", f);
                jnode tn = *n;
                tn.s = (char *)json_string_value(a1.j);
                if (jb_test(c, &tn, v, args + 2, nargs - 2 > 0 ? nargs - 2 : 0, &t)) return -1;
            }
            if (t == sel) json_array_append(r, x.j);
        }
        *out = (jv){JV_JSON, r, NULL};
        return 0;
    }
    /* the rest take a string */
    jv s;
    if (to_string(c, in, &s)) return -1;
    if (!strcmp(f, "trim")) return strip(c, s, a0, 3, out);
    if (!strcmp(f, "upper")) return str_case(c, s, 1, out);
    if (!strcmp(f, "lower")) return str_case(c, s, 0, out);
    if (!strcmp(f, "capitalize")) { /* Jinja2: first upper, the rest lower */
        return str_case(c, s, 2, out);
    }
    if (!strcmp(f, "title")) return str_case(c, s, 3, out);
    if (!strcmp(f, "replace")) return replace(c, s, a0, a1, arg(args, nargs, kw, 2, "count"), out);
    if (!strcmp(f, "indent")) {
        jv w = arg(args, nargs, kw, 0, "width"), first = arg(args, nargs, kw, 1, "first"), blank = arg(args, nargs, kw, 2, "blank");
        char pad[256] = "    ";
        if (is_str(w)) snprintf(pad, sizeof pad, "%s", json_string_value(w.j));
        else if (jv_isint(w)) {
            long long k = jv_intv(w) > 255 ? 255 : jv_intv(w) < 0 ? 0 : jv_intv(w);
            memset(pad, ' ', (size_t)k);
            pad[k] = 0;
        }
        const char *p = json_string_value(s.j);
        size_t len = json_string_length(s.j);
        sm_sbuf b = {0};
        if (jv_truthy(first)) sm_sbuf_str(&b, pad);
        for (size_t i = 0; i < len; i++) {
            sm_sbuf_add(&b, p + i, 1);
            if (p[i] == '\n' && i + 1 < len) {
                int is_blank = 1; /* the next line is empty or whitespace only */
                for (size_t k = i + 1; k < len && p[k] != '\n'; k++) is_blank &= py_space((unsigned char)p[k]);
                if (!is_blank || jv_truthy(blank)) sm_sbuf_str(&b, pad);
            }
        }
        *out = jv_str(c, b.p, b.n);
        sm_sbuf_free(&b);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    return jerr(c, n, "unsupported filter '%s'", f);
}

int jb_test(jctx *c, const jnode *n, jv in, jv *args, int nargs, int *out) {
    const char *t = n->s;
    jv a0 = nargs > 0 ? args[0] : UNDEF;
    int J = in.k == JV_JSON;
    if (!strcmp(t, "defined")) *out = in.k != JV_UNDEF;
    else if (!strcmp(t, "undefined")) *out = in.k == JV_UNDEF;
    else if (!strcmp(t, "none")) *out = J && json_is_null(in.j);
    else if (!strcmp(t, "string")) *out = is_str(in);
    else if (!strcmp(t, "mapping")) *out = is_dict(in);
    else if (!strcmp(t, "iterable")) *out = J && (json_is_string(in.j) || json_is_array(in.j) || json_is_object(in.j));
    else if (!strcmp(t, "sequence")) *out = J && (json_is_string(in.j) || json_is_array(in.j) || json_is_object(in.j));
    else if (!strcmp(t, "number")) *out = J && (json_is_number(in.j) || json_is_boolean(in.j));
    else if (!strcmp(t, "integer")) *out = J && json_is_integer(in.j);
    else if (!strcmp(t, "float")) *out = J && json_is_real(in.j);
    else if (!strcmp(t, "boolean")) *out = J && json_is_boolean(in.j);
    else if (!strcmp(t, "true")) *out = J && json_is_true(in.j);
    else if (!strcmp(t, "false")) *out = J && json_is_false(in.j);
    else if (!strcmp(t, "callable")) *out = in.k == JV_MACRO;
    else if (!strcmp(t, "eq") || !strcmp(t, "equalto")) *out = jv_equal(in, a0);
    else if (!strcmp(t, "ne")) *out = !jv_equal(in, a0);
    else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        *out = 0;
        if (is_str(in)) {
            const char *s = json_string_value(in.j);
            int cased = 0, ok = 1;
            for (; *s; s++) {
                if (isalpha((unsigned char)*s)) cased = 1;
                if (t[0] == 'l' ? isupper((unsigned char)*s) : islower((unsigned char)*s)) ok = 0;
            }
            *out = cased && ok;
        }
    } else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (!jv_isint(in)) return jerr(c, n, "test '%s' needs an integer", t);
        long long x = jv_intv(in), d = t[0] == 'd' ? (jv_isint(a0) ? jv_intv(a0) : 0) : 2;
        if (!d) return jerr(c, n, "divisibleby needs a non-zero integer");
        *out = t[0] == 'o' ? x % 2 != 0 : x % d == 0;
    } else if (!strcmp(t, "in")) {
        jnode bn = *n;
        bn.s = "in";
        jv r;
        if (jb_binop(c, &bn, in, a0, &r)) return -1;
        *out = jv_truthy(r);
    } else return jerr(c, n, "unsupported test '%s'", t);
    return 0;
}

int jb_function(jctx *c, const jnode *n, const char *name, jv *args, int nargs, char **kw, jv *out) {
    *out = UNDEF;
    if (!strcmp(name, "raise_exception")) {
        sm_sbuf b = {0};
        if (nargs) jv_tostr(c, args[0], &b);
        sm_errf(c->e, "%s", b.p ? b.p : "");
        sm_sbuf_free(&b);
        c->raised = 1;
        return -1;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *d = json_object();
        if (jv_own(c, d).k == JV_UNDEF) return -1;
        for (int i = 0; i < nargs; i++) {
            if (kw && kw[i]) {
                if (args[i].k != JV_JSON) return jerr(c, n, "%s: '%s' must be a data value", name, kw[i]);
                json_object_set(d, kw[i], args[i].j);
            } else if (is_dict(args[i])) json_object_update(d, args[i].j);
            else return jerr(c, n, "%s() takes keyword arguments or a dict", name);
        }
        *out = (jv){name[0] == 'n' ? JV_NS : JV_JSON, d, NULL};
        return 0;
    }
    if (!strcmp(name, "strftime_now")) { /* transformers' global: the local time, formatted */
        if (nargs != 1 || !is_str(args[0])) return jerr(c, n, "strftime_now() takes one format string");
        char b[256];
        time_t now = time(NULL);
        struct tm tm;
        size_t len = strftime(b, sizeof b, json_string_value(args[0].j), localtime_r(&now, &tm));
        *out = jv_str(c, b, len);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(name, "range")) {
        long long a = 0, b = 0, st = 1;
        for (int i = 0; i < nargs; i++)
            if (!jv_isint(args[i])) return jerr(c, n, "range() takes integers");
        if (nargs == 1) b = jv_intv(args[0]);
        else if (nargs >= 2) { a = jv_intv(args[0]); b = jv_intv(args[1]); if (nargs > 2) st = jv_intv(args[2]); }
        else return jerr(c, n, "range() takes 1 to 3 integers");
        if (!st) return jerr(c, n, "range() step must not be zero");
        if ((b - a) / st > 100000) return jerr(c, n, "range() of more than 100000 items");
        json_t *l = json_array();
        for (long long i = a; st > 0 ? i < b : i > b; i += st) json_array_append_new(l, json_integer(i));
        *out = jv_own(c, l);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    return jerr(c, n, "unsupported function '%s()'", name);
}
