#!/usr/bin/env bash
# FP8 on a host with TP (default 2) NVLink-connected GPUs, in about four minutes, each step under its own time
# limit so that one hang does not take the rest with it. Full logs and JSON go to $OUT (default
# ./fp8-logs); a one-line verdict per step and the tables are printed last.
#
#   [TP=N] benchmarks/fp8_check.sh [STEP ...]   steps: tests variants ops layer bf16layer
#                                         (default: tests variants ops layer)
#
#   tests     the FP8 ops and float8 layers against float32 products of their dequantized operands,
#             calls back to back on fresh inputs into NaN-poisoned outputs (tests/test_gpu_fp8.py's
#             ops matrix; tests/test_gpu_fp8_layers.py: the decomposed plan variants, the layers on
#             torch's fused scaled ops, the bench's FP8 layer of every impl replayed from a CUDA
#             graph against its eager step; tests/test_gpu_tp_float8.py's layers on two GPUs)
#   variants  benchmarks/fp8_rs_variants.py: the FP8 gemm_rs of LLaMA-3-8B's MLP at 8192 tokens
#             (8192x4096x14336 and 8192x4096x28672), decomposed with 2, 4 and 8 chunks, each plan
#             variant, against the scaled GEMM alone, torch's scaled paths and the bound
#   ops       syncopate bench of the FP8 layer's four ops (grid tiny), stored in $OUT/fp8.db
#   layer     syncopate bench --layer mlp --model llama-3-8b --tokens 8192 --dtype fp8, the
#             `syncopate` row with the configurations of $OUT/fp8.db (run `ops` first)
#   bf16layer the same layer in bf16 (untuned: lookup's answers here), to set FP8 beside
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
TP=${TP:-2}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((TP - 1)))}
PY=${PYTHON:-python3}
OUT=${OUT:-fp8-logs}
mkdir -p "$OUT"
db="sqlite:///$OUT/fp8.db"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests variants ops layer)
verdicts=()

step() {  # step NAME LIMIT_S COMMAND...  (SIGINT at the limit: the spawned ranks are stopped with it)
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/steps.log"
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local line
    line=$(grep -E "passed|failed|FAILED|Error|WRONG|error" "$OUT/$name.log" | tail -1)
    verdicts+=("$name rc=$rc $((SECONDS - t0))s ${line:0:160}")
    tail -20 "$OUT/$name.log"
}

for s in "${steps[@]}"; do
    case $s in
        tests) step tests 180 "$PY" -m pytest -n 0 -s -q -p no:cacheprovider -m multigpu \
            tests/test_gpu_fp8_layers.py \
            "tests/test_gpu_fp8.py::test_fp8_ops_match_the_reference_of_the_same_fp8_operands_on_two_gpus" \
            "tests/test_gpu_tp_float8.py::test_fp8_layers_on_the_fused_ops_match_their_fp8_reference_and_the_bf16_layer[2]" ;;
        variants) step variants 90 "$PY" benchmarks/fp8_rs_variants.py --ranks "$TP" --out "$OUT/variants.json" ;;
        ops)
            cat >"$OUT/layers_fp8.yaml" <<'EOF'
name: layers_fp8
description: LLaMA-3-8B MLP layer's ops at 8192 tokens, forward and backward, fp8
topology: detect
dtype: fp8
workloads:
  - kind: ag_gemm
    shapes: [[8192, 28672, 4096], [8192, 14336, 4096]]
  - kind: gemm_rs
    shapes: [[8192, 4096, 14336], [8192, 4096, 28672]]
strategy:
  name: seeded
  max_trials: 8
  seed: 0
runner: gpu
timing:
  warmup: 5
  repetitions: 10
  deadline_s: 120
EOF
            step ops 300 "$PY" -m syncopate bench --suite "$OUT/layers_fp8.yaml" --grid tiny --repetitions 10 \
                --json "$OUT/ops.json"
            rm -f "$OUT/fp8.db"
            "$PY" -m syncopate db upgrade --db "$db" >/dev/null && "$PY" -m syncopate import-bench "$OUT/ops.json" --db "$db" ;;
        layer) step layer 120 env SYNCOPATE_DB="$db" "$PY" -m syncopate bench --layer mlp --model llama-3-8b \
            --tokens 8192 --tp "$TP" --dtype fp8 --json "$OUT/layer-fp8.json" ;;
        bf16layer) step bf16layer 120 "$PY" -m syncopate bench --layer mlp --model llama-3-8b \
            --tokens 8192 --tp "$TP" --json "$OUT/layer-bf16.json" ;;
        *) echo "unknown step $s: accepted are tests variants ops layer bf16layer" >&2
            exit 2 ;;
    esac
done
echo
for f in variants ops layer bf16layer; do
    [ -f "$OUT/$f.log" ] && grep -A 40 -E "^\| M|kind \| N|^mode/pass" "$OUT/$f.log" | head -40
done
echo
printf '%s\n' "${verdicts[@]}"
