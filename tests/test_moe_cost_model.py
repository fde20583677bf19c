"""Layer: pure CPU. The MoE cost model (`syncopate.cost_model.moe`): the expected routing's rows
against their closed forms and against drawn routings, the parts' directions (more tokens, more
time; deduplicated rows, fewer bytes), every template of the space predicted, the ranking by mode,
refusals; and the model against the H200 measurements committed under results/ (how often its
pick is the measured best, and how far the measured time of its pick is from it)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pytest

from syncopate.cost_model import default_calibration
from syncopate.cost_model.moe import MoeCostModel, against_measurements, routing_stats
from syncopate.errors import ConfigError
from syncopate.search_space import Topology
from syncopate.search_space.moe_workload import MoeCandidate, MoeWorkload, RoutingSpec, moe_space

RESULTS = Path(__file__).resolve().parents[1] / "results"
QWEN3 = MoeWorkload(kind="a2a_gemm", tokens=4096, hidden=2048, ffn=768, experts=128, top_k=8)
H200X2 = Topology.from_key("H200x2-nvlink")


def _model(key: str = "H200x2-nvlink") -> MoeCostModel:
    return MoeCostModel(default_calibration(Topology.from_key(key)))


def test_the_expected_rows_of_a_uniform_routing():
    for ws in (2, 4):
        s = routing_stats(QWEN3, ws)
        t, k, e = QWEN3.tokens, QWEN3.top_k, QWEN3.experts
        assert math.isclose(s.rows, t * k) and len(s.expert_rows) == e // ws
        assert math.isclose(s.pair_rows_out, t * k * (ws - 1) / ws)
        assert math.isclose(s.pair_rows_in, s.pair_rows_out)
        # a token reaches a rank unless all its k experts are elsewhere (hypergeometric)
        reach = 1 - math.comb(e - e // ws, k) / math.comb(e, k)
        assert math.isclose(s.dedup_rows_out, t * reach * (ws - 1))
        assert s.dedup_rows_out < s.pair_rows_out / 2


def test_a_skewed_routing_loads_its_busiest_rank_more_than_a_uniform_one():
    skewed = dataclasses.replace(QWEN3, routing=RoutingSpec(distribution="skewed", skew=1.2, seed=0))
    for ws in (2, 4):
        s, u = routing_stats(skewed, ws), routing_stats(QWEN3, ws)
        assert s.rows > u.rows
        assert math.isclose(
            sum(routing_stats(skewed, 1).expert_rows), QWEN3.tokens * QWEN3.top_k, rel_tol=1e-6
        )


def test_the_expected_rows_are_near_drawn_routings():
    """Against routings drawn by `syncopate.moe.draw_routing` (torch): the busiest rank's rows of a
    uniform routing within 2 %, of a skewed one (another draw of the same law) within 30 %."""
    torch = pytest.importorskip("torch")
    from syncopate.moe import draw_routing

    for spec, tolerance in ((RoutingSpec(seed=3), 0.02), (RoutingSpec(distribution="skewed", seed=3), 0.3)):
        w = dataclasses.replace(QWEN3, routing=spec)
        r = draw_routing(world_size=4, tokens=w.tokens, experts=w.experts, top_k=w.top_k, spec=spec)
        per_expert = torch.bincount(torch.cat([ids.flatten() for ids in r.expert_ids]), minlength=w.experts)
        busiest = float(per_expert.view(4, -1).sum(1).max())
        assert abs(routing_stats(w, 4).rows / busiest - 1) < tolerance


def test_every_candidate_of_the_space_is_predicted():
    model = _model("H200x4-nvswitch")
    for kind in ("a2a_gemm", "gemm_a2a"):
        w = dataclasses.replace(QWEN3, kind=kind)
        space = moe_space(w, 4, backends=("nccl", "copy_engine"))
        expected = {"unfused", "dedup", "pipelined", "fused"} | (
            {"fused_dedup"} if kind == "a2a_gemm" else set()
        )
        assert {c.template for c in space} == expected
        for c in space:
            p = model.predict(w, c, 4)
            assert 0 < p.gemm_us <= p.device_us and p.comm_us >= 0
            assert p.eager_us == max(p.device_us, p.host_us)
            assert p.time_us("graph") == p.device_us and p.time_us("eager") == p.eager_us


def test_one_rank_moves_nothing():
    model = _model("H200x1-nvlink")
    w = dataclasses.replace(QWEN3, kind="gemm_a2a")
    for c in moe_space(w, 1):
        p = model.predict(w, c, 1)
        assert p.comm_us == 0 and p.device_us >= p.gemm_us > 0, c.short()
    assert routing_stats(w, 1).pair_rows_out == routing_stats(w, 1).dedup_rows_out == 0


def test_the_parts_move_the_right_way():
    model = _model()
    for c in (
        MoeCandidate(),
        MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=2),
        MoeCandidate(template="dedup", backend="copy_engine"),
        MoeCandidate(
            template="fused", backend="copy_engine", block_m=128, block_n=256, num_warps=8, num_stages=4
        ),
    ):
        small = model.predict(QWEN3, c, 2)
        large = model.predict(dataclasses.replace(QWEN3, tokens=8192), c, 2)
        assert large.device_us > 1.5 * small.device_us and large.gemm_us > 1.8 * small.gemm_us
    pairs = model.predict(QWEN3, MoeCandidate(), 2)
    once = model.predict(QWEN3, MoeCandidate(template="dedup"), 2)
    assert once.comm_us < pairs.comm_us / 2 and once.gemm_us == pairs.gemm_us
    # the copy engine's curve is faster than NCCL's on the default calibration, and more
    # chunks cost more host time
    c1 = model.predict(QWEN3, MoeCandidate(template="pipelined", backend="copy_engine"), 2)
    c2 = model.predict(
        QWEN3, MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=2), 2
    )
    assert c2.host_us > c1.host_us


def test_rank_orders_by_the_mode_and_leaves_out_what_cannot_run():
    model = _model("H200x4-nvswitch")
    w = dataclasses.replace(QWEN3, kind="gemm_a2a", experts=96)
    pairwise = MoeCandidate(template="pipelined", backend="copy_engine", order="pairwise")
    with pytest.raises(ConfigError, match="power-of-two world size"):
        model.predict(w, pairwise, 3)
    space = [MoeCandidate(), MoeCandidate(template="pipelined", backend="copy_engine"), pairwise]
    ranked = model.rank(w, space, 3, "graph")
    assert pairwise not in [c for c, _ in ranked] and len(ranked) == 2
    for mode in ("eager", "graph"):
        times = [p.time_us(mode) for _, p in model.rank(QWEN3, moe_space(QWEN3, 2), 2, mode)]
        assert times == sorted(times)


def test_the_model_against_the_committed_measurements():
    """On the 32 cases of the H200 MoE runs (every candidate measured there), the measured time of
    the model's device-time pick is within 20 % of the measured best on every case, and within 5 %
    at the median; every prediction lies within a factor of 2.5 of its measurement. The leads were
    read off these same runs, so this holds the model to them, it does not validate it elsewhere."""
    quality, ratios = [], []
    for name in ("moe-2026-11-28-h200x2-ep2.json", "moe-2026-11-28-h200x4-ep4.json"):
        doc = json.loads((RESULTS / name).read_text())
        for op in doc["ops"]:
            topology = Topology(world_size=op["ep"], gpu_model=doc["environment"]["gpu_model"])
            case = against_measurements(MoeCostModel(default_calibration(topology)), op)
            assert case.workload.key() == op["workload"] and case.best_us <= case.pick_us
            quality.append(case.best_us / case.pick_us)
            ratios += case.ratios
    assert len(quality) == 32
    assert min(quality) >= 0.8 and statistics.median(quality) >= 0.95, sorted(quality)
    assert all(0.4 <= r <= 2.5 for r in ratios), (min(ratios), max(ratios))
