/* test_bench_cli.c: `sparkmono bench` without a GPU: its option parsing (--phases and its
 * refusals) and the line --phases prints for each phase of a layer (bench_phase_line).
 *
 * The command's own file is compiled into this program (with the shared parser, tools/cli.c),
 * so the test calls the very static functions the command runs; the GPU half of --phases (the
 * traced steps) is tested by build/gpu_test (tests/gpu/model_phases.c).  We rejected a copy of
 * the formatter in a library: the CLI would print from one and the test check the other.
 */
#include "check.h"
#include "cli.c"
#include "cmd_bench.c"
#include <stdio.h>
#include <string.h>

/* parse_args on the words of s (space separated, at most 16): its result, the message in e. */
static int parse(const char *s, bench_args *a, sm_err *e) {
    char buf[512], *argv[16];
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok(buf, " "); t && argc < 16; t = strtok(NULL, " ")) argv[argc++] = t;
    memset(e, 0, sizeof *e);
    int rc = parse_args(argc, argv, a, e);
    free(a->step_rows);
    a->step_rows = NULL;
    return rc;
}

static void test_phases_flag(void) {
    bench_args a;
    sm_err e;
    CHECK(parse("--preset spark1x-l4", &a, &e) == 0 && !a.phases, "no --phases: rc / phases %d (%s)", a.phases, e.msg);
    CHECK(parse("--preset spark1x-l4 --phases", &a, &e) == 0 && a.phases == 1 && a.fmt == SM_EXP_MXFP4, "--phases: %s", e.msg);
    CHECK(parse("--model /nonexistent --phases --mono off", &a, &e) == 0 && a.phases && a.mono == 2,
          "--phases with --model and --mono off: %s", e.msg);
    CHECK(parse("--preset spark1x-l4 --phases --mono on --trace t.json", &a, &e) == 0 && a.phases && a.mono == 1 && a.trace,
          "--phases beside --trace: %s", e.msg);
}

static void test_phases_refusals(void) {
    bench_args a;
    sm_err e;
    /* one rank's layers only */
    CHECK(parse("--preset spark1x-l4 --phases --world 2", &a, &e) == -1 && strstr(e.msg, "--phases") && strstr(e.msg, "--world 2"),
          "--phases --world 2: '%s'", e.msg);
    /* the MXFP4 layers: a preset of other experts has none */
    CHECK(parse("--preset spark1x-l4 --phases --experts bf16", &a, &e) == -1 && strstr(e.msg, "--phases") && strstr(e.msg, "mxfp4"),
          "--phases --experts bf16: '%s'", e.msg);
    CHECK(parse("--preset spark1x-l4 --phases --experts fp8", &a, &e) == -1 && strstr(e.msg, "fp8"), "--experts fp8: '%s'", e.msg);
    /* a switch takes no value */
    CHECK(parse("--preset spark1x-l4 --phases=1", &a, &e) == -1 && strstr(e.msg, "phases"), "--phases=1: '%s'", e.msg);
    CHECK(parse("--preset spark1x-l4 --phases --phases", &a, &e) == -1, "--phases twice accepted");
}

static void test_phase_line(void) {
    char b[256];
    /* the example */
    bench_phase_line(b, sizeof b, "stock", 8, "qkvg", 74.1, 67.0);
    CHECK(!strcmp(b, "layer-phase stock 8 qkvg 74.1 us floor 67.0 us 90.4%"), "'%s'", b);
    /* a phase without weights */
    bench_phase_line(b, sizeof b, "mono-w4a4", 128, "rope_kv", 3.24, 0);
    CHECK(!strcmp(b, "layer-phase mono-w4a4 128 rope_kv 3.2 us floor - us -"), "'%s'", b);
    /* rounding, above the floor's time (a floor is never met exactly) and the totals */
    bench_phase_line(b, sizeof b, "stock-w4a16", 16, "total", 1234.56, 1300.04);
    CHECK(!strcmp(b, "layer-phase stock-w4a16 16 total 1234.6 us floor 1300.0 us 105.3%"), "'%s'", b);
    bench_phase_line(b, sizeof b, "stock", 8, "latency", 58.96, -1);
    CHECK(!strcmp(b, "layer-phase stock 8 latency 59.0 us floor - us -"), "'%s'", b);
    /* ten whitespace-separated fields with a floor and without: a script splits them alike */
    int f = 0, g = 0;
    bench_phase_line(b, sizeof b, "stock", 8, "experts", 400, 300);
    for (char *t = strtok(b, " "); t; t = strtok(NULL, " ")) f++;
    bench_phase_line(b, sizeof b, "stock", 8, "gaps", 4, 0);
    for (char *t = strtok(b, " "); t; t = strtok(NULL, " ")) g++;
    CHECK(f == 10 && g == 10, "%d and %d fields", f, g);
    /* a short buffer is cut, never overrun; the count is the whole line's */
    char s[16];
    memset(s, 'x', sizeof s);
    int n = bench_phase_line(s, 12, "stock", 8, "qkvg", 74.1, 67.0);
    CHECK(n == (int)strlen("layer-phase stock 8 qkvg 74.1 us floor 67.0 us 90.4%") && strlen(s) == 11 && s[12] == 'x',
          "cut: %d '%.11s'", n, s);
}

int main(void) {
    RUN(test_phases_flag);
    RUN(test_phases_refusals);
    RUN(test_phase_line);
    return TEST_DONE();
}
