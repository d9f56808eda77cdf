/* logits.cu: lm_head + softcap + argmax (src/cuda/ops/logits.cu, every path) against
 * ref_logits_h (src/cpu/ops_logits.c), and the argmax's non-finite guard with planted NaN / Inf
 * values; the logprob summaries (src/cuda/ops/logprobs.cu) against ref_logprobs_row: ids, top
 * logits, the named id's logit and rank, and lmax bit for bit, lse within 1e-12 relative (its sum's order), every logprob
 * within one f32 ulp; benchmark: bench/gpu/logits.cu.  The `kernels` group (kernel_cases.h); bounds: the
 * f32 logits rel 1e-3, each element within GH_ELEM_FACTOR times that (harness.h), masked ids
 * -inf exactly, the argmax compared on rows that are no near-tie.  We rejected comparing the
 * argmax of near-ties: either id is right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cuda_runtime.h>
extern "C" {
#include "base/err.h"
#include "model/config.h"
#include "model/weights.h"
#include "backend/kvcache.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
}
#include "model/codec.h"
#include "cuda/ops/ops.h"
#include "harness.h"
#include "kernel_cases.h"

/* ------------------------------------------------------------------ logits */

void case_logits(int paths, int n, int H, int V, int vu, int want_logits) {
    sm_err e = {""};
    sm_model m;
    memset(&m, 0, sizeof m);
    m.cfg.H = H; m.cfg.V = V; m.cfg.vocab_used = vu;
    m.cfg.out_mult = 0.17677669529663687f;
    m.cfg.softcap = 20.0f;
    m.cfg.rms_eps = 1e-5f;
    uint16_t *hw = (uint16_t *)gh_halloc((size_t)V * H * 2), *hh = (uint16_t *)gh_halloc((size_t)n * H * 2);
    gh_fill_bf16(hw, (size_t)V * H, 0.3f);
    gh_fill_bf16(hh, (size_t)n * H, 1.0f);
    m.lm_head = hw;
    float *h = (float *)gh_halloc((size_t)n * H * 4), *ref = (float *)gh_halloc((size_t)n * V * 4);
    int *ram = (int *)gh_halloc((size_t)n * 4);
    gh_bf16_to_f32(hh, h, (size_t)n * H);
    ref_logits_h(g_pool, &m, h, n, ref, ram);
    uint16_t *dw = (uint16_t *)gh_dup_to_dev("lm_head", hw, 2, (size_t)V * H), *dh = (uint16_t *)gh_dup_to_dev("h", hh, 2, (size_t)n * H);
    int *gam = (int *)gh_halloc((size_t)n * 4);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[160];
        snprintf(name, sizeof name, "logits_%s n=%d H=%d V=%d vocab_used=%d%s", path_name(p), n, H, V, vu,
                 want_logits ? "" : " (argmax only)");
        float *dl = want_logits ? (float *)gh_dalloc("logits", 4, (size_t)n * V) : NULL;
        int *dam = (int *)gh_dalloc("argmax", 4, n);
        if (sm_k_logits_path(&g_ctx, p, dh, n, H, dw, V, vu, m.cfg.out_mult, m.cfg.softcap, dl, dam, g_st, &e)) {
            printf("  %s\n", e.msg);
            gh_acc bad = {0, 0, 1, 0, 0, 0, 0};
            gh_verdict_keep(name, 0, &bad, 1e-3);
            continue;
        }
        if (!gh_sync(g_st)) {
            gh_acc bad = {0, 0, 1, 0, 0, 0, 0};
            gh_verdict_keep(name, 0, &bad, 1e-3);
            continue;
        }
        gh_to_host(gam, dam, (size_t)n * 4);
        int ok = 1, bad = 0, skipped = 0;
        for (int i = 0; i < n; i++) {
            const float *li = ref + (size_t)i * V;
            float b1 = li[ram[i]], b2 = -INFINITY;
            for (int v = 0; v < vu; v++) if (v != ram[i] && li[v] > b2) b2 = li[v];
            if (b1 - b2 < 1e-4f * fabsf(b1) + 1e-6f) { skipped++; continue; }
            if (gam[i] != ram[i]) {
                if (bad < 3) printf("  row %d: argmax %d, reference %d\n", i, gam[i], ram[i]);
                bad++;
            }
        }
        if (bad) { printf("  %d argmax ids differ\n", bad); ok = 0; }
        if (skipped) printf("  %d rows skipped as near-ties\n", skipped);
        gh_acc a = GH_ACC_INIT;
        if (want_logits) gh_cmp_f32(dl, ref, (size_t)n * V, &a);
        gh_verdict_keep(name, ok, &a, 1e-3);
    }
    gh_case_end();
}

/* The non-finite guard of the argmax (cuda/ops/ops.h, sm_k_logits): a row whose logits among ids <
 * vocab_used hold NaN or +-Inf gets argmax -1, every other row keeps the argmax of the clean
 * run with the same path (bit for bit: a row's logits do not depend on the other rows).  Per
 * path: A) one NaN in h row ra (softcap on): ra -> -1; B) NaN in row ra and +Inf in row rb,
 * softcap off and on: both -1 (an infinite raw logit is NaN, never capped to +-20); C) NaN in lm_head row vb < vocab_used: every
 * row -1; D) NaN in a masked lm_head row vm >= vocab_used: every row as clean. */
#define LG_NAN_BF16 0x7FC0
#define LG_INF_BF16 0x7F80
static int lg_run(int p, const uint16_t *dh, int n, int H, const uint16_t *dw, int V, int vu, float cap, int *dam, int *out,
                  sm_err *e) {
    if (sm_k_logits_path(&g_ctx, p, dh, n, H, dw, V, vu, 0.17677669529663687f, cap, NULL, dam, g_st, e)) {
        printf("  %s\n", e->msg);
        return -1;
    }
    if (!gh_sync(g_st)) return -1;
    gh_to_host(out, dam, (size_t)n * 4);
    return 0;
}
/* Rows of got equal to want, except rows bad0 / bad1 (-1: none) which must be -1; all != 0:
 * every row must be -1.  Prints the first mismatches under `what`. */
static int lg_expect(const char *what, const int *got, const int *want, int n, int bad0, int bad1, int all) {
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        const int exp = (all || i == bad0 || i == bad1) ? -1 : want[i];
        if (got[i] != exp) {
            if (wrong < 3) printf("  %s: row %d argmax %d, expected %d\n", what, i, got[i], exp);
            wrong++;
        }
    }
    return wrong == 0;
}
void case_logits_nonfinite(int paths, int n, int H, int V, int vu) {
    sm_err e = {""};
    uint16_t *hw = (uint16_t *)gh_halloc((size_t)V * H * 2), *hh = (uint16_t *)gh_halloc((size_t)n * H * 2);
    gh_fill_bf16(hw, (size_t)V * H, 0.3f);
    gh_fill_bf16(hh, (size_t)n * H, 1.0f);
    const int ra = gh_rndi(n), rb = n > 1 ? (ra + 1 + gh_rndi(n - 1)) % n : -1;
    const int vb = gh_rndi(vu), vm = vu < V ? vu + gh_rndi(V - vu) : -1;
    uint16_t *dh = (uint16_t *)gh_dup_to_dev("h", hh, 2, (size_t)n * H), *dw = (uint16_t *)gh_dup_to_dev("lm_head", hw, 2, (size_t)V * H);
    /* h with one NaN in row ra (A); then also +Inf in row rb (B) */
    hh[(size_t)ra * H + gh_rndi(H)] = LG_NAN_BF16;
    uint16_t *dha = (uint16_t *)gh_dup_to_dev("h NaN", hh, 2, (size_t)n * H);
    if (rb >= 0) hh[(size_t)rb * H + gh_rndi(H)] = LG_INF_BF16;
    uint16_t *dhb = (uint16_t *)gh_dup_to_dev("h NaN Inf", hh, 2, (size_t)n * H);
    /* lm_head with one NaN in row vb (C), another copy with one in the masked row vm (D) */
    const size_t jb = (size_t)vb * H + gh_rndi(H);
    const uint16_t keep = hw[jb];
    hw[jb] = LG_NAN_BF16;
    uint16_t *dwc = (uint16_t *)gh_dup_to_dev("lm_head NaN", hw, 2, (size_t)V * H);
    hw[jb] = keep;
    uint16_t *dwd = NULL;
    if (vm >= 0) {
        hw[(size_t)vm * H + gh_rndi(H)] = LG_NAN_BF16;
        dwd = (uint16_t *)gh_dup_to_dev("lm_head NaN masked", hw, 2, (size_t)V * H);
    }
    int *dam = (int *)gh_dalloc("argmax", 4, n);
    int *capped = (int *)gh_halloc((size_t)n * 4), *plain = (int *)gh_halloc((size_t)n * 4), *got = (int *)gh_halloc((size_t)n * 4);
    for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
        if (!(paths & (1 << p))) continue;
        char name[160];
        snprintf(name, sizeof name, "logits_nonfinite_%s n=%d H=%d V=%d vocab_used=%d (NaN row %d, Inf row %d, NaN ids %d, %d)",
                 path_name(p), n, H, V, vu, ra, rb, vb, vm);
        int ok = lg_run(p, dh, n, H, dw, V, vu, 20.0f, dam, capped, &e) == 0 && lg_run(p, dh, n, H, dw, V, vu, 0.0f, dam, plain, &e) == 0;
        for (int i = 0; ok && i < n; i++)
            if (capped[i] < 0 || plain[i] < 0) { printf("  clean row %d has argmax -1\n", i); ok = 0; }
        if (ok) ok = lg_run(p, dha, n, H, dw, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN in h", got, capped, n, ra, -1, 0);
        if (ok) ok = lg_run(p, dhb, n, H, dw, V, vu, 0.0f, dam, got, &e) == 0 && lg_expect("NaN, Inf in h, no softcap", got, plain, n, ra, rb, 0);
        if (ok) ok = lg_run(p, dhb, n, H, dw, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN, Inf in h, softcap on", got, capped, n, ra, rb, 0);
        if (ok) ok = lg_run(p, dh, n, H, dwc, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN in lm_head", got, capped, n, -1, -1, 1);
        if (ok && dwd) ok = lg_run(p, dh, n, H, dwd, V, vu, 20.0f, dam, got, &e) == 0 && lg_expect("NaN in a masked lm_head row", got, capped, n, -1, -1, 0);
        gh_acc a = GH_ACC_INIT;
        gh_verdict_keep(name, ok, &a, 1e-3);
    }
    gh_case_end();
}


/* ------------------------------------------------------------------ logprob summaries */

/* nsel summaries (rows drawn at random, repeats allowed) of n random rows [n, V] with ids >= vu
 * at -inf, planted ties at the maximum and among the top, a NaN row and an Inf row (n >= 4);
 * ties != 0: every logit one of three values (ties everywhere, across chunks). */
void case_logprobs(int n, int V, int vu, int k, int nsel, int ties) {
    sm_err e = {""};
    char name[160];
    snprintf(name, sizeof name, "logprobs n=%d V=%d vocab_used=%d k=%d rows=%d%s", n, V, vu, k, nsel, ties ? " (three values)" : "");
    float *hl = (float *)gh_halloc((size_t)n * V * 4);
    for (int i = 0; i < n; i++) {
        float *l = hl + (size_t)i * V;
        for (int v = 0; v < V; v++) /* the softcapped range, or three values */
            l[v] = v >= vu ? -INFINITY : ties ? (float)gh_rndi(3) : 20.0f * tanhf(gh_rnds(2.0f));
        if (vu > 2) { /* ties: the maximum twice, and one more pair */
            int am = ref_argmax_row(l, vu), t = gh_rndi(vu);
            l[t] = l[am];
            l[gh_rndi(vu)] = l[gh_rndi(vu)];
        }
    }
    if (n >= 4) {
        hl[(size_t)1 * V + gh_rndi(vu)] = NAN;
        hl[(size_t)2 * V + gh_rndi(vu)] = INFINITY;
    }
    int *rows = (int *)gh_halloc((size_t)nsel * 4), *toks = (int *)gh_halloc((size_t)nsel * 4);
    for (int i = 0; i < nsel; i++) {
        rows[i] = gh_rndi(n);
        toks[i] = gh_rndi(4) == 0 ? -1 : gh_rndi(V); /* a named id (a masked one sometimes), or none */
        const float *l = hl + (size_t)rows[i] * V;
        const int am = gh_rndi(4) == 0 ? ref_argmax_row(l, vu) : -1;
        for (int v = 0; am >= 0 && v < vu; v++) /* or the last id at the maximum: a tie, ranked 2.. */
            toks[i] = l[v] == l[am] ? v : toks[i];
    }
    float *dl = (float *)gh_dup_to_dev("logits", hl, 4, (size_t)n * V);
    sm_lp_sum *dout = (sm_lp_sum *)gh_dalloc("summaries", sizeof(sm_lp_sum), nsel);
    sm_lp_sum *got = (sm_lp_sum *)gh_halloc((size_t)nsel * sizeof(sm_lp_sum));
    gh_case_fail = 0;
    if (sm_k_logprobs(&g_ctx, dl, (size_t)V, rows, toks, nsel, vu, k, dout, g_st, &e)) {
        gh_fail_line(name, e.msg);
        return;
    }
    if (!gh_sync(g_st)) {
        gh_fail_line(name, "the launch failed");
        return;
    }
    gh_to_host(got, dout, (size_t)nsel * sizeof(sm_lp_sum));
    double worst_lse = 0;
    int nbad = 0, nin = 0, nout = 0; /* named ids in / past the top list */
    for (int i = 0; i < nsel && gh_case_fail < 4; i++) {
        const float *l = hl + (size_t)rows[i] * V;
        sm_lp_sum ref, *g = &got[i];
        ref_logprobs_row(l, vu, k, toks[i], &ref);
        nbad += ref.bad;
        GH_CHECK(g->bad == ref.bad, "entry %d (row %d): bad %d, reference %d", i, rows[i], g->bad, ref.bad);
        GH_CHECK(memcmp(&g->tok_l, &ref.tok_l, sizeof(float)) == 0, "entry %d: logit of id %d %g, reference %g", i, toks[i],
                 (double)g->tok_l, (double)ref.tok_l);
        GH_CHECK(g->tok_rank == ref.tok_rank, "entry %d: rank of id %d %d, reference %d", i, toks[i], g->tok_rank, ref.tok_rank);
        nin += !ref.bad && ref.tok_rank >= 1 && ref.tok_rank <= ref.n;
        nout += !ref.bad && ref.tok_rank > ref.n;
        if (ref.bad || g->bad) continue;
        GH_CHECK(g->lmax == ref.lmax && g->n == ref.n, "entry %d: lmax %g n %d, reference %g %d", i, (double)g->lmax, g->n,
                 (double)ref.lmax, ref.n);
        for (int j = 0; j < ref.n && j < g->n; j++) {
            GH_CHECK(g->top_ids[j] == ref.top_ids[j] && g->top_l[j] == ref.top_l[j], "entry %d top %d: id %d (%g), reference %d (%g)",
                     i, j, g->top_ids[j], (double)g->top_l[j], ref.top_ids[j], (double)ref.top_l[j]);
            const float a = sm_lp_value(g, g->top_l[j]), b = sm_lp_value(&ref, ref.top_l[j]);
            GH_CHECK(fabsf(a - b) <= fabsf(b) * 1.2e-7f, "entry %d top %d: logprob %.9g, reference %.9g", i, j, (double)a, (double)b);
        }
        const double d = fabs(g->lse - ref.lse) / (fabs(ref.lse) + 1e-300);
        worst_lse = d > worst_lse ? d : worst_lse;
    }
    GH_CHECK(worst_lse <= 1e-12, "lse relative error %.3g", worst_lse);
    gh_result(gh_case_fail == 0 && gh_guards_ok(), "%s (lse rel %.2g, %d NaN / Inf rows, named ids %d in / %d past the top)", name,
              worst_lse, nbad, nin, nout);
    gh_case_end();
}

/* ------------------------------------------------------------------ constraint masks */

/* n random rows [n, V] (ids >= vu at -inf); each row's mask allows `allow` random ids (0: about
 * half of them), rows i % 3 == 2 have none (free rows, untouched); a NaN planted at a forbidden
 * id of row 0 (masked away: not bad) and at an allowed id of row 1 (bad: argmax -1).  The kernel
 * against ref_mask_row + ref_argmax_row, logits bit for bit; then the summaries of the masked
 * rows (sm_k_logprobs) against ref_logprobs_row, as case_logprobs checks them, each naming an
 * allowed id, a forbidden one (-inf: ranked after every allowed id) or none. */
void case_mask_rows(int n, int V, int vu, int allow, int k) {
    sm_err e = {""};
    char name[160];
    snprintf(name, sizeof name, "mask rows n=%d V=%d vocab_used=%d allowed=%d k=%d", n, V, vu, allow, k);
    const int words = (V + 31) / 32;
    float *hl = (float *)gh_halloc((size_t)n * V * 4), *want = (float *)gh_halloc((size_t)n * V * 4);
    uint32_t *hm = (uint32_t *)gh_halloc((size_t)n * words * 4);
    int *rows = (int *)gh_halloc((size_t)n * 4), *midx = (int *)gh_halloc((size_t)n * 4), m = 0;
    for (int i = 0; i < n; i++) {
        float *l = hl + (size_t)i * V;
        uint32_t *mk = hm + (size_t)i * words;
        for (int v = 0; v < V; v++) l[v] = v >= vu ? -INFINITY : 20.0f * tanhf(gh_rnds(2.0f));
        memset(mk, 0, (size_t)words * 4);
        if (allow) {
            for (int a = 0; a < allow; a++) {
                const int v = gh_rndi(vu);
                mk[v >> 5] |= 1u << (v & 31);
            }
        } else {
            for (int w = 0; w < words; w++) mk[w] = (uint32_t)gh_rndi(1 << 16) | ((uint32_t)gh_rndi(1 << 16) << 16);
        }
        if (i % 3 != 2) { rows[m] = i; midx[m++] = i; }
    }
    /* a NaN at a forbidden id of row 0, at an allowed one of row 1 */
    for (int i = 0; i < 2 && i < n; i++) {
        const uint32_t *mk = hm + (size_t)i * words;
        for (int v = 0; v < vu; v++)
            if ((((mk[v >> 5] >> (v & 31)) & 1) != 0) == (i == 1)) { hl[(size_t)i * V + v] = NAN; break; }
    }
    int *am_want = (int *)gh_halloc((size_t)n * 4), *am_got = (int *)gh_halloc((size_t)n * 4);
    memcpy(want, hl, (size_t)n * V * 4);
    for (int i = 0; i < n; i++) am_want[i] = -7; /* untouched: the free rows */
    for (int j = 0; j < m; j++) {
        float *l = want + (size_t)rows[j] * V;
        ref_mask_row(l, hm + (size_t)midx[j] * words, 0, V);
        am_want[rows[j]] = ref_argmax_row(l, vu);
    }
    float *dl = (float *)gh_dup_to_dev("logits", hl, 4, (size_t)n * V);
    uint32_t *dm = (uint32_t *)gh_dup_to_dev("masks", hm, 4, (size_t)n * words);
    for (int i = 0; i < n; i++) am_got[i] = -7;
    int *dam = (int *)gh_dup_to_dev("argmax", am_got, 4, (size_t)n);
    gh_case_fail = 0;
    if (sm_k_mask_rows(&g_ctx, dl, (size_t)V, V, vu, dm, words, rows, midx, m, dam, g_st, &e)) {
        gh_fail_line(name, e.msg);
        return;
    }
    if (!gh_sync(g_st)) {
        gh_fail_line(name, "the launch failed");
        return;
    }
    float *got = (float *)gh_halloc((size_t)n * V * 4);
    gh_to_host(got, dl, (size_t)n * V * 4);
    gh_to_host(am_got, dam, (size_t)n * 4);
    for (int i = 0; i < n && gh_case_fail < 4; i++) {
        GH_CHECK(am_got[i] == am_want[i], "row %d: argmax %d, reference %d", i, am_got[i], am_want[i]);
        GH_CHECK(memcmp(got + (size_t)i * V, want + (size_t)i * V, (size_t)V * 4) == 0, "row %d: the masked logits differ", i);
    }
    /* the summaries of the masked rows, each naming an allowed id, a forbidden one or none */
    sm_lp_sum *dout = (sm_lp_sum *)gh_dalloc("summaries", sizeof(sm_lp_sum), m);
    sm_lp_sum *sum = (sm_lp_sum *)gh_halloc((size_t)m * sizeof(sm_lp_sum));
    int *toks = (int *)gh_halloc((size_t)m * 4);
    for (int j = 0; j < m; j++) {
        const uint32_t *mk = hm + (size_t)midx[j] * words;
        const int want_allowed = j % 3 == 0, v0 = gh_rndi(vu);
        toks[j] = -1;
        for (int d = 0; j % 3 != 2 && d < vu && toks[j] < 0; d++) { /* the first such id from a random one */
            const int v = (v0 + d) % vu;
            if ((((mk[v >> 5] >> (v & 31)) & 1) != 0) == want_allowed) toks[j] = v;
        }
    }
    if (sm_k_logprobs(&g_ctx, dl, (size_t)V, rows, toks, m, vu, k, dout, g_st, &e) || !gh_sync(g_st)) {
        gh_fail_line(name, e.msg[0] ? e.msg : "the summaries failed");
        return;
    }
    gh_to_host(sum, dout, (size_t)m * sizeof(sm_lp_sum));
    for (int j = 0; j < m && gh_case_fail < 4; j++) {
        sm_lp_sum ref, *g = &sum[j];
        ref_logprobs_row(want + (size_t)rows[j] * V, vu, k, toks[j], &ref);
        GH_CHECK(g->bad == ref.bad, "row %d: summary bad %d, reference %d", rows[j], g->bad, ref.bad);
        GH_CHECK(memcmp(&g->tok_l, &ref.tok_l, sizeof(float)) == 0 && g->tok_rank == ref.tok_rank,
                 "row %d: id %d logit %g rank %d, reference %g %d", rows[j], toks[j], (double)g->tok_l, g->tok_rank,
                 (double)ref.tok_l, ref.tok_rank);
        if (ref.bad || g->bad) continue;
        GH_CHECK(g->lmax == ref.lmax && g->n == ref.n, "row %d: lmax %g n %d, reference %g %d", rows[j], (double)g->lmax, g->n,
                 (double)ref.lmax, ref.n);
        for (int t = 0; t < ref.n && t < g->n; t++)
            GH_CHECK(g->top_ids[t] == ref.top_ids[t] && (g->top_l[t] == ref.top_l[t]), "row %d top %d: id %d (%g), reference %d (%g)",
                     rows[j], t, g->top_ids[t], (double)g->top_l[t], ref.top_ids[t], (double)ref.top_l[t]);
        GH_CHECK(fabs(g->lse - ref.lse) <= 1e-12 * (fabs(ref.lse) + 1e-300), "row %d: lse %.17g, reference %.17g", rows[j], g->lse,
                 ref.lse);
    }
    gh_result(gh_case_fail == 0 && gh_guards_ok(), "%s", name);
    gh_case_end();
}
