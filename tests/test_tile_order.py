"""Layer: pure CPU logic. Consumer orders are permutations of the tiles, put the local shard first
and never need a chunk before it arrives; a producer order finishes every (tile, chunk) pair once,
the chunk that leaves first, first."""

from __future__ import annotations

import itertools

import pytest

from syncopate.errors import ConfigError
from syncopate.search_space import (
    CONSUMER_ORDERS,
    PRODUCER_ORDERS,
    TEMPLATES,
    build_plan,
    consumer_schedule,
    producer_schedule,
)

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
def test_producer_entries_finish_every_rows_of_every_tile_once(order):
    """Each (tile, chunk its rows overlap) pair is one entry; a tile with rows of two chunks is two
    entries, and every rank has as many entries (the kernels' grids and the cost model rely on it)."""
    for plan, n_cols, bm, bn in _plans("reduce_scatter"):
        if order == "kept_interleaved" and plan.template != "direct":
            continue
        lengths = set()
        for r in range(plan.world_size):
            s = producer_schedule(plan, r, n_cols, bm, bn, 4, order)
            pairs = sorted(zip(s.order, s.entry_chunk, strict=True))
            expected = [
                (tm * s.tiles_n + tn, c)
                for tm in range(s.tiles_m)
                for tn in range(s.tiles_n)
                for c in range(s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm])
            ]
            assert pairs == expected
            lengths.add(len(s.order))
        assert len(lengths) == 1


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
    """Entries come chunk by chunk: the chunks this rank sends in send order, then the chunks it
    keeps in the order their last partial arrives; so a prefix of the send order is complete after
    exactly the entries of its chunks."""
    for plan, n_cols, bm, bn in _plans("reduce_scatter"):
        for r in range(plan.world_size):
            s = producer_schedule(plan, r, n_cols, bm, bn, 4, order)
            sent = [plan.chunk_index(*t.chunk) for t in plan.sends(r, "reduce")]
            arrival = plan.arrival_rank(r, "reduce")
            kept = sorted((c for c in range(plan.num_chunks) if c not in sent), key=arrival.__getitem__)
            runs = [c for i, c in enumerate(s.entry_chunk) if i == 0 or s.entry_chunk[i - 1] != c]
            assert runs == sent + kept, (plan.template, plan.world_size, r)
            for i in range(len(sent)):
                assert set(s.entry_chunk[: sum(s.chunk_tiles[c] for c in sent[: i + 1])]) == set(
                    sent[: i + 1]
                )


def test_a_program_blocked_on_partials_holds_no_entry_of_a_leaving_chunk():
    """On two ranks (direct plan), with M/ws not a multiple of BLOCK_M, any persistent grid: an entry
    that waits for partials is never followed, in its program, by an entry of rows that leave, and a
    tile with rows of both is two entries. (The s=1 case once deadlocked: the boundary tile waited
    for partials before its leaving rows were counted, then, fixed that way, still did whenever a
    program held two such tiles.) tests/test_liveness.py checks every template and grid."""
    for splits, rows, bm in itertools.product([1, 2, 4], [4160, 4096 + 2 * 96], [64, 128]):
        plan = build_plan("direct", "reduce_scatter", 2, rows, splits, align=bm)
        for r in range(2):
            s = producer_schedule(plan, r, 1024, bm, 128, 4, "arrival")
            sent = {plan.chunk_index(*t.chunk) for t in plan.sends(r, "reduce")}
            waits = [bool(s.chunk_wait[c]) for c in s.entry_chunk]
            leaves = [c in sent for c in s.entry_chunk]
            for programs in (1, 7, 64, 132):
                for p in range(programs):
                    blocked = False
                    for i in range(p, len(s.order), programs):
                        assert not (blocked and leaves[i]), (splits, rows, bm, r, programs, p, i)
                        blocked |= waits[i]


def test_kept_interleaved_moves_each_kept_chunk_up_one_split_after_its_partial_leaves_the_peer():
    plan = build_plan("direct", "reduce_scatter", 2, 1024, 4, align=128)
    for r in range(2):
        s = producer_schedule(plan, r, 128, 128, 128, 1, "kept_interleaved")
        chunks = list(dict.fromkeys(s.entry_chunk))
        own = [r * 4 + j for j in range(4)]
        sent = [(1 - r) * 4 + j for j in range(4)]
        assert chunks == [sent[0], sent[1], own[0], sent[2], own[1], sent[3], own[2], own[3]]
    with pytest.raises(ConfigError, match="needs the direct plan"):
        producer_schedule(
            build_plan("ring", "reduce_scatter", 4, 1024, 2, align=128),
            0,
            128,
            128,
            128,
            1,
            "kept_interleaved",
        )


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
