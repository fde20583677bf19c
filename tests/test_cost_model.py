"""Layer: pure CPU logic. The cost model's simulator (the closed-form program scan against a
step-by-step one, transfers along a plan) and its predictions for the three kinds: what faster
links, tile orders, splits, SMs and nodes do to them."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from syncopate.cost_model.calibration_defaults import default_calibration
from syncopate.cost_model.model import CostModel
from syncopate.cost_model.simulate import CommContext, TransferTable, own_chunks_ready, padded, run_programs
from syncopate.errors import ConfigError
from syncopate.search_space import (
    STATIONARY_KINDS,
    Candidate,
    Topology,
    Workload,
    build_plan,
    default_candidate,
    space,
)

TOPO = Topology.from_key("H200x2-nvlink")
CAL = default_calibration(TOPO)
AG = Workload(kind="ag_gemm", shape=(4096, 2048, 4096))
RS = Workload(kind="gemm_rs", shape=(4096, 4096, 2048))
AR = Workload(kind="gemm_ar", shape=(4096, 4096, 2048))


def _naive(programs, start, need, dur, partial, epi):
    """The persistent programs one position at a time."""
    n = len(dur)
    clock = [start] * programs
    end = [0.0] * n
    for i in range(n):
        p = i % programs
        begin = max(clock[p], need[i])
        done = max(begin + dur[i], partial[i]) + epi[i]
        clock[p] = end[i] = done
    return max(clock), end


@pytest.mark.parametrize("seed", range(5))
def test_closed_form_scan_equals_the_program_by_program_run(seed):
    rng = random.Random(seed)
    programs, n = rng.randint(1, 9), rng.randint(1, 60)
    need = [rng.choice([-math.inf, rng.uniform(0, 50)]) for _ in range(n)]
    dur = [rng.uniform(0.5, 5) for _ in range(n)]
    partial = [rng.choice([-math.inf, rng.uniform(0, 80)]) for _ in range(n)]
    epi = [rng.uniform(0, 1) for _ in range(n)]
    end, tiles = _naive(programs, 2.0, need, dur, partial, epi)
    p = min(programs, n)

    def pad(x, fill):
        return padded(np.array([x]), p, fill)

    run = run_programs(
        p,
        2.0,
        pad(need, -np.inf),
        pad(dur, 0.0),
        partial=pad(partial, -np.inf),
        epilogue=pad(epi, 0.0),
        positions=n,
    )
    assert run.end[0] == pytest.approx(end)
    assert run.tile_end[0] == pytest.approx(tiles)


def test_a_ring_forwards_each_chunk_after_it_arrived():
    topo = Topology.from_key("H200x4-nvswitch")
    plan = build_plan("ring", "all_gather", 4, 4096, 2, align=128)
    ctx = CommContext(CAL, topo, Candidate(backend="copy_engine", template="ring", num_splits=2), 4096 * 2)
    arrival = own_chunks_ready(plan, ctx, 0.0)
    TransferTable(plan, "gather", ctx).run(None, arrival, 0.0)
    assert np.isfinite(arrival).all()
    for t in plan.transfers:
        if t.block != t.src:  # forwarded: leaves src only once it arrived there
            c = plan.chunk_index(t.block, t.split)
            assert arrival[t.dst, c] > arrival[t.src, c]


@pytest.mark.parametrize("workload", [AG, RS, AR], ids=lambda w: w.kind)
def test_every_candidate_gets_a_finite_positive_prediction(workload):
    model = CostModel(CAL)
    ranked = model.rank(workload, TOPO, space(workload, TOPO)[::7])
    assert all(p.feasible and 0 < p.time_us < math.inf for p in ranked)
    assert [p.time_us for p in ranked] == sorted(p.time_us for p in ranked)
    best = ranked[0]
    assert best.programs <= TOPO.sm_count and best.waves >= 1 and best.kernel_us <= best.time_us


def test_a_prediction_is_at_least_the_gemm_and_the_communication():
    model = CostModel(CAL)
    for w in (AG, RS, AR):
        base = model.baselines(w, TOPO)
        for p in model.rank(w, TOPO, space(w, TOPO)[::11]):
            assert p.time_us >= 0.9 * base["gemm_alone"]
            assert p.comm_us > 0


def test_all_reduce_costs_more_than_reduce_scatter():
    model = CostModel(CAL)
    c = default_candidate(RS, TOPO)
    assert model.predict(AR, TOPO, c).time_us > model.predict(RS, TOPO, c).time_us


def test_an_all_reduce_over_the_copy_engine_pays_both_phases_on_one_link_direction():
    """Partials out and reduced rows pulled by the peer leave a rank over the same link direction:
    the call is at least every transfer of one rank back to back, from its first ready chunk."""
    model = CostModel(CAL)
    w = Workload(kind="gemm_ar", shape=(8192, 8192, 2048))
    for splits in (1, 2, 4, 8):
        c = replace(default_candidate(w, TOPO), backend="copy_engine", template="direct", num_splits=splits)
        plan = build_plan("direct", "all_reduce", 2, 8192, splits, align=c.block_m)
        ctx = CommContext(CAL, TOPO, c, w.comm_row_bytes())
        link = sum(ctx.transfer_us(t) for t in plan.transfers if t.src == 0)
        assert link == pytest.approx(
            2 * sum(ctx.transfer_us(t) for t in plan.transfers if t.src == 0 and t.phase == "reduce")
        )
        p = model.predict(w, TOPO, c)
        assert p.time_us >= link
        assert p.comm_us >= link


def test_faster_links_never_slow_a_candidate_down():
    fast = replace(
        CAL,
        transfers={
            k: replace(t, curves={s: c.scaled(0.5) for s, c in t.curves.items()})
            for k, t in CAL.transfers.items()
        },
    )
    slow, quick = CostModel(CAL), CostModel(fast)
    for w in (AG, RS, AR):
        for c in space(w, TOPO)[::29]:
            assert quick.predict(w, TOPO, c).time_us <= slow.predict(w, TOPO, c).time_us + 1e-6


def test_arrival_order_beats_row_major_where_communication_dominates():
    """On rank 1, row-major starts with rows that have not arrived; the arrival order starts with
    its own shard."""
    w = Workload(kind="ag_gemm", shape=(8192, 2048, 8192))
    model = CostModel(CAL)
    base = Candidate(
        backend="copy_engine",
        template="direct",
        num_splits=4,
        tile_order="arrival",
        group_m=8,
        block_m=128,
        block_n=128,
        block_k=64,
        num_warps=8,
        num_stages=4,
    )
    arrival = model.predict(w, TOPO, base)
    row_major = model.predict(w, TOPO, base.replace(tile_order="row_major", group_m=1))
    assert arrival.time_us < row_major.time_us
    assert arrival.stall_us < row_major.stall_us


def test_chunks_let_compute_start_before_the_whole_shard_arrives():
    w = Workload(kind="ag_gemm", shape=(8192, 2048, 8192))
    model = CostModel(CAL)
    one = Candidate(backend="copy_engine", num_splits=1, block_m=128, block_n=128, num_warps=8, num_stages=4)
    four = one.replace(num_splits=4)
    assert model.predict(w, TOPO, four).time_us < model.predict(w, TOPO, one).time_us


def test_sms_given_to_communication_are_taken_from_the_gemm():
    w = Workload(kind="ag_gemm", shape=(8192, 28672, 8192))
    model = CostModel(CAL)
    few = Candidate(backend="sm_copy", comm_sms=16, num_splits=4, block_n=256, num_stages=3)
    many = few.replace(comm_sms=64)
    assert model.predict(w, TOPO, few).programs == TOPO.sm_count - 16
    assert model.predict(w, TOPO, many).programs == TOPO.sm_count - 64
    assert model.predict(w, TOPO, many).kernel_us > model.predict(w, TOPO, few).kernel_us


def test_the_copy_engine_cannot_cross_nodes():
    topo = Topology.from_key("H200x4-nvswitch-2n")
    model = CostModel(default_calibration(topo))
    w = Workload(kind="gemm_rs", shape=(4096, 4096, 2048))
    ce = model.predict(w, topo, Candidate(backend="copy_engine", num_splits=2))
    nccl = model.predict(w, topo, Candidate(backend="nccl", comm_sms=64, num_splits=2))
    assert not ce.feasible and ce.time_us == math.inf and "another node" in ce.reason
    assert nccl.feasible and math.isfinite(nccl.time_us)
    ranked = model.rank(
        w,
        topo,
        [
            Candidate(backend="copy_engine", num_splits=2),
            Candidate(backend="nccl", comm_sms=64, num_splits=2),
        ],
    )
    assert ranked[-1].candidate.backend == "copy_engine"


def test_predicting_for_topologies_not_at_hand():
    """A GEMM-bound shape gets faster as the GEMM is shared by more GPUs."""
    w = Workload(kind="ag_gemm", shape=(8192, 28672, 8192))
    times = {}
    for key in ("H200x2-nvlink", "H200x4-nvswitch", "H200x8-nvswitch"):
        topo = Topology.from_key(key)
        model = CostModel(default_calibration(topo))
        times[key] = model.predict(w, topo, default_candidate(w, topo)).time_us
    assert times["H200x8-nvswitch"] < times["H200x4-nvswitch"] < times["H200x2-nvlink"]


def test_prune_keeps_the_fastest_and_drops_the_hopeless():
    model = CostModel(CAL)
    cands = space(AG, TOPO)
    kept = model.prune(AG, TOPO, cands, keep=0.1, within=1.0)
    ranked = model.rank(AG, TOPO, cands)
    assert ranked[0].candidate in kept and ranked[-1].candidate not in kept
    assert len(kept) == math.ceil(0.1 * len(cands))
    with pytest.raises(ConfigError, match="fraction"):
        model.prune(AG, TOPO, cands, keep=0)


def test_an_invalid_candidate_is_refused():
    with pytest.raises(ConfigError, match="comm_sms"):
        CostModel(CAL).predict(AG, TOPO, Candidate(backend="sm_copy", comm_sms=100))


def test_a_single_gpu_is_just_the_gemm():
    topo = Topology.from_key("H200x1-nvlink")
    model = CostModel(default_calibration(topo))
    w = Workload(kind="ag_gemm", shape=(4096, 4096, 4096))
    c = default_candidate(w, topo)
    p = model.predict(w, topo, c)
    assert p.comm_us <= CAL.costs.launch_us + 100 and p.time_us == pytest.approx(
        model.baselines(w, topo)["gemm_alone"], rel=0.15
    )


# -- four and eight GPUs on one NVSwitch node (configs/llama_tp4.yaml, llama_tp8.yaml) ---------

NVSWITCH = ["H200x4-nvswitch", "H200x8-nvswitch"]
HEAVY = {"ag_gemm": (8192, 8192, 8192), "gemm_rs": (8192, 8192, 8192), "gemm_ar": (8192, 8192, 8192)}
"""One shape per kind that both suites tune (N/ws or K/ws = 2048 on four GPUs, 1024 on eight)."""


def _sample(w: Workload, topo: Topology, step: int = 97) -> list[Candidate]:
    cands = space(w, topo)
    return cands[::step] + [default_candidate(w, topo)]


def _bound(base: dict[str, float]) -> float:
    """max(GEMM alone, the fastest collective alone), as the summaries and the dashboard take it."""
    return max(base["gemm_alone"], min(v for k, v in base.items() if k.startswith("comm_alone")))


@pytest.mark.parametrize("key", NVSWITCH)
@pytest.mark.parametrize("kind", sorted(HEAVY))
def test_predictions_for_four_and_eight_gpus_are_sane_and_deterministic(key, kind):
    topo = Topology.from_key(key)
    w = Workload(kind=kind, shape=HEAVY[kind])
    cands = _sample(w, topo)
    routed = {"direct", "ring", "bidirectional_ring"}
    assert {c.template for c in cands} == routed | {t for t, k in STATIONARY_KINDS.items() if kind in k}
    ranked = CostModel(default_calibration(topo)).rank(w, topo, cands)
    assert all(p.feasible and 0 < p.time_us < math.inf and p.comm_us > 0 for p in ranked)
    assert all(p.kernel_us <= p.time_us and 1 <= p.programs <= topo.sm_count and p.waves >= 1 for p in ranked)
    assert [p.time_us for p in ranked] == sorted(p.time_us for p in ranked)
    again = CostModel(default_calibration(topo)).rank(w, topo, cands)
    assert [(p.candidate.key(), p.time_us) for p in again] == [(p.candidate.key(), p.time_us) for p in ranked]
    base = CostModel(default_calibration(topo)).baselines(w, topo)
    assert base["torch_seq"] == pytest.approx(base["gemm_alone"] + base["comm_alone"])
    assert ranked[0].time_us >= base["gemm_alone"]
    if kind != "gemm_ar":
        # gemm_ar's baselines hold no copy-engine all-reduce (the harness measures none either), so
        # there the NCCL-only bound is no lower bound for copy-engine candidates.
        assert "comm_alone_copy_engine" in base
        # the stationary templates move operands: the collective of the output bounds the others only
        assert _bound(base) <= min(p.time_us for p in ranked if p.candidate.template in routed)


@pytest.mark.parametrize("kind", sorted(HEAVY))
def test_the_gemm_alone_halves_from_four_to_eight_gpus(kind):
    """A 70B-wide projection: each GPU's share of the GEMM halves, and so does its predicted time
    (within the launch and a last partial wave)."""
    shape = (8192, 28672, 8192) if kind == "ag_gemm" else (8192, 8192, 28672)
    w = Workload(kind=kind, shape=shape)
    gemm = {}
    for key in NVSWITCH:
        topo = Topology.from_key(key)
        gemm[key] = CostModel(default_calibration(topo)).baselines(w, topo)["gemm_alone"]
    assert gemm["H200x4-nvswitch"] / gemm["H200x8-nvswitch"] == pytest.approx(2.0, rel=0.1)


def test_the_consumer_s_last_wave_is_cut_in_k_as_the_kernel_cuts_it(monkeypatch):
    import syncopate.cost_model.model as cm

    # 10 positions on 4 programs: the last wave's 2 tiles, each in 2 parts, on all 4 programs, each
    # when its tile's rows are there, for half the tile's time plus the parts' sums.
    need = padded(np.array([[0.0] * 8 + [5.0, 7.0]]), 4, -np.inf)
    dur = padded(np.array([[10.0] * 10]), 4, 0.0)
    cut_need, cut_dur = cm._cut_tail(need, dur, 2, 10, 1.5)
    assert cut_need[0, 2].tolist() == [5.0, 5.0, 7.0, 7.0]
    assert cut_dur[0, 2].tolist() == [6.5] * 4
    assert (cut_need[0, :2] == need[0, :2]).all() and (cut_dur[0, :2] == dur[0, :2]).all()

    # AG+GEMM 8192×29568×8192 on two GPUs: 3712 tiles of 128×256 leave 16 for a last wave of 132,
    # cut in 4; the simulated kernel ends about three quarters of a tile earlier.
    w = Workload(kind="ag_gemm", shape=(8192, 29568, 8192))
    c = Candidate(
        backend="copy_engine",
        template="direct",
        num_splits=2,
        block_m=128,
        block_n=256,
        block_k=64,
        group_m=8,
        num_warps=8,
        num_stages=3,
    )
    cut = CostModel(CAL).predict(w, TOPO, c)
    monkeypatch.setattr(cm, "tail_split", lambda *args: 0)  # every tile whole
    whole = CostModel(CAL).predict(w, TOPO, c)
    tile_us = whole.kernel_us / whole.waves
    assert 0.5 * tile_us < whole.kernel_us - cut.kernel_us < tile_us
