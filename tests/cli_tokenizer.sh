#!/bin/sh
# cli_tokenizer.sh BUILD_DIR: `sparkmono tokenize` end to end.  Its --help and the README's
# listing; the tokenizer.json make-model writes (specials at the config's ids, text round trip);
# --text, --text-file (stdin too), --ids, --batch, --skip-special, --stats; bad input (exit 2,
# one line that names the problem); then tests/tok/tokcmp.py: encode and decode token for token against the Python
# tokenizers package, on tokenizers it trains and on make-model's (a missing package fails).
# Prints PASS/FAIL lines and a DONE line (tests/run.sh counts them).
NAME=cli_tok
. "$(dirname "$0")/lib_cli.sh"
HERE=$(dirname "$0")

# ---- help, and every option in the README's Command line section
"$SM" tokenize --help >"$T/h.out" 2>"$T/h.err"; rc=$?
if [ $rc -eq 0 ] && [ ! -s "$T/h.err" ] && grep -q '^usage: sparkmono tokenize ' "$T/h.out" &&
    grep -q '^  sparkmono tokenize ' "$T/h.out" && grep -q '^  --skip-special ' "$T/h.out"; then
    pass help_tokenize
else
    fail help_tokenize "rc $rc"
fi
sed -n '/^## Command line/,/^## /p' "$HERE/../README.md" >"$T/readme_cli"
missing=
for f in $(sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p' "$T/h.out"); do
    grep -q -e "$f\([^a-z0-9-]\|\$\)" "$T/readme_cli" || missing="$missing $f"
done
if [ -z "$missing" ]; then pass readme_lists_tokenize_options; else fail readme_lists_tokenize_options "missing:$missing"; fi

# ---- make-model's tokenizer
if ! "$SM" make-model --quiet --preset tiny --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1 || [ ! -f "$T/tiny/tokenizer.json" ]; then
    cat "$T/mm.out"; fail make_model_tokenizer; done_
fi
pass make_model_tokenizer
text='Hello, world! The harbour is quiet.<|eos|>'
ids=$("$SM" tokenize "$T/tiny" --text "$text" 2>"$T/err"); rc=$?
n=$(echo "$ids" | tr ',' '\n' | wc -l)
if [ $rc -eq 0 ] && [ "${ids##*,}" = 2 ] && [ "$n" -lt 30 ] && echo "$ids" | grep -qx '[0-9][0-9,]*' &&
    [ -z "$(echo "$ids" | tr ',' '\n' | awk '$1 >= 512')" ]; then
    pass encode_text
else
    fail encode_text "rc $rc: $ids $(cat "$T/err")"
fi
back=$("$SM" tokenize --tokenizer "$T/tiny/tokenizer.json" --ids "$ids"); rc=$?
if [ $rc -eq 0 ] && [ "$back" = "$text" ]; then pass decode_ids; else fail decode_ids "rc $rc: '$back'"; fi
back=$("$SM" tokenize "$T/tiny" --ids "$ids" --skip-special)
if [ "$back" = 'Hello, world! The harbour is quiet.' ]; then pass decode_skip_special; else fail decode_skip_special "'$back'"; fi
if [ "$("$SM" tokenize "$T/tiny" --ids 0,1,2)" = '<|pad|><|bos|><|eos|>' ]; then pass specials_at_config_ids; else fail specials_at_config_ids; fi
printf '%s' "$text" >"$T/in.txt"
if [ "$("$SM" tokenize "$T/tiny" --text-file "$T/in.txt")" = "$ids" ] &&
    [ "$(printf '%s' "$text" | "$SM" tokenize "$T/tiny" --text-file -)" = "$ids" ]; then
    pass text_file_and_stdin
else
    fail text_file_and_stdin
fi
printf '"a\\nb"\n[%s]\n""\n[]\n' "$ids" >"$T/b.jsonl"
"$SM" tokenize "$T/tiny" --batch "$T/b.jsonl" >"$T/b.out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(sed -n 2p "$T/b.out")" = "\"$text\"" ] && [ "$(sed -n 3p "$T/b.out")" = '[]' ] &&
    [ "$(sed -n 4p "$T/b.out")" = '""' ] && [ "$(wc -l <"$T/b.out")" -eq 4 ]; then
    pass batch
else
    fail batch "rc $rc: $(head -c 300 "$T/b.out" "$T/err")"
fi
"$SM" tokenize "$T/tiny" --text-file "$T/in.txt" --stats >/dev/null 2>"$T/err"
if grep -q '^tokenize: encoded [0-9]* bytes into [0-9]* ids in [0-9.]* s: [0-9.]* MB/s ([0-9.]* s of CPU: [0-9.]* MB/s)$' "$T/err"; then pass stats; else fail stats "$(cat "$T/err")"; fi

# ---- bad input: exit 2, one line that names the problem
printf 'ab\377cd' >"$T/bad_utf8.txt"
printf '{"model": {"type": "WordPiece", "vocab": {}}}' >"$T/wp.json"
printf '"ok"\n[1, "x"]\n' >"$T/bad.jsonl"
bad_msg tok_no_tokenizer "give the tokenizer as a model directory DIR or as --tokenizer FILE (exactly one)" tokenize --text hi
bad_msg tok_two_tokenizers "give the tokenizer as a model directory DIR or as --tokenizer FILE (exactly one)" tokenize "$T/tiny" --tokenizer "$T/tiny/tokenizer.json" --text hi
bad_msg tok_two_inputs "give exactly one of --text, --text-file, --ids and --batch" tokenize "$T/tiny" --text hi --ids 1
bad_msg tok_no_input "give exactly one of --text, --text-file, --ids and --batch" tokenize "$T/tiny"
bad_msg tok_missing_dir "$T/nope/tokenizer.json: cannot open" tokenize "$T/nope" --text hi
bad_msg tok_wordpiece "$T/wp.json: model.type is 'WordPiece'; only BPE is supported" tokenize --tokenizer "$T/wp.json" --text hi
bad_msg tok_invalid_utf8 "--text-file $T/bad_utf8.txt: tokenizer: the text is not valid UTF-8 at byte offset 2" tokenize "$T/tiny" --text-file "$T/bad_utf8.txt"
bad_msg tok_unknown_id "--ids: tokenizer: id 600 (index 1) is not in the vocabulary" tokenize "$T/tiny" --ids 5,600
bad_msg tok_bad_list "--ids: entry 1 is empty in '5,,6'" tokenize "$T/tiny" --ids 5,,6
bad_msg tok_batch_line "--batch $T/bad.jsonl: line 2: entry 1 is not an integer id" tokenize "$T/tiny" --batch "$T/bad.jsonl"
bad_msg tok_skip_on_encode "--skip-special applies to decoding" tokenize "$T/tiny" --text hi --skip-special
"$SM" tokenize "$T/tiny" --text-file "$T/bad_utf8.txt" 2>"$T/e2" >/dev/null
if grep -q 'byte offset 2' "$T/e2"; then pass invalid_utf8_offset; else fail invalid_utf8_offset "$(cat "$T/e2")"; fi

# ---- token for token against the Python tokenizers package
if ! command -v python3 >/dev/null 2>&1; then
    fail tok_python "python3 not found (install it: tools/deps.txt; then $PY_HINT)"
    done_
fi
mkdir -p "$T/py"
python3 "$HERE/tok/tokcmp.py" "$SM" "$T/py" "make_model_tiny=$T/tiny/tokenizer.json" >"$T/py.out" 2>&1; rc=$?
while IFS= read -r line; do
    case "$line" in
        "PASS "*) pass "${line#PASS }" ;;
        "FAIL "*) fail "${line#FAIL }" ;;
        *) echo "$line" ;;
    esac
done <"$T/py.out"
if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$T/py.out"; then fail tok_python "exit $rc"; fi
grep -q '^PASS encode_make_model_tiny ' "$T/py.out" || fail tok_python_ran "no comparison of make-model's tokenizer"
done_
