"""Layer: multi-GPU (skipped without two CUDA GPUs). The `fused` MoE template (one persistent Triton
grouped GEMM a call on the copy-engine exchange's buffers and signals), one process a GPU: dispatch
and combine against the float32 group references and the unfused ops, on 2 and 4 GPUs, for uniform
and skewed routings, experts and a rank that get no row, and a routing that grows the symmetric
buffers; outputs poisoned with NaN, calls back to back with fresh inputs, fused calls between
pipelined ones on the same buffers (the epochs go on); `MoELayer` forward and backward on a fused
configuration (its backward the pipelined plan) against the unfused layer's. The same for
`fused_dedup` (the dispatch on deduplicated rows read by index). `gpu`: the same with the ranks
sharing one GPU."""

from __future__ import annotations

import pytest
import torch
from test_gpu_moe import _routings, layer_mismatches, run_checks

TOL = 1e-2


def _configs():
    from syncopate.search_space.moe_workload import MoeCandidate

    fused = dict(template="fused", backend="copy_engine")
    return [
        MoeCandidate(**fused, chunks_per_source=1, order="ring"),
        MoeCandidate(**fused, chunks_per_source=2, order="pairwise", block_m=128, num_warps=8),
        MoeCandidate(**fused, chunks_per_source=4, order="ring", block_m=32, block_n=64, num_stages=4),
        MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=2),  # between fused calls
        MoeCandidate(template="fused_dedup", backend="copy_engine", order="ring", block_m=128, num_warps=8),
    ]


def _check_ops(rank, world, device, group) -> list[str]:
    from syncopate.measure.reference import (
        moe_combine_group_reference,
        moe_dispatch_group_reference,
        relative_error,
    )
    from syncopate.moe import dispatch_gemm, exchange_layout, gemm_combine

    hidden, ffn, experts, top_k, tokens = 256, 128, 4 * world, 4, 384
    lines = []
    gen = torch.Generator(device=device).manual_seed(rank)
    local = experts // world
    for n, routing in enumerate(_routings(world, experts, tokens, top_k)):
        ids, gates = routing.expert_ids[rank].to(device), routing.gate_weights[rank].to(device)
        layout = exchange_layout(ids, experts, group)
        for config in _configs():
            calls = []
            for _ in range(2):  # back to back, fresh inputs, poisoned outputs
                x = torch.randn(ids.shape[0], hidden, generator=gen, device=device).bfloat16()
                w1 = (
                    torch.randn(local, hidden, 2 * ffn, generator=gen, device=device) / hidden**0.5
                ).bfloat16()
                h = torch.randn(layout.rows_received, ffn, generator=gen, device=device).bfloat16()
                w2 = (torch.randn(local, ffn, hidden, generator=gen, device=device) / ffn**0.5).bfloat16()
                up = torch.full(
                    (layout.rows_received, 2 * ffn), float("nan"), device=device, dtype=torch.bfloat16
                )
                down = torch.full((ids.shape[0], hidden), float("nan"), device=device, dtype=torch.bfloat16)
                dispatch_gemm(x, w1, layout, group, out=up, config=config)
                gemm_combine(h, w2, gates, layout, group, out=down, config=config)
                calls.append((x, w1, h, w2, up, down))
            for x, w1, h, w2, up, down in calls:
                ref_up = moe_dispatch_group_reference(x, ids, w1, experts, group)
                ref_down = moe_combine_group_reference(h, w2, ids, gates, experts, group)
                unfused_up = dispatch_gemm(x, w1, layout, group)
                unfused_down = gemm_combine(h, w2, gates, layout, group)
                errors = [
                    relative_error(up, ref_up) if ref_up.numel() else float(up.numel()),
                    relative_error(down, ref_down),
                    relative_error(up, unfused_up.float()) if up.numel() else 0.0,
                    relative_error(down, unfused_down.float()),
                ]
                if not max(errors) < TOL:
                    lines.append(f"rank {rank} routing {n} {config.short()}: errors {errors}")
    return lines


def _check_layer(rank, world, device, group) -> list[str]:
    from syncopate.search_space.moe_workload import MoeCandidate

    fused = MoeCandidate(template="fused", backend="copy_engine", chunks_per_source=2)
    fused_dedup = MoeCandidate(template="fused_dedup", backend="copy_engine", order="pairwise")
    return layer_mismatches(rank, world, device, group, {"fused": fused, "fused_dedup": fused_dedup}, calls=2)


def _run(world: int) -> None:
    run_checks((_check_ops, _check_layer), world, "fused MoE check")


@pytest.mark.multigpu
def test_fused_moe_ops_on_two_gpus():
    _run(2)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_fused_moe_ops_with_ranks_sharing_one_gpu(world):
    """The same checks with every rank on GPU 0, where one GPU is all there is."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_checks((_check_ops, _check_layer), world, "fused MoE check, one GPU", shared_gpu=True)


@pytest.mark.multigpu
def test_fused_moe_ops_on_four_gpus():
    if torch.cuda.device_count() < 4:
        pytest.skip(f"needs four CUDA GPUs on one host; {torch.cuda.device_count()} present")
    _run(4)
