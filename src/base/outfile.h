/* outfile.h: replace a file atomically: write a temporary file in the target's directory,
 * fsync it, rename it onto the target.  A reader sees the old file or the whole new one,
 * never half of it, and on any error the temporary file is removed and the target is left
 * as it was.
 *
 * Only a regular file may be replaced: a target that exists and is a device node (/dev/null,
 * /dev/full), a FIFO, a socket, a directory or a symbolic link (whatever it points to) is
 * refused before anything is created.  rename() would otherwise replace the device node or
 * the link itself (as root, /dev/null), not write through it.  The temporary file is made by
 * mkstemp ("<path>.tmp.XXXXXX": unique, created exclusively) and gets the mode a plain create
 * would (0666 & ~umask), or the replaced file's mode.  We rejected writing in place (a crash or
 * a full disk leaves a truncated file where a good one was) and a fixed "<path>.tmp.<pid>"
 * name (two writers in one process collide; a name can be pre-created by someone else).
 */
#ifndef SM_OUTFILE_H
#define SM_OUTFILE_H
#include <stdio.h>
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_outfile {
    char *path;     /* the target (owned) */
    char *tmp;      /* the temporary file next to it (owned) */
    FILE *f;        /* open stream on tmp: write here; NULL once closed */
} sm_outfile;

/* 0 when path does not exist or is a regular file (not a symlink); else an error naming it. */
int sm_outfile_check(const char *path, sm_err *e);
/* sm_outfile_check, then create the temporary file.  Zeroes *o first; on error *o stays zeroed
 * and nothing is left on disk. */
int sm_outfile_open(sm_outfile *o, const char *path, sm_err *e);
/* Flush, fsync and close the temporary file, check the target again, rename it into place and
 * fsync the directory.  Always releases *o; on error the temporary file is removed. */
int sm_outfile_commit(sm_outfile *o, sm_err *e);
/* Close and remove the temporary file, release *o.  Safe on a zeroed or committed *o. */
void sm_outfile_abort(sm_outfile *o);

#ifdef __cplusplus
}
#endif
#endif
