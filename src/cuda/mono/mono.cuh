/* mono/mono.cuh: the monokernel: decoder layers 1..L-2 of a verify step as persistent launches
 * (docs/architecture.md, "monokernel"; the math is docs/model.md sections 3-7, unchanged).
 *
 * A launch runs a range of PHASES on a co-resident grid (cooperative launch); a grid barrier
 * separates consecutive phases.  The phases of layer l, in order:
 *   ATT        paged attention + output norm + gate of layer l (tile items, 4 teams a block;
 *              only with SPARKMONO_MONO_FUSED_ATT=1, else the stock kernel between launches)
 *   ATT_SUM    merge of the key splits (one warp per (row, head)), when the items split keys
 *   OPROJ      a = att Wo^T (the wgmma stream-K body, threads 0..255 consume, 256 produces)
 *   POST_ATT   attention residual boundary + pre-FFN norm (a team per row; W > 1: a = r16 of
 *              the rank-order sum of the ranks' o_proj parts first, exchange 0) | the router
 *              logits, f32 (the split-k GEMV body, 2 teams a block, on the blocks past the norm
 *              rows first), each team after a wait for the count of xf rows written
 *   ROUTER     (no longer a phase of its own: its slot stays in the numbering and times it)
 *   POOLER     h1 = xf Wpool^T | on the matmul's idle warps, a row a block: the row's logits
 *              (the router's split sum in split order), then its sigmoid + top-K (a warp; the
 *              TOPK slot stays in the numbering and times it)
 *   PRE_NORM   pre-expert norm of h1 (a team per row; W > 1: the ranks' pooler blocks gathered
 *              first, exchange 1) | on the last block: the route grouping
 *   MM1        the expert FFN, both stages (MXFP4 / FP8 / BF16 bodies, the queue schedule of
 *              moe/queue.cuh: stage-2 units wait for their job's stage 1, no grid barrier)
 *   MM2        (no longer a phase of its own: its slot stays in the numbering)
 *   XSUM_Y     W > 1, TP: the rank-order sum of the ranks' f32 y per route (exchange 2)
 *   COMBINE    post-expert norm scale of every (row, route), a team each
 *   COMBINE_SUM the weighted sum of every 8 elements in route order (the stock combine's steps)
 *   XSUM_M     W > 1, EP: mo = r16(rank-order sum of the ranks' f32 m) (exchange 2)
 *   UNPOOL     f = m Wunpool^T
 *   POST_FFN   FFN residual boundary + the NEXT layer's input norm (a team per row; W > 1:
 *              the ranks' unpooler blocks gathered first, exchange 3)
 *   QKVG       the next layer's q | k | v | gate projection
 *   ROPE       the next layer's QK norm, RoPE (sliding layers) and K/V insert (a warp per head)
 * The expert stage (MM1) is a kernel of its own (the stock expert blocks: 256
 * threads, 2 an SM, arguments in the constant bank; inside the 512-thread kernel they ran
 * slower, bench/results.md); every other phase is in the dense kernel, whose launch runs the end of layer l
 * (COMBINE..ROPE) and the start of layer l+1 (ATT..PRE_NORM) together: two launches a layer.
 * We measured and dropped an L2 prefetch of the next matmul's first W boxes (at the barrier,
 * or during the phase before it): no matmul phase got shorter and the norm phases beside it
 * got longer (bench/results.md, 2026-12-03).
 * The dense kernel has one 512-thread block per SM.  K3 (8 and 16 rows) and K5 (24..128 rows)
 * differ only in the token box of the matmuls.  Every phase calls the stock kernels' device bodies with the stock kernels' decomposition (same virtual blocks,
 * team sizes, split counts), so a mono step gives the stock step's bits: the tests compare
 * them exactly.  Each phase boundary is a grid barrier, the point where the cross-rank
 * exchange of docs/parallelism.md will go.
 *
 * Everything a launch reads is in a descriptor (mono_desc, one per (bucket, layer), planned
 * once when the bucket first runs): pointers, shapes, the four matmuls' tensor maps.  It is the
 * kernel's __grid_constant__ parameter (with the phase range), so a CUDA graph bakes it in and
 * the kernel reads it from the constant bank, never from memory a phase writes.
 * The grid barrier is bounded: a block that waits longer than ctl->bound_ns records (layer,
 * phase, block) in the health words, raises ctl->abort, and every block leaves; the host reads
 * the health words after the step and fails it with one line.
 *
 * W ranks (TP = EP, docs/parallelism.md section 7): every rank runs its own descriptors (its
 * heads, pooler / unpooler rows, experts or I slice) and the four exchanges of a layer happen
 * inside the launches.  The producing phase writes the rank's part into its own exchange area
 * (parity k & 1 of exchange k: 0 attn_sum, 1 pooled_gather, 2 expert_sum, 3 unpooled_gather);
 * at the grid barrier after it, block 0 releases epoch step * 4096 + 4 l + k + 1 into flag r of
 * every rank (system scope); every block of every rank waits (bounded) until its W flags hold
 * the epoch, then the consuming phase reads the W parts (ld.global.cg) and adds them in rank
 * order 0..W-1 (sums) or places them (gathers): POST_ATT sums attn, PRE_NORM gathers h1,
 * XSUM_M sums the EP experts' m (XSUM_Y the TP experts' y, whose producer, MM1, publishes at
 * the end of the expert launch), POST_FFN gathers f.  A part is rewritten two exchanges later,
 * only after every rank has published the exchange in between, i.e. finished reading it.  A
 * wait that runs out records (layer, phase, block, peer + 1) in the health words and raises
 * abort.  Virtual ranks (several on one GPU) run as ONE cooperative launch: blocks [r G, (r+1) G)
 * are rank r's (nrank descriptors in the program), so every rank's blocks are co-resident and
 * a rank never waits for a peer that is not scheduled.  We rejected cooperative-groups
 * grid.sync (unbounded: a lost block hangs the process) and one launch per phase (the stock
 * path: launch gaps and a cold start of every phase).
 */
#ifndef SM_CUDA_MONO_CUH
#define SM_CUDA_MONO_CUH
#include "cuda/common.cuh"
#include "cuda/ops/ops.h"
#include "cuda/ops/matmul.cuh"
#include "cuda/ops/rope_kv.cuh"
#include "cuda/moe/moe.h"
#include "cuda/moe/queue.cuh"
#include "cuda/moe/group.cuh"
#include "cuda/moe/combine.cuh"
#include <cuda.h>

#define MONO_THREADS 512   /* threads of a block: 4 teams of 128, 2 of 256 or 1 of 512 */
#define MONO_TRACE_MAX 64  /* layers a trace buffer holds */
#define MONO_WMAX 8        /* ranks of a world the build takes */
#define MONO_PROG_D 8      /* descriptors a dense program holds (segments x ranks of a launch) */

/* Phases in launch order (MP_NPHASE of them), then the four exchange waits (trace slots and
 * health words only: a wait runs at the start of its consuming phase). */
enum {
    MP_ATT, MP_ATT_SUM, MP_OPROJ, MP_POST_ATT, MP_ROUTER, MP_TOPK, MP_POOLER, MP_PRE_NORM,
    MP_MM1, MP_MM2, MP_XSUM_Y, MP_COMBINE, MP_COMBINE_SUM, MP_XSUM_M, MP_UNPOOL, MP_POST_FFN, MP_QKVG, MP_ROPE, MP_NPHASE,
    MP_XW0 = MP_NPHASE, MP_XW1, MP_XW2, MP_XW3, MP_N
};
/* Phase names (trace, health messages), indexed by MP_*. */
extern const char *const mono_phase_name[MP_N];


/* Shared control words of one context (device memory): the grid barrier, the health words,
 * the trace pointer and the fault-injection hook. */
typedef struct mono_ctl {
    unsigned count;             /* arrivals in the running launch (barrier k passes at k * grid) */
    unsigned gen;               /* blocks that ended the running launch (the last resets both) */
    unsigned abort;             /* 1: a wait timed out; every block leaves at its next barrier */
    unsigned health[5];         /* first timeout: {1, layer, phase, block, peer + 1 (0: the grid barrier)} */
    unsigned long long bound_ns; /* longest wait at a barrier */
    unsigned long long *trace;  /* NULL, or [MONO_TRACE_MAX][trace_blocks][MP_N][2] globaltimer ns */
    int trace_blocks;           /* blocks a layer's trace holds (the expert kernel's grid: 2 an SM) */
    int fault_layer;            /* test hook: block 1 stops arriving after this (layer, phase); -1 off */
    int fault_phase;
    unsigned xrows;             /* rows of xf written in the running launch (the last block out resets it) */
} mono_ctl;

/* The exchanges of a rank of W > 1 (docs/parallelism.md section 7). */
typedef struct mono_xc {
    int W, rank;                /* 1: no exchanges */
    int moe_tp;                 /* 1: TP experts (y summed before the combine), 0: EP (m summed after) */
    uint8_t *buf[MONO_WMAX];    /* rank q's exchange area: parity 0 at +0, parity 1 at +bytes */
    size_t bytes;               /* bytes of one parity */
    unsigned long long *flag[MONO_WMAX]; /* rank q's flags [W]: flag p = the epoch rank p published to q */
    const unsigned long long *step; /* this rank's step counter (the world's, cuda/comm/gcomm.h) */
    int np, nu;                 /* columns of a rank's pooler / unpooler block */
    float *ysum;                /* TP: [n K, Hm] f32 rank-order sum of y */
} mono_xc;

/* One matmul of a layer: tensor maps first (CUtensorMap carries its own alignment). */
typedef struct mono_mm {
    CUtensorMap tw;             /* W [m, k], boxes of 128 rows x 64 k */
    CUtensorMap tx;             /* x [n, k], boxes of N tokens x 64 k */
    sm_wg_args a;               /* shape, split, partial tiles, counters, y */
} mono_mm;

/* Everything one layer's launches read (device memory). */
typedef struct mono_desc {
    mono_mm mm[4];              /* OPROJ, POOLER, UNPOOL, QKVG (the next layer's) */
    mono_ctl *ctl;
    mono_xc xc;                 /* W > 1: the exchanges */
    int layer;                  /* l */
    int att_fused;              /* 1: ATT runs in the launch; 0: the stock attention kernel runs before it */
    int n;                      /* rows (the bucket's, padding included) */
    int H, Hm, E, K, nh, nkv, G;
    float eps, post_eps;
    /* ATT, ATT_SUM */
    const uint16_t *q, *gate;   /* [n, NQ] rows of this layer's projections (q normed, roped) */
    int ldq;                    /* NQ */
    const uint16_t *kv;         /* this layer's paged cache */
    const int *tables;          /* [*, max_bpr] block tables of the step */
    int max_bpr;
    const int *rreq, *pos;      /* [n] table index, position of each row */
    int window, nsplit, chunk;  /* sm_att_plan: key splits, keys of a chunk of the absolute grid */
    float scale;
    float *wsO, *wsM, *wsL;     /* key-split partials (nsplit > 1) */
    uint16_t *att;              /* [n, nh 64] */
    /* POST_ATT */
    float *s;                   /* [n, H] residual stream */
    const uint16_t *a;          /* [n, H] o_proj output */
    const float *att_alpha, *att_beta, *pre_ffn;
    uint16_t *xf;               /* [n, H] */
    /* ROUTER, TOPK */
    const float *router, *rbias; /* [E, H], [E] */
    int rS, rnt;                /* k splits of 512, token block (8 or 16) */
    float *rpart;               /* [rS, n, E] */
    int *idx;                   /* [n, K] */
    float *w;                   /* [n, K] */
    float m_o, route_scale;
    float *rlog;                /* [n, E] summed router logits */
    /* PRE_NORM, MoE */
    uint16_t *h1;               /* [n, Hm] */
    const float *pre_expert;
    int h1_mx;                  /* W4A4: the norm rounds h1 to MXFP4 (the experts take it as is) */
    sm_x8_img h1img;            /* W4A4 on the FP8 tensor cores: the norm writes h1's image too */
    int fmt;                    /* sm_expert_fmt of the layer's experts */
    moe_group_args ga;
    moe_qargs mq;               /* the expert matmul (both stages, the queue schedule) */
    moe_combine_args ca;        /* its rs: the routes' norm scales (COMBINE -> COMBINE_SUM) */
    /* POST_FFN */
    const uint16_t *f;          /* [n, H] unpooler output */
    const float *post_ffn, *ffn_alpha, *ffn_beta, *next_norm;
    uint16_t *x;                /* [n, H] the next layer's normed input */
    /* ROPE (the next layer) */
    uint16_t *nq;               /* [n, NQ] the next layer's projections (q normed / roped in place) */
    uint16_t *nkvc;             /* the next layer's paged cache */
    const int64_t *slot;        /* [n] cache slot of each row, -1: padding */
    int64_t nslots;
    int rope;                   /* the next layer is a sliding (RoPE) layer */
    sm_rope_tab tab;
} mono_desc;

/* A dense launch: up to two segments of phases, each of one layer's descriptor (the end of
 * layer l, COMBINE..ROPE, then the start of layer l+1, ATT..PRE_NORM), for nrank ranks
 * (virtual ranks: one launch, blocks [r G, (r+1) G) rank r's; descriptor of segment g, rank r
 * at d[g * nrank + r]). */
typedef struct mono_prog {
    mono_desc d[MONO_PROG_D];
    int p0[2], p1[2];           /* phases [p0, p1) of each segment */
    int nseg;                   /* 1 or 2 (nseg * nrank <= MONO_PROG_D) */
    int nrank;                  /* ranks of the launch */
} mono_prog;

/* The expert-stage launch of one layer (its own kernel: the stock expert blocks and registers),
 * for nrank ranks as mono_prog. */
typedef struct mono_moe {
    moe_qargs q[MONO_WMAX];     /* each rank's expert matmul (queue.cuh) */
    mono_ctl *ctl[MONO_WMAX];
    mono_xc xc[MONO_WMAX];       /* TP: the expert stage's y is exchange 2 (published at the end) */
    int layer;
    int nrank;
} mono_moe;

/* Dynamic shared memory of a launch for token box N, G query heads a KV head, expert widths
 * Hm, I and E experts: the largest phase's (usually the wgmma ring). */
size_t mono_smem_bytes(int N, int G, int Hm, int I, int E);
/* Launch program P (a kernel parameter) over grid blocks (one per SM), token box N, smem bytes
 * of dynamic shared memory, on st (a cooperative launch: the driver refuses a grid that cannot
 * be co-resident). */
int mono_launch(int N, const mono_prog &P, int grid, size_t smem, cudaStream_t st, sm_err *e);
/* The expert launch of format fmt over grid blocks of MOE_THREADS (2 an SM); its shared memory
 * and resident blocks per SM. */
int mono_moe_launch(int fmt, const mono_moe &P, int grid, cudaStream_t st, sm_err *e);
size_t mono_moe_smem(const mono_moe &P);
int mono_moe_occupancy(const mono_moe &P, int *blocks_per_sm, sm_err *e);
/* Resident blocks per SM of the kernel for token box N with smem bytes (co-residency check). */
int mono_occupancy(int N, size_t smem, int *blocks_per_sm, sm_err *e);

#endif
