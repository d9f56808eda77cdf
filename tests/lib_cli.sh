# lib_cli.sh: shared plumbing of the CLI test scripts (tests/cli_*.sh; this file is not one), sourced after they set
# NAME.  Gives: $B (build dir, from $1), $SM (the sparkmono binary), $T (a temp dir removed on
# exit), pass/fail counters, `bad_msg NAME TEXT ARGS...` (sparkmono ARGS must exit 2 with exactly
# one stderr line, and that line must contain TEXT), `bad NAME ARGS...` (the old form: exit 2 and
# one line, whatever it says), `done_` (the DONE line tests/run.sh reads, then exit).
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

# bad_msg NAME TEXT ARGS...: sparkmono ARGS must exit 2 with exactly one line on stderr, and the
# line must contain TEXT, a fixed string (grep -F): the part that names the problem and where
# (the flag, the file and line, the value).  We rejected a regex: the lines hold paths under $T,
# brackets, parentheses and '|', which would all need escaping.  The line is left in
# $T/bad.err and stdout in $T/bad.out for further checks.
bad_msg() {
    if [ -z "$2" ]; then fail "$1" "bad_msg: no expected text"; return; fi
    bad_run_ "$@"
}
# bad NAME ARGS...: the old form, which does not read the line (tests/cli_serve.sh still uses it)
bad() {
    bo_=$1; shift
    bad_run_ "$bo_" "" "$@"
}
bad_run_() { # name, expected text ("" takes any), then sparkmono's arguments
    bn_=$1; bw_=$2; shift 2
    "$SM" "$@" >"$T/bad.out" 2>"$T/bad.err"; rc=$?
    bl_=$(wc -l <"$T/bad.err")
    if [ $rc -ne 2 ] || [ "$bl_" -ne 1 ]; then
        fail "$bn_" "rc $rc, $bl_ stderr lines: $(head -c 200 "$T/bad.err")"
    elif [ -n "$bw_" ] && ! grep -qF -- "$bw_" "$T/bad.err"; then
        fail "$bn_" "want '$bw_' in: $(head -c 300 "$T/bad.err")"
    else
        pass "$bn_"; echo "  $(cat "$T/bad.err")"
    fi
}
