/* upload.cu: the CUDA stock backend from a loaded checkpoint (backend.h:
 * sm_cuda_backend_create): the rank's shard (shard.h: sm_shard_make) goes to the device tensor
 * by tensor, straight from the mapped checkpoint (no host copy of the model).
 *
 * One table (cb_dense_xfers) lists the dense tensors of a layer as copies between the rank's
 * views and the device buffers; the upload walks it host -> device and the dense check
 * (check_dense.cu) device -> host, so the tensor list is written once.  Row slices of the
 * shard are contiguous (one cudaMemcpyAsync); column slices (o_proj when world > 1) are
 * strided views and go through cudaMemcpy2DAsync with the full row as source pitch.  q, k, v
 * and the attention gate of a layer are stored as ONE matrix so one matmul launch produces
 * all four.  Experts go through the MoE module (moe.h).  Every copy is on the context's
 * stream; the stream is drained before the function returns, so the caller may unmap the
 * checkpoint afterwards.  We rejected copying each rank's slice into a contiguous host buffer
 * first: the strided copy does it on the way, without a second host copy of the model.
 */
#include "stock.h"
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- the table of dense tensors -------------------------------------------------------------- */

static cb_xfer cb_x(const char *what, void *dev, const void *host, size_t rows, size_t row_bytes, size_t pitch) {
    cb_xfer t;
    t.what = what;
    t.dev = dev;
    t.host = host;
    t.rows = rows;
    t.row_bytes = row_bytes;
    t.pitch = pitch;
    return t;
}

int cb_dense_xfers(const sm_cuda_dev *c, const sm_shard *sh, int l, cb_xfer *t) {
    const sm_config *cf = &c->cfg;
    size_t H = (size_t)cf->H, Hm = (size_t)cf->Hm, D = (size_t)cf->D, E = (size_t)cf->E;
    size_t QD = (size_t)sh->nHl * D, KD = (size_t)sh->nKVl * D;
    int n = 0;
    if (l < 0) {
        /* vocabulary rows of the embedding and lm_head; the final norm (as is) */
        t[n++] = cb_x("embed_tokens", c->embed, sh->embed, (size_t)sh->nv, H * 2, H * 2);
        t[n++] = cb_x("lm_head", c->lm_head, sh->lm_head, (size_t)sh->nv, H * 2, H * 2);
        t[n++] = cb_x("norm", c->final_norm, sh->m->final_norm, 1, H * 4, H * 4);
        return n;
    }
    const sm_shard_layer *S = &sh->layers[l];
    const sm_layer *F = S->full;
    const cb_layer *L = &c->layers[l];
    /* attention: the rank's head rows of q | k | v | gate, its columns of o_proj */
    t[n++] = cb_x("q_proj", L->wqkvg, S->wq, QD, H * 2, H * 2);
    t[n++] = cb_x("k_proj", L->wqkvg + QD * H, S->wk, KD, H * 2, H * 2);
    t[n++] = cb_x("v_proj", L->wqkvg + (QD + KD) * H, S->wv, KD, H * 2, H * 2);
    t[n++] = cb_x("gate_proj", L->wqkvg + (QD + 2 * KD) * H, S->wg, QD, H * 2, H * 2);
    t[n++] = cb_x("o_proj", L->wo, S->wo, H, QD * 2, (size_t)S->ld_wo * 2);
    /* replicated vectors and router */
    t[n++] = cb_x("input_layernorm", L->in_norm, F->in_norm, 1, H * 4, H * 4);
    t[n++] = cb_x("post_attention_residual_gate (alpha)", L->att_alpha, F->att_alpha, 1, H * 4, H * 4);
    t[n++] = cb_x("post_attention_residual_gate (beta)", L->att_beta, F->att_beta, 1, H * 4, H * 4);
    t[n++] = cb_x("pre_feedforward_layernorm", L->pre_ffn_norm, F->pre_ffn_norm, 1, H * 4, H * 4);
    t[n++] = cb_x("post_feedforward_layernorm", L->post_ffn_norm, F->post_ffn_norm, 1, H * 4, H * 4);
    t[n++] = cb_x("post_feedforward_residual_gate (alpha)", L->ffn_alpha, F->ffn_alpha, 1, H * 4, H * 4);
    t[n++] = cb_x("post_feedforward_residual_gate (beta)", L->ffn_beta, F->ffn_beta, 1, H * 4, H * 4);
    t[n++] = cb_x("mlp.gate", L->router, F->router, E, H * 4, H * 4);
    t[n++] = cb_x("e_score_correction_bias", L->router_bias, F->router_bias, 1, E * 4, E * 4);
    /* pooler / unpooler: the rank's output rows */
    t[n++] = cb_x("pre_expert_proj", L->pooler, S->pooler, (size_t)sh->np, H * 2, H * 2);
    t[n++] = cb_x("pre_expert_norm", L->pre_expert_norm, F->pre_expert_norm, 1, Hm * 4, Hm * 4);
    t[n++] = cb_x("post_expert_proj", L->unpooler, S->unpooler, (size_t)sh->nu, Hm * 2, Hm * 2);
    return n;
}

/* ---- progress ---------------------------------------------------------------------------------- */

typedef struct cb_progress {
    double done, total;        /* bytes */
    double last;               /* time of the last line */
    int shown;                 /* a line is on stderr */
} cb_progress;

static double cb_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void cb_progress_add(cb_progress *p, double bytes) {
    p->done += bytes;
    if (p->total < 4e9) return; /* small models: silent */
    double t = cb_now();
    if (t - p->last < 1.0 && p->done < p->total) return;
    p->last = t;
    fprintf(stderr, "\rcuda backend: uploading weights %.1f / %.1f GB   ", p->done / 1e9, p->total / 1e9);
    p->shown = 1;
}

/* ---- upload ---------------------------------------------------------------------------------- */

/* Copy one table entry host -> device on c->st (strided host rows: a 2D copy). */
static int cb_put(sm_cuda_dev *c, const cb_xfer *t, int l, cb_progress *p, sm_err *e) {
    if (!t->host) return sm_errf(e, "cuda backend: layer %d: tensor %s is missing", l, t->what);
    cudaError_t r = t->pitch == t->row_bytes
        ? cudaMemcpyAsync(t->dev, t->host, t->rows * t->row_bytes, cudaMemcpyHostToDevice, c->st)
        : cudaMemcpy2DAsync(t->dev, t->row_bytes, t->host, t->pitch, t->row_bytes, t->rows, cudaMemcpyHostToDevice, c->st);
    if (r != cudaSuccess)
        return sm_errf(e, "cuda backend: upload of %s (layer %d, %zu bytes) failed on device %d: %s", t->what, l,
                       t->rows * t->row_bytes, c->device, cudaGetErrorString(r));
    cb_progress_add(p, (double)(t->rows * t->row_bytes));
    return 0;
}

/* Bytes the shard needs on the device; refuses (one line) when the device has less free.  The
 * experts count in the MoE module's device layout (sm_cuda_moe_device_expert_bytes: repacked,
 * padded), not in checkpoint bytes: the device holds the former. */
static int cb_room(const sm_cuda_dev *c, const sm_shard *sh, double *need, sm_err *e) {
    const sm_config *cf = &c->cfg;
    double b = 2.0 * sh->nv * cf->H * 2 + (double)cb_layer_bytes(c) * cf->L;
    for (int l = 0; l < cf->L; l++) {
        const sm_shard_experts *X = &sh->layers[l].ex;
        sm_config xc = *cf; /* the widths of the rank's expert slices */
        xc.I = X->ni;
        b += (double)sm_cuda_moe_device_expert_bytes(&xc, X->fmt) * X->ne;
    }
    *need = b;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && b > (double)fr)
        return sm_errf(e, "cuda backend: the model needs %.1f GB of device memory, device %d has %.1f GB free", b / 1e9,
                       c->device, (double)fr / 1e9);
    return 0;
}

/* Layer l: dense allocation and copies, then the experts. */
static int cb_upload_layer(sm_cuda_dev *c, const sm_shard *sh, int l, cb_progress *p, sm_err *e) {
    cb_layer *L = &c->layers[l];
    L->full = sh->m->layers[l].full;
    if (cb_layer_alloc(c, L, e)) return sm_errprefix(e, "cuda backend: layer %d", l);
    cb_xfer t[CB_MAX_XFER];
    int n = cb_dense_xfers(c, sh, l, t);
    for (int i = 0; i < n; i++)
        if (cb_put(c, &t[i], l, p, e)) return -1;
    /* experts: the MoE module reads the checkpoint's experts of layer l (all of them: world 1) */
    if (sm_cuda_moe_upload(sh->m, l, &L->moe, c->st, e)) return sm_errprefix(e, "cuda backend: layer %d experts", l);
    L->have_moe = 1;
    c->weight_bytes += (double)L->moe.blob_bytes;
    cb_progress_add(p, (double)L->moe.blob_bytes); /* device bytes, as cb_room counts them */
    return 0;
}

/* Every weight of shard sh onto c's device; drains c->st before returning. */
static int cb_upload(sm_cuda_dev *c, const sm_shard *sh, sm_err *e) {
    cb_progress p = {0, 0, 0, 0};
    if (cb_room(c, sh, &p.total, e)) return -1;
    int rc = cb_glob_alloc(c, e) ? sm_errprefix(e, "cuda backend") : 0;
    if (!rc) {
        cb_xfer t[CB_MAX_XFER];
        int n = cb_dense_xfers(c, sh, -1, t);
        for (int i = 0; i < n && !rc; i++) rc = cb_put(c, &t[i], -1, &p, e);
    }
    for (int l = 0; l < c->cfg.L && !rc; l++) rc = cb_upload_layer(c, sh, l, &p, e);
    if (p.shown) fputc('\n', stderr);
    /* the host views must stay valid until the copies are done: drain the stream either way */
    cudaError_t r = cudaStreamSynchronize(c->st);
    if (!rc && r != cudaSuccess)
        rc = sm_errf(e, "cuda backend: weight upload failed on device %d: %s", c->device, cudaGetErrorString(r));
    return rc;
}

extern "C" int sm_cuda_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b,
                                      sm_err *e) {
    memset(b, 0, sizeof *b);
    sm_cuda_dev *c;
    if (cb_dev_create(&m->cfg, kv, o, &c, e)) return -1;
    sm_shard sh;
    if (sm_shard_make(m, c->world, c->rank, c->plan.moe, &sh, e)) {
        cb_dev_destroy(c);
        return sm_errprefix(e, "cuda backend");
    }
    int rc = cb_upload(c, &sh, e);
    sm_shard_free(&sh);
    if (rc) {
        cb_dev_destroy(c);
        return -1;
    }
    cb_backend_fill(c, b);
    return 0;
}
