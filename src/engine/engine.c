/* engine.c: the engine of include/sparkmono.h: requests, prefill, verify steps with n-gram
 * drafts and greedy or sampled acceptance, KV bookkeeping, generation loop.
 *
 * Every step is built as flat row arrays (token, position, request slot) and handed to the
 * backend's single step function; a request's rows are consecutive.  The engine reserves
 * cache pages for every row before the step and, after it, commits len = positions whose
 * K/V hold accepted tokens.  Errors go to a thread-local sm_err read by sparkmono_errmsg().
 * We rejected a per-handle error buffer: sparkmono_model_open fails before any handle exists.
 * A row whose argmax is -1 (backend.h: a NaN or Inf among its logits, from the weights or an
 * overflowing activation) fails the step with a line naming the step, request and row, before
 * anything is emitted or committed; logits handed to the caller are scanned too, so no backend
 * can return a NaN row silently.  We rejected a scan of the weights at load (sm_check_finite
 * does it for `sparkmono check`): it would read a 400 GB checkpoint before the first token.
 * Sampled requests (sample.h) take the same steps; the step also returns the logits of their
 * rows only (sm_step.logits_at), so greedy requests cost no logits traffic and keep their
 * argmax path bit for bit.  The token at position i of a sampled request is drawn with the
 * uniform of (seed, i), whatever step (prefill, verify row, bonus) produces it.  Requests with
 * logit processors or logprobs (logitproc.h) bring their rows' logits back too; token_at makes
 * every such token, each row processed with the history before its position (the accepted
 * drafts included), so speculation stays exact for them as well.
 */
#include "engine/engine.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "cpu/ops.h"
#include "model/rng.h"
#include "constrain/constrain.h"
#include "engine/drafter.h"
#include "parallel/shard.h"

#define ENG_MAX_ROWS 256          /* most rows per request in a verify step (a backend may take fewer) */
#define ENG_DEFAULT_ROWS 8
#define ENG_DEFAULT_MAX_LEN 4096
#define ENG_DEFAULT_CHUNK 512

static _Thread_local sm_err g_err;

const char *sparkmono_errmsg(void) { return g_err.msg; }

const char *sparkmono_version(void) { return SPARKMONO_VERSION; }

size_t sparkmono_struct_size(const char *name) {
    static const struct { const char *name; size_t size; } tab[] = {
        {"sparkmono_model_opts", sizeof(sparkmono_model_opts)}, {"sparkmono_model_info", sizeof(sparkmono_model_info)},
        {"sparkmono_engine_opts", sizeof(sparkmono_engine_opts)}, {"sparkmono_bias", sizeof(sparkmono_bias)},
        {"sparkmono_sampling", sizeof(sparkmono_sampling)}, {"sparkmono_request_info", sizeof(sparkmono_request_info)},
        {"sparkmono_batch_event", sizeof(sparkmono_batch_event)},
        {"sparkmono_cache_stats", sizeof(sparkmono_cache_stats)},
    };
    for (size_t i = 0; name && i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(name, tab[i].name)) return tab[i].size;
    return 0;
}

const char *sparkmono_status_str(sm_status s) {
    switch (s) {
    case SM_OK: return "ok";
    case SM_E_INVALID: return "invalid argument";
    case SM_E_MODEL: return "model error";
    case SM_E_CACHE: return "cache exhausted";
    case SM_E_BACKEND: return "backend error";
    case SM_E_NOMEM: return "out of memory";
    case SM_E_STATE: return "invalid state";
    case SM_E_IO: return "i/o error";
    }
    return "unknown status";
}

/* Record a one-line message and return status s. */
static sm_status __attribute__((format(printf, 2, 3))) fail(sm_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err.msg, sizeof g_err.msg, fmt, ap);
    va_end(ap);
    return s;
}

/* Take over a message an internal call left in e. */
static sm_status fail_err(sm_status s, const sm_err *e) {
    memcpy(g_err.msg, e->msg, sizeof g_err.msg);
    if (!g_err.msg[0]) snprintf(g_err.msg, sizeof g_err.msg, "%s (no detail)", sparkmono_status_str(s));
    return s;
}

static sm_status ok(void) {
    g_err.msg[0] = 0;
    return SM_OK;
}

int sm_accept_greedy(const int *t, const int *a, int r, int *out) {
    int k = 0;
    /* accept draft k+1 while it equals the argmax of row k */
    while (k + 1 < r && t[k + 1] == a[k]) {
        out[k] = t[k + 1];
        k++;
    }
    /* then the argmax at the first mismatch (or the bonus token of the last row) */
    out[k] = a[k];
    return k + 1;
}

/* ---- model ------------------------------------------------------------------------------ */

sm_status sparkmono_model_open(const char *dir, const sparkmono_model_opts *o, sparkmono_model **out) {
    if (!out) return fail(SM_E_INVALID, "sparkmono_model_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return fail(SM_E_INVALID, "sparkmono_model_open: model dir is empty");
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fail(SM_E_MODEL, "model dir '%s' does not exist or is not a directory", dir);
    sparkmono_model *m = calloc(1, sizeof *m);
    if (!m) return fail(SM_E_NOMEM, "sparkmono_model_open: out of memory");
    sm_load_opts lo = {0};
    lo.online_mxfp4 = o ? o->online_mxfp4 : 0;
    if (o && sm_acts_parse(o->activations, &lo.activations)) {
        free(m);
        return fail(SM_E_INVALID, "sparkmono_model_open: activations '%.40s' is not one of auto, mxfp4, bf16", o->activations);
    }
    sm_err e = {{0}};
    if (!(m->dir = strdup(dir))) {
        free(m);
        return fail(SM_E_NOMEM, "sparkmono_model_open: out of memory");
    }
    if (sm_model_load(dir, &lo, &m->m, &e) != 0) {
        free(m->dir);
        free(m);
        return fail_err(SM_E_MODEL, &e);
    }
    pthread_mutex_init(&m->vmu, NULL);
    *out = m;
    return ok();
}

void sparkmono_model_close(sparkmono_model *m) {
    if (!m) return;
    sm_engine_model_con_free(m);
    pthread_mutex_destroy(&m->vmu);
    sm_model_free(&m->m);
    free(m->dir);
    free(m);
}

sm_status sparkmono_model_get_info(const sparkmono_model *m, sparkmono_model_info *out) {
    if (!m || !out) return fail(SM_E_INVALID, "sparkmono_model_get_info: NULL argument");
    const sm_config *c = &m->m.cfg;
    memset(out, 0, sizeof *out);
    out->num_layers = c->L;
    out->hidden_size = c->H;
    out->vocab_size = c->V;
    out->vocab_used = c->vocab_used;
    out->bos = c->bos;
    out->n_eos = c->n_eos < 8 ? c->n_eos : 8;
    for (int i = 0; i < out->n_eos; i++) out->eos[i] = c->eos[i];
    return ok();
}

/* ---- engine ----------------------------------------------------------------------------- */

/* Field f of the options: its value, or dflt when zero; negative is an error. */
static sm_status opt_int(const char *name, int v, int dflt, int lo, int hi, int *out) {
    if (v == 0) v = dflt;
    if (v < lo || v > hi) return fail(SM_E_INVALID, "engine option %s = %d is not in [%d, %d]", name, v, lo, hi);
    *out = v;
    return SM_OK;
}

sm_status sparkmono_engine_create(sparkmono_model *m, const sparkmono_engine_opts *o, sparkmono_engine **out) {
    if (!out) return fail(SM_E_INVALID, "sparkmono_engine_create: out is NULL");
    *out = NULL;
    if (!m) return fail(SM_E_INVALID, "sparkmono_engine_create: model is NULL");
    sparkmono_engine_opts d = {0};
    if (!o) o = &d;
    const sm_config *c = &m->m.cfg;
    const char *bname = o->backend ? o->backend : "cpu";
    if (strcmp(bname, "cpu") != 0 && strcmp(bname, "cuda") != 0)
        return fail(SM_E_INVALID, "engine option backend '%s' is not 'cpu' or 'cuda'", bname);
    if (o->moe_tp != 0 && o->moe_tp != 1) return fail(SM_E_INVALID, "engine option moe_tp = %d is not 0 (ep) or 1 (tp)", o->moe_tp);
    { /* world (0: one rank) is validated here, once, by shard.h's validator; the layers below assert it */
        sm_err se = {{0}};
        if (sm_shard_check(&m->m, o->world ? o->world : 1, sm_moe_layout_of(o->moe_tp), &se))
            return fail_err(SM_E_INVALID, (sm_errprefix(&se, "engine option"), &se));
    }
    if (o->threads < 0) return fail(SM_E_INVALID, "engine option threads = %d is negative", o->threads);
    if (o->naux < 0 || o->naux > c->L + 1) return fail(SM_E_INVALID, "engine option naux = %d is not in [0, %d]", o->naux, c->L + 1);
    if (o->naux > 0 && !o->aux_layers) return fail(SM_E_INVALID, "engine option aux_layers is NULL with naux = %d", o->naux);
    for (int i = 0; i < o->naux; i++)
        if (o->aux_layers[i] < 0 || o->aux_layers[i] > c->L) /* L: the stream after the last layer */
            return fail(SM_E_INVALID, "engine option aux_layers[%d] = %d is not in [0, %d]", i, o->aux_layers[i], c->L);

    int R = 0, max_req = 0, max_len = 0, chunk = 0, nblocks = 0;
    sm_status s;
    if ((s = opt_int("request_rows", o->request_rows, ENG_DEFAULT_ROWS, 1, ENG_MAX_ROWS, &R))) return s;
    if ((s = opt_int("max_requests", o->max_requests, 1, 1, 65536, &max_req))) return s;
    if ((s = opt_int("max_len", o->max_len, ENG_DEFAULT_MAX_LEN, 1, 1 << 24, &max_len))) return s;
    if ((s = opt_int("prefill_chunk", o->prefill_chunk, ENG_DEFAULT_CHUNK, 1, 1 << 20, &chunk))) return s;
    int64_t need = (int64_t)max_req * ((max_len + SM_KV_BLOCK - 1) / SM_KV_BLOCK);
    if (o->kv_blocks == 0 && need > (1 << 30)) return fail(SM_E_INVALID, "engine options max_requests x max_len need %lld KV blocks, too many", (long long)need);
    if ((s = opt_int("kv_blocks", o->kv_blocks, (int)need, 1, 1 << 30, &nblocks))) return s;
    /* gpu_memory_utilization: the pool sized by the cuda backend after the weights (the engine's
     * pool made first with one request's pages, for its shape, then remade at the backend's size) */
    const float util = o->gpu_memory_utilization;
    if (util != 0) {
        if (!(util > 0 && util <= 1))
            return fail(SM_E_INVALID, "engine option gpu_memory_utilization %g is not in (0, 1]", (double)util);
        if (strcmp(bname, "cuda") != 0)
            return fail(SM_E_INVALID, "engine option gpu_memory_utilization sizes the KV pool of the cuda backend (backend '%s')",
                        bname);
        if (o->kv_blocks)
            return fail(SM_E_INVALID, "engine options kv_blocks and gpu_memory_utilization both size the KV pool: give one");
        nblocks = (max_len + SM_KV_BLOCK - 1) / SM_KV_BLOCK;
    }

    sparkmono_engine *g = calloc(1, sizeof *g);
    if (!g) return fail(SM_E_NOMEM, "sparkmono_engine_create: out of memory");
    g->model = m;
    g->cfg = c;
    g->R = R;
    g->max_req = max_req;
    g->max_len = max_len;
    g->chunk = chunk;
    g->max_rows = R * max_req > chunk ? R * max_req : chunk;
    g->naux = o->naux;
    size_t rows = (size_t)g->max_rows;
    g->reqs = calloc((size_t)max_req, sizeof *g->reqs);
    g->tok = malloc(rows * sizeof(int));
    g->pos = malloc(rows * sizeof(int));
    g->rreq = malloc(rows * sizeof(int));
    g->argmax = malloc(rows * sizeof(int));
    g->logits_at = malloc(rows * sizeof(int));
    g->lp_at = malloc(rows * sizeof(int));
    g->lp_tok = malloc(rows * sizeof(int));
    g->lpsum = malloc(rows * sizeof(sm_lp_sum));
    g->mrow = calloc(rows, sizeof *g->mrow);
    g->draft = malloc((size_t)R * sizeof(int));
    g->aux_layers = malloc((size_t)(o->naux ? o->naux : 1) * sizeof(int));
    if (o->naux) g->aux = malloc((size_t)o->naux * rows * (size_t)c->H * sizeof(float));
    if (!g->reqs || !g->tok || !g->pos || !g->rreq || !g->argmax || !g->logits_at || !g->lp_at || !g->lp_tok || !g->lpsum || !g->mrow || !g->draft || !g->aux_layers ||
        (o->naux && !g->aux)) {
        sparkmono_engine_destroy(g);
        return fail(SM_E_NOMEM, "sparkmono_engine_create: out of memory for %zu step rows", rows);
    }
    for (int i = 0; i < o->naux; i++) g->aux_layers[i] = o->aux_layers[i];

    sm_err e = {{0}};
    if (sm_kv_init(&g->kv, nblocks, max_req, max_len, 0, &e) != 0) {
        sparkmono_engine_destroy(g);
        return fail_err(SM_E_CACHE, &e);
    }
    g->have_kv = 1;
    sm_backend_opts bo = {0};
    bo.nthreads = o->threads;
    bo.world = o->world > 1 ? o->world : 1;
    bo.moe_tp = o->moe_tp;
    bo.max_rows = g->max_rows;
    bo.verify_rows = R;      /* a backend that captures fewer rows a request refuses here */
    bo.kv_mem_util = util;
    if (!o->mono || !strcmp(o->mono, "off")) bo.mono = SM_MONO_OFF; /* the default: measured slower (bench/results.md) */
    else if (!strcmp(o->mono, "auto")) bo.mono = SM_MONO_AUTO;
    else if (!strcmp(o->mono, "on")) bo.mono = SM_MONO_ON;
    else {
        sparkmono_engine_destroy(g);
        return fail(SM_E_INVALID, "sparkmono_engine_create: mono '%s' is not one of auto, on, off", o->mono);
    }
    /* the ranks' devices and exchanges (cuda, world > 1) */
    if ((o->devices || o->comm) && (strcmp(bname, "cuda") != 0 || bo.world < 2)) {
        sparkmono_engine_destroy(g);
        return fail(SM_E_INVALID, "sparkmono_engine_create: devices / comm go with backend 'cuda' and world > 1");
    }
    if (o->comm && strcmp(o->comm, "peer") && strcmp(o->comm, "nccl")) {
        sparkmono_engine_destroy(g);
        return fail(SM_E_INVALID, "sparkmono_engine_create: comm '%s' is not one of peer, nccl", o->comm);
    }
    bo.comm = o->comm && !strcmp(o->comm, "nccl") ? SM_COMM_NCCL : SM_COMM_PEER;
    if (o->devices) {
        sm_err de = {{0}};
        if (sm_devices_parse(o->devices, bo.world, g->devices, &de)) {
            sparkmono_engine_destroy(g);
            sm_errprefix(&de, "engine option");
            return fail_err(SM_E_INVALID, &de);
        }
        bo.devices = g->devices;
    }
    if (bo.mono == SM_MONO_ON && strcmp(bname, "cuda") != 0) {
        sparkmono_engine_destroy(g);
        return fail(SM_E_INVALID, "sparkmono_engine_create: mono 'on' needs the cuda backend (backend '%s')", bname);
    }
    int rc;
    if (strcmp(bname, "cpu") == 0) {
        /* world > 1: W rank threads on per-rank shards (src/cpu/world.c) */
        rc = bo.world > 1 ? sm_world_backend_create(&m->m, &g->kv, &bo, &g->be, &e)
                          : sm_cpu_backend_create(&m->m, &g->kv, &bo, &g->be, &e);
    } else {
#ifdef SM_HAVE_CUDA
        rc = sm_cuda_backend_create(&m->m, &g->kv, &bo, &g->be, &e);
#else
        sparkmono_engine_destroy(g);
        return fail(SM_E_BACKEND, "backend 'cuda' is not built in (no nvcc at build time)");
#endif
    }
    if (rc != 0) {
        sparkmono_engine_destroy(g);
        return fail_err(SM_E_BACKEND, &e);
    }
    g->have_be = 1;
    if (g->be.kv_pages > 0 && g->be.kv_pages != g->kv.nblocks) { /* the pool the backend sized from memory */
        sm_kv_free(&g->kv);
        g->have_kv = 0;
        if (sm_kv_init(&g->kv, g->be.kv_pages, max_req, max_len, 0, &e) != 0) {
            sparkmono_engine_destroy(g);
            return fail_err(SM_E_CACHE, &e);
        }
        g->have_kv = 1;
    }
    /* the prefix cache: keyed also by what K/V depend on besides tokens (docs/model.md: the
     * config, the experts' numerics, the backend and its ranks) */
    if (!o->no_prefix_cache) {
        uint64_t key = sm_rng_key(0x5052454649584B56ull, bname); /* "PREFIXKV" */
        const int dims[] = {c->L, c->H, c->Hm, c->I, c->E, c->K, c->nH, c->nKV, c->D, c->V, c->window};
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) key = sm_mix64(key ^ (uint64_t)(uint32_t)dims[i]);
        for (int l = 0; l < c->L; l++)
            key = sm_mix64(key ^ ((uint64_t)m->m.layers[l].ex.fmt << 8) ^ (uint64_t)m->m.layers[l].ex.act_mx);
        key = sm_mix64(key ^ ((uint64_t)bo.world << 16) ^ (uint64_t)bo.moe_tp);
        sm_kv_prefix_enable(&g->kv, 1, key);
    }
    *out = g;
    return ok();
}

/* Free what request r owns and zero it (a free slot). */
/* r failed alone: it ends SM_REQ_FAILED with this thread's last line, out of the step's rows. */
static void req_failed(sm_request *r) {
    snprintf(r->err, sizeof r->err, "%s", sparkmono_errmsg());
    r->done = SM_REQ_FAILED;
    r->nrows = 0;
}

static void req_free(sm_request *r) {
    sm_con_release(r->con);
    free(r->hist);
    sm_lp_track_free(&r->glp);
    sm_lp_track_free(&r->plp);
    memset(r, 0, sizeof *r);
}

void sparkmono_engine_destroy(sparkmono_engine *g) {
    if (!g) return;
    if (g->have_be && g->be.destroy) g->be.destroy(g->be.ctx);
    for (int i = 0; g->reqs && i < g->max_req; i++) req_free(&g->reqs[i]);
    if (g->have_kv) sm_kv_free(&g->kv);
    free(g->reqs);
    free(g->tok);
    free(g->pos);
    free(g->rreq);
    free(g->argmax);
    free(g->logits_at);
    free(g->lp_at);
    free(g->lp_tok);
    free(g->lpsum);
    free(g->mrow);
    free(g->mbuf);
    free(g->slog);
    if (g->have_sws) sm_sample_ws_free(&g->sws);
    if (g->have_lws) sm_lp_ws_free(&g->lws);
    free(g->draft);
    free(g->aux_layers);
    free(g->aux);
    free(g);
}

/* ---- requests --------------------------------------------------------------------------- */

/* The live request with id req, or NULL after recording an error. */
static sm_request *get_req(const sparkmono_engine *g, int req, const char *fn, sm_status *s) {
    if (!g) { *s = fail(SM_E_INVALID, "%s: engine is NULL", fn); return NULL; }
    if (req < 0 || req >= g->max_req || !g->reqs[req].live) {
        *s = fail(SM_E_INVALID, "%s: request id %d is not a live request", fn, req);
        return NULL;
    }
    return &g->reqs[req];
}

/* Append emitted tokens to r and update done; returns how many were kept (cut after eos or a
 * stop id, logitproc.h: sm_lp_stops). */
static int emit(const sm_config *c, sm_request *r, const int *t, int n) {
    int kept = 0;
    for (int i = 0; i < n && !r->done; i++) {
        r->hist[r->nhist++] = t[i];
        kept++;
        if (sm_lp_stops(&r->samp, c->eos, c->n_eos, t[i])) r->done = 1;
        else if (r->nhist - r->prompt_len >= r->max_tokens) r->done = 2;
    }
    return kept;
}

sm_status sparkmono_add(sparkmono_engine *g, const int *prompt, int n, int max_tokens, int *req) {
    return sparkmono_add_sampled(g, prompt, n, max_tokens, NULL, req);
}

sm_status sm_engine_check_request(const sparkmono_engine *g, const int *prompt, int n, int max_tokens,
                                  const sparkmono_sampling *smp) {
    sm_err e = {{0}};
    if (smp && (sm_sample_check(smp, &e) || sm_lp_check(smp, g->cfg->V, &e)))
        return fail(SM_E_INVALID, "sparkmono_add_sampled: %s", e.msg);
    if (smp && smp->constraint && smp->constraint->v != g->model->vocab)
        return fail(SM_E_INVALID, "sparkmono_add_sampled: the constraint was made for another model");
    if (n <= 0 || !prompt) return fail(SM_E_INVALID, "sparkmono_add: prompt is empty");
    if (max_tokens < 0) return fail(SM_E_INVALID, "sparkmono_add: max tokens %d is negative", max_tokens);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= g->cfg->V)
            return fail(SM_E_INVALID, "sparkmono_add: prompt id %d at index %d is out of range [0, %d)", prompt[i], i, g->cfg->V);
    if ((int64_t)n + max_tokens > g->max_len)
        return fail(SM_E_INVALID, "sparkmono_add: prompt length %d + max tokens %d exceeds the max model length %d",
                    n, max_tokens, g->max_len);
    return ok();
}

sm_status sm_engine_fail(sm_status s, const char *msg) { return fail(s, "%s", msg); }

sm_status sparkmono_add_sampled(sparkmono_engine *g, const int *prompt, int n, int max_tokens, const sparkmono_sampling *smp,
                                int *req) {
    if (!g || !req) return fail(SM_E_INVALID, "sparkmono_add: NULL argument");
    *req = -1;
    sm_err e = {{0}};
    sm_status cs = sm_engine_check_request(g, prompt, n, max_tokens, smp);
    if (cs != SM_OK) return cs;
    const int sampled = smp && smp->temperature > 0;
    if (sampled && !g->have_sws) { /* the sampler's row buffers, once per engine */
        if (sm_sample_ws_init(&g->sws, g->cfg->V, &e)) return fail_err(SM_E_NOMEM, &e);
        g->have_sws = 1;
    }
    if (smp && smp->constraint && (cs = sm_engine_con_reserve(g)) != SM_OK) return cs;
    const int proc = smp && sm_lp_active(smp), want_lp = smp && smp->logprobs;
    if (proc && !g->have_lws) { /* the processors' scratch, once per engine */
        if (sm_lp_ws_init(&g->lws, g->cfg->V, &e)) return fail_err(SM_E_NOMEM, &e);
        g->have_lws = 1;
    }
    int *hist = malloc(((size_t)n + (size_t)max_tokens) * sizeof(int));
    sm_lp_track glp = {0}, plp = {0};
    const int want_plp = smp && smp->prompt_logprobs;
    if (!hist || (want_lp && sm_lp_track_alloc(&glp, (size_t)max_tokens, smp->top_logprobs)) ||
        (want_plp && sm_lp_track_alloc(&plp, (size_t)n, smp->top_logprobs))) {
        free(hist), sm_lp_track_free(&glp), sm_lp_track_free(&plp);
        return fail(SM_E_NOMEM, "sparkmono_add: out of memory for %d tokens", n + max_tokens);
    }
    int slot;
    if (sm_kv_add(&g->kv, &slot, &e) != 0) {
        free(hist), sm_lp_track_free(&glp), sm_lp_track_free(&plp);
        return fail_err(SM_E_CACHE, &e);
    }
    sm_request *r = &g->reqs[slot];
    memset(r, 0, sizeof *r);
    r->live = 1;
    r->prompt_len = n;
    r->max_tokens = max_tokens;
    r->hist = hist;
    memcpy(hist, prompt, (size_t)n * sizeof(int));
    r->nhist = n;
    r->sampled = sampled;
    r->proc = proc;
    r->rows_back = sampled || proc;
    r->glp = glp;
    r->plp = plp;
    if (want_plp) { /* the first prompt id has no distribution */
        r->plp.lp[0] = NAN;
        r->plp.rank[0] = 0;
        for (int i = 0; i < plp.k; i++) r->plp.top_ids[i] = -1, r->plp.top_lp[i] = NAN;
    }
    if (smp) r->samp = *smp; /* else all zero: greedy, eos ends it */
    if (smp && smp->constraint) {
        r->con = smp->constraint;
        sm_con_retain(r->con);
        r->cpos = sm_con_start(r->con);
    }
    *req = slot;
    return ok();
}

sm_status sparkmono_remove(sparkmono_engine *g, int req) {
    sm_status s;
    sm_request *r = get_req(g, req, "sparkmono_remove", &s);
    if (!r) return s;
    sm_kv_release(&g->kv, req);
    req_free(r);
    return ok();
}

/* Run the rows staged in g->tok/pos/rreq [0, nrows) as one backend step; logits (NULL: none)
 * gets every row, or with logits_at (NULL: every row) the rows it maps; lp_k > 0: the rows
 * g->lp_at names get their summaries in g->lpsum, with lp_k top ids; masked: g->mrow holds
 * each row's constraint mask (NULL for a free row). */
static sm_status run_step(sparkmono_engine *g, int nrows, float *logits, const int *logits_at, int lp_k, int masked) {
    sm_step st = {0};
    st.nrows = nrows;
    st.tokens = g->tok;
    st.pos = g->pos;
    st.req = g->rreq;
    st.kv = &g->kv;
    st.logits = logits;
    st.logits_at = logits_at;
    st.lp_at = lp_k > 0 ? g->lp_at : NULL;
    st.lp_k = lp_k;
    st.lp_tok = lp_k > 0 ? g->lp_tok : NULL;
    st.lp = lp_k > 0 ? g->lpsum : NULL;
    st.argmax = g->argmax;
    st.mask = masked ? g->mrow : NULL;
    st.naux = g->naux;
    st.aux_layers = g->naux ? g->aux_layers : NULL;
    st.aux = g->aux;
    g->last_nrows = nrows;
    sm_err e = {{0}};
    if (g->be.step(g->be.ctx, &st, &e) != 0) {
        /* aux rows of a failed step are not valid */
        for (int i = 0; i < g->max_req; i++) g->reqs[i].nrows = 0;
        return fail_err(SM_E_BACKEND, &e);
    }
    return SM_OK;
}

/* The error of a non-finite row: what ("prefill" / "verify") step of request req, row of it. */
static sm_status nonfinite(const char *what, int step, int req, int row) {
    return fail(SM_E_MODEL, "%s step %d, request %d, row %d: non-finite logits (NaN or Inf in the weights or "
                "activations; run `sparkmono check`)", what, step, req, row);
}

/* Room for rows [rows, V] in g->slog. */
static sm_status slog_reserve(sparkmono_engine *g, int rows) {
    if (rows <= g->slog_rows) return SM_OK;
    float *p = realloc(g->slog, (size_t)rows * (size_t)g->cfg->V * sizeof(float));
    if (!p) return fail(SM_E_NOMEM, "engine: out of memory for the logits of %d sampled rows", rows);
    g->slog = p;
    g->slog_rows = rows;
    return SM_OK;
}

_Static_assert(SM_LP_MAX_TOP == SPARKMONO_MAX_TOP_LOGPROBS, "a step's summary holds every top id a request may ask");

/* The top ids a request's rows ask of the step's logprob summaries: its top_logprobs, at least 1
 * (the summary's first id is the greedy id). */
static int lp_k_of(const sm_request *r) { return r->samp.top_logprobs > 1 ? r->samp.top_logprobs : 1; }

/* Position j of track t from a row's summary ls: the logprob of logit x, the id's rank (0:
 * unknown) and the track's k most likely ids (the first of the step's lp_k >= k). */
static void lp_put(sm_lp_track *t, size_t j, const sm_lp_sum *ls, float x, int rank) {
    t->lp[j] = sm_lp_value(ls, x);
    t->rank[j] = rank;
    for (int i = 0; i < t->k; i++) {
        t->top_ids[j * (size_t)t->k + i] = i < ls->n ? ls->top_ids[i] : -1;
        t->top_lp[j * (size_t)t->k + i] = i < ls->n ? sm_lp_value(ls, ls->top_l[i]) : -INFINITY;
    }
}

/* The logprobs of id tok at position pos of r (generated index pos - prompt_len; a row past an
 * eos is never read) from its row's summary ls: its value among ls's top ids, else from the raw
 * row (NULL for a greedy request without processors, whose id is ls's first). */
static sm_status lp_record(const sparkmono_engine *g, sm_request *r, const sm_lp_sum *ls, const float *raw, int tok,
                           int64_t pos) {
    const int64_t gi = pos - r->prompt_len;
    if (!r->glp.lp || gi < 0 || gi >= r->max_tokens) return SM_OK;
    if (ls->bad) return fail(SM_E_MODEL, "request at position %lld: its logits are NaN or Inf", (long long)pos);
    int j = 0;
    while (j < ls->n && ls->top_ids[j] != tok) j++;
    if (j == ls->n && (!raw || tok < 0 || tok >= g->cfg->vocab_used))
        return fail(SM_E_BACKEND, "request at position %lld: id %d is not in its logprob summary", (long long)pos, tok);
    lp_put(&r->glp, (size_t)gi, ls, j < ls->n ? ls->top_l[j] : raw[tok], j < ls->n ? j + 1 : 0);
    return SM_OK;
}

/* The logprobs of prompt id j >= 1 of r (its position's summary ls, whose tok_l and tok_rank
 * are that id's logit and rank) and its position's top alternatives. */
static sm_status plp_record(sm_request *r, const sm_lp_sum *ls, int j) {
    if (ls->bad) return fail(SM_E_MODEL, "request prompt position %d: its logits are NaN or Inf", j);
    lp_put(&r->plp, (size_t)j, ls, ls->tok_l, ls->tok_rank);
    return SM_OK;
}

/* The token at position pos of request r (sampled or with processors) from its raw logits row
 * lg [V]: processed (logitproc.h) with the history hist then extra [nextra] (the drafts
 * accepted before this row), then drawn (sampled) or its argmax (greedy); with draft >= 0,
 * *accepted says whether it is that draft (sampled: the speculative rule of sample.h).  ls: the
 * row's logprob summary (a request with logprobs), else NULL. */
static sm_status token_at(sparkmono_engine *g, sm_request *r, const float *lg, const sm_lp_sum *ls, int64_t pos,
                          const int *extra, int nextra, int draft, int *tok, int *accepted) {
    sm_err e = {{0}};
    const int nv = g->cfg->vocab_used;
    const float *raw = lg;
    sm_status s = SM_OK;
    if (r->proc) {
        lg = sm_lp_apply(&g->lws, lg, nv, &r->samp, r->hist, r->nhist, r->prompt_len, extra, nextra, g->cfg->eos,
                         g->cfg->n_eos);
        /* a complete constrained text allows only eos, which min_tokens forbids: the constraint
         * wins over min_tokens (the other processors still apply), the text ends short of it */
        if (r->con && r->samp.min_tokens > 0 && sm_lp_argmax(lg, nv) < 0) {
            sparkmono_sampling s2 = r->samp;
            s2.min_tokens = 0;
            const float *lg2 = sm_lp_apply(&g->lws, raw, nv, &s2, r->hist, r->nhist, r->prompt_len, extra, nextra,
                                           g->cfg->eos, g->cfg->n_eos);
            if (sm_lp_argmax(lg2, nv) >= 0) lg = lg2;
        }
    }
    if (!r->sampled) { /* greedy with processors: the argmax of the processed row */
        *tok = sm_lp_argmax(lg, nv);
        if (*tok < 0 && r->con)
            return fail(SM_E_INVALID, "request at position %lld: its %s constraint and its logit processors (allowed_token_ids, "
                        "bad_words, logit_bias) leave no id", (long long)pos, r->con->kind);
        if (*tok < 0) return fail(SM_E_MODEL, "request at position %lld: every processed logit is -inf or NaN", (long long)pos);
        *accepted = draft >= 0 && *tok == draft;
    } else {
        if (sm_sample_dist(&g->sws, lg, nv, &r->samp, &e)) return fail_err(SM_E_MODEL, &e);
        double u = sm_sample_uniform(r->samp.seed, pos);
        *accepted = 0;
        *tok = draft >= 0 ? sm_sample_accept(&g->sws, draft, u, accepted) : sm_sample_draw(&g->sws, u);
    }
    /* logprobs of the raw row */
    if (ls) s = lp_record(g, r, ls, raw, *tok, pos);
    return s;
}

/* Sampled (or processed greedy) acceptance of one request's verify rows (docs/model.md section
 * 8): t [nrows] the rows' input tokens (t[0] at position p0, then drafts), lg [nrows, V] their
 * logits.  The token of row j sits at position p0 + 1 + j, from row j processed with the
 * history and out[0..j) (the drafts accepted so far); while it is the draft t[j + 1] (sampled:
 * accepted with probability p(draft)) the walk goes on; the first other token or the last
 * row's bonus token ends it.  Writes the tokens to out; *cnt = accepted drafts + 1. */
static sm_status accept_rows(sparkmono_engine *g, sm_request *r, const int *t, int nrows, const float *lg,
                             const sm_lp_sum *ls, int p0, int *out, int *cnt) {
    const size_t V = (size_t)g->cfg->V;
    for (int j = 0;; j++) {
        int acc;
        sm_status s = token_at(g, r, lg + (size_t)j * V, ls ? ls + j : NULL, (int64_t)p0 + 1 + j, out, j,
                               j + 1 < nrows ? t[j + 1] : -1, &out[j], &acc);
        if (s) return s;
        if (!acc) {
            *cnt = j + 1;
            return SM_OK;
        }
    }
}

/* A prefill step's rows: pages for positions [0, b) of req, then its history ids a..b-1 at
 * their positions as the step's rows (no other request in it). */
static sm_status stage_hist_rows(sparkmono_engine *g, int req, int a, int b) {
    sm_err e = {{0}};
    if (sm_kv_reserve(&g->kv, req, b, &e) != 0) return fail_err(SM_E_CACHE, &e);
    for (int i = a; i < b; i++) {
        g->tok[i - a] = g->reqs[req].hist[i];
        g->pos[i - a] = i;
        g->rreq[i - a] = req;
    }
    for (int i = 0; i < g->max_req; i++) g->reqs[i].nrows = 0;
    return SM_OK;
}

sm_status sparkmono_prefill(sparkmono_engine *g, int req, float *logits) {
    sm_status s;
    sm_request *r = get_req(g, req, "sparkmono_prefill", &s);
    if (!r) return s;
    if (r->prefilled) return fail(SM_E_STATE, "sparkmono_prefill: request %d is already prefilled", req);
    const int n = r->prompt_len, V = g->cfg->V;
    /* the prefix cache: the prompt's first blocks from cached pages, unless every prompt row is
     * wanted back (the caller's logits, prompt logprobs, aux hidden states) */
    int a0 = 0;
    if (!logits && !r->plp.lp && !g->naux) sm_kv_prefix_attach(&g->kv, req, r->hist, n, &a0);
    g->computed += n - a0;
    for (int a = a0; a < n; a += g->chunk) {
        int b = a + g->chunk < n ? a + g->chunk : n;
        if ((s = stage_hist_rows(g, req, a, b))) return s;
        float *lg = logits ? logits + (size_t)a * (size_t)V : NULL;
        const int *at = NULL;
        /* summaries: each prompt row's (prompt logprobs: the logit of the next prompt id too),
         * and the last row's (the first generated id's logprobs) */
        const int last_lp = r->glp.lp && r->max_tokens > 0 && b == n, lp_k = r->plp.lp || last_lp ? lp_k_of(r) : 0;
        for (int i = 0; lp_k && i < b - a; i++) {
            g->lp_at[i] = (r->plp.lp && a + i + 1 < n) || (last_lp && a + i == n - 1) ? i : -1;
            g->lp_tok[i] = a + i + 1 < n ? r->hist[a + i + 1] : -1;
        }
        if (!lg && r->rows_back && r->max_tokens > 0 && b == n) {
            /* a sampled / processed request without the caller's logits: only its last row comes back */
            if ((s = slog_reserve(g, 1))) return s;
            for (int i = 0; i < b - a; i++) g->logits_at[i] = i == b - a - 1 ? 0 : -1;
            lg = g->slog;
            at = g->logits_at;
        }
        /* a constrained request: its last prompt row picks the first generated id under the mask */
        const int masked = r->con && r->max_tokens > 0 && b == n;
        if (masked) {
            for (int i = 0; i < b - a; i++) g->mrow[i] = NULL;
            int one = 1;
            if ((s = sm_engine_con_rows(g, req, b - a - 1, &one))) return s;
        }
        if ((s = run_step(g, b - a, lg, at, lp_k, masked))) return s;
        for (int i = 0; r->plp.lp && i < b - a && a + i + 1 < n; i++)
            if ((s = plp_record(r, &g->lpsum[i], a + i + 1))) return s;
        /* a non-finite row fails the prefill: argmax -1, or a NaN / Inf in the logits handed out */
        for (int i = 0; i < b - a; i++)
            if (g->argmax[i] < 0 || (logits && ref_argmax_row(lg + (size_t)i * (size_t)V, g->cfg->vocab_used) < 0))
                return nonfinite("prefill", a / g->chunk + 1, req, a + i);
        r->row0 = 0;
        r->nrows = b - a;
        g->kv.len[req] = b; /* prompt K/V committed up to b */
    }
    sm_kv_prefix_commit(&g->kv, req, r->hist, n); /* its full prompt pages for later requests */
    r->prefilled = 1;
    /* the first generated token: the last row's argmax, or (sampled / processed) its token at position n */
    if (r->max_tokens == 0) {
        r->done = 2;
    } else if (r->rows_back) {
        const float *last = logits ? logits + (size_t)(n - 1) * (size_t)V : g->slog;
        int t, acc;
        if ((s = token_at(g, r, last, r->glp.lp ? &g->lpsum[g->last_nrows - 1] : NULL, n, NULL, 0, -1, &t, &acc))) return s;
        emit(g->cfg, r, &t, 1);
        if ((s = sm_engine_con_emit(g, req, &t, 1))) return s;
    } else {
        const int t = g->argmax[g->last_nrows - 1];
        if (r->glp.lp && (s = lp_record(g, r, &g->lpsum[g->last_nrows - 1], logits ? logits + (size_t)(n - 1) * (size_t)V : NULL,
                                    t, n)))
            return s;
        emit(g->cfg, r, &t, 1);
        if ((s = sm_engine_con_emit(g, req, &t, 1))) return s;
    }
    return ok();
}

sm_status sparkmono_verify(sparkmono_engine *g, int *ntok, int *toks, int *nreq) {
    if (!g) return fail(SM_E_INVALID, "sparkmono_verify: engine is NULL");
    if (nreq) *nreq = 0;
    if (ntok) memset(ntok, 0, (size_t)g->max_req * sizeof(int));
    const int R = g->R;
    sm_err e = {{0}};
    /* reserve pages for every participant first: a full cache fails before any work */
    int n = 0;
    for (int q = 0; q < g->max_req; q++) {
        sm_request *r = &g->reqs[q];
        if (!r->live || !r->prefilled || r->done || r->swapped) continue;
        int rows = R < r->max_tokens - (r->nhist - r->prompt_len) ? R : r->max_tokens - (r->nhist - r->prompt_len);
        if (sm_kv_reserve(&g->kv, q, r->nhist - 1 + rows, &e) != 0) return fail_err(SM_E_CACHE, &e);
        n++;
    }
    if (n == 0) return ok(); /* nothing to do; the last step's aux stays readable */
    /* stage rows: per request, its last token then R-1 drafts, at positions nhist-1 .. */
    int nrows = 0, nsel = 0, lp_k = 0, masked = 0, nfail = 0, first_fail = -1;
    sm_status s;
    for (int q = 0; q < g->max_req; q++) {
        sm_request *r = &g->reqs[q];
        r->nrows = 0;
        if (!r->live || !r->prefilled || r->done || r->swapped) continue;
        int left = r->max_tokens - (r->nhist - r->prompt_len);
        int rows = R < left ? R : left; /* never draft past max_tokens (nor max_len) */
        int p0 = r->nhist - 1;
        g->tok[nrows] = r->hist[p0];
        int *d = g->tok + nrows + 1;
        if (g->draft_fn) {
            g->draft_fn(g->draft_arg, q, r->hist, r->nhist, rows - 1, d);
            for (int i = 0; i < rows - 1; i++) /* a draft outside the vocabulary cannot be fed */
                if (d[i] < 0 || d[i] >= g->cfg->V) d[i] = r->hist[p0];
        } else {
            sm_draft_ngram(r->hist, r->nhist, rows - 1, d);
        }
        /* a constrained request: each row's mask; the drafts end at the first one it forbids */
        for (int i = 0; i < rows; i++) g->mrow[nrows + i] = NULL;
        if (r->con) {
            if (sm_engine_con_rows(g, q, nrows, &rows) != SM_OK) { /* its constraint cannot go on: it alone fails */
                req_failed(r);
                first_fail = nfail++ ? first_fail : q;
                continue;
            }
            masked = 1;
        }
        for (int i = 0; i < rows; i++) {
            g->pos[nrows + i] = p0 + i;
            g->rreq[nrows + i] = q;
            g->logits_at[nrows + i] = r->rows_back ? nsel + i : -1; /* their rows' logits, packed */
            g->lp_at[nrows + i] = r->glp.lp ? nrows + i : -1;         /* their rows' logprob summaries */
            g->lp_tok[nrows + i] = -1;
        }
        if (r->glp.lp && lp_k_of(r) > lp_k) lp_k = lp_k_of(r);
        r->row0 = nrows;
        r->nrows = rows;
        r->lrow0 = nsel;
        if (r->rows_back) nsel += rows;
        nrows += rows;
    }
    if (nrows == 0) return fail(SM_E_STATE, "%s", g->reqs[first_fail].err); /* each one failed alone */
    if (nsel && (s = slog_reserve(g, nsel))) return s;
    if ((s = run_step(g, nrows, nsel ? g->slog : NULL, nsel ? g->logits_at : NULL, lp_k, masked))) return s;
    /* a non-finite row fails the step before anything is emitted or committed */
    for (int q = 0; q < g->max_req; q++)
        for (int i = 0; i < g->reqs[q].nrows; i++)
            if (g->argmax[g->reqs[q].row0 + i] < 0) return nonfinite("verify", g->reqs[q].steps + 1, q, i);
    /* greedy or sampled acceptance per request; commit K/V of the last token and accepted drafts */
    for (int q = 0; q < g->max_req; q++) {
        sm_request *r = &g->reqs[q];
        if (!r->nrows) continue;
        int p0 = r->nhist - 1, cnt;
        const sm_lp_sum *ls = r->glp.lp ? g->lpsum + r->row0 : NULL;
        if (!r->rows_back) {
            cnt = sm_accept_greedy(g->tok + r->row0, g->argmax + r->row0, r->nrows, g->draft);
            for (int j = 0; ls && j < cnt; j++) /* row j gave the token at p0 + 1 + j */
                if ((s = lp_record(g, r, ls + j, NULL, g->draft[j], (int64_t)p0 + 1 + j))) return s;
        } else if (accept_rows(g, r, g->tok + r->row0, r->nrows, g->slog + (size_t)r->lrow0 * (size_t)g->cfg->V, ls, p0,
                               g->draft, &cnt) != SM_OK) {
            req_failed(r); /* its processors or constraint left no id: it alone fails */
            first_fail = nfail++ ? first_fail : q;
            continue;
        }
        int kept = emit(g->cfg, r, g->draft, cnt);
        if (sm_engine_con_emit(g, q, g->draft, kept) != SM_OK) {
            req_failed(r);
            first_fail = nfail++ ? first_fail : q;
        }
        r->steps++;
        r->accepted += kept < cnt - 1 ? kept : cnt - 1;
        g->kv.len[q] = p0 + kept; /* len grows by accepted + 1 */
        if (ntok) ntok[q] = kept;
        if (toks) memcpy(toks + (size_t)q * R, g->draft, (size_t)kept * sizeof(int));
    }
    if (nreq) *nreq = n;
    /* every request of the step failed alone: the step failed (a lone request's caller sees it) */
    if (nfail == n) return fail(SM_E_STATE, "%s", g->reqs[first_fail].err);
    return ok();
}

const char *sm_engine_req_err(const sparkmono_engine *g, int req) {
    return req >= 0 && req < g->max_req && g->reqs[req].done == SM_REQ_FAILED ? g->reqs[req].err : "";
}

sm_status sparkmono_generate(sparkmono_engine *g) {
    if (!g) return fail(SM_E_INVALID, "sparkmono_generate: engine is NULL");
    sm_status s;
    for (int q = 0; q < g->max_req; q++)
        if (g->reqs[q].live && !g->reqs[q].prefilled)
            if ((s = sparkmono_prefill(g, q, NULL))) return s;
    for (;;) {
        int n;
        if ((s = sparkmono_verify(g, NULL, NULL, &n))) return s;
        if (n == 0) break;
    }
    return ok();
}

sm_status sparkmono_request_get_info(const sparkmono_engine *g, int req, sparkmono_request_info *out) {
    sm_status s;
    const sm_request *r = get_req(g, req, "sparkmono_request_get_info", &s);
    if (!r) return s;
    if (!out) return fail(SM_E_INVALID, "sparkmono_request_get_info: out is NULL");
    out->prompt_len = r->prompt_len;
    out->max_tokens = r->max_tokens;
    out->ngen = r->nhist - r->prompt_len;
    out->kv_len = g->kv.len[req];
    out->prefilled = r->prefilled;
    out->done = r->done;
    out->steps = r->steps;
    out->accepted = r->accepted;
    return ok();
}

sm_status sparkmono_output(const sparkmono_engine *g, int req, const int **ids, int *n) {
    sm_status s;
    const sm_request *r = get_req(g, req, "sparkmono_output", &s);
    if (!r) return s;
    if (!ids || !n) return fail(SM_E_INVALID, "sparkmono_output: NULL argument");
    *ids = r->hist + r->prompt_len;
    *n = r->nhist - r->prompt_len;
    return ok();
}

sm_status sparkmono_logprobs(const sparkmono_engine *g, int req, const float **lp, const int **top_ids,
                             const float **top_lp, int *k) {
    sm_status s;
    const sm_request *r = get_req(g, req, "sparkmono_logprobs", &s);
    if (!r) return s;
    if (!lp || !top_ids || !top_lp || !k) return fail(SM_E_INVALID, "sparkmono_logprobs: NULL argument");
    if (!r->glp.lp) return fail(SM_E_STATE, "sparkmono_logprobs: request %d was added without logprobs", req);
    *lp = r->glp.lp;
    *top_ids = r->glp.top_ids;
    *top_lp = r->glp.top_lp;
    *k = r->samp.top_logprobs;
    return ok();
}

sm_status sparkmono_prompt_logprobs(const sparkmono_engine *g, int req, const float **lp, const int **rank,
                                    const int **top_ids, const float **top_lp, int *k) {
    sm_status s;
    const sm_request *r = get_req(g, req, "sparkmono_prompt_logprobs", &s);
    if (!r) return s;
    if (!lp || !rank || !top_ids || !top_lp || !k) return fail(SM_E_INVALID, "sparkmono_prompt_logprobs: NULL argument");
    if (!r->plp.lp) return fail(SM_E_STATE, "sparkmono_prompt_logprobs: request %d was added without prompt_logprobs", req);
    if (!r->prefilled) return fail(SM_E_STATE, "sparkmono_prompt_logprobs: request %d is not prefilled", req);
    *lp = r->plp.lp;
    *rank = r->plp.rank;
    *top_ids = r->plp.top_ids;
    *top_lp = r->plp.top_lp;
    *k = r->samp.top_logprobs;
    return ok();
}

sm_status sparkmono_aux(const sparkmono_engine *g, int req, float *out, int *nrows) {
    sm_status s;
    const sm_request *r = get_req(g, req, "sparkmono_aux", &s);
    if (!r) return s;
    if (!out || !nrows) return fail(SM_E_INVALID, "sparkmono_aux: NULL argument");
    if (g->naux == 0) return fail(SM_E_STATE, "sparkmono_aux: the engine was created without aux layers");
    if (r->nrows == 0) return fail(SM_E_STATE, "sparkmono_aux: request %d was not in the last step", req);
    const size_t H = (size_t)g->cfg->H;
    /* aux is [naux, last_nrows, H]; copy this request's rows of every aux layer */
    for (int j = 0; j < g->naux; j++)
        memcpy(out + (size_t)j * (size_t)r->nrows * H,
               g->aux + ((size_t)j * (size_t)g->last_nrows + (size_t)r->row0) * H,
               (size_t)r->nrows * H * sizeof(float));
    *nrows = r->nrows;
    return ok();
}

sm_status sparkmono_cache_stats_get(const sparkmono_engine *g, sparkmono_cache_stats *out) {
    if (!g || !out) return fail(SM_E_INVALID, "sparkmono_cache_stats_get: NULL engine or out");
    memset(out, 0, sizeof *out);
    out->queries = g->kv.queries;
    out->hits = g->kv.hits;
    out->computed = g->computed;
    out->pages = g->kv.nblocks;
    sm_kv_pages(&g->kv, &out->pages_used, &out->pages_cached, &out->pages_free);
    out->enabled = g->kv.prefix;
    return ok();
}

/* ---------------------------------------------------------------- preemption */

int sm_engine_pages_avail(const sparkmono_engine *g) { return g->kv.nfree + g->kv.nlru; }

int sm_engine_pages_next(const sparkmono_engine *g, int req, int *held) {
    const sm_request *r = &g->reqs[req];
    *held = g->kv.nblk[req];
    if (!r->live || r->done) return *held;
    /* not prefilled: its prompt; else its history and the next step's rows */
    int left = r->max_tokens - (r->nhist - r->prompt_len), rows = g->R < left ? g->R : left;
    const int ntok = !r->prefilled ? r->prompt_len : r->nhist - 1 + (rows > 0 ? rows : 1);
    return (ntok + SM_KV_BLOCK - 1) / SM_KV_BLOCK;
}

sm_status sm_engine_preempt(sparkmono_engine *g, int req) {
    sm_status s;
    sm_request *r = get_req(g, req, "sm_engine_preempt", &s);
    if (!r) return s;
    if (!r->prefilled || r->done || r->swapped) return fail(SM_E_STATE, "sm_engine_preempt: request %d is not running", req);
    sm_kv_drop(&g->kv, req);
    r->swapped = 1;
    r->nrows = 0;
    return ok();
}

sm_status sm_engine_resume(sparkmono_engine *g, int req) {
    sm_status s;
    sm_request *r = get_req(g, req, "sm_engine_resume", &s);
    if (!r) return s;
    if (!r->swapped) return fail(SM_E_STATE, "sm_engine_resume: request %d is not preempted", req);
    /* K/V of positions 0 .. nhist-2 (the next verify step feeds the last id, nhist-1): cached
     * prompt pages first, the rest computed in prefill steps */
    const int n = r->nhist - 1;
    int a0 = 0;
    sm_kv_prefix_attach(&g->kv, req, r->hist, r->nhist, &a0);
    if (a0 > n) a0 = n;
    g->computed += n - a0;
    for (int a = a0; a < n; a += g->chunk) {
        int b = a + g->chunk < n ? a + g->chunk : n;
        if ((s = stage_hist_rows(g, req, a, b))) return s;
        if ((s = run_step(g, b - a, NULL, NULL, 0, 0))) return s;
        for (int i = 0; i < b - a; i++)
            if (g->argmax[i] < 0) return nonfinite("resume", a / g->chunk + 1, req, a + i);
        g->kv.len[req] = b;
    }
    r->swapped = 0;
    return ok();
}
