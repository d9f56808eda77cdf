/* jinja_builtin.c: the built-ins' tables as one (see jinja_call.h): lookup by kind and name,
 * the binding of a call's arguments to a built-in's parameters, the names Python's objects
 * answer to as attributes; and the tests and global functions of the environment
 * transformers sets up (Jinja2's tests, range / namespace / dict, raise_exception and
 * strftime_now).  Filters are in jinja_filter.c, methods in jinja_method.c.
 *
 * A lookup is a scan of a short table (about 120 rows), done once a node at parse time for
 * filters and tests; we rejected a hash table: the scan costs nothing next to rendering.
 */
#include "jinja/jinja_call.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- lookup and binding ------------------------------------------------------------------- */

const jbuiltin *jb_find(int kind, const char *name) {
    const jbuiltin *t = kind == JB_FILTER ? jb_filters : kind == JB_TEST ? jb_tests : kind == JB_METHOD ? jb_methods : jb_functions;
    for (; t->name; t++)
        if (!strcmp(t->name, name)) return t;
    return NULL;
}

int jb_receiver(jv v) {
    if (v.k == JV_LOOP) return JM_LOOP;
    if (v.k != JV_JSON) return 0;
    return json_is_string(v.j) ? JM_STR : json_is_array(v.j) ? JM_LIST : json_is_object(v.j) ? JM_DICT : 0;
}

const jbuiltin *jb_method(jv self, const char *name) {
    int r = jb_receiver(self);
    for (const jbuiltin *t = jb_methods; r && t->name; t++)
        if ((t->on & r) && !strcmp(t->name, name)) return t;
    return NULL;
}

static int in_names(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

int jb_attr_kind(jv v, const char *name) {
    static const char *const str_m[] = {"capitalize", "casefold", "center", "count", "encode", "endswith",
        "expandtabs", "find", "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal",
        "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join",
        "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind",
        "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip",
        "swapcase", "title", "translate", "upper", "zfill", NULL};
    static const char *const list_m[] = {"copy", "count", "index", NULL};
    static const char *const list_x[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};
    static const char *const dict_m[] = {"copy", "fromkeys", "get", "items", "keys", "values", NULL};
    static const char *const dict_x[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
    static const char *const loop_m[] = {"cycle", "changed", NULL};
    switch (jb_receiver(v)) {
    case JM_STR: return in_names(str_m, name);
    case JM_LIST: return in_names(list_m, name) ? 1 : in_names(list_x, name) ? -1 : 0;
    case JM_DICT: return in_names(dict_m, name) ? 1 : in_names(dict_x, name) ? -1 : 0;
    case JM_LOOP: return in_names(loop_m, name);
    }
    return 0;
}

int jb_getattr(jctx *c, const jnode *at, jv obj, jv key, int dot, jv *out) {
    *out = JV_UNDEFINED;
    if (obj.k == JV_JSON) obj = jv_elem(c, obj.j);
    if (obj.k == JV_UNDEF) {
        if (jv_is_str(key)) return jerr(c, at, "'%s' of an undefined value", json_string_value(key.j));
        return jerr(c, at, "subscript of an undefined value");
    }
    const char *name = jv_is_str(key) ? json_string_value(key.j) : NULL;
    int tag = jv_is_list(obj) ? jv_tag(c, obj.j) : 0;
    if (name && tag == JTAG_GROUP && (!strcmp(name, "grouper") || !strcmp(name, "list"))) { /* groupby's named pair */
        *out = jv_elem(c, json_array_get(obj.j, name[0] == 'l'));
        return 0;
    }
    for (int pass = 0; pass < 2; pass++) {
        if ((pass == 0) == (dot != 0)) { /* Python's getattr: a method of the type (a mutating one: hidden) */
            int kind = name ? jb_attr_kind(obj, name) : 0;
            if (kind < 0) return 0;
            if (kind > 0) {
                *out = (jv){JV_METHOD, obj.j, jb_method(obj, name), NULL};
                return 0;
            }
            if (name && (obj.k == JV_NS || obj.k == JV_LOOP)) { /* their attributes */
                json_t *x = json_object_get(obj.j, name);
                if (x && name[0] != '\x01') *out = jv_elem(c, x);
                return 0;
            }
        } else if (dot != 2) { /* the item: a dict's key, a list's or string's index */
            if (jv_is_dict(obj) && name) {
                json_t *x = json_object_get(obj.j, name);
                if (x) { *out = jv_elem(c, x); return 0; }
            } else if (jv_is_list(obj) && jv_isint(key) && tag < JTAG_KEYS) {
                long long i = jv_intv(key), n = (long long)json_array_size(obj.j);
                if (i < 0) i += n;
                if (i >= 0 && i < n) { *out = jv_elem(c, json_array_get(obj.j, (size_t)i)); return 0; }
            } else if (jv_is_str(obj) && jv_isint(key)) {
                const char *s = json_string_value(obj.j);
                size_t n = json_string_length(obj.j), *offs, cnt;
                if (ju_offsets(s, n, &offs, &cnt)) return joom(c);
                long long i = jv_intv(key);
                if (i < 0) i += (long long)cnt;
                if (i >= 0 && i < (long long)cnt) *out = jv_str(c, s + offs[i], offs[i + 1] - offs[i]);
                free(offs);
                if (i >= 0 && i < (long long)cnt) return out->k == JV_UNDEF ? -1 : 0;
            }
        }
    }
    return 0;
}

int jb_attr_path(jctx *c, const jnode *at, jv item, jv path, jv *out) {
    if (!jv_is_str(path)) return jb_getattr(c, at, item, path, 0, out);
    const char *p = json_string_value(path.j);
    *out = item;
    do { /* each part: digits are an index, else a key */
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        jv key = n && strspn(p, "0123456789") >= n ? jv_int(c, strtoll(p, NULL, 10)) : jv_str(c, p, n);
        if (key.k == JV_UNDEF || jb_getattr(c, at, *out, key, 0, out)) return -1;
        p = dot ? dot + 1 : NULL;
    } while (p);
    return 0;
}

int jb_call(jctx *c, const jnode *at, const jbuiltin *b, jv self, const jv *args, char *const *kw, int nargs,
            jv *out) {
    jcall k;
    memset(&k, 0, sizeof k);
    k.c = c;
    k.at = at;
    k.b = b;
    k.self = self;
    jv rest[32], kwv[32];
    char *kwn[32];
    int np = 0, pos = 0, given[JB_MAXP] = {0};
    while (np < JB_MAXP && b->params[np]) np++;
    for (int i = 0; i < JB_MAXP; i++) k.p[i] = JV_UNDEFINED;
    if (nargs > 32) return jerr(c, at, "%s(): more than 32 arguments", b->name);
    for (int i = 0; i < nargs; i++) {
        if (!kw || !kw[i]) { /* positional: the next parameter, then the rest */
            if (pos < np) { given[pos] = 1; k.p[pos++] = args[i]; }
            else if (b->variadic) rest[k.nrest++] = args[i];
            else return jerr(c, at, "%s() takes at most %d argument%s (%d given)", b->name, np, np == 1 ? "" : "s", nargs);
            continue;
        }
        int j = 0;
        while (j < np && strcmp(b->params[j], kw[i])) j++;
        if (j < np) {
            if (given[j]) return jerr(c, at, "%s() got multiple values for argument '%s'", b->name, kw[i]);
            given[j] = 1;
            k.p[j] = args[i];
        } else if (b->variadic) {
            kwn[k.nkw] = kw[i];
            kwv[k.nkw++] = args[i];
        } else return jerr(c, at, "%s() got an unexpected keyword argument '%s'", b->name, kw[i]);
    }
    k.rest = rest;
    k.kwn = kwn;
    k.kwv = kwv;
    *out = JV_UNDEFINED;
    return b->fn(&k, out);
}

/* ---- tests ------------------------------------------------------------------------------------ */

#define C (k->c)
#define V (k->self)
#define BOOL(x) (*out = jv_bool(C, (x)), out->k == JV_UNDEF ? -1 : 0)

static int t_defined(jcall *k, jv *out) { return BOOL(V.k != JV_UNDEF); }
static int t_undefined(jcall *k, jv *out) { return BOOL(V.k == JV_UNDEF); }
static int t_none(jcall *k, jv *out) { return BOOL(V.k == JV_JSON && json_is_null(V.j)); }
static int t_boolean(jcall *k, jv *out) { return BOOL(V.k == JV_JSON && json_is_boolean(V.j)); }
static int t_true(jcall *k, jv *out) { return BOOL(V.k == JV_JSON && json_is_true(V.j)); }
static int t_false(jcall *k, jv *out) { return BOOL(V.k == JV_JSON && json_is_false(V.j)); }
static int t_integer(jcall *k, jv *out) { return BOOL(V.k == JV_JSON && json_is_integer(V.j)); }
static int t_float(jcall *k, jv *out) { return BOOL(V.k == JV_JSON && json_is_real(V.j)); }
static int t_number(jcall *k, jv *out) { return BOOL(jv_isnum(V)); }
static int t_string(jcall *k, jv *out) { return BOOL(jv_is_str(V)); }
static int t_mapping(jcall *k, jv *out) { return BOOL(jv_is_dict(V)); }
/* Undefined iterates (as nothing) and has __len__ and __getitem__; a loop iterates */
static int container(jv v) { return v.k == JV_JSON && (json_is_string(v.j) || json_is_array(v.j) || json_is_object(v.j)); }
static int t_iterable(jcall *k, jv *out) { return BOOL(V.k == JV_UNDEF || V.k == JV_LOOP || container(V)); }
static int t_sequence(jcall *k, jv *out) { return BOOL(V.k == JV_UNDEF || container(V)); }
static int t_callable(jcall *k, jv *out) { return BOOL(V.k == JV_UNDEF || V.k == JV_MACRO || V.k == JV_FUNC || V.k == JV_METHOD); }
static int t_escaped(jcall *k, jv *out) { (void)V; return BOOL(0); }

static int t_case(jcall *k, jv *out, int what) { /* str(value).islower() / .isupper() */
    jv s;
    if (jv_string(C, V, &s)) return -1;
    return BOOL(ju_is(json_string_value(s.j), json_string_length(s.j), what));
}
static int t_lower(jcall *k, jv *out) { return t_case(k, out, JU_ISLOWER); }
static int t_upper(jcall *k, jv *out) { return t_case(k, out, JU_ISUPPER); }

/* value % d == r with Python's %, on ints or floats */
static int modulo_is(jcall *k, jv d, long long r, jv *out) {
    jv m, want = jv_int(C, r);
    if (jv_binop(C, k->at, "%", V, d, &m)) return -1;
    return BOOL(jv_equal(C, m, want));
}
static int t_odd(jcall *k, jv *out) { return modulo_is(k, jv_int(C, 2), 1, out); }
static int t_even(jcall *k, jv *out) { return modulo_is(k, jv_int(C, 2), 0, out); }
static int t_divisibleby(jcall *k, jv *out) { return modulo_is(k, k->p[0], 0, out); }

static int t_op(jcall *k, jv *out, const char *op) {
    jv r;
    if (jv_binop(C, k->at, op, V, k->p[0], &r)) return -1;
    return BOOL(jv_truthy(r));
}
static int t_eq(jcall *k, jv *out) { return t_op(k, out, "=="); }
static int t_ne(jcall *k, jv *out) { return t_op(k, out, "!="); }
static int t_lt(jcall *k, jv *out) { return t_op(k, out, "<"); }
static int t_le(jcall *k, jv *out) { return t_op(k, out, "<="); }
static int t_gt(jcall *k, jv *out) { return t_op(k, out, ">"); }
static int t_ge(jcall *k, jv *out) { return t_op(k, out, ">="); }
static int t_in(jcall *k, jv *out) { return t_op(k, out, "in"); }
/* 'name' is filter / test: Jinja2 knows the name (the ones we refuse to run too) */
static int t_filter(jcall *k, jv *out) {
    static const char *const other[] = {"filesizeformat", "pprint", "random", "striptags", "urlencode", "urlize",
                                        "wordcount", "wordwrap", "xmlattr", NULL};
    const char *s = jv_is_str(V) ? json_string_value(V.j) : NULL;
    return BOOL(s && (jb_find(JB_FILTER, s) || in_names(other, s)));
}
static int t_test(jcall *k, jv *out) {
    const char *s = jv_is_str(V) ? json_string_value(V.j) : NULL;
    return BOOL(s && (jb_find(JB_TEST, s) || !strcmp(s, "sameas")));
}

#define T0(n, f) {n, JB_TEST, 0, f, {NULL}, 0}
#define T1(n, f, p) {n, JB_TEST, 0, f, {p, NULL}, 0}
const jbuiltin jb_tests[] = {
    T0("defined", t_defined), T0("undefined", t_undefined), T0("none", t_none), T0("boolean", t_boolean),
    T0("true", t_true), T0("false", t_false), T0("integer", t_integer), T0("float", t_float), T0("number", t_number),
    T0("string", t_string), T0("mapping", t_mapping), T0("iterable", t_iterable), T0("sequence", t_sequence),
    T0("callable", t_callable), T0("escaped", t_escaped), T0("lower", t_lower), T0("upper", t_upper),
    T0("odd", t_odd), T0("even", t_even), T1("divisibleby", t_divisibleby, "num"),
    T1("eq", t_eq, "b"), T1("equalto", t_eq, "b"), T1("==", t_eq, "b"), T1("ne", t_ne, "b"), T1("!=", t_ne, "b"),
    T1("lt", t_lt, "b"), T1("lessthan", t_lt, "b"), T1("<", t_lt, "b"), T1("le", t_le, "b"), T1("<=", t_le, "b"),
    T1("gt", t_gt, "b"), T1("greaterthan", t_gt, "b"), T1(">", t_gt, "b"), T1("ge", t_ge, "b"), T1(">=", t_ge, "b"),
    T1("in", t_in, "seq"), T0("filter", t_filter), T0("test", t_test),
    {NULL, 0, 0, NULL, {NULL}, 0},
};

/* ---- global functions ----------------------------------------------------------------------- */

/* transformers' raise_exception(message): the render ends with the message */
static int f_raise_exception(jcall *k, jv *out) {
    sm_buf b = {0};
    (void)out;
    if (jv_tostr(C, k->p[0], &b)) { sm_buf_free(&b); return -1; }
    sm_errf(C->e, "%s", b.p ? b.p : "");
    sm_buf_free(&b);
    C->raised = 1;
    return -1;
}

/* transformers' strftime_now(format): datetime.now().strftime(format), local time; the day
 * of SPARKMONO_TEMPLATE_DATE=YYYY-MM-DD (midnight) instead when it is set (tests) */
static int f_strftime_now(jcall *k, jv *out) {
    if (!jv_is_str(k->p[0])) return jerr(C, k->at, "strftime_now() takes a format string");
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *fixed = getenv("SPARKMONO_TEMPLATE_DATE");
    if (fixed && *fixed) {
        int y, m, d;
        char end;
        if (sscanf(fixed, "%4d-%2d-%2d%c", &y, &m, &d, &end) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
            return jerr(C, k->at, "SPARKMONO_TEMPLATE_DATE must be YYYY-MM-DD, not '%s'", fixed);
        tm.tm_year = y - 1900;
        tm.tm_mon = m - 1;
        tm.tm_mday = d;
        tm.tm_isdst = -1;
        time_t t = mktime(&tm); /* fills the weekday and the day of the year */
        if (t == (time_t)-1 || !localtime_r(&t, &tm)) return jerr(C, k->at, "SPARKMONO_TEMPLATE_DATE '%s' is not a date", fixed);
    } else {
        time_t now = time(NULL);
        if (!localtime_r(&now, &tm)) return jerr(C, k->at, "strftime_now(): no local time");
    }
    char b[4096];
    size_t len = strftime(b, sizeof b, json_string_value(k->p[0].j), &tm); /* 0: an empty result (or one too long) */
    *out = jv_str(C, b, len);
    return out->k == JV_UNDEF ? -1 : 0;
}

/* range([start,] stop[, step]): a list, at most 100000 items (the sandbox's MAX_RANGE) */
static int f_range(jcall *k, jv *out) {
    long long a = 0, b = 0, st = 1;
    for (int i = 0; i < k->nrest; i++)
        if (!jv_isint(k->rest[i]))
            return jerr(C, k->at, "range(): '%s' object cannot be interpreted as an integer", jv_kind_name(k->rest[i]));
    if (k->nkw) return jerr(C, k->at, "range() takes no keyword arguments");
    if (k->nrest == 1) b = jv_intv(k->rest[0]);
    else if (k->nrest == 2 || k->nrest == 3) {
        a = jv_intv(k->rest[0]);
        b = jv_intv(k->rest[1]);
        if (k->nrest == 3) st = jv_intv(k->rest[2]);
    } else return jerr(C, k->at, "range expected 1 to 3 arguments, got %d", k->nrest);
    if (!st) return jerr(C, k->at, "range() arg 3 must not be zero");
    double count = st > 0 ? ((double)b - (double)a) / (double)st : ((double)a - (double)b) / (double)-st;
    if (count > 100000) return jerr(C, k->at, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    json_t *l = json_array();
    *out = jv_own(C, l);
    if (out->k == JV_UNDEF) return -1;
    for (long long i = a; st > 0 ? i < b : i > b;) {
        if (json_array_append_new(l, json_integer(i))) return joom(C);
        if (__builtin_add_overflow(i, st, &i)) break;
    }
    return 0;
}

/* namespace(...) / dict(...): keyword arguments and dicts, as Python's dict() takes them */
static int make_dict(jcall *k, jv *out, int ns) {
    json_t *d = json_object();
    if (jv_own(C, d).k == JV_UNDEF) return -1;
    for (int i = 0; i < k->nrest; i++) {
        if (!jv_is_dict(k->rest[i]))
            return jerr(C, k->at, "%s() takes keyword arguments or a dict, not %s", k->b->name, jv_kind_name(k->rest[i]));
        if (json_object_update(d, k->rest[i].j)) return joom(C);
    }
    for (int i = 0; i < k->nkw; i++) {
        if (k->kwv[i].k != JV_JSON)
            return jerr(C, k->at, "%s(): '%s' must be a data value, not %s", k->b->name, k->kwn[i], jv_kind_name(k->kwv[i]));
        if (json_object_set(d, k->kwn[i], k->kwv[i].j)) return joom(C);
    }
    *out = (jv){ns ? JV_NS : JV_JSON, d, NULL, NULL};
    return 0;
}
static int f_namespace(jcall *k, jv *out) { return make_dict(k, out, 1); }
static int f_dict(jcall *k, jv *out) { return make_dict(k, out, 0); }

const jbuiltin jb_functions[] = {
    {"raise_exception", JB_FUNCTION, 0, f_raise_exception, {"message", NULL}, 0},
    {"strftime_now", JB_FUNCTION, 0, f_strftime_now, {"format", NULL}, 0},
    {"range", JB_FUNCTION, 0, f_range, {NULL}, 1},
    {"namespace", JB_FUNCTION, 0, f_namespace, {NULL}, 1},
    {"dict", JB_FUNCTION, 0, f_dict, {NULL}, 1},
    {NULL, 0, 0, NULL, {NULL}, 0},
};
