"""Layer: pure Python on the CPU. The `fused` MoE template's tile tables (`syncopate.moe.fused`), made
with array arithmetic, against a tile-by-tile walk of the same rule: every row tile lies in one
expert's rows of one piece, in the plan's piece order, then expert, then row; dispatch tiles name
their expert, A row (the own piece's from the token side), whether they are the own rows, their
rows, the (source, chunk) word they wait for and their first row in h; combine tiles their
destination, its row, their piece's number among the counted pieces, word and entry word. Uniform
and skewed routings with empty experts, 2 and 4 ranks, 1 to 3 chunks a source, both orders, tile
heights that end inside segments."""

from __future__ import annotations

import numpy as np
import pytest

from syncopate.kernels.tables import ENTERED_BASE
from syncopate.moe import draw_routing
from syncopate.moe.fused import combine_tile_table, dispatch_tile_table
from syncopate.moe.plan import build_piece_plan
from syncopate.search_space import RoutingSpec


def _walk(plan, recv_counts, block_m):
    """(piece index, piece, expert, m0, rows, h row) of each tile, one at a time."""
    ws, el = len(recv_counts), len(recv_counts[0])
    side, in_h, pos = {}, {}, 0
    for s in range(ws):
        for e in range(el):
            side[s, e], pos = pos, pos + recv_counts[s][e]
    pos = 0
    for e in range(el):
        for s in range(ws):
            in_h[s, e], pos = pos, pos + recv_counts[s][e]
    for index, piece in enumerate(plan.pieces):
        s, (lo, hi) = piece.source, piece.rows
        for e in range(el):
            start = side[s, e]
            a, b = max(lo, start), min(hi, start + recv_counts[s][e])
            for m0 in range(a, b, block_m):
                yield index, piece, e, m0, min(block_m, b - m0), in_h[s, e] + m0 - start


def _dispatch(plan, recv_counts, block_m):
    out = []
    for _, piece, e, m0, rows, h_row in _walk(plan, recv_counts, block_m):
        if piece.exchange is None:
            out.append((e, piece.token_rows[0] + m0 - piece.rows[0], 1, rows, -1, h_row))
        else:
            out.append((e, m0, 0, rows, piece.source * plan.chunks + piece.chunk, h_row))
    return out


def _combine(plan, recv_counts, block_m):
    table, counted, ids = [], [], {}
    for index, piece, e, m0, rows, h_row in _walk(plan, recv_counts, block_m):
        lo = piece.rows[0]
        if piece.exchange is None:
            table.append((e, h_row, rows, plan.rank, piece.token_rows[0] + m0 - lo, -1, -1, -1))
            continue
        x = plan.exchanges[piece.exchange]
        if index not in ids:
            ids[index] = len(counted)
            counted.append(0)
        counted[ids[index]] += 1
        word = plan.rank * plan.chunks + piece.chunk
        table.append(
            (e, h_row, rows, piece.source, x.send_at + m0 - lo, ids[index], word, ENTERED_BASE + piece.source)
        )
    return table, counted


@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("distribution", ["uniform", "skewed"])
def test_tile_tables_match_a_tile_by_tile_walk(ws, distribution):
    spec = (
        RoutingSpec(distribution=distribution, skew=2.0, seed=ws)
        if distribution == "skewed"
        else RoutingSpec(seed=ws)
    )
    routing = draw_routing(world_size=ws, tokens=48, experts=16, top_k=2, spec=spec)
    counts = routing.counts()
    el = 16 // ws
    empty = 0
    for rank in range(ws):
        recv = counts[:, rank * el : (rank + 1) * el]
        recv_counts = recv.tolist()
        empty += int((recv.sum(0) == 0).sum())
        for kind in ("a2a_gemm", "gemm_a2a"):
            for chunks in (1, 2, 3):
                for order in ("ring", "pairwise"):
                    plan = build_piece_plan(
                        kind,
                        rank=rank,
                        world_size=ws,
                        send_splits=counts[rank].view(ws, el).sum(1).tolist(),
                        recv_counts=recv_counts,
                        chunks=chunks,
                        order=order,
                        counts=counts.tolist(),
                    )
                    for block_m in (1, 4, 16, 64):
                        if kind == "a2a_gemm":
                            got = dispatch_tile_table(plan, recv_counts, block_m)
                            assert got.dtype == np.int32 and got.shape[1] == 6
                            assert [tuple(r) for r in got.tolist()] == _dispatch(plan, recv_counts, block_m)
                        else:
                            got, counted = combine_tile_table(plan, recv_counts, block_m, ENTERED_BASE)
                            want, want_counted = _combine(plan, recv_counts, block_m)
                            assert got.dtype == np.int32 and got.shape[1] == 8
                            assert [tuple(r) for r in got.tolist()] == want and counted == want_counted
    if distribution == "skewed":
        assert empty > 0  # the walk covered experts that receive no row
