/* sparkmono.h: the public C API of sparkmono, a decode engine for Muse Spark 1.x.
 *
 * Opaque handles (a model, an engine over it), every call returns an sm_status; on failure
 * sparkmono_errmsg() gives one line naming the problem (the argument, tensor or file).
 * The engine runs greedy decoding with speculative verify steps: each step feeds, per live
 * request, its last token and R-1 drafts from an n-gram drafter, and accepts drafts while
 * they match the model's argmax (docs/model.md section 8), so the output is token for token that
 * of one-token-at-a-time greedy decoding.  A request may sample instead (sparkmono_add_sampled):
 * drafts are then accepted by the rule that keeps plain sampling's distribution exactly.
 * C11, no CUDA types; one engine is used by one thread at a time.  We rejected exposing the
 * internal structs (sm_model, sm_kv): the GPU and multi-rank layouts will change behind this
 * header.
 *
 * Typical use:
 *   sparkmono_model *m; sparkmono_engine *g; int req;
 *   sparkmono_model_open("models/tiny", NULL, &m);
 *   sparkmono_engine_create(m, NULL, &g);                 // cpu, R = 8
 *   sparkmono_add(g, prompt, n, 64, &req);
 *   sparkmono_generate(g);                                // prefill + verify until done
 *   sparkmono_output(g, req, &ids, &nids);
 */
#ifndef SPARKMONO_H
#define SPARKMONO_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sm_status {
    SM_OK = 0,
    SM_E_INVALID = 1,  /* bad argument: option, request id, prompt id, length */
    SM_E_MODEL = 2,    /* model directory missing, or checkpoint/config invalid */
    SM_E_CACHE = 3,    /* KV cache pages or request slots exhausted */
    SM_E_BACKEND = 4,  /* backend not built in, or it failed during a step */
    SM_E_NOMEM = 5,    /* host allocation failed */
    SM_E_STATE = 6,    /* call not valid now (e.g. prefill twice) */
    SM_E_IO = 7        /* writing an output file failed */
} sm_status;

/* One line describing the last failed call on this thread ("" if none). */
const char *sparkmono_errmsg(void);
/* Name of a status ("ok", "invalid argument", ...). */
const char *sparkmono_status_str(sm_status s);

typedef struct sparkmono_model sparkmono_model;
typedef struct sparkmono_engine sparkmono_engine;
typedef struct sparkmono_constraint sparkmono_constraint;

/* ---- model ---------------------------------------------------------------------------- */

typedef struct sparkmono_model_opts {
    int online_mxfp4;   /* 1: round BF16 experts of layers 1..L-2 to MXFP4 at load */
    const char *activations; /* the activations of the MXFP4 experts' matmuls: NULL or "auto" (as the
                                checkpoint declares: W4A4, MXFP4 activations, when its quantization_config
                                declares MXFP4 input tensors, and with online_mxfp4; else W4A16), "mxfp4"
                                (W4A4 on every MXFP4 layer) or "bf16" (W4A16); BF16 and FP8 experts always
                                take bf16 activations (docs/model.md section 6) */
} sparkmono_model_opts;

typedef struct sparkmono_model_info {
    int num_layers;     /* L */
    int hidden_size;    /* H */
    int vocab_size;     /* V: valid prompt ids are [0, V) */
    int vocab_used;     /* greedy never picks ids >= vocab_used */
    int bos;            /* bos id, -1 if none */
    int n_eos;          /* entries of eos */
    int eos[8];         /* [n_eos] generation stops after emitting one of these */
} sparkmono_model_info;

/* Open a checkpoint directory (config.json + safetensors). o may be NULL (defaults). */
sm_status sparkmono_model_open(const char *dir, const sparkmono_model_opts *o, sparkmono_model **out);
/* Close a model; every engine on it must be destroyed first. NULL is ignored. */
void sparkmono_model_close(sparkmono_model *m);
sm_status sparkmono_model_get_info(const sparkmono_model *m, sparkmono_model_info *out);

/* ---- engine --------------------------------------------------------------------------- */

/* Zero in any field means its default. */
typedef struct sparkmono_engine_opts {
    const char *backend;     /* "cpu" (default) or "cuda" */
    int request_rows;        /* R, rows per request in a verify step: last token + R-1 drafts
                                (default 8; 1 = no speculation; the CUDA backend takes at most 16) */
    int max_requests;        /* live requests at once (default 1) */
    int max_len;             /* max model length: prompt + generated tokens (default 4096) */
    int kv_blocks;           /* KV pages of 16 tokens (default max_requests * ceil(max_len / 16)) */
    int prefill_chunk;       /* most prompt rows per step (default 512) */
    int naux;                /* auxiliary hidden states per step (default 0) */
    const int *aux_layers;   /* [naux] j in [0, L]: residual stream entering layer j (L: after the last) */
    int threads;             /* cpu worker threads (default: online cores) */
    int world;               /* ranks of tensor + expert parallelism (default 1); > 1 needs a
                                model whose dims it divides (cpu: threads; cuda: one GPU each) */
    int moe_tp;              /* with world > 1: 0 experts split across ranks (EP), 1 every
                                expert split along its FFN width (TP without EP) */
    const char *mono;        /* cuda: "off" (default: stock steps), "auto" (the monokernel runs layers
                                1..L-2 of verify steps where eligible) or "on" (a static refusal is
                                an error); the default stays "off" while the monokernel measures
                                slower than the stock path (bench/results.md) */
    const char *devices;     /* cuda with world > 1: "0,1,2,3", the device of each rank (default
                                0..world-1); a device listed twice holds several virtual ranks
                                (tests on one GPU; exchanges through peer memory only) */
    const char *comm;        /* cuda with world > 1: "peer" (default: one-shot kernels over peer
                                memory) or "nccl" (libnccl.so.2 loaded at run time) */
    int no_prefix_cache;     /* 1: every request prefills its whole prompt.  0 (default): the full
                                16-token pages of a prompt stay cached, keyed by a chained hash of
                                their tokens, and a request whose prompt begins with cached pages
                                reuses them (read-only, shared) and prefills only the rest (at least
                                its last token); unreferenced cached pages are evicted least
                                recently used first when the pool needs pages */
    float gpu_memory_utilization; /* cuda, (0, 1]: the KV pool takes the pages that fit in this share of
                                each device's memory after the weights, the workspaces and a reserve
                                (vLLM's --gpu-memory-utilization); kv_blocks must then be 0.  0
                                (default): kv_blocks' pages */
} sparkmono_engine_opts;

/* The prefix cache and the KV page pool of an engine (sparkmono_cache_stats). */
typedef struct sparkmono_cache_stats {
    long long queries;       /* prompt tokens looked up in the prefix cache (prefills with it on) */
    long long hits;          /* of them, tokens served by cached pages (not computed) */
    long long computed;      /* prompt tokens prefilled (computed), cache on or off */
    int pages;               /* KV pages of the pool (16 tokens each) */
    int pages_used;          /* held by live requests (shared pages once) */
    int pages_cached;        /* holding a cached prompt prefix no live request holds (evictable) */
    int pages_free;          /* neither */
    int enabled;             /* 1 when the prefix cache is on */
} sparkmono_cache_stats;
/* The counters and the pool now.  NULL g or out: SM_E_INVALID. */
sm_status sparkmono_cache_stats_get(const sparkmono_engine *g, sparkmono_cache_stats *out);

/* Create an engine on m (m must outlive it). o may be NULL (all defaults). */
sm_status sparkmono_engine_create(sparkmono_model *m, const sparkmono_engine_opts *o, sparkmono_engine **out);
/* Destroy an engine and its requests. NULL is ignored. */
void sparkmono_engine_destroy(sparkmono_engine *g);

/* ---- requests ------------------------------------------------------------------------- */

/* Add a request: prompt [n] ids in [0, V), n >= 1, n + max_tokens <= max_len, max_tokens >= 0
 * (0: prefill only, e.g. for its logits).  *req is its id, in [0, max_requests). */
sm_status sparkmono_add(sparkmono_engine *g, const int *prompt, int n, int max_tokens, int *req);
/* Sampling of a request's tokens.  temperature 0 is greedy (the default: every field zero).
 * Otherwise p = softmax(logits / temperature), restricted to the top_k largest (0: all) and to
 * the smallest set whose mass reaches top_p (0 or 1: all), renormalized; draws come from a
 * counter-based generator keyed by (seed, request position), so a request's tokens depend on
 * its seed only, never on the batch it runs in.  Under speculation a draft d is accepted with
 * probability p(d); on rejection the token is drawn from p with d removed, renormalized: the
 * output has exactly the distribution of plain sampling (docs/model.md section 8).  min_p
 * (vLLM's order: after temperature, before top_k and top_p) drops every id whose probability is
 * below min_p times the most likely id's. */
#define SPARKMONO_MAX_BIAS 300     /* most logit_bias entries of a request */
#define SPARKMONO_MAX_STOP_IDS 32  /* most stop ids of a request */
#define SPARKMONO_MAX_TOP_LOGPROBS 20 /* most alternatives a generated id's logprobs list */
#define SPARKMONO_MAX_ALLOWED_IDS 1024 /* most allowed_ids of a request */
#define SPARKMONO_MAX_BAD_WORDS 64     /* most id sequences of a request's bad words */
#define SPARKMONO_MAX_BAD_WORD_IDS 512 /* their ids in all */

/* One logit_bias entry: bias added to the logit of id. */
typedef struct sparkmono_bias {
    int id;             /* [0, V) */
    float bias;         /* [-100, 100] */
} sparkmono_bias;

/* Logit processors (src/engine/logitproc.c; every field zero: none) change the raw logits of
 * each position before the draw or the argmax, in this order (vLLM's): allowed_ids (every other
 * id -inf), bad words (ids -inf), min_tokens (eos and stop ids -inf), logit_bias, repetition
 * penalty (over prompt and generated ids), then frequency and presence penalties (over generated
 * ids); a greedy request with processors takes the argmax of the processed row.  Each position's row is processed with the history up to it (drafts
 * included), so speculation stays exact.  Stop rules: eos ends a request unless ignore_eos,
 * each of stop_ids ends it like eos. */
typedef struct sparkmono_sampling {
    float temperature;  /* 0: greedy */
    int top_k;          /* 0: no limit */
    float top_p;        /* 0 or 1: no limit */
    unsigned long long seed;
    float presence_penalty;   /* [-2, 2]: subtracted once from the logit of each id generated so far */
    float frequency_penalty;  /* [-2, 2]: subtracted from each id's logit times its count in the generated ids */
    float repetition_penalty; /* 0 or 1: none; > 0: the logit of each id of the prompt or generated ids is
                                 divided by it when positive, multiplied when negative */
    int min_tokens;           /* eos and stop ids are forbidden until this many ids are generated (except
                                 where a constraint allows nothing else: its text is complete) */
    int ignore_eos;           /* 1: eos ids do not end the request */
    int n_bias;               /* entries of bias, [0, SPARKMONO_MAX_BIAS] */
    sparkmono_bias bias[SPARKMONO_MAX_BIAS]; /* [n_bias] logit_bias */
    int n_stop_ids;           /* entries of stop_ids, [0, SPARKMONO_MAX_STOP_IDS] */
    int stop_ids[SPARKMONO_MAX_STOP_IDS];    /* [n_stop_ids] ids in [0, V) that end the request like eos */
    int logprobs;             /* 1: record each generated id's logprob: a log-softmax in double of the raw
                                 model logits of its position (before processors and temperature, vLLM's
                                 default), made where the logits are (cuda: on the GPU), read with
                                 sparkmono_logprobs */
    int top_logprobs;         /* [0, SPARKMONO_MAX_TOP_LOGPROBS]: with logprobs (or prompt_logprobs), also the
                                 most likely ids of each position and their logprobs (ties to the lowest id) */
    int prompt_logprobs;      /* 1: also record the logprob of each prompt id after the first (the
                                 distribution of its position given the ids before it: what scoring a
                                 text needs), with top_logprobs alternatives; made by the prefill, read
                                 with sparkmono_prompt_logprobs */
    sparkmono_constraint *constraint; /* NULL, or the structured output the generated text must be
                                 (sparkmono_constraint_create, on this engine's model): at each position
                                 every id whose bytes the constraint cannot read next gets logit -inf
                                 before anything else (processors, the draw, the argmax, logprobs: the
                                 masked distribution, as vLLM reports it); eos ids only where the text
                                 is complete.  The request holds a reference until it is removed */
    float min_p;              /* [0, 1], 0: none.  A sampled request drops each id whose probability
                                 (after temperature) is below min_p times the largest one (before top_k
                                 and top_p); greedy ignores it, as the argmax is always kept */
    int n_allowed_ids;        /* entries of allowed_ids, [0, SPARKMONO_MAX_ALLOWED_IDS]; 0: every id */
    int allowed_ids[SPARKMONO_MAX_ALLOWED_IDS]; /* [n_allowed_ids] ids in [0, V): every other id gets
                                 logit -inf (eos too, unless listed) */
    int n_bad_words;          /* id sequences in bad_word_ids, [0, SPARKMONO_MAX_BAD_WORDS] */
    int bad_word_len[SPARKMONO_MAX_BAD_WORDS]; /* [n_bad_words] ids of each sequence, >= 1, at most
                                 SPARKMONO_MAX_BAD_WORD_IDS in all */
    int bad_word_ids[SPARKMONO_MAX_BAD_WORD_IDS]; /* the sequences one after another, ids in [0, V):
                                 the last id of a sequence gets logit -inf where the generated ids (not
                                 the prompt's) end with its other ids; a one-id sequence always */
} sparkmono_sampling;

/* sparkmono_add with sampling parameters (s NULL: greedy). */
sm_status sparkmono_add_sampled(sparkmono_engine *g, const int *prompt, int n, int max_tokens, const sparkmono_sampling *s,
                                int *req);
/* Remove a request and free its cache pages; its id may be reused by a later add. */
sm_status sparkmono_remove(sparkmono_engine *g, int req);

/* Run the prompt of req through the model (in steps of at most prefill_chunk rows).
 * logits: NULL, or [n, V] f32 softcapped logits of every prompt row (ids >= vocab_used are
 * -inf).  When max_tokens >= 1 the argmax of the last row (a sampled request: its draw) is the
 * first generated token. */
sm_status sparkmono_prefill(sparkmono_engine *g, int req, float *logits);

/* One verify step over every live request that is prefilled and not finished.  For request
 * id r that took part, ntok[r] = tokens emitted this step (accepted drafts + 1, cut after an
 * eos or at max_tokens) and toks[r * R .. r * R + ntok[r]) the tokens; ntok[r] = 0 for the
 * others.  ntok [max_requests] and toks [max_requests * R] may each be NULL.  *nreq (may be
 * NULL) = requests in the step; 0 means there was nothing to do. */
sm_status sparkmono_verify(sparkmono_engine *g, int *ntok, int *toks, int *nreq);

/* Prefill every live request not yet prefilled, then run verify steps until every live
 * request has emitted max_tokens tokens or an eos id. */
sm_status sparkmono_generate(sparkmono_engine *g);

typedef struct sparkmono_request_info {
    int prompt_len;     /* n */
    int max_tokens;     /* as given to sparkmono_add */
    int ngen;           /* tokens generated so far */
    int kv_len;         /* positions whose K/V are committed (prompt + ngen - 1 once generating) */
    int prefilled;      /* 1 after sparkmono_prefill */
    int done;           /* 0 running, 1 eos emitted, 2 max_tokens reached, 3 failed alone in a verify step
                           (its constraint or processors left no id; the step's other requests went on;
                           sparkmono_verify fails only when every request of the step did) */
    int steps;          /* verify steps taken */
    int accepted;       /* drafts accepted over all steps */
} sparkmono_request_info;

sm_status sparkmono_request_get_info(const sparkmono_engine *g, int req, sparkmono_request_info *out);
/* Generated tokens of req: *ids points to [*n] ids owned by the engine, valid until the next
 * call that changes req (verify, generate, remove). */
sm_status sparkmono_output(const sparkmono_engine *g, int req, const int **ids, int *n);
/* Logprobs of req's generated ids (a request added with logprobs = 1): *lp [n] each id's logprob,
 * *top_ids and *top_lp [n * *k] the k most likely ids of each position and theirs (k =
 * top_logprobs); n = the ids sparkmono_output gives.  Owned by the engine like those ids. */
sm_status sparkmono_logprobs(const sparkmono_engine *g, int req, const float **lp, const int **top_ids,
                             const float **top_lp, int *k);
/* Logprobs of req's prompt ids (a request added with prompt_logprobs = 1, once prefilled): *lp
 * [prompt_len] (entry 0, the first id, has no distribution: NaN), *rank [prompt_len] each id's
 * rank in its position's distribution (1: the most likely; the order of the top ids, ties to the
 * lowest id, so an id among them ranks as its place there; entry 0's: 0), *top_ids / *top_lp
 * [prompt_len * *k] each position's k most likely ids and theirs (entry 0's: -1 / NaN).  Owned by
 * the engine like its ids. */
sm_status sparkmono_prompt_logprobs(const sparkmono_engine *g, int req, const float **lp, const int **rank,
                                    const int **top_ids, const float **top_lp, int *k);
/* Auxiliary hidden states of req's rows in the last step that carried them (the last prefill
 * chunk or a verify step): out [naux, *nrows, H] f32 with *nrows <= max(R, prefill_chunk).
 * Error when the engine has no aux layers or req was not in the last step. */
sm_status sparkmono_aux(const sparkmono_engine *g, int req, float *out, int *nrows);

/* ---- continuous batching (src/engine/batch.c) -------------------------------------------- */

/* A batch owns the request slots of one engine and a FIFO of requests waiting for them: each
 * call of sparkmono_batch_step admits waiting requests while slots are free (add + prefill,
 * which emits each one's first token), runs one verify step over every live request, and
 * reports every request that got ids or ended; ended ones leave the engine at once.  Batch
 * invariance: a request's ids do not depend on what it is batched with.  submit, cancel and
 * counts may be called from any thread; admit, verify, step and destroy from one thread at a
 * time.  While a batch exists, the engine's requests are its own (no sparkmono_add beside it).
 * We rejected a callback a request: Python (ctypes) and the server's lock discipline both
 * prefer an array of results read after the call. */
typedef struct sparkmono_batch sparkmono_batch;

/* How a batched request ended (sparkmono_batch_event.done). */
enum { SM_BATCH_RUNNING = 0, SM_BATCH_EOS = 1, SM_BATCH_LENGTH = 2, SM_BATCH_FAILED = 3, SM_BATCH_CANCELLED = 4 };

typedef struct sparkmono_batch_event {
    long long id;            /* the request, as sparkmono_batch_submit numbered it */
    void *user;              /* as given to sparkmono_batch_submit */
    const int *ids;          /* [n] ids generated since its last event (owned by the batch, valid
                                until its next admit / verify / step / destroy) */
    int n;                   /* new ids (0 for an end without new ids) */
    int ngen;                /* ids generated so far, these included */
    int done;                /* SM_BATCH_*: RUNNING, or how it ended (its last event) */
    int prompt_len;          /* tokens of its prompt */
    int steps, accepted;     /* verify steps it took part in, drafts accepted over them */
    const char *err;         /* done FAILED or CANCELLED: one line (else ""); owned like ids */
    const float *logprobs;   /* [n] the new ids' logprobs (a request with logprobs), else NULL; owned like ids */
    const int *top_ids;      /* [n * top] each new id's position's most likely ids (sparkmono_logprobs) */
    const float *top_lp;     /* [n * top] their logprobs */
    int top;                 /* top_logprobs of the request (0 without logprobs) */
    const float *prompt_lp;  /* its first event with ids (max_tokens 0: its end), a request with
                                prompt_logprobs: [prompt_len] sparkmono_prompt_logprobs' values (entry
                                0 NaN), else NULL; owned like ids */
    const int *prompt_top_ids; /* [prompt_len * top] */
    const float *prompt_top_lp; /* [prompt_len * top] */
    const int *prompt_rank;  /* with prompt_lp: [prompt_len] each prompt id's rank (sparkmono_prompt_logprobs) */
} sparkmono_batch_event;

/* A batch over g's request slots (g must outlive it) with at most queue_cap requests waiting
 * beyond the free slots (-1: no limit). */
sm_status sparkmono_batch_create(sparkmono_engine *g, int queue_cap, sparkmono_batch **out);
/* Destroy a batch: waiting requests are dropped, live ones removed from the engine (no events). */
void sparkmono_batch_destroy(sparkmono_batch *b);
/* Queue a request (prompt [n] copied; s NULL: greedy) after checking it as sparkmono_add
 * would; *id numbers it (1, 2, ... over the batch's life).  max_tokens 0 prefills the prompt
 * only: its one event ends it LENGTH without ids (with its prompt logprobs, when asked).  SM_E_CACHE when
 * every slot is taken and queue_cap requests wait already. */
sm_status sparkmono_batch_submit(sparkmono_batch *b, const int *prompt, int n, int max_tokens, const sparkmono_sampling *s,
                                 void *user, long long *id);
/* Cancel request id.  *queued (may be NULL) = 1: it was waiting and is gone now, no event will
 * follow; 0: it is live and leaves before the next verify step, its last event CANCELLED.
 * SM_E_INVALID when id is neither waiting nor live (never submitted, or its last event made). */
sm_status sparkmono_batch_cancel(sparkmono_batch *b, long long id, int *queued);
/* The two halves of a step, each reporting into *ev [*nev]: admit (cancelled requests leave,
 * waiting ones join while slots are free) and verify (one verify step over the live requests;
 * a failed step ends every request in it FAILED and returns its status).  A request's first
 * event may come from admit (its first token) so a server can send it before the verify. */
sm_status sparkmono_batch_admit(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev);
sm_status sparkmono_batch_verify(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev);
/* admit then verify, their events together (a request's ids of both in one event). */
sm_status sparkmono_batch_step(sparkmono_batch *b, const sparkmono_batch_event **ev, int *nev);
/* Requests live in the engine and waiting now (either pointer may be NULL). */
void sparkmono_batch_counts(sparkmono_batch *b, int *live, int *queued);

/* ---- structured outputs (src/constrain/) ------------------------------------------------ */

/* A constraint on the generated text, compiled once and shared by any number of requests (and
 * engines on the same model, on any threads).  kind and spec:
 *   "regex"        spec: a regular expression the whole text fullmatches (JSON Schema / PCRE
 *                  syntax: src/constrain/regex.h says what is refused);
 *   "json_schema"  spec: a JSON Schema (src/constrain/schema.h: its keywords; anything else is
 *                  refused naming the keyword); the text is compact JSON valid under it;
 *   "json_object"  spec NULL: any JSON object;
 *   "choice"       spec: a JSON array of strings; the text is one of them.
 * len: bytes of spec.  any_whitespace 1: JSON may have whitespace between tokens (0: compact, as
 * xgrammar's default).  Needs the model directory's tokenizer.json (each id's bytes; loaded on
 * the first call).  A bad spec is SM_E_INVALID with one line naming it.  Token masks are made on
 * first use, one per automaton state, and kept with the constraint. */
sm_status sparkmono_constraint_create(sparkmono_model *m, const char *kind, const char *spec, size_t len, int any_whitespace,
                                      sparkmono_constraint **out);
/* One more reference (a cache that hands the constraint to many requests); each retain is
 * matched by a release.  NULL is ignored. */
void sparkmono_constraint_retain(sparkmono_constraint *c);
/* Drop a reference: the creator's, or a retain's (requests hold their own).  NULL is ignored. */
void sparkmono_constraint_release(sparkmono_constraint *c);

/* The version of the library: the one version string of the project (`sparkmono --version`,
 * the Python package's __version__ and its metadata read it). */
#define SPARKMONO_VERSION "0.2.0"
const char *sparkmono_version(void);
/* sizeof the public struct `name` ("sparkmono_sampling", "sparkmono_batch_event", ...: every
 * struct of this header), 0 for another name: a binding that mirrors the structs (the Python
 * package) checks its layout against the library it loaded. */
size_t sparkmono_struct_size(const char *name);

#ifdef __cplusplus
}
#endif
#endif
