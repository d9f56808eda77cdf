/* cmd_check.c: `sparkmono check DIR [--online-mxfp4]`: load and validate a checkpoint with
 * the engine's own loader and print its summary (src/check.h).  Using sm_model_load rather
 * than a separate validator means `check` passing is exactly "the engine will load it". */
#include "check.h"
#include "cli.h"
#include "weights.h"
#include <stdio.h>

int cmd_check(int argc, char **argv) {
    const char *cmd = "check";
    cli_opt opts[] = {{"online-mxfp4", 0, NULL, 0}};
    const char *pos[1];
    int npos;
    sm_err e = {{0}};
    sm_model m;
    if (cli_parse(cmd, argc, argv, opts, 1, pos, 1, &npos, &e)) goto bad;
    if (npos != 1) { sm_errf(&e, "%s: usage: sparkmono check DIR [--online-mxfp4]", cmd); goto bad; }
    sm_load_opts o = {.online_mxfp4 = opts[0].present};
    if (sm_model_load(pos[0], &o, &m, &e)) goto bad;
    sm_finite_scan fs; /* every stored value finite (the loader does not read them) */
    if (sm_check_finite(&m.ar, 0, 1, &fs, &e)) { sm_model_free(&m); goto bad; }
    printf("checkpoint %s: valid\n", pos[0]);
    sm_check_print(&m, stdout);
    sm_check_finite_print(&fs, stdout);
    sm_model_free(&m);
    return 0;
bad:
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
