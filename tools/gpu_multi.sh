#!/bin/sh
# gpu_multi.sh: the multi-GPU run (a machine of 2, 4 or 8 H200s): every multi-rank GPU test on
# distinct devices, with both exchange implementations, and the multi-rank benches; full logs
# under $OUT (default ./out), a short table last.
#
#   - build/gpu_test comm (virtual ranks on device 0) and model with SPARKMONO_TEST_DEVICES set
#     to the machine's devices: the world cases (W = 2, 4, 8 up to the device count) then run one
#     rank a GPU, through peer memory (P2P) and, in a second pass, through NCCL;
#   - sparkmono bench --preset spark1x --layers 8 --world W --devices 0..W-1 --comm peer|nccl for
#     W = 2, 4, 8 (up to the device count): the busiest rank's floor, the exchanges alone, the
#     step; one rank (W = 1) for comparison; on 8 GPUs also the full 62-layer model at 8 rows
#     (about 430 GB of MXFP4 experts: 54 GB a rank);
#   - a rank that stops publishing on distinct devices: generate exits 2 with one line.
# Environment: LAYERS (default 8), CTX (4096), ROWS (8,16,32,64,128), SKIP_BUILD=1 (binaries
# built elsewhere).  NVLink multicast stays off (NCCL_NVLS_ENABLE=0, also set by the program).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-./out}
mkdir -p "$OUT" || exit 1
export NCCL_NVLS_ENABLE=0
command -v nvcc >/dev/null 2>&1 || PATH="$PATH:/usr/local/cuda/bin"
LAYERS=${LAYERS:-8}
CTX=${CTX:-4096}
ROWS=${ROWS:-8,16,32,64,128}
status=0
{ nvidia-smi; nvidia-smi topo -m; nvcc --version; } >"$OUT/device.txt" 2>&1
NDEV=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "devices: $NDEV"
[ "$NDEV" -ge 2 ] || { echo "gpu_multi.sh needs at least 2 GPUs (found $NDEV)"; exit 1; }
if [ "${SKIP_BUILD:-0}" != 1 ] && ! make -j16 all gpu-test >"$OUT/build.log" 2>&1; then
    tail -n 30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
ALL=0; i=1; while [ "$i" -lt "$NDEV" ]; do ALL="$ALL,$i"; i=$((i + 1)); done
devs_of() { d=0; j=1; while [ "$j" -lt "$1" ]; do d="$d,$j"; j=$((j + 1)); done; echo "$d"; }

./build/gpu_test comm >"$OUT/test_comm.log" 2>&1 || status=1
for cm in peer nccl; do
    SPARKMONO_TEST_DEVICES=$ALL SPARKMONO_TEST_COMM=$cm ./build/gpu_test model >"$OUT/test_model_$cm.log" 2>&1 || status=1
done

for w in 2 4 8; do
    [ "$w" -le "$NDEV" ] || continue
    for cm in peer nccl; do
        ./build/sparkmono bench --preset spark1x --layers "$LAYERS" --step-rows "$ROWS" --ctx "$CTX" --iters 30 \
            --world "$w" --devices "$(devs_of "$w")" --comm "$cm" >"$OUT/bench_w${w}_$cm.log" 2>&1 || status=1
    done
done
./build/sparkmono bench --preset spark1x --layers "$LAYERS" --step-rows "$ROWS" --ctx "$CTX" --iters 30 \
    >"$OUT/bench_w1.log" 2>&1 || status=1
if [ "$NDEV" -ge 8 ]; then
    ./build/sparkmono bench --preset spark1x --step-rows 8 --ctx "$CTX" --iters 20 --world 8 --devices "$(devs_of 8)" \
        --comm peer >"$OUT/bench_full62_w8.log" 2>&1 || status=1
fi

./build/sparkmono make-model --preset tiny --out "$OUT/tiny_world" >/dev/null 2>&1
SPARKMONO_COMM_FAULT=1:1:attn_sum SPARKMONO_COMM_BOUND_MS=300 ./build/sparkmono generate --model "$OUT/tiny_world" \
    --backend cuda --world 2 --devices 0,1 --prompt-ids 5,6,7,8 --max-tokens 4 >"$OUT/world_fault.log" 2>&1
frc=$?
rm -rf "$OUT/tiny_world"

echo
echo "===================== summary ====================="
for f in test_comm test_model_peer test_model_nccl; do
    printf '%-16s ' "$f"; grep -E '^[0-9]+ passed' "$OUT/$f.log" | tail -n 1 || echo "did not finish"
    grep -E '^FAIL ' "$OUT/$f.log" | head -n 10
done
echo "-- one rank (W = 1):"
sed -n '/^summary/,$p' "$OUT/bench_w1.log" | head -n 8
for w in 2 4 8; do
    [ "$w" -le "$NDEV" ] || continue
    for cm in peer nccl; do
        echo "-- world $w, $cm:"
        grep -E '^(stock step|  world )' "$OUT/bench_w${w}_$cm.log" | sed 's/reads .*floor/... floor/' || tail -n 3 "$OUT/bench_w${w}_$cm.log"
    done
done
if [ -f "$OUT/bench_full62_w8.log" ]; then
    echo "-- the full 62-layer model, 8 ranks (peer), 8 rows:"
    grep -E '^(stock step|  world )' "$OUT/bench_full62_w8.log" || tail -n 3 "$OUT/bench_full62_w8.log"
fi
echo "-- stalled rank (exit $frc, want 2): $(tail -n 1 "$OUT/world_fault.log")"
[ "$frc" -eq 2 ] || status=1
exit $status
