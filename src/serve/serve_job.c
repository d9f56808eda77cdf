/* serve_job.c: a completion request's choices, from the parsed body to the plain answer or the
 * SSE chunks (see serve_job.h).
 *
 * Each choice keeps its own ids, text decoder and stop-string state, so choices of one job
 * never wait for each other: a pump takes whatever every choice has, and the stream writes one
 * chunk a choice that has news.  We rejected one decoder for the job: stop strings and held
 * back UTF-8 bytes are a choice's own.
 */
#include "serve/serve_job.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The logprobs of c's ids from index i (NULL when the request asked for none), in *lp; from
 * index 0 with echo, the prompt's first (pre). */
static const sm_api_lp *choice_lp(const sm_job *j, sm_choice *c, int i, sm_api_lp *lp, sm_api_lp_pre *pre) {
    const sm_lp_track *g = &c->r->glp, *p = &c->r->plp;
    if (!g->lp) return NULL;
    *lp = (sm_api_lp){j->s->api.tok, g->lp + i, g->top_ids + (size_t)i * g->k, g->top_lp + (size_t)i * g->k, j->req.lp_k,
                      &c->lp_off, NULL, 0, g->k};
    if (i == 0 && p->lp && (c->nids > 0 || c->finish)) { /* they came with the first ids (or the end) */
        *pre = (sm_api_lp_pre){c->r->prompt, p->lp, p->rank, p->top_ids, p->top_lp};
        lp->pre = pre;
        lp->npre = c->r->n;
    }
    return lp;
}

/* Choice i of prompt p: its engine request (a copy of the prompt), decoder and echo text.  0,
 * or -1 when out of memory. */
static int choice_init(sm_job *j, sm_choice *c, int p, int i, unsigned long long serial, void (*notify)(void *)) {
    const sm_api_req *q = &j->req;
    sparkmono_sampling samp = q->samp;
    c->index = p * q->n + i;
    /* the seeding rule (serve_job.h): seed + i with a seed, else one of the server's own a choice */
    if (q->has_seed) samp.seed = q->samp.seed + (unsigned long long)i;
    else samp.seed = ((unsigned long long)j->s->created * 0x9E3779B97F4A7C15ull ^ serial) +
                     (unsigned long long)c->index * 0xD1B54A32D192ED03ull;
    int *prompt = malloc((size_t)q->plen[p] * sizeof(int));
    c->ids = malloc((size_t)(q->max_tokens > 0 ? q->max_tokens : 1) * sizeof(int)); /* max_tokens 0: echo alone */
    if (!prompt || !c->ids) {
        free(prompt);
        return -1;
    }
    memcpy(prompt, q->prompt[p], (size_t)q->plen[p] * sizeof(int));
    if (!(c->r = sm_sreq_new(prompt, q->plen[p], q->max_tokens, &samp))) {
        free(prompt);
        return -1;
    }
    c->r->serial = serial;
    c->r->notify = notify;
    c->r->notify_arg = j;
    c->dt.tok = j->s->api.tok;
    for (int k = 0; k < q->nstop; k++) c->dt.stop[k] = q->stop[k], c->dt.stop_len[k] = q->stop_len[k];
    c->dt.nstop = q->nstop;
    c->dt.include_stop = q->include_stop_str;
    c->dt.keep_special = q->keep_special;
    if (q->echo && j->s->api.tok) { /* echo: the prompt's text first (decoded from its ids, UTF-8 repaired) */
        char *pt = NULL;
        size_t pn = 0;
        sm_err te = {{0}};
        int bad = sm_tokenizer_decode(j->s->api.tok, q->prompt[p], q->plen[p], &pt, &pn, &te) ||
                  sm_utf8_sanitize(&c->text, pt, pn);
        free(pt);
        if (bad) return -1;
    }
    return 0;
}

sm_job *sm_job_new(sm_server *s, int chat, const char *body, size_t len, void (*notify)(void *), int *status,
                   char *param, sm_err *e) {
    sm_job *j = calloc(1, sizeof *j);
    *status = 500;
    param[0] = 0;
    if (!j) {
        sm_errf(e, "out of memory");
        return NULL;
    }
    j->s = s;
    j->t0 = sm_sched_now();
    j->chat = chat;
    j->fd = -1;
    __atomic_add_fetch(&s->jobs, 1, __ATOMIC_RELAXED);
    if (chat ? sm_chat_parse(&s->chat, body ? body : "", len, &s->api, &j->req, status, param, e)
             : sm_api_parse_completion(body ? body : "", len, &s->api, &j->req, status, param, e)) {
        sm_job_free(j);
        return NULL;
    }
    unsigned long long serial = __atomic_add_fetch(&s->serial, 1, __ATOMIC_RELAXED);
    snprintf(j->id, sizeof j->id, "%s-%lx%06llx", chat ? "chatcmpl" : "cmpl", (unsigned long)s->created, serial);
    if (j->req.ignored[0]) /* accepted as vLLM does; named once so a misspelt field is found */
        fprintf(stderr, "serve: %s: ignored unknown field%s %s\n", j->id, strchr(j->req.ignored, ',') ? "s" : "",
                j->req.ignored);
    for (int p = 0; p < j->req.nprompt; p++) j->prompt_tokens += j->req.plen[p];
    j->ch = calloc((size_t)j->req.nprompt * (size_t)j->req.n, sizeof *j->ch);
    int bad = !j->ch;
    for (int p = 0; !bad && p < j->req.nprompt; p++)
        for (int i = 0; !bad && i < j->req.n; i++, j->nch++) bad = choice_init(j, &j->ch[j->nch], p, i, serial, notify);
    if (bad) {
        *status = 500;
        param[0] = 0;
        sm_errf(e, "out of memory for %d choices", j->req.nprompt * j->req.n);
        snprintf(j->err, sizeof j->err, "out of memory");
        sm_job_free(j);
        return NULL;
    }
    return j;
}

int sm_job_submit(sm_job *j) {
    sm_sreq *r[SM_API_MAX_CHOICES];
    for (int i = 0; i < j->nch; i++) r[i] = j->ch[i].r;
    int rc = sm_sched_submit(&j->s->sched, r, j->nch);
    if (rc == SM_SCHED_FULL) {
        const sm_serve_opts *o = j->s->o;
        if (j->nch > 1)
            snprintf(j->err, sizeof j->err, "the server is busy: this request's %d choices do not all fit in its "
                     "free places now (%d request slots and a queue of %d); retry later", j->nch, o->max_requests,
                     o->queue);
        else
            snprintf(j->err, sizeof j->err, "the server is busy (%d requests running, %d queued); retry later",
                     o->max_requests, o->queue);
    } else if (rc) {
        snprintf(j->err, sizeof j->err, "the server is shutting down");
    }
    if (rc) j->err_status = 503;
    else j->submitted = 1;
    if (!rc) __atomic_add_fetch(&j->s->met.prompt_tokens, j->prompt_tokens, __ATOMIC_RELAXED);
    return rc;
}

/* Take c's news.  1 when c is over, 0 when it goes on; a failure sets j->err. */
static int choice_pump(sm_job *j, sm_choice *c) {
    sm_sched *sc = &j->s->sched;
    int done;
    int k = sm_sched_poll(sc, c->r, c->nids, c->ids + c->nids, j->req.max_tokens - c->nids, &done);
    if (k > 0 && !j->timed) {
        j->timed = 1;
        sm_hist_add(&j->s->met.ttft, sm_sched_now() - j->t0);
    }
    c->nids += k;
    if (k == 0 && done == SM_SREQ_RUNNING) return 0;
    sm_err e = {{0}};
    /* the eos or stop id that ended the choice (it came with the end) is not text, unless
     * include_stop_str_in_output (vLLM's rule) */
    const int ntext = c->nids - (done == SM_SREQ_EOS && c->nids > 0 && !j->req.include_stop_str);
    int st = sm_detok_push(&c->dt, c->ids, ntext, done != SM_SREQ_RUNNING, &c->text, &e);
    if (st < 0) {
        sm_sched_cancel(sc, c->r);
        snprintf(j->err, sizeof j->err, "%.255s", e.msg);
        j->err_status = 500;
    } else if (st == 1) { /* a stop string: the text ends before it, generation stops */
        sm_sched_cancel(sc, c->r);
        c->finish = "stop";
    } else if (done == SM_SREQ_EOS) {
        c->finish = "stop";
    } else if (done == SM_SREQ_LENGTH) {
        c->finish = "length";
    } else if (done != SM_SREQ_RUNNING) { /* failed in the engine, or cancelled by a shutdown */
        snprintf(j->err, sizeof j->err, "%s", c->r->err[0] ? c->r->err : "request failed");
        j->err_status = done == SM_SREQ_CANCELLED ? 503 : 500;
    }
    c->ended = c->finish || j->err[0];
    return c->ended;
}

int sm_job_pump(sm_job *j) {
    if (__atomic_load_n(&j->gone, __ATOMIC_ACQUIRE)) return -1;
    int over = 1;
    for (int i = 0; i < j->nch && !j->err[0]; i++)
        if (!j->ch[i].ended) over &= choice_pump(j, &j->ch[i]);
    if (!j->err[0]) return over;
    for (int i = 0; i < j->nch; i++) /* one choice failed: the job ends, the others stop */
        if (!j->ch[i].ended) {
            sm_sched_cancel(&j->s->sched, j->ch[i].r);
            j->ch[i].ended = 1;
        }
    return 1;
}

/* Append one SSE event "data: <json>\n\n" (json freed) to j->out. */
static int sse(sm_job *j, char *json) {
    int rc = !json || sm_buf_str(&j->out, "data: ") || sm_buf_str(&j->out, json) || sm_buf_str(&j->out, "\n\n");
    free(json);
    return rc ? -1 : 0;
}

/* Completion tokens of every choice. */
static int completion_tokens(const sm_job *j) {
    int n = 0;
    for (int i = 0; i < j->nch; i++) n += j->ch[i].nids;
    return n;
}

/* A chunk of choice c (json, freed) with its usage so far when continuous_usage_stats asks for
 * it (its prompt's tokens and its own ids, as vLLM counts a choice), as an SSE event. */
static int sse_chunk(sm_job *j, const sm_choice *c, int ngen, char *json) {
    if (json && j->req.continuous_usage)
        json = sm_api_add_key(json, "usage", sm_api_usage(j->req.plen[c->index / j->req.n], ngen));
    return sse(j, json);
}

int sm_job_stream(sm_job *j, int st) {
    const sm_server *s = j->s;
    int rc = 0;
    for (int i = 0; i < j->nch; i++) {
        sm_choice *c = &j->ch[i];
        sm_api_lp lp;
        sm_api_lp_pre pre;
        sm_api_choice a = {c->index, c->text.p, c->text.n, c->ids + c->sent_ids, c->nids - c->sent_ids, NULL, NULL, NULL};
        if (j->chat && !c->role_sent) { /* a chat choice opens with its role */
            sm_api_choice role = {c->index, "", 0, NULL, 0, NULL, NULL, NULL};
            c->role_sent = 1;
            rc |= sse_chunk(j, c, 0, sm_chat_chunk(j->id, s->created, s->api.name, "assistant", &role));
        }
        if (c->finish && !c->finish_sent) a.finish = c->finish;
        if (!c->text.n && !a.nids && !a.finish) continue;
        if (a.nids || (a.finish && !c->nids)) a.lp = choice_lp(j, c, c->sent_ids, &lp, &pre); /* ids, or the echo alone */
        /* a chat chunk carries text; ids the decoder holds back wait for it, unless logprobs are asked */
        if (j->chat && (c->text.n || a.finish || a.lp))
            rc |= sse_chunk(j, c, c->nids, sm_chat_chunk(j->id, s->created, s->api.name, NULL, &a));
        else if (!j->chat)
            rc |= sse_chunk(j, c, c->nids, sm_api_chunk(j->id, s->created, s->api.name, &a));
        c->text.n = 0;
        c->sent_ids = c->nids;
        c->finish_sent |= a.finish != NULL;
    }
    if (st == 1) {
        if (j->err[0]) rc |= sse(j, sm_api_error(j->err, sm_api_error_type((unsigned)j->err_status), NULL, NULL));
        if (j->req.include_usage)
            rc |= sse(j, (j->chat ? sm_chat_usage_chunk : sm_api_usage_chunk)(j->id, s->created, s->api.name,
                                                                               j->prompt_tokens, completion_tokens(j)));
        rc |= sm_buf_str(&j->out, "data: [DONE]\n\n");
        j->closed = 1;
    }
    return rc ? -1 : 0;
}

/* Choice c's prompt_logprobs (vLLM's shape; NULL when not asked or out of memory). */
static json_t *choice_plp(const sm_job *j, const sm_choice *c) {
    const sm_lp_track *p = &c->r->plp;
    if (j->req.prompt_lp_k < 0 || !p->lp) return NULL;
    const sm_api_lp_pre pre = {c->r->prompt, p->lp, p->rank, p->top_ids, p->top_lp};
    return sm_api_prompt_logprobs(j->s->api.tok, &pre, c->r->n, j->req.prompt_lp_k, p->k);
}

char *sm_job_answer(sm_job *j) {
    sm_api_choice *a = calloc((size_t)j->nch, sizeof *a);
    sm_api_lp *lp = calloc((size_t)j->nch, sizeof *lp);
    sm_api_lp_pre *pre = calloc((size_t)j->nch, sizeof *pre);
    char *out = NULL;
    if (a && lp && pre) {
        for (int i = 0; i < j->nch; i++) {
            sm_choice *c = &j->ch[i];
            a[i] = (sm_api_choice){c->index, c->text.p, c->text.n, c->ids, c->nids, c->finish,
                                   choice_lp(j, c, 0, &lp[i], &pre[i]), j->chat ? NULL : choice_plp(j, c)};
        }
        const sm_server *s = j->s;
        out = (j->chat ? sm_chat_completion : sm_api_completion)(j->id, s->created, s->api.name, a, j->nch,
                                                                  j->prompt_tokens, completion_tokens(j));
        /* chat: vLLM puts the one prompt's logprobs beside the choices */
        if (j->chat && j->req.prompt_lp_k >= 0 && j->nch) out = sm_api_add_key(out, "prompt_logprobs", choice_plp(j, &j->ch[0]));
    }
    for (int i = 0; a && i < j->nch; i++) json_decref(a[i].prompt_lp);
    free(a);
    free(lp);
    free(pre);
    return out;
}

void sm_job_free(sm_job *j) {
    if (!j) return;
    sm_server *s = j->s;
    int left = 0, stops = 0, lengths = 0;
    for (int i = 0; i < j->nch; i++) {
        sm_choice *c = &j->ch[i];
        if (!c->ended && j->submitted) { /* the client left first */
            sm_sched_cancel(&s->sched, c->r);
            left++;
        }
        stops += c->finish && !strcmp(c->finish, "stop");
        lengths += c->finish && !strcmp(c->finish, "length");
    }
    if (j->nch && !s->o->quiet) {
        char why[320];
        if (j->err[0]) snprintf(why, sizeof why, "%s", j->err);
        else if (left) snprintf(why, sizeof why, "client disconnected");
        else if (j->nch == 1) snprintf(why, sizeof why, "%s", j->ch[0].finish ? j->ch[0].finish : "ended");
        else snprintf(why, sizeof why, "%d choices: %d stop, %d length", j->nch, stops, lengths);
        fprintf(stderr, "serve: %s: prompt %d tokens, %d generated, %s\n", j->id, j->prompt_tokens,
                completion_tokens(j), why);
    }
    for (int i = 0; i < j->nch; i++) {
        sm_choice *c = &j->ch[i];
        sm_sreq_release(&s->sched, c->r); /* no notify after this */
        sm_detok_free(&c->dt);
        sm_buf_free(&c->text);
        free(c->ids);
    }
    free(j->ch);
    sm_api_req_free(&j->req);
    sm_buf_free(&j->out);
    __atomic_sub_fetch(&s->jobs, 1, __ATOMIC_RELAXED);
    free(j);
}
