/* engine.h: the engine's internals behind include/sparkmono.h (for the CLI, tests, benches).
 *
 * An engine owns one backend, one paged KV cache (sm_kv: block tables here, pages in the
 * backend) and up to max_req requests, each with its token history (prompt then generated
 * ids).  Positions 0 .. nhist-2 of a generating request have committed K/V; its last token is
 * the first row of its next verify step, followed by R-1 n-gram drafts.  We rejected keeping
 * the drafts' K/V bookkeeping separate from the committed length: rejected rows are simply
 * overwritten by the next step, as in docs/model.md section 8.  The rows of a sampled request,
 * or one with logit processors, also bring their logits back from the step (sm_step.logits_at),
 * packed into slog; the rows of a request with logprobs bring back their logprob summaries
 * (sm_step.lp_at: made where the logits are, on the GPU for the cuda backend), not the rows.
 */
#ifndef SM_ENGINE_H
#define SM_ENGINE_H
#include <pthread.h>
#include "sparkmono.h"
#include "base/lptrack.h"
#include "backend/backend.h"
#include "backend/kvcache.h"
#include "engine/logitproc.h"
#include "engine/sample.h"
#include "model/weights.h"
#include "parallel/shard.h"

typedef struct sm_request {
    int live;          /* slot in use */
    int prompt_len;    /* n */
    int max_tokens;    /* generation budget */
    int *hist;         /* [prompt_len + max_tokens] prompt, then generated ids */
    int nhist;         /* prompt_len + ngen */
    int prefilled;     /* prompt K/V committed */
    int done;          /* 0 running, 1 eos emitted, 2 max_tokens reached, SM_REQ_FAILED: it alone
                          failed in a verify step (err says why), the others went on */
    int steps;         /* verify steps taken */
    int accepted;      /* drafts accepted over all steps */
    int row0, nrows;   /* its rows in the engine's last step; nrows = 0 if absent */
    int sampled;       /* 1: tokens drawn under samp (temperature > 0); 0: greedy */
    int proc;          /* 1: samp has logit processors (logitproc.h) */
    int rows_back;     /* 1: its rows' logits come back (sampled or proc) */
    sm_lp_track glp;   /* [max_tokens] positions: each generated id's logprobs (samp.logprobs; k =
                          samp.top_logprobs), else empty (glp.lp NULL) */
    sm_lp_track plp;   /* [prompt_len] positions: each prompt id's (samp.prompt_logprobs; entry 0
                          NaN, rank 0, its ids -1), else empty */
    sparkmono_sampling samp; /* its sampling parameters and processors (all zero: plain greedy) */
    int lrow0;         /* sampled or proc: its first row in the last verify step's logits (slog) */
    int swapped;       /* 1: preempted (its K/V pages given back; verify steps pass it by) until
                          sm_engine_resume recomputes them */
    char err[1024];    /* done == SM_REQ_FAILED: the line */
    sparkmono_constraint *con; /* samp.constraint, retained; NULL: free text */
    int cpos;          /* con: its position after the generated ids (constrain.h) */
} sm_request;

struct sparkmono_model {
    sm_model m;        /* loaded checkpoint (views into the mapped files) */
    char *dir;         /* its directory (the tokenizer of constraints) */
    pthread_mutex_t vmu; /* guards the lazy load below */
    struct sm_vocab *vocab; /* each id's bytes and their trie, from the directory's tokenizer.json
                               on the first constraint (src/constrain/vocab.h) */
};

struct sparkmono_engine {
    sparkmono_model *model;
    const sm_config *cfg;  /* = &model->m.cfg */
    sm_backend be;         /* compute backend (owns the KV pages) */
    int have_be;           /* be was created */
    int devices[SM_MAX_WORLD]; /* cuda, world > 1: the device of each rank (engine option devices) */
    sm_kv kv;              /* block tables, free pages, committed lengths */
    int have_kv;
    int R;                 /* verify rows per request (1 = no speculation) */
    int max_req;           /* request slots */
    int max_len;           /* max model length */
    int chunk;             /* most prompt rows per prefill step */
    int max_rows;          /* most rows of one step = max(R * max_req, chunk) */
    int naux;              /* aux layers */
    int *aux_layers;       /* [naux] */
    sm_request *reqs;      /* [max_req] */
    int *tok, *pos, *rreq; /* [max_rows] step inputs: token, position, request slot */
    int *argmax;           /* [max_rows] step output */
    int *logits_at;        /* [max_rows] step input: row of slog each row's logits go to, -1 */
    int *lp_at;            /* [max_rows] step input: the row itself for the rows of a request with
                              logprobs, else -1 */
    sm_lp_sum *lpsum;      /* [max_rows] step output: their logprob summaries (by row) */
    int *lp_tok;           /* [max_rows] step input: the id whose logit a summary also carries (a
                              prompt row's next id, for prompt logprobs), -1 */
    const uint32_t **mrow; /* [max_rows] step input: each row's constraint mask, NULL (sm_step.mask) */
    uint32_t *mbuf;        /* [max_rows, ceil(V / 32)] the masks mrow points to (allocated with the
                              first constrained request) */
    float *slog;           /* [slog_rows, V] logits of the rows of sampled requests, or NULL */
    int slog_rows;         /* rows slog holds */
    sm_sample_ws sws;      /* the sampler's distribution of one row (allocated with the first
                              sampled request: have_sws) */
    int have_sws;
    sm_lp_ws lws;          /* the logit processors' scratch (allocated with the first request that
                              has processors: have_lws) */
    int have_lws;
    float *aux;            /* [naux, max_rows, H] step output, NULL when naux = 0 */
    int last_nrows;        /* rows of the last step (aux rows are strided by it) */
    int *draft;            /* [R] scratch for the drafter */
    long long computed;    /* prompt tokens prefilled (the rest came from the prefix cache) */
    /* Drafter seam: NULL = the n-gram drafter.  Called per request and step with its history
     * hist [nhist] (prompt then generated); writes ndraft tokens in [0, V) to out.  Tests set
     * it to feed known continuations; a learned drafter would plug in here. */
    void (*draft_fn)(void *arg, int req, const int *hist, int nhist, int ndraft, int *out);
    void *draft_arg;       /* passed to draft_fn */
};

#define SM_REQ_FAILED 3 /* sm_request.done: failed alone (= SM_BATCH_FAILED, its batch event's end) */
/* The line of a request that failed alone (done == SM_REQ_FAILED), else "". */
const char *sm_engine_req_err(const sparkmono_engine *g, int req);

/* Greedy acceptance of one request's verify rows (docs/model.md section 8): t [r] the rows' input
 * tokens (t[0] the last accepted token, t[1..r) drafts), a [r] the rows' argmax.  Accepts
 * draft j while t[j] == a[j-1]; writes the accepted drafts and then a[k] (k = drafts accepted)
 * to out [r]; returns k + 1.  (Sampled or processed requests: engine.c accept_rows, sample.h.) */
int sm_accept_greedy(const int *t, const int *a, int r, int *out);

/* The checks sparkmono_add_sampled makes of a request (sampling, prompt ids, lengths), without
 * adding it: the batch (batch.h) refuses a bad request when it is submitted, not when it would
 * join.  SM_OK, or the status with sparkmono_errmsg() set. */
sm_status sm_engine_check_request(const sparkmono_engine *g, const int *prompt, int n, int max_tokens,
                                  const sparkmono_sampling *smp);
/* Record msg as this thread's sparkmono_errmsg() line; returns s. */
sm_status sm_engine_fail(sm_status s, const char *msg);
/* Preemption when the KV pool runs short (the batch's, src/engine/batch.c), exact: a prefilled,
 * running request gives its pages back (sm_engine_preempt) and later recomputes the K/V of its
 * history but the last id (sm_engine_resume: prefill steps, cached prompt pages taken first),
 * then goes on as if never stopped (every backend's K/V are the same bits however rows are
 * batched, and its sampler draws are keyed by position).  sm_engine_pages_next: the pages req
 * holds (*held) and those it needs for its next verify step, or its resume when swapped. */
sm_status sm_engine_preempt(sparkmono_engine *g, int req);
sm_status sm_engine_resume(sparkmono_engine *g, int req);
int sm_engine_pages_next(const sparkmono_engine *g, int req, int *held);
/* Pages a reservation can take now: free, and cached ones no request holds. */
int sm_engine_pages_avail(const sparkmono_engine *g);

/* Constrained requests (src/engine/constrained.c).  sm_engine_con_rows: the masks of req's rows
 * staged at g->tok [row0, row0 + *rows) (its last id, then drafts) into g->mrow; the drafts
 * are cut at the first one the constraint forbids (*rows shrinks).  sm_engine_con_emit: advance
 * req's position over its ids t [n] just emitted.  SM_OK or a status with the line set. */
sm_status sm_engine_con_rows(sparkmono_engine *g, int req, int row0, int *rows);
sm_status sm_engine_con_reserve(sparkmono_engine *g);
sm_status sm_engine_con_emit(sparkmono_engine *g, int req, const int *t, int n);
void sm_engine_model_con_free(sparkmono_model *m);

#endif
