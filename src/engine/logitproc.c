/* logitproc.c: the logit processors of logitproc.h, in double from the f32 logits, each id's
 * value rounded once back to f32.
 *
 * Order (vLLM's): min_tokens, logit_bias, then the penalties (repetition, then frequency and
 * presence).  Each id is processed once, by the first walk over the history that meets it, so
 * the result does not depend on the order of the history.  We rejected applying the
 * penalties in place on the caller's logits: the same raw row serves the logprobs, which
 * report the raw model distribution.
 */
#include "engine/logitproc.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int sm_lp_ws_init(sm_lp_ws *ws, int cap, sm_err *e) {
    memset(ws, 0, sizeof *ws);
    if (cap < 1) return sm_errf(e, "logit processors: vocabulary of %d ids", cap);
    ws->cap = cap;
    ws->count = calloc((size_t)cap, sizeof(int));
    ws->seen = calloc((size_t)cap, 1);
    ws->row = malloc((size_t)cap * sizeof(float));
    if (!ws->count || !ws->seen || !ws->row) {
        sm_lp_ws_free(ws);
        return sm_errf(e, "logit processors: out of memory for %d ids", cap);
    }
    return 0;
}

void sm_lp_ws_free(sm_lp_ws *ws) {
    free(ws->count);
    free(ws->seen);
    free(ws->row);
    memset(ws, 0, sizeof *ws);
}

/* A penalty field: finite, in [-2, 2]. */
static int check_pen(const char *name, float v, sm_err *e) {
    if (!isfinite(v) || v < -2 || v > 2) return sm_errf(e, "sampling: %s %g is not in [-2, 2]", name, (double)v);
    return 0;
}

int sm_lp_check(const sparkmono_sampling *s, int V, sm_err *e) {
    if (check_pen("presence_penalty", s->presence_penalty, e) || check_pen("frequency_penalty", s->frequency_penalty, e))
        return -1;
    if (!isfinite(s->repetition_penalty) || s->repetition_penalty < 0)
        return sm_errf(e, "sampling: repetition_penalty %g is not a finite number > 0", (double)s->repetition_penalty);
    if (s->min_tokens < 0) return sm_errf(e, "sampling: min_tokens %d is negative", s->min_tokens);
    if (s->ignore_eos != 0 && s->ignore_eos != 1) return sm_errf(e, "sampling: ignore_eos %d is not 0 or 1", s->ignore_eos);
    if (s->n_bias < 0 || s->n_bias > SPARKMONO_MAX_BIAS)
        return sm_errf(e, "sampling: %d logit_bias entries, not in [0, %d]", s->n_bias, SPARKMONO_MAX_BIAS);
    for (int i = 0; i < s->n_bias; i++) {
        if (s->bias[i].id < 0 || s->bias[i].id >= V)
            return sm_errf(e, "sampling: logit_bias id %d is outside the vocabulary [0, %d)", s->bias[i].id, V);
        if (!isfinite(s->bias[i].bias) || s->bias[i].bias < -100 || s->bias[i].bias > 100)
            return sm_errf(e, "sampling: logit_bias of id %d is %g, not in [-100, 100]", s->bias[i].id, (double)s->bias[i].bias);
    }
    if (s->logprobs != 0 && s->logprobs != 1) return sm_errf(e, "sampling: logprobs %d is not 0 or 1", s->logprobs);
    if (s->prompt_logprobs != 0 && s->prompt_logprobs != 1)
        return sm_errf(e, "sampling: prompt_logprobs %d is not 0 or 1", s->prompt_logprobs);
    if (s->top_logprobs < 0 || s->top_logprobs > SPARKMONO_MAX_TOP_LOGPROBS ||
        (s->top_logprobs && !s->logprobs && !s->prompt_logprobs))
        return sm_errf(e, "sampling: top_logprobs %d is not in [0, %d] (and needs logprobs or prompt_logprobs)",
                       s->top_logprobs, SPARKMONO_MAX_TOP_LOGPROBS);
    if (s->n_stop_ids < 0 || s->n_stop_ids > SPARKMONO_MAX_STOP_IDS)
        return sm_errf(e, "sampling: %d stop ids, not in [0, %d]", s->n_stop_ids, SPARKMONO_MAX_STOP_IDS);
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] < 0 || s->stop_ids[i] >= V)
            return sm_errf(e, "sampling: stop id %d is outside the vocabulary [0, %d)", s->stop_ids[i], V);
    return 0;
}

int sm_lp_active(const sparkmono_sampling *s) {
    return s->presence_penalty != 0 || s->frequency_penalty != 0 ||
           (s->repetition_penalty != 0 && s->repetition_penalty != 1) || s->n_bias > 0 || s->min_tokens > 0;
}

int sm_lp_stops(const sparkmono_sampling *s, const int *eos, int n_eos, int t) {
    if (!s->ignore_eos)
        for (int i = 0; i < n_eos; i++)
            if (eos[i] == t) return 1;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == t) return 1;
    return 0;
}

/* The id at index i of the history hist [nhist] then extra. */
static int hist_at(const int *hist, int nhist, const int *extra, int i) { return i < nhist ? hist[i] : extra[i - nhist]; }

/* One id's penalties: repetition (it is in the history), then frequency and presence (cnt
 * occurrences among the generated ids). */
static float penalize(float l, const sparkmono_sampling *s, int cnt) {
    double x = l;
    double rp = s->repetition_penalty;
    if (rp != 0 && rp != 1) x = x > 0 ? x / rp : x * rp; /* HF / vLLM: divide positive, multiply negative */
    x -= (double)s->frequency_penalty * cnt + (double)s->presence_penalty * (cnt > 0); /* OpenAI */
    return (float)x;
}

const float *sm_lp_apply(sm_lp_ws *ws, const float *lg, int nv, const sparkmono_sampling *s, const int *hist,
                         int nhist, int plen, const int *extra, int nextra, const int *eos, int n_eos) {
    float *row = ws->row;
    memcpy(row, lg, (size_t)nv * sizeof(float));
    const int ntot = nhist + nextra, ngen = ntot - plen;
    /* min_tokens: eos (unless ignored) and stop ids cannot come before it is reached */
    if (ngen < s->min_tokens) {
        if (!s->ignore_eos)
            for (int i = 0; i < n_eos; i++)
                if (eos[i] >= 0 && eos[i] < nv) row[eos[i]] = -INFINITY;
        for (int i = 0; i < s->n_stop_ids; i++)
            if (s->stop_ids[i] < nv) row[s->stop_ids[i]] = -INFINITY;
    }
    /* logit_bias: added (in double; a later entry for the same id adds again) */
    for (int i = 0; i < s->n_bias; i++)
        if (s->bias[i].id < nv) row[s->bias[i].id] = (float)((double)row[s->bias[i].id] + s->bias[i].bias);
    const int rep = s->repetition_penalty != 0 && s->repetition_penalty != 1;
    if (!rep && s->frequency_penalty == 0 && s->presence_penalty == 0) return row;
    /* counts of the generated ids, then each id of the history penalized once */
    for (int i = plen; i < ntot; i++) ws->count[hist_at(hist, nhist, extra, i)]++;
    for (int i = rep ? 0 : plen; i < ntot; i++) {
        int t = hist_at(hist, nhist, extra, i);
        if (ws->seen[t]) continue;
        ws->seen[t] = 1;
        if (t < nv) row[t] = penalize(row[t], s, ws->count[t]);
    }
    /* the scratch back to zero */
    for (int i = 0; i < ntot; i++) {
        int t = hist_at(hist, nhist, extra, i);
        ws->count[t] = 0;
        ws->seen[t] = 0;
    }
    return row;
}

int sm_lp_argmax(const float *row, int nv) {
    int best = -1;
    float bl = -INFINITY;
    for (int i = 0; i < nv; i++) {
        if (isnan(row[i])) return -1;
        if (row[i] > bl) { /* strict: ties keep the lowest id */
            bl = row[i];
            best = i;
        }
    }
    return best;
}
