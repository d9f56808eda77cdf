/* check_dense.cu: the bit-exact check of a CUDA backend's dense weights against the rank's
 * shard of a loaded model (bench.h: sm_cuda_backend_check_dense), for the tests.
 *
 * It walks the same tensor table as the upload (upload.cu: cb_dense_xfers), downloads each
 * device tensor on the context's stream and compares it row by row with the shard's view
 * (strided views included), so an upload bug and a check bug cannot cancel out through two
 * different tensor lists.  We rejected comparing checksums: the first differing byte and
 * tensor name is what a failing test must print.
 */
#include "cuda/rank/rank.h"
#include "bench.h"
#include <stdlib.h>
#include <string.h>

/* Download t's device tensor; 0 when it equals the host view byte for byte. */
static int cb_cmp(sm_cuda_rank *cr, const cb_xfer *t, int l, sm_err *e) {
    if (!t->host) return sm_errf(e, "dense check: layer %d: %s%s missing in the model", l, t->what, t->k ? " (beta)" : "");
    size_t bytes = t->rows * t->row_bytes;
    unsigned char *h = (unsigned char *)malloc(bytes);
    if (!h) return sm_errf(e, "dense check: out of host memory");
    cudaError_t r = cudaMemcpyAsync(h, t->dev, bytes, cudaMemcpyDeviceToHost, cr->st);
    if (r == cudaSuccess) r = cudaStreamSynchronize(cr->st);
    if (r != cudaSuccess) {
        free(h);
        return sm_errf(e, "dense check: download of %s%s failed on device %d: %s", t->what, t->k ? " (beta)" : "", cr->device,
                       cudaGetErrorString(r));
    }
    size_t at = bytes;
    for (size_t i = 0; i < t->rows && at == bytes; i++) {
        const unsigned char *d = h + i * t->row_bytes, *g = (const unsigned char *)t->host + i * t->pitch;
        for (size_t j = 0; j < t->row_bytes; j++)
            if (d[j] != g[j]) { at = i * t->row_bytes + j; break; }
    }
    free(h);
    if (at < bytes)
        return sm_errf(e, "dense check: layer %d: %s%s differs from the model at byte %zu of %zu", l, t->what,
                       t->k ? " (beta)" : "", at, bytes);
    return 0;
}

extern "C" int sm_cuda_backend_check_dense(const sm_backend *b, const sm_model *m, sm_err *e) {
    sm_cuda_rank *cr = cb_from_backend(b, "dense check", e);
    if (!cr) return -1;
    const sm_config *cf = &cr->cfg;
    if (cf->L != m->cfg.L || cf->H != m->cfg.H || cf->V != m->cfg.V || cf->Hm != m->cfg.Hm || cf->E != m->cfg.E)
        return sm_errf(e, "dense check: the backend and the model have different configurations");
    sm_shard sh;
    if (sm_shard_make(m, cr->world, cr->rank, cr->plan.moe, &sh, e)) return sm_errprefix(e, "dense check");
    int rc = 0;
    for (int l = -1; l < cf->L && !rc; l++) {
        cb_xfer t[CB_MAX_XFER];
        int n = cb_dense_xfers(cr, &sh, l, t);
        for (int i = 0; i < n && !rc; i++) rc = cb_cmp(cr, &t[i], l, e);
    }
    sm_shard_free(&sh);
    return rc;
}
