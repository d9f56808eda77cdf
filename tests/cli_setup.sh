#!/bin/sh
# cli_setup.sh BUILD_DIR: what a newcomer's first commands rely on.  The one dependency list
# (tools/deps.txt) is installed or named by tools/deps.sh with exit 2 when it may not install;
# a fresh build keeps its intermediate objects (so `make test` ends with the summary line, not
# an `rm` of them); the model's specification is in the repository and nothing cites a file
# outside it.
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
if grep -q 'tools/deps.sh' .ci/run && grep -q 'tools/deps.sh' Makefile; then pass deps_one_list; else fail deps_one_list; fi

# ---- a fresh build keeps its intermediates: the test runner's summary is make's last line
if make -s B="$T/b" CUDA=0 "$T/b/tests/test_kvcache" >"$T/m.out" 2>&1 && [ -f "$T/b/tests/test_kvcache.o" ] &&
    ! grep -q '^rm ' "$T/m.out"; then
    pass build_keeps_objects
else
    fail build_keeps_objects "$(tail -n 3 "$T/m.out")"
fi

# ---- the specification lives in the repository, with its ten sections, and is what is cited
n=0; for i in 1 2 3 4 5 6 7 8 9 10; do grep -q "^## $i\. " docs/model.md && n=$((n + 1)); done
if [ "$n" -eq 10 ]; then pass spec_in_repo; else fail spec_in_repo "$n of 10 sections"; fi
if grep -rn 'SPEC\.md' src tools tests include docs bench README.md Makefile --exclude=cli_setup.sh >"$T/cite" 2>/dev/null; then
    fail spec_cited_in_repo "$(head -n 3 "$T/cite")"
else
    pass spec_cited_in_repo
fi
done_
