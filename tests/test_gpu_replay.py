"""Layer: two and four GPUs. Eager calls replayed from their own CUDA graphs (`set_launch("graph")`;
`syncopate.kernels.replay`): for every kind with each backend that replays and each
stationary template, calls back to back whose tensors cycle through three sets of addresses with
fresh inputs and poisoned outputs, right against float32; a program keeps one graph per address set
(three captures, every later call a replay); calls launched directly (`set_launch("direct")`) and a
caller's own CUDA graph of the op, between them, right too. `auto` keeps the way its timed calls
found faster, replays a program whose host paces its calls (a synchronize before each), and gets
every call right whichever it keeps, also where the GPU always has work queued."""

from __future__ import annotations

import pytest
from test_gpu_capture import _assert_all_right
from test_gpu_ops import needs_gpus, run_ranks

pytestmark = pytest.mark.timeout(900)

ROUNDS = 4
SETS = 3


def _worker(rank, world, port, queue):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist
    from support.capture_check import OPS, Inputs, _error, candidate

    import syncopate
    from syncopate.kernels import ops
    from syncopate.search_space import a_stationary_candidate, c_stationary_candidate, decomposed_candidate

    group = dist.group.WORLD
    gen = torch.Generator(device=dev)
    gen.manual_seed(23 + rank)
    stationary = {
        "ag_gemm": a_stationary_candidate(2),
        "gemm_rs": c_stationary_candidate(),
        "gemm_ar": c_stationary_candidate(2),
    }
    report = []
    try:
        for kind in OPS:
            for cand in (
                candidate("copy_engine"),
                candidate("sm_copy"),
                stationary[kind],
                decomposed_candidate(2),
            ):
                op, x = OPS[kind], Inputs(kind, world, dev, gen)
                b = x.b()
                sets = [(x.a(), x.poisoned()) for _ in range(SETS)]
                errors = []
                ops.set_launch("graph")
                op(sets[0][0], b, group, cand, out=sets[0][1])  # the program's first call: direct
                for _ in range(ROUNDS):
                    for a, out in sets:
                        a.copy_(x.a())
                        out.fill_(float("nan"))
                        op(a, b, group, cand, out=out)
                        errors.append(_error(kind, out, a, b, group))
                key = ops._call_key(kind, sets[0][0], b, group, cand, ops.get_mode())
                replayed = ops._REGISTRY.programs[key].__dict__.get("launch_graph")
                captures = -1 if replayed is None else replayed.captures
                ops.set_launch("direct")  # directly, between replays
                a, out = x.a(), x.poisoned()
                op(a, b, group, cand, out=out)
                errors.append(_error(kind, out, a, b, group))
                graph = torch.cuda.CUDAGraph()  # the caller's own capture
                with torch.cuda.graph(graph):
                    op(sets[1][0], b, group, cand, out=sets[1][1])
                ops.set_launch("graph")
                for a, out in sets:
                    a.copy_(x.a())
                    out.fill_(float("nan"))
                    op(a, b, group, cand, out=out)
                    errors.append(_error(kind, out, a, b, group))
                sets[1][0].copy_(x.a())
                sets[1][1].fill_(float("nan"))
                graph.replay()
                errors.append(_error(kind, sets[1][1], sets[1][0], b, group))
                torch.cuda.synchronize()
                failure = None
                if max(errors) > 1e-2:
                    failure = f"relative errors {[f'{e:.3g}' for e in errors]}"
                elif captures != SETS:
                    failure = f"{captures} graphs captured for {SETS} address sets"
                report.append(
                    (f"{kind} {cand.short()}", failure, f"max rel err {max(errors):.3g}, {captures} captures")
                )
    finally:
        ops.set_launch("auto")
        syncopate.close_contexts()
        dist.destroy_process_group()
    queue.put((rank, report))


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4])
def test_eager_calls_replayed_from_their_graphs_are_right(world):
    needs_gpus(world)
    _assert_all_right(run_ranks(_worker, world, (), timeout=880), 12)


def _auto_worker(rank, world, port, queue):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist
    from support.capture_check import OPS, Inputs, _error, candidate

    import syncopate
    from syncopate.kernels import ops, replay

    group = dist.group.WORLD
    gen = torch.Generator(device=dev)
    gen.manual_seed(31 + rank)
    report = []
    try:
        ops.set_launch("auto")
        for kind in OPS:
            for busy, shape in (
                (False, None),
                (True, (1056, 768, 512) if kind == "ag_gemm" else (1056, 512, 768)),
            ):
                x = Inputs(kind, world, dev, gen, shape=shape)
                cand = candidate("copy_engine")
                b = x.b()
                errors = []
                for _ in range(replay.WARM + replay.SAMPLES + 6):
                    a, out = x.a(), x.poisoned()
                    if busy:
                        torch.cuda._sleep(20_000_000)  # the GPU has work queued: never dry
                    else:
                        torch.cuda.synchronize()  # the GPU waits for this host
                    OPS[kind](a, b, group, cand, out=out)
                    errors.append(_error(kind, out, a, b, group))
                key = ops._call_key(kind, a, b, group, cand, ops.get_mode())
                choice = ops._REGISTRY.programs[key].__dict__.get("launch_auto")
                replays = choice is not None and choice.replayed is not None
                figures = None if choice is None else choice.figures
                failure = None
                if max(errors) > 1e-2:
                    failure = f"relative errors {[f'{e:.3g}' for e in errors]}"
                elif figures is None:
                    failure = "auto did not decide"
                elif replays != (figures[1] < figures[0]):
                    failure = f"kept the slower way: replayed={replays}, (direct, replayed) us {figures}"
                elif not busy and not replays:
                    failure = f"dry stream: launched directly, (direct, replayed) us {figures}"
                report.append(
                    (f"{kind} {'busy' if busy else 'dry'}", failure, f"replayed={replays} {figures}")
                )
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()
    queue.put((rank, report))


@pytest.mark.multigpu
def test_auto_keeps_the_faster_way_and_replays_where_the_host_paces_the_calls():
    needs_gpus(2)
    _assert_all_right(run_ranks(_auto_worker, 2, (), timeout=600), 6)
