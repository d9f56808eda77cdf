#!/bin/sh
# cli_generate.sh BUILD_DIR: the `generate` and `logits` commands end to end on a fresh tiny
# model in a temp dir: speculative == plain output, the .npy file of logits, and bad inputs
# (each must exit 2 with exactly one line on stderr, naming the problem).  Prints PASS/FAIL
# lines and a DONE line.
NAME=cli_generate
. "$(dirname "$0")/lib_cli.sh"

if ! "$SM" make-model --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi
pass make_model

PROMPT=5,6,7,8,5,6,7,8,5,6
"$SM" generate --model "$T/tiny" --prompt-ids $PROMPT --max-tokens 12 --threads 2 >"$T/spec.out" 2>"$T/spec.err"; rc1=$?
"$SM" generate --model "$T/tiny" --prompt-ids $PROMPT --max-tokens 12 --threads 2 --no-spec >"$T/plain.out" 2>"$T/plain.err"; rc2=$?
"$SM" generate --model "$T/tiny" --prompt-ids $PROMPT --max-tokens 12 --threads 2 --request-rows 4 >"$T/r4.out" 2>"$T/r4.err"; rc3=$?
a=$(grep '^ids: ' "$T/spec.out"); b=$(grep '^ids: ' "$T/plain.out"); c=$(grep '^ids: ' "$T/r4.out")
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; then
    pass generate_spec_equals_plain
else
    cat "$T/spec.out" "$T/spec.err" "$T/plain.out" "$T/plain.err" "$T/r4.out" "$T/r4.err"; fail generate_spec_equals_plain
fi
if grep -q '^accept:' "$T/spec.out" && grep -q '^tokens/s: ' "$T/spec.out" && [ "$(wc -l <"$T/spec.out")" -eq 3 ]; then
    pass generate_output_lines
else
    cat "$T/spec.out"; fail generate_output_lines
fi

# logits: [T, V] f32 after a 128-byte .npy header (tiny: V = 512); T = 3
if "$SM" logits --model "$T/tiny" --prompt-ids 5,6,7 --out "$T/l.npy" --threads 2 >"$T/l.out" 2>"$T/l.err" &&
   [ -f "$T/l.npy" ] && [ "$(wc -c <"$T/l.npy")" -eq $((128 + 3 * 512 * 4)) ] &&
   head -c 8 "$T/l.npy" | od -An -c | grep -q 'N   U   M   P   Y' &&
   ! ls "$T"/l.npy.tmp* >/dev/null 2>&1; then
    pass logits_npy
else
    cat "$T/l.out" "$T/l.err"; ls -l "$T"; fail logits_npy
fi

# logit processors (src/engine/logitproc.c): speculative == plain, greedy and sampled; they change the output
for f in "--repetition-penalty 0.5" "--presence-penalty -1.5 --frequency-penalty 0.5" "--min-tokens 8 --ignore-eos --temperature 0.9 --seed 3"; do
    n=$(echo "$f" | tr -d ' -.' | cut -c1-24)
    "$SM" generate --model "$T/tiny" --prompt-ids $PROMPT --max-tokens 16 --threads 2 $f >"$T/p8.out" 2>&1; rc1=$?
    "$SM" generate --model "$T/tiny" --prompt-ids $PROMPT --max-tokens 16 --threads 2 --no-spec $f >"$T/p1.out" 2>&1; rc2=$?
    a=$(grep '^ids: ' "$T/p8.out"); b=$(grep '^ids: ' "$T/p1.out")
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then pass "proc_spec_equals_plain_$n"
    else cat "$T/p8.out" "$T/p1.out"; fail "proc_spec_equals_plain_$n"; fi
done
"$SM" generate --model "$T/tiny" --prompt-ids $PROMPT --max-tokens 12 --threads 2 --repetition-penalty 0.5 >"$T/rp.out" 2>&1
if [ "$(grep '^ids: ' "$T/rp.out")" != "$(grep '^ids: ' "$T/spec.out")" ]; then pass proc_changes_output
else cat "$T/rp.out"; fail proc_changes_output; fi

# bad inputs: exit 2, one line on stderr naming the problem
bad_msg bad_id_out_of_range "--prompt-ids: token index 1 is 512, outside the vocabulary [0, 512)" generate --model "$T/tiny" --prompt-ids 1,512,3 --max-tokens 4
bad_msg bad_id_negative "--prompt-ids: token index 1 is -1, outside the vocabulary" generate --model "$T/tiny" --prompt-ids 1,-1 --max-tokens 4
bad_msg bad_too_long "prompt length 3 + max tokens 100 exceeds the max model length 64" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 100 --max-len 64
bad_msg bad_missing_dir "generate: model dir '$T/no-such-model' does not exist" generate --model "$T/no-such-model" --prompt-ids 1,2,3 --max-tokens 4
bad_msg bad_unknown_flag "unknown option '--bogus'" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --bogus
bad_msg bad_rows_zero "--request-rows '0' is not an integer in [1, 256]" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --request-rows 0
bad_msg bad_rows_text "--request-rows 'eight' is not an integer" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --request-rows eight
bad_msg bad_rows_and_nospec "give --request-rows or --no-spec, not both" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --request-rows 4 --no-spec
bad_msg bad_prompt_list "--prompt-ids: entry 1 is empty in '1,,3'" generate --model "$T/tiny" --prompt-ids 1,,3 --max-tokens 4
bad_msg bad_no_max_tokens "--max-tokens N is required" generate --model "$T/tiny" --prompt-ids 1,2,3
bad_msg bad_backend "--backend 'tpu' is not one of cpu|cuda" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --backend tpu
bad_msg bad_logits_no_out "logits: --out FILE.npy is required" logits --model "$T/tiny" --prompt-ids 1,2,3
bad_msg bad_logits_missing_dir "logits: model dir '$T/no-such-model' does not exist" logits --model "$T/no-such-model" --prompt-ids 1,2 --out "$T/x.npy"
bad_msg bad_logits_out_dir "$T/no/such/dir/x.npy: cannot create a temporary file" logits --model "$T/tiny" --prompt-ids 1,2 --out "$T/no/such/dir/x.npy"
bad_msg bad_presence "--presence-penalty 3 is not a number in [-2, 2]" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --presence-penalty 3
bad_msg bad_repetition "--repetition-penalty 0 is not a number in [1e-06, 1e+06]" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --repetition-penalty 0
bad_msg bad_min_tokens "--min-tokens '-1' is not an integer" generate --model "$T/tiny" --prompt-ids 1,2,3 --max-tokens 4 --min-tokens -1
done_
