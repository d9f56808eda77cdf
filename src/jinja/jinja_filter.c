/* jinja_filter.c: Jinja2's built-in filters (see jinja_call.h), with their Python meaning and
 * their parameters by name, plus transformers' tojson (json.dumps with ensure_ascii=False,
 * indent, separators, sort_keys).  A filter that Jinja2 runs as a generator (map, select,
 * unique, batch, ...) gives a list here: templates pass such results on to list, join,
 * length or a loop, where the two agree.
 *
 * Sorting (sort, dictsort, groupby) is a stable merge sort whose comparison may fail, as
 * Python's does between a str and an int; case_sensitive=False compares strings by their
 * Python lower(), as Jinja2's ignore_case does.  We rejected qsort: it is not stable, and
 * Python's sort is.
 */
#include "jinja/jinja_call.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define C (k->c)
#define V (k->self)
#define P(i) (k->p[i])
#define RET(v) (*out = (v), out->k == JV_UNDEF ? -1 : 0)

static int given(jv v) { return v.k != JV_UNDEF && !(v.k == JV_JSON && json_is_null(v.j)); }

/* The items a filter walks (undefined: none). */
static int items_of(jcall *k, jv v, json_t **items) {
    if (v.k == JV_JSON) v = jv_elem(C, v.j);
    return jv_items(C, k->at, v, items);
}

static jv item(jcall *k, json_t *l, size_t i) { return jv_elem(C, json_array_get(l, i)); }

static int append(jcall *k, json_t *l, jv v) {
    json_t *x = jv_json(C, k->at, v);
    if (!x) return -1;
    return json_array_append(l, x) ? joom(C) : 0;
}

/* str(value) as a string value */
static int text(jcall *k, jv v, jv *s) {
    if (v.k == JV_JSON) v = jv_elem(C, v.j);
    return jv_string(C, v, s);
}

/* Jinja2's ignore_case: a string's lower(), anything else as it is. */
static int fold(jcall *k, jv v, jv *out) {
    if (!jv_is_str(v)) { *out = v; return 0; }
    sm_buf b = {0};
    if (ju_case(json_string_value(v.j), json_string_length(v.j), JU_LOWER, &b)) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}

/* The key of x: its attribute path (attr given) then, case-insensitive, folded. */
static int key_of(jcall *k, jv x, jv attr, int fold_case, jv *out) {
    *out = x;
    if (given(attr) && jb_attr_path(C, k->at, x, attr, out)) return -1;
    return fold_case ? fold(k, *out, out) : 0;
}

/* Stable merge sort of idx [n] by keys (reverse: descending, equal keys in their order). */
static int msort(jcall *k, size_t *idx, size_t *tmp, size_t n, const jv *keys, int reverse) {
    if (n < 2) return 0;
    size_t h = n / 2;
    if (msort(k, idx, tmp, h, keys, reverse) || msort(k, idx + h, tmp, n - h, keys, reverse)) return -1;
    size_t a = 0, b = h, o = 0;
    while (a < h && b < n) {
        int r;
        /* take from the right only when it is strictly before the left */
        if (reverse ? jv_cmp(C, k->at, keys[idx[a]], keys[idx[b]], &r) : jv_cmp(C, k->at, keys[idx[b]], keys[idx[a]], &r)) return -1;
        tmp[o++] = r < 0 ? idx[b++] : idx[a++];
    }
    while (a < h) tmp[o++] = idx[a++];
    while (b < n) tmp[o++] = idx[b++];
    memcpy(idx, tmp, sizeof *idx * n);
    return 0;
}

/* The order of l's items by their keys: idx [n] (malloc'd). */
static int sort_order(jcall *k, json_t *l, const jv *keys, int reverse, size_t **idx) {
    size_t n = json_array_size(l);
    *idx = malloc(sizeof **idx * (n + 1));
    size_t *tmp = malloc(sizeof *tmp * (n + 1));
    if (!*idx || !tmp) { free(*idx); free(tmp); *idx = NULL; return joom(C); }
    for (size_t i = 0; i < n; i++) (*idx)[i] = i;
    int rc = msort(k, *idx, tmp, n, keys, reverse);
    free(tmp);
    if (rc) { free(*idx); *idx = NULL; }
    return rc;
}

/* The keys of l's items (attr, case) into a new array [n] of values. */
static int keys_of(jcall *k, json_t *l, jv attr, int fold_case, jv **keys) {
    size_t n = json_array_size(l);
    *keys = malloc(sizeof **keys * (n + 1));
    if (!*keys) return joom(C);
    for (size_t i = 0; i < n; i++)
        if (key_of(k, item(k, l, i), attr, fold_case, &(*keys)[i])) { free(*keys); *keys = NULL; return -1; }
    return 0;
}

/* ---- strings ---------------------------------------------------------------------------------- */

static int recase(jcall *k, jv *out, int mode) {
    jv s;
    if (text(k, V, &s)) return -1;
    sm_buf b = {0};
    if (ju_case(json_string_value(s.j), json_string_length(s.j), mode, &b)) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}
static int f_lower(jcall *k, jv *out) { return recase(k, out, JU_LOWER); }
static int f_upper(jcall *k, jv *out) { return recase(k, out, JU_UPPER); }
static int f_capitalize(jcall *k, jv *out) { return recase(k, out, JU_CAPITALIZE); }

/* Jinja2's title: split at runs of "-", whitespace, "(", "{", "[", "<"; each piece's first
 * character upper(), the rest lower() */
static int f_title(jcall *k, jv *out) {
    jv s;
    if (text(k, V, &s)) return -1;
    const char *p = json_string_value(s.j);
    size_t n = json_string_length(s.j), i = 0;
    sm_buf b = {0};
    int rc = 0;
#define SEP(cp) ((cp) == '-' || (cp) == '(' || (cp) == '{' || (cp) == '[' || (cp) == '<' || ju_isspace(cp))
    while (i < n && !rc) {
        size_t st = i, q = i;
        uint32_t c0 = ju_next(p, n, &q);
        int sep = SEP(c0);
        while (i < n) { /* a run of separators, or of anything else */
            q = i;
            uint32_t cp = ju_next(p, n, &q);
            if (SEP(cp) != sep) break;
            i = q;
        }
        q = st;
        ju_next(p, n, &q); /* the piece's first character */
        rc = ju_case(p + st, q - st, JU_UPPER, &b) || ju_case(p + q, i - q, JU_LOWER, &b);
    }
#undef SEP
    if (rc) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}

static int f_trim(jcall *k, jv *out) {
    jv s;
    return text(k, V, &s) || jm_strip(C, k->at, s, P(0), 3, out);
}

static int f_string(jcall *k, jv *out) { return text(k, V, out); }
static int f_safe(jcall *k, jv *out) { *out = V; return 0; }

static int f_replace(jcall *k, jv *out) {
    jv s, a, b;
    if (text(k, V, &s) || text(k, P(0), &a) || text(k, P(1), &b)) return -1;
    if (given(P(2)) && !jv_isint(P(2))) return jerr(C, k->at, "replace: count must be an integer");
    return jm_replace(C, k->at, s, a, b, given(P(2)) ? jv_intv(P(2)) : -1, out);
}

static int f_center(jcall *k, jv *out) {
    jv s;
    return text(k, V, &s) || jm_pad(C, k->at, s, given(P(0)) ? P(0) : jv_int(C, 80), JV_UNDEFINED, 'c', out);
}

/* indent(width=4, first=False, blank=False): Jinja2 appends "\n", splits the lines (every
 * str.splitlines() boundary), indents all but the first (and, blank=False, the empty ones) */
static int f_indent(jcall *k, jv *out) {
    jv s;
    if (text(k, V, &s)) return -1;
    sm_buf pad = {0}, b = {0};
    int rc = 0;
    if (jv_is_str(P(0))) rc = sm_buf_add(&pad, json_string_value(P(0).j), json_string_length(P(0).j));
    else if (!given(P(0)) || jv_isint(P(0))) {
        long long w = given(P(0)) ? jv_intv(P(0)) : 4;
        if (w > 100000) return jerr(C, k->at, "indent: width too big");
        for (long long i = 0; i < w && !rc; i++) rc = sm_buf_add(&pad, " ", 1);
    } else return jerr(C, k->at, "indent: width must be an integer or a string");
    json_t *lines = json_array();
    if (jv_own(C, lines).k == JV_UNDEF) { sm_buf_free(&pad); return -1; }
    sm_buf t = {0};
    rc = rc || sm_buf_add(&t, json_string_value(s.j), json_string_length(s.j)) || sm_buf_add(&t, "\n", 1);
    if (rc || jm_splitlines(C, t.p, t.n, 0, lines)) { sm_buf_free(&t); sm_buf_free(&pad); return rc ? joom(C) : -1; }
    sm_buf_free(&t);
    int blank = jv_truthy(P(2));
    if (jv_truthy(P(1))) rc = sm_buf_add(&b, pad.p ? pad.p : "", pad.n);
    for (size_t i = 0; i < json_array_size(lines) && !rc; i++) {
        json_t *ln = json_array_get(lines, i);
        if (i) rc = sm_buf_add(&b, "\n", 1);
        if (i && (blank || json_string_length(ln))) rc = rc || sm_buf_add(&b, pad.p ? pad.p : "", pad.n);
        rc = rc || sm_buf_add(&b, json_string_value(ln), json_string_length(ln));
    }
    sm_buf_free(&pad);
    if (rc) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}

/* escape / e / forceescape: markupsafe's HTML escape of str(value) */
static int f_escape(jcall *k, jv *out) {
    jv s;
    if (text(k, V, &s)) return -1;
    const char *p = json_string_value(s.j);
    size_t n = json_string_length(s.j);
    sm_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        switch (p[i]) {
        case '&': rc = sm_buf_str(&b, "&amp;"); break;
        case '<': rc = sm_buf_str(&b, "&lt;"); break;
        case '>': rc = sm_buf_str(&b, "&gt;"); break;
        case '"': rc = sm_buf_str(&b, "&#34;"); break;
        case '\'': rc = sm_buf_str(&b, "&#39;"); break;
        default: rc = sm_buf_add(&b, p + i, 1);
        }
    }
    if (rc) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}

/* format(*args, **kwargs): str(value) % args (a tuple), or % kwargs (a dict) */
static int f_format(jcall *k, jv *out) {
    jv s;
    if (text(k, V, &s)) return -1;
    if (k->nrest && k->nkw) return jerr(C, k->at, "format: can't handle positional and keyword arguments at the same time");
    json_t *a = k->nkw ? json_object() : json_array();
    jv av = k->nkw ? jv_own(C, a) : jv_tuple(C, a);
    if (av.k == JV_UNDEF) return -1;
    for (int i = 0; i < k->nrest; i++)
        if (append(k, a, k->rest[i])) return -1;
    for (int i = 0; i < k->nkw; i++) {
        json_t *x = jv_json(C, k->at, k->kwv[i]);
        if (!x || json_object_set(a, k->kwn[i], x)) return x ? joom(C) : -1;
    }
    return jv_percent(C, k->at, s, av, out);
}

/* truncate(length=255, killwords=False, end='...', leeway=5) */
static int f_truncate(jcall *k, jv *out) {
    jv s, end = given(P(2)) ? P(2) : jv_str(C, "...", 3);
    if (text(k, V, &s) || (end.k != JV_UNDEF && text(k, end, &end))) return -1;
    long long len = given(P(0)) ? (jv_isint(P(0)) ? jv_intv(P(0)) : -1) : 255;
    long long lee = given(P(3)) ? (jv_isint(P(3)) ? jv_intv(P(3)) : -1) : 5;
    const char *p = json_string_value(s.j), *e = json_string_value(end.j);
    size_t n = json_string_length(s.j), en = json_string_length(end.j);
    long long cps = (long long)ju_len(p, n), ecps = (long long)ju_len(e, en);
    if (len < ecps) return jerr(C, k->at, "truncate: expected length >= %lld, got %lld", ecps, len);
    if (lee < 0) return jerr(C, k->at, "truncate: expected leeway >= 0, got %lld", lee);
    if (cps <= len + lee) { *out = s; return 0; }
    size_t cut = 0;
    for (long long i = 0; i < len - ecps; i++) ju_next(p, n, &cut);
    if (!jv_truthy(P(1))) { /* s[:length - len(end)].rsplit(" ", 1)[0] */
        const char *sp = NULL;
        for (size_t i = 0; i < cut; i++)
            if (p[i] == ' ') sp = p + i;
        if (sp) cut = (size_t)(sp - p);
    }
    sm_buf b = {0};
    if (sm_buf_add(&b, p, cut) || sm_buf_add(&b, e, en)) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}

/* ---- numbers ------------------------------------------------------------------------------------ */

/* Python's int(str) (base 10: spaces around, a sign, digits with single underscores between). */
static int parse_int(const char *s, long long *x, int *overflow) {
    while (ju_isspace((unsigned char)*s)) s++;
    int neg = *s == '-';
    if (*s == '+' || *s == '-') s++;
    if (!(*s >= '0' && *s <= '9')) return -1;
    unsigned long long v = 0;
    *overflow = 0;
    for (int prev_us = 1; (*s >= '0' && *s <= '9') || *s == '_'; s++) {
        if (*s == '_') {
            if (prev_us) return -1;
            prev_us = 1;
            continue;
        }
        prev_us = 0;
        if (v > (ULLONG_MAX - 9) / 10) *overflow = 1;
        else v = v * 10 + (unsigned)(*s - '0');
    }
    if (s[-1] == '_') return -1;
    while (ju_isspace((unsigned char)*s)) s++;
    if (*s) return -1;
    if (v > (neg ? 9223372036854775808ull : 9223372036854775807ull)) *overflow = 1;
    *x = neg ? (long long)(0ull - v) : (long long)v;
    return 0;
}

/* Python's float(str): spaces around, inf / nan / infinity any case, underscores between digits. */
static int parse_float(const char *s, double *x) {
    char b[512];
    size_t k = 0;
    while (ju_isspace((unsigned char)*s)) s++;
    for (; *s && k < sizeof b - 1; s++) {
        if (*s == '_') { /* only between two digits */
            if (!k || !(b[k - 1] >= '0' && b[k - 1] <= '9') || !(s[1] >= '0' && s[1] <= '9')) return -1;
            continue;
        }
        b[k++] = *s;
    }
    while (k && ju_isspace((unsigned char)b[k - 1])) k--;
    b[k] = 0;
    if (!k || strchr(b, 'x') || strchr(b, 'X') || strchr(b, 'p') || strchr(b, 'P')) return -1; /* no C hex floats */
    char *e;
    errno = 0;
    *x = strtod(b, &e);
    if (*e) return -1;
    const char *w = b + (b[0] == '+' || b[0] == '-');
    if ((w[0] == 'i' || w[0] == 'I') && strcasecmp(w, "inf") && strcasecmp(w, "infinity")) return -1;
    if ((w[0] == 'n' || w[0] == 'N') && strcasecmp(w, "nan")) return -1;
    return 0;
}

/* int(value, default=0, base=10): int(x), else int(float(x)), else the default */
static int f_int(jcall *k, jv *out) {
    jv d = given(P(0)) ? P(0) : jv_int(C, 0);
    if (given(P(1)) && !(jv_isint(P(1)) && jv_intv(P(1)) == 10)) return jerr(C, k->at, "int: only base 10 is supported");
    double x;
    if (jv_isint(V)) return RET(jv_int(C, jv_intv(V)));
    if (jv_is_str(V)) {
        long long i;
        int ovf;
        if (!parse_int(json_string_value(V.j), &i, &ovf)) {
            if (ovf) return jerr(C, k->at, "int: '%s' does not fit in 64 bits", json_string_value(V.j));
            return RET(jv_int(C, i));
        }
        if (parse_float(json_string_value(V.j), &x)) { *out = d; return 0; }
    } else if (jv_isnum(V)) x = jv_num(V);
    else { *out = d; return 0; }
    if (isnan(x)) { *out = d; return 0; } /* int(nan) is a ValueError: the default */
    if (isinf(x)) return jerr(C, k->at, "int: cannot convert float infinity to integer");
    if (x >= 9223372036854775808.0 || x < -9223372036854775808.0) return jerr(C, k->at, "int: %g does not fit in 64 bits", x);
    return RET(jv_int(C, (long long)x));
}

/* float(value, default=0.0) */
static int f_float(jcall *k, jv *out) {
    double x;
    if (jv_isnum(V)) return RET(jv_real(C, jv_num(V)));
    if (jv_is_str(V) && !parse_float(json_string_value(V.j), &x)) return RET(jv_real(C, x));
    if (given(P(0))) { *out = P(0); return 0; }
    return RET(jv_real(C, 0.0));
}

static int f_abs(jcall *k, jv *out) {
    if (!jv_isnum(V)) return jerr(C, k->at, "bad operand type for abs(): '%s'", jv_kind_name(V));
    if (!jv_isint(V)) return RET(jv_real(C, fabs(jv_num(V))));
    if (jv_intv(V) == INT64_MIN) return jerr(C, k->at, "integer overflow in abs: the result does not fit in 64 bits");
    return RET(jv_int(C, llabs(jv_intv(V))));
}

/* round(precision=0, method='common'): Python's round (half to even on the exact value), or
 * math.floor / math.ceil of value * 10**precision, divided back (a float) */
static int f_round(jcall *k, jv *out) {
    const char *m = given(P(1)) ? (jv_is_str(P(1)) ? json_string_value(P(1).j) : "?") : "common";
    if (strcmp(m, "common") && strcmp(m, "floor") && strcmp(m, "ceil"))
        return jerr(C, k->at, "round: method must be common, ceil or floor");
    if (!jv_isnum(V)) return jerr(C, k->at, "round: '%s' is not a number", jv_kind_name(V));
    if (given(P(0)) && !jv_isint(P(0))) return jerr(C, k->at, "round: precision must be an integer");
    long long p = given(P(0)) ? jv_intv(P(0)) : 0;
    if (p > 400) p = 400;
    if (p < -400) p = -400;
    if (!strcmp(m, "common") && jv_isint(V)) { /* int stays int; negative precision rounds half to even */
        long long x = jv_intv(V);
        if (p >= 0) return RET(jv_int(C, x));
        if (p < -18) return RET(jv_int(C, 0));
        long long unit = 1;
        for (long long i = 0; i < -p; i++) unit *= 10;
        long long q = x / unit, r = x % unit;
        if (r < 0) { r += unit; q--; } /* floor division */
        unsigned long long twice = 2 * (unsigned long long)r, u = (unsigned long long)unit;
        if (twice > u || (twice == u && (q & 1))) q++; /* past half, or half and odd: up */
        long long res;
        if (__builtin_mul_overflow(q, unit, &res)) return jerr(C, k->at, "integer overflow in round");
        return RET(jv_int(C, res));
    }
    double x = jv_num(V), s = pow(10.0, (double)p), r;
    if (!strcmp(m, "common")) {
        if (isnan(x) || isinf(x) || p > 330) r = x;
        else if (p >= 0) { /* the decimal rounding printf does exactly, read back */
            char b[800];
            snprintf(b, sizeof b, "%.*f", (int)p, x);
            r = strtod(b, NULL);
        } else r = nearbyint(x / pow(10.0, (double)-p)) * pow(10.0, (double)-p); /* to tens, hundreds, ... */
    } else {
        double y = jv_isint(V) && p >= 0 ? (double)jv_intv(V) * s : x * s;
        if (isnan(y) || isinf(y)) return jerr(C, k->at, "round: cannot convert float %s to integer", isnan(y) ? "NaN" : "infinity");
        r = (m[0] == 'f' ? floor(y) : ceil(y)) / s;
    }
    return RET(jv_real(C, r));
}

/* ---- sequences ----------------------------------------------------------------------------------- */

static int f_length(jcall *k, jv *out) {
    jv v = V.k == JV_JSON ? jv_elem(C, V.j) : V;
    long long n = 0;
    if (jv_is_str(v)) n = (long long)ju_len(json_string_value(v.j), json_string_length(v.j));
    else if (jv_is_list(v)) n = (long long)json_array_size(v.j);
    else if (jv_is_dict(v)) n = (long long)json_object_size(v.j);
    else if (v.k == JV_LOOP) n = json_integer_value(json_object_get(v.j, "length"));
    else if (v.k != JV_UNDEF) return jerr(C, k->at, "object of type '%s' has no len()", jv_kind_name(v));
    return RET(jv_int(C, n));
}

static int f_list(jcall *k, jv *out) {
    json_t *l;
    if (items_of(k, V, &l)) return -1;
    return RET(jv_own(C, json_copy(l))); /* list(x) is a new list (of a tuple or a view too) */
}

static int f_first(jcall *k, jv *out) {
    json_t *l;
    if (items_of(k, V, &l)) return -1;
    *out = json_array_size(l) ? item(k, l, 0) : JV_UNDEFINED;
    return 0;
}

static int f_last(jcall *k, jv *out) {
    json_t *l;
    if (items_of(k, V, &l)) return -1;
    *out = json_array_size(l) ? item(k, l, json_array_size(l) - 1) : JV_UNDEFINED;
    return 0;
}

static int f_reverse(jcall *k, jv *out) {
    json_t *l;
    if (jv_is_str(V)) { /* a string reversed is a string */
        const char *s = json_string_value(V.j);
        size_t n = json_string_length(V.j), *o, cnt;
        if (ju_offsets(s, n, &o, &cnt)) return joom(C);
        sm_buf b = {0};
        int rc = 0;
        for (size_t i = cnt; i-- > 0 && !rc;) rc = sm_buf_add(&b, s + o[i], o[i + 1] - o[i]);
        free(o);
        if (rc) { sm_buf_free(&b); return joom(C); }
        return RET(jv_buf(C, &b));
    }
    if (items_of(k, V, &l)) return -1;
    json_t *r = json_array();
    if (jv_own(C, r).k == JV_UNDEF) return -1;
    for (size_t i = json_array_size(l); i-- > 0;)
        if (json_array_append(r, json_array_get(l, i))) return joom(C);
    *out = (jv){JV_JSON, r, NULL, NULL};
    return 0;
}

/* join(d='', attribute=None): str(d).join(str(x) for x in value) */
static int f_join(jcall *k, jv *out) {
    json_t *l;
    jv d = JV_UNDEFINED;
    if (items_of(k, V, &l) || (given(P(0)) && text(k, P(0), &d))) return -1;
    sm_buf b = {0};
    for (size_t i = 0; i < json_array_size(l); i++) {
        jv x = item(k, l, i);
        if (given(P(1)) && jb_attr_path(C, k->at, x, P(1), &x)) { sm_buf_free(&b); return -1; }
        if ((i && d.k != JV_UNDEF && sm_buf_add(&b, json_string_value(d.j), json_string_length(d.j))) || jv_tostr(C, x, &b)) {
            sm_buf_free(&b);
            return -1;
        }
    }
    return RET(jv_buf(C, &b));
}

static int f_default(jcall *k, jv *out) {
    jv v = V.k == JV_JSON ? jv_elem(C, V.j) : V;
    int use = jv_truthy(P(1)) ? !jv_truthy(v) : v.k == JV_UNDEF;
    if (!use) { *out = V; return 0; }
    if (P(0).k != JV_UNDEF) { *out = P(0); return 0; }
    return RET(jv_str(C, "", 0));
}

/* map(attribute=, default=) or map('filter', *args, **kwargs) */
static int f_map(jcall *k, jv *out) {
    json_t *l, *r = json_array();
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l)) return -1;
    jv attr = JV_UNDEFINED, dflt = JV_UNDEFINED;
    const jbuiltin *f = NULL;
    int fkw = 0;
    if (!k->nrest) {
        for (int i = 0; i < k->nkw; i++) {
            if (!strcmp(k->kwn[i], "attribute")) attr = k->kwv[i];
            else if (!strcmp(k->kwn[i], "default")) dflt = k->kwv[i];
            else return jerr(C, k->at, "map: unexpected keyword argument '%s'", k->kwn[i]);
        }
        if (attr.k == JV_UNDEF) return jerr(C, k->at, "map requires a filter argument");
    } else {
        if (!jv_is_str(k->rest[0]) || !(f = jb_find(JB_FILTER, json_string_value(k->rest[0].j))))
            return jerr(C, k->at, "map: unsupported filter %s", jv_is_str(k->rest[0]) ? json_string_value(k->rest[0].j) : "(not a name)");
        fkw = k->nkw;
    }
    jv args[40];
    char *kw[40];
    int na = 0;
    for (int i = 1; f && i < k->nrest && na < 32; i++) { args[na] = k->rest[i]; kw[na++] = NULL; }
    for (int i = 0; i < fkw && na < 32; i++) { args[na] = k->kwv[i]; kw[na++] = k->kwn[i]; }
    for (size_t i = 0; i < json_array_size(l); i++) {
        jv x = item(k, l, i), y;
        if (f) {
            if (jb_call(C, k->at, f, x, args, kw, na, &y)) return -1;
        } else {
            if (jb_attr_path(C, k->at, x, attr, &y)) return -1;
            if (y.k == JV_UNDEF && given(dflt)) y = dflt;
        }
        if (append(k, r, y)) return -1;
    }
    *out = (jv){JV_JSON, r, NULL, NULL};
    return 0;
}

/* select / reject (test, *args) and selectattr / rejectattr (attribute, test, *args) */
static int choose(jcall *k, jv *out, int keep, int byattr) {
    json_t *l, *r = json_array();
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l)) return -1;
    if (byattr && !k->nrest) return jerr(C, k->at, "%s: missing parameter for attribute name", k->b->name);
    int off = byattr;
    const jbuiltin *t = NULL;
    if (k->nrest > off) {
        if (!jv_is_str(k->rest[off]) || !(t = jb_find(JB_TEST, json_string_value(k->rest[off].j))))
            return jerr(C, k->at, "%s: unsupported test %s", k->b->name,
                        jv_is_str(k->rest[off]) ? json_string_value(k->rest[off].j) : "(not a name)");
    }
    jv args[40];
    char *kw[40];
    int na = 0;
    for (int i = off + 1; i < k->nrest && na < 32; i++) { args[na] = k->rest[i]; kw[na++] = NULL; }
    for (int i = 0; i < k->nkw && na < 32; i++) { args[na] = k->kwv[i]; kw[na++] = k->kwn[i]; }
    for (size_t i = 0; i < json_array_size(l); i++) {
        jv x = item(k, l, i), v = x, res;
        if (byattr && jb_attr_path(C, k->at, x, k->rest[0], &v)) return -1;
        if (t) {
            if (jb_call(C, k->at, t, v, args, kw, na, &res)) return -1;
        } else res = v;
        if (jv_truthy(res) == keep && append(k, r, x)) return -1;
    }
    *out = (jv){JV_JSON, r, NULL, NULL};
    return 0;
}
static int f_select(jcall *k, jv *out) { return choose(k, out, 1, 0); }
static int f_reject(jcall *k, jv *out) { return choose(k, out, 0, 0); }
static int f_selectattr(jcall *k, jv *out) { return choose(k, out, 1, 1); }
static int f_rejectattr(jcall *k, jv *out) { return choose(k, out, 0, 1); }

/* sort(reverse=False, case_sensitive=False, attribute=None) */
static int f_sort(jcall *k, jv *out) {
    json_t *l, *r = json_array();
    jv *keys;
    size_t *idx;
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l) || keys_of(k, l, P(2), !jv_truthy(P(1)), &keys)) return -1;
    int rc = sort_order(k, l, keys, jv_truthy(P(0)), &idx);
    free(keys);
    if (rc) return -1;
    for (size_t i = 0; i < json_array_size(l) && !rc; i++) rc = json_array_append(r, json_array_get(l, idx[i])) ? joom(C) : 0;
    free(idx);
    *out = (jv){JV_JSON, r, NULL, NULL};
    return rc;
}

/* dictsort(case_sensitive=False, by='key', reverse=False): the (key, value) pairs sorted */
static int f_dictsort(jcall *k, jv *out) {
    jv v = V.k == JV_JSON ? jv_elem(C, V.j) : V;
    if (!jv_has_attrs(v) || v.k != JV_JSON) return jerr(C, k->at, "dictsort: '%s' object has no attribute 'items'", jv_kind_name(v));
    const char *by = given(P(1)) ? (jv_is_str(P(1)) ? json_string_value(P(1).j) : "?") : "key";
    if (strcmp(by, "key") && strcmp(by, "value")) return jerr(C, k->at, "You can only sort by either \"key\" or \"value\"");
    json_t *pairs = json_array(), *r = json_array();
    if (jv_own(C, pairs).k == JV_UNDEF || jv_own(C, r).k == JV_UNDEF) return -1;
    const char *key;
    json_t *x;
    json_object_foreach(v.j, key, x) {
        json_t *pr = json_pack("[sO]", key, x);
        if (!pr || json_array_append_new(pairs, pr) || jv_set_tag(C, pr, JTAG_TUPLE)) return joom(C);
    }
    size_t n = json_array_size(pairs), *idx;
    jv *keys = malloc(sizeof *keys * (n + 1));
    if (!keys) return joom(C);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) rc = fold(k, jv_elem(C, json_array_get(json_array_get(pairs, i), by[0] == 'v')), &keys[i]);
    if (!rc && jv_truthy(P(0))) /* case_sensitive: the keys as they are */
        for (size_t i = 0; i < n; i++) keys[i] = jv_elem(C, json_array_get(json_array_get(pairs, i), by[0] == 'v'));
    if (!rc) rc = sort_order(k, pairs, keys, jv_truthy(P(2)), &idx);
    free(keys);
    if (rc) return -1;
    for (size_t i = 0; i < n && !rc; i++) rc = json_array_append(r, json_array_get(pairs, idx[i])) ? joom(C) : 0;
    free(idx);
    *out = (jv){JV_JSON, r, NULL, NULL};
    return rc;
}

/* items(): a dict's (key, value) pairs; undefined: none */
static int f_items(jcall *k, jv *out) {
    jv v = V.k == JV_JSON ? jv_elem(C, V.j) : V;
    json_t *r = json_array();
    if (jv_own(C, r).k == JV_UNDEF) return -1;
    *out = (jv){JV_JSON, r, NULL, NULL};
    if (v.k == JV_UNDEF) return 0;
    if (!jv_is_dict(v)) return jerr(C, k->at, "items: can only get item pairs from a mapping, not %s", jv_kind_name(v));
    const char *key;
    json_t *x;
    json_object_foreach(v.j, key, x) {
        json_t *pr = json_pack("[sO]", key, x);
        if (!pr || json_array_append_new(r, pr) || jv_set_tag(C, pr, JTAG_TUPLE)) return joom(C);
    }
    return 0;
}

/* unique(case_sensitive=False, attribute=None): the first item of each key, in order */
static int f_unique(jcall *k, jv *out) {
    json_t *l, *r = json_array();
    jv *keys;
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l) || keys_of(k, l, P(1), !jv_truthy(P(0)), &keys)) return -1;
    int rc = 0;
    for (size_t i = 0; i < json_array_size(l) && !rc; i++) {
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) seen = jv_equal(C, keys[i], keys[j]);
        if (!seen) rc = json_array_append(r, json_array_get(l, i)) ? joom(C) : 0;
    }
    free(keys);
    *out = (jv){JV_JSON, r, NULL, NULL};
    return rc;
}

/* min / max(case_sensitive=False, attribute=None): the first smallest / largest item */
static int extreme(jcall *k, jv *out, int largest) {
    json_t *l;
    jv *keys;
    if (items_of(k, V, &l) || keys_of(k, l, P(1), !jv_truthy(P(0)), &keys)) return -1;
    size_t best = 0, n = json_array_size(l);
    for (size_t i = 1; i < n; i++) {
        int r;
        if (jv_cmp(C, k->at, keys[i], keys[best], &r)) { free(keys); return -1; }
        if (largest ? r > 0 : r < 0) best = i;
    }
    free(keys);
    *out = n ? item(k, l, best) : JV_UNDEFINED;
    return 0;
}
static int f_min(jcall *k, jv *out) { return extreme(k, out, 0); }
static int f_max(jcall *k, jv *out) { return extreme(k, out, 1); }

/* sum(attribute=None, start=0): start + x0 + x1 + ... */
static int f_sum(jcall *k, jv *out) {
    json_t *l;
    if (items_of(k, V, &l)) return -1;
    jv acc = given(P(1)) ? P(1) : jv_int(C, 0);
    for (size_t i = 0; i < json_array_size(l); i++) {
        jv x = item(k, l, i);
        if (given(P(0)) && jb_attr_path(C, k->at, x, P(0), &x)) return -1;
        if (jv_is_str(x) || jv_is_str(acc))
            return jerr(C, k->at, "sum: unsupported operand type(s) for +: '%s' and '%s'", jv_kind_name(acc), jv_kind_name(x));
        if (jv_binop(C, k->at, "+", acc, x, &acc)) return -1;
    }
    *out = acc;
    return 0;
}

/* batch(linecount, fill_with=None): lists of linecount items, the last filled up */
static int f_batch(jcall *k, jv *out) {
    json_t *l, *r = json_array(), *cur = NULL;
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l)) return -1;
    if (!jv_isint(P(0)) || jv_intv(P(0)) <= 0) return jerr(C, k->at, "batch: linecount must be a positive integer");
    long long per = jv_intv(P(0));
    for (size_t i = 0; i < json_array_size(l); i++) {
        if (!cur) {
            if (!(cur = json_array()) || json_array_append_new(r, cur)) return joom(C);
        }
        if (json_array_append(cur, json_array_get(l, i))) return joom(C);
        if ((long long)json_array_size(cur) == per) cur = NULL;
    }
    if (cur && given(P(1)))
        while ((long long)json_array_size(cur) < per)
            if (append(k, cur, P(1))) return -1;
    *out = (jv){JV_JSON, r, NULL, NULL};
    return 0;
}

/* slice(slices, fill_with=None): slices columns, the first ones one longer */
static int f_slice(jcall *k, jv *out) {
    json_t *l, *r = json_array();
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l)) return -1;
    if (!jv_isint(P(0)) || jv_intv(P(0)) <= 0 || jv_intv(P(0)) > 100000) return jerr(C, k->at, "slice: slices must be a positive integer");
    long long slices = jv_intv(P(0)), len = (long long)json_array_size(l), per = len / slices, extra = len % slices, off = 0;
    for (long long s = 0; s < slices; s++) {
        long long st = off + s * per;
        if (s < extra) off++;
        long long en = off + (s + 1) * per;
        json_t *t = json_array();
        if (!t || json_array_append_new(r, t)) return joom(C);
        for (long long i = st; i < en; i++)
            if (json_array_append(t, json_array_get(l, (size_t)i))) return joom(C);
        if (given(P(1)) && s >= extra && append(k, t, P(1))) return -1;
    }
    *out = (jv){JV_JSON, r, NULL, NULL};
    return 0;
}

/* groupby(attribute, default=None, case_sensitive=False): (grouper, list) pairs, by key */
static int f_groupby(jcall *k, jv *out) {
    json_t *l, *r = json_array();
    jv *keys;
    size_t *idx;
    if (jv_own(C, r).k == JV_UNDEF || items_of(k, V, &l)) return -1;
    int fold_case = !jv_truthy(P(2));
    size_t n = json_array_size(l);
    keys = malloc(sizeof *keys * (n + 1));
    if (!keys) return joom(C);
    for (size_t i = 0; i < n; i++) { /* the key: the attribute, or the default when it is undefined */
        jv x;
        if (jb_attr_path(C, k->at, item(k, l, i), P(0), &x)) { free(keys); return -1; }
        if (x.k == JV_UNDEF && given(P(1))) x = P(1);
        if (fold_case && fold(k, x, &x)) { free(keys); return -1; }
        keys[i] = x;
    }
    if (sort_order(k, l, keys, 0, &idx)) { free(keys); return -1; }
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        size_t j = i + 1;
        while (j < n && jv_equal(C, keys[idx[j]], keys[idx[i]])) j++;
        json_t *g = json_array(), *pair = json_array();
        jv grouper = keys[idx[i]];
        if (fold_case) { /* the first item's own key, not its lower() */
            if (jb_attr_path(C, k->at, item(k, l, idx[i]), P(0), &grouper)) rc = -1;
            else if (grouper.k == JV_UNDEF && given(P(1))) grouper = P(1);
        }
        json_t *gk = rc ? NULL : jv_json(C, k->at, grouper);
        if (!g || !pair || !gk || json_array_append_new(r, pair) || json_array_append(pair, gk) || json_array_append_new(pair, g)) {
            rc = rc ? rc : joom(C);
            break;
        }
        for (size_t q = i; q < j && !rc; q++) rc = json_array_append(g, json_array_get(l, idx[q])) ? joom(C) : 0;
        if (!rc) rc = jv_set_tag(C, pair, JTAG_GROUP);
        i = j;
    }
    free(keys);
    free(idx);
    *out = (jv){JV_JSON, r, NULL, NULL};
    return rc;
}

/* attr(name): Python's getattr alone (a namespace's attribute, a method; not a dict's key) */
static int f_attr(jcall *k, jv *out) {
    jv name;
    if (text(k, P(0), &name)) return -1;
    return jb_getattr(C, k->at, V, name, 2, out);
}

/* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static int f_tojson(jcall *k, jv *out) {
    jv ind = P(1), sep = P(2);
    char spaces[256];
    jjson_opts op = {NULL, ", ", ": ", jv_truthy(P(3)), jv_truthy(P(0))};
    if (jv_isint(ind)) {
        long long w = jv_intv(ind) < 0 ? 0 : jv_intv(ind) > 255 ? 255 : jv_intv(ind);
        memset(spaces, ' ', (size_t)w);
        spaces[w] = 0;
        op.indent = spaces;
    } else if (jv_is_str(ind)) op.indent = json_string_value(ind.j);
    else if (given(ind)) return jerr(C, k->at, "tojson: indent must be an integer or a string");
    if (op.indent) op.item_sep = ",";
    if (given(sep)) {
        if (!jv_is_list(sep) || json_array_size(sep.j) != 2 || !json_is_string(json_array_get(sep.j, 0)) ||
            !json_is_string(json_array_get(sep.j, 1)))
            return jerr(C, k->at, "tojson: separators must be a pair of strings");
        op.item_sep = json_string_value(json_array_get(sep.j, 0));
        op.key_sep = json_string_value(json_array_get(sep.j, 1));
    }
    sm_buf b = {0};
    jv v = V.k == JV_JSON ? jv_elem(C, V.j) : V;
    if (jv_tojson(C, v, &op, 0, &b)) { sm_buf_free(&b); return -1; }
    return RET(jv_buf(C, &b));
}

#define F(n, f, ...) {n, JB_FILTER, 0, f, {__VA_ARGS__}, 0}
#define FV(n, f) {n, JB_FILTER, 0, f, {NULL}, 1}
const jbuiltin jb_filters[] = {
    F("abs", f_abs, NULL),
    F("attr", f_attr, "name", NULL),
    F("batch", f_batch, "linecount", "fill_with", NULL),
    F("capitalize", f_capitalize, NULL),
    F("center", f_center, "width", NULL),
    F("count", f_length, NULL),
    F("d", f_default, "default_value", "boolean", NULL),
    F("default", f_default, "default_value", "boolean", NULL),
    F("dictsort", f_dictsort, "case_sensitive", "by", "reverse", NULL),
    F("e", f_escape, NULL),
    F("escape", f_escape, NULL),
    F("first", f_first, NULL),
    F("float", f_float, "default", NULL),
    F("forceescape", f_escape, NULL),
    FV("format", f_format),
    F("groupby", f_groupby, "attribute", "default", "case_sensitive", NULL),
    F("indent", f_indent, "width", "first", "blank", NULL),
    F("int", f_int, "default", "base", NULL),
    F("items", f_items, NULL),
    F("join", f_join, "d", "attribute", NULL),
    F("last", f_last, NULL),
    F("length", f_length, NULL),
    F("list", f_list, NULL),
    F("lower", f_lower, NULL),
    FV("map", f_map),
    F("max", f_max, "case_sensitive", "attribute", NULL),
    F("min", f_min, "case_sensitive", "attribute", NULL),
    FV("reject", f_reject),
    FV("rejectattr", f_rejectattr),
    F("replace", f_replace, "old", "new", "count", NULL),
    F("reverse", f_reverse, NULL),
    F("round", f_round, "precision", "method", NULL),
    F("safe", f_safe, NULL),
    FV("select", f_select),
    FV("selectattr", f_selectattr),
    F("slice", f_slice, "slices", "fill_with", NULL),
    F("sort", f_sort, "reverse", "case_sensitive", "attribute", NULL),
    F("string", f_string, NULL),
    F("sum", f_sum, "attribute", "start", NULL),
    F("title", f_title, NULL),
    F("tojson", f_tojson, "ensure_ascii", "indent", "separators", "sort_keys", NULL),
    F("trim", f_trim, "chars", NULL),
    F("truncate", f_truncate, "length", "killwords", "end", "leeway", NULL),
    F("unique", f_unique, "case_sensitive", "attribute", NULL),
    F("upper", f_upper, NULL),
    {NULL, 0, 0, NULL, {NULL}, 0},
};
