/* shard.c: per-rank views of a loaded model (shard.h, docs/model.md section 9).
 *
 * A shard is pointer arithmetic on the loaded model: row slices are a pointer to the first
 * owned row, column slices a pointer to the first owned column plus the full row length.
 * The only allocations are the view tables themselves (per layer, three small structs per
 * held expert).  All divisibility checks run before anything is built, and every failing
 * dimension is named in one line, so a user sees at once which world sizes a model admits.
 * We rejected checking one dimension at a time: W = 8 on a small model usually fails on
 * several, and fixing them one error message at a time is tedious.
 */
#include "parallel/shard.h"
#include "model/codec.h"
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sm_moe_layout_parse(const char *s, sm_moe_layout *out, sm_err *e) {
    if (s && !strcmp(s, "ep")) { *out = SM_MOE_EP; return 0; }
    if (s && !strcmp(s, "tp")) { *out = SM_MOE_TP; return 0; }
    return sm_errf(e, "moe layout '%s' is not 'ep' or 'tp'", s ? s : "(null)");
}

const char *sm_moe_layout_name(sm_moe_layout l) { return l == SM_MOE_TP ? "tp" : "ep"; }
sm_moe_layout sm_moe_layout_of(int moe_tp) { return moe_tp ? SM_MOE_TP : SM_MOE_EP; }

/* Append ", name = v" to the list in buf when v % world != 0. */
static void need_div(char *buf, size_t cap, int *nbad, const char *name, int v, int world) {
    if (v % world == 0) return;
    size_t k = strlen(buf);
    snprintf(buf + k, cap - k, "%s%s = %d", *nbad ? ", " : "", name, v);
    (*nbad)++;
}

int sm_shard_check_config(const sm_config *c, int world, sm_moe_layout moe, sm_err *e) {
    if (world < 1 || world > SM_MAX_WORLD)
        return sm_errf(e, "world %d: the number of ranks must be in [1, %d]", world, SM_MAX_WORLD);
    if (moe != SM_MOE_EP && moe != SM_MOE_TP) return sm_errf(e, "world %d: unknown moe layout %d", world, (int)moe);
    char bad[512] = "";
    int nbad = 0;
    need_div(bad, sizeof bad, &nbad, "num_attention_heads nH", c->nH, world);
    need_div(bad, sizeof bad, &nbad, "num_key_value_heads nKV", c->nKV, world);
    if (moe == SM_MOE_EP) need_div(bad, sizeof bad, &nbad, "num_local_experts E (moe ep)", c->E, world);
    else need_div(bad, sizeof bad, &nbad, "moe_intermediate_size I (moe tp)", c->I, world);
    need_div(bad, sizeof bad, &nbad, "moe_hidden_size Hm", c->Hm, world);
    need_div(bad, sizeof bad, &nbad, "hidden_size H", c->H, world);
    need_div(bad, sizeof bad, &nbad, "vocab_size V", c->V, world);
    if (nbad) return sm_errf(e, "world %d does not divide %s", world, bad);
    return 0;
}

int sm_shard_check(const sm_model *m, int world, sm_moe_layout moe, sm_err *e) {
    const sm_config *c = &m->cfg;
    if (sm_shard_check_config(c, world, moe, e)) return -1;
    if (moe != SM_MOE_TP) return 0;
    /* a column slice of down along I must hold whole MXFP4 scale blocks */
    int ni = c->I / world;
    for (int l = 0; l < c->L; l++)
        if (m->layers[l].ex.fmt == SM_EXP_MXFP4 && ni % SM_MX_BLOCK != 0)
            return sm_errf(e, "world %d, moe tp: layer %d has MXFP4 experts and moe_intermediate_size I / W = %d / %d = %d "
                           "is not a multiple of %d (a rank's columns of down would cut a scale block; use --moe ep)",
                           world, l, c->I, world, ni, SM_MX_BLOCK);
    return 0;
}

/* Bytes of `vals` consecutive stored values in format f (vals even for MXFP4). */
static int64_t fmt_bytes(sm_expert_fmt f, int64_t vals) {
    size_t w;
    sm_expert_mat_bytes(f, 1, vals, &w, NULL);
    return (int64_t)w;
}

/* View of rows [r0, r0 + ...) and columns [c0, ...) of an expert matrix of `cols` columns
 * (w weights, s scales in format f); c0 a multiple of 32 for MXFP4. */
static sm_shard_mat mat_view(sm_expert_fmt f, const void *w, const void *s, int64_t cols, int64_t r0, int64_t c0) {
    sm_shard_mat v;
    v.ld = cols;
    v.w = (const uint8_t *)w + fmt_bytes(f, r0 * cols + c0);
    switch (f) {
    case SM_EXP_FP8: /* per-row scales: the slice's rows */
        v.s = (const float *)s + r0;
        break;
    case SM_EXP_MXFP4: /* [rows, cols/32] block scales: the slice's first block */
        v.s = (const uint8_t *)s + r0 * (cols / SM_MX_BLOCK) + c0 / SM_MX_BLOCK;
        break;
    default:
        v.s = NULL;
        break;
    }
    return v;
}

void sm_shard_free(sm_shard *s) {
    free(s->layers);
    free(s->mats);
    memset(s, 0, sizeof *s);
}

/* The invariant of sm_shard_plan / sm_shard_make: (world, moe) passed sm_shard_check where
 * the option entered, and rank is one of the world's. */
static int admitted(const sm_config *c, int world, int rank, sm_moe_layout moe) {
    sm_err unused;
    return rank >= 0 && rank < world && sm_shard_check_config(c, world, moe, &unused) == 0;
}

void sm_shard_plan(const sm_config *c, int world, int rank, sm_moe_layout moe, sm_shard *s) {
    assert(admitted(c, world, rank, moe));
    memset(s, 0, sizeof *s);
    s->rank = rank;
    s->world = world;
    s->moe = moe;
    s->nHl = c->nH / world, s->h0 = rank * s->nHl;
    s->nKVl = c->nKV / world, s->kv0 = rank * s->nKVl;
    s->np = c->Hm / world, s->p0 = rank * s->np;
    s->nu = c->H / world, s->u0 = rank * s->nu;
    s->nv = c->V / world, s->v0 = rank * s->nv;
}

int sm_shard_make(const sm_model *m, int world, int rank, sm_moe_layout moe, sm_shard *s, sm_err *e) {
    memset(s, 0, sizeof *s);
    const sm_config *c = &m->cfg;
    sm_shard_plan(c, world, rank, moe, s);
    int Hm = c->Hm, I = c->I;
    s->m = m;
    /* vocabulary rows of the embedding and lm_head */
    s->embed = sm_shard_tensor(s, -1, SM_T_EMBED, 0).host;
    s->lm_head = sm_shard_tensor(s, -1, SM_T_LM_HEAD, 0).host;
    int ne = moe == SM_MOE_EP ? c->E / world : c->E;
    int e0 = moe == SM_MOE_EP ? rank * ne : 0;
    int ni = moe == SM_MOE_TP ? I / world : I;
    int i0 = moe == SM_MOE_TP ? rank * ni : 0;
    s->layers = calloc((size_t)c->L, sizeof *s->layers);
    s->mats = malloc(sizeof *s->mats * (size_t)c->L * 3 * (size_t)ne);
    if (!s->layers || !s->mats) {
        sm_shard_free(s);
        return sm_errf(e, "world %d rank %d: out of memory for the shard views", world, rank);
    }
    for (int l = 0; l < c->L; l++) {
        const sm_layer *L = &m->layers[l];
        sm_shard_layer *S = &s->layers[l];
        S->full = L;
        /* attention: rows of the local heads, columns of o_proj; pooler / unpooler output rows */
        S->wq = sm_shard_tensor(s, l, SM_T_WQ, 0).host;
        S->wg = sm_shard_tensor(s, l, SM_T_WG, 0).host;
        S->wk = sm_shard_tensor(s, l, SM_T_WK, 0).host;
        S->wv = sm_shard_tensor(s, l, SM_T_WV, 0).host;
        sm_shard_part wo = sm_shard_tensor(s, l, SM_T_WO, 0);
        S->wo = wo.host;
        S->ld_wo = wo.pitch / (int64_t)sizeof *S->wo;
        S->pooler = sm_shard_tensor(s, l, SM_T_POOLER, 0).host;
        S->unpooler = sm_shard_tensor(s, l, SM_T_UNPOOLER, 0).host;
        /* experts: whole ones (EP) or the I slice of every one (TP) */
        sm_shard_experts *X = &S->ex;
        X->fmt = L->ex.fmt;
        X->act_mx = L->ex.act_mx;
        X->e0 = e0, X->ne = ne, X->i0 = i0, X->ni = ni;
        X->gate = s->mats + (int64_t)l * 3 * ne;
        X->up = X->gate + ne;
        X->down = X->up + ne;
        for (int j = 0; j < ne; j++) {
            int g = e0 + j;
            X->gate[j] = mat_view(X->fmt, L->ex.gu[g], L->ex.gus[g], Hm, i0, 0);
            X->up[j] = mat_view(X->fmt, L->ex.gu[g], L->ex.gus[g], Hm, (int64_t)I + i0, 0);
            X->down[j] = mat_view(X->fmt, L->ex.dn[g], L->ex.dns[g], I, 0, i0);
        }
    }
    return 0;
}

sm_shard_part sm_shard_tensor(const sm_shard *s, int l, sm_tensor_role r, int k) {
    int64_t sh[3];
    int nd = sm_tensor_shape(&s->m->cfg, r, sh), nvec, eb;
    sm_tensor_loaded(r, &nvec, &eb);
    int64_t rows = nd == 1 ? 1 : sh[0], cols = sh[nd - 1];
    sm_shard_part p = {sm_model_tensor(s->m, l, r, k), rows, cols * eb, cols * eb};
    if (!p.host) return p;
    switch (sm_tensors[r].split) {
    case SM_SPLIT_ROWS: /* rows [rank rows/W, (rank+1) rows/W) */
        p.rows = rows / s->world;
        p.host = (const uint8_t *)p.host + s->rank * p.rows * p.pitch;
        break;
    case SM_SPLIT_COLS: /* columns [rank cols/W, (rank+1) cols/W) of every row */
        p.row_bytes = cols / s->world * eb;
        p.host = (const uint8_t *)p.host + s->rank * p.row_bytes;
        break;
    default: /* replicated (the experts have no loaded form here: host is NULL) */
        break;
    }
    return p;
}

void sm_shard_mat_row(sm_expert_fmt fmt, const sm_shard_mat *v, int row, int cols, float *out) {
    switch (fmt) {
    case SM_EXP_FP8: {
        /* r16(e4m3 * row scale), as the loader defines the dequantized value */
        const uint8_t *r = (const uint8_t *)v->w + (int64_t)row * v->ld;
        float sc = ((const float *)v->s)[row];
        for (int j = 0; j < cols; j++) out[j] = sm_r16(sm_e4m3_to_f32(r[j]) * sc);
        break;
    }
    case SM_EXP_MXFP4: {
        /* e2m1 code x 2^(scale - 127), exact; the slice starts on a block boundary */
        const uint8_t *q = (const uint8_t *)v->w + (int64_t)row * (v->ld / 2);
        const uint8_t *sc = (const uint8_t *)v->s + (int64_t)row * (v->ld / SM_MX_BLOCK);
        sm_mx_dequantize_row(q, sc, cols, out);
        break;
    }
    default: {
        const uint16_t *r = (const uint16_t *)v->w + (int64_t)row * v->ld;
        for (int j = 0; j < cols; j++) out[j] = sm_bf16_to_f32(r[j]);
        break;
    }
    }
}

int sm_devices_parse(const char *s, int world, int *out, sm_err *e) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 63 || (*end && *end != ','))
            return sm_errf(e, "devices '%s': expected comma-separated device ordinals 0..63", s);
        if (n == world) return sm_errf(e, "devices '%s' lists more than world = %d devices", s, world);
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (n != world) return sm_errf(e, "devices '%s' lists %d device%s for world = %d", s, n, n == 1 ? "" : "s", world);
    return 0;
}
