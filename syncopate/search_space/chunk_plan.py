"""Chunk plans: which rows move from which rank to which, at which step, raising which signal.

The communicated tensor has `total_rows` rows (A for `ag_gemm`, the partial output for `gemm_rs`
and `gemm_ar`), split into `world_size` blocks of near-equal size: block b is owned by rank b (its
shard for a gather, the rows it reduces for a reduce-scatter). Each block is cut into `num_splits`
chunks. A plan is the list of every :class:`Transfer` of one call; the kernels only see small
integer tables derived from it (:meth:`ChunkPlan.recvs`, :meth:`ChunkPlan.sends`,
:meth:`ChunkPlan.chunk_signals`).

Phases:
- `gather`: the destination receives the final rows of the block (a copy).
- `reduce`: the destination receives a partial sum of the block's rows and adds its own partial.

Templates (steps are numbered from 1; `bidirectional_ring` sends the first half of each block's
chunks clockwise on stream 0 and the rest counter-clockwise on stream 1):

| template             | gather at step s, rank r receives        | reduce at step s, rank r sends        |
|----------------------|------------------------------------------|---------------------------------------|
| `direct`             | block (r+s) from its owner (r+s)         | its partial of block (r+s) to (r+s)   |
| `ring`               | block (r-s) from its left neighbour      | partial sum of block (r-s) to (r+1)   |
| `bidirectional_ring` | as ring, half from each neighbour        | as ring, half to each neighbour       |

`all_reduce` is a `reduce` phase with the template followed by a `direct` gather phase of the
reduced blocks (steps go on): every rank takes each reduced block straight from its owner, so the
reduced rows are written once into each rank's output.
Pure Python.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from syncopate.errors import ConfigError

__all__ = [
    "A_STATIONARY",
    "C_STATIONARY",
    "STATIONARY_KINDS",
    "DECOMPOSED",
    "COPY_ENGINE_KINDS",
    "UNFUSED",
    "PLANLESS_KINDS",
    "CANDIDATE_TEMPLATES",
    "TEMPLATES",
    "COLLECTIVES",
    "Transfer",
    "ChunkPlan",
    "build_plan",
    "block_bounds",
    "chunk_bounds",
    "gather_gemms",
    "gather_parts",
    "gather_splits_refusal",
    "gather_takes",
    "halves",
    "peers_ahead",
    "peers_behind",
    "row_chunks",
]

TEMPLATES: tuple[str, ...] = ("direct", "ring", "bidirectional_ring")
"""Routes of the chunks of the communicated tensor (plans :func:`build_plan` builds)."""

A_STATIONARY = "a_stationary"
"""An all-gather matmul that leaves A's shards where they are: B's shards go to every rank and each
rank sends back the products of its own rows with the peers' columns (`kernels/a_stationary.py`).
It moves K·N/ws + M/ws·N/ws elements a peer instead of M/ws·K, less where N/ws is small beside
M/ws; its row chunks are the `num_splits` pieces each product is sent in. No chunk plan."""

C_STATIONARY = "c_stationary"
"""A matmul reduce-scatter (or all-reduce) that computes each rank's output block on that rank:
every rank sends its columns of A for the block's rows and its rows of B, not its partial product
of the block (`kernels/c_stationary.py`). It moves M/ws·K/ws + K/ws·N elements a peer instead of
M/ws·N, less where K/ws is small beside N and M/ws; an all-reduce then gathers the blocks, in
`num_splits` chunks each. No chunk plan."""

STATIONARY_KINDS: dict[str, tuple[str, ...]] = {
    A_STATIONARY: ("ag_gemm",),
    C_STATIONARY: ("gemm_rs", "gemm_ar"),
}
"""The templates that move operands instead of chunks of the communicated tensor, and the kinds of
op each is for."""

DECOMPOSED = "decomposed"
"""The op cut into cuBLAS GEMMs over row pieces, the copy engine moving each piece's rows once
ready, no fused kernel: where the fused kernels' tiles are slower than cuBLAS's and the link keeps
up. A matmul reduce-scatter (or all-reduce): `num_splits` row chunks of each rank's block, the
partials of the peers' blocks first, each pushed to its owner once computed, then the own block's
chunks summed onto the peers' partials in the GEMM's epilogue (`kernels/decomposed.py`; an
all-reduce's peers pull each reduced chunk once made). An all-gather matmul: every rank pushes its
shard to each peer in turn while its own rows' GEMM runs, then GEMMs over the peers' rows as they
land, `num_splits` of them (:func:`gather_gemms`; `kernels/decomposed_gather.py`). No chunk plan."""

COPY_ENGINE_KINDS: dict[str, tuple[str, ...]] = {
    **STATIONARY_KINDS,
    DECOMPOSED: ("ag_gemm", "gemm_rs", "gemm_ar"),
}
"""The templates whose GEMMs are cuBLAS's and whose transfers are copy-engine copies, and the kinds
of op each is for."""

UNFUSED = "unfused"
"""Nothing fused: the matmul and the group's whole collective one after the other, as torch's path
runs them (`kernels/library.py`'s `unfused`). A candidate like the others, measured beside them, so
that a shape where no overlap pays (a few hundred rows, where a fused call's fixed costs outweigh
what it hides) is served the unfused path where that measured fastest; a block shorter than every
tile of the space has it alone to tune. No chunk plan, no Syncopate kernel."""

PLANLESS_KINDS: dict[str, tuple[str, ...]] = {**COPY_ENGINE_KINDS, UNFUSED: ("ag_gemm", "gemm_rs", "gemm_ar")}
"""The templates with no chunk plan and no fused kernel (their GEMMs are cuBLAS's), and the kinds
of op each is for."""

CANDIDATE_TEMPLATES: tuple[str, ...] = TEMPLATES + tuple(PLANLESS_KINDS)
"""What a candidate's `template` may be."""


def row_chunks(rows: int, splits: int) -> list[tuple[int, int]]:
    """`rows` cut into `splits` near-equal chunks: an a_stationary product's pieces."""
    return [(j * rows // splits, (j + 1) * rows // splits) for j in range(splits)]


def peers_ahead(rank: int, world_size: int) -> list[int]:
    """The other ranks from `rank`'s successor on: r+1, r+2, ... (mod world size). The copy-engine
    templates send to them in this order, so that at each step every rank sends to one peer and
    receives from another."""
    return [(rank + d) % world_size for d in range(1, world_size)]


def peers_behind(rank: int, world_size: int) -> list[int]:
    """The other ranks from `rank`'s predecessor back: r-1, r-2, ...: the order in which what they
    send in :func:`peers_ahead` order reaches `rank`."""
    return [(rank - d) % world_size for d in range(1, world_size)]


def gather_parts(world_size: int, splits: int) -> int:
    """How many parts a decomposed all-gather matmul pushes each shard in: one where `splits` (at
    most ws - 1) groups the peers' shards into that many GEMMs, splits / (ws - 1) where it cuts each
    shard into that many GEMMs of its own."""
    return max(1, splits // max(1, world_size - 1))


def gather_takes(world_size: int, splits: int) -> bool:
    """Whether a decomposed all-gather matmul on `world_size` ranks takes `splits` whatever its
    shard's rows: 1 to ws-1 (groups of the peers' shards) or a multiple of ws-1 (parts of each)."""
    peers = world_size - 1
    return splits >= 1 and not (peers > 1 and splits > peers and splits % peers)


def gather_splits_refusal(world_size: int, splits: int, m_local: int) -> str | None:
    """Why a decomposed all-gather matmul cannot take `splits` (None where it can)."""
    peers = world_size - 1
    if not gather_takes(world_size, splits):
        return (
            f"decomposed all-gather on {world_size} ranks takes num_splits 1 to {peers} (GEMMs over groups of "
            f"the peers' shards) or a multiple of {peers} (each shard cut into num_splits/{peers} parts, a GEMM "
            f"each), not {splits}"
        )
    if gather_parts(world_size, splits) > m_local:
        return f"num_splits={splits} cuts each {m_local}-row shard into more parts than it has rows"
    return None


def gather_gemms(
    world_size: int, rank: int, m_local: int, splits: int
) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """The GEMMs a decomposed all-gather matmul runs over the peers' rows on `rank`, in order: (first
    row, end row, the (peer, part) pieces of shards it waits for). The shards land from the peer
    behind first (every rank pushes to the one ahead first): r-1, r-2, ... With one part a shard the
    peers are cut into `splits` groups of consecutive arrivals (the first the smallest), each one
    GEMM, or two where its rows wrap past row 0 (rank 0's shard then rank ws-1's); with more, each
    part of each shard is one GEMM."""
    ws = world_size
    peers = peers_behind(rank, ws)
    parts = row_chunks(m_local, gather_parts(ws, splits))
    if len(parts) > 1:
        groups = [[q] for q in peers]
    else:
        groups = [peers[lo:hi] for lo, hi in row_chunks(len(peers), min(splits, len(peers)))]
    out = []
    for group in groups:
        for j, (lo, hi) in enumerate(parts):
            ranges: list[list] = []
            for q in sorted(group):
                if ranges and ranges[-1][1] == q * m_local + lo:
                    ranges[-1][1] = q * m_local + hi
                    ranges[-1][2].append((q, j))
                else:
                    ranges.append([q * m_local + lo, q * m_local + hi, [(q, j)]])
            ranges.sort(key=lambda x: min(peers.index(q) for q, _ in x[2]))
            out += [
                (first, end, tuple(sorted(pieces, key=lambda p: peers.index(p[0]))))
                for first, end, pieces in ranges
            ]
    return out


def halves(splits: int) -> list[range]:
    """The first half of `splits` chunks (the larger where odd), then the rest; one where there is
    one chunk: what each of a decomposed call's partial GEMMs covers."""
    h = (splits + 1) // 2
    return [g for g in (range(0, h), range(h, splits)) if len(g)]


def last_chunk_cut(chunks: list[tuple[int, int]], all_reduce: bool) -> bool:
    """Whether a decomposed block's last own GEMM is cut in two (`own_gemm_rows`): an all-reduce's
    last chunk of two rows or more."""
    lo, hi = chunks[-1]
    return all_reduce and hi - lo >= 2


def own_gemm_rows(chunks: list[tuple[int, int]], world_size: int, all_reduce: bool) -> list[tuple[int, int]]:
    """The rows of a decomposed block's own GEMMs, from its even `chunks` (`row_chunks`): on two ranks
    the first half's chunks (`halves`) as one GEMM, and an all-reduce's last chunk cut in two
    (`last_chunk_cut`). What `kernels.decomposed` runs and the cost model times."""
    own = list(chunks)
    first = halves(len(chunks))[0]
    if world_size == 2 and len(first) > 1:
        own[: len(first)] = [(chunks[0][0], chunks[len(first) - 1][1])]
    if last_chunk_cut(chunks, all_reduce):
        lo, hi = own.pop()
        own += [(lo, (lo + hi) // 2), ((lo + hi) // 2, hi)]
    return own


def tail_copied_together(chunks: list[tuple[int, int]], world_size: int, all_reduce: bool) -> bool:
    """Whether a decomposed block's last two own GEMMs' rows are copied into the output together,
    after the last GEMM (on two ranks, where the last chunk is cut: `kernels.decomposed._Layout`)."""
    return world_size == 2 and last_chunk_cut(chunks, all_reduce)


"""Chunk-plan templates."""

COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")
"""Collectives a plan can carry."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One chunk moving from `src` to `dst`."""

    phase: str
    """`gather` (copy of final rows) or `reduce` (partial sum, added at the destination)."""
    src: int
    """Rank the data leaves."""
    dst: int
    """Rank the data arrives at."""
    block: int
    """Owner of the rows: the rank whose shard they are (gather) or who reduces them (reduce)."""
    split: int
    """Index of the chunk inside its block, 0 … num_splits-1."""
    row_start: int
    """First row of the chunk in the communicated tensor."""
    row_end: int
    """One past the last row."""
    step: int
    """Step at which it moves, from 1; a rank forwards only what it held at an earlier step."""
    stream: int
    """Communication stream of the sender and receiver (0, or 1 for counter-clockwise traffic)."""
    signal: int = -1
    """Signal slot on `dst` raised when the chunk has arrived; unique per destination rank."""

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def chunk(self) -> tuple[int, int]:
        """(block, split): the chunk's identity, independent of the step that moves it."""
        return (self.block, self.split)


def block_bounds(total_rows: int, world_size: int, block: int) -> tuple[int, int]:
    """Rows [start, end) of `block` when `total_rows` are split into `world_size` near-equal blocks."""
    return (block * total_rows // world_size, (block + 1) * total_rows // world_size)


def _split_bounds(start: int, end: int, num_splits: int, align: int) -> list[tuple[int, int]]:
    """Cut [start, end) into `num_splits` chunks at rows that are multiples of `align` (absolute row
    numbers, so that inner chunk boundaries fall on tile boundaries)."""
    rows = end - start
    inner = [
        min(end, max(start, (2 * (start + j * rows // num_splits) + align) // (2 * align) * align))
        for j in range(1, num_splits)
    ]
    cuts = [start] + inner + [end]
    bounds = list(zip(cuts[:-1], cuts[1:]))
    if any(hi <= lo for lo, hi in bounds):
        raise ConfigError(
            f"num_splits={num_splits} is too many for a block of {rows} rows aligned to {align}: "
            f"use at most {max(1, rows // align)}"
        )
    return bounds


def chunk_bounds(
    total_rows: int, world_size: int, num_splits: int, align: int = 1
) -> dict[int, list[tuple[int, int]]]:
    """Block → its `num_splits` chunks (row_start, row_end), cut as :func:`build_plan` cuts them
    (inner boundaries at multiples of `align`); ConfigError where a block is too short for that."""
    return {
        b: _split_bounds(*block_bounds(total_rows, world_size, b), num_splits, align)
        for b in range(world_size)
    }


def _clockwise_splits(template: str, num_splits: int) -> int:
    """How many of a block's chunks travel clockwise (on stream 0)."""
    return (num_splits + 1) // 2 if template == "bidirectional_ring" else num_splits


def _gather(template: str, ws: int, chunks: dict, step0: int) -> list[Transfer]:
    out = []
    n = len(chunks[0])
    cw = _clockwise_splits(template, n)
    for s in range(1, ws):
        for r in range(ws):
            for j in range(n):
                if template == "direct":
                    src, block, stream = (r + s) % ws, (r + s) % ws, 0
                elif j < cw:
                    src, block, stream = (r - 1) % ws, (r - s) % ws, 0
                else:
                    src, block, stream = (r + 1) % ws, (r + s) % ws, 1
                lo, hi = chunks[block][j]
                out.append(Transfer("gather", src, r, block, j, lo, hi, step0 + s, stream))
    return out


def _reduce(template: str, ws: int, chunks: dict) -> list[Transfer]:
    out = []
    n = len(chunks[0])
    cw = _clockwise_splits(template, n)
    for s in range(1, ws):
        for r in range(ws):
            for j in range(n):
                if template == "direct":
                    dst, block, stream = (r + s) % ws, (r + s) % ws, 0
                elif j < cw:
                    dst, block, stream = (r + 1) % ws, (r - s) % ws, 0
                else:
                    dst, block, stream = (r - 1) % ws, (r + s) % ws, 1
                lo, hi = chunks[block][j]
                out.append(Transfer("reduce", r, dst, block, j, lo, hi, s, stream))
    return out


def build_plan(
    template: str,
    collective: str,
    world_size: int,
    total_rows: int,
    num_splits: int = 1,
    align: int = 1,
) -> ChunkPlan:
    """Build the plan of `collective` over `total_rows` rows with a template.

    `align` rounds chunk boundaries inside a block to the nearest multiple of it (a kernel passes its
    BLOCK_M: then no tile straddles two chunks of one block, and with blocks of at least BLOCK_M rows
    no tile overlaps more than two chunks).
    """
    if template in PLANLESS_KINDS:
        raise ConfigError(f"template {template} moves no chunks of one tensor: it has no chunk plan")
    if template not in TEMPLATES:
        raise ConfigError(f"unknown plan template {template!r}: accepted are {', '.join(TEMPLATES)}")
    if collective not in COLLECTIVES:
        raise ConfigError(f"unknown collective {collective!r}: accepted are {', '.join(COLLECTIVES)}")
    if world_size < 1:
        raise ConfigError(f"world size {world_size} must be at least 1")
    if num_splits < 1:
        raise ConfigError(f"num_splits={num_splits} must be at least 1")
    if template == "bidirectional_ring" and num_splits < 2 and world_size > 1:
        raise ConfigError(
            "template bidirectional_ring needs num_splits >= 2 (half of the chunks go each way)"
        )
    if align < 1:
        raise ConfigError(f"align={align} must be at least 1")
    if total_rows < world_size:
        raise ConfigError(f"{total_rows} rows cannot be split over world size {world_size}")
    chunks = chunk_bounds(total_rows, world_size, num_splits, align)
    transfers: list[Transfer] = []
    if collective in ("reduce_scatter", "all_reduce"):
        transfers += _reduce(template, world_size, chunks)
    if collective in ("all_gather", "all_reduce"):
        step0 = world_size - 1 if collective == "all_reduce" else 0
        transfers += _gather(template if collective == "all_gather" else "direct", world_size, chunks, step0)
    return ChunkPlan(
        template=template,
        collective=collective,
        world_size=world_size,
        total_rows=total_rows,
        num_splits=num_splits,
        chunk_bounds=tuple(tuple(chunks[b]) for b in range(world_size)),
        transfers=tuple(_assign_signals(transfers, world_size)),
    )


def _arrival_key(t: Transfer) -> tuple:
    return (0 if t.phase == "reduce" else 1, t.step, t.stream, t.split, t.block, t.src)


def _assign_signals(transfers: list[Transfer], world_size: int) -> list[Transfer]:
    """Number the chunks arriving at each rank in arrival order: slot i is the i-th arrival."""
    by_dst: dict[int, list[Transfer]] = {r: [] for r in range(world_size)}
    for t in transfers:
        by_dst[t.dst].append(t)
    out = []
    for r in range(world_size):
        for slot, t in enumerate(sorted(by_dst[r], key=_arrival_key)):
            out.append(
                Transfer(
                    t.phase, t.src, t.dst, t.block, t.split, t.row_start, t.row_end, t.step, t.stream, slot
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Every transfer of one call of a collective, with per-rank views for the kernels."""

    template: str
    collective: str
    world_size: int
    total_rows: int
    num_splits: int
    chunk_bounds: tuple[tuple[tuple[int, int], ...], ...]
    """chunk_bounds[block][split] = (row_start, row_end)."""
    transfers: tuple[Transfer, ...]
    _recvs: dict[int, tuple[Transfer, ...]] = field(init=False, repr=False, compare=False)
    _sends: dict[int, tuple[Transfer, ...]] = field(init=False, repr=False, compare=False)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """First row of every chunk, in row order (the chunks cover the rows in order, some maybe empty)."""

    def __post_init__(self) -> None:
        recvs: dict[int, list[Transfer]] = {r: [] for r in range(self.world_size)}
        sends: dict[int, list[Transfer]] = {r: [] for r in range(self.world_size)}
        for t in self.transfers:
            recvs[t.dst].append(t)
            sends[t.src].append(t)
        object.__setattr__(
            self, "_recvs", {r: tuple(sorted(v, key=lambda t: t.signal)) for r, v in recvs.items()}
        )
        object.__setattr__(self, "_sends", {r: tuple(sorted(v, key=_arrival_key)) for r, v in sends.items()})
        object.__setattr__(self, "_starts", tuple(lo for block in self.chunk_bounds for lo, _ in block))

    @property
    def num_steps(self) -> int:
        return max((t.step for t in self.transfers), default=0)

    @property
    def num_streams(self) -> int:
        return 1 + max((t.stream for t in self.transfers), default=0)

    @property
    def num_chunks(self) -> int:
        """Chunks of the whole tensor (world_size × num_splits)."""
        return self.world_size * self.num_splits

    def recvs(self, rank: int, phase: str | None = None) -> list[Transfer]:
        """Chunks arriving at `rank`, in arrival order (signal slot order)."""
        return [t for t in self._recvs[rank] if phase is None or t.phase == phase]

    def sends(self, rank: int, phase: str | None = None) -> list[Transfer]:
        """Chunks leaving `rank`, in the order it issues them (by phase, step, stream, split)."""
        return [t for t in self._sends[rank] if phase is None or t.phase == phase]

    def num_signals(self, rank: int) -> int:
        return len(self.recvs(rank))

    def chunk_index(self, block: int, split: int) -> int:
        """Index of chunk (block, split) in row order."""
        return block * self.num_splits + split

    def chunk_rows(self) -> list[tuple[int, int]]:
        """(row_start, row_end) of every chunk, in row order."""
        return [bounds for block in self.chunk_bounds for bounds in block]

    def kept_ready_words(self, rank: int) -> dict[int, int]:
        """An all-reduce's chunks kept on `rank` (its own block's), row-order index to ready word
        (offset from the pad's READY_BASE): they follow the words of the chunks `rank` sends, in
        chunk order. The producer raises a kept chunk's word once its reduced rows are stored."""
        first = len(self.sends(rank, "reduce"))
        return {self.chunk_index(rank, j): first + j for j in range(self.num_splits)}

    def chunk_signals(self, rank: int, phase: str = "gather") -> list[list[int]]:
        """For each chunk in row order, the signal slots on `rank` that say it is complete there.

        For a gather: the slot of its single arrival, or none for the rank's own block. For a
        reduce: one slot per partial that `rank` receives for that chunk.
        """
        table: list[list[int]] = [[] for _ in range(self.num_chunks)]
        for t in self.recvs(rank, phase):
            table[self.chunk_index(t.block, t.split)].append(t.signal)
        return table

    def chunk_of_row(self, row: int) -> int:
        """Index (row order) of the chunk holding `row` (the last of the chunks starting at or before
        it: an empty chunk there ends where it starts)."""
        if not 0 <= row < self.total_rows:
            raise IndexError(f"row {row} is outside [0, {self.total_rows})")
        return bisect.bisect_right(self._starts, row) - 1

    def chunks_of_rows(self, lo: int, hi: int) -> range:
        """Row-order indices of the chunks overlapping rows [lo, hi)."""
        return range(self.chunk_of_row(lo), self.chunk_of_row(min(hi, self.total_rows) - 1) + 1)

    def arrival_rank(self, rank: int, phase: str = "gather") -> list[int]:
        """For each chunk in row order, its arrival position on `rank` (-1: never arrives there).

        For a reduce, the position of the last partial of that chunk to arrive.
        """
        pos = [-1] * self.num_chunks
        for i, t in enumerate(self.recvs(rank, phase)):
            c = self.chunk_index(t.block, t.split)
            pos[c] = max(pos[c], i)
        return pos

    def describe(self, rank: int) -> str:
        """A human-readable listing of what `rank` receives and sends."""
        lines = [
            f"plan {self.template}/{self.collective} ws={self.world_size} splits={self.num_splits} rank {rank}"
        ]
        for t in self.recvs(rank):
            lines.append(
                f"  recv step {t.step} stream {t.stream}: {t.phase} block {t.block}.{t.split} "
                f"rows [{t.row_start}, {t.row_end}) from {t.src} -> slot {t.signal}"
            )
        for t in self.sends(rank):
            lines.append(
                f"  send step {t.step} stream {t.stream}: {t.phase} block {t.block}.{t.split} to {t.dst}"
            )
        return "\n".join(lines)
