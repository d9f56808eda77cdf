#!/bin/sh
# cli_bench.sh BUILD_DIR: `sparkmono bench` itself on the GPU, on the tiny preset: every row
# count of --step-rows times every numerics it promises (MXFP4 experts: W4A16, W4A4 on the FP8
# tensor cores and with bf16 products) on both paths, each with a median above zero, --phases
# lines for both paths, exit 0; --mono off with stock rows only and no monokernel engaged; and a
# bad flag refused with exit 2 and one line.  (Three row
# counts of three numerics overran the result table once: 18 rows in room for 12.)
# Prints one PASS / FAIL line a case and "N passed, N failed".  Run by tools/gpu_run.sh.
B=${1:-build}
SM=$B/sparkmono
T=$(mktemp -d "${TMPDIR:-/tmp}/sm_cli_bench.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
np=0; nf=0
ok() { echo "PASS cli_bench $1"; np=$((np + 1)); }
bad() { echo "FAIL cli_bench $1"; nf=$((nf + 1)); }

"$SM" bench --preset tiny --experts mxfp4 --step-rows 8,16,32 --iters 20 --warmup 2 --mono both --phases >"$T/b.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then ok "three row counts x three numerics: exit 0"
else bad "three row counts x three numerics: exit $rc ($(tail -n 1 "$T/b.log"))"; fi
# summary rows: path acts rows reqxR median_us ...
paths=2; grep -q '^monokernel: not available' "$T/b.log" && paths=1
want=$((3 * 3 * paths))
got=$(sed -n '/^summary /,$p' "$T/b.log" | awk '($1 == "stock" || $1 == "mono") && $5 + 0 > 0' | wc -l)
if [ "$got" -eq "$want" ]; then ok "summary: $got rows, every median > 0"
else bad "summary: $got rows with a median > 0, want $want"; fi
for n in w4a16 w4a4f w4a4b; do
    c=$(sed -n '/^summary /,$p' "$T/b.log" | awk -v n="$n" '$2 == n' | wc -l)
    if [ "$c" -eq $((3 * paths)) ]; then ok "summary: $n on every row count and path"
    else bad "summary: $c rows of $n, want $((3 * paths))"; fi
done
c=$(grep -c '^layer-phase .* total ' "$T/b.log")
if [ "$c" -eq "$want" ]; then ok "--phases: a layer total for each row"
else bad "--phases: $c layer totals, want $want"; fi

# --mono off times the stock path only: the monokernel never engages
"$SM" bench --preset tiny --experts mxfp4 --step-rows 8 --iters 20 --warmup 2 --mono off >"$T/s.log" 2>&1
rc=$?
c=$(grep -c 'monokernel engaged' "$T/s.log")
m=$(sed -n '/^summary /,$p' "$T/s.log" | awk '$1 == "mono"' | wc -l)
if [ "$rc" -eq 0 ] && [ "$c" -eq 0 ] && [ "$m" -eq 0 ]; then ok "--mono off: stock rows only, the monokernel never engaged"
else bad "--mono off: exit $rc, $c 'monokernel engaged' lines, $m mono rows"; fi

"$SM" bench --preset tiny --iters 5 >"$T/e.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/e.log")" -eq 1 ]; then ok "--iters 5 refused: $(cat "$T/e.log")"
else bad "--iters 5: exit $rc, $(wc -l <"$T/e.log") lines"; fi

echo "$np passed, $nf failed"
[ "$nf" -eq 0 ]
