#!/bin/sh
# cli_make_model.sh BUILD_DIR: `sparkmono make-model` and `sparkmono check` end to end.
# Good cases: tiny and mini in bf16 / mxfp4 / fp8 and with 2 shards, each made and checked.
# Streaming: peak RSS of make-model on a mini model with 8 layers (~290 MB on disk) stays a
# small fraction of the bytes written (tensors are generated and written in 16 MB chunks, never held whole).
# Bad input: each must exit 2 with exactly one line on stderr, naming the problem.
# Prints PASS/FAIL lines and a final DONE line (tests/run.sh counts them).
NAME=cli_mm
. "$(dirname "$0")/lib_cli.sh"

# good: make + check, and the check summary names the expected expert formats
good() { # name preset experts shards want-in-check
    name=$1; shift
    if "$SM" make-model --quiet --preset "$1" --experts "$2" --shards "$3" --seed 5 --out "$T/$name" 2>"$T/err" &&
        "$SM" check "$T/$name" >"$T/out" 2>>"$T/err" && grep -q "$4" "$T/out"; then
        pass "$name"
    else
        fail "$name" "$(head -c 300 "$T/err")"
    fi
}
good tiny_bf16 tiny bf16 1 "layers 0-3 bf16"
good tiny_mxfp4 tiny mxfp4 1 "layer 0 bf16, layers 1-2 mxfp4, layer 3 bf16"
good tiny_fp8 tiny fp8 1 "layers 1-2 fp8"
good tiny_shards2 tiny bf16 2 "total"
good mini_bf16 mini bf16 1 "layers 0-3 bf16"
good mini_mxfp4 mini mxfp4 1 "layers 1-2 mxfp4"
good mini_fp8 mini fp8 1 "layers 1-2 fp8"
good mini_shards2 mini mxfp4 2 "layers 1-2 mxfp4"
if [ -f "$T/mini_shards2/model-00001-of-00002.safetensors" ] && [ -f "$T/mini_shards2/model.safetensors.index.json" ] &&
    cmp -s "$T/mini_mxfp4/config.json" "$T/mini_shards2/config.json"; then pass shards2_layout; else fail shards2_layout; fi
if "$SM" check "$T/mini_bf16" --online-mxfp4 2>/dev/null | grep -q "layers 1-2 mxfp4"; then pass check_online_mxfp4; else fail check_online_mxfp4; fi
if "$SM" check "$T/tiny_bf16" | grep -q "SFSS"; then pass check_layer_kinds; else fail check_layer_kinds; fi

# streaming: peak RSS of an 8-layer mini model vs its size
rss_kb() { # command...: runs it, prints peak RSS in kB (GNU time, else polling /proc VmHWM)
    if [ -x /usr/bin/time ] && /usr/bin/time -f %M true >/dev/null 2>&1; then
        /usr/bin/time -o "$T/rss" -f %M "$@" 2>/dev/null >/dev/null || return 1
        tail -n 1 "$T/rss"
    else
        "$@" >/dev/null 2>&1 &
        pid=$!; hwm=0
        while kill -0 $pid 2>/dev/null; do
            v=$(awk '/VmHWM/ {print $2}' /proc/$pid/status 2>/dev/null)
            [ -n "$v" ] && hwm=$v
            sleep 0.02
        done
        wait $pid || return 1
        echo $hwm
    fi
}
# (measured above the RSS of `sparkmono --help`: a CUDA build maps cuBLAS, ~200 MB, at start)
base=$(rss_kb "$SM" --help)
rss=$(rss_kb "$SM" make-model --quiet --preset mini --layers 8 --out "$T/big")
if [ -n "$rss" ] && [ -n "$base" ] && [ -f "$T/big/model.safetensors" ]; then
    size_kb=$(( $(wc -c <"$T/big/model.safetensors") / 1024 ))
    d=$((rss - base))
    echo "  make-model mini --layers 8: ${size_kb} kB written, peak RSS ${rss} kB (${d} kB above --help)"
    if [ "$rss" -gt 0 ] && [ $((d * 4)) -lt "$size_kb" ]; then pass streaming_rss; else fail streaming_rss "rss ${rss} kB, base ${base} kB"; fi
else
    fail streaming_rss "make-model failed"
fi
rm -rf "$T/big"

# bad input: exit 2 and one line on stderr, naming the problem
bad_msg bad_preset "--preset: unknown preset 'nosuch'" make-model --preset nosuch --out "$T/x1"
bad_msg bad_experts "--experts 'int3' is not one of bf16|mxfp4|fp8" make-model --preset tiny --experts int3 --out "$T/x2"
bad_msg bad_layers "--layers '0' is not an integer in [1, 256]" make-model --preset tiny --layers 0 --out "$T/x3"
bad_msg no_out "make-model: --out DIR is required" make-model --preset tiny
bad_msg unknown_option "unknown option '--colour'" make-model --preset tiny --out "$T/x4" --colour red
bad_msg out_nonempty "$T/tiny_bf16: output exists and is not an empty directory" make-model --preset tiny --out "$T/tiny_bf16"
if [ -d "$T/x1" ] || [ -d "$T/x2" ] || ls "$T" | grep -q '\.tmp\.'; then fail no_leftovers; else pass no_leftovers; fi
bad_msg check_missing_dir "$T/does_not_exist: not a checkpoint directory" check "$T/does_not_exist"
bad_msg check_no_dir "check: --model DIR is required" check
mkdir "$T/trunc" && cp "$T/tiny_bf16/config.json" "$T/trunc/" &&
    head -c 100000 "$T/tiny_bf16/model.safetensors" >"$T/trunc/model.safetensors"
bad_msg check_truncated "$T/trunc/model.safetensors: tensor 'model.language_model.embed_tokens.weight': data_offsets [65792, 327936] run past the data section" check "$T/trunc"
mkdir "$T/badjson" && cp "$T/tiny_bf16/model.safetensors" "$T/badjson/" && printf '{"text_config": {"hidden_size": 256,' >"$T/badjson/config.json"
bad_msg check_bad_json "$T/badjson/config.json: invalid JSON at line 1 column 36" check "$T/badjson"
mkdir "$T/noconfig" && cp "$T/tiny_bf16/model.safetensors" "$T/noconfig/"
bad_msg check_no_config "$T/noconfig/config.json: cannot open" check "$T/noconfig"
done_
