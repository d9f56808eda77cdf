/* cli.h: the sparkmono command line: one dispatcher (sparkmono.c), one file per command
 * (cmd_<name>.c), and a small strict option parser shared by all of them.
 *
 * Every bad flag or value is one line on stderr naming the flag, and exit status 2.  We
 * rejected getopt_long: its messages do not name our commands and it permutes argv.
 */
#ifndef SM_CLI_H
#define SM_CLI_H
#include "err.h"

typedef struct cli_opt {
    const char *name;        /* without the leading "--" */
    int takes_value;         /* 1: "--name VALUE"; 0: a switch */
    const char *value;       /* out: the value (or NULL) */
    int present;             /* out: seen on the command line */
} cli_opt;

/* Parse argv[0..argc) (the words after the command name) against opts; positional words go
 * to pos[0..maxpos).  Unknown flag, missing value, repeated flag or too many positional
 * words -> error naming it. */
int cli_parse(const char *cmd, int argc, char **argv, cli_opt *opts, int nopts,
              const char **pos, int maxpos, int *npos, sm_err *e);
/* Find an option by name in the parsed table. */
cli_opt *cli_find(cli_opt *opts, int nopts, const char *name);
/* Integer value of an option within [lo, hi]; `dflt` when absent. */
int cli_int(const char *cmd, const cli_opt *o, long lo, long hi, long dflt, long *out, sm_err *e);
/* Comma-separated integers ("1,2,3") within [lo, hi]; *out malloc'd. */
int cli_int_list(const char *what, const char *s, long lo, long hi, int **out, int *n, sm_err *e);

/* Commands: argc/argv are the words after the command name; return the exit status
 * (0 ok, 2 bad input, 1 internal failure). */
int cmd_make_model(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
