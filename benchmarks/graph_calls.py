"""Calls made one by one against the same calls replayed from a CUDA graph: the fused ops and
torch's unfused path (NCCL collective and cuBLAS matmul), and with two or more ranks torch's fused
symmetric-memory ops (async-TP), on shapes small enough for a call's host time to show.

Per case: results against float32 after a replay; then 15 rounds of 10 calls back to back, each
round timed with events from its first enqueue to its last kernel's end (the device waits for the
host where the host is slower), eagerly and as one replay of a graph holding the same 10 calls;
medians, µs a call. What a replay costs the host besides: the graph's nodes a call, by type
(kernels, copies, stream memory operations, …), and the host's µs a call to launch the graph with
the device kept busy (`time_host`; the slowest rank's). The fused ops take the configuration
`syncopate.lookup` gives a job here, and each `--config` (a candidate as JSON, repeatable) besides.
One GPU a rank (`--ranks N`, default every visible GPU); rank 0 prints a table and writes the
numbers as JSON (`--out`: the GPU, the torch version and a row per case, with the configuration the
fused op ran; written again after each case, `complete` once every case is in). A first row,
`entry`, times what a captured call adds before its work: the start that clears the signal pads with
the group met (10 in a graph).

    python benchmarks/graph_calls.py [--ranks N] [--shape MxNxK ...] [--config JSON ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import importlib
import json
import statistics
import sys

import torch
import torch.distributed as dist

import syncopate
from syncopate.errors import ConfigError
from syncopate.kernels.library import OP_NAMES, unfused
from syncopate.measure.local_ranks import join_group, spawn_ranks
from syncopate.measure.reference import reference, relative_error
from syncopate.measure.timing import barrier, time_host
from syncopate.search_space import PLANLESS_KINDS, Candidate, Workload

SHAPES = [(m, 4096, 4096) for m in (256, 1024, 4096)]
KINDS = ("ag_gemm", "gemm_rs", "gemm_ar")
CALLS = 10
ROUNDS = 15


NODE_TYPES = {
    0: "kernel",
    1: "memcpy",
    2: "memset",
    3: "host",
    4: "graph",
    5: "empty",
    6: "event_wait",
    7: "event_record",
    10: "mem_alloc",
    11: "mem_free",
    12: "mem_op",
    13: "conditional",
}
"""CUgraphNodeType values by name (the driver API's enumeration; mem_op: batched stream memory
operations, the waits and writes on signal words)."""


def graph_nodes(graph: torch.cuda.CUDAGraph) -> dict[str, int]:
    """How many nodes of each type `graph` (captured with keep_graph=True) holds, by the driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    raw = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    if cuda.cuGraphGetNodes(raw, None, ctypes.byref(count)):
        raise RuntimeError("cuGraphGetNodes failed")
    nodes = (ctypes.c_void_p * count.value)()
    if cuda.cuGraphGetNodes(raw, nodes, ctypes.byref(count)):
        raise RuntimeError("cuGraphGetNodes failed")
    kinds: collections.Counter = collections.Counter()
    for node in nodes[: count.value]:
        t = ctypes.c_int(-1)
        if cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)):
            raise RuntimeError("cuGraphNodeGetType failed")
        kinds[NODE_TYPES.get(t.value, f"type {t.value}")] += 1
    return dict(sorted(kinds.items()))


def impls(kind: str, m: int, ws: int, group, configs: tuple[Candidate, ...] = ()) -> dict:
    """name: fn(a, b) -> output, for this kind; the fused op with the configuration a job's lookup
    gives, and with each of `configs` (named by it)."""
    fused = getattr(syncopate, OP_NAMES[kind])
    out = {"fused": lambda a, b: fused(a, b, group), "torch": lambda a, b: unfused(kind, a, b, group)}
    for cand in configs:
        out[cand.short()] = lambda a, b, cand=cand: fused(a, b, group, config=cand)
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


def stage(group, what: str) -> None:
    """Say on stderr, from every rank, which stage of a case it starts (a stalled case says where)."""
    print(f"  rank {dist.get_rank(group)}: {what}", file=sys.stderr, flush=True)


def slowest(value: float, group, dev) -> float:
    """The largest of every rank's `value`."""
    from syncopate.kernels.ranks import slowest as each_slowest

    return each_slowest([value], group, dev)[0]


def fits(kind: str, cand: Candidate) -> bool:
    """Whether `cand`'s template runs `kind` (a --config may name a template of some kinds only)."""
    kinds = PLANLESS_KINDS.get(cand.template)
    return kinds is None or kind in kinds


def replay_costs(graph: torch.cuda.CUDAGraph, group, dev) -> dict:
    """What a call replayed from `graph` (CALLS calls, captured with keep_graph=True) costs the host:
    the slowest rank's µs a call to launch the replay, and the graph's nodes a call by type."""
    return {
        "replay_host_us": slowest(time_host(graph.replay, calls=3) / CALLS, group, dev),
        "nodes": {t: c / CALLS for t, c in graph_nodes(graph).items()},
    }


def case(
    kind: str, shape: tuple[int, int, int], group, dev, configs: tuple[Candidate, ...] = ()
) -> list[dict]:
    ws = dist.get_world_size(group)
    m, n, k = shape
    local = Workload(kind=kind, shape=shape, dtype="bf16").local_shapes(ws)
    a = torch.randn(local["a"], device=dev).bfloat16()
    b = (torch.randn(local["b"], device=dev) / local["b"][0] ** 0.5).bfloat16()
    rows = []
    configs = tuple(c for c in configs if fits(kind, c))
    for name, fn in impls(kind, m, ws, group, configs).items():
        if dist.get_rank(group) == 0:
            print(f"{kind} {m}×{n}×{k} {name} …", flush=True)
        stage(group, "warm-up (eager)")
        for _ in range(3):  # outside any capture first: contexts, kernels, NCCL's connections
            fn(a, b)
        torch.cuda.synchronize()
        barrier(group, dev)
        stage(group, "capture")
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            outs = [fn(a, b) for _ in range(CALLS)]
        stage(group, "first replay")
        graph.replay()
        torch.cuda.synchronize()
        stage(group, "timing")
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
                **replay_costs(graph, group, dev),
            }
        )
        if dist.get_rank(group) == 0:
            print_row(rows[-1], rows)
        del graph, outs
    return rows


def entry_row(group, dev) -> dict:
    """The captured calls' start alone (`OverlapContext.begin_call` under capture), CALLS of them in a
    graph and eagerly, on a context of the fused templates (made here where no call made one: the
    configurations served may all be unfused)."""
    from syncopate.kernels.ops import get_context

    ctx = get_context("ag_gemm", group, (1024 * dist.get_world_size(group), 1024), torch.bfloat16)
    stream = torch.cuda.current_stream(dev)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            ctx.begin_call(torch.cuda.current_stream(dev))
    graph.replay()

    def eager():
        for _ in range(CALLS):
            ctx.begin_call(stream)

    row = {"kind": "entry", "shape": [0, 0, 0], "ranks": dist.get_world_size(group), "impl": "fused"}
    row.update(rel_err=0.0, eager_us=timed(eager, group, dev), graph_us=timed(graph.replay, group, dev))
    row.update(replay_costs(graph, group, dev))
    del graph
    return row


def run_rank(rank: int, world: int, port: int, shapes, kinds, out: str | None, configs, results) -> None:
    dev = join_group(rank, world, port)
    gpu = torch.cuda.get_device_name(dev)

    def write(rows: list[dict], complete: bool) -> None:
        """The rows so far as JSON (after each case: a run stopped midway keeps what it timed)."""
        if rank == 0 and out:
            doc = {"gpu": gpu, "ranks": world, "torch": torch.__version__, "complete": complete, "rows": rows}
            with open(out, "w") as f:
                json.dump(doc, f, indent=1)

    try:
        rows = [entry_row(dist.group.WORLD, dev)]
        if rank == 0:
            print_row(rows[0], rows)
        for kind in kinds:
            for shape in shapes:
                rows += case(kind, shape, dist.group.WORLD, dev, configs)
                write(rows, complete=False)
        syncopate.close_contexts()
        if rank == 0:
            print_table(rows, gpu)
            write(rows, complete=True)
            results.put(rows)
    finally:
        dist.destroy_process_group()


def print_table(rows: list[dict], device: str) -> None:
    print(f"\n{device}, {rows[0]['ranks']} rank(s), µs a call (median of {ROUNDS} rounds of {CALLS} calls)")
    print(
        "| op | M×N×K | impl | eager | graph | eager/graph | graph: torch/impl | replay host | "
        "nodes a call | rel err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print_row(r, rows)


def print_row(r: dict, rows: list[dict]) -> None:
    """One row of the table, its `graph: torch/impl` against torch's row of the same case in `rows`."""
    shape = "×".join(map(str, r["shape"]))
    torch_graph = {(t["kind"], tuple(t["shape"])): t["graph_us"] for t in rows if t["impl"] == "torch"}
    vs = torch_graph.get((r["kind"], tuple(r["shape"])), float("nan")) / r["graph_us"]
    print(
        f"| {r['kind']} | {shape} | {r['impl']} | {r['eager_us']:.1f} | {r['graph_us']:.1f} | "
        f"{r['eager_us'] / r['graph_us']:.2f} | {vs:.3f} | {r.get('replay_host_us', float('nan')):.1f} | "
        f"{nodes_text(r.get('nodes', {}))} | {r['rel_err']:.2e} |",
        flush=True,
    )


def nodes_text(nodes: dict[str, float]) -> str:
    """`kernel 2, memcpy 3` from a row's nodes a call."""
    return ", ".join(f"{t} {c:g}" for t, c in nodes.items()) or "–"


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
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="a candidate as JSON, timed beside the looked-up one (repeatable), e.g. "
        '\'{"template": "ring", "backend": "copy_engine", "num_splits": 2}\'',
    )
    parser.add_argument(
        "--kind",
        action="append",
        choices=KINDS,
        default=None,
        help="op kinds to time (repeatable; default all)",
    )
    parser.add_argument("--out", help="write every row as JSON here")
    args = parser.parse_args(argv)
    try:
        configs = tuple(Candidate.from_json(text) for text in args.config)
    except ConfigError as e:
        print(f"graph_calls: --config: {e}", file=sys.stderr)
        return 2
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
    spawn_ranks(
        run_rank,
        ranks,
        (shapes or SHAPES, tuple(args.kind or KINDS), args.out, configs),
        what="graph_calls rank",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
