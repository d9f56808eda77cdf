#!/bin/sh
# nccl-header.sh DIR: put NCCL's header at DIR/include/nccl.h for the CUDA build (src/cuda/comm/
# uses its types; the library itself is loaded with dlopen at run time, never linked).  Run by
# make only when it builds the CUDA backend; skips when the header is there.  Source: the
# system's copy when there is one ($CUDA_HOME/include, /usr/include, /usr/local/include: the
# header of the libnccl.so.2 the engine will load), else NVIDIA's `nvidia-nccl-cu13` wheel from
# PyPI (pip download into a temporary directory, about 200 MB; the wheel is a zip, the header is
# nvidia/nccl/include/nccl.h).  We rejected vendoring the header: it is NVIDIA's file and version.
set -eu
dir=${1:-build/nccl}
dst="$dir/include/nccl.h"
[ -f "$dst" ] && exit 0
mkdir -p "$dir/include"
for src in "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" /usr/include/nccl.h /usr/local/include/nccl.h; do
    if [ -f "$src" ]; then
        cp "$src" "$dst"
        printf '  %-5s %s\n' NCCL "$dst (from $src)"
        exit 0
    fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
if python3 -m pip download -q --no-deps --only-binary=:all: --retries 1 --timeout 20 -d "$tmp" nvidia-nccl-cu13 \
        >"$tmp/pip.log" 2>&1 &&
    python3 - "$tmp" "$dst.tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/nvidia_nccl_cu13-*.whl")[0]
with zipfile.ZipFile(whl) as z, open(sys.argv[2], "wb") as f:
    f.write(z.read("nvidia/nccl/include/nccl.h"))
PY
then
    mv "$dst.tmp" "$dst"
    printf '  %-5s %s\n' NCCL "$dst (from the nvidia-nccl-cu13 wheel)"
    exit 0
fi
rm -f "$dst.tmp"
echo "nccl-header: cannot get nccl.h: no system copy, and pip download of nvidia-nccl-cu13 failed ($(tail -n 1 "$tmp/pip.log"))" >&2
exit 1
