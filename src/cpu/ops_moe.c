/* ops_moe.c: the MoE ops of the CPU reference (ops.h): routing, the expert FFN over routes
 * grouped by expert, the post-expert norm, the route-ordered sum, and their compositions
 * (the GPU expert stage, the whole branch) (docs/model.md sections 6 and 9).
 *
 * The routes of a step are grouped by expert (a counting sort, stable in route id) so every
 * weight row of a touched expert is decoded once for all its routes; experts are split over
 * the threads, and each route's output lands in the row of its route id, so the grouping and
 * the thread count change nothing.  The same ops serve a rank holding whole experts (EP, the
 * single-rank backend and the GPU test references: y complete) and a rank holding a slice of
 * every expert along I (TP: y a partial sum the caller adds over ranks before the norm);
 * only the expert views (ref_experts) differ.  We rejected a per-route expert call: with 8
 * rows and K = 8 it would read an expert's weights up to 64 times instead of once.
 */
#include "cpu/ops.h"
#include "cpu/pool.h"
#include "model/codec.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---------------------------------------------------------------- routing */

void ref_topk(const sm_config *c, const float *logits, const float *bias, int *idx, float *w) {
    int E = c->E, K = c->K;
    /* top-K of sigmoid(logit * m_o) + bias, descending, ties to the lowest id */
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= idx[j] == e;
            if (used) continue;
            float v = sigmoidf_(logits[e] * c->out_mult) + bias[e];
            if (best < 0 || v > bv) { best = e; bv = v; }
        }
        idx[k] = best;
    }
    /* weights: the selected scores (bias-free) normalized, times route_scale */
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += sigmoidf_(logits[idx[k]] * c->out_mult);
    for (int k = 0; k < K; k++) w[k] = sigmoidf_(logits[idx[k]] * c->out_mult) / (sum + 1e-15f) * c->route_scale;
}

void ref_route(struct sm_pool *p, const sm_config *c, const float *xf, int n, const float *router, const float *bias,
               float *logits, int *idx, float *w) {
    /* router logits: f32 x f32, f32 accumulation, not rounded */
    ref_mm_f32(p, xf, n, c->H, router, c->E, logits);
    for (int i = 0; i < n; i++)
        ref_topk(c, logits + (int64_t)i * c->E, bias, idx + (int64_t)i * c->K, w + (int64_t)i * c->K);
}

/* ---------------------------------------------------------------- expert views, workspace */

ref_experts ref_experts_of_shard(const sm_shard_experts *X) {
    ref_experts r = {X->fmt, X->e0, X->ne, X->ni, X->gate, X->up, X->down, 0, X->act_mx};
    return r;
}

/* Whole experts [e0, e0 + ne) of layer l of m: views[j] the gate_up matrix of expert e0 + j
 * (gate rows 0.., up rows I..), views[ne + j] its down matrix. */
static ref_experts whole_experts(const sm_model *m, int l, int e0, int ne, sm_shard_mat *views) {
    const sm_config *c = &m->cfg;
    const sm_experts *x = &m->layers[l].ex;
    for (int j = 0; j < ne; j++) {
        views[j] = (sm_shard_mat){x->gu[e0 + j], x->gus[e0 + j], c->Hm};
        views[ne + j] = (sm_shard_mat){x->dn[e0 + j], x->dns[e0 + j], c->I};
    }
    ref_experts r = {x->fmt, e0, ne, c->I, views, views, views + ne, c->I, x->act_mx};
    return r;
}

void ref_moe_ws_free(ref_moe_ws *ws) {
    free(ws->gu); free(ws->act); free(ws->y);
    free(ws->slot_route); free(ws->slot_row);
    free(ws->off); free(ws->cur); free(ws->active);
    free(ws->hq.v); free(ws->hq.s); free(ws->aq.v); free(ws->aq.s);
    memset(ws, 0, sizeof *ws);
}

int ref_moe_ws_reserve(ref_moe_ws *ws, int routes, int ne, int ni, int Hm, sm_err *e) {
    if (ws->cap >= routes && ws->ne >= ne && ws->ni >= ni && ws->Hm >= Hm) return 0;
    if (ws->cap > routes) routes = ws->cap;
    if (ws->ne > ne) ne = ws->ne;
    if (ws->ni > ni) ni = ws->ni;
    if (ws->Hm > Hm) Hm = ws->Hm;
    ref_moe_ws_free(ws);
    size_t R = (size_t)routes;
    ws->gu = malloc(sizeof(float) * R * 2 * (size_t)ni);
    ws->act = malloc(sizeof(float) * R * (size_t)ni);
    ws->y = malloc(sizeof(float) * R * (size_t)Hm);
    ws->slot_route = malloc(sizeof(int) * R);
    ws->slot_row = malloc(sizeof(int) * R);
    ws->off = malloc(sizeof(int) * ((size_t)ne + 1));
    ws->cur = malloc(sizeof(int) * (size_t)ne);
    ws->active = malloc(sizeof(int) * (size_t)ne);
    /* W4A4 rows (ni, Hm multiples of 32 whenever used) */
    ws->hq = (ref_mxrows){malloc(sizeof(float) * R * (size_t)Hm), malloc(R * (size_t)(Hm / SM_MX_BLOCK + 1)), Hm};
    ws->aq = (ref_mxrows){malloc(sizeof(float) * R * (size_t)ni), malloc(R * (size_t)(ni / SM_MX_BLOCK + 1)), ni};
    if (!ws->gu || !ws->act || !ws->y || !ws->slot_route || !ws->slot_row || !ws->off || !ws->cur || !ws->active ||
        !ws->hq.v || !ws->hq.s || !ws->aq.v || !ws->aq.s) {
        ref_moe_ws_free(ws);
        return sm_errf(e, "cpu moe: out of memory for the workspace of %d routes", routes);
    }
    ws->cap = routes; ws->ne = ne; ws->ni = ni; ws->Hm = Hm;
    return 0;
}

/* ---------------------------------------------------------------- experts */

int ref_moe_group(ref_moe_ws *ws, const int *idx, int nroutes, int K, int e0, int ne) {
    /* slots per held expert (routes of other experts get none) */
    for (int j = 0; j <= ne; j++) ws->off[j] = 0;
    for (int r = 0; r < nroutes; r++)
        if (idx[r] >= e0 && idx[r] < e0 + ne) ws->off[idx[r] - e0 + 1]++;
    ws->nact = 0;
    for (int j = 0; j < ne; j++) {
        if (ws->off[j + 1]) ws->active[ws->nact++] = j;
        ws->off[j + 1] += ws->off[j];
    }
    /* place the routes in route id order */
    for (int j = 0; j < ne; j++) ws->cur[j] = ws->off[j];
    for (int r = 0; r < nroutes; r++)
        if (idx[r] >= e0 && idx[r] < e0 + ne) {
            int s = ws->cur[idx[r] - e0]++;
            ws->slot_route[s] = r;
            ws->slot_row[s] = r / K;
        }
    return ws->off[ne];
}

/* The FFN of held expert j over its slots [off[j], off[j + 1]) (ref_moe_ffn). */
static void expert_ffn(const ref_experts *X, int j, const float *h1, int Hm, ref_moe_ws *ws) {
    int ni = X->ni, s0 = ws->off[j], ns = ws->off[j + 1] - s0;
    float *gu = ws->gu + (int64_t)s0 * 2 * ni, *act = ws->act + (int64_t)s0 * ni;
    /* gu = h1 . gate rows, then up rows, each decoded once for all the expert's routes
     * (W4A4: the MXFP4 h1 rows, ref_moe_ffn) */
    for (int o = 0; o < 2 * ni; o++) {
        ref_wrow w = o < ni ? ref_wrow_view(X->fmt, &X->gate[j], o) : ref_wrow_view(X->fmt, &X->up[j], X->up0 + o - ni);
        if (X->act_mx) ref_wrow_dot_mx(&w, Hm, &ws->hq, ws->slot_row + s0, ns, gu + o, 2 * ni, NULL);
        else ref_wrow_dot(&w, Hm, h1, Hm, ws->slot_row + s0, ns, gu + o, 2 * ni, NULL);
    }
    /* a = r16(silu(r16 gate) * r16 up) */
    for (int s = 0; s < ns; s++) {
        const float *g = gu + (int64_t)s * 2 * ni;
        float *as = act + (int64_t)s * ni;
        for (int i = 0; i < ni; i++) {
            float gg = sm_r16(g[i]), uu = sm_r16(g[ni + i]);
            as[i] = sm_r16(gg * sigmoidf_(gg) * uu);
        }
    }
    /* y[route] = a . down rows (complete, or partial over the slice), not rounded; W4A4:
     * aq = Q(a) by slot, the bf16-rounded a rounded to MXFP4 */
    if (X->act_mx)
        for (int s = 0; s < ns; s++) ref_mx_round_row(act + (int64_t)s * ni, ni, &ws->aq, s0 + s);
    for (int o = 0; o < Hm; o++) {
        ref_wrow w = ref_wrow_view(X->fmt, &X->down[j], o);
        if (X->act_mx) { /* the expert's slots' rows of aq */
            ref_mxrows aq = {ws->aq.v + (int64_t)s0 * ws->aq.ld, ws->aq.s + (int64_t)s0 * (ws->aq.ld / SM_MX_BLOCK), ws->aq.ld};
            ref_wrow_dot_mx(&w, ni, &aq, NULL, ns, ws->y + o, Hm, ws->slot_route + s0);
        } else {
            ref_wrow_dot(&w, ni, act, ni, NULL, ns, ws->y + o, Hm, ws->slot_route + s0);
        }
    }
}

/* Pool job of ref_moe_ffn: a chunk of the active experts. */
typedef struct ffn_job { const ref_experts *X; const float *h1; int Hm; ref_moe_ws *ws; } ffn_job;

static void ffn_chunk(void *arg, int64_t lo, int64_t hi, int tid) {
    (void)tid;
    const ffn_job *j = arg;
    for (int64_t t = lo; t < hi; t++) expert_ffn(j->X, j->ws->active[t], j->h1, j->Hm, j->ws);
}

void ref_moe_ffn(struct sm_pool *p, const ref_experts *X, const float *h1, int Hm, ref_moe_ws *ws) {
    /* W4A4: h1q = Q(h1), each token row once (rows are at most the slots) */
    if (X->act_mx) {
        int rows = 0, ns = ws->off[X->ne];
        for (int s = 0; s < ns; s++)
            if (ws->slot_row[s] + 1 > rows) rows = ws->slot_row[s] + 1;
        ws->hq.ld = Hm;
        for (int r = 0; r < rows; r++) ref_mx_round_row(h1 + (int64_t)r * Hm, Hm, &ws->hq, r);
    }
    ffn_job j = {X, h1, Hm, ws};
    sm_pool_for(p, ws->nact, 1, ffn_chunk, &j);
}

void ref_expert_norm(const float *pn, int Hm, float post_eps, float *y) {
    /* t = r16(r16(y) * eff(post_expert_norm)) */
    for (int i = 0; i < Hm; i++) y[i] = sm_r16(sm_r16(y[i]) * pn[i]);
    /* yn = t * rsqrt(mean(t^2) + post_eps), f32 */
    float rs = 1.0f / sqrtf(ref_dot(y, y, Hm) / (float)Hm + post_eps);
    for (int i = 0; i < Hm; i++) y[i] *= rs;
}

void ref_route_sum(const float *yn, const float *w, const int *idx, int e0, int ne, int n, int K, int Hm, float *m) {
    for (int i = 0; i < n; i++) {
        float *mi = m + (int64_t)i * Hm;
        for (int x = 0; x < Hm; x++) mi[x] = 0.0f;
        for (int k = 0; k < K; k++) {
            int64_t r = (int64_t)i * K + k;
            if (idx && (idx[r] < e0 || idx[r] >= e0 + ne)) continue;
            const float *y = yn + r * Hm;
            float wk = w[r];
            for (int x = 0; x < Hm; x++) mi[x] += wk * y[x];
        }
    }
}

/* ---------------------------------------------------------------- compositions */

int ref_moe_experts(struct sm_pool *p, const sm_model *m, int l, const float *h1, const int *idx, const float *w,
                    int n, float *m_out, sm_err *e) {
    const sm_config *c = &m->cfg;
    ref_moe_ws ws;
    memset(&ws, 0, sizeof ws);
    sm_shard_mat *views = malloc(sizeof *views * 2 * (size_t)c->E);
    if (!views) return sm_errf(e, "cpu moe: out of memory for %d expert views", 2 * c->E);
    if (ref_moe_ws_reserve(&ws, n * c->K, c->E, c->I, c->Hm, e)) {
        free(views);
        return -1;
    }
    ref_experts X = whole_experts(m, l, 0, c->E, views);
    /* group the routes by expert, run every touched expert over its routes */
    int ns = ref_moe_group(&ws, idx, n * c->K, c->K, 0, c->E);
    ref_moe_ffn(p, &X, h1, c->Hm, &ws);
    /* post-expert norm of every route, then m = r16(sum_k w_k yn_k) in route order */
    for (int s = 0; s < ns; s++)
        ref_expert_norm(m->layers[l].post_expert_norm, c->Hm, c->post_eps, ws.y + (int64_t)ws.slot_route[s] * c->Hm);
    ref_route_sum(ws.y, w, idx, 0, c->E, n, c->K, c->Hm, m_out);
    ref_round(m_out, (int64_t)n * c->Hm);
    ref_moe_ws_free(&ws);
    free(views);
    return 0;
}

void ref_expert(const sm_model *m, int l, int e, const float *h1, float *yn) {
    const sm_config *c = &m->cfg;
    ref_moe_ws ws;
    memset(&ws, 0, sizeof ws);
    sm_shard_mat views[2];
    if (ref_moe_ws_reserve(&ws, 1, 1, c->I, c->Hm, NULL)) {
        for (int i = 0; i < c->Hm; i++) yn[i] = NAN; /* out of memory */
        return;
    }
    /* one slot: route 0 of row 0 on expert e */
    ref_experts X = whole_experts(m, l, e, 1, views);
    ref_moe_group(&ws, &e, 1, 1, e, 1);
    ref_moe_ffn(NULL, &X, h1, c->Hm, &ws);
    memcpy(yn, ws.y, sizeof(float) * (size_t)c->Hm);
    ref_expert_norm(m->layers[l].post_expert_norm, c->Hm, c->post_eps, yn);
    ref_moe_ws_free(&ws);
}

void ref_moe(struct sm_pool *p, const sm_model *m, int l, const float *xf, int n, float *f, int *idx, float *w,
             float *h1, float *m_out) {
    const sm_config *c = &m->cfg;
    const sm_layer *L = &m->layers[l];
    size_t nK = (size_t)n * c->K, nHm = (size_t)n * c->Hm;
    float *lg = malloc(sizeof(float) * (size_t)n * c->E), *wb = malloc(sizeof(float) * nK);
    float *hb = malloc(sizeof(float) * nHm), *mb = malloc(sizeof(float) * nHm);
    int *ib = malloc(sizeof(int) * nK);
    int ok = lg && wb && hb && mb && ib;
    if (ok) {
        /* routes and weights */
        ref_route(p, c, xf, n, L->router, L->router_bias, lg, ib, wb);
        /* h1 = r16(rms(mm(xf, pooler), eff(pre_expert_norm))) */
        ref_mm(p, xf, n, c->H, L->pooler, c->Hm, hb);
        ref_rms(hb, n, c->Hm, L->pre_expert_norm, c->rms_eps, 1, hb);
        /* m = r16(sum_k w_k yn_k), then f = mm(m, unpooler) */
        ok = ref_moe_experts(p, m, l, hb, ib, wb, n, mb, NULL) == 0;
        if (ok) ref_mm(p, mb, n, c->Hm, L->unpooler, c->H, f);
    }
    if (ok && idx) memcpy(idx, ib, sizeof(int) * nK);
    if (ok && w) memcpy(w, wb, sizeof(float) * nK);
    if (ok && h1) memcpy(h1, hb, sizeof(float) * nHm);
    if (ok && m_out) memcpy(m_out, mb, sizeof(float) * nHm);
    if (!ok)
        for (int64_t i = 0; i < (int64_t)n * c->H; i++) f[i] = NAN; /* out of memory */
    free(lg); free(wb); free(hb); free(mb); free(ib);
}

void ref_expert_row(const sm_model *m, int l, int e, int which, int row, float *out) {
    const sm_config *c = &m->cfg;
    const sm_experts *x = &m->layers[l].ex;
    sm_shard_mat v = which ? (sm_shard_mat){x->dn[e], x->dns[e], c->I} : (sm_shard_mat){x->gu[e], x->gus[e], c->Hm};
    ref_wrow w = ref_wrow_view(x->fmt, &v, row);
    ref_wrow_decode(&w, which ? c->I : c->Hm, out);
}
