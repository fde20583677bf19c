"""The piece tables of the pipelined MoE plans: which rows move at which step, and the grouped GEMMs
over them in the order they run. Pure Python on the layout's split sizes and counts.

Two row spaces of one rank (the tables of :class:`~syncopate.moe.routing.ExpertLayout`):

| space | its rows | rank by rank |
|-------|----------|--------------|
| token side | this rank's pairs in send order (`layout.order`) | `send_splits[d]` rows for rank d, by expert, token |
| expert side | the rows this rank's experts receive | `recv_splits[s]` rows from rank s, by local expert, token |

Dispatch sends from the token side and receives into the expert side; combine computes on the
expert side, sends from it and receives into the token side. Rank r's own rows need no transfer.

At step s = 1 … ws-1 rank r sends to one peer and receives from one (:func:`step_peers`): `ring`,
to r+s and from r-s; `pairwise`, to and from r xor s. Each peer's rows are cut into `chunks`
near-equal row ranges (`row_chunks`), and each (step, chunk) is one **exchange**: a send and a
receive posted together, so that both sides of every transfer post it at the same point. Both
sides cut the same count the same way (what r sends d is what d receives from r), so they agree
on every exchange without telling each other.

A **piece** is one grouped GEMM over a row range of the expert side: one source's chunk, or the
rank's own rows (one piece, uncut). Dispatch runs its own piece first (its rows are there at
once), then the others in exchange order, each once its rows are in; combine runs the peers'
pieces in exchange order, each sent as soon as it is done, and its own piece last, where it hides
the last exchange's transfer.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from syncopate.errors import ConfigError
from syncopate.search_space.chunk_plan import row_chunks
from syncopate.search_space.moe_workload import MOE_KINDS, MOE_ORDERS

__all__ = ["Exchange", "Piece", "PiecePlan", "build_piece_plan", "step_peers"]


def step_peers(rank: int, world_size: int, order: str, step: int) -> tuple[int, int]:
    """(the peer rank `rank` sends to, the peer it receives from) at exchange step `step` >= 1."""
    if order == "ring":
        return (rank + step) % world_size, (rank - step) % world_size
    if order == "pairwise":
        return rank ^ step, rank ^ step
    raise ConfigError(f"unknown MoE piece order {order!r}: accepted are {', '.join(MOE_ORDERS)}")


@dataclass(frozen=True, slots=True)
class Exchange:
    """One step's chunk: rows sent to one peer and rows received from one, posted together."""

    step: int
    chunk: int
    send_peer: int
    send_rows: tuple[int, int]
    """Rows [lo, hi) of the buffer sent from (dispatch: token side; combine: expert side)."""
    send_at: int
    """The row of the peer's receive buffer where they land (-1 where the layout has no `counts`)."""
    recv_peer: int
    recv_rows: tuple[int, int]
    """Rows [lo, hi) of the buffer received into (dispatch: expert side; combine: token side)."""

    @property
    def sends(self) -> bool:
        return self.send_rows[1] > self.send_rows[0]

    @property
    def receives(self) -> bool:
        return self.recv_rows[1] > self.recv_rows[0]


@dataclass(frozen=True, slots=True)
class Piece:
    """One grouped GEMM over rows of the expert side, all from one source rank."""

    source: int
    """The rank whose tokens the rows are."""
    chunk: int
    rows: tuple[int, int]
    """Rows [lo, hi) of the expert side."""
    groups: tuple[int, ...]
    """Rows of each local expert among them (in order: the rows are sorted by expert)."""
    exchange: int | None
    """Index of the exchange that moves them (`PiecePlan.exchanges`); None for the own rows."""
    token_rows: tuple[int, int]
    """The own piece: its rows on the token side (dispatch reads them, combine writes them there);
    a peer's piece: (0, 0)."""


@dataclass(frozen=True, slots=True)
class PiecePlan:
    """One rank's exchanges and grouped GEMMs for one kind, chunk count and order (module docstring)."""

    kind: str
    rank: int
    world_size: int
    chunks: int
    order: str
    exchanges: tuple[Exchange, ...]
    """In the order they are posted: step-major, then chunk."""
    pieces: tuple[Piece, ...]
    """In the order their GEMMs run; pieces of no row are left out."""

    @property
    def own(self) -> Piece | None:
        """The own rows' piece, if it has any rows."""
        return self.piece_of(None)

    def piece_of(self, exchange: int | None) -> Piece | None:
        """The piece whose rows exchange `exchange` moves (None: the own rows), if it has any."""
        for p in self.pieces:
            if p.exchange == exchange:
                return p
        return None


def _offsets(sizes: list[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)][: len(sizes)]


def _groups(runs: list[int], ends: list[int], lo: int, hi: int) -> tuple[int, ...]:
    """Rows of each run (consecutive runs of `runs[e]` rows from 0, ending at `ends[e]`) that fall
    in [lo, hi), 0 <= lo < hi <= ends[-1]. Plain Python and two bisections: a few dozen runs, on
    the host's path at every call of a routing."""
    first = bisect.bisect_right(ends, lo)  # the run holding row lo
    last = bisect.bisect_left(ends, hi)  # the run holding row hi - 1
    if first == last:
        middle = [hi - lo]
    else:
        middle = [ends[first] - lo, *runs[first + 1 : last], hi - ends[last - 1]]
    return (0,) * first + tuple(middle) + (0,) * (len(runs) - last - 1)


def build_piece_plan(
    kind: str,
    *,
    rank: int,
    world_size: int,
    send_splits: list[int],
    recv_counts: list[list[int]],
    chunks: int,
    order: str,
    counts: list[list[int]] | None = None,
) -> PiecePlan:
    """Rank `rank`'s plan: `send_splits[d]` pairs it routes to rank d's experts, `recv_counts[s][e]`
    rows rank s sends to its local expert e, `counts[q][e]` (all ranks' pairs per expert, for the
    landing rows `Exchange.send_at`; optional)."""
    if kind not in MOE_KINDS:
        raise ConfigError(f"unknown MoE kind {kind!r}: accepted are {', '.join(MOE_KINDS)}")
    ws = world_size
    if len(send_splits) != ws or len(recv_counts) != ws:
        raise ConfigError(
            f"{len(send_splits)} send splits and {len(recv_counts)} rows of receive counts for {ws} ranks"
        )
    el = len(recv_counts[0])
    recv_splits = [sum(row) for row in recv_counts]
    send_off, recv_off = _offsets(send_splits), _offsets(recv_splits)
    dispatch = kind == "a2a_gemm"
    if dispatch:  # sent from the token side (by destination rank), received into the expert side (by source)
        send_start, send_size, recv_start, recv_size = send_off, send_splits, recv_off, recv_splits
    else:
        send_start, send_size, recv_start, recv_size = recv_off, recv_splits, send_off, send_splits

    def landing(peer: int) -> int:
        """Where this rank's rows start in `peer`'s receive buffer: its expert side (by source
        rank) in dispatch, its token side (by expert rank) in combine."""
        if dispatch:
            return sum(sum(counts[s][peer * el : (peer + 1) * el]) for s in range(rank))
        return sum(counts[peer][: rank * el])

    exchanges: list[Exchange] = []
    for step in range(1, ws):
        out_peer, in_peer = step_peers(rank, ws, order, step)
        out_start, out_rows = send_start[out_peer], send_size[out_peer]
        in_start, in_rows = recv_start[in_peer], recv_size[in_peer]
        base = landing(out_peer) if counts is not None else -1
        for j, ((a, b), (c, d)) in enumerate(zip(row_chunks(out_rows, chunks), row_chunks(in_rows, chunks))):
            if b == a and d == c:
                continue
            exchanges.append(
                Exchange(
                    step=step,
                    chunk=j,
                    send_peer=out_peer,
                    send_rows=(out_start + a, out_start + b),
                    send_at=base + a if counts is not None else -1,
                    recv_peer=in_peer,
                    recv_rows=(in_start + c, in_start + d),
                )
            )
    own = Piece(
        source=rank,
        chunk=0,
        rows=(recv_off[rank], recv_off[rank] + recv_splits[rank]),
        groups=tuple(recv_counts[rank]),
        exchange=None,
        token_rows=(send_off[rank], send_off[rank] + send_splits[rank]),
    )
    peers, ends = [], {}
    for i, x in enumerate(exchanges):
        source, (lo, hi) = (x.recv_peer, x.recv_rows) if dispatch else (x.send_peer, x.send_rows)
        if hi > lo:
            runs = recv_counts[source]
            if source not in ends:
                ends[source] = list(itertools.accumulate(runs))
            start = recv_off[source]
            peers.append(
                Piece(
                    source=source,
                    chunk=x.chunk,
                    rows=(lo, hi),
                    groups=_groups(runs, ends[source], lo - start, hi - start),
                    exchange=i,
                    token_rows=(0, 0),
                )
            )
    ordered = ([own] + peers) if dispatch else (peers + [own])
    return PiecePlan(
        kind=kind,
        rank=rank,
        world_size=ws,
        chunks=chunks,
        order=order,
        exchanges=tuple(exchanges),
        pieces=tuple(p for p in ordered if p.rows[1] > p.rows[0]),
    )
