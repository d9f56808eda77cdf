/* sparkmono.c: the CLI dispatcher: `sparkmono <command> [options]`, `sparkmono --help`,
 * `sparkmono --version`.  Each command lives in tools/cmd_<name>.c with its own help text
 * (cli_help_<name>); this file only maps names to them and lists their summaries. */
#include "cli.h"
#include "sparkmono.h"
#include <stdio.h>
#include <string.h>

typedef struct command {
    const cli_cmd *help;           /* name, summary */
    int (*run)(int, char **);      /* the words after the command name */
} command;

static void usage(FILE *f, const command *c, int n) {
    fprintf(f, "usage: sparkmono <command> [options]\ncommands:\n");
    for (int i = 0; i < n; i++) fprintf(f, "  %-11s %s\n", c[i].help->name, c[i].help->summary);
    fprintf(f, "'sparkmono <command> --help' lists a command's options; 'sparkmono --version' prints the version.\n");
}

int main(int argc, char **argv) {
    const command cmds[] = {
        {&cli_help_make_model, cmd_make_model}, {&cli_help_check, cmd_check},  {&cli_help_generate, cmd_generate},
        {&cli_help_logits, cmd_logits},         {&cli_help_bench, cmd_bench},    {&cli_help_tokenize, cmd_tokenize},
        {&cli_help_serve, cmd_serve},           {&cli_help_template, cmd_template}, {&cli_help_constrain, cmd_constrain},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout, cmds, n);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sparkmono %s\n", sparkmono_version()); /* include/sparkmono.h: the one version string */
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(argv[1], cmds[i].help->name) == 0) return cmds[i].run(argc - 2, argv + 2);
    fprintf(stderr, "sparkmono: unknown command '%s' (try 'sparkmono --help')\n", argv[1]);
    return 2;
}
