/* weights.c: checkpoint loader (docs/model.md section 2): names -> plain structs of views.
 *
 * One pass over the archive classifies every tensor name into a slot (fixed per-model,
 * fixed per-layer, consolidated experts, per-expert weight/scale); an unparseable or unknown
 * name fails there, naming the tensor.  A second pass per layer checks every slot's dtype and
 * shape exactly and resolves the layer's expert format.  Views stay in the mmapped files;
 * only misaligned views, the small precomputed vectors (eff norms, residual-gate alpha/beta)
 * and online-MXFP4 experts are owned.  We rejected looking names up one by one with st_find:
 * it cannot see the tensors nobody asked for, and unknown names must be refused.
 */
#include "weights.h"
#include "codec.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define P_ "model.language_model."

const char *sm_expert_fmt_name(sm_expert_fmt f) {
    switch (f) {
    case SM_EXP_BF16: return "bf16";
    case SM_EXP_FP8: return "fp8";
    case SM_EXP_MXFP4: return "mxfp4";
    }
    return "?";
}

void sm_expert_mat_bytes(sm_expert_fmt f, int64_t rows, int64_t cols, size_t *wbytes, size_t *sbytes) {
    size_t w, s;
    switch (f) {
    case SM_EXP_FP8: w = (size_t)(rows * cols); s = (size_t)rows * 4; break;                    /* e4m3, f32 a row */
    case SM_EXP_MXFP4: w = (size_t)(rows * cols / 2); s = (size_t)(rows * (cols / SM_MX_BLOCK)); break; /* e2m1 pairs, e8m0 a block */
    default: w = (size_t)(rows * cols) * 2; s = 0; break;                                        /* bf16 */
    }
    if (wbytes) *wbytes = w;
    if (sbytes) *sbytes = s;
}

size_t sm_expert_bytes(const sm_config *c, sm_expert_fmt f) {
    size_t w1, s1, w2, s2;
    sm_expert_mat_bytes(f, 2 * (int64_t)c->I, c->Hm, &w1, &s1); /* gate_up */
    sm_expert_mat_bytes(f, c->Hm, c->I, &w2, &s2);              /* down */
    return w1 + s1 + w2 + s2;
}

int sm_layer_keeps_bf16(const sm_config *c, int l) { return l == 0 || l == c->L - 1; }

void sm_residual_gate(const uint16_t *g, int n, float T_g, float *alpha, float *beta) {
    for (int i = 0; i < n; i++) {
        float u = sm_bf16_to_f32(g[i]) / T_g;           /* gate logit over the temperature */
        float b = 1.0f / (1.0f + expf(-u));              /* beta = sigmoid(u) */
        float sn = 1.0f / (1.0f + expf(u));              /* sigmoid(-u) */
        alpha[i] = sqrtf(fmaxf(sn * (1.0f + b), 1e-3f)); /* alpha, clamped */
        beta[i] = b;
    }
}

/* ---- per-layer tensor table ---- */
enum {
    LT_IN_NORM, LT_WQ, LT_WK, LT_WV, LT_WG, LT_WO, LT_ATT_GATE, LT_PRE_FFN, LT_POST_FFN,
    LT_FFN_GATE, LT_ROUTER, LT_ROUTER_BIAS, LT_POOLER, LT_PRE_EXP_NORM, LT_POST_EXP_NORM,
    LT_UNPOOLER, LT_EXP_GU, LT_EXP_DN, LT_N
};
/* dims: 'H' hidden, 'Q' nH*D, 'K' nKV*D, 'E' experts, 'M' Hm, 'I' I, '2' 2I, 0 none */
typedef struct lt_def { const char *suffix; st_dtype dt; char dims[4]; } lt_def;
static const lt_def LT[LT_N] = {
    {"input_layernorm.weight", ST_BF16, "H"},
    {"self_attn.q_proj.weight", ST_BF16, "QH"},
    {"self_attn.k_proj.weight", ST_BF16, "KH"},
    {"self_attn.v_proj.weight", ST_BF16, "KH"},
    {"self_attn.gate_proj.weight", ST_BF16, "QH"},
    {"self_attn.o_proj.weight", ST_BF16, "HQ"},
    {"post_attention_residual_gate.gate", ST_BF16, "H"},
    {"pre_feedforward_layernorm.weight", ST_BF16, "H"},
    {"post_feedforward_layernorm.weight", ST_BF16, "H"},
    {"post_feedforward_residual_gate.gate", ST_BF16, "H"},
    {"mlp.gate.weight", ST_F32, "EH"},
    {"mlp.gate.e_score_correction_bias", ST_F32, "E"},
    {"mlp.pre_expert_proj.weight", ST_BF16, "MH"},
    {"mlp.pre_expert_norm.weight", ST_BF16, "M"},
    {"mlp.experts.post_expert_norm.weight", ST_BF16, "M"},
    {"mlp.post_expert_proj.weight", ST_BF16, "HM"},
    {"mlp.experts.gate_up_proj", ST_BF16, "E2M"},
    {"mlp.experts.down_proj", ST_BF16, "EMI"},
};

static int64_t dim_of(const sm_config *c, char d) {
    switch (d) {
    case 'H': return c->H;
    case 'Q': return (int64_t)c->nH * c->D;
    case 'K': return (int64_t)c->nKV * c->D;
    case 'E': return c->E;
    case 'M': return c->Hm;
    case 'I': return c->I;
    case '2': return 2 * (int64_t)c->I;
    }
    return -1;
}

/* Per-expert slots: 0 gate_up weight, 1 gate_up scale, 2 down weight, 3 down scale. */
enum { PX_GU, PX_GUS, PX_DN, PX_DNS, PX_N };
static const char *const PX_SUFFIX[PX_N] = {
    "gate_up_proj.weight", "gate_up_proj.weight_scale", "down_proj.weight", "down_proj.weight_scale"};

typedef struct load_ctx {
    const char *dir;
    sm_config *c;
    st_archive *ar;
    const st_tensor **fixed;   /* [L * LT_N] */
    const st_tensor **px;      /* [L * E * PX_N] */
    const st_tensor **layer_first_px; /* [L] first per-expert tensor seen in each layer */
    const st_tensor *embed, *norm, *lm_head;
} load_ctx;

static const char *tfile(const load_ctx *x, const st_tensor *t) {
    return (t->file >= 0 && t->file < x->ar->nfiles) ? x->ar->files[t->file].path : x->dir;
}

static void shape_str(int ndim, const int64_t *s, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Exact dtype and shape check of one tensor. */
static int check_tensor(const load_ctx *x, const st_tensor *t, st_dtype dt, int ndim, const int64_t *shape, sm_err *e) {
    if (t->dtype != dt)
        return sm_errf(e, "%s: tensor '%s': dtype %s, expected %s", tfile(x, t), t->name,
                       st_dtype_name(t->dtype), st_dtype_name(dt));
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[128], b[128];
        shape_str(t->ndim, t->shape, a, sizeof a);
        shape_str(ndim, shape, b, sizeof b);
        return sm_errf(e, "%s: tensor '%s': shape %s, expected %s", tfile(x, t), t->name, a, b);
    }
    return 0;
}

/* Parse a decimal index at *p (digits only, at most 9), followed by '.'; advances p. */
static int parse_index(const char **p, long *out) {
    const char *s = *p;
    long v = 0;
    int n = 0;
    while (*s >= '0' && *s <= '9') {
        if (++n > 9) return -1;
        v = v * 10 + (*s - '0');
        s++;
    }
    if (n == 0 || *s != '.') return -1;
    *p = s + 1;
    *out = v;
    return 0;
}

static void name_px(char *buf, size_t n, int l, int ex, int slot) {
    snprintf(buf, n, P_ "layers.%d.mlp.experts.%d.%s", l, ex, PX_SUFFIX[slot]);
}

/* Classify one tensor name into its slot. */
static int classify(load_ctx *x, const st_tensor *t, sm_err *e) {
    const sm_config *c = x->c;
    const char *nm = t->name;
    const st_tensor **slot = NULL;
    if (strcmp(nm, "lm_head.weight") == 0) slot = &x->lm_head;
    else if (strncmp(nm, P_, sizeof P_ - 1) != 0)
        return sm_errf(e, "%s: tensor '%s': unknown tensor name (not lm_head.weight, not under '" P_ "')",
                       tfile(x, t), nm);
    else {
        const char *s = nm + sizeof P_ - 1;
        if (strcmp(s, "embed_tokens.weight") == 0) slot = &x->embed;
        else if (strcmp(s, "norm.weight") == 0) slot = &x->norm;
        else if (strncmp(s, "layers.", 7) == 0) {
            const char *p = s + 7;
            long l;
            if (parse_index(&p, &l)) return sm_errf(e, "%s: tensor '%s': unknown tensor name", tfile(x, t), nm);
            if (l >= c->L)
                return sm_errf(e, "%s: tensor '%s': layer %ld >= num_hidden_layers %d", tfile(x, t), nm, l, c->L);
            for (int k = 0; k < LT_N && !slot; k++)
                if (strcmp(p, LT[k].suffix) == 0) slot = &x->fixed[l * LT_N + k];
            if (!slot && strncmp(p, "mlp.experts.", 12) == 0) {
                const char *q = p + 12;
                long ex;
                if (parse_index(&q, &ex) == 0) {
                    int k;
                    for (k = 0; k < PX_N; k++)
                        if (strcmp(q, PX_SUFFIX[k]) == 0) break;
                    if (k == PX_N) return sm_errf(e, "%s: tensor '%s': unknown tensor name", tfile(x, t), nm);
                    if (ex >= c->E)
                        return sm_errf(e, "%s: tensor '%s': expert index %ld >= num_local_experts %d",
                                       tfile(x, t), nm, ex, c->E);
                    slot = &x->px[((int64_t)l * c->E + ex) * PX_N + k];
                    if (!x->layer_first_px[l]) x->layer_first_px[l] = t;
                }
            }
        }
        if (!slot) return sm_errf(e, "%s: tensor '%s': unknown tensor name", tfile(x, t), nm);
    }
    if (*slot)
        return sm_errf(e, "%s: tensor '%s': duplicate of tensor '%s' (same slot)", tfile(x, t), nm, (*slot)->name);
    *slot = t;
    return 0;
}

/* ---- owned buffers ---- */
static void *own(sm_model *m, size_t n, sm_err *e) {
    if (m->nowned == m->capowned) {
        int nc = m->capowned ? 2 * m->capowned : 64;
        void **no = realloc(m->owned, sizeof(void *) * (size_t)nc);
        if (!no) { sm_errf(e, "weights: out of memory"); return NULL; }
        m->owned = no;
        m->capowned = nc;
    }
    size_t sz = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p) { sm_errf(e, "weights: out of memory allocating %zu bytes", n); return NULL; }
    m->owned[m->nowned++] = p;
    return p;
}

/* A view usable in place, or an aligned owned copy when the mapping offset is misaligned. */
static const void *view(sm_model *m, const st_tensor *t, size_t align, sm_err *e) {
    if (((uintptr_t)t->data & (align - 1)) == 0) return t->data;
    void *p = own(m, t->nbytes, e);
    if (p) memcpy(p, t->data, t->nbytes);
    return p;
}

/* eff(g) = r16(1 + g) into an owned f32 array. */
static float *eff_norm(sm_model *m, const st_tensor *t, sm_err *e) {
    float *w = own(m, (size_t)t->numel * sizeof(float), e);
    if (!w) return NULL;
    const uint8_t *b = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2); /* the view may be misaligned */
        w[i] = sm_r16(1.0f + sm_bf16_to_f32(h));
    }
    return w;
}

/* alpha/beta of a residual gate tensor into two owned arrays. */
static int gate_coefs(sm_model *m, const st_tensor *t, float **alpha, float **beta, sm_err *e) {
    const uint16_t *g = view(m, t, 2, e);
    if (!g) return -1;
    *alpha = own(m, (size_t)t->numel * sizeof(float), e);
    *beta = own(m, (size_t)t->numel * sizeof(float), e);
    if (!*alpha || !*beta) return -1;
    sm_residual_gate(g, (int)t->numel, m->cfg.gate_temp, *alpha, *beta);
    return 0;
}

/* ---- experts of one layer ---- */
static int fmt_of_dtype(st_dtype d) {
    if (d == ST_BF16) return SM_EXP_BF16;
    if (d == ST_F8_E4M3) return SM_EXP_FP8;
    if (d == ST_U8 || d == ST_F4) return SM_EXP_MXFP4;
    return -1;
}

static int load_experts(load_ctx *x, sm_model *m, int l, sm_err *e) {
    const sm_config *c = &m->cfg;
    int E = c->E;
    sm_experts *X = &m->layers[l].ex;
    const void **ptrs = own(m, sizeof(void *) * 4 * (size_t)E, e);
    if (!ptrs) return -1;
    X->gu = ptrs; X->gus = ptrs + E; X->dn = ptrs + 2 * E; X->dns = ptrs + 3 * E;
    const st_tensor *cgu = x->fixed[l * LT_N + LT_EXP_GU], *cdn = x->fixed[l * LT_N + LT_EXP_DN];
    const st_tensor *first = x->layer_first_px[l];
    char nm[256];
    if ((cgu || cdn) && first)
        return sm_errf(e, "%s: tensor '%s': duplicate expert tensor: layer %d also holds consolidated '%s'",
                       tfile(x, first), first->name, l, (cgu ? cgu : cdn)->name);
    if (cgu || cdn) {
        /* consolidated BF16 [E, 2I, Hm] and [E, Hm, I] */
        for (int k = LT_EXP_GU; k <= LT_EXP_DN; k++) {
            const st_tensor *t = x->fixed[l * LT_N + k];
            if (!t) return sm_errf(e, "%s: missing tensor '" P_ "layers.%d.%s'", x->dir, l, LT[k].suffix);
            int64_t sh[3] = {E, dim_of(c, LT[k].dims[1]), dim_of(c, LT[k].dims[2])};
            if (check_tensor(x, t, ST_BF16, 3, sh, e)) return -1;
            const uint8_t *base = view(m, t, 2, e);
            if (!base) return -1;
            size_t per = (size_t)(sh[1] * sh[2] * 2);
            for (int ex = 0; ex < E; ex++) {
                if (k == LT_EXP_GU) X->gu[ex] = base + per * ex;
                else X->dn[ex] = base + per * ex;
            }
        }
        X->fmt = SM_EXP_BF16;
        return 0;
    }
    if (!first)
        return sm_errf(e, "%s: missing tensor '" P_ "layers.%d.mlp.experts.gate_up_proj' (no consolidated or "
                       "per-expert expert tensors in layer %d)", x->dir, l, l);
    /* the layer's format is the format of expert 0's gate_up weight */
    const st_tensor *t0 = x->px[((int64_t)l * E) * PX_N + PX_GU];
    if (!t0) {
        name_px(nm, sizeof nm, l, 0, PX_GU);
        return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
    }
    int fmt = fmt_of_dtype(t0->dtype);
    if (fmt < 0)
        return sm_errf(e, "%s: tensor '%s': dtype %s is not an expert weight dtype (BF16, F8_E4M3, U8, F4)",
                       tfile(x, t0), t0->name, st_dtype_name(t0->dtype));
    X->fmt = (sm_expert_fmt)fmt;
    for (int ex = 0; ex < E; ex++) {
        const st_tensor **s = &x->px[((int64_t)l * E + ex) * PX_N];
        if (!s[0] && !s[1] && !s[2] && !s[3]) {
            name_px(nm, sizeof nm, l, ex, PX_GU);
            return sm_errf(e, "%s: missing expert %d of layer %d (no tensor '%s')", x->dir, ex, l, nm);
        }
        for (int pj = 0; pj < 2; pj++) {
            const st_tensor *w = s[2 * pj], *sc = s[2 * pj + 1];
            int64_t rows = pj ? c->Hm : 2 * (int64_t)c->I, cols = pj ? c->I : c->Hm;
            if (!w) {
                name_px(nm, sizeof nm, l, ex, 2 * pj);
                return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
            }
            int wf = fmt_of_dtype(w->dtype);
            if (wf != fmt)
                return sm_errf(e, "%s: tensor '%s': dtype %s: layer %d mixes expert formats (expert 0 is %s)",
                               tfile(x, w), w->name, st_dtype_name(w->dtype), l, sm_expert_fmt_name(X->fmt));
            int64_t wsh[2] = {rows, cols};
            if (w->dtype == ST_U8) wsh[1] = cols / 2;
            if (check_tensor(x, w, w->dtype, 2, wsh, e)) return -1;
            const void *wv = w->data;
            const void *sv = NULL;
            if (fmt == SM_EXP_BF16) {
                if (sc)
                    return sm_errf(e, "%s: tensor '%s': unexpected weight_scale for BF16 experts", tfile(x, sc), sc->name);
                wv = view(m, w, 2, e);
                if (!wv) return -1;
            } else {
                if (!sc) {
                    name_px(nm, sizeof nm, l, ex, 2 * pj + 1);
                    return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
                }
                if (fmt == SM_EXP_FP8) {
                    if (check_tensor(x, sc, ST_F32, 1, &rows, e)) return -1;
                    sv = view(m, sc, 4, e);
                    if (!sv) return -1;
                } else {
                    int64_t ssh[2] = {rows, cols / SM_MX_BLOCK};
                    st_dtype sdt = sc->dtype == ST_F8_E8M0 ? ST_F8_E8M0 : ST_U8;
                    if (check_tensor(x, sc, sdt, 2, ssh, e)) return -1;
                    const uint8_t *sb = sc->data;
                    const void *hit = memchr(sb, 0xFF, sc->nbytes);
                    if (hit)
                        return sm_errf(e, "%s: tensor '%s': e8m0 scale byte 0xFF (NaN) at element %lld",
                                       tfile(x, sc), sc->name, (long long)((const uint8_t *)hit - sb));
                    sv = sb;
                }
            }
            if (pj == 0) { X->gu[ex] = wv; X->gus[ex] = sv; }
            else { X->dn[ex] = wv; X->dns[ex] = sv; }
        }
    }
    return 0;
}

/* ---- online MXFP4 (pthreads over (layer, expert) items; each item's bytes depend only on
 * its own input, so the result is identical for any thread count) ---- */
typedef struct onl_job {
    sm_model *m;
    const int *layers; int nlayers; /* layers to quantize */
    const void **src_gu, **src_dn;  /* [nlayers * E] bf16 sources */
    uint8_t **dst;                  /* [nlayers] per-layer owned buffers */
    size_t per_expert;              /* bytes per expert in dst (sm_expert_bytes, MXFP4) */
    size_t off[4];                  /* offsets in an expert's bytes: gate_up codes, its scales,
                                       down codes, its scales */
    atomic_long next;               /* next item */
    int err;                        /* out of memory in a worker */
} onl_job;

static void quant_matrix(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q, uint8_t *s, float *tmp) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < cols; j++) tmp[j] = sm_bf16_to_f32(w[r * cols + j]);
        sm_mx_quantize_row(tmp, cols, q + r * (cols / 2), s + r * (cols / SM_MX_BLOCK));
    }
}

static void *onl_worker(void *arg) {
    onl_job *j = arg;
    const sm_config *c = &j->m->cfg;
    int64_t E = c->E, I2 = 2 * (int64_t)c->I, Hm = c->Hm, I = c->I;
    float *tmp = malloc(sizeof(float) * (size_t)(Hm > I ? Hm : I));
    if (!tmp) { j->err = 1; return NULL; }
    for (;;) {
        long it = atomic_fetch_add(&j->next, 1);
        if (it >= (long)(j->nlayers * E)) break;
        int li = (int)(it / E), ex = (int)(it % E);
        uint8_t *d = j->dst[li] + j->per_expert * (size_t)ex;
        quant_matrix(j->src_gu[it], I2, Hm, d + j->off[0], d + j->off[1], tmp);
        quant_matrix(j->src_dn[it], Hm, I, d + j->off[2], d + j->off[3], tmp);
    }
    free(tmp);
    return NULL;
}

static int online_mxfp4(sm_model *m, int threads, sm_err *e) {
    const sm_config *c = &m->cfg;
    int64_t E = c->E;
    int lay[SM_MAX_LAYERS], n = 0;
    for (int l = 0; l < c->L; l++)
        if (!sm_layer_keeps_bf16(c, l) && m->layers[l].ex.fmt == SM_EXP_BF16) lay[n++] = l;
    if (n == 0) return 0;
    onl_job j;
    memset(&j, 0, sizeof j);
    j.m = m;
    j.layers = lay;
    j.nlayers = n;
    size_t w1, s1, w2;
    sm_expert_mat_bytes(SM_EXP_MXFP4, 2 * (int64_t)c->I, c->Hm, &w1, &s1);
    sm_expert_mat_bytes(SM_EXP_MXFP4, c->Hm, c->I, &w2, NULL);
    j.off[0] = 0, j.off[1] = w1, j.off[2] = w1 + s1, j.off[3] = w1 + s1 + w2;
    j.per_expert = sm_expert_bytes(c, SM_EXP_MXFP4);
    atomic_init(&j.next, 0);
    j.src_gu = malloc(sizeof(void *) * (size_t)(n * E));
    j.src_dn = malloc(sizeof(void *) * (size_t)(n * E));
    j.dst = malloc(sizeof(uint8_t *) * (size_t)n);
    int rc = 0;
    if (!j.src_gu || !j.src_dn || !j.dst) { rc = sm_errf(e, "weights: out of memory"); goto done; }
    for (int i = 0; i < n; i++) {
        j.dst[i] = own(m, j.per_expert * (size_t)E, e);
        if (!j.dst[i]) { rc = -1; goto done; }
        for (int ex = 0; ex < E; ex++) {
            j.src_gu[i * E + ex] = m->layers[lay[i]].ex.gu[ex];
            j.src_dn[i * E + ex] = m->layers[lay[i]].ex.dn[ex];
        }
    }
    long nt = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1) nt = 1;
    if (nt > 64) nt = 64;
    if (nt > n * E) nt = (long)(n * E);
    pthread_t th[64];
    int started = 0;
    for (long t = 1; t < nt; t++) {
        if (pthread_create(&th[started], NULL, onl_worker, &j) == 0) started++;
    }
    onl_worker(&j);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    if (j.err) { rc = sm_errf(e, "weights: out of memory in online MXFP4 quantization"); goto done; }
    /* re-point the layers at the quantized copies */
    for (int i = 0; i < n; i++) {
        sm_experts *X = &m->layers[lay[i]].ex;
        for (int ex = 0; ex < E; ex++) {
            uint8_t *d = j.dst[i] + j.per_expert * (size_t)ex;
            X->gu[ex] = d + j.off[0];
            X->gus[ex] = d + j.off[1];
            X->dn[ex] = d + j.off[2];
            X->dns[ex] = d + j.off[3];
        }
        X->fmt = SM_EXP_MXFP4;
    }
done:
    free(j.src_gu);
    free(j.src_dn);
    free(j.dst);
    return rc;
}

/* ---- the loader ---- */
static int load_layer(load_ctx *x, sm_model *m, int l, sm_err *e) {
    const sm_config *c = &m->cfg;
    sm_layer *L = &m->layers[l];
    const st_tensor **f = &x->fixed[l * LT_N];
    for (int k = 0; k < LT_EXP_GU; k++) {
        if (!f[k]) return sm_errf(e, "%s: missing tensor '" P_ "layers.%d.%s'", x->dir, l, LT[k].suffix);
        int64_t sh[3];
        int nd = (int)strlen(LT[k].dims);
        for (int i = 0; i < nd; i++) sh[i] = dim_of(c, LT[k].dims[i]);
        if (check_tensor(x, f[k], LT[k].dt, nd, sh, e)) return -1;
    }
    L->full = c->full[l];
    /* dense matrices: views (copied only if misaligned) */
    if (!(L->wq = view(m, f[LT_WQ], 2, e)) || !(L->wk = view(m, f[LT_WK], 2, e)) ||
        !(L->wv = view(m, f[LT_WV], 2, e)) || !(L->wg = view(m, f[LT_WG], 2, e)) ||
        !(L->wo = view(m, f[LT_WO], 2, e)) || !(L->router = view(m, f[LT_ROUTER], 4, e)) ||
        !(L->router_bias = view(m, f[LT_ROUTER_BIAS], 4, e)) || !(L->pooler = view(m, f[LT_POOLER], 2, e)) ||
        !(L->unpooler = view(m, f[LT_UNPOOLER], 2, e)))
        return -1;
    /* norms centred at 1: eff(g) = r16(1 + g) */
    if (!(L->in_norm = eff_norm(m, f[LT_IN_NORM], e)) || !(L->pre_ffn_norm = eff_norm(m, f[LT_PRE_FFN], e)) ||
        !(L->post_ffn_norm = eff_norm(m, f[LT_POST_FFN], e)) ||
        !(L->pre_expert_norm = eff_norm(m, f[LT_PRE_EXP_NORM], e)) ||
        !(L->post_expert_norm = eff_norm(m, f[LT_POST_EXP_NORM], e)))
        return -1;
    /* residual gates: alpha/beta per channel */
    if (gate_coefs(m, f[LT_ATT_GATE], &L->att_alpha, &L->att_beta, e)) return -1;
    if (gate_coefs(m, f[LT_FFN_GATE], &L->ffn_alpha, &L->ffn_beta, e)) return -1;
    return load_experts(x, m, l, e);
}

int sm_model_load(const char *dir, const sm_load_opts *o, sm_model *m, sm_err *e) {
    memset(m, 0, sizeof *m);
    sm_load_opts dflt = {0};
    if (!o) o = &dflt;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return sm_errf(e, "%s: not a checkpoint directory (%s)", dir, stat(dir, &st) ? strerror(errno) : "not a directory");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return sm_errf(e, "%s: path too long", dir);
    if (sm_config_load(path, &m->cfg, e)) return -1;
    if (st_open_dir(dir, &m->ar, e)) return -1;
    const sm_config *c = &m->cfg;
    load_ctx x;
    memset(&x, 0, sizeof x);
    x.dir = dir;
    x.c = &m->cfg;
    x.ar = &m->ar;
    x.fixed = calloc((size_t)c->L * LT_N, sizeof *x.fixed);
    x.px = calloc((size_t)c->L * c->E * PX_N, sizeof *x.px);
    x.layer_first_px = calloc((size_t)c->L, sizeof *x.layer_first_px);
    m->layers = calloc((size_t)c->L, sizeof *m->layers);
    int rc = -1;
    if (!x.fixed || !x.px || !x.layer_first_px || !m->layers) { sm_errf(e, "%s: out of memory", dir); goto out; }
    /* pass 1: every name to its slot */
    for (int i = 0; i < m->ar.ntensors; i++)
        if (classify(&x, &m->ar.tensors[i], e)) goto out;
    /* model-level tensors */
    int64_t vh[2] = {c->V, c->H}, h1[1] = {c->H};
    if (!x.embed) { sm_errf(e, "%s: missing tensor '" P_ "embed_tokens.weight'", dir); goto out; }
    if (!x.norm) { sm_errf(e, "%s: missing tensor '" P_ "norm.weight'", dir); goto out; }
    if (!x.lm_head) { sm_errf(e, "%s: missing tensor 'lm_head.weight'", dir); goto out; }
    if (check_tensor(&x, x.embed, ST_BF16, 2, vh, e) || check_tensor(&x, x.norm, ST_BF16, 1, h1, e) ||
        check_tensor(&x, x.lm_head, ST_BF16, 2, vh, e))
        goto out;
    if (!(m->embed = view(m, x.embed, 2, e)) || !(m->lm_head = view(m, x.lm_head, 2, e))) goto out;
    /* final norm: used as is (f32 of its bf16) */
    if (!(m->final_norm = own(m, sizeof(float) * (size_t)c->H, e))) goto out;
    for (int i = 0; i < c->H; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)x.norm->data + 2 * i, 2);
        m->final_norm[i] = sm_bf16_to_f32(h);
    }
    /* pass 2: layers */
    for (int l = 0; l < c->L; l++)
        if (load_layer(&x, m, l, e)) goto out;
    if (o->online_mxfp4 && online_mxfp4(m, o->threads, e)) goto out;
    rc = 0;
out:
    free(x.fixed);
    free(x.px);
    free(x.layer_first_px);
    if (rc) sm_model_free(m);
    return rc;
}

void sm_model_free(sm_model *m) {
    for (int i = 0; i < m->nowned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    st_close(&m->ar);
    memset(m, 0, sizeof *m);
}

void sm_expert_row(const sm_model *m, int l, int e, int which, int row, float *out) {
    const sm_config *c = &m->cfg;
    const sm_experts *X = &m->layers[l].ex;
    int64_t cols = which ? c->I : c->Hm;
    const void *w = which ? X->dn[e] : X->gu[e];
    const void *s = which ? X->dns[e] : X->gus[e];
    switch (X->fmt) {
    case SM_EXP_BF16: {
        const uint16_t *r = (const uint16_t *)w + (int64_t)row * cols;
        for (int64_t j = 0; j < cols; j++) out[j] = sm_bf16_to_f32(r[j]);
        break;
    }
    case SM_EXP_FP8: {
        const uint8_t *r = (const uint8_t *)w + (int64_t)row * cols;
        float sc = ((const float *)s)[row];
        for (int64_t j = 0; j < cols; j++) out[j] = sm_r16(sm_e4m3_to_f32(r[j]) * sc); /* r16(e4m3 * scale) */
        break;
    }
    case SM_EXP_MXFP4:
        sm_mx_dequantize_row((const uint8_t *)w + (int64_t)row * (cols / 2),
                             (const uint8_t *)s + (int64_t)row * (cols / SM_MX_BLOCK), cols, out);
        break;
    }
}
