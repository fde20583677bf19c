"""Calls made one by one against the same calls replayed from a CUDA graph: the fused ops and
torch's unfused path (NCCL collective and cuBLAS matmul), and with two or more ranks torch's fused
symmetric-memory ops (async-TP), on shapes small enough for a call's host time to show.

Per case: results against float32 after a replay; then 15 rounds of 10 calls back to back, each
round timed with events from its first enqueue to its last kernel's end (the device waits for the
host where the host is slower), eagerly and as one replay of a graph holding the same 10 calls;
medians, µs a call. The fused ops take the configuration `syncopate.lookup` gives a job here. One GPU a rank
(`--ranks N`, default every visible GPU); rank 0 prints a table
and writes the numbers as JSON (`--out`: the GPU, the torch version and a row per case, with the
configuration the fused op ran). A last row, `entry`, times what a captured call adds
before its work: the start that clears the signal pads with the group met (10 in a graph).

    python benchmarks/graph_calls.py [--ranks N] [--shape MxNxK ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys

import torch
import torch.distributed as dist

import syncopate
from syncopate.kernels.library import OP_NAMES, unfused
from syncopate.measure.local_ranks import join_group, spawn_ranks
from syncopate.measure.reference import reference, relative_error
from syncopate.measure.timing import barrier
from syncopate.search_space import Workload

SHAPES = [(m, 4096, 4096) for m in (256, 1024, 4096)]
KINDS = ("ag_gemm", "gemm_rs", "gemm_ar")
CALLS = 10
ROUNDS = 15


def impls(kind: str, m: int, ws: int, group) -> dict:
    """name: fn(a, b) -> output, for this kind; the fused op with the configuration a job's lookup gives."""
    fused = getattr(syncopate, OP_NAMES[kind])
    out = {"fused": lambda a, b: fused(a, b, group), "torch": lambda a, b: unfused(kind, a, b, group)}
    if ws > 1 and kind != "gemm_ar":  # torch has no fused matmul all-reduce
        importlib.import_module("torch.distributed._symmetric_memory")  # registers torch.ops.symm_mem
        name = group.group_name
        if kind == "ag_gemm":
            out["async_tp"] = lambda a, b: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, name)[1][0]
        else:
            out["async_tp"] = lambda a, b: torch.ops.symm_mem.fused_matmul_reduce_scatter(
                a, b, "sum", 0, name
            )
    return out


def served(kind: str, shape: tuple[int, int, int], group) -> str:
    """The configuration the fused op's calls ran (what `syncopate.lookup` answers here, eager mode),
    with the rung it came from."""
    from syncopate.platform import detect_topology

    r = syncopate.lookup(shape, detect_topology(group), kind=kind)
    return f"{r.candidate.short()} ({r.match})"


def timed(run, group, dev) -> float:
    """Median µs a call over ROUNDS rounds of `run()` (CALLS calls)."""
    times = []
    for _ in range(ROUNDS):
        barrier(group, dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return statistics.median(times)


def case(kind: str, shape: tuple[int, int, int], group, dev) -> list[dict]:
    ws = dist.get_world_size(group)
    m, n, k = shape
    local = Workload(kind=kind, shape=shape, dtype="bf16").local_shapes(ws)
    a = torch.randn(local["a"], device=dev).bfloat16()
    b = (torch.randn(local["b"], device=dev) / local["b"][0] ** 0.5).bfloat16()
    rows = []
    for name, fn in impls(kind, m, ws, group).items():
        for _ in range(3):  # outside any capture first: contexts, kernels, NCCL's connections
            fn(a, b)
        torch.cuda.synchronize()
        barrier(group, dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [fn(a, b) for _ in range(CALLS)]
        graph.replay()
        torch.cuda.synchronize()
        err = max(relative_error(o, reference(kind, a, b, group)) for o in outs[-1:])

        def eager(fn=fn):
            for _ in range(CALLS):
                fn(a, b)

        rows.append(
            {
                "kind": kind,
                "shape": list(shape),
                "ranks": ws,
                "impl": name,
                "config": served(kind, shape, group) if name == "fused" else name,
                "rel_err": err,
                "eager_us": timed(eager, group, dev),
                "graph_us": timed(graph.replay, group, dev),
            }
        )
        del graph, outs
    return rows


def entry_row(group, dev) -> dict:
    """The captured calls' start alone (`OverlapContext.begin_call` under capture), CALLS of them in a
    graph and eagerly, on a context of the fused templates (made here where no call made one: the
    configurations served may all be unfused)."""
    from syncopate.kernels.ops import get_context

    ctx = get_context("ag_gemm", group, (1024 * dist.get_world_size(group), 1024), torch.bfloat16)
    stream = torch.cuda.current_stream(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            ctx.begin_call(torch.cuda.current_stream(dev))

    def eager():
        for _ in range(CALLS):
            ctx.begin_call(stream)

    row = {"kind": "entry", "shape": [0, 0, 0], "ranks": dist.get_world_size(group), "impl": "fused"}
    row.update(rel_err=0.0, eager_us=timed(eager, group, dev), graph_us=timed(graph.replay, group, dev))
    del graph
    return row


def run_rank(rank: int, world: int, port: int, shapes, out: str | None, results) -> None:
    dev = join_group(rank, world, port)
    try:
        rows = [row for kind in KINDS for shape in shapes for row in case(kind, shape, dist.group.WORLD, dev)]
        rows.append(entry_row(dist.group.WORLD, dev))
        syncopate.close_contexts()
        if rank == 0:
            gpu = torch.cuda.get_device_name(dev)
            print_table(rows, gpu)
            if out:
                with open(out, "w") as f:
                    json.dump(
                        {"gpu": gpu, "ranks": world, "torch": torch.__version__, "rows": rows}, f, indent=1
                    )
            results.put(rows)
    finally:
        dist.destroy_process_group()


def print_table(rows: list[dict], device: str) -> None:
    print(f"\n{device}, {rows[0]['ranks']} rank(s), µs a call (median of {ROUNDS} rounds of {CALLS} calls)")
    print("| op | M×N×K | impl | eager | graph | eager/graph | graph: torch/impl | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    torch_graph = {(r["kind"], tuple(r["shape"])): r["graph_us"] for r in rows if r["impl"] == "torch"}
    for r in rows:
        shape = "×".join(map(str, r["shape"]))
        vs = torch_graph.get((r["kind"], tuple(r["shape"])), float("nan")) / r["graph_us"]
        print(
            f"| {r['kind']} | {shape} | {r['impl']} | {r['eager_us']:.1f} | {r['graph_us']:.1f} | "
            f"{r['eager_us'] / r['graph_us']:.2f} | {vs:.3f} | {r['rel_err']:.2e} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--ranks", type=int, default=0, help="ranks, one GPU each (default: every visible GPU)"
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=None,
        help="global M×N×K (repeatable; default 256, 1024 and 4096 rows of 4096×4096)",
    )
    parser.add_argument("--out", help="write every row as JSON here")
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in s.lower().replace("×", "x").split("x")) for s in args.shape or []]
    except ValueError:
        shapes = [()]
    if any(len(s) != 3 or min(s) < 1 for s in shapes):
        print(
            f"graph_calls: --shape {args.shape}: give M×N×K as three positive integers, e.g. 8192x4096x4096",
            file=sys.stderr,
        )
        return 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ranks = args.ranks or gpus
    if gpus < 1:
        print("graph_calls: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    if not 1 <= ranks <= gpus:
        print(f"graph_calls: --ranks {args.ranks}: give 1 to {gpus}, one GPU a rank", file=sys.stderr)
        return 2
    spawn_ranks(run_rank, ranks, (shapes or SHAPES, args.out), what="graph_calls rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
