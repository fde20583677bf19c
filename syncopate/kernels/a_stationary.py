"""The all-gather matmul with A left in place (`template: a_stationary`): B and the products move.

Rank r's output is all_gather(A) @ B_r, whose rows of peer p are A_p @ B_r. Instead of bringing
A_p (M/ws x K) to r, p receives B_r (K x N/ws) and sends back A_p @ B_r (M/ws x N/ws): less to move
where N/ws is small beside M/ws (ag_gemm with N=2048 on two ranks: 24 MiB a peer instead of 64).
B moves in the layout the caller gave it, row-major or an nn.Linear weight's `weight.t()` (no copy
made), the same on every rank (`c_stationary.received_b`; the ops check it on a shape's first call).
The GEMMs are cuBLAS's, on the caller's stream; only copy-engine copies and stream memory
operations go on the side streams. One call, rank r, its own rows [r0, r1):

- side stream 0: for each peer p in turn, push B_r into p's `b_recv[r]` and raise p's word
  `B_WORD + r`.
- caller's stream: out[r0 : r0 + h] = A_r[:h] @ B_r (the first half of the own rows, while B
  arrives); then for each peer p (in the order their B leave for r): wait for `B_WORD + p`,
  compute c_send[p] = A_r @ b_recv[p] in `num_splits` row chunks, an event after each; then the
  second half of the own rows.
- side stream 1: after chunk j of c_send[p] is computed, raise p's word `C_WORD + r * S + j`.
- side stream 2: for each peer q, chunk j: wait for `C_WORD + q * S + j` here, pull q's
  `c_send[r]` rows of chunk j into out[q's rows].

The caller's stream then waits for the side streams. A wait is for a push or a product, and a
product waits only for a push, which waits for nothing: a call always ends. Nothing waits for a
peer to enter the call, and still no call overwrites what a peer reads: r's next call starts once
r has pulled every product made for it in this one, and p made r's product from `b_recv[r]`, so
r's next push there comes after p's last read; r's next product for q goes into `c_send[q]` once
r has q's next B, which q pushes only after pulling this call's products, `c_send[q]` among them.
Only for copy-engine candidates on one node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from syncopate.kernels import streamops
from syncopate.kernels.c_stationary import check_b_layout, received_b
from syncopate.kernels.context import OverlapContext, record, wait
from syncopate.kernels.tables import ARRIVAL_SLOTS
from syncopate.search_space import Candidate, block_bounds, peers_ahead, peers_behind, row_chunks

__all__ = ["B_WORD", "C_WORD", "AStationaryPlan", "a_stationary_buffers", "run"]

B_WORD = 0
"""Pad word `B_WORD + q`: rank q's B shard has landed in this rank's `b_recv[q]`."""
C_WORD = 256
"""Pad word `C_WORD + q * num_splits + j`: chunk j of rank q's product for this rank is ready to pull."""


def a_stationary_buffers(ws: int, m_local: int, n_local: int, k: int, dtype: torch.dtype) -> dict:
    """Symmetric buffers of an a_stationary context: every rank's B shard, and this rank's product
    for every peer (slot p: A_r @ B_p, which p pulls)."""
    return {"b_recv": ((ws, k, n_local), dtype), "c_send": ((ws, m_local, n_local), dtype)}


@dataclass(frozen=True)
class AStationaryPlan:
    """What every call of one (shape, group, candidate) needs."""

    rank: int
    world_size: int
    m_local: int
    n_local: int
    k: int
    splits: int
    b_kmajor: bool = False
    """Every rank's B is the transpose of a row-major [N/ws, K] matrix (`c_stationary.b_moves_kmajor`)."""

    @property
    def peers_computed(self) -> list[int]:
        """Peers whose product this rank computes, in the order their B shards leave for it."""
        return peers_behind(self.rank, self.world_size)

    @property
    def peers_pulled(self) -> list[int]:
        """Peers whose product for this rank it pulls, in the order they compute them."""
        return peers_ahead(self.rank, self.world_size)

    @classmethod
    def of(
        cls, c: Candidate, rank: int, ws: int, m_local: int, n_local: int, k: int, b_kmajor: bool = False
    ) -> AStationaryPlan:
        if C_WORD + ws * c.num_splits > ARRIVAL_SLOTS or ws > C_WORD:
            raise ValueError(f"a_stationary: {ws} ranks x {c.num_splits} chunks do not fit the signal pad")
        return cls(
            rank=rank,
            world_size=ws,
            m_local=m_local,
            n_local=n_local,
            k=k,
            splits=c.num_splits,
            b_kmajor=b_kmajor,
        )


def run(
    ctx: OverlapContext,
    plan: AStationaryPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    captured: bool = False,
) -> None:
    """Enqueue one call: out[M, N/ws] = all_gather(a) @ b (a: this rank's [M/ws, K] rows, contiguous;
    b in the plan's layout). `captured`: the call is being captured in a CUDA graph on the caller's stream."""
    check_b_layout(b, plan.b_kmajor, "a_stationary")
    main = ctx.current_stream()
    r, ws, e = plan.rank, plan.world_size, ctx.begin_call(main if captured else None)
    streams = ctx.fork(main, 3)
    b_recv, c_send = ctx.buffers["b_recv"], ctx.buffers["c_send"]
    b_bytes = plan.k * plan.n_local * b.element_size()
    row_bytes = plan.n_local * out.element_size()
    push = streams[0]
    for d in range(1, ws):  # to r+1 first, which computes r's product first (its `peers_computed`)
        p = (r + d) % ws
        t0 = ctx.stamp(push)
        streamops.copy_async(push.cuda_stream, b_recv.peer_ptrs[p] + r * b_bytes, b.data_ptr(), b_bytes)
        ctx.span(f"B to {p}", (p, 0), plan.k, push, t0)
        ctx.write_signal(push, p, B_WORD + r, e)
    r0 = block_bounds(plan.m_local * ws, ws, r)[0]
    half = plan.m_local // 2
    t0 = ctx.stamp(main)
    torch.matmul(a[:half], b, out=out[r0 : r0 + half])
    ctx.span("own rows, first half", (r, 0), half, main, t0)
    ready = streams[1]
    events = iter(ctx.kept_events(plan, (ws - 1) * plan.splits))
    for p in plan.peers_computed:
        streamops.wait_value(main.cuda_stream, ctx.signal_address(r, B_WORD + p), e)
        for j, (lo, hi) in enumerate(row_chunks(plan.m_local, plan.splits)):
            t0 = ctx.stamp(main)
            torch.matmul(a[lo:hi], received_b(b_recv.local[p], plan.b_kmajor), out=c_send.local[p, lo:hi])
            ctx.span(f"product for {p}", (p, j), hi - lo, main, t0)
            done = next(events)
            record(done, main)
            wait(ready, done)
            ctx.write_signal(ready, p, C_WORD + r * plan.splits + j, e)
    t0 = ctx.stamp(main)
    torch.matmul(a[half:], b, out=out[r0 + half : r0 + plan.m_local])
    ctx.span("own rows, second half", (r, 1), plan.m_local - half, main, t0)
    pull = streams[2]
    slot_bytes = plan.m_local * row_bytes
    for q in plan.peers_pulled:
        q0 = block_bounds(plan.m_local * ws, ws, q)[0]
        for j, (lo, hi) in enumerate(row_chunks(plan.m_local, plan.splits)):
            streamops.wait_value(pull.cuda_stream, ctx.signal_address(r, C_WORD + q * plan.splits + j), e)
            src = c_send.peer_ptrs[q] + r * slot_bytes + lo * row_bytes
            t0 = ctx.stamp(pull)
            streamops.copy_async(pull.cuda_stream, out[q0 + lo :].data_ptr(), src, (hi - lo) * row_bytes)
            ctx.span(f"products from {q}", (q, j), hi - lo, pull, t0)
    ctx.join(main, streams)
