# lib_cli.sh: shared plumbing of the CLI test scripts (tests/cli_*.sh; this file is not one), sourced after they set
# NAME.  Gives: $B (build dir, from $1), $SM (the sparkmono binary), $T (a temp dir removed on
# exit), pass/fail counters, `bad NAME ARGS...` (sparkmono ARGS must exit 2 with exactly one
# stderr line), `done_` (the DONE line tests/run.sh reads, then exit).
B=${1:-build}
SM="$B/sparkmono"
# python3 is the tests' virtual environment's (`make test` makes it: tools/deps.sh --venv) when
# a script runs alone; tests/run.sh has put it first on the PATH already.
if VENV_BIN=$(cd "${SM_VENV:-build/venv}/bin" 2>/dev/null && pwd) && [ -x "$VENV_BIN/python3" ]; then
    PATH="$VENV_BIN:$PATH"; export PATH
fi
PY_HINT="make test installs the packages of tools/py-requirements.txt into build/venv"
T=$(mktemp -d "${TMPDIR:-/tmp}/sm_$NAME.XXXXXX") || { echo "FAIL ${NAME}_setup (mktemp)"; echo "DONE 0 passed, 1 failed"; exit 1; }
trap 'rm -rf "$T"' EXIT INT TERM

np=0; nf=0
pass() { echo "PASS $1"; np=$((np + 1)); }
fail() { echo "FAIL $1${2:+ ($2)}"; nf=$((nf + 1)); }
done_() { echo "DONE $np passed, $nf failed"; [ "$nf" -eq 0 ]; exit $?; }

bad() { # name, then sparkmono's arguments
    name=$1; shift
    "$SM" "$@" >"$T/bad.out" 2>"$T/bad.err"; rc=$?
    n=$(wc -l <"$T/bad.err")
    if [ $rc -eq 2 ] && [ "$n" -eq 1 ]; then
        pass "$name"; echo "  $(cat "$T/bad.err")"
    else
        fail "$name" "rc $rc, $n stderr lines: $(head -c 200 "$T/bad.err")"
    fi
}
