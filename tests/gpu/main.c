/* main.c: the GPU test program (`make gpu-test` -> build/gpu_test), run on a Hopper GPU.
 *
 * Runs the groups of gpu_tests.h in order.  Each group's stdout goes through a pipe that a
 * reader thread copies to the real stdout as it comes (a crash still shows what was printed)
 * while counting its "PASS " / "FAIL " / "SKIP " lines (tests/gpu/harness.h prints them).  Ends
 * with a short table per group, the line "N skipped" and the line "N passed, N failed"; exit
 * status 0 only when nothing failed.  We rejected counting through
 * a shared global: the groups live in separate files and their contract is just the
 * returned failure count and the printed lines.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "gpu_tests.h"

typedef struct tee {
    int fd;      /* read end of the pipe */
    FILE *out;   /* the real stdout */
    int pass;    /* "PASS " lines seen */
    int fail;    /* "FAIL " lines seen */
    int skip;    /* "SKIP " lines seen */
} tee;

static void *tee_run(void *arg) {
    tee *t = (tee *)arg;
    FILE *in = fdopen(t->fd, "r");
    if (!in) return NULL;
    char line[4096];
    int at_start = 1; /* a fgets chunk that begins a line */
    while (fgets(line, sizeof line, in)) {
        fputs(line, t->out);
        fflush(t->out);
        if (at_start && !strncmp(line, "PASS ", 5)) t->pass++;
        if (at_start && !strncmp(line, "FAIL ", 5)) t->fail++;
        if (at_start && !strncmp(line, "SKIP ", 5)) t->skip++;
        at_start = strchr(line, '\n') != NULL;
    }
    fclose(in);
    return NULL;
}

typedef struct group {
    const char *name;   /* group name in the table */
    int (*fn)(void);    /* returns its failure count */
    int pass, fail, skip, rc; /* result lines, the returned failure count */
    double secs;        /* wall time */
} group;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run g->fn with stdout teed and counted; falls back to a plain call if the pipe fails. */
static void run_group(group *g) {
    printf("== group %s\n", g->name);
    fflush(stdout);
    double t0 = now_s();
    int p[2], saved = dup(1);
    FILE *out = saved >= 0 ? fdopen(saved, "w") : NULL;
    pthread_t th;
    tee t = {-1, out, 0, 0, 0};
    if (!out || pipe(p) != 0) {
        if (out) fclose(out);
        g->rc = g->fn();
        g->fail = g->rc;
        g->secs = now_s() - t0;
        return;
    }
    t.fd = p[0];
    if (pthread_create(&th, NULL, tee_run, &t) != 0) {
        close(p[0]);
        close(p[1]);
        fclose(out);
        g->rc = g->fn();
        g->fail = g->rc;
        g->secs = now_s() - t0;
        return;
    }
    dup2(p[1], 1);
    close(p[1]);
    g->rc = g->fn();
    fflush(stdout);
    dup2(fileno(out), 1); /* closes the pipe's last write end: the reader sees EOF */
    pthread_join(th, NULL);
    fclose(out);
    g->pass = t.pass;
    g->fail = t.fail;
    g->skip = t.skip;
    if (g->rc > g->fail) g->fail = g->rc; /* failures the group counted but did not print */
    g->secs = now_s() - t0;
}

/* `gpu_test` runs every group, `gpu_test GROUP` one of them; `gpu_test --bench OP[,OP..]` runs
 * per-op microbenchmarks only (bench/gpu/; OP norm, router, attention, matmul, moe, logits, logprobs, frontend,
 * kstep or all); `--bench-moe` and `--bench-dense` are the former names of `--bench moe` and
 * `--bench matmul,logits`. */
int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--bench")) return gpu_bench(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "--bench-moe")) return gpu_bench("moe");
    if (argc == 2 && !strcmp(argv[1], "--bench-dense")) return gpu_bench("matmul,logits");
    group gs[] = {
        {"kernels", gpu_test_kernels, 0, 0, 0, 0, 0.0},
        {"moe", gpu_test_moe, 0, 0, 0, 0, 0.0},
        {"model", gpu_test_model, 0, 0, 0, 0, 0.0},
        {"comm", gpu_test_comm, 0, 0, 0, 0, 0.0},
    };
    const int ng = (int)(sizeof gs / sizeof gs[0]);
    int only = -1;
    if (argc == 2)
        for (int i = 0; i < ng; i++)
            if (!strcmp(argv[1], gs[i].name)) only = i;
    if (argc > 2 || (argc == 2 && only < 0)) {
        fprintf(stderr, "usage: gpu_test [kernels|moe|model|comm] | gpu_test --bench norm|router|attention|matmul|moe|logits|logprobs|frontend|kstep|all[,...]"
                        " (got '%s'%s)\n", argv[1], argc > 2 ? " and more" : "");
        return 2;
    }
    int pass = 0, fail = 0, skip = 0;
    for (int i = 0; i < ng; i++) {
        if (only >= 0 && i != only) continue;
        run_group(&gs[i]);
        pass += gs[i].pass;
        fail += gs[i].fail;
        skip += gs[i].skip;
    }
    printf("\n%-10s %7s %7s %7s %9s\n", "group", "passed", "failed", "skipped", "seconds");
    for (int i = 0; i < ng; i++)
        printf("%-10s %7d %7d %7d %9.1f\n", gs[i].name, gs[i].pass, gs[i].fail, gs[i].skip, gs[i].secs);
    printf("%d skipped\n%d passed, %d failed\n", skip, pass, fail);
    return fail ? 1 : 0;
}
