/* logitproc.c: the logit processors of logitproc.h, in double from the f32 logits, each id's
 * value rounded once back to f32.
 *
 * Order (vLLM's): allowed ids, bad words, min_tokens, logit_bias, then the penalties
 * (repetition, then frequency and presence); the first three only set -inf, which every later
 * rule keeps.  Each id is processed once, by the first walk over the history that meets it, so
 * the result does not depend on the order of the history.  A bad word is matched against the
 * generated tail directly (at most SPARKMONO_MAX_BAD_WORD_IDS compares a row).  We rejected
 * applying the penalties in place on the caller's logits: the same raw row serves the
 * logprobs, which report the raw model distribution.
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
    if (s->n_allowed_ids < 0 || s->n_allowed_ids > SPARKMONO_MAX_ALLOWED_IDS)
        return sm_errf(e, "sampling: %d allowed ids, not in [0, %d]", s->n_allowed_ids, SPARKMONO_MAX_ALLOWED_IDS);
    for (int i = 0; i < s->n_allowed_ids; i++)
        if (s->allowed_ids[i] < 0 || s->allowed_ids[i] >= V)
            return sm_errf(e, "sampling: allowed id %d is outside the vocabulary [0, %d)", s->allowed_ids[i], V);
    if (s->n_bad_words < 0 || s->n_bad_words > SPARKMONO_MAX_BAD_WORDS)
        return sm_errf(e, "sampling: %d bad words, not in [0, %d]", s->n_bad_words, SPARKMONO_MAX_BAD_WORDS);
    int nids = 0;
    for (int b = 0; b < s->n_bad_words; b++) {
        const int len = s->bad_word_len[b];
        if (len < 1 || len > SPARKMONO_MAX_BAD_WORD_IDS - nids)
            return sm_errf(e, "sampling: bad word %d has %d ids (each has at least one, at most %d in all)", b, len,
                           SPARKMONO_MAX_BAD_WORD_IDS);
        for (int j = nids; j < nids + len; j++)
            if (s->bad_word_ids[j] < 0 || s->bad_word_ids[j] >= V)
                return sm_errf(e, "sampling: bad word %d holds id %d, outside the vocabulary [0, %d)", b, s->bad_word_ids[j], V);
        nids += len;
    }
    return 0;
}

int sm_lp_active(const sparkmono_sampling *s) {
    return s->presence_penalty != 0 || s->frequency_penalty != 0 ||
           (s->repetition_penalty != 0 && s->repetition_penalty != 1) || s->n_bias > 0 || s->min_tokens > 0 ||
           s->n_allowed_ids > 0 || s->n_bad_words > 0;
}

/* Bytes of the Python whitespace character (str.isspace) at s [n], 0 when s starts with none. */
static size_t space_at(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n < 3 || (s[0] & 0xF0) != 0xE0) return 0;
    const unsigned c = (unsigned)(s[0] & 0x0F) << 12 | (unsigned)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    return c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
                   c == 0x3000
               ? 3
               : 0;
}

/* Append ids [n] to s's bad words as one sequence; -1 (e) when s holds no more. */
static int bad_word_add(sparkmono_sampling *s, const int *ids, int n, int word, sm_err *e) {
    int used = 0;
    for (int b = 0; b < s->n_bad_words; b++) used += s->bad_word_len[b];
    if (s->n_bad_words >= SPARKMONO_MAX_BAD_WORDS || n > SPARKMONO_MAX_BAD_WORD_IDS - used)
        return sm_errf(e, "bad word %d: the bad words make more than %d id sequences or %d ids", word,
                       SPARKMONO_MAX_BAD_WORDS, SPARKMONO_MAX_BAD_WORD_IDS);
    memcpy(s->bad_word_ids + used, ids, (size_t)n * sizeof(int));
    s->bad_word_len[s->n_bad_words++] = n;
    return 0;
}

int sm_lp_bad_words(const sm_tokenizer *t, const char *const *words, const size_t *lens, int n, int V, sparkmono_sampling *s,
                    sm_err *e) {
    for (int w = 0; w < n; w++) {
        /* the word without its leading whitespace (Python's lstrip) */
        const unsigned char *p = (const unsigned char *)words[w];
        size_t len = lens[w], k;
        while ((k = space_at(p, len)) > 0) p += k, len -= k;
        if (len == 0) return sm_errf(e, "bad word %d is empty (or only whitespace)", w);
        char *spaced = malloc(len + 1);
        if (!spaced) return sm_errf(e, "bad word %d: out of memory", w);
        spaced[0] = ' ';
        memcpy(spaced + 1, p, len);
        /* encoded as it is, then after a space */
        int *ids[2] = {NULL, NULL}, nid[2] = {0, 0}, rc = 0;
        for (int v = 0; v < 2 && !rc; v++) {
            sm_err te = {{0}};
            if (sm_tokenizer_encode(t, v ? spaced : (const char *)p, v ? len + 1 : len, &ids[v], &nid[v], &te))
                rc = sm_errf(e, "bad word %d cannot be tokenized: %s", w, te.msg);
            for (int i = 0; !rc && i < nid[v]; i++)
                if (ids[v][i] < 0 || ids[v][i] >= V)
                    rc = sm_errf(e, "bad word %d encodes to id %d, outside the model's vocabulary [0, %d)", w, ids[v][i], V);
        }
        if (!rc && nid[0] == 0) rc = sm_errf(e, "bad word %d encodes to no tokens", w);
        if (!rc) rc = bad_word_add(s, ids[0], nid[0], w, e);
        /* the spaced sequence only where the space makes another first token of the same count */
        if (!rc && nid[1] == nid[0] && ids[1][0] != ids[0][0]) rc = bad_word_add(s, ids[1], nid[1], w, e);
        free(ids[0]);
        free(ids[1]);
        free(spaced);
        if (rc) return -1;
    }
    return 0;
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
    const int ntot = nhist + nextra, ngen = ntot - plen;
    /* allowed ids: the row is -inf but for them */
    if (s->n_allowed_ids > 0) {
        for (int i = 0; i < nv; i++) row[i] = -INFINITY;
        for (int i = 0; i < s->n_allowed_ids; i++)
            if (s->allowed_ids[i] < nv) row[s->allowed_ids[i]] = lg[s->allowed_ids[i]];
    } else {
        memcpy(row, lg, (size_t)nv * sizeof(float));
    }
    /* bad words: a sequence's last id where the generated ids end with the rest of it */
    const int *w = s->bad_word_ids;
    for (int b = 0; b < s->n_bad_words; w += s->bad_word_len[b++]) {
        const int pre = s->bad_word_len[b] - 1, last = w[pre];
        int match = pre <= ngen;
        for (int j = 0; match && j < pre; j++) match = hist_at(hist, nhist, extra, ntot - pre + j) == w[j];
        if (match && last < nv) row[last] = -INFINITY;
    }
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
