/* repack.cu: the device layout of a layer's experts (geom.cuh) built from raw matrices in
 * checkpoint layout, and the upload of a loaded checkpoint through it (moe.h): one path for a
 * whole layer and for a rank's shard, both read through sm_shard_mat views (the whole layer is
 * the shard of one rank), gate and up rows of the slice stacked into the staging buffer as a
 * [2 ni, Hm] gate_up, down columns copied row by row (a 2D copy) as [Hm, ni].
 *
 * moe_build drives any source (a checkpoint here, the device synthesizer in synth.cu): per
 * expert and matrix the source writes the raw weights and scales into one device staging
 * buffer, then the repack kernels scatter them into the blob: the MXFP4 codes in the bit
 * layout of dequant.cuh, the scale bytes lowered by the layer's offset c (when the largest
 * byte exceeds 128), FP8 row scales per tile.  Everything runs on the caller's stream; the
 * one host wait per MXFP4 matrix reads back its largest scale byte (c is a kernel argument),
 * and the layer is complete when moe_build returns (the stream synchronized).
 * We rejected repacking on the host: it is byte shuffling at PCIe speed, the device does it
 * at memory speed.
 */
#include "cuda/common.cuh"
#include "cuda/moe/build.h"
#include "cuda/moe/geom.cuh"
#include "cuda/moe/dequant.cuh"
#include <stdlib.h>
#include <string.h>

/* ---- repack kernels (raw checkpoint layout in the staging buffer -> blob) ---- */
template <int F>
__global__ void moe_repack_w_kernel(const uint8_t *__restrict__ raw, int R, int K, int gu, int Ip, int npairs, int nsteps,
                                    int sb, uint8_t *__restrict__ dst) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)npairs * nsteps * 128) return;
    const int lane = (int)(u & 31), q = (int)((u >> 5) & 1), X = (int)((u >> 6) & 1);
    const long long ps = u >> 7;
    const int S = (int)(ps % nsteps), P = (int)(ps / nsteps), T = moe_pair_tile(P, X, gu, Ip);
    const int g = lane >> 2, t = lane & 3;
    int rows[2];
    rows[0] = moe_raw_row(T * 16 + g, gu, R, Ip);
    rows[1] = moe_raw_row(T * 16 + g + 8, gu, R, Ip);
    uint32_t wd[4];
    if (F == SM_EXP_MXFP4) {
#pragma unroll
        for (int s4 = 0; s4 < 4; s4++) {
            const int s = q * 4 + s4; /* k16 step inside the 128-k step */
            unsigned c[4][2];
            for (int i = 0; i < 4; i++)
                for (int hf = 0; hf < 2; hf++) {
                    const int row = rows[i & 1];
                    const int k = S * 128 + (2 * (s >> 2) + hf) * 32 + (s & 3) * 8 + t + 4 * (i >> 1);
                    c[i][hf] = (row >= 0 && k < K) ? sm_mx_code(raw + (size_t)row * (K / 2), k) : 0u;
                }
            wd[s4] = moe_mx_pack(c);
        }
    } else if (F == SM_EXP_FP8) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int s = q * 2 + j;
            for (int wi = 0; wi < 2; wi++) { /* word 2j: a0 a1; word 2j+1: a2 a3 */
                uint32_t v = 0;
                for (int ii = 0; ii < 2; ii++) {
                    const int i = wi * 2 + ii, row = rows[i & 1];
                    for (int hf = 0; hf < 2; hf++) {
                        const int k = S * 64 + s * 16 + 2 * t + hf + 8 * (i >> 1);
                        const uint32_t b = (row >= 0 && k < K) ? raw[(size_t)row * K + k] : 0u;
                        v |= b << (8 * (ii * 2 + hf));
                    }
                }
                wd[2 * j + wi] = v;
            }
        }
    } else {
        const uint16_t *r16 = (const uint16_t *)raw;
        for (int i = 0; i < 4; i++) {
            const int row = rows[i & 1];
            const int k = S * 32 + q * 16 + 2 * t + 8 * (i >> 1);
            const uint32_t lo = (row >= 0 && k < K) ? r16[(size_t)row * K + k] : 0u;
            const uint32_t hi = (row >= 0 && k + 1 < K) ? r16[(size_t)row * K + k + 1] : 0u;
            wd[i] = lo | (hi << 16);
        }
    }
    *(uint4 *)(dst + (size_t)P * moe_pstride(nsteps, sb) + (size_t)S * sb + X * 1024 + q * 512 + lane * 16) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* MXFP4 scales: (pair, step, tile, g) -> 8 bytes after the step's weights, word h =
 * [b'(g,2h), b'(g+8,2h), b'(g,2h+1), b'(g+8,2h+1)], b' = b + 126 - c clamped to [1, 254]
 * (multiplier 2^(b-1-c)). */
__global__ void moe_repack_mxs_kernel(const uint8_t *__restrict__ raws, int R, int K, int gu, int Ip, int npairs,
                                      int nsteps, int sb, int c, uint8_t *__restrict__ dst) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)npairs * nsteps * 16) return;
    const int g = (int)(u & 7), X = (int)((u >> 3) & 1);
    const long long ps = u >> 4;
    const int S = (int)(ps % nsteps), P = (int)(ps / nsteps), T = moe_pair_tile(P, X, gu, Ip);
    const int nb = K / 32;
    uint32_t wv[2];
    for (int h = 0; h < 2; h++) {
        uint32_t v = 0;
        for (int j = 0; j < 4; j++) {
            const int row = moe_raw_row(T * 16 + g + 8 * (j & 1), gu, R, Ip);
            const int blk = S * 4 + 2 * h + (j >> 1);
            int bp = 127;
            if (row >= 0 && blk < nb) {
                bp = (int)raws[(size_t)row * nb + blk] + 126 - c;
                bp = bp < 1 ? 1 : bp > 254 ? 254 : bp;
            }
            v |= (uint32_t)bp << (8 * j);
        }
        wv[h] = v;
    }
    *(uint2 *)(dst + (size_t)P * moe_pstride(nsteps, sb) + (size_t)S * sb + 2048 + X * 64 + g * 8) = make_uint2(wv[0], wv[1]);
}

/* FP8 row scales -> float [pair][tile 2][16 rows], 0 on padding rows. */
__global__ void moe_repack_f8s_kernel(const float *__restrict__ raws, int R, int gu, int Ip, int npairs, float *__restrict__ dst) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= npairs * 32) return;
    const int r = u & 15, X = (u >> 4) & 1, P = u >> 5;
    const int row = moe_raw_row(moe_pair_tile(P, X, gu, Ip) * 16 + r, gu, R, Ip);
    dst[u] = row >= 0 ? raws[row] : 0.0f;
}

/* Largest and smallest scale byte and whether a NaN byte (0xFF) is present: flags[0] max,
 * flags[1] NaN, flags[2] 255 - min (flags zeroed first). */
__global__ void moe_scan_scales_kernel(const uint8_t *__restrict__ s, long long n, int *flags) {
    int mx = 0, nan = 0, mn = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int b = s[i];
        if (b == 0xFF) nan = 1; else { mx = max(mx, b); mn = max(mn, 255 - b); }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
        mn = max(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, o));
        nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&flags[0], mx);
        atomicMax(&flags[2], mn);
        if (nan) atomicOr(&flags[1], 1);
    }
}

/* Every code chunk of the n experts at blob (expert bytes apart; gate_up at 0, down at o_w2;
 * n1, n2 chunks of 16 bytes in their matrices, 128 a pair-step block of sb bytes) moved between
 * the two MXFP4 placements (dequant.cuh moe_x8_chunk: to_x8 1 bf16 -> e4m3, 0 back), in place. */
__global__ void moe_x8_relayout_kernel(uint8_t *__restrict__ blob, size_t expert, size_t o_w2, long long n1, long long n2, int sb,
                                       int n, int to_x8) {
    const long long per = n1 + n2, total = per * n;
    for (long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (long long)gridDim.x * blockDim.x) {
        const long long x = u / per, c0 = u - x * per;
        const int m2 = c0 >= n1;
        const long long c = m2 ? c0 - n1 : c0;
        uint4 *p = (uint4 *)(blob + (size_t)x * expert + (m2 ? o_w2 : 0) + (size_t)(c >> 7) * sb + (size_t)(c & 127) * 16);
        *p = moe_x8_chunk(*p, to_x8);
    }
}

/* ---- host side ---- */
static const char *moe_mat_name(int mat) { return mat ? "down_proj" : "gate_up_proj"; }

typedef struct moe_staging {
    uint8_t *buf;             /* device: raw weights at 0, raw scales at sofs */
    size_t sofs, bytes;       /* scale offset, bytes of buf */
    int *flags;               /* device [3]: largest scale byte, NaN byte seen, 255 - smallest */
    int *flags_h;             /* pinned host [3]: their copy */
} moe_staging;

static void moe_staging_free(moe_staging *sb) {
    cudaFree(sb->buf);
    cudaFree(sb->flags);
    cudaFreeHost(sb->flags_h);
    sb->buf = NULL; sb->flags = NULL; sb->flags_h = NULL;
}

static int moe_staging_alloc(const sm_cuda_moe_layer *L, moe_staging *sb, sm_err *e) {
    size_t w0, s0, w1, s1;
    sm_expert_mat_bytes((sm_expert_fmt)L->fmt, 2 * L->I, L->Hm, &w0, &s0); /* checkpoint layout */
    sm_expert_mat_bytes((sm_expert_fmt)L->fmt, L->Hm, L->I, &w1, &s1);
    const size_t wmax = w0 > w1 ? w0 : w1, smax = s0 > s1 ? s0 : s1;
    sb->sofs = moe_rupz(wmax, 256);
    sb->bytes = sb->sofs + moe_rupz(smax, 256) + 256;
    sb->buf = NULL; sb->flags = NULL; sb->flags_h = NULL;
    cudaError_t rc = cudaMalloc((void **)&sb->buf, sb->bytes);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&sb->flags, 3 * sizeof(int));
    if (rc == cudaSuccess) rc = cudaMallocHost((void **)&sb->flags_h, 3 * sizeof(int));
    if (rc != cudaSuccess) {
        moe_staging_free(sb);
        return sm_errf(e, "cuda moe: allocation of the %zu-byte upload staging buffer failed: %s", sb->bytes, cudaGetErrorString(rc));
    }
    return 0;
}

/* Repack one matrix (mat 0: gate_up [2I, Hm], 1: down [Hm, I]) from the staging buffer into
 * the blob of expert x and fill its part of the descriptor hd; -1 with e filled on a CUDA
 * error, or -1 with *nan set when a 0xFF scale byte was found (e left to the caller). */
static int moe_repack(sm_cuda_moe_layer *L, int x, int mat, const moe_staging *sg, moe_desc *hd, int *nan, cudaStream_t st,
                      sm_err *e) {
    const int fmt = L->fmt;
    const moe_geom G = moe_geometry(fmt, L->Hm, L->I);
    const int R = mat ? L->Hm : 2 * L->I, K = mat ? L->I : L->Hm, gu = !mat;
    const int npairs = mat ? G.p2 : G.p1, nsteps = mat ? G.ns2 : G.ns1;
    const uint8_t *sw = sg->buf, *ss = sg->buf + sg->sofs;
    uint8_t *base = (uint8_t *)L->blob + G.expert * (size_t)x;
    const size_t ow = mat ? G.o_w2 : 0, os = mat ? G.o_s2 : G.o_s1;
    hd->w[mat] = G.expert * (size_t)x + ow;
    hd->s[mat] = G.expert * (size_t)x + os;
    hd->mul[mat] = 1.0f;
    *nan = 0;
    int c = 0;
    if (fmt == SM_EXP_MXFP4) {
        /* the scale offset c is a kernel argument: one wait on st for the largest byte */
        SM_CUDA_CHECK(cudaMemsetAsync(sg->flags, 0, 3 * sizeof(int), st));
        const long long n = (long long)R * (K / 32);
        moe_scan_scales_kernel<<<256, 256, 0, st>>>(ss, n, sg->flags);
        SM_LAUNCH_CHECK("moe_scan_scales_kernel");
        SM_CUDA_CHECK(cudaMemcpyAsync(sg->flags_h, sg->flags, 3 * sizeof(int), cudaMemcpyDeviceToHost, st));
        SM_CUDA_CHECK(cudaStreamSynchronize(st));
        if (sg->flags_h[1]) { *nan = 1; return -1; }
        c = sg->flags_h[0] > 128 ? sg->flags_h[0] - 128 : 0;
        /* the FP8 tensor cores' row factor is exact for stored bytes (b + 126 - c) >= 115 */
        if (n > 0 && 255 - sg->flags_h[2] + 126 - c < 115) L->x8_ok = 0;
        hd->mul[mat] = ldexpf(1.0f, c);
        const long long ns = (long long)npairs * nsteps * 16;
        moe_repack_mxs_kernel<<<(unsigned)((ns + 255) / 256), 256, 0, st>>>(ss, R, K, gu, G.Ip, npairs, nsteps, G.sb, c, base + ow);
        SM_LAUNCH_CHECK("moe_repack_mxs_kernel");
    } else if (fmt == SM_EXP_FP8) {
        moe_repack_f8s_kernel<<<(npairs * 32 + 255) / 256, 256, 0, st>>>((const float *)ss, R, gu, G.Ip, npairs, (float *)(base + os));
        SM_LAUNCH_CHECK("moe_repack_f8s_kernel");
    }
    const long long nt = (long long)npairs * nsteps * 128;
    const unsigned blocks = (unsigned)((nt + 255) / 256);
    if (fmt == SM_EXP_MXFP4) moe_repack_w_kernel<SM_EXP_MXFP4><<<blocks, 256, 0, st>>>(sw, R, K, gu, G.Ip, npairs, nsteps, G.sb, base + ow);
    else if (fmt == SM_EXP_FP8) moe_repack_w_kernel<SM_EXP_FP8><<<blocks, 256, 0, st>>>(sw, R, K, gu, G.Ip, npairs, nsteps, G.sb, base + ow);
    else moe_repack_w_kernel<SM_EXP_BF16><<<blocks, 256, 0, st>>>(sw, R, K, gu, G.Ip, npairs, nsteps, G.sb, base + ow);
    SM_LAUNCH_CHECK("moe_repack_w_kernel");
    return 0;
}

/* Every matrix of every expert, the descriptors and the post norm; st synchronized at the
 * end (hd and the staging buffer are free to go). */
static int moe_build_fill(const sm_config *c, const moe_source *src, sm_cuda_moe_layer *L, const moe_staging *sg, moe_desc *hd,
                          cudaStream_t st, sm_err *e) {
    for (int x = 0; x < c->E; x++) {
        for (int mat = 0; mat < 2; mat++) {
            if (src->matrix(src, x, mat, sg->buf, sg->buf + sg->sofs, st, e)) return -1;
            int nan = 0;
            if (moe_repack(L, x, mat, sg, hd + x, &nan, st, e)) {
                if (nan)
                    return sm_errf(e, "%s: layer %d expert %d %s.weight_scale holds the e8m0 NaN byte 0xFF", src->who, src->l,
                                   src->x0 + x, moe_mat_name(mat));
                return -1;
            }
        }
    }
    /* hd is pageable: the copy returns once the runtime has staged it */
    SM_CUDA_CHECK(cudaMemcpyAsync(L->desc, hd, sizeof(moe_desc) * (size_t)c->E, cudaMemcpyHostToDevice, st));
    if (src->post_norm(src, L->post_norm, st, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(st));
    return 0;
}

int moe_build(const sm_config *c, int fmt, const moe_source *src, sm_cuda_moe_layer *L, cudaStream_t st, sm_err *e) {
    if (moe_layer_alloc(c, fmt, src->shard, L, e)) return sm_errprefix(e, "%s: layer %d", src->who, src->l);
    L->x8_ok = fmt == SM_EXP_MXFP4; /* cleared by moe_repack on a matrix whose scales forbid it */
    moe_staging sg;
    if (moe_staging_alloc(L, &sg, e)) { sm_cuda_moe_free(L); return -1; }
    moe_desc *hd = (moe_desc *)calloc((size_t)c->E, sizeof(moe_desc));
    int rc = hd ? moe_build_fill(c, src, L, &sg, hd, st, e) : sm_errf(e, "%s: out of host memory", src->who);
    if (rc) cudaStreamSynchronize(st); /* work already queued may still read the staging buffer */
    free(hd);
    moe_staging_free(&sg);
    if (rc) sm_cuda_moe_free(L);
    return rc;
}

/* ---- upload of a loaded checkpoint (a whole layer, or a rank's shard of it) ---- */
typedef struct moe_ckpt {
    const sm_model *m;            /* the loaded model: post_expert_norm, the config */
    const sm_shard_experts *X;    /* the views of the experts (or slices) to upload */
} moe_ckpt;

/* Copy `rows` rows of `cols` values of view v (format fmt) to dw (weights) and ds (scales)
 * packed, on st: one copy when the view's rows are contiguous, else a 2D copy. */
static int moe_copy_view(sm_expert_fmt fmt, const sm_shard_mat *v, int rows, int cols, uint8_t *dw, uint8_t *ds, cudaStream_t st,
                         sm_err *e) {
    size_t wb, sb, wp, sp; /* bytes of a row's weights / scales: packed, and in the view */
    sm_expert_mat_bytes(fmt, 1, cols, &wb, &sb);
    sm_expert_mat_bytes(fmt, 1, v->ld, &wp, &sp);
    /* the mapped checkpoint is pageable: each copy returns once the runtime has staged it */
    if (wp == wb) SM_CUDA_CHECK(cudaMemcpyAsync(dw, v->w, wb * (size_t)rows, cudaMemcpyHostToDevice, st));
    else SM_CUDA_CHECK(cudaMemcpy2DAsync(dw, wb, v->w, wp, wb, (size_t)rows, cudaMemcpyHostToDevice, st));
    if (!sb) return 0;
    if (sp == sb) SM_CUDA_CHECK(cudaMemcpyAsync(ds, v->s, sb * (size_t)rows, cudaMemcpyHostToDevice, st));
    else SM_CUDA_CHECK(cudaMemcpy2DAsync(ds, sb, v->s, sp, sb, (size_t)rows, cudaMemcpyHostToDevice, st));
    return 0;
}

static int moe_ckpt_matrix(const moe_source *src, int x, int mat, uint8_t *dw, uint8_t *ds, cudaStream_t st, sm_err *e) {
    const moe_ckpt *ck = (const moe_ckpt *)src->ctx;
    const sm_shard_experts *X = ck->X;
    const int Hm = ck->m->cfg.Hm, ni = X->ni;
    size_t wb, sb;
    sm_expert_mat_bytes(X->fmt, 1, mat ? ni : Hm, &wb, &sb);
    const sm_shard_mat *vs[2] = {mat ? &X->down[x] : &X->gate[x], mat ? NULL : &X->up[x]};
    for (int h = 0; h < 2 && vs[h]; h++)
        if (!vs[h]->w || (sb && !vs[h]->s))
            return sm_errf(e, "%s: layer %d expert %d %s: missing %s", src->who, src->l, src->x0 + x, moe_mat_name(mat),
                           !vs[h]->w ? "weights" : "scales");
    if (mat) return moe_copy_view(X->fmt, vs[0], Hm, ni, dw, ds, st, e); /* down [Hm, ni] */
    /* gate_up [2 ni, Hm]: the slice's gate rows, then its up rows */
    if (moe_copy_view(X->fmt, vs[0], ni, Hm, dw, ds, st, e)) return -1;
    return moe_copy_view(X->fmt, vs[1], ni, Hm, dw + wb * (size_t)ni, ds + sb * (size_t)ni, st, e);
}

static int moe_ckpt_post_norm(const moe_source *src, float *dst, cudaStream_t st, sm_err *e) {
    const sm_model *m = ((const moe_ckpt *)src->ctx)->m;
    SM_CUDA_CHECK(cudaMemcpyAsync(dst, m->layers[src->l].post_expert_norm, sizeof(float) * (size_t)m->cfg.Hm, cudaMemcpyHostToDevice, st));
    return 0;
}

/* Checks of layer l of m shared by both uploads; 0 or -1 with e. */
static int moe_ckpt_check(const char *who, const sm_model *m, int l, sm_err *e) {
    if (l < 0 || l >= m->cfg.L) return sm_errf(e, "%s: layer %d outside [0, %d)", who, l, m->cfg.L);
    const sm_layer *ly = &m->layers[l];
    if (!ly->post_expert_norm) return sm_errf(e, "%s: layer %d has no post_expert_norm", who, l);
    if (!ly->ex.gu || !ly->ex.dn) return sm_errf(e, "%s: layer %d has no experts", who, l);
    return 0;
}

/* Upload X's experts of layer l of m (shard: X is a rank's shard, not the whole layer). */
static int moe_upload_views(const char *who, const sm_model *m, int l, const sm_shard_experts *X, int shard, sm_cuda_moe_layer *L,
                            cudaStream_t st, sm_err *e) {
    const moe_ckpt ck = {m, X};
    const moe_source src = {who, l, &ck, moe_ckpt_matrix, moe_ckpt_post_norm, shard, X->e0};
    const sm_config c = moe_shard_config(&m->cfg, X);
    if (X->act_mx && (X->fmt != SM_EXP_MXFP4 || X->ni % SM_MX_BLOCK))
        return sm_errf(e, "%s: layer %d: W4A4 needs MXFP4 experts whose I slice (%d) holds whole 32-blocks", who, l, X->ni);
    if (moe_build(&c, (int)X->fmt, &src, L, st, e)) return -1;
    if (sm_cuda_moe_set_acts(L, X->act_mx, SM_MOE_W4A4_FP8, st, e)) {
        sm_cuda_moe_free(L);
        return sm_errprefix(e, "%s: layer %d", who, l);
    }
    return 0;
}

extern "C" int sm_cuda_moe_set_acts(sm_cuda_moe_layer *L, int act_mx, int fp8, cudaStream_t st, sm_err *e) {
    if (!L || !L->blob) return sm_errf(e, "cuda moe set acts: layer not allocated");
    if (act_mx && (L->fmt != SM_EXP_MXFP4 || L->I % SM_MX_BLOCK))
        return sm_errf(e, "cuda moe set acts: W4A4 needs MXFP4 experts whose I (%d) holds whole 32-blocks", L->I);
    const int x8 = act_mx && fp8 && L->x8_ok;
    if (x8 != L->x8) { /* the codes to the other placement */
        const moe_geom G = moe_geometry(L->fmt, L->Hm, L->I);
        const long long n1 = (long long)G.p1 * G.ns1 * 128, n2 = (long long)G.p2 * G.ns2 * 128;
        moe_x8_relayout_kernel<<<1024, 256, 0, st>>>((uint8_t *)L->blob, G.expert, G.o_w2, n1, n2, G.sb, L->E, x8);
        SM_LAUNCH_CHECK("moe_x8_relayout_kernel");
        SM_CUDA_CHECK(cudaStreamSynchronize(st));
    }
    L->act_mx = act_mx;
    L->x8 = x8;
    return 0;
}

extern "C" int sm_cuda_moe_upload(const sm_model *m, int l, sm_cuda_moe_layer *L, cudaStream_t st, sm_err *e) {
    const char *who = "cuda moe upload";
    if (!m || !L) return sm_errf(e, "%s: NULL model or layer", who);
    memset(L, 0, sizeof *L);
    if (moe_ckpt_check(who, m, l, e)) return -1;
    /* the whole layer as the shard of one rank: gate rows 0.., up rows I.. of gate_up, all
     * columns of down (a NULL matrix stays NULL: moe_ckpt_matrix names it) */
    const sm_config *c = &m->cfg;
    const sm_experts *x = &m->layers[l].ex;
    size_t wu, su; /* bytes of the first I rows of gate_up: where the up rows start */
    sm_expert_mat_bytes(x->fmt, c->I, c->Hm, &wu, &su);
    sm_shard_mat *v = (sm_shard_mat *)calloc(3 * (size_t)c->E, sizeof *v);
    if (!v) return sm_errf(e, "%s: out of host memory", who);
    for (int j = 0; j < c->E; j++) {
        const uint8_t *gw = (const uint8_t *)x->gu[j], *gs = (const uint8_t *)(x->gus ? x->gus[j] : NULL);
        v[j] = (sm_shard_mat){gw, gs, c->Hm};
        v[c->E + j] = (sm_shard_mat){gw ? gw + wu : NULL, gs ? gs + su : NULL, c->Hm};
        v[2 * c->E + j] = (sm_shard_mat){x->dn[j], x->dns ? x->dns[j] : NULL, c->I};
    }
    const sm_shard_experts X = {x->fmt, 0, c->E, 0, c->I, v, v + c->E, v + 2 * c->E, x->act_mx};
    const int rc = moe_upload_views(who, m, l, &X, 0, L, st, e);
    free(v);
    return rc;
}

extern "C" int sm_cuda_moe_upload_shard(const sm_model *m, int l, const sm_shard_experts *X, sm_cuda_moe_layer *L, cudaStream_t st,
                                        sm_err *e) {
    const char *who = "cuda moe upload (shard)";
    if (!m || !X || !L) return sm_errf(e, "%s: NULL model, shard or layer", who);
    memset(L, 0, sizeof *L);
    if (moe_ckpt_check(who, m, l, e)) return -1;
    const sm_config *c = &m->cfg;
    if (X->fmt != m->layers[l].ex.fmt)
        return sm_errf(e, "%s: layer %d: shard format %d differs from the layer's %d", who, l, (int)X->fmt, (int)m->layers[l].ex.fmt);
    if (X->ne < 1 || X->e0 < 0 || X->e0 + X->ne > c->E || X->ni < 1 || X->i0 < 0 || X->i0 + X->ni > c->I || !X->gate || !X->up ||
        !X->down)
        return sm_errf(e, "%s: layer %d: shard experts [%d, +%d) of %d, I slice [%d, +%d) of %d, or NULL views", who, l, X->e0, X->ne,
                       c->E, X->i0, X->ni, c->I);
    return moe_upload_views(who, m, l, X, 1, L, st, e);
}
