/* check.c: the checkpoint summary of `sparkmono check` (see check.h) and its scan for
 * non-finite values.
 *
 * Everything in the summary is derived from the validated config and the per-layer expert
 * formats of the loaded model, so the numbers are exact and cheap (no pass over the data).  We
 * rejected summing st_tensor sizes: the per-rank table needs each tensor's sharding rule, which
 * is a property of its role, not of its bytes.
 *
 * The finite scan reads the mapped bytes once, in the files' order, as integer codes (a value is
 * non-finite iff its magnitude bits reach the all-ones exponent), in fixed blocks gcc
 * vectorizes, on a pool of threads taking chunks in order.  A chunk that finds a bad value
 * publishes its chunk number; later chunks are skipped, earlier ones still run, so the report
 * is the first bad value in file order whichever thread sees what first.  We rejected
 * converting values to float and testing isfinite: the FP8 / e8m0 codes have no C type, and
 * the integer test is one compare for every dtype.  We rejected scanning at load: a 400 GB
 * checkpoint loads as a map, and the runtime argmax (backend.h) guards the steps.
 */
#include "engine/check.h"
#include "model/tensors.h"
#include "model/tokenizer.h"
#include "cpu/pool.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The component of b that role r counts in (tensors.h: sm_tensor_def.part). */
static int64_t *part_of(sm_bytes *b, sm_tensor_role r, sm_expert_fmt f) {
    switch (sm_tensors[r].part) {
    case SM_PART_EMBED: return &b->embed;
    case SM_PART_LM_HEAD: return &b->lm_head;
    case SM_PART_ATTN: return &b->attn;
    case SM_PART_ROUTER: return &b->router;
    case SM_PART_POOL: return &b->pool;
    case SM_PART_NORMS: return &b->norms;
    case SM_PART_EXPERTS: return &b->experts[f];
    }
    return &b->norms;
}

/* Bytes of role r (the experts of layer l in format f) that rank 0 of W holds (W = 1: all);
 * W divides every split dimension but the vocabulary, which rounds up (sm_rank_bytes). */
static int64_t role_bytes(const sm_config *c, sm_tensor_role r, sm_expert_fmt f, int W) {
    if (sm_tensors[r].kind == SM_TK_EXPERTS) /* both consolidated rows stand for the experts: count them once */
        return r == SM_T_EXPERTS_GU ? (int64_t)c->E / W * (int64_t)sm_expert_bytes(c, f) : 0;
    int64_t sh[3], all = sm_tensor_bytes(c, r);
    int nd = sm_tensor_shape(c, r, sh);
    switch (sm_tensors[r].split) {
    case SM_SPLIT_ROWS: return (sh[0] + W - 1) / W * (all / sh[0]);
    case SM_SPLIT_COLS: return all / sh[nd - 1] * ((sh[nd - 1] + W - 1) / W);
    default: return all;
    }
}

void sm_model_bytes(const sm_model *m, sm_bytes *b) {
    const sm_config *c = &m->cfg;
    memset(b, 0, sizeof *b);
    for (int l = 0; l < c->L; l++)
        for (int r = 0; r < SM_T_NLAYER; r++) {
            sm_expert_fmt f = m->layers[l].ex.fmt;
            *part_of(b, (sm_tensor_role)r, f) += role_bytes(c, (sm_tensor_role)r, f, 1);
        }
    for (int r = SM_T_NLAYER; r < SM_T_N; r++)
        *part_of(b, (sm_tensor_role)r, SM_EXP_BF16) += role_bytes(c, (sm_tensor_role)r, SM_EXP_BF16, 1);
    b->total = b->embed + b->lm_head + b->attn + b->router + b->pool + b->norms + b->experts[0] +
               b->experts[1] + b->experts[2];
}

int64_t sm_rank_bytes(const sm_model *m, int W) {
    const sm_config *c = &m->cfg;
    if (W < 1 || c->nH % W || c->nKV % W || c->E % W || c->Hm % W || c->H % W) return -1;
    int64_t r = 0; /* split tensors: 1/W of their rows or columns (vocabulary rows: ceil(V/W)); the rest replicated */
    for (int l = 0; l < c->L; l++)
        for (int t = 0; t < SM_T_NLAYER; t++) r += role_bytes(c, (sm_tensor_role)t, m->layers[l].ex.fmt, W);
    for (int t = SM_T_NLAYER; t < SM_T_N; t++) r += role_bytes(c, (sm_tensor_role)t, SM_EXP_BF16, W);
    return r;
}

void sm_layer_kinds(const sm_config *c, char *buf, size_t n) {
    size_t k = 0;
    for (int l = 0; l < c->L && k + 2 < n; l++) {
        if (l && l % 4 == 0) buf[k++] = ' ';
        buf[k++] = c->full[l] ? 'F' : 'S';
    }
    if (n) buf[k < n ? k : n - 1] = 0;
}

static void human(int64_t v, char *buf, size_t n) {
    double x = (double)v;
    if (x >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", x / (1024.0 * 1024 * 1024));
    else if (x >= 1024.0 * 1024) snprintf(buf, n, "%.2f MiB", x / (1024.0 * 1024));
    else if (x >= 1024.0) snprintf(buf, n, "%.2f KiB", x / 1024.0);
    else snprintf(buf, n, "%lld B", (long long)v);
}

static void row(FILE *f, const char *what, int64_t v) {
    char h[64];
    human(v, h, sizeof h);
    fprintf(f, "  %-22s %16lld  %12s\n", what, (long long)v, h);
}

/* The quantization_config read, then one line per kind of expert numerics with its layers as
 * ranges: "  layers 1-6: mxfp4 W4A4 (activations mxfp4, declared by quantization_config)". */
static void print_numerics(const sm_model *m, FILE *f) {
    const sm_config *c = &m->cfg;
    char q[512];
    sm_quant_describe(&m->quant, q, sizeof q);
    fprintf(f, "quantization_config: %s\n", q);
    fprintf(f, "numerics of the expert matmuls (activations %s):\n", sm_acts_name(m->acts));
    unsigned char done[SM_MAX_LAYERS] = {0};
    for (int l = 0; l < c->L; l++) {
        if (done[l]) continue;
        const sm_experts *X = &m->layers[l].ex;
        int cnt = 0;
        for (int k = l; k < c->L; k++) /* the layers of this kind */
            if (m->layers[k].ex.fmt == X->fmt && m->layers[k].ex.act_mx == X->act_mx && m->act_src[k] == m->act_src[l])
                done[k] = 2, cnt++;
        fprintf(f, "  layer%s ", cnt > 1 ? "s" : "");
        for (int k = l, first = 1; k < c->L; k++) { /* as ranges "0,3-5,7" */
            if (done[k] != 2) continue;
            int r = k;
            while (r + 1 < c->L && done[r + 1] == 2) r++;
            if (r > k) fprintf(f, "%s%d-%d", first ? "" : ",", k, r);
            else fprintf(f, "%s%d", first ? "" : ",", k);
            for (int j = k; j <= r; j++) done[j] = 1;
            first = 0;
            k = r;
        }
        const char *w = X->fmt == SM_EXP_MXFP4 ? (X->act_mx ? "W4A4" : "W4A16") : X->fmt == SM_EXP_FP8 ? "W8A16" : "W16A16";
        fprintf(f, ": %s %s (activations %s, %s)\n", sm_expert_fmt_name(X->fmt), w, X->act_mx ? "mxfp4" : "bf16",
                sm_act_src_text((sm_act_src)m->act_src[l]));
    }
}

void sm_check_print(const sm_model *m, FILE *f) {
    const sm_config *c = &m->cfg;
    fprintf(f, "config: L=%d H=%d Hm=%d I=%d E=%d K=%d nH=%d nKV=%d D=%d V=%d vocab_used=%d window=%d\n",
            c->L, c->H, c->Hm, c->I, c->E, c->K, c->nH, c->nKV, c->D, c->V, c->vocab_used, c->window);
    fprintf(f, "        rope_theta=%g rms_eps=%g post_eps=%g gate_temp=%g qk_scale_factor=%.10g\n", c->rope_theta,
            (double)c->rms_eps, (double)c->post_eps, (double)c->gate_temp, (double)c->qk_scale_factor);
    fprintf(f, "        output_multiplier=%.7g softcap=%g route_scale=%g bos=%d pad=%d eos=[", (double)c->out_mult,
            (double)c->softcap, (double)c->route_scale, c->bos, c->pad);
    for (int i = 0; i < c->n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", c->eos[i]);
    fprintf(f, "]\n");
    char kinds[SM_MAX_LAYERS * 2];
    sm_layer_kinds(c, kinds, sizeof kinds);
    fprintf(f, "layers: %s  (F full attention / NoPE, S sliding / RoPE)\n", kinds);
    /* expert format per layer, as runs: "0 bf16, 1-2 mxfp4, 3 bf16" */
    fprintf(f, "experts:");
    for (int l = 0; l < c->L;) {
        int r = l;
        while (r + 1 < c->L && m->layers[r + 1].ex.fmt == m->layers[l].ex.fmt) r++;
        if (r == l) fprintf(f, "%s layer %d %s", l ? "," : "", l, sm_expert_fmt_name(m->layers[l].ex.fmt));
        else fprintf(f, "%s layers %d-%d %s", l ? "," : "", l, r, sm_expert_fmt_name(m->layers[l].ex.fmt));
        l = r + 1;
    }
    fprintf(f, "\n");
    print_numerics(m, f);
    sm_bytes b;
    sm_model_bytes(m, &b);
    fprintf(f, "bytes:\n");
    row(f, "embedding", b.embed);
    row(f, "lm_head", b.lm_head);
    row(f, "attention", b.attn);
    row(f, "router", b.router);
    row(f, "pooler/unpooler", b.pool);
    for (int k = 0; k < 3; k++) {
        if (!b.experts[k]) continue;
        char w[32];
        snprintf(w, sizeof w, "experts %s", sm_expert_fmt_name((sm_expert_fmt)k));
        row(f, w, b.experts[k]);
    }
    row(f, "norms + gates", b.norms);
    row(f, "total", b.total);
    fprintf(f, "weights per GPU (TP = EP over W ranks):\n  %-4s %16s  %12s\n", "W", "bytes", "");
    for (int W = 1; W <= 8; W *= 2) {
        int64_t r = sm_rank_bytes(m, W);
        if (r < 0) { fprintf(f, "  %-4d %16s  (W does not divide nH, nKV, E, Hm and H)\n", W, "-"); continue; }
        char h[64];
        human(r, h, sizeof h);
        fprintf(f, "  %-4d %16lld  %12s\n", W, (long long)r, h);
    }
}

int sm_check_tokenizer(const char *dir, char *line, size_t n, sm_err *e) {
    char path[4096];
    sm_tokenizer *t;
    if (sm_tokenizer_load_dir(dir, &t, path, sizeof path, e)) return -1;
    if (!t) snprintf(line, n, "tokenizer: none (no tokenizer.json: prompts are token ids, no text out)");
    else snprintf(line, n, "tokenizer: %s, %d tokens", path, sm_tokenizer_size(t));
    sm_tokenizer_free(t);
    return 0;
}

/* ---------------------------------------------------------------- finite scan */

#define FIN_CHUNK ((int64_t)4 << 20) /* bytes of one scan chunk (a multiple of every element size) */
#define FIN_BLOCK 1024               /* bytes reduced at a time before testing (vectorized) */

/* How a dtype stores non-finite values: an element x (w bytes, little-endian) is non-finite iff
 * (x & mag) >= thr; among those, x & mag == thr is an infinity when inf is set (else a NaN). */
typedef struct fin_code {
    int w;              /* element bytes */
    uint64_t mag, thr;  /* magnitude mask, first non-finite magnitude */
    int inf;            /* the dtype has infinities */
} fin_code;

static int fin_code_of(st_dtype t, fin_code *fc) {
    switch (t) {
    case ST_BF16: *fc = (fin_code){2, 0x7FFF, 0x7F80, 1}; return 1;
    case ST_F16: *fc = (fin_code){2, 0x7FFF, 0x7C00, 1}; return 1;
    case ST_F32: *fc = (fin_code){4, 0x7FFFFFFFu, 0x7F800000u, 1}; return 1;
    case ST_F64: *fc = (fin_code){8, 0x7FFFFFFFFFFFFFFFull, 0x7FF0000000000000ull, 1}; return 1;
    case ST_F8_E4M3: *fc = (fin_code){1, 0x7F, 0x7F, 0}; return 1;  /* S.1111.111: NaN, no inf */
    case ST_F8_E5M2: *fc = (fin_code){1, 0x7F, 0x7C, 1}; return 1;
    case ST_F8_E8M0: *fc = (fin_code){1, 0xFF, 0xFF, 0}; return 1;  /* 0xFF: NaN */
    default: return 0;                                              /* integers, F4: always finite */
    }
}

/* First i in [0, n) with (p[i] & mag) >= thr (elements of type T, any alignment), or -1.
 * Whole blocks are max-reduced without a branch (vectorized); a block that reaches thr and the
 * tail are rescanned element by element. */
#define FIN_SCAN(name, T)                                                                  \
    static int64_t name(const unsigned char *p, int64_t n, uint64_t mag64, uint64_t thr64) { \
        const T mag = (T)mag64, thr = (T)thr64;                                            \
        enum { NB = FIN_BLOCK / sizeof(T) };                                               \
        int64_t i = 0;                                                                     \
        for (; i + NB <= n; i += NB) {                                                     \
            T m = 0;                                                                       \
            for (int j = 0; j < NB; j++) {                                                 \
                T x;                                                                       \
                memcpy(&x, p + (i + j) * (int64_t)sizeof(T), sizeof(T));                   \
                x &= mag;                                                                  \
                m = x > m ? x : m;                                                         \
            }                                                                              \
            if (m >= thr) break;                                                           \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            T x;                                                                           \
            memcpy(&x, p + i * (int64_t)sizeof(T), sizeof(T));                             \
            if ((T)(x & mag) >= thr) return i;                                             \
        }                                                                                  \
        return -1;                                                                         \
    }
FIN_SCAN(fin_scan8, uint8_t)
FIN_SCAN(fin_scan16, uint16_t)
FIN_SCAN(fin_scan32, uint32_t)
FIN_SCAN(fin_scan64, uint64_t)

typedef struct fin_chunk {
    int t;                  /* index into fin_job.ord */
    int64_t lo, hi;         /* byte range of that tensor */
} fin_chunk;

typedef struct fin_job {
    const st_tensor **ord;  /* [nt] floating-point tensors in byte order */
    fin_code *code;         /* [nt] their codes */
    fin_chunk *ch;          /* [nch] chunks in byte order */
    int64_t nch;
    atomic_llong first;     /* lowest chunk holding a bad value found so far; nch: none */
    pthread_mutex_t mu;     /* guards the two fields below and stores to first */
    int64_t hit;            /* element index (in its tensor) of the bad value of chunk `first` */
    uint64_t bits;          /* its code */
    atomic_llong done;      /* bytes scanned or skipped */
    int64_t total;          /* bytes in all */
    int progress;           /* tid 0 prints progress */
    double last;            /* time of the last progress print (tid 0) */
    int printed;            /* width of the progress line on screen, 0 if none (tid 0) */
} fin_job;

static double fin_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fin_chunks(void *arg, int64_t lo, int64_t hi, int tid) {
    fin_job *j = arg;
    for (int64_t c = lo; c < hi; c++) {
        const fin_chunk *k = &j->ch[c];
        if (c < atomic_load(&j->first)) {
            const fin_code *fc = &j->code[k->t];
            const unsigned char *p = (const unsigned char *)j->ord[k->t]->data + k->lo;
            int64_t n = (k->hi - k->lo) / fc->w, i;
            switch (fc->w) {
            case 1: i = fin_scan8(p, n, fc->mag, fc->thr); break;
            case 2: i = fin_scan16(p, n, fc->mag, fc->thr); break;
            case 4: i = fin_scan32(p, n, fc->mag, fc->thr); break;
            default: i = fin_scan64(p, n, fc->mag, fc->thr); break;
            }
            if (i >= 0) {
                uint64_t b = 0;
                memcpy(&b, p + i * fc->w, (size_t)fc->w); /* little-endian host */
                pthread_mutex_lock(&j->mu);
                if (c < atomic_load(&j->first)) {
                    atomic_store(&j->first, c);
                    j->hit = k->lo / fc->w + i;
                    j->bits = b;
                }
                pthread_mutex_unlock(&j->mu);
            }
        }
        long long d = atomic_fetch_add(&j->done, (long long)(k->hi - k->lo)) + (k->hi - k->lo);
        if (tid == 0 && j->progress) {
            double t = fin_now();
            if (t - j->last >= 1.0) {
                j->last = t;
                int w = fprintf(stderr, "\rcheck: scanned %.1f of %.1f GB", (double)d / 1e9, (double)j->total / 1e9);
                if (w - 1 > j->printed) j->printed = w - 1;
                fflush(stderr);
            }
        }
    }
}

/* Byte order: file, then offset in it. */
static int fin_cmp(const void *pa, const void *pb) {
    const st_tensor *a = *(const st_tensor *const *)pa, *b = *(const st_tensor *const *)pb;
    if (a->file != b->file) return a->file < b->file ? -1 : 1;
    uintptr_t x = (uintptr_t)a->data, y = (uintptr_t)b->data;
    return x < y ? -1 : x > y;
}

int sm_check_finite(const st_archive *a, int nthreads, int progress, sm_finite_scan *r, sm_err *e) {
    memset(r, 0, sizeof *r);
    double t0 = fin_now();
    fin_job j;
    memset(&j, 0, sizeof j);
    int nt = 0, rc = -1;
    sm_pool *pool = NULL;
    j.ord = malloc(sizeof *j.ord * (size_t)(a->ntensors ? a->ntensors : 1));
    j.code = malloc(sizeof *j.code * (size_t)(a->ntensors ? a->ntensors : 1));
    if (!j.ord || !j.code) { sm_errf(e, "check: out of memory for %d tensors", a->ntensors); goto out; }
    for (int i = 0; i < a->ntensors; i++) {
        fin_code fc;
        if (a->tensors[i].nbytes && fin_code_of(a->tensors[i].dtype, &fc)) j.ord[nt++] = &a->tensors[i];
    }
    qsort(j.ord, (size_t)nt, sizeof *j.ord, fin_cmp);
    for (int t = 0; t < nt; t++) {
        fin_code_of(j.ord[t]->dtype, &j.code[t]);
        j.nch += ((int64_t)j.ord[t]->nbytes + FIN_CHUNK - 1) / FIN_CHUNK;
        j.total += (int64_t)j.ord[t]->nbytes;
    }
    r->bytes = j.total;
    r->tensors = nt;
    j.ch = malloc(sizeof *j.ch * (size_t)(j.nch ? j.nch : 1));
    if (!j.ch) { sm_errf(e, "check: out of memory for %lld scan chunks", (long long)j.nch); goto out; }
    for (int64_t t = 0, c = 0; t < nt; t++)
        for (int64_t lo = 0; lo < (int64_t)j.ord[t]->nbytes; lo += FIN_CHUNK, c++) {
            int64_t hi = lo + FIN_CHUNK < (int64_t)j.ord[t]->nbytes ? lo + FIN_CHUNK : (int64_t)j.ord[t]->nbytes;
            j.ch[c] = (fin_chunk){(int)t, lo, hi};
        }
    atomic_init(&j.first, (long long)j.nch);
    atomic_init(&j.done, 0);
    pthread_mutex_init(&j.mu, NULL);
    j.progress = progress && isatty(STDERR_FILENO);
    j.last = t0;
    if (sm_pool_create(nthreads, &pool, e)) { pthread_mutex_destroy(&j.mu); goto out; }
    sm_pool_for(pool, j.nch, 1, fin_chunks, &j);
    sm_pool_destroy(pool);
    pthread_mutex_destroy(&j.mu);
    if (j.printed) fprintf(stderr, "\r%*s\r", j.printed, ""); /* erase the progress line */
    r->seconds = fin_now() - t0;
    int64_t first = (int64_t)atomic_load(&j.first);
    if (first == j.nch) { rc = 0; goto out; }
    /* name the value: file, tensor, flat index, coordinates, kind and code */
    const fin_chunk *k = &j.ch[first];
    const fin_code *fc = &j.code[k->t];
    r->found = 1;
    r->t = j.ord[k->t];
    r->index = j.hit;
    r->bits = j.bits;
    uint64_t mg = j.bits & fc->mag;
    int neg = (j.bits >> (8 * fc->w - 1)) & 1;
    r->kind = fc->inf && mg == fc->thr ? (neg ? "-Inf" : "+Inf") : "NaN";
    int64_t co[ST_MAX_DIMS], rest = r->index; /* coordinates (every dim > 0: the tensor has bytes) */
    for (int d = r->t->ndim - 1; d >= 0; d--) {
        co[d] = rest % r->t->shape[d];
        rest /= r->t->shape[d];
    }
    char at[ST_MAX_DIMS * 24] = "";
    for (int d = 0, n = 0; d < r->t->ndim; d++)
        n += snprintf(at + n, sizeof at - (size_t)n, "%s%lld", d ? ", " : "", (long long)co[d]);
    sm_errf(e, "%s: tensor '%s' element %lld [%s] is %s (%s code 0x%0*llx): the checkpoint holds a non-finite weight",
            a->files[r->t->file].path, r->t->name, (long long)r->index, at, r->kind, st_dtype_name(r->t->dtype),
            2 * fc->w, (unsigned long long)r->bits);
out:
    free(j.ord);
    free(j.code);
    free(j.ch);
    return rc;
}

void sm_check_finite_print(const sm_finite_scan *r, FILE *f) {
    double gb = (double)r->bytes / 1e9;
    fprintf(f, "values: all finite (%.3f GB in %lld floating-point tensors, scanned in %.2f s, %.2f GB/s)\n", gb,
            (long long)r->tensors, r->seconds, r->seconds > 0 ? gb / r->seconds : 0.0);
}
