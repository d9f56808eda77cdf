/* cmd_serve.c: `sparkmono serve MODEL_DIR`: the command line of the OpenAI-compatible HTTP
 * server (src/serve/serve.h does the serving).  This file only turns flags into sm_serve_opts;
 * every bad flag is one line and exit status 2, as everywhere in the CLI.  We rejected a
 * configuration file: every setting is one flag, listed by --help from the table below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "serve/serve.h"

const cli_cmd cli_help_serve = {
    "serve",
    "OpenAI-compatible HTTP server: /v1/completions (streaming too), /v1/models, /health, /metrics, /tokenize",
    "MODEL_DIR [options]   (or --model DIR)",
    "sparkmono serve build/models/tiny --port 8000 --max-requests 16",
    "Prints 'serve: listening on http://HOST:PORT/v1 ...' on stdout once it accepts requests; one\n"
    "line a request on stderr (--quiet: none).  Up to --max-requests requests run in every verify\n"
    "step (continuous batching); --queue more wait, and one more gets a 503.  Thousands of open\n"
    "connections cost little (a few polling threads); a request must arrive whole within\n"
    "--request-timeout, an idle connection is closed after --idle-timeout.  Text prompts and\n"
    "text output need MODEL_DIR/tokenizer.json; without it prompts are lists of token ids.\n"
    "SIGTERM / SIGINT: stop accepting, let the requests in flight finish (--drain-timeout), exit 0.",
};

int cmd_serve(int argc, char **argv) {
    const char *cmd = "serve";
    cli_opt opts[] = {
        CLI_OPT("model", "DIR", NULL, "checkpoint directory (or give it as the first word)"),
        CLI_OPT("host", "ADDR", "127.0.0.1", "address to listen on (0.0.0.0: every interface; IPv6 too)"),
        CLI_OPT("port", "N", "8000", "TCP port (0: any free port, printed when listening)"),
        CLI_OPT("model-name", "NAME", "MODEL_DIR's last component", "the model id clients give in \"model\""),
        CLI_OPT("backend", "cpu|cuda", "cpu", "where the steps run"),
        CLI_OPT("request-rows", "R", "8", "rows per request in a verify step: the last token + R-1 n-gram drafts"),
        CLI_SWITCH("no-spec", "plain decoding, one token a step (R = 1)"),
        CLI_OPT("max-requests", "N", "16", "requests batched in one verify step"),
        CLI_OPT("queue", "N", "64", "requests waiting beyond --max-requests; one more is answered 503"),
        CLI_OPT("max-len", "L", "4096", "most tokens of a request: prompt + max_tokens"),
        CLI_OPT("chat-template", "FILE", "the model directory's", "the chat template (Jinja) of /v1/chat/completions, as vLLM's "
                "--chat-template: over tokenizer_config.json's and chat_template.jinja; special tokens still come from the directory"),
        CLI_OPT("kv-blocks", "N", "max-requests x max-len / 16", "KV pages of 16 tokens; fewer: requests wait for pages, and a "
                "step short of pages preempts the newest request (recomputed later)"),
        CLI_OPT("gpu-memory-utilization", "U", NULL, "cuda: the KV pool takes the pages that fit in this share (0, 1] of each "
                "GPU's memory after the weights (vLLM's flag); instead of --kv-blocks"),
        CLI_OPT("max-body", "BYTES", "1048576", "largest request body; a longer one is answered 413"),
        CLI_OPT("max-connections", "N", "4096", "open connections served; past it requests but /health are answered 503"),
        CLI_OPT("request-timeout", "S", "10", "seconds a client has to send a whole request (headers and body); then 408"),
        CLI_OPT("idle-timeout", "S", "5", "seconds a connection may stay open with no request under way (kept alive)"),
        CLI_OPT("threads", "T", "online cores", "CPU worker threads; more than the online cores prints a warning"),
        CLI_SWITCH("online-mxfp4", "round BF16 experts of layers 1..L-2 to MXFP4 at load"),
        CLI_ACTS_OPT,
        CLI_PREFIX_OPT,
        CLI_WORLD_OPTS,
        CLI_OPT("drain-timeout", "S", "30", "seconds the requests in flight may take after SIGTERM before they are cancelled"),
        CLI_SWITCH("quiet", "no log line per request"),
        CLI_OPT("api-key", "KEY", "$SPARKMONO_API_KEY", "requests to /v1/ need 'Authorization: Bearer KEY' (else 401); "
                "/health, /metrics, /version, /tokenize, /detokenize stay open"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos;
    cli_world_sel ws = {0};
    sm_err e = {{0}};
    int r = cli_parse(&cli_help_serve, argc, argv, opts, no, pos, 1, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *model = cli_find(opts, no, "model"), *rows_o = cli_find(opts, no, "request-rows"),
            *backend = cli_find(opts, no, "backend");
    if (model->present == (npos == 1)) {
        sm_errf(&e, "%s: give the model directory once: MODEL_DIR or --model DIR", cmd);
        goto bad;
    }
    sm_serve_opts so = {0};
    so.model_dir = model->present ? model->value : pos[0];
    so.host = cli_str(cli_find(opts, no, "host"));
    so.model_name = cli_find(opts, no, "model-name")->present ? cli_find(opts, no, "model-name")->value : NULL;
    so.backend = cli_str(backend);
    so.online_mxfp4 = cli_find(opts, no, "online-mxfp4")->present;
    so.quiet = cli_find(opts, no, "quiet")->present;
    so.no_prefix_cache = cli_find(opts, no, "no-prefix-cache")->present;
    long port, rows, maxreq, queue, maxlen, maxbody, maxconn, reqto, idleto, threads, drain, kvb = 0;
    if (cli_int(cmd, cli_find(opts, no, "port"), 0, 65535, &port, &e) || cli_int(cmd, rows_o, 1, 256, &rows, &e) ||
        cli_int(cmd, cli_find(opts, no, "max-requests"), 1, 4096, &maxreq, &e) ||
        cli_int(cmd, cli_find(opts, no, "queue"), 0, 1 << 20, &queue, &e) ||
        cli_int(cmd, cli_find(opts, no, "max-len"), 2, 1 << 24, &maxlen, &e) ||
        (cli_find(opts, no, "kv-blocks")->present && cli_int(cmd, cli_find(opts, no, "kv-blocks"), 1, 1 << 30, &kvb, &e)) ||
        cli_int(cmd, cli_find(opts, no, "max-body"), 1024, 1L << 30, &maxbody, &e) ||
        cli_int(cmd, cli_find(opts, no, "max-connections"), 1, 1 << 20, &maxconn, &e) ||
        cli_int(cmd, cli_find(opts, no, "request-timeout"), 1, 3600, &reqto, &e) ||
        cli_int(cmd, cli_find(opts, no, "idle-timeout"), 1, 3600, &idleto, &e) ||
        cli_int(cmd, cli_find(opts, no, "drain-timeout"), 0, 86400, &drain, &e) ||
        cli_threads(cmd, cli_find(opts, no, "threads"), &threads, &e) ||
        cli_world(cmd, opts, no, &ws, &e) || cli_acts(cmd, opts, no, &so.activations, &e) ||
        cli_choice(cmd, backend, "cpu|cuda", &e))
        goto bad;
    if (so.model_name && !*so.model_name) {
        sm_errf(&e, "%s: --model-name is empty", cmd);
        goto bad;
    }
    /* the flag wins over the variable; an empty variable is no key */
    cli_opt *key = cli_find(opts, no, "api-key");
    so.api_key = key->present ? key->value : getenv("SPARKMONO_API_KEY");
    if (so.api_key && !*so.api_key && !key->present) so.api_key = NULL;
    if (so.api_key) {
        const char *what = key->present ? "--api-key" : "SPARKMONO_API_KEY";
        if (!*so.api_key) { sm_errf(&e, "%s: %s is empty", cmd, what); goto bad; }
        for (const char *k = so.api_key; *k; k++)
            if (*k < 0x21 || *k > 0x7e) { /* a header carries it: visible ASCII only */
                sm_errf(&e, "%s: %s holds a character that cannot go in an HTTP header (visible ASCII only)", cmd, what);
                goto bad;
            }
    }
    if (cli_find(opts, no, "no-spec")->present) {
        if (rows_o->present) { sm_errf(&e, "%s: give --request-rows or --no-spec, not both", cmd); goto bad; }
        rows = 1;
    }
    so.port = (int)port;
    so.request_rows = (int)rows;
    so.max_requests = (int)maxreq;
    so.queue = (int)queue;
    so.max_len = (int)maxlen;
    so.kv_blocks = (int)kvb;
    if (cli_find(opts, no, "gpu-memory-utilization")->present) {
        double u;
        if (cli_number(cmd, cli_find(opts, no, "gpu-memory-utilization"), 1e-3, 1, &u, &e)) goto bad;
        if (kvb) { sm_errf(&e, "%s: give --kv-blocks or --gpu-memory-utilization, not both", cmd); goto bad; }
        so.gpu_memory_utilization = (float)u;
    }
    so.chat_template = cli_find(opts, no, "chat-template")->present ? cli_find(opts, no, "chat-template")->value : NULL;
    so.max_body = (size_t)maxbody;
    so.max_connections = (int)maxconn;
    so.request_timeout_s = (int)reqto;
    so.idle_timeout_s = (int)idleto;
    so.threads = (int)threads;
    so.drain_s = (int)drain;
    so.world = ws.world;
    so.moe_tp = ws.moe_tp;
    so.devices = ws.devices;
    so.comm = ws.comm;
    if (sm_serve_run(&so, &e)) goto bad;
    return 0;
bad:
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
