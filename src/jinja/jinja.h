/* jinja.h: the chat templates of Hugging Face model directories, rendered in C: the Jinja2 that
 * chat templates use, in the environment transformers' apply_chat_template sets (an immutable
 * sandbox; trim_blocks, lstrip_blocks, loop controls; the globals raise_exception and
 * strftime_now; a tojson that is json.dumps with ensure_ascii=False; the generation tag).
 * Used by `sparkmono template`, `sparkmono check` and the server (src/serve/serve_chat.c).
 *
 * A template is parsed once (sm_jinja_parse) into an immutable tree that many threads may
 * render at once (sm_jinja_render, each with its own variables and output).  Everything the
 * parser does not support (a tag, filter, test, method or function outside the subset) is
 * refused at parse time with one line naming it and its line:column, so a server refuses the
 * template at start rather than a request at run time.  Integers are 64-bit: an operation
 * whose result would not fit is an error naming it, never a wrapped value.  Strings are
 * Python's: lengths, indices and slices count code points, and lower / upper / title /
 * capitalize map case as Python's str does (full Unicode mappings through utf8proc).  We
 * rejected embedding Python or a C++ Jinja library: the server must stay C with no
 * interpreter.  The subset is listed in README.md ("Chat templates").
 *
 * strftime_now(fmt) formats the local time now, as transformers' datetime.now().strftime;
 * for tests, SPARKMONO_TEMPLATE_DATE=YYYY-MM-DD makes it that day at 00:00:00 instead.
 */
#ifndef SM_JINJA_H
#define SM_JINJA_H
#include <jansson.h>
#include "base/buf.h"
#include "base/err.h"

typedef struct sm_jinja sm_jinja;

/* Parse template src [n bytes].  0, or -1 with e = "line L col C: <problem>". */
int sm_jinja_parse(const char *src, size_t n, sm_jinja **out, sm_err *e);
void sm_jinja_free(sm_jinja *t);
/* Render t with the variables of object vars, appending to out.  0, or -1 with one line in e;
 * *raised is 1 when that line is the template's own raise_exception message (else 0). */
int sm_jinja_render(const sm_jinja *t, json_t *vars, sm_buf *out, int *raised, sm_err *e);

#endif
