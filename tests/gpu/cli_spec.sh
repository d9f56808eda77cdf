#!/bin/sh
# cli_spec.sh BUILD_DIR: speculative == plain decoding on the CUDA backend through the CLI, with
# the engine's logit processors (the CPU tests check the same on the CPU backend:
# tests/test_logitproc.c).  A tiny model written by make-model, a repetitive prompt (so n-gram
# drafts get accepted), and for each case `generate --backend cuda` with --request-rows 8
# against --no-spec: the ids must be equal (greedy and seeded sampling, each processor, the
# monokernel on and off).  Prints one PASS / FAIL line a case and "N passed, N failed".
# Run by tools/gpu_run.sh on the GPU machine (no GPU: every case fails at the first step).
B=${1:-build}
SM=$B/sparkmono
T=$(mktemp -d "${TMPDIR:-/tmp}/sm_cli_spec.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
np=0; nf=0
if ! "$SM" make-model --preset tiny --out "$T/tiny" >"$T/mk.log" 2>&1; then
    echo "FAIL cli_spec make-model: $(tail -n 1 "$T/mk.log")"; echo "0 passed, 1 failed"; exit 1
fi
P=5,6,7,8,9,5,6,7,8,9,5,6,7,8,9,5,6,7
ids() { "$SM" generate --model "$T/tiny" --backend cuda --prompt-ids "$P" --max-tokens 40 "$@" 2>"$T/err" | sed -n 's/^ids: //p'; }
case_() {
    name=$1; shift
    a=$(ids --request-rows 8 "$@"); b=$(ids --no-spec "$@")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS cli_spec $name"; np=$((np + 1))
    else echo "FAIL cli_spec $name (speculative: '$a', plain: '$b'; $(tail -n 1 "$T/err"))"; nf=$((nf + 1)); fi
}
for mono in off auto; do
    case_ "greedy mono=$mono" --mono $mono
    case_ "greedy penalties mono=$mono" --mono $mono --presence-penalty 0.5 --frequency-penalty 0.3 --repetition-penalty 1.3
    case_ "greedy favour repeats mono=$mono" --mono $mono --presence-penalty -1 --repetition-penalty 0.7
    case_ "greedy min-tokens ignore-eos mono=$mono" --mono $mono --min-tokens 30 --ignore-eos
    case_ "sampled mono=$mono" --mono $mono --temperature 0.8 --seed 7
    case_ "sampled penalties mono=$mono" --mono $mono --temperature 0.8 --top-p 0.9 --seed 11 --presence-penalty 0.4 \
        --frequency-penalty -0.5 --repetition-penalty 1.1
done
echo "$np passed, $nf failed"
[ "$nf" -eq 0 ]
