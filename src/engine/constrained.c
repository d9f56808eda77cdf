/* constrained.c: structured outputs in the engine: the public constraint calls, a model's
 * vocabulary trie, and the masks of a constrained request's rows.
 *
 * A verify step feeds a request's last id and its drafts; row j's mask is the constraint's
 * mask at the position after the ids fed up to row j, so every row is masked exactly as plain
 * decoding would mask that position.  A draft the previous row's mask forbids could never be
 * accepted, and no position exists after it: the drafts end there (fewer rows), the rule the
 * greedy and sampled acceptance already imply.  The masks are applied by the backend, where the
 * logits are (backend.h: sm_step.mask), before the argmax, the summaries and any row sent back.
 * We rejected applying the masks on the host: greedy rows would have to bring their 800 KB
 * logits back from the GPU just to be masked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "constrain/constrain.h"
#include "engine/engine.h"
#include "model/tokenizer.h"

/* The model's vocabulary trie, loaded with its tokenizer on first use. */
static sm_status model_vocab(sparkmono_model *m, const sm_vocab **out) {
    char msg[1200];
    sm_status st = SM_OK;
    pthread_mutex_lock(&m->vmu);
    if (!m->vocab) {
        sm_err e = {{0}};
        char path[4096];
        sm_tokenizer *t = NULL;
        const sm_config *c = &m->m.cfg;
        if (sm_tokenizer_load_dir(m->dir, &t, path, sizeof path, &e)) {
            snprintf(msg, sizeof msg, "constraint: %s", e.msg);
            st = SM_E_MODEL;
        } else if (!t) {
            snprintf(msg, sizeof msg, "constraint: %s has no tokenizer.json (a constraint needs each id's bytes)", m->dir);
            st = SM_E_MODEL;
        } else {
            if (sm_vocab_build(t, c->V, c->vocab_used, c->eos, c->n_eos, &m->vocab, &e)) {
                snprintf(msg, sizeof msg, "constraint: %s", e.msg);
                st = SM_E_NOMEM;
            }
            sm_tokenizer_free(t);
        }
    }
    *out = m->vocab;
    pthread_mutex_unlock(&m->vmu);
    return st == SM_OK ? SM_OK : sm_engine_fail(st, msg);
}

void sm_engine_model_con_free(sparkmono_model *m) {
    sm_vocab_free(m->vocab);
    m->vocab = NULL;
}

sm_status sparkmono_constraint_create(sparkmono_model *m, const char *kind, const char *spec, size_t len, int any_whitespace,
                                      sparkmono_constraint **out) {
    if (!m || !out) return sm_engine_fail(SM_E_INVALID, "sparkmono_constraint_create: NULL model or out");
    *out = NULL;
    if (any_whitespace != 0 && any_whitespace != 1)
        return sm_engine_fail(SM_E_INVALID, "sparkmono_constraint_create: any_whitespace must be 0 or 1");
    const sm_vocab *v;
    sm_status s = model_vocab(m, &v);
    if (s) return s;
    sm_err e = {{0}};
    if (sm_con_create(v, kind, spec, len, any_whitespace, out, &e)) return sm_engine_fail(SM_E_INVALID, e.msg);
    return sm_engine_fail(SM_OK, "");
}

void sparkmono_constraint_retain(sparkmono_constraint *c) { sm_con_retain(c); }
void sparkmono_constraint_release(sparkmono_constraint *c) { sm_con_release(c); }

sm_status sm_engine_con_reserve(sparkmono_engine *g) {
    if (g->mbuf) return SM_OK;
    g->mbuf = malloc(sizeof(uint32_t) * (size_t)((g->cfg->V + 31) / 32) * (size_t)g->max_rows);
    return g->mbuf ? SM_OK : sm_engine_fail(SM_E_NOMEM, "sparkmono_add_sampled: out of memory for the constraint masks");
}

/* The mask at position pos of r's constraint into m [words]; the request's generated index gi
 * names the position in a failure. */
static sm_status row_mask(sm_request *r, int pos, int gi, uint32_t *m) {
    sm_err e = {{0}};
    char msg[1200];
    const int any = sm_con_mask(r->con, pos, m, &e);
    if (any < 0) {
        snprintf(msg, sizeof msg, "generated token %d: %s", gi, e.msg);
        return sm_engine_fail(SM_E_BACKEND, msg);
    }
    if (!any) {
        snprintf(msg, sizeof msg, "generated token %d: no id of the vocabulary continues the %s constraint here", gi,
                 r->con->kind);
        return sm_engine_fail(SM_E_STATE, msg);
    }
    return SM_OK;
}

sm_status sm_engine_con_rows(sparkmono_engine *g, int req, int row0, int *rows) {
    sm_request *r = &g->reqs[req];
    const int gi = r->nhist - r->prompt_len, words = r->con->v->words; /* gi: the generated index row 0 predicts */
    int pos = r->cpos;
    uint32_t *m = g->mbuf + (size_t)row0 * words;
    sm_status s = row_mask(r, pos, gi, m);
    if (s) return s;
    g->mrow[row0] = m;
    for (int j = 1; j < *rows; j++) {
        const int d = g->tok[row0 + j];
        /* draft d is read at the position of row j - 1: forbidden there (or an eos), it ends the drafts */
        sm_err e = {{0}};
        int next = d >= 0 && d < g->cfg->V && sm_mask_has(m, d) ? sm_con_advance(r->con, pos, d, &e) : SM_GRAM_DEAD;
        if (next == -2) return sm_engine_fail(SM_E_BACKEND, e.msg);
        m += words;
        if (next < 0 || next == SM_CON_ENDED || sm_con_mask(r->con, next, m, &e) <= 0) {
            *rows = j;
            return SM_OK;
        }
        pos = next;
        g->mrow[row0 + j] = m;
    }
    return SM_OK;
}

sm_status sm_engine_con_emit(sparkmono_engine *g, int req, const int *t, int n) {
    sm_request *r = &g->reqs[req];
    if (!r->con) return SM_OK;
    for (int i = 0; i < n; i++) {
        sm_err e = {{0}};
        int next = sm_con_advance(r->con, r->cpos, t[i], &e);
        if (next == -2) return sm_engine_fail(SM_E_BACKEND, e.msg);
        if (next == SM_GRAM_DEAD) {
            char msg[256];
            snprintf(msg, sizeof msg, "request %d: id %d was emitted where its %s constraint forbids it", req, t[i], r->con->kind);
            return sm_engine_fail(SM_E_STATE, msg);
        }
        r->cpos = next;
    }
    (void)g;
    return SM_OK;
}
