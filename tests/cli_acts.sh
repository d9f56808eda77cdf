#!/bin/sh
# cli_acts.sh BUILD_DIR: --activations auto|mxfp4|bf16 (the MXFP4 experts' activations, W4A4 or
# W4A16) on every command that loads a model, and make-model's W4A4 checkpoints.  A bad word is
# one line naming the flag and exit 2 on each command; check prints the quantization_config and
# the numerics of every layer and refuses a config it does not implement, naming the field;
# forcing mxfp4 on BF16 experts names --online-mxfp4; logits and generate (both forms) change
# with the flag on a W4A4 checkpoint and the default is the declared W4A4.  Prints PASS/FAIL
# lines and a DONE line.
NAME=cli_acts
. "$(dirname "$0")/lib_cli.sh"

W4="$T/w4a4"; MX="$T/mxfp4"; BF="$T/bf16"
"$SM" make-model --quiet --preset tiny --experts mxfp4 --activations mxfp4 --seed 2 --out "$W4" &&
    "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 2 --out "$MX" &&
    "$SM" make-model --quiet --preset tiny --experts bf16 --seed 2 --out "$BF" || { fail setup; done_; }

# ---- a bad word: one line naming the flag, exit 2, on every command
BADW="--activations 'w4a4' is not one of auto|mxfp4|bf16"
bad_msg bad_check "check: $BADW" check "$W4" --activations w4a4
bad_msg bad_generate "generate: $BADW" generate --model "$W4" --prompt-ids 1,2 --max-tokens 2 --activations w4a4
echo '{"ids": [1, 2], "max_tokens": 2}' >"$T/b.jsonl"
bad_msg bad_generate_batch "generate: $BADW" generate --model "$W4" --batch "$T/b.jsonl" --activations w4a4
bad_msg bad_logits "logits: $BADW" logits --model "$W4" --prompt-ids 1,2 --out "$T/x.npy" --activations w4a4
bad_msg bad_bench_model "bench: $BADW" bench --model "$W4" --activations w4a4
bad_msg bad_bench_preset "bench: $BADW" bench --preset tiny --activations w4a4
bad_msg bad_serve "serve: $BADW" serve "$W4" --port 0 --activations w4a4
bad_msg bad_make_model "make-model: $BADW" make-model --preset tiny --experts mxfp4 --activations w4a4 --out "$T/n1"
bad_msg make_model_acts_need_mxfp4 "make-model: --activations mxfp4 writes a Quark MXFP4 quantization_config: it needs --experts mxfp4" \
    make-model --preset tiny --experts bf16 --activations mxfp4 --out "$T/n2"
for c in check generate logits bench serve make-model; do
    if "$SM" $c --help | grep -q '^  --activations auto|mxfp4|bf16 .*(default: auto)$'; then pass "help_$c"; else fail "help_$c"; fi
done

# ---- check: the config read and the numerics of each layer
"$SM" check "$W4" >"$T/c.out" 2>&1
if grep -q '^quantization_config: quark .*weight fp4, input tensors fp4 dynamic per_group 32 (W4A4), 7 exclude patterns$' "$T/c.out" &&
    grep -q '^  layers 1-2: mxfp4 W4A4 (activations mxfp4, declared by quantization_config)$' "$T/c.out" &&
    grep -q '^  layers 0,3: bf16 W16A16 (activations bf16, not MXFP4 experts)$' "$T/c.out"; then
    pass check_w4a4
else
    fail check_w4a4 "$(grep -A3 '^quantization_config' "$T/c.out")"
fi
"$SM" check "$W4" --activations bf16 >"$T/c.out" 2>&1
if grep -q '^numerics of the expert matmuls (activations bf16):$' "$T/c.out" &&
    grep -q '^  layers 1-2: mxfp4 W4A16 (activations bf16, forced by the activations option)$' "$T/c.out"; then
    pass check_forced_bf16
else
    fail check_forced_bf16 "$(grep -A3 '^numerics' "$T/c.out")"
fi
"$SM" check "$MX" >"$T/c.out" 2>&1
if grep -q '^quantization_config: none$' "$T/c.out" &&
    grep -q '^  layers 1-2: mxfp4 W4A16 (activations bf16, no MXFP4 input tensors declared)$' "$T/c.out"; then
    pass check_no_config
else
    fail check_no_config "$(grep -A3 '^quantization_config' "$T/c.out")"
fi
"$SM" check "$BF" --online-mxfp4 >"$T/c.out" 2>&1
if grep -q '^  layers 1-2: mxfp4 W4A4 (activations mxfp4, online MXFP4)$' "$T/c.out"; then pass check_online; else fail check_online; fi
bad_msg check_forced_mxfp4_bf16 "activations mxfp4 need MXFP4 experts" check "$BF" --activations mxfp4
grep -qF -- "--online-mxfp4" "$T/bad.err" && pass forced_mxfp4_names_online || fail forced_mxfp4_names_online
bad_msg generate_forced_mxfp4_bf16 "activations mxfp4 need MXFP4 experts" generate --model "$BF" --prompt-ids 1,2 --max-tokens 2 --activations mxfp4
# a config the engine does not implement: check refuses it, naming the field
cp -r "$W4" "$T/g64"
sed 's/"group_size": 32/"group_size": 64/' "$W4/config.json" >"$T/g64/config.json"
bad_msg check_refuses_group64 "config.json: quantization_config.global_quant_config.input_tensors.group_size: 64 is not supported (MXFP4 activations take 32)" check "$T/g64"
bad_msg logits_refuses_group64 "quantization_config.global_quant_config.input_tensors.group_size: 64" logits --model "$T/g64" --prompt-ids 1,2 --out "$T/x.npy"

# ---- the numerics follow the flag: default == mxfp4 (declared) != bf16
lg() { # name args...: logits of the prompt into $T/name.npy
    n=$1; shift
    "$SM" logits --model "$W4" --prompt-ids 3,4,5,6 --threads 2 --out "$T/$n.npy" "$@" >/dev/null 2>"$T/lg.err"
}
if lg auto && lg mxfp4 --activations mxfp4 && lg bf16 --activations bf16 && lg auto4 --activations auto; then
    if cmp -s "$T/auto.npy" "$T/mxfp4.npy" && cmp -s "$T/auto.npy" "$T/auto4.npy" && ! cmp -s "$T/auto.npy" "$T/bf16.npy"; then
        pass logits_follow_flag
    else
        fail logits_follow_flag "auto == mxfp4 == --activations auto != bf16 does not hold"
    fi
else
    fail logits_follow_flag "$(cat "$T/lg.err")"
fi
gen() { "$SM" generate --model "$W4" --prompt-ids 3,4,5,6 --max-tokens 12 --threads 2 "$@" 2>/dev/null | grep '^ids: '; }
a=$(gen); m=$(gen --activations mxfp4); b=$(gen --activations bf16)
if [ -n "$a" ] && [ "$a" = "$m" ] && [ "$a" != "$b" ]; then pass generate_follows_flag; else fail generate_follows_flag "$a / $m / $b"; fi
# generate --batch: the same ids as the single form, per activations
echo '{"ids": [3, 4, 5, 6], "max_tokens": 12}' >"$T/b.jsonl"
ba=$("$SM" generate --model "$W4" --batch "$T/b.jsonl" --threads 2 2>/dev/null)
bb=$("$SM" generate --model "$W4" --batch "$T/b.jsonl" --threads 2 --activations bf16 2>/dev/null)
ids_of() { echo "$1" | python3 -c 'import json,sys; print(",".join(map(str, json.loads(sys.stdin.readline())["ids"])))'; }
if [ "ids: $(ids_of "$ba")" = "$a" ] && [ "ids: $(ids_of "$bb")" = "$b" ]; then pass batch_follows_flag; else fail batch_follows_flag "$ba / $bb"; fi
done_
