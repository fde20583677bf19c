"""The `dedup` MoE template: a token's row crosses to a rank once, however many of its experts live
there.

A token routes its top_k rows to top_k experts, and several of them often live on one rank (a
Qwen3-like layer, 8 of 128 experts, puts about four of a token's experts on each of two ranks). The
`unfused` ops move one row a (token, expert) pair; these move one row a (token, rank):

- dispatch (`a2a_gemm`): each rank sends each token once to every rank its experts are on (torch's
  all_to_all_single), and the receiving rank reads the row once for each of its experts that the
  token chose (a gather into the grouped GEMM's rows);
- combine (`gemm_a2a`): the expert rank sums a token's rows of its experts, each weighted by the
  token's gate weight, in float32, and sends the one sum back; the token's rank adds up the sums
  of the ranks (at most ws of them, in float32).

Both keep the unfused ops' row layouts (h in the unfused order), so a layer mixes them with every
other template; their autograd is torch's, through the gathers and sums below, whose backwards
accumulate in float32. Every sum is one by segment (`segment_sum`: on a GPU one Triton kernel that
reads each segment's rows once), and the gather's gradient is one too. The combine rounds each
rank's sum to the rows' dtype before it moves (as a reduce-scatter in that dtype does), where
`unfused` sums every pair's row in one float32 sum.

The tables (`DedupTables`) are made once per layout, on first use, and kept in its cache: one sort
of the pairs' (rank, token) keys on the device, every rank's row counts a rank and an all-to-all of
one int64 a pair. The counts come with the layout where `exchange_layout(..., dedup=True)` made it
(the host then waits for nothing here), else from an all-gather of their own that the host reads.

With backend `copy_engine` the same rows move in pieces overlapped with the grouped GEMMs
(:mod:`syncopate.moe.dedup_pipelined`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from syncopate.moe.ops import _ALL_GATHER, _row_kernels_run, all_to_all_rows, grouped_mm
from syncopate.moe.plan import _offsets
from syncopate.moe.routing import ExpertLayout, to_device, to_device_all

__all__ = [
    "DedupTables",
    "Segments",
    "combine",
    "dedup_tables",
    "dispatch",
    "expert_gates",
    "segment_sum",
    "segments",
]


@dataclass(frozen=True, slots=True, eq=False)
class Segments:
    """Rows grouped by the segment each belongs to, for sums by segment: `index` [R] the segment
    of each row, `order` [R] the rows by segment (stable), `starts` [n + 1] where each segment's
    rows begin in `order`."""

    index: torch.Tensor
    order: torch.Tensor
    starts: torch.Tensor
    n: int
    most: int
    """At most this many rows in a segment (a bound known without reading the tables back)."""


def segments(index: torch.Tensor, n: int, most: int) -> Segments:
    """The `Segments` of rows whose segments (in [0, n)) `index` gives, at most `most` rows each.
    Sizes known on the host: nothing read back from the device."""
    order = torch.argsort(index, stable=True)
    counts = torch.zeros(n, dtype=torch.int64, device=index.device).scatter_add_(
        0, index, torch.ones_like(index)
    )
    starts = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return Segments(index=index, order=order, starts=starts, n=n, most=most)


@dataclass(frozen=True, slots=True, eq=False)
class DedupTables:
    """One rank's tables of the `dedup` template for one layout."""

    send_tokens: Segments
    """The token of each row this rank sends (by destination rank, then token), as segments of the
    token's rank's final sum: `send_tokens.index` [S] int64."""
    send_splits: list[int]
    """Rows sent to each rank: the tokens with at least one expert there."""
    recv_splits: list[int]
    """Rows received from each rank."""
    matrix: list[list[int]]
    """`matrix[q][r]`: the rows rank q sends rank r (every rank's `send_splits`), which tell a
    rank where its rows land in a peer's buffer (`syncopate.moe.dedup_pipelined`)."""
    pair_rows: Segments
    """For each row of h (the unfused order: by local expert, source rank, token), the received row
    that is its token's (`pair_rows.index` [R] int64), as segments of the combine's sums."""


def _unique(keys: torch.Tensor, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct values of `keys`, sorted; each key's index among them), as `torch.unique`
    gives them; with `n` (how many there are, known on the host) without reading anything back
    from the device."""
    if n is None:
        return torch.unique(keys, sorted=True, return_inverse=True)
    ordered, perm = torch.sort(keys, stable=True)
    new = torch.ones_like(ordered, dtype=torch.bool)
    new[1:] = ordered[1:] != ordered[:-1]
    at = torch.cumsum(new.to(torch.int64), 0) - 1
    return ordered.new_empty(n).scatter_(0, at, ordered), torch.empty_like(at).scatter_(0, perm, at)


def dedup_tables(layout: ExpertLayout, group) -> DedupTables:
    """This rank's `DedupTables` for `layout` (collective on first use: every rank of `group` makes
    its first call of a layout together, as with every MoE op), kept in the layout's cache. Where
    the layout carries every rank's rows a rank (`exchange_layout(dedup=True)`), the host waits for
    nothing here; else one all-gather of them is read back."""
    tables = layout.cache.get("dedup")
    if tables is not None:
        return tables
    ws, tokens, top_k = layout.world_size, layout.tokens, layout.top_k
    device = layout.order.device
    rank = dist.get_rank(group)
    matrix = layout.cache.get("dedup rows")  # [q][r]: the rows rank q sends rank r
    ranks = torch.arange(ws, dtype=torch.int64, device=device)
    pairs = tokens * top_k
    send_pairs, recv_pairs = to_device_all(
        [
            torch.tensor(layout.send_splits, dtype=torch.int64),
            torch.tensor(layout.recv_splits, dtype=torch.int64),
        ],
        device,
    )
    # the send order groups the pairs by destination rank: a pair's rank and token make its row's key
    dest = torch.repeat_interleave(ranks, send_pairs, output_size=pairs)
    keys = dest * max(tokens, 1) + layout.order // top_k
    unique, row_of_pair = _unique(keys, None if matrix is None else sum(matrix[rank]))
    counts = torch.zeros(ws, dtype=torch.int64, device=device).scatter_add_(
        0, unique // max(tokens, 1), torch.ones_like(unique)
    )
    starts = torch.cumsum(counts, 0) - counts
    local = row_of_pair - starts[dest]  # a pair's row among those sent to its rank
    if matrix is None:
        every = counts.new_empty((ws * ws,))
        _ALL_GATHER(every, counts, group=group)
    local_recv = torch.empty(layout.rows_received, dtype=torch.int64, device=device)
    dist.all_to_all_single(local_recv, local, list(layout.recv_splits), list(layout.send_splits), group=group)
    if matrix is None:
        matrix = every.view(ws, ws).tolist()  # the host's one wait
    send_splits, recv_splits = matrix[rank], [row[rank] for row in matrix]
    recv_starts = to_device(torch.tensor(_offsets(recv_splits), dtype=torch.int64), device)
    source = torch.repeat_interleave(ranks, recv_pairs, output_size=layout.rows_received)
    expert_side = local_recv + recv_starts[source]  # by source rank, expert, token
    # a token comes back from at most min(ws, top_k) ranks; a received row is read by at most
    # min(top_k, El) of its rank's experts
    tables = DedupTables(
        send_tokens=segments(unique % max(tokens, 1), tokens, min(ws, top_k)),
        send_splits=send_splits,
        recv_splits=recv_splits,
        matrix=matrix,
        pair_rows=segments(
            expert_side.index_select(0, layout.expert_order),
            sum(recv_splits),
            min(top_k, layout.local_experts),
        ),
    )
    layout.cache["dedup"] = tables
    return tables


def segment_sum(
    rows: torch.Tensor, weights: torch.Tensor | None, seg: Segments, out: torch.Tensor | None = None
) -> torch.Tensor:
    """[seg.n, N] in rows' dtype: each segment's rows of `rows` [R, N] summed, weighted by
    `weights` [R] where given, in float32 (no autograd), written into `out` where given (rows of
    unit column stride). On a GPU with 16-bit rows (or under Triton's interpreter) one kernel reads
    each segment's rows once (`syncopate.moe.kernels.launch_segment_sum`); elsewhere torch's
    `index_add_`."""
    if out is None:
        out = rows.new_empty((seg.n, rows.shape[1]))
    if _row_kernels_run(rows, seg.index) and out.numel():
        from syncopate.moe.kernels import launch_segment_sum

        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        launch_segment_sum(rows, seg.order, seg.starts, seg.most, weights, out)
        return out
    terms = rows.float() if weights is None else rows.float() * weights.float().unsqueeze(1)
    summed = torch.zeros((seg.n, rows.shape[1]), dtype=torch.float32, device=rows.device)
    return out.copy_(summed.index_add_(0, seg.index, terms))


def expert_gates(gate_weights: torch.Tensor, layout: ExpertLayout, group) -> torch.Tensor:
    """Each pair's gate weight ([T, top_k] on the token's rank) on its expert's rank, [R] in h's
    order (one all-to-all of a float a pair), with autograd."""
    gates = gate_weights.reshape(-1, 1).index_select(0, layout.order)  # send order
    gates = all_to_all_rows(gates, layout.recv_splits, layout.send_splits, group)
    return gates.index_select(0, layout.expert_order).squeeze(1)


class _SumRows(torch.autograd.Function):
    """`segment_sum` with autograd: its gradients are rows[i] ← w[i] · grad[index[i]] and
    w[i] ← rows[i] · grad[index[i]]."""

    @staticmethod
    def forward(ctx, rows, weights, seg):
        ctx.save_for_backward(rows if weights is not None else None, weights)
        ctx.seg = seg
        return segment_sum(rows, weights, seg)

    @staticmethod
    def backward(ctx, grad):
        rows, weights = ctx.saved_tensors
        spread = grad.index_select(0, ctx.seg.index)
        grad_rows = grad_weights = None
        if ctx.needs_input_grad[0]:
            grad_rows = (
                spread if weights is None else (spread.float() * weights.float().unsqueeze(1)).to(grad.dtype)
            )
        if weights is not None and ctx.needs_input_grad[1]:
            grad_weights = (spread.float() * rows.float()).sum(1).to(weights.dtype)
        return grad_rows, grad_weights, None


class _GatherRows(torch.autograd.Function):
    """rows[seg.index] (a row may be read several times); its gradient sums each row's reads
    (`segment_sum`, float32)."""

    @staticmethod
    def forward(ctx, rows, seg):
        ctx.seg = seg
        return rows.index_select(0, seg.index)

    @staticmethod
    def backward(ctx, grad):
        return segment_sum(grad, None, ctx.seg), None


def dispatch(x: torch.Tensor, w1: torch.Tensor, layout: ExpertLayout, group) -> torch.Tensor:
    """`a2a_gemm` of x [T, H] and W1 [El, H, N] with a row a (token, rank): h [R, N] in the unfused
    layout, with autograd."""
    t = dedup_tables(layout, group)
    sent = _GatherRows.apply(x, t.send_tokens)
    received = all_to_all_rows(sent, t.recv_splits, t.send_splits, group)
    rows = _GatherRows.apply(received, t.pair_rows)
    return grouped_mm(rows, w1, layout.group_sizes, offsets=layout.offsets(x.device))


def combine(
    h: torch.Tensor, w2: torch.Tensor, gate_weights: torch.Tensor, layout: ExpertLayout, group
) -> torch.Tensor:
    """`gemm_a2a` of h [R, F] (the unfused layout), W2 [El, F, H] and the gate weights [T, top_k]
    with a row a (token, rank): [T, H] in h's dtype, with autograd. Each pair's gate weight moves to
    its expert's rank (one all-to-all of a float a pair)."""
    t = dedup_tables(layout, group)
    y = grouped_mm(h, w2, layout.group_sizes, offsets=layout.offsets(h.device))
    summed = _SumRows.apply(y, expert_gates(gate_weights, layout, group), t.pair_rows)
    back = all_to_all_rows(summed, t.send_splits, t.recv_splits, group)
    return _SumRows.apply(back, None, t.send_tokens)
