/* jinja_parse.c: tokens into the node tree (see jinja_int.h), by recursive descent with
 * Jinja2's precedence: ternary < or < and < not < comparisons and "in" < + - < ~ < * / // %
 * < ** < unary minus < postfix (.attr, .0, [i], [a:b:c], call) < filters and tests.  Tags: if /
 * elif / else, for (with else, a filter and break / continue), set (a, b = ...; ns.x = ...; a
 * block set, filtered or not), macro, with, filter, generation (transformers' tag, rendered as
 * its body); raw is the lexer's.
 *
 * Everything outside the supported subset is refused here, naming the construct and its
 * line:column: an unknown tag, filter, test or method, a call of a name that is neither a
 * macro of the template nor a supported function, a filter or test named by a string that
 * map / select / reject / selectattr / rejectattr would call.  A filter's or test's built-in
 * (jinja_call.h) is found here once.  We rejected refusing at render time: a server must
 * find out at start, not on some user's request.
 */
#include "jinja/jinja_call.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    sm_jinja *t;
    jtoken *k;                 /* [nk] tokens */
    int nk, p;                 /* the next token */
    sm_err *e;
    const char *calls[256];    /* names called as functions, checked at the end */
    int call_line[256], call_col[256], ncalls;
    const char *macros[256];   /* macro names defined */
    int nmacros;
    int depth;                 /* expressions and blocks nested now (bounded: no stack overflow) */
} parser;

#define MAX_NEST 200 /* nested expressions or blocks a template may have */

static int perr(parser *P, const jtoken *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *P, const jtoken *at, const char *fmt, ...) {
    char m[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return sm_errf(P->e, "line %d col %d: %s", at->line, at->col, m);
}

static jtoken *cur(parser *P) { return &P->k[P->p]; }
static int is_op(const jtoken *t, const char *op) { return t->kind == JT_OP && !strcmp(t->s, op); }
static int is_name(const jtoken *t, const char *nm) { return t->kind == JT_NAME && !strcmp(t->s, nm); }
static int accept_op(parser *P, const char *op) { return is_op(cur(P), op) ? (P->p++, 1) : 0; }
static int accept_name(parser *P, const char *nm) { return is_name(cur(P), nm) ? (P->p++, 1) : 0; }

static const char *tok_desc(const jtoken *t) {
    switch (t->kind) {
    case JT_VEND: return "end of '{{ }}'";
    case JT_BEND: return "end of '{% %}'";
    case JT_EOF: return "end of template";
    default: return t->s;
    }
}

static int expect_op(parser *P, const char *op) {
    if (accept_op(P, op)) return 0;
    return perr(P, cur(P), "expected '%s', found '%s'", op, tok_desc(cur(P)));
}

static jnode *mk(parser *P, int kind, const jtoken *at) {
    sm_jinja *t = P->t;
    if (t->nall == t->capall) {
        int nc = t->capall ? t->capall * 2 : 256;
        jnode **na = realloc(t->all, sizeof *na * (size_t)nc);
        if (!na) return NULL;
        t->all = na;
        t->capall = nc;
    }
    jnode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    t->all[t->nall++] = n;
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static int set_s(jnode *n, const char *s, size_t len) {
    n->s = malloc(len + 1);
    if (!n->s) return -1;
    memcpy(n->s, s, len);
    n->s[len] = 0;
    n->n = len;
    return 0;
}

static int add_kid(jnode *n, jnode *k, const char *kw) {
    jnode **nk = realloc(n->kids, sizeof *nk * (size_t)(n->nk + 1));
    if (!nk) return -1;
    n->kids = nk;
    char **nw = realloc(n->kw, sizeof *nw * (size_t)(n->nk + 1));
    if (!nw) return -1;
    n->kw = nw;
    nw[n->nk] = kw ? strdup(kw) : NULL;
    nk[n->nk++] = k;
    return 0;
}

#define OOM(P) (sm_errf((P)->e, "out of memory"), (jnode *)NULL)

static jnode *expr(parser *P);
static jnode *unary(parser *P, int with_filter);

/* "(" args ")" into n's kids (positional, then name=value). */
static int call_args(parser *P, jnode *n) {
    if (expect_op(P, "(")) return -1;
    while (!accept_op(P, ")")) {
        if (n->nk && expect_op(P, ",")) return -1;
        if (accept_op(P, ")")) break; /* a trailing comma */
        const char *kw = NULL;
        if (cur(P)->kind == JT_NAME && is_op(&P->k[P->p + 1], "=")) {
            kw = cur(P)->s;
            P->p += 2;
        }
        jnode *a = expr(P);
        if (!a || add_kid(n, a, kw)) return a ? (sm_errf(P->e, "out of memory"), -1) : -1;
    }
    return 0;
}

static jnode *primary(parser *P) {
    jtoken *t = cur(P);
    jnode *n = NULL;
    if (t->kind == JT_STR) {
        n = mk(P, JN_STR, t);
        if (!n) return OOM(P);
        sm_buf b = {0};
        while (cur(P)->kind == JT_STR) { /* adjacent literals concatenate */
            if (sm_buf_add(&b, cur(P)->s, cur(P)->n)) return OOM(P);
            P->p++;
        }
        n->s = b.p ? b.p : strdup("");
        n->n = b.n;
        return n->s ? n : OOM(P);
    }
    P->p++;
    if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        if (!(n = mk(P, t->kind == JT_INT ? JN_INT : JN_FLOAT, t))) return OOM(P);
        n->i = t->i;
        n->f = t->f;
        return n;
    }
    if (t->kind == JT_NAME) {
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            if (!(n = mk(P, JN_BOOL, t))) return OOM(P);
            n->i = t->s[0] == 't' || t->s[0] == 'T';
            return n;
        }
        if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) return (n = mk(P, JN_NONE, t)) ? n : OOM(P);
        if (!(n = mk(P, JN_NAME, t)) || set_s(n, t->s, t->n)) return OOM(P);
        return n;
    }
    if (is_op(t, "(") || is_op(t, "[")) { /* parenthesized expression, tuple or list */
        const char *close = is_op(t, "(") ? ")" : "]";
        if (!(n = mk(P, JN_LIST, t))) return OOM(P);
        int comma = 0;
        while (!accept_op(P, close)) {
            if (n->nk && expect_op(P, ",")) return NULL;
            if (n->nk) comma = 1;
            if (accept_op(P, close)) break;
            jnode *x = expr(P);
            if (!x || add_kid(n, x, NULL)) return x ? OOM(P) : NULL;
        }
        if (*close == ')' && n->nk == 1 && !comma && !is_op(&P->k[P->p - 2], ",")) return n->kids[0];
        if (*close == ')') n->kind = JN_TUPLE; /* (a, b), (a,) and () are tuples */
        return n;
    }
    if (is_op(t, "{")) {
        if (!(n = mk(P, JN_DICT, t))) return OOM(P);
        while (!accept_op(P, "}")) {
            if (n->nk && expect_op(P, ",")) return NULL;
            if (accept_op(P, "}")) break;
            jnode *k = expr(P);
            if (!k || expect_op(P, ":")) return NULL;
            jnode *v = expr(P);
            if (!v || add_kid(n, k, NULL) || add_kid(n, v, NULL)) return v ? OOM(P) : NULL;
        }
        return n;
    }
    perr(P, t, "expected an expression, found '%s'", tok_desc(t));
    return NULL;
}

static jnode *postfix(parser *P, jnode *n) {
    while (n) {
        jtoken *t = cur(P);
        if (accept_op(P, ".")) {
            jtoken *nm = cur(P);
            if (nm->kind != JT_NAME && nm->kind != JT_INT) return perr(P, nm, "expected an attribute name after '.'"), NULL;
            P->p++;
            if (nm->kind == JT_INT) { /* x.0 is x[0] */
                jnode *x = mk(P, JN_ITEM, nm), *k = mk(P, JN_INT, nm);
                if (!x || !k) return OOM(P);
                k->i = nm->i;
                x->a = n;
                x->b = k;
                n = x;
                continue;
            }
            jnode *a = mk(P, JN_ATTR, nm);
            if (!a || set_s(a, nm->s, nm->n)) return OOM(P);
            a->a = n;
            n = a;
        } else if (accept_op(P, "[")) {
            jnode *parts[3] = {0};
            int np = 0, slice = 0;
            while (1) {
                if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) {
                    if (!(parts[np] = expr(P))) return NULL;
                }
                if (accept_op(P, "]")) break;
                if (np == 2 || expect_op(P, ":")) return np == 2 ? (perr(P, cur(P), "a slice has at most 3 parts"), NULL) : NULL;
                slice = 1;
                np++;
            }
            jnode *x = mk(P, slice ? JN_SLICE : JN_ITEM, t);
            if (!x) return OOM(P);
            x->a = n;
            if (slice) { x->b = parts[0]; x->c = parts[1]; x->d = parts[2]; }
            else if (!(x->b = parts[0])) return perr(P, t, "empty subscript"), NULL;
            n = x;
        } else if (is_op(t, "(")) {
            jnode *c = mk(P, JN_CALL, t);
            if (!c) return OOM(P);
            c->a = n;
            if (call_args(P, c)) return NULL;
            if (n->kind == JN_ATTR && !jb_find(JB_METHOD, n->s))
                return perr(P, &P->k[P->p - 1], "unsupported method '%s()' (at line %d col %d)", n->s, n->line, n->col), NULL;
            if (n->kind == JN_NAME) {
                if (P->ncalls == 256) return perr(P, t, "too many function calls"), NULL;
                P->calls[P->ncalls] = n->s;
                P->call_line[P->ncalls] = n->line;
                P->call_col[P->ncalls++] = n->col;
            }
            if (n->kind != JN_NAME && n->kind != JN_ATTR)
                return perr(P, t, "unsupported call of an expression (only functions, macros and methods)"), NULL;
            n = c;
        } else break;
    }
    return n;
}

/* The filter or test a string literal argument names, checked now: map('upper'),
 * select('odd'), selectattr('role', 'equalto', 'user').  0, or -1 naming it. */
static int named_builtin(parser *P, const jnode *f) {
    int kind = -1, at = 0;
    if (!strcmp(f->s, "map")) kind = JB_FILTER;
    else if (!strcmp(f->s, "select") || !strcmp(f->s, "reject")) kind = JB_TEST;
    else if (!strcmp(f->s, "selectattr") || !strcmp(f->s, "rejectattr")) kind = JB_TEST, at = 1;
    if (kind < 0 || f->nk <= at || (f->kw && f->kw[at]) || f->kids[at]->kind != JN_STR) return 0;
    for (int i = 0; i < f->nk; i++)
        if (kind == JB_FILTER && f->kw && f->kw[i] && !strcmp(f->kw[i], "attribute")) return 0; /* map(attribute=) */
    const jnode *a = f->kids[at];
    if (jb_find(kind, a->s)) return 0;
    return sm_errf(P->e, "line %d col %d: unsupported %s '%s' (in %s)", a->line, a->col, kind == JB_FILTER ? "filter" : "test",
                   a->s, f->s);
}

/* One filter "name(args)" applied to n (the "|" already read). */
static jnode *filter_one(parser *P, jnode *n) {
    jtoken *nm = cur(P);
    if (nm->kind != JT_NAME) return perr(P, nm, "expected a filter name after '|'"), NULL;
    P->p++;
    const jbuiltin *b = jb_find(JB_FILTER, nm->s);
    if (!b) return perr(P, nm, "unsupported filter '%s'", nm->s), NULL;
    jnode *f = mk(P, JN_FILTER, nm);
    if (!f || set_s(f, nm->s, nm->n)) return OOM(P);
    f->a = n;
    f->fn = b;
    if (is_op(cur(P), "(") && call_args(P, f)) return NULL;
    return named_builtin(P, f) ? NULL : f;
}

/* Filters "| name(args)" and tests "is [not] name [arg]" after a unary expression. */
static jnode *filters(parser *P, jnode *n) {
    while (n) {
        jtoken *t = cur(P);
        if (accept_op(P, "|")) {
            n = filter_one(P, n);
        } else if (accept_name(P, "is")) {
            int neg = accept_name(P, "not");
            jtoken *nm = cur(P);
            if (nm->kind != JT_NAME) return perr(P, nm, "expected a test name after 'is'"), NULL;
            P->p++;
            const jbuiltin *b = jb_find(JB_TEST, nm->s);
            if (!b) return perr(P, nm, "unsupported test '%s'", nm->s), NULL;
            jnode *x = mk(P, JN_TEST, nm);
            if (!x || set_s(x, nm->s, nm->n)) return OOM(P);
            x->fn = b;
            x->a = n;
            x->i = neg;
            if (is_op(cur(P), "(")) {
                if (call_args(P, x)) return NULL;
            } else if (cur(P)->kind == JT_STR || cur(P)->kind == JT_INT || cur(P)->kind == JT_FLOAT ||
                       (cur(P)->kind == JT_NAME && !is_name(cur(P), "and") && !is_name(cur(P), "or") &&
                        !is_name(cur(P), "else") && !is_name(cur(P), "if") && !is_name(cur(P), "in") &&
                        !is_name(cur(P), "is") && !is_name(cur(P), "not"))) {
                jnode *a = unary(P, 0);
                if (!a || add_kid(x, a, NULL)) return a ? OOM(P) : NULL;
            }
            n = x;
        } else {
            (void)t;
            break;
        }
    }
    return n;
}

static jnode *unary(parser *P, int with_filter) {
    jtoken *t = cur(P);
    jnode *n;
    if (accept_op(P, "-") || accept_op(P, "+")) {
        if (++P->depth > MAX_NEST) return perr(P, t, "nested more than %d deep", MAX_NEST), NULL;
        jnode *x = unary(P, 0);
        P->depth--;
        if (!x) return NULL;
        if (t->s[0] == '+') n = x;
        else if (!(n = mk(P, JN_NEG, t))) return OOM(P);
        else n->a = x;
    } else n = primary(P);
    n = postfix(P, n);
    return with_filter ? filters(P, n) : n;
}

static jnode *bin(parser *P, const jtoken *t, const char *op, jnode *a, jnode *b) {
    if (!a || !b) return NULL;
    jnode *n = mk(P, JN_BIN, t);
    if (!n || set_s(n, op, strlen(op))) return OOM(P);
    n->a = a;
    n->b = b;
    return n;
}

/* a ** b ** c: left to right, as Jinja2 parses it */
static jnode *pow_expr(parser *P) {
    jnode *n = unary(P, 1);
    while (n && is_op(cur(P), "**")) {
        jtoken *t = cur(P);
        P->p++;
        n = bin(P, t, "**", n, unary(P, 1));
    }
    return n;
}

static jnode *math2(parser *P) {
    jnode *n = pow_expr(P);
    while (n) {
        jtoken *t = cur(P);
        if (is_op(t, "*") || is_op(t, "/") || is_op(t, "//") || is_op(t, "%")) {
            P->p++;
            n = bin(P, t, t->s, n, pow_expr(P));
        } else break;
    }
    return n;
}

static jnode *concat(parser *P) {
    jnode *n = math2(P);
    while (n && is_op(cur(P), "~")) {
        jtoken *t = cur(P);
        P->p++;
        n = bin(P, t, "~", n, math2(P));
    }
    return n;
}

static jnode *math1(parser *P) {
    jnode *n = concat(P);
    while (n && (is_op(cur(P), "+") || is_op(cur(P), "-"))) {
        jtoken *t = cur(P);
        P->p++;
        n = bin(P, t, t->s, n, concat(P));
    }
    return n;
}

/* a < b <= c is Python's chain: (a < b) and (b <= c). */
static jnode *compare(parser *P) {
    jnode *left = math1(P), *chain = NULL;
    while (left) {
        jtoken *t = cur(P);
        const char *op;
        if (is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, ">") || is_op(t, "<=") || is_op(t, ">=")) {
            op = t->s;
            P->p++;
        } else if (is_name(t, "in")) {
            op = "in";
            P->p++;
        } else if (is_name(t, "not") && is_name(&P->k[P->p + 1], "in")) {
            op = "not in";
            P->p += 2;
        } else break;
        jnode *right = math1(P), *c = bin(P, t, op, left, right);
        if (!c) return NULL;
        if (chain) {
            jnode *x = mk(P, JN_AND, t);
            if (!x) return OOM(P);
            x->a = chain;
            x->b = c;
            c = x;
        }
        chain = c;
        left = right;
    }
    return chain ? chain : left;
}

static jnode *not_expr(parser *P) {
    jtoken *t = cur(P);
    if (accept_name(P, "not")) {
        if (++P->depth > MAX_NEST) return perr(P, t, "nested more than %d deep", MAX_NEST), NULL;
        jnode *x = not_expr(P), *n;
        P->depth--;
        if (!x) return NULL;
        if (!(n = mk(P, JN_NOT, t))) return OOM(P);
        n->a = x;
        return n;
    }
    return compare(P);
}

static jnode *and_expr(parser *P) {
    jnode *n = not_expr(P);
    while (n && is_name(cur(P), "and")) {
        jtoken *t = cur(P);
        P->p++;
        jnode *b = not_expr(P), *x;
        if (!b) return NULL;
        if (!(x = mk(P, JN_AND, t))) return OOM(P);
        x->a = n;
        x->b = b;
        n = x;
    }
    return n;
}

static jnode *or_expr(parser *P) {
    jnode *n = and_expr(P);
    while (n && is_name(cur(P), "or")) {
        jtoken *t = cur(P);
        P->p++;
        jnode *b = and_expr(P), *x;
        if (!b) return NULL;
        if (!(x = mk(P, JN_OR, t))) return OOM(P);
        x->a = n;
        x->b = b;
        n = x;
    }
    return n;
}

/* expression: or_expr ["if" or_expr ["else" expression]] */
static jnode *expr_(parser *P);
static jnode *expr(parser *P) {
    if (++P->depth > MAX_NEST) return perr(P, cur(P), "nested more than %d deep", MAX_NEST), NULL;
    jnode *n = expr_(P);
    P->depth--;
    return n;
}

static jnode *expr_(parser *P) {
    jnode *n = or_expr(P);
    if (n && is_name(cur(P), "if")) {
        jtoken *t = cur(P);
        P->p++;
        jnode *c = or_expr(P), *x;
        if (!c) return NULL;
        if (!(x = mk(P, JN_COND, t))) return OOM(P);
        x->a = c;
        x->b = n;
        if (accept_name(P, "else") && !(x->c = expr(P))) return NULL;
        n = x;
    }
    return n;
}

/* ---- statements ------------------------------------------------------------------------- */

static int end_tag(parser *P) {
    if (cur(P)->kind == JT_BEND) { P->p++; return 0; }
    return perr(P, cur(P), "expected the end of the tag, found '%s'", tok_desc(cur(P)));
}

/* A target: a name, or name.attr (set only), or names separated by commas (unpacking). */
static int targets(parser *P, jnode *n, int allow_attr) {
    do {
        jtoken *t = cur(P);
        if (t->kind != JT_NAME) return perr(P, t, "expected a variable name, found '%s'", tok_desc(t));
        P->p++;
        jnode *x = mk(P, JN_NAME, t);
        if (!x || set_s(x, t->s, t->n)) return sm_errf(P->e, "out of memory");
        if (allow_attr && accept_op(P, ".")) {
            jtoken *a = cur(P);
            if (a->kind != JT_NAME) return perr(P, a, "expected an attribute name after '.'");
            P->p++;
            jnode *y = mk(P, JN_ATTR, a);
            if (!y || set_s(y, a->s, a->n)) return sm_errf(P->e, "out of memory");
            y->a = x;
            x = y;
        }
        if (add_kid(n, x, NULL)) return sm_errf(P->e, "out of memory");
    } while (accept_op(P, ","));
    return 0;
}

static int body(parser *P, jnode **first, const char *const *stops, const char **stopped);

/* After "{% if": cond, body, then elif / else / endif. */
static jnode *if_stmt(parser *P, const jtoken *at) {
    jnode *n = mk(P, JN_IF, at);
    if (!n) return OOM(P);
    if (!(n->a = expr(P)) || end_tag(P)) return NULL;
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    const char *st;
    if (body(P, &n->b, stops, &st)) return NULL;
    if (!strcmp(st, "elif")) {
        jnode *e = if_stmt(P, &P->k[P->p - 1]);
        if (!e) return NULL;
        n->c = e;
        return n;
    }
    if (!strcmp(st, "else")) {
        static const char *const ends[] = {"endif", NULL};
        if (end_tag(P) || body(P, &n->c, ends, &st)) return NULL;
    }
    return end_tag(P) ? NULL : n;
}

static jnode *statement_(parser *P);
static jnode *statement(parser *P) {
    if (++P->depth > MAX_NEST) return perr(P, cur(P), "nested more than %d deep", MAX_NEST), NULL;
    jnode *n = statement_(P);
    P->depth--;
    return n;
}

static jnode *statement_(parser *P) {
    jtoken *bt = cur(P); /* "{%" */
    P->p++;
    jtoken *t = cur(P);
    if (t->kind != JT_NAME) return perr(P, t, "expected a tag name after '{%%'"), NULL;
    P->p++;
    jnode *n;
    const char *st;
    (void)bt;
    if (!strcmp(t->s, "if")) return if_stmt(P, t);
    if (!strcmp(t->s, "for")) {
        if (!(n = mk(P, JN_FOR, t)) || targets(P, n, 0)) return n ? NULL : OOM(P);
        if (!accept_name(P, "in")) return perr(P, cur(P), "expected 'in' in a for tag"), NULL;
        if (!(n->a = or_expr(P))) return NULL;
        if (accept_name(P, "if") && !(n->d = expr(P))) return NULL;
        if (accept_name(P, "recursive")) return perr(P, &P->k[P->p - 1], "unsupported 'recursive' loop"), NULL;
        static const char *const stops[] = {"else", "endfor", NULL};
        if (end_tag(P) || body(P, &n->b, stops, &st)) return NULL;
        if (!strcmp(st, "else")) {
            static const char *const ends[] = {"endfor", NULL};
            if (end_tag(P) || body(P, &n->c, ends, &st)) return NULL;
        }
        return end_tag(P) ? NULL : n;
    }
    if (!strcmp(t->s, "set")) {
        if (!(n = mk(P, JN_SET, t)) || targets(P, n, 1)) return n ? NULL : OOM(P);
        if (accept_op(P, "=")) {
            if (!(n->a = expr(P))) return NULL;
            if (is_op(cur(P), ",")) { /* a, b = x, y: the value is a tuple */
                jnode *l = mk(P, JN_TUPLE, cur(P));
                if (!l || add_kid(l, n->a, NULL)) return OOM(P);
                while (accept_op(P, ",")) {
                    jnode *x = expr(P);
                    if (!x || add_kid(l, x, NULL)) return x ? OOM(P) : NULL;
                }
                n->a = l;
            }
            return end_tag(P) ? NULL : n;
        }
        if (n->nk != 1 || n->kids[0]->kind != JN_NAME) return perr(P, t, "a block set takes one variable name"), NULL;
        static const char *const ends[] = {"endset", NULL};
        if (is_op(cur(P), "|")) { /* {% set x | filter %}: the block's text filtered */
            jnode *bd = mk(P, JN_BODY, cur(P));
            if (!bd) return OOM(P);
            if (!(n->a = filters(P, bd))) return NULL;
        }
        if (end_tag(P) || body(P, &n->b, ends, &st)) return NULL;
        n->i = 1; /* a block set */
        return end_tag(P) ? NULL : n;
    }
    if (!strcmp(t->s, "macro")) {
        jtoken *nm = cur(P);
        if (nm->kind != JT_NAME) return perr(P, nm, "expected a macro name"), NULL;
        P->p++;
        if (!(n = mk(P, JN_MACRO, nm)) || set_s(n, nm->s, nm->n)) return OOM(P);
        if (expect_op(P, "(")) return NULL;
        while (!accept_op(P, ")")) {
            if (n->nk && expect_op(P, ",")) return NULL;
            jtoken *pn = cur(P);
            if (pn->kind != JT_NAME) return perr(P, pn, "expected a parameter name, found '%s'", tok_desc(pn)), NULL;
            P->p++;
            jnode *x = mk(P, JN_NAME, pn);
            if (!x || set_s(x, pn->s, pn->n) || add_kid(n, x, NULL)) return OOM(P);
            if (accept_op(P, "=") && !(x->a = expr(P))) return NULL;
        }
        if (P->nmacros == 256) return perr(P, nm, "too many macros"), NULL;
        P->macros[P->nmacros++] = n->s;
        static const char *const ends[] = {"endmacro", NULL};
        if (end_tag(P) || body(P, &n->b, ends, &st)) return NULL;
        if (cur(P)->kind == JT_NAME) P->p++; /* {% endmacro name %} */
        return end_tag(P) ? NULL : n;
    }
    if (!strcmp(t->s, "with")) { /* {% with a = x, b = y %}: a scope of its own */
        if (!(n = mk(P, JN_WITH, t))) return OOM(P);
        while (cur(P)->kind == JT_NAME) {
            jtoken *nm = cur(P);
            P->p++;
            jnode *x = mk(P, JN_NAME, nm);
            if (!x || set_s(x, nm->s, nm->n) || add_kid(n, x, NULL)) return OOM(P);
            if (expect_op(P, "=") || !(x->a = expr(P))) return NULL;
            if (!accept_op(P, ",")) break;
        }
        static const char *const ends[] = {"endwith", NULL};
        if (end_tag(P) || body(P, &n->b, ends, &st)) return NULL;
        return end_tag(P) ? NULL : n;
    }
    if (!strcmp(t->s, "filter")) { /* {% filter f(args) | g %}: the block's text filtered */
        if (!(n = mk(P, JN_FILTER_BLOCK, t))) return OOM(P);
        jnode *bd = mk(P, JN_BODY, t);
        if (!bd || !(n->a = filter_one(P, bd)) || !(n->a = filters(P, n->a))) return bd ? NULL : OOM(P);
        static const char *const ends[] = {"endfilter", NULL};
        if (end_tag(P) || body(P, &n->b, ends, &st)) return NULL;
        return end_tag(P) ? NULL : n;
    }
    if (!strcmp(t->s, "generation")) { /* transformers' tag around an assistant's text: rendered as it is */
        if (!(n = mk(P, JN_BLOCK, t))) return OOM(P);
        static const char *const ends[] = {"endgeneration", NULL};
        if (end_tag(P) || body(P, &n->b, ends, &st)) return NULL;
        return end_tag(P) ? NULL : n;
    }
    if (!strcmp(t->s, "break") || !strcmp(t->s, "continue")) {
        if (!(n = mk(P, t->s[0] == 'b' ? JN_BREAK : JN_CONTINUE, t))) return OOM(P);
        return end_tag(P) ? NULL : n;
    }
    return perr(P, t, "unsupported tag '%s'", t->s), NULL;
}

/* Statements up to a block tag named in stops (NULL: up to the end of the template); *stopped
 * is that tag's name, its "{% name" consumed. */
static int body(parser *P, jnode **first, const char *const *stops, const char **stopped) {
    jnode **tail = first;
    *first = NULL;
    while (1) {
        jtoken *t = cur(P);
        jnode *n = NULL;
        if (t->kind == JT_EOF) {
            if (!stops) return 0;
            int last = 0;
            while (stops[last + 1]) last++;
            return perr(P, t, "the template ends inside a block: '%s' is missing", stops[last]);
        }
        if (t->kind == JT_TEXT) {
            P->p++;
            if (!(n = mk(P, JN_TEXT, t)) || set_s(n, t->s, t->n)) return sm_errf(P->e, "out of memory");
        } else if (t->kind == JT_VBEGIN) {
            P->p++;
            if (!(n = mk(P, JN_OUT, t)) || !(n->a = expr(P))) return n ? -1 : sm_errf(P->e, "out of memory");
            if (cur(P)->kind != JT_VEND) return perr(P, cur(P), "expected '}}', found '%s'", tok_desc(cur(P)));
            P->p++;
        } else {
            jtoken *nm = &P->k[P->p + 1];
            for (int i = 0; stops && stops[i]; i++)
                if (is_name(nm, stops[i])) {
                    P->p += 2;
                    *stopped = stops[i];
                    return 0;
                }
            if (nm->kind == JT_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "else") || !strcmp(nm->s, "elif")))
                return perr(P, nm, "unexpected '%s'%s%s", nm->s, stops ? ", expected " : "", stops ? stops[0] : "");
            if (!(n = statement(P))) return -1;
        }
        *tail = n;
        tail = &n->next;
    }
}

int sm_jinja_parse_tokens(sm_jinja *t, jtoken *tok, int ntok, sm_err *e) {
    parser P = {0};
    P.t = t;
    P.k = tok;
    P.nk = ntok;
    P.e = e;
    if (body(&P, &t->root, NULL, NULL)) return -1;
    for (int i = 0; i < P.ncalls; i++) {
        int ok = jb_find(JB_FUNCTION, P.calls[i]) != NULL;
        for (int m = 0; m < P.nmacros && !ok; m++) ok = !strcmp(P.macros[m], P.calls[i]);
        if (!ok)
            return sm_errf(e, "line %d col %d: unsupported function '%s()' (not a macro of the template)", P.call_line[i],
                           P.call_col[i], P.calls[i]);
    }
    return 0;
}

int sm_jinja_parse(const char *src, size_t n, sm_jinja **out, sm_err *e) {
    jtoken *tok = NULL;
    int ntok = 0;
    if (sm_jinja_lex(src, n, &tok, &ntok, e)) return -1;
    sm_jinja *t = calloc(1, sizeof *t);
    if (!t) {
        sm_jinja_tokens_free(tok, ntok);
        return sm_errf(e, "out of memory");
    }
    int rc = sm_jinja_parse_tokens(t, tok, ntok, e);
    sm_jinja_tokens_free(tok, ntok);
    if (rc) {
        sm_jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void sm_jinja_free(sm_jinja *t) {
    if (!t) return;
    for (int i = 0; i < t->nall; i++) {
        jnode *n = t->all[i];
        for (int k = 0; k < n->nk; k++) free(n->kw ? n->kw[k] : NULL);
        free(n->kw);
        free(n->kids);
        free(n->s);
        free(n);
    }
    free(t->all);
    free(t);
}
