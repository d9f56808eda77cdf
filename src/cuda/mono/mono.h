/* mono.h: the C view of the monokernel (src/cuda/mono/) for code outside src/cuda: its static
 * eligibility check.  The monokernel itself runs inside the CUDA backend (backend.h:
 * sm_backend_opts.mono). */
#ifndef SM_CUDA_MONO_H
#define SM_CUDA_MONO_H
#include <stddef.h>
#include "model/config.h"
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif
/* The static refusals of a model (config cf, expert format of each layer fmt [L], NULL: unknown)
 * on CUDA device `device` into buf, "" when eligible; -1 (with a line) when the device is
 * missing. */
int sm_cuda_mono_check(const sm_config *cf, const int *fmt, int device, char *buf, size_t cap, sm_err *e);
#ifdef __cplusplus
}
#endif
#endif
