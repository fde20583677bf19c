"""The unfused MoE ops (`syncopate.moe.dispatch_gemm` / `gemm_combine`) against torch written
plainly (all_to_all_single, then torch._grouped_mm, buffers and index tables made beforehand), on
the expert layers of configs/moe_ep.yaml, one process a GPU.

    python benchmarks/moe_unfused.py [--config configs/moe_ep.yaml] [--models qwen3_30b_a3b]
        [--ep 2] [--tokens 4096] [--repetitions 20]
    python benchmarks/moe_unfused.py --cpu --shrink 64 --tokens 32    # gloo ranks: checks the script

Each case's routing is drawn from its spec (the same on every rank); both paths are checked against
each other (outputs poisoned first), then timed by the project's method (measure/timing.py: warm-up,
L2 flush, ranks started together, events, max over ranks, median with p20/p80). With fewer GPUs
than an EP size asks for, that size is skipped with a message. `--cpu` runs gloo ranks on the CPU
with wall-clock times (for checking the script, not for its figures); `--shrink N` divides hidden,
ffn and experts by N. Prints a table; writes it as JSON to $OUT/moe_unfused.json when OUT is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "moe_ep.yaml")


def _time_cpu(fn, group, repetitions: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    fn()
    samples = []
    for _ in range(repetitions):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    worst = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    xs = sorted(worst.tolist())
    return {"median_us": statistics.median(xs), "p20_us": xs[len(xs) // 5], "p80_us": xs[(4 * len(xs)) // 5]}


def _time(fn, group, repetitions: int, cpu: bool) -> dict[str, float]:
    if cpu:
        return _time_cpu(fn, group, repetitions)
    from syncopate.measure.timing import time_collective

    t = time_collective(fn, group, repetitions=repetitions)
    return {"median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us}


def run_case(case, group, device, repetitions: int, cpu: bool) -> dict:
    """Check and time one case on this rank; the row of the table (every rank returns the same)."""
    import torch
    import torch.distributed as dist

    from syncopate.measure.reference import relative_error
    from syncopate.moe import dispatch_gemm, draw_routing, exchange_layout, gemm_combine

    w = case.workload
    rank, ws = dist.get_rank(group), dist.get_world_size(group)
    routing = draw_routing(world_size=ws, tokens=w.tokens, experts=w.experts, top_k=w.top_k, spec=w.routing)
    ids = routing.expert_ids[rank].to(device)
    gates = routing.gate_weights[rank].to(device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[w.dtype]
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    local = w.experts // ws

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    layout = exchange_layout(ids, w.experts, group)
    rows = layout.rows_received
    send_rows = layout.order // layout.top_k
    offs = torch.cumsum(layout.group_sizes.to(device), 0).to(torch.int32)
    if w.kind == "a2a_gemm":
        x, weight = rand(w.tokens, w.hidden), rand(local, w.hidden, 2 * w.ffn, scale=w.hidden**-0.5)
        received = torch.empty(rows, w.hidden, dtype=dtype, device=device)

        def ours(out):
            return dispatch_gemm(x, weight, layout, group, out=out)

        def plain(out):
            dist.all_to_all_single(
                received, x[send_rows], layout.recv_splits, layout.send_splits, group=group
            )
            out.copy_(torch._grouped_mm(received[layout.expert_order], weight, offs=offs))
            return out

        shape = (rows, 2 * w.ffn)
    else:
        h, weight = rand(rows, w.ffn), rand(local, w.ffn, w.hidden, scale=w.ffn**-0.5)
        back = torch.empty(w.tokens * w.top_k, w.hidden, dtype=dtype, device=device)

        def ours(out):
            return gemm_combine(h, weight, gates, layout, group, out=out)

        def plain(out):
            y = torch._grouped_mm(h, weight, offs=offs)[layout.expert_order_inverse]
            dist.all_to_all_single(back, y, layout.send_splits, layout.recv_splits, group=group)
            pairs = back[layout.order_inverse].view(w.tokens, w.top_k, w.hidden)
            out.copy_((pairs.float() * gates.unsqueeze(-1)).sum(1))
            return out

        shape = (w.tokens, w.hidden)
    outs = {name: torch.full(shape, float("nan"), dtype=dtype, device=device) for name in ("ours", "plain")}
    error = relative_error(ours(outs["ours"]), plain(outs["plain"]).float())
    worst = torch.tensor([error], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    times = {
        "syncopate_unfused": _time(lambda: ours(outs["ours"]), group, repetitions, cpu),
        "torch_plain": _time(lambda: plain(outs["plain"]), group, repetitions, cpu),
    }
    received = torch.tensor([rows], device=device)
    most = received.clone()
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
    return {
        "model": case.model,
        "ep": ws,
        "workload": w.key(),
        "kind": w.kind,
        "tokens": w.tokens,
        "routing": w.routing.key(),
        "most_rows_a_rank": int(most.item()),
        "rel_error": float(worst.item()),
        "times": times,
    }


def worker(rank, world, port, args, cases, queue):
    import torch
    import torch.distributed as dist

    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
        )
    try:
        results = [run_case(case, dist.group.WORLD, device, args.repetitions, args.cpu) for case in cases]
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def _shrunk(case, n: int):
    """`case` with hidden, ffn and experts divided by n (widths kept multiples of 8, experts a
    multiple of the EP size and at least top_k)."""
    w = case.workload
    experts = max(w.experts // n, w.top_k, case.ep)
    experts = -(-experts // case.ep) * case.ep
    width = lambda d: max(8, d // n // 8 * 8)  # noqa: E731  (torch._grouped_mm: rows of 16 bytes)
    small = dataclasses.replace(w, hidden=width(w.hidden), ffn=width(w.ffn), experts=experts)
    return dataclasses.replace(case, workload=small)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--models", help="only these models, comma-separated")
    p.add_argument("--ep", help="only these EP sizes, comma-separated")
    p.add_argument("--tokens", type=int, help="tokens a rank instead of the file's")
    p.add_argument("--repetitions", type=int, default=20)
    p.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU (checks the script)")
    p.add_argument("--shrink", type=int, default=1, help="divide hidden, ffn and experts by this")
    args = p.parse_args(argv)

    from syncopate.errors import ConfigError
    from syncopate.moe.bench_config import load_moe_config

    try:
        cases = load_moe_config(args.config)
    except ConfigError as e:
        print(f"moe_unfused.py: {e}", file=sys.stderr)
        return 2
    if args.models:
        cases = [c for c in cases if c.model in args.models.split(",")]
    if args.ep:
        cases = [c for c in cases if str(c.ep) in args.ep.split(",")]
    if args.tokens:
        cases = [
            dataclasses.replace(c, workload=dataclasses.replace(c.workload, tokens=args.tokens))
            for c in cases
        ]
    if args.shrink > 1:
        cases = [_shrunk(c, args.shrink) for c in cases]
    unique = list(dict.fromkeys(cases))
    if not unique:
        print("moe_unfused.py: no case left after --models / --ep", file=sys.stderr)
        return 2

    import torch

    from syncopate.measure.local_ranks import spawn_ranks

    gpus = 0 if args.cpu else torch.cuda.device_count()
    rows = []
    for ep in sorted({c.ep for c in unique}):
        if not args.cpu and gpus < ep:
            print(f"moe_unfused.py: EP={ep} skipped: it needs {ep} CUDA GPUs, {gpus} present")
            continue
        rows += spawn_ranks(worker, ep, args=(args, [c for c in unique if c.ep == ep]), what="benchmark")
    print(
        f"{'model':20s} {'ep':>2s} {'kind':8s} {'tokens':>6s} {'routing':18s} {'rows':>7s} "
        f"{'ours µs':>9s} {'plain µs':>9s} {'rel.err':>8s}"
    )
    for r in rows:
        t = r["times"]
        print(
            f"{r['model']:20s} {r['ep']:2d} {r['kind']:8s} {r['tokens']:6d} {r['routing']:18s} "
            f"{r['most_rows_a_rank']:7d} {t['syncopate_unfused']['median_us']:9.1f} "
            f"{t['torch_plain']['median_us']:9.1f} {r['rel_error']:8.1e}"
        )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "moe_unfused.json"), "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if not r["rel_error"] < 1e-2]
    if bad:
        print(f"moe_unfused.py: {len(bad)} case(s) disagree with torch's plain path", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
