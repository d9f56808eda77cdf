/* cmd_constrain.c: `sparkmono constrain`: compile a structured-output constraint (regex, JSON
 * Schema, json_object, choice: src/constrain/) against a model's vocabulary, check texts against
 * it, and time it: the compile, the token mask of each new automaton state (a trie walk over
 * the vocabulary) and the cached masks a verify step copies.
 *
 * The vocabulary is the model directory's tokenizer.json (ids, eos and vocab_used from its
 * config.json; no weights are read), or --synthetic-vocab N: N byte-level tokens made up here
 * (the 256 bytes, then words with and without a leading space, numbers, JSON punctuation, UTF-8
 * letters), the size of Muse Spark's (202,048) without its tokenizer.  --bench walks a random
 * generation (each step a random id the mask allows, eos where allowed with probability 1/32)
 * and reports per step the host cost at 8 and 128 rows.  We rejected timing through the engine:
 * the model's step would hide what the constraint costs, which is what this measures (the GPU
 * side of a masked step is `sparkmono bench --masks`).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"
#include "backend/stats.h"
#include "constrain/constrain.h"
#include "model/config.h"
#include "model/rng.h"
#include "model/tokenizer.h"

const cli_cmd cli_help_constrain = {
    "constrain",
    "compile a structured-output constraint against a vocabulary; check texts; time its masks",
    "(DIR | --synthetic-vocab N) (--regex R | --json-schema FILE | --json-object | --choice JSON) [options]",
    "sparkmono constrain build/models/tiny --json-schema schema.json --text '{\"a\":1}'",
    "DIR is a model directory (tokenizer.json and config.json).  The constraint is compiled as the\n"
    "server compiles response_format / structured_outputs: a refusal prints one line and exits 2.\n"
    "--text prints \"match\", \"prefix\" (the text can still be completed) or \"no\" and exits 0, 0, 1.",
};


/* A made-up byte-level vocabulary of V ids (the last one the eos): 256 single bytes, then
 * words of 2..12 letters with or without a leading space, digit runs, JSON punctuation runs
 * and two-byte / three-byte UTF-8 letters, drawn from a fixed generator.  b [V], len [V] point
 * into *arena (caller frees). */
static int synth_vocab(int V, unsigned char ***b, size_t **len, unsigned char **arena, sm_err *e) {
    static const char *punct[] = {"\"", "\",", "\":", "{\"", "\"}", "},", "[{", "}]", "\",\"", "\":\"", ", ", ": ", "\n", "  "};
    *b = malloc(sizeof **b * (size_t)V);
    *len = malloc(sizeof **len * (size_t)V);
    *arena = malloc((size_t)V * 16);
    if (!*b || !*len || !*arena) return sm_errf(e, "constrain: out of memory for a vocabulary of %d ids", V);
    uint64_t rng = 12345;
    unsigned char *p = *arena;
    for (int id = 0; id < V - 1; id++) {
        unsigned char *w = p;
        if (id < 256) {
            *p++ = (unsigned char)id;
        } else {
            const uint64_t r = sm_rng_next(&rng), kind = r % 16;
            if (kind < 10) { /* a word */
                if (r & 16) *p++ = ' ';
                const int n = 2 + (int)((r >> 8) % 11);
                for (int k = 0; k < n; k++) *p++ = (unsigned char)('a' + sm_rng_next(&rng) % 26);
                if ((r >> 20) % 8 == 0) w[(r & 16) ? 1 : 0] -= 32; /* Capitalized */
            } else if (kind < 12) { /* digits */
                const int n = 1 + (int)((r >> 8) % 3);
                for (int k = 0; k < n; k++) *p++ = (unsigned char)('0' + sm_rng_next(&rng) % 10);
            } else if (kind < 14) { /* JSON punctuation, maybe with a word */
                const char *s = punct[(r >> 8) % (sizeof punct / sizeof punct[0])];
                memcpy(p, s, strlen(s));
                p += strlen(s);
                if ((r >> 16) & 1) *p++ = (unsigned char)('a' + (r >> 24) % 26);
            } else { /* a UTF-8 letter or two: U+00C0..U+024F or U+4E00..U+9FFF */
                const int n = 1 + (int)((r >> 8) % 2);
                for (int k = 0; k < n; k++) {
                    const uint32_t c = (r >> 12) & 1 ? 0x4E00 + (uint32_t)(sm_rng_next(&rng) % 0x5200)
                                                     : 0xC0 + (uint32_t)(sm_rng_next(&rng) % 0x190);
                    if (c < 0x800) { *p++ = (unsigned char)(0xC0 | (c >> 6)); *p++ = (unsigned char)(0x80 | (c & 0x3F)); }
                    else {
                        *p++ = (unsigned char)(0xE0 | (c >> 12));
                        *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
                        *p++ = (unsigned char)(0x80 | (c & 0x3F));
                    }
                }
            }
        }
        (*b)[id] = w;
        (*len)[id] = (size_t)(p - w);
    }
    (*b)[V - 1] = p; /* the eos: no bytes */
    (*len)[V - 1] = 0;
    return 0;
}

/* The vocabulary of DIR (tokenizer.json + config.json) or a synthetic one of nsyn ids. */
static int load_vocab(const char *dir, long nsyn, sm_vocab **v, sm_err *e) {
    if (!dir) {
        unsigned char **b = NULL, *arena = NULL;
        size_t *len = NULL;
        uint8_t *ok = malloc((size_t)nsyn);
        int rc = !ok ? sm_errf(e, "constrain: out of memory") : synth_vocab((int)nsyn, &b, &len, &arena, e);
        if (!rc) {
            for (long i = 0; i < nsyn; i++) ok[i] = len[i] > 0;
            const int eos = (int)nsyn - 1;
            rc = sm_vocab_build_raw((int)nsyn, (const unsigned char *const *)b, len, ok, &eos, 1, v, e);
        }
        free(b); free(len); free(arena); free(ok);
        return rc;
    }
    char path[4200];
    sm_config c;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (sm_config_load(path, &c, e)) return -1;
    sm_tokenizer *t = NULL;
    if (sm_tokenizer_load_dir(dir, &t, path, sizeof path, e)) return -1;
    if (!t) return sm_errf(e, "constrain: %s has no tokenizer.json", dir);
    int rc = sm_vocab_build(t, c.V, c.vocab_used, c.eos, c.n_eos, v, e);
    sm_tokenizer_free(t);
    return rc;
}

/* --bench: a random walk of up to 256 ids; the first mask of each new state timed apart from
 * the cached lookups. */
static int bench(sparkmono_constraint *c, const sm_vocab *v, sm_err *e) {
    uint64_t rng = 99;
    int pos = sm_con_start(c), steps = 0, fresh = 0, nid = 0;
    int *allowed = malloc(sizeof(int) * (size_t)v->V);
    float *tf = malloc(sizeof(float) * 257);
    uint32_t *m = malloc(sizeof(uint32_t) * (size_t)v->words);
    if (!allowed || !tf || !m) { free(allowed); free(tf); free(m); return sm_errf(e, "constrain: out of memory"); }
    double cached = 0;
    float tmax = 0;
    for (; steps < 256 && pos != SM_CON_ENDED; steps++) {
        const int isnew = pos >= 0 && !sm_gram_slot(c->g, pos);
        double t0 = cli_now();
        if (sm_con_mask(c, pos, m, e) < 0) { free(allowed); free(tf); free(m); return -1; }
        double t1 = cli_now();
        if (isnew) {
            tf[fresh++] = (float)((t1 - t0) * 1e3);
            if (tf[fresh - 1] > tmax) tmax = tf[fresh - 1];
        }
        /* a cached mask's copy: what every later row at this state costs */
        t0 = cli_now();
        for (int k = 0; k < 100; k++) sm_con_mask(c, pos, m, e);
        cached += (cli_now() - t0) / 100;
        int na = 0;
        for (int id = 0; id < v->V; id++)
            if (sm_mask_has(m, id)) allowed[na++] = id;
        if (!na) break;
        int id = allowed[sm_rng_next(&rng) % (uint64_t)na];
        for (int k = 0; k < v->n_eos; k++)
            if (sm_mask_has(m, v->eos[k]) && sm_rng_next(&rng) % 32 == 0) id = v->eos[k];
        pos = sm_con_advance(c, pos, id, e);
        nid++;
        if (pos < 0 && pos != SM_CON_ENDED) { free(allowed); free(tf); free(m); return sm_errf(e, "constrain: the walk left the constraint"); }
    }
    const double lookup_us = steps ? 1e6 * cached / steps : 0;
    printf("bench: %d steps, %d new states (%d automaton configurations); first mask of a state: median %.2f ms, max %.2f ms; "
           "a cached mask: %.3f us a row, %.2f us a step of 8 rows, %.1f us a step of 128 rows\n",
           steps, fresh, sm_gram_nconfigs(c->g), fresh ? sm_median(tf, fresh) : 0.0, tmax,
           lookup_us, 8 * lookup_us, 128 * lookup_us);
    free(allowed);
    free(tf);
    free(m);
    return 0;
}

int cmd_constrain(int argc, char **argv) {
    const char *cmd = "constrain";
    cli_opt opts[] = {
        CLI_OPT("synthetic-vocab", "N", NULL, "a made-up byte-level vocabulary of N ids instead of a model directory"),
        CLI_OPT("regex", "R", NULL, "the text fullmatches the regular expression R"),
        CLI_OPT("json-schema", "FILE", NULL, "the text is compact JSON valid under the JSON Schema in FILE (- reads stdin)"),
        CLI_SWITCH("json-object", "the text is any JSON object"),
        CLI_OPT("choice", "JSON", NULL, "the text is one of the strings of the JSON array"),
        CLI_SWITCH("any-whitespace", "JSON may have whitespace between its tokens (default: compact)"),
        CLI_OPT("text", "STR", NULL, "check STR: match, prefix or no"),
        CLI_SWITCH("bench", "time the masks along a random generation"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos, rc = 2;
    sm_err e = {{0}};
    sm_vocab *v = NULL;
    sparkmono_constraint *c = NULL;
    char *spec = NULL;
    uint32_t *m = NULL;
    size_t len = 0;
    int r = cli_parse(&cli_help_constrain, argc, argv, opts, no, pos, 1, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *syn = cli_find(opts, no, "synthetic-vocab"), *rx = cli_find(opts, no, "regex"), *js = cli_find(opts, no, "json-schema"),
            *jo = cli_find(opts, no, "json-object"), *ch = cli_find(opts, no, "choice"), *tx = cli_find(opts, no, "text");
    if ((npos == 1) == syn->present) { sm_errf(&e, "%s: give a model directory DIR or --synthetic-vocab N (exactly one)", cmd); goto bad; }
    if (rx->present + js->present + jo->present + ch->present != 1) {
        sm_errf(&e, "%s: give exactly one of --regex, --json-schema, --json-object and --choice", cmd);
        goto bad;
    }
    long nsyn = 0;
    if (syn->present && cli_int(cmd, syn, 257, 4 << 20, &nsyn, &e)) goto bad;
    const char *kind = rx->present ? "regex" : js->present ? "json_schema" : jo->present ? "json_object" : "choice";
    if (js->present) {
        char what[600];
        snprintf(what, sizeof what, "%s: --json-schema %s", cmd, js->value);
        if (cli_read_all(what, js->value, &spec, &len, &e)) goto bad;
    } else if (!jo->present) {
        const char *s = rx->present ? rx->value : ch->value;
        len = strlen(s);
        if (!(spec = strdup(s))) { sm_errf(&e, "%s: out of memory", cmd); goto bad; }
    }
    double t0 = cli_now();
    if (load_vocab(npos ? pos[0] : NULL, nsyn, &v, &e)) { sm_errprefix(&e, "%s", cmd); goto bad; }
    double t1 = cli_now();
    if (sm_con_create(v, kind, spec, len, cli_find(opts, no, "any-whitespace")->present, &c, &e)) {
        sm_errprefix(&e, "%s", cmd);
        goto bad;
    }
    double t2 = cli_now();
    /* the first mask: what the first generated token waits for */
    if (!(m = malloc(sizeof(uint32_t) * (size_t)v->words))) { sm_errf(&e, "%s: out of memory", cmd); goto bad; }
    if (sm_con_mask(c, sm_con_start(c), m, &e) < 0) goto bad;
    double t3 = cli_now();
    int na = 0;
    for (int id = 0; id < v->V; id++) na += sm_mask_has(m, id);
    printf("%s: compiled in %.2f ms (%d ids, %d trie nodes, vocabulary built in %.1f ms); first mask in %.2f ms: %d ids allowed\n",
           kind, (t2 - t1) * 1e3, v->V, v->nnodes, (t1 - t0) * 1e3, (t3 - t2) * 1e3, na);
    if (cli_find(opts, no, "bench")->present && bench(c, v, &e)) goto bad;
    rc = 0;
    if (tx->present) {
        int p = sm_gram_walk(c->g, sm_con_start(c), (const uint8_t *)tx->value, strlen(tx->value));
        const char *what = p < 0 ? "no" : sm_gram_accepting(c->g, p) ? "match" : "prefix";
        printf("%s\n", what);
        rc = p < 0 ? 1 : 0;
    }
    goto out;
bad:
    fprintf(stderr, "%s\n", e.msg);
out:
    sm_con_release(c);
    sm_vocab_free(v);
    free(spec);
    free(m);
    return rc;
}
