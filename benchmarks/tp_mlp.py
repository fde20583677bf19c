"""A tensor-parallel MLP block (`syncopate.tp`: column-parallel fc1, GELU, row-parallel fc2), its
forward and its forward + backward, on Syncopate's fused ops against torch's collectives and
matmuls one after the other (`impl="torch"`) and torch's own fused ops (`impl="async_tp"`), one
process per GPU (NCCL group), timed by the project's one method (kernels/timing.py:
warm-up, L2 flush, barrier, events, max over ranks, median). All run the same weights and inputs;
the table gives the outputs' difference from torch's path too.

    python benchmarks/tp_mlp.py [--world N] [--tokens 8192] [--hidden 4096] [--ffn 14336] [--no-sp]
                                [--repetitions 20] [--json FILE]

The fused ops take their configurations from `syncopate.lookup` (SYNCOPATE_DB names the database
of a sweep on this machine; without one they take the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _worker(rank, world, port, args, q):
    from syncopate.kernels.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.kernels import ops
    from syncopate.kernels.reference import relative_error
    from syncopate.kernels.timing import summarize, time_collective
    from syncopate.tp import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(0)
    fc1 = torch.nn.Linear(args.hidden, args.ffn, device=dev, dtype=torch.bfloat16)
    fc2 = torch.nn.Linear(args.ffn, args.hidden, device=dev, dtype=torch.bfloat16)
    rows = args.tokens // world if args.sp else args.tokens
    gen = torch.Generator(device=dev).manual_seed(1 + rank if args.sp else 1)
    x = torch.randn(rows, args.hidden, generator=gen, device=dev).bfloat16().requires_grad_(True)
    g = torch.randn(rows, args.hidden, generator=gen, device=dev).bfloat16()
    rows_out = {}
    outputs = {}
    for impl in ("torch", "async_tp", "fused"):
        col = ColumnParallelLinear.from_linear(fc1, sequence_parallel=args.sp, impl=impl)
        row = RowParallelLinear.from_linear(fc2, sequence_parallel=args.sp, impl=impl)

        def forward():
            return row(torch.nn.functional.gelu(col(x)))

        def step():
            for p in (x, *col.parameters(), *row.parameters()):
                p.grad = None
            forward().backward(g)

        outputs[impl] = forward().detach()
        fwd = time_collective(forward, dist.group.WORLD, repetitions=args.repetitions)
        both = time_collective(step, dist.group.WORLD, repetitions=args.repetitions)
        rows_out[impl] = {"forward": summarize(fwd.samples_us), "forward_backward": summarize(both.samples_us),
                          "host_us": both.host_us,
                          "rel_diff_from_torch": relative_error(outputs[impl].float(), outputs["torch"].float())}
    ops.close_contexts()
    if rank == 0:
        q.put({"world": world, "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": rows_out})
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=None, help="ranks, one a GPU (default: every GPU here)")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--no-sp", dest="sp", action="store_false", help="no sequence parallelism (all-reduce)")
    p.add_argument("--repetitions", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    from syncopate.kernels.local_ranks import spawn_ranks

    world = args.world or torch.cuda.device_count()
    if world < 1 or world > torch.cuda.device_count():
        p.error(f"--world {world}: this host has {torch.cuda.device_count()} GPU(s); one rank a GPU")
    for what, v in (("--tokens", args.tokens), ("--ffn", args.ffn)):
        if v % world:
            p.error(f"{what} {v} is not divisible by the world size {world}")
    result = spawn_ranks(_worker, world, (args,), what="benchmark")
    result["shape"] = {"tokens": args.tokens, "hidden": args.hidden, "ffn": args.ffn, "sequence_parallel": args.sp}
    impls = list(result["rows"])
    fused = result["rows"]["fused"]
    print(f"TP MLP block on {world} × {result['gpu']} (torch {result['torch']}), tokens {args.tokens}, "
          f"hidden {args.hidden}, ffn {args.ffn}, sequence parallel {args.sp}; µs, median (p20–p80), max over ranks")
    print("| pass | " + " | ".join(impls) + " | " + " | ".join(f"{i}/fused" for i in impls if i != "fused") + " |")
    print("|---" * (2 * len(impls)) + "|")
    for key in ("forward", "forward_backward"):
        cells = [f"{r[key]['median_us']:.1f} ({r[key]['p20_us']:.0f}–{r[key]['p80_us']:.0f})"
                 for r in result["rows"].values()]
        ratios = [f"{result['rows'][i][key]['median_us'] / fused[key]['median_us']:.3f}" for i in impls if i != "fused"]
        print(f"| {key} | " + " | ".join(cells + ratios) + " |")
    print("outputs against torch's path, relative difference: "
          + ", ".join(f"{i} {r['rel_diff_from_torch']:.3g}" for i, r in result["rows"].items() if i != "torch"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
