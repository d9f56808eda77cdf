/* cli.c: the strict option parser of cli.h. */
#include "cli.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

cli_opt *cli_find(cli_opt *opts, int nopts, const char *name) {
    for (int i = 0; i < nopts; i++)
        if (strcmp(opts[i].name, name) == 0) return &opts[i];
    return NULL;
}

int cli_parse(const char *cmd, int argc, char **argv, cli_opt *opts, int nopts,
              const char **pos, int maxpos, int *npos, sm_err *e) {
    *npos = 0;
    for (int i = 0; i < nopts; i++) { opts[i].value = NULL; opts[i].present = 0; }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) == 0 && a[2]) {
            cli_opt *o = cli_find(opts, nopts, a + 2);
            if (!o) return sm_errf(e, "%s: unknown option '%s'", cmd, a);
            if (o->present) return sm_errf(e, "%s: option '%s' given twice", cmd, a);
            o->present = 1;
            if (o->takes_value) {
                if (i + 1 >= argc) return sm_errf(e, "%s: option '%s' needs a value", cmd, a);
                o->value = argv[++i];
            }
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

int cli_int(const char *cmd, const cli_opt *o, long lo, long hi, long dflt, long *out, sm_err *e) {
    if (!o || !o->present) { *out = dflt; return 0; }
    long v;
    if (parse_long(o->value, &v) || v < lo || v > hi)
        return sm_errf(e, "%s: --%s '%s' is not an integer in [%ld, %ld]", cmd, o->name, o->value, lo, hi);
    *out = v;
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
        if (len == 0 || len >= sizeof buf) { free(v); return sm_errf(e, "%s: bad list '%s'", what, s); }
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
