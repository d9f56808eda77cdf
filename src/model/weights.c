/* weights.c: checkpoint loader (docs/model.md section 2): names -> plain structs of views.
 *
 * One pass over the archive classifies every tensor name into a slot of the tensor tables
 * (tensors.h: model-level, per-layer, consolidated experts, per-expert weight/scale); an
 * unparseable or unknown name fails there, naming the tensor.  A second pass per layer checks
 * every slot's dtype and shape exactly, resolves the layer's expert format and turns each
 * tensor into its loaded form by the table's kind (view, eff norm, gate coefficients); one
 * switch (field_of) maps roles to the fields of weights.h.  Views stay in the mmapped files;
 * only misaligned views, the small precomputed vectors (eff norms, residual-gate alpha/beta)
 * and online-MXFP4 experts are owned.  We rejected looking names up one by one with st_find:
 * it cannot see the tensors nobody asked for, and unknown names must be refused.
 */
#include "model/weights.h"
#include "model/codec.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define P_ SM_TENSOR_PREFIX

const char *sm_expert_fmt_name(sm_expert_fmt f) {
    return (unsigned)f < SM_EXP_NFMT ? sm_expert_formats[f].name : "?";
}

void sm_expert_mat_bytes(sm_expert_fmt f, int64_t rows, int64_t cols, size_t *wbytes, size_t *sbytes) {
    const sm_expert_format *F = &sm_expert_formats[(unsigned)f < SM_EXP_NFMT ? f : SM_EXP_BF16];
    int64_t sb = F->scale == 0 ? 0 : F->scale == 1 ? rows : rows * (cols / F->scale); /* scale values */
    if (wbytes) *wbytes = (size_t)(rows * cols * F->value_bits / 8);
    if (sbytes) *sbytes = (size_t)(sb * st_dtype_bits(F->s) / 8);
}

size_t sm_expert_bytes(const sm_config *c, sm_expert_fmt f) {
    size_t w1, s1, w2, s2;
    sm_expert_mat_bytes(f, 2 * (int64_t)c->I, c->Hm, &w1, &s1); /* gate_up */
    sm_expert_mat_bytes(f, c->Hm, c->I, &w2, &s2);              /* down */
    return w1 + s1 + w2 + s2;
}

void sm_norm_gain(const uint16_t *g, int64_t n, sm_tensor_kind kind, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float v = sm_bf16_to_f32(g[i]);
        out[i] = kind == SM_TK_NORM1 ? sm_r16(1.0f + v) : v; /* eff(g) = r16(1 + g), or g as is */
    }
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

#define NGLOB (SM_T_N - SM_T_NLAYER) /* model-level roles */

typedef struct load_ctx {
    const char *dir;
    sm_config *c;
    st_archive *ar;
    const st_tensor **fixed;   /* [L * SM_T_NLAYER] per-layer roles */
    const st_tensor **px;      /* [L * E * SM_XS_N] per-expert slots */
    const st_tensor **layer_first_px; /* [L] first per-expert tensor seen in each layer */
    const st_tensor *glob[NGLOB]; /* model-level roles, [r - SM_T_NLAYER] */
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

/* Classify one tensor name into its slot. */
static int classify(load_ctx *x, const st_tensor *t, sm_err *e) {
    const sm_config *c = x->c;
    const char *nm = t->name;
    const st_tensor **slot = NULL;
    int g = sm_tensor_find_model(nm);
    if (g >= 0) slot = &x->glob[g - SM_T_NLAYER];
    else if (strncmp(nm, P_, sizeof P_ - 1) != 0)
        return sm_errf(e, "%s: tensor '%s': unknown tensor name (not a model-level name, not under '" P_ "')",
                       tfile(x, t), nm);
    else {
        const char *s = nm + sizeof P_ - 1;
        if (strncmp(s, "layers.", 7) == 0) {
            const char *p = s + 7;
            long l;
            if (parse_index(&p, &l)) return sm_errf(e, "%s: tensor '%s': unknown tensor name", tfile(x, t), nm);
            if (l >= c->L)
                return sm_errf(e, "%s: tensor '%s': layer %ld >= num_hidden_layers %d", tfile(x, t), nm, l, c->L);
            int r = sm_tensor_find_layer(p);
            if (r >= 0) slot = &x->fixed[l * SM_T_NLAYER + r];
            if (!slot && strncmp(p, "mlp.experts.", 12) == 0) {
                const char *q = p + 12;
                long ex;
                if (parse_index(&q, &ex) == 0) {
                    int k;
                    for (k = 0; k < SM_XS_N; k++)
                        if (strcmp(q, sm_expert_slot_suffix[k]) == 0) break;
                    if (k == SM_XS_N) return sm_errf(e, "%s: tensor '%s': unknown tensor name", tfile(x, t), nm);
                    if (ex >= c->E)
                        return sm_errf(e, "%s: tensor '%s': expert index %ld >= num_local_experts %d",
                                       tfile(x, t), nm, ex, c->E);
                    slot = &x->px[((int64_t)l * c->E + ex) * SM_XS_N + k];
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

/* The norm gain of tensor t (kind SM_TK_NORM1 or SM_TK_NORM0) into an owned f32 array. */
static float *norm_gain(sm_model *m, const st_tensor *t, sm_tensor_kind kind, sm_err *e) {
    const uint16_t *g = view(m, t, 2, e);
    float *w = g ? own(m, (size_t)t->numel * sizeof(float), e) : NULL;
    if (w) sm_norm_gain(g, t->numel, kind, w);
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
static int load_experts(load_ctx *x, sm_model *m, int l, sm_err *e) {
    const sm_config *c = &m->cfg;
    int E = c->E;
    sm_experts *X = &m->layers[l].ex;
    const void **ptrs = own(m, sizeof(void *) * 4 * (size_t)E, e);
    if (!ptrs) return -1;
    X->gu = ptrs; X->gus = ptrs + E; X->dn = ptrs + 2 * E; X->dns = ptrs + 3 * E;
    const st_tensor **f = &x->fixed[l * SM_T_NLAYER];
    const st_tensor *cgu = f[SM_T_EXPERTS_GU], *cdn = f[SM_T_EXPERTS_DN];
    const st_tensor *first = x->layer_first_px[l];
    char nm[256];
    if ((cgu || cdn) && first)
        return sm_errf(e, "%s: tensor '%s': duplicate expert tensor: layer %d also holds consolidated '%s'",
                       tfile(x, first), first->name, l, (cgu ? cgu : cdn)->name);
    if (cgu || cdn) {
        /* consolidated BF16 [E, 2I, Hm] and [E, Hm, I] */
        for (int r = SM_T_EXPERTS_GU; r <= SM_T_EXPERTS_DN; r++) {
            const st_tensor *t = f[r];
            sm_tensor_name(nm, sizeof nm, (sm_tensor_role)r, l);
            if (!t) return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
            int64_t sh[3];
            int nd = sm_tensor_shape(c, (sm_tensor_role)r, sh);
            if (check_tensor(x, t, sm_tensors[r].dtype, nd, sh, e)) return -1;
            const uint8_t *base = view(m, t, 2, e);
            if (!base) return -1;
            size_t per = (size_t)(sh[1] * sh[2] * 2);
            for (int ex = 0; ex < E; ex++) {
                if (r == SM_T_EXPERTS_GU) X->gu[ex] = base + per * ex;
                else X->dn[ex] = base + per * ex;
            }
        }
        X->fmt = SM_EXP_BF16;
        return 0;
    }
    if (!first) {
        sm_tensor_name(nm, sizeof nm, SM_T_EXPERTS_GU, l);
        return sm_errf(e, "%s: missing tensor '%s' (no consolidated or per-expert expert tensors in layer %d)", x->dir,
                       nm, l);
    }
    /* the layer's format is the format of expert 0's gate_up weight */
    const st_tensor *t0 = x->px[((int64_t)l * E) * SM_XS_N + SM_XS_GU_W];
    if (!t0) {
        sm_expert_tensor_name(nm, sizeof nm, l, 0, SM_XS_GU_W);
        return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
    }
    int fmt = sm_expert_fmt_of_dtype(t0->dtype);
    if (fmt < 0)
        return sm_errf(e, "%s: tensor '%s': dtype %s is not an expert weight dtype (BF16, F8_E4M3, U8, F4)",
                       tfile(x, t0), t0->name, st_dtype_name(t0->dtype));
    X->fmt = (sm_expert_fmt)fmt;
    const sm_expert_format *F = &sm_expert_formats[fmt];
    for (int ex = 0; ex < E; ex++) {
        const st_tensor **s = &x->px[((int64_t)l * E + ex) * SM_XS_N];
        if (!s[0] && !s[1] && !s[2] && !s[3]) {
            sm_expert_tensor_name(nm, sizeof nm, l, ex, SM_XS_GU_W);
            return sm_errf(e, "%s: missing expert %d of layer %d (no tensor '%s')", x->dir, ex, l, nm);
        }
        for (int pj = 0; pj < 2; pj++) {
            const st_tensor *w = s[2 * pj], *sc = s[2 * pj + 1];
            if (!w) {
                sm_expert_tensor_name(nm, sizeof nm, l, ex, 2 * pj);
                return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
            }
            if (sm_expert_fmt_of_dtype(w->dtype) != fmt)
                return sm_errf(e, "%s: tensor '%s': dtype %s: layer %d mixes expert formats (expert 0 is %s)",
                               tfile(x, w), w->name, st_dtype_name(w->dtype), l, sm_expert_fmt_name(X->fmt));
            int64_t sh[2];
            int nd = sm_expert_slot_shape(c, X->fmt, 2 * pj, w->dtype, sh);
            if (check_tensor(x, w, w->dtype, nd, sh, e)) return -1;
            int wb = st_dtype_bits(w->dtype) / 8;
            const void *wv = view(m, w, wb > 1 ? (size_t)wb : 1, e);
            const void *sv = NULL;
            if (!wv) return -1;
            if (F->scale == 0) {
                if (sc)
                    return sm_errf(e, "%s: tensor '%s': unexpected weight_scale for %s experts", tfile(x, sc), sc->name,
                                   st_dtype_name(F->w));
            } else {
                if (!sc) {
                    sm_expert_tensor_name(nm, sizeof nm, l, ex, 2 * pj + 1);
                    return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
                }
                st_dtype sdt = sc->dtype == F->s_alt ? F->s_alt : F->s; /* expected: the one it has, else s */
                nd = sm_expert_slot_shape(c, X->fmt, 2 * pj + 1, sdt, sh);
                if (check_tensor(x, sc, sdt, nd, sh, e)) return -1;
                int sb = st_dtype_bits(sdt) / 8;
                if (!(sv = view(m, sc, (size_t)sb, e))) return -1;
                if (fmt == SM_EXP_MXFP4) { /* e8m0: 0xFF is NaN */
                    const void *hit = memchr(sv, 0xFF, sc->nbytes);
                    if (hit)
                        return sm_errf(e, "%s: tensor '%s': e8m0 scale byte 0xFF (NaN) at element %lld", tfile(x, sc),
                                       sc->name, (long long)((const uint8_t *)hit - (const uint8_t *)sv));
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

/* ---- loaded forms: the one map from roles to the fields of weights.h ---- */

/* Address of the field of m that holds role r's loaded form (vector k of a gate), NULL for
 * the experts.  The field's type follows the table (sm_tensor_loaded): a BF16 view is a
 * const uint16_t *, an F32 view a const float *, a derived vector a float *. */
static void *field_of(sm_model *m, int l, sm_tensor_role r, int k) {
    sm_layer *L = r < SM_T_NLAYER ? &m->layers[l] : NULL; /* used by the per-layer roles only */
    switch (r) {
    case SM_T_IN_NORM: return &L->in_norm;
    case SM_T_WQ: return &L->wq;
    case SM_T_WK: return &L->wk;
    case SM_T_WV: return &L->wv;
    case SM_T_WG: return &L->wg;
    case SM_T_WO: return &L->wo;
    case SM_T_ATT_GATE: return k ? &L->att_beta : &L->att_alpha;
    case SM_T_PRE_FFN_NORM: return &L->pre_ffn_norm;
    case SM_T_POST_FFN_NORM: return &L->post_ffn_norm;
    case SM_T_FFN_GATE: return k ? &L->ffn_beta : &L->ffn_alpha;
    case SM_T_ROUTER: return &L->router;
    case SM_T_ROUTER_BIAS: return &L->router_bias;
    case SM_T_POOLER: return &L->pooler;
    case SM_T_PRE_EXPERT_NORM: return &L->pre_expert_norm;
    case SM_T_POST_EXPERT_NORM: return &L->post_expert_norm;
    case SM_T_UNPOOLER: return &L->unpooler;
    case SM_T_EMBED: return &m->embed;
    case SM_T_FINAL_NORM: return &m->final_norm;
    case SM_T_LM_HEAD: return &m->lm_head;
    default: return NULL; /* experts: sm_experts */
    }
}

static void set_field(sm_model *m, int l, sm_tensor_role r, int k, const void *p) {
    void *f = field_of(m, l, r, k);
    if (sm_tensors[r].kind != SM_TK_VIEW) *(float **)f = (float *)p; /* owned by m */
    else if (sm_tensors[r].dtype == ST_F32) *(const float **)f = p;
    else *(const uint16_t **)f = p;
}

const void *sm_model_tensor(const sm_model *m, int l, sm_tensor_role r, int k) {
    if ((int)r < 0 || r >= SM_T_N || (r < SM_T_NLAYER && (l < 0 || l >= m->cfg.L))) return NULL;
    const void *f = field_of((sm_model *)m, l, r, k); /* read only */
    if (!f) return NULL;
    if (sm_tensors[r].kind != SM_TK_VIEW) return *(float *const *)f;
    if (sm_tensors[r].dtype == ST_F32) return *(const float *const *)f;
    return *(const uint16_t *const *)f;
}

/* The loaded form of tensor t of role r (layer l) into its field(s). */
static int load_tensor(sm_model *m, int l, sm_tensor_role r, const st_tensor *t, sm_err *e) {
    switch (sm_tensors[r].kind) {
    case SM_TK_VIEW: { /* in place (copied only if misaligned) */
        const void *v = view(m, t, (size_t)st_dtype_bits(t->dtype) / 8, e);
        if (!v) return -1;
        set_field(m, l, r, 0, v);
        return 0;
    }
    case SM_TK_NORM1: /* a norm centred at 1: eff(g) = r16(1 + g) */
    case SM_TK_NORM0: { /* the final norm: used as is (f32 of its bf16) */
        float *w = norm_gain(m, t, sm_tensors[r].kind, e);
        if (!w) return -1;
        set_field(m, l, r, 0, w);
        return 0;
    }
    case SM_TK_GATE: { /* residual gate: alpha/beta per channel */
        float *a, *b;
        if (gate_coefs(m, t, &a, &b, e)) return -1;
        set_field(m, l, r, 0, a);
        set_field(m, l, r, 1, b);
        return 0;
    }
    case SM_TK_EXPERTS: break; /* load_experts */
    }
    return 0;
}

/* Roles [r0, r1) of layer l (-1: model-level) with tensors f[r - r0]: every one present with
 * its dtype and shape, then each into its loaded form. */
static int load_roles(load_ctx *x, sm_model *m, int l, int r0, int r1, const st_tensor **f, sm_err *e) {
    char nm[256];
    for (int r = r0; r < r1; r++)
        if (!f[r - r0] && sm_tensors[r].kind != SM_TK_EXPERTS) {
            sm_tensor_name(nm, sizeof nm, (sm_tensor_role)r, l);
            return sm_errf(e, "%s: missing tensor '%s'", x->dir, nm);
        }
    for (int r = r0; r < r1; r++) {
        if (sm_tensors[r].kind == SM_TK_EXPERTS) continue;
        int64_t sh[3];
        int nd = sm_tensor_shape(x->c, (sm_tensor_role)r, sh);
        if (check_tensor(x, f[r - r0], sm_tensors[r].dtype, nd, sh, e)) return -1;
    }
    for (int r = r0; r < r1; r++)
        if (load_tensor(m, l, (sm_tensor_role)r, f[r - r0], e)) return -1;
    return 0;
}

/* ---- the loader ---- */
static int load_layer(load_ctx *x, sm_model *m, int l, sm_err *e) {
    m->layers[l].full = m->cfg.full[l];
    if (load_roles(x, m, l, 0, SM_T_NLAYER, &x->fixed[l * SM_T_NLAYER], e)) return -1;
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
    if (sm_quant_load(path, &m->quant, e)) return -1;
    if (st_open_dir(dir, &m->ar, e)) { sm_quant_free(&m->quant); return -1; }
    const sm_config *c = &m->cfg;
    load_ctx x;
    memset(&x, 0, sizeof x);
    x.dir = dir;
    x.c = &m->cfg;
    x.ar = &m->ar;
    x.fixed = calloc((size_t)c->L * SM_T_NLAYER, sizeof *x.fixed);
    x.px = calloc((size_t)c->L * c->E * SM_XS_N, sizeof *x.px);
    x.layer_first_px = calloc((size_t)c->L, sizeof *x.layer_first_px);
    m->layers = calloc((size_t)c->L, sizeof *m->layers);
    int rc = -1;
    if (!x.fixed || !x.px || !x.layer_first_px || !m->layers) { sm_errf(e, "%s: out of memory", dir); goto out; }
    /* pass 1: every name to its slot */
    for (int i = 0; i < m->ar.ntensors; i++)
        if (classify(&x, &m->ar.tensors[i], e)) goto out;
    /* model-level tensors */
    if (load_roles(&x, m, -1, SM_T_NLAYER, SM_T_N, x.glob, e)) goto out;
    /* pass 2: layers */
    for (int l = 0; l < c->L; l++)
        if (load_layer(&x, m, l, e)) goto out;
    sm_expert_fmt fmt[SM_MAX_LAYERS];
    unsigned char onl[SM_MAX_LAYERS];
    for (int l = 0; l < c->L; l++) fmt[l] = m->layers[l].ex.fmt;
    if (o->online_mxfp4 && online_mxfp4(m, o->threads, e)) goto out;
    /* the activations of each layer's experts (W4A4 or W4A16): quant.h */
    int act[SM_MAX_LAYERS];
    for (int l = 0; l < c->L; l++) {
        onl[l] = fmt[l] != m->layers[l].ex.fmt; /* made MXFP4 by online_mxfp4 */
        fmt[l] = m->layers[l].ex.fmt;
    }
    if (sm_quant_layer_acts(&m->quant, c, fmt, onl, o->activations, path, act, m->act_src, e)) goto out;
    for (int l = 0; l < c->L; l++) m->layers[l].ex.act_mx = act[l];
    m->acts = o->activations;
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
    sm_quant_free(&m->quant);
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
