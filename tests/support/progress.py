"""A reduce-scatter as the kernels and backends run it, stepped until nothing moves.

Every rank's producer kernel: P persistent programs, program p taking positions p, p+P, … of the
rank's tile order (`producer_schedule`); a tile closes its chunks in the kernel's order (of a
tile with rows of two chunks, the one that leaves first, first); closing a chunk waits until every
partial it adds has arrived, then counts the tile; a chunk whose tiles are all counted raises its
ready word. Every rank's communication, per backend as `syncopate.kernels.backends` issues it:

- `copy_engine`: one in-order queue per plan stream; a send waits for its ready word;
- `nvshmem`: one in-order job list (the chunk-copy kernel) with the same waits;
- `nccl`: one batch per (step, split) in order; a batch is posted once its sends are ready and
  completes when every peer it sends to or receives from has posted the same batch.

A transfer's arrival raises the receiver's signal slot. Waits are assumed fair (all programs
resident, every queue served), so what is left waiting when nothing can move waits forever.
Pure Python (no torch): the same schedules the kernels' tables are built from.
"""

from __future__ import annotations

from syncopate.search_space import ChunkPlan, producer_schedule

__all__ = ["stalled"]


def stalled(plan: ChunkPlan, n_cols: int, block_m: int, block_n: int, group_m: int, order: str, programs: int,
            backend: str) -> list[tuple[int, int]]:
    """(rank, program) of every program left waiting forever; empty when the call completes."""
    ws = plan.world_size
    scheds = [producer_schedule(plan, r, n_cols, block_m, block_n, group_m, order) for r in range(ws)]
    sends = [plan.sends(r, "reduce") for r in range(ws)]
    recvs = [plan.recvs(r, "reduce") for r in range(ws)]
    arrived: list[set[int]] = [set() for _ in range(ws)]
    ready: list[set[int]] = [set() for _ in range(ws)]
    counted = [[0] * plan.num_chunks for _ in range(ws)]
    # per rank and program: [positions, next position index, chunks of the current tile closed]
    progs = []
    for s in scheds:
        p = max(1, min(programs, len(s.order)))
        progs.append([[range(q, len(s.order), p), 0, 0] for q in range(p)])

    def chunks_of(r: int, tile: int) -> list[int]:
        s = scheds[r]
        tm = tile // s.tiles_n
        c0, c1 = s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm] - 1
        if c0 == c1:
            return [c0]
        r0, r1 = s.chunk_ready[c0], s.chunk_ready[c1]
        return [c1, c0] if r1 >= 0 and (r0 < 0 or r1 < r0) else [c0, c1]

    def close(r: int, c: int) -> bool:
        s = scheds[r]
        if not arrived[r].issuperset(s.chunk_wait[c]):
            return False
        counted[r][c] += 1
        if counted[r][c] == s.chunk_tiles[c] and s.chunk_ready[c] >= 0:
            ready[r].add(s.chunk_ready[c])
        return True

    def run_programs() -> bool:
        moved = False
        for r in range(ws):
            for prog in progs[r]:
                positions = prog[0]
                while prog[1] < len(positions):
                    cs = chunks_of(r, scheds[r].order[positions[prog[1]]])
                    if not close(r, cs[prog[2]]):
                        break
                    moved = True
                    prog[2] += 1
                    if prog[2] == len(cs):
                        prog[1], prog[2] = prog[1] + 1, 0
        return moved

    if backend in ("copy_engine", "nvshmem"):
        streams = plan.num_streams if backend == "copy_engine" else 1
        queues = [[i for i, t in enumerate(sends[r]) if streams == 1 or t.stream == stream]
                  for r in range(ws) for stream in range(streams)]
        owner = [r for r in range(ws) for _ in range(streams)]

        def run_comm() -> bool:
            moved = False
            for r, q in zip(owner, queues):
                while q and q[0] in ready[r]:
                    t = sends[r][q.pop(0)]
                    arrived[t.dst].add(t.signal)
                    moved = True
            return moved
    elif backend == "nccl":
        def key(t):
            return (t.step, t.split)

        batches = [sorted({key(t) for t in sends[r]} | {key(t) for t in recvs[r]}) for r in range(ws)]
        posted = [-1] * ws
        done = [0] * ws

        def reached(x: int, k) -> bool:
            return k in batches[x] and batches[x].index(k) <= posted[x]

        def run_comm() -> bool:
            moved = False
            for r in range(ws):
                b = done[r]
                if b == len(batches[r]):
                    continue
                k = batches[r][b]
                if posted[r] < b and all(i in ready[r] for i, t in enumerate(sends[r]) if key(t) == k):
                    posted[r] = b
                    moved = True
                mine = [t for t in sends[r] + recvs[r] if key(t) == k]
                if posted[r] == b and all(reached(t.src, k) and reached(t.dst, k) for t in mine):
                    arrived[r].update(t.signal for t in recvs[r] if key(t) == k)
                    done[r] += 1
                    moved = True
            return moved
    else:
        raise ValueError(f"unknown backend {backend!r}")

    while run_programs() | run_comm():
        pass
    return [(r, q) for r in range(ws) for q, prog in enumerate(progs[r]) if prog[1] < len(prog[0])]
