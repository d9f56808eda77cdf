#!/bin/sh
# cli_cycle.sh BUILD_DIR: `make-model --cycle N`, the model of the demo.  The cycle model is a
# valid checkpoint for the strict loader, is the same bytes for the same options and differs
# across seeds, and greedy decoding walks its cycle (from a cycle prompt at once, from other
# ids after a token or two), speculative == plain, with most drafts accepted (the demo built on
# it, tools/demo.sh, runs in tests/cli_readme.sh).  Prints PASS/FAIL lines and a DONE line.
NAME=cli_cycle
. "$(dirname "$0")/lib_cli.sh"

mk() { # dir, options...
    d=$1; shift
    "$SM" make-model --quiet --preset tiny --experts mxfp4 "$@" --out "$T/$d" >"$T/$d.out" 2>"$T/$d.err"
}
if mk c1 --seed 1 --cycle 16 && grep -qx 'cycle of 16 ids: 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -> back to 3' "$T/c1.out" &&
    "$SM" check --model "$T/c1" >"$T/chk" 2>&1; then
    pass cycle_model_valid
else
    fail cycle_model_valid "$(cat "$T/c1.out" "$T/c1.err" "$T/chk" 2>/dev/null | head -c 300)"
    done_
fi
mk c1b --seed 1 --cycle 16 && mk c2 --seed 2 --cycle 16 && mk r1 --seed 1
if cmp -s "$T/c1/model.safetensors" "$T/c1b/model.safetensors" && ! cmp -s "$T/c1/model.safetensors" "$T/c2/model.safetensors" &&
    ! cmp -s "$T/c1/model.safetensors" "$T/r1/model.safetensors"; then
    pass cycle_deterministic
else
    fail cycle_deterministic
fi
if "$SM" make-model --quiet --preset tiny --experts fp8 --shards 2 --cycle 5 --seed 4 --out "$T/c3" >/dev/null 2>&1 &&
    "$SM" check "$T/c3" >/dev/null 2>&1; then
    pass cycle_fp8_shards_valid
else
    fail cycle_fp8_shards_valid
fi

# follows N C IDS: every id after the first C is the successor of the one before in the cycle
# 3..18 (C = 0: the first follows the prompt's last id, 6)
follows() {
    echo "$3" | tr ',' '\n' | awk -v c="$2" -v n="$1" '
        { v = $1 + 0; k++
          if (k > c && prev != "" && v != (prev - 3 + 1) % n + 3) bad++
          prev = v }
        END { exit (bad > 0 || k == 0) }'
}
G="generate --model $T/c1 --threads 2 --max-tokens 128"
"$SM" $G --prompt-ids 3,4,5,6 >"$T/s.out" 2>&1; r1=$?
"$SM" $G --prompt-ids 3,4,5,6 --no-spec >"$T/p.out" 2>&1; r2=$?
ids=$(sed -n 's/^ids: //p' "$T/s.out")
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ -n "$ids" ] && [ "$(grep '^ids:' "$T/s.out")" = "$(grep '^ids:' "$T/p.out")" ] &&
    follows 16 0 "6,$ids"; then
    pass cycle_greedy_walks_cycle
else
    fail cycle_greedy_walks_cycle "$(cat "$T/s.out" "$T/p.out" | head -c 400)"
fi
drafts=$(sed -n 's/.* = \([0-9.]*\) accepted drafts.*/\1/p' "$T/s.out")
if [ -n "$drafts" ] && awk -v d="$drafts" 'BEGIN { exit !(d >= 3) }'; then
    pass cycle_drafts_accepted; echo "  $drafts accepted drafts a verify step over 128 tokens"
else
    fail cycle_drafts_accepted "$(tail -n 2 "$T/s.out")"
fi
"$SM" generate --model "$T/c1" --threads 2 --max-tokens 40 --prompt-ids 100,200,300,400 >"$T/o.out" 2>&1
ids=$(sed -n 's/^ids: //p' "$T/o.out")
if [ -n "$ids" ] && follows 16 2 "$ids"; then pass cycle_entered_from_other_ids; else fail cycle_entered_from_other_ids "$ids"; fi

bad_msg cycle_too_short "--cycle '1' is not an integer in [2, 65536]" make-model --preset tiny --cycle 1 --out "$T/x1"
bad_msg cycle_too_long "a cycle of 600 ids needs 600 ids below vocab_used = 512" make-model --preset tiny --cycle 600 --out "$T/x2"
if ls -A "$T" | grep -q '^x[12]'; then fail cycle_bad_no_leftovers; else pass cycle_bad_no_leftovers; fi
done_
