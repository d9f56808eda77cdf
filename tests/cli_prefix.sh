#!/bin/sh
# cli_prefix.sh BUILD_DIR: the prefix cache on the command line (README "Prefix caching").
# `--no-prefix-cache` is listed by the help of generate and serve and is a switch; generate
# gives the same ids with it and without, for one prompt and for a --batch of requests that
# share a prompt prefix of 5 whole pages (one request at a time, so each later one finds the
# first one's pages cached), greedy and sampled; --batch's summary line counts the prompt
# tokens computed and those the cache served: with the cache, every shared page of the 3 later
# requests (and only their own tails computed); without it, "prefix cache off" and every prompt
# token computed.  The counts (batch_counts_cached) need the engine's prefix cache
# (src/engine/engine.c).  Prints PASS/FAIL lines and a DONE line.
NAME=cli_prefix
. "$(dirname "$0")/lib_cli.sh"

for c in generate serve; do
    if "$SM" $c --help | grep -q '^  --no-prefix-cache  '; then pass "help_${c}_lists_it"; else fail "help_${c}_lists_it"; fi
done
if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi
G="generate --model $T/tiny --threads 2"
bad_msg switch_takes_no_value "option '--no-prefix-cache' is a switch and takes no value" $G --prompt-ids 1,2 --max-tokens 2 --no-prefix-cache=1
bad_msg serve_switch_takes_no_value "option '--no-prefix-cache' is a switch and takes no value" serve "$T/tiny" --no-prefix-cache=0

# one prompt of 3 pages and a bit: the same ids either way (spec and plain)
P=$(awk 'BEGIN { for (i = 0; i < 53; i++) printf "%s%d", i ? "," : "", (11 * i + 7) % 497 + 3 }')
for f in "" "--no-spec" "--temperature 0.8 --seed 4"; do
    n=$(echo "single $f" | tr -d ' -.' | cut -c1-24)
    "$SM" $G --prompt-ids "$P" --max-tokens 10 $f >"$T/on.out" 2>&1; rc1=$?
    "$SM" $G --prompt-ids "$P" --max-tokens 10 $f --no-prefix-cache >"$T/off.out" 2>&1; rc2=$?
    a=$(grep '^ids: ' "$T/on.out"); b=$(grep '^ids: ' "$T/off.out")
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then pass "${n}_same_ids"
    else cat "$T/on.out" "$T/off.out"; fail "${n}_same_ids"; fi
done

# --batch: 4 requests sharing an 80-token prefix (5 pages), each with a tail of its own
PRE=$(awk 'BEGIN { for (i = 0; i < 80; i++) printf "%s%d", i ? ", " : "", (13 * i + 5) % 497 + 3 }')
cat >"$T/b.jsonl" <<EOF
{"ids": [$PRE, 11, 12, 13], "max_tokens": 8, "temperature": 0}
{"ids": [$PRE, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], "max_tokens": 8, "temperature": 0}
{"ids": [$PRE, 31], "max_tokens": 8, "temperature": 0.9, "seed": 3}
{"ids": [$PRE, 41, 42, 43, 44, 45], "max_tokens": 8}
EOF
PROMPT_TOKENS=$((4 * 80 + 3 + 10 + 1 + 5))
"$SM" $G --batch "$T/b.jsonl" --max-requests 1 --temperature 0.7 --seed 9 >"$T/on.jsonl" 2>"$T/on.err"; rc1=$?
"$SM" $G --batch "$T/b.jsonl" --max-requests 1 --temperature 0.7 --seed 9 --no-prefix-cache >"$T/off.jsonl" 2>"$T/off.err"; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(wc -l <"$T/on.jsonl")" -eq 4 ] && cmp -s "$T/on.jsonl" "$T/off.jsonl"; then
    pass batch_same_results
else
    fail batch_same_results "rc $rc1/$rc2: $(head -c 300 "$T/on.err" "$T/off.err")"; diff "$T/on.jsonl" "$T/off.jsonl"
fi
# every request in the batch equals the same request alone, with the cache off
i=0; bad=
while IFS= read -r l; do
    ids=$(printf '%s\n' "$l" | sed -n 's/.*"ids": \[\([^]]*\)\].*/\1/p' | tr -d ' ')
    extra="--temperature 0"
    case $i in 2) extra="--temperature 0.9 --seed 3" ;; 3) extra="--temperature 0.7 --seed 9" ;; esac
    want=$("$SM" $G --prompt-ids "$ids" --max-tokens 8 $extra --no-prefix-cache | sed -n 's/^ids: //p')
    got=$(sed -n "$((i + 1))p" "$T/on.jsonl" | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p')
    [ -n "$want" ] && [ "$want" = "$got" ] || bad="$bad $i"
    i=$((i + 1))
done <"$T/b.jsonl"
if [ -z "$bad" ] && [ $i -eq 4 ]; then pass batch_equals_alone_uncached; else fail batch_equals_alone_uncached "requests:$bad"; fi
off=$(grep '^generate --batch: ' "$T/off.err")
if echo "$off" | grep -q "; $PROMPT_TOKENS prompt tokens computed, prefix cache off)\$"; then
    pass batch_counts_uncached
else
    fail batch_counts_uncached "$off"
fi
# the cache on: the 3 later requests find the 5 shared pages (hits a multiple of 16, >= 240),
# and only the rest is computed
on=$(grep '^generate --batch: ' "$T/on.err")
comp=$(echo "$on" | sed -n 's/.*; \([0-9]*\) prompt tokens computed, \([0-9]*\) from the prefix cache)$/\1/p')
hits=$(echo "$on" | sed -n 's/.*; \([0-9]*\) prompt tokens computed, \([0-9]*\) from the prefix cache)$/\2/p')
if [ -n "$hits" ] && [ "$hits" -ge $((3 * 80)) ] && [ $((hits % 16)) -eq 0 ] && [ $((comp + hits)) -eq $PROMPT_TOKENS ]; then
    pass batch_counts_cached; echo "  $on"
else
    fail batch_counts_cached "$on"
fi
done_
