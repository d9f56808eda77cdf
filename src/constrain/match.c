/* match.c: the lazy determinization of a constraint's pushdown NFA (match.h).
 *
 * A thread is (state, stack id); a stack id names an interned node (return state, parent id),
 * 0 the empty stack.  The closure of a set of threads follows epsilon edges, calls (push the
 * edge's target, enter the callee) and exits (pop: continue at the return state), and keeps
 * the threads at states with a byte edge plus the accepting one (rule 0's exit, empty stack).
 * Configurations (sorted thread arrays) are interned by hash; each has a 256-entry transition
 * row allocated on its first step, -3 for "not computed yet".
 * We rejected recomputing the closure per byte without interning: the vocabulary walk of a token
 * mask steps the same few configurations hundreds of thousands of times.
 */
#include "constrain/match.h"
#include <stdlib.h>
#include <string.h>

#define UNKNOWN SM_GRAM_UNKNOWN

typedef struct cfg_t {
    int off, n;          /* its threads: pairs [off, off + 2n) of g->thr (state, stack) */
    int acc;             /* 1: accepting */
    int more;            /* 1: some thread has a byte edge */
    uint32_t hash;
    int *trans;          /* [256] next configuration per byte, UNKNOWN; NULL until first step */
    void *slot;          /* the user's (vocab.c: the token mask) */
} cfg_t;

struct sm_gram {
    sm_nfa n;            /* the pruned automaton (dead edges have to = -1) */
    int *stk_ret, *stk_par; /* [nstk] stack nodes: return state, parent (node 0: empty) */
    int nstk, cap_stk;
    int *stk_tab;        /* open-addressing index of the nodes, -1 empty */
    int stk_tab_cap;
    int *thr;            /* thread pairs of every configuration */
    int nthr, cap_thr;
    cfg_t *cfg;          /* [ncfg] */
    int ncfg, cap_cfg;
    int *cfg_tab;        /* open-addressing index of the configurations, -1 empty */
    int cfg_tab_cap;
    /* the closure's scratch */
    int *work; int cap_work;             /* pairs to visit */
    int *out; int cap_out;               /* pairs kept */
    uint64_t *seen; uint32_t *seen_gen; int seen_cap, seen_n; uint32_t gen; /* pairs of this closure */
    int start;
    int failed;          /* 1: over the limit or out of memory (err) */
    sm_err err;
};

static uint32_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (uint32_t)x;
}

static int fail(sm_gram *g, const char *msg) {
    if (!g->failed) { g->failed = 1; sm_errf(&g->err, "%s", msg); }
    return -2;
}

/* ---- pruning and the left-recursion check ------------------------------------------------ */

/* Mark the states from which their rule's exit is reachable (calls count only when the callee
 * is productive); cut every edge into an unproductive state or rule.  Returns 0 or -1 (oom). */
static int prune(sm_nfa *n) {
    int ns = n->nstates, ne = n->nedges, nr = n->nrules;
    char *prod = calloc((size_t)ns, 1), *rprod = calloc((size_t)(nr ? nr : 1), 1);
    int *rfirst = malloc(sizeof(int) * (size_t)ns), *rnext = malloc(sizeof(int) * (size_t)(ne ? ne : 1));
    int *src = malloc(sizeof(int) * (size_t)(ne ? ne : 1)), *queue = malloc(sizeof(int) * (size_t)ns);
    int *cfirst = malloc(sizeof(int) * (size_t)(nr ? nr : 1)), *cnext = malloc(sizeof(int) * (size_t)(ne ? ne : 1));
    int rc = -1;
    if (!prod || !rprod || !rfirst || !rnext || !src || !queue || !cfirst || !cnext) goto out;
    /* reverse edges, and the call edges of each callee */
    for (int s = 0; s < ns; s++) rfirst[s] = -1;
    for (int r = 0; r < nr; r++) cfirst[r] = -1;
    for (int s = 0; s < ns; s++)
        for (int k = n->first[s]; k >= 0; k = n->edges[k].next) {
            src[k] = s;
            rnext[k] = rfirst[n->edges[k].to];
            rfirst[n->edges[k].to] = k;
            if (n->edges[k].kind == SM_NFA_CALL) {
                cnext[k] = cfirst[n->edges[k].rule];
                cfirst[n->edges[k].rule] = k;
            }
        }
    int qh = 0, qt = 0;
#define MARK(s) do { if (!prod[s]) { prod[s] = 1; queue[qt++] = (s); } } while (0)
    for (int r = 0; r < nr; r++)
        if (n->rule_out[r] >= 0) MARK(n->rule_out[r]);
    while (qh < qt) {
        int t = queue[qh++];
        /* t is productive: an edge into it makes its source productive (a call: if the callee is) */
        for (int k = rfirst[t]; k >= 0; k = rnext[k])
            if (n->edges[k].kind != SM_NFA_CALL || rprod[n->edges[k].rule]) MARK(src[k]);
        /* the entry of rule r productive: r is, and so is every call of r into a productive state */
        int r = n->rule_of[t];
        if (r >= 0 && n->rule_in[r] == t && !rprod[r]) {
            rprod[r] = 1;
            for (int k = cfirst[r]; k >= 0; k = cnext[k])
                if (prod[n->edges[k].to]) MARK(src[k]);
        }
    }
#undef MARK
    for (int k = 0; k < ne; k++) {
        sm_nfa_edge *d = &n->edges[k];
        if (!prod[d->to] || (d->kind == SM_NFA_CALL && !rprod[d->rule])) d->to = -1;
    }
    rc = 0;
out:
    free(prod); free(rprod); free(rfirst); free(rnext); free(src); free(queue); free(cfirst); free(cnext);
    return rc;
}

/* Rules that can read nothing (entry to exit through epsilon edges and calls of such rules). */
static int nullable_rules(const sm_nfa *n, char *nul, int *stack, char *vis) {
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int r = 0; r < n->nrules; r++) {
            if (nul[r] || n->rule_in[r] < 0) continue;
            memset(vis, 0, (size_t)n->nstates);
            int sp = 0;
            stack[sp++] = n->rule_in[r];
            vis[n->rule_in[r]] = 1;
            while (sp && !nul[r]) {
                int s = stack[--sp];
                if (s == n->rule_out[r]) { nul[r] = 1; changed = 1; break; }
                for (int k = n->first[s]; k >= 0; k = n->edges[k].next) {
                    const sm_nfa_edge *d = &n->edges[k];
                    if (d->to < 0 || vis[d->to]) continue;
                    if (d->kind == SM_NFA_EPS || (d->kind == SM_NFA_CALL && nul[d->rule])) {
                        vis[d->to] = 1;
                        stack[sp++] = d->to;
                    }
                }
            }
        }
    }
    return 0;
}

/* -1 (one line in e) when a rule can call itself before reading a byte. */
static int left_recursion(const sm_nfa *n, sm_err *e) {
    int nr = n->nrules, ns = n->nstates;
    char *nul = calloc((size_t)nr + 1, 1), *vis = malloc((size_t)ns + 1);
    int *stack = malloc(sizeof(int) * ((size_t)ns + 1));
    char *adj = calloc((size_t)nr * (size_t)nr + 1, 1); /* adj[r * nr + q]: r calls q first */
    int *color = calloc((size_t)nr + 1, sizeof(int)), *path = malloc(sizeof(int) * ((size_t)nr + 1));
    int *it = malloc(sizeof(int) * ((size_t)nr + 1));
    int rc = 0;
    if (!nul || !vis || !stack || !adj || !color || !path || !it) { rc = sm_errf(e, "out of memory checking the constraint"); goto out; }
    nullable_rules(n, nul, stack, vis);
    /* the calls reachable from each entry without reading a byte */
    for (int r = 0; r < nr; r++) {
        if (n->rule_in[r] < 0) continue;
        memset(vis, 0, (size_t)ns);
        int sp = 0;
        stack[sp++] = n->rule_in[r];
        vis[n->rule_in[r]] = 1;
        while (sp) {
            int s = stack[--sp];
            for (int k = n->first[s]; k >= 0; k = n->edges[k].next) {
                const sm_nfa_edge *d = &n->edges[k];
                if (d->to < 0) continue;
                if (d->kind == SM_NFA_CALL) adj[(size_t)r * nr + d->rule] = 1;
                int go = d->kind == SM_NFA_EPS || (d->kind == SM_NFA_CALL && nul[d->rule]);
                if (go && !vis[d->to]) { vis[d->to] = 1; stack[sp++] = d->to; }
            }
        }
    }
    /* a cycle in that graph (iterative depth-first search, colors 0 new, 1 open, 2 done) */
    for (int r0 = 0; r0 < nr && !rc; r0++) {
        if (color[r0]) continue;
        int d = 0;
        path[0] = r0; it[0] = 0; color[r0] = 1;
        while (d >= 0 && !rc) {
            int r = path[d];
            if (it[d] >= nr) { color[r] = 2; d--; continue; }
            int q = it[d]++;
            if (!adj[(size_t)r * nr + q]) continue;
            if (color[q] == 1) rc = sm_errf(e, "the constraint is left-recursive: rule %d can reach itself without reading a byte", q);
            else if (!color[q]) { color[q] = 1; path[++d] = q; it[d] = 0; }
        }
    }
out:
    free(nul); free(vis); free(stack); free(adj); free(color); free(path); free(it);
    return rc;
}

/* ---- stacks and configurations ------------------------------------------------------------- */

static int stk_rehash(sm_gram *g, int cap) {
    int *t = malloc(sizeof(int) * (size_t)cap);
    if (!t) return -1;
    for (int i = 0; i < cap; i++) t[i] = -1;
    for (int id = 1; id < g->nstk; id++) {
        uint32_t h = mix(((uint64_t)(uint32_t)g->stk_ret[id] << 32) | (uint32_t)g->stk_par[id]) & (uint32_t)(cap - 1);
        while (t[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
        t[h] = id;
    }
    free(g->stk_tab);
    g->stk_tab = t;
    g->stk_tab_cap = cap;
    return 0;
}

/* The id of stack node (ret, parent), interned; -2 on failure. */
static int stk_push(sm_gram *g, int ret, int par) {
    uint64_t key = ((uint64_t)(uint32_t)ret << 32) | (uint32_t)par;
    uint32_t m = (uint32_t)g->stk_tab_cap - 1, h = mix(key) & m;
    for (; g->stk_tab[h] >= 0; h = (h + 1) & m) {
        int id = g->stk_tab[h];
        if (g->stk_ret[id] == ret && g->stk_par[id] == par) return id;
    }
    int c = g->cap_stk;
    if (sm_grow((void **)&g->stk_ret, &c, g->nstk + 1, sizeof(int)) ||
        sm_grow((void **)&g->stk_par, &g->cap_stk, g->nstk + 1, sizeof(int)))
        return fail(g, "out of memory running the constraint");
    int id = g->nstk++;
    g->stk_ret[id] = ret;
    g->stk_par[id] = par;
    g->stk_tab[h] = id;
    if (g->nstk * 2 > g->stk_tab_cap && stk_rehash(g, g->stk_tab_cap * 2)) return fail(g, "out of memory running the constraint");
    return id;
}

/* Grow the seen set to cap slots, keeping this closure's pairs. */
static int seen_grow(sm_gram *g, int cap) {
    uint64_t *s = malloc(sizeof(uint64_t) * (size_t)cap);
    uint32_t *sg = calloc((size_t)cap, sizeof(uint32_t));
    if (!s || !sg) { free(s); free(sg); return -1; }
    uint32_t m = (uint32_t)cap - 1;
    for (int i = 0; i < g->seen_cap; i++) {
        if (g->seen_gen[i] != g->gen) continue;
        uint32_t h = mix(g->seen[i]) & m;
        while (sg[h] == 1) h = (h + 1) & m;
        s[h] = g->seen[i];
        sg[h] = 1;
    }
    free(g->seen); free(g->seen_gen);
    g->seen = s; g->seen_gen = sg; g->seen_cap = cap; g->gen = 1;
    return 0;
}

/* Visit pair (s, k) once per closure: 1 if new, 0 if seen, -1 out of memory. */
static int seen_add(sm_gram *g, int s, int k) {
    uint64_t key = ((uint64_t)(uint32_t)s << 32) | (uint32_t)k;
    if (2 * (g->seen_n + 1) > g->seen_cap && seen_grow(g, 2 * g->seen_cap)) return -1;
    uint32_t m = (uint32_t)g->seen_cap - 1, h = mix(key) & m;
    for (; g->seen_gen[h] == g->gen; h = (h + 1) & m)
        if (g->seen[h] == key) return 0;
    g->seen[h] = key;
    g->seen_gen[h] = g->gen;
    g->seen_n++;
    return 1;
}

static int push_work(sm_gram *g, int *nw, int s, int k) {
    int fresh = seen_add(g, s, k);
    if (fresh <= 0) return fresh;
    if (sm_grow((void **)&g->work, &g->cap_work, 2 * (*nw + 1), sizeof(int))) return -1;
    g->work[2 * *nw] = s;
    g->work[2 * *nw + 1] = k;
    (*nw)++;
    return 0;
}

static int cmp_pair(const void *a, const void *b) {
    const int *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static int cfg_rehash(sm_gram *g, int cap) {
    int *t = malloc(sizeof(int) * (size_t)cap);
    if (!t) return -1;
    for (int i = 0; i < cap; i++) t[i] = -1;
    for (int id = 0; id < g->ncfg; id++) {
        uint32_t h = g->cfg[id].hash & (uint32_t)(cap - 1);
        while (t[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
        t[h] = id;
    }
    free(g->cfg_tab);
    g->cfg_tab = t;
    g->cfg_tab_cap = cap;
    return 0;
}

/* The closure of the nw seed pairs in g->work as an interned configuration: its id,
 * SM_GRAM_DEAD when it keeps no thread, -2 on failure.  The caller has reset the seen set and
 * added the seeds through push_work. */
static int closure(sm_gram *g, int nw) {
    const sm_nfa *n = &g->n;
    int nout = 0, acc = 0, more = 0;
    for (int w = 0; w < nw; w++) {
        int s = g->work[2 * w], k = g->work[2 * w + 1];
        int r = n->rule_of[s];
        int keep = 0;
        /* at a rule's exit: accept (rule 0, empty stack) or return to the caller */
        if (r >= 0 && n->rule_out[r] == s) {
            if (k == 0) {
                if (r == 0) { acc = 1; keep = 1; }
            } else if (push_work(g, &nw, g->stk_ret[k], g->stk_par[k])) {
                return fail(g, "out of memory running the constraint");
            }
        }
        for (int e = n->first[s]; e >= 0; e = n->edges[e].next) {
            const sm_nfa_edge *d = &n->edges[e];
            if (d->to < 0) continue;
            if (d->kind == SM_NFA_BYTES) {
                keep = 1;
                more = 1;
            } else if (d->kind == SM_NFA_EPS) {
                if (push_work(g, &nw, d->to, k)) return fail(g, "out of memory running the constraint");
            } else {
                int k2 = stk_push(g, d->to, k);
                if (k2 < 0) return -2;
                if (push_work(g, &nw, n->rule_in[d->rule], k2)) return fail(g, "out of memory running the constraint");
            }
        }
        if (keep) {
            if (sm_grow((void **)&g->out, &g->cap_out, 2 * (nout + 1), sizeof(int))) return fail(g, "out of memory running the constraint");
            g->out[2 * nout] = s;
            g->out[2 * nout + 1] = k;
            nout++;
        }
    }
    if (!nout) return SM_GRAM_DEAD;
    qsort(g->out, (size_t)nout, 2 * sizeof(int), cmp_pair);
    /* intern */
    uint64_t hh = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 2 * nout; i++) hh = (hh ^ (uint32_t)g->out[i]) * 0x100000001b3ull;
    uint32_t hash = mix(hh), m = (uint32_t)g->cfg_tab_cap - 1, h = hash & m;
    for (; g->cfg_tab[h] >= 0; h = (h + 1) & m) {
        const cfg_t *c = &g->cfg[g->cfg_tab[h]];
        if (c->hash == hash && c->n == nout && !memcmp(g->thr + c->off, g->out, sizeof(int) * 2 * (size_t)nout))
            return g->cfg_tab[h];
    }
    if (g->ncfg >= SM_GRAM_MAX_CONFIGS) return fail(g, "the constraint's automaton grew past its configuration limit");
    if (sm_grow((void **)&g->cfg, &g->cap_cfg, g->ncfg + 1, sizeof(cfg_t)) ||
        sm_grow((void **)&g->thr, &g->cap_thr, g->nthr + 2 * nout, sizeof(int)))
        return fail(g, "out of memory running the constraint");
    int id = g->ncfg++;
    cfg_t *c = &g->cfg[id];
    c->off = g->nthr;
    c->n = nout;
    c->acc = acc;
    c->more = more;
    c->hash = hash;
    c->trans = NULL;
    c->slot = NULL;
    memcpy(g->thr + g->nthr, g->out, sizeof(int) * 2 * (size_t)nout);
    g->nthr += 2 * nout;
    g->cfg_tab[h] = id;
    if (g->ncfg * 2 > g->cfg_tab_cap && cfg_rehash(g, g->cfg_tab_cap * 2)) return fail(g, "out of memory running the constraint");
    return id;
}

/* Start a closure: an empty seen set (a new generation). */
static void begin(sm_gram *g) {
    g->seen_n = 0;
    if (++g->gen == 0) {
        memset(g->seen_gen, 0, sizeof(uint32_t) * (size_t)g->seen_cap);
        g->gen = 1;
    }
}

int sm_gram_create(sm_nfa *n, sm_gram **out, sm_err *e) {
    *out = NULL;
    if (sm_nfa_ok(n, e)) { sm_nfa_free(n); return -1; }
    if (n->nrules < 1 || n->rule_in[0] < 0) { sm_nfa_free(n); return sm_errf(e, "the constraint has no rule 0"); }
    for (int r = 0; r < n->nrules; r++)
        if (n->rule_in[r] < 0) { sm_nfa_free(n); return sm_errf(e, "the constraint calls rule %d, never defined", r); }
    sm_gram *g = calloc(1, sizeof *g);
    if (!g) { sm_nfa_free(n); return sm_errf(e, "out of memory compiling the constraint"); }
    g->n = *n;
    memset(n, 0, sizeof *n);
    if (prune(&g->n)) { sm_gram_free(g); return sm_errf(e, "out of memory compiling the constraint"); }
    if (left_recursion(&g->n, e)) { sm_gram_free(g); return -1; }
    g->nstk = 1;
    g->cap_stk = 0;
    g->stk_tab_cap = 0;
    if (sm_grow((void **)&g->stk_ret, &g->cap_stk, 64, sizeof(int)) || !(g->stk_par = malloc(sizeof(int) * (size_t)g->cap_stk)) ||
        stk_rehash(g, 256) || cfg_rehash(g, 256) || !(g->seen = malloc(sizeof(uint64_t) * 1024)) ||
        !(g->seen_gen = calloc(1024, sizeof(uint32_t)))) {
        sm_gram_free(g);
        return sm_errf(e, "out of memory compiling the constraint");
    }
    g->stk_ret[0] = g->stk_par[0] = -1;
    g->seen_cap = 1024;
    begin(g);
    int nw = 0;
    if (push_work(g, &nw, g->n.rule_in[0], 0)) { sm_gram_free(g); return sm_errf(e, "out of memory compiling the constraint"); }
    g->start = closure(g, nw);
    if (g->start == -2) { sm_errf(e, "%s", g->err.msg); sm_gram_free(g); return -1; }
    if (g->start == SM_GRAM_DEAD) { sm_gram_free(g); return sm_errf(e, "the constraint matches no string"); }
    *out = g;
    return 0;
}

void sm_gram_free(sm_gram *g) {
    if (!g) return;
    for (int i = 0; i < g->ncfg; i++) { free(g->cfg[i].trans); free(g->cfg[i].slot); }
    sm_nfa_free(&g->n);
    free(g->stk_ret); free(g->stk_par); free(g->stk_tab);
    free(g->thr); free(g->cfg); free(g->cfg_tab);
    free(g->work); free(g->out); free(g->seen); free(g->seen_gen);
    free(g);
}

int sm_gram_start(const sm_gram *g) { return g->start; }

const int *sm_gram_row(sm_gram *g, int cfg) {
    cfg_t *c = &g->cfg[cfg];
    if (!c->trans) {
        int *t = malloc(sizeof(int) * 256);
        if (!t) return NULL;
        for (int i = 0; i < 256; i++) t[i] = UNKNOWN;
        c->trans = t;
    }
    return c->trans;
}

int sm_gram_step(sm_gram *g, int cfg, uint8_t b) {
    if (cfg < 0 || cfg >= g->ncfg) return SM_GRAM_DEAD;
    cfg_t *c = &g->cfg[cfg];
    if (c->trans && c->trans[b] != UNKNOWN) return c->trans[b];
    if (g->failed) return -2;
    if (!sm_gram_row(g, cfg)) return fail(g, "out of memory running the constraint");
    /* the seeds: every byte edge of every thread that reads b (the config array may move while
     * the closure interns, so its threads are read before) */
    begin(g);
    int nw = 0, off = g->cfg[cfg].off, nt = g->cfg[cfg].n;
    for (int i = 0; i < nt; i++) {
        int s = g->thr[off + 2 * i], k = g->thr[off + 2 * i + 1];
        for (int e = g->n.first[s]; e >= 0; e = g->n.edges[e].next) {
            const sm_nfa_edge *d = &g->n.edges[e];
            if (d->to >= 0 && d->kind == SM_NFA_BYTES && d->lo <= b && b <= d->hi &&
                push_work(g, &nw, d->to, k))
                return fail(g, "out of memory running the constraint");
        }
    }
    int next = nw ? closure(g, nw) : SM_GRAM_DEAD;
    if (next == -2) return -2;
    g->cfg[cfg].trans[b] = next;
    return next;
}

int sm_gram_walk(sm_gram *g, int cfg, const uint8_t *s, size_t len) {
    for (size_t i = 0; i < len && cfg >= 0; i++) cfg = sm_gram_step(g, cfg, s[i]);
    return cfg;
}

int sm_gram_accepting(const sm_gram *g, int cfg) { return cfg >= 0 && cfg < g->ncfg && g->cfg[cfg].acc; }
int sm_gram_can_continue(sm_gram *g, int cfg) { return cfg >= 0 && cfg < g->ncfg && g->cfg[cfg].more; }
int sm_gram_nconfigs(const sm_gram *g) { return g->ncfg; }
const char *sm_gram_error(const sm_gram *g) { return g->err.msg; }
void *sm_gram_slot(const sm_gram *g, int cfg) { return cfg >= 0 && cfg < g->ncfg ? g->cfg[cfg].slot : NULL; }
void sm_gram_set_slot(sm_gram *g, int cfg, void *p) {
    if (cfg >= 0 && cfg < g->ncfg) g->cfg[cfg].slot = p;
}

void sm_gram_clear_slots(sm_gram *g) {
    for (int i = 0; i < g->ncfg; i++) {
        free(g->cfg[i].slot);
        g->cfg[i].slot = NULL;
    }
}

int sm_gram_matches(sm_gram *g, const uint8_t *s, size_t len) {
    return sm_gram_accepting(g, sm_gram_walk(g, g->start, s, len));
}
