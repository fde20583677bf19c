"""Tile orders: the order in which a persistent kernel walks its output tiles.

Output tile (tm, tn) covers rows [tm·BLOCK_M, (tm+1)·BLOCK_M) and columns [tn·BLOCK_N, …); its id is
tm·tiles_n + tn. A persistent program p takes positions p, p+P, p+2P, … of the order, so position i
runs in wave i // P.

Consumer orders (`ag_gemm`: tiles read rows of A that arrive in chunks):
- `row_major`: all m-tiles top to bottom, N inner. The naive reference; ignores arrival.
- `swizzle`: GROUP_M swizzle over all of M, as a plain GEMM does; ignores arrival.
- `arrival`: the local shard's tiles first, then the tiles of each chunk in arrival order, GROUP_M
  swizzle inside a chunk (L2 reuse of B and of the chunk's rows).
- `arrival_colmajor`: arrival order of chunks, and inside a chunk all its m-tiles for one column
  block of B before the next (the most reuse of B when chunks are short).

Producer orders (`gemm_rs`, `gemm_ar`: tiles write partial rows that leave in chunks):
- `row_major`, `swizzle`: as above, ignoring when chunks leave.
- `arrival`: tiles of the chunk that leaves first, first, GROUP_M swizzle inside a chunk; the rows
  the rank keeps come last, in the order their incoming partials arrive.
- `arrival_colmajor`: the same chunk order, column-major inside a chunk.

Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncopate.errors import ConfigError
from syncopate.search_space.chunk_plan import ChunkPlan

__all__ = [
    "TILE_ORDERS",
    "CONSUMER_ORDERS",
    "PRODUCER_ORDERS",
    "TileSchedule",
    "consumer_schedule",
    "producer_schedule",
    "swizzle_group",
]

CONSUMER_ORDERS: tuple[str, ...] = ("arrival", "arrival_colmajor", "swizzle", "row_major")
PRODUCER_ORDERS: tuple[str, ...] = ("arrival", "arrival_colmajor", "swizzle", "row_major")
TILE_ORDERS: tuple[str, ...] = tuple(dict.fromkeys(CONSUMER_ORDERS + PRODUCER_ORDERS))
"""Every tile order name."""


def swizzle_group(tms: list[int], tiles_n: int, group_m: int) -> list[tuple[int, int]]:
    """GROUP_M swizzle over the given m-tiles: `group_m` m-tiles walk one column block together."""
    out = []
    for g in range(0, len(tms), group_m):
        group = tms[g : g + group_m]
        for tn in range(tiles_n):
            out.extend((tm, tn) for tm in group)
    return out


def _colmajor(tms: list[int], tiles_n: int) -> list[tuple[int, int]]:
    return [(tm, tn) for tn in range(tiles_n) for tm in tms]


@dataclass(frozen=True, slots=True)
class TileSchedule:
    """A tile order plus the per-tile chunk bookkeeping that a kernel needs, for one rank."""

    order: tuple[int, ...]
    """Tile ids (tm·tiles_n + tn) in the order the persistent programs take them."""
    tiles_m: int
    tiles_n: int
    mtile_chunk_lo: tuple[int, ...]
    """For each m-tile, the first chunk (row order) its rows overlap."""
    mtile_chunk_hi: tuple[int, ...]
    """For each m-tile, one past the last chunk its rows overlap."""
    chunk_wait: tuple[tuple[int, ...], ...]
    """For each chunk, the signal slots to wait for before reading it (consumer) or before adding
    the partials received for it (producer)."""
    chunk_ready: tuple[int, ...]
    """Producer only: for each chunk, the local ready-signal slot raised when all its tiles are
    stored, or -1 when the chunk does not leave this rank."""
    chunk_tiles: tuple[int, ...]
    """Producer only: how many tiles overlap each chunk (the counter's target)."""

    def position_of(self) -> dict[int, int]:
        return {tile: i for i, tile in enumerate(self.order)}


def _mtile_chunks(plan: ChunkPlan, tiles_m: int, block_m: int) -> tuple[list[int], list[int]]:
    lo, hi = [], []
    for tm in range(tiles_m):
        r = plan.chunks_of_rows(tm * block_m, (tm + 1) * block_m)
        lo.append(r.start)
        hi.append(r.stop)
    return lo, hi


def _ordered(
    order: str, keys: list[float], tiles_m: int, tiles_n: int, group_m: int, allowed: tuple[str, ...]
) -> list[int]:
    """Tile ids in `order`; `keys[tm]` ranks m-tiles for the arrival orders (ties in row order)."""
    if order not in allowed:
        raise ConfigError(f"unknown tile order {order!r}: accepted are {', '.join(allowed)}")
    if group_m < 1:
        raise ConfigError(f"group_m={group_m} must be at least 1")
    all_tms = list(range(tiles_m))
    if order == "row_major":
        pairs = [(tm, tn) for tm in all_tms for tn in range(tiles_n)]
    elif order == "swizzle":
        pairs = swizzle_group(all_tms, tiles_n, group_m)
    else:
        pairs = []
        for key in sorted(set(keys)):
            tms = [tm for tm in all_tms if keys[tm] == key]
            pairs += swizzle_group(tms, tiles_n, group_m) if order == "arrival" else _colmajor(tms, tiles_n)
    return [tm * tiles_n + tn for tm, tn in pairs]


def consumer_schedule(
    plan: ChunkPlan, rank: int, n_cols: int, block_m: int, block_n: int, group_m: int, order: str
) -> TileSchedule:
    """Schedule of an all-gather consumer on `rank`: out[total_rows, n_cols] reads gathered rows."""
    tiles_m = -(-plan.total_rows // block_m)
    tiles_n = -(-n_cols // block_n)
    lo, hi = _mtile_chunks(plan, tiles_m, block_m)
    arrival = plan.arrival_rank(rank, "gather")
    keys = [max(arrival[c] for c in range(lo[tm], hi[tm])) for tm in range(tiles_m)]
    waits = tuple(tuple(slots) for slots in plan.chunk_signals(rank, "gather"))
    return TileSchedule(
        order=tuple(_ordered(order, keys, tiles_m, tiles_n, group_m, CONSUMER_ORDERS)),
        tiles_m=tiles_m,
        tiles_n=tiles_n,
        mtile_chunk_lo=tuple(lo),
        mtile_chunk_hi=tuple(hi),
        chunk_wait=waits,
        chunk_ready=tuple([-1] * plan.num_chunks),
        chunk_tiles=tuple([0] * plan.num_chunks),
    )


def producer_schedule(
    plan: ChunkPlan, rank: int, n_cols: int, block_m: int, block_n: int, group_m: int, order: str
) -> TileSchedule:
    """Schedule of a reduce-scatter producer on `rank`: tiles of partial rows, in send order.

    A chunk that `rank` sends gets a ready slot (its position in the rank's send order); a chunk
    that `rank` receives partials for lists their signal slots in `chunk_wait`; the epilogue of its
    tiles adds them before storing.
    """
    tiles_m = -(-plan.total_rows // block_m)
    tiles_n = -(-n_cols // block_n)
    lo, hi = _mtile_chunks(plan, tiles_m, block_m)
    ready = [-1] * plan.num_chunks
    for slot, t in enumerate(plan.sends(rank, "reduce")):
        ready[plan.chunk_index(t.block, t.split)] = slot
    arrival = plan.arrival_rank(rank, "reduce")
    n_sent = len(plan.sends(rank, "reduce"))
    # A chunk that leaves ranks by its send position; a chunk kept here ranks after every sent one,
    # in the order of its last incoming partial. An m-tile with rows of both (where a block
    # boundary is not a multiple of BLOCK_M) goes between the two groups: its epilogue waits for
    # partials, and a program blocked there must hold no tile of a chunk that still has to leave,
    # or two ranks can each wait for the other's chunk (the kernel stores and counts the tile's
    # leaving rows before it waits for the kept ones).
    chunk_key = [ready[c] if ready[c] >= 0 else n_sent + 1 + arrival[c] for c in range(plan.num_chunks)]

    def key(tm: int) -> float:
        chunks = range(lo[tm], hi[tm])
        if any(ready[c] >= 0 for c in chunks) and any(ready[c] < 0 for c in chunks):
            return n_sent - 0.5
        return min(chunk_key[c] for c in chunks)

    keys = [key(tm) for tm in range(tiles_m)]
    counts = [0] * plan.num_chunks
    for tm in range(tiles_m):
        for c in range(lo[tm], hi[tm]):
            counts[c] += tiles_n
    waits = tuple(tuple(slots) for slots in plan.chunk_signals(rank, "reduce"))
    return TileSchedule(
        order=tuple(_ordered(order, keys, tiles_m, tiles_n, group_m, PRODUCER_ORDERS)),
        tiles_m=tiles_m,
        tiles_n=tiles_n,
        mtile_chunk_lo=tuple(lo),
        mtile_chunk_hi=tuple(hi),
        chunk_wait=waits,
        chunk_ready=tuple(ready),
        chunk_tiles=tuple(counts),
    )
