"""Layer: multi-GPU (skipped without two CUDA GPUs). The pipelined MoE plans with the CUDA backends
(`nccl` on a side stream, `copy_engine` into symmetric memory), one process a GPU: results equal
to the unfused ops' and close to the float32 group references, for uniform and skewed routings and
a rank that receives nothing, outputs poisoned with NaN, calls back to back with fresh inputs, a
routing that needs a larger symmetric buffer than the one before; the plans' transfers alone (the
bound's all-to-all on a backend) against all_to_all_single; `MoELayer`'s forward and
backward on each backend against the unfused layer's; backend `nvshmem` refused in a process
without NVSHMEM memory, naming the fix."""

from __future__ import annotations

import pytest
import torch

TOL = 1e-2


def _routings(ws: int, experts: int, tokens: int, top_k: int):
    from syncopate.moe import Routing, draw_routing
    from syncopate.search_space import RoutingSpec

    out = [
        draw_routing(world_size=ws, tokens=tokens, experts=experts, top_k=top_k, spec=RoutingSpec(seed=1)),
        draw_routing(
            world_size=ws,
            tokens=tokens,
            experts=experts,
            top_k=top_k,
            spec=RoutingSpec(distribution="skewed", skew=2.0, seed=2),
        ),
    ]
    gen = torch.Generator().manual_seed(3)
    fed = experts - experts // ws  # the last rank's experts get no row
    ids = [
        torch.stack([torch.randperm(fed, generator=gen)[:top_k] for _ in range(tokens)]) for _ in range(ws)
    ]
    weights = [torch.softmax(torch.randn(tokens, top_k, generator=gen), 1) for _ in range(ws)]
    out.append(Routing(experts=experts, expert_ids=tuple(ids), gate_weights=tuple(weights)))
    # four times the tokens: the copy-engine contexts grow their buffers
    out.append(
        draw_routing(world_size=ws, tokens=4 * tokens, experts=experts, top_k=top_k, spec=RoutingSpec(seed=4))
    )
    return out


def check_ops(rank, world, device, group, backends=("nccl", "copy_engine")) -> list[str]:
    """The pipelined ops on each of `backends` at three (chunks, order) plans (`nvshmem` at 8, 32
    and 16 copier programs), and `dedup` on each of `nccl` and `copy_engine` that is among them
    (both orders on the copy engine) and `fused_dedup` where `copy_engine` is, against the unfused
    ops and the float32 references: a line a miss."""
    from syncopate.measure.reference import (
        moe_combine_group_reference,
        moe_dispatch_group_reference,
        relative_error,
    )
    from syncopate.moe import dispatch_gemm, exchange_layout, gemm_combine
    from syncopate.search_space.moe_workload import MoeCandidate

    hidden, ffn, experts, top_k, tokens = 256, 128, 4 * world, 4, 384
    configs = [
        MoeCandidate(
            template="pipelined",
            backend=b,
            chunks_per_source=c,
            order=o,
            **({"comm_sms": n} if b == "nvshmem" else {}),
        )
        for b in backends
        for c, o, n in ((1, "ring", 8), (4, "ring", 32), (2, "pairwise", 16))
    ] + [MoeCandidate(template="dedup")] * ("nccl" in backends)
    if "copy_engine" in backends:
        configs += [
            MoeCandidate(template="dedup", backend="copy_engine", order=o) for o in ("ring", "pairwise")
        ]
        configs += [
            MoeCandidate(template="fused_dedup", backend="copy_engine", order="pairwise"),
            MoeCandidate(
                template="fused_dedup", backend="copy_engine", block_m=128, block_n=128, num_warps=8
            ),
        ]
    lines = []
    gen = torch.Generator(device=device).manual_seed(rank)
    for n, routing in enumerate(_routings(world, experts, tokens, top_k)):
        ids, gates = routing.expert_ids[rank].to(device), routing.gate_weights[rank].to(device)
        layout = exchange_layout(ids, experts, group)
        local = experts // world
        for config in configs:
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
                unfused_up = dispatch_gemm(x, w1, layout, group)
                unfused_down = gemm_combine(h, w2, gates, layout, group)
                ref_up = moe_dispatch_group_reference(x, ids, w1, experts, group)
                ref_down = moe_combine_group_reference(h, w2, ids, gates, experts, group)
                errors = [
                    relative_error(up, ref_up) if ref_up.numel() else float(up.numel()),
                    relative_error(down, ref_down),
                    relative_error(up, unfused_up.float()) if up.numel() else 0.0,
                    relative_error(down, unfused_down.float()),
                ]
                if not max(errors) < TOL:
                    lines.append(f"rank {rank} routing {n} {config.short()}: errors {errors}")
    return lines


def layer_mismatches(rank, world, device, group, configs: dict, calls: int = 1) -> list[str]:
    """`MoELayer` forward and backward on each of `configs` (name → plan, None: unfused), the same
    parameters and inputs in each, `calls` times in a row (a later call reuses the buffers, tables
    and counters of the first; the last one's output and gradients are kept): a line for each output
    or gradient of a plan off the unfused layer's by more than 3e-2."""
    from syncopate.measure.reference import relative_error
    from syncopate.moe import MoELayer

    gen = torch.Generator(device=device).manual_seed(10 + rank)
    x = torch.randn(512, 256, generator=gen, device=device).bfloat16()
    grad = torch.randn(512, 256, generator=gen, device=device).bfloat16()
    results = {}
    for name, config in {"unfused": None, **configs}.items():
        for _ in range(calls):
            torch.manual_seed(7)  # the same parameters in every layer (and on every rank: the gate)
            layer = MoELayer(hidden=256, ffn=128, experts=4 * world, top_k=4, group=group, device=device)
            layer.dispatch_config = layer.combine_config = config
            xr = x.clone().requires_grad_()
            y = layer(xr)
            y.backward(grad)
            results[name] = [y.detach(), xr.grad, layer.w1.grad, layer.w2.grad, layer.gate.grad]
    lines = []
    for name in configs:
        for label, a, b in zip(
            ("y", "x", "w1", "w2", "gate"), results[name], results["unfused"], strict=True
        ):
            err = relative_error(a, b.float())
            if not err < 3e-2:
                lines.append(f"rank {rank} layer {name}: {label} off by {err:.3g}")
    return lines


def check_layer(rank, world, device, group, backends=("nccl", "copy_engine")) -> list[str]:
    from syncopate.search_space.moe_workload import MoeCandidate

    configs = {
        name: MoeCandidate(template="pipelined", backend=name, chunks_per_source=2) for name in backends
    }
    if "nccl" in backends:
        configs["dedup"] = MoeCandidate(template="dedup")
    if "copy_engine" in backends:
        configs["dedup/copy_engine"] = MoeCandidate(template="dedup", backend="copy_engine")
        configs["fused_dedup"] = MoeCandidate(template="fused_dedup", backend="copy_engine")
    return layer_mismatches(rank, world, device, group, configs, calls=2)


def check_refusal(rank, world, device, group) -> list[str]:
    """In a process whose symmetric memory is not NVSHMEM's, backend `nvshmem` is refused before
    anything moves, naming the fix; the next call on `copy_engine` is right."""
    from syncopate.errors import ConfigError
    from syncopate.moe import dispatch_gemm, exchange_layout
    from syncopate.search_space.moe_workload import MoeCandidate

    gen = torch.Generator(device=device).manual_seed(rank)
    ids = torch.stack([torch.randperm(4 * world, device=device, generator=gen)[:2] for _ in range(64)])
    layout = exchange_layout(ids, 4 * world, group)
    x = torch.randn(64, 32, device=device, generator=gen).bfloat16()
    w = torch.randn(4, 32, 16, device=device, generator=gen).bfloat16()
    lines = []
    try:
        dispatch_gemm(x, w, layout, group, config=MoeCandidate(template="pipelined", backend="nvshmem"))
        lines.append(f"rank {rank}: backend nvshmem ran without NVSHMEM memory")
    except ConfigError as e:
        if not (str(e).startswith("backend 'nvshmem' needs NVSHMEM") and "'copy_engine'" in str(e)):
            lines.append(f"rank {rank}: the refusal does not name the fix: {e}")
    plan = MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=2)
    got = dispatch_gemm(x, w, layout, group, config=plan)
    if not torch.equal(got, dispatch_gemm(x, w, layout, group)):
        lines.append(f"rank {rank}: copy_engine after the refusal differs from unfused")
    return lines


def check_routing_stats(rank, world, device, group) -> list[str]:
    """The pair counts and checks of a routing on the GPU (one Triton kernel) equal the CPU's torch
    steps, for distinct, repeated and out-of-range ids, and so do the layout's expert-side
    permutations; a routing with a repeat on one rank is refused on every rank, naming that rank."""
    from syncopate.errors import ConfigError
    from syncopate.moe import exchange_layout
    from syncopate.moe.routing import pair_stats

    experts, lines = 4 * world, []
    gen = torch.Generator().manual_seed(rank)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:3] for _ in range(3000)])
    repeated, outside = ids.clone(), ids.clone()
    repeated[1500, 2] = repeated[1500, 0]
    outside[7, 1] = experts
    for name, case in (("distinct", ids), ("repeated", repeated), ("outside", outside)):
        want = pair_stats(case, experts)
        got = pair_stats(case.to(device), experts)
        if got[0].tolist() != want[0].tolist() or got[1].tolist() != want[1].tolist():
            lines.append(f"rank {rank}: {name} ids: GPU stats {got[1].tolist()} != CPU {want[1].tolist()}")
    from syncopate.moe.routing import _expert_orders

    layout = exchange_layout(ids.to(device), experts, group)
    for name, got, want in zip(
        ("expert order", "its inverse"),
        (layout.expert_order, layout.expert_order_inverse),
        _expert_orders(layout.recv_counts, torch.device("cpu")),
    ):
        if got.tolist() != want.tolist():
            lines.append(f"rank {rank}: the layout's {name} on the GPU differs from the CPU's")
    try:
        exchange_layout((repeated if rank == world - 1 else ids).to(device), experts, group)
        lines.append(f"rank {rank}: a repeated expert on rank {world - 1} was accepted")
    except ConfigError as e:
        if f"rank {world - 1}'s" not in str(e) or "repeat" not in str(e):
            lines.append(f"rank {rank}: the refusal does not say which rank and what: {e}")
    return lines


def check_exchange_alone(rank, world, device, group) -> list[str]:
    """`pipelined.exchange_alone` (the bound's all-to-all alone on a backend): the peers' rows land
    where all_to_all_single puts them, both kinds, two backends, 1 and 2 pieces a peer, twice."""
    import torch.distributed as dist

    from syncopate.moe import exchange_layout
    from syncopate.moe.pipelined import exchange_alone
    from syncopate.search_space.moe_workload import MoeCandidate

    lines = []
    experts, top_k, tokens, width = 4 * world, 4, 384, 256
    for routing in _routings(world, experts, tokens, top_k)[:3]:
        ids = routing.expert_ids[rank].to(device)
        layout = exchange_layout(ids, experts, group)
        for kind in ("a2a_gemm", "gemm_a2a"):
            sent, got = (
                (layout.send_splits, layout.recv_splits)
                if kind == "a2a_gemm"
                else (layout.recv_splits, layout.send_splits)
            )
            for backend in ("nccl", "copy_engine"):
                for chunks in (1, 2):
                    config = MoeCandidate(template="pipelined", backend=backend, chunks_per_source=chunks)
                    for call in range(2):
                        rows = torch.randn(sum(sent), width, device=device).to(torch.bfloat16)
                        want = torch.empty(sum(got), width, device=device, dtype=torch.bfloat16)
                        dist.all_to_all_single(want, rows, got, sent, group=group)
                        recv = exchange_alone(rows, layout, group, config, kind)
                        starts = [sum(got[:q]) for q in range(world)]
                        for q in range(world):
                            lo, hi = starts[q], starts[q] + got[q]
                            if q != rank and not torch.equal(recv[lo:hi], want[lo:hi]):
                                lines.append(
                                    f"rank {rank} {kind} {backend} c{chunks} call {call}: rows from {q} differ"
                                )
    return lines


def _worker(rank, world, port, checks, shared_gpu, queue):
    import torch.distributed as dist

    from syncopate.measure.local_ranks import join_group
    from syncopate.moe import close_moe_contexts

    device = join_group(rank, world, port, shared_gpu=shared_gpu)
    try:
        lines = [line for check in checks for line in check(rank, world, device, dist.group.WORLD)]
        gathered = [None] * world
        dist.all_gather_object(gathered, lines)
        if rank == 0:
            queue.put([line for part in gathered for line in part])
    finally:
        close_moe_contexts()
        dist.destroy_process_group()


def run_checks(checks: tuple, world: int, what: str, shared_gpu: bool = False) -> None:
    """Each of `checks` (f(rank, world, device, group) → failure lines) on `world` GPU ranks, one
    process each (all on GPU 0 in a gloo group with `shared_gpu`); fails listing every rank's
    failures."""
    from syncopate.measure.local_ranks import spawn_ranks

    failures = spawn_ranks(_worker, world, args=(checks, shared_gpu), what=what)
    assert not failures, "\n".join(failures)


def _run(world: int) -> None:
    run_checks(
        (check_ops, check_routing_stats, check_exchange_alone, check_layer, check_refusal), world, "MoE check"
    )


@pytest.mark.multigpu
def test_pipelined_moe_ops_on_two_gpus():
    _run(2)


@pytest.mark.multigpu
def test_pipelined_moe_ops_on_four_gpus():
    if torch.cuda.device_count() < 4:
        pytest.skip(f"needs four CUDA GPUs on one host; {torch.cuda.device_count()} present")
    _run(4)


def _copy_engine_ops(rank, world, device, group) -> list[str]:
    return check_ops(rank, world, device, group, backends=("copy_engine",))


def _copy_engine_layer(rank, world, device, group) -> list[str]:
    return check_layer(rank, world, device, group, backends=("copy_engine",))


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_copy_engine_moe_ops_with_ranks_sharing_one_gpu(world):
    """The copy-engine plans (`pipelined` and `dedup`) on ranks sharing GPU 0: the same checks as
    on a GPU a rank, where one GPU is all there is."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_checks((_copy_engine_ops, _copy_engine_layer), world, "MoE check, one GPU", shared_gpu=True)


def _dedup_waits_for_nothing(rank, world, device, group) -> list[str]:
    """After a layout that carries every rank's rows a rank (`exchange_layout(dedup=True)`), the
    dedup tables, the pipelined dedup plans' and a dedup call read nothing back from the device:
    torch's sync debug mode raises at any host wait."""
    from syncopate.moe import dedup_pipelined, exchange_layout, gemm_combine
    from syncopate.moe.dedup import dedup_tables
    from syncopate.search_space.moe_workload import MoeCandidate

    hidden, ffn, experts, top_k, tokens = 256, 128, 4 * world, 4, 384
    from syncopate.moe import draw_routing
    from syncopate.search_space import RoutingSpec

    routing = draw_routing(
        world_size=world, tokens=tokens, experts=experts, top_k=top_k, spec=RoutingSpec(seed=1)
    )
    ids, gates = routing.expert_ids[rank].to(device), routing.gate_weights[rank].to(device)
    layout = exchange_layout(ids, experts, group, dedup=True)
    gen = torch.Generator(device=device).manual_seed(rank)
    h = torch.randn(layout.rows_received, ffn, generator=gen, device=device).bfloat16()
    w2 = (torch.randn(experts // world, ffn, hidden, generator=gen, device=device) / ffn**0.5).bfloat16()
    config = MoeCandidate(template="dedup")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dedup_tables(layout, group)
        dedup_pipelined.tables(
            layout, "gemm_a2a", group, MoeCandidate(template="dedup", backend="copy_engine"), device
        )
        gemm_combine(h, w2, gates, layout, group, config=config)
    except RuntimeError as e:
        return [f"rank {rank}: a host wait after the layout: {e}"]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return []


@pytest.mark.gpu
def test_dedup_tables_wait_for_nothing_after_a_layout_that_carries_their_counts():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_checks((_dedup_waits_for_nothing,), 1, "dedup host waits, one GPU")
