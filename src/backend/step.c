/* step.c: the one step validator (step.h).
 *
 * The checks run in the order a reader would ask them: shape of the call (row count, inputs
 * given, cache geometry, aux request), then every row (token, request, position, reserved
 * pages, page ids).  The page-id check walks the whole block table up to each row's position,
 * because attention reads every page up to there, not only the row's own.  We rejected
 * trusting the engine's bookkeeping: a step from a test or a tool reaches the kernels too,
 * and a page id outside the cache is an out-of-bounds device read.
 */
#include "backend/step.h"

/* The geometry of the step's cache must be the one the backend was made for. */
static int check_geometry(const sm_kv_shape *g, const sm_kv *kv, const char *who, sm_err *e) {
    if (kv->nblocks != g->nblocks || kv->max_req != g->max_req || kv->max_len != g->max_len || kv->max_bpr != g->max_bpr)
        return sm_errf(e, "%s: kv cache geometry (%d pages, %d requests, %d positions, %d blocks/request) differs from "
                       "the backend's (%d, %d, %d, %d)", who, kv->nblocks, kv->max_req, kv->max_len, kv->max_bpr, g->nblocks,
                       g->max_req, g->max_len, g->max_bpr);
    return 0;
}

/* Row i: token, live request, position, reserved pages, page ids. */
static int check_row(const sm_config *c, const sm_kv *kv, const sm_step *s, int i, const char *who, sm_err *e) {
    int t = s->tokens[i], p = s->pos[i], r = s->req[i];
    if (t < 0 || t >= c->V) return sm_errf(e, "%s: row %d: token %d outside the vocabulary [0, %d)", who, i, t, c->V);
    if (r < 0 || r >= kv->max_req || !kv->live[r])
        return sm_errf(e, "%s: row %d: request %d is not a live kv cache slot", who, i, r);
    if (p < 0 || p >= kv->max_len) return sm_errf(e, "%s: row %d: position %d outside [0, %d)", who, i, p, kv->max_len);
    if (p / SM_KV_BLOCK >= kv->nblk[r])
        return sm_errf(e, "%s: row %d: position %d of request %d has no reserved cache page", who, i, p, r);
    const int *tb = kv->tables + (int64_t)r * kv->max_bpr;
    for (int b = 0; b <= p / SM_KV_BLOCK; b++)
        if (tb[b] < 0 || tb[b] >= kv->nblocks)
            return sm_errf(e, "%s: row %d: request %d block %d maps to page %d outside [0, %d)", who, i, r, b, tb[b],
                           kv->nblocks);
    return 0;
}

int sm_step_check(const sm_config *c, const sm_kv_shape *made, const sm_step *s, const char *who, sm_err *e) {
    if (s->nrows < 0) return sm_errf(e, "%s: nrows %d is negative", who, s->nrows);
    if (s->nrows == 0) return 0;
    if (!s->tokens || !s->pos || !s->req || !s->kv) return sm_errf(e, "%s: tokens, pos, req and kv must all be given", who);
    if (check_geometry(made, s->kv, who, e)) return -1;
    if (s->naux < 0 || s->naux > SM_STEP_MAX_AUX || (s->naux > 0 && (!s->aux_layers || !s->aux)))
        return sm_errf(e, "%s: naux %d needs aux_layers and aux buffers (at most %d)", who, s->naux, SM_STEP_MAX_AUX);
    for (int a = 0; a < s->naux; a++)
        if (s->aux_layers[a] < 0 || s->aux_layers[a] > c->L)
            return sm_errf(e, "%s: aux layer %d (entry %d) outside [0, %d]", who, s->aux_layers[a], a, c->L);
    if (s->logits_at) {
        if (!s->logits) return sm_errf(e, "%s: logits_at needs a logits buffer", who);
        for (int i = 0; i < s->nrows; i++)
            if (s->logits_at[i] < -1 || s->logits_at[i] >= s->nrows)
                return sm_errf(e, "%s: row %d: logits_at %d outside [-1, %d)", who, i, s->logits_at[i], s->nrows);
    }
    if (s->lp_at) {
        if (!s->lp || s->lp_k < 1 || s->lp_k > SM_LP_MAX_TOP)
            return sm_errf(e, "%s: lp_at needs a summary buffer and lp_k in [1, %d] (lp_k %d)", who, SM_LP_MAX_TOP, s->lp_k);
        for (int i = 0; i < s->nrows; i++)
            if (s->lp_at[i] < -1 || s->lp_at[i] >= s->nrows)
                return sm_errf(e, "%s: row %d: lp_at %d outside [-1, %d)", who, i, s->lp_at[i], s->nrows);
        for (int i = 0; s->lp_tok && i < s->nrows; i++)
            if (s->lp_tok[i] < -1 || s->lp_tok[i] >= c->V)
                return sm_errf(e, "%s: row %d: lp_tok %d outside [-1, %d)", who, i, s->lp_tok[i], c->V);
    }
    for (int i = 0; i < s->nrows; i++)
        if (check_row(c, s->kv, s, i, who, e)) return -1;
    return 0;
}
