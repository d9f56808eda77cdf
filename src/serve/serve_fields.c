/* serve_fields.c: the sampling and logit-processor fields of serve_fields.h, with jansson.
 *
 * One table-free chain of names: each field's check says its own range, the same text as the
 * engine's bounds (src/engine/logitproc.c checks them again, so a client of the C API gets the
 * same limits).  A JSON null is the field's default.  We rejected a generic (name, type, range)
 * table: logit_bias and the id lists need their own walks anyway.
 */
#include "serve/serve_fields.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 400 naming field k; returns -1. */
static int __attribute__((format(printf, 4, 5))) bad(const char *k, char *param, sm_err *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    snprintf(param, 32, "%s", k);
    return -1;
}

/* A number in [lo, hi] into *out. */
static int number(const char *k, const json_t *v, double lo, double hi, float *out, char *param, sm_err *e) {
    if (!json_is_number(v)) return bad(k, param, e, "'%s' must be a number in [%g, %g]", k, lo, hi);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return bad(k, param, e, "'%s' is %g; it must be in [%g, %g]", k, x, lo, hi);
    *out = (float)x;
    return 1;
}

/* logit_bias: {"id": bias, ...}, ids decimal in [0, V), biases in [-100, 100]. */
static int logit_bias(const char *k, const json_t *v, int V, sparkmono_sampling *s, char *param, sm_err *e) {
    if (!json_is_object(v)) return bad(k, param, e, "'%s' must be an object mapping token ids to biases", k);
    if (json_object_size(v) > SPARKMONO_MAX_BIAS)
        return bad(k, param, e, "'%s' has %zu entries; at most %d are allowed", k, json_object_size(v), SPARKMONO_MAX_BIAS);
    const char *id;
    const json_t *b;
    s->n_bias = 0;
    json_object_foreach((json_t *)v, id, b) {
        char *end;
        long t = strtol(id, &end, 10);
        if (!*id || *end || t < 0 || t >= V)
            return bad(k, param, e, "'%s' key '%.32s' is not a token id in [0, %d)", k, id, V);
        if (!json_is_number(b) || !isfinite(json_number_value(b)) || fabs(json_number_value(b)) > 100)
            return bad(k, param, e, "'%s' of token %ld must be a number in [-100, 100]", k, t);
        s->bias[s->n_bias].id = (int)t;
        s->bias[s->n_bias].bias = (float)json_number_value(b);
        s->n_bias++;
    }
    return 1;
}

/* A list of at most cap token ids in [0, V) (stop_token_ids, allowed_token_ids) into ids [*n];
 * nonempty: an empty list is refused (it would allow nothing). */
static int id_list(const char *k, const json_t *v, int V, int cap, int nonempty, int *ids, int *n, char *param, sm_err *e) {
    if (!json_is_array(v)) return bad(k, param, e, "'%s' must be a list of token ids", k);
    if (json_array_size(v) > (size_t)cap)
        return bad(k, param, e, "'%s' has %zu ids; at most %d are allowed", k, json_array_size(v), cap);
    if (nonempty && json_array_size(v) == 0) return bad(k, param, e, "'%s' is an empty list (it would allow no token)", k);
    *n = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V)
            return bad(k, param, e, "'%s' entry %zu is not a token id in [0, %d)", k, i, V);
        ids[(*n)++] = (int)json_integer_value(x);
    }
    return 1;
}

int sm_fields_sampling(const char *k, const json_t *v, int V, int max_len, sparkmono_sampling *s, char *param, sm_err *e) {
    int is_pres = !strcmp(k, "presence_penalty"), is_freq = !strcmp(k, "frequency_penalty");
    int known = is_pres || is_freq || !strcmp(k, "repetition_penalty") || !strcmp(k, "logit_bias") ||
                !strcmp(k, "min_tokens") || !strcmp(k, "ignore_eos") || !strcmp(k, "stop_token_ids") ||
                !strcmp(k, "min_p") || !strcmp(k, "allowed_token_ids");
    if (!known) return 0;
    if (json_is_null(v)) return 1; /* the default */
    if (is_pres) return number(k, v, -2, 2, &s->presence_penalty, param, e);
    if (is_freq) return number(k, v, -2, 2, &s->frequency_penalty, param, e);
    if (!strcmp(k, "min_p")) return number(k, v, 0, 1, &s->min_p, param, e);
    if (!strcmp(k, "allowed_token_ids"))
        return id_list(k, v, V, SPARKMONO_MAX_ALLOWED_IDS, 1, s->allowed_ids, &s->n_allowed_ids, param, e);
    if (!strcmp(k, "repetition_penalty")) {
        /* vLLM / HF: > 0, 1 is none */
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0 ||
            json_number_value(v) > 1e6)
            return bad(k, param, e, "'%s' must be a number in (0, 1e6] (1: no penalty)", k);
        s->repetition_penalty = (float)json_number_value(v);
        return 1;
    }
    if (!strcmp(k, "logit_bias")) return logit_bias(k, v, V, s, param, e);
    if (!strcmp(k, "min_tokens")) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max_len)
            return bad(k, param, e, "'%s' must be an integer in [0, %d]", k, max_len);
        s->min_tokens = (int)json_integer_value(v);
        return 1;
    }
    if (!strcmp(k, "ignore_eos")) {
        if (!json_is_boolean(v)) return bad(k, param, e, "'%s' must be true or false", k);
        s->ignore_eos = json_is_true(v);
        return 1;
    }
    return id_list(k, v, V, SPARKMONO_MAX_STOP_IDS, 0, s->stop_ids, &s->n_stop_ids, param, e);
}

int sm_fields_bad_words(const char *k, const json_t *v, const sm_tokenizer *tok, int V, sparkmono_sampling *s, char *param,
                        sm_err *e) {
    if (strcmp(k, "bad_words")) return 0;
    if (json_is_null(v)) return 1; /* the default */
    if (!json_is_array(v)) return bad(k, param, e, "'%s' must be a list of strings", k);
    const size_t n = json_array_size(v);
    if (n > SPARKMONO_MAX_BAD_WORDS)
        return bad(k, param, e, "'%s' has %zu words; at most %d are allowed", k, n, SPARKMONO_MAX_BAD_WORDS);
    if (n > 0 && !tok) return bad(k, param, e, "'%s' needs text, and this model directory has no tokenizer.json", k);
    const char *words[SPARKMONO_MAX_BAD_WORDS];
    size_t lens[SPARKMONO_MAX_BAD_WORDS];
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_string(x)) return bad(k, param, e, "'%s' entry %zu is not a string", k, i);
        words[i] = json_string_value(x);
        lens[i] = json_string_length(x);
    }
    /* the model's ids of each word, as vLLM makes them (logitproc.h) */
    s->n_bad_words = 0;
    sm_err we = {{0}};
    if (n > 0 && sm_lp_bad_words(tok, words, lens, (int)n, V, s, &we)) return bad(k, param, e, "'%s': %s", k, we.msg);
    return 1;
}

void sm_fields_ignore(char *ig, const char *k) {
    size_t n = strlen(ig);
    if (n + 4 >= SM_FIELDS_IGNORED) return; /* already cut short */
    int w = snprintf(ig + n, SM_FIELDS_IGNORED - n, "%s'%.64s'", n ? ", " : "", k);
    if (w < 0 || (size_t)w >= SM_FIELDS_IGNORED - n) snprintf(ig + SM_FIELDS_IGNORED - 4, 4, "...");
}
