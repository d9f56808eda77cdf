/* jinja_int.h: what the Jinja parser hands the evaluator (see jinja.h): tokens, the node tree
 * of statements and expressions, and the render-time values.  Internal to jinja_*.c.
 *
 * Values are jansson values (strings, numbers, lists, dicts as JSON has them) tagged with the
 * kinds JSON lacks: undefined, a namespace (a dict whose attributes may be assigned) and a
 * macro.  Every json_t a render touches is held in the render's pool and released at its end,
 * so the evaluator never counts references.  We rejected a value type of our own: lists and
 * dicts would need a second container library and a converter both ways.
 */
#ifndef SM_JINJA_INT_H
#define SM_JINJA_INT_H
#include "serve/jinja.h"

enum jtok { JT_TEXT, JT_VBEGIN, JT_VEND, JT_BBEGIN, JT_BEND, JT_NAME, JT_STR, JT_INT, JT_FLOAT, JT_OP, JT_EOF };

typedef struct jtoken {
    int kind;                  /* enum jtok */
    char *s;                   /* text, name, decoded string or operator (malloc'd, NUL-terminated) */
    size_t n;                  /* bytes of s */
    long long i;               /* JT_INT value */
    double f;                  /* JT_FLOAT value */
    int line, col;             /* 1-based position in the template */
} jtoken;

/* Tokens of src (text with whitespace control applied; tags split into tokens). */
int sm_jinja_lex(const char *src, size_t n, jtoken **out, int *nout, sm_err *e);
void sm_jinja_tokens_free(jtoken *t, int n);

enum jnk {
    /* statements (a body is a list through next) */
    JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_MACRO, JN_BREAK, JN_CONTINUE,
    /* expressions */
    JN_STR, JN_INT, JN_FLOAT, JN_BOOL, JN_NONE, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER,
    JN_TEST, JN_BIN, JN_NOT, JN_NEG, JN_AND, JN_OR, JN_COND, JN_LIST, JN_DICT
};

typedef struct jnode {
    int kind;                  /* enum jnk */
    int line, col;             /* where it starts in the template */
    char *s;                   /* text, name, string, attribute, operator, filter or test name */
    size_t n;                  /* bytes of s */
    long long i;               /* int literal, bool literal, JN_TEST negated */
    double f;                  /* float literal */
    struct jnode *a, *b, *c, *d; /* operands; statements: a expr, b body, c else body, d loop filter */
    struct jnode **kids;       /* [nk] list items, call / filter / test arguments, dict keys and values
                                  alternately, for / set targets, macro parameters (a: default) */
    char **kw;                 /* [nk] keyword of each argument (NULL: positional), or NULL */
    int nk;
    struct jnode *next;        /* the next statement of a body */
} jnode;

struct sm_jinja {
    jnode *root;               /* the template's body */
    jnode **all;               /* [nall] every node, for freeing */
    int nall, capall;
};

/* Parse tokens into t->root (t->all holds the nodes). */
int sm_jinja_parse_tokens(sm_jinja *t, jtoken *tok, int ntok, sm_err *e);

/* ---- render-time values ---------------------------------------------------------------- */

enum jvk { JV_UNDEF, JV_JSON, JV_NS, JV_MACRO };

typedef struct jv {
    int k;                     /* enum jvk */
    json_t *j;                 /* JV_JSON / JV_NS: the value (held by the render's pool) */
    const jnode *mac;          /* JV_MACRO: its definition */
} jv;

typedef struct jframe {
    char **names;              /* [n] variables set in this scope */
    jv *vals;                  /* [n] their values */
    int n, cap;
    struct jframe *up;         /* the enclosing scope (NULL: the template's globals) */
} jframe;

typedef struct jctx {
    jframe *f;                 /* the innermost scope */
    jframe *globals;           /* the template's top scope (macros resolve names from it) */
    json_t *vars;              /* the caller's variables */
    sm_sbuf *out;              /* where text goes */
    json_t **pool;             /* [npool] every value held by this render */
    int npool, cappool;
    int raised;                /* the error is the template's raise_exception */
    int ctl;                   /* 1: break, 2: continue pending */
    int depth;                 /* macro call depth (bounded) */
    long long iters;           /* loop iterations so far (bounded: a template cannot hang a request) */
    sm_err *e;
} jctx;

/* Value helpers (jinja_value.c). */
jv jv_own(jctx *c, json_t *j);               /* wrap a new reference (NULL: out of memory -> undefined, error set) */
jv jv_borrow(jctx *c, json_t *j);            /* wrap a borrowed reference (NULL: undefined) */
jv jv_str(jctx *c, const char *s, size_t n);
jv jv_int(jctx *c, long long x);
jv jv_real(jctx *c, double x);
jv jv_bool(jctx *c, int x);
jv jv_none(jctx *c);
int jv_truthy(jv v);
int jv_tostr(jctx *c, jv v, sm_sbuf *out);   /* Python's str() */
int jv_repr(jctx *c, jv v, sm_sbuf *out);    /* Python's repr() */
int jv_equal(jv a, jv b);
int jv_isnum(jv v);
double jv_num(jv v);
int jv_isint(jv v);                          /* an integer or a bool */
long long jv_intv(jv v);
/* json.dumps's options as transformers' tojson passes them */
typedef struct jjson_opts {
    int indent;                /* < 0: one line */
    const char *item_sep;      /* between items: ", " (one line) or "," (indented), or the caller's */
    const char *key_sep;       /* between a key and its value: ": " or the caller's */
    int sort_keys;             /* keys in code point order, else in their order */
    int ascii;                 /* ensure_ascii: non-ASCII as \uXXXX (surrogate pairs above U+FFFF) */
} jjson_opts;
int jv_tojson(jctx *c, jv v, const jjson_opts *op, int level, sm_sbuf *out);
int jv_utf8_index(const char *s, size_t n, size_t **offs, size_t *count); /* codepoint offsets */
json_t *jv_chars(const char *s, size_t n);   /* a string's characters (code points) as a new list; NULL: out of memory */
size_t jv_ulen(const char *s, size_t n);     /* code points of a UTF-8 string */
int jerr(jctx *c, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Built-ins (jinja_builtin.c): names the parser accepts, and their evaluation. */
int sm_jinja_known_filter(const char *name);
int sm_jinja_known_test(const char *name);
int sm_jinja_known_method(const char *name);
int sm_jinja_known_function(const char *name);
int jb_filter(jctx *c, const jnode *n, jv in, jv *args, int nargs, char **kw, jv *out);
int jb_test(jctx *c, const jnode *n, jv in, jv *args, int nargs, int *out);
int jb_method(jctx *c, const jnode *n, jv obj, const char *name, jv *args, int nargs, char **kw, jv *out);
/* A binary operator n->s ("+", "in", "==", ...) on a and b (jinja_eval.c). */
int jb_binop(jctx *c, const jnode *n, jv a, jv b, jv *out);
int jb_function(jctx *c, const jnode *n, const char *name, jv *args, int nargs, char **kw, jv *out);

#endif
