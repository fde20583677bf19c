"""Layer: gloo process groups on the CPU. The NCCL backend's chunking (`nccl_exchange`) moves every
chunk of every plan template to the right rows, raises each arrival once, sends in plan order, and
for a reduce-scatter (the producer adding what it received before it forwards) ends with the
full sum on every owner; an all-reduce (the reduce phase, then every rank taking each reduced block
from its owner, as `NcclBackend.start_scatter` runs them) ends with the full sum everywhere. World
sizes 2, 3, 4 and 8 (configs/llama_tp8.yaml tunes at 8). The backend's warm-up (one exchange with
every peer before a first fused kernel) matches on every rank."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.kernels import backends
from syncopate.kernels.backends import nccl_exchange
from syncopate.kernels.tables import recv_offset, recv_rows
from syncopate.search_space import block_bounds, build_plan


def _gather_worker(rank, ws, init, template, splits, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        rows, k = 24 * ws + 5, 7
        plan = build_plan(template, "all_gather", ws, rows, splits)
        full = torch.arange(rows * k, dtype=torch.float32).reshape(rows, k)
        r0, r1 = block_bounds(rows, ws, rank)
        a_local = full[r0:r1].clone()
        a_full = torch.full((rows, k), float("nan"))
        a_full[r0:r1] = a_local  # forwarding reads own rows from a_full too in the CPU test
        arrivals = []

        def send_view(t):
            if t.block == rank:
                return a_local[t.row_start - r0 : t.row_end - r0]
            assert t.signal >= 0
            assert any(x.chunk == t.chunk for x in arrivals), "forwarded a chunk before it arrived"
            return a_full[t.row_start : t.row_end]

        nccl_exchange(
            plan,
            rank,
            "gather",
            dist.group.WORLD,
            send_view,
            lambda t: a_full[t.row_start : t.row_end],
            lambda t: None,
            arrivals.append,
        )
        ok = torch.equal(a_full, full)
        slots = [t.signal for t in arrivals]
        q.put(
            (
                rank,
                ok,
                slots == sorted(slots) and len(set(slots)) == len(slots) == len(plan.recvs(rank, "gather")),
            )
        )
    finally:
        dist.destroy_process_group()


def _reduce_worker(rank, ws, init, template, splits, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        rows, n = 16 * ws, 5
        plan = build_plan(template, "reduce_scatter", ws, rows, splits)
        partials = [torch.randn(rows, n, generator=torch.Generator().manual_seed(r)) for r in range(ws)]
        mine = partials[rank]
        send = torch.full((rows, n), float("nan"))
        recv = torch.full((recv_rows(plan), n), float("nan"))
        flat = recv.view(-1)
        got = {}
        order = []

        def incoming(t):
            off = recv_offset(plan, t.src, t.block, n) + t.row_start * n
            return flat[off : off + t.rows * n]

        def before_send(t):
            order.append(t)
            # The producer: its own partial plus every partial received for these rows.
            acc = mine[t.row_start : t.row_end].clone()
            for x in got.values():
                if x.chunk == t.chunk:
                    acc += incoming(x).view(t.rows, n)
            send[t.row_start : t.row_end] = acc

        def arrived(t):
            got[(t.chunk, t.src, t.step)] = t

        nccl_exchange(
            plan,
            rank,
            "reduce",
            dist.group.WORLD,
            lambda t: send[t.row_start : t.row_end],
            incoming,
            before_send,
            arrived,
        )
        lo, hi = block_bounds(rows, ws, rank)
        own = mine[lo:hi].clone()
        for t in got.values():
            if t.block == rank:
                own[t.row_start - lo : t.row_end - lo] += incoming(t).view(t.rows, n)
        total = sum(partials)[lo:hi]
        in_order = [(t.step, t.split) for t in order] == sorted((t.step, t.split) for t in order)
        q.put((rank, bool(torch.allclose(own, total, atol=1e-5)), in_order))
    finally:
        dist.destroy_process_group()


def _all_reduce_worker(rank, ws, init, template, splits, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        rows, n = 16 * ws, 3
        plan = build_plan(template, "all_reduce", ws, rows, splits)
        partials = [torch.randn(rows, n, generator=torch.Generator().manual_seed(50 + r)) for r in range(ws)]
        mine = partials[rank]
        send = torch.full((rows, n), float("nan"))
        recv = torch.full((recv_rows(plan), n), float("nan"))
        flat = recv.view(-1)
        got = []

        def incoming(t):
            off = recv_offset(plan, t.src, t.block, n) + t.row_start * n
            return flat[off : off + t.rows * n]

        def before_send(t):
            acc = mine[t.row_start : t.row_end].clone()
            for x in got:
                if x.chunk == t.chunk:
                    acc += incoming(x).view(t.rows, n)
            send[t.row_start : t.row_end] = acc

        nccl_exchange(
            plan,
            rank,
            "reduce",
            dist.group.WORLD,
            lambda t: send[t.row_start : t.row_end],
            incoming,
            before_send,
            got.append,
        )
        lo, hi = block_bounds(rows, ws, rank)
        out = torch.full((rows, n), float("nan"))
        out[lo:hi] = mine[lo:hi]
        for t in got:
            if t.block == rank:
                out[t.row_start : t.row_end] += incoming(t).view(t.rows, n)
        gathered = []
        nccl_exchange(
            plan,
            rank,
            "gather",
            dist.group.WORLD,
            lambda t: out[t.row_start : t.row_end],
            lambda t: out[t.row_start : t.row_end],
            lambda t: None,
            gathered.append,
        )
        from_owners = all(t.src == t.block for t in gathered) and len(gathered) == (ws - 1) * splits
        q.put((rank, bool(torch.allclose(out, sum(partials), atol=1e-5)), from_owners))
    finally:
        dist.destroy_process_group()


CASES = {
    2: [("direct", 3), ("bidirectional_ring", 2)],
    3: [("bidirectional_ring", 2), ("direct", 1)],
    4: [("ring", 2), ("direct", 1), ("ring", 1), ("bidirectional_ring", 2)],
    8: [("ring", 2), ("bidirectional_ring", 2), ("direct", 1)],
}


def _warm_worker(rank, ws, init, template, splits, q):
    """`_warm_nccl` exchanges a word with every peer once per group; a second call does nothing."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        ctx = types.SimpleNamespace(
            group=dist.group.WORLD, rank=rank, world_size=ws, device=torch.device("cpu")
        )
        backends._NCCL_WARM.discard(id(ctx.group))
        backends._warm_nccl(ctx)  # raises if a word did not come from its peer
        warmed = id(ctx.group) in backends._NCCL_WARM
        backends._warm_nccl(ctx)  # no exchange: a mismatched one would hang, and fail the test by its timeout
        q.put((rank, warmed, True))
    finally:
        backends._NCCL_WARM.discard(id(dist.group.WORLD))
        dist.destroy_process_group()


WORKERS = (_gather_worker, _reduce_worker, _all_reduce_worker, _warm_worker)


def _all_cases(rank, ws, init, q):
    """One process group per world size runs every case (spawning is the slow part)."""
    for template, splits in CASES[ws]:
        for i, worker in enumerate(WORKERS):
            worker(rank, ws, init + f"-{i}-{template}-{splits}", template, splits, q)


@pytest.mark.slow
@pytest.mark.parametrize("ws", sorted(CASES))
def test_nccl_chunking_on_gloo(ws):
    results = run_gloo(_all_cases, ws, items=ws * len(WORKERS) * len(CASES[ws]))
    for rank, data_ok, order_ok in results:
        assert data_ok, (
            f"rank {rank}: rows differ (gathered rows, or reduced rows against the sum of partials)"
        )
        assert order_ok, (
            f"rank {rank}: arrivals not raised once each in slot order, chunks not sent in plan order, "
            f"or reduced blocks not taken from their owners"
        )
