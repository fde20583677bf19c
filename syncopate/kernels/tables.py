"""The small integer tables a fused kernel receives, built from a chunk plan and a tile schedule.

Signal pad layout (int32 words, one pad per rank, in symmetric memory):

| words                          | meaning                                                      |
|--------------------------------|--------------------------------------------------------------|
| [0, ARRIVAL_SLOTS)             | chunk arrivals on this rank, numbered by the plan            |
| ARRIVAL_SLOTS + r              | the epoch rank r has entered (written by r into every pad)   |
| [READY_BASE, READY_BASE + …)   | producer: chunks of this rank ready to leave, in send order  |
| [LOCAL_BASE, LOCAL_BASE + …)   | consumer: this rank's own chunks copied into the gathered buffer |
| [MEET_BASE, MEET_BASE + 256)   | the two meetings of a call captured in a CUDA graph, a word a rank each |
| PAD_WORDS - 1                  | spare: where a context probes a peer's pad at creation       |

Every word below MEET_BASE is cleared by a captured call before it starts (`graph_entry_kernel`);
the meeting words are reset by the rank that waits on them.

Partials received by a reduce-scatter land in the receiver's `recv` buffer. When every partial a
rank receives is for a distinct chunk (ring templates), row `row` of the partial sits at
`recv[row]` ("by row"); when several ranks send partials of the same rows (`direct`), the partial
from rank s sits at `recv[s * block_rows + row - block_start]` ("by source").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space import (
    Candidate,
    ChunkPlan,
    block_bounds,
    build_plan,
    consumer_schedule,
    producer_schedule,
)

__all__ = [
    "ARRIVAL_SLOTS",
    "ENTERED_BASE",
    "READY_BASE",
    "LOCAL_BASE",
    "MEET_BASE",
    "PAD_WORDS",
    "READY_WORDS",
    "pad_word_meaning",
    "ConsumerTables",
    "ProducerTables",
    "plan_for",
    "consumer_tables",
    "producer_tables",
    "recv_layout",
    "recv_offset",
    "recv_rows",
]

ARRIVAL_SLOTS = 1024
ENTERED_BASE = ARRIVAL_SLOTS
READY_BASE = ARRIVAL_SLOTS + 128
LOCAL_BASE = READY_BASE
"""A consumer has no ready words: its own chunks' words take their place."""
READY_WORDS = 1024
MEET_BASE = READY_BASE + READY_WORDS
MAX_RANKS = READY_BASE - ENTERED_BASE
PAD_WORDS = MEET_BASE + 2 * MAX_RANKS + 1


def pad_word_meaning(word: int) -> str:
    """What word `word` of a signal pad holds (the module docstring's layout), for messages."""
    if 0 <= word < ARRIVAL_SLOTS:
        return f"the arrival of the chunk of slot {word}"
    if ENTERED_BASE <= word < READY_BASE:
        return f"rank {word - ENTERED_BASE}'s entry into the call"
    if READY_BASE <= word < MEET_BASE:
        return (
            f"word {word - READY_BASE} of the ready words (a producer's chunk {word - READY_BASE} in "
            f"send order ready to leave, or a consumer's own chunk copied)"
        )
    if MEET_BASE <= word < MEET_BASE + 2 * MAX_RANKS:
        meeting, rank = divmod(word - MEET_BASE, MAX_RANKS)
        return f"rank {rank} at the {('first', 'second')[meeting]} meeting of a captured call's start"
    return "the spare word"


@functools.lru_cache(maxsize=256)
def plan_for(
    kind: str, candidate_template: str, world_size: int, rows: int, num_splits: int, align: int
) -> ChunkPlan:
    collective = {"ag_gemm": "all_gather", "gemm_rs": "reduce_scatter", "gemm_ar": "all_reduce"}[kind]
    plan = build_plan(candidate_template, collective, world_size, rows, num_splits, align=align)
    for r in range(world_size):
        if plan.num_signals(r) > ARRIVAL_SLOTS or len(plan.sends(r)) > READY_WORDS:
            raise ConfigError(
                f"plan with {plan.num_chunks} chunks needs more than {ARRIVAL_SLOTS} signal slots"
            )
    if world_size > MAX_RANKS:
        raise ConfigError(f"world size {world_size} exceeds the {MAX_RANKS} ranks a signal pad holds")
    return plan


def recv_layout(plan: ChunkPlan) -> str:
    """`by_row` or `by_source`: where a receiver keeps the partials it gets (see module docstring)."""
    for r in range(plan.world_size):
        seen = set()
        for t in plan.recvs(r, "reduce"):
            if t.chunk in seen:
                return "by_source"
            seen.add(t.chunk)
    return "by_row"


def recv_rows(plan: ChunkPlan) -> int:
    """Rows of the receive buffer each rank needs."""
    block_rows = max(
        hi - lo
        for lo, hi in (block_bounds(plan.total_rows, plan.world_size, b) for b in range(plan.world_size))
    )
    return plan.world_size * block_rows if recv_layout(plan) == "by_source" else plan.total_rows


def recv_offset(plan: ChunkPlan, src: int, block: int, n_cols: int) -> int:
    """Element offset such that row `row` of the partial from `src` is at `recv + offset + row * n_cols`."""
    if recv_layout(plan) == "by_row":
        return 0
    block_rows = max(
        hi - lo
        for lo, hi in (block_bounds(plan.total_rows, plan.world_size, b) for b in range(plan.world_size))
    )
    start = block_bounds(plan.total_rows, plan.world_size, block)[0]
    return (src * block_rows - start) * n_cols


@dataclass(frozen=True)
class ConsumerTables:
    """Device tables of an all-gather consumer (int32 tensors)."""

    order: Any
    mtile_lo: Any
    mtile_hi: Any
    chunk_slot: Any
    own_tiles: int = 0
    """Leading positions of `order` whose rows all lie in this rank's own block: the kernel reads
    them from the caller's shard, before and without any wait."""
    own_rows_later: bool = False
    """Whether a later position reads own rows (a tile across the block's edge, or an order that
    does not put the own block first): those read them from the gathered buffer, after the copy."""


def _check_two_chunks(s, what: str) -> None:
    if max(hi - lo for lo, hi in zip(s.mtile_chunk_lo, s.mtile_chunk_hi)) > 2:
        raise ConfigError(
            f"a tile of {what} overlaps more than two chunks: use fewer splits or a smaller block_m "
            f"(every chunk must hold at least block_m rows)"
        )


@dataclass(frozen=True)
class ProducerTables:
    """Device tables of a reduce-scatter / all-reduce producer."""

    order: Any
    entry_chunk: Any
    """For each entry of `order`, the chunk whose rows it finishes."""
    chunk_row: Any
    inc_start: Any
    inc_slot: Any
    inc_offset: Any
    chunk_ready: Any
    chunk_tiles: Any
    keep: Any
    gather_slot: Any
    num_ready: int
    inc_max: int
    """Most partials received for one chunk."""
    whole_tiles: bool = False
    """Every chunk boundary is a multiple of block_m (or the last row): no tile holds rows of two
    chunks, so each entry is one whole tile (what the producer's TMA epilogue needs)."""


def _i32(values, device):
    import torch

    return torch.tensor(list(values), dtype=torch.int32, device=device)


def consumer_tables(plan: ChunkPlan, rank: int, n_cols: int, c: Candidate, device) -> ConsumerTables:
    s = consumer_schedule(plan, rank, n_cols, c.block_m, c.block_n, c.group_m, c.tile_order)
    _check_two_chunks(s, "the all-gather")
    slots = []
    for ci, waits in enumerate(s.chunk_wait):
        if len(waits) > 1:
            raise ConfigError("an all-gather chunk arrives once per rank; the plan says otherwise")
        own = ci // plan.num_splits == rank
        slots.append(LOCAL_BASE + ci % plan.num_splits if own else waits[0])
    r0, r1 = plan.chunk_bounds[rank][0][0], plan.chunk_bounds[rank][-1][1]
    inside = [
        r0 <= tm * c.block_m and min((tm + 1) * c.block_m, plan.total_rows) <= r1 for tm in range(s.tiles_m)
    ]
    touches = [tm * c.block_m < r1 and (tm + 1) * c.block_m > r0 for tm in range(s.tiles_m)]
    own_tiles = 0
    while own_tiles < len(s.order) and inside[s.order[own_tiles] // s.tiles_n]:
        own_tiles += 1
    return ConsumerTables(
        order=_i32(s.order, device),
        mtile_lo=_i32(s.mtile_chunk_lo, device),
        mtile_hi=_i32(s.mtile_chunk_hi, device),
        chunk_slot=_i32(slots, device),
        own_tiles=own_tiles,
        own_rows_later=any(touches[t // s.tiles_n] for t in s.order[own_tiles:]),
    )


def producer_tables(
    plan: ChunkPlan, rank: int, n_cols: int, c: Candidate, all_reduce: bool, device
) -> ProducerTables:
    import torch

    s = producer_schedule(plan, rank, n_cols, c.block_m, c.block_n, c.group_m, c.tile_order)
    _check_two_chunks(s, "the reduce-scatter")
    ready = list(s.chunk_ready)
    keep = [1 if r < 0 else 0 for r in ready]
    num_ready = sum(1 for r in ready if r >= 0)
    if all_reduce:
        # Kept (reduced) chunks get ready slots too: a backend that sends them itself waits on them.
        words = plan.kept_ready_words(rank)
        for ci, word in words.items():
            ready[ci] = word
        num_ready += len(words)
    by_chunk: list[list[tuple[int, int]]] = [[] for _ in range(plan.num_chunks)]
    for t in plan.recvs(rank, "reduce"):
        by_chunk[plan.chunk_index(*t.chunk)].append((t.signal, recv_offset(plan, t.src, t.block, n_cols)))
    inc_start, inc_slot, inc_offset = [0], [], []
    for entries in by_chunk:
        for slot, off in entries:
            inc_slot.append(slot)
            inc_offset.append(off)
        inc_start.append(len(inc_slot))
    gather = [-1] * (plan.num_chunks * plan.world_size)
    if all_reduce:
        for p in range(plan.world_size):
            for t in plan.recvs(p, "gather"):
                if t.src == rank:
                    gather[plan.chunk_index(*t.chunk) * plan.world_size + p] = t.signal
    rows = [lo for lo, _ in plan.chunk_rows()] + [plan.total_rows]
    return ProducerTables(
        order=_i32(s.order, device),
        entry_chunk=_i32(s.entry_chunk, device),
        chunk_row=_i32(rows, device),
        inc_start=_i32(inc_start, device),
        inc_slot=_i32(inc_slot or [0], device),
        inc_offset=torch.tensor(inc_offset or [0], dtype=torch.int64, device=device),
        chunk_ready=_i32(ready, device),
        chunk_tiles=_i32(s.chunk_tiles, device),
        keep=_i32(keep, device),
        gather_slot=_i32(gather, device),
        num_ready=num_ready,
        inc_max=max((len(e) for e in by_chunk), default=0),
        whole_tiles=all(r % c.block_m == 0 or r == plan.total_rows for r in rows),
    )
