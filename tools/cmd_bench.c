/* cmd_bench.c: `sparkmono bench`: verify-step timing of the CUDA stock path beside its memory
 * floor.
 *
 * For each row count N of --step-rows, a verify step of N rows = N / R requests of R rows each
 * (R = 8, the engine's default verify width: the last token and 7 drafts; --requests Q makes
 * it Q requests of N / Q rows; a row count below 8 is one request), every request with --ctx
 * tokens already in the cache (random bf16 pages, never zeros) and random tokens.  After a
 * warm-up the step is replayed --iters times as a CUDA graph (metadata copy + replay timed
 * with CUDA events), rotating over --sets input sets; the median is reported beside the bytes
 * the step must read: dense weights of every layer, lm_head, the embedding rows, the DISTINCT
 * experts its rows routed to in every layer (read back from the device after the step) and the
 * KV keys its rows attend to; floor = bytes / read bandwidth measured in the same run by a
 * read-only streaming kernel.  Then a per-layer table: each layer alone and its MoE stage alone,
 * each a graph timed the same way; with --phases, one traced step per path and each phase of
 * the median MXFP4 layer beside its own floor (its weights at the same bandwidth), one line
 * each (bench_phase_line).  --preset builds the model on the device (no checkpoint);
 * --model loads one.  We rejected timing single launches with host clocks: launch gaps and
 * host jitter would dominate the small row counts.
 */
#include "cli.h"
#include "model/config.h"
#include "backend/kvcache.h"
#include "model/weights.h"
#include "backend/backend.h"
#include "model/rng.h"
#include "parallel/shard.h"
#include "backend/stats.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef SM_HAVE_CUDA
#include "cuda/rank/synth.h"
#include "cuda/bench/bench.h"
#endif

#define B_DEFAULT_R 8

typedef struct bench_args {
    const char *preset;     /* --preset P, or NULL */
    const char *model;      /* --model DIR, or NULL */
    int fmt;                /* expert format of the preset's layers 1..L-2 */
    int online_mxfp4;       /* --online-mxfp4 with --model */
    sm_acts activations;    /* --activations (SM_ACTS_AUTO when not given): with --model the load
                               option; with --preset for the synthesized model */
    int *step_rows; int nstep_rows; /* [nstep_rows] rows of a verify step (all requests) */
    int ctx;                /* tokens already in every request's cache */
    int iters;              /* timed steps per row count (>= 20) */
    int warmup;             /* untimed steps first */
    int requests;           /* 0: step rows / 8 */
    int sets;               /* input sets rotated (>= 2) */
    int layers;             /* preset layer override, 0 = the preset's */
    uint64_t seed;
    double bw_gib;          /* size of the bandwidth probe */
    int mono;               /* 0 both (stock, then the monokernel where eligible), 1 mono only, 2 stock only */
    const char *trace;      /* --trace FILE.json: a traced monokernel step, or NULL */
    int phases;             /* --phases: per row count and path, the layer phases of one traced step */
    int ttft;               /* --ttft: time to first token with and without the prefix cache */
    int masks;              /* --masks: whole steps with and without a constraint mask on every row */
    cli_world_sel ws;       /* --world W (--moe, --devices, --comm): W ranks, stock steps */
} bench_args;

static int parse_fmt(const char *s, int *fmt, sm_err *e) {
    if (!strcmp(s, "bf16")) *fmt = SM_EXP_BF16;
    else if (!strcmp(s, "fp8")) *fmt = SM_EXP_FP8;
    else if (!strcmp(s, "mxfp4")) *fmt = SM_EXP_MXFP4;
    else return sm_errf(e, "bench: --experts '%s' is not one of mxfp4, bf16, fp8", s);
    return 0;
}

/* Requests and rows per request (R) of a step of n = step rows. */
static int split_rows(const bench_args *a, int n, int *nreq, int *R, sm_err *e) {
    if (a->requests > 0) {
        if (n % a->requests)
            return sm_errf(e, "bench: --step-rows %d is not a multiple of --requests %d", n, a->requests);
        *nreq = a->requests;
        *R = n / a->requests;
    } else if (n <= B_DEFAULT_R) {
        *nreq = 1;
        *R = n;
    } else {
        if (n % B_DEFAULT_R)
            return sm_errf(e, "bench: --step-rows %d is not a multiple of %d (or give --requests)", n, B_DEFAULT_R);
        *nreq = n / B_DEFAULT_R;
        *R = B_DEFAULT_R;
    }
    if (*R > 16) return sm_errf(e, "bench: %d rows a request (--step-rows %d): a verify step takes at most 16", *R, n);
    return 0;
}

const cli_cmd cli_help_bench = {
    "bench",
    "verify-step benchmark of the CUDA stock path beside its memory floor (GPU)",
    "(--preset P | --model DIR) [options]",
    "sparkmono bench --preset spark1x-l4 --experts mxfp4 --step-rows 8,16,32,64,128 --ctx 1024",
    "A step of N rows is N / 8 requests of 8 rows (the last token + 7 drafts), or --requests Q\n"
    "requests of N / Q rows; below 8 rows it is one request.  Each step is replayed as a CUDA\n"
    "graph and its median printed beside the bytes it must read and the floor they set; then a\n"
    "per-layer table and a summary.  --phases adds, per row count and path, one line per phase of\n"
    "the median MXFP4 layer: layer-phase PATH ROWS NAME US us floor FLOOR us PCT% (no weights:\n"
    "floor - us -), then its total and latency (the phases without weights).  See bench/README.md.",
};

static int parse_args(int argc, char **argv, bench_args *a, sm_err *e) {
    cli_opt opts[] = {
        CLI_OPT("preset", "P", NULL, "synthesize this preset's weights on the device (tiny, mini, spark1x, spark1x-l4)"),
        CLI_OPT("model", "DIR", NULL, "load a checkpoint instead"),
        CLI_OPT("experts", "mxfp4|bf16|fp8", "mxfp4", "with --preset: expert format of layers 1..L-2"),
        CLI_SWITCH("online-mxfp4", "with --model: round BF16 experts of layers 1..L-2 to MXFP4 at load"),
        CLI_ACTS_OPT,
        CLI_OPT("step-rows", "LIST", "8,16,32,64,128", "rows per verify step (all requests together), one timing each"),
        CLI_OPT("ctx", "N", "1024", "tokens already in every request's KV cache"),
        CLI_OPT("iters", "N", "50", "timed steps per row count, at least 20 (the median is reported)"),
        CLI_OPT("warmup", "N", "5", "untimed steps first"),
        CLI_OPT("requests", "Q", "step-rows / 8", "requests per step, each of step-rows / Q rows"),
        CLI_OPT("sets", "N", "2", "input sets rotated between timed steps"),
        CLI_OPT("layers", "N", "the preset's", "with --preset: number of layers"),
        CLI_OPT("seed", "N", "1", "seed of the synthesized weights, cache and tokens"),
        CLI_OPT("bw-gib", "N", "4", "GiB read by the bandwidth probe"),
        CLI_OPT("mono", "both|on|off", "both", "stock and monokernel timed in the same run (both), or one of them"),
        CLI_OPT("trace", "FILE", NULL, "trace one monokernel step of every row count: print each one's per-phase times; FILE gets the first one's Chrome / Perfetto trace (one track per SM)"),
        CLI_SWITCH("phases", "per row count, after the timed steps: one traced step per path (stock, mono), each phase of the median MXFP4 layer (1..L-2) against its weights' floor, with the total and the latency work (the phases without weights)"),
        CLI_SWITCH("masks", "per row count: whole verify steps (host wall clock) with a structured-output mask on every row against the same steps without, the masks' cost per step"),
        CLI_SWITCH("ttft", "after the steps: time to first token of one request of ctx + 64 prompt tokens, computed whole, then with its first ctx tokens from the prefix cache"),
        CLI_WORLD_OPTS,
        CLI_RENAMED("rows", "--rows is now --step-rows LIST (rows per verify step, all requests together)"),
    };
    int no = (int)(sizeof opts / sizeof opts[0]), npos;
    const char *pos[1];
    memset(a, 0, sizeof *a);
    int pr = cli_parse(&cli_help_bench, argc, argv, opts, no, pos, 0, &npos, e);
    if (pr) return pr;
    cli_opt *o;
    a->preset = (o = cli_find(opts, no, "preset"))->present ? o->value : NULL;
    a->model = (o = cli_find(opts, no, "model"))->present ? o->value : NULL;
    if (!a->preset == !a->model) return sm_errf(e, "bench: give exactly one of --preset P and --model DIR");
    o = cli_find(opts, no, "experts");
    if (o->present && a->model) return sm_errf(e, "bench: --experts applies to --preset (a checkpoint has its own; see --online-mxfp4)");
    if (parse_fmt(cli_str(o), &a->fmt, e)) return -1;
    a->online_mxfp4 = cli_find(opts, no, "online-mxfp4")->present;
    if (a->online_mxfp4 && !a->model) return sm_errf(e, "bench: --online-mxfp4 applies to --model");
    const char *acts;
    if (cli_acts("bench", opts, no, &acts, e)) return -1;
    sm_acts_parse(acts, &a->activations);
    if (cli_int_list("bench: --step-rows", cli_str(cli_find(opts, no, "step-rows")), 1, 128, &a->step_rows, &a->nstep_rows, e)) return -1;
    long v;
    if (cli_int("bench", cli_find(opts, no, "ctx"), 0, 1 << 22, &v, e)) return -1;
    a->ctx = (int)v;
    if (cli_int("bench", cli_find(opts, no, "iters"), 20, 100000, &v, e)) return -1;
    a->iters = (int)v;
    if (cli_int("bench", cli_find(opts, no, "warmup"), 1, 10000, &v, e)) return -1;
    a->warmup = (int)v;
    if (cli_int("bench", cli_find(opts, no, "requests"), 1, 128, &v, e)) return -1;
    a->requests = (int)v;
    if (cli_int("bench", cli_find(opts, no, "sets"), 2, 64, &v, e)) return -1;
    a->sets = (int)v;
    if (cli_int("bench", cli_find(opts, no, "layers"), 1, SM_MAX_LAYERS, &v, e)) return -1;
    a->layers = (int)v;
    if (a->layers && !a->preset) return sm_errf(e, "bench: --layers applies to --preset");
    if (cli_int("bench", cli_find(opts, no, "seed"), 0, 0x7FFFFFFFL, &v, e)) return -1;
    a->seed = (uint64_t)v;
    if (cli_int("bench", cli_find(opts, no, "bw-gib"), 1, 64, &v, e)) return -1;
    a->bw_gib = (double)v;
    o = cli_find(opts, no, "mono");
    if (cli_choice("bench", o, "both|on|off", e)) return -1;
    a->mono = !strcmp(cli_str(o), "on") ? 1 : !strcmp(cli_str(o), "off") ? 2 : 0;
    a->trace = (o = cli_find(opts, no, "trace"))->present ? o->value : NULL;
    a->ttft = cli_find(opts, no, "ttft")->present;
    a->masks = cli_find(opts, no, "masks")->present;
    if (a->trace && a->mono == 2) return sm_errf(e, "bench: --trace needs the monokernel (not --mono off)");
    a->phases = cli_find(opts, no, "phases")->present;
    if (cli_world("bench", opts, no, &a->ws, e)) return -1;
    if (a->phases && a->ws.world > 1) return sm_errf(e, "bench: --phases traces the layers of one rank (not --world %d)", a->ws.world);
    if (a->phases && a->preset && a->fmt != SM_EXP_MXFP4)
        return sm_errf(e, "bench: --phases reports the MXFP4 expert layers (--experts mxfp4, not %s)", sm_expert_fmt_name((sm_expert_fmt)a->fmt));
    for (int i = 0; i < a->nstep_rows; i++) {
        int q, r;
        if (split_rows(a, a->step_rows[i], &q, &r, e)) return -1;
    }
    return 0;
}

/* One phase line of --phases into buf: "layer-phase PATH ROWS NAME US us floor FLOOR us PCT%",
 * or "... floor - us -" for a phase without a floor (floor_us <= 0); snprintf's count. */
static inline int bench_phase_line(char *buf, size_t n, const char *path, int rows, const char *name, double us, double floor_us) {
    if (floor_us > 0)
        return snprintf(buf, n, "layer-phase %s %d %s %.1f us floor %.1f us %.1f%%", path, rows, name, us, floor_us,
                        us > 0 ? 100 * floor_us / us : 0.0);
    return snprintf(buf, n, "layer-phase %s %d %s %.1f us floor - us -", path, rows, name, us);
}

#ifdef SM_HAVE_CUDA
/* kB value of a "Name:" line of /proc/self/status (-1 when unavailable). */
static long proc_status_kb(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ':') { v = strtol(line + n + 1, NULL, 10); break; }
    fclose(f);
    return v;
}


/* Bytes of the dense weights of one layer (everything but the experts) in their loaded form,
 * as the device holds them: bf16 / f32 matrices, f32 norm and gate vectors. */
static double dense_layer_bytes(const sm_config *c) {
    double b = 0;
    for (int r = 0; r < SM_T_NLAYER; r++) b += (double)sm_tensor_loaded_bytes(c, (sm_tensor_role)r);
    return b;
}

/* KV keys one request of R rows at positions ctx .. ctx+R-1 reads in layer kind `full`. */
static double kv_keys(const sm_config *c, int full, int ctx, int R) {
    double all = (double)ctx + R;
    if (full || c->window <= 0) return all;
    double w = (double)c->window + R - 1; /* union of the R rows' windows */
    return w < all ? w : all;
}

typedef struct bench_row {
    int step_rows, nreq, R; /* rows of the step = nreq requests of R rows */
    int mono;               /* timed with the monokernel */
    int acts;               /* --preset MXFP4: SM_ACTS_BF16 (W4A16) or SM_ACTS_MXFP4 (W4A4); else
                               SM_ACTS_AUTO (the checkpoint's own, as loaded) */
    int fp8;                /* W4A4 of a preset: 1 on the FP8 tensor cores, 0 with bf16 products */
    double layer_frac;      /* mean %floor of the MXFP4 layers 1..L-2 (0: none) */
    float med_us, min_us, max_us;
    double bytes, expert_bytes, dense_bytes, kv_bytes, lm_bytes;
    double rank_bytes, rank_floor_us; /* --world: the busiest rank's bytes and floor */
    float exch_us;                    /* --world: the step's exchanges alone (slowest rank) */
    double distinct;        /* distinct experts per layer, mean */
    double floor_us, frac;
} bench_row;

/* Result rows of one row count: (stock, mono) x the numerics timed (at most W4A16, W4A4 on the
 * FP8 tensor cores, W4A4 with bf16 products). */
#define BENCH_NUMERICS 3
#define BENCH_ROWS_PER_COUNT (2 * BENCH_NUMERICS)

/* Everything one benchmark run holds. */
typedef struct bench_run {
    const bench_args *a;
    sm_config cfg;          /* the model's */
    sm_model m; int have_m; /* --model: the loaded checkpoint */
    sm_kv kv;               /* every request's cache, a->ctx tokens filled */
    sm_backend be; int have_be;
    double bw;              /* measured read bandwidth, bytes/s */
    double t_load;          /* wall time the load started */
    int max_req, max_R, max_step_rows; /* over the row counts of --step-rows */
    bench_row *res;         /* [nstep_rows * BENCH_ROWS_PER_COUNT] */
    int *idx;               /* [L, max_step_rows, K] routes read back */
    int *fmt;               /* [L] expert format of each layer */
    double *xb;             /* [L] bytes one routed expert reads in each layer */
    float *ms;              /* [iters] step times */
    float *lay, *moe;       /* [L] per-layer and per-MoE-stage times, us */
    double *dist;           /* [L] distinct experts routed to */
    unsigned char *seen;    /* [E] scratch of the distinct count */
    int *tok, *am;          /* [sets, max_step_rows] tokens and argmax of each input set */
    int *pos, *req;         /* [max_step_rows] position and request of each row */
    sm_step *sets;          /* [sets] */
    int have_mono;          /* the engine has a monokernel */
    unsigned char *mx_set;  /* [L] --phases: 1 for the MXFP4 expert layers of 1..L-2 */
} bench_run;

/* Device 0 must be a Hopper GPU; its line. */
static int bench_device(sm_err *e) {
    sm_cuda_devinfo dv;
    if (sm_cuda_device_info(0, &dv, e)) return sm_errprefix(e, "bench");
    printf("device: %s (cc %d.%d, %d SMs, %.1f GB, L2 %.0f MB)\n", dv.name, dv.cc_major, dv.cc_minor, dv.sms,
           dv.mem_total / 1e9, dv.l2_bytes / 1048576.0);
    if (dv.cc_major != 9)
        return sm_errf(e, "bench: device 0 (%s) has compute capability %d.%d; this build targets sm_90a (Hopper)", dv.name,
                       dv.cc_major, dv.cc_minor);
    return 0;
}

/* The config (--preset) or the loaded checkpoint (--model); the read bandwidth first, while
 * the device is empty. */
static int bench_model(bench_run *b, sm_err *e) {
    const bench_args *a = b->a;
    if (a->preset) {
        if (sm_config_preset(a->preset, &b->cfg, e)) return sm_errprefix(e, "bench");
        if (a->layers && sm_config_set_layers(&b->cfg, a->layers, e)) return sm_errprefix(e, "bench");
    }
    if (sm_cuda_read_bandwidth(0, a->bw_gib, 5, &b->bw, e)) return sm_errprefix(e, "bench");
    printf("read bandwidth: %.0f GB/s (read-only streaming kernel over %.0f GiB, best of 5)\n", b->bw / 1e9, a->bw_gib);
    b->t_load = cli_now();
    if (a->model) {
        sm_load_opts lo = {0};
        lo.online_mxfp4 = a->online_mxfp4;
        lo.activations = a->activations;
        if (sm_model_load(a->model, &lo, &b->m, e)) return sm_errprefix(e, "bench");
        b->have_m = 1;
        b->cfg = b->m.cfg;
    }
    return 0;
}

/* The widest step, request and request count of --step-rows, and the host buffers. */
static int bench_alloc(bench_run *b, sm_err *e) {
    const bench_args *a = b->a;
    const sm_config *c = &b->cfg;
    b->max_req = b->max_R = b->max_step_rows = 1;
    for (int i = 0; i < a->nstep_rows; i++) {
        int q, r;
        split_rows(a, a->step_rows[i], &q, &r, e);
        if (q > b->max_req) b->max_req = q;
        if (r > b->max_R) b->max_R = r;
        if (a->step_rows[i] > b->max_step_rows) b->max_step_rows = a->step_rows[i];
    }
    size_t L = (size_t)c->L, N = (size_t)b->max_step_rows, S = (size_t)a->sets;
    b->res = calloc((size_t)a->nstep_rows * BENCH_ROWS_PER_COUNT, sizeof *b->res);
    b->idx = malloc(sizeof(int) * L * N * (size_t)c->K);
    b->fmt = malloc(sizeof(int) * L);
    b->xb = malloc(sizeof(double) * L);
    b->ms = malloc(sizeof(float) * (size_t)a->iters);
    b->lay = malloc(sizeof(float) * L);
    b->moe = malloc(sizeof(float) * L);
    b->dist = malloc(sizeof(double) * L);
    b->seen = malloc((size_t)c->E);
    b->tok = malloc(sizeof(int) * S * N);
    b->am = malloc(sizeof(int) * S * N);
    b->pos = malloc(sizeof(int) * N);
    b->req = malloc(sizeof(int) * N);
    b->sets = calloc(S, sizeof *b->sets);
    if (!b->res || !b->idx || !b->fmt || !b->xb || !b->ms || !b->lay || !b->moe || !b->dist || !b->seen || !b->tok || !b->am ||
        !b->pos || !b->req || !b->sets)
        return sm_errf(e, "bench: out of host memory");
    return 0;
}

/* The KV cache (max_req requests of ctx + max_R positions), the backend (synthesized or
 * loaded), the cache filled; prints the load and the model. */
static int bench_backend(bench_run *b, sm_err *e) {
    const bench_args *a = b->a;
    const sm_config *c = &b->cfg;
    int max_len = a->ctx + (a->ttft && b->max_R < 64 ? 64 : b->max_R); /* --ttft: ctx + 64 prompt tokens */
    int nblocks = b->max_req * ((max_len + SM_KV_BLOCK - 1) / SM_KV_BLOCK);
    if (sm_kv_init(&b->kv, nblocks, b->max_req, max_len, a->seed, e)) return sm_errprefix(e, "bench");
    for (int r = 0; r < b->max_req; r++) {
        int slot;
        if (sm_kv_add(&b->kv, &slot, e) || sm_kv_reserve(&b->kv, slot, max_len, e)) return sm_errprefix(e, "bench");
    }
    sm_backend_opts bo = {0};
    bo.world = a->ws.world;
    bo.moe_tp = a->ws.moe_tp;
    bo.comm = a->ws.comm && !strcmp(a->ws.comm, "nccl") ? SM_COMM_NCCL : SM_COMM_PEER;
    bo.devices = a->ws.devices ? a->ws.dev : NULL;
    bo.max_rows = b->max_step_rows;
    /* --world is validated here, where it enters (shard.h's validator; the backend asserts it) */
    const sm_moe_layout moe = sm_moe_layout_of(bo.moe_tp);
    if (a->preset ? sm_shard_check_config(c, bo.world, moe, e) : sm_shard_check(&b->m, bo.world, moe, e))
        return sm_errprefix(e, "bench: --world %d --moe %s", bo.world, sm_moe_layout_name(moe));
    if (a->preset) {
        fprintf(stderr, "bench: generating %s (%d layers, %s experts) on the device\n", a->preset, c->L,
                sm_expert_fmt_name((sm_expert_fmt)a->fmt));
        if (sm_cuda_backend_create_synth(c, a->fmt, a->seed, &b->kv, &bo, &b->be, e)) return sm_errprefix(e, "bench");
    } else if (sm_cuda_backend_create(&b->m, &b->kv, &bo, &b->be, e)) {
        return sm_errprefix(e, "bench");
    }
    b->have_be = 1;
    if (a->model) {
        /* load = map + validate + upload; RssAnon is host memory beyond the (file-backed)
         * page cache of the mapped checkpoint, VmHWM the peak of both together */
        double secs = cli_now() - b->t_load, gb = 0;
        for (int i = 0; i < b->m.ar.nfiles; i++) gb += (double)b->m.ar.files[i].size / 1e9;
        printf("load: %.2f GB of checkpoint in %.2f s (%.2f GB/s); host RssAnon %.0f MiB, peak RSS (VmHWM, mapped pages included) %.0f MiB\n",
               gb, secs, gb / secs, proc_status_kb("RssAnon") / 1024.0, proc_status_kb("VmHWM") / 1024.0);
    }
    if (sm_cuda_bench_fill_kv(&b->be, a->seed, e) || sm_cuda_bench_layer_info(&b->be, b->fmt, b->xb, e))
        return sm_errprefix(e, "bench");
    printf("model: %s, L %d, H %d, Hm %d, I %d, E %d, K %d, nH %d, nKV %d, V %d, window %d; experts by layer:",
           a->preset ? a->preset : a->model, c->L, c->H, c->Hm, c->I, c->E, c->K, c->nH, c->nKV, c->V, c->window);
    for (int l = 0; l < c->L; l++) printf(" %s", sm_expert_fmt_name((sm_expert_fmt)b->fmt[l]));
    printf("\nsteps: ctx %d, %d timed (median) after %d warm-up, %d input sets rotated\n\n", a->ctx, a->iters, a->warmup,
           a->sets);
    fflush(stdout);
    return 0;
}

/* The input sets of a step of step_rows rows = nreq requests of R rows: request i / R, position
 * ctx + i % R, random tokens. */
static void bench_inputs(bench_run *b, int step_rows, int R, uint64_t *rng) {
    for (int i = 0; i < step_rows; i++) {
        b->req[i] = i / R;
        b->pos[i] = b->a->ctx + i % R;
    }
    for (int si = 0; si < b->a->sets; si++) {
        int *tok = b->tok + (size_t)si * b->max_step_rows;
        for (int i = 0; i < step_rows; i++) tok[i] = (int)(sm_rng_next(rng) % (uint64_t)b->cfg.vocab_used);
        sm_step *s = &b->sets[si];
        memset(s, 0, sizeof *s);
        s->nrows = step_rows;
        s->tokens = tok;
        s->pos = b->pos;
        s->req = b->req;
        s->kv = &b->kv;
        s->argmax = b->am + (size_t)si * b->max_step_rows;
    }
}

/* Distinct experts of each layer the last step's step_rows rows routed to, into b->dist;
 * returns their sum. */
static int bench_distinct(bench_run *b, int step_rows, double *sum, sm_err *e) {
    const sm_config *c = &b->cfg;
    if (sm_cuda_bench_routing(&b->be, step_rows, b->idx, e)) return sm_errprefix(e, "bench");
    *sum = 0;
    for (int l = 0; l < c->L; l++) {
        const int *v = b->idx + (size_t)l * step_rows * c->K;
        int d = 0;
        memset(b->seen, 0, (size_t)c->E);
        for (int j = 0; j < step_rows * c->K; j++)
            if (v[j] >= 0 && v[j] < c->E && !b->seen[v[j]]) b->seen[v[j]] = 1, d++;
        b->dist[l] = d;
        *sum += d;
    }
    return 0;
}

/* Bytes of the experts layer l reads: the distinct experts its rows routed to (b->dist, the
 * last bench_distinct) times the device bytes of one. */
static double bench_expert_bytes(const bench_run *b, int l) { return b->dist[l] * b->xb[l]; }

/* Bytes of KV keys and values a step's nreq requests of R rows read in layer l. */
static double bench_kv_bytes(const bench_run *b, int l, int nreq, int R) {
    const sm_config *c = &b->cfg;
    return nreq * kv_keys(c, c->full[l], b->a->ctx, R) * c->nKV * 2.0 * c->D * 2.0;
}

/* The whole step of br->step_rows rows timed as a graph: median, bytes it reads, its floor. */
static int bench_step(bench_run *b, bench_row *br, sm_err *e) {
    const bench_args *a = b->a;
    const sm_config *c = &b->cfg;
    if (sm_cuda_bench_steps(&b->be, b->sets, a->sets, a->warmup, a->iters, b->ms, NULL, e))
        return sm_errprefix(e, "bench: %d rows", br->step_rows);
    br->med_us = 1000.0f * sm_median(b->ms, a->iters); /* sorts: min first, max last */
    br->min_us = 1000.0f * b->ms[0];
    br->max_us = 1000.0f * b->ms[a->iters - 1];
    double dsum, xbytes = 0, kvb = 0;
    if (bench_distinct(b, br->step_rows, &dsum, e)) return -1;
    for (int l = 0; l < c->L; l++) {
        xbytes += bench_expert_bytes(b, l);
        kvb += bench_kv_bytes(b, l, br->nreq, br->R);
    }
    br->distinct = dsum / c->L;
    br->expert_bytes = xbytes;
    br->dense_bytes = dense_layer_bytes(c) * c->L;
    br->kv_bytes = kvb;
    br->lm_bytes = (double)c->V * c->H * 2 + (double)br->step_rows * c->H * 2; /* lm_head + embedding rows */
    br->bytes = br->dense_bytes + br->lm_bytes + br->expert_bytes + br->kv_bytes;
    br->floor_us = br->bytes / b->bw * 1e6;
    br->frac = br->floor_us / br->med_us;
    printf("%s step of %3d rows (%2d x %2d): median %9.1f us (min %.1f, max %.1f); reads %.3f GB (dense %.3f, lm_head+embed %.3f, "
           "experts %.3f [%.1f distinct/layer], kv %.3f); floor %.1f us = %.1f%%\n",
           br->mono ? "mono " : "stock", br->step_rows, br->nreq, br->R, br->med_us, br->min_us, br->max_us, br->bytes / 1e9, br->dense_bytes / 1e9,
           br->lm_bytes / 1e9, br->expert_bytes / 1e9, br->distinct, br->kv_bytes / 1e9, br->floor_us, 100 * br->frac);
    return 0;
}

/* Each layer alone and its MoE stage alone, as graphs, beside the layer's floor. */
static int bench_layers(bench_run *b, bench_row *br, sm_err *e) {
    const sm_config *c = &b->cfg;
    float head = 0;
    double dsum, dense = dense_layer_bytes(c), lm = (double)c->V * c->H * 2;
    if (sm_cuda_bench_layers(&b->be, &b->sets[0], b->a->iters, b->lay, b->moe, &head, e)) return sm_errprefix(e, "bench");
    /* the routes the per-layer graphs ran with (each layer graph re-routes its own input) */
    if (bench_distinct(b, br->step_rows, &dsum, e)) return -1;
    float sum = head;
    double fsum = 0;
    int nf = 0;
    for (int l = 0; l < c->L; l++) {
        double lb = dense + bench_expert_bytes(b, l) + bench_kv_bytes(b, l, br->nreq, br->R);
        if (l >= 1 && l <= c->L - 2 && b->fmt[l] == SM_EXP_MXFP4) { fsum += lb / b->bw * 1e6 / b->lay[l]; nf++; }
        printf("  layer %3d %-7s %-5s: %9.1f us (moe %9.1f us, %3.0f experts; layer floor %8.1f us = %5.1f%%)\n", l,
               c->full[l] ? "full" : "sliding", sm_expert_fmt_name((sm_expert_fmt)b->fmt[l]), b->lay[l], b->moe[l],
               b->dist[l], lb / b->bw * 1e6, 100 * lb / b->bw * 1e6 / b->lay[l]);
        sum += b->lay[l];
    }
    printf("  embed+logits      : %9.1f us (lm_head floor %.1f us); sum of parts %.1f us vs step %.1f us\n\n", head,
           lm / b->bw * 1e6, sum, br->med_us);
    br->layer_frac = nf ? fsum / nf : 0;
    fflush(stdout);
    return 0;
}

/* --phases: the layers its medians run over (the MXFP4 expert layers of 1..L-2, the
 * monokernel's layers; the same set for both paths). */
static int bench_phase_set(bench_run *b, sm_err *e) {
    const sm_config *c = &b->cfg;
    int n = 0;
    if (!(b->mx_set = calloc((size_t)c->L, 1))) return sm_errf(e, "bench: out of host memory");
    for (int l = 1; l <= c->L - 2; l++) n += b->mx_set[l] = b->fmt[l] == SM_EXP_MXFP4;
    if (!n) return sm_errf(e, "bench --phases: no layer of 1..L-2 of this model (L %d) has MXFP4 experts", c->L);
    return 0;
}

/* A preset's activations of row br as the tables name them (w4a16, w4a4f: W4A4 on the FP8
 * tensor cores, w4a4b: with bf16 products); NULL for a checkpoint's own. */
static const char *bench_acts_name(const bench_row *br) {
    if (br->acts == SM_ACTS_MXFP4) return br->fp8 ? "w4a4f" : "w4a4b";
    return br->acts == SM_ACTS_BF16 ? "w4a16" : NULL;
}

/* --phases: one traced step of set 0 on br's path (the same inputs as its timed steps), each
 * layer phase's median over the MXFP4 layers beside its floor: its weights' bytes
 * (model/tensors.h; the experts: the distinct experts the traced step's rows routed to, times
 * one expert's device bytes, as the layer floor counts them) at the read bandwidth; then the
 * sum of the phases (total) and of those without weights (latency: the issue's budget). */
static int bench_phases(bench_run *b, const bench_row *br, sm_err *e) {
    const sm_config *c = &b->cfg;
    const unsigned xbits = (1u << SM_T_EXPERTS_GU) | (1u << SM_T_EXPERTS_DN);
    sm_bench_phases p;
    double dsum;
    if (sm_cuda_bench_phases(&b->be, &b->sets[0], br->mono, b->mx_set, &p, NULL, e)) return sm_errprefix(e, "bench --phases");
    if (bench_distinct(b, br->step_rows, &dsum, e)) return -1;
    float xv[SM_MAX_LAYERS];
    int nx = 0;
    for (int l = 0; l < c->L; l++)
        if (b->mx_set[l]) xv[nx++] = (float)bench_expert_bytes(b, l);
    const double xbytes = nx ? sm_median(xv, nx) : 0.0;
    char path[32], line[256];
    const char *an = bench_acts_name(br);
    snprintf(path, sizeof path, "%s%s%s", br->mono ? "mono" : "stock", an ? "-" : "", an ? an : "");
    printf("layer phases of one traced %s step of %d rows: median over the %d MXFP4 layers of 1..%d it ran; floor = weight "
           "bytes / %.0f GB/s\n", br->mono ? "monokernel" : "stock", br->step_rows, p.layers, c->L - 2, b->bw / 1e9);
    double tot = 0, tfl = 0, lat = 0;
    for (int i = 1; i < p.n && p.layers; i++) {
        if (p.us[i] < 0) continue;
        double fb = p.weights[i] & xbits ? xbytes : 0.0;
        for (int r = 0; r < SM_T_NLAYER; r++)
            if ((p.weights[i] & (1u << r)) && !((1u << r) & xbits)) fb += (double)sm_tensor_loaded_bytes(c, (sm_tensor_role)r);
        const double fu = fb / b->bw * 1e6;
        tot += p.us[i];
        tfl += fu;
        if (!p.weights[i]) lat += p.us[i];
        bench_phase_line(line, sizeof line, path, br->step_rows, p.name[i], p.us[i], fu);
        printf("%s\n", line);
    }
    if (p.layers) {
        bench_phase_line(line, sizeof line, path, br->step_rows, "total", tot, tfl);
        printf("%s\n", line);
        bench_phase_line(line, sizeof line, path, br->step_rows, "latency", lat, 0);
        printf("%s\n", line);
    } else {
        printf("  (no MXFP4 layer ran on this path: the bucket ran stock)\n");
    }
    printf("\n");
    fflush(stdout);
    return 0;
}

/* A world of W ranks: the busiest rank's bytes (its slices of the dense weights, the replicated
 * router and vectors, its vocab block, the routed experts it holds, its KV heads) and floor,
 * and the step's exchanges timed alone (every rank at once, the slowest rank's median). */
static int bench_world(bench_run *b, bench_row *br, sm_err *e) {
    const bench_args *a = b->a;
    const sm_config *c = &b->cfg;
    const int W = a->ws.world;
    double rep = 0, sliced = 0, worst = 0;
    for (int r = 0; r < SM_T_NLAYER; r++) {
        double t = (double)sm_tensor_loaded_bytes(c, (sm_tensor_role)r);
        if (sm_tensors[r].split == SM_SPLIT_NONE) rep += t;
        else sliced += t;
    }
    int busiest = 0;
    for (int q = 0; q < W; q++) {
        double xb = 0, kvb = 0;
        for (int l = 0; l < c->L; l++) {
            const int *v = b->idx + (size_t)l * br->step_rows * c->K;
            int d = 0;
            memset(b->seen, 0, (size_t)c->E);
            for (int j = 0; j < br->step_rows * c->K; j++) {
                int x = v[j];
                if (x < 0 || x >= c->E || b->seen[x]) continue;
                b->seen[x] = 1;
                /* EP: only the rank's experts; TP: every routed expert's slice (xb is rank 0's slice) */
                if (a->ws.moe_tp || x / (c->E / W) == q) d++;
            }
            xb += d * b->xb[l];
            kvb += bench_kv_bytes(b, l, br->nreq, br->R) / W;
        }
        double bytes = c->L * (rep + sliced / W) + (double)c->V / W * c->H * 2 + (double)br->step_rows * c->H * 2 + xb + kvb;
        if (bytes > worst) worst = bytes, busiest = q;
    }
    float us[64];
    if (sm_cuda_world_bench_exchanges(&b->be, br->step_rows, a->iters, us, e)) return sm_errprefix(e, "bench");
    float xmax = 0;
    for (int q = 0; q < W; q++) if (us[q] > xmax) xmax = us[q];
    br->rank_bytes = worst;
    br->rank_floor_us = worst / b->bw * 1e6;
    br->exch_us = xmax;
    printf("  world %d (%s, %s, devices %s): busiest rank %d reads %.3f GB, floor %.1f us (%.1f%% of the step's %.1f us); "
           "exchanges alone %.1f us (slowest rank's median) = %.1f%% of the step\n\n",
           W, sm_moe_layout_name(sm_moe_layout_of(a->ws.moe_tp)), a->ws.comm ? a->ws.comm : "peer", a->ws.devices ? a->ws.devices : "0..W-1", busiest, worst / 1e9,
           br->rank_floor_us, 100 * br->rank_floor_us / br->med_us, br->med_us, xmax, 100 * xmax / br->med_us);
    fflush(stdout);
    return 0;
}

/* --masks: whole steps of set 0 through the backend's step (metadata, replay, outputs back; host
 * wall clock), alternating without and with a constraint mask on every row (a distinct random
 * mask a request, about half the ids allowed, as a JSON string's inside would), median of iters
 * each: what the masks add to a step (their upload, the logits kept on the device, the mask
 * kernel).  The engine's own share, the masks' lookup, is a cached pointer per row. */
static int bench_masks(bench_run *b, int rows, int R, sm_err *e) {
    const int words = (b->cfg.V + 31) / 32, nreq = (rows + R - 1) / R, it = b->a->iters;
    uint32_t *m = malloc(sizeof(uint32_t) * (size_t)words * (size_t)nreq);
    const uint32_t **mrow = malloc(sizeof *mrow * (size_t)rows);
    float *t = malloc(sizeof(float) * 2 * (size_t)it);
    if (!m || !mrow || !t) { free(m); free(mrow); free(t); return sm_errf(e, "bench --masks: out of host memory"); }
    uint64_t rng = b->a->seed * 131 + 7;
    for (size_t i = 0; i < (size_t)words * nreq; i++) m[i] = (uint32_t)sm_rng_next(&rng);
    for (int i = 0; i < rows; i++) mrow[i] = m + (size_t)(i / R) * words;
    int rc = 0;
    for (int k = 0; k < 2 * it + 4 && !rc; k++) { /* 4 warm-up steps, then without / with in turn */
        sm_step s = b->sets[0];
        s.mask = k & 1 ? mrow : NULL;
        const double t0 = cli_now();
        rc = b->be.step(b->be.ctx, &s, e);
        if (k >= 4) t[(k & 1) * it + (k - 4) / 2] = (float)((cli_now() - t0) * 1e6);
    }
    if (!rc) {
        const float u = sm_median(t, it), c = sm_median(t + it, it);
        printf("masks: %d rows (%d requests): whole step %.1f us without, %.1f us with a mask on every row: +%.1f us, %.2f%% of the "
               "step (median of %d each)\n\n", rows, nreq, u, c, c - u, 100 * (c - u) / u, it);
    }
    free(m); free(mrow); free(t);
    return rc ? sm_errprefix(e, "bench --masks") : 0;
}

/* --ttft: the prefill of one request of ctx + 64 prompt tokens (steps of max_step_rows rows,
 * the last one's argmax its first token), computed whole, then again with its first ctx tokens
 * taken from the prefix cache (src/backend/kvcache.c), as the engine does; the median of 5
 * each, host wall clock around the steps (each step returns its argmax to the host). */
static int bench_ttft(bench_run *b, sm_err *e) {
    const bench_args *a = b->a;
    const int n = a->ctx + 64, chunk = b->max_step_rows;
    if (n > b->kv.max_len) return sm_errf(e, "bench --ttft: ctx %d + 64 exceeds the cache's %d positions", a->ctx, b->kv.max_len);
    int *tok = malloc(sizeof(int) * (size_t)n * 2), *pos = malloc(sizeof(int) * (size_t)chunk), *req = malloc(sizeof(int) * (size_t)chunk);
    int *am = malloc(sizeof(int) * (size_t)chunk);
    if (!tok || !pos || !req || !am) { free(tok); free(pos); free(req); free(am); return sm_errf(e, "bench --ttft: out of host memory"); }
    uint64_t rng = a->seed * 31 + 5;
    for (int i = 0; i < 2 * n; i++) tok[i] = (int)(sm_rng_next(&rng) % (uint64_t)b->cfg.vocab_used);
    memcpy(tok + n, tok, sizeof(int) * (size_t)a->ctx); /* the second prompt: the same first ctx tokens */
    sm_kv_prefix_enable(&b->kv, 1, 1);
    float t[2][5];
    int rc = 0, slot = 0, hit = 0;
    for (int it = 0; it < 5 && !rc; it++)
        for (int v = 0; v < 2 && !rc; v++) {
            /* v 0: the first prompt, computed whole, its pages registered; v 1: the second */
            const int *p = tok + (size_t)v * n;
            sm_kv_release(&b->kv, 0);
            if ((rc = sm_kv_add(&b->kv, &slot, e))) break;
            if (v == 0) sm_kv_prefix_enable(&b->kv, 0, 0), sm_kv_prefix_enable(&b->kv, 1, 1); /* nothing cached */
            int a0 = 0;
            const double t0 = cli_now();
            sm_kv_prefix_attach(&b->kv, slot, p, n, &a0);
            if (v) hit = a0;
            for (int x = a0; x < n && !rc; x += chunk) {
                const int y = x + chunk < n ? x + chunk : n;
                if ((rc = sm_kv_reserve(&b->kv, slot, y, e))) break;
                for (int i = x; i < y; i++) pos[i - x] = i, req[i - x] = slot;
                sm_step s;
                memset(&s, 0, sizeof s);
                s.nrows = y - x;
                s.tokens = p + x;
                s.pos = pos;
                s.req = req;
                s.kv = &b->kv;
                s.argmax = am;
                rc = b->be.step(b->be.ctx, &s, e);
                b->kv.len[slot] = y;
            }
            t[v][it] = (float)((cli_now() - t0) * 1e3);
            if (!rc && v == 0) sm_kv_prefix_commit(&b->kv, slot, p, n);
        }
    if (!rc) {
        const float u = sm_median(t[0], 5), c = sm_median(t[1], 5);
        printf("ttft: one request of %d prompt tokens (prefill steps of %d rows): %.2f ms computed whole, %.2f ms with %d of "
               "them from the prefix cache: %.1fx (median of 5)\n\n", n, chunk, u, c, hit, u / c);
    }
    /* the benches' cache layout back: slot 0 reserved whole, the cache off */
    sm_kv_release(&b->kv, slot);
    sm_kv_prefix_enable(&b->kv, 0, 0);
    if (!rc && !(rc = sm_kv_add(&b->kv, &slot, e))) rc = sm_kv_reserve(&b->kv, slot, b->kv.max_len, e);
    free(tok); free(pos); free(req); free(am);
    return rc ? sm_errprefix(e, "bench --ttft") : 0;
}

/* The short table, last: per row count, stock and monokernel side by side. */
static void bench_summary(const bench_run *b, int nres) {
    const bench_args *a = b->a;
    printf("summary (%s, %s experts, ctx %d, read bandwidth %.0f GB/s):\n", a->preset ? a->preset : a->model,
           a->preset ? sm_expert_fmt_name((sm_expert_fmt)a->fmt) : "checkpoint", a->ctx, b->bw / 1e9);
    printf("%-6s %-6s %-6s %-8s %10s %10s %9s %10s %8s %12s %8s\n", "path", "acts", "rows", "req x R", "median_us", "GB_read",
           "experts", "floor_us", "%floor", "mxfp4_layer", "speedup");
    for (int ri = 0; ri < nres; ri++) {
        const bench_row *br = &b->res[ri];
        char rq[16], lf[16], sp[16];
        snprintf(rq, sizeof rq, "%dx%d", br->nreq, br->R);
        snprintf(lf, sizeof lf, br->layer_frac > 0 ? "%.1f%%" : "-", 100 * br->layer_frac);
        snprintf(sp, sizeof sp, "-");
        if (br->mono && ri > 0 && !b->res[ri - 1].mono && b->res[ri - 1].step_rows == br->step_rows &&
            b->res[ri - 1].acts == br->acts && b->res[ri - 1].fp8 == br->fp8)
            snprintf(sp, sizeof sp, "%.2fx", b->res[ri - 1].med_us / br->med_us);
        const char *an = bench_acts_name(br);
        printf("%-6s %-6s %-6d %-8s %10.1f %10.3f %9.1f %10.1f %7.1f%% %12s %8s\n", br->mono ? "mono" : "stock", an ? an : "-",
               br->step_rows, rq, br->med_us, br->bytes / 1e9, br->distinct, br->floor_us, 100 * br->frac, lf, sp);
        if (a->ws.world > 1)
            printf("%-6s %-6s %-8s rank floor %.1f us (%.3f GB, %.1f%% of the step), exchanges %.1f us (%.1f%%)\n", "", "", "",
                   br->rank_floor_us, br->rank_bytes / 1e9, 100 * br->rank_floor_us / br->med_us, br->exch_us,
                   100 * br->exch_us / br->med_us);
    }
}

static void bench_free(bench_run *b) {
    if (b->have_be) b->be.destroy(b->be.ctx);
    sm_kv_free(&b->kv);
    if (b->have_m) sm_model_free(&b->m);
    free(b->res); free(b->idx); free(b->fmt); free(b->xb); free(b->ms); free(b->lay); free(b->moe); free(b->dist);
    free(b->seen); free(b->tok); free(b->am); free(b->pos); free(b->req); free(b->sets); free(b->mx_set);
}

static int run(const bench_args *a, sm_err *e) {
    bench_run b;
    memset(&b, 0, sizeof b);
    b.a = a;
    int rc = bench_device(e);
    if (!rc) rc = bench_model(&b, e);
    if (!rc) rc = bench_alloc(&b, e);
    if (!rc) rc = bench_backend(&b, e);
    if (!rc && a->phases) rc = bench_phase_set(&b, e);
    if (!rc && a->mono != 2) {
        sm_err me = {{0}};
        b.have_mono = sm_cuda_bench_set_mono(&b.be, 1, &me) == 0;
        if (!b.have_mono && a->mono == 1) rc = sm_errf(e, "bench --mono on: %s", me.msg);
        if (!b.have_mono && !rc) printf("monokernel: not available on this model / device (%s); stock only\n\n", me.msg);
    } else if (!rc) {
        /* --mono off: the stock path on every layer (the engine's default would engage the
         * monokernel where it is eligible, and its steps would be timed as stock) */
        rc = sm_cuda_bench_set_mono(&b.be, 0, e);
    }
    /* the MXFP4 activations of a synthetic model: both numerics (W4A16, then W4A4 on the FP8
     * tensor cores and with bf16 products) unless --activations names one (mxfp4: W4A4 on
     * both); a checkpoint runs what it loaded with */
    int acts[BENCH_NUMERICS] = {SM_ACTS_AUTO, SM_ACTS_AUTO, SM_ACTS_AUTO}, fp8[BENCH_NUMERICS] = {0, 1, 0}, nacts = 1;
    if (a->preset && a->fmt == SM_EXP_MXFP4) {
        if (a->activations == SM_ACTS_AUTO) acts[0] = SM_ACTS_BF16, acts[1] = acts[2] = SM_ACTS_MXFP4, nacts = 3;
        else if (a->activations == SM_ACTS_MXFP4) acts[0] = acts[1] = SM_ACTS_MXFP4, fp8[0] = 1, fp8[1] = 0, nacts = 2;
        else acts[0] = a->activations;
    } else if (a->preset && a->activations == SM_ACTS_MXFP4 && !rc) {
        rc = sm_errf(e, "bench: --activations mxfp4 needs MXFP4 experts (--experts mxfp4)");
    }
    uint64_t rng = a->seed * 7919 + 17;
    int nres = 0;
    for (int ri = 0; ri < a->nstep_rows && !rc; ri++) {
        const int rows = a->step_rows[ri];
        int q, R;
        split_rows(a, rows, &q, &R, e);
        bench_inputs(&b, rows, R, &rng);
        /* per numerics, stock first, then the monokernel on the same inputs (same run, same floor) */
        for (int ai = 0; ai < nacts && !rc; ai++) {
            if (acts[ai] != SM_ACTS_AUTO) rc = sm_cuda_bench_set_acts(&b.be, acts[ai] == SM_ACTS_MXFP4, fp8[ai], e);
            for (int pass = 0; pass < 2 && !rc; pass++) {
                const int mono = pass == 1;
                if (mono ? !(b.have_mono && a->mono != 2) : (a->mono == 1 && b.have_mono)) continue;
                if (b.have_mono) rc = sm_cuda_bench_set_mono(&b.be, mono, e);
                bench_row *br = &b.res[nres++];
                br->step_rows = rows;
                br->nreq = q;
                br->R = R;
                br->mono = mono;
                br->acts = acts[ai];
                br->fp8 = acts[ai] == SM_ACTS_MXFP4 && fp8[ai];
                if (acts[ai] != SM_ACTS_AUTO)
                    printf("activations: %s\n", acts[ai] != SM_ACTS_MXFP4 ? "bf16 (W4A16)"
                                                 : fp8[ai]                  ? "mxfp4 (W4A4, FP8 tensor cores)"
                                                                            : "mxfp4 (W4A4, bf16 products)");
                if (!rc) rc = bench_step(&b, br, e);
                if (!rc) rc = a->ws.world > 1 ? bench_world(&b, br, e) : bench_layers(&b, br, e);
                if (!rc && a->phases) rc = bench_phases(&b, br, e);
            }
        }
        if (!rc && a->masks) {
            if (b.have_mono) rc = sm_cuda_bench_set_mono(&b.be, 0, e);
            if (!rc) rc = bench_masks(&b, rows, R, e);
        }
        /* --trace: a traced monokernel step of every row count (its phase summary); the file
         * holds the first row count's */
        if (!rc && a->trace) {
            if (!b.have_mono) rc = sm_errf(e, "bench --trace: the monokernel is not available on this model / device");
            else if (!(rc = sm_cuda_bench_set_mono(&b.be, 1, e)) &&
                     !(rc = sm_cuda_bench_trace(&b.be, &b.sets[0], ri == 0 ? a->trace : NULL, b.bw, e)) && ri == 0)
                printf("trace of one %d-row monokernel step: %s\n\n", rows, a->trace);
        }
    }
    if (!rc && a->ttft) rc = bench_ttft(&b, e);
    if (!rc) bench_summary(&b, nres);
    bench_free(&b);
    return rc ? -1 : 0;
}
#endif

int cmd_bench(int argc, char **argv) {
    bench_args a;
    sm_err e = {{0}};
    int r = parse_args(argc, argv, &a, &e);
    if (r) {
        free(a.step_rows);
        if (r > 0) return 0; /* --help */
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
#ifdef SM_HAVE_CUDA
    int rc = run(&a, &e);
    free(a.step_rows);
    if (rc) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    return 0;
#else
    free(a.step_rows);
    fprintf(stderr, "bench: this sparkmono was built without CUDA (no nvcc at build time); the benchmark needs an NVIDIA GPU\n");
    return 2;
#endif
}
