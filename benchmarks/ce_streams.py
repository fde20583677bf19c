"""How fast the copy engines move a rank's chunks to its peers, by how many streams carry them.

    torchrun --nproc-per-node 4 benchmarks/ce_streams.py [--mib 16,48] [--streams 1,2,3] [--json FILE]

Every rank copies `MiB` to each peer's symmetric buffer at once (an all-gather's pushes: what the
`copy_engine` backend's direct plans enqueue), with the peers spread round-robin over `streams`
side streams (1: every copy in a row on one stream, as the direct plans enqueue them). Beside it,
NCCL's all-gather of the same bytes. Per case: the time from a common start to the last copy's end
(`time_collective`: L2 flushed, ranks started together, CUDA events; median of `--repetitions`, the
slowest rank's), and the rate a rank sends at. One stream a peer lets copies run on several copy engines at once; the
table says whether the GPUs' links give more that way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def stream_of_peers(rank: int, world: int, streams: int) -> dict[int, int]:
    """Peer → the side stream its copies go on: peers in the order the direct plans visit them
    (rank + 1, rank + 2, …), dealt round-robin over `streams`."""
    if streams < 1:
        raise ValueError(f"streams={streams}: at least one")
    return {(rank + s) % world: (s - 1) % streams for s in range(1, world)}


def parse_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{what} {text!r}: give positive integers, comma-separated (e.g. 1,2,3)") from None
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"{what} {text!r}: give positive integers, comma-separated (e.g. 1,2,3)")
    return values


def _time(enqueue, group, repetitions: int) -> float:
    """Median µs of what `enqueue()` puts on the current stream and its side streams, the slowest
    rank's, by the project's method (`time_collective`: ranks started together, CUDA events)."""
    from syncopate.measure.timing import time_collective

    return statistics.median(time_collective(enqueue, group, repetitions=repetitions).samples_us)


def run(args) -> list[dict]:
    import torch
    import torch.distributed as dist

    from syncopate.kernels import streamops
    from syncopate.kernels.context import OverlapContext

    group, rank, world = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    most = max(args.streams)
    rows = []
    for mib in args.mib:
        nbytes = mib << 20
        ctx = OverlapContext.create(group, {"rows": ((world, nbytes), torch.uint8)}, num_streams=most)
        buf = ctx.buffers["rows"]
        mine = buf.local[rank]
        mine.fill_(rank + 1)
        src = mine.data_ptr()
        for streams in args.streams:
            peers = stream_of_peers(rank, world, streams)
            side = ctx.streams[:streams]

            def enqueue(peers=peers, side=side):
                main = torch.cuda.current_stream()
                ctx.fork(main, side)
                for peer, s in peers.items():
                    streamops.copy_async(
                        side[s].cuda_stream, buf.peer_ptrs[peer] + rank * nbytes, src, nbytes
                    )
                ctx.join(main, side)

            us = _time(enqueue, group, args.repetitions)
            torch.cuda.synchronize()
            dist.barrier(group=group)
            landed = all(int(buf.local[p][0].item()) == p + 1 for p in peers)
            rows.append({"what": f"copy engine, {streams} stream(s)", "mib": mib, "us": us, "landed": landed})
        gathered = torch.empty((world, nbytes), dtype=torch.uint8, device="cuda")
        us = _time(lambda: dist.all_gather_into_tensor(gathered, mine, group=group), group, args.repetitions)
        rows.append({"what": "NCCL all_gather_into_tensor", "mib": mib, "us": us, "landed": True})
        ctx.close()
    for r in rows:
        r["gb_per_s"] = (world - 1) * (r["mib"] << 20) / r["us"] / 1e3  # bytes a rank sends, per µs → GB/s
    return rows


def table(rows: list[dict], world: int, device: str) -> str:
    lines = [
        f"{world} × {device}: each rank sends MiB to each of its {world - 1} peers at once",
        f"{'what':<30} {'MiB':>6} {'µs':>9} {'GB/s a rank':>12}  landed",
    ]
    lines += [
        f"{r['what']:<30} {r['mib']:>6} {r['us']:>9.1f} {r['gb_per_s']:>12.1f}  {r['landed']}" for r in rows
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", default="16,48", help="MiB a rank sends each peer, comma-separated")
    p.add_argument("--streams", default="1,2,3", help="side stream counts to spread the peers over")
    p.add_argument("--repetitions", type=int, default=20)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    args.mib, args.streams = parse_list(args.mib, "--mib"), parse_list(args.streams, "--streams")
    if "WORLD_SIZE" not in os.environ:
        p.error("run it under torchrun, one process a GPU (e.g. torchrun --nproc-per-node 4 ...)")
    import torch
    import torch.distributed as dist

    from syncopate.measure.local_ranks import join_torchrun

    device = join_torchrun()
    try:
        rows = run(args)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(table(rows, int(os.environ["WORLD_SIZE"]), torch.cuda.get_device_name(device)))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": torch.cuda.get_device_name(device), "rows": rows}, fh, indent=2)
    return 0 if all(r["landed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
