"""Backend `nvshmem` beside `sm_copy` and `copy_engine`, in one process a GPU whose symmetric memory
is NVSHMEM's, on three shapes of each kind.

    torchrun --nproc-per-node 4 benchmarks/nvshmem_bench.py [--json FILE] [--repetitions 20]

Each rank opts into NVSHMEM symmetric memory first (`syncopate.use_nvshmem()`), so every candidate
runs on NVSHMEM-backed buffers. Per kind (ag_gemm, gemm_rs, gemm_ar) and shape (global M tokens of
4096, 8192 and 16384; N and K of LLaMA-8B and 70B MLP widths), every candidate (copy_engine;
sm_copy and nvshmem with 16 and 32 communication SMs; direct plan, two chunks a block) is first
checked against the float32 reference (`syncopate.measure.reference`): two calls back to back on
fresh inputs into outputs poisoned with NaN, each within 1e-2 relative error. Then each is timed by
the project's device-time method (`syncopate.measure.timing.time_collective`: warm-up, L2 flush,
ranks started together, CUDA events, max over ranks, median), and so are torch's unfused path
(`syncopate.kernels.library.unfused`: the collective and the matmul in sequence), the GEMM alone
and the NCCL collective alone; bound = max(GEMM alone, collective alone), as `syncopate bench`
has it. Rank 0 prints a markdown table (kind, shape, candidate, µs, torch/ours, bound/ours) and
writes every figure as JSON (`--json`, by default $OUT/nvshmem_bench.json where OUT is set); every
rank logs to $OUT/nvshmem_bench.log[.rank<r>] where OUT is set. Exits 1 if a candidate is wrong
(after the table), 2 on a bad option, 1 without GPUs or NVSHMEM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TOLERANCE = 1e-2
"""Largest relative error accepted against the float32 reference (bf16 operands)."""

SHAPES = {
    "ag_gemm": [(4096, 14336, 4096), (8192, 14336, 4096), (16384, 28672, 8192)],
    "gemm_rs": [(4096, 4096, 14336), (8192, 4096, 14336), (16384, 8192, 28672)],
    "gemm_ar": [(4096, 4096, 14336), (8192, 4096, 14336), (16384, 8192, 28672)],
}
"""Global (M, N, K) per kind: LLaMA-8B's MLP (hidden 4096, ffn 14336) at 4096 and 8192 tokens, and
LLaMA-70B's (8192, 28672) at 16384; the all-gather feeds the up projection, the reductions the
down projection."""

log = logging.getLogger("nvshmem_bench")


def candidates() -> list:
    from syncopate.search_space import Candidate

    def cand(backend: str, sms: int) -> Candidate:
        return Candidate(
            backend=backend,
            template="direct",
            num_splits=2,
            comm_sms=sms,
            block_m=128,
            block_n=256,
            block_k=64,
            group_m=8,
            num_warps=8,
            num_stages=3,
        )

    return [cand("copy_engine", 0)] + [cand(b, sms) for b in ("sm_copy", "nvshmem") for sms in (16, 32)]


def _median(samples) -> float:
    return statistics.median(samples)


def run_case(kind: str, shape: tuple[int, int, int], group, device, args) -> dict:
    """One kind and shape: the baselines, then each candidate checked and timed; the row (alike on
    every rank: times are max over ranks)."""
    import torch
    import torch.distributed as dist

    import syncopate
    from syncopate.kernels.library import unfused
    from syncopate.kernels.ranks import slowest
    from syncopate.measure.reference import reference, relative_error
    from syncopate.measure.timing import time_collective
    from syncopate.search_space import Workload

    ws = dist.get_world_size(group)
    workload = Workload(kind=kind, shape=shape, dtype="bf16")
    local = workload.local_shapes(ws)
    gen = torch.Generator(device=device)
    gen.manual_seed(7 + dist.get_rank(group))

    def a_new():
        return torch.randn(local["a"], generator=gen, device=device).bfloat16()

    def poisoned():
        return torch.full(local["out"], float("nan"), dtype=torch.bfloat16, device=device)

    b = (torch.randn(local["b"], generator=gen, device=device) / shape[2] ** 0.5).bfloat16()
    a = a_new()
    op = {
        "ag_gemm": syncopate.all_gather_matmul,
        "gemm_rs": syncopate.matmul_reduce_scatter,
        "gemm_ar": syncopate.matmul_all_reduce,
    }[kind]

    def timed(fn) -> float:
        return _median(time_collective(fn, group, repetitions=args.repetitions).samples_us)

    out = poisoned()
    times = {"torch": timed(lambda: unfused(kind, a, b, group, out=out))}
    if kind == "ag_gemm":
        gathered = torch.empty((shape[0], a.shape[1]), dtype=a.dtype, device=device)
        times["comm"] = timed(lambda: dist.all_gather_into_tensor(gathered, a, group=group))
        times["gemm"] = timed(lambda: torch.matmul(gathered, b))
    else:
        partial = torch.matmul(a, b)
        rs_out = torch.empty((shape[0] // ws, b.shape[1]), dtype=a.dtype, device=device)
        if kind == "gemm_rs":
            times["comm"] = timed(lambda: dist.reduce_scatter_tensor(rs_out, partial, group=group))
        else:
            times["comm"] = timed(lambda: dist.all_reduce(partial, group=group))
        times["gemm"] = timed(lambda: torch.matmul(a, b))
    times["bound"] = max(times["gemm"], times["comm"])
    log.info(
        "%s %s: torch %.1f µs, gemm %.1f, comm %.1f",
        kind,
        shape,
        times["torch"],
        times["gemm"],
        times["comm"],
    )
    rows = []
    for cand in candidates():
        row = {"candidate": cand.to_dict(), "short": cand.short()}
        try:
            pairs = [(a_new(), poisoned()) for _ in range(2)]
            for x, y in pairs:  # back to back, no synchronization between
                op(x, b, group, cand, out=y)
            errors = [relative_error(y, reference(kind, x, b, group)) for x, y in pairs]
            row["rel_error"] = slowest([max(errors)], group, device)[0]
            if row["rel_error"] < TOLERANCE:
                row["us"] = timed(lambda c=cand: op(a, b, group, c, out=out))
                row["status"] = "ok"
            else:
                row["status"] = "wrong_result"
        except Exception as e:  # noqa: BLE001 — recorded, the other candidates still run
            log.error("%s %s %s failed:\n%s", kind, shape, cand.short(), traceback.format_exc())
            row.update(status="error", error=f"{type(e).__name__}: {e}")
        log.info(
            "%s %s %s: %s %s", kind, shape, cand.short(), row["status"], row.get("us", row.get("error", ""))
        )
        rows.append(row)
    syncopate.close_contexts()
    return {"kind": kind, "shape": list(shape), "world_size": ws, "baselines": times, "candidates": rows}


def table(results: list[dict]) -> str:
    lines = ["| kind | M×N×K | candidate | µs | torch/ours | bound/ours |", "|---|---|---|---|---|---|"]
    for r in results:
        shape = "×".join(map(str, r["shape"]))
        base = r["baselines"]
        torch_us, bound = base["torch"], base["bound"]
        lines.append(
            f"| {r['kind']} | {shape} | torch unfused | {torch_us:.1f} | 1.000 | {bound / torch_us:.3f} |"
        )
        for c in r["candidates"]:
            if c["status"] != "ok":
                lines.append(f"| {r['kind']} | {shape} | {c['short']} | {c['status']} | – | – |")
                continue
            us = c["us"]
            lines.append(
                f"| {r['kind']} | {shape} | {c['short']} | {us:.1f} | {torch_us / us:.3f} | {bound / us:.3f} |"
            )
    return "\n".join(lines)


def _logging(rank: int) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        name = os.path.join(out, "nvshmem_bench.log") + (f".rank{rank}" if rank else "")
        handlers.append(logging.FileHandler(name))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s",
        handlers=handlers,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="where to write every figure (default: $OUT/nvshmem_bench.json)")
    parser.add_argument("--repetitions", type=int, default=20, help="timed repetitions a measurement")
    parser.add_argument("--kinds", default="ag_gemm,gemm_rs,gemm_ar", help="kinds, comma-separated")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if any(k not in SHAPES for k in kinds) or args.repetitions < 1:
        parser.error(f"--kinds takes {', '.join(SHAPES)}; --repetitions at least 1")
    if "LOCAL_RANK" not in os.environ:
        print(
            "run it under torchrun: torchrun --nproc-per-node N benchmarks/nvshmem_bench.py", file=sys.stderr
        )
        return 2
    import torch

    if not torch.cuda.is_available():
        print("nvshmem_bench: no CUDA GPU here", file=sys.stderr)
        return 1
    import torch.distributed as dist

    import syncopate
    from syncopate.errors import SyncopateError
    from syncopate.measure.local_ranks import join_torchrun

    device = join_torchrun()
    rank = dist.get_rank()
    _logging(rank)
    try:
        syncopate.use_nvshmem()  # before the first symmetric allocation of this process
    except SyncopateError as e:
        print(f"nvshmem_bench: {e}", file=sys.stderr)
        dist.destroy_process_group()
        return 1
    group = dist.group.WORLD
    started = time.time()
    results = []
    try:
        for kind in kinds:
            for shape in SHAPES[kind]:
                results.append(run_case(kind, shape, group, device, args))
    finally:
        syncopate.close_contexts()  # NVSHMEM buffers freed while the group can still meet
        dist.destroy_process_group()
    wrong = [
        f"{r['kind']} {tuple(r['shape'])} {c['short']}: {c['status']} {c.get('error', c.get('rel_error', ''))}"
        for r in results
        for c in r["candidates"]
        if c["status"] != "ok"
    ]
    if rank == 0:
        print(table(results))
        from syncopate.environment import current_environment, git_revision

        doc = {
            "results": results,
            "gpu": torch.cuda.get_device_name(device),
            "environment": current_environment().to_dict(),
            "git": git_revision(),
            "seconds": time.time() - started,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path = args.json or (
            os.path.join(os.environ["OUT"], "nvshmem_bench.json") if os.environ.get("OUT") else None
        )
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
            log.info("wrote %s", path)
        if wrong:
            print("wrong or failed candidates:\n" + "\n".join(wrong), file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
