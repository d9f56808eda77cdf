/* step.cu: the backend's step entry (backend.h: sm_backend.step) on one rank's context.
 *
 * A step is: check it (step.h: the one validator), pack its metadata (tokens, positions,
 * slots, per-row block-table index, the block tables of its requests) into the pinned
 * staging buffer, copy it with one async copy into the fixed device buffer, enqueue the math
 * (forward.cu), copy argmax (logits: every row, or the rows sm_step.logits_at asks for, aux)
 * back and wait.  Two forms, chosen from the shape:
 *  - verify / decode (no run of one request longer than CB_GRAPH_REQ_ROWS = 16 rows): chunks
 *    of at most CB_GRAPH_ROWS = 128 rows, each replaying its bucket's graph (graph.cu);
 *  - prefill (a longer run of one request): eager, in chunks of `cap` rows, the prefill
 *    attention kernel for each long run, cuBLAS (inside sm_k_mm) when a chunk has many rows.
 * A chunk's K/V writes land before the next chunk's attention (one stream), so a request
 * split across chunks sees all its earlier rows.  The engine never sends a verify step wider
 * than the backend's max_verify_rows (16) a request: the backend refuses such an engine at
 * creation (sm_backend_opts.verify_rows), so no verify step falls onto the eager path.
 * We rejected eager execution of wide verify steps: it is several times slower than a replay
 * and would be a silent slow path.
 */
#include "rank.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t cb_pack(sm_cuda_rank *cr, const sm_step *s, int r0, int n, int nb) {
    char *h = (char *)cr->meta_h;
    char *d = (char *)cr->meta_d;
    int64_t *slot = (int64_t *)(h + ((char *)cr->d_slot - d));
    int *tok = (int *)(h + ((char *)cr->d_tok - d));
    int *pos = (int *)(h + ((char *)cr->d_pos - d));
    int *rreq = (int *)(h + ((char *)cr->d_rreq - d));
    int *tab = (int *)(h + cr->off_tab);
    const sm_kv *kv = s->kv;
    const int bpr = cr->kvs.max_bpr;
    int nt = 0;
    for (int i = 0; i < n; i++) {
        int r = s->req[r0 + i], p = s->pos[r0 + i];
        if (cr->tab_of_req[r] < 0) {
            cr->tab_of_req[r] = nt;
            memcpy(tab + (size_t)nt * bpr, kv->tables + (size_t)r * kv->max_bpr, sizeof(int) * (size_t)bpr);
            nt++;
        }
        tok[i] = s->tokens[r0 + i];
        pos[i] = p;
        slot[i] = sm_kv_slot(kv, r, p);
        rreq[i] = cr->tab_of_req[r];
    }
    for (int i = 0; i < n; i++) cr->tab_of_req[s->req[r0 + i]] = -1;
    if (nb > n) {
        /* padding rows: token 0 at position 0, no KV write, a table of zero pages */
        for (int b = 0; b < bpr; b++) tab[(size_t)nt * bpr + b] = cr->kvs.nblocks;
        for (int i = n; i < nb; i++) { tok[i] = 0; pos[i] = 0; slot[i] = -1; rreq[i] = nt; }
        nt++;
    }
    return cr->off_tab + (size_t)nt * bpr * 4;
}

/* Attention plan of rows [r0, r0 + n) of s: long runs of one request -> prefill kernel,
 * the rows between them -> generic calls. */
static int cb_plan(const sm_step *s, int r0, int n, sm_exec_att *att) {
    int na = 0, i = 0;
    while (i < n) {
        int j = i + 1;
        while (j < n && s->req[r0 + j] == s->req[r0 + i] && s->pos[r0 + j] == s->pos[r0 + j - 1] + 1) j++;
        if (j - i > CB_GRAPH_REQ_ROWS) {
            sm_exec_att *it = &att[na++];
            it->kind = 1;
            it->r0 = i;
            it->cnt = j - i;
            it->pos0 = s->pos[r0 + i];
            it->tab = -1; /* filled by the caller from the packed rreq */
            it->max_ctx = 0;
        } else {
            int mx = 0;
            for (int t = i; t < j; t++) if (s->pos[r0 + t] + 1 > mx) mx = s->pos[r0 + t] + 1;
            if (na > 0 && att[na - 1].kind == 0 && att[na - 1].r0 + att[na - 1].cnt == i) {
                att[na - 1].cnt += j - i;
                if (mx > att[na - 1].max_ctx) att[na - 1].max_ctx = mx;
            } else {
                sm_exec_att *it = &att[na++];
                it->kind = 0;
                it->r0 = i;
                it->cnt = j - i;
                it->pos0 = 0;
                it->tab = -1;
                it->max_ctx = mx;
            }
        }
        i = j;
    }
    return na;
}

/* Enqueue rows [r0, r0 + n) of s eagerly (metadata copy included). */
static int cb_launch_eager(sm_cuda_rank *cr, const sm_step *s, int r0, int n, sm_exec_att *att, sm_err *e) {
    size_t bytes = cb_pack(cr, s, r0, n, n);
    int na = cb_plan(s, r0, n, att);
    const int *rreq_h = (const int *)((char *)cr->meta_h + ((char *)cr->d_rreq - (char *)cr->meta_d));
    for (int i = 0; i < na; i++)
        if (att[i].kind == 1) att[i].tab = rreq_h[att[i].r0];
    SM_CUDA_CHECK(cudaMemcpyAsync(cr->meta_d, cr->meta_h, bytes, cudaMemcpyHostToDevice, cr->st));
    cb_run r = cb_run_step(cr, s, n);
    r.logits_host = !s->logits ? NULL : s->logits_at ? s->logits : s->logits + (size_t)r0 * cr->cfg.V;
    r.logits_at = s->logits && s->logits_at ? s->logits_at + r0 : NULL;
    r.lp_at = s->lp_at ? s->lp_at + r0 : NULL;
    r.lp_k = s->lp_k;
    r.lp_tok = s->lp_tok ? s->lp_tok + r0 : NULL;
    r.mask = s->mask ? s->mask + r0 : NULL;
    r.att = att;
    r.natt = na;
    return cb_enqueue(cr, &r, e);
}

int cb_logits_to_host(sm_cuda_rank *cr, const float *dev, int n, const int *at, float *host, sm_err *e) {
    const size_t V = (size_t)cr->cfg.V;
    if (!at) {
        SM_CUDA_CHECK(cudaMemcpyAsync(host, dev, (size_t)n * V * 4, cudaMemcpyDeviceToHost, cr->st));
        return 0;
    }
    for (int i = 0; i < n;) {
        if (at[i] < 0) { i++; continue; }
        int j = i + 1;
        while (j < n && at[j] == at[i] + (j - i)) j++; /* rows i..j-1 go to consecutive rows */
        SM_CUDA_CHECK(cudaMemcpyAsync(host + (size_t)at[i] * V, dev + (size_t)i * V, (size_t)(j - i) * V * 4,
                                      cudaMemcpyDeviceToHost, cr->st));
        i = j;
    }
    return 0;
}

int cb_mask(sm_cuda_rank *cr, const uint32_t *const *mask, int n, float *dev, int *am, sm_err *e) {
    const int V = cr->cfg.V, words = (V + 31) / 32;
    int rows[SM_MASK_ROWS], midx[SM_MASK_ROWS], m = 0, nm = 0;
    const uint32_t *seen[SM_MASK_ROWS];
    for (int i = 0; i < n && i < SM_MASK_ROWS; i++) {
        if (!mask[i]) continue;
        /* each distinct mask once in the staging buffer (a request's rows often share one) */
        int j = 0;
        while (j < nm && seen[j] != mask[i]) j++;
        if (j == nm) {
            if (!cr->mask_d) {
                SM_CUDA_CHECK(cudaMalloc(&cr->mask_d, (size_t)SM_MASK_ROWS * words * 4));
                SM_CUDA_CHECK(cudaMallocHost((void **)&cr->mask_h, (size_t)SM_MASK_ROWS * words * 4));
            }
            seen[nm++] = mask[i];
        }
        rows[m] = i;
        midx[m++] = j;
    }
    if (!m) return 0;
    /* the pinned staging may still feed an earlier chunk's copy of this step: wait for it first */
    if (cr->mask_busy) SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
    cr->mask_busy = 1;
    for (int j = 0; j < nm; j++) memcpy(cr->mask_h + (size_t)j * words, seen[j], (size_t)words * 4);
    SM_CUDA_CHECK(cudaMemcpyAsync(cr->mask_d, cr->mask_h, (size_t)nm * words * 4, cudaMemcpyHostToDevice, cr->st));
    if (sm_k_mask_rows(&cr->kc, dev, (size_t)V, V, cr->cfg.vocab_used, cr->mask_d, words, rows, midx, m, am, cr->st, e))
        return sm_errprefix(e, "cuda step: constraint masks");
    return 0;
}

int cb_logprobs(sm_cuda_rank *cr, const int *at, const int *tok, int n, int k, int *ord, sm_err *e) {
    int rows[CB_LOGIT_ROWS], toks[CB_LOGIT_ROWS], m = 0;
    for (int i = 0; i < n && i < CB_LOGIT_ROWS; i++)
        if (at[i] >= 0) {
            toks[m] = tok ? tok[i] : -1;
            rows[m++] = i;
        }
    if (sm_k_logprobs(&cr->kc, cr->logits, (size_t)cr->cfg.V, rows, toks, m, cr->cfg.vocab_used, k, cr->lps + *ord, cr->st, e))
        return sm_errprefix(e, "cuda step: logprobs");
    *ord += m;
    return 0;
}

/* Copy argmax (and aux, and, graph form, the logits: every row, or the rows logits_at asks
 * for; and the logprob summaries lp_at asks for) of rows [r0, r0 + n) back and wait for the
 * step.  The eager form made its summaries in cb_head. */
static int cb_collect(sm_cuda_rank *cr, const sm_step *s, int r0, int n, int graph, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    const int out = cr->rank == 0; /* world > 1: the replicated outputs go to the host from rank 0 */
    /* graph form: the constraint masks on the replayed logits, before anything reads them (the
     * eager form masked them in cb_head) */
    if (graph && s->mask && out && cb_mask(cr, s->mask + r0, n, cr->logits, cr->am, e)) return -1;
    SM_CUDA_CHECK(cudaMemcpyAsync(cr->h_am, cr->am, (size_t)n * 4, cudaMemcpyDeviceToHost, cr->st));
    if (graph && s->logits && out &&
        cb_logits_to_host(cr, cr->logits, n, s->logits_at ? s->logits_at + r0 : NULL,
                          s->logits_at ? s->logits : s->logits + (size_t)r0 * cf->V, e))
        return -1;
    int nlp = 0; /* summaries of this run's rows, in row order in cr->lps */
    if (s->lp_at && out) {
        if (graph) {
            if (cb_logprobs(cr, s->lp_at + r0, s->lp_tok ? s->lp_tok + r0 : NULL, n, s->lp_k, &nlp, e)) return -1;
        } else {
            for (int i = 0; i < n; i++) nlp += s->lp_at[r0 + i] >= 0;
        }
        if (nlp)
            SM_CUDA_CHECK(cudaMemcpyAsync(cr->h_lps, cr->lps, (size_t)nlp * sizeof(sm_lp_sum), cudaMemcpyDeviceToHost, cr->st));
    }
    for (int a = 0; a < s->naux && out; a++)
        SM_CUDA_CHECK(cudaMemcpyAsync(s->aux + ((size_t)a * s->nrows + r0) * cf->H, cr->aux + (size_t)a * cr->cap * cf->H,
                                      (size_t)n * cf->H * 4, cudaMemcpyDeviceToHost, cr->st));
    if (cb_exec_health_fetch(cr, e)) return -1;
    if (cr->gc && sm_gcomm_health_fetch(cr->gc, cr->st, e)) return -1;
    cudaError_t r = cudaStreamSynchronize(cr->st);
    if (r != cudaSuccess) return sm_errf(e, "cuda step: the step failed on device %d: %s", cr->device, cudaGetErrorString(r));
    cr->mask_busy = 0;
    if (cb_exec_health_check(cr, e)) return sm_errprefix(e, "cuda step");
    if (cr->gc && sm_gcomm_health_check(cr->gc, e)) return sm_errprefix(e, "cuda step");
    if (s->argmax && out) memcpy(s->argmax + r0, cr->h_am, (size_t)n * 4);
    for (int i = 0, j = 0; nlp && i < n; i++) /* the summaries to the slots lp_at names */
        if (s->lp_at[r0 + i] >= 0) s->lp[s->lp_at[r0 + i]] = cr->h_lps[j++];
    return 0;
}

/* Verify / decode form: chunks of at most CB_GRAPH_ROWS rows, each a graph replay (eager: the
 * same bucket run without a graph). */
static int cb_step_graphs(sm_cuda_rank *cr, const sm_step *s, int eager, sm_err *e) {
    for (int r0 = 0; r0 < s->nrows; r0 += CB_GRAPH_ROWS) {
        int n = s->nrows - r0 < CB_GRAPH_ROWS ? s->nrows - r0 : CB_GRAPH_ROWS;
        int nb = cb_bucket_rows(n), fresh;
        size_t bytes = cb_pack(cr, s, r0, n, nb);
        if ((eager ? cb_launch_bucket_eager(cr, s, bytes, nb, e) : cb_launch_graph(cr, s, bytes, nb, &fresh, e)) ||
            cb_collect(cr, s, r0, n, 1, e))
            return -1;
        cr->last_nb = nb;
        cr->last_graph = !eager;
    }
    return 0;
}

/* Prefill form: eager chunks of cap rows. */
static int cb_step_eager(sm_cuda_rank *cr, const sm_step *s, sm_err *e) {
    sm_exec_att *att = (sm_exec_att *)malloc(sizeof(sm_exec_att) * (size_t)cr->cap);
    if (!att) return sm_errf(e, "cuda step: out of host memory");
    int rc = 0;
    for (int r0 = 0; r0 < s->nrows && !rc; r0 += cr->cap) {
        int n = s->nrows - r0 < cr->cap ? s->nrows - r0 : cr->cap;
        rc = cb_launch_eager(cr, s, r0, n, att, e) || cb_collect(cr, s, r0, n, 0, e) ? -1 : 0;
        if (!rc) {
            cr->last_nb = n;
            cr->last_graph = 0;
        }
    }
    free(att);
    return rc;
}

int cb_step_run(sm_cuda_rank *cr, const sm_step *s, sm_err *e) {
    if (s->nrows == 0) return 0;
    if (cb_enter(cr, e) || cb_reserve_outputs(cr, s->naux, s->logits != NULL || s->mask != NULL, s->lp_at != NULL, e)) return -1;
    const int gf = cb_graph_form(s), graphs = gf && !cr->eager_only;
    /* virtual ranks: the bucket's run without a graph, the very launches a graph of distinct
     * devices replays (the prefill form would split the matmuls and the attention keys of the
     * same rows otherwise, so the monokernel world and the stock world would differ in bits) */
    const int bucketed = gf && cr->eager_only;
    if (!graphs && !bucketed && cr->mono_mode != SM_MONO_OFF && cr->mono.ctx && !cr->logged_eager) {
        cr->logged_eager = 1; /* once: the monokernel takes graph-form buckets only */
        fprintf(stderr, "sparkmono: stock step (a prefill row in the step)\n");
    }
    int rc = graphs || bucketed ? cb_step_graphs(cr, s, bucketed, e) : cb_step_eager(cr, s, e);
    if (rc) cudaStreamSynchronize(cr->st); /* leave nothing of a failed step in flight */
    return rc;
}

int cb_step(void *vctx, const sm_step *s, sm_err *e) {
    sm_cuda_rank *cr = (sm_cuda_rank *)vctx;
    if (sm_step_check(&cr->cfg, &cr->kvs, s, "cuda step", e)) return -1;
    return cb_step_run(cr, s, e);
}
