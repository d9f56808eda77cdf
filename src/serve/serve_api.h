/* serve_api.h: the OpenAI completions API as JSON: a request body parsed and checked into
 * what the scheduler needs, and the bodies the server answers with (a completion, a stream
 * chunk, the model list, an error).
 *
 * Every field of the request is checked against the fields we know: the sampling and logit
 * processor fields (penalties, logit_bias, min_tokens, ignore_eos, stop_token_ids) are parsed
 * by serve_fields.c, shared with the chat endpoint; the structured-output fields (response_format,
 * structured_outputs, guided_*) by serve_struct.c, compiled once every other field is checked,
 * through the server's cache of constraints; a known field we do not implement
 * (best_of other than n, suffix) is a 400 naming it unless at its neutral value, since clients
 * send those by default.  A request holds one prompt or a list of them (strings, or lists of
 * token ids) and asks for n choices of each: nprompt * n choices, indexed prompt-major
 * (choice index = prompt index * n + i, as OpenAI orders them), at most max_choices (every one
 * of them must fit in the server's slots and queue at once).  echo puts the prompt's text first
 * (with logprobs, the prompt's ids and their logprobs too: sparkmono_sampling.prompt_logprobs).  logprobs (0..20) asks for
 * each generated id's logprob and the top alternatives (OpenAI's completions shape, or the chat
 * shape: sm_api_lp); prompt_logprobs (0..20, vLLM's) the prompt ids' in vLLM's shape.  vLLM's
 * extensions besides: truncate_prompt_tokens (-1 or k: each prompt's last k ids, -1 the model's
 * length), include_stop_str_in_output, skip_special_tokens, stream_options.continuous_usage_stats.
 * An unknown field is accepted and named once in the server's log (vLLM's
 * rule: clients written for vLLM send its extensions); we rejected the 400 we had before: such
 * clients broke on every request.  Error bodies have OpenAI's shape {"error": {"message",
 * "type", "param", "code"}}.
 */
#ifndef SM_SERVE_API_H
#define SM_SERVE_API_H
#include <jansson.h>
#include "base/err.h"
#include "serve/serve_fields.h"
#include "serve/serve_struct.h"
#include "serve/serve_text.h"
#include "sparkmono.h"
#include "model/tokenizer.h"

#define SM_API_DEFAULT_MAX_TOKENS 16 /* OpenAI's default for /v1/completions */

/* What the parser needs to know about the served model. */
typedef struct sm_api_model {
    const char *name;          /* the served model id */
    const sm_tokenizer *tok;   /* NULL: prompts must be token ids, no text out */
    int vocab;                 /* V: prompt ids in [0, V) */
    int max_len;               /* prompt + max_tokens <= max_len */
    int max_choices;           /* prompts x n of one request at most (the slots and queue, <= SM_API_MAX_CHOICES) */
    sm_struct_cache *cons;     /* compiled structured outputs (serve_struct.h); NULL: refused */
} sm_api_model;

#define SM_API_MAX_CHOICES 128 /* prompts x n of one request, whatever the server's size (OpenAI's n limit) */

/* A parsed /v1/completions request. */
typedef struct sm_api_req {
    int **prompt;              /* [nprompt] each prompt's ids (malloc'd) */
    int *plen;                 /* [nprompt] their lengths, each in [1, max_len) */
    int nprompt;               /* prompts: 1, or the length of a list of prompts */
    int n;                     /* choices a prompt ("n" >= 1; nprompt * n <= max_choices) */
    int max_tokens;            /* >= 1 */
    sparkmono_sampling samp;   /* temperature 0: greedy; samp.constraint, when set, is a reference
                                  of the request's own (released by sm_api_req_free) */
    int has_seed;              /* 0: no seed given (the server picks one) */
    int stream;                /* server-sent events */
    int include_usage;         /* stream_options.include_usage: a last chunk with usage */
    int continuous_usage;      /* stream_options.continuous_usage_stats (with include_usage, vLLM's rule):
                                  every chunk carries its choice's usage so far */
    int echo;                  /* the prompt's text before the completion's (with logprobs: its ids' too) */
    int lp_k;                  /* logprobs: alternatives a generated (and echoed) id (samp.logprobs set) */
    int prompt_lp_k;           /* prompt_logprobs (vLLM's): -1 not asked, else alternatives a prompt id,
                                  [0, 20]; samp.top_logprobs is the larger of the two k */
    int include_stop_str;      /* include_stop_str_in_output: a stop string stays in the text, and the
                                  text of the eos or stop id that ended the choice too */
    int keep_special;          /* skip_special_tokens false: special tokens' text is kept */
    char *stop[SM_MAX_STOP];   /* [nstop] non-empty stop strings (malloc'd, NUL-terminated; may hold NUL) */
    size_t stop_len[SM_MAX_STOP]; /* their bytes */
    int nstop;
    char ignored[SM_FIELDS_IGNORED]; /* unknown fields accepted ("'a', 'b'", "" when none): the server logs them */
} sm_api_req;

#define SM_API_PARAM 64 /* bytes of the name of an offending field ("messages[3].content[1].type") */
/* A request body [len] as JSON: an object's duplicate keys refused, "\u0000" in a string kept
 * (strings are read with their length: json_string_length).  NULL with je filled. */
json_t *sm_api_load(const char *body, size_t len, json_error_t *je);
/* 1 when the JSON string name is m's name, byte for byte (a NUL in it is no end). */
int sm_api_is_model(const sm_api_model *m, const json_t *name);
/* Parse body [len].  0 on success; otherwise *status is the HTTP status (400, or 404 for an
 * unknown model), param [SM_API_PARAM] the offending field ("" when none) and e one line. */
int sm_api_parse_completion(const char *body, size_t len, const sm_api_model *m, sm_api_req *out, int *status,
                            char *param, sm_err *e);
void sm_api_req_free(sm_api_req *r);
/* A text prompt's ids [*n] (malloc'd), as /v1/completions encodes it (no bos added): a
 * tokenizer, a non-empty text and ids in the vocabulary, or one line in e. */
int sm_api_encode(const sm_api_model *m, const char *text, size_t len, int **ids, int *n, sm_err *e);

/* The logprobs of a choice's ids.  A token's text is its id decoded alone (UTF-8 repaired), or
 * "token_id:N" without a tokenizer.  Completions: tokens, token_logprobs, top_logprobs (a map of
 * the id and its k alternatives), text_offset (those texts' characters, code points as OpenAI and
 * vLLM count them, counted from *off).  Chat:
 * {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}] x k}]}, bytes
 * the UTF-8 bytes of the token's text (as vLLM gives them: a piece of a character is U+FFFD).
 * With echo (completions) the prompt's ids come first with their logprobs, the first one's
 * logprob and top_logprobs null (OpenAI's and vLLM's shape). */
typedef struct sm_api_lp_pre {
    const int *ids;            /* [n] the echoed prompt's ids */
    const float *lp;           /* [n] their logprobs ([0] NaN: null) */
    const int *rank;           /* [n] their ranks in their positions' rows (0: unknown) */
    const int *top_ids;        /* [n * k] */
    const float *top_lp;       /* [n * k] */
} sm_api_lp_pre;
typedef struct sm_api_lp {
    const sm_tokenizer *tok;   /* NULL: tokens as "token_id:N" */
    const float *lp;           /* [nids] each id's logprob */
    const int *top_ids;        /* [nids * stride] the most likely ids of each position, the k shown first */
    const float *top_lp;       /* [nids * stride] their logprobs */
    int k;                     /* alternatives a position shown */
    size_t *off;               /* completions: in, text_offset of the first id; out, past the last */
    const sm_api_lp_pre *pre;  /* completions with echo: the prompt's ids and logprobs, before the ids
                                  (their first null); NULL or npre 0: none */
    int npre;
    int stride;                /* alternatives a position holds in top_ids / top_lp (>= k) */
} sm_api_lp;

/* vLLM's prompt_logprobs of a prompt's ids [n] (pre: its logprobs and ranks, top lists of stride
 * ids, k shown): [null, {"id": {"logprob", "rank", "decoded_token"}, ...}, ...], each position's
 * map the prompt id first, then its k most likely ids (ranks 1..k); the prompt id's rank is its
 * place in the whole row's order (the summary's tok_rank, backend.h: its place in the list when
 * it is there; ties to the lower id where vLLM ranks a tie last), null only when unknown.  NULL
 * when out of memory. */
json_t *sm_api_prompt_logprobs(const sm_tokenizer *tok, const sm_api_lp_pre *pre, int n, int k, int stride);

/* One choice of an answer, or of a stream chunk (its news since the last chunk). */
typedef struct sm_api_choice {
    int index;                 /* choices[].index: prompt index * n + its number among the prompt's */
    const char *text;          /* [ntext] its text (NULL: none) */
    size_t ntext;
    const int *ids;            /* [nids] its ids (token_ids, and the positions of lp) */
    int nids;
    const char *finish;        /* "stop" / "length"; NULL while it runs */
    const sm_api_lp *lp;       /* the ids' logprobs; NULL: "logprobs": null */
    json_t *prompt_lp;         /* completions: the choice's "prompt_logprobs" (sm_api_prompt_logprobs;
                                  borrowed), NULL: none */
} sm_api_choice;

/* The chat shape of lp over ids [n] ({"content": [...]}; NULL when out of memory). */
json_t *sm_api_chat_logprobs(const sm_api_lp *lp, const int *ids, int n);

/* A response body (malloc'd JSON text) for an error: type is OpenAI's error type
 * ("invalid_request_error", ...), param and code may be NULL. */
char *sm_api_error(const char *msg, const char *type, const char *param, const char *code);
/* OpenAI's error type of an HTTP status ("invalid_request_error", "not_found_error", "server_error"). */
const char *sm_api_error_type(unsigned status);
/* The body of a finished completion: choices c [nc] in index order and the usage (prompt_tokens:
 * every prompt's once; completion_tokens: every choice's). */
char *sm_api_completion(const char *id, long created, const char *model, const sm_api_choice *c, int nc,
                        int prompt_tokens, int completion_tokens);
/* One stream chunk (the JSON after "data: "): one choice's news. */
char *sm_api_chunk(const char *id, long created, const char *model, const sm_api_choice *c);
/* The last stream chunk when usage was asked for: no choices, the token counts. */
char *sm_api_usage_chunk(const char *id, long created, const char *model, int prompt_tokens, int completion_tokens);
/* json, a compact JSON object's text (freed; NULL passes through), with key: value (stolen) added
 * last, as its answer builder would have written it; NULL when out of memory.  One splice for
 * both answer shapes (completions, chat): a chunk's usage (continuous_usage_stats), a chat
 * answer's prompt_logprobs. */
char *sm_api_add_key(char *json, const char *key, json_t *value);
/* {"prompt_tokens", "completion_tokens", "total_tokens"} (NULL when out of memory). */
json_t *sm_api_usage(int prompt_tokens, int completion_tokens);
/* GET /v1/models (one entry) or /v1/models/NAME (list 0: the entry alone). */
char *sm_api_models(const char *model, long created, int max_len, int list);

#endif
