#!/bin/sh
# moe_only.sh build|run [test|bench|all]: the MoE stage's GPU tests and microbenchmark as one
# small program, independent of the other GPU test groups (which may be mid-edit).
#   build: on the development machine (nvcc + the libraries from `make`): compiles
#          src/cuda/moe/*.cu (for the ptxas report), the MoE tests (tests/gpu/moe.cu,
#          moe_shards.cu and their harness, harness.cu) and the benchmark
#          drivers bench/gpu/*.cu with a generated main into $B/moe_only/moe_only (B defaults
#          to build); the bench is `gpu_test --bench moe`.
#   run:   on the GPU machine: runs that binary (`test`, `bench` or `all`, default all), with
#          the device name and driver first.
set -e
B=${B:-build}
O="$B/moe_only"
NVCC=${NVCC:-nvcc}
case "${1:-}" in
build)
    mkdir -p "$O"
    make -s "$B/libsparkmono.a" "$B/libsparkmono_cuda.a"
    cat >"$O/main.c" <<'EOF'
#include <stdio.h>
#include <string.h>
int gpu_test_moe(void);
int gpu_bench(const char *ops);
int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    int f = 0;
    if (strcmp(what, "bench")) f += gpu_test_moe();
    if (strcmp(what, "test")) f += gpu_bench("moe");
    printf("moe_only: %d failed\n", f);
    return f != 0;
}
EOF
    FL="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -Isrc -Iinclude"
    : >"$O/ptxas.txt"
    MOE_O=
    for f in src/cuda/moe/*.cu; do
        $NVCC $FL -Xptxas -v -c "$f" -o "$O/moe_$(basename "$f" .cu).o" 2>>"$O/ptxas.txt"
        MOE_O="$MOE_O $O/moe_$(basename "$f" .cu).o"
    done
    TEST_O=
    for f in tests/gpu/harness.cu tests/gpu/moe.cu tests/gpu/moe_shards.cu; do
        $NVCC $FL -c "$f" -o "$O/test_$(basename "$f" .cu).o"
        TEST_O="$TEST_O $O/test_$(basename "$f" .cu).o"
    done
    BENCH_O=
    for f in bench/gpu/*.cu; do
        $NVCC $FL -c "$f" -o "$O/bench_$(basename "$f" .cu).o"
        BENCH_O="$BENCH_O $O/bench_$(basename "$f" .cu).o"
    done
    gcc -std=c11 -O2 -c "$O/main.c" -o "$O/main.o"
    CUDA_HOME=$(dirname "$(dirname "$(command -v "$NVCC")")")
    gcc "$O/main.o" $TEST_O $MOE_O $BENCH_O -Wl,--start-group "$B/libsparkmono.a" "$B/libsparkmono_cuda.a" \
        -Wl,--end-group -l:libjansson.a -l:libpcre2-8.a -lm -lpthread \
        -L"$CUDA_HOME/lib64" -lcublas -lcublasLt -lcudart_static -ldl -lrt -lpthread -lstdc++ -o "$O/moe_only"
    echo "built $O/moe_only"
    ;;
run)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
    "$O/moe_only" "${2:-all}"
    ;;
*)
    echo "usage: $0 build|run [test|bench|all]" >&2
    exit 2
    ;;
esac
