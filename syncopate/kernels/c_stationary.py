"""The matmul reduce-scatter with each output block computed where it belongs (`template:
c_stationary`): A's rows and B move, not the partial products.

Rank r's output is sum over q of A_q[r's rows] @ B_q (A_q = q's [M, K/ws] columns of A, B_q its
[K/ws, N] rows of B). Instead of each q sending its partial product of r's rows (M/ws x N), q sends
A_q[r's rows] (M/ws x K/ws) and B_q (K/ws x N) and r computes the term itself: less to move where
K/ws is small beside N and M/ws (gemm_rs 8192x8192x2048 on two ranks: 24 MiB a peer instead of
64), the same arithmetic. B moves in the layout the caller gave it, row-major or the transpose of
a row-major [N, K/ws] (an nn.Linear weight's `weight.t()`, no copy made), the same on every rank
(`received_b`; the ops check it on a shape's first call). The GEMMs are cuBLAS's, on the caller's
stream; only copy-engine copies and stream memory operations go on the side streams. One call,
rank r, its rows [r0, r1):

- side stream 0: announce r's entry into every pad; for each peer p in turn, wait until p has
  entered this call (its previous call has read `a_recv[r]` and `b_recv[r]`), push A_r[p's rows]
  into p's `a_recv[r]` and B_r into p's `b_recv[r]`, and raise p's word `ARRIVED + r`.
- caller's stream: out = A_r[r's rows] @ B_r; then for each peer q (in the order their inputs leave
  for r): wait for q's event, out += a_recv[q] @ b_recv[q] (one rounding of the sum a term, as a
  received partial is rounded once).
- side stream 1 (an all-reduce's side stream 2, before its pulls): for each peer q, wait for
  `ARRIVED + q` and record q's event. An all-reduce on three or more ranks waits for the words on
  the caller's stream instead, before each term.

For the matmul all-reduce (every rank takes the whole sum) the block is then gathered: it is
computed into this rank's symmetric `reduced` block (once every peer has entered the call, so has
pulled the previous one), the last term added in `num_splits` row chunks, and after each chunk
side stream 1 raises every peer's word `GATHER + r * S + j` and copies the chunk into the output;
side stream 2 pulls each peer q's chunk j into the output once `GATHER + q * S + j` says so.

The caller's stream then waits for the side streams. A wait is for an entry, announced first, for
a push, which waits only for an entry, or for a chunk of a block, which waits only for pushes: a
call always ends. Only for copy-engine candidates on one node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from syncopate.kernels import streamops
from syncopate.kernels.backends import announce_entry
from syncopate.kernels.context import OverlapContext, record, wait
from syncopate.kernels.launch import b_is_kmajor
from syncopate.kernels.tables import ARRIVAL_SLOTS, ENTERED_BASE
from syncopate.search_space import block_bounds, peers_ahead, peers_behind, row_chunks

__all__ = [
    "ARRIVED",
    "GATHER",
    "CStationaryPlan",
    "add_product",
    "b_moves_kmajor",
    "c_stationary_buffers",
    "check_b_layout",
    "received_b",
    "run",
]

ARRIVED = 0
"""Pad word `ARRIVED + q`: rank q's rows of A and its B have landed in this rank's buffers."""
GATHER = 256
"""Pad word `GATHER + q * num_splits + j`: chunk j of rank q's reduced block is ready to pull."""


def c_stationary_buffers(
    ws: int, m: int, n: int, k_local: int, dtype: torch.dtype, all_reduce: bool = False
) -> dict:
    """Symmetric buffers of a c_stationary context: every rank's columns of A for this rank's rows,
    every rank's rows of B, and for an all-reduce this rank's reduced block (which the peers pull).
    An all-reduce's M need not divide by `ws`: blocks are `block_bounds`'s, the largest sets the size."""
    rows = -(-m // ws)
    bufs = {"a_recv": ((ws, rows, k_local), dtype), "b_recv": ((ws, k_local, n), dtype)}
    if all_reduce:
        bufs["reduced"] = ((rows, n), dtype)
    return bufs


def b_moves_kmajor(b: torch.Tensor) -> bool:
    """Whether B[K, N] is pushed as the transpose of a row-major [N, K] matrix: B given so (an
    nn.Linear weight's `weight.t()`, `launch.b_is_kmajor`) and not row-major too (one column)."""
    return b_is_kmajor(b) and not b.is_contiguous()


def check_b_layout(b: torch.Tensor, kmajor: bool, template: str) -> None:
    """Refuse a B laid out otherwise than the plan (`kmajor`) reads the peers' B."""
    if b_moves_kmajor(b) != kmajor:
        raise ValueError(
            f"{template}: b with strides {b.stride()} on a plan for a "
            f"{'K-major' if kmajor else 'row-major'} B"
        )


def received_b(slot: torch.Tensor, kmajor: bool) -> torch.Tensor:
    """A peer's B[K, N] as it landed in `slot` (a contiguous [K, N] buffer holding its bytes): as
    is, or for a B pushed K-major, the transpose of the [N, K] matrix those bytes are."""
    k, n = slot.shape
    return slot.view(n, k).t() if kmajor else slot


@dataclass(frozen=True)
class CStationaryPlan:
    """What every call of one (shape, group, candidate) needs."""

    rank: int
    world_size: int
    m: int
    n: int
    k_local: int
    all_reduce: bool = False
    splits: int = 1
    b_kmajor: bool = False
    """Every rank's B is the transpose of a row-major [N, K/ws] matrix (`b_moves_kmajor`)."""

    @property
    def peers_added(self) -> list[int]:
        """Peers whose term this rank adds, in the order their inputs leave for it."""
        return peers_behind(self.rank, self.world_size)

    @property
    def peers_pulled(self) -> list[int]:
        """Peers whose block an all-reduce pulls, in the order they finish it (the last term each
        adds is that of the rank before it)."""
        return peers_ahead(self.rank, self.world_size)

    @classmethod
    def of(
        cls,
        rank: int,
        ws: int,
        m: int,
        n: int,
        k_local: int,
        all_reduce: bool = False,
        splits: int = 1,
        b_kmajor: bool = False,
    ) -> CStationaryPlan:
        if ws > GATHER or GATHER + ws * splits > ARRIVAL_SLOTS:
            raise ValueError(f"c_stationary: {ws} ranks x {splits} chunks do not fit the signal pad")
        return cls(
            rank=rank,
            world_size=ws,
            m=m,
            n=n,
            k_local=k_local,
            all_reduce=all_reduce,
            splits=splits,
            b_kmajor=b_kmajor,
        )


def run(
    ctx: OverlapContext,
    plan: CStationaryPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    captured: bool = False,
) -> None:
    """Enqueue one call: out = this rank's rows [M/ws, N] (all-reduce: all [M, N]) of the sum over
    ranks of a @ b (a: [M, K/ws] contiguous, b: [K/ws, N] in the plan's layout).
    `captured`: the call is being captured in a CUDA graph on the caller's stream."""
    check_b_layout(b, plan.b_kmajor, "c_stationary")
    main = ctx.current_stream()
    r, ws, e = plan.rank, plan.world_size, ctx.begin_call(main if captured else None)
    # pushes; the peers' arrivals (an all-reduce: its chunks out; arrivals, then pulls)
    streams = ctx.fork(main, 3 if plan.all_reduce else 2)
    push = streams[0]
    a_recv, b_recv = ctx.buffers["a_recv"], ctx.buffers["b_recv"]
    a_row_bytes = plan.k_local * a.element_size()
    a_slot = a_recv.local.shape[1] * a_row_bytes
    b_bytes = plan.k_local * plan.n * b.element_size()
    announce_entry(push, ctx, e)
    for d in range(1, ws):  # to r+1 first, which adds r's term first (its `peers_added`)
        p = (r + d) % ws
        p0, p1 = block_bounds(plan.m, ws, p)
        streamops.wait_value(push.cuda_stream, ctx.signal_address(r, ENTERED_BASE + p), e)
        t0 = ctx.stamp(push)
        streamops.copy_async(
            push.cuda_stream, a_recv.peer_ptrs[p] + r * a_slot, a[p0:].data_ptr(), (p1 - p0) * a_row_bytes
        )
        streamops.copy_async(push.cuda_stream, b_recv.peer_ptrs[p] + r * b_bytes, b.data_ptr(), b_bytes)
        ctx.span(f"A rows, B to {p}", (p, 0), p1 - p0, push, t0)
        ctx.write_signal(push, p, ARRIVED + r, e)
    r0, r1 = block_bounds(plan.m, ws, r)
    rows = r1 - r0
    block = out
    if plan.all_reduce:
        block = ctx.buffers["reduced"].local[:rows]
        for p in plan.peers_added:  # every peer has pulled the previous call's block
            streamops.wait_value(main.cuda_stream, ctx.signal_address(r, ENTERED_BASE + p), e)
    t0 = ctx.stamp(main)
    torch.matmul(a[r0 : r0 + rows], b, out=block)
    ctx.span("own term", (r, 0), rows, main, t0)
    peers = plan.peers_added
    # The caller's stream waits for the peers' operands through events a side stream records once
    # they are here: a stream wait on a pad word between two GEMMs holds the caller's stream a few
    # microseconds even where the word is long set, and an event wait does not. Enqueued after the
    # own term (and the pushes): where streams share a hardware queue, a wait enqueued before them
    # would hold them back until the peers' operands are in.
    #
    # An all-reduce on three or more ranks waits on the words on the caller's stream instead: its
    # side stream 2 also makes the pulls, and with the waits there each peer's term started well
    # after its inputs had landed (for a reduce-scatter the place makes no difference, and on two
    # ranks the caller's stream is the slower place).
    # `benchmarks/timeline.py --template c_stationary` shows when each term's inputs were there
    # and when the term ran.
    landed = streams[-1]
    events = iter(ctx.kept_events(plan, len(peers) + (plan.splits if plan.all_reduce else 0)))
    arrived = {}
    waits_on_main = plan.all_reduce and ws > 2
    for q in [] if waits_on_main else peers:
        streamops.wait_value(landed.cuda_stream, ctx.signal_address(r, ARRIVED + q), e)
        arrived[q] = next(events)
        record(arrived[q], landed)

    def wait_for(q: int) -> None:
        if waits_on_main:
            streamops.wait_value(main.cuda_stream, ctx.signal_address(r, ARRIVED + q), e)
        else:
            wait(main, arrived[q])

    for q in peers[:-1] if plan.all_reduce else peers:
        wait_for(q)
        t0 = ctx.stamp(main)
        add_product(block, a_recv.local[q, :rows], received_b(b_recv.local[q], plan.b_kmajor))
        ctx.span(f"term of {q}", (q, 0), rows, main, t0)
    if not plan.all_reduce:
        ctx.join(main, streams)
        return
    ready, pull = streams[1:]
    row_bytes = plan.n * out.element_size()
    if peers:
        wait_for(peers[-1])
    for j, (lo, hi) in enumerate(row_chunks(rows, plan.splits)):
        if peers:
            t0 = ctx.stamp(main)
            add_product(
                block[lo:hi],
                a_recv.local[peers[-1], lo:hi],
                received_b(b_recv.local[peers[-1]], plan.b_kmajor),
            )
            ctx.span(f"term of {peers[-1]}", (peers[-1], j), hi - lo, main, t0)
        done = next(events)
        record(done, main)
        wait(ready, done)
        for p in peers:
            ctx.write_signal(ready, p, GATHER + r * plan.splits + j, e)
        streamops.copy_async(
            ready.cuda_stream, out[r0 + lo :].data_ptr(), block[lo:].data_ptr(), (hi - lo) * row_bytes
        )
    reduced = ctx.buffers["reduced"]
    for q in plan.peers_pulled:
        q0, q1 = block_bounds(plan.m, ws, q)
        for j, (lo, hi) in enumerate(row_chunks(q1 - q0, plan.splits)):
            streamops.wait_value(pull.cuda_stream, ctx.signal_address(r, GATHER + q * plan.splits + j), e)
            t0 = ctx.stamp(pull)
            streamops.copy_async(
                pull.cuda_stream,
                out[q0 + lo :].data_ptr(),
                reduced.peer_ptrs[q] + lo * row_bytes,
                (hi - lo) * row_bytes,
            )
            ctx.span(f"reduced from {q}", (q, j), hi - lo, pull, t0)
    ctx.join(main, streams)


def add_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b on the current stream (cuBLAS, one rounding of the sum)."""
    out.addmm_(a, b)
