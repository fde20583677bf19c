"""When does a rank see a peer's copy-engine push land, while its own pushes are still going out?

    torchrun --nproc-per-node 2 benchmarks/arrival_wait.py [--mib 20] [--copies 3] [--gemm 2048,8192,1024] [--fan]

Every rank pushes `--copies` copies of `--mib` MiB on one side stream, each followed by the
receiver's arrival word (a stream write), as c_stationary pushes a peer's rows of A and B: all to
the next rank, or with `--fan` copy j to the rank 1 + j (mod the peers) ahead, as c_stationary
sends to each peer in turn. Meanwhile its caller's stream runs a GEMM (the own term), then for each
copy j it receives (from the rank 1 + j behind with `--fan`) waits for that copy's word and runs the
GEMM again (the peer's term). With `--entry` the pushes also wait, as c_stationary's do, for the
receiver to have entered the call (a word every rank raises in every pad first). Since every rank does the same at once, copy j lands about when this
rank's own copy j ends (`push j done`, an event after it). Printed per variant and copy: the landing as
this rank saw it (`seen`: an event after the wait) and the start of the term that needed it, µs
after that copy's own end; the median over repetitions, the largest over ranks. A wait that only
passes once the rank's next own copy has ended shows here as about one copy's time.

Variants: the waits (stream memory operations) on a side stream of their own with an event per
arrival for the caller's stream (c_stationary's way), the same on a stream of higher priority, the
caller's stream waiting on the words itself; and the same two with the wait on the SMs instead (a
one-program kernel polling the word, `pull_kernel` copying nothing). The ranks start together
(`timing.start_together`: the GPUs leave an all-reduce together).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=20, help="MiB of each push (default 20)")
    ap.add_argument("--copies", type=int, default=3, help="pushes to the next rank a call (default 3)")
    ap.add_argument("--gemm", default="2048,8192,1024", help="M,N,K of each term's GEMM")
    ap.add_argument("--fan", action="store_true", help="copy j to the rank 1 + j ahead (mod the peers)")
    ap.add_argument("--entry", action="store_true", help="each push waits for the receiver's entry word first")
    ap.add_argument("--repetitions", type=int, default=15)
    args = ap.parse_args()
    from syncopate.kernels.local_ranks import join_torchrun

    dev = join_torchrun()
    import torch
    import torch.distributed as dist

    from syncopate.kernels import streamops
    from syncopate.kernels.backends import announce_entry
    from syncopate.kernels.context import OverlapContext
    from syncopate.kernels.launch import PULL_BLOCK
    from syncopate.kernels.tables import ENTERED_BASE
    from syncopate.kernels.timing import start_together
    from syncopate.kernels.triton_kernels import pull_kernel
    from syncopate.search_space import peers_ahead, peers_behind

    rank, ws = dist.get_rank(), dist.get_world_size()
    size, n = args.mib * MiB, args.copies
    ctx = OverlapContext.create(dist.group.WORLD, {"buf": ((2 * n * size,), torch.uint8)})
    buf = ctx.buffers["buf"]
    # copy j goes to `to[j]`, and copy j this rank receives comes from `source[j]` (the templates' orders)
    step = [j % (ws - 1) if args.fan else 0 for j in range(n)]
    to = [peers_ahead(rank, ws)[d] for d in step]
    source = [peers_behind(rank, ws)[d] for d in step]
    m_, n_, k_ = (int(x) for x in args.gemm.split(","))
    a = torch.randn(m_, k_, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k_, n_, device=dev, dtype=torch.bfloat16)
    c = torch.empty(m_, n_, device=dev, dtype=torch.bfloat16)
    urgent = torch.cuda.Stream(device=dev, priority=-1)
    buf.local[: n * size].copy_(torch.randint(0, 256, (n * size,), dtype=torch.uint8, device=dev))

    def timed_event(stream):
        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        return e

    def sm_wait(stream, word: int, epoch: int) -> None:
        """Wait on the SMs: `pull_kernel` copying nothing, one program polling the word."""
        with torch.cuda.stream(stream):
            pull_kernel[(1,)](ctx.scratch, ctx.scratch, 0, ctx.signals.local, word, epoch, ctx.error, 1 << 30,
                              BLOCK=PULL_BLOCK, num_warps=4)

    def call(variant: str):
        main = torch.cuda.current_stream()
        e = ctx.begin_call()
        push = ctx.streams[0]
        landed = urgent if variant == "priority" else ctx.streams[2]
        begin = timed_event(main)
        for s in (push, landed):
            s.wait_stream(main)
        pushed = []
        if args.entry:
            announce_entry(push, ctx, e)
        for j in range(n):
            if args.entry:
                streamops.wait_value(push.cuda_stream, ctx.signal_address(rank, ENTERED_BASE + to[j]), e)
            streamops.copy_async(push.cuda_stream, buf.peer_ptrs[to[j]] + (n + j) * size,
                                 buf.peer_ptrs[rank] + j * size, size)
            pushed.append(timed_event(push))
            ctx.write_signal(push, to[j], j, e)
        seen, arrived = [], []
        if not variant.startswith("caller"):
            for j in range(n):
                if variant.startswith("SM"):
                    sm_wait(landed, j, e)
                else:
                    streamops.wait_value(landed.cuda_stream, ctx.signal_address(rank, j), e)
                seen.append(timed_event(landed))
                arrived.append(torch.cuda.Event())
                arrived[-1].record(landed)
        torch.matmul(a, b, out=c)
        started = []
        for j in range(n):
            if variant == "caller":
                streamops.wait_value(main.cuda_stream, ctx.signal_address(rank, j), e)
                seen.append(timed_event(main))
            elif variant == "caller, SM wait":
                sm_wait(main, j, e)
                seen.append(timed_event(main))
            else:
                main.wait_event(arrived[j])
            started.append(timed_event(main))
            torch.matmul(a, b, out=c)
        for s in (push, landed):
            main.wait_stream(s)
        end = timed_event(main)
        return begin, pushed, seen, started, end

    variants = ("side stream", "priority", "caller", "SM wait, side stream", "caller, SM wait")
    rows = {}
    for variant in variants:
        samples = []
        for rep in range(3 + args.repetitions):
            start_together(dist.group.WORLD, dev)
            begin, pushed, seen, started, end = call(variant)
            torch.cuda.synchronize()
            if rep >= 3:
                samples.append([begin.elapsed_time(end) * 1e3]
                               + [p.elapsed_time(s) * 1e3 for p, s in zip(pushed, seen)]
                               + [p.elapsed_time(s) * 1e3 for p, s in zip(pushed, started)]
                               + [begin.elapsed_time(p) * 1e3 for p in pushed])
        med = torch.tensor([statistics.median(col) for col in zip(*samples)], dtype=torch.float64, device=dev)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        rows[variant] = med.tolist()
    # every byte landed: the last call's pushes
    torch.cuda.synchronize()
    dist.barrier()
    sent = buf.local[: n * size].clone()
    got = [torch.empty_like(sent) for _ in range(ws)]
    dist.all_gather(got, sent)
    ok = all(torch.equal(buf.local[(n + j) * size:(n + j + 1) * size], got[source[j]][j * size:(j + 1) * size])
             for j in range(n))
    if rank == 0:
        print(f"{ws} ranks, {n} pushes of {args.mib} MiB to {'each peer in turn' if args.fan else 'the next rank'}, term GEMM {args.gemm}{', entry waited' if args.entry else ''}; bytes right: {ok}")
        print("| variant | call, µs | push j done (µs after start) | seen − own push j done | term start − own push j done |")
        print("|---|---|---|---|---|")
        for variant, r in rows.items():
            done = " / ".join(f"{x:.1f}" for x in r[1 + 2 * n:])
            seen = " / ".join(f"{x:+.1f}" for x in r[1:1 + n])
            start = " / ".join(f"{x:+.1f}" for x in r[1 + n:1 + 2 * n])
            print(f"| {variant} | {r[0]:.1f} | {done} | {seen} | {start} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
