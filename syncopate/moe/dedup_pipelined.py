"""The `dedup` MoE template on the copy engine: a token's row crosses to a rank once (as `dedup` on
`nccl`, :mod:`syncopate.moe.dedup`), in pieces overlapped with the grouped GEMMs (as `pipelined`,
:mod:`syncopate.moe.pipelined`).

A piece is one source rank's rows (`chunks_per_source` 1: every row of a token on one rank stays in
one piece, so that its sum is made in one place); the exchanges are those of a plan
(:func:`~syncopate.moe.plan.build_piece_plan`) over the deduplicated rows, each rank one pseudo
expert, so that a rank's rows land in a peer's buffer where that peer's order (by source rank,
then token) puts them.

- Dispatch (`a2a_gemm`): each token's row goes once to every rank its experts are on, every
  exchange posted at once; the own rows' grouped GEMM runs first (their rows read from the send
  buffer), then each source's as soon as its rows are in, each row read once for each of its
  experts there (a gather), the outputs scattered to their places in h (the unfused layout).
- Combine (`gemm_a2a`): each source's piece of h is multiplied by W2 and its rows summed by token,
  weighted by their gates (`segment_sum`, float32, rounded to the rows' dtype), and that one row a
  token is sent back as soon as it is summed; the own piece comes last, summed straight into the
  receive buffer, while the last exchanges move. Once every row is in, each token's rows (one per
  rank its experts are on) are summed in float32.

The backward of each is the unpipelined `dedup` template's: torch's all-to-all of the gradients'
deduplicated rows, their sums by segment and one grouped GEMM each for the inputs' and the
weights' gradients. The tables (the plan over deduplicated rows, each piece's rows among its
source's) are made once per layout and configuration and kept in the layout's cache.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from syncopate.moe import pipelined
from syncopate.moe.dedup import dedup_tables, expert_gates, segment_sum, segments
from syncopate.moe.exchange import open_exchange
from syncopate.moe.ops import grouped_mm, grouped_weight_grad, scatter_rows
from syncopate.moe.plan import PiecePlan, _offsets, build_piece_plan
from syncopate.moe.routing import ExpertLayout
from syncopate.search_space.moe_workload import MoeCandidate

__all__ = ["combine", "combine_rows", "dispatch", "dispatch_rows"]


class _Tables:
    """One rank's tables for one (layout, kind, order): `plan`, the exchanges of the deduplicated
    rows; `gemm`, the pair plan's pieces (one a source: their groups, ends and places in h);
    `rows[i]`, for each row of piece i, its token's deduplicated row among all this rank receives
    (by source rank, then token); `segs[i]` (combine) those rows as segments among the piece's
    source's; `exchange_of[s]`, the exchange that moves source s's rows."""

    __slots__ = ("exchange_of", "gemm", "plan", "rows", "rows_needed", "segs")

    def __init__(self, plan: PiecePlan, rows_needed: int, gemm: pipelined.Prepared, rows, segs, exchange_of):
        self.plan, self.rows_needed, self.gemm = plan, rows_needed, gemm
        self.rows, self.segs, self.exchange_of = rows, segs, exchange_of


def tables(layout: ExpertLayout, kind: str, group, config: MoeCandidate, device: torch.device) -> _Tables:
    """The `_Tables` of `kind` under `config` on this rank (collective on a layout's first use, as
    `dedup_tables`), kept in the layout's cache."""
    rank, ws = dist.get_rank(group), layout.world_size
    key = ("dedup_pipelined", kind, rank, config.order, str(device))
    found = layout.cache.get(key)
    if found is not None:
        return found
    t = dedup_tables(layout, group)
    matrix = t.matrix
    plan = build_piece_plan(
        kind,
        rank=rank,
        world_size=ws,
        send_splits=list(matrix[rank]),
        recv_counts=[[matrix[s][rank]] for s in range(ws)],
        chunks=1,
        order=config.order,
        counts=matrix,
    )
    if kind == "a2a_gemm":
        needed = max(sum(matrix[s][r] for s in range(ws)) for r in range(ws))
    else:
        needed = max(sum(row) for row in matrix)
    pair = MoeCandidate(template="pipelined", backend=config.backend, order=config.order)
    gemm, _ = pipelined.prepared(layout, kind, rank, pair, device)
    starts = _offsets(t.recv_splits)
    rows, segs = [], []
    for index, piece in enumerate(gemm.plan.pieces):
        dedup_row = t.pair_rows.index.index_select(0, gemm.places[index])
        rows.append(dedup_row)
        if kind == "gemm_a2a":
            segs.append(
                segments(dedup_row - starts[piece.source], t.recv_splits[piece.source], t.pair_rows.most)
            )
    exchange_of = {}
    for i, x in enumerate(plan.exchanges):
        exchange_of[x.recv_peer if kind == "a2a_gemm" else x.send_peer] = i
    found = layout.cache[key] = _Tables(plan, needed, gemm, tuple(rows), tuple(segs), exchange_of)
    return found


def dispatch_rows(
    x: torch.Tensor,
    w: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
    *,
    out: torch.Tensor | None = None,
    keep_received: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [T, K] times W [El, K, N], a token's row sent once a rank: (h [R, N] in the unfused layout,
    written into `out` where given; with `keep_received`, the deduplicated rows this rank received,
    its own included, [Σ recv_splits, K] by source rank then token, else None)."""
    group = pipelined._group(group)
    t = dedup_tables(layout, group)
    tab = tables(layout, "a2a_gemm", group, config, x.device)
    rank = dist.get_rank(group)
    send = x.index_select(0, t.send_tokens.index)  # by destination rank, then token
    ex = open_exchange(
        config.backend, tab.plan, group, x.device, x.shape[1], x.dtype, tab.rows_needed, config.comm_sms
    )
    total = sum(t.recv_splits)
    recv = ex.buffer(total)
    for i, e in enumerate(tab.plan.exchanges):
        ex.post(i, send[e.send_rows[0] : e.send_rows[1]] if e.sends else None, recv)
    own_at = _offsets(t.recv_splits)[rank]
    own_send_at = _offsets(t.send_splits)[rank]
    received = None
    if keep_received:
        received = torch.empty(total, x.shape[1], dtype=x.dtype, device=x.device)
        n = t.recv_splits[rank]
        received[own_at : own_at + n].copy_(send[own_send_at : own_send_at + n])
        for i in range(len(tab.plan.exchanges)):
            if tab.plan.exchanges[i].receives:
                ex.copy_out(i, recv, received)
    h = (
        out
        if out is not None
        else torch.empty(layout.rows_received, w.shape[2], dtype=x.dtype, device=x.device)
    )
    gemm = tab.gemm
    for index, piece in enumerate(gemm.plan.pieces):
        if piece.exchange is None:  # the own rows, read from the send buffer
            a = send.index_select(0, tab.rows[index] - (own_at - own_send_at))
        else:
            ex.wait(tab.exchange_of[piece.source])
            a = recv.index_select(0, tab.rows[index])
        scatter_rows(h, gemm.places[index], grouped_mm(a, w, piece.groups, offsets=gemm.offsets[index]))
    ex.finish()
    return h, received


def combine_rows(
    h: torch.Tensor,
    w: torch.Tensor,
    gates: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
    *,
    out: torch.Tensor | None = None,
    keep: list | None = None,
) -> torch.Tensor:
    """h [R, F] (the unfused layout) times W [El, F, H], each token's rows summed on the expert's
    rank weighted by `gates` [R] (h's order) and sent back once, then summed over the ranks:
    [T, H] in h's dtype, written into `out` where given. `keep` (a list) receives each piece's
    (places in h, GEMM output) for the gates' gradient."""
    group = pipelined._group(group)
    t = dedup_tables(layout, group)
    tab = tables(layout, "gemm_a2a", group, config, h.device)
    rank = dist.get_rank(group)
    width = w.shape[2]
    ex = open_exchange(
        config.backend, tab.plan, group, h.device, width, h.dtype, tab.rows_needed, config.comm_sms
    )
    back = ex.buffer(sum(t.send_splits))
    gemm = tab.gemm
    by_source = {p.source: (i, p) for i, p in enumerate(gemm.plan.pieces)}

    def summed(index: int, piece, into: torch.Tensor | None = None) -> torch.Tensor:
        places = gemm.places[index]
        y = grouped_mm(h.index_select(0, places), w, piece.groups, offsets=gemm.offsets[index])
        if keep is not None:
            keep.append((places, y))
        return segment_sum(y, gates.index_select(0, places), tab.segs[index], out=into)

    for i, e in enumerate(tab.plan.exchanges):
        z = None
        if e.sends:
            index, piece = by_source[e.send_peer]
            z = summed(index, piece)
        ex.post(i, z, back)
    at = _offsets(t.send_splits)[rank]
    own = t.send_splits[rank]
    if rank in by_source and by_source[rank][1].exchange is None:
        index, piece = by_source[rank]
        summed(index, piece, back[at : at + own])
    ex.finish()
    return segment_sum(back, None, t.send_tokens, out=out)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, layout, group, config):
        if config.template == "fused_dedup":
            from syncopate.moe import fused

            h, received = fused.dedup_dispatch_rows(
                x, w, layout, group, config, keep_received=w.requires_grad
            )
        else:
            h, received = dispatch_rows(x, w, layout, group, config, keep_received=w.requires_grad)
        ctx.save_for_backward(w, received if received is not None else x.new_empty(0))
        ctx.meta = (layout, group)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        w, received = ctx.saved_tensors
        layout, group = ctx.meta
        t = dedup_tables(layout, group)
        grad_h = grad_h.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            pairs = grouped_mm(
                grad_h, w.transpose(1, 2), layout.group_sizes, offsets=layout.offsets(grad_h.device)
            )
            rows = segment_sum(pairs, None, t.pair_rows)  # a received row's gradient: its pairs' sum
            sent = rows.new_empty((sum(t.send_splits), rows.shape[1]))
            dist.all_to_all_single(sent, rows, t.send_splits, t.recv_splits, group=group)
            grad_x = segment_sum(sent, None, t.send_tokens)
        if ctx.needs_input_grad[1]:
            grad_w = grouped_weight_grad(
                received.index_select(0, t.pair_rows.index), grad_h, layout.group_sizes
            )
        return grad_x, grad_w, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, gates, layout, group, config):
        keep = [] if ctx.needs_input_grad[2] else None
        out = combine_rows(h, w, gates, layout, group, config, keep=keep)
        ctx.save_for_backward(h, w, gates)
        ctx.kept, ctx.meta = keep, (layout, group)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, w, gates = ctx.saved_tensors
        layout, group = ctx.meta
        t = dedup_tables(layout, group)
        spread = grad_out.contiguous().index_select(0, t.send_tokens.index)  # each sent row's gradient
        rows = spread.new_empty((sum(t.recv_splits), spread.shape[1]))
        dist.all_to_all_single(rows, spread, t.recv_splits, t.send_splits, group=group)
        pairs = rows.index_select(0, t.pair_rows.index)  # each row of h's output: its token's gradient
        grad_h = grad_w = grad_gates = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_y = (pairs.float() * gates.float().unsqueeze(1)).to(pairs.dtype)
            if ctx.needs_input_grad[0]:
                grad_h = grouped_mm(
                    grad_y, w.transpose(1, 2), layout.group_sizes, offsets=layout.offsets(h.device)
                )
            if ctx.needs_input_grad[1]:
                grad_w = grouped_weight_grad(h, grad_y, layout.group_sizes)
        if ctx.kept is not None:
            grad_gates = gates.new_zeros(gates.shape, dtype=torch.float32)
            for places, y in ctx.kept:
                grad_gates[places] = (pairs.index_select(0, places).float() * y.float()).sum(1)
            grad_gates = grad_gates.to(gates.dtype)
        ctx.kept = None
        return grad_h, grad_w, grad_gates, None, None, None


def dispatch(
    x: torch.Tensor, w1: torch.Tensor, layout: ExpertLayout, group, config: MoeCandidate
) -> torch.Tensor:
    """`dispatch_rows` of x with autograd (`fused_dedup`: `fused.dedup_dispatch_rows`; the backward:
    the unpipelined `dedup` template's)."""
    return _Dispatch.apply(x, w1, layout, group, config)


def combine(
    h: torch.Tensor,
    w2: torch.Tensor,
    gate_weights: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
) -> torch.Tensor:
    """`combine_rows` with autograd: the gates reach the experts' ranks by `expert_gates` (one
    all-to-all of a float a pair), whose gradient goes back the same way."""
    return _Combine.apply(h, w2, expert_gates(gate_weights, layout, group), layout, group, config)
