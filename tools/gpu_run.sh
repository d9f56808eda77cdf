#!/bin/sh
# gpu_run.sh: the one script to run on the GPU machine (an H200): build, every GPU test, the benchmarks.
#
# Builds if needed (`make -j16 all gpu-test`), runs build/gpu_test (kernels, MoE, whole model)
# and tests/gpu/cli_spec.sh (speculative == plain through the CLI, with the logit processors),
# tests/gpu/cli_bench.sh (`sparkmono bench` itself: every row count x numerics x path, a bad flag),
# tests/gpu/serve_cuda.py (the server on the GPU: logprobs made there vs the CPU server, n),
# the per-op microbenchmarks (`gpu_test --bench all`: norm, router, attention, matmul, moe,
# logits, logprobs, frontend, kstep) and `sparkmono bench` on the synthetic real-width 4-layer model (both expert
# numerics, W4A16 and W4A4; with MXFP4 experts each phase of the median MXFP4 layer on both paths,
# --phases; the prefix cache's time to first token, --ttft; the structured-output
# masks' cost per step, --masks, and `sparkmono constrain --bench` at Muse Spark's vocabulary size), writes every full
# log under $OUT (default ./out) and prints a short table last (with each path's layer total and
# latency work of every row count).  Environment knobs:
#   BENCH_FORMATS  expert formats to bench, space separated (default "mxfp4")
#   BENCH_ROWS     rows per verify step, bench --step-rows (default 8,16,32,64,128)
#   BENCH_CTX      context tokens per request (default 4096)
#   BENCH_LAYERS   layers of the synthetic spark1x-l4 model (default 8: 6 monokernel layers)
#   BENCH_ITERS    timed steps per row count (default 50)
#   BENCH_OPS      ops of the per-op microbenchmarks, gpu_test --bench (default all)
#   NCU_MOE=1      Nsight Compute on the MoE queue kernel (MXFP4, 8 and 128 rows, the clocks as
#                  they run: --clock-control none): DRAM %, SM clock, warps, stall reasons
#   SKIP_TESTS=1   skip build/gpu_test;  SKIP_BENCH=1  skip the bench;  SKIP_OPS=1  skip the per-op benches
#   SKIP_BUILD=1   use the binaries already in build/ (built elsewhere with the same nvcc)
#   BASELINE=BIN   also run the whole-step bench with an older sparkmono binary, in the same run,
#                  so old and new are compared on the same machine and bandwidth; when BIN's
#                  directory holds a gpu_test too, the expert stage's interleaved W4A16 / W4A4
#                  lines (`gpu_test --bench moe`, `mxfp4 ab`) of both, alternated new, old, old, new
#   MOE_PF_AB=1    the expert stage's L2 prefetch (moe.h sm_cuda_moe_ws.prefetch) timed three ways,
#                  alternated at 8 .. 128 rows: the default, none (SM_MOE_BENCH_PREFETCH=0) and
#                  4 k steps at every row count (=4); `gpu_test --bench moe` quick runs
#   WORLDS         tensor + expert parallel benches on virtual ranks of this one GPU, "W:moe" words
#                  (default "2:ep 4:ep 8:ep 2:tp"; "" skips them), rows WORLD_ROWS (default 8,32),
#                  stock and monokernel with a traced monokernel step (the exchange waits),
#                  plus the CLI check that a stalled rank ends `generate` with exit 2 and one line
# Exit status: 0 when the build, the tests and every bench run succeeded.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-./out}
mkdir -p "$OUT" || exit 1
command -v nvcc >/dev/null 2>&1 || PATH="$PATH:/usr/local/cuda/bin"
export PATH
FORMATS=${BENCH_FORMATS:-mxfp4}
ROWS=${BENCH_ROWS:-8,16,32,64,128}
CTX=${BENCH_CTX:-4096}
LAYERS=${BENCH_LAYERS:-8}
ITERS=${BENCH_ITERS:-50}
OPS=${BENCH_OPS:-all}
status=0

{ nvidia-smi; nvcc --version; } >"$OUT/device.txt" 2>&1

echo "== build (log: $OUT/build.log)"
t0=$(date +%s)
if [ "${SKIP_BUILD:-0}" = 1 ]; then
    echo "using prebuilt build/sparkmono and build/gpu_test" >"$OUT/build.log"
elif ! make -j16 all gpu-test >"$OUT/build.log" 2>&1; then
    tail -n 40 "$OUT/build.log"
    echo "BUILD FAILED"
    exit 1
fi
echo "built in $(( $(date +%s) - t0 )) s"

trc=skipped
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    echo "== gpu tests (log: $OUT/gpu_test.log)"
    t0=$(date +%s)
    ./build/gpu_test >"$OUT/gpu_test.log" 2>&1
    trc=$?
    [ "$trc" -eq 0 ] || status=1
    echo "gpu_test exit $trc in $(( $(date +%s) - t0 )) s"
    # speculative == plain on the GPU through the CLI, with the logit processors
    sh tests/gpu/cli_spec.sh build >"$OUT/cli_spec.log" 2>&1 || { status=1; trc=1; }
    tail -n 1 "$OUT/cli_spec.log"
    # sparkmono bench itself: every row count x numerics x path reported, a bad flag refused
    sh tests/gpu/cli_bench.sh build >"$OUT/cli_bench.log" 2>&1 || { status=1; trc=1; }
    tail -n 1 "$OUT/cli_bench.log"
    # the server on the GPU (logprobs made on the device) against the CPU server
    python3 tests/gpu/serve_cuda.py build >"$OUT/serve_cuda.log" 2>&1 || { status=1; trc=1; }
    tail -n 1 "$OUT/serve_cuda.log"
fi

# the SM clock and power through the run (power throttling moves the numbers by 10%)
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 500 >"$OUT/clocks.log" 2>&1 &
smi_pid=$!

brcs=""
if [ "${SKIP_BENCH:-0}" != 1 ] && [ "${SKIP_OPS:-0}" != 1 ]; then
    echo "== per-op microbenchmarks $OPS (log: $OUT/bench_ops.log)"
    t0=$(date +%s)
    ./build/gpu_test --bench "$OPS" >"$OUT/bench_ops.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || status=1
    brcs="$brcs ops:$rc"
    echo "ops bench exit $rc in $(( $(date +%s) - t0 )) s"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then

    for f in $FORMATS; do
        echo "== bench spark1x-l4 experts $f (log: $OUT/bench_$f.log)"
        t0=$(date +%s)
        phases=; [ "$f" = mxfp4 ] && phases=--phases  # the layer phases of the MXFP4 layers
        ./build/sparkmono bench --preset spark1x-l4 --layers "$LAYERS" --experts "$f" --step-rows "$ROWS" --ctx "$CTX" \
            --iters "$ITERS" --trace "$OUT/trace_$f.json" $phases --ttft --masks >"$OUT/bench_$f.log" 2>&1
        rc=$?
        [ "$rc" -eq 0 ] || status=1
        brcs="$brcs $f:$rc"
        echo "bench $f exit $rc in $(( $(date +%s) - t0 )) s"
        if [ -n "${BASELINE:-}" ]; then
            rflag=--step-rows
            "$BASELINE" bench --help 2>&1 | grep -q -- --step-rows || rflag=--rows  # before the rename
            "$BASELINE" bench --preset spark1x-l4 --layers "$LAYERS" --experts "$f" $rflag "$ROWS" --ctx "$CTX" --iters "$ITERS" \
                >"$OUT/bench_${f}_baseline.log" 2>&1 || status=1
        fi
    done
    # old and new expert stage alternated on the same warm GPU (run-to-run spread is ~0.1-0.3%)
    bgt=
    [ -n "${BASELINE:-}" ] && bgt="$(dirname "$BASELINE")/gpu_test" && [ -x "$bgt" ] || bgt=
    if [ -n "$bgt" ]; then
        echo "== expert stage, new and baseline alternated (log: $OUT/moe_ab.log)"
        : >"$OUT/moe_ab.log"
        for g in ./build/gpu_test "$bgt" "$bgt" ./build/gpu_test; do
            echo "-- $g" >>"$OUT/moe_ab.log"
            "$g" --bench moe 2>&1 | grep ' ab ' >>"$OUT/moe_ab.log" || status=1
        done
    fi
    if [ "${MOE_PF_AB:-0}" = 1 ]; then
        echo "== expert stage, L2 prefetch default / none / 4 at every row count (log: $OUT/moe_pf_ab.log)"
        for rows in 8 16 32 64 128; do
            for pf in default 0 4 4 0 default; do
                if [ "$pf" = default ]; then pfe=; else pfe="SM_MOE_BENCH_PREFETCH=$pf"; fi
                echo "-- rows $rows prefetch $pf"
                env $pfe SM_MOE_BENCH_QUICK=1 SM_MOE_BENCH_QUICK_ROWS=$rows SM_MOE_BENCH_QUICK_ITERS=20 SM_BENCH_SEED=7 \
                    ./build/gpu_test --bench moe 2>&1 | grep -E ' queue ' || status=1
            done
        done >"$OUT/moe_pf_ab.log" 2>&1
    fi
    # structured outputs on the host: compile and token-mask costs at Muse Spark's vocabulary size
    echo "== sparkmono constrain --bench (log: $OUT/constrain.log)"
    for f in bench/constrain/*.json; do
        echo "-- $f"
        ./build/sparkmono constrain --synthetic-vocab 202048 --json-schema "$f" --bench || status=1
    done >"$OUT/constrain.log" 2>&1
fi

WORLDS=${WORLDS-2:ep 4:ep 8:ep 2:tp}
WORLD_ROWS=${WORLD_ROWS:-8,32}
wrcs=""
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -n "$WORLDS" ]; then
    for wm in $WORLDS; do
        w=${wm%%:*}; m=${wm#*:}
        devs=0; i=1; while [ "$i" -lt "$w" ]; do devs="$devs,0"; i=$((i + 1)); done
        echo "== bench --world $w --moe $m on virtual ranks (log: $OUT/bench_world${w}_$m.log)"
        ./build/sparkmono bench --preset spark1x-l4 --layers "$LAYERS" --step-rows "$WORLD_ROWS" --ctx "$CTX" --iters 20 \
            --world "$w" --moe "$m" --devices "$devs" --trace "$OUT/trace_world${w}_$m.json" >"$OUT/bench_world${w}_$m.log" 2>&1
        rc=$?
        [ "$rc" -eq 0 ] || status=1
        wrcs="$wrcs $w$m:$rc"
    done
    # a rank that stops publishing: generate exits 2 with one line naming rank, layer and operation
    ./build/sparkmono make-model --preset tiny --out "$OUT/tiny_world" >/dev/null 2>&1
    SPARKMONO_COMM_FAULT=1:1:attn_sum SPARKMONO_COMM_BOUND_MS=300 ./build/sparkmono generate --model "$OUT/tiny_world" \
        --backend cuda --world 2 --devices 0,0 --prompt-ids 5,6,7,8 --max-tokens 4 >"$OUT/world_fault.log" 2>&1
    frc=$?
    # one error line (the world's own log line, "sparkmono: cuda world of ...", comes before it)
    if [ "$frc" -eq 2 ] && [ "$(grep -vc '^sparkmono: ' "$OUT/world_fault.log")" -eq 1 ] &&
        tail -n 1 "$OUT/world_fault.log" | grep -q 'layer 1 attn_sum.*rank 1'; then
        wrcs="$wrcs fault-cli:ok"
    else
        wrcs="$wrcs fault-cli:FAILED(exit $frc)"
        status=1
    fi
    rm -rf "$OUT/tiny_world"
fi

ncus=""
if [ "${NCU_MOE:-0}" = 1 ]; then
    echo "== Nsight Compute, MoE queue kernel (log: $OUT/ncu_moe.log)"
    m=dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
    m=$m,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active
    m=$m,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
    for st in long_scoreboard wait math_pipe_throttle barrier short_scoreboard not_selected selected lg_throttle mio_throttle \
        dispatch_stall no_instruction branch_resolving; do
        m=$m,smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio
    done
    : >"$OUT/ncu_moe.log"
    for rows in 8 128; do
        SM_MOE_BENCH_QUICK=1 SM_MOE_BENCH_QUICK_ROWS=$rows ncu --clock-control none --kernel-name regex:moe_q_kernel --launch-skip 4 \
            --launch-count 1 --metrics "$m" ./build/gpu_test --bench moe >>"$OUT/ncu_moe.log" 2>&1
        ncus="$ncus $rows:$?"
    done
fi
kill "$smi_pid" 2>/dev/null

# ---- the short table, last ----
echo
echo "===================== summary ====================="
if [ "$trc" != skipped ]; then
    grep -E '^FAIL ' "$OUT/gpu_test.log" | head -n 30
    sed -n '/^group /,$p' "$OUT/gpu_test.log" | tail -n 7
    grep -E '^FAIL ' "$OUT/cli_spec.log" "$OUT/cli_bench.log" "$OUT/serve_cuda.log" | head -n 10
    echo "cli_spec: $(tail -n 1 "$OUT/cli_spec.log")"
    echo "cli_bench: $(tail -n 1 "$OUT/cli_bench.log")"
    echo "serve_cuda: $(tail -n 1 "$OUT/serve_cuda.log")"
    grep -q '^group ' "$OUT/gpu_test.log" || { echo "gpu_test did not finish (exit $trc); last lines:"; tail -n 15 "$OUT/gpu_test.log"; }
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    for f in $FORMATS; do
        echo "-- bench spark1x-l4, $f experts, ctx $CTX (per-layer table in $OUT/bench_$f.log)"
        if grep -q '^summary' "$OUT/bench_$f.log"; then
            sed -n '/^summary/,$p' "$OUT/bench_$f.log"
            # the median MXFP4 layer's phases summed, and its latency work (every phase: the log)
            grep -E '^layer-phase [^ ]+ [0-9]+ (total|latency) ' "$OUT/bench_$f.log"
            grep '^ttft:' "$OUT/bench_$f.log"
            grep '^masks:' "$OUT/bench_$f.log"
            grep -E '^(-- |bench:|json_schema:)' "$OUT/constrain.log"
        else
            tail -n 5 "$OUT/bench_$f.log"
        fi
        if [ -n "${BASELINE:-}" ]; then
            echo "-- the same with the baseline binary $BASELINE"
            sed -n '/^summary/,$p' "$OUT/bench_${f}_baseline.log" | head -n 8
        fi
    done
    if [ -s "$OUT/moe_ab.log" ]; then
        echo "-- expert stage W4A4 / W4A16, new and baseline alternated"
        cat "$OUT/moe_ab.log"
    fi
    if [ "${SKIP_OPS:-0}" != 1 ]; then
        echo "-- per-op microbenchmarks (every table in $OUT/bench_ops.log)"
        if grep -q '^op summary' "$OUT/bench_ops.log"; then
            sed -n '/^op summary/,$p' "$OUT/bench_ops.log"
        else
            tail -n 5 "$OUT/bench_ops.log"
        fi
    fi
    echo "bench exits:$brcs"
fi
# SM clock samples (MHz) while the GPU drew more than 300 W: min / median / max
awk -F', ' '$3 + 0 > 300 { print $2 + 0 }' "$OUT/clocks.log" 2>/dev/null | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) printf "SM clock under load (%d samples of 0.5 s): min %d / median %d / max %d MHz\n", NR, v[1], v[int((NR + 1) / 2)], v[NR] }'
if [ -n "$ncus" ]; then
    echo "-- Nsight Compute, MoE queue kernel, MXFP4 at 8 then 128 rows (exits:$ncus; full log $OUT/ncu_moe.log)"
    grep -E "dram__throughput|gpu__time_duration|sm__cycles_elapsed.avg.per_second|warps_(active|eligible)|issue_active|pipe_(alu|fma)|stalled_(long_scoreboard|wait|math_pipe|barrier|short_scoreboard|not_selected|lg_throttle|mio_throttle)" \
        "$OUT/ncu_moe.log" | awk '{ printf "  %-80s %s %s\n", $1, $2, $3 }'
fi
if [ -n "$wrcs" ]; then
    echo "-- tensor + expert parallelism on virtual ranks of one GPU (each rank's exchanges meet at host barriers)"
    for wm in $WORLDS; do
        w=${wm%%:*}; m=${wm#*:}
        grep -E '^  world ' "$OUT/bench_world${w}_$m.log" | sed 's/^  //'
        sed -n '/^summary/,$p' "$OUT/bench_world${w}_$m.log"
        grep -E '^  rank [0-9]+: .* us of ' "$OUT/bench_world${w}_$m.log" | sed -n '1,2p' | sed "s/^/  W=$w $m exchange waits, /"
    done
    tail -n 1 "$OUT/world_fault.log"
    echo "world exits:$wrcs"
fi
exit $status
