/* makemodel.c: random checkpoints with the real tensor names (see makemodel.h).
 *
 * The tensors, their names, shapes, dtypes and magnitudes are the rows of the tensor tables
 * (tensors.h), written F32 first, then BF16, then U8 / F8 so every view is aligned.  Every
 * value is a pure function of (seed, stream name, element index): a counter-based generator
 * (splitmix64 finalizer of key + index, rng.h) feeds Box-Muller with our own polynomial
 * log and sin/cos, so any byte range of any tensor can be made by any thread, in any order,
 * with identical bytes on every machine (no libm in the values).  Experts are keyed by their
 * logical name (layer, expert, projection), not the tensor name, so the consolidated BF16,
 * MXFP4 and FP8 files of one seed hold the same underlying normals.  A pool of workers fills
 * 16 MB chunks while the main thread writes the previous chunk: the model is streamed, never
 * held.  We rejected a stateful PRNG (one stream per file): it forces one thread and
 * generation in file order, and makes the quantized files unrelated to the BF16 file.
 */
#include "testing/makemodel.h"
#include "model/tensors.h"
#include "model/rng.h"
#include "model/codec.h"
#include "model/safetensors.h"
#include "base/outfile.h"
#include "testing/tok_train.h"
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK ((int64_t)16 << 20) /* bytes generated per job (two buffers in flight) */
#define PIECE ((int64_t)64 << 10) /* smallest piece of a job a worker takes */
#define BATCH 4096                /* normals generated per inner batch */

/* ---- counter-based normals (src/model/rng.h) ---- */
#define NB 64
/* NB normal pairs k0 .. k0+NB-1 of the stream into z [2 NB] (pair k -> z[2k], z[2k+1]). */
static void normal_block(uint64_t key, int64_t k0, float *z) {
    float c[NB], s[NB]; /* separate arrays keep the loop vectorizable */
    for (int i = 0; i < NB; i++) sm_rng_normal_pair(key, k0 + i, &c[i], &s[i]);
    for (int i = 0; i < NB; i++) {
        z[2 * i] = c[i];
        z[2 * i + 1] = s[i];
    }
}
/* n standard normals of the stream, elements i0 .. i0+n-1 (element i = half of pair i/2). */
static void gen_normals(uint64_t key, int64_t i0, int64_t n, float *out) {
    float z[2 * NB];
    int64_t i = i0, end = i0 + n;
    while (i < end) {
        int64_t k0 = i >> 1, off = i - 2 * k0;             /* block of pairs starting at pair k0 */
        int64_t cnt = 2 * NB - off < end - i ? 2 * NB - off : end - i;
        if (off == 0 && cnt == 2 * NB) normal_block(key, k0, out);
        else {
            normal_block(key, k0, z);
            memcpy(out, z + off, sizeof(float) * (size_t)cnt);
        }
        out += cnt;
        i += cnt;
    }
}

/* ---- the tensor list ---- */
typedef enum gen_kind {
    G_NORMAL,  /* mean + std * z in the tensor's dtype (BF16 or F32), stream of the tensor name */
    G_EXP_BF16,/* consolidated [E, rows, cols] BF16 experts, one stream per expert */
    G_MX_W,    /* one expert's MXFP4 codes [rows, cols/2] */
    G_MX_S,    /* one expert's e8m0 scales [rows, cols/32] */
    G_FP8_W,   /* one expert's e4m3 codes [rows, cols] */
    G_FP8_S,   /* one expert's f32 per-row scales [rows] */
    G_CYCLE_HEAD /* lm_head of a cycle model [rows = V, cols = H]: cycle rows from the embedding,
                  the others as G_NORMAL */
} gen_kind;

/* Cycle models (makemodel.h) */
#define CYCLE_LOGIT 32.0       /* raw logit of the cycle's next id: softcapped 20 tanh(32 * 2^-2.5 / 20) = 5.5 */
#define CYCLE_OTHER_STD 0.0625f /* std of the other lm_head rows, times 1/sqrt(H) (1/16 of the random model's) */
#define CYCLE_GATE_MEAN -1.0f  /* residual gates ~ N(-1, 0.1): beta = sigmoid(g / 0.3) ~ 0.03 */
#define CYCLE_GATE_STD 0.1f

typedef struct mm_tensor {
    char name[128];           /* full tensor name */
    st_dtype dt;
    int ndim;
    int64_t shape[3];         /* [ndim] */
    int64_t nbytes;
    gen_kind kind;
    uint64_t key;             /* G_NORMAL: stream of (seed, name) */
    float mean, std;          /* G_NORMAL: value = mean + std * z; experts: std only */
    int role;                 /* G_NORMAL, G_CYCLE_HEAD: its row of the tensor table; else -1 */
    int layer, expert, proj;  /* experts: layer, expert (-1: all E, consolidated), 0 gate_up / 1 down */
    int64_t rows, cols;       /* experts: one expert's logical matrix [rows, cols]; G_CYCLE_HEAD [V, H] */
    uint64_t src_key;         /* G_CYCLE_HEAD: the embedding's stream, value src_mean + src_std * z */
    float src_mean, src_std;
    const int *cyc; int ncyc; /* G_CYCLE_HEAD: [ncyc] cycle ids, increasing */
    int shard;                /* file index */
} mm_tensor;

typedef struct mm_list {
    mm_tensor *t; int n, cap;  /* [n] tensors in file order */
} mm_list;

static mm_tensor *add(mm_list *l, sm_err *e) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 256;
        mm_tensor *nt = realloc(l->t, sizeof *nt * (size_t)nc);
        if (!nt) { sm_errf(e, "make-model: out of memory"); return NULL; }
        l->t = nt;
        l->cap = nc;
    }
    mm_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    t->expert = -1;
    t->role = -1;
    return t;
}

/* One expert tensor (consolidated: ex = -1, slot SM_XS_GU_W / SM_XS_DN_W) of kind k and dtype dt,
 * of layer l; values N(0, 1/fan_in) of the matrix's logical streams. */
static int add_expert(mm_list *ls, const sm_config *c, sm_expert_fmt f, gen_kind k, st_dtype dt, int l, int ex, int slot,
                      sm_err *e) {
    mm_tensor *t = add(ls, e);
    if (!t) return -1;
    sm_tensor_role r = slot / 2 ? SM_T_EXPERTS_DN : SM_T_EXPERTS_GU; /* the consolidated tensor's row */
    float mean;
    if (ex < 0) {
        sm_tensor_name(t->name, sizeof t->name, r, l);
        t->ndim = sm_tensor_shape(c, r, t->shape);
    } else {
        sm_expert_tensor_name(t->name, sizeof t->name, l, ex, slot);
        t->ndim = sm_expert_slot_shape(c, f, slot, dt, t->shape);
    }
    t->dt = dt;
    t->kind = k;
    t->layer = l;
    t->expert = ex;
    t->proj = slot / 2;
    sm_expert_dims(c, t->proj, &t->rows, &t->cols);
    sm_tensor_init(c, r, &mean, &t->std); /* N(0, 1/fan_in), fan_in = cols */
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    t->nbytes = st_nbytes(dt, numel);
    return 0;
}

/* Role r of the tensor table (layer l; -1 for a model-level role) as make-model draws it:
 * mean + std * z of the stream of its name, or the consolidated BF16 experts. */
static int add_role(mm_list *ls, const sm_config *c, const sm_make_opts *o, sm_tensor_role r, int l, sm_err *e) {
    const sm_tensor_def *d = &sm_tensors[r];
    if (d->kind == SM_TK_EXPERTS)
        return add_expert(ls, c, SM_EXP_BF16, G_EXP_BF16, d->dtype, l, -1, r == SM_T_EXPERTS_DN ? SM_XS_DN_W : SM_XS_GU_W, e);
    mm_tensor *t = add(ls, e);
    if (!t) return -1;
    sm_tensor_name(t->name, sizeof t->name, r, l);
    t->role = r;
    t->layer = l;
    t->dt = d->dtype;
    t->ndim = sm_tensor_shape(c, r, t->shape);
    t->nbytes = sm_tensor_bytes(c, r);
    t->kind = G_NORMAL;
    t->key = sm_rng_key(o->seed, t->name);
    sm_tensor_init(c, r, &t->mean, &t->std);
    if (o->cycle && d->kind == SM_TK_GATE) { /* residual-dominant gates */
        t->mean = CYCLE_GATE_MEAN;
        t->std = CYCLE_GATE_STD;
    }
    if (o->cycle && r == SM_T_LM_HEAD) t->std = CYCLE_OTHER_STD / sqrtf((float)c->H);
    return 0;
}

static int quantized_layer(const sm_config *c, const sm_make_opts *o, int l) {
    return o->experts != SM_EXP_BF16 && !sm_layer_keeps_bf16(c, l);
}

/* The tensors of element size `es` bytes, in file order: the model-level ones written first,
 * then per layer its table rows (consolidated experts only where the layer keeps BF16) and
 * its per-expert tensors, then the other model-level ones. */
static int add_group(mm_list *ls, const sm_config *c, const sm_make_opts *o, int es, sm_err *e) {
    for (int r = SM_T_NLAYER; r < SM_T_N; r++)
        if (sm_tensors[r].first && st_dtype_bits(sm_tensors[r].dtype) == 8 * es && add_role(ls, c, o, (sm_tensor_role)r, -1, e))
            return -1;
    const sm_expert_format *F = &sm_expert_formats[o->experts];
    for (int l = 0; l < c->L; l++) {
        int q = quantized_layer(c, o, l);
        for (int r = 0; r < SM_T_NLAYER; r++) {
            if (st_dtype_bits(sm_tensors[r].dtype) != 8 * es || (q && sm_tensors[r].kind == SM_TK_EXPERTS)) continue;
            if (add_role(ls, c, o, (sm_tensor_role)r, l, e)) return -1;
        }
        if (!q) continue;
        for (int ex = 0; ex < c->E; ex++)
            for (int s = 0; s < SM_XS_N; s++) {
                int scale = s % 2;
                st_dtype dt = scale ? F->s : F->w;
                if ((scale && F->scale == 0) || st_dtype_bits(dt) != 8 * es) continue;
                gen_kind k = o->experts == SM_EXP_MXFP4 ? (scale ? G_MX_S : G_MX_W) : (scale ? G_FP8_S : G_FP8_W);
                if (add_expert(ls, c, o->experts, k, dt, l, ex, s, e)) return -1;
            }
    }
    for (int r = SM_T_NLAYER; r < SM_T_N; r++)
        if (!sm_tensors[r].first && st_dtype_bits(sm_tensors[r].dtype) == 8 * es && add_role(ls, c, o, (sm_tensor_role)r, -1, e))
            return -1;
    return 0;
}

/* Build the list: F32 tensors first, then BF16, then U8 / F8 (so every view is aligned). */
static int build_list(const sm_config *c, const sm_make_opts *o, const int *cyc, mm_list *ls, sm_err *e) {
    for (int es = 4; es >= 1; es /= 2)
        if (add_group(ls, c, o, es, e)) return -1;
    if (o->cycle) { /* lm_head rows of the cycle ids from the embedding */
        mm_tensor *hd = NULL, *emb = NULL;
        for (int i = 0; i < ls->n; i++) {
            if (ls->t[i].role == SM_T_EMBED) emb = &ls->t[i];
            if (ls->t[i].role == SM_T_LM_HEAD) hd = &ls->t[i];
        }
        if (!emb || !hd) return sm_errf(e, "make-model: internal: no embedding or lm_head in the tensor list");
        hd->kind = G_CYCLE_HEAD;
        hd->rows = c->V;
        hd->cols = c->H;
        hd->src_key = emb->key;
        hd->src_mean = emb->mean;
        hd->src_std = emb->std;
        hd->cyc = cyc;
        hd->ncyc = o->cycle;
    }
    return 0;
}

/* ---- generation of a byte range of one tensor ---- */
typedef struct memo {
    uint8_t *buf; int64_t cap;   /* [cap] scale bytes of the last MXFP4 weight generated */
    int layer, expert, proj;     /* which expert matrix they belong to */
    int valid;                   /* complete (the weight tensor was fully generated) */
    int active;                  /* workers are filling it now */
} memo;

/* Bytes of [b0, b1) of t (b0, b1 multiples of unit(t)) into out; scratch >= BATCH + max cols. */
static void gen_range(const mm_tensor *t, uint64_t seed, memo *mo, int64_t b0, int64_t b1, uint8_t *out, float *z) {
    switch (t->kind) {
    case G_NORMAL: {
        int es = t->dt == ST_F32 ? 4 : 2;
        for (int64_t i = b0 / es; i < b1 / es;) {
            int64_t n = b1 / es - i < BATCH ? b1 / es - i : BATCH;
            gen_normals(t->key, i, n, z);
            for (int64_t j = 0; j < n; j++) {
                float v = t->mean + t->std * z[j];
                if (es == 4) memcpy(out + 4 * j, &v, 4);
                else { uint16_t h = sm_f32_to_bf16(v); memcpy(out + 2 * j, &h, 2); }
            }
            out += n * es;
            i += n;
        }
        break;
    }
    case G_EXP_BF16: {
        int64_t per = t->rows * t->cols;
        for (int64_t i = b0 / 2; i < b1 / 2;) {
            int ex = (int)(i / per);
            int64_t j = i % per, n = b1 / 2 - i;
            if (n > per - j) n = per - j;
            if (n > BATCH) n = BATCH;
            gen_normals(sm_rng_expert_key(seed, t->layer, ex, t->proj), j, n, z);
            for (int64_t k = 0; k < n; k++) {
                uint16_t h = sm_f32_to_bf16(t->std * z[k]); /* bf16 of N(0, 1/fan_in) */
                memcpy(out + 2 * k, &h, 2);
            }
            out += 2 * n;
            i += n;
        }
        break;
    }
    case G_MX_W:
    case G_MX_S: {
        int64_t bsz = t->kind == G_MX_W ? 16 : 1; /* bytes per block in this tensor */
        int64_t k0 = b0 / bsz, k1 = b1 / bsz;     /* blocks */
        if (t->kind == G_MX_S && mo->valid && mo->layer == t->layer && mo->expert == t->expert && mo->proj == t->proj) {
            memcpy(out, mo->buf + k0, (size_t)(k1 - k0));
            break;
        }
        uint64_t key = sm_rng_expert_key(seed, t->layer, t->expert, t->proj);
        for (int64_t k = k0; k < k1;) {
            int64_t nb = k1 - k < BATCH / 32 ? k1 - k : BATCH / 32;
            gen_normals(key, k * 32, nb * 32, z);
            for (int64_t j = 0; j < nb * 32; j++) z[j] = sm_r16(t->std * z[j]); /* the BF16 model's values */
            for (int64_t b = 0; b < nb; b++) {
                uint8_t q[16];
                uint8_t sb = sm_mx_quantize_block(z + 32 * b, q);
                if (t->kind == G_MX_W) {
                    memcpy(out + 16 * (k - k0 + b), q, 16);
                    if (mo->active) mo->buf[k + b] = sb;
                } else
                    out[k - k0 + b] = sb;
            }
            k += nb;
        }
        break;
    }
    case G_CYCLE_HEAD: {
        int64_t H = t->cols, rb = 2 * H; /* whole rows */
        for (int64_t v = b0 / rb; v < b1 / rb; v++, out += rb) {
            int lo = 0, hi = t->ncyc; /* binary search of v among the cycle ids */
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (t->cyc[mid] < v) lo = mid + 1;
                else hi = mid;
            }
            if (lo == t->ncyc || t->cyc[lo] != v) { /* not a cycle id: as G_NORMAL */
                gen_normals(t->key, v * H, H, z);
                for (int64_t j = 0; j < H; j++) {
                    uint16_t h = sm_f32_to_bf16(t->mean + t->std * z[j]);
                    memcpy(out + 2 * j, &h, 2);
                }
                continue;
            }
            /* row of the cycle id after prev = the bf16 embedding row of prev, normalized to
             * RMS 1 and scaled by CYCLE_LOGIT / H: the normalized row (norm sqrt(H)) dotted
             * with it gives CYCLE_LOGIT */
            int64_t prev = t->cyc[(lo + t->ncyc - 1) % t->ncyc];
            gen_normals(t->src_key, prev * H, H, z);
            double ss = 0;
            for (int64_t j = 0; j < H; j++) {
                z[j] = sm_r16(t->src_mean + t->src_std * z[j]);
                ss += (double)z[j] * z[j];
            }
            float a = ss > 0 ? (float)(CYCLE_LOGIT / sqrt(ss * (double)H)) : 0.0f;
            for (int64_t j = 0; j < H; j++) {
                uint16_t h = sm_f32_to_bf16(a * z[j]);
                memcpy(out + 2 * j, &h, 2);
            }
        }
        break;
    }
    case G_FP8_W:
    case G_FP8_S: {
        int64_t rsz = t->kind == G_FP8_W ? t->cols : 4; /* bytes per row in this tensor */
        uint64_t key = sm_rng_expert_key(seed, t->layer, t->expert, t->proj);
        for (int64_t r = b0 / rsz; r < b1 / rsz; r++) {
            gen_normals(key, r * t->cols, t->cols, z);
            float amax = 0;
            for (int64_t j = 0; j < t->cols; j++) {
                z[j] = sm_r16(t->std * z[j]);
                if (fabsf(z[j]) > amax) amax = fabsf(z[j]);
            }
            float sc = amax > 0 ? amax / 448.0f : 1.0f; /* per-row scale amax / 448 */
            uint8_t *o = out + (r - b0 / rsz) * rsz;
            if (t->kind == G_FP8_S) memcpy(o, &sc, 4);
            else
                for (int64_t j = 0; j < t->cols; j++) o[j] = sm_f32_to_e4m3(z[j] / sc);
        }
        break;
    }
    }
}

static int64_t unit_of(const mm_tensor *t) {
    switch (t->kind) {
    case G_NORMAL: return t->dt == ST_F32 ? 4 : 2;
    case G_EXP_BF16: return 2;
    case G_MX_W: return 16;
    case G_MX_S: return 1;
    case G_FP8_W: return t->cols;
    case G_FP8_S: return 4;
    case G_CYCLE_HEAD: return 2 * t->cols;
    }
    return 1;
}

/* ---- worker pool ---- */
typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int nw;                      /* workers */
    pthread_t *th;               /* [nw] */
    float **scratch;             /* [nw] per-worker normals */
    uint64_t seed;
    memo mo;
    /* current job */
    const mm_tensor *t;
    int64_t b0, unit, units;     /* job covers units [0, units) of `unit` bytes from byte b0 */
    uint8_t *out;
    int npieces, next, ndone;
    int quit;
} pool;

typedef struct worker_arg { pool *p; int id; } worker_arg;

static void *worker(void *arg) {
    worker_arg *wa = arg;
    pool *p = wa->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->next >= p->npieces) pthread_cond_wait(&p->work, &p->mu);
        if (p->quit) break;
        int pc = p->next++;
        const mm_tensor *t = p->t;
        int64_t u0 = p->units * pc / p->npieces, u1 = p->units * (pc + 1) / p->npieces;
        int64_t b0 = p->b0 + u0 * p->unit, b1 = p->b0 + u1 * p->unit;
        uint8_t *out = p->out + u0 * p->unit;
        pthread_mutex_unlock(&p->mu);
        gen_range(t, p->seed, &p->mo, b0, b1, out, p->scratch[wa->id]);
        pthread_mutex_lock(&p->mu);
        if (++p->ndone == p->npieces) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_submit(pool *p, const mm_tensor *t, int64_t b0, int64_t b1, uint8_t *out) {
    pthread_mutex_lock(&p->mu);
    p->t = t;
    p->unit = unit_of(t);
    p->b0 = b0;
    p->units = (b1 - b0) / p->unit;
    p->out = out;
    int64_t np = (b1 - b0 + PIECE - 1) / PIECE;
    if (np > 4 * p->nw) np = 4 * p->nw;
    if (np > p->units) np = p->units;
    if (np < 1) np = 1;
    p->npieces = (int)np;
    p->next = 0;
    p->ndone = 0;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

static void pool_wait(pool *p) {
    pthread_mutex_lock(&p->mu);
    while (p->ndone < p->npieces) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void pool_stop(pool *p, int started) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++) pthread_join(p->th[i], NULL);
}

/* ---- directory helpers ---- */
static int dir_state(const char *path) { /* -1 absent, 0 empty dir, 1 non-empty or not a dir */
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return 1;
    DIR *d = opendir(path);
    if (!d) return 1;
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) { n = 1; break; }
    closedir(d);
    return n;
}

static void remove_tree(const char *path) { /* flat directory of files */
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    char f[4608];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(f, sizeof f, "%s/%s", path, de->d_name);
        unlink(f);
    }
    closedir(d);
    rmdir(path);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct progress {
    int on;                 /* allowed at all */
    int tty;                /* stderr is a terminal: show from the start */
    int shown;              /* a line was printed (needs a final newline) */
    double t0, last;        /* start, last print */
    int64_t total;          /* bytes */
} progress;

static void progress_show(progress *pr, int64_t done, int final) {
    if (!pr->on) return;
    double t = now_s();
    if (!final && t - pr->last < 0.2) return;
    if (!pr->tty && !pr->shown && t - pr->t0 < 1.0) return;
    if (final && !pr->shown) return;
    double el = t - pr->t0 > 1e-6 ? t - pr->t0 : 1e-6;
    fprintf(stderr, "\rmake-model: %.1f / %.1f MB (%3.0f%%), %.0f MB/s   ", (double)done / 1e6,
            (double)pr->total / 1e6, pr->total ? 100.0 * (double)done / (double)pr->total : 100.0,
            (double)done / 1e6 / el);
    pr->shown = 1;
    pr->last = t;
}

static void progress_end(progress *pr) {
    if (pr->shown) { fputc('\n', stderr); pr->shown = 0; }
}

/* ---- the writer loop ---- */
static int write_index(const char *tmpdir, const mm_list *ls, char (*fnames)[64], int64_t total, sm_err *e) {
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    if (!root || !meta || !wm) { json_decref(root); json_decref(meta); json_decref(wm); return sm_errf(e, "make-model: out of memory"); }
    json_object_set_new(meta, "total_size", json_integer(total));
    json_object_set_new(root, "metadata", meta);
    for (int i = 0; i < ls->n; i++) json_object_set_new(wm, ls->t[i].name, json_string(fnames[ls->t[i].shard]));
    json_object_set_new(root, "weight_map", wm);
    char path[4608];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmpdir);
    sm_outfile of; /* temporary file, fsync, rename (outfile.h) */
    if (sm_outfile_open(&of, path, e)) { json_decref(root); return -1; }
    int rc = json_dumpf(root, of.f, JSON_INDENT(2));
    json_decref(root);
    if (rc) {
        sm_outfile_abort(&of);
        return sm_errf(e, "%s: cannot write", path);
    }
    return sm_outfile_commit(&of, e);
}

int sm_make_cycle_ids(const sm_config *c, int n, int *ids, sm_err *e) {
    if (n < 2 || n > SM_MAKE_MAX_CYCLE) return sm_errf(e, "make-model: cycle of %d ids is not in [2, %d]", n, SM_MAKE_MAX_CYCLE);
    int k = 0;
    for (int v = 0; v < c->vocab_used && k < n; v++) {
        int special = v == c->bos || v == c->pad;
        for (int i = 0; i < c->n_eos; i++) special |= v == c->eos[i];
        if (!special) ids[k++] = v;
    }
    if (k < n)
        return sm_errf(e, "make-model: a cycle of %d ids needs %d ids below vocab_used = %d that are not bos, eos or pad; there are %d",
                       n, n, c->vocab_used, k);
    return 0;
}

static int stopped(const sm_make_opts *o) { return o->stop && *o->stop; }

/* Everything one sm_make_model call holds; mm_release frees it. */
typedef struct mm_job {
    const sm_config *c;
    const sm_make_opts *o;
    char out[3900];            /* the output directory */
    char tmp[4000];            /* the temporary directory it is written under */
    int tmp_made;              /* tmp exists (removed on failure) */
    int *cyc;                  /* [o->cycle] cycle ids, or NULL */
    mm_list ls;                /* the tensors in file order */
    int K;                     /* files */
    char (*fnames)[64];        /* [K] their names */
    int64_t total, maxcols;    /* bytes of all tensors; widest logical row */
    pool p;                    /* the generation workers */
    worker_arg *wa;            /* [p.nw] */
    int started, pool_init;    /* workers running; p's mutex and conditions initialized */
    uint8_t *buf[2];           /* two chunk buffers: one generated while the other is written */
    st_writer w;               /* the file being written */
    int wopen;                 /* w is open */
    progress pr;
    int64_t written;           /* bytes written so far */
} mm_job;

/* The cycle ids of a cycle model (o->cycle != 0). */
static int mm_cycle(mm_job *j, sm_err *e) {
    const sm_make_opts *o = j->o;
    if (!o->cycle) return 0;
    if (o->cycle < 2 || o->cycle > SM_MAKE_MAX_CYCLE)
        return sm_errf(e, "make-model: cycle of %d ids is not in [2, %d]", o->cycle, SM_MAKE_MAX_CYCLE);
    j->cyc = malloc(sizeof(int) * (size_t)o->cycle);
    if (!j->cyc) return sm_errf(e, "make-model: out of memory");
    return sm_make_cycle_ids(j->c, o->cycle, j->cyc, e);
}

/* tokenizer.json (and tokenizer_config.json) in dir: a byte-level BPE (tokenizer.h) whose special
 * tokens are the config's pad, bos and eos ids and whose other ids are below vocab_used; none
 * when the 256 byte tokens do not fit there. */
static int mm_tokenizer(const sm_config *c, const char *dir, sm_err *e) {
    sm_tok_special sp[2 + SM_MAX_EOS];
    char names[SM_MAX_EOS][24];
    int n = 0, below = 0;
    for (int i = -2; i < c->n_eos; i++) {
        int id = i == -2 ? c->pad : i == -1 ? c->bos : c->eos[i];
        const char *nm = i == -2 ? "<|pad|>" : i == -1 ? "<|bos|>" : names[i];
        if (i >= 0) snprintf(names[i], sizeof names[i], i ? "<|eos_%d|>" : "<|eos|>", i);
        int dup = id < 0;
        for (int k = 0; k < n; k++) dup |= sp[k].id == id;
        if (dup) continue;
        sp[n++] = (sm_tok_special){nm, id};
        below += id < c->vocab_used;
    }
    if (c->vocab_used - below < 256) return 0;
    char path[4608];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (sm_tokenizer_write_trained(path, sp, n, c->vocab_used, NULL, e)) return -1;
    return sm_make_chat_config(dir, c->bos >= 0 ? "<|bos|>" : NULL, "<|eos|>", e); /* the chat template */
}

/* The output directory (trailing slashes dropped): refuse a non-empty one; create the
 * temporary <out>.tmp.<pid> and write config.json and tokenizer.json into it. */
static int mm_outdir(mm_job *j, const char *outdir, sm_err *e) {
    size_t ol = strlen(outdir);
    while (ol > 1 && outdir[ol - 1] == '/') ol--;
    if (ol == 0 || ol >= sizeof j->out) return sm_errf(e, "make-model: bad output path '%s'", outdir);
    memcpy(j->out, outdir, ol);
    j->out[ol] = 0;
    if (dir_state(j->out) == 1) return sm_errf(e, "%s: output exists and is not an empty directory", j->out);
    snprintf(j->tmp, sizeof j->tmp, "%s.tmp.%ld", j->out, (long)getpid());
    if (mkdir(j->tmp, 0755) != 0) return sm_errf(e, "%s: cannot create directory: %s", j->tmp, strerror(errno));
    j->tmp_made = 1;
    char path[4608];
    snprintf(path, sizeof path, "%s/config.json", j->tmp);
    if (j->o->activations == SM_ACTS_AUTO) { /* no quantization_config */
        if (sm_config_save(j->c, path, e)) return -1;
    } else { /* Quark's, as its MXFP4 export writes it: W4A4 (mxfp4) or weight-only (bf16) */
        char *q;
        if (sm_quant_quark_json(j->c, j->o->activations == SM_ACTS_MXFP4, &q, e)) return -1;
        int rc = sm_config_save_with(j->c, "quantization_config", q, path, e);
        free(q);
        if (rc) return -1;
    }
    return mm_tokenizer(j->c, j->tmp, e);
}

/* The files: contiguous runs of the list of about total/K bytes each, every file non-empty. */
static int mm_shards(mm_job *j, sm_err *e) {
    mm_list *ls = &j->ls;
    int K = j->K = j->o->shards;
    if (K > ls->n) return sm_errf(e, "make-model: --shards %d exceeds the %d tensors", K, ls->n);
    int64_t cum = 0;
    j->total = 0;
    j->maxcols = 32;
    for (int i = 0; i < ls->n; i++) {
        j->total += ls->t[i].nbytes;
        if (ls->t[i].cols > j->maxcols) j->maxcols = ls->t[i].cols;
    }
    for (int i = 0, prev = 0; i < ls->n; i++) {
        int s = (int)((double)cum * K / (double)j->total);
        if (s > prev + 1) s = prev + 1;
        if (s < prev) s = prev;
        if (s < K - (ls->n - i)) s = K - (ls->n - i);
        if (s > K - 1) s = K - 1;
        ls->t[i].shard = prev = s;
        cum += ls->t[i].nbytes;
    }
    j->fnames = calloc((size_t)K, sizeof *j->fnames);
    if (!j->fnames) return sm_errf(e, "make-model: out of memory");
    for (int k = 0; k < K; k++) {
        if (K == 1) snprintf(j->fnames[k], 64, "model.safetensors");
        else snprintf(j->fnames[k], 64, "model-%05d-of-%05d.safetensors", k + 1, K);
    }
    return 0;
}

/* The workers (o->threads, else one per core and at least 2; at most 64), their scratch, the
 * MXFP4 scale memo and the two chunk buffers. */
static int mm_pool_start(mm_job *j, sm_err *e) {
    const sm_config *c = j->c;
    pool *p = &j->p;
    long ncpu = j->o->threads > 0 ? j->o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    p->nw = ncpu < 2 && j->o->threads <= 0 ? 2 : ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu;
    p->seed = j->o->seed;
    p->th = calloc((size_t)p->nw, sizeof *p->th);
    p->scratch = calloc((size_t)p->nw, sizeof *p->scratch);
    j->wa = calloc((size_t)p->nw, sizeof *j->wa);
    size_t s1, s2; /* MXFP4 scale bytes of gate_up and down */
    sm_expert_mat_bytes(SM_EXP_MXFP4, 2 * (int64_t)c->I, c->Hm, NULL, &s1);
    sm_expert_mat_bytes(SM_EXP_MXFP4, c->Hm, c->I, NULL, &s2);
    p->mo.cap = (int64_t)(s1 > s2 ? s1 : s2);
    p->mo.buf = malloc((size_t)p->mo.cap);
    int64_t maxt = 0;
    for (int i = 0; i < j->ls.n; i++)
        if (j->ls.t[i].nbytes > maxt) maxt = j->ls.t[i].nbytes;
    int64_t bsz = maxt < CHUNK ? maxt : CHUNK;
    j->buf[0] = malloc((size_t)bsz + 64);
    j->buf[1] = malloc((size_t)bsz + 64);
    if (!p->th || !p->scratch || !j->wa || !p->mo.buf || !j->buf[0] || !j->buf[1]) return sm_errf(e, "make-model: out of memory");
    for (int i = 0; i < p->nw; i++) {
        p->scratch[i] = malloc(sizeof(float) * (size_t)(BATCH + j->maxcols));
        if (!p->scratch[i]) return sm_errf(e, "make-model: out of memory");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    j->pool_init = 1;
    for (int i = 0; i < p->nw; i++) {
        j->wa[i].p = p;
        j->wa[i].id = i;
        if (pthread_create(&p->th[i], NULL, worker, &j->wa[i]) != 0) break;
        j->started++;
    }
    if (j->started == 0) return sm_errf(e, "make-model: cannot start worker threads");
    return 0;
}

/* Write n bytes of buffer b (a generated chunk) to the open file. */
static int mm_put(mm_job *j, const uint8_t *b, int64_t n, sm_err *e) {
    if (st_writer_write(&j->w, b, (size_t)n, e)) return -1;
    j->written += n;
    progress_show(&j->pr, j->written, 0);
    return 0;
}

/* File k: tensors [*ti, ...) of shard k, in chunks: chunk c is generated while chunk c - 1 is
 * written.  1 when interrupted. */
static int mm_write_shard(mm_job *j, int k, int *ti, sm_err *e) {
    pool *p = &j->p;
    char path[4608];
    snprintf(path, sizeof path, "%s/%s", j->tmp, j->fnames[k]);
    if (st_writer_open(&j->w, path, e)) return -1;
    j->wopen = 1;
    int t0 = *ti, t1 = *ti;
    while (t1 < j->ls.n && j->ls.t[t1].shard == k) t1++;
    for (int i = t0; i < t1; i++)
        if (st_writer_declare(&j->w, j->ls.t[i].name, j->ls.t[i].dt, j->ls.t[i].ndim, j->ls.t[i].shape, e)) return -1;
    int cur = 0, have_prev = 0;
    int64_t prev_n = 0;
    for (int i = t0; i < t1; i++) {
        mm_tensor *t = &j->ls.t[i];
        int64_t u = unit_of(t), ch = CHUNK / u * u;
        if (ch < u) ch = u;
        if (t->kind == G_MX_W) {
            p->mo.valid = 0;
            p->mo.active = t->nbytes / 16 <= p->mo.cap;
            p->mo.layer = t->layer; p->mo.expert = t->expert; p->mo.proj = t->proj;
        }
        for (int64_t b = 0; b < t->nbytes; b += ch) {
            int64_t n = t->nbytes - b < ch ? t->nbytes - b : ch;
            if (stopped(j->o)) return 1; /* no job in flight here */
            pool_submit(p, t, b, b + n, j->buf[cur]);
            if (have_prev && mm_put(j, j->buf[cur ^ 1], prev_n, e)) { pool_wait(p); return -1; }
            pool_wait(p);
            have_prev = 1;
            prev_n = n;
            cur ^= 1;
        }
        if (t->kind == G_MX_W) { p->mo.valid = p->mo.active; p->mo.active = 0; }
    }
    if (have_prev && mm_put(j, j->buf[cur ^ 1], prev_n, e)) return -1;
    if (st_writer_finish(&j->w, e)) return -1;
    st_writer_abort(&j->w); /* frees; no-op on the file after finish */
    j->wopen = 0;
    *ti = t1;
    return 0;
}

/* Every file, the index of a sharded model, then the rename of the temporary directory.  1
 * when interrupted. */
static int mm_write(mm_job *j, sm_err *e) {
    j->pr.on = j->o->progress;
    j->pr.tty = isatty(2);
    j->pr.t0 = j->pr.last = now_s();
    j->pr.total = j->total;
    for (int k = 0, ti = 0; k < j->K; k++) {
        int rc = mm_write_shard(j, k, &ti, e);
        if (rc) return rc;
    }
    if (j->K > 1 && write_index(j->tmp, &j->ls, j->fnames, j->total, e)) return -1;
    if (stopped(j->o)) return 1;
    progress_show(&j->pr, j->written, 1);
    progress_end(&j->pr);
    if (rename(j->tmp, j->out) != 0) return sm_errf(e, "%s: cannot rename %s to it: %s", j->out, j->tmp, strerror(errno));
    j->tmp_made = 0;
    return 0;
}

/* Stop the workers and free everything; on failure remove the temporary directory. */
static void mm_release(mm_job *j) {
    progress_end(&j->pr);
    if (j->wopen) st_writer_abort(&j->w);
    if (j->tmp_made) remove_tree(j->tmp);
    pool *p = &j->p;
    if (j->pool_init) {
        pool_stop(p, j->started);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
    }
    if (p->scratch)
        for (int i = 0; i < p->nw; i++) free(p->scratch[i]);
    free(p->scratch);
    free(p->th);
    free(j->wa);
    free(p->mo.buf);
    free(j->buf[0]);
    free(j->buf[1]);
    free(j->fnames);
    free(j->ls.t);
    free(j->cyc);
}

int sm_make_model(const sm_config *c, const sm_make_opts *o, const char *outdir, sm_err *e) {
    if (sm_config_validate(c, "make-model", e)) return -1;
    if (o->experts != SM_EXP_BF16 && o->experts != SM_EXP_FP8 && o->experts != SM_EXP_MXFP4)
        return sm_errf(e, "make-model: unknown expert format %d", (int)o->experts);
    if (o->shards < 1) return sm_errf(e, "make-model: shards must be >= 1 (got %d)", o->shards);
    if (o->activations != SM_ACTS_AUTO && o->experts != SM_EXP_MXFP4)
        return sm_errf(e, "make-model: activations %s declare a Quark MXFP4 quantization_config: they need MXFP4 experts",
                       sm_acts_name(o->activations));
    mm_job *j = calloc(1, sizeof *j);
    if (!j) return sm_errf(e, "make-model: out of memory");
    j->c = c;
    j->o = o;
    int rc = mm_cycle(j, e);
    if (!rc) rc = mm_outdir(j, outdir, e);
    if (!rc) rc = build_list(c, o, j->cyc, &j->ls, e);
    if (!rc) rc = mm_shards(j, e);
    if (!rc) rc = mm_pool_start(j, e);
    if (!rc) rc = mm_write(j, e);
    if (rc > 0) rc = sm_errf(e, "make-model: interrupted; removed the partial output %s", j->tmp);
    mm_release(j);
    free(j);
    return rc;
}
