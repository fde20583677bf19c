"""FP8 matmul reduce-scatter, template decomposed: its plan variants side by side against the bound.

The variants against the scaled GEMM alone, torch's scaled paths and the overlap bound, on the
GPUs of one host.

Per shape (global M×N×K, fp8: e4m3 operands scaled row-wise, bf16 out), in one process a rank:
the harness's baselines (`torch_seq`: `torch._scaled_mm` then NCCL's reduce-scatter;
`torch_async_tp`: `torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter`; `gemm_alone`;
`comm_alone`), the GEMM alone with fast accumulation, then for each `--splits` and each variant of
`decomposed.DecomposedPlan`'s FP8 fields (`VARIANTS`): three calls back to back on fresh inputs into
NaN-poisoned outputs and buffers, checked against the float32 product of the dequantized operands,
then timed by the harness's method (device time, max over ranks; and back to back with the host on
the path). Rank 0 prints a table, bound / time per row (bound = max(GEMM alone, NCCL alone)), and
writes every number as JSON (`--out`).

    python benchmarks/fp8_rs_variants.py [--ranks N] [--shape MxNxK ...] [--splits 2,4,8] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch
import torch.distributed as dist

SHAPES = [(8192, 4096, 14336), (8192, 4096, 28672)]
"""LLaMA-3-8B's MLP at 8192 tokens: the row layer's forward and the column layer's input gradient."""
VARIANTS = {
    "out": {},
    "out+side": {"side_add": True},
    "accumulator": {"scaled_sum": "accumulator"},
    "out+fast": {"fast_accum": True},
}
"""Name: the plan's FP8 fields (`out`, the default: each own chunk's product into the output's rows,
the peer's partial added there; `out+side`: those sums on a side stream; `accumulator`: the product
into a scratch tensor added onto the accumulator, copied out after; `out+fast`: fast accumulation)."""


def _program(h, splits: int, fields: dict):
    """The decomposed program of the harness's workload with these plan fields (collective)."""
    from syncopate.kernels.scaled import FP8
    from syncopate.kernels.templates import CallSpec, template_for
    from syncopate.search_space import decomposed_candidate

    spec = CallSpec(
        kind="gemm_rs",
        group=h.group,
        rank=h.rank,
        world_size=h.ws,
        a_shape=tuple(h.a.shape),
        b_shape=tuple(h.b.shape),
        dtype=FP8,
        device=h.device,
        candidate=decomposed_candidate(splits),
    )
    program = template_for(spec.candidate, "gemm_rs").prepare(spec, h.b)
    program.plan = dataclasses.replace(program.plan, **fields)
    return program


def _checked(h, program) -> float:
    """Worst relative error of three back-to-back calls on fresh inputs, outputs and the program's
    symmetric buffers poisoned with NaN first."""
    from syncopate.measure.reference import reference, relative_error
    from syncopate.measure.timing import barrier

    for buf in program.context.buffers.values():
        buf.local.fill_(float("nan"))
    barrier(h.group, h.device)
    pending = []
    for _ in range(3):
        a, b, scales = h.fresh_inputs()
        out = torch.full(h.shapes["out"], float("nan"), dtype=torch.bfloat16, device=h.device)
        program(a, b, out, scales=scales)
        pending.append((out, a, b, scales))
    return max(
        relative_error(out, reference("gemm_rs", a, b, h.group, *scales)) for out, a, b, scales in pending
    )


def shape_rows(shape, splits_list, group) -> list[dict]:
    from syncopate.kernels.scaled import scaled_mm
    from syncopate.measure.bench import BenchOptions
    from syncopate.measure.harness import Harness
    from syncopate.measure.timing import time_collective, time_eager
    from syncopate.search_space import Workload

    h = Harness(Workload(kind="gemm_rs", shape=shape, dtype="fp8"), group, BenchOptions(workloads=[]))
    rows = []
    for b in h.measure_baselines():
        rows.append({"name": b.name, "device_us": statistics.median(b.samples_us), "eager_us": b.eager_us})
    a, b, (sa, sb) = h.a, h.b, h.scales
    fast = time_collective(lambda: scaled_mm(a, b, sa, sb, fast_accum=True), group).samples_us
    rows.append({"name": "gemm_alone_fast_accum", "device_us": statistics.median(fast), "eager_us": None})
    for splits in splits_list:
        for name, fields in VARIANTS.items():
            program = _program(h, splits, fields)
            err = _checked(h, program)
            out = torch.empty(h.shapes["out"], dtype=torch.bfloat16, device=h.device)

            def call(program=program, out=out):
                program(a, b, out, scales=(sa, sb))

            device = time_collective(call, group).samples_us
            eager = time_eager(call, group)
            rows.append(
                {
                    "name": f"decomposed s{splits} {name}",
                    "splits": splits,
                    "variant": name,
                    "fields": fields,
                    "device_us": statistics.median(device),
                    "p20_us": sorted(device)[len(device) // 5],
                    "p80_us": sorted(device)[(4 * len(device)) // 5],
                    "eager_us": statistics.median(eager),
                    "rel_err": err,
                }
            )
    for r in rows:
        r["shape"] = list(shape)
    h.close()
    return rows


def run_rank(rank: int, world: int, port: int, shapes, splits_list, out: str | None, results) -> None:
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    try:
        rows = [r for shape in shapes for r in shape_rows(shape, splits_list, dist.group.WORLD)]
        if rank == 0:
            gpu = torch.cuda.get_device_name(dev)
            print_table(rows, gpu, world)
            if out:
                with open(out, "w") as f:
                    json.dump(
                        {"gpu": gpu, "ranks": world, "torch": torch.__version__, "rows": rows}, f, indent=1
                    )
            results.put(rows)
    finally:
        dist.destroy_process_group()


def print_table(rows: list[dict], gpu: str, world: int) -> None:
    from syncopate.measure.reference import FP8_TOLERANCE

    print(f"\n{gpu} x{world}, fp8 gemm_rs, µs a call (device: median over ranks' max; eager: back to back)")
    print("| M×N×K | row | device | eager | bound/row | rel err |")
    print("|---|---|---|---|---|---|")
    for shape in dict.fromkeys(tuple(r["shape"]) for r in rows):
        mine = [r for r in rows if tuple(r["shape"]) == shape]
        t = {r["name"]: r["device_us"] for r in mine}
        bound = max(t.get("gemm_alone", 0.0), t.get("comm_alone", 0.0))
        for r in mine:
            err = r.get("rel_err")
            flag = "" if err is None or err <= FP8_TOLERANCE else " WRONG"
            eager = f"{r['eager_us']:.1f}" if r.get("eager_us") else "–"
            print(
                f"| {'×'.join(map(str, shape))} | {r['name']} | {r['device_us']:.1f} | {eager} | "
                f"{bound / r['device_us']:.3f} | {'–' if err is None else f'{err:.2e}'}{flag} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks, one GPU each (default 2)")
    parser.add_argument(
        "--shape",
        action="append",
        default=None,
        help="global M×N×K (repeatable; default 8192x4096x14336 and 8192x4096x28672)",
    )
    parser.add_argument("--splits", default="2,4,8", help="the decomposed plans' num_splits, comma-separated")
    parser.add_argument("--out", help="write every row as JSON here")
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in s.lower().replace("×", "x").split("x")) for s in args.shape or []]
        splits = [int(x) for x in args.splits.split(",")]
    except ValueError:
        shapes, splits = [()], []
    if any(len(s) != 3 or min(s) < 1 for s in shapes) or not splits or min(splits) < 1:
        print(
            f"fp8_rs_variants: --shape {args.shape} --splits {args.splits}: give M×N×K as three positive "
            f"integers (e.g. 8192x4096x14336) and positive splits (e.g. 2,4,8)",
            file=sys.stderr,
        )
        return 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        print(f"fp8_rs_variants: needs a CUDA GPU a rank, at least 2; {gpus} visible", file=sys.stderr)
        return 1
    if not 2 <= args.ranks <= gpus:
        print(f"fp8_rs_variants: --ranks {args.ranks}: give 2 to {gpus}, one GPU a rank", file=sys.stderr)
        return 2
    from syncopate.measure.local_ranks import spawn_ranks

    spawn_ranks(run_rank, args.ranks, (shapes or SHAPES, splits, args.out), what="fp8_rs_variants rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
