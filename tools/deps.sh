#!/bin/sh
# deps.sh: install what sparkmono's build and tests need, from the two lists.
#   deps.sh [LIST]                 every package of LIST (default tools/deps.txt) is installed:
#                                  run by `make` once per build directory (a stamp file)
#   deps.sh --venv DIR [REQS]      a Python virtual environment DIR holding the packages of
#                                  REQS (default tools/py-requirements.txt): run by `make test`
#                                  (DIR = build/venv), made once (DIR/.installed, redone when
#                                  REQS is newer)
#   SM_DEPS_REPORT=1               never install system packages: name the missing ones and the
#                                  command, exit 2
# Missing system packages are installed with apt-get when we may (root, apt-get present);
# otherwise one line names the exact command to run and the exit status is 2.  The Python
# packages go into a virtual environment because Debian's python3 refuses pip installs into
# the system (PEP 668); when pip cannot install them (no network), one line says which and
# how, exit 2.  We rejected vendoring the libraries: a well-kept system package is updated by
# the distribution, a copy in the tree is not.
set -u
here=$(dirname "$0")

# ---- the tests' Python packages
if [ "${1:-}" = --venv ]; then
    venv=${2:?usage: deps.sh --venv DIR [REQS]}
    reqs=${3:-"$here/py-requirements.txt"}
    stamp="$venv/.installed"
    [ -f "$stamp" ] && [ "$stamp" -nt "$reqs" ] && exit 0
    names=$(sed -e 's/#.*//' "$reqs" | awk 'NF { print $1 }' | sed 's/[<>=!~;[ ].*//' | tr '\n' ' ' | sed 's/ $//')
    printf '  %-5s %s\n' VENV "$venv ($names)"
    log=$(mktemp) || exit 2
    trap 'rm -f "$log"' EXIT
    if [ ! -x "$venv/bin/python3" ] && ! python3 -m venv "$venv" >"$log" 2>&1; then
        echo "deps: python3 -m venv $venv failed ($(grep . "$log" | tail -n 1)); install python3-venv (sudo apt-get install -y python3-venv) and run make test again" >&2
        rm -rf "$venv"
        exit 2
    fi
    if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python3" -m pip install -q --retries 2 --timeout 30 \
            -r "$reqs" >"$log" 2>&1; then
        # pip's reason: the index unreachable (its retry warnings say why), else its last error
        why=$(sed -n "s/.*Failed to establish a new connection: \([^')]*\).*/\1/p; s/.*\(Temporary failure in name resolution\).*/\1/p" "$log" | tail -n 1)
        if [ -n "$why" ]; then why="the package index is unreachable ($why)"
        else why=$(grep -E '^(ERROR|error)' "$log" | tail -n 1); fi
        [ -n "$why" ] || why=$(grep . "$log" | tail -n 1)
        echo "deps: cannot install the tests' Python packages ($names) into $venv: $why; connect to the network (or set PIP_INDEX_URL to a reachable index) and run make test again" >&2
        exit 2
    fi
    touch "$stamp"
    exit 0
fi

# ---- system packages
list=${1:-"$here/deps.txt"}
[ -r "$list" ] || { echo "deps: cannot read $list" >&2; exit 2; }
pkgs=$(sed -e 's/#.*//' "$list" | awk 'NF { print $1 }')

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: no dpkg-query on this system; install these packages yourself: $(echo $pkgs)" >&2
    exit 0
fi
missing=""
for p in $pkgs; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)
    case "$st" in *" installed") ;; *) missing="$missing $p" ;; esac
done
[ -z "$missing" ] && exit 0

cmd="apt-get install -y$missing"
if [ "${SM_DEPS_REPORT:-0}" != 1 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    printf '  %-5s %s\n' APT "${missing# }"
    export DEBIAN_FRONTEND=noninteractive
    log=$(mktemp) || exit 2
    if ! { apt-get update -qq && apt-get install -y -qq $missing; } >"$log" 2>&1; then
        echo "deps: '$cmd' failed ($(grep . "$log" | tail -n 1)); run it yourself and retry" >&2
        rm -f "$log"
        exit 2
    fi
    rm -f "$log"
    exit 0
fi
echo "deps: missing packages:$missing; run: sudo apt-get update && sudo $cmd" >&2
exit 2
