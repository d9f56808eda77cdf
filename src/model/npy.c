/* npy.c: .npy v1.0 writer and reader for f32 arrays (see npy.h).
 *
 * Layout: magic "\x93NUMPY", version 1.0, a little-endian u16 header length, an ASCII Python
 * dict {'descr': '<f4', 'fortran_order': False, 'shape': (...), } padded with spaces and a
 * final '\n' so the data starts at a multiple of 64 bytes (what numpy itself writes), then
 * the raw little-endian f32 values.  We rejected writing through a generic serializer: the
 * header is one snprintf.
 */
#include "model/npy.h"
#include "base/outfile.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int host_is_le(void) {
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static uint32_t bswap32(uint32_t x) {
    return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}

/* Build the padded header (magic through '\n') into buf; returns its length or -1. */
static int npy_header(int ndim, const int64_t *shape, char *buf, size_t cap) {
    char dict[512], dims[400];
    size_t n = 0;
    dims[0] = 0;
    for (int i = 0; i < ndim; i++) {
        int w = snprintf(dims + n, sizeof dims - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w < 0 || (size_t)w >= sizeof dims - n) return -1;
        n += (size_t)w;
    }
    int dl = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s%s), }",
                      dims, ndim == 1 ? "," : "");
    if (dl < 0 || (size_t)dl >= sizeof dict) return -1;
    /* pad so that 10 + header length is a multiple of 64, the header ending in '\n' */
    size_t total = 10 + (size_t)dl + 1;
    total = (total + 63) / 64 * 64;
    if (total > cap || total - 10 > 65535) return -1;
    size_t hl = total - 10;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)(hl & 0xff);
    buf[9] = (char)(hl >> 8);
    memcpy(buf + 10, dict, (size_t)dl);
    memset(buf + 10 + dl, ' ', total - 10 - (size_t)dl - 1);
    buf[total - 1] = '\n';
    return (int)total;
}

int sm_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, sm_err *e) {
    if (!path || !*path) return sm_errf(e, "npy: empty output path");
    if (ndim < 1 || ndim > SM_NPY_MAX_DIMS) return sm_errf(e, "%s: npy rank %d not in [1, %d]", path, ndim, SM_NPY_MAX_DIMS);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return sm_errf(e, "%s: npy dim %d is negative (%lld)", path, i, (long long)shape[i]);
        numel *= shape[i];
    }
    if (numel > 0 && !data) return sm_errf(e, "%s: npy data is NULL", path);
    char hdr[1024];
    int hl = npy_header(ndim, shape, hdr, sizeof hdr);
    if (hl < 0) return sm_errf(e, "%s: npy header too long", path);

    /* temp file next to the target, fsync'd and renamed onto it when complete (outfile.h) */
    sm_outfile of;
    if (sm_outfile_open(&of, path, e)) return -1;
    FILE *f = of.f;
    errno = 0;
    int ok = fwrite(hdr, 1, (size_t)hl, f) == (size_t)hl;
    if (ok && host_is_le()) {
        ok = fwrite(data, sizeof(float), (size_t)numel, f) == (size_t)numel;
    } else if (ok) {
        /* big-endian host: swap in chunks */
        uint32_t chunk[1024];
        for (int64_t i = 0; ok && i < numel; i += 1024) {
            int64_t m = numel - i < 1024 ? numel - i : 1024;
            memcpy(chunk, data + i, (size_t)m * 4);
            for (int64_t j = 0; j < m; j++) chunk[j] = bswap32(chunk[j]);
            ok = fwrite(chunk, 4, (size_t)m, f) == (size_t)m;
        }
    }
    if (!ok) {
        int err = errno;
        sm_errf(e, "%s: write failed: %s", path, err ? strerror(err) : "short write");
        sm_outfile_abort(&of);
        return -1;
    }
    return sm_outfile_commit(&of, e);
}

/* Skip spaces. */
static const char *ws(const char *p) {
    while (*p == ' ') p++;
    return p;
}

/* Find the value after 'key': in the header dict; NULL if absent. */
static const char *dict_value(const char *h, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "'%s':", key);
    const char *p = strstr(h, pat);
    return p ? ws(p + strlen(pat)) : NULL;
}

int sm_npy_read_f32(const char *path, float **data, int *ndim, int64_t *shape, sm_err *e) {
    *data = NULL;
    *ndim = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return sm_errf(e, "%s: cannot open: %s", path, strerror(errno));
    unsigned char pre[12];
    char *h = NULL;
    float *d = NULL;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        sm_errf(e, "%s: not a .npy file (bad magic)", path);
        goto fail;
    }
    size_t hl, off;
    if (pre[6] == 1) {
        hl = (size_t)pre[8] | (size_t)pre[9] << 8;
        off = 10;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) { sm_errf(e, "%s: truncated npy header", path); goto fail; }
        hl = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        off = 12;
    } else {
        sm_errf(e, "%s: npy version %d.%d not supported", path, pre[6], pre[7]);
        goto fail;
    }
    if (hl > (1u << 20)) { sm_errf(e, "%s: npy header length %zu too large", path, hl); goto fail; }
    h = malloc(hl + 1);
    if (!h) { sm_errf(e, "%s: out of memory", path); goto fail; }
    if (fread(h, 1, hl, f) != hl) { sm_errf(e, "%s: truncated npy header", path); goto fail; }
    h[hl] = 0;
    const char *v = dict_value(h, "descr");
    if (!v || strncmp(v, "'<f4'", 5) != 0) { sm_errf(e, "%s: npy descr is not '<f4'", path); goto fail; }
    v = dict_value(h, "fortran_order");
    if (!v || strncmp(v, "False", 5) != 0) { sm_errf(e, "%s: npy fortran_order is not False", path); goto fail; }
    v = dict_value(h, "shape");
    if (!v || *v != '(') { sm_errf(e, "%s: npy shape missing", path); goto fail; }
    v = ws(v + 1);
    int nd = 0;
    int64_t numel = 1;
    while (*v != ')') {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || errno || x < 0 || nd >= SM_NPY_MAX_DIMS) { sm_errf(e, "%s: bad npy shape", path); goto fail; }
        shape[nd++] = x;
        if (x > 0 && numel > INT64_MAX / 4 / x) { sm_errf(e, "%s: npy shape too large", path); goto fail; }
        numel *= x;
        v = ws(end);
        if (*v == ',') v = ws(v + 1);
        else if (*v != ')') { sm_errf(e, "%s: bad npy shape", path); goto fail; }
    }
    /* the data must be exactly numel f32 values */
    if (fseek(f, 0, SEEK_END) != 0) { sm_errf(e, "%s: cannot seek", path); goto fail; }
    long size = ftell(f);
    if (size < 0 || (int64_t)size != (int64_t)(off + hl) + numel * 4) {
        sm_errf(e, "%s: npy file is %ld bytes, header says %lld", path, size, (long long)(off + hl + numel * 4));
        goto fail;
    }
    d = malloc(numel ? (size_t)numel * 4 : 1);
    if (!d) { sm_errf(e, "%s: out of memory", path); goto fail; }
    if (fseek(f, (long)(off + hl), SEEK_SET) != 0 || fread(d, 4, (size_t)numel, f) != (size_t)numel) {
        sm_errf(e, "%s: short read of npy data", path);
        goto fail;
    }
    if (!host_is_le()) {
        uint32_t *u = (uint32_t *)d;
        for (int64_t i = 0; i < numel; i++) u[i] = bswap32(u[i]);
    }
    fclose(f);
    free(h);
    *data = d;
    *ndim = nd;
    return 0;
fail:
    fclose(f);
    free(h);
    free(d);
    return -1;
}
