/* serve_job.h: one completion request on its way to its client (a "job"): its choices, each an
 * engine request (sm_sreq) with the ids received so far, their text and its end; the plain
 * answer and the SSE chunks built from them.
 *
 * A request of nprompt prompts and n choices a prompt is nprompt * n engine requests, choice
 * index = prompt index * n + i (OpenAI's order), submitted all or none (sm_sched_submit).
 * Seeds: choice i of a prompt draws with seed + i when the request gives a seed (so a seeded
 * request with n is reproducible, its choice 0 is the same request with n = 1, and each prompt
 * of a list draws as it would alone), else with a seed of its own from the server.  Greedy
 * choices are all equal (vLLM's behaviour).  A choice that ends (eos, length, a stop string)
 * ends alone; one that fails (the engine, a shutdown) ends the job: the others are cancelled
 * and the client gets the error.  A client that goes away cancels every choice (sm_job_free).
 * The stream interleaves the choices' chunks as their ids come, each with its index and its
 * own finish chunk, and sends [DONE] once after every choice ended.  We rejected one HTTP job a
 * choice joined by a parent: the parent would own the connection, the parking and the answer,
 * which is all a job is.
 *
 * Threads: a job belongs to its connection's libmicrohttpd callbacks; the engine thread only
 * calls the notify callback given to sm_job_new (serve_http.c parks and resumes the connection).
 */
#ifndef SM_SERVE_JOB_H
#define SM_SERVE_JOB_H
#include "serve/serve_http.h"

/* One choice: an engine request and what has come of it. */
typedef struct sm_choice {
    sm_sreq *r;                /* the scheduler's request (one reference held here) */
    int index;                 /* choices[].index: prompt index * n + i */
    int *ids;                  /* [max_tokens] ids received */
    int nids;                  /* ids received */
    int sent_ids;              /* stream: ids already put in a chunk */
    size_t lp_off;             /* completions logprobs: text_offset of the next id */
    sm_detok dt;               /* ids -> text (stop strings: the request's) */
    sm_buf text;              /* text not yet put in a chunk (all of it for a plain answer) */
    const char *finish;        /* "stop" / "length" once it ended normally */
    int ended;                 /* finish set, or the job ended it */
    int role_sent;             /* chat stream: its first chunk (role "assistant") written */
    int finish_sent;           /* stream: its chunk with finish_reason written */
} sm_choice;

typedef struct sm_job {
    sm_server *s;
    sm_api_req req;            /* the parsed request: stop strings, n, stream flags (prompts copied to the choices) */
    sm_choice *ch;             /* [nch] in index order */
    int nch;                   /* req.nprompt * req.n */
    int prompt_tokens;         /* usage: every prompt's tokens once */
    double t0;                 /* monotonic seconds: the body was read whole (time to first token) */
    int timed;                 /* the first id of any choice was timed */
    char id[48];               /* "cmpl-..." / "chatcmpl-..." */
    int chat;                  /* a chat completion: chat-shaped answers */
    char err[256];             /* the reason once a choice failed or was cancelled by a shutdown */
    int err_status;            /* HTTP status of that reason (500 or 503) */
    int submitted;             /* its choices are in the scheduler */
    sm_buf out;               /* stream bytes not yet handed to libmicrohttpd */
    size_t off;                /* of out, already handed */
    int closed;                /* stream: [DONE] written */
    /* the connection (serve_http.c); parking fields under s->mu */
    struct MHD_Connection *mc; /* suspended while the job is parked */
    int fd;                    /* the client's socket, polled for a hang-up while parked */
    int news;                  /* a choice changed since the job last parked */
    int parked;                /* in s->parked, its connection suspended */
    int gone;                  /* the client hung up while parked (read atomically) */
    struct sm_job *pprev, *pnext; /* s->parked */
} sm_job;

/* A job for a /v1/completions (chat 0) or /v1/chat/completions body [len]: parsed, its choices
 * made (not yet submitted), each calling notify(job) on news.  NULL with *status (400, 404, or
 * 500 when out of memory), param and e. */
sm_job *sm_job_new(sm_server *s, int chat, const char *body, size_t len, void (*notify)(void *), int *status,
                   char *param, sm_err *e);
/* Submit every choice, all or none: 0, SM_SCHED_FULL or SM_SCHED_CLOSED (then j->err and
 * j->err_status say so for the answer and the log). */
int sm_job_submit(sm_job *j);
/* Take every choice's news without waiting.  1 when the job is over (every choice ended, or
 * j->err set), 0 when it goes on, -1 when the client hung up. */
int sm_job_pump(sm_job *j);
/* Append to j->out the SSE events of what sm_job_pump brought (st its result): a chat choice's
 * role chunk first, each choice's new text / ids / finish, and once over the error, the usage
 * and [DONE] (j->closed).  0, or -1 when out of memory. */
int sm_job_stream(sm_job *j, int st);
/* The plain answer once the job is over without error (NULL when out of memory). */
char *sm_job_answer(sm_job *j);
/* Cancel what still runs, log the job's line, free it. */
void sm_job_free(sm_job *j);

#endif
