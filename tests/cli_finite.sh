#!/bin/sh
# cli_finite.sh BUILD_DIR: NaN / Inf weights end to end.  A fresh tiny model is copied and
# poisoned in place (bytes written at the tensor's offset read from the safetensors header):
# `check` must exit 2 naming the tensor, element and kind; `generate` must exit 2 with the line
# naming the failing step (prefill, or verify step 1 when only the generated token's embedding
# is bad) and print no ids; `logits` must exit 2 and leave no output file.  Prints PASS/FAIL
# lines and a DONE line.
NAME=cli_finite
. "$(dirname "$0")/lib_cli.sh"

# byte offset in FILE of the data of tensor NAME
toff() {
    hl=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    b=$(head -c $((8 + hl)) "$1" | tail -c "$hl" | grep -o "\"$2\":{[^}]*}" | sed 's/.*"data_offsets":\[\([0-9]*\),.*/\1/')
    [ -n "$b" ] && echo $((8 + hl + b))
}
# write the printf-escaped bytes BYTES, COUNT times, at offset OFF of FILE
poke() {
    s=""; i=0
    while [ "$i" -lt "$4" ]; do s="$s$3"; i=$((i + 1)); done
    printf "$s" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
if ! "$SM" make-model --preset tiny --experts bf16 --seed 4 --out "$T/clean" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi
pass make_model
H=256
P=model.language_model.

if "$SM" check "$T/clean" >"$T/c.out" 2>"$T/c.err" && grep -q '^values: all finite' "$T/c.out" && [ ! -s "$T/c.err" ]; then
    pass check_clean
else
    cat "$T/c.out" "$T/c.err"; fail check_clean
fi

# a prompt whose first generated token t1 is not in it
t1=; prompt=
for s in 0 1 2 3 4 5 6 7 8 9; do
    prompt="$((20 + 7 * s)),$((21 + 7 * s)),$((22 + 7 * s)),$((20 + 7 * s)),$((21 + 7 * s))"
    t=$("$SM" generate --model "$T/clean" --prompt-ids "$prompt" --max-tokens 1 --threads 2 | sed -n 's/^ids: *\([0-9]*\).*/\1/p')
    [ -n "$t" ] || break
    case ",$prompt," in *",$t,"*) continue ;; esac
    t1=$t; break
done
if [ -n "$t1" ]; then pass first_token; else fail first_token "no prompt avoids its first token"; done_; fi

# 1. the final norm all +Inf: every row of the prefill is non-finite
cp -r "$T/clean" "$T/norm"
f="$T/norm/model.safetensors"
o=$(toff "$f" "${P}norm.weight") && poke "$f" "$o" '\200\177' "$H"
bad_msg check_norm_inf "$f: tensor '${P}norm.weight' element 0 [0] is +Inf" check "$T/norm"
bad_msg generate_norm_inf "generate: prefill step 1, request 0, row 0: non-finite logits" generate --model "$T/norm" --prompt-ids "$prompt" --max-tokens 4 --threads 2
if grep -q '^ids:' "$T/bad.out"; then fail generate_norm_inf_no_ids; else pass generate_norm_inf_no_ids; fi
bad_msg logits_norm_inf "logits: prefill step 1, request 0, row 0: non-finite logits" logits --model "$T/norm" --prompt-ids "$prompt" --out "$T/norm.npy" --threads 2
if [ -e "$T/norm.npy" ] || ls "$T"/norm.npy.tmp* >/dev/null 2>&1; then fail logits_norm_inf_no_file; else pass logits_norm_inf_no_file; fi

# 2. a NaN in the embedding row of t1: the prefill passes, verify step 1 (row 0 = t1) fails
cp -r "$T/clean" "$T/emb"
f="$T/emb/model.safetensors"
o=$(toff "$f" "${P}embed_tokens.weight") && poke "$f" $((o + t1 * H * 2 + 6)) '\300\177' 1
bad_msg check_embed_nan "$f: tensor '${P}embed_tokens.weight' element $((t1 * H + 3)) [$t1, 3] is NaN" check "$T/emb"
bad_msg generate_embed_nan "generate: verify step 1, request 0, row 0: non-finite logits" generate --model "$T/emb" --prompt-ids "$prompt" --max-tokens 4 --threads 2
bad_msg logits_embed_nan "logits: prefill step 1, request 0, row 5: non-finite logits" logits --model "$T/emb" --prompt-ids "$prompt,$t1" --out "$T/emb.npy" --threads 2
if [ -e "$T/emb.npy" ] || ls "$T"/emb.npy.tmp* >/dev/null 2>&1; then fail logits_embed_nan_no_file; else pass logits_embed_nan_no_file; fi
if "$SM" logits --model "$T/emb" --prompt-ids "$prompt" --out "$T/ok.npy" --threads 2 >"$T/ok.out" 2>&1 && [ -s "$T/ok.npy" ]; then
    pass logits_without_the_token
else
    cat "$T/ok.out"; fail logits_without_the_token
fi
done_
