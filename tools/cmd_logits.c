/* cmd_logits.c: `sparkmono logits`: the f32 logits [T, V] of a prefill of the prompt, written
 * as a .npy file (v1.0, '<f4', C order) for cross-checks against other implementations
 * (numpy.load reads it directly).  The file is written through a temporary file in the same
 * directory, fsync'd and renamed onto --out (src/base/outfile.h); a target that exists and is not
 * a regular file is refused before the model is even loaded.  We rejected printing text:
 * V is 202048 for the real model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "model/npy.h"
#include "base/outfile.h"
#include "sparkmono.h"

const cli_cmd cli_help_logits = {
    "logits",
    "prefill logits of a prompt to a .npy file",
    "--model DIR (--prompt TEXT | --prompt-ids LIST | --prompt-file FILE) --out FILE.npy [options]",
    "sparkmono logits --model build/models/tiny --prompt-ids 11,12,13 --out logits.npy",
    "Writes f32 [T, V] (T prompt tokens, V = vocab_size; ids >= vocab_used are -inf) as .npy v1.0.\n"
    "--out is written through a temporary file in its directory, fsync'd, then renamed onto it:\n"
    "a reader never sees half a file, and on any error the old file is left as it was.  Only a\n"
    "regular file is replaced: a target that is a device (/dev/null), FIFO, directory or a\n"
    "symbolic link (to anything) is refused.",
};

int cmd_logits(int argc, char **argv) {
    const char *cmd = "logits";
    cli_opt opts[] = {
        CLI_OPT("model", "DIR", NULL, "checkpoint directory (required)"),
        CLI_OPT("prompt", "TEXT", NULL, "prompt text, encoded with the model directory's tokenizer.json (no bos added)"),
        CLI_OPT("prompt-ids", "LIST", NULL, "prompt token ids, comma-separated: 1,2,3"),
        CLI_OPT("prompt-file", "FILE", NULL, "prompt token ids from FILE, separated by whitespace and/or commas; - reads stdin"),
        CLI_OPT("out", "FILE.npy", NULL, "output file (required; a new or regular file, not a symbolic link)"),
        CLI_OPT("backend", "cpu|cuda", "cpu", "where the prefill runs"),
        CLI_OPT("threads", "T", "online cores", "CPU worker threads; more than the online cores prints a warning"),
        CLI_SWITCH("online-mxfp4", "round BF16 experts of layers 1..L-2 to MXFP4 at load"),
        CLI_ACTS_OPT,
        CLI_WORLD_OPTS,
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1], *src = "", *acts = NULL;
    int npos, *prompt = NULL, n = 0;
    cli_world_sel ws = {0};
    long threads;
    sm_err e = {{0}};
    int r = cli_parse(&cli_help_logits, argc, argv, opts, no, pos, 0, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *model = cli_find(opts, no, "model"), *outp = cli_find(opts, no, "out"),
            *backend = cli_find(opts, no, "backend");
    if (!model->present) { sm_errf(&e, "%s: --model DIR is required", cmd); goto bad; }
    if (!outp->present || !*outp->value) { sm_errf(&e, "%s: --out FILE.npy is required", cmd); goto bad; }
    if (cli_threads(cmd, cli_find(opts, no, "threads"), &threads, &e) ||
        cli_world(cmd, opts, no, &ws, &e) || cli_acts(cmd, opts, no, &acts, &e) ||
        cli_choice(cmd, backend, "cpu|cuda", &e))
        goto bad;
    /* refuse a bad target now, not after the prefill (checked again when writing) */
    if (sm_outfile_check(outp->value, &e)) { sm_errprefix(&e, "%s: --out", cmd); goto bad; }
    if (cli_prompt(cmd, model->value, cli_find(opts, no, "prompt"), cli_find(opts, no, "prompt-ids"),
                   cli_find(opts, no, "prompt-file"), &prompt, &n, &src, NULL, &e))
        goto bad;

    sparkmono_model *m = NULL;
    sparkmono_engine *g = NULL;
    float *logits = NULL;
    int rc = 2, req;
    int orc = cli_model_open(cmd, model->value, cli_find(opts, no, "online-mxfp4")->present, acts, src, prompt, n, &m, &e);
    if (orc == -1) goto fail;
    if (orc == -2) {
        fprintf(stderr, "%s\n", e.msg);
        goto out;
    }
    /* one request, prefill only: the cache holds exactly the prompt */
    sparkmono_engine_opts eo = {0};
    eo.backend = cli_str(backend);
    eo.request_rows = 1;
    eo.max_requests = 1;
    eo.max_len = n;
    eo.threads = (int)threads;
    eo.world = ws.world;
    eo.moe_tp = ws.moe_tp;
    eo.devices = ws.devices;
    eo.comm = ws.comm;
    if (sparkmono_engine_create(m, &eo, &g)) goto fail;
    if (sparkmono_add(g, prompt, n, 0, &req)) goto fail;
    sparkmono_model_info info;
    if (sparkmono_model_get_info(m, &info)) goto fail;
    logits = malloc((size_t)n * (size_t)info.vocab_size * sizeof(float));
    if (!logits) {
        fprintf(stderr, "%s: out of memory for [%d, %d] logits\n", cmd, n, info.vocab_size);
        goto out;
    }
    if (sparkmono_prefill(g, req, logits)) goto fail;
    int64_t shape[2] = {n, info.vocab_size};
    if (sm_npy_write_f32(outp->value, logits, 2, shape, &e)) {
        fprintf(stderr, "%s: %s\n", cmd, e.msg);
        goto out;
    }
    printf("wrote %s: f32 [%d, %d]\n", outp->value, n, info.vocab_size);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "%s: %s\n", cmd, sparkmono_errmsg());
out:
    free(logits);
    free(prompt);
    sparkmono_engine_destroy(g);
    sparkmono_model_close(m);
    return rc;
bad:
    free(prompt);
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
