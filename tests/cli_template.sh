#!/bin/sh
# cli_template.sh BUILD_DIR: `sparkmono template` and the chat-template renderer.  Its --help and
# the README's listing; make-model's template rendered (the exact prompt); check's chat-template
# line; strftime_now (today, or the day of SPARKMONO_TEMPLATE_DATE); chat_template.jinja and a
# list of named templates ("default"); bad input (exit 2, one line naming the problem: no
# template, a template outside the subset with its line and column, bad JSON, conflicting
# flags); then tests/jinja/jinjacmp.py, byte for byte against Jinja2 set up as transformers sets
# it up: every construct, templates in the style of twelve model families over 60
# conversations each, every built-in, the case mapping of every code point, the integer
# overflows refused, the templates refused (a missing package fails).  Prints PASS/FAIL lines
# and a DONE line.
NAME=cli_template
. "$(dirname "$0")/lib_cli.sh"
HERE=$(dirname "$0")

"$SM" template --help >"$T/h.out" 2>"$T/h.err"; rc=$?
if [ $rc -eq 0 ] && [ ! -s "$T/h.err" ] && grep -q '^usage: sparkmono template ' "$T/h.out" &&
    grep -q '^  sparkmono template ' "$T/h.out"; then
    pass help_template
else
    fail help_template "rc $rc"
fi
sed -n '/^## Command line/,/^## /p' "$HERE/../README.md" >"$T/readme_cli"
missing=
for f in $(sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p' "$T/h.out"); do
    grep -q -e "$f\([^a-z0-9-]\|\$\)" "$T/readme_cli" || missing="$missing $f"
done
if [ -z "$missing" ]; then pass readme_lists_template_options; else fail readme_lists_template_options "missing:$missing"; fi

if ! "$SM" make-model --quiet --preset tiny --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1 || [ ! -f "$T/tiny/tokenizer_config.json" ]; then
    cat "$T/mm.out"; fail make_model_chat_template; done_
fi
pass make_model_chat_template
printf '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]' >"$T/m.json"
# text parts are joined with "\n" (vLLM's rule for a text-only model)
printf '<|bos|><|system|>\nBe brief.<|eos|>\n<|user|>\nHel\nlo<|eos|>\n<|assistant|>\n' >"$T/want"
"$SM" template "$T/tiny" --messages "$T/m.json" >"$T/got" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && cmp -s "$T/got" "$T/want"; then pass render_make_model_template; else fail render_make_model_template "rc $rc: $(cat "$T/got" "$T/err")"; fi
"$SM" template "$T/tiny" --messages "$T/m.json" --no-generation-prompt >"$T/got2"
if head -c -14 "$T/want" | cmp -s - "$T/got2"; then pass no_generation_prompt; else fail no_generation_prompt "$(cat "$T/got2")"; fi
if "$SM" template "$T/tiny" | grep -q 'chat template (tokenizer_config.json) ok'; then pass parse_only; else fail parse_only; fi
if "$SM" check "$T/tiny" | grep -q '^chat template: tokenizer_config.json$'; then pass check_reports_template; else fail check_reports_template; fi

printf '{{ strftime_now("%%Y") }}' >"$T/date.jinja"; printf '{}' >"$T/v.json"
y=$(date +%Y); got=$(SPARKMONO_TEMPLATE_DATE= "$SM" template --template "$T/date.jinja" --vars "$T/v.json")
if [ "$got" = "$y" ]; then pass strftime_now; else fail strftime_now "'$got' != '$y'"; fi
printf '{{ strftime_now("%%d %%b %%Y, %%A") }}' >"$T/date2.jinja"
got=$(SPARKMONO_TEMPLATE_DATE=2024-07-26 "$SM" template --template "$T/date2.jinja" --vars "$T/v.json")
if [ "$got" = "26 Jul 2024, Friday" ]; then pass strftime_now_fixed_date; else fail strftime_now_fixed_date "'$got'"; fi
export SPARKMONO_TEMPLATE_DATE=26.7.2024
bad_msg strftime_now_bad_date "SPARKMONO_TEMPLATE_DATE must be YYYY-MM-DD, not '26.7.2024'" template --template "$T/date2.jinja" --vars "$T/v.json"
unset SPARKMONO_TEMPLATE_DATE

# ---- the other places a template may be: chat_template.jinja, a list of named templates
mkdir -p "$T/jin" "$T/named"
printf '{"bos_token": {"content": "<B>"}, "eos_token": "<E>"}' >"$T/jin/tokenizer_config.json"
printf '{{ bos_token }}{%% for m in messages %%}{{ m.role }}={{ m.content }}{{ eos_token }}{%% endfor %%}\n' >"$T/jin/chat_template.jinja"
printf '[{"role": "user", "content": "hi"}]' >"$T/one.json"
if [ "$("$SM" template "$T/jin" --messages "$T/one.json")" = '<B>user=hi<E>' ] &&
    "$SM" template "$T/jin" | grep -q 'chat template (chat_template.jinja) ok'; then
    pass chat_template_jinja_file
else
    fail chat_template_jinja_file "$("$SM" template "$T/jin" --messages "$T/one.json" 2>&1)"
fi
printf '{"eos_token": "<E>", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages[0].content }}"}]}' >"$T/named/tokenizer_config.json"
if [ "$("$SM" template "$T/named" --messages "$T/one.json")" = 'Dhi' ]; then pass named_default_template; else fail named_default_template; fi
printf '{"eos_token": "<E>", "chat_template": "{%% for t in tools or [] %%}{{ t.function.name }};{%% endfor %%}{{ messages[0].content }}"}' >"$T/named/tokenizer_config.json"
printf '[{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "f-2"}}]' >"$T/tools.json"
if [ "$("$SM" template "$T/named" --messages "$T/one.json" --tools "$T/tools.json")" = 'get_weather;f-2;hi' ] &&
    [ "$("$SM" template "$T/named" --messages "$T/one.json")" = 'hi' ]; then pass tools_reach_template; else fail tools_reach_template; fi
printf '[{"type": "function", "function": {"name": "no spaces"}}]' >"$T/badtools.json"
bad_msg bad_tools "badtools.json: tools[0].function.name must be 1 to 64 of a-z" template "$T/named" --messages "$T/one.json" --tools "$T/badtools.json"
bad_msg tools_without_messages "--tools goes with a model directory and --messages" template "$T/named" --tools "$T/tools.json"
printf '{"chat_template": [{"name": "tool_use", "template": "T"}]}' >"$T/named/tokenizer_config.json"
bad_msg named_without_default "chat_template is a list of named templates without one named \"default\"" template "$T/named"
printf '{"chat_template": 5' >"$T/named/tokenizer_config.json"
bad_msg bad_tokenizer_config "tokenizer_config.json: not valid JSON" template "$T/named"

# ---- bad input
mkdir -p "$T/none"
bad_msg no_template "$T/none: no chat template" template "$T/none" --messages "$T/m.json"
printf '{{ messages | wordcount }}' >"$T/bad.jinja"
bad_msg unsupported_filter "bad.jinja: line 1 col 15: unsupported filter 'wordcount'" template --template "$T/bad.jinja"
printf 'hi\n{%% for m in messages %%}\n  {{ m.content }' >"$T/bad2.jinja"
bad_msg never_closed "bad2.jinja: line 3 col 3: '{{' is never closed" template --template "$T/bad2.jinja"
printf '{"messages": [' >"$T/bad.json"; printf 'ok' >"$T/ok.jinja"
bad_msg bad_vars_json "bad.json: not valid JSON" template --template "$T/ok.jinja" --vars "$T/bad.json"
bad_msg dir_and_template "give a model directory or --template FILE" template "$T/tiny" --template "$T/bad.jinja"
bad_msg two_inputs "give one of --messages, --vars, --batch" template "$T/tiny" --messages "$T/m.json" --vars "$T/m.json"
printf '[{"role": "user", "content": 7}]' >"$T/m7.json"
bad_msg bad_message "messages[0].content must be a string or a list of text parts" template "$T/tiny" --messages "$T/m7.json"
printf '{{ raise_exception("no system role here") }}' >"$T/raise.jinja"; printf '{}' >"$T/v.json"
bad_msg raise_exception "raise.jinja: no system role here" template --template "$T/raise.jinja" --vars "$T/v.json"
printf '{%% for i in range(100000) %%}{%% for j in range(100000) %%}{%% endfor %%}{%% endfor %%}' >"$T/loop.jinja"
bad_msg loop_bound "loop.jinja: line 1 col 32: the template ran more than 1000000 loop iterations" template --template "$T/loop.jinja" --vars "$T/v.json"
printf '{%% macro m(x) %%}{{ m(x) }}{%% endmacro %%}{{ m(1) }}' >"$T/rec.jinja"
bad_msg macro_recursion_bound "rec.jinja: line 1 col 21: macro calls nested deeper than 64" template --template "$T/rec.jinja" --vars "$T/v.json"
printf '{{ "ab" * 100000000 }}' >"$T/rep.jinja"
bad_msg output_bound "rep.jinja: line 1 col 9: a string repeated beyond 67108864 bytes" template --template "$T/rep.jinja" --vars "$T/v.json"
cp "$T/tiny/config.json" "$T/tiny/tokenizer.json" "$T/none/" && ln -s "$(cd "$T/tiny" && pwd)/model.safetensors" "$T/none/"
printf '{"chat_template": "{%% include \\"x\\" %%}"}' >"$T/none/tokenizer_config.json"
bad_msg check_refuses_template "tokenizer_config.json: chat_template: line 1 col 4: unsupported tag 'include'" check "$T/none"
bad_msg serve_refuses_template "tokenizer_config.json: chat_template: line 1 col 4: unsupported tag 'include'" serve "$T/none" --port 0

# ---- against Jinja2
if ! python3 -c 'import jinja2' 2>"$T/imp"; then
    fail jinja_python "python3 cannot import jinja2 ($PY_HINT): $(tail -1 "$T/imp")"
    done_
fi
python3 "$HERE/jinja/jinjacmp.py" "$SM" "$T/py" >"$T/py.out" 2>&1; rc=$?
grep -E '^(PASS|FAIL) ' "$T/py.out"
np=$((np + $(grep -c '^PASS ' "$T/py.out"))); nf=$((nf + $(grep -c '^FAIL ' "$T/py.out")))
if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$T/py.out"; then fail jinja_python "exit $rc: $(tail -3 "$T/py.out")"; fi
grep -q '^PASS render_kitchen ' "$T/py.out" || fail jinja_python_ran "no comparison of the kitchen-sink template"
nfam=$(grep -c '^PASS render_family_' "$T/py.out")
[ "$nfam" -ge 12 ] || fail jinja_python_families "$nfam model families compared (12 expected)"
done_
