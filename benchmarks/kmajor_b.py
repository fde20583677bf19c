"""B given as an nn.Linear weight's transpose (`weight.t()`, K-major), as `syncopate.tp`'s layers
pass it, against B row-major, for the cuBLAS templates that move B (a_stationary, c_stationary)
and one that does not (decomposed): each op with B row-major, B K-major as it is (moved as laid
out), and B K-major copied to row-major inside the timed call (what those templates did before they
moved B as laid out). One process per GPU (NCCL group), every variant checked against float32
first, timed by the project's one method (kernels/timing.py: warm-up, L2 flush, ranks started
together, events, max over ranks, median).

    python benchmarks/kmajor_b.py [--world 2] [--repetitions 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CASES = [  # kind, (M, N, K), candidate: the TP=2 suite's shapes these templates won on two H200s
    ("gemm_rs", (8192, 8192, 2048), "c_stationary"),
    ("gemm_ar", (8192, 8192, 2048), "c_stationary"),
    ("ag_gemm", (8192, 2048, 8192), "a_stationary"),
    ("ag_gemm", (8192, 4096, 8192), "a_stationary"),
    ("gemm_ar", (8192, 4096, 11008), "decomposed"),
]


def _candidate(template: str, kind: str):
    from syncopate.search_space import a_stationary_candidate, c_stationary_candidate, decomposed_candidate

    if template == "a_stationary":
        return a_stationary_candidate(1)
    if template == "c_stationary":
        return c_stationary_candidate(1 if kind == "gemm_rs" else 2)
    return decomposed_candidate(2)


def _worker(rank, world, port, args, q):
    from syncopate.kernels.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.kernels import ops
    from syncopate.kernels.reference import reference, relative_error
    from syncopate.kernels.timing import time_collective
    from syncopate.search_space import Workload

    g = dist.group.WORLD
    fused = {"ag_gemm": ops.all_gather_matmul, "gemm_rs": ops.matmul_reduce_scatter, "gemm_ar": ops.matmul_all_reduce}
    gen = torch.Generator(device=dev).manual_seed(3 + rank)
    rows = []
    for kind, shape, template in CASES:
        shapes = Workload(kind=kind, shape=shape).local_shapes(world)
        k, n = shapes["b"]
        a = torch.randn(shapes["a"], generator=gen, device=dev).bfloat16()
        weight = (torch.randn(n, k, generator=gen, device=dev) / k**0.5).bfloat16()  # an nn.Linear weight [N, K]
        cand = _candidate(template, kind)
        op = fused[kind]
        variants = {
            "row-major": lambda w=weight.t().contiguous(): op(a, w, g, cand),
            "K-major": lambda w=weight.t(): op(a, w, g, cand),
            "K-major, copied": lambda w=weight.t(): op(a, w.contiguous(), g, cand),
        }
        ref = reference(kind, a, weight.t(), g)
        row = {"kind": kind, "shape": list(shape), "template": template}
        for name, fn in variants.items():
            err = relative_error(fn(), ref)
            if not err < 2e-2:
                raise AssertionError(f"{kind} {shape} {template} {name}: relative error {err:.3g}")
            row[name] = time_collective(fn, g, repetitions=args.repetitions).median_us
            row[f"{name} err"] = err
        rows.append(row)
    ops.close_contexts()
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import torch

    from syncopate.kernels.local_ranks import spawn_ranks

    if torch.cuda.device_count() < args.world:
        print(f"kmajor_b.py needs {args.world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    rows = spawn_ranks(_worker, args.world, (args,), what="benchmark")
    print(f"{torch.cuda.get_device_name()} x{args.world}, bf16, µs (median over ranks' max)")
    print(f"{'kind':8s} {'M x N x K':18s} {'template':13s} {'row-major':>10s} {'K-major':>9s} {'copied':>9s} "
          f"{'copied/K-major':>15s}")
    for r in rows:
        m, n, k = r["shape"]
        print(f"{r['kind']:8s} {f'{m}x{n}x{k}':18s} {r['template']:13s} {r['row-major']:10.1f} {r['K-major']:9.1f} "
              f"{r['K-major, copied']:9.1f} {r['K-major, copied'] / r['K-major']:15.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
