"""The `fused` MoE plans: the pieces of the pipelined plans (:mod:`syncopate.moe.plan`), consumed or
produced tile by tile by one persistent Triton grouped GEMM a call (:mod:`syncopate.moe.kernels`).
CUDA only, backend `copy_engine` (the symmetric buffers, signal pads and epochs of
:class:`~syncopate.moe.exchange.CopyEngineExchange`).

- Dispatch (`a2a_gemm`): the rows the peers get are gathered into send order on the caller's
  stream (the own rows are not: the kernel reads them from x at their tokens); the call enters
  (its side stream forks from the caller's stream and announces the entry in every pad); the
  kernel is launched on the caller's stream; then every exchange's copy is enqueued on the side
  stream (each after its peer has entered), each followed by a stream write of the epoch into the
  peer's (source, chunk) word. The kernel's tiles cut each expert's rows, not each piece's
  (`dispatch_tile_table`): the own rows' tiles first, read from x with no wait, then the tiles
  of each source chunk in exchange order, each waiting for its word before it loads its rows from
  the receive buffer; one tile an expert holds the own rows' edge beside a peer's. Tiles store
  straight into h's unfused layout (by local expert, then source, then token).
- Combine (`gemm_a2a`): the call enters; the kernel is launched on the caller's stream over its
  tiles, cut by expert as the dispatch's (`combine_tile_table`), in the exchange order of the piece
  their peer rows are in, the own rows' alone last; a tile's epilogue waits until that peer has
  entered the call, stores its rows into their ranks' receive buffers (a peer's where the pipelined
  plan's copy would have put them) and counts itself in its piece; the count that completes a
  piece raises the piece's word in the peer's pad. A side stream
  then waits for this rank's words of every piece it receives, the caller's stream joins it, and
  the top_k rows of each token are summed by the unfused op's `summed_rows`.

The kernel goes on the caller's stream before any stream wait of the call (the rule of
`syncopate.kernels.backends`): a wait enqueued first could hold the kernel back where two streams
share one hardware queue, and the copies a dispatch kernel waits for never wait for the kernel
(their side stream forked before it).

The backward of each op is the `pipelined` plan with the same backend, chunks and order
(`MoeCandidate.as_pipelined`), as the pipelined ops' own backward runs it; the weights' gradients
are the same K-grouped GEMMs. The tile tables are made once per layout and configuration and kept
in the layout's cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.moe import pipelined
from syncopate.moe.exchange import CONTEXTS, CopyEngineExchange, job_bound, open_exchange
from syncopate.moe.kernels import COMBINE_WORDS, DISPATCH_WORDS, launch_combine, launch_dispatch
from syncopate.moe.ops import _token_rows, summed_rows
from syncopate.moe.plan import PiecePlan
from syncopate.moe.routing import ExpertLayout, _block_starts, to_device
from syncopate.search_space.moe_workload import MoeCandidate

__all__ = [
    "FusedTables",
    "combine_autograd",
    "combine_rows",
    "combine_tile_table",
    "dispatch_autograd",
    "dispatch_rows",
    "dispatch_tile_table",
    "fused_tables",
]


def _partner(plan: PiecePlan) -> int | None:
    """The peer whose rows share tiles with the own rows: of the sources next to this rank in h
    (rank - 1 and rank + 1, by source within each expert), the one whose rows move first (dispatch:
    are received first; combine: are sent first); None with one rank."""
    dispatch = plan.kind == "a2a_gemm"
    first: dict[int, int] = {}
    for i, x in enumerate(plan.exchanges):
        if x.receives if dispatch else x.sends:
            first.setdefault(x.recv_peer if dispatch else x.send_peer, i)
    near = [s for s in (plan.rank - 1, plan.rank + 1) if 0 <= s < plan.world_size]
    if not near:
        return None
    return min(near, key=lambda s: first.get(s, len(plan.exchanges)))


_LO, _START, _END, _CUT, _BASE1, _BASE2, _SRC1, _SRC2, _EXPERT = range(9)
"""The columns of a segment (`_segments`)."""


def _segments(plan: PiecePlan, counts: np.ndarray, shift: int, block_m: int, from_end: bool) -> np.ndarray:
    """Each expert's rows in h by group of sources (every peer alone, the own rows with `_partner`),
    one int64 row a (group, expert), group-major: where its tiles count from (`_LO`), its first and
    end row in h, the first row of its second source (`_CUT`; the end where it has one), what turns
    an h row of each source into its A row (`_BASE1`, `_BASE2`: the expert-side row, the own rows'
    moved by `shift`), the two sources (-1: none) and the expert. Tiles count from the start, or
    with `from_end` where the own rows come second, from the end (`_LO` before the start), so that
    the own rows fill whole tiles. One small array per column a group: the host makes these on
    every call of a routing, after its host synchronization, where its time is the job's."""
    ws, el = counts.shape
    side, in_h = _block_starts(counts)  # the expert-side and h start of (s, e)
    rank, partner = plan.rank, _partner(plan)
    pairs = [(s, -1) for s in range(ws) if s not in (rank, partner)]
    pairs.append((rank, -1) if partner is None else (min(rank, partner), max(rank, partner)))
    base = side - in_h
    base[rank] += shift
    out = np.empty((9, len(pairs), el), dtype=np.int64)
    for g, (a, b) in enumerate(pairs):
        col = out[:, g]
        col[_START] = in_h[a]
        col[_CUT] = in_h[a] + counts[a]
        col[_END] = col[_CUT] + counts[b] if b >= 0 else col[_CUT]
        col[_BASE1], col[_BASE2] = base[a], base[b] if b >= 0 else 0
        col[_SRC1], col[_SRC2] = a, b
        col[_LO] = col[_START]
        if from_end and b == rank:
            col[_LO] -= (col[_START] - col[_END]) % block_m
    out[_EXPERT] = np.arange(el)
    return out.reshape(9, -1).T


@dataclass(frozen=True)
class _Tiles:
    """Every row tile of some segments (`_segments`), `block_m` rows from each segment's `_LO`:
    its segment's row (`seg`), first row in h and rows; its two parts (the first `split` rows of
    one source, the rest of the other): their sources and A rows (the second's the first's where a
    tile has one part)."""

    seg: np.ndarray
    ha: np.ndarray
    rows: np.ndarray
    split: np.ndarray
    src0: np.ndarray
    src1: np.ndarray
    a0: np.ndarray
    a1: np.ndarray


def _cut_tiles(seg: np.ndarray, block_m: int) -> _Tiles:
    count = (seg[:, _END] - seg[:, _LO] + block_m - 1) // block_m
    t = np.repeat(seg, count, axis=0)
    j = np.arange(t.shape[0]) - np.repeat(np.cumsum(count) - count, count)
    lo = t[:, _LO] + j * block_m
    ha = np.maximum(t[:, _START], lo)
    hb = np.minimum(t[:, _END], lo + block_m)
    cut = t[:, _CUT]
    first = ha < cut  # the tile starts in the first source's rows
    both = first & (cut < hb)
    a0 = np.where(first, t[:, _BASE1], t[:, _BASE2]) + ha
    src0 = np.where(first, t[:, _SRC1], t[:, _SRC2])
    return _Tiles(
        seg=t,
        ha=ha,
        rows=hb - ha,
        split=np.where(both, cut, hb) - ha,
        src0=src0,
        src1=np.where(both, t[:, _SRC2], src0),
        a0=a0,
        a1=np.where(both, t[:, _BASE2] + cut, a0),
    )


def _table(key: np.ndarray, *columns: np.ndarray) -> np.ndarray:
    """The int32 table of `columns`, its rows in the (stable) order of `key`."""
    order = np.argsort(key, kind="stable")
    table = np.empty((order.size, len(columns)), dtype=np.int32)
    for i, column in enumerate(columns):
        table[:, i] = column[order]
    return table


def _own_shift(plan: PiecePlan) -> int:
    """What turns an own row's expert-side row into its token-side row."""
    own = plan.own
    return own.token_rows[0] - own.rows[0] if own is not None else 0


def _peer_pieces(plan: PiecePlan) -> list:
    return sorted((p for p in plan.pieces if p.exchange is not None), key=lambda p: p.rows[0])


def dispatch_tile_table(plan: PiecePlan, recv_counts: list[list[int]], block_m: int) -> np.ndarray:
    """The dispatch kernel's row tiles, [tiles, `kernels.DISPATCH_WORDS`] int32: expert, A row, own,
    rows, signal word, h row, split, second A row.

    Each expert's rows in h (by source) are cut into tiles of `block_m` rows per group of sources:
    every peer is a group of its own, except the peer next to this rank in h whose rows come first
    (`_partner`), which shares one group with the own rows. A group's tiles start at its own rows'
    outer edge, so that the own rows fill whole tiles and one tile holds the own rows' last (or
    first) rows beside the partner's: an expert takes as many tiles as its rows fill, where tiles cut
    at every piece took one more for each piece boundary inside an expert.

    A tile's first `split` rows are of one source, the rest (if any) of the other; `own` says
    whether the first part is the own rows (the second part is then the partner's, and the other
    way round). The own rows' A rows are token side rows (the kernel reads each from x at its
    token), the peers' rows of the receive buffer (expert side). A tile with peer rows waits for
    the word `source · chunks + chunk` of the last piece its rows reach: one source's pieces land
    in order (its copies follow each other on one stream), so the rows of the earlier ones are
    there too. Tiles come in order of the exchange they wait for, those of no wait first, then by
    group, expert and row."""
    counts = np.asarray(recv_counts, dtype=np.int64)  # [ws, El]
    rank = plan.rank
    t = _cut_tiles(_segments(plan, counts, _own_shift(plan), block_m, from_end=True), block_m)
    # the last peer row (expert side): of the first part where it is a peer's, else of the second
    peer_last = np.where(
        t.src0 != rank, t.a0 + t.split - 1, np.where(t.split < t.rows, t.a1 + t.rows - t.split - 1, -1)
    )
    # the piece of each tile's last peer row: 0 for none (-1 lies before every piece), else 1 + its index
    peers = _peer_pieces(plan)
    at = np.searchsorted(np.array([p.rows[0] for p in peers], dtype=np.int64), peer_last, side="right")
    word = np.array([-1, *(p.source * plan.chunks + p.chunk for p in peers)], dtype=np.int64)[at]
    key = np.array([-1, *(p.exchange for p in peers)], dtype=np.int64)[at]
    return _table(key, t.seg[:, _EXPERT], t.a0, t.src0 == rank, t.rows, word, t.ha, t.split, t.a1)


def combine_tile_table(
    plan: PiecePlan, recv_counts: list[list[int]], block_m: int, entered_base: int
) -> tuple[np.ndarray, list[int]]:
    """(the combine kernel's row tiles, [tiles, `kernels.COMBINE_WORDS`] int32: expert, h row, rows,
    destination, destination row, piece, word, entry word, split, second destination, its row, the
    piece's rank; the row tiles of each counted piece).

    Tiles cut each expert's rows in h per group of sources as the dispatch's do
    (`dispatch_tile_table`), from the group's start, and also where a peer's piece starts inside
    an expert's rows: a tile's rows go to at most two destinations, its first `split` rows to the
    first, and its peer rows lie in one piece. A peer's rows land where the pipelined plan's copy
    puts them (`Exchange.send_at`); the tile counts itself in their piece, whose last count raises
    word `rank · chunks + chunk` there, and waits first for that peer's entry word. The own rows go
    to the token side here, counted by no one. Tiles come in the exchange order of their piece,
    the tiles of the own rows alone last."""
    for p in plan.pieces:
        if p.exchange is not None and plan.exchanges[p.exchange].send_at < 0:
            raise ConfigError(
                "template fused writes rows where the peer keeps them, which takes every rank's counts: "
                "make the layout with exchange_layout (or Routing.layout)"
            )
    counts = np.asarray(recv_counts, dtype=np.int64)  # [ws, El]
    rank = plan.rank
    seg = _segments(plan, counts, _own_shift(plan), block_m, from_end=False)  # own rows: token side
    peers = _peer_pieces(plan)
    # a peer's piece that starts inside an expert's rows cuts that expert's tiles there (a source's
    # first piece starts at its first row, inside no expert's)
    extra = []
    for p in peers:
        if p.chunk == 0:
            continue
        first = seg[:, _SRC1] == p.source
        m = p.rows[0] - np.where(
            first, seg[:, _BASE1], seg[:, _BASE2]
        )  # its first row's h row, were it there
        inside = np.where(first, seg[:, _START], seg[:, _CUT]) < m
        inside &= m < np.where(first, seg[:, _CUT], seg[:, _END])
        inside &= first | (seg[:, _SRC2] == p.source)
        for i in np.flatnonzero(inside):  # one expert's rows at most
            row = seg[i].copy()
            row[_LO] = row[_START] = m[i]
            extra.append((i, row))
    if extra:
        ids = np.concatenate([np.arange(seg.shape[0]), [i for i, _ in extra]])
        seg = np.concatenate([seg, np.stack([row for _, row in extra])])
        order = np.lexsort((seg[:, _START], ids))
        ids, seg = ids[order], seg[order]
        same = ids[1:] == ids[:-1]
        seg[:-1, _END] = np.where(same, seg[1:, _START], seg[:-1, _END])
    t = _cut_tiles(seg, block_m)
    both = t.split < t.rows
    # the piece of each tile's peer rows: 0 for none (-1 lies before every piece), else 1 + its index
    peer_m = np.where(t.src0 != rank, t.a0, np.where(both, t.a1, -1))
    at = np.searchsorted(np.array([p.rows[0] for p in peers], dtype=np.int64), peer_m, side="right")
    exchange = [p.exchange for p in peers]
    per_piece = np.bincount(at, minlength=len(peers) + 1)[1:]
    # the counted pieces, numbered in the order their first tile comes (exchange order)
    used = [i for i in sorted(range(len(peers)), key=exchange.__getitem__) if per_piece[i]]
    number = [-1] * len(peers)
    for n, i in enumerate(used):
        number[i] = n
    source = [p.source for p in peers]
    columns = np.array(
        [
            [len(plan.exchanges), *exchange],  # the own rows alone: last
            [-1, *number],
            [-1, *(rank * plan.chunks + p.chunk for p in peers)],
            [-1, *(entered_base + s for s in source)],
            [-1, *source],
            [0, *(plan.exchanges[p.exchange].send_at - p.rows[0] for p in peers)],
        ],
        dtype=np.int64,
    )[:, at]
    key, piece, word, entry, peer, landing = columns
    row0 = t.a0 + np.where(t.src0 == rank, 0, landing)
    row1 = np.where(both, t.a1 + np.where(t.src1 == rank, 0, landing), row0)
    columns = (t.seg[:, _EXPERT], t.ha, t.rows, t.src0, row0, piece, word, entry, t.split, t.src1, row1, peer)
    return _table(key, *columns), [int(per_piece[i]) for i in used]


@dataclass(frozen=True)
class FusedTables:
    """What every call of one (layout, kind, config) on one rank needs."""

    prep: pipelined.Prepared
    """The pipelined plan's tables (the plan, the most rows a rank receives)."""
    tiles: torch.Tensor
    """[Mt, DISPATCH_WORDS or COMBINE_WORDS] int32 on the device."""
    piece_tiles: torch.Tensor | None
    """Combine: the row tiles of each counted piece (int32 on the device)."""


def fused_tables(
    layout: ExpertLayout, kind: str, rank: int, config: MoeCandidate, device: torch.device
) -> FusedTables:
    """The tile tables of `kind` under `config` on rank `rank`, made once and kept in the layout's cache."""
    key = ("fused", kind, rank, config.chunks_per_source, config.order, config.block_m, str(device))
    found = layout.cache.get(key)
    if found is not None:
        return found
    from syncopate.kernels.tables import ENTERED_BASE

    counts = layout.host_recv_counts()

    def tile_tables(plan: PiecePlan) -> list[torch.Tensor]:
        if kind == "a2a_gemm":
            return [
                torch.from_numpy(dispatch_tile_table(plan, counts, config.block_m)).reshape(
                    -1, DISPATCH_WORDS
                )
            ]
        rows, counted = combine_tile_table(plan, counts, config.block_m, ENTERED_BASE)
        return [
            torch.from_numpy(rows).reshape(-1, COMBINE_WORDS),
            torch.tensor(counted + [0], dtype=torch.int32),
        ]

    prep, tables = pipelined.prepared(layout, kind, rank, config.as_pipelined(), device, more=tile_tables)
    found = FusedTables(prep=prep, tiles=tables[0], piece_tiles=tables[1] if len(tables) > 1 else None)
    layout.cache[key] = found
    return found


def _check(a: torch.Tensor, w: torch.Tensor) -> None:
    if a.device.type != "cuda":
        raise ConfigError(
            f"template fused runs Triton kernels on CUDA symmetric memory: it needs CUDA tensors, got "
            f"tensors on {a.device.type}; use template 'pipelined' with backend 'nccl' there"
        )
    if a.dtype not in (torch.bfloat16, torch.float16) or w.dtype != a.dtype:
        raise ConfigError(
            f"template fused multiplies 16-bit operands (bf16 or fp16, one type): got {a.dtype} rows and "
            f"{w.dtype} weights; use template 'pipelined' for others"
        )


def _tiles(config: MoeCandidate) -> dict[str, int]:
    return {
        "block_m": config.block_m,
        "block_n": config.block_n,
        "block_k": config.block_k,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


class _DispatchExchange(CopyEngineExchange):
    """The copy-engine exchange of a fused dispatch: copies that wait only for the call's entry
    (made after the rows were gathered), never for the caller's stream after it, which the kernel
    holds; receives that the kernel waits for itself."""

    def send(self, i: int, rows: torch.Tensor) -> None:
        """Copy exchange `i`'s rows (`rows`, exactly them) into its peer's buffer and raise its word."""
        x, ctx, so = self.plan.exchanges[i], self.ctx, self._streamops
        if x.send_at < 0:
            raise ConfigError(
                "backend copy_engine writes rows where the peer keeps them, which takes every rank's "
                "counts: make the layout with exchange_layout (or Routing.layout)"
            )
        self.kept.append(rows)
        if x.send_peer not in self.entered:  # the peer has read what the last call put there
            so.wait_value(
                self.push.cuda_stream, ctx.signal_address(ctx.rank, self._entered + x.send_peer), self.epoch
            )
            self.entered.add(x.send_peer)
        so.copy_async(
            self.push.cuda_stream,
            self.rows.peer_ptrs[x.send_peer] + x.send_at * self.row_bytes,
            rows.data_ptr(),
            rows.shape[0] * self.row_bytes,
        )
        ctx.write_signal(self.push, x.send_peer, self.word(ctx.rank, x.chunk), self.epoch)


def dispatch_rows(
    x: torch.Tensor,
    w: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
    *,
    out: torch.Tensor | None = None,
    keep_received: bool = False,
    spin_limit: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused dispatch of x [T, K] times W [El, K, N]: (h [R, N] in the unfused layout, written
    into `out` where given; with `keep_received`, the received rows [R, K] in arrival order, else None)."""
    _check(x, w)
    group = pipelined._group(group)
    rank = dist.get_rank(group)
    tables = fused_tables(layout, "a2a_gemm", rank, config, x.device)
    plan, prep = tables.prep.plan, tables.prep
    if x.stride(-1) != 1:
        x = x.contiguous()
    token_rows = _token_rows(layout)
    own = plan.own
    # the rows the copies send, gathered into send order; the own rows are read from x by the kernel
    send = x.new_empty((token_rows.numel(), x.shape[1]))
    lo, hi = own.token_rows if own is not None else (0, 0)
    for a, b in ((0, lo), (hi, token_rows.numel())):
        if b > a:
            torch.index_select(x, 0, token_rows[a:b], out=send[a:b])
    width, r = x.shape[1], layout.rows_received
    ex = _DispatchExchange(plan, group, x.device, width, x.dtype, CONTEXTS, prep.rows_needed)
    received = None
    if keep_received:
        received = torch.empty(r, width, dtype=x.dtype, device=x.device)
        if own is not None:
            torch.index_select(x, 0, token_rows[lo:hi], out=received[own.rows[0] : own.rows[1]])
    h = _run_dispatch(ex, x, token_rows, w, tables.tiles, config, send, r, r, out, received, spin_limit)
    return h, received


def _run_dispatch(
    ex: _DispatchExchange,
    x: torch.Tensor,
    token_rows: torch.Tensor,
    w: torch.Tensor,
    tiles: torch.Tensor,
    config: MoeCandidate,
    send: torch.Tensor,
    recv_rows: int,
    h_rows: int,
    out: torch.Tensor | None,
    received: torch.Tensor | None,
    spin_limit: int,
    recv_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """A fused dispatch once its exchange `ex` has entered the call: the kernel over `tiles` on the
    caller's stream (the peers' rows read from the receive buffer, through `recv_index` where
    given), then every exchange's copy of its rows of `send` (send order), and with `received` each
    landed piece copied there from the first `recv_rows` rows of the buffer. Returns h [h_rows, N],
    written into `out` where given."""
    direct = out is not None and out.stride(-1) == 1  # the kernel stores rows of unit column stride
    h = out if direct else torch.empty(h_rows, w.shape[2], dtype=x.dtype, device=x.device)
    ctx = ex.ctx
    launch_dispatch(
        x,
        token_rows,
        ex.rows.local,
        w,
        h,
        tiles,
        ctx.signals.local,
        ctx.error,
        epoch=ex.epoch,
        programs=ctx.sm_count,
        spin_limit=spin_limit or job_bound.limit,
        recv_index=recv_index,
        **_tiles(config),
    )
    exchanges = ex.plan.exchanges
    for i, xc in enumerate(exchanges):
        if xc.sends:
            ex.send(i, send[xc.send_rows[0] : xc.send_rows[1]])
    if received is not None:
        recv = ex.buffer(recv_rows)
        for i, xc in enumerate(exchanges):
            if xc.receives:
                ex.post(i, None, recv)  # the side stream waits for the rows, then copies them
                ex.copy_out(i, recv, received)
    ex.finish()
    if out is not None and not direct:
        h = out.copy_(h)
    return h


def dedup_dispatch_rows(
    x: torch.Tensor,
    w: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
    *,
    out: torch.Tensor | None = None,
    keep_received: bool = False,
    spin_limit: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`fused_dedup`'s dispatch of x [T, K] times W [El, K, N]: each token's row goes once to every
    rank its experts are on (`dedup`'s exchanges, one piece a source), and the fused kernel's tiles
    (the pair plan's, one chunk a source) read each landed row once for each of its experts
    (`recv_index`). Returns (h [R, N] in the unfused layout, written into `out` where given; with
    `keep_received`, the deduplicated rows received, the own ones included, [Σ recv_splits, K] by
    source then token, as `dedup_pipelined.dispatch_rows` returns them, else None)."""
    from syncopate.moe import dedup_pipelined
    from syncopate.moe.dedup import dedup_tables

    _check(x, w)
    group = pipelined._group(group)
    rank = dist.get_rank(group)
    t = dedup_tables(layout, group)
    plan = dedup_pipelined.tables(layout, "a2a_gemm", group, config, x.device)
    tiles = fused_tables(layout, "a2a_gemm", rank, config.replace(template="fused"), x.device).tiles
    index = layout.cache.get(("fused_dedup index", str(x.device)))
    if index is None:
        index = layout.cache[("fused_dedup index", str(x.device))] = t.pair_rows.index.index_select(
            0, layout.expert_order_inverse
        ).to(device=x.device, dtype=torch.int32)
    if x.stride(-1) != 1:
        x = x.contiguous()
    send = x.index_select(0, t.send_tokens.index)  # by destination rank, then token
    width, total = x.shape[1], sum(t.recv_splits)
    ex = _DispatchExchange(plan.plan, group, x.device, width, x.dtype, CONTEXTS, plan.rows_needed)
    received = None
    if keep_received:
        received = torch.empty(total, width, dtype=x.dtype, device=x.device)
        at, sent_at, n = sum(t.recv_splits[:rank]), sum(t.send_splits[:rank]), t.recv_splits[rank]
        received[at : at + n].copy_(send[sent_at : sent_at + n])
    h = _run_dispatch(
        ex,
        x,
        _token_rows(layout),
        w,
        tiles,
        config,
        send,
        total,
        layout.rows_received,
        out,
        received,
        spin_limit,
        index,
    )
    return h, received


def combine_rows(
    h: torch.Tensor,
    w: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
    *,
    spin_limit: int = 0,
) -> torch.Tensor:
    """The fused combine's GEMM and transfers: each row of h [R, K] times its expert's W [El, K, N],
    on its token's rank: [T·top_k, N] in send order, before the top_k sum. The rows are the
    copy-engine context's buffer: read them before the next call of this kind."""
    _check(h, w)
    if h.stride(-1) != 1:
        h = h.contiguous()
    group = pipelined._group(group)
    rank = dist.get_rank(group)
    tables = fused_tables(layout, "gemm_a2a", rank, config, h.device)
    plan, prep = tables.prep.plan, tables.prep
    width = w.shape[2]
    ex = open_exchange("copy_engine", plan, group, h.device, width, h.dtype, prep.rows_needed)
    back = ex.buffer(layout.tokens * layout.top_k)
    ctx = ex.ctx
    dest = ctx.cache.get("moe fused destinations")
    if dest is None:
        if any(p % 16 for p in ex.rows.peer_ptrs):
            raise ConfigError(
                f"receive buffers at {ex.rows.peer_ptrs}: the fused combine stores 16-byte vectors"
            )
        dest = ctx.cache["moe fused destinations"] = to_device(
            torch.tensor(ex.rows.peer_ptrs, dtype=torch.int64), h.device
        )
    pieces = tables.piece_tiles.shape[0]
    if pieces > ctx.counters.shape[0]:
        raise ConfigError(f"{pieces} pieces need more than the context's {ctx.counters.shape[0]} counters")
    launch_combine(
        h,
        w,
        dest,
        ex.rows.local.stride(0),
        tables.tiles,
        tables.piece_tiles,
        ctx.counters,
        ctx.signals.local,
        ctx.peer_signal_ptrs,
        ctx.error,
        epoch=ex.epoch,
        programs=ctx.sm_count,
        spin_limit=spin_limit or job_bound.limit,
        **_tiles(config),
    )
    for i, xc in enumerate(plan.exchanges):
        if xc.receives:
            ex.post(i, None, back)  # the side stream waits for the piece's word
    ex.finish()
    return back


class _Dispatch(pipelined._Dispatch):
    """Forward fused; the backward inherited: the pipelined combine plan with W1ᵀ."""

    @staticmethod
    def forward(ctx, x, w, layout, group, config, backward="plan"):
        h, received = dispatch_rows(x, w, layout, group, config, keep_received=w.requires_grad)
        ctx.save_for_backward(w, received if received is not None else x.new_empty(0))
        ctx.meta = (layout, group, config.as_pipelined(), backward)
        return h


class _Combine(pipelined._Combine):
    """Forward fused; the backward inherited: the pipelined dispatch plan of the weighted gradients."""

    @staticmethod
    def forward(ctx, h, w, gate_weights, layout, group, config, backward="plan"):
        rows = combine_rows(h, w, layout, group, config)
        out = summed_rows(rows, gate_weights, layout)
        # the gates' gradient reads the rows, which are the context's buffer (reused by the next call)
        ctx.save_for_backward(h, w, gate_weights, rows.clone() if ctx.needs_input_grad[2] else None, None)
        ctx.own_lo = 0
        ctx.meta = (layout, group, config.as_pipelined(), backward)
        return out


def dispatch_autograd(x, w, layout, group, config, backward: str = "plan") -> torch.Tensor:
    """`dispatch_rows` with autograd (the backward: the pipelined combine plan with W1ᵀ, or the
    unfused one with `backward="unfused"`)."""
    return _Dispatch.apply(x, w, layout, group, config, backward)


def combine_autograd(h, w, gate_weights, layout, group, config, backward: str = "plan") -> torch.Tensor:
    """`combine` with autograd (the backward: the pipelined dispatch plan with W2ᵀ, or the unfused
    one with `backward="unfused"`)."""
    return _Combine.apply(h, w, gate_weights, layout, group, config, backward)
