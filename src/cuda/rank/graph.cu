/* graph.cu: CUDA graphs of verify / decode steps, one per row bucket (and logits wanted).
 *
 * A chunk of at most CB_GRAPH_ROWS rows is padded to the smallest bucket of
 * 8 16 24 32 48 64 96 128 rows and replays that bucket's graph, captured the first time the
 * bucket is seen (the chunk then runs eagerly once, which also warms every launcher up).  A
 * graph reads only the fixed metadata buffer, so a replay needs one metadata copy before it.
 * Padding rows get slot -1 (no KV write), position 0 and a block table of the zero page, so
 * their attention reads zeros and stays finite.  A graph that copies aux entries is bound to
 * their layer ids and to the aux buffer: another aux request, or a larger aux buffer, drops
 * it.  We rejected one graph per exact row count (too many captures, each costing a few ms)
 * and re-capturing per step with new pointers (capture costs more than the step it saves).
 */
#include "rank.h"
#include <string.h>

static int cb_bucket(int n) {
    for (int b = 0; b < SM_EXEC_NBUCKETS; b++)
        if (n <= sm_exec_bucket_rows(b)) return b;
    return -1;
}

int cb_bucket_rows(int n) { return sm_exec_bucket_rows(cb_bucket(n)); }

int cb_graph_form(const sm_step *s) {
    int run = 0;
    for (int i = 0; i < s->nrows; i++) {
        run = (i > 0 && s->req[i] == s->req[i - 1]) ? run + 1 : 1;
        if (run > CB_GRAPH_REQ_ROWS) return 0;
    }
    return 1;
}

void cb_graphs_drop(sm_cuda_rank *cr, int aux_only) {
    for (int b = 0; b < SM_EXEC_NBUCKETS; b++)
        for (int w = 0; w < 2; w++) {
            cb_graph *G = &cr->graphs[b][w];
            if (G->exec && (!aux_only || G->naux > 0)) {
                SM_CUDA_CHECK_PRINT(cudaGraphExecDestroy(G->exec));
                G->exec = NULL;
            }
        }
}

int cb_reserve_outputs(sm_cuda_rank *cr, int naux, int want_logits, int want_lp, sm_err *e) {
    if (naux > cr->aux_cap) {
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
        cb_graphs_drop(cr, 1); /* they hold the old aux pointer */
        if (cr->aux) SM_CUDA_CHECK(cudaFree(cr->aux));
        cr->aux = NULL;
        cr->aux_cap = 0;
        SM_CUDA_CHECK(cudaMalloc(&cr->aux, (size_t)naux * cr->cap * cr->cfg.H * 4));
        cr->aux_cap = naux;
    }
    if ((want_logits || want_lp) && !cr->logits) SM_CUDA_CHECK(cudaMalloc(&cr->logits, (size_t)CB_LOGIT_ROWS * cr->cfg.V * 4));
    if (want_lp && !cr->lps) {
        SM_CUDA_CHECK(cudaMalloc(&cr->lps, (size_t)cr->cap * sizeof(sm_lp_sum)));
        SM_CUDA_CHECK(cudaMallocHost((void **)&cr->h_lps, (size_t)cr->cap * sizeof(sm_lp_sum)));
    }
    return 0;
}

int cb_capture(sm_cuda_rank *cr, const cb_run *r, cudaGraphExec_t *out, sm_err *e) {
    *out = NULL;
    SM_CUDA_CHECK(cudaStreamBeginCapture(cr->st, cudaStreamCaptureModeRelaxed));
    int rc = cb_enqueue(cr, r, e);
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamEndCapture(cr->st, &g);
    if (rc) {
        if (g) cudaGraphDestroy(g);
        return sm_errprefix(e, "cuda graph capture (%d rows)", r->n);
    }
    if (ce != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return sm_errf(e, "cuda graph capture (%d rows, device %d): cudaStreamEndCapture: %s", r->n, cr->device,
                       cudaGetErrorString(ce));
    }
    ce = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        *out = NULL;
        return sm_errf(e, "cuda graph capture (%d rows, device %d): cudaGraphInstantiate: %s", r->n, cr->device,
                       cudaGetErrorString(ce));
    }
    return 0;
}

static int cb_same_aux(const cb_graph *g, const sm_step *s) {
    if (g->naux != s->naux) return 0;
    for (int a = 0; a < s->naux; a++)
        if (g->aux[a] != s->aux_layers[a]) return 0;
    return 1;
}

int cb_launch_graph(sm_cuda_rank *cr, const sm_step *s, size_t bytes, int nb, int *fresh, sm_err *e) {
    int bi = cb_bucket(nb), wl = s->logits || s->lp_at || s->mask; /* the graph keeps the logits on the device */
    cb_graph *G = &cr->graphs[bi][wl];
    *fresh = 0;
    if (G->exec && !cb_same_aux(G, s)) {
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
        SM_CUDA_CHECK(cudaGraphExecDestroy(G->exec));
        G->exec = NULL;
    }
    SM_CUDA_CHECK(cudaMemcpyAsync(cr->meta_d, cr->meta_h, bytes, cudaMemcpyHostToDevice, cr->st));
    if (G->exec) {
        SM_CUDA_CHECK(cudaGraphLaunch(G->exec, cr->st));
        return 0;
    }
    cb_run r = cb_run_step(cr, s, nb);
    r.logits_dev = wl ? cr->logits : NULL;
    r.mono = cb_exec_pick(cr, nb, e); /* plans the bucket's launches before the capture */
    if (r.mono < 0) return -1;
    /* first use: run eagerly (warms every launcher up), then capture for the next steps */
    if (cb_enqueue(cr, &r, e)) return -1;
    if (cb_capture(cr, &r, &G->exec, e)) return -1;
    G->naux = s->naux;
    for (int a = 0; a < s->naux; a++) G->aux[a] = s->aux_layers[a];
    *fresh = 1;
    return 0;
}

int cb_launch_bucket_eager(sm_cuda_rank *cr, const sm_step *s, size_t bytes, int nb, sm_err *e) {
    SM_CUDA_CHECK(cudaMemcpyAsync(cr->meta_d, cr->meta_h, bytes, cudaMemcpyHostToDevice, cr->st));
    cb_run r = cb_run_step(cr, s, nb);
    r.logits_dev = s->logits || s->lp_at || s->mask ? cr->logits : NULL;
    r.mono = cb_exec_pick(cr, nb, e); /* plans the bucket's launches on first use */
    if (r.mono < 0) return -1;
    return cb_enqueue(cr, &r, e);
}
