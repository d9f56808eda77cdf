#!/bin/sh
# cli_interrupt.sh BUILD_DIR: `make-model` stopped by SIGINT or SIGTERM while it writes a model
# that takes several seconds (mini, 16 layers, ~0.6 GB) exits promptly with 130 / 143 and one
# line on stderr, and leaves nothing in the parent of --out: no DIR.tmp.<pid>, no DIR.
# Prints PASS/FAIL lines and a DONE line.
NAME=cli_interrupt
. "$(dirname "$0")/lib_cli.sh"

# stop SIG WANT: start make-model, wait for its temporary directory, send SIG, check
stop() {
    sig=$1; want=$2
    p="$T/$sig"
    mkdir "$p"
    "$SM" make-model --quiet --preset mini --layers 16 --seed 3 --out "$p/m" >"$T/out" 2>"$T/err" &
    pid=$!
    i=0 # wait (up to 10 s) until the writer has started: its temporary directory exists
    while [ $i -lt 200 ] && ! ls "$p" | grep -q '^m\.tmp\.'; do sleep 0.05; i=$((i + 1)); done
    sleep 0.3
    t0=$(date +%s)
    kill -s "$sig" $pid
    wait $pid; rc=$?
    dt=$(($(date +%s) - t0))
    left=$(ls -A "$p")
    if [ $rc -eq "$want" ] && [ -z "$left" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && [ $dt -le 3 ]; then
        pass "sig$sig"; echo "  exit $rc after ${dt} s: $(cat "$T/err")"
    else
        fail "sig$sig" "exit $rc (want $want) after ${dt} s, left in parent: '$left', stderr: $(head -c 300 "$T/err")"
    fi
}
stop INT 130
stop TERM 143
done_
