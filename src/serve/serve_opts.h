/* serve_opts.h: the options of `sparkmono serve` (sm_serve_opts), filled from the flags by
 * tools/cmd_serve.c and read by every part of the server.  A header of its own, below the
 * server's parts: serve_http.h needs the options but not sm_serve_run, and serve.h sits above
 * serve_http.h.  We rejected keeping the struct in serve.h: serve_http.h would include the
 * header of the file that includes it.
 */
#ifndef SM_SERVE_OPTS_H
#define SM_SERVE_OPTS_H
#include <stddef.h>

typedef struct sm_serve_opts {
    const char *model_dir;   /* checkpoint directory (tokenizer.json optional) */
    const char *model_name;  /* the id clients name in "model"; NULL: the directory's basename */
    const char *host;        /* address to bind ("127.0.0.1", "0.0.0.0", "::1") */
    int port;                /* 0: any free port (the one bound is printed) */
    const char *backend;     /* "cpu" or "cuda" */
    int request_rows;        /* R: rows per request in a verify step (1 = no speculation) */
    int max_requests;        /* requests batched in one verify step */
    int queue;               /* requests waiting beyond those; one more is a 503 */
    int max_len;             /* prompt + max_tokens of a request */
    int kv_blocks;           /* KV pages (0: the engine's default, every request at max_len) */
    float gpu_memory_utilization; /* cuda: > 0 sizes the KV pool from memory instead (engine option) */
    const char *chat_template; /* --chat-template FILE: the chat template, over the model directory's; or NULL */
    size_t max_body;         /* bytes of a request body; more is a 413 */
    int max_connections;     /* open connections served; past it requests are a 503 (/health answered) */
    int request_timeout_s;   /* seconds to receive a whole request from its request line; then a 408 */
    int idle_timeout_s;      /* seconds a connection may stay open without a request under way */
    int threads;             /* CPU worker threads (0: online cores) */
    int world, moe_tp;       /* tensor + expert parallel ranks, MoE split */
    const char *devices;     /* cuda with world > 1: "0,1,.." the device of each rank, or NULL */
    const char *comm;        /* cuda with world > 1: "peer" or "nccl" (NULL: peer) */
    int online_mxfp4;        /* round BF16 experts to MXFP4 at load */
    const char *activations; /* the MXFP4 experts' activations: NULL or "auto", "mxfp4", "bf16"
                                (sparkmono_model_opts.activations) */
    int no_prefix_cache;     /* --no-prefix-cache: sparkmono_engine_opts.no_prefix_cache (0: the cache is on) */
    int drain_s;             /* seconds in-flight requests may take after SIGTERM */
    int quiet;               /* no log line per request */
    const char *api_key;     /* --api-key / SPARKMONO_API_KEY: /v1/ requests need "Authorization: Bearer KEY"; NULL: none */
} sm_serve_opts;

#endif
