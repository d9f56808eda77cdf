/* ops/norm.cu: the stock kernels of the norm family (embedding + first norm, residual
 * boundaries, plain row norms; docs/model.md section 4) and their checked extern "C" entries.
 *
 * Each kernel is one block of sm_norm_threads(H) threads per row calling the row body of
 * ops/norm.cuh with row = blockIdx.x; the entries check shapes and pointers and launch on the
 * caller's stream.  We rejected a generic "rows" launcher shared by the four: the parameter
 * lists differ and each entry is a few lines.
 */
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/norm.cuh"

/* ---- stock kernels: one block of sm_norm_threads(H) threads per row ---- */

__global__ void embed_kernel(const uint16_t *__restrict__ embed, int V, int H, const int *__restrict__ tokens,
                             const float *__restrict__ w, float eps, float *__restrict__ s, uint16_t *__restrict__ x) {
    __shared__ float red[32];
    sm_norm_embed_row(embed, V, H, tokens, w, eps, s, x, blockIdx.x, red, sm_team_block());
}

__global__ void post_attn_kernel(float *__restrict__ s, const uint16_t *__restrict__ a, const float *__restrict__ alpha,
                                 const float *__restrict__ beta, const float *__restrict__ wn, int H, float post_eps,
                                 float eps, uint16_t *__restrict__ xf) {
    __shared__ float red[32];
    sm_norm_post_attn_row<1>(s, a, alpha, beta, wn, H, post_eps, eps, xf, blockIdx.x, red, sm_team_block());
}

__global__ void post_ffn_kernel(float *__restrict__ s, const uint16_t *__restrict__ f, const float *__restrict__ pf,
                                const float *__restrict__ alpha, const float *__restrict__ beta,
                                const float *__restrict__ wn, int last, int H, float post_eps, float eps,
                                uint16_t *__restrict__ x) {
    __shared__ float red[32];
    sm_norm_post_ffn_row<1>(s, f, pf, alpha, beta, wn, last, H, post_eps, eps, x, blockIdx.x, red, sm_team_block());
}

__global__ void rms_bf16_kernel(const uint16_t *x, int d, const float *__restrict__ w, float eps, uint16_t *y, int mx,
                                const sm_x8_img img) {
    __shared__ float red[32];
    sm_norm_rms_bf16_row<1>(x, d, w, eps, y, blockIdx.x, red, sm_team_block(), mx, img);
}

/* ---- launchers and checked entries ---- */

static int rows_check(const char *who, int n, int H, sm_err *e) {
    if (n < 0 || H <= 0) return sm_errf(e, "%s: bad shape n=%d H=%d", who, n, H);
    if (n > 2147483647 / 2) return sm_errf(e, "%s: n=%d rows too many", who, n);
    return 0;
}
/* The bodies read rows of a width that is a multiple of 8 in 16-byte pieces (norm.cuh). */
static int aligned_check(const char *who, int H, const void *const *p, int np, sm_err *e) {
    if (H % 8) return 0;
    for (int i = 0; i < np; i++)
        if (p[i] && !sm_aligned(p[i], 16)) return sm_errf(e, "%s: pointer argument %d is not 16-byte aligned", who, i + 1);
    return 0;
}

int sm_k_embed(const uint16_t *embed, int V, int H, const int *tokens, int n, const float *in_norm, float eps,
               float *s, uint16_t *x, cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_embed", n, H, e)) return -1;
    if (V <= 0) return sm_errf(e, "sm_k_embed: bad vocabulary size V=%d", V);
    if (!embed || !tokens || !in_norm || !s || !x) return sm_errf(e, "sm_k_embed: NULL pointer argument");
    const void *pp[] = {embed, in_norm, s, x};
    if (aligned_check("sm_k_embed", H, pp, 4, e)) return -1;
    if (n == 0) return 0;
    embed_kernel<<<n, sm_norm_threads(H), 0, st>>>(embed, V, H, tokens, in_norm, eps, s, x);
    SM_LAUNCH_CHECK("embed_kernel");
    return 0;
}

int sm_k_post_attn(float *s, const uint16_t *a, const float *alpha, const float *beta, const float *pre_ffn,
                   int n, int H, float post_eps, float eps, uint16_t *xf, cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_post_attn", n, H, e)) return -1;
    if (!s || !a || !alpha || !beta || !pre_ffn || !xf) return sm_errf(e, "sm_k_post_attn: NULL pointer argument");
    const void *pp[] = {s, a, alpha, beta, pre_ffn, xf};
    if (aligned_check("sm_k_post_attn", H, pp, 6, e)) return -1;
    if (n == 0) return 0;
    post_attn_kernel<<<n, sm_norm_threads(H), 0, st>>>(s, a, alpha, beta, pre_ffn, H, post_eps, eps, xf);
    SM_LAUNCH_CHECK("post_attn_kernel");
    return 0;
}

int sm_k_post_ffn(float *s, const uint16_t *f, const float *post_ffn, const float *alpha, const float *beta,
                  const float *norm, int last, int n, int H, float post_eps, float eps, uint16_t *x,
                  cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_post_ffn", n, H, e)) return -1;
    if (!s || !f || !post_ffn || !alpha || !beta || !norm || !x) return sm_errf(e, "sm_k_post_ffn: NULL pointer argument");
    const void *pp[] = {s, f, post_ffn, alpha, beta, norm, x};
    if (aligned_check("sm_k_post_ffn", H, pp, 7, e)) return -1;
    if (n == 0) return 0;
    post_ffn_kernel<<<n, sm_norm_threads(H), 0, st>>>(s, f, post_ffn, alpha, beta, norm, last != 0, H, post_eps, eps, x);
    SM_LAUNCH_CHECK("post_ffn_kernel");
    return 0;
}

int sm_k_rms_bf16(const uint16_t *x, int n, int d, const float *w, float eps, uint16_t *y, int mx, uint8_t *img_codes,
                  float *img_fac, int img_kp, cudaStream_t st, sm_err *e) {
    if (rows_check("sm_k_rms_bf16", n, d, e)) return -1;
    if (!x || !y) return sm_errf(e, "sm_k_rms_bf16: NULL x or y");
    if (mx && d % SM_MX_BLOCK) return sm_errf(e, "sm_k_rms_bf16: MXFP4 rows of %d values (not whole 32-blocks)", d);
    const sm_x8_img im = img_codes ? sm_x8_img{img_codes, img_fac, img_kp} : sm_x8_img{NULL, NULL, 0};
    if (im.codes && (!mx || !im.fac || im.kp < d || im.kp % SM_MX_BLOCK))
        return sm_errf(e, "sm_k_rms_bf16: an e4m3 image needs mx, factors and kp >= d (%d) in whole 32-blocks (kp %d)", d, im.kp);
    const void *pp[] = {x, w, y};
    if (aligned_check("sm_k_rms_bf16", d, pp, 3, e)) return -1;
    if (n == 0) return 0;
    rms_bf16_kernel<<<n, sm_norm_threads(d), 0, st>>>(x, d, w, eps, y, mx, im);
    SM_LAUNCH_CHECK("rms_bf16_kernel");
    return 0;
}
