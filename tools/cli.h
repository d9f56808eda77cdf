/* cli.h: the sparkmono command line: one dispatcher (sparkmono.c), one file per command
 * (cmd_<name>.c), and a small strict option parser shared by all of them.
 *
 * Each command declares its options once, in a table of cli_opt (name, value placeholder,
 * default, one-line description); the parser, the defaults the commands read and the
 * per-command --help are all driven by that table, so a flag cannot be documented one way and
 * parsed another.  Every bad flag or value is one line on stderr naming the flag, and exit
 * status 2.  We rejected getopt_long: its messages do not name our commands, it permutes argv
 * and it knows nothing of defaults or help text.
 */
#ifndef SM_CLI_H
#define SM_CLI_H
#include "base/err.h"
#include "parallel/shard.h"

typedef struct cli_opt {
    const char *name;        /* without the leading "--" */
    const char *arg;         /* value placeholder in help ("DIR", "N"); NULL: a switch */
    const char *dflt;        /* default when absent (read by cli_str / cli_int, shown by --help);
                                NULL: none.  A default not starting with a digit describes an
                                automatic value ("online cores") and reads as 0 in cli_int. */
    const char *help;        /* one line for --help; NULL for a retired name */
    const char *renamed;     /* retired name: the error printed when it is used, else NULL */
    const char *value;       /* out: the value given (or NULL) */
    int present;             /* out: seen on the command line */
} cli_opt;

#define CLI_OPT(name, arg, dflt, help) {name, arg, dflt, help, NULL, NULL, 0}
#define CLI_SWITCH(name, help) {name, NULL, NULL, help, NULL, NULL, 0}
#define CLI_RENAMED(name, msg) {name, "X", NULL, NULL, msg, NULL, 0}

/* The fixed text of one command's --help (its options come from the cli_opt table).  Each
 * cmd_<name>.c defines one (cli_help_<name>); the dispatcher lists their summaries. */
typedef struct cli_cmd {
    const char *name;        /* "generate" */
    const char *summary;     /* one line: what the command does */
    const char *synopsis;    /* after "sparkmono <name> " */
    const char *example;     /* one example command line */
    const char *notes;       /* lines printed after the options ('\n'-separated), or NULL */
} cli_cmd;

/* Parse argv[0..argc) (the words after the command name) against opts; positional words go
 * to pos[0..maxpos).  "--name VALUE" and "--name=VALUE" are the same.  Returns 0 when parsed,
 * 1 when -h or --help was given (the help is printed on stdout; the command exits 0), -1 on
 * an unknown, retired or repeated flag, a missing value, a value given to a switch or too
 * many positional words (error naming it). */
int cli_parse(const cli_cmd *c, int argc, char **argv, cli_opt *opts, int nopts, const char **pos, int maxpos,
              int *npos, sm_err *e);
/* Find an option by name in the parsed table (NULL when the table has none). */
cli_opt *cli_find(cli_opt *opts, int nopts, const char *name);
/* The option's value, else its default (NULL when neither). */
const char *cli_str(const cli_opt *o);
/* Integer value (or numeric default) of an option within [lo, hi]; 0 when absent with no
 * numeric default. */
int cli_int(const char *cmd, const cli_opt *o, long lo, long hi, long *out, sm_err *e);
/* Number value (or numeric default) of an option within [lo, hi]; an error names the flag. */
int cli_number(const char *cmd, const cli_opt *o, double lo, double hi, double *out, sm_err *e);
/* Comma-separated integers ("1,2,3") within [lo, hi]; *out malloc'd. */
int cli_int_list(const char *what, const char *s, long lo, long hi, int **out, int *n, sm_err *e);
/* The value of a string option (or its default) must be one of the '|'-separated words of
 * `choices` ("cpu|cuda"). */
int cli_choice(const char *cmd, const cli_opt *o, const char *choices, sm_err *e);
/* --threads: as cli_int over [0, 4096]; a value above the online cores prints one warning
 * line on stderr (once per process) and is kept. */
int cli_threads(const char *cmd, const cli_opt *o, long *out, sm_err *e);
/* The ranks of a run: --world W, --moe ep|tp, --devices LIST, --comm peer|nccl (CLI_WORLD_OPTS
 * in a command's table).  --moe, --devices and --comm without --world are errors; --devices
 * must list W devices (sm_devices_parse, the validator the engine runs on its option too). */
typedef struct cli_world_sel {
    int world;              /* ranks >= 1 */
    int moe_tp;             /* 0 ep, 1 tp */
    const char *devices;    /* NULL or "0,1,2,3" */
    int dev[SM_MAX_WORLD];  /* devices parsed (sm_devices_parse), when devices is not NULL */
    const char *comm;       /* "peer" or "nccl"; NULL when not given (the engine's default: peer) */
} cli_world_sel;
#define CLI_WORLD_OPTS                                                                                                   \
    CLI_OPT("world", "W", "1", "W tensor + expert parallel ranks (cpu: threads; cuda: one GPU each, see --devices)"),    \
        CLI_OPT("moe", "ep|tp", "ep", "with --world: experts split across ranks (ep) or each along its width (tp)"),    \
        CLI_OPT("devices", "LIST", "0,1,..,W-1", "cuda with --world: the device of each rank; a device listed twice "    \
                "holds several ranks (tests on one GPU, --comm peer)"),                                                  \
        CLI_OPT("comm", "peer|nccl", "peer", "cuda with --world: exchanges through peer memory or NCCL")
int cli_world(const char *cmd, cli_opt *opts, int no, cli_world_sel *w, sm_err *e);

/* --activations auto|mxfp4|bf16 (the words of SM_ACTS_WORDS, model/quant.h), the same on every
 * command that loads a model: the activations of the MXFP4 experts' matmuls. */
#define CLI_ACTS_OPT                                                                                                     \
    CLI_OPT("activations", "auto|mxfp4|bf16", "auto", "MXFP4 experts' activations: auto as the checkpoint declares "    \
            "(W4A4 when its quantization_config declares MXFP4 inputs, and with --online-mxfp4), mxfp4 (W4A4) or bf16 (W4A16)")
/* --no-prefix-cache, the same on every command that runs requests through an engine (generate,
 * serve): sparkmono_engine_opts.no_prefix_cache (include/sparkmono.h).  The cache is on by
 * default; a command reads the switch with cli_find(...)->present. */
#define CLI_PREFIX_OPT                                                                                                   \
    CLI_SWITCH("no-prefix-cache", "prefill every prompt whole: no reuse of the cached KV pages of earlier prompts' "   \
               "shared prefixes (the cache is on by default)")
/* The value of --activations of a table holding CLI_ACTS_OPT into *out ("auto" when absent);
 * another word is an error naming the flag. */
int cli_acts(const char *cmd, cli_opt *opts, int no, const char **out, sm_err *e);

/* The prompt of generate / logits: exactly one of --prompt TEXT (encoded with the model
 * directory dir's tokenizer.json, no bos added), --prompt-ids LIST and --prompt-file FILE
 * (token ids separated by whitespace and/or single commas; "-" reads stdin).  *ids malloc'd
 * [*n], n >= 1; *src names where they came from ("--prompt", "--prompt-ids" or "--prompt-file
 * FILE") for later messages; *tk the tokenizer of a text prompt (NULL otherwise; the caller
 * frees it; tk may be NULL).  Errors name the file, token index (0-based) and line of the bad
 * word. */
struct sm_tokenizer;
int cli_prompt(const char *cmd, const char *dir, const cli_opt *text, const cli_opt *ids, const cli_opt *file,
               int **out, int *n, const char **src, struct sm_tokenizer **tk, sm_err *e);
/* The whole of path ("-": stdin) into *buf [*len] (malloc'd; at most 1 GiB); errors start
 * with what. */
int cli_read_all(const char *what, const char *path, char **buf, size_t *len, sm_err *e);
/* Seconds of the monotonic clock (differences time a command's phases). */
double cli_now(void);
/* Every id in [0, vocab): else an error naming src and the token index. */
int cli_prompt_check(const char *cmd, const char *src, const int *ids, int n, int vocab, sm_err *e);
/* Open the model of --model DIR (online MXFP4 and the activations as asked: acts "auto",
 * "mxfp4" or "bf16") and check the prompt's ids against its vocabulary.  0: *m open; -1: an engine error (sparkmono_errmsg(), *m may be open: close
 * it); -2: a bad prompt, one line in e (*m open). */
struct sparkmono_model;
int cli_model_open(const char *cmd, const char *dir, int online_mxfp4, const char *acts, const char *src, const int *ids,
                   int n, struct sparkmono_model **m, sm_err *e);

/* Commands: argc/argv are the words after the command name; return the exit status
 * (0 ok, 2 bad input, 1 internal failure; make-model: 128 + signal when interrupted). */
int cmd_make_model(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_constrain(int argc, char **argv);
extern const cli_cmd cli_help_make_model, cli_help_check, cli_help_generate, cli_help_logits, cli_help_bench,
    cli_help_tokenize, cli_help_serve, cli_help_template, cli_help_constrain;

#endif
