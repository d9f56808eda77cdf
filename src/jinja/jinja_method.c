/* jinja_method.c: the methods templates call on values (see jinja_call.h), with Python's
 * meaning: str (startswith / endswith with a prefix or a tuple of them, split / rsplit /
 * splitlines, strip / lstrip / rstrip with or without chars, case, replace, count, find /
 * rfind / index / rindex, format, join, partition, removeprefix / removesuffix, is*, center /
 * ljust / rjust / zfill), dict (get, items, keys, values, copy), list (count, index, copy) and
 * the loop object (cycle, changed).  Methods that change a list or dict (append, update, ...)
 * are not here: the sandbox transformers renders in refuses them.
 *
 * Positions count code points, as Python's str does: a text is walked with ju_next, and a
 * byte offset found by memcmp becomes an index by counting the code points before it.  We
 * rejected converting every string to UTF-32 first: most calls look at a few bytes of it.
 */
#include "jinja/jinja_call.h"
#include <stdlib.h>
#include <string.h>

#define C (k->c)
#define S (json_string_value(k->self.j))
#define N (json_string_length(k->self.j))
#define RET(v) (*out = (v), out->k == JV_UNDEF ? -1 : 0)

static int need_str(jcall *k, jv v, const char *what) {
    if (jv_is_str(v)) return 0;
    return jerr(C, k->at, "%s() argument %s must be str, not %s", k->b->name, what, jv_kind_name(v));
}

/* The byte range [*b0, *b1) of code points [start, end) of s (Python's slice rules; None or
 * undefined: the ends); *cp0 the code point index of *b0. */
static int cp_range(jcall *k, const char *s, size_t n, jv start, jv end, size_t *b0, size_t *b1, size_t *cp0) {
    long long len = (long long)ju_len(s, n), lim[2] = {0, len};
    jv a[2] = {start, end};
    for (int i = 0; i < 2; i++) {
        if (a[i].k == JV_UNDEF || (a[i].k == JV_JSON && json_is_null(a[i].j))) continue;
        if (!jv_isint(a[i])) return jerr(C, k->at, "slice indices must be integers or None");
        long long x = jv_intv(a[i]);
        if (x < 0) x = x + len < 0 ? 0 : x + len;
        lim[i] = x > len ? len : x;
    }
    size_t i = 0;
    long long cp = 0;
    for (; cp < lim[0] && i < n; cp++) ju_next(s, n, &i);
    *b0 = i;
    *cp0 = (size_t)cp;
    for (; cp < lim[1] && i < n; cp++) ju_next(s, n, &i);
    *b1 = lim[1] < lim[0] ? *b0 : i;
    return lim[1] < lim[0] ? 1 : 0; /* 1: an empty range that starts past its end */
}

/* ---- str: tests of a prefix / suffix, search ------------------------------------------------ */

static int affix(jcall *k, jv *out, int suffix) {
    size_t b0, b1, cp0;
    int empty = cp_range(k, S, N, k->p[1], k->p[2], &b0, &b1, &cp0);
    if (empty < 0) return -1;
    jv p = k->p[0];
    size_t np = 1;
    if (jv_is_list(p) && jv_is_tuple(C, p.j)) np = json_array_size(p.j);
    else if (!jv_is_str(p))
        return jerr(C, k->at, "%s first arg must be str or a tuple of str, not %s", k->b->name, jv_kind_name(p));
    int hit = 0;
    for (size_t i = 0; i < np && !hit; i++) {
        json_t *x = jv_is_str(p) ? p.j : json_array_get(p.j, i);
        if (!json_is_string(x)) return jerr(C, k->at, "tuple for %s must only contain str", k->b->name);
        size_t xn = json_string_length(x);
        if (empty) { hit = 0; continue; }
        hit = xn <= b1 - b0 && !memcmp(S + (suffix ? b1 - xn : b0), json_string_value(x), xn);
    }
    return RET(jv_bool(C, hit));
}
static int m_startswith(jcall *k, jv *out) { return affix(k, out, 0); }
static int m_endswith(jcall *k, jv *out) { return affix(k, out, 1); }

/* find / rfind / index / rindex / count of sub within [start, end) */
static int search(jcall *k, jv *out, int last, int must, int count) {
    if (need_str(k, k->p[0], "1")) return -1;
    size_t b0, b1, cp0;
    int empty = cp_range(k, S, N, k->p[1], k->p[2], &b0, &b1, &cp0);
    if (empty < 0) return -1;
    const char *sub = json_string_value(k->p[0].j);
    size_t sn = json_string_length(k->p[0].j);
    long long found = -1, hits = 0;
    if (!empty && sn <= b1 - b0) {
        if (count && !sn) hits = (long long)ju_len(S + b0, b1 - b0) + 1; /* "" occurs between every two characters */
        for (size_t i = b0; !(count && !sn) && i + sn <= b1;) {
            if (!memcmp(S + i, sub, sn)) {
                hits++;
                if (found < 0 || last) found = (long long)i;
                if (!last && !count) break;
                i += count ? sn : 1; /* count: matches do not overlap; rfind: the last start */
            } else i++;
        }
        if (!sn && !count) found = (long long)(last ? b1 : b0);
    }
    if (count) return RET(jv_int(C, hits));
    if (found < 0 && must) return jerr(C, k->at, "substring not found");
    return RET(jv_int(C, found < 0 ? -1 : (long long)(cp0 + ju_len(S + b0, (size_t)found - b0))));
}
static int m_find(jcall *k, jv *out) { return search(k, out, 0, 0, 0); }
static int m_rfind(jcall *k, jv *out) { return search(k, out, 1, 0, 0); }
static int m_index(jcall *k, jv *out) { return search(k, out, 0, 1, 0); }
static int m_rindex(jcall *k, jv *out) { return search(k, out, 1, 1, 0); }
static int m_count(jcall *k, jv *out) { return search(k, out, 0, 0, 1); }

/* ---- str: pieces -------------------------------------------------------------------------- */

/* Does code point cp belong to chars (a str) or, chars undefined / None, whitespace? */
static int in_set(uint32_t cp, jv chars) {
    if (!jv_is_str(chars)) return ju_isspace(cp);
    const char *s = json_string_value(chars.j);
    size_t n = json_string_length(chars.j);
    for (size_t i = 0; i < n;)
        if (ju_next(s, n, &i) == cp) return 1;
    return 0;
}

int jm_strip(jctx *c, const jnode *at, jv s, jv chars, int ends, jv *out) {
    if (chars.k == JV_JSON && !json_is_null(chars.j) && !jv_is_str(chars))
        return jerr(c, at, "strip arg must be None or str, not %s", jv_kind_name(chars));
    const char *p = json_string_value(s.j);
    size_t b = 0, e = json_string_length(s.j);
    if (ends & 1)
        while (b < e) {
            size_t i = b;
            if (!in_set(ju_next(p, e, &i), chars)) break;
            b = i;
        }
    if (ends & 2)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80) st--; /* the last character's first byte */
            size_t i = st;
            if (!in_set(ju_next(p, e, &i), chars)) break;
            e = st;
        }
    *out = jv_str(c, p + b, e - b);
    return out->k == JV_UNDEF ? -1 : 0;
}
static int m_strip(jcall *k, jv *out) { return jm_strip(C, k->at, k->self, k->p[0], 3, out); }
static int m_lstrip(jcall *k, jv *out) { return jm_strip(C, k->at, k->self, k->p[0], 1, out); }
static int m_rstrip(jcall *k, jv *out) { return jm_strip(C, k->at, k->self, k->p[0], 2, out); }

int jm_replace(jctx *c, const jnode *at, jv s, jv from, jv to, long long count, jv *out) {
    if (!jv_is_str(from) || !jv_is_str(to)) return jerr(c, at, "replace() arguments must be str");
    const char *p = json_string_value(s.j), *f = json_string_value(from.j), *t = json_string_value(to.j);
    size_t n = json_string_length(s.j), fn = json_string_length(from.j), tn = json_string_length(to.j);
    sm_buf b = {0};
    int rc = 0;
    for (size_t i = 0; !rc && i <= n;) {
        if (count != 0 && (fn ? i + fn <= n && !memcmp(p + i, f, fn) : 1)) {
            rc = sm_buf_add(&b, t, tn);
            if (count > 0) count--;
            if (fn) { i += fn; continue; }
        }
        if (i == n) break;
        size_t st = i;
        ju_next(p, n, &i);
        rc = rc || sm_buf_add(&b, p + st, i - st);
        if (b.n > MAX_OUT) { sm_buf_free(&b); return jerr(c, at, "replace(): a string longer than %zu bytes", MAX_OUT); }
    }
    if (rc) { sm_buf_free(&b); return joom(c); }
    *out = jv_buf(c, &b);
    return out->k == JV_UNDEF ? -1 : 0;
}
static int m_replace(jcall *k, jv *out) {
    jv cnt = k->p[2];
    if (cnt.k != JV_UNDEF && !jv_isint(cnt)) return jerr(C, k->at, "replace() count must be an integer");
    return jm_replace(C, k->at, k->self, k->p[0], k->p[1], cnt.k == JV_UNDEF ? -1 : jv_intv(cnt), out);
}

static int add_piece(jctx *c, json_t *l, const char *s, size_t n) {
    return json_array_append_new(l, json_stringn_nocheck(s, n)) ? joom(c) : 0;
}

/* split / rsplit (from the right: pieces found right to left, then put in order) */
static int splitter(jcall *k, jv *out, int right) {
    jv sep = k->p[0], mx = k->p[1];
    if (mx.k != JV_UNDEF && !jv_isint(mx)) return jerr(C, k->at, "%s(): maxsplit must be an integer", k->b->name);
    if (sep.k == JV_JSON && json_is_null(sep.j)) sep = JV_UNDEFINED;
    if (sep.k != JV_UNDEF && need_str(k, sep, "sep")) return -1;
    long long left = mx.k == JV_UNDEF ? -1 : jv_intv(mx);
    const char *p = S;
    size_t n = N;
    json_t *l = json_array();
    if (jv_own(C, l).k == JV_UNDEF) return -1;
    if (sep.k != JV_UNDEF) {
        const char *f = json_string_value(sep.j);
        size_t fn = json_string_length(sep.j);
        if (!fn) return jerr(C, k->at, "empty separator");
        if (!right) {
            size_t st = 0;
            for (size_t i = 0; i + fn <= n;) {
                if (left != 0 && !memcmp(p + i, f, fn)) {
                    if (add_piece(C, l, p + st, i - st)) return -1;
                    i += fn;
                    st = i;
                    if (left > 0) left--;
                } else i++;
            }
            if (add_piece(C, l, p + st, n - st)) return -1;
        } else {
            size_t en = n;
            for (size_t i = n; i >= fn;) {
                if (left != 0 && !memcmp(p + i - fn, f, fn)) {
                    if (json_array_insert_new(l, 0, json_stringn_nocheck(p + i, en - i))) return joom(C);
                    i -= fn;
                    en = i;
                    if (left > 0) left--;
                } else i--;
            }
            if (json_array_insert_new(l, 0, json_stringn_nocheck(p, en))) return joom(C);
        }
        *out = (jv){JV_JSON, l, NULL, NULL};
        return 0;
    }
    /* runs of whitespace; no empty pieces; the rest past maxsplit keeps its inner whitespace */
    size_t *o, cnt;
    if (ju_offsets(p, n, &o, &cnt)) return joom(C);
    uint32_t *cp = malloc(sizeof *cp * (cnt + 1));
    if (!cp) { free(o); return joom(C); }
    for (size_t i = 0; i < cnt; i++) { size_t q = o[i]; cp[i] = ju_next(p, n, &q); }
    int rc = 0;
    if (!right) {
        size_t i = 0;
        while (!rc) {
            while (i < cnt && ju_isspace(cp[i])) i++;
            if (i >= cnt) break;
            size_t st = i;
            if (left == 0) { /* the rest as it is */
                rc = add_piece(C, l, p + o[st], n - o[st]);
                break;
            }
            while (i < cnt && !ju_isspace(cp[i])) i++;
            rc = add_piece(C, l, p + o[st], o[i] - o[st]);
            if (left > 0) left--;
        }
    } else {
        size_t i = cnt;
        while (!rc) {
            while (i > 0 && ju_isspace(cp[i - 1])) i--;
            if (!i) break;
            size_t en = i;
            if (left == 0) {
                rc = json_array_insert_new(l, 0, json_stringn_nocheck(p, o[en])) ? joom(C) : 0;
                break;
            }
            while (i > 0 && !ju_isspace(cp[i - 1])) i--;
            rc = json_array_insert_new(l, 0, json_stringn_nocheck(p + o[i], o[en] - o[i])) ? joom(C) : 0;
            if (left > 0) left--;
        }
    }
    free(o);
    free(cp);
    if (rc) return -1;
    *out = (jv){JV_JSON, l, NULL, NULL};
    return 0;
}
static int m_split(jcall *k, jv *out) { return splitter(k, out, 0); }
static int m_rsplit(jcall *k, jv *out) { return splitter(k, out, 1); }

int jm_splitlines(jctx *c, const char *s, size_t n, int keep, json_t *l) {
    size_t st = 0;
    for (size_t i = 0; i < n;) {
        size_t b = i;
        uint32_t cp = ju_next(s, n, &i);
        if (!ju_islinebreak(cp)) continue;
        if (cp == '\r' && i < n && s[i] == '\n') i++;
        if (add_piece(c, l, s + st, (keep ? i : b) - st)) return -1;
        st = i;
    }
    return st < n ? add_piece(c, l, s + st, n - st) : 0;
}
static int m_splitlines(jcall *k, jv *out) {
    json_t *l = json_array();
    if (jv_own(C, l).k == JV_UNDEF || jm_splitlines(C, S, N, jv_truthy(k->p[0]), l)) return -1;
    *out = (jv){JV_JSON, l, NULL, NULL};
    return 0;
}

static int partition(jcall *k, jv *out, int right) {
    if (need_str(k, k->p[0], "1")) return -1;
    const char *f = json_string_value(k->p[0].j);
    size_t fn = json_string_length(k->p[0].j), at = (size_t)-1;
    if (!fn) return jerr(C, k->at, "empty separator");
    for (size_t i = 0; i + fn <= N; i++)
        if (!memcmp(S + i, f, fn)) { at = i; if (!right) break; }
    json_t *t = json_array();
    int rc = !t;
    if (at == (size_t)-1) { /* not found: (s, '', '') or ('', '', s) */
        rc = rc || add_piece(C, t, right ? "" : S, right ? 0 : N) || add_piece(C, t, "", 0) ||
             add_piece(C, t, right ? S : "", right ? N : 0);
    } else rc = rc || add_piece(C, t, S, at) || add_piece(C, t, f, fn) || add_piece(C, t, S + at + fn, N - at - fn);
    if (rc) { json_decref(t); return -1; }
    return RET(jv_tuple(C, t));
}
static int m_partition(jcall *k, jv *out) { return partition(k, out, 0); }
static int m_rpartition(jcall *k, jv *out) { return partition(k, out, 1); }

static int affix_remove(jcall *k, jv *out, int suffix) {
    if (need_str(k, k->p[0], "1")) return -1;
    size_t fn = json_string_length(k->p[0].j);
    if (fn > N || memcmp(S + (suffix ? N - fn : 0), json_string_value(k->p[0].j), fn)) return RET(k->self);
    return RET(jv_str(C, S + (suffix ? 0 : fn), N - fn));
}
static int m_removeprefix(jcall *k, jv *out) { return affix_remove(k, out, 0); }
static int m_removesuffix(jcall *k, jv *out) { return affix_remove(k, out, 1); }

/* ---- str: case, classes, padding, joining, formatting --------------------------------------- */

static int recase(jcall *k, jv *out, int mode) {
    sm_buf b = {0};
    if (ju_case(S, N, mode, &b)) { sm_buf_free(&b); return joom(C); }
    return RET(jv_buf(C, &b));
}
static int m_lower(jcall *k, jv *out) { return recase(k, out, JU_LOWER); }
static int m_upper(jcall *k, jv *out) { return recase(k, out, JU_UPPER); }
static int m_title(jcall *k, jv *out) { return recase(k, out, JU_TITLE); }
static int m_capitalize(jcall *k, jv *out) { return recase(k, out, JU_CAPITALIZE); }
static int m_swapcase(jcall *k, jv *out) { return recase(k, out, JU_SWAPCASE); }

static int m_islower(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISLOWER))); }
static int m_isupper(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISUPPER))); }
static int m_istitle(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISTITLE))); }
static int m_isspace(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISSPACE))); }
static int m_isalpha(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISALPHA))); }
static int m_isdigit(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISDIGIT))); }
static int m_isdecimal(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISDECIMAL))); }
static int m_isalnum(jcall *k, jv *out) { return RET(jv_bool(C, ju_is(S, N, JU_ISALNUM))); }

int jm_pad(jctx *c, const jnode *at, jv s, jv width, jv fillchar, char how, jv *out) {
    if (!jv_isint(width)) return jerr(c, at, "'%s' object cannot be interpreted as an integer", jv_kind_name(width));
    uint32_t fill = ' ';
    if (fillchar.k != JV_UNDEF) {
        size_t i = 0;
        if (!jv_is_str(fillchar) || ju_len(json_string_value(fillchar.j), json_string_length(fillchar.j)) != 1)
            return jerr(c, at, "The fill character must be exactly one character long");
        fill = ju_next(json_string_value(fillchar.j), json_string_length(fillchar.j), &i);
    }
    const char *p = json_string_value(s.j);
    size_t n = json_string_length(s.j);
    long long len = (long long)ju_len(p, n), w = jv_intv(width), marg = w - len, left;
    if (marg <= 0) { *out = s; return 0; }
    if (marg > (long long)MAX_OUT / 4) return jerr(c, at, "a string padded beyond %zu bytes", MAX_OUT);
    if (how == 'c') left = marg / 2 + (marg & w & 1); /* Python's center */
    else left = how == 'r' || how == 'z' ? marg : 0;
    sm_buf b = {0};
    int rc = 0;
    size_t sign = how == 'z' && n && (p[0] == '+' || p[0] == '-'); /* zfill: zeros after a sign */
    if (sign) rc = sm_buf_add(&b, p, 1);
    for (long long i = 0; i < left && !rc; i++) rc = ju_put(&b, how == 'z' ? '0' : fill);
    rc = rc || sm_buf_add(&b, p + sign, n - sign);
    for (long long i = left; i < marg && !rc; i++) rc = ju_put(&b, fill);
    if (rc) { sm_buf_free(&b); return joom(c); }
    *out = jv_buf(c, &b);
    return out->k == JV_UNDEF ? -1 : 0;
}
static int m_center(jcall *k, jv *out) { return jm_pad(C, k->at, k->self, k->p[0], k->p[1], 'c', out); }
static int m_ljust(jcall *k, jv *out) { return jm_pad(C, k->at, k->self, k->p[0], k->p[1], 'l', out); }
static int m_rjust(jcall *k, jv *out) { return jm_pad(C, k->at, k->self, k->p[0], k->p[1], 'r', out); }
static int m_zfill(jcall *k, jv *out) { return jm_pad(C, k->at, k->self, k->p[0], JV_UNDEFINED, 'z', out); }

static int m_join(jcall *k, jv *out) {
    json_t *items;
    if (jv_items(C, k->at, k->p[0], &items)) return -1;
    sm_buf b = {0};
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *x = json_array_get(items, i);
        if (!json_is_string(x)) {
            sm_buf_free(&b);
            return jerr(C, k->at, "sequence item %zu: expected str instance, %s found", i, jv_kind_name((jv){JV_JSON, x, NULL, NULL}));
        }
        if ((i && sm_buf_add(&b, S, N)) || sm_buf_add(&b, json_string_value(x), json_string_length(x))) {
            sm_buf_free(&b);
            return joom(C);
        }
    }
    return RET(jv_buf(C, &b));
}

static int m_format(jcall *k, jv *out) { return jv_format(C, k->at, S, N, k->rest, k->nrest, k->kwn, k->kwv, k->nkw, out); }

/* ---- dict ------------------------------------------------------------------------------------------ */

static int m_get(jcall *k, jv *out) {
    json_t *x = jv_is_str(k->p[0]) ? json_object_get(k->self.j, json_string_value(k->p[0].j)) : NULL;
    if (x) return RET(jv_borrow(C, x));
    if (k->p[1].k != JV_UNDEF) { *out = k->p[1]; return 0; }
    return RET(jv_none(C));
}

/* keys() / values() / items(): a list marked as the view Python prints */
static int view(jcall *k, jv *out, int tag) {
    json_t *l = json_array();
    const char *key;
    json_t *x;
    if (jv_own(C, l).k == JV_UNDEF) return -1;
    json_object_foreach(k->self.j, key, x) {
        json_t *e = tag == JTAG_KEYS ? json_string_nocheck(key) : tag == JTAG_VALUES ? json_incref(x) : json_pack("[sO]", key, x);
        if (!e || json_array_append_new(l, e)) return joom(C);
        if (tag == JTAG_ITEMS && jv_set_tag(C, e, JTAG_TUPLE)) return -1;
    }
    if (jv_set_tag(C, l, tag)) return -1;
    *out = (jv){JV_JSON, l, NULL, NULL};
    return 0;
}
static int m_keys(jcall *k, jv *out) { return view(k, out, JTAG_KEYS); }
static int m_values(jcall *k, jv *out) { return view(k, out, JTAG_VALUES); }
static int m_items(jcall *k, jv *out) { return view(k, out, JTAG_ITEMS); }
static int m_copy(jcall *k, jv *out) { return RET(jv_own(C, json_copy(k->self.j))); }

/* ---- list ------------------------------------------------------------------------------------------- */

static int m_list_count(jcall *k, jv *out) {
    long long n = 0;
    for (size_t i = 0; i < json_array_size(k->self.j); i++) n += jv_equal(C, (jv){JV_JSON, json_array_get(k->self.j, i), NULL, NULL}, k->p[0]);
    return RET(jv_int(C, n));
}
static int m_list_index(jcall *k, jv *out) {
    for (size_t i = 0; i < json_array_size(k->self.j); i++)
        if (jv_equal(C, (jv){JV_JSON, json_array_get(k->self.j, i), NULL, NULL}, k->p[0])) return RET(jv_int(C, (long long)i));
    return jerr(C, k->at, "value is not in list");
}

/* ---- the loop object ---------------------------------------------------------------------------------- */

static int m_cycle(jcall *k, jv *out) {
    if (!k->nrest) return jerr(C, k->at, "no items for cycling given");
    long long i = json_integer_value(json_object_get(k->self.j, "index0"));
    *out = k->rest[i % k->nrest];
    return 0;
}

/* changed(*values): true when values differ from the last call's (the loop's state, shared by its iterations) */
static int m_changed(jcall *k, jv *out) {
    json_t *state = json_object_get(k->self.j, "\x01state"), *now = json_array();
    if (!state || jv_own(C, now).k == JV_UNDEF) return joom(C);
    for (int i = 0; i < k->nrest; i++)
        if (k->rest[i].k != JV_JSON || json_array_append(now, k->rest[i].j)) return jerr(C, k->at, "changed() takes data values");
    json_t *last = json_object_get(state, "last");
    int changed = !last || !jv_equal(C, (jv){JV_JSON, last, NULL, NULL}, (jv){JV_JSON, now, NULL, NULL});
    if (changed && json_object_set(state, "last", now)) return joom(C);
    return RET(jv_bool(C, changed));
}

#define M(n, f, on, ...) {n, JB_METHOD, on, f, {__VA_ARGS__}, 0}
#define MV(n, f, on) {n, JB_METHOD, on, f, {NULL}, 1}
const jbuiltin jb_methods[] = {
    M("startswith", m_startswith, JM_STR, "prefix", "start", "end", NULL),
    M("endswith", m_endswith, JM_STR, "suffix", "start", "end", NULL),
    M("find", m_find, JM_STR, "sub", "start", "end", NULL),
    M("rfind", m_rfind, JM_STR, "sub", "start", "end", NULL),
    M("index", m_index, JM_STR, "sub", "start", "end", NULL),
    M("rindex", m_rindex, JM_STR, "sub", "start", "end", NULL),
    M("count", m_count, JM_STR, "sub", "start", "end", NULL),
    M("strip", m_strip, JM_STR, "chars", NULL),
    M("lstrip", m_lstrip, JM_STR, "chars", NULL),
    M("rstrip", m_rstrip, JM_STR, "chars", NULL),
    M("replace", m_replace, JM_STR, "old", "new", "count", NULL),
    M("split", m_split, JM_STR, "sep", "maxsplit", NULL),
    M("rsplit", m_rsplit, JM_STR, "sep", "maxsplit", NULL),
    M("splitlines", m_splitlines, JM_STR, "keepends", NULL),
    M("partition", m_partition, JM_STR, "sep", NULL),
    M("rpartition", m_rpartition, JM_STR, "sep", NULL),
    M("removeprefix", m_removeprefix, JM_STR, "prefix", NULL),
    M("removesuffix", m_removesuffix, JM_STR, "suffix", NULL),
    M("lower", m_lower, JM_STR, NULL),
    M("upper", m_upper, JM_STR, NULL),
    M("title", m_title, JM_STR, NULL),
    M("capitalize", m_capitalize, JM_STR, NULL),
    M("swapcase", m_swapcase, JM_STR, NULL),
    M("islower", m_islower, JM_STR, NULL),
    M("isupper", m_isupper, JM_STR, NULL),
    M("istitle", m_istitle, JM_STR, NULL),
    M("isspace", m_isspace, JM_STR, NULL),
    M("isalpha", m_isalpha, JM_STR, NULL),
    M("isdigit", m_isdigit, JM_STR, NULL),
    M("isdecimal", m_isdecimal, JM_STR, NULL),
    M("isalnum", m_isalnum, JM_STR, NULL),
    M("center", m_center, JM_STR, "width", "fillchar", NULL),
    M("ljust", m_ljust, JM_STR, "width", "fillchar", NULL),
    M("rjust", m_rjust, JM_STR, "width", "fillchar", NULL),
    M("zfill", m_zfill, JM_STR, "width", NULL),
    M("join", m_join, JM_STR, "iterable", NULL),
    MV("format", m_format, JM_STR),
    M("get", m_get, JM_DICT, "key", "default", NULL),
    M("keys", m_keys, JM_DICT, NULL),
    M("values", m_values, JM_DICT, NULL),
    M("items", m_items, JM_DICT, NULL),
    M("copy", m_copy, JM_DICT | JM_LIST, NULL),
    M("count", m_list_count, JM_LIST, "value", NULL),
    M("index", m_list_index, JM_LIST, "value", NULL),
    MV("cycle", m_cycle, JM_LOOP),
    MV("changed", m_changed, JM_LOOP),
    {NULL, 0, 0, NULL, {NULL}, 0},
};
