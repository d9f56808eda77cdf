/* outfile.c: atomic replacement of a file through a temporary file (see outfile.h).
 *
 * open: lstat the target (refuse anything but absent or a regular file), mkstemp next to it,
 * fchmod to the mode a plain create would give, fdopen.  commit: fflush + fsync + fclose, lstat
 * the target again (it may have changed since open), rename, fsync the directory so the
 * rename itself is durable.  We rejected O_TMPFILE + linkat: it cannot replace an existing
 * file atomically and is not available on every filesystem.
 */
#include "base/outfile.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sm_outfile_check(const char *path, sm_err *e) {
    struct stat st;
    if (!path || !*path) return sm_errf(e, "empty output path");
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return sm_errf(e, "%s: cannot inspect the output path: %s", path, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return sm_errf(e, "%s: output is a symbolic link: refused (give the file it points to)", path);
    const char *what = S_ISREG(st.st_mode)    ? NULL
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    if (what) return sm_errf(e, "%s: output exists and is %s: only a regular file is replaced", path, what);
    return 0;
}

/* The directory of path ("." when it has no '/'), malloc'd. */
static char *dir_of(const char *path) {
    const char *s = strrchr(path, '/');
    if (!s) return strdup(".");
    size_t n = s == path ? 1 : (size_t)(s - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

void sm_outfile_abort(sm_outfile *o) {
    if (o->f) {
        fclose(o->f);
        o->f = NULL;
        if (o->tmp) unlink(o->tmp);
    }
    free(o->path);
    free(o->tmp);
    memset(o, 0, sizeof *o);
}

int sm_outfile_open(sm_outfile *o, const char *path, sm_err *e) {
    memset(o, 0, sizeof *o);
    if (sm_outfile_check(path, e)) return -1;
    struct stat st;
    mode_t mode;
    if (lstat(path, &st) == 0) {
        mode = st.st_mode & 07777; /* replacing a regular file: keep its mode */
    } else {
        /* umask can only be read by setting it: set it back at once (no other thread of ours
         * creates files meanwhile) */
        mode_t mask = umask(0);
        umask(mask);
        mode = 0666 & ~mask;
    }
    size_t n = strlen(path) + 16;
    o->path = strdup(path);
    o->tmp = malloc(n);
    if (!o->path || !o->tmp) {
        sm_outfile_abort(o);
        return sm_errf(e, "%s: out of memory", path);
    }
    snprintf(o->tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        int er = errno;
        char *d = dir_of(path);
        sm_errf(e, "%s: cannot create a temporary file in '%s': %s", path, d ? d : "?", strerror(er));
        free(d);
        sm_outfile_abort(o);
        return -1;
    }
    if (fchmod(fd, mode) != 0 || !(o->f = fdopen(fd, "wb"))) {
        int er = errno;
        close(fd);
        unlink(o->tmp);
        sm_errf(e, "%s: cannot set up the temporary file %s: %s", path, o->tmp, strerror(er));
        sm_outfile_abort(o);
        return -1;
    }
    return 0;
}

int sm_outfile_commit(sm_outfile *o, sm_err *e) {
    if (!o->f) {
        sm_outfile_abort(o);
        return sm_errf(e, "output file not open");
    }
    int er = 0;
    if (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0) er = errno ? errno : EIO;
    if (fclose(o->f) != 0 && !er) er = errno ? errno : EIO;
    o->f = NULL;
    if (er) {
        unlink(o->tmp);
        sm_errf(e, "%s: write error on %s: %s", o->path, o->tmp, strerror(er));
        sm_outfile_abort(o);
        return -1;
    }
    if (sm_outfile_check(o->path, e)) { /* the target changed since open */
        unlink(o->tmp);
        sm_outfile_abort(o);
        return -1;
    }
    if (rename(o->tmp, o->path) != 0) {
        er = errno;
        unlink(o->tmp);
        sm_errf(e, "%s: cannot rename %s into place: %s", o->path, o->tmp, strerror(er));
        sm_outfile_abort(o);
        return -1;
    }
    /* make the rename durable: fsync the directory (best effort: some filesystems refuse) */
    char *d = dir_of(o->path);
    int dfd = d ? open(d, O_RDONLY | O_DIRECTORY) : -1;
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(d);
    sm_outfile_abort(o); /* frees; nothing left to remove */
    return 0;
}
