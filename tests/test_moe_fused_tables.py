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
    """The dispatch tiles, one at a time: each expert's rows in h cut into tiles within groups of
    sources (every peer alone, the own rows with the neighbour in h that arrives first), from the
    own rows' outer edge; each tile waits for the piece of its last peer row."""
    ws, el, r = len(recv_counts), len(recv_counts[0]), plan.rank
    side, in_h, pos = {}, {}, 0
    for s in range(ws):
        for e in range(el):
            side[s, e], pos = pos, pos + recv_counts[s][e]
    pos = 0
    for e in range(el):
        for s in range(ws):
            in_h[s, e], pos = pos, pos + recv_counts[s][e]
    arrives = {}
    for i, x in enumerate(plan.exchanges):
        if x.receives and x.recv_peer not in arrives:
            arrives[x.recv_peer] = i
    partner = None
    for s in (r - 1, r + 1):
        if 0 <= s < ws and (partner is None or arrives.get(s, 99) < arrives.get(partner, 99)):
            partner = s
    own = next(p for p in plan.pieces if p.exchange is None)
    groups = [[s] for s in range(ws) if s not in (r, partner)]
    groups.append([r] if partner is None else sorted([r, partner]))
    out = []
    for sources in groups:
        for e in range(el):
            rows = []  # (source, A row, expert-side row, h row) of each row in h order
            for s in sources:
                for i in range(recv_counts[s][e]):
                    m = side[s, e] + i
                    a = m + own.token_rows[0] - own.rows[0] if s == r else m
                    rows.append((s, a, m, in_h[s, e] + i))
            cuts = list(range(0, len(rows), block_m))
            if sources[-1] == r and len(sources) == 2:  # from the end
                cuts = sorted({max(0, n) for n in range(len(rows) - block_m, -block_m, -block_m)})
            for c0 in cuts:
                c1 = next((c for c in cuts if c > c0), len(rows))
                tile = rows[c0:c1]
                split = next((i for i, row in enumerate(tile) if row[0] != tile[0][0]), len(tile))
                second = tile[split][1] if split < len(tile) else tile[0][1]
                word = key = -1
                peer_rows = [row for row in tile if row[0] != r]
                if peer_rows:
                    s, m = peer_rows[-1][0], peer_rows[-1][2]
                    piece = next(p for p in plan.pieces if p.source == s and p.rows[0] <= m < p.rows[1])
                    word, key = s * plan.chunks + piece.chunk, piece.exchange
                row = (e, tile[0][1], int(tile[0][0] == r), len(tile), word, tile[0][3], split, second)
                out.append((key, row))
    return [row for _, row in sorted(out, key=lambda kr: kr[0])]


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
                            assert got.dtype == np.int32 and got.shape[1] == 8
                            assert [tuple(r) for r in got.tolist()] == _dispatch(plan, recv_counts, block_m)
                        else:
                            got, counted = combine_tile_table(plan, recv_counts, block_m, ENTERED_BASE)
                            want, want_counted = _combine(plan, recv_counts, block_m)
                            assert got.dtype == np.int32 and got.shape[1] == 8
                            assert [tuple(r) for r in got.tolist()] == want and counted == want_counted
    if distribution == "skewed":
        assert empty > 0  # the walk covered experts that receive no row
