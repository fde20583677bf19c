"""Where the time of one fused call goes: a per-chunk timeline of the copy-engine backend.

    python benchmarks/timeline.py gemm_rs 8192 8192 2048 --splits 4 [--tile 128x256x64w8s3]
        [--order arrival] [--gpus 2] [--json $OUT/timeline.json]

One process per GPU. After warm-up calls, one call runs with the context's timeline on: every
chunk the side streams move gets two CUDA events, one when its wait passed (the chunk is ready
and its stream free) and one when its copy is done, timed from an event recorded just before the
call. Rank 0 prints, per rank, each chunk's ready and done times and the link's busy share, and the
call's own time; with it one reads whether the copies wait for the GEMM (ready late) or for each
other (back to back: the link is the limit), and how long the call runs after the last copy.
With `--template a_stationary`, `c_stationary` or `decomposed` (cuBLAS GEMMs, no tile fields) the
timeline also holds the GEMMs on the caller's stream, from when their inputs are there to their end
("own term", "term of q", "product for p", "partial for p", "own rows", ...); they are left out of
the link's busy share.
Every call's output is checked against the float32 reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def candidate(args):
    """The candidate the arguments name: a cuBLAS template's keeps its default tile fields, and a
    c_stationary reduce-scatter takes one split."""
    from syncopate.search_space import (
        Candidate,
        TileConfig,
        a_stationary_candidate,
        c_stationary_candidate,
        decomposed_candidate,
    )

    if args.template == "a_stationary":
        return a_stationary_candidate(args.splits)
    if args.template == "c_stationary":
        return c_stationary_candidate(args.splits if args.kind == "gemm_ar" else 1)
    if args.template == "decomposed":
        return decomposed_candidate(args.splits)
    tile = TileConfig.from_key(args.tile)
    return Candidate(
        backend="copy_engine",
        template=args.template,
        num_splits=args.splits,
        tile_order=args.order,
        comm_sms=0,
        block_m=tile.block_m,
        block_n=tile.block_n,
        block_k=tile.block_k,
        group_m=args.group_m,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )


def workload_operands(args, world: int, dev):
    """The fused op of `args.kind` and one rank's fresh bf16 operands and output for the workload
    `args` names (`workload_parser`'s arguments), on `dev`: (op, a, b, out)."""
    import torch

    from syncopate.kernels import ops
    from syncopate.search_space import Workload

    op = {
        "ag_gemm": ops.all_gather_matmul,
        "gemm_rs": ops.matmul_reduce_scatter,
        "gemm_ar": ops.matmul_all_reduce,
    }[args.kind]
    shapes = Workload(kind=args.kind, shape=(args.m, args.n, args.k), dtype="bf16").local_shapes(world)
    a = torch.randn(shapes["a"], device=dev).to(torch.bfloat16)
    b = (torch.randn(shapes["b"], device=dev) / args.k**0.5).to(torch.bfloat16)
    return op, a, b, torch.empty(shapes["out"], dtype=torch.bfloat16, device=dev)


def worker(rank: int, world: int, port: int, args, queue) -> None:
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.kernels import ops
    from syncopate.kernels.context import Timeline
    from syncopate.measure.reference import reference, relative_error
    from syncopate.measure.timing import start_together

    c = candidate(args)
    g = dist.group.WORLD
    op, a, b, out = workload_operands(args, world, dev)
    for _ in range(args.warmup):
        op(a, b, g, c, out=out)
    torch.cuda.synchronize()
    err = relative_error(out, reference(args.kind, a, b, g))
    ctx = ops.call_context(args.kind, a, b, g, c)
    rows = []
    for _ in range(args.calls):
        ctx.timeline = Timeline.make()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_together(g, torch.device("cuda", torch.cuda.current_device()), 2000.0)  # as the benchmarks time
        start.record()
        op(a, b, g, c, out=out)
        end.record()
        torch.cuda.synchronize()
        marks = ctx.timeline.times_us(start)
        ctx.timeline = None
        rows.append(
            {
                "total_us": start.elapsed_time(end) * 1e3,
                "chunks": [
                    dict(label=lab, chunk=list(ch), rows=r, ready_us=t0, done_us=t1)
                    for lab, ch, r, t0, t1 in marks
                ],
            }
        )
    result = {"rank": rank, "rel_error": err, "calls": rows}
    if args.profile:
        result["profiled"] = [
            profiled_call(lambda: op(a, b, g, c, out=out), g, dev) for _ in range(args.calls)
        ]
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        queue.put(gathered)
    ops.close_contexts()
    dist.destroy_process_group()


def profiled_call(call, group, dev) -> list[dict]:
    """One call under torch's profiler (CUPTI: each kernel's and copy's own start and end on the
    device, without the timeline's events between them), started as the benchmarks start a call;
    its device activities, times from the first one's start."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from syncopate.measure.timing import start_together

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start_together(group, dev, 5000.0)  # the profiler slows the host: a longer sleep to enqueue under
        call()
        torch.cuda.synchronize()
    acts = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and "sleep" not in e.name.lower()
    ]
    if not acts:
        return []
    t0 = min(e.time_range.start for e in acts)
    return sorted(
        (
            {
                "name": e.name,
                "stream": getattr(e, "device_resource_id", -1),
                "start_us": e.time_range.start - t0,
                "end_us": e.time_range.end - t0,
            }
            for e in acts
        ),
        key=lambda x: x["start_us"],
    )


def summarize_profile(acts: list[dict]) -> list[str]:
    """A profiled call's activities, a line each, with the idle time before each on its stream."""
    lines, last_end = [], {}
    for x in acts:
        idle = x["start_us"] - last_end.get(x["stream"], x["start_us"])
        last_end[x["stream"]] = x["end_us"]
        kind = "copy" if "memcpy" in x["name"].lower() else "kernel"
        lines.append(
            f"    stream {x['stream']:>3}  {x['start_us']:8.1f} .. {x['end_us']:8.1f}  "
            f"{x['end_us'] - x['start_us']:7.1f} µs  "
            f"idle before {idle:6.1f}  {kind:6s} {x['name'][:60]}"
        )
    if acts:
        lines.append(f"    device activity from 0 to {max(x['end_us'] for x in acts):.1f} µs")
    return lines


GEMM_LABELS = ("own ", "term of", "product for", "partial for", "partial of", "peers' rows")
"""How the cuBLAS templates' GEMM (and sum) spans are labelled (the rest are copies)."""


def summarize(call: dict) -> list[str]:
    chunks = sorted(call["chunks"], key=lambda x: x["ready_us"])
    lines = []
    busy = sum(x["done_us"] - x["ready_us"] for x in chunks if not x["label"].startswith(GEMM_LABELS))
    for x in chunks:
        lines.append(
            f"    {x['label']:16s} chunk {str(tuple(x['chunk'])):10s} {x['rows']:6d} rows  "
            f"ready {x['ready_us']:8.1f}  done {x['done_us']:8.1f}  "
            f"{'gemm' if x['label'].startswith(GEMM_LABELS) else 'copy'} {x['done_us'] - x['ready_us']:7.1f} µs"
        )
    if chunks:
        first, last = chunks[0]["ready_us"], max(x["done_us"] for x in chunks)
        lines.append(
            f"    first ready {first:.1f} µs, last done {last:.1f} µs, copies busy {busy:.1f} µs of the "
            f"{last - first:.1f} between ({busy / max(last - first, 1e-9):.0%}); call {call['total_us']:.1f} µs, "
            f"{call['total_us'] - last:.1f} µs after the last copy"
        )
    return lines


def workload_parser(description: str) -> argparse.ArgumentParser:
    """A parser whose first arguments name the workload as `syncopate bench` takes it: KIND M N K."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("kind", choices=["ag_gemm", "gemm_rs", "gemm_ar"])
    for dim in ("m", "n", "k"):
        p.add_argument(dim, type=int)
    return p


def main(argv: list[str] | None = None) -> int:
    p = workload_parser(__doc__.splitlines()[0])
    p.add_argument("--splits", type=int, default=4)
    p.add_argument("--template", default="direct")
    p.add_argument("--order", default="arrival")
    p.add_argument("--tile", default="128x256x64w8s3")
    p.add_argument("--group-m", type=int, default=8)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--json", help="write every event time here")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also run the calls under torch's profiler and print each rank's kernels and copies",
    )
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    from syncopate.measure.local_ranks import free_port

    for k, v in {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }.items():
        os.environ.setdefault(k, v)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(
        worker, args=(args.gpus, free_port(), args, queue), nprocs=args.gpus, start_method="spawn"
    )
    ranks = queue.get(timeout=10)
    ran = candidate(args)
    print(
        f"{args.kind} {args.m}x{args.n}x{args.k} bf16, copy engine, {args.template}, {ran.num_splits} splits, "
        f"{args.order}, {args.tile}, {args.gpus} GPUs; rel. error "
        f"{max(r['rel_error'] for r in ranks):.2e}; calls {[round(c['total_us'], 1) for c in ranks[0]['calls']]} µs"
    )
    median_call = sorted(range(args.calls), key=lambda i: ranks[0]["calls"][i]["total_us"])[args.calls // 2]
    for r in ranks:
        print(f"  rank {r['rank']} (call {median_call}):")
        print("\n".join(summarize(r["calls"][median_call])))
    for r in ranks if args.profile else []:
        print(f"  rank {r['rank']} under the profiler (call {median_call}):")
        print("\n".join(summarize_profile(r["profiled"][median_call])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ranks": ranks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
