/* chatconfig.c: the tokenizer_config.json make-model writes beside its tokenizer.json: the
 * bos / eos token strings and a ChatML-like chat template written with the model's own
 * special tokens ("<|bos|>" opens the conversation, "<|eos|>" ends each message, so a reply
 * stops where the template's messages stop), so `sparkmono serve` can chat with a test model.
 * We rejected ChatML's own "<|im_start|>" markers: they are not tokens of these models and
 * would cost several byte tokens a message.
 */
#include "testing/makemodel.h"
#include <jansson.h>
#include <stdio.h>

/* The template (Jinja, the subset of src/serve/jinja.h). */
static const char CHAT_TEMPLATE[] =
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

int sm_make_chat_config(const char *dir, const char *bos, const char *eos, sm_err *e) {
    char path[4608];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_pack("{s:s?, s:s, s:s}", "bos_token", bos, "eos_token", eos, "chat_template", CHAT_TEMPLATE);
    int rc = cfg && !json_dump_file(cfg, path, JSON_INDENT(2)) ? 0 : sm_errf(e, "%s: cannot write", path);
    json_decref(cfg);
    return rc;
}
