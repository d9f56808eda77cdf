#!/bin/sh
# run.sh BUILD_DIR: run every CPU test program (BUILD_DIR/tests/test_*) and every CLI test
# script (tests/cli_*.sh, given the build dir), as many at once as there are cores.  Each
# prints PASS/FAIL lines and a DONE line into its log, BUILD_DIR/test-logs/NAME.log; this
# prints one line a test file as it ends (with its FAIL lines under it) and, last,
# "N passed, N failed" (after "N skipped" when tests printed SKIP lines: they need a GPU or a
# CUDA build this machine lacks).  A program that exits non-zero without reporting a FAIL, that never
# prints its DONE line (crash, sanitizer abort) or that runs past SM_TEST_TIMEOUT seconds
# (default 600) counts as one failure.  We rejected printing every log: 26 files and 700 lines
# hide the one that failed.
#   SM_VENV=DIR          the virtual environment whose python3 the tests run (default build/venv)
#   SM_TEST_JOBS=N       tests at once (default: the number of cores)
#   SM_TEST_VERBOSE=1    print each test's whole log under its line (make test V=1)
# (`run.sh --one BUILD_DIR LOG_DIR TEST` runs one test: the worker of the above.)

# ---- one test: its log, its result line (LOG_DIR/NAME.res: passed failed), its lines on stdout
if [ "${1:-}" = --one ]; then
    B=$2; L=$3; t=$4
    n=$(basename "$t" .sh); log="$L/$n.log"
    t0=$(date +%s%N)
    case "$t" in
        *.sh) set -- sh "$t" "$B" ;;
        *) set -- "$t" ;;
    esac
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 10 "${SM_TEST_TIMEOUT:-600}" "$@" >"$log" 2>&1 </dev/null; rc=$?
    else
        "$@" >"$log" 2>&1 </dev/null; rc=$?
    fi
    secs=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); sk=$(grep -c '^SKIP ' "$log")
    why=
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out after ${SM_TEST_TIMEOUT:-600} s"
    elif ! grep -q '^DONE ' "$log"; then why="exit $rc, no DONE line"
    elif [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then why="exit $rc without a FAIL line"
    fi
    [ -n "$why" ] && f=$((f + 1))
    echo "$p $f $sk" >"$L/$n.res"
    out="$L/$n.out"
    skipped=; [ "$sk" -gt 0 ] && skipped=" ($sk skipped)"
    if [ "$f" -eq 0 ]; then
        printf 'ok   %-34s %4d passed  %6s s%s\n' "$t" "$p" "$secs" "$skipped" >"$out"
    else
        printf 'FAIL %-34s %4d passed, %d failed  %s s\n' "$t" "$p" "$f" "$secs" >"$out"
        grep '^FAIL ' "$log" | sed 's/^/     /' >>"$out"
        if [ -n "$why" ]; then
            echo "     FAIL $t ($why); its last lines:" >>"$out"
            tail -n 8 "$log" | sed 's/^/       /' >>"$out"
        fi
        echo "     log: $log" >>"$out"
    fi
    [ "${SM_TEST_VERBOSE:-0}" = 1 ] && sed 's/^/   | /' "$log" >>"$out"
    cat "$out"
    exit 0
fi

B=${1:-build}
# The tests are programs of their own: no make jobserver of ours, the tests' python3 first.
unset MAKEFLAGS MFLAGS MAKELEVEL
VENV=${SM_VENV:-build/venv}
if [ -x "$VENV/bin/python3" ]; then
    PATH="$(cd "$VENV" && pwd)/bin:$PATH"
    export PATH
fi
L="$B/test-logs"
rm -rf "$L" && mkdir -p "$L" || exit 2
jobs=${SM_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}

# the slowest first (measured on 2 cores), so that the last to start are short
list=
for t in tests/cli_serve_load.sh "$B"/tests/test_sample tests/cli_setup.sh tests/cli_serve.sh tests/cli_readme.sh \
         tests/cli_make_model.sh "$B"/tests/test_* tests/cli_*.sh; do
    [ -e "$t" ] || continue
    case "$t" in *.o|*.d) continue ;; esac
    case " $list " in *" $t "*) continue ;; esac
    list="$list $t"
done
printf '%s\n' $list | xargs -P "$jobs" -I{} sh "$0" --one "$B" "$L" {}

pass=0; fail=0; skip=0
for t in $list; do
    n=$(basename "$t" .sh)
    if [ -f "$L/$n.res" ]; then
        read -r p f sk <"$L/$n.res"
    else
        echo "FAIL $t (did not run)"; p=0; f=1; sk=0
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + sk))
done
# skipped: tests that need what this machine lacks (SKIP lines: a GPU, a CUDA build)
[ "$skip" -gt 0 ] && echo "$skip skipped (their SKIP lines in $L say what they need)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
