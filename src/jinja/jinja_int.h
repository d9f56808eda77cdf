/* jinja_int.h: what the parts of the Jinja renderer (see jinja.h) share: tokens, the node tree
 * of statements and expressions, render-time values, the render's context, and the value and
 * text helpers.  Internal to src/jinja/.  The built-ins are reached only through the table of
 * jinja_call.h, so the evaluator and the built-ins never include each other.
 *
 * Values are jansson values (strings, numbers, lists, dicts as JSON has them) tagged with the
 * kinds JSON lacks: undefined, a namespace (a dict whose attributes may be assigned), a loop
 * object, a macro, a global function and a bound method.  A list that Python would hold as a
 * tuple (a literal "(a, b)", a dict's items, groupby's groups) is marked in the render's tag
 * table by its address, so it prints and formats as a tuple.  Every json_t a render touches is
 * held in the render's pool and released at its end (or a loop iteration's), so the evaluator
 * never counts references.  We rejected a value type of our own: lists and dicts would need a
 * second container library and a converter both ways.
 */
#ifndef SM_JINJA_INT_H
#define SM_JINJA_INT_H
#include <stdint.h>
#include "jinja/jinja.h"

enum jtok { JT_TEXT, JT_VBEGIN, JT_VEND, JT_BBEGIN, JT_BEND, JT_NAME, JT_STR, JT_INT, JT_FLOAT, JT_OP, JT_EOF };

typedef struct jtoken {
    int kind;                  /* enum jtok */
    char *s;                   /* text, name, decoded string or operator (malloc'd, NUL-terminated) */
    size_t n;                  /* bytes of s */
    long long i;               /* JT_INT value */
    double f;                  /* JT_FLOAT value */
    int line, col;             /* 1-based position in the template */
} jtoken;

/* Tokens of src (text with whitespace control applied; tags split into tokens; raw blocks as text). */
int sm_jinja_lex(const char *src, size_t n, jtoken **out, int *nout, sm_err *e);
void sm_jinja_tokens_free(jtoken *t, int n);

enum jnk {
    /* statements (a body is a list through next) */
    JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_MACRO, JN_BREAK, JN_CONTINUE, JN_WITH, JN_FILTER_BLOCK, JN_BLOCK,
    /* expressions */
    JN_STR, JN_INT, JN_FLOAT, JN_BOOL, JN_NONE, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER,
    JN_TEST, JN_BIN, JN_NOT, JN_NEG, JN_AND, JN_OR, JN_COND, JN_LIST, JN_TUPLE, JN_DICT, JN_BODY
};

struct jbuiltin;

typedef struct jnode {
    int kind;                  /* enum jnk */
    int line, col;             /* where it starts in the template */
    char *s;                   /* text, name, string, attribute, operator, filter or test name */
    size_t n;                  /* bytes of s */
    long long i;               /* int literal, bool literal, JN_TEST negated, JN_SET 1: a block set */
    double f;                  /* float literal */
    struct jnode *a, *b, *c, *d; /* operands; statements: a expr, b body, c else body, d loop filter */
    struct jnode **kids;       /* [nk] list items, call / filter / test arguments, dict keys and values
                                  alternately, for / set / with targets, macro parameters (a: default) */
    char **kw;                 /* [nk] keyword of each argument (NULL: positional), or NULL */
    int nk;
    const struct jbuiltin *fn; /* JN_FILTER, JN_TEST: the built-in, found at parse time */
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

enum jvk { JV_UNDEF, JV_JSON, JV_NS, JV_LOOP, JV_MACRO, JV_FUNC, JV_METHOD };

struct jframe;

typedef struct jv {
    int k;                     /* enum jvk */
    json_t *j;                 /* JV_JSON / JV_NS / JV_LOOP: the value (a dict for NS and LOOP); JV_METHOD:
                                  the object it is bound to (held by the render's pool) */
    const void *p;             /* JV_MACRO: its jnode; JV_FUNC, JV_METHOD: its struct jbuiltin */
    struct jframe *scope;      /* JV_MACRO: the scope it was defined in (its body's names resolve
                                  there; the macro lives in that scope, so never outlives it) */
} jv;

/* a tuple; groupby's (grouper, list) pair; a dict's keys(), values(), items() views */
enum jtag { JTAG_TUPLE = 1, JTAG_GROUP, JTAG_KEYS, JTAG_VALUES, JTAG_ITEMS };

typedef struct jframe {
    const char **names;        /* [n] variables set in this scope (the strings live in the node tree) */
    jv *vals;                  /* [n] their values */
    int n, cap;
    struct jframe *up;         /* the enclosing scope (NULL: the template's globals) */
} jframe;

typedef struct jctx {
    jframe *f;                 /* the innermost scope */
    jframe *globals;           /* the template's top scope */
    json_t *vars;              /* the caller's variables */
    sm_buf *out;               /* where text goes */
    json_t **pool;             /* [npool] every value held by this render */
    int npool, cappool;
    json_t **tagk;             /* [captag] tagged lists by address (open addressing; each held) */
    unsigned char *tagv;       /* [captag] their enum jtag */
    size_t ntag, captag;
    json_t *undef;             /* what stands for Undefined inside a list (map(attribute=) of a missing key) */
    jv body;                   /* JN_BODY's value: the text of the filter or set block being filtered */
    int raised;                /* the error is the template's raise_exception */
    int ctl;                   /* 1: break, 2: continue pending */
    int depth;                 /* macro call depth (bounded) */
    long long iters;           /* loop iterations so far (bounded: a template cannot hang a request) */
    sm_err *e;
} jctx;

#define MAX_OUT ((size_t)64 << 20) /* bytes one render may write, and the longest string it may make */

/* ---- values (jinja_value.c) -------------------------------------------------------------- */
extern const jv JV_UNDEFINED;
jv jv_own(jctx *c, json_t *j);               /* wrap a new reference (NULL: out of memory -> undefined, error set) */
jv jv_borrow(jctx *c, json_t *j);            /* wrap a borrowed reference (NULL: undefined) */
jv jv_str(jctx *c, const char *s, size_t n);
jv jv_buf(jctx *c, sm_buf *b);               /* b's text as a string; frees b */
jv jv_int(jctx *c, long long x);
jv jv_real(jctx *c, double x);
jv jv_bool(jctx *c, int x);
jv jv_none(jctx *c);
jv jv_list(jctx *c);                         /* a new empty list */
jv jv_elem(const jctx *c, json_t *x);        /* an item of a list as a value (the Undefined stand-in: undefined) */
json_t *jv_json(jctx *c, const jnode *at, jv v); /* v as an item a list can hold (borrowed); NULL: it cannot */
int jv_is_str(jv v);
int jv_is_list(jv v);
int jv_is_dict(jv v);                        /* a JSON object (not a namespace or loop) */
int jv_has_attrs(jv v);                      /* a JSON object, namespace or loop: names resolve to its keys */
int jv_truthy(jv v);
int jv_isnum(jv v);                          /* int, float or bool */
int jv_isint(jv v);                          /* an integer or a bool */
long long jv_intv(jv v);
double jv_num(jv v);
int jv_tostr(jctx *c, jv v, sm_buf *out);    /* Python's str(); 0 or -1 (error set) */
int jv_repr(jctx *c, jv v, sm_buf *out);     /* Python's repr() */
int jv_string(jctx *c, jv v, jv *out);       /* str(v) as a string value (v itself when a string) */
int jv_equal(const jctx *c, jv a, jv b);    /* Python's == (a tuple never equals a list) */
int jv_cmp(jctx *c, const jnode *at, jv a, jv b, int *r); /* Python's ordering: *r < 0, 0, > 0; -1 with an error when unordered */
int jv_tag(const jctx *c, const json_t *j);  /* enum jtag of a list, 0 when untagged */
int jv_is_tuple(const jctx *c, const json_t *j); /* a tuple (groupby's pairs too) */
int jv_set_tag(jctx *c, json_t *j, int tag);
jv jv_tuple(jctx *c, json_t *items);         /* items (a new list reference) as a tuple */
/* The items a for loop or a filter walks: a list's items, a dict's keys, a string's characters,
 * nothing for undefined.  *items is a list held by the pool.  0, or -1 (error names at). */
int jv_items(jctx *c, const jnode *at, jv v, json_t **items);
const char *jv_kind_name(jv v);              /* Python's type name ("str", "list", "dict", "int", ...) */
/* json.dumps's options as transformers' tojson passes them */
typedef struct jjson_opts {
    const char *indent;        /* NULL: one line; else the indent of a level ("" after indent=0) */
    const char *item_sep;      /* between items: ", " (one line) or "," (indented), or the caller's */
    const char *key_sep;       /* between a key and its value: ": " or the caller's */
    int sort_keys;             /* keys in code point order, else in their order */
    int ascii;                 /* ensure_ascii: non-ASCII as \uXXXX (surrogate pairs above U+FFFF) */
} jjson_opts;
int jv_tojson(jctx *c, jv v, const jjson_opts *op, int level, sm_buf *out);
void jv_pyfloat(double x, char *b);          /* Python's repr of a float into b [64] */
int jerr(jctx *c, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int joom(jctx *c);                           /* "out of memory", -1 */

/* ---- integers that never wrap (jinja_ops.c) ---------------------------------------------- */
int ji_add(jctx *c, const jnode *at, long long a, long long b, long long *r);
int ji_mul(jctx *c, const jnode *at, long long a, long long b, long long *r);
/* A binary operator op ("+", "in", "==", "%", ...) on a and b with Python's meaning. */
int jv_binop(jctx *c, const jnode *at, const char *op, jv a, jv b, jv *out);
/* Python's fmt % args (printf-style) and fmt.format(*args, **kw) into out. */
int jv_percent(jctx *c, const jnode *at, jv fmt, jv args, jv *out);
int jv_format(jctx *c, const jnode *at, const char *fmt, size_t n, const jv *args, int nargs, char *const *kw,
              const jv *kwv, int nkw, jv *out);

/* ---- text: UTF-8 and Unicode as Python's str has it (jinja_text.c, utf8proc) --------------- */
uint32_t ju_next(const char *s, size_t n, size_t *i); /* the code point at s[*i], *i past it */
int ju_put(sm_buf *b, uint32_t cp);
size_t ju_len(const char *s, size_t n);      /* code points of s */
int ju_offsets(const char *s, size_t n, size_t **offs, size_t *count); /* [count + 1] code point offsets */
json_t *ju_chars(const char *s, size_t n);   /* a string's characters as a new list; NULL: out of memory */
int ju_isspace(uint32_t cp);                 /* str.isspace() of one character */
int ju_isprintable(uint32_t cp);             /* str.isprintable() of one character (repr() escapes the others) */
int ju_islinebreak(uint32_t cp);             /* a str.splitlines() boundary ("\r\n" counts as one) */
enum ju_case { JU_LOWER, JU_UPPER, JU_TITLE, JU_CAPITALIZE, JU_SWAPCASE };
int ju_case(const char *s, size_t n, int mode, sm_buf *out); /* str.lower() .upper() .title() ... appended */
enum ju_class { JU_ISLOWER, JU_ISUPPER, JU_ISTITLE, JU_ISSPACE, JU_ISALPHA, JU_ISDIGIT, JU_ISDECIMAL, JU_ISALNUM };
int ju_is(const char *s, size_t n, int what); /* str.islower(), .isupper(), ... (enum ju_class) */

#endif
