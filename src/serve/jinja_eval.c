/* jinja_eval.c: renders the node tree (see jinja_int.h): statements write text to the
 * output, expressions evaluate to values with Jinja2's meaning (default Undefined: renders as
 * "", is false and iterates as empty; an attribute of it is an error).
 *
 * Scopes are a chain of frames: the template's globals (the caller's variables behind them),
 * a fresh frame for each loop iteration (a set inside a loop does not outlive the iteration,
 * as in Jinja2), a frame for each macro call whose parent is the globals.  We rejected one flat
 * dict of variables: Jinja2's loop scoping is what templates' namespace() idiom works around,
 * and a flat dict would render those templates differently.
 */
#include "serve/jinja_int.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64 /* macro calls nested (a recursive macro ends with an error, not a crash) */
#define MAX_ITERS 1000000LL           /* loop iterations of one render */
#define MAX_OUT ((size_t)64 << 20)    /* bytes one render may write */

static int ev(jctx *c, const jnode *n, jv *out);
static int run(jctx *c, const jnode *n);

static jv UNDEF = {JV_UNDEF, NULL, NULL};

static int frame_set(jframe *f, const char *name, jv v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) { f->vals[i] = v; return 0; }
    if (f->n == f->cap) {
        int nc = f->cap ? f->cap * 2 : 8;
        char **nn = realloc(f->names, sizeof *nn * (size_t)nc);
        if (!nn) return -1;
        f->names = nn;
        jv *nv = realloc(f->vals, sizeof *nv * (size_t)nc);
        if (!nv) return -1;
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = (char *)name; /* names live in the node tree */
    f->vals[f->n++] = v;
    return 0;
}

/* Release the values held since mark: nothing made in a loop iteration or a macro body is
 * referenced after it (a namespace holds its attributes by its own references). */
static void pool_release(jctx *c, int mark) {
    while (c->npool > mark) json_decref(c->pool[--c->npool]);
}

static void frame_free(jframe *f) {
    free(f->names);
    free(f->vals);
}

static jv lookup(jctx *c, const char *name) {
    for (jframe *f = c->f; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    return jv_borrow(c, json_object_get(c->vars, name));
}

/* obj.name or obj[key]: a dict's item, a list's or string's index; undefined when absent. */
static int getitem(jctx *c, const jnode *at, jv obj, jv key, int attr, jv *out) {
    *out = UNDEF;
    if (obj.k == JV_UNDEF) {
        if (key.k == JV_JSON && json_is_string(key.j))
            return jerr(c, at, "'%s' of an undefined value", json_string_value(key.j));
        return jerr(c, at, "subscript of an undefined value");
    }
    if (obj.k != JV_JSON && obj.k != JV_NS) return 0;
    json_t *o = obj.j;
    if (json_is_object(o)) {
        if (key.k == JV_JSON && json_is_string(key.j)) *out = jv_borrow(c, json_object_get(o, json_string_value(key.j)));
        return 0;
    }
    if (attr) return 0; /* lists and strings have no data attributes */
    if (!jv_isint(key)) return 0;
    long long i = jv_intv(key);
    if (json_is_array(o)) {
        long long n = (long long)json_array_size(o);
        if (i < 0) i += n;
        if (i >= 0 && i < n) *out = jv_borrow(c, json_array_get(o, (size_t)i));
    } else if (json_is_string(o)) {
        size_t *offs, cnt;
        if (jv_utf8_index(json_string_value(o), json_string_length(o), &offs, &cnt)) return jerr(c, at, "out of memory");
        if (i < 0) i += (long long)cnt;
        if (i >= 0 && i < (long long)cnt) *out = jv_str(c, json_string_value(o) + offs[i], offs[i + 1] - offs[i]);
        free(offs);
    }
    return 0;
}

/* Python's slice indices for length n. */
static void slice_idx(long long n, const jv *p, int has[3], long long *st, long long *sp, long long *step) {
    *step = has[2] ? jv_intv(p[2]) : 1;
    long long lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    for (int k = 0; k < 2; k++) {
        long long *d = k ? sp : st;
        if (!has[k]) { *d = (*step < 0) == (k == 0) ? hi : lo; continue; }
        long long x = jv_intv(p[k]);
        if (x < 0) { x += n; if (x < lo) x = lo; }
        else if (x > hi) x = hi;
        *d = x;
    }
}

static int eval_slice(jctx *c, const jnode *n, jv *out) {
    jv obj, p[3];
    int has[3] = {0};
    const jnode *pn[3] = {n->b, n->c, n->d};
    if (ev(c, n->a, &obj)) return -1;
    for (int k = 0; k < 3; k++) {
        if (!pn[k]) continue;
        if (ev(c, pn[k], &p[k])) return -1;
        if (p[k].k == JV_JSON && json_is_null(p[k].j)) continue;
        if (!jv_isint(p[k])) return jerr(c, pn[k], "slice indices must be integers");
        has[k] = 1;
    }
    if (has[2] && jv_intv(p[2]) == 0) return jerr(c, n, "slice step cannot be zero");
    if (obj.k != JV_JSON || !(json_is_array(obj.j) || json_is_string(obj.j))) return jerr(c, n, "only lists and strings can be sliced");
    long long st, sp, step;
    if (json_is_array(obj.j)) {
        slice_idx((long long)json_array_size(obj.j), p, has, &st, &sp, &step);
        json_t *r = json_array();
        for (long long i = st; step > 0 ? i < sp : i > sp; i += step) json_array_append(r, json_array_get(obj.j, (size_t)i));
        *out = jv_own(c, r);
    } else {
        size_t *offs, cnt;
        const char *s = json_string_value(obj.j);
        if (jv_utf8_index(s, json_string_length(obj.j), &offs, &cnt)) return jerr(c, n, "out of memory");
        slice_idx((long long)cnt, p, has, &st, &sp, &step);
        sm_sbuf b = {0};
        for (long long i = st; step > 0 ? i < sp : i > sp; i += step) sm_sbuf_add(&b, s + offs[i], offs[i + 1] - offs[i]);
        *out = jv_str(c, b.p, b.n);
        sm_sbuf_free(&b);
        free(offs);
    }
    return out->k == JV_UNDEF ? -1 : 0;
}

/* Arguments of a call, filter or test node into args [n->nk]. */
static int eval_args(jctx *c, const jnode *n, jv *args) {
    for (int i = 0; i < n->nk; i++)
        if (ev(c, n->kids[i], &args[i])) return -1;
    return 0;
}

static int call_macro(jctx *c, const jnode *at, const jnode *m, jv *args, int nargs, char **kw, jv *out) {
    if (c->depth >= MAX_DEPTH) return jerr(c, at, "macro calls nested deeper than %d", MAX_DEPTH);
    jframe f = {0};
    f.up = c->globals;
    int rc = -1, npos = 0;
    for (int i = 0; i < nargs; i++) npos += !(kw && kw[i]);
    if (npos > m->nk) { jerr(c, at, "macro '%s' takes %d arguments, %d given", m->s, m->nk, npos); goto out; }
    jframe *saved = c->f;
    c->f = &f;
    for (int p = 0; p < m->nk; p++) {
        const char *pn = m->kids[p]->s;
        jv v = UNDEF;
        int got = 0;
        if (p < npos) { v = args[p]; got = 1; } /* positional arguments come first */
        for (int i = npos; i < nargs; i++)
            if (kw && kw[i] && !strcmp(kw[i], pn)) { v = args[i]; got = 1; }
        if (!got && m->kids[p]->a && ev(c, m->kids[p]->a, &v)) { c->f = saved; goto out; }
        if (frame_set(&f, pn, v)) { c->f = saved; jerr(c, at, "out of memory"); goto out; }
    }
    for (int i = npos; i < nargs; i++) {
        int known = 0;
        for (int p = 0; p < m->nk; p++) known |= !strcmp(kw[i], m->kids[p]->s);
        if (!known) { c->f = saved; jerr(c, at, "macro '%s' has no parameter '%s'", m->s, kw[i]); goto out; }
    }
    sm_sbuf body = {0}, *so = c->out;
    c->out = &body;
    c->depth++;
    int mark = c->npool;
    rc = run(c, m->b);
    pool_release(c, mark); /* the body's values; the result is a copy of its text */
    c->depth--;
    c->out = so;
    c->f = saved;
    if (!rc) {
        *out = jv_str(c, body.p, body.n);
        if (out->k == JV_UNDEF) rc = -1;
    }
    sm_sbuf_free(&body);
out:
    frame_free(&f);
    return rc;
}

static int eval_call(jctx *c, const jnode *n, jv *out) {
    jv args[32];
    if (n->nk > 32) return jerr(c, n, "more than 32 arguments");
    const jnode *f = n->a;
    jv self;
    if (f->kind == JN_ATTR && ev(c, f->a, &self)) return -1;
    if (eval_args(c, n, args)) return -1;
    if (f->kind == JN_ATTR) return jb_method(c, n, self, f->s, args, n->nk, n->kw, out);
    jv callee = lookup(c, f->s);
    if (callee.k == JV_MACRO) return call_macro(c, n, callee.mac, args, n->nk, n->kw, out);
    if (sm_jinja_known_function(f->s)) return jb_function(c, n, f->s, args, n->nk, n->kw, out);
    return jerr(c, n, "'%s' is not callable", f->s);
}

/* Arithmetic and comparison operators. */
int jb_binop(jctx *c, const jnode *n, jv a, jv b, jv *out) {
    const char *op = n->s;
    if (!strcmp(op, "~")) {
        sm_sbuf s = {0};
        int rc = jv_tostr(c, a, &s) || jv_tostr(c, b, &s);
        *out = rc ? UNDEF : jv_str(c, s.p, s.n);
        sm_sbuf_free(&s);
        return rc || out->k == JV_UNDEF ? jerr(c, n, "out of memory") : 0;
    }
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        *out = jv_bool(c, jv_equal(a, b) == (op[0] == '='));
        return 0;
    }
    if (!strcmp(op, "in") || !strcmp(op, "not in")) {
        int in = 0;
        if (b.k == JV_JSON && json_is_string(b.j)) {
            if (a.k != JV_JSON || !json_is_string(a.j)) return jerr(c, n, "'in <string>' requires a string on the left");
            const char *h = json_string_value(b.j), *nd = json_string_value(a.j);
            size_t hn = json_string_length(b.j), nn = json_string_length(a.j);
            for (size_t i = 0; i + nn <= hn && !in; i++) in = !memcmp(h + i, nd, nn);
        } else if (b.k == JV_JSON && json_is_array(b.j)) {
            for (size_t i = 0; i < json_array_size(b.j) && !in; i++) in = jv_equal(a, (jv){JV_JSON, json_array_get(b.j, i), NULL});
        } else if ((b.k == JV_JSON || b.k == JV_NS) && json_is_object(b.j)) {
            in = a.k == JV_JSON && json_is_string(a.j) && json_object_get(b.j, json_string_value(a.j));
        } else if (b.k != JV_UNDEF) return jerr(c, n, "'in' needs a string, list or dict on the right");
        *out = jv_bool(c, in == (op[0] == 'i'));
        return 0;
    }
    int cmp = !strcmp(op, "<") || !strcmp(op, ">") || !strcmp(op, "<=") || !strcmp(op, ">=");
    if (cmp) {
        double d;
        if (jv_isint(a) && jv_isint(b)) d = (double)((jv_intv(a) > jv_intv(b)) - (jv_intv(a) < jv_intv(b)));
        else if (jv_isnum(a) && jv_isnum(b)) d = jv_num(a) - jv_num(b);
        else if (a.k == JV_JSON && b.k == JV_JSON && json_is_string(a.j) && json_is_string(b.j)) {
            size_t an = json_string_length(a.j), bn = json_string_length(b.j);
            int r = memcmp(json_string_value(a.j), json_string_value(b.j), an < bn ? an : bn);
            d = r ? r : (double)an - (double)bn;
        } else return jerr(c, n, "'%s' is not supported between these values", op);
        int r = op[0] == '<' ? (op[1] ? d <= 0 : d < 0) : (op[1] ? d >= 0 : d > 0);
        *out = jv_bool(c, r);
        return 0;
    }
    if (a.k == JV_UNDEF || b.k == JV_UNDEF) return jerr(c, n, "'%s' with an undefined value", op);
    if (!strcmp(op, "+") && a.k == JV_JSON && b.k == JV_JSON) {
        if (json_is_string(a.j) && json_is_string(b.j)) {
            sm_sbuf s = {0};
            int rc = sm_sbuf_add(&s, json_string_value(a.j), json_string_length(a.j)) ||
                     sm_sbuf_add(&s, json_string_value(b.j), json_string_length(b.j));
            *out = rc ? UNDEF : jv_str(c, s.p, s.n);
            sm_sbuf_free(&s);
            return out->k == JV_UNDEF ? jerr(c, n, "out of memory") : 0;
        }
        if (json_is_array(a.j) && json_is_array(b.j)) {
            json_t *r = json_copy(a.j);
            if (r) json_array_extend(r, b.j);
            *out = jv_own(c, r);
            return out->k == JV_UNDEF ? -1 : 0;
        }
    }
    if (!strcmp(op, "*") && a.k == JV_JSON && json_is_string(a.j) && jv_isint(b)) {
        if (jv_intv(b) > 0 && (double)json_string_length(a.j) * (double)jv_intv(b) > (double)MAX_OUT)
            return jerr(c, n, "a string repeated beyond %zu bytes", MAX_OUT);
        sm_sbuf s = {0};
        for (long long i = 0; i < jv_intv(b); i++) sm_sbuf_add(&s, json_string_value(a.j), json_string_length(a.j));
        *out = jv_str(c, s.p, s.n);
        sm_sbuf_free(&s);
        return out->k == JV_UNDEF ? -1 : 0;
    }
    if (!jv_isnum(a) || !jv_isnum(b)) return jerr(c, n, "unsupported operand types for '%s'", op);
    int ints = jv_isint(a) && jv_isint(b);
    long long x = ints ? jv_intv(a) : 0, y = ints ? jv_intv(b) : 0;
    double p = jv_num(a), q = jv_num(b);
    if ((!strcmp(op, "/") || !strcmp(op, "//") || !strcmp(op, "%")) && q == 0) return jerr(c, n, "division by zero");
    switch (op[0]) {
    case '+': *out = ints ? jv_int(c, x + y) : jv_real(c, p + q); break;
    case '-': *out = ints ? jv_int(c, x - y) : jv_real(c, p - q); break;
    case '*':
        if (op[1]) { /* ** */
            if (ints && y >= 0) { long long r = 1; for (long long k = 0; k < y && k < 64; k++) r *= x; *out = jv_int(c, r); }
            else *out = jv_real(c, pow(p, q));
        } else *out = ints ? jv_int(c, x * y) : jv_real(c, p * q);
        break;
    case '/':
        if (op[1]) *out = ints ? jv_int(c, x / y - ((x % y != 0) && ((x < 0) != (y < 0)))) : jv_real(c, floor(p / q));
        else *out = jv_real(c, p / q);
        break;
    case '%':
        if (ints) { long long r = x % y; if (r && ((r < 0) != (y < 0))) r += y; *out = jv_int(c, r); }
        else { double r = fmod(p, q); if (r && ((r < 0) != (q < 0))) r += q; *out = jv_real(c, r); }
        break;
    default: return jerr(c, n, "unsupported operator '%s'", op);
    }
    return out->k == JV_UNDEF ? -1 : 0;
}

static int ev(jctx *c, const jnode *n, jv *out) {
    jv a, b;
    *out = UNDEF;
    switch (n->kind) {
    case JN_STR: *out = jv_str(c, n->s, n->n); break;
    case JN_INT: *out = jv_int(c, n->i); break;
    case JN_FLOAT: *out = jv_real(c, n->f); break;
    case JN_BOOL: *out = jv_bool(c, (int)n->i); break;
    case JN_NONE: *out = jv_none(c); break;
    case JN_NAME: *out = lookup(c, n->s); return 0;
    case JN_ATTR:
        if (ev(c, n->a, &a)) return -1;
        if (a.k == JV_UNDEF && n->a->kind == JN_NAME) return jerr(c, n, "'%s' is undefined", n->a->s);
        if (a.k == JV_UNDEF) return jerr(c, n, "attribute '%s' of an undefined value", n->s);
        return getitem(c, n, a, jv_str(c, n->s, n->n), 1, out);
    case JN_ITEM:
        if (ev(c, n->a, &a) || ev(c, n->b, &b)) return -1;
        return getitem(c, n, a, b, 0, out);
    case JN_SLICE: return eval_slice(c, n, out);
    case JN_CALL: return eval_call(c, n, out);
    case JN_FILTER: {
        jv args[32];
        if (n->nk > 32) return jerr(c, n, "more than 32 arguments");
        if (ev(c, n->a, &a) || eval_args(c, n, args)) return -1;
        return jb_filter(c, n, a, args, n->nk, n->kw, out);
    }
    case JN_TEST: {
        jv args[32];
        int r;
        if (n->nk > 32) return jerr(c, n, "more than 32 arguments");
        if (ev(c, n->a, &a)) return -1; /* as in Jinja2, "x.y is defined" with x undefined is an error */
        if (eval_args(c, n, args) || jb_test(c, n, a, args, n->nk, &r)) return -1;
        *out = jv_bool(c, r != (int)n->i);
        break;
    }
    case JN_BIN:
        if (ev(c, n->a, &a) || ev(c, n->b, &b)) return -1;
        return jb_binop(c, n, a, b, out);
    case JN_NOT:
        if (ev(c, n->a, &a)) return -1;
        *out = jv_bool(c, !jv_truthy(a));
        break;
    case JN_NEG:
        if (ev(c, n->a, &a)) return -1;
        if (!jv_isnum(a)) return jerr(c, n, "unary '-' of a non-number");
        *out = jv_isint(a) ? jv_int(c, -jv_intv(a)) : jv_real(c, -jv_num(a));
        break;
    case JN_AND: /* Python's and / or return an operand */
        if (ev(c, n->a, &a)) return -1;
        if (!jv_truthy(a)) { *out = a; return 0; }
        return ev(c, n->b, out);
    case JN_OR:
        if (ev(c, n->a, &a)) return -1;
        if (jv_truthy(a)) { *out = a; return 0; }
        return ev(c, n->b, out);
    case JN_COND:
        if (ev(c, n->a, &a)) return -1;
        if (jv_truthy(a)) return ev(c, n->b, out);
        return n->c ? ev(c, n->c, out) : 0;
    case JN_LIST: {
        json_t *l = json_array();
        *out = jv_own(c, l);
        if (out->k == JV_UNDEF) return -1;
        for (int i = 0; i < n->nk; i++) {
            if (ev(c, n->kids[i], &a)) return -1;
            if (a.k != JV_JSON) return jerr(c, n->kids[i], "a list can hold only data values (not undefined, a namespace or a macro)");
            json_array_append(l, a.j);
        }
        return 0;
    }
    case JN_DICT: {
        json_t *d = json_object();
        *out = jv_own(c, d);
        if (out->k == JV_UNDEF) return -1;
        for (int i = 0; i + 1 < n->nk; i += 2) {
            if (ev(c, n->kids[i], &a) || ev(c, n->kids[i + 1], &b)) return -1;
            if (a.k != JV_JSON || !json_is_string(a.j)) return jerr(c, n->kids[i], "dict keys must be strings");
            if (b.k != JV_JSON) return jerr(c, n->kids[i + 1], "a dict can hold only data values");
            json_object_set(d, json_string_value(a.j), b.j);
        }
        return 0;
    }
    default: return jerr(c, n, "not an expression");
    }
    return out->k == JV_UNDEF ? -1 : 0;
}

/* ---- statements ------------------------------------------------------------------------- */

/* Bind target node t (a name or ns.attr) to v in the current frame. */
static int assign(jctx *c, const jnode *t, jv v) {
    if (t->kind == JN_NAME) return frame_set(c->f, t->s, v) ? jerr(c, t, "out of memory") : 0;
    jv ns = lookup(c, t->a->s);
    if (ns.k != JV_NS) return jerr(c, t, "cannot set '%s' on '%s': only a namespace() takes attributes", t->s, t->a->s);
    if (v.k != JV_JSON) return jerr(c, t, "a namespace attribute can hold only data values");
    return json_object_set(ns.j, t->s, v.j) ? jerr(c, t, "out of memory") : 0;
}

/* Unpack v over the targets of n (one target: v itself). */
static int bind_targets(jctx *c, const jnode *n, jv v) {
    if (n->nk == 1) return assign(c, n->kids[0], v);
    if (v.k != JV_JSON || !json_is_array(v.j) || json_array_size(v.j) != (size_t)n->nk)
        return jerr(c, n, "cannot unpack the value into %d variables", n->nk);
    for (int i = 0; i < n->nk; i++)
        if (assign(c, n->kids[i], jv_borrow(c, json_array_get(v.j, (size_t)i)))) return -1;
    return 0;
}

/* The items a for loop walks: a list's items, a dict's keys, a string's characters. */
static int iter_items(jctx *c, const jnode *at, jv v, json_t **items) {
    *items = NULL;
    if (v.k == JV_UNDEF) { *items = json_array(); }
    else if (v.k != JV_JSON) return jerr(c, at, "this value cannot be iterated");
    else if (json_is_array(v.j)) *items = json_incref(v.j);
    else if (json_is_object(v.j)) {
        *items = json_array();
        const char *k;
        json_t *x;
        json_object_foreach(v.j, k, x) json_array_append_new(*items, json_string(k));
    } else if (json_is_string(v.j)) {
        *items = jv_chars(json_string_value(v.j), json_string_length(v.j));
    } else return jerr(c, at, "this value cannot be iterated");
    return jv_own(c, *items).k == JV_UNDEF ? -1 : 0;
}

static int run_for(jctx *c, const jnode *n) {
    jv it;
    json_t *all;
    if (ev(c, n->a, &it) || iter_items(c, n->a, it, &all)) return -1;
    json_t *items = all;
    if (n->d) { /* for x in y if cond: the filter runs first, loop counts the kept items */
        items = json_array();
        if (jv_own(c, items).k == JV_UNDEF) return -1;
        int fmark = c->npool;
        for (size_t i = 0; i < json_array_size(all); i++) {
            jframe f = {0};
            f.up = c->f;
            c->f = &f;
            jv keep;
            int rc = bind_targets(c, n, jv_borrow(c, json_array_get(all, i))) || ev(c, n->d, &keep);
            c->f = f.up;
            frame_free(&f);
            if (rc) return -1;
            if (jv_truthy(keep)) json_array_append(items, json_array_get(all, i));
            pool_release(c, fmark);
        }
    }
    size_t len = json_array_size(items);
    if (!len) return run(c, n->c);
    int mark = c->npool; /* each iteration's values are released at its end */
    for (size_t i = 0; i < len; i++) {
        json_t *loop = json_pack("{sIsIsIsIsbsbsI}", "index", (json_int_t)i + 1, "index0", (json_int_t)i, "revindex",
                                 (json_int_t)(len - i), "revindex0", (json_int_t)(len - i - 1), "first", i == 0, "last",
                                 i + 1 == len, "length", (json_int_t)len);
        if (loop && i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
        if (loop && i + 1 < len) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
        jv lv = jv_own(c, loop);
        if (lv.k == JV_UNDEF) return -1;
        if (++c->iters > MAX_ITERS) return jerr(c, n, "the template ran more than %lld loop iterations", MAX_ITERS);
        jframe f = {0};
        f.up = c->f;
        c->f = &f;
        int rc = frame_set(&f, "loop", lv) ? jerr(c, n, "out of memory") : 0;
        if (!rc) rc = bind_targets(c, n, jv_borrow(c, json_array_get(items, i)));
        if (!rc) rc = run(c, n->b);
        c->f = f.up;
        frame_free(&f);
        pool_release(c, mark);
        if (rc) return -1;
        if (c->ctl == 1) { c->ctl = 0; break; }
        c->ctl = 0;
    }
    return 0;
}

static int run(jctx *c, const jnode *n) {
    for (; n && !c->ctl; n = n->next) {
        jv v;
        if (c->out->n > MAX_OUT) return jerr(c, n, "the template wrote more than %zu bytes", MAX_OUT);
        switch (n->kind) {
        case JN_TEXT:
            if (sm_sbuf_add(c->out, n->s, n->n)) return jerr(c, n, "out of memory");
            break;
        case JN_OUT:
            if (ev(c, n->a, &v) || jv_tostr(c, v, c->out)) return jerr(c, n, "out of memory");
            break;
        case JN_IF:
            if (ev(c, n->a, &v)) return -1;
            if (run(c, jv_truthy(v) ? n->b : n->c)) return -1;
            break;
        case JN_FOR:
            if (run_for(c, n)) return -1;
            break;
        case JN_SET:
            if (n->i) { /* {% set x %}body{% endset %} */
                sm_sbuf body = {0}, *so = c->out;
                c->out = &body;
                int rc = run(c, n->b);
                c->out = so;
                v = rc ? UNDEF : jv_str(c, body.p, body.n);
                sm_sbuf_free(&body);
                if (rc || v.k == JV_UNDEF) return -1;
            } else if (ev(c, n->a, &v)) return -1;
            if (bind_targets(c, n, v)) return -1;
            break;
        case JN_MACRO:
            if (frame_set(c->f, n->s, (jv){JV_MACRO, NULL, n})) return jerr(c, n, "out of memory");
            break;
        case JN_BREAK: c->ctl = 1; break;
        case JN_CONTINUE: c->ctl = 2; break;
        default: return jerr(c, n, "not a statement");
        }
    }
    return 0;
}

int sm_jinja_render(const sm_jinja *t, json_t *vars, sm_sbuf *out, int *raised, sm_err *e) {
    jctx c = {0};
    jframe g = {0};
    c.f = c.globals = &g;
    c.vars = vars;
    c.out = out;
    c.e = e;
    e->msg[0] = 0;
    /* macros are callable before their definition's place in the text, as in Jinja2's module */
    for (const jnode *n = t->root; n; n = n->next)
        if (n->kind == JN_MACRO) frame_set(&g, n->s, (jv){JV_MACRO, NULL, n});
    int rc = run(&c, t->root);
    if (rc && !e->msg[0]) sm_errf(e, "template error");
    *raised = c.raised;
    for (int i = 0; i < c.npool; i++) json_decref(c.pool[i]);
    free(c.pool);
    frame_free(&g);
    return rc;
}
