"""Layer: pure CPU logic. The pipelined MoE plans' piece tables (`syncopate.moe.plan`): a small plan
written out by hand; on drawn routings, every rank's exchanges matched by its peers', the rows that
land where the peer receives them, the pieces covering the expert side once in the documented
order, and the rows each rank ends up with — moved by the tables of every rank, in Python —
equal to the expert side written as loops."""

from __future__ import annotations

import itertools

import pytest

from syncopate.errors import ConfigError
from syncopate.moe import draw_routing
from syncopate.moe.plan import Exchange, Piece, build_piece_plan, step_peers
from syncopate.search_space import RoutingSpec


def _plans(routing, kind: str, chunks: int, order: str):
    ws = routing.world_size
    counts = routing.counts().tolist()
    plans = []
    for r in range(ws):
        layout = routing.layout(r)
        plans.append(
            build_piece_plan(
                kind,
                rank=r,
                world_size=ws,
                send_splits=layout.send_splits,
                recv_counts=layout.recv_counts.tolist(),
                chunks=chunks,
                order=order,
                counts=counts,
            )
        )
    return plans


def test_a_small_dispatch_plan_written_out():
    # two ranks, two experts each; rank 0 routes 3 pairs to its own experts and 2 to rank 1's,
    # rank 1 routes 1 pair to rank 0's (expert 1) and 4 to its own
    counts = [[2, 1, 1, 1], [0, 1, 3, 1]]
    plan = build_piece_plan(
        "a2a_gemm",
        rank=0,
        world_size=2,
        send_splits=[3, 2],
        recv_counts=[[2, 1], [0, 1]],
        chunks=2,
        order="ring",
        counts=counts,
    )
    assert plan.exchanges == (
        # token side rows [3, 4) and [4, 5) go to rank 1, landing first there (its rows by source);
        # the one row from rank 1 arrives in its second chunk (its first is empty)
        Exchange(step=1, chunk=0, send_peer=1, send_rows=(3, 4), send_at=0, recv_peer=1, recv_rows=(3, 3)),
        Exchange(step=1, chunk=1, send_peer=1, send_rows=(4, 5), send_at=1, recv_peer=1, recv_rows=(3, 4)),
    )
    assert plan.pieces == (
        Piece(source=0, chunk=0, rows=(0, 3), groups=(2, 1), exchange=None, token_rows=(0, 3)),
        Piece(source=1, chunk=1, rows=(3, 4), groups=(0, 1), exchange=1, token_rows=(0, 0)),
    )
    combine = build_piece_plan(
        "gemm_a2a",
        rank=0,
        world_size=2,
        send_splits=[3, 2],
        recv_counts=[[2, 1], [0, 1]],
        chunks=2,
        order="ring",
        counts=counts,
    )
    # rank 0 sends back the row it got from rank 1 (landing in rank 1's token side at row 0: its
    # rows for rank 0 come first), and receives its two rows from rank 1 into its token side
    assert [(x.send_rows, x.send_at, x.recv_rows) for x in combine.exchanges] == [
        ((3, 3), 0, (3, 4)),
        ((3, 4), 0, (4, 5)),
    ]
    assert [p.exchange for p in combine.pieces] == [1, None]  # the own rows last


@pytest.mark.parametrize("order", ["ring", "pairwise"])
def test_each_step_pairs_every_rank_with_one_peer(order):
    for ws in (2, 4, 8):
        for step in range(1, ws):
            sends = [step_peers(r, ws, order, step)[0] for r in range(ws)]
            recvs = [step_peers(r, ws, order, step)[1] for r in range(ws)]
            assert sorted(sends) == list(range(ws)) and sorted(recvs) == list(range(ws))
            for r in range(ws):
                assert sends[r] != r and recvs[sends[r]] == r
                if order == "pairwise":
                    assert sends[r] == recvs[r]
        for r in range(ws):
            assert sorted(step_peers(r, ws, order, s)[0] for s in range(1, ws)) == [
                p for p in range(ws) if p != r
            ]
    assert step_peers(1, 4, "ring", 1) == (2, 0)  # send ahead, receive from behind
    with pytest.raises(ConfigError, match="unknown MoE piece order 'zigzag': accepted are ring, pairwise"):
        step_peers(0, 2, "zigzag", 1)


CASES = [
    # (ws, tokens, experts, top_k, spec)
    (2, 9, 4, 2, RoutingSpec(seed=1)),
    (4, 6, 8, 3, RoutingSpec(distribution="skewed", skew=3.0, seed=2)),
    (4, 2, 16, 1, RoutingSpec(distribution="skewed", skew=4.0, seed=5)),
    (8, 5, 16, 2, RoutingSpec(seed=3)),
    (1, 4, 2, 2, RoutingSpec()),
]


def _expert_side_by_loops(routing, rank: int) -> list[tuple[int, int, int]]:
    """(source, token, slot) of each row rank `rank` receives, by source, then expert, then token."""
    el = routing.experts // routing.world_size
    rows = []
    for s, ids in enumerate(routing.expert_ids):
        for e in range(rank * el, (rank + 1) * el):
            for t, row in enumerate(ids.tolist()):
                if e in row:
                    rows.append((s, t, row.index(e)))
    return rows


def _token_side(routing, rank: int) -> list[tuple[int, int, int]]:
    layout = routing.layout(rank)
    return [(rank, p // layout.top_k, p % layout.top_k) for p in layout.order.tolist()]


@pytest.mark.parametrize("ws, tokens, experts, top_k, spec", CASES)
@pytest.mark.parametrize("chunks", [1, 2, 4])
@pytest.mark.parametrize("order", ["ring", "pairwise"])
def test_tables_move_every_row_to_its_place(ws, tokens, experts, top_k, spec, chunks, order):
    if order == "pairwise" and ws & (ws - 1):
        pytest.skip("pairwise needs a power-of-two world size")
    routing = draw_routing(world_size=ws, tokens=tokens, experts=experts, top_k=top_k, spec=spec)
    layouts = [routing.layout(r) for r in range(ws)]
    for kind in ("a2a_gemm", "gemm_a2a"):
        plans = _plans(routing, kind, chunks, order)
        dispatch = kind == "a2a_gemm"
        # the buffers of every rank: what is sent from and what is received into, with identities
        sent = [_token_side(routing, r) if dispatch else _expert_side_by_loops(routing, r) for r in range(ws)]
        got = [
            [None] * (layouts[r].rows_received if dispatch else layouts[r].tokens * top_k) for r in range(ws)
        ]
        for r, plan in enumerate(plans):
            for x in plan.exchanges:
                # the peer posts the same (step, chunk) receiving as many rows from r; where none
                # move and the peer has nothing else to do then, it posts nothing
                matches = [y for y in plans[x.send_peer].exchanges if (y.step, y.chunk) == (x.step, x.chunk)]
                n = x.send_rows[1] - x.send_rows[0]
                assert len(matches) == 1 or (n == 0 and not matches), (r, x, matches)
                if matches:
                    (match,) = matches
                    assert match.recv_peer == r and match.recv_rows[1] - match.recv_rows[0] == n
                if n:
                    assert x.send_at == match.recv_rows[0]
                    got[x.send_peer][x.send_at : x.send_at + n] = sent[r][x.send_rows[0] : x.send_rows[1]]
            own = [p for p in plan.pieces if p.exchange is None]
            if own:
                (p,) = own
                lo, hi = p.token_rows if dispatch else p.rows
                dst = p.rows if dispatch else p.token_rows
                got[r][dst[0] : dst[1]] = sent[r][lo:hi]
        for r in range(ws):
            expected = _expert_side_by_loops(routing, r) if dispatch else _token_side(routing, r)
            assert got[r] == expected, (kind, r)
        for r, plan in enumerate(plans):
            _check_pieces(plan, layouts[r], routing, r, dispatch)


def _check_pieces(plan, layout, routing, rank, dispatch):
    el = routing.experts // routing.world_size
    expert_of = [
        routing.expert_ids[s][t, k].item() - rank * el for s, t, k in _expert_side_by_loops(routing, rank)
    ]
    covered = sorted(itertools.chain.from_iterable(range(*p.rows) for p in plan.pieces))
    assert covered == list(range(layout.rows_received))
    for p in plan.pieces:
        lo, hi = p.rows
        assert hi > lo and sum(p.groups) == hi - lo
        assert list(p.groups) == [expert_of[lo:hi].count(e) for e in range(el)]
        side = (lambda x: x.recv_rows) if dispatch else (lambda x: x.send_rows)
        if p.exchange is not None:
            x = plan.exchanges[p.exchange]
            assert side(x) == p.rows and (x.recv_peer if dispatch else x.send_peer) == p.source
    exchanges = [p.exchange for p in plan.pieces]
    own = [i for i, e in enumerate(exchanges) if e is None]
    if own:
        assert own == ([0] if dispatch else [len(exchanges) - 1])  # own rows first / last
    others = [e for e in exchanges if e is not None]
    assert others == sorted(others)
    assert [(x.step, x.chunk) for x in plan.exchanges] == sorted((x.step, x.chunk) for x in plan.exchanges)


def test_bad_plan_input_is_refused():
    with pytest.raises(ConfigError, match="unknown MoE kind 'ag_gemm': accepted are a2a_gemm, gemm_a2a"):
        build_piece_plan(
            "ag_gemm", rank=0, world_size=1, send_splits=[1], recv_counts=[[1]], chunks=1, order="ring"
        )
    with pytest.raises(ConfigError, match="1 send splits and 2 rows of receive counts for 2 ranks"):
        build_piece_plan(
            "a2a_gemm", rank=0, world_size=2, send_splits=[1], recv_counts=[[1], [1]], chunks=1, order="ring"
        )


def test_a_row_range_splits_into_its_runs_as_rows_counted_one_by_one():
    import random

    from syncopate.moe.plan import _groups

    rng = random.Random(5)
    for _ in range(300):
        runs = [rng.choice([0, 0, 1, 2, 5, 17]) for _ in range(rng.randint(1, 9))]
        total = sum(runs)
        if not total:
            continue
        owner = [e for e, n in enumerate(runs) for _ in range(n)]  # the run of each row
        ends = list(itertools.accumulate(runs))
        lo = rng.randrange(total)
        hi = rng.randint(lo + 1, total)
        expected = tuple(sum(1 for row in range(lo, hi) if owner[row] == e) for e in range(len(runs)))
        assert _groups(runs, ends, lo, hi) == expected, (runs, lo, hi)
