#!/bin/sh
# cli_setup.sh BUILD_DIR: what a newcomer's first commands rely on.  The one dependency list
# (tools/deps.txt) is installed or named by tools/deps.sh with exit 2 when it may not install;
# the tests' Python packages that cannot be installed (no network) are one line naming them
# and what to do, exit 2, never a global pip install (Debian refuses it); CI installs nothing
# itself (it runs make); a fresh CPU build prints one short line a built file, says it is the
# CPU engine only, and keeps its intermediate objects (so `make test` ends with the summary
# line, not an `rm` of them); the model's specification is in the repository and nothing cites
# a file outside it; no host folder of src/ includes a folder above it (docs/architecture.md).
NAME=setup
. "$(dirname "$0")/lib_cli.sh"

# ---- tools/deps.sh
printf '# test list\nmake   the build\n' >"$T/ok.txt"
if SM_DEPS_REPORT=1 sh tools/deps.sh "$T/ok.txt" >"$T/d.out" 2>&1; then pass deps_installed; else fail deps_installed "$(cat "$T/d.out")"; fi
printf 'make  the build\nsm-no-such-package-x   missing on purpose\n' >"$T/miss.txt"
SM_DEPS_REPORT=1 sh tools/deps.sh "$T/miss.txt" >"$T/d.out" 2>"$T/d.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/d.err")" -eq 1 ] && grep -q 'apt-get install -y sm-no-such-package-x' "$T/d.err" &&
    ! grep -q ' make' "$T/d.err"; then
    pass deps_missing_named; echo "  $(cat "$T/d.err")"
else
    fail deps_missing_named "rc $rc: $(cat "$T/d.err")"
fi
if grep -q 'tools/deps.sh' Makefile && ! grep -v '^ *#' .ci/run | grep -q -e 'apt-get' -e 'pip install' -e 'deps\.sh' -e 'venv'; then
    pass deps_one_list
else
    fail deps_one_list "the Makefile must run tools/deps.sh and .ci/run install nothing itself"
fi

# ---- the tests' Python packages, with the package index out of reach
printf 'sm-no-such-package-x>=1   # missing on purpose\n' >"$T/req.txt"
PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_NO_CACHE_DIR=1 sh tools/deps.sh --venv "$T/venv" "$T/req.txt" >"$T/v.out" 2>"$T/v.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/v.err")" -eq 1 ] && grep -q 'sm-no-such-package-x) into .*unreachable.*make test' "$T/v.err" &&
    ! grep -q 'pip install' "$T/v.err" && [ ! -f "$T/venv/.installed" ]; then
    pass deps_python_offline_named; echo "  $(cat "$T/v.err")"
else
    fail deps_python_offline_named "rc $rc: $(cat "$T/v.err")"
fi

# ---- a fresh CPU build: one short line a built file, the CPU engine only, intermediates kept
# (the test runner's summary is make's last line)
if make B="$T/b" CUDA=0 OPT=-O0 "$T/b/tests/test_kvcache" "$T/b/sparkmono" >"$T/m.out" 2>&1 && [ -f "$T/b/tests/test_kvcache.o" ] &&
    ! grep -q '^rm ' "$T/m.out"; then
    pass build_keeps_objects
else
    fail build_keeps_objects "$(tail -n 3 "$T/m.out")"
fi
nsrc=$(ls src/*/*.c tools/*.c | wc -l)
long=$(grep -v '^  [A-Z]\{2,4\} *[^ ]*$' "$T/m.out" | grep -v '^  LD    .*/sparkmono (the CPU engine only: ')
if [ -z "$long" ] && [ "$(grep -c '^  CC    ' "$T/m.out")" -eq $((nsrc + 1)) ] &&
    grep -q "^  LD    $T/b/sparkmono (the CPU engine only: CUDA=0; make CUDA=1 adds the CUDA backend)\$" "$T/m.out"; then
    pass build_quiet; echo "  $(grep -c . "$T/m.out") lines for $((nsrc + 1)) sources; $(grep 'LD .*sparkmono' "$T/m.out")"
else
    fail build_quiet "$(echo "$long" | head -c 300)"
fi

# ---- the specification lives in the repository, with its ten sections, and is what is cited
n=0; for i in 1 2 3 4 5 6 7 8 9 10; do grep -q "^## $i\. " docs/model.md && n=$((n + 1)); done
if [ "$n" -eq 10 ]; then pass spec_in_repo; else fail spec_in_repo "$n of 10 sections"; fi
if grep -rn 'SPEC\.md' src tools tests include docs bench README.md Makefile --exclude=cli_setup.sh >"$T/cite" 2>/dev/null; then
    fail spec_cited_in_repo "$(head -n 3 "$T/cite")"
else
    pass spec_cited_in_repo
fi

# ---- the folders' include rule (docs/architecture.md, "Who may include what"): a file of
# src/A/ includes headers of A and of folders on a lower floor only.  Floors from the ground:
# base 1, model / jinja 2, parallel / backend / testing / constrain 3, cpu / cuda 4, engine 5,
# serve 6.
floor() { case $1 in base) echo 1;; model|jinja) echo 2;; parallel|backend|testing|constrain) echo 3;;
    cpu|cuda) echo 4;; engine) echo 5;; serve) echo 6;; *) echo 0;; esac; }
up=""
for f in $(find src -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh'); do
    a=$(echo "$f" | cut -d/ -f2); fa=$(floor "$a")
    for b in $(sed -n 's|^ *# *include *"\([a-z]*\)/.*|\1|p' "$f" | sort -u); do
        fb=$(floor "$b")
        if [ "$fb" -gt 0 ] && [ "$b" != "$a" ] && [ "$fb" -ge "$fa" ]; then up="$up $f->$b/"; fi
    done
done
nfold=$(ls -d src/*/ | wc -l)
if [ -z "$up" ] && [ "$nfold" -eq 11 ] && [ -z "$(ls src/*.c src/*.h 2>/dev/null)" ]; then
    pass include_folders_down; echo "  $nfold folders, no include runs up"
else
    fail include_folders_down "$nfold folders (11 expected), files at src/: $(ls src/*.[ch] 2>/dev/null | head -3); up:$up"
fi
# ---- inside src/cuda/ the same rule one level down: common.cuh alone at the top (each seam
# header lives beside its code); floors: ops / moe / comm 1, exec (the executor interface) 2,
# the executors stock / mono and the rank driver rank 3, bench 4.  A file includes its own
# folder and lower floors only: neither executor includes the other, and the rank reaches them
# through exec/ alone.
cfloor() { case $1 in ops|moe|comm) echo 1;; exec) echo 2;; stock|mono|rank) echo 3;; bench) echo 4;; *) echo 0;; esac; }
side=""
for f in $(find src/cuda -mindepth 2 -name '*.h' -o -mindepth 2 -name '*.cuh' -o -mindepth 2 -name '*.cu'); do
    a=$(echo "$f" | cut -d/ -f3); fa=$(cfloor "$a")
    for b in $(sed -n 's|^ *# *include *"cuda/\([a-z_]*\)/.*|\1|p' "$f" | sort -u); do
        fb=$(cfloor "$b")
        if [ "$b" != "$a" ] && ! { [ "$fb" -gt 0 ] && [ "$fb" -lt "$fa" ]; }; then side="$side $f->cuda/$b/"; fi
    done
done
top=$(ls src/cuda | grep -v '^common\.cuh$' | grep -v -x -e ops -e moe -e comm -e exec -e stock -e mono -e rank -e bench)
if [ -z "$side" ] && [ -z "$top" ]; then
    pass include_cuda_folders; echo "  src/cuda/: common.cuh and 8 folders on 4 floors; stock, mono and rank include none of each other"
else
    fail include_cuda_folders "at src/cuda/: $top; across:$side"
fi
done_
