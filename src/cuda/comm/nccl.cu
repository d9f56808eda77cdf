/* nccl.cu: the NCCL transport of gcomm.h: libnccl.so.2 loaded with dlopen at creation (its
 * absence is one line, not a link error), one communicator per rank (ncclCommInitAll over the
 * world's devices), and per operation an all-gather of the rank's part (bytes, ncclInt8) into
 * the rank's gather buffer, laid out as W consecutive parts; ops.cu then runs the same
 * rank-order finish kernels as the peer transport on it.
 *
 * We rejected linking libnccl: the binary would not start on a machine without NCCL, though the
 * peer transport and the CPU backend need none; and NCCL's own all-reduce: its summation order
 * depends on the algorithm it picks, ours must be rank order (docs/parallelism.md).  nccl.h
 * (the system's copy, else NVIDIA's wheel: tools/nccl-header.sh) gives the types only.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/comm/gc.cuh"

int gc_nccl_load(gc_nccl_api *api, sm_err *e) {
    memset(api, 0, sizeof *api);
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* never NVLink multicast, before NCCL reads its environment */
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        return sm_errf(e, "--comm nccl: libnccl.so.2 not found (%s)", why ? why : "dlopen failed");
    }
    api->lib = lib;
    const char *missing = NULL;
#define GC_SYM(field, name)                                                    \
    do {                                                                       \
        *(void **)&api->field = dlsym(lib, name);                              \
        if (!api->field && !missing) missing = name;                           \
    } while (0)
    GC_SYM(init_all, "ncclCommInitAll");
    GC_SYM(all_gather, "ncclAllGather");
    GC_SYM(destroy, "ncclCommDestroy");
    GC_SYM(errstr, "ncclGetErrorString");
#undef GC_SYM
    if (missing) {
        gc_nccl_unload(api);
        return sm_errf(e, "--comm nccl: libnccl.so.2 lacks %s", missing);
    }
    return 0;
}

void gc_nccl_unload(gc_nccl_api *api) {
    if (api->lib) dlclose(api->lib);
    memset(api, 0, sizeof *api);
}

int gc_nccl_init(sm_gcomm_world *w, const int *devices, sm_err *e) {
    ncclComm_t *comms = (ncclComm_t *)calloc((size_t)w->W, sizeof *comms);
    if (!comms) return sm_errf(e, "comm: out of memory for %d NCCL communicators", w->W);
    ncclResult_t rc = w->nccl.init_all(comms, w->W, devices);
    if (rc != ncclSuccess) {
        free(comms);
        return sm_errf(e, "ncclCommInitAll(%d ranks) failed at %s:%d: %s", w->W, __FILE__, __LINE__,
                       w->nccl.errstr(rc));
    }
    for (int r = 0; r < w->W; r++) w->ranks[r].nccl_comm = comms[r];
    free(comms);
    return 0;
}

void gc_nccl_fini(sm_gcomm_world *w) {
    for (int r = 0; r < w->W; r++) {
        sm_gcomm *gc = &w->ranks[r];
        if (!gc->nccl_comm || !w->nccl.destroy) continue;
        ncclResult_t rc = w->nccl.destroy(gc->nccl_comm);
        if (rc != ncclSuccess)
            fprintf(stderr, "ncclCommDestroy(rank %d) failed at %s:%d: %s\n", r, __FILE__, __LINE__,
                    w->nccl.errstr(rc));
        gc->nccl_comm = NULL;
    }
}

int gc_nccl_gather(sm_gcomm *gc, const void *part, size_t bytes, cudaStream_t st, sm_err *e) {
    sm_gcomm_world *w = gc->w;
    ncclResult_t rc = w->nccl.all_gather(part, gc->gbuf, bytes, ncclInt8, gc->nccl_comm, st);
    if (rc != ncclSuccess)
        return sm_errf(e, "ncclAllGather(%zu bytes) failed at %s:%d (device %d): %s", bytes, __FILE__, __LINE__,
                       gc->dev, w->nccl.errstr(rc));
    return 0;
}
