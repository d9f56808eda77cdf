/* moe_shards.cu: the MoE expert stage of W ranks (moe.cu's group): each rank's shard
 * of a made model (sm_shard_make) uploaded with sm_cuda_moe_upload_shard and read back bit for
 * bit against its views; its forward_ep / forward_tp against the CPU rank's partial
 * (ref_moe_group + ref_moe_ffn on the shard's views, then ref_expert_norm + ref_route_sum for
 * EP, as cpu/layer.c does), under both schedules of the expert matmul (the same bits); the
 * rank-order sum of the partials (on the host) rounded (EP) or through sm_cuda_moe_finalize
 * (TP) against the single-rank GPU forward and the CPU m.  Comparisons go through harness.h
 * (relative L2 and per-element bounds, guarded poisoned partials); W = 2 and 4, EP and TP,
 * MXFP4 / BF16 / FP8 layers of mini, and the shard refusals.  We rejected one file with
 * moe.cu: 1,000 lines.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <algorithm>
#include <cuda_runtime.h>
extern "C" {
#include "base/err.h"
#include "model/config.h"
#include "model/weights.h"
#include "parallel/shard.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
}
#include "model/codec.h"
#include "cuda/moe/moe.h"
#include "harness.h"
#include "moe_cases.h"

/* ---- W ranks: shards of a made model ---- */

/* ||got - ref|| / ||ref|| through the harness; NaNs counted in *nan, the worst element's
 * error (of its size + the rms) raised into *elem. */
static double rel_err(const float *got, const float *ref, size_t n, long *nan, double *elem) {
    gh_acc a = GH_ACC_INIT;
    gh_acc_add(&a, got, ref, n);
    *nan += a.nan;
    if (a.elem > *elem) *elem = a.elem;
    return gh_acc_rel(&a);
}

/* Every row of matrix mat of local experts 0 and ne - 1 of shard layer L, read back through
 * the dequantizers, against the shard's views (sm_shard_mat_row), bit for bit; returns the
 * mismatches (the first few printed), or -1 on a CUDA error. */
static long cmp_shard_expert(const sm_cuda_moe_layer *L, const sm_shard_experts *X) {
    const int Hm = L->Hm, ni = L->I;
    const size_t most = (size_t)2 * ni * Hm;
    float *dout = NULL, *hout = (float *)xmalloc(sizeof(float) * most);
    float *ref = (float *)xmalloc(sizeof(float) * (size_t)std::max(Hm, ni));
    long bad = cudaMalloc((void **)&dout, sizeof(float) * most) == cudaSuccess ? 0 : -1;
    const int xs[2] = {0, X->ne - 1};
    for (int xi = 0; xi < 2 && bad >= 0; xi++)
        for (int mat = 0; mat < 2 && bad >= 0; mat++) {
            sm_err e = {{0}};
            const int R = mat ? Hm : 2 * ni, K = mat ? ni : Hm, x = xs[xi];
            const size_t nb = sizeof(float) * (size_t)R * K;
            if (cudaMemsetAsync(dout, 0xFF, nb, m_st) != cudaSuccess || sm_cuda_moe_dequant(L, x, mat, dout, m_st, &e) ||
                cudaMemcpyAsync(hout, dout, nb, cudaMemcpyDeviceToHost, m_st) != cudaSuccess ||
                cudaStreamSynchronize(m_st) != cudaSuccess) {
                printf("  shard readback: %s %s\n", e.msg, cudaGetErrorString(cudaGetLastError()));
                bad = -1;
                break;
            }
            for (int r = 0; r < R; r++) {
                if (mat) sm_shard_mat_row(X->fmt, &X->down[x], r, ni, ref);
                else if (r < ni) sm_shard_mat_row(X->fmt, &X->gate[x], r, Hm, ref);
                else sm_shard_mat_row(X->fmt, &X->up[x], r - ni, Hm, ref);
                for (int k = 0; k < K; k++) {
                    const float g = hout[(size_t)r * K + k];
                    if (!memcmp(&g, &ref[k], sizeof g)) continue;
                    if (bad < 4)
                        printf("  shard expert %d (global %d) %s [%d, %d]: device %g view %g\n", x, X->e0 + x, mat ? "down" : "gate_up", r,
                               k, g, ref[k]);
                    bad++;
                }
            }
        }
    cudaFree(dout);
    free(hout); free(ref);
    return bad;
}

/* The CPU rank's partial (cpu/layer.c rank_moe + rank_finalize before the exchange), on the
 * shard's views: EP, part [n, Hm] = ref_route_sum of the normed routes of its experts; TP,
 * part [n*K, Hm] = every route's y over the slice (0 for a route of an invalid id). */
static int cpu_rank_part(const sm_model *m, int l, const sm_shard_experts *X, sm_moe_layout lay, const float *h1, const int *idx,
                         const float *w, int n, float *part) {
    const sm_config *c = &m->cfg;
    const int K = c->K, Hm = c->Hm;
    sm_err e = {{0}};
    ref_moe_ws cws;
    memset(&cws, 0, sizeof cws);
    if (ref_moe_ws_reserve(&cws, n * K, X->ne, X->ni, Hm, &e)) { printf("  %s\n", e.msg); return -1; }
    const ref_experts RX = ref_experts_of_shard(X);
    const int ns = ref_moe_group(&cws, idx, n * K, K, RX.e0, RX.ne);
    ref_moe_ffn(m_pool, &RX, h1, Hm, &cws);
    if (lay == SM_MOE_EP) {
        for (int q = 0; q < ns; q++) ref_expert_norm(m->layers[l].post_expert_norm, Hm, c->post_eps, cws.y + (int64_t)cws.slot_route[q] * Hm);
        ref_route_sum(cws.y, w, idx, X->e0, X->ne, n, K, Hm, part);
    } else {
        for (int r = 0; r < n * K; r++) {
            const int valid = idx[r] >= 0 && idx[r] < c->E;
            for (int x = 0; x < Hm; x++) part[(size_t)r * Hm + x] = valid ? cws.y[(size_t)r * Hm + x] : 0.0f;
        }
    }
    ref_moe_ws_free(&cws);
    return 0;
}

/* One (model, layer, W, layout): for rows n in {1, 8, 64} (the 8-row case with route 0 made
 * invalid), every rank's shard uploaded (read back bit for bit), its partial against the
 * CPU rank's, and the rank-order sum, rounded (EP) or finalized (TP), against the single-rank
 * GPU forward and the CPU m. */
static void test_shard_layer(const char *tag, const sm_model *m, int l, int W, sm_moe_layout lay) {
    const sm_config *c = &m->cfg;
    const int K = c->K, Hm = c->Hm, maxr = 64, rows[3] = {1, 8, 64};
    char name[200];
    snprintf(name, sizeof name, "moe_shards %s layer%d(%s) W=%d %s", tag, l, sm_expert_fmt_name(m->layers[l].ex.fmt), W,
             sm_moe_layout_name(lay));
    sm_err e = {{0}};
    /* the single-rank layer, its workspace and io */
    sm_cuda_moe_layer Lf;
    sm_cuda_moe_ws wsf;
    gpu_io io;
    if (sm_cuda_moe_upload(m, l, &Lf, m_st, &e)) { printf("  upload: %s\n", e.msg); gh_result(0, "%s", name); return; }
    if (sm_cuda_moe_ws_alloc(c, maxr, &wsf, &e) || io_alloc(&io, maxr, Hm, K)) {
        printf("  %s\n", e.msg); gh_result(0, "%s", name); sm_cuda_moe_free(&Lf); return;
    }
    /* every rank's shard, layer and workspace */
    sm_shard *sh = (sm_shard *)xmalloc(sizeof(sm_shard) * (size_t)W);
    sm_cuda_moe_layer *Ls = (sm_cuda_moe_layer *)xmalloc(sizeof(sm_cuda_moe_layer) * (size_t)W);
    sm_cuda_moe_ws *wss = (sm_cuda_moe_ws *)xmalloc(sizeof(sm_cuda_moe_ws) * (size_t)W);
    memset(sh, 0, sizeof(sm_shard) * (size_t)W);
    memset(Ls, 0, sizeof(sm_cuda_moe_layer) * (size_t)W);
    memset(wss, 0, sizeof(sm_cuda_moe_ws) * (size_t)W);
    int ok = 1;
    long rb = 0;
    for (int r = 0; r < W && ok; r++) {
        if (sm_shard_make(m, W, r, lay, &sh[r], &e) || sm_cuda_moe_upload_shard(m, l, &sh[r].layers[l].ex, &Ls[r], m_st, &e) ||
            sm_cuda_moe_ws_alloc_shard(c, &sh[r].layers[l].ex, maxr, &wss[r], &e)) {
            printf("  rank %d: %s\n", r, e.msg);
            ok = 0;
            break;
        }
        const sm_shard_experts *X = &sh[r].layers[l].ex;
        if (Ls[r].E != X->ne || Ls[r].I != X->ni || Ls[r].K != K || Ls[r].Hm != Hm) {
            printf("  rank %d: shard layer E %d I %d, views ne %d ni %d\n", r, Ls[r].E, Ls[r].I, X->ne, X->ni);
            ok = 0;
        }
        const long b = cmp_shard_expert(&Ls[r], X);
        rb = b < 0 || rb < 0 ? -1 : rb + b;
    }
    if (rb) { printf("  shard readback: %ld mismatches (-1: error)\n", rb); ok = 0; }
    const size_t pmax = (size_t)maxr * K * Hm;
    float *dpart = (float *)gh_dalloc("rank partial", 4, pmax), *dsum = (float *)gh_dalloc("summed partials", 4, pmax);
    float *hpart = (float *)xmalloc(sizeof(float) * pmax), *cpart = (float *)xmalloc(sizeof(float) * pmax);
    float *hsum = (float *)xmalloc(sizeof(float) * pmax), *csum = (float *)xmalloc(sizeof(float) * pmax);
    if (!dpart || !dsum) { printf("  cudaMalloc failed\n"); ok = 0; }
    double worst_part = 0.0, worst_full = 0.0, worst_cpu = 0.0;
    for (int ci = 0; ci < 3 && ok; ci++) {
        const int n = rows[ci];
        const size_t np = (size_t)n * (lay == SM_MOE_EP ? 1 : K) * Hm; /* floats of a partial */
        float *xf = (float *)xmalloc(sizeof(float) * (size_t)n * c->H), *f = (float *)xmalloc(sizeof(float) * (size_t)n * c->H);
        float *h1 = (float *)xmalloc(sizeof(float) * (size_t)n * Hm), *mref = (float *)xmalloc(sizeof(float) * (size_t)n * Hm);
        float *w = (float *)xmalloc(sizeof(float) * (size_t)n * K);
        int *idx = (int *)xmalloc(sizeof(int) * (size_t)n * K);
        uint16_t *mfull = (uint16_t *)xmalloc((size_t)n * Hm * 2), *hb = (uint16_t *)xmalloc((size_t)n * Hm * 2);
        float *mf = (float *)xmalloc(sizeof(float) * (size_t)n * Hm), *mg = (float *)xmalloc(sizeof(float) * (size_t)n * Hm);
        for (size_t i = 0; i < (size_t)n * c->H; i++) xf[i] = sm_r16(mrndn());
        ref_moe(m_pool, m, l, xf, n, f, idx, w, h1, mref);
        if (ci == 1) { /* an invalid id: contributes nothing on every rank */
            idx[0] = c->E;
            if (ref_moe_experts(m_pool, m, l, h1, idx, w, n, mref, &e)) { printf("  reference: %s\n", e.msg); ok = 0; }
        }
        /* the single-rank GPU forward */
        for (size_t i = 0; i < (size_t)n * Hm; i++) hb[i] = sm_f32_to_bf16(h1[i]);
        int gb = 0;
        if (cudaMemcpy(io.h1, hb, (size_t)n * Hm * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(io.idx, idx, sizeof(int) * (size_t)n * K, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(io.w, w, sizeof(float) * (size_t)n * K, cudaMemcpyHostToDevice) != cudaSuccess ||
            run_gpu(&Lf, &wsf, &io, n, 0, mfull, &gb) || gb)
            ok = 0;
        /* every rank's partial, summed in rank order on the host (CPU partials alike) */
        for (int r = 0; r < W && ok; r++) {
            const sm_shard_experts *X = &sh[r].layers[l].ex;
            if (cpu_rank_part(m, l, X, lay, h1, idx, w, n, cpart)) { ok = 0; break; }
            gh_poison(dpart);
            int rc = lay == SM_MOE_EP ? sm_cuda_moe_forward_ep(&Ls[r], X->e0, io.h1, io.idx, io.w, n, dpart, &wss[r], m_st, &e)
                                      : sm_cuda_moe_forward_tp(&Ls[r], io.h1, io.idx, n, dpart, &wss[r], m_st, &e);
            if (rc || cudaStreamSynchronize(m_st) != cudaSuccess) {
                printf("  rank %d forward: %s %s\n", r, e.msg, cudaGetErrorString(cudaGetLastError()));
                ok = 0;
                break;
            }
            gh_to_host(hpart, dpart, sizeof(float) * np);
            /* the other schedule: the same bits */
            {
                sm_cuda_moe_ws wv = wss[r];
                wv.sched = wv.sched == SM_MOE_SCHED_QUEUE ? SM_MOE_SCHED_STAGES : SM_MOE_SCHED_QUEUE;
                float *h2 = (float *)xmalloc(sizeof(float) * np);
                gh_poison(dpart);
                const int rc2 = lay == SM_MOE_EP ? sm_cuda_moe_forward_ep(&Ls[r], X->e0, io.h1, io.idx, io.w, n, dpart, &wv, m_st, &e)
                                                 : sm_cuda_moe_forward_tp(&Ls[r], io.h1, io.idx, n, dpart, &wv, m_st, &e);
                if (rc2 || cudaStreamSynchronize(m_st) != cudaSuccess) {
                    printf("  rank %d forward (schedule %d): %s\n", r, wv.sched, e.msg);
                    ok = 0;
                } else {
                    gh_to_host(h2, dpart, sizeof(float) * np);
                    if (memcmp(h2, hpart, sizeof(float) * np)) {
                        printf("  n=%d rank %d: schedule %d differs from schedule %d\n", n, r, wv.sched, wss[r].sched);
                        ok = 0;
                    }
                }
                free(h2);
                if (!ok) break;
            }
            long nan = 0, exact = 0;
            double elem = 0;
            const double rel = rel_err(hpart, cpart, np, &nan, &elem);
            /* an EP row without this rank's routes, and a TP route of an invalid id: exactly 0
             * (only there: elsewhere a CPU sum may cancel to 0 where the GPU's order does not) */
            for (size_t i = 0; i < np; i++) {
                const int q = (int)(i / (size_t)Hm); /* EP: row; TP: route (row * K + k) */
                int zero = 1;
                if (lay == SM_MOE_EP) {
                    for (int k = 0; k < K; k++) {
                        const int ex = idx[(size_t)q * K + k];
                        if (ex >= X->e0 && ex < X->e0 + X->ne) zero = 0;
                    }
                } else {
                    zero = idx[q] < 0 || idx[q] >= c->E;
                }
                exact += zero && (cpart[i] != 0.0f || hpart[i] != 0.0f);
            }
            if (rel > worst_part) worst_part = rel;
            if (nan || exact || !(rel <= 1e-2) || !(elem <= GH_ELEM_FACTOR * 1e-2)) {
                printf("  n=%d rank %d partial: rel %.3e (bound 1e-2), worst element %.3e (bound %.0e), %ld NaN, %ld nonzero where "
                       "no route reaches\n", n, r, rel, elem, GH_ELEM_FACTOR * 1e-2, nan, exact);
                ok = 0;
            }
            for (size_t i = 0; i < np; i++) {
                hsum[i] = r ? hsum[i] + hpart[i] : hpart[i];
                csum[i] = r ? csum[i] + cpart[i] : cpart[i];
            }
        }
        if (!ok) { free(xf); free(f); free(h1); free(mref); free(w); free(idx); free(mfull); free(hb); free(mf); free(mg); break; }
        /* m of W ranks: EP r16(sum of partial m); TP finalize of the summed partial y */
        if (lay == SM_MOE_EP) {
            for (size_t i = 0; i < (size_t)n * Hm; i++) mg[i] = sm_r16(hsum[i]);
        } else {
            gh_poison(dsum);
            if (cudaMemcpy(dsum, hsum, sizeof(float) * np, cudaMemcpyHostToDevice) != cudaSuccess || io_poison(&io, n, Hm) ||
                sm_cuda_moe_finalize(&Ls[0], dsum, io.idx, io.w, n, io.mb + MGUARD, &wss[0], m_st, &e) ||
                cudaStreamSynchronize(m_st) != cudaSuccess) {
                printf("  finalize: %s %s\n", e.msg, cudaGetErrorString(cudaGetLastError()));
                ok = 0;
            } else {
                const size_t tot = (size_t)n * Hm + 2 * MGUARD;
                uint16_t *h = (uint16_t *)xmalloc(tot * 2);
                cudaMemcpy(h, io.mb, tot * 2, cudaMemcpyDeviceToHost);
                for (size_t i = 0; i < MGUARD; i++) gb += (h[i] != MGUARD_VAL) + (h[tot - 1 - i] != MGUARD_VAL);
                for (size_t i = 0; i < (size_t)n * Hm; i++) mg[i] = sm_bf16_to_f32(h[MGUARD + i]);
                free(h);
                if (gb) { printf("  finalize: %d guard elements overwritten\n", gb); ok = 0; }
            }
        }
        if (ok) {
            long nan = 0, nan2 = 0;
            for (size_t i = 0; i < (size_t)n * Hm; i++) mf[i] = sm_bf16_to_f32(mfull[i]);
            double ef = 0, ec = 0;
            const double rf = rel_err(mg, mf, (size_t)n * Hm, &nan, &ef), rc = rel_err(mg, mref, (size_t)n * Hm, &nan2, &ec);
            if (rf > worst_full) worst_full = rf;
            if (rc > worst_cpu) worst_cpu = rc;
            if (nan || !(rf <= 1e-2) || !(rc <= 1e-2) || !(ef <= GH_ELEM_FACTOR * 1e-2) || !(ec <= GH_ELEM_FACTOR * 1e-2)) {
                printf("  n=%d m of %d ranks: worst element %.3e vs one rank, %.3e vs the CPU m (bound %.0e)\n", n, W, ef, ec,
                       GH_ELEM_FACTOR * 1e-2);
                printf("  n=%d m of %d ranks: rel %.3e vs the single-rank GPU forward, %.3e vs the CPU m (bound 1e-2), %ld NaN\n", n, W,
                       rf, rc, nan);
                ok = 0;
            }
        }
        free(xf); free(f); free(h1); free(mref); free(w); free(idx); free(mfull); free(hb); free(mf); free(mg);
    }
    char full[320];
    snprintf(full, sizeof full, "%s (partial rel %.2e, m rel %.2e vs 1 rank, %.2e vs CPU)", name, worst_part, worst_full, worst_cpu);
    if (!gh_guards_ok()) ok = 0; /* the partials' guards */
    gh_case_end();
    gh_result(ok, "%s", full);
    free(hpart); free(cpart); free(hsum); free(csum);
    for (int r = 0; r < W; r++) { sm_cuda_moe_ws_free(&wss[r]); sm_cuda_moe_free(&Ls[r]); sm_shard_free(&sh[r]); }
    free(sh); free(Ls); free(wss);
    io_free(&io);
    sm_cuda_moe_ws_free(&wsf);
    sm_cuda_moe_free(&Lf);
}

/* Shards of mini in format fmt: layer 1 (fmt) and, for MXFP4, layer 0 (BF16), W = 2 and 4,
 * EP and TP (mini: E = 16, I = 512, so I/W = 256, 128: MXFP4 TP allowed). */
void test_shards(int fmt, int w4a4) {
    char tag[64];
    snprintf(tag, sizeof tag, "mini_%s%s", sm_expert_fmt_name((sm_expert_fmt)fmt), w4a4 ? "_w4a4" : "");
    made_model mm;
    if (made_model_open(&mm, "mini", fmt, mrnd64())) { gh_result(0, "%s", tag); return; }
    /* W4A4 on the MXFP4 layer (the shards copy it; the reference reads it too) */
    mm.m.layers[1].ex.act_mx = w4a4 && fmt == SM_EXP_MXFP4;
    const int nl = fmt == SM_EXP_MXFP4 ? 2 : 1;
    for (int li = 0; li < nl; li++)
        for (int W = 2; W <= 4; W += 2)
            for (int lay = 0; lay < 2; lay++) test_shard_layer(tag, &mm.m, li == 0 ? 1 : 0, W, (sm_moe_layout)lay);
    if (fmt == SM_EXP_MXFP4 && !w4a4) {
        /* refusals: a shard of an empty I slice; a shard layer run with the whole layer's
         * workspace (E differs) */
        sm_err e = {{0}};
        sm_shard sh;
        sm_cuda_moe_layer L;
        sm_cuda_moe_ws ws;
        int ok = 0;
        if (!sm_shard_make(&mm.m, 2, 1, SM_MOE_EP, &sh, &e)) {
            sm_shard_experts X = sh.layers[1].ex;
            X.ni = 0;
            const int rc = sm_cuda_moe_upload_shard(&mm.m, 1, &X, &L, m_st, &e);
            ok = rc == -1 && strstr(e.msg, "I slice") != NULL;
            if (!ok) printf("  empty slice: rc %d msg '%s'\n", rc, e.msg);
            if (!sm_cuda_moe_upload_shard(&mm.m, 1, &sh.layers[1].ex, &L, m_st, &e)) {
                if (!sm_cuda_moe_ws_alloc(&mm.c, 4, &ws, &e)) {
                    e.msg[0] = 0;
                    const int r2 = sm_cuda_moe_forward_ep(&L, sh.layers[1].ex.e0, (const uint16_t *)ws.buf, (const int *)ws.buf,
                                                          (const float *)ws.buf, 1, (float *)ws.buf, &ws, m_st, &e);
                    if (r2 != -1 || !strstr(e.msg, "workspace sized")) { printf("  whole-layer workspace: rc %d msg '%s'\n", r2, e.msg); ok = 0; }
                    sm_cuda_moe_ws_free(&ws);
                } else {
                    printf("  %s\n", e.msg);
                    ok = 0;
                }
                sm_cuda_moe_free(&L);
            } else {
                printf("  %s\n", e.msg);
                ok = 0;
            }
            sm_shard_free(&sh);
        } else {
            printf("  %s\n", e.msg);
        }
        gh_result(ok, "%s", "moe_shard_refusals (empty I slice, workspace of another layer)");
    }
    made_model_close(&mm);
}
