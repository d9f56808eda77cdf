/* serve_chat.h: chat completions over the completions path: a model directory's chat template
 * (tokenizer_config.json "chat_template", a string or a list of named templates whose
 * "default" is used, or chat_template.jinja beside it), the messages of a request checked and
 * rendered with it (src/jinja/jinja.h), the text tokenized as transformers does (the template
 * writes bos itself; no special token is added), and the chat-shaped answers.
 *
 * A chat request becomes a completions request: the body minus "messages", plus "prompt" as
 * the rendered ids, goes through sm_api_parse_completion, so every sampling field (n among
 * them) is checked and runs once; chat's "logprobs": true with "top_logprobs": k becomes the
 * completions field "logprobs": k, and the answers give them in the chat shape
 * (sm_api_chat_logprobs).  We rejected a second request parser for chat: the two would drift.
 */
#ifndef SM_SERVE_CHAT_H
#define SM_SERVE_CHAT_H
#include <jansson.h>
#include "jinja/jinja.h"
#include "serve/serve_api.h"
#include "serve/serve_text.h"

typedef struct sm_chat_tmpl {
    sm_jinja *t;               /* the parsed template; NULL: the directory has none */
    json_t *special;           /* {"bos_token": "...", "eos_token": "..."} from tokenizer_config.json (owned) */
    char source[64];           /* the file it came from ("tokenizer_config.json" / "chat_template.jinja") */
} sm_chat_tmpl;

/* Load dir's template.  0 (t->t NULL when there is none), or -1 with one line naming the file
 * and the problem ("DIR/tokenizer_config.json: chat_template: line 3 col 5: unsupported
 * filter 'foo'"). */
int sm_chat_load(const char *dir, const char *file, sm_chat_tmpl *t, sm_err *e); /* file: the template's own
                                                                                  file (serve --chat-template), or NULL */
void sm_chat_free(sm_chat_tmpl *t);
/* Render messages (checked: a non-empty list of {role: string, content, name?: string}; content
 * a string, a list of {type: "text", text} parts (joined with "\n", as vLLM joins them for a
 * text-only model) or, for an assistant message, null or none (the empty string)) with
 * add_generation_prompt and tools (the template's `tools`: a list checked by sm_chat_tools, or
 * NULL: none; [] stays a list); every other key of a message goes to the template as it is
 * ("tool_calls", "tool_call_id" among them), but a tool call's function.arguments string goes
 * as the JSON value it holds (vLLM's rendering; not JSON: an error naming it).  extra (an
 * object, or NULL): more template variables (chat_template_kwargs, documents), under the ones
 * set here.  0, or -1 with one line in e and param the offending field
 * ("messages[2].content[0].type"); *raised when it is the template's raise_exception. */
int sm_chat_render(const sm_chat_tmpl *t, const json_t *messages, const json_t *tools, int add_generation_prompt,
                   const json_t *extra, sm_buf *out, char *param, int *raised, sm_err *e);
/* Check a request's "tools" (NULL, null or [] for none; else OpenAI's list of {"type":
 * "function", "function": {"name", "description"?, "parameters"?, "strict"?}}).  0, or -1 with
 * one line in e and param the offending field ("tools[1].function.name"). */
int sm_chat_tools(const json_t *tools, char *param, sm_err *e);
/* A /v1/chat/completions body into a completions request (prompt: the rendered ids).  As
 * sm_api_parse_completion: 0, or -1 with *status, param and e.  max_tokens (or its chat name
 * max_completion_tokens) defaults to the rest of the context, as OpenAI's and vLLM's chat do
 * (not completions' 16).  Tools reach the template with
 * "tool_choice": "none" only: this server does not parse tool calls out of the model's text
 * (vLLM needs a parser of the model's format for that), so "auto" (the default with tools),
 * "required" and a named function are a 400 that says so, never a silent answer without calls. */
int sm_chat_parse(const sm_chat_tmpl *t, const char *body, size_t len, const sm_api_model *m, sm_api_req *out,
                  int *status, char *param, sm_err *e);

/* The answers: a whole chat completion (choices c [nc] in index order: text, finish, logprobs);
 * a stream chunk of one choice (role: a choice's first chunk "assistant", else NULL; its news:
 * text, finish NULL while it runs, the new ids' logprobs); the usage chunk. */
char *sm_chat_completion(const char *id, long created, const char *model, const sm_api_choice *c, int nc,
                         int prompt_tokens, int completion_tokens);
char *sm_chat_chunk(const char *id, long created, const char *model, const char *role, const sm_api_choice *c);
char *sm_chat_usage_chunk(const char *id, long created, const char *model, int prompt_tokens, int completion_tokens);

#endif
