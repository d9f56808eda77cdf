/* safetensors.h: strict reader (mmap) and streaming writer of the safetensors format.
 *
 * Reader: a single `model.safetensors`, or a directory whose `model.safetensors.index.json`
 * maps tensor names to shard files.  Files are mmapped read-only; tensors are views into the
 * mapping, never copies.  Validation follows the format: 8-byte little-endian header length
 * bounded by the file and by 100 MB, valid JSON object, known dtype, shape x dtype size equal
 * to the byte range, ranges inside the data section, no two ranges overlapping, optional
 * `__metadata__` (string -> string).  Every error names the file (and tensor).
 *
 * Writer: streaming, so a model larger than memory can be written: declare every tensor
 * (name, dtype, shape) first, then write their bytes in declaration order.  The file is
 * written through the project's one atomic-replace helper (outfile.h: a temporary file next to
 * it, fsync'd and renamed on st_writer_finish); st_writer_abort removes it.
 * We rejected a "build everything in memory, then dump" writer: spark1x is hundreds of GB.
 */
#ifndef SM_SAFETENSORS_H
#define SM_SAFETENSORS_H
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include "base/err.h"
#include "base/outfile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_U16, ST_I16, ST_U32, ST_I32, ST_U64, ST_I64,
    ST_F16, ST_BF16, ST_F32, ST_F64,
    ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0, ST_F4,
    ST_NDTYPES
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    char *name;                 /* owned */
    st_dtype dtype;             /* element type */
    int ndim;                   /* 0..ST_MAX_DIMS (0: a scalar, numel 1) */
    int64_t shape[ST_MAX_DIMS]; /* [ndim] elements per dim */
    int64_t numel;              /* product of shape */
    const void *data;           /* view into the mapped file */
    size_t nbytes;              /* data_offsets end - begin */
    int file;                   /* index into st_archive.files */
} st_tensor;

typedef struct st_file {
    char *path;                 /* owned */
    void *map;                  /* whole file mapping */
    size_t size;                /* file size in bytes */
    size_t header_len;          /* JSON header bytes; the data section starts at 8 + header_len */
    char **meta;                /* [2*nmeta] __metadata__ key, value, key, value, ... (owned) */
    int nmeta;                  /* __metadata__ entries */
} st_file;

typedef struct st_archive {
    st_file *files;   int nfiles;    /* [nfiles] */
    st_tensor *tensors; int ntensors; /* [ntensors], sorted by name */
} st_archive;

/* dtype name as in the format ("BF16", "F8_E4M3", ...) and back; -1 if unknown. */
const char *st_dtype_name(st_dtype t);
int st_dtype_from_name(const char *s);
/* Storage bits per element (F4: 4, BF16: 16, ...). */
int st_dtype_bits(st_dtype t);
/* Bytes for numel elements of dtype; -1 if numel*bits is not a whole number of bytes. */
int64_t st_nbytes(st_dtype t, int64_t numel);

/* Open one .safetensors file into a fresh archive (*a is overwritten, not closed first).
 * On error *a is left empty (zeroed): st_close on it is a harmless no-op. */
int st_open_file(const char *path, st_archive *a, sm_err *e);
/* Open a model directory: model.safetensors.index.json (weight_map, every listed shard must
 * hold exactly the tensors mapped to it; a name in two shards is an error) or else
 * model.safetensors.  Shard names must be relative paths without "..".  Same error rule. */
int st_open_dir(const char *dir, st_archive *a, sm_err *e);
/* Binary search by name; NULL when absent. */
const st_tensor *st_find(const st_archive *a, const char *name);
/* Value of __metadata__ key `key` of file `file` (index into a->files); NULL when absent. */
const char *st_metadata(const st_archive *a, int file, const char *key);
/* Unmap and free; leaves *a zeroed. Safe on a zeroed archive. */
void st_close(st_archive *a);

/* Streaming writer. */
typedef struct st_writer {
    sm_outfile out;             /* the target path, its temporary file and the open stream
                                   (out.f: NULL when the writer is not open) */
    int n, cap;                 /* declared tensors */
    char **names; int *dtypes; int *ndims; int64_t (*shapes)[ST_MAX_DIMS];
    int64_t *sizes;             /* [n] bytes each */
    int64_t total;              /* bytes of the data section declared so far */
    int next;                   /* next tensor expected by st_writer_write */
    int64_t written;            /* bytes of tensor `next` written so far */
    int started;                /* header written */
    void *hdr;                  /* json_t object: name -> {dtype, shape, data_offsets} */
    void *meta;                 /* json_t object: __metadata__ key -> string value */
} st_writer;

/* Start writing `path` (through a temporary file "<path>.tmp.XXXXXX", outfile.h; only a regular
 * file or a new one may be the target).  Zeroes *w first; on error *w stays zeroed. */
int st_writer_open(st_writer *w, const char *path, sm_err *e);
/* Add a __metadata__ entry (string -> string); before the first write. */
int st_writer_metadata(st_writer *w, const char *key, const char *value, sm_err *e);
/* Declare a tensor; all declarations precede the first write. */
int st_writer_declare(st_writer *w, const char *name, st_dtype t, int ndim, const int64_t *shape, sm_err *e);
/* Append bytes of the current tensor (may be called several times per tensor; moves to the
 * next tensor when the current one is complete; one call never spans two tensors, and
 * empty tensors are skipped). Writes the header on the first call (nbytes may be 0). */
int st_writer_write(st_writer *w, const void *data, size_t nbytes, sm_err *e);
/* Check every declared byte was written, then flush, fsync, close and rename into place
 * (sm_outfile_commit).
 * Always releases the writer: on error the temporary file is removed as by st_writer_abort. */
int st_writer_finish(st_writer *w, sm_err *e);
/* Remove the temporary file and free. Safe after finish (no-op then) or on error. */
void st_writer_abort(st_writer *w);

#ifdef __cplusplus
}
#endif
#endif
