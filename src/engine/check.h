/* check.h: the summary `sparkmono check` prints for a loaded checkpoint: configuration, layer
 * kinds, expert format per layer, bytes per component, and the weight bytes one GPU holds in a
 * TP = EP deployment of W ranks (docs/model.md section 9); and the scan of every stored value for NaN
 * and infinities (sm_check_finite), which the loader does not do (a 400 GB load stays a map).  Byte counts are computed from the
 * configuration and each layer's expert format (what the files store, or the online-MXFP4
 * copies when the model was loaded that way), not from file sizes, so they describe what a
 * backend uploads.  We rejected printing from the archive directly: the per-rank split
 * needs the component of every tensor anyway. */
#ifndef SM_SRC_CHECK_H
#define SM_SRC_CHECK_H
#include <stdint.h>
#include <stdio.h>
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_bytes {
    int64_t embed;        /* [V, H] bf16 */
    int64_t lm_head;      /* [V, H] bf16 */
    int64_t attn;         /* q, k, v, gate, o projections of all layers, bf16 */
    int64_t router;       /* router weights [E, H] + bias [E], f32, all layers */
    int64_t pool;         /* pooler [Hm, H] + unpooler [H, Hm], bf16, all layers */
    int64_t experts[3];   /* [sm_expert_fmt] expert weights + scales, all layers */
    int64_t norms;        /* norm gains and residual gates (bf16 in the file), all layers + final */
    int64_t total;        /* sum of the above */
} sm_bytes;

/* Bytes per component of m. */
void sm_model_bytes(const sm_model *m, sm_bytes *b);
/* Weight bytes one rank holds with W ranks (docs/model.md section 9: heads, experts, pooler rows
 * and unpooler rows split by W; router and norms replicated; embedding and lm_head split by
 * vocab rows, ceil(V/W)).  -1 when W does not divide nH, nKV, E, Hm and H. */
int64_t sm_rank_bytes(const sm_model *m, int W);
/* "SFSS SFSS ..." (F full, S sliding; a space every 4 layers) into buf. */
void sm_layer_kinds(const sm_config *c, char *buf, size_t n);
/* The whole summary. */
void sm_check_print(const sm_model *m, FILE *f);
/* Load dir's tokenizer.json with the loader serve uses (sm_tokenizer_load_dir): line [n] gets
 * the summary line ("tokenizer: ..."), or -1 and one line in e when the file is broken. */
int sm_check_tokenizer(const char *dir, char *line, size_t n, sm_err *e);

/* Result of sm_check_finite. */
typedef struct sm_finite_scan {
    int found;              /* 1: a non-finite value was found (the fields below name it) */
    const st_tensor *t;     /* its tensor (a view into the archive scanned) */
    int64_t index;          /* its flat element index in t */
    uint64_t bits;          /* its stored code (bf16 / f32 / fp8 ... bits) */
    const char *kind;       /* "NaN", "+Inf" or "-Inf" */
    int64_t bytes;          /* bytes of floating-point tensors to scan (all of them) */
    int64_t tensors;        /* how many floating-point tensors */
    double seconds;         /* wall time of the scan */
} sm_finite_scan;

/* Scan every floating-point tensor of a for NaN and infinities: BF16, F16, F32, F64, F8_E4M3
 * (OCP "fn": codes 0x7F / 0xFF are NaN, no infinities), F8_E5M2, F8_E8M0 (0xFF is NaN); integer
 * and F4 (e2m1) tensors cannot hold one.  Tensors are taken in the checkpoint's byte order (file
 * by file as the archive lists them, by offset), cut into chunks of a few MB scanned by
 * nthreads threads (0 = online cores); the value reported is the FIRST non-finite one in that
 * order, whatever thread finds what first.  progress: 1 to rewrite a "check: scanned X of Y
 * GB" line on stderr about every second (only while stderr is a terminal, erased at the end).
 * Returns 0 when every value is finite; -1 when one is not (r says which, e names the file,
 * tensor, element index and coordinates) or on an error (r->found = 0). */
int sm_check_finite(const st_archive *a, int nthreads, int progress, sm_finite_scan *r, sm_err *e);
/* "values: all finite (X GB in N tensors scanned in S s, G GB/s)" for a clean scan r. */
void sm_check_finite_print(const sm_finite_scan *r, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
