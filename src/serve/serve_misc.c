/* serve_misc.c: POST /tokenize, POST /detokenize, GET /version and the API key's checks (see
 * serve_misc.h).  The bodies are checked like a completion's: a JSON object of known fields
 * ("model", and "prompt" or "tokens"), anything else a 400 naming it; the text goes through
 * sm_api_encode, the very function /v1/completions encodes with, so /tokenize counts exactly
 * the tokens a completion's prompt will have.  We rejected accepting vLLM's extra fields
 * (add_special_tokens, messages): this server adds no special token and has no chat template
 * engine, so either would be silently ignored.
 */
#include "serve/serve_misc.h"
#include "serve/serve_http.h"
#include <arpa/inet.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The error body of status (400, 404 or 500): msg names the field. */
static int fail(char **out, int status, const char *msg, const char *param) {
    *out = sm_api_error(msg, sm_api_error_type((unsigned)status), param, status == 404 ? "model_not_found" : NULL);
    return status;
}

/* v as compact JSON text (malloc'd; NULL when out of memory); v is released. */
static char *dump(json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

/* The body as a JSON object of the fields "model" and want; *v the field want (NULL when
 * absent).  0, or the status with *out the error body. */
static int parse(const sm_api_model *m, const char *body, size_t len, const char *want, json_t **root, json_t **v,
                 char **out) {
    char msg[400];
    json_error_t je;
    *v = NULL;
    *root = sm_api_load(body ? body : "", len, &je);
    if (!*root) {
        snprintf(msg, sizeof msg, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return fail(out, 400, msg, NULL);
    }
    if (!json_is_object(*root)) return fail(out, 400, "the body must be a JSON object", NULL);
    const char *k;
    json_t *f;
    json_object_foreach(*root, k, f) {
        if (!strcmp(k, want)) {
            *v = f;
        } else if (!strcmp(k, "model")) {
            if (!json_is_string(f)) return fail(out, 400, "'model' must be a string", "model");
            if (!sm_api_is_model(m, f)) {
                snprintf(msg, sizeof msg, "The model '%.200s' does not exist (this server serves '%s')",
                         json_string_value(f), m->name);
                return fail(out, 404, msg, "model");
            }
        } else {
            snprintf(msg, sizeof msg, "unknown field '%.64s' (this endpoint takes 'model' and '%s')", k, want);
            return fail(out, 400, msg, NULL);
        }
    }
    if (!*v) {
        snprintf(msg, sizeof msg, "'%s' is required", want);
        return fail(out, 400, msg, want);
    }
    return 0;
}

/* A JSON array of the ids [n]. */
static json_t *id_array(const int *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

int sm_misc_tokenize(const sm_api_model *m, const char *body, size_t len, char **out) {
    json_t *root, *v;
    int st = parse(m, body, len, "prompt", &root, &v, out);
    if (!st && !json_is_string(v)) st = fail(out, 400, "'prompt' must be a string", "prompt");
    int *ids = NULL, n = 0;
    sm_err e = {{0}};
    if (!st && sm_api_encode(m, json_string_value(v), json_string_length(v), &ids, &n, &e)) st = fail(out, 400, e.msg, "prompt");
    if (!st) {
        json_t *a = id_array(ids, n);
        *out = a ? dump(json_pack("{s:o, s:i, s:i}", "tokens", a, "count", n, "max_model_len", m->max_len)) : NULL;
        st = 200;
    }
    free(ids);
    json_decref(root);
    return st;
}

int sm_misc_detokenize(const sm_api_model *m, const char *body, size_t len, char **out) {
    json_t *root, *v;
    char msg[200];
    int st = parse(m, body, len, "tokens", &root, &v, out);
    if (!st && !json_is_array(v)) st = fail(out, 400, "'tokens' must be a list of token ids", "tokens");
    if (!st && !m->tok)
        st = fail(out, 400, "this model directory has no tokenizer.json: token ids cannot be turned into text", "tokens");
    size_t n = st ? 0 : json_array_size(v);
    int *ids = malloc((n ? n : 1) * sizeof(int));
    if (!st && !ids) st = fail(out, 500, "out of memory", NULL);
    for (size_t i = 0; !st && i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) {
            snprintf(msg, sizeof msg, "'tokens' index %zu is not an integer", i);
            st = fail(out, 400, msg, "tokens");
        } else if (json_integer_value(x) < 0 || json_integer_value(x) >= m->vocab) {
            snprintf(msg, sizeof msg, "'tokens' index %zu is %lld, outside the vocabulary [0, %d)", i,
                     (long long)json_integer_value(x), m->vocab);
            st = fail(out, 400, msg, "tokens");
        } else {
            ids[i] = (int)json_integer_value(x);
        }
    }
    if (!st) {
        char *text = NULL;
        size_t tl = 0;
        sm_err e = {{0}};
        sm_buf b = {0}; /* a list may end inside a character: repair it as a completion's text */
        if (sm_tokenizer_decode(m->tok, ids, (int)n, &text, &tl, &e)) {
            st = fail(out, 400, e.msg, "tokens");
        } else {
            *out = sm_utf8_sanitize(&b, text ? text : "", tl) ? NULL
                   : dump(json_pack("{s:s%}", "prompt", b.p ? b.p : "", b.n));
            st = 200;
        }
        free(text);
        sm_buf_free(&b);
    }
    free(ids);
    json_decref(root);
    return st;
}

char *sm_misc_version(void) { return dump(json_pack("{s:s}", "version", sparkmono_version())); }

char *sm_serve_metrics(sm_server *s) {
    sm_metrics_now now = {0};
    long long tokens, steps;
    sm_sched_counts(&s->sched, &now.running, &now.queued, &tokens, &steps);
    now.tokens = tokens;
    now.steps = steps;
    now.drafts = __atomic_load_n(&s->sched.req_steps, __ATOMIC_RELAXED) * (s->o->request_rows - 1);
    now.accepted = __atomic_load_n(&s->sched.accepted, __ATOMIC_RELAXED);
    now.step_time = &s->sched.step_time;
    sm_sched_cache(&s->sched, &now.cache);
    sm_struct_cache_counts(s->api.cons, &now.cons_compiled, &now.cons_hits, &now.cons_cached);
    return sm_metrics_text(&s->met, &now);
}

int sm_misc_key_ok(const char *key, const char *auth) {
    static const char BEARER[] = "Bearer ";
    if (!auth || strncmp(auth, BEARER, sizeof BEARER - 1)) return 0;
    auth += sizeof BEARER - 1;
    /* every byte of the longer of the two is read whatever the others hold: the time says
     * nothing about where the first difference is (only, at most, the given key's length) */
    size_t kn = strlen(key), an = strlen(auth), n = kn > an ? kn : an;
    unsigned char d = kn != an;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)((i < kn ? key[i] : 0) ^ (i < an ? auth[i] : 0));
    return d == 0;
}

int sm_misc_key_guards(const char *url) { return !strncmp(url, "/v1/", 4) || !strcmp(url, "/v1"); }

int sm_misc_loopback(const char *host) {
    unsigned char a[16];
    if (!strcmp(host, "localhost")) return 1;
    if (inet_pton(AF_INET, host, a) == 1) return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) == 1) {
        static const unsigned char one[16] = {[15] = 1};
        static const unsigned char v4map[12] = {[10] = 0xff, [11] = 0xff};
        return !memcmp(a, one, 16) || (!memcmp(a, v4map, 12) && a[12] == 127);
    }
    return 0;
}
