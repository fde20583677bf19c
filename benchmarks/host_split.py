"""Where a call's host time goes, piece by piece, without a profiler's weight: the pieces a call is
made of (GEMM launches, events, the driver's stream operations, a context's signal writes, kernel
launches) are wrapped with a timer each, and each piece's own time (less the wrapped pieces it
calls) is summed over calls enqueued one at a time after a device sleep, so that the host never
waits for the device. What no piece accounts for is the call's own Python.

    python benchmarks/host_split.py gemm_ar 8192 4096 11008 [--template decomposed:4] [--gpus 2] [--calls 30]

One process a GPU; rank 0 prints µs a call by piece, and the whole call's host time with the
timers and without them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

_own: dict[str, float] = {}
_stack: list[float] = []  # the time the wrapped pieces called by each open piece took


def _timed(name: str, fn):
    def wrapper(*args, **kwargs):
        _stack.append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - t0
            inner = _stack.pop()
            _own[name] = _own.get(name, 0.0) + took - inner
            if _stack:
                _stack[-1] += took

    return wrapper


def wrap_pieces() -> None:
    """Put a timer on each piece a cuBLAS template's call is made of, where the templates find it."""
    import torch

    from syncopate.kernels import (a_stationary, c_stationary, context, decomposed, decomposed_gather, launch,
                                   streamops)

    torch.matmul = _timed("GEMM (torch.matmul)", torch.matmul)
    torch.Tensor.addmm_ = _timed("GEMM (addmm_)", torch.Tensor.addmm_)
    torch.Tensor.add_ = _timed("add_", torch.Tensor.add_)
    event = torch.cuda.Event
    event.__new__ = staticmethod(_timed("event made", event.__new__))
    event.record = _timed("event record", event.record)
    event.wait = _timed("event wait", event.wait)
    torch.cuda.Stream.wait_event = _timed("stream wait_event", torch.cuda.Stream.wait_event)
    for name in ("copy_async", "wait_value", "write_value"):
        setattr(streamops, name, _timed(f"driver {name}", getattr(streamops, name)))
    streamops.Program.run = _timed("stream program run", streamops.Program.run)
    ctx = context.OverlapContext
    for name in ("write_signal", "fork", "join", "begin_call", "current_stream"):
        setattr(ctx, name, _timed(f"context {name}", getattr(ctx, name)))
    launch.launch_pull = _timed("pull kernel launch", launch.launch_pull)
    for module in (a_stationary, c_stationary, decomposed, decomposed_gather):
        if hasattr(module, "run"):
            module.run = _timed(f"{module.__name__.rsplit('.', 1)[1]}.run (own)", module.run)


def worker(rank: int, world: int, port: int, args, queue) -> None:
    from syncopate.kernels.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    import syncopate
    from benchmarks.side_by_side import _candidate, parse_variant
    from syncopate.search_space import Workload

    template, splits, _ = parse_variant(args.template)
    candidate = _candidate(args.kind, template, splits)
    group = dist.group.WORLD
    shapes = Workload(kind=args.kind, shape=(args.m, args.n, args.k), dtype="bf16").local_shapes(world)
    a = torch.randn(shapes["a"], device=dev).to(torch.bfloat16)
    b = (torch.randn(shapes["b"], device=dev) / shapes["b"][0] ** 0.5).to(torch.bfloat16)
    op = {"ag_gemm": syncopate.all_gather_matmul, "gemm_rs": syncopate.matmul_reduce_scatter,
          "gemm_ar": syncopate.matmul_all_reduce}[args.kind]

    def calls(n: int) -> list[float]:
        took = []
        for _ in range(n):
            dist.barrier()
            torch.cuda.synchronize()
            torch.cuda._sleep(4_000_000)  # the device busy ~2 ms: the call is enqueued, never waited for
            t0 = time.perf_counter()
            op(a, b, group, candidate)
            took.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        return took

    calls(5)
    plain = calls(args.calls)
    wrap_pieces()
    calls(3)
    _own.clear()
    timed = calls(args.calls)
    if rank == 0:
        lines = [f"{args.kind} {args.m}x{args.n}x{args.k} {candidate.short()} on {world} GPUs, {args.calls} calls: "
                 f"host time a call {statistics.median(plain):.1f} µs (median), {statistics.median(timed):.1f} with "
                 f"the timers", f"{'µs a call':>10}  piece (own time, less the pieces it calls)"]
        pieces = sorted(_own.items(), key=lambda kv: -kv[1])
        for name, total in pieces:
            lines.append(f"{total / args.calls * 1e6:10.1f}  {name}")
        counted = sum(_own.values()) / args.calls * 1e6
        lines.append(f"{statistics.mean(timed) - counted:10.1f}  the rest (the op's entry: checks, look-up, output)")
        queue.put("\n".join(lines))
    dist.barrier()
    syncopate.close_contexts()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["ag_gemm", "gemm_rs", "gemm_ar"])
    parser.add_argument("m", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("--template", default="decomposed:4", help="TEMPLATE[:SPLITS] as side_by_side.py takes it")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    import torch

    if torch.cuda.device_count() < args.gpus:
        print(f"host_split: --gpus {args.gpus}: {torch.cuda.device_count()} GPU(s) visible", file=sys.stderr)
        return 1
    from syncopate.kernels.local_ranks import spawn_ranks

    print(spawn_ranks(worker, args.gpus, (args,), what="host_split rank"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
