/* serve_struct.h: structured outputs in the OpenAI API: the request fields that ask for a
 * constrained answer, read into one (kind, spec) pair, and a cache of compiled constraints
 * (include/sparkmono.h: sparkmono_constraint) shared by the requests that ask for the same one.
 *
 * Fields, as vLLM's OpenAI server takes them (both /v1/completions and /v1/chat/completions):
 *   response_format {"type": "text"}                          free text (no constraint)
 *                   {"type": "json_object"}                   json_object
 *                   {"type": "json_schema", "json_schema":
 *                      {"name"?, "schema", "strict"?, "description"?}}   json_schema of "schema"
 *                   any other type (structural_tag, ...)      400 naming the type
 *   structured_outputs {"choice": [..]} / {"regex": ".."} / {"json": schema or its JSON text} /
 *                   {"json_object": true} / {"grammar": ".."} (exactly one), with
 *                   "disable_any_whitespace": bool; "whitespace_pattern" and
 *                   "structural_tag" are refused; "disable_fallback" and
 *                   "disable_additional_properties" are accepted and have no effect
 *   guided_choice, guided_regex, guided_json (a schema or its JSON text), guided_grammar
 *                   (vLLM's older fields); guided_whitespace_pattern is refused unless null;
 *                   guided_decoding_backend is accepted and ignored (logged like unknown fields)
 * A null value is the field left out.  Two sources of a constraint in one request (two guided_*
 * fields, guided_* and response_format, ...) are a 400 naming both.  "grammar" reaches the
 * compiler, whose line says it is not supported.
 * Whitespace in JSON: compact unless the request sets structured_outputs.disable_any_whitespace
 * to false, which allows whitespace between JSON tokens as vLLM does by default.  We chose
 * compact as our default: a model may otherwise fill its whole budget with whitespace, and
 * compact JSON is what every client parses the same way.
 *
 * The cache: SM_STRUCT_CACHE compiled constraints keyed by (kind, spec bytes, any_whitespace),
 * least recently used evicted first, under one mutex; a lookup hands out a reference of its own
 * (the cache's entry may be evicted while a request still runs with it).  A repeated schema
 * reuses the compiled automaton and the token masks it has made.  Compiling happens outside
 * the mutex, so a large schema does not stall the other connections; two connections compiling
 * the same spec at once keep the first one cached.  We rejected one compile a request: a server
 * answering the same schema thousands of times would rebuild its masks each time.
 */
#ifndef SM_SERVE_STRUCT_H
#define SM_SERVE_STRUCT_H
#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include "base/err.h"
#include "sparkmono.h"

#define SM_STRUCT_CACHE 64     /* compiled constraints kept */
#define SM_STRUCT_PARAM 64     /* bytes of a field name (as SM_API_PARAM) */

/* The constraint a request asks for, as read from its fields (not yet compiled). */
typedef struct sm_struct_req {
    char kind[16];             /* "regex", "json_schema", "json_object", "choice", "grammar"; "" none */
    char *spec;                /* [len] its text (malloc'd; NULL for json_object) */
    size_t len;
    int any_whitespace;        /* JSON kinds: whitespace between tokens allowed */
    char field[SM_STRUCT_PARAM]; /* the field it came from ("guided_json", "response_format", ...) */
} sm_struct_req;

typedef struct sm_struct_entry {
    char kind[16];
    char *spec;                /* [len] (malloc'd; NULL for json_object) */
    size_t len;
    int any_whitespace;
    sparkmono_constraint *c;   /* the cache's reference */
    unsigned long long used;   /* the tick of its last lookup */
} sm_struct_entry;

typedef struct sm_struct_cache {
    sparkmono_model *m;        /* the model constraints are compiled for (outlives the cache) */
    pthread_mutex_t mu;        /* guards the fields below */
    sm_struct_entry e[SM_STRUCT_CACHE];
    int n;                     /* entries in use */
    unsigned long long tick;   /* lookups so far */
    long long hits, compiled;  /* lookups answered from the cache, constraints compiled */
} sm_struct_cache;

/* Field k of a request body with value v: 1 when k is one of the fields above (sr updated; a
 * guided_decoding_backend is added to ignored [SM_FIELDS_IGNORED]), 0 when it is not, -1 on a
 * bad value or a second source (e: one line naming the field; param [SM_STRUCT_PARAM]: k). */
int sm_struct_field(const char *k, const json_t *v, sm_struct_req *sr, char *ignored, char *param, sm_err *e);
/* sr's constraint compiled through cache c: 0 with *out a new reference (NULL when sr asks for
 * none), or -1 with *status (400: the compiler's line, naming the field; 500: out of memory),
 * param and e. */
int sm_struct_compile(sm_struct_cache *c, const sm_struct_req *sr, sparkmono_constraint **out, int *status, char *param,
                      sm_err *e);
void sm_struct_req_free(sm_struct_req *sr);

/* An empty cache over model m. */
void sm_struct_cache_init(sm_struct_cache *c, sparkmono_model *m);
/* Constraints compiled, lookups answered from the cache, and entries now (any thread). */
void sm_struct_cache_counts(sm_struct_cache *c, long long *compiled, long long *hits, int *cached);
/* Drop every cached reference (before the model closes). */
void sm_struct_cache_free(sm_struct_cache *c);

#endif
