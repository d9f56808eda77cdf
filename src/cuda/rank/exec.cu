/* exec.cu: the executors of a rank's layers (exec.h): the view they see, the stock executor and
 * the monokernel made after the weights, the choice per bucket (--mono off | on | auto), the
 * ranks' agreement with W > 1, their health words after a step.
 *
 * The stock executor runs every layer no other executor takes; the monokernel takes its layers
 * of the buckets it planned, while mono_mode allows it.  Every rank takes the same path every
 * step: the choice uses only the static deployment (checked when the executors are made and
 * agreed across ranks) and the bucket.  This file sees the executors only through exec.h.
 * We rejected choosing per step from anything measured: ranks could disagree, and a captured
 * graph holds one choice.
 */
#include "rank.h"
#include <stdio.h>
#include <string.h>

/* The view of cr its executors see (exec.h: sm_exec_view): a copy of the rank's buffer pointers,
 * made once after they exist (cb_exec_attach); a buffer the rank replaced later would have to be
 * copied again (none is: the KV pool is seen through &cr->kvs). */
static void cb_view(sm_cuda_rank *cr) {
    sm_exec_view *v = &cr->view;
    memset(v, 0, sizeof *v);
    v->device = cr->device;
    v->rank = cr->rank;
    v->world = cr->world;
    v->cfg = &cr->cfg;
    v->plan = &cr->plan;
    v->st = cr->st;
    v->kc = &cr->kc;
    v->layers = cr->layers;
    v->final_norm = cr->final_norm;
    v->kvs = &cr->kvs;
    v->cap = cr->cap;
    v->s = cr->s;
    v->x = cr->x;
    v->qkv[0] = cr->qkvg;
    v->qkv[1] = cr->qkv2;
    v->att = cr->att;
    v->a = cr->a;
    v->xf = cr->xf;
    v->rlog = cr->rlog;
    v->idx = cr->idx;
    v->rw = cr->rw;
    v->h1 = cr->h1;
    v->mo = cr->mo;
    v->f = cr->f;
    v->mws = &cr->mws;
    v->slot = cr->d_slot;
    v->pos = cr->d_pos;
    v->rreq = cr->d_rreq;
    v->tab = cr->d_tab;
    v->gc = cr->gc;
    v->apart = cr->apart;
    v->pooled_part = cr->pooled_part;
    v->xpart = cr->xpart;
    v->unpooled_part = cr->unpooled_part;
}

/* The monokernel off on cr: its state and its second projections buffer freed. */
static void cb_drop_mono(sm_cuda_rank *cr) {
    if (cr->mono.ctx) cr->mono.free(cr->mono.ctx);
    cr->mono.ctx = NULL;
    if (cr->qkv2) SM_CUDA_CHECK_PRINT(cudaFree(cr->qkv2));
    cr->qkv2 = NULL;
    cr->view.qkv[1] = NULL;
    cr->mono_mode = SM_MONO_OFF;
}

int cb_exec_attach(sm_cuda_rank *cr, sm_err *e) {
    cb_view(cr);
    if (sm_exec_stock_create(&cr->view, 0, &cr->stock, e)) return -1;
    if (cr->mono_mode == SM_MONO_OFF) return 0;
    if (sm_exec_mono_create(&cr->view, cr->mono_mode == SM_MONO_ON, &cr->mono, e)) return -1;
    if (!cr->mono.ctx) {
        cr->mono_mode = SM_MONO_OFF;
        return 0;
    }
    if (cr->mono.qkv_alt) { /* a step it runs reads layer l's projections from buffer l & 1 */
        const sm_config *cf = &cr->cfg;
        SM_CUDA_CHECK(cudaMalloc((void **)&cr->qkv2, (size_t)cr->cap * (2 * cf->nH + 2 * cf->nKV) * cf->D * 2));
        cr->view.qkv[1] = cr->qkv2;
    }
    return 0;
}

void cb_exec_detach(sm_cuda_rank *cr) {
    cb_drop_mono(cr);
    if (cr->stock.ctx && cr->stock.free) cr->stock.free(cr->stock.ctx);
    cr->stock.ctx = NULL;
}

int cb_exec_pick(sm_cuda_rank *cr, int nb, sm_err *e) {
    if (!cr->mono.ctx || cr->mono_mode == SM_MONO_OFF) return 0;
    return cr->mono.plan(cr->mono.ctx, nb, cr->mono_mode == SM_MONO_ON, e);
}

int cb_exec_world_link(sm_cuda_rank **rk, int W, int virt, int peer, sm_err *e) {
    void *ctx[64];
    const unsigned long long *steps[64];
    int on = 0, strict = 0;
    for (int r = 0; r < W; r++) {
        ctx[r] = rk[r]->mono.ctx;
        steps[r] = sm_gcomm_step(rk[r]->gc);
        on += ctx[r] != NULL;
        strict |= rk[r]->mono_mode == SM_MONO_ON;
    }
    if (!on) return 0;
    sm_exec_world w;
    w.virt = virt;
    w.peer = peer;
    w.steps = steps;
    int first = 0;
    while (!ctx[first]) first++;
    const int rc = rk[first]->mono.world_link(ctx, W, &w, strict, e);
    if (rc < 0) return -1;
    if (rc == 0) /* every rank takes the same path: off on all of them */
        for (int r = 0; r < W; r++) {
            if (!rk[r]->mono.ctx || cb_enter(rk[r], e) == 0) cb_drop_mono(rk[r]);
            rk[r]->mono_mode = SM_MONO_OFF;
        }
    return 0;
}

int cb_exec_health_fetch(sm_cuda_rank *cr, sm_err *e) {
    const sm_exec *x[2] = {&cr->stock, &cr->mono};
    for (int i = 0; i < 2; i++)
        if (x[i]->ctx && x[i]->health_fetch && x[i]->health_fetch(x[i]->ctx, e)) return -1;
    return 0;
}

int cb_exec_health_check(sm_cuda_rank *cr, sm_err *e) {
    const sm_exec *x[2] = {&cr->stock, &cr->mono};
    for (int i = 0; i < 2; i++)
        if (x[i]->ctx && x[i]->health_check && x[i]->health_check(x[i]->ctx, e)) return -1;
    return 0;
}
