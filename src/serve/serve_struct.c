/* serve_struct.c: the structured-output fields of a request and the cache of compiled
 * constraints (see serve_struct.h).
 *
 * Each field is checked for its shape here and read into one (kind, spec text) pair; the spec's
 * own checks (a regex's syntax, a schema's keywords, a choice's strings) are the compiler's, so
 * its line is what the client reads.  A schema given as an object is dumped compactly in its
 * own key order (the order of the properties in the answer).  We rejected compiling while the
 * fields are read: every other field of the body is checked first, so a bad max_tokens costs no
 * compile.
 */
#include "serve/serve_struct.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "serve/serve_fields.h"

/* A 400 naming field (param) with the line fmt; -1. */
static int __attribute__((format(printf, 4, 5))) bad(char *param, sm_err *e, const char *field, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    snprintf(param, SM_STRUCT_PARAM, "%s", field);
    return -1;
}

/* sr := (kind, spec [len]) from field; a second source is a 400 naming both.  1, or -1. */
static int set(sm_struct_req *sr, const char *field, const char *kind, const char *spec, size_t len, int ws, char *param,
               sm_err *e) {
    if (sr->kind[0])
        return bad(param, e, field, "'%s' and '%s' both ask for a structured output; send only one of them", sr->field,
                   field);
    char *copy = NULL;
    if (spec) {
        if (!(copy = malloc(len + 1))) return bad(param, e, field, "out of memory for '%s'", field);
        memcpy(copy, spec, len);
        copy[len] = 0;
    }
    snprintf(sr->kind, sizeof sr->kind, "%s", kind);
    sr->spec = copy;
    sr->len = len;
    sr->any_whitespace = ws;
    snprintf(sr->field, sizeof sr->field, "%s", field);
    return 1;
}

/* A JSON value dumped as spec text of kind (an array, an object or a boolean). */
static int set_dumped(sm_struct_req *sr, const char *field, const char *kind, const json_t *v, int ws, char *param,
                      sm_err *e) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return bad(param, e, field, "out of memory for '%s'", field);
    int rc = set(sr, field, kind, s, strlen(s), ws, param, e);
    free(s);
    return rc;
}

/* A JSON Schema: an object or a boolean, or its JSON text (the compiler parses it). */
static int set_schema(sm_struct_req *sr, const char *field, const json_t *v, int ws, char *param, sm_err *e) {
    if (json_is_string(v)) return set(sr, field, "json_schema", json_string_value(v), json_string_length(v), ws, param, e);
    if (!json_is_object(v) && !json_is_boolean(v))
        return bad(param, e, field, "'%s' must be a JSON Schema (an object) or its JSON text", field);
    return set_dumped(sr, field, "json_schema", v, ws, param, e);
}

/* A choice: a non-empty list of strings. */
static int set_choice(sm_struct_req *sr, const char *field, const json_t *v, char *param, sm_err *e) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(param, e, field, "'%s' must be a non-empty list of strings", field);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_string(json_array_get(v, i)))
            return bad(param, e, field, "'%s' entry %zu is not a string", field, i);
    return set_dumped(sr, field, "choice", v, 0, param, e);
}

/* A regex or a grammar: a string. */
static int set_text(sm_struct_req *sr, const char *field, const char *kind, const json_t *v, char *param, sm_err *e) {
    if (!json_is_string(v)) return bad(param, e, field, "'%s' must be a string", field);
    return set(sr, field, kind, json_string_value(v), json_string_length(v), 0, param, e);
}

/* response_format: text (none), json_object, json_schema; another type is a 400 naming it. */
static int response_format(const json_t *v, sm_struct_req *sr, char *param, sm_err *e) {
    const char *f = "response_format";
    const json_t *ty = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(ty))
        return bad(param, e, f, "'response_format' must be an object {\"type\": \"text\" | \"json_object\" | "
                   "\"json_schema\", ...}");
    const char *t = json_string_value(ty);
    if (!strcmp(t, "text")) return 1;
    if (!strcmp(t, "json_object")) return set(sr, f, "json_object", NULL, 0, 0, param, e);
    if (strcmp(t, "json_schema"))
        return bad(param, e, f, "'response_format' of type '%.40s' is not supported (text, json_object, json_schema)", t);
    /* {"name", "schema", "strict", "description"}: the schema is the one that acts */
    const json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js))
        return bad(param, e, f, "'response_format' of type 'json_schema' needs 'json_schema': {\"name\": ..., "
                   "\"schema\": {...}}");
    const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict"),
                 *desc = json_object_get(js, "description"), *schema = json_object_get(js, "schema");
    if (name && !json_is_null(name) && !json_is_string(name))
        return bad(param, e, f, "'response_format.json_schema.name' must be a string");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return bad(param, e, f, "'response_format.json_schema.strict' must be true or false");
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return bad(param, e, f, "'response_format.json_schema.description' must be a string");
    if (!schema || json_is_null(schema))
        return bad(param, e, f, "'response_format.json_schema.schema' is required: the JSON Schema the answer follows");
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return bad(param, e, f, "'response_format.json_schema.schema' must be a JSON Schema (an object)");
    return set_dumped(sr, "response_format.json_schema.schema", "json_schema", schema, 0, param, e);
}

/* vLLM's structured_outputs object: exactly one of its kinds, and its options. */
static int structured_outputs(const json_t *v, sm_struct_req *sr, char *param, sm_err *e) {
    const char *f = "structured_outputs";
    static const char *const kinds[] = {"choice", "regex", "json", "grammar", "json_object"};
    if (!json_is_object(v))
        return bad(param, e, f, "'structured_outputs' must be an object with one of choice, regex, json, grammar, "
                   "json_object");
    /* every key known, each option of its type */
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        int kind = 0;
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) kind |= !strcmp(k, kinds[i]);
        if (kind || json_is_null(x)) continue;
        if (!strcmp(k, "disable_any_whitespace") || !strcmp(k, "disable_fallback") ||
            !strcmp(k, "disable_additional_properties")) {
            if (!json_is_boolean(x)) return bad(param, e, f, "'structured_outputs.%s' must be true or false", k);
        } else if (!strcmp(k, "whitespace_pattern")) {
            return bad(param, e, f, "'structured_outputs.whitespace_pattern' is not supported by this server (JSON is "
                       "compact, or takes any whitespace with \"disable_any_whitespace\": false)");
        } else if (!strcmp(k, "structural_tag")) {
            return bad(param, e, f, "'structured_outputs.structural_tag' is not supported by this server (choice, "
                       "regex, json, json_object)");
        } else {
            return bad(param, e, f, "'structured_outputs' has an unknown key '%.40s' (choice, regex, json, grammar, "
                       "json_object, disable_any_whitespace)", k);
        }
    }
    /* exactly one kind (json_object false: none) */
    const char *one = NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const json_t *y = json_object_get(v, kinds[i]);
        if (!y || json_is_null(y) || json_is_false(y)) continue;
        if (one)
            return bad(param, e, f, "'structured_outputs' holds both '%s' and '%s': give exactly one of choice, regex, "
                       "json, grammar, json_object", one, kinds[i]);
        one = kinds[i];
    }
    if (!one)
        return bad(param, e, f, "'structured_outputs' needs one of choice, regex, json, grammar, json_object");
    const json_t *y = json_object_get(v, one), *daw = json_object_get(v, "disable_any_whitespace");
    const int ws = json_is_false(daw); /* asked for explicitly: vLLM's default, any whitespace */
    if (!strcmp(one, "choice")) return set_choice(sr, "structured_outputs.choice", y, param, e);
    if (!strcmp(one, "regex")) return set_text(sr, "structured_outputs.regex", "regex", y, param, e);
    if (!strcmp(one, "grammar")) return set_text(sr, "structured_outputs.grammar", "grammar", y, param, e);
    if (!strcmp(one, "json")) return set_schema(sr, "structured_outputs.json", y, ws, param, e);
    if (!json_is_true(y))
        return bad(param, e, "structured_outputs.json_object", "'structured_outputs.json_object' must be true or false");
    return set(sr, "structured_outputs.json_object", "json_object", NULL, 0, ws, param, e);
}

int sm_struct_field(const char *k, const json_t *v, sm_struct_req *sr, char *ignored, char *param, sm_err *e) {
    int known = !strcmp(k, "response_format") || !strcmp(k, "structured_outputs") || !strncmp(k, "guided_", 7);
    if (!known) return 0;
    if (json_is_null(v)) return 1; /* the field left out */
    if (!strcmp(k, "response_format")) return response_format(v, sr, param, e);
    if (!strcmp(k, "structured_outputs")) return structured_outputs(v, sr, param, e);
    if (!strcmp(k, "guided_choice")) return set_choice(sr, k, v, param, e);
    if (!strcmp(k, "guided_regex")) return set_text(sr, k, "regex", v, param, e);
    if (!strcmp(k, "guided_json")) return set_schema(sr, k, v, 0, param, e);
    if (!strcmp(k, "guided_grammar")) return set_text(sr, k, "grammar", v, param, e);
    if (!strcmp(k, "guided_whitespace_pattern"))
        return bad(param, e, k, "'guided_whitespace_pattern' is not supported by this server (JSON is compact)");
    if (!strcmp(k, "guided_decoding_backend")) { /* the server has one backend: named in the log, as unknown fields */
        sm_fields_ignore(ignored, k);
        return 1;
    }
    return 0; /* another guided_* name: an unknown field */
}

void sm_struct_req_free(sm_struct_req *sr) {
    free(sr->spec);
    memset(sr, 0, sizeof *sr);
}

/* ---- the cache -------------------------------------------------------------------------- */

void sm_struct_cache_init(sm_struct_cache *c, sparkmono_model *m) {
    memset(c, 0, sizeof *c);
    c->m = m;
    pthread_mutex_init(&c->mu, NULL);
}

void sm_struct_cache_free(sm_struct_cache *c) {
    if (!c->m) return;
    for (int i = 0; i < c->n; i++) {
        sparkmono_constraint_release(c->e[i].c);
        free(c->e[i].spec);
    }
    pthread_mutex_destroy(&c->mu);
    memset(c, 0, sizeof *c);
}

void sm_struct_cache_counts(sm_struct_cache *c, long long *compiled, long long *hits, int *cached) {
    *compiled = *hits = 0;
    *cached = 0;
    if (!c || !c->m) return;
    pthread_mutex_lock(&c->mu);
    *compiled = c->compiled;
    *hits = c->hits;
    *cached = c->n;
    pthread_mutex_unlock(&c->mu);
}

/* The entry of sr, or NULL.  Under the mutex. */
static sm_struct_entry *find_locked(sm_struct_cache *c, const sm_struct_req *sr) {
    for (int i = 0; i < c->n; i++) {
        sm_struct_entry *x = &c->e[i];
        if (!strcmp(x->kind, sr->kind) && x->len == sr->len && x->any_whitespace == sr->any_whitespace &&
            (!sr->len || !memcmp(x->spec, sr->spec, sr->len)))
            return x;
    }
    return NULL;
}

/* The entry of sr, used now, with a reference for the caller; NULL when none.  Under the mutex. */
static sparkmono_constraint *take_locked(sm_struct_cache *c, const sm_struct_req *sr) {
    sm_struct_entry *x = find_locked(c, sr);
    if (!x) return NULL;
    x->used = ++c->tick;
    sparkmono_constraint_retain(x->c);
    return x->c;
}

int sm_struct_compile(sm_struct_cache *c, const sm_struct_req *sr, sparkmono_constraint **out, int *status, char *param,
                      sm_err *e) {
    *out = NULL;
    if (!sr->kind[0]) return 0;
    if (!c || !c->m) {
        *status = 400;
        return bad(param, e, sr->field, "'%s': this server does not compile structured outputs", sr->field);
    }
    /* a cached one */
    pthread_mutex_lock(&c->mu);
    *out = take_locked(c, sr);
    if (*out) c->hits++;
    pthread_mutex_unlock(&c->mu);
    if (*out) return 0;
    /* compile outside the mutex */
    sparkmono_constraint *k = NULL;
    sm_status st = sparkmono_constraint_create(c->m, sr->kind, sr->spec, sr->len, sr->any_whitespace, &k);
    if (st != SM_OK) {
        *status = st == SM_E_NOMEM ? 500 : 400;
        return bad(param, e, sr->field, "'%s': %s", sr->field, sparkmono_errmsg());
    }
    /* keep it, unless a racing compile of the same spec got there first */
    pthread_mutex_lock(&c->mu);
    c->compiled++;
    if ((*out = take_locked(c, sr)) != NULL) {
        pthread_mutex_unlock(&c->mu);
        sparkmono_constraint_release(k);
        return 0;
    }
    char *spec = NULL;
    if (sr->spec && (spec = malloc(sr->len + 1)) != NULL) {
        memcpy(spec, sr->spec, sr->len);
        spec[sr->len] = 0;
    }
    if (!sr->spec || spec) { /* out of memory for the key: used uncached */
        const int full = c->n == SM_STRUCT_CACHE;
        int slot = full ? 0 : c->n++;
        for (int i = 1; full && i < c->n; i++) /* full: the least recently used goes */
            if (c->e[i].used < c->e[slot].used) slot = i;
        sm_struct_entry *x = &c->e[slot];
        if (x->c) { /* requests running with it keep their references */
            sparkmono_constraint_release(x->c);
            free(x->spec);
        }
        *x = (sm_struct_entry){{0}, spec, sr->len, sr->any_whitespace, k, ++c->tick};
        snprintf(x->kind, sizeof x->kind, "%s", sr->kind);
        sparkmono_constraint_retain(k);
    }
    pthread_mutex_unlock(&c->mu);
    *out = k;
    return 0;
}
