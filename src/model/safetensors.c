/* safetensors.c: strict mmap reader and streaming writer of the safetensors format
 * (see safetensors.h).
 *
 * Reader: open + fstat + mmap(PROT_READ, MAP_PRIVATE) of the whole file, the JSON header parsed
 * by jansson with duplicate keys rejected, every entry validated (dtype, shape x dtype size ==
 * byte range, range inside the data section, no overlaps), then all tensors of all files sorted
 * by name for st_find's binary search.  Tensors are views into the mapping.  Sharded
 * directories are checked both ways against the index's weight_map.
 * Writer: the header is built as a jansson object while tensors are declared (data offsets
 * contiguous in declaration order), dumped on the first write, padded with spaces to a multiple
 * of 8 bytes, and the bytes stream behind it into the temporary file of an sm_outfile
 * (outfile.h), fsync'd and renamed into place on finish.
 * We rejected read()-ing files into heap buffers: the real checkpoint is hundreds of GB and the
 * GPU upload reads straight from the page cache.  We also rejected a hand-written JSON scanner:
 * jansson already gives strict UTF-8, duplicate-key and integer-overflow checks.
 */
#include "model/safetensors.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull /* header length bound of the format (100 MB) */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

/* ---------------------------------------------------------------- dtypes */

static const char *const dtype_names[ST_NDTYPES] = {
    "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64",
    "F16", "BF16", "F32", "F64",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4",
};
static const int dtype_bits[ST_NDTYPES] = {
    8, 8, 8, 16, 16, 32, 32, 64, 64,
    16, 16, 32, 64,
    8, 8, 8, 4,
};

const char *st_dtype_name(st_dtype t) {
    return (unsigned)t < ST_NDTYPES ? dtype_names[t] : "?";
}

int st_dtype_from_name(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(s, dtype_names[i])) return i;
    return -1;
}

int st_dtype_bits(st_dtype t) {
    return (unsigned)t < ST_NDTYPES ? dtype_bits[t] : 0;
}

int64_t st_nbytes(st_dtype t, int64_t numel) {
    int bits = st_dtype_bits(t);
    if (!bits || numel < 0 || numel > INT64_MAX / bits) return -1;
    int64_t b = numel * bits;
    return b % 8 ? -1 : b / 8;
}

/* ---------------------------------------------------------------- small helpers */

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* "dir/name" (no doubled slash); malloc'd, NULL on out of memory. */
static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = malloc(a + slash + b + 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

/* "[3, 2]" into buf. */
static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* Product of dims, with overflow -> -1 (any zero dim gives 0 whatever the others). */
static int64_t numel_of(int ndim, const int64_t *shape) {
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

/* ---------------------------------------------------------------- reader */

typedef struct range { int64_t begin, end; int t; } range; /* one tensor's data_offsets */

static int range_cmp(const void *pa, const void *pb) {
    const range *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return 0;
}

static int tensor_cmp(const void *pa, const void *pb) {
    return strcmp(((const st_tensor *)pa)->name, ((const st_tensor *)pb)->name);
}

/* Read a JSON integer >= 0 into *v; 0 on success. */
static int get_nonneg(const json_t *j, int64_t *v) {
    if (!json_is_integer(j)) return -1;
    json_int_t x = json_integer_value(j);
    if (x < 0) return -1;
    *v = (int64_t)x;
    return 0;
}

/* Parse the __metadata__ object into f->meta. */
static int parse_metadata(st_file *f, json_t *m, sm_err *e) {
    if (!json_is_object(m))
        return sm_errf(e, "%s: __metadata__ must be an object of strings", f->path);
    size_t n = json_object_size(m);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta) return sm_errf(e, "%s: out of memory for __metadata__", f->path);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return sm_errf(e, "%s: __metadata__ must be an object of strings (key '%s' is not a string)",
                           f->path, k);
        char *kd = xstrdup(k), *vd = xstrdup(json_string_value(v));
        f->meta[2 * f->nmeta] = kd;
        f->meta[2 * f->nmeta + 1] = vd;
        f->nmeta++;
        if (!kd || !vd) return sm_errf(e, "%s: out of memory for __metadata__", f->path);
    }
    return 0;
}

/* Validate one tensor entry of file f (data section of dlen bytes at base) into *t. */
static int parse_entry(const st_file *f, const char *name, json_t *v, const char *base,
                       int64_t dlen, st_tensor *t, range *r, sm_err *e) {
    const char *p = f->path;
    if (!*name) return sm_errf(e, "%s: a tensor has an empty name", p);
    if (!json_is_object(v)) return sm_errf(e, "%s: tensor '%s': entry is not a JSON object", p, name);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return sm_errf(e, "%s: tensor '%s': unknown field '%s'", p, name, k);
    }
    /* dtype */
    json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd)) return sm_errf(e, "%s: tensor '%s': missing or non-string dtype", p, name);
    int dt = st_dtype_from_name(json_string_value(jd));
    if (dt < 0) return sm_errf(e, "%s: tensor '%s': unknown dtype '%s'", p, name, json_string_value(jd));
    t->dtype = (st_dtype)dt;
    /* shape */
    json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js) || json_array_size(js) > ST_MAX_DIMS)
        return sm_errf(e, "%s: tensor '%s': shape must be an array of at most %d non-negative integers",
                       p, name, ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    for (int i = 0; i < t->ndim; i++)
        if (get_nonneg(json_array_get(js, (size_t)i), &t->shape[i]))
            return sm_errf(e, "%s: tensor '%s': shape[%d] is not a non-negative integer", p, name, i);
    char sb[256];
    shape_str(sb, sizeof sb, t->ndim, t->shape);
    t->numel = numel_of(t->ndim, t->shape);
    if (t->numel < 0) return sm_errf(e, "%s: tensor '%s': shape %s overflows 64 bits", p, name, sb);
    int64_t nb = st_nbytes(t->dtype, t->numel);
    if (nb < 0) {
        if (t->dtype == ST_F4 && t->numel % 2)
            return sm_errf(e, "%s: tensor '%s': F4 shape %s has an odd element count %" PRId64
                           " (two elements a byte)", p, name, sb, t->numel);
        return sm_errf(e, "%s: tensor '%s': shape %s x %s overflows 64 bits", p, name, sb,
                       st_dtype_name(t->dtype));
    }
    /* data_offsets */
    json_t *jo = json_object_get(v, "data_offsets");
    int64_t b, en;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || get_nonneg(json_array_get(jo, 0), &b) ||
        get_nonneg(json_array_get(jo, 1), &en))
        return sm_errf(e, "%s: tensor '%s': data_offsets must be [begin, end], two non-negative integers",
                       p, name);
    if (b > en)
        return sm_errf(e, "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] are reversed (begin > end)",
                       p, name, b, en);
    if (en > dlen)
        return sm_errf(e, "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] run past the data "
                       "section (%" PRId64 " bytes)", p, name, b, en, dlen);
    if (en - b != nb)
        return sm_errf(e, "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] do not match shape %s"
                       " x %s (%" PRId64 " bytes)", p, name, b, en, sb, st_dtype_name(t->dtype), nb);
    t->data = base + b;
    t->nbytes = (size_t)nb;
    r->begin = b;
    r->end = en;
    return 0;
}

/* Map one file and append it and its validated tensors to *a (not sorted yet).  On error the
 * partial file stays registered in *a so st_close releases it. */
/* Map the file at path read-only and append it to a->files (its path owned); *fi its index. */
static int map_file(st_archive *a, const char *path, int *fi, sm_err *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sm_errf(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        int er = errno;
        close(fd);
        return sm_errf(e, "%s: cannot stat: %s", path, strerror(er));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return sm_errf(e, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return sm_errf(e, "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
                       path, size);
    }
    if (size > SIZE_MAX) {
        close(fd);
        return sm_errf(e, "%s: file of %" PRIu64 " bytes does not fit the address space", path, size);
    }
    /* size >= 8, so the mapping is never empty even when the data section is */
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int er = errno;
    close(fd);
    if (map == MAP_FAILED) return sm_errf(e, "%s: cannot mmap %" PRIu64 " bytes: %s", path, size, strerror(er));

    st_file *nf = realloc(a->files, (size_t)(a->nfiles + 1) * sizeof *nf);
    if (!nf) {
        munmap(map, (size_t)size);
        return sm_errf(e, "%s: out of memory", path);
    }
    a->files = nf;
    *fi = a->nfiles++;
    st_file *f = &a->files[*fi];
    memset(f, 0, sizeof *f);
    f->map = map;
    f->size = (size_t)size;
    f->path = xstrdup(path);
    if (!f->path) return sm_errf(e, "%s: out of memory", path);
    return 0;
}

/* Parse and validate the header of mapped file fi into a->tensors. */
static int parse_header(st_archive *a, int fi, sm_err *e) {
    st_file *f = &a->files[fi];
    const char *path = f->path;
    const void *map = f->map;
    uint64_t size = (uint64_t)f->size;
    /* header length: 8 bytes little endian */
    const unsigned char *m = map;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | m[i];
    if (hl > ST_MAX_HEADER)
        return sm_errf(e, "%s: header length %" PRIu64 " exceeds the 100 MB limit", path, hl);
    if (hl > size - 8)
        return sm_errf(e, "%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64
                       " bytes; truncated?)", path, hl, size);
    f->header_len = (size_t)hl;
    const char *base = (const char *)map + 8 + hl;
    int64_t dlen = (int64_t)(size - 8 - hl);

    /* header JSON: any value accepted by the parser, so "not an object" gets its own message */
    json_error_t je;
    json_t *root = json_loadb((const char *)map + 8, (size_t)hl, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_duplicate_key)
            return sm_errf(e, "%s: header has a duplicate key: %s (line %d, column %d)", path, je.text,
                           je.line, je.column);
        return sm_errf(e, "%s: header is not valid JSON: %s (line %d, column %d)", path, je.text, je.line,
                       je.column);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return sm_errf(e, "%s: header is not a JSON object", path);
    }

    size_t nent = json_object_size(root);
    int rc = 0;
    range *rs = NULL;
    int nr = 0;
    if (nent > (size_t)INT32_MAX - (size_t)a->ntensors) {
        rc = sm_errf(e, "%s: too many tensors (%zu)", path, nent);
        goto done;
    }
    st_tensor *nt = realloc(a->tensors, (a->ntensors + nent + 1) * sizeof *nt);
    rs = malloc((nent + 1) * sizeof *rs);
    if (nt) a->tensors = nt;
    if (!nt || !rs) {
        rc = sm_errf(e, "%s: out of memory for %zu tensors", path, nent);
        goto done;
    }
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(root, k, klen, v) {
        if (klen != strlen(k)) {
            rc = sm_errf(e, "%s: a tensor name holds a NUL byte", path);
            goto done;
        }
        if (!strcmp(k, "__metadata__")) {
            if ((rc = parse_metadata(f, v, e))) goto done;
            continue;
        }
        st_tensor *t = &a->tensors[a->ntensors];
        memset(t, 0, sizeof *t);
        t->file = fi;
        if ((rc = parse_entry(f, k, v, base, dlen, t, &rs[nr], e))) goto done;
        t->name = xstrdup(k);
        if (!t->name) {
            rc = sm_errf(e, "%s: out of memory", path);
            goto done;
        }
        rs[nr].t = a->ntensors;
        nr++;
        a->ntensors++;
    }
    /* no two non-empty ranges overlap: sorted by begin, each starts at or after the last end */
    qsort(rs, (size_t)nr, sizeof *rs, range_cmp);
    int last = -1;
    for (int i = 0; i < nr; i++) {
        if (rs[i].begin == rs[i].end) continue;
        if (last >= 0 && rs[i].begin < rs[last].end) {
            rc = sm_errf(e, "%s: tensor '%s' data_offsets [%" PRId64 ", %" PRId64 "] overlap tensor '%s' [%"
                         PRId64 ", %" PRId64 "]", path, a->tensors[rs[i].t].name, rs[i].begin, rs[i].end,
                         a->tensors[rs[last].t].name, rs[last].begin, rs[last].end);
            goto done;
        }
        if (last < 0 || rs[i].end > rs[last].end) last = i;
    }
done:
    free(rs);
    json_decref(root);
    return rc;
}

static int load_file(st_archive *a, const char *path, sm_err *e) {
    int fi;
    return map_file(a, path, &fi, e) || parse_header(a, fi, e) ? -1 : 0;
}

/* Sort by name and refuse a name present twice (only possible across files). */
static int sort_and_check(st_archive *a, sm_err *e) {
    if (a->ntensors > 1) qsort(a->tensors, (size_t)a->ntensors, sizeof *a->tensors, tensor_cmp);
    for (int i = 1; i < a->ntensors; i++)
        if (!strcmp(a->tensors[i - 1].name, a->tensors[i].name))
            return sm_errf(e, "tensor '%s' is in both %s and %s", a->tensors[i].name,
                           a->files[a->tensors[i - 1].file].path, a->files[a->tensors[i].file].path);
    return 0;
}

void st_close(st_archive *a) {
    if (!a) return;
    for (int i = 0; i < a->nfiles; i++) {
        st_file *f = &a->files[i];
        if (f->map) munmap(f->map, f->size);
        free(f->path);
        if (f->meta)
            for (int j = 0; j < 2 * f->nmeta; j++) free(f->meta[j]);
        free(f->meta);
    }
    for (int i = 0; i < a->ntensors; i++) free(a->tensors[i].name);
    free(a->files);
    free(a->tensors);
    memset(a, 0, sizeof *a);
}

int st_open_file(const char *path, st_archive *a, sm_err *e) {
    memset(a, 0, sizeof *a);
    if (load_file(a, path, e) || sort_and_check(a, e)) {
        st_close(a);
        return -1;
    }
    return 0;
}

/* A shard name from weight_map must stay inside the model directory. */
static int shard_name_ok(const char *s) {
    if (!*s || s[0] == '/') return 0;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return 0;
        if (!q) break;
        p = q + 1;
    }
    return 1;
}

/* Sharded directory: the index's weight_map against what the shards hold. */
static int open_index(const char *dir, const char *ipath, st_archive *a, sm_err *e) {
    json_error_t je;
    json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_cannot_open_file)
            return sm_errf(e, "%s: cannot read: %s", ipath, je.text);
        return sm_errf(e, "%s: not valid JSON: %s (line %d, column %d)", ipath, je.text, je.line, je.column);
    }
    int rc = 0;
    char **shards = NULL; /* [nshards] distinct shard names, file i of the archive = shards[i] */
    int nshards = 0;
    json_t *seen = json_object(); /* shard name -> first tensor mapped to it */
    json_t *wm = json_object_get(root, "weight_map");
    if (!seen) {
        rc = sm_errf(e, "%s: out of memory", ipath);
        goto done;
    }
    if (!json_is_object(wm)) {
        rc = sm_errf(e, "%s: missing weight_map object", ipath);
        goto done;
    }
    if (!json_object_size(wm)) {
        rc = sm_errf(e, "%s: weight_map is empty", ipath);
        goto done;
    }
    shards = calloc(json_object_size(wm), sizeof *shards);
    if (!shards) {
        rc = sm_errf(e, "%s: out of memory", ipath);
        goto done;
    }
    /* distinct shards, in order of first mention */
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = sm_errf(e, "%s: weight_map entry for tensor '%s' is not a string", ipath, name);
            goto done;
        }
        const char *sh = json_string_value(v);
        if (!shard_name_ok(sh)) {
            rc = sm_errf(e, "%s: weight_map entry for tensor '%s': shard '%s' is not a relative path inside "
                         "the model directory", ipath, name, sh);
            goto done;
        }
        if (json_object_get(seen, sh)) continue;
        if (json_object_set_new(seen, sh, json_string(name)) || !(shards[nshards] = xstrdup(sh))) {
            rc = sm_errf(e, "%s: out of memory", ipath);
            goto done;
        }
        nshards++;
    }
    /* open every shard */
    for (int i = 0; i < nshards; i++) {
        char *sp = path_join(dir, shards[i]);
        if (!sp) {
            rc = sm_errf(e, "%s: out of memory", ipath);
            goto done;
        }
        rc = load_file(a, sp, e);
        free(sp);
        if (rc) {
            sm_errprefix(e, "%s: shard '%s' (tensor '%s')", ipath, shards[i],
                         json_string_value(json_object_get(seen, shards[i])));
            goto done;
        }
    }
    if ((rc = sort_and_check(a, e))) goto done;
    /* every tensor a shard holds is mapped to that shard */
    for (int i = 0; i < a->ntensors; i++) {
        const st_tensor *t = &a->tensors[i];
        json_t *m = json_object_get(wm, t->name);
        if (!m) {
            rc = sm_errf(e, "%s: tensor '%s' is in shard '%s' but not in the index weight_map", ipath, t->name,
                         shards[t->file]);
            goto done;
        }
        if (strcmp(json_string_value(m), shards[t->file])) {
            rc = sm_errf(e, "%s: tensor '%s' is in shard '%s' but the index maps it to '%s'", ipath, t->name,
                         shards[t->file], json_string_value(m));
            goto done;
        }
    }
    /* every mapped tensor is in its shard */
    json_object_foreach(wm, name, v) {
        if (!st_find(a, name)) {
            rc = sm_errf(e, "%s: tensor '%s' is mapped to shard '%s' but that shard does not hold it", ipath,
                         name, json_string_value(v));
            goto done;
        }
    }
done:
    for (int i = 0; i < nshards; i++) free(shards[i]);
    free(shards);
    json_decref(seen);
    json_decref(root);
    return rc;
}

int st_open_dir(const char *dir, st_archive *a, sm_err *e) {
    memset(a, 0, sizeof *a);
    char *ip = path_join(dir, ST_INDEX_NAME), *sp = path_join(dir, ST_SINGLE_NAME);
    int rc;
    struct stat sb;
    if (!ip || !sp) {
        rc = sm_errf(e, "%s: out of memory", dir);
    } else if (stat(dir, &sb) != 0) {
        rc = sm_errf(e, "%s: cannot open model directory: %s", dir, strerror(errno));
    } else if (!S_ISDIR(sb.st_mode)) {
        rc = sm_errf(e, "%s: not a directory", dir);
    } else if (stat(ip, &sb) == 0) {
        rc = open_index(dir, ip, a, e);
    } else if (errno != ENOENT) {
        rc = sm_errf(e, "%s: cannot stat: %s", ip, strerror(errno));
    } else if (stat(sp, &sb) != 0 && errno == ENOENT) {
        rc = sm_errf(e, "%s: neither %s nor %s found", dir, ST_INDEX_NAME, ST_SINGLE_NAME);
    } else {
        rc = load_file(a, sp, e);
        if (!rc) rc = sort_and_check(a, e);
    }
    free(ip);
    free(sp);
    if (rc) st_close(a);
    return rc;
}

const st_tensor *st_find(const st_archive *a, const char *name) {
    int lo = 0, hi = a->ntensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, a->tensors[mid].name);
        if (!c) return &a->tensors[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *st_metadata(const st_archive *a, int file, const char *key) {
    if (file < 0 || file >= a->nfiles) return NULL;
    const st_file *f = &a->files[file];
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

/* ---------------------------------------------------------------- writer */

void st_writer_abort(st_writer *w) {
    if (!w) return;
    sm_outfile_abort(&w->out); /* closes and removes the temporary file if still open */
    for (int i = 0; i < w->n; i++) free(w->names[i]);
    free(w->names);
    free(w->dtypes);
    free(w->ndims);
    free(w->shapes);
    free(w->sizes);
    json_decref((json_t *)w->hdr);
    json_decref((json_t *)w->meta);
    memset(w, 0, sizeof *w);
}

int st_writer_open(st_writer *w, const char *path, sm_err *e) {
    memset(w, 0, sizeof *w);
    w->hdr = json_object();
    w->meta = json_object();
    if (!w->hdr || !w->meta) {
        st_writer_abort(w);
        return sm_errf(e, "%s: out of memory", path);
    }
    if (sm_outfile_open(&w->out, path, e)) {
        st_writer_abort(w);
        return -1;
    }
    return 0;
}

int st_writer_metadata(st_writer *w, const char *key, const char *value, sm_err *e) {
    if (!w->out.f) return sm_errf(e, "st_writer_metadata: writer is not open");
    if (w->started) return sm_errf(e, "%s: __metadata__ '%s' added after the first write", w->out.path, key);
    if (json_object_get(w->meta, key))
        return sm_errf(e, "%s: duplicate __metadata__ key '%s'", w->out.path, key);
    json_t *s = json_string(value);
    if (!s || json_object_set_new(w->meta, key, s))
        return sm_errf(e, "%s: __metadata__ '%s': key or value is not valid UTF-8", w->out.path, key);
    return 0;
}

int st_writer_declare(st_writer *w, const char *name, st_dtype t, int ndim, const int64_t *shape, sm_err *e) {
    if (!w->out.f) return sm_errf(e, "st_writer_declare: writer is not open");
    const char *p = w->out.path;
    if (w->started) return sm_errf(e, "%s: tensor '%s' declared after the first write", p, name);
    if (!*name || !strcmp(name, "__metadata__"))
        return sm_errf(e, "%s: tensor name '%s' is reserved or empty", p, name);
    if (json_object_get(w->hdr, name)) return sm_errf(e, "%s: duplicate tensor '%s'", p, name);
    if ((unsigned)t >= ST_NDTYPES) return sm_errf(e, "%s: tensor '%s': unknown dtype %d", p, name, (int)t);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return sm_errf(e, "%s: tensor '%s': %d dims (at most %d)", p, name, ndim, ST_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return sm_errf(e, "%s: tensor '%s': shape[%d] = %" PRId64 " is negative", p, name, i, shape[i]);
    char sb[256];
    shape_str(sb, sizeof sb, ndim, shape);
    int64_t numel = numel_of(ndim, shape);
    int64_t nb = numel < 0 ? -1 : st_nbytes(t, numel);
    if (nb < 0)
        return sm_errf(e, "%s: tensor '%s': shape %s x %s is not a whole number of bytes or overflows", p,
                       name, sb, st_dtype_name(t));
    if (nb > INT64_MAX - w->total) return sm_errf(e, "%s: tensor '%s': data section overflows 64 bits", p, name);
    /* grow the per-tensor arrays */
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        char **nn = realloc(w->names, (size_t)cap * sizeof *nn);
        if (nn) w->names = nn;
        int *nd = realloc(w->dtypes, (size_t)cap * sizeof *nd);
        if (nd) w->dtypes = nd;
        int *ni = realloc(w->ndims, (size_t)cap * sizeof *ni);
        if (ni) w->ndims = ni;
        int64_t(*ns)[ST_MAX_DIMS] = realloc(w->shapes, (size_t)cap * sizeof *ns);
        if (ns) w->shapes = ns;
        int64_t *nz = realloc(w->sizes, (size_t)cap * sizeof *nz);
        if (nz) w->sizes = nz;
        if (!nn || !nd || !ni || !ns || !nz) return sm_errf(e, "%s: out of memory declaring '%s'", p, name);
        w->cap = cap;
    }
    /* header entry: contiguous offsets in declaration order */
    json_t *ent = json_object(), *js = json_array(), *jo = json_array();
    int bad = !ent || !js || !jo;
    for (int i = 0; i < ndim && !bad; i++) bad |= json_array_append_new(js, json_integer(shape[i]));
    if (!bad) bad |= json_array_append_new(jo, json_integer(w->total));
    if (!bad) bad |= json_array_append_new(jo, json_integer(w->total + nb));
    if (!bad) bad |= json_object_set_new(ent, "dtype", json_string(st_dtype_name(t)));
    if (!bad) { bad |= json_object_set_new(ent, "shape", js); js = NULL; }
    if (!bad) { bad |= json_object_set_new(ent, "data_offsets", jo); jo = NULL; }
    json_decref(js);
    json_decref(jo);
    char *nm = bad ? NULL : xstrdup(name);
    if (!nm) {
        json_decref(ent);
        return sm_errf(e, "%s: out of memory declaring '%s'", p, name);
    }
    if (json_object_set_new(w->hdr, name, ent)) { /* steals ent even on failure */
        free(nm);
        return sm_errf(e, "%s: tensor '%s': name is not valid UTF-8", p, name);
    }
    int i = w->n++;
    w->names[i] = nm;
    w->dtypes[i] = (int)t;
    w->ndims[i] = ndim;
    memset(w->shapes[i], 0, sizeof w->shapes[i]);
    for (int d = 0; d < ndim; d++) w->shapes[i][d] = shape[d];
    w->sizes[i] = nb;
    w->total += nb;
    return 0;
}

/* Skip tensors already complete (and empty ones). */
static void writer_advance(st_writer *w) {
    while (w->next < w->n && w->written == w->sizes[w->next]) {
        w->next++;
        w->written = 0;
    }
}

/* Header: 8-byte LE length, compact JSON (__metadata__ first, then tensors in declaration
 * order), spaces up to a multiple of 8 bytes. */
static int writer_header(st_writer *w, sm_err *e) {
    json_t *root = json_object();
    int bad = !root;
    if (!bad && json_object_size(w->meta)) bad |= json_object_set(root, "__metadata__", w->meta);
    for (int i = 0; i < w->n && !bad; i++)
        bad |= json_object_set(root, w->names[i], json_object_get(w->hdr, w->names[i]));
    char *s = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!s) return sm_errf(e, "%s: out of memory building the header", w->out.path);
    size_t len = strlen(s), hl = (len + 7) / 8 * 8;
    if (hl > ST_MAX_HEADER) {
        free(s);
        return sm_errf(e, "%s: header of %zu bytes exceeds the 100 MB limit (%d tensors)", w->out.path, hl, w->n);
    }
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    int ok = fwrite(lb, 1, 8, w->out.f) == 8 && fwrite(s, 1, len, w->out.f) == len;
    for (size_t i = len; i < hl && ok; i++) ok = fputc(' ', w->out.f) != EOF;
    free(s);
    if (!ok) return sm_errf(e, "%s: write error on %s: %s", w->out.path, w->out.tmp, strerror(errno));
    w->started = 1;
    writer_advance(w);
    return 0;
}

int st_writer_write(st_writer *w, const void *data, size_t nbytes, sm_err *e) {
    if (!w->out.f) return sm_errf(e, "st_writer_write: writer is not open");
    if (!w->started && writer_header(w, e)) return -1;
    if (!nbytes) return 0;
    if (!data) return sm_errf(e, "%s: write of %zu bytes from a NULL buffer", w->out.path, nbytes);
    if (w->next >= w->n)
        return sm_errf(e, "%s: write of %zu bytes after the last declared tensor", w->out.path, nbytes);
    int64_t left = w->sizes[w->next] - w->written;
    if ((uint64_t)nbytes > (uint64_t)left)
        return sm_errf(e, "%s: tensor '%s': write of %zu bytes exceeds the %" PRId64 " bytes left", w->out.path,
                       w->names[w->next], nbytes, left);
    if (fwrite(data, 1, nbytes, w->out.f) != nbytes)
        return sm_errf(e, "%s: tensor '%s': write error on %s: %s", w->out.path, w->names[w->next], w->out.tmp,
                       strerror(errno));
    w->written += (int64_t)nbytes;
    writer_advance(w);
    return 0;
}

int st_writer_finish(st_writer *w, sm_err *e) {
    if (!w->out.f) return sm_errf(e, "st_writer_finish: writer is not open");
    if (!w->started && writer_header(w, e)) goto fail;
    if (w->next < w->n) {
        sm_errf(e, "%s: tensor '%s': %" PRId64 " of %" PRId64 " bytes written", w->out.path, w->names[w->next],
                w->written, w->sizes[w->next]);
        goto fail;
    }
    if (ferror(w->out.f)) {
        sm_errf(e, "%s: write error on %s", w->out.path, w->out.tmp);
        goto fail;
    }
    if (sm_outfile_commit(&w->out, e)) goto fail; /* flush, fsync, close, rename; releases out */
    st_writer_abort(w);                           /* frees the rest */
    return 0;
fail:
    st_writer_abort(w);
    return -1;
}
