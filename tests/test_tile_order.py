"""Layer: pure CPU logic. Tile orders are permutations; consumer orders put the local shard first
and never need a chunk before it arrives; producer orders finish the chunk that leaves first, first."""

from __future__ import annotations

import itertools

import pytest

from syncopate.errors import ConfigError
from syncopate.search_space import CONSUMER_ORDERS, PRODUCER_ORDERS, TEMPLATES, build_plan, consumer_schedule, producer_schedule

CASES = [
    # (world size, total rows, n_cols, block_m, block_n, splits): rows/ws a multiple of block_m or not
    (2, 1024, 512, 128, 128, 1),
    (2, 1024, 512, 128, 256, 4),
    (2, 1000, 384, 64, 128, 2),
    (4, 2048, 256, 128, 64, 2),
    (4, 1500, 256, 128, 128, 3),
    (8, 4096, 256, 128, 128, 2),
]


def _plans(collective):
    for (ws, rows, n_cols, bm, bn, splits), template in itertools.product(CASES, TEMPLATES):
        if template == "bidirectional_ring" and splits < 2:
            continue
        yield build_plan(template, collective, ws, rows, splits, align=bm), n_cols, bm, bn


@pytest.mark.parametrize("order", CONSUMER_ORDERS)
def test_consumer_order_is_a_permutation_of_all_tiles(order):
    for plan, n_cols, bm, bn in _plans("all_gather"):
        for r in range(plan.world_size):
            s = consumer_schedule(plan, r, n_cols, bm, bn, 4, order)
            assert sorted(s.order) == list(range(s.tiles_m * s.tiles_n))


@pytest.mark.parametrize("order", PRODUCER_ORDERS)
def test_producer_order_is_a_permutation_of_all_tiles(order):
    for plan, n_cols, bm, bn in _plans("reduce_scatter"):
        for r in range(plan.world_size):
            s = producer_schedule(plan, r, n_cols, bm, bn, 4, order)
            assert sorted(s.order) == list(range(s.tiles_m * s.tiles_n))


def _needed_arrival(plan, s, rank, tile):
    """Latest arrival position among the chunks the tile reads (-1: only local rows)."""
    arrival = plan.arrival_rank(rank, "gather")
    tm = tile // s.tiles_n
    return max(arrival[c] for c in range(s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm]))


@pytest.mark.parametrize("order", ["arrival", "arrival_colmajor"])
def test_consumer_arrival_orders_put_local_tiles_first_and_follow_arrival(order):
    for plan, n_cols, bm, bn in _plans("all_gather"):
        for r in range(plan.world_size):
            s = consumer_schedule(plan, r, n_cols, bm, bn, 4, order)
            needed = [_needed_arrival(plan, s, r, tile) for tile in s.order]
            assert needed == sorted(needed), "a tile needs a chunk that arrives after a later tile's"
            local = [i for i, a in enumerate(needed) if a == -1]
            assert local == list(range(len(local))), "local tiles come first"
            assert local, "every rank has tiles of its own shard"


def test_consumer_waits_cover_exactly_the_remote_chunks_of_a_tile():
    for plan, n_cols, bm, bn in _plans("all_gather"):
        for r in range(plan.world_size):
            s = consumer_schedule(plan, r, n_cols, bm, bn, 4, "arrival")
            rows = plan.chunk_rows()
            for tm in range(s.tiles_m):
                lo, hi = tm * bm, min((tm + 1) * bm, plan.total_rows)
                chunks = range(s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm])
                assert rows[chunks.start][0] <= lo and rows[chunks.stop - 1][1] >= hi
                for c in chunks:
                    own = plan.chunk_bounds[r][0][0] <= rows[c][0] < plan.chunk_bounds[r][-1][1]
                    assert (len(s.chunk_wait[c]) == 0) == own


@pytest.mark.parametrize("order", ["arrival", "arrival_colmajor"])
def test_producer_arrival_orders_finish_chunks_in_send_order(order):
    """Tiles of rows that only leave come first, then tiles with rows that leave and rows that stay,
    then tiles of rows that never leave; a prefix of the send order made of chunks with no such
    mixed tile is complete after exactly the tiles that overlap it."""
    for plan, n_cols, bm, bn in _plans("reduce_scatter"):
        for r in range(plan.world_size):
            s = producer_schedule(plan, r, n_cols, bm, bn, 4, order)
            chunks_of = {t: range(s.mtile_chunk_lo[t // s.tiles_n], s.mtile_chunk_hi[t // s.tiles_n]) for t in s.order}
            done_at = {}
            for i, tile in enumerate(s.order):
                for c in chunks_of[tile]:
                    done_at[c] = i
            sent = [plan.chunk_index(*t.chunk) for t in plan.sends(r, "reduce")]
            group = [
                0 if set(chunks_of[t]) <= set(sent) else 1 if set(chunks_of[t]) & set(sent) else 2 for t in s.order
            ]
            assert group == sorted(group), (plan.template, plan.world_size, r)
            mixed = {c for t, g in zip(s.order, group) if g == 1 for c in chunks_of[t]}
            for i in range(len(sent)):
                prefix = set(sent[: i + 1])
                if prefix & mixed:
                    break
                needed = sum(1 for t in s.order if prefix & set(chunks_of[t]))
                assert max(done_at[c] for c in prefix) == needed - 1, (plan.template, plan.world_size, r, i)


def test_a_program_blocked_on_partials_holds_no_tile_of_a_leaving_chunk():
    """On two ranks (direct plan), with M/ws not a multiple of BLOCK_M, any persistent grid: a tile
    whose epilogue waits for partials is never followed, in its program, by a tile of rows that
    only leave. (The s=1 case once deadlocked: the boundary tile waited first.)"""
    from syncopate.search_space import build_plan

    for splits, rows, bm in itertools.product([1, 2, 4], [4160, 4096 + 2 * 96], [64, 128]):
        plan = build_plan("direct", "reduce_scatter", 2, rows, splits, align=bm)
        for r in range(2):
            s = producer_schedule(plan, r, 1024, bm, 128, 4, "arrival")
            sent = {plan.chunk_index(*t.chunk) for t in plan.sends(r, "reduce")}
            waits = [any(s.chunk_wait[c] for c in range(s.mtile_chunk_lo[t // s.tiles_n], s.mtile_chunk_hi[t // s.tiles_n]))
                     for t in s.order]
            only_sent = [set(range(s.mtile_chunk_lo[t // s.tiles_n], s.mtile_chunk_hi[t // s.tiles_n])) <= sent
                         for t in s.order]
            for programs in (7, 64, 132):
                for p in range(programs):
                    mine = range(p, len(s.order), programs)
                    blocked = False
                    for i in mine:
                        assert not (blocked and only_sent[i]), (splits, rows, bm, r, programs, p, i)
                        blocked |= waits[i]


def test_producer_counters_and_ready_slots():
    for plan, n_cols, bm, bn in _plans("reduce_scatter"):
        for r in range(plan.world_size):
            s = producer_schedule(plan, r, n_cols, bm, bn, 4, "arrival")
            sends = plan.sends(r, "reduce")
            assert sorted(x for x in s.chunk_ready if x >= 0) == list(range(len(sends)))
            for tm in range(s.tiles_m):
                assert s.mtile_chunk_hi[tm] > s.mtile_chunk_lo[tm]
            assert sum(s.chunk_tiles) >= s.tiles_m * s.tiles_n


def test_group_m_swizzle_walks_groups_down_a_column_block():
    plan = build_plan("direct", "all_gather", 2, 1024, 1, align=128)
    s = consumer_schedule(plan, 0, 512, 128, 128, 2, "swizzle")
    first = [(t // s.tiles_n, t % s.tiles_n) for t in s.order[:4]]
    assert first == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_unknown_order_is_refused():
    plan = build_plan("direct", "all_gather", 2, 1024, 1)
    with pytest.raises(ConfigError, match="unknown tile order 'spiral'"):
        consumer_schedule(plan, 0, 512, 128, 128, 4, "spiral")
