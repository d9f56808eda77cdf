/* model_logprobs.c: the logprob summaries of a CUDA step (sm_step.lp_at, made on the device by
 * cb_logprobs in src/cuda/rank/step.cu and cb_head in forward.cu) against ref_logprobs_row of
 * the same step's logits handed back: one rank and W virtual ranks, the prefill (eager) form,
 * the verify (graph or bucket) form with the logits, and with the summaries alone (the form a
 * greedy request with logprobs runs).  ids, top logits, lmax, the named id's logit and rank bit
 * for bit, lse within 1e-12 relative (its sum's order), the first id the step's argmax.  Then
 * through the engine: each generated id's logprob against the prefill logits of its prefix.
 * model.c's group.
 */
#include "gpu_tests.h"
#include "harness.h"
#include "model_cases.h"
#include "backend/backend.h"
#include "backend/kvcache.h"
#include "cpu/ops.h"
#include "model/config.h"
#include "model/rng.h"
#include "model/weights.h"
#include "testing/makemodel.h"
#include "sparkmono.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Summaries got [n] of the rows `at` names (tok: NULL or each row's named id) against the
 * reference of logits [*, V] (row i of the step at row i); argmax [n] of the step.  Returns the
 * worst lse relative error. */
static double tl_compare(const char *what, const sm_config *c, int n, const int *at, const int *tok, const sm_lp_sum *got,
                         const float *logits, const int *am, int k) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        if (at[i] < 0) continue;
        sm_lp_sum ref;
        const sm_lp_sum *g = &got[at[i]];
        ref_logprobs_row(logits + (size_t)i * c->V, c->vocab_used, k, tok ? tok[i] : -1, &ref);
        GH_CHECK(g->tok_l == ref.tok_l && g->tok_rank == ref.tok_rank, "%s row %d: id %d logit %g rank %d, reference %g %d",
                 what, i, tok ? tok[i] : -1, (double)g->tok_l, g->tok_rank, (double)ref.tok_l, ref.tok_rank);
        GH_CHECK(!g->bad && !ref.bad && g->n == ref.n && g->n == k && g->lmax == ref.lmax,
                 "%s row %d: bad %d / %d, n %d / %d, lmax %g / %g", what, i, g->bad, ref.bad, g->n, ref.n, (double)g->lmax,
                 (double)ref.lmax);
        for (int j = 0; j < k && j < g->n; j++)
            GH_CHECK(g->top_ids[j] == ref.top_ids[j] && g->top_l[j] == ref.top_l[j], "%s row %d top %d: id %d (%g), reference %d (%g)",
                     what, i, j, g->top_ids[j], (double)g->top_l[j], ref.top_ids[j], (double)ref.top_l[j]);
        GH_CHECK(g->top_ids[0] == am[i], "%s row %d: first id %d, argmax %d", what, i, g->top_ids[0], am[i]);
        const double d = fabs(g->lse - ref.lse) / fabs(ref.lse);
        worst = d > worst ? d : worst;
    }
    GH_CHECK(worst <= 1e-12, "%s: lse relative error %.3g", what, worst);
    return worst;
}

/* world 0: one rank; else that many virtual ranks (tm_world_devices). */
int tm_logprobs_steps(const char *root, uint64_t seed, int world) {
    gh_case_fail = 0;
    enum { R = 8, ML = 128, NR = TM_NREQ };
    static const int plen[NR] = {12, 23, 7};
    sm_err e = {{0}};
    tm_rig rig;
    int slot[NR];
    int tok[64], pos[64], req[64], am[64], at[64], am2[64], nxt[64];
    float *lg = NULL;
    sm_lp_sum sums[64], sums2[64];
    uint64_t rng = seed;
    double w1 = 0, w2 = 0;
    char name[64];
    snprintf(name, sizeof name, "logprobs_steps_tiny_w%d", world > 1 ? world : 1);
    if (tm_rig_make(&rig, root, name, seed, world, 0, NR, ML, slot)) goto out;
    const sm_config c = rig.m.cfg;
    sm_backend b = rig.b;
    sm_kv *kv = &rig.kv;
    lg = malloc((size_t)64 * c.V * sizeof(float));
    if (!lg) { GH_CHECK(0, "out of memory"); goto out; }
    sm_step s;
    /* prefill form: the three prompts in one step; summaries of each prompt's last row and of
     * a few others, to slots in reverse order, top 20 */
    int n = 0, nsum = 0;
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < plen[r]; i++, n++) {
            tok[n] = 3 + (int)(sm_rng_next(&rng) % (uint64_t)(c.vocab_used - 3));
            pos[n] = i;
            req[n] = slot[r];
            at[n] = i == plen[r] - 1 || sm_rng_next(&rng) % 5 == 0 ? 1 : -1;
            nsum += at[n] > 0;
        }
    for (int i = 0, q = nsum; i < n; i++)
        if (at[i] > 0) at[i] = --q;
    for (int i = 0; i < n; i++) nxt[i] = i + 1 < n && req[i + 1] == req[i] ? tok[i + 1] : -1; /* a prompt's next id */
    memset(&s, 0, sizeof s);
    s.nrows = n; s.tokens = tok; s.pos = pos; s.req = req; s.kv = kv; s.argmax = am; s.logits = lg;
    s.lp_at = at; s.lp_k = 20; s.lp = sums; s.lp_tok = nxt;
    if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "prefill step: %s", e.msg); goto out; }
    w1 = tl_compare("prefill", &c, n, at, nxt, sums, lg, am, 20);
    /* verify form: R rows a request at the next positions; summaries of requests 0 and 2, top 5 */
    n = 0;
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < R; j++, n++) {
            tok[n] = 3 + (int)(sm_rng_next(&rng) % (uint64_t)(c.vocab_used - 3));
            pos[n] = plen[r] + j;
            req[n] = slot[r];
            at[n] = r == 1 ? -1 : n;
        }
    memset(&s, 0, sizeof s);
    s.nrows = n; s.tokens = tok; s.pos = pos; s.req = req; s.kv = kv; s.argmax = am; s.logits = lg;
    s.lp_at = at; s.lp_k = 5; s.lp = sums;
    if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "verify step: %s", e.msg); goto out; }
    w2 = tl_compare("verify", &c, n, at, NULL, sums, lg, am, 5);
    /* the same step again with the summaries alone (no logits back): the same bits */
    s.logits = NULL; s.argmax = am2; s.lp = sums2;
    if (b.step(b.ctx, &s, &e)) { GH_CHECK(0, "verify step without logits: %s", e.msg); goto out; }
    for (int i = 0; i < n; i++) {
        if (at[i] < 0) continue;
        GH_CHECK(am2[i] == am[i] && memcmp(&sums2[at[i]].lse, &sums[at[i]].lse, sizeof(double)) == 0 &&
                     memcmp(sums2[at[i]].top_ids, sums[at[i]].top_ids, 5 * sizeof(int)) == 0 &&
                     memcmp(sums2[at[i]].top_l, sums[at[i]].top_l, 5 * sizeof(float)) == 0,
                 "verify row %d: the summary without logits differs from the one with them", i);
    }
out:
    free(lg);
    tm_rig_free(&rig);
    printf("%s logprobs_steps (world %d: prefill and verify forms, lse rel %.2g / %.2g)\n", gh_case_fail ? "FAIL" : "PASS",
           world > 1 ? world : 1, w1, w2);
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}

/* The log-softmax in double of row [nv] at id v. */
static double tl_logprob(const float *row, int nv, int v) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < nv; i++) mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < nv; i++) sum += exp(row[i] - mx);
    return row[v] - mx - log(sum);
}

/* Through the engine on the CUDA backend: each generated id's logprob (and its first top id)
 * against a log-softmax in double of the CUDA prefill logits of its prefix, greedy and sampled,
 * R = 8 on a cycle model (drafts accepted: several ids a verify step).  The verify steps'
 * logits and the prefill's come from different kernels (the bf16 roundings of activations may
 * differ), hence the bound 1e-2 (TM_WORLD_BOUND); a logprob taken from a wrong row is caught
 * apart: the neighbouring position's row must not be closer than the right one. */
int tm_logprobs_engine(const char *root, uint64_t seed) {
    gh_case_fail = 0;
    enum { MT = 40, K = 5, PL = 18 };
    sm_err e = {{0}};
    sm_config c;
    char dir[512];
    int prompt[PL], accepted = 0, shifted = 0;
    double worst = 0;
    for (int i = 0; i < PL; i++) prompt[i] = 5 + i % 5;
    sparkmono_model *md = NULL;
    sm_make_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.experts = SM_EXP_MXFP4;
    mo.seed = seed;
    mo.shards = 1;
    mo.cycle = 16;
    snprintf(dir, sizeof dir, "%s/logprobs_engine_cycle", root);
    if (sm_config_preset("tiny", &c, &e) || sm_make_model(&c, &mo, dir, &e) || sparkmono_model_open(dir, NULL, &md)) {
        GH_CHECK(0, "model: %s %s", e.msg, sparkmono_errmsg());
        goto out;
    }
    for (int sampled = 0; sampled < 2; sampled++) {
        sparkmono_sampling s;
        memset(&s, 0, sizeof s);
        s.temperature = sampled ? 0.8f : 0.0f;
        s.seed = 7;
        s.logprobs = 1;
        s.top_logprobs = K;
        sparkmono_engine_opts o;
        memset(&o, 0, sizeof o);
        o.backend = "cuda";
        o.request_rows = 8;
        o.max_len = PL + MT;
        sparkmono_engine *g = NULL, *g1 = NULL;
        int req, r1, n = 0, k = 0;
        const int *ids, *tid;
        const float *lp, *tlp;
        sparkmono_request_info ri;
        if (sparkmono_engine_create(md, &o, &g) || sparkmono_add_sampled(g, prompt, PL, MT, &s, &req) ||
            sparkmono_generate(g) || sparkmono_output(g, req, &ids, &n) || sparkmono_logprobs(g, req, &lp, &tid, &tlp, &k) ||
            sparkmono_request_get_info(g, req, &ri)) {
            GH_CHECK(0, "%s generation: %s", sampled ? "sampled" : "greedy", sparkmono_errmsg());
            sparkmono_engine_destroy(g);
            continue;
        }
        accepted += ri.accepted;
        int all[PL + MT];
        memcpy(all, prompt, sizeof prompt);
        memcpy(all + PL, ids, (size_t)n * sizeof(int));
        const int V = c.V;
        float *lg = malloc((size_t)(PL + MT) * V * sizeof(float));
        o.request_rows = 1;
        if (!lg || sparkmono_engine_create(md, &o, &g1) || sparkmono_add(g1, all, PL + n - 1, 0, &r1) ||
            sparkmono_prefill(g1, r1, lg)) {
            GH_CHECK(0, "reference prefill: %s", sparkmono_errmsg());
        } else {
            for (int j = 0; j < n; j++) {
                /* the row of position PL + j is the prefill row of its prefix's last token */
                const float *row = lg + (size_t)(PL + j - 1) * V;
                const double a = fabs(lp[j] - tl_logprob(row, c.vocab_used, ids[j]));
                const double b = fabs(tlp[j * K] - tl_logprob(row, c.vocab_used, tid[j * K]));
                worst = a > worst ? a : worst;
                worst = b > worst ? b : worst;
                if (j > 0 && fabs(lp[j] - tl_logprob(row - V, c.vocab_used, ids[j])) < a) shifted++;
                if (!sampled) GH_CHECK(tid[j * K] == ids[j], "greedy id %d: first top id %d, the id %d", j, tid[j * K], ids[j]);
            }
        }
        free(lg);
        sparkmono_engine_destroy(g1);
        sparkmono_engine_destroy(g);
    }
    GH_CHECK(worst <= TM_WORLD_BOUND, "worst logprob difference %.3g", worst);
    GH_CHECK(shifted == 0, "%d logprobs are closer to the previous position's row", shifted);
    GH_CHECK(accepted > 0, "no draft accepted");
out:
    sparkmono_model_close(md);
    printf("%s logprobs_engine (cuda, greedy and sampled, R = 8: worst difference %.2g, %d drafts accepted)\n",
           gh_case_fail ? "FAIL" : "PASS", worst, accepted);
    fflush(stdout);
    return gh_case_fail ? 1 : 0;
}
