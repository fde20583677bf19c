"""How fast the copy engine moves a rank's bytes when every rank sends at once: to one peer or to
every peer, on one stream or several (each copy on its own stream gets its own copy engine), pushes
(the source's copy engine writes into the peer) or pulls, alone or beside a cuBLAS GEMM.

    torchrun --nproc-per-node 4 benchmarks/ce_fanout.py [--mib 16] [--gemm 8192,4096,2752]

Each variant moves `--mib` MiB from every rank to each destination it names (to `r+1` only: three
times that, so that both kinds move the same bytes), through `syncopate.kernels.streamops.copy_async`
into the symmetric buffers of an `OverlapContext`, as the copy-engine backend does. Timed by
`syncopate.kernels.timing.time_collective` (L2 flushed, ranks started together, the largest over the
ranks, the median of 15). `loaded` runs the GEMM on the caller's stream meanwhile: its column is the
whole call, and `copies` the copies' own span (events from the fork to each side stream's last copy,
the largest over streams and ranks, median). The bytes that land are checked once per variant.
`--chunks N` adds N copies of `--mib` MiB to r+1 on one stream, as the copy-engine backend issues a
chunk plan's (a `streamops.Program`): plain, each followed by the peer's signal, each also behind a
wait on its ready word (raised beforehand, so the wait never holds: its cost alone), and with the
signal sent as a 4-byte copy instead of a stream write. Rank 0 prints a table: µs and GB/s a rank
sends, alone and loaded, and NCCL's all-to-all of the same bytes for scale.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20


def plan(kind: str, rank: int, ws: int, size: int, streams: int) -> list[tuple[int, int, int, int]]:
    """(stream, peer, byte offset in the rank's slot, bytes) of each copy a rank issues.

    `one`: (ws−1)·size bytes to peer r+1, cut into `streams` pieces, one a stream;
    `fan`: `size` bytes to every peer, peers one after another on one stream (`streams` 1), a peer a
    stream (`streams` ws−1), or each peer's bytes halved over two streams (`streams` 2·(ws−1))."""
    peers = [(rank + d) % ws for d in range(1, ws)]
    if kind == "one":
        total = (ws - 1) * size
        cuts = [total * i // streams for i in range(streams + 1)]
        return [(i, peers[0], cuts[i], cuts[i + 1] - cuts[i]) for i in range(streams)]
    if streams == 1:
        return [(0, p, 0, size) for p in peers]
    per = streams // (ws - 1)
    out = []
    for i, p in enumerate(peers):
        cuts = [size * j // per for j in range(per + 1)]
        out += [(i * per + j, p, cuts[j], cuts[j + 1] - cuts[j]) for j in range(per)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=16, help="MiB a rank sends to each peer (default 16)")
    ap.add_argument("--gemm", default="8192,4096,2752", help="M,N,K of the GEMM beside the copies")
    ap.add_argument("--chunks", type=int, default=0,
                    help="also time this many chunks of --mib MiB to r+1 as the copy-engine backend sends "
                         "them: each behind a wait on its ready word and followed by the peer's signal")
    ap.add_argument("--only-chunks", action="store_true", help="time the --chunks variants alone")
    args = ap.parse_args()

    from syncopate.kernels.local_ranks import join_torchrun

    dev = join_torchrun()
    import torch
    import torch.distributed as dist

    from syncopate.kernels import streamops
    from syncopate.kernels.context import OverlapContext
    from syncopate.kernels.timing import time_collective

    rank, ws = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    size = args.mib * MiB
    slot = (ws - 1) * size  # what one sender may put into one receiver
    # layout of every rank's buffer: [source: slot bytes][one receive slot per sender]
    ctx = OverlapContext.create(group, {"buf": (((1 + ws) * slot,), torch.uint8)})
    buf = ctx.buffers["buf"]
    ptr = buf.peer_ptrs
    src = buf.local[:slot]
    streams = [torch.cuda.Stream(device=dev) for _ in range(2 * max(ws - 1, 2))]
    m, n, k = (int(x) for x in args.gemm.split(","))
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    spans: list[tuple] = []

    def recv_at(owner: int, sender: int) -> int:
        return ptr[owner] + (1 + sender) * slot

    def call(kind: str, direction: str, nstreams: int, loaded: bool, record: bool):
        copies = plan(kind, rank, ws, size, nstreams)

        def fn() -> None:
            main = torch.cuda.current_stream()
            used = sorted({s for s, *_ in copies})
            begin = torch.cuda.Event(enable_timing=True) if record else None
            if record:
                begin.record(main)
            for s in used:
                streams[s].wait_stream(main)
            for s, peer, off, nbytes in copies:
                if direction == "push":  # this rank's copy engine writes into the peer
                    dst, src_addr = recv_at(peer, rank) + off, ptr[rank] + off
                else:  # pull: this rank's copy engine reads the peer's source
                    dst, src_addr = recv_at(rank, peer) + off, ptr[peer] + off
                streamops.copy_async(streams[s].cuda_stream, dst, src_addr, nbytes)
            if loaded:
                torch.matmul(a, b, out=c)
            ends = []
            for s in used:
                if record:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record(streams[s])
                    ends.append(e)
                main.wait_stream(streams[s])
            if record:
                spans.append((begin, ends))
        return fn

    def check(kind: str, direction: str, nstreams: int) -> bool:
        """Every byte a variant moves lands where it should (fresh pattern, receive slots poisoned)."""
        src.copy_(torch.randint(0, 256, (slot,), dtype=torch.uint8, device=dev))
        buf.local[slot:].fill_(0xA5)
        torch.cuda.synchronize()
        dist.barrier()
        call(kind, direction, nstreams, False, False)()
        torch.cuda.synchronize()
        dist.barrier()
        sources = [torch.empty_like(src) for _ in range(ws)]
        dist.all_gather(sources, src)
        ok = True
        for sender in range(ws):
            if sender == rank:
                continue
            # what `sender` sends this rank: pushes by the sender, or pulls by this rank from it
            got = [(off, nb) for _, p, off, nb in plan(kind, sender, ws, size, nstreams) if p == rank] \
                if direction == "push" else \
                [(off, nb) for _, p, off, nb in plan(kind, rank, ws, size, nstreams) if p == sender]
            for off, nb in got:
                lo = (1 + sender) * slot + off
                ok &= bool(torch.equal(buf.local[lo: lo + nb], sources[sender][off: off + nb]))
        flag = torch.tensor([int(ok)], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def timed(fn) -> float:
        return time_collective(fn, group, warmup=4, repetitions=15).median_us

    def copy_span(kind, direction, nstreams) -> float:
        spans.clear()
        timed(call(kind, direction, nstreams, True, True))
        torch.cuda.synchronize()
        local_us = torch.tensor([max(b.elapsed_time(e) for e in ends) * 1e3 for b, ends in spans[-15:]],
                                dtype=torch.float64, device=dev)
        dist.all_reduce(local_us, op=dist.ReduceOp.MAX)
        return statistics.median(local_us.tolist())

    def signalled(n: int) -> list[tuple]:
        """`n` copies of `size` bytes to r+1 on one of the context's streams, as streamops programs:
        plain; each followed by the peer's arrival word; each also behind a wait on a ready word
        (written before, so it never holds); a wait, the copy, then the signal as a 4-byte copy."""
        from syncopate.kernels.tables import READY_BASE

        peer = (rank + 1) % ws
        stream = ctx.streams[0]
        flag = torch.zeros(1, dtype=torch.int32, device=dev)
        out = []
        side = ctx.streams[1]
        current = {"epoch": 0}
        names = ("plain", "signalled", "waited, signalled", "waited, signal copied",
                 "waited, two streams in turn", "waited, signal on a side stream",
                 "waited, signal without a barrier")
        for name in names:
            p = streamops.Program()
            for j in range(n):
                off = j * size % slot
                s = ctx.streams[j % 2] if "two streams" in name else stream
                if name.startswith("waited"):
                    p.wait(s, ctx.signal_address(rank, READY_BASE + j))
                p.copy(s, recv_at(peer, rank) + off, ptr[rank] + off, min(size, slot))
                if name == "plain":
                    continue
                word = ctx.signal_address(peer, j)
                if name.endswith("copied"):
                    p.copy(s, word, flag.data_ptr(), 4)
                elif name.endswith("side stream"):
                    ev = torch.cuda.Event()
                    p.hook(lambda st, ev=ev, s=s: (ev.record(s), side.wait_event(ev)))
                    p.write(side, word)
                elif name.endswith("barrier"):
                    no_barrier = 0x1  # CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
                    p.hook(lambda st, s=s, word=word: streamops._driver().write(
                        s.cuda_stream, word, current["epoch"], no_barrier))
                else:
                    ctx.raise_signal(p, s, peer, j)
            used = [stream, side] if ("two streams" in name or "side stream" in name) else [stream]

            def fn(p=p, loaded=False, record=False, used=used) -> None:
                main = torch.cuda.current_stream()
                epoch = ctx.begin_call()
                for j in range(n):  # every ready word already raised: the waits never hold
                    streamops.write_value(main.cuda_stream, ctx.signal_address(rank, READY_BASE + j), epoch)
                begin = torch.cuda.Event(enable_timing=True)
                begin.record(main)
                for st in used:
                    st.wait_stream(main)
                current["epoch"] = epoch
                p.run(epoch)
                if loaded:
                    torch.matmul(a, b, out=c)
                ends = []
                for st in used:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record(st)
                    ends.append(end)
                    main.wait_stream(st)
                if record:
                    spans.append((begin, ends))

            alone = timed(fn)
            loaded = timed(lambda p=p: fn(p, True))
            spans.clear()
            timed(lambda p=p: fn(p, True, True))
            torch.cuda.synchronize()
            us = torch.tensor([max(b_.elapsed_time(e) for e in ends) * 1e3 for b_, ends in spans[-15:]],
                              dtype=torch.float64, device=dev)
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            out.append((f"{n} × {args.mib} MiB to r+1, {name}", True, alone, loaded,
                        statistics.median(us.tolist()), n * size))
        return out

    sent = (ws - 1) * size
    gemm_us = timed(lambda: torch.matmul(a, b, out=c))
    rows = []
    variants = [("one", d, s) for d in ("push", "pull") for s in (1, 2, 3)]
    if ws > 2:
        variants += [("fan", d, s) for d in ("push", "pull") for s in (1, ws - 1, 2 * (ws - 1))]
    if args.only_chunks:
        variants = []
    for kind, direction, nstreams in variants:
        ok = check(kind, direction, nstreams)
        alone = timed(call(kind, direction, nstreams, False, False))
        loaded = timed(call(kind, direction, nstreams, True, False))
        span = copy_span(kind, direction, nstreams)
        name = f"{kind} {direction} {nstreams} stream{'s' if nstreams > 1 else ''}"
        rows.append((name, ok, alone, loaded, span, sent))
    if args.chunks:
        rows += signalled(args.chunks)
    a2a_in = torch.empty(ws * size, dtype=torch.uint8, device=dev)
    a2a_out = torch.empty_like(a2a_in)
    nccl = timed(lambda: dist.all_to_all_single(a2a_out, a2a_in))
    if rank == 0:
        print(f"\n{ws} ranks, {args.mib} MiB to each peer ({sent / MiB:.0f} MiB a rank sends); "
              f"GEMM {m}x{n}x{k} alone {gemm_us:.1f} us; NCCL all-to-all of the same bytes "
              f"{nccl:.1f} us ({sent / nccl / 1e3:.0f} GB/s)")
        print("| variant | right | alone, us | GB/s | with the GEMM, us | copies' span, us | GB/s loaded |")
        print("|---|---|---|---|---|---|---|")
        for name, ok, alone, loaded, span, nbytes in rows:
            print(f"| {name} | {'yes' if ok else 'NO'} | {alone:.1f} | {nbytes / alone / 1e3:.0f} | "
                  f"{loaded:.1f} | {span:.1f} | {nbytes / span / 1e3:.0f} |")
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
