#!/bin/sh
# cli_prompt_text.sh BUILD_DIR: `generate --prompt TEXT` on a fresh tiny model: the text is
# encoded with the model directory's tokenizer.json exactly as `sparkmono tokenize` encodes it
# (the same generated ids as --prompt-ids of those ids), the output's "text:" line is its ids
# decoded without special tokens (a JSON string); `logits --prompt TEXT` writes the same file
# as --prompt-ids of those ids; and the refusals of both commands (no tokenizer.json, a broken
# one, --prompt with --prompt-ids or --prompt-file, a text that encodes to nothing) are one
# line, exit 2.
# Prints PASS/FAIL lines and a DONE line.
NAME=cli_prompt_text
. "$(dirname "$0")/lib_cli.sh"

if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 3 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi
TEXT="The quick brown fox, 42 times: jumps!"
ids=$("$SM" tokenize "$T/tiny" --text "$TEXT" 2>"$T/tok.err") || { cat "$T/tok.err"; fail tokenize; done_; }
"$SM" generate --model "$T/tiny" --prompt "$TEXT" --max-tokens 12 >"$T/text.out" 2>"$T/text.err"
rc1=$?
"$SM" generate --model "$T/tiny" --prompt-ids "$ids" --max-tokens 12 >"$T/ids.out" 2>"$T/ids.err"
rc2=$?
if [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && [ "$(grep '^ids:' "$T/text.out")" = "$(grep '^ids:' "$T/ids.out")" ]; then
    pass prompt_text_equals_its_ids
else
    cat "$T/text.err" "$T/ids.err"; fail prompt_text_equals_its_ids
fi
out_ids=$(sed -n 's/^ids: //p' "$T/text.out")
"$SM" tokenize "$T/tiny" --ids "$out_ids" --skip-special >"$T/want.txt" 2>/dev/null
sed -n 's/^text: //p' "$T/text.out" >"$T/got.json"
# the text line is a JSON string; tokenize prints the raw text and a newline
if python3 -c 'import json, sys; g = json.load(open(sys.argv[1])); w = open(sys.argv[2], encoding="utf-8").read(); sys.exit(0 if g + "\n" == w else 1)' \
    "$T/got.json" "$T/want.txt"; then pass output_text_is_decoded_ids; else fail output_text_is_decoded_ids; fi

mkdir -p "$T/notok" && cp "$T/tiny"/*.json "$T/tiny"/*.safetensors "$T/notok/" 2>/dev/null && rm -f "$T/notok/tokenizer.json"
bad_msg no_tokenizer "--prompt TEXT needs the model's tokenizer, $T/notok/tokenizer.json, which does not exist" generate --model "$T/notok" --prompt "hi" --max-tokens 2
bad_msg prompt_and_ids "give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE" generate --model "$T/tiny" --prompt "hi" --prompt-ids 1 --max-tokens 2
bad_msg empty_text "--prompt: the text encodes to no tokens" generate --model "$T/tiny" --prompt "" --max-tokens 2

# ---- logits --prompt TEXT: the same code path as generate's
if "$SM" logits --model "$T/tiny" --prompt "$TEXT" --out "$T/lt.npy" >"$T/lt.out" 2>"$T/lt.err" &&
    "$SM" logits --model "$T/tiny" --prompt-ids "$ids" --out "$T/li.npy" >"$T/li.out" 2>"$T/li.err" &&
    cmp -s "$T/lt.npy" "$T/li.npy" && grep -q "f32 \[$(echo "$ids" | tr ',' '\n' | grep -c .), " "$T/lt.out"; then
    pass logits_prompt_text_equals_its_ids
else
    cat "$T/lt.err" "$T/li.err"; fail logits_prompt_text_equals_its_ids
fi
bad_msg logits_no_tokenizer "logits: --prompt TEXT needs the model's tokenizer, $T/notok/tokenizer.json, which does not exist" logits --model "$T/notok" --prompt "hi" --out "$T/x.npy"
bad_msg logits_prompt_and_ids "logits: give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE" logits --model "$T/tiny" --prompt "hi" --prompt-ids 1 --out "$T/x.npy"
printf '1 2' >"$T/p.txt"
bad_msg logits_prompt_and_file "logits: give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE" logits --model "$T/tiny" --prompt "hi" --prompt-file "$T/p.txt" --out "$T/x.npy"
bad_msg logits_empty_text "logits: --prompt: the text encodes to no tokens" logits --model "$T/tiny" --prompt "" --out "$T/x.npy"
mkdir -p "$T/badtok" && cp "$T/tiny"/config.json "$T/tiny"/*.safetensors "$T/badtok/" && printf '{"model": 1}' >"$T/badtok/tokenizer.json"
bad_msg logits_broken_tokenizer "logits: --prompt: $T/badtok/tokenizer.json:" logits --model "$T/badtok" --prompt "hi" --out "$T/x.npy"
if [ -e "$T/x.npy" ]; then fail logits_refusals_write_nothing "$T/x.npy exists"; else pass logits_refusals_write_nothing; fi
done_
