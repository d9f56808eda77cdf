/* cmd_tokenize.c: `sparkmono tokenize`: text to token ids and ids to text with a Hugging Face
 * tokenizer.json (src/model/tokenizer.h), from a model directory or a file.  One input per call
 * (--text, --text-file, --ids), or many in JSON lines (--batch: a JSON string is encoded, a
 * JSON array of ids decoded, one output line per input line, in order), which is how the
 * tests compare thousands of strings with the Python tokenizers package without a process
 * per string.  We rejected a separate line-per-text plain format for batches: texts hold
 * newlines, and JSON says exactly which bytes a string has.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include "cli.h"
#include "model/tokenizer.h"

const cli_cmd cli_help_tokenize = {
    "tokenize",
    "encode text to token ids or decode ids to text with a tokenizer.json",
    "(DIR | --tokenizer FILE) (--text STR | --text-file FILE | --ids LIST | --batch FILE) [options]",
    "sparkmono tokenize build/models/tiny --text 'Hello, world'",
    "DIR is a model directory holding tokenizer.json.  Encoding prints the ids comma-separated on\n"
    "one line (what --ids and generate --prompt-ids read); special tokens written in the text\n"
    "(\"<|eos|>\") are recognized.  Decoding prints the text and a newline.  Ids are those of the\n"
    "text alone: no bos is added.  --batch reads JSON lines: a string line prints a JSON array of\n"
    "its ids, an array line prints its text as a JSON string.",
};

/* Print ids [n] as "1,2,3" (JSON: "[1,2,3]") and a newline. */
static void put_ids(const int *ids, int n, int json) {
    if (json) putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    fputs(json ? "]\n" : "\n", stdout);
}

/* Decode ids [n] (special tokens dropped when skip) into *text [*len]. */
static int decode(const sm_tokenizer *t, int *ids, int n, int skip, char **text, size_t *len, sm_err *e) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!skip || !sm_tokenizer_is_special(t, ids[i])) ids[k++] = ids[i];
    return sm_tokenizer_decode(t, ids, k, text, len, e);
}

/* One line of --batch: encode a JSON string or decode a JSON array of ids. */
static int batch_line(const sm_tokenizer *t, const char *what, long ln, const char *s, size_t n, int skip, sm_err *e) {
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) return sm_errf(e, "%s: line %ld: not valid JSON: %s", what, ln, je.text);
    int rc = -1, *ids = NULL, nid = 0;
    char *text = NULL;
    size_t len = 0;
    if (json_is_string(v)) {
        if (sm_tokenizer_encode(t, json_string_value(v), json_string_length(v), &ids, &nid, e)) goto out;
        put_ids(ids, nid, 1);
    } else if (json_is_array(v)) {
        size_t m = json_array_size(v);
        if (m > (size_t)INT_MAX || !(ids = malloc(sizeof(int) * (m ? m : 1)))) { sm_errf(e, "out of memory"); goto out; }
        for (size_t i = 0; i < m; i++) {
            json_t *x = json_array_get(v, i);
            if (!json_is_integer(x) || json_integer_value(x) < INT_MIN || json_integer_value(x) > INT_MAX) {
                sm_errf(e, "entry %zu is not an integer id", i);
                goto out;
            }
            ids[i] = (int)json_integer_value(x);
        }
        if (decode(t, ids, (int)m, skip, &text, &len, e)) goto out;
        json_t *o = json_stringn(text, len);
        char *d = o ? json_dumps(o, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(o);
        if (!d) { sm_errf(e, "out of memory"); goto out; }
        puts(d);
        free(d);
    } else {
        sm_errf(e, "a line must be a JSON string (to encode) or an array of ids (to decode)");
        goto out;
    }
    rc = 0;
out:
    if (rc) sm_errprefix(e, "%s: line %ld", what, ln);
    json_decref(v);
    free(ids);
    free(text);
    return rc;
}

static int run_batch(const sm_tokenizer *t, const char *path, int skip, sm_err *e) {
    char what[600], *buf = NULL;
    size_t len = 0;
    snprintf(what, sizeof what, "tokenize: --batch %s", strcmp(path, "-") ? path : "- (stdin)");
    if (cli_read_all(what, path, &buf, &len, e)) return -1;
    long ln = 1;
    int rc = 0;
    for (size_t i = 0; i < len && !rc; ln++) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        rc = batch_line(t, what, ln, buf + i, end - i, skip, e);
        i = end + 1;
    }
    free(buf);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize";
    cli_opt opts[] = {
        CLI_OPT("tokenizer", "FILE", NULL, "tokenizer.json to use (instead of a model directory DIR)"),
        CLI_OPT("text", "STR", NULL, "encode STR: prints its ids, comma-separated"),
        CLI_OPT("text-file", "FILE", NULL, "encode the bytes of FILE as they are (- reads stdin)"),
        CLI_OPT("ids", "LIST", NULL, "decode the ids LIST (1,2,3): prints the text and a newline"),
        CLI_OPT("batch", "FILE", NULL, "JSON lines (- reads stdin): a string is encoded, an array of ids decoded"),
        CLI_SWITCH("skip-special", "decoding drops special tokens"),
        CLI_SWITCH("stats", "one line on stderr: bytes, ids, encode time and MB/s (wall clock and CPU)"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos, *ids = NULL, n = 0, rc = 2;
    char *text = NULL, path[4200];
    size_t len = 0;
    sm_tokenizer *t = NULL;
    sm_err e = {{0}};
    int r = cli_parse(&cli_help_tokenize, argc, argv, opts, no, pos, 1, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *tok = cli_find(opts, no, "tokenizer"), *txt = cli_find(opts, no, "text"), *tf = cli_find(opts, no, "text-file"),
            *idl = cli_find(opts, no, "ids"), *bat = cli_find(opts, no, "batch");
    int skip = cli_find(opts, no, "skip-special")->present, stats = cli_find(opts, no, "stats")->present;
    if ((npos == 1) == tok->present) {
        sm_errf(&e, "%s: give the tokenizer as a model directory DIR or as --tokenizer FILE (exactly one)", cmd);
        goto bad;
    }
    if (txt->present + tf->present + idl->present + bat->present != 1) {
        sm_errf(&e, "%s: give exactly one of --text, --text-file, --ids and --batch", cmd);
        goto bad;
    }
    if (skip && (txt->present || tf->present)) { sm_errf(&e, "%s: --skip-special applies to decoding (--ids, --batch)", cmd); goto bad; }
    if (stats && !txt->present && !tf->present) { sm_errf(&e, "%s: --stats applies to encoding (--text, --text-file)", cmd); goto bad; }
    if (npos == 1) snprintf(path, sizeof path, "%s/tokenizer.json", pos[0]);
    else snprintf(path, sizeof path, "%s", tok->value);
    if (sm_tokenizer_load(path, &t, &e)) { sm_errprefix(&e, "%s", cmd); goto bad; }

    if (bat->present) {
        if (run_batch(t, bat->value, skip, &e)) goto bad;
    } else if (idl->present) {
        char what[64];
        snprintf(what, sizeof what, "%s: --ids", cmd);
        if (cli_int_list(what, idl->value, INT_MIN, INT_MAX, &ids, &n, &e)) goto bad;
        if (decode(t, ids, n, skip, &text, &len, &e)) { sm_errprefix(&e, "%s: --ids", cmd); goto bad; }
        fwrite(text, 1, len, stdout);
        putchar('\n');
    } else {
        char what[600]; /* the input, as its errors name it */
        if (txt->present) {
            snprintf(what, sizeof what, "%s: --text", cmd);
            len = strlen(txt->value);
            text = malloc(len + 1);
            if (text) memcpy(text, txt->value, len + 1);
        } else {
            snprintf(what, sizeof what, "%s: --text-file %s", cmd, tf->value);
            if (cli_read_all(what, tf->value, &text, &len, &e)) goto bad;
        }
        if (!text) { sm_errf(&e, "%s: out of memory", cmd); goto bad; }
        struct timespec w0, w1, c0, c1; /* wall clock, and this thread's CPU time */
        clock_gettime(CLOCK_MONOTONIC, &w0);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        if (sm_tokenizer_encode(t, text, len, &ids, &n, &e)) { sm_errprefix(&e, "%s", what); goto bad; }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        clock_gettime(CLOCK_MONOTONIC, &w1);
        put_ids(ids, n, 0);
        if (stats) {
            double w = (double)(w1.tv_sec - w0.tv_sec) + 1e-9 * (double)(w1.tv_nsec - w0.tv_nsec);
            double c = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
            fprintf(stderr, "%s: encoded %zu bytes into %d ids in %.3f s: %.1f MB/s (%.3f s of CPU: %.1f MB/s)\n", cmd, len,
                    n, w, w > 0 ? (double)len / w / 1e6 : 0.0, c, c > 0 ? (double)len / c / 1e6 : 0.0);
        }
    }
    if (fflush(stdout) || ferror(stdout)) { sm_errf(&e, "%s: write error on stdout", cmd); goto bad; }
    rc = 0;
    goto out;
bad:
    fprintf(stderr, "%s\n", e.msg);
out:
    sm_tokenizer_free(t);
    free(ids);
    free(text);
    return rc;
}
