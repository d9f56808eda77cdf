/* bench.h: the timing harness every per-op microbenchmark of bench/gpu/ shares (`gpu_test
 * --bench OP`, entry gpu_bench in tests/gpu/gpu_tests.h), and the op drivers it runs.
 *
 * One bh_run per invocation holds the device facts, the two ceilings measured in the same run
 * (read bandwidth by the one probe sm_cuda_read_bandwidth, the bf16 tensor-core rate by a large
 * cuBLAS product through sm_k_mm_blas), the stock-kernel context at the real widths (spark1x
 * preset) and the summary lines.  A driver allocates its inputs as `nsets` copies (bh_sets:
 * together beyond the L2), fills them with random values from src/model/rng.h (bh_normal_*), and
 * times one call through bh_time: a spin kernel ahead of the call keeps the host's launch
 * latency out of the interval, CUDA events around it, warm-up calls first, the median of the
 * timed calls (sm_median of src/backend/stats.h), the input set rotating every call.  bh_row prints a
 * table line with the floor = max(bytes / bandwidth, FLOPs / rate) and records the summary.
 * We rejected CUDA-graph replays as the general method: a graph per input set multiplies the
 * setup, and the spin kernel already keeps the launch gaps out; the MoE stage keeps its graph
 * column because its four launches are captured in the real step.
 * Included by .cu files only (CUDA types allowed).
 */
#ifndef SM_BENCH_GPU_BENCH_H
#define SM_BENCH_GPU_BENCH_H
#include <stdint.h>
#include <cuda_runtime.h>
#include "cuda/ops/ops.h"
#include "model/rng.h"

#define BH_ITERS 50          /* timed calls of a case (their median is reported) */
#define BH_WARM 5            /* untimed calls before them */
#define BH_MAX_ITERS 1000    /* bound of bh_run.iters */
#define BH_SPIN_NS 50000     /* spin kernel ahead of each timed call (ns): covers host enqueue */
#define BH_L2_TIMES 3        /* the input sets of a case hold at least this many L2 sizes */
#define BH_MAX_SETS 512      /* bound of bh_sets */
#define BH_MAX_LINES 192     /* summary lines */
#define BH_MAX_ROWS 128      /* most rows of a case */
#define BH_NROWS 5           /* decode row counts timed: 8, 16, 32, 64, 128 */

/* One line of the final summary. */
typedef struct bh_line {
    char op[64];             /* op and case, e.g. "norm post_attn" */
    int rows;                /* rows of the call */
    float us;                /* median time of a call */
    float floor_us;          /* max(byte floor, FLOP floor) */
} bh_line;

/* State of one `--bench` invocation on device 0. */
typedef struct bh_run {
    sm_config cfg;           /* the spark1x preset: the widths of every case */
    sm_kernel_ctx kc;        /* stock-kernel context, workspace for 128 rows (sm_cuda_ws_bytes) */
    cudaStream_t st;         /* the stream every call runs on */
    cudaEvent_t ea, eb;      /* events around a timed call */
    int sms;                 /* multiprocessors */
    double l2;               /* L2 bytes */
    double bw;               /* read bandwidth, bytes/s, measured in this run */
    double rate;             /* bf16 tensor-core rate, FLOP/s, measured in this run */
    uint64_t seed;           /* seed of every random input (printed) */
    int iters;               /* timed calls of a case (BH_ITERS unless a driver lowers it) */
    int rows[BH_NROWS];      /* decode row counts */
    int evict;               /* 1: bh_time runs bh_evict_icache ahead of every timed interval */
    float *fe_out;           /* [sms] the frontend kernels' output (allocated on first use) */
    void *fe_flush;          /* [BH_L2_TIMES x L2] bytes written to flush the L2 (first use) */
    int nlines;              /* summary lines used */
    bh_line lines[BH_MAX_LINES]; /* [nlines] */
} bh_run;

/* One call of an op on input set `set` (0 <= set < nsets), enqueued on r->st; 0 or -1 with e. */
typedef int (*bh_call)(bh_run *r, void *arg, int set, sm_err *e);

/* Input sets to rotate for a case whose one set is set_bytes: together >= BH_L2_TIMES x L2,
 * at least 2, at most BH_MAX_SETS. */
int bh_sets(const bh_run *r, double set_bytes);
/* Median time (us) of one call: BH_WARM untimed then r->iters timed intervals, each a spin
 * kernel (then bh_evict_icache when r->evict), event, per_interval calls of fn on consecutive
 * sets, event, synchronize; the interval divided by per_interval.  Sets rotate 0, 1, ..,
 * nsets-1, 0, .. over every call. */
int bh_time(bh_run *r, bh_call fn, void *arg, int nsets, int per_interval, float *us, sm_err *e);
/* Enqueue BH_L2_TIMES L2 sizes of writes, then 256 KB of straight-line code on every SM
 * (bench/gpu/frontend.cu), so the next kernel's instructions are neither in the SMs'
 * instruction caches nor in L2 (as a layer's other kernels leave them). */
int bh_evict_icache(bh_run *r, sm_err *e);
/* The spin kernel bh_time puts ahead of each timed interval (for drivers that time by hand). */
__global__ void bh_spin_kernel(long long ns);
/* p[0..n) = mean + sd * z with z the normals of src/model/rng.h's stream sm_rng_key(r->seed, name),
 * as bf16 / f32, on r->st (not synchronized). */
int bh_normal_bf16(bh_run *r, uint16_t *p, size_t n, const char *name, float mean, float sd, sm_err *e);
int bh_normal_f32(bh_run *r, float *p, size_t n, const char *name, float mean, float sd, sm_err *e);
/* 64 random bits number i of stream key (host: token ids, routing, page order). */
static inline uint64_t bh_bits(uint64_t key, uint64_t i) { return sm_mix64(key + i * SM_RNG_GOLDEN); }
/* Floor of a case in us: max(bytes / bandwidth, flops / rate). */
double bh_floor_us(const bh_run *r, double bytes, double flops);
/* The SM clock in MHz, measured over 1 ms by one thread right now (right after a timed loop:
 * the clock that loop ran at, power throttling included). */
int bh_sm_mhz(bh_run *r, double *mhz, sm_err *e);
/* Table title: what is timed and what the floor counts, then the column header. */
void bh_head(const char *title, const char *counts);
/* One table line: op, case, rows, median us, MB counted, GB/s, byte floor, FLOP floor (flops 0:
 * "-"), % of the larger, then `extra` (may be NULL); summary != 0 also records a summary line. */
void bh_row(bh_run *r, const char *op, const char *what, int rows, float us, double bytes, double flops,
            const char *extra, int summary);
/* Records a summary line (drivers whose table has its own format). */
void bh_add(bh_run *r, const char *op, int rows, float us, double floor_us);

/* The op drivers (bench/gpu/<op>.cu): print their table, 0 or -1 with e; free what they
 * allocate on every path. */
int bench_norm(bh_run *r, sm_err *e);
int bench_router(bh_run *r, sm_err *e);
int bench_attention(bh_run *r, sm_err *e);
int bench_matmul(bh_run *r, sm_err *e);
int bench_moe(bh_run *r, sm_err *e);
int bench_logits(bh_run *r, sm_err *e);
int bench_logprobs(bh_run *r, sm_err *e);
int bench_frontend(bh_run *r, sm_err *e);
int bench_kstep(bh_run *r, sm_err *e);

#endif
