/* jinja_eval.c: renders the node tree (see jinja_int.h): statements write text to the
 * output, expressions evaluate to values with Jinja2's meaning (default Undefined: renders as
 * "", is false and iterates as empty; an attribute of it is an error).  Filters, tests,
 * methods and global functions are rows of the built-in table (jinja_call.h): this file binds
 * a call's arguments and runs the row, and knows nothing of what any built-in does.
 *
 * Scopes are a chain of frames: the template's globals (the caller's variables behind them,
 * then the environment's functions: range, namespace, dict, raise_exception, strftime_now), a
 * fresh frame for each loop iteration (a set inside a loop does not outlive the iteration, as
 * in Jinja2), a frame for each macro call whose parent is the scope the macro was defined in (a
 * closure, as Jinja2's macros are), a frame for a with, filter or generation block.  We rejected one flat dict of variables: Jinja2's loop scoping is what
 * templates' namespace() idiom works around, and a flat dict would render those templates
 * differently.
 */
#include "jinja/jinja_call.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64        /* macro calls nested (a recursive macro ends with an error, not a crash) */
#define MAX_ITERS 1000000LL /* loop iterations of one render */
#define MAX_ARGS 32         /* arguments of one call */

static int ev(jctx *c, const jnode *n, jv *out);
static int run(jctx *c, const jnode *n);

static int frame_set(jframe *f, const char *name, jv v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) { f->vals[i] = v; return 0; }
    if (f->n == f->cap) {
        int nc = f->cap ? f->cap * 2 : 8;
        const char **nn = realloc(f->names, sizeof *nn * (size_t)nc);
        if (!nn) return -1;
        f->names = nn;
        jv *nv = realloc(f->vals, sizeof *nv * (size_t)nc);
        if (!nv) return -1;
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = name; /* names live in the node tree */
    f->vals[f->n++] = v;
    return 0;
}

static void frame_free(jframe *f) {
    free(f->names);
    free(f->vals);
}

/* Release the values held since mark: nothing made in a loop iteration or a macro body is
 * referenced after it (a namespace holds its attributes by its own references). */
static void pool_release(jctx *c, int mark) {
    while (c->npool > mark) json_decref(c->pool[--c->npool]);
}

static jv lookup(jctx *c, const char *name) {
    for (jframe *f = c->f; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    json_t *x = json_object_get(c->vars, name);
    if (x) return jv_borrow(c, x);
    const jbuiltin *b = jb_find(JB_FUNCTION, name); /* the environment's globals */
    if (b) return (jv){JV_FUNC, NULL, b, NULL};
    return JV_UNDEFINED;
}

/* Python's slice indices for length n. */
static void slice_idx(long long n, const jv *p, const int has[3], long long *st, long long *sp, long long *step) {
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
        if (!jv_isint(p[k])) return jerr(c, pn[k], "slice indices must be integers or None");
        has[k] = 1;
    }
    if (has[2] && jv_intv(p[2]) == 0) return jerr(c, n, "slice step cannot be zero");
    if (!jv_is_list(obj) && !jv_is_str(obj)) return jerr(c, n, "'%s' object is not subscriptable (a slice)", jv_kind_name(obj));
    long long st, sp, step;
    if (jv_is_list(obj)) {
        slice_idx((long long)json_array_size(obj.j), p, has, &st, &sp, &step);
        json_t *r = json_array();
        for (long long i = st; r && (step > 0 ? i < sp : i > sp); i += step)
            if (json_array_append(r, json_array_get(obj.j, (size_t)i))) { json_decref(r); r = NULL; }
        *out = jv_is_tuple(c, obj.j) ? jv_tuple(c, r) : jv_own(c, r);
    } else {
        size_t *offs, cnt;
        const char *s = json_string_value(obj.j);
        if (ju_offsets(s, json_string_length(obj.j), &offs, &cnt)) return joom(c);
        slice_idx((long long)cnt, p, has, &st, &sp, &step);
        sm_buf b = {0};
        int rc = 0;
        for (long long i = st; !rc && (step > 0 ? i < sp : i > sp); i += step) rc = sm_buf_add(&b, s + offs[i], offs[i + 1] - offs[i]);
        free(offs);
        if (rc) { sm_buf_free(&b); return joom(c); }
        *out = jv_buf(c, &b);
    }
    return out->k == JV_UNDEF ? -1 : 0;
}

/* Arguments of a call, filter or test node into args [n->nk]. */
static int eval_args(jctx *c, const jnode *n, jv *args) {
    if (n->nk > MAX_ARGS) return jerr(c, n, "more than %d arguments", MAX_ARGS);
    for (int i = 0; i < n->nk; i++)
        if (ev(c, n->kids[i], &args[i])) return -1;
    return 0;
}

static int call_macro(jctx *c, const jnode *at, jv mv, jv *args, int nargs, char **kw, jv *out) {
    const jnode *m = mv.p;
    if (c->depth >= MAX_DEPTH) return jerr(c, at, "macro calls nested deeper than %d", MAX_DEPTH);
    jframe f = {0};
    f.up = mv.scope; /* a closure: the names of the scope it was defined in */
    int rc = -1, npos = 0;
    for (int i = 0; i < nargs; i++) npos += !(kw && kw[i]);
    if (npos > m->nk) { jerr(c, at, "macro '%s' takes not more than %d argument(s)", m->s, m->nk); goto out; }
    jframe *saved = c->f;
    c->f = &f;
    for (int p = 0; p < m->nk; p++) {
        const char *pn = m->kids[p]->s;
        jv v = JV_UNDEFINED;
        int got = 0;
        if (p < npos) { v = args[p]; got = 1; } /* positional arguments come first */
        for (int i = 0; i < nargs; i++)
            if (kw && kw[i] && !strcmp(kw[i], pn)) { v = args[i]; got = 1; }
        if (!got && m->kids[p]->a && ev(c, m->kids[p]->a, &v)) { c->f = saved; goto out; }
        if (frame_set(&f, pn, v)) { c->f = saved; joom(c); goto out; }
    }
    for (int i = 0; i < nargs; i++) {
        if (!kw || !kw[i]) continue;
        int known = 0;
        for (int p = 0; p < m->nk; p++) known |= !strcmp(kw[i], m->kids[p]->s);
        if (!known) { c->f = saved; jerr(c, at, "macro '%s' has no parameter '%s'", m->s, kw[i]); goto out; }
    }
    sm_buf body = {0}, *so = c->out;
    c->out = &body;
    c->depth++;
    int mark = c->npool;
    rc = run(c, m->b);
    pool_release(c, mark); /* the body's values; the result is a copy of its text */
    c->depth--;
    c->out = so;
    c->f = saved;
    if (!rc) {
        *out = jv_buf(c, &body);
        if (out->k == JV_UNDEF) rc = -1;
    }
    sm_buf_free(&body);
out:
    frame_free(&f);
    return rc;
}

static int eval_call(jctx *c, const jnode *n, jv *out) {
    jv args[MAX_ARGS];
    const jnode *f = n->a;
    jv self;
    if (f->kind == JN_ATTR) { /* a method: str, list, dict or loop */
        if (ev(c, f->a, &self)) return -1;
        if (self.k == JV_JSON) self = jv_elem(c, self.j);
        if (self.k == JV_UNDEF) {
            if (f->a->kind == JN_NAME) return jerr(c, n, "'%s' is undefined", f->a->s);
            return jerr(c, n, "'%s()' of an undefined value", f->s);
        }
        const jbuiltin *m = jb_method(self, f->s);
        if (!m) return jerr(c, n, "'%s' object has no method '%s()' here", jv_kind_name(self), f->s);
        if (eval_args(c, n, args)) return -1;
        return jb_call(c, n, m, self, args, n->kw, n->nk, out);
    }
    jv callee = lookup(c, f->s);
    if (callee.k == JV_UNDEF) return jerr(c, n, "'%s' is undefined", f->s);
    if (callee.k != JV_MACRO && callee.k != JV_FUNC) return jerr(c, n, "'%s' object is not callable", jv_kind_name(callee));
    if (eval_args(c, n, args)) return -1;
    if (callee.k == JV_MACRO) return call_macro(c, n, callee, args, n->nk, n->kw, out);
    return jb_call(c, n, callee.p, JV_UNDEFINED, args, n->kw, n->nk, out);
}

static int ev(jctx *c, const jnode *n, jv *out) {
    jv a, b, args[MAX_ARGS];
    *out = JV_UNDEFINED;
    switch (n->kind) {
    case JN_STR: *out = jv_str(c, n->s, n->n); break;
    case JN_INT: *out = jv_int(c, n->i); break;
    case JN_FLOAT: *out = jv_real(c, n->f); break;
    case JN_BOOL: *out = jv_bool(c, (int)n->i); break;
    case JN_NONE: *out = jv_none(c); break;
    case JN_BODY: *out = c->body; return 0;
    case JN_NAME: *out = lookup(c, n->s); return 0;
    case JN_ATTR:
        if (ev(c, n->a, &a)) return -1;
        if (a.k == JV_JSON) a = jv_elem(c, a.j);
        if (a.k == JV_UNDEF && n->a->kind == JN_NAME) return jerr(c, n, "'%s' is undefined", n->a->s);
        if (a.k == JV_UNDEF) return jerr(c, n, "attribute '%s' of an undefined value", n->s);
        b = jv_str(c, n->s, n->n);
        return b.k == JV_UNDEF ? -1 : jb_getattr(c, n, a, b, 1, out);
    case JN_ITEM:
        if (ev(c, n->a, &a) || ev(c, n->b, &b)) return -1;
        return jb_getattr(c, n, a, b, 0, out);
    case JN_SLICE: return eval_slice(c, n, out);
    case JN_CALL: return eval_call(c, n, out);
    case JN_FILTER:
        if (ev(c, n->a, &a) || eval_args(c, n, args)) return -1;
        return jb_call(c, n, n->fn, a, args, n->kw, n->nk, out);
    case JN_TEST:
        if (ev(c, n->a, &a)) return -1; /* as in Jinja2, "x.y is defined" with x undefined is an error */
        if (a.k == JV_JSON) a = jv_elem(c, a.j);
        if (eval_args(c, n, args) || jb_call(c, n, n->fn, a, args, n->kw, n->nk, &b)) return -1;
        *out = jv_bool(c, jv_truthy(b) != (int)n->i);
        break;
    case JN_BIN:
        if (ev(c, n->a, &a) || ev(c, n->b, &b)) return -1;
        if (a.k == JV_JSON) a = jv_elem(c, a.j);
        if (b.k == JV_JSON) b = jv_elem(c, b.j);
        return jv_binop(c, n, n->s, a, b, out);
    case JN_NOT:
        if (ev(c, n->a, &a)) return -1;
        *out = jv_bool(c, !jv_truthy(a));
        break;
    case JN_NEG:
        if (ev(c, n->a, &a)) return -1;
        if (!jv_isnum(a)) return jerr(c, n, "bad operand type for unary -: '%s'", jv_kind_name(a));
        if (!jv_isint(a)) *out = jv_real(c, -jv_num(a));
        else if (jv_intv(a) == INT64_MIN) return jerr(c, n, "integer overflow in unary '-': the result does not fit in 64 bits");
        else *out = jv_int(c, -jv_intv(a));
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
    case JN_LIST: case JN_TUPLE: {
        json_t *l = json_array();
        *out = n->kind == JN_TUPLE ? jv_tuple(c, l) : jv_own(c, l);
        if (out->k == JV_UNDEF) return -1;
        for (int i = 0; i < n->nk; i++) {
            json_t *x;
            if (ev(c, n->kids[i], &a) || !(x = jv_json(c, n->kids[i], a))) return -1;
            if (json_array_append(l, x)) return joom(c);
        }
        return 0;
    }
    case JN_DICT: {
        json_t *d = json_object();
        *out = jv_own(c, d);
        if (out->k == JV_UNDEF) return -1;
        for (int i = 0; i + 1 < n->nk; i += 2) {
            json_t *x;
            if (ev(c, n->kids[i], &a) || ev(c, n->kids[i + 1], &b)) return -1;
            if (!jv_is_str(a)) return jerr(c, n->kids[i], "dict keys must be strings here, not %s", jv_kind_name(a));
            if (!(x = jv_json(c, n->kids[i + 1], b))) return -1;
            if (json_object_set(d, json_string_value(a.j), x)) return joom(c);
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
    if (t->kind == JN_NAME) return frame_set(c->f, t->s, v) ? joom(c) : 0;
    jv ns = lookup(c, t->a->s);
    if (ns.k != JV_NS) return jerr(c, t, "cannot assign attribute '%s' on '%s': only a namespace() takes attributes", t->s, t->a->s);
    json_t *x = jv_json(c, t, v);
    if (!x) return -1;
    return json_object_set(ns.j, t->s, x) ? joom(c) : 0;
}

/* Unpack v over the targets of n (one target: v itself). */
static int bind_targets(jctx *c, const jnode *n, jv v) {
    if (n->nk == 1) return assign(c, n->kids[0], v);
    json_t *items;
    if (v.k == JV_UNDEF || (v.k == JV_JSON && json_is_object(v.j))) items = NULL; /* not a sequence of n */
    else if (jv_items(c, n, v, &items)) return -1;
    if (!items || json_array_size(items) != (size_t)n->nk)
        return jerr(c, n, "cannot unpack the value into %d variables (%s of %zu)", n->nk, jv_kind_name(v),
                    items ? json_array_size(items) : 0);
    for (int i = 0; i < n->nk; i++)
        if (assign(c, n->kids[i], jv_elem(c, json_array_get(items, (size_t)i)))) return -1;
    return 0;
}

static int run_for(jctx *c, const jnode *n) {
    jv it;
    json_t *all;
    if (ev(c, n->a, &it)) return -1;
    if (it.k == JV_JSON) it = jv_elem(c, it.j);
    if (jv_items(c, n->a, it, &all)) return -1;
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
            int rc = bind_targets(c, n, jv_elem(c, json_array_get(all, i))) || ev(c, n->d, &keep);
            c->f = f.up;
            frame_free(&f);
            if (rc) return -1;
            if (jv_truthy(keep) && json_array_append(items, json_array_get(all, i))) return joom(c);
            pool_release(c, fmark);
        }
    }
    size_t len = json_array_size(items);
    if (!len) return run(c, n->c);
    json_t *state = json_object(); /* what loop.changed() saw last, shared by the iterations */
    if (jv_own(c, state).k == JV_UNDEF) return -1;
    int mark = c->npool; /* each iteration's values are released at its end */
    for (size_t i = 0; i < len; i++) {
        json_t *loop = json_pack("{sIsIsIsIsbsbsIsIsIsO}", "index", (json_int_t)i + 1, "index0", (json_int_t)i, "revindex",
                                 (json_int_t)(len - i), "revindex0", (json_int_t)(len - i - 1), "first", i == 0, "last",
                                 i + 1 == len, "length", (json_int_t)len, "depth", (json_int_t)1, "depth0", (json_int_t)0,
                                 "\x01state", state);
        if (loop && i > 0 && json_object_set(loop, "previtem", json_array_get(items, i - 1))) { json_decref(loop); loop = NULL; }
        if (loop && i + 1 < len && json_object_set(loop, "nextitem", json_array_get(items, i + 1))) { json_decref(loop); loop = NULL; }
        jv lv = jv_own(c, loop);
        if (lv.k == JV_UNDEF) return -1;
        lv.k = JV_LOOP;
        if (++c->iters > MAX_ITERS) return jerr(c, n, "the template ran more than %lld loop iterations", MAX_ITERS);
        jframe f = {0};
        f.up = c->f;
        c->f = &f;
        int rc = frame_set(&f, "loop", lv) ? joom(c) : 0;
        if (!rc) rc = bind_targets(c, n, jv_elem(c, json_array_get(items, i)));
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

/* The text of body, run in a frame of its own when scoped, as a string value. */
static int render_block(jctx *c, const jnode *body, int scoped, jv *out) {
    sm_buf b = {0}, *so = c->out;
    jframe f = {0};
    f.up = c->f;
    if (scoped) c->f = &f;
    c->out = &b;
    int rc = run(c, body);
    c->out = so;
    c->f = f.up;
    frame_free(&f);
    *out = rc ? JV_UNDEFINED : jv_buf(c, &b);
    sm_buf_free(&b);
    return rc || out->k == JV_UNDEF ? -1 : 0;
}

/* The filters of a filter tag or a filtered block set (n->a, over JN_BODY) on the text t. */
static int filter_text(jctx *c, const jnode *n, jv t, jv *out) {
    jv saved = c->body;
    c->body = t;
    int rc = ev(c, n->a, out);
    c->body = saved;
    return rc;
}

static int run(jctx *c, const jnode *n) {
    for (; n && !c->ctl; n = n->next) {
        jv v;
        if (c->out->n > MAX_OUT) return jerr(c, n, "the template wrote more than %zu bytes", MAX_OUT);
        switch (n->kind) {
        case JN_TEXT:
            if (sm_buf_add(c->out, n->s, n->n)) return joom(c);
            break;
        case JN_OUT:
            if (ev(c, n->a, &v)) return -1;
            if (jv_tostr(c, v, c->out)) return jerr(c, n, "cannot write the value out");
            break;
        case JN_IF:
            if (ev(c, n->a, &v)) return -1;
            if (run(c, jv_truthy(v) ? n->b : n->c)) return -1;
            break;
        case JN_FOR:
            if (run_for(c, n)) return -1;
            break;
        case JN_SET:
            if (n->i) { /* {% set x %}body{% endset %}, maybe filtered */
                if (render_block(c, n->b, 0, &v)) return -1;
                if (n->a && filter_text(c, n, v, &v)) return -1;
            } else if (ev(c, n->a, &v)) return -1;
            if (bind_targets(c, n, v)) return -1;
            break;
        case JN_MACRO:
            if (frame_set(c->f, n->s, (jv){JV_MACRO, NULL, n, c->f})) return joom(c);
            break;
        case JN_WITH: { /* the values are computed outside, bound inside */
            jframe f = {0};
            f.up = c->f;
            int rc = 0;
            for (int i = 0; i < n->nk && !rc; i++)
                rc = ev(c, n->kids[i]->a, &v) || (frame_set(&f, n->kids[i]->s, v) ? joom(c) : 0);
            c->f = &f;
            if (!rc) rc = run(c, n->b);
            c->f = f.up;
            frame_free(&f);
            if (rc) return -1;
            break;
        }
        case JN_FILTER_BLOCK:
            if (render_block(c, n->b, 1, &v) || filter_text(c, n, v, &v) || jv_tostr(c, v, c->out)) return -1;
            break;
        case JN_BLOCK: /* generation: its body, in a scope of its own (transformers runs it as a call block) */
            if (render_block(c, n->b, 1, &v) || jv_tostr(c, v, c->out)) return -1;
            break;
        case JN_BREAK: c->ctl = 1; break;
        case JN_CONTINUE: c->ctl = 2; break;
        default: return jerr(c, n, "not a statement");
        }
    }
    return 0;
}

int sm_jinja_render(const sm_jinja *t, json_t *vars, sm_buf *out, int *raised, sm_err *e) {
    jctx c;
    memset(&c, 0, sizeof c);
    jframe g = {0};
    c.f = c.globals = &g;
    c.vars = vars;
    c.out = out;
    c.e = e;
    e->msg[0] = 0;
    /* a macro exists from its definition on, as in Jinja2's render (a macro's body may call one
       defined after it: the call comes later) */
    int rc = run(&c, t->root);
    if (rc && !e->msg[0]) sm_errf(e, "template error");
    *raised = rc && c.raised;
    for (int i = 0; i < c.npool; i++) json_decref(c.pool[i]);
    free(c.pool);
    for (size_t i = 0; i < c.captag; i++) json_decref(c.tagk[i]);
    free(c.tagk);
    free(c.tagv);
    json_decref(c.undef);
    frame_free(&g);
    return rc;
}
