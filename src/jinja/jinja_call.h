/* jinja_call.h: the one interface between the Jinja evaluator and the built-ins (filters,
 * tests, methods of str / list / dict / loop, global functions).  Each built-in is a row of a
 * table: its name, its kind, the parameters it takes by name and a function of one call.  The
 * parser finds a filter's or test's row once (jnode.fn) and refuses names no row has; the
 * evaluator binds a call's arguments to the row's parameters (jb_call) and runs it.  Internal
 * to src/jinja/.
 *
 * We rejected a chain of strcmp in one function per kind (the renderer's first form): the
 * evaluator and the built-ins had to call each other's internals, and every built-in parsed
 * its own arguments, so a wrong keyword was ignored here and an error in Jinja2.
 */
#ifndef SM_JINJA_CALL_H
#define SM_JINJA_CALL_H
#include "jinja/jinja_int.h"

enum jbk { JB_FILTER, JB_TEST, JB_METHOD, JB_FUNCTION };
enum jbm { JM_STR = 1, JM_LIST = 2, JM_DICT = 4, JM_LOOP = 8 }; /* a method's receivers */

#define JB_MAXP 6 /* named parameters a built-in may have */

struct jbuiltin;

/* One call of a built-in, its arguments bound. */
typedef struct jcall {
    jctx *c;
    const jnode *at;           /* the call's node (errors name its line and column) */
    const struct jbuiltin *b;
    jv self;                   /* the filtered or tested value, the method's receiver (functions: undefined) */
    jv p[JB_MAXP];             /* b->params' values by position (JV_UNDEF: not given) */
    const jv *rest;            /* [nrest] variadic: positional arguments past the parameters */
    int nrest;
    char *const *kwn;          /* [nkw] variadic: keyword arguments no parameter takes, and their values */
    const jv *kwv;
    int nkw;
} jcall;

typedef struct jbuiltin {
    const char *name;
    int kind;                  /* enum jbk */
    int on;                    /* JB_METHOD: enum jbm receivers it applies to */
    int (*fn)(jcall *k, jv *out); /* 0 and *out, or -1 with the error set (tests: *out a bool) */
    const char *params[JB_MAXP]; /* its parameters after the value, in order (NULL ends) */
    int variadic;              /* 1: more positional and keyword arguments go to rest / kw */
} jbuiltin;

/* The tables, each ended by a row with name NULL (jinja_filter.c, jinja_method.c, jinja_builtin.c). */
extern const jbuiltin jb_filters[], jb_tests[], jb_methods[], jb_functions[];

const jbuiltin *jb_find(int kind, const char *name);  /* NULL: not supported */
int jb_receiver(jv v);                                 /* enum jbm of v, 0: no methods */
const jbuiltin *jb_method(jv self, const char *name);  /* self's method name; NULL: none here */
/* What Python's attribute name of v is (ImmutableSandboxedEnvironment's getattr): 1 a method
 * it may call, -1 a method the sandbox hides (a mutating one: undefined), 0 no such method. */
int jb_attr_kind(jv v, const char *name);
/* obj.name (dot: getattr first, then the item) or obj[key] (the item first, then getattr), as
 * the sandbox does it: a dict's key, a namespace's or loop's attribute, a list's or string's
 * index, groupby's .grouper / .list, a bound method (JV_METHOD), else undefined; obj
 * undefined is an error.  dot 2: getattr alone (the attr filter). */
int jb_getattr(jctx *c, const jnode *at, jv obj, jv key, int dot, jv *out);
/* make_attrgetter: item's attribute path ("a.b.0": keys and indices; an integer: an index). */
int jb_attr_path(jctx *c, const jnode *at, jv item, jv path, jv *out);
/* Call b on self with args [nargs] (kw[i]: the keyword of args[i], or NULL): bind them to its
 * parameters (too many, an unknown or a repeated keyword: an error naming the built-in), run it. */
int jb_call(jctx *c, const jnode *at, const jbuiltin *b, jv self, const jv *args, char *const *kw, int nargs,
            jv *out);

/* str methods the filters share (jinja_method.c).  s.strip(chars) on ends 1 left, 2 right, 3
 * both (chars undefined or None: whitespace); s.replace(old, new, count) (count < 0: all);
 * the lines of s [n] as str.splitlines(keep) finds them (\n, \r, \r\n, \v, \f, \x1c-\x1e,
 * \x85, U+2028, U+2029), appended to list l; s.center / ljust / rjust (how 'c', 'l', 'r') or
 * zfill ('z') to width. */
int jm_strip(jctx *c, const jnode *at, jv s, jv chars, int ends, jv *out);
int jm_replace(jctx *c, const jnode *at, jv s, jv from, jv to, long long count, jv *out);
int jm_splitlines(jctx *c, const char *s, size_t n, int keep, json_t *l);
int jm_pad(jctx *c, const jnode *at, jv s, jv width, jv fillchar, char how, jv *out);

#endif
