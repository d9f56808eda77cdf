/* cmd_generate.c: `sparkmono generate`: generation through the public API, greedy or sampled
 * (--temperature, --top-k, --top-p, --seed), with speculative verify steps (n-gram drafts, R
 * rows a request) or plain decoding (--no-spec); one prompt, or a JSONL file of requests
 * (--batch) run with continuous batching.
 *
 * One prompt: three lines on stdout: the generated ids (comma-separated, so they can be fed
 * back as --prompt-ids), the tokens emitted by every verify step (accepted drafts + 1), and
 * tokens/s with the mean accepted drafts a step.  It drives add / prefill / verify itself
 * rather than sparkmono_generate so it can print the per-step acceptance; we rejected a
 * callback in the public API for this one use.
 *
 * --batch FILE: every line is checked (JSON, keys, values, ids against the vocabulary, length
 * against --max-len) before the first step, so a bad line costs no compute; a text prompt is
 * encoded with the model directory's tokenizer.json (src/model/tokenizer.h; no bos added), and a
 * result's text is its ids decoded without the special tokens.  Then up to
 * --max-requests requests are live at once: between two verify steps the finished ones leave
 * (their slots and cache pages freed) and waiting ones join (add + prefill), in file order:
 * the engine's batch (sparkmono_batch_*, src/engine/batch.c) does it, as for `serve`.
 * Results are JSONL in input order (a finished request waits for those before it), on stdout
 * or through src/base/outfile.c into --out; a progress line goes to stderr, and a summary with
 * the engine's prefix-cache counters (sparkmono_cache_stats_get) at the end.  Since a request's
 * tokens depend only on its prompt and sampling (sample.h: batch-invariant draws), each
 * result equals what `generate` gives for that request alone.  We rejected a fixed batch
 * (start the next group when the whole group is done): a long request would idle every slot.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include "cli.h"
#include "base/outfile.h"
#include "engine/sample.h"
#include "serve/serve_fields.h"
#include "sparkmono.h"
#include "model/tokenizer.h"

const cli_cmd cli_help_generate = {
    "generate",
    "generation (greedy or sampled) with speculative verify steps (n-gram drafts); one prompt or a batch",
    "--model DIR (--prompt TEXT | --prompt-ids LIST | --prompt-file FILE | --batch FILE.jsonl) [--max-tokens N] [options]",
    "sparkmono generate --model build/models/tiny --prompt-ids 11,12,13,11,12 --max-tokens 32",
    "One prompt: prints three lines: 'ids: ...' (the generated ids, comma-separated), 'accept: ...'\n"
    "(tokens emitted by each verify step: accepted drafts + 1) and 'tokens/s: ...' (with the mean\n"
    "accepted drafts a step).  Speculative and plain (--no-spec) runs emit the same ids, sampled\n"
    "ones too (for the same --seed).\n"
    "--batch FILE.jsonl: one request a line, {\"ids\": [1, 2]} or {\"prompt\": \"text\"} (encoded with\n"
    "the model directory's tokenizer.json, no bos added), and optionally \"max_tokens\",\n"
    "\"temperature\", \"top_k\", \"top_p\", \"seed\" (the flags give their defaults) and the server's logit\n"
    "processor fields (presence_penalty, frequency_penalty, repetition_penalty, logit_bias, min_tokens,\n"
    "ignore_eos, stop_token_ids, min_p, allowed_token_ids; on top of the flags' values).  Prints one JSON\n"
    "line a request, in input order: index, ids, text (decoded without special tokens, when the\n"
    "model has a tokenizer), prompt_tokens, completion_tokens, steps, accepted, finish_reason\n"
    "(\"stop\": an eos id, \"length\": max_tokens); a progress line on stderr, ending with a summary\n"
    "(tokens/s, the prompt tokens prefilled and those the prefix cache served: prompts sharing a\n"
    "prefix of whole 16-token pages reuse its KV pages; --no-prefix-cache prefills every prompt whole).",
};


/* A number option (its value, else its default) within [lo, hi]. */
/* The sampling and logit-processor flags into *s (temperature 0: greedy). */
static int sampling_opts(const char *cmd, cli_opt *opts, int no, sparkmono_sampling *s, sm_err *e) {
    double t, p, pres, freq, rep;
    long k, seed, mint;
    if (cli_number(cmd, cli_find(opts, no, "temperature"), 0, 1e6, &t, e) ||
        cli_number(cmd, cli_find(opts, no, "top-p"), 0, 1, &p, e) || cli_int(cmd, cli_find(opts, no, "top-k"), 0, INT_MAX, &k, e) ||
        cli_int(cmd, cli_find(opts, no, "seed"), 0, LONG_MAX, &seed, e) ||
        cli_number(cmd, cli_find(opts, no, "presence-penalty"), -2, 2, &pres, e) ||
        cli_number(cmd, cli_find(opts, no, "frequency-penalty"), -2, 2, &freq, e) ||
        cli_number(cmd, cli_find(opts, no, "repetition-penalty"), 1e-6, 1e6, &rep, e) ||
        cli_int(cmd, cli_find(opts, no, "min-tokens"), 0, 1 << 24, &mint, e))
        return -1;
    memset(s, 0, sizeof *s);
    s->presence_penalty = (float)pres;
    s->frequency_penalty = (float)freq;
    s->repetition_penalty = (float)rep;
    s->min_tokens = (int)mint;
    s->ignore_eos = cli_find(opts, no, "ignore-eos")->present;
    s->temperature = (float)t;
    s->top_k = (int)k;
    s->top_p = (float)p;
    s->seed = (unsigned long long)seed;
    return 0;
}

/* ---- batch ------------------------------------------------------------------------------ */

/* One request of the batch file. */
typedef struct breq {
    long line;               /* its line in the file (1-based) */
    int *ids;                /* [n] prompt ids (malloc'd; from "ids" or the encoded "prompt") */
    int n;
    char *text;              /* "prompt" (malloc'd), NULL for "ids" */
    int max_tokens;
    sparkmono_sampling s;
    char *result;            /* its JSON result line once finished (malloc'd), else NULL */
    int *out;                /* [max_tokens] its generated ids (malloc'd once submitted) */
    int nout;                /* of which the first nout are out */
    int steps;               /* verify steps it took part in so far */
} breq;

static void breqs_free(breq *q, int n) {
    for (int i = 0; q && i < n; i++) {
        free(q[i].ids);
        free(q[i].text);
        free(q[i].result);
        free(q[i].out);
    }
    free(q);
}

/* A JSON integer within [lo, hi] into *out; else an error naming file:line and the key. */
static int json_int_in(const char *where, const char *key, json_t *v, long long lo, long long hi, long long *out, sm_err *e) {
    if (!json_is_integer(v)) return sm_errf(e, "%s: \"%s\" must be an integer", where, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return sm_errf(e, "%s: \"%s\" = %lld is not in [%lld, %lld]", where, key, x, lo, hi);
    *out = x;
    return 0;
}

/* Parse one line (len bytes, a JSON object) into q; dflt gives max_tokens (0: none) and the
 * sampling of keys left out. */
static int parse_request(const char *where, const char *buf, size_t len, const breq *dflt, breq *q, sm_err *e) {
    json_error_t je;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return sm_errf(e, "%s: malformed JSON at column %d: %s", where, je.column, je.text);
    int rc = -1;
    const char *key;
    json_t *v;
    long long x;
    q->max_tokens = dflt->max_tokens;
    q->s = dflt->s;
    if (!json_is_object(o)) { sm_errf(e, "%s: a request is a JSON object, not %s", where, json_is_array(o) ? "a list" : "a value"); goto out; }
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "ids")) {
            size_t n = json_is_array(v) ? json_array_size(v) : 0;
            if (!n || n > INT_MAX) { sm_errf(e, "%s: \"ids\" must be a non-empty list of token ids", where); goto out; }
            if (!(q->ids = malloc(n * sizeof(int)))) { sm_errf(e, "%s: out of memory for %zu ids", where, n); goto out; }
            for (size_t i = 0; i < n; i++) {
                json_t *t = json_array_get(v, i);
                if (!json_is_integer(t) || json_integer_value(t) < INT_MIN || json_integer_value(t) > INT_MAX) {
                    sm_errf(e, "%s: \"ids\"[%zu] is not an integer id", where, i);
                    goto out;
                }
                q->ids[i] = (int)json_integer_value(t);
            }
            q->n = (int)n;
        } else if (!strcmp(key, "prompt")) {
            if (!json_is_string(v) || json_string_length(v) == 0) { sm_errf(e, "%s: \"prompt\" must be a non-empty string", where); goto out; }
            if (!(q->text = strdup(json_string_value(v)))) { sm_errf(e, "%s: out of memory", where); goto out; }
        } else if (!strcmp(key, "max_tokens")) {
            if (json_int_in(where, key, v, 1, 1 << 24, &x, e)) goto out;
            q->max_tokens = (int)x;
        } else if (!strcmp(key, "top_k")) {
            if (json_int_in(where, key, v, 0, INT_MAX, &x, e)) goto out;
            q->s.top_k = (int)x;
        } else if (!strcmp(key, "seed")) {
            if (json_int_in(where, key, v, 0, LLONG_MAX, &x, e)) goto out;
            q->s.seed = (unsigned long long)x;
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p")) {
            if (!json_is_number(v)) { sm_errf(e, "%s: \"%s\" must be a number", where, key); goto out; }
            if (!strcmp(key, "top_p")) q->s.top_p = (float)json_number_value(v);
            else q->s.temperature = (float)json_number_value(v);
        } else {
            /* the server's logit-processor fields (serve_fields.h); ids are checked against the
             * vocabulary when the request is submitted */
            char param[32];
            int k = sm_fields_sampling(key, v, INT_MAX, 1 << 24, &q->s, param, e);
            if (k < 0) { sm_errprefix(e, "%s", where); goto out; }
            if (k == 0) {
                sm_errf(e, "%s: unknown key \"%s\" (known: ids, prompt, max_tokens, temperature, top_k, top_p, seed, "
                        "presence_penalty, frequency_penalty, repetition_penalty, logit_bias, min_tokens, ignore_eos, "
                        "stop_token_ids, min_p, allowed_token_ids)", where, key);
                goto out;
            }
        }
    }
    if (!q->ids == !q->text) { sm_errf(e, "%s: give exactly one of \"ids\" and \"prompt\"", where); goto out; }
    if (!q->max_tokens) { sm_errf(e, "%s: \"max_tokens\" is missing (and no --max-tokens default)", where); goto out; }
    if (sm_sample_check(&q->s, e)) { sm_errprefix(e, "%s", where); goto out; }
    rc = 0;
out:
    json_decref(o);
    return rc;
}

/* Read and parse every request of path; blank lines are skipped. */
static int read_batch(const char *cmd, const char *path, const breq *dflt, breq **out, int *nout, sm_err *e) {
    *out = NULL;
    *nout = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return sm_errf(e, "%s: --batch %s: cannot open: %s", cmd, path, strerror(errno));
    breq *q = NULL;
    int n = 0, cap = 0, rc = -1;
    char *buf = NULL, where[600];
    size_t bcap = 0;
    ssize_t len;
    long line = 0;
    while ((len = getline(&buf, &bcap, f)) >= 0) {
        line++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
        size_t i = 0;
        while (i < (size_t)len && (buf[i] == ' ' || buf[i] == '\t')) i++;
        if (i == (size_t)len) continue;
        if (n == cap) {
            int nc = cap ? cap * 2 : 64;
            breq *nq = realloc(q, (size_t)nc * sizeof *q);
            if (!nq) { sm_errf(e, "%s: %s:%ld: out of memory", cmd, path, line); goto out; }
            q = nq;
            cap = nc;
        }
        memset(&q[n], 0, sizeof q[n]);
        q[n].line = line;
        snprintf(where, sizeof where, "%s: %s:%ld", cmd, path, line);
        n++;
        if (parse_request(where, buf, (size_t)len, dflt, &q[n - 1], e)) goto out;
    }
    if (ferror(f)) { sm_errf(e, "%s: %s: read error after line %ld", cmd, path, line); goto out; }
    if (n == 0) { sm_errf(e, "%s: %s: no requests (one JSON object a line)", cmd, path); goto out; }
    rc = 0;
out:
    free(buf);
    fclose(f);
    if (rc) breqs_free(q, n);
    else { *out = q; *nout = n; }
    return rc;
}

/* The JSON result line of request i (ids [n] generated), into q->result. */
static int result_line(int i, breq *q, const int *ids, int n, const sparkmono_request_info *in, const char *text, sm_err *e) {
    json_t *o = json_object(), *a = json_array();
    int bad = !o || !a;
    for (int k = 0; k < n && !bad; k++) bad = json_array_append_new(a, json_integer(ids[k])) != 0;
    bad = bad || json_object_set_new(o, "index", json_integer(i)) || json_object_set(o, "ids", a) ||
          (text && json_object_set_new(o, "text", json_string(text))) ||
          json_object_set_new(o, "prompt_tokens", json_integer(in->prompt_len)) ||
          json_object_set_new(o, "completion_tokens", json_integer(n)) ||
          json_object_set_new(o, "steps", json_integer(in->steps)) ||
          json_object_set_new(o, "accepted", json_integer(in->accepted)) ||
          json_object_set_new(o, "finish_reason", json_string(in->done == 1 ? "stop" : "length"));
    if (!bad) bad = !(q->result = json_dumps(o, JSON_COMPACT));
    json_decref(a);
    json_decref(o);
    return bad ? sm_errf(e, "generate: request %d: cannot write its JSON result (out of memory, or its text is not UTF-8)", i) : 0;
}

/* The text of ids [n] without the special tokens (eos, ...): *text malloc'd. */
static int decode_text(const sm_tokenizer *tk, const int *ids, int n, char **text, sm_err *e) {
    int *keep = malloc(sizeof(int) * (size_t)(n ? n : 1)), k = 0;
    if (!keep) return sm_errf(e, "out of memory for %d ids", n);
    for (int i = 0; i < n; i++)
        if (!sm_tokenizer_is_special(tk, ids[i])) keep[k++] = ids[i];
    size_t len;
    int rc = sm_tokenizer_decode(tk, keep, k, text, &len, e);
    free(keep);
    return rc;
}

/* Progress on stderr: on a terminal one line rewritten in place (at most 10 a second). */
static void progress(int done, int n, int live, long toks, double t0, int last) {
    static double shown;
    if (!isatty(2)) return;
    double t = cli_now();
    if (!last && t - shown < 0.1) return;
    shown = t;
    fprintf(stderr, "\rgenerate --batch: %d/%d done, %d live, %ld tokens, %.1f tokens/s%s", done, n, live, toks,
            t > t0 ? toks / (t - t0) : 0.0, last ? "\n" : "");
    fflush(stderr);
}

typedef struct batch_cfg {
    const char *path;        /* --batch FILE */
    const char *out;         /* --out FILE or NULL (stdout) */
    int max_requests;        /* --max-requests */
    long max_len;            /* --max-len (0: the longest request) */
} batch_cfg;

static int run_batch(const char *cmd, const char *dir, int online_mxfp4, const char *acts, const sparkmono_engine_opts *eo0,
                     const batch_cfg *bc, const breq *dflt) {
    breq *q = NULL;
    int nq = 0, rc = 2;
    sm_err e = {{0}};
    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    sparkmono_batch *b = NULL;
    sm_outfile of;
    memset(&of, 0, sizeof of);
    sm_tokenizer *tk = NULL;
    if (read_batch(cmd, bc->path, dflt, &q, &nq, &e)) goto bad;
    if (bc->out && sm_outfile_open(&of, bc->out, &e)) { sm_errprefix(&e, "%s: --out", cmd); goto bad; }
    sparkmono_model_opts mo = {0};
    mo.online_mxfp4 = online_mxfp4;
    mo.activations = acts;
    if (sparkmono_model_open(dir, &mo, &m)) goto fail;
    sparkmono_model_info info;
    if (sparkmono_model_get_info(m, &info)) goto fail;
    /* the tokenizer of the model directory, when it has one: needed by text prompts; without
     * them, one that does not load only costs the results their text (one warning) */
    char tpath[4200];
    int ntext = 0;
    for (int i = 0; i < nq; i++) ntext += q[i].text != NULL;
    if (sm_tokenizer_load_dir(dir, &tk, tpath, sizeof tpath, &e)) {
        if (ntext) { sm_errprefix(&e, "%s", cmd); goto bad; }
        fprintf(stderr, "%s: warning: %s; the results have no text\n", cmd, e.msg);
        tk = NULL;
    }
    /* text prompts to ids; every id in the vocabulary; lengths within --max-len */
    long max_len = 0;
    for (int i = 0; i < nq; i++) {
        breq *r = &q[i];
        char where[600];
        snprintf(where, sizeof where, "%s: %s:%ld", cmd, bc->path, r->line);
        if (r->text) {
            if (!tk) { sm_errf(&e, "%s: a text prompt needs the model's tokenizer, %s, which does not exist", where, tpath); goto bad; }
            if (sm_tokenizer_encode(tk, r->text, strlen(r->text), &r->ids, &r->n, &e)) { sm_errprefix(&e, "%s", where); goto bad; }
            if (r->n == 0) { sm_errf(&e, "%s: the prompt encodes to no tokens", where); goto bad; }
        }
        for (int k = 0; k < r->n; k++)
            if (r->ids[k] < 0 || r->ids[k] >= info.vocab_size) {
                sm_errf(&e, "%s: token index %d is %d, outside the vocabulary [0, %d)", where, k, r->ids[k], info.vocab_size);
                goto bad;
            }
        long need = (long)r->n + r->max_tokens;
        if (bc->max_len && need > bc->max_len) {
            sm_errf(&e, "%s: prompt of %d tokens + max_tokens %d exceeds --max-len %ld", where, r->n, r->max_tokens, bc->max_len);
            goto bad;
        }
        if (need > max_len) max_len = need;
    }
    if (bc->max_len) max_len = bc->max_len;
    if (max_len > (1 << 24)) { sm_errf(&e, "%s: %s: a request needs %ld positions, more than %d", cmd, bc->path, max_len, 1 << 24); goto bad; }
    sparkmono_engine_opts eo = *eo0;
    eo.max_requests = bc->max_requests < nq ? bc->max_requests : nq;
    eo.max_len = (int)max_len;
    if (sparkmono_engine_create(m, &eo, &g)) goto fail;
    /* every request into the batch's queue (checked above, so none is refused), in file order */
    if (sparkmono_batch_create(g, -1, &b)) goto fail;
    for (int i = 0; i < nq; i++) {
        long long id;
        if (!(q[i].out = malloc((size_t)q[i].max_tokens * sizeof(int)))) { sm_errf(&e, "%s: out of memory", cmd); goto bad; }
        if (sparkmono_batch_submit(b, q[i].ids, q[i].n, q[i].max_tokens, &q[i].s, &q[i], &id)) goto fail;
    }

    /* continuous batching (src/engine/batch.c): join, one verify step, leave; results flushed in input order */
    FILE *out = bc->out ? of.f : stdout;
    int finished = 0, flushed = 0, live = 0;
    long toks = 0, steps = 0, acc_sum = 0, step_sum = 0;
    double t0 = cli_now();
    while (finished < nq) {
        const sparkmono_batch_event *ev;
        int nev, verified = 0;
        if (sparkmono_batch_step(b, &ev, &nev)) goto fail;
        for (int k = 0; k < nev; k++) {
            breq *r = ev[k].user;
            memcpy(r->out + r->nout, ev[k].ids, (size_t)ev[k].n * sizeof(int));
            r->nout += ev[k].n;
            verified |= ev[k].steps > r->steps; /* a verify step ran: its requests' step counts grew */
            r->steps = ev[k].steps;
            if (ev[k].done == SM_BATCH_RUNNING) continue;
            if (ev[k].done != SM_BATCH_EOS && ev[k].done != SM_BATCH_LENGTH) {
                sm_errf(&e, "%s: %s:%ld: %s", cmd, bc->path, r->line, ev[k].err);
                goto bad;
            }
            sparkmono_request_info in = {.prompt_len = ev[k].prompt_len, .done = ev[k].done, .steps = ev[k].steps,
                                         .accepted = ev[k].accepted};
            char *text = NULL;
            if (tk && decode_text(tk, r->out, r->nout, &text, &e)) { sm_errprefix(&e, "%s: %s:%ld", cmd, bc->path, r->line); goto bad; }
            int bad_json = result_line((int)(r - q), r, r->out, r->nout, &in, text, &e);
            free(text);
            if (bad_json) goto bad;
            toks += r->nout;
            acc_sum += in.accepted;
            step_sum += in.steps;
            finished++;
        }
        steps += verified;
        /* results in input order: every finished one whose predecessors are written */
        for (; flushed < nq && q[flushed].result; flushed++) {
            fprintf(out, "%s\n", q[flushed].result);
            free(q[flushed].result);
            q[flushed].result = NULL;
        }
        if (!bc->out) fflush(stdout);
        sparkmono_batch_counts(b, &live, NULL);
        progress(finished, nq, live, toks, t0, finished == nq);
    }
    double dt = cli_now() - t0;
    if (ferror(out)) { sm_errf(&e, "%s: writing the results failed", cmd); goto bad; }
    if (bc->out && sm_outfile_commit(&of, &e)) { sm_errprefix(&e, "%s: --out", cmd); goto bad; }
    sparkmono_cache_stats cs;
    if (sparkmono_cache_stats_get(g, &cs)) goto fail;
    char pc[96]; /* the prompt tokens the prefills computed, and those the prefix cache served */
    if (cs.enabled) snprintf(pc, sizeof pc, "%lld prompt tokens computed, %lld from the prefix cache", cs.computed, cs.hits);
    else snprintf(pc, sizeof pc, "%lld prompt tokens computed, prefix cache off", cs.computed);
    fprintf(stderr, "generate --batch: %d requests, %ld tokens in %.3f s: %.1f tokens/s (%ld verify steps; up to %d requests "
            "at once; %.2f accepted drafts a request step; %s)\n", nq, toks, dt, dt > 0 ? toks / dt : 0.0, steps,
            eo.max_requests, step_sum ? (double)acc_sum / (double)step_sum : 0.0, pc);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "%s: %s\n", cmd, sparkmono_errmsg());
    goto out;
bad:
    fprintf(stderr, "%s\n", e.msg);
out:
    sm_outfile_abort(&of);
    sm_tokenizer_free(tk);
    breqs_free(q, nq);
    sparkmono_batch_destroy(b);
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------ */

int cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    cli_opt opts[] = {
        CLI_OPT("model", "DIR", NULL, "checkpoint directory (required)"),
        CLI_OPT("prompt-ids", "LIST", NULL, "prompt token ids, comma-separated: 1,2,3"),
        CLI_OPT("prompt-file", "FILE", NULL, "prompt token ids from FILE, separated by whitespace and/or commas; - reads stdin"),
        CLI_OPT("prompt", "TEXT", NULL, "prompt text, encoded with the model directory's tokenizer.json (no bos added); the "
                "output's text is printed too"),
        CLI_OPT("batch", "FILE", NULL, "requests from a JSONL file, one a line (see below), run with continuous batching"),
        CLI_OPT("max-tokens", "N", NULL, "tokens to generate (fewer when an eos id is emitted); required, except that with "
                "--batch it is the default of the lines without \"max_tokens\""),
        CLI_OPT("temperature", "T", "0", "sampling temperature; 0 is greedy (with --batch: the default of a request)"),
        CLI_OPT("top-k", "K", "0", "sample among the K most likely ids (0: all)"),
        CLI_OPT("top-p", "P", "1", "sample among the most likely ids that hold P of the probability (1: all)"),
        CLI_OPT("seed", "N", "0", "seed of the sampled tokens (a request's tokens depend only on it and its prompt)"),
        CLI_OPT("presence-penalty", "P", "0", "subtracted from the logit of each id generated so far, in [-2, 2]"),
        CLI_OPT("frequency-penalty", "F", "0", "subtracted from each id's logit times its count in the generated ids, in [-2, 2]"),
        CLI_OPT("repetition-penalty", "R", "1", "logits of ids in the prompt or generated divided by R when positive, "
                "multiplied when negative (1: none)"),
        CLI_OPT("min-tokens", "N", "0", "eos ids are forbidden until N ids are generated"),
        CLI_SWITCH("ignore-eos", "an eos id does not end generation"),
        CLI_OPT("max-requests", "N", "16", "with --batch: requests live at once (the others wait for a free slot)"),
        CLI_OPT("out", "FILE", NULL, "with --batch: write the results to FILE (replaced whole) instead of stdout"),
        CLI_OPT("request-rows", "R", "8", "rows per request in a verify step: the last token + R-1 n-gram drafts"),
        CLI_SWITCH("no-spec", "plain decoding, one token a step (R = 1)"),
        CLI_OPT("backend", "cpu|cuda", "cpu", "where the steps run"),
        CLI_OPT("mono", "auto|on|off", "off", "cuda: layers 1..L-2 of verify steps as monokernel launches (auto: where eligible)"),
        CLI_OPT("threads", "T", "online cores", "CPU worker threads; more than the online cores prints a warning"),
        CLI_SWITCH("online-mxfp4", "round BF16 experts of layers 1..L-2 to MXFP4 at load"),
        CLI_ACTS_OPT,
        CLI_OPT("max-len", "L", "prompt + max-tokens", "max model length the KV cache is sized for (--batch: the longest request)"),
        CLI_PREFIX_OPT,
        CLI_WORLD_OPTS,
        CLI_RENAMED("rows", "--rows is now --request-rows R (rows per request: the last token + R-1 drafts)"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1], *src = "", *acts = NULL;
    int npos, *prompt = NULL, n = 0;
    cli_world_sel ws = {0};
    sm_tokenizer *tk = NULL; /* --prompt TEXT: the model's tokenizer */
    sm_err e = {{0}};
    int r = cli_parse(&cli_help_generate, argc, argv, opts, no, pos, 0, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *model = cli_find(opts, no, "model"), *mt = cli_find(opts, no, "max-tokens"),
            *rows_o = cli_find(opts, no, "request-rows"), *backend = cli_find(opts, no, "backend"),
            *batch = cli_find(opts, no, "batch");
    if (!model->present) { sm_errf(&e, "%s: --model DIR is required", cmd); goto bad; }
    if (!mt->present && !batch->present) { sm_errf(&e, "%s: --max-tokens N is required", cmd); goto bad; }
    long max_tokens = 0, rows, threads, max_len, max_req;
    sparkmono_sampling samp;
    if ((mt->present && cli_int(cmd, mt, 1, 1 << 24, &max_tokens, &e)) || cli_int(cmd, rows_o, 1, 256, &rows, &e) ||
        cli_threads(cmd, cli_find(opts, no, "threads"), &threads, &e) ||
        cli_int(cmd, cli_find(opts, no, "max-len"), 1, 1 << 24, &max_len, &e) ||
        cli_int(cmd, cli_find(opts, no, "max-requests"), 1, 65536, &max_req, &e) ||
        cli_world(cmd, opts, no, &ws, &e) || cli_acts(cmd, opts, no, &acts, &e) ||
        cli_choice(cmd, backend, "cpu|cuda", &e) || cli_choice(cmd, cli_find(opts, no, "mono"), "auto|on|off", &e) ||
        sampling_opts(cmd, opts, no, &samp, &e))
        goto bad;
    if (!strcmp(cli_str(cli_find(opts, no, "mono")), "on") && strcmp(cli_str(backend), "cuda")) {
        sm_errf(&e, "%s: --mono on needs --backend cuda", cmd);
        goto bad;
    }
    if (cli_find(opts, no, "no-spec")->present) {
        if (rows_o->present) { sm_errf(&e, "%s: give --request-rows or --no-spec, not both", cmd); goto bad; }
        rows = 1;
    }
    sparkmono_engine_opts eo = {0};
    eo.backend = cli_str(backend);
    eo.request_rows = (int)rows;
    eo.threads = (int)threads;
    eo.world = ws.world;
    eo.moe_tp = ws.moe_tp;
    eo.devices = ws.devices;
    eo.comm = ws.comm;
    eo.mono = cli_str(cli_find(opts, no, "mono"));
    eo.no_prefix_cache = cli_find(opts, no, "no-prefix-cache")->present;
    if (batch->present) {
        cli_opt *pi = cli_find(opts, no, "prompt-ids"), *pf = cli_find(opts, no, "prompt-file"), *outo = cli_find(opts, no, "out");
        if (pi->present || pf->present || cli_find(opts, no, "prompt")->present) {
            sm_errf(&e, "%s: --batch FILE holds the prompts: no --prompt / --prompt-ids / --prompt-file", cmd);
            goto bad;
        }
        if (!*batch->value) { sm_errf(&e, "%s: --batch needs a file name", cmd); goto bad; }
        if (outo->present && !*outo->value) { sm_errf(&e, "%s: --out needs a file name", cmd); goto bad; }
        breq dflt;
        memset(&dflt, 0, sizeof dflt);
        dflt.max_tokens = (int)max_tokens;
        dflt.s = samp;
        batch_cfg bc = {batch->value, outo->present ? outo->value : NULL, (int)max_req, max_len};
        return run_batch(cmd, model->value, cli_find(opts, no, "online-mxfp4")->present, acts, &eo, &bc, &dflt);
    }
    if (cli_find(opts, no, "max-requests")->present || cli_find(opts, no, "out")->present) {
        sm_errf(&e, "%s: --max-requests and --out go with --batch FILE", cmd);
        goto bad;
    }
    /* a text prompt's ids are checked like any prompt's; its tokenizer decodes the output */
    if (cli_prompt(cmd, model->value, cli_find(opts, no, "prompt"), cli_find(opts, no, "prompt-ids"),
                   cli_find(opts, no, "prompt-file"), &prompt, &n, &src, &tk, &e))
        goto bad;
    if (!max_len) max_len = (long)n + max_tokens; /* the default: exactly this request */

    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    int *ntok = NULL, *toks = NULL, *acc = NULL, rc = 2, req;
    int orc = cli_model_open(cmd, model->value, cli_find(opts, no, "online-mxfp4")->present, acts, src, prompt, n, &m, &e);
    if (orc == -1) goto fail;
    if (orc == -2) {
        fprintf(stderr, "%s\n", e.msg);
        goto out;
    }
    eo.max_requests = 1;
    eo.max_len = (int)max_len;
    /* KV pages for this one request only */
    long need = (long)n + max_tokens < max_len ? (long)n + max_tokens : max_len;
    eo.kv_blocks = (int)((need + 15) / 16);
    if (sparkmono_engine_create(m, &eo, &g)) goto fail;
    if (sparkmono_add_sampled(g, prompt, n, (int)max_tokens, &samp, &req)) goto fail;
    ntok = calloc(1, sizeof(int));
    toks = calloc((size_t)rows, sizeof(int));
    acc = calloc((size_t)max_tokens + 1, sizeof(int));
    if (!ntok || !toks || !acc) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        goto out;
    }
    double t0 = cli_now();
    if (sparkmono_prefill(g, req, NULL)) goto fail;
    int nsteps = 0, nreq;
    for (;;) {
        if (sparkmono_verify(g, ntok, toks, &nreq)) goto fail;
        if (nreq == 0) break;
        acc[nsteps++] = ntok[0];
    }
    double dt = cli_now() - t0;
    const int *out;
    int nout;
    if (sparkmono_output(g, req, &out, &nout)) goto fail;
    printf("ids:");
    for (int i = 0; i < nout; i++) printf("%s%d", i ? "," : " ", out[i]);
    if (tk) {
        char *text = NULL;
        sm_err te = {{0}};
        if (decode_text(tk, out, nout, &text, &te)) { fprintf(stderr, "%s: %s\n", cmd, te.msg); goto out; }
        /* as a JSON string: the text may hold newlines and U+FFFD of cut UTF-8 sequences */
        json_t *js = json_string(text);
        char *q = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        printf("\ntext: %s", q ? q : "\"\"");
        free(q);
        json_decref(js);
        free(text);
    }
    printf("\naccept:");
    long sum = 0;
    for (int i = 0; i < nsteps; i++) {
        printf(" %d", acc[i]);
        sum += acc[i];
    }
    double mean = nsteps ? (double)sum / nsteps : 0.0;
    printf("\ntokens/s: %.2f (%d tokens in %.3f s; %d verify steps of %ld rows, %.2f tokens a step = %.2f accepted drafts + 1)\n",
           dt > 0 ? nout / dt : 0.0, nout, dt, nsteps, rows, mean, nsteps ? mean - 1 : 0.0);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "%s: %s\n", cmd, sparkmono_errmsg());
out:
    free(ntok);
    free(toks);
    free(acc);
    free(prompt);
    sm_tokenizer_free(tk);
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
bad:
    free(prompt);
    sm_tokenizer_free(tk);
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
