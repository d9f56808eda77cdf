/* cli.c: the strict option parser of cli.h, the --help printer driven by the same option
 * tables, and the option families several commands share (threads, world, prompt).  A prompt
 * file is read whole and split on whitespace and single commas, counting lines only to name
 * the place of a bad word.  We rejected a hand-written usage text per command: it drifts from
 * what the parser accepts (the README's list is checked against --help by tests/cli_help.sh). */
#include "cli.h"
#include "sparkmono.h"
#include "model/quant.h"
#include "model/tokenizer.h"
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static cli_opt *find_n(cli_opt *opts, int nopts, const char *name, size_t len) {
    for (int i = 0; i < nopts; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) return &opts[i];
    return NULL;
}

cli_opt *cli_find(cli_opt *opts, int nopts, const char *name) {
    return find_n(opts, nopts, name, strlen(name));
}

const char *cli_str(const cli_opt *o) {
    if (!o) return NULL;
    return o->present ? o->value : o->dflt;
}

/* The help of one command: summary, usage, the option table, notes, one example. */
static void print_help(const cli_cmd *c, const cli_opt *opts, int nopts) {
    printf("sparkmono %s: %s\n\nusage: sparkmono %s %s\n\noptions:\n", c->name, c->summary, c->name, c->synopsis);
    char left[96];
    for (int i = 0; i < nopts; i++) {
        const cli_opt *o = &opts[i];
        if (!o->help) continue; /* retired name */
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        printf("  %-26s %s", left, o->help);
        if (o->dflt) printf(" (default: %s)", o->dflt);
        printf("\n");
    }
    printf("  %-26s %s\n", "-h, --help", "print this help and exit");
    printf("Every option with a value may also be written --name=VALUE.\n");
    if (c->notes) printf("\n%s\n", c->notes);
    printf("\nexample:\n  %s\n", c->example);
}

int cli_parse(const cli_cmd *c, int argc, char **argv, cli_opt *opts, int nopts, const char **pos, int maxpos,
              int *npos, sm_err *e) {
    const char *cmd = c->name;
    *npos = 0;
    for (int i = 0; i < nopts; i++) { opts[i].value = NULL; opts[i].present = 0; }
    /* -h / --help anywhere a flag may stand wins over every other word */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_help(c, opts, nopts);
            fflush(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) == 0 && !strchr(a, '=')) {
            const cli_opt *o = cli_find(opts, nopts, a + 2);
            if (o && o->arg) i++; /* its value, whatever it looks like */
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) == 0 && a[2]) {
            const char *nm = a + 2, *eq = strchr(nm, '=');
            size_t len = eq ? (size_t)(eq - nm) : strlen(nm);
            cli_opt *o = find_n(opts, nopts, nm, len);
            if (!o) return sm_errf(e, "%s: unknown option '--%.*s' (see 'sparkmono %s --help')", cmd, (int)len, nm, cmd);
            if (o->renamed) return sm_errf(e, "%s: %s", cmd, o->renamed);
            if (o->present) return sm_errf(e, "%s: option '--%s' given twice", cmd, o->name);
            o->present = 1;
            if (o->arg) {
                if (eq) o->value = eq + 1;
                else if (i + 1 < argc) o->value = argv[++i];
                else return sm_errf(e, "%s: option '--%s' needs a value (%s)", cmd, o->name, o->arg);
            } else if (eq) {
                return sm_errf(e, "%s: option '--%s' is a switch and takes no value", cmd, o->name);
            }
        } else if (a[0] == '-' && a[1] && a[1] != '-') {
            return sm_errf(e, "%s: unknown option '%s' (options are --name; see 'sparkmono %s --help')", cmd, a, cmd);
        } else {
            if (*npos >= maxpos) return sm_errf(e, "%s: unexpected argument '%s'", cmd, a);
            pos[(*npos)++] = a;
        }
    }
    return 0;
}

static int parse_long(const char *s, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

int cli_int(const char *cmd, const cli_opt *o, long lo, long hi, long *out, sm_err *e) {
    *out = 0;
    if (!o) return 0;
    if (!o->present) {
        if (!o->dflt || !isdigit((unsigned char)o->dflt[0])) return 0; /* automatic value */
        if (parse_long(o->dflt, out)) return sm_errf(e, "%s: --%s: bad built-in default '%s'", cmd, o->name, o->dflt);
        return 0;
    }
    long v;
    if (parse_long(o->value, &v) || v < lo || v > hi)
        return sm_errf(e, "%s: --%s '%s' is not an integer in [%ld, %ld]", cmd, o->name, o->value, lo, hi);
    *out = v;
    return 0;
}

int cli_choice(const char *cmd, const cli_opt *o, const char *choices, sm_err *e) {
    const char *v = cli_str(o);
    if (!v) return 0;
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *q = strchr(p, '|');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && !strncmp(p, v, n)) return 0;
        if (!q) break;
        p = q + 1;
    }
    return sm_errf(e, "%s: --%s '%s' is not one of %s", cmd, o->name, v, choices);
}

int cli_threads(const char *cmd, const cli_opt *o, long *out, sm_err *e) {
    static int warned; /* once per process */
    if (cli_int(cmd, o, 0, 4096, out, e)) return -1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (!warned && ncpu > 0 && *out > ncpu) {
        warned = 1;
        fprintf(stderr, "%s: warning: --threads %ld is more than the %ld online cores (continuing)\n", cmd, *out, ncpu);
    }
    return 0;
}

int cli_world(const char *cmd, cli_opt *opts, int no, cli_world_sel *out, sm_err *e) {
    const cli_opt *world = cli_find(opts, no, "world"), *moe = cli_find(opts, no, "moe"),
                  *dev = cli_find(opts, no, "devices"), *comm = cli_find(opts, no, "comm");
    long w;
    if (cli_int(cmd, world, 1, SM_MAX_WORLD, &w, e)) return -1;
    const cli_opt *need[3] = {moe, dev, comm};
    for (int i = 0; i < 3; i++)
        if (need[i]->present && !world->present)
            return sm_errf(e, "%s: --%s %s needs --world W", cmd, need[i]->name, need[i]->value);
    if (cli_choice(cmd, moe, "ep|tp", e) || cli_choice(cmd, comm, "peer|nccl", e)) return -1;
    out->world = w ? (int)w : 1;
    out->moe_tp = !strcmp(cli_str(moe), "tp");
    out->comm = comm->present ? comm->value : NULL; /* the engine's default when not given */
    out->devices = NULL;
    if (dev->present) {
        if (sm_devices_parse(dev->value, out->world, out->dev, e)) return sm_errprefix(e, "%s: --world %d --devices", cmd, out->world);
        out->devices = dev->value;
    }
    return 0;
}

int cli_int_list(const char *what, const char *s, long lo, long hi, int **out, int *n, sm_err *e) {
    int cap = 16, cnt = 0;
    int *v = malloc(sizeof(int) * cap);
    if (!v) return sm_errf(e, "%s: out of memory", what);
    const char *p = s;
    while (1) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        char buf[32];
        long x;
        if (len == 0) {
            free(v);
            return sm_errf(e, "%s: entry %d is empty in '%.40s%s'", what, cnt, s, strlen(s) > 40 ? "..." : "");
        }
        if (len >= sizeof buf) {
            free(v);
            return sm_errf(e, "%s: '%.24s...' is not an integer in [%ld, %ld]", what, p, lo, hi);
        }
        memcpy(buf, p, len);
        buf[len] = 0;
        if (parse_long(buf, &x) || x < lo || x > hi) {
            free(v);
            return sm_errf(e, "%s: '%s' is not an integer in [%ld, %ld]", what, buf, lo, hi);
        }
        if (cnt == cap) {
            int *nv = realloc(v, sizeof(int) * (cap *= 2));
            if (!nv) { free(v); return sm_errf(e, "%s: out of memory", what); }
            v = nv;
        }
        v[cnt++] = (int)x;
        if (!q) break;
        p = q + 1;
    }
    *out = v;
    *n = cnt;
    return 0;
}

/* ---- prompts ---- */

#define PROMPT_MAX_BYTES ((size_t)1 << 30)

int cli_read_all(const char *what, const char *path, char **buf, size_t *len, sm_err *e) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return sm_errf(e, "%s: cannot open: %s", what, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) { if (f != stdin) fclose(f); return sm_errf(e, "%s: out of memory", what); }
    for (;;) {
        if (n == cap) {
            char *nb = cap < PROMPT_MAX_BYTES ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                free(b);
                if (f != stdin) fclose(f);
                return sm_errf(e, "%s: larger than %zu bytes (or out of memory)", what, cap);
            }
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    int er = errno;
    if (f != stdin) fclose(f);
    if (bad) { free(b); return sm_errf(e, "%s: read error: %s", what, strerror(er)); }
    *buf = b;
    *len = n;
    return 0;
}

/* Ids of text [len]: words separated by whitespace and/or single commas. */
static int parse_ids(const char *what, const char *s, size_t len, int **out, int *n, sm_err *e) {
    int cap = 1024, cnt = 0, comma = 0; /* comma: a comma since the last id */
    long line = 1;
    int *v = malloc(sizeof(int) * (size_t)cap);
    if (!v) return sm_errf(e, "%s: out of memory", what);
    const char *p = s, *end = s + len;
    while (p < end) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '\n') { line++; p++; continue; }
        if (isspace(ch)) { p++; continue; }
        if (ch == ',') {
            if (comma || cnt == 0) {
                free(v);
                return sm_errf(e, "%s: token index %d (line %ld): empty entry (a comma with no id before it)", what, cnt, line);
            }
            comma = 1;
            p++;
            continue;
        }
        const char *q = p;
        while (q < end && *q != ',' && !isspace((unsigned char)*q)) q++;
        char buf[32];
        long x;
        size_t wl = (size_t)(q - p);
        if (wl >= sizeof buf || (memcpy(buf, p, wl), buf[wl] = 0, strlen(buf) != wl) || parse_long(buf, &x) ||
            x < INT_MIN || x > INT_MAX) {
            free(v);
            return sm_errf(e, "%s: token index %d (line %ld): '%.*s' is not an integer id", what, cnt, line,
                           wl > 24 ? 24 : (int)wl, p);
        }
        if (cnt == INT_MAX) { free(v); return sm_errf(e, "%s: too many ids", what); }
        if (cnt == cap) {
            int nc = cap > INT_MAX / 2 ? INT_MAX : cap * 2;
            int *nv = realloc(v, sizeof(int) * (size_t)nc);
            if (!nv) { free(v); return sm_errf(e, "%s: out of memory for %d ids", what, nc); }
            v = nv;
            cap = nc;
        }
        v[cnt++] = (int)x;
        comma = 0;
        p = q;
    }
    if (comma) { free(v); return sm_errf(e, "%s: ends with a comma after token index %d", what, cnt - 1); }
    if (cnt == 0) { free(v); return sm_errf(e, "%s: no token ids", what); }
    *out = v;
    *n = cnt;
    return 0;
}

/* --prompt TEXT: the ids of the text through dir's tokenizer (kept in *tk when tk is given). */
static int prompt_text(const char *cmd, const char *dir, const char *text, int **out, int *n, sm_tokenizer **tk,
                       sm_err *e) {
    char path[4096];
    sm_tokenizer *t = NULL;
    if (sm_tokenizer_load_dir(dir, &t, path, sizeof path, e)) return sm_errprefix(e, "%s: --prompt", cmd);
    if (!t) return sm_errf(e, "%s: --prompt TEXT needs the model's tokenizer, %s, which does not exist", cmd, path);
    int rc = sm_tokenizer_encode(t, text, strlen(text), out, n, e) ? sm_errprefix(e, "%s: --prompt", cmd) : 0;
    if (!rc && *n < 1) rc = sm_errf(e, "%s: --prompt: the text encodes to no tokens", cmd);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    if (tk && !rc) *tk = t;
    else sm_tokenizer_free(t);
    return rc;
}

int cli_prompt(const char *cmd, const char *dir, const cli_opt *text, const cli_opt *ids, const cli_opt *file,
               int **out, int *n, const char **src, sm_tokenizer **tk, sm_err *e) {
    static char srcbuf[600]; /* *src: names the prompt file in later messages */
    char what[700];
    *out = NULL;
    *n = 0;
    if (tk) *tk = NULL;
    if (text->present + ids->present + file->present != 1)
        return sm_errf(e, "%s: give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE", cmd);
    if (text->present) {
        *src = "--prompt";
        return prompt_text(cmd, dir, text->value, out, n, tk, e);
    }
    if (ids->present) {
        *src = "--prompt-ids";
        snprintf(what, sizeof what, "%s: --prompt-ids", cmd);
        return cli_int_list(what, ids->value, INT_MIN, INT_MAX, out, n, e);
    }
    if (!*file->value) return sm_errf(e, "%s: --prompt-file needs a file name (or - for stdin)", cmd);
    snprintf(srcbuf, sizeof srcbuf, "--prompt-file %s", strcmp(file->value, "-") ? file->value : "- (stdin)");
    *src = srcbuf;
    snprintf(what, sizeof what, "%s: %s", cmd, srcbuf);
    char *body = NULL;
    size_t len = 0;
    if (cli_read_all(what, file->value, &body, &len, e)) return -1;
    int rc = parse_ids(what, body, len, out, n, e);
    free(body);
    return rc;
}

int cli_prompt_check(const char *cmd, const char *src, const int *ids, int n, int vocab, sm_err *e) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return sm_errf(e, "%s: %s: token index %d is %d, outside the vocabulary [0, %d)", cmd, src, i, ids[i], vocab);
    return 0;
}

int cli_acts(const char *cmd, cli_opt *opts, int no, const char **out, sm_err *e) {
    const cli_opt *o = cli_find(opts, no, "activations");
    if (cli_choice(cmd, o, SM_ACTS_WORDS, e)) return -1;
    *out = cli_str(o);
    return 0;
}

int cli_model_open(const char *cmd, const char *dir, int online_mxfp4, const char *acts, const char *src, const int *ids,
                   int n, sparkmono_model **m, sm_err *e) {
    sparkmono_model_opts mo = {0};
    mo.online_mxfp4 = online_mxfp4;
    mo.activations = acts;
    if (sparkmono_model_open(dir, &mo, m)) return -1;
    sparkmono_model_info info;
    if (sparkmono_model_get_info(*m, &info)) return -1;
    return cli_prompt_check(cmd, src, ids, n, info.vocab_size, e) ? -2 : 0;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_number(const char *cmd, const cli_opt *o, double lo, double hi, double *out, sm_err *e) {
    const char *s = cli_str(o);
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || !*s || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi)
        return sm_errf(e, "%s: --%s %s is not a number in [%g, %g]", cmd, o->name, s ? s : "", lo, hi);
    *out = v;
    return 0;
}
