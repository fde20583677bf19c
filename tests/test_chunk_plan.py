"""Layer: pure CPU logic. Properties of every chunk-plan template over world sizes 2…16 and
num_splits 1…8: coverage, send/receive agreement, causality, unique signal slots, and for the
reduce phases that every contribution is summed exactly once."""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict

import pytest

from syncopate.errors import ConfigError
from syncopate.search_space import TEMPLATES, build_plan

WORLD_SIZES = range(2, 17)
SPLITS = range(1, 9)


@functools.cache
def _plans(collective):
    plans = []
    for template, ws, n in itertools.product(TEMPLATES, WORLD_SIZES, SPLITS):
        if template == "bidirectional_ring" and n < 2:
            continue
        rows = ws * 131  # blocks of 131 rows: not a multiple of anything handy
        plans.append(build_plan(template, collective, ws, rows, n))
    return plans


@pytest.mark.parametrize("collective", ["all_gather", "all_reduce"])
def test_every_row_arrives_exactly_once_on_every_rank(collective):
    for plan in _plans(collective):
        for r in range(plan.world_size):
            own = (plan.chunk_bounds[r][0][0], plan.chunk_bounds[r][-1][1])
            spans = sorted([(t.row_start, t.row_end) for t in plan.recvs(r, "gather")] + [own])
            # Sorted spans that start where the previous one ended cover [0, M) once, without overlap.
            assert spans[0][0] == 0 and spans[-1][1] == plan.total_rows
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), (
                plan.template,
                plan.world_size,
                r,
            )
            assert all(lo < hi for lo, hi in spans)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_what_a_rank_sends_at_a_step_is_what_its_peer_receives(collective):
    for plan in _plans(collective):
        sent, received = defaultdict(set), defaultdict(set)
        for r in range(plan.world_size):
            for t in plan.sends(r):
                sent[(r, t.step)].add((t.dst, t.phase, t.chunk, t.row_start, t.row_end))
                assert t.dst != r
            for t in plan.recvs(r):
                received[(t.src, t.step)].add((r, t.phase, t.chunk, t.row_start, t.row_end))
        assert sent == received
        assert len(sent) == plan.world_size * plan.num_steps


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_signal_slots_are_unique_and_dense_per_rank(collective):
    for plan in _plans(collective):
        for r in range(plan.world_size):
            slots = [t.signal for t in plan.recvs(r)]
            assert sorted(slots) == list(range(len(slots)))
            assert slots == sorted(slots), "recvs come in slot (arrival) order"


def test_gather_is_causal_a_rank_forwards_only_what_it_holds():
    for plan in _plans("all_gather"):
        held_since = {(r, (r, j)): 0 for r in range(plan.world_size) for j in range(plan.num_splits)}
        for t in sorted(plan.transfers, key=lambda t: t.step):
            assert held_since.get((t.src, t.chunk), 10**9) < t.step, (plan.template, t)
            held_since.setdefault((t.dst, t.chunk), t.step)


def _simulate_reduce(plan):
    """Contributions held per (rank, chunk) after the reduce phase, checking no partial is added twice."""
    held = {(r, c): {r} for r in range(plan.world_size) for c in range(plan.num_chunks)}
    by_step = defaultdict(list)
    for t in plan.transfers:
        if t.phase == "reduce":
            by_step[t.step].append(t)
    for step in sorted(by_step):
        payloads = [(t, frozenset(held[(t.src, plan.chunk_index(*t.chunk))])) for t in by_step[step]]
        for t, payload in payloads:
            key = (t.dst, plan.chunk_index(*t.chunk))
            assert not held[key] & payload, f"partial added twice: {plan.template} ws={plan.world_size} {t}"
            held[key] |= payload
    return held


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce"])
def test_every_contribution_is_summed_exactly_once_at_the_owner(collective):
    for plan in _plans(collective):
        held = _simulate_reduce(plan)
        everyone = set(range(plan.world_size))
        for b in range(plan.world_size):
            for j in range(plan.num_splits):
                assert held[(b, plan.chunk_index(b, j))] == everyone, (plan.template, plan.world_size, b, j)


def test_all_reduce_gathers_only_fully_reduced_chunks():
    for plan in _plans("all_reduce"):
        complete = {
            (b, plan.chunk_index(b, j)) for b in range(plan.world_size) for j in range(plan.num_splits)
        }
        last_reduce = max(t.step for t in plan.transfers if t.phase == "reduce")
        for t in sorted((t for t in plan.transfers if t.phase == "gather"), key=lambda t: t.step):
            assert t.step > last_reduce
            assert (t.src, plan.chunk_index(*t.chunk)) in complete
            complete.add((t.dst, plan.chunk_index(*t.chunk)))
        assert len(complete) == plan.world_size * plan.num_chunks


def test_templates_differ_in_who_sends():
    direct = build_plan("direct", "all_gather", 4, 64, 1)
    ring = build_plan("ring", "all_gather", 4, 64, 1)
    assert {t.src for t in direct.recvs(0)} == {1, 2, 3}
    assert {t.src for t in ring.recvs(0)} == {3}
    bidir = build_plan("bidirectional_ring", "all_gather", 4, 64, 2)
    assert {t.src for t in bidir.recvs(0)} == {1, 3}
    assert bidir.num_streams == 2


def test_chunks_align_to_block_m_when_asked():
    plan = build_plan("direct", "all_gather", 2, 8192, 8, align=128)
    for lo, _ in plan.chunk_rows():
        assert lo % 128 == 0
    assert plan.chunk_rows()[-1][1] == 8192


@pytest.mark.parametrize(
    "args, message",
    [
        (("diagonal", "all_gather", 2, 64, 1), "unknown plan template 'diagonal'"),
        (("direct", "broadcast", 2, 64, 1), "unknown collective 'broadcast'"),
        (("bidirectional_ring", "all_gather", 2, 64, 1), "needs num_splits >= 2"),
        (("direct", "all_gather", 2, 8, 8), "num_splits=8 is too many"),
        (("direct", "all_gather", 2, 64, 0), "num_splits=0 must be at least 1"),
    ],
)
def test_bad_plans_are_refused_with_the_value_named(args, message):
    with pytest.raises(ConfigError, match=message):
        build_plan(*args)
