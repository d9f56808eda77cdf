/* vocab.c: the vocabulary trie and the token masks (vocab.h).
 *
 * The trie is built by sorting the eligible ids by their bytes: consecutive ids then share their
 * longest common prefix with the previous one, so each id adds the nodes past that prefix, in
 * preorder, and each node's subtree ends where the next node of its depth or less begins.
 */
#include "constrain/vocab.h"
#include <stdlib.h>
#include <string.h>

typedef struct tokref {
    const unsigned char *b;
    size_t len;
    int id;
} tokref;

static int cmp_tok(const void *pa, const void *pb) {
    const tokref *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->b, b->b, n);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

void sm_vocab_free(sm_vocab *v) {
    if (!v) return;
    free(v->byte); free(v->depth); free(v->skip); free(v->tok_off); free(v->ids); free(v->bytes); free(v->off);
    free(v);
}

int sm_vocab_build(const sm_tokenizer *t, int V, int vocab_used, const int *eos, int n_eos, sm_vocab **out, sm_err *e) {
    const unsigned char **b = malloc(sizeof *b * (size_t)(V > 0 ? V : 1));
    size_t *len = malloc(sizeof *len * (size_t)(V > 0 ? V : 1));
    uint8_t *ok = malloc((size_t)(V > 0 ? V : 1));
    if (!b || !len || !ok) { free(b); free(len); free(ok); return sm_errf(e, "out of memory for the vocabulary trie"); }
    /* eligible: a token of the vocabulary (not special) below vocab_used with at least one byte */
    for (int id = 0; id < V; id++) {
        ok[id] = sm_tokenizer_token_bytes(t, id, &b[id], &len[id]) == 1 && len[id] > 0 && id < vocab_used;
        if (!ok[id]) b[id] = NULL, len[id] = 0;
    }
    int rc = sm_vocab_build_raw(V, b, len, ok, eos, n_eos, out, e);
    free(b); free(len); free(ok);
    return rc;
}

int sm_vocab_build_raw(int V, const unsigned char *const *bytes, const size_t *blen, const uint8_t *okv, const int *eos, int n_eos,
                       sm_vocab **out, sm_err *e) {
    *out = NULL;
    sm_vocab *v = calloc(1, sizeof *v);
    tokref *tr = malloc(sizeof(tokref) * (size_t)(V > 0 ? V : 1));
    if (!v || !tr || !(v->off = calloc((size_t)V + 1, sizeof(int64_t)))) {
        free(tr);
        sm_vocab_free(v);
        return sm_errf(e, "out of memory for the vocabulary trie");
    }
    v->V = V;
    v->words = (V + 31) / 32;
    v->n_eos = n_eos < 8 ? n_eos : 8;
    memcpy(v->eos, eos, sizeof(int) * (size_t)v->n_eos);
    /* the eligible ids' bytes, copied back to back */
    size_t total = 0;
    for (int id = 0; id < V; id++) total += okv[id] ? blen[id] : 0;
    if (!(v->bytes = malloc(total ? total : 1))) { free(tr); sm_vocab_free(v); return sm_errf(e, "out of memory for the vocabulary trie"); }
    int n = 0;
    for (int id = 0; id < V; id++) {
        v->off[id + 1] = v->off[id];
        if (!okv[id] || !blen[id]) continue;
        memcpy(v->bytes + v->off[id], bytes[id], blen[id]);
        v->off[id + 1] += (int64_t)blen[id];
        tr[n].b = v->bytes + v->off[id], tr[n].len = blen[id], tr[n].id = id;
        n++;
    }
    qsort(tr, (size_t)n, sizeof *tr, cmp_tok);
    /* nodes: at most one per byte of every id, plus the root */
    size_t cap = total + 1;
    v->byte = malloc(cap);
    v->depth = malloc(sizeof(int) * cap);
    v->skip = malloc(sizeof(int) * cap);
    v->tok_off = calloc(cap + 1, sizeof(int));
    v->ids = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *node_at = malloc(sizeof(int) * (cap + 1)); /* the node of each depth on the current path */
    int *endnode = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!v->byte || !v->depth || !v->skip || !v->tok_off || !v->ids || !node_at || !endnode) {
        free(tr); free(node_at); free(endnode); sm_vocab_free(v);
        return sm_errf(e, "out of memory for the vocabulary trie");
    }
    int nn = 1;
    v->byte[0] = 0;
    v->depth[0] = 0;
    node_at[0] = 0;
    for (int i = 0; i < n; i++) {
        /* the prefix shared with the previous id keeps its nodes; the rest are new */
        size_t lcp = 0;
        if (i > 0) {
            size_t m = tr[i].len < tr[i - 1].len ? tr[i].len : tr[i - 1].len;
            while (lcp < m && tr[i].b[lcp] == tr[i - 1].b[lcp]) lcp++;
        }
        for (size_t d = lcp; d < tr[i].len; d++) {
            v->byte[nn] = tr[i].b[d];
            v->depth[nn] = (int)d + 1;
            node_at[d + 1] = nn++;
        }
        endnode[i] = node_at[tr[i].len];
        if ((int)tr[i].len > v->maxdepth) v->maxdepth = (int)tr[i].len;
    }
    v->nnodes = nn;
    /* subtree ends: the next node at the same depth or above */
    {
        int *open = node_at, sp = 0; /* reused as the stack of open nodes */
        for (int i = 0; i < nn; i++) {
            while (sp && v->depth[open[sp - 1]] >= v->depth[i]) v->skip[open[--sp]] = i;
            open[sp++] = i;
        }
        while (sp) v->skip[open[--sp]] = nn;
    }
    /* ids per node: counts, prefix sums, then fill (sorted order keeps each node's ids together) */
    for (int i = 0; i < n; i++) v->tok_off[endnode[i] + 1]++;
    for (int i = 0; i < nn; i++) v->tok_off[i + 1] += v->tok_off[i];
    {
        int *fill = malloc(sizeof(int) * (size_t)nn);
        if (!fill) { free(tr); free(node_at); free(endnode); sm_vocab_free(v); return sm_errf(e, "out of memory for the vocabulary trie"); }
        memcpy(fill, v->tok_off, sizeof(int) * (size_t)nn);
        for (int i = 0; i < n; i++) v->ids[fill[endnode[i]]++] = tr[i].id;
        free(fill);
    }
    free(tr); free(node_at); free(endnode);
    *out = v;
    return 0;
}

const uint32_t *sm_vocab_mask(const sm_vocab *v, sm_gram *g, int cfg, sm_err *e) {
    uint32_t *m = sm_gram_slot(g, cfg);
    if (m) return m;
    m = calloc((size_t)v->words + 1, sizeof(uint32_t)); /* + the word saying whether any id is allowed */
    int *at = malloc(sizeof(int) * ((size_t)v->maxdepth + 2)); /* configuration at each depth of the path */
    const int **row = malloc(sizeof(int *) * ((size_t)v->maxdepth + 2)); /* and its transition row */
    if (!m || !at || !row || !(row[0] = sm_gram_row(g, cfg))) {
        free(m); free(at); free(row);
        sm_errf(e, "out of memory for a token mask");
        return NULL;
    }
    /* one preorder pass: a node whose byte kills its parent's configuration skips its subtree;
     * a known transition is read from the parent's row, a new one computed once */
    at[0] = cfg;
    for (int i = 1; i < v->nnodes;) {
        const int d = v->depth[i];
        int c = row[d - 1][v->byte[i]];
        if (c == SM_GRAM_UNKNOWN) c = sm_gram_step(g, at[d - 1], v->byte[i]);
        if (c == -2) { free(m); free(at); free(row); sm_errf(e, "%s", sm_gram_error(g)); return NULL; }
        if (c < 0) { i = v->skip[i]; continue; }
        at[d] = c;
        /* a leaf needs no row: the next node is a sibling or above */
        if (i + 1 < v->nnodes && v->depth[i + 1] > d && !(row[d] = sm_gram_row(g, c))) {
            free(m); free(at); free(row);
            sm_errf(e, "out of memory for a token mask");
            return NULL;
        }
        for (int k = v->tok_off[i]; k < v->tok_off[i + 1]; k++) m[v->ids[k] >> 5] |= 1u << (v->ids[k] & 31);
        m[v->words] |= v->tok_off[i + 1] > v->tok_off[i];
        i++;
    }
    free(at);
    free(row);
    if (sm_gram_accepting(g, cfg))
        for (int k = 0; k < v->n_eos; k++)
            if (v->eos[k] >= 0 && v->eos[k] < v->V) m[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31), m[v->words] = 1;
    sm_gram_set_slot(g, cfg, m);
    return m;
}
