"""The host time of the fused ops' calls, and their device time: results against float32 on fresh
inputs, six calls, then the host time of a call (median over 7 batches of 20 calls enqueued back to
back, each followed by a batch of torch's unfused path for the same op, timed alike) and its device
time (median of 20, each after a device sleep).

By default on one GPU in a group of one rank (no transfers; the rest of a call's path: the
context, the side streams, the local chunk copies and their signals, the kernel). With `--ranks N`
in a group of N ranks: one GPU a rank where there are N, else all N on GPU 0 (buffers through CUDA
IPC; the host time is a call's with its transfers, the device time is left out: the ranks take
turns on the GPU). The shapes are global (M, N, K); the times are the slowest rank's (each rank's
median, then the largest); rank 0 prints, and ends with a table of each op's host time over
torch's unfused path's.

    python benchmarks/op_host.py                        # kernels relaunched from the context's cache
    python benchmarks/op_host.py stationary             # the a_stationary / c_stationary templates
                                                        # (and all_gather_matmul's return_gathered with it)
    python benchmarks/op_host.py decomposed             # the decomposed templates, four splits
    python benchmarks/op_host.py --ranks 2              # two ranks, with transfers
    python benchmarks/op_host.py lookup --case ag_gemm:1024x4096x4096   # that op and shape, looked-up config
    python benchmarks/op_host.py torch --ranks 4        # torch's unfused path, for comparison
    python benchmarks/op_host.py --ranks 4 --launch graph   # calls replayed from their own graphs
    python benchmarks/op_host.py torch direct stationary decomposed --ranks 4 --launch direct graph \
        --json FILE                                     # several in one run, a table against torch's
    python benchmarks/op_host.py direct decomposed unfused --dtype fp8   # FP8 operands (row-wise
                                                        # scales) against torch's scaled path
    OP_HOST_PROFILE=FILE python benchmarks/op_host.py   # also 20 calls a case under cProfile, into FILE
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import queue
import statistics
import sys
import time
from datetime import datetime, timezone

import torch
import torch.distributed as dist

import syncopate
from syncopate.environment import provenance
from syncopate.kernels.library import unfused
from syncopate.kernels.scaled import quantize
from syncopate.measure.local_ranks import free_port, join_group, spawn_ranks
from syncopate.measure.reference import reference, relative_error
from syncopate.measure.timing import barrier
from syncopate.search_space import (
    Candidate,
    Workload,
    a_stationary_candidate,
    c_stationary_candidate,
    decomposed_candidate,
    unfused_candidate,
)

CANDIDATE = Candidate(
    backend="copy_engine",
    template="direct",
    num_splits=2,
    block_m=128,
    block_n=256,
    block_k=64,
    group_m=8,
    num_warps=8,
    num_stages=3,
    tile_order="arrival",
)
CASES = [("ag_gemm", (8192, 2048, 8192)), ("gemm_rs", (8192, 8192, 2048)), ("gemm_ar", (8192, 8192, 2048))]
STATIONARY = {
    "ag_gemm": a_stationary_candidate(2),
    "gemm_rs": c_stationary_candidate(),
    "gemm_ar": c_stationary_candidate(2),
}


def templates(what: str, ws: int) -> dict[str, Candidate | None]:
    """The candidate of each kind for `what` on `ws` ranks (None: torch's own path, no Syncopate call)."""
    kinds = ("ag_gemm", "gemm_rs", "gemm_ar")
    if what == "stationary":
        return STATIONARY
    if what == "decomposed":  # an all-gather's splits are 1 to ws-1 or a multiple of ws-1
        return dict.fromkeys(kinds, decomposed_candidate(max(1, ws - 1) if ws > 2 else 4))
    if what == "unfused":
        return dict.fromkeys(kinds, unfused_candidate())
    if what == "lookup":
        return dict.fromkeys(kinds, None)
    return dict.fromkeys(kinds, CANDIDATE)


def case(
    kind: str,
    m: int,
    n: int,
    k: int,
    group,
    dev: torch.device,
    candidate: Candidate | None = CANDIDATE,
    device_time: bool = True,
    torch_only: bool = False,
    dtype: str = "bf16",
) -> str:
    ops = {
        "ag_gemm": syncopate.all_gather_matmul,
        "gemm_rs": syncopate.matmul_reduce_scatter,
        "gemm_ar": syncopate.matmul_all_reduce,
    }
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    if candidate is None and not torch_only:  # the configuration a job's lookup gives
        candidate = syncopate.lookup(
            (m, n, k), syncopate.detect_topology(group), kind=kind, dtype=dtype
        ).candidate
    shapes = Workload(kind=kind, shape=(m, n, k), dtype="bf16").local_shapes(ws)
    k_local = shapes["b"][0]
    fp8 = dtype == "fp8"
    if fp8 and candidate is not None and candidate.template in ("direct", "ring", "bidirectional_ring"):
        candidate = dataclasses.replace(candidate, block_k=128)  # an FP8 tile
    scales = {}  # FP8: the operands' row-wise scales, made with them

    def op(a, b):
        if torch_only:
            return torch_op(a, b)  # torch's collective and matmul, no Syncopate call
        if fp8:
            return ops[kind](a, b, group, candidate, a_scale=scales["a"], b_scale=scales["b"])
        return ops[kind](a, b, group, candidate)

    def inputs():
        a = torch.randn(shapes["a"], device=dev)
        w = torch.randn(shapes["b"][::-1], device=dev) / k_local**0.5
        if not fp8:
            return a.to(torch.bfloat16), w.t().to(torch.bfloat16)
        a8, scales["a"] = quantize(a, 1)
        w8, sw = quantize(w, 1)  # B = w8.t(), column-major as torch._scaled_mm takes it
        scales["b"] = sw.reshape(1, -1).contiguous()
        return a8, w8.t()

    def check(out, a, b) -> float:
        if fp8:
            return relative_error(out, reference(kind, a, b, group, scales["a"], scales["b"]))
        return relative_error(out, reference(kind, a, b, group))

    def torch_op(a, b):
        if fp8:
            return unfused(kind, a, b, group, scales=(scales["a"], scales["b"]))
        return unfused(kind, a, b, group)

    if (
        kind == "ag_gemm" and not torch_only and not fp8
    ):  # the gathered A too (a stationary candidate takes the direct plan for it)
        a, b = inputs()
        out, gathered = syncopate.all_gather_matmul(a, b, group, candidate, return_gathered=True)
        torch.cuda.synchronize()
        rows = a.shape[0]
        assert torch.equal(gathered[rank * rows : (rank + 1) * rows], a)
        assert relative_error(out, reference(kind, a, b, group)) < 1e-2

    worst = 0.0
    for _ in range(6):
        a, b = inputs()
        out = op(a, b)
        torch.cuda.synchronize()
        worst = max(worst, check(out, a, b))
    a, b = inputs()
    for _ in range(3):
        op(a, b)
    torch.cuda.synchronize()

    def batch(fn) -> float:  # µs a call over 20 calls enqueued back to back, ranks started together
        barrier(group, dev)
        t0 = time.perf_counter()
        for _ in range(20):
            fn(a, b)
        took = (time.perf_counter() - t0) / 20 * 1e6
        torch.cuda.synchronize()
        return took

    for _ in range(3):
        torch_op(a, b)
    batches, torch_batches = [], []
    for _ in range(7):  # ours and torch's path in turn: both under the same conditions
        batches.append(batch(op))
        torch_batches.append(batch(torch_op))
    label = (
        "torch" if torch_only else f"{candidate.template}/s{candidate.num_splits} {syncopate.get_launch()}"
    ) + (" fp8" if fp8 else "")
    profile_to = os.environ.get("OP_HOST_PROFILE")
    if profile_to:  # where a call's host time goes: 20 calls under cProfile, appended to that file
        profiler = cProfile.Profile()
        barrier(group, dev)
        profiler.enable()
        for _ in range(20):
            op(a, b)
        profiler.disable()
        torch.cuda.synchronize()
        if rank == 0:
            stats = pstats.Stats(
                profiler
            ).stats  # {(file, line, name): (calls, ncalls, tottime, cumtime, callers)}
            rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:30]
            with open(profile_to, "a") as f:
                f.write(
                    f"== {kind} {m}x{n}x{k} ranks {ws} {label}: a call's host time under cProfile, "
                    f"{sum(v[2] for v in stats.values()) / 20 * 1e6:.1f} us\n"
                    f"{'own us':>8} {'cum us':>8} {'calls':>6}  function\n"
                )
                for (file, line, name), (_, ncalls, tottime, cumtime, _) in rows:
                    f.write(
                        f"{tottime / 20 * 1e6:8.1f} {cumtime / 20 * 1e6:8.1f} {ncalls / 20:6.1f}  "
                        f"{name} {os.path.basename(file)}:{line}\n"
                    )
    device_us = []
    for _ in range(20 if device_time else 0):
        barrier(group, dev)
        torch.cuda._sleep(3_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        op(a, b)
        end.record()
        torch.cuda.synchronize()
        device_us.append(start.elapsed_time(end) * 1000)
    # the slowest rank's medians (a collective waits for its slowest rank)
    mine = [
        statistics.median(batches),
        statistics.median(torch_batches),
        statistics.median(device_us) if device_us else 0.0,
        worst,
    ]
    from syncopate.kernels.ranks import slowest

    host_us, torch_host_us, dev_us, worst = slowest(mine, group, dev)
    return {
        "kind": kind,
        "shape": [m, n, k],
        "ranks": ws,
        "label": label,
        "rel_err": worst,
        "host_us": host_us,
        "torch_host_us": torch_host_us,
        "device_us": dev_us if device_us else None,
    }


def line(row: dict) -> str:
    m, n, k = row["shape"]
    device = "- (ranks share the GPU)" if row["device_us"] is None else f"{row['device_us']:.1f}"
    return (
        f"{row['kind']} {m}x{n}x{k} ranks {row['ranks']} {row['label']} rel_err {row['rel_err']:.2e} "
        f"host_us {row['host_us']:.1f} torch_host_us {row['torch_host_us']:.1f} device_us {device}"
    )


def table(rows: list[dict]) -> str:
    """Each op's host time a call, and over torch's unfused path's, timed in turn with it."""
    out = [
        "| op | shape | ranks | path | host µs | torch's host µs | host / torch's | device µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = r["torch_host_us"]
        ratio = f"{r['host_us'] / ref:.2f}"
        device = "-" if r["device_us"] is None else f"{r['device_us']:.1f}"
        shape = "x".join(str(d) for d in r["shape"])
        out.append(
            f"| {r['kind']} | {shape} | {r['ranks']} | {r['label']} | {r['host_us']:.1f} | {ref:.1f} | {ratio} "
            f"| {device} |"
        )
    return "\n".join(out)


def run_rank(
    rank: int, world: int, port: int, whats, shared: bool, cases, launches, dtype: str, results
) -> None:
    dev = join_group(rank, world, port, shared_gpu=shared)
    try:
        rows = []
        for what in whats:
            for launch in ("direct",) if what == "torch" else launches:
                syncopate.set_launch(launch)
                for kind, shape in cases:
                    cand = templates(what, world)[kind]
                    row = case(
                        kind,
                        *shape,
                        dist.group.WORLD,
                        dev,
                        cand,
                        device_time=not shared,
                        torch_only=what == "torch",
                        dtype=dtype,
                    )
                    if rank == 0:
                        print(line(row), flush=True)
                    rows.append(row)
                syncopate.close_contexts()
        if rank == 0:
            results.put(rows)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "what",
        nargs="*",
        choices=["direct", "stationary", "decomposed", "unfused", "torch", "lookup"],
        default=["direct"],
        help="the candidates: the direct chunked plan (default), the stationary, decomposed or "
        "unfused templates, the configuration a job's lookup gives, or torch's own unfused "
        "path (no Syncopate call), to compare",
    )
    parser.add_argument("--ranks", type=int, default=1, help="ranks in the group (default 1)")
    parser.add_argument(
        "--case",
        action="append",
        metavar="KIND:MxNxK",
        help="time this op and global shape instead of the default three (repeatable), "
        "e.g. ag_gemm:1024x4096x4096",
    )
    parser.add_argument(
        "--launch",
        nargs="+",
        choices=["direct", "graph", "auto"],
        default=["direct"],
        help="how the fused calls are launched (syncopate.set_launch): operation by operation (default), "
        "replayed from their own CUDA graphs, or auto; several: each in turn",
    )
    parser.add_argument(
        "--dtype",
        choices=["bf16", "fp8"],
        default="bf16",
        help="the operands: bf16 (default) or fp8 (e4m3, row-wise scales, bf16 out; torch's path is "
        "its collective on the FP8 bytes and torch._scaled_mm)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every row there, with the environment")
    args = parser.parse_args(argv)
    cases = CASES
    if args.case:
        try:
            cases = [
                (kind, tuple(int(d) for d in dims.split("x")))
                for kind, dims in (c.split(":") for c in args.case)
            ]
            assert all(kind in ("ag_gemm", "gemm_rs", "gemm_ar") and len(dims) == 3 for kind, dims in cases)
        except (ValueError, AssertionError):
            print(
                f"op_host: --case {args.case}: give KIND:MxNxK, KIND one of ag_gemm, gemm_rs, gemm_ar",
                file=sys.stderr,
            )
            return 2
    if not torch.cuda.is_available():
        print("op_host: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    if args.ranks < 1:
        print(f"op_host: --ranks {args.ranks}: give 1 or more", file=sys.stderr)
        return 2
    whats = list(dict.fromkeys(args.what))
    launches = list(dict.fromkeys(args.launch))
    shared = torch.cuda.device_count() < args.ranks
    if args.ranks == 1:
        results = queue.SimpleQueue()
        run_rank(0, 1, free_port(), whats, False, cases, launches, args.dtype, results)
        rows = results.get()
    else:
        if shared:
            print(
                f"op_host: {torch.cuda.device_count()} GPU(s) for {args.ranks} ranks: all on GPU 0, host time only",
                flush=True,
            )
        rows = spawn_ranks(
            run_rank, args.ranks, (whats, shared, cases, launches, args.dtype), what="op_host rank"
        )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": provenance(date=datetime.now(timezone.utc).isoformat(timespec="seconds")),
                    "shared_gpu": shared,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
