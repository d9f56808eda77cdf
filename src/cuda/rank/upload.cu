/* upload.cu: the CUDA backend from a loaded checkpoint (backend.h:
 * sm_cuda_backend_create): the rank's shard (shard.h: sm_shard_make) goes to the device tensor
 * by tensor, straight from the mapped checkpoint (no host copy of the model).
 *
 * cb_dense_xfers walks the tensor table (tensors.h) into copies between the rank's parts
 * (shard.h: sm_shard_tensor) and the device buffers (cb_tensor_dev); the upload runs them
 * host -> device and the dense check (check_dense.cu) device -> host, so the tensor list is
 * written once, in tensors.c.  Row slices of the
 * shard are contiguous (one cudaMemcpyAsync); column slices (o_proj when world > 1) are
 * strided views and go through cudaMemcpy2DAsync with the full row as source pitch.  q, k, v
 * and the attention gate of a layer are stored as ONE matrix so one matmul launch produces
 * all four.  Experts go through the MoE module (moe.h).  Every copy is on the context's
 * stream; the stream is drained before the function returns, so the caller may unmap the
 * checkpoint afterwards.  We rejected copying each rank's slice into a contiguous host buffer
 * first: the strided copy does it on the way, without a second host copy of the model.
 */
#include "rank.h"
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- the table of dense tensors -------------------------------------------------------------- */

int cb_dense_xfers(const sm_cuda_rank *cr, const sm_shard *sh, int l, cb_xfer *t) {
    int n = 0;
    const int r0 = l < 0 ? SM_T_NLAYER : 0, r1 = l < 0 ? SM_T_N : SM_T_NLAYER;
    for (int r = r0; r < r1; r++) {
        int nvec, eb;
        sm_tensor_loaded((sm_tensor_role)r, &nvec, &eb);
        for (int k = 0; k < nvec; k++) {
            void *dev = cb_tensor_dev(cr, l, (sm_tensor_role)r, k);
            if (!dev) continue; /* the MoE module's */
            const sm_shard_part p = sm_shard_tensor(sh, l, (sm_tensor_role)r, k);
            cb_xfer x;
            x.what = sm_tensors[r].name;
            x.k = k;
            x.dev = dev;
            x.host = p.host;
            x.rows = (size_t)p.rows;
            x.row_bytes = (size_t)p.row_bytes;
            x.pitch = (size_t)p.pitch;
            t[n++] = x;
        }
    }
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

/* Copy one table entry host -> device on cr->st (strided host rows: a 2D copy). */
static int cb_put(sm_cuda_rank *cr, const cb_xfer *t, int l, cb_progress *p, sm_err *e) {
    if (!t->host) return sm_errf(e, "cuda backend: layer %d: tensor %s%s is missing", l, t->what, t->k ? " (beta)" : "");
    cudaError_t r = t->pitch == t->row_bytes
        ? cudaMemcpyAsync(t->dev, t->host, t->rows * t->row_bytes, cudaMemcpyHostToDevice, cr->st)
        : cudaMemcpy2DAsync(t->dev, t->row_bytes, t->host, t->pitch, t->row_bytes, t->rows, cudaMemcpyHostToDevice, cr->st);
    if (r != cudaSuccess)
        return sm_errf(e, "cuda backend: upload of %s%s (layer %d, %zu bytes) failed on device %d: %s", t->what,
                       t->k ? " (beta)" : "", l, t->rows * t->row_bytes, cr->device, cudaGetErrorString(r));
    cb_progress_add(p, (double)(t->rows * t->row_bytes));
    return 0;
}

/* Bytes the shard needs on the device; refuses (one line) when the device has less free.  The
 * experts count in the MoE module's device layout (sm_cuda_moe_device_expert_bytes: repacked,
 * padded), not in checkpoint bytes: the device holds the former. */
static int cb_room(const sm_cuda_rank *cr, const sm_shard *sh, double *need, sm_err *e) {
    const sm_config *cf = &cr->cfg;
    double b = 2.0 * sh->nv * cf->H * 2 + (double)cb_layer_bytes(cr) * cf->L;
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
                       cr->device, (double)fr / 1e9);
    return 0;
}

/* Layer l: dense allocation and copies, then the experts. */
static int cb_upload_layer(sm_cuda_rank *cr, const sm_shard *sh, int l, cb_progress *p, sm_err *e) {
    sm_exec_layer *L = &cr->layers[l];
    L->full = sh->m->layers[l].full;
    if (cb_layer_alloc(cr, L, e)) return sm_errprefix(e, "cuda backend: layer %d", l);
    cb_xfer t[CB_MAX_XFER];
    int n = cb_dense_xfers(cr, sh, l, t);
    for (int i = 0; i < n; i++)
        if (cb_put(cr, &t[i], l, p, e)) return -1;
    /* experts: the MoE module reads the checkpoint's experts of layer l that the rank holds
     * (all of them with world 1; EP: its experts; TP: every expert's I slice) */
    if ((cr->world > 1 ? sm_cuda_moe_upload_shard(sh->m, l, &sh->layers[l].ex, &L->moe, cr->st, e)
                      : sm_cuda_moe_upload(sh->m, l, &L->moe, cr->st, e)))
        return sm_errprefix(e, "cuda backend: rank %d layer %d experts", cr->rank, l);
    L->have_moe = 1;
    cr->weight_bytes += (double)L->moe.blob_bytes;
    cb_progress_add(p, (double)L->moe.blob_bytes); /* device bytes, as cb_room counts them */
    return 0;
}

/* Every weight of shard sh onto cr's device; drains cr->st before returning. */
static int cb_upload(sm_cuda_rank *cr, const sm_shard *sh, sm_err *e) {
    cb_progress p = {0, 0, 0, 0};
    if (cb_room(cr, sh, &p.total, e)) return -1;
    int rc = cb_glob_alloc(cr, e) ? sm_errprefix(e, "cuda backend") : 0;
    if (!rc) {
        cb_xfer t[CB_MAX_XFER];
        int n = cb_dense_xfers(cr, sh, -1, t);
        for (int i = 0; i < n && !rc; i++) rc = cb_put(cr, &t[i], -1, &p, e);
    }
    for (int l = 0; l < cr->cfg.L && !rc; l++) rc = cb_upload_layer(cr, sh, l, &p, e);
    if (p.shown) fputc('\n', stderr);
    /* the host views must stay valid until the copies are done: drain the stream either way */
    cudaError_t r = cudaStreamSynchronize(cr->st);
    if (!rc && r != cudaSuccess)
        rc = sm_errf(e, "cuda backend: weight upload failed on device %d: %s", cr->device, cudaGetErrorString(r));
    return rc;
}

int cb_upload_model(sm_cuda_rank *cr, const sm_model *m, sm_err *e) {
    sm_shard sh;
    if (sm_shard_make(m, cr->world, cr->rank, cr->plan.moe, &sh, e)) return sm_errprefix(e, "cuda backend");
    int rc = cb_upload(cr, &sh, e);
    sm_shard_free(&sh);
    return rc;
}

extern "C" int sm_cuda_backend_create(const sm_model *m, const sm_kv *kv, const sm_backend_opts *o, sm_backend *b,
                                      sm_err *e) {
    memset(b, 0, sizeof *b);
    if (o && o->world > 1) return cb_world_create(m, &m->cfg, 0, 0, kv, o, b, e);
    sm_cuda_rank *cr;
    if (cb_dev_create(&m->cfg, kv, o, 0, o ? o->device : 0, &cr, e)) return -1;
    int rc = cb_upload_model(cr, m, e);
    if (!rc) rc = cb_exec_attach(cr, e);
    /* the KV pool sized from memory: what is left after the weights and workspaces */
    int pages = 0;
    if (!rc && cr->kv_deferred) rc = cb_kv_fit(cr, o->kv_mem_util, 1, &pages, e) || cb_kv_finish(cr, pages, e) ? -1 : 0;
    if (rc) {
        cb_dev_destroy(cr);
        return -1;
    }
    cb_backend_fill(cr, b);
    b->kv_pages = pages;
    return 0;
}
