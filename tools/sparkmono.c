/* sparkmono.c: the CLI dispatcher: `sparkmono <command> [options]`.
 * Each command lives in tools/cmd_<name>.c; this file only maps names to them. */
#include "cli.h"
#include <stdio.h>
#include <string.h>


typedef struct { const char *name; int (*fn)(int, char **); const char *help; } command;

static void usage(FILE *f, const command *c, int n) {
    fprintf(f, "usage: sparkmono <command> [options]\ncommands:\n");
    for (int i = 0; i < n; i++) fprintf(f, "  %-11s %s\n", c[i].name, c[i].help);
}

int main(int argc, char **argv) {
    const command cmds[] = {
        {"make-model", cmd_make_model, "write a random checkpoint: --preset P --experts bf16|mxfp4|fp8 --seed N --out DIR"},
        {"check", cmd_check, "validate a checkpoint directory and print a summary"},
        {"generate", cmd_generate, "greedy generation with speculative verify steps"},
        {"logits", cmd_logits, "prefill logits of a prompt to a .npy file"},
        {"bench", cmd_bench, "verify-step benchmark with the memory floor"},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout, cmds, n);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name) == 0) {
            return cmds[i].fn(argc - 2, argv + 2);
        }
    }
    fprintf(stderr, "sparkmono: unknown command '%s' (try 'sparkmono --help')\n", argv[1]);
    return 2;
}
