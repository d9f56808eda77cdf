#!/bin/sh
# cli_batch.sh BUILD_DIR: `generate --batch FILE.jsonl` end to end on fresh tiny models: with
# continuous batching (fewer slots than requests, so requests join and leave between steps)
# every result equals `generate` run on that request alone (greedy and sampled, flags as the
# defaults of lines that leave keys out), results come in input order with their stats, --out
# writes the same lines, --no-spec gives the same ids, a sampled batch on the cycle model
# accepts drafts, text prompts are encoded with the model's tokenizer.json and every result's
# text is its ids decoded (as `sparkmono tokenize` decodes them); bad lines and files are
# refused with one line naming file:line, exit 2.
# Prints PASS/FAIL lines and a DONE line.
NAME=cli_batch
. "$(dirname "$0")/lib_cli.sh"

if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1 ||
    ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --cycle 16 --out "$T/cyc" >"$T/mm2.out" 2>&1; then
    cat "$T/mm.out" "$T/mm2.out"; fail make_models; done_
fi
pass make_models

# requests: greedy, sampled (defaults from the flags below: --temperature 0.9 --seed 5 when a
# line leaves them out), one that ends in an eos id (id 400 repeated, seed-1 tiny model), a
# one-token request, a long one
E400=$(awk 'BEGIN { for (i = 0; i < 24; i++) printf "%s400", i ? "," : "" }')
cat >"$T/b.jsonl" <<EOF
{"ids": [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], "max_tokens": 12, "temperature": 0}
{"ids": [3, 4, 5, 6], "max_tokens": 20, "temperature": 1.0, "seed": 7}
{"ids": [100, 200], "max_tokens": 9, "top_k": 5, "top_p": 0.9, "seed": 3}

{"ids": [$E400], "max_tokens": 16, "temperature": 0}
{"ids": [9], "max_tokens": 1, "temperature": 0.5, "seed": 11}
{"ids": [11, 12, 13], "max_tokens": 40, "temperature": 1.3, "top_p": 0.8}
{"ids": [42, 43], "max_tokens": 7}
{"prompt": "The cat sat on the mat.", "max_tokens": 8, "seed": 21}
EOF
TEXT_IDS=$("$SM" tokenize "$T/tiny" --text "The cat sat on the mat.")
# the same requests as `generate` flags (one line each, in order)
cat >"$T/alone.txt" <<EOF
--prompt-ids 5,6,7,8,5,6,7,8,5,6 --max-tokens 12 --temperature 0
--prompt-ids 3,4,5,6 --max-tokens 20 --temperature 1.0 --seed 7
--prompt-ids 100,200 --max-tokens 9 --temperature 0.9 --top-k 5 --top-p 0.9 --seed 3
--prompt-ids $E400 --max-tokens 16 --temperature 0
--prompt-ids 9 --max-tokens 1 --temperature 0.5 --seed 11
--prompt-ids 11,12,13 --max-tokens 40 --temperature 1.3 --top-p 0.8 --seed 5
--prompt-ids 42,43 --max-tokens 7 --temperature 0.9 --seed 5
--prompt-ids $TEXT_IDS --max-tokens 8 --temperature 0.9 --seed 21
EOF
NREQ=8
G="generate --model $T/tiny --threads 2"
"$SM" $G --batch "$T/b.jsonl" --max-requests 3 --temperature 0.9 --seed 5 >"$T/r.jsonl" 2>"$T/r.err"; rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$T/r.jsonl")" -eq $NREQ ] && grep -q "^generate --batch: $NREQ requests, [0-9]* tokens in .* tokens/s" "$T/r.err" &&
    [ -n "$TEXT_IDS" ]; then
    pass batch_runs; echo "  $(tail -n 1 "$T/r.err")"
else
    fail batch_runs "rc $rc: $(head -c 300 "$T/r.err")"
fi

# input order, one object a line with every field
i=0; bad=
while IFS= read -r l; do
    printf "%s\n" "$l" | grep -q "^{\"index\":$i,\"ids\":\[[0-9,]*\],\"text\":\".*\",\"prompt_tokens\":[0-9]*,\"completion_tokens\":[0-9]*,\"steps\":[0-9]*,\"accepted\":[0-9]*,\"finish_reason\":\"\(stop\|length\)\"}\$" || bad="$bad $i"
    i=$((i + 1))
done <"$T/r.jsonl"
if [ -z "$bad" ] && [ $i -eq $NREQ ]; then pass batch_order_and_fields; else fail batch_order_and_fields "lines:$bad"; fi

# every result == the request alone
i=0; bad=
while IFS= read -r flags; do
    i=$((i + 1))
    a=$("$SM" $G $flags 2>&1 | sed -n 's/^ids: //p')
    b=$(sed -n "${i}p" "$T/r.jsonl" | sed -n 's/.*"ids":\[\([^]]*\)\].*/\1/p')
    [ -n "$a" ] && [ "$a" = "$b" ] || bad="$bad $i($a|$b)"
done <"$T/alone.txt"
if [ -z "$bad" ]; then pass batch_equals_alone; else fail batch_equals_alone "$bad"; fi

# text: the ids decoded without special tokens; the text prompt's prompt_tokens are its ids
sed 's/.*"ids":\(\[[^]]*\]\).*/\1/' "$T/r.jsonl" >"$T/ids.jsonl"
"$SM" tokenize "$T/tiny" --batch "$T/ids.jsonl" --skip-special >"$T/texts.want" 2>"$T/texts.err"
sed 's/.*"text":\(".*"\),"prompt_tokens".*/\1/' "$T/r.jsonl" >"$T/texts.got"
ntext=$(echo "$TEXT_IDS" | tr ',' '\n' | wc -l)
if [ -s "$T/texts.want" ] && cmp -s "$T/texts.want" "$T/texts.got" &&
    sed -n "${NREQ}p" "$T/r.jsonl" | grep -q "\"prompt_tokens\":$ntext,\"completion_tokens\":8,"; then
    pass batch_text
else
    fail batch_text "$(diff "$T/texts.want" "$T/texts.got" | head -c 300; head -c 200 "$T/texts.err")"
fi

# stats: the eos request stops early ("stop"), the others run to max_tokens ("length")
l4=$(sed -n 4p "$T/r.jsonl"); l6=$(sed -n 6p "$T/r.jsonl"); l5=$(sed -n 5p "$T/r.jsonl")
if printf "%s\n" "$l4" | grep -q '"finish_reason":"stop"' && ! printf "%s\n" "$l4" | grep -q '"completion_tokens":16,' &&
    printf "%s\n" "$l6" | grep -q '"prompt_tokens":3,"completion_tokens":40,.*"finish_reason":"length"' &&
    printf "%s\n" "$l5" | grep -q '"completion_tokens":1,"steps":0,'; then
    pass batch_stats
else
    fail batch_stats "$l4 / $l5 / $l6"
fi

# --out: the same lines, through a file; one slot, so requests run one after another
"$SM" $G --batch "$T/b.jsonl" --max-requests 1 --temperature 0.9 --seed 5 --out "$T/o.jsonl" >"$T/o.stdout" 2>"$T/o.err"; rc=$?
if [ $rc -eq 0 ] && [ ! -s "$T/o.stdout" ] && cmp -s "$T/o.jsonl" "$T/r.jsonl" && ! ls "$T"/o.jsonl.tmp* >/dev/null 2>&1; then
    pass batch_out_file
else
    fail batch_out_file "rc $rc: $(head -c 300 "$T/o.err")"
fi

# --no-spec: the same ids (greedy and sampled), one token a step
"$SM" $G --batch "$T/b.jsonl" --max-requests 4 --temperature 0.9 --seed 5 --no-spec >"$T/p.jsonl" 2>/dev/null
ids() { sed -n 's/.*"ids":\[\([^]]*\)\].*/\1/p' "$1"; }
if [ "$(ids "$T/p.jsonl")" = "$(ids "$T/r.jsonl")" ] && ! grep -q '"accepted":[1-9]' "$T/p.jsonl"; then
    pass batch_nospec_same_ids
else
    fail batch_nospec_same_ids
fi

# sampled requests on the cycle model accept n-gram drafts, and equal their runs alone
awk 'BEGIN { for (s = 1; s <= 12; s++) printf "{\"ids\": [3, 4, 5, 6, 7, 8, 3, 4], \"max_tokens\": %d, \"seed\": %d}\n", 20 + s, s }' >"$T/c.jsonl"
"$SM" generate --model "$T/cyc" --threads 2 --batch "$T/c.jsonl" --max-requests 5 --temperature 2 --top-k 4 >"$T/c.out" 2>/dev/null
acc=$(sed -n 's/.*"accepted":\([0-9]*\).*/\1/p' "$T/c.out" | awk '{ s += $1 } END { print s + 0 }')
a=$("$SM" generate --model "$T/cyc" --threads 2 --prompt-ids 3,4,5,6,7,8,3,4 --max-tokens 27 --seed 7 --temperature 2 --top-k 4 |
    sed -n 's/^ids: //p')
b=$(sed -n 7p "$T/c.out" | sed -n 's/.*"ids":\[\([^]]*\)\].*/\1/p')
if [ "$(wc -l <"$T/c.out")" -eq 12 ] && [ "$acc" -ge 30 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then
    pass batch_sampled_speculation; echo "  12 sampled requests on the cycle model: $acc drafts accepted"
else
    fail batch_sampled_speculation "accepted $acc; $a | $b"
fi

# logit-processor keys (the server's fields): each line equals `generate` with the same flags
cat >"$T/pp.jsonl" <<EOF
{"ids": [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], "max_tokens": 12, "repetition_penalty": 0.5, "min_tokens": 3}
{"ids": [3, 4, 5, 6], "max_tokens": 10, "temperature": 0.8, "seed": 9, "presence_penalty": -1.5, "frequency_penalty": 0.5}
EOF
"$SM" $G --batch "$T/pp.jsonl" --max-requests 2 >"$T/pp.out" 2>"$T/pp.err"; rc=$?
p1=$("$SM" $G --prompt-ids 5,6,7,8,5,6,7,8,5,6 --max-tokens 12 --repetition-penalty 0.5 --min-tokens 3 | grep '^ids: ' | cut -c6-)
p2=$("$SM" $G --prompt-ids 3,4,5,6 --max-tokens 10 --temperature 0.8 --seed 9 --presence-penalty -1.5 --frequency-penalty 0.5 | grep '^ids: ' | cut -c6-)
q1=$(sed -n 1p "$T/pp.out" | sed -n 's/.*"ids":\[\([^]]*\)\].*/\1/p')
q2=$(sed -n 2p "$T/pp.out" | sed -n 's/.*"ids":\[\([^]]*\)\].*/\1/p')
if [ $rc -eq 0 ] && [ -n "$p1" ] && [ "$p1" = "$q1" ] && [ "$p2" = "$q2" ]; then
    pass batch_processors_equal_generate
else
    fail batch_processors_equal_generate "rc $rc: $q1 / $q2 vs $p1 / $p2"
fi

# bad input: one line naming the file and line, exit 2
badline() { # name, expected text, file content, extra flags
    printf '%s\n' "$3" >"$T/bad.jsonl"
    "$SM" $G --batch "$T/bad.jsonl" $4 >"$T/bad.out" 2>"$T/bad.err"; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$T/bad.err")" -eq 1 ] && grep -q "$T/bad.jsonl:[0-9]*: .*$2" "$T/bad.err" && [ ! -s "$T/bad.out" ]; then
        pass "$1"; echo "  $(cat "$T/bad.err")"
    else
        fail "$1" "rc $rc: $(head -c 300 "$T/bad.err")"
    fi
}
badline bad_json 'malformed JSON' '{"ids": [1, 2], "max_tokens": 3}
{"ids": [1, 2], "max_tokens": 3'
if grep -q 'bad.jsonl:2: ' "$T/bad.err"; then pass bad_json_names_line_2; else fail bad_json_names_line_2 "$(cat "$T/bad.err")"; fi
badline bad_not_object 'JSON object' '[1, 2, 3]'
badline bad_unknown_key 'unknown key "temp"' '{"ids": [1, 2], "max_tokens": 3, "temp": 1}'
badline bad_no_max_tokens 'max_tokens' '{"ids": [1, 2]}'
badline bad_presence "'presence_penalty' is 3; it must be in .-2, 2." '{"ids": [1, 2], "max_tokens": 3, "presence_penalty": 3}'
badline bad_id_range 'outside the vocabulary' '{"ids": [1, 512], "max_tokens": 3}'
badline bad_ids_type '"ids"' '{"ids": "1,2", "max_tokens": 3}'
badline bad_both_prompts 'exactly one of' '{"ids": [1], "prompt": "hi", "max_tokens": 3}'
badline bad_temperature 'temperature' '{"ids": [1, 2], "max_tokens": 3, "temperature": -0.5}'
badline bad_top_p 'top_p' '{"ids": [1, 2], "max_tokens": 3, "top_p": 1.5}'
badline bad_top_k 'top_k' '{"ids": [1, 2], "max_tokens": 3, "top_k": 2.5}'
badline bad_max_tokens 'max_tokens' '{"ids": [1, 2], "max_tokens": 0}'
badline bad_duplicate_key 'duplicate' '{"ids": [1, 2], "max_tokens": 3, "max_tokens": 4}'
badline bad_too_long 'exceeds --max-len 16' '{"ids": [1, 2, 3], "max_tokens": 20}' '--max-len 16'
rm -f "$T/cyc/tokenizer.json"
printf '%s\n' '{"prompt": "hello", "max_tokens": 3}' >"$T/bad.jsonl"
"$SM" generate --model "$T/cyc" --batch "$T/bad.jsonl" >"$T/bad.out" 2>"$T/bad.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/bad.err")" -eq 1 ] && grep -q "bad.jsonl:1: a text prompt needs .*tokenizer.json" "$T/bad.err"; then
    pass bad_text_without_tokenizer; echo "  $(cat "$T/bad.err")"
else
    fail bad_text_without_tokenizer "rc $rc: $(head -c 300 "$T/bad.err")"
fi
printf '\n  \n' >"$T/empty.jsonl"
bad_msg bad_no_requests "$T/empty.jsonl: no requests" $G --batch "$T/empty.jsonl"
bad_msg bad_missing_file "--batch $T/no-such.jsonl: cannot open" $G --batch "$T/no-such.jsonl"
bad_msg bad_batch_and_prompt "--batch FILE holds the prompts: no --prompt / --prompt-ids" $G --batch "$T/b.jsonl" --prompt-ids 1,2
bad_msg bad_batch_and_text "--batch FILE holds the prompts: no --prompt / --prompt-ids" $G --batch "$T/b.jsonl" --prompt hello
bad_msg bad_out_without_batch "--max-requests and --out go with --batch FILE" $G --prompt-ids 1,2 --max-tokens 3 --out "$T/x.jsonl"
bad_msg bad_out_dir "--out: $T/no/such/dir/x.jsonl: cannot create a temporary file" $G --batch "$T/b.jsonl" --out "$T/no/such/dir/x.jsonl"
bad_msg bad_max_requests "--max-requests '0' is not an integer in [1, 65536]" $G --batch "$T/b.jsonl" --max-requests 0
bad_msg bad_flag_temperature "--temperature warm is not a number" $G --prompt-ids 1,2 --max-tokens 3 --temperature warm
bad_msg bad_flag_top_p "--top-p 1.01 is not a number in [0, 1]" $G --prompt-ids 1,2 --max-tokens 3 --top-p 1.01
bad_msg bad_flag_seed "--seed '-4' is not an integer in [0," $G --prompt-ids 1,2 --max-tokens 3 --seed -4
done_
