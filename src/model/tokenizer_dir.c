/* tokenizer_dir.c: the tokenizer of a model directory, DIR/tokenizer.json, optional (see
 * tokenizer.h).  One function for every command that reads it (serve, check, generate,
 * logits), so "which file, and is its absence an error" is decided once: absent is not an
 * error here (a model may serve token ids only); the caller that needs text says so.  We
 * rejected letting each command build the path and test the file: they drifted (check said a
 * directory was valid while serve refused its broken tokenizer.json).
 */
#include "model/tokenizer.h"
#include <stdio.h>
#include <sys/stat.h>

int sm_tokenizer_load_dir(const char *dir, sm_tokenizer **out, char *path, size_t npath, sm_err *e) {
    *out = NULL;
    if ((size_t)snprintf(path, npath, "%s/tokenizer.json", dir) >= npath)
        return sm_errf(e, "%s: the model directory's path is too long", dir);
    struct stat st;
    if (stat(path, &st) != 0) return 0; /* none: token ids only */
    if (!S_ISREG(st.st_mode)) return sm_errf(e, "%s: not a regular file", path);
    return sm_tokenizer_load(path, out, e);
}
