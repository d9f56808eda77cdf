/* cmd_template.c: `sparkmono template`: render a chat template in C (src/jinja/jinja.h) the
 * way the server does, to see the prompt a conversation becomes or to compare the renderer
 * with Jinja2 (tests/jinja/).  A model directory's template renders --messages with its
 * bos / eos tokens; --template FILE renders the variables of --vars, or many sets of them
 * from JSON lines (--batch: one JSON line out per line in, {"text": ...} or {"error": ...},
 * so a test renders thousands of cases in one process).  We rejected a test-only binary: the
 * same command shows a user what their template makes of a conversation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "cli.h"
#include "serve/serve_chat.h"

const cli_cmd cli_help_template = {
    "template",
    "render a chat template (a model directory's, or a file) as the server does",
    "(DIR | --template FILE) [--messages FILE [--tools FILE] | --vars FILE | --batch FILE] [--no-generation-prompt]",
    "sparkmono template build/models/tiny --messages conversation.json",
    "DIR: the template of tokenizer_config.json (or chat_template.jinja) with its bos_token and\n"
    "eos_token; --messages is a JSON list of {role, content}, rendered with add_generation_prompt\n"
    "(unless --no-generation-prompt) and the JSON list of --tools as the server renders a request's\n"
    "tools.  --template FILE: a template file rendered with the JSON\n"
    "object of --vars as its variables; --batch: JSON lines of such objects, one JSON line out per\n"
    "line ({\"text\": ...}, or {\"error\": ..., \"raised\": true|false}).  Without an input the\n"
    "template is only parsed.  Exit 2 names a template outside the supported subset (line, column).",
};

static int read_file(const char *path, sm_buf *b, sm_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return sm_errf(e, "%s: cannot open", path);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        if (sm_buf_add(b, buf, n)) { fclose(f); return sm_errf(e, "%s: out of memory", path); }
    fclose(f);
    return b->p || !sm_buf_add(b, "", 0) ? 0 : sm_errf(e, "%s: out of memory", path);
}

static int load_json(const char *path, json_t **out, sm_err *e) {
    json_error_t je;
    if (!(*out = json_load_file(path, 0, &je))) return sm_errf(e, "%s: not valid JSON: %s (line %d)", path, je.text, je.line);
    return 0;
}

/* --batch: each line's variables rendered, one JSON line out. */
static int batch(const sm_jinja *t, const char *path, sm_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return sm_errf(e, "%s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long ln = 0;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        ln++;
        json_error_t je;
        json_t *vars = json_loadb(line, (size_t)n, 0, &je);
        if (!json_is_object(vars)) {
            json_decref(vars);
            rc = sm_errf(e, "%s: line %ld: not a JSON object", path, ln);
            break;
        }
        sm_buf out = {0};
        sm_err re = {{0}};
        int raised = 0;
        json_t *o = sm_jinja_render(t, vars, &out, &raised, &re)
                        ? json_pack("{s:s, s:b}", "error", re.msg, "raised", raised)
                        : json_pack("{s:s%}", "text", out.p ? out.p : "", out.n);
        char *d = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (d) puts(d);
        free(d);
        json_decref(o);
        json_decref(vars);
        sm_buf_free(&out);
    }
    free(line);
    fclose(f);
    return rc;
}

int cmd_template(int argc, char **argv) {
    const char *cmd = "template";
    cli_opt opts[] = {
        CLI_OPT("template", "FILE", NULL, "a template file (instead of a model directory's template)"),
        CLI_OPT("messages", "FILE", NULL, "JSON list of messages to render with the model directory's template"),
        CLI_OPT("tools", "FILE", NULL, "with --messages: JSON list of tools (OpenAI's shape) for the template"),
        CLI_OPT("vars", "FILE", NULL, "with --template: a JSON object of the template's variables"),
        CLI_OPT("batch", "FILE", NULL, "with --template: JSON lines of variable objects, one result line each"),
        CLI_SWITCH("no-generation-prompt", "render with add_generation_prompt false"),
    };
    const int no = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    int npos, raised = 0;
    sm_err e = {{0}};
    sm_chat_tmpl ct = {0};
    sm_jinja *t = NULL;
    sm_buf src = {0}, text = {0};
    sm_buf out = {0};
    json_t *in = NULL, *tools = NULL;
    int r = cli_parse(&cli_help_template, argc, argv, opts, no, pos, 1, &npos, &e);
    if (r > 0) return 0;
    if (r < 0) goto bad;
    cli_opt *tf = cli_find(opts, no, "template"), *mf = cli_find(opts, no, "messages"), *vf = cli_find(opts, no, "vars"),
            *bf = cli_find(opts, no, "batch");
    if (tf->present == (npos > 0)) { sm_errf(&e, "%s: give a model directory or --template FILE (one of them)", cmd); goto bad; }
    if (mf->present + vf->present + bf->present > 1) { sm_errf(&e, "%s: give one of --messages, --vars, --batch", cmd); goto bad; }
    if (npos && (vf->present || bf->present)) {
        sm_errf(&e, "%s: --vars and --batch go with --template; a directory takes --messages", cmd);
        goto bad;
    }
    if (cli_find(opts, no, "tools")->present && !mf->present) {
        sm_errf(&e, "%s: --tools goes with a model directory and --messages", cmd);
        goto bad;
    }
    if (tf->present && mf->present) { sm_errf(&e, "%s: --messages goes with a model directory; --template takes --vars", cmd); goto bad; }
    if (npos) {
        if (sm_chat_load(pos[0], NULL, &ct, &e)) goto bad;
        if (!ct.t) {
            sm_errf(&e, "%s: no chat template (tokenizer_config.json \"chat_template\" or chat_template.jinja)", pos[0]);
            goto bad;
        }
        if (!mf->present) { printf("%s: chat template (%s) ok\n", pos[0], ct.source); goto done; }
        char param[SM_API_PARAM];
        if (load_json(mf->value, &in, &e)) goto bad;
        cli_opt *tl = cli_find(opts, no, "tools");
        if (tl->present && load_json(tl->value, &tools, &e)) goto bad;
        if (sm_chat_tools(tools, param, &e)) {
            sm_errprefix(&e, "%s", tl->value);
            goto bad;
        }
        if (sm_chat_render(&ct, in, tools, !cli_find(opts, no, "no-generation-prompt")->present, NULL, &out, param, &raised, &e)) {
            sm_errprefix(&e, "%s", mf->value);
            goto bad;
        }
    } else {
        if (read_file(tf->value, &src, &e)) goto bad;
        if (sm_jinja_parse(src.p, src.n, &t, &e)) { sm_errprefix(&e, "%s", tf->value); goto bad; }
        if (bf->present) {
            if (batch(t, bf->value, &e)) goto bad;
            goto done;
        }
        if (!vf->present) { printf("%s: template ok\n", tf->value); goto done; }
        if (load_json(vf->value, &in, &e)) goto bad;
        if (!json_is_object(in)) { sm_errf(&e, "%s: must be a JSON object of variables", vf->value); goto bad; }
        if (sm_jinja_render(t, in, &text, &raised, &e)) { sm_errprefix(&e, "%s", tf->value); goto bad; }
    }
    fwrite(out.p ? out.p : "", 1, out.n, stdout);
    fwrite(text.p ? text.p : "", 1, text.n, stdout);
done:
    sm_buf_free(&out);
    sm_buf_free(&text);
    sm_buf_free(&src);
    json_decref(in);
    json_decref(tools);
    sm_jinja_free(t);
    sm_chat_free(&ct);
    return 0;
bad:
    fprintf(stderr, "%s\n", e.msg);
    sm_buf_free(&out);
    sm_buf_free(&text);
    sm_buf_free(&src);
    json_decref(in);
    json_decref(tools);
    sm_jinja_free(t);
    if (ct.special || ct.t) sm_chat_free(&ct);
    return 2;
}
