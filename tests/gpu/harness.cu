/* harness.cu: the GPU tests' one harness (harness.h says what it promises).  Arenas are a
 * fixed table of at most GH_MAX_BUFS buffers a case, so a failing case never leaks into the
 * next; counts are plain globals reset per group (the groups run one after another).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime.h>
#include "model/rng.h"
#include "model/codec.h"
#include "harness.h"

#define GH_MAX_BUFS 256

int gh_pass, gh_fail, gh_skip, gh_case_fail;
uint64_t gh_rng = 1;

typedef struct gh_dbuf {
    unsigned char *base; /* cudaMalloc'd: [GH_GUARD + n + GH_GUARD] elements */
    size_t esz;          /* bytes an element */
    size_t n;            /* interior elements */
    const char *name;    /* for messages */
} gh_dbuf;

static gh_dbuf g_dbufs[GH_MAX_BUFS];
static int g_ndbuf;
static void *g_hbufs[GH_MAX_BUFS];
static int g_nhbuf;

/* ---- results ---- */

static void vline(const char *tag, const char *fmt, va_list ap) {
    printf("%s ", tag);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

int gh_result(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(ok ? "PASS" : "FAIL", fmt, ap);
    va_end(ap);
    if (ok) gh_pass++;
    else gh_fail++;
    return ok;
}

void gh_skip_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline("SKIP", fmt, ap);
    va_end(ap);
    gh_skip++;
}

void gh_reset(void) { gh_pass = gh_fail = gh_skip = 0; }

/* ---- generator ---- */

void gh_seed(const char *who) {
    const char *s = getenv("SM_TEST_SEED");
    uint64_t seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)clock();
    gh_rng = seed ? seed : 1;
    printf("%s: seed %llu (SM_TEST_SEED=%llu repeats it)\n", who, (unsigned long long)gh_rng, (unsigned long long)gh_rng);
    fflush(stdout);
}
uint64_t gh_rnd64(void) { return sm_rng_next(&gh_rng); }
float gh_rndu(void) { return (float)((double)(gh_rnd64() >> 40) * (1.0 / 8388608.0) - 1.0); }
float gh_rnds(float sd) { return gh_rndu() * sd * 1.7320508f; }
int gh_rndi(int n) { return (int)((gh_rnd64() >> 33) % (uint64_t)n); }
void gh_fill_bf16(uint16_t *h, size_t n, float sd) { for (size_t i = 0; i < n; i++) h[i] = sm_f32_to_bf16(gh_rnds(sd)); }
void gh_fill_f32(float *h, size_t n, float sd) { for (size_t i = 0; i < n; i++) h[i] = gh_rnds(sd); }
void gh_fill_eff(float *h, size_t n) { for (size_t i = 0; i < n; i++) h[i] = sm_r16(1.0f + gh_rnds(0.1f)); }
void gh_bf16_to_f32(const uint16_t *h, float *f, size_t n) { for (size_t i = 0; i < n; i++) f[i] = sm_bf16_to_f32(h[i]); }

/* ---- arenas ---- */

void *gh_halloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { printf("  host allocation of %zu bytes failed\n", bytes); exit(1); }
    if (g_nhbuf < GH_MAX_BUFS) g_hbufs[g_nhbuf++] = p;
    else { printf("  too many host buffers in one case\n"); exit(1); }
    return p;
}

void *gh_dalloc(const char *name, size_t esz, size_t n) {
    if (g_ndbuf >= GH_MAX_BUFS) { printf("  too many device buffers in one case\n"); exit(1); }
    gh_dbuf *b = &g_dbufs[g_ndbuf];
    const size_t bytes = (n + 2 * GH_GUARD) * esz;
    if (cudaMalloc((void **)&b->base, bytes) != cudaSuccess) {
        printf("  cudaMalloc of %zu bytes for %s failed\n", bytes, name);
        exit(1);
    }
    b->esz = esz;
    b->n = n;
    b->name = name;
    cudaMemset(b->base, GH_GUARD_BYTE, bytes);
    cudaMemset(b->base + GH_GUARD * esz, 0xFF, n * esz);
    g_ndbuf++;
    return b->base + GH_GUARD * esz;
}

void *gh_dup_to_dev(const char *name, const void *h, size_t esz, size_t n) {
    void *d = gh_dalloc(name, esz, n);
    cudaMemcpy(d, h, esz * n, cudaMemcpyHostToDevice);
    return d;
}

void gh_to_host(void *h, const void *d, size_t bytes) { cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost); }

/* The arena entry whose interior starts at d (NULL: not an arena buffer). */
static gh_dbuf *find(const void *d) {
    for (int i = 0; i < g_ndbuf; i++)
        if (g_dbufs[i].base + GH_GUARD * g_dbufs[i].esz == (const unsigned char *)d) return &g_dbufs[i];
    return NULL;
}

void gh_poison(void *d) {
    gh_dbuf *b = find(d);
    if (!b) { printf("  gh_poison: not an arena buffer\n"); exit(1); }
    cudaMemset(d, 0xFF, b->n * b->esz);
}

size_t gh_unwritten(const void *d, size_t n) {
    gh_dbuf *b = find(d);
    if (!b) { printf("  gh_unwritten: not an arena buffer\n"); exit(1); }
    if (n > b->n) n = b->n;
    unsigned char *h = (unsigned char *)malloc(n * b->esz + 1);
    if (!h) { printf("  host allocation failed\n"); exit(1); }
    cudaMemcpy(h, d, n * b->esz, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < b->esz && h[i * b->esz + j] == 0xFF) j++;
        bad += j == b->esz;
    }
    free(h);
    return bad;
}

int gh_guards_ok(void) {
    int ok = 1;
    for (int i = 0; i < g_ndbuf; i++) {
        gh_dbuf *b = &g_dbufs[i];
        const size_t gb = GH_GUARD * b->esz;
        unsigned char *h = (unsigned char *)malloc(2 * gb);
        if (!h) { printf("  host allocation failed\n"); exit(1); }
        cudaMemcpy(h, b->base, gb, cudaMemcpyDeviceToHost);
        cudaMemcpy(h + gb, b->base + gb + b->n * b->esz, gb, cudaMemcpyDeviceToHost);
        for (size_t j = 0; j < 2 * gb; j++)
            if (h[j] != GH_GUARD_BYTE) {
                printf("  guard of %s overwritten (%s side, byte %zu)\n", b->name, j < gb ? "low" : "high", j % gb);
                ok = 0;
                break;
            }
        free(h);
    }
    return ok;
}

void gh_case_end(void) {
    for (int i = 0; i < g_ndbuf; i++) cudaFree(g_dbufs[i].base);
    for (int i = 0; i < g_nhbuf; i++) free(g_hbufs[i]);
    g_ndbuf = g_nhbuf = 0;
}

int gh_sync(cudaStream_t st) {
    cudaError_t r = cudaStreamSynchronize(st);
    if (r == cudaSuccess) r = cudaGetLastError();
    if (r != cudaSuccess) { printf("  CUDA error: %s\n", cudaGetErrorString(r)); return 0; }
    /* every guard of the case's arena, right after the kernel that may have overrun it */
    return gh_guards_ok();
}

/* ---- comparison ---- */

void gh_acc_add(gh_acc *a, const float *out, const float *ref, size_t n) {
    /* rms of the finite reference: the scale of the per-element bound */
    double ss = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i])) { ss += (double)ref[i] * ref[i]; nf++; }
    const double rms = nf ? sqrt(ss / (double)nf) : 0.0;
    for (size_t i = 0; i < n; i++) {
        if (out[i] != out[i]) { a->nan++; continue; }
        if (isinf(ref[i])) { if (out[i] != ref[i]) a->infbad++; continue; }
        const double d = (double)out[i] - (double)ref[i];
        a->num += d * d;
        a->den += (double)ref[i] * (double)ref[i];
        /* per element: |d| against its own size plus the tensor's scale */
        const double s = fabs(d) / (fabs((double)ref[i]) + rms + 1e-30);
        if (s > a->elem) { a->elem = s; a->elem_at = a->count + i; }
    }
    a->count += n;
}

double gh_acc_rel(const gh_acc *a) { return a->den > 0 ? sqrt(a->num / a->den) : sqrt(a->num); }

double gh_cmp_bf16(const uint16_t *d, const float *ref, size_t n, gh_acc *a) {
    uint16_t *hb = (uint16_t *)gh_halloc(n * 2);
    float *hf = (float *)gh_halloc(n * 4);
    gh_to_host(hb, d, n * 2);
    gh_bf16_to_f32(hb, hf, n);
    gh_acc_add(a, hf, ref, n);
    return gh_acc_rel(a);
}

double gh_cmp_f32(const float *d, const float *ref, size_t n, gh_acc *a) {
    float *hf = (float *)gh_halloc(n * 4);
    gh_to_host(hf, d, n * 4);
    gh_acc_add(a, hf, ref, n);
    return gh_acc_rel(a);
}

int gh_verdict_keep(const char *name, int ok, const gh_acc *a, double bound) {
    const double r = gh_acc_rel(a), eb = GH_ELEM_FACTOR * bound;
    if (a->nan) { printf("  %ld NaN outputs (unwritten or computed)\n", a->nan); ok = 0; }
    if (a->infbad) { printf("  %ld masked (-inf) entries not matched\n", a->infbad); ok = 0; }
    if (!(r <= bound)) { printf("  relative error %.3e above bound %.1e\n", r, bound); ok = 0; }
    if (!(a->elem <= eb)) { printf("  element %zu: error %.3e of its size + the rms, above %.1e\n", a->elem_at, a->elem, eb); ok = 0; }
    if (!gh_guards_ok()) ok = 0;
    return gh_result(ok, "%s (rel %.2e, worst element %.2e)", name, r, a->elem);
}

int gh_verdict(const char *name, int ok, const gh_acc *a, double bound) {
    ok = gh_verdict_keep(name, ok, a, bound);
    gh_case_end();
    return ok;
}

void gh_fail_line(const char *name, const char *why) {
    printf("  %s\n", why);
    gh_result(0, "%s", name);
    gh_case_end();
}
