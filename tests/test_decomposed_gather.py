"""The all-gather matmul cut into cuBLAS GEMMs over the shards as they land (template `decomposed`
for ag_gemm, `syncopate/kernels/decomposed_gather.py`): every rank's enqueued work played on the
CPU by the executor of tests/test_stationary.py, streams in random orders, calls back to back with
fresh inputs; the GEMMs' row pieces; the space, the refusals and the cost model."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels import decomposed_gather
from syncopate.search_space import (
    DECOMPOSED,
    SpaceOptions,
    Topology,
    Workload,
    check_candidate,
    check_liveness,
    decomposed_candidate,
    gather_gemms,
    gather_parts,
    gather_splits_refusal,
    space,
)
from tests.test_stationary import world  # noqa: F401 - the executor, as a fixture

SEEDS = 4
TWO = Topology.from_key("H200x2-nvlink")
FOUR = Topology.from_key("H200x4-nvswitch")


def _world(world, ws, m_local, k, splits):  # noqa: F811
    return world(
        ws,
        decomposed_gather.gather_buffers(ws, m_local, k, torch.float32),
        lambda r: decomposed_gather.GatherPlan.of(r, ws, m_local, splits),
        decomposed_gather,
    )


@pytest.mark.parametrize(
    "ws, m_local, splits, kmajor",
    [
        (1, 16, 1, False),
        (2, 16, 1, False),
        (2, 16, 3, True),
        (3, 13, 1, False),
        (3, 13, 2, False),
        (3, 13, 4, True),
        (4, 12, 1, False),
        (4, 12, 2, True),
        (4, 12, 3, False),
        (4, 12, 6, False),
        (8, 8, 1, False),
        (8, 8, 4, False),
        (8, 8, 7, True),
    ],
)
def test_every_call_computes_all_gather_a_times_its_b(world, ws, m_local, splits, kmajor):  # noqa: F811
    """Three calls back to back, fresh inputs each, every stream played in random orders (odd seeds:
    a rank's streams on one hardware queue): each call's output is all_gather(A) @ B_r on every
    rank, so no call read a row before it landed or after the next call's push overwrote it."""
    n_local, k = 24, 40
    for seed in range(SEEDS):
        w = _world(world, ws, m_local, k, splits)
        calls = []
        for call in range(3):
            gen = torch.Generator().manual_seed(1000 * seed + call)
            a = [torch.randn(m_local, k, generator=gen) for _ in range(ws)]
            b = [
                torch.randn(n_local, k, generator=gen).t()
                if kmajor
                else torch.randn(k, n_local, generator=gen)
                for _ in range(ws)
            ]
            outs = [torch.full((m_local * ws, n_local), float("nan")) for _ in range(ws)]
            for r in range(ws):
                w.enqueue(r, a[r], b[r], outs[r])
            calls.append((a, b, outs))
        w.play(seed, one_queue=seed % 2 == 1)
        for call, (a, b, outs) in enumerate(calls):
            full = torch.cat(a)
            for r in range(ws):
                assert torch.allclose(outs[r], full @ b[r], atol=1e-4), f"seed {seed}, call {call}, rank {r}"


@pytest.mark.parametrize("ws, m_local, splits", [(1, 16, 1), (2, 16, 2), (3, 13, 1), (4, 12, 6)])
def test_the_gathered_a_asked_for_is_every_shard_in_rank_order(world, ws, m_local, splits):  # noqa: F811
    """With `gathered`, each call also copies out all_gather(A) (its own shard at once, each peer's
    part once landed), right in every call of three back to back, in random stream orders."""
    k, n_local = 24, 8
    gathered = {}

    class WithGathered:  # the executor calls `run(ctx, plan, a, b, out)`
        @staticmethod
        def run(ctx, plan, a, b, out):
            decomposed_gather.run(ctx, plan, a, b, out, gathered=gathered[ctx.rank][-1])

    for seed in range(SEEDS):
        w = world(
            ws,
            decomposed_gather.gather_buffers(ws, m_local, k, torch.float32),
            lambda r: decomposed_gather.GatherPlan.of(r, ws, m_local, splits),
            WithGathered,
        )
        calls = []
        for call in range(3):
            gen = torch.Generator().manual_seed(100 * seed + call)
            a = [torch.randn(m_local, k, generator=gen) for _ in range(ws)]
            b = [torch.randn(k, n_local, generator=gen) for _ in range(ws)]
            outs = [torch.full((m_local * ws, n_local), float("nan")) for _ in range(ws)]
            for r in range(ws):
                gathered.setdefault(r, []).append(torch.full((m_local * ws, k), float("nan")))
                w.enqueue(r, a[r], b[r], outs[r])
            calls.append((a, b, outs, [gathered[r][-1] for r in range(ws)]))
        w.play(seed, one_queue=seed % 2 == 1)
        for call, (a, b, outs, full) in enumerate(calls):
            for r in range(ws):
                assert torch.equal(full[r], torch.cat(a)), f"seed {seed}, call {call}, rank {r}"
                assert torch.allclose(outs[r], torch.cat(a) @ b[r], atol=1e-4)


@pytest.mark.parametrize("ws, splits", [(2, 1), (2, 2), (4, 1), (4, 3), (4, 6)])
def test_each_gemm_starts_after_the_pushes_of_the_rows_it_reads(world, ws, splits):  # noqa: F811
    """The timeline's marks as played: every rank's own rows first; each GEMM over the peers' rows
    after the push of every part it reads has ended, in the same call; every part pushed once a
    peer a call."""
    m_local, k = 12, 16
    w = _world(world, ws, m_local, k, splits)
    kept = []  # the enqueued copies read and write these by address when played: they must outlive play()
    for _ in range(2):
        for r in range(ws):
            kept.append((torch.randn(m_local, k), torch.randn(k, 8), torch.empty(ws * m_local, 8)))
            w.enqueue(r, *kept[-1])
    w.play(5)
    parts = gather_parts(ws, splits)
    pushed = {
        (r, call, int(label.split()[-1]), j): end
        for r, call, label, (_, j), _, end in w.spans
        if label.startswith("shard to")
    }
    assert len(pushed) == 2 * ws * (ws - 1) * parts
    for r, call in itertools.product(range(ws), (1, 2)):
        mine = sorted(
            (start, end, label, chunk)
            for rr, cc, label, chunk, start, end in w.spans
            if (rr, cc) == (r, call) and label in ("own rows", "peers' rows")
        )
        assert mine[0][2] == "own rows" and len(mine) == 1 + len(gather_gemms(ws, r, m_local, splits))
        for (_, _, read), (start, _, _, _) in zip(
            gather_gemms(ws, r, m_local, splits), mine[1:], strict=True
        ):
            for q, j in read:
                assert start > pushed[q, call, r, j], (r, call, q, j)


@pytest.mark.parametrize("ws", [2, 3, 4, 8])
def test_the_gemms_cover_every_peer_row_once_in_contiguous_pieces(ws):
    """Each GEMM's rows are the parts it reads, one contiguous run; over a rank's GEMMs every peer's
    row once and none of its own; `splits` GEMMs (one more where a group wraps past row 0) up to
    ws - 1, and (ws - 1) x parts beyond; the shards read in the order they land (r-1 first)."""
    m_local = 10
    for splits in range(1, 3 * ws):
        if gather_splits_refusal(ws, splits, m_local):
            continue
        parts = gather_parts(ws, splits)
        for r in range(ws):
            gemms = gather_gemms(ws, r, m_local, splits)
            rows = [row for lo, hi, _ in gemms for row in range(lo, hi)]
            assert sorted(rows) == [
                x for x in range(ws * m_local) if not r * m_local <= x < (r + 1) * m_local
            ]
            bounds = [(j * m_local // parts, (j + 1) * m_local // parts) for j in range(parts)]
            for lo, hi, read in gemms:
                runs = sorted((q * m_local + bounds[j][0], q * m_local + bounds[j][1]) for q, j in read)
                assert (
                    runs[0][0] == lo
                    and runs[-1][1] == hi
                    and all(x[1] == y[0] for x, y in itertools.pairwise(runs))
                )
            landing = [(r - d) % ws for d in range(1, ws)]
            first_read = [landing.index(read[0][0]) for _, _, read in gemms]
            if parts > 1 or splits == ws - 1:
                assert len(gemms) == (ws - 1) * parts and first_read == sorted(first_read)
            else:
                assert splits <= len(gemms) <= splits + 1


def test_the_splits_it_takes_and_what_it_refuses_say_why():
    assert gather_splits_refusal(2, 5, 16) is None and gather_parts(2, 5) == 5
    assert gather_splits_refusal(4, 3, 16) is None and gather_parts(4, 3) == 1
    assert gather_splits_refusal(4, 6, 16) is None and gather_parts(4, 6) == 2
    assert "1 to 3" in gather_splits_refusal(4, 4, 16) and "multiple of 3" in gather_splits_refusal(4, 4, 16)
    assert "more parts than it has rows" in gather_splits_refusal(2, 17, 16)
    w = Workload(kind="ag_gemm", shape=(8192, 8192, 8192))
    check_candidate(decomposed_candidate(3), w, FOUR)
    with pytest.raises(ConfigError, match="takes num_splits 1 to 3 .* not 4"):
        check_candidate(decomposed_candidate(4), w, FOUR)
    with pytest.raises(ValueError, match="decomposed: decomposed all-gather on 4 ranks"):
        decomposed_gather.GatherPlan.of(0, 4, 2048, 8)


def test_the_space_offers_it_for_all_gather_matmuls_over_the_copy_engine_only():
    w = Workload(kind="ag_gemm", shape=(8192, 8192, 8192))
    assert [c for c in space(w, TWO) if c.template == DECOMPOSED] == [
        decomposed_candidate(s) for s in (1, 2, 4, 8)
    ]
    # splits it cannot take are rounded down to a multiple of ws-1: (1, 2, 4, 8) tries 1, 2, 3, 6
    assert [c for c in space(w, FOUR) if c.template == DECOMPOSED] == [
        decomposed_candidate(s) for s in (1, 2, 3, 6)
    ]
    four = SpaceOptions(num_splits=(1, 2, 3, 4, 6))
    assert [c.num_splits for c in space(w, FOUR, four) if c.template == DECOMPOSED] == [1, 2, 3, 6]
    eight = Topology.from_key("H200x8-nvswitch")
    assert [c.num_splits for c in space(w, eight) if c.template == DECOMPOSED] == [1, 2, 4, 7]
    assert DECOMPOSED not in {c.template for c in space(w, TWO, SpaceOptions(backends=("sm_copy", "nccl")))}
    short = Workload(
        kind="ag_gemm", shape=(1024, 4096, 4096)
    )  # 512 rows a shard: parts of 128 rows at most 4
    assert [c.num_splits for c in space(short, TWO) if c.template == DECOMPOSED] == [1, 2, 4]
    assert check_liveness("ag_gemm", decomposed_candidate(3), 4, 8192, 4096, 132).live


def test_the_cost_model_groups_shards_where_they_land_during_the_own_rows():
    """Where the shards land while the own rows' GEMM runs (a long GEMM: N/ws large) one GEMM over
    the peers' rows is predicted no slower than one a shard; where the link is slower than the GEMM
    (a short K·N/ws GEMM against 32 MiB shards), one a shard (the first starting once the first shard
    lands) is predicted faster, and never faster than the GEMM alone."""
    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.cost_model.model import CostModel

    model = CostModel(default_calibration(FOUR))
    long, short = (Workload(kind="ag_gemm", shape=s) for s in ((8192, 57344, 8192), (8192, 8192, 8192)))
    for w in (long, short):
        preds = [model.predict(w, FOUR, decomposed_candidate(s)) for s in (1, 3)]
        assert all(p.feasible and math.isfinite(p.time_us) for p in preds)
        assert min(p.time_us for p in preds) >= model.baselines(w, FOUR)["gemm_alone"]
    one, each = (model.predict(long, FOUR, decomposed_candidate(s)).time_us for s in (1, 3))
    assert one <= each
    one, each = (model.predict(short, FOUR, decomposed_candidate(s)).time_us for s in (1, 3))
    assert each < one
