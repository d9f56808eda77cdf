#!/bin/sh
# deps.sh: make sure every package of tools/deps.txt is installed.  Run by `make` (once per
# build directory, through a stamp file) and by .ci/run.  Missing packages are installed with
# apt-get when we may (root, apt-get present); otherwise one line names the exact command to
# run and the exit status is 2.  We rejected vendoring the libraries: a well-kept system
# package is updated by the distribution, a copy in the tree is not.
#   deps.sh [LIST]      LIST defaults to tools/deps.txt (tests give their own)
#   SM_DEPS_REPORT=1    never install: name the missing packages and the command, exit 2
set -u
here=$(dirname "$0")
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
    echo "deps: installing$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq $missing >/dev/null; }; then
        echo "deps: '$cmd' failed; run it yourself and retry" >&2
        exit 2
    fi
    exit 0
fi
echo "deps: missing packages:$missing; run: sudo apt-get update && sudo $cmd" >&2
exit 2
