/* serve_api.c: the OpenAI completions API's JSON (see serve_api.h), with jansson.
 *
 * The parser walks the body's fields once against a table of known names; each known field
 * has its own check.  Responses are built as jansson values and dumped compactly, so every
 * string is escaped by one well-tested encoder (text is valid UTF-8 by then: serve_text.c
 * repairs it).  We rejected printf-built JSON: one missed escape and a client's parser fails.
 */
#include "serve/serve_api.h"
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ---------------------------------------------------------------------------- */

typedef struct parse_ctx {
    const sm_api_model *m;
    sm_api_req *r;
    int *status;
    char *param;
    sm_err *e;
    int keep;                  /* truncate_prompt_tokens: a prompt's last ids kept (0: all) */
} parse_ctx;

json_t *sm_api_load(const char *body, size_t len, json_error_t *je) {
    return json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, je);
}

int sm_api_is_model(const sm_api_model *m, const json_t *name) {
    const size_t n = strlen(m->name);
    return json_string_length(name) == n && !memcmp(json_string_value(name), m->name, n);
}

/* truncate_prompt_tokens: ids [*n] cut to their last c->keep (a prompt made shorter keeps its end,
 * as vLLM truncates on the left). */
static void truncate_ids(const parse_ctx *c, int *ids, int *n) {
    if (c->keep <= 0 || *n <= c->keep) return;
    memmove(ids, ids + (*n - c->keep), (size_t)c->keep * sizeof(int));
    *n = c->keep;
}

/* A 400 naming field name (the message is printf'd). */
static int __attribute__((format(printf, 3, 4))) bad(parse_ctx *c, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->e->msg, sizeof c->e->msg, fmt, ap);
    va_end(ap);
    *c->status = 400;
    snprintf(c->param, SM_API_PARAM, "%s", name);
    return -1;
}

/* A number field: finite, within [lo, hi]. */
static int get_number(parse_ctx *c, const char *name, const json_t *v, double lo, double hi, double *out) {
    if (!json_is_number(v)) return bad(c, name, "'%s' must be a number in [%g, %g]", name, lo, hi);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return bad(c, name, "'%s' is %g; it must be in [%g, %g]", name, x, lo, hi);
    *out = x;
    return 0;
}

/* An integer field within [lo, hi]. */
static int get_int(parse_ctx *c, const char *name, const json_t *v, long long lo, long long hi, long long *out) {
    if (!json_is_integer(v) && lo == LLONG_MIN && hi == LLONG_MAX) return bad(c, name, "'%s' must be an integer", name);
    if (!json_is_integer(v)) return bad(c, name, "'%s' must be an integer in [%lld, %lld]", name, lo, hi);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return bad(c, name, "'%s' is %lld; it must be in [%lld, %lld]", name, x, lo, hi);
    *out = x;
    return 0;
}

/* The ids of prompt a (a JSON array of integers in [0, V)) into *ids [*n]; where names the
 * prompt in messages ("'prompt'", or "'prompt' entry 2" of a list). */
static int get_ids(parse_ctx *c, const json_t *a, const char *where, int **out, int *nout) {
    size_t n = json_array_size(a);
    if (n == 0) return bad(c, "prompt", "%s is an empty list", where);
    if (n > (size_t)c->m->max_len && !c->keep)
        return bad(c, "prompt", "%s has %zu tokens, more than the model's maximum context length of %d", where, n,
                   c->m->max_len);
    int *ids = malloc(n * sizeof(int));
    if (!ids) return bad(c, "prompt", "out of memory for a prompt of %zu tokens", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) {
            free(ids);
            return bad(c, "prompt", "%s token index %zu is not an integer", where, i);
        }
        long long x = json_integer_value(v);
        if (x < 0 || x >= c->m->vocab) {
            free(ids);
            return bad(c, "prompt", "%s token index %zu is %lld, outside the vocabulary [0, %d)", where, i, x,
                       c->m->vocab);
        }
        ids[i] = (int)x;
    }
    *out = ids;
    *nout = (int)n;
    truncate_ids(c, ids, nout);
    return 0;
}

int sm_api_encode(const sm_api_model *m, const char *text, size_t len, int **ids, int *n, sm_err *e) {
    *ids = NULL;
    *n = 0;
    if (!m->tok) return sm_errf(e, "this model directory has no tokenizer.json: give the prompt as a list of token ids");
    if (len == 0) return sm_errf(e, "'prompt' is an empty string");
    sm_err te = {{0}};
    if (sm_tokenizer_encode(m->tok, text, len, ids, n, &te)) return sm_errf(e, "'prompt' cannot be tokenized: %s", te.msg);
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return sm_errf(e, "'prompt' encodes to no tokens");
    }
    for (int i = 0; i < *n; i++)
        if ((*ids)[i] < 0 || (*ids)[i] >= m->vocab) {
            int bad_id = (*ids)[i];
            free(*ids);
            *ids = NULL;
            return sm_errf(e, "'prompt' encodes to id %d at token %d, outside the model's vocabulary [0, %d)", bad_id, i,
                           m->vocab);
        }
    return 0;
}

/* The ids of text prompt s through the model's tokenizer into *ids [*n] (where: as get_ids). */
static int get_text(parse_ctx *c, const json_t *s, const char *where, int **ids, int *n) {
    sm_err te = {{0}};
    if (sm_api_encode(c->m, json_string_value(s), json_string_length(s), ids, n, &te))
        return strcmp(where, "'prompt'") ? bad(c, "prompt", "%s: %s", where, te.msg) : bad(c, "prompt", "%s", te.msg);
    truncate_ids(c, *ids, n);
    return 0;
}

/* prompt: a string or a list of ids (one prompt), or a list of strings or of lists of ids (a
 * prompt each, as OpenAI takes them). */
static int get_prompt(parse_ctx *c, const json_t *v) {
    sm_api_req *r = c->r;
    if (!json_is_string(v) && !json_is_array(v))
        return bad(c, "prompt", "'prompt' must be a string, a list of token ids, or a list of those");
    const json_t *first = json_array_get(v, 0);
    const int list = json_is_string(first) || json_is_array(first);
    size_t np = list ? json_array_size(v) : 1;
    if (np > SM_API_MAX_CHOICES) /* the choices' limit, checked with n below; this bounds the tables */
        return bad(c, "prompt", "'prompt' holds %zu prompts; this server takes at most %d choices a request", np,
                   c->m->max_choices);
    r->prompt = calloc(np, sizeof *r->prompt);
    r->plen = calloc(np, sizeof *r->plen);
    if (!r->prompt || !r->plen) return bad(c, "prompt", "out of memory for %zu prompts", np);
    r->nprompt = (int)np;
    if (!list) return json_is_string(v) ? get_text(c, v, "'prompt'", &r->prompt[0], &r->plen[0])
                                        : get_ids(c, v, "'prompt'", &r->prompt[0], &r->plen[0]);
    for (size_t p = 0; p < np; p++) {
        const json_t *x = json_array_get(v, p);
        char where[48];
        snprintf(where, sizeof where, "'prompt' entry %zu", p);
        if (json_is_string(first) ? !json_is_string(x) : !json_is_array(x))
            return bad(c, "prompt", "%s is not a %s like entry 0 (a list of prompts holds only strings or only lists "
                       "of token ids)", where, json_is_string(first) ? "string" : "list of token ids");
        if (json_is_string(x) ? get_text(c, x, where, &r->prompt[p], &r->plen[p])
                              : get_ids(c, x, where, &r->prompt[p], &r->plen[p]))
            return -1;
    }
    return 0;
}

static int get_stop(parse_ctx *c, const json_t *v) {
    if (json_is_null(v)) return 0;
    const json_t *one[1] = {v};
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v)) return bad(c, "stop", "'stop' must be a string or a list of strings");
    if (n > SM_MAX_STOP) return bad(c, "stop", "'stop' holds %zu strings; at most %d are allowed", n, SM_MAX_STOP);
    if (n > 0 && !c->m->tok)
        return bad(c, "stop", "'stop' needs text, and this model directory has no tokenizer.json");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? one[0] : json_array_get(v, i);
        if (!json_is_string(s)) return bad(c, "stop", "'stop' entry %zu is not a string", i);
        const size_t len = json_string_length(s);
        if (len == 0) return bad(c, "stop", "'stop' entry %zu is empty", i);
        char *copy = malloc(len + 1); /* its bytes, NUL ones too */
        if (!copy) return bad(c, "stop", "out of memory");
        memcpy(copy, json_string_value(s), len + 1);
        c->r->stop[c->r->nstop] = copy;
        c->r->stop_len[c->r->nstop++] = len;
    }
    return 0;
}

/* A field we know but do not implement: accepted only at its neutral value. */
static int neutral(parse_ctx *c, const char *name, const json_t *v) {
    int ok = json_is_null(v);
    if (!strcmp(name, "suffix")) ok |= json_is_string(v) && json_string_length(v) == 0;
    else if (!strcmp(name, "user")) ok |= json_is_string(v); /* an end-user id: only for logs */
    return ok ? 0 : bad(c, name, "'%s' is not supported by this server (only its default value is accepted)", name);
}

static const char *const NEUTRAL_FIELDS[] = {"suffix", "user"};

/* The checks across fields, once every field is read: the choices' count, each prompt's room
 * for max_tokens, min_tokens. */
static int check_request(parse_ctx *c, long long max_tokens, long long best_of) {
    const sm_api_req *r = c->r;
    const int cap = c->m->max_choices > 0 && c->m->max_choices < SM_API_MAX_CHOICES ? c->m->max_choices
                                                                                  : SM_API_MAX_CHOICES;
    if ((long long)r->nprompt * r->n > cap) { /* every choice must fit in the slots and the queue at once */
        if (r->nprompt == 1)
            return bad(c, "n", "'n' is %d; this server takes at most %d choices a request (its request slots and "
                       "queue)", r->n, cap);
        return bad(c, r->n > 1 ? "n" : "prompt", "%d prompts x 'n' %d is %lld choices; this server takes at most %d "
                   "a request (its request slots and queue)", r->nprompt, r->n, (long long)r->nprompt * r->n, cap);
    }
    if (best_of && best_of != r->n) /* best_of == n returns every choice made: n itself */
        return bad(c, "best_of", "'best_of' is %lld; this server takes only best_of equal to n (%d): it returns every "
                   "choice it generates", best_of, r->n);
    for (int p = 0; p < r->nprompt; p++) {
        const int n = r->plen[p], room = c->m->max_len - n;
        char which[40] = "this prompt";
        if (r->nprompt > 1) snprintf(which, sizeof which, "prompt %d", p);
        const int least = r->echo ? 0 : 1; /* echo: max_tokens 0 is the prompt alone (with its logprobs) */
        if (room < least) /* no room for one generated token: the prompt's fault */
            return bad(c, "prompt", "%s%s has %d tokens; this model's maximum context length is %d tokens (prompt + "
                       "max_tokens), so a prompt may have at most %d", r->nprompt > 1 ? "" : "the prompt",
                       r->nprompt > 1 ? which : "", n, c->m->max_len, c->m->max_len - least);
        if (max_tokens == 0 && !least) continue;
        if (max_tokens < 1 || max_tokens > room)
            return bad(c, "max_tokens", "'max_tokens' is %lld; with %s of %d tokens it must be in [1, %d] (the model's "
                       "maximum context length is %d tokens)%s", max_tokens, which, n, room, c->m->max_len,
                       max_tokens == 0 ? ", or 0 with 'echo': true (the prompt alone)" : "");
    }
    if (r->samp.min_tokens > max_tokens)
        return bad(c, "min_tokens", "'min_tokens' is %d; it must be in [0, max_tokens = %lld]", r->samp.min_tokens,
                   max_tokens);
    return 0;
}

int sm_api_parse_completion(const char *body, size_t len, const sm_api_model *m, sm_api_req *out, int *status,
                            char *param, sm_err *e) {
    memset(out, 0, sizeof *out);
    param[0] = 0;
    parse_ctx c = {m, out, status, param, e, 0};
    json_error_t je;
    json_t *root = sm_api_load(body, len, &je);
    if (!root) {
        *status = 400;
        sm_errf(e, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return -1;
    }
    int rc = -1, have_prompt = 0, continuous_alone = 0;
    out->prompt_lp_k = -1;
    long long max_tokens = SM_API_DEFAULT_MAX_TOKENS;
    double temperature = 1.0, top_p = 1.0; /* OpenAI's defaults */
    long long top_k = 0, seed = 0, n = 1, best_of = 0;
    sm_struct_req sr; /* the structured output asked for, compiled once the rest is checked */
    memset(&sr, 0, sizeof sr);
    if (!json_is_object(root)) {
        bad(&c, "", "the body must be a JSON object");
        goto out;
    }
    /* the model first: a request for another model is a 404 whatever else it holds */
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_string(model)) {
        bad(&c, "model", "'model' must be a string");
        goto out;
    }
    if (model && !sm_api_is_model(m, model)) {
        *status = 404;
        snprintf(param, SM_API_PARAM, "model");
        sm_errf(e, "The model '%.200s' does not exist (this server serves '%s')", json_string_value(model), m->name);
        goto out;
    }
    /* truncate_prompt_tokens before the prompt is read: a prompt is cut as it is read */
    json_t *trunc = json_object_get(root, "truncate_prompt_tokens");
    if (trunc && !json_is_null(trunc)) {
        if (!json_is_integer(trunc) || (json_integer_value(trunc) != -1 &&
                                        (json_integer_value(trunc) < 1 || json_integer_value(trunc) > m->max_len))) {
            bad(&c, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 (the model's maximum context length) or "
                "an integer in [1, %d] (the prompt's last tokens kept)", m->max_len);
            goto out;
        }
        c.keep = json_integer_value(trunc) == -1 ? m->max_len : (int)json_integer_value(trunc);
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int known = 1;
        if (!strcmp(k, "model") || !strcmp(k, "truncate_prompt_tokens")) {
            /* checked above */
        } else if (!strcmp(k, "prompt")) {
            if (get_prompt(&c, v)) goto out;
            have_prompt = 1;
        } else if (!strcmp(k, "max_tokens")) {
            if (!json_is_null(v) && get_int(&c, k, v, LLONG_MIN, LLONG_MAX, &max_tokens)) goto out; /* its range: below */
        } else if (!strcmp(k, "temperature")) {
            if (!json_is_null(v) && get_number(&c, k, v, 0, 2, &temperature)) goto out;
        } else if (!strcmp(k, "top_p")) {
            if (!json_is_null(v) && get_number(&c, k, v, 0, 1, &top_p)) goto out;
            if (!json_is_null(v) && top_p <= 0) { bad(&c, k, "'top_p' must be greater than 0"); goto out; }
        } else if (!strcmp(k, "top_k")) { /* an extension (vLLM's): 0 or -1 means no limit */
            if (!json_is_null(v) && get_int(&c, k, v, -1, 1 << 30, &top_k)) goto out;
        } else if (!strcmp(k, "seed")) {
            if (!json_is_null(v)) {
                if (get_int(&c, k, v, LLONG_MIN, LLONG_MAX, &seed)) goto out;
                out->has_seed = 1;
            }
        } else if (!strcmp(k, "stream")) {
            if (!json_is_null(v) && !json_is_boolean(v)) { bad(&c, k, "'stream' must be true or false"); goto out; }
            out->stream = json_is_true(v);
        } else if (!strcmp(k, "stream_options")) {
            if (json_is_null(v)) continue;
            json_t *u = json_object_get(v, "include_usage"), *cu = json_object_get(v, "continuous_usage_stats");
            if (!json_is_object(v) || json_object_size(v) != (u ? 1u : 0u) + (cu ? 1u : 0u) ||
                (u && !json_is_boolean(u) && !json_is_null(u)) || (cu && !json_is_boolean(cu) && !json_is_null(cu))) {
                bad(&c, k, "'stream_options' must be {\"include_usage\": true|false, \"continuous_usage_stats\": true|false}");
                goto out;
            }
            out->include_usage = json_is_true(u);
            out->continuous_usage = json_is_true(u) && json_is_true(cu); /* vLLM: only with include_usage */
            if (json_is_true(cu) && !out->include_usage) continuous_alone = 1;
        } else if (!strcmp(k, "logprobs")) { /* completions: the number of alternatives, 0..20 */
            long long nlp;
            if (json_is_null(v) || json_is_false(v)) continue;
            if (get_int(&c, k, v, 0, SPARKMONO_MAX_TOP_LOGPROBS, &nlp)) goto out;
            out->samp.logprobs = 1;
            out->lp_k = (int)nlp;
        } else if (!strcmp(k, "prompt_logprobs")) { /* vLLM's: the prompt ids' logprobs, 0..20 alternatives */
            long long nlp;
            if (json_is_null(v)) continue;
            if (get_int(&c, k, v, 0, SPARKMONO_MAX_TOP_LOGPROBS, &nlp)) goto out;
            out->prompt_lp_k = (int)nlp;
        } else if (!strcmp(k, "include_stop_str_in_output") || !strcmp(k, "skip_special_tokens")) {
            if (!json_is_null(v) && !json_is_boolean(v)) { bad(&c, k, "'%s' must be true or false", k); goto out; }
            if (!strcmp(k, "skip_special_tokens")) out->keep_special = json_is_false(v);
            else out->include_stop_str = json_is_true(v);
        } else if (!strcmp(k, "echo")) {
            if (!json_is_null(v) && !json_is_boolean(v)) { bad(&c, k, "'echo' must be true or false"); goto out; }
            out->echo = json_is_true(v);
        } else if (!strcmp(k, "stop")) {
            if (get_stop(&c, v)) goto out;
        } else if (!strcmp(k, "n")) { /* choices a prompt; their count is checked below */
            if (!json_is_null(v) && get_int(&c, k, v, 1, SM_API_MAX_CHOICES, &n)) goto out;
        } else if (!strcmp(k, "best_of")) {
            if (!json_is_null(v) && get_int(&c, k, v, 1, SM_API_MAX_CHOICES, &best_of)) goto out;
        } else if ((known = sm_fields_sampling(k, v, m->vocab, m->max_len, &out->samp, param, e)) != 0 ||
                   (known = sm_fields_bad_words(k, v, m->tok, m->vocab, &out->samp, param, e)) != 0) {
            if (known < 0) { *status = 400; goto out; }
        } else if ((known = sm_struct_field(k, v, &sr, out->ignored, param, e)) != 0) {
            if (known < 0) { *status = 400; goto out; }
        } else {
            for (size_t i = 0; i < sizeof NEUTRAL_FIELDS / sizeof NEUTRAL_FIELDS[0]; i++)
                if (!strcmp(k, NEUTRAL_FIELDS[i])) {
                    if (neutral(&c, NEUTRAL_FIELDS[i], v)) goto out;
                    known = 1;
                }
        }
        if (!known) sm_fields_ignore(out->ignored, k); /* accepted; the server logs it */
    }
    if (!have_prompt) { bad(&c, "prompt", "'prompt' is required"); goto out; }
    if ((out->include_usage || continuous_alone) && !out->stream) {
        bad(&c, "stream_options", "'stream_options' is only allowed with 'stream': true");
        goto out;
    }
    if (out->stream && out->prompt_lp_k > 0) { /* vLLM's rule: a stream has no place for them */
        bad(&c, "prompt_logprobs", "'prompt_logprobs' are not available with 'stream': true");
        goto out;
    }
    out->n = (int)n;
    if (check_request(&c, max_tokens, best_of)) goto out;
    /* the prompt's logprobs: echo's (with logprobs) and prompt_logprobs', the larger k of the two */
    out->samp.prompt_logprobs = (out->echo && out->samp.logprobs) || out->prompt_lp_k >= 0;
    out->samp.top_logprobs = out->lp_k > out->prompt_lp_k ? out->lp_k : out->prompt_lp_k;
    if (!out->samp.logprobs && !out->samp.prompt_logprobs) out->samp.top_logprobs = 0;
    out->max_tokens = (int)max_tokens;
    out->samp.temperature = (float)temperature;
    out->samp.top_p = (float)top_p;
    out->samp.top_k = top_k < 0 ? 0 : (int)top_k;
    out->samp.seed = (unsigned long long)seed;
    if (sm_struct_compile(m->cons, &sr, &out->samp.constraint, status, param, e)) goto out;
    rc = 0;
out:
    sm_struct_req_free(&sr);
    json_decref(root);
    if (rc) sm_api_req_free(out);
    return rc;
}

void sm_api_req_free(sm_api_req *r) {
    for (int p = 0; r->prompt && p < r->nprompt; p++) free(r->prompt[p]);
    free(r->prompt);
    free(r->plen);
    for (int i = 0; i < r->nstop; i++) free(r->stop[i]);
    sparkmono_constraint_release(r->samp.constraint); /* running requests hold their own */
    memset(r, 0, sizeof *r);
}

/* ---- responses -------------------------------------------------------------------------- */

/* Dump v (stolen) as compact JSON; NULL when out of memory. */
static char *dump(json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

static json_t *ids_array(const int *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

const char *sm_api_error_type(unsigned status) {
    if (status == 404) return "not_found_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

char *sm_api_error(const char *msg, const char *type, const char *param, const char *code) {
    sm_buf b = {0}; /* the message may quote the client's bytes, cut anywhere: repair them */
    if (sm_utf8_sanitize(&b, msg, strlen(msg))) return NULL;
    json_t *err = json_pack("{s:s%, s:s, s:s?, s:s?}", "message", b.p ? b.p : "", b.n, "type", type, "param",
                            param && *param ? param : NULL, "code", code);
    sm_buf_free(&b);
    return dump(json_pack("{s:o}", "error", err));
}

/* The text of id t alone (UTF-8 repaired), or "token_id:t"; NULL when out of memory. */
static json_t *token_text(const sm_tokenizer *tok, int t) {
    char buf[32], *s = NULL;
    size_t n = 0;
    sm_err e = {{0}};
    if (!tok || t < 0 || sm_tokenizer_decode(tok, &t, 1, &s, &n, &e)) {
        free(s);
        snprintf(buf, sizeof buf, "token_id:%d", t);
        return json_string(buf);
    }
    sm_buf b = {0};
    json_t *j = sm_utf8_sanitize(&b, s, n) ? NULL : json_stringn(b.p ? b.p : "", b.n);
    sm_buf_free(&b);
    free(s);
    return j;
}

/* A logprob as JSON: -inf (an id the model cannot pick) is -9999.0 as vLLM writes it; NaN (the
 * first prompt id's, which has no distribution) is null. */
static json_t *lp_value(float x) { return isnan(x) ? json_null() : json_real(isfinite(x) ? (double)x : -9999.0); }

/* Characters (code points) of UTF-8 text s [n]: the bytes that do not continue a character. */
static size_t utf8_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* OpenAI completions logprobs of ids [n]: tokens, token_logprobs, top_logprobs (a map token text ->
 * logprob a position: the id itself and its k alternatives), text_offset. */
static json_t *logprobs_obj(const sm_api_lp *lp, const int *ids, int n) {
    json_t *tokens = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    /* the echoed prompt's ids first (lp->pre), then the choice's */
    for (int i = 0; i < lp->npre + n; i++) {
        const int pre = i < lp->npre, at_i = pre ? i : i - lp->npre, id = pre ? lp->pre->ids[at_i] : ids[at_i];
        const float x = pre ? lp->pre->lp[at_i] : lp->lp[at_i];
        const int *tid = pre ? lp->pre->top_ids : lp->top_ids;
        const float *tlpv = pre ? lp->pre->top_lp : lp->top_lp;
        json_t *t = token_text(lp->tok, id), *m = isnan(x) ? NULL : json_object();
        json_array_append_new(off, json_integer((json_int_t)*lp->off));
        *lp->off += t ? utf8_chars(json_string_value(t), json_string_length(t)) : 0;
        if (m) json_object_set_new(m, t ? json_string_value(t) : "", lp_value(x));
        for (int j = 0; m && j < lp->k; j++) {
            const int a = tid[(size_t)at_i * lp->stride + j];
            json_t *at = a >= 0 ? token_text(lp->tok, a) : NULL;
            if (at) json_object_set_new(m, json_string_value(at), lp_value(tlpv[(size_t)at_i * lp->stride + j]));
            json_decref(at);
        }
        json_array_append_new(tokens, t);
        json_array_append_new(tlp, lp_value(x));
        json_array_append_new(top, m ? m : json_null()); /* the first prompt id: null, as OpenAI */
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", tlp, "top_logprobs", top,
                     "text_offset", off);
}

/* One entry of the chat shape: {token, logprob, bytes}, bytes those of the token's text. */
static json_t *chat_token(const sm_tokenizer *tok, int t, float x) {
    json_t *text = token_text(tok, t), *bytes = json_array();
    const unsigned char *p = text ? (const unsigned char *)json_string_value(text) : NULL;
    for (size_t i = 0; p && bytes && i < json_string_length(text); i++) json_array_append_new(bytes, json_integer(p[i]));
    return json_pack("{s:o, s:o, s:o}", "token", text, "logprob", lp_value(x), "bytes", bytes);
}

json_t *sm_api_chat_logprobs(const sm_api_lp *lp, const int *ids, int n) {
    json_t *content = json_array();
    for (int i = 0; content && i < n; i++) {
        json_t *top = json_array(), *e = chat_token(lp->tok, ids[i], lp->lp[i]);
        for (int j = 0; top && j < lp->k; j++) { /* the k most likely, in order (an id of -1: fewer ids than k) */
            const int a = lp->top_ids[(size_t)i * lp->stride + j];
            if (a >= 0) json_array_append_new(top, chat_token(lp->tok, a, lp->top_lp[(size_t)i * lp->stride + j]));
        }
        if (e) json_object_set_new(e, "top_logprobs", top);
        else json_decref(top);
        json_array_append_new(content, e);
    }
    return json_pack("{s:o}", "content", content);
}

/* One prompt_logprobs entry: {"logprob", "rank" (null: unknown), "decoded_token"}. */
static json_t *plp_entry(const sm_tokenizer *tok, int t, float x, int rank) {
    return json_pack("{s:o, s:o, s:o}", "logprob", lp_value(x), "rank", rank > 0 ? json_integer(rank) : json_null(),
                     "decoded_token", token_text(tok, t));
}

json_t *sm_api_prompt_logprobs(const sm_tokenizer *tok, const sm_api_lp_pre *pre, int n, int k, int stride) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        if (isnan(pre->lp[i])) { /* the first id has no distribution */
            json_array_append_new(a, json_null());
            continue;
        }
        const int *tid = pre->top_ids + (size_t)i * stride;
        const float *tlp = pre->top_lp + (size_t)i * stride;
        json_t *m = json_object();
        char key[16];
        snprintf(key, sizeof key, "%d", pre->ids[i]);
        if (m) json_object_set_new(m, key, plp_entry(tok, pre->ids[i], pre->lp[i], pre->rank[i]));
        for (int j = 0; m && j < k; j++) { /* ids as keys, as vLLM's maps of token id to Logprob */
            if (tid[j] < 0 || tid[j] == pre->ids[i]) continue;
            snprintf(key, sizeof key, "%d", tid[j]);
            json_object_set_new(m, key, plp_entry(tok, tid[j], tlp[j], j + 1));
        }
        json_array_append_new(a, m);
    }
    return a;
}

/* One choice: text, index, logprobs (null without lp), finish_reason (null while streaming), token_ids
 * (and prompt_logprobs when asked). */
static json_t *choice(const sm_api_choice *c) {
    json_t *o = json_pack("{s:s%, s:i, s:o, s:s?, s:o}", "text", c->text ? c->text : "", c->text ? c->ntext : 0, "index",
                          c->index, "logprobs", c->lp ? logprobs_obj(c->lp, c->ids, c->nids) : json_null(),
                          "finish_reason", c->finish, "token_ids", ids_array(c->ids, c->nids));
    if (o && c->prompt_lp) json_object_set(o, "prompt_logprobs", c->prompt_lp);
    return o;
}

char *sm_api_completion(const char *id, long created, const char *model, const sm_api_choice *c, int nc,
                        int prompt_tokens, int completion_tokens) {
    json_t *choices = json_array();
    for (int i = 0; choices && i < nc; i++) json_array_append_new(choices, choice(&c[i]));
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:i, s:i, s:i}}", "id", id, "object", "text_completion",
                          "created", (json_int_t)created, "model", model, "choices", choices, "usage", "prompt_tokens",
                          prompt_tokens, "completion_tokens", completion_tokens, "total_tokens",
                          prompt_tokens + completion_tokens));
}

char *sm_api_chunk(const char *id, long created, const char *model, const sm_api_choice *c) {
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object", "text_completion", "created",
                          (json_int_t)created, "model", model, "choices", choice(c)));
}

json_t *sm_api_usage(int prompt_tokens, int completion_tokens) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt_tokens, "completion_tokens", completion_tokens,
                     "total_tokens", prompt_tokens + completion_tokens);
}

char *sm_api_add_key(char *json, const char *key, json_t *value) {
    /* the key and the value as JSON text, escaped by jansson */
    json_t *ks = json_string(key);
    char *k = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL, *v = value ? json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(ks);
    json_decref(value);
    size_t n = json ? strlen(json) : 0;
    char *out = NULL;
    /* "{...}" becomes "{...,"key":value}" ("{}" becomes "{"key":value}") */
    if (json && k && v && n >= 2 && json[n - 1] == '}') {
        const size_t nk = strlen(k), nv = strlen(v), comma = n > 2;
        if ((out = realloc(json, n + comma + nk + 1 + nv + 1))) {
            char *p = out + n - 1;
            if (comma) *p++ = ',';
            memcpy(p, k, nk), p += nk;
            *p++ = ':';
            memcpy(p, v, nv), p += nv;
            *p++ = '}';
            *p = 0;
            json = NULL;
        }
    }
    free(json);
    free(k);
    free(v);
    return out;
}

char *sm_api_usage_chunk(const char *id, long created, const char *model, int prompt_tokens, int completion_tokens) {
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:[], s:{s:i, s:i, s:i}}", "id", id, "object", "text_completion",
                          "created", (json_int_t)created, "model", model, "choices", "usage", "prompt_tokens",
                          prompt_tokens, "completion_tokens", completion_tokens, "total_tokens",
                          prompt_tokens + completion_tokens));
}

char *sm_api_models(const char *model, long created, int max_len, int list) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", model, "object", "model", "created", (json_int_t)created,
                          "owned_by", "sparkmono", "max_model_len", max_len);
    if (!list) return dump(m);
    return dump(json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}
