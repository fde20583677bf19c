#!/usr/bin/env bash
# The checks to run on a host with two or more NVLink-connected GPUs, each step under its own time
# limit so that one hang does not take the rest with it. Full logs go to $OUT (default ./gpu-logs);
# a one-line verdict per step is printed last.
#
#   benchmarks/gpu_checks.sh [STEP[=SECONDS] ...]   steps: smoke matrix shared shared48 tune rs ar suite
#                                                    gluon suite-gluon probe sweep stationary sweep4 suite4 tune4 matrix48 suite8 tune8
#                                                    calib tp tp4 graph misses short cublas reductions
#                                                    moe moe4 moe1 (default: matrix
#                                                    tune rs ar suite; SECONDS overrides the limit; a
#                                                    step run twice keeps both logs: suite.log, suite-2.log, ...)
#
#   smoke   tests/test_gpu_ops.py, the quick matrix: one case per kind x backend, 10 calls back to back
#   matrix  tests/test_gpu_ops.py: every backend x plan x splits x tile order vs the fp32 reference
#   shared  tests/test_gpu_shared.py: two ranks on GPU 0 (gloo, buffers through CUDA IPC), the matrix
#           without the nccl backend, a late peer and recovery after timeouts (runs on one GPU)
#   shared48  the same matrix for groups of 4 and 8 ranks on GPU 0 (the 4- and 8-GPU topologies)
#   tune    syncopate tune configs/h200x2.yaml into $OUT/h200x2-tune.db (stopped with SIGINT at its limit)
#   rs, ar  gemm_rs / gemm_ar 8192x8192x2048, grid `small`, every backend
#   suite   configs/llama_tp2.yaml, every kind, grid `tiny`
#   gluon   the Gluon kernels (SYNCOPATE_GLUON=1): the matrix with them, then the TP=2 suite (grid
#           `tiny`) with the Triton (0) and Gluon (1) consumer and producers, twice in turn
#   suite-gluon  the TP=2 suite once with the Gluon kernels (after `suite`, when time is short)
#   probe   benchmarks/probe_faults.py on the cases of $PROBE_ONLY (default: the all-reduce over NCCL
#           and SM copies, and the kept_interleaved producer order)
#   sweep   syncopate tune configs/llama_tp2_sweep.yaml into results/llama_tp2-sweep.db (resumed when it
#           exists; SIGINT at the limit stores what it has), copied to $OUT after
#   stationary  the same for configs/llama_tp2_stationary.yaml (the link-bound shapes with the
#           a_stationary and c_stationary templates) into results/llama_tp2-stationary.db
#   sweep4  the same for configs/llama_tp4_sweep.yaml into results/llama_tp4-sweep.db (four GPUs)
#   suite4  configs/llama_tp4.yaml, every kind, grid `tiny` (four GPUs)
#   tune4   syncopate tune configs/llama_tp4.yaml into results/llama_tp4-tune.db (four GPUs; resumed when it
#           exists), copied to $OUT after
#   matrix48  tests/test_gpu_ops.py's matrix on four and eight GPUs (each skipped where fewer are present)
#   suite8  configs/llama_tp8.yaml, every kind, grid `tiny` (eight GPUs)
#   tune8   syncopate tune configs/llama_tp8.yaml into results/llama_tp8-tune.db (eight GPUs; resumed when it
#           exists), copied to $OUT after
#   calib   syncopate calibrate into results/llama_tp2-sweep.db (the cost model's measured inputs)
#
# With 30 minutes of two GPUs: `smoke matrix suite suite-gluon` (about 21 minutes at their limits)
# says whether the TP=2 targets hold with the current code (the stationary templates in the suite's
# `cuBLAS` column, the Gluon kernels in the second suite); `tp` and `graph` next if time is left.
#   tp      syncopate.tp's layers: tests/test_gpu_tp.py on two GPUs, then `syncopate bench --layer mlp` (a
#           LLaMA-8B MLP layer at 8192 tokens, forward and backward, eager and in CUDA graphs, against
#           torch's path and async-TP) with and without sequence parallelism, then examples/tp_block.py
#   tp4     the same on four GPUs (the layer and capture tests' four-GPU cases, the layer with the
#           configurations of results/llama_tp4-tune.db, tp_block.py on four ranks)
#   graph   the ops captured in CUDA graphs: tests/test_gpu_capture.py on two GPUs, then
#           benchmarks/graph_calls.py (calls one by one against a graph's replay; ours, torch's, async-TP),
#           then op_host.py's host time and profile of ag_gemm at 256, 1024 and 4096 rows (where an eager
#           call's host time can exceed its GPU time)
#   misses  timelines of the TP=2 shapes furthest from their bounds (docs/results.md):
#           gemm_rs 8192x8192x2048 with c_stationary (its pushes and GEMM terms), gemm_ar 8192x4096x11008
#           fused and decomposed (4 and 8 chunks)
#   short   syncopate tune configs/short_tp2.yaml: 256-4096 rows, fused and unfused candidates
#   cublas  tests/support/stationary_check.py: the cuBLAS templates' enqueued work, every rank on GPU 0;
#           then tests/support/cublas_ops_check.py: their matrix and capture cases on two GPUs
#   reductions  configs/llama_tp2.yaml's gemm_rs and gemm_ar, grid `tiny`
#   moe     the MoE ops on two GPUs: tests/test_gpu_moe.py and test_gpu_moe_fused.py (pipelined, dedup,
#           fused, fused_dedup against the float32 references and their layer), then
#           benchmarks/moe_bench.py --ep 2 --grid tiny --backends copy_engine, one run a model of
#           configs/moe_ep.yaml (their JSON under $OUT: the rows of docs/moe.md's tables)
#   moe4    the same on four GPUs
#   moe1    one GPU: the copy-engine MoE plans with ranks sharing it, and benchmarks/moe_kernel.py
#
# Triton's cache lives in $TRITON_CACHE_DIR (default /tmp/syncopate-triton-cache); it starts from
# .tcache/triton-cache.tgz when that exists and is packed into $OUT/triton-cache.tgz at the end, so
# a later run on a fresh machine can start warm (copy it back to .tcache/ and carry that folder).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/syncopate-triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
[ -f .tcache/triton-cache.tgz ] && tar -xzf .tcache/triton-cache.tgz -C "$TRITON_CACHE_DIR"
PROBE_ONLY=${PROBE_ONLY:-"ar nccl64,ar sm32,kept_interleaved"}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(matrix tune rs ar suite)
verdicts=()
gluon_runs=0

cleanup() {  # what a stopped step leaves on the GPUs: spawned ranks, Ray workers
    pkill -9 -f multiprocessing.spawn 2>/dev/null
    pkill -9 -f "ray::" 2>/dev/null
    pkill -9 -f raylet 2>/dev/null
    pkill -9 -f gcs_server 2>/dev/null
    sleep 1
}

fresh() {  # fresh NAME: NAME, or NAME-2, NAME-3, ... where a step of that name has run (its log kept)
    local name=$1 i=1
    while [ -e "$OUT/$name.log" ]; do i=$((i + 1)); name="$1-$i"; done
    echo "$name"
}

step() {  # step NAME LIMIT_S COMMAND...  (SIGINT at the limit, so that tune stores what it has)
    local name limit=${override:-$2}
    name=$(fresh "$1")
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/steps.log"
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    cleanup
    local line
    line=$(grep -E "passed|failed|FAILED|error|Error|ours|bound|trials" "$OUT/$name.log" | tail -1)
    verdicts+=("$name rc=$rc $((SECONDS - t0))s ${line:0:150}")
    tail -25 "$OUT/$name.log"
}

sweep() {  # sweep STEP CONFIG DB: tune CONFIG into DB (resumed when DB exists), then copy DB to $OUT
    local resume=
    [ -f "$3" ] && resume=--resume
    step "$1" 420 python3 -m syncopate tune "$2" --db "sqlite:///$3" $resume
    cp "$3" "$OUT/"
}

for arg in "${steps[@]}"; do
    s=${arg%%=*}
    override=; [ "$s" != "$arg" ] && override=${arg#*=}
    case $s in
        smoke) step smoke 120 python3 -m pytest -s -q -p no:cacheprovider -m multigpu \
            "tests/test_gpu_ops.py::test_fused_ops_match_the_reference_on_two_gpus[smoke]" ;;
        matrix) step matrix 300 python3 -m pytest -s -q -p no:cacheprovider -m multigpu \
            "tests/test_gpu_ops.py::test_fused_ops_match_the_reference_on_two_gpus[full]" ;;
        shared) step shared 540 python3 -m pytest -s -q -p no:cacheprovider -m gpu tests/test_gpu_shared.py \
            -k "not ws4 and not ws8" ;;
        shared48) step shared48 420 python3 -m pytest -s -q -p no:cacheprovider -m gpu tests/test_gpu_shared.py \
            -k "ws4 or ws8" ;;
        tune) step tune 300 python3 -m syncopate tune configs/h200x2.yaml --db "$OUT/h200x2-tune.db" ;;
        rs) step rs 150 python3 -m syncopate bench gemm_rs --m 8192 --n 8192 --k 2048 --grid small \
            --repetitions 10 --json "$OUT/rs.json" ;;
        ar) step ar 150 python3 -m syncopate bench gemm_ar --m 8192 --n 8192 --k 2048 --grid small \
            --repetitions 10 --json "$OUT/ar.json" ;;
        suite) name=$(fresh suite); step "$name" 420 python3 -m syncopate bench --suite configs/llama_tp2.yaml \
            --grid tiny --repetitions 10 --json "$OUT/$name.json" ;;
        gluon) step gluon-matrix 420 env SYNCOPATE_GLUON=1 python3 -m pytest \
                -s -q -p no:cacheprovider -m multigpu \
                "tests/test_gpu_ops.py::test_fused_ops_match_the_reference_on_two_gpus[full]"
            for v in 0 1 0 1; do  # the Triton (0) and Gluon (1) kernels, in turn
                step gluon$v-$((++gluon_runs)) 420 env SYNCOPATE_GLUON=$v python3 -m syncopate bench --suite \
                    configs/llama_tp2.yaml --grid tiny --repetitions 10 \
                    --json "$OUT/gluon$v-$gluon_runs.json"
            done ;;
        suite-gluon) step suite-gluon 420 env SYNCOPATE_GLUON=1 python3 -m syncopate bench --suite \
            configs/llama_tp2.yaml --grid tiny --repetitions 10 --json "$OUT/suite-gluon.json" ;;
        probe) step probe 150 python3 benchmarks/probe_faults.py --calls 3 --only "$PROBE_ONLY" ;;
        sweep) sweep sweep configs/llama_tp2_sweep.yaml results/llama_tp2-sweep.db ;;
        stationary) sweep stationary configs/llama_tp2_stationary.yaml results/llama_tp2-stationary.db ;;
        sweep4) sweep sweep4 configs/llama_tp4_sweep.yaml results/llama_tp4-sweep.db ;;
        calib) step calib 200 python3 -m syncopate calibrate --db sqlite:///results/llama_tp2-sweep.db \
            --tiles 128x256x64w8s3,128x128x64w8s4
            cp results/llama_tp2-sweep.db "$OUT/" ;;
        matrix48) step matrix48 600 python3 -m pytest -s -q -p no:cacheprovider -m multigpu \
            tests/test_gpu_ops.py -k four_and_eight ;;
        suite4) name=$(fresh suite4); step "$name" 420 python3 -m syncopate bench --suite configs/llama_tp4.yaml \
            --grid tiny --repetitions 10 --json "$OUT/$name.json" ;;
        suite8) name=$(fresh suite8); step "$name" 540 python3 -m syncopate bench --suite configs/llama_tp8.yaml \
            --grid tiny --repetitions 10 --json "$OUT/$name.json" ;;
        tune4) sweep tune4 configs/llama_tp4.yaml results/llama_tp4-tune.db ;;
        tune8) sweep tune8 configs/llama_tp8.yaml results/llama_tp8-tune.db ;;
        tp) step tp-test 300 python3 -m pytest -s -q -p no:cacheprovider -m multigpu tests/test_gpu_tp.py
            step tp-sp 200 python3 -m syncopate bench --layer mlp --tp 2 --json "$OUT/tp-sp.json"
            step tp-ar 200 python3 -m syncopate bench --layer mlp --tp 2 --no-sp --json "$OUT/tp-ar.json"
            step tp-block 200 torchrun --nproc-per-node 2 examples/tp_block.py ;;
        tp4) step tp4-test 420 python3 -m pytest -s -q -p no:cacheprovider -m multigpu tests/test_gpu_tp.py \
                tests/test_gpu_capture.py -k "four_gpus and 4"
            step tp4-sp 200 env SYNCOPATE_DB=sqlite:///results/llama_tp4-tune.db python3 -m syncopate bench \
                --layer mlp --tp 4 --json "$OUT/tp4-sp.json"
            step tp4-ar 200 env SYNCOPATE_DB=sqlite:///results/llama_tp4-tune.db python3 -m syncopate bench \
                --layer mlp --tp 4 --no-sp --json "$OUT/tp4-ar.json"
            step tp4-block 200 torchrun --nproc-per-node 4 examples/tp_block.py ;;
        graph) step graph-test 300 python3 -m pytest -s -q -p no:cacheprovider -m multigpu tests/test_gpu_capture.py
            step graph-calls 200 python3 benchmarks/graph_calls.py --ranks 2 --out "$OUT/graph-calls.json"
            step graph-host 150 env OP_HOST_PROFILE="$OUT/graph-host-profile.txt" python3 benchmarks/op_host.py \
                --ranks 2 --case ag_gemm:256x4096x4096 --case ag_gemm:1024x4096x4096 --case ag_gemm:4096x4096x4096 ;;
        misses) step misses-rs 90 python3 benchmarks/timeline.py gemm_rs 8192 8192 2048 --template c_stationary \
                --json "$OUT/misses-rs.json"
            step misses-ar 90 python3 benchmarks/timeline.py gemm_ar 8192 4096 11008 --splits 4 \
                --json "$OUT/misses-ar.json"
            for s in 4 8; do
                step misses-ar-d$s 90 python3 benchmarks/timeline.py gemm_ar 8192 4096 11008 --template decomposed \
                    --splits $s --json "$OUT/misses-ar-d$s.json"
            done ;;
        cublas) step cublas 240 python3 tests/support/stationary_check.py
            step cublas-ops 240 python3 tests/support/cublas_ops_check.py ;;
        reductions) name=$(fresh reductions); step "$name" 420 python3 -m syncopate bench --suite \
            configs/llama_tp2.yaml --grid tiny --kinds gemm_rs,gemm_ar --repetitions 10 --json "$OUT/$name.json" ;;
        short) step short 300 python3 -m syncopate tune configs/short_tp2.yaml --db "sqlite:///$OUT/short.db" ;;
        moe | moe4) ep=2; which=two_gpus
            [ "$s" = moe4 ] && ep=4 && which=four_gpus
            step "$s-test" 420 python3 -m pytest -s -q -p no:cacheprovider -m multigpu tests/test_gpu_moe.py \
                tests/test_gpu_moe_fused.py -k "$which"
            for model in qwen3_30b_a3b deepseek_v3_scaled; do
                step "$s-$model" 540 torchrun --nproc-per-node "$ep" benchmarks/moe_bench.py --ep "$ep" --grid tiny \
                    --repetitions 10 --backends copy_engine --models "$model" --json "$OUT/$s-$model.json"
            done ;;
        moe1) step moe1-shared 420 python3 -m pytest -s -q -p no:cacheprovider -m gpu tests/test_gpu_moe.py \
                tests/test_gpu_moe_fused.py -k sharing_one_gpu
            step moe1-kernel 200 python3 benchmarks/moe_kernel.py --json "$OUT/moe-kernel.json" ;;
        *) echo "unknown step $s: accepted are smoke matrix shared shared48 tune rs ar suite gluon suite-gluon probe sweep stationary sweep4 suite4 tune4 matrix48 suite8 tune8 calib tp tp4 graph misses short cublas reductions moe moe4 moe1" >&2
            exit 2 ;;
    esac
done
tar -czf "$OUT/triton-cache.tgz" -C "$TRITON_CACHE_DIR" . && ls -l "$OUT/triton-cache.tgz"
echo
printf '%s\n' "${verdicts[@]}"
