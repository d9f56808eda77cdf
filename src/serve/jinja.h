/* jinja.h: the chat templates of Hugging Face model directories, rendered in C: the subset of
 * Jinja2 that chat templates use, with the environment transformers' apply_chat_template sets
 * (trim_blocks, lstrip_blocks, loop controls, raise_exception, a tojson that keeps non-ASCII).
 *
 * A template is parsed once (sm_jinja_parse) into an immutable tree that many threads may
 * render at once (sm_jinja_render, each with its own variables and output).  Everything the
 * parser does not support (a tag, filter, test, method or function outside the subset) is
 * refused at parse time with one line naming it and its line:column, so a server refuses the
 * template at start rather than a request at run time.  We rejected embedding Python or a
 * C++ Jinja library: the server must stay C with no interpreter, and the subset is small.
 * The subset is listed in README.md ("Chat templates").
 */
#ifndef SM_JINJA_H
#define SM_JINJA_H
#include <jansson.h>
#include "base/err.h"
#include "serve/serve_text.h"

typedef struct sm_jinja sm_jinja;

/* Parse template src [n bytes].  0, or -1 with e = "line L col C: <problem>". */
int sm_jinja_parse(const char *src, size_t n, sm_jinja **out, sm_err *e);
void sm_jinja_free(sm_jinja *t);
/* Render t with the variables of object vars into out.  0, or -1 with one line in e; *raised
 * is 1 when that line is the template's own raise_exception message (else 0). */
int sm_jinja_render(const sm_jinja *t, json_t *vars, sm_sbuf *out, int *raised, sm_err *e);

#endif
