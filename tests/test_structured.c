/* test_structured.c: structured outputs through the engine (src/engine/constrained.c,
 * src/constrain/): on the tiny random model (its text is shaped by the constraint alone) every
 * constrained answer, greedy and sampled with several seeds, fullmatches its regex (PCRE2),
 * is one of its choices or parses as JSON of the asked shape; speculative (R = 8) output equals
 * plain (R = 1) output token for token; a batch mixing constrained and free requests gives each
 * the ids it gets alone; the token masks equal a brute-force match of every id's bytes; bad
 * constraints are refused in one line.  (The regex and schema compilers have their own tests:
 * test_regex.c, test_schema.c.) */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include "check.h"
#include "tmodel.h"
#include "constrain/constrain.h"
#include "engine/engine.h"
#include "model/tokenizer.h"
#include "sparkmono.h"

static char g_tmp[512];
static sparkmono_model *g_cyc; /* tiny cycle model: n-gram drafts are accepted often */
static sparkmono_model *g_rnd; /* tiny random model */
static int g_V, g_vu;
static sm_tokenizer *g_tok;    /* the random model's tokenizer (text of the answers) */

/* Generate from prompt {1, 2, 3} under constraint c: R rows a request, sampling s (NULL greedy),
 * up to maxt ids; out [maxt] gets them, *n their count, *done how it ended.  0 or -1. */
static int gen(sparkmono_model *m, int R, sparkmono_constraint *c, const sparkmono_sampling *s, int maxt, int *out, int *n,
               int *done) {
    sparkmono_engine_opts o = {0};
    o.request_rows = R;
    o.max_len = 512;
    o.threads = 2;
    sparkmono_engine *g;
    if (sparkmono_engine_create(m, &o, &g)) return -1;
    sparkmono_sampling smp = {0};
    if (s) smp = *s;
    smp.constraint = c;
    const int prompt[3] = {1, 2, 3};
    int req, rc = -1;
    const int *ids;
    sparkmono_request_info info;
    if (!sparkmono_add_sampled(g, prompt, 3, maxt, &smp, &req) && !sparkmono_generate(g) &&
        !sparkmono_output(g, req, &ids, n) && !sparkmono_request_get_info(g, req, &info)) {
        memcpy(out, ids, sizeof(int) * (size_t)*n);
        *done = info.done;
        rc = 0;
    }
    sparkmono_engine_destroy(g);
    return rc;
}

/* The text of ids [n] without a trailing eos (caller frees). */
static char *text_of(const int *ids, int n, size_t *len) {
    sparkmono_model_info mi;
    sparkmono_model_get_info(g_rnd, &mi);
    if (n > 0)
        for (int k = 0; k < mi.n_eos; k++)
            if (ids[n - 1] == mi.eos[k]) { n--; break; }
    char *t = NULL;
    sm_err e = {{0}};
    if (sm_tokenizer_decode(g_tok, ids, n, &t, len, &e)) return NULL;
    return t;
}

/* 1 when text [len] fullmatches the regex re (PCRE2, UTF). */
static int pcre_full(const char *re, const char *text, size_t len) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &err, &off, NULL);
    if (!c) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)text, len, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

/* Greedy and three sampling seeds under c: each answer that ended by eos passes ok(text); one
 * that hit max_tokens still has a prefix the constraint accepts (its position is alive). */
typedef int (*text_ok)(const void *arg, const char *t, size_t len);
static void answers(const char *what, sparkmono_constraint *c, text_ok ok, const void *arg, int maxt) {
    int ids[512], n, done, ended = 0;
    for (int v = 0; v < 4; v++) {
        sparkmono_sampling s = {0};
        if (v) {
            s.temperature = 1.0f;
            s.seed = 11 * (unsigned)v;
        }
        if (gen(g_rnd, 8, c, &s, maxt, ids, &n, &done)) {
            CHECK(0, "%s seed %d: %s", what, v, sparkmono_errmsg());
            continue;
        }
        size_t len;
        char *t = text_of(ids, n, &len);
        CHECK(t != NULL, "%s: the ids do not decode", what);
        if (!t) continue;
        if (done == 1) {
            ended++;
            CHECK(ok(arg, t, len), "%s seed %d: '%.200s' is not a valid answer", what, v, t);
        } else {
            /* max_tokens: every id was allowed, so the constraint's position is alive */
            int pos = sm_con_start(c);
            sm_err e = {{0}};
            for (int i = 0; i < n && pos >= 0; i++) pos = sm_con_advance(c, pos, ids[i], &e);
            CHECK(pos >= 0, "%s seed %d: the unfinished text '%.200s' left the constraint", what, v, t);
        }
        free(t);
    }
    printf("  %s: %d of 4 answers ended by eos\n", what, ended);
}

static int ok_regex(const void *arg, const char *t, size_t len) { return pcre_full(arg, t, len); }
static int ok_json_object(const void *arg, const char *t, size_t len) {
    (void)arg;
    json_error_t je;
    json_t *j = json_loadb(t, len, 0, &je);
    /* a number like 6911e0860 is valid JSON that jansson cannot hold as a double: its text
     * must still open an object */
    int r = j ? json_is_object(j) : strstr(je.text, "overflow") && t[0] == '{';
    json_decref(j);
    return r;
}
static int ok_choice(const void *arg, const char *t, size_t len) {
    for (const char *const *c = arg; *c; c++)
        if (strlen(*c) == len && !memcmp(*c, t, len)) return 1;
    return 0;
}
/* {"name": string of 1..8 chars, "age": integer in [0, 120], "ok": boolean} in this order */
static int ok_person(const void *arg, const char *t, size_t len) {
    (void)arg;
    json_error_t je;
    json_t *j = json_loadb(t, len, 0, &je);
    int r = j && json_is_object(j) && json_object_size(j) == 3 && json_is_string(json_object_get(j, "name")) &&
            json_string_length(json_object_get(j, "name")) >= 1 && json_is_integer(json_object_get(j, "age")) &&
            json_integer_value(json_object_get(j, "age")) >= 0 && json_integer_value(json_object_get(j, "age")) <= 120 &&
            json_is_boolean(json_object_get(j, "ok"));
    json_decref(j);
    return r;
}

static const char *const CHOICES[] = {"yes", "no", "maybe later", "\xc3\xa9t\xc3\xa9", NULL};
static const char PERSON[] = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
                             "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"ok\":{\"type\":\"boolean\"}},"
                             "\"required\":[\"name\",\"age\",\"ok\"]}";

static sparkmono_constraint *make(sparkmono_model *m, const char *kind, const char *spec) {
    sparkmono_constraint *c = NULL;
    sm_status st = sparkmono_constraint_create(m, kind, spec, spec ? strlen(spec) : 0, 0, &c);
    CHECK(st == SM_OK, "%s '%s': %s", kind, spec ? spec : "", sparkmono_errmsg());
    return c;
}

static void test_regex_answers(void) {
    const char *res[] = {"[a-z]{2,6}", "(ab|cd)+e?", "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,2})?", "\\d{3}-\\d{4}",
                         "[\xe4\xb8\x80-\xe9\xbf\xbf\xc3\xa0-\xc3\xbf]{1,4}", NULL};
    for (int i = 0; res[i]; i++) {
        sparkmono_constraint *c = make(g_rnd, "regex", res[i]);
        if (!c) continue;
        answers(res[i], c, ok_regex, res[i], 64);
        sparkmono_constraint_release(c);
    }
}

static void test_choice_answers(void) {
    sparkmono_constraint *c = make(g_rnd, "choice", "[\"yes\", \"no\", \"maybe later\", \"\xc3\xa9t\xc3\xa9\"]");
    if (!c) return;
    answers("choice", c, ok_choice, CHOICES, 32);
    sparkmono_constraint_release(c);
}

static void test_json_answers(void) {
    sparkmono_constraint *c = make(g_rnd, "json_schema", PERSON);
    if (c) {
        answers("person schema", c, ok_person, NULL, 96);
        sparkmono_constraint_release(c);
    }
    c = make(g_rnd, "json_object", NULL);
    if (c) {
        answers("json_object", c, ok_json_object, NULL, 48);
        sparkmono_constraint_release(c);
    }
}

/* Speculative output equals plain output under a constraint, greedy and sampled, on the cycle
 * model (drafts accepted) and the random one. */
static void test_spec_equals_plain(void) {
    const char *kinds[3] = {"regex", "choice", "json_schema"};
    const char *specs[3] = {"[a-z ]{4,40}", "[\"abc abc abc abc\", \"abc abd\", \"x\"]", PERSON};
    sparkmono_model *ms[2] = {g_cyc, g_rnd};
    for (int mi = 0; mi < 2; mi++)
        for (int k = 0; k < 3; k++) {
            sparkmono_constraint *c = make(ms[mi], kinds[k], specs[k]);
            if (!c) continue;
            for (int v = 0; v < 3; v++) {
                sparkmono_sampling s = {0};
                if (v) s.temperature = 0.8f, s.seed = 5 + (unsigned)v, s.top_k = v == 2 ? 5 : 0;
                int a[128], b[128], na, nb, da, db;
                if (gen(ms[mi], 8, c, &s, 60, a, &na, &da) || gen(ms[mi], 1, c, &s, 60, b, &nb, &db)) {
                    CHECK(0, "%s: %s", kinds[k], sparkmono_errmsg());
                    continue;
                }
                CHECK(na == nb && da == db && !memcmp(a, b, sizeof(int) * (size_t)na),
                      "model %d %s variant %d: R = 8 gave %d ids (end %d), R = 1 %d (end %d)", mi, kinds[k], v, na, da, nb, db);
            }
            sparkmono_constraint_release(c);
        }
}

/* A batch of constrained and free requests gives each the ids it gets alone. */
static void test_batch_mixed(void) {
    sparkmono_constraint *c1 = make(g_rnd, "regex", "[0-9]{1,12}"), *c2 = make(g_rnd, "json_schema", PERSON);
    if (!c1 || !c2) { sparkmono_constraint_release(c1); sparkmono_constraint_release(c2); return; }
    sparkmono_engine_opts o = {0};
    o.request_rows = 8;
    o.max_requests = 4;
    o.max_len = 512;
    o.threads = 2;
    sparkmono_engine *g;
    if (sparkmono_engine_create(g_rnd, &o, &g)) { CHECK(0, "%s", sparkmono_errmsg()); return; }
    sparkmono_batch *b;
    CHECK(sparkmono_batch_create(g, -1, &b) == SM_OK, "%s", sparkmono_errmsg());
    sparkmono_sampling s[6];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 6; i++) {
        s[i].constraint = i % 3 == 0 ? c1 : i % 3 == 1 ? c2 : NULL;
        if (i >= 3) s[i].temperature = 0.9f, s[i].seed = 77 + (unsigned)i;
    }
    const int prompt[3] = {1, 2, 3};
    long long id[6];
    for (int i = 0; i < 6; i++) CHECK(sparkmono_batch_submit(b, prompt, 3, 50, &s[i], NULL, &id[i]) == SM_OK, "%s", sparkmono_errmsg());
    /* the creator's references go now: the queued and live requests hold theirs */
    sparkmono_constraint_release(c1);
    sparkmono_constraint_release(c2);
    int got[6][64], ng[6] = {0}, ended = 0;
    while (ended < 6) {
        const sparkmono_batch_event *ev;
        int nev;
        if (sparkmono_batch_step(b, &ev, &nev)) { CHECK(0, "batch: %s", sparkmono_errmsg()); break; }
        for (int k = 0; k < nev; k++) {
            int i = (int)(ev[k].id - id[0]);
            for (int j = 0; j < ev[k].n && ng[i] < 64; j++) got[i][ng[i]++] = ev[k].ids[j];
            if (ev[k].done) ended++;
        }
    }
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
    /* alone: fresh constraints (the same automata) */
    for (int i = 0; i < 6; i++) {
        sparkmono_constraint *c = i % 3 == 0 ? make(g_rnd, "regex", "[0-9]{1,12}") : i % 3 == 1 ? make(g_rnd, "json_schema", PERSON) : NULL;
        int a[64], na, da;
        if (gen(g_rnd, 8, c, &s[i], 50, a, &na, &da)) CHECK(0, "alone %d: %s", i, sparkmono_errmsg());
        else CHECK(na == ng[i] && !memcmp(a, got[i], sizeof(int) * (size_t)na), "request %d: batched %d ids, alone %d", i, ng[i], na);
        sparkmono_constraint_release(c);
    }
}

/* The mask of a position equals matching every id's bytes one by one (the trie walk's oracle). */
static void test_mask_brute_force(void) {
    const char *kinds[4] = {"regex", "json_object", "choice", "json_schema"};
    const char *specs[4] = {"(a|b[c-z]*|\\d+\\.)\\s?[^x]{0,3}", NULL, "[\"yes\", \"yesterday\", \"no\"]", PERSON};
    for (int k = 0; k < 4; k++) {
        sparkmono_constraint *c = make(g_rnd, kinds[k], specs[k]);
        if (!c) continue;
        /* a few positions along a generated answer */
        int ids[64], n, done;
        if (gen(g_rnd, 1, c, NULL, 12, ids, &n, &done)) { CHECK(0, "%s", sparkmono_errmsg()); sparkmono_constraint_release(c); continue; }
        int pos = sm_con_start(c), bad = 0;
        uint32_t *m = malloc(sizeof(uint32_t) * (size_t)c->v->words);
        for (int i = 0; m && i <= n && pos >= 0 && pos != SM_CON_ENDED; i++) {
            sm_err e = {{0}};
            if (sm_con_mask(c, pos, m, &e) < 0) { CHECK(0, "%s", e.msg); break; }
            for (int id = 0; id < g_V; id++) {
                const unsigned char *bytes;
                size_t len;
                int kind = sm_tokenizer_token_bytes(g_tok, id, &bytes, &len);
                int want;
                int is_eos = 0;
                for (int q = 0; q < c->v->n_eos; q++) is_eos |= c->v->eos[q] == id;
                if (is_eos) want = sm_gram_accepting(c->g, pos);
                else if (kind != 1 || len == 0 || id >= g_vu) want = 0;
                else want = sm_gram_walk(c->g, pos, bytes, len) >= 0;
                if (want != sm_mask_has(m, id) && bad++ < 3) printf("  %s position %d: id %d mask %d, brute force %d\n", kinds[k], i, id, sm_mask_has(m, id), want);
            }
            if (i < n) pos = sm_con_advance(c, pos, ids[i], &e);
        }
        free(m);
        CHECK(bad == 0, "%s: %d mask bits differ from the brute-force match", kinds[k], bad);
        sparkmono_constraint_release(c);
    }
}

/* Bad constraints: SM_E_INVALID and one line naming the problem; another model's constraint
 * refused by the request. */
static void test_refusals(void) {
    struct { const char *kind, *spec, *want; } cases[] = {
        {"regex", "(ab", "regex"},
        {"regex", "a(?=b)", "regex"},
        {"json_schema", "{\"type\":\"object\",\"not\":{}}", "not"},
        {"json_schema", "{\"type\":", "schema"},
        {"choice", "[1, 2]", "choice"},
        {"choice", "[]", "choice"},
        {"grammar", "root ::= \"a\"", "grammar"},
        {"xml", "<a/>", "unknown kind"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sparkmono_constraint *c = NULL;
        sm_status st = sparkmono_constraint_create(g_rnd, cases[i].kind, cases[i].spec, strlen(cases[i].spec), 0, &c);
        const char *msg = sparkmono_errmsg();
        CHECK(st == SM_E_INVALID && !c && strstr(msg, cases[i].want) && !strchr(msg, '\n'), "%s '%s': status %d, '%s'",
              cases[i].kind, cases[i].spec, st, msg);
        sparkmono_constraint_release(c);
    }
    sparkmono_constraint *c = make(g_cyc, "regex", "a+");
    if (!c) return;
    sparkmono_engine *g;
    sparkmono_engine_opts o = {0};
    o.max_len = 64;
    if (sparkmono_engine_create(g_rnd, &o, &g) == SM_OK) {
        sparkmono_sampling s = {0};
        s.constraint = c;
        const int prompt[1] = {1};
        int req;
        sm_status st = sparkmono_add_sampled(g, prompt, 1, 8, &s, &req);
        CHECK(st == SM_E_INVALID && strstr(sparkmono_errmsg(), "another model"), "another model's constraint: %d '%s'", st,
              sparkmono_errmsg());
        sparkmono_engine_destroy(g);
    }
    sparkmono_constraint_release(c);
}

/* Logprobs under a constraint are those of the masked row: every reported top id is allowed or
 * has logprob -inf, and the chosen ids' logprobs are finite. */
static void test_logprobs_masked(void) {
    sparkmono_constraint *c = make(g_rnd, "choice", "[\"yes\", \"no\"]");
    if (!c) return;
    sparkmono_engine_opts o = {0};
    o.max_len = 64;
    o.threads = 2;
    sparkmono_engine *g;
    if (sparkmono_engine_create(g_rnd, &o, &g)) { CHECK(0, "%s", sparkmono_errmsg()); return; }
    sparkmono_sampling s = {0};
    s.constraint = c;
    s.logprobs = 1;
    s.top_logprobs = 5;
    const int prompt[3] = {1, 2, 3};
    int req, n, k;
    const int *ids, *top;
    const float *lp, *tlp;
    if (sparkmono_add_sampled(g, prompt, 3, 16, &s, &req) || sparkmono_generate(g) || sparkmono_output(g, req, &ids, &n) ||
        sparkmono_logprobs(g, req, &lp, &top, &tlp, &k)) {
        CHECK(0, "%s", sparkmono_errmsg());
    } else {
        int pos = sm_con_start(c);
        uint32_t *m = malloc(sizeof(uint32_t) * (size_t)c->v->words);
        for (int i = 0; m && i < n; i++) {
            sm_err e = {{0}};
            sm_con_mask(c, pos, m, &e);
            CHECK(isfinite(lp[i]) && lp[i] <= 0, "id %d: logprob %g", i, (double)lp[i]);
            for (int j = 0; j < k; j++)
                CHECK(top[i * k + j] < 0 || sm_mask_has(m, top[i * k + j]) || tlp[i * k + j] == -INFINITY,
                      "position %d: top id %d (logprob %g) is forbidden there", i, top[i * k + j], (double)tlp[i * k + j]);
            pos = sm_con_advance(c, pos, ids[i], &e);
        }
        free(m);
    }
    sparkmono_engine_destroy(g);
    sparkmono_constraint_release(c);
}

/* min_tokens beyond a complete constrained text: the constraint wins, the text ends. */
static void test_min_tokens_conflict(void) {
    sparkmono_constraint *c = make(g_rnd, "choice", "[\"a\"]");
    if (!c) return;
    for (int v = 0; v < 2; v++) {
        sparkmono_sampling s = {0};
        s.min_tokens = 5;
        if (v) s.temperature = 1.0f, s.seed = 3;
        int ids[32], n, done;
        if (gen(g_rnd, 8, c, &s, 20, ids, &n, &done)) { CHECK(0, "variant %d: %s", v, sparkmono_errmsg()); continue; }
        size_t len;
        char *t = text_of(ids, n, &len);
        CHECK(t && done == 1 && len == 1 && t[0] == 'a', "variant %d: '%s' (end %d), expected 'a' then eos", v, t ? t : "", done);
        free(t);
    }
    sparkmono_constraint_release(c);
}

/* A request whose constraint and processors leave no id fails alone: a batch's other requests
 * go on and end as they would alone. */
static void test_fails_alone(void) {
    sparkmono_constraint *c = make(g_rnd, "choice", "[\"ab\"]");
    if (!c) return;
    sparkmono_engine_opts o = {0};
    o.max_requests = 2;
    o.max_len = 128;
    o.threads = 2;
    sparkmono_engine *g;
    if (sparkmono_engine_create(g_rnd, &o, &g)) { CHECK(0, "%s", sparkmono_errmsg()); sparkmono_constraint_release(c); return; }
    sparkmono_batch *b;
    CHECK(sparkmono_batch_create(g, -1, &b) == SM_OK, "%s", sparkmono_errmsg());
    /* allowed_token_ids: the id of 'a' alone: the first id passes, the second ('b') cannot (a verify
     * step, where the other request runs beside it) */
    int a_id = -1;
    for (int id = 0; id < g_vu && a_id < 0; id++) {
        const unsigned char *bytes;
        size_t len;
        if (sm_tokenizer_token_bytes(g_tok, id, &bytes, &len) == 1 && len == 1 && bytes[0] == 'a') a_id = id;
    }
    sparkmono_sampling bad = {0}, free_s = {0};
    bad.constraint = c;
    bad.n_allowed_ids = 1;
    bad.allowed_ids[0] = a_id;
    const int prompt[3] = {1, 2, 3};
    long long id_bad, id_free;
    CHECK(sparkmono_batch_submit(b, prompt, 3, 12, &bad, NULL, &id_bad) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(sparkmono_batch_submit(b, prompt, 3, 12, &free_s, NULL, &id_free) == SM_OK, "%s", sparkmono_errmsg());
    int end_bad = 0, end_free = 0, nfree = 0, guard = 0;
    int got[16];
    char why[256] = "";
    while ((!end_bad || !end_free) && guard++ < 100) {
        const sparkmono_batch_event *ev;
        int nev;
        if (sparkmono_batch_step(b, &ev, &nev)) { CHECK(0, "batch: %s", sparkmono_errmsg()); break; }
        for (int k = 0; k < nev; k++) {
            if (ev[k].id == id_bad && ev[k].done) {
                end_bad = ev[k].done;
                snprintf(why, sizeof why, "%s", ev[k].err ? ev[k].err : "");
            }
            if (ev[k].id == id_free) {
                for (int j = 0; j < ev[k].n && nfree < 16; j++) got[nfree++] = ev[k].ids[j];
                if (ev[k].done) end_free = ev[k].done;
            }
        }
    }
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
    CHECK(a_id >= 0, "the vocabulary has no token 'a'");
    CHECK(end_bad == SM_BATCH_FAILED && strstr(why, "leave no id"), "the conflicting request ended %d ('%s'), expected FAILED with a line",
          end_bad, why);
    CHECK(end_free == SM_BATCH_EOS || end_free == SM_BATCH_LENGTH, "the free request ended %d", end_free);
    int alone[16], na, da;
    if (!gen(g_rnd, 8, NULL, &free_s, 12, alone, &na, &da))
        CHECK(na == nfree && !memcmp(alone, got, sizeof(int) * (size_t)na), "the free request: %d ids batched, %d alone", nfree, na);
    printf("  the conflicting request: %s\n", why);
    sparkmono_constraint_release(c);
}

int main(void) {
    if (tm_open_tiny_pair(g_tmp, sizeof g_tmp, "sm_test_structured", &g_cyc, &g_rnd, &g_V, &g_vu)) return 1;
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/random", g_tmp);
    sm_err e = {{0}};
    if (sm_tokenizer_load_dir(dir, &g_tok, path, sizeof path, &e) || !g_tok) {
        printf("FAIL setup: tokenizer: %s\n", e.msg);
        return 1;
    }
    RUN(test_regex_answers);
    RUN(test_choice_answers);
    RUN(test_json_answers);
    RUN(test_spec_equals_plain);
    RUN(test_batch_mixed);
    RUN(test_mask_brute_force);
    RUN(test_refusals);
    RUN(test_logprobs_masked);
    RUN(test_min_tokens_conflict);
    RUN(test_fails_alone);
    sm_tokenizer_free(g_tok);
    sparkmono_model_close(g_cyc);
    sparkmono_model_close(g_rnd);
    tm_rmtree(g_tmp);
    return TEST_DONE();
}
