/* jinja_ops.c: the operators of Jinja expressions with Python's meaning (see jinja_int.h):
 * arithmetic on int / float / bool, + and * on strings, lists and tuples, ~, comparisons,
 * in, and the two ways Python formats a string: fmt % args (printf-style: %s %r %d %i %x %X
 * %o %e %E %f %F %g %G %c with flags, width, precision and %(key)s) and fmt.format(...) (the
 * format mini-language: fill, align, sign, #, 0, width, grouping, precision and the types
 * s d b o x X c e E f F g G %).
 *
 * Integers are 64-bit: every integer operation checks its result (__builtin_*_overflow) and
 * an overflow is an error naming the operator, never a wrapped value; Python's integers have
 * no limit, so a wrapped value would silently differ.  We rejected promoting to double on
 * overflow: 2**64 and 2.0**64 print differently in Python.
 */
#include "jinja/jinja_int.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int overflow(jctx *c, const jnode *at, const char *op) {
    return jerr(c, at, "integer overflow in '%s': the result does not fit in 64 bits", op);
}

int ji_add(jctx *c, const jnode *at, long long a, long long b, long long *r) {
    return __builtin_add_overflow(a, b, r) ? overflow(c, at, "+") : 0;
}

int ji_mul(jctx *c, const jnode *at, long long a, long long b, long long *r) {
    return __builtin_mul_overflow(a, b, r) ? overflow(c, at, "*") : 0;
}

/* Python's float // and %. */
static void float_divmod(double x, double y, double *div, double *mod) {
    double m = fmod(x, y), d = (x - m) / y;
    if (m) {
        if ((y < 0) != (m < 0)) { m += y; d -= 1.0; }
    } else m = copysign(0.0, y);
    if (d) {
        double f = floor(d);
        if (d - f > 0.5) f += 1.0;
        d = f;
    } else d = copysign(0.0, x / y);
    *div = d;
    *mod = m;
}

/* s repeated k times (k < 0: none) as a string or list value; tag: the result's tuple tag. */
static int repeat(jctx *c, const jnode *at, jv s, long long k, jv *out) {
    if (k < 0) k = 0;
    if (jv_is_str(s)) {
        size_t n = json_string_length(s.j);
        if (n && (unsigned long long)k > MAX_OUT / n) return jerr(c, at, "a string repeated beyond %zu bytes", MAX_OUT);
        sm_buf b = {0};
        for (long long i = 0; i < k; i++)
            if (sm_buf_add(&b, json_string_value(s.j), n)) { sm_buf_free(&b); return joom(c); }
        *out = jv_buf(c, &b);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    size_t n = json_array_size(s.j);
    if (n && (unsigned long long)k > 10000000ull / n) return jerr(c, at, "a list repeated beyond 10000000 items");
    json_t *l = json_array();
    for (long long i = 0; l && i < k; i++)
        if (json_array_extend(l, s.j)) { json_decref(l); l = NULL; }
    *out = jv_is_tuple(c, s.j) ? jv_tuple(c, l) : jv_own(c, l);
    return out->k == JV_UNDEF ? -1 : 0;
}

static int contains(jctx *c, const jnode *at, jv a, jv b, int *in) {
    *in = 0;
    if (jv_is_str(b)) {
        if (!jv_is_str(a)) return jerr(c, at, "'in <string>' requires string as left operand, not %s", jv_kind_name(a));
        const char *h = json_string_value(b.j), *nd = json_string_value(a.j);
        size_t hn = json_string_length(b.j), nn = json_string_length(a.j);
        for (size_t i = 0; i + nn <= hn && !*in; i++) *in = !memcmp(h + i, nd, nn);
    } else if (jv_is_list(b)) {
        for (size_t i = 0; i < json_array_size(b.j) && !*in; i++) *in = jv_equal(c, a, (jv){JV_JSON, json_array_get(b.j, i), NULL, NULL});
    } else if (jv_is_dict(b)) {
        *in = jv_is_str(a) && json_object_get(b.j, json_string_value(a.j));
    } else if (b.k != JV_UNDEF) return jerr(c, at, "argument of type '%s' is not iterable", jv_kind_name(b));
    return 0;
}

int jv_binop(jctx *c, const jnode *at, const char *op, jv a, jv b, jv *out) {
    *out = JV_UNDEFINED;
    if (!strcmp(op, "~")) { /* str(a) + str(b) */
        sm_buf s = {0};
        if (jv_tostr(c, a, &s) || jv_tostr(c, b, &s)) { sm_buf_free(&s); return -1; }
        *out = jv_buf(c, &s);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        *out = jv_bool(c, jv_equal(c, a, b) == (op[0] == '='));
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(op, "in") || !strcmp(op, "not in")) {
        int in;
        if (contains(c, at, a, b, &in)) return -1;
        *out = jv_bool(c, in == (op[0] == 'i'));
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (op[0] == '<' || op[0] == '>') {
        int r;
        if (jv_cmp(c, at, a, b, &r)) return -1;
        *out = jv_bool(c, op[0] == '<' ? (op[1] ? r <= 0 : r < 0) : (op[1] ? r >= 0 : r > 0));
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (a.k == JV_UNDEF || b.k == JV_UNDEF) return jerr(c, at, "'%s' of an undefined value", op);
    if (!strcmp(op, "%") && jv_is_str(a)) return jv_percent(c, at, a, b, out);
    if (!strcmp(op, "+") && jv_is_str(a) && jv_is_str(b)) {
        sm_buf s = {0};
        if (sm_buf_add(&s, json_string_value(a.j), json_string_length(a.j)) ||
            sm_buf_add(&s, json_string_value(b.j), json_string_length(b.j))) { sm_buf_free(&s); return joom(c); }
        *out = jv_buf(c, &s);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(op, "+") && jv_is_list(a) && jv_is_list(b)) {
        int ta = jv_is_tuple(c, a.j), tb = jv_is_tuple(c, b.j);
        if (ta != tb || jv_tag(c, a.j) >= JTAG_KEYS || jv_tag(c, b.j) >= JTAG_KEYS)
            return jerr(c, at, "can only concatenate %s (not \"%s\") to %s", ta ? "tuple" : "list", tb ? "tuple" : "list",
                        ta ? "tuple" : "list");
        json_t *r = json_copy(a.j);
        if (r && json_array_extend(r, b.j)) { json_decref(r); r = NULL; }
        *out = ta ? jv_tuple(c, r) : jv_own(c, r);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!strcmp(op, "*") && (jv_is_str(a) || jv_is_list(a)) && jv_isint(b)) return repeat(c, at, a, jv_intv(b), out);
    if (!strcmp(op, "*") && (jv_is_str(b) || jv_is_list(b)) && jv_isint(a)) return repeat(c, at, b, jv_intv(a), out);
    if (!jv_isnum(a) || !jv_isnum(b))
        return jerr(c, at, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_kind_name(a), jv_kind_name(b));
    int ints = jv_isint(a) && jv_isint(b);
    long long x = ints ? jv_intv(a) : 0, y = ints ? jv_intv(b) : 0, r = 0;
    double p = jv_num(a), q = jv_num(b), d, m;
    if ((!strcmp(op, "/") || !strcmp(op, "//") || !strcmp(op, "%")) && q == 0) return jerr(c, at, "division by zero ('%s')", op);
    if (!strcmp(op, "+")) {
        if (!ints) { *out = jv_real(c, p + q); return out->k == JV_UNDEF ? -1 : 0; }
        if (ji_add(c, at, x, y, &r)) return -1;
    } else if (!strcmp(op, "-")) {
        if (!ints) { *out = jv_real(c, p - q); return out->k == JV_UNDEF ? -1 : 0; }
        if (__builtin_sub_overflow(x, y, &r)) return overflow(c, at, "-");
    } else if (!strcmp(op, "*")) {
        if (!ints) { *out = jv_real(c, p * q); return out->k == JV_UNDEF ? -1 : 0; }
        if (ji_mul(c, at, x, y, &r)) return -1;
    } else if (!strcmp(op, "/")) {
        *out = jv_real(c, p / q);
        return out->k == JV_UNDEF ? -1 : 0;
    } else if (!strcmp(op, "//") || !strcmp(op, "%")) {
        if (!ints) {
            float_divmod(p, q, &d, &m);
            *out = jv_real(c, op[1] ? d : m);
            return out->k == JV_UNDEF ? -1 : 0;
        }
        if (x == INT64_MIN && y == -1) { /* the one quotient that does not fit */
            if (op[1]) return overflow(c, at, "//");
            r = 0;
        } else if (op[1]) r = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
        else {
            r = x % y;
            if (r && ((r < 0) != (y < 0))) r += y;
        }
    } else if (!strcmp(op, "**")) {
        if (!ints || y < 0) {
            if (p == 0 && q < 0) return jerr(c, at, "0.0 cannot be raised to a negative power");
            if (p < 0 && q != floor(q)) return jerr(c, at, "'**' of a negative number to a fractional power (a complex number)");
            double v = pow(p, q);
            if (isinf(v) && !isinf(p) && !isinf(q)) return jerr(c, at, "float overflow in '**'");
            *out = jv_real(c, v);
            return out->k == JV_UNDEF ? -1 : 0;
        }
        r = 1;
        for (long long base = x, e = y; e; e >>= 1) { /* square and multiply, each step checked */
            if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return overflow(c, at, "**");
            if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow(c, at, "**");
        }
    } else return jerr(c, at, "unsupported operator '%s'", op);
    *out = jv_int(c, r);
    return out->k == JV_UNDEF ? -1 : 0;
}

/* ---- formatting shared by % and format() ---------------------------------------------------- */

/* text [n] padded to width code points: align '<', '>', '^' or '=' (after a sign / prefix of
 * sp code points), with fill. */
static int pad(sm_buf *o, const char *s, size_t n, long long width, char align, uint32_t fill, size_t sp) {
    long long len = (long long)ju_len(s, n), k = width > len ? width - len : 0, left = 0;
    if (align == '>') left = k;
    else if (align == '^') left = k / 2;
    else if (align == '=') {
        if (sm_buf_add(o, s, sp)) return -1;
        s += sp;
        n -= sp;
        left = k;
    }
    for (long long i = 0; i < left; i++)
        if (ju_put(o, fill)) return -1;
    if (sm_buf_add(o, s, n)) return -1;
    for (long long i = left; i < k; i++)
        if (ju_put(o, fill)) return -1;
    return 0;
}

/* Digits of x (|x| as unsigned) in base 2, 8, 10 or 16 into b (reversed order undone). */
static void digits(unsigned long long x, int base, int upper, char *b) {
    char t[72];
    int k = 0;
    const char *d = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    do { t[k++] = d[x % (unsigned)base]; x /= (unsigned)base; } while (x);
    for (int i = 0; i < k; i++) b[i] = t[k - 1 - i];
    b[k] = 0;
}

/* Group the integer digits of num (a plain number string, maybe with a fraction) by 3 with sep. */
static void group3(const char *num, char sep, char *out) {
    size_t intlen = strspn(num, "0123456789"), k = 0;
    for (size_t i = 0; i < intlen; i++) {
        out[k++] = num[i];
        if (sep && (intlen - 1 - i) % 3 == 0 && i + 1 < intlen) out[k++] = sep;
    }
    strcpy(out + k, num + intlen);
}

/* ---- fmt % args ------------------------------------------------------------------------------- */

int jv_percent(jctx *c, const jnode *at, jv fmt, jv args, jv *out) {
    const char *f = json_string_value(fmt.j);
    size_t n = json_string_length(fmt.j), argi = 0, argc = 1;
    json_t *tuple = jv_is_list(args) && jv_is_tuple(c, args.j) ? args.j : NULL;
    int mapping = !tuple && (jv_is_dict(args) || jv_is_list(args)); /* a dict, or a list (unused: no error) */
    if (tuple) argc = json_array_size(tuple);
    sm_buf o = {0};
#define FAIL(...) do { sm_buf_free(&o); return jerr(c, at, __VA_ARGS__); } while (0)
#define NEXT_ARG(v) do { \
        if (argi >= argc) FAIL("not enough arguments for format string"); \
        v = tuple ? (jv){JV_JSON, json_array_get(tuple, argi), NULL, NULL} : args; argi++; } while (0)
    for (size_t i = 0; i < n;) {
        const char *pc = memchr(f + i, '%', n - i);
        size_t e = pc ? (size_t)(pc - f) : n;
        if (sm_buf_add(&o, f + i, e - i)) FAIL("out of memory");
        if (!pc) break;
        i = e + 1;
        if (i >= n) FAIL("incomplete format");
        jv v = JV_UNDEFINED;
        int got = 0;
        if (f[i] == '(') { /* %(key)s */
            size_t k = i + 1, depth = 1;
            for (; k < n && depth; k++) depth += (f[k] == '(') - (f[k] == ')');
            if (depth) FAIL("incomplete format key");
            if (!jv_is_dict(args)) FAIL("format requires a mapping");
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(k - i - 2), f + i + 1);
            json_t *x = json_object_get(args.j, key);
            if (!x) FAIL("KeyError: '%s' (in a %% format)", key);
            v = (jv){JV_JSON, x, NULL, NULL};
            got = 1;
            i = k;
        }
        int minus = 0, plus = 0, space = 0, alt = 0, zero = 0;
        for (; i < n && strchr("-+ #0", f[i]); i++) {
            minus |= f[i] == '-'; plus |= f[i] == '+'; space |= f[i] == ' '; alt |= f[i] == '#'; zero |= f[i] == '0';
        }
        long long width = -1, prec = -1;
        for (int part = 0; part < 2; part++) { /* width, then "." precision; "*" takes an argument */
            long long *dst = part ? &prec : &width;
            if (part) {
                if (i >= n || f[i] != '.') break;
                i++;
                prec = 0;
            }
            if (i < n && f[i] == '*') {
                jv w;
                NEXT_ARG(w);
                if (!jv_isint(w)) FAIL("* wants int");
                *dst = jv_intv(w);
                if (!part && *dst < 0) { minus = 1; *dst = -*dst; }
                i++;
            } else {
                for (; i < n && f[i] >= '0' && f[i] <= '9'; i++) {
                    *dst = (*dst < 0 ? 0 : *dst) * 10 + (f[i] - '0');
                    if (*dst > 100000) FAIL("width or precision too big in a %% format");
                }
            }
        }
        while (i < n && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) i++; /* length modifiers: ignored, as Python does */
        if (i >= n) FAIL("incomplete format");
        char conv = f[i++];
        if (conv == '%') {
            if (sm_buf_str(&o, "%")) FAIL("out of memory");
            continue;
        }
        if (!got) NEXT_ARG(v);
        char num[1024], body[1100];
        const char *s = NULL;
        size_t sn = 0, sp = 0; /* the text; code points of its sign and prefix */
        sm_buf t = {0};
        char align = minus ? '<' : '>';
        uint32_t fill = ' ';
        switch (conv) {
        case 's': case 'r': {
            if ((conv == 's' ? jv_tostr(c, v, &t) : jv_repr(c, v, &t))) { sm_buf_free(&t); sm_buf_free(&o); return -1; }
            s = t.p ? t.p : "";
            sn = t.n;
            if (prec >= 0) { /* at most prec code points */
                size_t k = 0;
                for (long long q = 0; q < prec && k < sn; q++) ju_next(s, sn, &k);
                sn = k;
            }
            break;
        }
        case 'c':
            if (jv_is_str(v) && ju_len(json_string_value(v.j), json_string_length(v.j)) == 1) {
                s = json_string_value(v.j);
                sn = json_string_length(v.j);
            } else if (jv_isint(v) && jv_intv(v) >= 0 && jv_intv(v) <= 0x10FFFF) {
                ju_put(&t, (uint32_t)jv_intv(v));
                s = t.p;
                sn = t.n;
            } else FAIL("%%c requires an int or a unicode character, not %s", jv_kind_name(v));
            break;
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
            long long x;
            if (jv_isint(v)) x = jv_intv(v);
            else if (jv_isnum(v) && (conv == 'd' || conv == 'i' || conv == 'u')) {
                double dv = jv_num(v);
                if (isnan(dv) || isinf(dv)) FAIL("cannot convert float %s to integer", isnan(dv) ? "NaN" : "infinity");
                if (dv >= 9223372036854775808.0 || dv < -9223372036854775808.0)
                    FAIL("integer overflow in '%%d': %g does not fit in 64 bits", dv);
                x = (long long)dv; /* int() truncates */
            } else
                FAIL("%%%c format: %s is required, not %s", conv,
                     conv == 'x' || conv == 'X' || conv == 'o' ? "an integer" : "a real number", jv_kind_name(v));
            unsigned long long ax = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
            char d[72];
            digits(ax, conv == 'x' || conv == 'X' ? 16 : conv == 'o' ? 8 : 10, conv == 'X', d);
            char pre[8] = "";
            snprintf(pre, sizeof pre, "%s%s", x < 0 ? "-" : plus ? "+" : space ? " " : "",
                     !alt ? "" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "");
            long long nd = (long long)strlen(d);
            long long zeros = prec > nd ? prec - nd : 0;
            if (zero && !minus && prec < 0 && width > (long long)strlen(pre) + nd) zeros = width - (long long)strlen(pre) - nd;
            if (zeros > 100000) FAIL("width too big in a %% format");
            snprintf(body, sizeof body, "%s", pre);
            for (long long z = 0; z < zeros && strlen(body) < sizeof body - 80; z++) strcat(body, "0");
            strcat(body, d);
            s = body;
            sn = strlen(body);
            break;
        }
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
            if (!jv_isnum(v)) FAIL("must be real number, not %s", jv_kind_name(v));
            double x = jv_num(v);
            char spec[64];
            snprintf(spec, sizeof spec, "%%%s%s%s%s%s.%lld%c", minus ? "-" : "", plus ? "+" : "", space ? " " : "",
                     alt ? "#" : "", zero && !isnan(x) && !isinf(x) ? "0" : "", prec < 0 ? 6 : prec > 200 ? 200 : prec, conv);
            if (isnan(x)) snprintf(num, sizeof num, "%s%s", plus ? "+" : space ? " " : "", conv >= 'a' ? "nan" : "NAN");
            else snprintf(num, sizeof num, spec, x); /* C's printf rounds as Python does */
            s = num;
            sn = strlen(num);
            if (width > 0 && zero && !minus && !isnan(x) && !isinf(x)) { /* C pads with the zeros itself */
                snprintf(spec, sizeof spec, "%%%s%s%s0%lld.%lld%c", plus ? "+" : "", space ? " " : "", alt ? "#" : "",
                         width > 400 ? 400 : width, prec < 0 ? 6 : prec > 200 ? 200 : prec, conv);
                snprintf(num, sizeof num, spec, x);
                sn = strlen(num);
            }
            break;
        }
        default: FAIL("unsupported format character '%c' (0x%x)", conv, (unsigned)(unsigned char)conv);
        }
        int rc = width > 0 ? pad(&o, s, sn, width, align, fill, sp) : sm_buf_add(&o, s, sn);
        sm_buf_free(&t);
        if (rc) FAIL("out of memory");
    }
    if (tuple ? argi < argc : (!mapping && argi == 0)) FAIL("not all arguments converted during string formatting");
#undef NEXT_ARG
#undef FAIL
    *out = jv_buf(c, &o);
    return out->k == JV_UNDEF ? -1 : 0;
}

/* ---- fmt.format(...) ---------------------------------------------------------------------------- */

typedef struct fspec {
    uint32_t fill;
    char align, sign, type, group;
    int alt, zero;
    long long width, prec;
} fspec;

static int parse_spec(const char *s, size_t n, fspec *sp) {
    memset(sp, 0, sizeof *sp);
    sp->fill = ' ';
    sp->width = sp->prec = -1;
    size_t i = 0, k = 0;
    uint32_t first = n ? ju_next(s, n, &k) : 0;
    if (k < n && strchr("<>=^", s[k])) { /* fill and align */
        sp->fill = first;
        sp->align = s[k];
        i = k + 1;
    } else if (n && strchr("<>=^", s[0])) sp->align = s[i++];
    if (i < n && strchr("+- ", s[i])) sp->sign = s[i++];
    if (i < n && s[i] == '#') { sp->alt = 1; i++; }
    if (i < n && s[i] == '0') { sp->zero = 1; i++; }
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        sp->width = (sp->width < 0 ? 0 : sp->width) * 10 + (s[i] - '0');
        if (sp->width > 100000) return -1;
    }
    if (i < n && (s[i] == ',' || s[i] == '_')) sp->group = s[i++];
    if (i < n && s[i] == '.') {
        sp->prec = 0;
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            sp->prec = sp->prec * 10 + (s[i] - '0');
            if (sp->prec > 200) return -1;
        }
    }
    if (i < n) sp->type = s[i++];
    return i == n ? 0 : -1;
}

/* v formatted with the spec sp into o (Python's format(v, spec)). */
static int format_one(jctx *c, const jnode *at, jv v, const char *spec, size_t sn, sm_buf *o) {
    fspec sp;
    if (parse_spec(spec, sn, &sp)) return jerr(c, at, "Invalid format specifier '%.*s'", (int)sn, spec);
    char num[700], t[800];
    if (!sn || (!jv_isnum(v) && !jv_is_str(v))) { /* an empty spec is str(); only numbers and strings take one */
        if (sn) return jerr(c, at, "unsupported format string passed to %s.__format__", jv_kind_name(v));
        return jv_tostr(c, v, o);
    }
    if (jv_is_str(v)) {
        if (sp.sign) return jerr(c, at, "Sign not allowed in string format specifier");
        if (sp.align == '=') return jerr(c, at, "'=' alignment not allowed in string format specifier");
        if (sp.type && sp.type != 's') return jerr(c, at, "Unknown format code '%c' for object of type 'str'", sp.type);
        const char *s = json_string_value(v.j);
        size_t n = json_string_length(v.j), k = 0;
        if (sp.prec >= 0) {
            for (long long q = 0; q < sp.prec && k < n; q++) ju_next(s, n, &k);
            n = k;
        }
        return pad(o, s, n, sp.width, sp.align ? sp.align : '<', sp.fill, 0) ? joom(c) : 0;
    }
    char align = sp.align ? sp.align : sp.zero ? '=' : '>';
    uint32_t fill = !sp.align && sp.zero ? '0' : sp.fill;
    int isint = jv_isint(v) && (!sp.type || strchr("bcdoxXn", sp.type));
    const char *sign = "";
    size_t pre = 0;
    if (isint) {
        long long x = jv_intv(v);
        if (sp.prec >= 0) return jerr(c, at, "Precision not allowed in integer format specifier");
        if (sp.type == 'c') {
            if (x < 0 || x > 0x10FFFF) return jerr(c, at, "%%c arg not in range(0x110000)");
            sm_buf b = {0};
            ju_put(&b, (uint32_t)x);
            snprintf(t, sizeof t, "%s", b.p);
            sm_buf_free(&b);
        } else {
            unsigned long long ax = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
            int base = sp.type == 'b' ? 2 : sp.type == 'o' ? 8 : sp.type == 'x' || sp.type == 'X' ? 16 : 10;
            digits(ax, base, sp.type == 'X', num);
            if (sp.group) group3(num, base == 10 ? sp.group : 0, num + 100), memmove(num, num + 100, strlen(num + 100) + 1);
            sign = x < 0 ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
            const char *px = !sp.alt ? "" : base == 2 ? "0b" : base == 8 ? "0o" : base == 16 ? (sp.type == 'X' ? "0X" : "0x") : "";
            snprintf(t, sizeof t, "%s%s%s", sign, px, num);
            pre = strlen(sign) + strlen(px);
        }
    } else {
        double x = jv_num(v);
        char type = sp.type;
        if (type && !strchr("eEfFgGn%", type)) return jerr(c, at, "Unknown format code '%c' for object of type 'float'", type);
        if (type == '%') x *= 100;
        sign = signbit(x) && !isnan(x) ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
        double ax = fabs(x);
        if (isnan(x) || isinf(x)) {
            snprintf(num, sizeof num, "%s", isnan(x) ? "nan" : "inf");
            if (type && type >= 'A' && type <= 'Z') for (char *q = num; *q; q++) *q = (char)(*q - 32);
            if (type == '%') strcat(num, "%");
        } else if (!type && sp.prec < 0) { /* repr() */
            jv_pyfloat(ax, num);
        } else if (!type || type == 'n' || type == 'g' || type == 'G') { /* general: fixed or scientific by the exponent */
            long long p = sp.prec < 0 ? 6 : sp.prec ? sp.prec : 1;
            char e[64];
            snprintf(e, sizeof e, "%.*e", (int)(p - 1), ax);
            int ex = atoi(strchr(e, 'e') + 1);
            long long lim = type ? p : p - 1; /* no type: scientific from the exponent p - 1 (Python's 'r' rule) */
            if (ex >= -4 && ex < lim) snprintf(num, sizeof num, "%.*f", (int)(p - 1 - ex), ax);
            else snprintf(num, sizeof num, "%s", e);
            if (!sp.alt) { /* trailing zeros of the fraction go */
                char *ep = strchr(num, 'e'), tail[16] = "";
                if (ep) { snprintf(tail, sizeof tail, "%s", ep); *ep = 0; }
                if (strchr(num, '.')) {
                    size_t L = strlen(num);
                    while (num[L - 1] == '0') num[--L] = 0;
                    if (num[L - 1] == '.') num[--L] = 0;
                }
                if (!type && !ep && !strchr(num, '.')) strcat(num, ".0"); /* no type: one digit past the point */
                strcat(num, tail);
            }
            if (type == 'G') for (char *q = num; *q; q++) if (*q == 'e') *q = 'E';
        } else {
            int p = sp.prec < 0 ? 6 : (int)sp.prec;
            char cv = type == '%' ? 'f' : type;
            char f[16];
            snprintf(f, sizeof f, "%%%s.%d%c", sp.alt ? "#" : "", p, cv);
            snprintf(num, sizeof num, f, ax);
            if (type == '%') strcat(num, "%");
        }
        if (sp.group && !isnan(x) && !isinf(x)) {
            char g[700];
            group3(num, sp.group, g);
            snprintf(num, sizeof num, "%s", g);
        }
        snprintf(t, sizeof t, "%s%s", sign, num);
        pre = strlen(sign);
    }
    return pad(o, t, strlen(t), sp.width, align, fill, pre) ? joom(c) : 0;
}

/* An argument's item or attribute for "{0[key]}" / "{0.name}": a dict's key, a list's index. */
static jv field_part(jv v, const char *k, size_t kn) {
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)kn, k);
    if (jv_has_attrs(v)) {
        json_t *x = json_object_get(v.j, key);
        return x ? (jv){JV_JSON, x, NULL, NULL} : JV_UNDEFINED;
    }
    if (jv_is_list(v) && kn && strspn(key, "0123456789") == kn) {
        json_t *x = json_array_get(v.j, (size_t)strtoull(key, NULL, 10));
        return x ? (jv){JV_JSON, x, NULL, NULL} : JV_UNDEFINED;
    }
    return JV_UNDEFINED;
}

int jv_format(jctx *c, const jnode *at, const char *f, size_t n, const jv *args, int nargs, char *const *kw,
              const jv *kwv, int nkw, jv *out) {
    sm_buf o = {0};
    int autonum = 0, manual = 0;
#define FAIL(...) do { sm_buf_free(&o); return jerr(c, at, __VA_ARGS__); } while (0)
    for (size_t i = 0; i < n;) {
        char ch = f[i];
        if (ch == '}') {
            if (i + 1 < n && f[i + 1] == '}') { if (sm_buf_add(&o, "}", 1)) FAIL("out of memory"); i += 2; continue; }
            FAIL("Single '}' encountered in format string");
        }
        if (ch != '{') {
            size_t e = i;
            while (e < n && f[e] != '{' && f[e] != '}') e++;
            if (sm_buf_add(&o, f + i, e - i)) FAIL("out of memory");
            i = e;
            continue;
        }
        if (i + 1 < n && f[i + 1] == '{') { if (sm_buf_add(&o, "{", 1)) FAIL("out of memory"); i += 2; continue; }
        size_t b = i + 1, e = b, br = 0;
        for (; e < n && (f[e] != '}' || br); e++) { /* the field ends at the first "}" outside [ ] */
            if (f[e] == '[') br = 1;
            else if (f[e] == ']') br = 0;
            else if (f[e] == '{' && !br) FAIL("nested replacement fields in a format spec are not supported");
        }
        if (e >= n) FAIL("expected '}' before end of string");
        i = e + 1;
        size_t ne = b; /* the field name ends at "!" or ":" outside [ ] */
        for (br = 0; ne < e && (br || (f[ne] != '!' && f[ne] != ':')); ne++) br = f[ne] == '[' ? 1 : f[ne] == ']' ? 0 : br;
        char conv = 0;
        size_t se = ne;
        if (ne < e && f[ne] == '!') {
            if (ne + 1 >= e) FAIL("end of string while looking for conversion specifier");
            conv = f[ne + 1];
            se = ne + 2;
            if (conv != 's' && conv != 'r') FAIL("Unknown conversion specifier %c", conv);
            if (se < e && f[se] != ':') FAIL("expected ':' after conversion specifier");
        }
        const char *spec = se < e ? f + se + 1 : "";
        size_t specn = se < e ? e - se - 1 : 0;
        size_t k = b; /* the first part: empty (the next), an index or a keyword */
        while (k < ne && f[k] != '.' && f[k] != '[') k++;
        jv v = JV_UNDEFINED;
        if (k == b) {
            if (manual) FAIL("cannot switch from manual field specification to automatic field numbering");
            autonum++;
            if (autonum > nargs) FAIL("Replacement index %d out of range for positional args tuple", autonum - 1);
            v = args[autonum - 1];
        } else if (strspn(f + b, "0123456789") >= k - b) {
            if (autonum) FAIL("cannot switch from automatic field numbering to manual field specification");
            manual = 1;
            long long ix = strtoll(f + b, NULL, 10);
            if (ix >= nargs) FAIL("Replacement index %lld out of range for positional args tuple", ix);
            v = args[ix];
        } else {
            int found = 0;
            for (int q = 0; q < nkw && !found; q++)
                if (strlen(kw[q]) == k - b && !memcmp(kw[q], f + b, k - b)) { v = kwv[q]; found = 1; }
            if (!found) FAIL("KeyError: '%.*s' (in format())", (int)(k - b), f + b);
        }
        while (k < ne) { /* .name and [key] */
            size_t s0 = k + 1, s1 = s0;
            if (f[k] == '.') while (s1 < ne && f[s1] != '.' && f[s1] != '[') s1++;
            else {
                while (s1 < ne && f[s1] != ']') s1++;
                if (s1 >= ne) FAIL("Missing ']' in format string");
            }
            v = field_part(v, f + s0, s1 - s0);
            k = f[k] == '.' ? s1 : s1 + 1;
        }
        if (conv == 'r') { /* repr first, then the spec on that string */
            sm_buf r = {0};
            if (jv_repr(c, v, &r)) { sm_buf_free(&r); sm_buf_free(&o); return -1; }
            v = jv_buf(c, &r);
            if (v.k == JV_UNDEF) { sm_buf_free(&o); return -1; }
        } else if (conv == 's' && jv_string(c, v, &v)) { sm_buf_free(&o); return -1; }
        if (format_one(c, at, v, spec, specn, &o)) { sm_buf_free(&o); return -1; }
    }
#undef FAIL
    *out = jv_buf(c, &o);
    return out->k == JV_UNDEF ? -1 : 0;
}
