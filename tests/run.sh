#!/bin/sh
# run.sh BUILD_DIR: run every CPU test program (BUILD_DIR/tests/test_*) and every CLI test
# script (tests/cli_*.sh, given the build dir), count PASS/FAIL lines, and end with
# "N passed, N failed".  A program that exits non-zero without reporting a FAIL, or that
# never prints its DONE line (crash, sanitizer abort), counts as one failure.
B=${1:-build}
pass=0; fail=0
log=$(mktemp)
for t in "$B"/tests/test_* tests/cli_*.sh; do
    [ -e "$t" ] || continue
    case "$t" in *.o|*.d) continue ;; esac
    echo "== $t"
    case "$t" in
        *.sh) sh "$t" "$B" >"$log" 2>&1; rc=$? ;;
        *) "$t" >"$log" 2>&1; rc=$? ;;
    esac
    cat "$log"
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    pass=$((pass + p)); fail=$((fail + f))
    if ! grep -q '^DONE ' "$log" || { [ $rc -ne 0 ] && [ "$f" -eq 0 ]; }; then
        echo "FAIL $t (exit $rc, did not finish cleanly)"; fail=$((fail + 1))
    fi
done
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
