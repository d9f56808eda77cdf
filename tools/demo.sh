#!/bin/sh
# demo.sh BUILD_DIR (run by `make demo`): make the tiny test model once, then generate from a
# prompt with repetition twice, with speculative verify steps (n-gram drafts, 8 rows) and with
# --no-spec, and check that both emit the same tokens (SPEC.md section 8).
set -u
B=${1:-build}
SM="$B/sparkmono"
M="$B/models/tiny"
if [ ! -d "$M" ]; then
    mkdir -p "$B/models" || exit 1
    "$SM" make-model --preset tiny --experts mxfp4 --seed 1 --out "$M" || exit 1
fi
PROMPT=11,12,13,14,15,11,12,13,14,15,11,12,13
echo "model $M, prompt $PROMPT"
echo "== speculative (8 rows: last token + 7 n-gram drafts)"
spec=$("$SM" generate --model "$M" --prompt-ids $PROMPT --max-tokens 48) || exit 1
echo "$spec"
echo "== plain (--no-spec)"
plain=$("$SM" generate --model "$M" --prompt-ids $PROMPT --max-tokens 48 --no-spec) || exit 1
echo "$plain"
a=$(echo "$spec" | grep '^ids: ')
b=$(echo "$plain" | grep '^ids: ')
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "identical"
else
    echo "DIFFERENT: speculative and plain generation disagree"
    exit 1
fi
