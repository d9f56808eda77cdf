/* test_logitproc.c: the logit processors (src/engine/logitproc.c): the processed row against
 * an independent evaluation of each rule (allowed ids and bad words too, drafts in the tail),
 * the checks and their lines, the stop rules, allowed ids and bad words through the engine, and
 * speculative (R = 8) output equal to plain (R = 1) output token for token, greedy and seeded
 * sampling, for each processor and min_p. */
#include "check.h"
#include "tmodel.h"
#include "engine/logitproc.h"
#include "cpu/ops.h"
#include "sparkmono.h"

static char g_tmp[512];
static sparkmono_model *g_cyc; /* tiny cycle model (cycle 3..18): drafts are accepted often */
static sparkmono_model *g_rnd; /* tiny random model */
static int g_V, g_vu;

/* ---- the processed row ------------------------------------------------------------------ */

static void test_apply_reference(void) {
    enum { NV = 12 };
    const float lg[NV] = {1.5f, -0.5f, 2.0f, 0.25f, -3.0f, 0.0f, 4.0f, -1.0f, 0.75f, 1.0f, -2.5f, 3.0f};
    const int eos[1] = {2};
    const int hist[6] = {6, 1, 6, /* prompt */ 3, 3, 8}, extra[2] = {1, 3};
    sparkmono_sampling s = {.temperature = 0};
    s.presence_penalty = 0.5f;
    s.frequency_penalty = -0.25f;
    s.repetition_penalty = 1.5f;
    s.min_tokens = 6; /* 5 generated so far (3 in hist, 2 extra): eos and stop ids forbidden */
    s.n_bias = 2;
    s.bias[0] = (sparkmono_bias){9, 2.0f};
    s.bias[1] = (sparkmono_bias){6, -1.0f};
    s.n_stop_ids = 1;
    s.stop_ids[0] = 11;
    sm_lp_ws ws;
    sm_err e = {{0}};
    CHECK(sm_lp_ws_init(&ws, NV, &e) == 0, "%s", e.msg);
    const float *row = sm_lp_apply(&ws, lg, NV, &s, hist, 6, 3, extra, 2, eos, 1);
    /* the rules by hand: counts over generated ids {3, 3, 8, 1, 3}; history ids {6, 1, 3, 8} */
    int cnt[NV] = {0}, inh[NV] = {0};
    const int all[8] = {6, 1, 6, 3, 3, 8, 1, 3};
    for (int i = 0; i < 8; i++) inh[all[i]] = 1;
    for (int i = 3; i < 8; i++) cnt[all[i]]++;
    int bad = 0;
    for (int i = 0; i < NV; i++) {
        double x = lg[i];
        if (i == 2 || i == 11) x = -INFINITY;
        if (i == 9) x += 2.0;
        if (i == 6) x -= 1.0;
        if (inh[i]) x = x > 0 ? x / 1.5 : x * 1.5;
        x -= -0.25 * cnt[i] + 0.5 * (cnt[i] > 0);
        if ((float)x != row[i]) {
            bad++;
            printf("  id %d: %g, expected %g\n", i, (double)row[i], x);
        }
    }
    CHECK(bad == 0, "%d ids differ from the rules by hand", bad);
    /* the scratch is zero again, and the same call gives the same row */
    int nz = 0;
    for (int i = 0; i < NV; i++) nz += ws.count[i] != 0 || ws.seen[i] != 0;
    CHECK(nz == 0, "%d scratch entries left non-zero", nz);
    /* min_tokens reached: eos and the stop id keep their logits */
    s.min_tokens = 5;
    row = sm_lp_apply(&ws, lg, NV, &s, hist, 6, 3, extra, 2, eos, 1);
    CHECK(row[2] == lg[2] && row[11] == lg[11], "min_tokens reached: eos %g stop %g", (double)row[2], (double)row[11]);
    CHECK(sm_lp_argmax(row, NV) == 9, "argmax %d, expected 9 (ties 11 at 3, the lowest id wins)", sm_lp_argmax(row, NV));
    const float allinf[2] = {-INFINITY, -INFINITY};
    CHECK(sm_lp_argmax(allinf, 2) == -1, "an all -inf row is not refused");
    sm_lp_ws_free(&ws);
}

/* Allowed ids and bad words on a row by hand: the row is -inf but for the allowed ids; a bad
 * word's last id is -inf where the generated ids (drafts too, never the prompt) end with the
 * rest of it; the other processors apply on top, and -inf stays -inf under them. */
static void test_allowed_bad_words_reference(void) {
    enum { NV = 12 };
    const float lg[NV] = {1.5f, -0.5f, 2.0f, 0.25f, -3.0f, 0.0f, 4.0f, -1.0f, 0.75f, 1.0f, -2.5f, 3.0f};
    const int eos[1] = {2};
    /* prompt 6 1 5 4, generated 3 8 (hist), then the drafts 1 9 (extra): the generated tail is 3 8 1 9 */
    const int hist[6] = {6, 1, 5, 4, 3, 8}, extra[2] = {1, 9};
    sparkmono_sampling s = {.temperature = 0};
    /* bad words: [7] always; [9, 11] (tail ends 9): 11; [1, 9, 0] (tail ends 1 9): 0; [8, 9, 5] (tail
     * ends 1 9, not 8 9): none; [4, 3, 8, 1, 9, 10] (its 4 is the prompt's): none; [3, 8, 1, 9, 6] (the
     * whole generated tail): 6; [9, 2] eos after 9: 2 */
    static const int words[][6] = {{7}, {9, 11}, {1, 9, 0}, {8, 9, 5}, {4, 3, 8, 1, 9, 10}, {3, 8, 1, 9, 6}, {9, 2}};
    static const int lens[] = {1, 2, 3, 3, 6, 5, 2};
    int nids = 0;
    for (int b = 0; b < 7; b++) {
        memcpy(s.bad_word_ids + nids, words[b], (size_t)lens[b] * sizeof(int));
        nids += lens[b];
        s.bad_word_len[s.n_bad_words++] = lens[b];
    }
    sm_lp_ws ws;
    sm_err e = {{0}};
    CHECK(sm_lp_ws_init(&ws, NV, &e) == 0, "%s", e.msg);
    CHECK(sm_lp_check(&s, NV, &e) == 0 && sm_lp_active(&s), "bad words: %s", e.msg);
    const float *row = sm_lp_apply(&ws, lg, NV, &s, hist, 6, 4, extra, 2, eos, 1);
    int bad = 0;
    for (int i = 0; i < NV; i++) {
        const int gone = i == 7 || i == 11 || i == 0 || i == 6 || i == 2;
        if (row[i] != (gone ? -INFINITY : lg[i])) bad++, printf("  bad words: id %d is %g\n", i, (double)row[i]);
    }
    CHECK(bad == 0, "%d ids differ from the bad words by hand", bad);
    /* with no drafts the tail is 3 8: only [7] acts (and no sequence reaches into the prompt) */
    row = sm_lp_apply(&ws, lg, NV, &s, hist, 6, 4, NULL, 0, eos, 1);
    bad = 0;
    for (int i = 0; i < NV; i++) bad += row[i] != (i == 7 ? -INFINITY : lg[i]);
    CHECK(bad == 0, "%d ids differ (tail 3 8)", bad);
    /* allowed ids 11 3 9 3 (a repeat is harmless) with a bias and a repetition penalty on top: every
     * other id -inf; 11 is a bad word after 9, so 11 is -inf too */
    sparkmono_sampling a = s;
    a.n_allowed_ids = 4;
    a.allowed_ids[0] = 11, a.allowed_ids[1] = 3, a.allowed_ids[2] = 9, a.allowed_ids[3] = 3;
    a.n_bias = 2;
    a.bias[0] = (sparkmono_bias){3, 1.0f};
    a.bias[1] = (sparkmono_bias){4, 50.0f}; /* not allowed: stays -inf */
    a.repetition_penalty = 2.0f;
    row = sm_lp_apply(&ws, lg, NV, &a, hist, 6, 4, extra, 2, eos, 1);
    bad = 0;
    for (int i = 0; i < NV; i++) {
        double x = -INFINITY;
        if (i == 3) x = (0.25 + 1.0) / 2.0; /* in the history: divided */
        if (i == 9) x = 1.0 / 2.0;
        if ((float)x != row[i]) bad++, printf("  allowed: id %d is %g, expected %g\n", i, (double)row[i], x);
    }
    CHECK(bad == 0, "%d ids differ from allowed ids by hand", bad);
    CHECK(sm_lp_argmax(row, NV) == 3, "allowed argmax %d, expected 3", sm_lp_argmax(row, NV));
    /* the scratch is clean and the raw row untouched */
    int nz = 0;
    for (int i = 0; i < NV; i++) nz += ws.count[i] != 0 || ws.seen[i] != 0;
    CHECK(nz == 0 && lg[11] == 3.0f, "%d scratch entries left non-zero", nz);
    sm_lp_ws_free(&ws);
}

/* ---- the logprob summary (ref_logprobs_row, what every backend hands back) ----------------- */

/* The test's own log-softmax of row [n] in double (the oracle of the summaries). */
static void log_softmax_d(const float *row, int n, double *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < n; i++) sum += exp(row[i] - mx);
    for (int i = 0; i < n; i++) out[i] = row[i] - mx - log(sum);
}

static void test_summary(void) {
    enum { NV = 12 };
    const float lg[NV] = {1.5f, -0.5f, 3.0f, 0.25f, -3.0f, 0.0f, 4.0f, -1.0f, 0.75f, 1.0f, -2.5f, 3.0f};
    double ls[NV];
    log_softmax_d(lg, NV, ls);
    sm_lp_sum s;
    ref_logprobs_row(lg, NV, 5, 3, &s);
    /* the largest five, ties (3.0 at ids 2 and 11) to the lowest id */
    const int want[5] = {6, 2, 11, 0, 9};
    int bad = s.bad || s.n != 5 || s.lmax != 4.0f || s.tok_l != lg[3];
    for (int j = 0; j < 5 && !bad; j++) bad |= s.top_ids[j] != want[j] || s.top_l[j] != lg[want[j]];
    CHECK(!bad, "summary: n %d lmax %g, ids %d %d %d %d %d", s.n, (double)s.lmax, s.top_ids[0], s.top_ids[1], s.top_ids[2],
          s.top_ids[3], s.top_ids[4]);
    /* every id's logprob through the one formula equals the log-softmax */
    double worst = 0, sum = 0;
    for (int i = 0; i < NV; i++) {
        double d = fabs(sm_lp_value(&s, lg[i]) - ls[i]);
        worst = d > worst ? d : worst;
        sum += exp(sm_lp_value(&s, lg[i]));
    }
    CHECK(worst < 1e-6 && fabs(sum - 1) < 1e-6, "summary: worst logprob error %g, probabilities sum to %.9g", worst, sum);
    /* k above the ids: every id, in order; a NaN or Inf row is bad */
    ref_logprobs_row(lg, 3, 20, -1, &s);
    CHECK(s.n == 3 && s.top_ids[0] == 2 && s.top_ids[1] == 0 && s.top_ids[2] == 1 && s.tok_l == -INFINITY, "k > n: n %d", s.n);
    float nanrow[3] = {0.0f, NAN, 1.0f}, infrow[3] = {0.0f, INFINITY, 1.0f};
    ref_logprobs_row(nanrow, 3, 2, 2, &s);
    int b1 = s.bad, r1 = s.tok_rank;
    ref_logprobs_row(infrow, 3, 2, 0, &s);
    CHECK(b1 && s.bad && r1 == 0 && s.tok_rank == 0, "a NaN / Inf row is not bad (%d, %d) or ranks its id (%d, %d)", b1, s.bad,
          r1, s.tok_rank);
}

/* The oracle's rank of tok in l [n <= 16]: its place once the ids are sorted in the top list's order. */
static const float *g_rank_row;
static int rank_cmp(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = g_rank_row[i], y = g_rank_row[j];
    return x > y ? -1 : x < y ? 1 : i - j; /* larger first, ties to the lower id (-0 == +0) */
}
static int rank_oracle(const float *l, int n, int tok) {
    int ids[16];
    for (int v = 0; v < n; v++) ids[v] = v;
    g_rank_row = l;
    qsort(ids, (size_t)n, sizeof(int), rank_cmp);
    for (int p = 0; p < n; p++)
        if (ids[p] == tok) return p + 1;
    return 0;
}

/* tok_rank: every id of rows with ties (3.0 twice, -0 beside +0) and masked ids (-inf) against
 * the oracle, an id of the top list ranked as its place there; none, out of range, bad: 0. */
static void test_summary_rank(void) {
    enum { NV = 12 };
    const float rows[3][NV] = {
        {1.5f, -0.5f, 3.0f, 0.25f, -3.0f, 0.0f, 4.0f, -1.0f, 0.75f, 1.0f, -2.5f, 3.0f},
        {-0.0f, 2.0f, -INFINITY, 0.0f, 2.0f, -INFINITY, -1.0f, 2.0f, -INFINITY, 0.5f, -0.0f, 2.0f},
        {-INFINITY, 1.0f, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 1.0f, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
    };
    int bad = 0, seen_in = 0, seen_out = 0;
    for (int r = 0; r < 3; r++)
        for (int k = 1; k <= 5; k += 4)
            for (int tok = 0; tok < NV; tok++) {
                sm_lp_sum s;
                ref_logprobs_row(rows[r], NV, k, tok, &s);
                const int want = rank_oracle(rows[r], NV, tok);
                int at = 0; /* its place in the top list, 0: not there */
                for (int j = 0; j < s.n; j++) at = s.top_ids[j] == tok ? j + 1 : at;
                seen_in += at > 0, seen_out += at == 0;
                if ((s.bad || s.tok_rank != want || (at && s.tok_rank != at)) && bad++ < 4)
                    printf("  row %d k %d id %d: rank %d, oracle %d, top place %d\n", r, k, tok, s.tok_rank, want, at);
            }
    CHECK(bad == 0 && seen_in > 0 && seen_out > 0, "tok_rank: %d ids differ (%d in a top list, %d out)", bad, seen_in, seen_out);
    /* by hand: a tie to the lower id (vLLM ranks id 2 third: three logits >= its 3.0), an id
     * after the top list, -0 tied with +0, a masked id after every finite one */
    sm_lp_sum s;
    int got[6];
    ref_logprobs_row(rows[0], NV, 5, 2, &s), got[0] = s.tok_rank;
    ref_logprobs_row(rows[0], NV, 5, 11, &s), got[1] = s.tok_rank;
    ref_logprobs_row(rows[0], NV, 5, 3, &s), got[2] = s.tok_rank;
    ref_logprobs_row(rows[1], NV, 5, 10, &s), got[3] = s.tok_rank;
    ref_logprobs_row(rows[1], NV, 5, 5, &s), got[4] = s.tok_rank;
    ref_logprobs_row(rows[2], NV, 5, 0, &s), got[5] = s.tok_rank;
    CHECK(got[0] == 2 && got[1] == 3 && got[2] == 7 && got[3] == 8 && got[4] == 11 && got[5] == 3,
          "tok_rank by hand: %d %d %d %d %d %d", got[0], got[1], got[2], got[3], got[4], got[5]);
    /* none named, or an id >= vocab_used: unknown */
    ref_logprobs_row(rows[0], NV, 5, -1, &s), got[0] = s.tok_rank;
    ref_logprobs_row(rows[0], NV - 2, 5, NV - 1, &s), got[1] = s.tok_rank;
    CHECK(got[0] == 0 && got[1] == 0, "tok_rank of no id %d, of an id >= vocab_used %d", got[0], got[1]);
}

static void test_check(void) {
    static struct { const char *want; sparkmono_sampling s; } c[14];
    memset(c, 0, sizeof c);
    c[0].want = "presence_penalty 2.5 is not in [-2, 2]", c[0].s.presence_penalty = 2.5f;
    c[1].want = "frequency_penalty -3 is not in [-2, 2]", c[1].s.frequency_penalty = -3;
    c[2].want = "repetition_penalty -1 is not a finite number > 0", c[2].s.repetition_penalty = -1;
    c[3].want = "min_tokens -1 is negative", c[3].s.min_tokens = -1;
    c[4].want = "logit_bias id 5000 is outside the vocabulary [0, 1000)", c[4].s.n_bias = 1, c[4].s.bias[0].id = 5000;
    c[5].want = "logit_bias of id 3 is 101, not in [-100, 100]", c[5].s.n_bias = 1, c[5].s.bias[0] = (sparkmono_bias){3, 101};
    c[6].want = "stop id -2 is outside the vocabulary [0, 1000)", c[6].s.n_stop_ids = 1, c[6].s.stop_ids[0] = -2;
    c[7].want = "ignore_eos 2 is not 0 or 1", c[7].s.ignore_eos = 2;
    c[8].want = "allowed id 1000 is outside the vocabulary [0, 1000)", c[8].s.n_allowed_ids = 2, c[8].s.allowed_ids[1] = 1000;
    c[9].want = "1025 allowed ids, not in [0, 1024]", c[9].s.n_allowed_ids = 1025;
    c[10].want = "bad word 1 has 0 ids", c[10].s.n_bad_words = 2, c[10].s.bad_word_len[0] = 1;
    c[11].want = "bad word 0 holds id -1, outside the vocabulary [0, 1000)", c[11].s.n_bad_words = 1,
    c[11].s.bad_word_len[0] = 2, c[11].s.bad_word_ids[1] = -1;
    c[12].want = "bad word 1 has 500 ids (each has at least one, at most 512 in all)", c[12].s.n_bad_words = 2,
    c[12].s.bad_word_len[0] = 20, c[12].s.bad_word_len[1] = 500;
    c[13].want = "65 bad words, not in [0, 64]", c[13].s.n_bad_words = 65;
    for (int i = 0; i < 14; i++) {
        sm_err e = {{0}};
        int rc = sm_lp_check(&c[i].s, 1000, &e);
        CHECK(rc == -1 && strstr(e.msg, c[i].want), "case %d: rc %d, '%s' (want '%s')", i, rc, e.msg, c[i].want);
    }
    sparkmono_sampling z = {.temperature = 0};
    sm_err e = {{0}};
    CHECK(sm_lp_check(&z, 1000, &e) == 0 && !sm_lp_active(&z), "all zero: %s", e.msg);
}

/* ---- through the engine ----------------------------------------------------------------- */

/* One request of prompt [plen] under s on an engine of R rows: out [mt] (*nout), *done, *acc. */
static sm_status run_one(sparkmono_model *m, int R, const int *prompt, int plen, int mt, const sparkmono_sampling *s,
                         int *out, int *nout, int *done, int *acc) {
    sparkmono_engine_opts o = {0};
    o.request_rows = R;
    o.max_len = plen + mt;
    o.threads = 2;
    sparkmono_engine *g;
    sm_status st = sparkmono_engine_create(m, &o, &g);
    if (st) return st;
    int req;
    const int *ids;
    sparkmono_request_info info;
    if (!(st = sparkmono_add_sampled(g, prompt, plen, mt, s, &req)) && !(st = sparkmono_generate(g)) &&
        !(st = sparkmono_output(g, req, &ids, nout)) && !(st = sparkmono_request_get_info(g, req, &info))) {
        memcpy(out, ids, (size_t)*nout * sizeof(int));
        *done = info.done;
        *acc = info.accepted;
    }
    sparkmono_engine_destroy(g);
    return st;
}

static const int g_prompt[8] = {3, 4, 5, 6, 7, 8, 3, 4};

static void test_stop_rules(void) {
    int out[40], n, done, acc;
    /* eos (id 2) pushed to the top: the first token ends the request */
    sparkmono_sampling s = {.temperature = 0};
    s.n_bias = 1;
    s.bias[0] = (sparkmono_bias){2, 100};
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &s, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(n == 1 && out[0] == 2 && done == 1, "eos biased: n %d first %d done %d", n, out[0], done);
    /* min_tokens 5: five other ids first, then eos */
    s.min_tokens = 5;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &s, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    int no_eos = 1;
    for (int i = 0; i < 5 && i < n; i++) no_eos &= out[i] != 2;
    CHECK(n == 6 && no_eos && out[5] == 2 && done == 1, "min_tokens 5: n %d last %d done %d", n, out[n - 1], done);
    /* ignore_eos: eos every time, max_tokens reached */
    s.min_tokens = 0;
    s.ignore_eos = 1;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &s, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(n == 20 && out[19] == 2 && done == 2, "ignore_eos: n %d done %d", n, done);
    /* a stop id ends the request like eos: the cycle's 4th token (8 after 5 6 7) */
    sparkmono_sampling t = {.temperature = 0};
    int base[40], nb;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, NULL, base, &nb, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    t.n_stop_ids = 1;
    t.stop_ids[0] = base[3];
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &t, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(n == 4 && !memcmp(out, base, 4 * sizeof(int)) && done == 1, "stop id %d: n %d done %d", base[3], n, done);
    /* a bias of -100 on the cycle's next id: it never comes */
    t.n_stop_ids = 0;
    t.n_bias = 1;
    t.bias[0] = (sparkmono_bias){base[0], -100};
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &t, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    int seen = 0;
    for (int i = 0; i < n; i++) seen += out[i] == base[0];
    CHECK(seen == 0 && out[0] != base[0], "id %d biased -100 still comes %d times", base[0], seen);
    /* a bad processor field is refused at add, with its line */
    sparkmono_sampling b = {.temperature = 0};
    b.repetition_penalty = -2;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &b, out, &n, &done, &acc) == SM_E_INVALID &&
              strstr(sparkmono_errmsg(), "repetition_penalty -2 is not a finite number > 0"),
          "bad repetition_penalty: '%s'", sparkmono_errmsg());
}

/* Allowed ids and bad words through the engine (greedy, R = 8 on the cycle model): every id is
 * an allowed one, eos only where listed; a one-id bad word never comes; a two-id one never
 * completes (the cycle's next id after its first), its first id still comes. */
static void test_allowed_bad_words(void) {
    int base[40], nb, out[40], n, done, acc;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, NULL, base, &nb, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    sparkmono_sampling s = {.temperature = 0};
    const int allow[4] = {9, 4, 12, 2};
    s.n_allowed_ids = 4;
    memcpy(s.allowed_ids, allow, sizeof allow);
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &s, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    int outside = 0;
    for (int i = 0; i < n; i++) outside += out[i] != 9 && out[i] != 4 && out[i] != 12 && out[i] != 2;
    CHECK(outside == 0 && n >= 1, "allowed ids: %d of %d ids outside them", outside, n);
    /* a bad word of one id: base[3] never; of two: base[1] never right after base[0] (the first id) */
    sparkmono_sampling b = {.temperature = 0};
    b.n_bad_words = 2;
    b.bad_word_len[0] = 1, b.bad_word_ids[0] = base[3];
    b.bad_word_len[1] = 2, b.bad_word_ids[1] = base[0], b.bad_word_ids[2] = base[1];
    b.ignore_eos = 1;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &b, out, &n, &done, &acc) == SM_OK, "%s", sparkmono_errmsg());
    int seen3 = 0, pairs = 0;
    for (int i = 0; i < n; i++) {
        seen3 += out[i] == base[3];
        pairs += i > 0 && out[i - 1] == base[0] && out[i] == base[1];
    }
    CHECK(seen3 == 0 && pairs == 0 && out[0] == base[0] && out[1] != base[1] && n == 20,
          "bad words: id %d came %d times, %d %d came %d times, first ids %d %d, n %d", base[3], seen3, base[0], base[1], pairs,
          out[0], out[1], n);
    /* a bad id is refused at add, with its line */
    b.bad_word_ids[2] = 1 << 20;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 20, &b, out, &n, &done, &acc) == SM_E_INVALID &&
              strstr(sparkmono_errmsg(), "bad word 1 holds id 1048576, outside the vocabulary"),
          "bad word id: '%s'", sparkmono_errmsg());
}

/* The processors of case i (0..9), each alone, on top of temperature T and seed. */
static sparkmono_sampling proc_case(int i, float T, unsigned long long seed) {
    sparkmono_sampling s = {.temperature = T, .top_k = T > 0 ? 40 : 0, .top_p = T > 0 ? 0.95f : 0, .seed = seed};
    switch (i) {
    case 0: s.presence_penalty = 1.5f; break;
    case 1: s.frequency_penalty = 0.8f; break;
    case 2: s.repetition_penalty = 1.8f; break;
    case 3: s.repetition_penalty = 0.6f; break; /* below 1: repeats favoured */
    case 4: s.n_bias = 2; s.bias[0] = (sparkmono_bias){7, 3.0f}; s.bias[1] = (sparkmono_bias){5, -2.5f}; break;
    case 5: s.min_tokens = 12; s.n_stop_ids = 2; s.stop_ids[0] = 9; s.stop_ids[1] = 12; break;
    case 6: s.presence_penalty = -0.7f; s.frequency_penalty = 0.3f; s.repetition_penalty = 1.2f; s.n_bias = 1;
        s.bias[0] = (sparkmono_bias){11, 1.0f}; s.min_tokens = 3; break;
    case 7: /* allowed ids: half the cycle and a few others */
        for (int v = 3; v < 40; v += 2) s.allowed_ids[s.n_allowed_ids++] = v;
        break;
    case 8: { /* bad words: cycle pairs and triples (drafts run into them), one id always */
        static const int w[] = {6, 7, 10, 11, 12, 15, 16, 17, 9};
        static const int len[] = {2, 3, 3, 1};
        memcpy(s.bad_word_ids, w, sizeof w);
        memcpy(s.bad_word_len, len, sizeof len);
        s.n_bad_words = 4;
        break;
    }
    case 9: s.min_p = 0.3f; s.top_k = 0; s.top_p = 0; break; /* min_p alone (greedy ignores it) */
    }
    return s;
}

static void test_spec_equals_plain(void) {
    static const char *names[10] = {"presence", "frequency", "repetition>1", "repetition<1", "logit_bias", "min_tokens+stop",
                                    "all", "allowed_ids", "bad_words", "min_p"};
    const int MT = 32;
    long acc_total = 0;
    for (int mi = 0; mi < 2; mi++) {
        sparkmono_model *m = mi ? g_rnd : g_cyc;
        for (int i = 0; i < 10; i++)
            for (int samp = 0; samp < 2; samp++)
                for (int seed = 0; seed < (samp ? 4 : 1); seed++) {
                    sparkmono_sampling s = proc_case(i, samp ? 1.0f : 0.0f, 1000 + (unsigned long long)seed);
                    int a[64], b[64], na, nb, da, db, acc_a, acc_b;
                    sm_status sa = run_one(m, 8, g_prompt, 8, MT, &s, a, &na, &da, &acc_a);
                    sm_status sb = run_one(m, 1, g_prompt, 8, MT, &s, b, &nb, &db, &acc_b);
                    CHECK(sa == SM_OK && sb == SM_OK, "%s: %s", names[i], sparkmono_errmsg());
                    CHECK(na == nb && da == db && !memcmp(a, b, (size_t)na * sizeof(int)),
                          "%s model %s %s seed %d: R = 8 (%d ids) differs from R = 1 (%d ids)", names[i],
                          mi ? "random" : "cycle", samp ? "sampled" : "greedy", seed, na, nb);
                    acc_total += acc_a;
                }
    }
    /* the speculative path was taken: drafts were accepted (and so processed from the drafts) */
    CHECK(acc_total > 50, "only %ld drafts accepted over every case", acc_total);
}

/* Ids of out [n] equal to an earlier one. */
static int repeats(const int *out, int n) {
    int r = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (out[j] == out[i]) { r++; break; }
    return r;
}

static void test_direction(void) {
    int a[64], b[64], na, nb, d, acc;
    const int MT = 40;
    /* negative presence / repetition penalties on the random model: more repeated ids than without */
    sparkmono_sampling s = {.temperature = 0};
    CHECK(run_one(g_rnd, 8, g_prompt, 8, MT, NULL, a, &na, &d, &acc) == SM_OK, "%s", sparkmono_errmsg());
    s.presence_penalty = -2.0f;
    s.repetition_penalty = 0.5f;
    CHECK(run_one(g_rnd, 8, g_prompt, 8, MT, &s, b, &nb, &d, &acc) == SM_OK, "%s", sparkmono_errmsg());
    CHECK(repeats(b, nb) > repeats(a, na), "favoured repeats: %d repeated ids, %d without", repeats(b, nb), repeats(a, na));
    /* id 7 pushed up by a bias comes often; a frequency penalty makes it come less often */
    sparkmono_sampling t = {.temperature = 0};
    t.n_bias = 1;
    t.bias[0] = (sparkmono_bias){7, 6.0f};
    CHECK(run_one(g_rnd, 8, g_prompt, 8, MT, &t, a, &na, &d, &acc) == SM_OK, "%s", sparkmono_errmsg());
    t.frequency_penalty = 2.0f;
    CHECK(run_one(g_rnd, 8, g_prompt, 8, MT, &t, b, &nb, &d, &acc) == SM_OK, "%s", sparkmono_errmsg());
    int ca = 0, cb = 0;
    for (int i = 0; i < na; i++) ca += a[i] == 7;
    for (int i = 0; i < nb; i++) cb += b[i] == 7;
    CHECK(ca > 5 && cb < ca, "id 7 biased: %d times, %d with a frequency penalty", ca, cb);
}

/* Logprobs: each generated id's logprob and top k equal a log-softmax in double of the prefill
 * logits of its prefix (R = 1, alone, same world), greedy and sampled, with and without processors, on the
 * cycle model (drafts accepted: several ids of one verify step), on a world of 2 ranks (the
 * summaries of gathered rows) and with top_logprobs 0; speculative R = 8 throughout. */
static void test_logprobs(void) {
    enum { MT = 10, NCASE = 6 };
    static const char *const name[NCASE] = {"greedy", "sampled", "processed", "greedy, cycle model", "greedy, world 2",
                                            "sampled, top 0"};
    for (int c = 0; c < NCASE; c++) {
        const int K = c == 5 ? 0 : 5, greedy = c != 1 && c != 5;
        sparkmono_model *md = c == 3 ? g_cyc : g_rnd;
        sparkmono_sampling s = {.temperature = greedy ? 0 : 0.9f, .seed = 17};
        if (c == 2) s.repetition_penalty = 0.5f; /* the logprobs stay those of the raw distribution */
        s.logprobs = 1;
        s.top_logprobs = K;
        sparkmono_engine_opts o = {0};
        o.request_rows = 8;
        o.max_len = 8 + MT;
        o.threads = 2;
        o.world = c == 4 ? 2 : 0;
        sparkmono_engine *g;
        int req, n, k;
        const int *ids;
        const float *lp, *tlp;
        const int *tid;
        CHECK(sparkmono_engine_create(md, &o, &g) == SM_OK, "%s", sparkmono_errmsg());
        CHECK(sparkmono_add_sampled(g, g_prompt, 8, MT, &s, &req) == SM_OK && sparkmono_generate(g) == SM_OK &&
                  sparkmono_output(g, req, &ids, &n) == SM_OK && sparkmono_logprobs(g, req, &lp, &tid, &tlp, &k) == SM_OK,
              "%s", sparkmono_errmsg());
        CHECK(n == MT && k == K, "n %d k %d", n, k);
        sparkmono_request_info ri;
        CHECK(sparkmono_request_get_info(g, req, &ri) == SM_OK, "%s", sparkmono_errmsg());
        if (c == 3) CHECK(ri.accepted > 0, "the cycle model accepted no draft (steps %d)", ri.steps);
        int all[8 + MT];
        memcpy(all, g_prompt, sizeof g_prompt);
        memcpy(all + 8, ids, (size_t)n * sizeof(int));
        float *lg = malloc((size_t)(8 + MT) * g_V * sizeof(float));
        double *ls = malloc((size_t)g_V * sizeof(double));
        sparkmono_engine_opts o1 = {0};
        o1.request_rows = 1;
        o1.max_len = 8 + MT;
        o1.threads = 2;
        o1.world = o.world; /* W ranks sum in their own order: the reference runs the same world */
        sparkmono_engine *g1;
        int r1, bad = 0;
        CHECK(sparkmono_engine_create(md, &o1, &g1) == SM_OK && sparkmono_add(g1, all, 8 + n - 1, 0, &r1) == SM_OK &&
                  sparkmono_prefill(g1, r1, lg) == SM_OK, "%s", sparkmono_errmsg());
        for (int j = 0; j < n; j++) {
            /* the row of position 8 + j: the prefill row of its prefix's last token */
            log_softmax_d(lg + (size_t)(8 + j - 1) * g_V, g_vu, ls);
            if (fabs(ls[ids[j]] - lp[j]) > 1e-5) bad++;
            for (int t = 0; t < K; t++) {
                if (fabs(ls[tid[j * K + t]] - tlp[j * K + t]) > 1e-5) bad++;
                if (t && tlp[j * K + t] > tlp[j * K + t - 1]) bad++; /* descending */
            }
            double mx = -INFINITY; /* the first alternative is the row's most likely id */
            for (int i = 0; i < g_vu; i++) mx = ls[i] > mx ? ls[i] : mx;
            if (K && fabs(mx - tlp[j * K]) > 1e-5) bad++;
            if (K && greedy && c != 2 && tid[j * K] != ids[j]) bad++; /* greedy: the id itself comes first */
        }
        CHECK(bad == 0, "case %s: %d logprobs differ from the log-softmax of the prefill logits", name[c], bad);
        sparkmono_engine_destroy(g1);
        sparkmono_engine_destroy(g);
        free(lg);
        free(ls);
    }
    /* logprobs out of range are refused with their line */
    sparkmono_sampling b = {.temperature = 0};
    b.logprobs = 1;
    b.top_logprobs = 21;
    int out[4], n, d, acc;
    CHECK(run_one(g_cyc, 8, g_prompt, 8, 4, &b, out, &n, &d, &acc) == SM_E_INVALID &&
              strstr(sparkmono_errmsg(), "top_logprobs 21 is not in [0, 20]"),
          "top_logprobs 21: '%s'", sparkmono_errmsg());
}

/* Prompt logprobs: each prompt id's logprob (from the second) and its position's top k equal a
 * log-softmax of the prefill logits of the row before it, over chunked prefills (chunk 3) and a
 * world of 2; the same numbers reach the batch's first event, and the one event of max_tokens 0. */
static void test_prompt_logprobs(void) {
    enum { PL = 8, K = 3 };
    for (int c = 0; c < 3; c++) {
        sparkmono_sampling s = {.temperature = 0};
        s.prompt_logprobs = 1;
        s.logprobs = c != 1;
        s.top_logprobs = K;
        sparkmono_engine_opts o = {0};
        o.request_rows = 8;
        o.max_len = 32;
        o.threads = 2;
        o.prefill_chunk = c == 0 ? 3 : 0;
        o.world = c == 2 ? 2 : 0;
        sparkmono_engine *g, *g1;
        int req, r1, k = 0, bad = 0;
        const float *lp, *tlp;
        const int *rank, *tid;
        float *lg = malloc((size_t)PL * g_V * sizeof(float));
        double *ls = malloc((size_t)g_V * sizeof(double));
        CHECK(sparkmono_engine_create(g_rnd, &o, &g) == SM_OK && sparkmono_add_sampled(g, g_prompt, PL, 4, &s, &req) == SM_OK &&
                  sparkmono_prefill(g, req, NULL) == SM_OK && sparkmono_prompt_logprobs(g, req, &lp, &rank, &tid, &tlp, &k) == SM_OK,
              "%s", sparkmono_errmsg());
        sparkmono_engine_opts o1 = {0};
        o1.max_len = 32;
        o1.threads = 2;
        o1.world = o.world;
        CHECK(sparkmono_engine_create(g_rnd, &o1, &g1) == SM_OK && sparkmono_add(g1, g_prompt, PL, 0, &r1) == SM_OK &&
                  sparkmono_prefill(g1, r1, lg) == SM_OK, "%s", sparkmono_errmsg());
        CHECK(k == K && isnan(lp[0]) && rank[0] == 0 && tid[0] == -1, "k %d, entry 0: %g rank %d %d", k, (double)lp[0], rank[0],
              tid[0]);
        int past = 0; /* prompt ids past their position's top list */
        for (int j = 1; j < PL; j++) {
            const float *row = lg + (size_t)(j - 1) * g_V;
            log_softmax_d(row, g_vu, ls);
            if (fabs(ls[g_prompt[j]] - lp[j]) > 1e-5) bad++;
            for (int t = 0; t < K; t++) bad += fabs(ls[tid[j * K + t]] - tlp[j * K + t]) > 1e-5;
            /* the rank: the ids before it (a larger logit, or an equal one at a lower id), its
             * place in the top list when it is there */
            int before = 0, at = 0;
            for (int v = 0; v < g_vu; v++) before += row[v] > row[g_prompt[j]] || (row[v] == row[g_prompt[j]] && v < g_prompt[j]);
            for (int t = 0; t < K; t++) at = tid[j * K + t] == g_prompt[j] ? t + 1 : at;
            bad += rank[j] != 1 + before || (at && rank[j] != at);
            past += rank[j] > K;
        }
        CHECK(bad == 0 && past > 0, "case %d: %d prompt logprobs or ranks differ from the prefill logits' (%d ids past the top)", c,
              bad, past);
        /* through the batch: the first event with ids carries them; max_tokens 0 (the prompt
         * alone, as echo scores a text), its one event, an end without ids */
        float first[PL];
        int first_rank[PL];
        memcpy(first, lp, sizeof first);
        memcpy(first_rank, rank, sizeof first_rank);
        sparkmono_engine_destroy(g);
        sparkmono_batch *bt;
        long long id[2];
        const sparkmono_batch_event *ev;
        int nev, seen[2] = {0, 0}, ends0 = 0, tag[2];
        CHECK(sparkmono_engine_create(g_rnd, &o, &g) == SM_OK && sparkmono_batch_create(g, -1, &bt) == SM_OK &&
                  sparkmono_batch_submit(bt, g_prompt, PL, 4, &s, &tag[0], &id[0]) == SM_OK &&
                  sparkmono_batch_submit(bt, g_prompt, PL, 0, &s, &tag[1], &id[1]) == SM_OK,
              "%s", sparkmono_errmsg());
        for (int step = 0; step < 8 && !(seen[0] && seen[1]); step++) {
            CHECK(sparkmono_batch_step(bt, &ev, &nev) == SM_OK, "%s", sparkmono_errmsg());
            for (int i = 0; i < nev; i++) {
                const int w = ev[i].user == &tag[1];
                if (w) {
                    ends0++;
                    CHECK(ev[i].n == 0 && ev[i].ngen == 0 && ev[i].done == SM_BATCH_LENGTH,
                          "max_tokens 0: an event with %d ids, done %d", ev[i].n, ev[i].done);
                }
                if (ev[i].prompt_lp) {
                    seen[w]++;
                    CHECK(ev[i].prompt_len == PL && ev[i].top == K &&
                              memcmp(ev[i].prompt_lp + 1, first + 1, (PL - 1) * sizeof(float)) == 0 &&
                              memcmp(ev[i].prompt_rank, first_rank, sizeof first_rank) == 0,
                          "the batch event's prompt logprobs differ (max_tokens %d)", w ? 0 : 4);
                }
            }
        }
        CHECK(seen[0] == 1 && seen[1] == 1 && ends0 == 1,
              "case %d: prompt logprobs in %d / %d events (max_tokens 4 / 0), max_tokens 0 ended %d times", c, seen[0],
              seen[1], ends0);
        sparkmono_batch_destroy(bt);
        sparkmono_engine_destroy(g);
        sparkmono_engine_destroy(g1);
        free(lg);
        free(ls);
    }
}

int main(void) {
    if (tm_open_tiny_pair(g_tmp, sizeof g_tmp, "sm_test_logitproc", &g_cyc, &g_rnd, &g_V, &g_vu)) return 1;

    RUN(test_apply_reference);
    RUN(test_allowed_bad_words_reference);
    RUN(test_check);
    RUN(test_stop_rules);
    RUN(test_allowed_bad_words);
    RUN(test_spec_equals_plain);
    RUN(test_direction);
    RUN(test_summary);
    RUN(test_summary_rank);
    RUN(test_logprobs);
    RUN(test_prompt_logprobs);

    sparkmono_model_close(g_cyc);
    sparkmono_model_close(g_rnd);
    tm_rmtree(g_tmp);
    return TEST_DONE();
}
