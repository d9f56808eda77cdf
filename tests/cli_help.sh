#!/bin/sh
# cli_help.sh BUILD_DIR: the command line's shared rules.  Every command's -h / --help (stdout,
# exit 0, options with defaults and an example; every option in the README's Command line
# section), --version, --flag=value == --flag value, check --model DIR, --moe without --world,
# --threads above the online cores (one warning, continues), and the retired --rows of generate
# and bench (one line naming the new flag).  Prints PASS/FAIL lines and a DONE line.
NAME=cli_help
. "$(dirname "$0")/lib_cli.sh"
README="$(dirname "$0")/../README.md"

# ---- per-command help
sed -n '/^## Command line/,/^## /p' "$README" >"$T/readme_cli"
for c in make-model check generate logits bench constrain; do
    "$SM" $c --help >"$T/h.out" 2>"$T/h.err"; rc=$?
    "$SM" $c -h >"$T/h2.out" 2>&1; rc2=$?
    if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ ! -s "$T/h.err" ] && cmp -s "$T/h.out" "$T/h2.out" &&
        grep -q "^usage: sparkmono $c " "$T/h.out" && grep -q '^example:' "$T/h.out" &&
        grep -q "^  sparkmono $c " "$T/h.out" && grep -q '^  --[a-z]' "$T/h.out"; then
        pass "help_$c"
    else
        fail "help_$c" "rc $rc/$rc2: $(head -c 200 "$T/h.err")"
    fi
    # every option of the help is in the README's Command line section
    missing=
    for f in $(sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p' "$T/h.out"); do
        grep -q -e "$f\([^a-z0-9-]\|\$\)" "$T/readme_cli" || missing="$missing $f"
    done
    if [ -z "$missing" ]; then pass "readme_lists_${c}_options"; else fail "readme_lists_${c}_options" "missing:$missing"; fi
done
# the help is built from the option table: flag, placeholder, default
"$SM" generate --help >"$T/g.help"
if grep -q '^  --request-rows R .*(default: 8)$' "$T/g.help" && grep -q '^  --no-spec  ' "$T/g.help" &&
    grep -q '^  --max-len L .*(default: prompt + max-tokens)$' "$T/g.help" && ! grep -q -- '--rows ' "$T/g.help"; then
    pass help_from_table
else
    fail help_from_table "$(cat "$T/g.help")"
fi
if "$SM" make-model --help | grep -q -- '--cycle N' && "$SM" bench --help | grep -q '^  --step-rows LIST .*(default: 8,16,32,64,128)$'; then
    pass help_new_flags
else
    fail help_new_flags
fi
v=$("$SM" --version 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$v" | grep -qx 'sparkmono [0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*'; then pass version; else fail version "rc $rc: $v"; fi

# ---- a model for the rest
if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi

# ---- --flag=value is --flag value
"$SM" generate --model "$T/tiny" --prompt-ids 5,6,7,5,6 --max-tokens 6 --request-rows 4 --threads 1 >"$T/a.out" 2>&1; rc1=$?
"$SM" generate --model="$T/tiny" --prompt-ids=5,6,7,5,6 --max-tokens=6 --request-rows=4 --threads=1 >"$T/b.out" 2>&1; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(grep '^ids:' "$T/a.out")" = "$(grep '^ids:' "$T/b.out")" ] &&
    grep -q 'verify steps of 4 rows' "$T/b.out"; then
    pass flag_equals_value
else
    fail flag_equals_value "$(cat "$T/a.out" "$T/b.out" | head -c 300)"
fi
if "$SM" make-model --quiet --preset=tiny --experts=mxfp4 --seed=1 --out="$T/tiny2" >/dev/null 2>&1 &&
    cmp -s "$T/tiny/model.safetensors" "$T/tiny2/model.safetensors"; then
    pass make_model_equals_value
else
    fail make_model_equals_value
fi
bad_msg switch_with_value "option '--no-spec' is a switch and takes no value" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --no-spec=1
bad_msg empty_equals_value "--max-tokens '' is not an integer" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens=
bad_msg unknown_equals "unknown option '--colour'" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --colour=red

# ---- check --model DIR
if "$SM" check --model "$T/tiny" >"$T/c1.out" 2>&1 && "$SM" check "$T/tiny" >"$T/c2.out" 2>&1 &&
    grep -v '^values:' "$T/c1.out" >"$T/c1.cmp" && grep -v '^values:' "$T/c2.out" >"$T/c2.cmp" &&
    cmp -s "$T/c1.cmp" "$T/c2.cmp" && grep -q 'valid' "$T/c1.out"; then
    pass check_model_flag
else
    fail check_model_flag "$(head -c 200 "$T/c1.out")"
fi
bad_msg check_model_and_dir "give the directory once: --model $T/tiny or $T/tiny, not both" check --model "$T/tiny" "$T/tiny"
bad_msg check_nothing "check: --model DIR is required" check --online-mxfp4

# ---- --moe needs --world; --world W --moe tp runs
bad_msg moe_without_world "generate: --moe tp needs --world W" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --moe tp
bad_msg moe_without_world_logits "logits: --moe ep needs --world W" logits --model "$T/tiny" --prompt-ids 1,2 --out "$T/x.npy" --moe ep
bad_msg moe_bad "--moe 'xp' is not one of ep|tp" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --world 2 --moe xp
# ---- the ranks' devices and exchanges: --devices / --comm need --world; W devices; cuda only
bad_msg devices_without_world "--devices 0,0 needs --world W" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --devices 0,0
bad_msg devices_count "--world 2 --devices: devices '0,1,2' lists more than world = 2 devices" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --world 2 --devices 0,1,2
bad_msg devices_bad "--world 2 --devices: devices '0,x': expected comma-separated device ordinals" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --world 2 --devices 0,x
bad_msg comm_bad "--comm 'mpi' is not one of peer|nccl" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --world 2 --comm mpi
bad_msg devices_cpu "devices / comm go with backend 'cuda' and world > 1" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --world 2 --devices 0,0
bad_msg bench_mono_bad "bench: --mono 'maybe' is not one of both|on|off" bench --preset tiny --world 2 --mono maybe
if "$SM" generate --model "$T/tiny" --prompt-ids 5,6,7 --max-tokens 3 --world 2 --moe tp >"$T/w.out" 2>&1; then
    pass world_moe_runs
else
    fail world_moe_runs "$(head -c 200 "$T/w.out")"
fi

# ---- --threads above the online cores: one warning line, and it runs
n=$(($(getconf _NPROCESSORS_ONLN) + 1))
"$SM" generate --model "$T/tiny" --prompt-ids 5,6,7 --max-tokens 3 --threads $n >"$T/t.out" 2>"$T/t.err"; rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$T/t.err")" -eq 1 ] && grep -q "warning: --threads $n" "$T/t.err" && grep -q '^ids:' "$T/t.out"; then
    pass threads_warning; echo "  $(cat "$T/t.err")"
else
    fail threads_warning "rc $rc: $(cat "$T/t.err")"
fi

# ---- one name per meaning: --rows is retired in generate and bench
bad_msg generate_rows_renamed "generate: --rows is now --request-rows" generate --model "$T/tiny" --prompt-ids 1,2 --max-tokens 2 --rows 4
bad_msg bench_rows_renamed "bench: --rows is now --step-rows" bench --preset tiny --rows 8,16
bad_msg bench_step_rows_bad "--step-rows: 'x' is not an integer in [1, 128]" bench --preset tiny --step-rows 8,x
done_
