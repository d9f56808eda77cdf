/* cmd_make_model.c: `sparkmono make-model --preset P [--layers N] [--experts bf16|mxfp4|fp8]
 * [--seed N] [--shards K] [--quiet] --out DIR`: a random checkpoint (src/makemodel.h).
 * A thin shell over sm_make_model: parse, build the config, call, report.  We rejected
 * config overrides beyond --layers: a test that needs another shape builds the config in C. */
#include "cli.h"
#include "config.h"
#include "makemodel.h"
#include <stdio.h>
#include <string.h>

int cmd_make_model(int argc, char **argv) {
    const char *cmd = "make-model";
    cli_opt opts[] = {
        {"preset", 1, NULL, 0}, {"layers", 1, NULL, 0}, {"experts", 1, NULL, 0}, {"seed", 1, NULL, 0},
        {"out", 1, NULL, 0},    {"shards", 1, NULL, 0}, {"quiet", 0, NULL, 0},
    };
    int no = (int)(sizeof opts / sizeof opts[0]), npos;
    const char *pos[1];
    sm_err e = {{0}};
    sm_config c;
    sm_make_opts o;
    memset(&o, 0, sizeof o);
    long layers, seed, shards;
    if (cli_parse(cmd, argc, argv, opts, no, pos, 0, &npos, &e)) goto bad;
    cli_opt *preset = cli_find(opts, no, "preset"), *out = cli_find(opts, no, "out"),
            *ex = cli_find(opts, no, "experts");
    if (!preset->present) { sm_errf(&e, "%s: --preset is required (tiny, mini, spark1x, spark1x-l4)", cmd); goto bad; }
    if (!out->present) { sm_errf(&e, "%s: --out DIR is required", cmd); goto bad; }
    if (cli_int(cmd, cli_find(opts, no, "layers"), 1, SM_MAX_LAYERS, 0, &layers, &e) ||
        cli_int(cmd, cli_find(opts, no, "seed"), 0, 0x7FFFFFFFL, 0, &seed, &e) ||
        cli_int(cmd, cli_find(opts, no, "shards"), 1, 1000, 1, &shards, &e))
        goto bad;
    if (!ex->present || !strcmp(ex->value, "bf16")) o.experts = SM_EXP_BF16;
    else if (!strcmp(ex->value, "mxfp4")) o.experts = SM_EXP_MXFP4;
    else if (!strcmp(ex->value, "fp8")) o.experts = SM_EXP_FP8;
    else { sm_errf(&e, "%s: --experts '%s' is not one of bf16, mxfp4, fp8", cmd, ex->value); goto bad; }
    if (sm_config_preset(preset->value, &c, &e)) { sm_errprefix(&e, "%s: --preset", cmd); goto bad; }
    if (layers && sm_config_set_layers(&c, (int)layers, &e)) { sm_errprefix(&e, "%s: --layers", cmd); goto bad; }
    o.seed = (uint64_t)seed;
    o.shards = (int)shards;
    o.progress = !cli_find(opts, no, "quiet")->present;
    if (sm_make_model(&c, &o, out->value, &e)) goto bad;
    return 0;
bad:
    fprintf(stderr, "%s\n", e.msg);
    return 2;
}
