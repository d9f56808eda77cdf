/* test_engine.c: the engine (include/sparkmono.h), the n-gram drafter, greedy acceptance and
 * the .npy writer.
 *
 * The central check is docs/model.md section 8's invariant: greedy generation with speculative
 * verify steps (R = 4, 8) emits exactly the tokens of plain decoding (R = 1), and several
 * requests batched in one verify step emit exactly what each does alone.  Both follow from
 * row independence (the CPU backend is bit-exact across row counts), so equality is exact.
 * The model is a random "tiny" checkpoint written once into a temp directory.  We rejected a
 * checked-in model file: make-model regenerates it from a seed in milliseconds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "tmodel.h"
#include "model/codec.h"
#include "model/config.h"
#include "cpu/ops.h"
#include "engine/drafter.h"
#include "engine/engine.h"
#include "testing/makemodel.h"
#include "model/npy.h"
#include "model/rng.h"
#include "sparkmono.h"

static char g_tmp[512];          /* temp root */
static char g_dir[600];          /* tiny model, MXFP4 experts in layers 1..L-2 */
static char g_dir_bf16[600];     /* tiny model, BF16 experts (for online MXFP4) */
static sparkmono_model *g_model; /* opened g_dir */
static int g_V;                  /* its vocab size */

static int one_line(const char *s) { return s && s[0] && !strchr(s, '\n'); }

/* ---- drafter ---------------------------------------------------------------------------- */

/* Brute-force reference of sm_draft_ngram. */
static int draft_ref(const int *h, int n, int nd, int *out) {
    int ext[256];
    memcpy(ext, h, (size_t)n * sizeof(int));
    for (int g = 3; g >= 1; g--) {
        int best = -1;
        for (int i = 0; i + g < n; i++) {
            int same = 1;
            for (int j = 0; j < g; j++) same &= h[i + j] == h[n - g + j];
            if (same) best = i;
        }
        if (best < 0) continue;
        for (int k = 0; k < nd; k++) ext[n + k] = out[k] = ext[best + g + k];
        return g;
    }
    for (int k = 0; k < nd; k++) out[k] = h[n - 1];
    return 0;
}

static void test_drafter(void) {
    int out[8];
    { int h[] = {1, 2, 3, 9, 1, 2, 3}; int g = sm_draft_ngram(h, 7, 3, out);
      CHECK(g == 3 && out[0] == 9 && out[1] == 1 && out[2] == 2, "3-gram: g %d out %d %d %d", g, out[0], out[1], out[2]); }
    { int h[] = {5, 1, 2, 7, 8, 1, 2}; int g = sm_draft_ngram(h, 7, 3, out);
      CHECK(g == 2 && out[0] == 7 && out[1] == 8 && out[2] == 1, "2-gram: g %d out %d %d %d", g, out[0], out[1], out[2]); }
    { int h[] = {1, 2, 5, 1, 2, 6, 1, 2}; int g = sm_draft_ngram(h, 8, 3, out); /* latest occurrence wins */
      CHECK(g == 2 && out[0] == 6 && out[1] == 1 && out[2] == 2, "latest: g %d out %d %d %d", g, out[0], out[1], out[2]); }
    { int h[] = {4, 7, 4, 7}; int g = sm_draft_ngram(h, 4, 5, out); /* continues through its own drafts */
      CHECK(g == 2 && out[0] == 4 && out[1] == 7 && out[2] == 4 && out[3] == 7 && out[4] == 4, "periodic: g %d", g); }
    { int h[] = {3, 9, 5, 3}; int g = sm_draft_ngram(h, 4, 3, out);
      CHECK(g == 1 && out[0] == 9 && out[1] == 5 && out[2] == 3, "1-gram: g %d out %d %d %d", g, out[0], out[1], out[2]); }
    { int h[] = {1, 2, 3}; int g = sm_draft_ngram(h, 3, 3, out);
      CHECK(g == 0 && out[0] == 3 && out[1] == 3 && out[2] == 3, "fallback: g %d", g); }
    { int h[] = {7}; int g = sm_draft_ngram(h, 1, 2, out);
      CHECK(g == 0 && out[0] == 7 && out[1] == 7, "single token: g %d", g); }
    { out[0] = -5; int h[] = {1, 1}; int g = sm_draft_ngram(h, 2, 0, out);
      CHECK(g == 0 && out[0] == -5, "ndraft 0 writes nothing"); }
    /* random histories over small alphabets against the brute-force reference */
    uint64_t s = 11;
    int bad = 0;
    for (int it = 0; it < 2000; it++) {
        int h[64], n = 1 + (int)(sm_rng_next(&s) % 60), alpha = 2 + (int)(sm_rng_next(&s) % 6), nd = (int)(sm_rng_next(&s) % 8);
        for (int i = 0; i < n; i++) h[i] = (int)(sm_rng_next(&s) % (uint64_t)alpha);
        int a[8], b[8];
        int ga = sm_draft_ngram(h, n, nd, a), gb = draft_ref(h, n, nd, b);
        if ((nd > 0 && ga != gb) || memcmp(a, b, (size_t)nd * sizeof(int))) bad++;
    }
    CHECK(bad == 0, "%d of 2000 random histories differ from the reference", bad);
}

static void test_accept(void) {
    int out[8];
    { int t[] = {5, 6, 7, 8}, a[] = {6, 7, 9, 1}; int k = sm_accept_greedy(t, a, 4, out);
      CHECK(k == 3 && out[0] == 6 && out[1] == 7 && out[2] == 9, "partial: k %d", k); }
    { int t[] = {5, 6, 7}, a[] = {6, 7, 4}; int k = sm_accept_greedy(t, a, 3, out);
      CHECK(k == 3 && out[0] == 6 && out[1] == 7 && out[2] == 4, "all + bonus: k %d", k); }
    { int t[] = {5, 1, 3}, a[] = {2, 3, 4}; int k = sm_accept_greedy(t, a, 3, out); /* a later match does not count */
      CHECK(k == 1 && out[0] == 2, "none: k %d out %d", k, out[0]); }
    { int t[] = {5}, a[] = {9}; int k = sm_accept_greedy(t, a, 1, out);
      CHECK(k == 1 && out[0] == 9, "one row: k %d", k); }
}

/* ---- npy -------------------------------------------------------------------------------- */

static void test_npy(void) {
    char path[700];
    snprintf(path, sizeof path, "%s/a.npy", g_tmp);
    uint64_t s = 5;
    float x[3 * 5];
    for (int i = 0; i < 15; i++) x[i] = (float)((double)(sm_rng_next(&s) >> 11) / 9007199254740992.0 * 2 - 1);
    int64_t shape[2] = {3, 5};
    sm_err e = {{0}};
    CHECK(sm_npy_write_f32(path, x, 2, shape, &e) == 0, "write: %s", e.msg);
    /* the raw header as numpy reads it */
    FILE *f = fopen(path, "rb");
    unsigned char buf[256] = {0};
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    size_t hl = (size_t)buf[8] | (size_t)buf[9] << 8;
    CHECK(got == 10 + hl + 60, "file size %zu, header %zu", got, hl);
    CHECK(memcmp(buf, "\x93NUMPY\x01\x00", 8) == 0, "magic / version 1.0");
    CHECK((10 + hl) % 64 == 0, "header not padded to 64: %zu", 10 + hl);
    char hdr[200] = {0};
    memcpy(hdr, buf + 10, hl < 199 ? hl : 199);
    CHECK(strstr(hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }") == hdr, "dict: %s", hdr);
    CHECK(hl > 0 && hdr[hl - 1] == '\n', "header ends in newline");
    CHECK(memcmp(buf + 10 + hl, x, 60) == 0, "data bytes");
    /* read back */
    float *d = NULL;
    int nd = 0;
    int64_t sh[SM_NPY_MAX_DIMS];
    CHECK(sm_npy_read_f32(path, &d, &nd, sh, &e) == 0, "read: %s", e.msg);
    CHECK(nd == 2 && sh[0] == 3 && sh[1] == 5 && d && memcmp(d, x, 60) == 0, "read back shape/data");
    free(d);
    /* 1-D shape is written as a one-element tuple */
    int64_t s1[1] = {7};
    float y[7] = {1, 2, 3, 4, 5, 6, 7};
    CHECK(sm_npy_write_f32(path, y, 1, s1, &e) == 0, "write 1-D: %s", e.msg);
    CHECK(sm_npy_read_f32(path, &d, &nd, sh, &e) == 0 && nd == 1 && sh[0] == 7 && d[6] == 7.0f, "1-D read back");
    f = fopen(path, "rb");
    got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(got > 70 && memmem(buf, got, "'shape': (7,)", 13), "1-D shape tuple");
    free(d);
    /* errors: unwritable path names it; truncated file is refused */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.npy", g_tmp);
    CHECK(sm_npy_write_f32(bad, y, 1, s1, &e) == -1 && strstr(e.msg, bad) && one_line(e.msg), "bad path: %s", e.msg);
    CHECK(truncate(path, 100) == 0, "truncate");
    CHECK(sm_npy_read_f32(path, &d, &nd, sh, &e) == -1 && strstr(e.msg, path), "truncated: %s", e.msg);
    remove(path);
}

/* ---- engine ----------------------------------------------------------------------------- */

/* Oracle drafter: proposes the known plain stream, corrupting one draft every third call, so
 * steps accept all drafts, some, or none. */
typedef struct oracle {
    const int *ref;  /* [nref] plain greedy stream of the request */
    int nref, plen;  /* its length; the prompt length */
    int calls;       /* drafter calls so far */
} oracle;

static void oracle_draft(void *arg, int req, const int *hist, int nhist, int nd, int *out) {
    oracle *o = (oracle *)arg + req; /* arg: [max_requests] oracles by request id */
    (void)hist;
    int ngen = nhist - o->plen;
    for (int k = 0; k < nd; k++) out[k] = ngen + k < o->nref ? o->ref[ngen + k] : 5;
    if (nd > 0 && o->calls % 3 == 1) out[o->calls % nd] = (out[o->calls % nd] + 1) % 500;
    o->calls++;
}

/* Generate from each of n prompts in one engine (all batched), R rows; outputs concatenated
 * into out with lengths nout[i]. */
static sm_status gen_batch(sparkmono_model *m, int R, int chunk, int nprompt, int *const *prompts, const int *plen,
                           int max_tokens, int *out, int *nout, int *accepted, oracle *orcs) {
    sparkmono_engine_opts o = {0};
    o.request_rows = R;
    o.max_requests = nprompt;
    o.max_len = 128;
    o.prefill_chunk = chunk;
    o.threads = 2;
    sparkmono_engine *g;
    sm_status s = sparkmono_engine_create(m, &o, &g);
    if (s) return s;
    if (orcs) { /* request ids are 0..nprompt-1 in a fresh engine */
        g->draft_fn = oracle_draft;
        g->draft_arg = orcs;
    }
    int req[16];
    for (int i = 0; i < nprompt && !s; i++) s = sparkmono_add(g, prompts[i], plen[i], max_tokens, &req[i]);
    if (!s) s = sparkmono_generate(g);
    if (accepted) *accepted = 0;
    for (int i = 0; i < nprompt && !s; i++) {
        const int *ids;
        sparkmono_request_info info;
        s = sparkmono_output(g, req[i], &ids, &nout[i]);
        if (!s) s = sparkmono_request_get_info(g, req[i], &info);
        if (s) break;
        memcpy(out + i * max_tokens, ids, (size_t)nout[i] * sizeof(int));
        if (accepted) *accepted += info.accepted;
    }
    sparkmono_engine_destroy(g);
    return s;
}

/* Prompts: a single token, random, a repeated phrase (n-gram drafts find matches at once),
 * one long enough that generation crosses the sliding window (64 in "tiny"), and one token
 * repeated (on the seed-1 tiny model its stream ends in an eos after a few tokens). */
#define NPROMPT 5
#define MT_REF 16 /* tokens of the plain reference streams */
static int g_plen[NPROMPT] = {1, 10, 22, 60, 24};
static int *g_prompts[NPROMPT];
static int g_ref[NPROMPT][MT_REF], g_nref[NPROMPT]; /* plain greedy streams (R = 1) */

static void make_prompts(void) {
    uint64_t s = 2024;
    for (int p = 0; p < NPROMPT; p++) {
        g_prompts[p] = malloc((size_t)g_plen[p] * sizeof(int));
        for (int i = 0; i < g_plen[p]; i++) g_prompts[p][i] = 3 + (int)(sm_rng_next(&s) % (uint64_t)(g_V - 3));
    }
    for (int i = 5; i < g_plen[2]; i++) g_prompts[2][i] = g_prompts[2][i % 5];
    for (int i = 0; i < g_plen[4]; i++) g_prompts[4][i] = 400 % g_V;
}

static void test_plain_reference(void) {
    /* one-token-at-a-time greedy decoding: the reference of every stream below */
    for (int p = 0; p < NPROMPT; p++) {
        sm_status s = gen_batch(g_model, 1, 0, 1, &g_prompts[p], &g_plen[p], MT_REF, g_ref[p], &g_nref[p], NULL, NULL);
        CHECK(s == SM_OK, "plain prompt %d: %s", p, sparkmono_errmsg());
        CHECK(g_nref[p] >= 1 && g_nref[p] <= MT_REF, "plain prompt %d: %d tokens", p, g_nref[p]);
    }
}

/* Does the stream out [n] of a run with max_tokens mt match the reference of prompt p? */
static int same_as_ref(int p, const int *out, int n, int mt) {
    int want = g_nref[p] < mt ? g_nref[p] : mt; /* shorter runs are prefixes */
    return n == want && !memcmp(out, g_ref[p], (size_t)n * sizeof(int));
}

static void test_spec_equals_greedy(void) {
    /* n-gram drafts, R = 4 and 8, each prompt alone */
    const int MT = 10;
    int out[MT_REF], nout, acc_total = 0;
    for (int p = 0; p < NPROMPT; p++) {
        for (int R = 4; R <= 8; R += 4) {
            int acc = 0;
            sm_status s = gen_batch(g_model, R, 0, 1, &g_prompts[p], &g_plen[p], MT, out, &nout, &acc, NULL);
            CHECK(s == SM_OK, "R=%d prompt %d: %s", R, p, sparkmono_errmsg());
            CHECK(same_as_ref(p, out, nout, MT), "R=%d prompt %d: speculative stream (%d tokens) != plain", R, p, nout);
            acc_total += acc;
        }
    }
    printf("  n-gram drafts accepted over all runs: %d (random weights rarely repeat)\n", acc_total);
}

static void test_oracle_drafts(void) {
    /* drafts that are mostly right: steps accept all, some or none of them, and the output is
     * still the plain stream exactly (eos and max_tokens cuts inside accepted drafts) */
    int acc_total = 0, eos_runs = 0;
    for (int p = 0; p < NPROMPT; p++) {
        if (g_nref[p] < MT_REF) eos_runs++;
        for (int R = 4; R <= 8; R += 4) {
            oracle orc = {g_ref[p], g_nref[p], g_plen[p], 0};
            int out[MT_REF], nout, acc = 0;
            sm_status s = gen_batch(g_model, R, 0, 1, &g_prompts[p], &g_plen[p], MT_REF, out, &nout, &acc, &orc);
            CHECK(s == SM_OK, "R=%d prompt %d: %s", R, p, sparkmono_errmsg());
            CHECK(same_as_ref(p, out, nout, MT_REF), "R=%d prompt %d: oracle-drafted stream (%d tokens) != plain", R, p, nout);
            acc_total += acc;
        }
    }
    CHECK(acc_total > 60, "only %d drafts accepted", acc_total);
    printf("  oracle drafts accepted: %d; reference streams ending in eos: %d\n", acc_total, eos_runs);
}

static void test_batched_equals_alone(void) {
    /* every prompt in one engine, each verify step carrying all live requests: n-gram drafts
     * with R = 4 and a small prefill chunk (prompts split over steps), then oracle drafts with
     * R = 8 (requests accept different counts in the same step) */
    int both[NPROMPT * MT_REF], nboth[NPROMPT];
    for (int variant = 0; variant < 2; variant++) {
        int R = variant ? 8 : 4, chunk = variant ? 0 : 7, MT = variant ? MT_REF : 10, acc = 0;
        oracle orcs[NPROMPT];
        for (int p = 0; p < NPROMPT; p++) {
            orcs[p].ref = g_ref[p];
            orcs[p].nref = g_nref[p];
            orcs[p].plen = g_plen[p];
            orcs[p].calls = p; /* requests corrupt drafts on different steps */
        }
        sm_status s = gen_batch(g_model, R, chunk, NPROMPT, g_prompts, g_plen, MT, both, nboth, &acc, variant ? orcs : NULL);
        CHECK(s == SM_OK, "batched R=%d: %s", R, sparkmono_errmsg());
        for (int p = 0; p < NPROMPT; p++)
            CHECK(same_as_ref(p, both + p * MT, nboth[p], MT), "batched R=%d: request %d differs from alone", R, p);
        if (variant) CHECK(acc > 20, "batched oracle: only %d drafts accepted", acc);
    }
}

static void test_lengths(void) {
    sparkmono_engine_opts o = {0};
    o.request_rows = 8;
    o.max_requests = 2;
    o.max_len = 100;
    sparkmono_engine *g;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_OK, "create: %s", sparkmono_errmsg());
    if (!g) return;
    int r0, r1;
    const int MT = 14;
    CHECK(sparkmono_add(g, g_prompts[2], g_plen[2], MT, &r0) == SM_OK, "add: %s", sparkmono_errmsg());
    CHECK(sparkmono_add(g, g_prompts[1], g_plen[1], 9, &r1) == SM_OK, "add: %s", sparkmono_errmsg());
    sparkmono_request_info in;
    int ntok[2], toks[2 * 8], nreq;
    /* verify before prefill does nothing */
    CHECK(sparkmono_verify(g, ntok, toks, &nreq) == SM_OK && nreq == 0, "verify before prefill: %d", nreq);
    CHECK(sparkmono_prefill(g, r0, NULL) == SM_OK, "prefill: %s", sparkmono_errmsg());
    sparkmono_request_get_info(g, r0, &in);
    CHECK(in.prefilled && in.ngen == 1 && in.kv_len == g_plen[2] && g->kv.len[r0] == g_plen[2], "after prefill: ngen %d kv %d", in.ngen, in.kv_len);
    CHECK(sparkmono_prefill(g, r0, NULL) == SM_E_STATE && one_line(sparkmono_errmsg()), "prefill twice: %s", sparkmono_errmsg());
    CHECK(sparkmono_prefill(g, r1, NULL) == SM_OK, "prefill r1: %s", sparkmono_errmsg());
    int ngen[2] = {1, 1}, steps = 0, acc[2] = {0, 0}, stepped[2] = {0, 0};
    int eos = 0;
    for (;;) {
        CHECK(sparkmono_verify(g, ntok, toks, &nreq) == SM_OK, "verify: %s", sparkmono_errmsg());
        if (nreq == 0) break;
        steps++;
        int rq[2] = {r0, r1}, plen[2] = {g_plen[2], g_plen[1]};
        for (int k = 0; k < 2; k++) {
            int q = rq[k];
            sparkmono_request_get_info(g, q, &in);
            if (ntok[q] == 0) continue;
            stepped[k]++;
            CHECK(ntok[q] >= 1 && ntok[q] <= 8, "ntok %d", ntok[q]);
            ngen[k] += ntok[q];
            if (in.done != 1) acc[k] += ntok[q] - 1; /* no eos cut: accepted = emitted - 1 */
            else eos = 1;
            CHECK(in.ngen == ngen[k], "req %d ngen %d != %d", q, in.ngen, ngen[k]);
            /* len grows by accepted + 1: the last token and accepted drafts are committed */
            CHECK(in.kv_len == plen[k] + in.ngen - 1 && g->kv.len[q] == in.kv_len, "req %d kv_len %d", q, in.kv_len);
            CHECK(g->kv.nblk[q] * SM_KV_BLOCK >= in.kv_len, "pages cover the committed length");
            const int *ids;
            int n;
            sparkmono_output(g, q, &ids, &n);
            CHECK(n == in.ngen && !memcmp(ids + n - ntok[q], toks + q * 8, (size_t)ntok[q] * sizeof(int)),
                  "output tail == step tokens");
        }
    }
    sparkmono_request_get_info(g, r0, &in);
    CHECK(in.done && (in.done == 1 || in.ngen == MT), "r0 done %d ngen %d", in.done, in.ngen);
    CHECK(in.steps == stepped[0], "steps %d != %d", in.steps, stepped[0]);
    if (!eos) CHECK(in.accepted == acc[0], "accepted %d != %d", in.accepted, acc[0]);
    sparkmono_request_get_info(g, r1, &in);
    CHECK(in.done && (in.done == 1 || in.ngen == 9), "r1 done %d ngen %d", in.done, in.ngen);
    /* remove gives every page back (free, or kept by the prefix cache and held by none); the
     * slot is reused */
    CHECK(sparkmono_remove(g, r0) == SM_OK && sparkmono_remove(g, r1) == SM_OK, "remove");
    int pu, pc, pf;
    sm_kv_pages(&g->kv, &pu, &pc, &pf);
    CHECK(pu == 0 && pc + pf == g->kv.nblocks, "pages back: %d used, %d cached, %d free of %d", pu, pc, pf, g->kv.nblocks);
    CHECK(sparkmono_remove(g, r0) == SM_E_INVALID, "remove twice");
    int r2;
    CHECK(sparkmono_add(g, g_prompts[0], 1, 3, &r2) == SM_OK && (r2 == 0 || r2 == 1), "slot reused");
    CHECK(sparkmono_generate(g) == SM_OK, "generate: %s", sparkmono_errmsg());
    sparkmono_request_get_info(g, r2, &in);
    CHECK(in.done && in.ngen <= 3 && (in.done == 1 || in.ngen == 3), "short request ngen %d", in.ngen);
    sparkmono_engine_destroy(g);
}

static void test_prefill_logits(void) {
    /* logits of a prefill: argmax of the last row is the first token; chunked == whole */
    const int p = 2, n = g_plen[p];
    float *l1 = malloc((size_t)n * g_V * sizeof(float)), *l2 = malloc((size_t)n * g_V * sizeof(float));
    for (int chunk = 0; chunk <= 6; chunk += 6) {
        sparkmono_engine_opts o = {0};
        o.request_rows = 1;
        o.max_len = 64;
        o.prefill_chunk = chunk;
        sparkmono_engine *g;
        int req;
        CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_OK, "create: %s", sparkmono_errmsg());
        if (!g) break;
        CHECK(sparkmono_add(g, g_prompts[p], n, 1, &req) == SM_OK, "add: %s", sparkmono_errmsg());
        CHECK(sparkmono_prefill(g, req, chunk ? l2 : l1) == SM_OK, "prefill: %s", sparkmono_errmsg());
        const int *ids;
        int nids;
        sparkmono_output(g, req, &ids, &nids);
        const float *last = (chunk ? l2 : l1) + (size_t)(n - 1) * g_V;
        int am = 0, nan = 0;
        for (int v = 0; v < g_V; v++) {
            if (isnan(last[v])) nan = 1;
            if (last[v] > last[am]) am = v;
        }
        CHECK(!nan && nids == 1 && ids[0] == am, "first token %d, argmax %d", nids ? ids[0] : -1, am);
        sparkmono_request_info in;
        sparkmono_request_get_info(g, req, &in);
        CHECK(in.done == 2, "max_tokens 1 reached at prefill: done %d", in.done);
        sparkmono_engine_destroy(g);
    }
    CHECK(!memcmp(l1, l2, (size_t)n * g_V * sizeof(float)), "chunked prefill logits differ from one step");
    free(l1);
    free(l2);
}

static void test_aux(void) {
    /* aux layer 0 is the residual stream entering layer 0: r16(rms(embed[tok])) */
    int layers[3] = {0, 2, 4}; /* 4 = L: the stream after the last layer */
    sparkmono_engine_opts o = {0};
    o.request_rows = 4;
    o.max_len = 64;
    o.naux = 3;
    o.aux_layers = layers;
    sparkmono_engine *g;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_OK, "create: %s", sparkmono_errmsg());
    if (!g) return;
    const int p = 1, n = g_plen[p], H = g->cfg->H;
    int req, nrows = 0;
    float *aux = malloc((size_t)3 * 64 * H * sizeof(float)), *x = malloc((size_t)H * sizeof(float)),
          *ref = malloc((size_t)H * sizeof(float));
    CHECK(sparkmono_add(g, g_prompts[p], n, 8, &req) == SM_OK, "add");
    CHECK(sparkmono_aux(g, req, aux, &nrows) == SM_E_STATE, "aux before any step");
    CHECK(sparkmono_prefill(g, req, NULL) == SM_OK, "prefill: %s", sparkmono_errmsg());
    CHECK(sparkmono_aux(g, req, aux, &nrows) == SM_OK && nrows == n, "aux rows %d", nrows);
    double err = 0, nrm = 0, dl = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < H; k++) x[k] = sm_bf16_to_f32(g->model->m.embed[(size_t)g_prompts[p][i] * H + k]);
        ref_rms(x, 1, H, NULL, g->cfg->rms_eps, 1, ref);
        for (int k = 0; k < H; k++) {
            double a = aux[(size_t)i * H + k], b = ref[k];
            err += (a - b) * (a - b);
            nrm += b * b;
            double c = aux[((size_t)n + i) * H + k]; /* layer 2 differs from layer 0 */
            dl += (c - b) * (c - b);
        }
    }
    CHECK(sqrt(err / nrm) < 1e-6, "aux layer 0 rel err %g", sqrt(err / nrm));
    CHECK(sqrt(dl / nrm) > 1e-3, "aux layer 2 equals layer 0");
    /* verify step: 4 rows; row 0 carries the last generated token */
    const int *ids;
    int nids, ntok[1], nreq;
    sparkmono_output(g, req, &ids, &nids);
    int last = ids[nids - 1];
    CHECK(sparkmono_verify(g, ntok, NULL, &nreq) == SM_OK && nreq == 1, "verify");
    CHECK(sparkmono_aux(g, req, aux, &nrows) == SM_OK && nrows == 4, "verify aux rows %d", nrows);
    for (int k = 0; k < H; k++) x[k] = sm_bf16_to_f32(g->model->m.embed[(size_t)last * H + k]);
    ref_rms(x, 1, H, NULL, g->cfg->rms_eps, 1, ref);
    int same = 1;
    for (int k = 0; k < H; k++) same &= fabsf(aux[k] - ref[k]) <= 1e-6f * (1 + fabsf(ref[k]));
    CHECK(same, "verify aux layer 0 row 0 is not the last token's embedding");
    sparkmono_engine_destroy(g);
    free(aux);
    free(x);
    free(ref);
}

static void test_online_mxfp4(void) {
    /* BF16-expert checkpoint quantized at load: speculative == plain on it too */
    sparkmono_model *m;
    sparkmono_model_opts mo = {.online_mxfp4 = 1};
    CHECK(sparkmono_model_open(g_dir_bf16, &mo, &m) == SM_OK, "open: %s", sparkmono_errmsg());
    if (!m) return;
    int a[12], b[12], na, nb, p = 2;
    CHECK(gen_batch(m, 1, 0, 1, &g_prompts[p], &g_plen[p], 12, a, &na, NULL, NULL) == SM_OK, "plain: %s", sparkmono_errmsg());
    CHECK(gen_batch(m, 8, 0, 1, &g_prompts[p], &g_plen[p], 12, b, &nb, NULL, NULL) == SM_OK, "spec: %s", sparkmono_errmsg());
    CHECK(na == nb && !memcmp(a, b, (size_t)na * sizeof(int)), "online mxfp4: streams differ");
    sparkmono_model_close(m);
}

static void test_bad_input(void) {
    sparkmono_model *m = NULL;
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-model", g_tmp);
    CHECK(sparkmono_model_open(missing, NULL, &m) == SM_E_MODEL && !m, "missing dir");
    CHECK(one_line(sparkmono_errmsg()) && strstr(sparkmono_errmsg(), missing), "message names the dir: %s", sparkmono_errmsg());

    sparkmono_engine *g = NULL;
    sparkmono_engine_opts o = {0};
    o.backend = "tpu";
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && !g && strstr(sparkmono_errmsg(), "tpu"), "backend: %s", sparkmono_errmsg());
    o.backend = NULL;
    o.request_rows = -1;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && strstr(sparkmono_errmsg(), "rows"), "rows: %s", sparkmono_errmsg());
    o.request_rows = 0;
    int bad_layer = 99;
    o.naux = 1;
    o.aux_layers = &bad_layer;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && strstr(sparkmono_errmsg(), "aux_layers"), "aux: %s", sparkmono_errmsg());
    o.naux = 0;
    o.world = 4;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && strstr(sparkmono_errmsg(), "world"), "world: %s", sparkmono_errmsg());
    o.world = 0;
    /* gpu_memory_utilization: (0, 1], the cuda backend's, not with kv_blocks */
    o.gpu_memory_utilization = 0.9f;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && strstr(sparkmono_errmsg(), "cuda backend") &&
          one_line(sparkmono_errmsg()), "utilization on cpu: %s", sparkmono_errmsg());
    o.gpu_memory_utilization = 1.5f;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && strstr(sparkmono_errmsg(), "(0, 1]"), "utilization 1.5: %s",
          sparkmono_errmsg());
    o.gpu_memory_utilization = 0.5f;
    o.backend = "cuda";
    o.kv_blocks = 8;
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_INVALID && strstr(sparkmono_errmsg(), "give one"), "with kv_blocks: %s",
          sparkmono_errmsg());
    o.kv_blocks = 0;
    o.gpu_memory_utilization = 0;
    o.backend = NULL;
#ifndef SM_HAVE_CUDA
    o.world = 0;
    o.backend = "cuda";
    CHECK(sparkmono_engine_create(g_model, &o, &g) == SM_E_BACKEND && one_line(sparkmono_errmsg()), "cuda: %s", sparkmono_errmsg());
#endif

    sparkmono_engine_opts ok = {0};
    ok.max_len = 32;
    ok.kv_blocks = 1; /* 16 positions */
    CHECK(sparkmono_engine_create(g_model, &ok, &g) == SM_OK, "create: %s", sparkmono_errmsg());
    if (!g) return;
    int req, p[20];
    for (int i = 0; i < 20; i++) p[i] = 3 + i;
    p[4] = g_V;
    CHECK(sparkmono_add(g, p, 5, 4, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "out of range") && one_line(sparkmono_errmsg()), "id V: %s", sparkmono_errmsg());
    p[4] = -1;
    CHECK(sparkmono_add(g, p, 5, 4, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "index 4"), "id -1: %s", sparkmono_errmsg());
    p[4] = 7;
    CHECK(sparkmono_add(g, p, 0, 4, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "empty"), "empty: %s", sparkmono_errmsg());
    CHECK(sparkmono_add(g, p, 20, 13, &req) == SM_E_INVALID && strstr(sparkmono_errmsg(), "max model length"), "too long: %s", sparkmono_errmsg());
    CHECK(sparkmono_add(g, p, 5, -1, &req) == SM_E_INVALID, "negative max tokens");
    /* cache exhausted: 20 prompt positions need 2 pages, the cache has 1 */
    CHECK(sparkmono_add(g, p, 20, 12, &req) == SM_OK, "add: %s", sparkmono_errmsg());
    CHECK(sparkmono_prefill(g, req, NULL) == SM_E_CACHE && one_line(sparkmono_errmsg()), "cache: %s", sparkmono_errmsg());
    int r2;
    CHECK(sparkmono_add(g, p, 3, 1, &r2) == SM_E_CACHE, "request slots exhausted: %s", sparkmono_errmsg());
    CHECK(sparkmono_remove(g, req) == SM_OK, "remove");
    /* a request that fits its page, but whose verify steps outgrow it */
    CHECK(sparkmono_add(g, p, 14, 10, &req) == SM_OK, "add 14");
    CHECK(sparkmono_generate(g) == SM_E_CACHE && one_line(sparkmono_errmsg()), "cache in verify: %s", sparkmono_errmsg());
    CHECK(sparkmono_prefill(g, 7, NULL) == SM_E_INVALID, "bad request id");
    CHECK(sparkmono_verify(NULL, NULL, NULL, NULL) == SM_E_INVALID, "NULL engine");
    sparkmono_engine_destroy(g);
}

int main(void) {
    /* a fresh tiny model (MXFP4 experts) and a BF16-expert twin in a temp dir */
    if (tm_mkdtemp(g_tmp, sizeof g_tmp, "sm_test_engine")) { printf("FAIL setup: mkdtemp\n"); return 1; }
    snprintf(g_dir, sizeof g_dir, "%s/tiny", g_tmp);
    snprintf(g_dir_bf16, sizeof g_dir_bf16, "%s/tiny_bf16", g_tmp);
    sm_err e = {{0}};
    int ok = tm_make_tiny(g_dir, SM_EXP_MXFP4, 1, 0, &e) == 0 && tm_make_tiny(g_dir_bf16, SM_EXP_BF16, 3, 0, &e) == 0;
    if (!ok || sparkmono_model_open(g_dir, NULL, &g_model) != SM_OK) {
        printf("FAIL setup: %s %s\n", e.msg, sparkmono_errmsg());
        tm_rmtree(g_tmp);
        return 1;
    }
    sparkmono_model_info info;
    sparkmono_model_get_info(g_model, &info);
    g_V = info.vocab_size;
    make_prompts();

    RUN(test_drafter);
    RUN(test_accept);
    RUN(test_npy);
    RUN(test_plain_reference);
    RUN(test_spec_equals_greedy);
    RUN(test_oracle_drafts);
    RUN(test_batched_equals_alone);
    RUN(test_lengths);
    RUN(test_prefill_logits);
    RUN(test_aux);
    RUN(test_online_mxfp4);
    RUN(test_bad_input);

    sparkmono_model_close(g_model);
    for (int p = 0; p < NPROMPT; p++) free(g_prompts[p]);
    tm_rmtree(g_tmp);
    return TEST_DONE();
}
