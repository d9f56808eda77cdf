/* ops_norm.c: the row-wise ops of the CPU reference (ops.h): rms, the embedding and its
 * norms, the post-attention and post-FFN residual boundaries (docs/model.md sections 3, 4).
 *
 * Every norm takes its reciprocal root from one helper, rms_scale (mean of squares by
 * ref_dot, then 1 / sqrt(ms + eps) in f32), and applies it element by element, so a fused op
 * (a boundary, which norms a branch, gates it into the residual and norms the result) gives
 * the same bits as the chain of ref_rms calls it replaces.  These ops run on the calling
 * thread: they stream [n, H] once, against the [m, k] weight reads of the products.
 * We rejected taking scratch rows from the caller for the fused boundaries: the only scratch
 * needed (t of the post-FFN boundary) fits in the row of the output that follows it.
 */
#include "cpu/ops.h"
#include "model/codec.h"
#include <math.h>
#include <string.h>

/* 1 / sqrt(mean(x^2) + eps) of one row x [d], f32 (the rsqrt of every norm). */
static float rms_scale(const float *x, int d, float eps) {
    float ms = ref_dot(x, x, d) / (float)d;
    return 1.0f / sqrtf(ms + eps);
}

void ref_rms(const float *x, int n, int d, const float *w, float eps, int round, float *out) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * d;
        float *oi = out + (int64_t)i * d;
        /* mean of squares, then the reciprocal root */
        float r = rms_scale(xi, d, eps);
        for (int j = 0; j < d; j++) {
            float v = xi[j] * r;
            if (w) v *= w[j];
            oi[j] = round ? sm_r16(v) : v;
        }
    }
}

void ref_embed_rows(const uint16_t *embed, int v0, int nv, int H, const int *tokens, int n, float *s) {
    for (int i = 0; i < n; i++) {
        float *si = s + (int64_t)i * H;
        int t = tokens[i] - v0;
        if (t >= 0 && t < nv)
            for (int x = 0; x < H; x++) si[x] = sm_bf16_to_f32(embed[(int64_t)t * H + x]);
        else
            memset(si, 0, sizeof(float) * (size_t)H);
    }
}

void ref_embed_norm(float *s, int n, int H, const float *in_norm, float eps, float *x) {
    /* s = r16(rms(embed[tok], -, eps)): the weightless embedding norm */
    ref_rms(s, n, H, NULL, eps, 1, s);
    /* x = r16(rms(s, eff(input_layernorm_0), eps)) */
    ref_rms(s, n, H, in_norm, eps, 1, x);
}

void ref_embed(const uint16_t *embed, int V, int H, const int *tokens, int n, const float *in_norm, float eps,
               float *s, float *x) {
    ref_embed_rows(embed, 0, V, H, tokens, n, s);
    ref_embed_norm(s, n, H, in_norm, eps, x);
}

/* s = alpha * s + beta * r16(b * rs) over one row of H (the residual gate of a boundary). */
static void gate_row(float *s, const float *b, float rs, const float *alpha, const float *beta, int H) {
    for (int x = 0; x < H; x++) s[x] = alpha[x] * s[x] + beta[x] * sm_r16(b[x] * rs);
}

void ref_post_attn(float *s, const float *a, const float *alpha, const float *beta, const float *pre_ffn, int n,
                   int H, float post_eps, float eps, float *xf) {
    for (int i = 0; i < n; i++) {
        float *si = s + (int64_t)i * H;
        const float *ai = a + (int64_t)i * H;
        /* s = alpha * s + beta * r16(rms(a, -, post_eps)) */
        gate_row(si, ai, rms_scale(ai, H, post_eps), alpha, beta, H);
        /* xf = r16(rms(s, eff(pre_feedforward_layernorm), eps)) */
        ref_rms(si, 1, H, pre_ffn, eps, 1, xf + (int64_t)i * H);
    }
}

void ref_post_ffn(float *s, const float *f, const float *post_ffn, const float *alpha, const float *beta,
                  const float *norm, int last, int n, int H, float post_eps, float eps, float *x) {
    for (int i = 0; i < n; i++) {
        float *si = s + (int64_t)i * H, *xi = x + (int64_t)i * H;
        const float *fi = f + (int64_t)i * H;
        /* t = r16(f * eff(post_feedforward_layernorm)), held in x's row */
        for (int j = 0; j < H; j++) xi[j] = sm_r16(fi[j] * post_ffn[j]);
        /* s = alpha * s + beta * r16(t * rsqrt(mean(t^2) + post_eps)) */
        gate_row(si, xi, rms_scale(xi, H, post_eps), alpha, beta, H);
        /* x = r16(rms(s, next input norm)), or h = r16(rms(r16(s), final norm)) after the last layer */
        for (int j = 0; j < H; j++) xi[j] = last ? sm_r16(si[j]) : si[j];
        ref_rms(xi, 1, H, norm, eps, 1, xi);
    }
}
