/* test_schema.c: JSON Schema compilation (src/constrain/schema.h) against the reference
 * validator.
 *
 * The corpus, tests/constrain/schemas.jsonl, holds schemas of every supported keyword and of
 * real-world shapes, each marked "ok" or "refuse" (with a substring of the refusal line), some
 * with hand-written compact instances the grammar must accept or reject.  Every "ok" schema is
 * compiled (compact, and every fourth with any_whitespace too) and sampled by random walks over
 * its automaton; the samples go with the schema to tests/constrain/validate.py, which parses
 * them with json.loads and validates them with python-jsonschema (Draft 2020-12, formats
 * asserted): a sample it rejects is a relaxation, the one thing the compiler must never do.
 * The converse (valid texts accepted) is checked on the hand-written instances, on exhaustive
 * integer and decimal grids against exact arithmetic, and on nested objects for
 * sm_schema_any_object.  We rejected checking samples with a validator written here: it would
 * share the compiler's reading of the schema.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "constrain/match.h"
#include "constrain/nfa.h"
#include "constrain/schema.h"
#include "model/rng.h"

#define CORPUS "tests/constrain/schemas.jsonl"
#define VALIDATE "tests/constrain/validate.py"
#define WALKS 50        /* random walks a schema */
#define MIN_DONE 20     /* finished walks a schema needs */
#define MAX_WALK 4000   /* bytes before a walk is given up */

static json_t *corpus; /* the entries, in file order */

/* ---- seeded random numbers ---- */
static uint64_t rng = 0x5C4E3A0F1DULL;
static double unit(void) { return (double)(sm_rng_next(&rng) >> 11) * 0x1.0p-53; }
static int below(int n) { return (int)(unit() * n); }

/* ---- helpers ---- */

/* Load the corpus once; 0 or -1. */
static int load_corpus(void) {
    if (corpus) return 0;
    FILE *f = fopen(CORPUS, "r");
    if (!f) return -1;
    corpus = json_array();
    char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *e = json_loads(line, 0, &je);
        if (!e) {
            printf("  corpus line unreadable: %s\n", je.text);
            continue;
        }
        json_array_append_new(corpus, e);
    }
    fclose(f);
    return 0;
}

static const char *ename(const json_t *e) { return json_string_value(json_object_get(e, "name")); }
static int expect_ok(const json_t *e) { return !strcmp(json_string_value(json_object_get(e, "expect")), "ok"); }

/* The schema text of entry e (malloc'd): "schema_text" as it is, or "schema" printed. */
static char *entry_text(const json_t *e) {
    const json_t *t = json_object_get(e, "schema_text");
    if (t) return strdup(json_string_value(t));
    return json_dumps(json_object_get(e, "schema"), JSON_COMPACT | JSON_ENCODE_ANY);
}

/* Compile a schema (or any_object when text is NULL) into a grammar; NULL with e set. */
static sm_gram *compile(const char *text, int any_ws, sm_err *e) {
    sm_nfa n;
    sm_nfa_init(&n);
    sm_schema_opts o = {any_ws};
    int rc = text ? sm_schema_compile(&n, text, strlen(text), &o, e) : sm_schema_any_object(&n, &o, e);
    if (rc) {
        sm_nfa_free(&n);
        return NULL;
    }
    sm_gram *g;
    if (sm_gram_create(&n, &g, e)) return NULL;
    return g;
}

static int matches(sm_gram *g, const char *s) { return sm_gram_matches(g, (const uint8_t *)s, strlen(s)); }

/* One random walk from the start: pick uniformly among the bytes that keep the configuration
 * alive, stop at an accepting one with probability 0.3 (always when nothing can follow); past
 * 64 bytes lean more and more on closing bytes (" } ]).  1 finished (out [*len]), 0 given up
 * after MAX_WALK bytes, -1 the grammar failed (message in why). */
static int walk(sm_gram *g, char *out, size_t *len, const char **why) {
    int cfg = sm_gram_start(g), nxt[256];
    uint8_t ok[256];
    size_t n = 0;
    for (;;) {
        if (sm_gram_accepting(g, cfg) && (!sm_gram_can_continue(g, cfg) || unit() < 0.3)) break;
        if (n >= MAX_WALK) return 0;
        int m = 0;
        for (int b = 0; b < 256; b++) {
            int t = sm_gram_step(g, cfg, (uint8_t)b);
            if (t == -2) { *why = sm_gram_error(g); return -1; }
            if (t >= 0) { ok[m] = (uint8_t)b; nxt[m++] = t; }
        }
        if (!m) { *why = "a configuration that neither accepts nor continues"; return -1; }
        int pick = below(m);
        if (n > 64 && unit() < (double)(n - 64) / 512.0) {
            int close[3], nc = 0;
            for (int i = 0; i < m; i++)
                if (ok[i] == '"' || ok[i] == '}' || ok[i] == ']') close[nc++] = i;
            if (nc) pick = close[below(nc)];
        }
        out[n++] = (char)ok[pick];
        cfg = nxt[pick];
    }
    *len = n;
    return 1;
}

/* 1 when text has whitespace outside its strings (compact output has none). */
static int has_ws(const char *s, size_t len) {
    int in = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in) {
            if (c == '\\') i++;
            else if (c == '"') in = 0;
        } else if (c == '"') in = 1;
        else if (c == ' ' || c == '\n' || c == '\t' || c == '\r') return 1;
    }
    return 0;
}

/* Draw the samples of grammar g into a new JSON array; NULL (checks failed) on failure. */
static json_t *samples(sm_gram *g, const char *name, int any_ws) {
    static char buf[MAX_WALK + 1];
    json_t *arr = json_array();
    int done = 0;
    for (int w = 0; w < WALKS; w++) {
        size_t len;
        const char *why = "";
        int rc = walk(g, buf, &len, &why);
        CHECK(rc >= 0, "%s: walk %d: %s", name, w, why);
        if (rc <= 0) {
            if (rc < 0) break;
            continue;
        }
        json_t *s = json_stringn(buf, len);
        CHECK(s != NULL, "%s: sample %d is not UTF-8", name, w);
        if (!s) continue;
        CHECK(any_ws || !has_ws(buf, len), "%s: sample %d is not compact: %.*s", name, w, (int)len, buf);
        json_array_append_new(arr, s);
        done++;
    }
    CHECK(done >= MIN_DONE, "%s: only %d of %d walks finished", name, done, WALKS);
    return arr;
}

/* ---- tests ---- */

/* Every entry compiles or is refused as marked; a refusal is one line naming the problem. */
static void test_corpus_compile(void) {
    CHECK(load_corpus() == 0, "cannot open %s (run from the repository root)", CORPUS);
    if (!corpus) return;
    int nok = 0, nref = 0;
    size_t i;
    json_t *e;
    json_array_foreach(corpus, i, e) {
        char *text = entry_text(e);
        sm_err err = {""};
        sm_gram *g = compile(text, 0, &err);
        const char *why = json_string_value(json_object_get(e, "why"));
        if (expect_ok(e)) {
            CHECK(g != NULL, "%s: refused: %s", ename(e), err.msg);
            nok++;
        } else {
            CHECK(g == NULL, "%s: compiled, expected a refusal containing '%s'", ename(e), why ? why : "");
            CHECK(!g && !strchr(err.msg, '\n') && (strstr(err.msg, "schema:") || strstr(err.msg, "regex:")),
                  "%s: refusal line: %s", ename(e), err.msg);
            CHECK(!g && (!why || strstr(err.msg, why)), "%s: refusal '%s' lacks '%s'", ename(e), err.msg, why);
            nref++;
        }
        sm_gram_free(g);
        free(text);
    }
    printf("  corpus: %d ok, %d refused\n", nok, nref);
    CHECK(nok >= 100 && nref >= 30, "corpus too small: %d ok, %d refused", nok, nref);
}

/* The hand-written instances: "accept" ones match, "reject" ones do not. */
static void test_corpus_converse(void) {
    if (!corpus) return;
    size_t i, j;
    json_t *e, *x;
    int n = 0;
    json_array_foreach(corpus, i, e) {
        if (!expect_ok(e)) continue;
        char *text = entry_text(e);
        sm_err err;
        sm_gram *g = compile(text, 0, &err);
        free(text);
        if (!g) continue; /* reported by test_corpus_compile */
        json_array_foreach(json_object_get(e, "accept"), j, x) {
            CHECK(matches(g, json_string_value(x)), "%s: rejects %s", ename(e), json_string_value(x));
            n++;
        }
        json_array_foreach(json_object_get(e, "reject"), j, x) {
            CHECK(!matches(g, json_string_value(x)), "%s: accepts %s", ename(e), json_string_value(x));
            n++;
        }
        sm_gram_free(g);
    }
    printf("  %d hand-written instances\n", n);
}

/* Append the samples of grammar g to f as a validate.py line (schema: its JSON Schema). */
static void write_line(FILE *f, sm_gram *g, const char *name, json_t *schema, const json_t *accept, int any_ws) {
    json_t *line = json_pack("{s:s, s:O, s:o}", "name", name, "schema", schema, "samples", samples(g, name, any_ws));
    if (accept) json_object_set(line, "accept", (json_t *)accept);
    char *s = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
    fprintf(f, "%s\n", s);
    free(s);
    json_decref(line);
}

/* Append the samples of corpus entry e (compiled with any_ws); 1 written. */
static int write_entry(FILE *f, const json_t *e, int any_ws) {
    char *text = entry_text(e);
    sm_err err;
    sm_gram *g = compile(text, any_ws, &err);
    json_t *schema = json_loads(text, JSON_DECODE_ANY, NULL);
    free(text);
    int ok = g && schema;
    if (ok) {
        char name[256];
        snprintf(name, sizeof name, "%s%s", ename(e), any_ws ? " (ws)" : "");
        write_line(f, g, name, schema, any_ws ? NULL : json_object_get(e, "accept"), any_ws);
    }
    sm_gram_free(g);
    json_decref(schema);
    return ok;
}

/* Append samples of sm_schema_any_object (checked as {"type": "object"}); 1 written. */
static int write_any_object(FILE *f, int any_ws) {
    sm_err err;
    sm_gram *g = compile(NULL, any_ws, &err);
    CHECK(g != NULL, "any_object: %s", err.msg);
    if (!g) return 0;
    json_t *schema = json_pack("{s:s}", "type", "object");
    write_line(f, g, any_ws ? "any_object (ws)" : "any_object", schema, NULL, any_ws);
    json_decref(schema);
    sm_gram_free(g);
    return 1;
}

/* Random samples of every "ok" schema are valid for python-jsonschema. */
static void test_corpus_samples(void) {
    if (!corpus) return;
    char path[] = "/tmp/sm_schema_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp failed");
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    size_t i;
    json_t *e;
    int lines = 0, k = 0;
    json_array_foreach(corpus, i, e) {
        if (!expect_ok(e)) continue;
        lines += write_entry(f, e, 0);
        if (k++ % 4 == 0) lines += write_entry(f, e, 1);
    }
    lines += write_any_object(f, 0) + write_any_object(f, 1);
    fclose(f);
    char cmd[512], out[4096];
    snprintf(cmd, sizeof cmd, "python3 %s %s 2>&1", VALIDATE, path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run %s", cmd);
    int good = 0;
    while (p && fgets(out, sizeof out, p)) {
        out[strcspn(out, "\n")] = 0;
        if (!strncmp(out, "ok ", 3)) good++;
        else CHECK(0, "validate.py: %s", out);
    }
    int rc = p ? pclose(p) : -1;
    CHECK(rc == 0, "%s exited with status %d", cmd, rc);
    CHECK(good == lines, "%d of %d sample sets validated", good, lines);
    printf("  %d sample sets validated by python-jsonschema\n", good);
    unlink(path);
}

/* sm_schema_any_object: nested objects match, other values do not (its random walks go to
 * the validator with the corpus). */
static void test_any_object(void) {
    sm_err err;
    sm_gram *g = compile(NULL, 0, &err);
    CHECK(g != NULL, "any_object: %s", err.msg);
    if (!g) return;
    static const char *yes[] = {"{}", "{\"a\":1}", "{\"a\":{\"b\":{\"c\":[1,{\"d\":[]}]}}}", "{\"\":null,\"x\":\"\\u00e9\"}",
                                "{\"a\":[[[[[[[[[[1]]]]]]]]]],\"b\":-0.5e-3,\"c\":true}"};
    static const char *no[] = {"[]", "1", "\"x\"", "{\"a\":}", "{\"a\":1,}", "{a:1}", "{\"a\":1}}", " {}"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) CHECK(matches(g, yes[i]), "any_object rejects %s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) CHECK(!matches(g, no[i]), "any_object accepts %s", no[i]);
    sm_gram_free(g);
    g = compile(NULL, 1, &err);
    CHECK(g && matches(g, "{ \"a\" :\n[ 1 ,\t2 ] , \"b\":{ } }"), "any_object with whitespace");
    sm_gram_free(g);
}

/* any_whitespace: whitespace between tokens, never inside them. */
static void test_whitespace(void) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"array\","
                    "\"items\":{\"enum\":[\"x\",{\"k\":[1]}]}}},\"required\":[\"a\"]}";
    sm_err err;
    sm_gram *w = compile(s, 1, &err), *c = compile(s, 0, &err);
    CHECK(w && c, "compile: %s", err.msg);
    if (w && c) {
        const char *spaced = "{ \"a\" : 1 ,\n \"b\" : [ \"x\" , { \"k\" : [ 1 ] } ] }";
        CHECK(matches(w, spaced), "ws grammar rejects %s", spaced);
        CHECK(!matches(c, spaced), "compact grammar accepts %s", spaced);
        CHECK(matches(w, "{\"a\":1}") && matches(c, "{\"a\":1}"), "compact text");
        CHECK(!matches(w, "{\"a\":1 2}") && !matches(w, "{ \"a\":- 1}"), "ws inside a token");
    }
    sm_gram_free(w);
    sm_gram_free(c);
}

/* Integer bounds: every integer of [-150, 150] against exact comparison. */
static void test_integer_grid(void) {
    static const char *bounds[][4] = {
        /* minimum, exclusiveMinimum, maximum, exclusiveMaximum (NULL: absent) */
        {"0", NULL, "100", NULL}, {"-5", NULL, "5", NULL}, {NULL, "0", NULL, NULL}, {NULL, NULL, "-3", NULL},
        {"1", NULL, NULL, "10"}, {"-2.5", NULL, "2.5", NULL}, {NULL, "1.5", NULL, "4.0"}, {"-99", NULL, "-10", NULL},
        {"7", NULL, "7", NULL}, {NULL, "-100", NULL, "100"}, {"-150.0", NULL, "149.9", NULL}, {"10", "12", "50", "40"},
    };
    static const char *kw[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (size_t t = 0; t < sizeof bounds / sizeof *bounds; t++) {
        char s[512];
        int k = snprintf(s, sizeof s, "{\"type\":\"integer\"");
        double b[4];
        for (int j = 0; j < 4; j++)
            if (bounds[t][j]) {
                k += snprintf(s + k, sizeof s - (size_t)k, ",\"%s\":%s", kw[j], bounds[t][j]);
                b[j] = strtod(bounds[t][j], NULL);
            }
        snprintf(s + k, sizeof s - (size_t)k, "}");
        sm_err err;
        sm_gram *g = compile(s, 0, &err);
        CHECK(g != NULL, "%s: %s", s, err.msg);
        if (!g) continue;
        int bad = 0;
        for (int v = -150; v <= 150 && bad < 3; v++) {
            int in = (!bounds[t][0] || v >= b[0]) && (!bounds[t][1] || v > b[1]) && (!bounds[t][2] || v <= b[2]) &&
                     (!bounds[t][3] || v < b[3]);
            char num[16];
            snprintf(num, sizeof num, "%d", v);
            int got = matches(g, num);
            CHECK(got == in, "%s: %s %s", s, num, in ? "rejected" : "accepted");
            bad += got != in;
        }
        sm_gram_free(g);
    }
}

/* Decimal bounds: every k/100 in [-12, 12] (as "i.ff", and "i" when whole) against exact
 * comparison in hundredths (the bounds are exact doubles with at most two decimals); plus texts
 * whose double rounds onto an exclusive bound. */
static void test_decimal_grid(void) {
    static const struct { const char *schema; int lo, lo_ex, hi, hi_ex, has_lo, has_hi; } T[] = {
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", 0, 0, 100, 0, 1, 1},
        {"{\"type\":\"number\",\"minimum\":-5.5,\"maximum\":1e3}", -550, 0, 100000, 0, 1, 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}", 0, 1, 100, 1, 1, 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-2.25}", -225, 1, 0, 0, 1, 0},
        {"{\"type\":\"number\",\"maximum\":-0.75}", 0, 0, -75, 0, 0, 1},
        {"{\"type\":\"number\",\"minimum\":-10,\"exclusiveMaximum\":10.5}", -1000, 0, 1050, 1, 1, 1},
        {"{\"type\":\"number\",\"minimum\":2.5,\"maximum\":2.5}", 250, 0, 250, 0, 1, 1},
    };
    for (size_t t = 0; t < sizeof T / sizeof *T; t++) {
        sm_err err;
        sm_gram *g = compile(T[t].schema, 0, &err);
        CHECK(g != NULL, "%s: %s", T[t].schema, err.msg);
        if (!g) continue;
        int bad = 0;
        for (int v = -1200; v <= 1200 && bad < 3; v++) {
            int in = (!T[t].has_lo || (T[t].lo_ex ? v > T[t].lo : v >= T[t].lo)) &&
                     (!T[t].has_hi || (T[t].hi_ex ? v < T[t].hi : v <= T[t].hi));
            int a = abs(v);
            char txt[2][32];
            snprintf(txt[0], sizeof txt[0], "%s%d.%02d", v < 0 ? "-" : "", a / 100, a % 100);
            snprintf(txt[1], sizeof txt[1], "%s%d", v < 0 ? "-" : "", a / 100);
            for (int f = 0; f < (a % 100 ? 1 : 2); f++) {
                int got = matches(g, txt[f]);
                CHECK(got == in, "%s: %s %s", T[t].schema, txt[f], in ? "rejected" : "accepted");
                bad += got != in;
            }
        }
        sm_gram_free(g);
    }
    /* 0.99999999999999999999 reads as 1.0, which is not < 1; 0.1 reads as the double 0.1 */
    sm_err err;
    sm_gram *g = compile("{\"type\":\"number\",\"exclusiveMaximum\":1,\"minimum\":0.1}", 0, &err);
    CHECK(g != NULL, "%s", err.msg);
    if (g) {
        CHECK(!matches(g, "0.99999999999999999999"), "a text that rounds onto the exclusive bound");
        CHECK(matches(g, "0.9999999999999999"), "the double below the exclusive bound");
        CHECK(matches(g, "0.1") && !matches(g, "0.09999"), "minimum 0.1");
        CHECK(!matches(g, "-0") && !matches(g, "1e-1"), "no -0, no exponent");
    }
    sm_gram_free(g);
}

/* Strings: length counts characters (raw code points and escapes), pattern text escaped. */
static void test_strings(void) {
    sm_err err;
    sm_gram *g = compile("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", 0, &err);
    CHECK(g != NULL, "%s", err.msg);
    if (g) {
        CHECK(matches(g, "\"\\u00e9\\n\"") && matches(g, "\"\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\""), "2 and 3 characters");
        CHECK(!matches(g, "\"\xf0\x9f\x98\x80\"") && !matches(g, "\"abcd\""), "1 and 4 characters");
        CHECK(!matches(g, "\"\\ud83d\\ude00\""), "a surrogate pair (one character to a validator)");
    }
    sm_gram_free(g);
    g = compile("{\"type\":\"string\",\"pattern\":\"^[\\\"" "\\\\\\\\\\\\" "n/]{2}$\"}", 0, &err);
    CHECK(g != NULL, "%s", err.msg);
    if (g) {
        CHECK(matches(g, "\"\\\"\\\\\"") && matches(g, "\"\\n/\""), "escaped pattern characters");
        CHECK(!matches(g, "\"\"\"\"") && !matches(g, "\"\n/\"") && !matches(g, "\"\\/\\/\""), "raw or alternative escapes");
    }
    sm_gram_free(g);
}

int main(void) {
    RUN(test_corpus_compile);
    RUN(test_corpus_converse);
    RUN(test_corpus_samples);
    RUN(test_any_object);
    RUN(test_whitespace);
    RUN(test_integer_grid);
    RUN(test_decimal_grid);
    RUN(test_strings);
    json_decref(corpus);
    return TEST_DONE();
}
