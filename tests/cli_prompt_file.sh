#!/bin/sh
# cli_prompt_file.sh BUILD_DIR: `generate` / `logits` --prompt-file FILE (ids separated by
# whitespace and/or commas; - = stdin): same result as --prompt-ids, exactly one of the two,
# and errors naming the file, token index and line of a bad word, on a 100k-id file too (far
# beyond what one command-line argument may hold).  Prints PASS/FAIL lines and a DONE line.
NAME=cli_prompt
. "$(dirname "$0")/lib_cli.sh"

if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi

# same ids three ways: --prompt-ids, a file with mixed separators, stdin
printf '5 6,7\n\t8 ,9,\n 5, 6\n' >"$T/p.txt"
G="generate --model $T/tiny --max-tokens 8 --threads 2"
"$SM" $G --prompt-ids 5,6,7,8,9,5,6 >"$T/a.out" 2>&1; r1=$?
"$SM" $G --prompt-file "$T/p.txt" >"$T/b.out" 2>&1; r2=$?
"$SM" $G --prompt-file - <"$T/p.txt" >"$T/c.out" 2>&1; r3=$?
a=$(grep '^ids:' "$T/a.out"); b=$(grep '^ids:' "$T/b.out"); c=$(grep '^ids:' "$T/c.out")
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; then
    pass generate_prompt_file
else
    fail generate_prompt_file "$(cat "$T/a.out" "$T/b.out" "$T/c.out" | head -c 400)"
fi
if "$SM" logits --model "$T/tiny" --prompt-ids 5,6,7,8,9,5,6 --out "$T/a.npy" >/dev/null 2>&1 &&
    "$SM" logits --model "$T/tiny" --prompt-file "$T/p.txt" --out "$T/b.npy" >/dev/null 2>&1 &&
    cmp -s "$T/a.npy" "$T/b.npy"; then
    pass logits_prompt_file
else
    fail logits_prompt_file
fi

# exactly one of --prompt-ids and --prompt-file
bad_msg both_prompts "give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE" generate --model "$T/tiny" --max-tokens 2 --prompt-ids 1,2 --prompt-file "$T/p.txt"
bad_msg no_prompt "generate: give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE" generate --model "$T/tiny" --max-tokens 2
bad_msg no_prompt_logits "logits: give exactly one of --prompt TEXT, --prompt-ids LIST and --prompt-file FILE" logits --model "$T/tiny" --out "$T/x.npy"

# badly formed files: one line naming the file and the token index
printf '1 2 x3 4\n' >"$T/word.txt"
bad_msg bad_word "--prompt-file $T/word.txt: token index 2 (line 1): 'x3' is not an integer id" generate --model "$T/tiny" --max-tokens 2 --prompt-file "$T/word.txt"
printf '1\n2\n\n3,,4\n' >"$T/commas.txt"
bad_msg bad_commas "--prompt-file $T/commas.txt: token index 3 (line 4): empty entry" generate --model "$T/tiny" --max-tokens 2 --prompt-file "$T/commas.txt"
printf ',1 2' >"$T/lead.txt"
bad_msg bad_leading_comma "--prompt-file $T/lead.txt: token index 0 (line 1): empty entry" generate --model "$T/tiny" --max-tokens 2 --prompt-file "$T/lead.txt"
printf '1 2,' >"$T/trail.txt"
bad_msg bad_trailing_comma "--prompt-file $T/trail.txt: ends with a comma after token index 1" generate --model "$T/tiny" --max-tokens 2 --prompt-file "$T/trail.txt"
: >"$T/empty.txt"
bad_msg bad_empty "--prompt-file $T/empty.txt: no token ids" generate --model "$T/tiny" --max-tokens 2 --prompt-file "$T/empty.txt"
bad_msg bad_missing "--prompt-file $T/nope.txt: cannot open" generate --model "$T/tiny" --max-tokens 2 --prompt-file "$T/nope.txt"
printf '1 2 512\n' >"$T/range.txt"
bad_msg bad_range "--prompt-file $T/range.txt: token index 2 is 512, outside the vocabulary" logits --model "$T/tiny" --out "$T/x.npy" --prompt-file "$T/range.txt"
printf '1 -3\n' >"$T/neg.txt"
bad_msg bad_stdin_negative "--prompt-file - (stdin): token index 1 is -3, outside the vocabulary" generate --model "$T/tiny" --max-tokens 2 --prompt-file - <"$T/neg.txt"

# 100000 ids (about 500 kB: more than one argument may hold, 128 kB on Linux)
awk 'BEGIN { for (i = 0; i < 100000; i++) printf "%d%s", (i * 7) % 500 + 3, (i % 20 == 19) ? "\n" : ", " }' >"$T/big.txt"
sz=$(wc -c <"$T/big.txt")
echo "  100000 ids: $sz bytes"
bad_msg big_read_whole "prompt length 100000 + max tokens 4 exceeds the max model length 64" generate --model "$T/tiny" --max-tokens 4 --max-len 64 --prompt-file "$T/big.txt"
{ cat "$T/big.txt"; printf ' 7q\n'; } >"$T/bigbad.txt"
bad_msg big_bad_last_word "--prompt-file $T/bigbad.txt: token index 100000 (line 5001): '7q' is not an integer id" generate --model "$T/tiny" --max-tokens 4 --prompt-file "$T/bigbad.txt"
{ cat "$T/big.txt"; printf ' 600\n'; } >"$T/bigrange.txt"
bad_msg big_bad_last_id "--prompt-file $T/bigrange.txt: token index 100000 is 600, outside the vocabulary" generate --model "$T/tiny" --max-tokens 4 --prompt-file "$T/bigrange.txt"
done_
