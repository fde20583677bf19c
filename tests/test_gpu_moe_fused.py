"""Layer: multi-GPU (skipped without two CUDA GPUs). The `fused` MoE template (one persistent Triton
grouped GEMM a call on the copy-engine exchange's buffers and signals), one process a GPU: dispatch
and combine against the float32 group references and the unfused ops, on 2 and 4 GPUs, for uniform
and skewed routings, experts and a rank that get no row, and a routing that grows the symmetric
buffers; outputs poisoned with NaN, calls back to back with fresh inputs, fused calls between
pipelined ones on the same buffers (the epochs go on); `MoELayer` forward and backward on a fused
configuration (its backward the pipelined plan) against the unfused layer's."""

from __future__ import annotations

import pytest
import torch
from test_gpu_moe import _routings

TOL = 1e-2


def _configs():
    from syncopate.search_space.moe_workload import MoeCandidate

    fused = dict(template="fused", backend="copy_engine")
    return [
        MoeCandidate(**fused, chunks_per_source=1, order="ring"),
        MoeCandidate(**fused, chunks_per_source=2, order="pairwise", block_m=128, num_warps=8),
        MoeCandidate(**fused, chunks_per_source=4, order="ring", block_m=32, block_n=64, num_stages=4),
        MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=2),  # between fused calls
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
    from syncopate.measure.reference import relative_error
    from syncopate.moe import MoELayer
    from syncopate.search_space.moe_workload import MoeCandidate

    lines = []
    gen = torch.Generator(device=device).manual_seed(10 + rank)
    x = torch.randn(512, 256, generator=gen, device=device).bfloat16()
    grad = torch.randn(512, 256, generator=gen, device=device).bfloat16()
    results = {}
    fused = MoeCandidate(template="fused", backend="copy_engine", chunks_per_source=2)
    for name, config in (("unfused", None), ("fused", fused)):
        for _ in range(2):  # the second call reuses the buffers, tables and counters
            torch.manual_seed(7)  # the same parameters in every layer (and on every rank: the gate)
            layer = MoELayer(hidden=256, ffn=128, experts=4 * world, top_k=4, group=group, device=device)
            layer.dispatch_config = layer.combine_config = config
            xr = x.clone().requires_grad_()
            y = layer(xr)
            y.backward(grad)
            results[name] = [y.detach(), xr.grad, layer.w1.grad, layer.w2.grad, layer.gate.grad]
    for label, a, b in zip(("y", "x", "w1", "w2", "gate"), results["fused"], results["unfused"], strict=True):
        err = relative_error(a, b.float())
        if not err < 3e-2:
            lines.append(f"rank {rank} layer fused: {label} off by {err:.3g}")
    return lines


def _worker(rank, world, port, queue):
    import torch.distributed as dist

    from syncopate.measure.local_ranks import join_group
    from syncopate.moe import close_moe_contexts

    device = join_group(rank, world, port)
    try:
        lines = _check_ops(rank, world, device, dist.group.WORLD)
        lines += _check_layer(rank, world, device, dist.group.WORLD)
        gathered = [None] * world
        dist.all_gather_object(gathered, lines)
        if rank == 0:
            queue.put([line for part in gathered for line in part])
    finally:
        close_moe_contexts()
        dist.destroy_process_group()


def _run(world: int) -> None:
    from syncopate.measure.local_ranks import spawn_ranks

    failures = spawn_ranks(_worker, world, what="fused MoE check")
    assert not failures, "\n".join(failures)


@pytest.mark.multigpu
def test_fused_moe_ops_on_two_gpus():
    _run(2)


@pytest.mark.multigpu
def test_fused_moe_ops_on_four_gpus():
    if torch.cuda.device_count() < 4:
        pytest.skip(f"needs four CUDA GPUs on one host; {torch.cuda.device_count()} present")
    _run(4)
