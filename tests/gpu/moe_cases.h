/* moe_cases.h: what the two files of the MoE group share (moe.cu: one rank, the entry;
 * moe_shards.cu: W ranks): the group's stream and pool, its draws from the harness's
 * generator, routing, the device inputs and guarded output of one run, and made models. */
#ifndef SM_GPU_MOE_CASES_H
#define SM_GPU_MOE_CASES_H
#include <stdint.h>
#include <cuda_runtime.h>
extern "C" {
#include "model/config.h"
#include "model/weights.h"
#include "cpu/pool.h"
}
#include "cuda/moe/moe.h"

#define MGUARD 64          /* bf16 guard elements on each side of gpu_io.mb */
#define MGUARD_VAL 0xA5A5u /* their pattern */

extern sm_pool *m_pool;    /* the CPU reference ops' thread pool (NULL: one thread) */
extern cudaStream_t m_st;  /* every case's stream */

uint64_t mrnd64(void);     /* harness.h's generator */
int mrndi(int n);          /* uniform in [0, n) */
float mrndu(void);         /* uniform in [0, 1) */
float mrndn(void);         /* N(0, 1) */
void *xmalloc(size_t b);   /* exits on failure */
/* Random routing of n rows (mode 0 uniform distinct, 1 every row on 0..K-1 shuffled, 2 skewed:
 * every row on expert 0); weights positive, summing to 1 a row. */
void make_routing(int n, int E, int K, int mode, int *idx, float *w);

/* The device inputs and output of one forward. */
typedef struct gpu_io {
    uint16_t *h1;   /* device [max_rows, Hm] */
    int *idx;       /* device [max_rows, K] */
    float *w;       /* device [max_rows, K] */
    uint16_t *mb;   /* device [MGUARD + max_rows*Hm + MGUARD] */
} gpu_io;
int io_alloc(gpu_io *io, int max_rows, int Hm, int K);
void io_free(gpu_io *io);
/* Poison m with NaN (0xFFFF) and its guards with MGUARD_VAL. */
int io_poison(gpu_io *io, int n, int Hm);

/* Run forward on L (through a captured graph when graph); out [n*Hm] bf16 bits; *gb the
 * guard elements of io.mb overwritten.  0, or -1 with the reason printed. */
int run_gpu(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, gpu_io *io, int n, int graph, uint16_t *out, int *gb);

/* A model of a preset written by sm_make_model into a fresh temporary directory and loaded. */
typedef struct made_model {
    sm_config c;              /* its config */
    sm_model m;               /* loaded */
    char base[512], dir[600]; /* temporary directory and the model inside it */
} made_model;
/* 0, or -1 with the reason printed (nothing left behind). */
int made_model_open(made_model *mm, const char *preset, int fmt, uint64_t seed);
void made_model_close(made_model *mm);

/* moe_shards.cu: W = 2 and 4, EP and TP, of mini in format fmt (PASS / FAIL lines). */
void test_shards(int fmt, int w4a4); /* w4a4: layer 1 with MXFP4 activations */
#endif
