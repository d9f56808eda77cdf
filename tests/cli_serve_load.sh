#!/bin/sh
# cli_serve_load.sh BUILD_DIR: `sparkmono serve` under load (tests/serve/test_load.py, pytest
# with the passfail plugin: one PASS/FAIL line a test): 1,000 slow connections held while
# /health and completions are answered within a second, the slow ones cut at the request
# timeout with a 408, no thread or memory left behind; the connection limit's 503, idle
# connections closed, a parked stream outliving every timeout; a soak of 16 clients.  The
# numbers measured are printed as indented lines.
#   SM_SOAK_S=S   the soak's length in seconds (default here 10, to keep `make test` short on
#                 a small machine; the full soak is SM_SOAK_S=60)
NAME=cli_serve_load
. "$(dirname "$0")/lib_cli.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
SM_ABS=$(cd "$(dirname "$SM")" && pwd)/$(basename "$SM")
if python3 -c 'import pytest, requests, tokenizers' 2>"$T/imp"; then
    PYTHONDONTWRITEBYTECODE=1 SM_BIN="$SM_ABS" PYTHONPATH="$HERE/serve" SM_SOAK_S="${SM_SOAK_S:-10}" \
        python3 -m pytest -q -s -p no:cacheprovider -p passfail --basetemp="$T/pt" "$HERE/serve/test_load.py" >"$T/py.out" 2>&1
    rc=$?
    cat "$T/py.out"
    p=$(grep -c '^PASS ' "$T/py.out"); f=$(grep -c '^FAIL ' "$T/py.out")
    np=$((np + p)); nf=$((nf + f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then fail serve_load_pytest "pytest exit $rc"; fi
else
    fail serve_load_python_deps "$(tail -n 1 "$T/imp"); $PY_HINT"
fi
done_
