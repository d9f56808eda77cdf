/* npy.h: NumPy .npy files of f32 arrays (format version 1.0, '<f4', C order).
 *
 * The writer is what `sparkmono logits` uses to hand logits to Python cross-checks; the
 * reader parses exactly what the writer produces (plus any v1.0 '<f4' C-order file), for
 * tests and comparisons.  Files are written through src/base/outfile.h: a temporary file in the
 * same directory, fsync'd and renamed onto the target when complete, so a reader never sees
 * half a file; a target that exists and is not a regular file (device, FIFO, directory,
 * symbolic link) is refused.  We rejected .npz and raw dumps:
 * .npz needs zip, and a raw dump loses the shape.
 */
#ifndef SM_NPY_H
#define SM_NPY_H
#include <stdint.h>
#include "base/err.h"

#define SM_NPY_MAX_DIMS 8

/* Write data [shape[0], ..., shape[ndim-1]] (f32, C order) to path (temp + fsync + rename;
 * on error the temporary file is removed and path is untouched).
 * 1 <= ndim <= SM_NPY_MAX_DIMS, every dim >= 0.  Errors name the path. */
int sm_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, sm_err *e);

/* Read a v1.0 '<f4' C-order file: *data malloc'd [numel], shape [SM_NPY_MAX_DIMS], *ndim.
 * Errors name the path and what is wrong (magic, version, header field, size). */
int sm_npy_read_f32(const char *path, float **data, int *ndim, int64_t *shape, sm_err *e);

#endif
