/* cmd_check.c: `sparkmono check (DIR | --model DIR) [--online-mxfp4]`: load and validate a
 * checkpoint with the engine's own loader and print its summary (src/engine/check.h).  Using
 * sm_model_load rather than a separate validator means `check` passing is exactly "the engine
 * will load it".  The directory is --model DIR like every other command; the bare DIR of
 * earlier versions is kept, and giving both is an error rather than a silent choice. */
#ifdef SM_HAVE_CUDA
#include "cuda/mono/mono.h"
#endif
#include "engine/check.h"
#include "cli.h"
#include "model/weights.h"
#include "serve/serve_chat.h"
#include <stdio.h>

const cli_cmd cli_help_check = {
    "check",
    "validate a checkpoint directory with the engine's loader and print a summary",
    "(--model DIR | DIR) [--online-mxfp4] [--activations auto|mxfp4|bf16] [--mono]",
    "sparkmono check --model build/models/tiny",
    "Prints the configuration, layer kinds, the quantization_config read, expert format and\n"
    "numerics (W4A4 or W4A16) per layer and bytes per component, and\n"
    "scans every stored value for NaN and Inf (multi-threaded; progress on a terminal).\n"
    "Exit status 0 means the engine will load the directory, every weight is finite, its\n"
    "tokenizer.json (when there is one) loads as serve loads it and its chat template (if any) is\n"
    "one serve can render; 2 names the first problem (for a non-finite value: tensor, element,\n"
    "coordinates; for a template: file, line, column and construct).",
};

/* `--mono`: the monokernel's static refusals of m on device 0 (docs/architecture.md). */
static int check_mono(const sm_model *m, sm_err *e) {
#ifdef SM_HAVE_CUDA
    int fmt[SM_MAX_LAYERS];
    for (int l = 0; l < m->cfg.L; l++) fmt[l] = (int)m->layers[l].ex.fmt;
    char why[1024];
    if (sm_cuda_mono_check(&m->cfg, fmt, 0, why, sizeof why, e)) return sm_errprefix(e, "check --mono");
    if (why[0]) printf("monokernel: not eligible on device 0: %s\n", why);
    else printf("monokernel: eligible on device 0 (buckets 8 16 24 32 48 64 96 128: layers 1..%d of every verify step)\n", m->cfg.L - 2);
    return 0;
#else
    (void)m;
    return sm_errf(e, "check --mono: this sparkmono was built without CUDA (no nvcc at build time)");
#endif
}

int cmd_check(int argc, char **argv) {
    const char *cmd = "check";
    cli_opt opts[] = {
        CLI_OPT("model", "DIR", NULL, "checkpoint directory (config.json + safetensors); or give DIR alone"),
        CLI_SWITCH("online-mxfp4", "round BF16 experts of layers 1..L-2 to MXFP4 at load, as the engine can"),
        CLI_ACTS_OPT,
        CLI_SWITCH("mono", "also print whether the monokernel can run this model on CUDA device 0, with every refusal"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos;
    sm_err e = {{0}};
    sm_model m;
    int r = cli_parse(&cli_help_check, argc, argv, opts, no, pos, 1, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *model = cli_find(opts, no, "model");
    if (model->present && npos) {
        sm_errf(&e, "%s: give the directory once: --model %s or %s, not both", cmd, model->value, pos[0]);
        goto bad;
    }
    if (!model->present && !npos) { sm_errf(&e, "%s: --model DIR is required (or DIR alone)", cmd); goto bad; }
    const char *dir = model->present ? model->value : pos[0];
    sm_load_opts o = {.online_mxfp4 = cli_find(opts, no, "online-mxfp4")->present};
    const char *acts;
    if (cli_acts(cmd, opts, no, &acts, &e)) goto bad;
    sm_acts_parse(acts, &o.activations);
    if (sm_model_load(dir, &o, &m, &e)) goto bad;
    char tokline[4200]; /* the tokenizer serve would load, loaded the same way */
    if (sm_check_tokenizer(dir, tokline, sizeof tokline, &e)) { sm_model_free(&m); sm_errprefix(&e, "%s", cmd); goto bad; }
    sm_finite_scan fs; /* every stored value finite (the loader does not read them) */
    if (sm_check_finite(&m.ar, 0, 1, &fs, &e)) { sm_model_free(&m); goto bad; }
    sm_chat_tmpl ct; /* the chat template parses with the server's renderer (or there is none) */
    if (sm_chat_load(dir, NULL, &ct, &e)) { sm_model_free(&m); goto bad; }
    printf("checkpoint %s: valid\n", dir);
    printf("chat template: %s\n", ct.t ? ct.source : "none (the server answers /v1/chat/completions with a 400)");
    sm_chat_free(&ct);
    sm_check_print(&m, stdout);
    printf("%s\n", tokline);
    sm_check_finite_print(&fs, stdout);
    if (cli_find(opts, no, "mono")->present && check_mono(&m, &e)) {
        sm_model_free(&m);
        goto bad;
    }
    sm_model_free(&m);
    return 0;
bad:
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
