#!/usr/bin/env bash
# The checks to run on a host with two or more NVLink-connected GPUs, each step under its own time
# limit so that one hang does not take the rest with it. Full logs go to $OUT (default ./gpu-logs);
# a one-line verdict per step is printed last.
#
#   benchmarks/gpu_checks.sh [STEP ...]     steps: matrix order conns rs ar suite   (default: all)
#
#   matrix  tests/test_gpu_ops.py: every backend x plan x splits x tile order vs the fp32 reference
#   order   ag_gemm with the kernel launched before its side-stream work (SYNCOPATE_COMM_FIRST=0),
#           grid `small` (128x256 and 128x128 tiles), copy engine and SM-driven copies
#   conns   the same with CUDA_DEVICE_MAX_CONNECTIONS=32
#   rs, ar  gemm_rs / gemm_ar 8192x8192x2048, grid `small`, every backend
#   suite   configs/llama_tp2.yaml, every kind, grid `tiny`
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(matrix order conns rs ar suite)
verdicts=()

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name: $*" | tee -a "$OUT/steps.log"
    timeout --signal=KILL "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local line
    line=$(grep -E "passed|failed|error|Error|ours|bound" "$OUT/$name.log" | tail -1)
    verdicts+=("$name rc=$rc $((SECONDS - t0))s ${line:0:150}")
    tail -25 "$OUT/$name.log"
}

bench() { python3 -m syncopate bench "$@"; }

for s in "${steps[@]}"; do
    case $s in
        matrix) step matrix 300 python3 -m pytest -q -x -p no:cacheprovider -m multigpu tests/test_gpu_ops.py ;;
        order) step order 120 env SYNCOPATE_COMM_FIRST=0 python3 -m syncopate bench ag_gemm --m 8192 --n 2048 \
            --k 8192 --grid small --backends copy_engine,nvshmem --repetitions 5 --json "$OUT/order.json" ;;
        conns) step conns 120 env SYNCOPATE_COMM_FIRST=0 CUDA_DEVICE_MAX_CONNECTIONS=32 python3 -m syncopate bench \
            ag_gemm --m 8192 --n 2048 --k 8192 --grid small --backends copy_engine,nvshmem --repetitions 5 \
            --json "$OUT/conns.json" ;;
        rs) step rs 150 python3 -m syncopate bench gemm_rs --m 8192 --n 8192 --k 2048 --grid small \
            --repetitions 10 --json "$OUT/rs.json" ;;
        ar) step ar 150 python3 -m syncopate bench gemm_ar --m 8192 --n 8192 --k 2048 --grid small \
            --repetitions 10 --json "$OUT/ar.json" ;;
        suite) step suite 420 python3 -m syncopate bench --suite configs/llama_tp2.yaml --grid tiny \
            --repetitions 10 --json "$OUT/suite.json" ;;
        *) echo "unknown step $s: accepted are matrix order conns rs ar suite" >&2; exit 2 ;;
    esac
done
echo
printf '%s\n' "${verdicts[@]}"
