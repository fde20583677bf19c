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
- `row_major`, `swizzle`: as above, ignoring when chunks leave (a swizzle group stays inside one
  rank's block). With more than two ranks, or NCCL's paired batches, they can deadlock:
  `check_candidate` accepts them for producers only on two ranks with the copy engine or a copier (sm_copy, nvshmem).
- `arrival`: tiles of the chunk that leaves first, first, GROUP_M swizzle inside a chunk; the rows
  the rank keeps come last, in the order their incoming partials arrive.
- `arrival_colmajor`: the same chunk order, column-major inside a chunk.
- `kept_interleaved` (direct plans): the arrival order with each kept chunk moved up among the
  sent ones, one split's sends after the peers send its last partial (for two ranks and four
  splits: L0 L1 K0 L2 K1 L3 K2 K3). An all-reduce can then gather each reduced chunk while the
  GEMM goes on, instead of after it. Opt-in (not in the default space) until measured.

A producer's order is a list of *entries*, each a tile and the one chunk whose rows it finishes
(adds the partials received for them, stores them, counts the tile in the chunk). A tile with rows
of two chunks (where a block boundary is not a multiple of BLOCK_M) has two entries, one per chunk,
each computing the tile: with the arrival orders each sits among the tiles of its own chunk, so an
entry never waits for one chunk's partials while holding back a chunk that has to leave earlier
(a program blocked there would hold every later entry of its program too; two ranks could then
each wait for the other's chunk). The row-major orders walk such an m-tile as two rows of entries,
the chunk that leaves first first.

Pure Python.
"""

from __future__ import annotations

import itertools
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
    "TAIL_MAX_SPLIT",
    "tail_split",
]

CONSUMER_ORDERS: tuple[str, ...] = ("arrival", "arrival_colmajor", "swizzle", "row_major")
PRODUCER_ORDERS: tuple[str, ...] = ("arrival", "arrival_colmajor", "swizzle", "row_major", "kept_interleaved")
TILE_ORDERS: tuple[str, ...] = tuple(dict.fromkeys(CONSUMER_ORDERS + PRODUCER_ORDERS))
"""Every tile order name."""


TAIL_MAX_SPLIT = 4
"""Most parts a tile of the consumer's last wave is cut into (`tail_split`)."""


def tail_split(tiles: int, programs: int, k_steps: int, own_tiles: int = 0) -> int:
    """How many K parts the all-gather's consumer cuts each tile of its last, partly filled wave into
    (0: none). The kernel's launcher and the cost model both ask here.

    `tiles` positions over `programs` persistent programs leave `tiles % programs` for a last wave
    that costs as long as a full one. Where that remainder is at most half the programs, each of
    its tiles is cut into as many K parts as fit among the programs (at most TAIL_MAX_SPLIT, at
    least one K step each), so the wave takes about a part's time and the parts' sum. Not where the
    rank's own tiles (read from its shard, first in the order) reach into that wave."""
    if programs < 2:
        return 0
    whole, rest = divmod(tiles, programs)
    if whole < 1 or rest == 0 or 2 * rest > programs or own_tiles > whole * programs:
        return 0
    split = min(programs // rest, TAIL_MAX_SPLIT, k_steps)
    return split if split >= 2 else 0


def swizzle_group(tms: list[int], tiles_n: int, group_m: int) -> list[tuple[int, int]]:
    """GROUP_M swizzle over the given m-tiles: `group_m` m-tiles walk one column block together."""
    return [
        (tm, tn) for g in range(0, len(tms), group_m) for tn in range(tiles_n) for tm in tms[g : g + group_m]
    ]


def _swizzle_ids(tms: list[int], tiles_n: int, group_m: int) -> list[int]:
    """`swizzle_group`'s order as tile ids (tm·tiles_n + tn); `group_m` = len(tms): column-major."""
    return [tm * tiles_n + tn for tm, tn in swizzle_group(tms, tiles_n, max(1, group_m))]


@dataclass(frozen=True, slots=True)
class TileSchedule:
    """A tile order plus the per-tile chunk bookkeeping that a kernel needs, for one rank."""

    order: tuple[int, ...]
    """Tile ids (tm·tiles_n + tn) in the order the persistent programs take them (for a producer, a
    tile with rows of two chunks appears twice: see `entry_chunk`)."""
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
    entry_chunk: tuple[int, ...] = ()
    """Producer only: for each position of `order`, the chunk whose rows that entry finishes (a tile
    with rows of two chunks appears twice); empty for a consumer, whose tiles read all their rows."""

    def position_of(self) -> dict[int, int]:
        return {tile: i for i, tile in enumerate(self.order)}


def _mtile_chunks(plan: ChunkPlan, tiles_m: int, block_m: int) -> tuple[list[int], list[int]]:
    """For each m-tile, the first chunk its rows overlap and one past the last."""
    spans = [plan.chunks_of_rows(tm * block_m, (tm + 1) * block_m) for tm in range(tiles_m)]
    return [r.start for r in spans], [r.stop for r in spans]


def _mtiles_of_chunks(lo: list[int], hi: list[int], num_chunks: int) -> list[list[int]]:
    """For each chunk, the m-tiles whose rows overlap it, in order."""
    out: list[list[int]] = [[] for _ in range(num_chunks)]
    for tm, (a, b) in enumerate(zip(lo, hi)):
        for c in range(a, b):
            out[c].append(tm)
    return out


def _check_order(order: str, group_m: int, allowed: tuple[str, ...]) -> None:
    if order not in allowed:
        raise ConfigError(f"unknown tile order {order!r}: accepted are {', '.join(allowed)}")
    if group_m < 1:
        raise ConfigError(f"group_m={group_m} must be at least 1")


def _ordered(
    order: str, keys: list[float], tiles_m: int, tiles_n: int, group_m: int, allowed: tuple[str, ...]
) -> list[int]:
    """Tile ids in `order`; `keys[tm]` ranks m-tiles for the arrival orders (ties in row order)."""
    _check_order(order, group_m, allowed)
    all_tms = list(range(tiles_m))
    if order == "row_major":
        return list(range(tiles_m * tiles_n))
    if order == "swizzle":
        return _swizzle_ids(all_tms, tiles_n, group_m)
    by_key: dict[float, list[int]] = {}
    for tm in all_tms:
        by_key.setdefault(keys[tm], []).append(tm)
    ids: list[int] = []
    for key in sorted(by_key):
        tms = by_key[key]
        ids += _swizzle_ids(tms, tiles_n, group_m if order == "arrival" else len(tms))
    return ids


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


def _kept_interleaved_keys(plan: ChunkPlan, rank: int, ready: list[int], keys: list[float]) -> list[float]:
    """Chunk keys that put a kept chunk after this rank's send slot `m + ws - 1`, where m is the
    latest slot at which a peer sends one of its partials (direct plans: every rank's sends have
    the same structure, so the peers reach slot m when this rank does)."""
    if plan.template != "direct":
        raise ConfigError(f"tile order 'kept_interleaved' needs the direct plan, not {plan.template!r}")
    slot = {
        (t.src, t.chunk): i
        for p in range(plan.world_size)
        for i, t in enumerate(plan.sends(p, "reduce"))
        if t.dst == rank
    }
    last: dict[int, int] = {}  # kept chunk -> the latest peer send slot of one of its partials
    for t in plan.recvs(rank, "reduce"):
        c = plan.chunk_index(*t.chunk)
        last[c] = max(last.get(c, -1), slot[(t.src, t.chunk)])
    out = list(keys)
    n_sent = sum(1 for x in ready if x >= 0)
    for c, m in last.items():
        after = min(m + plan.world_size - 1, n_sent - 1)
        out[c] = after + 0.5 + c / (4 * plan.num_chunks)  # after that send; kept chunks in row order
    return out


def producer_schedule(
    plan: ChunkPlan, rank: int, n_cols: int, block_m: int, block_n: int, group_m: int, order: str
) -> TileSchedule:
    """Schedule of a reduce-scatter producer on `rank`: entries (tile, chunk) in send order.

    A chunk that `rank` sends gets a ready slot (its position in the rank's send order); a chunk
    that `rank` receives partials for lists their signal slots in `chunk_wait`; the entries that
    finish its rows add them before storing.
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
    # in the order of its last incoming partial.
    chunk_key = [ready[c] if ready[c] >= 0 else n_sent + 1 + arrival[c] for c in range(plan.num_chunks)]
    if order == "kept_interleaved":
        chunk_key = _kept_interleaved_keys(plan, rank, ready, chunk_key)
    _check_order(order, group_m, PRODUCER_ORDERS)
    if order in ("row_major", "swizzle"):
        # The rows of an m-tile that belong to one chunk make one row of entries (an m-tile with rows
        # of two chunks makes two, the chunk that leaves first first); swizzle groups start afresh
        # where the rows pass to another rank's block.
        rows = [
            (tm, c) for tm in range(tiles_m) for c in sorted(range(lo[tm], hi[tm]), key=chunk_key.__getitem__)
        ]
        runs = [list(g) for _, g in itertools.groupby(rows, key=lambda row: row[1] // plan.num_splits)]
        entries = []
        for run in runs:
            pairs = swizzle_group(run, tiles_n, group_m if order == "swizzle" else 1)
            entries += [(tm * tiles_n + tn, c) for (tm, c), tn in pairs]
        tiles, chunks = [t for t, _ in entries], [c for _, c in entries]
    else:
        tiles, chunks = [], []
        tms_of = _mtiles_of_chunks(lo, hi, plan.num_chunks)
        for c in sorted(range(plan.num_chunks), key=chunk_key.__getitem__):
            tms = tms_of[c]
            ids = _swizzle_ids(tms, tiles_n, group_m if order == "arrival" else len(tms))
            tiles += ids
            chunks += [c] * len(ids)
    counts = [0] * plan.num_chunks
    for tm in range(tiles_m):
        for c in range(lo[tm], hi[tm]):
            counts[c] += tiles_n
    waits = tuple(tuple(slots) for slots in plan.chunk_signals(rank, "reduce"))
    return TileSchedule(
        order=tuple(tiles),
        tiles_m=tiles_m,
        tiles_n=tiles_n,
        mtile_chunk_lo=tuple(lo),
        mtile_chunk_hi=tuple(hi),
        chunk_wait=waits,
        chunk_ready=tuple(ready),
        chunk_tiles=tuple(counts),
        entry_chunk=tuple(chunks),
    )
