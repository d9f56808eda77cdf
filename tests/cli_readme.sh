#!/bin/sh
# cli_readme.sh BUILD_DIR: the README's examples run as written, in order, after `make demo`.
# Every ```sh and ```python block of README.md is run (python blocks with the tests' python3,
# sh blocks with bash), all in one shell so that a server started by one block serves the
# next, in a sandbox: a fresh directory whose build/ holds BUILD_DIR's sparkmono and
# libsparkmono.so (and build/venv, the tests' virtual environment), with a copy of python/,
# include/ (the version) and bench/ (the example schemas).
# A block preceded by the line `<!-- not run: WHY -->` is skipped (the GPU section).  What
# stands in for what the sandbox cannot do, and nothing else:
#   make demo    tools/demo.sh on the sandbox's build/ (its checks below: the demo's lines,
#                "identical" last, under a minute); make test: nothing (it is running this);
#                make shared: build/libsparkmono.so must exist (make test built it)
#   pip install  into a target folder of the sandbox, without dependencies or build isolation
#                (no network; numpy is in the tests' environment), the folder put on PYTHONPATH
#   curl         with --fail-with-body, so an HTTP error fails the block
#   port 8000    a free port
# A block fails when a command in it fails (bash -e); one line a block, named after its
# section.  So a README example that breaks fails this test.  Prints PASS/FAIL lines and a
# DONE line.
NAME=cli_readme
. "$(dirname "$0")/lib_cli.sh"
REPO=$(cd "$(dirname "$0")/.." && pwd)
README="$REPO/README.md"
BA=$(cd "$B" && pwd)

# ---- the blocks: $T/blocks/K.sh|py, and $T/blocks.txt: K LANG NAME (NAME from the ## heading)
mkdir -p "$T/blocks"
awk -v dir="$T/blocks" '
    /^## / { sec = tolower(substr($0, 4)); gsub(/[^a-z0-9]+/, "_", sec); gsub(/^_|_$/, "", sec); nsec = 0 }
    infence && /^```/ { infence = 0; close(file); next }
    infence { print > file; next }
    /^```(sh|bash|python)[ \t]*$/ {
        lang = substr($0, 4); sub(/[ \t]*$/, "", lang); if (lang == "bash") lang = "sh"
        k++; nsec++
        if (prev ~ /^<!-- not run: /) { skip = 1 } else { skip = 0 }
        file = dir "/" k "." (lang == "sh" ? "sh" : "py")
        printf "%d %s readme_%s_%d_%s %d %d\n", k, lang, sec, nsec, lang, skip, NR > (dir "/../blocks.txt")
        infence = 1; printf "" > file; prev = $0; next }
    /^```/ { other = !other }
    { if ($0 !~ /^[ \t]*$/) prev = $0 }
' "$README"
nrun=$(awk '$4 == 0' "$T/blocks.txt" | wc -l)
nsh=$(awk '$4 == 0 && $2 == "sh"' "$T/blocks.txt" | wc -l)
if [ "$nrun" -ge 6 ] && [ "$nsh" -ge 4 ] && grep -q '^make demo ' "$T/blocks/1.sh" && grep -q '^make test ' "$T/blocks/1.sh"; then
    pass readme_blocks_found; echo "  $nrun blocks to run ($nsh sh), $(awk '$4 == 1' "$T/blocks.txt" | wc -l) marked not run"
else
    fail readme_blocks_found "$nrun blocks to run, $nsh sh; the first must hold make demo and make test"
fi

# ---- the sandbox
W="$T/w"
mkdir -p "$W/build" "$W/python"
ln -s "$BA/sparkmono" "$W/build/sparkmono"
[ -f "$BA/libsparkmono.so" ] && ln -s "$BA/libsparkmono.so" "$W/build/libsparkmono.so"
[ -n "${VENV_BIN:-}" ] && ln -s "$(dirname "$VENV_BIN")" "$W/build/venv"
ln -s "$REPO/include" "$W/include" # pip install ./python reads the version from include/sparkmono.h
ln -s "$REPO/bench" "$W/bench"     # the schemas of the structured-outputs example
(cd "$REPO/python" && tar cf - --exclude=build --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.so' .) |
    (cd "$W/python" && tar xf -)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null)
[ -n "$PORT" ] || PORT=$((20000 + $$ % 20000))
# a library built with the sanitizers needs their runtime loaded first in python3
PRE=
if [ -f "$BA/libsparkmono.so" ] && ldd "$BA/libsparkmono.so" | grep -q libasan; then
    PRE=$(${CC:-gcc} -print-file-name=libasan.so)
fi

S="$T/readme.bash"
cat >"$S" <<EOF
set -e
make() {
    case "\$*" in
        demo) t0=\$(date +%s); sh "$REPO/tools/demo.sh" build >"$T/demo.out" 2>&1; rc=\$?
              echo \$((\$(date +%s) - t0)) >"$T/demo.secs"; cat "$T/demo.out"; return \$rc ;;
        test) : ;;
        shared) [ -f build/libsparkmono.so ] ;;
        *) echo "cli_readme: no stand-in for make \$*" >&2; return 1 ;;
    esac
}
pip() {
    [ "\$1" = install ] || { echo "cli_readme: no stand-in for pip \$*" >&2; return 1; }
    shift
    command python3 -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \\
        --target "$W/site" "\$@" && export PYTHONPATH="$W/site"
}
curl() { command curl --fail-with-body --max-time 60 "\$@"; }
trap 'kill \$(jobs -p) 2>/dev/null; wait' EXIT
export PYTHONDONTWRITEBYTECODE=1
EOF
while read -r k lang name skip line; do
    [ "$skip" = 1 ] && continue
    echo "echo '@@ block $k' >&3; echo '@@ block $k'" >>"$S"
    if [ "$lang" = sh ]; then
        sed "s/8000/$PORT/g" "$T/blocks/$k.sh" >>"$S"
    else
        echo "ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$PRE python3 - <<'SM_README_PY'" >>"$S"
        sed "s/8000/$PORT/g" "$T/blocks/$k.py" >>"$S"
        echo "SM_README_PY" >>"$S"
    fi
    echo "echo '@@ ok $k' >&3" >>"$S"
done <"$T/blocks.txt"

(cd "$W" && timeout -k 5 300 bash "$S" >"$T/readme.out" 2>&1 3>"$T/marks" </dev/null); rc=$?
reached=1
while read -r k lang name skip line; do
    [ "$skip" = 1 ] && continue
    if grep -qx "@@ ok $k" "$T/marks"; then
        pass "$name"
    elif [ $reached = 1 ] && grep -qx "@@ block $k" "$T/marks"; then
        fail "$name" "README.md line $line: exit $rc"
        sed -n "/@@ block $k\$/,\$p" "$T/readme.out" | tail -n 15 | sed 's/^/    /'
        reached=0
    else
        fail "$name" "README.md line $line: not reached"
        reached=0
    fi
done <"$T/blocks.txt"

# ---- make demo: what to notice, "identical" last, under a minute
secs=$(cat "$T/demo.secs" 2>/dev/null)
last=$(tail -n 1 "$T/demo.out" 2>/dev/null)
if [ -n "$secs" ] && echo "$last" | grep -q '^identical' && grep -q 'Accepted drafts: [0-9.]* a verify step' "$T/demo.out" &&
    grep -q 'Speed-up: [0-9.]*x' "$T/demo.out" && [ "$secs" -lt 60 ]; then
    pass demo; echo "  demo: ${secs} s; $(grep 'Speed-up' "$T/demo.out")"
else
    fail demo "after ${secs:-?} s: $(tail -n 12 "$T/demo.out" 2>/dev/null)"
fi
done_
