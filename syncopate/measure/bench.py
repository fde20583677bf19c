"""`syncopate bench`: baselines and the best candidate per backend, side by side, in one run.

One process per GPU (spawned here, NCCL process group). For each workload: torch_seq,
torch async-TP, the GEMM alone, the collective alone (NCCL and copy engine), the overlap bound
max(GEMM alone, fastest collective alone), and every candidate of a small grid per backend, each
verified then timed by the one method of `syncopate.measure.timing`. Rank 0 prints the table and
writes every number as JSON.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncopate.files import write_atomically
from syncopate.search_space import (
    BACKEND_NAMES,
    COPY_ENGINE_KINDS,
    DEFAULT_BACKENDS,
    Candidate,
    Workload,
    bench_grid,
)

__all__ = ["BenchOptions", "bench_grid", "run_bench", "format_table"]

log = logging.getLogger(__name__)


@dataclass
class BenchOptions:
    workloads: list[Workload]
    out_json: Path | None = None
    warmup: int = 5
    repetitions: int = 20
    flush_l2: bool = True
    grid: str = "small"
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    """Backends of the grid; with `nvshmem` among them (or among `extra`'s) every rank's symmetric
    memory is NVSHMEM's (`syncopate.use_nvshmem`), and torch async-TP is left out: it does not run
    there."""
    extra: list[Candidate] = field(default_factory=list)


def _worker(rank: int, world: int, port: int, options: BenchOptions, queue) -> None:
    from syncopate.measure.local_ranks import join_group

    join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.measure.harness import Harness

    if "nvshmem" in options.backends or any(c.backend == "nvshmem" for c in options.extra):
        from syncopate.kernels.symmetric_memory import use_nvshmem

        use_nvshmem()  # before the first symmetric allocation of this process

    group = dist.group.WORLD
    from syncopate.platform import detect_topology

    topology = detect_topology(group)
    rows = []
    try:
        for workload in options.workloads:
            t0 = time.time()
            h = Harness(workload, group, options)  # its warmup, repetitions and flush_l2
            base = {
                b.name: {
                    "median_us": statistics.median(b.samples_us),
                    "samples_us": list(b.samples_us),
                    "detail": b.detail,
                    "eager_us": b.eager_us,
                    "host_us": b.host_us,
                }
                for b in h.measure_baselines()
            }
            trials = []
            grid = bench_grid(workload, topology, options.grid, options.backends) + options.extra
            if rank == 0:
                print(
                    f"{workload.key()}: baselines "
                    + ", ".join(f"{k} {v['median_us']:.1f} us" for k, v in base.items())
                    + f"; {len(grid)} candidates",
                    flush=True,
                )
            for i, c in enumerate(grid):
                r = h.run_candidate(c)
                if rank == 0:
                    median = f"{statistics.median(r.samples_us):.1f} us" if r.samples_us else r.error[:120]
                    print(f"  [{i + 1}/{len(grid)}] {c.short()}: {r.status} {median}", flush=True)
                trials.append(
                    {
                        "candidate": c.to_dict(),
                        "short": c.short(),
                        "status": r.status,
                        "error": r.error,
                        "max_rel_error": r.max_rel_error,
                        "host_us": r.host_us,
                        "eager_us": r.eager_us,
                        "median_us": statistics.median(r.samples_us) if r.samples_us else None,
                        "samples_us": list(r.samples_us),
                    }
                )
            h.close()
            rows.append(
                {
                    "workload": workload.to_dict(),
                    "key": workload.key(),
                    "baselines": base,
                    "trials": trials,
                    "seconds": time.time() - t0,
                }
            )
            if rank == 0:
                print(format_row_progress(rows[-1]), flush=True)
        if rank == 0:
            from syncopate.environment import current_environment, git_revision, kernel_switches

            queue.put(
                {
                    "topology": topology.to_dict(),
                    "rows": rows,
                    "host": socket.gethostname(),
                    "gpu": torch.cuda.get_device_name(0),
                    "torch": torch.__version__,
                    "environment": current_environment().to_dict(),
                    "git": git_revision(),
                    "switches": kernel_switches(),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "backend_names": BACKEND_NAMES,
                }
            )
    finally:
        dist.destroy_process_group()


def format_row_progress(row: dict) -> str:
    ok = [t for t in row["trials"] if t["status"] == "ok"]
    best = min(ok, key=lambda t: t["median_us"]) if ok else None
    return (
        f"{row['key']}: {len(ok)}/{len(row['trials'])} candidates ok, best "
        f"{best['median_us']:.1f} us {best['short']}"
        if best
        else f"{row['key']}: no candidate ran"
    )


def summarize_row(row: dict) -> dict[str, Any]:
    base = {k: v["median_us"] for k, v in row["baselines"].items()}
    comm = min(v for k, v in base.items() if k.startswith("comm_alone"))
    bound = max(base["gemm_alone"], comm)
    per_backend = {}  # by backend; the copy-engine templates of cuBLAS GEMMs apart, as "cublas"
    for t in row["trials"]:
        if t["status"] == "ok":
            b = "cublas" if t["candidate"].get("template") in COPY_ENGINE_KINDS else t["candidate"]["backend"]
            if b not in per_backend or t["median_us"] < per_backend[b]["median_us"]:
                per_backend[b] = t
    ours = min((t["median_us"] for t in per_backend.values()), default=None)
    eager = [t["eager_us"] for t in row["trials"] if t["status"] == "ok" and t.get("eager_us") is not None]
    eager_base = [
        v["eager_us"]
        for k, v in row["baselines"].items()
        if k in ("torch_seq", "torch_async_tp") and v.get("eager_us") is not None
    ]
    torch_paths = [base[k] for k in ("torch_seq", "torch_async_tp") if k in base]
    return {
        "base": base,
        "bound": bound,
        "per_backend": per_backend,
        "ours": ours,
        "best_torch": min(torch_paths, default=None),
        "ours_eager": min(eager, default=None),
        "best_torch_eager": min(eager_base, default=None),
    }


def format_table(result: dict) -> str:
    """The benchmark table: device times in µs and the ratios bound/ours, async-TP/ours, seq/ours,
    best torch path/ours (the faster of seq and async-TP); then in eager mode (back-to-back calls,
    host on the path) ours and best torch path/ours. CE, SM, NVSHMEM and NCCL are the best fused
    candidates of each backend; cuBLAS the best of the templates whose GEMMs are cuBLAS's and whose transfers
    the copy engine's (a_stationary, c_stationary, decomposed)."""
    head = (
        "kind",
        "N",
        "K",
        "seq",
        "asyncTP",
        "gemm",
        "nccl",
        "ce",
        "bound",
        "CE",
        "SM",
        "NVSHMEM",
        "NCCL",
        "cuBLAS",
        "ours",
        "bound/ours",
        "async/ours",
        "seq/ours",
        "torch/ours",
        "eager ours",
        "eager torch/ours",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in result["rows"]:
        w = row["workload"]
        s = summarize_row(row)
        b, pb, ours = s["base"], s["per_backend"], s["ours"]

        def f(x):
            return f"{x:.1f}" if isinstance(x, (int, float)) else "–"

        def ratio(x):
            return f"{x / ours:.3f}" if (ours and isinstance(x, (int, float))) else "–"

        lines.append(
            " | ".join(
                [
                    w["kind"],
                    str(w["n"]),
                    str(w["k"]),
                    f(b.get("torch_seq")),
                    f(b.get("torch_async_tp")),
                    f(b.get("gemm_alone")),
                    f(b.get("comm_alone")),
                    f(b.get("comm_alone_copy_engine")),
                    f(s["bound"]),
                    f(pb.get("copy_engine", {}).get("median_us")),
                    f(pb.get("sm_copy", {}).get("median_us")),
                    f(pb.get("nvshmem", {}).get("median_us")),
                    f(pb.get("nccl", {}).get("median_us")),
                    f(pb.get("cublas", {}).get("median_us")),
                    f(ours),
                    ratio(s["bound"]),
                    ratio(b.get("torch_async_tp")),
                    ratio(b.get("torch_seq")),
                    ratio(s["best_torch"]),
                    f(s["ours_eager"]),
                    f"{s['best_torch_eager'] / s['ours_eager']:.3f}"
                    if s["ours_eager"] and s["best_torch_eager"]
                    else "–",
                ]
            )
        )
    return "\n".join(lines)


def format_layer_totals(result: dict) -> str:
    """The sums over the run's workloads, read as one layer's ops (`syncopate bench --model`):
    torch's collective and matmul in sequence, async-TP, ours and the overlap bound (device time),
    and what ours and the bound save a layer over torch's sequence. Empty where a workload lacks a
    verified candidate or a baseline (its sum would mislead)."""
    summaries = [summarize_row(row) for row in result["rows"]]
    if not summaries or any(s["ours"] is None or "torch_seq" not in s["base"] for s in summaries):
        return ""
    seq = sum(s["base"]["torch_seq"] for s in summaries)
    ours = sum(s["ours"] for s in summaries)
    bound = sum(s["bound"] for s in summaries)
    async_tp = [s["base"].get("torch_async_tp") for s in summaries]
    async_text = f", async-TP {sum(async_tp):.1f}" if None not in async_tp else ""
    return (
        f"the layer's {len(summaries)} ops, forward and backward, summed (device time, us): torch seq {seq:.1f}"
        f"{async_text}, ours {ours:.1f}, bound {bound:.1f}; ours saves {seq - ours:.1f} us a layer over torch's "
        f"sequence, the bound {seq - bound:.1f} (what any overlap of these ops could save; a step of L layers "
        f"gains at most L times that)"
    )


def run_bench(options: BenchOptions, world_size: int | None = None) -> dict:
    """Spawn one process per GPU, run the benchmark, return rank 0's result (and write the JSON)."""
    import torch

    from syncopate.measure.local_ranks import spawn_ranks

    world = world_size or torch.cuda.device_count()
    result = spawn_ranks(_worker, world, (options,), "benchmark")
    if options.out_json:
        options.out_json.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(options.out_json, json.dumps(result, indent=1).encode())
    return result


if __name__ == "__main__":  # pragma: no cover - a convenience for `python -m syncopate.measure.bench`
    sys.exit("use `syncopate bench`")
