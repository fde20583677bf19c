#!/usr/bin/env bash
# The layer as the unit, on a host with TP or more GPUs: measure the fused ops of configs/layers_tpTP.yaml
# (syncopate bench --grid tiny: every candidate's device, host and eager time, the baselines beside),
# store them in a results database, then time the MLP layers those ops come from (syncopate bench
# --layer: torch, async-TP, Syncopate with the stored configurations and with the untuned defaults;
# forward and forward + backward, eager and CUDA graphs). Logs and JSON under $OUT (default
# ./layer-logs); the tables are printed last.
#
#   benchmarks/layer_check.sh TP [HIDDEN:FFN:TOKENS ...]   (default: the layers of configs/layers_tpTP.yaml:
#                                                          4096:14336:8192 4096:14336:2048, and at TP=4 5120:17408:4096)
set -uo pipefail
tp=${1:?give the tensor-parallel size, e.g. 4}
shift
layers=("$@")
[ ${#layers[@]} -eq 0 ] && layers=(4096:14336:8192 4096:14336:2048)
[ ${#layers[@]} -eq 2 ] && [ "$tp" = 4 ] && [ $# -eq 0 ] && layers+=(5120:17408:4096)
out=${OUT:-./layer-logs}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((tp - 1)))}
db="sqlite:///$out/layers-tp$tp.db"
timeout --signal=INT 400 python3 -m syncopate bench --suite "configs/layers_tp$tp.yaml" --grid tiny \
    --repetitions 10 --json "$out/ops-tp$tp.json" >"$out/ops-tp$tp.log" 2>&1
echo "ops tp$tp: rc=$? $(tail -1 "$out/ops-tp$tp.log")"
python3 -m syncopate db upgrade --db "$db" >/dev/null && python3 -m syncopate import-bench "$out/ops-tp$tp.json" --db "$db"
for layer in "${layers[@]}"; do
    IFS=: read -r hidden ffn tokens <<<"$layer"
    log="$out/layer-tp$tp-$hidden-$ffn-$tokens"
    SYNCOPATE_DB="$db" timeout 300 python3 -m syncopate bench --layer mlp --hidden "$hidden" --ffn "$ffn" \
        --tokens "$tokens" --tp "$tp" --json "$log.json" >"$log.log" 2>&1
    echo "layer tp$tp $layer: rc=$?"
done
grep -h -A 14 "^ag_gemm\|kind | N" "$out/ops-tp$tp.log" | tail -16
for layer in "${layers[@]}"; do  # each layer's table and how its fused calls were launched
    IFS=: read -r hidden ffn tokens <<<"$layer"
    sed -n '/^mlp hidden /,$p' "$out/layer-tp$tp-$hidden-$ffn-$tokens.log"
done
