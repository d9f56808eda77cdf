/* bench/trace.cu: the bench hooks of the monokernel executor (bench.h): its mode and the
 * experts' activations for the next steps, the layers it ran, and the timeline of one step
 * (sparkmono bench --trace): a per-phase summary and a Chrome / Perfetto trace; and the layer
 * phases of one traced step on either executor (sparkmono bench --phases).
 *
 * They reach the executor only through the rank's table (exec.h): the mode is the rank's
 * choice per bucket, a change of the layers' arguments asks it to forget its plans, and the
 * timeline comes from its trace hooks in the layout it describes (sm_exec_trace: layers x
 * blocks x phases of start / end timestamps, the phases' names, floors, tracks and waits), so
 * the summary and the file are written here, for any executor that keeps one.  We rejected
 * the executor printing its own summary: the bench's floors, medians and file format would
 * live in two places.
 */
#include "cuda/rank/rank.h"
#include "bench.h"
extern "C" {
#include "base/outfile.h"
#include "backend/stats.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static_assert(SM_LP_N <= SM_BENCH_LPHASES, "the layer phases fit sm_bench_phases");

extern "C" long sm_cuda_mono_layers_run(const sm_backend *b) {
    sm_cuda_rank **rk = NULL;
    if (cb_world_ranks(b, &rk) > 0) return rk[0]->mono_layers;
    sm_err e;
    sm_cuda_rank *cr = cb_from_backend(b, "mono layers", &e);
    return cr ? cr->mono_layers : 0;
}

/* The ranks of backend b (a world's, or the one rank's in *one); 0 with e when b is not CUDA. */
static int tr_ranks(const sm_backend *b, sm_cuda_rank **one, sm_cuda_rank ***rk, sm_err *e) {
    const int W = cb_world_ranks(b, rk);
    if (W > 0) return W;
    *one = cb_from_backend(b, "cuda bench", e);
    if (!*one) return 0;
    *rk = one;
    return 1;
}

extern "C" int sm_cuda_bench_set_mono(const sm_backend *b, int on, sm_err *e) {
    sm_cuda_rank *one, **rk;
    const int W = tr_ranks(b, &one, &rk, e);
    if (!W) return -1;
    for (int r = 0; r < W; r++)
        if (on && !rk[r]->mono.ctx) return sm_errf(e, "cuda bench: the monokernel is not available on this engine (see the log line)");
    for (int r = 0; r < W; r++) { /* every rank together: they must take the same path */
        sm_cuda_rank *cr = rk[r];
        if (cb_enter(cr, e)) return -1;
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
        cb_graphs_drop(cr, 0);
        cr->mono_mode = on ? SM_MONO_AUTO : SM_MONO_OFF;
    }
    return 0;
}

extern "C" int sm_cuda_bench_set_acts(const sm_backend *b, int mx, int fp8, sm_err *e) {
    sm_cuda_rank *one, **rk;
    const int W = tr_ranks(b, &one, &rk, e);
    if (!W) return -1;
    int any = 0;
    for (int r = 0; r < W; r++) {
        sm_cuda_rank *cr = rk[r];
        if (cb_enter(cr, e)) return -1;
        SM_CUDA_CHECK(cudaStreamSynchronize(cr->st));
        for (int l = 0; l < cr->cfg.L; l++) {
            sm_cuda_moe_layer *ml = &cr->layers[l].moe;
            if (!cr->layers[l].have_moe || ml->fmt != SM_EXP_MXFP4) continue;
            if (sm_cuda_moe_set_acts(ml, mx, fp8, cr->st, e)) return sm_errprefix(e, "cuda bench: layer %d", l);
            any = 1;
        }
        /* the graphs and the monokernel's plans hold the experts' arguments by value */
        cb_graphs_drop(cr, 0);
        if (cr->mono.ctx) cr->mono.forget(cr->mono.ctx);
    }
    if (mx && !any) return sm_errf(e, "cuda bench: MXFP4 activations need MXFP4 expert layers; this model has none");
    return 0;
}

/* Per-phase summary of a traced step h (tb blocks a layer) of executor X (timeline t, on rank 0
 * of W): per layer lo+1..hi-1 of X, each phase's span over all blocks (first start to last end),
 * the lead slot (from the end of the previous layer's last phase to this layer's first) and the
 * gaps (the layer's cycle minus the spans); the median over the layers, printed with the
 * phases' floors (bytes / bw). */
static void tr_summary(const sm_exec *X, const sm_exec_trace *t, int W, const unsigned long long *h, int tb, int nrows, double bw) {
    const int P = t->phases, NL = t->layers;
    float *buf = (float *)malloc(sizeof(float) * (size_t)NL * (P + 3));
    if (!buf) return;
    float *span = buf, *att = buf + (size_t)P * NL, *gap = att + NL, *cyc = gap + NL; /* span [P][NL] */
    unsigned long long s0[SM_EXEC_TRACE_PHASES], s1[SM_EXEC_TRACE_PHASES];
    int nl = 0;
    unsigned long long prev_end = 0;
    for (int l = X->lo; l < X->hi && l < NL; l++) {
        unsigned long long first = ~0ull, last = 0;
        for (int p = 0; p < P; p++) {
            s0[p] = ~0ull; s1[p] = 0;
            for (int bk = 0; bk < tb; bk++) {
                const unsigned long long *q = h + (((size_t)l * tb + bk) * P + p) * 2;
                if (!q[0] || !q[1]) continue;
                if (q[0] < s0[p]) s0[p] = q[0];
                if (q[1] > s1[p]) s1[p] = q[1];
            }
            if (s1[p] && s0[p] < first) first = s0[p];
            if (s1[p] > last) last = s1[p];
        }
        if (!last) break;
        if (prev_end) { /* the layers after the first: the cycle from the previous layer's end */
            float sum = 0;
            for (int p = 0; p < P; p++) {
                span[(size_t)p * NL + nl] = s1[p] ? (float)((s1[p] - s0[p]) / 1e3) : 0.f;
                if (!t->nested[p]) sum += span[(size_t)p * NL + nl];
            }
            att[nl] = first > prev_end ? (float)((first - prev_end) / 1e3) : 0.f;
            cyc[nl] = (float)((last - prev_end) / 1e3);
            gap[nl] = cyc[nl] - att[nl] - sum;
            nl++;
        }
        prev_end = last;
    }
    if (nl) {
        printf("%s trace of one %d-row step%s: median over layers %d..%d, us (span of each phase over all blocks)\n", t->what, nrows,
               W > 1 ? " (rank 0)" : "", X->lo + 1, X->lo + nl);
        printf("  %-40s %9.1f   %s\n", t->lead, sm_median(att, nl), t->lead_note);
        for (int p = 0; p < P; p++) {
            const double m = sm_median(span + (size_t)p * NL, nl); /* sorts this phase's samples only */
            if (m <= 0) continue;
            const double fb = t->floor[p];
            if (t->nested[p])
                printf("    %-38s %9.1f   (inside %s)\n", t->name[p], m, t->name[t->nested[p] - 1]);
            else if (fb > 0)
                printf("  %-40s %9.1f   floor %7.1f  %5.1f%%\n", t->name[p], m, fb / bw * 1e6, 100 * fb / bw * 1e6 / m);
            else
                printf("  %-40s %9.1f\n", t->name[p], m);
        }
        printf("  %-40s %9.1f   (barriers, skew, launch tails)\n", "gaps between phases", sm_median(gap, nl));
        printf("  %-40s %9.1f\n\n", "layer cycle", sm_median(cyc, nl));
        fflush(stdout);
    }
    free(buf);
}

/* W > 1: each rank's waits for the others, their share of its layer cycles (per wait phase, the
 * longest block's wait, summed over layers lo+1..hi-1). */
static void tr_waits(sm_cuda_rank **rk, int W, const sm_exec_trace *t, const unsigned long long *h, size_t nb, int tb) {
    const sm_exec *X = &rk[0]->mono;
    const int P = t->phases;
    printf("exchange waits inside the launches, per rank (sum over layers %d..L-%d of the longest block's wait):\n", X->lo + 1,
           rk[0]->cfg.L - X->hi + 1);
    for (int r = 0; r < W; r++) {
        const unsigned long long *hr = h + nb * r;
        double wsum = 0, t0 = 0, t1 = 0;
        for (int l = X->lo + 1; l < X->hi && l < t->layers; l++)
            for (int bk = 0; bk < tb; bk++)
                for (int p = 0; p < P; p++) {
                    const unsigned long long *q = hr + (((size_t)l * tb + bk) * P + p) * 2;
                    if (!q[0] || !q[1]) continue;
                    if (!t0 || q[0] < t0) t0 = (double)q[0];
                    if (q[1] > t1) t1 = (double)q[1];
                }
        for (int l = X->lo + 1; l < X->hi && l < t->layers; l++)
            for (int p = 0; p < P; p++) {
                if (!t->wait[p]) continue;
                double m = 0;
                for (int bk = 0; bk < tb; bk++) {
                    const unsigned long long *q = hr + (((size_t)l * tb + bk) * P + p) * 2;
                    if (q[0] && q[1] && (double)(q[1] - q[0]) > m) m = (double)(q[1] - q[0]);
                }
                wsum += m;
            }
        printf("  rank %d: %.1f us of %.1f us (%.1f%%)\n", r, wsum / 1e3, (t1 - t0) / 1e3, t1 > t0 ? 100 * wsum / (t1 - t0) : 0.0);
    }
    printf("\n");
}

/* The timestamps h of W ranks as a Chrome / Perfetto trace at path: a process per rank, a track
 * (tid) per SM, a slice per (layer, phase) of each block. */
static int tr_write(const char *path, const sm_exec_trace *t, const unsigned long long *h, size_t nb, int W, int tb, sm_err *e) {
    unsigned long long t0 = ~0ull;
    for (size_t i = 0; i < nb * W; i++)
        if (h[i] && h[i] < t0) t0 = h[i];
    sm_outfile of;
    if (sm_outfile_open(&of, path, e)) return sm_errprefix(e, "bench --trace");
    FILE *fp = of.f;
    fprintf(fp, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < W; r++)
        for (int l = 0; l < t->layers; l++)
            for (int bk = 0; bk < tb; bk++)
                for (int p = 0; p < t->phases; p++) {
                    const unsigned long long *q = h + nb * r + (((size_t)l * tb + bk) * t->phases + p) * 2;
                    if (!q[0] || !q[1]) continue;
                    const int sm_track = t->pair[p] ? bk / 2 : bk;
                    fprintf(fp, "%s{\"name\":\"L%d %s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", first ? "" : ",\n",
                            l, t->name[p], r, sm_track, (double)(q[0] - t0) / 1000.0, (double)(q[1] - q[0]) / 1000.0);
                    first = 0;
                }
    fprintf(fp, "\n]}\n");
    if (sm_outfile_commit(&of, e)) return sm_errprefix(e, "bench --trace");
    return 0;
}

extern "C" int sm_cuda_bench_trace(const sm_backend *b, const sm_step *s, const char *path, double bw, sm_err *e) {
    sm_cuda_rank *one, **rk;
    const int W = tr_ranks(b, &one, &rk, e);
    if (!W) return -1;
    int tb = 0;
    for (int r = 0; r < W; r++) {
        const sm_exec *X = &rk[r]->mono;
        if (!X->ctx || rk[r]->mono_mode == SM_MONO_OFF) return sm_errf(e, "cuda bench --trace: the monokernel is off on this engine");
        const int k = X->trace_blocks(X->ctx);
        if (k > tb) tb = k;
    }
    sm_exec_trace t;
    rk[0]->mono.trace_fmt(rk[0]->mono.ctx, &t);
    const size_t nb = (size_t)t.layers * tb * t.phases * 2;
    /* every rank's timeline on (its blocks' timestamps; the exchange waits in their slots) */
    for (int r = 0; r < W; r++)
        if (cb_enter(rk[r], e) || rk[r]->mono.trace_on(rk[r]->mono.ctx, tb, e)) return -1;
    int rc = b->step(b->ctx, s, e);
    unsigned long long *h = NULL;
    if (!rc) {
        h = (unsigned long long *)malloc(nb * 8 * (size_t)W);
        if (!h) rc = sm_errf(e, "cuda bench --trace: out of host memory");
    }
    for (int r = 0; r < W; r++) {
        if (cb_enter(rk[r], e)) return -1;
        sm_err e2;
        if (rk[r]->mono.trace_off(rk[r]->mono.ctx, rc ? NULL : h + nb * r, &e2) && !rc) {
            *e = e2;
            rc = sm_errprefix(e, "cuda bench --trace");
        }
    }
    if (rc) {
        free(h);
        return -1;
    }
    tr_summary(&rk[0]->mono, &t, W, h, tb, s->nrows, bw);
    if (W > 1) tr_waits(rk, W, &t, h, nb, tb);
    rc = path ? tr_write(path, &t, h, nb, W, tb, e) : 0;
    free(h);
    return rc;
}

/* ---- the layer phases of a traced step (bench --phases) ---- */

/* Per layer l of X's timeline h (tb blocks a layer), each layer phase's time in us into
 * lus [t->layers][SM_LP_N] (-1: not measured): the spans of the phases that make it up (first
 * start to last end over the blocks), summed; the lead (the previous layer's last end to this
 * layer's first start) into t->lead_part; the gaps, the layer's cycle minus both, known only
 * where the layer before it ran in the timeline too. */
static void tr_layer_phases(const sm_exec *X, const sm_exec_trace *t, const unsigned long long *h, int tb, float *lus) {
    for (size_t i = 0; i < (size_t)t->layers * SM_LP_N; i++) lus[i] = -1.f;
    unsigned long long prev_end = 0;
    for (int l = X->lo; l < X->hi && l < t->layers; l++) {
        float *u = lus + (size_t)l * SM_LP_N;
        unsigned long long first = ~0ull, last = 0;
        double sum = 0;
        for (int p = 0; p < t->phases; p++) {
            unsigned long long s0 = ~0ull, s1 = 0;
            for (int bk = 0; bk < tb; bk++) {
                const unsigned long long *q = h + (((size_t)l * tb + bk) * t->phases + p) * 2;
                if (!q[0] || !q[1]) continue;
                if (q[0] < s0) s0 = q[0];
                if (q[1] > s1) s1 = q[1];
            }
            if (!s1) continue;
            if (s0 < first) first = s0;
            if (s1 > last) last = s1;
            const int lp = t->part[p];
            if (lp == SM_LP_NONE || lp >= SM_LP_N) continue; /* a wait: inside its consumer */
            const double us = s1 > s0 ? (double)(s1 - s0) / 1e3 : 0.0;
            u[lp] = (float)((u[lp] < 0 ? 0.0 : (double)u[lp]) + us);
            sum += us;
        }
        if (!last) { /* the layer ran on another executor */
            prev_end = 0;
            continue;
        }
        if (prev_end) {
            const double lead = first > prev_end ? (double)(first - prev_end) / 1e3 : 0.0;
            double gap = (last > prev_end ? (double)(last - prev_end) / 1e3 : 0.0) - sum;
            if (t->lead_part != SM_LP_NONE && t->lead_part < SM_LP_N) {
                u[t->lead_part] = (float)((u[t->lead_part] < 0 ? 0.0 : (double)u[t->lead_part]) + lead);
                gap -= lead;
            }
            u[SM_LP_GAPS] = (float)(gap > 0 ? gap : 0.0);
        }
        prev_end = last;
    }
}

extern "C" int sm_cuda_bench_phases(const sm_backend *b, const sm_step *s, int mono, const unsigned char *set, sm_bench_phases *p,
                                    float *layer_us, sm_err *e) {
    sm_cuda_rank **rk;
    if (cb_world_ranks(b, &rk)) return sm_errf(e, "cuda bench phases: one rank only (not a world)");
    sm_cuda_rank *cr = cb_from_backend(b, "cuda bench phases", e);
    if (!cr) return -1;
    if (s->nrows < 1 || s->nrows > CB_GRAPH_ROWS || !cb_graph_form(s))
        return sm_errf(e, "cuda bench phases: a step of %d rows is not one graph-form chunk", s->nrows);
    if (mono && (!cr->mono.ctx || cr->mono_mode == SM_MONO_OFF))
        return sm_errf(e, "cuda bench phases: the monokernel is off on this engine");
    const sm_exec *X = mono ? &cr->mono : &cr->stock;
    const int tb = X->trace_blocks(X->ctx), L = cr->cfg.L;
    sm_exec_trace t;
    X->trace_fmt(X->ctx, &t);
    const size_t nb = (size_t)t.layers * tb * t.phases * 2;
    unsigned long long *h = (unsigned long long *)malloc(nb * 8);
    float *lus = (float *)malloc(sizeof(float) * (size_t)t.layers * SM_LP_N), *v = (float *)malloc(sizeof(float) * (size_t)L);
    if (!h || !lus || !v) {
        free(h), free(lus), free(v);
        return sm_errf(e, "cuda bench phases: out of host memory");
    }
    /* stock: every layer stock and the bucket's launches eager (events time an eager stream);
     * the monokernel: its graph, the timestamps written by its blocks */
    const int mode = cr->mono_mode, eager = cr->eager_only;
    int rc = cb_enter(cr, e) || X->trace_on(X->ctx, tb, e) ? -1 : 0;
    if (!rc) {
        if (!mono) {
            cr->mono_mode = SM_MONO_OFF;
            cr->eager_only = 1;
        }
        rc = b->step(b->ctx, s, e);
        cr->mono_mode = mode;
        cr->eager_only = eager;
        sm_err e2;
        if (X->trace_off(X->ctx, rc ? NULL : h, &e2) && !rc) {
            *e = e2;
            rc = -1;
        }
    }
    if (!rc) {
        tr_layer_phases(X, &t, h, tb, lus);
        memset(p, 0, sizeof *p);
        p->n = SM_LP_N;
        for (int l = 0; l < L && l < t.layers; l++) {
            int ran = 0;
            for (int q = 1; q < SM_LP_N; q++) ran |= lus[(size_t)l * SM_LP_N + q] >= 0;
            p->layers += ran && (!set || set[l]);
        }
        for (int q = 1; q < SM_LP_N; q++) {
            int k = 0;
            for (int l = 0; l < L && l < t.layers; l++)
                if ((!set || set[l]) && lus[(size_t)l * SM_LP_N + q] >= 0) v[k++] = lus[(size_t)l * SM_LP_N + q];
            p->name[q] = sm_exec_lphases[q].name;
            p->weights[q] = sm_exec_lphases[q].weights;
            p->us[q] = k ? sm_median(v, k) : -1.f;
        }
        for (int l = 0; layer_us && l < L; l++)
            for (int q = 0; q < SM_BENCH_LPHASES; q++)
                layer_us[(size_t)l * SM_BENCH_LPHASES + q] = l < t.layers && q < SM_LP_N ? lus[(size_t)l * SM_LP_N + q] : -1.f;
    }
    free(h), free(lus), free(v);
    return rc ? sm_errprefix(e, "cuda bench phases (%s)", X->name) : 0;
}
