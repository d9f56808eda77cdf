/* serve_chat.c: chat templates of model directories and /v1/chat/completions bodies (see
 * serve_chat.h).
 *
 * The template is parsed once at server start (a template outside the supported subset stops
 * the server with its line) and rendered per request with the variables transformers'
 * apply_chat_template passes: messages, add_generation_prompt, bos_token and eos_token, tools
 * (the request's, with tool_choice "none": no tool calls are parsed) and documents (none).
 * We rejected rendering in the engine thread: a render is a few microseconds of the
 * connection's own thread and needs no lock (the tree is read-only).
 */
#include "serve/serve_chat.h"
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

/* The template text of a tokenizer_config.json "chat_template" value (a string, or a list of
 * {name, template} whose "default" is used); NULL with e set when it has another shape. */
static const char *template_text(const char *path, json_t *v, sm_err *e) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            json_t *nm = json_object_get(x, "name"), *tp = json_object_get(x, "template");
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") && json_is_string(tp))
                return json_string_value(tp);
        }
        sm_errf(e, "%s: chat_template is a list of named templates without one named \"default\"", path);
        return NULL;
    }
    sm_errf(e, "%s: chat_template must be a string or a list of {name, template}", path);
    return NULL;
}

/* bos_token / eos_token of the config: a string, or an added token {"content": ...}. */
static void special_tokens(json_t *cfg, json_t *out) {
    static const char *const names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(cfg, names[i]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (json_is_string(v)) json_object_set(out, names[i], v);
    }
}

/* The whole file at path into a new NUL-terminated buffer, or NULL. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    sm_buf b = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sm_buf_add(&b, buf, n);
    fclose(f);
    return b.p ? b.p : strdup("");
}

int sm_chat_load(const char *dir, const char *file, sm_chat_tmpl *t, sm_err *e) {
    memset(t, 0, sizeof t[0]);
    char path[4200];
    struct stat st;
    json_t *cfg = NULL;
    char *text = NULL;
    const char *src = NULL;
    int rc = -1;
    t->special = json_object();
    if (!t->special) return sm_errf(e, "out of memory");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (stat(path, &st) == 0) {
        json_error_t je;
        if (!(cfg = json_load_file(path, 0, &je)))
            return sm_errf(e, "%s: not valid JSON: %s (line %d)", path, je.text, je.line);
        if (!json_is_object(cfg)) { sm_errf(e, "%s: not a JSON object", path); goto out; }
        special_tokens(cfg, t->special);
        json_t *v = json_object_get(cfg, "chat_template");
        if (v && !json_is_null(v) && !file) {
            if (!(src = template_text(path, v, e))) goto out;
            snprintf(t->source, sizeof t->source, "tokenizer_config.json");
        }
    }
    if (file) { /* the caller's (serve --chat-template FILE), over the directory's */
        snprintf(path, sizeof path, "%s", file);
        if (!(text = read_text(path))) { sm_errf(e, "--chat-template %s: %s", file, strerror(errno)); goto out; }
        src = text;
        const char *base = strrchr(file, '/');
        snprintf(t->source, sizeof t->source, "%.60s", base ? base + 1 : file); /* the file's name */
    } else if (!src) { /* chat_template.jinja beside it */
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        if (!(text = read_text(path))) { rc = 0; goto out; } /* no template */
        src = text;
        snprintf(t->source, sizeof t->source, "chat_template.jinja");
    }
    if (sm_jinja_parse(src, strlen(src), &t->t, e)) {
        sm_errprefix(e, "%s%s", path, strstr(path, ".json") ? ": chat_template" : "");
        goto out;
    }
    rc = 0;
out:
    json_decref(cfg);
    free(text);
    if (rc) sm_chat_free(t);
    return rc;
}

void sm_chat_free(sm_chat_tmpl *t) {
    sm_jinja_free(t->t);
    json_decref(t->special);
    t->t = NULL;
    t->special = NULL;
}

/* A 400 naming field path ("messages[2].content[0].type": param too) with the rest of the line what; -1. */
static int bad_at(char *param, sm_err *e, const char *path, const char *what) {
    snprintf(param, SM_API_PARAM, "%.63s", path);
    return sm_errf(e, "%s%s", path, what);
}

/* Message i's content as the template sees it: a string as it is; a list of parts joined with
 * "\n" in order (vLLM's rule for a text-only model); null (or none) for an assistant message, as
 * OpenAI allows (one that only called tools), the empty string.  NULL with param and e set on
 * anything else. */
static json_t *content_text(const json_t *m, int i, char *param, sm_err *e) {
    const json_t *content = json_object_get(m, "content"), *role = json_object_get(m, "role");
    char path[80];
    if (json_is_string(content)) return json_incref((json_t *)content);
    if ((!content || json_is_null(content)) && !strcmp(json_string_value(role), "assistant")) return json_string("");
    if (!json_is_array(content)) {
        snprintf(path, sizeof path, "messages[%d].content", i);
        bad_at(param, e, path, " must be a string or a list of text parts (null only for an assistant message)");
        return NULL;
    }
    sm_buf b = {0};
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part) {
        const json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        int bad = 1;
        if (!json_is_object(part)) {
            snprintf(path, sizeof path, "messages[%d].content[%d]", i, (int)k);
            bad_at(param, e, path, " must be an object {\"type\": \"text\", \"text\": string}");
        } else if (!json_is_string(ty)) {
            snprintf(path, sizeof path, "messages[%d].content[%d].type", i, (int)k);
            bad_at(param, e, path, " must be a string (\"text\")");
        } else if (strcmp(json_string_value(ty), "text")) {
            snprintf(path, sizeof path, "messages[%d].content[%d].type", i, (int)k);
            bad_at(param, e, path, "");
            sm_errf(e, "%s is '%.40s'; this model takes text only (parts of \"type\": \"text\")", path,
                    json_string_value(ty));
        } else if (!json_is_string(tx)) {
            snprintf(path, sizeof path, "messages[%d].content[%d].text", i, (int)k);
            bad_at(param, e, path, " must be a string");
        } else {
            bad = (k > 0 && sm_buf_add(&b, "\n", 1)) || sm_buf_add(&b, json_string_value(tx), json_string_length(tx));
            if (bad) sm_errf(e, "out of memory");
        }
        if (bad) {
            sm_buf_free(&b);
            return NULL;
        }
    }
    json_t *out = json_stringn(b.p ? b.p : "", b.n);
    sm_buf_free(&b);
    return out;
}

/* The messages checked, each content made a string: a new list (every other key kept, "name"
 * and "tool_calls" included, for the template; tool calls' arguments parsed). */
static json_t *normalize(const json_t *messages, char *param, sm_err *e) {
    if (!json_is_array(messages) || !json_array_size(messages)) {
        snprintf(param, SM_API_PARAM, "messages");
        sm_errf(e, "'messages' must be a non-empty list of messages");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        char path[64];
        snprintf(path, sizeof path, "messages[%d]", (int)i);
        if (!json_is_object(m)) { bad_at(param, e, path, " must be an object with 'role' and 'content'"); goto bad; }
        const json_t *name = json_object_get(m, "name");
        if (!json_is_string(json_object_get(m, "role"))) {
            bad_at(param, e, strcat(path, ".role"), " must be a string");
            goto bad;
        }
        if (name && !json_is_string(name)) { bad_at(param, e, strcat(path, ".name"), " must be a string"); goto bad; }
        json_t *text = content_text(m, (int)i, param, e), *c = NULL;
        if (!text) goto bad;
        if (!(c = json_copy(m))) {
            json_decref(text);
            sm_errf(e, "out of memory");
            goto bad;
        }
        json_object_set_new(c, "content", text);
        json_array_append_new(out, c);
        /* tool_calls[].function.arguments, a JSON text in OpenAI's API, reach the template as the
         * value they hold (vLLM parses them so: templates print or walk the object) */
        const json_t *tcs = json_object_get(m, "tool_calls");
        if (json_is_array(tcs)) {
            json_t *copy = json_deep_copy(tcs);
            json_object_set_new(c, "tool_calls", copy);
            size_t j;
            json_t *call;
            json_array_foreach(copy, j, call) {
                json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
                if (!json_is_string(args)) continue;
                json_t *v = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, NULL);
                if (!v) {
                    snprintf(path, sizeof path, "messages[%d].tool_calls[%d]", (int)i, (int)j);
                    bad_at(param, e, strcat(path, ".function.arguments"), " is not JSON");
                    goto bad;
                }
                json_object_set_new(fn, "arguments", v);
            }
        }
    }
    return out;
bad:
    json_decref(out);
    return NULL;
}

/* A function name as OpenAI takes it: 1..64 of a-z, A-Z, 0-9, '_' and '-'. */
static int tool_name_ok(const json_t *v) {
    if (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > 64) return 0;
    for (const char *c = json_string_value(v); *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
            return 0;
    return 1;
}

int sm_chat_tools(const json_t *tools, char *param, sm_err *e) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return bad_at(param, e, "tools", " must be a list of {\"type\": \"function\", \"function\": {...}}");
    size_t i;
    json_t *x;
    json_array_foreach(tools, i, x) {
        char path[80];
        const json_t *ty = json_object_get(x, "type"), *fn = json_object_get(x, "function");
        snprintf(path, sizeof path, "tools[%d]", (int)i);
        if (!json_is_object(x)) return bad_at(param, e, path, " must be an object {\"type\": \"function\", \"function\": {...}}");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
            return bad_at(param, e, strcat(path, ".type"), " must be \"function\" (the only kind of tool)");
        if (!json_is_object(fn)) return bad_at(param, e, strcat(path, ".function"), " must be an object with a 'name'");
        const json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
                     *par = json_object_get(fn, "parameters"), *strict = json_object_get(fn, "strict");
        if (!tool_name_ok(name))
            return bad_at(param, e, strcat(path, ".function.name"), " must be 1 to 64 of a-z, A-Z, 0-9, '_' and '-'");
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return bad_at(param, e, strcat(path, ".function.description"), " must be a string");
        if (par && !json_is_null(par) && !json_is_object(par))
            return bad_at(param, e, strcat(path, ".function.parameters"), " must be an object (a JSON Schema)");
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return bad_at(param, e, strcat(path, ".function.strict"), " must be true or false");
    }
    return 0;
}

/* The request's tools for the template (a new reference, or NULL for none), once tool_choice
 * and parallel_tool_calls are checked; the three fields leave root (the completions parser
 * does not know them).  0, or -1 with param and e. */
static int chat_tools(json_t *root, json_t **tools, char *param, sm_err *e) {
    json_t *tl = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice"),
           *ptc = json_object_get(root, "parallel_tool_calls");
    *tools = NULL;
    if (sm_chat_tools(tl, param, e)) return -1;
    if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
        return bad_at(param, e, "parallel_tool_calls", " must be true or false");
    const int some = json_is_array(tl) && json_array_size(tl) > 0;
    const char *choice = !tc || json_is_null(tc) ? (some ? "auto" : "none") : json_is_string(tc) ? json_string_value(tc) : NULL;
    if (tc && !json_is_null(tc)) { /* its shape: a mode, or {"type": "function", "function": {"name": one of tools}} */
        const json_t *fn = json_object_get(tc, "function"), *ty = json_object_get(tc, "type");
        const int mode = choice && (!strcmp(choice, "none") || !strcmp(choice, "auto") || !strcmp(choice, "required"));
        const int named = !choice && json_is_string(ty) && !strcmp(json_string_value(ty), "function") &&
                          tool_name_ok(json_object_get(fn, "name"));
        if (!mode && !named)
            return bad_at(param, e, "tool_choice", " must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}");
        if (!some && (!choice || !strcmp(choice, "required")))
            return bad_at(param, e, "tool_choice", " needs 'tools': there is no function to call");
        if (!choice) {
            int found = 0;
            for (size_t i = 0; i < json_array_size(tl); i++)
                found |= json_equal(json_object_get(json_object_get(json_array_get(tl, i), "function"), "name"),
                                    json_object_get(fn, "name"));
            if (!found) {
                snprintf(param, SM_API_PARAM, "tool_choice");
                return sm_errf(e, "tool_choice names the function '%s', which is not among 'tools'",
                               json_string_value(json_object_get(fn, "name")));
            }
        }
    }
    if (some && (!choice || strcmp(choice, "none"))) { /* calls wanted: refused, never answered without them */
        char what[64];
        if (!tc || json_is_null(tc)) snprintf(what, sizeof what, "'tools' without 'tool_choice' (\"auto\")");
        else if (choice) snprintf(what, sizeof what, "tool_choice \"%s\"", choice);
        else snprintf(what, sizeof what, "tool_choice naming a function");
        snprintf(param, SM_API_PARAM, "tool_choice");
        return sm_errf(e, "%s needs tool calls parsed out of the model's text, which this server does not do; send "
                       "\"tool_choice\": \"none\" to give the model the tools in its prompt and get its text as the "
                       "content", what);
    }
    if (json_is_array(tl)) *tools = json_incref(tl); /* [] stays a list, as vLLM hands it to the template */
    json_object_del(root, "tools");
    json_object_del(root, "tool_choice");
    json_object_del(root, "parallel_tool_calls");
    return 0;
}

int sm_chat_render(const sm_chat_tmpl *t, const json_t *messages, const json_t *tools, int add_generation_prompt,
                   const json_t *extra, sm_buf *out, char *param, int *raised, sm_err *e) {
    *raised = 0;
    json_t *msgs = normalize(messages, param, e);
    if (!msgs) return -1;
    json_t *vars = json_copy(t->special);
    json_object_set_new(vars, "documents", json_null());
    if (extra) json_object_update(vars, (json_t *)extra); /* chat_template_kwargs, documents: below the fixed ones */
    json_object_set_new(vars, "messages", msgs);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    json_object_set_new(vars, "tools", tools ? json_deep_copy(tools) : json_null());
    sm_buf text = {0}; /* rendered apart: a failed render leaves out as it was */
    int rc = sm_jinja_render(t->t, vars, &text, raised, e);
    json_decref(vars);
    if (!rc && sm_buf_add(out, text.p ? text.p : "", text.n)) rc = sm_errf(e, "out of memory");
    sm_buf_free(&text);
    if (rc && !*raised) sm_errprefix(e, "the chat template (%s) failed on these messages", t->source);
    return rc;
}

/* Chat's logprobs (true / false) and top_logprobs (0..20, only with logprobs true) made the
 * completions field they mean: "logprobs": top_logprobs (0 when left out), or none.  0, or -1
 * with param and e. */
static int chat_logprobs(json_t *root, char *param, sm_err *e) {
    json_t *lp = json_object_get(root, "logprobs"), *top = json_object_get(root, "top_logprobs");
    if (lp && !json_is_null(lp) && !json_is_boolean(lp)) {
        snprintf(param, SM_API_PARAM, "logprobs");
        return sm_errf(e, "'logprobs' must be true or false (chat completions; top_logprobs gives the alternatives)");
    }
    if (top && !json_is_null(top)) {
        snprintf(param, SM_API_PARAM, "top_logprobs");
        if (!json_is_true(lp)) return sm_errf(e, "'top_logprobs' needs 'logprobs': true");
        if (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > SPARKMONO_MAX_TOP_LOGPROBS)
            return sm_errf(e, "'top_logprobs' must be an integer in [0, %d]", SPARKMONO_MAX_TOP_LOGPROBS);
        param[0] = 0;
    }
    json_t *k = json_is_true(lp) ? json_integer(top && !json_is_null(top) ? json_integer_value(top) : 0) : NULL;
    json_object_del(root, "top_logprobs");
    json_object_del(root, "logprobs");
    if (k && json_object_set_new(root, "logprobs", k)) return sm_errf(e, "out of memory");
    return 0;
}

/* The template fields vLLM takes (they leave root): add_generation_prompt (default true),
 * continue_final_message (default false; not with add_generation_prompt true),
 * chat_template_kwargs (an object: more template variables, e.g. {"enable_thinking": false};
 * not the ones the server sets) and documents (a list, the template's `documents`) into *extra;
 * a request's own chat_template is refused (vLLM takes it only when trusted).  0, or -1 with
 * param and e. */
static int chat_template_fields(json_t *root, int *agp, int *cont, json_t **extra, char *param, sm_err *e) {
    json_t *a = json_object_get(root, "add_generation_prompt"), *c = json_object_get(root, "continue_final_message"),
           *kw = json_object_get(root, "chat_template_kwargs"), *docs = json_object_get(root, "documents"),
           *ct = json_object_get(root, "chat_template");
    if (a && !json_is_null(a) && !json_is_boolean(a)) return bad_at(param, e, "add_generation_prompt", " must be true or false");
    if (c && !json_is_null(c) && !json_is_boolean(c)) return bad_at(param, e, "continue_final_message", " must be true or false");
    *agp = !a || json_is_null(a) || json_is_true(a);
    *cont = json_is_true(c);
    if (*cont && a && json_is_true(a))
        return bad_at(param, e, "continue_final_message", " and 'add_generation_prompt' cannot both be true");
    if (*cont) *agp = 0; /* the final message goes on: no new turn */
    if (ct && !json_is_null(ct))
        return bad_at(param, e, "chat_template", " from a request is not taken: start the server with the template "
                      "(serve --chat-template FILE, or the model directory's tokenizer_config.json / chat_template.jinja)");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) return bad_at(param, e, "chat_template_kwargs", " must be an object");
    if (docs && !json_is_null(docs) && !json_is_array(docs)) return bad_at(param, e, "documents", " must be a list");
    *extra = json_object();
    if (kw && json_is_object(kw)) {
        static const char *const fixed[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            if (json_object_get(kw, fixed[i])) {
                char p[64];
                snprintf(p, sizeof p, "chat_template_kwargs.%s", fixed[i]);
                return bad_at(param, e, p, " is set by the server; give it as the request's own field");
            }
        json_object_update(*extra, kw);
    }
    if (docs && json_is_array(docs)) json_object_set(*extra, "documents", docs);
    static const char *const gone[] = {"add_generation_prompt", "continue_final_message", "chat_template_kwargs", "documents",
                                       "chat_template"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) json_object_del(root, gone[i]);
    return 0;
}

/* continue_final_message: the rendered text cut right after the final message's content (as
 * transformers does), so the model goes on with that message.  0, or -1 with param and e. */
static int continue_final(const json_t *msgs, sm_buf *text, char *param, sm_err *e) {
    const json_t *last = json_array_get(msgs, json_array_size(msgs) - 1), *c = json_object_get(last, "content");
    if (!json_is_string(c) || !json_string_length(c))
        return bad_at(param, e, "continue_final_message", " needs a final message with text content");
    const char *needle = json_string_value(c), *hay = text->p ? text->p : "", *at = NULL;
    const size_t nl = json_string_length(c);
    for (size_t i = 0; i + nl <= text->n; i++) /* its last occurrence */
        if (!memcmp(hay + i, needle, nl)) at = hay + i;
    if (!at)
        return bad_at(param, e, "continue_final_message", ": the chat template's text does not hold the final message's content");
    text->n = (size_t)(at - hay) + nl;
    return 0;
}

int sm_chat_parse(const sm_chat_tmpl *t, const char *body, size_t len, const sm_api_model *m, sm_api_req *out,
                  int *status, char *param, sm_err *e) {
    memset(out, 0, sizeof *out);
    param[0] = 0;
    *status = 400;
    json_error_t je;
    json_t *root = sm_api_load(body, len, &je);
    if (!root) return sm_errf(e, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = -1, raised = 0, *ids = NULL, nids = 0, agp = 1, cont = 0;
    json_t *tools = NULL, *extra = NULL;
    sm_buf text = {0};
    char *dumped = NULL;
    if (!json_is_object(root)) { sm_errf(e, "the body must be a JSON object"); goto out; }
    if (json_object_get(root, "prompt")) {
        snprintf(param, SM_API_PARAM, "prompt");
        sm_errf(e, "'prompt' is not a field of chat completions; send 'messages' (or use /v1/completions)");
        goto out;
    }
    static const char *const completion_only[] = {"echo", "suffix", "best_of"};
    for (size_t i = 0; i < sizeof completion_only / sizeof completion_only[0]; i++) {
        json_t *v = json_object_get(root, completion_only[i]); /* chat shapes of these are not built: refuse, not drop */
        if (v && !json_is_null(v) && !json_is_false(v)) {
            snprintf(param, SM_API_PARAM, "%s", completion_only[i]);
            sm_errf(e, "'%s' is not supported by chat completions here (use /v1/completions)", completion_only[i]);
            goto out;
        }
    }
    if (chat_logprobs(root, param, e) || chat_tools(root, &tools, param, e) ||
        chat_template_fields(root, &agp, &cont, &extra, param, e))
        goto out;
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs) { snprintf(param, SM_API_PARAM, "messages"); sm_errf(e, "'messages' is required"); goto out; }
    if (!m->tok) { sm_errf(e, "this model directory has no tokenizer.json, which chat needs"); goto out; }
    if (sm_chat_render(t, msgs, tools, agp, extra, &text, param, &raised, e)) goto out;
    if (cont && continue_final(msgs, &text, param, e)) goto out;
    sm_err te = {{0}};
    if (sm_tokenizer_encode(m->tok, text.p ? text.p : "", text.n, &ids, &nids, &te)) {
        sm_errf(e, "the rendered conversation cannot be tokenized: %s", te.msg);
        goto out;
    }
    if (!nids) {
        snprintf(param, SM_API_PARAM, "messages");
        sm_errf(e, "the chat template rendered these messages as empty text");
        goto out;
    }
    json_t *p = json_array();
    for (int i = 0; i < nids; i++) json_array_append_new(p, json_integer(ids[i]));
    json_object_del(root, "messages");
    json_object_set_new(root, "prompt", p);
    json_t *mct = json_object_get(root, "max_completion_tokens"), *mt = json_object_get(root, "max_tokens");
    if (mct && !json_is_null(mct) && (!mt || json_is_null(mt))) /* the chat name of max_tokens */
        json_object_set(root, "max_tokens", mct);
    else if ((!mct || json_is_null(mct)) && (!mt || json_is_null(mt)) && m->max_len > nids)
        json_object_set_new(root, "max_tokens", json_integer(m->max_len - nids)); /* neither: the rest of the context */
    json_object_del(root, "max_completion_tokens");
    if (!(dumped = json_dumps(root, JSON_COMPACT))) { sm_errf(e, "out of memory"); goto out; }
    rc = sm_api_parse_completion(dumped, strlen(dumped), m, out, status, param, e);
out:
    if (rc && !*status) *status = 400;
    free(dumped);
    free(ids);
    sm_buf_free(&text);
    json_decref(tools);
    json_decref(extra);
    json_decref(root);
    return rc;
}

static char *dump(json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

/* A choice's logprobs in the chat shape, or null. */
static json_t *chat_lp(const sm_api_choice *c) {
    return c->lp ? sm_api_chat_logprobs(c->lp, c->ids, c->nids) : json_null();
}

char *sm_chat_completion(const char *id, long created, const char *model, const sm_api_choice *c, int nc,
                         int prompt_tokens, int completion_tokens) {
    json_t *choices = json_array();
    for (int i = 0; choices && i < nc; i++)
        json_array_append_new(choices, json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s?}", "index", c[i].index, "message",
                                                 "role", "assistant", "content", c[i].text ? c[i].text : "",
                                                 c[i].text ? c[i].ntext : 0, "logprobs", chat_lp(&c[i]),
                                                 "finish_reason", c[i].finish));
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:i, s:i, s:i}}", "id", id, "object", "chat.completion",
                          "created", (json_int_t)created, "model", model, "choices", choices, "usage", "prompt_tokens",
                          prompt_tokens, "completion_tokens", completion_tokens, "total_tokens",
                          prompt_tokens + completion_tokens));
}

char *sm_chat_chunk(const char *id, long created, const char *model, const char *role, const sm_api_choice *c) {
    json_t *delta = json_object();
    if (delta && role) json_object_set_new(delta, "role", json_string(role));
    if (delta && (role || c->ntext || c->lp)) /* the content these logprobs are of, "" while held back */
        json_object_set_new(delta, "content", json_stringn(c->text ? c->text : "", c->text ? c->ntext : 0));
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:o, s:s?}]}", "id", id, "object",
                          "chat.completion.chunk", "created", (json_int_t)created, "model", model, "choices", "index",
                          c->index, "delta", delta, "logprobs", chat_lp(c), "finish_reason", c->finish));
}

char *sm_chat_usage_chunk(const char *id, long created, const char *model, int prompt_tokens, int completion_tokens) {
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:[], s:{s:i, s:i, s:i}}", "id", id, "object", "chat.completion.chunk",
                          "created", (json_int_t)created, "model", model, "choices", "usage", "prompt_tokens",
                          prompt_tokens, "completion_tokens", completion_tokens, "total_tokens",
                          prompt_tokens + completion_tokens));
}
