/* constrain.c: compiling a constraint of each kind to a grammar, and a request's position in
 * it (constrain.h).
 *
 * Every kind ends as rule 0 of one NFA: a regex is its fragment, a choice the union of its
 * strings' bytes, a JSON Schema and json_object come from schema.c.  Masks and steps take the
 * constraint's mutex; the grammar's lazy tables are the only state they change.
 */
#include "constrain/constrain.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "constrain/regex.h"
#include "constrain/schema.h"

/* Rule 0 of n: one of the strings of the JSON array spec [len]. */
static int choice_compile(sm_nfa *n, const char *spec, size_t len, sm_err *e) {
    json_error_t je;
    json_t *a = json_loadb(spec, len, 0, &je);
    if (!a) return sm_errf(e, "choice: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    if (!json_is_array(a) || json_array_size(a) == 0) {
        json_decref(a);
        return sm_errf(e, "choice: expected a non-empty array of strings");
    }
    int r = sm_nfa_rule_new(n);
    sm_frag f = {0, 0};
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *s = json_array_get(a, i);
        if (!json_is_string(s)) {
            json_decref(a);
            return sm_errf(e, "choice: item %zu is not a string", i);
        }
        size_t sl = json_string_length(s);
        if (sl > (1u << 20)) {
            json_decref(a);
            return sm_errf(e, "choice: item %zu is longer than 1 MiB", i);
        }
        sm_frag one = sm_frag_lit(n, json_string_value(s), (int)sl);
        f = i ? sm_frag_alt(n, f, one) : one;
    }
    sm_nfa_rule_set(n, r, f);
    json_decref(a);
    return 0;
}

/* Rule 0 of n: the regex spec [len]. */
static int regex_rule(sm_nfa *n, const char *spec, size_t len, sm_err *e) {
    int r = sm_nfa_rule_new(n);
    sm_frag f;
    if (sm_regex_compile(n, spec, len, &f, e)) return -1;
    sm_nfa_rule_set(n, r, f);
    return 0;
}

int sm_con_create(const sm_vocab *v, const char *kind, const char *spec, size_t len, int any_whitespace,
                  sparkmono_constraint **out, sm_err *e) {
    *out = NULL;
    if (!kind) return sm_errf(e, "constraint: kind is NULL");
    const int needs_spec = strcmp(kind, "json_object") != 0;
    if (needs_spec && !spec) return sm_errf(e, "%s: the constraint's text is missing", kind);
    sm_nfa n;
    sm_nfa_init(&n);
    sm_schema_opts so = {0};
    so.any_whitespace = any_whitespace;
    int rc;
    if (!strcmp(kind, "regex")) rc = regex_rule(&n, spec, len, e);
    else if (!strcmp(kind, "json_schema") || !strcmp(kind, "json")) rc = sm_schema_compile(&n, spec, len, &so, e);
    else if (!strcmp(kind, "json_object")) rc = sm_schema_any_object(&n, &so, e);
    else if (!strcmp(kind, "choice")) rc = choice_compile(&n, spec, len, e);
    else if (!strcmp(kind, "grammar"))
        rc = sm_errf(e, "grammar: EBNF / Lark grammars are not supported (use a regex, a JSON schema, json_object or a choice)");
    else
        rc = sm_errf(e, "constraint: unknown kind '%.40s' (regex, json_schema, json_object, choice)", kind);
    if (rc) { sm_nfa_free(&n); return -1; }
    sparkmono_constraint *c = calloc(1, sizeof *c);
    if (!c) { sm_nfa_free(&n); return sm_errf(e, "%s: out of memory", kind); }
    if (sm_gram_create(&n, &c->g, e)) { free(c); return sm_errprefix(e, "%s", kind); }
    c->eos_mask = calloc((size_t)v->words, sizeof(uint32_t));
    if (!c->eos_mask) { sm_gram_free(c->g); free(c); return sm_errf(e, "%s: out of memory", kind); }
    for (int k = 0; k < v->n_eos; k++)
        if (v->eos[k] >= 0 && v->eos[k] < v->V) c->eos_mask[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31);
    c->v = v;
    c->refs = 1;
    pthread_mutex_init(&c->mu, NULL);
    snprintf(c->kind, sizeof c->kind, "%s", !strcmp(kind, "json") ? "json_schema" : kind);
    *out = c;
    return 0;
}

void sm_con_retain(sparkmono_constraint *c) {
    if (c) __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void sm_con_release(sparkmono_constraint *c) {
    if (!c || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    pthread_mutex_destroy(&c->mu);
    sm_gram_free(c->g);
    free(c->eos_mask);
    free(c);
}

int sm_con_start(const sparkmono_constraint *c) { return sm_gram_start(c->g); }

static int is_eos(const sm_vocab *v, int tok) {
    for (int k = 0; k < v->n_eos; k++)
        if (v->eos[k] == tok) return 1;
    return 0;
}

int sm_con_mask(sparkmono_constraint *c, int pos, uint32_t *out, sm_err *e) {
    const size_t bytes = sizeof(uint32_t) * (size_t)c->v->words;
    if (pos == SM_CON_ENDED) {
        memcpy(out, c->eos_mask, bytes);
        return c->v->n_eos > 0;
    }
    pthread_mutex_lock(&c->mu);
    /* a new mask past the budget: drop the cached ones first */
    const int fresh = pos >= 0 && !sm_gram_slot(c->g, pos);
    if (fresh && (c->nmasks + 1) * bytes > SM_CON_MASK_BUDGET) {
        sm_gram_clear_slots(c->g);
        c->nmasks = 0;
    }
    const uint32_t *m = sm_vocab_mask(c->v, c->g, pos, e);
    if (m) memcpy(out, m, bytes);
    c->nmasks += m && fresh;
    const int any = m ? (int)m[c->v->words] : 0;
    pthread_mutex_unlock(&c->mu);
    return m ? any : sm_errprefix(e, "%s constraint", c->kind);
}

int sm_con_advance(sparkmono_constraint *c, int pos, int tok, sm_err *e) {
    if (is_eos(c->v, tok)) /* an eos id ends the text: allowed where the grammar accepts */
        return pos == SM_CON_ENDED || sm_gram_accepting(c->g, pos) ? SM_CON_ENDED : SM_GRAM_DEAD;
    if (pos == SM_CON_ENDED) return SM_GRAM_DEAD;
    size_t len;
    const uint8_t *b = sm_vocab_bytes(c->v, tok, &len);
    if (!len) return SM_GRAM_DEAD;
    pthread_mutex_lock(&c->mu);
    int next = sm_gram_walk(c->g, pos, b, len);
    pthread_mutex_unlock(&c->mu);
    if (next == -2) return sm_errf(e, "%s constraint: %s", c->kind, sm_gram_error(c->g)), -2;
    return next;
}
