"""Layer: pure Python on the CPU. The `fused` MoE template's tile tables (`syncopate.moe.fused`), made
with array arithmetic, against a tile-by-tile walk of the same rule: each expert's rows in h are cut
per group of sources (every peer alone, the own rows with the neighbour whose rows move first);
dispatch tiles start at the own rows' outer edge, name their expert, A rows of both parts (the own
rows' from the token side), the split, their rows, the (source, chunk) word of their last peer row
and their first row in h, and come in the order of that word's exchange; combine tiles also cut
where a peer's piece starts, name both parts' destinations and rows, their piece's number among
the counted pieces, word, entry word and the piece's rank. Uniform and skewed routings with empty
experts, 2 and 4 ranks, 1 to 3 chunks a source, both orders, tile heights that end inside
segments."""

from __future__ import annotations

import numpy as np
import pytest

from syncopate.kernels.tables import ENTERED_BASE
from syncopate.moe import draw_routing
from syncopate.moe.fused import combine_tile_table, dispatch_tile_table
from syncopate.moe.plan import build_piece_plan
from syncopate.search_space import RoutingSpec


def _walk(plan, recv_counts, by_piece: bool):
    """(group, expert, rows) of each group of sources (every peer alone, the own rows with the
    neighbour in h whose rows move first), one at a time; rows are (source, expert-side row, h
    row, piece) in h order, and with `by_piece` a peer row that starts a piece inside an expert's
    rows is marked as a cut."""
    ws, el, r = len(recv_counts), len(recv_counts[0]), plan.rank
    dispatch = plan.kind == "a2a_gemm"
    side, in_h, pos = {}, {}, 0
    for s in range(ws):
        for e in range(el):
            side[s, e], pos = pos, pos + recv_counts[s][e]
    pos = 0
    for e in range(el):
        for s in range(ws):
            in_h[s, e], pos = pos, pos + recv_counts[s][e]
    moves = {}
    for i, x in enumerate(plan.exchanges):
        peer = x.recv_peer if dispatch else x.send_peer
        if (x.receives if dispatch else x.sends) and peer not in moves:
            moves[peer] = i
    partner = None
    for s in (r - 1, r + 1):
        if 0 <= s < ws and (partner is None or moves.get(s, 99) < moves.get(partner, 99)):
            partner = s
    groups = [[s] for s in range(ws) if s not in (r, partner)]
    groups.append([r] if partner is None else sorted([r, partner]))
    for sources in groups:
        for e in range(el):
            rows = []
            for s in sources:
                for i in range(recv_counts[s][e]):
                    m = side[s, e] + i
                    piece = next(p for p in plan.pieces if p.source == s and p.rows[0] <= m < p.rows[1])
                    cut = by_piece and s != r and i > 0 and m == piece.rows[0]
                    rows.append((s, m, in_h[s, e] + i, piece, cut))
            yield sources, e, rows


def _cuts(n, block_m, from_end=False, forced=()):
    """Tile starts cutting n rows every block_m rows from the start (or the end), and at `forced`."""
    starts = sorted(set(forced) | {0})
    out = []
    for a, b in zip(starts, starts[1:] + [n]):
        if from_end:
            out += sorted({max(a, c) for c in range(b - block_m, a - block_m, -block_m)})
        else:
            out += list(range(a, b, block_m))
    return [(c, next((d for d in out if d > c), n)) for c in out]


def _dispatch(plan, recv_counts, block_m):
    """The dispatch tiles, one at a time: tiles start at the own rows' outer edge; each waits for
    the piece of its last peer row."""
    r = plan.rank
    own = next(p for p in plan.pieces if p.exchange is None)
    out = []
    for sources, e, rows in _walk(plan, recv_counts, by_piece=False):
        from_end = len(sources) == 2 and sources[1] == r
        for c0, c1 in _cuts(len(rows), block_m, from_end):
            tile = rows[c0:c1]
            a = [m + own.token_rows[0] - own.rows[0] if s == r else m for s, m, *_ in tile]
            split = next((i for i, row in enumerate(tile) if row[0] != tile[0][0]), len(tile))
            second = a[split] if split < len(tile) else a[0]
            word = key = -1
            peer_rows = [row for row in tile if row[0] != r]
            if peer_rows:
                s, piece = peer_rows[-1][0], peer_rows[-1][3]
                word, key = s * plan.chunks + piece.chunk, piece.exchange
            row = (e, a[0], int(tile[0][0] == r), len(tile), word, tile[0][2], split, second)
            out.append((key, row))
    return [row for _, row in sorted(out, key=lambda kr: kr[0])]


def _combine(plan, recv_counts, block_m):
    """The combine tiles, one at a time: tiles from each group's start and at every piece start
    inside an expert's rows; own rows to the token side, a peer's where its piece lands."""
    r = plan.rank
    own = next((p for p in plan.pieces if p.exchange is None), None)
    out = []
    for _, e, rows in _walk(plan, recv_counts, by_piece=True):
        forced = [i for i, row in enumerate(rows) if row[4]]
        for c0, c1 in _cuts(len(rows), block_m, forced=forced):
            tile = rows[c0:c1]
            dests = []
            for s, m, _, piece, _ in tile:
                if s == r:
                    dests.append(own.token_rows[0] + m - own.rows[0])
                else:
                    dests.append(plan.exchanges[piece.exchange].send_at + m - piece.rows[0])
            split = next((i for i, row in enumerate(tile) if row[0] != tile[0][0]), len(tile))
            peer_rows = [row for row in tile if row[0] != r]
            assert len({row[3].exchange for row in peer_rows}) <= 1
            piece = peer_rows[0][3] if peer_rows else None
            peer = peer_rows[0][0] if peer_rows else -1
            key = piece.exchange if piece else len(plan.exchanges)
            second = (tile[split][0], dests[split]) if split < len(tile) else (tile[0][0], dests[0])
            row = [e, tile[0][2], len(tile), tile[0][0], dests[0], piece, -1, -1, split, *second, peer]
            if piece is not None:
                row[6], row[7] = r * plan.chunks + piece.chunk, ENTERED_BASE + peer
            out.append((key, row))
    out.sort(key=lambda kr: kr[0])
    ids, counted = {}, []
    for _, row in out:
        piece = row[5]
        if piece is not None:
            if piece.exchange not in ids:
                ids[piece.exchange] = len(counted)
                counted.append(0)
            counted[ids[piece.exchange]] += 1
            row[5] = ids[piece.exchange]
        else:
            row[5] = -1
    return [tuple(row) for _, row in out], counted


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
                            assert got.dtype == np.int32 and got.shape[1] == 12
                            assert [tuple(r) for r in got.tolist()] == want and counted == want_counted
    if distribution == "skewed":
        assert empty > 0  # the walk covered experts that receive no row
