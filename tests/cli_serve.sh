#!/bin/sh
# cli_serve.sh BUILD_DIR: `sparkmono serve`.  Its command line here (every bad flag, a missing
# model, a port in use, a broken tokenizer.json: exit 2 with one line on stderr; every option
# of --help in the README), then the HTTP API through the official `openai` Python client
# (tests/serve, pytest with the passfail plugin: one PASS/FAIL line a test): completions,
# streaming, concurrent clients equal to each alone, bad bodies, the 503 queue, client
# disconnects (test_cancel.py: dead queued and running clients free their places), SIGTERM
# (tests/cli_serve_load.sh: slow, idle and many clients), /tokenize, /detokenize, /version,
# /metrics and the text prompts' refusals (test_misc.py), the API key (test_auth.py), n choices
# and lists of prompts (test_choices.py), the prefix cache's metrics, /health pool and
# --no-prefix-cache (test_prefix.py), vLLM's sampling fields (min_p, allowed_token_ids,
# bad_words, prompt_logprobs, ...), text_offset and the HTTP edges of a malformed request line
# and NULs (test_vllm_fields.py); and
# `sparkmono check` refusing the broken tokenizer.json serve refuses.  Prints PASS/FAIL
# lines and a DONE line.
NAME=cli_serve
. "$(dirname "$0")/lib_cli.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
SM_ABS=$(cd "$(dirname "$SM")" && pwd)/$(basename "$SM")

# ---- --help: the README's Command line section lists every option
README="$HERE/../README.md"
if "$SM" serve --help >"$T/h.out" 2>"$T/h.err" && grep -q '^usage: sparkmono serve ' "$T/h.out" && [ ! -s "$T/h.err" ]; then
    pass help_serve
else
    fail help_serve "$(head -c 200 "$T/h.err")"
fi
sed -n '/^## Command line/,/^## /p' "$README" >"$T/readme_cli"
missing=
for f in $(sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p' "$T/h.out"); do
    grep -q -e "$f\([^a-z0-9-]\|\$\)" "$T/readme_cli" || missing="$missing $f"
done
if [ -z "$missing" ] && grep -q 'sparkmono serve' "$T/readme_cli"; then pass readme_lists_serve_options; else fail readme_lists_serve_options "missing:$missing"; fi

# ---- bad command lines
if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi
bad serve_no_model serve
bad serve_model_twice serve "$T/tiny" --model "$T/tiny"
bad serve_missing_dir serve "$T/no-such-model" --port 0
bad serve_bad_port serve "$T/tiny" --port 70000
bad serve_bad_host serve "$T/tiny" --host 300.1.2.3 --port 0
bad serve_bad_backend serve "$T/tiny" --backend tpu
bad serve_small_body serve "$T/tiny" --max-body 10
bad serve_rows_and_nospec serve "$T/tiny" --request-rows 4 --no-spec
bad serve_no_connections serve "$T/tiny" --max-connections 0
bad serve_zero_request_timeout serve "$T/tiny" --request-timeout 0
bad serve_bad_idle_timeout serve "$T/tiny" --idle-timeout 5s
bad serve_bad_gpu_util serve "$T/tiny" --gpu-memory-utilization 2
bad serve_gpu_util_with_kv_blocks serve "$T/tiny" --gpu-memory-utilization 0.9 --kv-blocks 8
bad serve_gpu_util_on_cpu serve "$T/tiny" --gpu-memory-utilization 0.9 --port 0
mkdir "$T/badtok" && cp "$T/tiny/config.json" "$T/badtok/" && ln -s "$T/tiny/model.safetensors" "$T/badtok/" &&
    printf '{"model": {"type": "BPE", "vocab": 5}' >"$T/badtok/tokenizer.json"
bad serve_broken_tokenizer serve "$T/badtok" --port 0
# check loads tokenizer.json as serve does: the same line, and nothing printed on stdout
bad_msg check_broken_tokenizer "check: $T/badtok/tokenizer.json: not valid JSON" check "$T/badtok"
if [ -s "$T/bad.out" ]; then fail check_broken_tokenizer_no_output "$(head -c 200 "$T/bad.out")"; else pass check_broken_tokenizer_no_output; fi
mkdir "$T/dirtok" && cp "$T/tiny/config.json" "$T/dirtok/" && ln -s "$T/tiny/model.safetensors" "$T/dirtok/" && mkdir "$T/dirtok/tokenizer.json"
bad_msg check_tokenizer_not_a_file "check: $T/dirtok/tokenizer.json: not a regular file" check "$T/dirtok"
bad_msg serve_tokenizer_not_a_file "serve: $T/dirtok/tokenizer.json: not a regular file" serve "$T/dirtok" --port 0
if "$SM" check "$T/tiny" >"$T/chk.out" 2>"$T/chk.err" && grep -q "^tokenizer: $T/tiny/tokenizer.json, 512 tokens\$" "$T/chk.out"; then
    pass check_good_tokenizer
else
    fail check_good_tokenizer "$(cat "$T/chk.err"; grep tokenizer "$T/chk.out")"
fi
# --api-key: an empty key, or one a header cannot carry, from the flag or the variable
bad_msg serve_empty_api_key "serve: --api-key is empty" serve "$T/tiny" --port 0 --api-key ""
bad_msg serve_api_key_space "serve: --api-key holds a character that cannot go in an HTTP header" serve "$T/tiny" --port 0 --api-key "a b"
SPARKMONO_API_KEY=$(printf 'k\001'); export SPARKMONO_API_KEY
bad_msg serve_env_key_control "serve: SPARKMONO_API_KEY holds a character that cannot go in an HTTP header" serve "$T/tiny" --port 0
unset SPARKMONO_API_KEY
# a port in use: a first server holds it
"$SM" serve "$T/tiny" --port 0 --threads 1 --quiet >"$T/s1.out" 2>"$T/s1.err" &
pid=$!
i=0; while [ $i -lt 100 ] && ! grep -q listening "$T/s1.out"; do sleep 0.05; i=$((i + 1)); done
port=$(sed -n 's/.*:\([0-9][0-9]*\)\/v1.*/\1/p' "$T/s1.out")
if [ -n "$port" ]; then
    bad serve_port_in_use serve "$T/tiny" --port "$port"
else
    fail serve_port_in_use "the first server did not start: $(cat "$T/s1.err")"
fi
kill -TERM $pid; wait $pid; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c . "$T/s1.err")" -le 2 ]; then pass serve_sigterm_idle_exit0; else fail serve_sigterm_idle_exit0 "exit $rc: $(cat "$T/s1.err")"; fi
# an open-file limit (soft and hard) too low for --max-connections: one line, fewer connections
# (600 files less 64 spare connections and 128 other files leave 408)
(ulimit -n 600 2>/dev/null || exit 99; exec "$SM" serve "$T/tiny" --port 0 --threads 1 --quiet) >"$T/lo.out" 2>"$T/lo.err" &
pid=$!
i=0; while [ $i -lt 100 ] && ! grep -q listening "$T/lo.out" && kill -0 $pid 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
if grep -q '; 408 connections,' "$T/lo.out" && [ "$(grep -c . "$T/lo.err")" -eq 1 ] &&
    grep -q 'open-file limit is 600 .*at most 408 connections' "$T/lo.err"; then
    pass serve_low_open_file_limit; echo "  $(cat "$T/lo.err")"
else
    fail serve_low_open_file_limit "$(cat "$T/lo.out" "$T/lo.err" | head -c 300)"
fi
kill -TERM $pid 2>/dev/null; wait $pid

# ---- the HTTP API (pytest)
if python3 -c 'import openai, pytest, requests, tokenizers, prometheus_client' 2>"$T/imp"; then
    PYTHONDONTWRITEBYTECODE=1 SM_BIN="$SM_ABS" PYTHONPATH="$HERE/serve" \
        python3 -m pytest -q -p no:cacheprovider -p passfail --basetemp="$T/pt" "$HERE/serve/test_serve.py" "$HERE/serve/test_cancel.py" \
        "$HERE/serve/test_misc.py" "$HERE/serve/test_auth.py" "$HERE/serve/test_fields.py" "$HERE/serve/test_chat.py" \
        "$HERE/serve/test_choices.py" "$HERE/serve/test_prefix.py" "$HERE/serve/test_structured.py" \
        "$HERE/serve/test_vllm_fields.py" >"$T/py.out" 2>&1
    rc=$?
    cat "$T/py.out"
    p=$(grep -c '^PASS ' "$T/py.out"); f=$(grep -c '^FAIL ' "$T/py.out")
    np=$((np + p)); nf=$((nf + f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then fail serve_pytest "pytest exit $rc"; fi
else
    fail serve_python_deps "$(tail -n 1 "$T/imp"); $PY_HINT"
fi
done_
