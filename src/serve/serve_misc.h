/* serve_misc.h: the small endpoints of `sparkmono serve` besides the completions (POST
 * /tokenize, POST /detokenize, GET /version) and the API key (--api-key / SPARKMONO_API_KEY).
 *
 * Each handler takes the request body and returns the HTTP status and the answer's JSON (an
 * OpenAI-style error body when the status is not 200), so serve_http.c only routes and
 * queues.  The API key guards the /v1/ paths only, as vLLM does: /health, /metrics, /version,
 * /tokenize and /detokenize stay open to probes and scrapers on the same network.
 */
#ifndef SM_SERVE_MISC_H
#define SM_SERVE_MISC_H
#include <stddef.h>
#include "serve/serve_api.h"

/* POST /tokenize {"prompt": TEXT, "model"?: NAME} -> {"tokens": [...], "count": n,
 * "max_model_len": L}; the text encoded as /v1/completions encodes it.  Returns the status;
 * *out the body (NULL: out of memory). */
int sm_misc_tokenize(const sm_api_model *m, const char *body, size_t len, char **out);
/* POST /detokenize {"tokens": [ids], "model"?: NAME} -> {"prompt": TEXT}. */
int sm_misc_detokenize(const sm_api_model *m, const char *body, size_t len, char **out);
/* GET /version -> {"version": "..."} (sparkmono_version()). */
char *sm_misc_version(void);

/* GET /metrics: the Prometheus text of s (serve_metrics.h; NULL when out of memory). */
struct sm_server;
char *sm_serve_metrics(struct sm_server *s);

/* Does the Authorization header value auth ("Bearer KEY"; NULL when absent) carry key?  The
 * comparison takes the same time wherever the first difference is. */
int sm_misc_key_ok(const char *key, const char *auth);
/* Is the path one the API key guards (/v1/...)? */
int sm_misc_key_guards(const char *url);
/* Is host a loopback address ("127.x.x.x", "::1", "localhost")? */
int sm_misc_loopback(const char *host);

#endif
