"""The `pipelined` MoE plans: the all-to-all cut into pieces, one grouped GEMM a piece.

- Dispatch (`a2a_gemm`): the rank's pairs are gathered into send order (the token side), every
  exchange of the plan (:mod:`syncopate.moe.plan`) is posted at once, and the grouped GEMMs run
  on the caller's stream: the own rows' first, straight from the token side (no transfer), then
  each source chunk's as soon as it is in. Each piece's output rows go to their places in h,
  which keeps the unfused layout (by local expert, then source rank, then token): the rows of a
  piece are scattered there (`scatter_rows`, one a piece) instead of the received rows being
  gathered before one GEMM.
- Combine (`gemm_a2a`): each peer's piece (its rows of h, gathered by position) is multiplied by
  W2 and posted as soon as that GEMM is enqueued, in exchange order; the own piece is computed
  last, while the last exchanges move, and left where its GEMM wrote it; once every row is in,
  the top_k rows of each token are summed, weighted by the gate weights, by the unfused op's
  `summed_rows` (the same sum in the same order: the results agree with it).

The backward of each is the other's plan with the same config: the gradient of dispatch's rows
is a combine (GEMM with W1ᵀ, then the rows back to their tokens, summed); that of combine's h a
dispatch of the weighted output gradients (then a GEMM with W2ᵀ). The weights' gradients are one
K-grouped GEMM each (`grouped_weight_grad`) on the rows the forward kept.

The piece tables a call needs (the plan, each piece's group ends on the device, its rows' places
in h) are made once per layout and config and kept in the layout's cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist

from syncopate.moe.exchange import open_exchange, owns_buffer
from syncopate.moe.ops import (
    Own,
    _token_rows,
    grouped_mm,
    grouped_weight_grad,
    job_bounded,
    scatter_rows,
    summed_rows,
    summed_rows_grads,
    token_sum,
    unfused_combine_rows,
    unfused_dispatch_rows,
)
from syncopate.moe.plan import Piece, PiecePlan, build_piece_plan
from syncopate.moe.routing import ExpertLayout, to_device_all
from syncopate.search_space.moe_workload import MoeCandidate

__all__ = [
    "combine_autograd",
    "combine_rows",
    "dispatch_autograd",
    "dispatch_rows",
    "exchange_alone",
    "prepared",
]


class Prepared:
    """What every call of one (layout, kind, config) on one rank needs: the plan and the most rows a
    rank receives (`rows_needed`, -1 where the layout has no counts), then per piece of
    `plan.pieces` its groups' ends on the device (`offsets`) and the rows of h its rows are
    (`places`: expert-side rows → h's layout), made at first use (the fused plans, which make their
    own tables, never use them in their forward: their host time there is after the routing's
    wait)."""

    __slots__ = ("_device", "_experts", "_offsets", "_order", "_places", "plan", "rows_needed")

    def __init__(self, plan: PiecePlan, rows_needed: int, layout: ExpertLayout, device: torch.device) -> None:
        self.plan, self.rows_needed = plan, rows_needed
        # the layout's tables, not the layout, whose cache keeps this
        self._experts, self._order, self._device = layout.local_experts, layout.expert_order_inverse, device
        self._offsets: tuple[torch.Tensor, ...] | None = None
        self._places: tuple[torch.Tensor, ...] | None = None

    @property
    def offsets(self) -> tuple[torch.Tensor, ...]:
        if self._offsets is None:
            el, pieces = self._experts, self.plan.pieces
            ends = torch.tensor(
                [end for p in pieces for end in itertools.accumulate(p.groups)], dtype=torch.int32
            )
            flat = to_device_all([ends], self._device)[0]
            self._offsets = tuple(flat[i * el : (i + 1) * el] for i in range(len(pieces)))
        return self._offsets

    @property
    def places(self) -> tuple[torch.Tensor, ...]:
        if self._places is None:
            self._places = tuple(self._order[p.rows[0] : p.rows[1]] for p in self.plan.pieces)
        return self._places


def prepared(
    layout: ExpertLayout,
    kind: str,
    rank: int,
    config: MoeCandidate,
    device: torch.device,
    more: Callable[[PiecePlan], list[torch.Tensor]] | None = None,
) -> tuple[Prepared, list[torch.Tensor]]:
    """The plan of `kind` under `config` on rank `rank`, made once and kept in the layout's cache;
    with `more`, the further int32 tables it makes from the plan (on the CPU), moved to the device
    in one copy (each copy costs the host tens of microseconds, after the routing's wait for the
    device, when nothing else is queued there), else []."""
    key = ("pipelined", kind, rank, config.chunks_per_source, config.order, str(device))
    prep = layout.cache.get(key)
    if prep is None:
        counts = layout.host_counts()
        plan = build_piece_plan(
            kind,
            rank=rank,
            world_size=layout.world_size,
            send_splits=list(layout.send_splits),
            recv_counts=layout.host_recv_counts(),
            chunks=config.chunks_per_source,
            order=config.order,
            counts=counts,
        )
        if counts is None:
            needed = -1
        elif kind == "a2a_gemm":
            needed = max(layout.rows_received_by(q) for q in range(layout.world_size))
        else:
            needed = max(sum(row) for row in counts)
        prep = layout.cache[key] = Prepared(plan, needed, layout, device)
    return prep, to_device_all(more(prep.plan), device) if more is not None else []


def _group(group):
    return group if group is not None else dist.group.WORLD


def _gemm(prep: Prepared, index: int, piece: Piece, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return grouped_mm(a, w, piece.groups, offsets=prep.offsets[index])


def dispatch_rows(
    rows: torch.Tensor,
    w: torch.Tensor,
    layout: ExpertLayout,
    group,
    config: MoeCandidate,
    *,
    tokens: bool,
    out: torch.Tensor | None = None,
    keep_received: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pipelined dispatch of `rows`: x [T, K] (`tokens`: each pair takes its token's row) or one
    row a pair in send order [T·top_k, K], times W [El, K, N]: (h [R, N] in the unfused layout,
    written into `out` where given; with `keep_received`, the received rows [R, K] in arrival order,
    else None)."""
    group = _group(group)
    prep, _ = prepared(layout, "a2a_gemm", dist.get_rank(group), config, rows.device)
    plan = prep.plan
    send = rows[_token_rows(layout)] if tokens else rows
    width, r = rows.shape[1], layout.rows_received
    ex = open_exchange(
        config.backend, plan, group, rows.device, width, rows.dtype, prep.rows_needed, config.comm_sms
    )
    recv = ex.buffer(r)
    received = None
    if keep_received:
        received = recv if ex.owns_buffer else torch.empty(r, width, dtype=rows.dtype, device=rows.device)
    for i, x in enumerate(plan.exchanges):
        ex.post(i, send[x.send_rows[0] : x.send_rows[1]] if x.sends else None, recv)
        if received is not None and not ex.owns_buffer:
            ex.copy_out(i, recv, received)
    h = out if out is not None else torch.empty(r, w.shape[2], dtype=rows.dtype, device=rows.device)
    for index, piece in enumerate(plan.pieces):
        if piece.exchange is None:
            a = send[piece.token_rows[0] : piece.token_rows[1]]
            if received is not None:
                received[piece.rows[0] : piece.rows[1]].copy_(a)
        else:
            ex.wait(piece.exchange)
            a = recv[piece.rows[0] : piece.rows[1]]
        scatter_rows(h, prep.places[index], _gemm(prep, index, piece, a, w))
    ex.finish()
    return h, received


def combine_rows(
    h: torch.Tensor, w: torch.Tensor, layout: ExpertLayout, group, config: MoeCandidate
) -> tuple[torch.Tensor, Own | None]:
    """The pipelined combine's GEMM and transfers: each row of h [R, K] (the unfused layout) times
    its expert's W [El, K, N], back on its token's rank: (rows [T·top_k, N] in send order
    (`layout.order`), before the top_k sum; the own rows (`ops.Own`), left where their GEMM wrote
    them, in place of that range of the rows: no copy on the path to the sum). The rows may be the
    copy-engine context's buffer: read them before the next call of this kind."""
    group = _group(group)
    prep, _ = prepared(layout, "gemm_a2a", dist.get_rank(group), config, h.device)
    plan = prep.plan
    width = w.shape[2]
    ex = open_exchange(
        config.backend, plan, group, h.device, width, h.dtype, prep.rows_needed, config.comm_sms
    )
    back = ex.buffer(layout.tokens * layout.top_k)
    pieces = {p.exchange: (i, p) for i, p in enumerate(plan.pieces)}
    for i, _ in enumerate(plan.exchanges):
        y = None
        if i in pieces:
            index, piece = pieces[i]
            y = _gemm(prep, index, piece, h.index_select(0, prep.places[index]), w)
        ex.post(i, y, back)
    own = None
    if None in pieces:
        index, piece = pieces[None]
        own = (_gemm(prep, index, piece, h.index_select(0, prep.places[index]), w), piece.token_rows[0])
    ex.finish()
    return back, own


def exchange_alone(
    rows: torch.Tensor, layout: ExpertLayout, group, config: MoeCandidate, kind: str
) -> torch.Tensor:
    """The transfers of `kind`'s pipelined plan under `config`, with no GEMM: `rows` in the sender's
    order (dispatch: one row a pair in send order [T·top_k, K]; combine: the expert side [R, K])
    moved where the plan moves them; returns the receive buffer (the receiver's order: the expert
    side, or the token side), the peers' rows in it once the caller's stream gets there. The own
    rows are not moved (no plan moves them). What the bound's all-to-all alone takes on `config`'s
    backend."""
    group = _group(group)
    prep, _ = prepared(layout, kind, dist.get_rank(group), config, rows.device)
    plan = prep.plan
    ex = open_exchange(
        config.backend, plan, group, rows.device, rows.shape[1], rows.dtype, prep.rows_needed, config.comm_sms
    )
    recv = ex.buffer(layout.rows_received if kind == "a2a_gemm" else layout.tokens * layout.top_k)
    for i, x in enumerate(plan.exchanges):
        ex.post(i, rows[x.send_rows[0] : x.send_rows[1]] if x.sends else None, recv)
    ex.finish()
    return recv


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, layout, group, config, backward="plan"):
        h, received = dispatch_rows(x, w, layout, group, config, tokens=True, keep_received=w.requires_grad)
        ctx.save_for_backward(w, received if received is not None else x.new_empty(0))
        ctx.meta = (layout, group, config, backward)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        w, received = ctx.saved_tensors
        layout, group, config, how = ctx.meta
        grad_h = grad_h.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            if how == "unfused":
                back, own = unfused_combine_rows(grad_h, w.transpose(1, 2), layout, group), None
            else:
                back, own = job_bounded(
                    "syncopate.moe.dispatch_gemm's backward (the combine plan)",
                    group,
                    grad_h,
                    config,
                    lambda: combine_rows(grad_h, w.transpose(1, 2), layout, group, config),
                )
            grad_x = token_sum(back, layout, own)
        if ctx.needs_input_grad[1]:
            grad_w = grouped_weight_grad(received[layout.expert_order], grad_h, layout.group_sizes)
        return grad_x, grad_w, None, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, gate_weights, layout, group, config, backward="plan"):
        rows, own = combine_rows(h, w, layout, group, config)
        out = summed_rows(rows, gate_weights, layout, own)
        kept = None
        if ctx.needs_input_grad[2]:  # the gates' gradient reads the rows; a context's buffer is reused
            rows = rows if owns_buffer(config.backend) else rows.clone()
            kept = own[0] if own is not None else None
        else:
            rows = None
        ctx.save_for_backward(h, w, gate_weights, rows, kept)
        ctx.own_lo = own[1] if own is not None else 0
        ctx.meta = (layout, group, config, backward)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        """`summed_rows`'s gradients, then the dispatch plan of the weighted rows with W2ᵀ."""
        h, w, gate_weights, rows, kept = ctx.saved_tensors
        layout, group, config, how = ctx.meta
        grad_h = grad_w = None
        grad_rows, grad_gates = summed_rows_grads(
            grad_out,
            rows,
            gate_weights,
            layout,
            rows_grad=ctx.needs_input_grad[0] or ctx.needs_input_grad[1],
            gates_grad=ctx.needs_input_grad[2],
            own=None if kept is None else (kept, ctx.own_lo),
        )
        if grad_rows is not None:
            if how == "unfused":
                grad_h, grad_y = unfused_dispatch_rows(
                    grad_rows,
                    w.transpose(1, 2),
                    layout,
                    group,
                    tokens=False,
                    keep_received=ctx.needs_input_grad[1],
                )
            else:
                grad_h, grad_y = job_bounded(
                    "syncopate.moe.gemm_combine's backward (the dispatch plan)",
                    group,
                    grad_rows,
                    config,
                    lambda: dispatch_rows(
                        grad_rows,
                        w.transpose(1, 2),
                        layout,
                        group,
                        config,
                        tokens=False,
                        keep_received=ctx.needs_input_grad[1],
                    ),
                )
            if ctx.needs_input_grad[1]:
                grad_w = grouped_weight_grad(h, grad_y[layout.expert_order], layout.group_sizes)
        return grad_h, grad_w, grad_gates, None, None, None, None


def dispatch_autograd(x, w, layout, group, config, backward: str = "plan") -> torch.Tensor:
    """`dispatch_rows` of x's token rows with autograd (the backward: the combine plan with W1ᵀ, or
    with `backward="unfused"` the unfused combine's rows)."""
    return _Dispatch.apply(x, w, layout, group, config, backward)


def combine_autograd(h, w, gate_weights, layout, group, config, backward: str = "plan") -> torch.Tensor:
    """`combine` with autograd (the backward: the dispatch plan of the weighted gradients with W2ᵀ,
    or with `backward="unfused"` the unfused dispatch's)."""
    return _Combine.apply(h, w, gate_weights, layout, group, config, backward)
