"""The all-gather matmul cut into cuBLAS GEMMs over the shards as they land (`template:
decomposed` for ag_gemm).

Rank r's output is all_gather(A) @ B_r. Its own rows need nothing from the peers: their GEMM runs
first, from the shard itself, while every rank pushes its shard to each peer in turn (r+1 first,
so that at each step every rank sends to one peer and receives from another). The peers' rows
then go through as few GEMMs as their arrivals allow (`gather_gemms`): with one split, the shards
of every peer in one GEMM (two where their rows wrap past row 0), the fewest kernels where the
shards land while the own rows' GEMM runs (a cuBLAS GEMM of a shard's rows runs well below the
rate of one over many shards); with more, groups of shards or parts of each, for a link too slow to
land everything in that time. On wide shapes one split can beat the fused consumer, torch's
fused_all_gather_matmul (one GEMM a shard) and even cuBLAS's one GEMM of the whole gathered A: the
shapes where it won are in docs/templates.md ("Where each template won").
One call, rank r, its rows [r0, r0 + m):

- side stream 0 (pushes): announce r's entry into every pad; for each peer p in turn: wait until
  p has entered this call (p's GEMMs of the previous call, which read what r pushed there, are
  done), then for each part j of the shard copy it into p's `a_full` rows of r and raise p's word
  `SHARD + r * parts + j`.
- caller's stream: out[r0 : r0 + m] = A_r @ B_r; then each GEMM of `gather_gemms`, once the parts
  it reads are here (events of side stream 1), out[rows] = a_full[rows] @ B_r.
- side stream 1: for each peer q in the order the shards land, each part j: wait for
  `SHARD + q * parts + j`, then an event.
- side stream 2 (only where the gathered A is asked for): copy the shard into its rows at once,
  then each part of a peer's shard from `a_full` once its event is there.

FP8 operands (`scales`): A's bytes move as they are (`a_full` holds them as uint8) and each
part's scale rows go with it, into the peer's `a_scale` rows of r before its word is raised (a
tensor-wise scale is written on each of the shard's rows first, so that every rank's rows keep
their own); every GEMM is a `torch._scaled_mm` with its rows' scales.

The caller's stream then waits for the side streams. A wait is for an entry, announced first, or
for a part of a shard, whose push waits only for entries: a call always ends. Only for
copy-engine candidates on one node; B stays where it is, in either layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from syncopate.kernels import streamops
from syncopate.kernels.backends import announce_entry
from syncopate.kernels.context import OverlapContext, record, wait
from syncopate.kernels.scaled import FP8, Scales, column_major, fast_accumulation, scaled_mm
from syncopate.kernels.tables import ARRIVAL_SLOTS, ENTERED_BASE
from syncopate.search_space import (
    gather_gemms,
    gather_parts,
    gather_splits_refusal,
    peers_ahead,
    peers_behind,
    row_chunks,
)

__all__ = ["SHARD", "GatherPlan", "gather_buffers", "run"]

SHARD = 0
"""Pad word `SHARD + q * parts + j`: part j of rank q's shard has landed in this rank's `a_full`."""


def gather_buffers(ws: int, m_local: int, k: int, dtype: torch.dtype) -> dict:
    """Symmetric buffers of a decomposed all-gather context: the gathered A (this rank's own rows
    unused: its GEMM reads the shard); for FP8, its bytes (uint8) and its row-wise scale `a_scale`
    [M, 1] (this rank's own rows the source of its pushes)."""
    if dtype == FP8:
        return {"a_full": ((ws * m_local, k), torch.uint8), "a_scale": ((ws * m_local, 1), torch.float32)}
    return {"a_full": ((ws * m_local, k), dtype)}


@dataclass(frozen=True)
class GatherPlan:
    """What every call of one (shape, group, splits) needs (its lists made once, on first use: a
    plan is kept for every call of its shape)."""

    rank: int
    world_size: int
    m_local: int
    splits: int = 1

    @cached_property
    def peers_pushed(self) -> list[int]:
        """Peers this rank pushes its shard to, in that order."""
        return peers_ahead(self.rank, self.world_size)

    @cached_property
    def peers_landing(self) -> list[int]:
        """Peers whose shards land here, in the order they land."""
        return peers_behind(self.rank, self.world_size)

    @cached_property
    def parts(self) -> list[tuple[int, int]]:
        """A shard's parts, each pushed and waited for on its own, rows relative to its first."""
        return row_chunks(self.m_local, gather_parts(self.world_size, self.splits))

    @cached_property
    def gemms(self) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
        """(first row, end row, (peer, part) read) of each GEMM over the peers' rows, in order."""
        return gather_gemms(self.world_size, self.rank, self.m_local, self.splits)

    @classmethod
    def of(cls, rank: int, ws: int, m_local: int, splits: int = 1) -> GatherPlan:
        refusal = gather_splits_refusal(ws, splits, m_local)
        if refusal:
            raise ValueError(f"decomposed: {refusal}")
        parts = gather_parts(ws, splits)
        if ws * parts > ARRIVAL_SLOTS:
            raise ValueError(f"decomposed: {ws} ranks x {parts} parts do not fit the signal pad")
        return cls(rank=rank, world_size=ws, m_local=m_local, splits=splits)


def run(
    ctx: OverlapContext,
    plan: GatherPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    captured: bool = False,
    gathered: torch.Tensor | None = None,
    scales: Scales | None = None,
) -> None:
    """Enqueue one call: out [ws * m, N/ws] = all_gather(a) @ b (a: this rank's shard [m, K],
    contiguous; b: [K, N/ws], row-major or K-major).
    `captured`: the call is being captured in a CUDA graph on the caller's stream.
    `gathered` [ws * m, K], contiguous: also filled with all_gather(a), on a stream of its own while
    the GEMMs run (the shard at once, each part of a peer's once it has landed).
    `scales`: FP8 operands' (a_scale, b_scale); `gathered` is not taken with them."""
    main = ctx.current_stream()
    r, ws, m, e = plan.rank, plan.world_size, plan.m_local, ctx.begin_call(main if captured else None)
    r0 = r * m
    row_bytes = a.shape[1] * a.element_size()
    if scales is not None:
        a_scale, b_scale = scales[0], scales[1]
        fast = fast_accumulation(scales)
        b = column_major(b)
        if b_scale.numel() == 1:  # every GEMM below takes row-wise scales: B's widened once a call
            b_scale = b_scale.reshape(1, 1).expand(1, b.shape[1]).contiguous()
        scale_buf = ctx.buffers["a_scale"]
        own_scale = scale_buf.local[r0 : r0 + m]
        own_scale.copy_(a_scale.reshape(-1, 1) if a_scale.numel() > 1 else a_scale.reshape(1, 1).expand(m, 1))

        def gemm(x, rows_scale, y):
            scaled_mm(x, b, rows_scale, b_scale, out=y, fast_accum=fast)

        a_peers = ctx.buffers["a_full"].local.view(FP8)
    else:
        own_scale = scale_buf = None

        def gemm(x, rows_scale, y):
            torch.matmul(x, b, out=y)

        a_peers = ctx.buffers["a_full"].local
    if ws == 1:
        gemm(a, own_scale, out)
        if gathered is not None:
            gathered.copy_(a)
        return
    streams = ctx.fork(main, 2 if gathered is None else 3)
    push, side = streams[:2]
    a_full = ctx.buffers["a_full"]
    parts = plan.parts
    if gathered is not None:
        streamops.copy_async(streams[2].cuda_stream, gathered[r0:].data_ptr(), a.data_ptr(), m * row_bytes)
    announce_entry(push, ctx, e)
    for p in plan.peers_pushed:
        streamops.wait_value(push.cuda_stream, ctx.signal_address(r, ENTERED_BASE + p), e)
        for j, (lo, hi) in enumerate(parts):
            t0 = ctx.stamp(push)
            streamops.copy_async(
                push.cuda_stream,
                a_full.peer_ptrs[p] + (r0 + lo) * row_bytes,
                a[lo:].data_ptr(),
                (hi - lo) * row_bytes,
            )
            if scale_buf is not None:  # the part's scale rows, before its word
                streamops.copy_async(
                    push.cuda_stream,
                    scale_buf.peer_ptrs[p] + (r0 + lo) * 4,
                    own_scale[lo:].data_ptr(),
                    (hi - lo) * 4,
                )
            ctx.span(f"shard to {p}", (p, j), hi - lo, push, t0)
            ctx.write_signal(push, p, SHARD + r * len(parts) + j, e)
    t0 = ctx.stamp(main)
    gemm(a, own_scale, out[r0 : r0 + m])
    ctx.span("own rows", (r, 0), m, main, t0)
    # Enqueued after the own rows' GEMM and the pushes: where streams share a hardware queue, a wait
    # enqueued before them would hold back what the peers wait for.
    landed = {}
    events = iter(ctx.kept_events(plan, len(plan.peers_landing) * len(parts)))
    for q in plan.peers_landing:
        for j in range(len(parts)):
            streamops.wait_value(side.cuda_stream, ctx.signal_address(r, SHARD + q * len(parts) + j), e)
            landed[q, j] = next(events)
            record(landed[q, j], side)
            if gathered is not None:
                lo, hi = parts[j]
                wait(streams[2], landed[q, j])
                streamops.copy_async(
                    streams[2].cuda_stream,
                    gathered[q * m + lo :].data_ptr(),
                    a_full.local[q * m + lo :].data_ptr(),
                    (hi - lo) * row_bytes,
                )
    for lo, hi, read in plan.gemms:
        for piece in read:
            wait(main, landed[piece])
        t0 = ctx.stamp(main)
        gemm(a_peers[lo:hi], None if scale_buf is None else scale_buf.local[lo:hi], out[lo:hi])
        ctx.span("peers' rows", read[0], hi - lo, main, t0)
    ctx.join(main, streams)
