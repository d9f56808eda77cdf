/* cmd_generate.c: `sparkmono generate`: greedy generation of one prompt through the public
 * API, with speculative verify steps (n-gram drafts, R rows) or plain decoding (--no-spec).
 *
 * Prints three lines on stdout: the generated ids (comma-separated, so they can be fed back as
 * --prompt-ids), the acceptance length (tokens emitted) of every verify step, and tokens/s.
 * It drives add / prefill / verify itself rather than sparkmono_generate so it can print the
 * per-step acceptance; we rejected a callback in the public API for this one use.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"
#include "sparkmono.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage_err(const char *msg) {
    fprintf(stderr, "%s\n", msg);
    return 2;
}

int cmd_generate(int argc, char **argv) {
    cli_opt opts[] = {
        {"model", 1, NULL, 0},      {"prompt-ids", 1, NULL, 0}, {"max-tokens", 1, NULL, 0},
        {"rows", 1, NULL, 0},       {"no-spec", 0, NULL, 0},    {"backend", 1, NULL, 0},
        {"threads", 1, NULL, 0},    {"online-mxfp4", 0, NULL, 0}, {"max-len", 1, NULL, 0},
        {"world", 1, NULL, 0},      {"moe", 1, NULL, 0},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos;
    sm_err e = {{0}};
    if (cli_parse("generate", argc, argv, opts, nopts, pos, 0, &npos, &e)) return usage_err(e.msg);
    cli_opt *model = cli_find(opts, nopts, "model"), *ids = cli_find(opts, nopts, "prompt-ids");
    if (!model->present) return usage_err("generate: --model DIR is required");
    if (!ids->present) return usage_err("generate: --prompt-ids 1,2,3 is required");
    if (!cli_find(opts, nopts, "max-tokens")->present) return usage_err("generate: --max-tokens N is required");
    long max_tokens, rows, threads, max_len, world;
    if (cli_int("generate", cli_find(opts, nopts, "max-tokens"), 1, 1 << 24, 0, &max_tokens, &e) ||
        cli_int("generate", cli_find(opts, nopts, "rows"), 1, 256, 8, &rows, &e) ||
        cli_int("generate", cli_find(opts, nopts, "threads"), 0, 4096, 0, &threads, &e) ||
        cli_int("generate", cli_find(opts, nopts, "max-len"), 1, 1 << 24, 4096, &max_len, &e) ||
        cli_int("generate", cli_find(opts, nopts, "world"), 1, 64, 1, &world, &e))
        return usage_err(e.msg);
    const char *moe = cli_find(opts, nopts, "moe")->value;
    if (moe && strcmp(moe, "ep") && strcmp(moe, "tp")) return usage_err("generate: --moe must be ep or tp");
    if (cli_find(opts, nopts, "no-spec")->present) {
        if (cli_find(opts, nopts, "rows")->present) return usage_err("generate: give --rows or --no-spec, not both");
        rows = 1;
    }
    const char *backend = cli_find(opts, nopts, "backend")->value;
    if (backend && strcmp(backend, "cpu") && strcmp(backend, "cuda"))
        return usage_err("generate: --backend must be cpu or cuda");
    int *prompt = NULL, n = 0;
    if (cli_int_list("generate: --prompt-ids", ids->value, INT_MIN, INT_MAX, &prompt, &n, &e)) return usage_err(e.msg);

    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    int *ntok = NULL, *toks = NULL, *acc = NULL, rc = 2, req;
    sparkmono_model_opts mo = {0};
    mo.online_mxfp4 = cli_find(opts, nopts, "online-mxfp4")->present;
    if (sparkmono_model_open(model->value, &mo, &m)) goto fail;
    sparkmono_engine_opts eo = {0};
    eo.backend = backend;
    eo.rows = (int)rows;
    eo.max_requests = 1;
    eo.max_len = (int)max_len;
    /* KV pages for this one request only */
    long need = (long)n + max_tokens < max_len ? (long)n + max_tokens : max_len;
    eo.kv_blocks = (int)((need + 15) / 16);
    eo.threads = (int)threads;
    eo.world = (int)world;
    eo.moe_tp = moe && !strcmp(moe, "tp");
    if (sparkmono_engine_create(m, &eo, &g)) goto fail;
    if (sparkmono_add(g, prompt, n, (int)max_tokens, &req)) goto fail;
    ntok = calloc(1, sizeof(int));
    toks = calloc((size_t)rows, sizeof(int));
    acc = calloc((size_t)max_tokens + 1, sizeof(int));
    if (!ntok || !toks || !acc) {
        fprintf(stderr, "generate: out of memory\n");
        goto out;
    }
    double t0 = now_s();
    if (sparkmono_prefill(g, req, NULL)) goto fail;
    int nsteps = 0, nreq;
    for (;;) {
        if (sparkmono_verify(g, ntok, toks, &nreq)) goto fail;
        if (nreq == 0) break;
        acc[nsteps++] = ntok[0];
    }
    double dt = now_s() - t0;
    const int *out;
    int nout;
    if (sparkmono_output(g, req, &out, &nout)) goto fail;
    printf("ids:");
    for (int i = 0; i < nout; i++) printf("%s%d", i ? "," : " ", out[i]);
    printf("\naccept:");
    long sum = 0;
    for (int i = 0; i < nsteps; i++) {
        printf(" %d", acc[i]);
        sum += acc[i];
    }
    printf("\ntokens/s: %.2f (%d tokens in %.3f s; %d verify steps of %ld rows, mean acceptance %.2f)\n",
           dt > 0 ? nout / dt : 0.0, nout, dt, nsteps, rows, nsteps ? (double)sum / nsteps : 0.0);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "generate: %s\n", sparkmono_errmsg());
out:
    free(ntok);
    free(toks);
    free(acc);
    free(prompt);
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
}
