#!/bin/sh
# cli_python.sh BUILD_DIR: the Python binding (python/sparkmono over BUILD_DIR/libsparkmono.so)
# through pytest (tests/python, with the passfail plugin of tests/serve: one PASS/FAIL line a
# test).  Under the sanitizers the library needs their runtime loaded first (LD_PRELOAD), and
# the interpreter's own allocations are not leak-checked.  The CUDA tests (test_cuda.py) run on
# the library SPARKMONO_CUDA_LIB names, else on BUILD_DIR's when it holds the CUDA backend
# (`make B=build-cuda CUDA=1 test` on a GPU machine); else they are SKIP lines.  Prints
# PASS/FAIL/SKIP lines and a DONE line.
NAME=cli_python
. "$(dirname "$0")/lib_cli.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
SO=$(cd "$B" && pwd)/libsparkmono.so
SM_ABS=$(cd "$(dirname "$SM")" && pwd)/$(basename "$SM")

if [ ! -f "$SO" ]; then fail python_library "$SO missing (make shared)"; done_; fi
if [ -z "${SPARKMONO_CUDA_LIB:-}" ] && nm -D --defined-only "$SO" 2>/dev/null | grep -q ' sm_cuda_backend_create$'; then
    export SPARKMONO_CUDA_LIB="$SO"
fi
pre=
if ldd "$SO" | grep -q libasan; then
    pre=$(${CC:-gcc} -print-file-name=libasan.so)
    export ASAN_OPTIONS=detect_leaks=0
fi
if python3 -c 'import numpy, pytest, tokenizers' 2>"$T/imp"; then
    LD_PRELOAD="$pre" PYTHONDONTWRITEBYTECODE=1 SPARKMONO_LIB="$SO" SM_BIN="$SM_ABS" \
        PYTHONPATH="$HERE/serve:$HERE/../python" \
        python3 -m pytest -q -p no:cacheprovider -p passfail --basetemp="$T/pt" "$HERE/python" >"$T/py.out" 2>&1
    rc=$?
    cat "$T/py.out"
    p=$(grep -c '^PASS ' "$T/py.out"); f=$(grep -c '^FAIL ' "$T/py.out")
    np=$((np + p)); nf=$((nf + f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then fail python_pytest "pytest exit $rc"; fi
else
    fail python_deps "$(tail -n 1 "$T/imp"); $PY_HINT"
fi
done_
