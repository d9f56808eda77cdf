/* cmd_logits.c: `sparkmono logits`: the f32 logits [T, V] of a prefill of the prompt, written
 * as a .npy file (v1.0, '<f4', C order) through a temp file and rename, for cross-checks
 * against other implementations (numpy.load reads it directly).  We rejected printing text:
 * V is 202048 for the real model.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "npy.h"
#include "sparkmono.h"

int cmd_logits(int argc, char **argv) {
    cli_opt opts[] = {
        {"model", 1, NULL, 0}, {"prompt-ids", 1, NULL, 0}, {"out", 1, NULL, 0},
        {"backend", 1, NULL, 0}, {"threads", 1, NULL, 0}, {"online-mxfp4", 0, NULL, 0},
        {"world", 1, NULL, 0}, {"moe", 1, NULL, 0},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos;
    sm_err e = {{0}};
    if (cli_parse("logits", argc, argv, opts, nopts, pos, 0, &npos, &e)) goto bad;
    cli_opt *model = cli_find(opts, nopts, "model"), *ids = cli_find(opts, nopts, "prompt-ids"),
            *outp = cli_find(opts, nopts, "out");
    if (!model->present) { sm_errf(&e, "logits: --model DIR is required"); goto bad; }
    if (!ids->present) { sm_errf(&e, "logits: --prompt-ids 1,2,3 is required"); goto bad; }
    if (!outp->present || !*outp->value) { sm_errf(&e, "logits: --out FILE.npy is required"); goto bad; }
    long threads, world;
    if (cli_int("logits", cli_find(opts, nopts, "threads"), 0, 4096, 0, &threads, &e) ||
        cli_int("logits", cli_find(opts, nopts, "world"), 1, 64, 1, &world, &e))
        goto bad;
    const char *moe = cli_find(opts, nopts, "moe")->value;
    if (moe && strcmp(moe, "ep") && strcmp(moe, "tp")) {
        sm_errf(&e, "logits: --moe must be ep or tp");
        goto bad;
    }
    const char *backend = cli_find(opts, nopts, "backend")->value;
    if (backend && strcmp(backend, "cpu") && strcmp(backend, "cuda")) {
        sm_errf(&e, "logits: --backend must be cpu or cuda");
        goto bad;
    }
    int *prompt = NULL, n = 0;
    if (cli_int_list("logits: --prompt-ids", ids->value, INT_MIN, INT_MAX, &prompt, &n, &e)) goto bad;

    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    float *logits = NULL;
    int rc = 2, req;
    sparkmono_model_opts mo = {0};
    mo.online_mxfp4 = cli_find(opts, nopts, "online-mxfp4")->present;
    if (sparkmono_model_open(model->value, &mo, &m)) goto fail;
    sparkmono_model_info info;
    if (sparkmono_model_get_info(m, &info)) goto fail;
    /* one request, prefill only: the cache holds exactly the prompt */
    sparkmono_engine_opts eo = {0};
    eo.backend = backend;
    eo.rows = 1;
    eo.max_requests = 1;
    eo.max_len = n;
    eo.threads = (int)threads;
    eo.world = (int)world;
    eo.moe_tp = moe && !strcmp(moe, "tp");
    if (sparkmono_engine_create(m, &eo, &g)) goto fail;
    if (sparkmono_add(g, prompt, n, 0, &req)) goto fail;
    logits = malloc((size_t)n * (size_t)info.vocab_size * sizeof(float));
    if (!logits) {
        fprintf(stderr, "logits: out of memory for [%d, %d] logits\n", n, info.vocab_size);
        goto out;
    }
    if (sparkmono_prefill(g, req, logits)) goto fail;
    int64_t shape[2] = {n, info.vocab_size};
    if (sm_npy_write_f32(outp->value, logits, 2, shape, &e)) {
        fprintf(stderr, "logits: %s\n", e.msg);
        goto out;
    }
    printf("wrote %s: f32 [%d, %d]\n", outp->value, n, info.vocab_size);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "logits: %s\n", sparkmono_errmsg());
out:
    free(logits);
    free(prompt);
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
bad:
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
