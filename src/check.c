/* check.c: the checkpoint summary of `sparkmono check` (see check.h).
 *
 * Everything is derived from the validated config and the per-layer expert formats of the
 * loaded model, so the numbers are exact and cheap (no pass over the data).  We rejected
 * summing st_tensor sizes: the per-rank table needs each tensor's sharding rule, which is a
 * property of its role, not of its bytes.
 */
#include "check.h"
#include <string.h>

static int64_t expert_bytes(const sm_config *c, sm_expert_fmt f) {
    int64_t n = 2 * (int64_t)c->I * c->Hm + (int64_t)c->Hm * c->I; /* weights of one expert */
    switch (f) {
    case SM_EXP_BF16: return 2 * n;
    case SM_EXP_FP8: return n + 4 * (2 * (int64_t)c->I + c->Hm);  /* e4m3 + f32 per-row scales */
    case SM_EXP_MXFP4: return n / 2 + n / 32;                       /* e2m1 pairs + e8m0 per 32 */
    }
    return 0;
}

void sm_model_bytes(const sm_model *m, sm_bytes *b) {
    const sm_config *c = &m->cfg;
    memset(b, 0, sizeof *b);
    int64_t H = c->H, Hm = c->Hm, Q = (int64_t)c->nH * c->D, KV = (int64_t)c->nKV * c->D;
    b->embed = (int64_t)c->V * H * 2;
    b->lm_head = (int64_t)c->V * H * 2;
    for (int l = 0; l < c->L; l++) {
        b->attn += 2 * (3 * Q * H + 2 * KV * H);          /* q, gate, o + k, v */
        b->router += 4 * ((int64_t)c->E * H + c->E);
        b->pool += 2 * (2 * Hm * H);
        b->experts[m->layers[l].ex.fmt] += (int64_t)c->E * expert_bytes(c, m->layers[l].ex.fmt);
        b->norms += 2 * (5 * H + 2 * Hm);                  /* 3 norms + 2 gates [H], 2 norms [Hm] */
    }
    b->norms += 2 * H;                                     /* final norm */
    b->total = b->embed + b->lm_head + b->attn + b->router + b->pool + b->norms + b->experts[0] +
               b->experts[1] + b->experts[2];
}

int64_t sm_rank_bytes(const sm_model *m, int W) {
    const sm_config *c = &m->cfg;
    if (W < 1 || c->nH % W || c->nKV % W || c->E % W || c->Hm % W || c->H % W) return -1;
    sm_bytes b;
    sm_model_bytes(m, &b);
    int64_t vrows = ((int64_t)c->V + W - 1) / W;           /* vocab rows of one rank */
    int64_t r = 2 * vrows * c->H * 2;                      /* embedding + lm_head shards */
    r += b.attn / W + b.pool / W;                          /* heads, pooler / unpooler rows */
    r += (b.experts[0] + b.experts[1] + b.experts[2]) / W; /* E / W experts of every layer */
    r += b.router + b.norms;                               /* replicated */
    return r;
}

void sm_layer_kinds(const sm_config *c, char *buf, size_t n) {
    size_t k = 0;
    for (int l = 0; l < c->L && k + 2 < n; l++) {
        if (l && l % 4 == 0) buf[k++] = ' ';
        buf[k++] = c->full[l] ? 'F' : 'S';
    }
    if (n) buf[k < n ? k : n - 1] = 0;
}

static void human(int64_t v, char *buf, size_t n) {
    double x = (double)v;
    if (x >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", x / (1024.0 * 1024 * 1024));
    else if (x >= 1024.0 * 1024) snprintf(buf, n, "%.2f MiB", x / (1024.0 * 1024));
    else if (x >= 1024.0) snprintf(buf, n, "%.2f KiB", x / 1024.0);
    else snprintf(buf, n, "%lld B", (long long)v);
}

static void row(FILE *f, const char *what, int64_t v) {
    char h[64];
    human(v, h, sizeof h);
    fprintf(f, "  %-22s %16lld  %12s\n", what, (long long)v, h);
}

void sm_check_print(const sm_model *m, FILE *f) {
    const sm_config *c = &m->cfg;
    fprintf(f, "config: L=%d H=%d Hm=%d I=%d E=%d K=%d nH=%d nKV=%d D=%d V=%d vocab_used=%d window=%d\n",
            c->L, c->H, c->Hm, c->I, c->E, c->K, c->nH, c->nKV, c->D, c->V, c->vocab_used, c->window);
    fprintf(f, "        rope_theta=%g rms_eps=%g post_eps=%g gate_temp=%g qk_scale_factor=%.10g\n", c->rope_theta,
            (double)c->rms_eps, (double)c->post_eps, (double)c->gate_temp, (double)c->qk_scale_factor);
    fprintf(f, "        output_multiplier=%.7g softcap=%g route_scale=%g bos=%d pad=%d eos=[", (double)c->out_mult,
            (double)c->softcap, (double)c->route_scale, c->bos, c->pad);
    for (int i = 0; i < c->n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", c->eos[i]);
    fprintf(f, "]\n");
    char kinds[SM_MAX_LAYERS * 2];
    sm_layer_kinds(c, kinds, sizeof kinds);
    fprintf(f, "layers: %s  (F full attention / NoPE, S sliding / RoPE)\n", kinds);
    /* expert format per layer, as runs: "0 bf16, 1-2 mxfp4, 3 bf16" */
    fprintf(f, "experts:");
    for (int l = 0; l < c->L;) {
        int r = l;
        while (r + 1 < c->L && m->layers[r + 1].ex.fmt == m->layers[l].ex.fmt) r++;
        if (r == l) fprintf(f, "%s layer %d %s", l ? "," : "", l, sm_expert_fmt_name(m->layers[l].ex.fmt));
        else fprintf(f, "%s layers %d-%d %s", l ? "," : "", l, r, sm_expert_fmt_name(m->layers[l].ex.fmt));
        l = r + 1;
    }
    fprintf(f, "\n");
    sm_bytes b;
    sm_model_bytes(m, &b);
    fprintf(f, "bytes:\n");
    row(f, "embedding", b.embed);
    row(f, "lm_head", b.lm_head);
    row(f, "attention", b.attn);
    row(f, "router", b.router);
    row(f, "pooler/unpooler", b.pool);
    for (int k = 0; k < 3; k++) {
        if (!b.experts[k]) continue;
        char w[32];
        snprintf(w, sizeof w, "experts %s", sm_expert_fmt_name((sm_expert_fmt)k));
        row(f, w, b.experts[k]);
    }
    row(f, "norms + gates", b.norms);
    row(f, "total", b.total);
    fprintf(f, "weights per GPU (TP = EP over W ranks):\n  %-4s %16s  %12s\n", "W", "bytes", "");
    for (int W = 1; W <= 8; W *= 2) {
        int64_t r = sm_rank_bytes(m, W);
        if (r < 0) { fprintf(f, "  %-4d %16s  (W does not divide nH, nKV, E, Hm and H)\n", W, "-"); continue; }
        char h[64];
        human(r, h, sizeof h);
        fprintf(f, "  %-4d %16lld  %12s\n", W, (long long)r, h);
    }
}
