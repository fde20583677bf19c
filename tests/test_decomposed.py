"""The matmul reduce-scatter and all-reduce cut into cuBLAS row chunks (template `decomposed`,
`syncopate/kernels/decomposed.py`): every rank's enqueued work played on the CPU by the executor of
tests/test_stationary.py, streams in random orders, calls back to back with fresh inputs."""

from __future__ import annotations

import math

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels import decomposed
from syncopate.search_space import (
    C_STATIONARY,
    DECOMPOSED,
    Candidate,
    SpaceOptions,
    Topology,
    Workload,
    check_candidate,
    check_liveness,
    decomposed_candidate,
    space,
    tail_copied_together,
)
from tests.test_stationary import check_reduce_calls, world  # noqa: F401 - the executor, as a fixture

TWO = Topology.from_key("H200x2-nvlink")


def _world(world, ws, m, n, all_reduce, splits):  # noqa: F811
    return world(
        ws,
        decomposed.decomposed_buffers(ws, m, n, torch.float32, all_reduce),
        lambda r: decomposed.DecomposedPlan.of(r, ws, m, n, all_reduce, splits),
        decomposed,
    )


@pytest.mark.parametrize(
    "all_reduce, ws, m, splits",
    [
        (False, 1, 32, 2),
        (False, 2, 64, 1),
        (False, 2, 64, 4),
        (False, 3, 96, 2),
        (False, 4, 128, 3),
        (False, 8, 256, 2),
        (True, 1, 33, 2),
        (True, 2, 64, 1),
        (True, 2, 64, 4),
        (True, 2, 65, 2),
        (True, 3, 97, 4),
        (True, 4, 128, 2),
        (True, 8, 259, 2),
    ],
)
def test_every_call_sums_over_the_ranks(world, all_reduce, ws, m, splits):  # noqa: F811
    """Three calls back to back, fresh inputs each, every stream played in random orders: each
    rank's output is its rows of the sum over ranks of A_q @ B_q (all-reduce: all the rows, M
    divisible by the ranks or not), so no call overwrote what an earlier one still read."""
    n, k_local = 24, 40
    check_reduce_calls(lambda: _world(world, ws, m, n, all_reduce, splits), ws, m, n, k_local, all_reduce)


@pytest.mark.parametrize("all_reduce", [False, True])
def test_own_rows_wait_for_the_peers_partials_of_their_chunk_only(world, all_reduce):  # noqa: F811
    """The timeline's marks as played: the own rows of chunk j start after the first peer's push
    of the half of its partial holding chunk j has ended, in the same call, and each other peer's
    partial is added after its push; each rank computes the peers' partials (two GEMMs a peer)
    before its own rows, and an all-reduce pulls every peer's every chunk."""
    ws, m, n, k_local, splits = 3, 96, 24, 40, 3
    w = _world(world, ws, m, n, all_reduce, splits)
    kept = []  # the enqueued copies read and write these by address when played: they must outlive play()
    for _ in range(2):
        for r in range(ws):
            kept.append(
                (
                    torch.randn(m, k_local),
                    torch.randn(k_local, n),
                    torch.empty(m if all_reduce else m // ws, n),
                )
            )
            w.enqueue(r, *kept[-1])
    w.play(3)
    plan = w.plans[0]
    assert [h for h, chunks in enumerate(plan.halves) for _ in chunks] == [0, 0, 1]
    own_chunks = len(
        plan.own_chunks(0)
    )  # an all-reduce cuts its last own chunk in two (ws 3: the first half not merged)
    assert own_chunks == splits + all_reduce

    def half(r: int, j: int) -> int:  # the partial GEMM whose rows hold rank r's own chunk j
        lo, even = w.plans[r].own_chunks(r)[j][0], w.plans[r].chunks(r)
        return next(
            h for h, chunks in enumerate(plan.halves) if even[chunks[0]][0] <= lo < even[chunks[-1]][1]
        )

    pushed = {
        (r, call, label, chunk[1]): end
        for r, call, label, chunk, _, end in w.spans
        if label.startswith("partial to")
    }
    own = [(r, call, chunk[1], start) for r, call, label, chunk, start, _ in w.spans if label == "own rows"]
    assert len(pushed) == 2 * ws * (ws - 1) * 2 and len(own) == 2 * ws * own_chunks
    added = [
        (r, call, chunk, start) for r, call, label, chunk, start, _ in w.spans if label.endswith("added")
    ]
    assert len(added) == 2 * ws * (ws - 2) * own_chunks
    for r, call, (q, j), start in added:
        assert start > pushed[(q, call, f"partial to {r}", half(r, j))], (r, call, j, q)
    for r, call, j, start in own:
        assert start > pushed[((r - 1) % ws, call, f"partial to {r}", half(r, j))], (r, call, j)
        computed = [
            end
            for rr, cc, label, _, _, end in w.spans
            if (rr, cc) == (r, call) and label.startswith("partial for")
        ]
        assert max(computed) < start
    pulls = [s for s in w.spans if s[2].startswith("reduced from")]
    assert len(pulls) == (2 * ws * (ws - 1) * own_chunks if all_reduce else 0)


def test_own_rows_of_the_first_half_are_one_gemm_on_two_ranks():
    """On two ranks the own chunks of the first half (which wait for the same partials) are one GEMM;
    an all-reduce cuts its last chunk in two; on more ranks every chunk is its own GEMM."""
    two_ar = decomposed.DecomposedPlan.of(0, 2, 8192, 64, all_reduce=True, splits=4)
    assert two_ar.own_chunks(1) == [(0, 2048), (2048, 3072), (3072, 3584), (3584, 4096)]
    two_rs = decomposed.DecomposedPlan.of(1, 2, 8192, 64, all_reduce=False, splits=8)
    assert two_rs.own_chunks(1) == [(0, 2048)] + [(lo, lo + 512) for lo in range(2048, 4096, 512)]
    assert decomposed.DecomposedPlan.of(0, 2, 8192, 64, splits=2).own_chunks(0) == [(0, 2048), (2048, 4096)]
    four = decomposed.DecomposedPlan.of(0, 4, 8192, 64, all_reduce=True, splits=4)
    assert four.own_chunks(2) == [(0, 512), (512, 1024), (1024, 1536), (1536, 1792), (1792, 2048)]
    # the last two copied into the output together: a two-rank all-reduce's only (what the cost
    # model times too)
    assert [
        tail_copied_together(p.chunks(0), p.world_size, p.all_reduce) for p in (two_ar, two_rs, four)
    ] == [True, False, False]


def test_the_space_offers_it_for_reductions_over_the_copy_engine_only():
    """(All-gathers: tests/test_decomposed_gather.py.)"""
    for kind in ("gemm_rs", "gemm_ar"):
        w = Workload(kind=kind, shape=(8192, 4096, 11008))
        assert [c for c in space(w, TWO) if c.template == DECOMPOSED] == [
            decomposed_candidate(s) for s in (1, 2, 4, 8)
        ]
        assert DECOMPOSED not in {
            c.template for c in space(w, TWO, SpaceOptions(backends=("sm_copy", "nccl")))
        }
        assert check_liveness(kind, decomposed_candidate(4), 4, 8192, 4096, 132).live
    short = Workload(kind="gemm_rs", shape=(512, 4096, 4096))  # 256 rows a block: 128-row chunks at most 2
    assert [c.num_splits for c in space(short, TWO) if c.template == DECOMPOSED] == [1, 2]


def test_candidates_it_refuses_say_why():
    w = Workload(kind="gemm_ar", shape=(8192, 4096, 11008))
    check_candidate(decomposed_candidate(4), w, TWO)
    with pytest.raises(ConfigError, match="copy engine, not nccl"):
        check_candidate(Candidate(backend="nccl", template=DECOMPOSED, comm_sms=64), w, TWO)
    with pytest.raises(ConfigError, match="block_n=256"):
        check_candidate(Candidate(template=DECOMPOSED, num_splits=2, block_n=256), w, TWO)
    with pytest.raises(ConfigError, match="num_splits=8192"):
        check_candidate(decomposed_candidate(8192), w, TWO)
    with pytest.raises(ValueError, match="chunks exceed"):
        decomposed.DecomposedPlan.of(0, 2, 64, 16, True, 64)


def test_the_cost_model_times_it_from_cublas_chunks_and_the_link():
    """An all-reduce of one chunk a block waits for the whole block's pull after its GEMMs; two
    chunks halve that tail. At 8192x8192x2048 the partials (64 MiB a peer) outlast the GEMMs and
    c_stationary, moving 24 MiB, is predicted faster."""
    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.cost_model.model import CostModel

    model = CostModel(default_calibration(TWO))
    for n, k in ((4096, 11008), (8192, 2048)):
        w = Workload(kind="gemm_ar", shape=(8192, n, k))
        preds = {
            c.short(): model.predict(w, TWO, c)
            for c in space(w, TWO)
            if c.template in (DECOMPOSED, C_STATIONARY)
        }
        assert all(p.feasible and math.isfinite(p.time_us) for p in preds.values())
        assert min(p.time_us for p in preds.values()) >= model.baselines(w, TWO)["gemm_alone"]
        one, two = (model.predict(w, TWO, decomposed_candidate(s)) for s in (1, 2))
        assert one.time_us > two.time_us and one.time_us - one.kernel_us > two.time_us - two.kernel_us
    best = {t: min(p.time_us for c, p in preds.items() if t in c) for t in (DECOMPOSED, C_STATIONARY)}
    assert best[C_STATIONARY] < best[DECOMPOSED], best


@pytest.mark.parametrize("how", ["sm pulls", "ranks share a GPU", "rows not 16-byte words"])
def test_an_all_reduce_ends_on_sm_pulls(world, monkeypatch, how):  # noqa: F811
    """An all-reduce's last pulls (one a peer, on the caller's stream) go through `pull_last`, and
    every call stays right with streams played in random orders; on a context whose ranks share a
    GPU, or where a chunk is not whole aligned 16-byte words, the stream path instead, right too."""
    ws, k_local, splits = 3, 40, 2
    m, n = (
        (90, 25) if how == "rows not 16-byte words" else (96, 24)
    )  # float32: 100-byte rows, last chunks from row 22
    pulls, fake = [], decomposed.pull_last

    def pull_last(ctx, *args):
        pulls.append(ctx.rank)
        fake(ctx, *args)

    monkeypatch.setattr(decomposed, "pull_last", pull_last)

    def make():
        w = _world(world, ws, m, n, True, splits)
        for ctx in w.ctxs:
            ctx.sm_pulls = how != "ranks share a GPU"
        return w

    check_reduce_calls(make, ws, m, n, k_local, True)
    calls = 4 * 3 * ws  # four seeds of three calls, every rank
    if how == "sm pulls":
        assert sorted(pulls) == sorted(list(range(ws)) * (calls // ws) * (ws - 1))
    else:
        assert pulls == []


@pytest.mark.parametrize("ws", [2, 3])
def test_an_all_reduces_last_word_leaves_at_once_on_two_ranks(world, ws):  # noqa: F811
    """On two ranks the own chunk before the last is copied into the output together with the last,
    after the last GEMM, so that `ready` has nothing queued ahead of the last word: it raises it, and
    the caller's stream goes from its last GEMM straight to the pull. On more ranks each chunk is
    copied alone and the last word goes from the caller's stream, right after its last GEMM."""
    m, n, k_local, splits = 32 * ws, 8, 16, 4
    w = _world(world, ws, m, n, True, splits)
    kept = []
    for r in range(ws):
        kept.append((torch.randn(m, k_local), torch.randn(k_local, n), torch.empty(m, n)))
        w.enqueue(r, *kept[-1])
    main, ready = w.mains[0].ops, w.ctxs[0].streams[1].ops
    after_gemms = [op[0] for op in main[max(i for i, op in enumerate(main) if op[0] == "run") + 1 :]]
    copied = [op[3] // (n * 4) for op in ready if op[0] == "copy"]  # rows of each copy into the output
    last_word = max(i for i, op in enumerate(ready) if op[0] == "write")
    if ws == 2:  # own chunks of 16 (the first half's), 8, 4 and 4 rows
        assert copied == [16, 8, 8]
        assert "write" not in after_gemms and ready[last_word + 1][0] == "copy"
    else:
        assert copied == [8, 8, 8, 4, 4]
        assert "write" in after_gemms
