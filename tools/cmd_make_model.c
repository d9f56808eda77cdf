/* cmd_make_model.c: `sparkmono make-model --preset P --out DIR [options]`: a random checkpoint
 * (src/testing/makemodel.h), or with --cycle N a demonstration model whose greedy output walks a
 * cycle of N ids.  A thin shell over sm_make_model: parse, build the config, call, report.
 * SIGINT / SIGTERM only set a flag that the writer polls between 16 MB chunks; it then removes
 * its temporary directory and we exit with 128 + the signal.  We rejected cleaning up inside
 * the signal handler (nothing but a flag store is async-signal-safe there) and config
 * overrides beyond --layers (a test that needs another shape builds the config in C). */
#include "cli.h"
#include "model/config.h"
#include "testing/makemodel.h"
#include <signal.h>
#include <stdio.h>
#include <string.h>

const cli_cmd cli_help_make_model = {
    "make-model",
    "write a random checkpoint (or a cycle model for the demo) to a new directory",
    "--preset P --out DIR [options]",
    "sparkmono make-model --preset tiny --experts mxfp4 --activations mxfp4 --seed 1 --out build/models/tiny",
    "Every tensor is a pure function of (seed, tensor name): the same options give the same bytes.\n"
    "DIR is written as DIR.tmp.<pid> and renamed when complete; on an error, SIGINT or SIGTERM\n"
    "that temporary directory is removed (exit status 2, 130 or 143).\n"
    "--activations mxfp4 (with --experts mxfp4) writes the quantization_config of a Quark W4A4\n"
    "export: fp4 weights and dynamic fp4 input tensors per 32 values, layers 0 and L-1 and the\n"
    "non-expert modules excluded; the engine then runs those experts W4A4 by default.\n"
    "DIR also gets a tokenizer.json (byte-level BPE learned from a small English text; the\n"
    "config's pad, bos and eos ids are <|pad|>, <|bos|>, <|eos|>): see `sparkmono tokenize`.\n"
    "--cycle N: the N smallest ids that are not bos, eos or pad form a cycle (printed on stdout),\n"
    "and greedy decoding from any of them walks it: id i of the cycle is followed by id i+1 mod N.\n"
    "The model is the random one of the seed with residual-dominant gates (every layer keeps\n"
    "~97% of the residual stream) and lm_head rows that map the normalized embedding of each\n"
    "cycle id to the next one; other ids are almost always followed by a cycle id.  Since the\n"
    "output repeats, the n-gram drafter's drafts are accepted: tools/demo.sh shows the speed-up.",
};

static volatile sig_atomic_t g_signal; /* the signal that asked us to stop, or 0 */
static void on_signal(int sig) { g_signal = sig; }

int cmd_make_model(int argc, char **argv) {
    const char *cmd = "make-model";
    cli_opt opts[] = {
        CLI_OPT("preset", "P", NULL, "model shape: tiny, mini, spark1x or spark1x-l4 (required)"),
        CLI_OPT("out", "DIR", NULL, "output directory: new or empty (required)"),
        CLI_OPT("experts", "bf16|mxfp4|fp8", "bf16", "format of the experts of layers 1..L-2"),
        CLI_OPT("activations", "auto|mxfp4|bf16", "auto", "with --experts mxfp4, the quantization_config written: "
                "none (auto: loads as W4A16), Quark W4A4 (mxfp4) or Quark weight-only (bf16)"),
        CLI_OPT("seed", "N", "0", "seed of every random tensor"),
        CLI_OPT("layers", "N", "the preset's", "number of layers"),
        CLI_OPT("shards", "K", "1", "safetensors files (K > 1: plus model.safetensors.index.json)"),
        CLI_OPT("cycle", "N", NULL, "a cycle model: greedy output walks a cycle of N ids (see below)"),
        CLI_SWITCH("quiet", "no progress line on stderr"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    int npos;
    const char *pos[1];
    sm_err e = {{0}};
    sm_config c;
    sm_make_opts o;
    memset(&o, 0, sizeof o);
    long layers, seed, shards, cycle;
    const char *acts;
    int r = cli_parse(&cli_help_make_model, argc, argv, opts, no, pos, 0, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *preset = cli_find(opts, no, "preset"), *out = cli_find(opts, no, "out"),
            *ex = cli_find(opts, no, "experts");
    if (!preset->present) { sm_errf(&e, "%s: --preset is required (tiny, mini, spark1x, spark1x-l4)", cmd); goto bad; }
    if (!out->present) { sm_errf(&e, "%s: --out DIR is required", cmd); goto bad; }
    if (cli_int(cmd, cli_find(opts, no, "layers"), 1, SM_MAX_LAYERS, &layers, &e) ||
        cli_int(cmd, cli_find(opts, no, "seed"), 0, 0x7FFFFFFFL, &seed, &e) ||
        cli_int(cmd, cli_find(opts, no, "shards"), 1, 1000, &shards, &e) ||
        cli_int(cmd, cli_find(opts, no, "cycle"), 2, SM_MAKE_MAX_CYCLE, &cycle, &e) ||
        cli_choice(cmd, ex, "bf16|mxfp4|fp8", &e) || cli_acts(cmd, opts, no, &acts, &e))
        goto bad;
    sm_acts_parse(acts, &o.activations);
    const char *exv = cli_str(ex);
    o.experts = !strcmp(exv, "mxfp4") ? SM_EXP_MXFP4 : !strcmp(exv, "fp8") ? SM_EXP_FP8 : SM_EXP_BF16;
    if (o.activations != SM_ACTS_AUTO && o.experts != SM_EXP_MXFP4) {
        sm_errf(&e, "%s: --activations %s writes a Quark MXFP4 quantization_config: it needs --experts mxfp4", cmd, acts);
        goto bad;
    }
    if (sm_config_preset(preset->value, &c, &e)) { sm_errprefix(&e, "%s: --preset", cmd); goto bad; }
    if (layers && sm_config_set_layers(&c, (int)layers, &e)) { sm_errprefix(&e, "%s: --layers", cmd); goto bad; }
    o.seed = (uint64_t)seed;
    o.shards = (int)shards;
    o.cycle = (int)cycle;
    o.progress = !cli_find(opts, no, "quiet")->present;
    int ids[32];
    if (cycle && sm_make_cycle_ids(&c, (int)cycle < 32 ? (int)cycle : 32, ids, &e)) goto bad;

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* writes resume; the writer polls the flag between chunks */
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    o.stop = &g_signal;
    r = sm_make_model(&c, &o, out->value, &e);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (r) {
        if (g_signal) {
            fprintf(stderr, "%s (SIG%s)\n", e.msg, g_signal == SIGINT ? "INT" : "TERM");
            return 128 + g_signal;
        }
        goto bad;
    }
    if (cycle) { /* the cycle, for the prompt of a demonstration */
        printf("cycle of %ld ids:", cycle);
        for (int i = 0; i < cycle && i < 32; i++) printf(" %d", ids[i]);
        printf("%s -> back to %d\n", cycle > 32 ? " ..." : "", ids[0]);
    }
    return 0;
bad:
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
