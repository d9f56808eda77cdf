/* cmd_generate.c: `sparkmono generate`: greedy generation of one prompt through the public
 * API, with speculative verify steps (n-gram drafts, R rows a request) or plain decoding
 * (--no-spec).
 *
 * Prints three lines on stdout: the generated ids (comma-separated, so they can be fed back as
 * --prompt-ids), the tokens emitted by every verify step (accepted drafts + 1), and tokens/s
 * with the mean accepted drafts a step.  It drives add / prefill / verify itself rather than
 * sparkmono_generate so it can print the per-step acceptance; we rejected a callback in the
 * public API for this one use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"
#include "sparkmono.h"

const cli_cmd cli_help_generate = {
    "generate",
    "greedy generation with speculative verify steps (n-gram drafts)",
    "--model DIR (--prompt-ids LIST | --prompt-file FILE) --max-tokens N [options]",
    "sparkmono generate --model build/models/tiny --prompt-ids 11,12,13,11,12 --max-tokens 32",
    "Prints three lines: 'ids: ...' (the generated ids, comma-separated), 'accept: ...' (tokens\n"
    "emitted by each verify step: accepted drafts + 1) and 'tokens/s: ...' (with the mean\n"
    "accepted drafts a step).  Speculative and plain (--no-spec) runs emit the same ids.",
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    cli_opt opts[] = {
        CLI_OPT("model", "DIR", NULL, "checkpoint directory (required)"),
        CLI_OPT("prompt-ids", "LIST", NULL, "prompt token ids, comma-separated: 1,2,3"),
        CLI_OPT("prompt-file", "FILE", NULL, "prompt token ids from FILE, separated by whitespace and/or commas; - reads stdin"),
        CLI_OPT("max-tokens", "N", NULL, "tokens to generate (required; fewer when an eos id is emitted)"),
        CLI_OPT("request-rows", "R", "8", "rows per request in a verify step: the last token + R-1 n-gram drafts"),
        CLI_SWITCH("no-spec", "plain greedy decoding, one token a step (R = 1)"),
        CLI_OPT("backend", "cpu|cuda", "cpu", "where the steps run"),
        CLI_OPT("mono", "auto|on|off", "auto", "cuda: layers 1..L-2 of verify steps as monokernel launches (auto: where eligible)"),
        CLI_OPT("threads", "T", "online cores", "CPU worker threads; more than the online cores prints a warning"),
        CLI_SWITCH("online-mxfp4", "round BF16 experts of layers 1..L-2 to MXFP4 at load"),
        CLI_OPT("max-len", "L", "prompt + max-tokens", "max model length the KV cache is sized for"),
        CLI_OPT("world", "W", "1", "CPU backend as W tensor + expert parallel ranks (threads)"),
        CLI_OPT("moe", "ep|tp", "ep", "with --world: experts split across ranks (ep) or each along its width (tp)"),
        CLI_RENAMED("rows", "--rows is now --request-rows R (rows per request: the last token + R-1 drafts)"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1], *src = "";
    int npos, *prompt = NULL, n = 0, nworld = 1, moe_tp = 0;
    sm_err e = {{0}};
    int r = cli_parse(&cli_help_generate, argc, argv, opts, no, pos, 0, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *model = cli_find(opts, no, "model"), *mt = cli_find(opts, no, "max-tokens"),
            *rows_o = cli_find(opts, no, "request-rows"), *backend = cli_find(opts, no, "backend");
    if (!model->present) { sm_errf(&e, "%s: --model DIR is required", cmd); goto bad; }
    if (!mt->present) { sm_errf(&e, "%s: --max-tokens N is required", cmd); goto bad; }
    long max_tokens, rows, threads, max_len;
    if (cli_int(cmd, mt, 1, 1 << 24, &max_tokens, &e) || cli_int(cmd, rows_o, 1, 256, &rows, &e) ||
        cli_threads(cmd, cli_find(opts, no, "threads"), &threads, &e) ||
        cli_int(cmd, cli_find(opts, no, "max-len"), 1, 1 << 24, &max_len, &e) ||
        cli_world(cmd, cli_find(opts, no, "world"), cli_find(opts, no, "moe"), &nworld, &moe_tp, &e) ||
        cli_choice(cmd, backend, "cpu|cuda", &e) || cli_choice(cmd, cli_find(opts, no, "mono"), "auto|on|off", &e))
        goto bad;
    if (!strcmp(cli_str(cli_find(opts, no, "mono")), "on") && strcmp(cli_str(backend), "cuda")) {
        sm_errf(&e, "%s: --mono on needs --backend cuda", cmd);
        goto bad;
    }
    if (cli_find(opts, no, "no-spec")->present) {
        if (rows_o->present) { sm_errf(&e, "%s: give --request-rows or --no-spec, not both", cmd); goto bad; }
        rows = 1;
    }
    if (cli_prompt(cmd, cli_find(opts, no, "prompt-ids"), cli_find(opts, no, "prompt-file"), &prompt, &n, &src, &e))
        goto bad;
    if (!max_len) max_len = (long)n + max_tokens; /* the default: exactly this request */

    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    int *ntok = NULL, *toks = NULL, *acc = NULL, rc = 2, req;
    int orc = cli_model_open(cmd, model->value, cli_find(opts, no, "online-mxfp4")->present, src, prompt, n, &m, &e);
    if (orc == -1) goto fail;
    if (orc == -2) {
        fprintf(stderr, "%s\n", e.msg);
        goto out;
    }
    sparkmono_engine_opts eo = {0};
    eo.backend = cli_str(backend);
    eo.request_rows = (int)rows;
    eo.max_requests = 1;
    eo.max_len = (int)max_len;
    /* KV pages for this one request only */
    long need = (long)n + max_tokens < max_len ? (long)n + max_tokens : max_len;
    eo.kv_blocks = (int)((need + 15) / 16);
    eo.threads = (int)threads;
    eo.world = nworld;
    eo.moe_tp = moe_tp;
    eo.mono = cli_str(cli_find(opts, no, "mono"));
    if (sparkmono_engine_create(m, &eo, &g)) goto fail;
    if (sparkmono_add(g, prompt, n, (int)max_tokens, &req)) goto fail;
    ntok = calloc(1, sizeof(int));
    toks = calloc((size_t)rows, sizeof(int));
    acc = calloc((size_t)max_tokens + 1, sizeof(int));
    if (!ntok || !toks || !acc) {
        fprintf(stderr, "%s: out of memory\n", cmd);
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
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
bad:
    free(prompt);
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
